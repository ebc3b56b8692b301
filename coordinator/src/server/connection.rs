//! One client connection: the handshake (new session or resumed one), then requests in the
//! order they arrive. Reads are answered from this node's tree; writes go through Raft and are
//! answered once this node has applied them, so a client always reads its own writes. Replies
//! and watch events leave through the session's outbox, in tree order.

use std::net::SocketAddr;

use crate::acl::{self, perms, AuthId};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use super::outbox::{frame_queue, write_frames, FrameSender, MAX_QUEUED_BYTES};
use super::{four_letter, reply, ClientStream};
use crate::node::{Committed, Coordinator};
use crate::proto::codes::{op, xid, AddWatchMode, ErrorCode, EventType};
use crate::proto::jute::JuteReader;
use crate::proto::records::{
    encode_connect_response, encode_watch_event, Acl, ConnectRequest, MultiOp, Request, WatchSet,
};
use crate::proto::{ProtoError, MAX_FRAME_BYTES};
use crate::state::{Outbox, StateInner};
use crate::tree::command::{zxid, Command, CommandResult, TreeOp};
use crate::tree::path;
use crate::watch::WatchKind;

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    FrameTooLarge(usize),
    #[error("malformed {what}: {source}")]
    Malformed { what: &'static str, source: ProtoError },
    #[error("session could not be created: {0}")]
    SessionCreate(String),
    #[error("{0}; dropping the connection so that the client reconnects elsewhere")]
    NoLeader(String),
    #[error("client has seen zxid 0x{seen:x}, newer than this node's 0x{ours:x}")]
    Behind { seen: i64, ours: i64 },
    #[error("no handshake within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("the client does not read its replies: more than {0} bytes wait for it")]
    NotReading(usize),
}

pub async fn run<S>(node: Arc<Coordinator>, stream: S, peer: SocketAddr)
where
    S: ClientStream + AsyncRead + AsyncWrite + Unpin,
{
    node.stats.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!(crate::metrics::CONNECTIONS).increment(1.0);
    let result = serve(&node, stream, peer).await;
    node.stats.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!(crate::metrics::CONNECTIONS).decrement(1.0);
    match result {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(ConnectionError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, "client went away")
        }
        Err(e) => tracing::warn!(%peer, error = %e, "closing client connection"),
    }
}

async fn read_len(stream: &mut (impl AsyncRead + Unpin)) -> Result<usize, ConnectionError> {
    let len = stream.read_u32().await? as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ConnectionError::FrameTooLarge(len));
    }
    Ok(len)
}

async fn serve<S>(node: &Arc<Coordinator>, mut stream: S, peer: SocketAddr) -> Result<(), ConnectionError>
where
    S: ClientStream + AsyncRead + AsyncWrite + Unpin,
{
    // A connection has a while to say what it is, as ZooKeeper gives a connection without a
    // session: one that says nothing would hold a descriptor for ever.
    let connect = match tokio::time::timeout(node.config.handshake_timeout, read_connect(node, &mut stream)).await {
        Ok(Ok(Some(connect))) => connect,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            metrics::counter!(crate::metrics::HANDSHAKE_TIMEOUTS).increment(1);
            return Err(ConnectionError::HandshakeTimeout(node.config.handshake_timeout));
        }
    };
    let (mut reader, writer) = stream.split();
    let closed = Arc::new(Notify::new());
    let (frames, rx) = frame_queue(MAX_QUEUED_BYTES, closed.clone());
    let mut writer_task = tokio::spawn(write_frames(writer, rx));
    let session = match establish(node, &connect, &frames, closed, peer).await {
        Ok(Some(session)) => session,
        Ok(None) => {
            // Expired or unknown session: ZooKeeper answers with a zero timeout and closes.
            frames.send(encode_connect_response(0, 0, &[0; 16], connect.read_only));
            drop(frames);
            let _ = writer_task.await;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let result = session.requests(node, &mut reader).await;
    session.detach(node);
    let timeout = session.timeout;
    // The writer ends, and closes the socket, once every sender of the channel is gone; a
    // client that does not read is given a session timeout to take what is left.
    drop(session);
    let overflowed = frames.overflowed();
    drop(frames);
    if overflowed || tokio::time::timeout(timeout, &mut writer_task).await.is_err() {
        writer_task.abort();
    }
    if overflowed {
        return Err(ConnectionError::NotReading(MAX_QUEUED_BYTES));
    }
    result
}

/// The four-letter word or the connect request a connection starts with; `None` after a
/// four-letter word was answered.
async fn read_connect(
    node: &Coordinator,
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> Result<Option<ConnectRequest>, ConnectionError> {
    let mut first = [0u8; 4];
    stream.read_exact(&mut first).await?;
    if let Some(answer) = four_letter::answer(node, &first) {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        return Ok(None);
    }
    let len = u32::from_be_bytes(first) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ConnectionError::FrameTooLarge(len));
    }
    let mut payload = vec![0; len];
    stream.read_exact(&mut payload).await?;
    let connect = ConnectRequest::decode(&payload)
        .map_err(|source| ConnectionError::Malformed { what: "connect request", source })?;
    Ok(Some(connect))
}

/// Requests read ahead of the one being answered, at most; the reader waits beyond that.
const MAX_PIPELINED: usize = 1024;

/// Bytes of requests read ahead of the one being answered, at most: 1,024 pipelined requests
/// of a megabyte each would otherwise be a gigabyte held for one connection.
const MAX_READ_AHEAD_BYTES: usize = 16 << 20;

/// A decoded request waiting for its answer.
struct Incoming {
    xid: i32,
    op_code: i32,
    request: Request,
    received: Instant,
    /// Its share of [`MAX_READ_AHEAD_BYTES`], given back once it is answered.
    _read_ahead: tokio::sync::OwnedSemaphorePermit,
}

impl Incoming {
    /// Writes are batched; CloseSession, a write too, ends the connection and goes alone, and
    /// a reconfig is the leader's to run.
    fn is_batched_write(&self) -> bool {
        self.request.is_write() && !matches!(self.request, Request::CloseSession | Request::Reconfig(_))
    }
}

fn record_request(node: &Coordinator, op_code: i32, received: Instant) {
    let elapsed = received.elapsed();
    node.stats.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    node.stats.record_latency(elapsed);
    metrics::counter!(crate::metrics::REQUESTS, "op" => op::name(op_code)).increment(1);
    metrics::histogram!(crate::metrics::REQUEST_DURATION, "op" => op::name(op_code)).record(elapsed.as_secs_f64());
}

struct Session {
    id: i64,
    timeout: Duration,
    connection_id: u64,
    frames: FrameSender,
    closed: Arc<Notify>,
    /// The identities ACLs are checked against: the client's address, then what it added
    /// with `addauth`. They belong to the connection, as in ZooKeeper (a client that
    /// reconnects authenticates again).
    auth: std::sync::Mutex<Vec<AuthId>>,
    /// A session of this node alone, made while no leader was known (see `read_only_session`).
    read_only: bool,
}

/// Creates or resumes the session, registers its outbox on this node and sends the connect
/// response. `None` means the session the client asked for no longer exists.
async fn establish(
    node: &Arc<Coordinator>,
    connect: &ConnectRequest,
    frames: &FrameSender,
    closed: Arc<Notify>,
    peer: SocketAddr,
) -> Result<Option<Session>, ConnectionError> {
    let cfg = &node.config;
    if connect.read_only == Some(true) && connect.session_id == 0 && !node.reaches_quorum() {
        return Ok(Some(read_only_session(node, connect, frames, closed, peer)));
    }
    let (session_id, timeout_ms, password) = if connect.session_id == 0 {
        let (session_id, timeout_ms, password) = new_session(cfg, connect);
        let command = Command::CreateSession { session_id, timeout_ms, password: password.clone() };
        let committed = node.write(command).await.map_err(|e| ConnectionError::SessionCreate(e.to_string()))?;
        node.state.wait_applied(committed.index).await;
        metrics::counter!(crate::metrics::SESSIONS_CREATED).increment(1);
        (session_id, timeout_ms, password)
    } else {
        // A client that saw a newer state than ours must not read older data here.
        let seen_index = zxid::index(connect.last_zxid_seen);
        if seen_index > node.state.applied_index() {
            let waited = tokio::time::timeout(Duration::from_secs(2), node.state.wait_applied(seen_index)).await;
            if waited.is_err() {
                return Err(ConnectionError::Behind {
                    seen: connect.last_zxid_seen,
                    ours: node.state.lock().tree.last_zxid(),
                });
            }
        }
        let known = node.state.lock().tree.session(connect.session_id).cloned();
        match known {
            Some(s) if s.password == connect.password => (connect.session_id, s.timeout_ms, s.password),
            _ => return Ok(None),
        }
    };
    let session = Session::new(node, session_id, timeout_ms, frames, closed, peer, false);
    {
        let mut inner = node.state.lock();
        if inner.tree.session(session_id).is_none() {
            return Ok(None);
        }
        let outbox =
            Outbox { connection_id: session.connection_id, frames: frames.clone(), closed: session.closed.clone() };
        if let Some(previous) = inner.outboxes.insert(session_id, outbox) {
            // The client moved to a new connection: the old one ends.
            previous.closed.notify_one();
        }
        // The flag tells the client whether this server is read-only (it is not), and is sent
        // to clients that sent theirs.
        frames.send(encode_connect_response(timeout_ms, session_id, &password, connect.read_only.map(|_| false)));
    }
    node.touch(session_id);
    tracing::debug!(session = format_args!("0x{session_id:x}"), timeout_ms, "session connected");
    Ok(Some(session))
}

/// A new session's id, negotiated timeout and password.
fn new_session(cfg: &crate::node::NodeConfig, connect: &ConnectRequest) -> (i64, i32, Vec<u8>) {
    let timeout_ms = connect.timeout_ms.clamp(cfg.min_session_timeout_ms(), cfg.max_session_timeout_ms());
    let mut password = vec![0u8; 16];
    rand::thread_rng().fill_bytes(&mut password);
    // The node id in the top byte, as ZooKeeper does, keeps ids from two nodes apart.
    let session_id =
        ((cfg.node_id as i64 & 0x7f) << 56) | (rand::thread_rng().next_u64() as i64 & 0x00ff_ffff_ffff_ffff);
    (session_id, timeout_ms, password)
}

/// A session for a client that accepts a read-only server (`canBeReadOnly`), on a node that
/// cannot reach a quorum, as ZooKeeper's ReadOnlyZooKeeperServer gives one: it lives on this
/// node alone (nothing can be committed to create it), reads what this node last applied, and
/// every write is answered NOTREADONLY. Its connection ends once the node reaches a quorum
/// again, and the client moves to a read-write session.
fn read_only_session(
    node: &Coordinator,
    connect: &ConnectRequest,
    frames: &FrameSender,
    closed: Arc<Notify>,
    peer: SocketAddr,
) -> Session {
    let (session_id, timeout_ms, password) = new_session(&node.config, connect);
    let session = Session::new(node, session_id, timeout_ms, frames, closed, peer, true);
    let outbox =
        Outbox { connection_id: session.connection_id, frames: frames.clone(), closed: session.closed.clone() };
    node.state.lock().outboxes.insert(session_id, outbox);
    frames.send(encode_connect_response(timeout_ms, session_id, &password, Some(true)));
    metrics::counter!(crate::metrics::SESSIONS_CREATED).increment(1);
    tracing::info!(session = format_args!("0x{session_id:x}"), "read-only session: no quorum is reachable");
    session
}

impl Session {
    /// The session on this connection; its identities start with the client's address.
    fn new(
        node: &Coordinator,
        id: i64,
        timeout_ms: i32,
        frames: &FrameSender,
        closed: Arc<Notify>,
        peer: SocketAddr,
        read_only: bool,
    ) -> Session {
        Session {
            id,
            timeout: Duration::from_millis(timeout_ms as u64),
            connection_id: node.next_connection_id(),
            frames: frames.clone(),
            closed,
            auth: std::sync::Mutex::new(vec![AuthId::ip(peer.ip())]),
            read_only,
        }
    }

    fn detach(&self, node: &Coordinator) {
        let mut inner = node.state.lock();
        if inner.outboxes.get(&self.id).is_some_and(|o| o.connection_id == self.connection_id) {
            inner.outboxes.remove(&self.id);
            // Watches belong to the session, but events for it can only be delivered on a
            // connection: the client sets them again (setWatches) when it reconnects.
            inner.watches.remove_session(self.id);
        }
    }

    /// Reads requests and answers them in order. Reading runs ahead of answering, so that
    /// the writes a client pipelines are committed together instead of one round trip each.
    async fn requests(
        &self,
        node: &Arc<Coordinator>,
        reader: &mut (impl AsyncRead + Unpin),
    ) -> Result<(), ConnectionError> {
        let (tx, rx) = mpsc::channel(MAX_PIPELINED);
        let reading = self.read_requests(node, reader, tx);
        let answering = self.answer_requests(node, rx);
        tokio::pin!(reading, answering);
        let mut read_result = None;
        loop {
            tokio::select! {
                r = &mut reading, if read_result.is_none() => read_result = Some(r),
                // Answering ends once the reader stopped (the client went away, or the
                // connection was told to close) and what it read was answered, or at a
                // CloseSession, or when a write's outcome is unknown.
                r = &mut answering => return read_result.unwrap_or(Ok(())).and(r),
                // A read-only session ends with the outage: its client reconnects read-write.
                _ = node.wait_for_quorum(), if self.read_only => return Ok(()),
            }
        }
    }

    async fn read_requests(
        &self,
        node: &Arc<Coordinator>,
        reader: &mut (impl AsyncRead + Unpin),
        tx: mpsc::Sender<Incoming>,
    ) -> Result<(), ConnectionError> {
        let read_ahead = Arc::new(tokio::sync::Semaphore::new(MAX_READ_AHEAD_BYTES));
        loop {
            let len = tokio::select! {
                len = tokio::time::timeout(self.timeout, read_len(reader)) => match len {
                    Ok(len) => len?,
                    // Nothing for a whole session timeout: ZooKeeper drops such a connection.
                    Err(_) => return Ok(()),
                },
                // The session expired, or moved to another connection.
                _ = self.closed.notified() => return Ok(()),
            };
            let permits = len.clamp(1, MAX_READ_AHEAD_BYTES) as u32;
            let Ok(permit) = read_ahead.clone().acquire_many_owned(permits).await else { return Ok(()) };
            let mut payload = vec![0; len];
            reader.read_exact(&mut payload).await?;
            let received = Instant::now();
            node.stats.received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if !self.read_only {
                node.touch(self.id);
            }
            let mut r = JuteReader::new(&payload);
            let header = (|| Ok::<_, ProtoError>((r.i32()?, r.i32()?)))()
                .map_err(|source| ConnectionError::Malformed { what: "request header", source })?;
            let (xid, op_code) = header;
            let request = Request::decode(op_code, &mut r)
                .map_err(|source| ConnectionError::Malformed { what: op::name(op_code), source })?;
            let close = matches!(request, Request::CloseSession);
            let incoming = Incoming { xid, op_code, request, received, _read_ahead: permit };
            if tx.send(incoming).await.is_err() || close {
                return Ok(());
            }
        }
    }

    /// Takes whatever requests are waiting, and answers them in order: each run of
    /// consecutive writes is committed as one batch, and a read runs only after the writes
    /// before it were applied here, so the client reads its own writes.
    async fn answer_requests(
        &self,
        node: &Arc<Coordinator>,
        mut rx: mpsc::Receiver<Incoming>,
    ) -> Result<(), ConnectionError> {
        let mut batch = Vec::new();
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < MAX_PIPELINED {
                match rx.try_recv() {
                    Ok(more) => batch.push(more),
                    Err(_) => break,
                }
            }
            let mut pending = batch.drain(..).peekable();
            while let Some(incoming) = pending.next() {
                if self.frames.overflowed() {
                    return Err(ConnectionError::NotReading(MAX_QUEUED_BYTES));
                }
                if self.read_only && (incoming.request.is_write() || matches!(incoming.request, Request::Sync { .. })) {
                    let zxid = node.state.lock().tree.last_zxid();
                    if matches!(incoming.request, Request::CloseSession) {
                        // Nothing to commit: the session is this connection's.
                        self.send(reply::empty(incoming.xid, zxid));
                        return Ok(());
                    }
                    self.send(reply::error(incoming.xid, zxid, ErrorCode::NotReadOnly));
                    record_request(node, incoming.op_code, incoming.received);
                    continue;
                }
                if incoming.is_batched_write() {
                    let mut run = vec![incoming];
                    while let Some(next) = pending.next_if(Incoming::is_batched_write) {
                        run.push(next);
                    }
                    if !self.write_run(node, run).await {
                        return Ok(());
                    }
                    continue;
                }
                let close = matches!(incoming.request, Request::CloseSession);
                let (op_code, received) = (incoming.op_code, incoming.received);
                self.handle(node, incoming.xid, incoming.request).await?;
                record_request(node, op_code, received);
                if close {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn send(&self, frame: Vec<u8>) {
        self.frames.send(frame);
    }

    async fn handle(&self, node: &Arc<Coordinator>, xid: i32, request: Request) -> Result<(), ConnectionError> {
        match request {
            Request::CloseSession => {
                let result = node.write(Command::CloseSession { session_id: self.id }).await;
                let zxid = result.as_ref().map_or(0, |c| c.zxid);
                self.send(reply::empty(xid, zxid));
            }
            Request::Ping => {
                let zxid = node.state.lock().tree.last_zxid();
                self.send(reply::empty(xid::PING, zxid));
            }
            Request::Sync { path: p } => match node.read_index().await {
                Ok(index) => {
                    node.state.wait_applied(index).await;
                    let zxid = node.state.lock().tree.last_zxid();
                    let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                    w.string(&p);
                    self.send(w.finish());
                }
                Err(e) => return Err(ConnectionError::NoLeader(format!("sync: {e}"))),
            },
            Request::Auth { scheme, credentials } => {
                // Answered with the request's own xid (clients send -4, or any xid, as
                // zookeeper-client does) and zxid 0, as ZooKeeper answers.
                match acl::authenticate(&scheme, &credentials, node.config.super_digest.as_deref()) {
                    Some(ids) => {
                        let mut auth = self.auth();
                        for id in ids {
                            if !auth.contains(&id) {
                                auth.push(id);
                            }
                        }
                        drop(auth);
                        self.send(reply::empty(xid, 0));
                    }
                    None => {
                        // ZooKeeper answers AUTHFAILED and closes the connection.
                        tracing::debug!(scheme, "authentication failed");
                        self.send(reply::error(xid, 0, ErrorCode::AuthFailed));
                        self.closed.notify_one();
                    }
                }
            }
            Request::Reconfig(request) => {
                let auth = self.auth().clone();
                match node.reconfigure(request, auth).await {
                    Ok((data, stat)) => {
                        let mut w = reply::header(xid, stat.mzxid, ErrorCode::Ok);
                        w.buffer(&data);
                        stat.write(&mut w);
                        self.send(w.finish());
                    }
                    Err(code) => self.send(reply::error(xid, node.state.lock().tree.last_zxid(), code)),
                }
            }
            Request::Unsupported(code) => {
                tracing::debug!(op = code, "unimplemented operation");
                self.send(reply::error(xid, node.state.lock().tree.last_zxid(), ErrorCode::Unimplemented));
            }
            read => {
                let mut inner = node.state.lock();
                let frame = self.read(&mut inner, xid, read);
                // Sent under the lock: no event of a later change can overtake this reply.
                self.frames.send(frame);
            }
        }
        Ok(())
    }

    fn auth(&self) -> std::sync::MutexGuard<'_, Vec<AuthId>> {
        self.auth.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this connection's identities hold `perm` on a node with `acl`.
    fn may(&self, acl: &[Acl], perm: i32) -> bool {
        acl::permits(acl, &self.auth(), perm)
    }

    /// Answers a read from this node's tree and registers the watch it asks for.
    fn read(&self, inner: &mut StateInner, xid: i32, request: Request) -> Vec<u8> {
        let zxid = inner.tree.last_zxid();
        let checked = |p: &str| path::validate(p, false).map(|_| ());
        match request {
            Request::Exists { path: p, watch } => {
                if let Err(code) = checked(&p) {
                    return reply::error(xid, zxid, code);
                }
                if watch {
                    inner.watches.add(self.id, WatchKind::Data, &p);
                }
                match inner.tree.node(&p) {
                    Some(n) => reply::stat(xid, zxid, &n.stat()),
                    None => reply::error(xid, zxid, ErrorCode::NoNode),
                }
            }
            Request::GetData { path: p, watch } => {
                if let Err(code) = checked(&p) {
                    return reply::error(xid, zxid, code);
                }
                let Some(n) = inner.tree.node(&p) else { return reply::error(xid, zxid, ErrorCode::NoNode) };
                if !self.may(&n.acl, perms::READ) {
                    return reply::error(xid, zxid, ErrorCode::NoAuth);
                }
                let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                w.optional_buffer(n.data.as_deref());
                n.stat().write(&mut w);
                if watch {
                    inner.watches.add(self.id, WatchKind::Data, &p);
                }
                w.finish()
            }
            Request::GetChildren { path: p, watch, with_stat } => {
                if let Err(code) = checked(&p) {
                    return reply::error(xid, zxid, code);
                }
                let Some(n) = inner.tree.node(&p) else { return reply::error(xid, zxid, ErrorCode::NoNode) };
                if !self.may(&n.acl, perms::READ) {
                    return reply::error(xid, zxid, ErrorCode::NoAuth);
                }
                let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                let children: Vec<&String> = n.children.iter().collect();
                w.strings(&children);
                if with_stat {
                    n.stat().write(&mut w);
                }
                if watch {
                    inner.watches.add(self.id, WatchKind::Child, &p);
                }
                w.finish()
            }
            Request::GetAcl { path: p } => {
                let Some(n) = inner.tree.node(&p) else { return reply::error(xid, zxid, ErrorCode::NoNode) };
                if !self.may(&n.acl, perms::READ | perms::ADMIN) {
                    return reply::error(xid, zxid, ErrorCode::NoAuth);
                }
                let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                // Without ADMIN the digests' hashes are not shown (ZooKeeper 3.6 and later).
                if self.may(&n.acl, perms::ADMIN) {
                    Acl::write_all(&n.acl, &mut w);
                } else {
                    Acl::write_all(&acl::redacted(&n.acl), &mut w);
                }
                n.stat().write(&mut w);
                w.finish()
            }
            Request::GetAllChildrenNumber { path: p } => {
                let Some(n) = inner.tree.node(&p) else { return reply::error(xid, zxid, ErrorCode::NoNode) };
                if !self.may(&n.acl, perms::READ) {
                    return reply::error(xid, zxid, ErrorCode::NoAuth);
                }
                let below =
                    inner.tree.dump().iter().filter(|(q, _)| q.as_str() != p && path::is_at_or_below(q, &p)).count();
                let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                w.i32(below as i32);
                w.finish()
            }
            Request::GetEphemerals { prefix } => {
                let mine: Vec<&String> = inner.tree.ephemerals_of(self.id).filter(|p| p.starts_with(&prefix)).collect();
                let mut w = reply::header(xid, zxid, ErrorCode::Ok);
                w.strings(&mine);
                w.finish()
            }
            Request::SetWatches(set) => {
                self.set_watches(inner, zxid, set);
                reply::empty(xid, zxid)
            }
            Request::AddWatch { path: p, mode } => {
                if let Err(code) = checked(&p) {
                    return reply::error(xid, zxid, code);
                }
                let kind = match mode {
                    AddWatchMode::Persistent => WatchKind::Persistent,
                    AddWatchMode::PersistentRecursive => WatchKind::PersistentRecursive,
                };
                inner.watches.add(self.id, kind, &p);
                reply::empty(xid, zxid)
            }
            Request::RemoveWatches { path: p, watcher_type, check_only } => {
                let kinds: &[WatchKind] = match watcher_type {
                    1 => &[WatchKind::Child],
                    2 => &[WatchKind::Data],
                    _ => &[WatchKind::Child, WatchKind::Data, WatchKind::Persistent, WatchKind::PersistentRecursive],
                };
                let found = kinds.iter().any(|k| inner.watches.has(self.id, *k, &p));
                if !found {
                    return reply::error(xid, zxid, ErrorCode::NoWatcher);
                }
                if !check_only {
                    for k in kinds {
                        inner.watches.remove(self.id, *k, &p);
                    }
                }
                reply::empty(xid, zxid)
            }
            _ => reply::error(xid, zxid, ErrorCode::Unimplemented),
        }
    }

    /// Re-registers a reconnecting client's watches; what changed since the zxid it last saw
    /// fires at once, as ZooKeeper's DataTree.setWatches does.
    fn set_watches(&self, inner: &mut StateInner, zxid: i64, set: WatchSet) {
        let mut events = Vec::new();
        for p in set.data {
            match inner.tree.node(&p) {
                None => events.push((EventType::NodeDeleted, p)),
                Some(n) if n.mzxid > set.relative_zxid => events.push((EventType::NodeDataChanged, p)),
                Some(_) => inner.watches.add(self.id, WatchKind::Data, &p),
            }
        }
        for p in set.exist {
            match inner.tree.node(&p) {
                Some(_) => events.push((EventType::NodeCreated, p)),
                None => inner.watches.add(self.id, WatchKind::Data, &p),
            }
        }
        for p in set.child {
            match inner.tree.node(&p) {
                None => events.push((EventType::NodeDeleted, p)),
                Some(n) if n.pzxid > set.relative_zxid => events.push((EventType::NodeChildrenChanged, p)),
                Some(_) => inner.watches.add(self.id, WatchKind::Child, &p),
            }
        }
        for p in set.persistent {
            inner.watches.add(self.id, WatchKind::Persistent, &p);
        }
        for p in set.persistent_recursive {
            inner.watches.add(self.id, WatchKind::PersistentRecursive, &p);
        }
        for (event, p) in events {
            self.send(encode_watch_event(zxid, event, &p));
        }
    }

    /// The tree command a request writes, or `None` for a request that is not a batched
    /// write (reads, and CloseSession, which ends the connection).
    fn command_for(&self, incoming: &Incoming) -> Option<Command> {
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let (multi, ops) = match &incoming.request {
            Request::Create { path, data, acl, flags, .. } => (
                false,
                vec![TreeOp::Create { path: path.clone(), data: data.clone(), acl: acl.clone(), flags: *flags }],
            ),
            Request::Delete { path, version } => {
                (false, vec![TreeOp::Delete { path: path.clone(), version: *version }])
            }
            Request::SetData { path, data, version } => {
                (false, vec![TreeOp::SetData { path: path.clone(), data: data.clone(), version: *version }])
            }
            Request::SetAcl { path, acl, version } => {
                (false, vec![TreeOp::SetAcl { path: path.clone(), acl: acl.clone(), version: *version }])
            }
            Request::Multi(ops) => (
                true,
                ops.iter()
                    .map(|o| match o.clone() {
                        MultiOp::Create { path, data, acl, flags, .. } => TreeOp::Create { path, data, acl, flags },
                        MultiOp::Delete { path, version } => TreeOp::Delete { path, version },
                        MultiOp::SetData { path, data, version } => TreeOp::SetData { path, data, version },
                        MultiOp::Check { path, version } => TreeOp::Check { path, version },
                    })
                    .collect(),
            ),
            _ => return None,
        };
        Some(Command::OpsAs { session_id: self.id, time_ms, multi, ops, auth: self.auth().clone() })
    }

    /// Commits a run of writes in order and answers each once this node applied it. Returns
    /// false when the connection must end: an outcome is unknown, and, like a ZooKeeper
    /// server that lost its leader, dropping the connection makes the client see
    /// ConnectionLoss and reconnect.
    async fn write_run(&self, node: &Arc<Coordinator>, run: Vec<Incoming>) -> bool {
        let commands: Vec<Command> = run.iter().filter_map(|i| self.command_for(i)).collect();
        let results = node.write_batch(commands).await;
        let last_index = results.iter().filter_map(|r| r.as_ref().ok().map(|c| c.index)).max();
        if let Some(index) = last_index {
            node.state.wait_applied(index).await;
        }
        for (incoming, result) in run.iter().zip(results) {
            match result {
                Ok(Committed { zxid, result, .. }) => {
                    if let CommandResult::Failed(code) = &result {
                        metrics::counter!(crate::metrics::ERRORS, "code" => format!("{code:?}")).increment(1);
                    }
                    let multi_ops: Vec<i32> = match &incoming.request {
                        Request::Multi(ops) => ops.iter().map(MultiOp::op_code).collect(),
                        _ => Vec::new(),
                    };
                    self.send(reply::write_result(incoming.xid, zxid, incoming.op_code, &multi_ops, &result));
                    record_request(node, incoming.op_code, incoming.received);
                }
                Err(e) => {
                    tracing::warn!(error = %e, op = op::name(incoming.op_code), "write failed; dropping the connection");
                    self.closed.notify_one();
                    return false;
                }
            }
        }
        true
    }
}
