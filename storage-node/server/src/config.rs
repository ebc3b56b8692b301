//! `storage-node serve --config FILE`: every serve flag can also be set in a TOML file.
//! A flag given on the command line wins over the file, the file over the default. An unknown
//! key or a value of the wrong type is an error naming file:line:column, as the pipeline
//! YAML's are; `storage-node config-example` prints a file with every key and its default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use coordinator_client::{KeeperAccess, TlsSettings};

use crate::flight::auth::UserConfig;
use mergestream_proto::tls::ServerTlsFiles;
use serde::Deserialize;

pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:9100";
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_MERGE_THREADS: usize = 2;
/// ClickHouse's `max_concurrent_queries` default.
pub const DEFAULT_MAX_CONCURRENT_QUERIES: usize = 1000;

pub use mergestream_cli::ConfigError;

/// The serve settings as a file holds them: all optional, unknown keys refused.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    pub path: Option<PathBuf>,
    pub grpc_addr: Option<SocketAddr>,
    pub flight_addr: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub max_concurrent_queries: Option<usize>,
    pub coordinator: Option<String>,
    pub session_timeout_ms: Option<u64>,
    pub coordinator_identity: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    pub merge_threads: Option<usize>,
    pub replica: Option<String>,
    pub interserver_addr: Option<String>,
    #[serde(default)]
    pub macros: BTreeMap<String, String>,
    #[serde(default)]
    pub coordinator_tls: TlsSettings,
    /// The users of the Flight SQL service (open to anyone when there are none).
    #[serde(default)]
    pub users: Vec<UserConfig>,
}

impl ServeFile {
    pub fn read(path: &Path) -> Result<ServeFile, ConfigError> {
        mergestream_cli::read_toml(path)
    }

    /// `origin` names the text in errors (the file's path).
    #[cfg(test)]
    pub fn parse(text: &str, origin: &str) -> Result<ServeFile, ConfigError> {
        mergestream_cli::parse_toml(text, origin)
    }
}

/// The serve settings after the flags, the file and the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub path: PathBuf,
    pub grpc_addr: SocketAddr,
    /// Where Arrow Flight SQL is served (off when absent).
    pub flight_addr: Option<SocketAddr>,
    /// TLS on the Ingest and Flight SQL ports (plain text when absent).
    pub tls: Option<ServerTlsFiles>,
    /// Flight SQL statements running at once, past which one is refused (RESOURCE_EXHAUSTED).
    pub max_concurrent_queries: usize,
    pub coordinator: Option<String>,
    pub session_timeout_ms: u64,
    /// TLS and the identity to reach the coordinator with.
    pub coordinator_access: KeeperAccess,
    pub metrics_addr: Option<SocketAddr>,
    pub merge_threads: usize,
    pub replica: Option<String>,
    pub interserver_addr: Option<String>,
    pub macros: BTreeMap<String, String>,
    /// Flight SQL's users (the file only: passwords stay out of command lines).
    pub users: Vec<UserConfig>,
}

/// What the command line gave (`None`: not given).
#[derive(Debug, Default, Clone)]
pub struct ServeFlags {
    pub path: Option<PathBuf>,
    pub grpc_addr: Option<SocketAddr>,
    pub flight_addr: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub max_concurrent_queries: Option<usize>,
    pub coordinator: Option<String>,
    pub session_timeout_ms: Option<u64>,
    pub coordinator_tls: TlsSettings,
    pub coordinator_identity: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    pub merge_threads: Option<usize>,
    pub replica: Option<String>,
    pub interserver_addr: Option<String>,
    pub macros: Vec<(String, String)>,
}

impl ServeConfig {
    pub fn resolve(flags: ServeFlags, file: ServeFile) -> Result<ServeConfig, ConfigError> {
        let path = flags.path.or(file.path).ok_or_else(|| {
            ConfigError::Invalid("no data directory: give --path, or `path` in the config file".into())
        })?;
        let default_grpc: SocketAddr = DEFAULT_GRPC_ADDR.parse().map_err(|e| ConfigError::Invalid(format!("{e}")))?;
        let mut macros = file.macros;
        macros.extend(flags.macros);
        let tls = match (flags.tls_cert.or(file.tls_cert), flags.tls_key.or(file.tls_key)) {
            (Some(cert), Some(key)) => Some(ServerTlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Invalid("tls_cert (--tls-cert) needs tls_key (--tls-key)".into()))
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid("tls_key (--tls-key) needs tls_cert (--tls-cert)".into()))
            }
        };
        let config = ServeConfig {
            path,
            grpc_addr: flags.grpc_addr.or(file.grpc_addr).unwrap_or(default_grpc),
            flight_addr: flags.flight_addr.or(file.flight_addr),
            tls,
            max_concurrent_queries: flags
                .max_concurrent_queries
                .or(file.max_concurrent_queries)
                .unwrap_or(DEFAULT_MAX_CONCURRENT_QUERIES),
            coordinator: flags.coordinator.or(file.coordinator),
            session_timeout_ms: flags
                .session_timeout_ms
                .or(file.session_timeout_ms)
                .unwrap_or(DEFAULT_SESSION_TIMEOUT_MS),
            coordinator_access: KeeperAccess::resolve(
                flags.coordinator_tls.or(file.coordinator_tls),
                flags.coordinator_identity.or(file.coordinator_identity),
            )
            .map_err(ConfigError::Invalid)?,
            metrics_addr: flags.metrics_addr.or(file.metrics_addr),
            merge_threads: flags.merge_threads.or(file.merge_threads).unwrap_or(DEFAULT_MERGE_THREADS),
            replica: flags.replica.or(file.replica),
            interserver_addr: flags.interserver_addr.or(file.interserver_addr),
            macros,
            users: file.users,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        UserConfig::validate(&self.users).map_err(ConfigError::Invalid)?;
        if self.max_concurrent_queries == 0 {
            return Err(ConfigError::Invalid("max_concurrent_queries must be above 0".into()));
        }
        if self.session_timeout_ms == 0 {
            return Err(ConfigError::Invalid("session_timeout_ms must be above 0".into()));
        }
        if let Some(key) = self.macros.keys().find(|k| k.is_empty() || k.contains(['{', '}'])) {
            return Err(ConfigError::Invalid(format!("macro name {key:?} must be non-empty and without braces")));
        }
        if let Some(addr) = &self.interserver_addr {
            if addr.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
                return Err(ConfigError::Invalid(format!("interserver_addr must be host:port, got {addr:?}")));
            }
        }
        if self.coordinator.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(ConfigError::Invalid("coordinator must name at least one host:port".into()));
        }
        Ok(())
    }
}

/// `storage-node config-example`: every key with its default, commented out.
pub fn example() -> String {
    format!(
        "# storage-node serve --config FILE: the serve flags in TOML. Flags on the command line win.\n\
         \n\
         # The data directory (created if missing). Required here or as --path.\n\
         # path = \"/var/lib/mergestream\"\n\
         # Where the gRPC insert and query service listens.\n\
         # grpc_addr = \"{DEFAULT_GRPC_ADDR}\"\n\
         # Where Arrow Flight SQL (queries, statements, prepared statements) is served; off when absent.\n\
         # flight_addr = \"127.0.0.1:9110\"\n\
         # TLS on the insert service (grpc_addr) and Flight SQL: the certificate chain and its\n\
         # private key, PEM. Plain text when absent; clients then need the CA (--storage-tls-ca).\n\
         # tls_cert = \"/etc/mergestream/node.pem\"\n\
         # tls_key = \"/etc/mergestream/node.key\"\n\
         # Flight SQL statements running at once; one more is refused (RESOURCE_EXHAUSTED).\n\
         # max_concurrent_queries = {DEFAULT_MAX_CONCURRENT_QUERIES}\n\
         # The coordinator (or ZooKeeper) hosts, host:port[,host:port...]: replicated tables and\n\
         # inserts that commit a source offset need it.\n\
         # coordinator = \"127.0.0.1:2181\"\n\
         # The coordinator session timeout in milliseconds.\n\
         # session_timeout_ms = {DEFAULT_SESSION_TIMEOUT_MS}\n\
         {identity}\
         # Where Prometheus metrics are served (off when absent).\n\
         # metrics_addr = \"127.0.0.1:9363\"\n\
         # Threads running background merges.\n\
         # merge_threads = {DEFAULT_MERGE_THREADS}\n\
         # This node's name as a replica of its replicated tables (the {{replica}} macro).\n\
         # replica = \"r1\"\n\
         # Where other replicas fetch parts from this one, host:port.\n\
         # interserver_addr = \"127.0.0.1:9009\"\n\
         \n\
         # Macros of replicated tables' paths ({{shard}}, ...); --macro KEY=VALUE adds or overrides.\n\
         [macros]\n\
         # shard = \"01\"\n\
         \n\
         {tls}\
         \n\
         # The users of Flight SQL (flight_addr), one [[users]] table each. With none, anyone may\n\
         # connect and write. password_sha256_hex: `echo -n PASSWORD | sha256sum`. readonly: every\n\
         # statement that writes is refused (PERMISSION_DENIED).\n\
         # [[users]]\n\
         # name = \"analyst\"\n\
         # password_sha256_hex = \"<64 hex digits>\"\n\
         # readonly = false\n",
        identity = coordinator_client::access::EXAMPLE_IDENTITY,
        tls = coordinator_client::access::EXAMPLE_TLS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_fills_in_what_the_flags_leave_out() {
        let file = ServeFile::parse(
            "path = \"/data\"\ncoordinator = \"zk:2181\"\nreplica = \"r1\"\n[macros]\nshard = \"01\"\nlayer = \"a\"\n",
            "serve.toml",
        )
        .expect("parses");
        let flags = ServeFlags {
            replica: Some("r2".into()),
            macros: vec![("shard".into(), "02".into())],
            ..ServeFlags::default()
        };
        let config = ServeConfig::resolve(flags, file).expect("valid");
        assert_eq!(config.path, PathBuf::from("/data"));
        assert_eq!(config.coordinator.as_deref(), Some("zk:2181"));
        assert_eq!(config.replica.as_deref(), Some("r2"), "a flag wins over the file");
        assert_eq!(config.macros["shard"], "02");
        assert_eq!(config.macros["layer"], "a");
        assert_eq!(config.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
        assert_eq!((config.session_timeout_ms, config.merge_threads), (10_000, 2));
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line_and_column() {
        let error = ServeFile::parse("path = \"/data\"\n  replicas = \"r1\"\n", "serve.toml").expect_err("unknown");
        let text = error.to_string();
        assert!(text.starts_with("serve.toml:2:3: unknown field `replicas`"), "{text}");
        let error = ServeFile::parse("merge_threads = \"two\"\n", "serve.toml").expect_err("a string");
        assert!(error.to_string().starts_with("serve.toml:1:17: invalid type"), "{error}");
    }

    #[test]
    fn without_a_path_or_with_a_bad_value_it_is_refused() {
        let error = ServeConfig::resolve(ServeFlags::default(), ServeFile::default()).expect_err("no path");
        assert!(error.to_string().contains("--path"), "{error}");
        let flags =
            ServeFlags { path: Some("/d".into()), interserver_addr: Some("nowhere".into()), ..ServeFlags::default() };
        let error = ServeConfig::resolve(flags, ServeFile::default()).expect_err("bad address");
        assert!(error.to_string().contains("host:port"), "{error}");
    }

    #[test]
    fn a_tls_certificate_needs_its_key() {
        let file = ServeFile::parse("path = \"/d\"\ntls_cert = \"c.pem\"\n", "serve.toml").expect("parses");
        let error = ServeConfig::resolve(ServeFlags::default(), file).expect_err("no key");
        assert!(error.to_string().contains("needs tls_key"), "{error}");
        let file = ServeFile::parse("path = \"/d\"\ntls_cert = \"c.pem\"\n", "serve.toml").expect("parses");
        let flags = ServeFlags { tls_key: Some("k.pem".into()), ..ServeFlags::default() };
        let tls = ServeConfig::resolve(flags, file).expect("valid").tls.expect("tls");
        assert_eq!((tls.cert, tls.key), (PathBuf::from("c.pem"), PathBuf::from("k.pem")));
    }

    #[test]
    fn the_example_is_a_valid_file() {
        assert_eq!(ServeFile::parse(&example(), "example").expect("parses"), ServeFile::default());
    }
}
