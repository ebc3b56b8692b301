//! What goes through Raft: every change to the tree and every session create and close, with the
//! time the proposer read from its clock so that every node computes the same ctime/mtime.

use serde::{Deserialize, Serialize};

use crate::acl::AuthId;
use crate::proto::codes::ErrorCode;
use crate::proto::records::{Acl, Stat};

impl Serialize for TreeOp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        wire::TreeOpRef::from(self).serialize(serializer)
    }
}

/// One operation on the tree; a multi request is a list of them applied all or nothing. Data
/// is `None` where the client sent null.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "wire::StoredTreeOp")]
pub enum TreeOp {
    Create {
        path: String,
        data: Option<Vec<u8>>,
        acl: Vec<Acl>,
        flags: i32,
    },
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: Option<Vec<u8>>,
        version: i32,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    Check {
        path: String,
        version: i32,
    },
    /// A reconfig's new ensemble: `/zookeeper/config` becomes `members` and the line
    /// `version=<this write's zxid in hex>`. Only the leader's reconfig makes it.
    SetConfig {
        members: String,
    },
}

/// Decoded through [`wire::Command`], whose batch holds no batch: a message nesting batches
/// (200,000 deep once, from a peer) is refused by the decoder instead of recursing through it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "wire::Command")]
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
    /// [`Command::Ops`] with the identities of the connection that sent it: each operation is
    /// checked against the ACLs as it is applied (`Ops`, from logs written before ACLs were
    /// enforced, is applied unchecked). Last, so that older entries decode as they were.
    OpsAs {
        session_id: i64,
        time_ms: i64,
        multi: bool,
        ops: Vec<TreeOp>,
        auth: Vec<AuthId>,
    },
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
#[serde(from = "wire::CommandResult")]
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

impl Command {
    /// What a command from outside this node must satisfy beyond its encoding: a batch fits
    /// in one entry's zxids and holds no batch.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Command::Batch(commands) if commands.len() > zxid::MAX_BATCH => {
                Err(format!("a batch of {} commands, over the {} an entry holds", commands.len(), zxid::MAX_BATCH))
            }
            Command::Batch(commands) if commands.iter().any(|c| matches!(c, Command::Batch(_))) => {
                Err("a batch inside a batch".into())
            }
            _ => Ok(()),
        }
    }
}

/// The encodings of [`Command`] and [`CommandResult`] as they are decoded: the same variants in
/// the same order (so the same bytes as the derived encoding), with a batch's items of a type
/// that has no batch variant. Decoding is therefore at most two levels deep.
mod wire {
    use serde::{Deserialize, Serialize};

    use super::{Acl, AuthId, ErrorCode, OpResult, TreeOp};

    /// [`super::TreeOp`] as logs hold it. The first five variants are the encoding from before
    /// null data was kept apart from empty (their data is never null); null data has variants
    /// of its own, after them, so that entries written by older nodes decode unchanged.
    #[derive(Deserialize)]
    pub enum StoredTreeOp {
        Create { path: String, data: Vec<u8>, acl: Vec<Acl>, flags: i32 },
        Delete { path: String, version: i32 },
        SetData { path: String, data: Vec<u8>, version: i32 },
        SetAcl { path: String, acl: Vec<Acl>, version: i32 },
        Check { path: String, version: i32 },
        CreateNull { path: String, acl: Vec<Acl>, flags: i32 },
        SetDataNull { path: String, version: i32 },
        SetConfig { members: String },
    }

    impl From<StoredTreeOp> for TreeOp {
        fn from(op: StoredTreeOp) -> Self {
            use StoredTreeOp as Stored;
            match op {
                Stored::Create { path, data, acl, flags } => Self::Create { path, data: Some(data), acl, flags },
                Stored::Delete { path, version } => Self::Delete { path, version },
                Stored::SetData { path, data, version } => Self::SetData { path, data: Some(data), version },
                Stored::SetAcl { path, acl, version } => Self::SetAcl { path, acl, version },
                Stored::Check { path, version } => Self::Check { path, version },
                Stored::CreateNull { path, acl, flags } => Self::Create { path, data: None, acl, flags },
                Stored::SetDataNull { path, version } => Self::SetData { path, data: None, version },
                Stored::SetConfig { members } => Self::SetConfig { members },
            }
        }
    }

    /// [`StoredTreeOp`]'s encoding, borrowed: a write is encoded without copying its data.
    #[derive(Serialize)]
    pub enum TreeOpRef<'a> {
        Create { path: &'a str, data: &'a [u8], acl: &'a [Acl], flags: i32 },
        Delete { path: &'a str, version: i32 },
        SetData { path: &'a str, data: &'a [u8], version: i32 },
        SetAcl { path: &'a str, acl: &'a [Acl], version: i32 },
        Check { path: &'a str, version: i32 },
        CreateNull { path: &'a str, acl: &'a [Acl], flags: i32 },
        SetDataNull { path: &'a str, version: i32 },
        SetConfig { members: &'a str },
    }

    impl<'a> From<&'a TreeOp> for TreeOpRef<'a> {
        fn from(op: &'a TreeOp) -> Self {
            use TreeOp as Op;
            match op {
                Op::Create { path, data: Some(data), acl, flags } => Self::Create { path, data, acl, flags: *flags },
                Op::Create { path, data: None, acl, flags } => Self::CreateNull { path, acl, flags: *flags },
                Op::Delete { path, version } => Self::Delete { path, version: *version },
                Op::SetData { path, data: Some(data), version } => Self::SetData { path, data, version: *version },
                Op::SetData { path, data: None, version } => Self::SetDataNull { path, version: *version },
                Op::SetAcl { path, acl, version } => Self::SetAcl { path, acl, version: *version },
                Op::Check { path, version } => Self::Check { path, version: *version },
                Op::SetConfig { members } => Self::SetConfig { members },
            }
        }
    }

    #[derive(Deserialize)]
    pub enum Command {
        CreateSession { session_id: i64, timeout_ms: i32, password: Vec<u8> },
        CloseSession { session_id: i64 },
        Ops { session_id: i64, time_ms: i64, multi: bool, ops: Vec<TreeOp> },
        Batch(Vec<Single>),
        OpsAs { session_id: i64, time_ms: i64, multi: bool, ops: Vec<TreeOp>, auth: Vec<AuthId> },
    }

    /// No value has this type: a batch inside a batch fails to decode.
    #[derive(Deserialize)]
    pub enum Never {}

    /// A command that is not a batch; its variants keep [`Command`]'s positions.
    #[derive(Deserialize)]
    pub enum Single {
        CreateSession { session_id: i64, timeout_ms: i32, password: Vec<u8> },
        CloseSession { session_id: i64 },
        Ops { session_id: i64, time_ms: i64, multi: bool, ops: Vec<TreeOp> },
        Batch(Never),
        OpsAs { session_id: i64, time_ms: i64, multi: bool, ops: Vec<TreeOp>, auth: Vec<AuthId> },
    }

    impl From<Single> for super::Command {
        fn from(c: Single) -> Self {
            match c {
                Single::CreateSession { session_id, timeout_ms, password } => {
                    super::Command::CreateSession { session_id, timeout_ms, password }
                }
                Single::CloseSession { session_id } => super::Command::CloseSession { session_id },
                Single::Ops { session_id, time_ms, multi, ops } => {
                    super::Command::Ops { session_id, time_ms, multi, ops }
                }
                Single::Batch(never) => match never {},
                Single::OpsAs { session_id, time_ms, multi, ops, auth } => {
                    super::Command::OpsAs { session_id, time_ms, multi, ops, auth }
                }
            }
        }
    }

    impl From<Command> for super::Command {
        fn from(c: Command) -> Self {
            match c {
                Command::CreateSession { session_id, timeout_ms, password } => {
                    Single::CreateSession { session_id, timeout_ms, password }.into()
                }
                Command::CloseSession { session_id } => Single::CloseSession { session_id }.into(),
                Command::Ops { session_id, time_ms, multi, ops } => {
                    Single::Ops { session_id, time_ms, multi, ops }.into()
                }
                Command::Batch(items) => super::Command::Batch(items.into_iter().map(Into::into).collect()),
                Command::OpsAs { session_id, time_ms, multi, ops, auth } => {
                    Single::OpsAs { session_id, time_ms, multi, ops, auth }.into()
                }
            }
        }
    }

    #[derive(Deserialize)]
    pub enum CommandResult {
        SessionCreated,
        SessionClosed,
        Applied(Vec<OpResult>),
        Failed(ErrorCode),
        MultiFailed(Vec<ErrorCode>),
        Batch(Vec<SingleResult>),
    }

    #[derive(Deserialize)]
    pub enum SingleResult {
        SessionCreated,
        SessionClosed,
        Applied(Vec<OpResult>),
        Failed(ErrorCode),
        MultiFailed(Vec<ErrorCode>),
    }

    impl From<SingleResult> for super::CommandResult {
        fn from(r: SingleResult) -> Self {
            match r {
                SingleResult::SessionCreated => super::CommandResult::SessionCreated,
                SingleResult::SessionClosed => super::CommandResult::SessionClosed,
                SingleResult::Applied(ops) => super::CommandResult::Applied(ops),
                SingleResult::Failed(code) => super::CommandResult::Failed(code),
                SingleResult::MultiFailed(codes) => super::CommandResult::MultiFailed(codes),
            }
        }
    }

    impl From<CommandResult> for super::CommandResult {
        fn from(r: CommandResult) -> Self {
            match r {
                CommandResult::SessionCreated => SingleResult::SessionCreated.into(),
                CommandResult::SessionClosed => SingleResult::SessionClosed.into(),
                CommandResult::Applied(ops) => SingleResult::Applied(ops).into(),
                CommandResult::Failed(code) => SingleResult::Failed(code).into(),
                CommandResult::MultiFailed(codes) => SingleResult::MultiFailed(codes).into(),
                CommandResult::Batch(items) => super::CommandResult::Batch(items.into_iter().map(Into::into).collect()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(session_id: i64) -> Command {
        Command::Ops {
            session_id,
            time_ms: 7,
            multi: false,
            ops: vec![TreeOp::Create { path: "/a".into(), data: Some(b"x".to_vec()), acl: vec![], flags: 0 }],
        }
    }

    #[test]
    fn entries_from_before_null_data_decode_and_null_data_round_trips() {
        // The derived encoding of TreeOp when its data could not be null.
        #[derive(Serialize)]
        enum Before {
            Create { path: String, data: Vec<u8>, acl: Vec<Acl>, flags: i32 },
            _Delete { path: String, version: i32 },
            SetData { path: String, data: Vec<u8>, version: i32 },
        }
        let acl = vec![Acl { perms: 31, scheme: "world".into(), id: "anyone".into() }];
        let create = Before::Create { path: "/a".into(), data: b"x".to_vec(), acl: acl.clone(), flags: 1 };
        let old = bincode::serialize(&create).expect("encode");
        let decoded: TreeOp = bincode::deserialize(&old).expect("decode");
        assert_eq!(
            decoded,
            TreeOp::Create { path: "/a".into(), data: Some(b"x".to_vec()), acl: acl.clone(), flags: 1 }
        );
        assert_eq!(bincode::serialize(&decoded).expect("encode"), old, "non-null data keeps its encoding");
        let old =
            bincode::serialize(&Before::SetData { path: "/a".into(), data: vec![], version: -1 }).expect("encode");
        let decoded: TreeOp = bincode::deserialize(&old).expect("decode");
        assert_eq!(decoded, TreeOp::SetData { path: "/a".into(), data: Some(vec![]), version: -1 });
        for op in [
            TreeOp::Create { path: "/n".into(), data: None, acl, flags: 0 },
            TreeOp::SetData { path: "/n".into(), data: None, version: 3 },
        ] {
            let bytes = bincode::serialize(&op).expect("encode");
            assert_eq!(bincode::deserialize::<TreeOp>(&bytes).expect("decode"), op);
        }
    }

    #[test]
    fn batches_round_trip_in_the_derived_encoding() {
        let with_auth = Command::OpsAs {
            session_id: 3,
            time_ms: 7,
            multi: true,
            ops: vec![TreeOp::Check { path: "/a".into(), version: 1 }],
            auth: vec![AuthId { scheme: "ip".into(), id: "127.0.0.1".into() }],
        };
        let batch = Command::Batch(vec![ops(1), Command::CloseSession { session_id: 2 }, with_auth.clone()]);
        let bytes = bincode::serialize(&batch).expect("encode");
        let alone = bincode::serialize(&with_auth).expect("encode");
        assert_eq!(
            bincode::serialize(&bincode::deserialize::<Command>(&alone).expect("decode")).expect("encode"),
            alone
        );
        let back: Command = bincode::deserialize(&bytes).expect("decode");
        assert_eq!(bincode::serialize(&back).expect("encode"), bytes);
        let result = CommandResult::Batch(vec![CommandResult::SessionClosed, CommandResult::Failed(ErrorCode::NoNode)]);
        let bytes = bincode::serialize(&result).expect("encode");
        assert_eq!(bincode::deserialize::<CommandResult>(&bytes).expect("decode"), result);
    }

    #[test]
    fn nested_batches_are_refused_without_recursing() {
        // Batch(Batch(Batch(…))) 200,000 deep, as bincode writes it: variant 3, one item.
        let mut bytes = Vec::new();
        for _ in 0..200_000 {
            bytes.extend_from_slice(&3u32.to_le_bytes());
            bytes.extend_from_slice(&1u64.to_le_bytes());
        }
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&5i64.to_le_bytes());
        assert!(bincode::deserialize::<Command>(&bytes).is_err());
        let mut results = Vec::new();
        for _ in 0..200_000 {
            results.extend_from_slice(&5u32.to_le_bytes());
            results.extend_from_slice(&1u64.to_le_bytes());
        }
        assert!(bincode::deserialize::<CommandResult>(&results).is_err());
    }

    #[test]
    fn an_oversized_batch_is_refused() {
        assert!(Command::Batch(vec![ops(1); zxid::MAX_BATCH]).check().is_ok());
        assert!(Command::Batch(vec![ops(1); zxid::MAX_BATCH + 1]).check().is_err());
    }
}

/// A change to the tree that watches may be waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(String),
    Deleted(String),
    DataChanged(String),
}
