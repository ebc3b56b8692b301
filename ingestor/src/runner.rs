//! The consume loop of `ingestor run`, the same for every source.
//!
//! The runner owns partitions through the coordinator and tells the source to read them,
//! each from its coordinator position. Messages are decoded into per-(partition, table)
//! buffers; a buffer is flushed as one block when it reaches the pipeline's rows, bytes or
//! age threshold, or when the memory of all buffers and blocks in flight passes their share
//! of `max_in_flight_bytes`. A flush inserts the block and moves the offset node in one commit
//! on the storage node. Inserts run beside consumption, at most one per (partition, table)
//! at a time since each needs the offset node version the previous one left; a slow or
//! delaying storage node therefore slows consumption down once the memory bound is reached.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use coordinator_client::EphemeralLock;
use mergestream_proto::ingest::OffsetCommit;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tracing::{debug, error, info, warn};

use crate::decode::{DecodeError, Document, MessageMeta, PayloadDecoder, Projection, RowDecoder, Rows};
use crate::error::IngestError;
use crate::ownership::{Ownership, Position, PositionError};
use crate::pipeline::{BatchLimits, ErrorMode, Pipeline};
use crate::sink::{Committed, StorageNode};
use crate::source::{Batch, DeadLetter, PartitionKey, Source, BEGINNING};
use crate::status::StatusReporter;

/// How `ingestor run` reaches the rest of the system.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The storage nodes: one, or the replicas of the pipeline's replicated tables.
    pub storage_nodes: Vec<String>,
    /// Plain text or TLS to the storage nodes.
    pub storage_tls: mergestream_proto::tls::ClientTls,
    pub coordinator: String,
    /// This instance's name in lock nodes (defaults to host and pid).
    pub instance: String,
    pub session_timeout: Duration,
    /// TLS and the identity to reach the coordinator with.
    pub coordinator_access: coordinator_client::KeeperAccess,
}

struct TableSink {
    name: String,
    decoder: RowDecoder,
    schema: SchemaRef,
}

/// The raw message behind a row, kept for rows found bad only when the block is built: where
/// its payload and key lie in one of the buffer's source batches.
struct Origin {
    position: i64,
    batch: usize,
    payload: Range<usize>,
    key: Option<Range<usize>>,
}

/// The rows of one table from one partition, waiting to be flushed. It covers every position
/// from `first` to `last`, the bad and skipped messages too, so the position moves past them.
struct Buffer {
    first: i64,
    last: i64,
    rows: Rows,
    origins: Vec<Origin>,
    /// The data of the source batches its rows came from, kept for [`Origin`]s.
    batches: Vec<Bytes>,
    dead: Vec<DeadLetter>,
    skipped: usize,
    bytes: usize,
    since: Instant,
}

impl Buffer {
    fn new(first: i64, rows: Rows) -> Buffer {
        Buffer {
            first,
            last: first - 1,
            rows,
            origins: Vec::new(),
            batches: Vec::new(),
            dead: Vec::new(),
            skipped: 0,
            bytes: 0,
            since: Instant::now(),
        }
    }

    fn bad(&self) -> usize {
        self.dead.len() + self.skipped
    }

    /// The index of `data` among the batches this buffer keeps, kept now if it is new.
    fn keep_batch(&mut self, data: &Bytes) -> usize {
        let same = |kept: &Bytes| kept.as_ptr() == data.as_ptr() && kept.len() == data.len();
        if !self.batches.last().is_some_and(same) {
            self.batches.push(data.clone());
        }
        self.batches.len() - 1
    }

    /// A message set aside, with its bytes out of the batch they are in.
    fn set_aside(&mut self, mode: &ErrorMode, e: DecodeError, origin: Origin) {
        match mode {
            ErrorMode::DeadLetter { .. } => {
                let data = &self.batches[origin.batch];
                self.dead.push(DeadLetter {
                    position: origin.position,
                    payload: data.slice(origin.payload),
                    key: origin.key.map(|k| data.slice(k)),
                    reason: e.to_string(),
                    kind: e.kind(),
                })
            }
            ErrorMode::Skip | ErrorMode::Fail => self.skipped += 1,
        }
    }
}

struct TablePosition {
    position: Position,
    buffer: Option<Buffer>,
    /// The bytes of this table's block being inserted, if one is.
    in_flight: Option<usize>,
}

struct OwnedPartition {
    lock: EphemeralLock,
    tables: Vec<TablePosition>,
    /// The position after the last message received: where to read from if the partition is
    /// assigned again, and below which a message is a redelivery.
    fetch_next: i64,
}

/// What an insert task reports back.
struct Inserted {
    partition: PartitionKey,
    table: usize,
    /// The first position after the block.
    next: i64,
    rows: usize,
    bytes: usize,
    began: Instant,
    outcome: Result<Committed, IngestError>,
}

pub struct Runner<S: Source> {
    pipeline: Pipeline,
    options: RunOptions,
    source: S,
    payloads: PayloadDecoder,
    storage: StorageNode,
    ownership: Ownership,
    tables: Vec<Arc<TableSink>>,
    partitions: Vec<PartitionKey>,
    owned: BTreeMap<PartitionKey, OwnedPartition>,
    /// Partitions whose offset node is damaged or gone: never taken again by this process.
    stopped: BTreeSet<PartitionKey>,
    inserts: JoinSet<Inserted>,
    /// Bytes of messages buffered or in blocks being inserted.
    in_flight_bytes: usize,
    /// When the source last gave messages.
    last_batch: Instant,
    messages_in: metrics::Counter,
    bytes_in: metrics::Counter,
    /// Messages and bytes taken from the batch being read, counted into `messages_in` and
    /// `bytes_in` once it is read (two atomic operations a message showed in profiles).
    batch_taken: (u64, u64),
    status: StatusReporter,
}

/// The share of `max_in_flight_bytes` for buffers and blocks being inserted: three quarters,
/// the last quarter being the source's own prefetch (librdkafka's queue; see
/// `source::kafka::consumer_config`).
fn buffer_bound(max_in_flight_bytes: u64) -> usize {
    (max_in_flight_bytes - max_in_flight_bytes / 4) as usize
}

/// How often buffers are checked against `max_ms` and `idle_ms`: a fifth of the shorter of the
/// two, between 5 and 50 ms, so that a block goes at most a fifth of its limit late.
fn flush_check_period(limits: &BatchLimits) -> Duration {
    let shortest = limits.idle_ms.map_or(limits.max_ms, |idle| idle.min(limits.max_ms));
    Duration::from_millis((shortest / 5).clamp(5, 50))
}

impl<S: Source> Runner<S> {
    pub async fn start(pipeline: Pipeline, mut source: S, options: RunOptions) -> Result<Runner<S>, IngestError> {
        let payloads = PayloadDecoder::new(&pipeline.format, Projection::new(&pipeline.tables))?;
        // Three independent round trips of tens of milliseconds each (a new table's files
        // synced, a coordinator session, the broker's metadata through librdkafka's first
        // connections), made at once: they were half of a start.
        let tables_created = async {
            let storage = StorageNode::connect(&options.storage_nodes, &options.storage_tls, Duration::from_secs(60))
                .await?
                .with_policy(&pipeline.insert);
            let mut tables = Vec::new();
            for target in &pipeline.tables {
                let schema = storage.create_table(&target.name, &target.ddl).await?;
                let decoder = RowDecoder::new(target, payloads.projection())
                    .map_err(|message| IngestError::Table { table: target.name.clone(), message })?;
                tables.push(Arc::new(TableSink { name: target.name.clone(), decoder, schema }));
            }
            Ok::<_, IngestError>((storage, tables))
        };
        let registered = async {
            let ownership = Ownership::connect(
                &options.coordinator,
                options.session_timeout,
                &options.coordinator_access,
                &pipeline.name,
                &options.instance,
            )
            .await?;
            ownership.register().await?;
            Ok::<_, IngestError>(ownership)
        };
        let ((storage, tables), ownership, partitions) =
            tokio::try_join!(tables_created, registered, source.partitions())?;
        Ok(Runner {
            pipeline,
            options,
            source,
            payloads,
            storage,
            ownership,
            tables,
            partitions,
            owned: BTreeMap::new(),
            stopped: BTreeSet::new(),
            inserts: JoinSet::new(),
            in_flight_bytes: 0,
            last_batch: Instant::now(),
            messages_in: metrics::counter!(crate::metrics::MESSAGES),
            bytes_in: metrics::counter!(crate::metrics::BYTES),
            batch_taken: (0, 0),
            status: StatusReporter::on_stderr(),
        })
    }

    /// Consumes until `shutdown` resolves, then flushes and commits everything buffered.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), IngestError> {
        tokio::pin!(shutdown);
        let mut flush_tick = tokio::time::interval(flush_check_period(&self.pipeline.batch));
        flush_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut ownership_tick = tokio::time::interval(Duration::from_millis(1000));
        let mut lag_tick = tokio::time::interval(Duration::from_secs(5));
        // Round 0 would read the partitions again: `start` just did.
        let mut rounds = 1u64;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                batch = self.source.next_batch() => match batch {
                    Ok(batch) => {
                        self.last_batch = Instant::now();
                        let mut document = Document::default();
                        for i in 0..batch.len() {
                            self.on_message(&batch, i, &mut document).await?;
                        }
                        let (messages, bytes) = std::mem::take(&mut self.batch_taken);
                        self.messages_in.increment(messages);
                        self.bytes_in.increment(bytes);
                    }
                    Err(e) => warn!(error = %e, "source error"),
                },
                Some(done) = self.inserts.join_next() => self.on_inserted(done).await?,
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
                self.wait_for_insert(&key, t).await?;
                self.flush(&key, t).await?;
            }
        }
        while self.finish_an_insert().await? {}
        for (_, p) in std::mem::take(&mut self.owned) {
            if let Err(e) = self.ownership.release(p.lock).await {
                warn!(error = %e, "cannot release a partition lock (it goes with the session)");
            }
        }
        Ok(())
    }

    /// Decodes message `i` of `batch` (into `document`, which the messages of a batch share)
    /// into the buffers of its partition.
    async fn on_message<'b>(
        &mut self,
        batch: &'b Batch,
        i: usize,
        document: &mut Document<'b>,
    ) -> Result<(), IngestError> {
        let m = batch.get(i);
        let key = m.partition;
        let Some(owned) = self.owned.get_mut(key) else { return Ok(()) };
        let position = m.position;
        if owned.fetch_next != BEGINNING && position < owned.fetch_next {
            return Ok(()); // a redelivery of a message already taken
        }
        owned.fetch_next = position + 1;
        self.batch_taken.0 += 1;
        self.batch_taken.1 += m.payload.len() as u64;
        let parsed = self.payloads.decode(m.payload, document).await?;
        let meta = MessageMeta {
            topic: m.topic,
            partition: key.1,
            offset: position,
            timestamp_ms: m.timestamp_ms,
            key: m.key,
            headers: m.headers,
        };
        let mut failed = None;
        let mut full = Vec::new();
        for (t, sink) in self.tables.iter().enumerate() {
            let tp = &mut owned.tables[t];
            if tp.position.next != BEGINNING && position < tp.position.next {
                continue; // already in this table
            }
            let buffer = tp.buffer.get_or_insert_with(|| Buffer::new(position, sink.decoder.rows()));
            let decoded = match &parsed {
                Ok(()) => sink.decoder.decode(document, &meta, &mut buffer.rows),
                Err(e) => Err(e.clone()),
            };
            if let (Err(e), ErrorMode::Fail) = (&decoded, &self.pipeline.errors.mode) {
                failed = Some(e.to_string());
                if buffer.last < buffer.first {
                    tp.buffer = None; // made for this message only
                }
                break;
            }
            buffer.last = position;
            buffer.bytes += m.payload.len();
            self.in_flight_bytes += m.payload.len();
            let origin = Origin {
                position,
                batch: buffer.keep_batch(batch.data()),
                payload: m.payload_range.clone(),
                key: m.key_range.clone(),
            };
            match decoded {
                Ok(()) => buffer.origins.push(origin),
                Err(e) => {
                    metrics::counter!(crate::metrics::DECODE_ERRORS, "kind" => e.kind()).increment(1);
                    debug!(partition = ?key, position, table = sink.name, error = %e, "bad message");
                    buffer.set_aside(&self.pipeline.errors.mode, e, origin);
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
                self.wait_for_insert(key, t).await?;
                self.flush(key, t).await?;
                self.wait_for_insert(key, t).await?;
            }
            return Err(IngestError::BadMessage {
                topic: key.0.to_string(),
                partition: key.1,
                offset: position,
                reason,
            });
        }
        for t in full {
            // A full buffer waits for the block before it: one insert per table and partition.
            self.wait_for_insert(key, t).await?;
            self.flush(key, t).await?;
        }
        while self.in_flight_bytes > buffer_bound(self.pipeline.max_in_flight_bytes) {
            if !self.flush_largest().await? && !self.finish_an_insert().await? {
                break;
            }
        }
        Ok(())
    }

    /// Flushes the buffers older than the pipeline's `max_ms`, or every buffer once the
    /// source has been quiet for `idle_ms`, if the pipeline sets it.
    async fn flush_due(&mut self) -> Result<(), IngestError> {
        let limits = &self.pipeline.batch;
        let idle = limits.idle_ms.is_some_and(|ms| self.last_batch.elapsed() >= Duration::from_millis(ms));
        let max_age = if idle { Duration::ZERO } else { Duration::from_millis(limits.max_ms) };
        let due: Vec<(PartitionKey, usize)> = self
            .owned
            .iter()
            .flat_map(|(k, p)| {
                p.tables.iter().enumerate().filter_map(move |(t, tp)| {
                    let due =
                        tp.in_flight.is_none() && tp.buffer.as_ref().is_some_and(|b| b.since.elapsed() >= max_age);
                    due.then(|| (k.clone(), t))
                })
            })
            .collect();
        for (key, t) in due {
            self.flush(&key, t).await?;
        }
        Ok(())
    }

    /// Flushes the largest buffer that has no insert in flight; false if there is none.
    async fn flush_largest(&mut self) -> Result<bool, IngestError> {
        let largest = self
            .owned
            .iter()
            .flat_map(|(k, p)| {
                p.tables
                    .iter()
                    .enumerate()
                    .filter(|(_, tp)| tp.in_flight.is_none())
                    .map(move |(t, tp)| (tp.buffer.as_ref().map_or(0, |b| b.bytes), k, t))
            })
            .filter(|(bytes, _, _)| *bytes > 0)
            .max_by_key(|(bytes, _, _)| *bytes)
            .map(|(_, k, t)| (k.clone(), t));
        match largest {
            Some((key, t)) => {
                self.flush(&key, t).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Waits for the next insert in flight to end and takes its outcome; false if none was.
    async fn finish_an_insert(&mut self) -> Result<bool, IngestError> {
        match self.inserts.join_next().await {
            Some(done) => self.on_inserted(done).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Waits until no block of (partition, table) is being inserted.
    async fn wait_for_insert(&mut self, key: &PartitionKey, t: usize) -> Result<(), IngestError> {
        while self.owned.get(key).is_some_and(|p| p.tables[t].in_flight.is_some()) {
            if !self.finish_an_insert().await? {
                break;
            }
        }
        Ok(())
    }

    /// Builds one buffer into a block and starts inserting it with its offset commit. The
    /// caller makes sure no other block of the same (partition, table) is in flight.
    async fn flush(&mut self, key: &PartitionKey, t: usize) -> Result<(), IngestError> {
        let Some(owned) = self.owned.get_mut(key) else { return Ok(()) };
        let Some(mut buffer) = owned.tables[t].buffer.take() else { return Ok(()) };
        let expected_version = owned.tables[t].position.version;
        let sink = self.tables[t].clone();
        let block = self.build_block(key, &sink, &mut buffer)?;
        let total = block.num_rows() + buffer.bad();
        let limit = self.pipeline.errors.max_error_rate;
        if total > 0 && buffer.bad() as f64 / total as f64 > limit {
            return Err(IngestError::ErrorRate {
                topic: key.0.to_string(),
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
        if let Some(owned) = self.owned.get_mut(key) {
            owned.tables[t].in_flight = Some(buffer.bytes);
        }
        let storage = self.storage.clone();
        let partition = key.clone();
        let (next, bytes) = (buffer.last + 1, buffer.bytes);
        self.inserts.spawn(async move {
            let began = Instant::now();
            let rows = block.num_rows();
            let outcome = storage.insert_committing(&sink.name, &block, &token, commit).await;
            Inserted { partition, table: t, next, rows, bytes, began, outcome }
        });
        Ok(())
    }

    /// The buffer's rows as a block; rows whose values do not fit their columns are set aside
    /// like any bad message.
    fn build_block(
        &self,
        key: &PartitionKey,
        sink: &TableSink,
        buffer: &mut Buffer,
    ) -> Result<RecordBatch, IngestError> {
        loop {
            let bad = match sink.decoder.build(&sink.schema, &buffer.rows) {
                Ok(block) => return Ok(block),
                Err(bad) => bad,
            };
            for (row, e) in bad.into_iter().rev() {
                metrics::counter!(crate::metrics::DECODE_ERRORS, "kind" => e.kind()).increment(1);
                buffer.rows.remove(row);
                let origin = buffer.origins.remove(row);
                if let ErrorMode::Fail = &self.pipeline.errors.mode {
                    return Err(IngestError::BadMessage {
                        topic: key.0.to_string(),
                        partition: key.1,
                        offset: origin.position,
                        reason: e.to_string(),
                    });
                }
                buffer.set_aside(&self.pipeline.errors.mode, e, origin);
            }
        }
    }

    async fn on_inserted(&mut self, done: Result<Inserted, tokio::task::JoinError>) -> Result<(), IngestError> {
        let done = done.map_err(|e| IngestError::Task(e.to_string()))?;
        self.in_flight_bytes -= done.bytes;
        let table = &self.tables[done.table].name;
        let Some(owned) = self.owned.get_mut(&done.partition) else {
            debug!(partition = ?done.partition, "an insert ended for a partition no longer owned");
            return Ok(());
        };
        owned.tables[done.table].in_flight = None;
        match done.outcome? {
            Committed::Done { version } => {
                metrics::histogram!(crate::metrics::INSERT_DURATION).record(done.began.elapsed().as_secs_f64());
                metrics::counter!(crate::metrics::BLOCKS, "table" => table.clone()).increment(1);
                metrics::counter!(crate::metrics::ROWS, "table" => table.clone()).increment(done.rows as u64);
                self.status.committed(done.rows as u64);
                // Freshness: alert when it falls behind while the lag is not zero.
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                metrics::gauge!(crate::metrics::LAST_COMMIT_TIMESTAMP, "table" => table.clone()).set(now.as_secs_f64());
                debug!(partition = ?done.partition, table, rows = done.rows, next = done.next, version, "block committed");
                owned.tables[done.table].position = Position { next: done.next, version };
                // The source's own offset follows the slowest table, for lag tools.
                let next = owned.tables.iter().map(|t| t.position.next).min().unwrap_or(BEGINNING);
                self.source.committed(&done.partition, next);
            }
            Committed::Refused(why) => {
                warn!(partition = ?done.partition, why, "the partition has another owner now: giving it up");
                self.drop_partition(&done.partition).await?;
            }
            Committed::Stopped(why) => {
                self.stop_partition(&done.partition, &why);
                self.drop_partition(&done.partition).await?;
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
        let ErrorMode::DeadLetter { topic } = &self.pipeline.errors.mode else { return Ok(()) };
        // In source order: bad values found when the block is built come after the others.
        dead.sort_by_key(|d| d.position);
        for d in dead.drain(..) {
            self.source.dead_letter(topic, table, key, &d).await?;
            metrics::counter!(crate::metrics::DEAD_LETTERED).increment(1);
        }
        Ok(())
    }

    /// Stops consuming a partition until the ingestor is restarted: its position cannot be
    /// trusted, and anything consumed now could be a duplicate or a gap.
    fn stop_partition(&mut self, key: &PartitionKey, why: &str) {
        error!(topic = &*key.0, partition = key.1, why, "the partition is stopped: its offset node must be repaired");
        metrics::counter!(crate::metrics::PARTITIONS_STOPPED).increment(1);
        self.stopped.insert(key.clone());
        metrics::gauge!(crate::metrics::STOPPED_PARTITIONS).set(self.stopped.len() as f64);
    }

    /// Forgets a partition and its buffers, releases its lock, and reads the others on.
    async fn drop_partition(&mut self, key: &PartitionKey) -> Result<(), IngestError> {
        if let Some(p) = self.forget(key) {
            if let Err(e) = self.ownership.release(p.lock).await {
                debug!(error = %e, "cannot release a lost partition lock");
            }
        }
        self.assign().await
    }

    /// Removes a partition and the memory of its buffers (blocks in flight give theirs back
    /// when they end).
    fn forget(&mut self, key: &PartitionKey) -> Option<OwnedPartition> {
        let p = self.owned.remove(key)?;
        self.in_flight_bytes -= p.tables.iter().filter_map(|tp| tp.buffer.as_ref()).map(|b| b.bytes).sum::<usize>();
        Some(p)
    }

    /// Takes the partitions that are free, up to this instance's fair share, and gives up
    /// everything when the coordinator session is lost (its locks are gone with it).
    async fn refresh_ownership(&mut self, refresh_metadata: bool) -> Result<(), IngestError> {
        if !self.ownership.alive() {
            warn!("the coordinator session is lost: giving up every partition and starting a new session");
            let keys: Vec<PartitionKey> = self.owned.keys().cloned().collect();
            for key in keys {
                self.forget(&key);
            }
            self.assign().await?;
            let options = &self.options;
            let fresh = Ownership::connect(
                &options.coordinator,
                options.session_timeout,
                &options.coordinator_access,
                &self.pipeline.name,
                &options.instance,
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
            self.partitions = self.source.partitions().await?;
        }
        let instances = self.ownership.instances().await?.max(1);
        let share = self.partitions.len().div_ceil(instances);
        let mut changed = false;
        for key in self.partitions.clone() {
            if self.owned.len() >= share {
                break;
            }
            if self.owned.contains_key(&key) || self.stopped.contains(&key) {
                continue;
            }
            let Some(lock) = self.ownership.try_own(&key.0, key.1).await? else { continue };
            let mut tables = Vec::new();
            let mut damaged = None;
            for sink in &self.tables {
                match self.ownership.position(&sink.name, &key.0, key.1).await {
                    Ok(position) => tables.push(TablePosition { position, buffer: None, in_flight: None }),
                    Err(PositionError::Keeper(e)) => return Err(e.into()),
                    Err(e @ PositionError::Corrupt { .. }) => {
                        damaged = Some(e.to_string());
                        break;
                    }
                }
            }
            if let Some(why) = damaged {
                self.stop_partition(&key, &why);
                if let Err(e) = self.ownership.release(lock).await {
                    debug!(error = %e, "cannot release the lock of a stopped partition");
                }
                continue;
            }
            let fetch_next = if tables.iter().any(|t| t.position.next == BEGINNING) {
                BEGINNING
            } else {
                tables.iter().map(|t| t.position.next).min().unwrap_or(BEGINNING)
            };
            info!(topic = &*key.0, partition = key.1, from = fetch_next, "owning partition");
            self.owned.insert(key, OwnedPartition { lock, tables, fetch_next });
            changed = true;
        }
        if changed {
            self.assign().await?;
        }
        metrics::gauge!(crate::metrics::OWNED_PARTITIONS).set(self.owned.len() as f64);
        // Set here too, so that "none stopped" is a 0 on a dashboard rather than no data.
        metrics::gauge!(crate::metrics::STOPPED_PARTITIONS).set(self.stopped.len() as f64);
        Ok(())
    }

    /// Reads the owned partitions, each from the position after the last message received.
    async fn assign(&mut self) -> Result<(), IngestError> {
        let from: Vec<(PartitionKey, i64)> = self.owned.iter().map(|(k, p)| (k.clone(), p.fetch_next)).collect();
        self.source.assign(&from).await
    }

    /// Publishes each owned partition's lag, and the pipeline's status with it.
    async fn report_lag(&mut self) {
        let committed: BTreeMap<PartitionKey, i64> = self
            .owned
            .iter()
            .map(|(k, p)| (k.clone(), p.tables.iter().map(|t| t.position.next.max(0)).min().unwrap_or(0)))
            .collect();
        let mut lags = Vec::new();
        for ((topic, partition), end) in self.source.ends(committed.keys().cloned().collect()).await {
            let next = committed.get(&(topic.clone(), partition)).copied().unwrap_or(0);
            let lag = (end - next).max(0);
            metrics::gauge!(crate::metrics::CONSUMER_LAG, "topic" => topic.to_string(), "partition" => partition.to_string())
                .set(lag as f64);
            lags.push((topic.to_string(), partition, lag));
        }
        let status = self.status.take(&self.pipeline.name, lags, self.owned.len(), self.stopped.len());
        self.status.report(&status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_checked_five_times_per_shortest_limit() {
        let limits = |max_ms, idle_ms| BatchLimits { max_ms, idle_ms, ..BatchLimits::default() };
        assert_eq!(flush_check_period(&limits(1000, None)), Duration::from_millis(50));
        assert_eq!(flush_check_period(&limits(1000, Some(100))), Duration::from_millis(20));
        assert_eq!(flush_check_period(&limits(60, Some(500))), Duration::from_millis(12));
        assert_eq!(
            flush_check_period(&limits(1000, Some(10))),
            Duration::from_millis(5),
            "at most 200 checks a second"
        );
    }
}
