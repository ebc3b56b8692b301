use zookeeper_client as zk;

/// Everything a coordinator call can fail with, naming the operation and the path.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("connecting to the coordinator at {hosts}: {source}")]
    Connect { hosts: String, source: zk::Error },
    #[error("{op} {path}: {source}")]
    Op { op: &'static str, path: String, source: zk::Error },
    #[error("transaction failed at operation {index} ({op} {path}): {source}")]
    Txn { index: usize, op: &'static str, path: String, source: zk::Error },
    #[error("transaction of {ops} operations: {source}")]
    TxnRequest { ops: usize, source: zk::Error },
    #[error("{path}: child {name:?} does not end in a sequence number")]
    BadSequence { path: String, name: String },
    #[error("coordinator TLS: {path}: {reason}")]
    Tls { path: std::path::PathBuf, reason: String },
}

impl KeeperError {
    pub(crate) fn op<'p>(op: &'static str, path: &'p str) -> impl FnOnce(zk::Error) -> KeeperError + 'p {
        move |source| KeeperError::Op { op, path: path.to_string(), source }
    }

    /// The ZooKeeper error code behind this error, if the server answered with one.
    pub fn code(&self) -> Option<&zk::Error> {
        match self {
            KeeperError::Connect { source, .. }
            | KeeperError::Op { source, .. }
            | KeeperError::Txn { source, .. }
            | KeeperError::TxnRequest { source, .. } => Some(source),
            KeeperError::BadSequence { .. } | KeeperError::Tls { .. } => None,
        }
    }

    /// A version check failed: someone else changed the node first.
    pub fn is_bad_version(&self) -> bool {
        matches!(self.code(), Some(zk::Error::BadVersion))
    }

    pub fn is_node_exists(&self) -> bool {
        matches!(self.code(), Some(zk::Error::NodeExists))
    }

    pub fn is_no_node(&self) -> bool {
        matches!(self.code(), Some(zk::Error::NoNode))
    }

    /// The outcome is unknown (the connection broke while the request was in flight): the write
    /// may or may not have been applied, and the caller must read back before retrying.
    pub fn is_connection_loss(&self) -> bool {
        matches!(self.code(), Some(zk::Error::ConnectionLoss))
    }

    /// The session is gone (expired or closed): a new one must be made.
    pub fn is_session_lost(&self) -> bool {
        matches!(self.code(), Some(zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed))
    }
}
