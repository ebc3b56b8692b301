//! The background merge pool: a fixed number of threads that merge the tables' parts.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::catalog::Tables;
use crate::table::Table;

/// How long after an insert (or START MERGES) a background merge is looked for. ClickHouse's
/// scheduler also picks up new parts after a short while rather than at once, which gives a
/// statement right after an insert (such as OPTIMIZE) the parts as inserted.
pub(crate) const MERGE_ASSIGN_DELAY: Duration = Duration::from_millis(500);

/// The nice value of merge threads. A background merge only rewrites parts already
/// committed, so it gives way to inserts and queries when the CPU is short, as ClickHouse's
/// background pool does with its lower thread priority; inserts slow down through
/// parts_to_delay_insert if merges fall too far behind.
const MERGE_THREAD_NICE: i32 = 10;

/// How often the merge threads look at every table again, without an insert asking them to:
/// the selector's base falls as parts age, so a merge not due at the last insert may be now.
pub(crate) const MERGE_RESCAN: Duration = Duration::from_secs(15);

/// A fixed number of threads running background merges, shared fairly by the tables: each
/// turn is one merge of one table, and a table that merged goes back behind the tables
/// already waiting. Every table is also looked at again every `rescan`, whatever the inserts
/// into other tables: a merge not due at the last insert may be due as its parts age.
pub(crate) struct MergePool {
    shared: Option<Arc<Shared>>,
}

struct Shared {
    queue: Mutex<MergeQueue>,
    wake: Condvar,
    tables: Tables,
    delay: Duration,
    rescan: Duration,
}

/// The tables waiting for a merge turn, by when the turn is due (ties in arrival order).
#[derive(Default)]
struct MergeQueue {
    due: BTreeMap<(Instant, u64), Arc<Table>>,
    /// Each waiting table's key in `due`: a table waits once, at its earliest due time.
    waiting: HashMap<String, (Instant, u64)>,
    arrivals: u64,
    next_rescan: Option<Instant>,
    shutdown: bool,
}

impl MergeQueue {
    fn push(&mut self, table: Arc<Table>, at: Instant) {
        if let Some(&key) = self.waiting.get(table.name()) {
            if key.0 <= at {
                // Already waiting, as early; a table recreated under the name is the one kept.
                self.due.insert(key, table);
                return;
            }
            self.due.remove(&key);
        }
        self.arrivals += 1;
        let key = (at, self.arrivals);
        self.waiting.insert(table.name().to_string(), key);
        self.due.insert(key, table);
    }

    /// The next table whose turn is due, or how long until one may be.
    fn pop(&mut self, now: Instant) -> Result<Arc<Table>, Duration> {
        match self.due.first_key_value() {
            Some((&key, _)) if key.0 <= now => {
                let (_, table) = self.due.pop_first().expect("a first entry");
                self.waiting.remove(table.name());
                Ok(table)
            }
            Some((&(at, _), _)) => Err(at - now),
            None => Err(Duration::MAX),
        }
    }
}

impl MergePool {
    pub(crate) fn start(threads: usize, delay: Duration, rescan: Duration, tables: Tables) -> MergePool {
        if threads == 0 {
            return MergePool { shared: None };
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(MergeQueue { next_rescan: Some(Instant::now() + rescan), ..Default::default() }),
            wake: Condvar::new(),
            tables,
            delay,
            rescan,
        });
        for i in 0..threads {
            let shared = shared.clone();
            let spawned = std::thread::Builder::new().name(format!("merge-{i}")).spawn(move || merge_worker(&shared));
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a merge thread");
            }
        }
        MergePool { shared: Some(shared) }
    }

    /// Gives the table a merge turn after the assign delay (see [`MERGE_ASSIGN_DELAY`]).
    pub(crate) fn schedule(&self, table: Arc<Table>) {
        if let Some(shared) = &self.shared {
            shared.lock().push(table, Instant::now() + shared.delay);
            shared.wake.notify_one();
        }
    }
}

impl Drop for MergePool {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.lock().shutdown = true;
            shared.wake.notify_all();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, MergeQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the next due table; `None` once the pool is dropped.
    fn next_table(&self) -> Option<Arc<Table>> {
        let mut queue = self.lock();
        loop {
            if queue.shutdown {
                return None;
            }
            let now = Instant::now();
            if queue.next_rescan.is_some_and(|at| at <= now) {
                queue.next_rescan = Some(now + self.rescan);
                let tables: Vec<Arc<Table>> =
                    self.tables.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
                for table in tables {
                    queue.push(table, now);
                }
            }
            let wait = match queue.pop(now) {
                Ok(table) => return Some(table),
                Err(wait) => wait.min(queue.next_rescan.map_or(Duration::MAX, |at| at - now)),
            };
            queue = self.wake.wait_timeout(queue, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

fn merge_worker(shared: &Shared) {
    // On Linux the nice value is per thread: `None` is this thread alone.
    if let Err(e) = rustix::process::setpriority_process(None, MERGE_THREAD_NICE) {
        warn!(error = %e, "cannot lower the merge thread's priority");
    }
    while let Some(table) = shared.next_table() {
        match table.merge_once(None) {
            // Another merge may be due: the table's next turn comes after the waiting ones.
            Ok(true) => {
                shared.lock().push(table, Instant::now());
                shared.wake.notify_one();
            }
            Ok(false) => {}
            Err(e) => warn!(table = table.name(), error = %e, "background merge failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::RwLock;

    use arrow::array::{ArrayRef, RecordBatch, UInt64Array};

    use super::*;
    use crate::commit::LocalCommitters;
    use crate::schema::{EngineKind, TableDef};
    use crate::settings::TableSettings;
    use crate::table::InsertOptions;
    use crate::types::ChType;

    fn table(dir: &std::path::Path, name: &str, settings: TableSettings) -> Arc<Table> {
        let def = TableDef { settings, ..TableDef::for_tests(name, EngineKind::MergeTree, &[("k", ChType::UInt64)]) };
        Arc::new(Table::create(&dir.join(name), def, &LocalCommitters { coordination: None }).expect("create"))
    }

    fn insert(table: &Table, keys: std::ops::Range<u64>) {
        let k: ArrayRef = Arc::new(UInt64Array::from_iter_values(keys));
        let block = RecordBatch::try_new(table.schema(), vec![k]).expect("block");
        table.insert(block, &InsertOptions::default()).expect("insert");
    }

    fn active_parts(table: &Table) -> usize {
        table.parts_info().iter().filter(|p| p.active).count()
    }

    #[test]
    fn a_table_that_merged_waits_behind_the_others_and_waits_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) =
            (table(dir.path(), "a", TableSettings::default()), table(dir.path(), "b", TableSettings::default()));
        let t0 = Instant::now();
        let mut queue = MergeQueue::default();
        queue.push(a.clone(), t0);
        queue.push(b.clone(), t0 + Duration::from_millis(1));
        queue.push(a.clone(), t0 + Duration::from_millis(5));
        let later = t0 + Duration::from_millis(10);
        assert_eq!(queue.pop(later).expect("due").name(), "a");
        queue.push(a.clone(), later);
        assert_eq!(queue.pop(later).expect("due").name(), "b", "b waited before a's second turn");
        assert_eq!(queue.pop(later).expect("due").name(), "a");
        assert_eq!(queue.pop(later).err(), Some(Duration::MAX), "a waited once");
        queue.push(b, later + Duration::from_millis(3));
        assert_eq!(queue.pop(later).err(), Some(Duration::from_millis(3)));
    }

    /// One merge thread, a table under inserts as fast as they go, and a second table given
    /// two parts meanwhile, which are not due for a merge when they are inserted but become
    /// due a second later (min_age_to_force_merge_seconds): they are merged while the first
    /// table's inserts keep coming, not only once those stop.
    #[test]
    fn a_table_under_steady_inserts_does_not_keep_the_pool_from_another_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let busy = table(dir.path(), "busy", TableSettings::default());
        let quiet =
            table(dir.path(), "quiet", TableSettings { min_age_to_force_merge_seconds: 1, ..TableSettings::default() });
        let tables: Tables = Arc::new(RwLock::new(BTreeMap::from([
            ("busy".to_string(), busy.clone()),
            ("quiet".to_string(), quiet.clone()),
        ])));
        let pool = Arc::new(MergePool::start(1, Duration::from_millis(5), Duration::from_secs(2), tables));
        let stop = Arc::new(AtomicBool::new(false));
        let inserter = {
            let (busy, pool, stop) = (busy.clone(), pool.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    insert(&busy, n..n + 10);
                    pool.schedule(busy.clone());
                    n += 10;
                }
                n / 10
            })
        };
        // The busy table's merges are running before the quiet one gets its parts.
        while busy.parts_info().iter().all(|p| p.level == 0) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for i in 0..2 {
            insert(&quiet, i * 100..i * 100 + 100);
            pool.schedule(quiet.clone());
        }
        // Liveness, not speed: the bound is far above what the merge takes.
        let deadline = Instant::now() + Duration::from_secs(30);
        while active_parts(&quiet) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let merged_meanwhile = active_parts(&quiet) == 1;
        stop.store(true, Ordering::Relaxed);
        let inserts = inserter.join().expect("inserter");
        assert!(
            merged_meanwhile,
            "the quiet table kept {} parts through {inserts} inserts into the busy one",
            active_parts(&quiet)
        );
        assert!(busy.parts_info().iter().any(|p| p.active && p.level > 0), "the busy table was merged too");
    }
}
