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

/// ClickHouse's `compareAt` with `nan_direction_hint = 1`: NaN is greater than every number
/// and equal to NaN, so a NaN version wins against any other.
pub fn compare_versions(a: &dyn Array, a_row: usize, b: &dyn Array, b_row: usize) -> Ordering {
    if is_float(a.data_type()) {
        let (x, y) = (float_value(a, a_row).unwrap_or(f64::NAN), float_value(b, b_row).unwrap_or(f64::NAN));
        match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        }
    } else {
        int_value(a, a_row).cmp(&int_value(b, b_row))
    }
}

/// The sign of a Collapsing row: the Int8 sign column is 1 or -1.
pub fn sign(array: &dyn Array, row: usize) -> i8 {
    if array.is_null(row) {
        return 0;
    }
    array.as_primitive::<Int8Type>().value(row)
}
