//! What `storage-node`, `coordinator` and `ingestor` share at their edge: one log variable,
//! `MERGESTREAM_LOG`, read the same way by each, and `--config FILE` in TOML with errors that
//! name file:line:column (as the pipeline YAML's do), and `--metrics-addr` served the same way.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// The variable every binary reads its log filter from (`tracing`'s EnvFilter syntax:
/// `info`, `warn,mergestream_replication=debug`, …).
pub const LOG_VARIABLE: &str = "MERGESTREAM_LOG";

/// Logs to standard error, coloured when it is a terminal, filtered by `MERGESTREAM_LOG`
/// or else by `default_filter`.
pub fn init_logging(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(LOG_VARIABLE)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
}

/// Histogram buckets of durations, in seconds: 0.5 ms to 2 min, a factor of about 2.5 apart
/// (coordinator requests take well under a millisecond, an OPTIMIZE of a large table minutes).
const DURATION_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Histogram buckets of everything that is not a duration (a count: commands per log entry,
/// appends per fsync, …): powers of two.
const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Serves Prometheus' `/metrics` on `addr` from now on, with the help and unit of every metric
/// of `catalogues`. Histograms are exported with buckets (not as summaries), so a dashboard
/// can aggregate them across processes with `histogram_quantile`.
pub fn serve_metrics(
    addr: std::net::SocketAddr,
    catalogues: &[&[mergestream_telemetry::Metric]],
) -> Result<(), metrics_exporter_prometheus::BuildError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(COUNT_BUCKETS)?
        .set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)?
        .install()?;
    mergestream_telemetry::describe(catalogues);
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{location}: {message}")]
    Parse { location: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// A TOML config file as `T` (whose unknown keys should be refused with
/// `#[serde(deny_unknown_fields)]`).
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    parse_toml(&text, &path.display().to_string())
}

/// `text` as `T`; `origin` names it in errors (the file's path).
pub fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |span| line_and_column(text, span.start));
        ConfigError::Parse { location: format!("{origin}:{line}:{column}"), message: e.message().to_string() }
    })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        name: Option<String>,
        count: Option<u32>,
    }

    #[test]
    fn errors_name_the_line_and_column() {
        let error = parse_toml::<Sample>("name = \"a\"\n  nmae = \"b\"\n", "f.toml").expect_err("unknown key");
        assert!(error.to_string().starts_with("f.toml:2:3: unknown field `nmae`"), "{error}");
        let error = parse_toml::<Sample>("count = \"é\"\n", "f.toml").expect_err("a string");
        assert!(error.to_string().starts_with("f.toml:1:9: invalid type"), "{error}");
        let error = parse_toml::<Sample>("name = \"é\"\ncount = [\n", "f.toml").expect_err("not TOML");
        assert!(error.to_string().starts_with("f.toml:2:"), "{error}");
    }
}
