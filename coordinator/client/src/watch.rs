//! Waiting on a oneshot ZooKeeper watch.
//!
//! zookeeper-client 0.11's `OneshotWatcher::changed` unwraps its channel, and so panics when
//! the session drops a watch's sender without an event. Seen when the watches of one path
//! churn (a replication queue re-watching its log every second while it fetches hundreds of
//! parts): the panic ended the queue's task, and with it the replica's replication. Every
//! caller here waits on a watch only to read the node again, so a watch lost that way is
//! taken as a change of the node: the caller reads it again and watches anew.

use futures::FutureExt;
use tracing::warn;

use crate::zk;

/// The watch's event; for a watch its session dropped without one, a change of `path`.
pub async fn changed(watcher: zk::OneshotWatcher, path: &str) -> zk::WatchedEvent {
    match std::panic::AssertUnwindSafe(watcher.changed()).catch_unwind().await {
        Ok(event) => event,
        Err(_) => {
            warn!(path, "a watch ended without its event: reading the node again");
            zk::WatchedEvent::new(zk::EventType::NodeDataChanged, path)
        }
    }
}
