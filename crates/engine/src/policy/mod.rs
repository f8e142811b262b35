//! Line replacement policies: one file each, one trait, one registry ([`REGISTRY`]).
//!
//! The engine owns the cache *slots* (fixed places for lines, `0..capacity`) and the map from
//! line key to slot. A policy only orders the slots it is told about and picks victims; it keeps
//! its own per-slot state in vectors sized to the capacity, so its RAM per cached line is easy
//! to see ([`Policy::mem_bytes`]).
//!
//! # Contract (every policy MUST keep it; `tests/conformance.rs` checks it)
//! - The engine calls [`Policy::insert`] only for a slot that is not in the policy, and
//!   [`Policy::hit`] / [`Policy::remove`] only for slots that are.
//! - [`Policy::victim`] is called only when at least one slot is in the policy; it MUST return
//!   a slot that is in the policy and MUST NOT remove it: the engine calls [`Policy::remove`]
//!   next (with `evicted = true`).
//! - [`Policy::miss`] is called for every line access that misses, before any `victim` or
//!   `insert` for that access, even when the line is then not admitted. Policies with ghost
//!   history (ARC, S3-FIFO) learn there.
//! - Same calls, same answers: a policy that needs randomness takes it from the seed in
//!   [`PolicyConfig`].
//!
//! # Adding a policy
//! Write `src/policy/NAME.rs` with a type implementing [`Policy`], add one line to
//! [`REGISTRY`]. The conformance test picks it up.

mod arc;
mod belady;
mod clock;
mod dss;
mod fifo;
mod ghost;
mod lifo;
mod list;
mod lru;
mod mru;
pub mod partition;
#[cfg(test)]
mod reference;
mod ring;
mod s3fifo;
mod slru;

pub use list::{AlignedLinks, LinkStore, MultiList, PackedLinks, SlotList};

use crate::classes::ClassTable;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A cache slot: the fixed place of one line (direct layout: SSD offset = slot * line size).
pub type Slot = u32;

/// Marker for "no next access" in [`Access::next_use`].
pub const NEVER: u64 = u64::MAX;

/// What a policy learns about one line access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The line key (volume and line number; see `Engine::line_key`).
    pub key: u64,
    /// Index of this access in the stream of line accesses (0, 1, 2, ...).
    pub seq: u64,
    /// Index of the next access to the same line, or [`NEVER`]; only known when the engine
    /// was given an oracle (Belady's pre-pass), otherwise [`NEVER`].
    pub next_use: u64,
    pub is_write: bool,
    pub class: u8,
}

/// Parameters a policy may read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// SLRU: share of the capacity for the protected segment (0 < x < 1).
    pub slru_protected: f64,
    /// S3-FIFO: share of the capacity for the small FIFO.
    pub s3fifo_small: f64,
    /// Seed for randomised policies.
    pub seed: u64,
    /// List policies keep their links as two aligned `u32` per slot (8 B) instead of bit-packed
    /// (`2 ceil(log2 capacity)` bits): fewer instructions per hit, more RAM. Decisions are
    /// the same. The simulator sets it (speed); a live cache keeps the packed form (RAM).
    #[serde(skip)]
    pub aligned_links: bool,
    /// I/O class table (`--classes`): DSS priorities and allocation, partitions for every
    /// policy. None = DSS uses the built-in file-system table; other policies ignore classes.
    #[serde(skip)]
    pub classes: Option<Arc<ClassTable>>,
    /// Per-volume occupancy bounds (`--volume-share NAME=MIN:MAX`): each volume listed gets a
    /// partition of its own ([`partition`]); the others share one. Sorted by volume, one
    /// entry per volume.
    #[serde(skip)]
    pub volume_shares: Vec<VolumeShare>,
}

/// The share of the pool one volume may hold: at least `min` (others do not evict it below
/// that while some partition is above its own minimum), at most `max` (beyond it the volume
/// replaces its own lines). Shares of the capacity, `0 <= min <= max <= 1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VolumeShare {
    pub volume: u32,
    pub min: f64,
    pub max: f64,
}

impl VolumeShare {
    /// Parses `MIN:MAX`, each a share (`0.25`) or a percent (`25%`).
    pub fn parse_bounds(s: &str) -> Result<(f64, f64), String> {
        let (a, b) = s
            .split_once(':')
            .ok_or_else(|| format!("share '{s}': expected MIN:MAX, e.g. 0.25:0.6 or 25%:60%"))?;
        let one = |x: &str| -> Result<f64, String> {
            let x = x.trim();
            let v = match x.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
                None => x.parse::<f64>(),
            }
            .map_err(|_| format!("share '{s}': '{x}' is not a number or a percent"))?;
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("share '{s}': '{x}' is outside 0..1 (0%..100%)"));
            }
            Ok(v)
        };
        let (min, max) = (one(a)?, one(b)?);
        if min > max {
            return Err(format!("share '{s}': minimum {min} is above maximum {max}"));
        }
        Ok((min, max))
    }

    /// Checks a set of bounds: each in order, no volume twice, minimums summing to at most 1.
    pub fn validate(shares: &[VolumeShare]) -> Result<(), String> {
        let mut sum = 0.0;
        for (i, v) in shares.iter().enumerate() {
            if !(0.0 <= v.min && v.min <= v.max && v.max <= 1.0) {
                return Err(format!(
                    "volume {} share {}:{}: need 0 <= min <= max <= 1",
                    v.volume, v.min, v.max
                ));
            }
            if shares[..i].iter().any(|w| w.volume == v.volume) {
                return Err(format!("volume {} has two shares", v.volume));
            }
            sum += v.min;
        }
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "the volumes' minimum shares add up to {sum:.3}, more than the whole pool"
            ));
        }
        Ok(())
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            slru_protected: 0.5,
            s3fifo_small: 0.1,
            seed: 0,
            aligned_links: false,
            classes: None,
            volume_shares: Vec::new(),
        }
    }
}

/// A line replacement policy. See the module documentation for the contract.
pub trait Policy: Send {
    /// The registry name.
    fn name(&self) -> &'static str;
    /// A cached line in `slot` was accessed.
    fn hit(&mut self, slot: Slot, access: &Access);
    /// A line that is not cached was accessed.
    fn miss(&mut self, _access: &Access) {}
    /// `slot` now holds `access.key`.
    fn insert(&mut self, slot: Slot, access: &Access);
    /// Whether [`Policy::insert`] reads its `access` (key, class, ...). A bulk restore gives
    /// policies that do not (the list policies) a placeholder instead of loading the key and
    /// class of each slot, two cache misses per line in an order unrelated to the slots.
    fn insert_reads_access(&self) -> bool {
        true
    }
    /// A restart's bulk form of [`Policy::insert`]: the policy, holding no slot, takes
    /// `order` (distinct slots, oldest first) exactly as `insert` of each in turn would, with
    /// accesses it does not read (only asked of policies whose
    /// [`Policy::insert_reads_access`] is false). Returns false, changing nothing, where the
    /// policy has no such form: the caller then inserts them one by one.
    fn insert_all(&mut self, _order: &[Slot]) -> bool {
        false
    }
    /// A hint that `slot` is inserted soon (a bulk restore, a few lines ahead): the policy may
    /// ask the CPU to load its per-slot state. MUST NOT change the policy's state.
    fn prefetch(&self, _slot: Slot) {}
    /// Choose the slot to evict next (does not remove it).
    fn victim(&mut self) -> Slot;
    /// The line `key` leaves `slot`: evicted (`evicted = true`) or invalidated.
    fn remove(&mut self, slot: Slot, key: u64, evicted: bool);
    /// Up to `n` slots this policy expects to evict next, likeliest first, appended to `out`.
    /// A hint only (the live volume unmaps their records ahead of time): it MUST NOT change
    /// the policy's state, and later [`Policy::victim`] answers need not follow it. Default:
    /// no hint.
    fn eviction_candidates(&self, _n: usize, _out: &mut Vec<Slot>) {}
    /// Heap bytes this policy holds (per-slot state and any history).
    fn mem_bytes(&self) -> usize;
    /// Whether the policy needs the next-use oracle (a pre-pass over the trace).
    fn needs_oracle(&self) -> bool {
        false
    }
    /// Class-aware policies (DSS, partitions) return true: the engine then asks [`Policy::admit`]
    /// before allocating a missed line and takes victims from [`Policy::victim_for`]. Others
    /// cost nothing extra per request.
    fn class_aware(&self) -> bool {
        false
    }
    /// May a missed line of `class` be allocated? `clean_share` is the share of the cache that
    /// is not dirty (free or clean lines). A refusal is counted as `Bypass::Class`.
    fn admit(&mut self, _class: u8, _clean_share: f64) -> bool {
        true
    }
    /// The next [`Policy::admit`], [`Policy::at_limit`], [`Policy::victim_for`] and
    /// [`Policy::dirty_peer_victim`] are for a line of `volume` (class-aware policies only;
    /// volume partitions read it). MUST NOT change which lines the policy holds.
    fn for_volume(&mut self, _volume: u32) {}
    /// Whether `class` is at its partition maximum: the engine then evicts one of its lines
    /// (through [`Policy::victim_for`]) even when free slots remain.
    fn at_limit(&self, _class: u8) -> bool {
        false
    }
    /// The victim to make room for a line of `class` (same contract as [`Policy::victim`]).
    /// `dirty` is the engine's dirty bitmap (bit `slot % 64` of word `slot / 64`), so a
    /// policy may prefer clean victims.
    fn victim_for(&mut self, _class: u8, _dirty: &[u64]) -> Slot {
        self.victim()
    }
    /// Whether [`Policy::victim_for`] would now name a dirty line that the policy values at
    /// least as much as a new line of `class` (DSS: of the same or a higher priority). The
    /// engine does not evict such a line for it: it writes the new line around the cache
    /// (one HDD write, as the victim's write-back would have cost, and the victim stays
    /// cached). Must not change the policy's state.
    fn dirty_peer_victim(&mut self, _class: u8, _dirty: &[u64]) -> bool {
        false
    }
    /// Class-aware policies may track, since the last [`Policy::ahead_mark`], the lowest
    /// position in eviction order (0 = the next victim) at which a line was inserted or moved
    /// by a hit, and how many lines left the lists: `(lowest position, lines removed)`. The
    /// engine then knows how far the lines it found clean ahead of the evictions still reach
    /// without walking them on every request. `None`: not tracked (the engine looks at the
    /// next [`crate::engine::CLEAN_AHEAD`] / 2 victims on every request instead).
    fn ahead_since_mark(&self) -> Option<(u64, u64)> {
        None
    }
    /// Starts a new [`Policy::ahead_since_mark`] period (the engine has just looked at the
    /// lines ahead of the evictions). MUST NOT change which lines the policy evicts.
    fn ahead_mark(&self) {}
}

/// A read access to `key` with no oracle, for policy unit tests.
#[cfg(test)]
pub(crate) fn test_access(key: u64) -> Access {
    Access {
        key,
        seq: 0,
        next_use: NEVER,
        is_write: false,
        class: 0,
    }
}

/// Constructor of a policy for a capacity in lines.
pub type PolicyCtor = fn(capacity: u32, config: &PolicyConfig) -> Box<dyn Policy>;

/// One registry entry.
pub struct PolicyInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub make: PolicyCtor,
}

/// Every replacement policy, in the order `--help` lists them.
pub const REGISTRY: &[PolicyInfo] = &[
    lru::INFO,
    fifo::INFO,
    lifo::INFO,
    mru::INFO,
    slru::INFO,
    clock::INFO,
    arc::INFO,
    s3fifo::INFO,
    belady::INFO,
    dss::INFO,
];

/// Looks a policy up by name (case-insensitive; `-` and `_` are the same).
pub fn lookup(name: &str) -> Option<&'static PolicyInfo> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let want = norm(name);
    REGISTRY.iter().find(|p| norm(p.name) == want)
}

/// Whether the named policy is offline (it needs the future: [`Policy::needs_oracle`], e.g.
/// `belady`): a simulator can run it, a live cache cannot. `false` for unknown names.
pub fn is_offline(name: &str) -> bool {
    lookup(name).is_some_and(|p| (p.make)(1, &PolicyConfig::default()).needs_oracle())
}

/// Names of all registered policies.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|p| p.name).collect()
}
