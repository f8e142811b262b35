//! Intrusive doubly-linked lists over slots, O(1) everything, shared by the list-based
//! policies (LRU, LIFO, MRU, SLRU, ARC, S3-FIFO and the ghost history).
//!
//! The links of a slot are stored bit-packed ([`PackedLinks`]): `prev` and `next` of `w` bits
//! each, `w = ceil(log2(capacity))` ("none" is the slot's own id), so a slot costs `2w` bits
//! (4.25 B at 131,072 slots, 6.75 B at 100 M) instead of 8. Exact LRU needs O(1) unlink of
//! any slot on a hit, hence both neighbours: `2w` bits is the floor (docs/plan-lean.md
//! section 2). [`AlignedLinks`] is the plain two-`u32` form behind the same interface.
//!
//! A policy with several lists whose slots are each in at most one of them (SLRU) shares one
//! link array between them: [`MultiList`] (one link pair per slot, not per slot per list).

use super::Slot;

/// Storage of one `(prev, next)` pair per slot. [`LinkStore::nil`] means "none".
pub trait LinkStore: Clone + std::fmt::Debug + Send + 'static {
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

/// `(prev, next)` of `w` bits each per slot, packed back to back: slot `s` occupies bits
/// `2ws .. 2w(s+1)`, `prev` in the low half. "None" is stored as the slot's own id (a slot is
/// never its own neighbour), so `w = ceil(log2(capacity))` bits suffice: 17 at 131,072 slots
/// (4.25 B per slot). A field is read and written with one unaligned 8-byte access at its
/// first byte (a field spans at most 32 + 7 bits); 8 spare bytes at the end keep every such
/// access in bounds.
#[derive(Clone, Debug)]
pub struct PackedLinks {
    bytes: Vec<u8>,
    /// Bits per link (1..=32).
    w: u32,
    /// `(1 << w) - 1`.
    mask: u64,
    /// A pair (2w bits) fits one 8-byte access at any bit offset (2w + 7 <= 64).
    pair_in_one: bool,
}

/// What [`PackedLinks`] answers for "none".
const NONE: u32 = u32::MAX;

impl PackedLinks {
    /// Bits per link for `capacity` slots: enough for `0..capacity`.
    pub fn width(capacity: u32) -> u32 {
        (32 - capacity.saturating_sub(1).leading_zeros()).max(1)
    }

    #[inline(always)]
    fn load(&self, byte: usize) -> u64 {
        u64::from_le_bytes(self.bytes[byte..byte + 8].try_into().expect("8 bytes"))
    }

    #[inline(always)]
    fn store(&mut self, byte: usize, v: u64) {
        self.bytes[byte..byte + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Reads the `width`-bit field at bit `bit`.
    #[inline(always)]
    fn get(&self, bit: u64, mask: u64) -> u64 {
        (self.load((bit / 8) as usize) >> (bit % 8)) & mask
    }

    /// Writes the `width`-bit field at bit `bit`.
    #[inline(always)]
    fn put(&mut self, bit: u64, mask: u64, v: u64) {
        let (byte, sh) = ((bit / 8) as usize, bit % 8);
        let x = (self.load(byte) & !(mask << sh)) | (v << sh);
        self.store(byte, x);
    }

    /// The stored form of link `v` of `slot`.
    #[inline(always)]
    fn enc(slot: Slot, v: u32) -> u64 {
        debug_assert!(v != slot, "slot {slot} linked to itself");
        (if v == NONE { slot } else { v }) as u64
    }

    #[inline(always)]
    fn dec(slot: Slot, x: u64) -> u32 {
        if x as u32 == slot {
            NONE
        } else {
            x as u32
        }
    }
}

impl PackedLinks {
    /// Links of `w >= width(capacity)` bits (wider than needed only in tests: the two-access
    /// path of pairs above 28 bits per link).
    fn with_width(capacity: u32, w: u32) -> Self {
        assert!(
            (Self::width(capacity)..=32).contains(&w),
            "{w}-bit links for {capacity} slots"
        );
        let bits = capacity as u64 * 2 * w as u64;
        let mut l = PackedLinks {
            bytes: vec![0; bits.div_ceil(8) as usize + 8],
            w,
            mask: (1u64 << w) - 1,
            pair_in_one: 2 * w + 7 <= 64,
        };
        for s in 0..capacity {
            l.set(s, NONE, NONE);
        }
        l
    }
}

impl LinkStore for PackedLinks {
    fn with_capacity(capacity: u32) -> Self {
        Self::with_width(capacity, Self::width(capacity))
    }
    #[inline]
    fn nil(&self) -> u32 {
        NONE
    }
    #[inline]
    fn prev(&self, slot: Slot) -> u32 {
        Self::dec(slot, self.get(slot as u64 * 2 * self.w as u64, self.mask))
    }
    #[inline]
    fn next(&self, slot: Slot) -> u32 {
        Self::dec(
            slot,
            self.get((slot as u64 * 2 + 1) * self.w as u64, self.mask),
        )
    }
    #[inline]
    fn set_prev(&mut self, slot: Slot, v: u32) {
        let x = Self::enc(slot, v);
        self.put(slot as u64 * 2 * self.w as u64, self.mask, x);
    }
    #[inline]
    fn set_next(&mut self, slot: Slot, v: u32) {
        let x = Self::enc(slot, v);
        self.put((slot as u64 * 2 + 1) * self.w as u64, self.mask, x);
    }
    #[inline]
    fn set(&mut self, slot: Slot, prev: u32, next: u32) {
        if self.pair_in_one {
            let pair = Self::enc(slot, prev) | Self::enc(slot, next) << self.w;
            let mask = (self.mask << self.w) | self.mask;
            self.put(slot as u64 * 2 * self.w as u64, mask, pair);
        } else {
            self.set_prev(slot, prev);
            self.set_next(slot, next);
        }
    }
    #[inline]
    fn prefetch(&self, slot: Slot) {
        let byte = (slot as u64 * 2 * self.w as u64 / 8) as usize;
        crate::index::prefetch(self.bytes.as_ptr().wrapping_add(byte));
    }
    fn mem_bytes(&self) -> usize {
        self.bytes.capacity()
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

/// Links `order` (distinct slots, none in a list: their links are "none") into one list as
/// pushing each at the head in turn would: slot `order[i]` gets `prev = order[i + 1]` (newer)
/// and `next = order[i - 1]` (older); the tail is `order[0]`, the head the last. Returns the
/// list's ends.
fn set_chain<L: LinkStore>(links: &mut L, order: &[Slot]) -> Ends {
    const AHEAD: usize = 16;
    let nil = links.nil();
    let n = order.len();
    assert!(
        n < u32::MAX as usize,
        "set_chain: {n} slots do not fit a list"
    );
    for (i, &slot) in order.iter().enumerate() {
        if let Some(&s) = order.get(i + AHEAD) {
            links.prefetch(s);
        }
        debug_assert!(
            links.prev(slot) == nil && links.next(slot) == nil,
            "set_chain: slot {slot} already linked"
        );
        let prev = order.get(i + 1).copied().unwrap_or(nil);
        let next = if i > 0 { order[i - 1] } else { nil };
        links.set(slot, prev, next);
    }
    Ends {
        head: order.last().copied().unwrap_or(nil),
        tail: order.first().copied().unwrap_or(nil),
        len: n as u32,
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

    /// Fills the empty list (asserted) with `order`, distinct slots oldest first, exactly as
    /// [`SlotList::push_head`] of each in turn would (a restart: one write per slot, no
    /// neighbour's links read or written again).
    pub fn push_all(&mut self, order: &[Slot]) {
        assert!(
            self.ends.len == 0,
            "push_all into a list of {} slots",
            self.ends.len
        );
        self.ends = set_chain(&mut self.links, order);
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

    /// Fills `list` with `order`, distinct slots oldest first, exactly as
    /// [`MultiList::push_head`] of each in turn would. Every list must be empty (asserted: a
    /// slot of another list would keep its links).
    pub fn push_all(&mut self, list: usize, order: &[Slot]) {
        assert!(
            self.ends.iter().all(|e| e.len == 0),
            "push_all into lists holding slots"
        );
        self.ends[list] = set_chain(&mut self.links, order);
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
    // The lists are indexed by number, as MultiList is.
    #![allow(clippy::needless_range_loop)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn widths_fit_capacity_and_none() {
        assert_eq!(PackedLinks::width(0), 1);
        assert_eq!(PackedLinks::width(1), 1);
        assert_eq!(PackedLinks::width(2), 1);
        assert_eq!(PackedLinks::width(3), 2);
        assert_eq!(PackedLinks::width(131_072), 17);
        assert_eq!(PackedLinks::width(131_073), 18);
        assert_eq!(PackedLinks::width(u32::MAX), 32);
        // 131,072 slots: 34 bits per slot, 4.25 B.
        let l = PackedLinks::with_capacity(131_072);
        assert!(l.mem_bytes() <= 131_072 * 34 / 8 + 16);
    }

    #[test]
    fn packed_fields_do_not_disturb_neighbours() {
        for (cap, w) in [
            (1u32, 1),
            (2, 1),
            (3, 2),
            (5, 3),
            (31, 5),
            (100, 7),
            (1000, 10),
            (100, 28),
            (100, 29),
            (1000, 32),
        ] {
            let mut p = PackedLinks::with_width(cap, w);
            assert_eq!(p.pair_in_one, w <= 28);
            let mut a = AlignedLinks::with_capacity(cap);
            assert_eq!(p.nil(), a.nil());
            // Another slot or none (cap stands for none; a slot is never its own neighbour).
            let link = |s: u32, v: u32| if v == cap || v == s { u32::MAX } else { v };
            for s in 0..cap {
                let (x, y) = (
                    link(s, (s * 7 + 1) % (cap + 1)),
                    link(s, (s * 3) % (cap + 1)),
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

        /// `push_all` (a restart's bulk links) leaves a list exactly as `push_head` of each
        /// slot in turn: every slot's links, the ends, the order, and every answer under the
        /// operations after; for packed links of the width needed and of 30 bits (a pair in
        /// two accesses), aligned links, and a MultiList; into lists that held slots before.
        #[test]
        fn push_all_equals_push_head_in_turn(
            cap in 1u32..300,
            before in proptest::collection::vec(op(), 0..200),
            pick in proptest::collection::vec(any::<u32>(), 0..300),
            after in proptest::collection::vec(op(), 0..200),
        ) {
            fn check<L: LinkStore>(
                mut bulk: SlotList<L>,
                mut one: SlotList<L>,
                cap: u32,
                before: &[Op],
                order: &[Slot],
                after: &[Op],
            ) -> Result<(), TestCaseError> {
                for l in [&mut bulk, &mut one] {
                    apply(l, cap, before);
                    while l.pop_tail().is_some() {}
                }
                bulk.push_all(order);
                for &s in order {
                    one.push_head(s);
                }
                for s in 0..cap {
                    prop_assert_eq!(
                        (bulk.links.prev(s), bulk.links.next(s)),
                        (one.links.prev(s), one.links.next(s)),
                        "slot {}", s
                    );
                }
                prop_assert_eq!((bulk.head(), bulk.tail(), bulk.len()), (one.head(), one.tail(), one.len()));
                prop_assert_eq!(bulk.iter_from_tail().collect::<Vec<_>>(), order.to_vec());
                apply(&mut bulk, cap, after);
                apply(&mut one, cap, after);
                prop_assert_eq!(bulk.iter_from_tail().collect::<Vec<_>>(), one.iter_from_tail().collect::<Vec<_>>());
                Ok(())
            }
            fn apply<L: LinkStore>(l: &mut SlotList<L>, cap: u32, ops: &[Op]) {
                for o in ops {
                    match *o {
                        Op::Push(s) if !l.contains(s % cap) => l.push_head(s % cap),
                        Op::Unlink(s) if l.contains(s % cap) => l.unlink(s % cap),
                        Op::ToHead(s) if l.contains(s % cap) => l.move_to_head(s % cap),
                        Op::PopTail => {
                            l.pop_tail();
                        }
                        _ => {}
                    }
                }
            }
            // Distinct slots in a random order.
            let mut seen = vec![false; cap as usize];
            let order: Vec<Slot> = pick
                .iter()
                .map(|&x| x % cap)
                .filter(|&s| !std::mem::replace(&mut seen[s as usize], true))
                .collect();
            check::<PackedLinks>(SlotList::new(cap), SlotList::new(cap), cap, &before, &order, &after)?;
            let wide = || SlotList {
                links: PackedLinks::with_width(cap, 30),
                ends: Ends::new(NONE),
            };
            check(wide(), wide(), cap, &before, &order, &after)?;
            check::<AlignedLinks>(SlotList::new(cap), SlotList::new(cap), cap, &before, &order, &after)?;
            // A MultiList: its list 1 filled in bulk, as pushing one by one.
            let (mut m, mut n): (MultiList<2>, MultiList<2>) = (MultiList::new(cap), MultiList::new(cap));
            m.push_all(1, &order);
            for &s in &order {
                n.push_head(1, s);
            }
            for s in 0..cap {
                prop_assert_eq!((m.links.prev(s), m.links.next(s)), (n.links.prev(s), n.links.next(s)));
            }
            prop_assert_eq!((m.head(1), m.tail(1), m.len(1), m.len(0)), (n.head(1), n.tail(1), n.len(1), 0));
        }
    }
}
