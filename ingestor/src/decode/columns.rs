//! A buffer's values, column by column, kept as the type they will have in the block.
//!
//! A column of a common type (an integer, a float, String) whose mapping has no conversion
//! keeps its values unboxed as they are decoded, and becomes an Arrow array without parsing
//! them again. Every other column keeps generic [`Value`]s, converted once per block by the
//! `column_from_values` that `INSERT … FORMAT JSONEachRow` uses. A typed column that meets a
//! value it cannot take as it is (a quoted number, a negative number for an unsigned column,
//! a number for a String column) turns generic for the rest of its buffer, so both paths
//! accept and reject exactly the same input; the typed one only skips the text round trip.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, StringArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use mergestream_engine::ChType;
use mergestream_query::input::from_json;
use mergestream_query::input::value::{column_from_values, Value};

use super::document::Field;

/// What a column is given for one row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    Null,
    /// A value as the message had it.
    Field(Field<'a>),
    /// A value already made (a column DEFAULT, a converted value).
    Value(Value),
}

impl Cell<'_> {
    fn into_value(self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Field(field) => from_json(field.into_json()),
            Cell::Value(value) => value,
        }
    }
}

/// One column of a buffer.
#[derive(Debug, Clone)]
pub struct Column {
    values: Values,
    /// For a nullable typed column: whether each row has a value (a null row holds a zero).
    valid: Option<Vec<bool>>,
}

#[derive(Debug, Clone)]
enum Values {
    Generic(Vec<Value>),
    UInt {
        values: Vec<u64>,
        max: u64,
    },
    Int {
        values: Vec<i64>,
        min: i64,
        max: i64,
    },
    Float(Vec<f64>),
    /// UTF-8 bytes and the Arrow offsets into them (`offsets[0]` is 0).
    Str {
        bytes: Vec<u8>,
        offsets: Vec<i32>,
    },
}

impl Column {
    /// An empty column of type `ty`; `typed` says whether it may keep typed values (its
    /// values come unconverted from the message).
    pub fn new(ty: &ChType, typed: bool) -> Column {
        let values = match ty.value_type() {
            _ if !typed => Values::Generic(Vec::new()),
            ChType::UInt8 => Values::UInt { values: Vec::new(), max: u8::MAX.into() },
            ChType::UInt16 => Values::UInt { values: Vec::new(), max: u16::MAX.into() },
            ChType::UInt32 => Values::UInt { values: Vec::new(), max: u32::MAX.into() },
            ChType::UInt64 => Values::UInt { values: Vec::new(), max: u64::MAX },
            ChType::Int8 => Values::Int { values: Vec::new(), min: i8::MIN.into(), max: i8::MAX.into() },
            ChType::Int16 => Values::Int { values: Vec::new(), min: i16::MIN.into(), max: i16::MAX.into() },
            ChType::Int32 => Values::Int { values: Vec::new(), min: i32::MIN.into(), max: i32::MAX.into() },
            ChType::Int64 => Values::Int { values: Vec::new(), min: i64::MIN, max: i64::MAX },
            ChType::Float32 | ChType::Float64 => Values::Float(Vec::new()),
            ChType::String => Values::Str { bytes: Vec::new(), offsets: vec![0] },
            _ => Values::Generic(Vec::new()),
        };
        let valid = (ty.is_nullable() && !matches!(values, Values::Generic(_))).then(Vec::new);
        Column { values, valid }
    }

    pub fn len(&self) -> usize {
        match &self.values {
            Values::Generic(v) => v.len(),
            Values::UInt { values, .. } => values.len(),
            Values::Int { values, .. } => values.len(),
            Values::Float(v) => v.len(),
            Values::Str { offsets, .. } => offsets.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push(&mut self, cell: Cell<'_>) {
        if !self.push_typed(&cell) {
            self.make_generic().push(cell.into_value());
        }
    }

    /// Stores the cell unboxed if this column is typed and the cell fits as it is.
    fn push_typed(&mut self, cell: &Cell<'_>) -> bool {
        let pushed = match (&mut self.values, cell) {
            (Values::Generic(_), _) => return false,
            (values, Cell::Null) => {
                let Some(valid) = &mut self.valid else { return false };
                valid.push(false);
                values.push_zero();
                return true;
            }
            (Values::UInt { values, max }, Cell::Field(Field::U64(u))) if *u <= *max => {
                values.push(*u);
                true
            }
            (Values::Int { values, max, .. }, Cell::Field(Field::U64(u))) if *u <= *max as u64 => {
                values.push(*u as i64);
                true
            }
            (Values::Int { values, min, max }, Cell::Field(Field::I64(i))) if *min <= *i && *i <= *max => {
                values.push(*i);
                true
            }
            (Values::Float(values), Cell::Field(Field::F64(f))) => {
                values.push(*f);
                true
            }
            // As the text of the integer would parse: to the nearest float.
            (Values::Float(values), Cell::Field(Field::U64(u))) => {
                values.push(*u as f64);
                true
            }
            (Values::Float(values), Cell::Field(Field::I64(i))) => {
                values.push(*i as f64);
                true
            }
            (Values::Str { bytes, offsets }, Cell::Field(Field::Str(s))) => push_str(bytes, offsets, s),
            (Values::Str { bytes, offsets }, Cell::Value(Value::Str(s))) => push_str(bytes, offsets, s),
            _ => false,
        };
        if pushed {
            if let Some(valid) = &mut self.valid {
                valid.push(true);
            }
        }
        pushed
    }

    /// Turns the column generic, with the values it has, and returns them.
    fn make_generic(&mut self) -> &mut Vec<Value> {
        if !matches!(self.values, Values::Generic(_)) {
            let len = self.len();
            let valid = self.valid.take();
            let mut generic = Vec::with_capacity(len);
            for row in 0..len {
                generic.push(match &valid {
                    Some(valid) if !valid[row] => Value::Null,
                    _ => self.values.value(row),
                });
            }
            self.values = Values::Generic(generic);
        }
        match &mut self.values {
            Values::Generic(values) => values,
            _ => unreachable!("made generic above"),
        }
    }

    /// The generic values, if the column is generic.
    pub fn generic(&self) -> Option<&[Value]> {
        match &self.values {
            Values::Generic(values) => Some(values),
            _ => None,
        }
    }

    pub fn truncate(&mut self, len: usize) {
        if let Some(valid) = &mut self.valid {
            valid.truncate(len);
        }
        match &mut self.values {
            Values::Generic(v) => v.truncate(len),
            Values::UInt { values, .. } => values.truncate(len),
            Values::Int { values, .. } => values.truncate(len),
            Values::Float(v) => v.truncate(len),
            Values::Str { bytes, offsets } => {
                if len + 1 < offsets.len() {
                    offsets.truncate(len + 1);
                    bytes.truncate(offsets[len] as usize);
                }
            }
        }
    }

    pub fn remove(&mut self, row: usize) {
        if let Some(valid) = &mut self.valid {
            valid.remove(row);
        }
        match &mut self.values {
            Values::Generic(v) => drop(v.remove(row)),
            Values::UInt { values, .. } => drop(values.remove(row)),
            Values::Int { values, .. } => drop(values.remove(row)),
            Values::Float(v) => drop(v.remove(row)),
            Values::Str { bytes, offsets } => {
                let (start, end) = (offsets[row], offsets[row + 1]);
                bytes.drain(start as usize..end as usize);
                offsets.remove(row + 1);
                for offset in &mut offsets[row + 1..] {
                    *offset -= end - start;
                }
            }
        }
    }

    /// The column as an Arrow array of type `ty`; an error names a value that does not fit.
    pub fn build(&self, ty: &ChType) -> Result<ArrayRef, String> {
        let nulls = self.valid.as_deref().map(|valid| NullBuffer::new(BooleanBuffer::from(valid)));
        macro_rules! narrowed {
            ($array:ident, $values:expr, $t:ty) => {
                Arc::new($array::new($values.iter().map(|v| *v as $t).collect::<ScalarBuffer<$t>>(), nulls))
            };
        }
        Ok(match (&self.values, ty.value_type()) {
            (Values::Generic(values), _) => return column_from_values(ty, values),
            (Values::UInt { values, .. }, ChType::UInt8) => narrowed!(UInt8Array, values, u8),
            (Values::UInt { values, .. }, ChType::UInt16) => narrowed!(UInt16Array, values, u16),
            (Values::UInt { values, .. }, ChType::UInt32) => narrowed!(UInt32Array, values, u32),
            (Values::UInt { values, .. }, _) => Arc::new(UInt64Array::new(ScalarBuffer::from(values.clone()), nulls)),
            (Values::Int { values, .. }, ChType::Int8) => narrowed!(Int8Array, values, i8),
            (Values::Int { values, .. }, ChType::Int16) => narrowed!(Int16Array, values, i16),
            (Values::Int { values, .. }, ChType::Int32) => narrowed!(Int32Array, values, i32),
            (Values::Int { values, .. }, _) => Arc::new(Int64Array::new(ScalarBuffer::from(values.clone()), nulls)),
            (Values::Float(values), ChType::Float32) => narrowed!(Float32Array, values, f32),
            (Values::Float(values), _) => Arc::new(Float64Array::new(ScalarBuffer::from(values.clone()), nulls)),
            (Values::Str { bytes, offsets }, _) => Arc::new(
                StringArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets.clone())),
                    Buffer::from(bytes.as_slice()),
                    nulls,
                )
                .map_err(|e| e.to_string())?,
            ),
        })
    }
}

impl Values {
    fn push_zero(&mut self) {
        match self {
            Values::Generic(v) => v.push(Value::Null),
            Values::UInt { values, .. } => values.push(0),
            Values::Int { values, .. } => values.push(0),
            Values::Float(v) => v.push(0.0),
            Values::Str { offsets, .. } => offsets.push(offsets[offsets.len() - 1]),
        }
    }

    /// Row `row` as a generic value that converts to the same thing.
    fn value(&self, row: usize) -> Value {
        match self {
            Values::Generic(v) => v[row].clone(),
            Values::UInt { values, .. } => Value::Number(values[row].to_string()),
            Values::Int { values, .. } => Value::Number(values[row].to_string()),
            Values::Float(v) => from_json(Field::F64(v[row]).into_json()),
            Values::Str { bytes, offsets } => {
                let text = &bytes[offsets[row] as usize..offsets[row + 1] as usize];
                Value::Str(String::from_utf8_lossy(text).into_owned())
            }
        }
    }
}

/// Appends a string, unless the column's bytes would outgrow Arrow's 32-bit offsets (the
/// generic path then reports it).
fn push_str(bytes: &mut Vec<u8>, offsets: &mut Vec<i32>, s: &str) -> bool {
    let Ok(end) = i32::try_from(bytes.len() + s.len()) else { return false };
    bytes.extend_from_slice(s.as_bytes());
    offsets.push(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Array;
    use std::borrow::Cow;

    fn field(json: serde_json::Value) -> Cell<'static> {
        Field::from_json(json).map_or(Cell::Null, Cell::Field)
    }

    /// Builds the cells through a typed column and through a generic one.
    fn both(ty: &ChType, cells: &[Cell<'static>]) -> (Result<ArrayRef, String>, Result<ArrayRef, String>) {
        let (mut typed, mut generic) = (Column::new(ty, true), Column::new(ty, false));
        for cell in cells {
            typed.push(cell.clone());
            generic.push(cell.clone());
        }
        (typed.build(ty), generic.build(ty))
    }

    /// The typed path gives the same array, or the same error, as the generic conversion.
    #[test]
    fn typed_columns_convert_as_the_generic_path_does() {
        use serde_json::json;
        let values = [
            json!(0),
            json!(255),
            json!(256),
            json!(-1),
            json!(-129),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(1.5),
            json!(-2.25),
            json!(1e300),
            json!("7"),
            json!("text"),
            json!(true),
            json!(null),
        ];
        let types = [
            "UInt8",
            "UInt16",
            "UInt32",
            "UInt64",
            "Int8",
            "Int16",
            "Int32",
            "Int64",
            "Float32",
            "Float64",
            "String",
            "LowCardinality(String)",
            "Nullable(UInt32)",
            "Nullable(Float64)",
            "Nullable(String)",
            "LowCardinality(Nullable(String))",
        ];
        for ty in types {
            let ty = ChType::parse(ty).expect("type");
            // Each value alone, after a value every column takes, and all together.
            for value in &values {
                for cells in [vec![field(value.clone())], vec![field(json!(1)), field(value.clone())]] {
                    let (typed, generic) = both(&ty, &cells);
                    match (typed, generic) {
                        (Ok(a), Ok(b)) => assert_eq!(a.to_data(), b.to_data(), "{ty} {value}"),
                        (a, b) => assert_eq!(a.err(), b.err(), "{ty} {value}"),
                    }
                }
            }
        }
    }

    #[test]
    fn rows_roll_back_and_come_out() {
        let ty = ChType::parse("Nullable(String)").expect("type");
        let mut column = Column::new(&ty, true);
        for cell in [Cell::Field(Field::Str(Cow::Borrowed("a"))), Cell::Null, Cell::Value(Value::Str("ccc".into()))] {
            column.push(cell);
        }
        column.push(Cell::Field(Field::Str("dd".into())));
        column.truncate(3);
        column.remove(0);
        assert!(column.generic().is_none(), "still typed");
        let array = column.build(&ty).expect("array");
        let strings = array.as_any().downcast_ref::<StringArray>().expect("strings");
        assert_eq!(strings.iter().collect::<Vec<_>>(), vec![None, Some("ccc")]);

        column.push(Cell::Field(Field::U64(5)));
        assert_eq!(column.generic(), Some(&[Value::Null, Value::Str("ccc".into()), Value::Number("5".into())][..]));
    }
}
