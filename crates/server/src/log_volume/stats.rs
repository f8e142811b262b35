//! Statistics and the per-line view (`ctl stats`, `ctl lines`).

use super::*;

impl LogVolume {
    /// The volume's name in `ctl stats`: its backing device as the superblock records it.
    pub fn volume_name(&self) -> String {
        self.lock().sb.backing.name.clone()
    }

    pub fn stats(&self) -> LogVolumeStats {
        let g = self.lock();
        let red = g.eng.reduction();
        // The engine's indices plus this side's copy of the headers (32-byte digests).
        let ib = g.eng.index_bytes() as u64
            + g.segs
                .iter()
                .map(|m| (m.exts.capacity() * std::mem::size_of::<Ext>()) as u64)
                .sum::<u64>();
        LogVolumeStats {
            layout: "log",
            // The mode in force: a failed cache passes everything through.
            mode: if g.pass_through || g.detached {
                Mode::PassThrough.as_str().into()
            } else {
                g.sb.mode.as_str().into()
            },
            line_size: g.sb.line_size,
            segment_size: g.sb.segment_size,
            segments: g.sb.segments,
            compression: g.sb.compression.to_string(),
            picker: g.sb.picker.clone(),
            dedup_index_ratio: g.sb.dedup_ratio,
            volume_bytes: self.size,
            cached_lines: red.cached_lines,
            dirty_lines: g.eng.dirty_lines(),
            dedup_ratio: red.dedup_ratio,
            compression_ratio: red.compression_ratio,
            effective_capacity: red.effective_capacity,
            ssd_bytes_used: red.ssd_bytes_used,
            ssd_bytes_written: g.live.ssd_bytes_written - g.base.1.ssd_bytes_written,
            ram_index_bytes: ib,
            index_bytes_per_entry: if red.cached_lines > 0 {
                ib as f64 / red.cached_lines as f64
            } else {
                0.0
            },
            dup_entries_budget: g.dup_budget,
            reduction: red,
            engine: live::engine_since(g.eng.counters(), &g.base.0),
            live: live::live_since(&g.live, &g.base.1),
            cache_errors: g.cache_errors,
            backing_errors: g.backing_errors,
            backing_write_errors: g.backing_write_errors,
            cache_failed: g.pass_through,
            lost_dirty_bytes: degrade::lost_bytes(&g.lost),
            lost_dirty_ranges: g.lost.clone(),
            degraded: g.degraded.is_some() || g.sync_failing.is_some(),
            degraded_reason: Degraded::reason_of(g.degraded.as_ref(), g.sync_failing.as_ref()),
            recovery_sample: g.recovery_sample,
        }
    }

    /// Data reduction over what the cache holds now.
    pub fn reduction(&self) -> Reduction {
        self.lock().eng.reduction()
    }

    /// Every cached line and whether it is dirty, in line order (tests, diagnostics).
    pub fn cached_lines(&self) -> Vec<(u64, bool)> {
        let g = self.lock();
        let mut v: Vec<(u64, bool)> = g
            .eng
            .entries()
            .map(|(k, i)| (LogEngine::key_line(k).1, i.dirty))
            .collect();
        v.sort_unstable();
        v
    }

    pub(super) fn lines(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        if len == 0 {
            #[allow(clippy::reversed_empty_ranges)]
            return 1..=0;
        }
        offset / self.line..=(offset + len - 1) / self.line
    }
}
