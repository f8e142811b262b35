//! Diagnostics: cached clean sectors compared with the backing device.

use super::*;

impl CacheVolume {
    /// Test and diagnostic aid: every cached line with a valid, clean sector whose bytes in
    /// the cache differ from the backing device's, as (line key, slot, mask of the differing
    /// sectors). Reads under the volume lock (requests wait); a write-back in flight counts
    /// its lines' pending sectors as dirty; sectors a failed cache sync may have dropped
    /// (dropped at the next request) are left out. Empty on a healthy volume at rest.
    #[doc(hidden)]
    pub fn clean_lines_differing(&self) -> io::Result<Vec<(u64, u32, u64)>> {
        let mut g = self.lock();
        if g.failed || g.closed {
            return Ok(Vec::new());
        }
        // A line being filled outside the lock is not there yet.
        self.reap_fills(&mut g);
        let e = &g.engine;
        let ls = 1u64 << self.line_shift;
        let ss = e.sector_size();
        let (mut a, mut b) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
        let mut out = Vec::new();
        let lines: Vec<(u64, u32)> = e.entries().map(|(k, s, _)| (k, s)).collect();
        for (key, slot) in lines {
            let dropped = g.cache_dropped.get(&slot).copied().unwrap_or(0);
            let clean = e.valid_mask(slot) & !(e.dirty_mask(slot) | e.pending_mask(slot) | dropped);
            if clean == 0 {
                continue;
            }
            self.cache.read_at(
                &mut a,
                self.data_offset + ((slot as u64) << self.line_shift),
            )?;
            self.backing
                .read_at(&mut b, key_addr(key, self.line_shift))?;
            let mut bad = 0u64;
            for k in 0..ls / ss {
                let r = (k * ss) as usize..((k + 1) * ss) as usize;
                if clean >> k & 1 == 1 && a[r.clone()] != b[r] {
                    bad |= 1 << k;
                }
            }
            if bad != 0 {
                out.push((key, slot, bad));
            }
        }
        Ok(out)
    }
}
