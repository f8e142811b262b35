//! FIFO: evict the line inserted longest ago; hits do not reorder. Identical to libCacheSim's
//! `FIFO`.

use super::ring::LazyRing;
use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "fifo",
    summary: "first in, first out (insertion order)",
    make: |cap, _cfg: &PolicyConfig| {
        Box::new(Fifo {
            ring: LazyRing::new(cap),
        })
    },
};

/// Insertion order in a ring with lazy deletion (4.5 B per slot, `ring.rs`).
pub struct Fifo {
    ring: LazyRing,
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, _slot: Slot, _a: &Access) {}
    fn insert_reads_access(&self) -> bool {
        false
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.ring.push(slot);
    }
    fn insert_all(&mut self, order: &[Slot]) -> bool {
        self.ring.push_all(order);
        true
    }
    fn victim(&mut self) -> Slot {
        self.ring.front().expect("victim() on an empty FIFO")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.ring.remove(slot);
    }
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        out.extend(self.ring.iter().take(n));
    }
    fn mem_bytes(&self) -> usize {
        self.ring.mem_bytes()
    }
}
