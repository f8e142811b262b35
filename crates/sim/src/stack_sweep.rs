//! LRU size sweeps from one stack-distance pass (issue 16 item 4).
//!
//! LRU has the inclusion property: a cache of `c` lines holds the `c` most recently used
//! lines, so a line access hits exactly when its stack distance (distinct lines touched
//! since the previous access to the same line) is below `c`. One pass that computes every
//! access's distance (a Fenwick tree over access times, as [`crate::mrc`]) therefore gives
//! the hits of every cache size at once, instead of one engine per size.
//!
//! A sweep's result is every counter of [`SimResult`], not only the hits; this module
//! derives each of them exactly, and only for the configurations where each derivation is
//! proven against the engine's code ([`eligible`]): policy `lru`, write-through, admission
//! always, no sequential cutoff, one line per admission group, no class table, volume
//! table, pool, RAM tier, shards or log layout. There every line access allocates, nothing
//! is dirty, and nothing leaves the cache but LRU evictions, so for a cache of `c` lines:
//!
//! * a line access hits iff its distance is `< c`; a request is a full hit iff its largest
//!   distance is `< c`, a full miss iff its smallest is `>= c`, else a partial hit;
//! * every missed line is inserted (`insertions = admitted_misses = line_misses`), and the
//!   lines resident at the end are `min(distinct lines, c)`, so
//!   `evictions = insertions - min(distinct, c)`; no line is ever dirty (no write-backs);
//! * a read hit reads its part of the line from the SSD; a read miss reads the whole line
//!   from the HDD and writes it to the SSD; a write (hit or miss) writes its part to the
//!   HDD and to the SSD, and a write miss fills the rest of the line from the HDD
//!   (`Populate`, line validity with `partial_write_fill`).
//!
//! Some requests break these derivations: a trim (it invalidates lines), a request of a
//! class other than 0, one the engine refuses (out of range), a write of part of a line with
//! sector validity (the line would be partly valid) or without `partial_write_fill` (the
//! miss would not be admitted). The pass stops at the first one and reports [`Unfit`]; the
//! sweep then runs its engines ([`crate::sweep`]). No derived figure is ever printed where
//! the engine could have counted differently; `tests/stack_sweep.rs` compares every field
//! with the engines' on synthetic requests and shared real traces.
//!
//! Write-back is not derived: dirty evictions alone would follow from the distances (a
//! line is evicted between two accesses iff the second's distance is `>= c`), but cleaning
//! starts when a size's dirty lines pass its high watermark and writes back in LBA (or
//! ACP/ALRU) order, which changes which evictions are dirty and how many write-backs there
//! are per size: that needs each size's dirty set, i.e. an engine per size.

use crate::input::Skipped;
use crate::{finish, prepare, SimResult, SimSpec};
use anyhow::Result;
use std::time::Instant;
use tiercache_engine::engine::{LINE_BITS, MAX_VOLUME};
use tiercache_engine::{
    Admission, Counters, DirRequests, Engine, EngineConfig, Mode, Op, Request, Validity,
};

/// How a sweep computed a result ([`SimResult::method`]).
pub const METHOD_STACK: &str = "stack";
/// An engine per point.
pub const METHOD_ENGINES: &str = "engines";

/// Whether a cell's counters can be derived from the stack-distance pass (see the module):
/// every setting that could make a missed line not be inserted, a line dirty or partly
/// valid, or the policy anything but plain LRU, takes the engines.
pub fn eligible(s: &SimSpec) -> bool {
    let e = &s.engine;
    s.log.is_none()
        && e.shards <= 1
        && e.ram_cache == 0
        && tiercache_engine::policy::lookup(&e.policy).is_some_and(|p| p.name == "lru")
        && e.mode == Mode::WriteThrough
        && e.admission == Admission::ALWAYS
        && e.seq_cutoff.read_bytes == 0
        && e.seq_cutoff.write_bytes == 0
        && e.group_size == e.line_size
        && e.volumes.is_empty()
        && e.pool_lines.is_empty()
        && e.dirty_copies < 2
        && e.policy_params.classes.is_none()
        && e.policy_params.volume_shares.is_empty()
}

/// What makes two eligible cells share one pass: the same input (checked by the caller)
/// and the same line geometry; every other eligible setting is the same by [`eligible`].
pub fn pass_key(e: &EngineConfig) -> (u64, Validity, bool) {
    (e.line_size, e.validity, e.partial_write_fill)
}

/// The pass met a request whose effect the stack model does not derive exactly.
#[derive(Debug)]
pub struct Unfit(pub String);

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the LRU stack pass does not model {}", self.0)
    }
}

impl std::error::Error for Unfit {}

/// Exact LRU stack distances over a stream of line keys. Access times are compacted when
/// the tree fills up (the live ones renumbered in order: a prefix count over the old times,
/// then one sequential walk of the map), so the tree stays a few times the number of
/// distinct lines, whatever the trace's length.
struct Distances {
    /// Line key -> time of its latest access (1-based).
    last: hashbrown::HashMap<u64, u32>,
    /// Whether a time is still some line's latest access.
    alive: Vec<bool>,
    /// Fenwick tree over `alive` (index 0 unused).
    fw: Vec<i32>,
    /// Latest time used.
    t: usize,
}

impl Distances {
    fn new() -> Self {
        let mut d = Distances {
            last: hashbrown::HashMap::new(),
            alive: Vec::new(),
            fw: Vec::new(),
            t: 0,
        };
        d.resize(1 << 16);
        d
    }

    /// Renumbers the live times 1.. in order into a tree of `n` times.
    fn resize(&mut self, n: usize) {
        // rank[t]: live times in 1..=t, the new number of a live time t.
        let mut rank = vec![0u32; self.t + 1];
        let mut j = 0u32;
        for (r, &a) in rank.iter_mut().zip(&self.alive).skip(1) {
            j += a as u32;
            *r = j;
        }
        debug_assert_eq!(j as usize, self.last.len());
        let mut alive = vec![false; n + 1];
        for v in self.last.values_mut() {
            *v = rank[*v as usize];
            alive[*v as usize] = true;
        }
        let mut fw: Vec<i32> = alive.iter().map(|&a| a as i32).collect();
        for i in 1..=n {
            let up = i + (i & i.wrapping_neg());
            if up <= n {
                fw[up] += fw[i];
            }
        }
        (self.alive, self.fw, self.t) = (alive, fw, j as usize);
    }

    /// Live times in `(p, q]` (`p <= q`): both prefix walks, stopped where they meet.
    #[inline]
    fn between(&self, p: usize, q: usize) -> u64 {
        let (mut i, mut j, mut s) = (q, p, 0i64);
        while i != j {
            if i > j {
                s += self.fw[i] as i64;
                i &= i - 1;
            } else {
                s -= self.fw[j] as i64;
                j &= j - 1;
            }
        }
        s as u64
    }

    #[inline]
    fn add(&mut self, mut i: usize, v: i32) {
        while i < self.fw.len() {
            self.fw[i] += v;
            i += i & i.wrapping_neg();
        }
    }

    /// Records an access to `key`: its stack distance, or `None` for a first access.
    #[inline]
    fn access(&mut self, key: u64) -> Option<u64> {
        if self.t + 1 >= self.fw.len() {
            // Room for at least twice as many accesses as there are live lines before the
            // next compaction.
            let n = (3 * self.last.len() + 2).max(1 << 16);
            self.resize(n);
        }
        self.t += 1;
        let t = self.t;
        let d = match self.last.insert(key, t as u32) {
            Some(p) => {
                let p = p as usize;
                let d = self.between(p, t - 1);
                self.add(p, -1);
                self.alive[p] = false;
                Some(d)
            }
            None => None,
        };
        self.add(t, 1);
        self.alive[t] = true;
        d
    }

    fn distinct(&self) -> u64 {
        self.last.len() as u64
    }
}

/// Counts by bucket: bucket `b` holds the accesses whose distance is at least the `b`-th
/// smallest capacity and below the next, bucket `caps.len()` the ones that miss at every
/// capacity (first accesses included). An access hits at capacity index `i` iff its
/// bucket is `<= i`.
#[derive(Default)]
struct Tally {
    read_lines: Vec<u64>,
    /// Bytes of the read line parts (what a hit reads from the SSD).
    read_hit_bytes: Vec<u64>,
    write_lines: Vec<u64>,
    /// Bytes of the written lines outside the written part (what a miss fills from the HDD).
    write_fill_bytes: Vec<u64>,
    /// Read / write requests (of at least one line) by the bucket of their largest and of
    /// their smallest distance.
    read_max: Vec<u64>,
    read_min: Vec<u64>,
    write_max: Vec<u64>,
    write_min: Vec<u64>,
    requests: u64,
    reads: u64,
    writes: u64,
    flushes: u64,
    read_bytes: u64,
    write_bytes: u64,
    /// Reads / writes of 0 bytes (full hits with no line access).
    empty_reads: u64,
    empty_writes: u64,
}

fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

impl Tally {
    fn new(buckets: usize) -> Self {
        let z = || vec![0u64; buckets];
        Tally {
            read_lines: z(),
            read_hit_bytes: z(),
            write_lines: z(),
            write_fill_bytes: z(),
            read_max: z(),
            read_min: z(),
            write_max: z(),
            write_min: z(),
            ..Default::default()
        }
    }

    /// Every counter of an engine of capacity `caps[i]` = `cap` that ran the pass's
    /// requests (the module's derivations).
    fn counters(&self, i: usize, cap: u64, line_size: u64, distinct: u64) -> Counters {
        let pre = |v: &[u64]| sum(&v[..=i]);
        let post = |v: &[u64]| sum(&v[i + 1..]);
        let read_line_accesses = sum(&self.read_lines);
        let read_line_hits = pre(&self.read_lines);
        let write_line_accesses = sum(&self.write_lines);
        let write_line_hits = pre(&self.write_lines);
        let line_accesses = read_line_accesses + write_line_accesses;
        let line_hits = read_line_hits + write_line_hits;
        let line_misses = line_accesses - line_hits;
        let read_misses = read_line_accesses - read_line_hits;
        let fill = post(&self.write_fill_bytes);
        let dir = |max: &[u64], min: &[u64], empty: u64| {
            let hits = pre(max);
            let full_misses = post(min);
            DirRequests {
                hits: hits + empty,
                partial_misses: sum(max) - hits - full_misses,
                full_misses,
                pass_through: 0,
            }
        };
        let read_requests = dir(&self.read_max, &self.read_min, self.empty_reads);
        let write_requests = dir(&self.write_max, &self.write_min, self.empty_writes);
        Counters {
            requests: self.requests,
            reads: self.reads,
            writes: self.writes,
            flushes: self.flushes,
            read_bytes: self.read_bytes,
            write_bytes: self.write_bytes,
            line_accesses,
            line_hits,
            line_misses,
            read_line_accesses,
            read_line_hits,
            write_line_accesses,
            write_line_hits,
            full_hits: read_requests.hits + write_requests.hits,
            partial_hits: read_requests.partial_misses + write_requests.partial_misses,
            full_misses: read_requests.full_misses + write_requests.full_misses,
            read_requests,
            write_requests,
            admitted_misses: line_misses,
            insertions: line_misses,
            evictions: line_misses - distinct.min(cap),
            ssd_bytes_read: pre(&self.read_hit_bytes),
            ssd_bytes_written: read_misses * line_size + self.write_bytes + fill,
            hdd_bytes_read: read_misses * line_size + fill,
            hdd_bytes_written: self.write_bytes,
            ..Default::default()
        }
    }
}

/// What one cell of the pass is: its engine's capacity and index RAM.
struct Point {
    cell: usize,
    cfg: EngineConfig,
    footprint: Option<u64>,
    counters: Counters,
    index_bytes: usize,
}

impl crate::result::EngineFigures for Point {
    fn counters(&self) -> Counters {
        self.counters
    }
    fn class_counters(&self, class: u8) -> Counters {
        // Requests of other classes make the pass unfit.
        if class == 0 {
            self.counters
        } else {
            Counters::default()
        }
    }
    fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    fn capacity_lines(&self) -> u64 {
        self.cfg.capacity_lines
    }
    fn index_bytes(&self) -> usize {
        self.index_bytes
    }
    fn policy_name(&self) -> &'static str {
        "lru"
    }
    fn dirty_lines(&self) -> u64 {
        0
    }
    fn shards(&self) -> u32 {
        1
    }
    fn volume_figures(&self) -> Vec<crate::volumes::VolumeFigures> {
        Vec::new()
    }
}

/// Runs `cells` (eligible, one input, one [`pass_key`]) from one stack-distance pass.
/// `Err(Unfit)` when a request breaks the model (the caller runs engines instead); else a
/// result per cell, as its engine would have reported it (wall time: the pass's).
#[allow(clippy::type_complexity)]
pub fn run(
    specs: &[SimSpec],
    cells: &[usize],
    footprint_of: &(dyn Fn(&SimSpec) -> Option<u64> + Sync),
    add_read: &(dyn Fn(u64) + Sync),
) -> Result<Vec<(usize, Result<SimResult>)>, Unfit> {
    debug_assert!(cells.iter().all(|&c| eligible(&specs[c])));
    let mut out = Vec::with_capacity(cells.len());
    let mut points = Vec::with_capacity(cells.len());
    for &cell in cells {
        let spec = &specs[cell];
        // The engine the cell would run: its errors (a size of 0 lines, too many lines)
        // are the cell's, and a fresh engine's index RAM is the run's (no state grows in
        // this configuration, but for the wide keys handled below).
        match prepare(spec, footprint_of(spec)) {
            Ok((engine, footprint)) => points.push(Point {
                cell,
                cfg: engine.config().clone(),
                footprint,
                counters: Counters::default(),
                index_bytes: engine.index_bytes(),
            }),
            Err(e) => out.push((cell, Err(e))),
        }
    }
    if points.is_empty() {
        return Ok(out);
    }
    let first = &specs[points[0].cell];
    let (ls, validity, pwf) = pass_key(&first.engine);
    let mut caps: Vec<u64> = points.iter().map(|p| p.cfg.capacity_lines).collect();
    caps.sort_unstable();
    caps.dedup();
    let start = Instant::now();
    let pass = pass(&first.input, ls, validity, pwf, &caps, add_read);
    let wall = start.elapsed().as_secs_f64();
    let (tally, distinct, wide, skipped) = match pass {
        Ok(p) => p,
        Err(e) => match e.downcast::<Unfit>() {
            Ok(u) => return Err(u),
            // The input failed (a malformed record, an unreadable file): every cell
            // reports it, as its engine's pass would have.
            Err(e) => {
                for p in points {
                    out.push((p.cell, Err(anyhow::anyhow!("{e:#}"))));
                }
                return Ok(out);
            }
        },
    };
    for mut p in points {
        let spec = &specs[p.cell];
        if let Some(f) = p.footprint {
            debug_assert_eq!(f, distinct, "footprint pre-pass and stack pass disagree");
        }
        let i = caps.partition_point(|&c| c < p.cfg.capacity_lines);
        p.counters = tally.counters(i, p.cfg.capacity_lines, ls, distinct);
        if !wide.is_empty() {
            // A key of 2^32 - 1 or more widens the engine's key store (`Keys`), whose size
            // then follows the distinct high words its keys had (a table of them, coded in a
            // byte per slot, or a word per slot past 254): the requests that first brought
            // each, in order, on a fresh engine store them as the run did (every first touch
            // of a key is a miss that stores it).
            match prepare(spec, p.footprint) {
                Ok((mut e, _)) => {
                    for r in &wide {
                        e.process(r).map_err(|e| Unfit(format!("{e}")))?;
                    }
                    p.index_bytes = e.index_bytes();
                }
                Err(e) => return Err(Unfit(format!("{e:#}"))),
            }
        }
        let res = finish(spec, &p, p.footprint, wall, tally.requests, skipped.clone());
        out.push((p.cell, res));
    }
    Ok(out)
}

/// The pass: the tally, the distinct lines, the requests that first brought a key too wide
/// for the engine's narrow key store with each high word (in order; enough of them to widen
/// the store past its codes), and what the input skipped.
fn pass(
    input: &crate::Input,
    ls: u64,
    validity: Validity,
    partial_write_fill: bool,
    caps: &[u64],
    add_read: &(dyn Fn(u64) + Sync),
) -> Result<(Tally, u64, Vec<Request>, Skipped)> {
    let shift = ls.trailing_zeros();
    let mut d = Distances::new();
    let mut t = Tally::new(caps.len() + 1);
    let mut wide: Vec<Request> = Vec::new();
    let mut highs = std::collections::HashSet::new();
    let miss_all = caps.len();
    let bucket = |dist: Option<u64>| match dist {
        Some(x) => caps.partition_point(|&c| c <= x),
        None => miss_all,
    };
    let skipped = input.for_each_batch_counted(|batch| {
        for r in batch {
            // The engine's own checks (`Engine::check_request`): a refused request is an
            // engine error, which the engines report.
            let in_range = r
                .offset
                .checked_add(r.len)
                .is_some_and(|e| (e >> shift) < (1u64 << LINE_BITS));
            if r.class != 0 || r.volume > MAX_VOLUME || !in_range {
                return Err(Unfit(format!(
                    "request {} ({r:?}): class, volume or range",
                    t.requests + 1
                ))
                .into());
            }
            t.requests += 1;
            match r.op {
                Op::Flush => {
                    t.flushes += 1;
                    continue;
                }
                Op::Trim => {
                    return Err(Unfit(format!("trims (request {})", t.requests)).into());
                }
                Op::Read | Op::Write => {}
            }
            let write = r.op == Op::Write;
            if write {
                t.writes += 1;
                t.write_bytes += r.len;
            } else {
                t.reads += 1;
                t.read_bytes += r.len;
            }
            if r.len == 0 {
                *if write {
                    &mut t.empty_writes
                } else {
                    &mut t.empty_reads
                } += 1;
                continue;
            }
            let (first, last) = (r.offset >> shift, (r.end() - 1) >> shift);
            let (mut lo_b, mut hi_b) = (usize::MAX, 0usize);
            for l in first..=last {
                let start = l << shift;
                let (lo, hi) = (r.offset.max(start), r.end().min(start + ls));
                let part = hi - lo;
                if write && part != ls && (validity == Validity::Sector || !partial_write_fill) {
                    return Err(Unfit(format!(
                        "a write of part of a line with {} validity{} (request {})",
                        validity.as_str(),
                        if partial_write_fill {
                            ""
                        } else {
                            " and no partial write fill"
                        },
                        t.requests
                    ))
                    .into());
                }
                let key = Engine::line_key(r.volume, l);
                // (More than 256 distinct high words: the store is a word per slot whatever
                // follows.)
                if key >= u32::MAX as u64
                    && highs.len() <= 256
                    && (highs.insert(key >> 32) || wide.is_empty())
                {
                    wide.push(*r);
                }
                let b = bucket(d.access(key));
                lo_b = lo_b.min(b);
                hi_b = hi_b.max(b);
                if write {
                    t.write_lines[b] += 1;
                    t.write_fill_bytes[b] += ls - part;
                } else {
                    t.read_lines[b] += 1;
                    t.read_hit_bytes[b] += part;
                }
            }
            if write {
                t.write_max[hi_b] += 1;
                t.write_min[lo_b] += 1;
            } else {
                t.read_max[hi_b] += 1;
                t.read_min[lo_b] += 1;
            }
        }
        add_read(batch.len() as u64);
        Ok(())
    })?;
    let distinct = d.distinct();
    Ok((t, distinct, wide, skipped))
}
