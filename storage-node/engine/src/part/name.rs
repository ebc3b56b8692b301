//! Part names: `<partition_id>_<min_block>_<max_block>_<level>[_<mutation>]`.

use std::cmp::Ordering;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartName {
    pub partition_id: String,
    pub min_block: u64,
    pub max_block: u64,
    pub level: u32,
}

impl PartName {
    /// Parses a directory name; `None` for anything that is not a part (tmp dirs, detached, …).
    pub fn parse(name: &str) -> Option<PartName> {
        let mut fields = name.rsplitn(4, '_');
        let level = fields.next()?.parse().ok()?;
        let max_block = fields.next()?.parse().ok()?;
        let min_block = fields.next()?.parse().ok()?;
        let partition_id = fields.next()?.to_string();
        // Partition ids are numbers joined by '-', hex hashes or `all`: never an underscore.
        let valid_id = !partition_id.is_empty() && partition_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid_id || min_block > max_block {
            return None;
        }
        Some(PartName { partition_id, min_block, max_block, level })
    }

    /// ClickHouse's `contains`: same partition, covering block range, and not lower level.
    pub fn covers(&self, other: &PartName) -> bool {
        self.partition_id == other.partition_id
            && self.min_block <= other.min_block
            && self.max_block >= other.max_block
            && self.level >= other.level
            && self != other
    }

    /// Order of parts inside a partition: by block range, which is insertion order. The merge
    /// tie-break rules (the newest part wins) depend on it.
    pub fn insertion_order(&self, other: &PartName) -> Ordering {
        (&self.partition_id, self.min_block, self.max_block, self.level).cmp(&(
            &other.partition_id,
            other.min_block,
            other.max_block,
            other.level,
        ))
    }
}

impl fmt::Display for PartName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}_{}_{}", self.partition_id, self.min_block, self.max_block, self.level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_covers() {
        let merged = PartName::parse("202610_1_4_2").expect("part name");
        assert_eq!(merged.to_string(), "202610_1_4_2");
        let source = PartName::parse("202610_2_2_0").expect("part name");
        assert!(merged.covers(&source));
        assert!(!source.covers(&merged));
        assert!(PartName::parse("tmp_insert_all_1_1_0").is_none());
        assert_eq!(PartName::parse("-5_1_1_0").expect("negative id").partition_id, "-5");
        assert_eq!(PartName::parse("1--5_3_3_1").expect("tuple id").partition_id, "1--5");
    }
}
