//! VersionedCollapsingMergeTree: a -1 and a +1 row with the same key and version cancel, in
//! whichever order they arrive. The version is the last column of the sorting key, so a group
//! here is one (key, version).

use arrow::array::RecordBatch;

use super::algorithm::{column, MergingAlgorithm};
use super::output::{Output, RowRef};
use super::values::sign;

pub struct VersionedCollapsing {
    sign: usize,
    queue: Vec<RowRef>,
    queue_sign: i8,
}

impl VersionedCollapsing {
    pub fn new(sign: usize) -> VersionedCollapsing {
        VersionedCollapsing { sign, queue: Vec::new(), queue_sign: 0 }
    }
}

impl MergingAlgorithm for VersionedCollapsing {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]) {
        let s = sign(column(slots, row, self.sign), row.row);
        if self.queue.is_empty() {
            self.queue_sign = s;
            self.queue.push(row);
        } else if s == self.queue_sign {
            self.queue.push(row);
        } else {
            self.queue.pop();
        }
    }

    fn has_group(&self) -> bool {
        // A group whose rows all cancelled has nothing to finish.
        !self.queue.is_empty()
    }

    fn finish_group(&mut self, _: &[RecordBatch], out: &mut Output) {
        for row in self.queue.drain(..) {
            out.push(row);
        }
    }
}
