//! A Confluent-compatible schema registry, read over HTTP: `GET /schemas/ids/<id>`.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Registry {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
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
    /// `url` is the registry's base address (`http://host:8081`).
    pub fn new(url: &str) -> Result<Registry, String> {
        let base = url.trim_end_matches('/').to_string();
        match base.parse::<Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
            Ok(uri) if uri.scheme_str() == Some("https") => {
                return Err(format!("{url}: https registries are not supported yet; use http"))
            }
            _ => return Err(format!("{url}: expected an http://host:port address")),
        }
        Ok(Registry { base, client: Client::builder(TokioExecutor::new()).build_http() })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// The schema with this id. An error is a failure to ask (the registry is down or
    /// answers nonsense), not an unknown id.
    pub async fn schema(&self, id: u32) -> Result<Lookup, String> {
        let uri: Uri = format!("{}/schemas/ids/{id}", self.base).parse().map_err(|e| format!("{e}"))?;
        let response = tokio::time::timeout(TIMEOUT, self.client.get(uri))
            .await
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = tokio::time::timeout(TIMEOUT, response.into_body().collect())
            .await
            .map_err(|_| format!("no whole answer within {TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?
            .to_bytes();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_addresses_are_taken() {
        assert!(Registry::new("http://127.0.0.1:8081/").is_ok());
        assert!(Registry::new("https://registry:8081").err().is_some_and(|e| e.contains("https")));
        assert!(Registry::new("registry:8081").is_err());
    }
}
