//! The ingestor: pipelines from Kafka into mergestream tables, exactly once.
//!
//! - [`pipeline`]: the pipeline YAML, validated with file:line:column for every problem.
//! - [`decode`]: messages → rows → Arrow blocks, by the pipeline's column mapping.
//! - [`sink`]: the storage node's gRPC insert service, with the offset commit of each block.
//! - [`ownership`]: partition ownership and positions in the coordinator.
//! - [`kafka`]: the consume loop: owned partitions, per-table buffers, flush thresholds,
//!   dead letters, Kafka group offsets for lag tools.

pub mod decode;
pub mod error;
pub mod kafka;
pub mod ownership;
pub mod pipeline;
pub mod sink;

pub use error::IngestError;
