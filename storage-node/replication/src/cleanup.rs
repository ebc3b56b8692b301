//! The cleanup of a replicated table's shared nodes, run by the leader every
//! `cleanup_delay_period` seconds (plus up to `cleanup_delay_period_random_add`), as
//! ClickHouse's cleanup thread does:
//!
//! - log entries every replica has copied into its queue go, but the newest
//!   `min_replicated_logs_to_keep` stay; an inactive replica more than
//!   `max_replicated_logs_to_keep` entries behind is marked lost (`is_lost` = 1) and no longer
//!   holds the log back: it clones a healthy replica when it comes back;
//! - deduplication nodes under `blocks/` go once they are neither among the newest
//!   `replicated_deduplication_window` nor younger than `replicated_deduplication_window_seconds`
//!   before the newest one.

use std::collections::BTreeMap;

use coordinator_client::{Keeper, KeeperError, SequentialLog};
use mergestream_engine::settings::TableSettings;

use crate::layout::ReplicaPaths;
use tracing::warn;

/// How many deletes one `multi` carries.
const DELETES_PER_MULTI: usize = 100;

/// What one cleanup removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    pub log_entries: usize,
    pub blocks: usize,
}

/// The creation times of the blocks seen so far, so each block is read once.
#[derive(Default)]
pub struct BlockTimes {
    ctime_ms: BTreeMap<String, i64>,
}

pub async fn clean(
    k: &Keeper,
    paths: &ReplicaPaths,
    settings: &TableSettings,
    times: &mut BlockTimes,
) -> Result<Cleaned, KeeperError> {
    Ok(Cleaned {
        log_entries: clean_log(k, paths, settings).await?,
        blocks: clean_blocks(k, paths, settings, times).await?,
    })
}

/// The sequence numbers below which log entries can go: every replica's pointer is past them,
/// and the newest `keep` entries are kept regardless.
fn log_cut(sequences: &[u64], pointers: &[u64], keep: u64) -> u64 {
    let (Some(&newest), Some(&slowest)) = (sequences.iter().max(), pointers.iter().min()) else { return 0 };
    let keep_from = (newest + 1).saturating_sub(keep);
    slowest.min(keep_from)
}

async fn clean_log(k: &Keeper, paths: &ReplicaPaths, settings: &TableSettings) -> Result<usize, KeeperError> {
    let log_dir = paths.of_table("log");
    let log = SequentialLog::new(&log_dir, "log-");
    let names = k.children(&log_dir).await?;
    let sequences: Vec<u64> = names.iter().filter_map(|n| log.sequence_of(n).ok()).collect();
    let Some(&newest) = sequences.iter().max() else { return Ok(0) };
    // Entries older than these are kept for no replica that is not active.
    let kept_from = (newest + 1).saturating_sub(settings.max_replicated_logs_to_keep);
    let mut pointers = Vec::new();
    for replica in k.children(&paths.replicas()).await? {
        let other = ReplicaPaths { table: paths.table.clone(), replica };
        let Some(node) = k.get(&other.of_replica("log_pointer")).await? else {
            // A replica still being made: it starts from the log's beginning, keep everything.
            return Ok(0);
        };
        if k.get(&other.of_replica("is_lost")).await?.is_some_and(|v| v.data == b"1") {
            continue;
        }
        let pointer = String::from_utf8_lossy(&node.data).trim().parse::<u64>().unwrap_or(0);
        if pointer < kept_from && mark_lost(k, &other, node.version).await? {
            continue;
        }
        pointers.push(pointer);
    }
    let cut = log_cut(&sequences, &pointers, settings.min_replicated_logs_to_keep);
    let old: Vec<String> =
        names.iter().filter(|n| log.sequence_of(n).is_ok_and(|s| s < cut)).map(|n| format!("{log_dir}/{n}")).collect();
    delete_all(k, &old).await
}

/// Marks an inactive replica that fell behind the kept log as lost (ClickHouse's
/// `markReplicasActive`'s counterpart in its cleanup), guarded by its pointer's version: one
/// that pulled meanwhile is not lost. An active replica is never marked: the log waits for it.
async fn mark_lost(k: &Keeper, replica: &ReplicaPaths, pointer_version: i32) -> Result<bool, KeeperError> {
    if k.get(&replica.of_replica("is_active")).await?.is_some() {
        return Ok(false);
    }
    let txn = k.txn().check(&replica.of_replica("log_pointer"), pointer_version).set(
        &replica.of_replica("is_lost"),
        b"1",
        None,
    );
    match txn.commit().await {
        Ok(_) => {
            warn!(
                table = replica.table,
                replica = replica.replica,
                "the replica fell behind the kept log: marked lost"
            );
            metrics::counter!(crate::metrics::REPLICAS_MARKED_LOST).increment(1);
            Ok(true)
        }
        Err(e) if e.is_bad_version() || e.is_no_node() => Ok(false),
        Err(e) => Err(e),
    }
}

/// The blocks to remove: `(name, ctime in ms)` past both the count and the time window.
fn outdated_blocks(mut blocks: Vec<(String, i64)>, window: u64, window_seconds: u64) -> Vec<String> {
    blocks.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let Some(newest) = blocks.first().map(|b| b.1) else { return Vec::new() };
    let oldest_kept_ms = newest.saturating_sub(window_seconds.saturating_mul(1000) as i64);
    blocks
        .into_iter()
        .enumerate()
        .filter(|(i, (_, ctime))| *i as u64 >= window || *ctime < oldest_kept_ms)
        .map(|(_, (name, _))| name)
        .collect()
}

async fn clean_blocks(
    k: &Keeper,
    paths: &ReplicaPaths,
    settings: &TableSettings,
    times: &mut BlockTimes,
) -> Result<usize, KeeperError> {
    let dir = paths.of_table("blocks");
    let names = k.children(&dir).await?;
    times.ctime_ms.retain(|name, _| names.contains(name));
    for name in &names {
        if times.ctime_ms.contains_key(name) {
            continue;
        }
        if let Some(node) = k.get(&format!("{dir}/{name}")).await? {
            times.ctime_ms.insert(name.clone(), node.stat.ctime);
        }
    }
    let blocks = times.ctime_ms.iter().map(|(n, t)| (n.clone(), *t)).collect();
    let outdated: Vec<String> = outdated_blocks(
        blocks,
        settings.replicated_deduplication_window,
        settings.replicated_deduplication_window_seconds,
    )
    .into_iter()
    .map(|name| format!("{dir}/{name}"))
    .collect();
    let deleted = delete_all(k, &outdated).await?;
    times.ctime_ms.retain(|name, _| !outdated.iter().any(|p| p.ends_with(&format!("/{name}"))));
    Ok(deleted)
}

/// Deletes the nodes in multis of [`DELETES_PER_MULTI`]; a node gone already is skipped.
async fn delete_all(k: &Keeper, nodes: &[String]) -> Result<usize, KeeperError> {
    let mut deleted = 0;
    for chunk in nodes.chunks(DELETES_PER_MULTI) {
        let mut txn = k.txn();
        for node in chunk {
            txn = txn.delete(node, None);
        }
        match txn.commit().await {
            Ok(_) => deleted += chunk.len(),
            // Someone removed one of them first: delete the rest one by one.
            Err(e) if e.is_no_node() => {
                for node in chunk {
                    match k.delete(node, None).await {
                        Ok(()) => deleted += 1,
                        Err(e) if e.is_no_node() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entries_go_once_every_replica_is_past_them_but_the_newest_stay() {
        let sequences: Vec<u64> = (0..50).collect();
        // The slowest replica will read entry 30 next.
        assert_eq!(log_cut(&sequences, &[50, 30], 10), 30);
        // Everyone is done: the newest ten stay.
        assert_eq!(log_cut(&sequences, &[50, 50], 10), 40);
        assert_eq!(log_cut(&sequences, &[50], 0), 50);
        assert_eq!(log_cut(&[], &[3], 10), 0);
        assert_eq!(log_cut(&[1, 2], &[], 10), 0);
    }

    #[test]
    fn blocks_past_the_count_or_the_time_window_go() {
        let blocks: Vec<(String, i64)> = (0..6).map(|i| (format!("all_{i}"), i * 1000)).collect();
        // The newest 4 by count.
        let mut gone = outdated_blocks(blocks.clone(), 4, 3600);
        gone.sort();
        assert_eq!(gone, ["all_0", "all_1"]);
        // Younger than 2 s before the newest (5000 ms): 3000, 4000, 5000 stay.
        let mut gone = outdated_blocks(blocks.clone(), 100, 2);
        gone.sort();
        assert_eq!(gone, ["all_0", "all_1", "all_2"]);
        assert!(outdated_blocks(Vec::new(), 1, 1).is_empty());
    }
}
