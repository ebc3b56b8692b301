//! `meta.json`: what a part is, and the checksums of its files.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::key_expr::Partition;

pub const META_FILE: &str = "meta.json";
pub const DATA_FILE: &str = "data.parquet";
pub const INDEX_FILE: &str = "primary.idx";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChecksum {
    pub size: u64,
    pub crc32: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartMeta {
    pub format_version: u32,
    pub partition: Partition,
    pub rows: u64,
    pub index_granularity: u64,
    /// The deduplication id of the insert that wrote this part, kept so that the dedup window
    /// survives a crash between the part's rename and the dedup log's append.
    pub dedup_id: Option<String>,
    pub modification_time: i64,
    pub files: BTreeMap<String, FileChecksum>,
}

impl PartMeta {
    pub fn read(dir: &Path) -> Result<PartMeta> {
        let path = dir.join(META_FILE);
        let bytes = std::fs::read(&path).map_err(EngineError::io(&path))?;
        serde_json::from_slice(&bytes).map_err(|source| EngineError::Metadata { path, source })
    }
}

pub fn checksum_file(path: &Path) -> Result<FileChecksum> {
    let bytes = std::fs::read(path).map_err(EngineError::io(path))?;
    Ok(FileChecksum { size: bytes.len() as u64, crc32: crc32fast::hash(&bytes) })
}
