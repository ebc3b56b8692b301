//! ClickHouse's limits on the size and shape of a query, checked on its tokens before anything
//! parses or plans it: `max_query_size`, `max_parser_depth`, `max_ast_depth` and
//! `max_ast_elements`, with ClickHouse's defaults and errors.
//!
//! A statement within these limits is one that ClickHouse parses too; anything past them is
//! refused in time linear in its length, in one pass with an explicit stack, so no statement
//! can exhaust the stack of the thread that later plans it or keep it busy for long.
//!
//! The depth is measured as ClickHouse's AST would have it: a function (an operator is one)
//! is two levels (the function and its argument list), `AND` and `OR` chains are one function
//! of many arguments, a subquery adds the levels of its SELECT. Within one operand of a
//! comma, `AND` or `OR`, every binary operator is counted as a level above the operands: that
//! is exact for the chains that make ASTs deep (`1 + 1 + … + 1`) and an upper bound otherwise.
//! The bases are measured against ClickHouse 26.9 (see the tests).

use super::lexer::{line_col, Token, TokenKind};
use crate::error::{QueryError, Result};

/// ClickHouse's defaults.
#[derive(Debug, Clone, Copy)]
pub struct QueryLimits {
    /// Bytes of a statement's text (INSERT data not included).
    pub max_query_size: usize,
    pub max_parser_depth: usize,
    pub max_ast_depth: usize,
    pub max_ast_elements: usize,
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits { max_query_size: 262_144, max_parser_depth: 1000, max_ast_depth: 1000, max_ast_elements: 50_000 }
    }
}

/// Levels above an expression of the SELECT list (SelectWithUnionQuery, its list, SelectQuery,
/// the select list) and above one of WHERE, PREWHERE or HAVING (no list).
const SELECT_LIST_BASE: usize = 5;
const CONDITION_BASE: usize = 4;
/// Parser recursion before the first expression, and per bracket of each kind.
const PARSER_BASE: usize = 12;
const PARSER_PER_PAREN: usize = 5;
const PARSER_PER_CALL: usize = 1;
const PARSER_PER_SUBQUERY: usize = 10;
/// AST levels a subquery puts between its brackets' expression and the one around it.
const SUBQUERY_LEVELS: usize = 7;

#[derive(Clone, Copy, PartialEq)]
enum Group {
    /// The statement itself.
    Statement,
    /// `(expr)` or a tuple.
    Paren,
    /// `f(args)` or `[items]`.
    Call,
    Subquery,
}

struct Frame {
    group: Group,
    /// AST levels between this group's expressions and the operand it sits in.
    levels: usize,
    /// AST depth at which this group's expressions start, as far as known when it opened.
    base: usize,
    parser_depth: usize,
    /// Binary operators in the current operand (between commas, ANDs and ORs).
    operand_ops: usize,
    /// The deepest bracket in the current operand, in levels above the operand.
    operand_child: usize,
    /// The deepest finished operand, in levels above the group.
    deepest: usize,
    /// The group is an AND / OR chain: one more function over its operands.
    logical: bool,
    /// Levels of the clause the current operand is in (statement and subquery only).
    clause: usize,
}

impl Frame {
    fn new(group: Group, levels: usize, base: usize, parser_depth: usize) -> Frame {
        let clause = if matches!(group, Group::Statement | Group::Subquery) { SELECT_LIST_BASE } else { 0 };
        Frame {
            group,
            levels,
            base,
            parser_depth,
            operand_ops: 0,
            operand_child: 0,
            deepest: 0,
            logical: false,
            clause,
        }
    }

    fn operand_depth(&self) -> usize {
        self.clause + 2 * self.operand_ops + self.operand_child
    }

    fn end_operand(&mut self) {
        self.deepest = self.deepest.max(self.operand_depth());
        self.operand_ops = 0;
        self.operand_child = 0;
    }

    /// Levels of the whole group above its start.
    fn depth(&mut self) -> usize {
        self.end_operand();
        self.deepest + if self.logical { 2 } else { 0 }
    }
}

/// Words after which `(` is not a call: it opens a tuple, a list or an expression.
const NOT_A_FUNCTION: &[&str] = &[
    "AND", "OR", "NOT", "IN", "SELECT", "FROM", "WHERE", "PREWHERE", "HAVING", "ON", "BY", "AS", "WHEN", "THEN",
    "ELSE", "CASE", "IS", "LIKE", "ILIKE", "BETWEEN", "VALUES", "USING", "JOIN", "UNION", "ALL", "DISTINCT", "WITH",
    "LIMIT", "OFFSET", "SETTINGS", "INTERVAL", "FINAL", "ARRAY", "GLOBAL",
];

/// Binary (and prefix) operators: each is a function node over its operands.
const OPERATOR_PUNCT: &[&str] = &["+", "-", "*", "/", "%", "=", "==", "!=", "<>", "<", ">", "<=", ">=", "||", "::"];
const OPERATOR_WORDS: &[&str] = &["LIKE", "ILIKE", "IN", "NOT", "IS", "BETWEEN", "DIV", "MOD"];

/// Clause keywords that start a new expression list of a SELECT, and the levels above it.
fn clause_levels(token: &Token) -> Option<usize> {
    if ["WHERE", "PREWHERE", "HAVING", "QUALIFY"].iter().any(|w| token.is_word(w)) {
        return Some(CONDITION_BASE);
    }
    // A table expression's own levels are those of the subquery in it (SUBQUERY_LEVELS).
    if ["FROM", "JOIN"].iter().any(|w| token.is_word(w)) {
        return Some(0);
    }
    if ["SELECT", "BY", "LIMIT", "OFFSET", "SETTINGS", "USING", "ON", "UNION", "WITH"].iter().any(|w| token.is_word(w))
    {
        return Some(SELECT_LIST_BASE);
    }
    None
}

/// Checks the statement `source[start..end]`, whose tokens are `tokens`. The data of an
/// INSERT (after VALUES or FORMAT) is not a query: ClickHouse reads it with the format's own
/// parser, outside these limits, and so does this one.
pub fn check_statement(source: &str, start: usize, end: usize, tokens: &[Token], limits: &QueryLimits) -> Result<()> {
    let is_insert = tokens.first().is_some_and(|t| t.is_word("INSERT"));
    let data = if is_insert { tokens.iter().position(|t| t.is_word("VALUES") || t.is_word("FORMAT")) } else { None };
    match data {
        Some(at) => check(source, tokens[at].end.saturating_sub(start), &tokens[..=at], limits),
        None => check(source, end.saturating_sub(start), tokens, limits),
    }
}

/// Checks one statement. `text_len` is the length of its text as limited by `max_query_size` (without INSERT
/// data) and `tokens` the tokens to measure; `source` is the whole script, for positions.
pub fn check(source: &str, text_len: usize, tokens: &[Token], limits: &QueryLimits) -> Result<()> {
    let at = |t: &Token, message: String| {
        let (line, column) = line_col(source, t.start);
        QueryError::Limit { line, column, message }
    };
    if let Some(first) = tokens.first() {
        if text_len > limits.max_query_size {
            return Err(at(
                first,
                format!(
                    "Max query size exceeded: the statement is {text_len} bytes, max_query_size is {} (SYNTAX_ERROR)",
                    limits.max_query_size
                ),
            ));
        }
    }
    let too_deep = |t: &Token, depth: usize| {
        at(t, format!("AST is too deep ({depth} levels here). Maximum: {} (TOO_DEEP_AST)", limits.max_ast_depth))
    };
    let mut stack = vec![Frame::new(Group::Statement, 0, 0, PARSER_BASE)];
    // The nodes ClickHouse has above the first expression (measured: see the tests).
    let mut elements = 6usize;
    for (i, token) in tokens.iter().enumerate() {
        let Some(frame) = stack.last_mut() else { break };
        match token.kind {
            TokenKind::Punct if token.text == "(" || token.text == "[" => {
                let previous = i.checked_sub(1).map(|p| &tokens[p]);
                let is_call = token.text == "["
                    || previous.is_some_and(|p| {
                        p.kind == TokenKind::QuotedIdent
                            || (p.kind == TokenKind::Word && !NOT_A_FUNCTION.iter().any(|w| p.is_word(w)))
                    });
                let is_subquery = tokens.get(i + 1).is_some_and(|n| n.is_word("SELECT") || n.is_word("WITH"));
                let (group, cost, levels) = if is_subquery {
                    (Group::Subquery, PARSER_PER_SUBQUERY, SUBQUERY_LEVELS)
                } else if is_call {
                    (Group::Call, PARSER_PER_CALL, 2)
                } else {
                    (Group::Paren, PARSER_PER_PAREN, 0)
                };
                let parser_depth = frame.parser_depth + cost;
                if parser_depth > limits.max_parser_depth {
                    return Err(at(
                        token,
                        format!(
                            "Maximum parse depth ({}) exceeded: brackets nest too deep (TOO_DEEP_RECURSION)",
                            limits.max_parser_depth
                        ),
                    ));
                }
                if is_call {
                    elements += 2;
                }
                let base = frame.base + frame.operand_depth() + levels;
                stack.push(Frame::new(group, levels, base, parser_depth));
            }
            TokenKind::Punct if token.text == ")" || token.text == "]" => {
                if stack.len() == 1 {
                    continue; // Unbalanced: the parser that comes next says so, with its position.
                }
                close_group(&mut stack);
            }
            TokenKind::Punct if token.text == "," => frame.end_operand(),
            // `SELECT *`, `count(*)`, `t.*`: an asterisk after no operand is not a product.
            TokenKind::Punct if token.text == "*" && !follows_operand(tokens, i) => elements += 1,
            TokenKind::Punct if OPERATOR_PUNCT.contains(&token.text.as_str()) => {
                frame.operand_ops += 1;
                elements += 2;
            }
            TokenKind::Word if token.is_word("AND") || token.is_word("OR") => {
                frame.end_operand();
                frame.logical = true;
            }
            TokenKind::Word
                if matches!(frame.group, Group::Statement | Group::Subquery) && clause_levels(token).is_some() =>
            {
                frame.end_operand();
                frame.clause = clause_levels(token).unwrap_or(SELECT_LIST_BASE);
            }
            TokenKind::Word if OPERATOR_WORDS.iter().any(|w| token.is_word(w)) => {
                frame.operand_ops += 1;
                elements += 2;
            }
            _ => elements += 1,
        }
        // What is known so far is a lower bound of the depth: past the limit, it is refused
        // here, at the token that went past it.
        if let Some(frame) = stack.last() {
            let depth = frame.base + frame.operand_depth();
            if depth > limits.max_ast_depth {
                return Err(too_deep(token, depth));
            }
        }
        if elements > limits.max_ast_elements {
            return Err(at(
                token,
                format!("AST is too big. Maximum: {} elements (TOO_BIG_AST)", limits.max_ast_elements),
            ));
        }
    }
    // Operators after a bracket put it deeper than it was when it opened: the whole is
    // measured once more at the end.
    while stack.len() > 1 {
        close_group(&mut stack);
    }
    let depth = stack.last_mut().map_or(0, Frame::depth);
    match tokens.last() {
        Some(last) if depth > limits.max_ast_depth => Err(too_deep(last, depth)),
        _ => Ok(()),
    }
}

fn follows_operand(tokens: &[Token], i: usize) -> bool {
    let Some(previous) = i.checked_sub(1).map(|p| &tokens[p]) else { return false };
    match previous.kind {
        TokenKind::Number | TokenKind::Str | TokenKind::QuotedIdent => true,
        TokenKind::Word => clause_levels(previous).is_none() && !NOT_A_FUNCTION.iter().any(|w| previous.is_word(w)),
        TokenKind::Punct => previous.text == ")" || previous.text == "]",
    }
}

fn close_group(stack: &mut Vec<Frame>) {
    let Some(mut closed) = stack.pop() else { return };
    let depth = closed.depth() + closed.levels;
    if let Some(parent) = stack.last_mut() {
        parent.operand_child = parent.operand_child.max(depth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::lexer::tokenize;

    fn checked(sql: &str) -> std::result::Result<(), String> {
        let tokens = tokenize(sql).map_err(|e| e.to_string())?;
        check(sql, sql.len(), &tokens, &QueryLimits::default()).map_err(|e| e.to_string())
    }

    fn chain(terms: usize) -> String {
        vec!["1"; terms].join("+")
    }

    // Each boundary below is the one ClickHouse 26.9 (chDB) has: the last statement it runs
    // and the first it refuses.
    #[test]
    fn operator_chains_are_as_deep_as_clickhouse_counts_them() {
        assert!(checked(&format!("SELECT {}", chain(498))).is_ok());
        assert!(checked(&format!("SELECT {}", chain(499))).expect_err("refused").contains("TOO_DEEP_AST"));
        assert!(checked(&format!("SELECT a FROM t WHERE a = {}", chain(498))).is_ok());
        assert!(checked(&format!("SELECT a FROM t WHERE a = {}", chain(499))).is_err());
        assert!(checked(&format!("SELECT a FROM t WHERE a = 1 AND a = {}", chain(497))).is_ok());
        assert!(checked(&format!("SELECT a FROM t WHERE a = 1 AND a = {}", chain(498))).is_err());
    }

    #[test]
    fn and_chains_are_one_function() {
        let conditions: Vec<String> = (0..5000).map(|i| format!("a != {i}")).collect();
        assert!(checked(&format!("SELECT count() FROM t WHERE {}", conditions.join(" AND "))).is_ok());
    }

    #[test]
    fn and_chains_count_their_elements() {
        let conditions = |n: usize| (0..n).map(|i| format!("a != {i}")).collect::<Vec<_>>().join(" AND ");
        assert!(checked(&format!("SELECT count() FROM t WHERE {}", conditions(12_497))).is_ok());
        assert!(checked(&format!("SELECT count() FROM t WHERE {}", conditions(12_498)))
            .expect_err("refused")
            .contains("TOO_BIG_AST"));
    }

    #[test]
    fn nested_calls_brackets_and_subqueries() {
        let nest = |n: usize| format!("SELECT {}1{}", "abs(".repeat(n), ")".repeat(n));
        assert!(checked(&nest(497)).is_ok());
        assert!(checked(&nest(498)).expect_err("refused").contains("TOO_DEEP_AST"));
        let parens = |n: usize| format!("SELECT {}1{}", "(".repeat(n), ")".repeat(n));
        assert!(checked(&parens(197)).is_ok());
        assert!(checked(&parens(198)).expect_err("refused").contains("TOO_DEEP_RECURSION"));
        let subqueries = |n: usize| format!("SELECT * FROM {}t{}", "(SELECT * FROM ".repeat(n), ")".repeat(n));
        assert!(checked(&subqueries(98)).is_ok());
        assert!(checked(&subqueries(99)).is_err());
    }

    #[test]
    fn size_and_elements() {
        assert!(checked(&format!("SELECT {}", vec!["1"; 49_980].join(","))).is_ok());
        assert!(checked(&format!("SELECT {}", vec!["1"; 50_001].join(",")))
            .expect_err("refused")
            .contains("TOO_BIG_AST"));
        let long = format!("SELECT '{}'", "x".repeat(300_000));
        assert!(checked(&long).expect_err("refused").contains("Max query size exceeded"));
    }

    #[test]
    fn the_error_names_the_line_and_column_where_the_limit_was_passed() {
        let sql = format!("SELECT 1\n  + {}", chain(600));
        let error = checked(&sql).expect_err("refused");
        assert!(error.contains("2:"), "{error}");
    }

    #[test]
    fn a_million_brackets_are_refused_quickly_and_without_recursion() {
        let sql = format!("SELECT {}", "(".repeat(1_000_000));
        assert!(checked(&sql).is_err());
        let sql = format!("SELECT {}", "f(".repeat(1_000_000));
        assert!(checked(&sql).is_err());
    }
}
