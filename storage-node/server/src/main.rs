//! `storage-node`: the storage node's binary. `storage-node local` is the clickhouse-local of
//! mergestream: it runs SQL statements against a data directory and prints the results.
//! `storage-node serve` keeps the data directory open and serves the gRPC insert service.

mod config;
mod flight;
mod ingest;
mod interserver;
mod ipc;
mod metrics;
mod progress_line;
mod status;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mergestream_engine::commit::{CommitterFactory, LocalCommitters};
use mergestream_engine::Catalog;
use mergestream_query::{OutputFormat, Session, QUERY_THREAD_STACK};
use mergestream_replication::{ReplicaConfig, ReplicatedCommitters};

#[derive(Parser)]
#[command(name = "storage-node", version, about = "The mergestream storage node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run SQL statements against a local data directory, like clickhouse-local.
    Local(LocalArgs),
    /// Serve the gRPC insert service (schemas/ingest.proto) over a data directory.
    Serve(Box<ServeArgs>),
    /// Run SQL statements on a serving storage node and print the last one's output.
    Client(ClientArgs),
    /// Print a `serve --config` file with every setting and its default.
    ConfigExample,
    /// Print the table of every metric `serve --metrics-addr` exports (Markdown).
    Metrics,
}

#[derive(clap::Args)]
struct ClientArgs {
    /// The storage node's gRPC address.
    #[arg(long, default_value = "127.0.0.1:9100")]
    addr: String,
    /// Statements separated by ';'; read from standard input when absent.
    #[arg(long)]
    query: Option<String>,
    /// Output format: TSV, TSVWithNames, CSV, JSONEachRow, PrettyCompact, Null.
    #[arg(long, default_value = "TSV")]
    format: String,
    /// Connect with TLS, trusting the system's roots (a node started with --tls-cert).
    #[arg(long)]
    tls: bool,
    /// Connect with TLS, trusting this CA (PEM) for the node's certificate.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// The name the node's certificate is checked for, when it is not the address's host.
    #[arg(long)]
    tls_domain: Option<String>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML file with any of these settings (`storage-node config-example` prints one);
    /// flags given here win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The data directory (created if missing).
    #[arg(long)]
    path: Option<PathBuf>,
    /// Where the gRPC service listens [default: 127.0.0.1:9100].
    #[arg(long)]
    grpc_addr: Option<std::net::SocketAddr>,
    /// Where Arrow Flight SQL is served, HOST:PORT (off when absent).
    #[arg(long)]
    flight_addr: Option<std::net::SocketAddr>,
    /// The certificate chain (PEM) the insert service and Flight SQL present: TLS on both
    /// ports. Needs --tls-key.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Flight SQL statements running at once, past which one is refused with
    /// RESOURCE_EXHAUSTED [default: 1000].
    #[arg(long)]
    max_concurrent_queries: Option<usize>,
    /// The coordinator (or ZooKeeper) hosts, `host:port[,host:port…]`. Needed for replicated
    /// tables and for inserts that commit a source offset with their block.
    #[arg(long)]
    coordinator: Option<String>,
    /// The coordinator session timeout in milliseconds [default: 10000].
    #[arg(long)]
    session_timeout_ms: Option<u64>,
    #[command(flatten)]
    coordinator_tls: coordinator_client::TlsSettings,
    /// USER:PASSWORD to authenticate to the coordinator with (a digest identity); the nodes
    /// this node creates are then readable and writable by it alone.
    #[arg(long, env = "MERGESTREAM_COORDINATOR_IDENTITY", hide_env_values = true)]
    coordinator_identity: Option<String>,
    /// Where Prometheus metrics are served.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Threads running background merges [default: 2].
    #[arg(long)]
    merge_threads: Option<usize>,
    /// This node's name as a replica of its replicated tables (the `{replica}` macro).
    #[arg(long)]
    replica: Option<String>,
    /// Where other replicas reach this one, `host:port`, stored in the coordinator.
    #[arg(long)]
    interserver_addr: Option<String>,
    /// A macro of replicated tables' paths, `KEY=VALUE` (`--macro shard=01`); repeatable.
    #[arg(long = "macro", value_parser = parse_macro)]
    macros: Vec<(String, String)>,
}

impl ServeArgs {
    /// The settings after these flags, the config file and the defaults.
    fn resolve(self) -> Result<config::ServeConfig, config::ConfigError> {
        let file = match &self.config {
            Some(path) => config::ServeFile::read(path)?,
            None => config::ServeFile::default(),
        };
        let flags = config::ServeFlags {
            path: self.path,
            grpc_addr: self.grpc_addr,
            flight_addr: self.flight_addr,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            max_concurrent_queries: self.max_concurrent_queries,
            coordinator: self.coordinator,
            session_timeout_ms: self.session_timeout_ms,
            coordinator_tls: self.coordinator_tls,
            coordinator_identity: self.coordinator_identity,
            metrics_addr: self.metrics_addr,
            merge_threads: self.merge_threads,
            replica: self.replica,
            interserver_addr: self.interserver_addr,
            macros: self.macros,
        };
        config::ServeConfig::resolve(flags, file)
    }
}

fn parse_macro(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !key.contains(['{', '}']) => Ok((key.into(), value.into())),
        _ => Err(format!("expected KEY=VALUE, got '{text}'")),
    }
}

#[derive(clap::Args)]
struct LocalArgs {
    /// The data directory (created if missing).
    #[arg(long)]
    path: PathBuf,
    /// Statements separated by ';'; read from standard input when absent.
    #[arg(long)]
    query: Option<String>,
    /// Output format: TSV, TSVWithNames, CSV, JSONEachRow, PrettyCompact, Null.
    #[arg(long, default_value = "TSV")]
    format: String,
    /// Print each statement's elapsed seconds on standard error.
    #[arg(long)]
    time: bool,
    /// Threads running background merges.
    #[arg(long, default_value_t = 2)]
    merge_threads: usize,
}

/// What a caught panic said, for the error that answers it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

fn main() -> ExitCode {
    mergestream_cli::init_logging("warn");
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Local(args) => run_local(args),
        Command::Serve(args) => run_serve(*args),
        Command::Client(args) => run_client(args),
        Command::ConfigExample => {
            print!("{}", config::example());
            Ok(())
        }
        Command::Metrics => {
            print!("{}", mergestream_telemetry::markdown_table(metrics::CATALOGUES));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The statements of `--query`, or of standard input without it.
fn script_of(query: Option<String>) -> anyhow::Result<String> {
    match query {
        Some(q) => Ok(q),
        None => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("cannot read statements from standard input")?;
            Ok(text)
        }
    }
}

fn run_local(args: LocalArgs) -> anyhow::Result<()> {
    let format = OutputFormat::parse(&args.format)?;
    let script = script_of(args.query)?;
    let catalog = Arc::new(
        Catalog::open(&args.path, args.merge_threads)
            .with_context(|| format!("cannot open the data directory {}", args.path.display()))?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(QUERY_THREAD_STACK)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    // The script runs on a thread of the query stack's size, not on the main thread.
    std::thread::Builder::new()
        .name("local".into())
        .stack_size(QUERY_THREAD_STACK)
        .spawn(move || run_script(runtime, catalog, format, script, args.time))
        .context("cannot start the query thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the query thread panicked"))?
}

fn run_script(
    runtime: tokio::runtime::Runtime,
    catalog: Arc<Catalog>,
    format: OutputFormat,
    script: String,
    show_time: bool,
) -> anyhow::Result<()> {
    let mut session = Session::new(catalog, format);
    let line = progress_line::ProgressLine::on_stderr(Some(session.progress()));
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    line.statement_started();
    let result = runtime.block_on(session.run_script(&script, |_, text, elapsed| {
        line.statement_finished();
        if write_error.is_none() {
            if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
                write_error = Some(e);
            }
        }
        if show_time {
            eprintln!("{:.3}", elapsed.as_secs_f64());
        }
        // The statements run one after another: the next one starts now.
        line.statement_started();
    }));
    drop(line);
    if let Some(e) = write_error {
        return Err(e).context("cannot write the result");
    }
    result.map_err(anyhow::Error::from)
}

/// The connections a listener accepts, with Nagle's algorithm off: a reply's small HTTP/2
/// frames otherwise wait for the peer's delayed ACK, 40 ms on Linux (every part fetch and
/// every insert took that long).
fn without_nagle(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// How often the part gauges (active parts, rows, bytes per table) are computed.
const PART_GAUGES_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    let args = args.resolve()?;
    // Checked before anything starts: a wrong file is named now, not at a client's handshake.
    let tls = args.tls.as_ref().map(|files| files.load()).transpose().context("cannot set up TLS")?;
    let metrics_addr = args.metrics_addr;
    if let Some(addr) = metrics_addr {
        mergestream_cli::serve_metrics(addr, metrics::CATALOGUES).context("cannot start the metrics exporter")?;
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    let coordinator = args.coordinator.map(|hosts| {
        let timeout = std::time::Duration::from_millis(args.session_timeout_ms);
        Arc::new(ingest::Coordinator::new(hosts, timeout, args.coordinator_access.clone()))
    });
    let interserver_addr = args.interserver_addr.clone();
    // With a coordinator, replicated tables commit through it, and inserts' extra ops (the
    // ingestor's offset node) go in the same multi; without one, every table is local.
    let committers: Arc<dyn CommitterFactory> = match &coordinator {
        Some(session) => Arc::new(ReplicatedCommitters::new(
            session.clone(),
            ReplicaConfig {
                replica: args.replica,
                interserver_addr: args.interserver_addr,
                macros: args.macros.into_iter().collect(),
                identity: mergestream_replication::activation::server_identity(&args.path)
                    .with_context(|| format!("cannot read this server's identity in {}", args.path.display()))?,
            },
            runtime.handle().clone(),
        )),
        None => Arc::new(LocalCommitters::default()),
    };
    let catalog = Arc::new(
        Catalog::open_with(&args.path, args.merge_threads, committers)
            .with_context(|| format!("cannot open the data directory {}", args.path.display()))?,
    );
    let queries = tokio::runtime::Builder::new_multi_thread()
        .thread_name("query")
        .thread_stack_size(QUERY_THREAD_STACK)
        .enable_all()
        .build()
        .context("cannot start the query runtime")?;
    let query_handle = queries.handle().clone();
    let served = runtime.block_on(async move {
        if let Some(addr) = interserver_addr {
            // Other replicas fetch parts here; it lives as long as the process.
            let listener =
                tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
            tracing::info!(addr, "serving the interserver service");
            let service = interserver::InterserverService::new(catalog.clone());
            tokio::spawn(async move {
                let served = tonic::transport::Server::builder()
                    .add_service(mergestream_proto::interserver::interserver_server::InterserverServer::new(service))
                    .serve_with_incoming(without_nagle(listener))
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "the interserver service failed");
                }
            });
        }
        if metrics_addr.is_some() {
            let catalog = catalog.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(PART_GAUGES_PERIOD);
                loop {
                    every.tick().await;
                    let catalog = catalog.clone();
                    // It locks every table's state in turn: not on the runtime's threads.
                    let _ = tokio::task::spawn_blocking(move || catalog.publish_part_gauges()).await;
                }
            });
        }
        if let Some(addr) = args.flight_addr {
            let listener =
                tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
            let users = flight::auth::Users::new(&args.users);
            if users.is_open() {
                tracing::warn!(
                    %addr,
                    "Arrow Flight SQL is OPEN: no [[users]] in the config file, so anyone who reaches this port may \
                     read and write every table"
                );
            } else {
                tracing::info!(%addr, users = args.users.len(), "serving Arrow Flight SQL");
            }
            let service = flight::FlightSqlServer::new(catalog.clone(), query_handle.clone(), users.clone())
                .with_max_concurrent_queries(args.max_concurrent_queries);
            // Every call, the handshake included, is checked before a handler runs.
            let service = tonic::service::interceptor::InterceptedService::new(
                arrow_flight::flight_service_server::FlightServiceServer::new(service)
                    .max_decoding_message_size(256 << 20),
                move |request| users.check(request),
            );
            let mut builder = with_tls(tonic::transport::Server::builder(), tls.as_ref())?;
            tokio::spawn(async move {
                let served = builder
                    .add_service(service)
                    .serve_with_incoming(without_nagle(listener))
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "the Flight SQL service failed");
                }
            });
        }
        let service = ingest::IngestService::new(catalog.clone(), coordinator, query_handle);
        service.recover().await.context("cannot resolve the prepared inserts left by the last run")?;
        catalog.start_replication();
        let listener = tokio::net::TcpListener::bind(args.grpc_addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.grpc_addr))?;
        tracing::info!(addr = %args.grpc_addr, tls = tls.is_some(), "serving the insert service");
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        with_tls(tonic::transport::Server::builder(), tls.as_ref())?
            .add_service(
                mergestream_proto::ingest::ingest_server::IngestServer::new(service)
                    .max_decoding_message_size(256 << 20),
            )
            .serve_with_incoming_shutdown(without_nagle(listener), shutdown)
            .await
            .context("the gRPC server failed")
    });
    // Outside the server's runtime: a runtime cannot be dropped from within another one.
    drop(queries);
    served
}

/// A server builder with TLS when the node has a certificate.
fn with_tls(
    builder: tonic::transport::Server,
    tls: Option<&tonic::transport::ServerTlsConfig>,
) -> anyhow::Result<tonic::transport::Server> {
    match tls {
        Some(config) => builder.tls_config(config.clone()).context("cannot set up TLS"),
        None => Ok(builder),
    }
}

/// A status's message, with the transport's reasons when the call never reached the service
/// (and, over plain text, the likeliest of them: a node that serves TLS).
fn status_text(status: &tonic::Status, tls: bool) -> String {
    let text = mergestream_proto::status_text(status);
    if tls || std::error::Error::source(status).is_none() {
        text
    } else {
        format!("{text} (if the node serves TLS, give --tls-ca or --tls)")
    }
}

fn run_client(args: ClientArgs) -> anyhow::Result<()> {
    use mergestream_engine::progress::ReadCounts;
    use mergestream_proto::ingest::query_event;

    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")?;
    let output = runtime.block_on(async {
        let tls = mergestream_proto::tls::ClientTls { enabled: args.tls, ca: args.tls_ca, domain: args.tls_domain };
        let endpoint = tls.endpoint(&args.addr)?;
        let tls_enabled = tls.is_enabled();
        let channel =
            endpoint.connect().await.with_context(|| format!("cannot connect to the storage node at {}", args.addr))?;
        let mut client = mergestream_proto::ingest::ingest_client::IngestClient::new(channel)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        let request = mergestream_proto::ingest::QueryRequest { sql: script_of(args.query)?, format: args.format };
        let mut events = client
            .query_with_progress(request)
            .await
            .map_err(|s| anyhow::anyhow!("{}", status_text(&s, tls_enabled)))?
            .into_inner();
        // The server reports what the running statement has read; the line shows it.
        let line = progress_line::ProgressLine::on_stderr(None);
        let mut statement = 0;
        line.statement_started();
        loop {
            let event = events.message().await.map_err(|s| anyhow::anyhow!("{}", status_text(&s, tls_enabled)))?;
            match event.and_then(|e| e.event) {
                Some(query_event::Event::Progress(p)) => {
                    if p.statement != statement {
                        statement = p.statement;
                        line.statement_started();
                    }
                    line.update(ReadCounts { rows: p.rows_read, bytes: p.bytes_read });
                }
                Some(query_event::Event::Output(output)) => return anyhow::Ok(output),
                None => anyhow::bail!("the storage node ended the query without its output"),
            }
        }
    })?;
    print!("{output}");
    Ok(())
}

#[cfg(test)]
mod command_line_tests {
    #[test]
    fn the_command_line_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
