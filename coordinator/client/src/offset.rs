//! Source positions kept in the coordinator, shared by the ingestor (which reads them and
//! owns the partitions) and the storage node (which moves them when it commits a block).
//!
//! One node per (pipeline, table, topic, partition) holds the next position to consume and
//! the deduplication token of the block that moved it there. The token lets a writer whose
//! reply was lost find out that its block did commit, and lets a restarted storage node tell
//! which of its prepared blocks were committed.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRecord {
    /// The first position not yet in the table.
    pub next: i64,
    /// The token of the block that moved the position here; empty before the first block.
    #[serde(default)]
    pub token: String,
    /// Which attempt at that block did it: retries of one block share its token, and only
    /// the attempt named here may make its parts visible.
    #[serde(default)]
    pub attempt: String,
}

impl OffsetRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<OffsetRecord> {
        serde_json::from_slice(bytes).ok()
    }
}

/// `/mergestream/pipelines/<pipeline>/offsets/<table>/<topic>/<partition>`.
pub fn offset_path(pipeline: &str, table: &str, topic: &str, partition: i32) -> String {
    format!("/mergestream/pipelines/{pipeline}/offsets/{table}/{topic}/{partition}")
}

/// `/mergestream/pipelines/<pipeline>/owners/<topic>/<partition>`: the ephemeral lock node of
/// the ingestor that consumes the partition.
pub fn owner_path(pipeline: &str, topic: &str, partition: i32) -> String {
    format!("/mergestream/pipelines/{pipeline}/owners/{topic}/{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_junk_is_none() {
        let record = OffsetRecord { next: 42, token: "orders-t-0-0-41".into(), attempt: "1-7".into() };
        assert_eq!(OffsetRecord::decode(&record.encode()), Some(record));
        assert_eq!(OffsetRecord::decode(br#"{"next":7}"#), Some(OffsetRecord { next: 7, ..OffsetRecord::default() }));
        assert_eq!(OffsetRecord::decode(b"seven"), None);
    }
}
