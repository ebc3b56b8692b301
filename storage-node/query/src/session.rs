//! Runs statements against the engine: DDL, inserts, OPTIMIZE and SYSTEM here, SELECT through
//! DataFusion.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use datafusion::catalog::{CatalogProviderList, MemoryCatalogProviderList};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::{FunctionRegistry, SendableRecordBatchStream};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};
use futures::TryStreamExt;
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::commit::{Quorum, QuorumSize};
use mergestream_engine::progress::ReadProgress;
use mergestream_engine::replica::{ReplicaControl, ReplicatedWait, WaitFor};
use mergestream_engine::table::insert::InsertSummary;
use mergestream_engine::{Catalog, EngineError, InsertOptions, OptimizeRequest, Table};

use crate::error::{QueryError, Result};
use crate::exec::catalog::{EngineCatalog, NumbersFunction, StatementScope};
use crate::exec::empty_aggregates::clickhouse_empty_results;
use crate::exec::limits::Limits;
use crate::format::{write_result, OutputFormat};
use crate::input::{self, build_block, insert_columns};
use crate::sql::lexer::{line_col, tokenize, Token};
use crate::sql::limits::QueryLimits;
use crate::sql::rewrite::{rewrite_select, TableScan};
use crate::sql::statement::{parse_statement, Insert, InsertSource, PartitionSpec, ReplicationSwitch, Statement};

/// The one catalog (ClickHouse has none; its databases are the catalog's schemas).
pub const CATALOG_NAME: &str = "mergestream";
/// ClickHouse's `max_insert_block_size`: an INSERT … SELECT makes a part per this many rows.
pub const MAX_INSERT_BLOCK_ROWS: usize = 1_048_449;

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
    "max_execution_time",
    "max_memory_usage",
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
    /// The functions, operators and options every statement plans with. Each statement plans
    /// in a copy of it with a catalog of its own (see [`Session::context`]).
    state: SessionState,
    /// The same on one partition: the rows of INSERT … SELECT go in in the order the SELECT
    /// yields them, which decides the engines' ties (the last row wins).
    insert_state: SessionState,
    settings: BTreeMap<String, String>,
    format: OutputFormat,
    /// What the running statement has read (reset as each statement starts).
    progress: Arc<ReadProgress>,
}

/// What a statement gives back.
pub enum Outcome {
    /// Rows (SELECT, SHOW TABLES, DESCRIBE), produced as the stream is read.
    Rows(Rows),
    /// A statement that changed something or nothing; how many rows it wrote, where it wrote
    /// rows (INSERT).
    Done { rows_written: Option<u64> },
}

pub struct Rows {
    pub schema: SchemaRef,
    pub stream: SendableRecordBatchStream,
    /// The statement's own `FORMAT`, if it has one.
    pub format: Option<OutputFormat>,
}

impl Session {
    pub fn new(catalog: Arc<Catalog>, format: OutputFormat) -> Session {
        let progress = Arc::new(ReadProgress::default());
        let state = |partitions| {
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
            ctx.register_udtf("numbers", Arc::new(NumbersFunction { progress: Some(progress.clone()) }));
            crate::exec::aggregate_states::register(&ctx);
            crate::exec::byte_extremes::register(&ctx);
            ctx.register_udf(datafusion::logical_expr::ScalarUDF::from(crate::exec::operators::IntDiv::default()));
            if let Err(e) = ctx.register_expr_planner(Arc::new(crate::exec::operators::ClickHouseOperators)) {
                tracing::warn!(error = %e, "cannot register ClickHouse operators");
            }
            ctx.state()
        };
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        Session { state: state(threads), insert_state: state(1), catalog, settings: BTreeMap::new(), format, progress }
    }

    /// Starts from settings a client's earlier statements `SET` (a Flight SQL session).
    pub fn with_settings(mut self, settings: BTreeMap<String, String>) -> Session {
        self.settings = settings;
        self
    }

    /// What `SET` statements have set so far.
    pub fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    /// A context to plan one statement in: its tables resolve with `scope` alone.
    fn context(&self, base: &SessionState, scope: StatementScope) -> SessionContext {
        self.context_within(base, scope, base.runtime_env().clone())
    }

    /// The same, with the runtime (memory pool) of the statement's limits.
    fn context_within(&self, base: &SessionState, scope: StatementScope, runtime: Arc<RuntimeEnv>) -> SessionContext {
        let catalogs = MemoryCatalogProviderList::new();
        catalogs.register_catalog(
            CATALOG_NAME.to_string(),
            Arc::new(EngineCatalog { catalog: self.catalog.clone(), scope: Arc::new(scope) }),
        );
        let state = SessionStateBuilder::new_from_existing(base.clone())
            .with_catalog_list(Arc::new(catalogs))
            .with_runtime_env(runtime)
            .build();
        SessionContext::new_with_state(state)
    }

    /// The scope of a statement with these `SETTINGS` and scans.
    fn scope(&self, overrides: &[(String, String)], scans: Vec<TableScan>) -> StatementScope {
        let enabled = |name| self.setting(overrides, name).is_some_and(|v| v == "1" || v == "true");
        StatementScope {
            final_within_partitions: enabled("do_not_merge_across_partitions_select_final"),
            sequential_consistency: enabled("select_sequential_consistency"),
            progress: Some(self.progress.clone()),
            scans,
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

    /// Runs one statement, `script[start..end]`; returns what it prints in the session's
    /// format (or the statement's own).
    pub async fn execute(&mut self, script: &str, start: usize, end: usize) -> Result<String> {
        let mut out = String::new();
        if let Outcome::Rows(rows) = self.plan(script, start, end).await? {
            let format = rows.format.unwrap_or(self.format);
            if format == OutputFormat::Null {
                // Nothing to print: the batches are dropped as they come, never collected.
                rows.stream.try_for_each(|_| async { Ok(()) }).await?;
                return Ok(out);
            }
            let batches: Vec<RecordBatch> = rows.stream.try_collect().await?;
            write_result(format, &rows.schema, &batches, &mut out);
        }
        Ok(out)
    }

    /// Runs one statement, `script[start..end]`, up to its rows: a statement that returns rows
    /// is planned and its stream started, and the rows are made as the stream is read.
    pub async fn plan(&mut self, script: &str, start: usize, end: usize) -> Result<Outcome> {
        self.progress.reset();
        let statement = parse(script, start, end)?;
        let mut rows_written = None;
        match statement {
            Statement::CreateTable { def, if_not_exists } => {
                self.catalog.create_table_async(*def, if_not_exists).await?;
            }
            Statement::DropTable { name, if_exists } => self.catalog.drop_table_async(&name, if_exists).await?,
            Statement::ShowTables => {
                let names: Vec<String> = self.catalog.tables().iter().map(|t| t.name().to_string()).collect();
                let batch =
                    RecordBatch::try_new(show_tables_schema(), vec![Arc::new(StringArray::from(names)) as ArrayRef])?;
                return Ok(Outcome::Rows(Rows::of(batch)));
            }
            Statement::Describe { table } => {
                let table = self.catalog.table(&table)?;
                let columns = &table.def().columns;
                let schema = describe_schema();
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
                for _ in 4..schema.fields().len() {
                    arrays.push(Arc::new(StringArray::from(vec![""; columns.len()])));
                }
                let batch = RecordBatch::try_new(schema.clone(), arrays)?;
                return Ok(Outcome::Rows(Rows::of(batch)));
            }
            Statement::Insert(insert) => rows_written = Some(self.insert(script, insert).await?),
            Statement::Select { start, end } => return Ok(Outcome::Rows(self.select(script, start, end).await?)),
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
        Ok(Outcome::Done { rows_written })
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

    /// What a statement returns, found without running it: the schema of its rows, or `None`
    /// for a statement that returns none (a client preparing a statement is told this).
    pub async fn describe(&self, script: &str, start: usize, end: usize) -> Result<Option<SchemaRef>> {
        Ok(match parse(script, start, end)? {
            Statement::ShowTables => Some(show_tables_schema()),
            Statement::Describe { table } => {
                self.catalog.table(&table)?;
                Some(describe_schema())
            }
            Statement::Select { start, end } => {
                let (frame, _, _) = self.select_frame(script, start, end).await?;
                Some(Arc::new(frame.schema().as_arrow().clone()))
            }
            _ => None,
        })
    }

    async fn select(&mut self, script: &str, start: usize, end: usize) -> Result<Rows> {
        let (frame, format, limits) = self.select_frame(script, start, end).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        Ok(Rows { schema, stream: limits.bound(frame.execute_stream().await?), format })
    }

    /// A SELECT planned, its own FORMAT, and the limits it runs under.
    async fn select_frame(
        &self,
        script: &str,
        start: usize,
        end: usize,
    ) -> Result<(DataFrame, Option<OutputFormat>, Limits)> {
        let rewritten = rewrite_select(script, start, end, &|t| self.column_names(t))?;
        for (name, _) in &rewritten.settings {
            check_setting(name)?;
        }
        let format = rewritten.format.as_deref().map(OutputFormat::parse).transpose()?;
        let limits = Limits::from_settings(|name| self.setting(&rewritten.settings, name))?;
        let runtime = limits.runtime(self.state.runtime_env())?;
        let ctx = self.context_within(&self.state, self.scope(&rewritten.settings, rewritten.scans), runtime);
        Ok((query(&ctx, &rewritten.sql).await?, format, limits))
    }

    /// Runs an INSERT; returns how many rows it wrote.
    async fn insert(&mut self, script: &str, insert: Insert) -> Result<u64> {
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
                let settings = [insert.settings.as_slice(), &rewritten.settings].concat();
                let ctx = self.context(&self.insert_state, self.scope(&settings, rewritten.scans));
                let batches = query(&ctx, &rewritten.sql).await?.collect().await?;
                select_blocks(&table, &columns, batches)?
            }
        };
        let mut rows = 0;
        for block in blocks {
            rows += block.num_rows() as u64;
            let _summary: InsertSummary = table.insert_async(block, options.clone()).await?;
        }
        self.catalog.schedule_merges(&table);
        Ok(rows)
    }
}

impl Rows {
    /// Rows that are all made already.
    fn of(batch: RecordBatch) -> Rows {
        let schema = batch.schema();
        let stream = RecordBatchStreamAdapter::new(schema.clone(), futures::stream::iter([Ok(batch)]));
        Rows { schema, stream: Box::pin(stream), format: None }
    }
}

/// Plans a SELECT (DataFusion's SQL of it).
async fn query(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    let plan = ctx.sql(sql).await?.into_unoptimized_plan();
    Ok(ctx.execute_logical_plan(clickhouse_empty_results(plan)?).await?)
}

/// Parses the statement `script[start..end]`, within ClickHouse's query limits.
fn parse(script: &str, start: usize, end: usize) -> Result<Statement> {
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
    parse_statement(script, &tokens, end)
}

/// The one statement of `sql` (a trailing `;` allowed), as `start..end`: for a client that
/// sends statements one at a time.
pub fn only_statement(sql: &str) -> Result<(usize, usize)> {
    match crate::sql::lexer::split_statements(sql)?.as_slice() {
        [span] => Ok(*span),
        [] => Err(QueryError::Invalid("Empty query".into())),
        [_, (start, _), ..] => {
            let (line, column) = line_col(sql, *start);
            Err(QueryError::Invalid(format!(
                "Multi-statements are not allowed: a second statement starts at {line}:{column}"
            )))
        }
    }
}

fn show_tables_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("name", ArrowType::Utf8, false)]))
}

fn describe_schema() -> SchemaRef {
    let names = ["name", "type", "default_type", "default_expression", "comment", "codec_expression", "ttl_expression"];
    Arc::new(Schema::new(names.iter().map(|n| Field::new(*n, ArrowType::Utf8, false)).collect::<Vec<_>>()))
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

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    async fn run(session: &mut Session, sql: &str) -> String {
        let mut out = String::new();
        session.run_script(sql, |_, text, _| out.push_str(text)).await.expect(sql);
        out
    }

    fn session(dir: &std::path::Path) -> Session {
        Session::new(Arc::new(Catalog::open(dir, 0).expect("catalog")), OutputFormat::Tsv)
    }

    #[tokio::test]
    async fn format_null_runs_the_query_and_prints_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = session(dir.path());
        assert_eq!(run(&mut s, "SELECT number FROM numbers(100000) FORMAT Null").await, "");
        let endless = "SELECT number FROM numbers(100000000000) SETTINGS max_execution_time = 0.2 FORMAT Null";
        let failing = s.run_script(endless, |_, _, _| {}).await.expect_err("past its time");
        assert!(failing.to_string().contains("TIMEOUT_EXCEEDED"), "the rows are made: {failing}");
    }

    #[tokio::test]
    async fn one_statement_reads_a_table_plainly_and_with_final() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = session(dir.path());
        run(&mut s, "CREATE TABLE t (k UInt64, v UInt64) ENGINE = ReplacingMergeTree ORDER BY k").await;
        run(&mut s, "SYSTEM STOP MERGES t; INSERT INTO t VALUES (1, 1); INSERT INTO t VALUES (1, 2)").await;
        let both = "SELECT 'plain', count() FROM t UNION ALL SELECT 'final', count() FROM t FINAL ORDER BY 1";
        assert_eq!(run(&mut s, both).await, "final\t1\nplain\t2\n");
        // A table named like a FINAL scan is an ordinary table: only the statement's own FINAL
        // makes a scan of that name.
        run(&mut s, "CREATE TABLE `t FINAL` (k UInt64) ENGINE = MergeTree ORDER BY k").await;
        assert_eq!(run(&mut s, "SELECT count() FROM `t FINAL`").await, "0\n");
    }

    #[tokio::test]
    async fn a_query_streams_its_rows_as_they_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = session(dir.path());
        let sql = "SELECT number FROM numbers(1000000000000)";
        let Outcome::Rows(rows) = s.plan(sql, 0, sql.len()).await.expect("plan") else { panic!("no rows") };
        assert_eq!(rows.schema.field(0).name(), "number");
        // A trillion rows are not made before the first ones are read.
        let first: Vec<RecordBatch> = rows.stream.take(2).try_collect().await.expect("read");
        assert_eq!(first.iter().map(|b| b.num_rows()).sum::<usize>(), 2 * 65_536);
    }

    #[tokio::test]
    async fn an_insert_says_how_many_rows_it_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = session(dir.path());
        run(&mut s, "CREATE TABLE t (k UInt64) ENGINE = MergeTree ORDER BY k").await;
        for (sql, rows) in [
            ("INSERT INTO t VALUES (1), (2), (3)", Some(3)),
            ("INSERT INTO t SELECT number FROM numbers(10)", Some(10)),
            ("OPTIMIZE TABLE t FINAL", None),
        ] {
            match s.plan(sql, 0, sql.len()).await.expect(sql) {
                Outcome::Done { rows_written } => assert_eq!(rows_written, rows, "{sql}"),
                Outcome::Rows(_) => panic!("{sql} returned rows"),
            }
        }
    }
}
