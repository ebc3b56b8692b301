//! The Kafka consume loop of `ingestor run`.
//!
//! One consumer with a manual assignment: the partitions this instance owns in the
//! coordinator, each from its coordinator position. Messages are decoded into per-(partition,
//! table) buffers; a buffer is flushed as one block when it reaches the pipeline's rows,
//! bytes or age threshold, or when the memory of all buffers passes `max_in_flight_bytes`.
//! A flush inserts the block and moves the offset node in one commit on the storage node,
//! and waits for it: a slow or delaying storage node slows consumption down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use coordinator_client::EphemeralLock;
use mergestream_proto::ingest::OffsetCommit;
use mergestream_query::input::value::Value;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::decode::{DecodeError, MessageMeta, RowDecoder};
use crate::error::IngestError;
use crate::ownership::{Ownership, Position, BEGINNING};
use crate::pipeline::{ErrorMode, KafkaSource, Pipeline};
use crate::sink::{Committed, StorageNode};

/// How `ingestor run` reaches the rest of the system.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub storage_node: String,
    pub coordinator: String,
    /// This instance's name in lock nodes (defaults to host and pid).
    pub instance: String,
    pub session_timeout: Duration,
}

struct TableSink {
    name: String,
    decoder: RowDecoder,
    schema: SchemaRef,
}

/// A message set aside for the dead-letter topic.
struct DeadLetter {
    offset: i64,
    payload: Vec<u8>,
    key: Option<Vec<u8>>,
    reason: String,
    kind: &'static str,
}

/// The rows of one table from one partition, waiting to be flushed. It covers every offset
/// from `first` to `last`, the bad and skipped messages too, so the position moves past them.
struct Buffer {
    first: i64,
    last: i64,
    rows: Vec<Vec<Value>>,
    /// The offset and raw message of each row, for rows found bad only when the block is built.
    origins: Vec<(i64, Vec<u8>, Option<Vec<u8>>)>,
    dead: Vec<DeadLetter>,
    skipped: usize,
    bytes: usize,
    since: Instant,
}

impl Buffer {
    fn new(first: i64) -> Buffer {
        Buffer {
            first,
            last: first - 1,
            rows: Vec::new(),
            origins: Vec::new(),
            dead: Vec::new(),
            skipped: 0,
            bytes: 0,
            since: Instant::now(),
        }
    }

    fn bad(&self) -> usize {
        self.dead.len() + self.skipped
    }
}

struct TablePosition {
    position: Position,
    buffer: Option<Buffer>,
}

struct OwnedPartition {
    lock: EphemeralLock,
    tables: Vec<TablePosition>,
    /// The offset to fetch from if the partition is assigned again.
    fetch_next: i64,
}

type PartitionKey = (String, i32);

pub struct KafkaIngest {
    pipeline: Pipeline,
    source: KafkaSource,
    options: RunOptions,
    consumer: Arc<StreamConsumer>,
    dead_letters: Option<(FutureProducer, String)>,
    storage: StorageNode,
    ownership: Ownership,
    tables: Vec<TableSink>,
    partitions: Vec<PartitionKey>,
    owned: BTreeMap<PartitionKey, OwnedPartition>,
    in_flight_bytes: usize,
}

fn kafka_config(source: &KafkaSource) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &source.brokers);
    for (k, v) in &source.properties {
        config.set(k, v);
    }
    config
}

impl KafkaIngest {
    pub async fn start(pipeline: Pipeline, options: RunOptions) -> Result<KafkaIngest, IngestError> {
        let crate::pipeline::Source::Kafka(source) = pipeline.source.clone() else {
            return Err(IngestError::Unsupported("a nats source"));
        };
        if !matches!(pipeline.format, crate::pipeline::Format::Json) {
            return Err(IngestError::Unsupported("the avro formats"));
        }
        let storage = StorageNode::connect(&options.storage_node, Duration::from_secs(60)).await?;
        let mut tables = Vec::new();
        for target in &pipeline.tables {
            let schema = storage.create_table(&target.ddl).await?;
            let decoder = RowDecoder::new(target)
                .map_err(|message| IngestError::Table { table: target.name.clone(), message })?;
            tables.push(TableSink { name: target.name.clone(), decoder, schema });
        }
        let consumer: StreamConsumer = kafka_config(&source)
            .set("group.id", &source.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .create()?;
        let dead_letters = match &pipeline.errors.mode {
            ErrorMode::DeadLetter { topic } => Some((kafka_config(&source).create::<FutureProducer>()?, topic.clone())),
            _ => None,
        };
        let ownership =
            Ownership::connect(&options.coordinator, options.session_timeout, &pipeline.name, &options.instance)
                .await?;
        ownership.register().await?;
        Ok(KafkaIngest {
            pipeline,
            source,
            options,
            consumer: Arc::new(consumer),
            dead_letters,
            storage,
            ownership,
            tables,
            partitions: Vec::new(),
            owned: BTreeMap::new(),
            in_flight_bytes: 0,
        })
    }

    /// Consumes until `shutdown` resolves, then flushes and commits everything buffered.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), IngestError> {
        tokio::pin!(shutdown);
        let consumer = self.consumer.clone();
        let mut flush_tick = tokio::time::interval(Duration::from_millis(50));
        let mut ownership_tick = tokio::time::interval(Duration::from_millis(1000));
        let mut lag_tick = tokio::time::interval(Duration::from_secs(5));
        let mut rounds = 0u64;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                message = consumer.recv() => match message {
                    Ok(m) => self.on_message(&m).await?,
                    Err(e) => warn!(error = %e, "kafka consumer error"),
                },
                _ = flush_tick.tick() => self.flush_due().await?,
                _ = ownership_tick.tick() => {
                    self.refresh_ownership(rounds.is_multiple_of(10)).await?;
                    rounds += 1;
                }
                _ = lag_tick.tick() => self.report_lag().await,
            }
        }
        info!(pipeline = self.pipeline.name, "shutting down: flushing every buffer");
        let keys: Vec<PartitionKey> = self.owned.keys().cloned().collect();
        for key in keys {
            for t in 0..self.tables.len() {
                self.flush(&key, t).await?;
            }
        }
        for (_, p) in std::mem::take(&mut self.owned) {
            if let Err(e) = self.ownership.release(p.lock).await {
                warn!(error = %e, "cannot release a partition lock (it goes with the session)");
            }
        }
        Ok(())
    }

    async fn on_message(&mut self, m: &BorrowedMessage<'_>) -> Result<(), IngestError> {
        let key = (m.topic().to_string(), m.partition());
        let Some(owned) = self.owned.get_mut(&key) else { return Ok(()) };
        let offset = m.offset();
        owned.fetch_next = offset + 1;
        let payload = m.payload().unwrap_or_default();
        metrics::counter!("mergestream_ingestor_messages_total").increment(1);
        metrics::counter!("mergestream_ingestor_bytes_total").increment(payload.len() as u64);
        let parsed =
            serde_json::from_slice::<serde_json::Value>(payload).map_err(|e| DecodeError::Malformed(e.to_string()));
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        let meta = MessageMeta {
            topic: m.topic(),
            partition: m.partition(),
            offset,
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key(),
            headers: &headers,
        };
        let mut failed = None;
        let mut full = Vec::new();
        for (t, sink) in self.tables.iter().enumerate() {
            let tp = &mut owned.tables[t];
            if tp.position.next != BEGINNING && offset < tp.position.next {
                continue; // already in this table
            }
            let decoded = parsed.as_ref().map_err(Clone::clone).and_then(|v| sink.decoder.decode(v, &meta));
            if let (Err(e), ErrorMode::Fail) = (&decoded, &self.pipeline.errors.mode) {
                failed = Some(e.to_string());
                break;
            }
            let buffer = tp.buffer.get_or_insert_with(|| Buffer::new(offset));
            buffer.last = offset;
            buffer.bytes += payload.len();
            self.in_flight_bytes += payload.len();
            match decoded {
                Ok(row) => {
                    buffer.rows.push(row);
                    let keep = self.dead_letters.is_some() || matches!(self.pipeline.errors.mode, ErrorMode::Fail);
                    buffer.origins.push((
                        offset,
                        if keep { payload.to_vec() } else { Vec::new() },
                        m.key().map(<[u8]>::to_vec),
                    ));
                }
                Err(e) => {
                    metrics::counter!("mergestream_ingestor_decode_errors_total", "kind" => e.kind()).increment(1);
                    debug!(topic = m.topic(), partition = m.partition(), offset, table = sink.name, error = %e, "bad message");
                    match &self.pipeline.errors.mode {
                        ErrorMode::DeadLetter { .. } => buffer.dead.push(DeadLetter {
                            offset,
                            payload: payload.to_vec(),
                            key: m.key().map(<[u8]>::to_vec),
                            reason: e.to_string(),
                            kind: e.kind(),
                        }),
                        ErrorMode::Skip | ErrorMode::Fail => buffer.skipped += 1,
                    }
                }
            }
            let limits = &self.pipeline.batch;
            if buffer.rows.len() + buffer.bad() >= limits.max_rows || buffer.bytes >= limits.max_bytes {
                full.push(t);
            }
        }
        if let Some(reason) = failed {
            // Everything before the bad message goes in; the pipeline stops at it.
            for t in 0..self.tables.len() {
                self.flush(&key, t).await?;
            }
            return Err(IngestError::BadMessage { topic: key.0, partition: key.1, offset, reason });
        }
        for t in full {
            self.flush(&key, t).await?;
        }
        if self.in_flight_bytes > self.pipeline.max_in_flight_bytes as usize {
            self.flush_largest().await?;
        }
        Ok(())
    }

    async fn flush_due(&mut self) -> Result<(), IngestError> {
        let max_age = Duration::from_millis(self.pipeline.batch.max_ms);
        let due: Vec<(PartitionKey, usize)> = self
            .owned
            .iter()
            .flat_map(|(k, p)| {
                p.tables.iter().enumerate().filter_map(move |(t, tp)| {
                    tp.buffer.as_ref().filter(|b| b.since.elapsed() >= max_age).map(|_| (k.clone(), t))
                })
            })
            .collect();
        for (key, t) in due {
            self.flush(&key, t).await?;
        }
        Ok(())
    }

    async fn flush_largest(&mut self) -> Result<(), IngestError> {
        let largest = self
            .owned
            .iter()
            .flat_map(|(k, p)| {
                p.tables.iter().enumerate().map(move |(t, tp)| (tp.buffer.as_ref().map_or(0, |b| b.bytes), k, t))
            })
            .max_by_key(|(bytes, _, _)| *bytes)
            .map(|(_, k, t)| (k.clone(), t));
        if let Some((key, t)) = largest {
            self.flush(&key, t).await?;
        }
        Ok(())
    }

    /// Inserts one buffer as a block with its offset commit.
    async fn flush(&mut self, key: &PartitionKey, t: usize) -> Result<(), IngestError> {
        let Some(owned) = self.owned.get_mut(key) else { return Ok(()) };
        let Some(mut buffer) = owned.tables[t].buffer.take() else { return Ok(()) };
        let expected_version = owned.tables[t].position.version;
        self.in_flight_bytes -= buffer.bytes;
        let sink = &self.tables[t];
        let block = loop {
            match sink.decoder.build(&sink.schema, &buffer.rows) {
                Ok(block) => break block,
                Err(bad) => {
                    // Values that do not fit their column: set those rows aside like any bad message.
                    for (row, e) in bad.iter().rev() {
                        metrics::counter!("mergestream_ingestor_decode_errors_total", "kind" => e.kind()).increment(1);
                        buffer.rows.remove(*row);
                        let (offset, payload, msg_key) = buffer.origins.remove(*row);
                        match &self.pipeline.errors.mode {
                            ErrorMode::DeadLetter { .. } => buffer.dead.push(DeadLetter {
                                offset,
                                payload,
                                key: msg_key,
                                reason: e.to_string(),
                                kind: e.kind(),
                            }),
                            ErrorMode::Skip => buffer.skipped += 1,
                            ErrorMode::Fail => {
                                return Err(IngestError::BadMessage {
                                    topic: key.0.clone(),
                                    partition: key.1,
                                    offset,
                                    reason: e.to_string(),
                                })
                            }
                        }
                    }
                }
            }
        };
        let total = block.num_rows() + buffer.bad();
        let limit = self.pipeline.errors.max_error_rate;
        if total > 0 && buffer.bad() as f64 / total as f64 > limit {
            return Err(IngestError::ErrorRate {
                topic: key.0.clone(),
                partition: key.1,
                bad: buffer.bad(),
                total,
                limit,
            });
        }
        self.send_dead_letters(key, &sink.name, &mut buffer.dead).await?;

        let token =
            format!("{}:{}:{}:{}:{}-{}", self.pipeline.name, sink.name, key.0, key.1, buffer.first, buffer.last);
        let commit = OffsetCommit {
            path: self.ownership.offset_path(&sink.name, &key.0, key.1),
            expected_version,
            next_position: buffer.last + 1,
        };
        let began = Instant::now();
        let rows = block.num_rows();
        let outcome = self.storage.insert_committing(&sink.name, &block, &token, commit).await?;
        match outcome {
            Committed::Done { version } => {
                metrics::histogram!("mergestream_ingestor_insert_seconds").record(began.elapsed().as_secs_f64());
                metrics::counter!("mergestream_ingestor_blocks_total", "table" => sink.name.clone()).increment(1);
                metrics::counter!("mergestream_ingestor_rows_total", "table" => sink.name.clone())
                    .increment(rows as u64);
                debug!(token, rows, version, "block committed");
                if let Some(owned) = self.owned.get_mut(key) {
                    owned.tables[t].position = Position { next: buffer.last + 1, version };
                }
                self.commit_to_group(key);
            }
            Committed::Refused(why) => {
                warn!(topic = key.0, partition = key.1, why, "the partition has another owner now: giving it up");
                self.drop_partition(key).await?;
            }
        }
        Ok(())
    }

    async fn send_dead_letters(
        &self,
        key: &PartitionKey,
        table: &str,
        dead: &mut Vec<DeadLetter>,
    ) -> Result<(), IngestError> {
        let Some((producer, topic)) = &self.dead_letters else { return Ok(()) };
        // In source order: bad values found when the block is built come after the others.
        dead.sort_by_key(|d| d.offset);
        for d in dead.drain(..) {
            let offset = d.offset.to_string();
            let partition = key.1.to_string();
            let headers = OwnedHeaders::new()
                .insert(Header { key: "mergestream.reason", value: Some(d.reason.as_str()) })
                .insert(Header { key: "mergestream.error", value: Some(d.kind) })
                .insert(Header { key: "mergestream.table", value: Some(table) })
                .insert(Header { key: "mergestream.source.topic", value: Some(key.0.as_str()) })
                .insert(Header { key: "mergestream.source.partition", value: Some(partition.as_str()) })
                .insert(Header { key: "mergestream.source.offset", value: Some(offset.as_str()) });
            let mut record = FutureRecord::to(topic).payload(&d.payload).headers(headers);
            if let Some(k) = &d.key {
                record = record.key(k);
            }
            producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| IngestError::Kafka(e))?;
            metrics::counter!("mergestream_ingestor_dead_lettered_total").increment(1);
        }
        Ok(())
    }

    /// The group offset follows the coordinator's (the lowest over the tables), for lag tools.
    fn commit_to_group(&self, key: &PartitionKey) {
        let Some(owned) = self.owned.get(key) else { return };
        let next = owned.tables.iter().map(|t| t.position.next).min().unwrap_or(BEGINNING);
        if next < 0 {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(&key.0, key.1, Offset::Offset(next)).is_ok() {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                debug!(error = %e, "cannot commit the group offset");
            }
        }
    }

    async fn drop_partition(&mut self, key: &PartitionKey) -> Result<(), IngestError> {
        if let Some(p) = self.owned.remove(key) {
            for tp in &p.tables {
                if let Some(b) = &tp.buffer {
                    self.in_flight_bytes -= b.bytes;
                }
            }
            if let Err(e) = self.ownership.release(p.lock).await {
                debug!(error = %e, "cannot release a lost partition lock");
            }
        }
        self.reassign()
    }

    /// Takes the partitions that are free, up to this instance's fair share, and gives up
    /// everything when the coordinator session is lost (its locks are gone with it).
    async fn refresh_ownership(&mut self, refresh_metadata: bool) -> Result<(), IngestError> {
        if !self.ownership.alive() {
            warn!("the coordinator session is lost: giving up every partition and starting a new session");
            self.owned.clear();
            self.in_flight_bytes = 0;
            self.reassign()?;
            let fresh = Ownership::connect(
                &self.options.coordinator,
                self.options.session_timeout,
                &self.pipeline.name,
                &self.options.instance,
            )
            .await;
            // An unreachable coordinator is waited out, not fatal: the next round tries again.
            match fresh {
                Ok(fresh) => self.ownership = fresh,
                Err(e) => {
                    warn!(error = %e, "the coordinator is not reachable yet");
                    return Ok(());
                }
            }
            self.ownership.register().await?;
        }
        if !self.ownership.connected() {
            return Ok(());
        }
        if refresh_metadata || self.partitions.is_empty() {
            self.partitions = self.discover_partitions().await?;
        }
        let instances = self.ownership.instances().await?.max(1);
        let share = self.partitions.len().div_ceil(instances);
        let mut changed = false;
        for key in self.partitions.clone() {
            if self.owned.len() >= share {
                break;
            }
            if self.owned.contains_key(&key) {
                continue;
            }
            let Some(lock) = self.ownership.try_own(&key.0, key.1).await? else { continue };
            let mut tables = Vec::new();
            for sink in &self.tables {
                let position = self.ownership.position(&sink.name, &key.0, key.1).await?;
                tables.push(TablePosition { position, buffer: None });
            }
            let fetch_next = if tables.iter().any(|t| t.position.next == BEGINNING) {
                BEGINNING
            } else {
                tables.iter().map(|t| t.position.next).min().unwrap_or(BEGINNING)
            };
            info!(topic = key.0, partition = key.1, from = fetch_next, "owning partition");
            self.owned.insert(key, OwnedPartition { lock, tables, fetch_next });
            changed = true;
        }
        if changed {
            self.reassign()?;
        }
        metrics::gauge!("mergestream_ingestor_owned_partitions").set(self.owned.len() as f64);
        Ok(())
    }

    async fn discover_partitions(&self) -> Result<Vec<PartitionKey>, IngestError> {
        let consumer = self.consumer.clone();
        let topics = self.source.topics.clone();
        let found = tokio::task::spawn_blocking(move || -> Result<Vec<PartitionKey>, rdkafka::error::KafkaError> {
            let mut out = Vec::new();
            for topic in &topics {
                let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
                for t in metadata.topics() {
                    out.extend(t.partitions().iter().map(|p| (t.name().to_string(), p.id())));
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| IngestError::Storage { addr: "metadata task".into(), message: e.to_string() })??;
        Ok(found)
    }

    /// Assigns the owned partitions, each from the offset after the last message received.
    fn reassign(&self) -> Result<(), IngestError> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), p) in &self.owned {
            let offset = if p.fetch_next < 0 { Offset::Beginning } else { Offset::Offset(p.fetch_next) };
            tpl.add_partition_offset(topic, *partition, offset)?;
        }
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    async fn report_lag(&self) {
        let consumer = self.consumer.clone();
        let positions: Vec<(PartitionKey, i64)> = self
            .owned
            .iter()
            .map(|(k, p)| (k.clone(), p.tables.iter().map(|t| t.position.next.max(0)).min().unwrap_or(0)))
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            for ((topic, partition), next) in positions {
                if let Ok((_, high)) = consumer.fetch_watermarks(&topic, partition, Duration::from_secs(2)) {
                    metrics::gauge!("mergestream_ingestor_consumer_lag", "topic" => topic, "partition" => partition.to_string())
                        .set((high - next).max(0) as f64);
                }
            }
        })
        .await;
    }
}
