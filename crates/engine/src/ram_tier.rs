//! The RAM tier: a DRAM read cache above the SSD cache (issue 15 item 3; DSS and Qsan keep
//! memory above the SSD). It holds **clean whole lines only**, under its own replacement
//! policy from [`crate::policy::REGISTRY`] (default [`DEFAULT_RAM_POLICY`]), and is a
//! separate object beside the [`crate::Engine`], not a plan step: the executor asks it first
//! and only sends the request to the engine when it misses, so a RAM hit touches neither the
//! engine (no policy update, no counter) nor the SSD. Like the engine it does no I/O: it keeps
//! which line sits in which RAM slot; the executor keeps the bytes (live: a buffer of
//! `capacity x line` bytes; simulator: nothing, or the `ram` device model in timed runs).
//!
//! # The executor's protocol (simulator and live volume run the same calls)
//! 1. A read: [`RamTier::read`]. A hit (every line of the request in RAM) gives the slots to
//!    copy from; done. A miss: take a [`RamTier::ticket`], run the request through the engine
//!    and the devices, and when it succeeded call [`RamTier::fill`] with the ticket: the lines
//!    the read covered whole are put in RAM, and the executor copies them from the buffer it
//!    just returned.
//! 2. A write, trim or write-zeroes: [`RamTier::invalidate`] before it runs *and* after it ran
//!    (succeeded or not). Lines it meets leave RAM; so a RAM copy is never older than the
//!    volume's content.
//! 3. Anything else that changes the volume's content without a request (a lost range, a
//!    failure): [`RamTier::clear`]. A mode switch: [`RamTier::set_mode`].
//!
//! **Never stale** under concurrency: every invalidation advances a clock and stamps the lines
//! it met (a hashed stamp table, so a stamp may cover other lines too: a fill is skipped for
//! nothing worse than a false alarm). A fill of a line whose stamp (or the last clear) is newer
//! than the read's ticket is skipped: the read may have returned bytes older than the write's.
//! A read that took its ticket after the write's second invalidation started after the write
//! completed, so it read the new bytes. At queue depth 1 nothing is ever skipped, so the
//! simulator and the live volume count alike.

use crate::config::Mode;
use crate::policy::{self, Access, Policy, PolicyConfig, Slot, NEVER};
use crate::request::{Op, Request};
use crate::Engine;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// The RAM tier's policy when none is named: S3-FIFO (scan-resistant, cheap per hit).
pub const DEFAULT_RAM_POLICY: &str = "s3fifo";

/// Entries of the invalidation stamp table (a power of two).
const STAMPS: usize = 4096;

/// What the RAM tier did. Reads served here never reach the engine, so per tier:
/// RAM hits = `hits`; SSD hits and misses are the engine's read counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamCounters {
    /// Read requests looked up (of at least one byte).
    pub lookups: u64,
    /// Read requests served whole from RAM, and their bytes.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Lines put in RAM after a read from the tiers below.
    pub fills: u64,
    /// Fills skipped: a write, trim or clear met the line while its read was in flight.
    pub fills_skipped: u64,
    /// Lines that left RAM for new ones.
    pub evictions: u64,
    /// Lines dropped because a write, trim or write-zeroes met them.
    pub invalidations: u64,
    /// Times the whole tier was emptied (mode switch, failure, lost range).
    pub clears: u64,
}

impl RamCounters {
    /// `self - o` field by field, at least 0 (the counts since a statistics reset).
    pub fn saturating_sub(self, o: RamCounters) -> RamCounters {
        RamCounters {
            lookups: self.lookups.saturating_sub(o.lookups),
            hits: self.hits.saturating_sub(o.hits),
            hit_bytes: self.hit_bytes.saturating_sub(o.hit_bytes),
            fills: self.fills.saturating_sub(o.fills),
            fills_skipped: self.fills_skipped.saturating_sub(o.fills_skipped),
            evictions: self.evictions.saturating_sub(o.evictions),
            invalidations: self.invalidations.saturating_sub(o.invalidations),
            clears: self.clears.saturating_sub(o.clears),
        }
    }
}

/// The RAM tier's metadata (see the module documentation).
pub struct RamTier {
    line_shift: u32,
    capacity: u32,
    policy: Box<dyn Policy>,
    map: HashMap<u64, Slot>,
    /// Key per slot (`u64::MAX`: free).
    keys: Vec<u64>,
    free: Vec<Slot>,
    /// Line accesses so far (the policies' `Access::seq`).
    seq: u64,
    /// Invalidation clock, its stamps per hashed line, and the clock of the last clear.
    clock: u64,
    stamps: Vec<u64>,
    cleared_at: u64,
    /// Reads fill RAM (not in pass-through: nothing new is cached there): the pool's mode,
    /// and the volumes whose own mode says otherwise (`(volume, fills)`, a few entries).
    filling: bool,
    volume_filling: Vec<(u32, bool)>,
    policy_name: &'static str,
    counters: RamCounters,
}

const FREE: u64 = u64::MAX;

impl RamTier {
    /// A tier of `bytes` of RAM in lines of `line_size` (a power of two) under the named
    /// policy (an online one: not `belady`). The error names the option.
    pub fn new(
        bytes: u64,
        line_size: u64,
        policy_name: &str,
        params: &PolicyConfig,
    ) -> Result<Self, String> {
        if !line_size.is_power_of_two() {
            return Err(format!(
                "ram cache: line size {line_size} is not a power of two"
            ));
        }
        let lines = bytes / line_size;
        if lines == 0 {
            return Err(format!(
                "--ram-cache {bytes} bytes is less than one line of {line_size} bytes: give at \
                 least the line size (e.g. 64MiB), or 0 for no RAM tier"
            ));
        }
        let capacity = u32::try_from(lines).map_err(|_| {
            format!(
                "--ram-cache {bytes} bytes is {lines} lines: at most {} lines",
                u32::MAX
            )
        })?;
        let info = policy::lookup(policy_name).ok_or_else(|| {
            format!(
                "--ram-policy '{policy_name}' is not a policy (one of: {})",
                policy::names().join(", ")
            )
        })?;
        let policy = (info.make)(capacity, params);
        if policy.needs_oracle() || policy.class_aware() {
            return Err(format!(
                "--ram-policy '{}' cannot run the RAM tier (it needs the future or I/O \
                 classes); use s3fifo, slru, lru, arc, clock, fifo",
                info.name
            ));
        }
        Ok(RamTier {
            line_shift: line_size.trailing_zeros(),
            capacity,
            policy,
            map: HashMap::with_capacity(capacity as usize),
            keys: vec![FREE; capacity as usize],
            free: (0..capacity).rev().collect(),
            seq: 0,
            clock: 0,
            stamps: vec![0; STAMPS],
            cleared_at: 0,
            filling: true,
            volume_filling: Vec::new(),
            policy_name: info.name,
            counters: RamCounters::default(),
        })
    }

    /// The tier an engine configuration asks for (`ram_cache` bytes; None when 0).
    pub fn for_config(cfg: &crate::EngineConfig) -> Result<Option<Self>, String> {
        if cfg.ram_cache == 0 {
            return Ok(None);
        }
        let mut t = Self::new(
            cfg.ram_cache,
            cfg.line_size,
            &cfg.ram_policy,
            &cfg.policy_params,
        )?;
        t.set_mode(cfg.mode);
        for v in &cfg.volumes {
            t.set_volume_mode(v.id, v.mode);
        }
        Ok(Some(t))
    }

    /// The same tier at another size (`ctl set ram-cache`): empty, under the same policy,
    /// mode and counters (one more clear). Its clock continues this one's, past a clear:
    /// a read that took its ticket before the resize fills nothing, so no write it raced
    /// with can leave its old bytes in the new tier.
    pub fn resized(&self, bytes: u64, params: &PolicyConfig) -> Result<RamTier, String> {
        let mut t = RamTier::new(bytes, self.line_size(), self.policy_name, params)?;
        t.clock = self.clock + 1;
        t.cleared_at = t.clock;
        t.filling = self.filling;
        t.volume_filling = self.volume_filling.clone();
        t.counters = self.counters;
        t.counters.clears += 1;
        Ok(t)
    }

    pub fn capacity_lines(&self) -> u64 {
        self.capacity as u64
    }

    pub fn line_size(&self) -> u64 {
        1 << self.line_shift
    }

    /// Lines in RAM now.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy_name
    }

    pub fn counters(&self) -> RamCounters {
        self.counters
    }

    /// Whether line `line` of `volume` is in RAM (tests).
    pub fn contains(&self, volume: u32, line: u64) -> bool {
        self.map.contains_key(&Engine::line_key(volume, line))
    }

    /// Heap bytes of the metadata (not the data buffer: `capacity_lines x line_size` more).
    pub fn mem_bytes(&self) -> usize {
        self.policy.mem_bytes()
            + self.map.capacity() * (8 + 4 + 1)
            + self.keys.capacity() * 8
            + self.free.capacity() * 4
            + self.stamps.capacity() * 8
    }

    /// The write mode changed: the tier is emptied (cheap and rare), and fills stop in
    /// pass-through (nothing new is cached there) and resume in the other modes. A volume
    /// with a mode of its own ([`RamTier::set_volume_mode`]) keeps it.
    pub fn set_mode(&mut self, mode: Mode) {
        self.clear();
        self.filling = mode != Mode::PassThrough;
    }

    /// Volume `volume`'s own mode changed (None: it follows the pool's again): its lines
    /// leave RAM, fills in flight are refused, and its reads fill RAM unless its mode is
    /// pass-through. The other volumes' lines stay.
    pub fn set_volume_mode(&mut self, volume: u32, mode: Option<Mode>) {
        self.drop_volume(volume);
        self.volume_filling.retain(|&(v, _)| v != volume);
        if let Some(m) = mode {
            self.volume_filling.push((volume, m != Mode::PassThrough));
        }
    }

    /// Every line of `volume` leaves RAM (counted as invalidations) and the fills of reads in
    /// flight are refused (all volumes': a false alarm for the others, rare): the volume was
    /// removed from the pool, so its id may serve another backing device next, or its mode
    /// changed.
    pub fn drop_volume(&mut self, volume: u32) {
        self.clock += 1;
        self.cleared_at = self.clock;
        self.drop_keys_where(|k| Self::volume_of(k) == volume);
    }

    /// Drops every line in RAM whose key `gone` names (a scan of the map: for large ranges
    /// and whole volumes, where stamping each line would cost more).
    fn drop_keys_where(&mut self, gone: impl Fn(u64) -> bool) {
        let keys: Vec<u64> = self.map.keys().copied().filter(|&k| gone(k)).collect();
        for k in keys {
            self.drop_key(k);
        }
    }

    fn volume_of(key: u64) -> u32 {
        (key >> crate::engine::LINE_BITS) as u32
    }

    /// Whether reads of `volume` fill RAM (its mode, else the pool's).
    fn fills(&self, volume: u32) -> bool {
        self.volume_filling
            .iter()
            .find(|&&(v, _)| v == volume)
            .map_or(self.filling, |&(_, f)| f)
    }

    fn lines(&self, req: &Request) -> (u64, u64) {
        (
            req.offset >> self.line_shift,
            (req.end() - 1) >> self.line_shift,
        )
    }

    fn access(&mut self, key: u64) -> Access {
        self.seq += 1;
        Access {
            key,
            seq: self.seq - 1,
            next_use: NEVER,
            is_write: false,
            class: 0,
        }
    }

    /// A read: when every line it touches is in RAM, counts the hit, tells the policy, puts
    /// the lines' slots in `slots` (in order) and returns true. Otherwise changes nothing but
    /// the lookup count and returns false. Not a read, or 0 bytes: false, nothing counted.
    pub fn read(&mut self, req: &Request, slots: &mut Vec<Slot>) -> bool {
        slots.clear();
        if req.op != Op::Read || req.len == 0 {
            return false;
        }
        self.counters.lookups += 1;
        let (first, last) = self.lines(req);
        if last - first >= self.capacity as u64 {
            return false;
        }
        for l in first..=last {
            match self.map.get(&Engine::line_key(req.volume, l)) {
                Some(&s) => slots.push(s),
                None => {
                    slots.clear();
                    return false;
                }
            }
        }
        for (i, l) in (first..=last).enumerate() {
            let a = self.access(Engine::line_key(req.volume, l));
            self.policy.hit(slots[i], &a);
        }
        self.counters.hits += 1;
        self.counters.hit_bytes += req.len;
        true
    }

    /// The invalidation clock now: take it before a read that missed RAM goes below.
    pub fn ticket(&self) -> u64 {
        self.clock
    }

    fn stamp_index(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize & (STAMPS - 1)
    }

    fn stale(&self, key: u64, ticket: u64) -> bool {
        self.cleared_at > ticket || self.stamps[Self::stamp_index(key)] > ticket
    }

    /// A read that missed RAM succeeded: puts the lines it covered whole in RAM (evicting
    /// others as the policy says), unless an invalidation since `ticket` met them. `out` gets
    /// (slot, volume byte offset of the line) for each line put in: copy its bytes there.
    pub fn fill(&mut self, req: &Request, ticket: u64, out: &mut Vec<(Slot, u64)>) {
        out.clear();
        if req.op != Op::Read || req.len == 0 || !self.fills(req.volume) {
            return;
        }
        let ls = self.line_size();
        let first = req.offset.div_ceil(ls);
        let end = req.end() / ls;
        for l in first..end.min(first + self.capacity as u64) {
            let key = Engine::line_key(req.volume, l);
            if self.stale(key, ticket) {
                self.counters.fills_skipped += 1;
                continue;
            }
            let a = self.access(key);
            if let Some(&s) = self.map.get(&key) {
                // Filled by a concurrent read of the same bytes.
                self.policy.hit(s, &a);
                continue;
            }
            self.policy.miss(&a);
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    let v = self.policy.victim();
                    let old = self.keys[v as usize];
                    debug_assert_ne!(old, FREE, "RAM policy named a free slot");
                    self.policy.remove(v, old, true);
                    self.map.remove(&old);
                    self.counters.evictions += 1;
                    v
                }
            };
            self.policy.insert(slot, &a);
            self.keys[slot as usize] = key;
            self.map.insert(key, slot);
            self.counters.fills += 1;
            out.push((slot, l << self.line_shift));
        }
    }

    /// A write, trim or write-zeroes (any op that changes the bytes of its range; others are
    /// ignored): its lines leave RAM and fills of reads in flight over them are refused.
    pub fn invalidate(&mut self, req: &Request) {
        if !matches!(req.op, Op::Write | Op::Trim) || req.len == 0 {
            return;
        }
        self.clock += 1;
        let (first, last) = self.lines(req);
        if last - first >= STAMPS as u64 {
            // A large range: every stamp would be set; one clear-time stamp says the same
            // for fills, and the lines in RAM are found through the map.
            self.cleared_at = self.clock;
            let vol = req.volume;
            self.drop_keys_where(|k| {
                let l = k & ((1 << crate::engine::LINE_BITS) - 1);
                Self::volume_of(k) == vol && (first..=last).contains(&l)
            });
            return;
        }
        for l in first..=last {
            let key = Engine::line_key(req.volume, l);
            self.stamps[Self::stamp_index(key)] = self.clock;
            self.drop_key(key);
        }
    }

    fn drop_key(&mut self, key: u64) {
        if let Some(s) = self.map.remove(&key) {
            self.policy.remove(s, key, false);
            self.keys[s as usize] = FREE;
            self.free.push(s);
            self.counters.invalidations += 1;
        }
    }

    /// Empties the tier (the volume changed outside requests, or the mode changed) and
    /// refuses the fills of reads in flight.
    pub fn clear(&mut self) {
        self.clock += 1;
        self.cleared_at = self.clock;
        let keys: Vec<(u64, Slot)> = self.map.drain().collect();
        for (k, s) in keys {
            self.policy.remove(s, k, false);
            self.keys[s as usize] = FREE;
            self.free.push(s);
        }
        self.counters.clears += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(lines: u64) -> RamTier {
        RamTier::new(lines * 4096, 4096, "s3fifo", &PolicyConfig::default()).unwrap()
    }

    #[test]
    fn hit_after_fill_and_not_after_write() {
        let mut t = tier(4);
        let mut s = Vec::new();
        let mut out = Vec::new();
        let r = Request::read(8192, 8192);
        assert!(!t.read(&r, &mut s));
        let k = t.ticket();
        t.fill(&r, k, &mut out);
        assert_eq!(out.len(), 2);
        assert!(t.read(&r, &mut s));
        assert_eq!(s.len(), 2);
        t.invalidate(&Request::write(9000, 1));
        assert!(!t.read(&r, &mut s));
        assert!(!t.contains(0, 2) && t.contains(0, 3));
        assert_eq!(t.counters().hits, 1);
        assert_eq!(t.counters().invalidations, 1);
    }

    #[test]
    fn partial_lines_are_not_filled() {
        let mut t = tier(4);
        let mut out = Vec::new();
        t.fill(&Request::read(100, 5000), 0, &mut out);
        assert!(out.is_empty());
        t.fill(&Request::read(100, 9000), 0, &mut out);
        assert_eq!(out, vec![(out[0].0, 4096)]);
    }

    #[test]
    fn a_fill_after_an_invalidation_is_refused() {
        let mut t = tier(4);
        let mut out = Vec::new();
        let k = t.ticket();
        t.invalidate(&Request::write(0, 4096));
        t.fill(&Request::read(0, 4096), k, &mut out);
        assert!(out.is_empty());
        assert_eq!(t.counters().fills_skipped, 1);
        let k = t.ticket();
        t.clear();
        t.fill(&Request::read(8192, 4096), k, &mut out);
        assert!(out.is_empty());
        t.fill(&Request::read(8192, 4096), t.ticket(), &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn bounded_and_large_trims_find_lines() {
        let mut t = tier(3);
        let mut out = Vec::new();
        for l in 0..10u64 {
            t.fill(&Request::read(l * 4096, 4096), t.ticket(), &mut out);
            assert!(t.len() <= 3);
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.counters().evictions, 7);
        let mut trim = Request::write(0, 1 << 30);
        trim.op = Op::Trim;
        t.invalidate(&trim);
        assert!(t.is_empty());
        assert_eq!(t.counters().invalidations, 3);
    }

    #[test]
    fn pass_through_does_not_fill() {
        let mut t = tier(3);
        let mut out = Vec::new();
        t.set_mode(Mode::PassThrough);
        t.fill(&Request::read(0, 4096), t.ticket(), &mut out);
        assert!(out.is_empty() && t.is_empty());
        t.set_mode(Mode::WriteBack);
        t.fill(&Request::read(0, 4096), t.ticket(), &mut out);
        assert_eq!(t.len(), 1);
    }

    fn read_of(volume: u32, line: u64) -> Request {
        let mut r = Request::read(line * 4096, 4096);
        r.volume = volume;
        r
    }

    #[test]
    fn a_pass_through_volume_does_not_fill_and_others_keep_their_lines() {
        let mut t = tier(8);
        let mut out = Vec::new();
        for v in 0..2 {
            t.fill(&read_of(v, 1), t.ticket(), &mut out);
        }
        assert!(t.contains(0, 1) && t.contains(1, 1));
        t.set_volume_mode(1, Some(Mode::PassThrough));
        assert!(
            t.contains(0, 1),
            "volume 0 lost its line to volume 1's switch"
        );
        assert!(!t.contains(1, 1), "a pass-through volume kept lines in RAM");
        t.fill(&read_of(1, 2), t.ticket(), &mut out);
        assert!(out.is_empty() && !t.contains(1, 2));
        // The pool's switch keeps the volume's own mode; the volume's None follows the pool.
        t.set_mode(Mode::WriteThrough);
        t.fill(&read_of(1, 2), t.ticket(), &mut out);
        assert!(!t.contains(1, 2));
        t.fill(&read_of(0, 2), t.ticket(), &mut out);
        assert!(t.contains(0, 2));
        t.set_volume_mode(1, None);
        t.fill(&read_of(1, 2), t.ticket(), &mut out);
        assert!(t.contains(1, 2));
        t.set_mode(Mode::PassThrough);
        t.set_volume_mode(0, Some(Mode::WriteBack));
        t.fill(&read_of(0, 3), t.ticket(), &mut out);
        t.fill(&read_of(1, 3), t.ticket(), &mut out);
        assert!(t.contains(0, 3) && !t.contains(1, 3));
    }

    #[test]
    fn a_dropped_volume_leaves_ram_and_its_reads_in_flight_fill_nothing() {
        let mut t = tier(8);
        let mut out = Vec::new();
        for l in 0..3 {
            t.fill(&read_of(0, l), t.ticket(), &mut out);
            t.fill(&read_of(2, l), t.ticket(), &mut out);
        }
        let old = t.ticket();
        t.drop_volume(2);
        assert_eq!(t.len(), 3);
        assert!((0..3).all(|l| t.contains(0, l) && !t.contains(2, l)));
        // A read of the removed volume that was below while it left: its bytes are the old
        // device's and the id may name another device now.
        t.fill(&read_of(2, 5), old, &mut out);
        assert!(out.is_empty() && !t.contains(2, 5));
        let mut s = Vec::new();
        assert!(!t.read(&read_of(2, 1), &mut s));
        assert!(t.read(&read_of(0, 1), &mut s));
    }

    #[test]
    fn a_resized_tier_is_empty_and_refuses_fills_of_older_reads() {
        let mut t = tier(4);
        let mut out = Vec::new();
        for l in 0..4u64 {
            t.fill(&Request::read(l * 4096, 4096), t.ticket(), &mut out);
        }
        let old = t.ticket();
        let mut s = t.resized(2 * 4096, &PolicyConfig::default()).unwrap();
        assert_eq!((s.capacity_lines(), s.len()), (2, 0));
        assert_eq!(s.counters().fills, 4);
        assert_eq!(s.counters().clears, 1);
        s.fill(&Request::read(0, 4096), old, &mut out);
        assert!(
            out.is_empty(),
            "a read older than the resize filled the new tier"
        );
        for l in 0..5u64 {
            s.fill(&Request::read(l * 4096, 4096), s.ticket(), &mut out);
        }
        assert_eq!(s.len(), 2, "the new size bounds the tier");
        assert!(t.resized(100, &PolicyConfig::default()).is_err());
    }

    #[test]
    fn offline_policies_are_refused() {
        let e = RamTier::new(1 << 20, 4096, "belady", &PolicyConfig::default())
            .err()
            .unwrap();
        assert!(e.contains("--ram-policy"), "{e}");
        assert!(RamTier::new(100, 4096, "lru", &PolicyConfig::default())
            .err()
            .unwrap()
            .contains("--ram-cache"));
    }
}
