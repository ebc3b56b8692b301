//! Schema `system`: `parts`, `replicas`, `replication_queue` and `zookeeper`, made when a
//! query names them, with ClickHouse's column names and types.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Int32Array, Int64Array, ListBuilder, MapBuilder, RecordBatch, StringArray, StringBuilder,
    TimestampSecondArray, UInt32Array, UInt64Array, UInt8Array, UInt8Builder,
};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::replica::{QueueEntryStatus, ReplicaStatus};
use mergestream_engine::{Catalog, EngineError};

const TABLES: &[&str] = &["parts", "replicas", "replication_queue", "zookeeper"];

pub struct SystemSchema {
    pub catalog: Arc<Catalog>,
}

impl std::fmt::Debug for SystemSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemSchema")
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|t| t.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        Ok(Some(match name {
            "parts" => Arc::new(system_parts(&self.catalog)?),
            "replicas" => Arc::new(system_replicas(&self.catalog).await?),
            "replication_queue" => Arc::new(system_replication_queue(&self.catalog).await?),
            "zookeeper" => Arc::new(SystemZooKeeper { catalog: self.catalog.clone() }),
            _ => return Ok(None),
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}

fn string(name: &str) -> Field {
    Field::new(name, ArrowType::Utf8, false)
}

fn date_time(name: &str) -> Field {
    Field::new(name, ArrowType::Timestamp(TimeUnit::Second, None), false)
}

fn strings<T>(rows: &[T], f: impl Fn(&T) -> String) -> ArrayRef {
    Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
}

fn flags<T>(rows: &[T], f: impl Fn(&T) -> bool) -> ArrayRef {
    Arc::new(UInt8Array::from(rows.iter().map(|r| f(r) as u8).collect::<Vec<_>>()))
}

fn counts<T>(rows: &[T], f: impl Fn(&T) -> u32) -> ArrayRef {
    Arc::new(UInt32Array::from(rows.iter().map(f).collect::<Vec<_>>()))
}

fn times<T>(rows: &[T], f: impl Fn(&T) -> i64) -> ArrayRef {
    Arc::new(TimestampSecondArray::from(rows.iter().map(f).collect::<Vec<_>>()))
}

fn table_of(schema: Vec<Field>, columns: Vec<ArrayRef>) -> DfResult<MemTable> {
    let schema = Arc::new(Schema::new(schema));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    MemTable::try_new(schema, vec![vec![batch]])
}

fn engine_error(e: EngineError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// `system.parts`.
fn system_parts(catalog: &Catalog) -> DfResult<MemTable> {
    let mut rows = Vec::new();
    for table in catalog.tables() {
        for part in table.parts_info() {
            rows.push((table.name().to_string(), part));
        }
    }
    table_of(
        vec![
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
            date_time("modification_time"),
        ],
        vec![
            strings(&rows, |_| DATABASE.to_string()),
            strings(&rows, |r| r.0.clone()),
            strings(&rows, |r| r.1.partition.clone()),
            strings(&rows, |r| r.1.partition_id.clone()),
            strings(&rows, |r| r.1.name.clone()),
            flags(&rows, |r| r.1.active),
            Arc::new(UInt64Array::from(rows.iter().map(|r| r.1.rows).collect::<Vec<_>>())),
            counts(&rows, |r| r.1.level),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.1.min_block as i64).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.1.max_block as i64).collect::<Vec<_>>())),
            Arc::new(UInt64Array::from(rows.iter().map(|r| r.1.bytes_on_disk).collect::<Vec<_>>())),
            times(&rows, |r| r.1.modification_time),
        ],
    )
}

/// `system.replicas`: one row per replicated table of this node.
async fn system_replicas(catalog: &Catalog) -> DfResult<MemTable> {
    let mut rows: Vec<(String, String, ReplicaStatus)> = Vec::new();
    for table in catalog.tables() {
        if let Some(replica) = catalog.replica(table.name()) {
            let status = replica.status().await.map_err(engine_error)?;
            rows.push((table.name().to_string(), table.def().engine_name(), status));
        }
    }
    let mut active = MapBuilder::new(None, StringBuilder::new(), UInt8Builder::new());
    for (_, _, status) in &rows {
        for (replica, is_active) in &status.replica_is_active {
            active.keys().append_value(replica);
            active.values().append_value(*is_active as u8);
        }
        active.append(true)?;
    }
    let active = active.finish();
    let active_field = Field::new("replica_is_active", active.data_type().clone(), false);
    let s = |f: fn(&ReplicaStatus) -> String| strings(&rows, move |r| f(&r.2));
    let b = |f: fn(&ReplicaStatus) -> bool| flags(&rows, move |r| f(&r.2));
    let n = |f: fn(&ReplicaStatus) -> u32| counts(&rows, move |r| f(&r.2));
    let t = |f: fn(&ReplicaStatus) -> i64| times(&rows, move |r| f(&r.2));
    let u64s = |f: fn(&ReplicaStatus) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from(rows.iter().map(|r| f(&r.2)).collect::<Vec<_>>()))
    };
    table_of(
        vec![
            string("database"),
            string("table"),
            string("engine"),
            Field::new("is_leader", ArrowType::UInt8, false),
            Field::new("can_become_leader", ArrowType::UInt8, false),
            Field::new("is_readonly", ArrowType::UInt8, false),
            Field::new("is_session_expired", ArrowType::UInt8, false),
            string("zookeeper_path"),
            string("replica_name"),
            string("replica_path"),
            Field::new("queue_size", ArrowType::UInt32, false),
            Field::new("inserts_in_queue", ArrowType::UInt32, false),
            Field::new("merges_in_queue", ArrowType::UInt32, false),
            Field::new("part_mutations_in_queue", ArrowType::UInt32, false),
            date_time("queue_oldest_time"),
            date_time("inserts_oldest_time"),
            date_time("merges_oldest_time"),
            string("oldest_part_to_get"),
            string("oldest_part_to_merge_to"),
            Field::new("log_max_index", ArrowType::UInt64, false),
            Field::new("log_pointer", ArrowType::UInt64, false),
            date_time("last_queue_update"),
            Field::new("absolute_delay", ArrowType::UInt64, false),
            Field::new("total_replicas", ArrowType::UInt32, false),
            Field::new("active_replicas", ArrowType::UInt32, false),
            string("last_queue_update_exception"),
            string("zookeeper_exception"),
            active_field,
        ],
        vec![
            strings(&rows, |_| DATABASE.to_string()),
            strings(&rows, |r| r.0.clone()),
            strings(&rows, |r| r.1.clone()),
            b(|s| s.is_leader),
            b(|_| true),
            b(|s| s.is_readonly),
            b(|s| s.is_session_expired),
            s(|s| s.zookeeper_path.clone()),
            s(|s| s.replica_name.clone()),
            s(|s| s.replica_path.clone()),
            n(|s| s.queue_size),
            n(|s| s.inserts_in_queue),
            n(|s| s.merges_in_queue),
            n(|_| 0),
            t(|s| s.queue_oldest_time),
            t(|s| s.inserts_oldest_time),
            t(|s| s.merges_oldest_time),
            s(|s| s.oldest_part_to_get.clone()),
            s(|s| s.oldest_part_to_merge_to.clone()),
            u64s(|s| s.log_max_index),
            u64s(|s| s.log_pointer),
            t(|s| s.last_queue_update),
            u64s(|s| s.absolute_delay),
            n(|s| s.total_replicas),
            n(|s| s.active_replicas),
            s(|s| s.last_queue_update_exception.clone()),
            s(|s| s.zookeeper_exception.clone()),
            Arc::new(active),
        ],
    )
}

/// `system.replication_queue`: the queued entries of every replicated table of this node.
async fn system_replication_queue(catalog: &Catalog) -> DfResult<MemTable> {
    let mut rows: Vec<(String, String, QueueEntryStatus)> = Vec::new();
    for table in catalog.tables() {
        let Some(replica) = catalog.replica(table.name()) else { continue };
        // A replica without a session shows no queue rather than failing the whole query.
        let Ok(entries) = replica.queue().await else { continue };
        let name = replica.status().await.map(|s| s.replica_name).unwrap_or_default();
        rows.extend(entries.into_iter().map(|e| (table.name().to_string(), name.clone(), e)));
    }
    let mut parts_to_merge = ListBuilder::new(StringBuilder::new());
    for (_, _, entry) in &rows {
        for part in &entry.parts_to_merge {
            parts_to_merge.values().append_value(part);
        }
        parts_to_merge.append(true);
    }
    let parts_to_merge = parts_to_merge.finish();
    let parts_field = Field::new("parts_to_merge", parts_to_merge.data_type().clone(), false);
    let s = |f: fn(&QueueEntryStatus) -> String| strings(&rows, move |r| f(&r.2));
    let n = |f: fn(&QueueEntryStatus) -> u32| counts(&rows, move |r| f(&r.2));
    let t = |f: fn(&QueueEntryStatus) -> i64| times(&rows, move |r| f(&r.2));
    table_of(
        vec![
            string("database"),
            string("table"),
            string("replica_name"),
            Field::new("position", ArrowType::UInt32, false),
            string("node_name"),
            string("type"),
            date_time("create_time"),
            Field::new("required_quorum", ArrowType::UInt32, false),
            string("source_replica"),
            string("new_part_name"),
            parts_field,
            Field::new("is_detach", ArrowType::UInt8, false),
            Field::new("is_currently_executing", ArrowType::UInt8, false),
            Field::new("num_tries", ArrowType::UInt32, false),
            string("last_exception"),
            date_time("last_exception_time"),
            date_time("last_attempt_time"),
            Field::new("num_postponed", ArrowType::UInt32, false),
            string("postpone_reason"),
            date_time("last_postpone_time"),
            string("merge_type"),
        ],
        vec![
            strings(&rows, |_| DATABASE.to_string()),
            strings(&rows, |r| r.0.clone()),
            strings(&rows, |r| r.1.clone()),
            n(|e| e.position),
            s(|e| e.node_name.clone()),
            s(|e| e.kind.clone()),
            t(|e| e.create_time),
            n(|_| 0),
            s(|e| e.source_replica.clone()),
            s(|e| e.new_part_name.clone()),
            Arc::new(parts_to_merge),
            flags(&rows, |_| false),
            flags(&rows, |r| r.2.is_currently_executing),
            n(|e| e.num_tries),
            s(|e| e.last_exception.clone()),
            t(|e| e.last_exception_time),
            t(|e| e.last_attempt_time),
            n(|e| e.num_postponed),
            s(|e| e.postpone_reason.clone()),
            t(|e| e.last_postpone_time),
            strings(&rows, |r| if r.2.kind == "MERGE_PARTS" { "Regular".into() } else { String::new() }),
        ],
    )
}

/// `system.zookeeper`: the children of the paths a query's `path = '…'` or `path IN (…)`
/// names, read when the query is planned.
struct SystemZooKeeper {
    catalog: Arc<Catalog>,
}

impl std::fmt::Debug for SystemZooKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemZooKeeper")
    }
}

fn zookeeper_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        string("name"),
        string("value"),
        string("zookeeperName"),
        Field::new("czxid", ArrowType::Int64, false),
        Field::new("mzxid", ArrowType::Int64, false),
        date_time("ctime"),
        date_time("mtime"),
        Field::new("version", ArrowType::Int32, false),
        Field::new("cversion", ArrowType::Int32, false),
        Field::new("aversion", ArrowType::Int32, false),
        Field::new("ephemeralOwner", ArrowType::Int64, false),
        Field::new("dataLength", ArrowType::Int32, false),
        Field::new("numChildren", ArrowType::Int32, false),
        Field::new("pzxid", ArrowType::Int64, false),
        string("path"),
    ]))
}

/// The paths a filter names: `path = 'x'`, `'x' = path`, `path IN ('x', 'y')`.
fn filter_paths(filter: &Expr) -> Option<Vec<String>> {
    let is_path = |e: &Expr| matches!(e, Expr::Column(c) if c.name == "path");
    let text = |e: &Expr| match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Some(s.clone()),
        _ => None,
    };
    match filter {
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Eq, right }) => {
            if is_path(left) {
                text(right).map(|p| vec![p])
            } else if is_path(right) {
                text(left).map(|p| vec![p])
            } else {
                None
            }
        }
        // The planner turns a short `IN` list into equalities joined by OR.
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Or, right }) => {
            let mut paths = filter_paths(left)?;
            paths.extend(filter_paths(right)?);
            Some(paths)
        }
        Expr::InList(list) if !list.negated && is_path(&list.expr) => list.list.iter().map(text).collect(),
        _ => None,
    }
}

#[async_trait]
impl TableProvider for SystemZooKeeper {
    fn schema(&self) -> SchemaRef {
        zookeeper_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Inexact: the filter still runs on the rows, whose `path` is the one asked for.
        Ok(filters
            .iter()
            .map(|f| match filter_paths(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut paths: Vec<String> = filters.iter().filter_map(filter_paths).flatten().collect();
        paths.sort();
        paths.dedup();
        if paths.is_empty() {
            return Err(engine_error(EngineError::Replication {
                code: "BAD_ARGUMENTS",
                message: "SELECT from system.zookeeper table must contain condition like path = 'path' or path IN \
                          ('path1','path2'...) in WHERE clause"
                    .into(),
            }));
        }
        let mut nodes = Vec::new();
        for path in &paths {
            nodes.extend(self.catalog.coordinator_children(path).await.map_err(engine_error)?);
        }
        let i64s = |f: fn(&mergestream_engine::replica::CoordinatorNode) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from(nodes.iter().map(f).collect::<Vec<_>>()))
        };
        let i32s = |f: fn(&mergestream_engine::replica::CoordinatorNode) -> i32| -> ArrayRef {
            Arc::new(Int32Array::from(nodes.iter().map(f).collect::<Vec<_>>()))
        };
        let columns: Vec<ArrayRef> = vec![
            strings(&nodes, |n| n.name.clone()),
            strings(&nodes, |n| String::from_utf8_lossy(&n.value).into_owned()),
            strings(&nodes, |_| "default".to_string()),
            i64s(|n| n.czxid),
            i64s(|n| n.mzxid),
            times(&nodes, |n| n.ctime / 1000),
            times(&nodes, |n| n.mtime / 1000),
            i32s(|n| n.version),
            i32s(|n| n.cversion),
            i32s(|n| n.aversion),
            i64s(|n| n.ephemeral_owner),
            i32s(|n| n.data_length),
            i32s(|n| n.num_children),
            i64s(|n| n.pzxid),
            strings(&nodes, |n| n.path.clone()),
        ];
        let schema = zookeeper_schema();
        let batch = RecordBatch::try_new(schema.clone(), columns)?;
        MemTable::try_new(schema, vec![vec![batch]])?.scan(state, projection, &[], limit).await
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::{col, lit};

    use super::*;

    #[test]
    fn the_path_conditions_are_found() {
        assert_eq!(filter_paths(&col("path").eq(lit("/a"))), Some(vec!["/a".to_string()]));
        assert_eq!(filter_paths(&lit("/a").eq(col("path"))), Some(vec!["/a".to_string()]));
        assert_eq!(
            filter_paths(&col("path").in_list(vec![lit("/a"), lit("/b")], false)),
            Some(vec!["/a".to_string(), "/b".to_string()])
        );
        assert_eq!(
            filter_paths(&col("path").eq(lit("/a")).or(col("path").eq(lit("/b")))),
            Some(vec!["/a".to_string(), "/b".to_string()])
        );
        assert_eq!(filter_paths(&col("path").eq(lit("/a")).or(col("name").eq(lit("/b")))), None);
        assert_eq!(filter_paths(&col("path").in_list(vec![lit("/a")], true)), None);
        assert_eq!(filter_paths(&col("name").eq(lit("/a"))), None);
        assert_eq!(filter_paths(&col("path").like(lit("/a%"))), None);
    }
}
