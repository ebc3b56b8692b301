//! Reads a part's rows back, whole or by granule ranges.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::ipc::reader::FileReader;
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::ProjectionMask;

use super::meta::DATA_FILE;
use super::DataPart;
use crate::error::{EngineError, Result};

pub fn read_index(path: &Path) -> Result<RecordBatch> {
    let file = File::open(path).map_err(EngineError::io(path))?;
    let reader = FileReader::try_new(file, None)?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// A configured read of one part.
pub struct PartReader {
    builder: ParquetRecordBatchReaderBuilder<File>,
    path: std::path::PathBuf,
}

impl PartReader {
    pub fn open(part: &DataPart) -> Result<PartReader> {
        let path = part.dir.join(DATA_FILE);
        let file = File::open(&path).map_err(EngineError::io(&path))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(EngineError::parquet(&path))?;
        Ok(PartReader { builder, path })
    }

    /// Reads only these columns (indices into the table schema).
    pub fn project(mut self, columns: &[usize]) -> Self {
        let mask = ProjectionMask::roots(self.builder.parquet_schema(), columns.iter().copied());
        self.builder = self.builder.with_projection(mask);
        self
    }

    /// Reads only these row ranges, which must be sorted and disjoint. Row groups without a
    /// selected row are left out of the read altogether, not skipped page by page.
    pub fn select_rows(mut self, ranges: &[Range<usize>], total_rows: usize) -> Self {
        let mut groups = Vec::new();
        let mut group_rows = Vec::new();
        let mut start = 0;
        for (i, group) in self.builder.metadata().row_groups().iter().enumerate() {
            let rows = start..start + group.num_rows() as usize;
            if ranges.iter().any(|r| r.start < rows.end && rows.start < r.end) {
                groups.push(i);
                group_rows.push(rows.clone());
            }
            start = rows.end;
        }
        if start != total_rows {
            // Row groups that do not add up to the part: select over the whole file.
            groups = (0..self.builder.metadata().num_row_groups()).collect();
            group_rows = std::iter::once(0..total_rows).collect();
        }
        // The selection counts only the rows of the row groups read.
        let mut selectors = Vec::new();
        for rows in &group_rows {
            let mut pos = rows.start;
            for range in ranges {
                let (from, to) = (range.start.max(rows.start), range.end.min(rows.end));
                if from >= to {
                    continue;
                }
                if from > pos {
                    selectors.push(RowSelector::skip(from - pos));
                }
                selectors.push(RowSelector::select(to - from));
                pos = to;
            }
            if rows.end > pos {
                selectors.push(RowSelector::skip(rows.end - pos));
            }
        }
        self.builder = self.builder.with_row_groups(groups).with_row_selection(RowSelection::from(selectors));
        self
    }

    pub fn batch_size(mut self, rows: usize) -> Self {
        self.builder = self.builder.with_batch_size(rows);
        self
    }

    pub fn build(self) -> Result<PartBatches> {
        let inner = self.builder.build().map_err(EngineError::parquet(&self.path))?;
        Ok(PartBatches { inner })
    }
}

/// The batches of one part, in key order.
pub struct PartBatches {
    inner: ParquetRecordBatchReader,
}

impl Iterator for PartBatches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map_err(EngineError::from))
    }
}
