//! The merging-algorithm interface and the choice of algorithm for an engine.

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;

use super::aggregating::{Aggregating, ColumnAggregate};
use super::collapsing::Collapsing;
use super::output::{Output, RowRef};
use super::replacing::Replacing;
use super::versioned_collapsing::VersionedCollapsing;
use crate::error::{EngineError, Result};
use crate::schema::{EngineKind, TableDef};
use crate::types::ChType;

/// Decides which rows of a group of equal sorting keys survive.
///
/// Rows of one group arrive through [`add`](Self::add) oldest part first, and inside a part in
/// order; [`finish_group`](Self::finish_group) then writes the survivors and resets the state.
pub trait MergingAlgorithm: Send {
    fn add(&mut self, row: RowRef, slots: &[RecordBatch]);
    /// Whether rows were added since the last `finish_group`.
    fn has_group(&self) -> bool;
    fn finish_group(&mut self, slots: &[RecordBatch], out: &mut Output);
}

/// Where the algorithm runs changes a few rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlgorithmOptions {
    /// Drop ReplacingMergeTree tombstones (OPTIMIZE … FINAL CLEANUP, and every FINAL read).
    pub cleanup: bool,
    /// A FINAL read: CollapsingMergeTree shows no negative rows.
    pub final_read: bool,
}

pub(super) fn column(slots: &[RecordBatch], row: RowRef, column: usize) -> &dyn Array {
    slots[row.slot].column(column).as_ref()
}

/// MergeTree: every row survives.
struct Ordinary {
    pending: Vec<RowRef>,
}

impl MergingAlgorithm for Ordinary {
    fn add(&mut self, row: RowRef, _: &[RecordBatch]) {
        self.pending.push(row);
    }

    fn has_group(&self) -> bool {
        !self.pending.is_empty()
    }

    fn finish_group(&mut self, _: &[RecordBatch], out: &mut Output) {
        for row in self.pending.drain(..) {
            out.push(row);
        }
    }
}

/// The algorithm of `def`'s engine over batches of `schema`, which holds the table's columns
/// or a projection of them that includes the key and the engine's special columns.
pub fn build_algorithm(
    def: &TableDef,
    schema: &SchemaRef,
    options: AlgorithmOptions,
) -> Result<Box<dyn MergingAlgorithm>> {
    let index = |name: &str| {
        schema.index_of(name).map_err(|_| {
            EngineError::BadTableDefinition(format!(
                "column {name} of the {} engine is missing from the read",
                def.engine.name()
            ))
        })
    };
    let key = def.sorting_key();
    let algorithm: Box<dyn MergingAlgorithm> = match &def.engine {
        EngineKind::MergeTree => Box::new(Ordinary { pending: Vec::new() }),
        EngineKind::ReplacingMergeTree { version, is_deleted } => Box::new(Replacing::new(
            version.as_deref().map(index).transpose()?,
            is_deleted.as_deref().map(index).transpose()?,
            options.cleanup,
        )),
        EngineKind::CollapsingMergeTree { sign } => Box::new(Collapsing::new(index(sign)?, options.final_read)),
        EngineKind::VersionedCollapsingMergeTree { sign, .. } => Box::new(VersionedCollapsing::new(index(sign)?)),
        EngineKind::SummingMergeTree { columns } => {
            let mut aggregates = Vec::new();
            for (i, field) in schema.fields().iter().enumerate() {
                let name = field.name();
                if key.contains(name) || def.in_sorting_key(name) {
                    continue;
                }
                let Some(col) = def.column(name) else {
                    continue;
                };
                let listed = columns.as_ref().is_none_or(|list| list.contains(name));
                let aggregate = match &col.ty {
                    ChType::SimpleAggregateFunction { function, .. } => ColumnAggregate::simple(function),
                    ChType::AggregateFunction(function) => ColumnAggregate::State(function.clone()),
                    ty if listed && !ty.is_nullable() && ty.is_summable() => ColumnAggregate::Sum,
                    _ => continue,
                };
                aggregates.push((i, aggregate));
            }
            Box::new(Aggregating::new(aggregates, true))
        }
        EngineKind::AggregatingMergeTree => {
            let aggregates = simple_aggregates(def, schema);
            Box::new(Aggregating::new(aggregates, false))
        }
        EngineKind::CoalescingMergeTree => {
            let aggregates = schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| !key.contains(f.name()))
                .map(|(i, _)| (i, ColumnAggregate::LastNotNull))
                .collect();
            Box::new(Aggregating::new(aggregates, false))
        }
    };
    Ok(algorithm)
}

fn simple_aggregates(def: &TableDef, schema: &SchemaRef) -> Vec<(usize, ColumnAggregate)> {
    schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| match def.column(f.name()).map(|c| &c.ty) {
            Some(ChType::SimpleAggregateFunction { function, .. }) => Some((i, ColumnAggregate::simple(function))),
            Some(ChType::AggregateFunction(function)) => Some((i, ColumnAggregate::State(function.clone()))),
            _ => None,
        })
        .collect()
}
