//! LRU: evict the least recently used line. Identical to libCacheSim's `LRU`.

use super::{
    Access, AlignedLinks, LinkStore, PackedLinks, Policy, PolicyConfig, PolicyInfo, Slot, SlotList,
};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "lru",
    summary: "least recently used",
    make: |cap, cfg: &PolicyConfig| {
        if cfg.aligned_links {
            Box::new(Lru::<AlignedLinks>::new(cap))
        } else {
            Box::new(Lru::<PackedLinks>::new(cap))
        }
    },
};

pub struct Lru<L: LinkStore = PackedLinks> {
    list: SlotList<L>,
}

impl<L: LinkStore> Lru<L> {
    pub fn new(capacity: u32) -> Self {
        Lru {
            list: SlotList::new(capacity),
        }
    }
}

impl<L: LinkStore> Policy for Lru<L> {
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
    fn insert_all(&mut self, order: &[Slot]) -> bool {
        self.list.push_all(order);
        true
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
