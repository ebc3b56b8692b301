//! A message's fields that the pipeline reads, and nothing else.
//!
//! The mappings of all the pipeline's tables name the top-level fields they read (`order` of
//! `order.customer.id`); a JSON payload is parsed into those fields only, by slot, with keys
//! matched in place and every other field skipped unbuilt. A scalar field stays a [`Field`]:
//! a number as parsed, a string borrowed from the payload when it has no escapes; only a
//! nested object or array is built as JSON. A field that one mapping alone reads whole is
//! moved into its row rather than copied.
//!
//! A message is parsed into the [`Document`] of the message before it, in place: a
//! document returned by value was copied three or four times on its way out of the
//! parser, and those copies were a fifth of the decoding time.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

use super::{flat_json, DecodeError};
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Document<'a> {
    values: Vec<Option<Field<'a>>>,
}

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
    /// An object or an array (boxed: the scalars, by far the common case, stay small).
    Nested(Box<Json>),
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
            nested => Field::Nested(Box::new(nested)),
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
            Field::Nested(v) => *v,
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

    /// The slot of `name`, trying `guess` first: messages of one producer have their keys in
    /// one order, so the slot after the previous key's is nearly always the right one.
    pub(super) fn slot_guessing(&self, name: &str, guess: usize) -> Option<usize> {
        match self.names.get(guess) {
            Some(n) if n == name => Some(guess),
            _ => self.slot(name),
        }
    }

    /// Whether the field in `slot` is read by one mapping only (which may then take it).
    pub fn read_once(&self, slot: usize) -> bool {
        self.readers[slot] == 1
    }

    /// Parses a JSON payload into `document`: it must be one object, with nothing after it.
    /// On an error the document's fields are unspecified.
    pub fn parse_json_into<'a>(&self, payload: &'a [u8], document: &mut Document<'a>) -> Result<(), DecodeError> {
        // One UTF-8 check of the whole payload is cheaper than serde_json's check of each
        // string in it (keys and skipped fields included).
        let text = std::str::from_utf8(payload).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        document.reset(self.names.len());
        if flat_json::scan_object(text, self, &mut document.values) {
            return Ok(());
        }
        document.reset(self.names.len());
        self.parse_with_serde(text, &mut document.values)
    }

    /// serde_json's reading of `text` into `values` (one empty slot per field): every message
    /// the fast path gives up on, and the one source of error messages.
    fn parse_with_serde<'a>(&self, text: &'a str, values: &mut [Option<Field<'a>>]) -> Result<(), DecodeError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let parsed =
            DocumentSeed { projection: self, values }.deserialize(&mut de).and_then(|object| de.end().map(|()| object));
        match parsed {
            Ok(Ok(())) => Ok(()),
            Ok(Err(kind)) => Err(DecodeError::NotAnObject(kind)),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        }
    }

    /// The projection of `names`, each read once.
    #[cfg(test)]
    pub(super) fn with_names(names: &[&str]) -> Projection {
        Projection { names: names.iter().map(|n| n.to_string()).collect(), readers: vec![1; names.len()] }
    }

    /// The fields serde_json reads from `text`, without the fast path.
    #[cfg(test)]
    pub(super) fn parse_json_slow<'a>(&self, text: &'a str) -> Result<Vec<Option<Field<'a>>>, DecodeError> {
        let mut values = vec![None; self.names.len()];
        self.parse_with_serde(text, &mut values).map(|()| values)
    }

    /// Parses a JSON payload into a document of its own.
    pub fn parse_json<'a>(&self, payload: &'a [u8]) -> Result<Document<'a>, DecodeError> {
        let mut document = Document::default();
        self.parse_json_into(payload, &mut document).map(|()| document)
    }

    /// The projected fields of an already decoded value (an Avro record), into `document`.
    pub fn project_into<'a>(&self, value: Json, document: &mut Document<'a>) -> Result<(), DecodeError> {
        let Json::Object(mut object) = value else { return Err(DecodeError::NotAnObject(json_kind(&value))) };
        document.values.clear();
        document.values.extend(self.names.iter().map(|name| object.remove(name).and_then(Field::from_json)));
        Ok(())
    }
}

impl<'a> Document<'a> {
    /// `slots` empty fields.
    fn reset(&mut self, slots: usize) {
        self.values.clear();
        self.values.resize_with(slots, || None);
    }

    /// The value at `rest` inside the field in `slot`; taken out of the document when `take`
    /// (its only reader), copied otherwise.
    #[inline]
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

/// Parses one JSON value into the fields of a [`Document`], or into the kind of value it is
/// if it is not an object.
struct DocumentSeed<'p, 'd, 'de> {
    projection: &'p Projection,
    /// One empty field per slot.
    values: &'d mut [Option<Field<'de>>],
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_, 'de> {
    type Value = Result<(), &'static str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_, '_, 'de> {
    type Value = Result<(), &'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut guess = 0;
        while let Some(slot) = map.next_key_seed(KeySeed { projection: self.projection, guess })? {
            match slot {
                Some(slot) => {
                    self.values[slot] = map.next_value_seed(FieldSeed)?;
                    guess = slot + 1;
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Ok(()))
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
        Json::deserialize(MapAccessDeserializer::new(map)).map(|v| Some(Field::Nested(Box::new(v))))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Json::deserialize(SeqAccessDeserializer::new(seq)).map(|v| Some(Field::Nested(Box::new(v))))
    }
}

/// A key of the top-level object, matched against the projection without copying it, the
/// slot `guess` first.
struct KeySeed<'p> {
    projection: &'p Projection,
    guess: usize,
}

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
        Ok(self.projection.slot_guessing(key, self.guess))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(names: &[&str], readers: &[usize]) -> Projection {
        Projection { readers: readers.to_vec(), ..Projection::with_names(names) }
    }

    #[test]
    fn only_the_read_fields_are_kept() {
        let p = projection(&["id", "order"], &[1, 2]);
        let mut doc = p.parse_json(br#"{"skip": [1, {"x": 2}], "order": {"who": "ann"}, "id": 7}"#).expect("object");
        assert_eq!(
            doc.values[..],
            [Some(Field::U64(7)), Some(Field::Nested(Box::new(serde_json::json!({"who": "ann"}))))]
        );
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
    fn a_reused_document_keeps_nothing_of_the_message_before() {
        let p = projection(&["a", "b", "c"], &[1, 1, 1]);
        let payloads: [&[u8]; 4] = [
            br#"{"a": 1, "b": "x", "c": 2}"#,
            br#"{"c": 3, "a": 4}"#,
            br#"{"b": "y", "skip": 0, "a": 5}"#,
            br#"{"a": 6, "b": "#,
        ];
        let mut doc = Document::default();
        let mut parsed = Vec::new();
        for payload in payloads {
            parsed.push(p.parse_json_into(payload, &mut doc).map(|()| doc.values.clone()));
        }
        let str = |s| Some(Field::Str(Cow::Borrowed(s)));
        assert_eq!(parsed[0], Ok(vec![Some(Field::U64(1)), str("x"), Some(Field::U64(2))]));
        assert_eq!(parsed[1], Ok(vec![Some(Field::U64(4)), None, Some(Field::U64(3))]), "keys out of order, b gone");
        assert_eq!(parsed[2], Ok(vec![Some(Field::U64(5)), str("y"), None]));
        assert!(matches!(parsed[3], Err(DecodeError::Malformed(_))));
        p.parse_json_into(b"{}", &mut doc).expect("object");
        assert_eq!(doc.values, [None, None, None], "a failed parse leaves nothing for the next");
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
