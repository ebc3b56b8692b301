//! `AggregateFunction(f, T…)` columns: partial aggregation states that merges combine.
//!
//! A state is opaque bytes in an Arrow `Binary` column (its own encoding, not ClickHouse's).
//! AggregatingMergeTree merges states here; the query layer creates them (`fState`), merges
//! them (`fMerge`) and finalizes them (`finalizeAggregation`) with the same code.

use std::collections::BTreeSet;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType as ArrowType;

use crate::error::{EngineError, Result};
use crate::merge::values::{float_value, int_value};
use crate::types::ChType;

/// Functions whose states AggregateFunction columns can hold.
pub const STATE_FUNCTIONS: &[&str] =
    &["sum", "count", "min", "max", "avg", "any", "anyLast", "uniq", "uniqExact", "argMin", "argMax", "groupArray"];

/// A value inside a state.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
pub enum AggValue {
    Null,
    Int(i128),
    Float(f64),
    Bytes(Vec<u8>),
    Array(Vec<AggValue>),
}

impl AggValue {
    /// The value at `row` of `array`.
    pub fn at(array: &dyn Array, row: usize) -> AggValue {
        if array.is_null(row) {
            return AggValue::Null;
        }
        match array.data_type() {
            ArrowType::Utf8 => AggValue::Bytes(array.as_string::<i32>().value(row).as_bytes().to_vec()),
            ArrowType::LargeUtf8 => AggValue::Bytes(array.as_string::<i64>().value(row).as_bytes().to_vec()),
            ArrowType::Utf8View => AggValue::Bytes(array.as_string_view().value(row).as_bytes().to_vec()),
            ArrowType::Binary => AggValue::Bytes(array.as_binary::<i32>().value(row).to_vec()),
            ArrowType::FixedSizeBinary(_) => AggValue::Bytes(array.as_fixed_size_binary().value(row).to_vec()),
            ArrowType::Float32 | ArrowType::Float64 => AggValue::Float(float_value(array, row).unwrap_or(f64::NAN)),
            _ => int_value(array, row).map_or(AggValue::Null, AggValue::Int),
        }
    }

    fn cmp_total(&self, other: &AggValue) -> std::cmp::Ordering {
        self.partial_cmp(other).unwrap_or(std::cmp::Ordering::Equal)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            AggValue::Null => out.push(0),
            AggValue::Int(v) => {
                out.push(1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            AggValue::Float(v) => {
                out.push(2);
                out.extend_from_slice(&v.to_le_bytes());
            }
            AggValue::Bytes(b) => {
                out.push(3);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
            AggValue::Array(items) => {
                out.push(4);
                out.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.pos + n;
        let slice = self.bytes.get(self.pos..end).ok_or_else(|| corrupt("truncated state"))?;
        self.pos = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn value(&mut self) -> Result<AggValue> {
        Ok(match self.u8()? {
            0 => AggValue::Null,
            1 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(self.take(16)?);
                AggValue::Int(i128::from_le_bytes(a))
            }
            2 => AggValue::Float(f64::from_bits(self.u64()?)),
            3 => {
                let n = self.u32()? as usize;
                AggValue::Bytes(self.take(n)?.to_vec())
            }
            4 => {
                let n = self.u32()? as usize;
                (0..n).map(|_| self.value()).collect::<Result<Vec<_>>>().map(AggValue::Array)?
            }
            tag => return Err(corrupt(&format!("unknown value tag {tag}"))),
        })
    }
}

fn corrupt(message: &str) -> EngineError {
    EngineError::BadInsert { table: String::new(), message: format!("invalid aggregate function state: {message}") }
}

/// One aggregate function and the types of its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AggregateFunction {
    pub name: String,
    pub args: Vec<ChType>,
}

impl AggregateFunction {
    pub fn new(name: &str, args: Vec<ChType>) -> Result<AggregateFunction> {
        if !STATE_FUNCTIONS.contains(&name) {
            return Err(EngineError::InvalidType {
                type_name: format!("AggregateFunction({name}, …)"),
                message: format!("unsupported aggregate function {name}; supported: {}", STATE_FUNCTIONS.join(", ")),
            });
        }
        let expected = match name {
            "count" => 0..=1,
            "argMin" | "argMax" => 2..=2,
            _ => 1..=1,
        };
        if !expected.contains(&args.len()) {
            return Err(EngineError::InvalidType {
                type_name: format!("AggregateFunction({name}, …)"),
                message: format!("aggregate function {name} takes {expected:?} arguments, {} given", args.len()),
            });
        }
        Ok(AggregateFunction { name: name.to_string(), args })
    }

    /// The ClickHouse type of the finalized value.
    pub fn result_type(&self) -> ChType {
        let arg = self.args.first().map(|a| a.value_type().clone()).unwrap_or(ChType::UInt64);
        match self.name.as_str() {
            "count" | "uniq" | "uniqExact" => ChType::UInt64,
            "avg" => ChType::Float64,
            "sum" => match arg {
                ChType::Float32 | ChType::Float64 => ChType::Float64,
                ChType::Decimal { scale, .. } => ChType::Decimal { precision: 38, scale },
                ChType::UInt8 | ChType::UInt16 | ChType::UInt32 | ChType::UInt64 | ChType::Bool => ChType::UInt64,
                _ => ChType::Int64,
            },
            "groupArray" => ChType::Array(Box::new(arg)),
            _ => arg,
        }
    }

    pub fn empty_state(&self) -> State {
        match self.name.as_str() {
            "sum" => State::Sum(None),
            "count" => State::Count(0),
            "avg" => State::Avg { sum: 0.0, count: 0 },
            "uniq" | "uniqExact" => State::Distinct(BTreeSet::new()),
            "groupArray" => State::List(Vec::new()),
            "argMin" | "argMax" => State::Pair(None),
            _ => State::One(None),
        }
    }

    /// Adds one row of argument values.
    pub fn add(&self, state: &mut State, args: &[AggValue]) {
        let first = args.first().cloned().unwrap_or(AggValue::Null);
        if self.name != "count" && first == AggValue::Null {
            return;
        }
        match (self.name.as_str(), state) {
            ("sum", State::Sum(acc)) => *acc = Some(add_values(acc.take(), &first)),
            ("count", State::Count(n)) if args.is_empty() || first != AggValue::Null => *n += 1,
            ("avg", State::Avg { sum, count }) => {
                *sum += as_f64(&first);
                *count += 1;
            }
            ("uniq" | "uniqExact", State::Distinct(set)) => {
                let mut bytes = Vec::new();
                first.encode(&mut bytes);
                set.insert(bytes);
            }
            ("groupArray", State::List(items)) => items.push(first),
            ("min", State::One(best)) if best.as_ref().is_none_or(|b| first.cmp_total(b).is_lt()) => {
                *best = Some(first)
            }
            ("max", State::One(best)) if best.as_ref().is_none_or(|b| first.cmp_total(b).is_gt()) => {
                *best = Some(first)
            }
            ("any", State::One(best)) if best.is_none() => *best = Some(first),
            ("anyLast", State::One(best)) => *best = Some(first),
            (name @ ("argMin" | "argMax"), State::Pair(best)) => {
                let key = args.get(1).cloned().unwrap_or(AggValue::Null);
                let better = match best {
                    None => true,
                    Some((_, b)) if name == "argMin" => key.cmp_total(b).is_lt(),
                    Some((_, b)) => key.cmp_total(b).is_gt(),
                };
                if better {
                    *best = Some((first, key));
                }
            }
            _ => {}
        }
    }

    /// Merges `other` (a later state) into `state`.
    pub fn merge(&self, state: &mut State, other: State) {
        match (state, other) {
            (State::Sum(a), State::Sum(Some(b))) => *a = Some(add_values(a.take(), &b)),
            (State::Count(a), State::Count(b)) => *a += b,
            (State::Avg { sum, count }, State::Avg { sum: s, count: c }) => {
                *sum += s;
                *count += c;
            }
            (State::Distinct(a), State::Distinct(b)) => a.extend(b),
            (State::List(a), State::List(b)) => a.extend(b),
            (state @ State::One(_), State::One(Some(v))) => self.add(state, &[v]),
            (state @ State::Pair(_), State::Pair(Some((a, k)))) => self.add(state, &[a, k]),
            _ => {}
        }
    }

    /// The finalized value.
    pub fn finalize(&self, state: &State) -> AggValue {
        match state {
            State::Sum(v) => v.clone().unwrap_or(match self.result_type() {
                ChType::Float64 => AggValue::Float(0.0),
                _ => AggValue::Int(0),
            }),
            State::Count(n) => AggValue::Int(*n as i128),
            State::Avg { sum, count } => AggValue::Float(if *count == 0 { f64::NAN } else { sum / *count as f64 }),
            State::Distinct(set) => AggValue::Int(set.len() as i128),
            State::List(items) => AggValue::Array(items.clone()),
            State::One(v) => v.clone().unwrap_or_else(|| default_of(&self.result_type())),
            State::Pair(v) => v.as_ref().map(|(a, _)| a.clone()).unwrap_or_else(|| default_of(&self.result_type())),
        }
    }
}

/// ClickHouse returns the type's default for an empty min/max/any.
fn default_of(ty: &ChType) -> AggValue {
    match ty.value_type() {
        ChType::String | ChType::FixedString(_) => AggValue::Bytes(Vec::new()),
        t if t.is_float() => AggValue::Float(0.0),
        _ if ty.is_nullable() => AggValue::Null,
        _ => AggValue::Int(0),
    }
}

fn as_f64(v: &AggValue) -> f64 {
    match v {
        AggValue::Int(i) => *i as f64,
        AggValue::Float(f) => *f,
        _ => 0.0,
    }
}

fn add_values(acc: Option<AggValue>, v: &AggValue) -> AggValue {
    match (acc, v) {
        (None, v) => v.clone(),
        (Some(AggValue::Int(a)), AggValue::Int(b)) => AggValue::Int(a.wrapping_add(*b)),
        (Some(a), b) => AggValue::Float(as_f64(&a) + as_f64(b)),
    }
}

/// A partial aggregation state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Sum(Option<AggValue>),
    Count(u64),
    Avg {
        sum: f64,
        count: u64,
    },
    /// Encoded distinct values (uniq, uniqExact: exact counts).
    Distinct(BTreeSet<Vec<u8>>),
    List(Vec<AggValue>),
    /// min, max, any, anyLast.
    One(Option<AggValue>),
    /// argMin / argMax: (argument, key).
    Pair(Option<(AggValue, AggValue)>),
}

impl State {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![1u8];
        match self {
            State::Sum(v) => {
                out.push(0);
                v.clone().unwrap_or(AggValue::Null).encode(&mut out);
            }
            State::Count(n) => {
                out.push(1);
                out.extend_from_slice(&n.to_le_bytes());
            }
            State::Avg { sum, count } => {
                out.push(2);
                out.extend_from_slice(&sum.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            State::Distinct(set) => {
                out.push(3);
                out.extend_from_slice(&(set.len() as u32).to_le_bytes());
                for item in set {
                    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
                    out.extend_from_slice(item);
                }
            }
            State::List(items) => {
                out.push(4);
                AggValue::Array(items.clone()).encode(&mut out);
            }
            State::One(v) => {
                out.push(5);
                v.clone().unwrap_or(AggValue::Null).encode(&mut out);
                out.push(v.is_some() as u8);
            }
            State::Pair(v) => {
                out.push(6);
                out.push(v.is_some() as u8);
                if let Some((a, k)) = v {
                    a.encode(&mut out);
                    k.encode(&mut out);
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<State> {
        let mut r = Reader { bytes, pos: 0 };
        if r.u8()? != 1 {
            return Err(corrupt("unknown state format version"));
        }
        Ok(match r.u8()? {
            0 => match r.value()? {
                AggValue::Null => State::Sum(None),
                v => State::Sum(Some(v)),
            },
            1 => State::Count(r.u64()?),
            2 => {
                let sum = f64::from_bits(r.u64()?);
                State::Avg { sum, count: r.u64()? }
            }
            3 => {
                let n = r.u32()? as usize;
                let mut set = BTreeSet::new();
                for _ in 0..n {
                    let len = r.u32()? as usize;
                    set.insert(r.take(len)?.to_vec());
                }
                State::Distinct(set)
            }
            4 => match r.value()? {
                AggValue::Array(items) => State::List(items),
                _ => return Err(corrupt("groupArray state is not a list")),
            },
            5 => {
                let v = r.value()?;
                State::One((r.u8()? == 1).then_some(v))
            }
            6 => {
                if r.u8()? == 1 {
                    let a = r.value()?;
                    State::Pair(Some((a, r.value()?)))
                } else {
                    State::Pair(None)
                }
            }
            tag => return Err(corrupt(&format!("unknown state kind {tag}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_merge() {
        let f = AggregateFunction::new("uniqExact", vec![ChType::UInt64]).expect("function");
        let mut a = f.empty_state();
        f.add(&mut a, &[AggValue::Int(1)]);
        f.add(&mut a, &[AggValue::Int(2)]);
        let mut b = f.empty_state();
        f.add(&mut b, &[AggValue::Int(2)]);
        f.add(&mut b, &[AggValue::Int(3)]);
        let mut merged = State::decode(&a.encode()).expect("decode");
        f.merge(&mut merged, State::decode(&b.encode()).expect("decode"));
        assert_eq!(f.finalize(&merged), AggValue::Int(3));
    }

    #[test]
    fn arg_max_and_avg() {
        let f = AggregateFunction::new("argMax", vec![ChType::String, ChType::UInt64]).expect("argMax");
        let mut s = f.empty_state();
        f.add(&mut s, &[AggValue::Bytes(b"a".to_vec()), AggValue::Int(5)]);
        f.add(&mut s, &[AggValue::Bytes(b"b".to_vec()), AggValue::Int(9)]);
        f.add(&mut s, &[AggValue::Bytes(b"c".to_vec()), AggValue::Int(9)]);
        assert_eq!(f.finalize(&s), AggValue::Bytes(b"b".to_vec()));
        let avg = AggregateFunction::new("avg", vec![ChType::Int32]).expect("avg");
        let mut s = avg.empty_state();
        avg.add(&mut s, &[AggValue::Int(1)]);
        avg.add(&mut s, &[AggValue::Int(2)]);
        assert_eq!(avg.finalize(&s), AggValue::Float(1.5));
    }

    #[test]
    fn rejects_unknown_functions_and_wrong_arity() {
        assert!(AggregateFunction::new("median", vec![ChType::UInt64]).is_err());
        assert!(AggregateFunction::new("argMax", vec![ChType::UInt64]).is_err());
    }
}
