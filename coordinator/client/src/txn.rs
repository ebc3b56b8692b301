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

    pub async fn commit(self) -> Result<Vec<TxnResult>, KeeperError> {
        let mut writer = self.keeper.raw().new_multi_writer();
        for (index, op) in self.ops.iter().enumerate() {
            let added = match op {
                Op::Check { path, version } => writer.add_check_version(path, *version),
                Op::Create { path, data, kind } => writer.add_create(path, data, &kind.options()),
                Op::Set { path, data, version } => writer.add_set_data(path, data, *version),
                Op::Delete { path, version } => writer.add_delete(path, *version),
            };
            added.map_err(|source| self.failed(index, source))?;
        }
        match writer.commit().await {
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
