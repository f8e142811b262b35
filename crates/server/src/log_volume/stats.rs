//! Statistics and the per-line view (`ctl stats`, `ctl lines`).

use super::*;

/// One I/O class of a log volume in `ctl stats` (see [`LogVolumeStats::classes`]).
#[derive(Clone, Debug, Serialize)]
pub struct LogClassStats {
    pub id: u8,
    /// The table's name of the class (its id's digits without a table).
    pub name: String,
    /// Lines cached by requests of this class (the class a line was cached or last
    /// relabelled as; lines restored after a restart are class 0).
    pub cached_lines: u64,
    pub dirty_lines: u64,
    /// The engine's counters of the class's requests since the last reset.
    pub engine: LogCounters,
}

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
            ram_index_bytes: ib + self.ram_metadata_bytes(),
            index_bytes_per_entry: if red.cached_lines > 0 {
                ib as f64 / red.cached_lines as f64
            } else {
                0.0
            },
            dup_entries_budget: g.dup_budget,
            reduction: red,
            engine: g.eng.counters().since(&g.base.0),
            live: live::live_since(&g.live, &g.base.1),
            cache_errors: g.cache_errors,
            backing_errors: g.backing_errors,
            backing_write_errors: g.backing_write_errors,
            cache_failed: g.pass_through,
            halted: g.halted,
            lost_dirty_bytes: degrade::lost_bytes(&g.lost),
            lost_dirty_ranges: g.lost.clone(),
            degraded: g.degraded.is_some() || g.sync_failing.is_some(),
            degraded_reason: Degraded::reason_of(g.degraded.as_ref(), g.sync_failing.as_ref()),
            classes: class_stats(&g),
            class_table: g
                .class_table
                .as_ref()
                .map(|t| crate::classify::ClassTableInfo {
                    name: t.name.clone(),
                    source: g.class_source.clone(),
                    classes: crate::classify::named_classes(t),
                    rules: t.rules.len(),
                    loads: g.class_loads,
                }),
            classifier: self.classifier.as_ref().map(|c| c.summary()),
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

/// Per-class statistics: the classes with requests (since the start) or cached lines.
fn class_stats(g: &Inner) -> Vec<LogClassStats> {
    let n = tiercache_engine::NUM_CLASSES;
    let (mut cached, mut dirty) = (vec![0u64; n], vec![0u64; n]);
    for (_, i) in g.eng.entries() {
        cached[i.class as usize] += 1;
        dirty[i.class as usize] += i.dirty as u64;
    }
    (0..n as u8)
        .filter(|&c| g.eng.class_counters(c).requests > 0 || cached[c as usize] > 0)
        .map(|c| LogClassStats {
            id: c,
            name: match &g.class_table {
                Some(t) if !t.name_of(c).is_empty() => t.name_of(c).to_string(),
                _ => c.to_string(),
            },
            cached_lines: cached[c as usize],
            dirty_lines: dirty[c as usize],
            engine: g.eng.class_counters(c).since(&g.class_base[c as usize]),
        })
        .collect()
}
