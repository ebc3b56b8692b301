//! Payload formats: a message's bytes → a JSON document for the column mapping.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;
use tracing::warn;

use super::avro::AvroSchema;
use super::registry::{Lookup, Registry};
use super::{DecodeError, Document, Projection};
use crate::error::IngestError;
use crate::pipeline::Format;

/// How often a failing schema registry is asked again before the pipeline stops.
const REGISTRY_ATTEMPTS: u32 = 6;

/// Decodes payloads into the fields the pipeline reads.
pub struct PayloadDecoder {
    projection: Projection,
    format: PayloadFormat,
}

enum PayloadFormat {
    Json,
    Avro(Arc<AvroSchema>),
    Confluent(Box<Confluent>),
}

/// The Confluent wire format: magic byte 0, a big-endian schema id, then an Avro datum.
struct Confluent {
    /// Schemas by id: those of the pipeline file, then those the registry gave; an id the
    /// registry does not know is remembered too, so that bad messages cost no request.
    schemas: HashMap<u32, Result<Arc<AvroSchema>, DecodeError>>,
    registry: Option<Registry>,
}

impl PayloadDecoder {
    pub fn new(format: &Format, projection: Projection) -> Result<PayloadDecoder, IngestError> {
        let format = match format {
            Format::Json => PayloadFormat::Json,
            Format::Avro { schema } => PayloadFormat::Avro(schema.clone()),
            Format::AvroConfluent { registry, schemas } => {
                let known = schemas.iter().map(|(id, schema)| (*id, Ok(schema.clone()))).collect();
                let registry = registry
                    .as_ref()
                    .map(|config| {
                        Registry::new(config)
                            .map_err(|message| IngestError::SchemaRegistry { url: config.url.clone(), message })
                    })
                    .transpose()?;
                PayloadFormat::Confluent(Box::new(Confluent { schemas: known, registry }))
            }
        };
        Ok(PayloadDecoder { projection, format })
    }

    pub fn projection(&self) -> &Projection {
        &self.projection
    }

    /// The payload's fields, into `document`; the inner error is a bad message, the outer one
    /// a schema registry that cannot be reached.
    pub async fn decode<'a>(
        &mut self,
        payload: &'a [u8],
        document: &mut Document<'a>,
    ) -> Result<Result<(), DecodeError>, IngestError> {
        let decoded = match &mut self.format {
            PayloadFormat::Json => return Ok(self.projection.parse_json_into(payload, document)),
            PayloadFormat::Avro(schema) => schema.decode(payload).map_err(DecodeError::BadAvro),
            // Boxed: the registry lookup's future is kilobytes, and the JSON path's future
            // would carry that room for every message.
            PayloadFormat::Confluent(confluent) => Box::pin(confluent.decode(payload)).await?,
        };
        Ok(decoded.and_then(|value| self.projection.project_into(value, document)))
    }
}

impl Confluent {
    async fn decode(&mut self, payload: &[u8]) -> Result<Result<Json, DecodeError>, IngestError> {
        let (id, datum) = match payload {
            [0, a, b, c, d, datum @ ..] => (u32::from_be_bytes([*a, *b, *c, *d]), datum),
            [first, ..] if *first != 0 => {
                return Ok(Err(DecodeError::BadFraming(format!(
                    "the first byte is {first:#04x}, not the magic byte 0"
                ))))
            }
            _ => {
                return Ok(Err(DecodeError::BadFraming(format!(
                    "{} bytes, shorter than the 5-byte header",
                    payload.len()
                ))))
            }
        };
        if !self.schemas.contains_key(&id) {
            let found = self.ask_registry(id).await?;
            self.schemas.insert(id, found);
        }
        Ok(match &self.schemas[&id] {
            Ok(schema) => schema.decode(datum).map_err(|e| DecodeError::BadAvro(format!("schema id {id}: {e}"))),
            Err(e) => Err(e.clone()),
        })
    }

    async fn ask_registry(&self, id: u32) -> Result<Result<Arc<AvroSchema>, DecodeError>, IngestError> {
        let Some(registry) = &self.registry else { return Ok(Err(DecodeError::UnknownSchema(id))) };
        let mut backoff = Duration::from_millis(200);
        let mut attempt = 1;
        loop {
            match registry.schema(id).await {
                Ok(Lookup::Avro(text)) => {
                    return Ok(AvroSchema::parse(&text)
                        .map(Arc::new)
                        .map_err(|e| DecodeError::BadAvro(format!("schema id {id} from the registry: {e}"))))
                }
                Ok(Lookup::OtherKind(kind)) => {
                    return Ok(Err(DecodeError::BadAvro(format!("schema id {id} is a {kind} schema, not Avro"))))
                }
                Ok(Lookup::Missing) => return Ok(Err(DecodeError::UnknownSchema(id))),
                Err(message) if attempt == REGISTRY_ATTEMPTS => {
                    return Err(IngestError::SchemaRegistry { url: registry.url().to_string(), message })
                }
                Err(message) => {
                    warn!(url = registry.url(), id, error = message, "the schema registry failed; asking again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
            }
        }
    }
}
