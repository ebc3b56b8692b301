//! A replica as SQL sees it: `system.replicas`, `system.replication_queue`, `system.zookeeper`
//! and the SYSTEM statements (SYNC REPLICA, STOP/START FETCHES and REPLICATION QUEUES,
//! RESTART REPLICA, RESTORE REPLICA), read from the coordinator and the replication queue's own state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator_client::{Keeper, KeeperError, SequentialLog};
use mergestream_engine::commit::BoxFuture;
use mergestream_engine::part::name::PartName;
use mergestream_engine::replica::{
    CoordinatorNode, QueueEntryStatus, ReplicaControl, ReplicaStatus, ReplicatedWait, SyncMode,
};
use mergestream_engine::{EngineError, OptimizeRequest, Result, Table};

use crate::layout::ReplicaPaths;
use crate::queue::{now_secs, LogEntry, ReplicationQueue};

/// How often SYNC REPLICA looks at the queue again.
const SYNC_POLL: Duration = Duration::from_millis(50);

pub(crate) fn coordinator_error(e: KeeperError) -> EngineError {
    EngineError::Coordinator(e.to_string())
}

/// A queued entry as the coordinator holds it.
pub(crate) struct Queued {
    pub node_name: String,
    /// `None` for a kind this node does not read.
    pub entry: Option<LogEntry>,
}

impl ReplicationQueue {
    pub(crate) async fn session(&self) -> Result<Keeper> {
        self.session.keeper().await.map_err(|e| EngineError::Replication {
            code: "TABLE_IS_READ_ONLY",
            message: format!("Table is in readonly mode: no coordinator session for {} ({e})", self.paths.table),
        })
    }

    /// The entries of `replicas/<name>/queue`, in execution order.
    pub(crate) async fn queued(&self, k: &Keeper) -> Result<Vec<Queued>> {
        let dir = self.paths.of_replica("queue");
        let mut names = k.children(&dir).await.map_err(coordinator_error)?;
        names.sort();
        let mut queued = Vec::with_capacity(names.len());
        for node_name in names {
            let entry = match k.get(&format!("{dir}/{node_name}")).await.map_err(coordinator_error)? {
                Some(v) => LogEntry::parse(&String::from_utf8_lossy(&v.data)),
                // Done between the listing and the read.
                None => continue,
            };
            queued.push(Queued { node_name, entry });
        }
        Ok(queued)
    }

    async fn log_pointer(&self, k: &Keeper) -> Result<u64> {
        let path = self.paths.of_replica("log_pointer");
        match k.get(&path).await.map_err(coordinator_error)? {
            Some(v) => Ok(String::from_utf8_lossy(&v.data).trim().parse().unwrap_or(0)),
            None => Err(EngineError::Coordinator(format!("{path} is missing"))),
        }
    }

    /// The highest entry number in the shared log, if there is an entry.
    async fn log_max_index(&self, k: &Keeper) -> Result<Option<u64>> {
        let log = SequentialLog::new(&self.paths.of_table("log"), "log-");
        let names = k.children(&self.paths.of_table("log")).await.map_err(coordinator_error)?;
        Ok(names.iter().filter_map(|n| log.sequence_of(n).ok()).max())
    }

    async fn read_status(&self, k: &Keeper) -> Result<ReplicaStatus> {
        let paths = &self.paths;
        let mut status = self.offline_status();
        // Read-only until this session holds is_active (another server may hold the replica).
        status.is_readonly = !self.activation.holds(k.session_id());
        status.is_session_expired = false;
        status.zookeeper_exception.clear();
        status.log_max_index = self.log_max_index(k).await?.unwrap_or(0);
        status.log_pointer = self.log_pointer(k).await?;
        let queued = self.queued(k).await?;
        status.queue_size = queued.len() as u32;
        for entry in queued.iter().filter_map(|q| q.entry.as_ref()) {
            let oldest = |t: &mut i64| {
                if *t == 0 || entry.create_time < *t {
                    *t = entry.create_time;
                }
            };
            oldest(&mut status.queue_oldest_time);
            if entry.kind == "MERGE_PARTS" {
                status.merges_in_queue += 1;
                if status.oldest_part_to_merge_to.is_empty() {
                    status.oldest_part_to_merge_to = entry.new_part_name.clone();
                }
                oldest(&mut status.merges_oldest_time);
            } else {
                status.inserts_in_queue += 1;
                if status.oldest_part_to_get.is_empty() {
                    status.oldest_part_to_get = entry.new_part_name.clone();
                }
                oldest(&mut status.inserts_oldest_time);
            }
        }
        if status.queue_oldest_time > 0 {
            status.absolute_delay = (now_secs() - status.queue_oldest_time).max(0) as u64;
        }
        let mut replicas = k.children(&paths.replicas()).await.map_err(coordinator_error)?;
        replicas.sort();
        for replica in replicas {
            let other = ReplicaPaths { table: paths.table.clone(), replica: replica.clone() };
            let active = k.get(&other.of_replica("is_active")).await.map_err(coordinator_error)?.is_some();
            status.total_replicas += 1;
            status.active_replicas += active as u32;
            status.replica_is_active.push((replica, active));
        }
        let leader = k.get(&paths.of_table("leader_election/leader")).await.map_err(coordinator_error)?;
        status.is_leader = leader.is_some_and(|v| v.data == paths.replica.as_bytes());
        Ok(status)
    }

    /// What is known without the coordinator: a replica without a session is read-only.
    fn offline_status(&self) -> ReplicaStatus {
        let paths = &self.paths;
        ReplicaStatus {
            zookeeper_path: paths.table.clone(),
            replica_name: paths.replica.clone(),
            replica_path: paths.replica_root(),
            is_readonly: true,
            is_session_expired: true,
            last_queue_update: self.last_queue_update.load(Ordering::SeqCst),
            last_queue_update_exception: self
                .last_queue_update_exception
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            ..ReplicaStatus::default()
        }
    }

    /// Pulls the log until the pointer is past every entry that was in it when this began.
    async fn pull_everything(
        &self,
        k: &Keeper,
        deadline: Instant,
        timed_out: &(dyn Fn() -> EngineError + Sync),
    ) -> Result<()> {
        let Some(last) = self.log_max_index(k).await? else { return Ok(()) };
        while self.log_pointer(k).await? <= last {
            if !self.pull_log(k).await? {
                if Instant::now() >= deadline {
                    return Err(timed_out());
                }
                tokio::time::sleep(SYNC_POLL).await;
            }
        }
        Ok(())
    }

    pub(crate) async fn sync_replica(&self, mode: SyncMode, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let table = self.paths.table.clone();
        let timed_out = move || EngineError::Replication {
            code: "TIMEOUT_EXCEEDED",
            message: format!("SYNC REPLICA {table}: command timed out. See the 'receive_timeout' setting"),
        };
        let k = self.session().await?;
        self.pull_everything(&k, deadline, &timed_out).await?;
        if mode == SyncMode::Pull {
            return Ok(());
        }
        let wanted: BTreeSet<String> = self
            .queued(&k)
            .await?
            .into_iter()
            .filter(|q| mode != SyncMode::Lightweight || q.entry.as_ref().is_some_and(|e| e.kind == "GET_PART"))
            .map(|q| q.node_name)
            .collect();
        self.wake.notify_one();
        loop {
            let queued = self.queued(&k).await?;
            let done = match mode {
                SyncMode::Strict => queued.is_empty(),
                _ => !queued.iter().any(|q| wanted.contains(&q.node_name)),
            };
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            tokio::time::sleep(SYNC_POLL).await;
        }
    }
}

impl ReplicaControl for ReplicationQueue {
    fn status(&self) -> BoxFuture<'_, Result<ReplicaStatus>> {
        Box::pin(async move {
            let k = match self.session.keeper().await {
                Ok(k) => k,
                Err(e) => {
                    let mut status = self.offline_status();
                    status.zookeeper_exception = e.to_string();
                    return Ok(status);
                }
            };
            match self.read_status(&k).await {
                Ok(status) => Ok(status),
                Err(e) => {
                    let mut status = self.offline_status();
                    status.zookeeper_exception = e.to_string();
                    Ok(status)
                }
            }
        })
    }

    fn queue(&self) -> BoxFuture<'_, Result<Vec<QueueEntryStatus>>> {
        Box::pin(async move {
            let k = self.session().await?;
            let tries = self.tries();
            let queued = self.queued(&k).await?;
            Ok(queued
                .into_iter()
                .enumerate()
                .map(|(position, q)| {
                    let t = tries.get(&q.node_name).cloned().unwrap_or_default();
                    let entry = q.entry.unwrap_or_else(|| LogEntry { kind: "UNKNOWN", ..LogEntry::default() });
                    QueueEntryStatus {
                        position: position as u32,
                        node_name: q.node_name,
                        kind: entry.kind.to_string(),
                        create_time: entry.create_time,
                        source_replica: entry.source_replica,
                        new_part_name: entry.new_part_name,
                        parts_to_merge: entry.parts_to_merge,
                        is_currently_executing: t.is_currently_executing,
                        num_tries: t.num_tries,
                        last_exception: t.last_exception,
                        last_exception_time: t.last_exception_time,
                        last_attempt_time: t.last_attempt_time,
                        num_postponed: t.num_postponed,
                        postpone_reason: t.postpone_reason,
                        last_postpone_time: t.last_postpone_time,
                    }
                })
                .collect())
        })
    }

    fn sync(&self, mode: SyncMode, timeout: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.sync_replica(mode, timeout))
    }

    fn set_fetches(&self, enabled: bool) {
        self.fetches_stopped.store(!enabled, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn set_queue_execution(&self, enabled: bool) {
        self.execution_stopped.store(!enabled, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn restart(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.forget_tries();
            Ok(())
        })
    }

    fn optimize<'a>(
        &'a self,
        table: &'a Arc<Table>,
        request: &'a OptimizeRequest,
        wait: ReplicatedWait,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.optimize_replicated(table, request, wait))
    }

    fn restore<'a>(&'a self, table: &'a Arc<Table>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.restore_replica(table))
    }

    fn visible_blocks<'a>(&'a self, table: &'a Table) -> BoxFuture<'a, Result<BTreeMap<String, i64>>> {
        Box::pin(async move {
            let k = self.session.keeper().await.map_err(|e| EngineError::Coordinator(e.to_string()))?;
            let here = |name: &PartName| table.has_part_or_covering(name);
            crate::quorum::max_visible_blocks(&k, &self.paths, table.max_blocks(), here).await
        })
    }
}

/// `system.zookeeper WHERE path = …`: the children of `path` with their data and stats.
pub async fn children_of(k: &Keeper, path: &str) -> Result<Vec<CoordinatorNode>> {
    let keeper_error = |e: KeeperError| EngineError::Replication { code: "KEEPER_EXCEPTION", message: e.to_string() };
    let normalized = if path.len() > 1 { path.trim_end_matches('/') } else { path };
    if !normalized.starts_with('/') {
        return Err(EngineError::Replication {
            code: "BAD_ARGUMENTS",
            message: format!("Coordinator paths start with '/', got '{path}'"),
        });
    }
    let mut names = k.children(normalized).await.map_err(keeper_error)?;
    names.sort();
    let mut nodes = Vec::with_capacity(names.len());
    for name in names {
        let child = if normalized == "/" { format!("/{name}") } else { format!("{normalized}/{name}") };
        // A child deleted between the listing and the read is left out.
        let Some(node) = k.get(&child).await.map_err(keeper_error)? else { continue };
        let stat = node.stat;
        nodes.push(CoordinatorNode {
            name,
            value: node.data,
            czxid: stat.czxid,
            mzxid: stat.mzxid,
            ctime: stat.ctime,
            mtime: stat.mtime,
            version: stat.version,
            cversion: stat.cversion,
            aversion: stat.aversion,
            ephemeral_owner: stat.ephemeral_owner,
            data_length: stat.data_length,
            num_children: stat.num_children,
            pzxid: stat.pzxid,
            path: path.to_string(),
        });
    }
    Ok(nodes)
}
