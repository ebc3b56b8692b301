//! What goes through Raft: every change to the tree and every session create and close, with the
//! time the proposer read from its clock so that every node computes the same ctime/mtime.

use serde::{Deserialize, Serialize};

use crate::proto::codes::ErrorCode;
use crate::proto::records::{Acl, Stat};

/// One operation on the tree; a multi request is a list of them applied all or nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TreeOp {
    Create { path: String, data: Vec<u8>, acl: Vec<Acl>, flags: i32 },
    Delete { path: String, version: i32 },
    SetData { path: String, data: Vec<u8>, version: i32 },
    SetAcl { path: String, acl: Vec<Acl>, version: i32 },
    Check { path: String, version: i32 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    CreateSession {
        session_id: i64,
        timeout_ms: i32,
        password: Vec<u8>,
    },
    /// An explicit close or an expiry decided by the leader; removes the session's ephemerals.
    CloseSession {
        session_id: i64,
    },
    /// One request (`multi == false`, exactly one op) or a multi request.
    Ops {
        session_id: i64,
        time_ms: i64,
        multi: bool,
        ops: Vec<TreeOp>,
    },
    /// The commands of many requests, from any sessions, committed as one log entry: one
    /// append and one fsync carry them all. Applied in order, command `i` at zxid `base + i`.
    Batch(Vec<Command>),
}

/// Zxids number every applied command: a log entry at Raft index `i` owns the zxids
/// `i << BATCH_BITS ..`, one per command of its batch, so zxids grow with the log, differ
/// between the commands of a batch, and give back the entry's index.
pub mod zxid {
    pub const BATCH_BITS: u32 = 12;
    /// The most commands one log entry may carry.
    pub const MAX_BATCH: usize = 1 << BATCH_BITS;

    pub fn of(index: u64, position: usize) -> i64 {
        ((index << BATCH_BITS) | position as u64) as i64
    }

    /// The Raft index of the entry that holds `zxid`.
    pub fn index(zxid: i64) -> u64 {
        zxid.max(0) as u64 >> BATCH_BITS
    }
}

/// The result of one successful operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OpResult {
    Created { path: String, stat: Stat },
    Deleted,
    SetData { stat: Stat },
    SetAcl { stat: Stat },
    Checked,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    SessionCreated,
    SessionClosed,
    /// Every operation succeeded.
    Applied(Vec<OpResult>),
    /// A single request failed with this code.
    Failed(ErrorCode),
    /// A multi request failed: one code per operation, ZooKeeper style (Ok before the failing
    /// operation, its code, RuntimeInconsistency after it).
    MultiFailed(Vec<ErrorCode>),
    /// One result per command of a [`Command::Batch`].
    Batch(Vec<CommandResult>),
}

/// A change to the tree that watches may be waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(String),
    Deleted(String),
    DataChanged(String),
}
