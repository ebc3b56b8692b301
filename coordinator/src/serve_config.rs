//! `coordinator serve --config FILE`: every serve flag can also be set in a TOML file. A flag
//! given on the command line wins over the file, the file over the default; an unknown key is
//! an error naming file:line:column. `coordinator config-example` prints a file with every key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use mergestream_cli::ConfigError;
use mergestream_coordinator::server::tls::TlsFiles;
use serde::Deserialize;

pub const DEFAULT_TICK_MS: u32 = 2000;
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 10_000;
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// The settings as a file holds them: all optional, unknown keys refused.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    pub node_id: Option<u64>,
    pub client_addr: Option<SocketAddr>,
    pub raft_addr: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub tick_ms: Option<u32>,
    pub snapshot_every: Option<u64>,
    pub metrics_addr: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub handshake_timeout_ms: Option<u64>,
    pub secure_client_addr: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub super_digest: Option<String>,
    /// The other members: node id → Raft address.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
}

/// What the command line gave (`None`: not given).
#[derive(Debug, Default)]
pub struct ServeFlags {
    pub node_id: Option<u64>,
    pub client_addr: Option<SocketAddr>,
    pub raft_addr: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub tick_ms: Option<u32>,
    pub snapshot_every: Option<u64>,
    pub metrics_addr: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub handshake_timeout_ms: Option<u64>,
    pub secure_client_addr: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub super_digest: Option<String>,
    pub peers: Vec<(u64, String)>,
}

/// The settings after the flags, the file and the defaults.
#[derive(Debug, PartialEq)]
pub struct ServeConfig {
    pub node_id: u64,
    pub client_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub tick_ms: u32,
    pub snapshot_every: u64,
    pub metrics_addr: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub handshake_timeout_ms: u64,
    /// The secure client port and its certificate, key and client CA.
    pub secure: Option<(SocketAddr, TlsFiles)>,
    pub super_digest: Option<String>,
    pub peers: BTreeMap<u64, String>,
}

impl ServeConfig {
    pub fn resolve(flags: ServeFlags, file: ServeFile) -> Result<ServeConfig, ConfigError> {
        let missing = |flag: &str, key: &str| {
            ConfigError::Invalid(format!("no {key}: give --{flag}, or `{key}` in the config file"))
        };
        let mut peers = BTreeMap::new();
        for (id, addr) in file.peers {
            let id = id
                .parse::<u64>()
                .map_err(|_| ConfigError::Invalid(format!("peers: the key {id:?} is not a node id")))?;
            peers.insert(id, addr);
        }
        let mut given = std::collections::BTreeSet::new();
        for (id, addr) in flags.peers {
            if !given.insert(id) {
                return Err(ConfigError::Invalid(format!("peer {id} is given twice")));
            }
            peers.insert(id, addr);
        }
        let tls_cert = flags.tls_cert.or(file.tls_cert);
        let tls_key = flags.tls_key.or(file.tls_key);
        let tls_client_ca = flags.tls_client_ca.or(file.tls_client_ca);
        let secure = match (flags.secure_client_addr.or(file.secure_client_addr), tls_cert, tls_key) {
            (Some(addr), Some(cert), Some(key)) => Some((addr, TlsFiles { cert, key, client_ca: tls_client_ca })),
            (Some(_), _, _) => {
                return Err(ConfigError::Invalid(
                    "the secure client port needs a certificate and its key: give --tls-cert and --tls-key".into(),
                ))
            }
            (None, None, None) if tls_client_ca.is_none() => None,
            (None, ..) => {
                return Err(ConfigError::Invalid(
                    "TLS files are given but no port serves TLS: give --secure-client-addr".into(),
                ))
            }
        };
        let super_digest = flags.super_digest.or(file.super_digest);
        if let Some(digest) = &super_digest {
            mergestream_coordinator::acl::validate_super_digest(digest).map_err(ConfigError::Invalid)?;
        }
        Ok(ServeConfig {
            node_id: flags.node_id.or(file.node_id).ok_or_else(|| missing("node-id", "node_id"))?,
            client_addr: flags.client_addr.or(file.client_addr).ok_or_else(|| missing("client-addr", "client_addr"))?,
            raft_addr: flags.raft_addr.or(file.raft_addr).ok_or_else(|| missing("raft-addr", "raft_addr"))?,
            data_dir: flags.data_dir.or(file.data_dir).ok_or_else(|| missing("data-dir", "data_dir"))?,
            tick_ms: flags.tick_ms.or(file.tick_ms).unwrap_or(DEFAULT_TICK_MS),
            snapshot_every: flags.snapshot_every.or(file.snapshot_every).unwrap_or(DEFAULT_SNAPSHOT_EVERY),
            metrics_addr: flags.metrics_addr.or(file.metrics_addr),
            cluster_secret_file: flags.cluster_secret_file.or(file.cluster_secret_file),
            handshake_timeout_ms: flags
                .handshake_timeout_ms
                .or(file.handshake_timeout_ms)
                .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT_MS),
            secure,
            super_digest,
            peers,
        })
    }
}

/// `coordinator config-example`: every key with its default, commented out.
pub fn example() -> String {
    format!(
        "# coordinator serve --config FILE: the serve flags in TOML. Flags on the command line win.\n\
         \n\
         # This node's id in the cluster. Required here or as --node-id.\n\
         # node_id = 1\n\
         # Where ZooKeeper clients connect. Required.\n\
         # client_addr = \"127.0.0.1:2181\"\n\
         # Where the other nodes reach this one. Required.\n\
         # raft_addr = \"127.0.0.1:9234\"\n\
         # Where the Raft log and snapshots live. Required.\n\
         # data_dir = \"/var/lib/mergestream/coordinator\"\n\
         # ZooKeeper's tickTime in milliseconds: session timeouts are held between 2 and 20 ticks.\n\
         # tick_ms = {DEFAULT_TICK_MS}\n\
         # Take a snapshot (and compact the log) after this many entries.\n\
         # snapshot_every = {DEFAULT_SNAPSHOT_EVERY}\n\
         # Where Prometheus metrics are served (off when absent).\n\
         # metrics_addr = \"127.0.0.1:9364\"\n\
         # A file holding the secret every member shares (at least 16 bytes); needed with peers.\n\
         # The variable MERGESTREAM_CLUSTER_SECRET_FILE sets it too.\n\
         # cluster_secret_file = \"/etc/mergestream/cluster-secret\"\n\
         # How long a client connection may take to send its handshake, in milliseconds.\n\
         # handshake_timeout_ms = {DEFAULT_HANDSHAKE_TIMEOUT_MS}\n\
         \n\
         # A second client port that speaks TLS (ZooKeeper's secureClientPort); off when absent.\n\
         # secure_client_addr = \"127.0.0.1:2281\"\n\
         # Its certificate chain and private key, PEM. Required with secure_client_addr.\n\
         # tls_cert = \"/etc/mergestream/coordinator.pem\"\n\
         # tls_key = \"/etc/mergestream/coordinator.key\"\n\
         # A CA (PEM): when given, clients of the secure port must present a certificate it signed.\n\
         # tls_client_ca = \"/etc/mergestream/clients-ca.pem\"\n\
         # The superuser, as USER:HASH (base64 of the SHA-1 of user:password): `addauth digest`\n\
         # with its password passes every ACL (ZooKeeper's superDigest). Off when absent.\n\
         # super_digest = \"super:D/InIHSb7yEEbrWz8b9l71RjZJU=\"\n\
         \n\
         # The other members, node id = their raft_addr; --peer ID=HOST:PORT adds or overrides.\n\
         [peers]\n\
         # 2 = \"10.0.0.2:9234\"\n\
         # 3 = \"10.0.0.3:9234\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeFile, ConfigError> {
        mergestream_cli::parse_toml(text, "node.toml")
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults() {
        let file = parse(
            "node_id = 2\nclient_addr = \"127.0.0.1:2181\"\nraft_addr = \"127.0.0.1:9234\"\n\
             data_dir = \"/d\"\ntick_ms = 500\n[peers]\n1 = \"h1:9234\"\n3 = \"h3:9234\"\n",
        )
        .expect("parses");
        let flags = ServeFlags { peers: vec![(3, "other:9234".into())], tick_ms: Some(250), ..Default::default() };
        let config = ServeConfig::resolve(flags, file).expect("valid");
        assert_eq!((config.node_id, config.tick_ms, config.snapshot_every), (2, 250, DEFAULT_SNAPSHOT_EVERY));
        assert_eq!(config.peers, BTreeMap::from([(1, "h1:9234".into()), (3, "other:9234".into())]));
    }

    #[test]
    fn unknown_keys_bad_peers_and_missing_settings_are_refused() {
        let error = parse("node_id = 1\nnode = 2\n").expect_err("unknown");
        assert!(error.to_string().starts_with("node.toml:2:1: unknown field `node`"), "{error}");
        let file = parse("[peers]\nfour = \"h:1\"\n").expect("parses");
        let error = ServeConfig::resolve(ServeFlags::default(), file).expect_err("bad peer id");
        assert!(error.to_string().contains("\"four\" is not a node id"), "{error}");
        let error = ServeConfig::resolve(ServeFlags::default(), ServeFile::default()).expect_err("no node id");
        assert!(error.to_string().contains("--node-id"), "{error}");
    }

    #[test]
    fn the_secure_port_needs_its_files_and_the_files_a_port() {
        let base = "node_id = 1\nclient_addr = \"127.0.0.1:2181\"\nraft_addr = \"127.0.0.1:9234\"\ndata_dir = \"/d\"\n";
        let resolve = |extra: &str| {
            ServeConfig::resolve(ServeFlags::default(), parse(&format!("{base}{extra}")).expect("parses"))
        };
        let config = resolve("secure_client_addr = \"127.0.0.1:2281\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n")
            .expect("valid");
        let (addr, files) = config.secure.expect("secure port");
        assert_eq!((addr.port(), files.cert, files.client_ca), (2281, PathBuf::from("c.pem"), None));
        let error = resolve("secure_client_addr = \"127.0.0.1:2281\"\ntls_cert = \"c.pem\"\n").expect_err("no key");
        assert!(error.to_string().contains("--tls-key"), "{error}");
        let error = resolve("tls_client_ca = \"ca.pem\"\n").expect_err("no port");
        assert!(error.to_string().contains("--secure-client-addr"), "{error}");
        let error = resolve("super_digest = \"super\"\n").expect_err("bad digest");
        assert!(error.to_string().contains("USER:HASH"), "{error}");
    }

    #[test]
    fn the_example_is_a_valid_file() {
        assert_eq!(parse(&example()).expect("parses"), ServeFile::default());
    }
}
