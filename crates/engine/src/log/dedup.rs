//! The fingerprint index: content fingerprint -> stored extent, bounded to a share of the
//! cache's extent slots (the fingerprint-index ratio) with LRU replacement, as in Nitro.
//!
//! Entries remember the generation of the segment they point into; a lookup whose segment
//! has since been reclaimed (generation moved on) drops the entry and reports a miss.

use hashbrown::HashMap;

const NIL: u32 = u32::MAX;

/// Where an extent is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub seg: u32,
    pub gen: u32,
    pub off: u32,
    pub len: u32,
}

#[derive(Clone, Copy)]
struct Node {
    fp: u64,
    loc: Loc,
    prev: u32,
    next: u32,
}

/// Bounded LRU map from fingerprint to location.
pub struct FpIndex {
    map: HashMap<u64, u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: u32, // most recent
    tail: u32,
    cap: usize,
    /// Entries dropped because their segment was reclaimed (found on lookup or on reclaim).
    pub stale_dropped: u64,
    /// Entries pushed out by the LRU bound.
    pub lru_evictions: u64,
}

impl FpIndex {
    /// An index of at most `cap` entries (0 disables it).
    pub fn new(cap: usize) -> Self {
        FpIndex {
            map: HashMap::with_capacity(cap),
            nodes: Vec::with_capacity(cap),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            cap,
            stale_dropped: 0,
            lru_evictions: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn drop_node(&mut self, i: u32) {
        self.unlink(i);
        self.map.remove(&self.nodes[i as usize].fp);
        self.free.push(i);
    }

    /// The location of `fp` if indexed and still current (`gen_of(seg)` is the segment's
    /// generation now); a hit becomes most recent, a stale entry is dropped.
    pub fn get(&mut self, fp: u64, gen_of: impl Fn(u32) -> u32) -> Option<Loc> {
        let &i = self.map.get(&fp)?;
        let loc = self.nodes[i as usize].loc;
        if gen_of(loc.seg) != loc.gen {
            self.drop_node(i);
            self.stale_dropped += 1;
            return None;
        }
        self.unlink(i);
        self.push_front(i);
        Some(loc)
    }

    /// Indexes `fp` at `loc` (replacing an older location), evicting the least recent entry
    /// when full.
    pub fn insert(&mut self, fp: u64, loc: Loc) {
        if self.cap == 0 {
            return;
        }
        if let Some(&i) = self.map.get(&fp) {
            self.nodes[i as usize].loc = loc;
            self.unlink(i);
            self.push_front(i);
            return;
        }
        if self.map.len() >= self.cap {
            let t = self.tail;
            self.drop_node(t);
            self.lru_evictions += 1;
        }
        let node = Node {
            fp,
            loc,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.map.insert(fp, i);
        self.push_front(i);
    }

    /// The location of `fp` without touching the LRU order or checking its generation.
    pub fn peek(&self, fp: u64) -> Option<Loc> {
        self.map.get(&fp).map(|&i| self.nodes[i as usize].loc)
    }

    /// Drops `fp` wherever it points.
    pub fn remove(&mut self, fp: u64) {
        if let Some(&i) = self.map.get(&fp) {
            self.drop_node(i);
        }
    }

    /// Drops `fp` if it points into generation `gen` of `seg` (the segment is being reclaimed).
    pub fn remove_if(&mut self, fp: u64, seg: u32, gen: u32) {
        if let Some(&i) = self.map.get(&fp) {
            let l = self.nodes[i as usize].loc;
            if l.seg == seg && l.gen == gen {
                self.drop_node(i);
                self.stale_dropped += 1;
            }
        }
    }

    /// Heap bytes at full capacity, per entry: a node (fingerprint, location, LRU links) plus
    /// a hash-map slot (key, node index, control byte) at hashbrown's 7/8 load.
    pub fn bytes_per_entry() -> f64 {
        std::mem::size_of::<Node>() as f64
            + (std::mem::size_of::<(u64, u32)>() as f64 + 1.0) * 8.0 / 7.0
    }

    /// Heap bytes in use now.
    pub fn mem_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.map.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.free.capacity() * 4
    }

    /// Checks the list against the map (tests).
    pub fn check(&self) -> Result<(), String> {
        let mut n = 0;
        let mut i = self.head;
        let mut prev = NIL;
        while i != NIL {
            let node = &self.nodes[i as usize];
            if node.prev != prev {
                return Err("fingerprint LRU list broken".into());
            }
            if self.map.get(&node.fp) != Some(&i) {
                return Err("fingerprint list entry missing from map".into());
            }
            n += 1;
            prev = i;
            i = node.next;
        }
        if n != self.map.len() || n > self.cap {
            return Err(format!(
                "fingerprint index: {n} listed, {} mapped, cap {}",
                self.map.len(),
                self.cap
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(seg: u32, gen: u32) -> Loc {
        Loc {
            seg,
            gen,
            off: 0,
            len: 4096,
        }
    }

    #[test]
    fn lru_bound_and_generations() {
        let mut ix = FpIndex::new(2);
        ix.insert(1, loc(0, 0));
        ix.insert(2, loc(1, 0));
        assert!(ix.get(1, |_| 0).is_some()); // 1 most recent
        ix.insert(3, loc(2, 0)); // evicts 2
        assert_eq!(ix.lru_evictions, 1);
        assert!(ix.get(2, |_| 0).is_none());
        assert!(ix.get(1, |_| 0).is_some());
        // segment 0 reclaimed: generation 1 now
        assert!(ix.get(1, |s| u32::from(s == 0)).is_none());
        assert_eq!(ix.stale_dropped, 1);
        assert_eq!(ix.len(), 1);
        ix.check().unwrap();
        let mut off = FpIndex::new(0);
        off.insert(9, loc(0, 0));
        assert!(off.is_empty());
    }
}
