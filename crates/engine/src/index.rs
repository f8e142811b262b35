//! The line index: line key -> slot, in 12 bytes per cached line.
//!
//! Separate chaining threaded through the slots: one `u32` chain head per bucket (as many
//! buckets as slots, load factor at most 1) and a (previous, next) `u32` pair per slot. Keys
//! themselves live in the engine's slot array, so the index stores no key: a lookup walks a
//! chain of 1.5 slots on average, comparing `keys[slot]`; an insert pushes onto the chain
//! head; a removal unlinks the slot in O(1) without walking its chain (the evicted line's
//! chain is cold in the CPU cache, so a walk is a string of dependent cache misses). There
//! are no tombstones, nothing moves or rehashes under the constant insert/evict churn of a
//! full cache, and every operation is a handful of instructions.
//!
//! History: a Robin Hood table (u64 buckets of 32-bit hash tag + slot, load 0.7) came first,
//! at 11.4 B/line; its backward-shift deletions and displacement chains cost ~190
//! instructions per miss. Singly linked chains (8 B/line) were 10 % slower than these. `hashbrown` before that: under
//! churn its tombstones made it grow to twice the size.

const NIL: u32 = u32::MAX;

/// A 64-bit mix of the key (murmur3's finaliser).
#[inline]
pub fn mix(k: u64) -> u64 {
    let mut x = k ^ (k >> 33);
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Hints the CPU to load the cache line holding `*p` (restart threads millions of lines in
/// an order unrelated to their slots: the loads of a few lines ahead overlap).
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint and never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch(p as *const i8, _MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Key -> slot map for slots `0..capacity`.
#[derive(Clone, Debug)]
pub struct LineIndex {
    heads: Vec<u32>,
    /// Per slot: (previous, next) in its chain; a chain's first slot has no previous.
    links: Vec<[u32; 2]>,
    len: usize,
}

impl LineIndex {
    /// An index for slots `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        LineIndex {
            heads: vec![NIL; capacity.max(1)],
            links: vec![[NIL; 2]; capacity],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes.
    pub fn mem_bytes(&self) -> usize {
        (self.heads.capacity() + 2 * self.links.capacity()) * 4
    }

    /// Bucket of a key: multiply-shift range reduction of its mixed high bits.
    #[inline]
    fn bucket(&self, key: u64) -> usize {
        (((mix(key) >> 32) * self.heads.len() as u64) >> 32) as usize
    }

    /// Hints the CPU to load the chain head where a lookup of `key` starts (a simulator that
    /// knows the next requests overlaps their cache misses with the current work).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let i = self.bucket(key);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is a hint; the pointer is in bounds of `heads`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch(self.heads.as_ptr().add(i) as *const i8, _MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// The second stage of [`LineIndex::prefetch`] (its bucket loaded by now): hints the CPU to
    /// load the links of the slot at the head of `key`'s chain, which an insert updates.
    #[inline]
    pub fn prefetch_chain(&self, key: u64) {
        let h = self.heads[self.bucket(key)];
        if h != NIL {
            prefetch(self.links.as_ptr().wrapping_add(h as usize));
        }
    }

    /// The slot of `key`; `keys[slot]` is the key a slot holds.
    #[inline]
    pub fn find(&self, key: u64, keys: &[u64]) -> Option<u32> {
        let mut s = self.heads[self.bucket(key)];
        while s != NIL {
            if keys[s as usize] == key {
                return Some(s);
            }
            s = self.links[s as usize][1];
        }
        None
    }

    /// Adds `key` -> `slot`; the key must not be present and the slot not in use.
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        let b = self.bucket(key);
        let h = self.heads[b];
        self.links[slot as usize] = [NIL, h];
        if h != NIL {
            self.links[h as usize][0] = slot;
        }
        self.heads[b] = slot;
        self.len += 1;
    }

    /// Removes the entry of `key`, which maps to `slot` (and must be there).
    #[inline]
    pub fn remove(&mut self, key: u64, slot: u32) -> bool {
        let [p, n] = self.links[slot as usize];
        if p == NIL {
            let b = self.bucket(key);
            if self.heads[b] != slot {
                return false;
            }
            self.heads[b] = n;
        } else {
            self.links[p as usize][1] = n;
        }
        if n != NIL {
            self.links[n as usize][0] = p;
        }
        self.links[slot as usize] = [NIL, NIL];
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_hashmap(ops in proptest::collection::vec((0u64..64, any::<bool>()), 1..400)) {
            let cap = 24;
            let mut idx = LineIndex::new(cap);
            let mut keys = vec![u64::MAX; cap];
            let mut free: Vec<u32> = (0..cap as u32).rev().collect();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (k, ins) in ops {
                if ins && !model.contains_key(&k) {
                    if let Some(s) = free.pop() {
                        keys[s as usize] = k;
                        idx.insert(k, s);
                        model.insert(k, s);
                    }
                } else if let Some(s) = model.remove(&k) {
                    prop_assert!(idx.remove(k, s));
                    keys[s as usize] = u64::MAX;
                    free.push(s);
                }
                prop_assert_eq!(idx.len(), model.len());
                for key in 0..64u64 {
                    prop_assert_eq!(idx.find(key, &keys), model.get(&key).copied());
                }
            }
        }
    }

    #[test]
    fn full_churn_stays_small() {
        let cap = 1000;
        let mut idx = LineIndex::new(cap);
        let before = idx.mem_bytes();
        let mut keys = vec![u64::MAX; cap];
        for k in 0..200_000u64 {
            let s = (k % cap as u64) as u32;
            if k >= cap as u64 {
                assert!(idx.remove(keys[s as usize], s));
            }
            keys[s as usize] = k * 7919;
            idx.insert(k * 7919, s);
        }
        assert_eq!(idx.len(), cap);
        assert_eq!(idx.mem_bytes(), before);
        assert_eq!(before, cap * 12);
        for s in 0..cap {
            assert_eq!(idx.find(keys[s], &keys), Some(s as u32));
        }
    }
}
