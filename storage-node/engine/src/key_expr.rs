//! Partition key expressions and partition ids.
//!
//! A partition key is a column, one of the date bucketing functions ClickHouse users rely on, or a
//! tuple of those. The partition id follows ClickHouse: the decimal value for an integer, YYYYMMDD
//! for a date, values joined by `-` for a tuple, `all` without a partition key.

use std::collections::HashMap;

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Date32Array, Int64Array, RecordBatch, StringArray, TimestampSecondArray, UInt32Array,
    UInt64Array,
};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType as ArrowType, Date32Type, Int64Type, TimeUnit, UInt64Type};
use chrono::{Datelike, NaiveDate};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::schema::ColumnDef;
use crate::types::ChType;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyExpr {
    Column(String),
    Literal(i64),
    Call { function: String, args: Vec<KeyExpr> },
    Tuple(Vec<KeyExpr>),
}

/// The expression as ClickHouse writes it back (`toYYYYMM(d)`, `(a, b)`).
impl std::fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |f: &mut std::fmt::Formatter<'_>, items: &[KeyExpr]| -> std::fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        };
        match self {
            KeyExpr::Column(name) => f.write_str(name),
            KeyExpr::Literal(value) => write!(f, "{value}"),
            KeyExpr::Call { function, args } => {
                write!(f, "{function}(")?;
                list(f, args)?;
                f.write_str(")")
            }
            KeyExpr::Tuple(items) => {
                f.write_str("(")?;
                list(f, items)?;
                f.write_str(")")
            }
        }
    }
}

/// Functions a partition or sorting key may call (named in the error for any other).
pub const PARTITION_FUNCTIONS: &[&str] = &[
    "toYYYYMM",
    "toYYYYMMDD",
    "toYear",
    "toDate",
    "toStartOfMonth",
    "toMonday",
    "toStartOfDay",
    "toStartOfHour",
    "toStartOfMinute",
    "intDiv",
    "modulo",
];

/// One evaluated partition key element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PartitionValue {
    Int(i128),
    Date(i32),
    Str(String),
}

impl PartitionValue {
    fn id(&self) -> String {
        match self {
            PartitionValue::Int(v) => v.to_string(),
            PartitionValue::Str(s) => s.clone(),
            PartitionValue::Date(d) => {
                let date = days_to_date(*d);
                format!("{:04}{:02}{:02}", date.year(), date.month(), date.day())
            }
        }
    }

    fn display(&self) -> String {
        match self {
            PartitionValue::Int(v) => v.to_string(),
            PartitionValue::Str(s) => s.clone(),
            PartitionValue::Date(d) => days_to_date(*d).format("%Y-%m-%d").to_string(),
        }
    }
}

/// ClickHouse's `Field::Types` tags, hashed before each value of a partition key.
const FIELD_UINT64: u8 = 1;
const FIELD_INT64: u8 = 2;
const FIELD_STRING: u8 = 16;

/// A partition: its id (part names start with it) and the value shown in `system.parts`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Partition {
    pub id: String,
    pub value: String,
}

impl Partition {
    pub fn all() -> Partition {
        Partition { id: "all".into(), value: "tuple()".into() }
    }

    /// ClickHouse names a partition of integers (and dates) by the values joined with `-`,
    /// and any other by the SipHash-128 of its values as `Field`s (type tag, then the value).
    fn from_values(values: &[PartitionValue], kinds: &[ValueKind]) -> Partition {
        let id = if values.iter().any(|v| matches!(v, PartitionValue::Str(_))) {
            let mut hash = crate::sip_hash::SipHash128::default();
            for (value, kind) in values.iter().zip(kinds) {
                match value {
                    PartitionValue::Str(s) => {
                        hash.update(&[FIELD_STRING]);
                        hash.update(&(s.len() as u64).to_le_bytes());
                        hash.update(s.as_bytes());
                    }
                    PartitionValue::Int(v) if matches!(kind, ValueKind::Int { signed: true }) => {
                        hash.update(&[FIELD_INT64]);
                        hash.update(&(*v as i64).to_le_bytes());
                    }
                    PartitionValue::Int(v) => {
                        hash.update(&[FIELD_UINT64]);
                        hash.update(&(*v as u64).to_le_bytes());
                    }
                    PartitionValue::Date(d) => {
                        hash.update(&[FIELD_UINT64]);
                        hash.update(&(*d as u64).to_le_bytes());
                    }
                }
            }
            hash.finish128().iter().map(|b| format!("{b:02x}")).collect()
        } else {
            values.iter().map(PartitionValue::id).collect::<Vec<_>>().join("-")
        };
        let value = if values.len() == 1 {
            values[0].display()
        } else {
            // Inside a tuple strings and dates are quoted.
            let shown: Vec<String> = values
                .iter()
                .map(|v| match v {
                    PartitionValue::Int(_) => v.display(),
                    _ => format!("'{}'", v.display().replace('\\', "\\\\").replace('\'', "\\'")),
                })
                .collect();
            format!("({})", shown.join(","))
        };
        Partition { id, value }
    }
}

pub fn days_to_date(days: i32) -> NaiveDate {
    NaiveDate::from_num_days_from_ce_opt(days + 719_163).unwrap_or(NaiveDate::MIN)
}

fn date_to_days(date: NaiveDate) -> i32 {
    date.num_days_from_ce() - 719_163
}

impl KeyExpr {
    pub fn columns(&self) -> Vec<&str> {
        match self {
            KeyExpr::Column(c) => vec![c.as_str()],
            KeyExpr::Literal(_) => vec![],
            KeyExpr::Call { args, .. } | KeyExpr::Tuple(args) => args.iter().flat_map(KeyExpr::columns).collect(),
        }
    }

    fn elements(&self) -> &[KeyExpr] {
        match self {
            KeyExpr::Tuple(items) => items,
            single => std::slice::from_ref(single),
        }
    }

    /// Checks the expression against the table's columns at CREATE TABLE.
    pub fn validate(&self, columns: &[ColumnDef]) -> Result<()> {
        for element in self.elements() {
            element.kind(columns)?;
        }
        Ok(())
    }

    /// What an element evaluates to: a date or an integer.
    fn kind(&self, columns: &[ColumnDef]) -> Result<ValueKind> {
        let bad = |m: String| EngineError::BadTableDefinition(m);
        match self {
            KeyExpr::Literal(v) => Ok(ValueKind::Int { signed: *v < 0 }),
            KeyExpr::Tuple(_) => Err(bad("nested tuples are not allowed in a partition key".into())),
            KeyExpr::Column(name) => {
                let col = columns
                    .iter()
                    .find(|c| &c.name == name)
                    .ok_or_else(|| bad(format!("Missing columns: '{name}' while processing the partition key")))?;
                match col.ty.value_type() {
                    t if t.is_integer() => Ok(ValueKind::Int {
                        signed: matches!(t, ChType::Int8 | ChType::Int16 | ChType::Int32 | ChType::Int64),
                    }),
                    ChType::Bool => Ok(ValueKind::Int { signed: false }),
                    ChType::String | ChType::FixedString(_) => Ok(ValueKind::Str),
                    ChType::Date | ChType::Date32 => Ok(ValueKind::Date),
                    ChType::DateTime => Ok(ValueKind::DateTime),
                    other => Err(bad(format!(
                        "partition keys of type {other} are not supported yet (column {name}); use an integer or date expression"
                    ))),
                }
            }
            KeyExpr::Call { function, args } => {
                let arg_kinds = args.iter().map(|a| a.kind(columns)).collect::<Result<Vec<_>>>()?;
                let temporal = |k: &ValueKind| matches!(k, ValueKind::Date | ValueKind::DateTime);
                match (function.as_str(), arg_kinds.as_slice()) {
                    ("toYYYYMM" | "toYYYYMMDD" | "toYear", [k]) if temporal(k) => Ok(ValueKind::Int { signed: false }),
                    ("toDate" | "toStartOfMonth" | "toMonday", [k]) if temporal(k) => Ok(ValueKind::Date),
                    ("toStartOfHour" | "toStartOfDay" | "toStartOfMinute", [k]) if temporal(k) => {
                        Ok(ValueKind::DateTime)
                    }
                    ("intDiv" | "modulo", [ValueKind::Int { signed: a }, ValueKind::Int { signed: b }]) => {
                        Ok(ValueKind::Int { signed: *a || *b })
                    }
                    _ => Err(bad(format!(
                        "unsupported partition key expression {function}(…) with {} argument(s); supported: {}",
                        args.len(),
                        PARTITION_FUNCTIONS.join(", ")
                    ))),
                }
            }
        }
    }

    /// The type of the expression's values (for a sorting-key expression's hidden column).
    pub fn result_type(&self, columns: &[ColumnDef]) -> Result<ChType> {
        Ok(match self.kind(columns)? {
            ValueKind::Int { signed: true } => ChType::Int64,
            ValueKind::Int { signed: false } => ChType::UInt64,
            ValueKind::Str => ChType::String,
            ValueKind::Date => ChType::Date,
            ValueKind::DateTime => ChType::DateTime,
        })
    }

    /// The expression over every row of `batch`, as a column of [`result_type`](Self::result_type).
    pub fn evaluate_column(&self, columns: &[ColumnDef], batch: &RecordBatch) -> Result<ArrayRef> {
        let values = self.evaluate(columns, batch)?;
        let int = |v: &PartitionValue| match v {
            PartitionValue::Int(i) => *i as i64,
            PartitionValue::Date(d) => *d as i64,
            PartitionValue::Str(_) => 0,
        };
        let array: ArrayRef = match self.kind(columns)? {
            ValueKind::Date => Arc::new(Date32Array::from_iter_values(values.iter().map(|v| int(v) as i32))),
            ValueKind::DateTime => Arc::new(TimestampSecondArray::from_iter_values(values.iter().map(int))),
            ValueKind::Int { signed: true } => Arc::new(Int64Array::from_iter_values(values.iter().map(int))),
            ValueKind::Int { signed: false } => {
                Arc::new(UInt64Array::from_iter_values(values.iter().map(|v| int(v) as u64)))
            }
            ValueKind::Str => Arc::new(StringArray::from_iter_values(values.iter().map(|v| match v {
                PartitionValue::Str(s) => s.as_str(),
                _ => "",
            }))),
        };
        Ok(array)
    }

    /// Splits a block by partition: the partitions in order of first appearance, each with the
    /// block's rows that belong to it.
    pub fn split(
        expr: Option<&KeyExpr>,
        columns: &[ColumnDef],
        batch: &RecordBatch,
    ) -> Result<Vec<(Partition, RecordBatch)>> {
        let Some(expr) = expr else {
            return Ok(vec![(Partition::all(), batch.clone())]);
        };
        let evaluated = expr.elements().iter().map(|e| e.evaluate(columns, batch)).collect::<Result<Vec<_>>>()?;
        let kinds = expr.elements().iter().map(|e| e.kind(columns)).collect::<Result<Vec<_>>>()?;
        let mut groups: HashMap<Vec<PartitionValue>, Vec<u32>> = HashMap::new();
        let mut order = Vec::new();
        for row in 0..batch.num_rows() {
            let key: Vec<PartitionValue> = evaluated.iter().map(|values| values[row].clone()).collect();
            let rows = groups.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                Vec::new()
            });
            rows.push(row as u32);
        }
        let mut out = Vec::with_capacity(order.len());
        for key in order {
            let indices = UInt32Array::from(groups.remove(&key).unwrap_or_default());
            let columns = batch
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let part = RecordBatch::try_new(batch.schema(), columns)?;
            out.push((Partition::from_values(&key, &kinds), part));
        }
        Ok(out)
    }

    fn evaluate(&self, columns: &[ColumnDef], batch: &RecordBatch) -> Result<Vec<PartitionValue>> {
        let rows = batch.num_rows();
        match self {
            KeyExpr::Literal(v) => Ok(vec![PartitionValue::Int(*v as i128); rows]),
            KeyExpr::Column(name) => {
                let index = columns
                    .iter()
                    .position(|c| &c.name == name)
                    .ok_or_else(|| EngineError::BadTableDefinition(format!("Missing columns: '{name}'")))?;
                column_values(batch.column(index))
            }
            KeyExpr::Tuple(_) => {
                Err(EngineError::BadTableDefinition("nested tuples are not allowed in a partition key".into()))
            }
            KeyExpr::Call { function, args } => {
                let args = args.iter().map(|a| a.evaluate(columns, batch)).collect::<Result<Vec<_>>>()?;
                (0..rows)
                    .map(|row| {
                        let arg = |i: usize| args[i][row].clone();
                        apply(
                            function,
                            &[arg(0), args.get(1).map(|a| a[row].clone()).unwrap_or(PartitionValue::Int(1))],
                        )
                    })
                    .collect()
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ValueKind {
    /// An integer; `signed` decides how ClickHouse hashes it into a partition id.
    Int {
        signed: bool,
    },
    Date,
    DateTime,
    Str,
}

/// DateTime values reach the functions as seconds; they are carried as `Int` with this marker
/// removed by `column_values`, so the functions see days for dates and seconds for date-times.
fn apply(function: &str, args: &[PartitionValue]) -> Result<PartitionValue> {
    // `kind` has checked the argument types: strings never reach these functions.
    let date = |v: &PartitionValue| match v {
        PartitionValue::Date(d) => days_to_date(*d),
        PartitionValue::Int(secs) => days_to_date((secs.div_euclid(86_400)) as i32),
        PartitionValue::Str(_) => NaiveDate::MIN,
    };
    let int = |v: &PartitionValue| match v {
        PartitionValue::Int(i) => *i,
        PartitionValue::Date(d) => *d as i128,
        PartitionValue::Str(_) => 0,
    };
    Ok(match function {
        "toYYYYMM" => {
            let d = date(&args[0]);
            PartitionValue::Int((d.year() * 100 + d.month() as i32) as i128)
        }
        "toYYYYMMDD" => {
            let d = date(&args[0]);
            PartitionValue::Int((d.year() * 10_000 + d.month() as i32 * 100 + d.day() as i32) as i128)
        }
        "toYear" => PartitionValue::Int(date(&args[0]).year() as i128),
        "toStartOfHour" | "toStartOfDay" | "toStartOfMinute" => {
            let secs = match &args[0] {
                PartitionValue::Date(d) => *d as i128 * 86_400,
                other => int(other),
            };
            let unit = match function {
                "toStartOfHour" => 3_600,
                "toStartOfDay" => 86_400,
                _ => 60,
            };
            PartitionValue::Int(secs - secs.rem_euclid(unit))
        }
        "toDate" => PartitionValue::Date(date_to_days(date(&args[0]))),
        "toStartOfMonth" => {
            let d = date(&args[0]);
            PartitionValue::Date(date_to_days(d.with_day(1).unwrap_or(d)))
        }
        "toMonday" => {
            let d = date(&args[0]);
            let back = d.weekday().num_days_from_monday() as i32;
            PartitionValue::Date(date_to_days(d) - back)
        }
        "intDiv" | "modulo" => {
            let (a, b) = (int(&args[0]), int(&args[1]));
            if b == 0 {
                return Err(EngineError::BadInsert {
                    table: String::new(),
                    message: "Division by zero in the partition key".into(),
                });
            }
            PartitionValue::Int(if function == "intDiv" { a / b } else { a % b })
        }
        other => return Err(EngineError::BadTableDefinition(format!("unsupported partition function {other}"))),
    })
}

fn column_values(array: &ArrayRef) -> Result<Vec<PartitionValue>> {
    let out = match array.data_type() {
        ArrowType::Utf8 => {
            array.as_string::<i32>().iter().map(|v| PartitionValue::Str(v.unwrap_or_default().to_string())).collect()
        }
        ArrowType::FixedSizeBinary(_) => array
            .as_fixed_size_binary()
            .iter()
            .map(|v| PartitionValue::Str(String::from_utf8_lossy(v.unwrap_or_default()).into_owned()))
            .collect(),
        ArrowType::Date32 => {
            array.as_primitive::<Date32Type>().iter().map(|v| PartitionValue::Date(v.unwrap_or(0))).collect()
        }
        ArrowType::Timestamp(unit, _) => {
            let per_second: i64 = match unit {
                TimeUnit::Second => 1,
                TimeUnit::Millisecond => 1_000,
                TimeUnit::Microsecond => 1_000_000,
                TimeUnit::Nanosecond => 1_000_000_000,
            };
            let ints = cast(array, &ArrowType::Int64)?;
            ints.as_primitive::<Int64Type>()
                .iter()
                .map(|v| PartitionValue::Int((v.unwrap_or(0).div_euclid(per_second)) as i128))
                .collect()
        }
        ArrowType::UInt64 => {
            array.as_primitive::<UInt64Type>().iter().map(|v| PartitionValue::Int(v.unwrap_or(0) as i128)).collect()
        }
        _ => {
            let ints = cast(array, &ArrowType::Int64)?;
            ints.as_primitive::<Int64Type>().iter().map(|v| PartitionValue::Int(v.unwrap_or(0) as i128)).collect()
        }
    };
    Ok(out)
}
