//! The list policies as they were before the lean layouts (two `u32` links per slot per list,
//! `Vec<bool>` reference bits): a reference that the packed links, the shared SLRU link array
//! and the FIFO/CLOCK rings must match call for call (docs/plan-lean.md section 3 (1)).

use super::{lookup, Access, Policy, PolicyConfig, Slot};
use proptest::prelude::*;
use std::collections::HashMap;

const NIL: u32 = u32::MAX;

/// Doubly-linked list of slots with links stored in flat vectors. Each list owns its links, so
/// a policy with several lists (SLRU, ARC, S3-FIFO) pays 8 bytes per slot per list and can ask
/// any of them whether it holds a slot ([`SlotList::contains`]).
pub struct RefList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: u32,
}

impl RefList {
    pub fn new(capacity: u32) -> Self {
        RefList {
            prev: vec![NIL; capacity as usize],
            next: vec![NIL; capacity as usize],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether `slot` is in this list.
    pub fn contains(&self, slot: Slot) -> bool {
        let s = slot as usize;
        self.prev[s] != NIL || self.head == slot
    }

    /// Most recently pushed end.
    pub fn head(&self) -> Option<Slot> {
        (self.head != NIL).then_some(self.head)
    }

    /// Oldest end.
    pub fn tail(&self) -> Option<Slot> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Inserts `slot` at the head.
    #[inline]
    pub fn push_head(&mut self, slot: Slot) {
        debug_assert!(!self.contains(slot), "slot {slot} already listed");
        let s = slot as usize;
        self.prev[s] = NIL;
        self.next[s] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    /// Unlinks `slot` (which must be in the list).
    #[inline]
    pub fn unlink(&mut self, slot: Slot) {
        debug_assert!(self.contains(slot), "slot {slot} not listed");
        let s = slot as usize;
        let (p, n) = (self.prev[s], self.next[s]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        self.len -= 1;
    }

    /// Moves `slot` (in the list) to the head.
    #[inline]
    pub fn move_to_head(&mut self, slot: Slot) {
        if self.head != slot {
            self.unlink(slot);
            self.push_head(slot);
        }
    }

    /// Slots from the tail (oldest) towards the head.
    pub fn iter_from_tail(&self) -> impl Iterator<Item = Slot> + '_ {
        let mut at = self.tail;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let s = at;
            at = self.prev[s as usize];
            Some(s)
        })
    }

    /// Removes and returns the tail.
    pub fn pop_tail(&mut self) -> Option<Slot> {
        let t = self.tail()?;
        self.unlink(t);
        Some(t)
    }
}

/// Old LRU (`lru`), MRU (`mru`), FIFO (`fifo`), LIFO (`lifo`): one list, victim at one end.
struct OneList {
    list: RefList,
    move_on_hit: bool,
    victim_at_tail: bool,
    candidates: bool,
}

impl Policy for OneList {
    fn name(&self) -> &'static str {
        "ref"
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        if self.move_on_hit {
            self.list.move_to_head(slot);
        }
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.list.push_head(slot);
    }
    fn victim(&mut self) -> Slot {
        if self.victim_at_tail {
            self.list.tail().unwrap()
        } else {
            self.list.head().unwrap()
        }
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.list.unlink(slot);
    }
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        if self.candidates {
            out.extend(self.list.iter_from_tail().take(n));
        }
    }
    fn mem_bytes(&self) -> usize {
        0
    }
}

struct OldSlru {
    probation: RefList,
    protected: RefList,
    protected_max: u32,
}

impl Policy for OldSlru {
    fn name(&self) -> &'static str {
        "ref-slru"
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        if self.protected.contains(slot) {
            self.protected.move_to_head(slot);
            return;
        }
        self.probation.unlink(slot);
        self.protected.push_head(slot);
        if self.protected.len() > self.protected_max {
            let d = self.protected.pop_tail().expect("non-empty");
            self.probation.push_head(d);
        }
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.probation.push_head(slot);
    }
    fn victim(&mut self) -> Slot {
        self.probation
            .tail()
            .or_else(|| self.protected.tail())
            .unwrap()
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        if self.protected.contains(slot) {
            self.protected.unlink(slot);
        } else {
            self.probation.unlink(slot);
        }
    }
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        out.extend(self.probation.iter_from_tail().take(n));
    }
    fn mem_bytes(&self) -> usize {
        0
    }
}

struct OldClock {
    ring: RefList,
    referenced: Vec<bool>,
}

impl Policy for OldClock {
    fn name(&self) -> &'static str {
        "ref-clock"
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        self.referenced[slot as usize] = true;
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.referenced[slot as usize] = false;
        self.ring.push_head(slot);
    }
    fn victim(&mut self) -> Slot {
        loop {
            let t = self.ring.tail().unwrap();
            if !self.referenced[t as usize] {
                return t;
            }
            self.referenced[t as usize] = false;
            self.ring.move_to_head(t);
        }
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.ring.unlink(slot);
        self.referenced[slot as usize] = false;
    }
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        let r = &self.referenced;
        out.extend(
            self.ring
                .iter_from_tail()
                .filter(|&s| !r[s as usize])
                .take(n),
        );
    }
    fn mem_bytes(&self) -> usize {
        0
    }
}

fn reference(name: &str, cap: u32, cfg: &PolicyConfig) -> Box<dyn Policy> {
    let one = |move_on_hit, victim_at_tail, candidates| {
        Box::new(OneList {
            list: RefList::new(cap),
            move_on_hit,
            victim_at_tail,
            candidates,
        }) as Box<dyn Policy>
    };
    match name {
        "lru" => one(true, true, true),
        "mru" => one(true, false, false),
        "fifo" => one(false, true, true),
        "lifo" => one(false, false, false),
        "slru" => Box::new(OldSlru {
            probation: RefList::new(cap),
            protected: RefList::new(cap),
            protected_max: ((cap as f64 * cfg.slru_protected) as u32).max(1),
        }),
        "clock" => Box::new(OldClock {
            ring: RefList::new(cap),
            referenced: vec![false; cap as usize],
        }),
        _ => unreachable!("{name}"),
    }
}

/// What the engine does with a policy: accesses (hit, or miss + victim + remove + insert, the
/// free slots reused last-freed first as the engine's free list does) and invalidations.
#[derive(Clone, Debug)]
enum Op {
    Access(u64),
    Invalidate(u64),
}

fn check(
    name: &str,
    cap: u32,
    protected: f64,
    aligned_links: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let cfg = PolicyConfig {
        slru_protected: protected,
        aligned_links,
        ..PolicyConfig::default()
    };
    let mut new = (lookup(name).unwrap().make)(cap, &cfg);
    let mut old = reference(name, cap, &cfg);
    let mut map: HashMap<u64, Slot> = HashMap::new();
    let mut key_of: Vec<u64> = vec![0; cap as usize];
    let mut free: Vec<Slot> = (0..cap).rev().collect();
    let (mut cn, mut co) = (Vec::new(), Vec::new());
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Access(key) => {
                let a = Access {
                    key,
                    seq: i as u64,
                    next_use: super::NEVER,
                    is_write: false,
                    class: 0,
                };
                if let Some(&s) = map.get(&key) {
                    new.hit(s, &a);
                    old.hit(s, &a);
                    continue;
                }
                new.miss(&a);
                old.miss(&a);
                if free.is_empty() {
                    let (v, w) = (new.victim(), old.victim());
                    prop_assert_eq!(v, w, "{} victim at op {}", name, i);
                    new.remove(v, key_of[v as usize], true);
                    old.remove(v, key_of[v as usize], true);
                    map.remove(&key_of[v as usize]);
                    free.push(v);
                }
                let s = free.pop().unwrap();
                new.insert(s, &a);
                old.insert(s, &a);
                map.insert(key, s);
                key_of[s as usize] = key;
            }
            Op::Invalidate(key) => {
                if let Some(s) = map.remove(&key) {
                    new.remove(s, key, false);
                    old.remove(s, key, false);
                    free.push(s);
                }
            }
        }
        cn.clear();
        co.clear();
        new.eviction_candidates(cap as usize, &mut cn);
        old.eviction_candidates(cap as usize, &mut co);
        prop_assert_eq!(&cn, &co, "{} candidates at op {}", name, i);
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    // Keys over about twice the capacity: hits, misses and evictions all happen.
    proptest::collection::vec(
        prop_oneof![
            8 => (0u64..64).prop_map(Op::Access),
            1 => (0u64..64).prop_map(Op::Invalidate),
        ],
        0..1500,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every lean list policy takes the same decisions as the old lists: same victims, same
    /// eviction candidates, at every step, with invalidations in the mix; with packed links
    /// (live) and aligned ones (simulator).
    #[test]
    fn lean_policies_decide_as_the_old_lists(
        cap in 1u32..40,
        protected in prop_oneof![Just(0.5), 0.05f64..0.95],
        ops in ops(),
    ) {
        for name in ["lru", "mru", "fifo", "lifo", "slru", "clock"] {
            for aligned in [false, true] {
                check(name, cap, protected, aligned, &ops)?;
            }
        }
    }
}
