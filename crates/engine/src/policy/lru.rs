//! LRU: evict the least recently used line. Identical to libCacheSim's `LRU`.

use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot, SlotList};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "lru",
    summary: "least recently used",
    make: |cap, _cfg: &PolicyConfig| Box::new(Lru::new(cap)),
};

pub struct Lru {
    list: SlotList,
}

impl Lru {
    pub fn new(capacity: u32) -> Self {
        Lru {
            list: SlotList::new(capacity),
        }
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        INFO.name
    }
    #[inline]
    fn hit(&mut self, slot: Slot, _a: &Access) {
        self.list.move_to_head(slot);
    }
    fn insert_reads_access(&self) -> bool {
        false
    }
    fn prefetch(&self, slot: Slot) {
        self.list.prefetch(slot);
    }
    #[inline]
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.list.push_head(slot);
    }
    fn victim(&mut self) -> Slot {
        self.list.tail().expect("victim() on an empty LRU")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.list.unlink(slot);
    }
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        out.extend(self.list.iter_from_tail().take(n));
    }
    fn mem_bytes(&self) -> usize {
        self.list.mem_bytes()
    }
}
