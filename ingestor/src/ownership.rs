//! Partition ownership and source positions in the coordinator.
//!
//! As ClickHouse's Keeper-based Kafka engine does, each partition is owned through an
//! ephemeral lock node, so there is no consumer-group rebalance to wait for: an ingestor
//! takes what is free, and the partitions of one that dies come free when its session
//! expires. The position to resume from is the offset node the storage node moves with each
//! block, never Kafka's committed offset.

use std::time::Duration;

use coordinator_client::offset::{offset_path, owner_path};
use coordinator_client::zk::SessionState;
use coordinator_client::{EphemeralLock, Keeper, KeeperAccess, KeeperError, NodeKind, OffsetRecord};

/// The position of one (table, partition) and the version of its offset node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The next offset to consume, or `BEGINNING` when nothing was consumed yet.
    pub next: i64,
    pub version: i32,
}

/// Why a partition's position cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PositionError {
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    #[error("offset node {path} is damaged: {message}")]
    Corrupt { path: String, message: String },
}

/// The offset of a new offset node: start from the oldest message the broker keeps.
pub const BEGINNING: i64 = -2;

pub struct Ownership {
    keeper: Keeper,
    pipeline: String,
    instance: String,
}

impl Ownership {
    /// A session for the partitions of `pipeline`, taken under the name `instance`.
    pub async fn connect(
        hosts: &str,
        session_timeout: Duration,
        access: &KeeperAccess,
        pipeline: &str,
        instance: &str,
    ) -> Result<Ownership, KeeperError> {
        let keeper = Keeper::connect_with(hosts, session_timeout, access).await?;
        Ok(Ownership { keeper, pipeline: pipeline.to_string(), instance: instance.to_string() })
    }

    /// False once the session expired or closed: every lock it held is gone.
    pub fn alive(&self) -> bool {
        !self.keeper.raw().state().is_terminated()
    }

    pub fn connected(&self) -> bool {
        self.keeper.raw().state() == SessionState::SyncConnected
    }

    /// Announces this instance (an ephemeral node), so that instances can share partitions.
    pub async fn register(&self) -> Result<(), KeeperError> {
        let dir = format!("/mergestream/pipelines/{}/instances", self.pipeline);
        self.keeper.ensure_path(&dir).await?;
        match self.keeper.create(&format!("{dir}/{}", self.instance), b"", NodeKind::Ephemeral).await {
            Err(e) if !e.is_node_exists() => Err(e),
            _ => Ok(()),
        }
    }

    /// How many instances of the pipeline are running.
    pub async fn instances(&self) -> Result<usize, KeeperError> {
        Ok(self.keeper.children(&format!("/mergestream/pipelines/{}/instances", self.pipeline)).await?.len())
    }

    /// Takes the partition if nobody owns it.
    pub async fn try_own(&self, topic: &str, partition: i32) -> Result<Option<EphemeralLock>, KeeperError> {
        EphemeralLock::try_acquire(
            &self.keeper,
            &owner_path(&self.pipeline, topic, partition),
            self.instance.as_bytes(),
        )
        .await
    }

    pub async fn release(&self, lock: EphemeralLock) -> Result<(), KeeperError> {
        lock.release(&self.keeper).await
    }

    pub fn offset_path(&self, table: &str, topic: &str, partition: i32) -> String {
        offset_path(&self.pipeline, table, topic, partition)
    }

    /// The position of a table in a partition; a missing offset node is created at the start.
    /// A node that holds something else than an offset record is an error, never "from the
    /// beginning": that would insert everything again.
    pub async fn position(&self, table: &str, topic: &str, partition: i32) -> Result<Position, PositionError> {
        let path = self.offset_path(table, topic, partition);
        loop {
            if let Some(v) = self.keeper.get(&path).await? {
                let record =
                    OffsetRecord::decode(&v.data).map_err(|message| PositionError::Corrupt { path, message })?;
                return Ok(Position { next: record.next, version: v.version });
            }
            if let Some((parent, _)) = path.rsplit_once('/') {
                self.keeper.ensure_path(parent).await?;
            }
            let start = OffsetRecord { next: BEGINNING, ..OffsetRecord::default() }.encode();
            match self.keeper.create(&path, &start, NodeKind::Persistent).await {
                Ok(_) => {}
                Err(e) if e.is_node_exists() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}
