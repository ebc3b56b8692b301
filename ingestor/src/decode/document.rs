//! A message's fields that the pipeline reads, and nothing else.
//!
//! The mappings of all the pipeline's tables name the top-level fields they read (`order` of
//! `order.customer.id`); a JSON payload is parsed into those fields only, by slot, with keys
//! matched in place and every other field skipped unbuilt. A scalar field stays a [`Field`]:
//! a number as parsed, a string borrowed from the payload when it has no escapes; only a
//! nested object or array is built as JSON. A field that one mapping alone reads whole is
//! moved into its row rather than copied.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use smallvec::SmallVec;

use super::DecodeError;
use crate::pipeline::{TableTarget, ValueSource};

/// The top-level fields the pipeline reads, each with a slot.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    names: Vec<String>,
    /// Per slot: how many mappings read it.
    readers: Vec<usize>,
}

/// The projected fields of one message, by slot; `None` where the message lacks one or has
/// null.
#[derive(Debug, Clone, PartialEq)]
pub struct Document<'a> {
    values: SmallVec<[Option<Field<'a>>; INLINE_FIELDS]>,
}

/// Projected fields held without a heap allocation.
const INLINE_FIELDS: usize = 8;

/// One value of a message, as its format gave it. JSON null is not a field: it counts as
/// missing.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<'a> {
    Bool(bool),
    /// A non-negative integer (serde_json's own split: negative integers are `I64`).
    U64(u64),
    I64(i64),
    F64(f64),
    Str(Cow<'a, str>),
    /// An object or an array.
    Nested(Json),
}

impl Field<'_> {
    /// An integer as JSON parsing gives it: non-negative ones are `U64`.
    pub fn integer(n: i64) -> Field<'static> {
        u64::try_from(n).map_or(Field::I64(n), Field::U64)
    }

    /// `None` for null.
    pub fn from_json(value: Json) -> Option<Field<'static>> {
        Some(match value {
            Json::Null => return None,
            Json::Bool(b) => Field::Bool(b),
            Json::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Field::U64(u),
                (None, Some(i)) => Field::I64(i),
                (None, None) => Field::F64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => Field::Str(Cow::Owned(s)),
            nested => Field::Nested(nested),
        })
    }

    /// The same value as JSON, exactly as serde_json would have parsed it.
    pub fn into_json(self) -> Json {
        match self {
            Field::Bool(b) => Json::Bool(b),
            Field::U64(u) => u.into(),
            Field::I64(i) => i.into(),
            Field::F64(f) => serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number),
            Field::Str(s) => Json::String(s.into_owned()),
            Field::Nested(v) => v,
        }
    }
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
    pub fn parse_json<'a>(&self, payload: &'a [u8]) -> Result<Document<'a>, DecodeError> {
        // One UTF-8 check of the whole payload is cheaper than serde_json's check of each
        // string in it (keys and skipped fields included).
        let text = std::str::from_utf8(payload).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        let mut de = serde_json::Deserializer::from_str(text);
        let parsed = DocumentSeed(self).deserialize(&mut de).and_then(|doc| de.end().map(|()| doc));
        match parsed {
            Ok(Ok(doc)) => Ok(doc),
            Ok(Err(kind)) => Err(DecodeError::NotAnObject(kind)),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        }
    }

    /// The projected fields of an already decoded value (an Avro record).
    pub fn project<'a>(&self, value: Json) -> Result<Document<'a>, DecodeError> {
        let Json::Object(mut object) = value else { return Err(DecodeError::NotAnObject(json_kind(&value))) };
        let field = |name: &String| -> Option<Field<'a>> { object.remove(name).and_then(Field::from_json) };
        Ok(Document { values: self.names.iter().map(field).collect() })
    }
}

impl<'a> Document<'a> {
    /// The value at `rest` inside the field in `slot`; taken out of the document when `take`
    /// (its only reader), copied otherwise.
    pub fn get(&mut self, slot: usize, rest: &[String], take: bool) -> Option<Field<'a>> {
        let field = self.values.get_mut(slot)?;
        if rest.is_empty() {
            return if take { field.take() } else { field.clone() };
        }
        let Some(Field::Nested(nested)) = field.as_ref() else { return None };
        let mut at: &Json = nested;
        for step in rest {
            at = at.get(step)?;
        }
        Field::from_json(at.clone())
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
    type Value = Result<Document<'de>, &'static str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Result<Document<'de>, &'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut values: SmallVec<[Option<Field<'de>>; INLINE_FIELDS]> = (0..self.0.names.len()).map(|_| None).collect();
        while let Some(slot) = map.next_key_seed(KeySeed(self.0))? {
            match slot {
                Some(slot) => values[slot] = map.next_value_seed(FieldSeed)?,
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

/// One field's value: scalars as they are, nested values built as JSON, null as `None`.
struct FieldSeed;

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Option<Field<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = Option<Field<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Some(Field::Bool(b)))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Self::Value, E> {
        Ok(Some(Field::U64(u)))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Self::Value, E> {
        // serde_json calls this for negative integers only; keep its split if another
        // deserializer does not.
        Ok(Some(Field::integer(i)))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
        Ok(Some(Field::F64(f)))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Field::Str(Cow::Borrowed(s))))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(Field::Str(Cow::Owned(s.to_owned()))))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Some(Field::Str(Cow::Owned(s))))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Json::deserialize(MapAccessDeserializer::new(map)).map(|v| Some(Field::Nested(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Json::deserialize(SeqAccessDeserializer::new(seq)).map(|v| Some(Field::Nested(v)))
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
        assert_eq!(doc.values[..], [Some(Field::U64(7)), Some(Field::Nested(serde_json::json!({"who": "ann"})))]);
        assert_eq!(doc.get(1, &["who".to_string()], false), Some(Field::Str("ann".into())));
        assert_eq!(doc.get(0, &[], true), Some(Field::U64(7)));
        assert_eq!(doc.get(0, &[], true), None, "taken");
    }

    #[test]
    fn fields_borrow_plain_strings_and_keep_numbers_as_parsed() {
        let p = projection(&["a", "b", "c", "d", "e"], &[1, 1, 1, 1, 1]);
        let doc = p.parse_json(br#"{"a": "plain", "b": "esc\"aped", "c": -3, "d": 1.5, "e": null}"#).expect("object");
        assert!(matches!(&doc.values[0], Some(Field::Str(Cow::Borrowed("plain")))));
        assert!(matches!(&doc.values[1], Some(Field::Str(Cow::Owned(s))) if s == "esc\"aped"));
        assert_eq!(doc.values[2..], [Some(Field::I64(-3)), Some(Field::F64(1.5)), None]);
        for json in [serde_json::json!(-3), serde_json::json!(7), serde_json::json!(1.5), serde_json::json!("s")] {
            assert_eq!(Field::from_json(json.clone()).map(Field::into_json), Some(json));
        }
    }

    #[test]
    fn not_an_object_and_not_json_are_told_apart() {
        let p = projection(&["id"], &[1]);
        assert_eq!(p.parse_json(b"[1, 2]"), Err(DecodeError::NotAnObject("an array")));
        assert_eq!(p.parse_json(b"\"x\""), Err(DecodeError::NotAnObject("a string")));
        assert!(matches!(p.parse_json(b"{\"id\": 1"), Err(DecodeError::Malformed(_))));
        assert!(matches!(p.parse_json(b"{\"id\": 1} x"), Err(DecodeError::Malformed(_))));
        assert_eq!(p.parse_json(br#"{"i\u0064": 5}"#).map(|d| d.values.to_vec()), Ok(vec![Some(Field::U64(5))]));
        assert!(matches!(p.parse_json(b"{\"id\": \"\xff\"}"), Err(DecodeError::Malformed(_))), "not UTF-8");
    }
}
