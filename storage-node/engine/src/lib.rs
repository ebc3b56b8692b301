//! The MergeTree engine of mergestream: tables of immutable sorted parts, the merging
//! algorithms of the MergeTree family, background merges, OPTIMIZE and FINAL.
//!
//! The SQL front end (`mergestream-query`), the server, the ingestor and replication all call
//! into this crate; it knows nothing of SQL text.

pub mod aggregate;
pub mod block_on;
pub mod catalog;
pub mod commit;
pub mod error;
pub mod failpoint;
pub mod key_expr;
pub mod merge;
mod merge_pool;
pub mod metrics;
pub mod names;
pub mod part;
pub mod progress;
pub mod replica;
pub mod schema;
pub mod settings;
mod sip_hash;
pub mod table;
pub mod types;

pub use catalog::Catalog;
pub use error::{EngineError, Result};
pub use schema::{ColumnDef, EngineKind, TableDef};
pub use table::{
    InsertOptions, InsertSummary, OptimizeRequest, PreparedCommitError, PreparedInsert, PreparedRecord, ReadOptions,
    Table,
};
pub use types::ChType;
