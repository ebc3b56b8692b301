//! ZooKeeper's four-letter words, sent instead of a connect request: `ruok`, `srvr`, `stat`,
//! `mntr`, `conf`, `envi`, `isro`. The answer is plain text and the connection closes.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::node::Coordinator;

pub fn answer(node: &Coordinator, word: &[u8; 4]) -> Option<String> {
    Some(match word {
        b"ruok" => "imok".to_string(),
        b"srvr" => srvr(node),
        b"stat" => {
            let mut s = srvr(node);
            s.insert_str(s.find("Latency").unwrap_or(0), "Clients:\n\n");
            s
        }
        b"mntr" => mntr(node),
        b"conf" => conf(node),
        b"envi" => envi(node),
        // Clients in a read-only session probe servers with this to find one that writes.
        b"isro" => if node.reaches_quorum() { "rw" } else { "ro" }.to_string(),
        _ => return None,
    })
}

/// The ZooKeeper version whose protocol and behaviour the coordinator reproduces, then ours:
/// clients parse the leading digits to choose what to send (kazoo's `server_version`).
const VERSION: &str = concat!("3.8.0-mergestream-", env!("CARGO_PKG_VERSION"));

fn latency(node: &Coordinator) -> (f64, f64) {
    let count = node.stats.latency_count.load(Ordering::Relaxed).max(1);
    let avg = node.stats.latency_total_us.load(Ordering::Relaxed) as f64 / count as f64 / 1000.0;
    let max = node.stats.latency_max_us.load(Ordering::Relaxed) as f64 / 1000.0;
    (avg, max)
}

fn srvr(node: &Coordinator) -> String {
    let inner = node.state.lock();
    let (avg, max) = latency(node);
    let mut s = String::new();
    let _ = writeln!(s, "Zookeeper version: {VERSION}");
    let _ = writeln!(s, "Latency min/avg/max: 0/{avg:.4}/{max:.4}");
    let _ = writeln!(s, "Received: {}", node.stats.received.load(Ordering::Relaxed));
    let _ = writeln!(s, "Sent: {}", node.stats.sent.load(Ordering::Relaxed));
    let _ = writeln!(s, "Connections: {}", node.stats.connections.load(Ordering::Relaxed));
    let _ = writeln!(s, "Outstanding: 0");
    let _ = writeln!(s, "Zxid: 0x{:x}", inner.tree.last_zxid());
    let _ = writeln!(s, "Mode: {}", node.mode());
    let _ = writeln!(s, "Node count: {}", inner.tree.node_count());
    s
}

fn mntr(node: &Coordinator) -> String {
    let metrics = node.raft.metrics().borrow().clone();
    let inner = node.state.lock();
    let (avg, max) = latency(node);
    let mut s = String::new();
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k}\t{v}");
    };
    line("zk_version", VERSION.to_string());
    line("zk_avg_latency", format!("{avg:.4}"));
    line("zk_max_latency", format!("{max:.4}"));
    line("zk_min_latency", "0".into());
    line("zk_packets_received", node.stats.received.load(Ordering::Relaxed).to_string());
    line("zk_packets_sent", node.stats.sent.load(Ordering::Relaxed).to_string());
    line("zk_num_alive_connections", node.stats.connections.load(Ordering::Relaxed).to_string());
    line("zk_outstanding_requests", "0".into());
    line("zk_server_state", node.mode().into());
    line("zk_znode_count", inner.tree.node_count().to_string());
    line("zk_watch_count", inner.watches.count().to_string());
    line("zk_ephemerals_count", inner.tree.ephemeral_count().to_string());
    line("zk_global_sessions", inner.tree.sessions().count().to_string());
    line("zk_last_zxid", inner.tree.last_zxid().to_string());
    line("raft_node_id", node.config.node_id.to_string());
    line("raft_term", metrics.current_term.to_string());
    line("raft_leader", metrics.current_leader.map_or("none".into(), |l| l.to_string()));
    line("raft_last_log_index", metrics.last_log_index.unwrap_or(0).to_string());
    line("raft_last_applied", metrics.last_applied.map_or(0, |l| l.index).to_string());
    line("raft_snapshot_index", metrics.snapshot.map_or(0, |l| l.index).to_string());
    if let Some(ms) = metrics.millis_since_quorum_ack {
        line("raft_millis_since_quorum_ack", ms.to_string());
    }
    s
}

fn conf(node: &Coordinator) -> String {
    let c = &node.config;
    let mut s = String::new();
    let _ = writeln!(s, "clientPort={}", c.client_addr.port());
    let _ = writeln!(s, "dataDir={}", c.data_dir.display());
    let _ = writeln!(s, "tickTime={}", c.tick_ms);
    let _ = writeln!(s, "minSessionTimeout={}", c.min_session_timeout_ms());
    let _ = writeln!(s, "maxSessionTimeout={}", c.max_session_timeout_ms());
    let _ = writeln!(s, "serverId={}", c.node_id);
    s
}

/// ZooKeeper's `envi`: `key=value` lines after an `Environment:` header; clients read
/// `zookeeper.version` from it.
fn envi(node: &Coordinator) -> String {
    let mut s = String::from("Environment:\n");
    let mut line = |k: &str, v: &dyn std::fmt::Display| {
        let _ = writeln!(s, "{k}={v}");
    };
    line("zookeeper.version", &VERSION);
    line("os.name", &std::env::consts::OS);
    line("os.arch", &std::env::consts::ARCH);
    if let Ok(dir) = std::env::current_dir() {
        line("user.dir", &dir.display());
    }
    line("process.id", &std::process::id());
    line("data.dir", &node.config.data_dir.display());
    s
}
