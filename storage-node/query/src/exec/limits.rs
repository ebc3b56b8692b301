//! ClickHouse's per-query limits on a running SELECT: `max_execution_time` stops its rows
//! with TIMEOUT_EXCEEDED once that much time has passed (a timer, so a query busy before its
//! first batch stops too), and `max_memory_usage` gives its operators a memory pool of that
//! many bytes, where one that would exceed it fails with MEMORY_LIMIT_EXCEEDED naming the
//! limit. 0, or no setting, is no limit, as in ClickHouse.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;

use crate::error::{QueryError, Result};

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub max_execution_time: Option<Duration>,
    pub max_memory_usage: Option<usize>,
}

impl Limits {
    /// The limits `setting` gives (a statement's SETTINGS over the session's).
    pub fn from_settings(setting: impl Fn(&str) -> Option<String>) -> Result<Limits> {
        let max_execution_time = match setting("max_execution_time") {
            None => None,
            Some(text) => match text.trim().parse::<f64>() {
                Ok(secs) if secs.is_finite() && secs >= 0.0 => Some(Duration::from_secs_f64(secs)),
                _ => return Err(QueryError::Invalid(format!("max_execution_time must be seconds, got '{text}'"))),
            },
        };
        let max_memory_usage = match setting("max_memory_usage") {
            None => None,
            Some(text) => Some(
                text.trim()
                    .parse::<usize>()
                    .map_err(|_| QueryError::Invalid(format!("max_memory_usage must be bytes, got '{text}'")))?,
            ),
        };
        Ok(Limits {
            max_execution_time: max_execution_time.filter(|d| !d.is_zero()),
            max_memory_usage: max_memory_usage.filter(|b| *b > 0),
        })
    }

    /// The runtime a statement plans with under the memory limit: `base`'s, with a pool of
    /// its own (the operators' reservations are per statement).
    pub fn runtime(&self, base: &Arc<RuntimeEnv>) -> Result<Arc<RuntimeEnv>> {
        let Some(bytes) = self.max_memory_usage else { return Ok(base.clone()) };
        let pool = TrackConsumersPool::new(GreedyMemoryPool::new(bytes), std::num::NonZeroUsize::MIN);
        Ok(RuntimeEnvBuilder::from_runtime_env(base).with_memory_pool(Arc::new(pool)).build_arc()?)
    }

    /// The rows of `stream`, stopped at the time limit, with a memory error named as ClickHouse's.
    pub fn bound(&self, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
        if *self == Limits::default() {
            return stream;
        }
        Box::pin(Bounded {
            inner: stream,
            began: Instant::now(),
            deadline: self.max_execution_time.map(|limit| (limit, Box::pin(tokio::time::sleep(limit)))),
            max_memory_usage: self.max_memory_usage,
            ended: false,
        })
    }
}

struct Bounded {
    inner: SendableRecordBatchStream,
    began: Instant,
    deadline: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    max_memory_usage: Option<usize>,
    ended: bool,
}

impl Stream for Bounded {
    type Item = datafusion::error::Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let began = self.began;
        if let Some((limit, sleep)) = &mut self.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                let error = QueryError::Timeout {
                    elapsed_ms: began.elapsed().as_secs_f64() * 1000.0,
                    limit_ms: limit.as_secs_f64() * 1000.0,
                };
                self.ended = true;
                return Poll::Ready(Some(Err(DataFusionError::External(Box::new(error)))));
            }
        }
        let max_memory_usage = self.max_memory_usage;
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                Poll::Ready(Some(Err(match (max_memory_usage, e.find_root()) {
                    (Some(limit), DataFusionError::ResourcesExhausted(message)) => {
                        DataFusionError::External(Box::new(QueryError::MemoryLimit { limit, message: message.clone() }))
                    }
                    _ => e,
                })))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for Bounded {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_absent_are_no_limit_and_bad_values_are_named() {
        let none = Limits::from_settings(|_| None).expect("none");
        assert_eq!(none, Limits::default());
        let zero = Limits::from_settings(|_| Some("0".into())).expect("zero");
        assert_eq!(zero, Limits::default());
        let set = Limits::from_settings(|name| Some(if name == "max_execution_time" { "1.5" } else { "1000" }.into()))
            .expect("set");
        assert_eq!(set.max_execution_time, Some(Duration::from_millis(1500)));
        assert_eq!(set.max_memory_usage, Some(1000));
        let bad = Limits::from_settings(|_| Some("soon".into())).expect_err("not a number");
        assert!(bad.to_string().contains("max_execution_time must be seconds, got 'soon'"), "{bad}");
    }
}
