//! CLOCK (second chance): lines sit in insertion order with one reference bit, set by a hit.
//! The hand looks at the oldest line: referenced lines get their bit cleared and move to the
//! newest end; the first unreferenced line is the victim. New lines start unreferenced, as in
//! libCacheSim's `Clock` with one bit (its default): miss counts are identical
//! (`tests/libcachesim_oracle.rs`: cloudPhysicsIO and Zipf at 1, 5 and 10 % of the footprint).

use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot, SlotList};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "clock",
    summary: "second chance with one reference bit",
    make: |cap, _cfg: &PolicyConfig| Box::new(Clock::new(cap)),
};

pub struct Clock {
    ring: SlotList,
    referenced: Vec<bool>,
}

impl Clock {
    pub fn new(capacity: u32) -> Self {
        Clock {
            ring: SlotList::new(capacity),
            referenced: vec![false; capacity as usize],
        }
    }
}

impl Policy for Clock {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        self.referenced[slot as usize] = true;
    }
    fn insert_reads_access(&self) -> bool {
        false
    }
    fn prefetch(&self, slot: Slot) {
        self.ring.prefetch(slot);
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.referenced[slot as usize] = false;
        self.ring.push_head(slot);
    }
    fn victim(&mut self) -> Slot {
        loop {
            let t = self.ring.tail().expect("victim() on an empty CLOCK");
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
    /// Unreferenced slots from the hand on (referenced ones get their second chance first).
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
        self.ring.mem_bytes() + self.referenced.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referenced_line_gets_a_second_chance() {
        let a = Access {
            key: 0,
            seq: 0,
            next_use: super::super::NEVER,
            is_write: false,
            class: 0,
        };
        let mut c = Clock::new(3);
        for s in 0..3 {
            c.insert(s, &a);
        }
        c.hit(0, &a);
        assert_eq!(c.victim(), 1);
        c.remove(1, 0, true);
        c.insert(1, &a);
        assert_eq!(c.victim(), 2);
    }
}
