//! A page-mapped flash translation layer: pages, erase blocks, over-provisioning, greedy
//! garbage collection, TRIM, erase counts and write amplification.
//!
//! The host writes logical pages; each write goes to the next free page of the open block and
//! invalidates the page's previous physical copy. When free blocks run low, greedy garbage
//! collection picks the full block with the fewest valid pages, copies those forward into a
//! separate GC block and erases the victim. TRIM invalidates without writing. Write
//! amplification = flash pages programmed / host pages written.
//!
//! Two ways to drive it: directly ([`PageFtl::write`], [`PageFtl::trim`]) from a plan's SSD
//! steps in the hit-ratio simulator, or as the [`Ftl`] of the timed SSD model, which then
//! also charges the flash time of GC copies and erases.

use crate::ssd::{FlashCmd, FlashOp, Ftl, SsdConfig};
use crate::{IoKind, IoOp};
use serde::Serialize;
use std::collections::VecDeque;

const NONE: u32 = u32::MAX;
/// Free blocks kept back for garbage collection (one for the host stream, one for GC copies).
const RESERVE: usize = 2;

/// Shape of the flash.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FtlConfig {
    /// Bytes the host can address.
    pub logical_bytes: u64,
    pub page_bytes: u64,
    /// Pages per erase block.
    pub pages_per_block: u32,
    /// Spare flash beyond the logical size, as a share of it (0.07 = 7 %).
    pub over_provisioning: f64,
    /// Page-mapped ([`PageFtl`]) or hybrid log-block ([`crate::HybridFtl`]).
    pub kind: FtlKind,
    /// Hybrid FTL only: log blocks as a share of the data blocks (the Nitro seed: 10 %).
    pub log_blocks: f64,
}

/// Which FTL model maps the flash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FtlKind {
    /// Every page mapped anywhere; greedy garbage collection ([`PageFtl`]).
    #[default]
    Page,
    /// Block-mapped data blocks and a few page-mapped log blocks consolidated by switch,
    /// partial and full merges ([`crate::HybridFtl`]), the FTL of the Nitro seed's SSD.
    Hybrid,
}

impl std::fmt::Display for FtlKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FtlKind::Page => "page",
            FtlKind::Hybrid => "hybrid",
        })
    }
}

impl std::str::FromStr for FtlKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "page" => Ok(FtlKind::Page),
            "hybrid" | "log-block" => Ok(FtlKind::Hybrid),
            o => Err(format!(
                "unknown FTL '{o}': 'page' (page-mapped, greedy GC) or 'hybrid' (log blocks and merges)"
            )),
        }
    }
}

impl FtlConfig {
    /// `logical_bytes` of 4 KiB pages in 2 MiB erase blocks with 7 % over-provisioning (the
    /// Nitro seed's unmodified SSD).
    pub fn new(logical_bytes: u64) -> Self {
        FtlConfig {
            logical_bytes,
            page_bytes: 4096,
            pages_per_block: 512,
            over_provisioning: 0.07,
            kind: FtlKind::Page,
            log_blocks: 0.10,
        }
    }

    pub fn block_bytes(&self) -> u64 {
        self.page_bytes * self.pages_per_block as u64
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.page_bytes == 0 || !self.page_bytes.is_power_of_two() {
            return Err(format!(
                "FTL page size {} must be a power of two",
                self.page_bytes
            ));
        }
        if self.pages_per_block == 0 {
            return Err("FTL erase blocks need at least one page".into());
        }
        if !(0.0..=10.0).contains(&self.over_provisioning) {
            return Err(format!(
                "over-provisioning {} must be between 0 and 10",
                self.over_provisioning
            ));
        }
        if !(0.0..=1.0).contains(&self.log_blocks) {
            return Err(format!(
                "log blocks {} must be a share of the data blocks between 0 and 1",
                self.log_blocks
            ));
        }
        if self.logical_bytes / self.page_bytes >= NONE as u64 / 2 {
            return Err("FTL logical size too large".into());
        }
        Ok(())
    }
}

/// What the flash did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FtlStats {
    pub host_pages_written: u64,
    pub gc_pages_copied: u64,
    pub pages_trimmed: u64,
    pub erasures: u64,
    pub gc_runs: u64,
    pub max_block_erasures: u32,
    pub write_amplification: f64,
    /// Hybrid FTL: a complete sequential log block became the data block (no copy).
    pub switch_merges: u64,
    /// Hybrid FTL: a sequential log block completed with the data block's rest, then switched.
    pub partial_merges: u64,
    /// Hybrid FTL: every live page of a logical block copied into a new data block.
    pub full_merges: u64,
}

/// The page-mapped FTL.
pub struct PageFtl {
    cfg: FtlConfig,
    ppb: u32,
    nblocks: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    erases: Vec<u32>,
    /// Whether a block is fully written (a GC candidate).
    full: Vec<bool>,
    free: VecDeque<u32>,
    host_blk: u32,
    host_wp: u32,
    gc_blk: u32,
    gc_wp: u32,
    stats: FtlStats,
    /// Flash commands produced since the last drain (for the timed model).
    pending: Vec<(FlashOp, u32, bool)>,
}

impl PageFtl {
    pub fn new(cfg: FtlConfig) -> Result<Self, String> {
        cfg.validate()?;
        let ppb = cfg.pages_per_block;
        let lpages = cfg.logical_bytes.div_ceil(cfg.page_bytes);
        let ppages = (lpages as f64 * (1.0 + cfg.over_provisioning)).ceil() as u64;
        let nblocks = (ppages.div_ceil(ppb as u64) as u32) + RESERVE as u32 + 1;
        let mut free: VecDeque<u32> = (0..nblocks).collect();
        let host_blk = free.pop_front().expect("blocks");
        let gc_blk = free.pop_front().expect("blocks");
        Ok(PageFtl {
            cfg,
            ppb,
            nblocks,
            l2p: vec![NONE; lpages as usize],
            p2l: vec![NONE; nblocks as usize * ppb as usize],
            valid: vec![0; nblocks as usize],
            erases: vec![0; nblocks as usize],
            full: vec![false; nblocks as usize],
            free,
            host_blk,
            host_wp: 0,
            gc_blk,
            gc_wp: 0,
            stats: FtlStats::default(),
            pending: Vec::new(),
        })
    }

    pub fn config(&self) -> &FtlConfig {
        &self.cfg
    }

    pub fn blocks(&self) -> u32 {
        self.nblocks
    }

    pub fn stats(&self) -> FtlStats {
        self.stats.finished(&self.erases)
    }

    /// Erase count of every block.
    pub fn erase_counts(&self) -> &[u32] {
        &self.erases
    }

    /// Pages a byte range touches (clamped to the logical size).
    fn pages(&self, offset: u64, len: u64) -> std::ops::Range<u32> {
        page_range(self.cfg.page_bytes, self.l2p.len() as u64, offset, len)
    }

    fn invalidate(&mut self, lpn: u32) {
        let old = self.l2p[lpn as usize];
        if old != NONE {
            self.p2l[old as usize] = NONE;
            self.valid[(old / self.ppb) as usize] -= 1;
            self.l2p[lpn as usize] = NONE;
        }
    }

    /// Host write of a byte range (whole pages are programmed).
    pub fn write(&mut self, offset: u64, len: u64) {
        // Only `translate` reads the flash commands; driven directly, keep none.
        self.pending.clear();
        for lpn in self.pages(offset, len) {
            self.invalidate(lpn);
            if self.host_wp == self.ppb {
                self.full[self.host_blk as usize] = true;
                self.host_blk = self.take_free();
                self.host_wp = 0;
            }
            let ppn = self.host_blk * self.ppb + self.host_wp;
            self.host_wp += 1;
            self.map(lpn, ppn);
            self.stats.host_pages_written += 1;
            self.pending.push((FlashOp::Program, ppn, true));
        }
    }

    /// TRIM: the range's pages hold nothing worth keeping.
    pub fn trim(&mut self, offset: u64, len: u64) {
        self.pending.clear();
        for lpn in self.pages(offset, len) {
            if self.l2p[lpn as usize] != NONE {
                self.stats.pages_trimmed += 1;
            }
            self.invalidate(lpn);
        }
    }

    /// Physical page of a logical page, if written.
    pub fn lookup(&self, lpn: u32) -> Option<u32> {
        self.l2p.get(lpn as usize).copied().filter(|&p| p != NONE)
    }

    fn map(&mut self, lpn: u32, ppn: u32) {
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn;
        self.valid[(ppn / self.ppb) as usize] += 1;
    }

    /// A free block, collecting garbage first when the pool is low.
    fn take_free(&mut self) -> u32 {
        while self.free.len() < RESERVE {
            if !self.collect() {
                break;
            }
        }
        self.free
            .pop_front()
            .expect("FTL out of free blocks: over-provisioning too small")
    }

    /// One greedy GC pass: the full block with the fewest valid pages is copied forward and
    /// erased. Returns false when no block can be reclaimed.
    fn collect(&mut self) -> bool {
        let victim = (0..self.nblocks)
            .filter(|&b| self.full[b as usize] && b != self.host_blk && b != self.gc_blk)
            .min_by_key(|&b| (self.valid[b as usize], b));
        let Some(v) = victim else { return false };
        if self.valid[v as usize] == self.ppb {
            return false; // nothing to gain
        }
        self.stats.gc_runs += 1;
        for i in 0..self.ppb {
            let ppn = v * self.ppb + i;
            let lpn = self.p2l[ppn as usize];
            if lpn == NONE {
                continue;
            }
            if self.gc_wp == self.ppb {
                self.full[self.gc_blk as usize] = true;
                self.gc_blk = self
                    .free
                    .pop_front()
                    .expect("FTL out of free blocks during GC");
                self.gc_wp = 0;
            }
            self.invalidate(lpn);
            let dst = self.gc_blk * self.ppb + self.gc_wp;
            self.gc_wp += 1;
            self.map(lpn, dst);
            self.stats.gc_pages_copied += 1;
            self.pending.push((FlashOp::Read, ppn, false));
            self.pending.push((FlashOp::Program, dst, false));
        }
        debug_assert_eq!(self.valid[v as usize], 0);
        self.full[v as usize] = false;
        self.erases[v as usize] += 1;
        self.stats.erasures += 1;
        self.pending.push((FlashOp::Erase, v * self.ppb, false));
        self.free.push_back(v);
        true
    }

    /// Checks the mapping's invariants (tests).
    pub fn check(&self) -> Result<(), String> {
        let mut valid = vec![0u32; self.nblocks as usize];
        for (l, &p) in self.l2p.iter().enumerate() {
            if p != NONE {
                if self.p2l[p as usize] != l as u32 {
                    return Err(format!("l2p/p2l disagree at lpn {l}"));
                }
                valid[(p / self.ppb) as usize] += 1;
            }
        }
        if valid != self.valid {
            return Err("valid page counts disagree with the map".into());
        }
        Ok(())
    }
}

impl FtlStats {
    /// The counters with the figures derived from them filled in: the most erased block's
    /// count and the write amplification (0 before any host write).
    pub(crate) fn finished(mut self, erases: &[u32]) -> FtlStats {
        self.max_block_erasures = erases.iter().copied().max().unwrap_or(0);
        self.write_amplification = if self.host_pages_written > 0 {
            (self.host_pages_written + self.gc_pages_copied) as f64 / self.host_pages_written as f64
        } else {
            0.0
        };
        self
    }
}

/// Logical pages of `page_bytes` a byte range touches, clamped to `pages` logical pages.
pub(crate) fn page_range(
    page_bytes: u64,
    pages: u64,
    offset: u64,
    len: u64,
) -> std::ops::Range<u32> {
    if len == 0 {
        return 0..0;
    }
    let a = (offset / page_bytes).min(pages);
    let b = (offset + len).div_ceil(page_bytes).min(pages);
    a as u32..b as u32
}

/// What `translate` needs of a flash translation layer that queues the flash commands of
/// each host op (page-mapped and hybrid): one translation loop serves both.
pub(crate) trait Queued {
    fn apply_write(&mut self, offset: u64, len: u64);
    fn apply_trim(&mut self, offset: u64, len: u64);
    fn page_range(&self, offset: u64, len: u64) -> std::ops::Range<u32>;
    fn mapped(&self, lpn: u32) -> Option<u32>;
    fn queue(&mut self) -> &mut Vec<(FlashOp, u32, bool)>;
    /// (pages per erase block, page bytes)
    fn geometry(&self) -> (u32, u64);
}

/// The flash commands of one host op: a read reads each page where the FTL maps it (an
/// unmapped page: its own number), a write or TRIM runs in the FTL and the program, copy
/// and erase commands it queued are emitted, each on the unit its page or block lives on.
pub(crate) fn translate_queued<F: Queued>(
    f: &mut F,
    op: &IoOp,
    cfg: &SsdConfig,
    out: &mut Vec<FlashCmd>,
) {
    f.queue().clear();
    let units = cfg.units();
    let (ppb, pb) = f.geometry();
    match op.kind {
        IoKind::Write => f.apply_write(op.offset, op.len),
        IoKind::Trim => f.apply_trim(op.offset, op.len),
        IoKind::Flush => {}
        IoKind::Read => {
            for lpn in f.page_range(op.offset, op.len) {
                let unit = f.mapped(lpn).unwrap_or(lpn) as usize % units;
                out.push(FlashCmd {
                    op: FlashOp::Read,
                    unit,
                    bytes: pb,
                    host: true,
                });
            }
        }
    }
    let mut pending = std::mem::take(f.queue());
    for &(fop, ppn, host) in &pending {
        let unit = match fop {
            FlashOp::Erase => (ppn / ppb) as usize % units,
            _ => ppn as usize % units,
        };
        out.push(FlashCmd {
            op: fop,
            unit,
            bytes: if fop == FlashOp::Erase { 0 } else { pb },
            host,
        });
    }
    pending.clear();
    *f.queue() = pending;
}

impl Queued for PageFtl {
    fn apply_write(&mut self, offset: u64, len: u64) {
        self.write(offset, len)
    }
    fn apply_trim(&mut self, offset: u64, len: u64) {
        self.trim(offset, len)
    }
    fn page_range(&self, offset: u64, len: u64) -> std::ops::Range<u32> {
        self.pages(offset, len)
    }
    fn mapped(&self, lpn: u32) -> Option<u32> {
        self.lookup(lpn)
    }
    fn queue(&mut self) -> &mut Vec<(FlashOp, u32, bool)> {
        &mut self.pending
    }
    fn geometry(&self) -> (u32, u64) {
        (self.ppb, self.cfg.page_bytes)
    }
}

impl Ftl for PageFtl {
    fn translate(&mut self, _now_ns: u64, op: &IoOp, cfg: &SsdConfig, out: &mut Vec<FlashCmd>) {
        translate_queued(self, op, cfg, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn small(op: f64) -> PageFtl {
        PageFtl::new(FtlConfig {
            logical_bytes: 64 * 16 * 4096,
            page_bytes: 4096,
            pages_per_block: 16,
            over_provisioning: op,
            ..FtlConfig::new(0)
        })
        .unwrap()
    }

    #[test]
    fn sequential_block_overwrites_copy_nothing() {
        let mut f = small(0.07);
        let blk = 16 * 4096;
        for round in 0..10u64 {
            for b in 0..64u64 {
                f.write(((b + round * 7) % 64) * blk, blk);
            }
        }
        f.check().unwrap();
        let s = f.stats();
        assert_eq!(s.gc_pages_copied, 0);
        assert_eq!(s.write_amplification, 1.0);
        assert!(s.erasures > 500, "{s:?}");
    }

    #[test]
    fn random_small_writes_amplify_and_trim_helps() {
        let run = |trim_share: f64| {
            let mut f = small(0.07);
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let pages = 64 * 16;
            for p in 0..pages {
                f.write(p * 4096, 4096);
            }
            for _ in 0..20 * pages {
                let p = rng.gen_range(0..pages);
                f.write(p * 4096, 4096);
                if rng.gen_bool(trim_share) {
                    let q = rng.gen_range(0..pages);
                    f.trim(q * 4096, 4096);
                }
            }
            f.check().unwrap();
            f.stats()
        };
        let plain = run(0.0);
        let trimmed = run(0.5);
        assert!(plain.write_amplification > 2.0, "{plain:?}");
        assert!(trimmed.write_amplification < plain.write_amplification);
        assert!(trimmed.erasures < plain.erasures);
        assert_eq!(run(0.0), plain, "deterministic");
    }

    #[test]
    fn timed_translation_reports_gc_work() {
        let mut f = small(0.07);
        let cfg = SsdConfig::default();
        let mut out = Vec::new();
        for i in 0..(64 * 16 * 3) as u64 {
            f.translate(
                0,
                &IoOp::new(IoKind::Write, (i * 7919 % 1024) * 4096, 4096),
                &cfg,
                &mut out,
            );
        }
        assert!(out.iter().any(|c| c.op == FlashOp::Erase));
        assert!(
            out.iter()
                .filter(|c| c.op == FlashOp::Program && c.host)
                .count()
                >= 64 * 16 * 3
        );
    }
}
