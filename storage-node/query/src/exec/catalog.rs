//! The engine's catalog as one statement's plan sees it: schema `default` with the tables
//! (and the FINAL and `_part` scans of them the statement names), schema `system`
//! ([`super::system`]), and the `numbers` table function.
//!
//! A catalog is made for each statement, with that statement's settings: two sessions
//! planning at once, or two statements of one session, never see each other's.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, ScalarValue};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::progress::ReadProgress;
use mergestream_engine::Catalog;

use super::provider::{EngineTableProvider, ScanMode};
use crate::sql::rewrite::TableScan;

/// What one statement's plan resolves its tables with.
#[derive(Debug, Default, Clone)]
pub struct StatementScope {
    /// `do_not_merge_across_partitions_select_final`.
    pub final_within_partitions: bool,
    /// `select_sequential_consistency`: replicated tables show only what reached its quorum.
    pub sequential_consistency: bool,
    /// Where the statement's scans count what they read.
    pub progress: Option<Arc<ReadProgress>>,
    /// The FINAL and `_part` scans the statement's SQL names.
    pub scans: Vec<TableScan>,
}

pub struct EngineCatalog {
    pub catalog: Arc<Catalog>,
    pub scope: Arc<StatementScope>,
}

impl std::fmt::Debug for EngineCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCatalog")
    }
}

impl CatalogProvider for EngineCatalog {
    fn schema_names(&self) -> Vec<String> {
        vec![DATABASE.to_string(), "system".to_string()]
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        match name {
            DATABASE => Some(Arc::new(TablesSchema { catalog: self.catalog.clone(), scope: self.scope.clone() })),
            "system" => Some(Arc::new(super::system::SystemSchema { catalog: self.catalog.clone() })),
            _ => None,
        }
    }
}

struct TablesSchema {
    catalog: Arc<Catalog>,
    scope: Arc<StatementScope>,
}

impl std::fmt::Debug for TablesSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TablesSchema")
    }
}

#[async_trait]
impl SchemaProvider for TablesSchema {
    fn table_names(&self) -> Vec<String> {
        self.catalog.tables().iter().map(|t| t.name().to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let scope = &self.scope;
        let (base, mode) = match scope.scans.iter().find(|s| s.name == name) {
            Some(scan) if scan.final_merge => (
                scan.table.as_str(),
                ScanMode::Final {
                    within_partitions: scope.final_within_partitions,
                    with_part_column: scan.part_column,
                },
            ),
            Some(scan) => (scan.table.as_str(), ScanMode::WithPartColumn),
            None => (name, ScanMode::Plain),
        };
        let table = match self.catalog.table(base) {
            Ok(table) => table,
            // The statement's own FINAL or `_part` scan of a missing table.
            Err(e) if base != name => return Err(DataFusionError::External(Box::new(e))),
            // Maybe not a table at all: DataFusion asks for a table function's name too.
            Err(_) => return Ok(None),
        };
        let visible = match self.catalog.replica(base).filter(|_| scope.sequential_consistency) {
            Some(replica) => {
                Some(replica.visible_blocks(&table).await.map_err(|e| DataFusionError::External(e.into()))?)
            }
            None => None,
        };
        Ok(Some(Arc::new(
            EngineTableProvider::new(table, mode).with_visible_blocks(visible).with_progress(scope.progress.clone()),
        )))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.scope.scans.iter().any(|s| s.name == name) || self.catalog.table(name).is_ok()
    }
}

/// A table as a client's catalog browser lists it (Flight SQL's GetTables, GetPrimaryKeys).
#[derive(Debug, Clone)]
pub struct TableListing {
    /// The database: `default` or `system`.
    pub schema: String,
    pub name: String,
    /// `TABLE`, or `SYSTEM TABLE` for the tables of `system`.
    pub kind: &'static str,
    /// The columns as a query of `SELECT *` returns them, each with its ClickHouse type in
    /// the field metadata where the table has one.
    pub columns: SchemaRef,
    /// ClickHouse's primary key (the sorting key unless PRIMARY KEY says otherwise); none for
    /// system tables.
    pub primary_key: Vec<String>,
}

/// Every table of every schema, as a statement would see them, by schema then name.
pub async fn list_tables(catalog: &Arc<Catalog>) -> DfResult<Vec<TableListing>> {
    let engine = EngineCatalog { catalog: catalog.clone(), scope: Arc::new(StatementScope::default()) };
    let mut listings = Vec::new();
    for schema_name in engine.schema_names() {
        let Some(schema) = engine.schema(&schema_name) else { continue };
        let mut names = schema.table_names();
        names.sort();
        for name in names {
            let Some(provider) = schema.table(&name).await? else { continue };
            let primary_key = match catalog.table(&name) {
                Ok(table) if schema_name == DATABASE => {
                    let def = table.def();
                    if def.primary_key.is_empty() {
                        def.order_by.clone()
                    } else {
                        def.primary_key.clone()
                    }
                }
                _ => Vec::new(),
            };
            let kind = if schema_name == DATABASE { "TABLE" } else { "SYSTEM TABLE" };
            listings.push(TableListing {
                schema: schema_name.clone(),
                name,
                kind,
                columns: provider.schema(),
                primary_key,
            });
        }
    }
    Ok(listings)
}

/// `numbers(N)` and `numbers(offset, N)`: a `number UInt64` column, generated as it is read
/// (`numbers(1e12) LIMIT 3` makes three rows, not a trillion held in memory) and counted into
/// the session's progress, as ClickHouse counts the rows it reads from it.
#[derive(Debug, Default)]
pub struct NumbersFunction {
    pub progress: Option<Arc<ReadProgress>>,
}

const NUMBERS_BATCH: u64 = 65_536;

impl TableFunctionImpl for NumbersFunction {
    fn call(&self, args: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let literal = |e: &Expr| -> DfResult<u64> {
            match e {
                Expr::Literal(v, _) => match v.cast_to(&ArrowType::UInt64)? {
                    ScalarValue::UInt64(Some(n)) => Ok(n),
                    _ => plan_err!("numbers() takes non-negative integer literals"),
                },
                _ => plan_err!("numbers() takes non-negative integer literals"),
            }
        };
        let (start, count) = match args {
            [n] => (0, literal(n)?),
            [offset, n] => (literal(offset)?, literal(n)?),
            _ => return plan_err!("numbers() takes 1 or 2 arguments"),
        };
        let schema = Arc::new(Schema::new(vec![Field::new("number", ArrowType::UInt64, false)]));
        let numbers = NumbersPartition {
            schema: schema.clone(),
            start,
            end: start.saturating_add(count),
            progress: self.progress.clone(),
        };
        // One partition, in order: `INSERT … SELECT … FROM numbers(N)` inserts rows in the order
        // of `number`, as ClickHouse does.
        Ok(Arc::new(StreamingTable::try_new(schema, vec![Arc::new(numbers)])?))
    }
}

#[derive(Debug)]
struct NumbersPartition {
    schema: SchemaRef,
    start: u64,
    end: u64,
    progress: Option<Arc<ReadProgress>>,
}

impl PartitionStream for NumbersPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (schema, end, progress) = (self.schema.clone(), self.end, self.progress.clone());
        let batches = (self.start..end).step_by(NUMBERS_BATCH as usize).map(move |first| {
            let column: ArrayRef = Arc::new(UInt64Array::from_iter_values(first..end.min(first + NUMBERS_BATCH)));
            let batch = RecordBatch::try_new(schema.clone(), vec![column])?;
            if let Some(progress) = &progress {
                progress.add(&batch);
            }
            Ok(batch)
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), futures::stream::iter(batches)))
    }
}
