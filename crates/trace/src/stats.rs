//! What is in a trace, in one streaming pass: requests by operation, read share, bytes,
//! footprint (distinct 4 KiB blocks, and at a chosen block size), request-size histogram,
//! sequentiality, volumes, duration.

use crate::{open, Format, ReadOptions, TraceError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use tiercache_engine::{fmt_size, Op, Request};

/// Statistics of a request stream.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TraceStats {
    pub format: Option<String>,
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub flushes: u64,
    /// Reads / (reads + writes).
    pub read_share: f64,
    /// Bytes read / (bytes read + written).
    pub read_share_bytes: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Distinct 4 KiB blocks touched by reads and writes (block = offset / 4096 per volume).
    pub footprint_blocks: u64,
    pub footprint_bytes: u64,
    /// Distinct blocks at `block_size` (when another size was asked for).
    pub block_size: u64,
    pub footprint_blocks_at_block_size: u64,
    /// Accesses to 4 KiB blocks (each request split into the blocks it touches).
    pub block_accesses: u64,
    pub volumes: u64,
    pub min_offset: u64,
    pub max_end: u64,
    pub duration_s: f64,
    /// Requests by size: key = upper bound of a power-of-two bucket in bytes.
    pub size_histogram: BTreeMap<u64, u64>,
    pub mean_request_bytes: f64,
    /// Share of reads/writes that start exactly where the previous request of the same volume
    /// ended.
    pub sequential_share: f64,
    /// Share that start within 64 KiB after it.
    pub near_sequential_share: f64,
    /// Malformed records skipped (with --skip-bad).
    pub skipped: u64,
}

/// Accumulates [`TraceStats`].
pub struct StatsBuilder {
    s: TraceStats,
    blocks4k: BlockSet,
    blocks_bs: Option<BlockSet>,
    volumes: hashbrown::HashMap<u32, u64>,
    seq: u64,
    near: u64,
    max_time: u64,
    min_time: u64,
}

/// A set of (volume, block) pairs: 8 bytes per entry (volume < 2^24 and block < 2^40,
/// i.e. 4 PiB at 4 KiB), with a 16-byte side table for the rest.
#[derive(Default)]
struct BlockSet {
    packed: hashbrown::HashSet<u64>,
    wide: hashbrown::HashSet<(u32, u64)>,
}

impl BlockSet {
    #[inline]
    fn insert(&mut self, vol: u32, block: u64) {
        if vol < 1 << 24 && block < 1 << 40 {
            self.packed.insert((vol as u64) << 40 | block);
        } else {
            self.wide.insert((vol, block));
        }
    }

    fn len(&self) -> u64 {
        (self.packed.len() + self.wide.len()) as u64
    }
}

impl StatsBuilder {
    /// `block_size`: a second footprint granularity (4096 for none).
    pub fn new(block_size: u64) -> Self {
        let block_size = block_size.max(1);
        StatsBuilder {
            s: TraceStats {
                block_size,
                min_offset: u64::MAX,
                ..Default::default()
            },
            blocks4k: BlockSet::default(),
            blocks_bs: (block_size != 4096).then(BlockSet::default),
            volumes: hashbrown::HashMap::new(),
            seq: 0,
            near: 0,
            max_time: 0,
            min_time: u64::MAX,
        }
    }

    pub fn add(&mut self, r: &Request) {
        let s = &mut self.s;
        s.requests += 1;
        self.max_time = self.max_time.max(r.time_ns);
        self.min_time = self.min_time.min(r.time_ns);
        match r.op {
            Op::Read => {
                s.reads += 1;
                s.read_bytes += r.len;
            }
            Op::Write => {
                s.writes += 1;
                s.write_bytes += r.len;
            }
            Op::Trim => s.trims += 1,
            Op::Flush => s.flushes += 1,
        }
        if !matches!(r.op, Op::Read | Op::Write) {
            return;
        }
        let bucket = r.len.max(1).next_power_of_two();
        *s.size_histogram.entry(bucket).or_insert(0) += 1;
        if r.len == 0 {
            return;
        }
        s.min_offset = s.min_offset.min(r.offset);
        s.max_end = s.max_end.max(r.end());
        let (first, last) = (r.offset / 4096, (r.end() - 1) / 4096);
        s.block_accesses += last - first + 1;
        for b in first..=last {
            self.blocks4k.insert(r.volume, b);
        }
        if let Some(set) = &mut self.blocks_bs {
            let bs = s.block_size;
            for b in r.offset / bs..=(r.end() - 1) / bs {
                set.insert(r.volume, b);
            }
        }
        match self.volumes.insert(r.volume, r.end()) {
            Some(prev) if prev == r.offset => {
                self.seq += 1;
                self.near += 1;
            }
            Some(prev) if r.offset > prev && r.offset - prev <= 64 << 10 => self.near += 1,
            _ => {}
        }
    }

    pub fn finish(mut self, skipped: u64) -> TraceStats {
        let s = &mut self.s;
        let rw = s.reads + s.writes;
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        s.read_share = ratio(s.reads, rw);
        s.read_share_bytes = ratio(s.read_bytes, s.read_bytes + s.write_bytes);
        s.footprint_blocks = self.blocks4k.len();
        s.footprint_bytes = s.footprint_blocks * 4096;
        s.footprint_blocks_at_block_size = match &self.blocks_bs {
            Some(b) => b.len(),
            None => s.footprint_blocks,
        };
        s.volumes = self.volumes.len() as u64;
        if s.min_offset == u64::MAX {
            s.min_offset = 0;
        }
        s.duration_s = if s.requests > 0 {
            (self.max_time - self.min_time) as f64 / 1e9
        } else {
            0.0
        };
        s.mean_request_bytes = ratio(s.read_bytes + s.write_bytes, rw);
        s.sequential_share = ratio(self.seq, rw);
        s.near_sequential_share = ratio(self.near, rw);
        s.skipped = skipped;
        self.s
    }
}

/// Statistics of a trace file; `progress(n)` runs every 65,536 requests.
///
/// `opts.block_size` serves twice: as the reader's block unit (ARC blocks, oracleGeneral
/// ids) and as the second footprint granularity, so that `arc` traces count distinct
/// native blocks (P3 at 512 B: 762,543; OLTP read with 4096: 186,880).
pub fn stats_file(
    path: &Path,
    format: Option<Format>,
    opts: &ReadOptions,
    progress: &dyn Fn(u64),
) -> Result<TraceStats, TraceError> {
    let mut reader = open(path, format, opts)?;
    let mut b = StatsBuilder::new(opts.block_size.unwrap_or(4096));
    let mut n = 0u64;
    for r in reader.by_ref() {
        b.add(&r?);
        n += 1;
        if n & 0xffff == 0 {
            progress(n);
        }
    }
    let mut s = b.finish(reader.skipped());
    s.format = Some(reader.format().name().to_string());
    Ok(s)
}

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(fm) = &self.format {
            writeln!(f, "format          {fm}")?;
        }
        writeln!(
            f,
            "requests        {} ({} reads, {} writes, {} trims, {} flushes)",
            self.requests, self.reads, self.writes, self.trims, self.flushes
        )?;
        writeln!(
            f,
            "read share      {:.2} % of reads+writes, {:.2} % of their bytes",
            self.read_share * 100.0,
            self.read_share_bytes * 100.0
        )?;
        writeln!(
            f,
            "bytes           {} read, {} written; mean request {}",
            fmt_size(self.read_bytes),
            fmt_size(self.write_bytes),
            fmt_size(self.mean_request_bytes as u64)
        )?;
        writeln!(
            f,
            "footprint       {} distinct 4 KiB blocks ({}); {} block accesses",
            self.footprint_blocks,
            fmt_size(self.footprint_bytes),
            self.block_accesses
        )?;
        if self.block_size != 4096 {
            writeln!(
                f,
                "                {} distinct blocks of {}",
                self.footprint_blocks_at_block_size,
                fmt_size(self.block_size)
            )?;
        }
        writeln!(
            f,
            "address range   {} .. {} over {} volume(s)",
            self.min_offset, self.max_end, self.volumes
        )?;
        writeln!(f, "duration        {:.3} s", self.duration_s)?;
        writeln!(
            f,
            "sequentiality   {:.2} % sequential, {:.2} % within 64 KiB",
            self.sequential_share * 100.0,
            self.near_sequential_share * 100.0
        )?;
        writeln!(f, "request sizes")?;
        let total: u64 = self.size_histogram.values().sum();
        for (ub, n) in &self.size_histogram {
            let lo = if *ub <= 1 { 0 } else { ub / 2 + 1 };
            let pct = 100.0 * *n as f64 / total.max(1) as f64;
            let bar = "#".repeat((pct / 2.0).round() as usize);
            writeln!(
                f,
                "  {:>9} .. {:>9}  {:>9}  {:>6.2} % {bar}",
                fmt_size(lo),
                fmt_size(*ub),
                n,
                pct
            )?;
        }
        if self.skipped > 0 {
            writeln!(f, "skipped         {} malformed records", self.skipped)?;
        }
        Ok(())
    }
}
