//! CollapsingMergeTree: a -1 row cancels a +1 row of the same key, in the order rows arrive.
//!
//! ClickHouse's rules, per key: more positives than negatives keeps the last positive; more
//! negatives keeps the first negative; as many of each keeps the first negative and the last
//! positive when the last row is positive, and nothing when it is negative. A FINAL read
//! never shows the negative row.

use arrow::array::RecordBatch;

use super::algorithm::{column, MergingAlgorithm};
use super::output::{Output, RowRef};
use super::values::sign;

pub struct Collapsing {
    sign: usize,
    only_positive: bool,
    first_negative: Option<RowRef>,
    last_positive: Option<RowRef>,
    positives: usize,
    negatives: usize,
    last_is_positive: bool,
    rows: usize,
}

impl Collapsing {
    pub fn new(sign: usize, only_positive: bool) -> Collapsing {
        Collapsing {
            sign,
            only_positive,
            first_negative: None,
            last_positive: None,
            positives: 0,
            negatives: 0,
            last_is_positive: false,
            rows: 0,
        }
    }
}

impl MergingAlgorithm for Collapsing {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]) {
        self.rows += 1;
        match sign(column(slots, row, self.sign), row.row) {
            1 => {
                self.positives += 1;
                self.last_positive = Some(row);
                self.last_is_positive = true;
            }
            -1 => {
                self.negatives += 1;
                if self.first_negative.is_none() {
                    self.first_negative = Some(row);
                }
                self.last_is_positive = false;
            }
            // Inserts reject other signs; a row with one would be ignored as ClickHouse does.
            _ => {}
        }
    }

    fn has_group(&self) -> bool {
        self.rows > 0
    }

    fn finish_group(&mut self, _: &[RecordBatch], out: &mut Output) {
        if self.last_is_positive || self.positives != self.negatives {
            if self.positives <= self.negatives && !self.only_positive {
                if let Some(row) = self.first_negative {
                    out.push(row);
                }
            }
            if self.positives >= self.negatives {
                if let Some(row) = self.last_positive {
                    out.push(row);
                }
            }
        }
        *self = Collapsing::new(self.sign, self.only_positive);
    }
}
