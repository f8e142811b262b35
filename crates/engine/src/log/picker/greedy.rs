//! Greedy: the sealed segment with the fewest live bytes (ties: lowest number). Scans the
//! segments, which is cheap at WEU sizes (a 1 TiB cache has 512 Ki 2 MiB segments).

use super::{sealed, SegmentPicker};
use crate::log::segment::Segment;

pub struct Greedy;

impl SegmentPicker for Greedy {
    fn sealed(&mut self, _seg: u32, _now: u64) {}
    fn hit(&mut self, _seg: u32, _now: u64) {}
    fn freed(&mut self, _seg: u32) {}
    fn victim(&mut self, segs: &[Segment], _now: u64) -> Option<u32> {
        sealed(segs)
            .min_by_key(|(i, s)| (s.live, *i))
            .map(|(i, _)| i)
    }
    fn mem_bytes(&self) -> usize {
        0
    }
}
