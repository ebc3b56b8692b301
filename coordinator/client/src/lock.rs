use zookeeper_client as zk;

use crate::{Keeper, KeeperError, NodeKind};

/// Who holds a lock: the session that created its ephemeral node and what it wrote there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    pub session_id: i64,
    pub owner: Vec<u8>,
}

/// Ownership of something (a Kafka partition, a merge) for as long as a session lives: an
/// ephemeral node at a fixed path, as ClickHouse's Keeper-based Kafka engine locks partitions.
/// When the holder's session ends — closed, or expired after its process died — the coordinator
/// deletes the node and another session can take the lock. The lock alone does not fence a
/// zombie that has not noticed its session expired; writes that matter must also be guarded by
/// a version check in the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralLock {
    path: String,
    session_id: i64,
}

impl EphemeralLock {
    /// Takes the lock at `path` for this session, writing `owner` into it, or returns `None` if
    /// another session holds it. Taking a lock this session already holds succeeds (a process
    /// that reconnected with its session keeps its locks). Missing parents are created.
    pub async fn try_acquire(keeper: &Keeper, path: &str, owner: &[u8]) -> Result<Option<Self>, KeeperError> {
        if let Some((parent, _)) = path.rsplit_once('/').filter(|(parent, _)| !parent.is_empty()) {
            keeper.ensure_path(parent).await?;
        }
        let mine = EphemeralLock { path: path.to_string(), session_id: keeper.session_id() };
        match keeper.create(path, owner, NodeKind::Ephemeral).await {
            Ok(_) => Ok(Some(mine)),
            Err(e) if e.is_node_exists() => match Self::holder(keeper, path).await? {
                Some(holder) if holder.session_id == mine.session_id => Ok(Some(mine)),
                // Held by another session, or released between the create and the read: the
                // caller tries again on its next round rather than racing here.
                _ => Ok(None),
            },
            Err(e) => Err(e),
        }
    }

    /// The current holder of the lock at `path`, if any.
    pub async fn holder(keeper: &Keeper, path: &str) -> Result<Option<LockHolder>, KeeperError> {
        Ok(keeper.get(path).await?.map(|v| LockHolder { session_id: v.stat.ephemeral_owner, owner: v.data }))
    }

    /// Waits until nobody holds the lock at `path` (returns at once if nobody does).
    pub async fn wait_released(keeper: &Keeper, path: &str) -> Result<(), KeeperError> {
        loop {
            let (stat, watcher) =
                keeper.raw().check_and_watch_stat(path).await.map_err(KeeperError::op("watch", path))?;
            if stat.is_none() {
                return Ok(());
            }
            let event = crate::watch::changed(watcher, path).await;
            if event.event_type == zk::EventType::Session {
                return Err(KeeperError::Op { op: "watch", path: path.to_string(), source: zk::Error::SessionExpired });
            }
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Gives the lock up, unless the session already lost it (then there is nothing to do).
    pub async fn release(self, keeper: &Keeper) -> Result<(), KeeperError> {
        match Self::holder(keeper, &self.path).await? {
            Some(holder) if holder.session_id == self.session_id => match keeper.delete(&self.path, None).await {
                Err(e) if e.is_no_node() => Ok(()),
                other => other,
            },
            _ => Ok(()),
        }
    }
}
