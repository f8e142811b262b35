//! DSS: selective allocation and selective eviction by I/O class (the DSS seed, Table 2).
//!
//! - Allocation: classes marked `never` bypass; while more than `clean_threshold` of the cache
//!   is clean (free or clean lines) every other class is allocated; below it only classes
//!   marked `always` are.
//! - Eviction: the lowest priority first; within a priority the class with the largest
//!   `object_size` first; among classes that tie on both (the file-system table's metadata,
//!   journal and directories), the least recently used line of any of them.
//!
//! - Write-back: among the classes of the incoming line's priority or lower, in eviction
//!   order, a clean line (one of the 64 least recently used of its class) is taken before
//!   the first class's dirty LRU line, so that freshly written low-priority data is not
//!   written back line by line in the requests' path (clean-first, as CFLRU).
//!
//! - Staging floor (write-back): while the lines at or below the incoming line's priority
//!   number fewer than [`staging_floor`] (at most [`STAGING_LINES`], 1/64 of the cache), a
//!   clean line of a higher priority (one of the 64 least recently used of each rank, in
//!   eviction order) is taken first. Without it a large file written into a cache of
//!   higher-priority lines has a list only one request deep: each line it evicts was written
//!   (or cleaned) a moment before, so its write-back runs in the request's path, or the line
//!   is written around the cache in 64 KiB pieces (issue 18: MacroSetup 626 s vs LRU's 76 s
//!   on a RAID 5 at QD 1). With a floor as deep as the cleaner's merged write-back, the lines
//!   it evicts were cleaned (clean-ahead, eviction order) a floor's worth of lines earlier.
//!
//! One LRU list per eviction rank (`ClassTable::evict_rank`: classes with equal priority and
//! object size share one) over shared per-slot links (9 B per slot): a victim is the tail of
//! the first non-empty list (at most 32 looks).

use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot};
use crate::classes::{Allocation, ClassTable};
use crate::request::NUM_CLASSES;
use std::cell::Cell;
use std::sync::Arc;

pub const INFO: PolicyInfo = PolicyInfo {
    name: "dss",
    summary:
        "DSS selective allocation + eviction by I/O class (--classes; default file-system table)",
    make: |cap, cfg: &PolicyConfig| Box::new(Dss::new(cap, cfg)),
};

const NIL: u32 = u32::MAX;
/// Lines per class looked at for a clean victim.
const CLEAN_SEARCH: u32 = 64;
/// Most lines the staging floor keeps at or below an incoming priority: the clean-ahead
/// window ([`crate::engine::CLEAN_AHEAD`], 4 MiB of 4 KiB lines, what the cleaner merges
/// into one HDD write).
pub const STAGING_LINES: u32 = crate::engine::CLEAN_AHEAD as u32;

/// The staging floor of a cache of `capacity` lines: [`STAGING_LINES`], at most 1/64 of the
/// cache (so a small cache keeps strict priorities).
pub fn staging_floor(capacity: u32) -> u32 {
    STAGING_LINES.min(capacity / 64)
}

pub struct Dss {
    table: Arc<ClassTable>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Eviction rank of each slot's list.
    rank: Vec<u8>,
    head: [u32; NUM_CLASSES],
    tail: [u32; NUM_CLASSES],
    /// Priority of each rank's classes.
    rank_prio: [u8; NUM_CLASSES],
    /// Lines in each rank's list.
    rank_len: [u32; NUM_CLASSES],
    /// [`staging_floor`] of this cache.
    floor: u32,
    /// Since the last [`Policy::ahead_mark`]: the lowest eviction-order position a line was
    /// linked at, and the lines unlinked (see [`Policy::ahead_since_mark`]).
    touched_min: Cell<u64>,
    unlinked: Cell<u64>,
}

impl Dss {
    pub fn new(capacity: u32, cfg: &PolicyConfig) -> Self {
        let table = cfg
            .classes
            .clone()
            .unwrap_or_else(|| Arc::new(ClassTable::filesystem()));
        let n = capacity as usize;
        let mut rank_prio = [0; NUM_CLASSES];
        for c in 0..NUM_CLASSES as u8 {
            rank_prio[table.evict_rank(c) as usize] = table.class(c).priority;
        }
        Dss {
            table,
            prev: vec![NIL; n],
            next: vec![NIL; n],
            rank: vec![0; n],
            head: [NIL; NUM_CLASSES],
            tail: [NIL; NUM_CLASSES],
            rank_prio,
            rank_len: [0; NUM_CLASSES],
            floor: staging_floor(capacity),
            touched_min: Cell::new(0),
            unlinked: Cell::new(0),
        }
    }

    /// Links `slot` at the most recently used end of the list of class `c`'s rank.
    fn push_head(&mut self, slot: Slot, c: u8) {
        let r = self.table.evict_rank(c);
        let ci = r as usize;
        self.rank[slot as usize] = r;
        self.rank_len[ci] += 1;
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = self.head[ci];
        if self.head[ci] != NIL {
            self.prev[self.head[ci] as usize] = slot;
        } else {
            self.tail[ci] = slot;
        }
        self.head[ci] = slot;
        if self.touched_min.get() > 0 {
            // The head of rank `r` comes after every line of the ranks evicted before it.
            let pos: u64 = self.rank_len[..=ci].iter().map(|&n| n as u64).sum::<u64>() - 1;
            self.touched_min.set(self.touched_min.get().min(pos));
        }
    }

    fn unlink(&mut self, slot: Slot) {
        let ci = self.rank[slot as usize] as usize;
        debug_assert!(
            self.rank_len[ci] > 0,
            "unlink of slot {slot} from an empty rank"
        );
        self.rank_len[ci] -= 1;
        self.unlinked.set(self.unlinked.get() + 1);
        let (p, n) = (self.prev[slot as usize], self.next[slot as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head[ci] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail[ci] = p;
        }
    }
}

impl Policy for Dss {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, slot: Slot, a: &Access) {
        // A hit re-labels the line with the class it is accessed as now.
        self.unlink(slot);
        self.push_head(slot, a.class);
    }
    fn insert(&mut self, slot: Slot, a: &Access) {
        self.push_head(slot, a.class);
    }
    fn victim(&mut self) -> Slot {
        self.tail
            .iter()
            .copied()
            .find(|&t| t != NIL)
            .expect("victim() on an empty DSS cache")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.unlink(slot);
    }
    /// Eviction order: the lowest-priority rank's least recently used lines first, then the
    /// next rank's (the clean-first search of `victim_for` may pick others).
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        let end = out.len() + n;
        for &t in &self.tail {
            let mut s = t;
            while s != NIL && out.len() < end {
                out.push(s);
                s = self.prev[s as usize];
            }
            if out.len() >= end {
                return;
            }
        }
    }
    fn mem_bytes(&self) -> usize {
        self.prev.capacity() * 4 + self.next.capacity() * 4 + self.rank.capacity()
    }
    fn class_aware(&self) -> bool {
        true
    }
    fn victim_for(&mut self, class: u8, dirty: &[u64]) -> Slot {
        // Clean first, among lines no more valuable than the incoming one: a clean victim
        // costs no write-back in the request's path. The CLEAN_SEARCH least recently used
        // lines of each such rank are looked at, in eviction order.
        let is_dirty = |s: Slot| {
            dirty
                .get(s as usize / 64)
                .is_some_and(|w| w >> (s % 64) & 1 == 1)
        };
        let prio = self.table.class(class).priority;
        if !dirty.is_empty() {
            // Staging floor: fewer lines at or below this priority than the floor: a clean
            // line of a higher priority first (its write-back, if any, ran long ago; the
            // lines at or below were written or cleaned a moment ago).
            let below: u32 = (0..NUM_CLASSES)
                .take_while(|&r| self.rank_prio[r] >= prio)
                .map(|r| self.rank_len[r])
                .sum();
            // The first clean line among the CLEAN_SEARCH least recently used of rank `r`.
            let clean_in = |r: usize| {
                let mut s = self.tail[r];
                for _ in 0..CLEAN_SEARCH {
                    if s == NIL {
                        return None;
                    }
                    if !is_dirty(s) {
                        return Some(s);
                    }
                    s = self.prev[s as usize];
                }
                None
            };
            if below < self.floor {
                let higher = (0..NUM_CLASSES).filter(|&r| self.rank_prio[r] < prio);
                if let Some(s) = higher.filter_map(clean_in).next() {
                    return s;
                }
            }
            let lower = (0..NUM_CLASSES).take_while(|&r| self.rank_prio[r] >= prio);
            if let Some(s) = lower.filter_map(clean_in).next() {
                return s;
            }
        }
        self.victim()
    }
    fn dirty_peer_victim(&mut self, class: u8, dirty: &[u64]) -> bool {
        // (`victim_for` only reads the lists.)
        let v = self.victim_for(class, dirty);
        let is_dirty = dirty
            .get(v as usize / 64)
            .is_some_and(|w| w >> (v % 64) & 1 == 1);
        // Lower numbers are higher priorities.
        is_dirty
            && self.rank_prio[self.rank[v as usize] as usize] <= self.table.class(class).priority
    }
    fn ahead_since_mark(&self) -> Option<(u64, u64)> {
        Some((self.touched_min.get(), self.unlinked.get()))
    }
    fn ahead_mark(&self) {
        self.touched_min.set(u64::MAX);
        self.unlinked.set(0);
    }
    fn admit(&mut self, class: u8, clean_share: f64) -> bool {
        match self.table.class(class).allocation {
            Allocation::Never => false,
            Allocation::Always => true,
            Allocation::Conditional => clean_share > self.table.clean_threshold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_access;

    fn acc(key: u64, class: u8) -> Access {
        Access {
            class,
            ..test_access(key)
        }
    }

    #[test]
    fn evicts_lowest_priority_then_largest_then_lru() {
        let mut p = Dss::new(8, &PolicyConfig::default());
        // filesystem table: 1 = metadata (prio 0), 8 = file<4KiB (1), 18 = file>1GiB (11).
        p.insert(0, &acc(10, 1));
        p.insert(1, &acc(11, 8));
        p.insert(2, &acc(12, 8));
        p.insert(3, &acc(13, 18));
        assert_eq!(p.victim(), 3);
        p.remove(3, 13, true);
        assert_eq!(p.victim(), 1, "LRU within class 8");
        p.hit(1, &acc(11, 8));
        assert_eq!(p.victim(), 2);
        p.remove(2, 12, true);
        p.remove(1, 11, true);
        assert_eq!(p.victim(), 0);
    }

    #[test]
    fn eviction_candidates_follow_the_victim_order_without_changing_it() {
        let mut p = Dss::new(8, &PolicyConfig::default());
        p.insert(0, &acc(10, 1));
        p.insert(1, &acc(11, 8));
        p.insert(2, &acc(12, 8));
        p.insert(3, &acc(13, 18));
        let mut c = Vec::new();
        p.eviction_candidates(8, &mut c);
        assert_eq!(
            c,
            vec![3, 1, 2, 0],
            "lowest priority first, LRU within a rank"
        );
        let mut two = vec![7];
        p.eviction_candidates(2, &mut two);
        assert_eq!(two, vec![7, 3, 1], "appends at most n");
        // The hint is read-only: the victim order is unchanged.
        for want in [3, 1, 2, 0] {
            assert_eq!(p.victim(), want);
            p.remove(want, 0, true);
        }
    }

    #[test]
    fn classes_that_tie_on_priority_and_size_share_one_lru() {
        let mut p = Dss::new(8, &PolicyConfig::default());
        // filesystem table: 1 = metadata and 3 = directory, both priority 0 and 4 KiB objects.
        p.insert(0, &acc(10, 3));
        p.insert(1, &acc(11, 1));
        p.insert(2, &acc(12, 3));
        assert_eq!(p.victim(), 0, "the oldest line of either class");
        p.hit(0, &acc(10, 3));
        assert_eq!(p.victim(), 1, "metadata is now the oldest");
        // A line re-labelled by a hit moves to its new class's rank.
        p.hit(1, &acc(11, 18));
        assert_eq!(p.victim(), 1);
        // With a uniform table every class shares one LRU.
        let cfg = PolicyConfig {
            classes: Some(Arc::new(ClassTable::uniform())),
            ..Default::default()
        };
        let mut u = Dss::new(4, &cfg);
        u.insert(0, &acc(1, 7));
        u.insert(1, &acc(2, 2));
        assert_eq!(u.victim(), 0);
        u.hit(0, &acc(1, 7));
        assert_eq!(u.victim(), 1);
    }

    #[test]
    fn clean_victim_search_respects_priority() {
        let mut p = Dss::new(8, &PolicyConfig::default());
        p.insert(0, &acc(10, 1)); // metadata, clean
        p.insert(1, &acc(11, 8)); // file<4KiB (priority 1), dirty
        let dirty = [0b10u64];
        assert_eq!(
            p.victim_for(18, &dirty),
            1,
            "no clean line of priority >= 11"
        );
        assert_eq!(p.victim_for(1, &dirty), 0, "a clean line of priority >= 0");
    }

    #[test]
    fn selective_allocation_follows_clean_share() {
        let mut p = Dss::new(8, &PolicyConfig::default());
        assert!(p.admit(18, 0.5));
        assert!(!p.admit(18, 0.10), "conditional class under pressure");
        assert!(p.admit(1, 0.0), "metadata is always allocated");
        assert!(p.admit(12, 0.0), "files under 1 MiB are always allocated");
        let cfg = PolicyConfig {
            classes: Some(Arc::new(ClassTable::database())),
            ..Default::default()
        };
        let mut d = Dss::new(8, &cfg);
        assert!(!d.admit(4, 1.0), "sequential tables bypass");
        assert!(d.admit(2, 1.0));
    }
}
