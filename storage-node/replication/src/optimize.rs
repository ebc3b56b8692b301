//! OPTIMIZE of a replicated table: the replica that runs the statement catches up with the
//! log, assigns the merges through it ([`crate::merges`]) and waits for them as `alter_sync`
//! says. Every replica then runs the same merge, as it runs the leader's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator_client::Keeper;
use mergestream_engine::part::name::PartName;
use mergestream_engine::replica::{ReplicatedWait, SyncMode, WaitFor};
use mergestream_engine::{EngineError, OptimizeRequest, Result, Table};

use crate::control::coordinator_error;
use crate::layout::ReplicaPaths;
use crate::merges::Assigned;
use crate::queue::ReplicationQueue;

/// How often OPTIMIZE looks again at parts, the queue and the other replicas.
const POLL: Duration = Duration::from_millis(50);

impl ReplicationQueue {
    pub(crate) async fn optimize_replicated(
        &self,
        table: &Arc<Table>,
        request: &OptimizeRequest,
        wait: ReplicatedWait,
    ) -> Result<()> {
        table.check_optimize(request)?;
        let deadline = Instant::now() + wait.timeout;
        // The parts other replicas committed are here first, so that the merge takes them in.
        self.sync_replica(SyncMode::Default, wait.timeout).await?;
        let k = self.session().await?;
        let mut merges = Vec::new();
        if request.final_merge {
            for partition in table.optimize_partitions(request) {
                if let Some(result) = self.assign_partition(&k, table, &partition, request.cleanup, deadline).await? {
                    merges.push(result);
                }
            }
        } else {
            if table.merges_stopped() {
                return table.refuse_stopped_merge();
            }
            // As ClickHouse without optimize_throw_if_noop: nothing to merge now is no error.
            if let Some(sources) = table.pick_merge() {
                if let Assigned::Written(result) = self.try_assign_merge(&k, &sources, false).await? {
                    merges.push(result);
                }
            }
        }
        self.wake.notify_one();
        self.wait_for_merges(&k, table, &merges, wait, deadline).await
    }

    /// Assigns the merge of every part of one partition, once no merge or insert is under way
    /// inside it; the part it makes (`None` for a partition with no part left).
    async fn assign_partition(
        &self,
        k: &Keeper,
        table: &Table,
        partition: &str,
        cleanup: bool,
        deadline: Instant,
    ) -> Result<Option<PartName>> {
        let mut waiting_for = String::from("a merge of the partition is running");
        loop {
            if let Some(sources) = table.pick_partition_merge(partition)? {
                if sources.is_empty() {
                    return Ok(None);
                }
                match self.try_assign_merge(k, &sources, cleanup).await? {
                    Assigned::Written(result) => return Ok(Some(result)),
                    Assigned::NotReady(why) => waiting_for = why,
                    Assigned::Raced => continue,
                }
            }
            if Instant::now() >= deadline {
                return Err(EngineError::Replication {
                    code: "TIMEOUT_EXCEEDED",
                    message: format!(
                        "Cannot assign the merge of partition {partition} of {} in time: {waiting_for}. See the \
                         'receive_timeout' setting",
                        self.paths.table
                    ),
                });
            }
            self.wake.notify_one();
            tokio::time::sleep(POLL).await;
        }
    }

    /// Until the replicas `wait` names have the merged parts (or parts covering them).
    async fn wait_for_merges(
        &self,
        k: &Keeper,
        table: &Table,
        merges: &[PartName],
        wait: ReplicatedWait,
        deadline: Instant,
    ) -> Result<()> {
        match wait.wait_for {
            WaitFor::Nobody => Ok(()),
            WaitFor::ThisReplica => {
                while !merges.iter().all(|m| table.has_part_or_covering(m)) {
                    if Instant::now() >= deadline {
                        return Err(self.not_merged_in_time(&self.paths.replica));
                    }
                    tokio::time::sleep(POLL).await;
                }
                Ok(())
            }
            WaitFor::AllReplicas => {
                let replicas = k.children(&self.paths.replicas()).await.map_err(coordinator_error)?;
                let started = Instant::now();
                for replica in replicas {
                    let other = ReplicaPaths { table: self.paths.table.clone(), replica };
                    self.wait_for_replica(k, &other, merges, wait, deadline, started).await?;
                }
                Ok(())
            }
        }
    }

    /// Until one replica lists every merged part (or a part covering it): as long as it is
    /// active, up to `deadline`; while it is inactive, up to the inactive replica timeout.
    async fn wait_for_replica(
        &self,
        k: &Keeper,
        replica: &ReplicaPaths,
        merges: &[PartName],
        wait: ReplicatedWait,
        deadline: Instant,
        started: Instant,
    ) -> Result<()> {
        loop {
            let listed: Vec<PartName> = match k.children(&replica.of_replica("parts")).await {
                Ok(listed) => listed.iter().filter_map(|p| PartName::parse(p)).collect(),
                // Dropped meanwhile: nothing to wait for.
                Err(e) if e.is_no_node() => return Ok(()),
                Err(e) => return Err(coordinator_error(e)),
            };
            if merges.iter().all(|m| listed.iter().any(|p| p == m || p.covers(m))) {
                return Ok(());
            }
            let lost = k.get(&replica.of_replica("is_lost")).await.map_err(coordinator_error)?;
            if lost.is_some_and(|v| v.data == b"1") {
                // A lost replica clones what the others have when it comes back.
                return Ok(());
            }
            let active = k.get(&replica.of_replica("is_active")).await.map_err(coordinator_error)?.is_some();
            let now = Instant::now();
            if active && now >= deadline {
                return Err(self.not_merged_in_time(&replica.replica));
            }
            if !active && wait.inactive_timeout.is_some_and(|t| now >= started + t) {
                return Err(EngineError::Replication {
                    code: "UNFINISHED",
                    message: format!(
                        "Timeout exceeded while waiting for inactive replica {} of {} to run the merge. See the \
                         'replication_wait_for_inactive_replica_timeout' setting",
                        replica.replica, self.paths.table
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn not_merged_in_time(&self, replica: &str) -> EngineError {
        EngineError::Replication {
            code: "TIMEOUT_EXCEEDED",
            message: format!(
                "Replica {replica} of {} did not run the merge in time. See the 'receive_timeout' setting",
                self.paths.table
            ),
        }
    }
}
