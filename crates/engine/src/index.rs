//! The line index: line key -> slot, in 6 bytes per cached line.
//!
//! Separate chaining threaded through the slots: one `u32` chain head per two slots (load
//! factor at most 2) and one `u32` next link per slot. Keys themselves live in the engine's
//! slot array, so the index stores no key: a lookup walks a chain of 2 slots on average,
//! comparing `keys[slot]`; an insert pushes onto the chain head; a removal walks its
//! bucket's chain (by slot id: the links only, no keys) to the slot's predecessor. There are
//! no tombstones, nothing moves or rehashes under the constant insert/evict churn of a full
//! cache, and every operation is a handful of instructions.
//!
//! History: a Robin Hood table (u64 buckets of 32-bit hash tag + slot, load 0.7) came first,
//! at 11.4 B/line; its backward-shift deletions and displacement chains cost ~190
//! instructions per miss. Then doubly linked chains at load 1 (12 B/line: O(1) unlink);
//! singly linked ones at load 1 (8 B/line) measured 10 % slower than those then, but the
//! index is a small part of a request today, and at load 2 the chains cost 6 B/line (issue
//! 16: 16 B per line all included). `hashbrown` before all that: under churn its tombstones
//! made it grow to twice the size.

use crate::keys::KeyAt;

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
    /// Chain heads, one per two slots.
    heads: Vec<u32>,
    /// Per slot: the next slot of its chain.
    next: Vec<u32>,
    len: usize,
}

/// Buckets for `capacity` slots: load factor at most [`LOAD`].
fn buckets_for(capacity: usize) -> usize {
    capacity.div_ceil(LOAD).max(1)
}

/// Slots per bucket when every slot is in use.
const LOAD: usize = 2;

/// Chain nodes [`LineIndex::find`] and [`LineIndex::remove`] walk before they count steps
/// toward the cycle check.
const UNCOUNTED: usize = 2;

impl LineIndex {
    /// An index for slots `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        LineIndex {
            heads: vec![NIL; buckets_for(capacity)],
            next: vec![NIL; capacity],
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
        (self.heads.capacity() + self.next.capacity()) * 4
    }

    /// Bucket of a key: multiply-shift range reduction of its mixed high bits.
    #[inline]
    fn bucket(&self, key: u64) -> usize {
        bucket_of(key, self.heads.len())
    }

    /// Hints the CPU to load the chain head where a lookup of `key` starts (a simulator that
    /// knows the next requests overlaps their cache misses with the current work).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch(self.heads.as_ptr().wrapping_add(self.bucket(key)));
    }

    /// The slot of `key`; `keys[slot]` is the key a slot holds.
    // Always: a generic function is not inlined into the simulator's request loop otherwise
    // (callgrind: +4 % instructions per LRU request when it was called).
    // A chain longer than the slots is a cycle (an engine invariant broken: a slot linked
    // twice): asserted, so a release build panics with the bucket named instead of spinning
    // for ever under the volume lock (a hung server serves nobody and says nothing). The
    // first [`UNCOUNTED`] nodes are walked without the count (a walk is then bounded by
    // `UNCOUNTED` + slots, still finite): most chains end there (load 2), so the count cost
    // ~0.3 % instructions per simulated LRU request instead of 1.3 % (callgrind, session 29).
    #[inline(always)]
    pub fn find<K: KeyAt + ?Sized>(&self, key: u64, keys: &K) -> Option<u32> {
        let b = self.bucket(key);
        let mut s = self.heads[b];
        for _ in 0..UNCOUNTED {
            if s == NIL {
                return None;
            }
            if keys.holds(s as usize, key) {
                return Some(s);
            }
            s = self.next[s as usize];
        }
        let mut steps = 0usize;
        while s != NIL {
            if keys.holds(s as usize, key) {
                return Some(s);
            }
            steps += 1;
            assert!(steps <= self.next.len(), "{}", cycle(b));
            s = self.next[s as usize];
        }
        None
    }

    /// Adds `key` -> `slot`; the key must not be present and the slot not in use.
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        let b = self.bucket(key);
        self.next[slot as usize] = self.heads[b];
        self.heads[b] = slot;
        self.len += 1;
    }

    /// Removes the entry of `key`, which maps to `slot`; false (and nothing changed) when
    /// `slot` is not in `key`'s chain.
    #[inline]
    pub fn remove(&mut self, key: u64, slot: u32) -> bool {
        let b = self.bucket(key);
        let n = self.next[slot as usize];
        let mut s = self.heads[b];
        if s == slot {
            self.heads[b] = n;
        } else {
            // Uncounted first nodes as in `find`: the predecessor is usually among them.
            let mut steps = 0usize;
            for _ in 0..UNCOUNTED {
                if s == NIL {
                    return false;
                }
                let after = self.next[s as usize];
                if after == slot {
                    self.next[s as usize] = n;
                    self.next[slot as usize] = NIL;
                    self.len -= 1;
                    return true;
                }
                s = after;
            }
            loop {
                if s == NIL {
                    return false;
                }
                let after = self.next[s as usize];
                if after == slot {
                    self.next[s as usize] = n;
                    break;
                }
                steps += 1;
                assert!(steps <= self.next.len(), "{}", cycle(b));
                s = after;
            }
        }
        self.next[slot as usize] = NIL;
        self.len -= 1;
        true
    }
}

/// The panic message of a chain that loops (see [`LineIndex::find`]).
#[cold]
#[inline(never)]
fn cycle(bucket: usize) -> String {
    format!("line index: the chain of bucket {bucket} is longer than the slots (a cycle: a slot linked twice, an engine invariant broken)")
}

/// Bucket of `key` among `n` (as [`LineIndex::bucket`]).
#[inline]
fn bucket_of(key: u64, n: usize) -> usize {
    (((mix(key) >> 32) * n as u64) >> 32) as usize
}

/// A pointer shared by the threads of [`LineIndex::build`], each writing its own elements.
struct Shared<T>(*mut T);
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}
// SAFETY: only used by `build` and `link_range`, whose threads write disjoint elements.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}
type LinksPtr = Shared<u32>;

impl<T> Shared<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not the field).
    fn at(self) -> *mut T {
        self.0
    }
}

/// Buckets per range of [`LineIndex::build`]: their heads (1 MiB) stay in the CPU's L2
/// cache while the range's slots are linked.
const RANGE_BUCKETS: usize = 1 << 18;

/// The present slots of bitmap words `words` (`present[words]`), ascending.
fn present_slots(present: &[u64], words: std::ops::Range<usize>) -> impl Iterator<Item = u32> + '_ {
    let first = words.start;
    present[words].iter().enumerate().flat_map(move |(w, &x)| {
        let mut x = x;
        std::iter::from_fn(move || {
            (x != 0).then(|| {
                let b = x.trailing_zeros();
                x &= x - 1;
                ((first + w) * 64) as u32 + b
            })
        })
    })
}

/// Links the slots of one bucket range: `heads` the range's chain heads (all NIL),
/// `entries` the range's slots ascending, each as `bucket_in_range << 32 | slot`, rewritten
/// in place as `next << 32 | slot` (the bucket is not needed after: no second buffer). The
/// chains are those of inserting in slot order: a slot's next is the previous slot of its
/// bucket, the head is the bucket's last slot. Every access is sequential or inside the
/// range's heads.
fn link_range(heads: &mut [u32], entries: &mut [u64]) {
    for e in entries.iter_mut() {
        let (b, s) = ((*e >> 32) as usize, *e as u32);
        *e = (heads[b] as u64) << 32 | s as u64;
        heads[b] = s;
    }
}

/// Slots per block of the last step of [`LineIndex::build`]: the block's links (256 KiB)
/// stay in the CPU cache while every range's entries in it are copied there.
const BLOCK_SLOTS: usize = 1 << 16;

impl LineIndex {
    /// Fills an empty index with `keys[s]` -> `s` for every slot `s` set in `present` (a
    /// bitmap; the keys distinct), on `threads` threads: the same chains as
    /// [`LineIndex::insert`] called in slot order. A warm restart's index (10^8 lines),
    /// built with no random access to memory (inserting in slot order makes a cache and TLB
    /// miss per line: the bucket's head): 1. and 2. the slots
    /// grouped by range of [`RANGE_BUCKETS`] buckets (a stable counting sort: ascending
    /// slots within a range); 3. each range linked with its heads in the CPU cache
    /// (`link_range`, into a buffer parallel to the groups); 4. the links copied to their
    /// slots block by block ([`BLOCK_SLOTS`]), each block taking every range's next entries.
    /// Transient memory: 8 B per line.
    pub fn build<K: KeyAt + Sync + ?Sized>(&mut self, keys: &K, present: &[u64], threads: usize) {
        self.build_in(keys, present, threads, &mut Vec::new())
    }

    /// [`LineIndex::build`] with its entries (its 8 B per line) in `scratch`
    /// where it holds that many already (a restart lends the buffer its sorts used, whose
    /// pages are in memory: 0.8 GB fewer fresh pages to fault at 10^8 lines); else `scratch`
    /// is grown. Its contents are overwritten.
    pub fn build_in<K: KeyAt + Sync + ?Sized>(
        &mut self,
        keys: &K,
        present: &[u64],
        threads: usize,
        scratch: &mut Vec<u64>,
    ) {
        assert!(self.len == 0, "build into an index that holds entries");
        let n = self.heads.len();
        let slots = self.next.len().min(keys.slot_count());
        let present = &present[..slots.div_ceil(64).min(present.len())];
        let words = present.len();
        let threads = threads.clamp(1, 64).min(words.max(1));
        let ranges = n.div_ceil(RANGE_BUCKETS);
        // Each thread's words of the bitmap (its slots), in slot order.
        let part = |t: usize| words * t / threads..words * (t + 1) / threads;
        let run = |f: &(dyn Fn(usize) + Sync)| {
            if threads == 1 {
                f(0)
            } else {
                std::thread::scope(|sc| {
                    for t in 0..threads {
                        sc.spawn(move || f(t));
                    }
                });
            }
        };
        // 1. Slots per (thread, range).
        let counts: Vec<std::sync::Mutex<Vec<usize>>> = (0..threads)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        run(&|t| {
            let mut c = vec![0usize; ranges];
            for s in present_slots(present, part(t)) {
                c[bucket_of(keys.key_at(s as usize), n) / RANGE_BUCKETS] += 1;
            }
            *counts[t].lock().unwrap() = c;
        });
        let counts: Vec<Vec<usize>> = counts
            .into_iter()
            .map(|m| m.into_inner().unwrap())
            .collect();
        // Range r's entries: starts[r]..starts[r + 1], thread t's from offs[t][r].
        let mut starts = vec![0usize; ranges + 1];
        let mut offs = vec![vec![0usize; ranges]; threads];
        let mut sum = 0;
        for r in 0..ranges {
            starts[r] = sum;
            for t in 0..threads {
                offs[t][r] = sum;
                sum += counts[t][r];
            }
        }
        starts[ranges] = sum;
        // 2. The entries grouped by range, ascending slots within each (threads in slot
        // order).
        if scratch.len() < sum {
            scratch.clear();
            scratch.resize(sum, 0);
        }
        // Every position is written below before it is read (the counts tile 0..sum).
        let entries = &mut scratch[..sum];
        let out = Shared(entries.as_mut_ptr());
        let offs: Vec<std::sync::Mutex<Vec<usize>>> =
            offs.into_iter().map(std::sync::Mutex::new).collect();
        run(&|t| {
            let mut off = offs[t].lock().unwrap();
            for s in present_slots(present, part(t)) {
                let b = bucket_of(keys.key_at(s as usize), n);
                let r = b / RANGE_BUCKETS;
                // SAFETY: `off[r]` runs over this thread's own part of range r's entries
                // (from the counts of the same slots), inside `entries`.
                unsafe { *out.at().add(off[r]) = ((b % RANGE_BUCKETS) as u64) << 32 | s as u64 };
                off[r] += 1;
            }
        });
        // 3. Each range linked by one thread (ranges dealt round-robin), each entry's next
        // link into its high half.
        {
            let heads: Vec<std::sync::Mutex<&mut [u32]>> = self
                .heads
                .chunks_mut(RANGE_BUCKETS)
                .map(std::sync::Mutex::new)
                .collect();
            let mut rest: &mut [u64] = entries;
            let groups: Vec<std::sync::Mutex<&mut [u64]>> = (0..ranges)
                .map(|r| {
                    let (mine, tail) =
                        std::mem::take(&mut rest).split_at_mut(starts[r + 1] - starts[r]);
                    rest = tail;
                    std::sync::Mutex::new(mine)
                })
                .collect();
            run(&|t| {
                for r in (t..ranges).step_by(threads) {
                    let mut h = heads[r].lock().unwrap();
                    let mut g = groups[r].lock().unwrap();
                    link_range(&mut h, &mut g);
                }
            });
        }
        // 4. The links to their slots, block by block of slots (each thread its own blocks):
        // within a block, every range's next entries (ascending slots) are copied in.
        let links: LinksPtr = Shared(self.next.as_mut_ptr());
        let cap = self.next.len();
        let (entries, starts) = (&*entries, &starts);
        run(&|t| {
            let (lo, hi) = (cap * t / threads, cap * (t + 1) / threads);
            // Each range's first entry at or after `lo`.
            let mut at: Vec<usize> = (0..ranges)
                .map(|r| {
                    let e = &entries[starts[r]..starts[r + 1]];
                    starts[r] + e.partition_point(|&x| (x as u32 as usize) < lo)
                })
                .collect();
            let mut block = lo;
            while block < hi {
                let end = (block + BLOCK_SLOTS).min(hi);
                for r in 0..ranges {
                    let (mut i, stop) = (at[r], starts[r + 1]);
                    while i < stop && ((entries[i] as u32) as usize) < end {
                        // SAFETY: the slot is in `lo..hi`, this thread's own slots, and
                        // inside the links (a slot of `keys`).
                        unsafe {
                            *links.at().add(entries[i] as u32 as usize) = (entries[i] >> 32) as u32
                        };
                        i += 1;
                    }
                    at[r] = i;
                }
                block = end;
            }
        });
        self.len = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Two keys of one bucket, the second linked to a slot already in the chain: the chain
    /// loops. A lookup of a third key of that bucket and a removal of a slot not in the
    /// chain must panic, naming the cycle, instead of walking it for ever.
    fn looped() -> (LineIndex, Vec<u64>, u64) {
        let cap = 8;
        let mut idx = LineIndex::new(cap);
        let n = idx.heads.len();
        let same: Vec<u64> = (0u64..)
            .filter(|&k| bucket_of(k, n) == bucket_of(0, n))
            .take(3)
            .collect();
        let mut keys = vec![u64::MAX; cap];
        keys[1] = same[0];
        idx.insert(same[0], 1);
        keys[2] = same[1];
        idx.insert(same[1], 2);
        // The invariant broken: slot 1 linked twice (its next now points back at itself
        // through slot 2).
        idx.insert(same[1], 1);
        (idx, keys, same[2])
    }

    #[test]
    #[should_panic(expected = "is longer than the slots (a cycle")]
    fn a_lookup_in_a_looping_chain_panics() {
        let (idx, keys, other) = looped();
        idx.find(other, &keys);
    }

    #[test]
    #[should_panic(expected = "is longer than the slots (a cycle")]
    fn a_removal_in_a_looping_chain_panics() {
        let (mut idx, _, other) = looped();
        idx.remove(other, 5);
    }

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
        for (cap, threads) in [
            (1usize, 2usize),
            (100, 1),
            (100, 3),
            (5000, 2),
            (70_000, 4),
            // Several bucket ranges, split unevenly over the threads.
            (3 * RANGE_BUCKETS + 12_345, 2),
            (3 * RANGE_BUCKETS + 12_345, 5),
        ] {
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
            assert_eq!(a.next, b.next, "cap {cap} threads {threads}: links");
            // In a lent buffer holding other values (a restart's sort buffer): the same.
            let mut c = LineIndex::new(cap);
            let mut lent: Vec<u64> = (0..cap as u64 + 99).map(|i| mix(i ^ 0x5a5a)).collect();
            let at = lent.as_ptr();
            c.build_in(&keys, &present, threads, &mut lent);
            assert_eq!(
                lent.as_ptr(),
                at,
                "cap {cap}: the lent buffer was reallocated"
            );
            assert_eq!(
                (a.len, &a.heads, &a.next),
                (c.len, &c.heads, &c.next),
                "cap {cap} threads {threads}: built in a lent buffer"
            );
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
        assert_eq!(before, cap * 6);
        for s in 0..cap {
            assert_eq!(idx.find(keys[s], &keys), Some(s as u32));
        }
    }
}
