//! The workspace's client of the coordinator — or of any ZooKeeper ensemble standing in for it.
//!
//! It wraps the `zookeeper-client` crate with what replication and ingestion need, named for
//! their purpose: versioned reads and compare-and-set ([`Keeper::get`], [`Keeper::set`]),
//! all-or-nothing transactions with version checks ([`Txn`]), partition ownership through
//! ephemeral lock nodes ([`EphemeralLock`]), replicated logs of sequential nodes
//! ([`SequentialLog`]), and waiting for changes ([`Keeper::wait_for_change`]). The raw client
//! stays reachable through [`Keeper::raw`] for anything else.

pub mod access;
mod error;
mod keeper;
mod lock;
mod log;
pub mod offset;
mod txn;
pub mod watch;

pub use access::{KeeperAccess, KeeperTls, TlsSettings};
pub use error::KeeperError;
pub use keeper::{Keeper, NodeKind, Versioned};
pub use lock::{EphemeralLock, LockHolder};
pub use log::{LogEntry, SequentialLog};
pub use offset::OffsetRecord;
pub use txn::{Txn, TxnResult};
/// The underlying client crate, for its types (`Stat`, `WatchedEvent`, `Error`).
pub use zookeeper_client as zk;
