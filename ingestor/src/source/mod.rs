//! Where messages come from: Kafka partitions or a JetStream stream, behind one interface.
//!
//! The runner owns partitions through the coordinator and tells the source which ones to read
//! and from which position; the source hands their messages over in position order. Positions
//! are the source's own numbers (a Kafka offset, a JetStream stream sequence): the runner
//! stores them in the coordinator with each block, and the source's native acknowledgement (a
//! Kafka group commit, a JetStream ack) follows them only for the source's own lag tools.

pub mod kafka;
pub mod nats;

use std::sync::Arc;

use bytes::Bytes;

use crate::error::IngestError;

/// A partition of the source: (topic, partition) for Kafka, (stream, 0) for JetStream. The
/// name is shared: every message carries its partition's key.
pub type PartitionKey = (Arc<str>, i32);

/// The position of a partition that was never read: its oldest retained message.
pub const BEGINNING: i64 = -2;

/// One message, as every source hands it over. Payload and key may be slices of a buffer
/// shared with other messages of the same fetch.
#[derive(Debug, Clone)]
pub struct SourceMessage {
    pub partition: PartitionKey,
    /// The Kafka offset or the JetStream stream sequence.
    pub position: i64,
    /// The Kafka topic or the NATS subject (the `topic` column).
    pub topic: Arc<str>,
    pub payload: Bytes,
    pub key: Option<Bytes>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
}

/// A message set aside for the dead-letter destination, with why.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub position: i64,
    pub payload: Bytes,
    pub key: Option<Bytes>,
    pub reason: String,
    /// A short stable name of the error (`malformed`, `missing_field`, …).
    pub kind: &'static str,
}

/// The headers a dead letter carries, the same for every source.
pub fn dead_letter_headers(letter: &DeadLetter, table: &str, from: &PartitionKey) -> Vec<(&'static str, String)> {
    vec![
        ("mergestream.reason", letter.reason.clone()),
        ("mergestream.error", letter.kind.to_string()),
        ("mergestream.table", table.to_string()),
        ("mergestream.source.topic", from.0.to_string()),
        ("mergestream.source.partition", from.1.to_string()),
        ("mergestream.source.offset", letter.position.to_string()),
    ]
}

/// A message source. The runner drives it from one task (`ingestor run` blocks on the
/// runner), so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Source {
    /// Every partition of what the pipeline reads.
    async fn partitions(&mut self) -> Result<Vec<PartitionKey>, IngestError>;

    /// Reads exactly these partitions from now on, each from its position (or [`BEGINNING`]).
    async fn assign(&mut self, from: &[(PartitionKey, i64)]) -> Result<(), IngestError>;

    /// The next message of an assigned partition; pending while there is none. Cancel-safe:
    /// the runner polls it beside its timers. An error is transient and is logged.
    async fn next(&mut self) -> Result<SourceMessage, IngestError>;

    /// Advisory: everything before `next` is in the tables (a Kafka group commit, a
    /// JetStream ack), so that the source's own lag tools show the truth.
    fn committed(&mut self, partition: &PartitionKey, next: i64);

    /// The position after the last message of each partition, for the lag metric.
    async fn ends(&self, partitions: Vec<PartitionKey>) -> Vec<(PartitionKey, i64)>;

    /// Publishes a bad message to `destination` (a topic or a subject) with the reason in
    /// its headers.
    async fn dead_letter(
        &self,
        destination: &str,
        table: &str,
        from: &PartitionKey,
        letter: &DeadLetter,
    ) -> Result<(), IngestError>;
}
