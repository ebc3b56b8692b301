//! The k-way merge of sorted streams and the merging algorithms of the MergeTree family.
//!
//! One [`SortedMerge`] serves all three places where ClickHouse applies an engine's rules: inside
//! one insert block (a single sorted source), in background merges and OPTIMIZE (one source per
//! part), and at query time for FINAL. Rows with equal sorting keys arrive grouped, ordered by
//! source (oldest part first) and then by their order inside the source; the engine's
//! [`MergingAlgorithm`] decides which rows of the group survive.

mod aggregating;
mod algorithm;
mod collapsing;
mod decode_ahead;
mod output;
mod replacing;
pub mod select;
pub(crate) mod values;
mod versioned_collapsing;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_row::{RowConverter, Rows, SortField};

pub use algorithm::{build_algorithm, AlgorithmOptions, MergingAlgorithm};
pub use decode_ahead::decode_ahead;
pub use output::{Output, RowRef};

use crate::error::Result;

/// A source of batches in sorting-key order.
pub type SortedStream = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Rows per output batch of a merge.
pub const MERGE_BLOCK_ROWS: usize = 8192;

struct Cursor {
    stream: SortedStream,
    /// The source is a part written by the algorithm (level > 0). ClickHouse assumes such a part
    /// has no duplicate keys: a row from the same part as the first row of the current group
    /// starts a new group without a comparison (`rowsHaveDifferentSortColumns`). That decides
    /// how CollapsingMergeTree pairs a part's own -1/+1 rows, so it is reproduced here.
    assume_distinct: bool,
    /// The slot holding the current batch.
    slot: usize,
    rows: Rows,
    /// The rows' keys as integers, when the merge compares packed keys: the key's bytes at the
    /// top, the low [`SOURCE_BITS`] zero.
    packed: Vec<u128>,
    len: usize,
    pos: usize,
}

/// Merges sorted sources and applies a merging algorithm; yields output batches.
pub struct SortedMerge {
    schema: SchemaRef,
    key_columns: Vec<usize>,
    converter: RowConverter,
    /// The width of every key in the row format, if it is packed (see [`packed_width`]).
    packed_width: Option<usize>,
    /// With packed keys, each cursor's current key with the cursor's index in the low bits:
    /// the heap's order (key, then source) is then one integer comparison, read from one
    /// array rather than through the cursor and its batch.
    heads: Vec<u128>,
    algorithm: Box<dyn MergingAlgorithm>,
    cursors: Vec<Option<Cursor>>,
    /// Indices of live cursors, a binary min-heap by (current key, source index).
    heap: Vec<usize>,
    slots: Vec<RecordBatch>,
    output: Output,
    /// The encoded key of the current group; a reused buffer, so a new group costs no
    /// allocation.
    group_key: Vec<u8>,
    group_packed: u128,
    in_group: bool,
    /// Source of the first row of the current group.
    group_source: Option<usize>,
    started: bool,
    finished: bool,
}

impl SortedMerge {
    /// `sources` are in insertion order, oldest first: the tie-break rules depend on it. Each
    /// comes with whether it is a part at level > 0 (see [`Cursor::assume_distinct`]).
    pub fn new(
        schema: SchemaRef,
        key_columns: Vec<usize>,
        sources: Vec<(SortedStream, bool)>,
        algorithm: Box<dyn MergingAlgorithm>,
    ) -> Result<SortedMerge> {
        let fields = key_columns.iter().map(|&c| SortField::new(schema.field(c).data_type().clone())).collect();
        let converter = RowConverter::new(fields)?;
        let packed_width = packed_width(&schema, &key_columns).filter(|_| sources.len() <= 1 << SOURCE_BITS);
        let heads = vec![0; sources.len()];
        let cursors = sources
            .into_iter()
            .map(|(stream, assume_distinct)| {
                Some(Cursor {
                    stream,
                    assume_distinct,
                    slot: usize::MAX,
                    rows: converter.empty_rows(0, 0),
                    packed: Vec::new(),
                    len: 0,
                    pos: 0,
                })
            })
            .collect();
        let columns = schema.fields().len();
        Ok(SortedMerge {
            schema,
            key_columns,
            converter,
            packed_width,
            heads,
            algorithm,
            cursors,
            heap: Vec::new(),
            slots: Vec::new(),
            output: Output::new(columns),
            group_key: Vec::new(),
            group_packed: 0,
            in_group: false,
            group_source: None,
            started: false,
            finished: false,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Loads the next non-empty batch of cursor `i`; drops the cursor at its end.
    fn advance_batch(&mut self, i: usize) -> Result<bool> {
        loop {
            let Some(cursor) = self.cursors[i].as_mut() else {
                return Ok(false);
            };
            match cursor.stream.next() {
                None => {
                    self.cursors[i] = None;
                    return Ok(false);
                }
                Some(batch) => {
                    let batch = batch?;
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let keys: Vec<_> = self.key_columns.iter().map(|&c| batch.column(c).clone()).collect();
                    let rows = self.converter.convert_columns(&keys)?;
                    let packed = match self.packed_width {
                        Some(width) => pack(&rows, width).unwrap_or_else(|| {
                            // Not the width the key types have: compare the rows themselves.
                            self.packed_width = None;
                            Vec::new()
                        }),
                        None => Vec::new(),
                    };
                    let cursor = self.cursors[i].as_mut().expect("cursor checked above");
                    cursor.rows = rows;
                    cursor.packed = packed;
                    cursor.len = batch.num_rows();
                    cursor.pos = 0;
                    cursor.slot = self.slots.len();
                    if let Some(&first) = cursor.packed.first() {
                        self.heads[i] = first | i as u128;
                    }
                    self.slots.push(batch);
                    return Ok(true);
                }
            }
        }
    }

    fn less(&self, a: usize, b: usize) -> bool {
        if self.packed_width.is_some() {
            return self.heads[a] < self.heads[b];
        }
        let (ca, cb) = match (&self.cursors[a], &self.cursors[b]) {
            (Some(ca), Some(cb)) => (ca, cb),
            _ => return a < b,
        };
        match ca.rows.row(ca.pos).cmp(&cb.rows.row(cb.pos)) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => a < b,
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && self.less(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < n && self.less(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                return;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }

    fn start(&mut self) -> Result<()> {
        for i in 0..self.cursors.len() {
            if self.advance_batch(i)? {
                self.heap.push(i);
            }
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
        self.started = true;
        Ok(())
    }

    /// Drops batches no cursor and no pending output row refers to, renumbering slots.
    fn compact_slots(&mut self) {
        let mut remap = vec![usize::MAX; self.slots.len()];
        let mut kept = Vec::new();
        for cursor in self.cursors.iter_mut().flatten() {
            if remap[cursor.slot] == usize::MAX {
                remap[cursor.slot] = kept.len();
                kept.push(self.slots[cursor.slot].clone());
            }
            cursor.slot = remap[cursor.slot];
        }
        self.slots = kept;
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>> {
        if self.output.is_empty() {
            return Ok(None);
        }
        let batch = self.output.build(&self.schema, &self.slots)?;
        self.compact_slots();
        Ok(Some(batch))
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        if self.finished {
            return Ok(None);
        }
        if !self.started {
            self.start()?;
        }
        while let Some(&top) = self.heap.first() {
            let starts_group = {
                let cursor = self.cursors[top].as_ref().expect("heap holds live cursors");
                let same_key = match self.packed_width {
                    Some(_) => self.heads[top] & KEY_MASK == self.group_packed,
                    None => cursor.rows.row(cursor.pos).as_ref() == self.group_key.as_slice(),
                };
                let same = self.in_group && !(cursor.assume_distinct && self.group_source == Some(top)) && same_key;
                if !same {
                    match self.packed_width {
                        Some(_) => self.group_packed = self.heads[top] & KEY_MASK,
                        None => {
                            self.group_key.clear();
                            self.group_key.extend_from_slice(cursor.rows.row(cursor.pos).as_ref());
                        }
                    }
                    self.group_source = Some(top);
                    self.in_group = true;
                }
                !same
            };
            let mut ready = None;
            if starts_group && self.algorithm.has_group() {
                self.algorithm.finish_group(&self.slots, &mut self.output);
                // A group boundary is the one point where the algorithm holds no row refs, so
                // finished batches can be handed out and unreferenced input batches released.
                if self.output.len() >= MERGE_BLOCK_ROWS || self.slots.len() > self.cursors.len() + 64 {
                    if self.output.is_empty() {
                        self.compact_slots();
                    } else {
                        ready = self.flush()?;
                    }
                }
            }
            let cursor = self.cursors[top].as_ref().expect("heap holds live cursors");
            let row = RowRef { slot: cursor.slot, row: cursor.pos, source: top };
            self.algorithm.add(row, &self.slots);
            self.advance_cursor(top)?;
            if ready.is_some() {
                return Ok(ready);
            }
        }
        if std::mem::take(&mut self.in_group) {
            self.algorithm.finish_group(&self.slots, &mut self.output);
        }
        self.finished = true;
        self.flush()
    }

    fn advance_cursor(&mut self, top: usize) -> Result<()> {
        let cursor = self.cursors[top].as_mut().expect("live cursor");
        cursor.pos += 1;
        if let Some(&key) = cursor.packed.get(cursor.pos) {
            self.heads[top] = key | top as u128;
        }
        if cursor.pos >= cursor.len && !self.advance_batch(top)? {
            // The source is exhausted: remove it from the heap.
            let last = self.heap.len() - 1;
            self.heap.swap(0, last);
            self.heap.pop();
        }
        if !self.heap.is_empty() {
            self.sift_down(0);
        }
        Ok(())
    }
}

/// Bits of a packed head that hold the cursor's index.
const SOURCE_BITS: u32 = 16;
/// The key bits of a packed head.
const KEY_MASK: u128 = !((1 << SOURCE_BITS) - 1);

/// The width of every sorting key in the row format, if the key columns are fixed-width and
/// it fits 14 bytes (one integer, float or date column, or two narrower ones: one validity
/// byte and the value each), leaving the low 16 bits of a `u128` for the source. The row
/// format's bytes order as the keys do, so such keys packed into a big-endian `u128` compare
/// as integers: a merge then makes no memcmp call and no row lookup per comparison, which
/// were half of its time.
fn packed_width(schema: &SchemaRef, key_columns: &[usize]) -> Option<usize> {
    let mut width = 0;
    for &c in key_columns {
        width += 1 + schema.field(c).data_type().primitive_width()?;
    }
    (width <= 16 - SOURCE_BITS as usize / 8).then_some(width)
}

/// The rows packed as integers; `None` if a row is not `width` bytes long.
fn pack(rows: &Rows, width: usize) -> Option<Vec<u128>> {
    let mut packed = Vec::with_capacity(rows.num_rows());
    for row in rows.iter() {
        let bytes = row.as_ref();
        if bytes.len() != width {
            return None;
        }
        let mut buffer = [0u8; 16];
        buffer[..width].copy_from_slice(bytes);
        packed.push(u128::from_be_bytes(buffer));
    }
    Some(packed)
}

impl Iterator for SortedMerge {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_batch() {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => None,
            Err(e) => {
                self.finished = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests;
