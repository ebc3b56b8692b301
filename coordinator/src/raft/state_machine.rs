//! The Raft state machine: applies committed commands to the node's tree, and builds and
//! installs snapshots of it. The last snapshot is kept on disk; at startup the tree is the
//! snapshot, and openraft replays the log after it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use super::{storage_error, write_atomically, Entry, LogId, Node, NodeId, StorageError, TypeConfig};
use crate::state::NodeState;
use crate::tree::command::CommandResult;
use crate::tree::DataTree;

const SNAPSHOT_FILE: &str = "snapshot";

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, Node>,
    data: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotData {
    tree: DataTree,
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, Node>,
}

/// What a snapshot's bytes start with since nodes keep null data apart from empty. The first
/// snapshots have no prefix: they start with the node count, a little-endian u64 whose last
/// byte is never 0xff, so the two cannot be taken for each other.
const SNAPSHOT_V2: &[u8; 8] = b"MSsnap\x02\xff";

/// [`SnapshotData`] as the first snapshots encoded it (see [`crate::tree::v1`]).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotDataV1 {
    tree: crate::tree::v1::DataTree,
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, Node>,
}

fn encode_snapshot(data: &SnapshotData) -> bincode::Result<Vec<u8>> {
    let mut bytes = SNAPSHOT_V2.to_vec();
    bincode::serialize_into(&mut bytes, data)?;
    Ok(bytes)
}

/// Reads a snapshot of either encoding: a node upgraded from the first one loads its own
/// snapshot, and accepts one from a leader that has not been upgraded yet.
fn decode_snapshot(bytes: &[u8]) -> bincode::Result<SnapshotData> {
    match bytes.strip_prefix(SNAPSHOT_V2) {
        Some(rest) => bincode::deserialize(rest),
        None => {
            let old: SnapshotDataV1 = bincode::deserialize(bytes)?;
            Ok(SnapshotData { tree: old.tree.into(), last_applied: old.last_applied, membership: old.membership })
        }
    }
}

#[derive(Clone)]
pub struct StateMachine {
    state: Arc<NodeState>,
    dir: PathBuf,
}

fn decode_error(e: bincode::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl StateMachine {
    /// Loads the last snapshot, if any, into `state`.
    pub fn open(dir: &Path, state: Arc<NodeState>) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SNAPSHOT_FILE);
        if path.exists() {
            let file: SnapshotFile = bincode::deserialize(&std::fs::read(&path)?).map_err(decode_error)?;
            let data = decode_snapshot(&file.data).map_err(decode_error)?;
            let mut inner = state.lock();
            tracing::info!(last_applied = ?data.last_applied, znodes = data.tree.node_count(), "snapshot loaded");
            inner.tree = data.tree;
            inner.last_applied = data.last_applied;
            inner.membership = data.membership;
            drop(inner);
            state.publish_applied(data.last_applied.map_or(0, |l| l.index));
        }
        Ok(Self { state, dir: dir.to_path_buf() })
    }

    fn read_snapshot_file(&self) -> io::Result<Option<SnapshotFile>> {
        let path = self.dir.join(SNAPSHOT_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some(bincode::deserialize(&std::fs::read(&path)?).map_err(decode_error)?))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let subject = || ErrorSubject::Snapshot(None);
        let (data, meta) = {
            let inner = self.state.lock();
            let data = SnapshotData {
                tree: inner.tree.clone(),
                last_applied: inner.last_applied,
                membership: inner.membership.clone(),
            };
            let snapshot_id = format!(
                "{}-{}",
                inner.last_applied.map_or(0, |l| l.leader_id.term),
                inner.last_applied.map_or(0, |l| l.index)
            );
            let meta = SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
                snapshot_id,
            };
            (data, meta)
        };
        // Serialized outside the lock: the tree was cloned so that requests go on meanwhile.
        let bytes = encode_snapshot(&data).map_err(|e| storage_error(subject(), ErrorVerb::Write, e))?;
        let file = SnapshotFile { meta: meta.clone(), data: bytes.clone() };
        let encoded = bincode::serialize(&file).map_err(|e| storage_error(subject(), ErrorVerb::Write, e))?;
        let path = self.dir.join(SNAPSHOT_FILE);
        tokio::task::block_in_place(|| write_atomically(&path, &encoded))
            .map_err(|e| storage_error(subject(), ErrorVerb::Write, e))?;
        tracing::info!(snapshot = %meta.snapshot_id, bytes = encoded.len(), "snapshot written");
        Ok(Snapshot { meta, snapshot: Box::new(bytes) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership<NodeId, Node>), StorageError> {
        let inner = self.state.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut results = Vec::new();
        let mut last = None;
        {
            let mut inner = self.state.lock();
            for entry in entries {
                inner.last_applied = Some(entry.log_id);
                last = Some(entry.log_id.index);
                results.push(match entry.payload {
                    EntryPayload::Blank => CommandResult::Applied(Vec::new()),
                    EntryPayload::Normal(command) => inner.apply(entry.log_id.index, &command),
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m);
                        CommandResult::Applied(Vec::new())
                    }
                });
            }
        }
        if let Some(index) = last {
            self.state.publish_applied(index);
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Vec<u8>>, StorageError> {
        Ok(Box::new(Vec::new()))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Vec<u8>>,
    ) -> Result<(), StorageError> {
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        let data = decode_snapshot(&snapshot).map_err(|e| storage_error(subject(), ErrorVerb::Read, e))?;
        let file = SnapshotFile { meta: meta.clone(), data: *snapshot };
        let encoded = bincode::serialize(&file).map_err(|e| storage_error(subject(), ErrorVerb::Write, e))?;
        let path = self.dir.join(SNAPSHOT_FILE);
        tokio::task::block_in_place(|| write_atomically(&path, &encoded))
            .map_err(|e| storage_error(subject(), ErrorVerb::Write, e))?;
        {
            let mut inner = self.state.lock();
            inner.tree = data.tree;
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
        }
        tracing::info!(snapshot = %meta.snapshot_id, "snapshot installed from the leader");
        self.state.publish_applied(meta.last_log_id.map_or(0, |l| l.index));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let file =
            self.read_snapshot_file().map_err(|e| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?;
        Ok(file.map(|f| Snapshot { meta: f.meta, snapshot: Box::new(f.data) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::command::{Command, TreeOp};

    fn tree_with_null_data() -> DataTree {
        let mut tree = DataTree::new();
        let acl = vec![crate::proto::records::Acl { perms: 31, scheme: "world".into(), id: "anyone".into() }];
        let ops = vec![
            TreeOp::Create { path: "/null".into(), data: None, acl: acl.clone(), flags: 0 },
            TreeOp::Create { path: "/empty".into(), data: Some(Vec::new()), acl, flags: 0 },
        ];
        tree.apply(1, &Command::Ops { session_id: 0, time_ms: 5, multi: true, ops }, &mut Vec::new());
        tree
    }

    #[test]
    fn snapshots_of_both_encodings_decode() {
        let tree = tree_with_null_data();
        let data = SnapshotData { tree: tree.clone(), last_applied: None, membership: StoredMembership::default() };
        let decoded = decode_snapshot(&encode_snapshot(&data).expect("encode")).expect("decode");
        assert_eq!(decoded.tree.dump(), tree.dump());
        assert_eq!(decoded.tree.node("/null").map(|n| n.data.is_none()), Some(true));

        let old = SnapshotDataV1 {
            tree: crate::tree::v1::DataTree::from_current(&tree),
            last_applied: None,
            membership: StoredMembership::default(),
        };
        let bytes = bincode::serialize(&old).expect("encode");
        assert_ne!(bytes[7], 0xff, "the node count's last byte, where the new encoding's marker ends");
        let decoded = decode_snapshot(&bytes).expect("decode the first encoding");
        assert_eq!(decoded.tree.node("/empty").map(|n| n.data.clone()), Some(Some(Vec::new())));
        assert_eq!(decoded.tree.node_count(), tree.node_count());
    }
}
