//! The storage nodes' insert service, as the ingestor uses it: one node, or the replicas of
//! replicated tables, any of which can take a block.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use mergestream_proto::ingest::ingest_client::IngestClient;
use mergestream_proto::ingest::{
    AwaitQuorumRequest, CreateTableRequest, InsertQuorum, InsertReply, InsertRequest, OffsetCommit,
};
use mergestream_proto::refusal::Reason;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tracing::{info, warn};

use crate::error::IngestError;
use crate::pipeline::{InsertPolicy, QuorumSetting};
use mergestream_proto::tls::ClientTls;

/// One storage node.
#[derive(Clone)]
struct Node {
    addr: String,
    client: IngestClient<Channel>,
}

/// The storage nodes a pipeline writes to. With several (the replicas of its replicated
/// tables), a block whose node cannot be reached goes to the next one with the same token and
/// the same expected offset version: the coordinator's multi lets it commit once, whichever
/// node it reaches, and a node that committed it before dying makes the retry a duplicate.
#[derive(Clone)]
pub struct StorageNode {
    nodes: Arc<Vec<Node>>,
    /// The node blocks go to now.
    current: Arc<AtomicUsize>,
    /// The pipeline's insert quorum, sent with every block.
    quorum: Option<InsertQuorum>,
    /// Each table's DDL, to create it on a node that did not have it when the pipeline started.
    ddl: Arc<Mutex<BTreeMap<String, String>>>,
}

/// How an insert with an offset commit ended.
pub enum Committed {
    /// The block and its offset are in: the offset node is now at this version.
    Done { version: i32 },
    /// The offset node moved under us: another ingestor owns the partition now.
    Refused(String),
    /// The offset node is missing or damaged: the partition's position is unknown, and it
    /// must not be consumed until a person repairs the node.
    Stopped(String),
}

/// One try of an insert on one node.
enum Attempt {
    Ended(Committed),
    /// Worth another try: on another node when the status says this one is out of reach.
    Again(tonic::Status),
}

fn sized(client: IngestClient<Channel>) -> IngestClient<Channel> {
    client.max_decoding_message_size(64 << 20).max_encoding_message_size(256 << 20)
}

/// Whether a status means the node, or its coordinator session, is out of reach: another
/// replica may take the block.
fn node_unreachable(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled)
}

impl StorageNode {
    /// Connects to the first of `addrs` that answers, retrying for up to `patience` (the
    /// nodes may still be starting); the others are reached when a block first goes to them.
    pub async fn connect(addrs: &[String], tls: &ClientTls, patience: Duration) -> Result<StorageNode, IngestError> {
        if addrs.is_empty() {
            return Err(IngestError::Storage {
                addr: String::new(),
                message: "no storage node given (--storage-node)".into(),
            });
        }
        // A bad address or CA file is a configuration error: found before any waiting.
        let endpoints = addrs
            .iter()
            .map(|addr| {
                tls.endpoint(addr).map_err(|e| IngestError::Storage { addr: addr.clone(), message: e.to_string() })
            })
            .collect::<Result<Vec<Endpoint>, _>>()?;
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            for (index, (addr, endpoint)) in addrs.iter().zip(&endpoints).enumerate() {
                match endpoint.connect().await {
                    Ok(channel) => return Ok(StorageNode::with_first_reached(addrs, &endpoints, index, channel)),
                    Err(e) => {
                        warn!(addr, error = %mergestream_proto::error_chain(&e), "the storage node is not reachable yet")
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(IngestError::Storage {
                    addr: addrs.join(","),
                    message: format!("no storage node answered within {patience:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn with_first_reached(addrs: &[String], endpoints: &[Endpoint], reached: usize, channel: Channel) -> StorageNode {
        let mut channel = Some(channel);
        let nodes = addrs
            .iter()
            .zip(endpoints)
            .enumerate()
            .map(|(index, (addr, endpoint))| {
                let channel = match channel.take_if(|_| index == reached) {
                    Some(channel) => channel,
                    None => endpoint.connect_lazy(),
                };
                Node { addr: addr.clone(), client: sized(IngestClient::new(channel)) }
            })
            .collect();
        StorageNode {
            nodes: Arc::new(nodes),
            current: Arc::new(AtomicUsize::new(reached)),
            quorum: None,
            ddl: Arc::default(),
        }
    }

    /// Inserts with the pipeline's quorum from now on.
    pub fn with_policy(mut self, policy: &InsertPolicy) -> StorageNode {
        self.quorum = policy.quorum.map(|q| InsertQuorum {
            replicas: match q {
                QuorumSetting::Replicas(n) => n,
                QuorumSetting::Majority => 0,
            },
            timeout_ms: policy.quorum_timeout_ms,
        });
        self
    }

    fn node(&self) -> (usize, &Node) {
        let index = self.current.load(Ordering::SeqCst) % self.nodes.len();
        (index, &self.nodes[index])
    }

    /// After a node failed a block: the next one takes the following tries.
    fn fail_over(&self, from: usize, status: &tonic::Status) {
        if self.nodes.len() < 2 {
            return;
        }
        let next = (from + 1) % self.nodes.len();
        if self.current.compare_exchange(from, next, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            metrics::counter!(crate::metrics::STORAGE_FAILOVERS).increment(1);
            warn!(
                from = self.nodes[from].addr,
                to = self.nodes[next].addr,
                code = ?status.code(),
                message = mergestream_proto::status_text(status),
                "the storage node is out of reach: blocks go to the next replica"
            );
        }
    }

    fn error(node: &Node, status: tonic::Status) -> IngestError {
        IngestError::Storage { addr: node.addr.clone(), message: mergestream_proto::status_text(&status) }
    }

    /// Creates the table on every node where it is missing; its insert schema (from the node
    /// blocks go to). A node out of reach gets it when a block first goes there.
    pub async fn create_table(&self, table: &str, ddl: &str) -> Result<SchemaRef, IngestError> {
        if let Ok(mut known) = self.ddl.lock() {
            known.insert(table.to_string(), ddl.to_string());
        }
        let (current, node) = self.node();
        let schema = Self::create_on(node, ddl).await?;
        for (index, other) in self.nodes.iter().enumerate().filter(|(i, _)| *i != current) {
            if let Err(e) = Self::create_on(other, ddl).await {
                warn!(addr = other.addr, index, error = %e, "cannot create the table on this replica yet");
            }
        }
        Ok(schema)
    }

    async fn create_on(node: &Node, ddl: &str) -> Result<SchemaRef, IngestError> {
        let reply = node
            .client
            .clone()
            .create_table(CreateTableRequest { ddl: ddl.to_string() })
            .await
            .map_err(|s| Self::error(node, s))?
            .into_inner();
        let reader = StreamReader::try_new(reply.arrow_schema.as_slice(), None)
            .map_err(|e| IngestError::Storage { addr: node.addr.clone(), message: format!("bad schema: {e}") })?;
        Ok(reader.schema())
    }

    /// Inserts a block together with its offset. Retries, with the same token, while the
    /// storage nodes are unreachable or delay inserts (too many parts): consumption waits.
    pub async fn insert_committing(
        &self,
        table: &str,
        block: &RecordBatch,
        token: &str,
        offset: OffsetCommit,
    ) -> Result<Committed, IngestError> {
        let mut bytes = Vec::new();
        {
            let encode =
                |e: arrow::error::ArrowError| IngestError::Table { table: table.to_string(), message: e.to_string() };
            let mut writer = StreamWriter::try_new(&mut bytes, &block.schema()).map_err(encode)?;
            writer.write(block).map_err(encode)?;
            writer.finish().map_err(encode)?;
        }
        let request = InsertRequest {
            table: table.to_string(),
            arrow_ipc: bytes,
            deduplication_token: token.to_string(),
            offset: Some(offset),
            quorum: self.quorum,
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            let (index, node) = self.node();
            let status = match self.attempt(node, &request).await? {
                Attempt::Ended(committed) => return Ok(committed),
                Attempt::Again(status) => status,
            };
            metrics::counter!(crate::metrics::INSERT_RETRIES).increment(1);
            warn!(
                table,
                token,
                addr = node.addr,
                code = ?status.code(),
                message = mergestream_proto::status_text(&status),
                "insert delayed; retrying the same block"
            );
            if node_unreachable(&status) {
                self.fail_over(index, &status);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn attempt(&self, node: &Node, request: &InsertRequest) -> Result<Attempt, IngestError> {
        match node.client.clone().insert(request.clone()).await {
            Ok(reply) => {
                let InsertReply { offset_version, quorum_pending, parts, .. } = reply.into_inner();
                if quorum_pending {
                    self.await_quorum(&request.table, parts).await?;
                }
                Ok(Attempt::Ended(Committed::Done { version: offset_version }))
            }
            Err(s) if Reason::of(&s).is_some() => {
                let message = s.message().to_string();
                match Reason::of(&s) {
                    Some(Reason::StaleVersion) => Ok(Attempt::Ended(Committed::Refused(message))),
                    Some(Reason::OffsetNodeMissing | Reason::CorruptOffsetRecord) => {
                        Ok(Attempt::Ended(Committed::Stopped(message)))
                    }
                    _ => Err(IngestError::StorageConfiguration { addr: node.addr.clone(), message }),
                }
            }
            Err(s) if s.code() == Code::NotFound && self.nodes.len() > 1 => {
                // A replica that was out of reach when the pipeline started: it gets the
                // table now, and the block is tried again.
                let ddl = self.ddl.lock().ok().and_then(|known| known.get(&request.table).cloned());
                let Some(ddl) = ddl else { return Err(Self::error(node, s)) };
                info!(addr = node.addr, table = request.table, "creating the table on a replica that lacked it");
                Self::create_on(node, &ddl).await?;
                Ok(Attempt::Again(s))
            }
            Err(s) if node_unreachable(&s) || s.code() == Code::ResourceExhausted => Ok(Attempt::Again(s)),
            Err(s) => Err(Self::error(node, s)),
        }
    }

    /// A committed block whose quorum was not reached in time: the block must not be sent
    /// again (its offset is committed), so the partition waits here until the replicas have
    /// it. Any replica can tell, from the quorum's node in the coordinator: one out of reach
    /// hands the question to the next.
    async fn await_quorum(&self, table: &str, parts: Vec<String>) -> Result<(), IngestError> {
        let request = AwaitQuorumRequest { table: table.to_string(), parts, quorum: self.quorum };
        let mut backoff = Duration::from_millis(100);
        loop {
            metrics::counter!(crate::metrics::QUORUM_WAITS).increment(1);
            warn!(table, parts = ?request.parts, "the block is committed, its insert quorum not yet reached: waiting");
            let (index, node) = self.node();
            match node.client.clone().await_quorum(request.clone()).await {
                Ok(reply) if reply.get_ref().reached => return Ok(()),
                Ok(_) => {}
                Err(s) if node_unreachable(&s) => {
                    self.fail_over(index, &s);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(s) => return Err(Self::error(node, s)),
            }
        }
    }
}
