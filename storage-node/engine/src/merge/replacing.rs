//! ReplacingMergeTree: one row per key, the highest version, ties to the last row.

use std::cmp::Ordering;

use arrow::array::RecordBatch;

use super::algorithm::{column, MergingAlgorithm};
use super::output::{Output, RowRef};
use super::values::{int_value, Version};

pub struct Replacing {
    version: Option<usize>,
    is_deleted: Option<usize>,
    cleanup: bool,
    selected: Option<RowRef>,
    /// The selected row's version, kept so that each row's version is read once.
    selected_version: Version,
}

impl Replacing {
    pub fn new(version: Option<usize>, is_deleted: Option<usize>, cleanup: bool) -> Replacing {
        Replacing { version, is_deleted, cleanup, selected: None, selected_version: Version::Null }
    }
}

impl MergingAlgorithm for Replacing {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]) {
        let Some(v) = self.version else {
            self.selected = Some(row);
            return;
        };
        let version = Version::at(column(slots, row, v), row.row);
        // Three-way: a tie falls through to physical order, and rows arrive oldest first, so an
        // equal version replaces the selected row.
        if self.selected.is_none() || version.compare(self.selected_version) != Ordering::Less {
            self.selected = Some(row);
            self.selected_version = version;
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
