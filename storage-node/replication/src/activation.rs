//! Which server holds a replica now: its ephemeral `is_active` node.
//!
//! The node holds the identity of the server that created it (the `uuid` file of its data
//! directory, as ClickHouse's `is_active` holds its server UUID). A server that restarts
//! before its old session expired finds its own identity there and replaces the node; a
//! different server started with the same replica name finds a node it does not own and
//! stays inactive and read-only (REPLICA_IS_ALREADY_ACTIVE) instead of the two taking the
//! replica from each other at every session.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

use coordinator_client::{Keeper, NodeKind};
use mergestream_engine::{EngineError, Result};
use tracing::info;

use crate::control::coordinator_error;
use crate::layout::ReplicaPaths;

/// The file in the storage node's data directory that names the server.
pub const IDENTITY_FILE: &str = "uuid";

/// This server's identity: read from `<data dir>/uuid`, or made and written there (synced)
/// on the first start.
pub fn server_identity(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(EngineError::Io { path, source: e }),
    }
    std::fs::create_dir_all(data_dir).map_err(EngineError::io(data_dir))?;
    let identity = uuid::Uuid::new_v4().to_string();
    mergestream_engine::part::write_synced(&path, identity.as_bytes())?;
    Ok(identity)
}

/// One replicated table's claim on its replica, shared by its committer (an insert needs
/// the replica active) and its queue.
pub struct Activation {
    paths: ReplicaPaths,
    identity: String,
    /// What the replica's `host` node says (where the others fetch from); set on activation.
    host: String,
    /// The coordinator session that holds `is_active` (0: none yet).
    session: AtomicI64,
}

impl Activation {
    pub fn new(paths: ReplicaPaths, identity: String, host: String) -> Activation {
        Activation { paths, identity, host, session: AtomicI64::new(0) }
    }

    /// Makes `is_active` this session's if it is not yet (and the `host` node current, in
    /// the same multi); REPLICA_IS_ALREADY_ACTIVE when another server holds it.
    pub async fn ensure(&self, k: &Keeper) -> Result<()> {
        let session = k.session_id();
        if self.session.load(Ordering::SeqCst) == session {
            return Ok(());
        }
        let path = self.paths.of_replica("is_active");
        // A few rounds: a node of this server's old session is deleted, then made again;
        // two first inserts of one session may race to make it.
        for _ in 0..3 {
            match k.get(&path).await.map_err(coordinator_error)? {
                Some(node) if node.stat.ephemeral_owner == session => {
                    return self.activated(session);
                }
                Some(node) if node.data == self.identity.as_bytes() => {
                    match k.delete(&path, Some(node.version)).await {
                        Ok(()) => {}
                        Err(e) if e.is_no_node() || e.is_bad_version() => {}
                        Err(e) => return Err(coordinator_error(e)),
                    }
                }
                Some(_) => return Err(self.already_active()),
                None => {}
            }
            let made = k
                .txn()
                .create(&path, self.identity.as_bytes(), NodeKind::Ephemeral)
                .set(&self.paths.of_replica("host"), self.host.as_bytes(), None)
                .commit()
                .await;
            match made {
                Ok(_) => return self.activated(session),
                Err(e) if e.is_node_exists() => continue,
                Err(e) => return Err(coordinator_error(e)),
            }
        }
        Err(self.already_active())
    }

    /// What the replica's `host` node says.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether `is_active` is known to be this session's (no coordinator call).
    pub fn holds(&self, session: i64) -> bool {
        self.session.load(Ordering::SeqCst) == session
    }

    /// Forgets the claim, so that the next [`ensure`](Self::ensure) checks the node again.
    pub fn forget(&self) {
        self.session.store(0, Ordering::SeqCst);
    }

    fn activated(&self, session: i64) -> Result<()> {
        // The committer and the queue may both have asked: said once.
        if self.session.swap(session, Ordering::SeqCst) != session {
            info!(table = self.paths.table, replica = self.paths.replica, session, "the replica is active");
        }
        Ok(())
    }

    fn already_active(&self) -> EngineError {
        let replica = self.paths.replica_root();
        EngineError::Replication {
            code: "REPLICA_IS_ALREADY_ACTIVE",
            message: format!(
                "Replica {replica} appears to be already active. If you're sure it's not, try again in a minute \
                 or remove znode {replica}/is_active manually"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = server_identity(dir.path()).expect("made");
        assert_eq!(server_identity(dir.path()).expect("read"), first);
        assert_eq!(std::fs::read_to_string(dir.path().join(IDENTITY_FILE)).expect("file"), first);
        let other = tempfile::tempdir().expect("tempdir");
        assert_ne!(server_identity(other.path()).expect("made"), first, "each data directory is its own server");
    }
}
