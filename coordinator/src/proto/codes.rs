//! The numbers of the ZooKeeper protocol: operation codes, error codes, create modes, watch
//! event types and the special xids, as `ZooDefs` and `KeeperException.Code` define them.

use serde::{Deserialize, Serialize};

pub mod op {
    pub const NOTIFICATION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const RECONFIG: i32 = 16;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const CLOSE_SESSION: i32 = -11;
    /// The type of a multi result entry that carries an error code.
    pub const ERROR: i32 = -1;

    pub fn name(code: i32) -> &'static str {
        match code {
            CREATE => "create",
            DELETE => "delete",
            EXISTS => "exists",
            GET_DATA => "getData",
            SET_DATA => "setData",
            GET_ACL => "getACL",
            SET_ACL => "setACL",
            GET_CHILDREN => "getChildren",
            SYNC => "sync",
            PING => "ping",
            GET_CHILDREN2 => "getChildren2",
            CHECK => "check",
            MULTI => "multi",
            CREATE2 => "create2",
            RECONFIG => "reconfig",
            CHECK_WATCHES => "checkWatches",
            REMOVE_WATCHES => "removeWatches",
            GET_ALL_CHILDREN_NUMBER => "getAllChildrenNumber",
            AUTH => "auth",
            SET_WATCHES => "setWatches",
            GET_EPHEMERALS => "getEphemerals",
            SET_WATCHES2 => "setWatches2",
            ADD_WATCH => "addWatch",
            CLOSE_SESSION => "closeSession",
            _ => "unknown",
        }
    }
}

pub mod xid {
    pub const NOTIFICATION: i32 = -1;
    pub const PING: i32 = -2;
    pub const AUTH: i32 = -4;
    pub const SET_WATCHES: i32 = -8;
}

/// `KeeperException.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(i32)]
pub enum ErrorCode {
    Ok = 0,
    SystemError = -1,
    RuntimeInconsistency = -2,
    MarshallingError = -5,
    Unimplemented = -6,
    OperationTimeout = -7,
    BadArguments = -8,
    ApiError = -100,
    NoNode = -101,
    NoAuth = -102,
    BadVersion = -103,
    NoChildrenForEphemerals = -108,
    NodeExists = -110,
    NotEmpty = -111,
    SessionExpired = -112,
    InvalidAcl = -114,
    SessionMoved = -118,
    NoWatcher = -121,
    // Added after the others: serialized results name variants by position.
    AuthFailed = -115,
    NotReadOnly = -119,
    NewConfigNoQuorum = -13,
    ReconfigInProgress = -14,
}

impl ErrorCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// The flags of a create request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CreateMode {
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
}

impl CreateMode {
    /// Containers (4) and TTL nodes (5, 6) are not supported: ZooKeeper 3.8 itself refuses TTL
    /// nodes unless extended types are enabled.
    pub fn from_flags(flags: i32) -> Option<Self> {
        match flags {
            0 => Some(Self::Persistent),
            1 => Some(Self::Ephemeral),
            2 => Some(Self::PersistentSequential),
            3 => Some(Self::EphemeralSequential),
            _ => None,
        }
    }

    pub fn is_ephemeral(self) -> bool {
        matches!(self, Self::Ephemeral | Self::EphemeralSequential)
    }

    pub fn is_sequential(self) -> bool {
        matches!(self, Self::PersistentSequential | Self::EphemeralSequential)
    }
}

/// `Watcher.Event.EventType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(i32)]
pub enum EventType {
    NodeCreated = 1,
    NodeDeleted = 2,
    NodeDataChanged = 3,
    NodeChildrenChanged = 4,
}

/// `Watcher.Event.KeeperState.SyncConnected`, the state of every event a live session receives.
pub const STATE_SYNC_CONNECTED: i32 = 3;

/// `AddWatchMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddWatchMode {
    Persistent,
    PersistentRecursive,
}

impl AddWatchMode {
    pub fn from_code(mode: i32) -> Option<Self> {
        match mode {
            0 => Some(Self::Persistent),
            1 => Some(Self::PersistentRecursive),
            _ => None,
        }
    }
}
