//! `hotspot`: `hot_io` percent of the requests go to the first `hot_space` percent of the
//! working set, uniformly; the rest go uniformly to the remainder. With `seq`, that share of
//! the requests instead continues where the previous request ended (rounded up to the
//! alignment, wrapping to offset 0 when it would cross the working set's end), so runs of
//! sequential requests start at hotspot-placed offsets; their lengths are geometric (mean
//! 1 / (1 - seq/100) requests).

use super::Space;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub(crate) struct Hotspot {
    space: Space,
    /// Slots `0..hot_slots` are hot.
    hot_slots: u64,
    hot_frac: f64,
    seq_frac: f64,
    /// Where the previous request ended (relative).
    end: u64,
}

impl Hotspot {
    pub fn new(space: Space, min_size: u64, hot_io: f64, hot_space: f64, seq: f64) -> Self {
        let blocks = space.blocks(min_size);
        let hot_slots = ((blocks as f64 * hot_space / 100.0).round() as u64).clamp(1, blocks);
        Hotspot {
            space,
            hot_slots,
            hot_frac: hot_io / 100.0,
            seq_frac: seq / 100.0,
            end: 0,
        }
    }

    /// Bytes from the start of the working set that form the hot region.
    #[cfg(test)]
    pub fn hot_bytes(&self) -> u64 {
        self.hot_slots * self.space.align
    }

    #[inline]
    pub fn next(&mut self, len: u64, rng: &mut ChaCha8Rng) -> u64 {
        // No draw at seq=0, so plain hotspot streams are unchanged.
        let seq = self.seq_frac > 0.0 && (self.seq_frac >= 1.0 || rng.gen::<f64>() < self.seq_frac);
        let o = if seq {
            let o = self.space.round_up(self.end);
            if o + len > self.space.wss {
                0
            } else {
                o
            }
        } else {
            self.place(len, rng)
        };
        self.end = o + len;
        o
    }

    #[inline]
    fn place(&mut self, len: u64, rng: &mut ChaCha8Rng) -> u64 {
        let hot = if self.hot_frac >= 1.0 {
            true
        } else if self.hot_frac <= 0.0 {
            false
        } else {
            rng.gen::<f64>() < self.hot_frac
        };
        let max = self.space.max_slot(len);
        let slot = if hot {
            rng.gen_range(0..=max.min(self.hot_slots - 1))
        } else if self.hot_slots <= max {
            rng.gen_range(self.hot_slots..=max)
        } else {
            // No cold slot fits (hot_space=100, or requests as large as the cold part).
            rng.gen_range(0..=max)
        };
        slot * self.space.align
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn hot_region_is_the_share_of_the_space() {
        let space = Space {
            wss: 1 << 20,
            align: 4096,
        };
        let h = Hotspot::new(space, 4096, 80.0, 20.0, 0.0);
        assert_eq!(h.hot_bytes(), (256.0f64 * 0.2).round() as u64 * 4096);
        let mut all = Hotspot::new(space, 4096, 50.0, 100.0, 0.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..1000 {
            assert!(all.next(4096, &mut rng) < 1 << 20);
        }
    }
}
