//! Belady's MIN (the offline optimum): evict the cached line whose next access is farthest
//! in the future. Needs the next-use oracle from a pre-pass over the trace
//! (`Engine::next_use_oracle`); lines brought in by group population have no access of
//! their own and count as never used again. With every miss inserted (admission `always`),
//! no policy misses less — the conformance test checks that bound against every policy.
//! libCacheSim's `Belady` makes the same choice: miss counts are identical
//! (`tests/libcachesim_oracle.rs`; cloudPhysicsIO 987,277 / 879,597 / 771,969 at 1/5/10 %).

use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot, NEVER};
use std::collections::BinaryHeap;

pub const INFO: PolicyInfo = PolicyInfo {
    name: "belady",
    summary: "offline optimum (knows the future; needs a pre-pass)",
    make: |cap, _cfg: &PolicyConfig| Box::new(Belady::new(cap)),
};

pub struct Belady {
    /// Max-heap of (next use, slot); entries whose next use changed are stale and skipped.
    heap: BinaryHeap<(u64, Slot)>,
    next: Vec<u64>,
    present: Vec<bool>,
    cap: usize,
}

impl Belady {
    pub fn new(capacity: u32) -> Self {
        Belady {
            heap: BinaryHeap::with_capacity(capacity as usize),
            next: vec![NEVER; capacity as usize],
            present: vec![false; capacity as usize],
            cap: capacity as usize,
        }
    }

    fn set(&mut self, slot: Slot, next_use: u64) {
        self.next[slot as usize] = next_use;
        self.heap.push((next_use, slot));
        if self.heap.len() > 2 * self.cap + 64 {
            // Drop stale entries.
            let (next, present) = (&self.next, &self.present);
            self.heap
                .retain(|&(n, s)| present[s as usize] && next[s as usize] == n);
        }
    }
}

impl Policy for Belady {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, slot: Slot, a: &Access) {
        self.set(slot, a.next_use);
    }
    fn insert(&mut self, slot: Slot, a: &Access) {
        self.present[slot as usize] = true;
        self.set(slot, a.next_use);
    }
    fn victim(&mut self) -> Slot {
        while let Some(&(n, s)) = self.heap.peek() {
            if self.present[s as usize] && self.next[s as usize] == n {
                return s;
            }
            self.heap.pop();
        }
        panic!("victim() on an empty Belady")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.present[slot as usize] = false;
    }
    fn mem_bytes(&self) -> usize {
        self.heap.capacity() * 16 + self.next.capacity() * 8 + self.present.capacity()
    }
    fn needs_oracle(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_line_used_farthest_ahead() {
        let acc = |next_use| Access {
            key: 0,
            seq: 0,
            next_use,
            is_write: false,
            class: 0,
        };
        let mut b = Belady::new(3);
        b.insert(0, &acc(10));
        b.insert(1, &acc(NEVER));
        b.insert(2, &acc(5));
        assert_eq!(b.victim(), 1);
        b.remove(1, 0, true);
        b.hit(2, &acc(50));
        assert_eq!(b.victim(), 2);
    }
}
