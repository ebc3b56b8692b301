//! How a process reaches the coordinator beyond its hosts: TLS to the coordinator's secure
//! client port, and the identity its nodes belong to (ClickHouse's `<zookeeper><identity>`).

use std::path::{Path, PathBuf};

use zookeeper_client as zk;

use crate::KeeperError;

/// TLS to every coordinator host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeeperTls {
    /// The CA (PEM) the coordinator's certificate must be signed by.
    pub ca: PathBuf,
    /// A client certificate and its key (PEM), for a coordinator that asks for one.
    pub client: Option<(PathBuf, PathBuf)>,
}

#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeeperAccess {
    pub tls: Option<KeeperTls>,
    /// `user:password`, added as a `digest` identity on every connection; the nodes this
    /// process creates are then readable and writable by that identity alone (the `auth`
    /// ACL), as ClickHouse creates them when it has an identity.
    pub identity: Option<String>,
}

/// Shows the identity's user only: a settings struct printed in a log must not carry the password.
impl std::fmt::Debug for KeeperAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.identity.as_deref().map(|identity| identity.split_once(':').map_or(identity, |(user, _)| user));
        f.debug_struct("KeeperAccess").field("tls", &self.tls).field("identity_user", &user).finish()
    }
}

/// The coordinator TLS settings as the storage node and the ingestor take them: the flags
/// `--coordinator-tls-ca/-cert/-key`, or a `[coordinator_tls]` table (`ca`, `cert`, `key`) in
/// their config files.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// Connect to the coordinator with TLS, verifying its certificate against this CA (PEM).
    #[arg(long = "coordinator-tls-ca")]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to the coordinator; needs --coordinator-tls-key.
    #[arg(long = "coordinator-tls-cert")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long = "coordinator-tls-key")]
    pub key: Option<PathBuf>,
}

impl TlsSettings {
    /// Each setting from `self` (the flags) where given, else from `file`.
    pub fn or(self, file: TlsSettings) -> TlsSettings {
        TlsSettings { ca: self.ca.or(file.ca), cert: self.cert.or(file.cert), key: self.key.or(file.key) }
    }
}

impl KeeperAccess {
    /// The access these settings describe; an error names the setting that is wrong.
    pub fn resolve(tls: TlsSettings, identity: Option<String>) -> Result<KeeperAccess, String> {
        if let Some(identity) = &identity {
            if identity.split_once(':').is_none_or(|(user, _)| user.is_empty()) {
                return Err("the coordinator identity must be USER:PASSWORD".into());
            }
        }
        let client = match (tls.cert, tls.key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => return Err("a coordinator TLS certificate needs its key (coordinator-tls-key)".into()),
            (None, Some(_)) => return Err("a coordinator TLS key needs its certificate (coordinator-tls-cert)".into()),
        };
        let tls = match (tls.ca, client) {
            (Some(ca), client) => Some(KeeperTls { ca, client }),
            (None, None) => None,
            (None, Some(_)) => {
                return Err("a coordinator client certificate needs the CA to verify the coordinator with \
                            (coordinator-tls-ca)"
                    .into())
            }
        };
        Ok(KeeperAccess { tls, identity })
    }

    /// The connector for these settings.
    pub(crate) fn connector(&self) -> Result<zk::Connector, KeeperError> {
        let mut connector = zk::Client::connector();
        if let Some(identity) = &self.identity {
            connector = connector.with_auth("digest", identity.as_bytes());
        }
        if let Some(tls) = &self.tls {
            // zookeeper-client builds its TLS config from the process's provider; a process
            // that chose one already keeps it.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut options =
                zk::TlsOptions::new().with_pem_ca(&read_pem(&tls.ca)?).map_err(|e| tls_error(&tls.ca, e))?;
            if let Some((cert, key)) = &tls.client {
                options =
                    options.with_pem_identity(&read_pem(cert)?, &read_pem(key)?).map_err(|e| tls_error(cert, e))?;
            }
            connector = connector.with_tls(options);
        }
        Ok(connector)
    }
}

fn read_pem(path: &Path) -> Result<String, KeeperError> {
    std::fs::read_to_string(path).map_err(|e| KeeperError::Tls { path: path.to_path_buf(), reason: e.to_string() })
}

fn tls_error(path: &Path, e: zk::Error) -> KeeperError {
    KeeperError::Tls { path: path.to_path_buf(), reason: e.to_string() }
}

/// The lines a commented example config file gives these settings: the identity key (with
/// the other top-level keys) and the TLS table (with the other tables, at the end).
pub const EXAMPLE_IDENTITY: &str = "\
# USER:PASSWORD the coordinator knows this process by (a digest identity, as ClickHouse's\n\
# <identity>); the nodes it creates are then its own. Better given in\n\
# MERGESTREAM_COORDINATOR_IDENTITY than written here.\n\
# coordinator_identity = \"mergestream:secret\"\n";

pub const EXAMPLE_TLS: &str = "\
# TLS to the coordinator's secure client port: the CA that signed its certificate, and a\n\
# client certificate and key for a coordinator that asks for one.\n\
[coordinator_tls]\n\
# ca = \"/etc/mergestream/coordinator-ca.pem\"\n\
# cert = \"/etc/mergestream/client.pem\"\n\
# key = \"/etc/mergestream/client.key\"\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_resolve_to_access_or_name_what_is_missing() {
        let flags = TlsSettings { ca: Some("flag-ca.pem".into()), ..Default::default() };
        let file =
            TlsSettings { ca: Some("file-ca.pem".into()), cert: Some("c.pem".into()), key: Some("k.pem".into()) };
        let access = KeeperAccess::resolve(flags.or(file), Some("ann:pw".into())).expect("valid");
        let tls = access.tls.expect("tls");
        assert_eq!(tls.ca, PathBuf::from("flag-ca.pem"));
        assert_eq!(tls.client, Some(("c.pem".into(), "k.pem".into())));
        assert_eq!(KeeperAccess::resolve(TlsSettings::default(), None), Ok(KeeperAccess::default()));
        let no_key = TlsSettings { ca: Some("ca".into()), cert: Some("c".into()), key: None };
        assert!(KeeperAccess::resolve(no_key, None).expect_err("no key").contains("coordinator-tls-key"));
        let no_ca = TlsSettings { ca: None, cert: Some("c".into()), key: Some("k".into()) };
        assert!(KeeperAccess::resolve(no_ca, None).expect_err("no ca").contains("coordinator-tls-ca"));
        let error = KeeperAccess::resolve(TlsSettings::default(), Some("nopassword".into())).expect_err("bad");
        assert!(error.contains("USER:PASSWORD"), "{error}");
        let shown = format!("{:?}", KeeperAccess { tls: None, identity: Some("ann:s3cret".into()) });
        assert!(shown.contains("ann") && !shown.contains("s3cret"), "{shown}");
    }
}
