//! Arrow Flight SQL on the storage node (`serve --flight-addr`): ClickHouse SQL in, Arrow
//! record batches streamed out as the plan makes them.
//!
//! A statement sent as a query (CommandStatementQuery, or a prepared statement executed as one)
//! answers GetFlightInfo with its schema and a ticket that holds the SQL; DoGet plans it again
//! and streams its batches. A statement that returns no rows (DDL, INSERT, OPTIMIZE, SYSTEM)
//! runs when GetFlightInfo asks for it, as ADBC sends every statement of `cursor.execute` that
//! way, and its ticket then streams no rows. CommandStatementUpdate runs any statement and
//! answers how many rows it wrote (-1 where it wrote none: DoPutUpdateResult's "unknown").

pub mod auth;
mod cancel;
mod ingest;
mod type_info;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, Int32Array, NullArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfoData};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandGetXdbcTypeInfo,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightDescriptor, FlightEndpoint,
    FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage, SchemaAsIpc, Ticket,
};
use auth::{Identity, Users};
use futures::{Stream, StreamExt, TryStreamExt};
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::Catalog;
use mergestream_query::exec::catalog::{list_tables, TableListing};
use mergestream_query::session::{only_statement, Outcome, CATALOG_NAME};
use mergestream_query::sql::parameters::{bind, placeholders};
use mergestream_query::{OutputFormat, Session};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::status::status_of;

/// The Flight action that cancels a FlightInfo's query (the protocol's name for it).
const CANCEL_FLIGHT_INFO: &str = "CancelFlightInfo";

/// Batches a DoGet keeps ready ahead of the client: the plan waits when the client reads
/// slower than the plan makes rows.
const BATCHES_AHEAD: usize = 2;

/// Prepared statements a server keeps at most; a client that never closes its own cannot
/// make the server hold more.
const MAX_PREPARED: usize = 10_000;

type BatchStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

pub struct FlightSqlServer {
    catalog: Arc<Catalog>,
    /// The runtime queries plan and run on (deep stacks; apart from the one serving gRPC).
    queries: tokio::runtime::Handle,
    prepared: Mutex<HashMap<Vec<u8>, Prepared>>,
    next_handle: AtomicU64,
    sql_info: SqlInfoData,
    type_info: XdbcTypeInfoData,
    users: Arc<Users>,
    admission: Admission,
    cancellations: Arc<cancel::Cancellations>,
    random: ring::rand::SystemRandom,
}

/// GetTableTypes: what GetTables' `table_type` holds.
const TABLE_TYPES: [&str; 2] = ["SYSTEM TABLE", "TABLE"];

/// A prepared statement: its SQL, and what executing it as a query returns.
#[derive(Clone)]
struct Prepared {
    sql: String,
    /// `None`: a statement that returns no rows. Only for a statement without placeholders:
    /// one with them is described again once its values are bound.
    schema: Option<SchemaRef>,
    /// How many `?` the statement has.
    placeholders: usize,
    /// The values last bound (DoPut of CommandPreparedStatementQuery): one row for a query.
    parameters: Option<RecordBatch>,
}

/// What a ticket asks DoGet for.
enum TicketBody {
    /// The rows of this SQL; `id` is what CancelFlightInfo names the query by.
    Rows { id: u64, sql: String },
    /// Nothing: the statement ran when its FlightInfo was asked for.
    Nothing,
}

impl TicketBody {
    fn encode(&self) -> Vec<u8> {
        match self {
            TicketBody::Rows { id, sql } => [b"Q".as_slice(), &id.to_be_bytes(), sql.as_bytes()].concat(),
            TicketBody::Nothing => b"N".to_vec(),
        }
    }

    fn decode(bytes: &[u8]) -> Result<TicketBody, Status> {
        match bytes.split_first() {
            Some((b'Q', rest)) if rest.len() >= 8 => {
                let (id, sql) = rest.split_at(8);
                let id = u64::from_be_bytes(id.try_into().map_err(|_| Status::invalid_argument("a ticket's id"))?);
                std::str::from_utf8(sql)
                    .map(|sql| TicketBody::Rows { id, sql: sql.to_string() })
                    .map_err(|_| Status::invalid_argument("the ticket's SQL is not UTF-8"))
            }
            Some((b'N', [])) => Ok(TicketBody::Nothing),
            _ => Err(Status::invalid_argument("not a ticket of this server")),
        }
    }
}

impl FlightSqlServer {
    pub fn new(catalog: Arc<Catalog>, queries: tokio::runtime::Handle, users: Arc<Users>) -> FlightSqlServer {
        FlightSqlServer {
            catalog,
            queries,
            prepared: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            sql_info: sql_info(),
            type_info: type_info::type_info(),
            users,
            admission: Admission::new(crate::config::DEFAULT_MAX_CONCURRENT_QUERIES),
            cancellations: Arc::default(),
            random: ring::rand::SystemRandom::new(),
        }
    }

    /// The rows of `sql` as a ticket names them, under a fresh random id (a ticket is then
    /// also what it takes to cancel its query).
    fn rows_ticket(&self, sql: String) -> Result<TicketBody, Status> {
        Ok(TicketBody::Rows { id: self.query_id()?, sql })
    }

    fn query_id(&self) -> Result<u64, Status> {
        let id = ring::rand::generate::<[u8; 8]>(&self.random)
            .map_err(|_| Status::internal("no random bytes for a query id"))?
            .expose();
        Ok(u64::from_be_bytes(id))
    }

    /// CancelFlightInfo: every query the info's tickets name is cancelled.
    fn cancel(&self, info: &FlightInfo) -> Result<CancelStatus, Status> {
        let mut status = CancelStatus::NotCancellable;
        for endpoint in &info.endpoint {
            let Some(ticket) = &endpoint.ticket else { continue };
            let ticket = arrow_flight::sql::Any::decode(ticket.ticket.as_ref())
                .ok()
                .and_then(|any| any.unpack::<TicketStatementQuery>().ok().flatten());
            let Some(ticket) = ticket else {
                // A metadata command's ticket: its rows are made whole at once.
                continue;
            };
            if let TicketBody::Rows { id, .. } = TicketBody::decode(&ticket.statement_handle)? {
                status = self.cancellations.cancel(id)?;
            }
        }
        Ok(status)
    }

    pub fn with_max_concurrent_queries(self, limit: usize) -> FlightSqlServer {
        FlightSqlServer { admission: Admission::new(limit), ..self }
    }

    /// A query session with what the caller's earlier statements `SET`.
    fn session_of(&self, caller: &Identity) -> Session {
        Session::new(self.catalog.clone(), OutputFormat::Tsv).with_settings(caller.settings())
    }

    /// Runs `work` with a new session on the query runtime.
    async fn on_query_runtime<T, F, W>(&self, caller: &Identity, work: W) -> Result<T, Status>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, Status>> + Send + 'static,
        W: FnOnce(Session) -> F,
    {
        let session = self.session_of(caller);
        self.queries
            .spawn(work(session))
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("the query's task failed: {e}"))))
    }

    /// A query's FlightInfo: its schema and a ticket for its rows; a statement that returns
    /// no rows runs now.
    async fn flight_info(
        &self,
        sql: String,
        descriptor: FlightDescriptor,
        caller: Identity,
    ) -> Result<FlightInfo, Status> {
        // A query runs (and is admitted) at DoGet; an update runs here.
        let admission = self.admission.clone();
        let id = self.query_id()?;
        let (schema, ticket) = self
            .on_query_runtime(&caller.clone(), move |mut session: Session| async move {
                let (start, end) = only_statement(&sql).map_err(status_of)?;
                match session.describe(&sql, start, end).await.map_err(status_of)? {
                    Some(schema) => Ok((schema, TicketBody::Rows { id, sql })),
                    None => {
                        caller.may_write()?;
                        let recorded = admission.admit("update")?;
                        recorded.of(session.plan(&sql, start, end).await.map_err(status_of))?;
                        caller.keep(session.settings());
                        Ok((Arc::new(Schema::empty()), TicketBody::Nothing))
                    }
                }
            })
            .await?;
        info_of(&schema, ticket.encode(), descriptor)
    }

    /// Streams the rows of a ticket: planned and run on the query runtime, each batch sent as
    /// it is made.
    async fn rows(&self, ticket: TicketBody, caller: &Identity) -> Result<Response<BatchStream>, Status> {
        let TicketBody::Rows { id, sql } = ticket else {
            return Ok(Response::new(encode(Arc::new(Schema::empty()), futures::stream::empty())));
        };
        let running = self.cancellations.start(id)?;
        let (batches, receiver) = tokio::sync::mpsc::channel(BATCHES_AHEAD);
        let (schema_sender, schema) = tokio::sync::oneshot::channel();
        let recorded = self.admission.admit("query")?;
        self.queries.spawn(run_rows(self.session_of(caller), sql, schema_sender, batches, recorded, running));
        let schema = schema.await.map_err(|_| Status::internal("the query's task ended before its schema"))??;
        let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
        Ok(Response::new(encode(schema, stream)))
    }

    /// Runs a statement for its effect; how many rows it wrote, -1 where that is not a count.
    async fn update(&self, sql: String, caller: &Identity) -> Result<i64, Status> {
        let recorded = self.admission.admit("update")?;
        let writer = caller.clone();
        let done = self.on_query_runtime(caller, move |mut session: Session| async move {
            let (start, end) = only_statement(&sql).map_err(status_of)?;
            // Only a statement that returns rows reads and nothing else.
            if session.describe(&sql, start, end).await.map_err(status_of)?.is_none() {
                writer.may_write()?;
            }
            let outcome = session.plan(&sql, start, end).await.map_err(status_of)?;
            writer.keep(session.settings());
            match outcome {
                Outcome::Done { rows_written: Some(rows) } => Ok(rows as i64),
                Outcome::Done { rows_written: None } => Ok(-1),
                Outcome::Rows(rows) => {
                    // A query sent as an update: it runs, and its rows go nowhere.
                    rows.stream.try_for_each(|_| async { Ok(()) }).await.map_err(|e| status_of(e.into()))?;
                    Ok(-1)
                }
            }
        });
        recorded.of(done.await)
    }

    async fn tables(&self) -> Result<Vec<TableListing>, Status> {
        let catalog = self.catalog.clone();
        self.queries
            .spawn(async move { list_tables(&catalog).await })
            .await
            .map_err(|e| Status::internal(format!("the tables' listing failed: {e}")))?
            .map_err(|e| status_of(e.into()))
    }

    /// Keeps the values a client bound to a prepared statement.
    fn bind(&self, handle: &[u8], parameters: RecordBatch) -> Result<(), Status> {
        let mut statements = self.prepared.lock().map_err(|_| Status::internal("the prepared statements' lock"))?;
        let prepared =
            statements.get_mut(handle).ok_or_else(|| Status::not_found("no such prepared statement (closed?)"))?;
        prepared.parameters = Some(parameters);
        Ok(())
    }

    fn prepared(&self, handle: &[u8]) -> Result<Prepared, Status> {
        let statements = self.prepared.lock().map_err(|_| Status::internal("the prepared statements' lock"))?;
        statements.get(handle).cloned().ok_or_else(|| Status::not_found("no such prepared statement (closed?)"))
    }
}

impl Prepared {
    /// The statement to run as a query: with its placeholders bound to the one row of values.
    fn query_sql(&self) -> Result<String, Status> {
        if self.placeholders == 0 {
            return Ok(self.sql.clone());
        }
        match &self.parameters {
            Some(values) if values.num_rows() == 1 => bind(&self.sql, values, 0).map_err(status_of),
            Some(values) => Err(Status::invalid_argument(format!(
                "a query takes one row of parameter values, and {} were bound",
                values.num_rows()
            ))),
            None => Err(Status::invalid_argument(format!(
                "the statement has {} placeholders and no values were bound",
                self.placeholders
            ))),
        }
    }
}

/// One row of NULLs for `count` placeholders, named `1`… as the parameter schema names them.
fn null_parameters(count: usize) -> RecordBatch {
    let fields: Vec<Field> = (1..=count).map(|i| Field::new(i.to_string(), DataType::Null, true)).collect();
    let columns: Vec<ArrayRef> = (0..count).map(|_| Arc::new(NullArray::new(1)) as ArrayRef).collect();
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(1));
    // The columns are made for the fields: it cannot fail.
    RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options)
        .unwrap_or_else(|e| panic!("the NULL parameters: {e}"))
}

/// The rows of parameter values a DoPut sends.
async fn parameter_rows(data: PeekableFlightDataStream) -> Result<RecordBatch, Status> {
    let batches: Vec<RecordBatch> =
        FlightRecordBatchStream::new_from_flight_data(data.map_err(|e| FlightError::Tonic(Box::new(e))))
            .try_collect()
            .await
            .map_err(|e| Status::invalid_argument(format!("the parameter values: {e}")))?;
    let Some(first) = batches.first() else { return Ok(RecordBatch::new_empty(Arc::new(Schema::empty()))) };
    arrow::compute::concat_batches(&first.schema(), &batches)
        .map_err(|e| Status::invalid_argument(format!("the parameter values: {e}")))
}

/// Plans `sql`, sends its schema (or why it failed), then its batches until the client goes.
async fn run_rows(
    mut session: Session,
    sql: String,
    schema: tokio::sync::oneshot::Sender<Result<SchemaRef, Status>>,
    batches: tokio::sync::mpsc::Sender<Result<RecordBatch, Status>>,
    mut recorded: Recorded,
    mut running: cancel::Running,
) {
    let planned = match only_statement(&sql) {
        Ok((start, end)) => session.plan(&sql, start, end).await,
        Err(e) => Err(e),
    };
    let mut rows = match planned {
        Ok(Outcome::Rows(rows)) => rows,
        Ok(Outcome::Done { .. }) => {
            let _ = schema.send(Ok(Arc::new(Schema::empty())));
            recorded.ended("ok");
            return;
        }
        Err(e) => {
            let _ = schema.send(Err(status_of(e)));
            return;
        }
    };
    if schema.send(Ok(rows.schema.clone())).is_err() {
        return;
    }
    loop {
        let next = tokio::select! {
            biased;
            () = running.cancelled() => {
                recorded.ended("cancelled");
                let _ = batches.send(Err(cancel::cancelled())).await;
                return;
            }
            next = rows.stream.next() => next,
        };
        let Some(batch) = next else { break };
        let batch = batch.map_err(|e| status_of(e.into()));
        let streamed = batch.as_ref().map_or(0, |b| b.num_rows());
        let failed = batch.is_err();
        // A client that went away drops the receiver: the plan stops here.
        if batches.send(batch).await.is_err() {
            recorded.ended("cancelled");
            return;
        }
        if failed {
            return;
        }
        metrics::counter!(crate::metrics::FLIGHT_ROWS_STREAMED).increment(streamed as u64);
    }
    recorded.ended("ok");
}

fn encode(schema: SchemaRef, batches: impl Stream<Item = Result<RecordBatch, Status>> + Send + 'static) -> BatchStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches.map_err(|e| FlightError::Tonic(Box::new(e))))
        .map_err(Status::from)
        .inspect_ok(|data| {
            let bytes = data.data_header.len() + data.data_body.len();
            metrics::counter!(crate::metrics::FLIGHT_BYTES_STREAMED).increment(bytes as u64);
        });
    Box::pin(stream)
}

/// `max_concurrent_queries`: one permit per statement running.
#[derive(Clone)]
struct Admission {
    running: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl Admission {
    fn new(limit: usize) -> Admission {
        Admission { running: Arc::new(tokio::sync::Semaphore::new(limit)), limit }
    }

    /// A statement's metrics and its place among those running, or ClickHouse's refusal when
    /// `limit` already run.
    fn admit(&self, kind: &'static str) -> Result<Recorded, Status> {
        let permit = self.running.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!(crate::metrics::FLIGHT_STATEMENTS, "kind" => kind, "outcome" => "refused").increment(1);
            Status::resource_exhausted(format!(
                "Too many simultaneous queries. Maximum: {} (TOO_MANY_SIMULTANEOUS_QUERIES)",
                self.limit
            ))
        })?;
        Ok(Recorded::start(kind, permit))
    }
}

/// One statement's metrics: in flight while it lives; counted by outcome and timed when it
/// ends, as an error unless it was marked otherwise.
struct Recorded {
    kind: &'static str,
    began: std::time::Instant,
    outcome: &'static str,
    _running: tokio::sync::OwnedSemaphorePermit,
}

impl Recorded {
    fn start(kind: &'static str, running: tokio::sync::OwnedSemaphorePermit) -> Recorded {
        metrics::gauge!(crate::metrics::FLIGHT_STATEMENTS_IN_FLIGHT).increment(1.0);
        Recorded { kind, began: std::time::Instant::now(), outcome: "error", _running: running }
    }

    fn ended(&mut self, outcome: &'static str) {
        self.outcome = outcome;
    }

    /// Marks `result` ok when it is, and hands it back.
    fn of<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
        if result.is_ok() {
            self.ended("ok");
        }
        result
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::FLIGHT_STATEMENTS_IN_FLIGHT).decrement(1.0);
        metrics::counter!(crate::metrics::FLIGHT_STATEMENTS, "kind" => self.kind, "outcome" => self.outcome)
            .increment(1);
        metrics::histogram!(crate::metrics::FLIGHT_STATEMENT_DURATION, "kind" => self.kind)
            .record(self.began.elapsed().as_secs_f64());
    }
}

fn info_of(schema: &Schema, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
    let ticket = TicketStatementQuery { statement_handle: ticket.into() };
    Ok(command_info(ticket.as_any(), schema, descriptor)?.with_ordered(true))
}

/// The FlightInfo whose ticket is `command` (a metadata command itself, or a statement's ticket).
fn command_info(
    command: arrow_flight::sql::Any,
    schema: &Schema,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(command.encode_to_vec()));
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("cannot encode the schema: {e}")))?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor))
}

/// A reply of one batch made already (metadata).
fn one_batch(schema: SchemaRef, batch: Result<RecordBatch, impl std::fmt::Display>) -> BatchStream {
    let batch = batch.map_err(|e| Status::internal(format!("the metadata batch: {e}")));
    encode(schema, futures::stream::iter([batch]))
}

/// GetPrimaryKeys' schema, as the Flight SQL protocol defines it.
fn primary_keys_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ]))
}

fn schema_bytes(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &Default::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| Status::internal(format!("cannot encode the schema: {e}")))?;
    Ok(bytes)
}

fn sql_info() -> SqlInfoData {
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "mergestream");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    // The Arrow IPC format version (Schema.fbs MetadataVersion V5).
    info.append(SqlInfo::FlightSqlServerArrowVersion, "1.5");
    info.append(SqlInfo::FlightSqlServerReadOnly, false);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, false);
    info.append(SqlInfo::FlightSqlServerTransaction, 0i32);
    info.append(SqlInfo::FlightSqlServerCancel, true);
    info.append(SqlInfo::SqlIdentifierQuoteChar, "`");
    info.append(SqlInfo::SqlDdlCatalog, false);
    info.append(SqlInfo::SqlDdlSchema, false);
    info.append(SqlInfo::SqlDdlTable, true);
    info.append(SqlInfo::SqlTransactionsSupported, false);
    // Built from constant values of the types the builder takes: it cannot fail.
    info.build().unwrap_or_else(|e| panic!("the SqlInfo table: {e}"))
}

#[tonic::async_trait]
impl FlightSqlService for FlightSqlServer {
    type FlightService = FlightSqlServer;

    async fn do_handshake(
        &self,
        request: Request<tonic::Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        let caller = Identity::of(&request);
        let reply = futures::stream::iter([Ok(HandshakeResponse::default())]);
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> = Response::new(Box::pin(reply));
        // The interceptor checked the credentials: the caller is one of the users, or anyone
        // on an open service. The token is its session either way.
        let token = self.users.issue(caller)?;
        let value = format!("Bearer {token}").parse().map_err(|_| Status::internal("the token's header"))?;
        response.metadata_mut().insert("authorization", value);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let caller = Identity::of(&request);
        Ok(Response::new(self.flight_info(query.query, request.into_inner(), caller).await?))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let prepared = self.prepared(&query.prepared_statement_handle)?;
        let caller = Identity::of(&request);
        let descriptor = request.into_inner();
        let info = match (&prepared.schema, prepared.placeholders) {
            // Described when it was prepared: its rows are read at DoGet.
            (Some(schema), 0) => info_of(schema, self.rows_ticket(prepared.sql)?.encode(), descriptor)?,
            _ => self.flight_info(prepared.query_sql()?, descriptor, caller).await?,
        };
        Ok(Response::new(info))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.rows(TicketBody::decode(&ticket.statement_handle)?, &Identity::of(&request)).await
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let prepared = self.prepared(&query.prepared_statement_handle)?;
        self.rows(self.rows_ticket(prepared.query_sql()?)?, &Identity::of(&request)).await
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let parameters = parameter_rows(request.into_inner()).await?;
        self.bind(&query.prepared_statement_handle, parameters)?;
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(query.prepared_statement_handle) })
    }

    async fn do_put_statement_update(
        &self,
        update: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        self.update(update.query, &Identity::of(&request)).await
    }

    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Identity::of(&request).may_write()?;
        self.admission.admit("ingest")?.of(ingest::ingest(&self.catalog, command, request.into_inner()).await)
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let prepared = self.prepared(&query.prepared_statement_handle)?;
        let caller = Identity::of(&request);
        let parameters = parameter_rows(request.into_inner()).await?;
        if prepared.placeholders == 0 {
            return self.update(prepared.sql, &caller).await;
        }
        // Once per row of values, as JDBC's executeBatch and ADBC's executemany mean it.
        let mut written = -1;
        for row in 0..parameters.num_rows() {
            let sql = bind(&prepared.sql, &parameters, row).map_err(status_of)?;
            let rows = self.update(sql, &caller).await?;
            if rows >= 0 {
                written = written.max(0) + rows;
            }
        }
        Ok(written)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let caller = Identity::of(&request);
        let sql = query.query;
        let placeholders = placeholders(&sql).map_err(status_of)?.len();
        // With placeholders: described with NULL bound to each, for the names and what types
        // it can; a statement that does not plan so is described again once bound.
        let nulls = null_parameters(placeholders);
        let described = bind(&sql, &nulls, 0).map_err(status_of)?;
        let schema = self
            .on_query_runtime(&caller, move |session: Session| async move {
                let (start, end) = only_statement(&described).map_err(status_of)?;
                match session.describe(&described, start, end).await {
                    Err(_) if placeholders > 0 => Ok(Some(Arc::new(Schema::empty()))),
                    described => described.map_err(status_of),
                }
            })
            .await?;
        let dataset_schema = schema_bytes(schema.as_deref().unwrap_or(&Schema::empty()))?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed).to_be_bytes().to_vec();
        {
            let mut statements = self.prepared.lock().map_err(|_| Status::internal("the prepared statements' lock"))?;
            if statements.len() >= MAX_PREPARED {
                return Err(Status::resource_exhausted(format!(
                    "{MAX_PREPARED} prepared statements are open: close some first"
                )));
            }
            statements.insert(handle.clone(), Prepared { sql, schema, placeholders, parameters: None });
        }
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema,
            parameter_schema: schema_bytes(&nulls.schema())?,
        })
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        _request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let info =
            FlightInfo::decode(query.info).map_err(|e| Status::invalid_argument(format!("the FlightInfo: {e}")))?;
        // CancelResult numbers its values as CancelStatus does (its module is not exported).
        let result = self.cancel(&info)?;
        Ok(ActionCancelQueryResult { result: result as i32 })
    }

    /// CancelFlightInfo, the Flight action (CancelQuery above is Flight SQL's older one).
    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type != CANCEL_FLIGHT_INFO {
            return Err(Status::invalid_argument(format!("unknown action '{}'", action.r#type)));
        }
        let request = CancelFlightInfoRequest::decode(action.body)
            .map_err(|e| Status::invalid_argument(format!("the CancelFlightInfoRequest: {e}")))?;
        let info = request.info.ok_or_else(|| Status::invalid_argument("CancelFlightInfoRequest without its info"))?;
        let result = CancelFlightInfoResult::new(self.cancel(&info)?);
        let body = arrow_flight::Result { body: result.encode_to_vec().into() };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(body)]))))
    }

    async fn list_custom_actions(&self) -> Option<Vec<Result<arrow_flight::ActionType, Status>>> {
        Some(vec![Ok(arrow_flight::ActionType {
            r#type: CANCEL_FLIGHT_INFO.into(),
            description: "Cancel the query of a FlightInfo: request CancelFlightInfoRequest, result \
                          CancelFlightInfoResult"
                .into(),
        })])
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        let mut statements = self.prepared.lock().map_err(|_| Status::internal("the prepared statements' lock"))?;
        statements.remove(query.prepared_statement_handle.as_ref());
        Ok(())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(&self.sql_info);
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME);
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for schema in [DATABASE, "system"] {
            builder.append(CATALOG_NAME, schema);
        }
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for table in self.tables().await? {
            builder
                .append(CATALOG_NAME, &table.schema, &table.name, table.kind, &table.columns)
                .map_err(|e| Status::internal(format!("the tables' listing: {e}")))?;
        }
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for kind in TABLE_TYPES {
            builder.append(kind);
        }
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Ok(Response::new(command_info(query.as_any(), &primary_keys_schema(), request.into_inner())?))
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let matches = |filter: &Option<String>, value: &str| filter.as_deref().is_none_or(|f| f == value);
        let tables: Vec<TableListing> = self
            .tables()
            .await?
            .into_iter()
            .filter(|t| {
                t.name == query.table && matches(&query.catalog, CATALOG_NAME) && matches(&query.db_schema, &t.schema)
            })
            .collect();
        let schema = primary_keys_schema();
        let keys: Vec<(&TableListing, usize, &String)> =
            tables.iter().flat_map(|t| t.primary_key.iter().enumerate().map(move |(i, c)| (t, i, c))).collect();
        let strings = |f: &dyn Fn(&(&TableListing, usize, &String)) -> String| -> ArrayRef {
            Arc::new(StringArray::from(keys.iter().map(f).collect::<Vec<_>>()))
        };
        let columns = vec![
            strings(&|_| CATALOG_NAME.to_string()),
            strings(&|(t, _, _)| t.schema.clone()),
            strings(&|(t, _, _)| t.name.clone()),
            strings(&|(_, _, c)| c.to_string()),
            strings(&|_| "primary_key".to_string()),
            Arc::new(Int32Array::from(keys.iter().map(|(_, i, _)| *i as i32 + 1).collect::<Vec<_>>())) as ArrayRef,
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns);
        Ok(Response::new(one_batch(schema, batch)))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&self.type_info).schema();
        Ok(Response::new(command_info(query.as_any(), &schema, request.into_inner())?))
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(&self.type_info);
        let schema = builder.schema();
        Ok(Response::new(one_batch(schema, builder.build())))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}
