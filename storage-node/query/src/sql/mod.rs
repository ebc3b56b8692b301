//! ClickHouse SQL text: tokens, statements, CREATE TABLE, and the SELECT rewrite for DataFusion.

pub mod cursor;
pub mod ddl;
#[cfg(test)]
mod fuzz;
pub mod lexer;
pub mod limits;
pub mod parameters;
pub mod rewrite;
pub mod statement;

use crate::error::{QueryError, Result};
use mergestream_engine::schema::TableDef;

/// Parses text that must be exactly one `CREATE TABLE` statement (a pipeline's table DDL).
/// Errors carry the line and column within `text`. Returns the definition and whether the
/// statement said `IF NOT EXISTS`.
pub fn parse_create_table_statement(text: &str) -> Result<(TableDef, bool)> {
    let tokens = lexer::tokenize(text)?;
    let spans = lexer::split_statements(text)?;
    if spans.len() != 1 {
        return Err(QueryError::syntax(
            text,
            spans.get(1).map_or(0, |s| s.0),
            "expected exactly one CREATE TABLE statement",
        ));
    }
    limits::check_statement(text, spans[0].0, spans[0].1, &tokens, &limits::QueryLimits::default())?;
    match statement::parse_statement(text, &tokens, spans[0].1)? {
        statement::Statement::CreateTable { def, if_not_exists } => {
            def.validate()?;
            Ok((*def, if_not_exists))
        }
        _ => Err(QueryError::syntax(text, spans[0].0, "expected a CREATE TABLE statement")),
    }
}
