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
    /// Seconds since the part was written.
    pub age_s: f64,
}

/// How crowded a partition is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// From 0 (up to 10 parts) to 1 (50 parts or more).
    pub crowding: f64,
    /// The partition is at `parts_to_delay_insert`: inserts are being delayed, then refused.
    pub urgent: bool,
}

pub trait MergeSelector: Send + Sync {
    /// The range of `parts` (adjacent, one partition, in block order) to merge next, if any.
    fn select(&self, parts: &[PartSize], pressure: Pressure) -> Option<std::ops::Range<usize>>;
}

/// The pressure on a partition of `count` active parts. As in ClickHouse's merge selector,
/// which lowers its base between `min_parts_to_lower_base` (10) and
/// `max_parts_to_lower_base` (50) parts.
pub fn merge_pressure(count: usize, parts_to_delay_insert: u64) -> Pressure {
    const LOWER_FROM: f64 = 10.0;
    const LOWER_TO: f64 = 50.0;
    Pressure {
        crowding: ((count as f64 - LOWER_FROM) / (LOWER_TO - LOWER_FROM)).clamp(0.0, 1.0),
        urgent: count as u64 >= parts_to_delay_insert,
    }
}

/// ClickHouse's rule for which ranges may merge (its `SimpleMergeSelector`), in its terms:
///
/// - A range qualifies when (its bytes + n × the fixed cost) / (its biggest part + the fixed
///   cost) reaches the *base*: 5 equal parts at least, so every row is rewritten about
///   log₅ of the data's growth, where merging pairs would rewrite it log₂ times. The fixed
///   cost (5 MiB per part) makes small parts count as similar.
/// - The base falls linearly towards 2 (any two similar parts) as the partition gets
///   crowded (10 to 50 parts) and as the range's youngest part ages: from 10 s on, down to 2
///   at one hour for small ranges and at 30 days for 100 GiB ones (a log scale in between).
///   Merges are therefore wide while data streams in, and small leftovers still merge later.
/// - Among qualifying ranges the one with the lowest (bytes + n × fixed cost) / (n − 1.9)
///   wins: the cheapest merge per part removed, longer ranges preferred.
///
/// - With `min_age_to_force_merge_seconds`, a range whose youngest part is at least that old
///   qualifies whatever its sizes (with `…_on_partition_only`, only the whole partition does).
///
/// One rule of our own: once the partition is at `parts_to_delay_insert` the base is 1, so any
/// adjacent parts merge. Without it a big part beside smaller ones never qualifies, and a
/// partition stuck at `parts_to_throw_insert` would refuse every insert.
#[derive(Debug, Clone)]
pub struct SizeTieredSelector {
    pub max_parts: usize,
    pub max_bytes: u64,
    pub base: f64,
    pub fixed_cost: u64,
    /// `min_age_to_force_merge_seconds`; 0 disables it.
    pub force_after_s: f64,
    pub force_whole_partition_only: bool,
}

impl Default for SizeTieredSelector {
    fn default() -> Self {
        SizeTieredSelector {
            max_parts: 100,
            max_bytes: 150 << 30,
            base: 5.0,
            fixed_cost: 5 << 20,
            force_after_s: 0.0,
            force_whole_partition_only: false,
        }
    }
}

/// 0 below `min`, 1 above `max`, linear in between.
fn unit_ramp(value: f64, min: f64, max: f64) -> f64 {
    if value <= min {
        0.0
    } else if value >= max {
        1.0
    } else {
        (value - min) / (max - min)
    }
}

fn lerp(from: f64, to: f64, t: f64) -> f64 {
    from + (to - from) * t
}

impl SizeTieredSelector {
    /// The base a range of `sum` bytes whose youngest part is `min_age_s` old must reach.
    fn base(&self, sum: f64, min_age_s: f64, pressure: Pressure) -> f64 {
        const MIN_SIZE: f64 = (1u64 << 20) as f64;
        const MAX_SIZE: f64 = (100u64 << 30) as f64;
        const MIN_AGE_S: f64 = 10.0;
        const MAX_AGE_S_SMALL: f64 = 3600.0;
        const MAX_AGE_S_BIG: f64 = 30.0 * 86400.0;
        if pressure.urgent {
            return 1.0;
        }
        let size = unit_ramp((1.0 + sum).ln(), (1.0 + MIN_SIZE).ln(), (1.0 + MAX_SIZE).ln());
        let age = unit_ramp(min_age_s, MIN_AGE_S, lerp(MAX_AGE_S_SMALL, MAX_AGE_S_BIG, size));
        lerp(self.base, 2.0, (age + pressure.crowding).min(1.0))
    }
}

impl MergeSelector for SizeTieredSelector {
    fn select(&self, parts: &[PartSize], pressure: Pressure) -> Option<std::ops::Range<usize>> {
        let fixed = self.fixed_cost as f64;
        let mut best: Option<(f64, std::ops::Range<usize>)> = None;
        for start in 0..parts.len() {
            let (mut sum, mut max, mut min_age) = (0u64, 0u64, f64::INFINITY);
            for (end, part) in parts.iter().enumerate().take(start + self.max_parts).skip(start) {
                sum += part.bytes;
                max = max.max(part.bytes);
                min_age = min_age.min(part.age_s);
                if sum > self.max_bytes {
                    break;
                }
                let n = (end - start + 1) as f64;
                if n < 2.0 {
                    continue;
                }
                let ratio = (sum as f64 + n * fixed) / (max as f64 + fixed);
                let whole = start == 0 && end + 1 == parts.len();
                let forced = self.force_after_s > 0.0
                    && min_age >= self.force_after_s
                    && (whole || !self.force_whole_partition_only);
                if !forced && ratio < self.base(sum as f64, min_age, pressure) {
                    continue;
                }
                let score = (sum as f64 + n * fixed) / (n - 1.9);
                if best.as_ref().is_none_or(|(best_score, _)| score < *best_score) {
                    best = Some((score, start..end + 1));
                }
            }
        }
        best.map(|(_, range)| range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const CALM: Pressure = Pressure { crowding: 0.0, urgent: false };

    fn parts(bytes: &[u64], age_s: f64) -> Vec<PartSize> {
        bytes.iter().map(|&b| PartSize { bytes: b, rows: b, age_s }).collect()
    }

    #[test]
    fn parts_older_than_min_age_to_force_merge_merge_whatever_their_sizes() {
        let forced = SizeTieredSelector { force_after_s: 60.0, ..Default::default() };
        let (big_and_small, young) = (parts(&[900 * MIB, MIB], 61.0), parts(&[900 * MIB, MIB], 59.0));
        assert_eq!(SizeTieredSelector::default().select(&big_and_small, CALM), None);
        assert_eq!(forced.select(&big_and_small, CALM), Some(0..2));
        assert_eq!(forced.select(&young, CALM), None, "the youngest part decides");
        let mut mixed = parts(&[900 * MIB, MIB], 61.0);
        mixed.push(PartSize { bytes: MIB, rows: MIB, age_s: 1.0 });
        assert_eq!(forced.select(&mixed, CALM), Some(0..2), "a range of old parts within the partition");
        let whole_only = SizeTieredSelector { force_whole_partition_only: true, ..forced };
        assert_eq!(whole_only.select(&mixed, CALM), None, "on_partition_only: the whole partition or nothing");
        assert_eq!(whole_only.select(&big_and_small, CALM), Some(0..2));
    }

    #[test]
    fn fresh_parts_wait_for_five_of_a_size() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&parts(&[MIB; 4], 1.0), CALM), None);
        assert_eq!(selector.select(&parts(&[MIB; 5], 1.0), CALM), Some(0..5));
        // The fixed cost makes small parts alike: a 1 KiB part counts nearly as a 1 MiB one.
        assert_eq!(selector.select(&parts(&[MIB, MIB, 1024, MIB, MIB], 1.0), CALM), None);
        assert_eq!(selector.select(&parts(&[MIB, MIB, 1024, MIB, MIB, MIB], 1.0), CALM), Some(0..6));
    }

    #[test]
    fn a_big_part_is_left_alone_for_small_ones() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&parts(&[1000 * MIB, MIB, MIB, MIB, MIB], 1.0), CALM), None);
        assert_eq!(selector.select(&parts(&[1000 * MIB, MIB, MIB, MIB, MIB, MIB], 1.0), CALM), Some(1..6));
    }

    #[test]
    fn old_and_crowded_parts_merge_by_two() {
        let selector = SizeTieredSelector::default();
        let two = parts(&[MIB, MIB], 1.0);
        assert_eq!(selector.select(&two, CALM), None);
        assert_eq!(selector.select(&parts(&[1024, 1024], 60.0), CALM), None, "a minute old");
        assert_eq!(selector.select(&parts(&[1024, 1024], 3600.0), CALM), Some(0..2), "an hour old");
        // Bigger ranges need more age: 2 MiB is not enough after an hour.
        assert_eq!(selector.select(&parts(&[MIB, MIB], 3600.0), CALM), None);
        assert_eq!(selector.select(&two, Pressure { crowding: 1.0, urgent: false }), Some(0..2), "50 parts");
        assert_eq!(merge_pressure(3, 1000), CALM);
        assert_eq!(merge_pressure(30, 1000).crowding, 0.5);
    }

    #[test]
    fn urgent_partitions_merge_a_big_part_with_a_small_one() {
        let selector = SizeTieredSelector::default();
        let uneven = parts(&[1000 * MIB, 100 * MIB, 10 * MIB], 1.0);
        assert_eq!(selector.select(&uneven, Pressure { crowding: 1.0, urgent: false }), None);
        let urgent = merge_pressure(3, 3);
        assert!(urgent.urgent);
        assert!(selector.select(&uneven, urgent).is_some());
    }

    #[test]
    fn nothing_to_merge_in_one_part_and_the_part_count_is_bounded() {
        let selector = SizeTieredSelector::default();
        assert_eq!(selector.select(&parts(&[MIB], 1e6), CALM), None);
        assert_eq!(selector.select(&[], CALM), None);
        let limited = SizeTieredSelector { max_parts: 3, ..Default::default() };
        assert_eq!(limited.select(&parts(&[MIB; 8], 1.0), CALM).map(|r| r.len()), None, "5 needed, 3 allowed");
        let crowded = Pressure { crowding: 1.0, urgent: false };
        assert_eq!(limited.select(&parts(&[MIB; 8], 1.0), crowded).map(|r| r.len()), Some(3));
    }
}
