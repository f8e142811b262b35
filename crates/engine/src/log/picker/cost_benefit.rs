//! Cost-benefit (Rosenblum and Ousterhout's LFS cleaner): the sealed segment with the largest
//! (1 - u) x age / (1 + u), u = live share, age = requests since its last hit (or its
//! sealing). Empty segments go first.

use super::{sealed, SegmentPicker};
use crate::log::segment::Segment;

pub struct CostBenefit;

impl SegmentPicker for CostBenefit {
    fn sealed(&mut self, _seg: u32, _now: u64) {}
    fn hit(&mut self, _seg: u32, _now: u64) {}
    fn freed(&mut self, _seg: u32) {}
    fn victim(&mut self, segs: &[Segment], now: u64) -> Option<u32> {
        let score = |s: &Segment| {
            let u = if s.used == 0 {
                0.0
            } else {
                s.live as f64 / s.used as f64
            };
            let age = now.saturating_sub(s.last_hit.max(s.sealed_at)) as f64 + 1.0;
            (1.0 - u) * age / (1.0 + u)
        };
        sealed(segs)
            .max_by(|(i, a), (j, b)| score(a).total_cmp(&score(b)).then(j.cmp(i)))
            .map(|(i, _)| i)
    }
    fn mem_bytes(&self) -> usize {
        0
    }
}
