//! ClickHouse's meaning of arithmetic operators where it differs from DataFusion's:
//! `a / b` of integers is a Float64 division, and `date ± n` moves a Date by n days and a
//! DateTime by n seconds.

use arrow::datatypes::{DataType as ArrowType, TimeUnit};
use datafusion::common::{plan_err, DFSchema};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{cast, lit, Expr, ExprSchemable};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility};
use datafusion::sql::sqlparser::ast::BinaryOperator;

#[derive(Debug, Default)]
pub struct ClickHouseOperators;

/// For `unsigned column ∘ literal` (either order) with a non-negative integer literal: the
/// column and the literal cast to the column's type.
fn unsigned_with_literal(left: &Expr, lt: &ArrowType, right: &Expr, rt: &ArrowType) -> Option<(Expr, Expr)> {
    let as_unsigned = |e: &Expr, column_type: &ArrowType| match e {
        Expr::Literal(v, _) if column_type.is_unsigned_integer() => {
            let value = v.cast_to(&ArrowType::Int64).ok()?;
            match value {
                datafusion::common::ScalarValue::Int64(Some(n)) if n >= 0 => {
                    lit(datafusion::common::ScalarValue::UInt64(Some(n as u64)))
                        .cast_to(column_type, &DFSchema::empty())
                        .ok()
                }
                _ => None,
            }
        }
        _ => None,
    };
    if !matches!(left, Expr::Literal(..)) {
        if let Some(l) = as_unsigned(right, lt) {
            return Some((left.clone(), l));
        }
    }
    if !matches!(right, Expr::Literal(..)) && rt.is_unsigned_integer() {
        if let Some(l) = as_unsigned(left, rt) {
            return Some((right.clone(), l));
        }
    }
    None
}

/// Integers, and the scale-0 decimals DataFusion widens mixed signed/unsigned arithmetic to.
fn is_integer(t: &ArrowType) -> bool {
    t.is_integer() || matches!(t, ArrowType::Decimal128(_, 0) | ArrowType::Decimal256(_, 0))
}

/// An operand's type. A logical or comparison operator is Boolean whatever its operands:
/// asked of DataFusion, the type of `c1 AND … AND cn` is found by walking the whole chain, and
/// asking at each of its n operators made planning such a WHERE quadratic (5,000 conditions
/// took a minute).
fn operand_type(e: &Expr, schema: &DFSchema) -> DfResult<ArrowType> {
    use datafusion::logical_expr::Operator;
    match e {
        Expr::BinaryExpr(b)
            if matches!(
                b.op,
                Operator::And
                    | Operator::Or
                    | Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
                    | Operator::IsDistinctFrom
                    | Operator::IsNotDistinctFrom
            ) =>
        {
            Ok(ArrowType::Boolean)
        }
        Expr::Not(_) | Expr::IsNull(_) | Expr::IsNotNull(_) | Expr::InList(_) | Expr::Like(_) => Ok(ArrowType::Boolean),
        _ => e.get_type(schema),
    }
}

impl ExprPlanner for ClickHouseOperators {
    fn plan_binary_op(&self, expr: RawBinaryExpr, schema: &DFSchema) -> DfResult<PlannerResult<RawBinaryExpr>> {
        let (Ok(left), Ok(right)) = (operand_type(&expr.left, schema), operand_type(&expr.right, schema)) else {
            return Ok(PlannerResult::Original(expr));
        };
        match &expr.op {
            // ClickHouse takes numbers as conditions: `active AND x > 1` means `active != 0 AND …`.
            BinaryOperator::And | BinaryOperator::Or
                if !(left == ArrowType::Boolean && right == ArrowType::Boolean) =>
            {
                let condition = |e: Expr, t: &ArrowType| {
                    if t.is_numeric() {
                        e.not_eq(lit(0).cast_to(t, schema).unwrap_or_else(|_| lit(0)))
                    } else {
                        e
                    }
                };
                let (l, r) = (condition(expr.left, &left), condition(expr.right, &right));
                Ok(PlannerResult::Planned(if expr.op == BinaryOperator::And { l.and(r) } else { l.or(r) }))
            }
            // An unsigned column with a non-negative integer literal stays unsigned (ClickHouse
            // types the literal as UInt8…UInt64); DataFusion would widen both to Decimal128.
            op @ (BinaryOperator::Plus | BinaryOperator::Multiply | BinaryOperator::Modulo)
                if unsigned_with_literal(&expr.left, &left, &expr.right, &right).is_some() =>
            {
                let literal_on_right = matches!(expr.right, Expr::Literal(..));
                let Some((column, literal)) = unsigned_with_literal(&expr.left, &left, &expr.right, &right) else {
                    return Ok(PlannerResult::Original(expr));
                };
                let (l, r) = if literal_on_right { (column, literal) } else { (literal, column) };
                Ok(PlannerResult::Planned(match op {
                    BinaryOperator::Plus => l + r,
                    BinaryOperator::Multiply => l * r,
                    _ => l % r,
                }))
            }
            BinaryOperator::Divide if is_integer(&left) && is_integer(&right) => {
                Ok(PlannerResult::Planned(cast(expr.left, ArrowType::Float64) / cast(expr.right, ArrowType::Float64)))
            }
            op @ (BinaryOperator::Plus | BinaryOperator::Minus) => {
                let temporal = |t: &ArrowType| match t {
                    ArrowType::Date32 => Some(ArrowType::Int32),
                    ArrowType::Timestamp(TimeUnit::Second, None) => Some(ArrowType::Int64),
                    _ => None,
                };
                let (date, date_type, offset, as_int) = match (temporal(&left), temporal(&right)) {
                    (Some(as_int), None) if is_integer(&right) => (expr.left, left, expr.right, as_int),
                    (None, Some(as_int)) if is_integer(&left) && *op == BinaryOperator::Plus => {
                        (expr.right, right, expr.left, as_int)
                    }
                    _ => return Ok(PlannerResult::Original(expr)),
                };
                let moved = if *op == BinaryOperator::Plus {
                    cast(date, as_int.clone()) + cast(offset, as_int)
                } else {
                    cast(date, as_int.clone()) - cast(offset, as_int)
                };
                Ok(PlannerResult::Planned(cast(moved, date_type)))
            }
            _ => Ok(PlannerResult::Original(expr)),
        }
    }
}

/// `intDiv(a, b)`: integer division rounding toward zero, in UInt64 when both sides are
/// unsigned and Int64 otherwise. ClickHouse throws on division by zero; so does this.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct IntDiv {
    signature: Signature,
    aliases: Vec<String>,
}

impl Default for IntDiv {
    fn default() -> Self {
        IntDiv { signature: Signature::any(2, Volatility::Immutable), aliases: vec!["intdiv".to_string()] }
    }
}

fn int_div_type(left: &ArrowType, right: &ArrowType) -> ArrowType {
    if left.is_unsigned_integer() && right.is_unsigned_integer() {
        ArrowType::UInt64
    } else {
        ArrowType::Int64
    }
}

impl ScalarUDFImpl for IntDiv {
    fn name(&self) -> &str {
        "intDiv"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[ArrowType]) -> DfResult<ArrowType> {
        match arg_types {
            [l, r] if l.is_integer() && r.is_integer() => Ok(int_div_type(l, r)),
            _ => plan_err!("intDiv takes two integers, got {arg_types:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let target = args.return_field.data_type().clone();
        let left = arrow::compute::cast(&args.args[0].clone().into_array(rows)?, &target)?;
        let right = arrow::compute::cast(&args.args[1].clone().into_array(rows)?, &target)?;
        Ok(ColumnarValue::Array(arrow::compute::kernels::numeric::div(&left, &right)?))
    }
}
