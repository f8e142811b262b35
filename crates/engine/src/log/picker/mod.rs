//! Segment pickers: which sealed segment to reclaim when the log needs a free one. One file
//! per picker behind [`SegmentPicker`]; add one = one file + one line in [`REGISTRY`].

mod cost_benefit;
mod fifo;
mod greedy;
mod lru;

use super::segment::{SegState, Segment};

/// Decides reclamation order. The log tells it when a segment is sealed (written), hit and
/// freed; `victim` must return a sealed segment (or None when none is sealed).
pub trait SegmentPicker: Send {
    fn sealed(&mut self, seg: u32, now: u64);
    fn hit(&mut self, seg: u32, now: u64);
    fn freed(&mut self, seg: u32);
    fn victim(&mut self, segs: &[Segment], now: u64) -> Option<u32>;
    /// Heap bytes of the picker's state.
    fn mem_bytes(&self) -> usize;
}

/// A picker in the registry.
pub struct PickerInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub make: fn(nsegs: u32) -> Box<dyn SegmentPicker>,
}

pub const REGISTRY: &[PickerInfo] = &[
    PickerInfo {
        name: "fifo",
        summary: "oldest sealed segment first (a circular log)",
        make: |n| Box::new(fifo::Fifo::new(n)),
    },
    PickerInfo {
        name: "lru",
        summary: "least recently hit segment (Nitro's WEU-LRU)",
        make: |n| Box::new(lru::Lru::new(n)),
    },
    PickerInfo {
        name: "greedy",
        summary: "fewest live bytes (scans the segments)",
        make: |_| Box::new(greedy::Greedy),
    },
    PickerInfo {
        name: "cost-benefit",
        summary: "largest (1-u) x age / (1+u), as LFS cleans (scans the segments)",
        make: |_| Box::new(cost_benefit::CostBenefit),
    },
];

pub fn lookup(name: &str) -> Option<&'static PickerInfo> {
    let n = name.trim().to_ascii_lowercase().replace('_', "-");
    REGISTRY
        .iter()
        .find(|p| p.name == n || (n == "costbenefit" && p.name == "cost-benefit"))
}

pub(crate) fn sealed(segs: &[Segment]) -> impl Iterator<Item = (u32, &Segment)> {
    segs.iter()
        .enumerate()
        .filter(|(_, s)| s.state == SegState::Sealed)
        .map(|(i, s)| (i as u32, s))
}
