//! ClickHouse's results for aggregates over no rows.
//!
//! DataFusion follows standard SQL: `sum`, `min`, `max`, `avg`, … of no rows are NULL. In
//! ClickHouse (with the default `aggregate_functions_null_for_empty = 0`) an aggregate of a
//! non-Nullable argument is never NULL: it is the type's default (0, '', 1970-01-01) over an
//! empty table or a group whose `-If` condition matched no row, `avg` is nan, and
//! `groupArray` is `[]`. Over a Nullable argument the result stays NULL, as in ClickHouse.
//!
//! The plan is rewritten rather than the functions replaced, so that DataFusion's own
//! aggregates (and their optimizations) are kept: a projection over each aggregation turns
//! those NULLs into the defaults.

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{lit, when, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder};

/// What an aggregate of no rows gives in ClickHouse, if it is not NULL.
enum EmptyResult {
    /// The result type's default value.
    TypeDefault,
    Nan,
}

fn empty_result(aggregate: &Expr, input: &datafusion::common::DFSchema) -> DfResult<Option<EmptyResult>> {
    let Expr::AggregateFunction(AggregateFunction { func, params }) = aggregate.clone().unalias() else {
        return Ok(None);
    };
    let non_nullable = match params.args.first() {
        Some(arg) => !arg.nullable(input)?,
        None => false,
    };
    Ok(match func.name() {
        // groupArray skips NULLs: its result is an array even when every value is NULL.
        "array_agg" => Some(EmptyResult::TypeDefault),
        "avg" if non_nullable => Some(EmptyResult::Nan),
        "sum" | "min" | "max" | "first_value" | "last_value" if non_nullable => Some(EmptyResult::TypeDefault),
        _ => None,
    })
}

/// Adds, over every aggregation with such aggregates, a projection that replaces their NULLs
/// by ClickHouse's values; other plans are returned as they are.
pub fn clickhouse_empty_results(plan: LogicalPlan) -> DfResult<LogicalPlan> {
    plan.transform_up(|node| {
        let LogicalPlan::Aggregate(aggregate) = &node else { return Ok(Transformed::no(node)) };
        let groups = aggregate.group_expr.len();
        let mut defaults = Vec::with_capacity(aggregate.aggr_expr.len());
        for expr in &aggregate.aggr_expr {
            defaults.push(empty_result(expr, aggregate.input.schema())?);
        }
        if defaults.iter().all(Option::is_none) {
            return Ok(Transformed::no(node));
        }
        let schema = aggregate.schema.clone();
        let mut projection = Vec::with_capacity(schema.fields().len());
        for (i, (qualifier, field)) in schema.iter().enumerate() {
            let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
            let default = match i.checked_sub(groups).and_then(|a| defaults[a].as_ref()) {
                None => {
                    projection.push(column);
                    continue;
                }
                Some(EmptyResult::TypeDefault) => ScalarValue::new_default(field.data_type())?,
                Some(EmptyResult::Nan) => ScalarValue::Float64(Some(f64::NAN)).cast_to(field.data_type())?,
            };
            let filled = when(column.clone().is_null(), lit(default)).otherwise(column)?;
            projection.push(filled.alias_qualified(qualifier.cloned(), field.name()));
        }
        let projected = LogicalPlanBuilder::from(node).project(projection)?.build()?;
        Ok(Transformed::yes(projected))
    })
    .map(|transformed| transformed.data)
}
