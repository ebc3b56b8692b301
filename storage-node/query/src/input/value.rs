//! Literal values of inserted data and their conversion into Arrow columns of a ClickHouse type.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Decimal256Array, FixedSizeBinaryArray, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, ListArray, MapArray, StringArray, StructArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{i256, DataType as ArrowType, Fields};
use chrono::{NaiveDate, NaiveDateTime};
use mergestream_engine::ChType;

/// A parsed literal.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    /// A number as written (sign included), converted once its column's type is known.
    Number(String),
    Str(String),
    Bool(bool),
    Array(Vec<Value>),
    Tuple(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn describe(&self) -> String {
        match self {
            Value::Null => "NULL".into(),
            Value::Number(n) => n.clone(),
            Value::Str(s) => format!("'{s}'"),
            Value::Bool(b) => b.to_string(),
            Value::Array(_) => "an array".into(),
            Value::Tuple(_) => "a tuple".into(),
            Value::Map(_) => "a map".into(),
        }
    }
}

type Conv<T> = std::result::Result<T, String>;

fn mismatch<T>(value: &Value, ty: &ChType) -> Conv<T> {
    Err(format!("cannot convert {} to {ty}", value.describe()))
}

fn text_of<'a>(value: &'a Value, ty: &ChType) -> Conv<&'a str> {
    match value {
        Value::Number(n) => Ok(n),
        Value::Str(s) => Ok(s),
        _ => mismatch(value, ty),
    }
}

fn parse_int(value: &Value, ty: &ChType, min: i128, max: i128) -> Conv<i128> {
    if let Value::Bool(b) = value {
        return Ok(*b as i128);
    }
    let text = text_of(value, ty)?.trim();
    let parsed = if let Some(hex) = text.strip_prefix("0x") {
        i128::from_str_radix(hex, 16).ok()
    } else {
        text.parse::<i128>().ok().or_else(|| {
            // ClickHouse accepts 1e3 and 2.0 for integers when they are whole.
            text.parse::<f64>().ok().filter(|f| f.fract() == 0.0 && f.abs() < 1e38).map(|f| f as i128)
        })
    };
    let v = parsed.ok_or_else(|| format!("cannot parse '{text}' as {ty}"))?;
    if v < min || v > max {
        return Err(format!("value {v} is out of range of {ty}"));
    }
    Ok(v)
}

fn parse_float(value: &Value, ty: &ChType) -> Conv<f64> {
    let text = text_of(value, ty)?.trim();
    match text.to_ascii_lowercase().as_str() {
        "nan" | "+nan" => return Ok(f64::NAN),
        "-nan" => return Ok(-f64::NAN),
        "inf" | "+inf" | "infinity" => return Ok(f64::INFINITY),
        "-inf" | "-infinity" => return Ok(f64::NEG_INFINITY),
        _ => {}
    }
    text.parse().map_err(|_| format!("cannot parse '{text}' as {ty}"))
}

const UNIX_EPOCH_DAYS_FROM_CE: i32 = 719_163;

pub fn parse_date(text: &str) -> Option<i32> {
    let date = NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok()?;
    Some(chrono::Datelike::num_days_from_ce(&date) - UNIX_EPOCH_DAYS_FROM_CE)
}

/// A DateTime text as units of 10^-precision seconds.
pub fn parse_datetime(text: &str, precision: u8) -> Option<i64> {
    let text = text.trim();
    let scale = 10i64.pow(precision as u32);
    if let Ok(dt) = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f") {
        let utc = dt.and_utc();
        let frac = utc.timestamp_subsec_nanos() as i64 / 10i64.pow(9 - precision as u32);
        return Some(utc.timestamp() * scale + frac);
    }
    parse_date(text).map(|days| days as i64 * 86_400 * scale)
}

fn parse_decimal(text: &str, scale: u8) -> Option<i128> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let mut value: i128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let frac_digits: String = frac.chars().take(scale as usize).collect();
    if !frac_digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    for i in 0..scale as usize {
        let d = frac_digits.as_bytes().get(i).map_or(0, |b| (b - b'0') as i128);
        value = value.checked_mul(10)?.checked_add(d)?;
    }
    Some(if negative { -value } else { value })
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Builds a column of `ty` from one value per row.
pub fn column_from_values(ty: &ChType, values: &[Value]) -> Conv<ArrayRef> {
    let nullable = ty.is_nullable();
    let inner = ty.value_type();
    let check_null = |v: &Value| -> Conv<()> {
        if matches!(v, Value::Null) && !nullable {
            Err(format!("cannot insert NULL into a column of type {ty}"))
        } else {
            Ok(())
        }
    };
    macro_rules! ints {
        ($array:ty, $t:ty) => {{
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    v => Some(parse_int(v, inner, <$t>::MIN as i128, <$t>::MAX as i128)? as $t),
                });
            }
            Arc::new(<$array>::from(out)) as ArrayRef
        }};
    }
    let array: ArrayRef = match inner {
        ChType::UInt8 => ints!(UInt8Array, u8),
        ChType::UInt16 => ints!(UInt16Array, u16),
        ChType::UInt32 => ints!(UInt32Array, u32),
        ChType::UInt64 => ints!(UInt64Array, u64),
        ChType::Int8 => ints!(Int8Array, i8),
        ChType::Int16 => ints!(Int16Array, i16),
        ChType::Int32 => ints!(Int32Array, i32),
        ChType::Int64 => ints!(Int64Array, i64),
        ChType::Float32 | ChType::Float64 => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    v => Some(parse_float(v, inner)?),
                });
            }
            if *inner == ChType::Float32 {
                Arc::new(out.into_iter().map(|v| v.map(|f| f as f32)).collect::<Float32Array>())
            } else {
                Arc::new(Float64Array::from(out))
            }
        }
        ChType::String => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Str(s) | Value::Number(s) => Some(s.clone()),
                    Value::Bool(b) => Some(b.to_string()),
                    other => return mismatch(other, inner),
                });
            }
            Arc::new(StringArray::from(out))
        }
        ChType::FixedString(n) => {
            let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Str(s) => {
                        if s.len() > *n {
                            return Err(format!("Too large value for {inner}"));
                        }
                        let mut bytes = s.as_bytes().to_vec();
                        bytes.resize(*n, 0);
                        Some(bytes)
                    }
                    other => return mismatch(other, inner),
                });
            }
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(out.into_iter(), *n as i32)
                    .map_err(|e| e.to_string())?,
            )
        }
        ChType::Bool => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Bool(b) => Some(*b),
                    Value::Number(n) if n == "0" || n == "1" => Some(n == "1"),
                    Value::Str(s) if s == "true" || s == "false" => Some(s == "true"),
                    other => return mismatch(other, inner),
                });
            }
            Arc::new(BooleanArray::from(out))
        }
        ChType::Date | ChType::Date32 => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Str(s) => Some(parse_date(s).ok_or_else(|| format!("cannot parse '{s}' as {inner}"))?),
                    Value::Number(_) => Some(parse_int(v, inner, i32::MIN as i128, i32::MAX as i128)? as i32),
                    other => return mismatch(other, inner),
                });
            }
            Arc::new(Date32Array::from(out))
        }
        ChType::DateTime | ChType::DateTime64(_) => {
            let precision = match inner {
                ChType::DateTime64(p) => *p,
                _ => 0,
            };
            // Stored in the Arrow unit of the precision (see `datetime64_unit`).
            let unit_digits = match precision {
                0 => 0,
                1..=3 => 3,
                4..=6 => 6,
                _ => 9,
            };
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Str(s) => {
                        Some(parse_datetime(s, unit_digits).ok_or_else(|| format!("cannot parse '{s}' as {inner}"))?)
                    }
                    Value::Number(_) => {
                        let n = parse_int(v, inner, i64::MIN as i128, i64::MAX as i128)? as i64;
                        // A number is seconds for DateTime, ticks of the precision for DateTime64.
                        let to_unit = 10i64.pow(unit_digits as u32 - precision.min(unit_digits) as u32);
                        Some(if precision == 0 { n * 10i64.pow(unit_digits as u32) } else { n * to_unit })
                    }
                    other => return mismatch(other, inner),
                });
            }
            match unit_digits {
                0 => Arc::new(TimestampSecondArray::from(out)),
                3 => Arc::new(TimestampMillisecondArray::from(out)),
                6 => Arc::new(TimestampMicrosecondArray::from(out)),
                _ => Arc::new(TimestampNanosecondArray::from(out)),
            }
        }
        ChType::Uuid => {
            let mut out: Vec<Option<[u8; 16]>> = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    Value::Str(s) => Some(parse_uuid(s).ok_or_else(|| format!("cannot parse '{s}' as UUID"))?),
                    other => return mismatch(other, inner),
                });
            }
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(out.into_iter(), 16).map_err(|e| e.to_string())?,
            )
        }
        ChType::Decimal { precision, scale } => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                check_null(v)?;
                out.push(match v {
                    Value::Null => None,
                    v => {
                        let text = text_of(v, inner)?;
                        Some(parse_decimal(text, *scale).ok_or_else(|| format!("cannot parse '{text}' as {inner}"))?)
                    }
                });
            }
            if *precision <= 38 {
                Arc::new(
                    Decimal128Array::from(out)
                        .with_precision_and_scale(*precision, *scale as i8)
                        .map_err(|e| e.to_string())?,
                )
            } else {
                Arc::new(
                    out.into_iter()
                        .map(|v| v.map(i256::from_i128))
                        .collect::<Decimal256Array>()
                        .with_precision_and_scale(*precision, *scale as i8)
                        .map_err(|e| e.to_string())?,
                )
            }
        }
        ChType::Array(item) => {
            let mut offsets = vec![0i32];
            let mut flat = Vec::new();
            let mut valid = Vec::with_capacity(values.len());
            for v in values {
                match v {
                    Value::Array(items) => {
                        flat.extend(items.iter().cloned());
                        valid.push(true);
                    }
                    Value::Null => return Err(format!("cannot insert NULL into {inner}")),
                    other => return mismatch(other, inner),
                }
                offsets.push(flat.len() as i32);
            }
            let child = column_from_values(item, &flat)?;
            let ArrowType::List(field) = inner.arrow_type() else { unreachable!("Array maps to List") };
            Arc::new(
                ListArray::try_new(field, OffsetBuffer::new(offsets.into()), child, Some(NullBuffer::from(valid)))
                    .map_err(|e| e.to_string())?,
            )
        }
        ChType::Map(k, vt) => {
            let mut offsets = vec![0i32];
            let (mut keys, mut vals) = (Vec::new(), Vec::new());
            for v in values {
                match v {
                    Value::Map(pairs) => {
                        for (key, value) in pairs {
                            keys.push(key.clone());
                            vals.push(value.clone());
                        }
                    }
                    other => return mismatch(other, inner),
                }
                offsets.push(keys.len() as i32);
            }
            let ArrowType::Map(entries_field, _) = inner.arrow_type() else { unreachable!("Map maps to Map") };
            let ArrowType::Struct(fields) = entries_field.data_type().clone() else { unreachable!("map entries") };
            let entries = StructArray::try_new(
                Fields::from(fields.iter().cloned().collect::<Vec<_>>()),
                vec![column_from_values(k, &keys)?, column_from_values(vt, &vals)?],
                None,
            )
            .map_err(|e| e.to_string())?;
            Arc::new(
                MapArray::try_new(entries_field, OffsetBuffer::new(offsets.into()), entries, None, false)
                    .map_err(|e| e.to_string())?,
            )
        }
        ChType::AggregateFunction(_) => {
            return Err(format!(
                "{inner} columns take states from -State functions (INSERT … SELECT fState(…)), not literal values"
            ))
        }
        ChType::Nullable(_) | ChType::LowCardinality(_) | ChType::SimpleAggregateFunction { .. } => {
            unreachable!("value_type() removes wrappers")
        }
    };
    Ok(array)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_scale_and_truncate() {
        assert_eq!(parse_decimal("1.5", 2), Some(150));
        assert_eq!(parse_decimal("-0.125", 2), Some(-12));
        assert_eq!(parse_decimal("7", 3), Some(7000));
        assert_eq!(parse_decimal("x", 3), None);
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(parse_date("1970-01-02"), Some(1));
        assert_eq!(parse_datetime("1970-01-01 00:00:01.25", 3), Some(1250));
    }

    #[test]
    fn integers_are_range_checked() {
        let err = column_from_values(&ChType::UInt8, &[Value::Number("256".into())]).expect_err("range");
        assert!(err.contains("out of range"), "{err}");
        let err = column_from_values(&ChType::UInt8, &[Value::Null]).expect_err("null");
        assert!(err.contains("NULL"), "{err}");
    }
}
