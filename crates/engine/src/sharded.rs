//! A sharded engine: the line key space split between N independent [`Engine`]s, so that a
//! live executor can give each its own lock (issue 16, plan-lean section 5;
//! `docs/design-shards-live.md`). `tiercache sim --shards N` runs it sequentially
//! (deterministic counters); every run-time call an [`Engine`] takes (retune, mode, class
//! table, blocked evictions or read admission, chunk rewrite, write-back tickets, restore,
//! slot queries) is forwarded to every shard or to the owning one (`tests/sharded_runtime.rs`).
//!
//! - **Which shard**: a line goes to shard `mix(key >> g) % N`, where `2^g` lines make a
//!   *granule* ([`Sharded::layout_of`]). By default (`shard_granule` 0) the granule and the
//!   shard count follow the **capacity**: the largest granule up to 1 MiB of which every
//!   shard holds at least [`MIN_GRANULES_PER_SHARD`] (64), and, when even the smallest
//!   granule (a line, a group, an ACP chunk without chunk rewrite) leaves a shard fewer than
//!   64, fewer shards (down to 1). The share of the cached working set each shard sees then
//!   varies by about `1/sqrt(64)` between shards at worst (a working set packed in whole
//!   granules), and a concave hit-ratio curve loses only to the second order of that, so
//!   the hit ratio stays that of one engine (`scripts/shard_hit_ratio.sh`). Live caches of
//!   GiBs keep 1 MiB granules (sequential runs stay in one shard, few requests split); only
//!   small caches get smaller granules or fewer shards. A nonzero `shard_granule` fixes the
//!   granule and the shard count (experiments).
//! - **Whole groups, whole chunks**: a granule is at least a group (group population never
//!   inserts a line into a shard that does not own it); each shard's chunk rewrite is
//!   capped at the granule (a rewrite's `CopyHdd` gaps never cover another shard's lines;
//!   the lines cleaned are the same, only the backing writes are shorter).
//! - **Capacity**: shard i holds `cap / N` lines (the first `cap % N` shards one more) as a
//!   contiguous range of global slots starting at [`Sharded::slot_base`]; plans, slots and
//!   write-back lines carry global slots and SSD addresses. Each shard's policy seed is
//!   derived from the configured seed and the shard index (shard 0 keeps the seed itself).
//! - **Request-level stages** run once per request before the split: the sequential-cutoff
//!   stream table (shard 0's table serves as the front's; every shard is handed the
//!   decision, [`Engine::process_with_seq`]). Group admission counts per group, and a group
//!   lies in one shard, so each shard counts its own groups exactly as one engine would.
//! - **Split requests**: a read, write or trim crossing granules owned by different shards
//!   is cut there; the pieces run in address order and their plans are concatenated (one
//!   `FlushSsd` at the end for FUA). The request-level counters (requests, reads, writes,
//!   trims, full/partial hits and misses, per-direction outcomes) are corrected so that a
//!   split request counts once, by the outcome of all its lines together, in its class's
//!   counters and, with a volume table, in its volume's ([`Sharded::volume_stats`]).
//! - **Cleaning** is per shard, each against its own watermarks; every shard's logical
//!   clock is brought up to the global request count before it is asked about cleaning
//!   (a shard that took no request still ages its dirty lines, so `alru` ages alike).
//! - **N = 1** is bit-identical to [`Engine`] (counters, plans, state, every run-time call:
//!   `tests/sharded.rs`, `tests/sharded_runtime.rs`).

use crate::config::EngineConfig;
use crate::engine::{Engine, EngineError, RestorePending, WbLine, WbTicket, LINE_BITS, MAX_VOLUME};
use crate::plan::{Plan, Step};
use crate::policy::Slot;
use crate::request::{Op, Request, MAX_CLASS, NUM_CLASSES};
use crate::stats::Counters;
use hashbrown::HashMap;

/// Most shards an engine may have.
pub const MAX_SHARDS: usize = 256;

/// The largest automatic granule: 1 MiB, the default chunk-rewrite and ACP chunk.
pub const MAX_AUTO_GRANULE: u64 = 1 << 20;

/// Granules of capacity every shard holds at least with the automatic layout
/// ([`Sharded::layout_of`]).
pub const MIN_GRANULES_PER_SHARD: u64 = 64;

/// How a sharded engine splits its key space: shards actually run and the granule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    /// Shards run (at most the configured `shards`; fewer for a small cache).
    pub shards: usize,
    /// Bytes of a granule: lines of one granule share a shard.
    pub granule: u64,
}

/// A write-back in flight on a sharded engine: one ticket per shard it touched
/// ([`Sharded::begin_clean`], [`Sharded::complete_writeback`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedTicket(Vec<(usize, WbTicket)>);

/// What a write-back begin planned ([`crate::engine::WbBatch`] over the shards): the plan,
/// lines and backing spans of every shard touched, in shard order, with global slots and
/// SSD addresses.
#[derive(Debug, Clone)]
pub struct ShardedBatch {
    pub ticket: ShardedTicket,
    pub plan: Plan,
    pub lines: Vec<WbLine>,
    pub spans: Vec<(u32, u64, u64)>,
}

/// Lines restored by [`Sharded::restore_slots`], per shard, not yet in any policy.
#[must_use = "the restored lines are in no policy until restore_age threads them"]
#[derive(Debug)]
pub struct ShardedRestorePending(Vec<RestorePending>);

/// N engines over one key space. See the module documentation.
pub struct Sharded {
    cfg: EngineConfig,
    shards: Vec<Engine>,
    /// First global slot of each shard, then the capacity.
    base: Vec<u64>,
    line_shift: u32,
    /// log2 of the lines per granule.
    granule_lines_shift: u32,
    /// Requests processed (every shard's logical clock is brought up to it).
    clock: u64,
    plan: Plan,
    record: bool,
    /// Per class: what split requests over-counted (subtracted) and their true outcome
    /// (added); only the request-level fields are used.
    fix_sub: Vec<Counters>,
    fix_add: Vec<Counters>,
    /// The same per volume (with a volume table only, as the shards count per volume only
    /// then): (subtracted, added).
    vol_fix: HashMap<u32, (Counters, Counters)>,
    split_requests: u64,
    /// Scratch: the pieces of the request being processed (shard, offset, end).
    pieces: Vec<(usize, u64, u64)>,
    /// The shard a write-back begin that has budget left over visits first (round robin).
    clean_cursor: usize,
}

/// A 64-bit mixer (the splitmix64 finaliser): granule numbers that differ in a few low bits
/// land on unrelated shards.
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The shard of line `key` among `n`, granules of `2^gshift` lines.
#[inline]
fn owner(key: u64, gshift: u32, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    (mix(key >> gshift) % n as u64) as usize
}

/// The policy seed of shard `i`: the configured seed for shard 0, distinct mixes after.
pub fn shard_seed(seed: u64, i: usize) -> u64 {
    if i == 0 {
        seed
    } else {
        mix(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// A step of a shard's plan in the sharded plan: SSD addresses moved to the shard's slots,
/// buffer offsets to the whole request's buffer.
fn relocate(step: Step, ssd_off: u64, buf_off: u64) -> Step {
    match step {
        Step::ReadSsd { ssd, buf, len } => Step::ReadSsd {
            ssd: ssd + ssd_off,
            buf: buf + buf_off,
            len,
        },
        Step::WriteSsd { ssd, buf, len } => Step::WriteSsd {
            ssd: ssd + ssd_off,
            buf: buf + buf_off,
            len,
        },
        Step::ReadHdd { vol, hdd, buf, len } => Step::ReadHdd {
            vol,
            hdd,
            buf: buf + buf_off,
            len,
        },
        Step::WriteHdd { vol, hdd, buf, len } => Step::WriteHdd {
            vol,
            hdd,
            buf: buf + buf_off,
            len,
        },
        Step::Populate { vol, hdd, ssd, len } => Step::Populate {
            vol,
            hdd,
            ssd: ssd + ssd_off,
            len,
        },
        Step::WriteBack { vol, ssd, hdd, len } => Step::WriteBack {
            vol,
            ssd: ssd + ssd_off,
            hdd,
            len,
        },
        Step::TrimSsd { ssd, len } => Step::TrimSsd {
            ssd: ssd + ssd_off,
            len,
        },
        s @ (Step::CopyHdd { .. }
        | Step::TrimHdd { .. }
        | Step::FlushSsd
        | Step::FlushHdd { .. }) => s,
    }
}

/// A plan one shard made for a whole request, with its SSD addresses moved by `ssd_off`.
fn copy_plan(dst: &mut Plan, src: &Plan, ssd_off: u64) {
    dst.reset(src.buf_start, src.buf_len);
    dst.steps
        .extend(src.steps.iter().map(|&s| relocate(s, ssd_off, 0)));
}

/// `c` with split requests counted once: the request-level fields less what their pieces
/// over-counted (`sub`) plus their true outcome (`add`).
fn corrected(mut c: Counters, add: &Counters, sub: &Counters) -> Counters {
    c.requests = c.requests + add.requests - sub.requests;
    c.reads -= sub.reads;
    c.writes -= sub.writes;
    c.trims -= sub.trims;
    c.full_hits = c.full_hits + add.full_hits - sub.full_hits;
    c.partial_hits = c.partial_hits + add.partial_hits - sub.partial_hits;
    c.full_misses = c.full_misses + add.full_misses - sub.full_misses;
    c.read_requests += &add.read_requests;
    c.read_requests = c.read_requests.saturating_sub(sub.read_requests);
    c.write_requests += &add.write_requests;
    c.write_requests = c.write_requests.saturating_sub(sub.write_requests);
    c
}

/// Adds `c`'s outcome of one read or write request of these line figures.
fn count_outcome(c: &mut Counters, write: bool, hits: u64, misses: u64, bypassed: u64) {
    if misses == 0 {
        c.full_hits += 1;
    } else if hits == 0 {
        c.full_misses += 1;
    } else {
        c.partial_hits += 1;
    }
    let d = if write {
        &mut c.write_requests
    } else {
        &mut c.read_requests
    };
    d.count(hits, misses, bypassed);
}

impl Sharded {
    /// Builds the engines of [`Sharded::layout_of`] over `cfg.capacity_lines` lines. With a
    /// fixed granule (`shard_granule`), a cache with fewer lines than shards is refused (a
    /// shard of no line caches nothing); a cache of 0 lines (the no-cache baseline) is
    /// allowed.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate().map_err(EngineError::Config)?;
        let ShardLayout { shards: n, granule } = Self::layout_of(&cfg);
        let cap = cfg.capacity_lines;
        if cap > 0 && cap < n as u64 {
            return Err(EngineError::Config(format!(
                "a cache of {cap} lines cannot be split into {n} shards (each needs at least \
                 one line): use fewer shards or a larger cache"
            )));
        }
        let line_shift = cfg.line_size.trailing_zeros();
        let granule_lines_shift = (granule >> line_shift).trailing_zeros();
        let mut shards = Vec::with_capacity(n);
        let mut base = Vec::with_capacity(n + 1);
        let mut next = 0u64;
        for i in 0..n {
            let c = Self::shard_config(&cfg, n, granule, i, None);
            let mut e = Engine::new(c).map_err(|e| match e {
                EngineError::Config(m) if n > 1 => {
                    EngineError::Config(format!("shard {i} of {n}: {m}"))
                }
                e => e,
            })?;
            e.set_record_plan(true);
            base.push(next);
            next += e.capacity_lines();
            shards.push(e);
        }
        base.push(next);
        debug_assert_eq!(next, cap);
        Ok(Sharded {
            cfg,
            shards,
            base,
            line_shift,
            granule_lines_shift,
            clock: 0,
            plan: Plan::default(),
            record: true,
            fix_sub: vec![Counters::default(); NUM_CLASSES],
            fix_add: vec![Counters::default(); NUM_CLASSES],
            vol_fix: HashMap::new(),
            split_requests: 0,
            pieces: Vec::new(),
            clean_cursor: 0,
        })
    }

    /// Shard `i`'s configuration of `n` over `global`: its share of the capacity (the
    /// whole of it, or, during a retune, `cap` as given), its seed, and its chunk rewrite
    /// capped at the granule. With one shard, `global` itself.
    fn shard_config(
        global: &EngineConfig,
        n: usize,
        granule: u64,
        i: usize,
        cap: Option<u64>,
    ) -> EngineConfig {
        let mut c = global.clone();
        c.shards = 1;
        if n == 1 {
            return c;
        }
        // One cache device (validated: no pool of several with shards), split by capacity.
        c.pool_lines = Vec::new();
        let total = global.capacity_lines;
        c.capacity_lines =
            cap.unwrap_or(total / n as u64 + u64::from((i as u64) < total % n as u64));
        c.policy_params.seed = shard_seed(global.policy_params.seed, i);
        if c.rewrite_chunk > granule {
            c.rewrite_chunk = granule;
        }
        c
    }

    /// The smallest granule `cfg` allows, in bytes: a line, a group, and with ACP cleaning
    /// and no chunk rewrite the ACP chunk (1 MiB): each must lie in one shard.
    fn min_granule(cfg: &EngineConfig) -> u64 {
        let g = cfg.line_size.max(cfg.group_size);
        if cfg.cleaning == crate::CleaningPolicy::Acp && cfg.rewrite_chunk == 0 {
            g.max(cfg.line_size << cfg.acp_chunk_lines_shift())
        } else {
            g
        }
    }

    /// The shards and granule a configuration runs with.
    ///
    /// - `shard_granule` set: exactly `shards` shards, granules of `shard_granule` (or the
    ///   smallest granule [`Sharded::min_granule`] allows, if larger).
    /// - `shard_granule` 0 (automatic): as many shards, up to `shards`, as each hold
    ///   [`MIN_GRANULES_PER_SHARD`] of the smallest granules (at least 1), and the largest
    ///   power-of-two granule up to [`MAX_AUTO_GRANULE`] of which each holds as many.
    pub fn layout_of(cfg: &EngineConfig) -> ShardLayout {
        let n = (cfg.shards as usize).max(1);
        let min = Self::min_granule(cfg);
        if cfg.shard_granule != 0 {
            return ShardLayout {
                shards: n,
                granule: cfg.shard_granule.max(min),
            };
        }
        let ls = cfg.line_size;
        let top = MAX_AUTO_GRANULE.max(min);
        let min_lines = min / ls;
        let fit = cfg.capacity_lines / (MIN_GRANULES_PER_SHARD * min_lines);
        let shards = (fit.min(n as u64) as usize).max(1);
        if shards == 1 {
            return ShardLayout {
                shards,
                granule: top,
            };
        }
        let lines = cfg.capacity_lines / shards as u64 / MIN_GRANULES_PER_SHARD;
        let pow = 1u64 << (63 - lines.leading_zeros());
        ShardLayout {
            shards,
            granule: (pow * ls).clamp(min, top),
        }
    }

    /// The granule of a configuration, in bytes ([`Sharded::layout_of`]).
    pub fn granule_of(cfg: &EngineConfig) -> u64 {
        Self::layout_of(cfg).granule
    }

    /// This engine's granule in bytes.
    pub fn granule_bytes(&self) -> u64 {
        1 << (self.granule_lines_shift + self.line_shift)
    }

    /// Shards run (the configured `shards`, or fewer for a small cache:
    /// [`Sharded::layout_of`]).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard owning line key `key`.
    #[inline]
    pub fn shard_of(&self, key: u64) -> usize {
        owner(key, self.granule_lines_shift, self.shards.len())
    }

    /// The shard holding global slot `slot` and the slot in it. A slot past the capacity
    /// is given to the last shard as a slot past its own capacity (so that it answers as
    /// an engine does for a slot out of range).
    #[inline]
    fn locate(&self, slot: Slot) -> (usize, Slot) {
        let n = self.shards.len();
        if n == 1 {
            return (0, slot);
        }
        let i = self.base[1..n].partition_point(|&b| b <= slot as u64);
        (i, (slot as u64 - self.base[i]) as Slot)
    }

    /// Shard `i`'s engine (its slots are local: add [`Sharded::slot_base`]).
    pub fn shard(&self, i: usize) -> &Engine {
        &self.shards[i]
    }

    /// The first global slot of shard `i`.
    pub fn slot_base(&self, i: usize) -> u64 {
        self.base[i]
    }

    /// The configuration as given (the whole capacity, the configured seed).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Whether plans are recorded (default); see [`Engine::set_record_plan`].
    pub fn set_record_plan(&mut self, on: bool) {
        self.record = on;
        for e in &mut self.shards {
            e.set_record_plan(on);
        }
    }

    pub fn capacity_lines(&self) -> u64 {
        self.base[self.shards.len()]
    }

    /// Lines cached, over all shards.
    pub fn len(&self) -> u64 {
        self.shards.iter().map(Engine::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dirty_lines(&self) -> u64 {
        self.shards.iter().map(Engine::dirty_lines).sum()
    }

    /// Heap bytes of every shard's per-line state ([`Engine::index_bytes`]).
    pub fn index_bytes(&self) -> usize {
        self.shards.iter().map(Engine::index_bytes).sum()
    }

    pub fn policy_name(&self) -> &'static str {
        self.shards[0].policy_name()
    }

    pub fn cleaning_name(&self) -> &'static str {
        self.shards[0].cleaning_name()
    }

    pub fn needs_oracle(&self) -> bool {
        self.shards[0].needs_oracle()
    }

    /// Requests processed.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Read, write and trim requests that were split between shards.
    pub fn split_requests(&self) -> u64 {
        self.split_requests
    }

    /// Global slot holding `key`, if cached.
    pub fn lookup(&self, key: u64) -> Option<Slot> {
        let i = self.shard_of(key);
        self.shards[i].lookup(key).map(|s| self.global_slot(i, s))
    }

    /// Every cached (key, global slot, dirty), in global slot order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Slot, bool)> + '_ {
        self.shards.iter().enumerate().flat_map(move |(i, e)| {
            let b = self.base[i] as Slot;
            e.entries().map(move |(k, s, d)| (k, b + s, d))
        })
    }

    /// Counters of one class, over all shards, split requests counted once.
    pub fn class_counters(&self, class: u8) -> Counters {
        let k = class as usize;
        let mut c = Counters::default();
        for e in &self.shards {
            c += e.class_counters(class);
        }
        corrected(c, &self.fix_add[k], &self.fix_sub[k])
    }

    /// A volume's counters summed over the shards, split requests counted once.
    fn volume_counters(&self, id: u32, c: Counters) -> Counters {
        match self.vol_fix.get(&id) {
            Some((sub, add)) => corrected(c, add, sub),
            None => c,
        }
    }

    /// Totals over all classes.
    pub fn counters(&self) -> Counters {
        let mut t = Counters::default();
        for k in 0..NUM_CLASSES as u8 {
            t += &self.class_counters(k);
        }
        t
    }

    /// Gives each shard the next-use oracle (Belady) of the line accesses it will see, for
    /// this request stream ([`Engine::next_use_oracle`] per shard).
    pub fn set_oracle_for(&mut self, reqs: &[Request]) {
        let n = self.shards.len();
        let mut next: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut last: HashMap<u64, u64> = HashMap::new();
        for r in reqs {
            Engine::for_each_line_key(self.cfg.line_size, r, |k| {
                let s = self.shard_of(k);
                let v = &mut next[s];
                let i = v.len() as u64;
                v.push(crate::policy::NEVER);
                if let Some(p) = last.insert(k, i) {
                    v[p as usize] = i;
                }
            });
        }
        for (e, o) in self.shards.iter_mut().zip(next) {
            e.set_oracle(o);
        }
    }

    /// Prefetch hint for a request about to be processed.
    #[inline]
    pub fn prefetch(&self, req: &Request) {
        let key = Engine::line_key(req.volume, req.offset >> self.line_shift);
        self.shards[self.shard_of(key)].prefetch(req);
    }

    /// Whether the engine would take `req` (what [`Engine::process`] checks first): a
    /// request it refuses goes whole to shard 0, which returns the error.
    fn in_range(&self, req: &Request) -> bool {
        req.class <= MAX_CLASS
            && req.volume <= MAX_VOLUME
            && req
                .offset
                .checked_add(req.len)
                .is_some_and(|e| (e >> self.line_shift) < (1 << LINE_BITS))
    }

    /// Cuts `[req.offset, req.end())` at the granule boundaries where the owner changes.
    fn split(&mut self, req: &Request) {
        self.pieces.clear();
        let gshift = self.granule_lines_shift + self.line_shift;
        let end = req.end();
        let mut lo = req.offset;
        while lo < end {
            let g = lo >> gshift;
            let hi = (g + 1).checked_mul(1 << gshift).map_or(end, |x| x.min(end));
            let s = self.shard_of(Engine::line_key(req.volume, lo >> self.line_shift));
            match self.pieces.last_mut() {
                Some(p) if p.0 == s => p.2 = hi,
                _ => self.pieces.push((s, lo, hi)),
            }
            lo = hi;
        }
    }

    /// Brings shard `i`'s clock to the request before the current one (its `process` adds
    /// the current one).
    #[inline]
    fn sync_clock(&mut self, i: usize, to: u64) {
        let e = &mut self.shards[i];
        let c = e.clock();
        if c < to {
            e.advance_clock(to - c);
        }
    }

    /// Processes one request: the front stage, the split, each piece on its shard in
    /// address order; returns the plan (empty when plans are not recorded).
    pub fn process(&mut self, req: &Request) -> Result<&Plan, EngineError> {
        self.clock += 1;
        let data = matches!(req.op, Op::Read | Op::Write | Op::Trim) && req.len > 0;
        if !data || !self.in_range(req) {
            // Flushes, empty requests and refused ones: whole, to one shard.
            let i = if req.op == Op::Flush || !self.in_range(req) {
                0
            } else {
                self.shard_of(Engine::line_key(req.volume, req.offset >> self.line_shift))
            };
            self.sync_clock(i, self.clock - 1);
            let plan = self.shards[i].process(req)?;
            if self.record {
                copy_plan(&mut self.plan, plan, self.base[i] << self.line_shift);
            }
            return Ok(&self.plan);
        }
        let seq = (req.op != Op::Trim).then(|| self.shards[0].seq_front(req));
        self.split(req);
        if self.pieces.len() == 1 {
            let i = self.pieces[0].0;
            self.sync_clock(i, self.clock - 1);
            let e = &mut self.shards[i];
            let plan = match seq {
                Some(s) => e.process_with_seq(req, s)?,
                None => e.process(req)?,
            };
            if self.record {
                copy_plan(&mut self.plan, plan, self.base[i] << self.line_shift);
            }
            return Ok(&self.plan);
        }
        self.process_split(req, seq)?;
        Ok(&self.plan)
    }

    /// A request cut into pieces on different shards.
    #[cold]
    fn process_split(&mut self, req: &Request, seq: Option<bool>) -> Result<(), EngineError> {
        self.split_requests += 1;
        let k = req.class as usize;
        let ls = self.line_shift;
        let buf_start = (req.offset >> ls) << ls;
        let buf_end = (((req.end() - 1) >> ls) + 1) << ls;
        if self.record {
            match req.op {
                Op::Trim => self.plan.reset(0, 0),
                _ => self.plan.reset(buf_start, buf_end - buf_start),
            }
        }
        let (mut hits, mut misses, mut bypassed) = (0, 0, 0);
        // What the pieces over-count (subtracted) and the request's outcome (added).
        let (mut sub, mut add) = (Counters::default(), Counters::default());
        let mut flush_ssd = false;
        let pieces = std::mem::take(&mut self.pieces);
        for &(i, lo, hi) in &pieces {
            let piece = Request {
                offset: lo,
                len: hi - lo,
                ..*req
            };
            self.sync_clock(i, self.clock - 1);
            let before = *self.shards[i].class_counters(req.class);
            let e = &mut self.shards[i];
            let plan = match seq {
                Some(s) => e.process_with_seq(&piece, s)?,
                None => e.process(&piece)?,
            };
            if self.record {
                let ssd_off = self.base[i] << ls;
                let buf_off = if req.op == Op::Trim {
                    0
                } else {
                    plan.buf_start - buf_start
                };
                for &s in &plan.steps {
                    if s == Step::FlushSsd {
                        flush_ssd = true;
                    } else {
                        self.plan.push(relocate(s, ssd_off, buf_off));
                    }
                }
            }
            let after = self.shards[i].class_counters(req.class);
            let (h, m) = (
                after.line_hits - before.line_hits,
                after.line_misses - before.line_misses,
            );
            let b = after.bypasses.total() - before.bypasses.total();
            if matches!(req.op, Op::Read | Op::Write) {
                count_outcome(&mut sub, req.is_write(), h, m, b);
            }
            (hits, misses, bypassed) = (hits + h, misses + m, bypassed + b);
        }
        let extra = pieces.len() as u64 - 1;
        self.pieces = pieces;
        sub.requests += extra;
        match req.op {
            Op::Read => sub.reads += extra,
            Op::Write => sub.writes += extra,
            _ => sub.trims += extra,
        }
        if req.op != Op::Trim {
            count_outcome(&mut add, req.is_write(), hits, misses, bypassed);
        }
        self.fix_sub[k] += &sub;
        self.fix_add[k] += &add;
        if !self.cfg.volumes.is_empty() {
            let v = self.vol_fix.entry(req.volume).or_default();
            v.0 += &sub;
            v.1 += &add;
        }
        if flush_ssd && self.record {
            self.plan.push(Step::FlushSsd);
        }
        Ok(())
    }

    /// Brings every shard's clock up to the requests processed: a shard that took none of
    /// the last requests still ages its dirty lines (`alru` staleness).
    fn sync_clocks(&mut self) {
        for i in 0..self.shards.len() {
            self.sync_clock(i, self.clock);
        }
    }

    /// Whether some shard is due for cleaning ([`Engine::needs_cleaning`]), every shard's
    /// clock brought up to the requests processed first (hence `&mut`).
    pub fn needs_cleaning(&mut self) -> bool {
        self.sync_clocks();
        self.shards.iter().any(Engine::needs_cleaning)
    }

    /// Cleans every shard that is due, each down to its own target
    /// ([`Engine::cleaning_target`]), in shard order; returns the plans concatenated. Call
    /// after each request, as a driver calls [`Engine::clean`] when
    /// [`Engine::needs_cleaning`].
    pub fn clean_due(&mut self) -> &Plan {
        if self.record {
            self.plan.reset(0, 0);
        }
        self.sync_clocks();
        for i in 0..self.shards.len() {
            let e = &mut self.shards[i];
            if !e.needs_cleaning() {
                continue;
            }
            let t = e.cleaning_target();
            let plan = e.clean(t);
            if self.record {
                let ssd_off = self.base[i] << self.line_shift;
                for &s in &plan.steps {
                    self.plan.steps.push(relocate(s, ssd_off, 0));
                }
            }
        }
        &self.plan
    }

    /// The global slot of shard `i`'s slot `s`.
    #[inline]
    pub fn global_slot(&self, i: usize, s: Slot) -> Slot {
        (self.base[i] + s as u64) as Slot
    }
}

/// The run-time calls of an [`Engine`] on a sharded one.
mod runtime;

// Executors move the engine into their threads (behind a lock): it must stay `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Sharded>();
};
