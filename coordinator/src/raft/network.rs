//! The messages between coordinator nodes and their TCP transport: Raft's own RPCs, plus the
//! requests a follower sends to the leader on behalf of its clients (writes, read barriers for
//! `sync`, and the sessions it heard from). Frames are bincode on an authenticated connection
//! (`transport`).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::transport::{ClusterKey, PeerStream};
use super::{Node, NodeId, TypeConfig};
use crate::tree::command::{Command, CommandResult};
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{Snapshot, SnapshotMeta, Vote};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot {
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, Node>,
        data: Vec<u8>,
    },
    /// A client write (or a batch of them) received by a follower.
    Write(Command),
    /// The index a read must wait for to see every write acknowledged so far.
    ReadIndex,
    /// Sessions that sent something to a follower since its last report.
    TouchSessions(Vec<i64>),
    /// A client's reconfig with the identities of its connection, for the leader to run.
    Reconfig {
        request: crate::reconfig::ReconfigRequest,
        auth: Vec<crate::acl::AuthId>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ForwardError {
    #[error("not the leader (leader is {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("{0}")]
    Failed(String),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<SnapshotResponse<NodeId>, String>),
    Write(Result<(u64, CommandResult), ForwardError>),
    ReadIndex(Result<u64, ForwardError>),
    Touched,
    /// `/zookeeper/config`'s new data and stat, or why the reconfig failed.
    Reconfig(Result<(Vec<u8>, crate::proto::records::Stat), crate::proto::codes::ErrorCode>),
}

/// Idle connections to peers, by address, shared by everything that calls a peer.
#[derive(Clone)]
pub struct PeerPool {
    idle: Arc<Mutex<HashMap<String, Vec<PeerStream>>>>,
    /// The cluster's secret; `None` on a node without peers, which calls none.
    key: Option<Arc<ClusterKey>>,
}

impl PeerPool {
    pub fn new(key: Option<Arc<ClusterKey>>) -> PeerPool {
        PeerPool { idle: Arc::default(), key }
    }

    /// One request and its response, on an idle connection or a new one; a connection that
    /// failed is dropped, not returned to the pool.
    pub async fn call(&self, addr: &str, request: &PeerRequest, timeout: Duration) -> io::Result<PeerResponse> {
        let key = self.key.clone().ok_or_else(|| {
            io::Error::new(io::ErrorKind::PermissionDenied, "this node has no cluster secret to call peers with")
        })?;
        let pooled = self.idle.lock().ok().and_then(|mut m| m.get_mut(addr).and_then(Vec::pop));
        let attempt = async {
            let mut stream = match pooled {
                Some(s) => s,
                None => PeerStream::connect(addr, &key).await?,
            };
            stream.send(request).await?;
            let response: PeerResponse = stream.recv().await?;
            Ok::<_, io::Error>((stream, response))
        };
        let (stream, response) = tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, format!("peer {addr} did not answer in {timeout:?}"))
        })??;
        if let Ok(mut m) = self.idle.lock() {
            m.entry(addr.to_string()).or_default().push(stream);
        }
        Ok(response)
    }
}

pub struct NetworkFactory {
    pub pool: PeerPool,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        PeerNetwork { target, addr: node.addr.clone(), pool: self.pool.clone() }
    }
}

pub struct PeerNetwork {
    target: NodeId,
    addr: String,
    pool: PeerPool,
}

fn unexpected(response: &PeerResponse) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unexpected peer response {response:?}"))
}

type RpcResult<T> = Result<T, RPCError<NodeId, Node, RaftError<NodeId>>>;

impl PeerNetwork {
    async fn raft_call(&self, request: PeerRequest, option: &RPCOption) -> RpcResult<PeerResponse> {
        self.pool
            .call(&self.addr, &request, option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        match self.raft_call(PeerRequest::AppendEntries(rpc), &option).await? {
            PeerResponse::AppendEntries(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            other => Err(RPCError::Network(NetworkError::new(&unexpected(&other)))),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>> {
        match self.raft_call(PeerRequest::Vote(rpc), &option).await? {
            PeerResponse::Vote(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            other => Err(RPCError::Network(NetworkError::new(&unexpected(&other)))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let request = PeerRequest::Snapshot { vote, meta: snapshot.meta, data: *snapshot.snapshot };
        let response = self
            .pool
            .call(&self.addr, &request, option.hard_ttl().max(Duration::from_secs(30)))
            .await
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))?;
        match response {
            PeerResponse::Snapshot(Ok(r)) => Ok(r),
            PeerResponse::Snapshot(Err(e)) => Err(StreamingError::Network(NetworkError::new(&io::Error::other(e)))),
            other => Err(StreamingError::Network(NetworkError::new(&unexpected(&other)))),
        }
    }
}
