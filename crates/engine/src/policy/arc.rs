//! ARC (Megiddo & Modha, FAST '03): two LRU lists of cached lines, T1 (seen once recently)
//! and T2 (seen at least twice), and two ghost lists of recently evicted keys, B1 and B2. A
//! miss that hits B1 says "T1 was too small": the target size `p` of T1 grows; a B2 hit
//! shrinks it. The victim comes from T1 while T1 is above its target, else from T2. Follows
//! the paper's pseudo-code, including the case where a full T1 (|T1| + |B1| = c with B1
//! empty) evicts its LRU line without keeping a ghost. No parameters: the capacity c is all.
//! The target `p` is real-valued (the paper's delta = |B2|/|B1| is a ratio, not an integer
//! quotient), as in libCacheSim's `ARC`.
//!
//! Identical to libCacheSim's `ARC` on a stream of misses and hits: the miss counts are
//! equal (`tests/libcachesim_oracle.rs`: cloudPhysicsIO 1,025,309 / 976,867 / 941,434 at
//! 1/5/10 % of the footprint; Zipf 97,599 / 67,621 / 55,110). An integer `p` missed up to
//! 0.02 % more or less.
//!
//! Engine mapping: `miss()` runs the ghost bookkeeping and the adaptation (it is called even
//! when admission then bypasses the line; the adaptation still reflects the reference
//! stream), `victim()` is REPLACE, `insert()` puts ghost hits in T2 and new lines in T1.
//! Lines the engine inserts without a miss (group population) enter T1 as new lines; their
//! evictions add ghosts without the miss-time trimming, so `insert()` trims the oldest
//! ghosts to keep the paper's bounds, |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c
//! (on the miss-then-insert path they already hold and the trim does nothing).

use super::ghost::GhostList;
use super::{
    Access, AlignedLinks, LinkStore, PackedLinks, Policy, PolicyConfig, PolicyInfo, Slot, SlotList,
};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "arc",
    summary: "adaptive replacement cache (recency + frequency, self-tuning)",
    make: |cap, cfg: &PolicyConfig| {
        if cfg.aligned_links {
            Box::new(Arc::<AlignedLinks>::new(cap))
        } else {
            Box::new(Arc::<PackedLinks>::new(cap))
        }
    },
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    None,
    New,
    FromB1,
    FromB2,
}

pub struct Arc<L: LinkStore = PackedLinks> {
    c: u32,
    /// Target size of T1, real-valued as in the paper and libCacheSim.
    p: f64,
    t1: SlotList<L>,
    t2: SlotList<L>,
    b1: GhostList<L>,
    b2: GhostList<L>,
    pending: Pending,
    /// The next eviction from T1 keeps no ghost (|T1| = c case).
    no_ghost: bool,
}

impl<L: LinkStore> Arc<L> {
    pub fn new(capacity: u32) -> Self {
        let c = capacity as usize;
        Arc {
            c: capacity,
            p: 0.0,
            t1: SlotList::new(capacity),
            t2: SlotList::new(capacity),
            b1: GhostList::new(c),
            b2: GhostList::new(2 * c),
            pending: Pending::None,
            no_ghost: false,
        }
    }

    /// Drops the oldest ghosts while |T1| + |B1| > c or the directory exceeds 2c.
    fn trim_ghosts(&mut self) {
        let c = self.c as usize;
        while self.t1.len() as usize + self.b1.len() > c && self.b1.pop_oldest().is_some() {}
        while self.t1.len() as usize + self.t2.len() as usize + self.b1.len() + self.b2.len()
            > 2 * c
            && self.b2.pop_oldest().is_some()
        {}
    }

    /// Target size of T1.
    #[cfg(test)]
    pub fn target(&self) -> f64 {
        self.p
    }
}

impl<L: LinkStore> Policy for Arc<L> {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn hit(&mut self, slot: Slot, _a: &Access) {
        if self.t1.contains(slot) {
            self.t1.unlink(slot);
            self.t2.push_head(slot);
        } else {
            self.t2.move_to_head(slot);
        }
    }

    fn miss(&mut self, a: &Access) {
        self.no_ghost = false;
        let (b1, b2) = (self.b1.len() as u32, self.b2.len() as u32);
        if self.b1.remove(a.key) {
            let delta = (b2 as f64 / b1.max(1) as f64).max(1.0);
            self.p = (self.p + delta).min(self.c as f64);
            self.pending = Pending::FromB1;
        } else if self.b2.remove(a.key) {
            let delta = (b1 as f64 / b2.max(1) as f64).max(1.0);
            self.p = (self.p - delta).max(0.0);
            self.pending = Pending::FromB2;
        } else {
            self.pending = Pending::New;
            let l1 = self.t1.len() + self.b1.len() as u32;
            let total = l1 + self.t2.len() + self.b2.len() as u32;
            if l1 >= self.c {
                if self.t1.len() < self.c {
                    self.b1.pop_oldest();
                } else {
                    self.no_ghost = true;
                }
            } else if total >= 2 * self.c {
                self.b2.pop_oldest();
            }
        }
    }

    fn insert(&mut self, slot: Slot, _a: &Access) {
        match self.pending {
            Pending::FromB1 | Pending::FromB2 => self.t2.push_head(slot),
            _ => self.t1.push_head(slot),
        }
        self.pending = Pending::None;
        self.trim_ghosts();
    }

    fn victim(&mut self) -> Slot {
        let t1 = self.t1.len();
        let t1f = t1 as f64;
        let from_t1 = t1 >= 1
            && (self.no_ghost
                || t1f > self.p
                || (self.pending == Pending::FromB2 && t1f == self.p));
        let pick = if from_t1 || self.t2.is_empty() {
            self.t1.tail()
        } else {
            self.t2.tail()
        };
        pick.expect("victim() on an empty ARC")
    }

    fn remove(&mut self, slot: Slot, key: u64, evicted: bool) {
        if self.t1.contains(slot) {
            self.t1.unlink(slot);
            if evicted && !self.no_ghost {
                self.b1.push(key);
            }
        } else {
            self.t2.unlink(slot);
            if evicted {
                self.b2.push(key);
            }
        }
        if evicted {
            self.no_ghost = false;
        }
    }

    fn mem_bytes(&self) -> usize {
        self.t1.mem_bytes() + self.t2.mem_bytes() + self.b1.mem_bytes() + self.b2.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::test_access as a;

    #[test]
    fn a_ghost_hit_in_b1_grows_the_recency_target() {
        let mut arc: Arc = Arc::new(2);
        // Keys 1, 2 in slots 0, 1; 2 is hit (T2). Then 3 evicts 1 from T1 into B1.
        for (s, k) in [(0, 1), (1, 2)] {
            arc.miss(&a(k));
            arc.insert(s, &a(k));
        }
        arc.hit(1, &a(2));
        arc.miss(&a(3));
        let v = arc.victim();
        assert_eq!(v, 0);
        arc.remove(v, 1, true);
        arc.insert(0, &a(3));
        assert_eq!(arc.target(), 0.0);
        // Key 1 again: a B1 ghost hit.
        arc.miss(&a(1));
        assert_eq!(arc.target(), 1.0);
        let v = arc.victim();
        arc.remove(v, if v == 0 { 3 } else { 2 }, true);
        arc.insert(v, &a(1));
        assert!(arc.t2.contains(v), "a ghost hit enters T2");
    }

    #[test]
    fn ghost_lists_stay_bounded_with_inserts_that_had_no_miss() {
        use rand::{Rng, SeedableRng};
        let c = 16u32;
        let mut arc: Arc = Arc::new(c);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut keys: Vec<Option<u64>> = vec![None; c as usize];
        let mut free: Vec<Slot> = (0..c).rev().collect();
        for _ in 0..20_000 {
            let key = rng.gen_range(0..64u64);
            if let Some(s) = keys.iter().position(|&k| k == Some(key)) {
                arc.hit(s as Slot, &a(key));
                continue;
            }
            // One access in four is a group-population insert: no miss() first.
            if rng.gen_range(0..4) != 0 {
                arc.miss(&a(key));
            }
            let slot = free.pop().unwrap_or_else(|| {
                let v = arc.victim();
                arc.remove(v, keys[v as usize].take().unwrap(), true);
                v
            });
            keys[slot as usize] = Some(key);
            arc.insert(slot, &a(key));
            let (t1, t2) = (arc.t1.len() as usize, arc.t2.len() as usize);
            let (b1, b2) = (arc.b1.len(), arc.b2.len());
            assert!(t1 + b1 <= c as usize, "|T1| {t1} + |B1| {b1} > c");
            assert!(t1 + t2 + b1 + b2 <= 2 * c as usize);
            assert!((0.0..=c as f64).contains(&arc.target()));
        }
    }
}
