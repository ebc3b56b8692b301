use futures::future::try_join_all;
use zookeeper_client as zk;

use crate::{Keeper, KeeperError, NodeKind, Txn};

/// One entry of a [`SequentialLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub sequence: u64,
    pub data: Vec<u8>,
}

/// An append-only log of persistent sequential nodes `<dir>/<prefix>NNNNNNNNNN`, as
/// ClickHouse's replicated tables keep `log/log-0000000042`: the coordinator numbers the
/// entries, so concurrent writers get a total order without agreeing among themselves.
#[derive(Clone, Debug)]
pub struct SequentialLog {
    dir: String,
    prefix: String,
}

impl SequentialLog {
    pub fn new(dir: &str, prefix: &str) -> Self {
        SequentialLog { dir: dir.trim_end_matches('/').to_string(), prefix: prefix.to_string() }
    }

    fn entry_base(&self) -> String {
        format!("{}/{}", self.dir, self.prefix)
    }

    /// Creates the log's directory if it is missing.
    pub async fn ensure(&self, keeper: &Keeper) -> Result<(), KeeperError> {
        keeper.ensure_path(&self.dir).await
    }

    /// Appends an entry and returns its sequence number.
    pub async fn append(&self, keeper: &Keeper, data: &[u8]) -> Result<u64, KeeperError> {
        let path = keeper.create(&self.entry_base(), data, NodeKind::PersistentSequential).await?;
        self.sequence_of(path.rsplit('/').next().unwrap_or_default())
    }

    /// Adds the append to a transaction, so that an entry is written together with what it
    /// describes (a part's block id, say) or not at all. The entry's path is in the
    /// transaction's [`crate::TxnResult::Created`]; [`SequentialLog::sequence_of`] parses it.
    pub fn append_in<'a>(&self, txn: Txn<'a>, data: &[u8]) -> Txn<'a> {
        txn.create(&self.entry_base(), data, NodeKind::PersistentSequential)
    }

    /// The sequence number of an entry's node name (`log-0000000042` → 42).
    pub fn sequence_of(&self, name: &str) -> Result<u64, KeeperError> {
        let name = name.rsplit('/').next().unwrap_or(name);
        name.strip_prefix(&self.prefix)
            .and_then(|digits| digits.parse::<u64>().ok())
            .ok_or_else(|| KeeperError::BadSequence { path: self.dir.clone(), name: name.to_string() })
    }

    /// Every entry with a sequence number at least `from`, in order. Other children of the
    /// directory are ignored.
    pub async fn read_from(&self, keeper: &Keeper, from: u64) -> Result<Vec<LogEntry>, KeeperError> {
        let names = keeper.children(&self.dir).await?;
        self.read_entries(keeper, names, from).await
    }

    /// Like [`SequentialLog::read_from`], but when there is nothing new yet, waits for the next
    /// append instead of returning empty.
    pub async fn wait_from(&self, keeper: &Keeper, from: u64) -> Result<Vec<LogEntry>, KeeperError> {
        loop {
            let (names, watcher) = keeper
                .raw()
                .list_and_watch_children(&self.dir)
                .await
                .map_err(KeeperError::op("watch children", &self.dir))?;
            let entries = self.read_entries(keeper, names, from).await?;
            if !entries.is_empty() {
                return Ok(entries);
            }
            if crate::watch::changed(watcher, &self.dir).await.event_type == zk::EventType::Session {
                return Err(KeeperError::Op {
                    op: "watch children",
                    path: self.dir.clone(),
                    source: zk::Error::SessionExpired,
                });
            }
        }
    }

    /// Deletes the entries before `sequence` (they have been applied everywhere).
    pub async fn trim_before(&self, keeper: &Keeper, sequence: u64) -> Result<usize, KeeperError> {
        let names = keeper.children(&self.dir).await?;
        let old: Vec<String> = names
            .into_iter()
            .filter(|n| self.sequence_of(n).is_ok_and(|s| s < sequence))
            .map(|n| format!("{}/{n}", self.dir))
            .collect();
        let deleted = old.len();
        try_join_all(old.iter().map(|path| async move {
            match keeper.delete(path, None).await {
                Err(e) if e.is_no_node() => Ok(()),
                other => other,
            }
        }))
        .await?;
        Ok(deleted)
    }

    async fn read_entries(&self, keeper: &Keeper, names: Vec<String>, from: u64) -> Result<Vec<LogEntry>, KeeperError> {
        let mut wanted: Vec<(u64, String)> = names
            .into_iter()
            .filter_map(|n| self.sequence_of(&n).ok().map(|s| (s, n)))
            .filter(|(s, _)| *s >= from)
            .collect();
        wanted.sort_unstable();
        // The reads are pipelined on the session; an entry trimmed meanwhile is skipped.
        let read =
            try_join_all(wanted.iter().map(|(_, name)| keeper.get_owned(format!("{}/{name}", self.dir)))).await?;
        Ok(wanted
            .into_iter()
            .zip(read)
            .filter_map(|((sequence, _), v)| v.map(|v| LogEntry { sequence, data: v.data }))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_come_from_the_name_or_the_full_path() {
        let log = SequentialLog::new("/t/log/", "log-");
        assert_eq!(log.entry_base(), "/t/log/log-");
        assert_eq!(log.sequence_of("log-0000000042").ok(), Some(42));
        assert_eq!(log.sequence_of("/t/log/log-0000000007").ok(), Some(7));
        // Names past ten digits (ZooKeeper's counter overflowing into 64 bits) still parse.
        assert_eq!(log.sequence_of("log-0000000004294967296").ok(), Some(4_294_967_296));
        let err = log.sequence_of("block-0000000001").expect_err("another prefix");
        assert!(err.to_string().contains("block-0000000001") && err.to_string().contains("/t/log"), "{err}");
        assert!(log.sequence_of("log-").is_err());
    }
}
