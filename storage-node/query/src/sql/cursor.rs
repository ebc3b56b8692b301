//! A cursor over one statement's tokens, with errors that point into the script.

use super::lexer::{Token, TokenKind};
use crate::error::{QueryError, Result};

pub struct Cursor<'a> {
    pub source: &'a str,
    tokens: &'a [Token],
    pos: usize,
    /// Byte offset just past the statement, for errors at its end.
    end: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(source: &'a str, tokens: &'a [Token], end: usize) -> Cursor<'a> {
        Cursor { source, tokens, pos: 0, end }
    }

    pub fn peek(&self) -> Option<&'a Token> {
        self.tokens.get(self.pos)
    }

    pub fn peek_at(&self, ahead: usize) -> Option<&'a Token> {
        self.tokens.get(self.pos + ahead)
    }

    pub fn advance(&mut self) -> Option<&'a Token> {
        let token = self.tokens.get(self.pos);
        if token.is_some() {
            self.pos += 1;
        }
        token
    }

    pub fn is_done(&self) -> bool {
        self.pos >= self.tokens.len()
    }

    /// Byte offset of the current token, or of the statement's end.
    pub fn offset(&self) -> usize {
        self.peek().map_or(self.end, |t| t.start)
    }

    pub fn statement_end(&self) -> usize {
        self.end
    }

    pub fn error(&self, message: impl Into<String>) -> QueryError {
        let found = match self.peek() {
            Some(t) => format!(", found '{}'", t.text),
            None => ", found the end of the statement".to_string(),
        };
        QueryError::syntax(self.source, self.offset(), format!("{}{found}", message.into()))
    }

    pub fn peek_word(&self, word: &str) -> bool {
        self.peek().is_some_and(|t| t.is_word(word))
    }

    pub fn eat_word(&mut self, word: &str) -> bool {
        if self.peek_word(word) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    pub fn eat_words(&mut self, words: &[&str]) -> bool {
        let matches = words.iter().enumerate().all(|(i, w)| self.peek_at(i).is_some_and(|t| t.is_word(w)));
        if matches {
            self.pos += words.len();
        }
        matches
    }

    pub fn expect_word(&mut self, word: &str) -> Result<()> {
        if self.eat_word(word) {
            Ok(())
        } else {
            Err(self.error(format!("expected {word}")))
        }
    }

    pub fn peek_punct(&self, p: &str) -> bool {
        self.peek().is_some_and(|t| t.is_punct(p))
    }

    pub fn eat_punct(&mut self, p: &str) -> bool {
        if self.peek_punct(p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    pub fn expect_punct(&mut self, p: &str) -> Result<()> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err(self.error(format!("expected '{p}'")))
        }
    }

    pub fn ident(&mut self, what: &str) -> Result<String> {
        match self.peek() {
            Some(t) if matches!(t.kind, TokenKind::Word | TokenKind::QuotedIdent) => {
                self.pos += 1;
                Ok(t.text.clone())
            }
            _ => Err(self.error(format!("expected {what}"))),
        }
    }

    /// `[db.]name`; only the `default` database exists.
    pub fn table_name(&mut self) -> Result<String> {
        let first = self.ident("a table name")?;
        if self.eat_punct(".") {
            let table = self.ident("a table name")?;
            if first != mergestream_engine::catalog::DATABASE {
                return Err(QueryError::Invalid(format!("Database {first} does not exist")));
            }
            return Ok(table);
        }
        Ok(first)
    }

    /// A literal's text: a number (with its sign), a string, or a bare word such as `true`.
    pub fn literal(&mut self, what: &str) -> Result<String> {
        let negative = self.eat_punct("-");
        match self.advance() {
            Some(t) if matches!(t.kind, TokenKind::Number | TokenKind::Str | TokenKind::Word) => {
                Ok(if negative { format!("-{}", t.text) } else { t.text.clone() })
            }
            _ => {
                self.pos = self.pos.saturating_sub(1);
                Err(self.error(format!("expected {what}")))
            }
        }
    }

    /// Items separated by `,` up to `close` (the opening bracket is already consumed). An
    /// empty list is accepted only when `allow_empty`.
    pub fn list<T>(
        &mut self,
        close: &str,
        allow_empty: bool,
        mut item: impl FnMut(&mut Cursor<'a>) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut items = Vec::new();
        if allow_empty && self.eat_punct(close) {
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat_punct(close) {
                return Ok(items);
            }
            self.expect_punct(",")?;
        }
    }

    /// Skips to the matching close of the bracket just consumed; returns the inner tokens' span.
    pub fn skip_balanced(&mut self, open: &str, close: &str) -> Result<(usize, usize)> {
        let start = self.offset();
        let mut depth = 1;
        while let Some(t) = self.advance() {
            if t.is_punct(open) {
                depth += 1;
            } else if t.is_punct(close) {
                depth -= 1;
                if depth == 0 {
                    return Ok((start, t.start));
                }
            }
        }
        Err(self.error(format!("expected '{close}'")))
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn tokens(&self) -> &'a [Token] {
        self.tokens
    }
}
