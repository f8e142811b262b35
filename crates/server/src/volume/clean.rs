//! Cleaning: write-back passes (watermarks, rate, inline cleaning), unmapping ahead, the background
//! cleaner, and `ctl flush` (`flush_dirty`).

use super::exec::{merge_write_backs, written_back, WbIoError};
use super::*;

/// Lines re-mirrored per pass of the cleaner (under the volume lock: a few ms of copying).
pub(super) const REMIRROR_PASS_LINES: u64 = 64;

impl CacheVolume {
    /// Inline cleaning (see the field): the deterministic order `tiercache sim` follows, so
    /// a queue-depth-1 replay gives the simulator's counts exactly; the background cleaner
    /// (the default) keeps write-backs off the request path instead.
    pub fn set_inline_cleaning(&self, on: bool) {
        self.inline_cleaning.store(on, Ordering::Relaxed);
    }

    /// Cleaning's chunk rewrite (`Engine::set_chunk_rewrite`): chunk bytes (0 = off) and
    /// the dirty runs from which a chunk is rewritten in one backing write.
    pub fn set_chunk_rewrite(&self, chunk: u64, min_runs: u64) -> io::Result<()> {
        self.lock()
            .engine
            .set_chunk_rewrite(chunk, min_runs)
            .map_err(ioerr)
    }

    /// Whether cleaning runs inline (see [`CacheVolume::set_inline_cleaning`]).
    pub fn inline_cleaning(&self) -> bool {
        self.inline_cleaning.load(Ordering::Relaxed)
    }

    /// Writes back every dirty line (under the lock).
    pub(super) fn clean_all(&self, g: &mut Inner) -> io::Result<()> {
        while g.engine.dirty_lines() > 0 {
            match self.clean_pass(g, 1024) {
                // The damaged line was dropped (its damaged sectors recorded as lost, the
                // rest written back): the next pass makes progress.
                Err(e) if data_sums::mismatch(&e).is_some() => continue,
                r => r?,
            }
        }
        Ok(())
    }

    pub(super) fn clean_pass(&self, g: &mut Inner, n: u64) -> io::Result<()> {
        assert!(
            g.wb.is_none(),
            "a locked cleaning pass while a write-back is in flight (it would see its lines clean)"
        );
        self.settle_dropped_exclusive(g);
        self.sync_if_full(g)?;
        let batch = g.engine.begin_clean(n).map(InFlight::new);
        self.run_clean_steps(g, batch)
    }

    /// Executes a write-back begun in the engine (cleaning, unmap-ahead: its lines pinned)
    /// under the volume lock, completes it in the engine, and brings the records up to date;
    /// `None` is an empty pass. [`CacheVolume::clean_pass_unlocked`] runs the I/O without
    /// the lock instead.
    fn run_clean_steps(&self, g: &mut Inner, batch: Option<InFlight>) -> io::Result<()> {
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let (steps, ticket) = match batch {
            Some(b) => (b.steps, Some((b.ticket, b.slots))),
            None => (Vec::new(), None),
        };
        let r = self.exec(g, &steps, &mut []);
        self.commit_clean(g, steps, ticket, &[], false, r)
    }

    /// The commit of a write-back whose I/O returned `r`: completes the ticket in the engine
    /// (`undone`: slots whose write-back was not attempted, dirty again), brings the records
    /// of its slots up to date, and recovers from a failure as a plan's failure is.
    /// `unlocked`: its I/O ran outside the lock, so requests planned meanwhile may have
    /// changed its lines (a sector written again, a neighbour populated): a failure then
    /// does not roll the engine back to `mem` (it would undo them); completing the ticket
    /// failed already puts its pending sectors back dirty, which is all a roll-back does here.
    fn commit_clean(
        &self,
        g: &mut Inner,
        steps: Vec<Step>,
        ticket: Option<(tiercache_engine::WbTicket, Vec<u32>)>,
        undone: &[u32],
        unlocked: bool,
        r: Result<(), StepError>,
    ) -> io::Result<()> {
        // Commit first: `roll_back` and `recover` below drop and restore lines, which a
        // pinned slot forbids. A failure in the backing-first phase (every write-back runs
        // there) puts every line back as `mem` has it, i.e. dirty: the ticket's pending
        // sectors are dirty again, so `roll_back` finds nothing to change. A failure
        // after it is recovered from the plan as before, the lines completed clean.
        if let Some((t, slots)) = ticket {
            let failed: &[u32] = match &r {
                Err(e) if e.before_cache => &slots,
                _ => undone,
            };
            g.engine.complete_writeback(t, failed);
        }
        let mut slots = std::mem::take(&mut g.slots);
        slots.clear();
        for s in &steps {
            if let Some((ssd, len)) = ssd_range(s) {
                let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
                slots.extend(a as u32..=b as u32);
            }
        }
        if let Err(e) = &r {
            if e.before_cache && unlocked {
                if !e.cache && matches!(steps.get(e.index), Some(Step::WriteBack { .. })) {
                    self.enter_degraded(g, &e.err);
                }
            } else if e.before_cache {
                // Every write-back runs in the backing-first phase: the lines are put back
                // dirty as `mem` has them (nothing is dropped on a backing error).
                self.failed_before_cache(g, &steps, e, &slots);
            }
        }
        let touched = slots.clone();
        g.slots = slots;
        Self::update_records(g);
        if let Err(e) = r {
            if !e.before_cache {
                let pending = e.pending(&steps);
                self.recover(g, &pending, 0, 0, &[], &[]);
            } else if e.cache {
                // A write-back's read failed on a pool member: its mirrored lines there (their
                // copies given back by the failed completion) are saved from the copies.
                let (touched, _) = self.save_from_copies(g, &e.err, &touched);
                self.recover(g, &[], 0, 0, &[], &touched);
            }
            return Err(if e.cache {
                self.cache_error(g, e.err)
            } else {
                self.backing_error(e.err)
            });
        }
        if !steps.is_empty() && undone.is_empty() {
            self.leave_degraded(g);
        }
        Ok(())
    }

    /// A cleaning pass of at most `n` lines whose device I/O runs outside the volume lock
    /// (plan-unlocked-io step 3). Under the lock: begun in the engine (its slots pinned:
    /// never evicted or reused, their dirty sectors pending), the merged groups formed as
    /// `exec` would and their expected data checksums captured, the backing spans published
    /// in `Inner::wb`. Unlocked: each group's cache reads and backing write
    /// ([`CacheVolume::write_back_io`]). Then committed ([`CacheVolume::reap`]) by whoever
    /// needs it first: this owner when it retakes the lock, or a request whose plan touches a
    /// pinned slot or a span, a FLUSH or FUA. The caller holds `clean_io` (`_owner`), so at
    /// most one write-back is in flight. With inline cleaning the locked pass runs (the
    /// simulator's order).
    pub(super) fn clean_pass_unlocked<'a>(
        &'a self,
        owner: &MutexGuard<'_, ()>,
        g: MutexGuard<'a, Inner>,
        n: u64,
    ) -> (MutexGuard<'a, Inner>, io::Result<()>) {
        self.write_back_unlocked(owner, g, WbOf::Lines(n))
    }

    /// [`CacheVolume::clean_pass_unlocked`] of the lines the cleaner picks, or of given
    /// slots (unmap-ahead's dirty likely victims).
    fn write_back_unlocked<'a>(
        &'a self,
        owner: &MutexGuard<'_, ()>,
        mut g: MutexGuard<'a, Inner>,
        of: WbOf,
    ) -> (MutexGuard<'a, Inner>, io::Result<()>) {
        if self.inline_cleaning() {
            assert!(
                g.wb.is_none(),
                "a write-back in flight while another owner holds clean_io"
            );
            let r = match of {
                WbOf::Lines(n) => self.clean_pass(&mut g, n),
                WbOf::Slots(s) => self.sync_if_full(&mut g).and_then(|()| {
                    let batch = g.engine.begin_write_back_slots(&s).map(InFlight::new);
                    self.run_clean_steps(&mut g, batch)
                }),
            };
            return (g, r);
        }
        self.write_back_outside(owner, g, of)
    }

    /// [`CacheVolume::write_back_unlocked`] whatever the cleaner setting: inline cleaning
    /// runs it from the request that crossed the watermark, after that request released the
    /// volume lock ([`CacheVolume::after_request`]); at queue depth 1 nothing runs between
    /// its begin and commit, so the engine sees what the locked pass gives it.
    fn write_back_outside<'a>(
        &'a self,
        _owner: &MutexGuard<'_, ()>,
        mut g: MutexGuard<'a, Inner>,
        of: WbOf,
    ) -> (MutexGuard<'a, Inner>, io::Result<()>) {
        assert!(
            g.wb.is_none(),
            "a write-back in flight while another owner holds clean_io"
        );
        self.settle_dropped_exclusive(&mut g);
        if let Err(e) = self.sync_if_full(&mut g) {
            return (g, Err(e));
        }
        let pass = match &of {
            WbOf::Lines(n) => g.engine.begin_clean(*n).map(InFlight::new),
            WbOf::Slots(s) => g.engine.begin_write_back_slots(s).map(InFlight::new),
        };
        let Some(pass) = pass else {
            return (g, Ok(()));
        };
        let only_write_backs = pass
            .steps
            .iter()
            .all(|s| matches!(s, Step::WriteBack { .. } | Step::CopyHdd { .. }));
        if !only_write_backs {
            let r = self.run_clean_steps(&mut g, Some(pass));
            return (g, r);
        }
        // The groups exec's backing-first phase would write (every step is in it), in its
        // order, with what their I/O needs from `Inner`.
        let steps = pass.steps.clone();
        let mut groups = Vec::new();
        let mut done: Vec<usize> = Vec::new();
        for i in 0..steps.len() {
            if done.binary_search(&i).is_ok() {
                continue;
            }
            let group = merge_write_backs(&steps, i, &done);
            for &j in &group {
                if let Err(at) = done.binary_search(&j) {
                    done.insert(at, j);
                }
            }
            let expected: Vec<_> = group
                .iter()
                .map(|&j| match steps[j] {
                    Step::WriteBack { ssd, len, .. } => Self::expected(&g, ssd, len),
                    _ => None,
                })
                .collect();
            let (Step::WriteBack { hdd, .. } | Step::CopyHdd { hdd, .. }) = steps[group[0]] else {
                unreachable!("only write-backs and gap copies here");
            };
            let total: u64 = group.iter().map(|&j| steps[j].bytes().3).sum();
            groups.push((group, expected, (hdd, hdd + total)));
        }
        let spans: Vec<(u64, u64)> = groups.iter().map(|x| x.2).collect();
        // The slots each group reads (a chunk rewrite's gap copies read none).
        let group_slots: Vec<Vec<u32>> = groups
            .iter()
            .map(|(group, ..)| {
                let mut v = Vec::new();
                for &j in group {
                    if let Some((ssd, len)) = ssd_range(&steps[j]) {
                        let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
                        v.extend(a as u32..=b as u32);
                    }
                }
                v
            })
            .collect();
        // Unsynced from before the writes are issued: a backing sync that fails meanwhile
        // writes these ranges again from the cache (the same bytes: no plan writes a pinned
        // slot while it is pinned). The commit records them again (a sync that succeeded
        // meanwhile may have missed them).
        for (group, ..) in &groups {
            for (a, b) in written_back(&steps, group) {
                g.wrote_backing(a, b);
            }
        }
        {
            let mut w = self.wb_io.lock().unwrap_or_else(|e| e.into_inner());
            assert!(
                !w.running && w.outcome.is_none(),
                "two write-backs in flight outside the lock"
            );
            w.running = true;
            w.next = 0;
            w.current = None;
            w.skip.clear();
        }
        g.wb = Some(Unlocked {
            pass,
            spans,
            slots: group_slots.clone(),
        });
        drop(g);
        self.pause.at(step::Stage::Begun, &self.wb_waiters);
        self.metrics
            .unlocked_writebacks
            .fetch_add(1, Ordering::Relaxed);
        let mut tmp = Vec::new();
        // Posts the outcome when the I/O ends, also when it panics (a device's bug): else
        // `running` would stay set and every request that needs this pass committed would
        // wait for it forever.
        let mut post = PostOnDrop {
            vol: self,
            wrote: Vec::new(),
            undone: Vec::new(),
            r: None,
            current: None,
        };
        for (k, (group, expected, span)) in groups.iter().enumerate() {
            if k > 0 && self.wb_waiters.load(Ordering::Acquire) > 0 {
                // A request waits for this write-back (it touches one of its lines or
                // spans, or flushes): stop here, the lines not written stay dirty.
                self.metrics
                    .writeback_yields
                    .fetch_add(1, Ordering::Relaxed);
                for s in &group_slots[k..] {
                    post.undone.extend(s);
                }
                break;
            }
            // Foreground backing I/O first (bounded): a read miss then waits for at most the
            // one backing op of the pass in progress on the device, not for a run of them.
            self.fg_gate();
            {
                // A request took this group out of the pass (it writes one of its lines or
                // its backing range, [`CacheVolume::settle_group`]): its lines stay dirty,
                // the pass goes on with the next group.
                let mut w = self.wb_io.lock().unwrap_or_else(|e| e.into_inner());
                w.next = k + 1;
                if w.skip.contains(&k) {
                    drop(w);
                    self.metrics
                        .writeback_groups_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    post.undone.extend(&group_slots[k]);
                    continue;
                }
                w.current = Some(k);
            }
            post.current = Some((group[0], *span));
            // A chunk rewrite is two backing ops (gap read, write): foreground first again
            // between them.
            let io =
                self.write_back_io_gated(&steps, group, expected, &mut tmp, &|| self.fg_gate());
            post.current = None;
            self.wb_io.lock().unwrap_or_else(|e| e.into_inner()).current = None;
            self.wb_done.notify_all();
            if matches!(io, Ok(()) | Err(WbIoError::BackingWrite(_))) {
                post.wrote.extend(written_back(&steps, group));
            }
            if let Err(e) = io {
                let (cache, err) = match e {
                    WbIoError::Cache(e) => (true, e),
                    WbIoError::BackingRead(e) | WbIoError::BackingWrite(e) => (false, e),
                };
                post.r = Some(Err(StepError {
                    index: group[0],
                    cache,
                    err,
                    before_cache: true,
                    done: Vec::new(),
                }));
                break;
            }
        }
        drop(post);
        self.pause.at(step::Stage::IoDone, &self.wb_waiters);
        let mut g = self.lock();
        self.reap(&mut g, false);
        let r = g.wb_error.take().map_or(Ok(()), Err);
        (g, r)
    }

    /// Commits the write-back whose I/O runs outside the lock (`Inner::wb`), if any, once
    /// its I/O is done (waits for it: that I/O never needs the volume lock, so holding it
    /// here cannot deadlock). Called before anything that must not overlap it: a plan that
    /// touches a pinned slot or a backing span of it, a FLUSH or FUA, recovery from a
    /// failure, another write-back. Its error goes to `Inner::wb_error` for its owner.
    /// `excl`: the caller holds `io` exclusively (else a failure's recovery takes it).
    pub(super) fn reap(&self, g: &mut Inner, excl: bool) {
        if excl {
            // Recovery (the callers holding `io` exclusively) drops and restores lines:
            // none may be pinned by a read miss filling outside the lock either.
            self.reap_fills(g);
        }
        let Some(u) = g.wb.take() else {
            return;
        };
        let out = self
            .wb_io_done()
            .outcome
            .take()
            .expect("a write-back in flight posts its outcome when its I/O ends");
        // A failure is recovered from as under the lock (lines restored, copied, dropped):
        // no hit reads a slot meanwhile.
        let _excl =
            (!excl && out.r.is_err()).then(|| self.io.write().unwrap_or_else(|e| e.into_inner()));
        for &(a, b) in &out.wrote {
            g.wrote_backing(a, b);
        }
        let r = out.r.map_err(|mut e| {
            if e.cache {
                e.err = self.on_mismatch(g, e.err);
            }
            e
        });
        // A cache sync that failed while the I/O ran (a foreground plan's, holding neither
        // this pass's slots nor its spans) may have dropped dirty bytes of a pinned slot
        // written since the last good sync, before the I/O read them: the slot then held an
        // older line's bytes, which went to this line's backing range (concurrent seed 10:
        // line 14 read line 76's bytes after a restart). Those lines stay dirty, for
        // `settle_dropped` to copy the verified sectors and report the others lost.
        let mut undone = out.undone;
        for &s in &u.pass.slots {
            let dropped = g.cache_dropped.get(&s).copied().unwrap_or(0);
            if dropped & g.engine.pending_mask(s) != 0 && !undone.contains(&s) {
                undone.push(s);
            }
        }
        let ticket = Some((u.pass.ticket, u.pass.slots));
        if let Err(e) = self.commit_clean(g, u.pass.steps, ticket, &undone, true, r) {
            g.wb_error = Some(e);
        }
    }

    /// Waits until the unlocked write-back's I/O is done (not committed: its owner commits it
    /// when it retakes the lock, or a later `reap`). Called holding the volume lock.
    pub(super) fn wait_wb_io(&self) {
        drop(self.wb_io_done());
    }

    /// `wb_io` once the unlocked write-back's I/O (if any) has ended; a wait is counted and
    /// announced (`wb_waiters`: the pass stops after its current group).
    fn wb_io_done(&self) -> std::sync::MutexGuard<'_, WbIo> {
        let mut w = self.wb_io.lock().unwrap_or_else(|e| e.into_inner());
        if w.running {
            self.metrics.writeback_waits.fetch_add(1, Ordering::Relaxed);
            self.wb_waiters.fetch_add(1, Ordering::AcqRel);
            while w.running {
                w = self.wb_done.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            self.wb_waiters.fetch_sub(1, Ordering::AcqRel);
        }
        w
    }

    /// Whether a request must have the unlocked write-back in flight committed before the
    /// engine plans it: a FLUSH or FUA (it makes everything durable, that write-back too).
    /// A write or trim of a line being written back does not wait for the pass: the group
    /// that reads the line's slot is taken out of the pass if its I/O has not begun, or
    /// waited for if it runs ([`CacheVolume::settle_group`]). The engine plans a write over
    /// the pending line (the sectors it writes stay dirty when the pass commits); a trim
    /// drops the line (its slot a zombie, freed when the pass commits) or its trimmed
    /// sectors, so a group taken out leaves nothing of them dirty, and a trimmed line is
    /// not written back after the trim.
    pub(super) fn reap_before(&self, g: &Inner, req: &Request) -> bool {
        let Some(u) = &g.wb else {
            return false;
        };
        if req.op == Op::Flush || req.fua {
            return true;
        }
        // A read of a pending line is a hit (both only read the slot); a read that
        // populates its missing sectors settles the group after planning
        // ([`CacheVolume::settle_in_flight`]).
        if req.len == 0 || req.op == Op::Read {
            return false;
        }
        let (first, last) = (
            req.offset >> self.line_shift,
            (req.end() - 1) >> self.line_shift,
        );
        if last - first >= self.capacity_lines {
            return true;
        }
        let pinned: Vec<u32> = (first..=last)
            .filter_map(|l| g.engine.lookup(Engine::line_key(req.volume, l)))
            .filter(|&s| g.engine.is_pinned(s))
            .collect();
        if pinned.is_empty() {
            return false;
        }
        if !matches!(req.op, Op::Write | Op::Trim) {
            return true;
        }
        let mut groups = Vec::new();
        for s in pinned {
            let before = groups.len();
            groups.extend((0..u.slots.len()).filter(|&k| u.slots[k].contains(&s)));
            if groups.len() == before {
                // Pinned but read by no group (not expected): the whole pass first.
                return true;
            }
        }
        for k in groups {
            self.settle_group(k);
        }
        false
    }

    /// Before `steps` (planned while the unlocked write-back is in flight) run: every group
    /// of it that they conflict with is settled ([`CacheVolume::settle_group`]): a group
    /// whose backing span they read or write (the device must not see the group's older
    /// bytes after theirs, and a chunk rewrite's gap copy must not overwrite a newer client
    /// write), or whose slots they write (a neighbour populated in a pinned slot: it must not
    /// change under the group's cache read). Other groups go on meanwhile.
    pub(super) fn settle_in_flight(&self, g: &Inner, steps: &[Step]) {
        let Some(u) = &g.wb else {
            return;
        };
        let ls = self.line_shift;
        let mut groups = BTreeSet::new();
        for s in steps {
            let backing = match *s {
                Step::ReadHdd { hdd, len, .. }
                | Step::WriteHdd { hdd, len, .. }
                | Step::Populate { hdd, len, .. }
                | Step::WriteBack { hdd, len, .. }
                | Step::CopyHdd { hdd, len, .. } => Some((hdd, hdd + len)),
                _ => None,
            };
            if let Some((a, b)) = backing {
                groups.extend((0..u.spans.len()).filter(|&k| {
                    let (x, y) = u.spans[k];
                    a < y && x < b
                }));
            }
            if let Step::WriteSsd { ssd, len, .. }
            | Step::Populate { ssd, len, .. }
            | Step::TrimSsd { ssd, len } = *s
            {
                if len == 0 {
                    continue;
                }
                for x in (ssd >> ls)..=((ssd + len - 1) >> ls) {
                    let x = x as u32;
                    if !g.engine.is_pinned(x) {
                        continue;
                    }
                    let before = groups.len();
                    groups.extend((0..u.slots.len()).filter(|&k| u.slots[k].contains(&x)));
                    if groups.len() == before {
                        // Pinned but read by no group (not expected): wait for the whole I/O.
                        self.wait_wb_io();
                        return;
                    }
                }
            }
        }
        for k in groups {
            self.settle_group(k);
        }
    }

    /// Waits (at most [`FG_GATE_MAX`]) while a foreground plan with backing steps is
    /// outstanding (`fg_backing`): the unlocked write-back's next backing op goes after it.
    fn fg_gate(&self) {
        let t = Instant::now();
        while self.fg_backing.load(Ordering::Acquire) > 0 && t.elapsed() < FG_GATE_MAX {
            // A request waits for the group in progress (holding the volume lock): no gate.
            if self
                .wb_io
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .group_waiters
                > 0
            {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Makes sure group `k` of the unlocked write-back in flight neither reads its slots nor
    /// writes its backing span any more, waiting for that group only: already written,
    /// nothing; not begun, it is taken out of the pass (its lines stay dirty, the pass
    /// writes its other groups); being written, waits for its I/O (counted in
    /// `writeback_waits`). Called holding the volume lock: the I/O never needs it.
    pub(super) fn settle_group(&self, k: usize) {
        let mut w = self.wb_io.lock().unwrap_or_else(|e| e.into_inner());
        if !w.running {
            return;
        }
        if k >= w.next {
            if !w.skip.contains(&k) {
                w.skip.push(k);
            }
            return;
        }
        if w.current == Some(k) {
            self.metrics.writeback_waits.fetch_add(1, Ordering::Relaxed);
            w.group_waiters += 1;
            while w.running && w.current == Some(k) {
                w = self.wb_done.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            w.group_waiters -= 1;
        }
    }

    /// One background cleaning step: writes back down to the low watermark when the engine
    /// says cleaning is due. Returns whether it did anything (the rate-controlled pass:
    /// whether the next should follow at once, its budget not spent).
    pub fn clean_if_needed(&self) -> io::Result<bool> {
        let owner = self.clean_owner();
        let mut g = self.lock();
        if g.closed || g.failed {
            return Ok(false);
        }
        // Backing syncs failing: retried when due; no cleaning meanwhile (its write-backs
        // could not be made durable, and freeing their slots needs a sync).
        if g.sync_failing.is_some() && self.retry_sync_locked(&mut g) {
            return Ok(false);
        }
        if let Some(d) = &g.degraded {
            // Retry write-backs with backoff (also with inline cleaning, and below the
            // watermark): the first success ends the degraded state.
            if Instant::now() < d.retry_at {
                return Ok(false);
            }
            if g.engine.dirty_lines() == 0 {
                self.leave_degraded(&mut g);
                return Ok(true);
            }
            let n = g.engine.dirty_lines().clamp(1, 64);
            self.clean_pass_unlocked(&owner, g, n).1?;
            return Ok(true);
        }
        // Dirty lines left with one cache copy (a member failed, or was left out at a
        // degraded start, then replaced): mirrored again before ordinary cleaning (plan
        // (d)6), also with inline cleaning (no request re-mirrors).
        if g.engine.unmirrored_lines() > 0 && g.wb.is_none() && self.mirror_single_pass(&mut g)? {
            return Ok(true);
        }
        if self.inline_cleaning() {
            return Ok(false);
        }
        if g.engine.needs_cleaning() {
            // Returns true: the cleaner lets waiting requests in, then runs the next pass.
            let n = g.engine.cleaning_target().clamp(1, CLEAN_PASS_LINES);
            self.clean_pass_unlocked(&owner, g, n).1?;
            return Ok(true);
        }
        // Below the high watermark: the rate controller's share of write-backs, spread over
        // time (a few lines per wake-up) so that foreground requests wait for little.
        let n = {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let dt = r.last.map(|t| (now - t).as_secs_f64()).unwrap_or(0.0);
            r.last = Some(now);
            let rate = r
                .ctl
                .update(g.engine.dirty_lines(), self.capacity_lines, dt);
            // At most one second's worth is saved up (an idle cleaner does not burst later).
            r.budget = (r.budget + rate * dt).min(rate.max(1.0));
            let n = r.budget.floor().min(r.pass.max(1) as f64);
            r.budget -= n;
            n as u64
        };
        if n == 0 || g.engine.dirty_lines() == 0 {
            return Ok(false);
        }
        let t = Instant::now();
        let (g, r) = self.clean_pass_unlocked(&owner, g, n);
        r?;
        let queued = self.waiting.load(Ordering::Acquire) > 0;
        drop(g);
        drop(owner);
        let took = t.elapsed();
        let more = {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            if queued && took > FLUSH_PASS_TARGET {
                let f = FLUSH_PASS_TARGET.as_secs_f64() / took.as_secs_f64();
                r.pass = ((n as f64 * f) as u64).max(1);
            } else if !queued || took < FLUSH_PASS_TARGET / 2 {
                r.pass = (r.pass * 2).min(RATE_PASS_LINES);
            }
            // The budget a short pass left: the next pass comes without the 20 ms sleep.
            r.budget >= 1.0
        };
        // A short pass, then the cleaner lets waiting requests in (and sleeps unless the
        // budget is left): the volume lock is held for one pass only, so a foreground
        // request waits for a few write-backs at most.
        Ok(more)
    }

    /// The background cleaner's write-back rate (`--writeback-rate auto|off|N`) and the dirty
    /// share it holds (`--writeback-target`): see [`tiercache_engine::rate`]. Above the high
    /// watermark the watermark cleaning still runs at full speed.
    pub fn set_writeback_rate(
        &self,
        mode: tiercache_engine::WritebackRate,
        target: f64,
    ) -> Result<(), String> {
        let ctl = tiercache_engine::RateController::new(mode, target)?;
        {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            *r = WbRate {
                ctl,
                last: None,
                budget: 0.0,
                pass: RATE_PASS_LINES,
            };
        }
        self.store_cleaner(Some((mode, target)))
    }

    /// Stores the cleaner's settings (cleaning policy and age, and the write-back rate when
    /// `writeback` is given, else the stored one) in the superblock's settings block, so a
    /// restart keeps them as it keeps the engine's.
    fn store_cleaner(
        &self,
        writeback: Option<(tiercache_engine::WritebackRate, f64)>,
    ) -> Result<(), String> {
        let mut g = self.lock();
        if g.closed {
            return Ok(());
        }
        let writeback = writeback.or(g.sb.tuning.and_then(|t| t.writeback));
        g.sb.tuning = Some(Tuning {
            writeback,
            ..Tuning::of(g.engine.config())
        });
        self.write_superblock(&mut g).map_err(|e| {
            format!("applied, but storing it in the superblock failed ({e}): a restart goes back to the stored value")
        })
    }

    /// The write-back rate setting, its target share and the rate now (lines/s).
    pub fn writeback_rate(&self) -> (tiercache_engine::WritebackRate, f64, f64) {
        let r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
        (r.ctl.mode, r.ctl.target, r.ctl.rate())
    }

    /// The cleaning policy (`--cleaning lba|acp|alru`, `Engine` setting `cleaning`) and
    /// ALRU's age in requests.
    pub fn set_cleaning(
        &self,
        policy: tiercache_engine::CleaningPolicy,
        age: Option<u64>,
    ) -> Result<(), String> {
        self.lock()
            .engine
            .retune(|c| {
                c.cleaning = policy;
                if let Some(a) = age {
                    c.cleaning_age = a;
                }
            })
            .map_err(|e| e.to_string())?;
        self.store_cleaner(None)
    }

    /// Records unmapped per batch: the setting, at most an eighth of the cache.
    pub(super) fn unmap_batch_now(&self) -> u64 {
        self.unmap_batch
            .load(Ordering::Relaxed)
            .min(self.capacity_lines / 8)
    }

    /// Records of likely victims unmapped per batch (rule 2 of the module doc), at most an
    /// eighth of the cache; 0 or 1: each record is unmapped alone when its slot is reused.
    pub fn set_unmap_batch(&self, n: u64) {
        self.unmap_batch.store(n, Ordering::Relaxed);
    }

    /// Slots whose clean line's record is unmapped ahead of its eviction (tests, diagnostics):
    /// a crash forgets these lines (their data is on the backing device).
    pub fn unmapped_ahead(&self) -> Vec<u32> {
        let g = self.lock();
        let mut v: Vec<u32> = g.ahead.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The background half of the write-back miss path: when fewer than half of the engine's
    /// next `unmap_batch` likely victims are unmapped ahead, writes back the dirty ones among
    /// them (LBA order, contiguous ones merged; counted as cleaning), then unmaps them all
    /// in one batch (one backing sync, one cache sync), so their evictions need no sync.
    /// Returns whether it did anything.
    ///
    /// The dirty ones are written back outside the volume lock first (as a cleaning pass of
    /// those slots, [`CacheVolume::clean_pass_unlocked`]); then, under the lock, the
    /// candidates are picked again: any dirtied meanwhile is written back under the lock
    /// (rare: a likely victim is cold), and the batch is unmapped.
    pub fn unmap_ahead_if_needed(&self) -> io::Result<bool> {
        let owner = self.clean_owner();
        self.unmap_ahead_owned(&owner)
    }

    /// [`CacheVolume::unmap_ahead_if_needed`] for the holder of `clean_io` (`owner`).
    fn unmap_ahead_owned(&self, owner: &MutexGuard<'_, ()>) -> io::Result<bool> {
        let mut g = self.lock();
        if self.skip_unmap_ahead(&g) {
            return Ok(false);
        }
        // A few passes at most (a likely victim rewritten again and again is left to the
        // locked pass below).
        for _ in 0..4 {
            match self.unmap_ahead_candidates(&mut g) {
                Some((_, mut dirty)) if !dirty.is_empty() => {
                    dirty.truncate(CLEAN_PASS_LINES as usize);
                    let (g2, r) = self.write_back_unlocked(owner, g, WbOf::Slots(dirty));
                    g = g2;
                    r?;
                }
                _ => break,
            }
        }
        self.unmap_ahead_locked(&mut g)
    }

    /// The work a request leaves for after its reply is due, run once it released the
    /// volume lock (and `io`), so other requests plan and run meanwhile:
    /// * `unmap`: it had to unmap a record on the miss path (its likely victims were not
    ///   unmapped ahead, e.g. dirty): the background pass of likely victims now, its
    ///   write-backs outside the lock when `clean_io` is free; when another write-back owner
    ///   holds it (the cleaner, `ctl flush`), under the lock as before (`try_lock`: a request
    ///   does not queue behind a pass). A failure is logged, not returned (the request is
    ///   complete).
    /// * `clean`: inline cleaning (`--cleaner inline`), the request crossed the high
    ///   watermark: a pass of the engine's cleaning target with its I/O outside the lock
    ///   (waiting for `clean_io`: the simulator's order needs the pass). At queue depth 1
    ///   nothing runs between its begin and commit: the engine and the counters are as after
    ///   the locked pass, so the replay still equals `tiercache sim`. Its error is the
    ///   request's, as before.
    pub(super) fn after_request(&self, unmap: bool, clean: bool) -> io::Result<()> {
        if unmap {
            let r = match self.clean_io.try_lock() {
                Ok(owner) => self.unmap_ahead_owned(&owner),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    self.unmap_ahead_owned(&p.into_inner())
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    let mut g = self.lock();
                    // (It commits a write-back in flight first.)
                    self.unmap_ahead_locked(&mut g)
                }
            };
            if let Err(e) = r {
                tracing::warn!("unmapping likely victims ahead failed: {e}");
            }
        }
        if clean {
            let owner = self.clean_owner();
            let mut g = self.lock();
            if g.closed
                || g.failed
                || !self.inline_cleaning()
                || g.degraded.is_some()
                || !g.engine.needs_cleaning()
            {
                return Ok(());
            }
            let n = g.engine.cleaning_target();
            // None in flight: this thread holds `clean_io`, and every owner commits its own
            // before it lets go.
            self.reap(&mut g, false);
            if let Some(e) = g.wb_error.take() {
                tracing::warn!("write-back failed: {e}");
            }
            let (g, r) = self.write_back_outside(&owner, g, WbOf::Lines(n));
            drop(g);
            r?;
        }
        Ok(())
    }

    /// The likely victims to unmap ahead now (none: not due) and the dirty ones among them
    /// (LBA order).
    fn unmap_ahead_candidates(&self, g: &mut Inner) -> Option<(Vec<u32>, Vec<u32>)> {
        // Degraded: its write-backs would fail; clean lines are evicted without a sync then.
        if g.closed || g.failed || g.degraded.is_some() || self.inline_cleaning() {
            return None;
        }
        // None may be in flight when the candidates are picked (its lines are pinned).
        self.reap(g, false);
        if let Some(e) = g.wb_error.take() {
            tracing::warn!("write-back failed: {e}");
        }
        self.settle_dropped_exclusive(g);
        let k = self.unmap_batch_now();
        if k < 2 {
            return None;
        }
        let mut cand = Vec::new();
        g.engine.eviction_candidates(k, &mut cand);
        cand.retain(|s| !g.ahead.contains_key(s));
        if cand.is_empty() || (cand.len() as u64) < k / 2 {
            return None;
        }
        let mut dirty: Vec<u32> = cand
            .iter()
            .copied()
            .filter(|&s| g.engine.dirty_mask(s) != 0)
            .collect();
        dirty.sort_by_key(|&s| g.engine.slot_key(s));
        Some((cand, dirty))
    }

    /// While backing syncs fail, unmap-ahead is skipped (counted in `unmap_ahead_skipped`):
    /// its batch needs a good backing sync first (and the write-backs of its dirty
    /// candidates could not be made durable), so it would only fail, or wait for the
    /// backoff, and log `cleaning failed` at every pass of the cleaner.
    fn skip_unmap_ahead(&self, g: &Inner) -> bool {
        let skip = g.sync_failing.is_some();
        if skip {
            self.metrics
                .unmap_ahead_skipped
                .fetch_add(1, Ordering::Relaxed);
        }
        skip
    }

    pub(super) fn unmap_ahead_locked(&self, g: &mut Inner) -> io::Result<bool> {
        if self.skip_unmap_ahead(g) {
            return Ok(false);
        }
        let Some((cand, mut dirty)) = self.unmap_ahead_candidates(g) else {
            return Ok(false);
        };
        if !dirty.is_empty() {
            // A short pass under the lock: the next call (after the lock went to waiting
            // requests) picks the candidates again and writes back the rest.
            let more = dirty.len() as u64 > CLEAN_PASS_LINES;
            dirty.truncate(CLEAN_PASS_LINES as usize);
            self.sync_if_full(g)?;
            let batch = g.engine.begin_write_back_slots(&dirty).map(InFlight::new);
            self.run_clean_steps(g, batch)?;
            if more {
                return Ok(true);
            }
        }
        // Every candidate is clean now (a failed write-back returned above).
        debug_assert!(
            cand.iter().all(|&s| g.engine.dirty_mask(s) == 0),
            "unmapping a dirty line's record ahead would lose its data on a crash"
        );
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        if let Err((cache, e)) = self.unmap_records(g, &[], &cand) {
            return Err(if cache {
                self.cache_error(g, e)
            } else {
                self.backing_error(e)
            });
        }
        Ok(true)
    }

    /// Re-mirrors (under the lock) up to `n` dirty lines that have one cache copy
    /// (`Engine::begin_remirror`, plan (d)6): each line's dirty sectors are read from its
    /// slot and written to a new copy slot on another live member. Run through
    /// [`CacheVolume::exec`] as a plan's steps, so a copy slot whose durable record still maps
    /// another line is unmapped on the device before its data is written (rule 2), a reuse
    /// that needs a backing sync gets it first, data checksums and `cache_unsynced` follow
    /// the writes. Then `complete_remirror`: the pairs whose steps did not all succeed (or
    /// whose line was written, cleaned or dropped meanwhile) get no copy; the records of
    /// both slots follow the engine at the next flush. A cache error is counted as a
    /// plan's is (a member failing at its threshold). Returns the lines mirrored.
    pub(super) fn remirror_pass(&self, g: &mut Inner, n: u64) -> io::Result<u64> {
        if g.closed || g.failed {
            return Ok(0);
        }
        // Lines of a write-back in flight are pinned, their state settles at its commit.
        self.reap(g, false);
        let (pairs, steps, buf_len) = match g.engine.begin_remirror(n) {
            None => return Ok(0),
            Some(r) => (r.pairs.to_vec(), r.plan.steps.clone(), r.plan.buf_len),
        };
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let mut buf = vec![0u8; buf_len as usize];
        let r = self.exec(g, &steps, &mut buf);
        // The pairs of the steps not done (the failing one and every later one).
        let failed: Vec<u32> = match &r {
            Ok(()) => Vec::new(),
            Err(e) => {
                let ls = self.line_shift;
                let mut f = Vec::new();
                for s in &steps[e.index.min(steps.len())..] {
                    let Some((ssd, _)) = ssd_range(s) else {
                        continue;
                    };
                    let slot = (ssd >> ls) as u32;
                    if let Some(&(p, _)) = pairs.iter().find(|&&(p, c)| p == slot || c == slot) {
                        if !f.contains(&p) {
                            f.push(p);
                        }
                    }
                }
                f
            }
        };
        let done = g.engine.complete_remirror(&pairs, &failed);
        self.metrics
            .remirrored_lines
            .fetch_add(done, Ordering::Relaxed);
        let mut slots = std::mem::take(&mut g.slots);
        slots.clear();
        slots.extend(pairs.iter().flat_map(|&(p, c)| [p, c]));
        g.slots = slots;
        Self::update_records(g);
        if let Err(e) = r {
            tracing::warn!(
                "re-mirroring {} dirty lines: {} failed: {}",
                pairs.len(),
                failed.len(),
                e.err
            );
            return Err(if e.cache {
                self.cache_error(g, e.err)
            } else {
                self.backing_error(e.err)
            });
        }
        Ok(done)
    }

    /// One pass over dirty lines left with one cache copy (up to [`REMIRROR_PASS_LINES`]):
    /// each gets a copy on another live member; when no slot for a copy is left (dirty lines
    /// and their copies fill the live members), they are written back instead, in LBA order
    /// of their slots. Returns whether the pass did anything (false: one live member, or
    /// nothing to do). The cleaner's first step, and the open's before it serves.
    pub(super) fn mirror_single_pass(&self, g: &mut Inner) -> io::Result<bool> {
        let n = g.engine.unmirrored_lines().clamp(1, REMIRROR_PASS_LINES);
        if self.remirror_pass(g, n)? > 0 {
            return Ok(true);
        }
        let live = (0..g.member_errors.len())
            .filter(|&d| !g.engine.device_failed(d))
            .count();
        if live < 2 || g.failed {
            return Ok(false);
        }
        let single = g.engine.unmirrored_slots(n);
        if single.is_empty() {
            return Ok(false);
        }
        self.settle_dropped_exclusive(g);
        self.sync_if_full(g)?;
        let batch = g.engine.begin_write_back_slots(&single).map(InFlight::new);
        let any = batch.is_some();
        self.run_clean_steps(g, batch)?;
        Ok(any)
    }

    /// Re-mirrors every dirty line left with one cache copy, as far as slots for copies
    /// allow (see [`CacheVolume::remirror_pass`]; the background cleaner does it by itself).
    /// Returns the lines mirrored; passes release the lock in between.
    pub fn remirror(&self) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let _owner = self.clean_owner();
            let mut g = self.lock();
            if g.engine.unmirrored_lines() == 0 {
                return Ok(total);
            }
            let n = self.remirror_pass(&mut g, REMIRROR_PASS_LINES)?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    /// Starts the background cleaner; it stops at [`CacheVolume::shutdown`].
    pub fn start_cleaner(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let v = Arc::clone(self);
        std::thread::Builder::new()
            .name("tiercache-cleaner".into())
            .spawn(move || {
                while !v.stop.load(Ordering::Relaxed) {
                    // A panic in a pass (a device's bug) fails that pass (its lines stay
                    // dirty, see `PostOnDrop`); the cleaner goes on after a pause, as after
                    // an error, instead of leaving the volume without one.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let r = v.clean_if_needed();
                        match r {
                            Ok(did) => v.unmap_ahead_if_needed().map(|a| a || did),
                            e => e,
                        }
                    }))
                    .unwrap_or_else(|_| {
                        v.metrics.cleaner_panics.fetch_add(1, Ordering::Relaxed);
                        Err(io::Error::other("a cleaning pass panicked"))
                    });
                    match r {
                        Ok(true) => v.let_waiters_in(),
                        Ok(false) => std::thread::sleep(Duration::from_millis(20)),
                        Err(e) => {
                            tracing::error!("cleaning failed: {e}");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
            })
            .expect("spawn cleaner")
    }

    /// Writes back every dirty line and makes everything durable (`ctl flush`).
    ///
    /// In passes (about `FLUSH_PASS_TARGET` each while foreground requests queue behind
    /// them, growing to `FLUSH_PASS_MAX` lines while none do; LBA order carried across
    /// passes by the engine's cleaning cursor) with the volume lock handed to waiting
    /// foreground requests in between, so reads and writes go on during a long flush. Each pass writes
    /// its lines back and updates their records under the lock, as a cleaning pass does, so
    /// a line rewritten between passes is simply dirty again. Once the lines dirty at the
    /// start are written (bounded: at most twice their count plus a pass, however fast
    /// clients dirty new ones), the rest is written and everything synced in one hold of the
    /// lock: on return the backing device holds, durably, every byte acknowledged before
    /// the call and before the last hold.
    pub fn flush_dirty(&self) -> io::Result<()> {
        let budget = 2 * self.lock().engine.dirty_lines() + FLUSH_PASS_MAX;
        let mut written = 0u64;
        let mut n = FLUSH_PASS_FIRST;
        loop {
            let owner = self.clean_owner();
            let g = self.lock();
            let left = g.engine.dirty_lines();
            if g.closed || g.failed || left == 0 || written >= budget {
                break;
            }
            let t = Instant::now();
            let (g, r) = self.clean_pass_unlocked(&owner, g, n);
            match r {
                // The damaged line was dropped (see `clean_all`): the next pass goes on.
                Err(e) if data_sums::mismatch(&e).is_some() => {}
                r => r?,
            }
            let now = g.engine.dirty_lines();
            written += left.saturating_sub(now).max(1);
            // Requests queued behind this pass: keep passes near the target; none: grow
            // them (whole chunks for chunk rewrites, fewer plans), as fast as one hold.
            let queued = self.waiting.load(Ordering::Acquire) > 0;
            drop(g);
            drop(owner);
            let took = t.elapsed();
            if !queued || took < FLUSH_PASS_TARGET / 2 {
                n = (n * 2).min(FLUSH_PASS_MAX);
            } else if took > FLUSH_PASS_TARGET {
                // Straight to the size that takes the target (a grown pass is long).
                let f = FLUSH_PASS_TARGET.as_secs_f64() / took.as_secs_f64();
                n = ((n as f64 * f) as u64).max(1);
            }
            self.let_waiters_in();
        }
        let _owner = self.clean_owner();
        let mut g = self.lock();
        self.clean_all(&mut g)?;
        assert!(
            g.failed || g.engine.dirty_lines() == 0,
            "ctl flush: {} dirty lines left after writing back every line",
            g.engine.dirty_lines()
        );
        self.flush_locked(&mut g)
    }
}

/// What an unlocked write-back writes: at most N lines in the cleaner's order, or these
/// slots' dirty lines.
enum WbOf {
    Lines(u64),
    Slots(Vec<u32>),
}

/// A write-back begun in the engine ([`Engine::begin_clean`]): its steps, ticket and the
/// slots it pinned, owned so the engine's plan buffer is free for the next request.
struct InFlight {
    steps: Vec<Step>,
    ticket: tiercache_engine::WbTicket,
    slots: Vec<u32>,
}

impl InFlight {
    fn new(b: tiercache_engine::WbBatch<'_>) -> Self {
        InFlight {
            steps: {
                let mut s = b.plan.steps.clone();
                to_backing(&mut s);
                s
            },
            ticket: b.ticket,
            slots: b.lines.iter().map(|l| l.slot).collect(),
        }
    }
}

/// A write-back whose I/O runs outside the volume lock (`Inner::wb`): the pass begun in the
/// engine and the backing ranges its groups write.
pub(super) struct Unlocked {
    pass: InFlight,
    /// Per merged group, in I/O order: its backing span and the slots it reads.
    spans: Vec<(u64, u64)>,
    slots: Vec<Vec<u32>>,
}

/// The unlocked write-back's I/O: whether it runs, and its outcome once it is done; which
/// group it is at, so a request waits for one group, not the pass
/// ([`CacheVolume::settle_group`]).
#[derive(Default)]
pub(super) struct WbIo {
    running: bool,
    outcome: Option<WbOutcome>,
    /// Groups `< next` were reached by the I/O: written, being written (`current`) or
    /// skipped; groups `>= next` may still be taken out of the pass (`skip`).
    next: usize,
    current: Option<usize>,
    /// Groups requests took out of the pass before their I/O began (their lines stay dirty).
    skip: Vec<usize>,
    /// Requests waiting for the group in progress ([`CacheVolume::settle_group`]).
    group_waiters: u32,
}

/// Posts an unlocked write-back's outcome in `wb_io` when dropped: at the end of its I/O, or
/// while a panic in that I/O unwinds. A panic fails the pass as a failed backing write of the
/// group in progress would (every line of the pass dirty again, the group's backing range
/// counted as written: it may be, in part), and the panicking owner commits it before its
/// thread goes, so the error is logged here and not left for an unrelated later pass.
struct PostOnDrop<'a> {
    vol: &'a CacheVolume,
    wrote: Vec<(u64, u64)>,
    undone: Vec<u32>,
    /// The I/O's result once it ended (`None`: ended without an error, or panicked).
    r: Option<Result<(), StepError>>,
    /// The group whose I/O runs (its first step, its backing span).
    current: Option<(usize, (u64, u64))>,
}

impl Drop for PostOnDrop<'_> {
    fn drop(&mut self) {
        let panicked = std::thread::panicking();
        let r = match (self.r.take(), self.current) {
            (Some(r), _) => r,
            (None, Some((index, span))) if panicked => {
                self.wrote.push(span);
                Err(StepError {
                    index,
                    cache: false,
                    err: io::Error::other(format!(
                        "a write-back of backing bytes {}..{} panicked (see the panic \
                         message above); its lines stay dirty",
                        span.0, span.1
                    )),
                    before_cache: true,
                    done: Vec::new(),
                })
            }
            (None, _) => Ok(()),
        };
        debug_assert!(
            panicked || self.current.is_none(),
            "a write-back group's I/O ended without clearing `current`"
        );
        {
            let mut w = self.vol.wb_io.lock().unwrap_or_else(|e| e.into_inner());
            assert!(w.running, "an unlocked write-back's outcome posted twice");
            w.current = None;
            w.outcome = Some(WbOutcome {
                r,
                wrote: std::mem::take(&mut self.wrote),
                undone: std::mem::take(&mut self.undone),
            });
            w.running = false;
        }
        self.vol.wb_done.notify_all();
        if panicked {
            let mut g = self.vol.lock();
            self.vol.reap(&mut g, false);
            if let Some(e) = g.wb_error.take() {
                tracing::error!("cleaning pass failed: {e}");
            }
        }
    }
}

pub(super) struct WbOutcome {
    /// As `exec` reports it (every step is in its backing-first phase).
    r: Result<(), StepError>,
    /// Backing ranges written (or whose write failed, possibly in part).
    wrote: Vec<(u64, u64)>,
    /// Slots whose group was not attempted (a request was waiting).
    undone: Vec<u32>,
}
