//! Output formats: TSV, TSVWithNames, CSV, JSONEachRow, PrettyCompact and Null, as ClickHouse
//! writes them.

pub mod value;

use std::fmt::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::error::{QueryError, Result};
use value::{kind, write_value, Kind, Style};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Tsv,
    TsvWithNames,
    Csv,
    JsonEachRow,
    PrettyCompact,
    /// Nothing: the rows are made and dropped (ClickHouse's Null, for timing a query).
    Null,
}

impl OutputFormat {
    pub fn parse(name: &str) -> Result<OutputFormat> {
        Ok(match name {
            "TSV" | "TabSeparated" => OutputFormat::Tsv,
            "TSVWithNames" | "TabSeparatedWithNames" => OutputFormat::TsvWithNames,
            "CSV" => OutputFormat::Csv,
            "JSONEachRow" => OutputFormat::JsonEachRow,
            "PrettyCompact" => OutputFormat::PrettyCompact,
            "Null" => OutputFormat::Null,
            other => {
                return Err(QueryError::Invalid(format!(
                    "Unknown output format {other}: expected TSV, TSVWithNames, CSV, JSONEachRow, PrettyCompact or Null"
                )))
            }
        })
    }
}

/// Writes a result in the format.
pub fn write_result(format: OutputFormat, schema: &SchemaRef, batches: &[RecordBatch], out: &mut String) {
    match format {
        OutputFormat::Tsv | OutputFormat::TsvWithNames => {
            if format == OutputFormat::TsvWithNames {
                let names: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let mut s = String::new();
                        value::write_value(
                            &arrow::array::StringArray::from(vec![f.name().as_str()]),
                            0,
                            None,
                            Style::Tsv,
                            &mut s,
                        );
                        s
                    })
                    .collect();
                out.push_str(&names.join("\t"));
                out.push('\n');
            }
            write_delimited(schema, batches, '\t', Style::Tsv, out);
        }
        OutputFormat::Csv => write_delimited(schema, batches, ',', Style::Csv, out),
        OutputFormat::JsonEachRow => {
            for batch in batches {
                for row in 0..batch.num_rows() {
                    out.push('{');
                    for (c, field) in schema.fields().iter().enumerate() {
                        if c > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::Value::String(field.name().clone()).to_string());
                        out.push(':');
                        write_value(batch.column(c).as_ref(), row, Some(field), Style::Json, out);
                    }
                    out.push_str("}\n");
                }
            }
        }
        OutputFormat::PrettyCompact => write_pretty(schema, batches, out),
        OutputFormat::Null => {}
    }
}

fn write_delimited(schema: &SchemaRef, batches: &[RecordBatch], sep: char, style: Style, out: &mut String) {
    for batch in batches {
        for row in 0..batch.num_rows() {
            for (c, field) in schema.fields().iter().enumerate() {
                if c > 0 {
                    out.push(sep);
                }
                write_value(batch.column(c).as_ref(), row, Some(field), style, out);
            }
            out.push('\n');
        }
    }
}

fn write_pretty(schema: &SchemaRef, batches: &[RecordBatch], out: &mut String) {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    if rows == 0 {
        return;
    }
    let mut cells: Vec<Vec<String>> = Vec::with_capacity(rows);
    for batch in batches {
        for row in 0..batch.num_rows() {
            cells.push(
                schema
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(c, f)| {
                        let mut s = String::new();
                        write_value(batch.column(c).as_ref(), row, Some(f), Style::Pretty, &mut s);
                        s
                    })
                    .collect(),
            );
        }
    }
    let width = |s: &str| s.chars().count();
    let widths: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(c, f)| cells.iter().map(|r| width(&r[c])).chain([width(f.name())]).max().unwrap_or(0))
        .collect();
    let right: Vec<bool> = schema.fields().iter().map(|f| matches!(kind(f), Kind::Number | Kind::Temporal)).collect();
    let number_width = rows.to_string().len() + 2;
    let pad = " ".repeat(number_width);
    out.push_str(&pad);
    out.push('┌');
    for (c, f) in schema.fields().iter().enumerate() {
        if c > 0 {
            out.push('┬');
        }
        let fill = "─".repeat(widths[c] - width(f.name()) + 1);
        if right[c] {
            let _ = write!(out, "{fill}{}─", f.name());
        } else {
            let _ = write!(out, "─{}{fill}", f.name());
        }
    }
    out.push_str("┐\n");
    for (i, row) in cells.iter().enumerate() {
        let _ = write!(out, "{:>w$} ", format!("{}.", i + 1), w = number_width - 1);
        for (c, cell) in row.iter().enumerate() {
            let spaces = " ".repeat(widths[c] - width(cell));
            if right[c] {
                let _ = write!(out, "│ {spaces}{cell} ");
            } else {
                let _ = write!(out, "│ {cell}{spaces} ");
            }
        }
        out.push_str("│\n");
    }
    out.push_str(&pad);
    out.push('└');
    let bottom: Vec<String> = widths.iter().map(|w| "─".repeat(w + 2)).collect();
    out.push_str(&bottom.join("┴"));
    out.push_str("┘\n");
}
