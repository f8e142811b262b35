//! FIFO: segments are reclaimed in the order they were sealed.

use super::SegmentPicker;
use crate::log::segment::Segment;
use std::collections::VecDeque;

pub struct Fifo {
    queue: VecDeque<u32>,
}

impl Fifo {
    pub fn new(nsegs: u32) -> Self {
        Fifo {
            queue: VecDeque::with_capacity(nsegs as usize),
        }
    }
}

impl SegmentPicker for Fifo {
    fn sealed(&mut self, seg: u32, _now: u64) {
        self.queue.push_back(seg);
    }
    fn hit(&mut self, _seg: u32, _now: u64) {}
    fn freed(&mut self, seg: u32) {
        if self.queue.front() == Some(&seg) {
            self.queue.pop_front();
        } else {
            self.queue.retain(|&s| s != seg);
        }
    }
    fn victim(&mut self, _segs: &[Segment], _now: u64) -> Option<u32> {
        self.queue.front().copied()
    }
    fn mem_bytes(&self) -> usize {
        self.queue.capacity() * 4
    }
}
