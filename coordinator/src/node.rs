//! One coordinator node: its Raft instance, its tree, the service other nodes call, and the
//! session bookkeeping that only the leader acts on. Client connections (in `server`) call
//! `write`, `read_index` and `touch` and never talk to Raft directly.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{Snapshot, SnapshotPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::proto::codes::ErrorCode;
use crate::raft::log_store::LogStore;
use crate::raft::network::{ForwardError, NetworkFactory, PeerPool, PeerRequest, PeerResponse};
use crate::raft::state_machine::StateMachine;
use crate::raft::transport::{ClusterKey, PeerStream};
use crate::raft::{Node, NodeId, Raft};
use crate::state::NodeState;
use crate::tree::command::{zxid, Command, CommandResult};

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub client_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub data_dir: PathBuf,
    /// Every other member: id → Raft address.
    pub peers: BTreeMap<NodeId, String>,
    /// ZooKeeper's tickTime: sessions get between 2 and 20 ticks.
    pub tick_ms: u32,
    pub snapshot_every: u64,
    /// The secret every member holds, with which peers authenticate (needed with peers).
    pub cluster_key: Option<Arc<ClusterKey>>,
    /// How long a client connection may take to send its handshake (ZooKeeper's
    /// `zookeeper.nio.sessionlessCnxnTimeout`, 10 s by default).
    pub handshake_timeout: Duration,
    /// `user:hash` of the superuser, whom every ACL admits (ZooKeeper's superDigest).
    pub super_digest: Option<String>,
}

impl NodeConfig {
    pub fn min_session_timeout_ms(&self) -> i32 {
        (self.tick_ms * 2) as i32
    }

    pub fn max_session_timeout_ms(&self) -> i32 {
        (self.tick_ms * 20) as i32
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    DataDir(#[from] crate::raft::data_dir::DataDirError),
    #[error("cannot open the data directory {dir}: {source}")]
    Storage { dir: PathBuf, source: io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("raft: {0}")]
    Raft(String),
    #[error(
        "a node with {peers} peers needs the cluster's secret (--cluster-secret-file or MERGESTREAM_CLUSTER_SECRET), with which peers authenticate"
    )]
    NoClusterSecret { peers: usize },
}

/// Per-node counters for the four-letter words.
#[derive(Default)]
pub struct ServerStats {
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub connections: AtomicU64,
    pub latency_total_us: AtomicU64,
    pub latency_max_us: AtomicU64,
    pub latency_count: AtomicU64,
}

impl ServerStats {
    pub fn record_latency(&self, elapsed: Duration) {
        let us = elapsed.as_micros() as u64;
        self.latency_total_us.fetch_add(us, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_max_us.fetch_max(us, Ordering::Relaxed);
    }
}

pub struct Coordinator {
    pub config: NodeConfig,
    pub raft: Raft,
    pub state: Arc<NodeState>,
    pub stats: ServerStats,
    pub(crate) pool: PeerPool,
    /// One reconfig at a time (a second one meanwhile is RECONFIGINPROGRESS, as in ZooKeeper).
    pub(crate) reconfiguring: tokio::sync::Mutex<()>,
    /// Leader only: when each session expires unless it is heard from.
    deadlines: Mutex<HashMap<i64, Instant>>,
    /// Sessions heard from on this node since the last report to the leader.
    heard_from: Mutex<HashSet<i64>>,
    next_connection_id: AtomicU64,
    /// Writes waiting for the next log entry (see `commit_batches`).
    batches: mpsc::UnboundedSender<PendingWrite>,
}

/// How long a write or a read barrier keeps looking for a leader before it gives up.
const LEADER_WAIT: Duration = Duration::from_secs(10);
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
const ELECTION_TIMEOUT_MAX_MS: u64 = 800;
/// How long a leader may go without a quorum acknowledging it before it counts as cut off
/// (ZooKeeper's leader gives up after syncLimit ticks; openraft's leader stays leader).
const QUORUM_LOST_AFTER_MS: u64 = 2 * ELECTION_TIMEOUT_MAX_MS;

/// Whether the node these metrics describe can commit: it follows a leader (a follower cut off
/// from its leader stops following it within an election timeout), or it leads and a quorum
/// acknowledged it lately.
fn reaches_quorum(metrics: &openraft::RaftMetrics<NodeId, Node>, alone: bool) -> bool {
    match metrics.current_leader {
        None => false,
        Some(leader) if leader == metrics.id => {
            alone || metrics.millis_since_quorum_ack.is_some_and(|ms| ms <= QUORUM_LOST_AFTER_MS)
        }
        Some(_) => true,
    }
}

impl Coordinator {
    pub async fn start(config: NodeConfig) -> Result<Arc<Self>, NodeError> {
        crate::raft::data_dir::prepare(&config.data_dir)?;
        let storage_err = |source| NodeError::Storage { dir: config.data_dir.clone(), source };
        let state = NodeState::new();
        let log_store = LogStore::open(&config.data_dir.join(crate::raft::data_dir::LOG_DIR)).map_err(storage_err)?;
        let state_machine =
            StateMachine::open(&config.data_dir.join(crate::raft::data_dir::SNAPSHOT_DIR), state.clone())
                .map_err(storage_err)?;
        let raft_config = openraft::Config {
            cluster_name: "mergestream-coordinator".into(),
            heartbeat_interval: 100,
            election_timeout_min: 400,
            election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: 1000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        if !config.peers.is_empty() && config.cluster_key.is_none() {
            return Err(NodeError::NoClusterSecret { peers: config.peers.len() });
        }
        let pool = PeerPool::new(config.cluster_key.clone());
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            NetworkFactory { pool: pool.clone() },
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;

        let peer_listener = TcpListener::bind(config.raft_addr)
            .await
            .map_err(|source| NodeError::Listen { addr: config.raft_addr, source })?;
        let (batches, pending_writes) = mpsc::unbounded_channel();
        let node = Arc::new(Self {
            config,
            raft,
            state,
            stats: ServerStats::default(),
            pool,
            deadlines: Mutex::new(HashMap::new()),
            heard_from: Mutex::new(HashSet::new()),
            reconfiguring: tokio::sync::Mutex::new(()),
            next_connection_id: AtomicU64::new(1),
            batches,
        });
        tokio::spawn(node.clone().commit_batches(pending_writes));
        tokio::spawn(node.clone().serve_peers(peer_listener));
        node.initialize_if_first().await?;
        tokio::spawn(node.clone().expire_sessions());
        tokio::spawn(node.clone().report_sessions());
        tokio::spawn(node.clone().publish_gauges());
        Ok(node)
    }

    /// A brand-new cluster is initialized by its lowest-numbered member; the others learn the
    /// membership from it.
    async fn initialize_if_first(&self) -> Result<(), NodeError> {
        let initialized = self.raft.is_initialized().await.map_err(|e| NodeError::Raft(e.to_string()))?;
        let lowest = self.config.peers.keys().next().is_none_or(|&p| self.config.node_id < p);
        if initialized || !lowest {
            return Ok(());
        }
        let mut members: BTreeMap<NodeId, Node> =
            self.config.peers.iter().map(|(id, addr)| (*id, Node { addr: addr.clone() })).collect();
        members.insert(self.config.node_id, Node { addr: self.config.raft_addr.to_string() });
        tracing::info!(?members, "initializing a new cluster");
        self.raft.initialize(members).await.map_err(|e| NodeError::Raft(e.to_string()))
    }

    pub fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.config.node_id)
    }

    /// Whether this node can commit (see `reaches_quorum`); cut off from a quorum, it serves
    /// only read-only sessions.
    pub fn reaches_quorum(&self) -> bool {
        reaches_quorum(&self.raft.metrics().borrow(), self.config.peers.is_empty())
    }

    /// Waits until this node can commit again.
    pub async fn wait_for_quorum(&self) {
        let alone = self.config.peers.is_empty();
        let mut metrics = self.raft.metrics();
        let _ = metrics.wait_for(|m| reaches_quorum(m, alone)).await;
    }

    pub fn mode(&self) -> &'static str {
        if self.config.peers.is_empty() {
            "standalone"
        } else if self.is_leader() {
            "leader"
        } else {
            "follower"
        }
    }

    fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        metrics.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
    }

    /// Commits a command through the leader. An error means the outcome is unknown (as a
    /// ZooKeeper ConnectionLoss): the command may or may not have been applied.
    pub async fn write(&self, command: Command) -> WriteResult {
        self.write_batch(vec![command]).await.pop().unwrap_or_else(|| Err(ForwardError::Failed("no result".into())))
    }

    /// Commits commands in their order; one result per command, in order. They join the
    /// commands of every other connection waiting at this node in one log entry.
    pub async fn write_batch(&self, commands: Vec<Command>) -> Vec<WriteResult> {
        let n = commands.len();
        let (done, result) = oneshot::channel();
        if self.batches.send(PendingWrite { commands, n, done }).is_err() {
            return failed_all(n, &ForwardError::Failed("the node is shutting down".into()));
        }
        result.await.unwrap_or_else(|_| failed_all(n, &ForwardError::Failed("the node is shutting down".into())))
    }

    /// Group commit: while one log entry is being committed, the writes that arrive wait, and
    /// then all go together in the next entry. One entry costs one append, one fsync and one
    /// round of replication however many requests it carries, which is what lets pipelined
    /// and concurrent clients outrun the disk.
    async fn commit_batches(self: Arc<Self>, mut pending: mpsc::UnboundedReceiver<PendingWrite>) {
        let mut next: Option<PendingWrite> = None;
        loop {
            let first = match next.take() {
                Some(w) => w,
                None => match pending.recv().await {
                    Some(w) => w,
                    None => return,
                },
            };
            let mut waiting = vec![first];
            let mut total = waiting[0].commands.len();
            while let Ok(more) = pending.try_recv() {
                if total + more.commands.len() > zxid::MAX_BATCH {
                    next = Some(more);
                    break;
                }
                total += more.commands.len();
                waiting.push(more);
            }
            let mut commands: Vec<Command> = waiting.iter_mut().flat_map(|w| std::mem::take(&mut w.commands)).collect();
            metrics::histogram!(crate::metrics::COMMANDS_PER_ENTRY).record(commands.len() as f64);
            let command = if commands.len() == 1 { commands.remove(0) } else { Command::Batch(commands) };
            let proposed = Instant::now();
            let outcome = self.commit(command).await;
            metrics::histogram!(crate::metrics::COMMIT_DURATION).record(proposed.elapsed().as_secs_f64());
            let outcome = outcome.map(|(index, result)| match result {
                CommandResult::Batch(results) => results.into_iter().map(|r| (index, r)).collect(),
                single => vec![(index, single)],
            });
            let mut results = match outcome {
                Ok(results) => results
                    .into_iter()
                    .enumerate()
                    .map(|(position, (index, result))| Ok(Committed { index, zxid: zxid::of(index, position), result }))
                    .collect::<Vec<_>>()
                    .into_iter(),
                Err(e) => failed_all(total, &e).into_iter(),
            };
            for w in waiting {
                let share: Vec<WriteResult> = results.by_ref().take(w.n).collect();
                let _ = w.done.send(share);
            }
        }
    }

    /// Commits one log entry through the leader, forwarding it when this node is not the
    /// leader; it is tried again only when it certainly was not applied.
    async fn commit(&self, command: Command) -> Result<(u64, CommandResult), ForwardError> {
        let started = Instant::now();
        loop {
            // A leader cut off from its quorum would wait for the commit forever; give up when the
            // client would have given up too and let it retry elsewhere.
            let remaining = LEADER_WAIT.saturating_sub(started.elapsed());
            let Ok(written) = tokio::time::timeout(remaining, self.raft.client_write(command.clone())).await else {
                return Err(ForwardError::Failed("not committed by a quorum in time".into()));
            };
            match written {
                Ok(r) => return Ok((r.log_id.index, r.data)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    if let Some(node) = f.leader_node {
                        match self.pool.call(&node.addr, &PeerRequest::Write(command.clone()), PEER_TIMEOUT).await {
                            Ok(PeerResponse::Write(Ok(r))) => return Ok(r),
                            Ok(PeerResponse::Write(Err(ForwardError::NotLeader { .. }))) => {}
                            Ok(PeerResponse::Write(Err(e))) => return Err(e),
                            Ok(other) => return Err(ForwardError::Failed(format!("unexpected answer {other:?}"))),
                            // Refused: the request never left, so trying again cannot apply it twice.
                            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                            Err(e) => return Err(ForwardError::Failed(e.to_string())),
                        }
                    }
                }
                Err(e) => return Err(ForwardError::Failed(e.to_string())),
            }
            if started.elapsed() > LEADER_WAIT {
                return Err(ForwardError::Failed("no leader".into()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The log index a linearizable read must wait for: the leader's commit index, confirmed by
    /// a quorum. This is what `sync` waits on.
    pub async fn read_index(&self) -> Result<u64, ForwardError> {
        let started = Instant::now();
        loop {
            let remaining = LEADER_WAIT.saturating_sub(started.elapsed());
            let Ok(confirmed) = tokio::time::timeout(remaining, self.raft.get_read_log_id()).await else {
                return Err(ForwardError::Failed("leadership not confirmed by a quorum in time".into()));
            };
            match confirmed {
                Ok((read, _applied)) => return Ok(read.map_or(0, |l| l.index)),
                Err(RaftError::APIError(_)) => {
                    if let Some(addr) = self.leader_addr() {
                        match self.pool.call(&addr, &PeerRequest::ReadIndex, PEER_TIMEOUT).await {
                            Ok(PeerResponse::ReadIndex(Ok(i))) => return Ok(i),
                            Ok(PeerResponse::ReadIndex(Err(ForwardError::NotLeader { .. }))) | Err(_) => {}
                            Ok(PeerResponse::ReadIndex(Err(e))) => return Err(e),
                            Ok(other) => return Err(ForwardError::Failed(format!("unexpected answer {other:?}"))),
                        }
                    }
                }
                Err(e) => return Err(ForwardError::Failed(e.to_string())),
            }
            if started.elapsed() > LEADER_WAIT {
                return Err(ForwardError::Failed("no leader".into()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A session sent something: it stays alive for another timeout.
    pub fn touch(&self, session_id: i64) {
        if self.is_leader() {
            self.extend_deadline(session_id);
        } else if let Ok(mut heard) = self.heard_from.lock() {
            heard.insert(session_id);
        }
    }

    fn extend_deadline(&self, session_id: i64) {
        let timeout = self.state.lock().tree.session(session_id).map(|s| s.timeout_ms);
        if let (Some(timeout), Ok(mut deadlines)) = (timeout, self.deadlines.lock()) {
            deadlines.insert(session_id, Instant::now() + Duration::from_millis(timeout as u64));
        }
    }

    /// Leader only: closes the sessions whose deadline passed. A new leader starts every
    /// session's clock afresh, as ZooKeeper does, so a failover never expires a live session.
    async fn expire_sessions(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if !self.is_leader() {
                if let Ok(mut d) = self.deadlines.lock() {
                    d.clear();
                }
                continue;
            }
            let now = Instant::now();
            let expired: Vec<i64> = {
                let inner = self.state.lock();
                let Ok(mut deadlines) = self.deadlines.lock() else { continue };
                deadlines.retain(|id, _| inner.tree.session(*id).is_some());
                for (id, info) in inner.tree.sessions() {
                    deadlines.entry(*id).or_insert_with(|| now + Duration::from_millis(info.timeout_ms as u64));
                }
                let expired: Vec<i64> = deadlines.iter().filter(|(_, d)| **d <= now).map(|(id, _)| *id).collect();
                for id in &expired {
                    deadlines.remove(id);
                }
                expired
            };
            for session_id in expired {
                tracing::info!(session = format_args!("0x{session_id:x}"), "session expired");
                metrics::counter!(crate::metrics::SESSIONS_EXPIRED).increment(1);
                let node = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = node.write(Command::CloseSession { session_id }).await {
                        tracing::warn!(session = format_args!("0x{session_id:x}"), error = %e, "could not close an expired session");
                    }
                });
            }
        }
    }

    /// Keeps the Prometheus gauges of the tree and of Raft current (counters and latency
    /// histograms are recorded where the requests are served).
    async fn publish_gauges(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let m = self.raft.metrics().borrow().clone();
            metrics::gauge!(crate::metrics::RAFT_TERM).set(m.current_term as f64);
            metrics::gauge!(crate::metrics::RAFT_IS_LEADER).set(if self.is_leader() { 1.0 } else { 0.0 });
            metrics::gauge!(crate::metrics::RAFT_LAST_LOG_INDEX).set(m.last_log_index.unwrap_or(0) as f64);
            metrics::gauge!(crate::metrics::RAFT_APPLIED_INDEX).set(m.last_applied.map_or(0, |l| l.index) as f64);
            metrics::gauge!(crate::metrics::RAFT_SNAPSHOT_INDEX).set(m.snapshot.map_or(0, |l| l.index) as f64);
            if let Some(replication) = &m.replication {
                // The leader's commit index: the highest entry a majority of the voters hold.
                let mut matched: Vec<u64> = replication.values().map(|l| l.map_or(0, |l| l.index)).collect();
                if !replication.contains_key(&self.config.node_id) {
                    matched.push(m.last_log_index.unwrap_or(0));
                }
                matched.sort_unstable_by(|a, b| b.cmp(a));
                if let Some(committed) = matched.get(matched.len() / 2) {
                    metrics::gauge!(crate::metrics::RAFT_COMMITTED_INDEX).set(*committed as f64);
                }
            }
            let inner = self.state.lock();
            metrics::gauge!(crate::metrics::ZNODES).set(inner.tree.node_count() as f64);
            metrics::gauge!(crate::metrics::EPHEMERALS).set(inner.tree.ephemeral_count() as f64);
            metrics::gauge!(crate::metrics::SESSIONS).set(inner.tree.sessions().count() as f64);
            metrics::gauge!(crate::metrics::WATCHES).set(inner.watches.count() as f64);
        }
    }

    /// Followers tell the leader which sessions they heard from, often enough that the shortest
    /// session timeout (two ticks) never runs out between reports.
    async fn report_sessions(self: Arc<Self>) {
        let period = Duration::from_millis((self.config.tick_ms / 4).max(50) as u64);
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let heard: Vec<i64> = match self.heard_from.lock() {
                Ok(mut h) => h.drain().collect(),
                Err(_) => continue,
            };
            if heard.is_empty() {
                continue;
            }
            if self.is_leader() {
                heard.into_iter().for_each(|s| self.extend_deadline(s));
            } else if let Some(addr) = self.leader_addr() {
                if let Err(e) = self.pool.call(&addr, &PeerRequest::TouchSessions(heard.clone()), PEER_TIMEOUT).await {
                    tracing::debug!(error = %e, "session report to the leader failed; keeping it for the next one");
                    if let Ok(mut h) = self.heard_from.lock() {
                        h.extend(heard);
                    }
                }
            }
        }
    }

    async fn serve_peers(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(self.clone().serve_peer(stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a peer connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn serve_peer(self: Arc<Self>, stream: TcpStream) {
        let from = stream.peer_addr().map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
        let Some(key) = self.config.cluster_key.clone() else {
            // No peers, no secret: nobody may talk to this port.
            tracing::warn!(%from, "refusing a peer connection: this node has no peers");
            metrics::counter!(crate::metrics::PEER_CONNECTIONS_REFUSED).increment(1);
            return;
        };
        let mut stream = match PeerStream::accept(stream, &key).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%from, error = %e, "refusing a peer connection");
                metrics::counter!(crate::metrics::PEER_CONNECTIONS_REFUSED).increment(1);
                return;
            }
        };
        loop {
            let request: PeerRequest = match stream.recv().await {
                Ok(r) => r,
                Err(e) => {
                    if e.kind() != io::ErrorKind::UnexpectedEof {
                        tracing::warn!(%from, error = %e, "dropping a peer message and its connection");
                        metrics::counter!(crate::metrics::PEER_MESSAGES_DROPPED).increment(1);
                    }
                    return;
                }
            };
            if let PeerRequest::Write(command) = &request {
                if let Err(e) = command.check() {
                    tracing::warn!(%from, error = %e, "dropping a peer's write and its connection");
                    metrics::counter!(crate::metrics::PEER_MESSAGES_DROPPED).increment(1);
                    return;
                }
            }
            let response = self.answer_peer(request).await;
            if stream.send(&response).await.is_err() {
                return;
            }
        }
    }

    async fn answer_peer(&self, request: PeerRequest) -> PeerResponse {
        match request {
            PeerRequest::AppendEntries(rpc) => PeerResponse::AppendEntries(self.raft.append_entries(rpc).await),
            PeerRequest::Vote(rpc) => PeerResponse::Vote(self.raft.vote(rpc).await),
            PeerRequest::Snapshot { vote, meta, data } => {
                let snapshot = Snapshot { meta, snapshot: Box::new(data) };
                PeerResponse::Snapshot(self.raft.install_full_snapshot(vote, snapshot).await.map_err(|e| e.to_string()))
            }
            PeerRequest::Write(command) => PeerResponse::Write(match self.raft.client_write(command).await {
                Ok(r) => Ok((r.log_id.index, r.data)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    Err(ForwardError::NotLeader { leader: f.leader_id })
                }
                Err(e) => Err(ForwardError::Failed(e.to_string())),
            }),
            PeerRequest::ReadIndex => PeerResponse::ReadIndex(match self.raft.get_read_log_id().await {
                Ok((read, _)) => Ok(read.map_or(0, |l| l.index)),
                Err(RaftError::APIError(_)) => Err(ForwardError::NotLeader { leader: None }),
                Err(e) => Err(ForwardError::Failed(e.to_string())),
            }),
            PeerRequest::Reconfig { request, auth } => PeerResponse::Reconfig(if self.is_leader() {
                self.reconfigure_here(&request, &auth).await
            } else {
                Err(ErrorCode::NewConfigNoQuorum)
            }),
            PeerRequest::TouchSessions(sessions) => {
                if self.is_leader() {
                    sessions.into_iter().for_each(|s| self.extend_deadline(s));
                }
                PeerResponse::Touched
            }
        }
    }
}

/// A committed command: the log entry that holds it, its own zxid, and what it did.
#[derive(Debug, Clone)]
pub struct Committed {
    pub index: u64,
    pub zxid: i64,
    pub result: CommandResult,
}

/// A committed command, or why its outcome is not known.
pub type WriteResult = Result<Committed, ForwardError>;

/// Commands of one connection waiting for the next log entry.
struct PendingWrite {
    commands: Vec<Command>,
    n: usize,
    done: oneshot::Sender<Vec<WriteResult>>,
}

fn failed_all(n: usize, error: &ForwardError) -> Vec<WriteResult> {
    (0..n).map(|_| Err(error.clone())).collect()
}
