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

/// Bytes of a file checksummed at a time.
const CHECKSUM_CHUNK: usize = 256 << 10;

/// The size and CRC32 of a file, read a chunk at a time: reading a part whole into memory
/// to check it took a fresh allocation of the part's size at every load (its page faults
/// were a third of checking a part at startup).
pub fn checksum_file(path: &Path) -> Result<FileChecksum> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(EngineError::io(path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut chunk = vec![0u8; CHECKSUM_CHUNK];
    let mut size = 0u64;
    loop {
        let read = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(EngineError::Io { path: path.to_path_buf(), source: e }),
        };
        hasher.update(&chunk[..read]);
        size += read as u64;
    }
    Ok(FileChecksum { size, crc32: hasher.finalize() })
}

/// A file being written whose size and CRC32 are taken on the way, equal to what
/// [`checksum_file`] would read back: a fetched part is checked as it arrives instead of
/// being read again once it is on disk.
pub struct ChecksummedFile {
    path: std::path::PathBuf,
    file: std::fs::File,
    hasher: crc32fast::Hasher,
    size: u64,
}

impl ChecksummedFile {
    pub fn create(path: &Path) -> Result<ChecksummedFile> {
        let file = std::fs::File::create(path).map_err(EngineError::io(path))?;
        Ok(ChecksummedFile { path: path.to_path_buf(), file, hasher: crc32fast::Hasher::new(), size: 0 })
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file.write_all(bytes).map_err(EngineError::io(&self.path))?;
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// Synced to disk; its size and CRC.
    pub fn finish(self) -> Result<FileChecksum> {
        self.file.sync_all().map_err(EngineError::io(&self.path))?;
        Ok(FileChecksum { size: self.size, crc32: self.hasher.finalize() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_checksummed_as_written_is_checksummed_as_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let mut file = ChecksummedFile::create(&path).expect("create");
        for chunk in [&b"abc"[..], &[7u8; 300_000][..], b""] {
            file.write(chunk).expect("write");
        }
        assert_eq!(file.finish().expect("finish"), checksum_file(&path).expect("read back"));
    }

    #[test]
    fn a_file_checksummed_by_chunks_is_checksummed_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        for len in [0, 1, CHECKSUM_CHUNK, 2 * CHECKSUM_CHUNK + 12_345] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &bytes).expect("write");
            let sum = checksum_file(&path).expect("checksum");
            assert_eq!(sum.size, len as u64);
            assert_eq!(sum.crc32, crc32fast::hash(&bytes), "{len} bytes");
        }
    }
}
