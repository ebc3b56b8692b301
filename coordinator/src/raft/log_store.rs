//! The Raft log on disk: one append-only file of checksummed records (entries, truncations,
//! purges) replayed at startup, and the vote in a file of its own. All entries since the last
//! purge are also kept in memory; snapshots keep that bounded.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader, Vote};
use serde::{Deserialize, Serialize};

use super::{storage_error, write_atomically, Entry, LogId, NodeId, StorageError, TypeConfig};

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry),
    /// Entries from this index on were removed (a new leader overwrote them).
    TruncateFrom(u64),
    /// Entries up to and including this id were compacted into a snapshot.
    PurgeUpTo(LogId),
}

struct Inner {
    dir: PathBuf,
    file: BufWriter<File>,
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote<NodeId>>,
    /// Records in the file that are no longer live; the file is rewritten when they dominate.
    dead_records: usize,
}

/// Cheap to clone: the reader openraft asks for shares the same log.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// Appends waiting to be reported durable, in order (see [`group_commit`]).
    flushes: std::sync::mpsc::Sender<LogFlushed<TypeConfig>>,
}

const LOG_FILE: &str = "raft-log";
const VOTE_FILE: &str = "raft-vote";

impl LogStore {
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log_path = dir.join(LOG_FILE);
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        let mut dead_records = 0;
        let mut valid_len = 0u64;
        if log_path.exists() {
            let mut bytes = Vec::new();
            File::open(&log_path)?.read_to_end(&mut bytes)?;
            let mut pos = 0usize;
            while let Some((record, next)) = read_record(&bytes, pos) {
                match record {
                    Record::Entry(e) => {
                        entries.insert(e.log_id.index, e);
                    }
                    Record::TruncateFrom(i) => {
                        dead_records += entries.split_off(&i).len() + 1;
                    }
                    Record::PurgeUpTo(id) => {
                        let keep = entries.split_off(&(id.index + 1));
                        dead_records += entries.len() + 1;
                        entries = keep;
                        last_purged = Some(id);
                    }
                }
                pos = next;
            }
            valid_len = pos as u64;
            if pos < bytes.len() {
                // A write the crash interrupted: it was never acknowledged, so it goes.
                tracing::warn!(path = %log_path.display(), kept = pos, dropped = bytes.len() - pos, "raft log has a torn tail; truncating it");
            }
        }
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&log_path)?;
        file.set_len(valid_len)?;
        let mut file = BufWriter::new(file);
        io::Seek::seek(&mut file, io::SeekFrom::End(0))?;
        let vote_path = dir.join(VOTE_FILE);
        let vote = if vote_path.exists() {
            let bytes = std::fs::read(&vote_path)?;
            Some(bincode::deserialize(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?)
        } else {
            None
        };
        tracing::info!(entries = entries.len(), ?last_purged, "raft log opened");
        let inner =
            Arc::new(Mutex::new(Inner { dir: dir.to_path_buf(), file, entries, last_purged, vote, dead_records }));
        let (flushes, pending) = std::sync::mpsc::channel();
        let flushed = inner.clone();
        std::thread::Builder::new().name("raft-log-sync".into()).spawn(move || group_commit(&flushed, &pending))?;
        Ok(Self { inner, flushes })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// Reports appends durable off the Raft task: each round takes every append queued so far,
/// syncs the file once, and completes them in order, so Raft keeps handling messages while
/// the disk syncs. openraft 0.9 waits for one append to be reported before it issues the next,
/// so a round holds one append in practice (`mergestream_coordinator_raft_appends_per_sync`); the grouping
/// that counts happens earlier, many client writes per entry (`Coordinator::commit_batches`).
fn group_commit(inner: &Mutex<Inner>, pending: &std::sync::mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = pending.recv() {
        let mut batch = vec![first];
        batch.extend(pending.try_iter());
        let synced = (|| {
            let file = {
                let mut inner = match inner.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                inner.file.flush()?;
                inner.file.get_ref().try_clone()?
            };
            // Outside the lock: appends continue while the disk syncs.
            file.sync_data()
        })();
        if let Err(e) = &synced {
            tracing::error!(error = %e, "syncing the raft log failed");
        }
        metrics::histogram!(crate::metrics::APPENDS_PER_SYNC).record(batch.len() as f64);
        for callback in batch {
            callback.log_io_completed(synced.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string())));
        }
    }
}

/// Record framing: length (u32), CRC32 of the payload (u32), bincode payload.
fn read_record(bytes: &[u8], pos: usize) -> Option<(Record, usize)> {
    let header = bytes.get(pos..pos + 8)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let payload = bytes.get(pos + 8..pos + 8 + len)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let record = bincode::deserialize(payload).ok()?;
    Some((record, pos + 8 + len))
}

fn write_record(out: &mut impl Write, record: &Record) -> io::Result<()> {
    let payload = bincode::serialize(record).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    out.write_all(&(payload.len() as u32).to_le_bytes())?;
    out.write_all(&crc32fast::hash(&payload).to_le_bytes())?;
    out.write_all(&payload)
}

impl Inner {
    fn append_durably(&mut self, records: &[Record]) -> io::Result<()> {
        for r in records {
            write_record(&mut self.file, r)?;
        }
        self.file.flush()?;
        tokio::task::block_in_place(|| self.file.get_ref().sync_data())
    }

    /// Rewrites the log with only the live records once most of the file is dead.
    fn compact_file(&mut self) -> io::Result<()> {
        if self.dead_records < 1024 || self.dead_records < self.entries.len() {
            return Ok(());
        }
        let path = self.dir.join(LOG_FILE);
        let tmp = self.dir.join("raft-log.compacting");
        let mut out = BufWriter::new(File::create(&tmp)?);
        if let Some(id) = self.last_purged {
            write_record(&mut out, &Record::PurgeUpTo(id))?;
        }
        for e in self.entries.values() {
            write_record(&mut out, &Record::Entry(e.clone()))?;
        }
        out.flush()?;
        out.get_ref().sync_all()?;
        drop(out);
        std::fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()?;
        let mut file = BufWriter::new(OpenOptions::new().append(true).open(&path)?);
        io::Seek::seek(&mut file, io::SeekFrom::End(0))?;
        self.file = file;
        self.dead_records = 0;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self.lock().entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.lock();
        let last = inner.entries.values().next_back().map(|e| e.log_id).or(inner.last_purged);
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let mut inner = self.lock();
        let bytes = bincode::serialize(vote).map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        let path = inner.dir.join(VOTE_FILE);
        tokio::task::block_in_place(|| write_atomically(&path, &bytes))
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.lock().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let records: Vec<Record> = entries.into_iter().map(Record::Entry).collect();
        // Written now, reported durable by the group-commit thread once it has synced them.
        let written = records.iter().try_for_each(|r| write_record(&mut inner.file, r));
        if let Err(e) = written {
            callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, e));
        }
        for r in records {
            if let Record::Entry(e) = r {
                inner.entries.insert(e.log_id.index, e);
            }
        }
        drop(inner);
        if let Err(unsent) = self.flushes.send(callback) {
            let e = io::Error::other("the raft log sync thread is gone");
            unsent.0.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, e));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.lock();
        inner
            .append_durably(&[Record::TruncateFrom(log_id.index)])
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        let removed = inner.entries.split_off(&log_id.index).len();
        inner.dead_records += removed + 1;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.lock();
        inner
            .append_durably(&[Record::PurgeUpTo(log_id)])
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        let keep = inner.entries.split_off(&(log_id.index + 1));
        inner.dead_records += inner.entries.len() + 1;
        inner.entries = keep;
        inner.last_purged = Some(log_id);
        inner.compact_file().map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }
}
