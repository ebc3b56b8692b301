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
//!
//! The same projection gives `avg` of a Decimal ClickHouse's type, Float64 (DataFusion's is a
//! wider Decimal, which also has no nan for the empty case): the average is still computed
//! exactly, as ClickHouse does, and converted once.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{cast, lit, when, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder};

/// What an aggregate of no rows gives in ClickHouse, if it is not NULL.
enum EmptyResult {
    /// The result type's default value.
    TypeDefault,
    Nan,
}

/// How one aggregate's output column is mended.
struct Mend {
    empty: Option<EmptyResult>,
    /// An `avg` whose DataFusion result is a Decimal: ClickHouse's is Float64.
    to_float: bool,
}

fn mend(aggregate: &Expr, input: &datafusion::common::DFSchema, output: &DataType) -> DfResult<Mend> {
    let to_float = matches!(aggregate.clone().unalias(), Expr::AggregateFunction(AggregateFunction { ref func, .. }) if func.name() == "avg")
        && matches!(output, DataType::Decimal128(..) | DataType::Decimal256(..));
    Ok(Mend { empty: empty_result(aggregate, input)?, to_float })
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
/// by ClickHouse's values and gives a Decimal `avg` its Float64; other plans are returned as
/// they are.
pub fn clickhouse_empty_results(plan: LogicalPlan) -> DfResult<LogicalPlan> {
    let mut retyped = false;
    let plan = plan
        .transform_up(|node| {
            let LogicalPlan::Aggregate(aggregate) = &node else { return Ok(Transformed::no(node)) };
            let groups = aggregate.group_expr.len();
            let schema = aggregate.schema.clone();
            let mut mends = Vec::with_capacity(aggregate.aggr_expr.len());
            for (i, expr) in aggregate.aggr_expr.iter().enumerate() {
                mends.push(mend(expr, aggregate.input.schema(), schema.field(groups + i).data_type())?);
            }
            if mends.iter().all(|m| m.empty.is_none() && !m.to_float) {
                return Ok(Transformed::no(node));
            }
            let mut projection = Vec::with_capacity(schema.fields().len());
            for (i, (qualifier, field)) in schema.iter().enumerate() {
                let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                let Some(mend) = i.checked_sub(groups).map(|a| &mends[a]) else {
                    projection.push(column);
                    continue;
                };
                let (value, data_type) = if mend.to_float {
                    retyped = true;
                    (cast(column.clone(), DataType::Float64), DataType::Float64)
                } else {
                    (column.clone(), field.data_type().clone())
                };
                let default = match mend.empty {
                    None => {
                        projection.push(value.alias_qualified(qualifier.cloned(), field.name()));
                        continue;
                    }
                    Some(EmptyResult::TypeDefault) => ScalarValue::new_default(&data_type)?,
                    Some(EmptyResult::Nan) => ScalarValue::Float64(Some(f64::NAN)).cast_to(&data_type)?,
                };
                let filled = when(column.is_null(), lit(default)).otherwise(value)?;
                projection.push(filled.alias_qualified(qualifier.cloned(), field.name()));
            }
            let projected = LogicalPlanBuilder::from(node).project(projection)?.build()?;
            Ok(Transformed::yes(projected))
        })?
        .data;
    if !retyped {
        return Ok(plan);
    }
    // The plans above a retyped aggregate were typed with its Decimal: type them again.
    plan.transform_up(|node| node.recompute_schema().map(Transformed::yes)).map(|t| t.data)
}
