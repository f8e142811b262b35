//! `seq`: interleaved sequential streams through the working set.

use super::Space;

/// `streams` cursors, used round-robin. Stream k starts k/streams of the way into the working
/// set; each runs through the whole set, and wraps to its start (offset 0) when the next
/// request would cross its end.
#[derive(Clone, Debug)]
pub(crate) struct Seq {
    space: Space,
    pos: Vec<u64>,
    next: usize,
}

impl Seq {
    pub fn new(space: Space, streams: u32) -> Self {
        let wss = u128::from(space.wss);
        let n = u128::from(streams.max(1));
        let pos = (0..n)
            .map(|k| (k * wss / n) as u64 / space.align * space.align)
            .collect();
        Seq {
            space,
            pos,
            next: 0,
        }
    }

    #[inline]
    pub fn next(&mut self, len: u64) -> u64 {
        let k = self.next;
        self.next = if k + 1 == self.pos.len() { 0 } else { k + 1 };
        let p = &mut self.pos[k];
        let mut o = *p;
        if o + len > self.space.wss {
            o = 0;
        }
        *p = self.space.round_up(o + len);
        o
    }
}
