//! The rows a merging algorithm emits, gathered into Arrow batches.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Decimal128Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    Int8Array, RecordBatch, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use arrow::compute::interleave;
use arrow::datatypes::{DataType as ArrowType, SchemaRef};
use arrow::error::ArrowError;

use crate::error::Result;

/// A row of an input batch: the batch's slot, the row inside it, and the source (part) index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef {
    pub slot: usize,
    pub row: usize,
    pub source: usize,
}

impl RowRef {
    fn at(self) -> (usize, usize) {
        (self.slot, self.row)
    }
}

/// Values of one column that differ from the output row's own (aggregated columns).
enum ColumnValues {
    Rows(Vec<(usize, usize)>),
    Ints(Vec<Option<i128>>),
    Floats(Vec<Option<f64>>),
    Bytes(Vec<Option<Vec<u8>>>),
}

pub struct Output {
    rows: Vec<(usize, usize)>,
    columns: Vec<Option<ColumnValues>>,
}

impl Output {
    pub fn new(columns: usize) -> Output {
        Output { rows: Vec::new(), columns: (0..columns).map(|_| None).collect() }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Emits an input row as it is.
    pub fn push(&mut self, row: RowRef) {
        self.rows.push(row.at());
    }

    /// For column `column` of the row just pushed, take the value of another input row.
    pub fn set_row(&mut self, column: usize, row: RowRef) {
        match self.columns[column].get_or_insert_with(|| ColumnValues::Rows(Vec::new())) {
            ColumnValues::Rows(rows) => rows.push(row.at()),
            _ => unreachable!("a column's values are of one kind"),
        }
    }

    pub fn set_int(&mut self, column: usize, value: Option<i128>) {
        match self.columns[column].get_or_insert_with(|| ColumnValues::Ints(Vec::new())) {
            ColumnValues::Ints(values) => values.push(value),
            _ => unreachable!("a column's values are of one kind"),
        }
    }

    pub fn set_float(&mut self, column: usize, value: Option<f64>) {
        match self.columns[column].get_or_insert_with(|| ColumnValues::Floats(Vec::new())) {
            ColumnValues::Floats(values) => values.push(value),
            _ => unreachable!("a column's values are of one kind"),
        }
    }

    pub fn set_bytes(&mut self, column: usize, value: Option<Vec<u8>>) {
        match self.columns[column].get_or_insert_with(|| ColumnValues::Bytes(Vec::new())) {
            ColumnValues::Bytes(values) => values.push(value),
            _ => unreachable!("a column's values are of one kind"),
        }
    }

    /// Gathers the pending rows into one batch and clears them.
    pub fn build(&mut self, schema: &SchemaRef, slots: &[RecordBatch]) -> Result<RecordBatch> {
        let rows = std::mem::take(&mut self.rows);
        let mut arrays = Vec::with_capacity(schema.fields().len());
        for (c, field) in schema.fields().iter().enumerate() {
            let inputs: Vec<&dyn Array> = slots.iter().map(|b| b.column(c).as_ref()).collect();
            let array = match self.columns[c].take() {
                None => interleave(&inputs, &rows)?,
                Some(ColumnValues::Rows(own)) => interleave(&inputs, &own)?,
                Some(ColumnValues::Ints(values)) => ints_to_array(field.data_type(), values)?,
                Some(ColumnValues::Floats(values)) => floats_to_array(field.data_type(), values)?,
                Some(ColumnValues::Bytes(values)) => Arc::new(values.into_iter().collect::<BinaryArray>()),
            };
            arrays.push(array);
        }
        Ok(RecordBatch::try_new(schema.clone(), arrays)?)
    }
}

/// Sums are kept as i128 and wrap to the column's width, as ClickHouse's sums do.
fn ints_to_array(ty: &ArrowType, values: Vec<Option<i128>>) -> Result<ArrayRef> {
    let it = values.into_iter();
    let array: ArrayRef = match ty {
        ArrowType::UInt8 => Arc::new(it.map(|v| v.map(|v| v as u8)).collect::<UInt8Array>()),
        ArrowType::UInt16 => Arc::new(it.map(|v| v.map(|v| v as u16)).collect::<UInt16Array>()),
        ArrowType::UInt32 => Arc::new(it.map(|v| v.map(|v| v as u32)).collect::<UInt32Array>()),
        ArrowType::UInt64 => Arc::new(it.map(|v| v.map(|v| v as u64)).collect::<UInt64Array>()),
        ArrowType::Int8 => Arc::new(it.map(|v| v.map(|v| v as i8)).collect::<Int8Array>()),
        ArrowType::Int16 => Arc::new(it.map(|v| v.map(|v| v as i16)).collect::<Int16Array>()),
        ArrowType::Int32 => Arc::new(it.map(|v| v.map(|v| v as i32)).collect::<Int32Array>()),
        ArrowType::Int64 => Arc::new(it.map(|v| v.map(|v| v as i64)).collect::<Int64Array>()),
        ArrowType::Decimal128(p, s) => Arc::new(it.collect::<Decimal128Array>().with_precision_and_scale(*p, *s)?),
        other => {
            return Err(
                ArrowError::InvalidArgumentError(format!("integer aggregate into a column of type {other}")).into()
            )
        }
    };
    Ok(array)
}

fn floats_to_array(ty: &ArrowType, values: Vec<Option<f64>>) -> Result<ArrayRef> {
    let it = values.into_iter();
    let array: ArrayRef = match ty {
        ArrowType::Float32 => Arc::new(it.map(|v| v.map(|v| v as f32)).collect::<Float32Array>()),
        _ => Arc::new(it.collect::<Float64Array>()),
    };
    Ok(array)
}
