//! An intrusive doubly-linked list over slots: 8 bytes per slot, O(1) everything.
//! Shared by the list-based policies (LRU, FIFO, LIFO, MRU, SLRU, ARC, S3-FIFO).

use super::Slot;

const NIL: u32 = u32::MAX;

/// Doubly-linked list of slots with links stored in flat vectors. Each list owns its links, so
/// a policy with several lists (SLRU, ARC, S3-FIFO) pays 8 bytes per slot per list and can ask
/// any of them whether it holds a slot ([`SlotList::contains`]).
#[derive(Clone, Debug)]
pub struct SlotList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: u32,
}

impl SlotList {
    pub fn new(capacity: u32) -> Self {
        SlotList {
            prev: vec![NIL; capacity as usize],
            next: vec![NIL; capacity as usize],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `slot` is in this list.
    pub fn contains(&self, slot: Slot) -> bool {
        let s = slot as usize;
        self.prev[s] != NIL || self.head == slot
    }

    /// Most recently pushed end.
    pub fn head(&self) -> Option<Slot> {
        (self.head != NIL).then_some(self.head)
    }

    /// Oldest end.
    pub fn tail(&self) -> Option<Slot> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Hints the CPU to load the links of `slot` (a bulk restore threads slots in an order
    /// unrelated to their positions).
    #[inline]
    pub fn prefetch(&self, slot: Slot) {
        crate::index::prefetch(self.prev.as_ptr().wrapping_add(slot as usize));
        crate::index::prefetch(self.next.as_ptr().wrapping_add(slot as usize));
    }

    /// Inserts `slot` at the head.
    #[inline]
    pub fn push_head(&mut self, slot: Slot) {
        debug_assert!(!self.contains(slot), "slot {slot} already listed");
        let s = slot as usize;
        self.prev[s] = NIL;
        self.next[s] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    /// Unlinks `slot` (which must be in the list).
    #[inline]
    pub fn unlink(&mut self, slot: Slot) {
        debug_assert!(self.contains(slot), "slot {slot} not listed");
        let s = slot as usize;
        let (p, n) = (self.prev[s], self.next[s]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        self.len -= 1;
    }

    /// Moves `slot` (in the list) to the head.
    #[inline]
    pub fn move_to_head(&mut self, slot: Slot) {
        if self.head != slot {
            self.unlink(slot);
            self.push_head(slot);
        }
    }

    /// Slots from the tail (oldest) towards the head.
    pub fn iter_from_tail(&self) -> impl Iterator<Item = Slot> + '_ {
        let mut at = self.tail;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let s = at;
            at = self.prev[s as usize];
            Some(s)
        })
    }

    /// Removes and returns the tail.
    pub fn pop_tail(&mut self) -> Option<Slot> {
        let t = self.tail()?;
        self.unlink(t);
        Some(t)
    }

    /// Heap bytes.
    pub fn mem_bytes(&self) -> usize {
        (self.prev.capacity() + self.next.capacity()) * 4
    }
}
