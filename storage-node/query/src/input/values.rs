//! `INSERT … VALUES (…), (…)`.

use super::value::Value;
use super::RowsInput;
use crate::error::{QueryError, Result};
use crate::sql::cursor::Cursor;
use crate::sql::lexer::{tokenize, TokenKind};

/// Parses the text after VALUES (`source[start..end]`) into rows of `width` values.
pub fn parse_values(source: &str, start: usize, end: usize, columns: Vec<usize>) -> Result<RowsInput> {
    let mut tokens = tokenize(&source[start..end])?;
    for t in &mut tokens {
        t.start += start;
        t.end += start;
    }
    let mut c = Cursor::new(source, &tokens, end);
    let mut rows = Vec::new();
    while !c.is_done() {
        let row_at = c.offset();
        c.expect_punct("(")?;
        let row: Vec<Option<Value>> = c.list(")", true, |c| parse_value(c).map(Some))?;
        if row.len() != columns.len() {
            return Err(QueryError::syntax(
                source,
                row_at,
                format!("expected {} values in the row, found {}", columns.len(), row.len()),
            ));
        }
        rows.push(row);
        c.eat_punct(",");
    }
    Ok(RowsInput { columns, rows })
}

fn parse_value(c: &mut Cursor<'_>) -> Result<Value> {
    let Some(token) = c.advance() else {
        return Err(c.error("expected a value"));
    };
    let value = match token.kind {
        TokenKind::Number => Value::Number(token.text.clone()),
        TokenKind::Str => Value::Str(token.text.clone()),
        TokenKind::Punct if token.text == "-" || token.text == "+" => match parse_value(c)? {
            Value::Number(n) if token.text == "-" => Value::Number(format!("-{n}")),
            Value::Number(n) => Value::Number(n),
            _ => return Err(c.error("expected a number after the sign")),
        },
        TokenKind::Punct if token.text == "[" => Value::Array(c.list("]", true, parse_value)?),
        TokenKind::Punct if token.text == "(" => Value::Tuple(c.list(")", false, parse_value)?),
        TokenKind::Punct if token.text == "{" => Value::Map(c.list("}", true, |c| {
            let key = parse_value(c)?;
            c.expect_punct(":")?;
            Ok((key, parse_value(c)?))
        })?),
        TokenKind::Word => match token.text.to_ascii_lowercase().as_str() {
            "null" => Value::Null,
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "nan" | "inf" | "infinity" => Value::Number(token.text.clone()),
            _ if c.peek_punct("(") => {
                // Conversion functions around a literal: toDate('…'), toDecimal64(1.5, 2), …
                let name = token.text.clone();
                if !(name.starts_with("to") || name == "map" || name == "array" || name == "tuple") {
                    return Err(QueryError::syntax(
                        c.source,
                        token.start,
                        format!("function {name} is not supported in VALUES"),
                    ));
                }
                c.advance();
                let args = c.list(")", true, parse_value)?;
                match name.as_str() {
                    "array" => Value::Array(args),
                    "tuple" => Value::Tuple(args),
                    "map" => Value::Map(
                        args.chunks(2).map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or(Value::Null))).collect(),
                    ),
                    _ => args.into_iter().next().unwrap_or(Value::Null),
                }
            }
            _ => {
                return Err(QueryError::syntax(
                    c.source,
                    token.start,
                    format!("expected a value, found '{}'", token.text),
                ))
            }
        },
        _ => {
            return Err(QueryError::syntax(c.source, token.start, format!("expected a value, found '{}'", token.text)))
        }
    };
    Ok(value)
}
