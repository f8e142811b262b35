//! A hybrid (log-block) flash translation layer, after FAST (Lee et al., ACM TECS 2007), the
//! scheme of the Nitro seed's SSD simulator: data blocks are block-mapped (a logical page
//! lives at its own offset in its logical block's data block); writes go to a few log blocks,
//! which merges fold back into data blocks.
//!
//! - One sequential log block (SW): a write to offset 0 of a logical block opens it (merging
//!   the previous one); writes that continue it in order append to it.
//! - Random log blocks (RW), page-mapped and shared by all logical blocks: every other write
//!   is appended there. When they are all full, the oldest is reclaimed: every logical block
//!   with a live page in it is fully merged.
//! - Switch merge: a complete, in-order sequential log block becomes the data block; the old
//!   data block is erased. Nothing is copied.
//! - Partial merge: a sequential log block written in order from offset 0 but not to the end
//!   gets the rest of its logical block copied in, then is switched.
//! - Full merge: a fresh block receives the newest copy of every live page of a logical
//!   block (from the data block and the log blocks); the old data block is erased.
//!
//! So whole-block sequential writes cost one erase per block and no copies, while scattered
//! small writes cost a full merge (up to a block of copies and an erase) per logical block
//! they touch: the "orders of magnitude more erasures" of naive extent caching in the seed.
//! TRIM invalidates pages (merges skip them); a logical block left with no live page gives
//! its data block back (erased). Log blocks are `log_blocks` (10 %) of the data blocks, at
//! least two; over-provisioning (7 %) adds spare blocks to the free pool.

use crate::ftl::{page_range, translate_queued, FtlConfig, FtlKind, FtlStats, PageFtl, Queued};
use crate::ssd::{FlashCmd, FlashOp, Ftl, SsdConfig};
use crate::IoOp;
use std::collections::VecDeque;

const NONE: u32 = u32::MAX;
/// `loc` value of a page whose current copy is in its logical block's data block.
const IN_DATA: u32 = u32::MAX - 1;

/// The sequential log block.
#[derive(Clone, Copy, Debug)]
struct Seq {
    blk: u32,
    lbn: u32,
    /// Next offset expected (pages 0..wp were written in order).
    wp: u32,
}

/// The hybrid log-block FTL.
pub struct HybridFtl {
    cfg: FtlConfig,
    ppb: u32,
    nblocks: u32,
    lpages: u32,
    /// Data block of each logical block (NONE: none yet).
    data: Vec<u32>,
    /// Where each logical page's current copy is: NONE (never written or trimmed), IN_DATA,
    /// or a physical page in a log block.
    loc: Vec<u32>,
    /// Logical page programmed at each physical page of a log block (NONE: none).
    owner: Vec<u32>,
    erases: Vec<u32>,
    free: VecDeque<u32>,
    seq: Option<Seq>,
    /// Random log blocks, oldest first; the last one is being filled.
    rw: VecDeque<u32>,
    rw_wp: u32,
    rw_max: usize,
    stats: FtlStats,
    pending: Vec<(FlashOp, u32, bool)>,
}

impl HybridFtl {
    pub fn new(cfg: FtlConfig) -> Result<Self, String> {
        cfg.validate()?;
        let ppb = cfg.pages_per_block;
        let lpages = cfg.logical_bytes.div_ceil(cfg.page_bytes);
        let nlbn = lpages.div_ceil(ppb as u64).max(1);
        let log = ((nlbn as f64 * cfg.log_blocks).round() as u64).max(2);
        let spare = (nlbn as f64 * cfg.over_provisioning).ceil() as u64;
        // Data blocks + log blocks + the block a merge writes before it erases + spares.
        let nblocks = nlbn + log + 1 + spare;
        if nblocks * ppb as u64 >= IN_DATA as u64 {
            return Err("hybrid FTL: flash too large for 32-bit page numbers".into());
        }
        Ok(HybridFtl {
            cfg,
            ppb,
            nblocks: nblocks as u32,
            lpages: lpages as u32,
            data: vec![NONE; nlbn as usize],
            loc: vec![NONE; (nlbn * ppb as u64) as usize],
            owner: vec![NONE; (nblocks * ppb as u64) as usize],
            erases: vec![0; nblocks as usize],
            free: (0..nblocks as u32).collect(),
            seq: None,
            rw: VecDeque::new(),
            rw_wp: 0,
            rw_max: log as usize - 1,
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

    /// Random log blocks (the sequential one is one more).
    pub fn random_log_blocks(&self) -> usize {
        self.rw_max
    }

    pub fn stats(&self) -> FtlStats {
        self.stats.finished(&self.erases)
    }

    pub fn erase_counts(&self) -> &[u32] {
        &self.erases
    }

    fn pages(&self, offset: u64, len: u64) -> std::ops::Range<u32> {
        page_range(self.cfg.page_bytes, self.lpages as u64, offset, len)
    }

    /// Physical page of a logical page, if it holds data.
    pub fn lookup(&self, lpn: u32) -> Option<u32> {
        match *self.loc.get(lpn as usize)? {
            NONE => None,
            IN_DATA => Some(self.data[(lpn / self.ppb) as usize] * self.ppb + lpn % self.ppb),
            p => Some(p),
        }
    }

    /// Host write of a byte range (whole pages are programmed).
    pub fn write(&mut self, offset: u64, len: u64) {
        // Only `translate` reads the flash commands; driven directly, keep none.
        self.pending.clear();
        for lpn in self.pages(offset, len) {
            self.write_page(lpn);
            self.stats.host_pages_written += 1;
        }
    }

    /// TRIM: the range's pages hold nothing worth keeping.
    pub fn trim(&mut self, offset: u64, len: u64) {
        self.pending.clear();
        let r = self.pages(offset, len);
        if r.is_empty() {
            return;
        }
        for lpn in r.clone() {
            if self.loc[lpn as usize] != NONE {
                self.stats.pages_trimmed += 1;
                self.loc[lpn as usize] = NONE;
            }
        }
        // A logical block left with nothing live gives its data block back.
        for lbn in r.start / self.ppb..=(r.end - 1) / self.ppb {
            if self.data[lbn as usize] != NONE && self.block_is_dead(lbn) {
                let d = std::mem::replace(&mut self.data[lbn as usize], NONE);
                self.erase(d);
            }
        }
    }

    fn block_is_dead(&self, lbn: u32) -> bool {
        let base = (lbn * self.ppb) as usize;
        self.loc[base..base + self.ppb as usize]
            .iter()
            .all(|&l| l == NONE)
    }

    fn program(&mut self, lpn: u32, ppn: u32, host: bool) {
        self.owner[ppn as usize] = lpn;
        self.loc[lpn as usize] = ppn;
        self.pending.push((FlashOp::Program, ppn, host));
    }

    fn write_page(&mut self, lpn: u32) {
        let (lbn, off) = (lpn / self.ppb, lpn % self.ppb);
        if let Some(s) = self.seq.as_mut() {
            if s.lbn == lbn && s.wp == off {
                s.wp += 1;
                let ppn = s.blk * self.ppb + off;
                self.program(lpn, ppn, true);
                return;
            }
        }
        if off == 0 {
            self.merge_seq();
            let blk = self.take_free();
            self.seq = Some(Seq { blk, lbn, wp: 1 });
            self.program(lpn, blk * self.ppb, true);
            return;
        }
        if self.rw.is_empty() || self.rw_wp == self.ppb {
            if self.rw.len() >= self.rw_max {
                self.reclaim_random();
            }
            let b = self.take_free();
            self.rw.push_back(b);
            self.rw_wp = 0;
        }
        let ppn = self.rw.back().expect("a random log block") * self.ppb + self.rw_wp;
        self.rw_wp += 1;
        self.program(lpn, ppn, true);
    }

    fn take_free(&mut self) -> u32 {
        self.free
            .pop_front()
            .expect("hybrid FTL out of free blocks (sized for data, log and merge blocks)")
    }

    fn erase(&mut self, b: u32) {
        let base = (b * self.ppb) as usize;
        self.owner[base..base + self.ppb as usize].fill(NONE);
        self.erases[b as usize] += 1;
        self.stats.erasures += 1;
        self.pending.push((FlashOp::Erase, b * self.ppb, false));
        self.free.push_back(b);
    }

    /// Copies page `lpn`'s current copy to physical page `dst`.
    fn copy(&mut self, lpn: u32, dst: u32) {
        let src = self.lookup(lpn).expect("a live page");
        self.pending.push((FlashOp::Read, src, false));
        self.pending.push((FlashOp::Program, dst, false));
        self.stats.gc_pages_copied += 1;
    }

    /// Folds the sequential log block into its logical block: switch, partial or (when a
    /// page it holds was overwritten elsewhere since) full merge.
    fn merge_seq(&mut self) {
        let Some(Seq { blk, lbn, wp }) = self.seq.take() else {
            return;
        };
        let (ppb, base) = (self.ppb, lbn * self.ppb);
        // In order: each page written is still current there, or was trimmed since.
        let in_order = (0..wp).all(|o| {
            let l = self.loc[(base + o) as usize];
            l == blk * ppb + o || l == NONE
        });
        if !in_order {
            self.full_merge(lbn);
            // Nothing live is left in the sequential block.
            debug_assert!((0..wp).all(|o| self.loc[(base + o) as usize] != blk * ppb + o));
            self.erase(blk);
            return;
        }
        if wp == ppb {
            self.stats.switch_merges += 1;
        } else {
            self.stats.partial_merges += 1;
            for o in wp..ppb {
                let lpn = base + o;
                if self.loc[lpn as usize] != NONE {
                    self.copy(lpn, blk * ppb + o);
                    self.loc[lpn as usize] = blk * ppb + o;
                }
            }
        }
        for o in 0..ppb {
            let lpn = (base + o) as usize;
            if self.loc[lpn] == blk * ppb + o {
                self.loc[lpn] = IN_DATA;
            }
        }
        self.owner[(blk * ppb) as usize..((blk + 1) * ppb) as usize].fill(NONE);
        let old = std::mem::replace(&mut self.data[lbn as usize], blk);
        if old != NONE {
            self.erase(old);
        }
    }

    /// Copies every live page of logical block `lbn` into a new data block.
    fn full_merge(&mut self, lbn: u32) {
        let (ppb, base) = (self.ppb, lbn * self.ppb);
        let live = (0..ppb)
            .filter(|&o| self.loc[(base + o) as usize] != NONE)
            .count();
        let old = self.data[lbn as usize];
        if live == 0 {
            if old != NONE {
                self.data[lbn as usize] = NONE;
                self.erase(old);
            }
            return;
        }
        self.stats.full_merges += 1;
        let nb = self.take_free();
        for o in 0..ppb {
            let lpn = base + o;
            if self.loc[lpn as usize] != NONE {
                self.copy(lpn, nb * ppb + o);
            }
        }
        for o in 0..ppb {
            let lpn = (base + o) as usize;
            if self.loc[lpn] != NONE {
                self.loc[lpn] = IN_DATA;
            }
        }
        self.data[lbn as usize] = nb;
        if old != NONE {
            self.erase(old);
        }
    }

    /// Reclaims the oldest random log block: every logical block with a live page in it is
    /// fully merged (the sequential log block with it when it is that logical block's).
    fn reclaim_random(&mut self) {
        let Some(victim) = self.rw.pop_front() else {
            return;
        };
        let ppb = self.ppb;
        for i in 0..ppb {
            let ppn = victim * ppb + i;
            let lpn = self.owner[ppn as usize];
            if lpn == NONE || self.loc[lpn as usize] != ppn {
                continue;
            }
            let lbn = lpn / ppb;
            if let Some(s) = self.seq.filter(|s| s.lbn == lbn) {
                self.seq = None;
                self.full_merge(lbn);
                self.erase(s.blk);
            } else {
                self.full_merge(lbn);
            }
        }
        if self.rw.is_empty() {
            self.rw_wp = 0;
        }
        self.erase(victim);
    }

    /// Checks the mapping's invariants (tests).
    pub fn check(&self) -> Result<(), String> {
        let log_blk = |b: u32| self.rw.contains(&b) || self.seq.is_some_and(|s| s.blk == b);
        for (lpn, &l) in self.loc.iter().enumerate() {
            match l {
                NONE => {}
                IN_DATA => {
                    if self.data[lpn / self.ppb as usize] == NONE {
                        return Err(format!("lpn {lpn} in a data block that does not exist"));
                    }
                }
                p => {
                    if self.owner[p as usize] != lpn as u32 {
                        return Err(format!("lpn {lpn} at page {p} owned by another page"));
                    }
                    if !log_blk(p / self.ppb) {
                        return Err(format!("lpn {lpn} at page {p}, not in a log block"));
                    }
                }
            }
        }
        let used = self.data.iter().filter(|&&d| d != NONE).count()
            + self.rw.len()
            + self.seq.is_some() as usize;
        if used + self.free.len() != self.nblocks as usize {
            return Err(format!(
                "{used} blocks in use and {} free of {}",
                self.free.len(),
                self.nblocks
            ));
        }
        Ok(())
    }
}

impl Queued for HybridFtl {
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

impl Ftl for HybridFtl {
    fn translate(&mut self, _now_ns: u64, op: &IoOp, cfg: &SsdConfig, out: &mut Vec<FlashCmd>) {
        translate_queued(self, op, cfg, out);
    }
}

/// The FTL `FtlConfig::kind` names: one type for drivers that let the user choose.
pub enum AnyFtl {
    Page(Box<PageFtl>),
    Hybrid(Box<HybridFtl>),
}

impl AnyFtl {
    pub fn new(cfg: FtlConfig) -> Result<Self, String> {
        Ok(match cfg.kind {
            FtlKind::Page => AnyFtl::Page(Box::new(PageFtl::new(cfg)?)),
            FtlKind::Hybrid => AnyFtl::Hybrid(Box::new(HybridFtl::new(cfg)?)),
        })
    }

    pub fn write(&mut self, offset: u64, len: u64) {
        match self {
            AnyFtl::Page(f) => f.write(offset, len),
            AnyFtl::Hybrid(f) => f.write(offset, len),
        }
    }

    pub fn trim(&mut self, offset: u64, len: u64) {
        match self {
            AnyFtl::Page(f) => f.trim(offset, len),
            AnyFtl::Hybrid(f) => f.trim(offset, len),
        }
    }

    pub fn stats(&self) -> FtlStats {
        match self {
            AnyFtl::Page(f) => f.stats(),
            AnyFtl::Hybrid(f) => f.stats(),
        }
    }

    pub fn config(&self) -> &FtlConfig {
        match self {
            AnyFtl::Page(f) => f.config(),
            AnyFtl::Hybrid(f) => f.config(),
        }
    }

    pub fn check(&self) -> Result<(), String> {
        match self {
            AnyFtl::Page(f) => f.check(),
            AnyFtl::Hybrid(f) => f.check(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoKind;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// 64 logical blocks of 16 pages; 7 % spare, 10 % log blocks (6: 1 sequential, 5 random).
    fn cfg() -> FtlConfig {
        FtlConfig {
            logical_bytes: 64 * 16 * 4096,
            pages_per_block: 16,
            kind: FtlKind::Hybrid,
            ..FtlConfig::new(0)
        }
    }

    const BLK: u64 = 16 * 4096;

    #[test]
    fn whole_block_sequential_writes_switch_merge_without_copies() {
        let mut f = HybridFtl::new(cfg()).unwrap();
        assert_eq!(f.random_log_blocks(), 5);
        for round in 0..10u64 {
            for b in 0..64u64 {
                f.write(((b + round * 7) % 64) * BLK, BLK);
                f.check().unwrap();
            }
        }
        let s = f.stats();
        // Every block but the last opened is switched; each switch after the first round
        // erases the block's previous data block.
        assert_eq!(s.switch_merges, 64 * 10 - 1, "{s:?}");
        assert_eq!((s.partial_merges, s.full_merges), (0, 0), "{s:?}");
        assert_eq!(s.gc_pages_copied, 0);
        assert_eq!(s.write_amplification, 1.0);
        assert_eq!(s.erasures, 64 * 9 - 1, "{s:?}");
    }

    #[test]
    fn a_half_written_sequential_block_is_partially_merged() {
        let mut f = HybridFtl::new(cfg()).unwrap();
        f.write(0, BLK); // block 0, whole
        f.write(BLK, 4096); // opens block 1: block 0 switched
        f.write(0, BLK / 2); // block 0's first half again: block 1 partially merged (empty rest)
        f.write(2 * BLK, 4096); // block 0 partially merged: 8 pages copied from its data block
        f.check().unwrap();
        let s = f.stats();
        assert_eq!(s.switch_merges, 1, "{s:?}");
        assert_eq!(s.partial_merges, 2, "{s:?}");
        assert_eq!(s.gc_pages_copied, 8, "{s:?}");
        assert_eq!(s.erasures, 1, "block 0's first data block: {s:?}");
        // Every page still reads back from somewhere.
        for p in 0..16 {
            assert!(f.lookup(p).is_some(), "page {p}");
        }
    }

    #[test]
    fn scattered_small_writes_full_merge_and_erase_far_more_than_page_mapping() {
        // The same bytes (4 MiB) in 16-page or 64-page erase blocks: 8 KiB writes at random
        // places, after one sequential fill.
        let run = |kind: FtlKind, ppb: u64| {
            let blocks = 1024 / ppb;
            let mut f = AnyFtl::new(FtlConfig {
                kind,
                pages_per_block: ppb as u32,
                ..cfg()
            })
            .unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            for b in 0..blocks {
                f.write(b * ppb * 4096, ppb * 4096);
            }
            for _ in 0..20 * 1024 {
                // 8 KiB at a random 8 KiB-aligned place (never offset 0 of a block).
                let p = rng.gen_range(0..512u64) * 2;
                let p = if p % ppb == 0 { p + 2 } else { p };
                f.write(p * 4096, 8192);
            }
            f.check().unwrap();
            f.stats()
        };
        let (page, hybrid) = (run(FtlKind::Page, 16), run(FtlKind::Hybrid, 16));
        assert!(hybrid.full_merges > 10_000, "{hybrid:?}");
        assert_eq!(hybrid.switch_merges, 64 - 1);
        // Reclaiming a random log block (8 writes of 2 pages) fully merges the ~5 logical
        // blocks still live in it, 16 pages each: ~5 copies per host page.
        assert!(hybrid.write_amplification > 4.0, "{hybrid:?}");
        assert!(
            hybrid.erasures as f64 > 1.4 * page.erasures as f64,
            "hybrid {hybrid:?} page {page:?}"
        );
        // With larger blocks a full merge copies more, while greedy GC does not get worse.
        let (page64, hybrid64) = (run(FtlKind::Page, 64), run(FtlKind::Hybrid, 64));
        let ratio =
            |h: &FtlStats, p: &FtlStats| h.gc_pages_copied as f64 / p.gc_pages_copied as f64;
        assert!(
            ratio(&hybrid64, &page64) > 2.0 * ratio(&hybrid, &page),
            "64 pages: hybrid {hybrid64:?} page {page64:?}"
        );
        assert_eq!(run(FtlKind::Hybrid, 16), hybrid, "deterministic");
    }

    #[test]
    fn trim_makes_merges_cheaper_and_frees_dead_blocks() {
        let run = |trim: bool| {
            let mut f = HybridFtl::new(cfg()).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            for b in 0..64u64 {
                f.write(b * BLK, BLK);
            }
            for i in 0..5000u64 {
                let p = rng.gen_range(0..64 * 16u64);
                f.write(p * 4096, 4096);
                if trim && i % 4 == 0 {
                    // Drop a whole block's contents now and then (a cache evicting a unit).
                    let b = rng.gen_range(0..64u64);
                    f.trim(b * BLK, BLK);
                }
            }
            f.check().unwrap();
            f.stats()
        };
        let (plain, trimmed) = (run(false), run(true));
        assert!(trimmed.pages_trimmed > 0);
        assert!(
            trimmed.gc_pages_copied < plain.gc_pages_copied,
            "trimmed {trimmed:?} plain {plain:?}"
        );
        // A fully trimmed block has no data block left.
        let mut f = HybridFtl::new(cfg()).unwrap();
        f.write(3 * BLK, BLK);
        f.write(4 * BLK, BLK);
        f.trim(3 * BLK, BLK);
        f.check().unwrap();
        assert_eq!(f.lookup(3 * 16), None);
        assert_eq!(f.stats().erasures, 1);
    }

    #[test]
    fn timed_translation_reports_merge_work() {
        let mut f = HybridFtl::new(cfg()).unwrap();
        let c = SsdConfig::default();
        let mut out = Vec::new();
        for i in 0..(64 * 16 * 3) as u64 {
            f.translate(
                0,
                &IoOp::new(IoKind::Write, (i * 7919 % 1024) * 4096, 4096),
                &c,
                &mut out,
            );
        }
        assert!(out.iter().any(|x| x.op == FlashOp::Erase));
        assert!(out.iter().any(|x| x.op == FlashOp::Program && !x.host));
        f.check().unwrap();
    }
}
