//! `?` placeholders of a prepared statement (JDBC's and ADBC's), bound by position to a row of
//! an Arrow batch of parameter values: each `?` becomes the SQL literal of its value, so the
//! bound statement parses, plans and errs exactly as if the client had written the values.
//!
//! A `?` of ClickHouse's ternary operator (`c ? a : b`) is told apart by the `:` that follows
//! it at the same bracket level.

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::DataType;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use super::lexer::{tokenize, Token};
use crate::error::{QueryError, Result};

/// The byte ranges of the placeholders of `sql`, in order.
pub fn placeholders(sql: &str) -> Result<Vec<(usize, usize)>> {
    let tokens = tokenize(sql)?;
    Ok(tokens
        .iter()
        .enumerate()
        .filter(|(i, t)| t.is_punct("?") && !is_ternary(&tokens, *i))
        .map(|(_, t)| (t.start, t.end))
        .collect())
}

fn is_ternary(tokens: &[Token], at: usize) -> bool {
    let mut depth = 0i32;
    for t in &tokens[at + 1..] {
        if t.is_punct("(") || t.is_punct("[") {
            depth += 1;
        } else if t.is_punct(")") || t.is_punct("]") {
            depth -= 1;
            if depth < 0 {
                return false;
            }
        } else if depth == 0 && (t.is_punct(",") || t.is_word("FROM") || t.is_word("WHERE")) {
            return false;
        } else if depth == 0 && t.is_punct(":") {
            return true;
        }
    }
    false
}

/// `sql` with its placeholders replaced by row `row` of `parameters` (column i for the i-th).
pub fn bind(sql: &str, parameters: &RecordBatch, row: usize) -> Result<String> {
    let spans = placeholders(sql)?;
    if spans.len() != parameters.num_columns() {
        return Err(QueryError::Invalid(format!(
            "the statement has {} placeholders and {} parameters were bound",
            spans.len(),
            parameters.num_columns()
        )));
    }
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    for ((start, end), column) in spans.into_iter().zip(parameters.columns()) {
        out.push_str(&sql[at..start]);
        out.push_str(&literal(column.as_ref(), row)?);
        at = end;
    }
    out.push_str(&sql[at..]);
    Ok(out)
}

/// A value as a ClickHouse SQL literal.
fn literal(column: &dyn Array, row: usize) -> Result<String> {
    if column.data_type() == &DataType::Null || column.is_null(row) {
        return Ok("NULL".into());
    }
    let text = ArrayFormatter::try_new(column, &FormatOptions::default())?.value(row).to_string();
    Ok(match column.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(..)
        | DataType::Decimal256(..)
        | DataType::Boolean => text,
        // A timestamp as ClickHouse parses a DateTime literal: no 'T'.
        DataType::Timestamp(..) => quote(&text.replacen('T', " ", 1)),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Date32 | DataType::Date64 => quote(&text),
        other => {
            return Err(QueryError::Unsupported(format!("a parameter of Arrow type {other}")));
        }
    })
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    #[test]
    fn placeholders_skip_strings_and_the_ternary_operator() {
        let sql = "SELECT ?, 'a?b', x > 1 ? 'y' : 'n' FROM t WHERE k = ?";
        let found = placeholders(sql).expect("tokens");
        assert_eq!(found.iter().map(|(s, _)| &sql[*s..*s + 1]).collect::<Vec<_>>(), ["?", "?"]);
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn values_become_literals() {
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![Some(-5), None])) as ArrayRef),
            ("b", Arc::new(StringArray::from(vec!["it's \\ here", "x"])) as ArrayRef),
        ])
        .expect("batch");
        let sql = "INSERT INTO t VALUES (?, ?)";
        assert_eq!(bind(sql, &batch, 0).expect("bind"), r"INSERT INTO t VALUES (-5, 'it\'s \\ here')");
        assert_eq!(bind(sql, &batch, 1).expect("bind"), "INSERT INTO t VALUES (NULL, 'x')");
        assert!(bind("SELECT ?", &batch, 0).is_err(), "two values for one placeholder");
    }
}
