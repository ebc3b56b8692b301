//! Raft through openraft: the type configuration, the on-disk log, the state machine over the
//! tree, and the TCP transport between nodes.

pub mod data_dir;
pub mod log_store;
pub mod network;
pub mod state_machine;
pub mod transport;

use std::io;

use crate::tree::command::{Command, CommandResult};

pub type NodeId = u64;
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Vec<u8>,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;

fn storage_error(
    subject: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    openraft::StorageIOError::new(subject, verb, openraft::AnyError::new(&e)).into()
}

/// Writes a file so that a crash leaves the old or the new contents, never a mix.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
