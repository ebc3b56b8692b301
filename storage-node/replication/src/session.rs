//! The storage node's coordinator session: made on first use, made again after it is lost.

use std::time::Duration;

use coordinator_client::{Keeper, KeeperAccess, KeeperError, TxnResult};
use mergestream_engine::commit::{BoxFuture, Coordination, ExtraOp, Refusal};
use mergestream_engine::EngineError;
use tokio::sync::Mutex;

pub struct CoordinatorSession {
    hosts: String,
    session_timeout: Duration,
    access: KeeperAccess,
    keeper: Mutex<Option<Keeper>>,
}

impl CoordinatorSession {
    pub fn new(hosts: String, session_timeout: Duration, access: KeeperAccess) -> CoordinatorSession {
        CoordinatorSession { hosts, session_timeout, access, keeper: Mutex::new(None) }
    }

    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The session, connecting first if there is none.
    pub async fn keeper(&self) -> Result<Keeper, KeeperError> {
        let mut slot = self.keeper.lock().await;
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let k = Keeper::connect_with(&self.hosts, self.session_timeout, &self.access).await?;
        *slot = Some(k.clone());
        Ok(k)
    }

    /// Drops the session after an error that says it is gone, so the next call makes a new one.
    pub async fn forget_if_lost(&self, e: &KeeperError) {
        if e.is_session_lost() || matches!(e, KeeperError::Connect { .. }) {
            *self.keeper.lock().await = None;
        }
    }
}

/// The coordinator did not answer (the connection or the session broke): a write may or may
/// not have been applied, and only reading back tells. A failed connect is counted too: for
/// a read, trying again is right.
pub fn is_outcome_unknown(e: &KeeperError) -> bool {
    e.is_connection_loss() || e.is_session_lost() || matches!(e, KeeperError::Connect { .. })
}

/// A failed `multi` as the engine's commit error: refused (nothing applied), unknown, or failed.
pub fn commit_error(e: KeeperError) -> EngineError {
    let refusal = if e.is_bad_version() {
        Some(Refusal::BadVersion)
    } else if e.is_no_node() {
        Some(Refusal::NoNode)
    } else if e.is_node_exists() {
        Some(Refusal::NodeExists)
    } else {
        None
    };
    match (refusal, &e) {
        (Some(refusal), KeeperError::Txn { path, .. }) => EngineError::CommitRefused { path: path.clone(), refusal },
        _ if is_outcome_unknown(&e) => EngineError::CommitOutcomeUnknown(e.to_string()),
        _ => EngineError::Coordinator(e.to_string()),
    }
}

/// Appends the extra ops of an insert to a transaction.
pub fn add_extra_ops<'a>(mut txn: coordinator_client::Txn<'a>, ops: &[ExtraOp]) -> coordinator_client::Txn<'a> {
    for op in ops {
        txn = match op {
            ExtraOp::SetData { path, data, expected_version } => txn.set(path, data, Some(*expected_version)),
        };
    }
    txn
}

/// The new versions of the nodes the extra ops set, in order.
pub fn extra_op_versions(results: &[TxnResult]) -> Vec<i32> {
    results
        .iter()
        .filter_map(|r| match r {
            TxnResult::Set { version } => Some(*version),
            _ => None,
        })
        .collect()
}

impl Coordination for CoordinatorSession {
    fn apply<'a>(&'a self, ops: &'a [ExtraOp]) -> BoxFuture<'a, Result<Vec<i32>, EngineError>> {
        Box::pin(async move {
            let k = match self.keeper().await {
                Ok(k) => k,
                // Nothing was sent: nothing was applied.
                Err(e) => return Err(EngineError::Coordinator(e.to_string())),
            };
            match add_extra_ops(k.txn(), ops).commit().await {
                Ok(results) => Ok(extra_op_versions(&results)),
                Err(e) => {
                    self.forget_if_lost(&e).await;
                    Err(commit_error(e))
                }
            }
        })
    }
}
