use std::time::Duration;

use zookeeper_client as zk;

use crate::{KeeperAccess, KeeperError, Txn};

/// What kind of znode to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Persistent,
    PersistentSequential,
    /// Removed when the session that created it ends.
    Ephemeral,
    EphemeralSequential,
}

impl NodeKind {
    pub(crate) fn options(self, acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
        let mode = match self {
            NodeKind::Persistent => zk::CreateMode::Persistent,
            NodeKind::PersistentSequential => zk::CreateMode::PersistentSequential,
            NodeKind::Ephemeral => zk::CreateMode::Ephemeral,
            NodeKind::EphemeralSequential => zk::CreateMode::EphemeralSequential,
        };
        mode.with_acls(acls)
    }
}

/// A node's data with the version a compare-and-set must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub data: Vec<u8>,
    pub version: i32,
    pub stat: zk::Stat,
}

/// One session with the coordinator. Clones share the session; requests are sent in the order
/// the methods are called.
#[derive(Clone, Debug)]
pub struct Keeper {
    client: zk::Client,
    /// How long a request may go unanswered before it fails as a connection loss.
    request_timeout: Duration,
    /// The ACL of the nodes it creates.
    acls: zk::Acls<'static>,
}

/// zookeeper-client 0.11 can leave a request unanswered when the watches of a path churn
/// (seen as a replication queue stalled for a minute): each request is bounded, and one
/// that passes the bound fails as a lost connection, whose outcome callers already settle.
fn request_timeout(session_timeout: Duration) -> Duration {
    (session_timeout * 2).max(Duration::from_secs(10))
}

impl Keeper {
    /// Connects to any of `hosts` (`host:port,host:port`), moving to another one on failure
    /// while the session lasts.
    pub async fn connect(hosts: &str, session_timeout: Duration) -> Result<Self, KeeperError> {
        Self::connect_with(hosts, session_timeout, &KeeperAccess::default()).await
    }

    /// [`Keeper::connect`] through TLS and with an identity, as `access` says.
    pub async fn connect_with(
        hosts: &str,
        session_timeout: Duration,
        access: &KeeperAccess,
    ) -> Result<Self, KeeperError> {
        let connector = access.connector()?.with_session_timeout(session_timeout);
        let connecting = match access.tls {
            Some(_) => connector.secure_connect(hosts).await,
            None => connector.connect(hosts).await,
        };
        let client = connecting.map_err(|source| KeeperError::Connect { hosts: hosts.to_string(), source })?;
        let acls = match access.identity {
            Some(_) => zk::Acls::creator_all(),
            None => zk::Acls::anyone_all(),
        };
        Ok(Keeper { client, request_timeout: request_timeout(session_timeout), acls })
    }

    pub(crate) fn create_options(&self, kind: NodeKind) -> zk::CreateOptions<'static> {
        kind.options(self.acls)
    }

    /// `request`, or a connection loss of `op` on `path` once the request timeout passes.
    pub(crate) async fn bounded<T>(
        &self,
        op: &'static str,
        path: &str,
        request: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, KeeperError> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(result) => result.map_err(KeeperError::op(op, path)),
            Err(_) => {
                tracing::warn!(op, path, timeout = ?self.request_timeout, "a coordinator request went unanswered");
                Err(KeeperError::Op { op, path: path.to_string(), source: zk::Error::ConnectionLoss })
            }
        }
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn raw(&self) -> &zk::Client {
        &self.client
    }

    pub fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Creates `path` and its missing ancestors as empty persistent nodes; present ones are fine.
    pub async fn ensure_path(&self, path: &str) -> Result<(), KeeperError> {
        self.bounded("mkdir", path, self.client.mkdir(path, &self.create_options(NodeKind::Persistent))).await
    }

    /// Creates a node and returns its path (with the sequence suffix for sequential kinds).
    pub async fn create(&self, path: &str, data: &[u8], kind: NodeKind) -> Result<String, KeeperError> {
        let (_, sequence) =
            self.bounded("create", path, self.client.create(path, data, &self.create_options(kind))).await?;
        Ok(match kind {
            NodeKind::PersistentSequential | NodeKind::EphemeralSequential => format!("{path}{sequence}"),
            NodeKind::Persistent | NodeKind::Ephemeral => path.to_string(),
        })
    }

    /// The node's data and version, or `None` if there is no such node.
    pub async fn get(&self, path: &str) -> Result<Option<Versioned>, KeeperError> {
        match self.bounded("get", path, self.client.get_data(path)).await {
            Ok((data, stat)) => Ok(Some(Versioned { data, version: stat.version, stat })),
            Err(e) if e.is_no_node() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn get_owned(&self, path: String) -> Result<Option<Versioned>, KeeperError> {
        self.get(&path).await
    }

    /// Compare-and-set: writes only if the node is still at `expected_version` (any version
    /// with `None`), and returns the new version.
    pub async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, KeeperError> {
        let stat = self.bounded("set", path, self.client.set_data(path, data, expected_version)).await?;
        Ok(stat.version)
    }

    pub async fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<(), KeeperError> {
        self.bounded("delete", path, self.client.delete(path, expected_version)).await
    }

    pub async fn children(&self, path: &str) -> Result<Vec<String>, KeeperError> {
        self.bounded("list", path, self.client.list_children(path)).await
    }

    /// Waits until this session's server has applied every write acknowledged to anyone before
    /// the call: the next read is linearizable.
    pub async fn sync(&self, path: &str) -> Result<(), KeeperError> {
        self.bounded("sync", path, self.client.sync(path)).await
    }

    /// Waits for the next creation, deletion or data change of `path` (it need not exist yet).
    /// `current` is what the node was when the watch was set, so no change is missed between
    /// a read and the wait.
    pub async fn wait_for_change(&self, path: &str) -> Result<(Option<zk::Stat>, zk::WatchedEvent), KeeperError> {
        let (stat, watcher) = self.client.check_and_watch_stat(path).await.map_err(KeeperError::op("watch", path))?;
        Ok((stat, crate::watch::changed(watcher, path).await))
    }

    /// Starts an all-or-nothing transaction.
    pub fn txn(&self) -> Txn<'_> {
        Txn::new(self)
    }
}
