//! `${MERGESTREAM_…}` in a pipeline file: a value read from the environment when the file
//! loads, so that secrets (a SASL password, the registry's credentials) stay out of the file.
//! Only variables named `MERGESTREAM_…` are read, so a pipeline cannot pull in the rest of
//! the ingestor's environment; `$${` writes a literal `${`.

use super::yaml::{Location, Node, Value};

/// The prefix of every variable a pipeline may read.
pub const PREFIX: &str = "MERGESTREAM_";

/// Replaces the variables in every scalar value of the tree (not in block scalars: the DDL
/// is SQL, where `${` means nothing to us). Each problem is a place and what is wrong there.
pub fn expand(node: &mut Node, lookup: &dyn Fn(&str) -> Option<String>) -> Vec<(Location, String)> {
    let mut problems = Vec::new();
    expand_into(node, lookup, &mut problems);
    problems
}

fn expand_into(node: &mut Node, lookup: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<(Location, String)>) {
    match &mut node.value {
        Value::Scalar { text, quoted } if text.contains('$') => match expand_text(text, lookup) {
            Ok(expanded) => *text = expanded,
            Err((offset, message)) => {
                // A one-line scalar's columns are the file's, after its opening quote.
                let at = if text.contains('\n') {
                    node.at
                } else {
                    let column = node.at.column + usize::from(*quoted) + text[..offset].chars().count();
                    Location { line: node.at.line, column }
                };
                problems.push((at, message));
            }
        },
        Value::Scalar { .. } | Value::Block(_) => {}
        Value::Sequence(items) => items.iter_mut().for_each(|item| expand_into(item, lookup, problems)),
        Value::Mapping(entries) => entries.iter_mut().for_each(|(_, value)| expand_into(value, lookup, problems)),
    }
}

/// `text` with its variables replaced, or the byte offset of the first bad one and why.
fn expand_text(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, (usize, String)> {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = text[at..].find("${") {
        let start = at + found;
        if text[..start].ends_with('$') {
            // `$${`: a literal `${`.
            out.push_str(&text[at..start - 1]);
            out.push_str("${");
            at = start + 2;
            continue;
        }
        out.push_str(&text[at..start]);
        let Some(length) = text[start + 2..].find('}') else {
            return Err((start, "`${` without its closing `}` (write `$${` for a literal `${`)".into()));
        };
        let name = &text[start + 2..start + 2 + length];
        let well_formed = name.len() > PREFIX.len()
            && name.starts_with(PREFIX)
            && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !well_formed {
            return Err((
                start,
                format!(
                    "`${{{name}}}`: only variables named {PREFIX}… (capitals, digits, _) are read from the environment"
                ),
            ));
        }
        match lookup(name) {
            Some(value) => out.push_str(&value),
            None => return Err((start, format!("`${{{name}}}`: the environment variable {name} is not set"))),
        }
        at = start + 2 + length + 1;
    }
    out.push_str(&text[at..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "MERGESTREAM_PASSWORD").then(|| "s3cr$t".to_string())
    }

    #[test]
    fn variables_are_replaced_and_the_rest_is_kept() {
        assert_eq!(expand_text("${MERGESTREAM_PASSWORD}", &env), Ok("s3cr$t".into()));
        assert_eq!(expand_text("u:${MERGESTREAM_PASSWORD}@x", &env), Ok("u:s3cr$t@x".into()));
        assert_eq!(expand_text("pa$$word $5", &env), Ok("pa$$word $5".into()));
        assert_eq!(expand_text("$${MERGESTREAM_PASSWORD}", &env), Ok("${MERGESTREAM_PASSWORD}".into()));
    }

    #[test]
    fn bad_variables_are_named_where_they_are() {
        let (offset, message) = expand_text("x ${MERGESTREAM_MISSING}", &env).expect_err("unset");
        assert_eq!(offset, 2);
        assert!(message.contains("MERGESTREAM_MISSING is not set"), "{message}");
        let (_, message) = expand_text("${HOME}", &env).expect_err("not ours");
        assert!(message.contains("only variables named MERGESTREAM_"), "{message}");
        assert!(expand_text("${MERGESTREAM_PASSWORD", &env).is_err());
        assert!(expand_text("${MERGESTREAM_}", &env).is_err());
    }

    #[test]
    fn positions_are_the_files() {
        let mut root = crate::pipeline::yaml::parse("a:\n  b: \"x ${MERGESTREAM_NO}\"\n  c: ${MERGESTREAM_PASSWORD}\n")
            .expect("yaml")
            .expect("a document");
        let problems = expand(&mut root, &env);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, Location { line: 2, column: 9 });
    }
}
