use zookeeper_client as zk;

use crate::{Keeper, KeeperError, NodeKind};

#[derive(Clone, Debug)]
enum Op {
    Check { path: String, version: i32 },
    Create { path: String, data: Vec<u8>, kind: NodeKind },
    Set { path: String, data: Vec<u8>, version: Option<i32> },
    Delete { path: String, version: Option<i32> },
}

impl Op {
    fn describe(&self) -> (&'static str, &str) {
        match self {
            Op::Check { path, .. } => ("check", path),
            Op::Create { path, .. } => ("create", path),
            Op::Set { path, .. } => ("set", path),
            Op::Delete { path, .. } => ("delete", path),
        }
    }
}

/// How [`Txn::commit_in_batches`] cuts `ops` ops followed by `last` guard ops into multis of
/// at most `batch`: the ranges of the ops in each, the final range going with the guards.
fn batch_ranges(ops: usize, last: usize, batch: usize) -> Vec<std::ops::Range<usize>> {
    let batch = batch.max(1);
    let room = batch.saturating_sub(last).max(1);
    let head = ops.saturating_sub(room);
    let mut ranges: Vec<_> = (0..head).step_by(batch).map(|start| start..(start + batch).min(head)).collect();
    ranges.push(head..ops);
    ranges
}

/// What one operation of a committed transaction produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnResult {
    Checked,
    Created { path: String },
    Set { version: i32 },
    Deleted,
}

/// A ZooKeeper multi: every operation applies, or none does. The error of a failed commit
/// names the first operation that failed, which is how a caller learns that, say, the offset
/// node's version guard tripped rather than the part's block id already existing.
#[must_use = "a transaction does nothing until committed"]
pub struct Txn<'a> {
    keeper: &'a Keeper,
    ops: Vec<Op>,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(keeper: &'a Keeper) -> Self {
        Txn { keeper, ops: Vec::new() }
    }

    /// Fails the transaction unless `path` is at `version`.
    pub fn check(mut self, path: &str, version: i32) -> Self {
        self.ops.push(Op::Check { path: path.to_string(), version });
        self
    }

    pub fn create(mut self, path: &str, data: &[u8], kind: NodeKind) -> Self {
        self.ops.push(Op::Create { path: path.to_string(), data: data.to_vec(), kind });
        self
    }

    pub fn set(mut self, path: &str, data: &[u8], expected_version: Option<i32>) -> Self {
        self.ops.push(Op::Set { path: path.to_string(), data: data.to_vec(), version: expected_version });
        self
    }

    pub fn delete(mut self, path: &str, expected_version: Option<i32>) -> Self {
        self.ops.push(Op::Delete { path: path.to_string(), version: expected_version });
        self
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits the ops as several multis of at most `batch` ops, in order, the last of them
    /// carrying `last`'s ops (the guards that say the whole is done) with the final few.
    /// Not atomic as a whole: for a caller that starts over when any multi fails, to whom
    /// the earlier batches left behind do no harm. A Keeper refuses a request above its
    /// `jute.maxbuffer` (1 MiB by default), which one multi of thousands of ops exceeds.
    /// Returns what the last multi produced.
    pub async fn commit_in_batches(self, last: Txn<'a>, batch: usize) -> Result<Vec<TxnResult>, KeeperError> {
        let Txn { keeper, ops } = self;
        let mut ranges = batch_ranges(ops.len(), last.ops.len(), batch);
        let final_range = ranges.pop().unwrap_or(0..0);
        for range in ranges {
            Txn { keeper, ops: ops[range].to_vec() }.commit().await?;
        }
        let mut tail = ops[final_range].to_vec();
        tail.extend(last.ops);
        Txn { keeper, ops: tail }.commit().await
    }

    pub async fn commit(self) -> Result<Vec<TxnResult>, KeeperError> {
        let mut writer = self.keeper.raw().new_multi_writer();
        for (index, op) in self.ops.iter().enumerate() {
            let added = match op {
                Op::Check { path, version } => writer.add_check_version(path, *version),
                Op::Create { path, data, kind } => writer.add_create(path, data, &self.keeper.create_options(*kind)),
                Op::Set { path, data, version } => writer.add_set_data(path, data, *version),
                Op::Delete { path, version } => writer.add_delete(path, *version),
            };
            added.map_err(|source| self.failed(index, source))?;
        }
        let Ok(committed) = tokio::time::timeout(self.keeper.request_timeout(), writer.commit()).await else {
            // Unanswered: the multi may or may not have happened, as after a lost connection.
            tracing::warn!(ops = self.ops.len(), "a coordinator multi went unanswered");
            return Err(KeeperError::TxnRequest { ops: self.ops.len(), source: zk::Error::ConnectionLoss });
        };
        match committed {
            Ok(results) => Ok(results
                .into_iter()
                .map(|r| match r {
                    zk::MultiWriteResult::Check => TxnResult::Checked,
                    zk::MultiWriteResult::Create { path, .. } => TxnResult::Created { path },
                    zk::MultiWriteResult::SetData { stat } => TxnResult::Set { version: stat.version },
                    zk::MultiWriteResult::Delete => TxnResult::Deleted,
                    // The enum is non-exhaustive; the four operations above produce no other kind.
                    _ => TxnResult::Deleted,
                })
                .collect()),
            Err(zk::MultiWriteError::OperationFailed { index, source }) => Err(self.failed(index, source)),
            Err(zk::MultiWriteError::RequestFailed { source }) => {
                Err(KeeperError::TxnRequest { ops: self.ops.len(), source })
            }
        }
    }

    fn failed(&self, index: usize, source: zk::Error) -> KeeperError {
        let (op, path) = self.ops.get(index).map_or(("?", ""), Op::describe);
        KeeperError::Txn { index, op, path: path.to_string(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::batch_ranges;

    #[test]
    fn batches_keep_the_guards_with_the_last_ops_and_every_multi_within_the_bound() {
        assert_eq!(batch_ranges(0, 2, 100), vec![0..0]);
        assert_eq!(batch_ranges(98, 2, 100), vec![0..98], "fits in one multi with its guards");
        assert_eq!(batch_ranges(99, 2, 100), vec![0..1, 1..99]);
        assert_eq!(batch_ranges(250, 3, 100), vec![0..100, 100..153, 153..250]);
        for (ops, last) in [(1000, 3), (5, 0), (333, 99), (10, 150)] {
            let ranges = batch_ranges(ops, last, 100);
            assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), ops, "every op once");
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "in order");
            let (final_range, earlier) = ranges.split_last().expect("a final multi");
            assert!(earlier.iter().all(|r| r.len() <= 100));
            assert!(final_range.len() + last <= 100 || final_range.len() == 1);
        }
    }
}
