//! Reading single values out of Arrow arrays, for the per-row decisions of the algorithms.

use std::cmp::Ordering;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};

/// A value of an integer-like column (integers, dates, date-times, decimals) widened to i128.
pub fn int_value(array: &dyn Array, row: usize) -> Option<i128> {
    if array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        ArrowType::UInt8 => array.as_primitive::<UInt8Type>().value(row) as i128,
        ArrowType::UInt16 => array.as_primitive::<UInt16Type>().value(row) as i128,
        ArrowType::UInt32 => array.as_primitive::<UInt32Type>().value(row) as i128,
        ArrowType::UInt64 => array.as_primitive::<UInt64Type>().value(row) as i128,
        ArrowType::Int8 => array.as_primitive::<Int8Type>().value(row) as i128,
        ArrowType::Int16 => array.as_primitive::<Int16Type>().value(row) as i128,
        ArrowType::Int32 => array.as_primitive::<Int32Type>().value(row) as i128,
        ArrowType::Int64 => array.as_primitive::<Int64Type>().value(row) as i128,
        ArrowType::Date32 => array.as_primitive::<Date32Type>().value(row) as i128,
        ArrowType::Decimal128(..) => array.as_primitive::<Decimal128Type>().value(row),
        ArrowType::Boolean => array.as_boolean().value(row) as i128,
        ArrowType::Timestamp(TimeUnit::Second, _) => array.as_primitive::<TimestampSecondType>().value(row) as i128,
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
            array.as_primitive::<TimestampMillisecondType>().value(row) as i128
        }
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
            array.as_primitive::<TimestampMicrosecondType>().value(row) as i128
        }
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
            array.as_primitive::<TimestampNanosecondType>().value(row) as i128
        }
        _ => return None,
    })
}

pub fn float_value(array: &dyn Array, row: usize) -> Option<f64> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        ArrowType::Float32 => Some(array.as_primitive::<Float32Type>().value(row) as f64),
        ArrowType::Float64 => Some(array.as_primitive::<Float64Type>().value(row)),
        _ => None,
    }
}

pub fn is_float(ty: &ArrowType) -> bool {
    matches!(ty, ArrowType::Float32 | ArrowType::Float64)
}

/// A version value, read once per row: integers (and dates) exactly, floats with NaN.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Version {
    Int(i128),
    Float(f64),
    Null,
}

impl Version {
    pub fn at(array: &dyn Array, row: usize) -> Version {
        if is_float(array.data_type()) {
            float_value(array, row).map_or(Version::Null, Version::Float)
        } else {
            int_value(array, row).map_or(Version::Null, Version::Int)
        }
    }

    /// ClickHouse's `compareAt` with `nan_direction_hint = 1`: NaN is greater than every
    /// number and equal to NaN.
    pub fn compare(self, other: Version) -> Ordering {
        match (self, other) {
            (Version::Int(a), Version::Int(b)) => a.cmp(&b),
            (Version::Float(a), Version::Float(b)) => match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
            },
            (Version::Null, Version::Null) => Ordering::Equal,
            (Version::Null, _) => Ordering::Less,
            (_, Version::Null) => Ordering::Greater,
            // One column has one type: mixed kinds do not occur.
            _ => Ordering::Equal,
        }
    }
}

/// The sign of a Collapsing row: the Int8 sign column is 1 or -1.
pub fn sign(array: &dyn Array, row: usize) -> i8 {
    if array.is_null(row) {
        return 0;
    }
    array.as_primitive::<Int8Type>().value(row)
}
