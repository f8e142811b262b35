//! The line index: line key -> slot, in about 11 bytes per cached line.
//!
//! Open addressing with linear probing in Robin Hood order (a miss stops as soon as it
//! passes an entry nearer its home) and backward-shift deletion (no tombstones, so the table
//! never needs rehashing under the constant insert/evict churn of a full cache). Each
//! bucket is a `u64`: the upper 32 bits hold 32 bits of the key's hash (its home bucket is
//! derived from them, and they filter out almost every non-matching probe), the lower 32 bits
//! the slot. Keys themselves live in the engine's slot array, so a lookup touches one bucket
//! run and, on a tag match, one key.
//!
//! The table is sized once for the cache capacity at a load factor of at most
//! [`MAX_LOAD`]. Why not `hashbrown`: its tombstones make a table under churn grow to twice
//! its size (items > half capacity forces a resize on rehash), which alone costs 8 bytes per
//! line more than this table, and the RAM target is 32 bytes per cached line in all.

const EMPTY: u64 = u64::MAX;

/// Highest fill of the table (cached lines / buckets).
pub const MAX_LOAD: f64 = 0.7;

/// A 64-bit mix of the key (murmur3's finaliser).
#[inline]
pub fn mix(k: u64) -> u64 {
    let mut x = k ^ (k >> 33);
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Key -> slot map for at most `capacity` entries.
#[derive(Clone, Debug)]
pub struct LineIndex {
    buckets: Vec<u64>,
    len: usize,
}

impl LineIndex {
    /// An index for up to `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        let n = ((capacity as f64 / MAX_LOAD).ceil() as usize)
            .max(capacity + 1)
            .max(4);
        LineIndex {
            buckets: vec![EMPTY; n],
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
        self.buckets.capacity() * 8
    }

    #[inline]
    fn tag(key: u64) -> u32 {
        (mix(key) >> 32) as u32
    }

    /// Home bucket of a tag: multiply-shift range reduction (monotone in the tag).
    #[inline]
    fn home(&self, tag: u32) -> usize {
        ((tag as u64 * self.buckets.len() as u64) >> 32) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    /// Hints the CPU to load the bucket where a lookup of `key` starts (a simulator that
    /// knows the next requests overlaps their cache misses with the current work).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let i = self.home(Self::tag(key));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is a hint; the pointer is in bounds of `buckets`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch(self.buckets.as_ptr().add(i) as *const i8, _MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// Probe distance of the entry in bucket `i` from its home.
    #[inline]
    fn dist(&self, b: u64, i: usize) -> usize {
        let home = self.home((b >> 32) as u32);
        if i >= home {
            i - home
        } else {
            i + self.buckets.len() - home
        }
    }

    /// The slot of `key`; `keys[slot]` is the key a slot holds.
    #[inline]
    pub fn find(&self, key: u64, keys: &[u64]) -> Option<u32> {
        let tag = Self::tag(key);
        let mut i = self.home(tag);
        let mut d = 0;
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return None;
            }
            if (b >> 32) as u32 == tag && keys[b as u32 as usize] == key {
                return Some(b as u32);
            }
            // Robin Hood order: past an entry closer to its home than we are to ours, the
            // key cannot be further on.
            if self.dist(b, i) < d {
                return None;
            }
            i = self.next(i);
            d += 1;
        }
    }

    /// Adds `key` -> `slot`; the key must not be present and the index not full.
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        debug_assert!(self.len + 1 < self.buckets.len(), "line index full");
        let mut cur = (Self::tag(key) as u64) << 32 | slot as u64;
        let mut i = self.home(Self::tag(key));
        let mut d = 0;
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                self.buckets[i] = cur;
                self.len += 1;
                return;
            }
            // Robin Hood: the entry nearer its home gives way.
            let bd = self.dist(b, i);
            if bd < d {
                self.buckets[i] = cur;
                cur = b;
                d = bd;
            }
            i = self.next(i);
            d += 1;
        }
    }

    /// Removes the entry of `key`, which maps to `slot`. Returns whether it was there.
    pub fn remove(&mut self, key: u64, slot: u32) -> bool {
        let tag = Self::tag(key);
        let want = (tag as u64) << 32 | slot as u64;
        let mut i = self.home(tag);
        let mut d = 0;
        loop {
            let b = self.buckets[i];
            if b == EMPTY || self.dist(b, i) < d {
                return false;
            }
            if b == want {
                break;
            }
            i = self.next(i);
            d += 1;
        }
        // Backward shift: entries after the hole that are not at their home move back one.
        let mut hole = i;
        loop {
            let j = self.next(hole);
            let b = self.buckets[j];
            if b == EMPTY || self.dist(b, j) == 0 {
                break;
            }
            self.buckets[hole] = b;
            hole = j;
        }
        self.buckets[hole] = EMPTY;
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
        assert!(before as f64 / cap as f64 <= 8.0 / MAX_LOAD + 0.1);
        for s in 0..cap {
            assert_eq!(idx.find(keys[s], &keys), Some(s as u32));
        }
    }
}
