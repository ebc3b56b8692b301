//! The state every node keeps in memory: the replicated tree, plus the watches and outgoing
//! queues of the sessions connected to this node. They share one lock so that a watch is
//! registered atomically with the read that sets it, and a session's events and replies leave
//! in the order the tree changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::{LogId, StoredMembership};
use tokio::sync::{watch, Notify};

use crate::proto::records::encode_watch_event;
use crate::raft::{Node, NodeId};
use crate::server::outbox::FrameSender;
use crate::tree::command::{zxid, Command, CommandResult};
use crate::tree::DataTree;
use crate::watch::{Fired, WatchManager};

/// Where a connected session's frames go; `closed` tells its connection to end (session
/// expired or moved to another connection).
pub struct Outbox {
    pub connection_id: u64,
    pub frames: FrameSender,
    pub closed: Arc<Notify>,
}

pub struct StateInner {
    pub tree: DataTree,
    pub watches: WatchManager,
    pub outboxes: HashMap<i64, Outbox>,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, Node>,
}

impl StateInner {
    /// Sends a frame to a session connected here, if it is.
    pub fn send(&self, session_id: i64, frame: Vec<u8>) {
        if let Some(outbox) = self.outboxes.get(&session_id) {
            outbox.frames.send(frame);
        }
    }

    /// Applies the command of the log entry at `index`.
    pub fn apply(&mut self, index: u64, command: &Command) -> CommandResult {
        self.apply_at(zxid::of(index, 0), command)
    }

    fn apply_at(&mut self, zxid: i64, command: &Command) -> CommandResult {
        if let Command::Batch(commands) = command {
            // One by one, so that each command's watch events carry its own zxid and leave
            // before the next command changes the tree.
            return CommandResult::Batch(
                commands.iter().enumerate().map(|(i, c)| self.apply_at(zxid + i as i64, c)).collect(),
            );
        }
        let mut changes = Vec::new();
        let result = self.tree.apply(zxid, command, &mut changes);
        if !changes.is_empty() {
            let mut fired: Vec<Fired> = Vec::new();
            for change in &changes {
                self.watches.fire(change, &mut fired);
            }
            for f in fired {
                self.send(f.session_id, encode_watch_event(zxid, f.event, &f.path));
            }
        }
        if let Command::CloseSession { session_id } = command {
            self.watches.remove_session(*session_id);
            if let Some(outbox) = self.outboxes.remove(session_id) {
                outbox.closed.notify_one();
            }
        }
        result
    }
}

pub struct NodeState {
    inner: Mutex<StateInner>,
    applied: watch::Sender<u64>,
}

impl NodeState {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(StateInner {
                tree: DataTree::new(),
                watches: WatchManager::default(),
                outboxes: HashMap::new(),
                last_applied: None,
                membership: StoredMembership::default(),
            }),
            applied: watch::channel(0).0,
        })
    }

    /// The lock is never held across an await; a panic while holding it leaves the tree in an
    /// unknown state, so it is not recovered from.
    pub fn lock(&self) -> MutexGuard<'_, StateInner> {
        match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn publish_applied(&self, index: u64) {
        self.applied.send_if_modified(|current| {
            let advanced = index > *current;
            if advanced {
                *current = index;
            }
            advanced
        });
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Resolves once this node has applied the log up to `index`.
    pub async fn wait_applied(&self, index: u64) {
        let mut rx = self.applied.subscribe();
        let _ = rx.wait_for(|applied| *applied >= index).await;
    }
}
