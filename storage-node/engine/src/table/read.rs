//! Reads: plain scans with primary-key pruning, and FINAL.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use arrow_row::{RowConverter, SortField};

use super::Table;
use crate::error::Result;
use crate::merge::{SortedStream, MERGE_BLOCK_ROWS};
use crate::part::writer::ROW_GROUP_ROWS;
use crate::part::DataPart;
use crate::progress::{counted, ReadProgress};

/// The virtual column naming the part a row was read from.
pub const PART_COLUMN: &str = "_part";

/// One end of a range on the first sorting-key column: a one-row array of the column's type.
#[derive(Debug, Clone)]
pub struct KeyBound {
    pub value: ArrayRef,
    pub inclusive: bool,
}

/// Rows whose first sorting-key column lies in the range.
#[derive(Debug, Clone, Default)]
pub struct KeyRange {
    pub lower: Option<KeyBound>,
    pub upper: Option<KeyBound>,
}

#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Table column indices to read, ascending. Output batches hold them in this order,
    /// followed by `_part` when asked for.
    pub columns: Vec<usize>,
    pub key_range: Option<KeyRange>,
    pub with_part_column: bool,
    /// `do_not_merge_across_partitions_select_final`.
    pub final_within_partitions: bool,
    /// `select_sequential_consistency` on a replicated table: per partition, the highest block
    /// a read may see (parts of other partitions are not seen at all).
    pub visible_blocks: Option<Arc<BTreeMap<String, i64>>>,
    /// Counts the rows and bytes read, for the statement's progress.
    pub progress: Option<Arc<ReadProgress>>,
}

impl Table {
    /// The active parts a read sees.
    pub(super) fn visible_parts(&self, options: &ReadOptions) -> Vec<Arc<DataPart>> {
        let parts = self.snapshot();
        let Some(visible) = &options.visible_blocks else { return parts };
        parts
            .into_iter()
            .filter(|p| visible.get(&p.name.partition_id).is_some_and(|max| p.name.max_block as i64 <= *max))
            .collect()
    }

    /// The highest block number of each partition's active parts.
    pub fn max_blocks(&self) -> BTreeMap<String, u64> {
        let mut max = BTreeMap::new();
        for part in self.snapshot() {
            let block = max.entry(part.name.partition_id.clone()).or_insert(0);
            *block = part.name.max_block.max(*block);
        }
        max
    }

    /// The output schema of a read.
    pub fn read_schema(&self, options: &ReadOptions) -> SchemaRef {
        let mut fields: Vec<Field> = options.columns.iter().map(|&c| self.schema.field(c).clone()).collect();
        if options.with_part_column {
            fields.push(Field::new(PART_COLUMN, ArrowType::Utf8, false));
        }
        Arc::new(Schema::new(fields))
    }

    /// Reads the active parts, one stream per part, skipping granules outside the key range.
    pub fn scan(&self, options: &ReadOptions) -> Result<Vec<SortedStream>> {
        self.plan_scan(options, 1)?.into_iter().map(ScanTask::into_stream).collect()
    }

    /// Plans a plain read as up to `parallelism` tasks of similar size. The rows to read (after
    /// primary-key pruning) are cut at Parquet row-group boundaries, so that every task decodes
    /// whole row groups.
    pub fn plan_scan(&self, options: &ReadOptions, parallelism: usize) -> Result<Vec<ScanTask>> {
        let mut pieces: Vec<(Arc<DataPart>, Range<usize>)> = Vec::new();
        for part in self.visible_parts(options) {
            let ranges = match &options.key_range {
                Some(range) => matching_granules(&part, range)?,
                None => std::iter::once(0..part.rows() as usize).collect(),
            };
            for range in ranges {
                let mut start = range.start;
                while start < range.end {
                    let end = range.end.min((start / ROW_GROUP_ROWS + 1) * ROW_GROUP_ROWS);
                    pieces.push((part.clone(), start..end));
                    start = end;
                }
            }
        }
        let total: usize = pieces.iter().map(|(_, r)| r.len()).sum();
        let per_task = total.div_ceil(parallelism.max(1)).max(1);
        let mut tasks: Vec<ScanTask> = Vec::new();
        let mut filled = per_task;
        for (part, rows) in pieces {
            if filled >= per_task {
                tasks.push(ScanTask {
                    columns: options.columns.clone(),
                    with_part_column: options.with_part_column,
                    progress: options.progress.clone(),
                    pieces: Vec::new(),
                });
                filled = 0;
            }
            filled += rows.len();
            let task = tasks.last_mut().expect("a task was pushed");
            match task.pieces.last_mut() {
                Some((last, ranges)) if Arc::ptr_eq(last, &part) => ranges.push(rows),
                _ => task.pieces.push((part, vec![rows])),
            }
        }
        Ok(tasks)
    }
}

/// One share of a plain read: row ranges of parts.
pub struct ScanTask {
    columns: Vec<usize>,
    with_part_column: bool,
    progress: Option<Arc<ReadProgress>>,
    pieces: Vec<(Arc<DataPart>, Vec<Range<usize>>)>,
}

impl ScanTask {
    /// The task's rows, read lazily part after part.
    pub fn into_stream(self) -> Result<SortedStream> {
        let ScanTask { columns, with_part_column, progress, pieces } = self;
        Ok(Box::new(pieces.into_iter().flat_map(move |(part, ranges)| {
            match part_stream(&part, &columns, Some(&ranges), with_part_column, progress.as_ref()) {
                Ok(stream) => stream,
                Err(e) => Box::new(std::iter::once(Err(e))) as SortedStream,
            }
        })))
    }
}

pub(super) fn part_stream(
    part: &Arc<DataPart>,
    columns: &[usize],
    ranges: Option<&[Range<usize>]>,
    with_part_column: bool,
    progress: Option<&Arc<ReadProgress>>,
) -> Result<SortedStream> {
    let mut reader = part.reader()?.project(columns).batch_size(MERGE_BLOCK_ROWS);
    if let Some(ranges) = ranges {
        if !(ranges.len() == 1 && ranges[0] == (0..part.rows() as usize)) {
            reader = reader.select_rows(ranges, part.rows() as usize);
        }
    }
    let batches = counted(Box::new(reader.build()?), progress);
    // The stream holds the part, so a merge cannot delete it while it is read.
    let holder = part.clone();
    if !with_part_column {
        return Ok(Box::new(batches.inspect(move |_| {
            let _ = &holder;
        })));
    }
    let name = part.name.to_string();
    Ok(Box::new(batches.map(move |batch| {
        let _ = &holder;
        let batch = batch?;
        let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(PART_COLUMN, ArrowType::Utf8, false));
        let mut arrays = batch.columns().to_vec();
        arrays.push(Arc::new(StringArray::from(vec![name.as_str(); batch.num_rows()])) as ArrayRef);
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    })))
}

/// Granule row ranges of a part whose first key column may fall in `range`.
fn matching_granules(part: &DataPart, range: &KeyRange) -> Result<Vec<Range<usize>>> {
    let rows = part.rows() as usize;
    let granularity = part.meta.index_granularity as usize;
    let marks = part.index.column(0);
    let converter = RowConverter::new(vec![SortField::new(marks.data_type().clone())])?;
    let mark_rows = converter.convert_columns(std::slice::from_ref(marks))?;
    let bound = |b: &KeyBound| -> Result<Option<arrow_row::OwnedRow>> {
        if b.value.data_type() != marks.data_type() || b.value.is_empty() {
            return Ok(None);
        }
        Ok(Some(converter.convert_columns(std::slice::from_ref(&b.value))?.row(0).owned()))
    };
    let lower = range.lower.as_ref().map(|b| bound(b).map(|r| (r, b.inclusive))).transpose()?;
    let upper = range.upper.as_ref().map(|b| bound(b).map(|r| (r, b.inclusive))).transpose()?;
    let granules = rows.div_ceil(granularity);
    let mut out: Vec<Range<usize>> = Vec::new();
    for g in 0..granules {
        let first = mark_rows.row(g);
        let last = mark_rows.row((g + 1).min(mark_rows.num_rows() - 1));
        let above_lower = match &lower {
            Some((Some(l), inclusive)) => {
                if *inclusive {
                    last >= l.row()
                } else {
                    last > l.row()
                }
            }
            _ => true,
        };
        let below_upper = match &upper {
            Some((Some(u), inclusive)) => {
                if *inclusive {
                    first <= u.row()
                } else {
                    first < u.row()
                }
            }
            _ => true,
        };
        if above_lower && below_upper {
            let start = g * granularity;
            let end = ((g + 1) * granularity).min(rows);
            match out.last_mut() {
                Some(prev) if prev.end == start => prev.end = end,
                _ => out.push(start..end),
            }
        }
    }
    Ok(out)
}
