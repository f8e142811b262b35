//! CLOCK (second chance): lines sit in insertion order with one reference bit, set by a hit.
//! The hand looks at the oldest line: referenced lines get their bit cleared and move to the
//! newest end; the first unreferenced line is the victim. New lines start unreferenced, as in
//! libCacheSim's `Clock` with one bit (its default): miss counts are identical
//! (`tests/libcachesim_oracle.rs`: cloudPhysicsIO and Zipf at 1, 5 and 10 % of the footprint).

use super::ring::LazyRing;
use super::{Access, Policy, PolicyConfig, PolicyInfo, Slot};

pub const INFO: PolicyInfo = PolicyInfo {
    name: "clock",
    summary: "second chance with one reference bit",
    make: |cap, _cfg: &PolicyConfig| Box::new(Clock::new(cap)),
};

/// Insertion order in a ring with lazy deletion (`ring.rs`) and one reference bit per slot:
/// 4.6 B per slot.
pub struct Clock {
    ring: LazyRing,
    referenced: Vec<u64>,
}

impl Clock {
    pub fn new(capacity: u32) -> Self {
        Clock {
            ring: LazyRing::new(capacity),
            referenced: vec![0; (capacity as usize).div_ceil(64)],
        }
    }

    #[inline]
    fn is_ref(&self, slot: Slot) -> bool {
        self.referenced[slot as usize / 64] >> (slot % 64) & 1 != 0
    }

    #[inline]
    fn set_ref(&mut self, slot: Slot, on: bool) {
        let w = &mut self.referenced[slot as usize / 64];
        let bit = 1u64 << (slot % 64);
        if on {
            *w |= bit;
        } else {
            *w &= !bit;
        }
    }
}

impl Policy for Clock {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn hit(&mut self, slot: Slot, _a: &Access) {
        self.set_ref(slot, true);
    }
    fn insert_reads_access(&self) -> bool {
        false
    }
    fn prefetch(&self, slot: Slot) {
        crate::index::prefetch(self.referenced.as_ptr().wrapping_add(slot as usize / 64));
    }
    fn insert(&mut self, slot: Slot, _a: &Access) {
        self.set_ref(slot, false);
        self.ring.push(slot);
    }
    fn insert_all(&mut self, order: &[Slot]) -> bool {
        // `insert` clears each slot's bit; with no slot in the ring every bit is clear
        // already (`remove` clears it): the fill changes nothing (checked in debug builds).
        debug_assert!(self.referenced.iter().all(|&w| w == 0));
        self.referenced.fill(0);
        self.ring.push_all(order);
        true
    }
    fn victim(&mut self) -> Slot {
        loop {
            let t = self.ring.front().expect("victim() on an empty CLOCK");
            if !self.is_ref(t) {
                return t;
            }
            self.set_ref(t, false);
            self.ring.pop_front();
            self.ring.push(t);
        }
    }
    fn remove(&mut self, slot: Slot, _key: u64, _evicted: bool) {
        self.ring.remove(slot);
        self.set_ref(slot, false);
    }
    /// Unreferenced slots from the hand on (referenced ones get their second chance first).
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        out.extend(self.ring.iter().filter(|&s| !self.is_ref(s)).take(n));
    }
    fn mem_bytes(&self) -> usize {
        self.ring.mem_bytes() + self.referenced.capacity() * 8
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
