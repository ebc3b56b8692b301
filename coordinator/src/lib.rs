//! The coordinator of mergestream: a Keeper that speaks the ZooKeeper client protocol, keeps its
//! tree in a Raft log (openraft) on every node, and persists it as log plus snapshots.
//!
//! `proto` is the wire format, `tree` the deterministic state, `raft` the replication, `state`
//! and `watch` what a node keeps beside the tree for its connected sessions, `server` the client
//! port, and `node` ties them together.

pub mod acl;
pub mod metrics;
pub mod node;
pub mod proto;
pub mod raft;
pub mod reconfig;
pub mod server;
pub mod state;
pub mod tree;
pub mod watch;
