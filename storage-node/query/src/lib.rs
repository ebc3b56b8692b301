//! The SQL front end of the storage node: ClickHouse-dialect statements parsed here, SELECT
//! executed by DataFusion over the engine's parts, results printed in ClickHouse's formats.

pub mod error;
pub mod exec;
pub mod format;
pub mod input;
pub mod session;
pub mod sql;

pub use error::{QueryError, Result};
pub use format::OutputFormat;
pub use session::{Session, StatementError};
