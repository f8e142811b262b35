//! Device faults: backing-device syncs and the unsynced ranges they cover (rule 4), cache-device
//! errors, the failed cache, lost dirty ranges, the degraded backing device, and pass-through to
//! the backing device.

use super::*;

impl Inner {
    /// Why a closed volume refuses: shut down, or halted by a panic.
    pub(super) fn closed_reason(&self) -> &'static str {
        if self.halted {
            crate::live::HALTED
        } else {
            "the cache volume is shut down"
        }
    }

    /// `[a, b)` of the backing device is about to be written: not durable until the next
    /// backing sync that succeeds.
    pub(super) fn wrote_backing(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        self.hdd_unsynced_bytes += b - a;
        add_range(&mut self.hdd_unsynced, a, b);
    }

    /// `[a, b)`: a failed request's own backing write whose bytes may be old or new after
    /// the sync that failed it (`Inner::hdd_undecided`).
    pub(super) fn wrote_undecided(&mut self, a: u64, b: u64) {
        if a < b {
            add_range(&mut self.hdd_undecided, a, b);
        }
    }

    /// A request is about to read, populate or write `[a, b)` (whole lines): the parts of
    /// it a failed write left undecided count as written since the last good sync from now
    /// on, so a later failed sync writes them again from the cache or reports them lost -
    /// never lets a range a client may have read flip back to older bytes.
    pub(super) fn touch_undecided(&mut self, a: u64, b: u64) {
        if self.hdd_undecided.is_empty() {
            return;
        }
        for (s, e) in overlapping(&self.hdd_undecided, a, b) {
            self.wrote_backing(s.max(a), e.min(b));
        }
        remove_range(&mut self.hdd_undecided, a, b);
    }

    /// `[a, b)` is no longer counted as written since the last good sync (a failed request's
    /// own write of durable bytes: old or new may be read, see `sync_before_reuse`).
    pub(super) fn forget_unsynced(&mut self, a: u64, b: u64) {
        remove_range(&mut self.hdd_unsynced, a, b);
    }

    /// Written to the backing device since its last good sync (a record that says a line is
    /// clean must not reach the cache device before that sync: rule 4).
    pub(super) fn backing_unsynced(&self) -> bool {
        !self.hdd_unsynced.is_empty()
    }

    /// Whether `[a, b)` overlaps a backing range written since the last good sync.
    pub(super) fn unsynced_overlaps(&self, a: u64, b: u64) -> bool {
        self.hdd_unsynced
            .range(..b)
            .next_back()
            .is_some_and(|(_, &e)| e > a)
    }

    /// Too much written to the backing device since its last good sync: a failed sync would
    /// leave too much to write again (or to lose), and the set of ranges must stay small.
    fn unsynced_full(&self) -> bool {
        self.hdd_unsynced.len() >= MAX_UNSYNCED_RANGES
            || self.hdd_unsynced_bytes >= MAX_UNSYNCED_BYTES
    }
}

impl CacheVolume {
    /// Syncs the backing device. A sync that fails may have dropped every write since the
    /// last good one, and a later sync would succeed without them: so the ranges written
    /// since (`Inner::hdd_unsynced`) are written again at once from the cache where it holds
    /// them ([`CacheVolume::rewrite_unsynced`]), the rest reported lost (reads fail until
    /// rewritten, never older bytes); they stay listed until a sync succeeds.
    pub(super) fn sync_backing(&self, g: &mut Inner) -> io::Result<()> {
        self.sync_backing_with(g, &[])
    }

    /// Syncs the backing device when too much was written to it since its last good sync
    /// (`Inner::unsynced_full`): bounds what a failed sync can drop. Called before the
    /// engine plans (a failure here changes nothing).
    pub(super) fn sync_if_full(&self, g: &mut Inner) -> io::Result<()> {
        if g.unsynced_full() {
            self.sync_backoff(g).map_err(|e| self.backing_error(e))?;
            self.sync_backing(g).map_err(|e| self.backing_error(e))?;
        }
        Ok(())
    }

    /// While the backoff of failing backing syncs runs (`Inner::sync_failing`), a request that
    /// needs a sync before it can go on fails at once with the last error instead of asking
    /// the failing device again (each failure also writes every unsynced range again). A
    /// FLUSH, FUA, `ctl flush` or shutdown does not ask this: durability asked for is tried
    /// at once.
    pub(super) fn sync_backoff(&self, g: &Inner) -> io::Result<()> {
        match g.sync_failing.as_ref().filter(|d| !d.due()) {
            Some(d) if g.backing_unsynced() => Err(d.sync_backoff_error()),
            _ => Ok(()),
        }
    }

    /// The background retry of failing backing syncs (the cleaner calls it): when the
    /// backoff has passed, one sync (a failure writes the unsynced ranges again, as any);
    /// success ends the state. No request fails. Whether syncs are (still) failing.
    pub fn retry_sync(&self) -> bool {
        let mut g = self.lock();
        self.retry_sync_locked(&mut g)
    }

    /// While backing syncs fail, reusing a slot may need a sync that fails, and during the
    /// backoff a plan reusing one after backing steps is refused (`exec_plan`): also with
    /// nothing unsynced since the last good sync (the plan's own eviction write-backs come
    /// first). A read miss is then not admitted (the engine's no-allocation path) but served
    /// from the backing device, the cache unchanged, instead of failing on a slot it did not
    /// need. (Blocked only while unsynced writes were listed, a read over lines that missed
    /// was refused by the backoff: checker seeds 188 and 548.) Called before each plan.
    pub(super) fn block_reads_while_syncs_fail(&self, g: &mut Inner) {
        let on = g.sync_failing.is_some();
        if g.engine.read_admission_blocked() != on {
            g.engine.set_read_admission_blocked(on);
        }
    }

    /// Whether a read whose plan failed before changing the cache (`e`) is planned again, not
    /// admitted ([`CacheVolume::block_reads_while_syncs_fail`]): the backing sync its slot
    /// reuse needed failed just now, so the read is served from the backing device instead
    /// of failing. Once only: a plan made with admission blocked is not retried.
    pub(super) fn read_again_uncached(&self, g: &Inner, req: &Request, e: &StepError) -> bool {
        req.op == Op::Read
            && !e.cache
            && g.sync_failing.is_some()
            && !g.engine.read_admission_blocked()
    }

    pub(super) fn retry_sync_locked(&self, g: &mut Inner) -> bool {
        let due = g.sync_failing.as_ref().is_some_and(Degraded::due);
        // An unlocked write-back in flight is committed first (its spans are unsynced).
        if due && !g.closed {
            self.reap(g, false);
            if let Some(e) = g.wb_error.take() {
                tracing::warn!("write-back failed: {e}");
            }
            let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = self.sync_backing(g) {
                tracing::debug!("backing sync retry: {e}");
            }
        }
        g.sync_failing.is_some()
    }

    /// [`CacheVolume::sync_backing`]; `evicting`: `(slot, key, valid)` of lines slots still
    /// hold that the plan being run has not overwritten yet: lines it evicts, or (before its
    /// first cache write) every line of a slot it writes. A failed sync writes them again
    /// from there, before looking at the engine.
    pub(super) fn sync_backing_with(
        &self,
        g: &mut Inner,
        evicting: &[(u32, u64, u64)],
    ) -> io::Result<()> {
        match self.backing.sync() {
            Ok(()) => {
                g.hdd_unsynced.clear();
                g.hdd_undecided.clear();
                g.hdd_unsynced_bytes = 0;
                if Degraded::sync_healed(&mut g.sync_failing) {
                    self.metrics
                        .degraded
                        .store(g.degraded.is_some() as u64, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) => {
                self.metrics
                    .backing_sync_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.rewrite_unsynced(g, &e, evicting);
                Degraded::sync_failed(&mut g.sync_failing, &e);
                self.metrics.degraded.store(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// After a failed backing sync (`why`): writes every range of `hdd_unsynced` again from
    /// the cache's valid sectors of it (the current bytes: a clean or dirty line holds the
    /// newest data); a sector the cache does not hold (write-around, evicted, failed cache),
    /// or whose copy cannot be read or written, is reported lost. `evicting`: see
    /// [`CacheVolume::sync_backing_with`].
    fn rewrite_unsynced(&self, g: &mut Inner, why: &io::Error, evicting: &[(u32, u64, u64)]) {
        let ranges: Vec<(u64, u64)> = g.hdd_unsynced.iter().map(|(&a, &b)| (a, b)).collect();
        let lost_before = g.lost.clone();
        let (sh, ls, ss) = (self.line_shift, self.line_size(), g.engine.sector_size());
        let mut rewritten = 0u64;
        let mut buf = Vec::new();
        for (a, b) in ranges {
            let b = b.min(self.backing.region_end(a));
            if a >= b {
                continue;
            }
            let base0 = a & !VOL_MASK;
            for line in (a & VOL_MASK) >> sh..=((b - 1) & VOL_MASK) >> sh {
                let base = base0 | line << sh;
                let (x, y) = (a.max(base), b.min(base + ls));
                let key = Engine::line_key(vol_of(a), line);
                let (slot, valid) = match g.failed {
                    true => (None, 0),
                    // A slot the plan being run has not written yet holds it (first: the
                    // engine may map the line to a slot the plan writes).
                    false => match evicting.iter().find(|e| e.1 == key) {
                        Some(e) => (Some(e.0), e.2),
                        None => match g.engine.lookup(key) {
                            // Written by the plan being run: may still hold another line.
                            Some(s) if g.in_plan.contains(&s) => (None, 0),
                            Some(s) => (Some(s), g.engine.valid_mask(s)),
                            None => (None, 0),
                        },
                    },
                };
                let held = |at: u64| valid >> ((at - base) / ss) & 1 == 1;
                let mut p = x;
                while p < y {
                    let v = held(p);
                    let mut q = base + ((p - base) / ss + 1) * ss;
                    while q < y && held(q) == v {
                        q += ss;
                    }
                    let q = q.min(y);
                    let held_here = slot.is_some() && v;
                    if !held_here && g.lost.iter().any(|&(l0, l1)| l0 <= p && q <= l1) {
                        // Reported lost at an earlier failed sync already (reads fail until
                        // rewritten): not again at every retry.
                        p = q;
                        continue;
                    }
                    let r = match slot.filter(|_| v) {
                        Some(slot) => {
                            let ssd = ((slot as u64) << sh) + (p - base);
                            buf.resize((q - p) as usize, 0);
                            let exp = Self::expected(g, ssd, q - p);
                            let (k0, k1) = ((p - base) / ss, (q - base).div_ceil(ss));
                            let dropped = g
                                .cache_dropped
                                .get(&slot)
                                .is_some_and(|m| (k0..k1).any(|k| m >> k & 1 == 1));
                            if dropped && exp.is_none() {
                                Err(io::Error::other(
                                    "the cache's copy was written since its last good sync, which failed and may have dropped it",
                                ))
                            } else {
                                self.read_data(ssd, &mut buf, exp.as_ref())
                                    .and_then(|_| self.backing.write_at(&buf, p))
                            }
                        }
                        None => Err(io::Error::other("the cache does not hold them")),
                    };
                    match r {
                        Ok(()) => rewritten += 1,
                        Err(e) => self.lose(
                            g,
                            p,
                            q,
                            &format!(
                                "written to the backing device, whose sync then failed ({why}) and may have dropped them; not written again: {e}"
                            ),
                        ),
                    }
                    p = q;
                }
            }
        }
        tracing::warn!(
            "backing device sync failed ({why}): {rewritten} ranges written since the last good sync written again from the cache, {} lost ranges now",
            g.lost.len()
        );
        if g.lost != lost_before {
            self.persist_lost(g);
        }
    }

    // ---- Device faults -------------------------------------------------------------------
    //
    // A cache-device error never reaches the client by itself: the lines concerned are
    // dropped after their dirty bytes are copied to the backing device, and the request is
    // served by the backing device. Dirty bytes that cannot be copied are *lost*: they are
    // logged, listed in `stats().lost_dirty_ranges`, and reads of them fail (never stale
    // data) until they are written again. After `max_cache_errors` errors (or a failed cache
    // sync in a full flush: FLUSH, FUA, shutdown, mode change) the cache is failed: everything that can be written
    // back is, and every request goes to the backing device. A failed cache sync elsewhere
    // (flagging records in flux, unmapping before reuse) counts as one error: the writes it
    // may have dropped (`cache_unsynced`) are never served or copied unless their data
    // checksums verify; their lines are dropped (dirty sectors reported lost) before the
    // next plan. A backing-device error fails the one request it happened in.

    /// Cache-device errors after which the cache is failed and bypassed.
    pub fn set_max_cache_errors(&self, n: u64) {
        self.max_cache_errors.store(n.max(1), Ordering::Relaxed);
    }

    /// Whether the cache device has been failed (all requests go to the backing device).
    pub fn cache_failed(&self) -> bool {
        self.lock().failed
    }

    /// Whether a failure of the cache, if any, is durable (state file or superblock erase):
    /// a restart then refuses the cache. `false` only for a failed cache recorded nowhere.
    pub fn failure_recorded(&self) -> bool {
        self.lock().failure_unrecorded.is_none()
    }

    /// Volume byte ranges `[start, end)` whose dirty data was lost with the cache device.
    pub fn lost_dirty_ranges(&self) -> Vec<(u64, u64)> {
        self.lock().lost.clone()
    }

    pub(super) fn backing_error(&self, e: io::Error) -> io::Error {
        self.metrics.backing_errors.fetch_add(1, Ordering::Relaxed);
        if degrade::sync_backoff_of(&e).is_some() {
            // Refused during the backoff of failing syncs (the device was not asked; the
            // state is logged where it changes): passed on typed, not logged per request.
            tracing::debug!("request refused during the sync backoff: {e}");
            return e;
        }
        tracing::warn!("backing device error (request failed): {e}");
        io::Error::new(e.kind(), format!("backing device: {e}"))
    }

    /// Counts a cache-device error, fails the cache at the threshold; returns the error for
    /// callers that cannot serve the request otherwise.
    pub(super) fn cache_error(&self, g: &mut Inner, e: io::Error) -> io::Error {
        if data_sums::mismatch(&e).is_some() {
            // Damaged data, not a failing device: the caller dropped the lines (and `recover`
            // recorded damaged dirty sectors as lost); counted apart, never fails the cache.
            return e;
        }
        let max = self.max_cache_errors.load(Ordering::Relaxed);
        if let Some(d) = crate::pool_dev::member_of_error(&e) {
            if !g.failed && d < g.member_errors.len() && g.engine.device_failed(d) {
                // An I/O begun before member d was failed (nothing reaches it now): not an
                // error of the pool, never counted toward failing the whole cache.
                tracing::debug!("pool member {d} (failed already): {e}");
                return io::Error::new(e.kind(), format!("cache device: {e}"));
            }
            if !g.failed && d < g.member_errors.len() && !g.engine.device_failed(d) {
                self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
                g.member_errors[d] += 1;
                let n = g.member_errors[d];
                tracing::warn!(
                    "pool member {d}: cache device error {n} of {max} before it is failed: {e}"
                );
                if n >= max {
                    self.fail_member(g, d, &format!("{n} errors, the last: {e}"));
                    self.flush_after_member_failure(g, d);
                }
                return io::Error::new(e.kind(), format!("cache device: {e}"));
            }
        }
        g.cache_errors += 1;
        self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "cache device error {} of {max} before pass-through: {e}",
            g.cache_errors
        );
        if g.cache_errors >= max && !g.failed {
            self.fail_cache(
                g,
                &format!("{} cache device errors, the last: {e}", g.cache_errors),
            );
        }
        io::Error::new(e.kind(), format!("cache device: {e}"))
    }

    /// Fails member `d` of a pool of cache devices (its errors reached `max_cache_errors`,
    /// or a flush failed on it alone): like [`CacheVolume::fail_cache`] for its lines only.
    /// Its dirty lines are copied to the backing device where readable (else reported lost)
    /// and dropped, its clean lines dropped, its slots leave the engine, and the cache
    /// device (`PoolDev::fail_member`) stops reaching it and records the failure in the
    /// other members' pool blocks before this returns, so no later flush writes a record
    /// while a restart could still restore the failed member's (then stale) records. The
    /// last live member failing, or the failure not recorded, fails the whole cache.
    /// Runs with what the caller holds, like `fail_cache`.
    pub(super) fn fail_member(&self, g: &mut Inner, d: usize, reason: &str) {
        if g.failed || g.engine.device_failed(d) {
            return;
        }
        let live = (0..g.member_errors.len())
            .filter(|&x| !g.engine.device_failed(x))
            .count();
        if live <= 1 {
            self.fail_cache(
                g,
                &format!("the last live pool member {d} failed: {reason}"),
            );
            return;
        }
        // Its lines are dropped: none may be pinned by a write-back in flight.
        self.reap(g, true);
        let range = g.engine.pool().range(d);
        // Dirty lines mirrored on another member (`--dirty-copies 2`) are not written back
        // from this one (it may not answer at all): the engine promotes their copies below.
        let slots: Vec<u32> = range
            .map(|s| s as u32)
            .filter(|&s| {
                g.engine
                    .slot_key(s)
                    .is_some_and(|_| g.engine.dirty_mask(s) != 0)
                    && g.engine.copy_of(s).is_none()
            })
            .collect();
        tracing::error!(
            "pool member {d} failed ({reason}): writing back its {} unmirrored dirty lines, promoting the copies of its mirrored ones, dropping its clean ones, serving on from the other members",
            slots.len()
        );
        let lost_before = g.lost.clone();
        let outer = g.member_failing.replace(d);
        self.recover(g, &[], 0, 0, &[], &slots);
        let loss = match g.engine.fail_device(d) {
            Ok(l) => l,
            Err(e) => {
                // (A fill in flight pins a slot there: tried again at its next error.)
                tracing::warn!("pool member {d} cannot be failed yet: {e}");
                g.member_failing = outer;
                if g.lost != lost_before {
                    // Still in the pool: a list write failing on it fails the cache.
                    self.persist_lost_with(g, false);
                }
                return;
            }
        };
        // Promoted copies are lines now (and lines whose copy was there have one copy):
        // their records follow the engine at the next flush.
        if !loss.unmirrored.is_empty() {
            Self::update_records_of(g, loss.unmirrored.clone());
            tracing::error!(
                "pool member {d}: {} mirrored dirty lines now served from their copies",
                loss.promoted
            );
        }
        // `recover` dropped every unmirrored dirty line there (written back or reported lost).
        debug_assert!(
            loss.uncovered.is_empty(),
            "dirty lines left on failed member {d}"
        );
        let uncovered = !loss.uncovered.is_empty();
        for &(slot, key) in &loss.uncovered {
            let a = key_addr(key, self.line_shift);
            tracing::error!("pool member {d}: dirty line in slot {slot} was not written back");
            self.lose(
                g,
                a,
                a + (1u64 << self.line_shift),
                "its pool member failed",
            );
        }
        // Its slots are never reused while it is failed: nothing of them to sync or drop.
        let r = g.engine.pool().range(d);
        g.cache_unsynced.retain(|&s, _| !r.contains(&u64::from(s)));
        g.cache_dropped.retain(|&s, _| !r.contains(&u64::from(s)));
        let recorded = self.cache.fail_member(d);
        g.member_failing = outer;
        if let Err(e) = recorded {
            self.fail_cache(g, &format!("pool member {d} failed ({reason}) and the other members could not record it: {e}"));
            return;
        }
        tracing::error!(
            "pool member {d} failed: {} clean lines dropped, {} lost ranges now; serving from the other members",
            loss.dropped_clean,
            g.lost.len()
        );
        if uncovered || g.lost != lost_before {
            self.persist_lost(g);
        }
    }

    /// Right after member `d` was failed outside a flush: its failure is durable (the
    /// survivors' pool blocks say `Failed`, so a restart reads none of its records), but
    /// the lines whose copies were promoted are recorded nowhere yet (a copy has no record
    /// of its own to restore from): a crash before the next flush would forget them and
    /// serve the backing device's older bytes, even of FLUSHed writes. So the survivors'
    /// records are made durable now (a flush: data synced, then records), before anything
    /// else is served. A failing flush goes the usual way (another member or the cache
    /// failed, lost ranges recorded).
    fn flush_after_member_failure(&self, g: &mut Inner, d: usize) {
        if g.failed || !g.engine.device_failed(d) {
            return;
        }
        if let Err(e) = self.flush_locked(g) {
            tracing::error!(
                "pool member {d} failed; the flush recording its promoted lines failed: {e}"
            );
        }
    }

    /// `ctl cache replace INDEX PATH` (plan (d)6): failed pool member `d` is replaced by
    /// `dev` (named `name`): formatted as member `d` and made active in the pool's blocks
    /// ([`crate::PoolDev::replace_member`], which refuses a member not failed, a device
    /// that is a live member, or one too small, naming them), its slots emptied in the
    /// record images (its record area was written empty) and revived in the engine. The
    /// cleaner then re-mirrors the dirty lines left with one copy
    /// ([`CacheVolume::remirror`]) before ordinary cleaning.
    pub fn replace_cache_member(
        &self,
        d: usize,
        name: String,
        dev: Box<dyn BlockDev>,
    ) -> Result<(), String> {
        let _owner = self.clean_owner();
        let mut g = self.lock();
        if g.closed {
            return Err(format!("replace cache member {d}: {}", g.closed_reason()));
        }
        if g.failed {
            return Err(format!(
                "replace cache member {d}: the whole cache has failed (pass-through): format it again"
            ));
        }
        let n = g.member_errors.len();
        if n == 0 {
            return Err(format!(
                "replace cache member {d}: one cache device, not a pool of several"
            ));
        }
        if d >= n {
            return Err(format!(
                "replace cache member {d}: the pool has {n} members (0..{})",
                n - 1
            ));
        }
        if !g.engine.device_failed(d) {
            return Err(format!(
                "replace cache member {d} ({}): it is active, not failed (only a failed member is replaced)",
                self.cache.pool_member_names().get(d).cloned().unwrap_or_default()
            ));
        }
        self.reap(&mut g, false);
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.cache.replace_member(d, name, dev)?;
        // Its record area is empty now: no record of its slots is on the device.
        let range = g.engine.pool().range(d);
        for s in range.clone() {
            let s = s as u32;
            g.ahead.remove(&s);
            g.set_disk_key(s, EMPTY_KEY);
        }
        g.engine
            .revive_device(d)
            .map_err(|e| format!("replace cache member {d}: {e}"))?;
        g.member_errors[d] = 0;
        tracing::warn!(
            "pool member {d} replaced: its {} slots are free; {} dirty lines with one copy are re-mirrored by the cleaner",
            range.end - range.start,
            g.engine.unmirrored_lines()
        );
        Ok(())
    }

    /// Per member of a pool of cache devices: (failed, errors counted). Empty: one device.
    pub fn pool_members(&self) -> Vec<(bool, u64)> {
        let g = self.lock();
        g.member_errors
            .iter()
            .enumerate()
            .map(|(d, &n)| (g.failed || g.engine.device_failed(d), n))
            .collect()
    }

    /// Fails the cache: writes back every dirty byte it can, drops every line, and passes
    /// every later request through to the backing device. The superblock is erased (best
    /// effort) so the device is not reopened with records that may be stale: it must be
    /// formatted again. The failure is first recorded in the state file, if there is one
    /// ([`OpenOptions::state_path`]). Returns whether the failure is durable (state file or
    /// erasure); until it is, writes fail ([`CacheVolume::record_failure`]).
    pub(super) fn fail_cache(&self, g: &mut Inner, reason: &str) -> bool {
        // The recovery below drops every line, which a pinned slot forbids: commit a
        // write-back in flight first (it may get here from inside a request's plan, e.g. a
        // backing sync failing in `unmap_before_reuse` whose lost ranges cannot be
        // recorded). `excl`: this recovery, like the one below, runs with whatever the
        // caller holds (a plan holds `io` exclusively: taking it here would deadlock).
        self.reap(g, true);
        tracing::error!(
            "cache device failed after {} errors: writing back dirty data and switching to pass-through",
            g.cache_errors
        );
        let slots: Vec<u32> = g.engine.entries().map(|(_, s, _)| s).collect();
        g.failing = true;
        self.recover(g, &[], 0, 0, &[], &slots);
        g.failing = false;
        // Whatever a failed cache sync may have dropped is no longer cached: its dirty
        // sectors were copied verified or reported lost, its clean copies dropped.
        debug_assert!(
            g.cache_dropped
                .keys()
                .all(|&s| g.engine.slot_key(s).is_none()),
            "a slot written since the failed cache sync still maps a line"
        );
        g.cache_dropped.clear();
        // A failed sync reports lost what it may have dropped (the lines are no longer
        // cached: nothing holds their bytes any more), never serves older bytes.
        if let Err(e) = self.sync_backing(g) {
            tracing::error!("backing device sync after the cache failed: {e}");
        }
        g.failed = true;
        g.engine.set_mode(Mode::PassThrough);
        g.dirty_pages.clear();
        let st = FailState {
            uuid: g.sb.uuid,
            failed_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            reason: reason.to_string(),
            lost: g.lost.clone(),
        };
        let recorded = self.record_failure(&st);
        g.failure_unrecorded = (!recorded).then_some(st);
        self.metrics.cache_failed.store(1, Ordering::Relaxed);
        let bytes: u64 = g.lost.iter().map(|(a, b)| b - a).sum();
        if g.lost.is_empty() {
            tracing::error!("cache failed; no dirty data was lost; now in pass-through");
        } else {
            tracing::error!(
                "cache failed; dirty data LOST in {} ranges, {bytes} bytes (reads of them fail until rewritten): {}",
                g.lost.len(),
                crate::volume_set::ranges_text(&self.vols(), &g.lost)
            );
        }
        recorded
    }

    /// Makes a failure of the cache durable: the state file (if any) first, then the
    /// superblock erase. Returns whether at least one of them is durable. A failed cache
    /// whose failure is not durable anywhere could be reopened after a restart with records
    /// older than what passed through to the backing device since; so writes (and trims)
    /// fail with EIO until a retry here succeeds (reads and flushes still pass through: they
    /// acknowledge nothing new). Failing writes is visible and loses nothing acknowledged;
    /// passing them through would let a restart serve stale data over acknowledged writes.
    fn record_failure(&self, st: &FailState) -> bool {
        degrade::record_failure(self.state_path.as_deref(), &*self.cache, st)
    }

    /// A plan failed in its backing-first phase (nothing in the cache changed): rolls the
    /// engine back to `mem` for `slots`; when the failure was a backing write-back, enters
    /// (or stays in) the degraded state. Returns whether the request should be planned again
    /// (dirty evictions were just blocked).
    pub(super) fn failed_before_cache(
        &self,
        g: &mut Inner,
        steps: &[Step],
        e: &StepError,
        slots: &[u32],
    ) -> bool {
        debug_assert!(e.before_cache);
        self.roll_back(g, slots);
        self.undo_backing_writes(g, steps);
        let write_back = matches!(steps.get(e.index), Some(Step::WriteBack { .. }));
        if e.cache || !write_back {
            return false;
        }
        let was_blocked = g.engine.dirty_evictions_blocked();
        self.enter_degraded(g, &e.err);
        !was_blocked
    }

    /// After a plan failed before changing the cache and was rolled back: its backing-first
    /// phase may have written (part of) its `WriteHdd` ranges (one step landed, a later one
    /// failed: soak seed 70), while the lines the cache held there keep their old bytes as
    /// clean. Those clean sectors are written again over the failed write's bytes, so the
    /// backing device matches them (the failed write reads old, also once evicted or after
    /// a restart); a sector that cannot be is no longer cached (read from the backing
    /// device from then on). Dirty sectors and those of a write-back in flight are left
    /// alone (the backing copy is not theirs).
    fn undo_backing_writes(&self, g: &mut Inner, steps: &[Step]) {
        let (sh, ss) = (self.line_shift, g.engine.sector_size());
        let ls = 1u64 << sh;
        let mut buf = Vec::new();
        for s in steps {
            let Step::WriteHdd { hdd, len, .. } = *s else {
                continue;
            };
            if len == 0 {
                continue;
            }
            let base0 = hdd & !VOL_MASK;
            for line in (hdd & VOL_MASK) >> sh..=((hdd + len - 1) & VOL_MASK) >> sh {
                let key = Engine::line_key(vol_of(hdd), line);
                let Some(slot) = g.engine.lookup(key) else {
                    continue;
                };
                let e = &g.engine;
                let clean = e.valid_mask(slot) & !(e.dirty_mask(slot) | e.pending_mask(slot));
                let base = base0 | line << sh;
                let (x, y) = (hdd.max(base), (hdd + len).min(base + ls));
                let mut failed = 0u64;
                let mut p = x;
                while p < y {
                    let k = (p - base) / ss;
                    let q = (base + (k + 1) * ss).min(y);
                    if clean >> k & 1 == 1 {
                        let ssd = ((slot as u64) << sh) + (p - base);
                        buf.resize((q - p) as usize, 0);
                        let exp = Self::expected(g, ssd, q - p);
                        g.wrote_backing(p, q);
                        let r = self
                            .read_data(ssd, &mut buf, exp.as_ref())
                            .and_then(|_| self.backing.write_at(&buf, p));
                        if let Err(err) = r {
                            tracing::warn!(
                                "a failed write's backing range {p}..{q} could not be given back the cached bytes ({err}): no longer cached"
                            );
                            failed |= 1 << k;
                        }
                    }
                    p = q;
                }
                if failed != 0 {
                    let (valid, dirty) = (g.engine.valid_mask(slot), g.engine.dirty_mask(slot));
                    let class = g.engine.line_class(slot);
                    g.engine.drop_line(slot);
                    if valid & !failed != 0 {
                        if let Err(err) =
                            g.engine
                                .restore_line(key, slot, valid & !failed, dirty, class)
                        {
                            assert!(
                                dirty == 0,
                                "dirty line {key:#x} in slot {slot} could not be restored: {err}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A write-back failed on the backing device: dirty lines stay dirty, dirty evictions
    /// are blocked, the next retry is due after the backoff (doubling up to [`degrade::RETRY_MAX`]).
    pub(super) fn enter_degraded(&self, g: &mut Inner, e: &io::Error) {
        self.metrics
            .backing_write_errors
            .fetch_add(1, Ordering::Relaxed);
        Degraded::failed(&mut g.degraded, e);
        g.engine.set_dirty_evictions_blocked(true);
        self.metrics.degraded.store(1, Ordering::Relaxed);
    }

    /// Write-backs succeed again: dirty evictions are allowed again.
    pub(super) fn leave_degraded(&self, g: &mut Inner) {
        if Degraded::healed(&mut g.degraded) {
            g.engine.set_dirty_evictions_blocked(false);
            self.metrics
                .degraded
                .store(g.sync_failing.is_some() as u64, Ordering::Relaxed);
        }
    }

    /// Whether write-backs are failing on the backing device (see [`VolumeStats::degraded`]).
    pub fn degraded(&self) -> bool {
        self.lock().degraded.is_some()
    }

    /// Whether backing syncs are failing (see `Inner::sync_failing`).
    pub fn sync_failing(&self) -> bool {
        self.lock().sync_failing.is_some()
    }

    /// [`CacheVolume::settle_dropped`] after the hits reading data outside the volume lock
    /// are done (the `io` lock, taken exclusively only when there is something to settle).
    pub(super) fn settle_dropped_exclusive(&self, g: &mut Inner) {
        if !g.cache_dropped.is_empty() {
            let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
            // Its recovery drops lines: none may be pinned.
            self.reap(g, true);
            self.settle_dropped(g);
        }
    }

    /// Drops the lines of the slots a failed cache sync may have dropped writes of
    /// (`Inner::cache_dropped`): their dirty sectors are copied to the backing device only
    /// where the data checksums verify them, else reported lost (reads fail until
    /// rewritten); their clean copies are read again from the backing device. Called where
    /// no plan or write-back is under way (before the engine plans, before a flush).
    pub(super) fn settle_dropped(&self, g: &mut Inner) {
        if g.cache_dropped.is_empty() {
            return;
        }
        // Their lines are dropped: none may be pinned by a fill in flight.
        self.reap_fills(g);
        // A copy whose writes may be dropped no longer holds its line's dirty sectors: the
        // line keeps one copy (its copy record is emptied, never paired at a restart).
        let copies: Vec<u32> = g
            .cache_dropped
            .keys()
            .filter_map(|&c| g.engine.owner_of(c))
            .collect();
        let mut moved = Vec::new();
        for p in copies {
            moved.extend(g.engine.unmirror(p));
        }
        // A mirrored dirty line whose primary's writes may be dropped (its member's sync
        // failed) while its copy's were synced (another member, whose sync succeeded): the
        // copy holds every acknowledged sector durably and becomes the line. Nothing of it
        // is lost, nothing read from the member whose sync failed.
        let saved: Vec<u32> = g
            .cache_dropped
            .keys()
            .copied()
            .filter(|&s| {
                g.engine
                    .copy_of(s)
                    .is_some_and(|c| !g.cache_dropped.contains_key(&c))
            })
            .collect();
        for s in saved {
            let to = g.engine.promote_copy_of(s);
            debug_assert!(to.is_some(), "slot {s}: pinned after the reaps");
            moved.extend(to.map(|to| [s, to]).into_iter().flatten());
        }
        if !moved.is_empty() {
            // The image follows at once: a plan rolled back later restores what the image
            // says (a line at its old slot, where it no longer is; a copy linked again
            // whose writes may be dropped).
            Self::update_records_of(g, moved);
        }
        if !g.failed {
            let slots: Vec<u32> = g
                .cache_dropped
                .keys()
                .copied()
                .filter(|&s| g.engine.slot_key(s).is_some())
                .collect();
            tracing::error!(
                "a cache device sync failed and may have dropped the data written since the last good one: dropping {} cached lines written since (their dirty sectors are kept only if verified, else reported lost)",
                slots.len()
            );
            self.recover(g, &[], 0, 0, &[], &slots);
            assert!(
                slots.iter().all(|&s| g.engine.slot_key(s).is_none()),
                "a line a failed cache sync may have dropped is still cached"
            );
        }
        g.cache_dropped.clear();
    }

    /// Records `[a, b)` as lost dirty data.
    fn lose(&self, g: &mut Inner, a: u64, b: u64, why: &str) {
        let vols = self.vols();
        let name = crate::volume_set::name_of(&vols, crate::volume_set::vol_of(a));
        degrade::lose_named(&mut g.lost, a, b, self.backing.region_end(a), why, name);
        // Reads of a lost range fail: the RAM tier must not answer them.
        if let Some(r) = &self.ram {
            r.clear();
        }
        self.metrics
            .lost_dirty_bytes
            .store(degrade::lost_bytes(&g.lost), Ordering::Relaxed);
    }

    /// `[a, b)` was written (or trimmed) again: no longer lost.
    pub(super) fn unlose(&self, g: &mut Inner, a: u64, b: u64) {
        if degrade::unlose(&mut g.lost, a, b) {
            if let Some(s) = g.sums.as_mut() {
                s.header_dirty = true;
            }
        }
        self.metrics
            .lost_dirty_bytes
            .store(degrade::lost_bytes(&g.lost), Ordering::Relaxed);
    }

    /// After step `failed` of `steps` went wrong (steps before it completed): redoes the
    /// write-backs not done, copies to the backing device the dirty bytes of every line in a
    /// slot an unfinished step touched or in `extra` (from `buf` when an unfinished step was
    /// to put them in the cache and the buffer holds them complete), drops those lines, and
    /// records as lost what could not be copied. `buf_start`: the buffer's first byte as a
    /// backing address (`vaddr`: it carries the request's volume).
    pub(super) fn recover(
        &self,
        g: &mut Inner,
        steps: &[Step],
        failed: usize,
        buf_start: u64,
        buf: &[u8],
        extra: &[u32],
    ) {
        let ls = 1u64 << self.line_shift;
        let mut tmp = Vec::new();
        let lost_before = g.lost.clone();
        let rest = steps.get(failed..).unwrap_or(&[]);
        for s in rest {
            if let Step::WriteBack { ssd, hdd, len, .. } = *s {
                tmp.resize(len as usize, 0);
                g.wrote_backing(hdd, hdd + len);
                let r = self
                    .read_saving(g, ssd, &mut tmp, rest)
                    .and_then(|_| self.backing.write_at(&tmp, hdd));
                if let Err(e) = r {
                    self.lose(g, hdd, hdd + len, &format!("write-back failed: {e}"));
                }
            }
        }
        let mut slots: BTreeSet<u32> = extra.iter().copied().collect();
        for s in rest {
            if let Some((ssd, len)) = ssd_range(s) {
                slots.extend(
                    (ssd >> self.line_shift) as u32..=((ssd + len - 1) >> self.line_shift) as u32,
                );
            }
        }
        // Unfinished steps that were to write the cache from the buffer: (ssd range, buf offset).
        let unfinished: Vec<(u64, u64, Option<u64>)> = rest
            .iter()
            .filter_map(|s| match *s {
                Step::WriteSsd { ssd, buf: b, len } => Some((ssd, ssd + len, Some(b))),
                Step::Populate { ssd, len, .. } => Some((ssd, ssd + len, None)),
                _ => None,
            })
            .collect();
        // Whether every step filling buf[a..b) completed.
        let filled = |a: u64, b: u64| {
            !rest.iter().any(|s| match *s {
                Step::ReadSsd { buf: x, len, .. } | Step::ReadHdd { buf: x, len, .. } => {
                    x < b && a < x + len
                }
                _ => false,
            })
        };
        let ss = g.engine.sector_size();
        for &slot in &slots {
            let Some(key) = g.engine.slot_key(slot) else {
                continue;
            };
            let line_vol = key_addr(key, self.line_shift);
            let base = slot as u64 * ls;
            let dirty = g.engine.dirty_mask(slot);
            for k in 0..64u64 {
                if dirty >> k & 1 == 0 || k * ss >= ls {
                    continue;
                }
                let (a, b) = (base + k * ss, base + (k + 1) * ss);
                // Pieces of the sector, split where unfinished steps begin or end.
                let mut cuts = vec![a, b];
                for &(x, y, _) in &unfinished {
                    cuts.extend([x, y].into_iter().filter(|&c| a < c && c < b));
                }
                cuts.sort_unstable();
                cuts.dedup();
                for w in cuts.windows(2) {
                    let (p, q) = (w[0], w[1]);
                    let vol = line_vol + (p - base);
                    let step = unfinished.iter().find(|(x, y, _)| *x <= p && q <= *y);
                    g.wrote_backing(vol, vol + (q - p));
                    let r = match step {
                        // Bytes an unfinished step was to write from the buffer: there, if
                        // every fill of that part of the buffer completed.
                        Some(&(x, _, Some(bo))) => {
                            let at = bo + (p - x);
                            if (at + q - p) as usize <= buf.len()
                                && vol == buf_start + at
                                && filled(at, at + q - p)
                            {
                                self.backing
                                    .write_at(&buf[at as usize..(at + q - p) as usize], vol)
                            } else {
                                Err(io::Error::other("its new bytes never reached the cache"))
                            }
                        }
                        // A population copies the backing device's own bytes.
                        Some((_, _, None)) => Ok(()),
                        None => {
                            tmp.resize((q - p) as usize, 0);
                            // A damaged sector is lost, never copied (`crate::data_sums`).
                            let exp = Self::expected(g, p, q - p);
                            // Written since the last good cache sync, which then failed: the
                            // slot may hold older bytes; copied only if they verify.
                            let dropped =
                                g.cache_dropped.get(&slot).is_some_and(|m| m >> k & 1 == 1);
                            if g.in_plan.contains(&slot) {
                                // The cache failed in the middle of a plan (a sync it ran
                                // failed) that maps this slot to its line already but may
                                // not have written it yet: the slot may hold another line's
                                // bytes, or none (soak seed 3562).
                                Err(io::Error::other(
                                    "the cache failed before the request being served had written them to the cache",
                                ))
                            } else if dropped && exp.is_none() {
                                Err(io::Error::other(
                                    "written to the cache since its last good sync, which failed and may have dropped it (no data checksums to verify the cached copy)",
                                ))
                            } else {
                                self.read_saving(g, p, &mut tmp, rest)
                                    .and_then(|_| self.backing.write_at(&tmp, vol))
                            }
                        }
                    };
                    if let Err(e) = r {
                        self.lose(
                            g,
                            vol,
                            vol + (q - p),
                            &format!("dirty bytes not saved: {e}"),
                        );
                    }
                }
            }
            g.engine.drop_line(slot);
        }
        let mut v = std::mem::take(&mut g.slots);
        v.clear();
        v.extend(slots);
        g.slots = v;
        Self::update_records(g);
        if g.lost != lost_before {
            self.persist_lost(g);
        }
    }

    /// Reads `out.len()` bytes of the data area at `ssd` (verified as
    /// [`CacheVolume::read_data`] does). When that fails, each line of the range that has a
    /// copy on another pool member (`--dirty-copies 2`) is read from the copy, if the copy is
    /// current: no step still to write it is in `rest` (the unfinished steps of a failed
    /// plan), it is not in a plan that may not have written it, and no failed cache sync may
    /// have dropped it (unless data checksums verify it). A dying member fails reads too: the
    /// dirty bytes of its mirrored lines are then saved from their copies instead of being
    /// reported lost (found by cli deployment.rs: a whole pool failed over a member's errors
    /// lost the lines whose readable copy was on the healthy member).
    fn read_saving(&self, g: &Inner, ssd: u64, out: &mut [u8], rest: &[Step]) -> io::Result<()> {
        let exp = Self::expected(g, ssd, out.len() as u64);
        let e = match self.read_data(ssd, out, exp.as_ref()) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if g.engine.copy_slot_count() == 0 {
            return Err(e);
        }
        let ls = 1u64 << self.line_shift;
        let end = ssd + out.len() as u64;
        let mut at = ssd;
        while at < end {
            let slot = (at >> self.line_shift) as u32;
            let n = ((slot as u64 + 1) * ls).min(end) - at;
            let piece = &mut out[(at - ssd) as usize..(at - ssd + n) as usize];
            let from = g
                .engine
                .copy_of(slot)
                .map(|c| c as u64 * ls + (at - slot as u64 * ls));
            let usable = from.filter(|&c| {
                let cs = (c >> self.line_shift) as u32;
                let pending = rest
                    .iter()
                    .filter_map(ssd_range)
                    .any(|(x, len)| x < c + n && c < x + len);
                let dropped = g.cache_dropped.contains_key(&cs) && g.sums.is_none();
                !pending && !dropped && !g.in_plan.contains(&cs)
            });
            let r = match usable {
                Some(c) => {
                    debug_assert_ne!(
                        g.engine.pool().member_of(u64::from(slot)),
                        g.engine.pool().member_of(c >> self.line_shift),
                        "a line and its copy on one member"
                    );
                    let exp = Self::expected(g, c, n);
                    self.read_data(c, piece, exp.as_ref())
                }
                None => {
                    let exp = Self::expected(g, at, n);
                    self.read_data(at, piece, exp.as_ref())
                }
            };
            if r.is_err() {
                return Err(e);
            }
            at += n;
        }
        tracing::warn!(
            "cache read of {} bytes at {ssd} failed ({e}): saved from the lines' copies on another pool member",
            out.len()
        );
        Ok(())
    }

    /// The ranges a pool of cache devices started without the dirty data of
    /// (`BlockDev::lost_at_open`, `--accept-lost-dirty`): recorded lost, durably, before the
    /// volume serves (reads of them fail with EIO until written again).
    pub(super) fn lose_at_open(&self, g: &mut Inner, ranges: &[(u64, u64)]) -> io::Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        for &(a, b) in ranges {
            self.lose(
                g,
                a,
                b,
                "its dirty data may have been on a pool member left out at start (--accept-lost-dirty)",
            );
        }
        self.persist_lost(g);
        if g.failed {
            return Err(ioerr(
                "the lost ranges of a pool member left out could not be recorded: the cache failed",
            ));
        }
        Ok(())
    }

    /// Makes `g.lost` durable now (write and sync), before the volume serves anything else
    /// and before any record that drops a damaged line can reach the device: after a
    /// restart the ranges still read EIO, never the backing device's older copy. In the
    /// lost-range list (`crate::lost_list`; what it listed stays listed until a flush makes
    /// the data replacing it durable) and, with data checksums, their region's header.
    /// If the list cannot be written the cache is failed: the failure and the lost ranges
    /// are then recorded in the state file, and the next start is refused naming them.
    /// A failed cache needs neither (its state file holds the ranges lost with it).
    ///
    /// In a pool, a list write failing on one member (a dying device) fails that member
    /// alone, and the list is then written on the others: the whole pool failing over it
    /// would write back from the dying member lines whose readable copies are elsewhere.
    fn persist_lost(&self, g: &mut Inner) {
        self.persist_lost_with(g, true)
    }

    /// [`CacheVolume::persist_lost`]; `member_route`: a failure on one pool member may fail
    /// that member alone (false: the member could not be failed, the cache fails).
    fn persist_lost_with(&self, g: &mut Inner, member_route: bool) {
        if g.failed || g.failing || (g.list.is_none() && g.sums.is_none()) {
            return;
        }
        if g.member_failing.is_some() {
            // `fail_member` makes them durable once the member is out of the pool.
            return;
        }
        let lost = g.lost.clone();
        let mut r = Ok(());
        let grows = g
            .list
            .as_ref()
            .is_some_and(|l| !crate::lost_list::covers(&l.ranges, &lost));
        let raises_pending = grows && !g.sb.lost_pending;
        if raises_pending {
            // The superblock first says version 4: a build that ignores the list refuses
            // the cache before the list holds anything it would serve stale bytes for.
            g.sb.lost_pending = true;
            g.sb.version = g.sb.current_version();
            r = self.write_superblock(g);
        }
        if let (true, Some(l)) = (grows, g.list.as_mut()) {
            let want = crate::lost_list::union(&l.ranges, &lost);
            r = r.and_then(|_| l.write(&*self.cache, &want));
        }
        if let Some(s) = g.sums.as_mut() {
            s.lost = lost;
            r = r.and_then(|_| s.write_header(&*self.cache));
        }
        let r = r.and_then(|_| self.sync_cache(g));
        if let Err(e) = r {
            if let Some(s) = g.sums.as_mut() {
                s.header_dirty = true;
            }
            let member = crate::pool_dev::member_of_error(&e).filter(|&d| {
                member_route && d < g.member_errors.len() && !g.engine.device_failed(d)
            });
            if let Some(d) = member {
                tracing::error!(
                    "could not record the lost ranges on pool member {d} ({e}): failing that member, then recording them on the others"
                );
                self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
                g.member_errors[d] += 1;
                if raises_pending {
                    // A pool's replicated writes stop at the failing member: the others'
                    // superblock may not say so yet, so the retry writes it again (the list
                    // itself keeps its old ranges until a write succeeds: it is rewritten).
                    g.sb.lost_pending = false;
                }
                // Records them on the others at its end (or fails the cache).
                self.fail_member(
                    g,
                    d,
                    &format!("the lost-range list could not be written to it: {e}"),
                );
                if g.failed || g.engine.device_failed(d) {
                    self.flush_after_member_failure(g, d);
                    return;
                }
            }
            tracing::error!(
                "could not record the lost ranges on the cache device ({e}): failing the cache so that the state file records them"
            );
            g.cache_errors += 1;
            self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
            self.fail_cache(g, &format!("the lost-range list could not be written: {e}"));
        }
    }

    /// At a flush, after the data written since the last one is durable (backing and cache
    /// synced, records written): the list drops the ranges written again since, and is
    /// synced. A crash before keeps them listed (reads EIO), never older bytes.
    pub(super) fn clear_rewritten_lost(&self, g: &mut Inner) -> io::Result<()> {
        let lost = g.lost.clone();
        let Some(l) = g.list.as_mut() else {
            return Ok(());
        };
        if l.ranges == lost {
            return Ok(());
        }
        debug_assert!(
            crate::lost_list::covers(&l.ranges, &lost),
            "a lost range not in the durable list at a flush"
        );
        l.write(&*self.cache, &lost)?;
        self.sync_cache(g)?;
        if lost.is_empty() && g.sb.lost_pending {
            // The list is durably empty: older builds may open the cache again.
            g.sb.lost_pending = false;
            g.sb.version = g.sb.current_version();
            self.write_superblock(g)?;
        }
        Ok(())
    }

    /// A plan failed at `e`: recovers the cache's state, then fails the request (backing
    /// error) or serves it from the backing device (cache error).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_failure(
        &self,
        g: &mut Inner,
        req: &Request,
        data: Data<'_>,
        steps: &[Step],
        e: StepError,
        buf_start: u64,
        buf: &[u8],
        touched: &[u32],
    ) -> io::Result<()> {
        let pending = e.pending(steps);
        let (touched, mirrored) = match e.cache {
            true => self.save_from_copies(g, &e.err, touched),
            false => (touched.to_vec(), false),
        };
        // `recover` compares backing addresses, which carry the volume.
        let buf_start = super::vaddr(req.volume, buf_start);
        self.recover(g, &pending, 0, buf_start, buf, &touched);
        if !e.cache {
            return Err(self.backing_error(e.err));
        }
        self.cache_error(g, e.err);
        self.direct_then_sync(g, req, data, mirrored)
    }

    /// A plan (or its record writes) failed on pool member `d` (`e` names it) while the pool
    /// mirrors dirty lines (`--dirty-copies 2`; plan-multi-cache (c)7): before the lines of
    /// `slots` are written back and dropped ([`CacheVolume::recover`]), the mirrored dirty
    /// lines whose primary is on `d` become their copies on another member, so their older
    /// dirty sectors are read from there, never from the failing member (a dying member's
    /// reads fail too: they were reported lost). Lines whose copy is on `d` are read from
    /// their primary as before. Returns the slots to recover (with the freed slots and the
    /// copies of the touched lines, whose records follow) and whether the pool mirrors:
    /// then the request is acknowledged only once its bytes are on the synced backing
    /// device ([`CacheVolume::direct_then_sync`]), so an acknowledged write always has two
    /// cache copies or is on the backing device.
    pub(super) fn save_from_copies(
        &self,
        g: &mut Inner,
        e: &io::Error,
        slots: &[u32],
    ) -> (Vec<u32>, bool) {
        let mut out = slots.to_vec();
        let Some(d) = crate::pool_dev::member_of_error(e) else {
            return (out, false);
        };
        if g.failed || g.engine.config().dirty_copies < 2 {
            return (out, false);
        }
        // (The callers committed the write-back in flight: a line it pinned would not be
        // promoted.)
        let mut freed = Vec::new();
        for x in out.iter_mut() {
            let s = *x;
            let Some(c) = g.engine.copy_of(s) else {
                continue;
            };
            freed.push(c);
            if g.engine.pool().member_of(u64::from(s)) != d {
                continue;
            }
            if let Some(to) = g.engine.promote_copy_of(s) {
                freed.push(s);
                *x = to;
            }
        }
        out.extend(freed);
        (out, true)
    }

    /// [`CacheVolume::direct`], then for a write or trim with `sync` the backing device is
    /// synced before the request is acknowledged (see [`CacheVolume::save_from_copies`]).
    pub(super) fn direct_then_sync(
        &self,
        g: &mut Inner,
        req: &Request,
        data: Data<'_>,
        sync: bool,
    ) -> io::Result<()> {
        let write = matches!(data, Data::Write(_)) || req.op == Op::Trim;
        self.direct(g, req, data)?;
        if sync && write && !g.failed {
            self.sync_backing(g).map_err(|e| self.backing_error(e))?;
        }
        Ok(())
    }

    /// A read's plan failed on pool member `d` (`--dirty-copies 2`): the mirrored dirty
    /// lines it touched on `d` become their copies on another member (never written back
    /// from the failing member nor reported lost), the other touched lines are recovered as
    /// [`CacheVolume::after_failure`] does, and the error is counted. `Ok`: the caller plans
    /// the read again (locks dropped); `Err(e)`: nothing was promoted, nothing changed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn promote_after_read_failure(
        &self,
        g: &mut Inner,
        req: &Request,
        steps: &[Step],
        e: StepError,
        buf_start: u64,
        buf: &[u8],
        touched: &[u32],
    ) -> Result<(), StepError> {
        let Some(d) = crate::pool_dev::member_of_error(&e.err) else {
            return Err(e);
        };
        if req.op != Op::Read || !e.cache || g.failed {
            return Err(e);
        }
        let on_d = |g: &Inner, s: u32| {
            g.engine.pool().member_of(u64::from(s)) == d && g.engine.copy_of(s).is_some()
        };
        if !touched.iter().any(|&s| on_d(g, s)) {
            return Err(e);
        }
        self.reap(g, true);
        let mut promoted = Vec::new();
        let mut rest = Vec::new();
        for &s in touched {
            match on_d(g, s).then(|| g.engine.promote_copy_of(s)).flatten() {
                Some(to) => promoted.extend([s, to]),
                None => rest.push(s),
            }
        }
        let pending = e.pending(steps);
        let buf_start = super::vaddr(req.volume, buf_start);
        self.recover(g, &pending, 0, buf_start, buf, &rest);
        Self::update_records_of(g, promoted);
        self.cache_error(g, e.err);
        Ok(())
    }

    /// A hit's cache read failed: drops the request's lines (saving their dirty bytes) and
    /// reads from the backing device.
    pub(super) fn read_fallback(
        &self,
        req: &Request,
        out: &mut [u8],
        e: io::Error,
    ) -> io::Result<()> {
        let mut g = self.lock();
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        // The recovery below drops the request's lines: none may be pinned.
        self.reap(&mut g, true);
        if !g.failed {
            let e = self.on_mismatch(&g, e);
            let (first, last) = (
                req.offset >> self.line_shift,
                (req.end() - 1) >> self.line_shift,
            );
            let mut slots: Vec<u32> = (first..=last)
                .filter_map(|l| g.engine.lookup(Engine::line_key(req.volume, l)))
                .collect();
            // Mirrored dirty lines (`--dirty-copies 2`) on the member that failed the read:
            // their copies on another member become the lines (never written back from the
            // failing member, nor reported lost), and the read is planned again on them.
            let mut promoted: Vec<u32> = Vec::new();
            if let Some(d) = crate::pool_dev::member_of_error(&e) {
                slots.retain(|&s| {
                    if g.engine.pool().member_of(u64::from(s)) != d {
                        return true;
                    }
                    match g.engine.promote_copy_of(s) {
                        Some(to) => {
                            promoted.extend([s, to]);
                            false
                        }
                        None => true,
                    }
                });
            }
            self.recover(&mut g, &[], 0, 0, &[], &slots);
            let retry = !promoted.is_empty();
            if retry {
                Self::update_records_of(&mut g, promoted);
            }
            self.cache_error(&mut g, e);
            if retry {
                drop(_excl);
                drop(g);
                return self.run(req, Data::Read(out));
            }
        }
        let (a, b) = (vaddr(req.volume, req.offset), vaddr(req.volume, req.end()));
        lost_check(&g.lost, a, b)?;
        self.backing
            .read_at(out, a)
            .map_err(|e| self.backing_error(e))
    }

    /// Serves a request from the backing device alone (the cache holds none of its lines).
    pub(super) fn direct(&self, g: &mut Inner, req: &Request, data: Data<'_>) -> io::Result<()> {
        if g.failed
            && (matches!(data, Data::Write(_)) || req.op == Op::Trim)
            && g.failure_unrecorded.is_some()
        {
            let st = g.failure_unrecorded.take().unwrap();
            if !self.record_failure(&st) {
                g.failure_unrecorded = Some(st);
                return Err(degrade::unrecorded_error(self.state_path.as_deref()));
            }
        }
        let (a, b) = (vaddr(req.volume, req.offset), vaddr(req.volume, req.end()));
        match data {
            Data::Read(out) => {
                lost_check(&g.lost, a, b)?;
                self.backing
                    .read_at(out, a)
                    .map_err(|e| self.backing_error(e))
            }
            Data::Write(d) => {
                g.wrote_backing(a, b);
                self.backing
                    .write_at(d, a)
                    .map_err(|e| self.backing_error(e))?;
                self.unlose(g, a, b);
                if req.fua {
                    // Also makes the dropped lines' records durable, so no restart maps
                    // them to older bytes.
                    self.flush_locked(g)?;
                }
                Ok(())
            }
            Data::None if req.op == Op::Flush => self.flush_locked(g),
            Data::None => {
                if req.op == Op::Trim {
                    self.unlose(g, a, b);
                }
                Ok(())
            }
        }
    }

    /// Failed cache: everything goes to the backing device.
    pub(super) fn run_direct(
        &self,
        g: &mut Inner,
        req: &Request,
        data: Data<'_>,
    ) -> io::Result<()> {
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.direct(g, req, data)
    }
}

/// Adds `[a, b)` to a set of disjoint, merged ranges (start -> end).
fn add_range(m: &mut BTreeMap<u64, u64>, a: u64, b: u64) {
    let (mut a, mut b) = (a, b);
    if let Some((&s, &e)) = m.range(..=a).next_back() {
        if e >= a {
            a = s;
            b = b.max(e);
            m.remove(&s);
        }
    }
    while let Some((&s, &e)) = m.range(a..).next() {
        if s > b {
            break;
        }
        b = b.max(e);
        m.remove(&s);
    }
    m.insert(a, b);
}

/// Takes `[a, b)` out of a set of disjoint ranges (start -> end).
fn remove_range(m: &mut BTreeMap<u64, u64>, a: u64, b: u64) {
    for (s, e) in overlapping(m, a, b) {
        m.remove(&s);
        if s < a {
            m.insert(s, a);
        }
        if e > b {
            m.insert(b, e);
        }
    }
}

/// The ranges of a set of disjoint ranges (start -> end) that overlap `[a, b)`.
fn overlapping(m: &BTreeMap<u64, u64>, a: u64, b: u64) -> Vec<(u64, u64)> {
    m.range(..b)
        .rev()
        .take_while(|(_, &e)| e > a)
        .map(|(&s, &e)| (s, e))
        .collect()
}
