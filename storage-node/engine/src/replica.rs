//! What SQL sees of a replicated table's replication: its state, for `system.replicas` and
//! `system.replication_queue`, and the SYSTEM statements that steer it. The engine does not
//! replicate anything itself; the replication crate implements [`ReplicaControl`] and the
//! catalog's committer factory hands it out per table.

use std::sync::Arc;
use std::time::Duration;

use crate::commit::BoxFuture;
use crate::error::Result;
use crate::table::{OptimizeRequest, Table};

/// One replica of one table, as `system.replicas` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub zookeeper_path: String,
    pub replica_name: String,
    pub replica_path: String,
    pub is_leader: bool,
    /// No coordinator session: inserts are refused (TABLE_IS_READ_ONLY), reads go on.
    pub is_readonly: bool,
    pub is_session_expired: bool,
    pub queue_size: u32,
    pub inserts_in_queue: u32,
    pub merges_in_queue: u32,
    /// Seconds since the epoch of the oldest entry of each kind; 0 when there is none.
    pub queue_oldest_time: i64,
    pub inserts_oldest_time: i64,
    pub merges_oldest_time: i64,
    pub oldest_part_to_get: String,
    pub oldest_part_to_merge_to: String,
    /// The highest entry number in the shared log (0 when it is empty).
    pub log_max_index: u64,
    /// The next log entry this replica will copy into its queue.
    pub log_pointer: u64,
    /// Seconds since the epoch of the last successful pull of the log; 0 before the first.
    pub last_queue_update: i64,
    /// How far behind this replica is, in seconds: now minus its oldest queued entry's time.
    pub absolute_delay: u64,
    pub total_replicas: u32,
    pub active_replicas: u32,
    /// Every replica of the table and whether it is active.
    pub replica_is_active: Vec<(String, bool)>,
    pub last_queue_update_exception: String,
    pub zookeeper_exception: String,
}

/// One entry of a replica's replication queue, as `system.replication_queue` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueEntryStatus {
    pub position: u32,
    /// The entry's node under `replicas/<name>/queue`.
    pub node_name: String,
    /// `GET_PART` or `MERGE_PARTS`.
    pub kind: String,
    /// Seconds since the epoch.
    pub create_time: i64,
    pub source_replica: String,
    pub new_part_name: String,
    pub parts_to_merge: Vec<String>,
    pub is_currently_executing: bool,
    pub num_tries: u32,
    pub last_exception: String,
    pub last_exception_time: i64,
    pub last_attempt_time: i64,
    pub num_postponed: u32,
    pub postpone_reason: String,
    pub last_postpone_time: i64,
}

/// What `SYSTEM SYNC REPLICA` waits for, after pulling the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// The entries queued when the statement started.
    Default,
    /// An empty queue.
    Strict,
    /// Only the queued `GET_PART` entries (new inserts), not merges.
    Lightweight,
    /// Nothing more than pulling the log into the queue.
    Pull,
}

/// Whose execution an OPTIMIZE of a replicated table waits for: ClickHouse's `alter_sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// 0: the merge is in the log, nothing more.
    Nobody,
    /// 1 (the default): this replica has run it.
    ThisReplica,
    /// 2: every replica has.
    AllReplicas,
}

/// How an OPTIMIZE of a replicated table waits for its merges.
#[derive(Debug, Clone, Copy)]
pub struct ReplicatedWait {
    pub wait_for: WaitFor,
    /// For this replica and the active ones (`receive_timeout`): TIMEOUT_EXCEEDED past it.
    pub timeout: Duration,
    /// For an inactive replica (`replication_wait_for_inactive_replica_timeout`); `None` waits
    /// as long as it takes. UNFINISHED past it.
    pub inactive_timeout: Option<Duration>,
}

pub trait ReplicaControl: Send + Sync {
    fn status(&self) -> BoxFuture<'_, Result<ReplicaStatus>>;

    /// The queue's entries in execution order, as the coordinator holds them, with this
    /// replica's tries and errors of each.
    fn queue(&self) -> BoxFuture<'_, Result<Vec<QueueEntryStatus>>>;

    /// `SYSTEM SYNC REPLICA`; `TIMEOUT_EXCEEDED` after `timeout`.
    fn sync(&self, mode: SyncMode, timeout: Duration) -> BoxFuture<'_, Result<()>>;

    /// `SYSTEM STOP/START FETCHES`: while stopped, entries that need a fetch are postponed.
    fn set_fetches(&self, enabled: bool);

    /// `SYSTEM STOP/START REPLICATION QUEUES`: while stopped, the log is still pulled into
    /// the queue but no entry runs.
    fn set_queue_execution(&self, enabled: bool);

    /// `SYSTEM RESTART REPLICA`: forgets the queue's retry state, registers the replica as
    /// active again and runs the queue now.
    fn restart(&self) -> BoxFuture<'_, Result<()>>;

    /// `OPTIMIZE` of a replicated table: the merges written to the shared log as `MERGE_PARTS`
    /// entries that every replica runs, after this replica has caught up with the log, then
    /// waited for as `wait` says.
    fn optimize<'a>(
        &'a self,
        table: &'a Arc<Table>,
        request: &'a OptimizeRequest,
        wait: ReplicatedWait,
    ) -> BoxFuture<'a, Result<()>>;

    /// `SYSTEM RESTORE REPLICA`: the replica's coordinator metadata made again from the parts
    /// on disk (BAD_ARGUMENTS while it has metadata there).
    fn restore<'a>(&'a self, table: &'a Arc<Table>) -> BoxFuture<'a, Result<()>>;

    /// `select_sequential_consistency`: per partition, the highest block number a read of
    /// `table` may see (nothing newer than an open quorum; REPLICA_IS_NOT_IN_QUORUM when a
    /// part that reached its quorum is not here).
    fn visible_blocks<'a>(
        &'a self,
        table: &'a crate::table::Table,
    ) -> BoxFuture<'a, Result<std::collections::BTreeMap<String, i64>>>;
}

/// A coordinator node as `system.zookeeper` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorNode {
    pub name: String,
    pub value: Vec<u8>,
    pub czxid: i64,
    pub mzxid: i64,
    /// Milliseconds since the epoch.
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
    /// The parent's path, as the query named it.
    pub path: String,
}
