//! The statements of `storage-node local`, parsed from tokens. SELECT text is handed to
//! DataFusion (after [`super::rewrite`]); everything else is parsed here.

use mergestream_engine::replica::SyncMode;
use mergestream_engine::TableDef;

use super::cursor::Cursor;
use super::ddl::parse_create_table;
use super::lexer::{Token, TokenKind};
use crate::error::{QueryError, Result};

/// What `SYSTEM STOP/START` turns off and on for replicated tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationSwitch {
    Fetches,
    Queues,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PartitionSpec {
    /// `PARTITION ID 'x'`.
    Id(String),
    /// `PARTITION <value>`: the value's text, or several for a tuple.
    Value(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum InsertSource {
    /// The text after VALUES, as byte offsets into the script.
    Values {
        start: usize,
        end: usize,
    },
    Format {
        format: String,
        start: usize,
        end: usize,
    },
    Select {
        start: usize,
        end: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    pub table: String,
    pub columns: Option<Vec<String>>,
    pub settings: Vec<(String, String)>,
    pub source: InsertSource,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    CreateTable {
        def: Box<TableDef>,
        if_not_exists: bool,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    ShowTables,
    Describe {
        table: String,
    },
    Insert(Insert),
    Select {
        start: usize,
        end: usize,
    },
    Optimize {
        table: String,
        partition: Option<PartitionSpec>,
        final_merge: bool,
        cleanup: bool,
        /// `SETTINGS k = v, …`: this statement's own, over the session's.
        settings: Vec<(String, String)>,
    },
    SystemMerges {
        table: Option<String>,
        stop: bool,
    },
    /// `SYSTEM STOP/START FETCHES | REPLICATION QUEUES [t]`.
    SystemReplication {
        table: Option<String>,
        switch: ReplicationSwitch,
        stop: bool,
    },
    /// `SYSTEM SYNC REPLICA t [STRICT | LIGHTWEIGHT | PULL]`.
    SyncReplica {
        table: String,
        mode: SyncMode,
    },
    /// `SYSTEM RESTART REPLICA t`.
    RestartReplica {
        table: String,
    },
    /// `SYSTEM RESTORE REPLICA t`.
    RestoreReplica {
        table: String,
    },
    Set {
        settings: Vec<(String, String)>,
    },
}

fn parse_system(c: &mut Cursor) -> Result<Statement> {
    if c.eat_words(&["SYNC", "REPLICA"]) {
        let table = c.table_name()?;
        let mode = if c.eat_word("STRICT") {
            SyncMode::Strict
        } else if c.eat_word("LIGHTWEIGHT") {
            SyncMode::Lightweight
        } else if c.eat_word("PULL") {
            SyncMode::Pull
        } else {
            SyncMode::Default
        };
        return Ok(Statement::SyncReplica { table, mode });
    }
    if c.eat_words(&["RESTART", "REPLICA"]) {
        return Ok(Statement::RestartReplica { table: c.table_name()? });
    }
    if c.eat_words(&["RESTORE", "REPLICA"]) {
        return Ok(Statement::RestoreReplica { table: c.table_name()? });
    }
    let stop = if c.eat_word("STOP") {
        true
    } else if c.eat_word("START") {
        false
    } else {
        return Err(c.error("expected STOP, START, SYNC REPLICA, RESTART REPLICA or RESTORE REPLICA"));
    };
    let switch = if c.eat_word("MERGES") {
        None
    } else if c.eat_word("FETCHES") {
        Some(ReplicationSwitch::Fetches)
    } else if c.eat_words(&["REPLICATION", "QUEUES"]) {
        Some(ReplicationSwitch::Queues)
    } else {
        return Err(c.error("expected MERGES, FETCHES or REPLICATION QUEUES"));
    };
    let table = if c.is_done() { None } else { Some(c.table_name()?) };
    Ok(match switch {
        None => Statement::SystemMerges { table, stop },
        Some(switch) => Statement::SystemReplication { table, switch, stop },
    })
}

pub fn parse_statement(source: &str, tokens: &[Token], end: usize) -> Result<Statement> {
    let mut c = Cursor::new(source, tokens, end);
    let first = c.peek().ok_or_else(|| c.error("expected a statement"))?;
    let statement = if first.is_word("SELECT") || first.is_word("WITH") || first.is_punct("(") {
        return Ok(Statement::Select { start: first.start, end });
    } else if c.eat_word("CREATE") {
        if !c.eat_word("TABLE") {
            return Err(c.error("expected TABLE (only CREATE TABLE is supported)"));
        }
        let if_not_exists = c.eat_words(&["IF", "NOT", "EXISTS"]);
        Statement::CreateTable { def: Box::new(parse_create_table(&mut c)?), if_not_exists }
    } else if c.eat_word("DROP") {
        c.expect_word("TABLE")?;
        let if_exists = c.eat_words(&["IF", "EXISTS"]);
        Statement::DropTable { name: c.table_name()?, if_exists }
    } else if c.eat_word("SHOW") {
        c.expect_word("TABLES")?;
        Statement::ShowTables
    } else if c.eat_word("DESCRIBE") || c.eat_word("DESC") {
        c.eat_word("TABLE");
        Statement::Describe { table: c.table_name()? }
    } else if c.eat_word("INSERT") {
        Statement::Insert(parse_insert(&mut c)?)
    } else if c.eat_word("OPTIMIZE") {
        parse_optimize(&mut c)?
    } else if c.eat_word("SYSTEM") {
        parse_system(&mut c)?
    } else if c.eat_word("SET") {
        Statement::Set { settings: parse_settings_list(&mut c)? }
    } else {
        return Err(c.error("expected a statement (SELECT, INSERT, CREATE TABLE, DROP TABLE, OPTIMIZE, SYSTEM, SHOW TABLES, DESCRIBE, SET)"));
    };
    if !c.is_done() {
        return Err(c.error("unexpected text after the statement"));
    }
    Ok(statement)
}

/// `k = v, k2 = v2`.
pub fn parse_settings_list(c: &mut Cursor<'_>) -> Result<Vec<(String, String)>> {
    let mut settings = Vec::new();
    loop {
        let name = c.ident("a setting name")?;
        c.expect_punct("=")?;
        let value = c.literal("a setting value")?;
        settings.push((name, value));
        if !c.eat_punct(",") {
            return Ok(settings);
        }
    }
}

fn parse_insert(c: &mut Cursor<'_>) -> Result<Insert> {
    c.expect_word("INTO")?;
    c.eat_word("TABLE");
    let table = c.table_name()?;
    let columns = if c.eat_punct("(") { Some(c.list(")", false, |c| c.ident("a column name"))?) } else { None };
    let mut settings = Vec::new();
    if c.eat_word("SETTINGS") {
        settings = parse_settings_list(c)?;
    }
    let end = c.statement_end();
    let source = if c.eat_word("VALUES") {
        InsertSource::Values { start: c.offset(), end }
    } else if c.eat_word("FORMAT") {
        let format_token = c.peek().map(|t| t.end).unwrap_or(end);
        let format = c.ident("a format name")?;
        // The data follows the format name, on the same line or the next ones.
        let start = format_token;
        while c.advance().is_some() {}
        InsertSource::Format { format, start, end }
    } else if c.peek_word("SELECT") || c.peek_word("WITH") {
        InsertSource::Select { start: c.offset(), end }
    } else {
        return Err(c.error("expected VALUES, FORMAT or SELECT"));
    };
    while c.advance().is_some() {}
    Ok(Insert { table, columns, settings, source })
}

fn parse_optimize(c: &mut Cursor<'_>) -> Result<Statement> {
    c.expect_word("TABLE")?;
    let table = c.table_name()?;
    let mut partition = None;
    if c.eat_word("PARTITION") {
        partition = Some(if c.eat_word("ID") {
            match c.advance() {
                Some(t) if t.kind == TokenKind::Str => PartitionSpec::Id(t.text.clone()),
                _ => return Err(c.error("expected the partition id as a string")),
            }
        } else if c.eat_word("tuple") {
            c.expect_punct("(")?;
            c.expect_punct(")")?;
            PartitionSpec::Value(vec![])
        } else if c.eat_punct("(") {
            PartitionSpec::Value(c.list(")", false, |c| c.literal("a partition value"))?)
        } else if c.peek_word("ALL") {
            return Err(QueryError::Unsupported("Only Support DROP/DETACH/ATTACH PARTITION ALL currently".into()));
        } else {
            PartitionSpec::Value(vec![c.literal("a partition value")?])
        });
    }
    let final_merge = c.eat_word("FINAL");
    let cleanup = c.eat_word("CLEANUP");
    let settings = if c.eat_word("SETTINGS") { parse_settings_list(c)? } else { Vec::new() };
    Ok(Statement::Optimize { table, partition, final_merge, cleanup, settings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::lexer;

    fn parse(text: &str) -> Result<Statement> {
        let tokens = lexer::tokenize(text)?;
        parse_statement(text, &tokens, text.len())
    }

    #[test]
    fn optimize_takes_a_settings_clause_after_final_and_cleanup() {
        let Statement::Optimize { table, final_merge, cleanup, settings, .. } =
            parse("OPTIMIZE TABLE t FINAL CLEANUP SETTINGS alter_sync = 2, receive_timeout = 5").expect("parses")
        else {
            panic!("not an OPTIMIZE");
        };
        assert_eq!((table.as_str(), final_merge, cleanup), ("t", true, true));
        let expected = [("alter_sync", "2"), ("receive_timeout", "5")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(settings, expected);
        assert!(parse("OPTIMIZE TABLE t SETTINGS").is_err(), "a setting must follow SETTINGS");
    }

    #[test]
    fn system_restore_replica_names_its_table() {
        let Statement::RestoreReplica { table } = parse("SYSTEM RESTORE REPLICA default.events").expect("parses")
        else {
            panic!("not a RESTORE REPLICA");
        };
        assert_eq!(table, "events");
        let error = parse("SYSTEM RESTORE REPLICA").expect_err("a table must follow").to_string();
        assert!(error.contains("1:23"), "{error}");
    }
}
