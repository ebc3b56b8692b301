//! Quorum inserts, as ClickHouse's `insert_quorum` runs them.
//!
//! The insert's commit also creates the part's quorum node, naming the part, how many
//! replicas must have it and the replicas that do (the inserting one first):
//! `quorum/parallel/<part>` under `insert_quorum_parallel`, else the one `quorum/status`,
//! which also keeps a second quorum insert out until the first is satisfied. Each replica
//! that gets the part (`GET_PART` of an entry with a `quorum:` line) adds itself; the one
//! that completes the quorum deletes the node, and for `quorum/status` records the part in
//! `quorum/last_part` (what `select_sequential_consistency` reads). The insert is
//! acknowledged once the node is gone, or fails with UNKNOWN_STATUS_OF_INSERT when
//! `insert_quorum_timeout` passes first: the part stays committed, and a retry of the same
//! block is deduplicated and waits for the same quorum.

use std::collections::{BTreeMap, BTreeSet};

use coordinator_client::{zk, Keeper, KeeperError, Txn};
use mergestream_engine::commit::Quorum;
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result};
use tokio::time::Instant;
use tracing::debug;

use crate::layout::ReplicaPaths;

/// One part's quorum node: ClickHouse's `ReplicatedMergeTreeQuorumEntry` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumEntry {
    pub part_name: String,
    pub required: u64,
    pub replicas: BTreeSet<String>,
}

impl QuorumEntry {
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "version: 1\npart_name: {}\nrequired_number_of_replicas: {}\nactual_number_of_replicas: {}\nreplicas:\n",
            self.part_name,
            self.required,
            self.replicas.len()
        );
        for replica in &self.replicas {
            text.push_str(replica);
            text.push('\n');
        }
        text
    }

    pub fn parse(text: &str) -> Option<QuorumEntry> {
        let mut lines = text.lines();
        (lines.next()? == "version: 1").then_some(())?;
        let part_name = lines.next()?.strip_prefix("part_name: ")?.to_string();
        let required = lines.next()?.strip_prefix("required_number_of_replicas: ")?.parse().ok()?;
        let actual: usize = lines.next()?.strip_prefix("actual_number_of_replicas: ")?.parse().ok()?;
        (lines.next()? == "replicas:").then_some(())?;
        let replicas: BTreeSet<String> = lines.take(actual).map(str::to_string).collect();
        Some(QuorumEntry { part_name, required, replicas })
    }
}

/// `quorum/last_part`: per partition, the last part that reached a (non-parallel) quorum.
pub fn last_parts_text(parts: &BTreeMap<String, String>) -> String {
    let mut text = format!("version: 2\nparts count: {}\n", parts.len());
    for (partition, part) in parts {
        text.push_str(&format!("{partition}\t{part}\n"));
    }
    text
}

pub fn parse_last_parts(text: &str) -> BTreeMap<String, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some("version: 2") => lines
            .skip(1)
            .filter_map(|l| l.split_once('\t'))
            .map(|(partition, part)| (partition.to_string(), part.to_string()))
            .collect(),
        // Version 1 held a single part name.
        Some(part) => PartName::parse(part.trim())
            .map(|name| (name.partition_id.clone(), part.trim().to_string()))
            .into_iter()
            .collect(),
        None => BTreeMap::new(),
    }
}

fn status_path(paths: &ReplicaPaths) -> String {
    paths.of_table("quorum/status")
}

fn parallel_path(paths: &ReplicaPaths, part: &str) -> String {
    paths.of_table(&format!("quorum/parallel/{part}"))
}

fn error(code: &'static str, message: String) -> EngineError {
    EngineError::Replication { code, message }
}

fn keeper_error(e: KeeperError) -> EngineError {
    EngineError::Coordinator(e.to_string())
}

/// How many replicas the quorum needs now; at most 1 means there is no quorum to keep.
pub async fn required(k: &Keeper, paths: &ReplicaPaths, quorum: &Quorum) -> Result<u64> {
    let replicas = k.children(&paths.replicas()).await.map_err(keeper_error)?;
    Ok(quorum.size.of(replicas.len() as u64))
}

/// ClickHouse's precondition of a quorum insert: enough live replicas, this one among them,
/// and (unless parallel) no quorum insert still waiting for its replicas.
pub async fn check(k: &Keeper, paths: &ReplicaPaths, quorum: &Quorum) -> Result<()> {
    let replicas = k.children(&paths.replicas()).await.map_err(keeper_error)?;
    let needed = quorum.size.of(replicas.len() as u64);
    if needed <= 1 {
        return Ok(());
    }
    // This replica counts as alive: whether it really is, is checked below.
    let mut alive = 1;
    for replica in replicas.iter().filter(|r| **r != paths.replica) {
        let other = ReplicaPaths { table: paths.table.clone(), replica: replica.clone() };
        if k.get(&other.of_replica("is_active")).await.map_err(keeper_error)?.is_some() {
            alive += 1;
        }
    }
    if alive < needed {
        return Err(error(
            "TOO_FEW_LIVE_REPLICAS",
            format!("Number of alive replicas ({alive}) is less than requested quorum ({needed}/{}).", replicas.len()),
        ));
    }
    if !quorum.parallel {
        if let Some(status) = k.get(&status_path(paths)).await.map_err(keeper_error)? {
            return Err(error(
                "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE",
                format!(
                    "Quorum for previous write has not been satisfied yet. Status: {}",
                    String::from_utf8_lossy(&status.data)
                ),
            ));
        }
    }
    if k.get(&paths.of_replica("is_active")).await.map_err(keeper_error)?.is_none() {
        return Err(error("READONLY", "Replica is not active right now".into()));
    }
    Ok(())
}

/// The version of this replica's `is_active` node if it is this session's: what a quorum
/// insert's commit checks, so that a replica re-made meanwhile does not open a quorum it will
/// not see through.
pub async fn active_version(k: &Keeper, paths: &ReplicaPaths) -> Result<i32> {
    k.get(&paths.of_replica("is_active"))
        .await
        .map_err(keeper_error)?
        .filter(|node| node.stat.ephemeral_owner == k.session_id())
        .map(|node| node.version)
        .ok_or_else(|| error("READONLY", "Replica is not active right now".into()))
}

/// The ops that open the quorum of `part` in the insert's commit, with the check of
/// `is_active` at [`active_version`]. Returns the index of the quorum node's create.
pub fn open_ops<'a>(
    txn: Txn<'a>,
    paths: &ReplicaPaths,
    part: &str,
    required: u64,
    parallel: bool,
    active_version: i32,
) -> (Txn<'a>, usize) {
    let entry = QuorumEntry { part_name: part.to_string(), required, replicas: [paths.replica.clone()].into() };
    let path = if parallel { parallel_path(paths, part) } else { status_path(paths) };
    let index = txn.len();
    let txn = txn
        .create(&path, entry.to_text().as_bytes(), coordinator_client::NodeKind::Persistent)
        .check(&paths.of_replica("is_active"), active_version);
    (txn, index)
}

/// Waits until the quorum of each of the parts `names` is reached, until the quorum's timeout.
pub async fn wait(k: &Keeper, paths: &ReplicaPaths, quorum: &Quorum, names: &[String]) -> Result<()> {
    let deadline = Instant::now() + quorum.timeout;
    if names.is_empty() {
        return Ok(());
    }
    for name in names {
        wait_gone(k, &parallel_path(paths, name), name, deadline).await?;
        wait_gone(k, &status_path(paths), name, deadline).await?;
        let failed = paths.of_table(&format!("quorum/failed_parts/{name}"));
        if k.get(&failed).await.map_err(keeper_error)?.is_some() {
            return Err(unknown_status(&format!("the quorum of part {name} failed: no replica has the part")));
        }
    }
    // Satisfied, but is this the replica that opened it? One whose session ended meanwhile
    // may have had its quorum failed and removed rather than reached.
    let active = k.get(&paths.of_replica("is_active")).await.map_err(keeper_error)?;
    if active.is_none_or(|node| node.stat.ephemeral_owner != k.session_id()) {
        return Err(unknown_status("Replica became inactive while waiting for quorum"));
    }
    Ok(())
}

fn unknown_status(reason: &str) -> EngineError {
    error(
        "UNKNOWN_STATUS_OF_INSERT",
        format!(
            "Unknown quorum status. The data was inserted in the local replica but we could not verify quorum. \
             Reason: {reason}"
        ),
    )
}

/// Until `path` is gone or names another part (its quorum reached, and maybe the next one's
/// opened).
async fn wait_gone(k: &Keeper, path: &str, part: &str, deadline: Instant) -> Result<()> {
    loop {
        let (data, _, watcher) = match k.raw().get_and_watch_data(path).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(EngineError::Coordinator(format!("watching {path}: {e}"))),
        };
        if QuorumEntry::parse(&String::from_utf8_lossy(&data)).is_none_or(|entry| entry.part_name != part) {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, coordinator_client::watch::changed(watcher, path)).await.is_err() {
            return Err(unknown_status("Timeout while waiting for quorum"));
        }
    }
}

/// A part whose quorum is open and that no replica has any more (lost forever): its quorum
/// fails, as ClickHouse's does for a part lost during a quorum insert. In one multi its
/// quorum node goes (so that the next quorum insert is not refused for it), the part is
/// recorded under `quorum/failed_parts`, and its block's dedup node goes, so that a retry of
/// the insert is written again instead of being taken for a duplicate of rows nobody has.
/// Whether this call failed it.
pub async fn fail_lost(k: &Keeper, paths: &ReplicaPaths, part: &str, block_id: &str) -> Result<bool> {
    for path in [parallel_path(paths, part), status_path(paths)] {
        let Some(node) = k.get(&path).await.map_err(keeper_error)? else { continue };
        if QuorumEntry::parse(&String::from_utf8_lossy(&node.data)).is_none_or(|entry| entry.part_name != part) {
            continue;
        }
        let mut txn = k.txn().delete(&path, Some(node.version)).create(
            &paths.of_table(&format!("quorum/failed_parts/{part}")),
            b"",
            coordinator_client::NodeKind::Persistent,
        );
        if let Some((block, version)) = block_of(k, paths, part, block_id).await? {
            txn = txn.delete(&block, Some(version));
        }
        return match txn.commit().await {
            Ok(_) => {
                tracing::warn!(table = paths.table, part, "the quorum of a lost part failed");
                Ok(true)
            }
            // Another replica failed or completed it meanwhile.
            Err(e) if e.is_bad_version() || e.is_no_node() || e.is_node_exists() => Ok(false),
            Err(e) => Err(keeper_error(e)),
        };
    }
    Ok(false)
}

/// The dedup node (and its version) of the block whose part is `part`: `block_id` when the
/// log entry named it, else found among the kept blocks.
async fn block_of(k: &Keeper, paths: &ReplicaPaths, part: &str, block_id: &str) -> Result<Option<(String, i32)>> {
    let ids = if block_id.is_empty() {
        k.children(&paths.of_table("blocks")).await.map_err(keeper_error)?
    } else {
        vec![block_id.to_string()]
    };
    for id in ids {
        let path = paths.block(&id);
        if let Some(node) = k.get(&path).await.map_err(keeper_error)? {
            if node.data == part.as_bytes() {
                return Ok(Some((path, node.version)));
            }
        }
    }
    Ok(None)
}

/// This replica has `part` now: it adds itself to the part's quorum, and closes the quorum
/// when it is the last replica needed. Nothing to do when the part has no open quorum.
pub async fn update(k: &Keeper, paths: &ReplicaPaths, part: &str) -> Result<()> {
    for (path, parallel) in [(parallel_path(paths, part), true), (status_path(paths), false)] {
        loop {
            let Some(node) = k.get(&path).await.map_err(keeper_error)? else { break };
            let Some(mut entry) = QuorumEntry::parse(&String::from_utf8_lossy(&node.data)) else { break };
            if entry.part_name != part {
                break;
            }
            entry.replicas.insert(paths.replica.clone());
            let result = if entry.replicas.len() as u64 >= entry.required {
                let mut txn = k.txn().delete(&path, Some(node.version));
                if !parallel {
                    txn = record_last_part(k, txn, paths, part).await?;
                }
                txn.commit().await.map(drop)
            } else {
                k.set(&path, entry.to_text().as_bytes(), Some(node.version)).await.map(drop)
            };
            match result {
                Ok(()) => {
                    debug!(part, replicas = entry.replicas.len(), required = entry.required, "quorum updated");
                    return Ok(());
                }
                // Another replica updated it first: read it again.
                Err(e) if e.is_bad_version() => continue,
                Err(e) if e.is_no_node() => break,
                Err(e) => return Err(keeper_error(e)),
            }
        }
    }
    Ok(())
}

/// Adds to `txn` the write of `part` as its partition's last part in `quorum/last_part`.
async fn record_last_part<'a>(k: &Keeper, txn: Txn<'a>, paths: &ReplicaPaths, part: &str) -> Result<Txn<'a>> {
    let path = paths.of_table("quorum/last_part");
    let node = k.get(&path).await.map_err(keeper_error)?;
    let mut parts = node.as_ref().map(|n| parse_last_parts(&String::from_utf8_lossy(&n.data))).unwrap_or_default();
    let Some(name) = PartName::parse(part) else { return Ok(txn) };
    parts.insert(name.partition_id, part.to_string());
    Ok(match node {
        Some(node) => txn.set(&path, last_parts_text(&parts).as_bytes(), Some(node.version)),
        None => txn.create(&path, last_parts_text(&parts).as_bytes(), coordinator_client::NodeKind::Persistent),
    })
}

/// The parts whose quorum is open, with the number of replicas each needs.
pub async fn open_quorums(k: &Keeper, paths: &ReplicaPaths) -> std::result::Result<BTreeMap<String, u64>, KeeperError> {
    let mut open = BTreeMap::new();
    let dir = paths.of_table("quorum/parallel");
    let parallel = match k.children(&dir).await {
        Ok(children) => children,
        Err(e) if e.is_no_node() => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut nodes: Vec<String> = parallel.iter().map(|p| format!("{dir}/{p}")).collect();
    nodes.push(status_path(paths));
    for path in nodes {
        if let Some(entry) = k.get(&path).await?.and_then(|n| QuorumEntry::parse(&String::from_utf8_lossy(&n.data))) {
            open.insert(entry.part_name, entry.required);
        }
    }
    Ok(open)
}

/// At the start of a session: an open quorum of a part this replica has already (its update
/// was lost with the previous session) is updated now, as ClickHouse's restarting thread does.
pub async fn update_for_parts_here(k: &Keeper, paths: &ReplicaPaths, has_part: impl Fn(&str) -> bool) -> Result<()> {
    let open = open_quorums(k, paths).await.map_err(keeper_error)?;
    for part in open.keys().filter(|p| has_part(p)) {
        update(k, paths, part).await?;
    }
    Ok(())
}

/// What `select_sequential_consistency` lets a read see of each partition: parts up to this
/// block number. A partition whose last quorum part is not here is an error
/// (REPLICA_IS_NOT_IN_QUORUM); a partition with a quorum still open hides that part and
/// anything newer.
pub async fn max_visible_blocks(
    k: &Keeper,
    paths: &ReplicaPaths,
    local_max: BTreeMap<String, u64>,
    has_part_or_covering: impl Fn(&PartName) -> bool,
) -> Result<BTreeMap<String, i64>> {
    let mut visible: BTreeMap<String, i64> = local_max.into_iter().map(|(p, b)| (p, b as i64)).collect();
    if let Some(status) = k.get(&status_path(paths)).await.map_err(keeper_error)? {
        if let Some(name) =
            QuorumEntry::parse(&String::from_utf8_lossy(&status.data)).and_then(|e| PartName::parse(&e.part_name))
        {
            visible.insert(name.partition_id.clone(), name.max_block as i64 - 1);
        }
    }
    if let Some(node) = k.get(&paths.of_table("quorum/last_part")).await.map_err(keeper_error)? {
        for part in parse_last_parts(&String::from_utf8_lossy(&node.data)).values() {
            let Some(name) = PartName::parse(part) else { continue };
            if !has_part_or_covering(&name) {
                return Err(error(
                    "REPLICA_IS_NOT_IN_QUORUM",
                    format!(
                        "Replica doesn't have part '{part}' which was successfully written to quorum of other \
                         replicas. Send query to another replica or disable 'select_sequential_consistency' setting"
                    ),
                ));
            }
        }
    }
    Ok(visible)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_entry_reads_back() {
        let entry = QuorumEntry {
            part_name: "all_3_3_0".into(),
            required: 2,
            replicas: ["r1".to_string(), "r2".to_string()].into(),
        };
        let text = entry.to_text();
        assert!(text.starts_with("version: 1\npart_name: all_3_3_0\nrequired_number_of_replicas: 2\n"));
        assert!(text.contains("actual_number_of_replicas: 2\nreplicas:\nr1\nr2\n"));
        assert_eq!(QuorumEntry::parse(&text), Some(entry));
        assert_eq!(QuorumEntry::parse("version: 2\n"), None);
    }

    #[test]
    fn last_parts_read_back_in_both_versions() {
        let parts: BTreeMap<String, String> =
            [("202401".to_string(), "202401_4_4_0".to_string()), ("all".to_string(), "all_1_1_0".to_string())].into();
        let text = last_parts_text(&parts);
        assert_eq!(text, "version: 2\nparts count: 2\n202401\t202401_4_4_0\nall\tall_1_1_0\n");
        assert_eq!(parse_last_parts(&text), parts);
        assert_eq!(parse_last_parts("all_7_7_0"), [("all".to_string(), "all_7_7_0".to_string())].into());
    }
}
