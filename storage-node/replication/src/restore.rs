//! `SYSTEM RESTORE REPLICA t`: a replica whose coordinator metadata is gone (the Keeper lost
//! its data, or someone removed the table's or this replica's nodes) is read-only; this puts
//! it back from its parts on disk, as ClickHouse's `restoreMetadataInZooKeeper` does:
//!
//! 1. every local part moves to `detached/restore_<name>` (the table is empty meanwhile);
//! 2. the replica registers again: the table's nodes are made when this is the first replica
//!    back, its definition is checked against them otherwise;
//! 3. a part byte-equal to one another replica lists (the same rows and file checksums: a
//!    copy fetched from it, or the one it fetched from here) is listed under this replica and
//!    made active under that part's name; every other part is attached as an insert of its
//!    own (a new block number, a log entry the other replicas fetch it by, a deduplication id
//!    of its checksums, so that two replicas restoring the same part at once commit it once).
//!    What the others have and this replica lacks comes with the clone of a replica that never
//!    pulled, at the queue's next step.
//!
//! A restore cut short (a crash, a lost session) leaves the parts not yet attached in
//! `detached/`; running it again goes on with them.

use std::sync::Arc;

use coordinator_client::{Keeper, NodeKind};
use mergestream_engine::part::name::PartName;
use mergestream_engine::table::attach::Attached;
use mergestream_engine::{EngineError, Result, Table};
use tracing::info;

use crate::control::coordinator_error;
use crate::fetch::PartHeader;
use crate::layout::ReplicaPaths;
use crate::queue::ReplicationQueue;

impl ReplicationQueue {
    pub(crate) async fn restore_replica(&self, table: &Arc<Table>) -> Result<()> {
        // The queue does not run meanwhile: its check of the local parts would take the
        // parts being attached for unexpected ones.
        let _queue_held = self.step_lock.lock().await;
        let k = self.session().await?;
        let registered = k.get(&self.paths.replica_root()).await.map_err(coordinator_error)?.is_some();
        let t = table.clone();
        let mut pending = blocking(move || t.detached_for_restore()).await?;
        if registered && pending.is_empty() {
            return Err(EngineError::Replication {
                code: "BAD_ARGUMENTS",
                message: "Replica has metadata in ZooKeeper: it's either a bug or it's a result of manual \
                          intervention to ZooKeeper"
                    .into(),
            });
        }
        if !registered {
            let t = table.clone();
            let detached = blocking(move || t.detach_all_for_restore()).await?;
            info!(table = self.paths.table, replica = self.paths.replica, parts = detached, "restoring the replica");
            crate::register::register_replica(&k, &self.paths, table.def(), self.activation.host()).await?;
            let t = table.clone();
            pending = blocking(move || t.detached_for_restore()).await?;
        }
        let mut elsewhere = parts_elsewhere(&k, &self.paths).await?;
        let (mut attached, mut adopted, mut duplicates) = (0usize, 0usize, 0usize);
        for dir in pending {
            let t = table.clone();
            let probe = dir.clone();
            let meta = blocking(move || t.detached_meta(&probe)).await?;
            // Each listed part is adopted once: two byte-equal parts here are two inserts.
            let same = elsewhere.iter().position(|(_, h)| h.rows == meta.rows && h.files == meta.files);
            if let Some((name, header)) = same.map(|at| elsewhere.swap_remove(at)) {
                let node = serde_json::json!({ "rows": header.rows, "files": header.files }).to_string();
                match k.create(&self.paths.part(&name), node.as_bytes(), NodeKind::Persistent).await {
                    Ok(_) => {}
                    Err(e) if e.is_node_exists() => {}
                    Err(e) => return Err(coordinator_error(e)),
                }
                let part =
                    PartName::parse(&name).ok_or_else(|| EngineError::Coordinator(format!("bad part name {name}")))?;
                table.adopt_detached(dir, part).await?;
                adopted += 1;
                continue;
            }
            match table.attach_detached(dir).await? {
                Attached::As(_) => attached += 1,
                Attached::Duplicate => duplicates += 1,
            }
            mergestream_engine::failpoint::hit(mergestream_engine::failpoint::RESTORE_AFTER_FIRST_ATTACH);
        }
        info!(
            table = self.paths.table,
            replica = self.paths.replica,
            attached,
            adopted,
            duplicates,
            "restored the replica"
        );
        metrics::counter!(crate::metrics::REPLICAS_RESTORED).increment(1);
        self.forget_tries();
        Ok(())
    }
}

/// Every part the other replicas list, with its header (rows, files' sizes and CRCs).
async fn parts_elsewhere(k: &Keeper, paths: &ReplicaPaths) -> Result<Vec<(String, PartHeader)>> {
    let mut found = Vec::new();
    let replicas = k.children(&paths.replicas()).await.map_err(coordinator_error)?;
    for replica in replicas.into_iter().filter(|r| *r != paths.replica) {
        let other = ReplicaPaths { table: paths.table.clone(), replica };
        let names = match k.children(&other.of_replica("parts")).await {
            Ok(names) => names,
            Err(e) if e.is_no_node() => continue,
            Err(e) => return Err(coordinator_error(e)),
        };
        for name in names {
            let Some(node) = k.get(&other.part(&name)).await.map_err(coordinator_error)? else { continue };
            if let Ok(header) = serde_json::from_slice::<PartHeader>(&node.data) {
                if !found.iter().any(|(n, _)| *n == name) {
                    found.push((name, header));
                }
            }
        }
    }
    Ok(found)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| EngineError::TaskFailed(e.to_string()))?
}
