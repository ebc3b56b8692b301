//! Kafka through rdkafka: a manual assignment of the owned partitions (no group join to wait
//! for), group commits for lag tools, and a producer for dead letters.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::debug;

use super::{dead_letter_headers, DeadLetter, PartitionKey, Source, SourceMessage};
use crate::error::IngestError;
use crate::pipeline::KafkaSource;

pub struct Kafka {
    topics: Vec<String>,
    consumer: Arc<StreamConsumer>,
    /// Made on the first dead letter.
    producer: std::sync::OnceLock<FutureProducer>,
    config: ClientConfig,
}

fn client_config(source: &KafkaSource) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &source.brokers);
    for (k, v) in &source.properties {
        config.set(k, v);
    }
    config
}

impl Kafka {
    pub fn new(source: &KafkaSource) -> Result<Kafka, IngestError> {
        let config = client_config(source);
        let consumer: StreamConsumer = config
            .clone()
            .set("group.id", &source.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .create()?;
        Ok(Kafka {
            topics: source.topics.clone(),
            consumer: Arc::new(consumer),
            producer: std::sync::OnceLock::new(),
            config,
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

impl Source for Kafka {
    async fn partitions(&mut self) -> Result<Vec<PartitionKey>, IngestError> {
        let consumer = self.consumer.clone();
        let topics = self.topics.clone();
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
        .map_err(|e| IngestError::Task(e.to_string()))??;
        Ok(found)
    }

    async fn assign(&mut self, from: &[(PartitionKey, i64)]) -> Result<(), IngestError> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in from {
            let offset = if *next < 0 { Offset::Beginning } else { Offset::Offset(*next) };
            tpl.add_partition_offset(topic, *partition, offset)?;
        }
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    async fn next(&mut self) -> Result<SourceMessage, IngestError> {
        let m = self.consumer.recv().await?;
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        Ok(SourceMessage {
            partition: (m.topic().to_string(), m.partition()),
            position: m.offset(),
            topic: m.topic().to_string(),
            payload: m.payload().unwrap_or_default().to_vec(),
            key: m.key().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: m.timestamp().to_millis(),
        })
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
        let mut record = FutureRecord::to(destination).payload(&letter.payload).headers(headers);
        if let Some(k) = &letter.key {
            record = record.key(k);
        }
        self.producer()?.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| IngestError::Kafka(e))?;
        Ok(())
    }
}
