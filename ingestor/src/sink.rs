//! The storage node's insert service, as the ingestor uses it.

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
use tonic::transport::Channel;
use tonic::Code;
use tracing::warn;

use crate::error::IngestError;
use crate::pipeline::{InsertPolicy, QuorumSetting};

#[derive(Clone)]
pub struct StorageNode {
    addr: String,
    client: IngestClient<Channel>,
    /// The pipeline's insert quorum, sent with every block.
    quorum: Option<InsertQuorum>,
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

impl StorageNode {
    /// Connects, retrying for up to `patience` (the storage node may still be starting).
    pub async fn connect(addr: &str, patience: Duration) -> Result<StorageNode, IngestError> {
        let url = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match IngestClient::connect(url.clone()).await {
                Ok(client) => {
                    let client = client.max_decoding_message_size(64 << 20).max_encoding_message_size(256 << 20);
                    return Ok(StorageNode { addr: addr.to_string(), client, quorum: None });
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    warn!(addr, error = %e, "the storage node is not reachable yet");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => return Err(IngestError::Storage { addr: addr.to_string(), message: e.to_string() }),
            }
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

    fn error(&self, status: tonic::Status) -> IngestError {
        IngestError::Storage { addr: self.addr.clone(), message: status.message().to_string() }
    }

    /// Creates the table if it is missing; its insert schema.
    pub async fn create_table(&self, ddl: &str) -> Result<SchemaRef, IngestError> {
        let reply = self
            .client
            .clone()
            .create_table(CreateTableRequest { ddl: ddl.to_string() })
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        let reader = StreamReader::try_new(reply.arrow_schema.as_slice(), None)
            .map_err(|e| IngestError::Storage { addr: self.addr.clone(), message: format!("bad schema: {e}") })?;
        Ok(reader.schema())
    }

    /// Inserts a block together with its offset. Retries, with the same token, while the
    /// storage node is unreachable or delays inserts (too many parts): consumption waits.
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
            match self.client.clone().insert(request.clone()).await {
                Ok(reply) => {
                    let InsertReply { offset_version, quorum_pending, parts, .. } = reply.into_inner();
                    if quorum_pending {
                        self.await_quorum(table, parts).await?;
                    }
                    return Ok(Committed::Done { version: offset_version });
                }
                Err(s) if Reason::of(&s).is_some() => {
                    let message = s.message().to_string();
                    return match Reason::of(&s) {
                        Some(Reason::StaleVersion) => Ok(Committed::Refused(message)),
                        Some(Reason::OffsetNodeMissing | Reason::CorruptOffsetRecord) => {
                            Ok(Committed::Stopped(message))
                        }
                        _ => Err(IngestError::StorageConfiguration { addr: self.addr.clone(), message }),
                    };
                }
                Err(s)
                    if matches!(
                        s.code(),
                        Code::ResourceExhausted | Code::Unavailable | Code::Unknown | Code::Cancelled
                    ) =>
                {
                    metrics::counter!("mergestream_ingestor_insert_retries_total").increment(1);
                    warn!(table, token, code = ?s.code(), message = s.message(), "insert delayed; retrying the same block");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(s) => return Err(self.error(s)),
            }
        }
    }

    /// A committed block whose quorum was not reached in time: the block must not be sent
    /// again (its offset is committed), so the partition waits here until the replicas have
    /// it. A storage node that cannot be reached is asked again.
    async fn await_quorum(&self, table: &str, parts: Vec<String>) -> Result<(), IngestError> {
        let request = AwaitQuorumRequest { table: table.to_string(), parts, quorum: self.quorum };
        let mut backoff = Duration::from_millis(100);
        loop {
            metrics::counter!("mergestream_ingestor_quorum_waits_total").increment(1);
            warn!(table, parts = ?request.parts, "the block is committed, its insert quorum not yet reached: waiting");
            match self.client.clone().await_quorum(request.clone()).await {
                Ok(reply) if reply.get_ref().reached => return Ok(()),
                Ok(_) => {}
                Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(s) => return Err(self.error(s)),
            }
        }
    }
}
