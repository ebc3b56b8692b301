//! Watches of the sessions connected to this node, and which of them a change fires, with
//! ZooKeeper's rules: one-shot data/exists and child watches, persistent watches that see every
//! event on their path, and persistent-recursive watches that see every event below their path
//! except NodeChildrenChanged. A session receives one event per (type, path) however many of its
//! watches match.

use std::collections::{HashMap, HashSet};

use crate::proto::codes::EventType;
use crate::tree::command::Change;
use crate::tree::path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// getData and exists watches: ZooKeeper keeps both in its data watch table.
    Data,
    Child,
    Persistent,
    PersistentRecursive,
}

#[derive(Default)]
pub struct WatchManager {
    tables: HashMap<WatchKind, HashMap<String, HashSet<i64>>>,
    by_session: HashMap<i64, HashSet<(WatchKind, String)>>,
}

/// An event for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub session_id: i64,
    pub event: EventType,
    pub path: String,
}

impl WatchManager {
    pub fn add(&mut self, session_id: i64, kind: WatchKind, path: &str) {
        self.tables.entry(kind).or_default().entry(path.to_string()).or_default().insert(session_id);
        self.by_session.entry(session_id).or_default().insert((kind, path.to_string()));
    }

    /// Removes a session's watches of one kind on a path; false if it had none.
    pub fn remove(&mut self, session_id: i64, kind: WatchKind, path: &str) -> bool {
        let removed = self
            .tables
            .get_mut(&kind)
            .and_then(|t| t.get_mut(path))
            .map(|sessions| sessions.remove(&session_id))
            .unwrap_or(false);
        if let Some(s) = self.by_session.get_mut(&session_id) {
            s.remove(&(kind, path.to_string()));
        }
        removed
    }

    pub fn has(&self, session_id: i64, kind: WatchKind, path: &str) -> bool {
        self.tables.get(&kind).and_then(|t| t.get(path)).is_some_and(|s| s.contains(&session_id))
    }

    pub fn remove_session(&mut self, session_id: i64) {
        for (kind, path) in self.by_session.remove(&session_id).unwrap_or_default() {
            if let Some(table) = self.tables.get_mut(&kind) {
                if let Some(sessions) = table.get_mut(&path) {
                    sessions.remove(&session_id);
                    if sessions.is_empty() {
                        table.remove(&path);
                    }
                }
            }
        }
    }

    pub fn count(&self) -> usize {
        self.tables.values().flat_map(|t| t.values()).map(HashSet::len).sum()
    }

    /// The events a change fires, in ZooKeeper's order: the node's own event, then its parent's
    /// NodeChildrenChanged.
    pub fn fire(&mut self, change: &Change, out: &mut Vec<Fired>) {
        if self.tables.values().all(HashMap::is_empty) {
            return;
        }
        match change {
            Change::Created(p) => {
                self.fire_on(p, EventType::NodeCreated, &[WatchKind::Data], out);
                self.fire_on(path::parent(p), EventType::NodeChildrenChanged, &[WatchKind::Child], out);
            }
            Change::Deleted(p) => {
                self.fire_on(p, EventType::NodeDeleted, &[WatchKind::Data, WatchKind::Child], out);
                self.fire_on(path::parent(p), EventType::NodeChildrenChanged, &[WatchKind::Child], out);
            }
            Change::DataChanged(p) => self.fire_on(p, EventType::NodeDataChanged, &[WatchKind::Data], out),
        }
    }

    fn fire_on(&mut self, p: &str, event: EventType, one_shot: &[WatchKind], out: &mut Vec<Fired>) {
        let mut sessions: Vec<i64> = Vec::new();
        for kind in one_shot {
            if let Some(fired) = self.tables.get_mut(kind).and_then(|t| t.remove(p)) {
                for s in fired {
                    if let Some(w) = self.by_session.get_mut(&s) {
                        w.remove(&(*kind, p.to_string()));
                    }
                    sessions.push(s);
                }
            }
        }
        if let Some(s) = self.tables.get(&WatchKind::Persistent).and_then(|t| t.get(p)) {
            sessions.extend(s.iter().copied());
        }
        if event != EventType::NodeChildrenChanged {
            if let Some(table) = self.tables.get(&WatchKind::PersistentRecursive).filter(|t| !t.is_empty()) {
                let mut ancestor = p;
                loop {
                    if let Some(s) = table.get(ancestor) {
                        sessions.extend(s.iter().copied());
                    }
                    if ancestor == "/" {
                        break;
                    }
                    ancestor = path::parent(ancestor);
                }
            }
        }
        sessions.sort_unstable();
        sessions.dedup();
        out.extend(sessions.into_iter().map(|session_id| Fired { session_id, event, path: p.to_string() }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fire(m: &mut WatchManager, change: Change) -> Vec<(i64, EventType, String)> {
        let mut out = Vec::new();
        m.fire(&change, &mut out);
        out.into_iter().map(|f| (f.session_id, f.event, f.path)).collect()
    }

    #[test]
    fn one_shot_watches_fire_once_and_persistent_ones_keep_firing() {
        let mut m = WatchManager::default();
        m.add(1, WatchKind::Data, "/a");
        m.add(2, WatchKind::Persistent, "/a");
        m.add(3, WatchKind::PersistentRecursive, "/");
        m.add(1, WatchKind::Child, "/");
        let first = fire(&mut m, Change::Created("/a".into()));
        assert_eq!(
            first,
            vec![
                (1, EventType::NodeCreated, "/a".into()),
                (2, EventType::NodeCreated, "/a".into()),
                (3, EventType::NodeCreated, "/a".into()),
                (1, EventType::NodeChildrenChanged, "/".into()),
            ]
        );
        let second = fire(&mut m, Change::DataChanged("/a".into()));
        assert_eq!(
            second,
            vec![(2, EventType::NodeDataChanged, "/a".into()), (3, EventType::NodeDataChanged, "/a".into())]
        );
        m.remove_session(2);
        assert_eq!(fire(&mut m, Change::Deleted("/a".into())), vec![(3, EventType::NodeDeleted, "/a".into())]);
    }

    #[test]
    fn a_session_gets_one_event_when_data_and_child_watches_both_match_a_delete() {
        let mut m = WatchManager::default();
        m.add(1, WatchKind::Data, "/a");
        m.add(1, WatchKind::Child, "/a");
        assert_eq!(fire(&mut m, Change::Deleted("/a".into())), vec![(1, EventType::NodeDeleted, "/a".into())]);
        assert_eq!(m.count(), 0);
    }
}
