//! Load generator for the coordinator benchmark: creates, then overwrites, then reads N znodes
//! through the `zookeeper-client` crate from several sessions with many requests in flight, and
//! prints one JSON line per phase with the throughput and the latency percentiles. It speaks
//! only the ZooKeeper protocol, so the same run measures Apache ZooKeeper and the coordinator;
//! `bench/coordinator.py` starts both and prints the ratios.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use coordinator_client::{Keeper, NodeKind};

#[derive(Parser, Debug)]
#[command(about = "Measures create, setData and getData against a ZooKeeper-protocol server")]
struct Args {
    /// host:port[,host:port...] of the servers.
    #[arg(long)]
    hosts: String,
    /// Name printed with the results.
    #[arg(long, default_value = "server")]
    label: String,
    /// Znodes created, then set, then read.
    #[arg(long, default_value_t = 20_000)]
    ops: usize,
    /// Client sessions, each its own connection.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// Requests in flight per session.
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Bytes of data per create and set.
    #[arg(long, default_value_t = 100)]
    data_bytes: usize,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Create,
    SetData,
    GetData,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::SetData => "setData",
            Phase::GetData => "getData",
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let timeout = Duration::from_secs(20);
    let mut keepers = Vec::with_capacity(args.sessions);
    for _ in 0..args.sessions.max(1) {
        keepers.push(
            Keeper::connect(&args.hosts, timeout).await.with_context(|| format!("connecting to {}", args.hosts))?,
        );
    }
    let root = format!("/bench-{}-{}", std::process::id(), keepers[0].session_id());
    keepers[0].ensure_path(&root).await?;
    let root = Arc::new(root);
    let data = Arc::new(vec![b'x'; args.data_bytes]);
    for phase in [Phase::Create, Phase::SetData, Phase::GetData] {
        let (elapsed, mut latencies) = run_phase(phase, &keepers, &root, &data, &args).await?;
        latencies.sort_unstable();
        let pct = |p: f64| {
            let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
            latencies[i] as f64 / 1000.0
        };
        let line = serde_json::json!({
            "target": args.label,
            "op": phase.name(),
            "ops": latencies.len(),
            "seconds": elapsed.as_secs_f64(),
            "ops_per_sec": latencies.len() as f64 / elapsed.as_secs_f64(),
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "p999_ms": pct(0.999),
            "max_ms": pct(1.0),
        });
        println!("{line}");
    }
    Ok(())
}

/// Runs one phase over all znodes; returns its wall time and each request's latency in µs.
async fn run_phase(
    phase: Phase,
    keepers: &[Keeper],
    root: &Arc<String>,
    data: &Arc<Vec<u8>>,
    args: &Args,
) -> anyhow::Result<(Duration, Vec<u64>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for keeper in keepers {
        for _ in 0..args.in_flight.max(1) {
            let (keeper, next, root, data, total) =
                (keeper.clone(), next.clone(), root.clone(), data.clone(), args.ops);
            workers.spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(latencies);
                    }
                    let path = format!("{root}/n{i}");
                    let t = Instant::now();
                    match phase {
                        Phase::Create => keeper.create(&path, &data, NodeKind::Persistent).await.map(drop),
                        Phase::SetData => keeper.set(&path, &data, None).await.map(drop),
                        Phase::GetData => keeper.get(&path).await.map(drop),
                    }
                    .with_context(|| format!("{} {path}", phase.name()))?;
                    latencies.push(t.elapsed().as_micros() as u64);
                }
            });
        }
    }
    let mut all = Vec::with_capacity(args.ops);
    while let Some(done) = workers.join_next().await {
        all.extend(done.context("a bench worker panicked")??);
    }
    Ok((started.elapsed(), all))
}
