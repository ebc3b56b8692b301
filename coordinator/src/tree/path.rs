//! Path rules of ZooKeeper's `PathUtils.validatePath`.

use crate::proto::codes::ErrorCode;

/// Checks a path as ZooKeeper does; a sequential create is checked with a digit appended, which
/// is why `/a/` is a valid prefix for one.
pub fn validate(path: &str, sequential: bool) -> Result<(), ErrorCode> {
    if sequential {
        return validate_plain(&format!("{path}1"));
    }
    validate_plain(path)
}

fn validate_plain(path: &str) -> Result<(), ErrorCode> {
    if !path.starts_with('/') {
        return Err(ErrorCode::BadArguments);
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(ErrorCode::BadArguments);
    }
    for component in path[1..].split('/') {
        if component.is_empty() || component == "." || component == ".." {
            return Err(ErrorCode::BadArguments);
        }
    }
    if path.chars().any(is_forbidden_char) {
        return Err(ErrorCode::BadArguments);
    }
    Ok(())
}

fn is_forbidden_char(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{f000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
}

/// The parent of a valid non-root path.
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of a valid non-root path.
pub fn name(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// Whether `path` is `ancestor` or below it.
pub fn is_at_or_below(path: &str, ancestor: &str) -> bool {
    ancestor == "/"
        || path == ancestor
        || (path.len() > ancestor.len() && path.starts_with(ancestor) && path.as_bytes()[ancestor.len()] == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_as_zookeeper_judges_them() {
        for good in ["/", "/a", "/a/b", "/a.b", "/..a"] {
            assert_eq!(validate(good, false), Ok(()), "{good}");
        }
        for bad in ["", "a", "/a/", "//", "/a//b", "/a/.", "/a/../b", "/\u{1}", "/a\u{0}"] {
            assert_eq!(validate(bad, false), Err(ErrorCode::BadArguments), "{bad:?}");
        }
        assert_eq!(validate("/a/", true), Ok(()));
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(name("/a/b"), "b");
        assert!(is_at_or_below("/a/b", "/a"));
        assert!(!is_at_or_below("/ab", "/a"));
        assert!(is_at_or_below("/ab", "/"));
    }
}
