//! What one statement has read so far: rows and bytes of parts, counted as the batches are
//! decoded by its scans, FINAL reads and OPTIMIZE merges. A client's progress line (as
//! clickhouse-client's) is drawn from it while the statement runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::record_batch::RecordBatch;

use crate::merge::SortedStream;

#[derive(Debug, Default)]
pub struct ReadProgress {
    rows: AtomicU64,
    bytes: AtomicU64,
}

/// A moment's reading of a [`ReadProgress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCounts {
    pub rows: u64,
    /// Decoded (uncompressed, in-memory) bytes, as ClickHouse's "read bytes" are.
    pub bytes: u64,
}

impl ReadProgress {
    pub fn add(&self, batch: &RecordBatch) {
        self.rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(batch.get_array_memory_size() as u64, Ordering::Relaxed);
    }

    pub fn counts(&self) -> ReadCounts {
        ReadCounts { rows: self.rows.load(Ordering::Relaxed), bytes: self.bytes.load(Ordering::Relaxed) }
    }

    /// Starts again from zero, for the next statement.
    pub fn reset(&self) {
        self.rows.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
    }
}

/// `stream`, its batches counted into `progress` as they are read.
pub(crate) fn counted(stream: SortedStream, progress: Option<&Arc<ReadProgress>>) -> SortedStream {
    match progress {
        None => stream,
        Some(progress) => {
            let progress = progress.clone();
            Box::new(stream.inspect(move |batch| {
                if let Ok(batch) = batch {
                    progress.add(batch);
                }
            }))
        }
    }
}
