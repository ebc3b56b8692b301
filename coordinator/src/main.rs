//! `coordinator serve`: one node of the Keeper.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use mergestream_coordinator::node::{Coordinator, NodeConfig};
use mergestream_coordinator::raft::transport::ClusterKey;
use mergestream_coordinator::server;

#[derive(Parser)]
#[command(name = "coordinator", about = "mergestream's Keeper: ZooKeeper protocol, replicated with Raft")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run one node. Alone it is a cluster of one; with --peer it joins the others.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long)]
    node_id: u64,
    /// Where ZooKeeper clients connect.
    #[arg(long)]
    client_addr: SocketAddr,
    /// Where the other nodes reach this one.
    #[arg(long)]
    raft_addr: SocketAddr,
    #[arg(long)]
    data_dir: PathBuf,
    /// Another member, as ID=HOST:PORT (its Raft address); repeat for each.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<(u64, String)>,
    /// ZooKeeper's tickTime in milliseconds: session timeouts are held between 2 and 20 ticks.
    #[arg(long, default_value_t = 2000)]
    tick_ms: u32,
    /// Take a snapshot (and compact the log) after this many entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// A file holding the secret every member of the cluster shares (at least 16 bytes;
    /// surrounding whitespace is ignored). Peers authenticate with it; needed with --peer.
    #[arg(long, env = "MERGESTREAM_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// How long a client connection may take to send its handshake before it is closed
    /// (ZooKeeper's zookeeper.nio.sessionlessCnxnTimeout).
    #[arg(long, default_value_t = 10_000)]
    handshake_timeout_ms: u64,
}

fn parse_peer(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s.split_once('=').ok_or_else(|| format!("expected ID=HOST:PORT, got {s:?}"))?;
    let id = id.parse().map_err(|_| format!("peer id {id:?} is not a number"))?;
    Ok((id, addr.to_string()))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Commands::Serve(args) = Cli::parse().command;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut peers = BTreeMap::new();
    for (id, addr) in args.peers {
        if id == args.node_id {
            bail!("--peer {id}={addr} has this node's own id");
        }
        if peers.insert(id, addr).is_some() {
            bail!("peer {id} is given twice");
        }
    }
    if args.tick_ms == 0 {
        bail!("--tick-ms must be positive");
    }
    let cluster_key = match &args.cluster_secret_file {
        Some(path) => {
            let secret =
                std::fs::read(path).with_context(|| format!("reading the cluster secret {}", path.display()))?;
            let key = ClusterKey::new(secret.trim_ascii()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(std::sync::Arc::new(key))
        }
        None => None,
    };
    if args.handshake_timeout_ms == 0 {
        bail!("--handshake-timeout-ms must be positive");
    }
    if let Some(addr) = args.metrics_addr {
        mergestream_coordinator::node::install_metrics_exporter(addr).context("starting the metrics exporter")?;
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
    };
    let listener = tokio::net::TcpListener::bind(config.client_addr)
        .await
        .with_context(|| format!("listening for clients on {}", config.client_addr))?;
    let node = Coordinator::start(config).await?;
    tracing::info!(node = node.config.node_id, client = %node.config.client_addr, raft = %node.config.raft_addr, "coordinator serving");
    tokio::select! {
        _ = server::serve_clients(node.clone(), listener) => {}
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
