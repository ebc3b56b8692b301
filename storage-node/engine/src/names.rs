//! Table names as users write them, and the directory names they are stored under.
//!
//! A name arrives from SQL or from the network and may hold any character a backquoted
//! identifier can, `/` and `..` included. It is never used as a path as it is: the directory
//! of a table is its name escaped as ClickHouse's `escapeForFileName` does (ASCII letters,
//! digits and `_` kept, every other byte as `%XX`), so no name can reach outside the data
//! directory or collide with the catalog's own entries (`.dropped_*`).

use crate::error::{EngineError, Result};

/// The longest table name, as ClickHouse allows it in a database of the default engine and
/// measures it: in bytes of the escaped name, so that the directory name, with the suffixes
/// ClickHouse adds to a table's metadata file, fits the file system's 255-byte NAME_MAX.
pub const MAX_TABLE_NAME_LENGTH: usize = 206;

/// Checks a table name as ClickHouse checks it at CREATE TABLE. Any other character, `/`,
/// `..` and NUL included, is allowed: it is escaped on its way to the file system.
pub fn validate_table_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(EngineError::BadTableName { name: String::new(), message: "the table name is empty".into() });
    }
    let length = escape_for_file_name(name).len();
    if length > MAX_TABLE_NAME_LENGTH {
        return Err(EngineError::BadTableName {
            name: format!("{}…", name.chars().take(32).collect::<String>()),
            message: format!(
                "the max length of a table name is {MAX_TABLE_NAME_LENGTH}, current length is {length} \
                 (measured escaped for the file system, as ClickHouse measures it)"
            ),
        });
    }
    Ok(())
}

/// The directory name of a table: one path component, whatever the name holds.
pub fn escape_for_file_name(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' {
            escaped.push(byte as char);
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_are_single_safe_components() {
        for name in ["", ".", "..", "../x", "/etc", "a/b", "a\\b", "%41", ".dropped_t", "é", "a b"] {
            let escaped = escape_for_file_name(name);
            assert!(escaped.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'%'), "{escaped}");
            assert!(!escaped.starts_with('.'), "{escaped}");
        }
        assert_eq!(escape_for_file_name("orders_2024"), "orders_2024");
        assert_eq!(escape_for_file_name("../x"), "%2E%2E%2Fx");
        assert_eq!(escape_for_file_name("é"), "%C3%A9");
    }

    #[test]
    fn escaping_is_injective() {
        // `%` itself is escaped, so "%41" and "A" stay apart.
        assert_ne!(escape_for_file_name("%41"), escape_for_file_name("A"));
    }

    #[test]
    fn names_are_checked_as_clickhouse_checks_them() {
        // Each checked against ClickHouse 26.9: `` is a syntax error there, 207 x's and 103
        // é's (618 bytes escaped) are ARGUMENT_OUT_OF_BOUND, a NUL is accepted.
        assert!(validate_table_name("").is_err());
        assert!(validate_table_name("a\0b").is_ok());
        assert!(validate_table_name(&"x".repeat(MAX_TABLE_NAME_LENGTH)).is_ok());
        assert!(validate_table_name(&"x".repeat(MAX_TABLE_NAME_LENGTH + 1)).is_err());
        assert!(validate_table_name(&"é".repeat(103)).is_err());
        assert!(validate_table_name("../../etc").is_ok(), "any other name is fine: it is escaped");
    }
}
