//! The engine's catalog as DataFusion sees it: schema `default` with the tables (and their
//! FINAL and `_part` variants), schema `system` with `parts`, and the `numbers` table function.

use std::sync::{Arc, Mutex};

use arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampSecondArray, UInt32Array, UInt64Array, UInt8Array,
};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::Expr;
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::Catalog;

use super::provider::{EngineTableProvider, ScanMode};
use crate::sql::rewrite::{FINAL_PREFIX, FINAL_VIRTUAL_PREFIX, VIRTUAL_PREFIX};

/// Settings of the query being planned that change how tables resolve.
#[derive(Debug, Default, Clone)]
pub struct PlanSettings {
    pub final_within_partitions: bool,
}

pub struct EngineCatalog {
    pub catalog: Arc<Catalog>,
    pub settings: Arc<Mutex<PlanSettings>>,
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
            DATABASE => Some(Arc::new(TablesSchema { catalog: self.catalog.clone(), settings: self.settings.clone() })),
            "system" => Some(Arc::new(SystemSchema { catalog: self.catalog.clone() })),
            _ => None,
        }
    }
}

struct TablesSchema {
    catalog: Arc<Catalog>,
    settings: Arc<Mutex<PlanSettings>>,
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
        let within = self.settings.lock().map(|s| s.final_within_partitions).unwrap_or(false);
        let (base, mode) = if let Some(base) = name.strip_prefix(FINAL_VIRTUAL_PREFIX) {
            (base, ScanMode::Final { within_partitions: within, with_part_column: true })
        } else if let Some(base) = name.strip_prefix(FINAL_PREFIX) {
            (base, ScanMode::Final { within_partitions: within, with_part_column: false })
        } else if let Some(base) = name.strip_prefix(VIRTUAL_PREFIX) {
            (base, ScanMode::WithPartColumn)
        } else {
            (name, ScanMode::Plain)
        };
        match self.catalog.table(base) {
            Ok(table) => Ok(Some(Arc::new(EngineTableProvider::new(table, mode)))),
            Err(_) => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.catalog.table(name).is_ok()
    }
}

struct SystemSchema {
    catalog: Arc<Catalog>,
}

impl std::fmt::Debug for SystemSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemSchema")
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        vec!["parts".to_string()]
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        match name {
            "parts" => Ok(Some(Arc::new(system_parts(&self.catalog)?))),
            _ => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        name == "parts"
    }
}

/// `system.parts`, read when a query names it.
fn system_parts(catalog: &Catalog) -> DfResult<MemTable> {
    let string = |name: &str| Field::new(name, ArrowType::Utf8, false);
    let schema = Arc::new(Schema::new(vec![
        string("database"),
        string("table"),
        string("partition"),
        string("partition_id"),
        string("name"),
        Field::new("active", ArrowType::UInt8, false),
        Field::new("rows", ArrowType::UInt64, false),
        Field::new("level", ArrowType::UInt32, false),
        Field::new("min_block_number", ArrowType::Int64, false),
        Field::new("max_block_number", ArrowType::Int64, false),
        Field::new("bytes_on_disk", ArrowType::UInt64, false),
        Field::new("modification_time", ArrowType::Timestamp(TimeUnit::Second, None), false),
    ]));
    let mut rows = Vec::new();
    for table in catalog.tables() {
        for part in table.parts_info() {
            rows.push((table.name().to_string(), part));
        }
    }
    let strings = |f: &dyn Fn(&(String, mergestream_engine::table::PartInfo)) -> String| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![DATABASE; rows.len()])),
        strings(&|r| r.0.clone()),
        strings(&|r| r.1.partition.clone()),
        strings(&|r| r.1.partition_id.clone()),
        strings(&|r| r.1.name.clone()),
        Arc::new(UInt8Array::from(rows.iter().map(|r| r.1.active as u8).collect::<Vec<_>>())),
        Arc::new(UInt64Array::from(rows.iter().map(|r| r.1.rows).collect::<Vec<_>>())),
        Arc::new(UInt32Array::from(rows.iter().map(|r| r.1.level).collect::<Vec<_>>())),
        Arc::new(Int64Array::from(rows.iter().map(|r| r.1.min_block as i64).collect::<Vec<_>>())),
        Arc::new(Int64Array::from(rows.iter().map(|r| r.1.max_block as i64).collect::<Vec<_>>())),
        Arc::new(UInt64Array::from(rows.iter().map(|r| r.1.bytes_on_disk).collect::<Vec<_>>())),
        Arc::new(TimestampSecondArray::from(rows.iter().map(|r| r.1.modification_time).collect::<Vec<_>>())),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// `numbers(N)` and `numbers(offset, N)`: a `number UInt64` column.
#[derive(Debug)]
pub struct NumbersFunction;

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
        let mut batches = Vec::new();
        let mut next = start;
        let end = start.saturating_add(count);
        while next < end {
            let stop = end.min(next + NUMBERS_BATCH);
            let column: ArrayRef = Arc::new(UInt64Array::from_iter_values(next..stop));
            batches.push(RecordBatch::try_new(schema.clone(), vec![column])?);
            next = stop;
        }
        // One partition, in order: `INSERT … SELECT … FROM numbers(N)` inserts rows in the order
        // of `number`, as ClickHouse does.
        Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
    }
}
