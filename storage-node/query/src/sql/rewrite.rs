//! ClickHouse SELECT text → SQL that DataFusion plans.
//!
//! Works on tokens: `t FINAL` becomes a reference to the table's FINAL provider, ClickHouse
//! functions become DataFusion expressions (`toYYYYMM`, `argMax`, `-If` combinators, …), and
//! unaliased select items are named as ClickHouse names them. A trailing `FORMAT` and
//! `SETTINGS` are taken off and returned.

use super::lexer::{tokenize, Token, TokenKind};
use crate::error::{QueryError, Result};

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RewrittenSelect {
    pub sql: String,
    pub format: Option<String>,
    pub settings: Vec<(String, String)>,
    /// The table references that read a table other than plainly (FINAL, or with `_part`):
    /// the SQL names each by [`TableScan::name`], which only this statement's plan resolves.
    pub scans: Vec<TableScan>,
}

/// How one table reference of a statement reads its table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableScan {
    /// The name the rewritten SQL uses for it: the table's name with the clause, as EXPLAIN
    /// then shows it (`t FINAL`).
    pub name: String,
    pub table: String,
    pub final_merge: bool,
    pub part_column: bool,
}

impl TableScan {
    fn new(table: String, final_merge: bool, part_column: bool) -> TableScan {
        let name = match (final_merge, part_column) {
            (true, true) => format!("{table} FINAL _part"),
            (true, false) => format!("{table} FINAL"),
            _ => format!("{table} _part"),
        };
        TableScan { name, table, final_merge, part_column }
    }
}

/// Words after which `(` opens a subquery or list rather than a function call.
const KEYWORDS: &[&str] = &[
    "IN", "FROM", "AS", "OVER", "EXISTS", "AND", "OR", "NOT", "WHERE", "ON", "SELECT", "JOIN", "USING", "WITH", "BY",
    "HAVING", "WHEN", "THEN", "ELSE", "CASE", "VALUES", "LIMIT", "FILTER", "WITHIN", "UNION", "ALL", "DISTINCT", "IS",
    "LIKE", "BETWEEN", "ANY", "ARRAY", "INTERVAL",
];

/// Words that end a table reference (so they are not an alias).
const CLAUSE_WORDS: &[&str] = &[
    "FINAL", "WHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "ON",
    "USING", "UNION", "SETTINGS", "FORMAT", "PREWHERE", "SAMPLE", "ARRAY", "GLOBAL", "ANY", "ALL", "AS", "WINDOW",
    "QUALIFY",
];

/// Whether `any` at `i` is ClickHouse's aggregate function rather than the SQL quantifier
/// of `x = ANY (subquery)`, which follows a comparison.
fn is_any_function(tokens: &[Token], i: usize) -> bool {
    let comparisons = ["=", "==", "!=", "<>", "<", "<=", ">", ">="];
    tokens[i].is_word("ANY") && !(i > 0 && comparisons.iter().any(|op| tokens[i - 1].is_punct(op)))
}

fn is_word_in(token: &Token, words: &[&str]) -> bool {
    token.kind == TokenKind::Word && words.iter().any(|w| token.text.eq_ignore_ascii_case(w))
}

/// The columns of a table, to expand `*` where a virtual column must stay out of it.
pub type ColumnLookup<'a> = &'a dyn Fn(&str) -> Option<Vec<String>>;

pub fn rewrite_select(source: &str, start: usize, end: usize, columns: ColumnLookup<'_>) -> Result<RewrittenSelect> {
    let text = &source[start..end];
    let mut tokens = tokenize(text)?;
    let mut result = RewrittenSelect::default();
    take_trailing_clauses(&mut tokens, text, &mut result)?;
    let uses_part = tokens.iter().any(|t| t.ident() == Some("_part"));
    let star_columns = if uses_part {
        let from = tokens.iter().position(|t| t.is_word("FROM"));
        from.and_then(|i| tokens.get(i + 1)).and_then(|t| t.ident()).and_then(columns)
    } else {
        None
    };
    let tokens = balance_logical_chains(rewrite_table_refs(tokens, uses_part, &mut result.scans));
    let mut out = String::new();
    emit_select(&tokens, &mut out, true, star_columns.as_deref()).map_err(|e| match e {
        QueryError::Syntax { message, .. } => QueryError::syntax(source, start, message),
        other => other,
    })?;
    result.sql = out;
    Ok(result)
}

/// Chains of at least this many AND (or OR) operators are balanced.
const BALANCED_CHAIN: usize = 16;

/// `c1 AND c2 AND … AND cn` as a balanced tree, `((c1 AND c2) AND (c3 AND c4))`, where a chain
/// is long. ClickHouse takes such a chain as one function of n arguments; DataFusion makes it
/// a left-deep tree n levels deep, which its planner walks in quadratic time (a WHERE of 5,000
/// conditions planned for a minute) and its evaluation recurses through (1,000 conditions
/// overflowed a query thread's stack). A balanced tree is log2(n) deep and means the same:
/// AND and OR are associative, in three-valued logic too.
///
/// A chain is one operand list at one bracket level: after WHERE, PREWHERE, HAVING, QUALIFY
/// or ON, or between the brackets of an expression, up to a comma or clause. Only chains of
/// one operator are balanced, and only where no BETWEEN, CASE, lambda or alias at that level
/// could take an AND or an operand for its own; everything else is left as written.
fn balance_logical_chains(tokens: Vec<Token>) -> Vec<Token> {
    if tokens.iter().filter(|t| t.is_word("AND") || t.is_word("OR")).count() < BALANCED_CHAIN {
        return tokens;
    }
    let mut opens = vec![0usize; tokens.len() + 1];
    let mut closes = vec![0usize; tokens.len()];
    // One operand list per bracket level, from the outermost: where it starts, its operators.
    struct Chain {
        start: usize,
        operators: Vec<usize>,
        balanced: bool,
    }
    let starts_chain = |t: &Token| is_word_in(t, &["WHERE", "PREWHERE", "HAVING", "QUALIFY", "ON"]);
    let ends_chain = |t: &Token| {
        t.is_punct(",")
            || is_word_in(
                t,
                &[
                    "SELECT", "FROM", "JOIN", "USING", "GROUP", "ORDER", "LIMIT", "SETTINGS", "FORMAT", "UNION",
                    "WINDOW",
                ],
            )
    };
    let unsafe_here = |t: &Token| {
        is_word_in(t, &["BETWEEN", "CASE", "WHEN", "THEN", "ELSE", "END", "AS"])
            || t.is_punct("?")
            || t.is_punct(":")
            || t.is_punct("->")
    };
    let finish = |chain: Chain, end: usize, opens: &mut Vec<usize>, closes: &mut Vec<usize>| {
        if !chain.balanced || chain.operators.len() < BALANCED_CHAIN || end <= chain.start {
            return;
        }
        let first = &tokens[chain.operators[0]];
        if chain.operators.iter().any(|&i| !tokens[i].text.eq_ignore_ascii_case(&first.text)) {
            return;
        }
        // Operand k spans from after operator k-1 to before operator k.
        let operand = |k: usize| {
            let from = if k == 0 { chain.start } else { chain.operators[k - 1] + 1 };
            let to = if k == chain.operators.len() { end - 1 } else { chain.operators[k] - 1 };
            (from, to)
        };
        let mut ranges = vec![(0, chain.operators.len() + 1)];
        while let Some((l, r)) = ranges.pop() {
            if r - l < 2 {
                continue;
            }
            opens[operand(l).0] += 1;
            closes[operand(r - 1).1] += 1;
            let m = (l + r) / 2;
            ranges.push((l, m));
            ranges.push((m, r));
        }
    };
    let new_chain = |start: usize, balanced: bool| Chain { start, operators: Vec::new(), balanced };
    let mut levels: Vec<Chain> = vec![new_chain(0, false)];
    for (i, t) in tokens.iter().enumerate() {
        if t.is_punct("(") {
            let is_call = i > 0 && tokens[i - 1].kind == TokenKind::Word && !is_word_in(&tokens[i - 1], KEYWORDS);
            let is_subquery = tokens.get(i + 1).is_some_and(|n| n.is_word("SELECT") || n.is_word("WITH"));
            levels.push(new_chain(i + 1, !is_subquery && !is_call));
            continue;
        }
        if t.is_punct(")") {
            if levels.len() > 1 {
                if let Some(chain) = levels.pop() {
                    finish(chain, i, &mut opens, &mut closes);
                }
            }
            continue;
        }
        let Some(chain) = levels.last_mut() else { break };
        if starts_chain(t) || ends_chain(t) {
            let done = std::mem::replace(chain, new_chain(i + 1, starts_chain(t) || t.is_punct(",")));
            finish(done, i, &mut opens, &mut closes);
        } else if t.is_word("AND") || t.is_word("OR") {
            chain.operators.push(i);
        } else if unsafe_here(t) {
            chain.balanced = false;
        }
    }
    while let Some(chain) = levels.pop() {
        finish(chain, tokens.len(), &mut opens, &mut closes);
    }
    let paren = |text: &str, at: usize| Token { kind: TokenKind::Punct, text: text.into(), start: at, end: at };
    let mut out = Vec::with_capacity(tokens.len() + opens.iter().sum::<usize>() * 2);
    for (i, t) in tokens.into_iter().enumerate() {
        out.extend(std::iter::repeat_n(paren("(", t.start), opens[i]));
        let end = t.end;
        out.push(t);
        out.extend(std::iter::repeat_n(paren(")", end), closes[i]));
    }
    out
}

/// Positions of the tokens outside any parentheses.
fn top_level_positions(tokens: &[Token]) -> Vec<usize> {
    let mut depth = 0i32;
    let mut positions = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth -= 1;
        } else if depth == 0 {
            positions.push(i);
        }
    }
    positions
}

/// Takes `SETTINGS k = v, …` and `FORMAT Name` off the end of the outermost query.
fn take_trailing_clauses(tokens: &mut Vec<Token>, text: &str, result: &mut RewrittenSelect) -> Result<()> {
    let format_at = top_level_positions(tokens).into_iter().rev().find(|&i| tokens[i].is_word("FORMAT"));
    if let Some(i) = format_at {
        if i + 2 == tokens.len() {
            result.format = tokens[i + 1].ident().map(str::to_string);
            tokens.truncate(i);
        }
    }
    let settings_at = top_level_positions(tokens).into_iter().rev().find(|&i| tokens[i].is_word("SETTINGS"));
    let Some(i) = settings_at else { return Ok(()) };
    let rest = &tokens[i + 1..];
    let mut j = 0;
    while j < rest.len() {
        let name = rest[j].ident().ok_or_else(|| QueryError::syntax(text, rest[j].start, "expected a setting name"))?;
        if !rest.get(j + 1).is_some_and(|t| t.is_punct("=")) {
            return Err(QueryError::syntax(text, rest[j].start, "expected '=' after the setting name"));
        }
        let value = rest.get(j + 2).ok_or_else(|| QueryError::syntax(text, rest[j].end, "expected a setting value"))?;
        result.settings.push((name.to_string(), value.text.clone()));
        j += 3;
        if rest.get(j).is_some_and(|t| t.is_punct(",")) {
            j += 1;
        }
    }
    tokens.truncate(i);
    Ok(())
}

/// `FROM t [AS a] FINAL` → `FROM "t FINAL" AS a`; with `_part` used, `FROM t` →
/// `FROM "t _part" AS t`. Each such reference is added to `scans`.
fn rewrite_table_refs(tokens: Vec<Token>, uses_part: bool, scans: &mut Vec<TableScan>) -> Vec<Token> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        out.push(t.clone());
        i += 1;
        if !(t.is_word("FROM") || t.is_word("JOIN")) {
            continue;
        }
        let Some(name) = tokens.get(i).and_then(|n| n.ident().map(str::to_string)) else {
            continue;
        };
        // A table function (`numbers(10)`) or a qualified name (`system.parts`) is left alone.
        if tokens.get(i + 1).is_some_and(|n| n.is_punct("(") || n.is_punct(".")) {
            continue;
        }
        let name_token = tokens[i].clone();
        let mut j = i + 1;
        let mut alias = None;
        if tokens.get(j).is_some_and(|a| a.is_word("AS")) {
            alias = tokens.get(j + 1).and_then(|a| a.ident().map(str::to_string));
            j += 2;
        } else if let Some(a) = tokens.get(j) {
            if a.ident().is_some() && !is_word_in(a, CLAUSE_WORDS) {
                alias = Some(a.text.clone());
                j += 1;
            }
        }
        let is_final = tokens.get(j).is_some_and(|f| f.is_word("FINAL"));
        if !is_final && !uses_part {
            continue;
        }
        let scan = TableScan::new(name.clone(), is_final, uses_part);
        out.push(Token { kind: TokenKind::QuotedIdent, text: scan.name.clone(), ..name_token.clone() });
        if !scans.contains(&scan) {
            scans.push(scan);
        }
        out.push(Token { kind: TokenKind::Word, text: "AS".into(), ..name_token.clone() });
        out.push(Token { kind: TokenKind::QuotedIdent, text: alias.unwrap_or(name), ..name_token });
        i = if is_final { j + 1 } else { j };
    }
    out
}

fn matching_paren(tokens: &[Token], open: usize) -> Result<usize> {
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth -= 1;
            if depth == 0 {
                return Ok(i);
            }
        }
    }
    Err(QueryError::Syntax { line: 0, column: 0, message: "unbalanced parentheses".into() })
}

fn split_top_level(tokens: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, t) in tokens.iter().enumerate() {
        if t.is_punct("(") || t.is_punct("[") {
            depth += 1;
        } else if t.is_punct(")") || t.is_punct("]") {
            depth -= 1;
        } else if depth == 0 && t.is_punct(",") {
            parts.push(&tokens[start..i]);
            start = i + 1;
        }
    }
    if start < tokens.len() {
        parts.push(&tokens[start..]);
    }
    parts
}

fn emit_token(t: &Token, out: &mut String) {
    let glue = t.is_punct(".") || out.ends_with('.') || out.ends_with('(') || t.is_punct(")") || t.is_punct(",");
    if !out.is_empty() && !glue && !out.ends_with(' ') {
        out.push(' ');
    }
    match t.kind {
        TokenKind::Str => {
            out.push('\'');
            out.push_str(&t.text.replace('\'', "''"));
            out.push('\'');
        }
        TokenKind::QuotedIdent => {
            out.push('"');
            out.push_str(&t.text.replace('"', "\"\""));
            out.push('"');
        }
        TokenKind::Punct if t.text == "==" => out.push('='),
        _ => out.push_str(&t.text),
    }
}

/// Emits a query; `outermost` names its unaliased select items the ClickHouse way and expands
/// a bare `*` to `star` when given (virtual columns are not part of `*`).
fn emit_select(tokens: &[Token], out: &mut String, outermost: bool, star: Option<&[String]>) -> Result<()> {
    if !outermost {
        return emit(tokens, out);
    }
    let Some(select) = tokens.iter().position(|t| t.is_word("SELECT")) else {
        return emit(tokens, out);
    };
    // The select list ends at the top-level FROM (or the end).
    let mut depth = 0;
    let mut from = tokens.len();
    for (i, t) in tokens.iter().enumerate().skip(select + 1) {
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth -= 1;
        } else if depth == 0 && is_word_in(t, &["FROM", "WHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "UNION"]) {
            from = i;
            break;
        }
    }
    emit(&tokens[..=select], out)?;
    let mut list_start = select + 1;
    if tokens.get(list_start).is_some_and(|t| t.is_word("DISTINCT")) {
        emit_token(&tokens[list_start], out);
        list_start += 1;
    }
    let mut names: Vec<String> = Vec::new();
    for (n, item) in split_top_level(&tokens[list_start..from]).into_iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        if let (Some(star), true) = (star, item.len() == 1 && item[0].is_punct("*")) {
            let quoted: Vec<String> = star.iter().map(|c| format!(" \"{}\"", c.replace('"', "\"\""))).collect();
            out.push_str(&quoted.join(","));
            continue;
        }
        emit(item, out)?;
        let has_alias = item.len() >= 2 && item[item.len() - 2].is_word("AS");
        let plain = item.len() == 1 || item.iter().all(|t| t.ident().is_some() || t.is_punct(".") || t.is_punct("*"));
        let is_star = item.last().is_some_and(|t| t.is_punct("*"));
        if !has_alias && !is_star {
            // ClickHouse allows one name twice in a select list; DataFusion needs unique names,
            // so a repeat gets a numbered one.
            let mut name =
                if plain { item.last().map(|t| t.text.clone()).unwrap_or_default() } else { clickhouse_name(item) };
            let repeats = names.iter().filter(|n| **n == name).count();
            let given = name.clone();
            names.push(given);
            if repeats > 0 {
                name = format!("{name}_{repeats}");
            }
            if !plain || repeats > 0 {
                out.push_str(" AS \"");
                out.push_str(&name.replace('"', "\"\""));
                out.push('"');
            }
        }
    }
    emit(&tokens[from..], out)
}

/// The column name ClickHouse gives an expression: its text with ClickHouse's spacing.
fn clickhouse_name(tokens: &[Token]) -> String {
    let mut out = String::new();
    for (i, t) in tokens.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| &tokens[p]);
        let tight = t.is_punct("(")
            || t.is_punct(")")
            || t.is_punct(",")
            || t.is_punct(".")
            || prev.is_some_and(|p| p.is_punct("(") || p.is_punct("."));
        if i > 0 && !tight {
            out.push(' ');
        }
        match t.kind {
            TokenKind::Str => out.push_str(&format!("'{}'", t.text.replace('\'', "\\'"))),
            _ => out.push_str(&t.text),
        }
        if t.is_punct(",") {
            out.push(' ');
        }
    }
    out.replace("( ", "(").replace(" )", ")").replace("  ", " ")
}

fn emit(tokens: &[Token], out: &mut String) -> Result<()> {
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let is_call = t.kind == TokenKind::Word
            && tokens.get(i + 1).is_some_and(|n| n.is_punct("("))
            && (!is_word_in(t, KEYWORDS) || is_any_function(tokens, i));
        if !is_call {
            // `x = ANY (subquery)` is `x IN (subquery)` (DataFusion's planner takes the former
            // for an array comparison and does not filter by it).
            if t.is_punct("=")
                && tokens.get(i + 1).is_some_and(|n| n.is_word("ANY"))
                && tokens.get(i + 2).is_some_and(|n| n.is_punct("("))
                && tokens.get(i + 3).is_some_and(|n| n.is_word("SELECT") || n.is_word("WITH"))
            {
                out.push_str(" IN");
                i += 2;
                continue;
            }
            if t.is_punct("(") && tokens.get(i + 1).is_some_and(|n| n.is_word("SELECT") || n.is_word("WITH")) {
                let close = matching_paren(tokens, i)?;
                emit_token(t, out);
                emit_select(&tokens[i + 1..close], out, false, None)?;
                emit_token(&tokens[close], out);
                i = close + 1;
                continue;
            }
            emit_token(t, out);
            i += 1;
            continue;
        }
        let close = matching_paren(tokens, i + 1)?;
        let args: Vec<String> = split_top_level(&tokens[i + 2..close])
            .into_iter()
            .map(|arg| {
                let mut s = String::new();
                emit(arg, &mut s).map(|()| s)
            })
            .collect::<Result<_>>()?;
        let call = render_call(&t.text, &args)?;
        if !out.is_empty() && !out.ends_with('(') && !out.ends_with(' ') && !out.ends_with('.') {
            out.push(' ');
        }
        out.push_str(&call);
        i = close + 1;
    }
    Ok(())
}

fn cast(arg: &str, ty: &str) -> String {
    format!("arrow_cast({arg}, '{ty}')")
}

/// A ClickHouse function call as DataFusion SQL; arguments are already rewritten.
fn render_call(name: &str, args: &[String]) -> Result<String> {
    let arg = |i: usize| -> Result<&str> {
        args.get(i).map(String::as_str).ok_or_else(|| {
            QueryError::Invalid(format!("Number of arguments for function {name} doesn't match: passed {}", args.len()))
        })
    };
    let int_types = [
        ("toUInt8", "UInt8"),
        ("toUInt16", "UInt16"),
        ("toUInt32", "UInt32"),
        ("toUInt64", "UInt64"),
        ("toInt8", "Int8"),
        ("toInt16", "Int16"),
        ("toInt32", "Int32"),
        ("toInt64", "Int64"),
        ("toFloat32", "Float32"),
        ("toFloat64", "Float64"),
    ];
    if let Some((_, ty)) = int_types.iter().find(|(f, _)| *f == name) {
        return Ok(cast(arg(0)?, ty));
    }
    if let Some(base) = name.strip_suffix("If").filter(|b| !b.is_empty() && *b != "multi" && *b != "null") {
        if let Some((cond, rest)) = args.split_last() {
            let inner = if base == "count" { "count(*)".to_string() } else { render_call(base, rest)? };
            return Ok(format!("{inner} FILTER (WHERE {cond})"));
        }
    }
    let joined = args.join(", ");
    Ok(match name {
        "count" if args.is_empty() => "count(*)".to_string(),
        // DataFusion's aggregates need an argument; a constant one counts every row.
        "countState" if args.is_empty() => "countState(1)".to_string(),
        "uniq" | "uniqExact" | "uniqCombined" | "uniqHLL12" => format!("count(DISTINCT {joined})"),
        "argMax" => format!("first_value({} ORDER BY {} DESC)", arg(0)?, arg(1)?),
        "argMin" => format!("first_value({} ORDER BY {} ASC)", arg(0)?, arg(1)?),
        "any" => format!("first_value({})", arg(0)?),
        "anyLast" => format!("last_value({})", arg(0)?),
        "groupArray" => format!("array_agg({})", arg(0)?),
        "arraySort" => format!("array_sort({})", arg(0)?),
        "toString" => cast(arg(0)?, "Utf8"),
        "toDate" | "toDate32" => cast(arg(0)?, "Date32"),
        "toDateTime" => cast(arg(0)?, "Timestamp(Second, None)"),
        "toDateTime64" => {
            let unit = match args.get(1).and_then(|p| p.trim().parse::<u8>().ok()).unwrap_or(3) {
                0 => "Second",
                1..=3 => "Millisecond",
                4..=6 => "Microsecond",
                _ => "Nanosecond",
            };
            cast(arg(0)?, &format!("Timestamp({unit}, None)"))
        }
        "toYYYYMM" => cast(&format!("date_part('year', {0}) * 100 + date_part('month', {0})", arg(0)?), "UInt32"),
        "toYYYYMMDD" => cast(
            &format!("date_part('year', {0}) * 10000 + date_part('month', {0}) * 100 + date_part('day', {0})", arg(0)?),
            "UInt32",
        ),
        "toYear" => cast(&format!("date_part('year', {})", arg(0)?), "UInt16"),
        "toMonth" => cast(&format!("date_part('month', {})", arg(0)?), "UInt8"),
        "toDayOfMonth" => cast(&format!("date_part('day', {})", arg(0)?), "UInt8"),
        "toHour" => cast(&format!("date_part('hour', {})", arg(0)?), "UInt8"),
        "toMinute" => cast(&format!("date_part('minute', {})", arg(0)?), "UInt8"),
        "toStartOfHour" => cast(&format!("date_trunc('hour', {})", arg(0)?), "Timestamp(Second, None)"),
        "toStartOfMinute" => cast(&format!("date_trunc('minute', {})", arg(0)?), "Timestamp(Second, None)"),
        "toStartOfDay" => cast(&format!("date_trunc('day', {})", arg(0)?), "Timestamp(Second, None)"),
        "toStartOfMonth" => cast(&format!("date_trunc('month', {})", arg(0)?), "Date32"),
        "toStartOfYear" => cast(&format!("date_trunc('year', {})", arg(0)?), "Date32"),
        "toMonday" => cast(&format!("date_trunc('week', {})", arg(0)?), "Date32"),
        "modulo" => format!("(({}) % ({}))", arg(0)?, arg(1)?),
        "if" => format!("(CASE WHEN {} THEN {} ELSE {} END)", arg(0)?, arg(1)?, arg(2)?),
        "ifNull" => format!("coalesce({joined})"),
        "isNull" => format!("(({}) IS NULL)", arg(0)?),
        "isNotNull" => format!("(({}) IS NOT NULL)", arg(0)?),
        "tuple" => format!("struct({joined})"),
        "currentDatabase" => format!("'{}'", mergestream_engine::catalog::DATABASE),
        _ => format!("{name}({joined})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(sql: &str) -> RewrittenSelect {
        rewrite_select(sql, 0, sql.len(), &|_| Some(vec!["k".to_string()])).expect(sql)
    }

    #[test]
    fn long_and_chains_become_balanced_trees() {
        let conditions: Vec<String> = (0..17).map(|i| format!("k != {i}")).collect();
        let r = rewrite(&format!("SELECT k FROM t WHERE {} ORDER BY k", conditions.join(" AND ")));
        let depth = r.sql.chars().fold((0i32, 0i32), |(d, max), c| match c {
            '(' => (d + 1, max.max(d + 1)),
            ')' => (d - 1, max),
            _ => (d, max),
        });
        assert_eq!(depth, (0, 5), "{}", r.sql);
        assert!(r.sql.starts_with("SELECT k FROM t WHERE ((((k != 0 AND k != 1) AND (k != 2"), "{}", r.sql);
        assert!(r.sql.ends_with("(k != 15 AND k != 16))))) ORDER BY k"), "{}", r.sql);
        // Short chains, mixed chains and chains beside BETWEEN stay as written.
        let short = "SELECT k FROM t WHERE k != 1 AND k != 2";
        assert_eq!(rewrite(short).sql, short);
        let between = format!("SELECT k FROM t WHERE k BETWEEN 1 AND 2 AND {}", conditions.join(" AND "));
        assert!(!rewrite(&between).sql.contains("(("), "{}", rewrite(&between).sql);
        let mixed = format!("SELECT k FROM t WHERE {} OR k = 1", conditions.join(" AND "));
        assert!(!rewrite(&mixed).sql.contains("(("));
    }

    #[test]
    fn final_becomes_the_final_provider() {
        let r = rewrite("SELECT k FROM t FINAL WHERE k > 1");
        assert_eq!(r.sql, "SELECT k FROM \"t FINAL\" AS \"t\" WHERE k > 1");
        assert_eq!(r.scans, vec![TableScan::new("t".into(), true, false)]);
        let r = rewrite("SELECT x.k FROM t AS x FINAL JOIN t AS y FINAL ON x.k = y.k");
        assert_eq!(r.sql, "SELECT x.k FROM \"t FINAL\" AS \"x\" JOIN \"t FINAL\" AS \"y\" ON x.k = y.k");
        assert_eq!(r.scans.len(), 1, "one scan per table and clause: {:?}", r.scans);
        assert!(rewrite("SELECT k FROM t").scans.is_empty());
    }

    #[test]
    fn clickhouse_functions_and_names() {
        let r = rewrite("SELECT any(k) FROM t WHERE k = ANY (SELECT k FROM t)");
        assert_eq!(r.sql, "SELECT first_value(k) AS \"any(k)\" FROM t WHERE k IN (SELECT k FROM t)");
        let r = rewrite("SELECT count(), sumIf(v, v > 1), argMax(s, ver) FROM t");
        assert_eq!(
            r.sql,
            "SELECT count(*) AS \"count()\", sum(v) FILTER (WHERE v > 1) AS \"sumIf(v, v > 1)\", first_value(s ORDER BY ver DESC) AS \"argMax(s, ver)\" FROM t"
        );
    }

    #[test]
    fn trailing_format_and_settings() {
        let r = rewrite(
            "SELECT k FROM t FINAL SETTINGS do_not_merge_across_partitions_select_final = 1 FORMAT JSONEachRow",
        );
        assert_eq!(r.format.as_deref(), Some("JSONEachRow"));
        assert_eq!(r.settings, vec![("do_not_merge_across_partitions_select_final".to_string(), "1".to_string())]);
        assert_eq!(r.sql, "SELECT k FROM \"t FINAL\" AS \"t\"");
    }

    #[test]
    fn part_column_selects_the_virtual_provider() {
        let r = rewrite("SELECT _part, k FROM t ORDER BY _part");
        assert_eq!(r.sql, "SELECT _part, k FROM \"t _part\" AS \"t\" ORDER BY _part");
        assert_eq!(r.scans, vec![TableScan::new("t".into(), false, true)]);
    }
}
