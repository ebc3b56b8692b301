//! Pipeline YAML: what to consume, how to decode it, and which tables it goes to.
//!
//! Loading validates the whole file and reports every problem at once, each with its
//! file:line:column and what was expected (`ingestor check`). Unknown keys are problems too:
//! a misspelt optional key must not silently fall back to its default.

mod check;
pub mod variables;
pub mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mergestream_engine::TableDef;

use crate::decode::avro::AvroSchema;
pub use crate::decode::registry::RegistryConfig;

pub use yaml::Location;

#[derive(Debug, Clone)]
pub struct Pipeline {
    pub name: String,
    pub source: Source,
    pub format: Format,
    pub tables: Vec<TableTarget>,
    pub batch: BatchLimits,
    pub errors: ErrorPolicy,
    /// The most bytes of decoded messages held in memory, across partitions and tables.
    pub max_in_flight_bytes: u64,
    pub insert: InsertPolicy,
}

/// How blocks are inserted: the `insert:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertPolicy {
    /// `quorum`: ClickHouse's insert_quorum for replicated tables; `None` is no quorum.
    pub quorum: Option<QuorumSetting>,
    /// `quorum_timeout_ms`: how long one wait for the quorum lasts before it is asked again.
    pub quorum_timeout_ms: u64,
}

impl Default for InsertPolicy {
    fn default() -> Self {
        // ClickHouse's insert_quorum_timeout default.
        InsertPolicy { quorum: None, quorum_timeout_ms: 600_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuorumSetting {
    Replicas(u64),
    /// `auto`: a majority of the table's replicas.
    Majority,
}

#[derive(Debug, Clone)]
pub enum Source {
    Kafka(KafkaSource),
    Nats(NatsSource),
}

#[derive(Debug, Clone)]
pub struct KafkaSource {
    /// `bootstrap.servers`.
    pub brokers: String,
    pub topics: Vec<String>,
    /// The consumer group the ingestor commits offsets to (for lag tools); the position it
    /// resumes from is always the coordinator's.
    pub group_id: String,
    /// Passed to librdkafka as they are (security.protocol, sasl.*, fetch sizes, …).
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct NatsSource {
    pub url: String,
    pub stream: String,
    pub consumer: String,
    pub subjects: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum Format {
    /// One JSON object per message.
    Json,
    /// Avro binary with one writer schema (parsed when the pipeline loads).
    Avro { schema: Arc<AvroSchema> },
    /// Confluent framing: magic byte 0, a 4-byte big-endian schema id, then Avro binary.
    /// `schemas` are the pipeline file's own, by id; the registry is asked for the others.
    AvroConfluent { registry: Option<RegistryConfig>, schemas: BTreeMap<u32, Arc<AvroSchema>> },
}

#[derive(Debug, Clone)]
pub struct TableTarget {
    pub name: String,
    pub ddl: String,
    pub def: TableDef,
    pub columns: Vec<ColumnMapping>,
}

/// Where one column's value comes from.
#[derive(Debug, Clone)]
pub struct ColumnMapping {
    pub column: String,
    pub source: ValueSource,
    /// Used when the field is missing or null (JSON literal).
    pub default: Option<serde_json::Value>,
    pub convert: Option<Conversion>,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A field of the message, by path (`order.customer.id`).
    Field(Vec<String>),
    Key,
    Topic,
    Partition,
    Offset,
    /// The message timestamp in milliseconds since the epoch.
    Timestamp,
    Header(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Any JSON value as text (objects and arrays as their JSON).
    ToString,
    /// Text holding a number, as the number.
    ParseNumber,
    /// A number of milliseconds since the epoch, as a DateTime.
    FromUnixMillis,
}

impl Conversion {
    pub const NAMES: &'static [&'static str] = &["to_string", "parse_number", "from_unix_millis"];

    fn parse(name: &str) -> Option<Conversion> {
        match name {
            "to_string" => Some(Conversion::ToString),
            "parse_number" => Some(Conversion::ParseNumber),
            "from_unix_millis" => Some(Conversion::FromUnixMillis),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_ms: u64,
    /// Flush every buffer once the source has given nothing for this long (the end of a
    /// backlog or of a burst), rather than waiting for `max_ms`. Off by default: on a quiet
    /// topic it makes a small part per burst.
    pub idle_ms: Option<u64>,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits { max_rows: 100_000, max_bytes: 16 << 20, max_ms: 1000, idle_ms: None }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ErrorMode {
    /// To a Kafka topic, with the reason in the headers.
    DeadLetter {
        topic: String,
    },
    Skip,
    Fail,
}

#[derive(Debug, Clone)]
pub struct ErrorPolicy {
    pub mode: ErrorMode,
    /// The share of bad messages in a block above which the pipeline stops.
    pub max_error_rate: f64,
}

impl Default for ErrorPolicy {
    fn default() -> Self {
        ErrorPolicy { mode: ErrorMode::Fail, max_error_rate: 1.0 }
    }
}

/// One thing wrong in a pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub at: Location,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}", render(path, problems))]
    Invalid { path: PathBuf, problems: Vec<Problem> },
}

fn render(path: &Path, problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(|p| format!("{}:{}: {}", path.display(), p.at, p.message)).collect();
    lines.join("\n")
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

impl Pipeline {
    /// Reads and validates a pipeline file. Relative schema paths are taken from the file's
    /// directory.
    pub fn load(path: &Path) -> Result<Pipeline, PipelineError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PipelineError::Read { path: path.to_path_buf(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Pipeline::parse(&text, base).map_err(|problems| PipelineError::Invalid { path: path.to_path_buf(), problems })
    }

    /// Validates pipeline text, its `${MERGESTREAM_…}` read from the process' environment;
    /// every problem found, in file order.
    pub fn parse(text: &str, base: &Path) -> Result<Pipeline, Vec<Problem>> {
        Pipeline::parse_with_env(text, base, &|name| std::env::var(name).ok())
    }

    /// [`parse`](Self::parse) with the variables of `env`.
    pub fn parse_with_env(
        text: &str,
        base: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Pipeline, Vec<Problem>> {
        check::check(text, base, env)
    }

    pub fn table(&self, name: &str) -> Option<&TableTarget> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The parts of a message some column is mapped from, beyond payload, key and position:
    /// only those are read.
    pub fn message_parts(&self) -> MessageParts {
        let maps =
            |wanted: fn(&ValueSource) -> bool| self.tables.iter().flat_map(|t| &t.columns).any(|m| wanted(&m.source));
        MessageParts {
            headers: maps(|s| matches!(s, ValueSource::Header(_))),
            timestamp: maps(|s| matches!(s, ValueSource::Timestamp)),
        }
    }
}

/// Which optional parts of a message the pipeline reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageParts {
    pub headers: bool,
    pub timestamp: bool,
}
