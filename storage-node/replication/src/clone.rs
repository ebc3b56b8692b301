//! A new replica of a table that has data, and a replica marked lost, start as a copy of a
//! healthy replica, as ClickHouse's `cloneReplica` does: the log before the source's pointer
//! may be cleaned away already, so replaying it cannot be trusted.
//!
//! The source's log pointer is read first, then its queue, then its parts. Whatever the
//! source did meanwhile is covered: an entry it ran between the reads is in its queue (read
//! before) or its parts (read after), at worst in both, and a part fetched twice is fetched
//! once. The new replica's queue gets a `GET_PART` for each of the source's parts and a copy
//! of each of its queue entries, and its pointer becomes the source's, guarded by its own
//! pointer's version; a long queue goes in several multis, the pointer with the last.

use coordinator_client::{Keeper, KeeperError, NodeKind, Txn};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Table};
use tracing::{info, warn};

use crate::layout::{get_part_entry_named, ReplicaPaths};

/// A replica's log pointer: `None` while it has never pulled the log (its node is empty).
fn pointer(data: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(data).trim().parse().ok()
}

/// What a clone copies of its source, read in the order the module's comment gives.
struct SourceCopy {
    source: String,
    pointer: u64,
    queued: Vec<Vec<u8>>,
    parts: Vec<String>,
}

async fn read_source(k: &Keeper, paths: &ReplicaPaths) -> Result<Option<SourceCopy>, KeeperError> {
    let Some((source, pointer)) = pick_source(k, paths).await? else { return Ok(None) };
    let other = ReplicaPaths { table: paths.table.clone(), replica: source.clone() };
    let queue_dir = other.of_replica("queue");
    let mut names = k.children(&queue_dir).await?;
    names.sort();
    let mut queued = Vec::with_capacity(names.len());
    for name in names {
        if let Some(entry) = k.get(&format!("{queue_dir}/{name}")).await? {
            queued.push(entry.data);
        }
    }
    let mut parts = k.children(&other.of_replica("parts")).await?;
    parts.sort();
    Ok(Some(SourceCopy { source, pointer, queued, parts }))
}

/// Adds to `txn` a `GET_PART` of each of `parts` and a copy of each of the source's queue
/// entries, as this replica's queue entries.
async fn queue_copy<'a>(
    k: &Keeper,
    mut txn: Txn<'a>,
    paths: &ReplicaPaths,
    copy: &SourceCopy,
    parts: &[&String],
) -> Result<Txn<'a>, KeeperError> {
    let prefix = paths.of_replica("queue/queue-");
    // A part whose quorum is still open keeps its quorum line: this replica's copy counts.
    let open = crate::quorum::open_quorums(k, paths).await?;
    for part in parts {
        let mut entry = get_part_entry_named(&copy.source, part, "");
        if let Some(required) = open.get(*part) {
            entry.push_str(&format!("quorum: {required}\n"));
        }
        txn = txn.create(&prefix, entry.as_bytes(), NodeKind::PersistentSequential);
    }
    for entry in &copy.queued {
        txn = txn.create(&prefix, entry, NodeKind::PersistentSequential);
    }
    Ok(txn)
}

/// Ops per multi of a clone, as ClickHouse's `zkutil::MULTI_BATCH_SIZE`: the queue of a copy
/// of a replica with thousands of parts would not fit in one Keeper request.
const MULTI_BATCH_SIZE: usize = 100;

/// Deletes the entries of this replica's queue into `txn`: what a clone that did not
/// finish left there, or the queue a lost replica gives up.
async fn clear_queue<'a>(k: &Keeper, mut txn: Txn<'a>, paths: &ReplicaPaths) -> Result<Txn<'a>, KeeperError> {
    let queue_dir = paths.of_replica("queue");
    for entry in k.children(&queue_dir).await? {
        txn = txn.delete(&format!("{queue_dir}/{entry}"), None);
    }
    Ok(txn)
}

fn cloned(paths: &ReplicaPaths, copy: &SourceCopy, why: &str) {
    info!(
        table = paths.table,
        replica = paths.replica,
        source = copy.source,
        parts = copy.parts.len(),
        queued = copy.queued.len(),
        log_pointer = copy.pointer,
        why,
        "cloned a replica"
    );
    metrics::counter!(crate::metrics::CLONES).increment(1);
}

/// Clones a replica into `paths` if this replica has never pulled the log and another one
/// has; whether it did. `own_version` is the version of this replica's empty pointer node.
///
/// The queue is written in several multis when it is long; the pointer moves in the last
/// one, so a clone cut short leaves the pointer empty, and the next one clears what the
/// first queued (a replica that never pulled queues nothing else) and starts over.
pub async fn clone_if_new(k: &Keeper, paths: &ReplicaPaths, own_version: i32) -> Result<bool, KeeperError> {
    let Some(copy) = read_source(k, paths).await? else { return Ok(false) };
    let all: Vec<&String> = copy.parts.iter().collect();
    let txn = clear_queue(k, k.txn(), paths).await?;
    let txn = queue_copy(k, txn, paths, &copy, &all).await?;
    let done = k.txn().set(&paths.of_replica("log_pointer"), copy.pointer.to_string().as_bytes(), Some(own_version));
    match txn.commit_in_batches(done, MULTI_BATCH_SIZE).await {
        Ok(_) => {
            cloned(paths, &copy, "new replica");
            Ok(true)
        }
        // This replica pulled or cloned meanwhile (an overlapping restart): nothing to do.
        Err(e) if e.is_bad_version() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the leader's cleanup marked this replica lost: its pointer fell behind the log
/// that is kept, so the entries it has not read may be gone. `Some(version)` of `is_lost`.
pub async fn lost_version(k: &Keeper, paths: &ReplicaPaths) -> Result<Option<i32>, KeeperError> {
    Ok(k.get(&paths.of_replica("is_lost")).await?.filter(|node| node.data == b"1").map(|node| node.version))
}

/// Brings a lost replica back as a copy of a healthy one, as ClickHouse's
/// `cloneReplicaIfNeeded` does: its queue is replaced by the source's, the parts it lacks are
/// queued for fetching, the local parts no source part covers go to `detached/clone_*`, and
/// `is_lost` is `0` again, with the pointer the source's. Whether it cloned (no healthy
/// replica to copy: not yet).
pub async fn clone_lost(
    k: &Keeper,
    paths: &ReplicaPaths,
    table: &Table,
    lost_version: i32,
) -> mergestream_engine::Result<bool> {
    let keeper_error = |e: KeeperError| EngineError::Coordinator(e.to_string());
    let Some(copy) = read_source(k, paths).await.map_err(keeper_error)? else {
        warn!(table = paths.table, replica = paths.replica, "the replica is lost and no healthy replica can be copied");
        return Ok(false);
    };
    let source_parts: Vec<PartName> = copy.parts.iter().filter_map(|p| PartName::parse(p)).collect();
    let covered_by_source = |name: &PartName| source_parts.iter().any(|s| s == name || s.covers(name));
    // Detached first: a crash after this and before the commit below clones again.
    for part in table.snapshot() {
        if !covered_by_source(&part.name) {
            table.detach_part(&part.name, "clone")?;
        }
    }
    let missing: Vec<&String> =
        copy.parts.iter().filter(|p| PartName::parse(p).is_some_and(|n| !table.has_part_or_covering(&n))).collect();
    // In several multis when long; the replica stays lost until the last one, so a clone cut
    // short is done again from the start.
    let mut txn = clear_queue(k, k.txn(), paths).await.map_err(keeper_error)?;
    let here: Vec<String> = table.snapshot().iter().map(|p| p.name.to_string()).collect();
    for listed in k.children(&paths.of_replica("parts")).await.map_err(keeper_error)? {
        if !here.contains(&listed) {
            txn = txn.delete(&paths.part(&listed), None);
        }
    }
    let txn = queue_copy(k, txn, paths, &copy, &missing).await.map_err(keeper_error)?;
    let done = k
        .txn()
        .check(&paths.of_replica("is_lost"), lost_version)
        .set(&paths.of_replica("log_pointer"), copy.pointer.to_string().as_bytes(), None)
        .set(&paths.of_replica("is_lost"), b"0", None);
    match txn.commit_in_batches(done, MULTI_BATCH_SIZE).await {
        Ok(_) => {
            cloned(paths, &copy, "lost replica");
            Ok(true)
        }
        // Cloned by an overlapping restart of this replica, or its queue changed: next time.
        Err(e) if e.is_bad_version() || e.is_no_node() => Ok(false),
        Err(e) => Err(keeper_error(e)),
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
