//! Tokens of ClickHouse SQL, each with its byte span, so that errors can name line:column and
//! rewrites can copy literal text unchanged.

use crate::error::{QueryError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A bare word: keyword, identifier or function name.
    Word,
    /// `"quoted"` or `` `quoted` `` identifier.
    QuotedIdent,
    Number,
    /// `'string'` literal.
    Str,
    Punct,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    /// The token's text: for identifiers and strings the unescaped value.
    pub text: String,
    pub start: usize,
    pub end: usize,
}

impl Token {
    pub fn is_word(&self, word: &str) -> bool {
        self.kind == TokenKind::Word && self.text.eq_ignore_ascii_case(word)
    }

    pub fn is_punct(&self, p: &str) -> bool {
        self.kind == TokenKind::Punct && self.text == p
    }

    /// An identifier, bare or quoted.
    pub fn ident(&self) -> Option<&str> {
        matches!(self.kind, TokenKind::Word | TokenKind::QuotedIdent).then_some(self.text.as_str())
    }
}

/// Line and column (1-based) of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.chars().count(), |nl| before[nl + 1..].chars().count()) + 1;
    (line, col)
}

const PUNCT2: &[&str] = &["<=", ">=", "!=", "<>", "==", "::", "||", "->"];

pub fn tokenize(source: &str) -> Result<Vec<Token>> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if source[i..].starts_with("--") || source[i..].starts_with('#') {
            i = source[i..].find('\n').map_or(bytes.len(), |n| i + n);
            continue;
        }
        if source[i..].starts_with("/*") {
            let end =
                source[i + 2..].find("*/").ok_or_else(|| QueryError::syntax(source, i, "unterminated comment"))?;
            i += end + 4;
            continue;
        }
        let start = i;
        if c == b'\'' || c == b'"' || c == b'`' {
            let (text, end) = quoted(source, i)?;
            let kind = if c == b'\'' { TokenKind::Str } else { TokenKind::QuotedIdent };
            tokens.push(Token { kind, text, start, end });
            i = end;
        } else if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            i += 1;
            while i < bytes.len() {
                let d = bytes[i];
                let exponent_sign = (d == b'+' || d == b'-')
                    && matches!(bytes[i - 1], b'e' | b'E')
                    && !source[start..i].starts_with("0x");
                if d.is_ascii_alphanumeric() || d == b'.' || d == b'_' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            tokens.push(Token { kind: TokenKind::Number, text: source[start..i].to_string(), start, end: i });
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] >= 0x80) {
                i += 1;
            }
            tokens.push(Token { kind: TokenKind::Word, text: source[start..i].to_string(), start, end: i });
        } else {
            let two = source.get(i..i + 2).filter(|t| PUNCT2.contains(t));
            let len = two.map_or(1, |_| 2);
            let ch_len = source[i..].chars().next().map_or(1, char::len_utf8);
            let len = if len == 1 { ch_len } else { len };
            tokens.push(Token { kind: TokenKind::Punct, text: source[i..i + len].to_string(), start, end: i + len });
            i += len;
        }
    }
    Ok(tokens)
}

/// A quoted string or identifier starting at `start`, with ClickHouse's escapes.
fn quoted(source: &str, start: usize) -> Result<(String, usize)> {
    let quote = source.as_bytes()[start] as char;
    let mut out = String::new();
    let mut chars = source[start + 1..].char_indices();
    while let Some((offset, c)) = chars.next() {
        let pos = start + 1 + offset;
        if c == '\\' {
            let Some((_, e)) = chars.next() else { break };
            out.push(match e {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'a' => '\u{7}',
                'v' => '\u{b}',
                other => other,
            });
        } else if c == quote {
            // A doubled quote stands for one.
            if source[pos + 1..].starts_with(quote) {
                chars.next();
                out.push(quote);
            } else {
                return Ok((out, pos + 1));
            }
        } else {
            out.push(c);
        }
    }
    Err(QueryError::syntax(source, start, "unterminated quoted text"))
}

/// Splits a script into statements at top-level semicolons: (text, byte offset of the text).
pub fn split_statements(source: &str) -> Result<Vec<(usize, usize)>> {
    let tokens = tokenize(source)?;
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut last_end = 0;
    for token in &tokens {
        if token.is_punct(";") {
            if let Some(s) = start.take() {
                out.push((s, last_end));
            }
            continue;
        }
        if start.is_none() {
            start = Some(token.start);
        }
        last_end = token.end;
    }
    if let Some(s) = start {
        out.push((s, last_end));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_literals_and_punctuation() {
        let tokens = tokenize("SELECT 'it''s\\n', `k`, 1.5e-3, a<=b -- note\n;").expect("tokens");
        let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["SELECT", "it's\n", ",", "k", ",", "1.5e-3", ",", "a", "<=", "b", ";"]);
    }

    #[test]
    fn splits_statements_outside_quotes() {
        let sql = "SELECT ';'; INSERT INTO t FORMAT JSONEachRow {\"a\": \";\"}\n;";
        let parts: Vec<&str> = split_statements(sql).expect("split").iter().map(|&(s, e)| &sql[s..e]).collect();
        assert_eq!(parts, ["SELECT ';'", "INSERT INTO t FORMAT JSONEachRow {\"a\": \";\"}"]);
    }

    #[test]
    fn positions_are_line_and_column() {
        assert_eq!(line_col("a\nbc", 3), (2, 2));
        let err = tokenize("SELECT\n  'open").expect_err("unterminated").to_string();
        assert!(err.contains("2:3"), "{err}");
    }
}
