//! Merges: choosing parts, merging them into one part at the next level, and OPTIMIZE.

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::{debug, info};

use super::Table;
use crate::error::{EngineError, Result};
use crate::merge::select::{merge_pressure, PartSize};
use crate::merge::{build_algorithm, decode_ahead, AlgorithmOptions, SortedMerge, MERGE_BLOCK_ROWS};
use crate::part::{name::PartName, DataPart, PartWriter};
use crate::progress::{counted, ReadProgress};
use crate::schema::EngineKind;

/// `OPTIMIZE TABLE t [PARTITION p] [FINAL] [CLEANUP]`.
#[derive(Debug, Clone, Default)]
pub struct OptimizeRequest {
    /// The partition id; `None` for every partition.
    pub partition_id: Option<String>,
    pub final_merge: bool,
    pub cleanup: bool,
    /// Counts the rows and bytes the merges read, for the statement's progress.
    pub progress: Option<Arc<ReadProgress>>,
}

/// Whether an insert holds a block number between two adjacent parts of one partition.
fn reserved_between(reserved: &BTreeSet<(String, u64)>, left: &PartName, right: &PartName) -> bool {
    if reserved.is_empty() || right.min_block <= left.max_block + 1 {
        return false;
    }
    let partition = &left.partition_id;
    reserved.range((partition.clone(), left.max_block + 1)..(partition.clone(), right.min_block)).next().is_some()
}

impl Table {
    /// Picks one background merge and marks its parts as merging.
    pub fn select_merge(&self) -> Option<Vec<Arc<DataPart>>> {
        let mut state = self.lock_state();
        // A replicated table's parts merge only through its replicated log, on every replica
        // alike: the replica assigning merges asks `pick_merge` and writes the entry.
        if state.merges_stopped || self.def.replication.is_some() {
            return None;
        }
        let chosen = self.choose_merge(&state);
        let parts = chosen?;
        for part in &parts {
            state.merging.insert(part.name.clone());
        }
        Some(parts)
    }

    /// The merge the selector would run now, without starting it: for the replica that
    /// assigns a replicated table's merges.
    pub fn pick_merge(&self) -> Option<Vec<PartName>> {
        let state = self.lock_state();
        if state.merges_stopped {
            return None;
        }
        self.choose_merge(&state).map(|parts| parts.iter().map(|p| p.name.clone()).collect())
    }

    /// The merge OPTIMIZE FINAL asks of one partition of a replicated table: every active part
    /// of it. `None` while a merge holds one of them or an insert holds a block number below
    /// the partition's last (the merged range would skip it): ask again once that is over.
    pub fn pick_partition_merge(&self, partition_id: &str) -> Result<Option<Vec<PartName>>> {
        let state = self.lock_state();
        if state.merges_stopped {
            return Err(self.merges_cancelled());
        }
        if partition_busy(&state, partition_id) {
            return Ok(None);
        }
        Ok(Some(state.active.iter().filter(|p| p.name.partition_id == partition_id).map(|p| p.name.clone()).collect()))
    }

    /// Runs a merge a replicated log entry names: `sources`, active here and merging nowhere,
    /// into `result`. Every replica runs the same algorithm over the same parts.
    pub fn merge_named(&self, sources: &[PartName], result: &PartName, options: AlgorithmOptions) -> Result<()> {
        let parts = {
            let mut state = self.lock_state();
            let mut parts = Vec::with_capacity(sources.len());
            for name in sources {
                match state.active.iter().find(|p| p.name == *name) {
                    Some(part) if !state.merging.contains(name) => parts.push(part.clone()),
                    _ => {
                        return Err(EngineError::BadOptimize {
                            table: self.def.name.clone(),
                            message: format!("part {name} of merge {result} is not active here"),
                        })
                    }
                }
            }
            for part in &parts {
                state.merging.insert(part.name.clone());
            }
            parts
        };
        let merged = self.run_merge(parts, options, None)?;
        if merged != *result {
            tracing::error!(table = %self.def.name, %merged, %result, "a replicated merge made another part than its entry names");
        }
        Ok(())
    }

    fn choose_merge(&self, state: &super::TableState) -> Option<Vec<Arc<DataPart>>> {
        let active = &state.active;
        let mut start = 0;
        // Runs of adjacent parts of one partition that no other merge holds.
        let mut chosen = None;
        while start < active.len() {
            let mut end = start;
            while end < active.len()
                && active[end].name.partition_id == active[start].name.partition_id
                && !state.merging.contains(&active[end].name)
                && (end == start || !reserved_between(&state.reserved_blocks, &active[end - 1].name, &active[end].name))
            {
                end += 1;
            }
            if end > start + 1 {
                let now = chrono::Utc::now().timestamp();
                let sizes: Vec<PartSize> = active[start..end]
                    .iter()
                    .map(|p| PartSize {
                        bytes: p.bytes_on_disk,
                        rows: p.rows(),
                        age_s: (now - p.meta.modification_time).max(0) as f64,
                    })
                    .collect();
                let partition = &active[start].name.partition_id;
                let in_partition = active.iter().filter(|p| &p.name.partition_id == partition).count();
                let pressure = merge_pressure(in_partition, self.def.settings.parts_to_delay_insert);
                if let Some(range) = self.selector.select(&sizes, pressure) {
                    chosen = Some(active[start + range.start..start + range.end].to_vec());
                    break;
                }
            }
            start = end.max(start + 1);
        }
        chosen
    }

    /// Runs one background merge if the selector finds one; whether it did.
    pub fn merge_once(&self, progress: Option<&Arc<ReadProgress>>) -> Result<bool> {
        match self.select_merge() {
            Some(parts) => {
                self.run_merge(parts, AlgorithmOptions::default(), progress)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Merges `parts` (adjacent, one partition, already marked merging) into one part.
    pub fn run_merge(
        &self,
        parts: Vec<Arc<DataPart>>,
        options: AlgorithmOptions,
        progress: Option<&Arc<ReadProgress>>,
    ) -> Result<PartName> {
        let began = std::time::Instant::now();
        let result = self.write_merged(&parts, options, progress);
        let mut state = self.lock_state();
        for part in &parts {
            state.merging.remove(&part.name);
        }
        let merged = match result {
            Ok(merged) => merged,
            Err(e) => {
                drop(state);
                self.merge_done.notify_all();
                return Err(e);
            }
        };
        let name = merged.name.clone();
        let (rows, bytes) =
            (parts.iter().map(|p| p.rows()).sum::<u64>(), parts.iter().map(|p| p.bytes_on_disk).sum::<u64>());
        state.active.retain(|p| !parts.iter().any(|s| Arc::ptr_eq(p, s)));
        let at = state.active.partition_point(|p| p.name.insertion_order(&name).is_lt());
        state.active.insert(at, Arc::new(merged));
        for part in parts {
            part.mark_outdated();
            state.outdated.push(part);
        }
        drop(state);
        self.merge_done.notify_all();
        metrics::counter!(crate::metrics::MERGES).increment(1);
        metrics::counter!(crate::metrics::MERGED_ROWS).increment(rows);
        metrics::counter!(crate::metrics::MERGED_BYTES).increment(bytes);
        metrics::histogram!(crate::metrics::MERGE_DURATION).record(began.elapsed().as_secs_f64());
        self.remove_unused_outdated();
        Ok(name)
    }

    fn write_merged(
        &self,
        parts: &[Arc<DataPart>],
        options: AlgorithmOptions,
        progress: Option<&Arc<ReadProgress>>,
    ) -> Result<DataPart> {
        let first = parts.first().ok_or_else(|| EngineError::BadOptimize {
            table: self.def.name.clone(),
            message: "nothing to merge".into(),
        })?;
        let name = PartName {
            partition_id: first.name.partition_id.clone(),
            min_block: parts.iter().map(|p| p.name.min_block).min().unwrap_or(0),
            max_block: parts.iter().map(|p| p.name.max_block).max().unwrap_or(0),
            level: parts.iter().map(|p| p.name.level).max().unwrap_or(0) + 1,
        };
        debug!(table = %self.def.name, part = %name, sources = parts.len(), "merging parts");
        let streams = parts
            .iter()
            .map(|p| Ok(counted(Box::new(p.reader()?.batch_size(MERGE_BLOCK_ROWS).build()?), progress)))
            .collect::<Result<Vec<_>>>()?;
        let sources = decode_ahead(streams).into_iter().zip(parts.iter().map(|p| p.name.level > 0)).collect();
        let algorithm = build_algorithm(&self.def, &self.schema, options)?;
        let merge = SortedMerge::new(self.schema.clone(), self.key_columns.clone(), sources, algorithm)?;
        let writer = PartWriter::create(
            &self.dir,
            &format!("merge_{name}"),
            first.meta.partition.clone(),
            self.schema.clone(),
            self.key_columns.clone(),
            self.def.settings.index_granularity,
        )?
        .write_all_pipelined(merge)?;
        let rows = writer.rows();
        let part = writer.close(None)?.commit(name)?;
        info!(table = %self.def.name, part = %part.name, rows, "merged parts");
        Ok(part)
    }

    /// Whether `request` is an OPTIMIZE this table can run: CLEANUP only on a
    /// ReplacingMergeTree that allows it, as ClickHouse checks before any merge.
    pub fn check_optimize(&self, request: &OptimizeRequest) -> Result<()> {
        let bad = |message: &str| EngineError::BadOptimize { table: self.def.name.clone(), message: message.into() };
        if request.cleanup {
            if !matches!(self.def.engine, EngineKind::ReplacingMergeTree { .. }) {
                return Err(bad("Cannot OPTIMIZE with CLEANUP table: only ReplacingMergeTree can be CLEANUP"));
            }
            if !self.def.settings.allow_experimental_replacing_merge_with_cleanup {
                return Err(bad("Experimental merges with CLEANUP are not allowed"));
            }
        }
        Ok(())
    }

    /// An OPTIMIZE without FINAL while merges are stopped: ClickHouse's error when there is
    /// something to merge, nothing otherwise.
    pub fn refuse_stopped_merge(&self) -> Result<()> {
        let parts = self.snapshot();
        let mergeable = parts.windows(2).any(|w| w[0].name.partition_id == w[1].name.partition_id);
        if mergeable {
            return Err(self.merges_cancelled());
        }
        Ok(())
    }

    /// ClickHouse's error for an OPTIMIZE that would merge while merges are stopped.
    fn merges_cancelled(&self) -> EngineError {
        EngineError::BadOptimize { table: self.def.name.clone(), message: "Cancelled merging parts".into() }
    }

    /// The partitions an OPTIMIZE FINAL merges: the one it names, or every one with a part.
    pub fn optimize_partitions(&self, request: &OptimizeRequest) -> Vec<String> {
        let mut ids: Vec<String> = self.snapshot().iter().map(|p| p.name.partition_id.clone()).collect();
        ids.dedup();
        ids.into_iter().filter(|id| request.partition_id.as_ref().is_none_or(|want| want == id)).collect()
    }

    /// `OPTIMIZE TABLE`: without FINAL one selected merge; with FINAL every partition (or the
    /// given one) merged into one part, a single part rewritten too, as ClickHouse does.
    /// A replicated table's OPTIMIZE goes through its replication queue instead.
    pub fn optimize(&self, request: &OptimizeRequest) -> Result<()> {
        let bad = |message: &str| EngineError::BadOptimize { table: self.def.name.clone(), message: message.into() };
        if self.def.replication.is_some() {
            return Err(bad("a replicated table merges through its replicated log, not on one replica alone"));
        }
        self.check_optimize(request)?;
        if !request.final_merge {
            if self.merges_stopped() {
                return self.refuse_stopped_merge();
            }
            return self.merge_once(request.progress.as_ref()).map(|_| ());
        }
        let options = AlgorithmOptions { cleanup: request.cleanup, final_read: false };
        let partitions = self.optimize_partitions(request);
        for partition_id in partitions {
            let parts = self.take_partition_for_merge(&partition_id)?;
            if !parts.is_empty() {
                self.run_merge(parts, options, request.progress.as_ref())?;
            }
        }
        Ok(())
    }

    /// Waits until no merge holds a part of the partition, then marks all its parts merging.
    fn take_partition_for_merge(&self, partition_id: &str) -> Result<Vec<Arc<DataPart>>> {
        let mut state = self.lock_state();
        loop {
            if state.merges_stopped {
                return Err(self.merges_cancelled());
            }
            if !partition_busy(&state, partition_id) {
                break;
            }
            state = self.merge_done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        let parts: Vec<Arc<DataPart>> =
            state.active.iter().filter(|p| p.name.partition_id == partition_id).cloned().collect();
        for part in &parts {
            state.merging.insert(part.name.clone());
        }
        Ok(parts)
    }
}

/// Whether a merge holds a part of the partition, or an insert a block number below its last
/// part's (a merge of the whole partition now would end up with that block inside its range).
fn partition_busy(state: &super::TableState, partition_id: &str) -> bool {
    let in_partition = || state.active.iter().filter(|p| p.name.partition_id == partition_id);
    if in_partition().any(|p| state.merging.contains(&p.name)) {
        return true;
    }
    let last_block = in_partition().map(|p| p.name.max_block).max().unwrap_or(0);
    state.reserved_blocks.range((partition_id.to_string(), 0)..(partition_id.to_string(), last_block)).next().is_some()
}

impl Table {
    /// Stops merges and waits for the running ones to end (before DROP TABLE).
    pub fn stop_merges_and_wait(&self) {
        let mut state = self.lock_state();
        state.merges_stopped = true;
        while !state.merging.is_empty() {
            state = self.merge_done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_block_between_two_parts_keeps_them_apart() {
        let name = |p: &str, min, max| PartName { partition_id: p.into(), min_block: min, max_block: max, level: 0 };
        let reserved: BTreeSet<(String, u64)> = [("a".to_string(), 5), ("b".to_string(), 2)].into();
        assert!(reserved_between(&reserved, &name("a", 1, 4), &name("a", 6, 6)));
        assert!(!reserved_between(&reserved, &name("a", 1, 5), &name("a", 6, 6)), "5 is inside a part");
        assert!(!reserved_between(&reserved, &name("a", 6, 6), &name("a", 8, 9)), "7 is not reserved");
        assert!(!reserved_between(&reserved, &name("a", 1, 1), &name("a", 3, 3)), "2 is reserved in b, not a");
    }
}
