//! `INSERT … FORMAT JSONEachRow`: one JSON object per row.

use super::value::Value;
use super::RowsInput;
use crate::error::{QueryError, Result};
use crate::sql::lexer::line_col;

/// A JSON value as an inserted literal.
pub fn from_json(value: serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => Value::Number(n.to_string()),
        serde_json::Value::String(s) => Value::Str(s),
        serde_json::Value::Array(items) => Value::Array(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(map) => {
            Value::Map(map.into_iter().map(|(k, v)| (Value::Str(k), from_json(v))).collect())
        }
    }
}

/// Parses `source[start..end]`; unknown fields are skipped, missing ones get defaults.
pub fn parse_json_each_row(
    source: &str,
    start: usize,
    end: usize,
    names: &[String],
    columns: Vec<usize>,
) -> Result<RowsInput> {
    let text = &source[start..end];
    let mut rows = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    loop {
        let offset = stream.byte_offset();
        let item = match stream.next() {
            None => break,
            Some(item) => item,
        };
        let (line, column) = line_col(source, start + offset);
        let object = match item {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(other) => {
                return Err(QueryError::BadValue {
                    what: "JSONEachRow row".into(),
                    line,
                    column,
                    message: format!("expected a JSON object, found {other}"),
                })
            }
            Err(e) => {
                let (line, column) = line_col(source, start + offset + e.column().saturating_sub(1));
                return Err(QueryError::BadValue {
                    what: "JSONEachRow row".into(),
                    line: line + e.line().saturating_sub(1),
                    column,
                    message: e.to_string(),
                });
            }
        };
        let mut row: Vec<Option<Value>> = vec![None; columns.len()];
        for (key, value) in object {
            if let Some(i) = names.iter().position(|n| *n == key) {
                row[i] = Some(from_json(value));
            }
        }
        rows.push(row);
    }
    Ok(RowsInput { columns, rows })
}
