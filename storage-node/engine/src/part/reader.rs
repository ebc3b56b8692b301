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

    /// Reads only these row ranges, which must be sorted and disjoint.
    pub fn select_rows(mut self, ranges: &[Range<usize>], total_rows: usize) -> Self {
        let mut selectors = Vec::new();
        let mut pos = 0;
        for range in ranges {
            if range.start > pos {
                selectors.push(RowSelector::skip(range.start - pos));
            }
            if range.end > range.start {
                selectors.push(RowSelector::select(range.end - range.start));
            }
            pos = range.end;
        }
        if total_rows > pos {
            selectors.push(RowSelector::skip(total_rows - pos));
        }
        self.builder = self.builder.with_row_selection(RowSelection::from(selectors));
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
