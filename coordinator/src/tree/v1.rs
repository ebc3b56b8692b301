//! The tree as the first snapshots encoded it, before null data was kept apart from empty: a
//! node's data was bytes, never null. Read only, to load such a snapshot into today's tree.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;

use super::{SessionInfo, Znode};
use crate::proto::records::Acl;

#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct DataTree {
    nodes: HashMap<String, ZnodeV1>,
    ephemerals: HashMap<i64, BTreeSet<String>>,
    sessions: BTreeMap<i64, SessionInfo>,
    last_zxid: i64,
}

/// [`Znode`]'s fields in [`Znode`]'s order, with the data not optional.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct ZnodeV1 {
    data: Vec<u8>,
    acl: Vec<Acl>,
    czxid: i64,
    mzxid: i64,
    pzxid: i64,
    ctime: i64,
    mtime: i64,
    version: i32,
    child_creates: i32,
    aversion: i32,
    ephemeral_owner: i64,
    children: BTreeSet<String>,
}

impl From<DataTree> for super::DataTree {
    fn from(old: DataTree) -> Self {
        let nodes = old
            .nodes
            .into_iter()
            .map(|(path, n)| {
                let node = Znode {
                    data: Some(n.data),
                    acl: n.acl,
                    czxid: n.czxid,
                    mzxid: n.mzxid,
                    pzxid: n.pzxid,
                    ctime: n.ctime,
                    mtime: n.mtime,
                    version: n.version,
                    child_creates: n.child_creates,
                    aversion: n.aversion,
                    ephemeral_owner: n.ephemeral_owner,
                    children: n.children,
                };
                (path, node)
            })
            .collect();
        super::DataTree { nodes, ephemerals: old.ephemerals, sessions: old.sessions, last_zxid: old.last_zxid }
    }
}

#[cfg(test)]
impl DataTree {
    /// The tree as the first encoding held it (null data, which it could not hold, as empty).
    pub fn from_current(tree: &super::DataTree) -> Self {
        let nodes = tree
            .nodes
            .iter()
            .map(|(path, n)| {
                let node = ZnodeV1 {
                    data: n.data.clone().unwrap_or_default(),
                    acl: n.acl.clone(),
                    czxid: n.czxid,
                    mzxid: n.mzxid,
                    pzxid: n.pzxid,
                    ctime: n.ctime,
                    mtime: n.mtime,
                    version: n.version,
                    child_creates: n.child_creates,
                    aversion: n.aversion,
                    ephemeral_owner: n.ephemeral_owner,
                    children: n.children.clone(),
                };
                (path.clone(), node)
            })
            .collect();
        DataTree {
            nodes,
            ephemerals: tree.ephemerals.clone(),
            sessions: tree.sessions.clone(),
            last_zxid: tree.last_zxid,
        }
    }
}
