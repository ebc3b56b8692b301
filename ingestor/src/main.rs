//! `ingestor`: `check` validates a pipeline file; `run` consumes it into the storage node.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use mergestream_ingestor::pipeline::{Pipeline, PipelineError, Source};
use mergestream_ingestor::produce::{produce, ProduceOptions};
use mergestream_ingestor::runner::{RunOptions, Runner};
use mergestream_ingestor::source::kafka::Kafka;
use mergestream_ingestor::source::nats::Nats;

mod run_config;

#[derive(Parser)]
#[command(name = "ingestor", version, about = "Kafka and NATS JetStream → mergestream tables, exactly once")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a pipeline file; every problem is printed as file:line:column: message.
    Check {
        #[arg(long)]
        pipeline: PathBuf,
    },
    /// Run a pipeline until SIGTERM or Ctrl-C, then flush and commit what is buffered.
    Run(Box<RunArgs>),
    /// Print a `run --config` file with every setting and its default.
    ConfigExample,
    /// Print the table of every metric `run --metrics-addr` exports (Markdown).
    Metrics,
    /// Write sample order events (ids that repeat, updates, deletes) to a Kafka topic, created
    /// when missing; prints, as JSON, what `orders FINAL` holds once they are ingested
    /// (pipelines/quickstart.yaml).
    Produce(ProduceArgs),
}

#[derive(clap::Args)]
struct ProduceArgs {
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    #[arg(long, default_value = "orders")]
    topic: String,
    /// The topic's partitions, when it has to be created.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..))]
    partitions: i32,
    /// Messages to send.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Messages per second (0: as fast as the broker takes them).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Distinct order ids: fewer keys, more updates per order.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// The share of events for an existing order that delete it.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=100))]
    delete_percent: u8,
    /// The generator's seed: the same seed sends the same events.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
struct RunArgs {
    /// A TOML file with any of these settings (`ingestor config-example` prints one); flags
    /// given here win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    pipeline: Option<PathBuf>,
    /// The storage node's gRPC address; for replicated tables, each replica's (repeated, or
    /// comma-separated): a block whose node is out of reach goes to the next
    /// [default: 127.0.0.1:9100].
    #[arg(long, value_delimiter = ',')]
    storage_node: Vec<String>,
    /// The coordinator (or ZooKeeper) hosts, host:port[,host:port…] [default: 127.0.0.1:2181].
    #[arg(long)]
    coordinator: Option<String>,
    /// This instance's name in the coordinator (default: host name and process id).
    #[arg(long)]
    instance: Option<String>,
    /// The coordinator session timeout: how long a dead ingestor keeps its partitions
    /// [default: 6000].
    #[arg(long)]
    session_timeout_ms: Option<u64>,
    #[command(flatten)]
    coordinator_tls: coordinator_client::TlsSettings,
    /// USER:PASSWORD to authenticate to the coordinator with (a digest identity); the nodes
    /// this ingestor creates are then readable and writable by it alone.
    #[arg(long, env = "MERGESTREAM_COORDINATOR_IDENTITY", hide_env_values = true)]
    coordinator_identity: Option<String>,
    /// Where Prometheus metrics are served.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    storage_tls: run_config::StorageTls,
}

impl RunArgs {
    /// The settings after these flags, the config file and the defaults.
    fn resolve(self) -> Result<run_config::RunConfig, mergestream_cli::ConfigError> {
        let file = match &self.config {
            Some(path) => mergestream_cli::read_toml(path)?,
            None => run_config::RunFile::default(),
        };
        let flags = run_config::RunFlags {
            pipeline: self.pipeline,
            storage_nodes: self.storage_node,
            coordinator: self.coordinator,
            instance: self.instance,
            session_timeout_ms: self.session_timeout_ms,
            coordinator_tls: self.coordinator_tls,
            coordinator_identity: self.coordinator_identity,
            metrics_addr: self.metrics_addr,
            storage_tls: self.storage_tls,
        };
        run_config::RunConfig::resolve(flags, file)
    }
}

fn main() -> ExitCode {
    mergestream_cli::init_logging("info");
    match Cli::parse().command {
        Command::Check { pipeline } => match Pipeline::load(&pipeline) {
            Ok(p) => {
                let source = match &p.source {
                    Source::Kafka(k) => format!("kafka topics {}", k.topics.join(", ")),
                    Source::Nats(n) => format!("nats stream {}", n.stream),
                };
                let tables: Vec<&str> = p.tables.iter().map(|t| t.name.as_str()).collect();
                println!("{}: ok (pipeline {}: {source} → {})", pipeline.display(), p.name, tables.join(", "));
                ExitCode::SUCCESS
            }
            Err(e @ PipelineError::Invalid { .. }) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::ConfigExample => {
            print!("{}", run_config::example());
            ExitCode::SUCCESS
        }
        Command::Metrics => {
            print!("{}", mergestream_telemetry::markdown_table(&[mergestream_ingestor::metrics::ALL]));
            ExitCode::SUCCESS
        }
        Command::Produce(args) => {
            let options = ProduceOptions {
                brokers: args.brokers,
                topic: args.topic,
                partitions: args.partitions,
                count: args.count,
                rate: args.rate,
                keys: args.keys,
                delete_percent: args.delete_percent,
                seed: args.seed,
            };
            match produce(&options).map_err(anyhow::Error::from).and_then(|s| Ok(serde_json::to_string(&s)?)) {
                Ok(expected) => {
                    println!("{expected}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => match args.resolve().map_err(anyhow::Error::from).and_then(run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run(args: run_config::RunConfig) -> anyhow::Result<()> {
    let pipeline = Pipeline::load(&args.pipeline)?;
    if let Some(addr) = args.metrics_addr {
        mergestream_cli::serve_metrics(addr, &[mergestream_ingestor::metrics::ALL])?;
    }
    let instance = args.instance.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
        format!("{host}-{}", std::process::id())
    });
    let options = RunOptions {
        storage_nodes: args.storage_nodes,
        storage_tls: args.storage_tls,
        coordinator: args.coordinator,
        instance,
        session_timeout: Duration::from_millis(args.session_timeout_ms),
        coordinator_access: args.coordinator_access,
    };
    tracing::info!(pipeline = pipeline.name, instance = options.instance, "starting");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        match pipeline.source.clone() {
            Source::Kafka(kafka) => {
                let source = Kafka::new(&kafka, pipeline.max_in_flight_bytes, pipeline.message_parts())?;
                Runner::start(pipeline, source, options).await?.run(shutdown_signal()).await?;
            }
            Source::Nats(nats) => {
                let source = Nats::connect(&nats).await?;
                Runner::start(pipeline, source, options).await?.run(shutdown_signal()).await?;
            }
        }
        Ok(())
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        // Flattened groups of flags (the coordinator's TLS, the storage nodes') must not share
        // an argument id: clap finds that only when it parses, so at the first run otherwise.
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
