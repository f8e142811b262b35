//! Closed-loop load generator in simulated time: keep `queue_depth` ops outstanding, submit
//! the next op the moment one completes, and report IOPS and MB/s. The simulator reuses it
//! for device calibration; the physics tests use it too.

use crate::{Device, IoKind, IoOp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// What a closed-loop run measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// Ops completed (errors included).
    pub ops: u64,
    pub errors: u64,
    /// Bytes of completed reads and writes.
    pub bytes: u64,
    pub start_ns: u64,
    /// Time of the last completion.
    pub end_ns: u64,
    pub iops: f64,
    /// 10^6 bytes per second.
    pub mb_s: f64,
    pub mean_latency_ns: f64,
    pub max_latency_ns: u64,
}

impl BenchResult {
    pub fn elapsed_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// Drives `dev` from `start_ns` with up to `queue_depth` of the `ops` outstanding until all
/// have completed. `dev` should have nothing else outstanding (ids 0, 1, 2, ... are used).
/// Returns the measured rates in simulated time.
pub fn closed_loop<I>(
    dev: &mut dyn Device,
    start_ns: u64,
    queue_depth: usize,
    ops: I,
) -> BenchResult
where
    I: IntoIterator<Item = IoOp>,
{
    assert!(queue_depth > 0, "queue depth must be > 0");
    let mut it = ops.into_iter();
    let mut now = start_ns;
    // id -> (submit time, bytes); ids are dense so a Vec indexed by id works.
    let mut meta: Vec<(u64, u64)> = Vec::new();
    let mut in_flight = 0usize;
    let mut r = BenchResult {
        start_ns,
        end_ns: start_ns,
        ..BenchResult::default()
    };
    let mut lat_sum = 0u128;
    let submit = |dev: &mut dyn Device, now: u64, meta: &mut Vec<(u64, u64)>, op: IoOp| {
        let bytes = match op.kind {
            IoKind::Read | IoKind::Write => op.len,
            IoKind::Flush | IoKind::Trim => 0,
        };
        dev.submit(now, meta.len() as u64, op);
        meta.push((now, bytes));
    };
    let mut done = Vec::new();
    let mut pending_ops = Vec::new();
    while in_flight < queue_depth {
        match it.next() {
            Some(op) => {
                submit(dev, now, &mut meta, op);
                in_flight += 1;
            }
            None => break,
        }
    }
    while in_flight > 0 {
        let Some(t) = dev.next_completion() else {
            panic!(
                "{}: {in_flight} ops outstanding but no next completion",
                dev.name()
            );
        };
        now = now.max(t);
        dev.advance(now, &mut done);
        for c in done.drain(..) {
            // Ids beyond ours belong to someone else.
            let Some(&(t0, bytes)) = meta.get(c.id as usize) else {
                continue;
            };
            in_flight -= 1;
            r.ops += 1;
            r.errors += c.result.is_err() as u64;
            r.bytes += bytes;
            r.end_ns = r.end_ns.max(c.time_ns);
            let lat = c.time_ns - t0;
            lat_sum += lat as u128;
            r.max_latency_ns = r.max_latency_ns.max(lat);
            if let Some(op) = it.next() {
                pending_ops.push(op);
            }
        }
        for op in pending_ops.drain(..) {
            submit(dev, now, &mut meta, op);
            in_flight += 1;
        }
    }
    let secs = r.elapsed_ns() as f64 / 1e9;
    if secs > 0.0 {
        r.iops = r.ops as f64 / secs;
        r.mb_s = r.bytes as f64 / 1e6 / secs;
    }
    if r.ops > 0 {
        r.mean_latency_ns = lat_sum as f64 / r.ops as f64;
    }
    r
}

/// `n` ops of `kind` and `len` bytes at random `align`-aligned offsets within
/// `[0, span_bytes)`, seeded.
pub fn random_ops(
    kind: IoKind,
    len: u64,
    align: u64,
    span_bytes: u64,
    n: u64,
    seed: u64,
) -> impl Iterator<Item = IoOp> {
    assert!(align > 0 && len <= span_bytes, "bad random workload");
    let slots = (span_bytes - len) / align + 1;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(move |_| IoOp::new(kind, rng.gen_range(0..slots) * align, len))
}

/// `n` back-to-back ops of `kind` and `len` bytes from `start`.
pub fn sequential_ops(kind: IoKind, len: u64, start: u64, n: u64) -> impl Iterator<Item = IoOp> {
    (0..n).map(move |i| IoOp::new(kind, start + i * len, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checked, Ram, RamConfig};

    #[test]
    fn ram_bandwidth_bound() {
        let cfg = RamConfig {
            latency_us: 0.0,
            bandwidth_mb_s: 1000.0,
            ..RamConfig::default()
        };
        let mut dev = Checked::new(Ram::new(cfg).unwrap());
        let r = closed_loop(
            &mut dev,
            0,
            4,
            sequential_ops(IoKind::Write, 1_000_000, 0, 100),
        );
        assert_eq!(r.ops, 100);
        assert!((r.mb_s - 1000.0).abs() < 1.0, "{r:?}");
        assert_eq!(dev.stats().busy_ns, r.elapsed_ns());
    }
}
