//! A bounded FIFO/LRU list of line keys (no slots): the history of evicted lines that ARC
//! and S3-FIFO consult. 28 bytes per entry: the key, its place in the order, and the same
//! chained index the engine uses for cached lines (deterministic, no tombstones).

use super::{LinkStore, PackedLinks, SlotList};
use crate::index::LineIndex;

/// Bounded list of keys: a key arena threaded on a [`SlotList`] (newest at the head).
#[derive(Clone, Debug)]
pub struct GhostList<L: LinkStore = PackedLinks> {
    keys: Vec<u64>,
    order: SlotList<L>,
    free: Vec<u32>,
    map: LineIndex,
    cap: usize,
}

impl<L: LinkStore> GhostList<L> {
    /// A list that keeps at most `cap` keys (the oldest is dropped beyond that).
    pub fn new(cap: usize) -> Self {
        GhostList {
            keys: Vec::new(),
            order: SlotList::new(cap as u32),
            free: Vec::new(),
            map: LineIndex::new(cap),
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub fn contains(&self, key: u64) -> bool {
        self.map.find(key, &self.keys).is_some()
    }

    /// Adds `key` as the newest entry (dropping the oldest when full).
    pub fn push(&mut self, key: u64) {
        if self.cap == 0 {
            return;
        }
        self.remove(key);
        if self.map.len() >= self.cap {
            self.pop_oldest();
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.keys[i as usize] = key;
                i
            }
            None => {
                self.keys.push(key);
                (self.keys.len() - 1) as u32
            }
        };
        self.order.push_head(i);
        self.map.insert(key, i);
    }

    /// Removes `key`; returns whether it was there.
    pub fn remove(&mut self, key: u64) -> bool {
        match self.map.find(key, &self.keys) {
            Some(i) => {
                self.map.remove(key, i);
                self.order.unlink(i);
                self.free.push(i);
                true
            }
            None => false,
        }
    }

    /// Drops and returns the oldest key.
    pub fn pop_oldest(&mut self) -> Option<u64> {
        let i = self.order.pop_tail()?;
        let k = self.keys[i as usize];
        self.map.remove(k, i);
        self.free.push(i);
        Some(k)
    }

    pub fn mem_bytes(&self) -> usize {
        self.keys.capacity() * 8
            + self.order.mem_bytes()
            + self.free.capacity() * 4
            + self.map.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_fifo_with_removal() {
        let mut g: GhostList = GhostList::new(3);
        for k in 1..=4 {
            g.push(k);
        }
        assert!(!g.contains(1));
        assert_eq!(g.len(), 3);
        assert!(g.remove(3));
        assert_eq!(g.pop_oldest(), Some(2));
        assert_eq!(g.pop_oldest(), Some(4));
        assert_eq!(g.pop_oldest(), None);
        g.push(9);
        assert!(g.contains(9));
    }
}
