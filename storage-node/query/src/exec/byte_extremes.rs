//! `min` and `max` of String columns per group. DataFusion's own groups accumulator for byte
//! arrays keys a SipHash map by group index for every row of every batch, which made `max(s)`
//! a fifth of a GROUP BY over a million rows. Here each value is compared in place with its
//! group's current extreme, which is kept in a buffer of its own and overwritten only when a
//! value beats it. Everything else about `min` and `max` (types, coercion, statistics, the
//! other types' accumulators) is DataFusion's: this wraps its functions and changes only the
//! groups accumulator of Utf8 and Binary.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, StringArray};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{exec_err, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature, StatisticsArgs,
};

/// Replaces DataFusion's `min` and `max` in the session with the wrapped ones.
pub fn register(ctx: &datafusion::prelude::SessionContext) {
    ctx.register_udaf(AggregateUDF::from(ByteExtremes { inner: min_udaf(), keep: Keep::Min }));
    ctx.register_udaf(AggregateUDF::from(ByteExtremes { inner: max_udaf(), keep: Keep::Max }));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Keep {
    Min,
    Max,
}

impl Keep {
    #[inline]
    fn beats(self, candidate: &[u8], current: &[u8]) -> bool {
        // The first bytes differ in most comparisons and then decide them: only the others
        // call memcmp (a call per row was a third of `max` over decimal strings).
        let order = match (candidate.first(), current.first()) {
            (Some(a), Some(b)) if a != b => a.cmp(b),
            _ => candidate.cmp(current),
        };
        match self {
            Keep::Min => order.is_lt(),
            Keep::Max => order.is_gt(),
        }
    }
}

/// DataFusion's `min` or `max`, with the byte-array groups accumulator above.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ByteExtremes {
    inner: Arc<AggregateUDF>,
    keep: Keep,
}

fn is_byte_type(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::Binary)
}

impl AggregateUDFImpl for ByteExtremes {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> DfResult<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        self.inner.accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn GroupsAccumulator>> {
        let data_type = args.return_field.data_type();
        if is_byte_type(data_type) {
            return Ok(Box::new(ByteExtremesAccumulator::new(self.keep, data_type.clone())));
        }
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.order_sensitivity()
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_udf()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    fn value_from_stats(&self, statistics_args: &StatisticsArgs) -> Option<ScalarValue> {
        self.inner.value_from_stats(statistics_args)
    }

    fn default_value(&self, data_type: &DataType) -> DfResult<ScalarValue> {
        self.inner.default_value(data_type)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.inner.inner().set_monotonicity(data_type)
    }
}

/// The extreme value of each group so far. A group's buffer is reused when a better value
/// replaces it, so a run of ever larger values does not allocate per row.
#[derive(Debug)]
struct ByteExtremesAccumulator {
    keep: Keep,
    data_type: DataType,
    extremes: Vec<Option<Vec<u8>>>,
    /// The capacity of the buffers in `extremes`, for `size()`.
    buffered_bytes: usize,
}

impl ByteExtremesAccumulator {
    fn new(keep: Keep, data_type: DataType) -> Self {
        ByteExtremesAccumulator { keep, data_type, extremes: Vec::new(), buffered_bytes: 0 }
    }

    fn offer(&mut self, group: usize, value: &[u8]) {
        match &mut self.extremes[group] {
            Some(current) => {
                if self.keep.beats(value, current) {
                    let before = current.capacity();
                    current.clear();
                    current.extend_from_slice(value);
                    self.buffered_bytes += current.capacity() - before;
                }
            }
            empty => {
                let value = value.to_vec();
                self.buffered_bytes += value.capacity();
                *empty = Some(value);
            }
        }
    }
}

impl GroupsAccumulator for ByteExtremesAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> DfResult<()> {
        let Some(array) = values.first() else {
            return exec_err!("{:?} of no argument", self.keep);
        };
        self.extremes.resize(total_num_groups, None);
        let (offsets, data) = match array.data_type() {
            DataType::Utf8 => {
                let strings = array.as_string::<i32>();
                (strings.value_offsets(), strings.value_data())
            }
            DataType::Binary => {
                let bytes = array.as_binary::<i32>();
                (bytes.value_offsets(), bytes.value_data())
            }
            other => return exec_err!("{:?} of {other} in the byte-array accumulator", self.keep),
        };
        let nulls = array.logical_nulls();
        for (row, &group) in group_indices.iter().enumerate() {
            if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                continue;
            }
            if let Some(filter) = opt_filter {
                if !filter.is_valid(row) || !filter.value(row) {
                    continue;
                }
            }
            let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
            self.offer(group, &data[start..end]);
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> DfResult<ArrayRef> {
        let emitted = emit_to.take_needed(&mut self.extremes);
        self.buffered_bytes -= emitted.iter().flatten().map(Vec::capacity).sum::<usize>();
        Ok(match self.data_type {
            DataType::Utf8 => {
                let strings = emitted
                    .iter()
                    .map(|v| v.as_deref().map(std::str::from_utf8).transpose())
                    .collect::<Result<StringArray, _>>()
                    .map_err(|e| datafusion::error::DataFusionError::Execution(e.to_string()))?;
                Arc::new(strings)
            }
            _ => Arc::new(emitted.iter().map(|v| v.as_deref()).collect::<BinaryArray>()),
        })
    }

    /// `min` and `max` carry their value as their state.
    fn state(&mut self, emit_to: EmitTo) -> DfResult<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(emit_to)?])
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> DfResult<()> {
        // A state is the value itself, so merging states is updating with them.
        self.update_batch(values, group_indices, None, total_num_groups)
    }

    /// A row's state is its value, or NULL where the filter leaves the row out.
    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> DfResult<Vec<ArrayRef>> {
        let Some(array) = values.first() else {
            return exec_err!("{:?} of no argument", self.keep);
        };
        let Some(filter) = opt_filter else {
            return Ok(vec![array.clone()]);
        };
        let left_out = arrow::compute::not(&arrow::compute::prep_null_mask_filter(filter))?;
        Ok(vec![arrow::compute::nullif(array, &left_out)?])
    }

    fn size(&self) -> usize {
        self.buffered_bytes + self.extremes.capacity() * std::mem::size_of::<Option<Vec<u8>>>()
    }
}

/// Whether an aggregate call is one of the two functions wrapped here; for tests.
#[cfg(test)]
fn wraps(function: &datafusion::logical_expr::expr::AggregateFunction) -> bool {
    let inner: &dyn std::any::Any = function.func.inner().as_ref();
    inner.is::<ByteExtremes>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::UInt64Array;
    use datafusion::common::tree_node::TreeNode;

    /// A batch given to the accumulator: values, their groups, and the optional filter.
    type Input<'a> = (Vec<Option<&'a str>>, Vec<usize>, Option<Vec<bool>>);

    fn run(keep: Keep, batches: &[Input], groups: usize) -> ArrayRef {
        let mut acc = ByteExtremesAccumulator::new(keep, DataType::Utf8);
        for (values, group_indices, filter) in batches {
            let array: ArrayRef = Arc::new(values.iter().copied().collect::<StringArray>());
            let filter = filter.as_ref().map(|f| BooleanArray::from(f.clone()));
            acc.update_batch(&[array], group_indices, filter.as_ref(), groups).expect("update");
        }
        acc.evaluate(EmitTo::All).expect("evaluate")
    }

    #[test]
    fn keeps_the_extreme_per_group_across_batches() {
        let batches = vec![
            (vec![Some("b"), Some("a"), None, Some("zz")], vec![0, 0, 1, 2], None),
            (vec![Some("c"), Some(""), Some("z")], vec![0, 2, 2], None),
        ];
        let max = run(Keep::Max, &batches, 3);
        let min = run(Keep::Min, &batches, 3);
        let as_vec = |a: &ArrayRef| a.as_string::<i32>().iter().map(|v| v.map(str::to_string)).collect::<Vec<_>>();
        assert_eq!(as_vec(&max), vec![Some("c".into()), None, Some("zz".into())]);
        assert_eq!(as_vec(&min), vec![Some("a".into()), None, Some("".into())]);
    }

    #[test]
    fn beating_is_byte_order_whatever_the_first_bytes() {
        let values: [&[u8]; 8] = [b"", b"a", b"ab", b"abc", b"b", b"ba", b"\xff", b"a\x00"];
        for candidate in values {
            for current in values {
                assert_eq!(Keep::Max.beats(candidate, current), candidate > current, "{candidate:?} {current:?}");
                assert_eq!(Keep::Min.beats(candidate, current), candidate < current, "{candidate:?} {current:?}");
            }
        }
    }

    #[test]
    fn filtered_rows_do_not_count() {
        let batches = vec![(vec![Some("x"), Some("y")], vec![0, 0], Some(vec![true, false]))];
        let max = run(Keep::Max, &batches, 1);
        assert_eq!(max.as_string::<i32>().value(0), "x");
    }

    #[test]
    fn emitting_the_first_groups_keeps_the_rest() {
        let mut acc = ByteExtremesAccumulator::new(Keep::Max, DataType::Utf8);
        let array: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        acc.update_batch(&[array], &[0, 1, 2], None, 3).expect("update");
        let first = acc.evaluate(EmitTo::First(2)).expect("first");
        assert_eq!(first.len(), 2);
        let rest = acc.evaluate(EmitTo::All).expect("rest");
        assert_eq!(rest.as_string::<i32>().value(0), "c");
        assert_eq!(acc.size(), 0);
    }

    #[tokio::test]
    async fn the_session_plans_min_and_max_with_the_wrapped_functions() {
        let ctx = datafusion::prelude::SessionContext::new();
        register(&ctx);
        let keys: ArrayRef = Arc::new(UInt64Array::from(vec![1, 2, 1, 2]));
        let words: ArrayRef = Arc::new(StringArray::from(vec!["pear", "fig", "apple", "kiwi"]));
        let batch = arrow::array::RecordBatch::try_from_iter([("k", keys), ("s", words)]).expect("batch");
        ctx.register_batch("t", batch).expect("register");
        let frame = ctx.sql("SELECT k, max(s), min(s) FROM t GROUP BY k ORDER BY k").await.expect("plan");
        let plan = frame.logical_plan().clone();
        let mut wrapped = 0;
        plan.apply(|node| {
            for expr in node.expressions() {
                expr.apply(|e| {
                    if let datafusion::logical_expr::Expr::AggregateFunction(f) = e {
                        let f: &datafusion::logical_expr::expr::AggregateFunction = f;
                        wrapped += usize::from(wraps(f));
                    }
                    Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
                })?;
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .expect("walk");
        assert_eq!(wrapped, 2);
        let batches = datafusion::prelude::DataFrame::new(ctx.state(), plan).collect().await.expect("run");
        let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
        let column = |i: usize| batch.column(i).as_string::<i32>().iter().map(Option::unwrap).collect::<Vec<_>>();
        assert_eq!(column(1), vec!["pear", "kiwi"]);
        assert_eq!(column(2), vec!["apple", "fig"]);
    }
}
