//! Counters that add up. The engine keeps one [`Counters`] per class; totals are their sum.
//!
//! Invariants (checked by `Counters::check`, and by the conformance tests after every run):
//! - `requests = reads + writes + trims + flushes`
//! - `line_accesses = line_hits + line_misses = read_line_accesses + write_line_accesses`
//! - `line_misses = admitted_misses + bypasses.total()`
//! - `full_hits + partial_hits + full_misses = reads + writes`
//! - `insertions + sector_fills >= admitted_misses` (group population inserts more)
//! - per direction: `hits + partial_misses + full_misses + pass_through = reads` (writes)

use serde::{Deserialize, Serialize};
use std::ops::AddAssign;

/// Why a missed line was not put in the cache. Counted per line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bypass {
    /// Its group had not reached the populate threshold (or the threshold is 0).
    Admission,
    /// Part of a sequential stream past the cutoff.
    SeqCutoff,
    /// The write mode does not cache it (write-around and read-only writes, pass-through).
    Mode,
    /// A partial-line write with `partial_write_fill = false`.
    PartialWrite,
    /// The cache has no capacity.
    NoCapacity,
    /// The line's I/O class is not allocated now (DSS selective allocation, a class marked
    /// `never`, or a partition with no room).
    Class,
    /// A write that would have dirtied a line found no slot for its mirrored copy
    /// (`dirty_copies` 2): the line was written through and kept clean.
    NoCopy,
}

/// Per-reason bypass counts (lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bypasses {
    pub admission: u64,
    pub seq_cutoff: u64,
    pub mode: u64,
    pub partial_write: u64,
    pub no_capacity: u64,
    #[serde(default)]
    pub class: u64,
    #[serde(default)]
    pub no_copy: u64,
}

impl Bypasses {
    pub fn total(&self) -> u64 {
        self.admission
            + self.seq_cutoff
            + self.mode
            + self.partial_write
            + self.no_capacity
            + self.class
            + self.no_copy
    }

    #[inline]
    pub fn add(&mut self, why: Bypass) {
        *match why {
            Bypass::Admission => &mut self.admission,
            Bypass::SeqCutoff => &mut self.seq_cutoff,
            Bypass::Mode => &mut self.mode,
            Bypass::PartialWrite => &mut self.partial_write,
            Bypass::NoCapacity => &mut self.no_capacity,
            Bypass::Class => &mut self.class,
            Bypass::NoCopy => &mut self.no_copy,
        } += 1;
    }
}

/// Read or write requests by outcome (casadm's per-direction request table). The four add up
/// to the direction's requests: `pass_through` is a request none of whose lines hit and all of
/// whose missed lines went around the cache (a bypass of any reason); `full_misses` are the
/// other requests with no line hit (some line was put in the cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirRequests {
    pub hits: u64,
    pub partial_misses: u64,
    pub full_misses: u64,
    pub pass_through: u64,
}

impl DirRequests {
    pub fn total(&self) -> u64 {
        self.hits + self.partial_misses + self.full_misses + self.pass_through
    }

    /// Counts one request of `hits` line hits, `misses` line misses of which `bypassed` went
    /// around the cache.
    #[inline]
    pub fn count(&mut self, hits: u64, misses: u64, bypassed: u64) {
        *self.outcome(hits, misses, bypassed) += 1;
    }

    /// Takes back one request counted by [`DirRequests::count`] with the same figures (a
    /// request processed in pieces is counted again once its last piece is known).
    #[inline]
    pub fn uncount(&mut self, hits: u64, misses: u64, bypassed: u64) {
        let n = self.outcome(hits, misses, bypassed);
        debug_assert!(*n > 0, "uncounting a request that was not counted");
        *n = n.saturating_sub(1);
    }

    /// The counter of a request's outcome (the one definition both layouts use).
    #[inline]
    fn outcome(&mut self, hits: u64, misses: u64, bypassed: u64) -> &mut u64 {
        debug_assert!(bypassed <= misses);
        if misses == 0 {
            &mut self.hits
        } else if hits > 0 {
            &mut self.partial_misses
        } else if bypassed == misses {
            &mut self.pass_through
        } else {
            &mut self.full_misses
        }
    }

    /// `self - o` field by field, at least 0 (the counts since a statistics reset).
    pub fn saturating_sub(self, o: DirRequests) -> DirRequests {
        DirRequests {
            hits: self.hits.saturating_sub(o.hits),
            partial_misses: self.partial_misses.saturating_sub(o.partial_misses),
            full_misses: self.full_misses.saturating_sub(o.full_misses),
            pass_through: self.pass_through.saturating_sub(o.pass_through),
        }
    }
}

impl AddAssign<&DirRequests> for DirRequests {
    fn add_assign(&mut self, o: &DirRequests) {
        self.hits += o.hits;
        self.partial_misses += o.partial_misses;
        self.full_misses += o.full_misses;
        self.pass_through += o.pass_through;
    }
}

/// Event counters of one class (or, summed, of the whole run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub flushes: u64,
    /// Bytes the clients read and wrote.
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub line_accesses: u64,
    pub line_hits: u64,
    pub line_misses: u64,
    pub read_line_accesses: u64,
    pub read_line_hits: u64,
    pub write_line_accesses: u64,
    pub write_line_hits: u64,
    /// Read/write requests whose lines all hit / some hit / none hit.
    pub full_hits: u64,
    pub partial_hits: u64,
    pub full_misses: u64,
    /// Read requests by outcome ([`DirRequests`]; absent in results of older versions).
    #[serde(default)]
    pub read_requests: DirRequests,
    /// Write requests by outcome.
    #[serde(default)]
    pub write_requests: DirRequests,
    /// Missed lines that were put in the cache.
    pub admitted_misses: u64,
    pub bypasses: Bypasses,
    /// Lines put in the cache (misses admitted plus group population).
    pub insertions: u64,
    /// Missed lines already in the cache whose absent sectors were read from the backing
    /// device and filled in (sector validity only).
    pub sector_fills: u64,
    /// Lines evicted to make room.
    pub evictions: u64,
    /// Evicted lines that were dirty (each also counts as a write-back).
    pub dirty_evictions: u64,
    /// Lines dropped by writes (read-only, pass-through) and trims.
    pub invalidations: u64,
    /// Dirty lines written to the backing device (evictions and cleaning).
    pub write_backs: u64,
    /// Chunk rewrites by cleaning (one backing write for a dense chunk's dirty lines and
    /// gaps; its lines also count as write-backs). Counted in class 0.
    pub chunk_rewrites: u64,
    pub ssd_bytes_read: u64,
    pub ssd_bytes_written: u64,
    pub hdd_bytes_read: u64,
    pub hdd_bytes_written: u64,
}

/// Calls `$m!(every plain u64 field of Counters)`: the one list the field-by-field
/// operations use (the nested `bypasses` and per-direction requests are handled beside it).
macro_rules! counter_fields {
    ($m:ident) => {
        $m!(
            requests,
            reads,
            writes,
            trims,
            flushes,
            read_bytes,
            write_bytes,
            line_accesses,
            line_hits,
            line_misses,
            read_line_accesses,
            read_line_hits,
            write_line_accesses,
            write_line_hits,
            full_hits,
            partial_hits,
            full_misses,
            admitted_misses,
            insertions,
            sector_fills,
            evictions,
            dirty_evictions,
            invalidations,
            write_backs,
            chunk_rewrites,
            ssd_bytes_read,
            ssd_bytes_written,
            hdd_bytes_read,
            hdd_bytes_written
        )
    };
}

impl AddAssign<&Counters> for Counters {
    fn add_assign(&mut self, o: &Counters) {
        macro_rules! add {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        counter_fields!(add);
        let (b, ob) = (&mut self.bypasses, &o.bypasses);
        b.admission += ob.admission;
        b.seq_cutoff += ob.seq_cutoff;
        b.mode += ob.mode;
        b.partial_write += ob.partial_write;
        b.no_capacity += ob.no_capacity;
        b.class += ob.class;
        b.no_copy += ob.no_copy;
        self.read_requests += &o.read_requests;
        self.write_requests += &o.write_requests;
    }
}

impl Counters {
    /// Adds `now - before` field by field (what happened between two snapshots of one set
    /// of counters; wrapping, so a counter taken back in between is exact too).
    pub fn add_delta(&mut self, now: &Counters, before: &Counters) {
        macro_rules! d {
            ($($f:ident).+) => {
                self.$($f).+ = self.$($f).+.wrapping_add(now.$($f).+.wrapping_sub(before.$($f).+));
            };
        }
        macro_rules! all {
            ($($f:ident),*) => { $( d!($f); )* };
        }
        counter_fields!(all);
        d!(bypasses.admission);
        d!(bypasses.seq_cutoff);
        d!(bypasses.mode);
        d!(bypasses.partial_write);
        d!(bypasses.no_capacity);
        d!(bypasses.class);
        d!(bypasses.no_copy);
        for (s, n, b) in [
            (
                &mut self.read_requests,
                &now.read_requests,
                &before.read_requests,
            ),
            (
                &mut self.write_requests,
                &now.write_requests,
                &before.write_requests,
            ),
        ] {
            s.hits = s.hits.wrapping_add(n.hits.wrapping_sub(b.hits));
            s.partial_misses = s
                .partial_misses
                .wrapping_add(n.partial_misses.wrapping_sub(b.partial_misses));
            s.full_misses = s
                .full_misses
                .wrapping_add(n.full_misses.wrapping_sub(b.full_misses));
            s.pass_through = s
                .pass_through
                .wrapping_add(n.pass_through.wrapping_sub(b.pass_through));
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Counters {
    /// Line hit ratio over reads and writes.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.line_hits, self.line_accesses)
    }

    pub fn read_hit_ratio(&self) -> f64 {
        ratio(self.read_line_hits, self.read_line_accesses)
    }

    pub fn write_hit_ratio(&self) -> f64 {
        ratio(self.write_line_hits, self.write_line_accesses)
    }

    pub fn miss_ratio(&self) -> f64 {
        ratio(self.line_misses, self.line_accesses)
    }

    /// Checks the invariants in the module documentation; returns the first that fails.
    pub fn check(&self) -> Result<(), String> {
        let c = self;
        let rules: [(&str, u64, u64); 8] = [
            (
                "requests = reads+writes+trims+flushes",
                c.requests,
                c.reads + c.writes + c.trims + c.flushes,
            ),
            (
                "line_accesses = hits+misses",
                c.line_accesses,
                c.line_hits + c.line_misses,
            ),
            (
                "line_accesses = read+write line accesses",
                c.line_accesses,
                c.read_line_accesses + c.write_line_accesses,
            ),
            (
                "line_hits = read+write line hits",
                c.line_hits,
                c.read_line_hits + c.write_line_hits,
            ),
            (
                "line_misses = admitted+bypassed",
                c.line_misses,
                c.admitted_misses + c.bypasses.total(),
            ),
            (
                "full_hits+partial_hits+full_misses = reads+writes",
                c.full_hits + c.partial_hits + c.full_misses,
                c.reads + c.writes,
            ),
            (
                "read requests by outcome = reads",
                c.read_requests.total(),
                c.reads,
            ),
            (
                "write requests by outcome = writes",
                c.write_requests.total(),
                c.writes,
            ),
        ];
        for (what, a, b) in rules {
            if a != b {
                return Err(format!("counter invariant broken: {what} ({a} != {b})"));
            }
        }
        if c.insertions + c.sector_fills < c.admitted_misses {
            return Err(format!(
                "counter invariant broken: insertions {} + sector fills {} < admitted misses {}",
                c.insertions, c.sector_fills, c.admitted_misses
            ));
        }
        if c.write_backs < c.dirty_evictions {
            return Err("counter invariant broken: write_backs < dirty_evictions".into());
        }
        Ok(())
    }
}
