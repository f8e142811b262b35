//! LIFO: evict the line inserted most recently; hits do not reorder. The SRT study's "LIFO".
//! Old lines stay forever, so LIFO keeps the first working set it sees (scan-proof, but it
//! never adapts).

use super::{
    Access, AlignedLinks, LinkStore, PackedLinks, Policy, PolicyConfig, PolicyInfo, Slot, SlotList,
};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "lifo",
    summary: "last in, first out (evicts the newest insertion)",
    make: |cap, cfg: &PolicyConfig| {
        if cfg.aligned_links {
            Box::new(Lifo::<AlignedLinks> {
                list: SlotList::new(cap),
            })
        } else {
            Box::new(Lifo::<PackedLinks> {
                list: SlotList::new(cap),
            })
        }
    },
};

pub struct Lifo<L: LinkStore = PackedLinks> {
    list: SlotList<L>,
}

impl<L: LinkStore> Policy for Lifo<L> {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, _slot: Slot, _a: &Access) {}
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
        self.list.head().expect("victim() on an empty LIFO")
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.list.unlink(slot);
    }
    fn mem_bytes(&self) -> usize {
        self.list.mem_bytes()
    }
}
