//! Every metric a crate records is declared once, in that crate's `metrics.rs`, with
//! [`catalogue!`]: the constant the call sites use, its kind, labels and help. From that one
//! list the binaries describe their metrics to the Prometheus exporter (`# HELP`, `# TYPE`),
//! print the documentation's table (`<binary> metrics`), and a test generated beside each list
//! holds every name to the convention below — so a dashboard can rely on the names.
//!
//! The convention (Prometheus' own): every name starts with `mergestream_`, then the
//! component; a counter ends in `_total`; a quantity with a unit says it in its name's last
//! word before `_total` (`_seconds`, `_bytes`), and anything else is a plain count.

use std::fmt::Write;

/// The prefix of every metric name.
pub const PREFIX: &str = "mergestream_";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of a catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    /// From the declaration's doc comment.
    pub help: &'static str,
}

impl Metric {
    /// The unit, read from the name: the convention makes the name say it.
    pub fn unit(&self) -> metrics::Unit {
        let base = self.name.strip_suffix("_total").unwrap_or(self.name);
        if base.ends_with("_seconds") {
            metrics::Unit::Seconds
        } else if base.ends_with("_bytes") {
            metrics::Unit::Bytes
        } else {
            metrics::Unit::Count
        }
    }

    fn help_text(&self) -> String {
        self.help.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// What is wrong with this metric's name, if anything.
    pub fn naming_problem(&self) -> Option<String> {
        let name = self.name;
        if !name.starts_with(PREFIX) {
            return Some(format!("{name}: does not start with {PREFIX}"));
        }
        if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return Some(format!("{name}: not lowercase snake case"));
        }
        match (self.kind, name.ends_with("_total")) {
            (Kind::Counter, false) => return Some(format!("{name}: a counter's name ends in _total")),
            (Kind::Gauge | Kind::Histogram, true) => {
                return Some(format!("{name}: only a counter's name ends in _total"))
            }
            _ => {}
        }
        if self.help.trim().is_empty() {
            return Some(format!("{name}: no help text (the doc comment of its declaration)"));
        }
        None
    }
}

/// Panics naming every metric of `catalogue` that breaks the convention, or whose name is
/// declared twice.
pub fn assert_conventions(catalogue: &[Metric]) {
    let mut problems: Vec<String> = catalogue.iter().filter_map(Metric::naming_problem).collect();
    for (i, m) in catalogue.iter().enumerate() {
        if catalogue[..i].iter().any(|earlier| earlier.name == m.name) {
            problems.push(format!("{}: declared twice", m.name));
        }
    }
    assert!(problems.is_empty(), "metric names break the convention:\n{}", problems.join("\n"));
}

/// Gives the installed recorder each metric's unit and help (the exporter's `# HELP`).
pub fn describe(catalogues: &[&[Metric]]) {
    for m in catalogues.iter().flat_map(|c| c.iter()) {
        let help = m.help_text();
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.unit(), help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.unit(), help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.unit(), help),
        }
    }
}

/// The Markdown table of the documentation (docs/metrics.md), one row per metric.
pub fn markdown_table(catalogues: &[&[Metric]]) -> String {
    let mut out = String::from("| Metric | Kind | Unit | Labels | Meaning |\n|---|---|---|---|---|\n");
    for m in catalogues.iter().flat_map(|c| c.iter()) {
        let unit = match m.unit() {
            metrics::Unit::Seconds => "seconds",
            metrics::Unit::Bytes => "bytes",
            _ => "count",
        };
        let labels = m.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(out, "| `{}` | {} | {unit} | {labels} | {} |", m.name, m.kind.as_str(), m.help_text());
    }
    out
}

/// Declares a crate's metrics: one constant per metric (its name, for the call sites), `ALL`
/// (the catalogue), and a unit test holding the names to the convention.
///
/// ```
/// mod metrics {
///     mergestream_telemetry::catalogue! {
///         /// Parts written by inserts.
///         Counter PARTS_INSERTED = "mergestream_engine_parts_inserted_total";
///         /// Time of one insert, by table.
///         Histogram INSERT_DURATION = "mergestream_engine_insert_duration_seconds" ["table"];
///     }
/// }
/// assert_eq!(metrics::ALL.len(), 2);
/// assert_eq!(metrics::INSERT_DURATION, "mergestream_engine_insert_duration_seconds");
/// ```
#[macro_export]
macro_rules! catalogue {
    ($( $(#[doc = $help:literal])+ $kind:ident $ident:ident = $name:literal $([$($label:literal),* $(,)?])? ; )*) => {
        $( $(#[doc = $help])+ pub const $ident: &str = $name; )*

        /// Every metric this crate records.
        pub const ALL: &[$crate::Metric] = &[$(
            $crate::Metric {
                name: $name,
                kind: $crate::Kind::$kind,
                labels: &[$($($label),*)?],
                help: concat!($($help, " "),+),
            }
        ),*];

        #[cfg(test)]
        #[test]
        fn metric_names_follow_the_convention() {
            $crate::assert_conventions(ALL);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(name: &'static str, kind: Kind) -> Metric {
        Metric { name, kind, labels: &[], help: "something" }
    }

    #[test]
    fn the_unit_comes_from_the_name() {
        assert_eq!(metric("mergestream_x_duration_seconds", Kind::Histogram).unit(), metrics::Unit::Seconds);
        assert_eq!(metric("mergestream_x_fetched_bytes_total", Kind::Counter).unit(), metrics::Unit::Bytes);
        assert_eq!(metric("mergestream_x_parts_total", Kind::Counter).unit(), metrics::Unit::Count);
    }

    #[test]
    fn names_off_the_convention_are_named() {
        assert!(metric("coordinator_znodes", Kind::Gauge).naming_problem().is_some());
        assert!(metric("mergestream_x_merges", Kind::Counter).naming_problem().is_some());
        assert!(metric("mergestream_x_parts_total", Kind::Gauge).naming_problem().is_some());
        assert!(metric("mergestream_x_Parts", Kind::Gauge).naming_problem().is_some());
        assert!(metric("mergestream_x_parts", Kind::Gauge).naming_problem().is_none());
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn a_name_declared_twice_is_refused() {
        assert_conventions(&[metric("mergestream_a", Kind::Gauge), metric("mergestream_a", Kind::Gauge)]);
    }

    #[test]
    fn the_table_has_a_row_per_metric() {
        let table = markdown_table(&[&[
            Metric { name: "mergestream_a_total", kind: Kind::Counter, labels: &["table"], help: " Rows\n in. " },
            metric("mergestream_b_seconds", Kind::Histogram),
        ]]);
        assert!(table.contains("| `mergestream_a_total` | counter | count | `table` | Rows in. |"), "{table}");
        assert!(table.contains("| `mergestream_b_seconds` | histogram | seconds |  | something |"), "{table}");
    }
}
