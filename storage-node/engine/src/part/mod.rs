//! Immutable sorted parts on disk.
//!
//! A part is a directory holding `data.parquet` (the rows, sorted by the sorting key, LZ4
//! compressed, with statistics), `primary.idx` (the sparse primary index: the key of the first
//! row of every granule and of the last row, as an Arrow IPC file) and `meta.json` (row count,
//! partition, dedup id and the checksums of the other files). It is written under a `tmp_`
//! name, fsynced, and renamed into place, so a crash leaves a whole part or none.

pub mod meta;
pub mod name;
mod reader;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::RecordBatch;

pub use meta::PartMeta;
pub use name::PartName;
pub use reader::PartReader;
pub use writer::{write_synced, ClosedPart, PartWriter};

use crate::error::{EngineError, Result};

/// Prefix of directories that are being written; removed at startup.
pub const TMP_PREFIX: &str = "tmp_";
pub const DETACHED_DIR: &str = "detached";

#[derive(Debug)]
pub struct DataPart {
    pub name: PartName,
    pub dir: PathBuf,
    pub meta: PartMeta,
    pub bytes_on_disk: u64,
    /// Key values of the first row of each granule, then of the last row.
    pub index: RecordBatch,
    outdated: AtomicBool,
}

impl DataPart {
    /// Opens a part directory, verifying every file against the checksums in `meta.json`.
    pub fn open(dir: &Path) -> Result<DataPart> {
        let dir_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let name = PartName::parse(dir_name).ok_or_else(|| EngineError::CorruptPart {
            part: dir_name.to_string(),
            message: "not a part name".into(),
        })?;
        let (meta, bytes_on_disk, index) = verified_files(dir, dir_name)?;
        Ok(DataPart { name, dir: dir.to_path_buf(), meta, bytes_on_disk, index, outdated: AtomicBool::new(false) })
    }

    /// Opens a part directory whose files were checked against `meta` as they were written
    /// (a fetched part): only its index is read.
    pub fn open_checked(dir: &Path, meta: PartMeta) -> Result<DataPart> {
        let dir_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let name = PartName::parse(dir_name).ok_or_else(|| EngineError::CorruptPart {
            part: dir_name.to_string(),
            message: "not a part name".into(),
        })?;
        let index = reader::read_index(&dir.join(meta::INDEX_FILE))?;
        let bytes_on_disk = meta.files.values().map(|f| f.size).sum();
        Ok(DataPart { name, dir: dir.to_path_buf(), meta, bytes_on_disk, index, outdated: AtomicBool::new(false) })
    }

    pub fn rows(&self) -> u64 {
        self.meta.rows
    }

    pub fn is_outdated(&self) -> bool {
        self.outdated.load(Ordering::Acquire)
    }

    pub fn mark_outdated(&self) {
        self.outdated.store(true, Ordering::Release);
    }

    pub fn reader(&self) -> Result<PartReader> {
        PartReader::open(self)
    }
}

/// A part directory's meta.json, its size on disk and its index, after checking every file
/// against the checksums in meta.json. `label` names the part in errors.
pub(crate) fn verified_files(dir: &Path, label: &str) -> Result<(PartMeta, u64, RecordBatch)> {
    let meta = PartMeta::read(dir)?;
    if meta.format_version != meta::FORMAT_VERSION {
        return Err(EngineError::CorruptPart {
            part: label.to_string(),
            message: format!("unknown part format version {}", meta.format_version),
        });
    }
    let mut bytes_on_disk = 0;
    for (file, expected) in &meta.files {
        let actual = meta::checksum_file(&dir.join(file)).map_err(|e| EngineError::CorruptPart {
            part: label.to_string(),
            message: format!("cannot read {file}: {e}"),
        })?;
        if &actual != expected {
            return Err(EngineError::CorruptPart {
                part: label.to_string(),
                message: format!(
                    "checksum mismatch in {file}: expected size {} crc32 {:08x}, found size {} crc32 {:08x}",
                    expected.size, expected.crc32, actual.size, actual.crc32
                ),
            });
        }
        bytes_on_disk += actual.size;
    }
    let index = reader::read_index(&dir.join(meta::INDEX_FILE))?;
    Ok((meta, bytes_on_disk, index))
}

/// fsync a directory so that a rename or file creation inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(EngineError::io(dir))
}
