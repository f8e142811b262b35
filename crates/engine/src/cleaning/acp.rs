//! Densest chunk first (Open CAS's ACP): dirty lines are counted per disk chunk as they
//! become dirty or clean; cleaning takes the chunk with the most dirty lines (the lowest
//! chunk among equals) and writes it back whole, in LBA order, before choosing again. Dense
//! chunks are where a write-back costs least per line (one positioning, and a chunk rewrite
//! when `rewrite_min_runs` is met), so the dirty share falls fastest per disk second.

use super::{Cleaner, DirtyKeys};
use hashbrown::HashMap;
use std::cmp::Reverse;
use std::collections::BTreeSet;

pub struct Acp {
    shift: u32,
    /// Dirty lines per chunk (chunks with none are absent).
    counts: HashMap<u64, u32>,
    /// `(count, Reverse(chunk))`: the last element is the densest chunk, lowest first.
    order: BTreeSet<(u32, Reverse<u64>)>,
    /// The chunk being cleaned: finished before another is chosen.
    current: Option<u64>,
}

impl Acp {
    pub fn new(shift: u32) -> Self {
        Acp {
            shift,
            counts: HashMap::new(),
            order: BTreeSet::new(),
            current: None,
        }
    }

    fn bump(&mut self, key: u64, up: bool) {
        let chunk = key >> self.shift;
        let c = self.counts.entry(chunk).or_insert(0);
        let old = *c;
        debug_assert!(up || old > 0, "ACP: chunk {chunk} cleaned below zero");
        *c = if up { old + 1 } else { old - 1 };
        let new = *c;
        if new == 0 {
            self.counts.remove(&chunk);
        }
        if old > 0 {
            self.order.remove(&(old, Reverse(chunk)));
        }
        if new > 0 {
            self.order.insert((new, Reverse(chunk)));
        }
    }
}

impl Cleaner for Acp {
    fn name(&self) -> &'static str {
        "acp"
    }

    fn dirtied(&mut self, key: u64, _now: u64) {
        self.bump(key, true);
    }

    fn cleaned(&mut self, key: u64) {
        self.bump(key, false);
    }

    fn next(&mut self, dirty: &mut DirtyKeys<'_>) -> u64 {
        let chunk = match self.current.filter(|c| self.counts.contains_key(c)) {
            Some(c) => c,
            None => {
                let &(_, Reverse(c)) = self.order.last().expect("called with dirty lines");
                self.current = Some(c);
                c
            }
        };
        let first = chunk << self.shift;
        dirty
            .first_from(first, Some(first + (1 << self.shift)))
            .expect("ACP: a counted chunk holds a dirty line")
    }

    fn mem_bytes(&self) -> usize {
        crate::mem::hash_bytes(self.counts.len(), 12)
            + crate::mem::btree_bytes(self.order.len(), 16)
    }
}
