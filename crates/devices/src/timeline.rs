//! Reservations on a shared resource (a bus or link) that serves one transfer at a time.

/// Busy intervals of one resource, sorted and disjoint. A reservation takes the earliest gap
/// that fits at or after its ready time, so a transfer that is ready early is not stuck
/// behind one booked for later.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timeline {
    busy: Vec<(u64, u64)>,
}

impl Timeline {
    /// Books `dur_ns` starting no earlier than `ready_ns`; returns the start.
    pub fn reserve(&mut self, ready_ns: u64, dur_ns: u64) -> u64 {
        let mut start = ready_ns;
        let mut at = self.busy.len();
        for (i, &(s, e)) in self.busy.iter().enumerate() {
            if e <= start {
                continue;
            }
            if s >= start + dur_ns {
                at = i;
                break;
            }
            start = start.max(e);
        }
        if dur_ns > 0 {
            self.busy.insert(at, (start, start + dur_ns));
        }
        debug_assert!(self.busy.windows(2).all(|w| w[0].1 <= w[1].0));
        start
    }

    /// Forgets intervals that ended at or before `now_ns` (no future reservation can use them).
    pub fn prune(&mut self, now_ns: u64) {
        let n = self.busy.iter().take_while(|&&(_, e)| e <= now_ns).count();
        if n > 0 {
            self.busy.drain(..n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_gaps_in_order() {
        let mut t = Timeline::default();
        assert_eq!(t.reserve(100, 10), 100);
        assert_eq!(t.reserve(0, 10), 0);
        assert_eq!(t.reserve(0, 95), 110); // 10..100 too short for 95
        assert_eq!(t.reserve(5, 50), 10);
        assert_eq!(t.reserve(0, 1), 60);
        t.prune(205);
        assert_eq!(t.busy, vec![]);
    }
}
