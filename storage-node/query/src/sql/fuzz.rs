//! Bounded fuzzing of the SQL front end: statements of random tokens and random nesting go
//! through the limits, the statement parser and the SELECT rewrite. Each must be answered (a
//! statement or an error), none may panic or recurse without bound. Fixed seed; the
//! `MERGESTREAM_FUZZ_ITERATIONS` environment variable runs longer.

use super::lexer::tokenize;
use super::limits::{check_statement, QueryLimits};
use super::rewrite::rewrite_select;
use super::statement::{parse_statement, Statement};

const PIECES: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "(",
    ")",
    "[",
    "]",
    ",",
    "+",
    "-",
    "*",
    "/",
    "=",
    "!=",
    "<",
    "BETWEEN",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "IN",
    "AS",
    "t",
    "x",
    "1",
    "'s'",
    "count",
    "sum",
    "abs",
    "FINAL",
    "GROUP",
    "BY",
    "ORDER",
    "LIMIT",
    "SETTINGS",
    "FORMAT",
    "INSERT",
    "INTO",
    "VALUES",
    "CREATE",
    "TABLE",
    "ENGINE",
    "MergeTree",
    "Array",
    "(SELECT",
    "->",
    "?",
    ":",
    ".",
    "*",
    "_part",
    "ANY",
    "UNION",
    "ALL",
];

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

fn statement(rng: &mut Rng) -> String {
    let mut sql = String::new();
    let length = rng.below(60);
    for _ in 0..length {
        if rng.below(50) == 0 {
            // Deep runs of one piece: brackets, operators, logical chains.
            let piece = ["(", "abs(", "1+", "x AND ", "[", "-"][rng.below(6)];
            sql.push_str(&piece.repeat(rng.below(3000)));
        } else {
            sql.push_str(PIECES[rng.below(PIECES.len())]);
            sql.push(' ');
        }
    }
    sql
}

#[test]
fn random_statements_are_answered_without_panicking() {
    let iterations = std::env::var("MERGESTREAM_FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let mut rng = Rng(0x5151_5151);
    let limits = QueryLimits::default();
    // On a thread of the stack queries get, as in the server.
    let run = move || {
        for _ in 0..iterations {
            let sql = statement(&mut rng);
            let Ok(tokens) = tokenize(&sql) else { continue };
            if check_statement(&sql, 0, sql.len(), &tokens, &limits).is_err() {
                continue;
            }
            if let Ok(Statement::Select { start, end }) = parse_statement(&sql, &tokens, sql.len()) {
                let _ = rewrite_select(&sql, start, end, &|_| None);
            }
        }
    };
    std::thread::Builder::new()
        .stack_size(crate::QUERY_THREAD_STACK)
        .spawn(run)
        .expect("thread")
        .join()
        .expect("no statement panicked");
}
