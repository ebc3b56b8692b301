//! Committing insert parts: the step between a part written to disk and a part that is active.
//!
//! Every insert goes through a table's [`PartCommitter`] in three moves:
//!
//! 1. [`reserve`](PartCommitter::reserve) gives each new part its block number, or says that
//!    an insert with the same deduplication id is already committed;
//! 2. [`commit`](PartCommitter::commit) makes the reserved parts and the caller's
//!    [`ExtraOp`]s (the ingestor's offset node) durable together, or not at all;
//! 3. the table renames the parts into place, activates them, and tells the committer
//!    ([`activated`](PartCommitter::activated)).
//!
//! A non-replicated table uses [`LocalCommitter`]: block numbers and the deduplication window
//! live in the table directory, and the extra ops go to the coordinator as one `multi`. A
//! replicated table's committer does all of it in the coordinator: block numbers from
//! `block_numbers/<partition>`, and one `multi` holding the log entry, the part's node, the
//! deduplication node and the extra ops. [`CommitterFactory`] picks one per table.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::error::{EngineError, Result};
use crate::part::meta::FileChecksum;
use crate::part::name::PartName;
use crate::schema::TableDef;

/// The futures of the committer traits: boxed, so the traits stay object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A coordinator operation that commits atomically with an insert's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraOp {
    /// Sets a node's data if the node is at `expected_version` (a compare-and-set).
    SetData { path: String, data: Vec<u8>, expected_version: i32 },
}

impl ExtraOp {
    pub fn path(&self) -> &str {
        match self {
            ExtraOp::SetData { path, .. } => path,
        }
    }
}

/// Why the coordinator refused a commit: nothing of it was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A node was not at the version the operation expected.
    BadVersion,
    /// A node the operation needs does not exist.
    NoNode,
    /// A node the operation creates exists already.
    NodeExists,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::BadVersion => "it is not at the expected version",
            Refusal::NoNode => "it does not exist",
            Refusal::NodeExists => "it exists already",
        })
    }
}

/// Runs extra ops on the coordinator as one `multi`: the storage node's coordinator session,
/// as seen by the engine (which does not speak ZooKeeper itself).
pub trait Coordination: Send + Sync {
    /// Applies every op or none; on success, the new version of each op's node, in order.
    /// Errors are [`EngineError::CommitRefused`] (nothing applied),
    /// [`EngineError::CommitOutcomeUnknown`] (no answer: applied or not) or
    /// [`EngineError::Coordinator`] (an answer saying nothing was applied).
    fn apply<'a>(&'a self, ops: &'a [ExtraOp]) -> BoxFuture<'a, Result<Vec<i32>>>;
}

/// `insert_quorum`: how many replicas must have an inserted part before the insert is
/// acknowledged. A quorum of 1 (or a majority of one replica) is no quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuorumSize {
    Replicas(u64),
    /// `insert_quorum = 'auto'`: a majority of the table's replicas.
    Majority,
}

impl QuorumSize {
    /// The number of replicas this quorum needs out of `replicas`.
    pub fn of(self, replicas: u64) -> u64 {
        match self {
            QuorumSize::Replicas(n) => n,
            QuorumSize::Majority => replicas / 2 + 1,
        }
    }
}

/// A quorum insert's settings, as ClickHouse names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    pub size: QuorumSize,
    /// `insert_quorum_timeout`: how long the insert waits for the quorum once committed.
    pub timeout: std::time::Duration,
    /// `insert_quorum_parallel`: quorum inserts need not wait for each other.
    pub parallel: bool,
}

/// A block number held for one new part until it is committed or released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub partition_id: String,
    pub block: u64,
    pub dedup_id: Option<String>,
}

/// The outcome of [`PartCommitter::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    Block(Reservation),
    /// An insert with the same deduplication id is already committed.
    Duplicate,
}

/// A reserved part about to be committed: its block and the name it becomes active under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartCommit {
    pub reservation: Reservation,
    pub name: PartName,
    pub rows: u64,
    /// Each file's size and CRC: what a replica fetching the part checks it against.
    pub files: BTreeMap<String, FileChecksum>,
}

/// What a successful [`PartCommitter::commit`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The new version of each extra op's node, in the order of the ops.
    pub versions: Vec<i32>,
    /// Parts (indices into the committed ones) found to be duplicates while committing: an
    /// insert of the same block through another replica got there first. They are dropped.
    pub duplicates: Vec<usize>,
}

pub trait PartCommitter: Send + Sync {
    /// A block number for a new part of `partition_id`, unless an insert with `dedup_id` is
    /// already committed. An insert with the same id that is still being committed is
    /// waited for: its outcome decides this one's.
    fn reserve<'a>(&'a self, partition_id: &'a str, dedup_id: Option<&'a str>) -> BoxFuture<'a, Result<Reserved>>;

    /// Makes `parts` and `extra` durable together, or nothing of them (`parts` may be empty:
    /// the extra ops still commit). On an error the reservations stay held: the caller
    /// releases them, or after an unknown outcome decides what happened.
    ///
    /// With a `quorum` (replicated tables), the commit also opens the parts' quorum, which
    /// [`wait_for_quorum`](Self::wait_for_quorum) then waits for.
    fn commit<'a>(
        &'a self,
        parts: &'a [PartCommit],
        extra: &'a [ExtraOp],
        quorum: Option<&'a Quorum>,
    ) -> BoxFuture<'a, Result<CommitOutcome>>;

    /// Before a quorum insert writes anything: enough replicas are alive for it, and (unless
    /// parallel) the previous quorum insert has reached its quorum. A table that is not
    /// replicated has no quorum to check.
    fn check_quorum<'a>(&'a self, _quorum: &'a Quorum) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// After a quorum insert's parts are active here: waits until the quorum of each part,
    /// and of each part an earlier insert of a deduplicated block (`duplicate_ids`) made, is
    /// reached, for at most the quorum's timeout.
    fn wait_for_quorum<'a>(
        &'a self,
        _quorum: &'a Quorum,
        _parts: &'a [String],
        _duplicate_ids: &'a [String],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// The committed parts are active here: their deduplication ids count from now on.
    fn activated(&self, parts: &[PartCommit]) -> Result<()>;

    /// The reservation will not be committed; its dedup id is free again.
    fn release(&self, reservation: &Reservation);

    /// The part that holds the insert block with `dedup_id`, whichever replica committed it:
    /// a retried block found committed already waits for that part's quorum. Only
    /// replicated tables have quorums, so only their committer says.
    fn block_part<'a>(&'a self, _dedup_id: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async { Ok(None) })
    }

    /// The name under which this node committed the insert block with `dedup_id`, if it did:
    /// a prepared insert found after a crash whose commit went through is activated under
    /// it, not committed a second time. The local committer records ids only on activation,
    /// so it never has one to give.
    fn committed_as<'a>(
        &'a self,
        _partition_id: &'a str,
        _dedup_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<PartName>>> {
        Box::pin(async { Ok(None) })
    }
}

/// What a table's committer starts from: found in the parts on disk at open.
#[derive(Debug, Clone, Default)]
pub struct FoundBlocks {
    /// The highest block number of any part.
    pub max_block: u64,
    /// The dedup ids recorded in the parts themselves, oldest first: they cover a crash
    /// between a part's rename and the log's append.
    pub dedup_ids: Vec<String>,
}

/// Makes each table's committer, by the table's engine, and registers a new table where its
/// committer needs it (a replicated table's nodes in the coordinator).
pub trait CommitterFactory: Send + Sync {
    fn committer(&self, def: &TableDef, dir: &Path, found: FoundBlocks) -> Result<Arc<dyn PartCommitter>>;

    /// Before a new table's files are made: a replicated table joins its replicas here (and
    /// fails when its definition differs from theirs).
    fn register<'a>(&'a self, _def: &'a TableDef) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// A table is open and in the catalog: a replicated table's replication starts here.
    fn opened(&self, _table: &Arc<crate::table::Table>) {}

    /// After a table's files are gone (DROP TABLE), or when its creation failed after
    /// [`register`](Self::register).
    fn unregister<'a>(&'a self, _def: &'a TableDef) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// The replication of a replicated table, for SQL to observe and steer.
    fn replica(&self, _table: &str) -> Option<Arc<dyn crate::replica::ReplicaControl>> {
        None
    }

    /// The children of a coordinator node with their data and stats (`system.zookeeper`).
    fn coordinator_children<'a>(
        &'a self,
        _path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::replica::CoordinatorNode>>> {
        Box::pin(async {
            Err(EngineError::Replication {
                code: "NO_ZOOKEEPER",
                message: "This storage node has no coordinator (start it with --coordinator)".into(),
            })
        })
    }
}

/// Every table local, with the extra ops of inserts run on `coordination` when there is one.
#[derive(Default, Clone)]
pub struct LocalCommitters {
    pub coordination: Option<Arc<dyn Coordination>>,
}

impl CommitterFactory for LocalCommitters {
    fn committer(&self, def: &TableDef, dir: &Path, found: FoundBlocks) -> Result<Arc<dyn PartCommitter>> {
        if def.replication.is_some() {
            return Err(EngineError::NoCoordinator { path: def.engine_name() });
        }
        let committer = LocalCommitter::open(dir, def.settings.non_replicated_deduplication_window, found)?;
        Ok(Arc::new(committer.with_coordination(self.coordination.clone())))
    }
}

const DEDUP_LOG: &str = "deduplication_log.txt";
const INCREMENT_FILE: &str = "increment.txt";

/// Block numbers and the `non_replicated_deduplication_window` of a non-replicated table.
pub struct LocalCommitter {
    dir: PathBuf,
    window: usize,
    state: Mutex<LocalState>,
    /// Signalled when a reserved dedup id is activated or released.
    settled: Notify,
    coordination: Option<Arc<dyn Coordination>>,
}

struct LocalState {
    next_block: u64,
    recent: VecDeque<String>,
    seen: HashSet<String>,
    /// Dedup ids reserved and not yet activated or released.
    in_flight: HashSet<String>,
}

impl LocalState {
    fn remember(&mut self, id: String, window: usize) {
        if window == 0 || self.seen.contains(&id) {
            return;
        }
        self.seen.insert(id.clone());
        self.recent.push_back(id);
        while self.recent.len() > window {
            if let Some(old) = self.recent.pop_front() {
                self.seen.remove(&old);
            }
        }
    }
}

impl LocalCommitter {
    pub fn open(dir: &Path, window: u64, found: FoundBlocks) -> Result<LocalCommitter> {
        let increment_path = dir.join(INCREMENT_FILE);
        let persisted = match std::fs::read_to_string(&increment_path) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(EngineError::Io { path: increment_path, source: e }),
        };
        let mut state = LocalState {
            next_block: persisted.max(found.max_block) + 1,
            recent: VecDeque::new(),
            seen: HashSet::new(),
            in_flight: HashSet::new(),
        };
        let window = window as usize;
        let log_path = dir.join(DEDUP_LOG);
        match std::fs::read_to_string(&log_path) {
            Ok(text) => {
                for line in text.lines().filter(|l| !l.is_empty()) {
                    state.remember(decode_log_line(line), window);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EngineError::Io { path: log_path, source: e }),
        }
        for id in found.dedup_ids {
            state.remember(id, window);
        }
        Ok(LocalCommitter {
            dir: dir.to_path_buf(),
            window,
            state: Mutex::new(state),
            settled: Notify::new(),
            coordination: None,
        })
    }

    pub fn with_coordination(mut self, coordination: Option<Arc<dyn Coordination>>) -> LocalCommitter {
        self.coordination = coordination;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn reserve_now(&self, partition_id: &str, dedup_id: Option<&str>) -> Result<std::result::Result<Reserved, ()>> {
        let mut state = self.lock();
        let id = dedup_id.filter(|_| self.window > 0);
        if id.is_some_and(|id| state.in_flight.contains(id)) {
            return Ok(Err(()));
        }
        // As in ClickHouse, a duplicate insert still uses up its block number.
        let block = state.next_block;
        state.next_block += 1;
        let path = self.dir.join(INCREMENT_FILE);
        std::fs::write(&path, block.to_string()).map_err(EngineError::io(&path))?;
        if let Some(id) = id {
            if state.seen.contains(id) {
                return Ok(Ok(Reserved::Duplicate));
            }
            state.in_flight.insert(id.to_string());
        }
        Ok(Ok(Reserved::Block(Reservation {
            partition_id: partition_id.to_string(),
            block,
            dedup_id: dedup_id.map(str::to_string),
        })))
    }

    fn append_to_log(&self, state: &LocalState, ids: &[&str]) -> Result<()> {
        let path = self.dir.join(DEDUP_LOG);
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(EngineError::io(&path))?;
        let lines: String = ids.iter().map(|id| format!("{}\n", encode_log_line(id))).collect();
        file.write_all(lines.as_bytes()).map_err(EngineError::io(&path))?;
        file.sync_data().map_err(EngineError::io(&path))?;
        // The log is rewritten from the window when it grows well past it, so it stays small.
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        if size > (self.window as u64 + 16) * 256 {
            let text: String = state.recent.iter().map(|id| format!("{}\n", encode_log_line(id))).collect();
            let tmp = self.dir.join(format!("{DEDUP_LOG}.tmp"));
            crate::part::write_synced(&tmp, text.as_bytes())?;
            std::fs::rename(&tmp, &path).map_err(EngineError::io(&path))?;
        }
        Ok(())
    }
}

impl PartCommitter for LocalCommitter {
    fn reserve<'a>(&'a self, partition_id: &'a str, dedup_id: Option<&'a str>) -> BoxFuture<'a, Result<Reserved>> {
        Box::pin(async move {
            loop {
                // Registered before the check, so a settle in between is not missed.
                let settled = self.settled.notified();
                match self.reserve_now(partition_id, dedup_id)? {
                    Ok(reserved) => return Ok(reserved),
                    Err(()) => settled.await,
                }
            }
        })
    }

    fn commit<'a>(
        &'a self,
        _parts: &'a [PartCommit],
        extra: &'a [ExtraOp],
        _quorum: Option<&'a Quorum>,
    ) -> BoxFuture<'a, Result<CommitOutcome>> {
        Box::pin(async move {
            if extra.is_empty() {
                return Ok(CommitOutcome::default());
            }
            let Some(coordination) = &self.coordination else {
                return Err(EngineError::NoCoordinator { path: extra[0].path().to_string() });
            };
            Ok(CommitOutcome { versions: coordination.apply(extra).await?, duplicates: Vec::new() })
        })
    }

    fn activated(&self, parts: &[PartCommit]) -> Result<()> {
        let ids: Vec<&str> =
            parts.iter().filter_map(|p| p.reservation.dedup_id.as_deref()).filter(|_| self.window > 0).collect();
        if ids.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        for id in &ids {
            state.in_flight.remove(*id);
            state.remember(id.to_string(), self.window);
        }
        let written = self.append_to_log(&state, &ids);
        drop(state);
        self.settled.notify_waiters();
        written
    }

    fn release(&self, reservation: &Reservation) {
        if let Some(id) = &reservation.dedup_id {
            self.lock().in_flight.remove(id);
            self.settled.notify_waiters();
        }
    }
}

/// A dedup id as one line of the log: a JSON string, so that any id (a newline in it, say)
/// reads back as the one id it was.
fn encode_log_line(id: &str) -> String {
    serde_json::Value::String(id.to_string()).to_string()
}

/// A line of the log. Lines not in quotes were written before ids were framed; they hold one
/// id each, as written.
fn decode_log_line(line: &str) -> String {
    if line.starts_with('"') {
        if let Ok(id) = serde_json::from_str::<String>(line) {
            return id;
        }
    }
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on::block_on;

    fn open(dir: &Path, window: u64, max_block: u64, dedup_ids: Vec<String>) -> LocalCommitter {
        LocalCommitter::open(dir, window, FoundBlocks { max_block, dedup_ids }).expect("open")
    }

    fn reserve(committer: &LocalCommitter, id: &str) -> Reserved {
        block_on(committer.reserve("all", Some(id))).expect("reserve")
    }

    /// Reserves, commits and activates one part; its block number.
    fn insert(committer: &LocalCommitter, id: &str) -> Option<u64> {
        let Reserved::Block(reservation) = reserve(committer, id) else { return None };
        let block = reservation.block;
        let name = PartName { partition_id: "all".into(), min_block: block, max_block: block, level: 0 };
        let parts = [PartCommit { reservation, name, rows: 1, files: BTreeMap::new() }];
        block_on(committer.commit(&parts, &[], None)).expect("commit");
        committer.activated(&parts).expect("activated");
        Some(block)
    }

    #[test]
    fn duplicates_within_the_window_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = open(dir.path(), 2, 0, vec![]);
        assert_eq!(insert(&committer, "a"), Some(1));
        assert_eq!(reserve(&committer, "a"), Reserved::Duplicate);
        drop(committer);

        let reopened = open(dir.path(), 2, 1, vec!["b".into()]);
        assert_eq!(reserve(&reopened, "a"), Reserved::Duplicate);
        assert_eq!(reserve(&reopened, "b"), Reserved::Duplicate);
        assert_eq!(insert(&reopened, "c"), Some(5));
    }

    #[test]
    fn any_id_round_trips_through_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = open(dir.path(), 10, 0, vec![]);
        for (block, id) in (1..).zip(["a\nb", "\"q\"", "\\", "\r", ""]) {
            assert_eq!(insert(&committer, id), Some(block));
        }
        drop(committer);
        let reopened = open(dir.path(), 10, 5, vec![]);
        for id in ["a\nb", "\"q\"", "\\", "\r", ""] {
            assert_eq!(reserve(&reopened, id), Reserved::Duplicate, "{id:?}");
        }
        for id in ["a", "b", "q", "\"q"] {
            assert!(matches!(reserve(&reopened, id), Reserved::Block(_)), "{id:?}");
        }
    }

    #[test]
    fn unframed_lines_of_an_older_log_still_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(DEDUP_LOG), "all_old\n").expect("write");
        let committer = open(dir.path(), 10, 0, vec![]);
        assert_eq!(reserve(&committer, "all_old"), Reserved::Duplicate);
    }

    #[test]
    fn window_zero_never_deduplicates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = open(dir.path(), 0, 0, vec![]);
        assert_eq!(insert(&committer, "a"), Some(1));
        assert_eq!(insert(&committer, "a"), Some(2));
    }

    #[test]
    fn a_released_id_can_be_reserved_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = open(dir.path(), 10, 0, vec![]);
        let Reserved::Block(first) = reserve(&committer, "a") else { panic!("a is new") };
        committer.release(&first);
        assert!(matches!(reserve(&committer, "a"), Reserved::Block(r) if r.block == 2));
    }

    #[test]
    fn an_id_in_flight_waits_for_the_first_insert_and_is_then_a_duplicate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = Arc::new(open(dir.path(), 10, 0, vec![]));
        let Reserved::Block(reservation) = reserve(&committer, "a") else { panic!("a is new") };
        let second = {
            let committer = committer.clone();
            std::thread::spawn(move || reserve(&committer, "a"))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!second.is_finished(), "the second reservation waits for the first");
        let name = PartName { partition_id: "all".into(), min_block: 1, max_block: 1, level: 0 };
        committer.activated(&[PartCommit { reservation, name, rows: 1, files: BTreeMap::new() }]).expect("activated");
        assert_eq!(second.join().expect("second"), Reserved::Duplicate);
    }

    #[test]
    fn extra_ops_without_a_coordinator_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let committer = open(dir.path(), 10, 0, vec![]);
        let op = ExtraOp::SetData { path: "/offsets/p/0".into(), data: vec![], expected_version: 0 };
        let error = block_on(committer.commit(&[], &[op], None)).expect_err("no coordinator");
        assert!(matches!(error, EngineError::NoCoordinator { .. }), "{error}");
    }
}
