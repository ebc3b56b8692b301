//! A message's fields that the pipeline reads, and nothing else.
//!
//! The mappings of all the pipeline's tables name the top-level fields they read (`order` of
//! `order.customer.id`); a JSON payload is parsed into those fields only, by slot, with keys
//! matched in place and every other field skipped unbuilt. A field that one mapping alone
//! reads whole is moved into its row rather than copied.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

use super::DecodeError;
use crate::pipeline::{TableTarget, ValueSource};

/// The top-level fields the pipeline reads, each with a slot.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    names: Vec<String>,
    /// Per slot: how many mappings read it.
    readers: Vec<usize>,
}

/// The projected fields of one message, by slot; `None` where the message lacks one.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    values: Vec<Option<Json>>,
}

impl Projection {
    pub fn new(tables: &[TableTarget]) -> Projection {
        let mut projection = Projection::default();
        for mapping in tables.iter().flat_map(|t| &t.columns) {
            if let ValueSource::Field(path) = &mapping.source {
                let slot = match projection.slot(&path[0]) {
                    Some(slot) => slot,
                    None => {
                        projection.names.push(path[0].clone());
                        projection.readers.push(0);
                        projection.names.len() - 1
                    }
                };
                projection.readers[slot] += 1;
            }
        }
        projection
    }

    pub fn slot(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Whether the field in `slot` is read by one mapping only (which may then take it).
    pub fn read_once(&self, slot: usize) -> bool {
        self.readers[slot] == 1
    }

    /// Parses a JSON payload: it must be one object, with nothing after it.
    pub fn parse_json(&self, payload: &[u8]) -> Result<Document, DecodeError> {
        let mut de = serde_json::Deserializer::from_slice(payload);
        let parsed = DocumentSeed(self).deserialize(&mut de).and_then(|doc| de.end().map(|()| doc));
        match parsed {
            Ok(Ok(doc)) => Ok(doc),
            Ok(Err(kind)) => Err(DecodeError::NotAnObject(kind)),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        }
    }

    /// The projected fields of an already decoded value (an Avro record).
    pub fn project(&self, value: Json) -> Result<Document, DecodeError> {
        let Json::Object(mut object) = value else { return Err(DecodeError::NotAnObject(json_kind(&value))) };
        Ok(Document { values: self.names.iter().map(|n| object.remove(n)).collect() })
    }
}

impl Document {
    /// The value at `rest` inside the field in `slot`; taken out of the document when `take`
    /// (its only reader), copied otherwise. Null counts as missing.
    pub fn get(&mut self, slot: usize, rest: &[String], take: bool) -> Option<Json> {
        let field = self.values.get_mut(slot)?;
        if rest.is_empty() && take {
            return field.take().filter(|v| !v.is_null());
        }
        let mut at = field.as_ref();
        for step in rest {
            at = at.and_then(|v| v.get(step));
        }
        at.filter(|v| !v.is_null()).cloned()
    }
}

pub fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// Parses one JSON value into a [`Document`], or into the kind of value it is if it is not
/// an object.
struct DocumentSeed<'p>(&'p Projection);

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = Result<Document, &'static str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Result<Document, &'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut values = vec![None; self.0.names.len()];
        while let Some(slot) = map.next_key_seed(KeySeed(self.0))? {
            match slot {
                Some(slot) => values[slot] = Some(map.next_value::<Json>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Ok(Document { values }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err("an array"))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Err("null"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err("a string"))
    }
}

/// A key of the top-level object, matched against the projection without copying it.
struct KeySeed<'p>(&'p Projection);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.slot(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(names: &[&str], readers: &[usize]) -> Projection {
        Projection { names: names.iter().map(|n| n.to_string()).collect(), readers: readers.to_vec() }
    }

    #[test]
    fn only_the_read_fields_are_kept() {
        let p = projection(&["id", "order"], &[1, 2]);
        let mut doc = p.parse_json(br#"{"skip": [1, {"x": 2}], "order": {"who": "ann"}, "id": 7}"#).expect("object");
        assert_eq!(doc.values, vec![Some(serde_json::json!(7)), Some(serde_json::json!({"who": "ann"}))]);
        assert_eq!(doc.get(1, &["who".to_string()], false), Some(serde_json::json!("ann")));
        assert_eq!(doc.get(0, &[], true), Some(serde_json::json!(7)));
        assert_eq!(doc.get(0, &[], true), None, "taken");
    }

    #[test]
    fn not_an_object_and_not_json_are_told_apart() {
        let p = projection(&["id"], &[1]);
        assert_eq!(p.parse_json(b"[1, 2]"), Err(DecodeError::NotAnObject("an array")));
        assert_eq!(p.parse_json(b"\"x\""), Err(DecodeError::NotAnObject("a string")));
        assert!(matches!(p.parse_json(b"{\"id\": 1"), Err(DecodeError::Malformed(_))));
        assert!(matches!(p.parse_json(b"{\"id\": 1} x"), Err(DecodeError::Malformed(_))));
        assert_eq!(p.parse_json(br#"{"i\u0064": 5}"#).map(|d| d.values), Ok(vec![Some(serde_json::json!(5))]));
    }
}
