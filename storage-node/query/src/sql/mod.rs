//! ClickHouse SQL text: tokens, statements, CREATE TABLE, and the SELECT rewrite for DataFusion.

pub mod cursor;
pub mod ddl;
pub mod lexer;
pub mod rewrite;
pub mod statement;
