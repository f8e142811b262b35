//! RAM / NVRAM tier: a fixed access latency plus a transfer over one shared bandwidth.

use crate::checked::{Done, Model};
use crate::timeline::Timeline;
use crate::{transfer_ns, us_to_ns, IoKind, IoOp};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Names accepted by [`RamConfig::preset`] (also as `ram:<name>`).
pub const RAM_PRESETS: &[&str] = &["ram", "nvram"];

/// Parameters of a memory tier. Defaults = preset `ram`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RamConfig {
    pub name: String,
    pub capacity_bytes: u64,
    /// Fixed latency of every op (software path + access), added after the transfer.
    pub latency_us: f64,
    /// Bandwidth shared by all ops (one transfer at a time).
    pub bandwidth_mb_s: f64,
}

impl Default for RamConfig {
    fn default() -> Self {
        Self::preset("ram").expect("ram preset")
    }
}

impl RamConfig {
    /// A named preset; see [`RAM_PRESETS`]. DEVICES.md has no RAM/NVRAM figures: all values
    /// are assumptions, labelled as such.
    pub fn preset(name: &str) -> Option<Self> {
        Some(match name.strip_prefix("ram:").unwrap_or(name) {
            "ram" | "default" | "dram" => RamConfig {
                name: "ram".into(),
                capacity_bytes: 16 << 30, // assumed
                latency_us: 1.0,          // assumed: block-layer path to DRAM
                bandwidth_mb_s: 10_000.0, // assumed: one memcpy stream
            },
            "nvram" => RamConfig {
                name: "nvram".into(),
                capacity_bytes: 1 << 30, // assumed: battery-backed controller cache size
                latency_us: 10.0,        // assumed
                bandwidth_mb_s: 2_000.0, // assumed
            },
            _ => return None,
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.capacity_bytes == 0 {
            return Err(format!("{}: capacity_bytes must be > 0", self.name));
        }
        if !(self.latency_us.is_finite() && self.latency_us >= 0.0) {
            return Err(format!("{}: latency_us must be >= 0", self.name));
        }
        if !(self.bandwidth_mb_s.is_finite() && self.bandwidth_mb_s > 0.0) {
            return Err(format!("{}: bandwidth_mb_s must be > 0", self.name));
        }
        Ok(())
    }
}

/// The memory-tier model. Use it through [`crate::Checked`].
pub struct Ram {
    cfg: RamConfig,
    latency_ns: u64,
    bus: Timeline,
    pending: BinaryHeap<Reverse<(u64, u64)>>,
}

impl Ram {
    pub fn new(cfg: RamConfig) -> Result<Self, String> {
        cfg.validate()?;
        Ok(Ram {
            latency_ns: us_to_ns(cfg.latency_us),
            cfg,
            bus: Timeline::default(),
            pending: BinaryHeap::new(),
        })
    }
}

impl Model for Ram {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.cfg.capacity_bytes
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        self.bus.prune(now_ns);
        let done = match op.kind {
            IoKind::Read | IoKind::Write => {
                let dur = transfer_ns(op.len, self.cfg.bandwidth_mb_s);
                self.bus.reserve(now_ns, dur) + dur + self.latency_ns
            }
            IoKind::Flush | IoKind::Trim => now_ns + self.latency_ns,
        };
        self.pending.push(Reverse((done, tag)));
    }

    fn next_event(&self) -> Option<u64> {
        self.pending.peek().map(|Reverse((t, _))| *t)
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        while let Some(&Reverse((t, tag))) = self.pending.peek() {
            if t > now_ns {
                break;
            }
            self.pending.pop();
            out.push(Done {
                tag,
                time_ns: t,
                result: Ok(()),
            });
        }
    }
}
