//! The dirty lines in LBA order, for the cleaners, without a second copy of every dirty key
//! (plan-lean step 5: the B-tree of all dirty keys cost ~16 B per dirty line).
//!
//! The truth is the engine's dirty bitmap and slot keys. [`DirtyWindow`] keeps, for one
//! window of keys `[lo, hi]`, exactly the dirty keys inside it in a small B-tree: the
//! engine reports every line that becomes dirty or clean ([`DirtyWindow::dirtied`],
//! [`DirtyWindow::cleaned`]) and those inside the window are added or removed. A query
//! outside the window rebuilds it: from the index when the range asked for is short (a
//! chunk), else by one pass over the dirty bitmap keeping the smallest
//! [`DirtyKeys`]-many keys from the query on. Answers are those of a set of all dirty keys,
//! so every cleaner's order is unchanged.

use crate::index::LineIndex;
use std::collections::BTreeSet;

/// Ranges of at most this many lines are filled by index lookups instead of a pass over
/// the dirty bitmap.
const LOOKUP_LINES: u64 = 1024;

/// The positions of the set bits of a bitmap, ascending (the dirty slots of the dirty bitmap).
pub(crate) fn set_bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(w, &word)| {
        let mut m = word;
        std::iter::from_fn(move || {
            (m != 0).then(|| {
                let b = m.trailing_zeros() as usize;
                m &= m - 1;
                w * 64 + b
            })
        })
    })
}

/// A window of the dirty keys in LBA order (see the module).
#[derive(Default)]
pub(crate) struct DirtyWindow {
    /// Whether `[lo, hi]` (inclusive) is a window: `batch` holds exactly the dirty keys in it.
    valid: bool,
    lo: u64,
    hi: u64,
    batch: BTreeSet<u64>,
    /// Keys a rebuild keeps (grows with the dirty lines; never below the minimum given).
    target: usize,
}

impl DirtyWindow {
    /// Forgets the window (the dirty lines changed wholesale: restore, reset).
    pub(crate) fn clear(&mut self) {
        self.valid = false;
        self.batch = BTreeSet::new();
    }

    #[inline]
    fn inside(&self, key: u64) -> bool {
        self.valid && self.lo <= key && key <= self.hi
    }

    /// Line `key` became dirty.
    #[inline]
    pub(crate) fn dirtied(&mut self, key: u64) {
        if self.inside(key) {
            self.batch.insert(key);
            if self.batch.len() > 2 * self.target.max(1) {
                // Keep the window small: give up its top keys (everything below the last
                // one dropped is still held, so the window stays exact).
                let mut last = self.hi;
                while self.batch.len() > self.target.max(1) {
                    last = self.batch.pop_last().expect("not empty");
                }
                debug_assert!(last > self.lo, "a window of one key overflowed");
                self.hi = last - 1;
            }
        }
    }

    /// Line `key` is no longer dirty.
    #[inline]
    pub(crate) fn cleaned(&mut self, key: u64) {
        if self.inside(key) {
            self.batch.remove(&key);
        }
    }

    /// Heap bytes held.
    pub(crate) fn mem_bytes(&self) -> usize {
        crate::mem::btree_bytes(self.batch.len(), 8)
    }
}

/// The engine's dirty lines as the cleaners see them: the window plus what rebuilds it.
pub struct DirtyKeys<'a> {
    pub(crate) win: &'a mut DirtyWindow,
    pub(crate) keys: &'a crate::keys::Keys,
    pub(crate) dirty: &'a [u64],
    pub(crate) map: &'a LineIndex,
    /// Dirty lines now.
    pub(crate) count: u64,
    /// Fewest keys a rebuild keeps (at least a chunk's lines, so one rebuild covers a chunk).
    pub(crate) min_batch: usize,
}

impl DirtyKeys<'_> {
    /// The smallest dirty key `>= from` (and `< end`, if given).
    pub fn first_from(&mut self, from: u64, end: Option<u64>) -> Option<u64> {
        if end.is_some_and(|e| e <= from) {
            return None;
        }
        if !self.win.inside(from) || self.win.batch.range(from..).next().is_none() {
            let covered = self.win.inside(from)
                && (self.win.hi == u64::MAX || end.is_some_and(|e| e - 1 <= self.win.hi));
            if !covered {
                self.cover(from, end);
            }
        }
        // Keys below `from` are not needed again soon (the cursor moves up): drop them.
        if self.win.lo < from {
            while self.win.batch.first().is_some_and(|&k| k < from) {
                self.win.batch.pop_first();
            }
            self.win.lo = from;
        }
        debug_assert!(self.win.inside(from));
        let k = self.win.batch.range(from..).next().copied();
        k.filter(|&k| end.is_none_or(|e| k < e))
    }

    /// The dirty keys in `[a, b)`, ascending.
    pub fn range(&mut self, a: u64, b: u64) -> impl Iterator<Item = u64> + '_ {
        if a < b {
            let covered = self.win.inside(a) && b - 1 <= self.win.hi;
            if !covered {
                self.cover(a, Some(b));
            }
        }
        self.win.batch.range(a..b.max(a)).copied()
    }

    /// Makes the window hold `from` and, with `end`, everything up to `end` (exclusive); without,
    /// at least the smallest `target` dirty keys from `from` on.
    fn cover(&mut self, from: u64, end: Option<u64>) {
        self.win.target = self.min_batch.max((self.count / 64) as usize).max(1);
        if let Some(e) = end {
            if self.win.inside(from) {
                // Extend the window up to `e - 1`.
                let lo = self.win.hi + 1;
                self.fill(lo, e);
                self.win.hi = e - 1;
                return;
            }
            if e - from <= LOOKUP_LINES {
                self.win.batch.clear();
                self.fill(from, e);
                (self.win.lo, self.win.hi, self.win.valid) = (from, e - 1, true);
                return;
            }
        }
        self.rebuild(from, end.map_or(from, |e| e - 1));
    }

    /// Adds the dirty keys in `[a, b)` to the batch.
    fn fill(&mut self, a: u64, b: u64) {
        if b - a <= LOOKUP_LINES {
            for k in a..b {
                if let Some(s) = self.map.find(k, self.keys) {
                    if self.dirty[s as usize / 64] >> (s % 64) & 1 == 1 {
                        self.win.batch.insert(k);
                    }
                }
            }
        } else {
            let mut v = Vec::new();
            self.scan(|k| {
                if (a..b).contains(&k) {
                    v.push(k);
                }
            });
            self.win.batch.extend(v);
        }
    }

    /// Calls `f` with every dirty key (slot order).
    fn scan(&self, mut f: impl FnMut(u64)) {
        for s in set_bits(self.dirty) {
            f(self.keys.at(s));
        }
    }

    /// A new window from `from` on: the smallest `target` dirty keys `>= from`, and at least
    /// every one up to `min_hi`.
    fn rebuild(&mut self, from: u64, min_hi: u64) {
        let mut keep = self.win.target;
        let mut bound = u64::MAX;
        let mut v: Vec<u64> = Vec::with_capacity(2 * keep);
        for s in set_bits(self.dirty) {
            let k = self.keys.at(s);
            if k < from || k > bound {
                continue;
            }
            v.push(k);
            if v.len() >= 2 * keep {
                let (_, &mut kth, _) = v.select_nth_unstable(keep - 1);
                bound = kth.max(min_hi);
                v.retain(|&x| x <= bound);
                keep = keep.max(v.len());
            }
        }
        v.sort_unstable();
        if v.len() > keep {
            bound = v[keep - 1].max(min_hi);
            v.retain(|&x| x <= bound);
        }
        self.win.batch = v.into_iter().collect();
        (self.win.lo, self.win.hi, self.win.valid) = (from, bound, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots holding keys, some dirty, with an index: what the engine keeps.
    struct Lines {
        keys: crate::keys::Keys,
        dirty: Vec<u64>,
        map: LineIndex,
        free: Vec<u32>,
        count: u64,
        win: DirtyWindow,
        truth: BTreeSet<u64>,
    }

    impl Lines {
        fn new(cap: u32) -> Self {
            Lines {
                keys: crate::keys::Keys::new(cap as usize),
                dirty: vec![0; (cap as usize).div_ceil(64)],
                map: LineIndex::new(cap as usize),
                free: (0..cap).rev().collect(),
                count: 0,
                win: DirtyWindow::default(),
                truth: BTreeSet::new(),
            }
        }

        fn view(&mut self, min_batch: usize) -> DirtyKeys<'_> {
            DirtyKeys {
                win: &mut self.win,
                keys: &self.keys,
                dirty: &self.dirty,
                map: &self.map,
                count: self.count,
                min_batch,
            }
        }

        /// Caches `key` if it is not and flips its dirtiness.
        fn toggle(&mut self, key: u64) {
            let slot = match self.map.find(key, &self.keys) {
                Some(s) => s,
                None => {
                    let Some(s) = self.free.pop() else { return };
                    self.keys.set(s as usize, key);
                    self.map.insert(key, s);
                    s
                }
            };
            let (w, b) = (slot as usize / 64, 1u64 << (slot % 64));
            if self.dirty[w] & b == 0 {
                self.dirty[w] |= b;
                self.count += 1;
                self.win.dirtied(key);
                self.truth.insert(key);
            } else {
                self.dirty[w] &= !b;
                self.count -= 1;
                self.win.cleaned(key);
                self.truth.remove(&key);
            }
        }
    }

    /// Random dirtying, cleaning and queries (as LBA sweeps, ACP chunks and chunk ranges
    /// ask them) answer as a set of every dirty key does.
    #[test]
    fn answers_as_the_set_of_all_dirty_keys() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..40 {
            let space = [200, 3000, 50_000, 1 << 40][round % 4];
            let min_batch = [1, 8, 64, 1024][(round / 4) % 4];
            let mut l = Lines::new(4096);
            let mut cursor = 0;
            for _ in 0..6000 {
                match rnd(10) {
                    0..=4 => l.toggle(rnd(space)),
                    5..=6 => {
                        // An LBA sweep: from the cursor, wrapping.
                        let want = l.truth.range(cursor..).next().or(l.truth.first()).copied();
                        let mut v = l.view(min_batch);
                        let got = v.first_from(cursor, None).or_else(|| v.first_from(0, None));
                        assert_eq!(got, want, "sweep from {cursor}");
                        if let Some(k) = got {
                            cursor = k + 1;
                            l.toggle(k);
                        }
                    }
                    7 => {
                        let (a, n) = (rnd(space), 1 + rnd(2048));
                        let want = l.truth.range(a..a + n).next().copied();
                        assert_eq!(l.view(min_batch).first_from(a, Some(a + n)), want);
                    }
                    _ => {
                        let (a, n) = (rnd(space), rnd(3000));
                        let want: Vec<u64> = l.truth.range(a..a + n).copied().collect();
                        let got: Vec<u64> = l.view(min_batch).range(a, a + n).collect();
                        assert_eq!(got, want, "range {a}+{n}");
                    }
                }
                if l.win.valid {
                    let inside: Vec<u64> = l.truth.range(l.win.lo..=l.win.hi).copied().collect();
                    assert!(
                        l.win.batch.iter().copied().eq(inside),
                        "the window is exact"
                    );
                }
            }
            // Bounded: the window never holds much more than its target.
            assert!(l.win.batch.len() <= 2 * l.win.target.max(1) + 3000);
        }
    }
}
