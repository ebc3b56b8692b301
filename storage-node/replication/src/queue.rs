//! A replica's replication queue: log entries copied into `replicas/<name>/queue`, the log
//! pointer moved in the same `multi`, and each entry executed until done. A `GET_PART` entry
//! is done when the part (or one covering it) is active here and listed under the replica's
//! `parts`; a part this replica lacks is fetched from a replica that has it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use coordinator_client::{Keeper, KeeperError, NodeKind, SequentialLog};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result, Table};
use tracing::{debug, info, warn};

use crate::fetch::{fetch_part, PartHeader, ReplicaAddress};
use crate::layout::ReplicaPaths;
use crate::session::CoordinatorSession;

/// A log entry as the queue needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub kind: &'static str,
    pub source_replica: String,
    pub new_part_name: String,
}

impl LogEntry {
    /// Reads ClickHouse's text of a log entry; `None` for a kind this node does not run yet.
    pub fn parse(text: &str) -> Option<LogEntry> {
        let source_replica = text.lines().find_map(|l| l.strip_prefix("source replica: "))?.to_string();
        let mut lines = text.lines().skip_while(|l| *l != "get");
        lines.next()?;
        let new_part_name = lines.next()?.to_string();
        PartName::parse(&new_part_name)?;
        Some(LogEntry { kind: "GET_PART", source_replica, new_part_name })
    }
}

/// One queue entry's state, for `system.replication_queue`.
#[derive(Debug, Clone, Default)]
pub struct EntryStatus {
    pub node_name: String,
    pub kind: String,
    pub new_part_name: String,
    pub source_replica: String,
    pub num_tries: u32,
    pub last_exception: String,
    pub is_currently_executing: bool,
    retry_at: Option<Instant>,
}

pub struct ReplicationQueue {
    paths: ReplicaPaths,
    session: Arc<CoordinatorSession>,
    entries: Mutex<BTreeMap<String, EntryStatus>>,
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
        session: Arc<CoordinatorSession>,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<ReplicationQueue> {
        let queue = Arc::new(ReplicationQueue { paths, session, entries: Mutex::new(BTreeMap::new()) });
        runtime.spawn(queue.clone().run(Arc::downgrade(table)));
        queue
    }

    /// The entries waiting now, oldest first.
    pub fn entries(&self) -> Vec<EntryStatus> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, EntryStatus>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(self: Arc<Self>, table: Weak<Table>) {
        let mut failures = 0u32;
        loop {
            let Some(t) = table.upgrade() else { return };
            let step = self.step(&t).await;
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
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    }

    /// Until the log changes, or a second passes (entries waiting for a retry).
    async fn wait_for_log(&self) {
        let Ok(k) = self.session.keeper().await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        };
        match k.raw().list_and_watch_children(&self.paths.of_table("log")).await {
            Ok((_, watcher)) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), watcher.changed()).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }

    async fn keeper(&self) -> Result<Keeper> {
        self.session.keeper().await.map_err(|e| EngineError::Coordinator(e.to_string()))
    }

    async fn lost(&self, e: KeeperError) -> EngineError {
        self.session.forget_if_lost(&e).await;
        EngineError::Coordinator(e.to_string())
    }

    /// Pulls new log entries, then runs the queue once; whether anything moved.
    async fn step(&self, table: &Arc<Table>) -> Result<bool> {
        let k = self.keeper().await?;
        let pulled = self.pull_log(&k).await?;
        let executed = self.execute(&k, table).await?;
        Ok(pulled || executed)
    }

    /// Copies the entries after the log pointer into this replica's queue (all but its own
    /// inserts' parts, which it has) and moves the pointer, in one multi.
    async fn pull_log(&self, k: &Keeper) -> Result<bool> {
        let pointer_path = self.paths.of_replica("log_pointer");
        let (pointer, version) = match k.get(&pointer_path).await {
            Ok(Some(v)) => (String::from_utf8_lossy(&v.data).trim().parse::<u64>().unwrap_or(0), v.version),
            Ok(None) => return Err(EngineError::Coordinator(format!("{pointer_path} is missing"))),
            Err(e) => return Err(self.lost(e).await),
        };
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
            if LogEntry::parse(&text).is_some_and(|e| e.source_replica == self.paths.replica) {
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
            self.lock().entry(name.clone()).or_insert_with(|| EntryStatus {
                node_name: name.clone(),
                kind: entry.kind.to_string(),
                new_part_name: entry.new_part_name.clone(),
                source_replica: entry.source_replica.clone(),
                ..Default::default()
            });
            self.update(&name, |s| s.is_currently_executing = true);
            let outcome = self.get_part(k, table, &entry, &path).await;
            match outcome {
                Ok(()) => {
                    self.lock().remove(&name);
                    finished = true;
                }
                Err(e) => {
                    warn!(replica = self.paths.replica, part = entry.new_part_name, error = %e, "a queue entry failed");
                    self.update(&name, |s| {
                        s.is_currently_executing = false;
                        s.num_tries += 1;
                        s.last_exception = e.to_string();
                        s.retry_at = Some(Instant::now() + backoff(s.num_tries));
                    });
                }
            }
        }
        Ok(finished)
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut EntryStatus)) {
        if let Some(status) = self.lock().get_mut(name) {
            f(status);
        }
    }

    /// A `GET_PART`: the part active here (fetched unless it already is), then listed under
    /// this replica and the entry removed, in one multi.
    async fn get_part(&self, k: &Keeper, table: &Arc<Table>, entry: &LogEntry, queue_entry: &str) -> Result<()> {
        let name = PartName::parse(&entry.new_part_name)
            .ok_or_else(|| EngineError::Coordinator(format!("bad part name {}", entry.new_part_name)))?;
        let header = if table.has_part_or_covering(&name) {
            // Covered by a part here, or this replica's own: what it has is enough.
            None
        } else {
            Some(self.fetch_from_some_replica(k, table, entry, &name).await?)
        };
        let own = self.paths.part(&entry.new_part_name);
        let data = match header {
            Some(data) => data,
            None => match table.active_part(&entry.new_part_name) {
                Some(part) => {
                    serde_json::json!({ "rows": part.rows(), "files": part.meta.files }).to_string().into_bytes()
                }
                None => {
                    // Covered by a merged part: nothing of its own to list.
                    return match k.delete(queue_entry, None).await {
                        Ok(()) => Ok(()),
                        Err(e) if e.is_no_node() => Ok(()),
                        Err(e) => Err(self.lost(e).await),
                    };
                }
            },
        };
        let done = k.txn().create(&own, &data, NodeKind::Persistent).delete(queue_entry, None).commit().await;
        match done {
            Ok(_) => Ok(()),
            Err(e) if e.is_node_exists() => match k.delete(queue_entry, None).await {
                Ok(()) => Ok(()),
                Err(e) if e.is_no_node() => Ok(()),
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
            let header = match k.get(&other.part(&entry.new_part_name)).await {
                Ok(Some(v)) => v.data,
                Ok(None) => continue,
                Err(e) => return Err(self.lost(e).await),
            };
            let active = matches!(k.get(&other.of_replica("is_active")).await, Ok(Some(_)));
            let host = match k.get(&other.of_replica("host")).await {
                Ok(Some(v)) => String::from_utf8_lossy(&v.data).into_owned(),
                _ => continue,
            };
            let rank = (replica != entry.source_replica, !active);
            candidates.push((rank, replica, header, host));
        }
        candidates.sort_by_key(|c| c.0);
        let mut errors = Vec::new();
        for (_, replica, header_bytes, host) in candidates {
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
            match fetch_part(table, &address, name, &header).await {
                Ok(bytes) => {
                    info!(part = %name, from = replica, bytes, ms = started.elapsed().as_millis() as u64, "fetched a part");
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
            LogEntry { kind: "GET_PART", source_replica: "r1".into(), new_part_name: "all_0_0_0".into() }
        );
        assert_eq!(LogEntry::parse("format version: 4\nsource replica: r1\nmerge\nall_0_1_1\n"), None);
    }

    #[test]
    fn retries_back_off_to_ten_seconds() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(30), Duration::from_secs(10));
    }
}
