//! Committing insert parts: block numbers and insert deduplication.
//!
//! Every new part goes through a [`BlockCommitter`]: it allocates the part's block number and
//! decides whether the insert is a duplicate, then records the committed part. The local
//! implementation keeps both in the table directory; replication backs the same interface with
//! the coordinator (`/blocks/<id>`, block numbers, the log entry) in one multi-op.

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{EngineError, Result};
use crate::part::name::PartName;

/// The outcome of asking for a block number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockAllocation {
    Block(u64),
    /// An insert with the same deduplication id is already committed.
    Duplicate,
}

pub trait BlockCommitter: Send + Sync {
    /// Allocates a block number for a new part, unless `dedup_id` was already committed.
    /// The caller holds the table's commit lock until [`committed`](Self::committed) or
    /// [`abandoned`](Self::abandoned).
    fn allocate(&self, dedup_id: Option<&str>) -> Result<BlockAllocation>;
    /// The part holding `block` is in place.
    fn committed(&self, block: u64, dedup_id: Option<&str>, part: &PartName) -> Result<()>;
    /// The part for `block` could not be written; its number stays unused.
    fn abandoned(&self, block: u64);
}

const DEDUP_LOG: &str = "deduplication_log.txt";
const INCREMENT_FILE: &str = "increment.txt";

/// Block numbers and the `non_replicated_deduplication_window` of a non-replicated table.
pub struct LocalCommitter {
    dir: PathBuf,
    window: usize,
    state: Mutex<LocalState>,
}

struct LocalState {
    next_block: u64,
    recent: VecDeque<String>,
    seen: HashSet<String>,
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
    /// `max_block` is the highest block number of any part found on disk; `part_dedup_ids` are
    /// the ids recorded in the parts themselves, oldest first, which cover a crash between a
    /// part's rename and the log's append.
    pub fn open(dir: &Path, window: u64, max_block: u64, part_dedup_ids: Vec<String>) -> Result<LocalCommitter> {
        let increment_path = dir.join(INCREMENT_FILE);
        let persisted = match std::fs::read_to_string(&increment_path) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(EngineError::Io { path: increment_path, source: e }),
        };
        let mut state =
            LocalState { next_block: persisted.max(max_block) + 1, recent: VecDeque::new(), seen: HashSet::new() };
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
        for id in part_dedup_ids {
            state.remember(id, window);
        }
        Ok(LocalCommitter { dir: dir.to_path_buf(), window, state: Mutex::new(state) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl BlockCommitter for LocalCommitter {
    fn allocate(&self, dedup_id: Option<&str>) -> Result<BlockAllocation> {
        let mut state = self.lock();
        // As in ClickHouse, a duplicate insert still uses up its block number.
        let block = state.next_block;
        state.next_block += 1;
        let path = self.dir.join(INCREMENT_FILE);
        std::fs::write(&path, block.to_string()).map_err(EngineError::io(&path))?;
        if let Some(id) = dedup_id {
            if self.window > 0 && state.seen.contains(id) {
                return Ok(BlockAllocation::Duplicate);
            }
        }
        Ok(BlockAllocation::Block(block))
    }

    fn committed(&self, _block: u64, dedup_id: Option<&str>, _part: &PartName) -> Result<()> {
        let Some(id) = dedup_id.filter(|_| self.window > 0) else {
            return Ok(());
        };
        let mut state = self.lock();
        state.remember(id.to_string(), self.window);
        let path = self.dir.join(DEDUP_LOG);
        // The log is rewritten from the window when it grows well past it, so it stays small.
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(EngineError::io(&path))?;
        writeln!(file, "{}", encode_log_line(id)).map_err(EngineError::io(&path))?;
        file.sync_data().map_err(EngineError::io(&path))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        if size > (self.window as u64 + 16) * 256 {
            let text: String = state.recent.iter().map(|id| format!("{}\n", encode_log_line(id))).collect();
            let tmp = self.dir.join(format!("{DEDUP_LOG}.tmp"));
            crate::part::write_synced(&tmp, text.as_bytes())?;
            std::fs::rename(&tmp, &path).map_err(EngineError::io(&path))?;
        }
        Ok(())
    }

    fn abandoned(&self, _block: u64) {}
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

    #[test]
    fn duplicates_within_the_window_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = PartName::parse("all_1_1_0").expect("name");
        let committer = LocalCommitter::open(dir.path(), 2, 0, vec![]).expect("open");
        assert_eq!(committer.allocate(Some("a")).expect("a"), BlockAllocation::Block(1));
        committer.committed(1, Some("a"), &name).expect("commit a");
        assert_eq!(committer.allocate(Some("a")).expect("a again"), BlockAllocation::Duplicate);
        drop(committer);

        let reopened = LocalCommitter::open(dir.path(), 2, 1, vec!["b".into()]).expect("reopen");
        assert_eq!(reopened.allocate(Some("a")).expect("a"), BlockAllocation::Duplicate);
        assert_eq!(reopened.allocate(Some("b")).expect("b"), BlockAllocation::Duplicate);
        assert_eq!(reopened.allocate(Some("c")).expect("c"), BlockAllocation::Block(5));
    }

    #[test]
    fn any_id_round_trips_through_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = PartName::parse("all_1_1_0").expect("name");
        let committer = LocalCommitter::open(dir.path(), 10, 0, vec![]).expect("open");
        for (block, id) in (1..).zip(["a\nb", "\"q\"", "\\", "\r", ""]) {
            assert_eq!(committer.allocate(Some(id)).expect("allocate"), BlockAllocation::Block(block));
            committer.committed(block, Some(id), &name).expect("commit");
        }
        drop(committer);
        let reopened = LocalCommitter::open(dir.path(), 10, 5, vec![]).expect("reopen");
        for id in ["a\nb", "\"q\"", "\\", "\r", ""] {
            assert_eq!(reopened.allocate(Some(id)).expect("dup"), BlockAllocation::Duplicate, "{id:?}");
        }
        for id in ["a", "b", "q", "\"q"] {
            assert!(matches!(reopened.allocate(Some(id)).expect("new"), BlockAllocation::Block(_)), "{id:?}");
        }
    }

    #[test]
    fn unframed_lines_of_an_older_log_still_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(DEDUP_LOG), "all_old\n").expect("write");
        let committer = LocalCommitter::open(dir.path(), 10, 0, vec![]).expect("open");
        assert_eq!(committer.allocate(Some("all_old")).expect("old"), BlockAllocation::Duplicate);
    }

    #[test]
    fn window_zero_never_deduplicates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = PartName::parse("all_1_1_0").expect("name");
        let committer = LocalCommitter::open(dir.path(), 0, 0, vec![]).expect("open");
        assert_eq!(committer.allocate(Some("a")).expect("a"), BlockAllocation::Block(1));
        committer.committed(1, Some("a"), &name).expect("commit");
        assert_eq!(committer.allocate(Some("a")).expect("a"), BlockAllocation::Block(2));
    }
}
