//! Choosing which parts to merge: a size-tiered selector inside one partition.
//!
//! Only adjacent parts (by block range) can be merged, since the result covers one contiguous
//! range of blocks. The selector is a pure function of part sizes, so it is tested and
//! benchmarked on plain numbers.

/// What the selector knows of one part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartSize {
    pub bytes: u64,
    pub rows: u64,
}

pub trait MergeSelector: Send + Sync {
    /// The range of `parts` (adjacent, one partition, in block order) to merge next, if any.
    /// `pressure`, from 0 to 1, says how urgently the partition needs fewer parts.
    fn select(&self, parts: &[PartSize], pressure: f64) -> Option<std::ops::Range<usize>>;
}

/// How urgently a partition of `count` active parts needs merges, from 0 to 1. As in
/// ClickHouse's merge selector, which lowers its size-ratio base between
/// `min_parts_to_lower_base` (10) and `max_parts_to_lower_base` (50) parts; and urgent at
/// once from `parts_to_delay_insert` on, where inserts start to be delayed and then refused.
pub fn merge_pressure(count: usize, parts_to_delay_insert: u64) -> f64 {
    const LOWER_FROM: f64 = 10.0;
    const LOWER_TO: f64 = 50.0;
    if count as u64 >= parts_to_delay_insert {
        return 1.0;
    }
    ((count as f64 - LOWER_FROM) / (LOWER_TO - LOWER_FROM)).clamp(0.0, 1.0)
}

/// Merges runs of similar-sized parts: a range qualifies when its biggest part is at most
/// `1 / min_ratio` of the range's total, so a big part is not rewritten for a small one; the
/// longest qualifying range wins, then the one with the fewest bytes. Under pressure the
/// ratio falls towards 1, where any run of two or more parts qualifies: without that, a big
/// part beside a smaller one could never merge, and a partition stuck at
/// `parts_to_throw_insert` would refuse every insert.
#[derive(Debug, Clone)]
pub struct SizeTieredSelector {
    pub max_parts: usize,
    pub max_bytes: u64,
    pub min_ratio: f64,
}

impl Default for SizeTieredSelector {
    fn default() -> Self {
        SizeTieredSelector { max_parts: 100, max_bytes: 150 << 30, min_ratio: 1.5 }
    }
}

impl MergeSelector for SizeTieredSelector {
    fn select(&self, parts: &[PartSize], pressure: f64) -> Option<std::ops::Range<usize>> {
        let min_ratio = self.min_ratio - (self.min_ratio - 1.0) * pressure.clamp(0.0, 1.0);
        let mut best: Option<(usize, u64, std::ops::Range<usize>)> = None;
        for start in 0..parts.len() {
            let (mut sum, mut max) = (0u64, 0u64);
            for (end, part) in parts.iter().enumerate().take(start + self.max_parts).skip(start) {
                // Count empty parts as one byte so that they merge away too.
                let bytes = part.bytes.max(1);
                sum += bytes;
                max = max.max(bytes);
                if sum > self.max_bytes {
                    break;
                }
                let len = end - start + 1;
                if len < 2 || (max as f64) * min_ratio > sum as f64 {
                    continue;
                }
                let better = match &best {
                    None => true,
                    Some((best_len, best_sum, _)) => len > *best_len || (len == *best_len && sum < *best_sum),
                };
                if better {
                    best = Some((len, sum, start..end + 1));
                }
            }
        }
        best.map(|(_, _, range)| range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(bytes: &[u64]) -> Vec<PartSize> {
        bytes.iter().map(|&b| PartSize { bytes: b, rows: b }).collect()
    }

    #[test]
    fn merges_equal_parts_together() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[10, 10, 10, 10]), 0.0), Some(0..4));
    }

    #[test]
    fn leaves_a_big_part_alone_for_one_small_part() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[1000, 10]), 0.0), None);
        assert_eq!(selector.select(&sizes(&[1000, 10, 10, 10]), 0.0), Some(1..4));
    }

    #[test]
    fn nothing_to_merge_in_one_part() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[10]), 0.0), None);
        assert_eq!(selector.select(&[], 0.0), None);
    }

    #[test]
    fn under_pressure_a_big_part_merges_with_smaller_ones() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[1000, 100, 10]), 0.0), None);
        assert_eq!(selector.select(&sizes(&[1000, 100, 10]), 1.0), Some(0..3));
        assert_eq!(merge_pressure(3, 1000), 0.0);
        assert_eq!(merge_pressure(30, 1000), 0.5);
        assert_eq!(merge_pressure(3, 2), 1.0);
    }

    #[test]
    fn respects_the_part_count_limit() {
        let selector = SizeTieredSelector { max_parts: 3, ..Default::default() };
        assert_eq!(selector.select(&sizes(&[5, 5, 5, 5, 5]), 0.0).map(|r| r.len()), Some(3));
    }
}
