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

/// Bucket of `key` among `n` (as [`LineIndex::bucket`]).
#[inline]
fn bucket_of(key: u64, n: usize) -> usize {
    (((mix(key) >> 32) * n as u64) >> 32) as usize
}

/// A pointer to the links, shared by the threads of [`LineIndex::build`] (each writes the
/// links of its own buckets' slots only).
#[derive(Clone, Copy)]
struct LinksPtr(*mut [u32; 2]);
// SAFETY: only used by `fill`, whose callers write disjoint elements (see `build`).
unsafe impl Send for LinksPtr {}
unsafe impl Sync for LinksPtr {}

/// Inserts, in ascending slot order, every slot `s` set in `present` whose key
/// `keys[s]` falls in buckets `first..first + heads.len()` (of `n`), as `insert` does.
///
/// # Safety
/// `links` points at the index's links (one per slot of `keys`); no other thread writes
/// the links of these buckets' slots meanwhile.
unsafe fn fill(
    heads: &mut [u32],
    first: usize,
    n: usize,
    links: LinksPtr,
    keys: &[u64],
    present: &[u64],
) {
    const AHEAD: usize = 16;
    let end = first + heads.len();
    let mut ring = std::collections::VecDeque::with_capacity(AHEAD + 1);
    let mut slots = present.iter().enumerate().flat_map(|(w, &x)| {
        let mut x = x;
        std::iter::from_fn(move || {
            (x != 0).then(|| {
                let b = x.trailing_zeros();
                x &= x - 1;
                (w * 64) as u32 + b
            })
        })
    });
    loop {
        while ring.len() < AHEAD {
            let Some(s) = slots.next() else { break };
            let b = bucket_of(keys[s as usize], n);
            if (first..end).contains(&b) {
                prefetch(&heads[b - first]);
                ring.push_back((s, b - first));
            }
        }
        if let Some(&(_, b)) = ring.get(AHEAD / 2) {
            let h = heads[b];
            if h != NIL {
                prefetch(links.0.wrapping_add(h as usize));
            }
        }
        let Some((s, b)) = ring.pop_front() else {
            break;
        };
        let h = heads[b];
        // SAFETY: `s` and `h` are slots whose keys fall in this thread's buckets.
        unsafe {
            *links.0.add(s as usize) = [NIL, h];
            if h != NIL {
                (*links.0.add(h as usize))[0] = s;
            }
        }
        heads[b] = s;
    }
}

impl LineIndex {
    /// Fills an empty index with `keys[s]` -> `s` for every slot `s` set in `present` (a
    /// bitmap; the keys distinct), on `threads` threads, each owning a range of buckets and
    /// taking its slots in ascending order: the same chains as [`LineIndex::insert`] called
    /// in slot order. A warm restart's index, built without a string of dependent misses on
    /// one core.
    pub fn build(&mut self, keys: &[u64], present: &[u64], threads: usize) {
        assert!(self.len == 0, "build into an index that holds entries");
        let n = self.heads.len();
        let threads = threads.clamp(1, 64).min(n);
        let links = LinksPtr(self.links.as_mut_ptr());
        let keys = &keys[..self.links.len().min(keys.len())];
        let present = &present[..keys.len().div_ceil(64).min(present.len())];
        if threads == 1 {
            // SAFETY: one thread, every bucket.
            unsafe { fill(&mut self.heads, 0, n, links, keys, present) };
        } else {
            std::thread::scope(|sc| {
                let mut rest: &mut [u32] = &mut self.heads;
                let mut first = 0;
                for t in 0..threads {
                    let end = n * (t + 1) / threads;
                    let (mine, tail) = std::mem::take(&mut rest).split_at_mut(end - first);
                    rest = tail;
                    let at = first;
                    // SAFETY: bucket ranges are disjoint, and a slot's links (and those of
                    // its chain's head) are written by the thread owning its key's bucket.
                    sc.spawn(move || unsafe { fill(mine, at, n, links, keys, present) });
                    first = end;
                }
            });
        }
        self.len = present.iter().map(|w| w.count_ones() as usize).sum();
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
    fn build_makes_the_chains_of_inserts_in_slot_order() {
        for (cap, threads) in [(1usize, 2usize), (100, 1), (100, 3), (5000, 2), (70_000, 4)] {
            let keys: Vec<u64> = (0..cap as u64)
                .map(|s| if s % 7 == 3 { u64::MAX } else { mix(s) >> 8 })
                .collect();
            let mut present = vec![0u64; cap.div_ceil(64)];
            for (s, &k) in keys.iter().enumerate() {
                if k != u64::MAX {
                    present[s / 64] |= 1 << (s % 64);
                }
            }
            let mut a = LineIndex::new(cap);
            for (s, &k) in keys.iter().enumerate() {
                if k != u64::MAX {
                    a.insert(k, s as u32);
                }
            }
            let mut b = LineIndex::new(cap);
            b.build(&keys, &present, threads);
            assert_eq!(a.len, b.len, "cap {cap} threads {threads}");
            assert_eq!(a.heads, b.heads, "cap {cap} threads {threads}: chain heads");
            assert_eq!(a.links, b.links, "cap {cap} threads {threads}: links");
            for (s, &k) in keys.iter().enumerate() {
                if k != u64::MAX {
                    assert_eq!(b.find(k, &keys), Some(s as u32));
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
