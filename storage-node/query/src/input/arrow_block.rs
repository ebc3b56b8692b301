//! Arrow blocks that writers send (the insert service): their columns matched to the table's
//! by name, as ClickHouse matches an Arrow or Parquet input to a table, never by position.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{can_cast_types, cast_with_options, CastOptions};
use mergestream_engine::Table;

use super::{build_block, RowsInput};
use crate::error::{QueryError, Result};

/// The table's insert block from a writer's batch. A table column that the batch leaves out
/// takes its DEFAULT; one without a DEFAULT is an error, as is a batch column the table does
/// not have, a column sent twice, or a value that does not convert to the column's type
/// (overflow included: nothing is wrapped or truncated on the way in).
pub fn conform_block(table: &Table, batch: &RecordBatch) -> Result<RecordBatch> {
    let def = table.def();
    let schema = table.user_schema();
    let sent = batch.schema();
    let bad = |message: String| QueryError::Invalid(format!("table {}: {message}", def.name));
    for (i, field) in sent.fields().iter().enumerate() {
        if schema.field_with_name(field.name()).is_err() {
            return Err(bad(format!("the block has column {:?}, which the table does not have", field.name())));
        }
        if sent.fields()[..i].iter().any(|f| f.name() == field.name()) {
            return Err(bad(format!("the block has column {:?} twice", field.name())));
        }
    }
    let strict = CastOptions { safe: false, ..Default::default() };
    // Built once, when the first column left out is met: one row of defaults per row.
    let mut defaults: Option<RecordBatch> = None;
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let Some((at, sent_field)) = sent.column_with_name(field.name()) else {
            if !def.defaults.contains_key(field.name()) {
                return Err(bad(format!("the block has no column {:?}, and it has no DEFAULT", field.name())));
            }
            let block = match defaults.take() {
                Some(block) => block,
                None => build_block(table, RowsInput { columns: vec![], rows: vec![vec![]; batch.num_rows()] })?,
            };
            columns.push(block.column(i).clone());
            defaults = Some(block);
            continue;
        };
        let column = batch.column(at);
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(bad(format!("column {:?} is not Nullable but the block holds NULL", field.name())));
        }
        if sent_field.data_type() == field.data_type() {
            columns.push(column.clone());
            continue;
        }
        let mismatch = |why: String| {
            bad(format!(
                "column {:?} is sent as {}, which does not convert to the column's {}{why}",
                field.name(),
                sent_field.data_type(),
                field.data_type()
            ))
        };
        if !can_cast_types(sent_field.data_type(), field.data_type()) {
            return Err(mismatch(String::new()));
        }
        let converted =
            cast_with_options(column, field.data_type(), &strict).map_err(|e| mismatch(format!(": {e}")))?;
        columns.push(converted);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}
