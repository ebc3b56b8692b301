//! `ingestor produce`: writes [`crate::sample`] order events to a Kafka topic (created when it
//! is missing) at a given rate, and reports what the table must hold once they are ingested.

use std::io::IsTerminal;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::sample::{ExpectedState, SampleOrders};
use crate::IngestError;

pub struct ProduceOptions {
    pub brokers: String,
    pub topic: String,
    /// The partitions of the topic when it has to be created.
    pub partitions: i32,
    pub count: u64,
    /// Messages per second; 0 sends as fast as the broker takes them.
    pub rate: u64,
    pub keys: u64,
    pub delete_percent: u8,
    pub seed: u64,
}

/// Counts what the broker acknowledged, and keeps the first failure.
#[derive(Default)]
struct Deliveries {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_failure: std::sync::Mutex<Option<String>>,
}

struct Counting(Arc<Deliveries>);

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.0.delivered.fetch_add(1, Ordering::Relaxed),
            Err((e, _)) => {
                if let Ok(mut first) = self.0.first_failure.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
                self.0.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// Sends `options.count` events and waits until the broker acknowledged every one. Progress
/// goes to stderr: rewritten in place on a terminal, a line a second otherwise.
pub fn produce(options: &ProduceOptions) -> Result<ExpectedState, IngestError> {
    let failed = |message: String| IngestError::Produce { topic: options.topic.clone(), message };
    create_topic(options)?;
    let deliveries = Arc::new(Deliveries::default());
    let producer: BaseProducer<Counting> = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create_with_context(Counting(deliveries.clone()))?;
    let mut orders = SampleOrders::new(options.seed, options.keys, options.delete_percent);
    let started = Instant::now();
    let mut progress = Progress::new(options.count);
    for sent in 0..options.count {
        if options.rate > 0 {
            let due = started + Duration::from_secs_f64(sent as f64 / options.rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                producer.poll(wait);
            }
        }
        let event = orders.next_event();
        let (key, payload) = (event.key(), event.to_json());
        let mut record = BaseRecord::to(&options.topic).key(&key).payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        producer.poll(Duration::ZERO);
        progress.show(deliveries.delivered.load(Ordering::Relaxed), false);
    }
    producer.flush(Duration::from_secs(60)).map_err(|e| failed(format!("not every message was acknowledged: {e}")))?;
    progress.show(deliveries.delivered.load(Ordering::Relaxed), true);
    let lost = deliveries.failed.load(Ordering::Relaxed);
    if lost > 0 {
        let first = deliveries.first_failure.lock().ok().and_then(|f| f.clone()).unwrap_or_default();
        return Err(failed(format!("{lost} messages were not delivered (the first: {first})")));
    }
    Ok(orders.expected())
}

fn create_topic(options: &ProduceOptions) -> Result<(), IngestError> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &options.brokers).create()?;
    let topic = NewTopic::new(&options.topic, options.partitions, TopicReplication::Fixed(1));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
        IngestError::Produce { topic: options.topic.clone(), message: format!("a runtime for the admin client: {e}") }
    })?;
    let admin_options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in runtime.block_on(admin.create_topics([&topic], &admin_options))? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(IngestError::Produce { topic: name, message: format!("creating the topic: {code}") })
            }
        }
    }
    Ok(())
}

struct Progress {
    total: u64,
    terminal: bool,
    started: Instant,
    last: Option<Instant>,
}

impl Progress {
    fn new(total: u64) -> Progress {
        Progress { total, terminal: std::io::stderr().is_terminal(), started: Instant::now(), last: None }
    }

    fn show(&mut self, delivered: u64, last: bool) {
        let now = Instant::now();
        if !last && self.last.is_some_and(|at| now - at < Duration::from_secs(1)) {
            return;
        }
        self.last = Some(now);
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = delivered as f64 / seconds.max(0.001);
        let line = format!("produced {delivered} of {} messages, {rate:.0}/s, {seconds:.1} s", self.total);
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the producer.
        let _ = if self.terminal {
            write!(err, "\r{line}\x1b[K{}", if last { "\n" } else { "" })
        } else {
            writeln!(err, "{line}")
        };
    }
}
