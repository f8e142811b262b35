//! MRU: evict the most recently used line. Good for loops larger than the cache, where LRU
//! always evicts the line needed next.

use super::{
    Access, AlignedLinks, LinkStore, PackedLinks, Policy, PolicyConfig, PolicyInfo, Slot, SlotList,
};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "mru",
    summary: "most recently used (good for large loops)",
    make: |cap, cfg: &PolicyConfig| {
        if cfg.aligned_links {
            Box::new(Mru::<AlignedLinks> {
                list: SlotList::new(cap),
            })
        } else {
            Box::new(Mru::<PackedLinks> {
                list: SlotList::new(cap),
            })
        }
    },
};

pub struct Mru<L: LinkStore = PackedLinks> {
    list: SlotList<L>,
}

impl<L: LinkStore> Policy for Mru<L> {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        self.list.move_to_head(slot);
    }
    fn insert_reads_access(&self) -> bool {
        false
    }
    fn prefetch(&self, slot: Slot) {
        self.list.prefetch(slot);
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.list.push_head(slot);
    }
    fn insert_all(&mut self, order: &[Slot]) -> bool {
        self.list.push_all(order);
        true
    }
    fn victim(&mut self) -> Slot {
        self.list.head().expect("victim() on an empty MRU")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.list.unlink(slot);
    }
    fn mem_bytes(&self) -> usize {
        self.list.mem_bytes()
    }
}
