//! A Confluent-compatible schema registry, read over HTTP or HTTPS: `GET /schemas/ids/<id>`,
//! with HTTP basic authentication when the pipeline gives credentials.
//!
//! Lookups are rare (one per schema id the pipeline meets), so each one opens a connection of
//! its own with hyper's HTTP/1 client over a TCP or rustls stream.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, HOST};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach a registry: what `format.avro-confluent` gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The base address, `http://host:port` or `https://host:port[/path]`.
    pub url: String,
    /// PEM certificates to trust for https instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// `user:password` for HTTP basic authentication (Confluent's `basic.auth.user.info`).
    pub basic_auth: Option<String>,
}

pub struct Registry {
    base: String,
    host: String,
    port: u16,
    /// The `Host` header: the address's authority.
    authority: String,
    /// The address's path, without a trailing slash.
    prefix: String,
    tls: Option<TlsConnector>,
    authorization: Option<String>,
}

/// What the registry says of a schema id.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Avro(String),
    /// The registry holds it, but as another kind (PROTOBUF, JSON).
    OtherKind(String),
    Missing,
}

impl Registry {
    pub fn new(config: &RegistryConfig) -> Result<Registry, String> {
        let (mut registry, https) = Registry::without_tls(config)?;
        if https {
            registry.tls = Some(tls_connector(config.ca_file.as_deref()).map_err(|e| format!("{}: {e}", config.url))?);
        }
        Ok(registry)
    }

    /// What `ingestor check` can say of a registry without reading the system's certificates
    /// (the run reads them, once): the address, the credentials and the CA file.
    pub fn check(config: &RegistryConfig) -> Result<(), String> {
        Registry::without_tls(config)?;
        match &config.ca_file {
            Some(ca_file) => ca_roots(ca_file).map(drop).map_err(|e| format!("{}: {e}", config.url)),
            None => Ok(()),
        }
    }

    /// The registry with its address and credentials checked, and whether it is https.
    fn without_tls(config: &RegistryConfig) -> Result<(Registry, bool), String> {
        let url = &config.url;
        let base = url.trim_end_matches('/').to_string();
        let uri: Uri = base.parse().map_err(|e| format!("{url}: not an address ({e})"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("{url}: expected an http:// or https:// address")),
        };
        let (Some(host), Some(authority)) = (uri.host(), uri.authority()) else {
            return Err(format!("{url}: the address has no host"));
        };
        if !https && config.ca_file.is_some() {
            return Err(format!("{url}: a CA file is for https addresses"));
        }
        let authorization = match &config.basic_auth {
            Some(user_info) if !user_info.contains(':') => {
                return Err("the registry credentials must be `user:password`".to_string())
            }
            Some(user_info) => Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_info))),
            None => None,
        };
        let registry = Registry {
            host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
            authority: authority.to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
            base,
            tls: None,
            authorization,
        };
        Ok((registry, https))
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// The schema with this id. An error is a failure to ask (the registry is down, refuses
    /// the credentials or answers nonsense), not an unknown id.
    pub async fn schema(&self, id: u32) -> Result<Lookup, String> {
        let path = format!("{}/schemas/ids/{id}", self.prefix);
        let (status, body) = tokio::time::timeout(TIMEOUT, self.get(&path))
            .await
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))??;
        if status == StatusCode::NOT_FOUND {
            return Ok(Lookup::Missing);
        }
        if status != StatusCode::OK {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            schema: String,
            #[serde(rename = "schemaType")]
            schema_type: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| format!("an answer without a schema ({e})"))?;
        Ok(match answer.schema_type.as_deref() {
            None | Some("AVRO") => Lookup::Avro(answer.schema),
            Some(other) => Lookup::OtherKind(other.to_string()),
        })
    }

    async fn get(&self, path: &str) -> Result<(StatusCode, Bytes), String> {
        let mut request = Request::get(path)
            .header(HOST, &self.authority)
            .header(ACCEPT, "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let request = request.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await.map_err(|e| e.to_string())?;
        match &self.tls {
            None => send(TokioIo::new(tcp), request).await,
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| format!("{}: {e}", self.host))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
                send(TokioIo::new(stream), request).await
            }
        }
    }
}

/// One request on a fresh HTTP/1 connection.
async fn send<T>(io: T, request: Request<Empty<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let answer = async {
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }
    .await;
    driver.abort();
    answer
}

/// The certificates of a PEM file, to trust.
fn ca_roots(path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for certificate in certificates {
        let certificate = certificate.map_err(|e| format!("{}: {e}", path.display()))?;
        roots.add(certificate).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no PEM certificate in the file", path.display()));
    }
    Ok(roots)
}

/// A TLS client trusting the certificates of `ca_file`, or the system's.
fn tls_connector(ca_file: Option<&Path>) -> Result<TlsConnector, String> {
    let roots = match ca_file {
        Some(path) => ca_roots(path)?,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in rustls_native_certs::load_native_certs().certs {
                // A system certificate rustls cannot use is left out, as the others' would be.
                let _ = roots.add(certificate);
            }
            if roots.is_empty() {
                return Err("no system CA certificates found; give `registry_ca_file`".to_string());
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> RegistryConfig {
        RegistryConfig { url: url.to_string(), ca_file: None, basic_auth: None }
    }

    #[test]
    fn http_and_https_addresses_are_taken() {
        let plain = Registry::new(&config("http://127.0.0.1:8081/")).expect("http");
        assert_eq!((plain.host.as_str(), plain.port, plain.prefix.as_str()), ("127.0.0.1", 8081, ""));
        let missing_ca = RegistryConfig { ca_file: Some("/nonexistent/ca.pem".into()), ..config("https://r:8443/sr") };
        assert!(Registry::new(&missing_ca).err().is_some_and(|e| e.contains("/nonexistent/ca.pem")));
        assert!(Registry::new(&config("registry:8081")).is_err());
        assert!(Registry::new(&config("ftp://registry")).is_err());
        let ca_for_http = RegistryConfig { ca_file: Some("ca.pem".into()), ..config("http://r:8081") };
        assert!(Registry::new(&ca_for_http).err().is_some_and(|e| e.contains("https")));
    }

    #[test]
    fn credentials_become_a_basic_authorization() {
        let with = RegistryConfig { basic_auth: Some("ann:s3cret".into()), ..config("http://r:8081") };
        assert_eq!(Registry::new(&with).expect("valid").authorization.as_deref(), Some("Basic YW5uOnMzY3JldA=="));
        let without_colon = RegistryConfig { basic_auth: Some("ann".into()), ..config("http://r:8081") };
        assert!(Registry::new(&without_colon).is_err());
    }
}
