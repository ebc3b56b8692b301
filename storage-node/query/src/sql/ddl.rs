//! CREATE TABLE … ENGINE = … into a [`TableDef`].

use mergestream_engine::key_expr::KeyExpr;
use mergestream_engine::schema::{sort_expression_name, ReplicationArgs, SortExpression};
use mergestream_engine::settings::TableSettings;
use mergestream_engine::{ChType, ColumnDef, EngineError, EngineKind, TableDef};

use super::cursor::Cursor;
use super::lexer::TokenKind;
use super::statement::parse_settings_list;
use crate::error::{QueryError, Result};

pub fn parse_create_table(c: &mut Cursor<'_>) -> Result<TableDef> {
    let name = c.table_name()?;
    let uuid = if c.eat_word("UUID") { Some(parse_uuid_clause(c)?) } else { None };
    c.expect_punct("(")?;
    let mut defaults = std::collections::BTreeMap::new();
    let columns = c.list(")", false, |c| {
        let (column, default) = parse_column(c)?;
        if let Some(default) = default {
            defaults.insert(column.name.clone(), default);
        }
        Ok(column)
    })?;
    let mut engine = None;
    let mut replication = None;
    let mut partition_by = None;
    let mut order_by = None;
    let mut primary_key = None;
    let mut settings = TableSettings::default();
    while !c.is_done() {
        if c.eat_word("ENGINE") {
            c.eat_punct("=");
            let (kind, args) = parse_engine(c)?;
            engine = Some(kind);
            replication = args;
        } else if c.eat_words(&["PARTITION", "BY"]) {
            partition_by = parse_partition_key(c)?;
        } else if c.eat_words(&["ORDER", "BY"]) {
            order_by = Some(parse_key_columns(c)?);
        } else if c.eat_words(&["PRIMARY", "KEY"]) {
            primary_key = Some(parse_key_columns(c)?);
        } else if c.eat_word("SETTINGS") {
            let at = c.offset();
            for (key, value) in parse_settings_list(c)? {
                settings.set(&key, &value).map_err(|e| match e {
                    EngineError::UnknownSetting(s) => {
                        QueryError::syntax(c.source, at, format!("Unknown setting '{s}': for storage MergeTree"))
                    }
                    other => QueryError::Engine(other),
                })?;
            }
        } else if c.eat_word("COMMENT") {
            c.literal("a comment")?;
        } else {
            return Err(c.error("expected ENGINE, PARTITION BY, ORDER BY, PRIMARY KEY or SETTINGS"));
        }
    }
    let engine = engine.ok_or_else(|| c.error("expected ENGINE = <engine>"))?;
    let order_by: Vec<KeyExpr> = match (order_by, &primary_key) {
        (Some(order), _) => order,
        // Without ORDER BY the primary key is the sorting key, as in ClickHouse.
        (None, Some(primary)) => primary.clone(),
        (None, None) => {
            return Err(QueryError::Invalid(
                "Table engine MergeTree requires ORDER BY or PRIMARY KEY clause (with the engine's sorting key)".into(),
            ))
        }
    };
    // Expressions become hidden key columns; the same expression in PRIMARY KEY names the same one.
    let mut sort_expressions: Vec<SortExpression> = Vec::new();
    let mut key_name = |expr: &KeyExpr| -> Result<String> {
        if let KeyExpr::Column(name) = expr {
            return Ok(name.clone());
        }
        if let Some(existing) = sort_expressions.iter().find(|e| &e.expr == expr) {
            return Ok(existing.column.name.clone());
        }
        let ty = expr.result_type(&columns)?;
        let name = sort_expression_name(sort_expressions.len());
        sort_expressions.push(SortExpression { column: ColumnDef { name: name.clone(), ty }, expr: expr.clone() });
        Ok(name)
    };
    let order_by = order_by.iter().map(&mut key_name).collect::<Result<Vec<_>>>()?;
    let primary_key = primary_key.unwrap_or_default().iter().map(&mut key_name).collect::<Result<Vec<_>>>()?;
    if let Some(args) = &replication {
        let with_uuid = args.zookeeper_path.contains("{uuid}") || args.replica_name.contains("{uuid}");
        if with_uuid && uuid.is_none() {
            return Err(QueryError::Invalid(
                "Macro 'uuid' in engine arguments is only supported when the UUID is explicitly specified, \
                 used within an ON CLUSTER query, or when using the Replicated database engine"
                    .into(),
            ));
        }
    }
    let def = TableDef {
        name,
        columns,
        engine,
        partition_by,
        primary_key,
        order_by,
        sort_expressions,
        defaults,
        settings,
        replication,
        uuid,
    };
    // A default must be a value of its column's type.
    for (column, default) in &def.defaults {
        let ty = def.column(column).map(|c| c.ty.clone()).unwrap_or(ChType::String);
        let value = crate::input::parse_literal(default)?;
        crate::input::value::column_from_values(&ty, &[value])
            .map_err(|message| QueryError::Invalid(format!("DEFAULT value {default} of column {column}: {message}")))?;
    }
    def.validate()?;
    Ok(def)
}

/// A column definition and its `DEFAULT` literal, if any.
fn parse_column(c: &mut Cursor<'_>) -> Result<(ColumnDef, Option<String>)> {
    let name = c.ident("a column name")?;
    let start = c.offset();
    // The type runs to the next top-level ',' or ')' or column clause keyword.
    let mut depth = 0usize;
    let mut end = start;
    while let Some(t) = c.peek() {
        if depth == 0
            && (t.is_punct(",")
                || t.is_punct(")")
                || ["DEFAULT", "MATERIALIZED", "ALIAS", "CODEC", "COMMENT", "TTL", "NOT", "NULL", "EPHEMERAL"]
                    .iter()
                    .any(|w| t.is_word(w)))
        {
            break;
        }
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth -= 1;
        }
        end = t.end;
        c.advance();
    }
    if end == start {
        return Err(c.error(format!("expected the type of column {name}")));
    }
    let mut ty =
        ChType::parse(&c.source[start..end]).map_err(|e| QueryError::syntax(c.source, start, e.to_string()))?;
    let mut default = None;
    loop {
        if c.eat_word("NULL") {
            if !ty.is_nullable() {
                ty = ChType::Nullable(Box::new(ty));
            }
        } else if c.eat_words(&["NOT", "NULL"]) {
        } else if c.eat_word("CODEC") {
            c.expect_punct("(")?;
            c.skip_balanced("(", ")")?;
        } else if c.eat_word("COMMENT") {
            c.literal("a comment")?;
        } else if c.eat_word("DEFAULT") {
            let start = c.offset();
            c.literal("a DEFAULT value")?;
            let literal_token_end = c.tokens()[c.position() - 1].end;
            if c.peek_punct("(") {
                return Err(QueryError::syntax(
                    c.source,
                    start,
                    "DEFAULT expressions are not supported yet; use a literal value",
                ));
            }
            default = Some(c.source[start..literal_token_end].to_string());
        } else if c.peek_word("MATERIALIZED") || c.peek_word("ALIAS") {
            return Err(c.error("MATERIALIZED and ALIAS columns are not supported yet"));
        } else {
            break;
        }
    }
    Ok((ColumnDef { name, ty }, default))
}

fn arg_count_error(c: &Cursor<'_>, engine: &str, expected: &str, got: usize) -> QueryError {
    QueryError::syntax(c.source, c.offset(), format!("Storage {engine} requires {expected} parameters, {got} given"))
}

/// `UUID '…'` after the table name: a UUID in its canonical text form.
fn parse_uuid_clause(c: &mut Cursor<'_>) -> Result<String> {
    let at = c.offset();
    match c.advance() {
        Some(t) if t.kind == TokenKind::Str && is_canonical_uuid(&t.text) => Ok(t.text.to_ascii_lowercase()),
        _ => Err(QueryError::syntax(c.source, at, "expected a UUID string literal after UUID")),
    }
}

fn is_canonical_uuid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// `ENGINE = [Replicated]XMergeTree(args)`: the merging engine and, for the replicated ones,
/// the Keeper path and replica name (their leading string arguments, or ClickHouse's defaults).
fn parse_engine(c: &mut Cursor<'_>) -> Result<(EngineKind, Option<ReplicationArgs>)> {
    let at = c.offset();
    let full_name = c.ident("an engine name")?;
    let replicated = full_name.starts_with("Replicated") && full_name.ends_with("MergeTree");
    let name = if replicated { full_name["Replicated".len()..].to_string() } else { full_name.clone() };
    let mut args: Vec<Vec<String>> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    if c.eat_punct("(") && !c.eat_punct(")") {
        loop {
            let literal = c.peek().filter(|t| t.kind == TokenKind::Str || t.kind == TokenKind::Number);
            if c.eat_punct("(") {
                args.push(c.list(")", false, |c| c.ident("a column name"))?);
            } else if let Some(token) = literal {
                if !replicated || !args.is_empty() {
                    return Err(c.error("literal engine arguments are not supported"));
                }
                if token.kind != TokenKind::Str {
                    return Err(c.error("Path in ZooKeeper must be a string literal"));
                }
                paths.push(token.text.clone());
                c.advance();
            } else {
                args.push(vec![c.ident("a column name")?]);
            }
            if c.eat_punct(")") {
                break;
            }
            c.expect_punct(",")?;
        }
    }
    let replication = match (replicated, paths.as_slice()) {
        (false, _) => None,
        (true, []) => Some(ReplicationArgs {
            zookeeper_path: ReplicationArgs::DEFAULT_PATH.into(),
            replica_name: ReplicationArgs::DEFAULT_NAME.into(),
        }),
        (true, [path, replica]) => {
            if path.is_empty() || replica.is_empty() {
                return Err(QueryError::syntax(c.source, at, "Path in ZooKeeper and replica name cannot be empty"));
            }
            Some(ReplicationArgs { zookeeper_path: path.clone(), replica_name: replica.clone() })
        }
        (true, _) => {
            return Err(QueryError::syntax(
                c.source,
                at,
                "Expected two string literal arguments: zookeeper_path and replica_name",
            ))
        }
    };
    let single = |args: &[Vec<String>], i: usize| -> Option<String> {
        args.get(i).and_then(|a| (a.len() == 1).then(|| a[0].clone()))
    };
    let n = args.len();
    let engine = match name.as_str() {
        "MergeTree" if n == 0 => EngineKind::MergeTree,
        "MergeTree" => return Err(arg_count_error(c, &name, "no", n)),
        "ReplacingMergeTree" if n <= 2 => {
            EngineKind::ReplacingMergeTree { version: single(&args, 0), is_deleted: single(&args, 1) }
        }
        "ReplacingMergeTree" => return Err(arg_count_error(c, &name, "0 to 2", n)),
        "SummingMergeTree" if n <= 1 => EngineKind::SummingMergeTree { columns: args.into_iter().next() },
        "SummingMergeTree" => return Err(arg_count_error(c, &name, "0 or 1", n)),
        "AggregatingMergeTree" if n == 0 => EngineKind::AggregatingMergeTree,
        "AggregatingMergeTree" => return Err(arg_count_error(c, &name, "no", n)),
        "CoalescingMergeTree" if n == 0 => EngineKind::CoalescingMergeTree,
        "CoalescingMergeTree" => return Err(arg_count_error(c, &name, "no", n)),
        "CollapsingMergeTree" if n == 1 => EngineKind::CollapsingMergeTree {
            sign: single(&args, 0).ok_or_else(|| c.error("the sign column must be an identifier"))?,
        },
        "CollapsingMergeTree" => return Err(arg_count_error(c, &name, "1", n)),
        "VersionedCollapsingMergeTree" if n == 2 => EngineKind::VersionedCollapsingMergeTree {
            sign: single(&args, 0).ok_or_else(|| c.error("the sign column must be an identifier"))?,
            version: single(&args, 1).ok_or_else(|| c.error("the version column must be an identifier"))?,
        },
        "VersionedCollapsingMergeTree" => return Err(arg_count_error(c, &name, "2", n)),
        _ => return Err(QueryError::syntax(c.source, at, format!("Unknown table engine {full_name}"))),
    };
    Ok((engine, replication))
}

/// `ORDER BY k`, `ORDER BY (a, toDate(ts))`, `ORDER BY tuple()`: columns or expressions.
fn parse_key_columns(c: &mut Cursor<'_>) -> Result<Vec<KeyExpr>> {
    if c.peek_word("tuple") && c.peek_at(1).is_some_and(|t| t.is_punct("(")) {
        c.advance();
        c.advance();
        c.expect_punct(")")?;
        return Ok(vec![]);
    }
    Ok(match parse_key_expr(c)? {
        KeyExpr::Tuple(items) => items,
        single => vec![single],
    })
}

/// A partition key: `None` for `tuple()`.
fn parse_partition_key(c: &mut Cursor<'_>) -> Result<Option<KeyExpr>> {
    if c.peek_word("tuple")
        && c.peek_at(1).is_some_and(|t| t.is_punct("("))
        && c.peek_at(2).is_some_and(|t| t.is_punct(")"))
    {
        c.advance();
        c.advance();
        c.advance();
        return Ok(None);
    }
    let expr = parse_key_expr(c)?;
    Ok(Some(expr))
}

fn parse_key_expr(c: &mut Cursor<'_>) -> Result<KeyExpr> {
    let left = parse_key_primary(c)?;
    for (op, function) in [("%", "modulo"), ("/", "intDiv")] {
        if c.eat_punct(op) {
            let right = parse_key_primary(c)?;
            return Ok(KeyExpr::Call { function: function.into(), args: vec![left, right] });
        }
    }
    Ok(left)
}

fn parse_key_primary(c: &mut Cursor<'_>) -> Result<KeyExpr> {
    if c.eat_punct("(") {
        let mut items = vec![parse_key_expr(c)?];
        while c.eat_punct(",") {
            items.push(parse_key_expr(c)?);
        }
        c.expect_punct(")")?;
        return Ok(if items.len() == 1 { items.remove(0) } else { KeyExpr::Tuple(items) });
    }
    if let Some(t) = c.peek() {
        if t.kind == TokenKind::Number {
            c.advance();
            return t.text.parse().map(KeyExpr::Literal).map_err(|_| c.error("expected an integer"));
        }
    }
    let name = c.ident("a partition key expression")?;
    if c.eat_punct("(") {
        let args = c.list(")", true, parse_key_expr)?;
        return Ok(KeyExpr::Call { function: name, args });
    }
    Ok(KeyExpr::Column(name))
}
