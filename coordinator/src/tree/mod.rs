//! The replicated state: the znode tree, the sessions and their ephemerals. `apply` is
//! deterministic, so every node that applies the same Raft log holds the same tree.

pub mod command;
pub mod path;
pub mod v1;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::acl::{self, perms, AuthId};
use crate::proto::codes::{CreateMode, ErrorCode};
use crate::proto::records::{Acl, Stat};
use command::{Change, Command, CommandResult, OpResult, TreeOp};

/// NoAuth unless `acl` grants `perm` to `auth`; a command without identities (written before
/// ACLs were enforced) passes.
fn allowed(acl: &[Acl], auth: Option<&[AuthId]>, perm: i32) -> Result<(), ErrorCode> {
    match auth {
        Some(auth) if !acl::permits(acl, auth, perm) => Err(ErrorCode::NoAuth),
        _ => Ok(()),
    }
}

/// `ZooDefs.Perms.ALL` for `world:anyone`, the ACL of the system nodes.
fn open_acl() -> Vec<Acl> {
    vec![Acl { perms: 31, scheme: "world".into(), id: "anyone".into() }]
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Znode {
    /// `None` when the client sent null: ZooKeeper keeps it apart from empty data.
    pub data: Option<Vec<u8>>,
    pub acl: Vec<Acl>,
    pub czxid: i64,
    pub mzxid: i64,
    pub pzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    /// Children created so far, which is what ZooKeeper stores as cversion and numbers sequential
    /// children by; the cversion clients see is `2 * creates - children` (every create but those
    /// of the present children was matched by a delete).
    pub child_creates: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub children: BTreeSet<String>,
}

impl Znode {
    fn new(data: Option<Vec<u8>>, acl: Vec<Acl>, zxid: i64, time_ms: i64, ephemeral_owner: i64) -> Self {
        Self {
            data,
            acl,
            czxid: zxid,
            mzxid: zxid,
            pzxid: zxid,
            ctime: time_ms,
            mtime: time_ms,
            version: 0,
            child_creates: 0,
            aversion: 0,
            ephemeral_owner,
            children: BTreeSet::new(),
        }
    }

    pub fn stat(&self) -> Stat {
        let num_children = self.children.len() as i32;
        Stat {
            czxid: self.czxid,
            mzxid: self.mzxid,
            ctime: self.ctime,
            mtime: self.mtime,
            version: self.version,
            cversion: self.child_creates.wrapping_mul(2).wrapping_sub(num_children),
            aversion: self.aversion,
            ephemeral_owner: self.ephemeral_owner,
            data_length: self.data.as_ref().map_or(0, Vec::len) as i32,
            num_children,
            pzxid: self.pzxid,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub timeout_ms: i32,
    pub password: Vec<u8>,
}

/// What a failed multi must put back, newest first.
enum Undo {
    RemoveNode(String),
    RestoreNode(String, Znode),
    RestoreData { path: String, data: Option<Vec<u8>>, mzxid: i64, mtime: i64, version: i32 },
    RestoreAcl { path: String, acl: Vec<Acl>, aversion: i32 },
    ChildAdded { parent: String, child: String, child_creates: i32, pzxid: i64 },
    ChildRemoved { parent: String, child: String, pzxid: i64 },
    EphemeralAdded { session_id: i64, path: String },
    EphemeralRemoved { session_id: i64, path: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataTree {
    nodes: HashMap<String, Znode>,
    ephemerals: HashMap<i64, BTreeSet<String>>,
    sessions: BTreeMap<i64, SessionInfo>,
    last_zxid: i64,
}

impl Default for DataTree {
    fn default() -> Self {
        Self::new()
    }
}

/// Nodes ZooKeeper keeps for itself: they exist from the start and cannot be deleted.
const SYSTEM_NODES: [&str; 3] = ["/zookeeper", "/zookeeper/quota", CONFIG_NODE];

/// The ensemble's configuration, which only `reconfig` changes.
pub const CONFIG_NODE: &str = "/zookeeper/config";

/// `ZooDefs.Ids.READ_ACL_UNSAFE`, `/zookeeper/config`'s ACL since ZooKeeper 3.5.3: anyone reads,
/// only the superuser reconfigures.
fn read_only_acl() -> Vec<Acl> {
    vec![Acl { perms: perms::READ, scheme: "world".into(), id: "anyone".into() }]
}

impl DataTree {
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert("/".to_string(), Znode::new(Some(Vec::new()), open_acl(), 0, 0, 0));
        for p in SYSTEM_NODES {
            let acl = if p == CONFIG_NODE { read_only_acl() } else { open_acl() };
            nodes.insert(p.to_string(), Znode::new(Some(Vec::new()), acl, 0, 0, 0));
            // Added without counting as a create, as ZooKeeper's DataTree does: this is why a fresh
            // root reports cversion -1.
            if let Some(parent) = nodes.get_mut(path::parent(p)) {
                parent.children.insert(path::name(p).to_string());
            }
        }
        Self { nodes, ephemerals: HashMap::new(), sessions: BTreeMap::new(), last_zxid: 0 }
    }

    pub fn last_zxid(&self) -> i64 {
        self.last_zxid
    }

    pub fn node(&self, path: &str) -> Option<&Znode> {
        self.nodes.get(path)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn session(&self, session_id: i64) -> Option<&SessionInfo> {
        self.sessions.get(&session_id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (&i64, &SessionInfo)> {
        self.sessions.iter()
    }

    pub fn ephemerals_of(&self, session_id: i64) -> impl Iterator<Item = &String> {
        self.ephemerals.get(&session_id).into_iter().flatten()
    }

    pub fn ephemeral_count(&self) -> usize {
        self.ephemerals.values().map(BTreeSet::len).sum()
    }

    /// Every path with its data and stat, in path order: what two nodes compare to prove they
    /// hold the same tree.
    pub fn dump(&self) -> Vec<(&String, &Znode)> {
        let mut all: Vec<_> = self.nodes.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all
    }

    /// Applies one committed command at `zxid` (see [`command::zxid`]) and reports the changes
    /// that watches may wait for.
    pub fn apply(&mut self, zxid: i64, command: &Command, changes: &mut Vec<Change>) -> CommandResult {
        self.last_zxid = self.last_zxid.max(zxid);
        match command {
            Command::Batch(commands) => CommandResult::Batch(
                commands.iter().enumerate().map(|(i, c)| self.apply(zxid + i as i64, c, changes)).collect(),
            ),
            Command::CreateSession { session_id, timeout_ms, password } => {
                self.sessions
                    .entry(*session_id)
                    .or_insert_with(|| SessionInfo { timeout_ms: *timeout_ms, password: password.clone() });
                CommandResult::SessionCreated
            }
            Command::CloseSession { session_id } => {
                self.close_session(zxid, *session_id, changes);
                CommandResult::SessionClosed
            }
            Command::Ops { session_id, time_ms, multi, ops } => {
                self.apply_ops(zxid, *session_id, *time_ms, *multi, ops, None, changes)
            }
            Command::OpsAs { session_id, time_ms, multi, ops, auth } => {
                self.apply_ops(zxid, *session_id, *time_ms, *multi, ops, Some(auth), changes)
            }
        }
    }

    /// One request's operations, checked against the ACLs for `auth` when it is given.
    #[allow(clippy::too_many_arguments)]
    fn apply_ops(
        &mut self,
        zxid: i64,
        session_id: i64,
        time_ms: i64,
        multi: bool,
        ops: &[TreeOp],
        auth: Option<&[AuthId]>,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if session_id != 0 && !self.sessions.contains_key(&session_id) {
            return if multi {
                CommandResult::MultiFailed(vec![ErrorCode::SessionExpired; ops.len()])
            } else {
                CommandResult::Failed(ErrorCode::SessionExpired)
            };
        }
        if multi {
            return self.apply_multi(zxid, session_id, time_ms, ops, auth, changes);
        }
        match ops.first().map(|op| self.apply_op(zxid, session_id, time_ms, op, auth, changes, None)) {
            Some(Ok(result)) => CommandResult::Applied(vec![result]),
            Some(Err(code)) => CommandResult::Failed(code),
            None => CommandResult::Applied(Vec::new()),
        }
    }

    fn close_session(&mut self, zxid: i64, session_id: i64, changes: &mut Vec<Change>) {
        self.sessions.remove(&session_id);
        let owned: Vec<String> = self.ephemerals.remove(&session_id).unwrap_or_default().into_iter().collect();
        let created_at = |p: &String| self.nodes.get(p).map_or(0, |n| n.czxid);
        for p in java_hash_set_order(owned, created_at) {
            if self.nodes.remove(&p).is_some() {
                self.unlink_child(zxid, &p, None);
                changes.push(Change::Deleted(p));
            }
        }
    }

    fn apply_multi(
        &mut self,
        zxid: i64,
        session_id: i64,
        time_ms: i64,
        ops: &[TreeOp],
        auth: Option<&[AuthId]>,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let mut undo = Vec::new();
        let mut local_changes = Vec::new();
        let mut results = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match self.apply_op(zxid, session_id, time_ms, op, auth, &mut local_changes, Some(&mut undo)) {
                Ok(r) => results.push(r),
                Err(code) => {
                    self.roll_back(undo);
                    let mut codes = vec![ErrorCode::Ok; i];
                    codes.push(code);
                    codes.resize(ops.len(), ErrorCode::RuntimeInconsistency);
                    return CommandResult::MultiFailed(codes);
                }
            }
        }
        changes.append(&mut local_changes);
        CommandResult::Applied(results)
    }

    fn roll_back(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::RemoveNode(p) => {
                    self.nodes.remove(&p);
                }
                Undo::RestoreNode(p, node) => {
                    self.nodes.insert(p, node);
                }
                Undo::RestoreData { path, data, mzxid, mtime, version } => {
                    if let Some(n) = self.nodes.get_mut(&path) {
                        n.data = data;
                        n.mzxid = mzxid;
                        n.mtime = mtime;
                        n.version = version;
                    }
                }
                Undo::RestoreAcl { path, acl, aversion } => {
                    if let Some(n) = self.nodes.get_mut(&path) {
                        n.acl = acl;
                        n.aversion = aversion;
                    }
                }
                Undo::ChildAdded { parent, child, child_creates, pzxid } => {
                    if let Some(n) = self.nodes.get_mut(&parent) {
                        n.children.remove(&child);
                        n.child_creates = child_creates;
                        n.pzxid = pzxid;
                    }
                }
                Undo::ChildRemoved { parent, child, pzxid } => {
                    if let Some(n) = self.nodes.get_mut(&parent) {
                        n.children.insert(child);
                        n.pzxid = pzxid;
                    }
                }
                Undo::EphemeralAdded { session_id, path } => self.forget_ephemeral(session_id, &path),
                Undo::EphemeralRemoved { session_id, path } => {
                    self.ephemerals.entry(session_id).or_default().insert(path);
                }
            }
        }
    }

    /// One operation, checked in the order ZooKeeper's PrepRequestProcessor checks it.
    #[allow(clippy::too_many_arguments)]
    fn apply_op(
        &mut self,
        zxid: i64,
        session_id: i64,
        time_ms: i64,
        op: &TreeOp,
        auth: Option<&[AuthId]>,
        changes: &mut Vec<Change>,
        mut undo: Option<&mut Vec<Undo>>,
    ) -> Result<OpResult, ErrorCode> {
        match op {
            TreeOp::Create { path: requested, data, acl, flags } => {
                let mode = CreateMode::from_flags(*flags).ok_or(ErrorCode::Unimplemented)?;
                path::validate(requested, mode.is_sequential())?;
                if requested == "/" {
                    return Err(ErrorCode::NodeExists);
                }
                let acl = match auth {
                    Some(auth) => std::borrow::Cow::Owned(acl::fixup(acl, auth)?),
                    None => std::borrow::Cow::Borrowed(acl),
                };
                let parent_path = path::parent(requested);
                let parent = self.nodes.get(parent_path).ok_or(ErrorCode::NoNode)?;
                allowed(&parent.acl, auth, perms::CREATE)?;
                let created = if mode.is_sequential() {
                    format!("{requested}{:010}", parent.child_creates)
                } else {
                    requested.clone()
                };
                if self.nodes.contains_key(&created) {
                    return Err(ErrorCode::NodeExists);
                }
                if parent.ephemeral_owner != 0 {
                    return Err(ErrorCode::NoChildrenForEphemerals);
                }
                if acl.is_empty() {
                    return Err(ErrorCode::InvalidAcl);
                }
                let owner = if mode.is_ephemeral() { session_id } else { 0 };
                let parent = self.nodes.get_mut(parent_path).ok_or(ErrorCode::NoNode)?;
                let child = path::name(&created).to_string();
                if let Some(u) = undo.as_deref_mut() {
                    u.push(Undo::ChildAdded {
                        parent: parent_path.to_string(),
                        child: child.clone(),
                        child_creates: parent.child_creates,
                        pzxid: parent.pzxid,
                    });
                    u.push(Undo::RemoveNode(created.clone()));
                }
                parent.children.insert(child);
                parent.child_creates = parent.child_creates.wrapping_add(1);
                parent.pzxid = zxid;
                let node = Znode::new(data.clone(), acl.into_owned(), zxid, time_ms, owner);
                let stat = node.stat();
                self.nodes.insert(created.clone(), node);
                if owner != 0 {
                    self.ephemerals.entry(owner).or_default().insert(created.clone());
                    if let Some(u) = undo {
                        u.push(Undo::EphemeralAdded { session_id: owner, path: created.clone() });
                    }
                }
                changes.push(Change::Created(created.clone()));
                Ok(OpResult::Created { path: created, stat })
            }
            TreeOp::Delete { path: p, version } => {
                path::validate(p, false)?;
                if p == "/" || SYSTEM_NODES.contains(&p.as_str()) {
                    return Err(ErrorCode::BadArguments);
                }
                let parent = self.nodes.get(path::parent(p)).ok_or(ErrorCode::NoNode)?;
                allowed(&parent.acl, auth, perms::DELETE)?;
                let node = self.nodes.get(p).ok_or(ErrorCode::NoNode)?;
                check_version(node.version, *version)?;
                if !node.children.is_empty() {
                    return Err(ErrorCode::NotEmpty);
                }
                let node = self.nodes.remove(p).ok_or(ErrorCode::NoNode)?;
                let owner = node.ephemeral_owner;
                if owner != 0 {
                    self.forget_ephemeral(owner, p);
                }
                let undo = match undo {
                    Some(u) => {
                        if owner != 0 {
                            u.push(Undo::EphemeralRemoved { session_id: owner, path: p.clone() });
                        }
                        u.push(Undo::RestoreNode(p.clone(), node));
                        Some(u)
                    }
                    None => None,
                };
                self.unlink_child(zxid, p, undo);
                changes.push(Change::Deleted(p.clone()));
                Ok(OpResult::Deleted)
            }
            TreeOp::SetData { path: p, data, version } => {
                path::validate(p, false)?;
                let node = self.nodes.get_mut(p).ok_or(ErrorCode::NoNode)?;
                allowed(&node.acl, auth, perms::WRITE)?;
                check_version(node.version, *version)?;
                let stat = set_data(node, p, data.clone(), zxid, time_ms, undo);
                changes.push(Change::DataChanged(p.clone()));
                Ok(OpResult::SetData { stat })
            }
            TreeOp::SetAcl { path: p, acl, version } => {
                path::validate(p, false)?;
                let acl = match auth {
                    Some(auth) => acl::fixup(acl, auth)?,
                    None if acl.is_empty() => return Err(ErrorCode::InvalidAcl),
                    None => acl.clone(),
                };
                let node = self.nodes.get_mut(p).ok_or(ErrorCode::NoNode)?;
                allowed(&node.acl, auth, perms::ADMIN)?;
                check_version(node.aversion, *version)?;
                let previous = std::mem::replace(&mut node.acl, acl);
                if let Some(u) = undo {
                    u.push(Undo::RestoreAcl { path: p.clone(), acl: previous, aversion: node.aversion });
                }
                node.aversion = node.aversion.wrapping_add(1);
                Ok(OpResult::SetAcl { stat: node.stat() })
            }
            TreeOp::SetConfig { members } => {
                let node = self.nodes.get_mut(CONFIG_NODE).ok_or(ErrorCode::NoNode)?;
                let data = format!("{members}version={zxid:x}").into_bytes();
                let stat = set_data(node, CONFIG_NODE, Some(data), zxid, time_ms, undo);
                changes.push(Change::DataChanged(CONFIG_NODE.to_string()));
                Ok(OpResult::SetData { stat })
            }
            TreeOp::Check { path: p, version } => {
                path::validate(p, false)?;
                let node = self.nodes.get(p).ok_or(ErrorCode::NoNode)?;
                allowed(&node.acl, auth, perms::READ)?;
                check_version(node.version, *version)?;
                Ok(OpResult::Checked)
            }
        }
    }

    /// Empty sets are removed so that equal trees compare (and serialize) equal.
    fn forget_ephemeral(&mut self, session_id: i64, path: &str) {
        if let Some(set) = self.ephemerals.get_mut(&session_id) {
            set.remove(path);
            if set.is_empty() {
                self.ephemerals.remove(&session_id);
            }
        }
    }

    fn unlink_child(&mut self, zxid: i64, child_path: &str, undo: Option<&mut Vec<Undo>>) {
        let parent_path = path::parent(child_path);
        if let Some(parent) = self.nodes.get_mut(parent_path) {
            let child = path::name(child_path).to_string();
            if let Some(u) = undo {
                u.push(Undo::ChildRemoved {
                    parent: parent_path.to_string(),
                    child: child.clone(),
                    pzxid: parent.pzxid,
                });
            }
            parent.children.remove(&child);
            parent.pzxid = zxid;
        }
    }
}

/// The order in which ZooKeeper deletes a closed session's ephemerals, which watchers see the
/// events in: the iteration order of a *clone* of the session's Java `HashSet<String>`
/// (`DataTree.getEphemerals` clones it). Buckets come from `String.hashCode` spread as
/// `HashMap.hash` does. The set's table has the capacity it grew to, entries of one bucket in
/// insertion (creation) order; the clone re-inserts them in that order into a table sized for
/// their count (JDK 17's `HashMap.putMapEntries`), which can bucket them anew.
fn java_hash_set_order(paths: Vec<String>, created_at: impl Fn(&String) -> i64) -> Vec<String> {
    let mut capacity = 16usize;
    while paths.len() * 4 > capacity * 3 {
        capacity *= 2;
    }
    // `tableSizeFor((int) (size / 0.75f + 1))`.
    let clone_capacity = ((paths.len() as f32 / 0.75 + 1.0) as usize).next_power_of_two();
    let hash = |p: &String| {
        let h = p.encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32)) as u32;
        (h ^ (h >> 16)) as usize
    };
    let mut keyed: Vec<(usize, i64, String)> = paths.into_iter().map(|p| (hash(&p), created_at(&p), p)).collect();
    keyed.sort_by_key(|(h, created, _)| (h & (capacity - 1), *created));
    // Stable: one bucket of the clone keeps the original set's order.
    keyed.sort_by_key(|(h, _, _)| h & (clone_capacity - 1));
    keyed.into_iter().map(|(_, _, p)| p).collect()
}

/// Version -1 matches any version.
/// Gives `node` (at `path`) new data written at `zxid`, and records what a failed multi must put
/// back; the node's new stat.
fn set_data(
    node: &mut Znode,
    path: &str,
    data: Option<Vec<u8>>,
    zxid: i64,
    time_ms: i64,
    undo: Option<&mut Vec<Undo>>,
) -> Stat {
    let previous = std::mem::replace(&mut node.data, data);
    if let Some(u) = undo {
        u.push(Undo::RestoreData {
            path: path.to_string(),
            data: previous,
            mzxid: node.mzxid,
            mtime: node.mtime,
            version: node.version,
        });
    }
    node.mzxid = zxid;
    node.mtime = time_ms;
    node.version = node.version.wrapping_add(1);
    node.stat()
}

fn check_version(current: i32, expected: i32) -> Result<(), ErrorCode> {
    if expected == -1 || expected == current {
        Ok(())
    } else {
        Err(ErrorCode::BadVersion)
    }
}

#[cfg(test)]
mod tests;
