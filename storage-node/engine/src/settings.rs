//! MergeTree table settings (`SETTINGS k = v` at CREATE TABLE), with ClickHouse's defaults.

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableSettings {
    pub index_granularity: u64,
    /// How many recent insert block ids a non-replicated table remembers; 0 disables dedup.
    pub non_replicated_deduplication_window: u64,
    /// Active parts in one partition at which an insert is delayed.
    pub parts_to_delay_insert: u64,
    /// Active parts in one partition at which an insert fails with TOO_MANY_PARTS.
    pub parts_to_throw_insert: u64,
    /// Longest delay of one insert, in seconds.
    pub max_delay_to_insert: u64,
    pub allow_experimental_replacing_merge_with_cleanup: bool,
    pub allow_dimensions_outside_sorting_key: bool,
    pub allow_nullable_key: bool,
    /// Parts larger than this are not picked by background merges.
    pub max_bytes_to_merge_at_max_space_in_pool: u64,
    /// At most this many parts go into one background merge.
    pub max_parts_to_merge_at_once: u64,
    /// Parts whose youngest is at least this many seconds old merge whatever their sizes;
    /// 0 disables it.
    pub min_age_to_force_merge_seconds: u64,
    /// The forced merge above takes a whole partition or nothing.
    pub min_age_to_force_merge_on_partition_only: bool,
    /// How many recent insert block ids a replicated table keeps in `blocks/`; 0 disables dedup.
    pub replicated_deduplication_window: u64,
    /// Block ids younger than this many seconds are kept even past the window.
    pub replicated_deduplication_window_seconds: u64,
    /// Log entries kept for replicas that fell behind; one further behind is marked lost.
    pub max_replicated_logs_to_keep: u64,
    pub min_replicated_logs_to_keep: u64,
    /// Seconds between two cleanups of a replicated table's old log entries and blocks.
    pub cleanup_delay_period: u64,
    /// Up to this many seconds more, at random, so replicas do not clean in step.
    pub cleanup_delay_period_random_add: u64,
    /// A replica fetches a merged part from one that has it instead of merging, when the
    /// merge's log entry is at least this many seconds old and its sources at least
    /// `prefer_fetch_merged_part_size_threshold` bytes.
    pub prefer_fetch_merged_part_time_threshold: u64,
    pub prefer_fetch_merged_part_size_threshold: u64,
    /// This replica never merges: it fetches every merged part.
    pub always_fetch_merged_part: bool,
}

impl Default for TableSettings {
    fn default() -> Self {
        TableSettings {
            index_granularity: 8192,
            non_replicated_deduplication_window: 0,
            parts_to_delay_insert: 1000,
            parts_to_throw_insert: 3000,
            max_delay_to_insert: 1,
            allow_experimental_replacing_merge_with_cleanup: false,
            allow_dimensions_outside_sorting_key: false,
            allow_nullable_key: false,
            max_bytes_to_merge_at_max_space_in_pool: 150 * 1024 * 1024 * 1024,
            max_parts_to_merge_at_once: 100,
            min_age_to_force_merge_seconds: 0,
            min_age_to_force_merge_on_partition_only: false,
            replicated_deduplication_window: 10000,
            replicated_deduplication_window_seconds: 3600,
            max_replicated_logs_to_keep: 1000,
            min_replicated_logs_to_keep: 10,
            cleanup_delay_period: 30,
            cleanup_delay_period_random_add: 10,
            prefer_fetch_merged_part_time_threshold: 3600,
            prefer_fetch_merged_part_size_threshold: 10 * 1024 * 1024 * 1024,
            always_fetch_merged_part: false,
        }
    }
}

impl TableSettings {
    /// Applies one `name = value` pair; `value` is the literal's text.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let uint = |v: &str| -> Result<u64> {
            v.parse().map_err(|_| EngineError::BadSetting {
                name: name.to_string(),
                message: format!("expected a non-negative integer, found '{v}'"),
            })
        };
        let flag = |v: &str| -> Result<bool> {
            match v.to_ascii_lowercase().as_str() {
                "1" | "true" => Ok(true),
                "0" | "false" => Ok(false),
                _ => Err(EngineError::BadSetting {
                    name: name.to_string(),
                    message: format!("expected 0 or 1, found '{v}'"),
                }),
            }
        };
        match name {
            "index_granularity" => {
                let g = uint(value)?;
                if g == 0 {
                    return Err(EngineError::BadSetting {
                        name: name.into(),
                        message: "index_granularity must be positive".into(),
                    });
                }
                self.index_granularity = g;
            }
            "non_replicated_deduplication_window" => self.non_replicated_deduplication_window = uint(value)?,
            "parts_to_delay_insert" => self.parts_to_delay_insert = uint(value)?,
            "parts_to_throw_insert" => self.parts_to_throw_insert = uint(value)?,
            "max_delay_to_insert" => self.max_delay_to_insert = uint(value)?,
            "allow_experimental_replacing_merge_with_cleanup" => {
                self.allow_experimental_replacing_merge_with_cleanup = flag(value)?
            }
            "allow_dimensions_outside_sorting_key" => self.allow_dimensions_outside_sorting_key = flag(value)?,
            "allow_nullable_key" => self.allow_nullable_key = flag(value)?,
            "max_bytes_to_merge_at_max_space_in_pool" => self.max_bytes_to_merge_at_max_space_in_pool = uint(value)?,
            "max_parts_to_merge_at_once" => self.max_parts_to_merge_at_once = uint(value)?,
            "min_age_to_force_merge_seconds" => self.min_age_to_force_merge_seconds = uint(value)?,
            "min_age_to_force_merge_on_partition_only" => self.min_age_to_force_merge_on_partition_only = flag(value)?,
            "replicated_deduplication_window" => self.replicated_deduplication_window = uint(value)?,
            "replicated_deduplication_window_seconds" => self.replicated_deduplication_window_seconds = uint(value)?,
            "max_replicated_logs_to_keep" => self.max_replicated_logs_to_keep = uint(value)?,
            "min_replicated_logs_to_keep" => self.min_replicated_logs_to_keep = uint(value)?,
            "cleanup_delay_period" => self.cleanup_delay_period = uint(value)?,
            "cleanup_delay_period_random_add" => self.cleanup_delay_period_random_add = uint(value)?,
            "prefer_fetch_merged_part_time_threshold" => self.prefer_fetch_merged_part_time_threshold = uint(value)?,
            "prefer_fetch_merged_part_size_threshold" => self.prefer_fetch_merged_part_size_threshold = uint(value)?,
            "always_fetch_merged_part" => self.always_fetch_merged_part = flag(value)?,
            other => return Err(EngineError::UnknownSetting(other.to_string())),
        }
        Ok(())
    }
}
