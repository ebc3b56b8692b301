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

    /// Reads a record back. Bytes that are not one are an error, never a default: a position
    /// read as "from the beginning" would insert everything again.
    pub fn decode(bytes: &[u8]) -> Result<OffsetRecord, String> {
        serde_json::from_slice(bytes).map_err(|e| {
            let shown: String = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).escape_default().collect();
            format!("not an offset record ({e}): {} bytes starting \"{shown}\"", bytes.len())
        })
    }
}

/// Checks a node path as ZooKeeper's `PathUtils.validatePath` does, saying which rule it
/// breaks: a writer's offset path is checked before anything is written for its block.
pub fn validate_node_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if !path.starts_with('/') {
        return Err(format!("path {path:?} must start with '/'"));
    }
    if path == "/" {
        return Err("the path is the root node".into());
    }
    if path.ends_with('/') {
        return Err(format!("path {path:?} must not end with '/'"));
    }
    if let Some(bad) = path[1..].split('/').find(|c| c.is_empty() || *c == "." || *c == "..") {
        return Err(format!("path {path:?} has an empty, '.' or '..' component ({bad:?})"));
    }
    if let Some(c) = path.chars().find(
        |&c| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{f000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}'),
    ) {
        return Err(format!("path {path:?} holds the character {:?}, which ZooKeeper does not allow", c));
    }
    Ok(())
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
        assert_eq!(OffsetRecord::decode(&record.encode()), Ok(record));
        assert_eq!(OffsetRecord::decode(br#"{"next":7}"#), Ok(OffsetRecord { next: 7, ..OffsetRecord::default() }));
        for junk in [&b"seven"[..], b"", b"\xff\xfe", b"{}", b"{\"next\":\"x\"}"] {
            assert!(OffsetRecord::decode(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn node_paths_follow_zookeepers_rules() {
        assert!(validate_node_path(&offset_path("p", "t", "topic", 3)).is_ok());
        for bad in ["", "a", "/", "/a//b", "/a/", "/a/./b", "/a/../b", "/a\u{0}b", "/a\nb"] {
            assert!(validate_node_path(bad).is_err(), "{bad:?}");
        }
    }
}
