//! Parts taken out of the table and committed again under new block numbers: what
//! `SYSTEM RESTORE REPLICA` does with a replica's parts once its coordinator metadata is gone
//! (ClickHouse moves them to `detached/` and attaches them back, each as a new insert).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{blocking, Table};
use crate::error::{EngineError, Result};
use crate::part::{name::PartName, ClosedPart, PartMeta, DETACHED_DIR};

/// The prefix in `detached/` of the parts a restore took out and has not attached yet.
pub const RESTORE_PREFIX: &str = "restore_";

/// What [`Table::attach_detached`] did with one detached part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// Committed and active under this name.
    As(String),
    /// Its data was committed already, by another replica's restore (the same checksums):
    /// this copy is dropped, and the replica fetches the committed one.
    Duplicate,
}

impl Table {
    /// Moves every active part to `detached/restore_<name>`, oldest first; the table is empty
    /// after it. The parts stay on disk there until [`attach_detached`](Self::attach_detached)
    /// takes them back, so a restore cut short by a crash can go on.
    pub fn detach_all_for_restore(&self) -> Result<usize> {
        let parts = self.snapshot();
        for part in &parts {
            self.detach_part(&part.name, RESTORE_PREFIX.trim_end_matches('_'))?;
        }
        Ok(parts.len())
    }

    /// The parts a restore detached and has not attached yet, in the order they were
    /// inserted (so that a Replacing merge's "last inserted wins" keeps its meaning).
    pub fn detached_for_restore(&self) -> Result<Vec<PathBuf>> {
        let detached = self.dir.join(DETACHED_DIR);
        let entries = match std::fs::read_dir(&detached) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(EngineError::Io { path: detached, source: e }),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(EngineError::io(&detached))?;
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if let Some(name) = file_name.strip_prefix(RESTORE_PREFIX).and_then(PartName::parse) {
                found.push((name, entry.path()));
            }
        }
        found.sort_by(|(a, _), (b, _)| a.insertion_order(b));
        Ok(found.into_iter().map(|(_, path)| path).collect())
    }

    /// The metadata of a part a restore detached (its files checked against it).
    pub fn detached_meta(&self, dir: &Path) -> Result<PartMeta> {
        Ok(ClosedPart::reopen(&self.dir, dir)?.meta().clone())
    }

    /// Makes the part in `dir` active under `name`, the name another replica has a byte-equal
    /// copy of it under (the caller lists it under this replica first). Dropped when a part
    /// here has or covers it already.
    pub async fn adopt_detached(self: &Arc<Self>, dir: PathBuf, name: PartName) -> Result<()> {
        let table = self.clone();
        blocking(move || {
            if table.has_part_or_covering(&name) {
                return std::fs::remove_dir_all(&dir).map_err(EngineError::io(&dir));
            }
            let part = ClosedPart::reopen(&table.dir, &dir)?;
            table.activate(part.commit(name)?);
            Ok(())
        })
        .await
    }

    /// Commits the part in `dir` (one of [`detached_for_restore`](Self::detached_for_restore))
    /// as an insert of its own: a new block number, a deduplication id made of its files'
    /// checksums (as ClickHouse's attach makes it), one commit through the table's committer,
    /// then active. A part whose commit went through before a crash is found by that id and
    /// activated under the name it got.
    pub async fn attach_detached(self: &Arc<Self>, dir: PathBuf) -> Result<Attached> {
        let table = self.clone();
        blocking(move || {
            let part = ClosedPart::reopen(&table.dir, &dir)?;
            let (rows, dedup_id) = (part.meta().rows as usize, checksum_id(&part));
            let summary = table.commit_written(vec![(part, Some(dedup_id))], rows)?;
            // No part: dropped as a duplicate, its files with it.
            Ok(summary.parts.into_iter().next().map_or(Attached::Duplicate, Attached::As))
        })
        .await
    }
}

/// `<partition id>_<hash of the files' names, sizes and CRCs>`: equal for byte-equal parts,
/// such as a part and the copy another replica fetched of it.
fn checksum_id(part: &ClosedPart) -> String {
    let meta = part.meta();
    let mut text = String::new();
    for (file, sum) in &meta.files {
        text.push_str(&format!("{file}:{}:{:08x};", sum.size, sum.crc32));
    }
    format!("{}_{:032x}", meta.partition.id, xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
}
