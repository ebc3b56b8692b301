//! A YAML document as a tree whose every node knows its line and column, so that validation
//! can point at the exact place of each problem (serde's YAML errors stop at the first one).

use std::fmt;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A 1-based line and column in the pipeline file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

impl From<Marker> for Location {
    fn from(m: Marker) -> Self {
        // yaml-rust2 counts lines from 1 and columns from 0.
        Location { line: m.line(), column: m.col() + 1 }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar as written; `quoted` scalars (and block scalars) are always strings.
    Scalar {
        text: String,
        quoted: bool,
    },
    /// A literal (`|`) or folded (`>`) block scalar: its node's place is its first content
    /// line, so positions inside the text map line by line onto the file.
    Block(String),
    Sequence(Vec<Node>),
    Mapping(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub at: Location,
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } if self.is_null() => "null",
            Value::Scalar { .. } | Value::Block(_) => "a scalar",
            Value::Sequence(_) => "a list",
            Value::Mapping(_) => "a mapping",
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, quoted: false } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    pub fn as_scalar(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } | Value::Block(text) => Some(text),
            _ => None,
        }
    }
}

/// A document that is not YAML at all.
#[derive(Debug, Clone)]
pub struct SyntaxError {
    pub at: Location,
    pub message: String,
}

/// Parses one YAML document. Anchors and aliases are refused by the validation that follows
/// (an alias becomes a null node here): pipelines are short and explicit.
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(text);
    parser
        .load(&mut builder, false)
        .map_err(|e| SyntaxError { at: Location::from(*e.marker()), message: e.info().to_string() })?;
    Ok(builder.root)
}

#[derive(Default)]
struct TreeBuilder {
    /// Open sequences and mappings; a mapping's pending key waits beside it.
    stack: Vec<(Node, Option<Node>)>,
    root: Option<Node>,
}

impl TreeBuilder {
    fn push_value(&mut self, node: Node) {
        let Some((parent, pending_key)) = self.stack.last_mut() else {
            self.root.get_or_insert(node);
            return;
        };
        match &mut parent.value {
            Value::Sequence(items) => items.push(node),
            Value::Mapping(entries) => match pending_key.take() {
                Some(key) => entries.push((key, node)),
                None => *pending_key = Some(node),
            },
            Value::Scalar { .. } | Value::Block(_) => {}
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let at = Location::from(mark);
        match event {
            Event::Scalar(text, style, _, _) => {
                use yaml_rust2::scanner::TScalarStyle;
                let value = match style {
                    TScalarStyle::Plain => Value::Scalar { text, quoted: false },
                    TScalarStyle::Literal | TScalarStyle::Folded => Value::Block(text),
                    TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted => Value::Scalar { text, quoted: true },
                };
                self.push_value(Node { value, at });
            }
            Event::Alias(_) => {
                self.push_value(Node { value: Value::Scalar { text: String::new(), quoted: false }, at })
            }
            Event::SequenceStart(..) => self.stack.push((Node { value: Value::Sequence(Vec::new()), at }, None)),
            Event::MappingStart(..) => self.stack.push((Node { value: Value::Mapping(Vec::new()), at }, None)),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((mut node, _)) = self.stack.pop() {
                    // A block mapping's start mark lies after its first key; the key is where
                    // a reader looks.
                    if let Value::Mapping(entries) = &node.value {
                        if let Some((first, _)) = entries.first() {
                            node.at = node.at.min(first.at);
                        }
                    }
                    self.push_value(node);
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_know_where_they_are() {
        let root = parse("name: x\nsource:\n  kafka:\n    topics: [a, \"b\"]\n").expect("yaml").expect("a document");
        let Value::Mapping(entries) = &root.value else { panic!("a mapping") };
        assert_eq!(entries[0].0.at, Location { line: 1, column: 1 });
        assert_eq!(entries[0].1.at, Location { line: 1, column: 7 });
        let Value::Mapping(source) = &entries[1].1.value else { panic!("a mapping") };
        let Value::Mapping(kafka) = &source[0].1.value else { panic!("a mapping") };
        assert_eq!(kafka[0].0.at, Location { line: 4, column: 5 });
        let Value::Sequence(topics) = &kafka[0].1.value else { panic!("a list") };
        assert_eq!(topics[1].value, Value::Scalar { text: "b".into(), quoted: true });
        assert_eq!(topics[1].at, Location { line: 4, column: 17 });
    }

    #[test]
    fn a_syntax_error_has_a_place() {
        let err = parse("a: [1, 2\nb: 3\n").expect_err("unclosed list");
        assert!(err.at.line >= 1 && !err.message.is_empty(), "{err:?}");
    }
}
