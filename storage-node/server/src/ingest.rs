//! The storage node's gRPC insert service (`schemas/ingest.proto`).
//!
//! An insert that carries an offset commit is a two-step commit: the block's parts are
//! prepared (durable, invisible), then the table's part committer commits them together with
//! the offset node's compare-and-set on its version (an extra op of the same `multi`), and
//! only then do the parts become active. The compare-and-set is the commit point: a writer
//! holding a stale version (a zombie ingestor) is refused and its parts are dropped. Prepared inserts whose outcome is unknown (a crash, a lost coordinator reply) are
//! resolved by reading the offset node back: the attempt id it names says whether this
//! attempt committed, and its token whether an earlier attempt at the same block did.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::compute::concat_batches;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use coordinator_client::offset::validate_node_path;
use coordinator_client::{KeeperError, OffsetRecord};
use mergestream_engine::commit::{ExtraOp, Quorum, QuorumSize, Refusal};
use mergestream_engine::{
    Catalog, EngineError, InsertOptions, InsertSummary, PreparedCommitError, PreparedInsert, Table,
};
use mergestream_proto::ingest::ingest_server::Ingest;
use mergestream_proto::ingest::query_event;
use mergestream_proto::ingest::{
    AwaitQuorumReply, AwaitQuorumRequest, CreateTableRequest, DescribeTableRequest, InsertReply, InsertRequest,
    QueryEvent, QueryProgress, QueryReply, QueryRequest, TableSchema,
};
use mergestream_proto::refusal::Reason;
use mergestream_query::{OutputFormat, Session};
use mergestream_replication::session::{is_outcome_unknown, CoordinatorSession};
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};
use tracing::{error, info, warn};

use crate::status::status_of_engine;

/// What a prepared insert records about the offset commit it waits for.
#[derive(Debug, Serialize, Deserialize)]
struct PendingCommit {
    path: String,
    token: String,
    /// Unique to this attempt: a retry of the same block (same token) has another one.
    attempt: String,
}

fn new_attempt_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{started:x}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The node's coordinator session, as the insert service uses it.
pub type Coordinator = CoordinatorSession;

/// The offset node and its version; `None` if it does not exist.
async fn read_offset(coordinator: &Coordinator, path: &str) -> Result<Option<(OffsetRecord, i32)>, OffsetReadError> {
    let k = coordinator.keeper().await?;
    match k.get(path).await {
        Ok(None) => Ok(None),
        Ok(Some(v)) => match OffsetRecord::decode(&v.data) {
            Ok(record) => Ok(Some((record, v.version))),
            Err(message) => {
                metrics::counter!(crate::metrics::CORRUPT_OFFSET_RECORDS).increment(1);
                Err(OffsetReadError::Corrupt { path: path.to_string(), message })
            }
        },
        Err(e) => {
            coordinator.forget_if_lost(&e).await;
            Err(e.into())
        }
    }
}

/// Why an offset node could not be read back.
#[derive(Debug, thiserror::Error)]
enum OffsetReadError {
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    #[error("offset node {path} is damaged: {message}")]
    Corrupt { path: String, message: String },
}

impl OffsetReadError {
    /// Worth trying again: the coordinator may answer in a moment.
    fn is_transient(&self) -> bool {
        match self {
            OffsetReadError::Keeper(e) => is_outcome_unknown(e),
            OffsetReadError::Corrupt { .. } => false,
        }
    }
}

/// Why a prepared insert left by the last run is not decided at startup.
enum Unresolved {
    /// Kept on disk, for a later start or a person to decide.
    Kept(String),
    /// The coordinator did not answer: the node does not start without deciding.
    Coordinator(String),
}

pub struct IngestService {
    catalog: Arc<Catalog>,
    coordinator: Option<Arc<Coordinator>>,
    /// Queries run here, not on the runtime serving gRPC: DataFusion decodes and aggregates
    /// on its runtime's threads, and a long query must not hold up inserts and commits.
    queries: tokio::runtime::Handle,
}

fn schema_bytes(table: &Table) -> Result<Vec<u8>, Status> {
    let mut bytes = Vec::new();
    let mut writer =
        StreamWriter::try_new(&mut bytes, &table.user_schema()).map_err(|e| Status::internal(e.to_string()))?;
    writer.finish().map_err(|e| Status::internal(e.to_string()))?;
    drop(writer);
    Ok(bytes)
}

/// The writer's Arrow IPC stream as the table's block, its columns matched by name.
fn decode_block(table: &Table, bytes: Vec<u8>) -> Result<RecordBatch, Status> {
    let batches = crate::ipc::decode_stream(bytes)
        .map_err(|e| Status::invalid_argument(format!("the block is not an Arrow IPC stream: {e}")))?;
    let schema = table.user_schema();
    let batches: Vec<RecordBatch> = batches
        .iter()
        .map(|b| mergestream_query::input::conform_block(table, b))
        .collect::<Result<_, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    concat_batches(&schema, &batches).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Runs CPU-heavy insert work (decoding, conforming, preparing a part) off the runtime.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("insert task failed: {e}")))
}

impl IngestService {
    pub fn new(
        catalog: Arc<Catalog>,
        coordinator: Option<Arc<Coordinator>>,
        queries: tokio::runtime::Handle,
    ) -> IngestService {
        IngestService { catalog, coordinator, queries }
    }

    fn table(&self, name: &str) -> Result<Arc<Table>, Status> {
        self.catalog.table(name).map_err(|e| Status::not_found(e.to_string()))
    }

    /// Commits or drops the prepared inserts a crash left behind, by the attempt in each one's
    /// offset node. Runs before the service accepts inserts. A prepared insert that cannot be
    /// decided (no coordinator, a record or offset node that cannot be read) is kept on disk
    /// and logged, never dropped: its block may be the one its offset node says is in.
    /// Fails only when the coordinator cannot be reached, so that a restart tries again.
    pub async fn recover(&self) -> anyhow::Result<()> {
        if mergestream_engine::failpoint::is_armed(mergestream_engine::failpoint::SLOW_RECOVERY) {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        }
        let mut unresolved = 0usize;
        for table in self.catalog.tables() {
            let t = table.clone();
            let prepared = blocking(move || t.prepared_inserts()).await??;
            for p in prepared {
                match self.resolve_prepared(&table, p).await {
                    Ok(()) => {}
                    Err(Unresolved::Kept(why)) => {
                        unresolved += 1;
                        error!(table = table.name(), why, "a prepared insert is kept undecided");
                    }
                    Err(Unresolved::Coordinator(e)) => {
                        return Err(anyhow::anyhow!("the coordinator cannot tell the fate of a prepared insert: {e}"));
                    }
                }
            }
            self.catalog.schedule_merges(&table);
        }
        metrics::gauge!(crate::metrics::UNRESOLVED_PREPARED_INSERTS).set(unresolved as f64);
        Ok(())
    }

    async fn resolve_prepared(&self, table: &Arc<Table>, p: PreparedInsert) -> Result<(), Unresolved> {
        let Some(coordinator) = &self.coordinator else {
            return Err(Unresolved::Kept(format!(
                "{} rows wait for an offset commit, and this node has no coordinator to ask whether it happened: \
                 start it with --coordinator to decide",
                p.record.rows
            )));
        };
        let pending: PendingCommit = serde_json::from_str(&p.record.context)
            .map_err(|e| Unresolved::Kept(format!("its record of the offset commit cannot be read: {e}")))?;
        validate_node_path(&pending.path).map_err(|e| Unresolved::Kept(format!("its offset path is invalid: {e}")))?;
        let offset_names_it = match read_offset(coordinator, &pending.path).await {
            Ok(current) => current.is_some_and(|(record, _)| record.attempt == pending.attempt),
            Err(e) if e.is_transient() => return Err(Unresolved::Coordinator(e.to_string())),
            Err(e) => return Err(Unresolved::Kept(e.to_string())),
        };
        // The offset node moves on when the writer fails over to another replica: then the
        // table's own record (this replica's part node) says whether the commit happened.
        let committed =
            offset_names_it || table.committed_here(&p).await.map_err(|e| Unresolved::Coordinator(e.to_string()))?;
        info!(table = table.name(), token = pending.token, committed, "resolving a prepared insert");
        let t = table.clone();
        let done = if committed {
            blocking(move || t.commit_prepared(p).map(drop)).await
        } else {
            blocking(move || {
                t.abort_prepared(p);
                Ok(())
            })
            .await
        };
        match done {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Unresolved::Kept(e.to_string())),
            Err(e) => Err(Unresolved::Kept(e.to_string())),
        }
    }

    /// Prepares the block, moves the offset node, then activates the parts. The steps run as
    /// a task of their own: tonic drops a request's future when its client goes away, and a
    /// writer killed after the offset node moved must not leave the block prepared but
    /// invisible until the next restart (seen in the ingestor's SIGKILL test).
    async fn insert_with_offset(
        &self,
        table: Arc<Table>,
        batch: RecordBatch,
        token: String,
        offset: mergestream_proto::ingest::OffsetCommit,
        quorum: Option<Quorum>,
    ) -> Result<InsertReply, Status> {
        validate_node_path(&offset.path).map_err(|e| Status::invalid_argument(format!("the offset path: {e}")))?;
        let coordinator = self.coordinator.clone().ok_or_else(|| {
            Reason::NoCoordinator.status(
                "this storage node was started without --coordinator, so it cannot commit source offsets".into(),
            )
        })?;
        tokio::spawn(commit_with_offset(coordinator, table, batch, token, offset, quorum))
            .await
            .map_err(|e| Status::internal(format!("insert task failed: {e}")))?
    }
}

async fn commit_with_offset(
    coordinator: Arc<Coordinator>,
    table: Arc<Table>,
    batch: RecordBatch,
    token: String,
    offset: mergestream_proto::ingest::OffsetCommit,
    quorum: Option<Quorum>,
) -> Result<InsertReply, Status> {
    let rows = batch.num_rows() as u64;
    let attempt = new_attempt_id();
    let pending = PendingCommit { path: offset.path.clone(), token: token.clone(), attempt: attempt.clone() };
    let context = serde_json::to_string(&pending).map_err(|e| Status::internal(e.to_string()))?;
    let options = InsertOptions { deduplication_token: Some(token.clone()), ..Default::default() };
    let t = table.clone();
    let prepared = blocking(move || t.prepare_insert(batch, &options, &context)).await?.map_err(status_of_engine)?;

    let record = OffsetRecord { next: offset.next_position, token: token.clone(), attempt: attempt.clone() }.encode();
    let extra =
        vec![ExtraOp::SetData { path: offset.path.clone(), data: record, expected_version: offset.expected_version }];
    match table.commit_prepared_with(prepared, extra, quorum.as_ref()).await {
        Ok((summary, outcome)) => {
            metrics::counter!(crate::metrics::BLOCKS_COMMITTED).increment(1);
            let offset_version = outcome.versions.first().copied().unwrap_or(-1);
            Ok(InsertReply { rows, parts: summary.parts, duplicate: false, offset_version, quorum_pending: false })
        }
        Err(PreparedCommitError::NotActivated(e)) => Err(status_of_engine(e)),
        Err(PreparedCommitError::Uncommitted { prepared, error }) => match error {
            EngineError::CommitRefused { refusal: Refusal::NoNode, path } if path == offset.path => {
                blocking(move || table.abort_prepared(prepared)).await?;
                metrics::counter!(crate::metrics::BLOCKS_REFUSED).increment(1);
                Err(offset_node_missing(&offset.path))
            }
            EngineError::CommitRefused { refusal: Refusal::BadVersion, ref path } if *path == offset.path => {
                settle_unknown(&coordinator, table, prepared, &offset, &pending, error).await
            }
            EngineError::CommitOutcomeUnknown(_) => {
                settle_unknown(&coordinator, table, prepared, &offset, &pending, error).await
            }
            error => {
                // The coordinator answered, and the write did not happen.
                blocking(move || table.abort_prepared(prepared)).await?;
                Err(status_of_engine(error))
            }
        },
    }
}

fn offset_node_missing(path: &str) -> Status {
    Reason::OffsetNodeMissing
        .status(format!("offset node {path} does not exist: the writer creates it before its first block"))
}

/// After a failed compare-and-set: reads the offset node back. If it names this attempt,
/// the write went through before the connection broke; if it names another attempt at the
/// same token, an earlier try committed the block and this one adds nothing.
async fn settle_unknown(
    coordinator: &Coordinator,
    table: Arc<Table>,
    prepared: PreparedInsert,
    offset: &mergestream_proto::ingest::OffsetCommit,
    pending: &PendingCommit,
    error: EngineError,
) -> Result<InsertReply, Status> {
    let version_refused = matches!(error, EngineError::CommitRefused { refusal: Refusal::BadVersion, .. });
    let deadline = Instant::now() + Duration::from_secs(30);
    let current = loop {
        match read_offset(coordinator, &offset.path).await {
            Ok(current) => break current,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                warn!(path = offset.path, error = %e, "cannot read the offset node back yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) if e.is_transient() => {
                // Left prepared: the next start decides it from the offset node.
                return Err(Status::unavailable(format!("the coordinator cannot be reached: {e}")));
            }
            Err(e) if version_refused => {
                // The version check failed: this attempt wrote nothing, whatever the node holds.
                blocking(move || table.abort_prepared(prepared)).await?;
                return Err(Reason::CorruptOffsetRecord.status(e.to_string()));
            }
            Err(e) => {
                // Whether this attempt committed cannot be known: kept prepared, for a person
                // (or the next start, once the node is repaired) to decide.
                error!(path = offset.path, error = %e, "an insert is kept prepared: its offset node cannot be read");
                return Err(Reason::CorruptOffsetRecord.status(e.to_string()));
            }
        }
    };
    match current {
        Some((record, version)) if record.attempt == pending.attempt => {
            let rows = prepared.record.rows as u64;
            let summary = blocking(move || table.commit_prepared(prepared)).await?.map_err(status_of_engine)?;
            Ok(InsertReply {
                rows,
                parts: summary.parts,
                duplicate: false,
                offset_version: version,
                quorum_pending: false,
            })
        }
        Some((record, version)) if record.token == pending.token => {
            // A retry of a block that already committed: nothing to add. Its reply names the
            // parts the earlier attempt made, so that a quorum insert waits for their quorum
            // as the first reply would have.
            let parts = table.committed_parts_of(&prepared).await.map_err(status_of_engine)?;
            blocking(move || table.abort_prepared(prepared)).await?;
            metrics::counter!(crate::metrics::BLOCKS_DUPLICATE).increment(1);
            Ok(InsertReply { rows: 0, parts, duplicate: true, offset_version: version, quorum_pending: false })
        }
        Some((record, version)) => {
            blocking(move || table.abort_prepared(prepared)).await?;
            metrics::counter!(crate::metrics::BLOCKS_REFUSED).increment(1);
            Err(Reason::StaleVersion.status(format!(
                "offset node {} is at version {version} (next {}), not at version {}: another writer moved it ({error})",
                offset.path, record.next, offset.expected_version
            )))
        }
        None => {
            blocking(move || table.abort_prepared(prepared)).await?;
            metrics::counter!(crate::metrics::BLOCKS_REFUSED).increment(1);
            Err(offset_node_missing(&offset.path))
        }
    }
}

/// Runs a request's handler; a panic in it is answered as INTERNAL and logged, and the node
/// goes on serving (blocking sections already come back as errors from `spawn_blocking`).
async fn guarded<T>(
    method: &'static str,
    handler: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(handler).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = crate::panic_message(panic.as_ref());
            error!(method, message, "a request handler panicked");
            metrics::counter!(crate::metrics::HANDLER_PANICS).increment(1);
            Err(Status::internal(format!("{method} failed inside the storage node: {message}")))
        }
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn create_table(&self, request: Request<CreateTableRequest>) -> Result<Response<TableSchema>, Status> {
        guarded("CreateTable", self.handle_create_table(request)).await
    }

    async fn describe_table(&self, request: Request<DescribeTableRequest>) -> Result<Response<TableSchema>, Status> {
        guarded("DescribeTable", self.handle_describe_table(request)).await
    }

    async fn insert(&self, request: Request<InsertRequest>) -> Result<Response<InsertReply>, Status> {
        guarded("Insert", self.handle_insert(request)).await
    }

    async fn query(&self, request: Request<QueryRequest>) -> Result<Response<QueryReply>, Status> {
        guarded("Query", self.handle_query(request)).await
    }

    type QueryWithProgressStream = QueryEventStream;

    async fn query_with_progress(&self, request: Request<QueryRequest>) -> Result<Response<QueryEventStream>, Status> {
        guarded("QueryWithProgress", self.handle_query_with_progress(request)).await
    }

    async fn await_quorum(&self, request: Request<AwaitQuorumRequest>) -> Result<Response<AwaitQuorumReply>, Status> {
        guarded("AwaitQuorum", async move {
            let request = request.into_inner();
            let table = self.table(&request.table)?;
            let quorum = request.quorum.map(quorum_of).ok_or_else(|| Status::invalid_argument("no quorum given"))?;
            let reached = await_quorum(&table, &quorum, request.parts).await?;
            Ok(Response::new(AwaitQuorumReply { reached }))
        })
        .await
    }
}

/// An insert request's quorum, always parallel: writers of many partitions at once must not
/// wait for each other's quorums.
fn quorum_of(q: mergestream_proto::ingest::InsertQuorum) -> Quorum {
    Quorum {
        size: if q.replicas == 0 { QuorumSize::Majority } else { QuorumSize::Replicas(q.replicas) },
        timeout: Duration::from_millis(q.timeout_ms),
        parallel: true,
    }
}

/// Waits for the quorum of committed parts: whether it was reached in time.
async fn await_quorum(table: &Table, quorum: &Quorum, parts: Vec<String>) -> Result<bool, Status> {
    let summary = InsertSummary { parts, ..Default::default() };
    match table.wait_for_quorum(quorum, &summary).await {
        Ok(()) => Ok(true),
        Err(EngineError::Replication { code: "UNKNOWN_STATUS_OF_INSERT", message }) => {
            warn!(table = table.name(), message, "the insert quorum is not reached yet");
            Ok(false)
        }
        Err(e) => Err(status_of_engine(e)),
    }
}

impl IngestService {
    async fn handle_create_table(&self, request: Request<CreateTableRequest>) -> Result<Response<TableSchema>, Status> {
        let ddl = request.into_inner().ddl;
        // Parsed where queries are: on a thread with the stack a statement within the limits needs.
        let (def, _) = self
            .queries
            .spawn_blocking(move || mergestream_query::sql::parse_create_table_statement(&ddl))
            .await
            .map_err(|e| Status::internal(format!("the DDL's parser failed: {e}")))?
            .map_err(|e| Status::invalid_argument(format!("in the DDL: {e}")))?;
        let name = def.name.clone();
        self.catalog.create_table_async(def, true).await.map_err(status_of_engine)?;
        let table = self.table(&name)?;
        Ok(Response::new(TableSchema { table: name, arrow_schema: schema_bytes(&table)? }))
    }

    async fn handle_describe_table(
        &self,
        request: Request<DescribeTableRequest>,
    ) -> Result<Response<TableSchema>, Status> {
        let name = request.into_inner().table;
        let table = self.table(&name)?;
        Ok(Response::new(TableSchema { table: name, arrow_schema: schema_bytes(&table)? }))
    }

    async fn handle_insert(&self, request: Request<InsertRequest>) -> Result<Response<InsertReply>, Status> {
        let began = Instant::now();
        let request = request.into_inner();
        let table = self.table(&request.table)?;
        let merged_later = table.clone();
        let t = table.clone();
        let bytes = request.arrow_ipc;
        let batch = blocking(move || decode_block(&t, bytes)).await??;
        let token = (!request.deduplication_token.is_empty()).then_some(request.deduplication_token);
        let quorum = request.quorum.map(quorum_of);
        let reply = match (request.offset, token) {
            (Some(offset), Some(token)) => {
                if let Some(quorum) = &quorum {
                    table.check_quorum(quorum).await.map_err(status_of_engine)?;
                }
                let mut reply = self.insert_with_offset(table.clone(), batch, token, offset, quorum).await?;
                // The block and its offset are in whatever the quorum says: a quorum not
                // reached in time is only pending, for the writer to wait for, not to retry.
                if let Some(quorum) = quorum.filter(|_| !reply.parts.is_empty()) {
                    reply.quorum_pending = !await_quorum(&table, &quorum, reply.parts.clone()).await?;
                }
                reply
            }
            (Some(_), None) => return Err(Status::invalid_argument("an offset commit needs a deduplication token")),
            (None, token) => {
                let rows = batch.num_rows() as u64;
                // As an INSERT statement: a quorum not reached in time is an error, and a retry
                // of the same block is deduplicated and waits for the same quorum.
                let options = InsertOptions { deduplication_token: token, quorum, ..Default::default() };
                let summary = table.insert_async(batch, options).await.map_err(status_of_engine)?;
                InsertReply {
                    rows,
                    duplicate: summary.deduplicated > 0 && summary.parts.is_empty(),
                    parts: summary.parts,
                    offset_version: -1,
                    quorum_pending: false,
                }
            }
        };

        // The new part is a candidate for a background merge, as after an INSERT statement.
        self.catalog.schedule_merges(&merged_later);
        metrics::histogram!(crate::metrics::INSERT_DURATION).record(began.elapsed().as_secs_f64());
        metrics::counter!(crate::metrics::ROWS_INSERTED).increment(reply.rows);
        metrics::counter!(crate::metrics::INSERTS).increment(1);
        Ok(Response::new(reply))
    }

    async fn handle_query(&self, request: Request<QueryRequest>) -> Result<Response<QueryReply>, Status> {
        let running = self.start_query(request.into_inner())?;
        let output = joined(running.task.await);
        record_query(running.began, &output);
        Ok(Response::new(QueryReply { output: output? }))
    }

    async fn handle_query_with_progress(
        &self,
        request: Request<QueryRequest>,
    ) -> Result<Response<QueryEventStream>, Status> {
        let RunningQuery { began, progress, statement, mut task } = self.start_query(request.into_inner())?;
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<QueryEvent, Status>>(4);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PROGRESS_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let output = loop {
                tokio::select! {
                    done = &mut task => break joined(done),
                    _ = every.tick() => {
                        let counts = progress.counts();
                        let event = QueryProgress {
                            rows_read: counts.rows,
                            bytes_read: counts.bytes,
                            elapsed_ms: began.elapsed().as_millis() as u64,
                            statement: statement.load(Ordering::Relaxed),
                        };
                        let event = QueryEvent { event: Some(query_event::Event::Progress(event)) };
                        if sender.send(Ok(event)).await.is_err() {
                            // The client went away: its query need not finish.
                            task.abort();
                            return;
                        }
                    }
                }
            };
            record_query(began, &output);
            let last = output.map(|output| QueryEvent { event: Some(query_event::Event::Output(output)) });
            let _ = sender.send(last).await;
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }

    /// Starts a script on the query runtime, every statement's output collected in order (as
    /// clickhouse-client prints a multi-statement query).
    fn start_query(&self, request: QueryRequest) -> Result<RunningQuery, Status> {
        let format = OutputFormat::parse(if request.format.is_empty() { "TSV" } else { &request.format })
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut session = Session::new(self.catalog.clone(), format);
        let progress = session.progress();
        let statement = Arc::new(AtomicU32::new(1));
        let running = statement.clone();
        let run = async move {
            let mut output = String::new();
            session
                .run_script(&request.sql, |index, text, _| {
                    output.push_str(text);
                    running.store(index as u32 + 1, Ordering::Relaxed);
                })
                .await
                .map(|()| output)
                .map_err(crate::status::status_of_script)
        };
        Ok(RunningQuery { began: Instant::now(), progress, statement, task: self.queries.spawn(run) })
    }
}

/// How often QueryWithProgress reports.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

pub type QueryEventStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<QueryEvent, Status>> + Send>>;

struct RunningQuery {
    began: Instant,
    progress: Arc<mergestream_engine::progress::ReadProgress>,
    /// The 1-based statement running now.
    statement: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<Result<String, Status>>,
}

/// A query task's output, or why the task itself failed.
fn joined(done: Result<Result<String, Status>, tokio::task::JoinError>) -> Result<String, Status> {
    done.unwrap_or_else(|e| Err(Status::internal(format!("query task failed: {e}"))))
}

fn record_query(began: Instant, output: &Result<String, Status>) {
    metrics::histogram!(crate::metrics::QUERY_DURATION).record(began.elapsed().as_secs_f64());
    let outcome = if output.is_ok() { "ok" } else { "error" };
    metrics::counter!(crate::metrics::QUERIES, "outcome" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, UInt64Array};
    use mergestream_engine::{Catalog, InsertOptions};

    use super::*;

    fn catalog_with_prepared(dir: &std::path::Path, context: &str) -> Arc<Catalog> {
        let catalog = Arc::new(Catalog::open(dir, 0).expect("catalog"));
        let (def, _) = mergestream_query::sql::parse_create_table_statement(
            "CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x",
        )
        .expect("ddl");
        catalog.create_table(def, false).expect("create");
        let table = catalog.table("t").expect("table");
        let column: ArrayRef = Arc::new(UInt64Array::from_iter_values(0..10));
        let batch = RecordBatch::try_new(table.user_schema(), vec![column]).expect("batch");
        let options = InsertOptions { deduplication_token: Some("p:t:topic:0:0-9".into()), ..Default::default() };
        table.prepare_insert(batch, &options, context).expect("prepare");
        catalog
    }

    async fn recover(catalog: Arc<Catalog>, coordinator: Option<Arc<Coordinator>>) -> anyhow::Result<()> {
        IngestService::new(catalog, coordinator, tokio::runtime::Handle::current()).recover().await
    }

    #[tokio::test]
    async fn without_a_coordinator_a_prepared_insert_is_kept_not_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let context = r#"{"path":"/offsets/t/0","token":"p:t:topic:0:0-9","attempt":"a-1"}"#;
        let catalog = catalog_with_prepared(dir.path(), context);
        recover(catalog.clone(), None).await.expect("the node opens");
        let table = catalog.table("t").expect("table");
        assert_eq!(table.prepared_inserts().expect("list").len(), 1, "kept for a start with a coordinator");
        assert!(table.parts_info().is_empty(), "and not made visible either");
    }

    #[tokio::test]
    async fn a_prepared_insert_with_a_bad_record_does_not_stop_the_node() {
        for context in
            ["not json", r#"{"path":"a","token":"t","attempt":"a"}"#, r#"{"path":"/a//b","token":"t","attempt":"a"}"#]
        {
            let dir = tempfile::tempdir().expect("tempdir");
            let catalog = catalog_with_prepared(dir.path(), context);
            // The coordinator is never asked: the record is refused before (no server runs there).
            let coordinator =
                Arc::new(Coordinator::new("127.0.0.1:1".into(), Duration::from_secs(1), Default::default()));
            recover(catalog.clone(), Some(coordinator)).await.expect("the node opens");
            assert_eq!(catalog.table("t").expect("table").prepared_inserts().expect("list").len(), 1, "{context}");
        }
    }
}
