//! The line key of every slot, in 4 bytes per slot while every key fits (issue 16 item 1).
//!
//! A line key is 64 bits (`vol << 48 | line`, see [`crate::engine::LINE_BITS`]), but a cache
//! in front of one volume of less than 2^32 lines (16 TiB of 4 KiB lines) — the live direct
//! layout, a single-volume simulation — only ever stores keys below 2^32. [`Keys`] keeps the
//! low 32 bits of each slot's key in `lo` and allocates the high words (`hi`, 4 more bytes
//! per slot) only at the first key that needs them: a volume tag, a line index >= 2^32 - 1.
//! Keys stay exact: the narrow form holds only keys `< u32::MAX` (`u32::MAX` stands for the
//! empty slot, [`EMPTY`]), the wider forms the whole 64 bits; nothing is hashed or truncated.
//! High words come **coded** first: one byte per slot indexing a table of the distinct high
//! words (a cache serving a few volumes has one per volume: 5 B per slot, not 8), and a high
//! word per slot only once more than 256 distinct ones were needed. A store never narrows
//! again (its keys are rare to leave, and width changes would cost a pass per change).

use crate::engine::EMPTY;

/// Read access to a slot array's keys, for the structures that keep slots and compare keys
/// only on a match (the line index): the engine's [`Keys`], or a plain `[u64]`.
pub trait KeyAt {
    /// The key slot `s` holds ([`EMPTY`] when none).
    fn key_at(&self, s: usize) -> u64;
    /// Slots.
    fn slot_count(&self) -> usize;
    /// Whether slot `s`, which holds a line, holds `key` (the index's comparison on its
    /// chains, which hold only slots holding lines).
    #[inline]
    fn holds(&self, s: usize, key: u64) -> bool {
        self.key_at(s) == key
    }
}

impl KeyAt for [u64] {
    #[inline]
    fn key_at(&self, s: usize) -> u64 {
        self[s]
    }
    fn slot_count(&self) -> usize {
        self.len()
    }
}

impl KeyAt for Vec<u64> {
    #[inline]
    fn key_at(&self, s: usize) -> u64 {
        self[s]
    }
    fn slot_count(&self) -> usize {
        self.len()
    }
}

/// Narrow keys: the low word alone is the key below this; this value is the empty slot.
const NARROW_EMPTY: u32 = u32::MAX;
/// Distinct high words a coded store holds before it widens to a high word per slot.
const MAX_CODES: usize = 256;

/// How a [`Keys`] keeps the high words (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// No high words: every key held is `< u32::MAX`.
    Narrow,
    /// One byte per slot indexing `table`, the distinct high words seen (a cache serving a
    /// few volumes: each volume is one high word).
    Coded,
    /// A high word per slot.
    Wide,
}

/// The key of each slot (see the module).
#[derive(Clone, Debug)]
pub struct Keys {
    lo: Vec<u32>,
    width: Width,
    /// [`Width::Coded`]: per slot, the index in `table` of its high word.
    code: Vec<u8>,
    /// [`Width::Coded`]: the high words in use or used before (`table[0] = 0`, `table[1] =
    /// u32::MAX`, the empty slot's), at most [`MAX_CODES`].
    table: Vec<u32>,
    /// [`Width::Wide`]: the high words, one per slot.
    hi: Vec<u32>,
}

impl Keys {
    /// `slots` empty slots, narrow.
    pub fn new(slots: usize) -> Self {
        Keys {
            lo: vec![NARROW_EMPTY; slots],
            width: Width::Narrow,
            code: Vec::new(),
            table: Vec::new(),
            hi: Vec::new(),
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.lo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lo.is_empty()
    }

    /// Whether high words are kept (some key needed them), coded or whole.
    pub fn is_wide(&self) -> bool {
        self.width != Width::Narrow
    }

    /// The key of slot `s` ([`EMPTY`] when none).
    #[inline(always)]
    pub fn at(&self, s: usize) -> u64 {
        let lo = self.lo[s];
        if self.width == Width::Narrow {
            if lo == NARROW_EMPTY {
                EMPTY
            } else {
                u64::from(lo)
            }
        } else {
            self.high_at(s) | u64::from(lo)
        }
    }

    /// Slot `s`'s high word, shifted in place (a coded or wide store).
    #[inline]
    fn high_at(&self, s: usize) -> u64 {
        let h = if self.width == Width::Coded {
            self.table[self.code[s] as usize]
        } else {
            self.hi[s]
        };
        u64::from(h) << 32
    }

    /// A hint to bring slot `s`'s key into the CPU cache (a restart's policy threading reads
    /// the keys in age order, not slot order).
    #[inline]
    pub fn prefetch(&self, s: usize) {
        crate::index::prefetch(self.lo.as_ptr().wrapping_add(s));
        match self.width {
            Width::Narrow => {}
            Width::Coded => crate::index::prefetch(self.code.as_ptr().wrapping_add(s)),
            Width::Wide => crate::index::prefetch(self.hi.as_ptr().wrapping_add(s)),
        }
    }

    /// Stores `key` ([`EMPTY`] to empty the slot) in slot `s`.
    #[inline]
    pub fn set(&mut self, s: usize, key: u64) {
        if self.width == Width::Narrow {
            if key < u64::from(NARROW_EMPTY) {
                self.lo[s] = key as u32;
                return;
            }
            if key == EMPTY {
                self.lo[s] = NARROW_EMPTY;
                return;
            }
        }
        self.set_other(s, key);
    }

    /// [`Keys::set`] of what the narrow fast path does not store.
    #[inline(never)]
    fn set_other(&mut self, s: usize, key: u64) {
        let high = (key >> 32) as u32;
        match self.width {
            Width::Narrow => {
                if key == EMPTY {
                    self.lo[s] = NARROW_EMPTY;
                    return;
                }
                self.code_high_words();
                self.set_other(s, key);
            }
            Width::Coded => match self.code_of(high) {
                Some(c) => {
                    self.lo[s] = key as u32;
                    self.code[s] = c;
                }
                None => {
                    self.widen_high_words();
                    self.set_other(s, key);
                }
            },
            Width::Wide => {
                self.lo[s] = key as u32;
                self.hi[s] = high;
            }
        }
    }

    /// The code of high word `high`, added to the table when it has room.
    #[inline]
    fn code_of(&mut self, high: u32) -> Option<u8> {
        if let Some(c) = self.table.iter().position(|&h| h == high) {
            return Some(c as u8);
        }
        (self.table.len() < MAX_CODES).then(|| {
            self.table.push(high);
            (self.table.len() - 1) as u8
        })
    }

    /// Narrow to coded: code 0 (high word 0) for the keys held, 1 (`u32::MAX`) for the
    /// empty slots (whose low word is `u32::MAX` already: [`EMPTY`] whole).
    #[cold]
    fn code_high_words(&mut self) {
        debug_assert_eq!(self.width, Width::Narrow);
        self.table = vec![0, u32::MAX];
        self.code = self
            .lo
            .iter()
            .map(|&l| u8::from(l == NARROW_EMPTY))
            .collect();
        self.width = Width::Coded;
    }

    /// Coded to a high word per slot (a key with a high word beyond the table's room).
    #[cold]
    fn widen_high_words(&mut self) {
        debug_assert_eq!(self.width, Width::Coded);
        self.hi = self.code.iter().map(|&c| self.table[c as usize]).collect();
        self.code = Vec::new();
        self.table = Vec::new();
        self.width = Width::Wide;
    }

    /// The slots as disjoint parts for filling on several threads (a restart's restore).
    /// A part writes keys with [`KeysPart::put`]; the keys it could not store come back to
    /// [`Keys::set`] after the parts are done.
    pub fn parts_mut(&mut self) -> (&mut [u32], PartHigh<'_>) {
        let high = match self.width {
            Width::Narrow => PartHigh::Narrow,
            Width::Coded => PartHigh::Coded(&mut self.code, &self.table),
            Width::Wide => PartHigh::Wide(&mut self.hi),
        };
        (&mut self.lo, high)
    }

    /// Every slot's key, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(|s| self.at(s))
    }

    /// Heap bytes.
    pub fn heap_bytes(&self) -> usize {
        (self.lo.capacity() + self.hi.capacity() + self.table.capacity()) * 4 + self.code.capacity()
    }
}

/// The high words of a [`Keys`] as [`Keys::parts_mut`] hands them out: none, codes (with
/// the table, read only: a part cannot add a code), or whole.
pub enum PartHigh<'a> {
    Narrow,
    Coded(&'a mut [u8], &'a [u32]),
    Wide(&'a mut [u32]),
}

impl<'a> PartHigh<'a> {
    /// Splits off the first `n` slots' high words (`self` keeps the rest).
    pub fn split_off_front(&mut self, n: usize) -> PartHigh<'a> {
        match std::mem::replace(self, PartHigh::Narrow) {
            PartHigh::Narrow => PartHigh::Narrow,
            PartHigh::Coded(c, t) => {
                let (a, b) = c.split_at_mut(n);
                *self = PartHigh::Coded(b, t);
                PartHigh::Coded(a, t)
            }
            PartHigh::Wide(h) => {
                let (a, b) = h.split_at_mut(n);
                *self = PartHigh::Wide(b);
                PartHigh::Wide(a)
            }
        }
    }
}

/// One thread's slots of [`Keys::parts_mut`] (index 0 = its first slot).
pub struct KeysPart<'a> {
    pub lo: &'a mut [u32],
    /// The high words as the store keeps them when the parts are made.
    pub hi: PartHigh<'a>,
}

impl KeysPart<'_> {
    /// Stores `key` (not [`EMPTY`]) at index `i` of the part; `false` when the store cannot
    /// hold it as it is (narrow, or coded without that high word): the caller hands it to
    /// [`Keys::set`] once the parts are joined (the slot stays empty meanwhile).
    #[inline]
    pub fn put(&mut self, i: usize, key: u64) -> bool {
        debug_assert_ne!(key, EMPTY, "put stores lines, not empties");
        match &mut self.hi {
            PartHigh::Wide(h) => {
                self.lo[i] = key as u32;
                h[i] = (key >> 32) as u32;
                true
            }
            PartHigh::Coded(c, table) => {
                match table.iter().position(|&h| h == (key >> 32) as u32) {
                    Some(code) => {
                        self.lo[i] = key as u32;
                        c[i] = code as u8;
                        true
                    }
                    None => false,
                }
            }
            PartHigh::Narrow if key < u64::from(NARROW_EMPTY) => {
                self.lo[i] = key as u32;
                true
            }
            PartHigh::Narrow => false,
        }
    }
}

impl KeyAt for Keys {
    #[inline]
    fn key_at(&self, s: usize) -> u64 {
        self.at(s)
    }
    /// Narrow, a slot holding a line has a low word below `u32::MAX`, the whole key: one
    /// compare, no test for the empty mark.
    #[inline(always)]
    fn holds(&self, s: usize, key: u64) -> bool {
        if self.width == Width::Narrow {
            debug_assert_ne!(self.lo[s], NARROW_EMPTY, "slot {s} is on a chain but empty");
            u64::from(self.lo[s]) == key
        } else {
            self.at(s) == key
        }
    }
    fn slot_count(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn narrow_until_a_key_needs_the_high_word() {
        let mut k = Keys::new(4);
        assert_eq!(k.heap_bytes(), 16, "4 B per slot while narrow");
        k.set(0, 7);
        k.set(1, u64::from(u32::MAX) - 1);
        assert!(!k.is_wide());
        assert_eq!(
            (k.at(0), k.at(1), k.at(2)),
            (7, u64::from(u32::MAX) - 1, EMPTY)
        );
        // u32::MAX itself is the narrow form's empty mark: a real key of that value widens.
        k.set(2, u64::from(u32::MAX));
        assert!(k.is_wide());
        assert_eq!(k.at(2), u64::from(u32::MAX));
        assert_eq!(
            (k.at(0), k.at(1), k.at(3)),
            (7, u64::from(u32::MAX) - 1, EMPTY)
        );
        let tag = 3u64 << 48 | 7;
        k.set(3, tag);
        assert_eq!(
            (k.at(0), k.at(3)),
            (7, tag),
            "same low word, different keys"
        );
        k.set(3, EMPTY);
        assert_eq!(k.at(3), EMPTY);
        // Coded: 4 B of low words and 1 B of code per slot, and the table (0, MAX, 3 << 16).
        assert_eq!(k.width, Width::Coded);
        assert_eq!(k.heap_bytes(), 16 + 4 + 4 * k.table.capacity());
    }

    /// More distinct high words than a code holds: the store widens to a high word per
    /// slot, every key kept.
    #[test]
    fn coded_until_the_table_is_full_then_wide() {
        let n = MAX_CODES + 10;
        let mut k = Keys::new(n);
        let key = |i: usize| (i as u64) << 32 | (i as u64 * 7);
        for i in 0..n {
            k.set(i, key(i));
            // Key 0 is narrow; the table holds 0, MAX and high words 1..=254.
            let want = match i {
                0 => Width::Narrow,
                1..=254 => Width::Coded,
                _ => Width::Wide,
            };
            assert_eq!(k.width, want, "after {} distinct high words", i + 1);
        }
        assert!(k.iter().enumerate().all(|(i, x)| x == key(i)));
        assert_eq!(k.heap_bytes(), n * 8);
    }

    /// A restore's parts store what the store's width holds and hand back the rest.
    #[test]
    fn parts_put_what_their_width_holds() {
        let mut k = Keys::new(8);
        k.set(7, 2u64 << 48 | 9); // coded: table 0, MAX, 2 << 16
        let (lo, mut high) = k.parts_mut();
        let front = high.split_off_front(4);
        let (a, b) = lo.split_at_mut(4);
        let mut p0 = KeysPart { lo: a, hi: front };
        let mut p1 = KeysPart { lo: b, hi: high };
        assert!(p0.put(0, 5), "high word 0 is always coded");
        assert!(p0.put(1, 2u64 << 48 | 5), "a high word in the table");
        assert!(!p1.put(0, 3u64 << 48 | 5), "a high word not in the table");
        assert!(p1.put(1, u64::from(u32::MAX) - 1));
        assert_eq!(k.at(0), 5);
        assert_eq!(k.at(1), 2u64 << 48 | 5);
        assert_eq!(k.at(4), EMPTY, "a key handed back leaves its slot empty");
        assert_eq!(k.at(5), u64::from(u32::MAX) - 1);
        assert_eq!(k.at(7), 2u64 << 48 | 9);
    }

    proptest! {
        /// Any sequence of stores reads back exactly as a `Vec<u64>` of the same stores.
        #[test]
        fn reads_back_what_a_u64_array_holds(
            ops in proptest::collection::vec(
                (0usize..16, prop_oneof![
                    0u64..100,
                    Just(u64::from(u32::MAX) - 1),
                    Just(u64::from(u32::MAX)),
                    (0u64..4).prop_map(|v| v << 48 | 5),
                    Just(1u64 << 32 | 5),
                    Just(EMPTY),
                    // Enough distinct high words to fill the code table now and then.
                    (0u64..400).prop_map(|v| v << 32 | 5),
                ]),
                0..600,
            )
        ) {
            let mut k = Keys::new(16);
            let mut model = vec![EMPTY; 16];
            for (s, key) in ops {
                k.set(s, key);
                model[s] = key;
                prop_assert_eq!(k.iter().collect::<Vec<_>>(), model.clone());
            }
        }
    }
}
