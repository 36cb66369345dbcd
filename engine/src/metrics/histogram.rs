//! Latency histograms that threads record into with atomic adds only: fixed buckets whose
//! bounds double from 1 µs, so that recording is a leading-zeros count and one add, with no
//! lock and no allocation.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Finite buckets: upper bounds 1 µs, 2 µs, 4 µs, ... 2^25 µs (about 34 s); one more
/// counts what is slower.
const FINITE: usize = 26;

/// A histogram recorded from many threads.
pub(crate) struct AtomicHistogram {
    /// Non-cumulative counts: bucket `k` (< [`FINITE`]) holds durations in
    /// `(2^(k-1), 2^k]` µs (bucket 0 everything up to 1 µs); the last, the rest.
    buckets: [AtomicU64; FINITE + 1],
    /// Sum of the recorded durations in nanoseconds (saturating in practice after 584
    /// years of recorded time).
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> AtomicHistogram {
        AtomicHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// The bucket of a duration of `micros` (rounded up) microseconds.
fn bucket(micros: u64) -> usize {
    if micros <= 1 {
        return 0;
    }
    // The smallest k with 2^k >= micros.
    let k = (u64::BITS - (micros - 1).leading_zeros()) as usize;
    k.min(FINITE)
}

impl AtomicHistogram {
    /// Counts one duration. Two atomic adds; allocates nothing.
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket(ns.div_ceil(1000))].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// What it holds now (the buckets read one after another: a snapshot taken while
    /// threads record may count a duration in the sum and not yet in its bucket).
    pub fn snapshot(&self) -> Histogram {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        Histogram {
            buckets: counts
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let bound = (k < FINITE).then(|| Duration::from_micros(1 << k));
                    (bound, n)
                })
                .collect(),
            count: counts.iter().sum(),
            sum: Duration::from_nanos(self.sum_ns.load(Relaxed)),
        }
    }
}

/// A latency histogram as [`Agent::metrics`](crate::Agent::metrics) reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Each bucket's upper bound (`None`: no bound, the slowest) and how many durations
    /// fell in it and not in an earlier one (counts are not cumulative). Bounds double
    /// from 1 µs.
    pub buckets: Vec<(Option<Duration>, u64)>,
    /// How many durations were recorded.
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
}

impl Histogram {
    /// An upper bound of the `q`-quantile (`0.0..=1.0`): the bound of the bucket it falls
    /// in; `None` with nothing recorded or when it falls in the unbounded bucket.
    pub fn quantile_bound(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        // The rank of the quantile, at least the first recorded duration.
        #[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]
        #[allow(clippy::cast_possible_truncation)]
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(bound, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return bound;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_the_bucket_of_their_power_of_two() {
        let h = AtomicHistogram::default();
        for us in [0, 1, 2, 3, 4, 5, 1000, 1024, 1025] {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_secs(3600));
        let s = h.snapshot();
        assert_eq!(s.count, 10);
        let at = |us: u64| {
            s.buckets
                .iter()
                .find(|(b, _)| *b == Some(Duration::from_micros(us)))
                .map(|&(_, n)| n)
        };
        assert_eq!(at(1), Some(2)); // 0 and 1 µs
        assert_eq!(at(2), Some(1));
        assert_eq!(at(4), Some(2)); // 3 and 4
        assert_eq!(at(8), Some(1)); // 5
        assert_eq!(at(1024), Some(2)); // 1000 and 1024
        assert_eq!(at(2048), Some(1)); // 1025
        assert_eq!(s.buckets.last(), Some(&(None, 1))); // an hour
        assert_eq!(
            s.sum,
            Duration::from_micros(1 + 2 + 3 + 4 + 5 + 1000 + 1024 + 1025)
                + Duration::from_secs(3600)
        );
        // The 5th of 10 sorted (0, 1, 2, 3, 4, ...) is 4 µs.
        assert_eq!(s.quantile_bound(0.5), Some(Duration::from_micros(4)));
        assert_eq!(s.quantile_bound(0.0), Some(Duration::from_micros(1)));
        assert_eq!(s.quantile_bound(1.0), None);
        assert_eq!(Histogram::default().quantile_bound(0.5), None);
    }
}
