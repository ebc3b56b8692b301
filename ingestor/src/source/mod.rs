//! Where messages come from: Kafka partitions or a JetStream stream, behind one interface.
//!
//! The runner owns partitions through the coordinator and tells the source which ones to read
//! and from which position; the source hands their messages over in position order. Positions
//! are the source's own numbers (a Kafka offset, a JetStream stream sequence): the runner
//! stores them in the coordinator with each block, and the source's native acknowledgement (a
//! Kafka group commit, a JetStream ack) follows them only for the source's own lag tools.

pub mod kafka;
pub mod nats;

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::error::IngestError;

/// A partition of the source: (topic, partition) for Kafka, (stream, 0) for JetStream. The
/// name is shared: every message carries its partition's key.
pub type PartitionKey = (Arc<str>, i32);

/// The position of a partition that was never read: its oldest retained message.
pub const BEGINNING: i64 = -2;

/// Messages a source read in one go. Their payloads, keys and subjects are ranges of one
/// buffer: handing a batch from the source's thread to the runner costs one allocation, and
/// no reference count is touched per message (atomics bouncing between two threads' caches
/// cost more than copying an 80-byte payload).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    data: Bytes,
    partitions: Vec<PartitionKey>,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    partition: usize,
    position: i64,
    timestamp_ms: Option<i64>,
    payload: Range<usize>,
    key: Option<Range<usize>>,
    /// The NATS subject; a Kafka message's topic is its partition's.
    topic: Option<Range<usize>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// One message of a [`Batch`], as every source hands it over.
#[derive(Debug, Clone)]
pub struct SourceMessage<'a> {
    pub partition: &'a PartitionKey,
    /// The Kafka offset or the JetStream stream sequence.
    pub position: i64,
    /// The Kafka topic or the NATS subject (the `topic` column).
    pub topic: &'a str,
    pub payload: &'a [u8],
    pub key: Option<&'a [u8]>,
    pub headers: &'a [(String, Vec<u8>)],
    pub timestamp_ms: Option<i64>,
    /// Where the payload and the key lie in [`Batch::data`], to keep them without a copy.
    pub payload_range: Range<usize>,
    pub key_range: Option<Range<usize>>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The buffer every message's bytes are in.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    pub fn get(&self, i: usize) -> SourceMessage<'_> {
        let e = &self.entries[i];
        let partition = &self.partitions[e.partition];
        let topic = match &e.topic {
            // The builder copied it from a &str, whole.
            Some(range) => std::str::from_utf8(&self.data[range.clone()]).unwrap_or_default(),
            None => &partition.0,
        };
        SourceMessage {
            partition,
            position: e.position,
            topic,
            payload: &self.data[e.payload.clone()],
            key: e.key.clone().map(|k| &self.data[k]),
            headers: &e.headers,
            timestamp_ms: e.timestamp_ms,
            payload_range: e.payload.clone(),
            key_range: e.key.clone(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = SourceMessage<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// Collects messages into a [`Batch`], copying their bytes into its buffer.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    data: BytesMut,
    partitions: Vec<PartitionKey>,
    entries: Vec<Entry>,
}

/// A message's parts, borrowed for the time it takes to copy them.
pub struct Incoming<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub position: i64,
    pub timestamp_ms: Option<i64>,
    pub payload: &'a [u8],
    pub key: Option<&'a [u8]>,
    /// A subject that differs from the partition's name (NATS).
    pub subject: Option<&'a str>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl BatchBuilder {
    /// A builder whose buffer starts with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> BatchBuilder {
        BatchBuilder { data: BytesMut::with_capacity(bytes), ..Default::default() }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn push(&mut self, m: Incoming<'_>) {
        let partition = match self.partitions.iter().position(|(t, p)| *p == m.partition && **t == *m.topic) {
            Some(i) => i,
            None => {
                self.partitions.push((m.topic.into(), m.partition));
                self.partitions.len() - 1
            }
        };
        let payload = self.copy(m.payload);
        let key = m.key.map(|k| self.copy(k));
        let topic = m.subject.map(|s| self.copy(s.as_bytes()));
        self.entries.push(Entry {
            partition,
            position: m.position,
            timestamp_ms: m.timestamp_ms,
            payload,
            key,
            topic,
            headers: m.headers,
        });
    }

    fn copy(&mut self, bytes: &[u8]) -> Range<usize> {
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        start..self.data.len()
    }

    pub fn finish(self) -> Batch {
        Batch { data: self.data.freeze(), partitions: self.partitions, entries: self.entries }
    }
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

    /// The next messages of the assigned partitions, each partition's in position order;
    /// pending while there are none. Cancel-safe: the runner polls it beside its timers. An
    /// error is transient and is logged.
    async fn next_batch(&mut self) -> Result<Batch, IngestError>;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_gives_back_each_message_from_its_one_buffer() {
        let mut builder = BatchBuilder::with_capacity(4);
        let incoming = |partition, position, payload: &'static [u8], key, subject| Incoming {
            topic: "orders",
            partition,
            position,
            timestamp_ms: Some(position * 10),
            payload,
            key,
            subject,
            headers: Vec::new(),
        };
        builder.push(incoming(0, 7, b"first", None, None));
        builder.push(incoming(1, 3, b"second", Some(b"k"), Some("orders.eu")));
        builder.push(incoming(0, 8, b"", Some(b""), None));
        let batch = builder.finish();
        let got: Vec<_> =
            batch.iter().map(|m| (m.partition.1, m.position, m.topic, m.payload, m.key, m.timestamp_ms)).collect();
        assert_eq!(
            got,
            vec![
                (0, 7, "orders", &b"first"[..], None, Some(70)),
                (1, 3, "orders.eu", &b"second"[..], Some(&b"k"[..]), Some(30)),
                (0, 8, "orders", &b""[..], Some(&b""[..]), Some(80)),
            ]
        );
        assert!(Arc::ptr_eq(&batch.get(0).partition.0, &batch.get(2).partition.0), "one name per partition");
        let second = batch.get(1);
        assert_eq!(batch.data().slice(second.payload_range), &b"second"[..]);
    }
}
