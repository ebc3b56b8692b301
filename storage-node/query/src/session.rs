//! Runs statements against the engine: DDL, inserts, OPTIMIZE and SYSTEM here, SELECT through
//! DataFusion.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType as ArrowType, Field, Schema};
use datafusion::execution::FunctionRegistry;
use datafusion::prelude::{SessionConfig, SessionContext};
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::commit::{Quorum, QuorumSize};
use mergestream_engine::progress::ReadProgress;
use mergestream_engine::replica::{ReplicaControl, ReplicatedWait, WaitFor};
use mergestream_engine::table::insert::InsertSummary;
use mergestream_engine::{Catalog, EngineError, InsertOptions, OptimizeRequest, Table};

use crate::error::{QueryError, Result};
use crate::exec::catalog::{EngineCatalog, NumbersFunction, PlanSettings};
use crate::exec::empty_aggregates::clickhouse_empty_results;
use crate::format::{write_result, OutputFormat};
use crate::input::{self, build_block, insert_columns};
use crate::sql::lexer::{line_col, tokenize, Token};
use crate::sql::limits::QueryLimits;
use crate::sql::rewrite::rewrite_select;
use crate::sql::statement::{parse_statement, Insert, InsertSource, PartitionSpec, ReplicationSwitch, Statement};

const CATALOG_NAME: &str = "mergestream";
/// ClickHouse's `max_insert_block_size`: an INSERT … SELECT makes a part per this many rows.
const MAX_INSERT_BLOCK_ROWS: usize = 1_048_449;

/// Session settings (`SET`, or `SETTINGS` on a query) that change what statements do.
const KNOWN_SETTINGS: &[&str] = &[
    "do_not_merge_across_partitions_select_final",
    "insert_deduplication_token",
    "insert_deduplicate",
    "max_insert_block_size",
    "max_threads",
    "optimize_on_insert",
    "async_insert",
    "wait_for_async_insert",
    "mutations_sync",
    "final",
    "receive_timeout",
    "insert_quorum",
    "insert_quorum_timeout",
    "insert_quorum_parallel",
    "select_sequential_consistency",
    "alter_sync",
    "replication_alter_partitions_sync",
    "replication_wait_for_inactive_replica_timeout",
];

/// ClickHouse's `replication_wait_for_inactive_replica_timeout` default, in seconds.
const DEFAULT_INACTIVE_REPLICA_TIMEOUT_SECS: i64 = 120;

/// ClickHouse's `insert_quorum_timeout` default, in milliseconds.
const DEFAULT_INSERT_QUORUM_TIMEOUT_MS: u64 = 600_000;

/// ClickHouse's `receive_timeout` default, in seconds: how long SYSTEM SYNC REPLICA waits.
const DEFAULT_RECEIVE_TIMEOUT_SECS: f64 = 300.0;

/// A failed statement of a script.
#[derive(Debug, thiserror::Error)]
#[error("statement {index} at {line}:{column} ({preview}): {error}")]
pub struct StatementError {
    pub index: usize,
    pub line: usize,
    pub column: usize,
    pub preview: String,
    pub error: QueryError,
}

pub struct Session {
    catalog: Arc<Catalog>,
    ctx: SessionContext,
    insert_ctx: SessionContext,
    plan_settings: Arc<Mutex<PlanSettings>>,
    settings: BTreeMap<String, String>,
    format: OutputFormat,
    /// What the running statement has read (reset as each statement starts).
    progress: Arc<ReadProgress>,
}

impl Session {
    pub fn new(catalog: Arc<Catalog>, format: OutputFormat) -> Session {
        let progress = Arc::new(ReadProgress::default());
        let plan_settings =
            Arc::new(Mutex::new(PlanSettings { progress: Some(progress.clone()), ..PlanSettings::default() }));
        let context = |partitions| {
            let mut config = SessionConfig::new()
                .with_default_catalog_and_schema(CATALOG_NAME, mergestream_engine::catalog::DATABASE)
                .with_create_default_catalog_and_schema(false)
                .with_information_schema(false)
                .with_target_partitions(partitions);
            // ClickHouse names are case-sensitive.
            config.options_mut().sql_parser.enable_ident_normalization = false;
            // DataFusion's parser stops at 50 levels; ClickHouse's limits (sql/limits.rs, checked
            // before) allow brackets 197 deep and calls nested 497 deep, which parse here on
            // the query threads' stacks (QUERY_THREAD_STACK).
            if let Ok(limit) =
                datafusion::common::config::ConfigNonZeroUsize::try_new(4 * QueryLimits::default().max_parser_depth)
            {
                config.options_mut().sql_parser.recursion_limit = limit;
            }
            let mut ctx = SessionContext::new_with_config(config);
            ctx.register_catalog(
                CATALOG_NAME,
                Arc::new(EngineCatalog { catalog: catalog.clone(), settings: plan_settings.clone() }),
            );
            ctx.register_udtf("numbers", Arc::new(NumbersFunction { progress: Some(progress.clone()) }));
            crate::exec::aggregate_states::register(&ctx);
            crate::exec::byte_extremes::register(&ctx);
            ctx.register_udf(datafusion::logical_expr::ScalarUDF::from(crate::exec::operators::IntDiv::default()));
            if let Err(e) = ctx.register_expr_planner(Arc::new(crate::exec::operators::ClickHouseOperators)) {
                tracing::warn!(error = %e, "cannot register ClickHouse operators");
            }
            ctx
        };
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        Session {
            ctx: context(threads),
            // The rows of INSERT … SELECT go in in the order the SELECT yields them, which
            // decides the engines' ties (the last row wins); one partition keeps that order.
            insert_ctx: context(1),
            catalog,
            plan_settings,
            settings: BTreeMap::new(),
            format,
            progress,
        }
    }

    /// What the running statement has read so far: a progress line samples it from another
    /// thread while the statement runs.
    pub fn progress(&self) -> Arc<ReadProgress> {
        self.progress.clone()
    }

    /// Runs the statements of `script` in order, handing each one's output to `output`; stops
    /// at the first failure.
    pub async fn run_script(
        &mut self,
        script: &str,
        mut output: impl FnMut(usize, &str, std::time::Duration),
    ) -> Result<(), StatementError> {
        let spans = crate::sql::lexer::split_statements(script).map_err(|error| StatementError {
            index: 1,
            line: 1,
            column: 1,
            preview: preview(script),
            error,
        })?;
        for (i, (start, end)) in spans.into_iter().enumerate() {
            let began = std::time::Instant::now();
            match self.execute(script, start, end).await {
                Ok(text) => output(i + 1, &text, began.elapsed()),
                Err(error) => {
                    let (line, column) = line_col(script, start);
                    return Err(StatementError {
                        index: i + 1,
                        line,
                        column,
                        preview: preview(&script[start..end]),
                        error,
                    });
                }
            }
        }
        Ok(())
    }

    /// Runs one statement, `script[start..end]`; returns what it prints.
    pub async fn execute(&mut self, script: &str, start: usize, end: usize) -> Result<String> {
        self.progress.reset();
        let mut tokens: Vec<Token> = tokenize(&script[start..end])?;
        for t in &mut tokens {
            t.start += start;
            t.end += start;
        }
        // The data of INSERT … FORMAT is not SQL: keep only the tokens up to the format name.
        if let Some(i) = tokens.iter().position(|t| t.is_word("FORMAT")) {
            if tokens.first().is_some_and(|t| t.is_word("INSERT")) && i + 1 < tokens.len() {
                tokens.truncate(i + 2);
            }
        }
        crate::sql::limits::check_statement(script, start, end, &tokens, &QueryLimits::default())?;
        let statement = parse_statement(script, &tokens, end)?;
        let mut out = String::new();
        match statement {
            Statement::CreateTable { def, if_not_exists } => {
                self.catalog.create_table_async(*def, if_not_exists).await?;
            }
            Statement::DropTable { name, if_exists } => self.catalog.drop_table_async(&name, if_exists).await?,
            Statement::ShowTables => {
                let names: Vec<String> = self.catalog.tables().iter().map(|t| t.name().to_string()).collect();
                let schema = Arc::new(Schema::new(vec![Field::new("name", ArrowType::Utf8, false)]));
                let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(names)) as ArrayRef])?;
                write_result(self.format, &schema, &[batch], &mut out);
            }
            Statement::Describe { table } => {
                let table = self.catalog.table(&table)?;
                let columns = &table.def().columns;
                let names = [
                    "name",
                    "type",
                    "default_type",
                    "default_expression",
                    "comment",
                    "codec_expression",
                    "ttl_expression",
                ];
                let schema = Arc::new(Schema::new(
                    names.iter().map(|n| Field::new(*n, ArrowType::Utf8, false)).collect::<Vec<_>>(),
                ));
                let defaults = &table.def().defaults;
                let mut arrays: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from(columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>())),
                    Arc::new(StringArray::from(columns.iter().map(|c| c.ty.to_string()).collect::<Vec<_>>())),
                    Arc::new(StringArray::from(
                        columns
                            .iter()
                            .map(|c| if defaults.contains_key(&c.name) { "DEFAULT" } else { "" })
                            .collect::<Vec<_>>(),
                    )),
                    Arc::new(StringArray::from(
                        columns.iter().map(|c| defaults.get(&c.name).cloned().unwrap_or_default()).collect::<Vec<_>>(),
                    )),
                ];
                for _ in 4..names.len() {
                    arrays.push(Arc::new(StringArray::from(vec![""; columns.len()])));
                }
                let batch = RecordBatch::try_new(schema.clone(), arrays)?;
                write_result(self.format, &schema, &[batch], &mut out);
            }
            Statement::Insert(insert) => self.insert(script, insert).await?,
            Statement::Select { start, end } => self.select(script, start, end, &mut out).await?,
            Statement::Optimize { table, partition, final_merge, cleanup, settings } => {
                for (name, _) in &settings {
                    check_setting(name)?;
                }
                let table = self.catalog.table(&table)?;
                let request = OptimizeRequest {
                    partition_id: partition.map(|p| partition_id(&p)),
                    final_merge,
                    cleanup,
                    progress: Some(self.progress.clone()),
                };
                match self.catalog.replica(table.name()) {
                    Some(replica) => replica.optimize(&table, &request, self.replicated_wait(&settings)?).await?,
                    None => {
                        let handle = table.clone();
                        blocking(move || handle.optimize(&request)).await?;
                        self.catalog.schedule_merges(&table);
                    }
                }
            }
            Statement::SystemMerges { table, stop } => {
                let tables = match table {
                    Some(name) => vec![self.catalog.table(&name)?],
                    None => self.catalog.tables(),
                };
                for table in tables {
                    if stop {
                        table.stop_merges();
                    } else {
                        table.start_merges();
                        self.catalog.schedule_merges(&table);
                    }
                }
            }
            Statement::SystemReplication { table, switch, stop } => {
                let replicas = match table {
                    Some(name) => vec![self.replica_of(&name)?],
                    None => self.catalog.tables().iter().filter_map(|t| self.catalog.replica(t.name())).collect(),
                };
                for replica in replicas {
                    match switch {
                        ReplicationSwitch::Fetches => replica.set_fetches(!stop),
                        ReplicationSwitch::Queues => replica.set_queue_execution(!stop),
                    }
                }
            }
            Statement::SyncReplica { table, mode } => {
                let replica = self.replica_of(&table)?;
                replica.sync(mode, self.receive_timeout(&[])?).await?;
            }
            Statement::RestartReplica { table } => self.replica_of(&table)?.restart().await?,
            Statement::RestoreReplica { table } => {
                let replica = self.replica_of(&table)?;
                replica.restore(&self.catalog.table(&table)?).await?;
            }
            Statement::Set { settings } => {
                for (name, value) in settings {
                    check_setting(&name)?;
                    self.settings.insert(name, value);
                }
            }
        }
        Ok(out)
    }

    fn column_names(&self, table: &str) -> Option<Vec<String>> {
        let table = self.catalog.table(table).ok()?;
        Some(table.def().columns.iter().map(|c| c.name.clone()).collect())
    }

    /// The replication of a replicated table; BAD_ARGUMENTS for any other.
    fn replica_of(&self, table: &str) -> Result<Arc<dyn ReplicaControl>> {
        self.catalog.table(table)?;
        self.catalog.replica(table).ok_or_else(|| {
            QueryError::Engine(EngineError::Replication {
                code: "BAD_ARGUMENTS",
                message: format!("Table {DATABASE}.{table} is not replicated"),
            })
        })
    }

    /// `insert_quorum` (a number, or 'auto' for a majority), with `insert_quorum_timeout`
    /// (ms) and `insert_quorum_parallel`; `None` when the insert waits for no quorum.
    fn insert_quorum(&self, overrides: &[(String, String)]) -> Result<Option<Quorum>> {
        let value = |name: &str| self.setting(overrides, name).map(|v| v.trim().trim_matches('\'').to_string());
        let size = match value("insert_quorum").as_deref() {
            None | Some("0") | Some("1") => return Ok(None),
            Some(v) if v.eq_ignore_ascii_case("auto") => QuorumSize::Majority,
            Some(v) => QuorumSize::Replicas(v.parse().map_err(|_| {
                QueryError::Invalid(format!("insert_quorum must be a number of replicas or 'auto', got '{v}'"))
            })?),
        };
        let timeout_ms = match value("insert_quorum_timeout") {
            None => DEFAULT_INSERT_QUORUM_TIMEOUT_MS,
            Some(v) => v.parse().map_err(|_| {
                QueryError::Invalid(format!("insert_quorum_timeout must be a number of milliseconds, got '{v}'"))
            })?,
        };
        let parallel = match value("insert_quorum_parallel").as_deref() {
            None | Some("1") | Some("true") => true,
            Some("0") | Some("false") => false,
            Some(v) => return Err(QueryError::Invalid(format!("insert_quorum_parallel must be 0 or 1, got '{v}'"))),
        };
        Ok(Some(Quorum { size, timeout: Duration::from_millis(timeout_ms), parallel }))
    }

    /// How an OPTIMIZE of a replicated table waits: `alter_sync` (or its old name
    /// `replication_alter_partitions_sync`), `receive_timeout` and
    /// `replication_wait_for_inactive_replica_timeout`.
    fn replicated_wait(&self, overrides: &[(String, String)]) -> Result<ReplicatedWait> {
        let sync = self
            .setting(overrides, "alter_sync")
            .or_else(|| self.setting(overrides, "replication_alter_partitions_sync"));
        let wait_for = match sync.as_deref().map(str::trim) {
            None | Some("1") => WaitFor::ThisReplica,
            Some("0") => WaitFor::Nobody,
            // 3 (active replicas only) is SharedMergeTree's; ReplicatedMergeTree treats it as 2.
            Some("2") | Some("3") => WaitFor::AllReplicas,
            Some(v) => return Err(QueryError::Invalid(format!("alter_sync must be 0, 1, 2 or 3, got '{v}'"))),
        };
        let inactive = match self.setting(overrides, "replication_wait_for_inactive_replica_timeout") {
            None => DEFAULT_INACTIVE_REPLICA_TIMEOUT_SECS,
            Some(v) => v.trim().parse().map_err(|_| {
                QueryError::Invalid(format!(
                    "replication_wait_for_inactive_replica_timeout must be a whole number of seconds, got '{v}'"
                ))
            })?,
        };
        Ok(ReplicatedWait {
            wait_for,
            timeout: self.receive_timeout(overrides)?,
            // Negative: as long as it takes.
            inactive_timeout: u64::try_from(inactive).ok().map(Duration::from_secs),
        })
    }

    fn receive_timeout(&self, overrides: &[(String, String)]) -> Result<Duration> {
        let Some(text) = self.setting(overrides, "receive_timeout") else {
            return Ok(Duration::from_secs_f64(DEFAULT_RECEIVE_TIMEOUT_SECS));
        };
        match text.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(Duration::from_secs_f64(secs)),
            _ => Err(QueryError::Invalid(format!("receive_timeout must be a number of seconds, got '{text}'"))),
        }
    }

    fn setting(&self, overrides: &[(String, String)], name: &str) -> Option<String> {
        overrides
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.settings.get(name).cloned())
    }

    async fn select(&mut self, script: &str, start: usize, end: usize, out: &mut String) -> Result<()> {
        let rewritten = rewrite_select(script, start, end, &|t| self.column_names(t))?;
        for (name, _) in &rewritten.settings {
            check_setting(name)?;
        }
        let within = self
            .setting(&rewritten.settings, "do_not_merge_across_partitions_select_final")
            .is_some_and(|v| v == "1" || v == "true");
        let consistent =
            self.setting(&rewritten.settings, "select_sequential_consistency").is_some_and(|v| v == "1" || v == "true");
        if let Ok(mut settings) = self.plan_settings.lock() {
            settings.final_within_partitions = within;
            settings.sequential_consistency = consistent;
        }
        let batches = self.query(&self.ctx, &rewritten.sql).await?;
        let format = match &rewritten.format {
            Some(name) => OutputFormat::parse(name)?,
            None => self.format,
        };
        let schema = batches.0;
        write_result(format, &schema, &batches.1, out);
        Ok(())
    }

    async fn query(&self, ctx: &SessionContext, sql: &str) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        let plan = ctx.sql(sql).await?.into_unoptimized_plan();
        let frame = ctx.execute_logical_plan(clickhouse_empty_results(plan)?).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let batches = frame.collect().await?;
        Ok((schema, batches))
    }

    async fn insert(&mut self, script: &str, insert: Insert) -> Result<()> {
        let table = self.catalog.table(&insert.table)?;
        for (name, _) in &insert.settings {
            check_setting(name)?;
        }
        let deduplicate = self.setting(&insert.settings, "insert_deduplicate").is_none_or(|v| v != "0");
        let options = InsertOptions {
            deduplication_token: self.setting(&insert.settings, "insert_deduplication_token").filter(|_| deduplicate),
            skip_deduplication: !deduplicate,
            quorum: self.insert_quorum(&insert.settings)?,
        };
        let columns = insert_columns(&table, insert.columns.as_deref())?;
        let blocks = match insert.source {
            InsertSource::Values { start, end } => {
                vec![build_block(&table, input::parse_values(script, start, end, columns)?)?]
            }
            InsertSource::Format { format, start, end } => {
                if format != "JSONEachRow" {
                    return Err(QueryError::Unsupported(format!(
                        "input format {format}: only JSONEachRow is supported"
                    )));
                }
                let names: Vec<String> = columns.iter().map(|&c| table.def().columns[c].name.clone()).collect();
                vec![build_block(&table, input::parse_json_each_row(script, start, end, &names, columns)?)?]
            }
            InsertSource::Select { start, end } => {
                let rewritten = rewrite_select(script, start, end, &|t| self.column_names(t))?;
                let (_, batches) = self.query(&self.insert_ctx, &rewritten.sql).await?;
                select_blocks(&table, &columns, batches)?
            }
        };
        for block in blocks {
            let _summary: InsertSummary = table.insert_async(block, options.clone()).await?;
        }
        self.catalog.schedule_merges(&table);
        Ok(())
    }
}

fn check_setting(name: &str) -> Result<()> {
    if KNOWN_SETTINGS.contains(&name) {
        Ok(())
    } else {
        Err(QueryError::Invalid(format!("Unknown setting '{name}'")))
    }
}

/// The result of INSERT … SELECT as table blocks: columns matched by position and cast.
fn select_blocks(table: &Table, columns: &[usize], batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let schema = table.user_schema();
    let mut converted = Vec::with_capacity(batches.len());
    for batch in batches {
        if batch.num_columns() != columns.len() {
            return Err(QueryError::Invalid(format!(
                "Number of columns doesn't match: the SELECT returns {}, the INSERT expects {}",
                batch.num_columns(),
                columns.len()
            )));
        }
        // The columns the INSERT leaves out take their defaults: one block of them per batch,
        // built when the first such column comes.
        let mut defaults: Option<RecordBatch> = None;
        let mut arrays = Vec::with_capacity(schema.fields().len());
        for (i, field) in schema.fields().iter().enumerate() {
            let array = match columns.iter().position(|&c| c == i) {
                Some(at) => cast(batch.column(at), field.data_type())?,
                None => {
                    let block = match defaults.take() {
                        Some(block) => block,
                        None => build_block(
                            table,
                            input::RowsInput { columns: vec![], rows: vec![vec![]; batch.num_rows()] },
                        )?,
                    };
                    let column = block.column(i).clone();
                    defaults = Some(block);
                    column
                }
            };
            arrays.push(array);
        }
        converted.push(RecordBatch::try_new(schema.clone(), arrays)?);
    }
    if converted.is_empty() {
        return Ok(vec![]);
    }
    let all = concat_batches(&schema, &converted)?;
    let mut blocks = Vec::new();
    let mut offset = 0;
    while offset < all.num_rows() {
        let len = MAX_INSERT_BLOCK_ROWS.min(all.num_rows() - offset);
        blocks.push(all.slice(offset, len));
        offset += len;
    }
    Ok(blocks)
}

/// The partition id a PARTITION clause names.
fn partition_id(spec: &PartitionSpec) -> String {
    match spec {
        PartitionSpec::Id(id) => id.clone(),
        PartitionSpec::Value(values) if values.is_empty() => "all".to_string(),
        PartitionSpec::Value(values) => values
            .iter()
            .map(|v| match input::value::parse_date(v) {
                Some(_) if v.len() == 10 => v.replace('-', ""),
                _ => v.clone(),
            })
            .collect::<Vec<_>>()
            .join("-"),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> mergestream_engine::Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| QueryError::Invalid(format!("the statement's worker failed: {e}")))?
        .map_err(QueryError::from)
}

fn preview(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 80 {
        format!("{}…", flat.chars().take(80).collect::<String>())
    } else {
        flat
    }
}
