//! FIFO: evict the line inserted longest ago; hits do not reorder. Identical to libCacheSim's
//! `FIFO`.

use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot, SlotList};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "fifo",
    summary: "first in, first out (insertion order)",
    make: |cap, _cfg: &PolicyConfig| {
        Box::new(Fifo {
            list: SlotList::new(cap),
        })
    },
};

pub struct Fifo {
    list: SlotList,
}

impl Policy for Fifo {
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
    fn victim(&mut self) -> Slot {
        self.list.tail().expect("victim() on an empty FIFO")
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
