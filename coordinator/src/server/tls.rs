//! TLS on the secure client port, as ZooKeeper's `secureClientPort` offers it: rustls with the
//! server's certificate chain and key read from PEM files. With a client CA, a client must
//! present a certificate that CA signed before it may say anything (ZooKeeper's
//! `ssl.clientAuth=need`); without one, any client may connect, as on the plain port.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Where the secure port's certificate, key and (optionally) client CA are.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("the TLS settings are refused: {0}")]
    Config(#[from] rustls::Error),
    #[error("the client CA {path} cannot verify clients: {reason}")]
    ClientVerifier { path: PathBuf, reason: String },
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_path_buf(), reason: reason.to_string() }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The acceptor for the secure port; every file is read and checked here, at startup.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_error(&files.key, e))?;
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| file_error(path, e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientVerifier { path: path.clone(), reason: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // A key that does not belong to the certificate is refused here rather than by every
    // handshake.
    let config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            file_error(&files.key, format!("the key does not match the certificate {}", files.cert.display()))
        }
        rustls::Error::InvalidCertificate(reason) => file_error(
            &files.cert,
            format!("the certificate cannot serve TLS ({reason:?}; an X.509 v3 certificate is needed)"),
        ),
        e => TlsError::Config(e),
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
