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
    fn select(&self, parts: &[PartSize]) -> Option<std::ops::Range<usize>>;
}

/// Merges runs of similar-sized parts: a range qualifies when its biggest part is at most
/// `1 / min_ratio` of the range's total, so a big part is not rewritten for a small one; the
/// longest qualifying range wins, then the one with the fewest bytes.
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
    fn select(&self, parts: &[PartSize]) -> Option<std::ops::Range<usize>> {
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
                if len < 2 || (max as f64) * self.min_ratio > sum as f64 {
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
        assert_eq!(selector.select(&sizes(&[10, 10, 10, 10])), Some(0..4));
    }

    #[test]
    fn leaves_a_big_part_alone_for_one_small_part() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[1000, 10])), None);
        assert_eq!(selector.select(&sizes(&[1000, 10, 10, 10])), Some(1..4));
    }

    #[test]
    fn nothing_to_merge_in_one_part() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&sizes(&[10])), None);
        assert_eq!(selector.select(&[]), None);
    }

    #[test]
    fn respects_the_part_count_limit() {
        let selector = SizeTieredSelector { max_parts: 3, ..Default::default() };
        assert_eq!(selector.select(&sizes(&[5, 5, 5, 5, 5])).map(|r| r.len()), Some(3));
    }
}
