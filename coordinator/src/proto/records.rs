//! The records of the client protocol: what a client sends (decoded into [`Request`]) and the
//! pieces servers write back.

use serde::{Deserialize, Serialize};

use super::codes::{op, AddWatchMode};
use super::jute::{JuteReader, JuteWriter};
use super::ProtoError;

/// `org.apache.zookeeper.data.Stat`, in wire order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

impl Stat {
    pub fn write(&self, w: &mut JuteWriter) {
        w.i64(self.czxid).i64(self.mzxid).i64(self.ctime).i64(self.mtime);
        w.i32(self.version).i32(self.cversion).i32(self.aversion);
        w.i64(self.ephemeral_owner).i32(self.data_length).i32(self.num_children).i64(self.pzxid);
    }
}

/// An ACL entry: permissions and an id (`scheme:id`); see [`crate::acl`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    pub perms: i32,
    pub scheme: String,
    pub id: String,
}

impl Acl {
    fn read(r: &mut JuteReader) -> Result<Self, ProtoError> {
        Ok(Self { perms: r.i32()?, scheme: r.string()?, id: r.string()? })
    }

    pub fn write_all(acls: &[Acl], w: &mut JuteWriter) {
        w.i32(acls.len() as i32);
        for a in acls {
            w.i32(a.perms).string(&a.scheme).string(&a.id);
        }
    }
}

/// The first frame of a connection.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    pub protocol_version: i32,
    pub last_zxid_seen: i64,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub password: Vec<u8>,
    /// Absent in clients older than 3.4; echoed in the response when present.
    pub read_only: Option<bool>,
}

impl ConnectRequest {
    pub fn decode(payload: &[u8]) -> Result<Self, ProtoError> {
        let mut r = JuteReader::new(payload);
        let protocol_version = r.i32()?;
        let last_zxid_seen = r.i64()?;
        let timeout_ms = r.i32()?;
        let session_id = r.i64()?;
        let password = r.buffer()?;
        let read_only = if r.remaining() > 0 { Some(r.bool()?) } else { None };
        Ok(Self { protocol_version, last_zxid_seen, timeout_ms, session_id, password, read_only })
    }
}

pub fn encode_connect_response(timeout_ms: i32, session_id: i64, password: &[u8], read_only: Option<bool>) -> Vec<u8> {
    let mut w = JuteWriter::new();
    w.i32(0).i32(timeout_ms).i64(session_id).buffer(password);
    if let Some(ro) = read_only {
        w.bool(ro);
    }
    w.finish()
}

/// The watches a reconnecting client re-registers (setWatches and setWatches2).
#[derive(Debug, Clone, Default)]
pub struct WatchSet {
    pub relative_zxid: i64,
    pub data: Vec<String>,
    pub exist: Vec<String>,
    pub child: Vec<String>,
    pub persistent: Vec<String>,
    pub persistent_recursive: Vec<String>,
}

/// One operation of a multi request.
#[derive(Debug, Clone)]
pub enum MultiOp {
    Create { path: String, data: Option<Vec<u8>>, acl: Vec<Acl>, flags: i32, with_stat: bool },
    Delete { path: String, version: i32 },
    SetData { path: String, data: Option<Vec<u8>>, version: i32 },
    Check { path: String, version: i32 },
}

impl MultiOp {
    pub fn op_code(&self) -> i32 {
        match self {
            Self::Create { with_stat: false, .. } => op::CREATE,
            Self::Create { with_stat: true, .. } => op::CREATE2,
            Self::Delete { .. } => op::DELETE,
            Self::SetData { .. } => op::SET_DATA,
            Self::Check { .. } => op::CHECK,
        }
    }
}

/// A client request after its header.
#[derive(Debug, Clone)]
pub enum Request {
    Create {
        path: String,
        data: Option<Vec<u8>>,
        acl: Vec<Acl>,
        flags: i32,
        with_stat: bool,
    },
    Delete {
        path: String,
        version: i32,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    SetData {
        path: String,
        data: Option<Vec<u8>>,
        version: i32,
    },
    GetAcl {
        path: String,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    GetChildren {
        path: String,
        watch: bool,
        with_stat: bool,
    },
    GetAllChildrenNumber {
        path: String,
    },
    GetEphemerals {
        prefix: String,
    },
    Sync {
        path: String,
    },
    Ping,
    Multi(Vec<MultiOp>),
    CloseSession,
    SetWatches(WatchSet),
    AddWatch {
        path: String,
        mode: AddWatchMode,
    },
    /// checkWatches and removeWatches: `watcher_type` 1 child, 2 data, 3 any.
    RemoveWatches {
        path: String,
        watcher_type: i32,
        check_only: bool,
    },
    /// `addauth scheme credentials` (AuthPacket).
    Auth {
        scheme: String,
        credentials: Vec<u8>,
    },
    /// Dynamic reconfiguration of the ensemble.
    Reconfig(crate::reconfig::ReconfigRequest),
    /// An operation code this server does not implement.
    Unsupported(i32),
}

impl Request {
    pub fn decode(op_code: i32, r: &mut JuteReader) -> Result<Self, ProtoError> {
        Ok(match op_code {
            op::CREATE | op::CREATE2 => {
                let path = r.string()?;
                let data = r.optional_buffer()?;
                let acl = r.vec(Acl::read)?;
                let flags = r.i32()?;
                Self::Create { path, data, acl, flags, with_stat: op_code == op::CREATE2 }
            }
            op::DELETE => Self::Delete { path: r.string()?, version: r.i32()? },
            op::EXISTS => Self::Exists { path: r.string()?, watch: r.bool()? },
            op::GET_DATA => Self::GetData { path: r.string()?, watch: r.bool()? },
            op::SET_DATA => Self::SetData { path: r.string()?, data: r.optional_buffer()?, version: r.i32()? },
            op::GET_ACL => Self::GetAcl { path: r.string()? },
            op::SET_ACL => Self::SetAcl { path: r.string()?, acl: r.vec(Acl::read)?, version: r.i32()? },
            op::GET_CHILDREN | op::GET_CHILDREN2 => {
                Self::GetChildren { path: r.string()?, watch: r.bool()?, with_stat: op_code == op::GET_CHILDREN2 }
            }
            op::GET_ALL_CHILDREN_NUMBER => Self::GetAllChildrenNumber { path: r.string()? },
            op::GET_EPHEMERALS => Self::GetEphemerals { prefix: r.string()? },
            op::SYNC => Self::Sync { path: r.string()? },
            op::RECONFIG => {
                let mut text = || -> Result<Option<String>, ProtoError> {
                    let offset = r.remaining();
                    r.optional_buffer()?
                        .map(|b| String::from_utf8(b).map_err(|_| ProtoError::InvalidUtf8 { offset }))
                        .transpose()
                };
                let (joining, leaving, new_members) = (text()?, text()?, text()?);
                Self::Reconfig(crate::reconfig::ReconfigRequest {
                    joining,
                    leaving,
                    new_members,
                    from_config: r.i64()?,
                })
            }
            op::PING => Self::Ping,
            op::MULTI => Self::Multi(decode_multi(r)?),
            op::CLOSE_SESSION => Self::CloseSession,
            op::SET_WATCHES | op::SET_WATCHES2 => {
                let mut set = WatchSet {
                    relative_zxid: r.i64()?,
                    data: r.strings()?,
                    exist: r.strings()?,
                    child: r.strings()?,
                    ..WatchSet::default()
                };
                if op_code == op::SET_WATCHES2 {
                    set.persistent = r.strings()?;
                    set.persistent_recursive = r.strings()?;
                }
                Self::SetWatches(set)
            }
            op::ADD_WATCH => {
                let path = r.string()?;
                let mode = r.i32()?;
                match AddWatchMode::from_code(mode) {
                    Some(mode) => Self::AddWatch { path, mode },
                    None => return Err(ProtoError::BadField { what: "addWatch mode", value: mode as i64 }),
                }
            }
            op::CHECK_WATCHES | op::REMOVE_WATCHES => Self::RemoveWatches {
                path: r.string()?,
                watcher_type: r.i32()?,
                check_only: op_code == op::CHECK_WATCHES,
            },
            op::AUTH => {
                let _type = r.i32()?;
                Self::Auth { scheme: r.string()?, credentials: r.buffer()? }
            }
            other => Self::Unsupported(other),
        })
    }

    /// Whether the request changes the tree, and so goes through Raft.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Self::Create { .. }
                | Self::Delete { .. }
                | Self::SetData { .. }
                | Self::SetAcl { .. }
                | Self::Multi(_)
                | Self::CloseSession
                | Self::Reconfig(_)
        )
    }
}

/// A multi request: (type, done, err) headers each followed by an operation, ended by a header
/// with done set.
fn decode_multi(r: &mut JuteReader) -> Result<Vec<MultiOp>, ProtoError> {
    let mut ops = Vec::new();
    loop {
        let op_type = r.i32()?;
        let done = r.bool()?;
        let _err = r.i32()?;
        if done {
            return Ok(ops);
        }
        ops.push(match op_type {
            op::CREATE | op::CREATE2 => {
                let path = r.string()?;
                let data = r.optional_buffer()?;
                let acl = r.vec(Acl::read)?;
                let flags = r.i32()?;
                MultiOp::Create { path, data, acl, flags, with_stat: op_type == op::CREATE2 }
            }
            op::DELETE => MultiOp::Delete { path: r.string()?, version: r.i32()? },
            op::SET_DATA => MultiOp::SetData { path: r.string()?, data: r.optional_buffer()?, version: r.i32()? },
            op::CHECK => MultiOp::Check { path: r.string()?, version: r.i32()? },
            other => return Err(ProtoError::BadField { what: "multi operation type", value: other as i64 }),
        });
    }
}

/// A watch notification: reply header with the notification xid, then a WatcherEvent.
pub fn encode_watch_event(zxid: i64, event: super::codes::EventType, path: &str) -> Vec<u8> {
    let mut w = JuteWriter::new();
    w.i32(super::codes::xid::NOTIFICATION).i64(zxid).i32(0);
    w.i32(event as i32).i32(super::codes::STATE_SYNC_CONNECTED).string(path);
    w.finish()
}
