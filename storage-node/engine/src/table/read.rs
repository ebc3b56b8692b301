//! Reads: plain scans with primary-key pruning, and FINAL.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use arrow_row::{RowConverter, SortField};

use super::Table;
use crate::error::{EngineError, Result};
use crate::merge::{build_algorithm, AlgorithmOptions, SortedMerge, SortedStream, MERGE_BLOCK_ROWS};
use crate::part::DataPart;
use crate::schema::EngineKind;

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
}

impl Table {
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
        let mut streams = Vec::new();
        for part in self.snapshot() {
            let ranges = match &options.key_range {
                Some(range) => matching_granules(&part, range)?,
                None => std::iter::once(0..part.rows() as usize).collect(),
            };
            if ranges.is_empty() {
                continue;
            }
            streams.push(part_stream(&part, &options.columns, Some(&ranges), options.with_part_column)?);
        }
        Ok(streams)
    }

    /// `SELECT … FINAL`: the engine's merge at query time over the active parts, in key order.
    /// Runs of parts whose key ranges overlap no other part are read without merging, with the
    /// engine's visibility filter (is_deleted, sign) applied by hand.
    pub fn read_final(&self, options: &ReadOptions) -> Result<SortedStream> {
        if matches!(self.def.engine, EngineKind::MergeTree) {
            return Err(EngineError::BadOptimize {
                table: self.def.name.clone(),
                message: "Storage MergeTree doesn't support FINAL".into(),
            });
        }
        let merge_columns = self.final_columns(&options.columns);
        // `_part` rides along as the last column: each surviving row names its part.
        let part_column = options.with_part_column;
        let merge_schema = {
            let projected = self.schema.project(&merge_columns)?;
            let mut fields: Vec<Field> = projected.fields().iter().map(|f| f.as_ref().clone()).collect();
            if part_column {
                fields.push(Field::new(PART_COLUMN, ArrowType::Utf8, false));
            }
            Arc::new(Schema::new(fields))
        };
        let key_columns: Vec<usize> =
            self.key_columns.iter().map(|k| merge_columns.iter().position(|c| c == k).unwrap_or_default()).collect();
        let mut out_positions: Vec<usize> =
            options.columns.iter().map(|c| merge_columns.iter().position(|m| m == c).unwrap_or_default()).collect();
        if part_column {
            out_positions.push(merge_columns.len());
        }
        let filter = self.visibility_filter(&merge_schema);

        let parts = self.snapshot();
        let groups: Vec<Vec<Arc<DataPart>>> = if options.final_within_partitions {
            let mut groups: Vec<Vec<Arc<DataPart>>> = Vec::new();
            for part in parts {
                match groups.last_mut() {
                    Some(g) if g[0].name.partition_id == part.name.partition_id => g.push(part),
                    _ => groups.push(vec![part]),
                }
            }
            groups
        } else {
            vec![parts]
        };
        let mut pieces: Vec<SortedStream> = Vec::new();
        for group in groups {
            for component in overlapping_components(&group, &self.schema, &self.key_columns)? {
                if component.len() == 1 {
                    let stream = part_stream(&component[0], &merge_columns, None, part_column)?;
                    pieces.push(match &filter {
                        Some(f) => apply_filter(stream, *f),
                        None => stream,
                    });
                    continue;
                }
                let sources = component
                    .iter()
                    .map(|p| Ok((part_stream(p, &merge_columns, None, part_column)?, p.name.level > 0)))
                    .collect::<Result<Vec<_>>>()?;
                let algorithm =
                    build_algorithm(&self.def, &merge_schema, AlgorithmOptions { cleanup: true, final_read: true })?;
                let merge = SortedMerge::new(merge_schema.clone(), key_columns.clone(), sources, algorithm)?;
                pieces.push(Box::new(merge));
            }
        }
        let positions = out_positions;
        Ok(Box::new(pieces.into_iter().flatten().map(move |batch| batch.and_then(|b| Ok(b.project(&positions)?)))))
    }

    /// Columns a FINAL merge needs: the requested ones, the key, the engine's columns. Like
    /// ClickHouse, only the columns read take part: a SummingMergeTree FINAL that reads no
    /// summed column drops no zero rows.
    fn final_columns(&self, requested: &[usize]) -> Vec<usize> {
        let mut names: Vec<&str> = Vec::new();
        match &self.def.engine {
            EngineKind::ReplacingMergeTree { version, is_deleted } => {
                names.extend(version.as_deref());
                names.extend(is_deleted.as_deref());
            }
            EngineKind::CollapsingMergeTree { sign } => names.push(sign),
            EngineKind::VersionedCollapsingMergeTree { sign, version } => {
                names.push(sign);
                names.push(version);
            }
            _ => {}
        }
        let mut columns: Vec<usize> = requested.to_vec();
        columns.extend(self.key_columns.iter().copied());
        columns.extend(names.iter().filter_map(|n| self.def.column_index(n)));
        columns.sort_unstable();
        columns.dedup();
        columns
    }

    /// What FINAL hides when a part is read without merging.
    fn visibility_filter(&self, schema: &SchemaRef) -> Option<VisibilityFilter> {
        match &self.def.engine {
            EngineKind::ReplacingMergeTree { is_deleted: Some(d), .. } => {
                schema.index_of(d).ok().map(VisibilityFilter::NotDeleted)
            }
            EngineKind::CollapsingMergeTree { sign } => schema.index_of(sign).ok().map(VisibilityFilter::PositiveSign),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum VisibilityFilter {
    NotDeleted(usize),
    PositiveSign(usize),
}

fn apply_filter(stream: SortedStream, filter: VisibilityFilter) -> SortedStream {
    Box::new(stream.map(move |batch| {
        let batch = batch?;
        let keep: BooleanArray = match filter {
            VisibilityFilter::NotDeleted(c) => {
                let col = batch.column(c).as_primitive::<arrow::datatypes::UInt8Type>();
                col.iter().map(|v| Some(v == Some(0))).collect()
            }
            VisibilityFilter::PositiveSign(c) => {
                let col = batch.column(c).as_primitive::<arrow::datatypes::Int8Type>();
                col.iter().map(|v| Some(v.is_some_and(|s| s > 0))).collect()
            }
        };
        Ok(filter_record_batch(&batch, &keep)?)
    }))
}

fn part_stream(
    part: &Arc<DataPart>,
    columns: &[usize],
    ranges: Option<&[Range<usize>]>,
    with_part_column: bool,
) -> Result<SortedStream> {
    let mut reader = part.reader()?.project(columns).batch_size(MERGE_BLOCK_ROWS);
    if let Some(ranges) = ranges {
        if !(ranges.len() == 1 && ranges[0] == (0..part.rows() as usize)) {
            reader = reader.select_rows(ranges, part.rows() as usize);
        }
    }
    let batches = reader.build()?;
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

/// Groups parts (in insertion order) into runs whose key ranges overlap, ordered by key;
/// each run keeps insertion order inside.
fn overlapping_components(
    parts: &[Arc<DataPart>],
    schema: &SchemaRef,
    key_columns: &[usize],
) -> Result<Vec<Vec<Arc<DataPart>>>> {
    if parts.len() < 2 {
        return Ok(parts.iter().map(|p| vec![p.clone()]).collect());
    }
    let fields = key_columns.iter().map(|&c| SortField::new(schema.field(c).data_type().clone())).collect();
    let converter = RowConverter::new(fields)?;
    let mut ranges = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let index = &part.index;
        if index.num_rows() == 0 {
            continue;
        }
        let rows = converter.convert_columns(index.columns())?;
        ranges.push((rows.row(0).owned(), rows.row(rows.num_rows() - 1).owned(), i));
    }
    ranges.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));
    let mut components: Vec<Vec<usize>> = Vec::new();
    let mut current_max: Option<arrow_row::OwnedRow> = None;
    for (min, max, i) in ranges {
        match (&mut current_max, components.last_mut()) {
            (Some(cmax), Some(component)) if min.row() <= cmax.row() => {
                component.push(i);
                if max.row() > cmax.row() {
                    *cmax = max;
                }
            }
            _ => {
                components.push(vec![i]);
                current_max = Some(max);
            }
        }
    }
    Ok(components
        .into_iter()
        .map(|mut c| {
            c.sort_unstable();
            c.into_iter().map(|i| parts[i].clone()).collect()
        })
        .collect())
}
