//! Simulated storage devices for the tiercache simulator: timing models of HDDs, RAID
//! arrays, SSDs and RAM/NVRAM behind one event-driven [`Device`] trait, plus a seeded
//! fault-injecting wrapper.
//!
//! Time is **simulated only**: every call carries `now_ns`, and nothing here reads a clock.
//! All randomness comes from seeds in the configs, so the same inputs give the same
//! completions, bit for bit.
//!
//! ```text
//!  caller ── submit(now, id, op) ──▶ Checked<M>  (one checked wrapper: range checks,
//!         ◀─ advance(t) completions ─            statistics, completion order, busy time)
//!                                        │
//!                                        ▼  Model (the physics)
//!              Hdd │ Ssd │ Ram │ Raid (members are Devices) │ Faulty<D: Device>
//! ```
//!
//! A driver loop looks like this:
//!
//! ```
//! use tiercache_devices::{build, Device, DeviceSpec, IoKind, IoOp};
//! let mut dev = build(&"hdd:7200".parse::<DeviceSpec>().unwrap()).unwrap();
//! dev.submit(0, 1, IoOp::new(IoKind::Read, 0, 4096));
//! let mut done = Vec::new();
//! while let Some(t) = dev.next_completion() {
//!     dev.advance(t, &mut done); // may return nothing for composite devices; loop again
//! }
//! assert_eq!(done.len(), 1);
//! assert!(done[0].time_ns > 0);
//! ```
//!
//! Units: times in nanoseconds (`_ns`) unless a config field says otherwise (`_ms`, `_us`);
//! `MB` means 10^6 bytes, as in datasheets.

pub mod bench;
mod checked;
mod faulty;
mod ftl;
mod hdd;
mod hybrid_ftl;
mod price;
mod raid;
mod ram;
mod spec;
mod ssd;
mod stats;
mod timeline;

pub use checked::{Checked, Done, Model};
pub use faulty::{FaultConfig, Faulty};
pub use ftl::{FtlConfig, FtlKind, FtlStats, PageFtl};
pub use hdd::{rewrite_min_runs, Hdd, HddConfig, HDD_PRESETS};
pub use hybrid_ftl::{AnyFtl, HybridFtl};
pub use price::{usd_per_mb_per_iops, Price, PriceEntry, PriceTable};
pub use raid::{Raid, RaidConfig, RaidLevel};
pub use ram::{Ram, RamConfig, RAM_PRESETS};
pub use spec::{build, known_presets, DeviceSpec, FaultySpec, RaidSpec, SpecError};
pub use ssd::{FlashCmd, FlashOp, Ftl, Ssd, SsdConfig, SSD_PRESETS};
pub use stats::{DeviceStats, KindStats, LatencySummary};

use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoKind {
    Read,
    Write,
    /// Make every completed write durable. `offset` and `len` are ignored.
    Flush,
    /// Discard a range (TRIM / UNMAP / DISCARD).
    Trim,
}

impl IoKind {
    /// All kinds, in the order statistics list them.
    pub const ALL: [IoKind; 4] = [IoKind::Read, IoKind::Write, IoKind::Flush, IoKind::Trim];

    /// Index into per-kind arrays (`ALL[k.index()] == k`).
    pub fn index(self) -> usize {
        match self {
            IoKind::Read => 0,
            IoKind::Write => 1,
            IoKind::Flush => 2,
            IoKind::Trim => 3,
        }
    }
}

/// One device operation: a byte range (no alignment required; models round internally to
/// their sector or page) and, for writes, the force-unit-access flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoOp {
    pub kind: IoKind,
    pub offset: u64,
    pub len: u64,
    /// Force unit access: the write must be durable when it completes. The models here have
    /// no volatile write cache, so every write already is; the flag is carried for wrappers
    /// and real devices.
    pub fua: bool,
}

impl IoOp {
    /// An op without FUA.
    pub fn new(kind: IoKind, offset: u64, len: u64) -> Self {
        IoOp {
            kind,
            offset,
            len,
            fua: false,
        }
    }

    /// Byte after the last one this op touches.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A finished operation, as handed back by [`Device::advance`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The caller's id from [`Device::submit`].
    pub id: u64,
    /// Simulated time at which the operation completed.
    pub time_ns: u64,
    pub result: Result<(), DeviceError>,
}

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "{kind:?} of {len} bytes at {offset} is beyond the device capacity of {capacity} bytes"
    )]
    OutOfRange {
        kind: IoKind,
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("zero-length {kind:?} at {offset}")]
    Empty { kind: IoKind, offset: u64 },
    /// Raised by [`Faulty`]: `nth` is the 1-based index of the op among all ops submitted to
    /// that wrapper.
    #[error("injected fault on {kind:?} (op #{nth})")]
    Injected { kind: IoKind, nth: u64 },
    /// A RAID member failed the part of the operation that it was given.
    #[error("RAID member {member}: {source}")]
    Member {
        member: usize,
        source: Box<DeviceError>,
    },
}

/// A simulated device, driven by events on a simulated clock.
///
/// Contract (every implementation in this crate goes through [`Checked`], which enforces it):
/// * `submit` MUST be called with non-decreasing `now_ns` (it panics otherwise). Ops
///   submitted at the same `now_ns` arrive in call order.
/// * Ids are the caller's; they are returned untouched and need not be unique.
/// * `next_completion` returns `Some(t)` iff `outstanding() > 0`. For leaf models (HDD, SSD,
///   RAM) `t` is exactly the time of the next completion. For composite devices (RAID,
///   [`Faulty`] with latency spikes) `t` MAY be an internal event, at which `advance(t)`
///   returns nothing; it is never later than the next completion. After `advance(t)`,
///   `next_completion()` is `None` or greater than `t`, so `while let Some(t) =
///   next_completion() { advance(t) }` always terminates.
/// * `advance(now_ns)` appends every op that completed at or before `now_ns`, ordered by
///   completion time (ties: submission order). It may be called with any `now_ns`.
/// * An invalid op (beyond capacity, zero-length read or write) completes at its arrival
///   time with an error and costs nothing.
pub trait Device: Send {
    /// Short name, e.g. `hdd:7200`.
    fn name(&self) -> &str;
    /// Usable capacity in bytes.
    fn capacity_bytes(&self) -> u64;
    /// Queue `op` (caller's `id`) arriving at `now_ns` (non-decreasing across calls).
    fn submit(&mut self, now_ns: u64, id: u64, op: IoOp);
    /// Time of the next completion (see the trait contract for composite devices), if
    /// anything is outstanding.
    fn next_completion(&self) -> Option<u64>;
    /// Pop every op completed at or before `now_ns` into `done` (in completion order).
    fn advance(&mut self, now_ns: u64, done: &mut Vec<Completion>);
    /// Ops submitted and not yet returned by `advance`.
    fn outstanding(&self) -> usize;
    /// Counters since construction.
    fn stats(&self) -> DeviceStats;
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn capacity_bytes(&self) -> u64 {
        (**self).capacity_bytes()
    }
    fn submit(&mut self, now_ns: u64, id: u64, op: IoOp) {
        (**self).submit(now_ns, id, op)
    }
    fn next_completion(&self) -> Option<u64> {
        (**self).next_completion()
    }
    fn advance(&mut self, now_ns: u64, done: &mut Vec<Completion>) {
        (**self).advance(now_ns, done)
    }
    fn outstanding(&self) -> usize {
        (**self).outstanding()
    }
    fn stats(&self) -> DeviceStats {
        (**self).stats()
    }
}

/// Milliseconds (config unit) to nanoseconds.
pub(crate) fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round().max(0.0) as u64
}

/// Microseconds (config unit) to nanoseconds.
pub(crate) fn us_to_ns(us: f64) -> u64 {
    (us * 1e3).round().max(0.0) as u64
}

/// Time to move `bytes` at `mb_s` (10^6 bytes per second), in ns, rounded up.
pub(crate) fn transfer_ns(bytes: u64, mb_s: f64) -> u64 {
    debug_assert!(mb_s > 0.0);
    // bytes / (mb_s * 1e6 B/s) * 1e9 ns/s = bytes * 1000 / mb_s
    (bytes as f64 * 1000.0 / mb_s).ceil() as u64
}
