//! `fState`, `fMerge` and `finalizeAggregation`: AggregateFunction states in queries, on the
//! engine's state code (`mergestream_engine::aggregate`), so that a state made by a query merges
//! in AggregatingMergeTree and back.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray};
use arrow::datatypes::{DataType as ArrowType, Field, FieldRef, TimeUnit};
use datafusion::common::{exec_err, plan_err, ScalarValue};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use mergestream_engine::aggregate::{AggValue, AggregateFunction, State, STATE_FUNCTIONS};
use mergestream_engine::types::CH_TYPE_KEY;
use mergestream_engine::ChType;

use crate::input::value::{column_from_values, Value};

/// Registers every `fState` / `fMerge` and `finalizeAggregation`.
pub fn register(ctx: &datafusion::prelude::SessionContext) {
    for name in STATE_FUNCTIONS {
        ctx.register_udaf(AggregateUDF::from(CombinatorFunction::new(name, Combinator::State)));
        ctx.register_udaf(AggregateUDF::from(CombinatorFunction::new(name, Combinator::Merge)));
    }
    ctx.register_udf(ScalarUDF::from(FinalizeAggregation::new()));
}

/// The ClickHouse type of a field: from its metadata, else from its Arrow type.
fn ch_type_of(field: &Field) -> DfResult<ChType> {
    if let Some(name) = field.metadata().get(CH_TYPE_KEY) {
        let ty = ChType::parse(name).map_err(|e| DataFusionError::Plan(e.to_string()))?;
        return Ok(match ty {
            ChType::LowCardinality(inner) => *inner,
            ChType::SimpleAggregateFunction { arg, .. } => *arg,
            other => other,
        });
    }
    let base = match field.data_type() {
        ArrowType::UInt8 => ChType::UInt8,
        ArrowType::UInt16 => ChType::UInt16,
        ArrowType::UInt32 => ChType::UInt32,
        ArrowType::UInt64 => ChType::UInt64,
        ArrowType::Int8 => ChType::Int8,
        ArrowType::Int16 => ChType::Int16,
        ArrowType::Int32 => ChType::Int32,
        ArrowType::Int64 => ChType::Int64,
        ArrowType::Float32 => ChType::Float32,
        ArrowType::Float64 => ChType::Float64,
        ArrowType::Utf8 | ArrowType::LargeUtf8 | ArrowType::Utf8View => ChType::String,
        ArrowType::Boolean => ChType::Bool,
        ArrowType::Date32 => ChType::Date,
        ArrowType::Timestamp(TimeUnit::Second, _) => ChType::DateTime,
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => ChType::DateTime64(3),
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => ChType::DateTime64(6),
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => ChType::DateTime64(9),
        ArrowType::Decimal128(p, s) => ChType::Decimal { precision: *p, scale: *s as u8 },
        other => return plan_err!("values of type {other} cannot go into an aggregate function state"),
    };
    Ok(if field.is_nullable() { ChType::Nullable(Box::new(base)) } else { base })
}

/// The function whose states a field holds.
fn state_function_of(field: &Field) -> DfResult<AggregateFunction> {
    match field.metadata().get(CH_TYPE_KEY).map(|t| ChType::parse(t)) {
        Some(Ok(ChType::AggregateFunction(function))) => Ok(function),
        _ => plan_err!(
            "{} is not an AggregateFunction column (-Merge and finalizeAggregation take aggregate function states)",
            field.name()
        ),
    }
}

fn state_field(name: &str, function: &AggregateFunction) -> Field {
    Field::new(name, ArrowType::Binary, false).with_metadata(HashMap::from([(
        CH_TYPE_KEY.to_string(),
        ChType::AggregateFunction(function.clone()).to_string(),
    )]))
}

fn to_input_value(value: AggValue, ty: &ChType) -> Value {
    match value {
        AggValue::Null => Value::Null,
        AggValue::Int(i) => match ty.value_type() {
            ChType::Decimal { scale, .. } => Value::Number(decimal_text(i, *scale)),
            ChType::Bool => Value::Bool(i != 0),
            _ => Value::Number(i.to_string()),
        },
        AggValue::Float(f) => Value::Number(if f.is_nan() { "nan".into() } else { format!("{f:e}") }),
        AggValue::Bytes(b) => Value::Str(String::from_utf8_lossy(&b).into_owned()),
        AggValue::Array(items) => {
            let item_type = match ty.value_type() {
                ChType::Array(t) => (**t).clone(),
                other => other.clone(),
            };
            Value::Array(items.into_iter().map(|v| to_input_value(v, &item_type)).collect())
        }
    }
}

fn decimal_text(raw: i128, scale: u8) -> String {
    let digits = raw.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, frac) = padded.split_at(padded.len() - scale);
    format!("{}{whole}{}{frac}", if raw < 0 { "-" } else { "" }, if scale > 0 { "." } else { "" })
}

/// Finalized values as a column of the function's result type.
fn finalized_column(function: &AggregateFunction, values: Vec<AggValue>) -> DfResult<ArrayRef> {
    let ty = function.result_type();
    let values: Vec<Value> = values.into_iter().map(|v| to_input_value(v, &ty)).collect();
    let nullable = values.contains(&Value::Null);
    let ty = if nullable && !ty.is_nullable() { ChType::Nullable(Box::new(ty)) } else { ty };
    column_from_values(&ty, &values).map_err(DataFusionError::Execution)
}

fn decode(array: &dyn Array, row: usize) -> DfResult<Option<State>> {
    if array.is_null(row) {
        return Ok(None);
    }
    let bytes = array.as_binary::<i32>().value(row);
    State::decode(bytes).map(Some).map_err(|e| DataFusionError::Execution(e.to_string()))
}

/// The two combinators over states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Combinator {
    /// `fState(args…)`: the state of `f` over the group, as AggregateFunction(f, T…) bytes.
    State,
    /// `fMerge(states)`: merges AggregateFunction(f, …) states and finalizes them.
    Merge,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CombinatorFunction {
    function: String,
    combinator: Combinator,
    name: String,
    /// DataFusion looks functions up by their lower-cased name.
    aliases: Vec<String>,
    signature: Signature,
}

impl CombinatorFunction {
    fn new(function: &str, combinator: Combinator) -> CombinatorFunction {
        let (name, signature) = match combinator {
            Combinator::State => (
                format!("{function}State"),
                Signature::one_of(vec![TypeSignature::Nullary, TypeSignature::VariadicAny], Volatility::Immutable),
            ),
            Combinator::Merge => (format!("{function}Merge"), Signature::any(1, Volatility::Immutable)),
        };
        CombinatorFunction {
            function: function.to_string(),
            combinator,
            aliases: vec![name.to_lowercase()],
            name,
            signature,
        }
    }

    /// The aggregate function the arguments' fields call for.
    fn aggregate_function(&self, fields: &[FieldRef]) -> DfResult<AggregateFunction> {
        match self.combinator {
            Combinator::State => {
                let args = fields.iter().map(|f| ch_type_of(f)).collect::<DfResult<Vec<_>>>()?;
                AggregateFunction::new(&self.function, args).map_err(|e| DataFusionError::Plan(e.to_string()))
            }
            Combinator::Merge => {
                let Some(field) = fields.first() else { return plan_err!("{} takes one argument", self.name) };
                let function = state_function_of(field)?;
                if function.name != self.function {
                    return plan_err!(
                        "{} takes states of {}, but {} holds states of {}",
                        self.name,
                        self.function,
                        field.name(),
                        function.name
                    );
                }
                Ok(function)
            }
        }
    }
}

impl AggregateUDFImpl for CombinatorFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[ArrowType]) -> DfResult<ArrowType> {
        match self.combinator {
            Combinator::State => Ok(ArrowType::Binary),
            Combinator::Merge => plan_err!("{} needs its argument's field", self.name),
        }
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> DfResult<FieldRef> {
        let function = self.aggregate_function(arg_fields)?;
        Ok(Arc::new(match self.combinator {
            Combinator::State => state_field(&self.name, &function),
            Combinator::Merge => function.result_type().arrow_field(&self.name).with_nullable(true),
        }))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let fields = args.exprs.iter().map(|e| e.return_field(args.schema)).collect::<DfResult<Vec<_>>>()?;
        let function = self.aggregate_function(&fields)?;
        let finalize = self.combinator == Combinator::Merge;
        Ok(Box::new(StateAccumulator { state: function.empty_state(), function, finalize }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(format!("{}[state]", args.name), ArrowType::Binary, true))])
    }
}

#[derive(Debug)]
struct StateAccumulator {
    function: AggregateFunction,
    state: State,
    /// `fMerge`: inputs are states and the result is the final value.
    finalize: bool,
}

impl Accumulator for StateAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        if self.finalize {
            return self.merge_batch(values);
        }
        let rows = values.first().map_or(0, |v| v.len());
        let mut args = Vec::with_capacity(values.len());
        for row in 0..rows {
            args.clear();
            args.extend(values.iter().map(|v| AggValue::at(v.as_ref(), row)));
            self.function.add(&mut self.state, &args);
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let Some(array) = states.first() else {
            return Ok(());
        };
        for row in 0..array.len() {
            if let Some(state) = decode(array.as_ref(), row)? {
                self.function.merge(&mut self.state, state);
            }
        }
        Ok(())
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Binary(Some(self.state.encode()))])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        if !self.finalize {
            return Ok(ScalarValue::Binary(Some(self.state.encode())));
        }
        let column = finalized_column(&self.function, vec![self.function.finalize(&self.state)])?;
        ScalarValue::try_from_array(&column, 0)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.state.encode().len()
    }
}

/// `finalizeAggregation(state)`: the final value of each state.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FinalizeAggregation {
    aliases: Vec<String>,
    signature: Signature,
}

impl FinalizeAggregation {
    fn new() -> FinalizeAggregation {
        FinalizeAggregation {
            aliases: vec!["finalizeaggregation".to_string()],
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for FinalizeAggregation {
    fn name(&self) -> &str {
        "finalizeAggregation"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[ArrowType]) -> DfResult<ArrowType> {
        plan_err!("finalizeAggregation needs its argument's field")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        let field = &args.arg_fields[0];
        if field.data_type() != &ArrowType::Binary {
            // A SimpleAggregateFunction column holds final values already.
            return Ok(Arc::new(field.as_ref().clone().with_name("finalizeAggregation")));
        }
        let function = state_function_of(field)?;
        Ok(Arc::new(function.result_type().arrow_field("finalizeAggregation").with_nullable(true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let field = &args.arg_fields[0];
        let input = args.args[0].clone().into_array(args.number_rows)?;
        if field.data_type() != &ArrowType::Binary {
            return Ok(ColumnarValue::Array(input));
        }
        let function = state_function_of(field)?;
        let states: &BinaryArray = input.as_binary::<i32>();
        let mut values = Vec::with_capacity(states.len());
        for row in 0..states.len() {
            values.push(match decode(states, row)? {
                Some(state) => function.finalize(&state),
                None => AggValue::Null,
            });
        }
        let column = finalized_column(&function, values)?;
        let target = args.return_field.data_type();
        if column.data_type() != target {
            return exec_err!("finalizeAggregation produced {} instead of {target}", column.data_type());
        }
        Ok(ColumnarValue::Array(column))
    }
}
