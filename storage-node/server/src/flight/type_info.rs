//! GetXdbcTypeInfo: the ClickHouse types a column can have, as JDBC and ODBC describe types.

use arrow_flight::sql::metadata::{XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder};
use arrow_flight::sql::{Nullable, Searchable, XdbcDataType, XdbcDatetimeSubcode};

/// A ClickHouse type: its name, its XDBC type, its size (digits of a number, characters of a
/// fixed string; none where unbounded), whether it is unsigned.
struct ClickHouseType {
    name: &'static str,
    xdbc: XdbcDataType,
    size: Option<i32>,
    unsigned: Option<bool>,
    /// The quotes a literal of the type takes.
    quoted: bool,
    create_params: Option<&'static [&'static str]>,
}

const fn number(name: &'static str, xdbc: XdbcDataType, digits: i32, unsigned: bool) -> ClickHouseType {
    ClickHouseType { name, xdbc, size: Some(digits), unsigned: Some(unsigned), quoted: false, create_params: None }
}

const fn quoted(name: &'static str, xdbc: XdbcDataType, size: Option<i32>) -> ClickHouseType {
    ClickHouseType { name, xdbc, size, unsigned: None, quoted: true, create_params: None }
}

const TYPES: &[ClickHouseType] = &[
    number("Bool", XdbcDataType::XdbcBit, 1, true),
    number("Int8", XdbcDataType::XdbcTinyint, 3, false),
    number("UInt8", XdbcDataType::XdbcTinyint, 3, true),
    number("Int16", XdbcDataType::XdbcSmallint, 5, false),
    number("UInt16", XdbcDataType::XdbcSmallint, 5, true),
    number("Int32", XdbcDataType::XdbcInteger, 10, false),
    number("UInt32", XdbcDataType::XdbcInteger, 10, true),
    number("Int64", XdbcDataType::XdbcBigint, 19, false),
    number("UInt64", XdbcDataType::XdbcBigint, 20, true),
    number("Float32", XdbcDataType::XdbcReal, 7, false),
    number("Float64", XdbcDataType::XdbcDouble, 15, false),
    ClickHouseType {
        name: "Decimal",
        xdbc: XdbcDataType::XdbcDecimal,
        size: Some(76),
        unsigned: Some(false),
        quoted: false,
        create_params: Some(&["precision", "scale"]),
    },
    quoted("String", XdbcDataType::XdbcVarchar, None),
    ClickHouseType {
        name: "FixedString",
        xdbc: XdbcDataType::XdbcChar,
        size: None,
        unsigned: None,
        quoted: true,
        create_params: Some(&["length"]),
    },
    quoted("UUID", XdbcDataType::XdbcChar, Some(36)),
    quoted("Date", XdbcDataType::XdbcDate, Some(10)),
    quoted("Date32", XdbcDataType::XdbcDate, Some(10)),
    quoted("DateTime", XdbcDataType::XdbcTimestamp, Some(19)),
    ClickHouseType {
        name: "DateTime64",
        xdbc: XdbcDataType::XdbcTimestamp,
        size: Some(29),
        unsigned: None,
        quoted: true,
        create_params: Some(&["precision"]),
    },
];

pub fn type_info() -> XdbcTypeInfoData {
    let mut builder = XdbcTypeInfoDataBuilder::new();
    for t in TYPES {
        let date_time = matches!(t.xdbc, XdbcDataType::XdbcDate | XdbcDataType::XdbcTimestamp);
        builder.append(XdbcTypeInfo {
            type_name: t.name.into(),
            data_type: t.xdbc,
            column_size: t.size,
            literal_prefix: t.quoted.then(|| "'".into()),
            literal_suffix: t.quoted.then(|| "'".into()),
            create_params: t.create_params.map(|p| p.iter().map(|s| s.to_string()).collect()),
            // Any type is nullable as Nullable(T).
            nullable: Nullable::NullabilityNullable,
            case_sensitive: t.quoted && !date_time,
            searchable: Searchable::Full,
            unsigned_attribute: t.unsigned,
            fixed_prec_scale: false,
            auto_increment: Some(false),
            local_type_name: Some(t.name.into()),
            minimum_scale: (t.name == "Decimal" || t.name == "DateTime64").then_some(0),
            maximum_scale: match t.name {
                "Decimal" => Some(76),
                "DateTime64" => Some(9),
                _ => None,
            },
            sql_data_type: if date_time { XdbcDataType::XdbcDatetime } else { t.xdbc },
            datetime_subcode: match t.xdbc {
                // XDBC_SUBCODE_DATE is an alias of 1, which prost names after YEAR.
                XdbcDataType::XdbcDate => Some(XdbcDatetimeSubcode::XdbcSubcodeYear),
                XdbcDataType::XdbcTimestamp => Some(XdbcDatetimeSubcode::XdbcSubcodeTimestamp),
                _ => None,
            },
            num_prec_radix: t.unsigned.map(|_| 10),
            interval_precision: None,
        });
    }
    // Built from the constant list above: it cannot fail.
    builder.build().unwrap_or_else(|e| panic!("the XDBC type table: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_is_listed_once_and_filters_by_xdbc_type() {
        let info = type_info();
        let all = info.record_batch(None).expect("all types");
        assert_eq!(all.num_rows(), TYPES.len());
        let bigint = info.record_batch(XdbcDataType::XdbcBigint as i32).expect("bigint");
        assert_eq!(bigint.num_rows(), 2, "Int64 and UInt64");
    }
}
