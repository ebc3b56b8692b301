//! `INSERT … VALUES (…), (…)`.

use super::value::Value;
use super::RowsInput;
use crate::error::{QueryError, Result};
use crate::sql::cursor::Cursor;
use crate::sql::lexer::{tokenize, TokenKind};

const MAX_VALUE_DEPTH: usize = 1000;

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
        let row: Vec<Option<Value>> = c.list(")", true, |c| parse_value(c, 1).map(Some))?;
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

/// A value nested `depth` deep (in arrays, tuples, maps, signs and conversion functions);
/// as deep as ClickHouse's `max_parser_depth` at most, so that no row can exhaust the stack.
fn parse_value(c: &mut Cursor<'_>, depth: usize) -> Result<Value> {
    if depth > MAX_VALUE_DEPTH {
        return Err(c.error(format!(
            "Maximum parse depth ({MAX_VALUE_DEPTH}) exceeded: the value nests too deep (TOO_DEEP_RECURSION)"
        )));
    }
    let Some(token) = c.advance() else {
        return Err(c.error("expected a value"));
    };
    let nested = |c: &mut Cursor<'_>| parse_value(c, depth + 1);
    let value = match token.kind {
        TokenKind::Number => Value::Number(token.text.clone()),
        TokenKind::Str => Value::Str(token.text.clone()),
        TokenKind::Punct if token.text == "-" || token.text == "+" => match nested(c)? {
            Value::Number(n) if token.text == "-" => Value::Number(format!("-{n}")),
            Value::Number(n) => Value::Number(n),
            _ => return Err(c.error("expected a number after the sign")),
        },
        TokenKind::Punct if token.text == "[" => Value::Array(c.list("]", true, nested)?),
        TokenKind::Punct if token.text == "(" => Value::Tuple(c.list(")", false, nested)?),
        TokenKind::Punct if token.text == "{" => Value::Map(c.list("}", true, |c| {
            let key = nested(c)?;
            c.expect_punct(":")?;
            Ok((key, nested(c)?))
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
                let args = c.list(")", true, nested)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_nest_up_to_the_parser_depth() {
        // On a thread of the stack queries get, as in the server.
        std::thread::Builder::new()
            .stack_size(crate::QUERY_THREAD_STACK)
            .spawn(nesting_cases)
            .expect("thread")
            .join()
            .expect("no panic");
    }

    fn nesting_cases() {
        let nested = |n: usize| format!("({}1{})", "[".repeat(n), "]".repeat(n));
        let ok = nested(MAX_VALUE_DEPTH - 1);
        assert!(parse_values(&ok, 0, ok.len(), vec![0]).is_ok());
        let deep = nested(100_000);
        let error = parse_values(&deep, 0, deep.len(), vec![0]).map(|_| ()).expect_err("refused").to_string();
        assert!(error.contains("TOO_DEEP_RECURSION"), "{error}");
        let signs = format!("({}1)", "-".repeat(100_000));
        assert!(parse_values(&signs, 0, signs.len(), vec![0]).is_err());
    }
}
