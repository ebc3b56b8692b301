//! Avro binary datums → JSON documents, so that the column mapping works the same for Avro
//! as for JSON.
//!
//! Records become objects and unions their branch. Logical types keep the numbers Avro
//! stores, which are what the matching ClickHouse columns take: `date` as days,
//! `timestamp-millis` as milliseconds (a DateTime64(3) column; `convert: from_unix_millis`
//! for a DateTime one). Decimals become their exact text at the schema's scale; floats that
//! JSON cannot hold (NaN, ±inf) become the text ClickHouse parses as those values.

use std::collections::HashMap;

use apache_avro::schema::{Name, ResolvedSchema};
use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use serde_json::Value as Json;

/// A parsed writer schema with its named types, for `Ref` lookups.
#[derive(Debug)]
pub struct AvroSchema {
    schema: Schema,
    names: HashMap<Name, Schema>,
}

impl AvroSchema {
    pub fn parse(text: &str) -> Result<AvroSchema, String> {
        let schema = Schema::parse_str(text).map_err(|e| e.to_string())?;
        let names = ResolvedSchema::try_from(&schema)
            .map_err(|e| e.to_string())?
            .get_names()
            .iter()
            .map(|(name, s)| (name.clone(), (*s).clone()))
            .collect();
        Ok(AvroSchema { schema, names })
    }

    /// Decodes one datum (no container header) that must fill `bytes` exactly.
    pub fn decode(&self, bytes: &[u8]) -> Result<Json, String> {
        let mut reader = bytes;
        let value = apache_avro::from_avro_datum(&self.schema, &mut reader, None).map_err(|e| e.to_string())?;
        if !reader.is_empty() {
            return Err(format!("{} bytes left over after the datum", reader.len()));
        }
        self.to_json(value, &self.schema)
    }

    /// Whether a field path (`customer.name`) leads through records of this schema; the
    /// error names the first step that does not.
    pub fn check_path(&self, path: &[String]) -> Result<(), String> {
        let mut at = &self.schema;
        for (depth, step) in path.iter().enumerate() {
            let record = self
                .record_in(at)
                .ok_or_else(|| format!("`{}` is not a record in the Avro schema", path[..depth].join(".")))?;
            let field = record.fields.iter().find(|f| &f.name == step).ok_or_else(|| {
                let names: Vec<&str> = record.fields.iter().map(|f| f.name.as_str()).collect();
                format!("the Avro record {} has no field `{step}`; its fields are {}", record.name, names.join(", "))
            })?;
            at = &field.schema;
        }
        Ok(())
    }

    /// The record a schema is, or the one record among a union's branches.
    fn record_in<'s>(&'s self, schema: &'s Schema) -> Option<&'s apache_avro::schema::RecordSchema> {
        match self.resolve(schema) {
            Schema::Record(record) => Some(record),
            Schema::Union(union) => {
                let mut records = union.variants().iter().filter_map(|v| match self.resolve(v) {
                    Schema::Record(r) => Some(r),
                    _ => None,
                });
                let first = records.next()?;
                records.next().is_none().then_some(first)
            }
            _ => None,
        }
    }

    fn resolve<'s>(&'s self, schema: &'s Schema) -> &'s Schema {
        match schema {
            Schema::Ref { name } => self.names.get(name).unwrap_or(schema),
            other => other,
        }
    }

    fn to_json(&self, value: Avro, schema: &Schema) -> Result<Json, String> {
        let schema = self.resolve(schema);
        Ok(match value {
            Avro::Null => Json::Null,
            Avro::Boolean(b) => Json::Bool(b),
            Avro::Int(n) | Avro::Date(n) | Avro::TimeMillis(n) => n.into(),
            Avro::Long(n)
            | Avro::TimeMicros(n)
            | Avro::TimestampMillis(n)
            | Avro::TimestampMicros(n)
            | Avro::TimestampNanos(n)
            | Avro::LocalTimestampMillis(n)
            | Avro::LocalTimestampMicros(n)
            | Avro::LocalTimestampNanos(n) => n.into(),
            Avro::Float(f) => float(f64::from(f)),
            Avro::Double(f) => float(f),
            Avro::Bytes(b) | Avro::Fixed(_, b) => Json::String(String::from_utf8_lossy(&b).into_owned()),
            Avro::String(s) | Avro::Enum(_, s) => Json::String(s),
            Avro::Uuid(u) => Json::String(u.to_string()),
            Avro::BigDecimal(d) => Json::String(d.to_string()),
            Avro::Decimal(d) => {
                let Schema::Decimal(decimal) = schema else {
                    return Err("a decimal value without a decimal schema".into());
                };
                let bytes: Vec<u8> = Vec::try_from(&d).map_err(|e| e.to_string())?;
                Json::String(decimal_text(&bytes, decimal.scale)?)
            }
            Avro::Duration(d) => {
                let (months, days, millis): (u32, u32, u32) = (d.months().into(), d.days().into(), d.millis().into());
                serde_json::json!({ "months": months, "days": days, "millis": millis })
            }
            Avro::Union(branch, inner) => {
                let Schema::Union(union) = schema else { return Err("a union value without a union schema".into()) };
                let variant = union.variants().get(branch as usize).ok_or("a union branch out of range")?;
                self.to_json(*inner, variant)?
            }
            Avro::Array(items) => {
                let Schema::Array(array) = schema else { return Err("an array value without an array schema".into()) };
                Json::Array(items.into_iter().map(|v| self.to_json(v, &array.items)).collect::<Result<_, _>>()?)
            }
            Avro::Map(entries) => {
                let Schema::Map(map) = schema else { return Err("a map value without a map schema".into()) };
                let mut object = serde_json::Map::with_capacity(entries.len());
                for (k, v) in entries {
                    object.insert(k, self.to_json(v, &map.types)?);
                }
                Json::Object(object)
            }
            Avro::Record(fields) => {
                let Schema::Record(record) = schema else {
                    return Err("a record value without a record schema".into());
                };
                let mut object = serde_json::Map::with_capacity(fields.len());
                for ((name, v), field) in fields.into_iter().zip(&record.fields) {
                    let converted = self.to_json(v, &field.schema)?;
                    object.insert(name, converted);
                }
                Json::Object(object)
            }
        })
    }
}

fn float(f: f64) -> Json {
    match serde_json::Number::from_f64(f) {
        Some(n) => Json::Number(n),
        None if f.is_nan() => Json::String("nan".into()),
        None if f > 0.0 => Json::String("inf".into()),
        None => Json::String("-inf".into()),
    }
}

/// Big-endian two's complement unscaled bytes → `-123.45` at `scale` digits.
fn decimal_text(bytes: &[u8], scale: usize) -> Result<String, String> {
    if bytes.len() > 16 {
        return Err(format!("a decimal of {} bytes is wider than Decimal128", bytes.len()));
    }
    let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) { 0xFF } else { 0 };
    let mut wide = [fill; 16];
    wide[16 - bytes.len()..].copy_from_slice(bytes);
    let unscaled = i128::from_be_bytes(wide);
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    if scale == 0 {
        return Ok(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, frac) = padded.split_at(padded.len() - scale);
    Ok(format!("{sign}{whole}.{frac}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::to_avro_datum;

    const SCHEMA: &str = r#"{
        "type": "record", "name": "Order", "fields": [
            {"name": "id", "type": "long"},
            {"name": "who", "type": ["null", "string"]},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ratio", "type": "double"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
                {"name": "name", "type": "string"}]}},
            {"name": "previous", "type": ["null", "Customer"]}
        ]}"#;

    fn customer(name: &str) -> Avro {
        Avro::Record(vec![("name".into(), Avro::String(name.into()))])
    }

    #[test]
    fn a_record_becomes_an_object_with_logical_types_as_clickhouse_takes_them() {
        let schema = AvroSchema::parse(SCHEMA).expect("schema");
        let datum = Avro::Record(vec![
            ("id".into(), Avro::Long(7)),
            ("who".into(), Avro::Union(1, Box::new(Avro::String("ann".into())))),
            ("price".into(), Avro::Decimal(apache_avro::Decimal::from((-12345i32).to_be_bytes()))),
            ("day".into(), Avro::Date(20_000)),
            ("ratio".into(), Avro::Double(f64::NAN)),
            ("tags".into(), Avro::Array(vec![Avro::String("a".into())])),
            ("customer".into(), customer("bob")),
            ("previous".into(), Avro::Union(1, Box::new(customer("cy")))),
        ]);
        let bytes = to_avro_datum(&schema.schema, datum).expect("encode");
        let json = schema.decode(&bytes).expect("decode");
        assert_eq!(
            json,
            serde_json::json!({"id": 7, "who": "ann", "price": "-123.45", "day": 20000, "ratio": "nan",
                "tags": ["a"], "customer": {"name": "bob"}, "previous": {"name": "cy"}})
        );
    }

    #[test]
    fn bytes_that_do_not_match_the_schema_are_an_error() {
        let schema = AvroSchema::parse(SCHEMA).expect("schema");
        assert!(schema.decode(b"\x02").is_err());
        assert!(AvroSchema::parse(r#"{"type": "record", "name": "x"}"#).is_err());
    }

    #[test]
    fn field_paths_are_checked_against_the_records() {
        let schema = AvroSchema::parse(SCHEMA).expect("schema");
        let path = |p: &str| p.split('.').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(schema.check_path(&path("customer.name")), Ok(()));
        assert_eq!(schema.check_path(&path("previous.name")), Ok(()));
        let missing = schema.check_path(&path("customer.age")).expect_err("no such field");
        assert_eq!(missing, "the Avro record Customer has no field `age`; its fields are name");
        assert!(schema.check_path(&path("id.x")).expect_err("not a record").contains("`id` is not a record"));
    }

    #[test]
    fn decimals_keep_their_scale() {
        assert_eq!(decimal_text(&[0x01, 0x00], 2).as_deref(), Ok("2.56"));
        assert_eq!(decimal_text(&[0xFF], 3).as_deref(), Ok("-0.001"));
        assert_eq!(decimal_text(&[0x05], 0).as_deref(), Ok("5"));
    }
}
