use coordinator_client::KeeperError;

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::PipelineError),
    #[error("the coordinator: {0}")]
    Coordinator(#[from] KeeperError),
    #[error("the storage node at {addr}: {message}")]
    Storage { addr: String, message: String },
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("table {table}: {message}")]
    Table { table: String, message: String },
    #[error("{topic}/{partition} offset {offset}: {reason} (errors.mode is fail)")]
    BadMessage { topic: String, partition: i32, offset: i64, reason: String },
    #[error("{topic}/{partition}: {bad} of {total} messages in a block were bad, above errors.max_error_rate {limit}")]
    ErrorRate { topic: String, partition: i32, bad: usize, total: usize, limit: f64 },
    #[error("nats: {0}")]
    Nats(String),
    #[error("the schema registry {url}: {message}")]
    SchemaRegistry { url: String, message: String },
    /// The storage node cannot commit offsets, or refuses this writer for good: retrying the
    /// same request cannot help, the configuration must change.
    #[error("the storage node at {addr} cannot take this pipeline's inserts: {message}")]
    StorageConfiguration { addr: String, message: String },
    #[error("producing to {topic}: {message}")]
    Produce { topic: String, message: String },
    #[error("a background task failed: {0}")]
    Task(String),
}
