//! Kafka through rdkafka: a manual assignment of the owned partitions (no group join to wait
//! for), group commits for lag tools, and a producer for dead letters.
//!
//! The consumer's blocking poll runs on a thread of its own that copies messages out of
//! librdkafka into batches (one buffer each) and forwards them over a bounded channel (a
//! full channel stops the polling: backpressure). Every
//! assignment is made on that thread too, between two polls, and starts a new generation:
//! a batch polled under an older assignment is dropped unread, so a partition assigned again
//! from an earlier offset never sees stale messages from its previous reading.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::{mpsc as channel, oneshot};
use tracing::debug;

use super::{dead_letter_headers, Batch, BatchBuilder, DeadLetter, Incoming, PartitionKey, Source};
use crate::error::IngestError;
use crate::pipeline::{KafkaSource, MessageParts};

/// Messages per batch the poll thread sends, and batches the channel holds.
const BATCH: usize = 1024;
const BATCHES_IN_FLIGHT: usize = 16;
/// How long one poll waits for a message: the poll thread's reaction time to a change of
/// assignment (a first assignment is taken at once).
const POLL_WAIT: Duration = Duration::from_millis(50);
/// How long a batch may wait to fill after its first message. librdkafka's queue runs empty
/// for a moment between fetched message sets; shipping a batch at each of those moments made
/// batches of a few messages, one thread handoff each.
const BATCH_FILL: Duration = Duration::from_millis(5);

/// A batch from the poll thread, with the assignment it was read under.
struct Polled {
    generation: u64,
    batch: Result<Batch, KafkaError>,
}

/// A new assignment for the poll thread, answered with its generation.
struct Assign {
    partitions: TopicPartitionList,
    done: oneshot::Sender<Result<u64, KafkaError>>,
}

pub struct Kafka {
    topics: Vec<String>,
    consumer: Arc<BaseConsumer>,
    assignments: mpsc::Sender<Assign>,
    batches: channel::Receiver<Polled>,
    generation: u64,
    /// Made on the first dead letter.
    producer: std::sync::OnceLock<FutureProducer>,
    config: ClientConfig,
}

/// librdkafka settings the ingestor changes from librdkafka's defaults; the pipeline's
/// `properties` override them.
const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    // librdkafka pauses a partition's fetching for this long once its local queue is full
    // (queued.min.messages). The ingestor decodes more slowly than librdkafka fetches, so the
    // queue fills again and again, and the default 1000 ms left it idle for most of each
    // second (seen in bench/ingest.py: five 0.9 s gaps in 6 s).
    ("fetch.queue.backoff.ms", "10"),
    // How long the broker may hold a fetch that finds no new data. A block is only as fresh as
    // the fetch that brings its last messages, and the default 500 ms showed as up to half a
    // second between taking a partition and its first block (bench/ingest.py with 1,000
    // messages: 0.31-0.83 s end to end, 0.31-0.46 s at 100 ms). An idle partition costs ten
    // fetches a second instead of two.
    ("fetch.wait.max.ms", "100"),
];

/// librdkafka's own limit on its prefetch queue, in KiB.
const PREFETCH_KIB: (u64, u64) = (1024, 65_536);

/// The consumer's settings: the pipeline's properties over the ingestor's defaults, and the
/// prefetch queue bounded by the pipeline's memory (librdkafka's queue is memory in flight
/// too, and its default of 64 MiB alone would pass a small `max_in_flight_bytes`).
fn consumer_config(source: &KafkaSource, max_in_flight_bytes: u64) -> ClientConfig {
    let mut config = client_config(source);
    for (key, value) in CONSUMER_DEFAULTS {
        if !source.properties.contains_key(*key) {
            config.set(*key, *value);
        }
    }
    if !source.properties.contains_key("queued.max.messages.kbytes") {
        let kib = (max_in_flight_bytes / 4 / 1024).clamp(PREFETCH_KIB.0, PREFETCH_KIB.1);
        config.set("queued.max.messages.kbytes", kib.to_string());
    }
    config
        .set("group.id", &source.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    config
}

fn client_config(source: &KafkaSource) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &source.brokers);
    for (k, v) in &source.properties {
        config.set(k, v);
    }
    config
}

/// The room the first batch's buffer starts with; each later one starts with a little more
/// than the largest batch so far took.
const FIRST_BATCH_BYTES: usize = 64 << 10;

/// What the poll thread reads of a message beyond its payload, key and position.
struct Reading {
    /// The topic when the source has only one: librdkafka hands a message's topic as a C
    /// string, measured and checked as UTF-8 at each call.
    only_topic: Option<String>,
    /// Headers and the timestamp only when a column maps them. librdkafka parses a message's
    /// headers at the first call, into buffers allocated and freed for each message, even
    /// when it has none: that was a quarter of the poll thread's time. Reading the timestamp
    /// was the first touch of librdkafka's message (a cache miss), 6 % of it.
    parts: MessageParts,
}

fn incoming<'a>(m: &'a BorrowedMessage<'_>, reading: &'a Reading) -> Incoming<'a> {
    let headers = match reading.parts.headers.then(|| m.headers()).flatten() {
        Some(h) => h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect(),
        None => Vec::new(),
    };
    Incoming {
        topic: reading.only_topic.as_deref().unwrap_or_else(|| m.topic()),
        partition: m.partition(),
        position: m.offset(),
        timestamp_ms: if reading.parts.timestamp { m.timestamp().to_millis() } else { None },
        payload: m.payload().unwrap_or_default(),
        key: m.key(),
        subject: None,
        headers,
    }
}

/// The poll thread: assignments between polls, messages out in batches, until the source is
/// dropped.
fn poll_loop(
    consumer: Arc<BaseConsumer>,
    reading: Reading,
    assignments: mpsc::Receiver<Assign>,
    out: channel::Sender<Polled>,
) {
    let mut generation = 0;
    let mut assigned = 0;
    let mut batch_bytes = FIRST_BATCH_BYTES;
    loop {
        // With nothing assigned there is nothing to poll for, and a poll cannot be woken: the
        // first assignment waited for the end of one (up to POLL_WAIT) at every start.
        let mut next = if assigned == 0 {
            match assignments.recv_timeout(POLL_WAIT) {
                Ok(assign) => Some(assign),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        loop {
            let Assign { partitions, done } = match next.take().map_or_else(|| assignments.try_recv(), Ok) {
                Ok(assign) => assign,
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            };
            let result = consumer.assign(&partitions).map(|()| {
                generation += 1;
                assigned = partitions.count();
                generation
            });
            let _ = done.send(result);
        }
        if assigned == 0 {
            continue;
        }
        let mut batch = BatchBuilder::with_capacity(batch_bytes);
        let mut failed = None;
        let mut fill_by: Option<Instant> = None;
        while batch.len() < BATCH {
            // The clock is read only once librdkafka's queue runs empty.
            let polled = match consumer.poll(Duration::ZERO) {
                Some(polled) => polled,
                None => {
                    let wait = match fill_by {
                        None => POLL_WAIT,
                        Some(by) => by.saturating_duration_since(Instant::now()),
                    };
                    if wait.is_zero() {
                        break;
                    }
                    match consumer.poll(wait) {
                        Some(polled) => polled,
                        None if fill_by.is_none() => break,
                        None => continue,
                    }
                }
            };
            match polled {
                Ok(m) => batch.push(incoming(&m, &reading)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            fill_by.get_or_insert_with(|| Instant::now() + BATCH_FILL);
        }
        let batch = (!batch.is_empty()).then(|| batch.finish());
        if let Some(b) = &batch {
            batch_bytes = batch_bytes.max(b.data().len() + b.data().len() / 8);
        }
        for batch in [batch.map(Ok), failed.map(Err)].into_iter().flatten() {
            if out.blocking_send(Polled { generation, batch }).is_err() {
                return;
            }
        }
    }
}

impl Kafka {
    /// A consumer of the source's topics; `max_in_flight_bytes` is the pipeline's memory bound,
    /// a quarter of which librdkafka's prefetch queue may take. Message headers and timestamps
    /// are read only if `parts` asks for them.
    pub fn new(source: &KafkaSource, max_in_flight_bytes: u64, parts: MessageParts) -> Result<Kafka, IngestError> {
        let consumer: BaseConsumer = consumer_config(source, max_in_flight_bytes).create()?;
        let consumer = Arc::new(consumer);
        let (assignments, assignments_rx) = mpsc::channel();
        let (out, batches) = channel::channel(BATCHES_IN_FLIGHT);
        let polled = consumer.clone();
        let reading = Reading {
            only_topic: match &source.topics[..] {
                [topic] => Some(topic.clone()),
                _ => None,
            },
            parts,
        };
        std::thread::Builder::new()
            .name("kafka-poll".into())
            .spawn(move || poll_loop(polled, reading, assignments_rx, out))
            .map_err(|e| IngestError::Task(format!("cannot start the Kafka poll thread: {e}")))?;
        Ok(Kafka {
            topics: source.topics.clone(),
            consumer,
            assignments,
            batches,
            generation: 0,
            producer: std::sync::OnceLock::new(),
            config: client_config(source),
        })
    }

    fn producer(&self) -> Result<&FutureProducer, IngestError> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let made: FutureProducer = self.config.create()?;
        Ok(self.producer.get_or_init(|| made))
    }
}

fn poll_thread_gone() -> IngestError {
    IngestError::Task("the Kafka poll thread ended".into())
}

impl Source for Kafka {
    async fn partitions(&mut self) -> Result<Vec<PartitionKey>, IngestError> {
        let consumer = self.consumer.clone();
        let topics = self.topics.clone();
        let found = tokio::task::spawn_blocking(move || -> Result<Vec<PartitionKey>, KafkaError> {
            let mut out = Vec::new();
            for topic in &topics {
                let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
                for t in metadata.topics() {
                    let name: Arc<str> = t.name().into();
                    out.extend(t.partitions().iter().map(|p| (name.clone(), p.id())));
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| IngestError::Task(e.to_string()))??;
        Ok(found)
    }

    async fn assign(&mut self, from: &[(PartitionKey, i64)]) -> Result<(), IngestError> {
        let mut partitions = TopicPartitionList::new();
        for ((topic, partition), next) in from {
            let offset = if *next < 0 { Offset::Beginning } else { Offset::Offset(*next) };
            partitions.add_partition_offset(topic, *partition, offset)?;
        }
        let (done, answer) = oneshot::channel();
        self.assignments.send(Assign { partitions, done }).map_err(|_| poll_thread_gone())?;
        // Batches polled meanwhile belong to the old assignment; taking them off the channel
        // also keeps the poll thread from blocking on a full channel before it assigns.
        tokio::pin!(answer);
        let generation = loop {
            tokio::select! {
                generation = &mut answer => break generation.map_err(|_| poll_thread_gone())??,
                _ = self.batches.recv() => {}
            }
        };
        self.generation = generation;
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<Batch, IngestError> {
        loop {
            let polled = self.batches.recv().await.ok_or_else(poll_thread_gone)?;
            if polled.generation == self.generation {
                return Ok(polled.batch?);
            }
        }
    }

    fn committed(&mut self, (topic, partition): &PartitionKey, next: i64) {
        if next < 0 {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(topic, *partition, Offset::Offset(next)).is_ok() {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                debug!(error = %e, "cannot commit the group offset");
            }
        }
    }

    async fn ends(&self, partitions: Vec<PartitionKey>) -> Vec<(PartitionKey, i64)> {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || {
            partitions
                .into_iter()
                .filter_map(|(topic, partition)| {
                    let (_, high) = consumer.fetch_watermarks(&topic, partition, Duration::from_secs(2)).ok()?;
                    Some(((topic, partition), high))
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    async fn dead_letter(
        &self,
        destination: &str,
        table: &str,
        from: &PartitionKey,
        letter: &DeadLetter,
    ) -> Result<(), IngestError> {
        let fields = dead_letter_headers(letter, table, from);
        let headers = fields
            .iter()
            .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(value.as_str()) }));
        let mut record = FutureRecord::to(destination).payload(&letter.payload[..]).headers(headers);
        if let Some(k) = &letter.key {
            record = record.key(&k[..]);
        }
        self.producer()?.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| IngestError::Kafka(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(properties: &[(&str, &str)]) -> KafkaSource {
        KafkaSource {
            brokers: "127.0.0.1:1".into(),
            topics: vec!["t".into()],
            group_id: "g".into(),
            properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    fn with(properties: &[(&str, &str)]) -> Result<Kafka, IngestError> {
        Kafka::new(&source(properties), 256 << 20, MessageParts { headers: true, timestamp: true })
    }

    #[test]
    fn the_prefetch_queue_is_a_quarter_of_the_memory_bound() {
        let prefetch = |properties: &[(&str, &str)], bound: u64| {
            let source = source(properties);
            let config = consumer_config(&source, bound);
            config.get("queued.max.messages.kbytes").map(str::to_string)
        };
        assert_eq!(prefetch(&[], 32 << 20).as_deref(), Some("8192"));
        assert_eq!(prefetch(&[], 1 << 40).as_deref(), Some("65536"), "librdkafka's default at most");
        assert_eq!(prefetch(&[], 1 << 20).as_deref(), Some("1024"), "1 MiB at least");
        assert_eq!(prefetch(&[("queued.max.messages.kbytes", "777")], 32 << 20).as_deref(), Some("777"));
        assert_eq!(consumer_config(&source(&[]), 1 << 30).get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(consumer_config(&source(&[]), 1 << 30).get("fetch.wait.max.ms"), Some("100"));
        let given = source(&[("fetch.wait.max.ms", "500")]);
        assert_eq!(consumer_config(&given, 1 << 30).get("fetch.wait.max.ms"), Some("500"), "the pipeline's own wins");
    }

    /// librdkafka checks at creation that a SASL mechanism is built in; these are, with TLS.
    #[test]
    fn sasl_plain_and_scram_over_tls_are_built_in() {
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] {
            let made = with(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", mechanism),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
            ]);
            assert!(made.is_ok(), "{mechanism}: {:?}", made.err());
        }
        assert!(with(&[("security.protocol", "SASL_PLAINTEXT"), ("sasl.mechanism", "GSSAPI")]).is_err());
    }
}
