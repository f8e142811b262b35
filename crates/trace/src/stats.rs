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
    /// Reads and writes by size: key = upper bound of a power-of-two bucket in bytes
    /// (bucket 4096 holds sizes 2049..=4096; bucket 1 holds sizes 0 and 1).
    pub size_histogram: BTreeMap<u64, u64>,
    pub mean_request_bytes: f64,
    /// Share of reads/writes that start exactly where the previous read or write of the same
    /// volume ended.
    pub sequential_share: f64,
    /// Share that start there or up to 64 KiB after it (includes the sequential ones).
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
                s.read_bytes = s.read_bytes.saturating_add(r.len);
            }
            Op::Write => {
                s.writes += 1;
                s.write_bytes = s.write_bytes.saturating_add(r.len);
            }
            Op::Trim => s.trims += 1,
            Op::Flush => s.flushes += 1,
        }
        if !matches!(r.op, Op::Read | Op::Write) || r.len == 0 {
            // Counts the volume; u64::MAX: no previous end to be sequential to.
            self.volumes.entry(r.volume).or_insert(u64::MAX);
            if r.op == Op::Read || r.op == Op::Write {
                *s.size_histogram.entry(1).or_insert(0) += 1;
            }
            return;
        }
        let bucket = r.len.checked_next_power_of_two().unwrap_or(1 << 63);
        *s.size_histogram.entry(bucket).or_insert(0) += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_footprint_sequentiality_and_histogram() {
        let mut b = StatsBuilder::new(512);
        let mut w = Request::write(4096, 8192); // blocks 1, 2
        w.time_ns = 1_000_000_000;
        b.add(&Request::read(0, 4096)); // block 0
        b.add(&w);
        b.add(&Request::read(12288, 100)); // sequential: block 3
        b.add(&Request::read(12388 + 65536, 1)); // near: block 19
        b.add(&Request::read(0, 1)); // backwards: block 0 again
        let mut other = Request::read(0, 4096);
        other.volume = 7; // same block number, other volume
        b.add(&other);
        b.add(&Request::new(5, Op::Trim, 0, 1 << 20));
        let mut f = Request::new(6, Op::Flush, 0, 0);
        f.volume = 9;
        b.add(&f);
        let s = b.finish(3);
        assert_eq!(
            (s.requests, s.reads, s.writes, s.trims, s.flushes),
            (8, 5, 1, 1, 1)
        );
        assert_eq!(s.read_bytes, 4096 + 100 + 1 + 1 + 4096);
        assert_eq!(s.write_bytes, 8192);
        assert!((s.read_share - 5.0 / 6.0).abs() < 1e-12);
        assert_eq!(s.footprint_blocks, 6);
        assert_eq!(s.block_accesses, 1 + 2 + 1 + 1 + 1 + 1);
        // 512-byte blocks: 8 + 16 + 1 + 1 + (0 again) + 8 on volume 7.
        assert_eq!(s.footprint_blocks_at_block_size, 34);
        assert_eq!(s.volumes, 3);
        assert!(
            (s.sequential_share - 2.0 / 6.0).abs() < 1e-12,
            "{}",
            s.sequential_share
        );
        assert!((s.near_sequential_share - 3.0 / 6.0).abs() < 1e-12);
        assert_eq!(s.size_histogram.get(&4096), Some(&2));
        assert_eq!(s.size_histogram.get(&8192), Some(&1));
        assert_eq!(s.size_histogram.get(&128), Some(&1));
        assert_eq!(s.size_histogram.get(&1), Some(&2));
        assert_eq!((s.min_offset, s.max_end), (0, 12388 + 65537));
        assert_eq!(s.duration_s, 1.0);
        assert_eq!(s.skipped, 3);
        let text = s.to_string();
        for want in [
            "requests        8 (5 reads",
            "footprint       6 distinct 4 KiB",
            "3 volume(s)",
            "skipped         3",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        let mut b = StatsBuilder::new(4096);
        b.add(&Request::read(u64::MAX - 4096, u64::MAX));
        b.add(&Request::read(0, 0));
        let s = b.finish(0);
        assert_eq!(s.requests, 2);
    }
}
