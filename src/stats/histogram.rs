//! A latency histogram that many threads add to without a lock: log-linear
//! buckets, 8 per power of two (so a bucket is at most 1/8 of its lower
//! edge wide), from 128 ns to 2^36 ns (~68.7 s), plus one bucket below and
//! one above. Adding is one bucket increment and one add to the sum, both
//! relaxed atomics; the memory is fixed (235 words) however many samples
//! come. Percentiles are read from the buckets, so they are exact to
//! within the width of the bucket they fall in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two: 2^3.
const SUB_BITS: u32 = 3;
const SUBS: usize = 1 << SUB_BITS;
/// The first power of two split into sub-buckets: 128 ns (everything
/// shorter shares bucket 0).
const MIN_EXP: u32 = 7;
/// The first power of two not split: 2^36 ns, ~68.7 s (everything at least
/// that long shares the last bucket).
const MAX_EXP: u32 = 36;

/// Below 128 ns, 8 per power of two up to 2^36 ns, and at or above it.
pub const BUCKETS: usize = 1 + (MAX_EXP - MIN_EXP) as usize * SUBS + 1;

/// The bucket of a duration of `ns` nanoseconds.
fn bucket(ns: u64) -> usize {
    if ns < 1 << MIN_EXP {
        return 0;
    }
    let exp = 63 - ns.leading_zeros();
    if exp >= MAX_EXP {
        return BUCKETS - 1;
    }
    // The 3 bits below the leading one pick the sub-bucket.
    let sub = (ns >> (exp - SUB_BITS)) as usize & (SUBS - 1);
    1 + (exp - MIN_EXP) as usize * SUBS + sub
}

/// The nanoseconds bucket `i` holds: `[lower, upper)`; the last bucket's
/// upper edge is `u64::MAX`.
fn edges(i: usize) -> (u64, u64) {
    if i == 0 {
        return (0, 1 << MIN_EXP);
    }
    if i == BUCKETS - 1 {
        return (1 << MAX_EXP, u64::MAX);
    }
    let exp = MIN_EXP + ((i - 1) / SUBS) as u32;
    let width = 1u64 << (exp - SUB_BITS);
    let lower = (SUBS + (i - 1) % SUBS) as u64 * width;
    (lower, lower + width)
}

/// What a bucket stands for in a percentile: its middle (the last bucket,
/// unbounded, its lower edge).
fn middle(i: usize) -> u64 {
    let (lower, upper) = edges(i);
    if i == BUCKETS - 1 {
        lower
    } else {
        lower + (upper - lower) / 2
    }
}

pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A histogram read at one time, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// The upper edge of the highest bucket anything fell in: no sample
    /// was longer (except in the last bucket, whose lower edge it is).
    pub max: f64,
}

impl Histogram {
    pub fn add(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The count and percentiles now, or None if nothing was added. Adds
    /// racing with the read may be seen in part (a bucket but not yet the
    /// sum); once adds have stopped the figures are exact.
    pub fn summary(&self) -> Option<Summary> {
        let counts: [u64; BUCKETS] =
            std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed));
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return None;
        }
        // The bucket holding the sample of rank ceil(q * count), from 1.
        let at = |q: f64| -> f64 {
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for (i, &n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return middle(i) as f64;
                }
            }
            unreachable!("the ranks stop at the count")
        };
        let top = counts.iter().rposition(|&n| n > 0).unwrap_or(0);
        let (lower, upper) = edges(top);
        Some(Summary {
            count,
            mean: self.sum_ns.load(Ordering::Relaxed) as f64 / count as f64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: if top == BUCKETS - 1 { lower } else { upper } as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_each_at_most_an_eighth_wide() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(127), 0);
        assert_eq!(bucket(128), 1);
        assert_eq!(bucket(143), 1);
        assert_eq!(bucket(144), 2);
        assert_eq!(bucket(255), 8);
        assert_eq!(bucket(256), 9);
        assert_eq!(bucket((1 << MAX_EXP) - 1), BUCKETS - 2);
        assert_eq!(bucket(1 << MAX_EXP), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for i in 0..BUCKETS {
            let (lower, upper) = edges(i);
            assert_eq!(bucket(lower), i, "lower edge of bucket {i}");
            assert_eq!(bucket(upper - 1), i, "top of bucket {i}");
            if i + 1 < BUCKETS {
                assert_eq!(edges(i + 1).0, upper, "bucket {i} meets the next");
            }
            if i > 0 && i < BUCKETS - 1 {
                assert!((upper - lower) * 8 <= lower, "bucket {i}: {lower}..{upper}");
            }
        }
        // From ~100 ns to ~60 s.
        assert!(edges(1).0 <= 128);
        assert!(edges(BUCKETS - 1).0 >= 60_000_000_000);
    }

    #[test]
    fn percentiles_of_a_known_distribution_fall_within_a_bucket() {
        let h = Histogram::default();
        // 1.000 to 10.999 us in 1 ns steps: uniform.
        for ns in 1_000..11_000u64 {
            h.add(Duration::from_nanos(ns));
        }
        let s = h.summary().unwrap();
        assert_eq!(s.count, 10_000);
        assert!((s.mean - 5_999.5).abs() < 1e-6, "the mean is exact: {s:?}");
        for (got, exact) in [(s.p50, 6_000.0), (s.p90, 10_000.0), (s.p99, 10_900.0)] {
            assert!(
                (got - exact).abs() <= exact / 8.0,
                "{got} against {exact}: {s:?}"
            );
        }
        assert!(s.max >= 10_999.0 && s.max <= 10_999.0 * 1.125, "{s:?}");
        assert!(s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max, "{s:?}");
    }

    #[test]
    fn a_rare_slow_request_shows_in_the_max_not_in_the_p99() {
        let h = Histogram::default();
        for _ in 0..999 {
            h.add(Duration::from_nanos(1_800));
        }
        h.add(Duration::from_millis(3));
        let s = h.summary().unwrap();
        assert_eq!(s.count, 1_000);
        // 1.8 us is in [1.792, 1.920) us, middle 1.856.
        assert_eq!((s.p50, s.p90, s.p99), (1_856.0, 1_856.0, 1_856.0));
        assert!(s.max > 3_000_000.0 && s.max <= 3_000_000.0 * 1.125, "{s:?}");
        assert!((s.mean - (999.0 * 1_800.0 + 3e6) / 1_000.0).abs() < 1e-6);
    }

    #[test]
    fn memory_is_fixed_whatever_is_added() {
        // 234 buckets and the sum: under 2 KiB per opcode.
        assert_eq!(std::mem::size_of::<Histogram>(), 235 * 8);
        let h = Histogram::default();
        assert_eq!(h.summary(), None);
        for d in [Duration::ZERO, Duration::MAX, Duration::from_secs(3600)] {
            h.add(d);
        }
        let s = h.summary().unwrap();
        assert_eq!(s.count, 3);
        assert_eq!(s.p50, (1u64 << MAX_EXP) as f64, "the last bucket's edge");
        assert_eq!(s.max, (1u64 << MAX_EXP) as f64);
    }

    #[test]
    fn adds_from_several_threads_sum_exactly() {
        let h = Histogram::default();
        const THREADS: u64 = 4;
        const EACH: u64 = 50_000;
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let h = &h;
                scope.spawn(move || {
                    for n in 0..EACH {
                        // 1 to 1,000 ns more per thread: several buckets.
                        h.add(Duration::from_nanos(1_000 * (t + 1) + n % 1_000));
                    }
                });
            }
        });
        let s = h.summary().unwrap();
        assert_eq!(s.count, THREADS * EACH);
        let sum: u64 = (0..THREADS)
            .map(|t| (0..EACH).map(|n| 1_000 * (t + 1) + n % 1_000).sum::<u64>())
            .sum();
        assert_eq!(h.sum_ns.load(Ordering::Relaxed), sum);
        let per_bucket: u64 = h.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(per_bucket, THREADS * EACH);
    }
}
