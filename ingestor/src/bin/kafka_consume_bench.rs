//! `kafka-consume-bench`: the raw rdkafka consume rate, the baseline of the ingestion
//! benchmark (`bench/ingest.py`). It reads the first `--count` messages of a topic's
//! partitions with a plain `BaseConsumer` poll loop, assigned from the beginning as the
//! ingestor's source is (same group settings, no group join), touches each payload and
//! decodes nothing. With `--through-source` it reads them through the ingestor's own Kafka
//! source instead, which shows what the source costs before any decoding. Prints one JSON
//! line: messages, bytes, seconds.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    brokers: String,
    #[arg(long)]
    topic: String,
    #[arg(long)]
    partitions: i32,
    /// Stop after this many messages.
    #[arg(long)]
    count: u64,
    /// Read through the ingestor's own Kafka source (its poll thread and batches) instead.
    #[arg(long)]
    through_source: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.through_source {
        return through_source(&args);
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", format!("consume-bench-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .create()
        .context("creating the consumer")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..args.partitions {
        tpl.add_partition_offset(&args.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let began = Instant::now();
    let deadline = began + Duration::from_secs(600);
    let (mut messages, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    while messages < args.count {
        anyhow::ensure!(Instant::now() < deadline, "only {messages} of {} messages in 600 s", args.count);
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let payload = m.payload().unwrap_or_default();
                messages += 1;
                bytes += payload.len() as u64;
                checksum = checksum.wrapping_add(payload.first().copied().unwrap_or(0) as u64);
            }
            Some(Err(e)) => eprintln!("consumer error: {e}"),
            None => {}
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(r#"{{"messages": {messages}, "bytes": {bytes}, "seconds": {seconds:.4}, "checksum": {checksum}}}"#);
    Ok(())
}

fn through_source(args: &Args) -> anyhow::Result<()> {
    use mergestream_ingestor::source::{kafka::Kafka, Source};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let config = mergestream_ingestor::pipeline::KafkaSource {
            brokers: args.brokers.clone(),
            topics: vec![args.topic.clone()],
            group_id: format!("consume-bench-{}", std::process::id()),
            properties: Default::default(),
        };
        let mut source = Kafka::new(&config, 256 << 20, Default::default())?;
        let from: Vec<_> = (0..args.partitions).map(|p| ((args.topic.as_str().into(), p), -2)).collect();
        source.assign(&from).await?;
        let began = Instant::now();
        let (mut messages, mut bytes) = (0u64, 0u64);
        while messages < args.count {
            let batch = source.next_batch().await?;
            for m in batch.iter() {
                messages += 1;
                bytes += m.payload.len() as u64;
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        println!(r#"{{"messages": {messages}, "bytes": {bytes}, "seconds": {seconds:.4}}}"#);
        Ok(())
    })
}
