//! Inserted data: `VALUES` tuples and the JSONEachRow format, into Arrow blocks.

mod arrow_block;
mod json;
pub mod value;
mod values;

use arrow::array::RecordBatch;
use mergestream_engine::{ChType, Table};

pub use arrow_block::conform_block;
pub use json::{from_json, parse_json_each_row};
pub use values::parse_values;

use crate::error::{QueryError, Result};
use value::{column_from_values, Value};

/// The value a column gets when an insert leaves it out.
fn default_value(ty: &ChType) -> Value {
    if ty.is_nullable() {
        return Value::Null;
    }
    match ty.value_type() {
        ChType::String | ChType::FixedString(_) => Value::Str(String::new()),
        ChType::Bool => Value::Bool(false),
        ChType::Date | ChType::Date32 => Value::Str("1970-01-01".into()),
        ChType::DateTime | ChType::DateTime64(_) => Value::Number("0".into()),
        ChType::Uuid => Value::Str("00000000-0000-0000-0000-000000000000".into()),
        ChType::Array(_) => Value::Array(vec![]),
        ChType::Map(..) => Value::Map(vec![]),
        _ => Value::Number("0".into()),
    }
}

/// Rows of values for the listed columns (all columns, in order, when `columns` is `None`).
pub struct RowsInput {
    pub columns: Vec<usize>,
    /// `None` where a row leaves the column out: it gets the column's default.
    pub rows: Vec<Vec<Option<Value>>>,
}

/// Resolves an INSERT's column list against the table.
pub fn insert_columns(table: &Table, columns: Option<&[String]>) -> Result<Vec<usize>> {
    let def = table.def();
    match columns {
        None => Ok((0..def.columns.len()).collect()),
        Some(names) => names
            .iter()
            .map(|n| {
                def.column_index(n)
                    .ok_or_else(|| QueryError::Invalid(format!("No such column {n} in table {}", def.name)))
            })
            .collect(),
    }
}

/// A literal as VALUES writes it (`5`, `-1.5`, `'text'`, `[1, 2]`).
pub fn parse_literal(text: &str) -> Result<Value> {
    let rows = values::parse_values(&format!("({text})"), 0, text.len() + 2, vec![0])?;
    rows.rows
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next().flatten())
        .ok_or_else(|| QueryError::Invalid(format!("{text} is not a value")))
}

/// The value an insert that leaves `column` out gets: its DEFAULT, or its type's zero.
pub fn column_default(def: &mergestream_engine::TableDef, column: &mergestream_engine::ColumnDef) -> Result<Value> {
    match def.defaults.get(&column.name) {
        Some(text) => parse_literal(text),
        None => Ok(default_value(&column.ty)),
    }
}

/// Builds the table's block from rows of values.
pub fn build_block(table: &Table, input: RowsInput) -> Result<RecordBatch> {
    let def = table.def();
    let mut columns = Vec::with_capacity(def.columns.len());
    for (i, column) in def.columns.iter().enumerate() {
        let default = column_default(def, column)?;
        let values: Vec<Value> = match input.columns.iter().position(|&c| c == i) {
            Some(at) => input.rows.iter().map(|row| row[at].clone().unwrap_or_else(|| default.clone())).collect(),
            None => vec![default; input.rows.len()],
        };
        let array = column_from_values(&column.ty, &values).map_err(|message| {
            QueryError::Invalid(format!("column {} of table {}: {message}", column.name, def.name))
        })?;
        columns.push(array);
    }
    Ok(RecordBatch::try_new(table.user_schema(), columns)?)
}
