//! The line key of every slot, in 4 bytes per slot while every key fits (issue 16 item 1).
//!
//! A line key is 64 bits (`vol << 48 | line`, see [`crate::engine::LINE_BITS`]), but a cache
//! in front of one volume of less than 2^32 lines (16 TiB of 4 KiB lines) — the live direct
//! layout, a single-volume simulation — only ever stores keys below 2^32. [`Keys`] keeps the
//! low 32 bits of each slot's key in `lo` and allocates the high words (`hi`, 4 more bytes
//! per slot) only at the first key that needs them: a volume tag, a line index >= 2^32 - 1.
//! Keys stay exact: the narrow form holds only keys `< u32::MAX` (`u32::MAX` stands for the
//! empty slot, [`EMPTY`]), the wide form the whole 64 bits; nothing is hashed or truncated.
//! Once wide, the store stays wide (its keys are rare to leave, and width changes would cost
//! a pass per change); `hi` is zero-filled, with `u32::MAX` for empty slots, when it appears.

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

/// The key of each slot (see the module).
#[derive(Clone, Debug)]
pub struct Keys {
    lo: Vec<u32>,
    /// High words, one per slot; empty while every key stored so far is `< u32::MAX`.
    hi: Vec<u32>,
}

impl Keys {
    /// `slots` empty slots, narrow.
    pub fn new(slots: usize) -> Self {
        Keys {
            lo: vec![NARROW_EMPTY; slots],
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

    /// Whether the high words are kept (some key needed them).
    pub fn is_wide(&self) -> bool {
        !self.hi.is_empty()
    }

    /// The key of slot `s` ([`EMPTY`] when none).
    #[inline(always)]
    pub fn at(&self, s: usize) -> u64 {
        let lo = self.lo[s];
        if self.hi.is_empty() {
            if lo == NARROW_EMPTY {
                EMPTY
            } else {
                u64::from(lo)
            }
        } else {
            u64::from(self.hi[s]) << 32 | u64::from(lo)
        }
    }

    /// A hint to bring slot `s`'s key into the CPU cache (a restart's policy threading reads
    /// the keys in age order, not slot order).
    #[inline]
    pub fn prefetch(&self, s: usize) {
        crate::index::prefetch(self.lo.as_ptr().wrapping_add(s));
        if !self.hi.is_empty() {
            crate::index::prefetch(self.hi.as_ptr().wrapping_add(s));
        }
    }

    /// Stores `key` ([`EMPTY`] to empty the slot) in slot `s`.
    #[inline]
    pub fn set(&mut self, s: usize, key: u64) {
        if self.hi.is_empty() {
            if key < u64::from(NARROW_EMPTY) {
                self.lo[s] = key as u32;
                return;
            }
            if key == EMPTY {
                self.lo[s] = NARROW_EMPTY;
                return;
            }
            self.widen();
        }
        self.lo[s] = key as u32;
        self.hi[s] = (key >> 32) as u32;
    }

    /// Allocates the high words: 0 for the keys held (all narrow), `u32::MAX` for the empty
    /// slots (whose low word is `u32::MAX` already: [`EMPTY`] whole).
    #[cold]
    fn widen(&mut self) {
        self.hi = self
            .lo
            .iter()
            .map(|&l| if l == NARROW_EMPTY { u32::MAX } else { 0 })
            .collect();
    }

    /// The slots as disjoint parts for filling on several threads (a restart's restore):
    /// the low words and, when wide, the high words. A part writes keys with
    /// [`KeysPart::put`]; the keys it could not store narrow come back to
    /// [`Keys::set`] after the parts are done.
    pub fn parts_mut(&mut self) -> (&mut [u32], Option<&mut [u32]>) {
        let hi = (!self.hi.is_empty()).then_some(&mut self.hi[..]);
        (&mut self.lo, hi)
    }

    /// Every slot's key, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(|s| self.at(s))
    }

    /// Heap bytes.
    pub fn heap_bytes(&self) -> usize {
        (self.lo.capacity() + self.hi.capacity()) * 4
    }
}

/// One thread's slots of [`Keys::parts_mut`] (index 0 = its first slot).
pub struct KeysPart<'a> {
    pub lo: &'a mut [u32],
    /// The high words when the store is wide already.
    pub hi: Option<&'a mut [u32]>,
}

impl KeysPart<'_> {
    /// Stores `key` (not [`EMPTY`]) at index `i` of the part; `false` when the store is
    /// narrow and the key needs the high word: the caller hands it to [`Keys::set`] once
    /// the parts are joined (the slot stays empty meanwhile).
    #[inline]
    pub fn put(&mut self, i: usize, key: u64) -> bool {
        debug_assert_ne!(key, EMPTY, "put stores lines, not empties");
        match &mut self.hi {
            Some(h) => {
                self.lo[i] = key as u32;
                h[i] = (key >> 32) as u32;
                true
            }
            None if key < u64::from(NARROW_EMPTY) => {
                self.lo[i] = key as u32;
                true
            }
            None => false,
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
        if self.hi.is_empty() {
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
        assert_eq!(k.heap_bytes(), 32);
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
                ]),
                0..60,
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
