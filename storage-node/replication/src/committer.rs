//! The part committer of a replicated table: block numbers and deduplication in the
//! coordinator, and a commit that is one `multi` for the whole cluster.

use std::sync::Arc;

use coordinator_client::{KeeperError, NodeKind};
use mergestream_engine::commit::{
    BoxFuture, CommitOutcome, ExtraOp, PartCommit, PartCommitter, Quorum, Reservation, Reserved,
};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result};
use tracing::{debug, warn};

use crate::activation::Activation;
use crate::layout::{self, ReplicaPaths};
use crate::quorum;
use crate::session::{add_extra_ops, commit_error, extra_op_versions, CoordinatorSession};

pub struct ReplicatedCommitter {
    session: Arc<CoordinatorSession>,
    paths: ReplicaPaths,
    /// An insert needs the replica active in this session (ClickHouse's read-only table).
    activation: Arc<Activation>,
    /// `replicated_deduplication_window`: 0 turns deduplication off.
    window: u64,
    /// Where a released block number's node is deleted from (release is not async).
    runtime: tokio::runtime::Handle,
}

impl ReplicatedCommitter {
    pub fn new(
        session: Arc<CoordinatorSession>,
        paths: ReplicaPaths,
        activation: Arc<Activation>,
        window: u64,
        runtime: tokio::runtime::Handle,
    ) -> ReplicatedCommitter {
        ReplicatedCommitter { session, paths, activation, window, runtime }
    }

    pub fn paths(&self) -> &ReplicaPaths {
        &self.paths
    }

    async fn keeper(&self) -> Result<coordinator_client::Keeper> {
        match self.session.keeper().await {
            Ok(k) => Ok(k),
            Err(e) => Err(read_only(&format!("the coordinator cannot be reached for {} ({e})", self.paths.table))),
        }
    }

    /// The session, once the replica is active in it: an insert into a replica that another
    /// server holds (or that cannot be claimed now) is refused as read-only.
    async fn active_keeper(&self) -> Result<coordinator_client::Keeper> {
        let k = self.keeper().await?;
        self.activation.ensure(&k).await.map_err(|e| read_only(&e.to_string()))?;
        Ok(k)
    }

    async fn lost(&self, e: KeeperError) -> EngineError {
        self.session.forget_if_lost(&e).await;
        EngineError::Coordinator(e.to_string())
    }

    fn dedup_id<'a>(&self, reservation: &'a Reservation) -> Option<&'a str> {
        reservation.dedup_id.as_deref().filter(|_| self.window > 0)
    }
}

/// Without a coordinator session, or while another server holds the replica, a replicated
/// table takes no inserts (ClickHouse's TABLE_IS_READ_ONLY); reads go on from the local parts.
fn read_only(why: &str) -> EngineError {
    EngineError::Replication { code: "TABLE_IS_READ_ONLY", message: format!("Table is in readonly mode: {why}") }
}

/// The block number a sequential create gave: the digits after the last `-`.
pub(crate) fn sequence_number(path: &str) -> Option<u64> {
    path.rsplit_once('-').and_then(|(_, digits)| digits.parse().ok())
}

impl ReplicatedCommitter {
    /// After a commit whose answer was lost: the part's node says whether the `multi` went
    /// through (it holds all of the commit or none). Asked again until the coordinator
    /// answers, for as long as a session lasts; then the outcome stays unknown.
    async fn settle(
        &self,
        parts: &[PartCommit],
        extra: &[ExtraOp],
        duplicates: Vec<usize>,
        why: String,
    ) -> Result<CommitOutcome> {
        let Some(probe) = parts.iter().enumerate().find(|(i, _)| !duplicates.contains(i)).map(|(_, p)| p) else {
            // Only the extra ops were in it: their owner reads them back.
            return Err(EngineError::CommitOutcomeUnknown(why));
        };
        let part_node = self.paths.part(&probe.name.to_string());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let answer = match self.session.keeper().await {
                Ok(k) => match k.get(&part_node).await {
                    Ok(found) => Ok((k, found.is_some())),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match answer {
                Ok((k, true)) => {
                    let mut versions = Vec::with_capacity(extra.len());
                    for op in extra {
                        match k.get(op.path()).await {
                            Ok(Some(v)) => versions.push(v.version),
                            Ok(None) => versions.push(-1),
                            Err(e) => return Err(EngineError::CommitOutcomeUnknown(e.to_string())),
                        }
                    }
                    return Ok(CommitOutcome { versions, duplicates });
                }
                Ok((_, false)) => {
                    return Err(EngineError::Coordinator(format!("the commit did not happen ({why})")));
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    self.session.forget_if_lost(&e).await;
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(EngineError::CommitOutcomeUnknown(format!("{why}; then {e}"))),
            }
        }
    }
}

impl PartCommitter for ReplicatedCommitter {
    fn reserve<'a>(&'a self, partition_id: &'a str, dedup_id: Option<&'a str>) -> BoxFuture<'a, Result<Reserved>> {
        Box::pin(async move {
            let k = self.active_keeper().await?;
            if let Some(id) = dedup_id.filter(|_| self.window > 0) {
                match k.get(&self.paths.block(id)).await {
                    Ok(Some(_)) => return Ok(Reserved::Duplicate),
                    Ok(None) => {}
                    Err(e) => return Err(self.lost(e).await),
                }
            }
            let numbers = self.paths.block_numbers(partition_id);
            match k.create(&numbers, b"", NodeKind::Persistent).await {
                Ok(_) => {}
                Err(e) if e.is_node_exists() => {}
                Err(e) => return Err(self.lost(e).await),
            }
            let lock = match k
                .create(&format!("{numbers}/block-"), self.paths.replica.as_bytes(), NodeKind::EphemeralSequential)
                .await
            {
                Ok(path) => path,
                Err(e) => return Err(self.lost(e).await),
            };
            let block = sequence_number(&lock).ok_or_else(|| {
                EngineError::Coordinator(format!("the coordinator named a sequential node {lock}: no number in it"))
            })?;
            Ok(Reserved::Block(Reservation {
                partition_id: partition_id.to_string(),
                block,
                dedup_id: dedup_id.map(str::to_string),
            }))
        })
    }

    fn commit<'a>(
        &'a self,
        parts: &'a [PartCommit],
        extra: &'a [ExtraOp],
        quorum: Option<&'a Quorum>,
    ) -> BoxFuture<'a, Result<CommitOutcome>> {
        Box::pin(async move {
            let k = self.active_keeper().await?;
            let required = match quorum {
                Some(q) => quorum::required(&k, &self.paths, q).await?,
                None => 0,
            };
            // Read once for the whole commit: each part's quorum checks the same node.
            let opening = match quorum.filter(|_| required > 1) {
                Some(q) => Some((q.parallel, quorum::active_version(&k, &self.paths).await?)),
                None => None,
            };
            let mut duplicates: Vec<usize> = Vec::new();
            loop {
                // Per part: the log entry, the part's node, the block's dedup node and the end
                // of its block number lock; then the caller's ops.
                let mut txn = k.txn();
                let mut dedup_ops: Vec<(usize, usize)> = Vec::new();
                let mut quorum_ops: Vec<usize> = Vec::new();
                for (index, part) in parts.iter().enumerate() {
                    let lock = self.paths.block_number_lock(&part.reservation.partition_id, part.reservation.block);
                    if duplicates.contains(&index) {
                        txn = txn.delete(&lock, None);
                        continue;
                    }
                    let entry = layout::get_part_entry(&self.paths.replica, part, required);
                    txn = txn
                        .create(&self.paths.log_entry_prefix(), entry.as_bytes(), NodeKind::PersistentSequential)
                        .create(
                            &self.paths.part(&part.name.to_string()),
                            &layout::part_node(part),
                            NodeKind::Persistent,
                        );
                    if let Some(id) = self.dedup_id(&part.reservation) {
                        dedup_ops.push((txn.len(), index));
                        txn = txn.create(&self.paths.block(id), part.name.to_string().as_bytes(), NodeKind::Persistent);
                    }
                    txn = txn.delete(&lock, None);
                    if let Some((parallel, active_version)) = opening {
                        let name = part.name.to_string();
                        let (with_quorum, index) =
                            quorum::open_ops(txn, &self.paths, &name, required, parallel, active_version);
                        quorum_ops.push(index);
                        txn = with_quorum;
                    }
                }
                txn = add_extra_ops(txn, extra);
                match txn.commit().await {
                    Ok(results) => {
                        metrics::counter!(crate::metrics::PARTS_COMMITTED)
                            .increment((parts.len() - duplicates.len()) as u64);
                        return Ok(CommitOutcome { versions: extra_op_versions(&results), duplicates });
                    }
                    Err(KeeperError::Txn { index, source, path, op })
                        if matches!(source, coordinator_client::zk::Error::NodeExists)
                            && dedup_ops.iter().any(|(op_index, _)| *op_index == index) =>
                    {
                        // The same block came in through another replica meanwhile: this part
                        // adds nothing, the rest of the commit goes on without it.
                        let part = dedup_ops.iter().find(|(op_index, _)| *op_index == index).map(|(_, p)| *p);
                        debug!(path, op, "a block committed meanwhile through another replica");
                        duplicates.extend(part);
                    }
                    Err(KeeperError::Txn { index, source, .. })
                        if matches!(source, coordinator_client::zk::Error::NodeExists)
                            && quorum_ops.contains(&index) =>
                    {
                        return Err(EngineError::Replication {
                            code: "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE",
                            message: "Another quorum insert has been already started".into(),
                        });
                    }
                    Err(KeeperError::Txn { index, .. }) if quorum_ops.iter().any(|q| *q + 1 == index) => {
                        // The is_active check: this replica's session was re-made meanwhile.
                        return Err(EngineError::Replication {
                            code: "READONLY",
                            message: "Replica is not active right now".into(),
                        });
                    }
                    Err(e) => {
                        self.session.forget_if_lost(&e).await;
                        return match commit_error(e) {
                            EngineError::CommitOutcomeUnknown(why) => self.settle(parts, extra, duplicates, why).await,
                            error => Err(error),
                        };
                    }
                }
            }
        })
    }

    fn check_quorum<'a>(&'a self, q: &'a Quorum) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let k = self.keeper().await?;
            quorum::check(&k, &self.paths, q).await
        })
    }

    fn wait_for_quorum<'a>(
        &'a self,
        q: &'a Quorum,
        parts: &'a [String],
        duplicate_ids: &'a [String],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let k = self.keeper().await?;
            if quorum::required(&k, &self.paths, q).await? <= 1 {
                return Ok(());
            }
            // A block found committed already waits for the quorum of the part it went into.
            let mut names = parts.to_vec();
            for id in duplicate_ids {
                names.extend(self.block_part(id).await?);
            }
            quorum::wait(&k, &self.paths, q, &names).await
        })
    }

    fn activated(&self, _parts: &[PartCommit]) -> Result<()> {
        Ok(())
    }

    fn block_part<'a>(&'a self, dedup_id: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move {
            let k = self.keeper().await?;
            match k.get(&self.paths.block(dedup_id)).await {
                Ok(found) => Ok(found.map(|v| String::from_utf8_lossy(&v.data).into_owned())),
                Err(e) => Err(self.lost(e).await),
            }
        })
    }

    fn committed_as<'a>(
        &'a self,
        _partition_id: &'a str,
        dedup_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<PartName>>> {
        Box::pin(async move {
            let k = self.keeper().await?;
            let name = match k.get(&self.paths.block(dedup_id)).await {
                Ok(Some(v)) => String::from_utf8_lossy(&v.data).into_owned(),
                Ok(None) => return Ok(None),
                Err(e) => return Err(self.lost(e).await),
            };
            // The block may be another replica's part: then this node's copy is a duplicate.
            match k.get(&self.paths.part(&name)).await {
                Ok(Some(_)) => Ok(PartName::parse(&name)),
                Ok(None) => Ok(None),
                Err(e) => Err(self.lost(e).await),
            }
        })
    }

    fn release(&self, reservation: &Reservation) {
        let session = self.session.clone();
        let lock = self.paths.block_number_lock(&reservation.partition_id, reservation.block);
        // The node is ephemeral: if this delete is lost, the session's end removes it.
        self.runtime.spawn(async move {
            if let Ok(k) = session.keeper().await {
                if let Err(e) = k.delete(&lock, None).await {
                    if !e.is_no_node() {
                        warn!(lock, error = %e, "cannot give up a block number");
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_numbers_come_from_the_sequential_suffix() {
        assert_eq!(sequence_number("/t/block_numbers/all/block-0000000042"), Some(42));
        assert_eq!(sequence_number("/t/block_numbers/all/block"), None);
    }
}
