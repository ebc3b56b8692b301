//! Parts that travel between replicas: the files of an active part for a replica that asks,
//! and a part received from another replica, checked and made active.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Table;
use crate::error::{EngineError, Result};
use crate::part::meta::{FileChecksum, META_FILE};
use crate::part::{name::PartName, DataPart, TMP_PREFIX};

impl Table {
    /// The active part of this name, if there is one.
    pub fn active_part(&self, name: &str) -> Option<Arc<DataPart>> {
        self.lock_state().active.iter().find(|p| p.name.to_string() == name).cloned()
    }

    /// Whether this part, or an active part covering it, is here: a log entry bringing it
    /// has nothing left to do.
    pub fn has_part_or_covering(&self, name: &PartName) -> bool {
        self.lock_state().active.iter().any(|p| p.name == *name || p.name.covers(name))
    }

    /// Whether `name` is a part an insert here is committing: its block is held from its
    /// reservation until the part is active, so between the coordinator taking the commit
    /// and the rename into place the part is listed there and not yet here.
    pub fn is_being_inserted(&self, name: &PartName) -> bool {
        name.min_block == name.max_block
            && self.lock_state().reserved_blocks.contains(&(name.partition_id.clone(), name.min_block))
    }

    /// The files a replica fetching `part` is sent, in order: meta.json, then those it lists.
    pub fn part_files(part: &DataPart) -> Vec<(String, PathBuf)> {
        std::iter::once(META_FILE.to_string())
            .chain(part.meta.files.keys().cloned())
            .map(|f| (f.clone(), part.dir.join(f)))
            .collect()
    }

    /// A new temporary directory for a part being fetched; removed at the next open if the
    /// fetch never finishes.
    pub fn fetch_dir(&self, name: &PartName) -> Result<PathBuf> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = self.dir.join(format!("{TMP_PREFIX}fetch_{name}_{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir).map_err(EngineError::io(&dir))?;
        Ok(dir)
    }

    /// Makes a fetched part active, after checking that its files are the ones `expected`
    /// names (sizes and CRCs, as the part's node in the coordinator records them), that its
    /// `meta.json` says so too, and that `received` (the sizes and CRCs taken as the files
    /// were written) matches. A part that fails any is refused and its directory removed.
    pub fn add_fetched(
        &self,
        fetched: &Path,
        name: &PartName,
        expected: &BTreeMap<String, FileChecksum>,
        received: &BTreeMap<String, FileChecksum>,
    ) -> Result<()> {
        let refuse = |message: String| {
            let _ = std::fs::remove_dir_all(fetched);
            EngineError::CorruptPart { part: name.to_string(), message }
        };
        let meta = match crate::part::PartMeta::read(fetched) {
            Ok(meta) if meta.format_version == crate::part::meta::FORMAT_VERSION => meta,
            Ok(meta) => return Err(refuse(format!("unknown part format version {}", meta.format_version))),
            Err(e) => return Err(refuse(format!("the fetched part is damaged: {e}"))),
        };
        if &meta.files != expected {
            return Err(refuse("the fetched part's files differ from those its replica committed".into()));
        }
        for (file, wanted) in expected {
            match received.get(file) {
                Some(got) if got == wanted => {}
                Some(got) => {
                    return Err(refuse(format!(
                        "the fetched part is damaged: checksum mismatch in {file}: expected size {} crc32 {:08x}, \
                         found size {} crc32 {:08x}",
                        wanted.size, wanted.crc32, got.size, got.crc32
                    )))
                }
                None => return Err(refuse(format!("the fetched part is damaged: {file} was not sent"))),
            }
        }
        crate::part::sync_dir(fetched)?;
        if self.has_part_or_covering(name) {
            let _ = std::fs::remove_dir_all(fetched);
            return Ok(());
        }
        let target = self.dir.join(name.to_string());
        std::fs::rename(fetched, &target).map_err(EngineError::io(&target))?;
        crate::part::sync_dir(&self.dir)?;
        let part = DataPart::open_checked(&target, meta)?;
        // A merged part fetched instead of merged here replaces the sources it covers.
        let covered: Vec<Arc<DataPart>> = {
            let mut state = self.lock_state();
            let (covered, kept): (Vec<_>, Vec<_>) =
                std::mem::take(&mut state.active).into_iter().partition(|p| part.name.covers(&p.name));
            state.active = kept;
            for old in &covered {
                old.mark_outdated();
                state.outdated.push(old.clone());
            }
            covered
        };
        self.activate(part);
        if !covered.is_empty() {
            drop(covered);
            self.remove_unused_outdated();
        }
        metrics::counter!(crate::metrics::PARTS_FETCHED).increment(1);
        Ok(())
    }

    /// Takes an active part out of the table into `detached/<reason>_<name>`, where it stays
    /// for a person to look at (ClickHouse's detach reasons: `clone`, `unexpected`, …).
    /// Whether the part was active here.
    pub fn detach_part(&self, name: &PartName, reason: &str) -> Result<bool> {
        let part = {
            let mut state = self.lock_state();
            let Some(at) = state.active.iter().position(|p| p.name == *name) else { return Ok(false) };
            state.active.remove(at)
        };
        let detached = self.dir.join(crate::part::DETACHED_DIR);
        std::fs::create_dir_all(&detached).map_err(EngineError::io(&detached))?;
        let target = detached.join(format!("{reason}_{name}"));
        // Readers that hold the part keep their open files; a new read no longer sees it.
        std::fs::rename(&part.dir, &target).map_err(EngineError::io(&target))?;
        crate::part::sync_dir(&self.dir)?;
        tracing::info!(table = %self.def.name, part = %name, to = %target.display(), "detached a part");
        Ok(true)
    }

    /// An empty part (no rows) under `name`, made active: what a replica puts in place of a
    /// part that no replica has any more, as ClickHouse's `createEmptyPartInsteadOfLost`, so
    /// that the log entry bringing it finishes and merges over its range go on. The rows are
    /// lost either way; the empty part says so in the open instead of blocking the queue.
    pub fn create_empty_part(&self, name: &PartName) -> Result<()> {
        if self.has_part_or_covering(name) {
            return Ok(());
        }
        // The partition's value as another part of it records it; the id names it otherwise.
        let partition = self
            .snapshot()
            .iter()
            .find(|p| p.name.partition_id == name.partition_id)
            .map(|p| p.meta.partition.clone())
            .unwrap_or_else(|| crate::key_expr::Partition {
                id: name.partition_id.clone(),
                value: name.partition_id.clone(),
            });
        let tmp_name = format!("empty_{name}");
        let writer = crate::part::PartWriter::create(
            &self.dir,
            &tmp_name,
            partition,
            self.schema.clone(),
            self.key_columns.clone(),
            self.def.settings.index_granularity,
        )?;
        let part = writer.close(None)?.commit(name.clone())?;
        self.activate(part);
        tracing::warn!(table = %self.def.name, part = %name, "Created empty part instead of lost part");
        Ok(())
    }
}
