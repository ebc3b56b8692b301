//! The progress line of `storage-node local` and `storage-node client`, as clickhouse-client
//! draws it: on standard error, only when it is a terminal, redrawn every 100 ms while a
//! statement runs and erased before its result is printed.
//!
//!   Progress: 12.35 million rows, 98.80 MB (4.11 million rows/s., 32.90 MB/s.) 3.0 s

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mergestream_engine::progress::{ReadCounts, ReadProgress};

const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// A statement quicker than this shows no line at all (no flicker on small queries).
const SHOW_AFTER: Duration = Duration::from_millis(200);

/// What the line shows, set by whoever learns it (a local session's counters, or a server's
/// progress messages).
#[derive(Default)]
struct State {
    counts: ReadCounts,
    /// When the running statement began; `None` between statements.
    began: Option<Instant>,
    drawn: bool,
}

pub struct ProgressLine {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    painter: Option<std::thread::JoinHandle<()>>,
}

impl ProgressLine {
    /// A line on standard error if it is a terminal; otherwise one that draws nothing. With
    /// a `source` it shows that session's counts; without, what [`update`](Self::update) sets.
    pub fn on_stderr(source: Option<Arc<ReadProgress>>) -> ProgressLine {
        ProgressLine::new(std::io::stderr().is_terminal(), source)
    }

    fn new(enabled: bool, source: Option<Arc<ReadProgress>>) -> ProgressLine {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let painter = enabled.then(|| {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(REDRAW_EVERY);
                    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(began) = state.began else { continue };
                    let elapsed = began.elapsed();
                    if elapsed >= SHOW_AFTER {
                        let counts = source.as_ref().map_or(state.counts, |s| s.counts());
                        let mut err = std::io::stderr().lock();
                        let _ = write!(err, "\r\x1b[K{}", render(counts, elapsed));
                        let _ = err.flush();
                        state.drawn = true;
                    }
                }
            })
        });
        ProgressLine { state, stop, painter }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A statement starts: the clock starts again.
    pub fn statement_started(&self) {
        let mut state = self.lock();
        state.began = Some(Instant::now());
        state.counts = ReadCounts::default();
    }

    pub fn update(&self, counts: ReadCounts) {
        self.lock().counts = counts;
    }

    /// The statement ended: the line is erased (before its result is printed).
    pub fn statement_finished(&self) {
        let mut state = self.lock();
        state.began = None;
        if std::mem::take(&mut state.drawn) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.statement_finished();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(painter) = self.painter.take() {
            let _ = painter.join();
        }
    }
}

fn render(counts: ReadCounts, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    format!(
        "Progress: {} rows, {} ({} rows/s., {}/s.) {:.1} s",
        quantity(counts.rows as f64),
        size(counts.bytes as f64),
        quantity(counts.rows as f64 / seconds),
        size(counts.bytes as f64 / seconds),
        elapsed.as_secs_f64()
    )
}

/// A count as ClickHouse's formatReadableQuantity writes it: `12.35 million`.
fn quantity(n: f64) -> String {
    const UNITS: [&str; 5] = ["", " thousand", " million", " billion", " trillion"];
    scaled(n, 1000.0, &UNITS)
}

/// Bytes as ClickHouse's formatReadableSize with decimal units writes them: `98.80 MB`.
fn size(n: f64) -> String {
    const UNITS: [&str; 6] = [" B", " KB", " MB", " GB", " TB", " PB"];
    scaled(n, 1000.0, &UNITS)
}

fn scaled(mut n: f64, step: f64, units: &[&str]) -> String {
    let mut unit = 0;
    while n >= step && unit + 1 < units.len() {
        n /= step;
        unit += 1;
    }
    if unit == 0 {
        format!("{n:.0}{}", units[0])
    } else {
        format!("{n:.2}{}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_as_clickhouse_clients() {
        let counts = ReadCounts { rows: 12_345_678, bytes: 98_800_000 };
        assert_eq!(
            render(counts, Duration::from_secs(3)),
            "Progress: 12.35 million rows, 98.80 MB (4.12 million rows/s., 32.93 MB/s.) 3.0 s"
        );
        assert_eq!(quantity(999.0), "999");
        assert_eq!(size(1_500.0), "1.50 KB");
    }

    #[test]
    fn a_line_that_is_not_on_a_terminal_draws_nothing() {
        let line = ProgressLine::new(false, None);
        line.statement_started();
        line.update(ReadCounts { rows: 1, bytes: 1 });
        assert!(line.painter.is_none());
        line.statement_finished();
        assert!(!line.lock().drawn);
    }
}
