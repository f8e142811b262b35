//! Intrusive doubly-linked lists over slots, O(1) everything, shared by the list-based
//! policies (LRU, LIFO, MRU, SLRU, ARC, S3-FIFO and the ghost history).
//!
//! The links of a slot are stored bit-packed ([`PackedLinks`]): `prev` and `next` of `w` bits
//! each, `w = ceil(log2(capacity + 1))` (the all-ones value is "none"), so a slot costs `2w`
//! bits (4.25 B at 131,072 slots, 6.75 B at 100 M) instead of 8. Exact LRU needs O(1) unlink of
//! any slot on a hit, hence both neighbours: `2w` bits is the floor (docs/plan-lean.md
//! section 2). [`AlignedLinks`] is the plain two-`u32` form behind the same interface.
//!
//! A policy with several lists whose slots are each in at most one of them (SLRU) shares one
//! link array between them: [`MultiList`] (one link pair per slot, not per slot per list).

use super::Slot;

/// Storage of one `(prev, next)` pair per slot. [`LinkStore::nil`] means "none".
pub trait LinkStore: Clone + std::fmt::Debug {
    fn with_capacity(capacity: u32) -> Self;
    /// The "no slot" value.
    fn nil(&self) -> u32;
    fn prev(&self, slot: Slot) -> u32;
    fn next(&self, slot: Slot) -> u32;
    fn set_prev(&mut self, slot: Slot, v: u32);
    fn set_next(&mut self, slot: Slot, v: u32);
    /// Sets both links of `slot`.
    fn set(&mut self, slot: Slot, prev: u32, next: u32);
    /// Hints the CPU to load the links of `slot`.
    fn prefetch(&self, slot: Slot);
    /// Heap bytes.
    fn mem_bytes(&self) -> usize;
}

/// Two `u32` per slot (8 B), interleaved so that one cache line holds both links.
#[derive(Clone, Debug)]
pub struct AlignedLinks {
    links: Vec<[u32; 2]>,
}

impl LinkStore for AlignedLinks {
    fn with_capacity(capacity: u32) -> Self {
        AlignedLinks {
            links: vec![[u32::MAX; 2]; capacity as usize],
        }
    }
    #[inline]
    fn nil(&self) -> u32 {
        u32::MAX
    }
    #[inline]
    fn prev(&self, slot: Slot) -> u32 {
        self.links[slot as usize][0]
    }
    #[inline]
    fn next(&self, slot: Slot) -> u32 {
        self.links[slot as usize][1]
    }
    #[inline]
    fn set_prev(&mut self, slot: Slot, v: u32) {
        self.links[slot as usize][0] = v;
    }
    #[inline]
    fn set_next(&mut self, slot: Slot, v: u32) {
        self.links[slot as usize][1] = v;
    }
    #[inline]
    fn set(&mut self, slot: Slot, prev: u32, next: u32) {
        self.links[slot as usize] = [prev, next];
    }
    #[inline]
    fn prefetch(&self, slot: Slot) {
        crate::index::prefetch(self.links.as_ptr().wrapping_add(slot as usize));
    }
    fn mem_bytes(&self) -> usize {
        self.links.capacity() * 8
    }
}

/// `(prev, next)` of `w` bits each per slot, packed back to back in 64-bit words: slot `s`
/// occupies bits `2ws .. 2w(s+1)`, `prev` in the low half. A pair may straddle two words; one
/// spare word at the end lets every access read two words without a bounds branch.
#[derive(Clone, Debug)]
pub struct PackedLinks {
    words: Vec<u64>,
    /// Bits per link (1..=32).
    w: u32,
    /// `(1 << w) - 1`: the "none" value and the field mask.
    nil: u32,
}

impl PackedLinks {
    /// Bits per link for `capacity` slots: enough for `0..capacity` and "none".
    pub fn width(capacity: u32) -> u32 {
        (64 - (capacity as u64).leading_zeros()).max(1)
    }

    /// The two words holding bit `bit` and the following 63 bits, as one `u128`.
    #[inline(always)]
    fn load(&self, word: usize) -> u128 {
        self.words[word] as u128 | (self.words[word + 1] as u128) << 64
    }

    #[inline(always)]
    fn store(&mut self, word: usize, v: u128) {
        self.words[word] = v as u64;
        self.words[word + 1] = (v >> 64) as u64;
    }

    /// Reads the `w`-bit field at bit `bit`.
    #[inline(always)]
    fn get_field(&self, bit: u64) -> u32 {
        let (word, off) = ((bit / 64) as usize, bit % 64);
        ((self.load(word) >> off) as u32) & self.nil
    }

    /// Writes `width` bits of `v` at bit `bit`.
    #[inline(always)]
    fn put(&mut self, bit: u64, width: u32, v: u64) {
        let (word, off) = ((bit / 64) as usize, bit % 64);
        let mask = (((1u128 << width) - 1) as u128) << off;
        let x = (self.load(word) & !mask) | ((v as u128) << off);
        self.store(word, x);
    }
}

impl LinkStore for PackedLinks {
    fn with_capacity(capacity: u32) -> Self {
        let w = Self::width(capacity);
        let bits = capacity as u64 * 2 * w as u64;
        let nil = ((1u64 << w) - 1) as u32;
        // All ones: every link "none". One spare word for the two-word reads.
        PackedLinks {
            words: vec![u64::MAX; (bits.div_ceil(64) + 1) as usize],
            w,
            nil,
        }
    }
    #[inline]
    fn nil(&self) -> u32 {
        self.nil
    }
    #[inline]
    fn prev(&self, slot: Slot) -> u32 {
        self.get_field(slot as u64 * 2 * self.w as u64)
    }
    #[inline]
    fn next(&self, slot: Slot) -> u32 {
        self.get_field((slot as u64 * 2 + 1) * self.w as u64)
    }
    #[inline]
    fn set_prev(&mut self, slot: Slot, v: u32) {
        debug_assert!(v <= self.nil);
        self.put(slot as u64 * 2 * self.w as u64, self.w, v as u64);
    }
    #[inline]
    fn set_next(&mut self, slot: Slot, v: u32) {
        debug_assert!(v <= self.nil);
        self.put((slot as u64 * 2 + 1) * self.w as u64, self.w, v as u64);
    }
    #[inline]
    fn set(&mut self, slot: Slot, prev: u32, next: u32) {
        debug_assert!(prev <= self.nil && next <= self.nil);
        let pair = prev as u64 | (next as u64) << self.w;
        self.put(slot as u64 * 2 * self.w as u64, 2 * self.w, pair);
    }
    #[inline]
    fn prefetch(&self, slot: Slot) {
        let word = (slot as u64 * 2 * self.w as u64 / 64) as usize;
        crate::index::prefetch(self.words.as_ptr().wrapping_add(word));
    }
    fn mem_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

/// Head, tail and length of one list threaded on a [`LinkStore`].
#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
    len: u32,
}

impl Ends {
    fn new(nil: u32) -> Self {
        Ends {
            head: nil,
            tail: nil,
            len: 0,
        }
    }

    #[inline(always)]
    fn push_head<L: LinkStore>(&mut self, links: &mut L, slot: Slot) {
        let nil = links.nil();
        links.set(slot, nil, self.head);
        if self.head != nil {
            links.set_prev(self.head, slot);
        } else {
            self.tail = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    #[inline(always)]
    fn unlink<L: LinkStore>(&mut self, links: &mut L, slot: Slot) {
        let nil = links.nil();
        let (p, n) = (links.prev(slot), links.next(slot));
        if p != nil {
            links.set_next(p, n);
        } else {
            debug_assert_eq!(self.head, slot, "slot {slot} is not in this list");
            self.head = n;
        }
        if n != nil {
            links.set_prev(n, p);
        } else {
            debug_assert_eq!(self.tail, slot, "slot {slot} is not in this list");
            self.tail = p;
        }
        links.set(slot, nil, nil);
        self.len -= 1;
    }

    fn iter_from_tail<'a, L: LinkStore>(&self, links: &'a L) -> impl Iterator<Item = Slot> + 'a {
        let nil = links.nil();
        let mut at = self.tail;
        std::iter::from_fn(move || {
            if at == nil {
                return None;
            }
            let s = at;
            at = links.prev(s);
            Some(s)
        })
    }
}

/// Doubly-linked list of slots. Each list owns its links, so a policy with several lists
/// (ARC, S3-FIFO) pays `2w` bits per slot per list and can ask any of them whether it holds
/// a slot ([`SlotList::contains`]); policies whose lists partition the slots use
/// [`MultiList`] instead.
#[derive(Clone, Debug)]
pub struct SlotList<L: LinkStore = PackedLinks> {
    links: L,
    ends: Ends,
}

impl<L: LinkStore> SlotList<L> {
    pub fn new(capacity: u32) -> Self {
        let links = L::with_capacity(capacity);
        let ends = Ends::new(links.nil());
        SlotList { links, ends }
    }

    pub fn len(&self) -> u32 {
        self.ends.len
    }

    pub fn is_empty(&self) -> bool {
        self.ends.len == 0
    }

    /// Whether `slot` is in this list.
    pub fn contains(&self, slot: Slot) -> bool {
        self.links.prev(slot) != self.links.nil() || self.ends.head == slot
    }

    /// Most recently pushed end.
    pub fn head(&self) -> Option<Slot> {
        (self.ends.head != self.links.nil()).then_some(self.ends.head)
    }

    /// Oldest end.
    pub fn tail(&self) -> Option<Slot> {
        (self.ends.tail != self.links.nil()).then_some(self.ends.tail)
    }

    /// Hints the CPU to load the links of `slot` (a bulk restore threads slots in an order
    /// unrelated to their positions).
    #[inline]
    pub fn prefetch(&self, slot: Slot) {
        self.links.prefetch(slot);
    }

    /// Inserts `slot` at the head.
    #[inline]
    pub fn push_head(&mut self, slot: Slot) {
        debug_assert!(!self.contains(slot), "slot {slot} already listed");
        self.ends.push_head(&mut self.links, slot);
    }

    /// Unlinks `slot` (which must be in the list).
    #[inline]
    pub fn unlink(&mut self, slot: Slot) {
        debug_assert!(self.contains(slot), "slot {slot} not listed");
        self.ends.unlink(&mut self.links, slot);
    }

    /// Moves `slot` (in the list) to the head.
    #[inline]
    pub fn move_to_head(&mut self, slot: Slot) {
        if self.ends.head != slot {
            self.unlink(slot);
            self.push_head(slot);
        }
    }

    /// Slots from the tail (oldest) towards the head.
    pub fn iter_from_tail(&self) -> impl Iterator<Item = Slot> + '_ {
        self.ends.iter_from_tail(&self.links)
    }

    /// Removes and returns the tail.
    pub fn pop_tail(&mut self) -> Option<Slot> {
        let t = self.tail()?;
        self.unlink(t);
        Some(t)
    }

    /// Heap bytes.
    pub fn mem_bytes(&self) -> usize {
        self.links.mem_bytes()
    }
}

/// `K` doubly-linked lists sharing one link array: a slot is in at most one of them, and the
/// caller knows which (it passes the list to every call). `2w` bits per slot whatever `K`.
#[derive(Clone, Debug)]
pub struct MultiList<const K: usize, L: LinkStore = PackedLinks> {
    links: L,
    ends: [Ends; K],
}

impl<const K: usize, L: LinkStore> MultiList<K, L> {
    pub fn new(capacity: u32) -> Self {
        let links = L::with_capacity(capacity);
        let ends = [Ends::new(links.nil()); K];
        MultiList { links, ends }
    }

    pub fn len(&self, list: usize) -> u32 {
        self.ends[list].len
    }

    /// Most recently pushed end of `list`.
    pub fn head(&self, list: usize) -> Option<Slot> {
        let h = self.ends[list].head;
        (h != self.links.nil()).then_some(h)
    }

    /// Oldest end of `list`.
    pub fn tail(&self, list: usize) -> Option<Slot> {
        let t = self.ends[list].tail;
        (t != self.links.nil()).then_some(t)
    }

    /// Whether `slot` is in one of the lists (not which).
    pub fn contains_any(&self, slot: Slot) -> bool {
        self.links.prev(slot) != self.links.nil() || self.ends.iter().any(|e| e.head == slot)
    }

    #[inline]
    pub fn prefetch(&self, slot: Slot) {
        self.links.prefetch(slot);
    }

    /// Inserts `slot` (in no list) at the head of `list`.
    #[inline]
    pub fn push_head(&mut self, list: usize, slot: Slot) {
        debug_assert!(!self.contains_any(slot), "slot {slot} already listed");
        self.ends[list].push_head(&mut self.links, slot);
    }

    /// Unlinks `slot`, which must be in `list`.
    #[inline]
    pub fn unlink(&mut self, list: usize, slot: Slot) {
        debug_assert!(self.contains_any(slot), "slot {slot} not listed");
        self.ends[list].unlink(&mut self.links, slot);
    }

    /// Moves `slot` (in `list`) to the head of `list`.
    #[inline]
    pub fn move_to_head(&mut self, list: usize, slot: Slot) {
        if self.ends[list].head != slot {
            self.unlink(list, slot);
            self.push_head(list, slot);
        }
    }

    /// Removes and returns the tail of `list`.
    pub fn pop_tail(&mut self, list: usize) -> Option<Slot> {
        let t = self.tail(list)?;
        self.unlink(list, t);
        Some(t)
    }

    /// Slots of `list` from the tail (oldest) towards the head.
    pub fn iter_from_tail(&self, list: usize) -> impl Iterator<Item = Slot> + '_ {
        self.ends[list].iter_from_tail(&self.links)
    }

    /// Heap bytes.
    pub fn mem_bytes(&self) -> usize {
        self.links.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn widths_fit_capacity_and_none() {
        assert_eq!(PackedLinks::width(0), 1);
        assert_eq!(PackedLinks::width(1), 1); // slot 0 and none = 1
        assert_eq!(PackedLinks::width(2), 2);
        assert_eq!(PackedLinks::width(3), 2); // 0, 1, 2 and none = 3
        assert_eq!(PackedLinks::width(131_072), 18);
        assert_eq!(PackedLinks::width(131_071), 17);
        assert_eq!(PackedLinks::width(u32::MAX), 32);
        // 131,071 slots: 34 bits per slot, 4.25 B.
        let l = PackedLinks::with_capacity(131_071);
        assert!(l.mem_bytes() <= 131_071 * 34 / 8 + 16);
    }

    #[test]
    fn packed_fields_do_not_disturb_neighbours() {
        for cap in [1u32, 2, 3, 5, 31, 100, 1000] {
            let mut p = PackedLinks::with_capacity(cap);
            let mut a = AlignedLinks::with_capacity(cap);
            let nil = p.nil();
            for s in 0..cap {
                let (x, y) = ((s * 7 + 1) % (cap + 1), (s * 3) % (cap + 1));
                let (x, y) = (
                    if x == cap { nil } else { x },
                    if y == cap { nil } else { y },
                );
                p.set(s, x, y);
                a.set(s, x, y);
                if s % 3 == 0 {
                    p.set_prev(s, y);
                    a.set_prev(s, y);
                }
                if s % 5 == 0 {
                    p.set_next(s, x);
                    a.set_next(s, x);
                }
            }
            for s in 0..cap {
                assert_eq!(
                    (p.prev(s), p.next(s)),
                    (a.prev(s), a.next(s)),
                    "cap {cap} slot {s}"
                );
            }
        }
    }

    /// One list operation, on slot `s % capacity`.
    #[derive(Clone, Debug)]
    enum Op {
        Push(u32),
        Unlink(u32),
        ToHead(u32),
        PopTail,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u32>().prop_map(Op::Push),
            any::<u32>().prop_map(Op::Unlink),
            any::<u32>().prop_map(Op::ToHead),
            Just(Op::PopTail),
        ]
    }

    proptest! {
        /// The packed list and the aligned one answer every question alike; MultiList with
        /// two lists equals two separate lists whose slots are disjoint.
        #[test]
        fn packed_equals_aligned(cap in 1u32..300, ops in proptest::collection::vec(op(), 0..400)) {
            let mut p: SlotList<PackedLinks> = SlotList::new(cap);
            let mut a: SlotList<AlignedLinks> = SlotList::new(cap);
            let mut m: MultiList<2> = MultiList::new(cap);
            let mut two: [SlotList<AlignedLinks>; 2] = [SlotList::new(cap), SlotList::new(cap)];
            for o in ops {
                match o {
                    Op::Push(s) => {
                        let s = s % cap;
                        if !a.contains(s) {
                            p.push_head(s);
                            a.push_head(s);
                        }
                        let l = (s % 2) as usize;
                        if !two[0].contains(s) && !two[1].contains(s) {
                            m.push_head(l, s);
                            two[l].push_head(s);
                        }
                    }
                    Op::Unlink(s) => {
                        let s = s % cap;
                        if a.contains(s) {
                            p.unlink(s);
                            a.unlink(s);
                        }
                        for l in 0..2 {
                            if two[l].contains(s) {
                                m.unlink(l, s);
                                two[l].unlink(s);
                            }
                        }
                    }
                    Op::ToHead(s) => {
                        let s = s % cap;
                        if a.contains(s) {
                            p.move_to_head(s);
                            a.move_to_head(s);
                        }
                        for l in 0..2 {
                            if two[l].contains(s) {
                                m.move_to_head(l, s);
                                two[l].move_to_head(s);
                            }
                        }
                    }
                    Op::PopTail => {
                        prop_assert_eq!(p.pop_tail(), a.pop_tail());
                        prop_assert_eq!(m.pop_tail(1), two[1].pop_tail());
                    }
                }
                prop_assert_eq!(p.len(), a.len());
                prop_assert_eq!(p.head(), a.head());
                prop_assert_eq!(p.tail(), a.tail());
                for s in 0..cap {
                    prop_assert_eq!(p.contains(s), a.contains(s));
                    prop_assert_eq!(m.contains_any(s), two[0].contains(s) || two[1].contains(s));
                }
                prop_assert_eq!(p.iter_from_tail().collect::<Vec<_>>(), a.iter_from_tail().collect::<Vec<_>>());
                for l in 0..2 {
                    prop_assert_eq!(m.len(l), two[l].len());
                    prop_assert_eq!(m.head(l), two[l].head());
                    prop_assert_eq!(m.iter_from_tail(l).collect::<Vec<_>>(), two[l].iter_from_tail().collect::<Vec<_>>());
                }
            }
        }
    }
}
