//! Messages → rows of a table: the pipeline's column mapping, defaults and conversions.
//!
//! A payload is first decoded by the pipeline's format ([`format`]: JSON, or Avro through
//! [`avro`] with schemas from files or a schema registry) into a JSON document; the mapping
//! then picks each column's value out of it, the same way for every format.
//!
//! Values are collected per column ([`columns`]): those of common types unboxed as they are
//! decoded, the others as generic values turned into Arrow arrays once per block with the
//! same conversion `INSERT … FORMAT JSONEachRow` uses (mergestream-query's
//! `column_from_values`). A value that does not fit its column fails that conversion; the
//! block then finds the rows at fault one by one (a rare path), so the common path converts
//! each column once.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use mergestream_engine::{ChType, TableDef};
use mergestream_query::input::value::{column_from_values, Value};
use mergestream_query::input::{column_default, from_json};

use crate::pipeline::{ColumnMapping, Conversion, TableTarget, ValueSource};

pub mod avro;
pub mod columns;
pub mod document;
mod flat_json;
pub mod format;
pub mod registry;

pub use columns::{Cell, Column};
pub use document::{Document, Field, Projection};
pub use format::PayloadDecoder;

/// What a message carries besides its payload.
pub struct MessageMeta<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub headers: &'a [(String, Vec<u8>)],
}

/// Why a message could not become a row.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("not valid JSON: {0}")]
    Malformed(String),
    #[error("not valid Avro: {0}")]
    BadAvro(String),
    #[error("not in the Confluent wire format: {0}")]
    BadFraming(String),
    #[error("schema id {0} is not known (neither in format.avro-confluent.schemas nor in the schema registry)")]
    UnknownSchema(u32),
    #[error("expected an object (a JSON object or an Avro record), found {0}")]
    NotAnObject(&'static str),
    #[error("missing required field `{field}` (column {column})")]
    MissingField { field: String, column: String },
    #[error("column {column}: {message}")]
    WrongType { column: String, message: String },
}

impl DecodeError {
    /// A short stable name for the `reason` header and the metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Malformed(_) | DecodeError::BadAvro(_) | DecodeError::BadFraming(_) => "malformed",
            DecodeError::UnknownSchema(_) => "unknown_schema",
            DecodeError::NotAnObject(_) => "not_an_object",
            DecodeError::MissingField { .. } => "missing_field",
            DecodeError::WrongType { .. } => "wrong_type",
        }
    }
}

/// Decoded rows of one table, kept column by column (made by [`RowDecoder::rows`]).
#[derive(Debug, Clone)]
pub struct Rows {
    columns: Vec<Column>,
    len: usize,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn remove(&mut self, row: usize) {
        for column in &mut self.columns {
            column.remove(row);
        }
        self.len -= 1;
    }

    /// Drops the values a row being decoded left in some columns.
    fn roll_back(&mut self) {
        for column in &mut self.columns {
            column.truncate(self.len);
        }
    }
}

/// Where one column's value comes from, resolved against the pipeline's projection.
struct ColumnSource {
    /// The pipeline's mapping, if it maps this column.
    mapping: Option<ColumnMapping>,
    /// For a field: its top-level slot in the document, and whether this column may take
    /// the value (it alone reads that field, whole).
    slot: Option<(usize, bool)>,
    /// The value when the column is not mapped: its DEFAULT.
    fallback: Value,
}

/// Turns messages into the values of one table's columns.
pub struct RowDecoder {
    table: String,
    types: Vec<ChType>,
    names: Vec<String>,
    sources: Vec<ColumnSource>,
}

impl RowDecoder {
    pub fn new(target: &TableTarget, projection: &Projection) -> Result<RowDecoder, String> {
        let def: &TableDef = &target.def;
        let mut sources = Vec::with_capacity(def.columns.len());
        for column in &def.columns {
            let fallback = column_default(def, column).map_err(|e| e.to_string())?;
            let mapping = target.columns.iter().find(|m| m.column == column.name).cloned();
            let slot = match mapping.as_ref().map(|m| &m.source) {
                Some(ValueSource::Field(path)) => {
                    let slot = projection.slot(&path[0]).ok_or("a mapped field outside the projection")?;
                    Some((slot, path.len() == 1 && projection.read_once(slot)))
                }
                _ => None,
            };
            sources.push(ColumnSource { mapping, slot, fallback });
        }
        Ok(RowDecoder {
            table: def.name.clone(),
            types: def.columns.iter().map(|c| c.ty.clone()).collect(),
            names: def.columns.iter().map(|c| c.name.clone()).collect(),
            sources,
        })
    }

    /// An empty buffer of this table's rows.
    pub fn rows(&self) -> Rows {
        let columns = self
            .types
            .iter()
            .zip(&self.sources)
            .map(|(ty, source)| Column::new(ty, source.mapping.as_ref().is_some_and(|m| m.convert.is_none())))
            .collect();
        Rows { columns, len: 0 }
    }

    /// Decodes one row into `rows`: a value per column. Fields this table alone reads are
    /// taken out of the document. On an error `rows` is left as it was.
    pub fn decode<'a>(
        &self,
        document: &mut Document<'a>,
        meta: &MessageMeta<'a>,
        rows: &mut Rows,
    ) -> Result<(), DecodeError> {
        for (i, source) in self.sources.iter().enumerate() {
            match self.cell(i, source, document, meta) {
                Ok(cell) => rows.columns[i].push(cell),
                Err(e) => {
                    rows.roll_back();
                    return Err(e);
                }
            }
        }
        rows.len += 1;
        Ok(())
    }

    #[inline(always)]
    fn cell<'a>(
        &self,
        i: usize,
        ColumnSource { mapping, slot, fallback }: &ColumnSource,
        document: &mut Document<'a>,
        meta: &MessageMeta<'a>,
    ) -> Result<Cell<'a>, DecodeError> {
        let Some(mapping) = mapping else { return Ok(Cell::Value(fallback.clone())) };
        let raw = match &mapping.source {
            ValueSource::Field(path) => slot.and_then(|(slot, take)| document.get(slot, &path[1..], take)),
            ValueSource::Key => meta.key.map(|k| Field::Str(String::from_utf8_lossy(k))),
            ValueSource::Topic => Some(Field::Str(Cow::Borrowed(meta.topic))),
            ValueSource::Partition => Some(Field::integer(meta.partition.into())),
            ValueSource::Offset => Some(Field::integer(meta.offset)),
            ValueSource::Timestamp => meta.timestamp_ms.map(|ms| Field::integer(timestamp_value(ms, &self.types[i]))),
            ValueSource::Header(name) => {
                meta.headers.iter().find(|(n, _)| n == name).map(|(_, v)| Field::Str(String::from_utf8_lossy(v)))
            }
        };
        let raw = raw.or_else(|| mapping.default.clone().and_then(Field::from_json));
        Ok(match (raw, mapping.convert) {
            (Some(field), None) => Cell::Field(field),
            (Some(field), Some(conversion)) => Cell::Value(convert(field.into_json(), conversion, &self.names[i])?),
            (None, _) if self.types[i].is_nullable() => Cell::Null,
            (None, _) => match &mapping.source {
                ValueSource::Field(path) => {
                    return Err(DecodeError::MissingField { field: path.join("."), column: self.names[i].clone() })
                }
                _ => Cell::Value(fallback.clone()),
            },
        })
    }

    /// A block of decoded rows; `Err` lists the rows (by index) whose values do not fit
    /// their columns, with the reason, so the caller can set them aside and build again.
    pub fn build(&self, schema: &SchemaRef, rows: &Rows) -> Result<RecordBatch, Vec<(usize, DecodeError)>> {
        if rows.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(schema)));
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.types.len());
        for (ty, column) in self.types.iter().zip(&rows.columns) {
            match column.build(ty) {
                Ok(array) => columns.push(array),
                Err(_) => return Err(self.bad_rows(rows)),
            }
        }
        RecordBatch::try_new(Arc::clone(schema), columns)
            .map_err(|e| vec![(0, DecodeError::WrongType { column: self.table.clone(), message: e.to_string() })])
    }

    fn bad_rows(&self, rows: &Rows) -> Vec<(usize, DecodeError)> {
        let mut bad = Vec::new();
        // Typed columns took only values that fit; generic ones are checked row by row.
        let generic: Vec<(usize, &[Value])> =
            rows.columns.iter().enumerate().filter_map(|(c, column)| Some((c, column.generic()?))).collect();
        for r in 0..rows.len() {
            for (c, values) in &generic {
                let c = *c;
                if let Err(message) = column_from_values(&self.types[c], std::slice::from_ref(&values[r])) {
                    bad.push((r, DecodeError::WrongType { column: self.names[c].clone(), message }));
                    break;
                }
            }
        }
        bad
    }
}

/// The message timestamp for a DateTime column is in seconds; other columns get milliseconds.
fn timestamp_value(ms: i64, ty: &ChType) -> i64 {
    match ty.value_type() {
        ChType::DateTime => ms.div_euclid(1000),
        _ => ms,
    }
}

fn convert(v: serde_json::Value, conversion: Conversion, column: &str) -> Result<Value, DecodeError> {
    let wrong = |message: String| DecodeError::WrongType { column: column.to_string(), message };
    Ok(match conversion {
        Conversion::ToString => Value::Str(match v {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        }),
        Conversion::ParseNumber => match v {
            serde_json::Value::String(s) if s.trim().parse::<f64>().is_ok() => Value::Number(s.trim().to_string()),
            serde_json::Value::Number(n) => Value::Number(n.to_string()),
            other => return Err(wrong(format!("parse_number: {other} is not a number"))),
        },
        Conversion::FromUnixMillis => match v.as_i64() {
            Some(ms) => Value::Number(ms.div_euclid(1000).to_string()),
            None => return Err(wrong(format!("from_unix_millis: {v} is not a whole number of milliseconds"))),
        },
    })
}

/// Whether a pipeline's `default:` fits its column (checked when the pipeline loads).
pub fn check_default(value: &serde_json::Value, ty: &ChType) -> Result<(), String> {
    column_from_values(ty, &[from_json(value.clone())]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Pipeline;
    use std::path::Path;

    fn decoder() -> (RowDecoder, Projection, SchemaRef) {
        let p = Pipeline::parse(
            "name: t\nsource: { kafka: { brokers: b, topics: [x] } }\nformat: json\ntables:\n  - ddl: \
             CREATE TABLE t (id UInt64, who String, note Nullable(String), n Int32 DEFAULT 7, o UInt64, ts DateTime) \
             ENGINE = MergeTree ORDER BY id\n    columns:\n      id: id\n      who: { key: true }\n      note: note\n      \
             o: { offset: true }\n      ts: { timestamp: true }\n",
            Path::new("."),
        )
        .expect("valid");
        let schema = p.tables[0].def.user_arrow_schema();
        let projection = Projection::new(&p.tables);
        (RowDecoder::new(&p.tables[0], &projection).expect("decoder"), projection, schema)
    }

    fn meta(offset: i64) -> MessageMeta<'static> {
        MessageMeta {
            topic: "x",
            partition: 0,
            offset,
            timestamp_ms: Some(1_700_000_000_500),
            key: Some(b"k"),
            headers: &[],
        }
    }

    #[test]
    fn rows_follow_the_mapping_and_defaults() {
        use arrow::array::{Int32Array, StringArray, TimestampSecondArray, UInt64Array};
        let (d, p, schema) = decoder();
        let mut rows = d.rows();
        let mut doc = p.parse_json(br#"{"id": 5, "extra": 1}"#).expect("object");
        d.decode(&mut doc, &meta(42), &mut rows).expect("row");
        let batch = d.build(&schema, &rows).expect("block");
        let expected: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(vec![5])),
            Arc::new(StringArray::from(vec!["k"])),
            Arc::new(StringArray::from(vec![None::<&str>])),
            Arc::new(Int32Array::from(vec![7])),
            Arc::new(UInt64Array::from(vec![42])),
            Arc::new(TimestampSecondArray::from(vec![1_700_000_000])),
        ];
        for (c, want) in expected.iter().enumerate() {
            assert_eq!(batch.column(c).to_data(), want.to_data(), "column {c}");
        }
    }

    #[test]
    fn bad_messages_name_their_problem() {
        let (d, p, schema) = decoder();
        let mut rows = d.rows();
        let mut decode = |json: &[u8]| d.decode(&mut p.parse_json(json).expect("object"), &meta(1), &mut rows);
        assert_eq!(
            decode(br#"{"note": "x"}"#),
            Err(DecodeError::MissingField { field: "id".into(), column: "id".into() })
        );
        decode(br#"{"id": 1}"#).expect("row");
        decode(br#"{"id": "seven"}"#).expect("decodes; the type is checked in build");
        decode(br#"{"id": 2}"#).expect("row");
        assert_eq!(rows.len(), 3, "the missing field left nothing behind");
        let errors = d.build(&schema, &rows).expect_err("row 1 does not fit");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, 1);
        assert!(errors[0].1.to_string().starts_with("column id: cannot parse 'seven' as UInt64"), "{}", errors[0].1);
        rows.remove(1);
        assert_eq!(d.build(&schema, &rows).expect("the rest fits").num_rows(), 2);
    }
}
