//! One MergeTree table: its definition, its active parts, and the operations on them.
//!
//! The set of active parts changes only under the state lock, by whole parts: an insert adds
//! one, a merge replaces a contiguous range by the part covering it. Readers take a snapshot
//! (`Arc`s of the parts), so a part that a merge outdated stays on disk until the last reader
//! lets go of it.

pub mod attach;
mod fetch;
mod final_read;
pub mod insert;
mod merge;
mod read;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use arrow::datatypes::SchemaRef;
use tracing::{info, warn};

pub use final_read::FinalTask;
pub use insert::{InsertOptions, InsertSummary, PreparedCommitError, PreparedInsert, PreparedRecord, WrittenInsert};
pub use merge::OptimizeRequest;
pub use read::{KeyBound, KeyRange, ReadOptions, ScanTask};

use crate::commit::{CommitterFactory, FoundBlocks, PartCommitter, Reservation};
use crate::error::{EngineError, Result};
use crate::merge::select::{MergeSelector, SizeTieredSelector};
use crate::part::{name::PartName, DataPart, DETACHED_DIR, TMP_PREFIX};
use crate::schema::{StoredTableDef, TableDef};

pub const TABLE_DEF_FILE: &str = "table.json";

#[derive(Default)]
pub(crate) struct TableState {
    /// Active parts, in insertion order (partition id, then block range).
    active: Vec<Arc<DataPart>>,
    /// Parts replaced by a merge, waiting for their readers to finish.
    outdated: Vec<Arc<DataPart>>,
    /// Parts taking part in a running merge.
    merging: HashSet<PartName>,
    /// Block numbers reserved by inserts not yet active, by partition: no merge may span one,
    /// or the merged part would cover a part that arrives after it.
    reserved_blocks: BTreeSet<(String, u64)>,
    merges_stopped: bool,
}

/// A row of `system.parts`.
#[derive(Debug, Clone)]
pub struct PartInfo {
    pub partition: String,
    pub partition_id: String,
    pub name: String,
    pub active: bool,
    pub rows: u64,
    pub level: u32,
    pub min_block: u64,
    pub max_block: u64,
    pub bytes_on_disk: u64,
    pub modification_time: i64,
}

pub struct Table {
    def: TableDef,
    dir: PathBuf,
    schema: SchemaRef,
    key_columns: Vec<usize>,
    committer: Arc<dyn PartCommitter>,
    state: Mutex<TableState>,
    /// Signalled whenever a merge ends or an insert lets go of its block number, for OPTIMIZE
    /// waiting on running merges and inserts.
    merge_done: Condvar,
    selector: Box<dyn MergeSelector>,
}

impl Table {
    /// Creates a new table in `dir`, which must not exist yet: on failure the directory made
    /// here is removed, and nothing else is touched.
    pub fn create(dir: &Path, def: TableDef, committers: &dyn CommitterFactory) -> Result<Table> {
        def.validate()?;
        if let Some(partition) = &def.partition_by {
            partition.validate(&def.columns)?;
        }
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(EngineError::io(parent))?;
        }
        std::fs::create_dir(dir).map_err(EngineError::io(dir))?;
        let written = Table::write_definition(dir, &def).and_then(|()| Table::open(dir, committers));
        if written.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        written
    }

    fn write_definition(dir: &Path, def: &TableDef) -> Result<()> {
        let stored = StoredTableDef::from(def);
        let path = dir.join(TABLE_DEF_FILE);
        let json = serde_json::to_vec_pretty(&stored)
            .map_err(|source| EngineError::Metadata { path: path.clone(), source })?;
        let tmp = dir.join(format!("{TABLE_DEF_FILE}.tmp"));
        crate::part::write_synced(&tmp, &json)?;
        std::fs::rename(&tmp, &path).map_err(EngineError::io(&path))?;
        crate::part::sync_dir(dir)
    }

    /// Loads a table: its definition, its parts (verified; corrupt ones detached), and the
    /// parts that are active (those no other part covers).
    pub fn open(dir: &Path, committers: &dyn CommitterFactory) -> Result<Table> {
        let path = dir.join(TABLE_DEF_FILE);
        let bytes = std::fs::read(&path).map_err(EngineError::io(&path))?;
        let stored: StoredTableDef =
            serde_json::from_slice(&bytes).map_err(|source| EngineError::Metadata { path: path.clone(), source })?;
        let def = stored.into_def()?;
        let schema = def.arrow_schema();
        let key_columns = def
            .sorting_key()
            .iter()
            .map(|k| {
                def.column_index(k)
                    .ok_or_else(|| EngineError::BadTableDefinition(format!("sorting key column {k} is missing")))
            })
            .collect::<Result<Vec<_>>>()?;

        let mut parts = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(EngineError::io(dir))?;
        for entry in entries {
            let entry = entry.map_err(EngineError::io(dir))?;
            let name = entry.file_name().to_string_lossy().to_string();
            let path = entry.path();
            if name.starts_with(TMP_PREFIX) {
                // An insert or merge that did not finish: it never became visible.
                std::fs::remove_dir_all(&path).map_err(EngineError::io(&path))?;
                continue;
            }
            if PartName::parse(&name).is_none() {
                continue;
            }
            if !path.is_dir() {
                // Something replaced the part's directory: keep it aside for a person to see.
                let error = EngineError::CorruptPart { part: name.clone(), message: "not a directory".into() };
                detach_broken(dir, &name, &error)?;
                continue;
            }
            match DataPart::open(&path) {
                Ok(part) => parts.push(part),
                Err(e) => detach_broken(dir, &name, &e)?,
            }
        }
        parts.sort_by(|a, b| a.name.insertion_order(&b.name));
        let found = FoundBlocks {
            max_block: parts.iter().map(|p| p.name.max_block).max().unwrap_or(0),
            dedup_ids: parts.iter().filter_map(|p| p.meta.dedup_id.clone()).collect(),
        };
        let (active, covered): (Vec<_>, Vec<_>) = {
            let names: Vec<PartName> = parts.iter().map(|p| p.name.clone()).collect();
            parts.into_iter().partition(|p| !names.iter().any(|n| n.covers(&p.name)))
        };
        for part in covered {
            // A merge finished but crashed before removing its sources.
            std::fs::remove_dir_all(&part.dir).map_err(EngineError::io(&part.dir))?;
        }
        let committer = committers.committer(&def, dir, found)?;
        let selector = Box::new(SizeTieredSelector {
            max_parts: def.settings.max_parts_to_merge_at_once.max(2) as usize,
            max_bytes: def.settings.max_bytes_to_merge_at_max_space_in_pool,
            force_after_s: def.settings.min_age_to_force_merge_seconds as f64,
            force_whole_partition_only: def.settings.min_age_to_force_merge_on_partition_only,
            ..Default::default()
        });
        Ok(Table {
            dir: dir.to_path_buf(),
            schema,
            key_columns,
            committer,
            state: Mutex::new(TableState { active: active.into_iter().map(Arc::new).collect(), ..Default::default() }),
            merge_done: Condvar::new(),
            selector,
            def,
        })
    }

    pub fn def(&self) -> &TableDef {
        &self.def
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The schema of the parts: the table's columns, then hidden sorting-key columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The table's columns as users see them (and as inserts bring them).
    pub fn user_schema(&self) -> SchemaRef {
        self.def.user_arrow_schema()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock_state(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hold_block(&self, reservation: &Reservation) {
        self.lock_state().reserved_blocks.insert((reservation.partition_id.clone(), reservation.block));
    }

    fn release_block(&self, reservation: &Reservation) {
        self.lock_state().reserved_blocks.remove(&(reservation.partition_id.clone(), reservation.block));
        self.merge_done.notify_all();
    }

    /// The active parts now, held for a read.
    pub fn snapshot(&self) -> Vec<Arc<DataPart>> {
        self.lock_state().active.clone()
    }

    pub fn stop_merges(&self) {
        self.lock_state().merges_stopped = true;
    }

    pub fn start_merges(&self) {
        self.lock_state().merges_stopped = false;
    }

    pub fn merges_stopped(&self) -> bool {
        self.lock_state().merges_stopped
    }

    pub fn parts_info(&self) -> Vec<PartInfo> {
        let state = self.lock_state();
        let info = |part: &Arc<DataPart>, active: bool| PartInfo {
            partition: part.meta.partition.value.clone(),
            partition_id: part.name.partition_id.clone(),
            name: part.name.to_string(),
            active,
            rows: part.rows(),
            level: part.name.level,
            min_block: part.name.min_block,
            max_block: part.name.max_block,
            bytes_on_disk: part.bytes_on_disk,
            modification_time: part.meta.modification_time,
        };
        state.active.iter().map(|p| info(p, true)).chain(state.outdated.iter().map(|p| info(p, false))).collect()
    }

    /// Sets the part gauges of this table (active parts, the fullest partition's, rows, bytes).
    pub fn publish_part_gauges(&self) {
        let (parts, max_in_partition, rows, bytes) = {
            let state = self.lock_state();
            let mut per_partition: HashMap<&str, usize> = HashMap::new();
            for part in &state.active {
                *per_partition.entry(part.name.partition_id.as_str()).or_default() += 1;
            }
            let rows: u64 = state.active.iter().map(|p| p.rows()).sum();
            let bytes: u64 = state.active.iter().map(|p| p.bytes_on_disk).sum();
            (state.active.len(), per_partition.values().copied().max().unwrap_or(0), rows, bytes)
        };
        let table = self.def.name.clone();
        metrics::gauge!(crate::metrics::ACTIVE_PARTS, "table" => table.clone()).set(parts as f64);
        metrics::gauge!(crate::metrics::MAX_PARTS_IN_PARTITION, "table" => table.clone()).set(max_in_partition as f64);
        metrics::gauge!(crate::metrics::ACTIVE_ROWS, "table" => table.clone()).set(rows as f64);
        metrics::gauge!(crate::metrics::ACTIVE_BYTES, "table" => table).set(bytes as f64);
    }

    /// Deletes outdated parts that no reader holds any more.
    pub fn remove_unused_outdated(&self) {
        let unused: Vec<Arc<DataPart>> = {
            let mut state = self.lock_state();
            let (unused, kept) =
                std::mem::take(&mut state.outdated).into_iter().partition(|p| Arc::strong_count(p) == 1);
            state.outdated = kept;
            unused
        };
        for part in unused {
            if let Err(e) = std::fs::remove_dir_all(&part.dir) {
                warn!(part = %part.name, error = %e, "cannot remove an outdated part");
            }
        }
    }

    /// Removes the table's files; the table must no longer be used.
    pub fn drop_data(&self) -> Result<()> {
        std::fs::remove_dir_all(&self.dir).map_err(EngineError::io(&self.dir))
    }
}

/// Runs file and CPU work of the async entry points on tokio's blocking threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| EngineError::TaskFailed(e.to_string()))?
}

fn detach_broken(table_dir: &Path, name: &str, error: &EngineError) -> Result<()> {
    let detached = table_dir.join(DETACHED_DIR);
    std::fs::create_dir_all(&detached).map_err(EngineError::io(&detached))?;
    let target = detached.join(format!("broken_{name}"));
    warn!(
        table_dir = %table_dir.display(),
        part = name,
        error = %error,
        "part is broken: moved to {}",
        target.display()
    );
    std::fs::rename(table_dir.join(name), &target).map_err(EngineError::io(&target))?;
    info!(part = name, "detached broken part");
    Ok(())
}

#[cfg(test)]
mod tests;
