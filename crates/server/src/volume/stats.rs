//! Statistics and the per-line view (`ctl stats`, `ctl lines`).

use super::*;

/// Heap bytes of everything the volume keeps that grows with its lines: the engine's index
/// ([`Engine::index_bytes`], including its journal of changed slots), the durable keys, the data checksum image,
/// and the per-page, per-slot and per-range bookkeeping of the crash rules (B-trees and
/// hash maps estimated, `tiercache_engine::mem`). Checked against a counting allocator in
/// `tests/ram_accounting.rs`: a structure left out here fails it.
fn ram_bytes(g: &Inner) -> u64 {
    use std::mem::size_of;
    use tiercache_engine::mem::{btree_bytes, hash_bytes};
    let n = g.engine.index_bytes()
        + g.durable.mem_bytes()
        + g.slots.capacity() * 4
        + btree_bytes(g.dirty_pages.len(), 8)
        + btree_bytes(g.hdd_unsynced.len(), 16)
        + btree_bytes(g.hdd_undecided.len(), 16)
        + btree_bytes(g.in_plan.len(), 4)
        + btree_bytes(g.cache_unsynced.len(), 12)
        + btree_bytes(g.cache_dropped.len(), 12)
        + g.lost.capacity() * size_of::<(u64, u64)>()
        + hash_bytes(g.ahead.capacity(), size_of::<(u32, u64)>())
        + btree_bytes(g.flux_pages.len(), 16)
        + hash_bytes(g.forgotten.capacity(), size_of::<(u64, u32)>())
        + g.sums.as_ref().map_or(0, DataSums::mem_bytes);
    n as u64
}

impl CacheVolume {
    /// The volume's name in `ctl stats`: its backing device as the superblock records it.
    pub fn volume_name(&self) -> String {
        self.lock().sb.backing.name.clone()
    }

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
                validity: Some(e.config().validity.as_str().to_string()),
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
            copy_slots: e.copy_slot_count(),
            unmirrored_lines: e.unmirrored_lines(),
            remirrored_lines: self.metrics.remirrored_lines.load(Ordering::Relaxed),
            dirty_bytes,
            volume_bytes: self.size,
            ram_index_bytes: ram_bytes(&g) + self.ram.as_ref().map_or(0, |r| r.mem_bytes().1),
            totals: e.counters(),
            ram: self.ram.as_ref().map(|r| r.stats(&e.counters())),
            per_class,
            unmap_syncs: self.metrics.unmap_syncs.load(Ordering::Relaxed),
            unmap_on_miss: self.metrics.unmap_on_miss.load(Ordering::Relaxed),
            unmap_ahead: self.metrics.unmap_ahead.load(Ordering::Relaxed),
            unlocked_misses: self.metrics.unlocked_misses.load(Ordering::Relaxed),
            unmapped_ahead_now: g.ahead.len() as u64,
            unmap_ahead_skipped: self.metrics.unmap_ahead_skipped.load(Ordering::Relaxed),
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
            classifier: self.classifier_summary(),
            cache_errors: self.metrics.cache_errors.load(Ordering::Relaxed),
            pool_members: self.pool_member_stats(&g),
            checksum_errors: self.metrics.checksum_errors.load(Ordering::Relaxed),
            data_checksums: g.sums.is_some(),
            backing_errors: self.metrics.backing_errors.load(Ordering::Relaxed),
            cache_failed: g.failed,
            halted: g.halted,
            lost_dirty_bytes: g.lost.iter().map(|(a, b)| b - a).sum(),
            lost_dirty_ranges: g.lost.clone(),
            lost_ranges: g.lost.len() as u64,
            degraded: g.degraded.is_some() || g.sync_failing.is_some(),
            degraded_reason: Degraded::reason_of(g.degraded.as_ref(), g.sync_failing.as_ref()),
            backing_write_errors: self.metrics.backing_write_errors.load(Ordering::Relaxed),
            backing_sync_errors: self.metrics.backing_sync_errors.load(Ordering::Relaxed),
            unlocked_writebacks: self.metrics.unlocked_writebacks.load(Ordering::Relaxed),
            writeback_waits: self.metrics.writeback_waits.load(Ordering::Relaxed),
            writeback_yields: self.metrics.writeback_yields.load(Ordering::Relaxed),
            writeback_groups_dropped: self
                .metrics
                .writeback_groups_dropped
                .load(Ordering::Relaxed),
            cleaner_panics: self.metrics.cleaner_panics.load(Ordering::Relaxed),
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

impl CacheVolume {
    /// Per member of a pool of cache devices (empty: one device); O(lines cached).
    fn pool_member_stats(&self, g: &Inner) -> Vec<super::PoolMemberStats> {
        let n = g.member_errors.len();
        if n == 0 {
            return Vec::new();
        }
        let e = &g.engine;
        let (mut lines, mut dirty) = (vec![0u64; n], vec![0u64; n]);
        for (_, s, d) in e.entries() {
            let m = e.member_of(s);
            lines[m] += 1;
            dirty[m] += d as u64;
        }
        let names = self.cache.pool_member_names();
        let io = self.cache.pool_member_io();
        (0..n)
            .map(|d| super::PoolMemberStats {
                index: d,
                path: names.get(d).cloned().unwrap_or_default(),
                state: if g.failed || e.device_failed(d) {
                    "failed"
                } else {
                    "active"
                }
                .into(),
                lines: lines[d],
                dirty_lines: dirty[d],
                errors: g.member_errors[d],
                reads: io.get(d).map_or(0, |x| x.reads),
                writes: io.get(d).map_or(0, |x| x.writes),
                read_bytes: io.get(d).map_or(0, |x| x.read_bytes),
                written_bytes: io.get(d).map_or(0, |x| x.written_bytes),
            })
            .collect()
    }
}
