//! The SQL front end of the storage node: ClickHouse-dialect statements parsed here, SELECT
//! executed by DataFusion over the engine's parts, results printed in ClickHouse's formats.

pub mod error;
pub mod exec;
pub mod format;
pub mod input;
pub mod session;
pub mod sql;

pub use error::{QueryError, Result};

/// The stack of every thread that parses, plans or runs a query. DataFusion walks and
/// evaluates expression trees recursively, and a statement that ClickHouse's limits let
/// through (see [`sql::limits`]) can be a tree some thousands of levels deep: a chain of
/// 16,000 `OR`ed conditions, which DataFusion's filter pushdown makes left-deep again, takes
/// tens of megabytes of stack in a debug build. The size is reserved, not used: pages are
/// only touched as deep as a query goes.
pub const QUERY_THREAD_STACK: usize = 256 << 20;
pub use format::OutputFormat;
pub use session::{Session, StatementError};
