//! The ingestor: pipelines from Kafka or NATS JetStream into mergestream tables, exactly once.
//!
//! - [`pipeline`]: the pipeline YAML, validated with file:line:column for every problem.
//! - [`source`]: where messages come from (Kafka, JetStream), behind one trait.
//! - [`decode`]: payloads (JSON, Avro, Confluent-framed Avro) → rows → Arrow blocks, by the
//!   pipeline's column mapping.
//! - [`runner`]: the consume loop: owned partitions, per-table buffers, flush thresholds,
//!   inserts beside consumption, dead letters.
//! - [`sink`]: the storage node's gRPC insert service, with the offset commit of each block.
//! - [`ownership`]: partition ownership and positions in the coordinator.
//! - [`sample`], [`produce`]: sample order events for the quickstart, and `ingestor produce`
//!   writing them to Kafka.

pub mod decode;
pub mod error;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
pub mod produce;
pub mod runner;
pub mod sample;
pub mod sink;
pub mod source;
pub mod status;

pub use error::IngestError;
