//! `coordinator serve`: one node of the Keeper.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use mergestream_coordinator::node::{Coordinator, NodeConfig};
use mergestream_coordinator::raft::transport::ClusterKey;
use mergestream_coordinator::server;

mod serve_config;

#[derive(Parser)]
#[command(name = "coordinator", about = "mergestream's Keeper: ZooKeeper protocol, replicated with Raft")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run one node. Alone it is a cluster of one; with --peer it joins the others.
    Serve(Box<ServeArgs>),
    /// Print a `serve --config` file with every setting and its default.
    ConfigExample,
    /// Print the table of every metric `serve --metrics-addr` exports (Markdown).
    Metrics,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML file with any of these settings (`coordinator config-example` prints one);
    /// flags given here win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    node_id: Option<u64>,
    /// Where ZooKeeper clients connect.
    #[arg(long)]
    client_addr: Option<SocketAddr>,
    /// Where the other nodes reach this one.
    #[arg(long)]
    raft_addr: Option<SocketAddr>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Another member, as ID=HOST:PORT (its Raft address); repeat for each.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<(u64, String)>,
    /// ZooKeeper's tickTime in milliseconds: session timeouts are held between 2 and 20 ticks
    /// [default: 2000].
    #[arg(long)]
    tick_ms: Option<u32>,
    /// Take a snapshot (and compact the log) after this many entries [default: 10000].
    #[arg(long)]
    snapshot_every: Option<u64>,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// A file holding the secret every member of the cluster shares (at least 16 bytes;
    /// surrounding whitespace is ignored). Peers authenticate with it; needed with --peer.
    /// Or give the secret itself in MERGESTREAM_CLUSTER_SECRET.
    #[arg(long, env = "MERGESTREAM_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// How long a client connection may take to send its handshake before it is closed
    /// (ZooKeeper's zookeeper.nio.sessionlessCnxnTimeout) [default: 10000].
    #[arg(long)]
    handshake_timeout_ms: Option<u64>,
    /// Also serve clients over TLS here (ZooKeeper's secureClientPort); needs --tls-cert and
    /// --tls-key.
    #[arg(long)]
    secure_client_addr: Option<SocketAddr>,
    /// The secure port's certificate chain, PEM.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The secure port's private key, PEM.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// A CA certificate (PEM): clients of the secure port must then present a certificate it
    /// signed.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// The superuser as USER:HASH, the hash the base64 of the SHA-1 of `user:password`
    /// (ZooKeeper's zookeeper.DigestAuthenticationProvider.superDigest): a client that adds
    /// that digest passes every ACL.
    #[arg(long, env = "MERGESTREAM_SUPER_DIGEST", hide_env_values = true)]
    super_digest: Option<String>,
}

impl ServeArgs {
    /// The settings after these flags, the config file and the defaults.
    fn resolve(self) -> Result<serve_config::ServeConfig, mergestream_cli::ConfigError> {
        let file = match &self.config {
            Some(path) => mergestream_cli::read_toml(path)?,
            None => serve_config::ServeFile::default(),
        };
        let flags = serve_config::ServeFlags {
            node_id: self.node_id,
            client_addr: self.client_addr,
            raft_addr: self.raft_addr,
            data_dir: self.data_dir,
            tick_ms: self.tick_ms,
            snapshot_every: self.snapshot_every,
            metrics_addr: self.metrics_addr,
            cluster_secret_file: self.cluster_secret_file,
            handshake_timeout_ms: self.handshake_timeout_ms,
            secure_client_addr: self.secure_client_addr,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            tls_client_ca: self.tls_client_ca,
            super_digest: self.super_digest,
            peers: self.peers,
        };
        serve_config::ServeConfig::resolve(flags, file)
    }
}

fn parse_peer(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s.split_once('=').ok_or_else(|| format!("expected ID=HOST:PORT, got {s:?}"))?;
    let id = id.parse().map_err(|_| format!("peer id {id:?} is not a number"))?;
    Ok((id, addr.to_string()))
}

fn main() -> anyhow::Result<()> {
    mergestream_cli::init_logging("info,openraft=warn");
    let args = match Cli::parse().command {
        Commands::Serve(args) => args.resolve()?,
        Commands::ConfigExample => {
            print!("{}", serve_config::example());
            return Ok(());
        }
        Commands::Metrics => {
            print!("{}", mergestream_telemetry::markdown_table(&[mergestream_coordinator::metrics::ALL]));
            return Ok(());
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args))
}

/// The cluster secret itself, for deployments that hand secrets over in the environment.
const CLUSTER_SECRET_VARIABLE: &str = "MERGESTREAM_CLUSTER_SECRET";

async fn serve(args: serve_config::ServeConfig) -> anyhow::Result<()> {
    let peers = args.peers;
    if let Some(addr) = peers.get(&args.node_id) {
        bail!("peer {}={addr} has this node's own id", args.node_id);
    }
    if args.tick_ms == 0 {
        bail!("--tick-ms must be positive");
    }
    let cluster_key = match (&args.cluster_secret_file, std::env::var(CLUSTER_SECRET_VARIABLE).ok()) {
        (Some(path), Some(_)) => {
            bail!("the cluster secret is given twice, by {} and by {CLUSTER_SECRET_VARIABLE}: give one", path.display())
        }
        (Some(path), None) => {
            let secret =
                std::fs::read(path).with_context(|| format!("reading the cluster secret {}", path.display()))?;
            let key = ClusterKey::new(secret.trim_ascii()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(std::sync::Arc::new(key))
        }
        (None, Some(secret)) => {
            let key = ClusterKey::new(secret.trim().as_bytes())
                .map_err(|e| anyhow::anyhow!("{CLUSTER_SECRET_VARIABLE}: {e}"))?;
            Some(std::sync::Arc::new(key))
        }
        (None, None) => None,
    };
    if args.handshake_timeout_ms == 0 {
        bail!("--handshake-timeout-ms must be positive");
    }
    if let Some(addr) = args.metrics_addr {
        mergestream_cli::serve_metrics(addr, &[mergestream_coordinator::metrics::ALL])
            .context("starting the metrics exporter")?;
    }
    let config = NodeConfig {
        node_id: args.node_id,
        client_addr: args.client_addr,
        raft_addr: args.raft_addr,
        data_dir: args.data_dir,
        peers,
        tick_ms: args.tick_ms,
        snapshot_every: args.snapshot_every,
        cluster_key,
        handshake_timeout: std::time::Duration::from_millis(args.handshake_timeout_ms),
        super_digest: args.super_digest,
    };
    let listener = tokio::net::TcpListener::bind(config.client_addr)
        .await
        .with_context(|| format!("listening for clients on {}", config.client_addr))?;
    let secure = match &args.secure {
        Some((addr, files)) => {
            let acceptor = server::tls::acceptor(files).context("setting up TLS on the secure client port")?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for TLS clients on {addr}"))?;
            Some((listener, acceptor))
        }
        None => None,
    };
    let node = Coordinator::start(config).await?;
    tracing::info!(
        node = node.config.node_id,
        client = %node.config.client_addr,
        secure_client = ?args.secure.as_ref().map(|(addr, _)| addr),
        raft = %node.config.raft_addr,
        "coordinator serving"
    );
    let serve_secure = async {
        match secure {
            Some((listener, acceptor)) => server::serve_clients(node.clone(), listener, Some(acceptor)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = server::serve_clients(node.clone(), listener, None) => {}
        _ = serve_secure => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
        _ = terminate() => tracing::info!("terminated"),
    }
    let _ = node.raft.shutdown().await;
    Ok(())
}

async fn terminate() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
