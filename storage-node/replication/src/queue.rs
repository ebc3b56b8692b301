//! A replica's replication queue: log entries copied into `replicas/<name>/queue`, the log
//! pointer moved in the same `multi`, and each entry executed until done. A `GET_PART` entry
//! is done when the part (or one covering it) is active here and listed under the replica's
//! `parts`; a part this replica lacks is fetched from a replica that has it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use coordinator_client::{Keeper, KeeperError, NodeKind, SequentialLog};
use mergestream_engine::merge::AlgorithmOptions;
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result, Table};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::activation::Activation;
use crate::cleanup::{self, BlockTimes, Cleaned};
use crate::clone;
use crate::fetch::{fetch_part, PartHeader, ReplicaAddress};
use crate::layout::ReplicaPaths;
use crate::merges::Assigned;
use crate::part_check::{self, Checked};
use crate::session::CoordinatorSession;

/// A log entry as the queue needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogEntry {
    /// `GET_PART` or `MERGE_PARTS`.
    pub kind: &'static str,
    pub source_replica: String,
    pub new_part_name: String,
    /// A merge's sources, in order.
    pub parts_to_merge: Vec<String>,
    /// Seconds since the epoch (the entry's `create_time`, written in UTC); 0 if it has none.
    pub create_time: i64,
    /// A quorum insert's part: how many replicas its insert waits for (0: no quorum).
    pub quorum: u64,
    /// A merge of OPTIMIZE … FINAL CLEANUP: ReplacingMergeTree's tombstones are dropped.
    pub cleanup: bool,
    /// An insert's part: the deduplication id of its block (empty when unknown, as in the
    /// entries a clone queues).
    pub block_id: String,
}

impl LogEntry {
    /// Reads ClickHouse's text of a log entry; `None` for a kind this node does not run yet.
    pub fn parse(text: &str) -> Option<LogEntry> {
        let source_replica = text.lines().find_map(|l| l.strip_prefix("source replica: "))?.to_string();
        let create_time = text
            .lines()
            .find_map(|l| l.strip_prefix("create_time: "))
            .and_then(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S").ok())
            .map_or(0, |t| t.and_utc().timestamp());
        let quorum = text.lines().find_map(|l| l.strip_prefix("quorum: ")).and_then(|q| q.parse().ok()).unwrap_or(0);
        let cleanup = text.lines().any(|l| l == "cleanup: 1");
        let block_id = text.lines().find_map(|l| l.strip_prefix("block_id: ")).unwrap_or_default().to_string();
        let mut lines = text.lines().skip_while(|l| *l != "get" && *l != "merge");
        let entry = match lines.next()? {
            "get" => LogEntry {
                kind: "GET_PART",
                source_replica,
                new_part_name: lines.next()?.to_string(),
                parts_to_merge: Vec::new(),
                create_time,
                quorum,
                cleanup,
                block_id,
            },
            _ => {
                let parts_to_merge: Vec<String> =
                    lines.by_ref().take_while(|l| *l != "into").map(str::to_string).collect();
                let new_part_name = lines.next()?.to_string();
                if parts_to_merge.is_empty() || parts_to_merge.iter().any(|p| PartName::parse(p).is_none()) {
                    return None;
                }
                LogEntry {
                    kind: "MERGE_PARTS",
                    source_replica,
                    new_part_name,
                    parts_to_merge,
                    create_time,
                    quorum,
                    cleanup,
                    block_id,
                }
            }
        };
        PartName::parse(&entry.new_part_name)?;
        Some(entry)
    }
}

/// This replica's tries of one queue entry (the entry itself is in the coordinator).
#[derive(Debug, Clone, Default)]
pub(crate) struct Tries {
    pub num_tries: u32,
    pub last_exception: String,
    pub last_exception_time: i64,
    pub last_attempt_time: i64,
    pub num_postponed: u32,
    pub postpone_reason: String,
    pub last_postpone_time: i64,
    pub is_currently_executing: bool,
    retry_at: Option<Instant>,
}

/// What running an entry came to, short of an error.
enum Ran {
    Done,
    /// Not run now, not counted as a try (fetches stopped): the reason.
    Postponed(String),
}

pub struct ReplicationQueue {
    pub(crate) paths: ReplicaPaths,
    pub(crate) session: Arc<CoordinatorSession>,
    tries: Mutex<BTreeMap<String, Tries>>,
    /// `SYSTEM STOP FETCHES`.
    pub(crate) fetches_stopped: AtomicBool,
    /// `SYSTEM STOP REPLICATION QUEUES`.
    pub(crate) execution_stopped: AtomicBool,
    /// Runs the queue now instead of at the next log change or second.
    pub(crate) wake: Notify,
    /// Seconds since the epoch of the last pull of the log that went through.
    pub(crate) last_queue_update: AtomicI64,
    pub(crate) last_queue_update_exception: Mutex<String>,
    /// The replica's `is_active` claim, shared with the table's committer.
    pub(crate) activation: Arc<Activation>,
    /// The session the queue last started working in (0: none yet): a new one first
    /// finishes the quorum updates the previous session did not get to.
    queue_session: AtomicI64,
    /// When the leader cleans the log and blocks next (`None`: not scheduled yet).
    next_cleanup: Mutex<Option<Instant>>,
    block_times: tokio::sync::Mutex<BlockTimes>,
    /// Whether the local parts were checked against the coordinator since the start.
    parts_checked: AtomicBool,
    /// The watch on the log that has not fired yet ([`wait_for_log`](Self::wait_for_log)).
    log_watch: tokio::sync::Mutex<Option<LogWatch>>,
    /// Held while the log is pulled into the queue or the replica is cloned (ClickHouse's
    /// `pull_logs_to_queue_mutex`): the queue's own pull and SYSTEM SYNC REPLICA's overlap,
    /// and a clone written in several multis clears the queue first, so a second clone
    /// beside it deleted the entries the first had written, and their parts were never
    /// fetched.
    pull_lock: tokio::sync::Mutex<()>,
    /// Held for each step of the queue, and by SYSTEM RESTORE REPLICA while it works.
    pub(crate) step_lock: tokio::sync::Mutex<()>,
}

type LogWatch = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Whether a replica that has every source of a merge fetches the merged part instead:
/// always with `always_fetch_merged_part`, and for a merge both old and big enough
/// (`prefer_fetch_merged_part_time_threshold` and `_size_threshold`), as ClickHouse decides.
fn fetch_rather_than_merge(table: &Table, entry: &LogEntry, sources: &[PartName]) -> bool {
    let settings = &table.def().settings;
    if settings.always_fetch_merged_part {
        return true;
    }
    let age = now_secs().saturating_sub(entry.create_time).max(0) as u64;
    let bytes: u64 = sources.iter().filter_map(|p| table.active_part(&p.to_string())).map(|p| p.bytes_on_disk).sum();
    age >= settings.prefer_fetch_merged_part_time_threshold && bytes >= settings.prefer_fetch_merged_part_size_threshold
}

/// The last component of a coordinator path: a queue entry's node name, as the queue's
/// bookkeeping keys its tries.
fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

pub(crate) fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// How long an entry that failed waits before its next try: doubling, at most 10 s.
fn backoff(tries: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << tries.min(7))).min(Duration::from_secs(10))
}

impl ReplicationQueue {
    /// Starts the queue of `table` on `runtime`; it stops once the table is dropped.
    pub fn start(
        table: &Arc<Table>,
        paths: ReplicaPaths,
        activation: Arc<Activation>,
        session: Arc<CoordinatorSession>,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<ReplicationQueue> {
        let queue = Arc::new(ReplicationQueue {
            paths,
            session,
            tries: Mutex::new(BTreeMap::new()),
            fetches_stopped: AtomicBool::new(false),
            execution_stopped: AtomicBool::new(false),
            wake: Notify::new(),
            last_queue_update: AtomicI64::new(0),
            last_queue_update_exception: Mutex::new(String::new()),
            activation,
            queue_session: AtomicI64::new(0),
            next_cleanup: Mutex::new(None),
            block_times: tokio::sync::Mutex::new(BlockTimes::default()),
            parts_checked: AtomicBool::new(false),
            log_watch: tokio::sync::Mutex::new(None),
            pull_lock: tokio::sync::Mutex::new(()),
            step_lock: tokio::sync::Mutex::new(()),
        });
        runtime.spawn(queue.clone().run(Arc::downgrade(table)));
        queue
    }

    /// This replica's tries of each queue entry it has run, by node name.
    pub(crate) fn tries(&self) -> BTreeMap<String, Tries> {
        self.lock().clone()
    }

    /// Forgets every entry's tries, so that failed entries run again now.
    pub(crate) fn forget_tries(&self) {
        self.lock().clear();
        self.activation.forget();
        self.queue_session.store(0, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Tries>> {
        self.tries.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(self: Arc<Self>, table: Weak<Table>) {
        let mut failures = 0u32;
        loop {
            let Some(t) = table.upgrade() else { return };
            let step = {
                let _held = self.step_lock.lock().await;
                self.step(&t).await
            };
            drop(t);
            match step {
                Ok(true) => failures = 0,
                Ok(false) => {
                    failures = 0;
                    self.wait_for_log().await;
                }
                Err(e) => {
                    failures += 1;
                    warn!(table = self.paths.table, replica = self.paths.replica, error = %e, "replication queue");
                    *self.last_queue_update_exception.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
                    let _ = tokio::time::timeout(backoff(failures), self.wake.notified()).await;
                }
            }
        }
    }

    /// Until the log changes, a SYSTEM statement wakes the queue, or a second passes
    /// (entries waiting for a retry).
    ///
    /// One watch on the log stays set until it fires, across these waits: a new watch every
    /// second, each dropped unfired, makes zookeeper-client 0.11 lose requests and watches
    /// on that path (a queue stalled for a minute on a log read while it fetched hundreds of
    /// parts, against ZooKeeper 3.8 too).
    async fn wait_for_log(&self) {
        let second = Duration::from_secs(1);
        let mut pending = self.log_watch.lock().await;
        if pending.is_none() {
            let Ok(k) = self.session.keeper().await else {
                let _ = tokio::time::timeout(second, self.wake.notified()).await;
                return;
            };
            let log = self.paths.of_table("log");
            match tokio::time::timeout(second * 5, k.raw().list_and_watch_children(&log)).await {
                Ok(Ok((_, watcher))) => {
                    *pending = Some(Box::pin(async move {
                        coordinator_client::watch::changed(watcher, &log).await;
                    }));
                }
                Ok(Err(_)) | Err(_) => {
                    let _ = tokio::time::timeout(second, self.wake.notified()).await;
                    return;
                }
            }
        }
        let Some(watch) = pending.as_mut() else { return };
        let fired = tokio::time::timeout(second, async {
            tokio::select! {
                _ = watch => true,
                _ = self.wake.notified() => false,
            }
        })
        .await;
        if fired == Ok(true) {
            *pending = None;
        }
    }

    async fn keeper(&self) -> Result<Keeper> {
        self.session.keeper().await.map_err(|e| EngineError::Coordinator(e.to_string()))
    }

    pub(crate) async fn lost(&self, e: KeeperError) -> EngineError {
        self.session.forget_if_lost(&e).await;
        EngineError::Coordinator(e.to_string())
    }

    /// Pulls new log entries, then runs the queue once; whether anything moved.
    async fn step(&self, table: &Arc<Table>) -> Result<bool> {
        let k = self.keeper().await?;
        self.activation.ensure(&k).await?;
        if self.queue_session.swap(k.session_id(), Ordering::SeqCst) != k.session_id() {
            // Quorum updates the previous session did not get to.
            let has_part = |name: &str| PartName::parse(name).is_some_and(|n| table.has_part_or_covering(&n));
            crate::quorum::update_for_parts_here(&k, &self.paths, has_part).await?;
        }
        let lost = match clone::lost_version(&k, &self.paths).await {
            Ok(lost) => lost,
            Err(e) => return Err(self.lost(e).await),
        };
        let mut still_lost = false;
        if let Some(version) = lost {
            // A clone sets the parts right itself.
            let _pulling = self.pull_lock.lock().await;
            if clone::clone_lost(&k, &self.paths, table, version).await? {
                self.parts_checked.store(true, Ordering::SeqCst);
            } else {
                still_lost = true;
            }
        } else if !self.parts_checked.load(Ordering::SeqCst) {
            let checked = part_check::check_parts(&k, &self.paths, table).await?;
            if checked != Checked::default() {
                info!(table = self.paths.table, ?checked, "local parts checked against the coordinator");
            }
            self.parts_checked.store(true, Ordering::SeqCst);
        }
        let pulled = !still_lost && self.pull_new_entries(&k).await?;
        self.last_queue_update.store(now_secs(), Ordering::SeqCst);
        self.last_queue_update_exception.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let executed = !self.execution_stopped.load(Ordering::SeqCst) && self.execute(&k, table).await?;
        let assigned = !pulled && !executed && self.assign_merge(&k, table).await?;
        if self.cleanup_due(table) && self.is_leader(&k).await? {
            let mut times = self.block_times.lock().await;
            match cleanup::clean(&k, &self.paths, &table.def().settings, &mut times).await {
                Ok(cleaned) if cleaned != Cleaned::default() => {
                    debug!(table = self.paths.table, ?cleaned, "cleaned old log entries and blocks");
                    metrics::counter!(crate::metrics::LOG_ENTRIES_CLEANED).increment(cleaned.log_entries as u64);
                    metrics::counter!(crate::metrics::BLOCKS_CLEANED).increment(cleaned.blocks as u64);
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(table = self.paths.table, error = %e, "cleanup of old log entries and blocks");
                    self.session.forget_if_lost(&e).await;
                }
            }
        }
        Ok(pulled || executed || assigned)
    }

    /// Whether the cleanup period has passed since the last cleanup (then the next is
    /// scheduled, with its random part).
    fn cleanup_due(&self, table: &Table) -> bool {
        let settings = &table.def().settings;
        let mut next = self.next_cleanup.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        // The first cleanup comes one period after the queue starts, the next a period later.
        let due = next.is_some_and(|at| at <= now);
        if next.is_some() && !due {
            return false;
        }
        // No random crate for this: the clock's nanoseconds spread the replicas well enough.
        let jitter = match settings.cleanup_delay_period_random_add {
            0 => 0,
            add => u64::from(chrono::Utc::now().timestamp_subsec_nanos()) % (add * 1000),
        };
        *next = Some(now + Duration::from_secs(settings.cleanup_delay_period) + Duration::from_millis(jitter));
        due
    }

    /// Copies the entries after the log pointer into this replica's queue (all but its own
    /// inserts' parts, which it has) and moves the pointer, in one multi.
    pub(crate) async fn pull_log(&self, k: &Keeper) -> Result<bool> {
        // A lost replica's pointer may point into entries cleaned away: it is cloned instead.
        match clone::lost_version(k, &self.paths).await {
            Ok(Some(_)) => Ok(false),
            Ok(None) => self.pull_new_entries(k).await,
            Err(e) => Err(self.lost(e).await),
        }
    }

    /// [`pull_log`](Self::pull_log) for a replica known not to be lost.
    async fn pull_new_entries(&self, k: &Keeper) -> Result<bool> {
        let _pulling = self.pull_lock.lock().await;
        let pointer_path = self.paths.of_replica("log_pointer");
        let (text, version) = match k.get(&pointer_path).await {
            Ok(Some(v)) => (String::from_utf8_lossy(&v.data).trim().to_string(), v.version),
            Ok(None) => return Err(EngineError::Coordinator(format!("{pointer_path} is missing"))),
            Err(e) => return Err(self.lost(e).await),
        };
        // Never pulled: a copy of a replica that has, when there is one.
        if text.is_empty() {
            match clone::clone_if_new(k, &self.paths, version).await {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => return Err(self.lost(e).await),
            }
        }
        let pointer = text.parse::<u64>().unwrap_or(0);
        let log = SequentialLog::new(&self.paths.of_table("log"), "log-");
        let entries = match log.read_from(k, pointer).await {
            Ok(entries) => entries,
            Err(e) => return Err(self.lost(e).await),
        };
        let Some(last) = entries.last().map(|e| e.sequence) else { return Ok(false) };
        let mut txn = k.txn();
        let queue_prefix = self.paths.of_replica("queue/queue-");
        for entry in &entries {
            let text = String::from_utf8_lossy(&entry.data);
            // This replica's own inserts are here already; its merges it runs like the others.
            if LogEntry::parse(&text).is_some_and(|e| e.kind == "GET_PART" && e.source_replica == self.paths.replica) {
                continue;
            }
            txn = txn.create(&queue_prefix, &entry.data, NodeKind::PersistentSequential);
        }
        txn = txn.set(&pointer_path, (last + 1).to_string().as_bytes(), Some(version));
        match txn.commit().await {
            Ok(_) => {
                debug!(replica = self.paths.replica, log_pointer = last + 1, "pulled log entries");
                Ok(true)
            }
            // Another pull of this replica (a restart overlapping the old session) moved it.
            Err(e) if e.is_bad_version() => Ok(false),
            Err(e) => Err(self.lost(e).await),
        }
    }

    /// Runs every queue entry that is due; whether one finished.
    async fn execute(&self, k: &Keeper, table: &Arc<Table>) -> Result<bool> {
        let queue_dir = self.paths.of_replica("queue");
        let mut names = match k.children(&queue_dir).await {
            Ok(names) => names,
            Err(e) => return Err(self.lost(e).await),
        };
        names.sort();
        metrics::gauge!(crate::metrics::QUEUE_ENTRIES, "table" => table.name().to_string()).set(names.len() as f64);
        self.lock().retain(|name, _| names.contains(name));
        let mut finished = false;
        for name in names {
            let due = self.lock().get(&name).is_none_or(|s| s.retry_at.is_none_or(|at| at <= Instant::now()));
            if !due {
                continue;
            }
            let path = format!("{queue_dir}/{name}");
            let text = match k.get(&path).await {
                Ok(Some(v)) => String::from_utf8_lossy(&v.data).into_owned(),
                Ok(None) => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let Some(entry) = LogEntry::parse(&text) else {
                warn!(entry = path, "a queue entry of a kind this node does not run: left in the queue");
                continue;
            };
            self.lock().entry(name.clone()).or_default();
            self.update(&name, |s| {
                s.is_currently_executing = true;
                s.last_attempt_time = now_secs();
            });
            let outcome = match entry.kind {
                "MERGE_PARTS" => self.merge_parts(k, table, &entry, &path).await,
                _ => self.get_part(k, table, &entry, &path).await,
            };
            match outcome {
                Ok(Ran::Done) => {
                    self.lock().remove(&name);
                    finished = true;
                }
                Ok(Ran::Postponed(reason)) => {
                    debug!(replica = self.paths.replica, part = entry.new_part_name, reason, "a queue entry postponed");
                    self.update(&name, |s| {
                        s.is_currently_executing = false;
                        s.num_postponed += 1;
                        s.postpone_reason = reason;
                        s.last_postpone_time = now_secs();
                    });
                }
                Err(e) => {
                    warn!(replica = self.paths.replica, part = entry.new_part_name, error = %e, "a queue entry failed");
                    self.update(&name, |s| {
                        s.is_currently_executing = false;
                        s.num_tries += 1;
                        s.last_exception = e.to_string();
                        s.last_exception_time = now_secs();
                        s.retry_at = Some(Instant::now() + backoff(s.num_tries));
                    });
                }
            }
        }
        Ok(finished)
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut Tries)) {
        if let Some(status) = self.lock().get_mut(name) {
            f(status);
        }
    }

    /// A `GET_PART`: the part active here (fetched, or a covering part fetched, unless one
    /// of them already is), then listed under this replica and the entry removed, in one multi.
    async fn get_part(&self, k: &Keeper, table: &Arc<Table>, entry: &LogEntry, queue_entry: &str) -> Result<Ran> {
        let name = PartName::parse(&entry.new_part_name)
            .ok_or_else(|| EngineError::Coordinator(format!("bad part name {}", entry.new_part_name)))?;
        let mut replaced_lost = false;
        if !table.has_part_or_covering(&name) {
            if let Some(reason) = self.fetches_postponed(&name) {
                return Ok(Ran::Postponed(reason));
            }
            match self.fetch_from_some_replica(k, table, entry, &name).await {
                Ok(_) => {}
                Err(EngineError::Replication { code: "NO_REPLICA_HAS_PART", message })
                    if self.failed_before(queue_entry) && self.lost_forever(k, &name).await? =>
                {
                    warn!(table = self.paths.table, part = %name, why = message, "Part is lost forever");
                    metrics::counter!(crate::metrics::PARTS_LOST).increment(1);
                    // Before the empty part is listed: others fetching it must not complete
                    // the quorum of rows that are gone. (This replica's own entry, queued by
                    // its part check, has no quorum line: the quorum node says.)
                    crate::quorum::fail_lost(k, &self.paths, &entry.new_part_name, &entry.block_id).await?;
                    let (t, lost) = (table.clone(), name.clone());
                    tokio::task::spawn_blocking(move || t.create_empty_part(&lost))
                        .await
                        .map_err(|e| EngineError::TaskFailed(e.to_string()))??;
                    replaced_lost = true;
                }
                Err(e) => return Err(e),
            }
        }
        self.list_and_remove(k, table, &name, queue_entry).await?;
        // An empty part does not count towards the quorum of the rows that were lost.
        if entry.quorum > 1 && !replaced_lost {
            crate::quorum::update(k, &self.paths, &entry.new_part_name).await?;
        }
        Ok(Ran::Done)
    }

    /// Whether this queue entry failed once already: a part is declared lost only on a
    /// second look, a back-off after the first.
    fn failed_before(&self, queue_entry: &str) -> bool {
        let name = node_name(queue_entry);
        self.lock().get(name).is_some_and(|tries| tries.num_tries > 0)
    }

    /// Whether no other replica, active or not, lists `name`, a part covering it, or a part
    /// inside its range (the sources of a merge, which their replica may still merge): then
    /// nobody can ever send it, and waiting would block the queue and every merge over its
    /// range for good. ClickHouse's part check calls such a part "lost forever".
    async fn lost_forever(&self, k: &Keeper, name: &PartName) -> Result<bool> {
        let replicas = match k.children(&self.paths.replicas()).await {
            Ok(replicas) => replicas,
            Err(e) => return Err(self.lost(e).await),
        };
        for replica in replicas.into_iter().filter(|r| *r != self.paths.replica) {
            let other = ReplicaPaths { table: self.paths.table.clone(), replica };
            let listed = match k.children(&other.of_replica("parts")).await {
                Ok(listed) => listed,
                Err(e) if e.is_no_node() => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let related = |p: &PartName| p == name || p.covers(name) || name.covers(p);
            if listed.iter().filter_map(|p| PartName::parse(p)).any(|p| related(&p)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn fetches_postponed(&self, part: &PartName) -> Option<String> {
        self.fetches_stopped
            .load(Ordering::SeqCst)
            .then(|| format!("Not executing fetch of part {part} because replicated fetches are cancelled now."))
    }

    /// Lists the active part that is `name` or covers it under this replica's `parts` (if it
    /// is not yet) and removes the queue entry, in one multi.
    async fn list_and_remove(&self, k: &Keeper, table: &Arc<Table>, name: &PartName, queue_entry: &str) -> Result<()> {
        let Some(part) = table.snapshot().into_iter().find(|p| p.name == *name || p.name.covers(name)) else {
            return Err(EngineError::Replication {
                code: "NO_REPLICA_HAS_PART",
                message: format!("part {name} is not active here after its fetch"),
            });
        };
        let listed = match k.children(&self.paths.of_replica("parts")).await {
            Ok(listed) => listed,
            Err(e) => return Err(self.lost(e).await),
        };
        let mut txn = k.txn();
        let part_name = part.name.to_string();
        if !listed.contains(&part_name) {
            let data = serde_json::json!({ "rows": part.rows(), "files": part.meta.files }).to_string().into_bytes();
            txn = txn.create(&self.paths.part(&part_name), &data, NodeKind::Persistent);
        }
        // Parts it covers are no longer here: they are not listed either.
        for covered in listed.iter().filter(|l| PartName::parse(l).is_some_and(|l| part.name.covers(&l))) {
            txn = txn.delete(&self.paths.part(covered), None);
        }
        match txn.delete(queue_entry, None).commit().await {
            Ok(_) => Ok(()),
            Err(e) if e.is_no_node() || e.is_node_exists() => self.remove_entry(k, queue_entry).await,
            Err(e) => Err(self.lost(e).await),
        }
    }

    /// A `MERGE_PARTS`: merged here when every source is, fetched from a replica that merged
    /// it otherwise; then the merged part is listed under this replica, its sources no longer
    /// are, and the entry is removed, in one multi.
    async fn merge_parts(&self, k: &Keeper, table: &Arc<Table>, entry: &LogEntry, queue_entry: &str) -> Result<Ran> {
        let result = PartName::parse(&entry.new_part_name)
            .ok_or_else(|| EngineError::Coordinator(format!("bad part name {}", entry.new_part_name)))?;
        let sources: Vec<PartName> = entry.parts_to_merge.iter().filter_map(|p| PartName::parse(p)).collect();
        if !table.has_part_or_covering(&result) {
            let all_here = sources.iter().all(|p| table.active_part(&p.to_string()).is_some());
            let fetch_rather = all_here && fetch_rather_than_merge(table, entry, &sources);
            if all_here && !fetch_rather {
                self.merge_here(table, &sources, &result, entry.cleanup).await?;
            } else if let Some(reason) = self.fetches_postponed(&result) {
                return Ok(Ran::Postponed(reason));
            } else if !all_here {
                if let Some(reason) = self.source_on_its_way(k, table, &sources, &result, queue_entry).await? {
                    // Merged here once the source arrives, as ClickHouse waits: not fetched.
                    return Ok(Ran::Postponed(reason));
                }
                self.fetch_from_some_replica(k, table, entry, &result).await?;
            } else if let Err(e) = self.fetch_from_some_replica(k, table, entry, &result).await {
                // No replica has merged it yet (or its fetch failed): merged here after all,
                // unless this replica never merges.
                if table.def().settings.always_fetch_merged_part {
                    return Err(e);
                }
                debug!(part = %result, error = %e, "no merged part to fetch: merging here");
                self.merge_here(table, &sources, &result, entry.cleanup).await?;
            }
        }
        let Some(part) = table.active_part(&entry.new_part_name) else {
            // Covered by a bigger part here: that one is what this replica lists.
            self.list_and_remove(k, table, &result, queue_entry).await?;
            return Ok(Ran::Done);
        };
        let data = serde_json::json!({ "rows": part.rows(), "files": part.meta.files }).to_string().into_bytes();
        let listed = match k.children(&self.paths.of_replica("parts")).await {
            Ok(listed) => listed,
            Err(e) => return Err(self.lost(e).await),
        };
        let mut txn = k.txn();
        if !listed.contains(&entry.new_part_name) {
            txn = txn.create(&self.paths.part(&entry.new_part_name), &data, NodeKind::Persistent);
        }
        for source in entry.parts_to_merge.iter().filter(|p| listed.contains(*p)) {
            txn = txn.delete(&self.paths.part(source), None);
        }
        match txn.delete(queue_entry, None).commit().await {
            Ok(_) => Ok(Ran::Done),
            Err(e) => Err(self.lost(e).await),
        }
    }

    async fn merge_here(
        &self,
        table: &Arc<Table>,
        sources: &[PartName],
        result: &PartName,
        cleanup: bool,
    ) -> Result<()> {
        let t = table.clone();
        let (merged_sources, merged) = (sources.to_vec(), result.clone());
        let options = AlgorithmOptions { cleanup, final_read: false };
        let started = Instant::now();
        tokio::task::spawn_blocking(move || t.merge_named(&merged_sources, &merged, options))
            .await
            .map_err(|e| EngineError::TaskFailed(e.to_string()))??;
        info!(part = %result, ms = started.elapsed().as_millis() as u64, "merged as the log says");
        Ok(())
    }

    /// Why a merge waits: a source it lacks is brought by an earlier entry of this queue
    /// (a `GET_PART` still running), which ClickHouse waits for rather than fetching the
    /// merged part. `None` when no earlier entry brings a missing source.
    async fn source_on_its_way(
        &self,
        k: &Keeper,
        table: &Table,
        sources: &[PartName],
        result: &PartName,
        queue_entry: &str,
    ) -> Result<Option<String>> {
        let missing: Vec<&PartName> = sources.iter().filter(|p| table.active_part(&p.to_string()).is_none()).collect();
        let queue_dir = self.paths.of_replica("queue");
        let this = node_name(queue_entry);
        let mut names = match k.children(&queue_dir).await {
            Ok(names) => names,
            Err(e) => return Err(self.lost(e).await),
        };
        names.retain(|n| n.as_str() < this);
        for name in names {
            let text = match k.get(&format!("{queue_dir}/{name}")).await {
                Ok(Some(v)) => String::from_utf8_lossy(&v.data).into_owned(),
                Ok(None) => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let Some(earlier) = LogEntry::parse(&text).and_then(|e| PartName::parse(&e.new_part_name)) else {
                continue;
            };
            if let Some(source) = missing.iter().find(|m| **m == &earlier) {
                return Ok(Some(format!(
                    "Not executing log entry {this} of type MERGE_PARTS for part {result} because part {source} is \
                     not ready yet (log entry for that part is being processed)."
                )));
            }
        }
        Ok(None)
    }

    async fn remove_entry(&self, k: &Keeper, queue_entry: &str) -> Result<()> {
        match k.delete(queue_entry, None).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_no_node() => Ok(()),
            Err(e) => Err(self.lost(e).await),
        }
    }

    /// The replica holding `leader_election/leader` assigns background merges: the parts its
    /// selector picks, when nothing queued or being inserted falls inside their range.
    /// Whether it wrote one.
    async fn assign_merge(&self, k: &Keeper, table: &Arc<Table>) -> Result<bool> {
        if !self.is_leader(k).await? {
            return Ok(false);
        }
        let Some(sources) = table.pick_merge() else { return Ok(false) };
        Ok(matches!(self.try_assign_merge(k, &sources, false).await?, Assigned::Written(_)))
    }

    /// Whether this replica holds the leader node (taking it if it is free).
    async fn is_leader(&self, k: &Keeper) -> Result<bool> {
        let path = self.paths.of_table("leader_election/leader");
        match k.create(&path, self.paths.replica.as_bytes(), NodeKind::Ephemeral).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_node_exists() => match k.get(&path).await {
                Ok(Some(v)) => Ok(v.data == self.paths.replica.as_bytes()),
                Ok(None) => Ok(false),
                Err(e) => Err(self.lost(e).await),
            },
            Err(e) => Err(self.lost(e).await),
        }
    }

    /// Tries each replica that lists the part (the entry's source first, active ones before
    /// the others); the part node's bytes of the one it came from.
    async fn fetch_from_some_replica(
        &self,
        k: &Keeper,
        table: &Arc<Table>,
        entry: &LogEntry,
        name: &PartName,
    ) -> Result<Vec<u8>> {
        let replicas = match k.children(&self.paths.replicas()).await {
            Ok(replicas) => replicas,
            Err(e) => return Err(self.lost(e).await),
        };
        let mut candidates = Vec::new();
        for replica in replicas.into_iter().filter(|r| *r != self.paths.replica) {
            let other = ReplicaPaths { table: self.paths.table.clone(), replica: replica.clone() };
            // The part itself, or else a part covering it (its sources were merged there).
            let listed = match k.children(&other.of_replica("parts")).await {
                Ok(listed) => listed,
                Err(e) if e.is_no_node() => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let Some(found) = listed.iter().filter_map(|p| PartName::parse(p)).find(|p| p == name || p.covers(name))
            else {
                continue;
            };
            let header = match k.get(&other.part(&found.to_string())).await {
                Ok(Some(v)) => v.data,
                Ok(None) => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let active = matches!(k.get(&other.of_replica("is_active")).await, Ok(Some(_)));
            let host = match k.get(&other.of_replica("host")).await {
                Ok(Some(v)) => String::from_utf8_lossy(&v.data).into_owned(),
                _ => continue,
            };
            let rank = (found != *name, replica != entry.source_replica, !active);
            candidates.push((rank, replica, header, host, found));
        }
        candidates.sort_by_key(|c| c.0);
        let mut errors = Vec::new();
        for (_, replica, header_bytes, host, found) in candidates {
            let Some(address) = ReplicaAddress::parse(&host) else {
                errors.push(format!("{replica}: its host node names no address"));
                continue;
            };
            let header: PartHeader = match serde_json::from_slice(&header_bytes) {
                Ok(header) => header,
                Err(e) => {
                    errors.push(format!("{replica}: its part node cannot be read: {e}"));
                    continue;
                }
            };
            let started = Instant::now();
            match fetch_part(table, &address, &found, &header).await {
                Ok(bytes) => {
                    info!(part = %found, wanted = %name, from = replica, bytes, ms = started.elapsed().as_millis() as u64, "fetched a part");
                    return Ok(header_bytes);
                }
                Err(e) => errors.push(format!("{replica}: {e}")),
            }
        }
        if errors.is_empty() {
            return Err(EngineError::Replication {
                code: "NO_REPLICA_HAS_PART",
                message: format!("No active replica has part {name} or covering part (yet)"),
            });
        }
        Err(EngineError::Replication { code: "FETCH_ERROR", message: errors.join("; ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_part_entry_reads_back() {
        let text = "format version: 4\ncreate_time: 2026-12-06 04:00:00\nsource replica: r1\nblock_id: all_1\nget\nall_0_0_0\n";
        let entry = LogEntry::parse(text).expect("entry");
        assert_eq!(
            entry,
            LogEntry {
                kind: "GET_PART",
                source_replica: "r1".into(),
                new_part_name: "all_0_0_0".into(),
                parts_to_merge: vec![],
                create_time: 1_796_529_600,
                quorum: 0,
                cleanup: false,
                block_id: "all_1".into(),
            }
        );
        let with_quorum = format!("{text}quorum: 2\n");
        assert_eq!(LogEntry::parse(&with_quorum).map(|e| e.quorum), Some(2));
        assert_eq!(LogEntry::parse("format version: 4\nsource replica: r1\nmerge\nall_0_1_1\n"), None);
        assert_eq!(LogEntry::parse("format version: 4\nsource replica: r1\nattach\nall_0_1_1\n"), None);
    }

    #[test]
    fn retries_back_off_to_ten_seconds() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(30), Duration::from_secs(10));
    }
}
