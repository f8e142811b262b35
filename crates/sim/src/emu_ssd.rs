//! The cache device of the live server's `--emulate-ssd LAT_US[:CHANNELS]`, as a sim model
//! (`tiercache sim --ssd emu:LAT_US[:CHANNELS]`): each read, write or trim is served by one of
//! `channels` independent channels for `lat_us` per 4 KiB started; an op finding every
//! channel busy takes the first to free (FIFO); a flush costs nothing of its own. Same rule as
//! `tiercache_server::EmulatedSsd`, so `sim --timed` can predict a live run on it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use tiercache_devices::{Done, IoKind, IoOp, Model};

pub struct EmuSsd {
    name: String,
    capacity: u64,
    lat_ns: u64,
    /// Time at which each channel is free again.
    free: Vec<u64>,
    /// (completion time, arrival order, tag).
    pending: BinaryHeap<Reverse<(u64, u64, u64)>>,
    seq: u64,
}

impl EmuSsd {
    /// `spec` is `LAT_US[:CHANNELS]` (what follows `emu:`); `capacity` bytes.
    pub fn new(spec: &str, capacity: u64) -> Result<Self, String> {
        let bad = |why: &str| format!("SSD model 'emu:{spec}': {why}; use emu:LAT_US[:CHANNELS]");
        let (lat, ch) = spec.split_once(':').unwrap_or((spec, "1"));
        let lat: f64 = lat
            .trim()
            .parse()
            .map_err(|_| bad("LAT_US is not a number"))?;
        if !(lat.is_finite() && lat > 0.0 && lat <= 1e6) {
            return Err(bad("LAT_US must be above 0 and at most 1000000"));
        }
        let ch: usize = ch
            .trim()
            .parse()
            .map_err(|_| bad("CHANNELS is not a whole number"))?;
        if !(1..=1024).contains(&ch) {
            return Err(bad("CHANNELS must be 1 to 1024"));
        }
        Ok(EmuSsd {
            name: format!("emu:{lat}:{ch}"),
            capacity,
            lat_ns: (lat * 1e3).round() as u64,
            free: vec![0; ch],
            pending: BinaryHeap::new(),
            seq: 0,
        })
    }
}

impl Model for EmuSsd {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        let finish = if op.kind == IoKind::Flush {
            now_ns
        } else {
            let free = self.free.iter_mut().min().expect("a channel");
            *free = (*free).max(now_ns) + op.len.div_ceil(4096).max(1) * self.lat_ns;
            *free
        };
        self.seq += 1;
        self.pending.push(Reverse((finish, self.seq, tag)));
    }

    fn next_event(&self) -> Option<u64> {
        self.pending.peek().map(|Reverse((t, _, _))| *t)
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        while let Some(&Reverse((t, _, tag))) = self.pending.peek() {
            if t > now_ns {
                break;
            }
            self.pending.pop();
            out.push(Done {
                tag,
                time_ns: t,
                result: Ok(()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_devices::{Checked, Device};

    #[test]
    fn channels_serve_in_parallel_and_size_scales_the_time() {
        let mut d = Checked::new(EmuSsd::new("200:2", 1 << 30).unwrap());
        for i in 0..3 {
            d.submit(0, i, IoOp::new(IoKind::Read, i * 4096, 4096));
        }
        d.submit(0, 3, IoOp::new(IoKind::Write, 1 << 20, 8192));
        let mut done = Vec::new();
        while let Some(t) = d.next_completion() {
            d.advance(t, &mut done);
        }
        let at: Vec<(u64, u64)> = done.iter().map(|c| (c.id, c.time_ns)).collect();
        // Two channels: ops 0, 1 at 200 us; op 2 on channel 0 until 400; op 3 (2 x 4 KiB)
        // on channel 1 from 200 to 600.
        assert_eq!(
            at,
            vec![(0, 200_000), (1, 200_000), (2, 400_000), (3, 600_000)]
        );
        assert!(EmuSsd::new("0:1", 1).err().unwrap().contains("above 0"));
        assert!(EmuSsd::new("20:0", 1).err().unwrap().contains("1 to 1024"));
    }
}
