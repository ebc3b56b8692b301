//! ReplacingMergeTree: one row per key, the highest version, ties to the last row.

use std::cmp::Ordering;

use arrow::array::RecordBatch;

use super::algorithm::{column, MergingAlgorithm};
use super::output::{Output, RowRef};
use super::values::{compare_versions, int_value};

pub struct Replacing {
    version: Option<usize>,
    is_deleted: Option<usize>,
    cleanup: bool,
    selected: Option<RowRef>,
}

impl Replacing {
    pub fn new(version: Option<usize>, is_deleted: Option<usize>, cleanup: bool) -> Replacing {
        Replacing { version, is_deleted, cleanup, selected: None }
    }
}

impl MergingAlgorithm for Replacing {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]) {
        let replace = match (self.selected, self.version) {
            (None, _) | (Some(_), None) => true,
            // Three-way: a tie falls through to physical order, and rows arrive oldest first,
            // so an equal version replaces the selected row.
            (Some(selected), Some(v)) => {
                compare_versions(column(slots, row, v), row.row, column(slots, selected, v), selected.row)
                    != Ordering::Less
            }
        };
        if replace {
            self.selected = Some(row);
        }
    }

    fn has_group(&self) -> bool {
        self.selected.is_some()
    }

    fn finish_group(&mut self, slots: &[RecordBatch], out: &mut Output) {
        let Some(selected) = self.selected.take() else {
            return;
        };
        if self.cleanup {
            if let Some(d) = self.is_deleted {
                if int_value(column(slots, selected, d), selected.row) == Some(1) {
                    return;
                }
            }
        }
        out.push(selected);
    }
}
