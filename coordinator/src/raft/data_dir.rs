//! The layout of a node's data directory, checked before anything in it is opened.
//!
//! A node keeps `log/` (the Raft log and vote) and `snapshot/` there. A directory that is
//! missing or empty is a fresh node, as a `mkdir` or a Docker volume gives it; one that holds
//! anything else is refused with the directory and the entries named, so that a node is never
//! started over another program's files, nor fails on one of them with a bare "File exists".

use std::io;
use std::path::{Path, PathBuf};

pub const LOG_DIR: &str = "log";
pub const SNAPSHOT_DIR: &str = "snapshot";

/// Entries a file system puts at the root of a volume, which a node leaves alone.
const FILE_SYSTEM_ENTRIES: &[&str] = &["lost+found"];

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("the data directory {dir} cannot be read: {source}")]
    Unreadable { dir: PathBuf, source: io::Error },
    #[error("the data directory {0} is a file, not a directory")]
    NotADirectory(PathBuf),
    #[error("{path} is a file, where the coordinator keeps its {what} directory")]
    FileInTheWay { path: PathBuf, what: &'static str },
    #[error(
        "the data directory {dir} holds files that are not a coordinator's ({entries}): \
         give the node an empty directory, or one a coordinator made"
    )]
    Foreign { dir: PathBuf, entries: String },
}

/// Checks `dir` and creates it if it is missing.
pub fn prepare(dir: &Path) -> Result<(), DataDirError> {
    let unreadable = |source| DataDirError::Unreadable { dir: dir.to_path_buf(), source };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => return Err(DataDirError::NotADirectory(dir.to_path_buf())),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return std::fs::create_dir_all(dir).map_err(unreadable);
        }
        Err(e) => return Err(unreadable(e)),
    }
    let mut foreign = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let what = match name.as_str() {
            LOG_DIR => "Raft log",
            SNAPSHOT_DIR => "snapshot",
            n if FILE_SYSTEM_ENTRIES.contains(&n) => continue,
            _ => {
                foreign.push(name);
                continue;
            }
        };
        if !entry.file_type().map_err(unreadable)?.is_dir() {
            return Err(DataDirError::FileInTheWay { path: entry.path(), what });
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        let shown = foreign.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = foreign.len().saturating_sub(5);
        let entries = if more > 0 { format!("{shown} and {more} more") } else { shown };
        return Err(DataDirError::Foreign { dir: dir.to_path_buf(), entries });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_empty_and_own_directories_open() {
        let root = tempfile::tempdir().expect("tempdir");
        let missing = root.path().join("new");
        prepare(&missing).expect("missing");
        assert!(missing.is_dir());
        prepare(&missing).expect("empty");
        std::fs::create_dir(missing.join(LOG_DIR)).expect("log");
        std::fs::create_dir(missing.join(SNAPSHOT_DIR)).expect("snapshot");
        std::fs::create_dir(missing.join("lost+found")).expect("lost+found");
        prepare(&missing).expect("a coordinator's");
    }

    #[test]
    fn other_files_are_named() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("notes.txt"), "x").expect("write");
        let error = prepare(root.path()).expect_err("foreign").to_string();
        assert!(error.contains("notes.txt") && error.contains(&root.path().display().to_string()), "{error}");

        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join(LOG_DIR), "x").expect("write");
        let error = prepare(root.path()).expect_err("file in the way").to_string();
        assert!(error.contains("is a file, where the coordinator keeps its Raft log"), "{error}");

        let file = root.path().join(LOG_DIR);
        assert!(matches!(prepare(&file), Err(DataDirError::NotADirectory(_))));
    }
}
