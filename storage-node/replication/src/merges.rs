//! Assigning a merge: a `MERGE_PARTS` entry written to the shared log, which every replica
//! then runs. The leader assigns background merges and any replica assigns the merges of an
//! OPTIMIZE, so two may assign at once: each entry's multi also sets the `log` node's data
//! at the version read before the parts were checked, and a merge assigned in between makes
//! the multi fail instead of writing two merges over the same parts.

use coordinator_client::{Keeper, NodeKind};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result};
use tracing::info;

use crate::committer::sequence_number;
use crate::queue::ReplicationQueue;

/// A `MERGE_PARTS` entry, in ClickHouse's text format.
pub fn merge_parts_entry(source_replica: &str, sources: &[PartName], result: &PartName, cleanup: bool) -> String {
    let created = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S");
    let mut text =
        format!("format version: 4\ncreate_time: {created}\nsource replica: {source_replica}\nblock_id: \nmerge\n");
    for source in sources {
        text.push_str(&format!("{source}\n"));
    }
    text.push_str(&format!("into\n{result}\ndeduplicate: 0\n"));
    if cleanup {
        text.push_str("cleanup: 1\n");
    }
    text
}

/// The part a merge of `sources` (adjacent, one partition) makes: their block range, one level
/// above the highest of them.
pub fn merged_name(sources: &[PartName]) -> Option<PartName> {
    let (first, last) = (sources.first()?, sources.last()?);
    Some(PartName {
        partition_id: first.partition_id.clone(),
        min_block: first.min_block,
        max_block: last.max_block,
        level: sources.iter().map(|p| p.level).max().unwrap_or(0) + 1,
    })
}

/// What an attempt to assign a merge came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Assigned {
    /// The entry is in the log; the part it makes.
    Written(PartName),
    /// Not now: why (an insert or a queued entry falls inside the range).
    NotReady(String),
    /// Another replica assigned a merge meanwhile; choose the parts again.
    Raced,
}

/// Whether `part` is in `range`'s partition and shares a block number with it.
fn intersects(part: &PartName, range: &PartName) -> bool {
    part.partition_id == range.partition_id && part.min_block <= range.max_block && part.max_block >= range.min_block
}

impl ReplicationQueue {
    /// Writes the merge of `sources` (parts active here) to the log, unless a block number
    /// inside their range is still being inserted, or an entry in this replica's queue (after
    /// pulling the log) brings or merges a part inside it: then the parts chosen here are not
    /// every part of the range.
    pub(crate) async fn try_assign_merge(&self, k: &Keeper, sources: &[PartName], cleanup: bool) -> Result<Assigned> {
        let Some(result) = merged_name(sources) else { return Ok(Assigned::NotReady("nothing to merge".into())) };
        let log = self.paths.of_table("log");
        let log_version = match k.get(&log).await {
            Ok(Some(node)) => node.version,
            Ok(None) => return Err(EngineError::Coordinator(format!("{log} is missing"))),
            Err(e) => return Err(self.lost(e).await),
        };
        let locks = match k.children(&self.paths.block_numbers(&result.partition_id)).await {
            Ok(locks) => locks,
            Err(e) if e.is_no_node() => Vec::new(),
            Err(e) => return Err(self.lost(e).await),
        };
        let inserting =
            locks.iter().filter_map(|l| sequence_number(l)).find(|b| *b >= result.min_block && *b <= result.max_block);
        if let Some(block) = inserting {
            return Ok(Assigned::NotReady(format!(
                "block {block} of partition {} is being inserted",
                result.partition_id
            )));
        }
        // Read after the locks: an insert that committed since is in the log by now.
        self.pull_log(k).await?;
        for queued in self.queued(k).await? {
            let Some(entry) = queued.entry else { continue };
            let Some(part) = PartName::parse(&entry.new_part_name) else { continue };
            if intersects(&part, &result) {
                return Ok(Assigned::NotReady(format!("{} of part {part} is in the queue", entry.kind)));
            }
        }
        let text = merge_parts_entry(&self.paths.replica, sources, &result, cleanup);
        let txn = k.txn().create(&self.paths.log_entry_prefix(), text.as_bytes(), NodeKind::PersistentSequential).set(
            &log,
            b"",
            Some(log_version),
        );
        match txn.commit().await {
            Ok(_) => {
                info!(table = self.paths.table, part = %result, sources = sources.len(), "assigned a merge");
                metrics::counter!(crate::metrics::MERGES_ASSIGNED).increment(1);
                Ok(Assigned::Written(result))
            }
            Err(e) if e.is_bad_version() => Ok(Assigned::Raced),
            Err(e) => Err(self.lost(e).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::LogEntry;

    fn name(text: &str) -> PartName {
        PartName::parse(text).expect("part name")
    }

    #[test]
    fn a_merge_entry_round_trips() {
        let sources = [name("all_0_0_0"), name("all_1_1_0")];
        let result = merged_name(&sources).expect("result");
        assert_eq!(result, name("all_0_1_1"));
        let entry = LogEntry::parse(&merge_parts_entry("r2", &sources, &result, false)).expect("entry");
        assert_eq!(entry.kind, "MERGE_PARTS");
        assert_eq!(entry.source_replica, "r2");
        assert_eq!(entry.parts_to_merge, ["all_0_0_0", "all_1_1_0"]);
        assert_eq!(entry.new_part_name, "all_0_1_1");
        assert!(!entry.cleanup);
        let cleanup = LogEntry::parse(&merge_parts_entry("r2", &sources, &result, true)).expect("entry");
        assert!(cleanup.cleanup);
    }

    #[test]
    fn a_single_merged_part_is_rewritten_one_level_up() {
        assert_eq!(merged_name(&[name("p_3_7_2")]), Some(name("p_3_7_3")));
        assert_eq!(merged_name(&[]), None);
    }

    #[test]
    fn ranges_intersect_only_within_a_partition() {
        let range = name("a_2_5_1");
        assert!(intersects(&name("a_5_5_0"), &range));
        assert!(intersects(&name("a_0_9_3"), &range), "a merge covering the range");
        assert!(!intersects(&name("a_6_6_0"), &range));
        assert!(!intersects(&name("b_3_3_0"), &range));
    }
}
