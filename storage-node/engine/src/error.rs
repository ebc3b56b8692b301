//! The engine's error type: every failure names the table, part or path it concerns.

use std::path::PathBuf;

use arrow::error::ArrowError;
use parquet::errors::ParquetError;

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid type '{type_name}': {message}")]
    InvalidType { type_name: String, message: String },

    /// ClickHouse's BAD_ARGUMENTS / ILLEGAL_TYPE_OF_ARGUMENT family at CREATE TABLE.
    #[error("{0}")]
    BadTableDefinition(String),

    #[error("bad table name '{name}': {message}")]
    BadTableName { name: String, message: String },

    /// A directory in the way of a new table: a table that failed to open, or something else.
    #[error("cannot create table {table}: {dir} already exists and is not a table of this node; move it away first")]
    DirectoryInTheWay { table: String, dir: PathBuf },

    #[error("table {0} already exists")]
    TableExists(String),

    #[error("table {0} does not exist")]
    UnknownTable(String),

    #[error("unknown setting '{0}'")]
    UnknownSetting(String),

    #[error("setting '{name}': {message}")]
    BadSetting { name: String, message: String },

    #[error("table {table}: {message}")]
    BadInsert { table: String, message: String },

    #[error("too many parts ({parts}) in partition {partition} of table {table}: merges are processing significantly slower than inserts (parts_to_throw_insert = {limit})")]
    TooManyParts { table: String, partition: String, parts: usize, limit: u64 },

    #[error("table {table}: {message}")]
    BadOptimize { table: String, message: String },

    #[error("part {part}: {message}")]
    CorruptPart { part: String, message: String },

    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("parquet error in {path}: {source}")]
    Parquet { path: PathBuf, source: ParquetError },

    #[error("arrow error: {0}")]
    Arrow(#[from] ArrowError),

    #[error("metadata error in {path}: {source}")]
    Metadata { path: PathBuf, source: serde_json::Error },

    /// The coordinator refused an insert's commit: nothing of it was applied.
    #[error("the coordinator refused the commit: node {path}: {refusal}")]
    CommitRefused { path: String, refusal: crate::commit::Refusal },

    /// No answer came for an insert's commit: it may or may not have been applied.
    #[error("the commit's outcome is unknown: {0}")]
    CommitOutcomeUnknown(String),

    /// The coordinator answered with an error; nothing was applied.
    #[error("the coordinator failed the commit: {0}")]
    Coordinator(String),

    #[error("a blocking task of the engine failed: {0}")]
    TaskFailed(String),

    #[error("{path} needs a coordinator, and this storage node has none: start it with --coordinator")]
    NoCoordinator { path: String },

    /// ClickHouse's errors of replicated tables, with its code names (METADATA_MISMATCH,
    /// REPLICA_ALREADY_EXISTS, TABLE_IS_READ_ONLY, …).
    #[error("{message} ({code})")]
    Replication { code: &'static str, message: String },
}

impl EngineError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EngineError {
        let path = path.into();
        move |source| EngineError::Io { path, source }
    }

    pub fn parquet(path: impl Into<PathBuf>) -> impl FnOnce(ParquetError) -> EngineError {
        let path = path.into();
        move |source| EngineError::Parquet { path, source }
    }
}
