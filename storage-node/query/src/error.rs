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

    #[error("{0}")]
    Invalid(String),
}

impl From<DataFusionError> for QueryError {
    fn from(e: DataFusionError) -> Self {
        match e {
            DataFusionError::External(inner) => match inner.downcast::<EngineError>() {
                Ok(engine) => QueryError::Engine(*engine),
                Err(other) => QueryError::DataFusion(Box::new(DataFusionError::External(other))),
            },
            other => QueryError::DataFusion(Box::new(other)),
        }
    }
}

impl QueryError {
    pub fn syntax(source: &str, offset: usize, message: impl Into<String>) -> QueryError {
        let (line, column) = crate::sql::lexer::line_col(source, offset);
        QueryError::Syntax { line, column, message: message.into() }
    }
}
