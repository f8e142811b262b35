//! Statistics and the per-line view (`ctl stats`, `ctl lines`).

use super::*;

impl CacheVolume {
    /// Counters, occupancy and device state for `ctl stats` and metrics.
    pub fn stats(&self) -> VolumeStats {
        let g = self.lock();
        // Lock order: the volume lock, then `wb_rate`.
        let (wb_mode, wb_target, _) = self.writeback_rate();
        let e = &g.engine;
        let per_class = (0..tiercache_engine::NUM_CLASSES as u8)
            .filter(|&c| e.class_counters(c).requests > 0)
            .map(|c| (c, *e.class_counters(c)))
            .collect();
        let dirty_bytes = e
            .entries()
            .filter(|x| x.2)
            .map(|(_, s, _)| {
                (e.dirty_mask(s) | e.pending_mask(s)).count_ones() as u64 * e.sector_size()
            })
            .sum();
        VolumeStats {
            settings: Settings {
                mode: e.config().mode.as_str().to_string(),
                policy: e.policy_name().to_string(),
                line_size: e.config().line_size,
                tuning: Tuning::of(e.config()),
                cleaning: Some(e.config().cleaning.as_str().to_string()),
                cleaning_age: Some(e.config().cleaning_age),
                writeback_rate: Some(wb_mode.to_string()),
                writeback_target: Some(wb_target),
                changes: self.metrics.settings_changes.load(Ordering::Relaxed),
            },
            mode: e.config().mode.as_str().to_string(),
            policy: e.policy_name().to_string(),
            line_size: 1 << self.line_shift,
            capacity_lines: self.capacity_lines,
            cached_lines: e.len(),
            dirty_lines: e.dirty_lines(),
            dirty_bytes,
            volume_bytes: self.size,
            ram_index_bytes: e.index_bytes() as u64 + (g.mem.len() + g.disk_key.len() * 8) as u64,
            totals: e.counters(),
            per_class,
            unmap_syncs: self.metrics.unmap_syncs.load(Ordering::Relaxed),
            unmap_on_miss: self.metrics.unmap_on_miss.load(Ordering::Relaxed),
            unmap_ahead: self.metrics.unmap_ahead.load(Ordering::Relaxed),
            unmapped_ahead_now: g.ahead.len() as u64,
            flux_syncs: self.metrics.flux_syncs.load(Ordering::Relaxed),
            flux_pages: self.metrics.flux_pages.load(Ordering::Relaxed),
            flux_pages_now: g.flux_pages.len() as u64,
            metadata_pages_written: self.metrics.metadata_pages.load(Ordering::Relaxed),
            classes: crate::classify::class_stats(e, g.class_table.as_deref()),
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
            cache_errors: self.metrics.cache_errors.load(Ordering::Relaxed),
            checksum_errors: self.metrics.checksum_errors.load(Ordering::Relaxed),
            data_checksums: g.sums.is_some(),
            backing_errors: self.metrics.backing_errors.load(Ordering::Relaxed),
            cache_failed: g.failed,
            lost_dirty_bytes: g.lost.iter().map(|(a, b)| b - a).sum(),
            lost_dirty_ranges: g.lost.clone(),
            degraded: g.degraded.is_some(),
            degraded_reason: g.degraded.as_ref().map(Degraded::reason),
            backing_write_errors: self.metrics.backing_write_errors.load(Ordering::Relaxed),
            backing_sync_errors: self.metrics.backing_sync_errors.load(Ordering::Relaxed),
        }
    }

    /// Every cached line as the engine holds it now, in slot order (tests, diagnostics).
    pub fn lines(&self) -> Vec<LineState> {
        let g = self.lock();
        let e = &g.engine;
        e.entries()
            .map(|(key, slot, _)| LineState {
                key,
                slot,
                valid: e.valid_mask(slot),
                dirty: e.dirty_mask(slot) | e.pending_mask(slot),
            })
            .collect()
    }
}
