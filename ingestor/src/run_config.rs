//! `ingestor run --config FILE`: every run flag can also be set in a TOML file. A flag given
//! on the command line wins over the file, the file over the default; an unknown key is an
//! error naming file:line:column. `ingestor config-example` prints a file with every key.

use std::net::SocketAddr;
use std::path::PathBuf;

use coordinator_client::{KeeperAccess, TlsSettings};
use mergestream_cli::ConfigError;
use mergestream_proto::tls::ClientTls;
use serde::Deserialize;

pub const DEFAULT_STORAGE_NODE: &str = "127.0.0.1:9100";
pub const DEFAULT_COORDINATOR: &str = "127.0.0.1:2181";
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 6000;

/// The settings as a file holds them: all optional, unknown keys refused.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub pipeline: Option<PathBuf>,
    /// Each replica's gRPC address, the first tried first.
    pub storage_nodes: Option<Vec<String>>,
    pub coordinator: Option<String>,
    pub instance: Option<String>,
    pub session_timeout_ms: Option<u64>,
    pub coordinator_identity: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    #[serde(default)]
    pub coordinator_tls: TlsSettings,
    #[serde(default)]
    pub storage_tls: StorageTls,
}

/// TLS to the storage nodes (started with --tls-cert): the flags `--storage-tls`,
/// `--storage-tls-ca`, `--storage-tls-domain`, or a `[storage_tls]` table (`enabled`, `ca`,
/// `domain`) in the config file.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageTls {
    /// Reach the storage nodes over TLS, trusting the system's roots (implied by
    /// --storage-tls-ca).
    #[arg(id = "storage_tls", long = "storage-tls")]
    #[serde(default)]
    pub enabled: bool,
    /// The CA (PEM) that signed the storage nodes' certificates: TLS, trusting it.
    #[arg(id = "storage_tls_ca", long = "storage-tls-ca")]
    pub ca: Option<PathBuf>,
    /// The name the nodes' certificates are checked for, when it is not the address's host.
    #[arg(id = "storage_tls_domain", long = "storage-tls-domain")]
    pub domain: Option<String>,
}

impl StorageTls {
    /// Each setting from `self` (the flags) where given, else from `file`.
    fn or(self, file: StorageTls) -> ClientTls {
        ClientTls {
            enabled: self.enabled || file.enabled,
            ca: self.ca.or(file.ca),
            domain: self.domain.or(file.domain),
        }
    }
}

/// What the command line gave (`None`, or empty: not given).
#[derive(Debug, Default)]
pub struct RunFlags {
    pub pipeline: Option<PathBuf>,
    pub storage_nodes: Vec<String>,
    pub coordinator: Option<String>,
    pub instance: Option<String>,
    pub session_timeout_ms: Option<u64>,
    pub coordinator_tls: TlsSettings,
    pub coordinator_identity: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    pub storage_tls: StorageTls,
}

/// The settings after the flags, the file and the defaults.
#[derive(Debug, PartialEq)]
pub struct RunConfig {
    pub pipeline: PathBuf,
    pub storage_nodes: Vec<String>,
    /// How the storage nodes are reached: plain text, or TLS.
    pub storage_tls: ClientTls,
    pub coordinator: String,
    pub instance: Option<String>,
    pub session_timeout_ms: u64,
    pub coordinator_access: KeeperAccess,
    pub metrics_addr: Option<SocketAddr>,
}

impl RunConfig {
    pub fn resolve(flags: RunFlags, file: RunFile) -> Result<RunConfig, ConfigError> {
        let pipeline = flags.pipeline.or(file.pipeline).ok_or_else(|| {
            ConfigError::Invalid("no pipeline: give --pipeline, or `pipeline` in the config file".into())
        })?;
        let storage_nodes = match (flags.storage_nodes.is_empty(), file.storage_nodes) {
            (false, _) => flags.storage_nodes,
            (true, Some(nodes)) => nodes,
            (true, None) => vec![DEFAULT_STORAGE_NODE.to_string()],
        };
        if storage_nodes.is_empty() || storage_nodes.iter().any(|n| n.trim().is_empty()) {
            return Err(ConfigError::Invalid("storage_nodes must name at least one host:port, none empty".into()));
        }
        let session_timeout_ms =
            flags.session_timeout_ms.or(file.session_timeout_ms).unwrap_or(DEFAULT_SESSION_TIMEOUT_MS);
        if session_timeout_ms == 0 {
            return Err(ConfigError::Invalid("session_timeout_ms must be above 0".into()));
        }
        Ok(RunConfig {
            pipeline,
            storage_nodes,
            storage_tls: flags.storage_tls.or(file.storage_tls),
            coordinator: flags.coordinator.or(file.coordinator).unwrap_or_else(|| DEFAULT_COORDINATOR.into()),
            instance: flags.instance.or(file.instance),
            session_timeout_ms,
            coordinator_access: KeeperAccess::resolve(
                flags.coordinator_tls.or(file.coordinator_tls),
                flags.coordinator_identity.or(file.coordinator_identity),
            )
            .map_err(ConfigError::Invalid)?,
            metrics_addr: flags.metrics_addr.or(file.metrics_addr),
        })
    }
}

/// `ingestor config-example`: every key with its default, commented out.
pub fn example() -> String {
    format!(
        "# ingestor run --config FILE: the run flags in TOML. Flags on the command line win.\n\
         \n\
         # The pipeline YAML to run. Required here or as --pipeline.\n\
         # pipeline = \"pipelines/orders.yaml\"\n\
         # Each replica's gRPC address; a block whose node is out of reach goes to the next.\n\
         # storage_nodes = [\"{DEFAULT_STORAGE_NODE}\"]\n\
         # The coordinator (or ZooKeeper) hosts, host:port[,host:port...].\n\
         # coordinator = \"{DEFAULT_COORDINATOR}\"\n\
         # This instance's name in the coordinator (default: host name and process id).\n\
         # instance = \"ingestor-1\"\n\
         # The coordinator session timeout: how long a dead ingestor keeps its partitions.\n\
         # session_timeout_ms = {DEFAULT_SESSION_TIMEOUT_MS}\n\
         {identity}\
         # Where Prometheus metrics are served (off when absent).\n\
         # metrics_addr = \"127.0.0.1:9365\"\n\
         \n\
         {tls}\
         \n\
         # TLS to the storage nodes (started with tls_cert): the CA that signed their\n\
         # certificates, or enabled = true for the system's roots; domain when the certificate\n\
         # names a host other than the address's.\n\
         [storage_tls]\n\
         # enabled = false\n\
         # ca = \"/etc/mergestream/storage-ca.pem\"\n\
         # domain = \"storage.example.com\"\n",
        identity = coordinator_client::access::EXAMPLE_IDENTITY,
        tls = coordinator_client::access::EXAMPLE_TLS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RunFile, ConfigError> {
        mergestream_cli::parse_toml(text, "run.toml")
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults() {
        let file =
            parse("pipeline = \"p.yaml\"\nstorage_nodes = [\"a:1\", \"b:2\"]\ninstance = \"i1\"\n").expect("parses");
        let flags = RunFlags { instance: Some("i2".into()), ..Default::default() };
        let config = RunConfig::resolve(flags, file).expect("valid");
        assert_eq!(config.pipeline, PathBuf::from("p.yaml"));
        assert_eq!(config.storage_nodes, ["a:1", "b:2"]);
        assert_eq!(config.instance.as_deref(), Some("i2"));
        assert_eq!((config.coordinator.as_str(), config.session_timeout_ms), (DEFAULT_COORDINATOR, 6000));
        let flags = RunFlags { storage_nodes: vec!["c:3".into()], ..Default::default() };
        let file = parse("pipeline = \"p.yaml\"\nstorage_nodes = [\"a:1\"]\n").expect("parses");
        assert_eq!(RunConfig::resolve(flags, file).expect("valid").storage_nodes, ["c:3"]);
    }

    #[test]
    fn unknown_keys_and_missing_or_bad_settings_are_refused() {
        let error = parse("pipeline = \"p.yaml\"\n\nstorage_node = \"a:1\"\n").expect_err("unknown");
        assert!(error.to_string().starts_with("run.toml:3:1: unknown field `storage_node`"), "{error}");
        let error = RunConfig::resolve(RunFlags::default(), RunFile::default()).expect_err("no pipeline");
        assert!(error.to_string().contains("--pipeline"), "{error}");
        let file = parse("pipeline = \"p.yaml\"\nstorage_nodes = []\n").expect("parses");
        assert!(RunConfig::resolve(RunFlags::default(), file).is_err(), "no storage node");
    }

    #[test]
    fn the_example_is_a_valid_file() {
        assert_eq!(parse(&example()).expect("parses"), RunFile::default());
    }
}
