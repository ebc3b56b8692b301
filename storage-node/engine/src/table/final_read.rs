//! `SELECT … FINAL`: the engine's merge at query time, split into key ranges that run in
//! parallel.
//!
//! The parts whose key ranges overlap are merged with the engine's algorithm in FINAL mode; a
//! part that overlaps no other part is read without merging, with the engine's visibility filter
//! (is_deleted, sign) applied by hand. With a parallelism of N the key space is cut at N-1 keys
//! taken from the parts' sparse indexes; every part is read by row ranges on both sides of a cut,
//! so each task merges exactly the rows of its range and no group of equal keys is split.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{AsArray, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use arrow_row::{OwnedRow, RowConverter, Rows, SortField};

use super::read::{part_stream, ReadOptions, PART_COLUMN};
use super::Table;
use crate::error::{EngineError, Result};
use crate::merge::{build_algorithm, AlgorithmOptions, SortedMerge, SortedStream};
use crate::part::DataPart;
use crate::progress::ReadProgress;
use crate::schema::{EngineKind, TableDef};

/// FINAL splits its work only when the parts hold at least this many rows.
const MIN_ROWS_TO_SPLIT: u64 = 200_000;

/// A part and the rows of it that a piece reads.
type PartRows = (Arc<DataPart>, Range<usize>);

/// One key range of a FINAL read: pieces in key order, each merged or read directly.
pub struct FinalTask {
    def: TableDef,
    merge_columns: Vec<usize>,
    merge_schema: SchemaRef,
    key_columns: Vec<usize>,
    out_positions: Vec<usize>,
    filter: Option<VisibilityFilter>,
    part_column: bool,
    progress: Option<Arc<ReadProgress>>,
    pieces: Vec<Vec<PartRows>>,
}

impl FinalTask {
    /// The task's rows, merged lazily as the stream is read.
    pub fn into_stream(self) -> SortedStream {
        let FinalTask {
            def,
            merge_columns,
            merge_schema,
            key_columns,
            out_positions,
            filter,
            part_column,
            progress,
            pieces,
        } = self;
        let open = move |piece: Vec<PartRows>| -> Result<SortedStream> {
            if let [(part, rows)] = piece.as_slice() {
                let stream = part_stream(
                    part,
                    &merge_columns,
                    Some(std::slice::from_ref(rows)),
                    part_column,
                    progress.as_ref(),
                )?;
                return Ok(match filter {
                    Some(f) => apply_filter(stream, f),
                    None => stream,
                });
            }
            let sources = piece
                .iter()
                .map(|(p, rows)| {
                    Ok((
                        part_stream(
                            p,
                            &merge_columns,
                            Some(std::slice::from_ref(rows)),
                            part_column,
                            progress.as_ref(),
                        )?,
                        p.name.level > 0,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let algorithm = build_algorithm(&def, &merge_schema, AlgorithmOptions { cleanup: true, final_read: true })?;
            Ok(Box::new(SortedMerge::new(merge_schema.clone(), key_columns.clone(), sources, algorithm)?))
        };
        let batches = pieces.into_iter().flat_map(move |piece| match open(piece) {
            Ok(stream) => stream,
            Err(e) => Box::new(std::iter::once(Err(e))) as SortedStream,
        });
        Box::new(batches.map(move |batch| batch.and_then(|b| Ok(b.project(&out_positions)?))))
    }
}

impl Table {
    /// Plans a FINAL read as up to `parallelism` tasks over disjoint key ranges, in key order.
    pub fn plan_final(&self, options: &ReadOptions, parallelism: usize) -> Result<Vec<FinalTask>> {
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

        let parts = self.visible_parts(options);
        let converter = RowConverter::new(
            self.key_columns.iter().map(|&c| SortField::new(self.schema.field(c).data_type().clone())).collect(),
        )?;
        // Each part's sparse index, encoded once for the cuts, their offsets and the overlaps.
        let marks: Vec<Rows> = parts
            .iter()
            .map(|p| converter.convert_columns(p.index.columns()))
            .collect::<std::result::Result<_, _>>()?;
        let total_rows: u64 = parts.iter().map(|p| p.rows()).sum();
        let cuts =
            if parallelism > 1 && total_rows >= MIN_ROWS_TO_SPLIT { key_cuts(&marks, parallelism) } else { Vec::new() };
        // Row offsets of every cut in every part.
        let offsets: Vec<Vec<usize>> = parts
            .iter()
            .zip(&marks)
            .map(|(p, m)| {
                cuts.iter().map(|cut| self.first_row_not_below(p, m, &converter, cut)).collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;

        let groups: Vec<Vec<usize>> = if options.final_within_partitions {
            let mut groups: Vec<Vec<usize>> = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                match groups.last_mut() {
                    Some(g) if parts[g[0]].name.partition_id == part.name.partition_id => g.push(i),
                    _ => groups.push(vec![i]),
                }
            }
            groups
        } else {
            vec![(0..parts.len()).collect()]
        };
        let mut tasks: Vec<Vec<Vec<PartRows>>> = vec![Vec::new(); cuts.len() + 1];
        for group in groups {
            let group_marks: Vec<&Rows> = group.iter().map(|&i| &marks[i]).collect();
            for component in overlapping_components(&group_marks) {
                for (range, task) in tasks.iter_mut().enumerate() {
                    let piece: Vec<PartRows> = component
                        .iter()
                        .map(|&m| {
                            let i = group[m];
                            let bounds = &offsets[i];
                            let start = if range == 0 { 0 } else { bounds[range - 1] };
                            let end = bounds.get(range).copied().unwrap_or(parts[i].rows() as usize);
                            (parts[i].clone(), start..end)
                        })
                        .filter(|(_, rows)| !rows.is_empty())
                        .collect();
                    if !piece.is_empty() {
                        task.push(piece);
                    }
                }
            }
        }
        Ok(tasks
            .into_iter()
            .filter(|pieces| !pieces.is_empty())
            .map(|pieces| FinalTask {
                def: self.def.clone(),
                merge_columns: merge_columns.clone(),
                merge_schema: merge_schema.clone(),
                key_columns: key_columns.clone(),
                out_positions: out_positions.clone(),
                filter,
                part_column,
                progress: options.progress.clone(),
                pieces,
            })
            .collect())
    }

    /// FINAL as one stream, in key order.
    pub fn read_final(&self, options: &ReadOptions) -> Result<SortedStream> {
        let tasks = self.plan_final(options, 1)?;
        Ok(Box::new(tasks.into_iter().flat_map(FinalTask::into_stream)))
    }

    /// The first row of `part` whose key is not below `cut`: found in the sparse index, then in
    /// the one granule that can hold it.
    fn first_row_not_below(
        &self,
        part: &DataPart,
        marks: &Rows,
        converter: &RowConverter,
        cut: &OwnedRow,
    ) -> Result<usize> {
        let rows = part.rows() as usize;
        let granularity = part.meta.index_granularity as usize;
        let granules = rows.div_ceil(granularity);
        let after = partition_point(granules, |g| marks.row(g) < cut.row());
        if after == 0 {
            return Ok(0);
        }
        let granule = after - 1;
        let (start, end) = (granule * granularity, ((granule + 1) * granularity).min(rows));
        let mut sorted_keys = self.key_columns.clone();
        sorted_keys.sort_unstable();
        let positions: Vec<usize> =
            self.key_columns.iter().map(|k| sorted_keys.iter().position(|s| s == k).unwrap_or_default()).collect();
        let mut offset = start;
        for batch in
            part.reader()?.project(&sorted_keys).select_rows(std::slice::from_ref(&(start..end)), rows).build()?
        {
            let batch = batch?.project(&positions)?;
            let keys = converter.convert_columns(batch.columns())?;
            let below = partition_point(keys.num_rows(), |i| keys.row(i) < cut.row());
            if below < keys.num_rows() {
                return Ok(offset + below);
            }
            offset += keys.num_rows();
        }
        Ok(end)
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

/// The first index in `0..len` where `below` turns false (`below` holds for a prefix).
fn partition_point(len: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Keys that cut the parts' rows into `parallelism` ranges of similar size: quantiles of all
/// index marks (each mark stands for a granule of rows).
fn key_cuts(part_marks: &[Rows], parallelism: usize) -> Vec<OwnedRow> {
    let mut marks: Vec<OwnedRow> = Vec::new();
    for rows in part_marks {
        // The last index row is the part's last key, not the start of a granule.
        marks.extend((0..rows.num_rows().saturating_sub(1)).map(|i| rows.row(i).owned()));
    }
    marks.sort_unstable();
    let mut cuts: Vec<OwnedRow> =
        (1..parallelism).filter_map(|i| marks.get(i * marks.len() / parallelism).cloned()).collect();
    cuts.dedup();
    // A cut at the smallest key would leave the first range empty.
    if let Some(first) = marks.first() {
        cuts.retain(|c| c.row() > first.row());
    }
    cuts
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

/// Groups parts (in insertion order) into runs whose key ranges overlap, ordered by key;
/// each run keeps insertion order inside.
fn overlapping_components(marks: &[&Rows]) -> Vec<Vec<usize>> {
    if marks.len() < 2 {
        return (0..marks.len()).map(|i| vec![i]).collect();
    }
    let mut ranges = Vec::with_capacity(marks.len());
    for (i, rows) in marks.iter().enumerate() {
        if rows.num_rows() == 0 {
            continue;
        }
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
    components
        .into_iter()
        .map(|mut c| {
            c.sort_unstable();
            c
        })
        .collect()
}
