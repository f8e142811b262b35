//! The (valid, dirty) sector masks of the lines that are not whole (see `Engine::whole`): a
//! side map, sized for the masks a line can have. Lines of at most 16 sectors (4 KiB lines
//! of 512 B sectors, the default) pack both masks in one `u32`: an entry is 8 bytes instead
//! of 24 (with the slot), so a partly valid or dirty line costs ~9 B of table instead of
//! ~25 (issue 16 item 1).

use crate::policy::Slot;
use hashbrown::HashMap;

#[derive(Clone, Debug)]
pub(super) enum PartMasks {
    /// Up to 16 sectors per line: `valid | dirty << 16`.
    Packed(HashMap<Slot, u32>),
    /// More sectors per line: the masks as they are.
    Wide(HashMap<Slot, (u64, u64)>),
}

impl PartMasks {
    /// A side map for lines of `2^spl_shift` sectors.
    pub(super) fn new(spl_shift: u32) -> Self {
        if spl_shift <= 4 {
            PartMasks::Packed(HashMap::new())
        } else {
            PartMasks::Wide(HashMap::new())
        }
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        match self {
            PartMasks::Packed(m) => m.is_empty(),
            PartMasks::Wide(m) => m.is_empty(),
        }
    }

    #[inline]
    pub(super) fn get(&self, slot: Slot) -> Option<(u64, u64)> {
        match self {
            PartMasks::Packed(m) => m
                .get(&slot)
                .map(|&p| (u64::from(p & 0xffff), u64::from(p >> 16))),
            PartMasks::Wide(m) => m.get(&slot).copied(),
        }
    }

    #[inline]
    pub(super) fn insert(&mut self, slot: Slot, v: u64, d: u64) {
        match self {
            PartMasks::Packed(m) => {
                assert!(
                    v <= 0xffff && d <= 0xffff,
                    "slot {slot}: masks {v:#x}/{d:#x} wider than 16 sectors"
                );
                m.insert(slot, v as u32 | (d as u32) << 16);
            }
            PartMasks::Wide(m) => {
                m.insert(slot, (v, d));
            }
        }
    }

    /// Drops `slot`'s masks, if listed. An empty map (every line whole: the simulator's
    /// whole-line runs) returns at once: `Engine::store_masks` calls this on every line
    /// placed, and hashing a slot cost ~15 instructions per miss (callgrind, session 29).
    #[inline]
    pub(super) fn remove(&mut self, slot: Slot) {
        if self.is_empty() {
            return;
        }
        match self {
            PartMasks::Packed(m) => {
                m.remove(&slot);
            }
            PartMasks::Wide(m) => {
                m.remove(&slot);
            }
        }
    }

    /// Room for `n` more entries.
    pub(super) fn reserve(&mut self, n: usize) {
        match self {
            PartMasks::Packed(m) => m.reserve(n),
            PartMasks::Wide(m) => m.reserve(n),
        }
    }

    /// Inserts every (slot, (valid, dirty)) of `it`, as [`PartMasks::insert`] does.
    pub(super) fn extend(&mut self, it: impl IntoIterator<Item = (Slot, (u64, u64))>) {
        for (slot, (v, d)) in it {
            self.insert(slot, v, d);
        }
    }

    /// Heap bytes, by length (see `Engine::index_bytes`).
    pub(super) fn heap_bytes(&self) -> usize {
        use crate::mem::hash_bytes;
        match self {
            PartMasks::Packed(m) => hash_bytes(m.len(), 4 + 4),
            PartMasks::Wide(m) => hash_bytes(m.len(), 4 + 4 + 16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_masks_read_back_and_cost_a_third() {
        let mut p = PartMasks::new(3);
        let mut w = PartMasks::new(6);
        for s in 0..1000u32 {
            let (v, d) = (u64::from(s % 255) + 1, u64::from(s % 7));
            p.insert(s, v, d & v);
            w.insert(s, v, d & v);
        }
        for s in 0..1000u32 {
            assert_eq!(p.get(s), w.get(s));
        }
        // 16 sectors: both masks at their top bit.
        let mut q = PartMasks::new(4);
        q.insert(9, 0x8001, 0x8000);
        assert_eq!(q.get(9), Some((0x8001, 0x8000)));
        q.remove(9);
        assert_eq!(q.get(9), None);
        assert!(q.is_empty());
        assert!(p.heap_bytes() * 2 < w.heap_bytes());
    }
}
