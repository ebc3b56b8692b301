//! NATS JetStream through async-nats: one stream is one partition, its stream sequence the
//! position.
//!
//! The pipeline's durable pull consumer is created afresh at each assignment, starting at
//! the coordinator's position, so a new owner never inherits what a dead one had fetched.
//! It acknowledges with `AckPolicy::All` once a block is in its table, so `nats consumer info`
//! shows the committed position as its ack floor, as a Kafka group offset does for Kafka.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, stream::Stream};
use futures::{FutureExt, StreamExt};
use tracing::{debug, info, warn};

use super::{dead_letter_headers, Batch, BatchBuilder, DeadLetter, Incoming, PartitionKey, Source};
use crate::error::IngestError;
use crate::pipeline::NatsSource;

/// Every message of the stream is in partition 0.
const PARTITION: i32 = 0;

/// The most messages in one batch.
const BATCH: usize = 1024;

/// How long the server waits for an ack before it sends a message again. Acks come only
/// once a block commits; a redelivered message is recognized by its sequence and dropped.
const ACK_WAIT: Duration = Duration::from_secs(3600);

pub struct Nats {
    config: NatsSource,
    /// The stream's name, shared by the partition key of every message.
    stream_name: Arc<str>,
    client: async_nats::Client,
    context: jetstream::Context,
    stream: Stream,
    messages: Option<pull::Stream>,
    /// The ack subject of each message received and not yet committed, by stream sequence.
    unacked: VecDeque<(i64, async_nats::Subject)>,
}

fn nats_error(what: &str, e: impl std::fmt::Display) -> IngestError {
    IngestError::Nats(format!("{what}: {e}"))
}

impl Nats {
    pub async fn connect(config: &NatsSource) -> Result<Nats, IngestError> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(10))
            .connect(config.url.as_str())
            .await
            .map_err(|e| nats_error(&format!("cannot connect to {}", config.url), e))?;
        let context = jetstream::new(client.clone());
        let stream = context
            .get_stream(&config.stream)
            .await
            .map_err(|e| nats_error(&format!("stream {}", config.stream), e))?;
        Ok(Nats {
            config: config.clone(),
            stream_name: config.stream.as_str().into(),
            client,
            context,
            stream,
            messages: None,
            unacked: VecDeque::new(),
        })
    }

    fn consumer_config(&self, next: i64) -> pull::Config {
        let deliver_policy =
            if next < 1 { DeliverPolicy::All } else { DeliverPolicy::ByStartSequence { start_sequence: next as u64 } };
        let (filter_subject, filter_subjects) = match self.config.subjects.as_slice() {
            [one] => (one.clone(), Vec::new()),
            many => (String::new(), many.to_vec()),
        };
        pull::Config {
            durable_name: Some(self.config.consumer.clone()),
            description: Some("mergestream ingestor; positions live in the coordinator".into()),
            deliver_policy,
            ack_policy: AckPolicy::All,
            ack_wait: ACK_WAIT,
            // Unacknowledged messages are bounded by the pipeline's in-flight memory instead.
            max_ack_pending: -1,
            filter_subject,
            filter_subjects,
            ..Default::default()
        }
    }

    async fn next_message(&mut self) -> Result<jetstream::Message, IngestError> {
        let Some(messages) = self.messages.as_mut() else { return std::future::pending().await };
        match messages.next().await {
            Some(Ok(m)) => Ok(m),
            Some(Err(e)) => {
                // Give a failing connection a moment before the runner polls again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err(nats_error("pulling messages", e))
            }
            None => {
                self.messages = None;
                Err(IngestError::Nats(format!("consumer {} was closed", self.config.consumer)))
            }
        }
    }

    /// Adds a message to the batch and remembers its ack subject (a message without
    /// JetStream metadata is skipped with a warning).
    fn take(&mut self, message: jetstream::Message, batch: &mut BatchBuilder) {
        let info = match message.info() {
            Ok(info) => info,
            Err(e) => {
                warn!(error = %e, "skipping a message without JetStream metadata");
                return;
            }
        };
        let position = info.stream_sequence as i64;
        let timestamp_ms = Some((info.published.unix_timestamp_nanos() / 1_000_000) as i64);
        let message = message.message;
        let headers: Vec<(String, Vec<u8>)> = message
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .flat_map(|(name, values)| {
                        values.iter().map(move |v| (name.to_string(), AsRef::<[u8]>::as_ref(v).to_vec()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        // NATS messages have no key; the publisher's deduplication id serves as one.
        let key = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.as_str().as_bytes());
        batch.push(Incoming {
            topic: &self.stream_name,
            partition: PARTITION,
            position,
            timestamp_ms,
            payload: &message.payload,
            key,
            subject: Some(message.subject.as_str()),
            headers,
        });
        if let Some(reply) = message.reply {
            self.unacked.push_back((position, reply));
        }
    }
}

impl Source for Nats {
    async fn partitions(&mut self) -> Result<Vec<PartitionKey>, IngestError> {
        Ok(vec![(self.stream_name.clone(), PARTITION)])
    }

    async fn assign(&mut self, from: &[(PartitionKey, i64)]) -> Result<(), IngestError> {
        self.messages = None;
        self.unacked.clear();
        let Some((_, next)) = from.first() else { return Ok(()) };
        let name = &self.config.consumer;
        // A consumer left by an earlier owner points at its own position: start anew.
        if let Err(e) = self.stream.delete_consumer(name).await {
            debug!(consumer = name, error = %e, "no consumer to delete");
        }
        let consumer = self
            .stream
            .create_consumer(self.consumer_config(*next))
            .await
            .map_err(|e| nats_error(&format!("cannot create consumer {name}"), e))?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(1000)
            .messages()
            .await
            .map_err(|e| nats_error(&format!("cannot pull from consumer {name}"), e))?;
        info!(stream = self.config.stream, consumer = name, from = next, "consuming");
        self.messages = Some(messages);
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<Batch, IngestError> {
        let first = self.next_message().await?;
        let mut batch = BatchBuilder::default();
        self.take(first, &mut batch);
        // Whatever else has arrived already goes in the same batch.
        while batch.len() < BATCH {
            match self.next_message().now_or_never() {
                Some(Ok(message)) => self.take(message, &mut batch),
                Some(Err(e)) => {
                    debug!(error = %e, "ending a batch at a pull error");
                    break;
                }
                None => break,
            }
        }
        Ok(batch.finish())
    }

    fn committed(&mut self, _partition: &PartitionKey, next: i64) {
        let mut last = None;
        while self.unacked.front().is_some_and(|(position, _)| *position < next) {
            last = self.unacked.pop_front();
        }
        // AckPolicy::All: acknowledging the last message acknowledges every one before it.
        if let Some((_, reply)) = last {
            let client = self.client.clone();
            tokio::spawn(async move {
                if let Err(e) = client.publish(reply, "+ACK".into()).await {
                    debug!(error = %e, "cannot acknowledge a committed message");
                }
            });
        }
    }

    async fn ends(&self, partitions: Vec<PartitionKey>) -> Vec<(PartitionKey, i64)> {
        match self.stream.get_info().await {
            Ok(info) => partitions.into_iter().map(|p| (p, info.state.last_sequence as i64 + 1)).collect(),
            Err(e) => {
                warn!(error = %e, "cannot read the stream's last sequence");
                Vec::new()
            }
        }
    }

    async fn dead_letter(
        &self,
        destination: &str,
        table: &str,
        from: &PartitionKey,
        letter: &DeadLetter,
    ) -> Result<(), IngestError> {
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in dead_letter_headers(letter, table, from) {
            headers.insert(name, value.as_str());
        }
        let what = || format!("dead letter to {destination} (is the subject in a stream?)");
        self.context
            .publish_with_headers(destination.to_string(), headers, letter.payload.clone())
            .await
            .map_err(|e| nats_error(&what(), e))?
            .await
            .map_err(|e| nats_error(&what(), e))?;
        Ok(())
    }
}
