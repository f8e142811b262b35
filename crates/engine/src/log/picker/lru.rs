//! WEU-LRU: the segment least recently hit (or sealed) goes first. An intrusive list over
//! segment numbers: O(1) per hit.

use super::SegmentPicker;
use crate::log::segment::Segment;

const NIL: u32 = u32::MAX;

pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    listed: Vec<bool>,
    head: u32, // most recent
    tail: u32,
}

impl Lru {
    pub fn new(n: u32) -> Self {
        Lru {
            prev: vec![NIL; n as usize],
            next: vec![NIL; n as usize],
            listed: vec![false; n as usize],
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.listed[s as usize] = false;
    }

    fn push_front(&mut self, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NIL {
            self.tail = s;
        }
        self.listed[s as usize] = true;
    }
}

impl SegmentPicker for Lru {
    fn sealed(&mut self, seg: u32, _now: u64) {
        if self.listed[seg as usize] {
            self.unlink(seg);
        }
        self.push_front(seg);
    }
    fn hit(&mut self, seg: u32, _now: u64) {
        if self.listed[seg as usize] && self.head != seg {
            self.unlink(seg);
            self.push_front(seg);
        }
    }
    fn freed(&mut self, seg: u32) {
        if self.listed[seg as usize] {
            self.unlink(seg);
        }
    }
    fn victim(&mut self, _segs: &[Segment], _now: u64) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }
    fn mem_bytes(&self) -> usize {
        self.prev.capacity() * 8 + self.listed.capacity()
    }
}
