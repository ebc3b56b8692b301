//! Summing, Aggregating and Coalescing MergeTree: one row per key whose columns combine the
//! group's rows. Columns without an aggregate keep the first row's value.

use std::cmp::Ordering;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType as ArrowType;

use super::algorithm::{column, MergingAlgorithm};
use super::output::{Output, RowRef};
use super::values::{float_value, int_value, is_float};
use crate::aggregate::{AggregateFunction, State as AggregateState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnAggregate {
    /// An AggregateFunction column: states merged.
    State(AggregateFunction),
    Sum,
    Min,
    Max,
    /// The first non-NULL value.
    Any,
    /// The last non-NULL value (`anyLast`, and every column of CoalescingMergeTree).
    LastNotNull,
}

impl ColumnAggregate {
    /// The aggregate of a `SimpleAggregateFunction(function, …)` column.
    pub fn simple(function: &str) -> ColumnAggregate {
        match function {
            "sum" => ColumnAggregate::Sum,
            "min" => ColumnAggregate::Min,
            "max" => ColumnAggregate::Max,
            "any" => ColumnAggregate::Any,
            _ => ColumnAggregate::LastNotNull,
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    Empty,
    Merged(AggregateState),
    Int(i128),
    Float(f64),
    Row(RowRef),
}

pub struct Aggregating {
    columns: Vec<(usize, ColumnAggregate)>,
    /// SummingMergeTree drops a row whose summed columns are all zero.
    drop_zero_rows: bool,
    first: Option<RowRef>,
    states: Vec<State>,
}

impl Aggregating {
    pub fn new(columns: Vec<(usize, ColumnAggregate)>, drop_zero_rows: bool) -> Aggregating {
        let states = vec![State::Empty; columns.len()];
        Aggregating { columns, drop_zero_rows, first: None, states }
    }
}

fn compare_values(a: &dyn Array, ai: usize, b: &dyn Array, bi: usize) -> Ordering {
    match a.data_type() {
        ArrowType::Utf8 => a.as_string::<i32>().value(ai).cmp(b.as_string::<i32>().value(bi)),
        ty if is_float(ty) => float_value(a, ai).partial_cmp(&float_value(b, bi)).unwrap_or(Ordering::Equal),
        _ => int_value(a, ai).cmp(&int_value(b, bi)),
    }
}

impl MergingAlgorithm for Aggregating {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]) {
        if self.first.is_none() {
            self.first = Some(row);
        }
        for ((c, aggregate), state) in self.columns.iter().zip(self.states.iter_mut()) {
            let array = column(slots, row, *c);
            if array.is_null(row.row) {
                continue;
            }
            if let ColumnAggregate::State(function) = aggregate {
                let bytes = array.as_binary::<i32>().value(row.row);
                // A state that does not decode is skipped with a log line: one bad value must
                // not stop the merge of the whole part.
                match AggregateState::decode(bytes) {
                    Ok(decoded) => match state {
                        State::Merged(current) => function.merge(current, decoded),
                        _ => *state = State::Merged(decoded),
                    },
                    Err(e) => tracing::warn!(error = %e, "skipping an undecodable aggregate state"),
                }
                continue;
            }
            *state = match (aggregate, std::mem::replace(state, State::Empty)) {
                (ColumnAggregate::Sum, state) => {
                    if let Some(v) = float_value(array, row.row) {
                        let acc = match state {
                            State::Float(acc) => acc,
                            _ => 0.0,
                        };
                        // Float32 columns sum in Float32, as ClickHouse's sumWithOverflow does.
                        let sum = if array.data_type() == &ArrowType::Float32 {
                            (acc as f32 + v as f32) as f64
                        } else {
                            acc + v
                        };
                        State::Float(sum)
                    } else {
                        let acc = match state {
                            State::Int(acc) => acc,
                            _ => 0,
                        };
                        State::Int(acc.wrapping_add(int_value(array, row.row).unwrap_or(0)))
                    }
                }
                (ColumnAggregate::Any, State::Empty) | (ColumnAggregate::LastNotNull, _) => State::Row(row),
                (ColumnAggregate::Any, state) => state,
                (ColumnAggregate::State(_), state) => state,
                (ColumnAggregate::Min | ColumnAggregate::Max, State::Row(best)) => {
                    let ord = compare_values(array, row.row, column(slots, best, *c), best.row);
                    let better = if *aggregate == ColumnAggregate::Min {
                        ord == Ordering::Less
                    } else {
                        ord == Ordering::Greater
                    };
                    State::Row(if better { row } else { best })
                }
                (ColumnAggregate::Min | ColumnAggregate::Max, _) => State::Row(row),
            };
        }
    }

    fn has_group(&self) -> bool {
        self.first.is_some()
    }

    fn finish_group(&mut self, slots: &[RecordBatch], out: &mut Output) {
        let Some(first) = self.first.take() else {
            return;
        };
        let states = std::mem::replace(&mut self.states, vec![State::Empty; self.columns.len()]);
        if self.drop_zero_rows {
            let mut sums = self.columns.iter().zip(&states).filter(|((_, a), _)| *a == ColumnAggregate::Sum).peekable();
            let has_sums = sums.peek().is_some();
            let all_zero = sums.all(|(_, s)| match s {
                State::Merged(_) => false,
                State::Int(v) => *v == 0,
                State::Float(v) => *v == 0.0,
                _ => true,
            });
            if has_sums && all_zero {
                return;
            }
        }
        out.push(first);
        for ((c, aggregate), state) in self.columns.iter().zip(states) {
            match state {
                State::Merged(merged) => out.set_bytes(*c, Some(merged.encode())),
                State::Row(row) => out.set_row(*c, row),
                State::Int(v) => out.set_int(*c, Some(v)),
                State::Float(v) => out.set_float(*c, Some(v)),
                // Every value was NULL: the result is NULL, in the kind of values the column
                // collects so that one output batch never mixes kinds.
                State::Empty if *aggregate == ColumnAggregate::Sum => {
                    if is_float(column(slots, first, *c).data_type()) {
                        out.set_float(*c, None)
                    } else {
                        out.set_int(*c, None)
                    }
                }
                State::Empty if matches!(aggregate, ColumnAggregate::State(_)) => out.set_bytes(*c, None),
                State::Empty => out.set_row(*c, first),
            }
        }
    }
}
