//! One value as ClickHouse prints it, in the flavours its formats need.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Date64Type, Decimal128Type, Decimal256Type, Field, Float32Type, Float64Type,
    Int16Type, Int32Type, Int64Type, Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use chrono::{DateTime, NaiveDate};
use mergestream_engine::types::CH_TYPE_KEY;

/// How strings and nested values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// TSV: backslash escapes, `\N` for NULL.
    Tsv,
    /// CSV: strings in double quotes, `\N` for NULL.
    Csv,
    /// JSON values.
    Json,
    /// PrettyCompact: raw text, `ᴺᵁᴸᴸ`.
    Pretty,
    /// Inside arrays, maps and tuples: strings in single quotes, `NULL`.
    Quoted,
}

/// What a value is, for alignment and quoting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Number,
    Temporal,
    Text,
    Other,
}

pub fn kind(field: &Field) -> Kind {
    match field.data_type() {
        t if t.is_numeric() => Kind::Number,
        ArrowType::Date32 | ArrowType::Date64 | ArrowType::Timestamp(..) => Kind::Temporal,
        ArrowType::Utf8 | ArrowType::LargeUtf8 | ArrowType::Utf8View | ArrowType::FixedSizeBinary(_) => Kind::Text,
        _ => Kind::Other,
    }
}

/// ClickHouse prints floats like JavaScript: the shortest round-trip digits, in plain
/// notation from 1e-7 up to 1e21 and in exponent notation outside.
pub fn format_float(value: f64, single: bool) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = if single { format!("{:e}", value as f32) } else { format!("{value:e}") };
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i32;
    let n = exponent + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let rest = if k > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{}{rest}e{}", &digits[..1], n - 1)
    };
    if negative {
        format!("-{body}")
    } else {
        body
    }
}

fn format_decimal(value: i128, scale: i8) -> String {
    if scale <= 0 {
        return value.to_string();
    }
    let negative = value < 0;
    let digits = value.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, frac) = padded.split_at(padded.len() - scale);
    let frac = frac.trim_end_matches('0');
    let sign = if negative { "-" } else { "" };
    if frac.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{frac}")
    }
}

fn escape_tsv(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c => out.push(c),
        }
    }
}

fn write_text(s: &str, style: Style, out: &mut String) {
    match style {
        Style::Tsv => escape_tsv(s, out),
        Style::Pretty => out.push_str(s),
        Style::Csv => {
            out.push('"');
            out.push_str(&s.replace('"', "\"\""));
            out.push('"');
        }
        Style::Json => out.push_str(&serde_json::Value::String(s.to_string()).to_string()),
        Style::Quoted => {
            out.push('\'');
            escape_tsv(s, out);
            out.push('\'');
        }
    }
}

/// Text that ClickHouse quotes in CSV and JSON (dates, date-times).
fn write_quoted_scalar(s: &str, style: Style, out: &mut String) {
    match style {
        Style::Tsv | Style::Pretty => out.push_str(s),
        _ => write_text(s, style, out),
    }
}

fn datetime_text(ticks: i64, unit: TimeUnit, precision: Option<u8>) -> String {
    let per_second: i64 = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    let secs = ticks.div_euclid(per_second);
    let frac = ticks.rem_euclid(per_second);
    let base = DateTime::from_timestamp(secs, 0)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| secs.to_string());
    let unit_digits = per_second.to_string().len() - 1;
    let digits = precision.map_or(unit_digits, |p| p as usize);
    if digits == 0 {
        return base;
    }
    let frac_text = format!("{frac:0>unit_digits$}");
    let shown: String = frac_text.chars().chain(std::iter::repeat('0')).take(digits).collect();
    format!("{base}.{shown}")
}

fn precision_of(field: Option<&Field>) -> Option<u8> {
    let ty = field?.metadata().get(CH_TYPE_KEY)?;
    let inner = ty.trim_start_matches("Nullable(");
    let p = inner.strip_prefix("DateTime64(")?;
    p.split([',', ')']).next()?.trim().parse().ok()
}

fn is_uuid(field: Option<&Field>) -> bool {
    field.and_then(|f| f.metadata().get(CH_TYPE_KEY)).is_some_and(|t| t.contains("UUID"))
}

/// Appends the value at `row` of `array`; `field` carries the ClickHouse type when known.
pub fn write_value(array: &dyn Array, row: usize, field: Option<&Field>, style: Style, out: &mut String) {
    if array.is_null(row) {
        out.push_str(match style {
            Style::Tsv | Style::Csv => "\\N",
            Style::Json => "null",
            Style::Pretty => "ᴺᵁᴸᴸ",
            Style::Quoted => "NULL",
        });
        return;
    }
    let float = |v: f64, single: bool, out: &mut String| {
        if style == Style::Json && !v.is_finite() {
            out.push_str("null");
        } else {
            out.push_str(&format_float(v, single));
        }
    };
    match array.data_type() {
        ArrowType::Null => out.push_str(if style == Style::Json { "null" } else { "\\N" }),
        ArrowType::Boolean => out.push_str(if array.as_boolean().value(row) { "true" } else { "false" }),
        ArrowType::UInt8 => out.push_str(&array.as_primitive::<UInt8Type>().value(row).to_string()),
        ArrowType::UInt16 => out.push_str(&array.as_primitive::<UInt16Type>().value(row).to_string()),
        ArrowType::UInt32 => out.push_str(&array.as_primitive::<UInt32Type>().value(row).to_string()),
        ArrowType::UInt64 => out.push_str(&array.as_primitive::<UInt64Type>().value(row).to_string()),
        ArrowType::Int8 => out.push_str(&array.as_primitive::<Int8Type>().value(row).to_string()),
        ArrowType::Int16 => out.push_str(&array.as_primitive::<Int16Type>().value(row).to_string()),
        ArrowType::Int32 => out.push_str(&array.as_primitive::<Int32Type>().value(row).to_string()),
        ArrowType::Int64 => out.push_str(&array.as_primitive::<Int64Type>().value(row).to_string()),
        ArrowType::Float32 => float(array.as_primitive::<Float32Type>().value(row) as f64, true, out),
        ArrowType::Float64 => float(array.as_primitive::<Float64Type>().value(row), false, out),
        ArrowType::Decimal128(_, s) => {
            out.push_str(&format_decimal(array.as_primitive::<Decimal128Type>().value(row), *s))
        }
        ArrowType::Decimal256(_, s) => {
            let v = array.as_primitive::<Decimal256Type>().value(row);
            out.push_str(&v.to_i128().map_or_else(|| v.to_string(), |v| format_decimal(v, *s)))
        }
        ArrowType::Utf8 => write_text(array.as_string::<i32>().value(row), style, out),
        ArrowType::LargeUtf8 => write_text(array.as_string::<i64>().value(row), style, out),
        ArrowType::Utf8View => write_text(array.as_string_view().value(row), style, out),
        ArrowType::FixedSizeBinary(16) if is_uuid(field) => {
            let b = array.as_fixed_size_binary().value(row);
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let text = format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
            write_quoted_scalar(&text, style, out)
        }
        ArrowType::FixedSizeBinary(_) => {
            write_text(&String::from_utf8_lossy(array.as_fixed_size_binary().value(row)), style, out)
        }
        ArrowType::Binary => write_text(&String::from_utf8_lossy(array.as_binary::<i32>().value(row)), style, out),
        ArrowType::Date32 => {
            let days = array.as_primitive::<Date32Type>().value(row);
            let date = NaiveDate::from_num_days_from_ce_opt(days + 719_163).unwrap_or(NaiveDate::MIN);
            write_quoted_scalar(&date.format("%Y-%m-%d").to_string(), style, out)
        }
        ArrowType::Date64 => {
            let ms = array.as_primitive::<Date64Type>().value(row);
            write_quoted_scalar(&datetime_text(ms, TimeUnit::Millisecond, Some(0))[..10], style, out)
        }
        ArrowType::Timestamp(unit, _) => {
            let ticks = match unit {
                TimeUnit::Second => array.as_primitive::<TimestampSecondType>().value(row),
                TimeUnit::Millisecond => array.as_primitive::<TimestampMillisecondType>().value(row),
                TimeUnit::Microsecond => array.as_primitive::<TimestampMicrosecondType>().value(row),
                TimeUnit::Nanosecond => array.as_primitive::<TimestampNanosecondType>().value(row),
            };
            write_quoted_scalar(&datetime_text(ticks, *unit, precision_of(field)), style, out)
        }
        ArrowType::List(item) | ArrowType::LargeList(item) => {
            let values = match array.data_type() {
                ArrowType::List(_) => array.as_list::<i32>().value(row),
                _ => array.as_list::<i64>().value(row),
            };
            let inner_style = if style == Style::Json { Style::Json } else { Style::Quoted };
            let mut text = String::from("[");
            for i in 0..values.len() {
                if i > 0 {
                    text.push(',');
                }
                write_value(values.as_ref(), i, Some(item), inner_style, &mut text);
            }
            text.push(']');
            write_nested(&text, style, out);
        }
        ArrowType::Map(..) => {
            let entries = array.as_map().value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            let mut text = String::from("{");
            for i in 0..entries.len() {
                if i > 0 {
                    text.push(',');
                }
                if style == Style::Json {
                    let mut key = String::new();
                    write_value(keys.as_ref(), i, None, Style::Pretty, &mut key);
                    text.push_str(&serde_json::Value::String(key).to_string());
                    text.push(':');
                    write_value(values.as_ref(), i, None, Style::Json, &mut text);
                } else {
                    write_value(keys.as_ref(), i, None, Style::Quoted, &mut text);
                    text.push(':');
                    write_value(values.as_ref(), i, None, Style::Quoted, &mut text);
                }
            }
            text.push('}');
            write_nested(&text, style, out);
        }
        ArrowType::Struct(fields) => {
            let s = array.as_struct();
            let inner_style = if style == Style::Json { Style::Json } else { Style::Quoted };
            let (open, close) = if style == Style::Json { ('[', ']') } else { ('(', ')') };
            let mut text = String::from(open);
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                write_value(s.column(i).as_ref(), row, Some(f), inner_style, &mut text);
            }
            text.push(close);
            write_nested(&text, style, out);
        }
        other => {
            let text = arrow::util::display::ArrayFormatter::try_new(array, &Default::default())
                .map(|f| f.value(row).to_string())
                .unwrap_or_else(|_| format!("<{other}>"));
            write_text(&text, style, out)
        }
    }
}

/// Arrays and maps are one TSV field (escaped as text), a quoted CSV field, raw in JSON.
fn write_nested(text: &str, style: Style, out: &mut String) {
    match style {
        Style::Tsv => escape_tsv_nested(text, out),
        Style::Csv => write_text(text, Style::Csv, out),
        Style::Json | Style::Pretty | Style::Quoted => out.push_str(text),
    }
}

/// Inside a TSV field the already-escaped nested text only needs its tabs and newlines kept.
fn escape_tsv_nested(text: &str, out: &mut String) {
    out.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_clickhouse() {
        for (v, expected) in [
            (1e21, "1e21"),
            (1.5e-7, "1.5e-7"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e20, "100000000000000000000"),
            (123456789012.5, "123456789012.5"),
            (100000.0, "100000"),
            (12345678901234567890.0, "12345678901234567000"),
            (1.0 / 3.0, "0.3333333333333333"),
            (-2.5, "-2.5"),
            (0.000001, "0.000001"),
        ] {
            assert_eq!(format_float(v, false), expected, "{v}");
        }
        assert_eq!(format_float(0.1f32 as f64, true), "0.1");
    }

    #[test]
    fn decimals_drop_trailing_zeros() {
        assert_eq!(format_decimal(2000, 3), "2");
        assert_eq!(format_decimal(150, 2), "1.5");
        assert_eq!(format_decimal(-5, 2), "-0.05");
    }

    #[test]
    fn datetimes_with_precision() {
        assert_eq!(datetime_text(1_500, TimeUnit::Millisecond, Some(3)), "1970-01-01 00:00:01.500");
        assert_eq!(datetime_text(1_500, TimeUnit::Millisecond, Some(2)), "1970-01-01 00:00:01.50");
        assert_eq!(datetime_text(61, TimeUnit::Second, None), "1970-01-01 00:01:01");
    }
}
