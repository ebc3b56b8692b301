//! ClickHouse column types and their Arrow representation.
//!
//! A table's schema keeps the ClickHouse type of each column (it decides printing, engine-argument
//! checks and summing); blocks in memory are Arrow arrays of the mapped Arrow type. The ClickHouse
//! type name travels in the Arrow field metadata under [`CH_TYPE_KEY`] so that query results can be
//! printed the way ClickHouse prints them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType as ArrowType, Field, Fields, TimeUnit};

use crate::error::{EngineError, Result};

/// Arrow field metadata key holding the ClickHouse type name.
pub const CH_TYPE_KEY: &str = "clickhouse.type";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ChType {
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    String,
    FixedString(usize),
    Bool,
    Date,
    Date32,
    DateTime,
    DateTime64(u8),
    Uuid,
    Decimal {
        precision: u8,
        scale: u8,
    },
    Nullable(Box<ChType>),
    LowCardinality(Box<ChType>),
    Array(Box<ChType>),
    Map(Box<ChType>, Box<ChType>),
    /// A column that merges aggregate with `function` but holds plain values of `arg`.
    SimpleAggregateFunction {
        function: String,
        arg: Box<ChType>,
    },
    /// Partial aggregation states of a function, merged by AggregatingMergeTree.
    AggregateFunction(crate::aggregate::AggregateFunction),
}

impl ChType {
    /// Parses a ClickHouse type name such as `Nullable(DateTime64(3))`.
    pub fn parse(text: &str) -> Result<ChType> {
        let mut parser = TypeParser { text, pos: 0 };
        let ty = parser.parse_type()?;
        parser.skip_ws();
        if parser.pos != text.len() {
            return Err(parser.error("unexpected text after the type"));
        }
        Ok(ty)
    }

    /// The type with `Nullable`, `LowCardinality` and `SimpleAggregateFunction` wrappers removed:
    /// what the values are.
    pub fn value_type(&self) -> &ChType {
        match self {
            ChType::Nullable(t) | ChType::LowCardinality(t) => t.value_type(),
            ChType::SimpleAggregateFunction { arg, .. } => arg.value_type(),
            t => t,
        }
    }

    pub fn is_nullable(&self) -> bool {
        match self {
            ChType::Nullable(_) => true,
            ChType::LowCardinality(t) => t.is_nullable(),
            _ => false,
        }
    }

    pub fn is_integer(&self) -> bool {
        matches!(
            self,
            ChType::UInt8
                | ChType::UInt16
                | ChType::UInt32
                | ChType::UInt64
                | ChType::Int8
                | ChType::Int16
                | ChType::Int32
                | ChType::Int64
        )
    }

    pub fn is_float(&self) -> bool {
        matches!(self, ChType::Float32 | ChType::Float64)
    }

    /// Numbers that SummingMergeTree adds up (ClickHouse's `isSummable`).
    pub fn is_summable(&self) -> bool {
        self.is_integer() || self.is_float() || matches!(self, ChType::Decimal { .. })
    }

    /// ClickHouse's `canBeUsedAsVersion`: integers, floats, dates and date-times.
    pub fn can_be_version(&self) -> bool {
        self.is_integer()
            || self.is_float()
            || matches!(self, ChType::Date | ChType::Date32 | ChType::DateTime | ChType::DateTime64(_))
    }

    pub fn arrow_type(&self) -> ArrowType {
        match self {
            ChType::UInt8 => ArrowType::UInt8,
            ChType::UInt16 => ArrowType::UInt16,
            ChType::UInt32 => ArrowType::UInt32,
            ChType::UInt64 => ArrowType::UInt64,
            ChType::Int8 => ArrowType::Int8,
            ChType::Int16 => ArrowType::Int16,
            ChType::Int32 => ArrowType::Int32,
            ChType::Int64 => ArrowType::Int64,
            ChType::Float32 => ArrowType::Float32,
            ChType::Float64 => ArrowType::Float64,
            ChType::String => ArrowType::Utf8,
            ChType::FixedString(n) => ArrowType::FixedSizeBinary(*n as i32),
            ChType::Bool => ArrowType::Boolean,
            ChType::Date | ChType::Date32 => ArrowType::Date32,
            ChType::DateTime => ArrowType::Timestamp(TimeUnit::Second, None),
            ChType::DateTime64(p) => ArrowType::Timestamp(datetime64_unit(*p), None),
            ChType::Uuid => ArrowType::FixedSizeBinary(16),
            ChType::Decimal { precision, scale } if *precision <= 38 => ArrowType::Decimal128(*precision, *scale as i8),
            ChType::Decimal { precision, scale } => ArrowType::Decimal256(*precision, *scale as i8),
            ChType::Nullable(t) | ChType::LowCardinality(t) => t.arrow_type(),
            ChType::SimpleAggregateFunction { arg, .. } => arg.arrow_type(),
            ChType::AggregateFunction(_) => ArrowType::Binary,
            ChType::Array(t) => ArrowType::List(Arc::new(t.arrow_field("item"))),
            ChType::Map(k, v) => {
                let entries = Fields::from(vec![Field::new("keys", k.arrow_type(), false), v.arrow_field("values")]);
                ArrowType::Map(Arc::new(Field::new("entries", ArrowType::Struct(entries), false)), false)
            }
        }
    }

    /// An Arrow field of this type, carrying the ClickHouse type name in its metadata.
    pub fn arrow_field(&self, name: &str) -> Field {
        Field::new(name, self.arrow_type(), self.is_nullable())
            .with_metadata(HashMap::from([(CH_TYPE_KEY.to_string(), self.to_string())]))
    }
}

/// DateTime64 values are stored in the coarsest Arrow unit that holds the precision exactly.
pub fn datetime64_unit(precision: u8) -> TimeUnit {
    match precision {
        0 => TimeUnit::Second,
        1..=3 => TimeUnit::Millisecond,
        4..=6 => TimeUnit::Microsecond,
        _ => TimeUnit::Nanosecond,
    }
}

impl fmt::Display for ChType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChType::UInt8 => write!(f, "UInt8"),
            ChType::UInt16 => write!(f, "UInt16"),
            ChType::UInt32 => write!(f, "UInt32"),
            ChType::UInt64 => write!(f, "UInt64"),
            ChType::Int8 => write!(f, "Int8"),
            ChType::Int16 => write!(f, "Int16"),
            ChType::Int32 => write!(f, "Int32"),
            ChType::Int64 => write!(f, "Int64"),
            ChType::Float32 => write!(f, "Float32"),
            ChType::Float64 => write!(f, "Float64"),
            ChType::String => write!(f, "String"),
            ChType::FixedString(n) => write!(f, "FixedString({n})"),
            ChType::Bool => write!(f, "Bool"),
            ChType::Date => write!(f, "Date"),
            ChType::Date32 => write!(f, "Date32"),
            ChType::DateTime => write!(f, "DateTime"),
            ChType::DateTime64(p) => write!(f, "DateTime64({p})"),
            ChType::Uuid => write!(f, "UUID"),
            ChType::Decimal { precision, scale } => write!(f, "Decimal({precision}, {scale})"),
            ChType::Nullable(t) => write!(f, "Nullable({t})"),
            ChType::LowCardinality(t) => write!(f, "LowCardinality({t})"),
            ChType::Array(t) => write!(f, "Array({t})"),
            ChType::Map(k, v) => write!(f, "Map({k}, {v})"),
            ChType::SimpleAggregateFunction { function, arg } => {
                write!(f, "SimpleAggregateFunction({function}, {arg})")
            }
            ChType::AggregateFunction(function) => {
                write!(f, "AggregateFunction({}", function.name)?;
                for arg in &function.args {
                    write!(f, ", {arg}")?;
                }
                write!(f, ")")
            }
        }
    }
}

/// Functions a `SimpleAggregateFunction` column may merge with.
pub const SIMPLE_AGGREGATE_FUNCTIONS: &[&str] = &["sum", "min", "max", "any", "anyLast"];

struct TypeParser<'a> {
    text: &'a str,
    pos: usize,
}

impl TypeParser<'_> {
    fn error(&self, message: &str) -> EngineError {
        EngineError::InvalidType {
            type_name: self.text.to_string(),
            message: format!("{message} at position {}", self.pos + 1),
        }
    }

    fn skip_ws(&mut self) {
        while self.text[self.pos..].starts_with(|c: char| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn word(&mut self) -> &str {
        self.skip_ws();
        let start = self.pos;
        let rest = &self.text[self.pos..];
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        self.pos += len;
        &self.text[start..self.pos]
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.text[self.pos..].starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error(&format!("expected '{c}'")))
        }
    }

    fn number(&mut self) -> Result<u64> {
        let word = self.word().to_string();
        word.parse().map_err(|_| self.error(&format!("expected a number, found '{word}'")))
    }

    fn parse_type(&mut self) -> Result<ChType> {
        let name = self.word().to_string();
        let ty = match name.as_str() {
            "UInt8" => ChType::UInt8,
            "UInt16" => ChType::UInt16,
            "UInt32" => ChType::UInt32,
            "UInt64" => ChType::UInt64,
            "Int8" => ChType::Int8,
            "Int16" => ChType::Int16,
            "Int32" => ChType::Int32,
            "Int64" => ChType::Int64,
            "Float32" => ChType::Float32,
            "Float64" => ChType::Float64,
            "String" => ChType::String,
            "Bool" | "Boolean" => ChType::Bool,
            "Date" => ChType::Date,
            "Date32" => ChType::Date32,
            "UUID" => ChType::Uuid,
            "DateTime" => {
                if self.eat('(') {
                    self.skip_timezone()?;
                }
                ChType::DateTime
            }
            "DateTime64" => {
                self.expect('(')?;
                let p = self.number()?;
                if p > 9 {
                    return Err(self.error("DateTime64 precision must be between 0 and 9"));
                }
                if self.eat(',') {
                    self.skip_timezone()?;
                } else {
                    self.expect(')')?;
                }
                ChType::DateTime64(p as u8)
            }
            "FixedString" => {
                self.expect('(')?;
                let n = self.number()?;
                self.expect(')')?;
                if n == 0 {
                    return Err(self.error("FixedString size must be positive"));
                }
                ChType::FixedString(n as usize)
            }
            "Decimal" => {
                self.expect('(')?;
                let precision = self.number()?;
                let scale = if self.eat(',') { self.number()? } else { 0 };
                self.expect(')')?;
                decimal(precision, scale).map_err(|m| self.error(&m))?
            }
            "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => {
                self.expect('(')?;
                let scale = self.number()?;
                self.expect(')')?;
                let precision = match name.as_str() {
                    "Decimal32" => 9,
                    "Decimal64" => 18,
                    "Decimal128" => 38,
                    _ => 76,
                };
                decimal(precision, scale).map_err(|m| self.error(&m))?
            }
            "Nullable" => ChType::Nullable(Box::new(self.wrapped()?)),
            "LowCardinality" => ChType::LowCardinality(Box::new(self.wrapped()?)),
            "Array" => ChType::Array(Box::new(self.wrapped()?)),
            "Map" => {
                self.expect('(')?;
                let k = self.parse_type()?;
                self.expect(',')?;
                let v = self.parse_type()?;
                self.expect(')')?;
                ChType::Map(Box::new(k), Box::new(v))
            }
            "SimpleAggregateFunction" => {
                self.expect('(')?;
                let function = self.word().to_string();
                if !SIMPLE_AGGREGATE_FUNCTIONS.contains(&function.as_str()) {
                    return Err(self.error(&format!(
                        "unsupported SimpleAggregateFunction function '{function}', expected one of {}",
                        SIMPLE_AGGREGATE_FUNCTIONS.join(", ")
                    )));
                }
                self.expect(',')?;
                let arg = self.parse_type()?;
                self.expect(')')?;
                ChType::SimpleAggregateFunction { function, arg: Box::new(arg) }
            }
            "AggregateFunction" => {
                self.expect('(')?;
                let function = self.word().to_string();
                let mut args = Vec::new();
                while self.eat(',') {
                    args.push(self.parse_type()?);
                }
                self.expect(')')?;
                let function = crate::aggregate::AggregateFunction::new(&function, args)
                    .map_err(|e| self.error(&e.to_string()))?;
                ChType::AggregateFunction(function)
            }
            "" => return Err(self.error("expected a type name")),
            other => return Err(self.error(&format!("unknown data type '{other}'"))),
        };
        Ok(ty)
    }

    fn wrapped(&mut self) -> Result<ChType> {
        self.expect('(')?;
        let t = self.parse_type()?;
        self.expect(')')?;
        Ok(t)
    }

    /// Time zones are accepted and ignored: every value is stored and shown in UTC.
    fn skip_timezone(&mut self) -> Result<()> {
        self.skip_ws();
        let rest = &self.text[self.pos..];
        let end = rest.find(')').ok_or_else(|| self.error("expected ')'"))?;
        self.pos += end + 1;
        Ok(())
    }
}

fn decimal(precision: u64, scale: u64) -> std::result::Result<ChType, String> {
    if !(1..=76).contains(&precision) {
        return Err(format!("Decimal precision {precision} is out of bounds (1..76)"));
    }
    if scale > precision {
        return Err(format!("Decimal scale {scale} is greater than its precision {precision}"));
    }
    Ok(ChType::Decimal { precision: precision as u8, scale: scale as u8 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_nested_types() {
        for name in [
            "UInt64",
            "Nullable(String)",
            "LowCardinality(Nullable(String))",
            "Array(Array(Int32))",
            "Map(String, UInt64)",
            "DateTime64(3)",
            "Decimal(18, 4)",
            "SimpleAggregateFunction(sum, UInt64)",
            "AggregateFunction(uniq, UInt64)",
            "AggregateFunction(argMax, String, DateTime)",
            "AggregateFunction(count)",
            "FixedString(4)",
        ] {
            assert_eq!(ChType::parse(name).expect(name).to_string(), name);
        }
        assert_eq!(ChType::parse("Decimal64(2)").expect("dec").to_string(), "Decimal(18, 2)");
    }

    #[test]
    fn rejects_unknown_types_with_position() {
        let err = ChType::parse("Nullable(Strin)").expect_err("bad type").to_string();
        assert!(err.contains("unknown data type 'Strin'"), "{err}");
        assert!(ChType::parse("UInt64 x").is_err());
    }
}
