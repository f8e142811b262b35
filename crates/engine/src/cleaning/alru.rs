//! Staleness cleaning (Open CAS's ALRU): the line dirty for longest first, and lines dirty
//! for more than `age` requests (the engine's logical clock) are due even below the high
//! watermark, so an idle cache drains and no write stays in the cache for ever. "Dirty
//! since" is when the line last went from clean to dirty (rewriting a dirty line does not
//! make it younger: the age bounds how long any write waits for the disk).

use super::{Cleaner, DirtyKeys};
use hashbrown::HashMap;
use std::collections::BTreeSet;

pub struct Alru {
    age: u64,
    since: HashMap<u64, u64>,
    /// `(dirty since, key)`, oldest first.
    order: BTreeSet<(u64, u64)>,
}

impl Alru {
    pub fn new(age: u64) -> Self {
        Alru {
            age,
            since: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl Cleaner for Alru {
    fn name(&self) -> &'static str {
        "alru"
    }

    fn dirtied(&mut self, key: u64, now: u64) {
        let old = self.since.insert(key, now);
        debug_assert!(old.is_none(), "ALRU: line {key:#x} dirtied twice");
        self.order.insert((now, key));
    }

    fn cleaned(&mut self, key: u64) {
        if let Some(t) = self.since.remove(&key) {
            self.order.remove(&(t, key));
        }
    }

    fn next(&mut self, _dirty: &mut DirtyKeys<'_>) -> u64 {
        self.order.first().expect("called with dirty lines").1
    }

    fn due(&self, now: u64, limit: u64) -> u64 {
        self.order
            .iter()
            .take(limit as usize)
            .take_while(|&&(t, _)| now.saturating_sub(t) > self.age)
            .count() as u64
    }

    fn mem_bytes(&self) -> usize {
        crate::mem::hash_bytes(self.since.len(), 16) + crate::mem::btree_bytes(self.order.len(), 16)
    }
}
