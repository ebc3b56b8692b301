//! The query layer's error type.

use datafusion::error::DataFusionError;
use mergestream_engine::EngineError;

pub type Result<T, E = QueryError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// Text that does not parse, with its 1-based line and column in the script.
    #[error("syntax error at {line}:{column}: {message}")]
    Syntax { line: usize, column: usize, message: String },

    /// A statement past one of ClickHouse's query limits (`max_ast_depth` and the others).
    #[error("at {line}:{column}: {message}")]
    Limit { line: usize, column: usize, message: String },

    #[error("{0}")]
    Engine(#[from] EngineError),

    #[error("{0}")]
    DataFusion(Box<DataFusionError>),

    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),

    /// A value in inserted data that does not fit its column.
    #[error("cannot parse {what} at {line}:{column}: {message}")]
    BadValue { what: String, line: usize, column: usize, message: String },

    #[error("not supported: {0}")]
    Unsupported(String),

    /// Past `max_execution_time` (in milliseconds, as ClickHouse words it).
    #[error("Timeout exceeded: elapsed {elapsed_ms:.3} ms, maximum: {limit_ms:.3} ms. (TIMEOUT_EXCEEDED)")]
    Timeout { elapsed_ms: f64, limit_ms: f64 },

    /// Past `max_memory_usage`: the operator's own words after the limit.
    #[error(
        "Query memory limit exceeded: maximum: {limit} bytes (max_memory_usage): {message} (MEMORY_LIMIT_EXCEEDED)"
    )]
    MemoryLimit { limit: usize, message: String },

    #[error("{0}")]
    Invalid(String),
}

impl From<DataFusionError> for QueryError {
    fn from(e: DataFusionError) -> Self {
        match e {
            DataFusionError::External(inner) => match inner.downcast::<EngineError>() {
                Ok(engine) => QueryError::Engine(*engine),
                Err(other) => match other.downcast::<QueryError>() {
                    Ok(query) => *query,
                    Err(other) => QueryError::DataFusion(Box::new(DataFusionError::External(other))),
                },
            },
            other => match missing_table(&other) {
                Some(table) => QueryError::Engine(EngineError::UnknownTable(table)),
                None => QueryError::DataFusion(Box::new(other)),
            },
        }
    }
}

/// The table of DataFusion's "table 'mergestream.default.t' not found" (as `default.t`): the
/// planner's words for a table the catalog does not have, which ClickHouse calls UNKNOWN_TABLE.
fn missing_table(error: &DataFusionError) -> Option<String> {
    let DataFusionError::Plan(message) = error.find_root() else { return None };
    let name = message.strip_prefix("table '")?.strip_suffix("' not found")?;
    Some(name.split_once('.').map_or(name, |(_, rest)| rest).to_string())
}

/// What kind of failure an error is, for a protocol that tells them apart (gRPC's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The statement is wrong: syntax, a limit, a bad value, type or setting.
    BadStatement,
    NotFound,
    AlreadyExists,
    Unsupported,
    /// Refused for now, to protect the server (too many parts, memory): retry later.
    TryLater,
    /// The coordinator could not be reached or did not answer; the statement may be retried.
    Unavailable,
    /// Not possible in the server's present state (no coordinator, a directory in the way,
    /// a replicated table's precondition).
    NotNow,
    /// The server's own failure: I/O, a corrupt part, a failed task.
    Internal,
    /// Past the statement's time limit.
    TimedOut,
}

impl ErrorKind {
    /// The kind of an engine failure, for a statement and for the Ingest service alike.
    pub fn of_engine(e: &EngineError) -> ErrorKind {
        match e {
            EngineError::UnknownTable(_) => ErrorKind::NotFound,
            EngineError::TableExists(_) => ErrorKind::AlreadyExists,
            EngineError::InvalidType { .. }
            | EngineError::BadTableDefinition(_)
            | EngineError::BadTableName { .. }
            | EngineError::UnknownSetting(_)
            | EngineError::BadSetting { .. }
            | EngineError::BadInsert { .. }
            | EngineError::BadOptimize { .. } => ErrorKind::BadStatement,
            EngineError::DirectoryInTheWay { .. } | EngineError::NoCoordinator { .. } => ErrorKind::NotNow,
            EngineError::TooManyParts { .. } => ErrorKind::TryLater,
            EngineError::CommitRefused { .. } | EngineError::CommitOutcomeUnknown(_) | EngineError::Coordinator(_) => {
                ErrorKind::Unavailable
            }
            // Retried by the writer: the replicas or the coordinator may be back soon.
            EngineError::Replication {
                code: "TABLE_IS_READ_ONLY" | "TOO_FEW_LIVE_REPLICAS" | "READONLY" | "UNKNOWN_STATUS_OF_INSERT",
                ..
            } => ErrorKind::Unavailable,
            EngineError::Replication { .. } => ErrorKind::NotNow,
            EngineError::CorruptPart { .. }
            | EngineError::Io { .. }
            | EngineError::Parquet { .. }
            | EngineError::Arrow(_)
            | EngineError::Metadata { .. }
            | EngineError::TaskFailed(_) => ErrorKind::Internal,
        }
    }
}

impl QueryError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            QueryError::Syntax { .. }
            | QueryError::Limit { .. }
            | QueryError::BadValue { .. }
            | QueryError::Invalid(_)
            | QueryError::Arrow(_) => ErrorKind::BadStatement,
            QueryError::Unsupported(_) => ErrorKind::Unsupported,
            QueryError::Timeout { .. } => ErrorKind::TimedOut,
            QueryError::MemoryLimit { .. } => ErrorKind::TryLater,
            QueryError::DataFusion(e) => match e.find_root() {
                DataFusionError::SQL(..)
                | DataFusionError::Plan(_)
                | DataFusionError::SchemaError(..)
                | DataFusionError::NotImplemented(_) => ErrorKind::BadStatement,
                DataFusionError::ResourcesExhausted(_) => ErrorKind::TryLater,
                _ => ErrorKind::Internal,
            },
            QueryError::Engine(e) => ErrorKind::of_engine(e),
        }
    }

    pub fn syntax(source: &str, offset: usize, message: impl Into<String>) -> QueryError {
        let (line, column) = crate::sql::lexer::line_col(source, offset);
        QueryError::Syntax { line, column, message: message.into() }
    }
}
