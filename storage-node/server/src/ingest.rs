//! The storage node's gRPC insert service (`schemas/ingest.proto`).
//!
//! An insert that carries an offset commit is a two-step commit: the block's parts are
//! prepared (durable, invisible), then the offset node is moved with a compare-and-set on its
//! version, and only then do the parts become active. The compare-and-set is the commit
//! point: a writer holding a stale version (a zombie ingestor) is refused and its parts are
//! dropped. Prepared inserts whose outcome is unknown (a crash, a lost coordinator reply) are
//! resolved by reading the offset node back: the attempt id it names says whether this
//! attempt committed, and its token whether an earlier attempt at the same block did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::compute::concat_batches;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use coordinator_client::{Keeper, KeeperError, OffsetRecord};
use mergestream_engine::{Catalog, EngineError, InsertOptions, PreparedInsert, Table};
use mergestream_proto::ingest::ingest_server::Ingest;
use mergestream_proto::ingest::{
    CreateTableRequest, DescribeTableRequest, InsertReply, InsertRequest, QueryReply, QueryRequest, TableSchema,
};
use mergestream_query::{OutputFormat, Session};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

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

/// A coordinator session that is made again when it is lost.
pub struct Coordinator {
    hosts: String,
    session_timeout: Duration,
    keeper: Mutex<Option<Keeper>>,
}

impl Coordinator {
    pub fn new(hosts: String, session_timeout: Duration) -> Coordinator {
        Coordinator { hosts, session_timeout, keeper: Mutex::new(None) }
    }

    async fn keeper(&self) -> Result<Keeper, KeeperError> {
        let mut slot = self.keeper.lock().await;
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let k = Keeper::connect(&self.hosts, self.session_timeout).await?;
        *slot = Some(k.clone());
        Ok(k)
    }

    async fn forget_if_lost(&self, e: &KeeperError) {
        if e.is_session_lost() || matches!(e, KeeperError::Connect { .. }) {
            *self.keeper.lock().await = None;
        }
    }

    async fn read_offset(&self, path: &str) -> Result<Option<(OffsetRecord, i32)>, KeeperError> {
        let k = self.keeper().await?;
        match k.get(path).await {
            Ok(v) => Ok(v.map(|v| (OffsetRecord::decode(&v.data).unwrap_or_default(), v.version))),
            Err(e) => {
                self.forget_if_lost(&e).await;
                Err(e)
            }
        }
    }
}

pub struct IngestService {
    catalog: Arc<Catalog>,
    coordinator: Option<Arc<Coordinator>>,
    /// Queries run here, not on the runtime serving gRPC: DataFusion decodes and aggregates
    /// on its runtime's threads, and a long query must not hold up inserts and commits.
    queries: tokio::runtime::Handle,
}

fn engine_status(e: EngineError) -> Status {
    match &e {
        EngineError::TooManyParts { .. } => Status::resource_exhausted(e.to_string()),
        EngineError::BadInsert { .. } | EngineError::UnknownTable(_) => Status::invalid_argument(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

fn schema_bytes(table: &Table) -> Result<Vec<u8>, Status> {
    let mut bytes = Vec::new();
    let mut writer =
        StreamWriter::try_new(&mut bytes, &table.user_schema()).map_err(|e| Status::internal(e.to_string()))?;
    writer.finish().map_err(|e| Status::internal(e.to_string()))?;
    drop(writer);
    Ok(bytes)
}

fn decode_block(table: &Table, bytes: &[u8]) -> Result<RecordBatch, Status> {
    let bad =
        |e: arrow::error::ArrowError| Status::invalid_argument(format!("the block is not an Arrow IPC stream: {e}"));
    let reader = StreamReader::try_new(bytes, None).map_err(bad)?;
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    let schema = table.user_schema();
    // The sender's field metadata may differ; the engine checks names and types.
    let batches: Vec<RecordBatch> = batches
        .into_iter()
        .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| Status::invalid_argument(format!("the block does not match table {}: {e}", table.name())))?;
    concat_batches(&schema, &batches).map_err(|e| Status::invalid_argument(e.to_string()))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
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
    /// offset node. Runs before the service accepts inserts.
    pub async fn recover(&self) -> anyhow::Result<()> {
        for table in self.catalog.tables() {
            let t = table.clone();
            let prepared = blocking(move || t.prepared_inserts()).await??;
            for p in prepared {
                let Some(coordinator) = &self.coordinator else {
                    warn!(table = table.name(), "a prepared insert without a coordinator to decide it: dropped");
                    let t = table.clone();
                    blocking(move || t.abort_prepared(p)).await?;
                    continue;
                };
                let pending: PendingCommit = serde_json::from_str(&p.record.context)?;
                let committed = coordinator
                    .read_offset(&pending.path)
                    .await?
                    .is_some_and(|(record, _)| record.attempt == pending.attempt);
                info!(table = table.name(), token = pending.token, committed, "resolving a prepared insert");
                let t = table.clone();
                if committed {
                    blocking(move || t.commit_prepared(p)).await??;
                } else {
                    blocking(move || t.abort_prepared(p)).await?;
                }
            }
            self.catalog.schedule_merges(&table);
        }
        Ok(())
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
    ) -> Result<InsertReply, Status> {
        let coordinator = self
            .coordinator
            .clone()
            .ok_or_else(|| Status::failed_precondition("this storage node has no coordinator (--coordinator)"))?;
        tokio::spawn(commit_with_offset(coordinator, table, batch, token, offset))
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
) -> Result<InsertReply, Status> {
    let rows = batch.num_rows() as u64;
    let attempt = new_attempt_id();
    let pending = PendingCommit { path: offset.path.clone(), token: token.clone(), attempt: attempt.clone() };
    let context = serde_json::to_string(&pending).map_err(|e| Status::internal(e.to_string()))?;
    let options = InsertOptions { deduplication_token: Some(token.clone()) };
    let t = table.clone();
    let prepared = blocking(move || t.prepare_insert(batch, &options, &context)).await?.map_err(engine_status)?;

    let record = OffsetRecord { next: offset.next_position, token: token.clone(), attempt: attempt.clone() }.encode();
    let outcome = match coordinator.keeper().await {
        Ok(k) => k.set(&offset.path, &record, Some(offset.expected_version)).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(version) => {
            let t = table.clone();
            let summary = blocking(move || t.commit_prepared(prepared)).await?.map_err(engine_status)?;
            metrics::counter!("mergestream_storage_blocks_committed_total").increment(1);
            Ok(InsertReply { rows, parts: summary.parts, duplicate: false, offset_version: version })
        }
        Err(e) => {
            coordinator.forget_if_lost(&e).await;
            settle_unknown(&coordinator, table, prepared, &offset, &pending, e).await
        }
    }
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
    error: KeeperError,
) -> Result<InsertReply, Status> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let current = loop {
        match coordinator.read_offset(&offset.path).await {
            Ok(current) => break current,
            Err(e) if Instant::now() < deadline => {
                warn!(path = offset.path, error = %e, "cannot read the offset node back yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                // Left prepared: the next start decides it from the offset node.
                return Err(Status::unavailable(format!("the coordinator cannot be reached: {e}")));
            }
        }
    };
    match current {
        Some((record, version)) if record.attempt == pending.attempt => {
            let rows = prepared.record.rows as u64;
            let summary = blocking(move || table.commit_prepared(prepared)).await?.map_err(engine_status)?;
            Ok(InsertReply { rows, parts: summary.parts, duplicate: false, offset_version: version })
        }
        Some((record, version)) if record.token == pending.token => {
            // A retry of a block that already committed: nothing to add.
            blocking(move || table.abort_prepared(prepared)).await?;
            metrics::counter!("mergestream_storage_blocks_duplicate_total").increment(1);
            Ok(InsertReply { rows: 0, parts: Vec::new(), duplicate: true, offset_version: version })
        }
        current => {
            blocking(move || table.abort_prepared(prepared)).await?;
            metrics::counter!("mergestream_storage_blocks_refused_total").increment(1);
            let found = current.map_or("missing".to_string(), |(r, v)| format!("at version {v} (next {})", r.next));
            Err(Status::failed_precondition(format!(
                "offset node {} is {found}, not at version {}: another writer moved it ({error})",
                offset.path, offset.expected_version
            )))
        }
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn create_table(&self, request: Request<CreateTableRequest>) -> Result<Response<TableSchema>, Status> {
        let ddl = request.into_inner().ddl;
        let (def, _) = mergestream_query::sql::parse_create_table_statement(&ddl)
            .map_err(|e| Status::invalid_argument(format!("in the DDL: {e}")))?;
        let name = def.name.clone();
        let catalog = self.catalog.clone();
        blocking(move || catalog.create_table(def, true)).await?.map_err(engine_status)?;
        let table = self.table(&name)?;
        Ok(Response::new(TableSchema { table: name, arrow_schema: schema_bytes(&table)? }))
    }

    async fn describe_table(&self, request: Request<DescribeTableRequest>) -> Result<Response<TableSchema>, Status> {
        let name = request.into_inner().table;
        let table = self.table(&name)?;
        Ok(Response::new(TableSchema { table: name, arrow_schema: schema_bytes(&table)? }))
    }

    async fn insert(&self, request: Request<InsertRequest>) -> Result<Response<InsertReply>, Status> {
        let began = Instant::now();
        let request = request.into_inner();
        let table = self.table(&request.table)?;
        let merged_later = table.clone();
        let t = table.clone();
        let bytes = request.arrow_ipc;
        let batch = blocking(move || decode_block(&t, &bytes)).await??;
        let token = (!request.deduplication_token.is_empty()).then_some(request.deduplication_token);
        let reply = match (request.offset, token) {
            (Some(offset), Some(token)) => self.insert_with_offset(table, batch, token, offset).await?,
            (Some(_), None) => return Err(Status::invalid_argument("an offset commit needs a deduplication token")),
            (None, token) => {
                let rows = batch.num_rows() as u64;
                let options = InsertOptions { deduplication_token: token };
                let summary = blocking(move || table.insert(batch, &options)).await?.map_err(engine_status)?;
                InsertReply {
                    rows,
                    duplicate: summary.deduplicated > 0 && summary.parts.is_empty(),
                    parts: summary.parts,
                    offset_version: -1,
                }
            }
        };
        // The new part is a candidate for a background merge, as after an INSERT statement.
        self.catalog.schedule_merges(&merged_later);
        metrics::histogram!("mergestream_storage_insert_seconds").record(began.elapsed().as_secs_f64());
        metrics::counter!("mergestream_storage_rows_inserted_total").increment(reply.rows);
        Ok(Response::new(reply))
    }

    async fn query(&self, request: Request<QueryRequest>) -> Result<Response<QueryReply>, Status> {
        let request = request.into_inner();
        let format = OutputFormat::parse(if request.format.is_empty() { "TSV" } else { &request.format })
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut session = Session::new(self.catalog.clone(), format);
        let run = async move {
            let mut output = String::new();
            session.run_script(&request.sql, |_, text, _| output = text.to_string()).await.map(|()| output)
        };
        let output = self
            .queries
            .spawn(run)
            .await
            .map_err(|e| Status::internal(format!("query task failed: {e}")))?
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(QueryReply { output }))
    }
}
