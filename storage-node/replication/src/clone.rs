//! A new replica of a table that has data starts as a copy of a healthy replica, as
//! ClickHouse's `cloneReplica` does: the log before the source's pointer may be cleaned away
//! already, so replaying it from the start cannot be trusted.
//!
//! The source's log pointer is read first, then its queue, then its parts. Whatever the
//! source did meanwhile is covered: an entry it ran between the reads is in its queue (read
//! before) or its parts (read after), at worst in both, and a part fetched twice is fetched
//! once. The new replica's queue gets a `GET_PART` for each of the source's parts and a copy
//! of each of its queue entries, and its pointer becomes the source's, in one multi guarded by
//! its own pointer's version.

use coordinator_client::{Keeper, KeeperError, NodeKind};
use tracing::info;

use crate::layout::{get_part_entry_named, ReplicaPaths};

/// A replica's log pointer: `None` while it has never pulled the log (its node is empty).
fn pointer(data: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(data).trim().parse().ok()
}

/// Clones a replica into `paths` if this replica has never pulled the log and another one
/// has; whether it did. `own_version` is the version of this replica's empty pointer node.
pub async fn clone_if_new(k: &Keeper, paths: &ReplicaPaths, own_version: i32) -> Result<bool, KeeperError> {
    let Some((source, source_pointer)) = pick_source(k, paths).await? else { return Ok(false) };
    let other = ReplicaPaths { table: paths.table.clone(), replica: source.clone() };
    let queue_dir = other.of_replica("queue");
    let mut queued = k.children(&queue_dir).await?;
    queued.sort();
    let mut entries = Vec::with_capacity(queued.len());
    for name in queued {
        if let Some(entry) = k.get(&format!("{queue_dir}/{name}")).await? {
            entries.push(entry.data);
        }
    }
    let mut parts = k.children(&other.of_replica("parts")).await?;
    parts.sort();
    let prefix = paths.of_replica("queue/queue-");
    let mut txn = k.txn();
    // A part whose quorum is still open keeps its quorum line: this replica's copy counts.
    let open = crate::quorum::open_quorums(k, paths).await?;
    for part in &parts {
        let mut entry = get_part_entry_named(&source, part, "");
        if let Some(required) = open.get(part) {
            entry.push_str(&format!("quorum: {required}\n"));
        }
        txn = txn.create(&prefix, entry.as_bytes(), NodeKind::PersistentSequential);
    }
    for entry in &entries {
        txn = txn.create(&prefix, entry, NodeKind::PersistentSequential);
    }
    txn = txn.set(&paths.of_replica("log_pointer"), source_pointer.to_string().as_bytes(), Some(own_version));
    match txn.commit().await {
        Ok(_) => {
            info!(
                table = paths.table,
                replica = paths.replica,
                source,
                parts = parts.len(),
                queued = entries.len(),
                log_pointer = source_pointer,
                "cloned a replica"
            );
            metrics::counter!("mergestream_replication_clones_total").increment(1);
            Ok(true)
        }
        // This replica pulled or cloned meanwhile (an overlapping restart): nothing to do.
        Err(e) if e.is_bad_version() => Ok(false),
        Err(e) => Err(e),
    }
}

/// The replica to copy: one that has pulled the log, active ones first, then the furthest.
async fn pick_source(k: &Keeper, paths: &ReplicaPaths) -> Result<Option<(String, u64)>, KeeperError> {
    let mut best: Option<((bool, u64), String)> = None;
    for replica in k.children(&paths.replicas()).await? {
        if replica == paths.replica {
            continue;
        }
        let other = ReplicaPaths { table: paths.table.clone(), replica: replica.clone() };
        let Some(node) = k.get(&other.of_replica("log_pointer")).await? else { continue };
        let Some(at) = pointer(&node.data) else { continue };
        if k.get(&other.of_replica("is_lost")).await?.is_some_and(|v| v.data == b"1") {
            continue;
        }
        let active = k.get(&other.of_replica("is_active")).await?.is_some();
        if best.as_ref().is_none_or(|(rank, _)| (active, at) > *rank) {
            best = Some(((active, at), replica));
        }
    }
    Ok(best.map(|((_, at), replica)| (replica, at)))
}

#[cfg(test)]
mod tests {
    use super::pointer;

    #[test]
    fn an_empty_pointer_means_never_pulled() {
        assert_eq!(pointer(b""), None);
        assert_eq!(pointer(b"17"), Some(17));
        assert_eq!(pointer(b"0"), Some(0));
    }
}
