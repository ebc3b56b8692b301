//! The ingestor's periodic status of a pipeline: rows per second committed, the lag of each
//! owned partition, and how long ago the last block was committed. On a terminal it is a line
//! on standard error every few seconds; otherwise a structured log event now and then, for
//! the log pipeline to pick up.
//!
//!   orders: 41250 rows/s, lag 1200 (orders/0 0, orders/1 1200), last commit 0.3 s ago, 2 partitions

use std::fmt;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use tracing::info;

/// Partitions listed one by one in the line; past that only the total and the largest.
const LISTED_PARTITIONS: usize = 8;
/// On a terminal every report is shown; in the logs, one in this many.
const LOG_EVERY_NTH: u64 = 6;

#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub pipeline: String,
    pub rows_per_second: f64,
    /// (topic, partition, messages after the committed offset), as the source reports them.
    pub lag: Vec<(String, i32, i64)>,
    pub since_last_commit: Option<Duration>,
    pub partitions: usize,
    pub stopped: usize,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: i64 = self.lag.iter().map(|(_, _, lag)| lag).sum();
        write!(f, "{}: {:.0} rows/s, lag {total}", self.pipeline, self.rows_per_second)?;
        let mut listed: Vec<&(String, i32, i64)> = self.lag.iter().collect();
        if listed.len() > LISTED_PARTITIONS {
            // The partitions furthest behind are the ones worth a look.
            listed.sort_by_key(|(_, _, lag)| std::cmp::Reverse(*lag));
            listed.truncate(LISTED_PARTITIONS);
        }
        if !listed.is_empty() {
            let parts: Vec<String> = listed.iter().map(|(t, p, lag)| format!("{t}/{p} {lag}")).collect();
            let more = if self.lag.len() > listed.len() { ", …" } else { "" };
            write!(f, " ({}{more})", parts.join(", "))?;
        }
        match self.since_last_commit {
            Some(ago) => write!(f, ", last commit {:.1} s ago", ago.as_secs_f64())?,
            None => write!(f, ", nothing committed yet")?,
        }
        write!(f, ", {} partitions", self.partitions)?;
        if self.stopped > 0 {
            write!(f, ", {} STOPPED", self.stopped)?;
        }
        Ok(())
    }
}

/// Where the reports go: counts the rows between reports and decides terminal or logs.
pub struct StatusReporter {
    terminal: bool,
    rows: u64,
    since: Instant,
    last_commit: Option<Instant>,
    reports: u64,
}

impl StatusReporter {
    pub fn on_stderr() -> StatusReporter {
        StatusReporter::new(std::io::stderr().is_terminal())
    }

    fn new(terminal: bool) -> StatusReporter {
        StatusReporter { terminal, rows: 0, since: Instant::now(), last_commit: None, reports: 0 }
    }

    pub fn committed(&mut self, rows: u64) {
        self.rows += rows;
        self.last_commit = Some(Instant::now());
    }

    /// The status since the last report, with the lag just read; starts counting again.
    pub fn take(&mut self, pipeline: &str, lag: Vec<(String, i32, i64)>, partitions: usize, stopped: usize) -> Status {
        let elapsed = self.since.elapsed().as_secs_f64().max(1e-3);
        let status = Status {
            pipeline: pipeline.to_string(),
            rows_per_second: self.rows as f64 / elapsed,
            lag,
            since_last_commit: self.last_commit.map(|at| at.elapsed()),
            partitions,
            stopped,
        };
        self.rows = 0;
        self.since = Instant::now();
        status
    }

    pub fn report(&mut self, status: &Status) {
        self.reports += 1;
        if self.terminal {
            eprintln!("{status}");
        } else if self.reports % LOG_EVERY_NTH == 1 {
            info!(
                pipeline = status.pipeline,
                rows_per_second = status.rows_per_second.round() as u64,
                lag = status.lag.iter().map(|(_, _, lag)| lag).sum::<i64>(),
                max_partition_lag = status.lag.iter().map(|(_, _, lag)| *lag).max().unwrap_or(0),
                last_commit_seconds_ago = status.since_last_commit.map(|d| d.as_secs_f64()),
                partitions = status.partitions,
                stopped = status.stopped,
                "status"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(lag: Vec<(String, i32, i64)>) -> Status {
        Status {
            pipeline: "orders".into(),
            rows_per_second: 41250.4,
            lag,
            since_last_commit: Some(Duration::from_millis(300)),
            partitions: 2,
            stopped: 0,
        }
    }

    #[test]
    fn the_line_names_each_partitions_lag() {
        let s = status(vec![("orders".into(), 0, 0), ("orders".into(), 1, 1200)]);
        assert_eq!(
            s.to_string(),
            "orders: 41250 rows/s, lag 1200 (orders/0 0, orders/1 1200), last commit 0.3 s ago, 2 partitions"
        );
    }

    #[test]
    fn many_partitions_show_the_furthest_behind() {
        let s = status((0..20).map(|p| ("t".to_string(), p, i64::from(p))).collect());
        let line = s.to_string();
        assert!(line.contains("lag 190 (t/19 19, t/18 18,"), "{line}");
        assert!(line.contains("t/12 12, …)"), "{line}");
        assert!(!line.contains("t/11 "), "{line}");
    }

    #[test]
    fn rows_per_second_count_from_the_last_report() {
        let mut reporter = StatusReporter::new(false);
        reporter.committed(500);
        let first = reporter.take("p", Vec::new(), 1, 0);
        assert!(first.rows_per_second > 0.0 && first.since_last_commit.is_some());
        assert!(first.to_string().contains("lag 0, last commit"), "{first}");
        assert_eq!(reporter.take("p", Vec::new(), 1, 0).rows_per_second, 0.0);
    }
}
