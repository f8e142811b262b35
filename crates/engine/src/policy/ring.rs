//! Insertion-order ring of slots with lazy deletion, for FIFO and CLOCK: 36 bits per slot
//! (a `u32` entry per slot plus 1/16 slack, and a 2-bit dead-entry count) instead of a doubly
//! linked list's two links (docs/plan-lean.md section 2).
//!
//! `push` appends a slot at the newest end. `remove` of a slot leaves its entry where it is and
//! counts one more dead entry for that slot; the oldest end drops entries while their slot has
//! dead entries, counting them down. A slot's dead entries always come before its live one (a
//! slot is pushed again only after it was removed), so the ring without its dead entries is
//! exactly the order a linked list would hold: same front, same iteration. When the ring is
//! full it is compacted in one pass (live <= capacity, so at least the slack is dead):
//! amortised O(16) per removal.

use super::Slot;
use hashbrown::HashMap;

#[derive(Clone, Debug)]
pub struct LazyRing {
    /// Entries, oldest at `start`, `used` of them (live and dead).
    ring: Vec<u32>,
    start: usize,
    used: usize,
    /// Live entries.
    live: u32,
    /// Dead-entry count per slot, 2 bits: 0..=2, or 3 = "3 or more, see `overflow`".
    dead: Vec<u64>,
    overflow: HashMap<u32, u32>,
}

impl LazyRing {
    pub fn new(capacity: u32) -> Self {
        let c = capacity as usize;
        LazyRing {
            ring: vec![0; c + (c / 16).max(1)],
            start: 0,
            used: 0,
            live: 0,
            dead: vec![0; (c * 2).div_ceil(64)],
            overflow: HashMap::new(),
        }
    }

    /// Live entries.
    #[cfg(test)]
    pub fn len(&self) -> u32 {
        self.live
    }

    #[inline]
    fn code(&self, slot: Slot) -> u64 {
        let b = slot as usize * 2;
        (self.dead[b / 64] >> (b % 64)) & 3
    }

    #[inline]
    fn set_code(&mut self, slot: Slot, c: u64) {
        let b = slot as usize * 2;
        let w = &mut self.dead[b / 64];
        *w = (*w & !(3 << (b % 64))) | c << (b % 64);
    }

    /// Dead entries of `slot` in the ring.
    #[inline]
    pub fn dead(&self, slot: Slot) -> u32 {
        match self.code(slot) {
            3 => self.overflow[&slot],
            c => c as u32,
        }
    }

    fn inc_dead(&mut self, slot: Slot) {
        match self.code(slot) {
            3 => *self.overflow.get_mut(&slot).expect("overflowed count") += 1,
            2 => {
                self.set_code(slot, 3);
                self.overflow.insert(slot, 3);
            }
            c => self.set_code(slot, c + 1),
        }
    }

    fn dec_dead(&mut self, slot: Slot) {
        match self.code(slot) {
            3 => {
                let n = self.overflow.get_mut(&slot).expect("overflowed count");
                *n -= 1;
                if *n == 2 {
                    self.overflow.remove(&slot);
                    self.set_code(slot, 2);
                }
            }
            c => {
                debug_assert!(c > 0, "slot {slot}: no dead entry to drop");
                self.set_code(slot, c - 1);
            }
        }
    }

    #[inline]
    fn at(&self, i: usize) -> u32 {
        let p = self.start + i;
        let n = self.ring.len();
        self.ring[if p >= n { p - n } else { p }]
    }

    /// Drops dead entries at the oldest end, so that [`LazyRing::front`] is live.
    #[inline]
    fn trim(&mut self) {
        if self.used > 0 && self.code(self.ring[self.start]) != 0 {
            self.trim_dead();
        }
    }

    #[cold]
    #[inline(never)]
    fn trim_dead(&mut self) {
        while self.used > 0 {
            let s = self.ring[self.start];
            if self.code(s) == 0 {
                return;
            }
            self.dec_dead(s);
            self.pop_raw();
        }
    }

    #[inline]
    fn pop_raw(&mut self) {
        self.start += 1;
        if self.start == self.ring.len() {
            self.start = 0;
        }
        self.used -= 1;
    }

    /// The oldest live slot.
    #[inline]
    pub fn front(&self) -> Option<Slot> {
        (self.used > 0).then(|| self.ring[self.start])
    }

    /// Appends `slot` (not live in the ring) at the newest end.
    #[inline]
    pub fn push(&mut self, slot: Slot) {
        if self.used == self.ring.len() {
            self.compact();
        }
        let n = self.ring.len();
        assert!(
            self.used < n,
            "ring of {n} entries full with {} live slots",
            self.live
        );
        let p = self.start + self.used;
        self.ring[if p >= n { p - n } else { p }] = slot;
        self.used += 1;
        self.live += 1;
    }

    /// Appends `order` (distinct slots, oldest first) to a ring with no live slot
    /// (asserted), as [`LazyRing::push`] of each in turn would: the dead entries are dropped
    /// first (a compaction, as a push into a full ring does), then the slots copied in.
    pub fn push_all(&mut self, order: &[Slot]) {
        assert_eq!(self.live, 0, "push_all into a ring with live slots");
        self.compact();
        debug_assert_eq!(self.used, 0);
        let n = self.ring.len();
        assert!(
            order.len() < n,
            "push_all: {} slots into a ring of {n} entries",
            order.len()
        );
        // From `start`, wrapping at the end of the ring.
        let first = order.len().min(n - self.start);
        self.ring[self.start..self.start + first].copy_from_slice(&order[..first]);
        self.ring[..order.len() - first].copy_from_slice(&order[first..]);
        self.used = order.len();
        self.live = order.len() as u32;
    }

    /// Removes and returns the oldest live slot.
    pub fn pop_front(&mut self) -> Option<Slot> {
        let s = self.front()?;
        self.pop_raw();
        self.live -= 1;
        self.trim();
        Some(s)
    }

    /// Removes `slot`, which must be live in the ring.
    #[inline]
    pub fn remove(&mut self, slot: Slot) {
        debug_assert!(self.live > 0);
        self.live -= 1;
        if self.front() == Some(slot) && self.code(slot) == 0 {
            self.pop_raw();
        } else {
            self.inc_dead(slot);
        }
        self.trim();
    }

    /// Live slots from the oldest.
    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        // An entry of a slot with d dead entries is dead if it is one of the first d met.
        let mut seen: HashMap<u32, u32> = HashMap::new();
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < self.used {
                let s = self.at(i);
                i += 1;
                if self.code(s) == 0 {
                    return Some(s);
                }
                let k = seen.entry(s).or_insert(0);
                *k += 1;
                if *k > self.dead(s) {
                    return Some(s);
                }
            }
            None
        })
    }

    /// Drops every dead entry, keeping the order of the live ones.
    fn compact(&mut self) {
        let n = self.ring.len();
        let mut j = 0;
        for i in 0..self.used {
            let s = self.at(i);
            if self.code(s) != 0 {
                self.dec_dead(s);
                continue;
            }
            let q = self.start + j;
            self.ring[if q >= n { q - n } else { q }] = s;
            j += 1;
        }
        assert_eq!(j, self.live as usize, "ring compaction lost live entries");
        debug_assert!(self.overflow.is_empty() && self.dead.iter().all(|&w| w == 0));
        self.used = j;
    }

    /// Heap bytes.
    pub fn mem_bytes(&self) -> usize {
        self.ring.capacity() * 4
            + self.dead.capacity() * 8
            + self.overflow.capacity() * (std::mem::size_of::<(u32, u32)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::list::{AlignedLinks, SlotList};
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push(u32),
        Remove(u32),
        PopFront,
    }

    proptest! {
        /// The ring holds the order of a linked list under any pushes and removals, including
        /// a slot removed and pushed again many times before the oldest end reaches it (dead
        /// counts past 3 go to the overflow map) and compactions.
        #[test]
        fn ring_equals_list(
            cap in 1u32..200,
            ops in proptest::collection::vec(prop_oneof![
                3 => any::<u32>().prop_map(Op::Push),
                2 => any::<u32>().prop_map(Op::Remove),
                1 => Just(Op::PopFront),
            ], 0..800),
            hot in 1u32..4,
        ) {
            let mut r = LazyRing::new(cap);
            let mut l: SlotList<AlignedLinks> = SlotList::new(cap);
            for o in ops {
                match o {
                    // A few hot slots get most of the churn (many dead entries each).
                    Op::Push(s) => {
                        let s = if s % 2 == 0 { s % hot.min(cap) } else { s % cap };
                        if !l.contains(s) {
                            r.push(s);
                            l.push_head(s);
                        }
                    }
                    Op::Remove(s) => {
                        let s = if s % 2 == 0 { s % hot.min(cap) } else { s % cap };
                        if l.contains(s) {
                            r.remove(s);
                            l.unlink(s);
                        }
                    }
                    Op::PopFront => prop_assert_eq!(r.pop_front(), l.pop_tail()),
                }
                prop_assert_eq!(r.len(), l.len());
                prop_assert_eq!(r.front(), l.tail());
                prop_assert_eq!(r.iter().collect::<Vec<_>>(), l.iter_from_tail().collect::<Vec<_>>());
            }
        }
    }

    proptest! {
        /// `push_all` (a restart's bulk form) into an emptied ring equals `push` of each slot
        /// in turn: same order, front and length, now and under the operations after
        /// (`start` anywhere after the history, so the copy wraps).
        #[test]
        fn push_all_equals_push_in_turn(
            cap in 1u32..200,
            before in proptest::collection::vec((any::<u32>(), any::<bool>()), 0..400),
            pick in proptest::collection::vec(any::<u32>(), 0..200),
            after in proptest::collection::vec((any::<u32>(), any::<bool>()), 0..400),
        ) {
            let apply = |r: &mut LazyRing, l: &mut SlotList<AlignedLinks>, ops: &[(u32, bool)]| {
                for &(s, push) in ops {
                    let s = s % cap;
                    if push && !l.contains(s) {
                        r.push(s);
                        l.push_head(s);
                    } else if !push && l.contains(s) {
                        r.remove(s);
                        l.unlink(s);
                    }
                }
            };
            let mut a = LazyRing::new(cap);
            let mut l: SlotList<AlignedLinks> = SlotList::new(cap);
            apply(&mut a, &mut l, &before);
            while a.pop_front().is_some() {}
            while l.pop_tail().is_some() {}
            let mut seen = vec![false; cap as usize];
            let order: Vec<Slot> = pick
                .iter()
                .map(|&x| x % cap)
                .filter(|&s| !std::mem::replace(&mut seen[s as usize], true))
                .collect();
            let mut b = a.clone();
            a.push_all(&order);
            for &s in &order {
                b.push(s);
                l.push_head(s);
            }
            prop_assert_eq!(a.iter().collect::<Vec<_>>(), order.clone());
            prop_assert_eq!((a.front(), a.len()), (b.front(), b.len()));
            let mut l2 = l.clone();
            apply(&mut a, &mut l, &after);
            apply(&mut b, &mut l2, &after);
            prop_assert_eq!(a.iter().collect::<Vec<_>>(), b.iter().collect::<Vec<_>>());
            prop_assert_eq!(a.iter().collect::<Vec<_>>(), l.iter_from_tail().collect::<Vec<_>>());
            prop_assert_eq!((a.front(), a.len()), (b.front(), b.len()));
        }
    }

    #[test]
    fn dead_counts_overflow_and_come_back() {
        let mut r = LazyRing::new(8);
        r.push(0);
        r.push(1);
        for _ in 0..5 {
            r.remove(1);
            r.push(1);
        }
        assert_eq!(r.dead(1), 5);
        assert!(!r.overflow.is_empty());
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(r.pop_front(), Some(0));
        // The oldest end dropped the five dead entries of 1.
        assert_eq!(r.dead(1), 0);
        assert!(r.overflow.is_empty());
        assert_eq!(r.front(), Some(1));
    }
}
