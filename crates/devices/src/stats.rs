//! Device statistics, kept in one place ([`crate::Checked`]) for every model.

use crate::IoKind;
use serde::{Deserialize, Serialize};

/// Latency distribution of completed ops: exact count, sum, min and max, and a log-linear
/// histogram (8 sub-buckets per power of two, so percentiles are within 12.5 %).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// Bucket counts (see [`LatencySummary::bucket_of`]); empty until the first sample.
    pub buckets: Vec<u64>,
}

const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB; // values below this get one bucket each
const BUCKETS: usize = (LINEAR + (64 - (SUB_BITS + 1) as u64) * SUB) as usize;

impl LatencySummary {
    /// Histogram bucket of a latency.
    pub fn bucket_of(v: u64) -> usize {
        if v < LINEAR {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
        let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
        (LINEAR + (e - SUB_BITS - 1) as u64 * SUB + sub) as usize
    }

    /// Smallest latency that falls into bucket `b`.
    fn bucket_low(b: usize) -> u64 {
        let b = b as u64;
        if b < LINEAR {
            return b;
        }
        let e = (b - LINEAR) / SUB + SUB_BITS as u64 + 1;
        let sub = (b - LINEAR) % SUB;
        (SUB + sub) << (e - SUB_BITS as u64)
    }

    pub fn record(&mut self, ns: u64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; BUCKETS];
            self.min_ns = ns;
        }
        self.count += 1;
        self.sum_ns += ns;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.buckets[Self::bucket_of(ns)] += 1;
    }

    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }

    /// Approximate `q`-quantile (0.0..=1.0): the lower edge of the bucket holding it, clamped
    /// to [min, max]; `q = 1` is the exact maximum.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        if rank >= self.count {
            return self.max_ns;
        }
        let mut seen = 0;
        for (b, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::bucket_low(b).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    pub fn merge(&mut self, other: &LatencySummary) {
        if other.count == 0 {
            return;
        }
        if self.buckets.is_empty() {
            *self = other.clone();
            return;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }
}

/// Counters for one kind of op. Ops are counted when they are returned by `advance`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindStats {
    /// Completed ops, failed ones included.
    pub ops: u64,
    /// Bytes of completed ops (failed ones included; flushes count 0).
    pub bytes: u64,
    /// Ops that completed with an error.
    pub errors: u64,
    /// Submit-to-completion time.
    pub latency: LatencySummary,
    /// The device's busy time ([`DeviceStats::busy_ns`]) attributed to this kind: every moment
    /// the device works is split among the kinds of the ops in it by their counts, so the
    /// kinds add up to the device's busy time (up to rounding).
    #[serde(default)]
    pub busy_ns: u64,
}

/// What a device did since it was built.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Indexed by [`IoKind::index`]: read, write, flush, trim.
    pub kinds: [KindStats; 4],
    /// Simulated time with at least one op in the device (queued or in service). Every model
    /// here is work-conserving, so that is the time the device was working. An interval that
    /// is still open counts up to the latest time the device has seen.
    pub busy_ns: u64,
    /// Ops submitted (valid or not).
    pub submitted: u64,
}

impl DeviceStats {
    pub fn kind(&self, k: IoKind) -> &KindStats {
        &self.kinds[k.index()]
    }
    pub fn kind_mut(&mut self, k: IoKind) -> &mut KindStats {
        &mut self.kinds[k.index()]
    }
    /// Completed ops of every kind.
    pub fn ops(&self) -> u64 {
        self.kinds.iter().map(|k| k.ops).sum()
    }
    /// Completed ops that failed.
    pub fn errors(&self) -> u64 {
        self.kinds.iter().map(|k| k.errors).sum()
    }
    pub fn bytes_read(&self) -> u64 {
        self.kind(IoKind::Read).bytes
    }
    pub fn bytes_written(&self) -> u64 {
        self.kind(IoKind::Write).bytes
    }
    /// Latency of every kind together.
    pub fn latency(&self) -> LatencySummary {
        let mut all = LatencySummary::default();
        for k in &self.kinds {
            all.merge(&k.latency);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_cover_their_values() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, u64::MAX / 3, u64::MAX]) {
            let b = LatencySummary::bucket_of(v);
            assert!(b < BUCKETS);
            assert!(b >= last || v > 5000);
            last = b;
            assert!(LatencySummary::bucket_low(b) <= v, "v={v} b={b}");
            if b + 1 < BUCKETS {
                assert!(LatencySummary::bucket_low(b + 1) > v, "v={v} b={b}");
            }
        }
    }

    #[test]
    fn quantiles_are_close() {
        let mut s = LatencySummary::default();
        for v in 1..=1000u64 {
            s.record(v * 1000);
        }
        let p50 = s.quantile_ns(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.13, "{p50}");
        assert_eq!(s.quantile_ns(1.0), 1_000_000);
        assert_eq!(s.quantile_ns(0.0), 1000);
        assert_eq!(s.min_ns, 1000);
        assert_eq!(s.mean_ns(), 500_500.0);
    }
}
