//! Everything an [`Engine`] takes at run time, on a sharded engine: settings go to every
//! shard (validated once, so that on error no shard changed), per-line calls go to the
//! shard owning the line or the global slot, write-back tickets and restores are split
//! between the shards and their results put together with global slots. With one shard each
//! call is the engine's own (`tests/sharded_runtime.rs` drives both side by side).

use super::{owner, relocate, Sharded, ShardedBatch, ShardedRestorePending, ShardedTicket};
use crate::config::EngineConfig;
use crate::engine::{
    Engine, EngineError, InflightCounters, RestoreLine, VolumeStats, WbBatch, WbDone,
};
use crate::plan::Plan;
use crate::policy::Slot;
use crate::Mode;
use std::sync::Arc;

impl ShardedBatch {
    fn empty() -> Self {
        ShardedBatch {
            ticket: ShardedTicket(Vec::new()),
            plan: Plan::default(),
            lines: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Adds shard `i`'s batch, its slots moved by `slot_base` and SSD addresses by `ssd_off`.
    fn add(&mut self, i: usize, slot_base: Slot, ssd_off: u64, b: &WbBatch<'_>) {
        self.ticket.0.push((i, b.ticket));
        self.plan
            .steps
            .extend(b.plan.steps.iter().map(|&s| relocate(s, ssd_off, 0)));
        self.lines
            .extend(b.lines.iter().map(|l| crate::engine::WbLine {
                slot: l.slot + slot_base,
                copy: l.copy.map(|c| c + slot_base),
                ..*l
            }));
        self.spans.extend_from_slice(b.spans);
    }

    fn some(self) -> Option<Self> {
        (!self.ticket.0.is_empty()).then_some(self)
    }
}

impl ShardedTicket {
    /// The shards (and their tickets) this write-back runs on.
    pub fn parts(&self) -> &[(usize, crate::engine::WbTicket)] {
        &self.0
    }
}

impl Sharded {
    /// An error of shard `i` about global slot `slot` (with one shard, the engine's own).
    fn shard_error(&self, i: usize, slot: Slot, e: EngineError) -> EngineError {
        match e {
            EngineError::Config(m) if self.shards.len() > 1 => {
                EngineError::Config(format!("shard {i} (global slot {slot}): {m}"))
            }
            e => e,
        }
    }

    /// An error of shard `i > 0` on a change shards before it took (cannot happen: every
    /// shard validates the same settings; said rather than hidden if it does).
    fn partial_error(&self, i: usize, e: EngineError) -> EngineError {
        EngineError::Config(format!(
            "shard {i} of {} refused a change shards 0..{i} took: {e}",
            self.shards.len()
        ))
    }

    /// Refuses settings whose group (or ACP chunk without chunk rewrite) would no longer
    /// lie in one granule: the granule is fixed when the engine is built.
    fn check_granule(&self, c: &EngineConfig) -> Result<(), EngineError> {
        let g = self.granule_bytes();
        let need = Self::min_granule(c);
        if self.shards.len() > 1 && need > g {
            return Err(EngineError::Config(format!(
                "group_size {} (or, with ACP cleaning and no chunk rewrite, the ACP chunk) needs \
                 granules of {need} bytes, but this engine's {} shards split the lines in \
                 granules of {g} bytes (fixed when it is built): a group must lie in one shard",
                c.group_size,
                self.shards.len()
            )));
        }
        Ok(())
    }

    /// [`Engine::set_mode`] on every shard.
    pub fn set_mode(&mut self, mode: Mode) {
        self.cfg.mode = mode;
        for e in &mut self.shards {
            e.set_mode(mode);
        }
    }

    /// [`Engine::retune`] on every shard: `f` edits the whole engine's configuration, each
    /// shard takes it with its own capacity and seed. Also refused: a change of `shards`
    /// or `shard_granule`, and a group larger than the granule. On error nothing changes.
    pub fn retune(&mut self, f: impl FnOnce(&mut EngineConfig)) -> Result<(), EngineError> {
        let mut c = self.cfg.clone();
        f(&mut c);
        let n = self.shards.len();
        if n > 1 {
            c.validate().map_err(EngineError::Config)?;
            for (what, changed) in [
                ("shards", c.shards != self.cfg.shards),
                ("shard_granule", c.shard_granule != self.cfg.shard_granule),
            ] {
                if changed {
                    return Err(EngineError::Config(format!(
                        "{what} cannot change on a running engine (it is fixed when the engine \
                         is built)"
                    )));
                }
            }
            self.check_granule(&c)?;
        }
        let granule = self.granule_bytes();
        let cap_changed = c.capacity_lines != self.cfg.capacity_lines;
        for i in 0..n {
            let own = self.shards[i].capacity_lines();
            // A new capacity is handed on as one, so the shard refuses it as an engine does.
            let cap = own + u64::from(cap_changed);
            let sc = Self::shard_config(&c, n, granule, i, Some(cap));
            if let Err(e) = self.shards[i].retune(|x| *x = sc) {
                return Err(if i == 0 { e } else { self.partial_error(i, e) });
            }
        }
        self.cfg = c;
        Ok(())
    }

    /// [`Engine::set_class_table`] on every shard. On error nothing changes.
    pub fn set_class_table(
        &mut self,
        table: Option<Arc<crate::ClassTable>>,
    ) -> Result<(), EngineError> {
        self.shards[0].set_class_table(table.clone())?;
        for i in 1..self.shards.len() {
            if let Err(e) = self.shards[i].set_class_table(table.clone()) {
                return Err(self.partial_error(i, e));
            }
        }
        self.cfg.policy_params.classes = table;
        Ok(())
    }

    /// [`Engine::set_volume_share`] on every shard (the shares are of each shard's
    /// capacity). On error nothing changes.
    pub fn set_volume_share(
        &mut self,
        volume: u32,
        share: Option<(f64, f64)>,
    ) -> Result<(), EngineError> {
        self.shards[0].set_volume_share(volume, share)?;
        for i in 1..self.shards.len() {
            if let Err(e) = self.shards[i].set_volume_share(volume, share) {
                return Err(self.partial_error(i, e));
            }
        }
        self.cfg.policy_params.volume_shares = self.shards[0].volume_shares().to_vec();
        Ok(())
    }

    /// [`Engine::set_chunk_rewrite`] on every shard, the chunk capped at the granule.
    pub fn set_chunk_rewrite(&mut self, chunk: u64, min_runs: u64) -> Result<(), EngineError> {
        let mut c = self.cfg.clone();
        c.rewrite_chunk = chunk;
        c.rewrite_min_runs = min_runs;
        let n = self.shards.len();
        if n > 1 {
            c.validate().map_err(EngineError::Config)?;
            self.check_granule(&c)?;
        }
        let own = if n > 1 {
            chunk.min(self.granule_bytes())
        } else {
            chunk
        };
        for i in 0..n {
            if let Err(e) = self.shards[i].set_chunk_rewrite(own, min_runs) {
                return Err(if i == 0 { e } else { self.partial_error(i, e) });
            }
        }
        self.cfg = c;
        Ok(())
    }

    /// [`Engine::set_dirty_evictions_blocked`] on every shard.
    pub fn set_dirty_evictions_blocked(&mut self, on: bool) {
        for e in &mut self.shards {
            e.set_dirty_evictions_blocked(on);
        }
    }

    pub fn dirty_evictions_blocked(&self) -> bool {
        self.shards[0].dirty_evictions_blocked()
    }

    /// [`Engine::set_read_admission_blocked`] on every shard.
    pub fn set_read_admission_blocked(&mut self, on: bool) {
        for e in &mut self.shards {
            e.set_read_admission_blocked(on);
        }
    }

    pub fn read_admission_blocked(&self) -> bool {
        self.shards[0].read_admission_blocked()
    }

    /// [`Engine::set_fast_path`] on every shard.
    #[doc(hidden)]
    pub fn set_fast_path(&mut self, on: bool) {
        for e in &mut self.shards {
            e.set_fast_path(on);
        }
    }

    /// [`Engine::reset_counters`] on every shard, and the split requests' corrections.
    pub fn reset_counters(&mut self) {
        for e in &mut self.shards {
            e.reset_counters();
        }
        for c in self.fix_sub.iter_mut().chain(self.fix_add.iter_mut()) {
            *c = Default::default();
        }
        self.vol_fix.clear();
    }

    /// [`Engine::track_unmapped`] on every shard.
    pub fn track_unmapped(&mut self, on: bool) {
        for e in &mut self.shards {
            e.track_unmapped(on);
        }
    }

    /// Keys of lines that left the cache since the last call, shard after shard.
    pub fn drain_unmapped(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        for e in &mut self.shards {
            out.extend(e.drain_unmapped());
        }
        out
    }

    /// Advances the logical clock of the engine and every shard ([`Engine::advance_clock`]).
    pub fn advance_clock(&mut self, n: u64) {
        self.clock += n;
        self.sync_clocks();
    }

    pub fn sector_size(&self) -> u64 {
        self.shards[0].sector_size()
    }

    /// [`Engine::volume_stats`] over the shards (a volume's counters and lines summed). A
    /// request split between shards counts once in its volume's counters, by the outcome of
    /// all its lines (as in [`Sharded::class_counters`]).
    pub fn volume_stats(&self) -> Vec<VolumeStats> {
        if self.shards.len() == 1 {
            return self.shards[0].volume_stats();
        }
        let mut out: Vec<VolumeStats> = Vec::new();
        for e in &self.shards {
            for v in e.volume_stats() {
                match out.iter_mut().find(|o| o.id == v.id) {
                    Some(o) => {
                        o.counters += &v.counters;
                        o.lines += v.lines;
                        o.dirty_lines += v.dirty_lines;
                    }
                    None => out.push(v),
                }
            }
        }
        out.sort_by_key(|v| v.id);
        for v in &mut out {
            v.counters = self.volume_counters(v.id, v.counters);
        }
        out
    }

    /// [`Engine::inflight_counters`] summed over the shards.
    pub fn inflight_counters(&self) -> InflightCounters {
        let mut t = InflightCounters::default();
        for e in &self.shards {
            let c = e.inflight_counters();
            t.victim_pinned += c.victim_pinned;
            t.bypass_pinned += c.bypass_pinned;
            t.writeback_redirtied += c.writeback_redirtied;
            t.writeback_failed += c.writeback_failed;
            t.zombies_freed += c.zombies_freed;
        }
        t
    }

    pub fn writebacks_in_flight(&self) -> usize {
        self.shards.iter().map(Engine::writebacks_in_flight).sum()
    }

    pub fn zombie_slots(&self) -> u64 {
        self.shards.iter().map(Engine::zombie_slots).sum()
    }

    // Per global slot or line key: the owning shard's answer.

    pub fn slot_key(&self, slot: Slot) -> Option<u64> {
        let (i, s) = self.locate(slot);
        self.shards[i].slot_key(s)
    }

    pub fn is_dirty(&self, slot: Slot) -> bool {
        let (i, s) = self.locate(slot);
        self.shards[i].is_dirty(s)
    }

    pub fn valid_mask(&self, slot: Slot) -> u64 {
        let (i, s) = self.locate(slot);
        self.shards[i].valid_mask(s)
    }

    pub fn dirty_mask(&self, slot: Slot) -> u64 {
        let (i, s) = self.locate(slot);
        self.shards[i].dirty_mask(s)
    }

    pub fn pending_mask(&self, slot: Slot) -> u64 {
        let (i, s) = self.locate(slot);
        self.shards[i].pending_mask(s)
    }

    pub fn is_pinned(&self, slot: Slot) -> bool {
        let (i, s) = self.locate(slot);
        self.shards[i].is_pinned(s)
    }

    pub fn slot_gen(&self, slot: Slot) -> u32 {
        let (i, s) = self.locate(slot);
        self.shards[i].slot_gen(s)
    }

    pub fn line_class(&self, slot: Slot) -> u8 {
        let (i, s) = self.locate(slot);
        self.shards[i].line_class(s)
    }

    /// [`Engine::drop_line`] in the shard holding `slot`.
    pub fn drop_line(&mut self, slot: Slot) -> Option<u64> {
        let (i, s) = self.locate(slot);
        self.shards[i].drop_line(s)
    }

    /// [`Engine::reclassify`] in the shard owning `key`.
    pub fn reclassify(&mut self, key: u64, class: u8) -> bool {
        let i = self.shard_of(key);
        self.shards[i].reclassify(key, class)
    }

    /// [`Engine::eviction_candidates`] of every shard, `ceil(n / N)` each (a request's
    /// misses spread over the shards), in shard order, as global slots.
    pub fn eviction_candidates(&self, n: u64, out: &mut Vec<Slot>) {
        let k = self.shards.len();
        if k == 1 {
            return self.shards[0].eviction_candidates(n, out);
        }
        let each = n.div_ceil(k as u64);
        let mut part = Vec::new();
        for (i, e) in self.shards.iter().enumerate() {
            part.clear();
            e.eviction_candidates(each, &mut part);
            out.extend(part.iter().map(|&s| self.global_slot(i, s)));
        }
    }

    // Cleaning with write-backs in flight.

    /// Lines cleaning would write back now: every shard's [`Engine::cleaning_target`], its
    /// clock brought up to the requests processed first (hence `&mut`).
    pub fn cleaning_target(&mut self) -> u64 {
        self.sync_clocks();
        self.shards.iter().map(Engine::cleaning_target).sum()
    }

    /// [`Engine::begin_clean`] over the shards: first each shard due for cleaning down to
    /// its own target, then, with `max_lines` left, any shard's dirty lines, starting at
    /// the shard after the last one such a pass visited (round robin). `None` when nothing
    /// was planned.
    pub fn begin_clean(&mut self, max_lines: u64) -> Option<ShardedBatch> {
        let n = self.shards.len();
        self.sync_clocks();
        let mut out = ShardedBatch::empty();
        if n == 1 {
            let b = self.shards[0].begin_clean(max_lines)?;
            out.add(0, 0, 0, &b);
            return Some(out);
        }
        let mut left = max_lines;
        for i in 0..n {
            let e = &self.shards[i];
            if left == 0 || !e.needs_cleaning() {
                continue;
            }
            let q = e.cleaning_target().min(left);
            left -= self.begin_on(i, q, &mut out);
        }
        let start = self.clean_cursor;
        for k in 0..n {
            let i = (start + k) % n;
            if left == 0 {
                break;
            }
            if self.shards[i].dirty_lines() > 0 {
                left -= self.begin_on(i, left, &mut out);
                self.clean_cursor = (i + 1) % n;
            }
        }
        out.some()
    }

    /// Begins cleaning up to `max` lines of shard `i` into `out`; returns the lines that
    /// stopped counting as dirty.
    fn begin_on(&mut self, i: usize, max: u64, out: &mut ShardedBatch) -> u64 {
        if max == 0 {
            return 0;
        }
        let (sb, off) = (self.base[i] as Slot, self.base[i] << self.line_shift);
        let before = self.shards[i].dirty_lines();
        if let Some(b) = self.shards[i].begin_clean(max) {
            out.add(i, sb, off, &b);
        }
        before - self.shards[i].dirty_lines()
    }

    /// [`Engine::begin_write_back_slots`] with global slots: each shard writes back its own.
    pub fn begin_write_back_slots(&mut self, slots: &[Slot]) -> Option<ShardedBatch> {
        let n = self.shards.len();
        let mut out = ShardedBatch::empty();
        if n == 1 {
            let b = self.shards[0].begin_write_back_slots(slots)?;
            out.add(0, 0, 0, &b);
            return Some(out);
        }
        let mut local = Vec::new();
        for i in 0..n {
            local.clear();
            local.extend(slots.iter().filter_map(|&s| {
                let (j, l) = self.locate(s);
                (j == i).then_some(l)
            }));
            if local.is_empty() {
                continue;
            }
            let (sb, off) = (self.base[i] as Slot, self.base[i] << self.line_shift);
            if let Some(b) = self.shards[i].begin_write_back_slots(&local) {
                out.add(i, sb, off, &b);
            }
        }
        out.some()
    }

    /// [`Engine::complete_writeback`] of every shard's part; `failed` are global slots.
    pub fn complete_writeback(&mut self, t: ShardedTicket, failed: &[Slot]) -> WbDone {
        let mut done = WbDone::default();
        let mut local = Vec::new();
        for (i, tk) in t.0 {
            local.clear();
            local.extend(failed.iter().filter_map(|&s| {
                let (j, l) = self.locate(s);
                (j == i).then_some(l)
            }));
            let d = self.shards[i].complete_writeback(tk, &local);
            done.cleaned += d.cleaned;
            done.failed += d.failed;
            done.redirtied += d.redirtied;
            done.freed += d.freed;
        }
        done
    }

    /// [`Engine::clean`]: [`Sharded::begin_clean`] completed at once.
    pub fn clean(&mut self, max_lines: u64) -> &Plan {
        match self.begin_clean(max_lines) {
            Some(b) => {
                self.complete_writeback(b.ticket, &[]);
                self.plan = b.plan;
            }
            None => self.plan.reset(0, 0),
        }
        &self.plan
    }

    /// [`Engine::write_back_slots`]: [`Sharded::begin_write_back_slots`] completed at once.
    pub fn write_back_slots(&mut self, slots: &[Slot]) -> &Plan {
        match self.begin_write_back_slots(slots) {
            Some(b) => {
                self.complete_writeback(b.ticket, &[]);
                self.plan = b.plan;
            }
            None => self.plan.reset(0, 0),
        }
        &self.plan
    }

    // Warm restart: lines back into global slots.

    /// The error for a line whose key another shard owns: the records were written with
    /// another shard layout (shard count or granule).
    fn misplaced(&self, key: u64, slot: Slot, i: usize) -> EngineError {
        let o = self.shard_of(key);
        EngineError::Config(format!(
            "restore slot {slot}: key {key:#x} belongs to shard {o} (slots {}..{}), not to \
             shard {i}: the cache was written with another shard layout ({} shards, granules \
             of {} bytes now)",
            self.base[o],
            self.base[o + 1],
            self.shards.len(),
            self.granule_bytes()
        ))
    }

    /// [`Engine::restore_line`] at global slot `slot`, which must lie in the shard owning
    /// `key`.
    pub fn restore_line(
        &mut self,
        key: u64,
        slot: Slot,
        valid_mask: u64,
        dirty_mask: u64,
        class: u8,
    ) -> Result<(), EngineError> {
        let (i, s) = self.locate(slot);
        if (slot as u64) < self.capacity_lines() && self.shard_of(key) != i {
            return Err(self.misplaced(key, slot, i));
        }
        self.shards[i]
            .restore_line(key, s, valid_mask, dirty_mask, class)
            .map_err(|e| self.shard_error(i, slot, e))
    }

    /// [`Engine::restore_bulk`] with global slots: refused lines by position in `lines`
    /// (also those in a slot of a shard that does not own their key).
    pub fn restore_bulk(&mut self, lines: &[RestoreLine]) -> Vec<(usize, EngineError)> {
        let n = self.shards.len();
        if n == 1 {
            return self.shards[0].restore_bulk(lines);
        }
        let mut per: Vec<(Vec<usize>, Vec<RestoreLine>)> = vec![Default::default(); n];
        let mut errors = Vec::new();
        let cap = self.capacity_lines();
        for (k, l) in lines.iter().enumerate() {
            let (i, s) = self.locate(l.slot);
            if (l.slot as u64) < cap && self.shard_of(l.key) != i {
                errors.push((k, self.misplaced(l.key, l.slot, i)));
                continue;
            }
            per[i].0.push(k);
            per[i].1.push(RestoreLine { slot: s, ..*l });
        }
        for (i, (at, part)) in per.into_iter().enumerate() {
            for (k, e) in self.shards[i].restore_bulk(&part) {
                let slot = lines[at[k]].slot;
                errors.push((at[k], self.shard_error(i, slot, e)));
            }
        }
        errors.sort_by_key(|e| e.0);
        errors
    }

    /// [`Engine::restore_slots`] with global slots, ascending: each shard's range in turn,
    /// streamed (no copy of the lines). A line in a slot of a shard that does not own its
    /// key is refused.
    pub fn restore_slots(
        &mut self,
        lines: impl IntoIterator<Item = RestoreLine>,
    ) -> (Vec<(Slot, EngineError)>, ShardedRestorePending) {
        let n = self.shards.len();
        if n == 1 {
            let (errors, p) = self.shards[0].restore_slots(lines);
            return (errors, ShardedRestorePending(vec![p]));
        }
        let mut it = lines.into_iter().peekable();
        let gshift = self.granule_lines_shift;
        let mut errors = Vec::new();
        let mut pending = Vec::with_capacity(n);
        for i in 0..n {
            let (lo, hi) = (self.base[i], self.base[i + 1]);
            let last = i + 1 == n;
            let mut misplaced = Vec::new();
            let part = std::iter::from_fn(|| loop {
                let l = it.next_if(|l| last || (l.slot as u64) < hi)?;
                if owner(l.key, gshift, n) != i {
                    misplaced.push(l);
                    continue;
                }
                return Some(RestoreLine {
                    slot: (l.slot as u64 - lo) as Slot,
                    ..l
                });
            });
            let (errs, p) = self.shards[i].restore_slots(part);
            pending.push(p);
            for (s, e) in errs {
                let g = self.global_slot(i, s);
                errors.push((g, self.shard_error(i, g, e)));
            }
            for l in misplaced {
                errors.push((l.slot, self.misplaced(l.key, l.slot, i)));
            }
        }
        errors.sort_by_key(|e| e.0);
        (errors, ShardedRestorePending(pending))
    }

    /// [`Engine::restore_age`] with global slots, oldest first: each shard threads its own
    /// lines in this order.
    pub fn restore_age(&mut self, pending: ShardedRestorePending, age: &[Slot]) {
        let n = self.shards.len();
        assert_eq!(pending.0.len(), n, "restore_age: pending of another engine");
        if n == 1 {
            let p = pending.0.into_iter().next().expect("one shard");
            return self.shards[0].restore_age(p, age);
        }
        let mut per: Vec<Vec<Slot>> = vec![Vec::new(); n];
        for &s in age {
            let (i, l) = self.locate(s);
            per[i].push(l);
        }
        for ((e, p), a) in self.shards.iter_mut().zip(pending.0).zip(per) {
            e.restore_age(p, &a);
        }
    }

    /// [`Engine::restore_sorted`] with global slots.
    pub fn restore_sorted(
        &mut self,
        lines: impl IntoIterator<Item = RestoreLine>,
        age: &[Slot],
    ) -> Vec<(Slot, EngineError)> {
        let (errors, pending) = self.restore_slots(lines);
        self.restore_age(pending, age);
        errors
    }
}
