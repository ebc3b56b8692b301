//! TLS on the storage node's client ports (Ingest and Arrow Flight SQL), both sides of it:
//! the server's certificate and key, checked when the node starts so that a wrong file is an
//! error naming it rather than a handshake that fails later; and a client's trust (a private
//! CA, or the system's roots) for the ingestor and `storage-node client`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {what}", path.display())]
    Pem { path: PathBuf, what: String },
    #[error("{cert} and {key}: {message}", cert = cert.display(), key = key.display())]
    Mismatch { cert: PathBuf, key: PathBuf, message: String },
    #[error("{addr}: {message}")]
    Endpoint { addr: String, message: String },
}

/// tonic's TLS takes rustls's process-wide provider, which rustls cannot pick by itself when
/// the build has both ring and aws-lc-rs (other crates of the tree bring the second): ring,
/// as everywhere else here. Installing twice is harmless (the first stays).
fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

/// The certificate chain (PEM, leaf first) and private key (PEM: PKCS#8, PKCS#1 or SEC1) a
/// server presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerTlsFiles {
    /// Reads and checks both files: each must hold what it should, and the key must be the
    /// certificate's (rustls checks it as it builds a server configuration).
    pub fn load(&self) -> Result<ServerTlsConfig, TlsError> {
        install_ring_provider();
        let cert_pem = read(&self.cert)?;
        let key_pem = read(&self.key)?;
        let pem_error = |path: &Path, what: String| TlsError::Pem { path: path.to_path_buf(), what };
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&self.cert, format!("not a PEM certificate chain ({e})")))?;
        if chain.is_empty() {
            return Err(pem_error(&self.cert, "no certificate in it (a PEM \"BEGIN CERTIFICATE\" block)".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| pem_error(&self.key, format!("no private key in it ({e})")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
                message: e.to_string(),
            })?;
        Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem)))
    }
}

/// How a client reaches a storage node: in plain text, or over TLS trusting a CA file or the
/// system's roots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// Connect with TLS (implied by `ca`).
    pub enabled: bool,
    /// The CA (PEM) that signed the node's certificate; the system's roots when absent.
    pub ca: Option<PathBuf>,
    /// The name to verify the node's certificate for, when it is not the address's host.
    pub domain: Option<String>,
}

impl ClientTls {
    pub fn is_enabled(&self) -> bool {
        self.enabled || self.ca.is_some()
    }

    /// The endpoint of the node at `addr` (`host:port`, or a URL with its scheme).
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, TlsError> {
        let endpoint_error = |message: String| TlsError::Endpoint { addr: addr.to_string(), message };
        let url = match addr.split_once("://") {
            Some(("https", _)) if !self.is_enabled() => {
                return Err(endpoint_error(
                    "an https:// address needs TLS settings (a CA file, or TLS with the system's roots)".into(),
                ))
            }
            Some(_) => addr.to_string(),
            None if self.is_enabled() => format!("https://{addr}"),
            None => format!("http://{addr}"),
        };
        let endpoint = Endpoint::from_shared(url).map_err(|e| endpoint_error(e.to_string()))?;
        if !self.is_enabled() {
            return Ok(endpoint);
        }
        install_ring_provider();
        let mut config = match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        endpoint.tls_config(config).map_err(|e| endpoint_error(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named() {
        let files = ServerTlsFiles { cert: "/nonexistent/cert.pem".into(), key: "/nonexistent/key.pem".into() };
        let error = files.load().expect_err("missing");
        assert!(error.to_string().starts_with("/nonexistent/cert.pem: "), "{error}");
    }

    #[test]
    fn a_file_without_a_certificate_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "not a certificate\n").expect("write");
        let files = ServerTlsFiles { cert: cert.clone(), key: cert.clone() };
        let error = files.load().expect_err("no certificate");
        assert!(error.to_string().contains("cert.pem: no certificate in it"), "{error}");
    }

    #[test]
    fn the_scheme_follows_the_settings() {
        let plain = ClientTls::default();
        assert_eq!(plain.endpoint("127.0.0.1:9100").expect("plain").uri().scheme_str(), Some("http"));
        let error = plain.endpoint("https://127.0.0.1:9100").expect_err("https without TLS settings");
        assert!(error.to_string().contains("needs TLS settings"), "{error}");
    }
}
