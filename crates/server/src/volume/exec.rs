//! Plan execution: a request through the engine, its plan's steps on the devices (backing-only
//! steps first, contiguous write-backs merged), and the data checksums of the bytes read and
//! written.

use super::*;

impl CacheVolume {
    /// Runs one request through the engine and executes its plan. `data`: the client's bytes
    /// (filled for reads, taken for writes).
    pub(super) fn run(&self, req: &Request, data: Data<'_>) -> io::Result<()> {
        self.run_with(req, data, true)
    }

    /// [`CacheVolume::run`]; `unlocked`: a read miss may run its device steps outside the
    /// lock (`fill.rs`; false when planned again after such a run failed).
    pub(super) fn run_with(&self, req: &Request, data: Data<'_>, unlocked: bool) -> io::Result<()> {
        let g = self.lock_foreground();
        let mut g = self.wait_for_fills(g, req);
        if g.closed {
            return Err(ioerr(g.closed_reason()));
        }
        self.settle_dropped_exclusive(&mut g);
        if self.reap_before(&g, req) {
            self.reap(&mut g, false);
        }
        // Classified under the lock, so requests reach the devices in the order they were
        // classified (a classifier outside it reorders concurrent sequential requests).
        let mut req = *req;
        if let (Some(c), Op::Read | Op::Write) = (self.classifiers.of(req.volume), req.op) {
            let d = match &data {
                Data::Write(d) => Some(*d),
                _ => None,
            };
            req.class = c.classify(&req, d);
        }
        let req = &req;
        // A read needs no backing sync: if this bounding one fails (or the backoff refuses
        // it), the read goes on with admission blocked (`block_reads_while_syncs_fail`).
        if let Err(e) = self.sync_if_full(&mut g) {
            if req.op != Op::Read {
                return Err(e);
            }
        }
        self.flush_if_diverged(&mut g);
        if req.len > 0 && req.op != Op::Flush {
            let ls = self.line_size();
            let a = vaddr(req.volume, req.offset / ls * ls);
            let b = vaddr(req.volume, req.end().div_ceil(ls) * ls);
            g.touch_undecided(a, b);
        }
        if g.failed {
            return self.run_direct(&mut g, req, data);
        }
        if req.op == Op::Read {
            lost_check(
                &g.lost,
                vaddr(req.volume, req.offset),
                vaddr(req.volume, req.end()),
            )?;
        }
        // Slots the request's lines hold now: an invalidation changes them without a step.
        let mut slots = std::mem::take(&mut g.slots);
        slots.clear();
        let mut all_slots = false;
        if req.len > 0 && req.op != Op::Flush {
            let (first, last) = (
                req.offset >> self.line_shift,
                (req.end() - 1) >> self.line_shift,
            );
            if last - first >= self.capacity_lines {
                all_slots = true;
            } else {
                for l in first..=last {
                    if let Some(s) = g.engine.lookup(Engine::line_key(req.volume, l)) {
                        slots.push(s);
                    }
                }
            }
        }
        // (slot, key) the request's lines held before the plan (rule 5).
        let before: Vec<(u32, u64)> = slots
            .iter()
            .filter_map(|&s| Some((s, g.engine.slot_key(s)?)))
            .collect();
        // FUA in write-back: the engine plans a write-back write ending in FlushSsd, which
        // the flush after the plan makes durable (data and record).
        self.block_reads_while_syncs_fail(&mut g);
        let plan = g.engine.process(req).map_err(ioerr)?;
        let (buf_start, buf_len) = (plan.buf_start, plan.buf_len);
        let mut steps: Vec<Step> = plan.steps.clone();
        to_backing(&mut steps);
        let at = req.offset.saturating_sub(buf_start) as usize;
        let hit = req.op == Op::Read
            && !steps.is_empty()
            && steps.iter().all(|s| matches!(s, Step::ReadSsd { .. }));
        if hit {
            let _shared = self.io.read().unwrap_or_else(|e| e.into_inner());
            let exp: Vec<Option<(u64, Vec<u32>)>> = match g.sums.is_some() {
                true => steps
                    .iter()
                    .filter_map(|s| match *s {
                        Step::ReadSsd { ssd, len, .. } => Some(Self::expected(&g, ssd, len)),
                        _ => None,
                    })
                    .collect(),
                false => Vec::new(),
            };
            g.slots = slots;
            let failures = self.cache_sync_failures.load(Ordering::Acquire);
            drop(g);
            let Data::Read(out) = data else {
                unreachable!()
            };
            let r = if buf_start == req.offset && buf_len as usize == out.len() {
                self.exec_reads(&steps, out, &exp)
            } else {
                let mut buf = vec![0u8; buf_len as usize];
                let r = self.exec_reads(&steps, &mut buf, &exp);
                if r.is_ok() {
                    out.copy_from_slice(&buf[at..at + out.len()]);
                }
                r
            };
            if self.cache_sync_failures.load(Ordering::Acquire) != failures {
                // A cache sync failed while this hit read its slots (one that holds neither
                // `io` nor waits for hits: a superblock write, a lost-range update): it may
                // have dropped their latest bytes, so the slot may hold an older line's.
                // Planned again: the dropped lines are settled first (a miss then).
                drop(_shared);
                return self.run(req, Data::Read(out));
            }
            return match r {
                Ok(()) => Ok(()),
                Err(e) => {
                    drop(_shared);
                    self.read_fallback(req, out, e)
                }
            };
        }
        if unlocked && self.fill_qualifies(&g, req, &steps, &before, all_slots) {
            g.slots = slots;
            let Data::Read(out) = data else {
                unreachable!("only reads qualify")
            };
            return self.fill_unlocked(g, req, steps, buf_len, at, out);
        }
        let fg = steps.iter().any(|s| {
            matches!(
                s,
                Step::ReadHdd { .. } | Step::WriteHdd { .. } | Step::Populate { .. }
            )
        });
        let _fg = fg.then(|| FgBacking::new(&self.fg_backing));
        // The write-back groups it meets land first (or are taken out); committed later.
        self.settle_in_flight(&g, &steps);
        let excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let mut buf = vec![0u8; buf_len as usize];
        if let Data::Write(d) = &data {
            buf[at..at + d.len()].copy_from_slice(d);
        }
        let flux = Self::flux_pages_for(&g, &steps, &before, all_slots && req.op != Op::Read);
        let r = self
            .mark_in_flux(&mut g, &flux)
            .map_err(|err| StepError {
                index: 0,
                cache: true,
                err,
                // Only metadata flags were written: no data step ran, the engine can be put
                // back as `mem` has it.
                before_cache: true,
                done: Vec::new(),
            })
            .and_then(|()| self.exec(&mut g, &steps, &mut buf));
        for s in &steps {
            if let Some((ssd, len)) = ssd_range(s) {
                let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
                slots.extend(a as u32..=b as u32);
            }
        }
        if all_slots {
            slots.clear();
            slots.extend(0..self.capacity_lines as u32);
        }
        if let Err(e) = r {
            // The records `roll_back` puts the engine back to, as before the plan: committing
            // the write-back in flight (next) records its slots from the engine, which still
            // has this plan's changes (sectors it was to populate marked valid, never
            // written: a read planned again then read them from the slot, which held another
            // line's bytes; soak seed 162).
            let before_plan: Vec<(u32, Record)> = if e.before_cache && g.wb.is_some() {
                slots.iter().map(|&s| (s, g.mem_record(s))).collect()
            } else {
                Vec::new()
            };
            // Recovery restores and drops lines: commit a write-back in flight first.
            self.reap(&mut g, true);
            for (s, rec) in before_plan {
                if g.mem_record(s) != rec {
                    // Its write-back's cleaning is forgotten (the line is dirty again, and
                    // written back again later): nothing is lost.
                    g.restore_image(s, rec);
                }
            }
            if e.before_cache {
                // Nothing in the cache changed: put the engine back as `mem` has it.
                let retry = self.failed_before_cache(&mut g, &steps, &e, &slots);
                let touched = slots.clone();
                g.slots = slots;
                Self::update_records(&mut g);
                if e.cache {
                    // (A record page flagged in flux, or a dirty victim's write-back read,
                    // failed on a pool member: mirrored lines there are saved from their
                    // copies.)
                    let (touched, mirrored) = self.save_from_copies(&mut g, &e.err, &touched);
                    self.recover(&mut g, &[], 0, 0, &[], &touched);
                    self.cache_error(&mut g, e.err);
                    return self.direct_then_sync(&mut g, req, data, mirrored);
                }
                if retry || self.read_again_uncached(&g, req, &e) {
                    // Dirty evictions are blocked now: planned again, the request needs no
                    // write-back (a clean victim, or the backing device directly). Or a read
                    // whose slot reuse needed a sync that failed: planned again, uncached.
                    drop(excl);
                    drop(g);
                    return self.run(req, data);
                }
                return Err(self.backing_error(e.err));
            }
            let touched = slots.clone();
            g.slots = slots;
            Self::update_records(&mut g);
            let e = match self
                .promote_after_read_failure(&mut g, req, &steps, e, buf_start, &buf, &touched)
            {
                Ok(()) => {
                    drop(excl);
                    drop(g);
                    return self.run(req, data);
                }
                Err(e) => e,
            };
            return self.after_failure(&mut g, req, data, &steps, e, buf_start, &buf, &touched);
        }
        g.slots = slots;
        Self::update_records(&mut g);
        if let Data::Read(out) = data {
            out.copy_from_slice(&buf[at..at + out.len()]);
        } else if matches!(req.op, Op::Write | Op::Trim) && !g.lost.is_empty() {
            // Damaged dirty data (`crate::data_sums`) rewritten: readable again.
            self.unlose(
                &mut g,
                vaddr(req.volume, req.offset),
                vaddr(req.volume, req.end()),
            );
        }
        if req.op == Op::Flush || req.fua {
            self.flush_locked(&mut g)?;
        }
        drop(excl);
        drop(_fg);
        // Unmapping ahead after an unmap on the miss path, inline cleaning: after the
        // volume lock is released (`clean.rs::after_request`).
        let unmap = std::mem::take(&mut g.unmapped_on_miss);
        let clean = self.inline_cleaning.load(Ordering::Relaxed)
            && g.degraded.is_none()
            && g.engine.needs_cleaning();
        if unmap || clean {
            drop(g);
            return self.after_request(unmap, clean);
        }
        Ok(())
    }

    /// Reads the ReadSsd steps of a hit; `exp`: their expected data checksums, in order
    /// (empty without data checksums).
    fn exec_reads(
        &self,
        steps: &[Step],
        buf: &mut [u8],
        exp: &[Option<(u64, Vec<u32>)>],
    ) -> io::Result<()> {
        let mut i = 0;
        for s in steps {
            if let Step::ReadSsd { ssd, buf: b, len } = *s {
                let e = exp.get(i).and_then(|e| e.as_ref());
                i += 1;
                self.read_data(ssd, &mut buf[b as usize..(b + len) as usize], e)?;
            }
        }
        Ok(())
    }

    /// The expected data checksums of `[ssd, ssd + len)` widened to whole sectors, with the
    /// sector size; `None` without data checksums.
    pub(super) fn expected(g: &Inner, ssd: u64, len: u64) -> Option<(u64, Vec<u32>)> {
        let s = g.sums.as_ref()?;
        let (a, b) = s.widen(ssd, len);
        Some((s.sector, s.expected(a, b)))
    }

    /// Reads `out.len()` bytes of the data area at `ssd`; with `exp` (see
    /// [`CacheVolume::expected`]) verifies every sector the range touches (reading whole
    /// sectors): a mismatch is an `InvalidData` error carrying a [`data_sums::Mismatch`].
    pub(super) fn read_data(
        &self,
        ssd: u64,
        out: &mut [u8],
        exp: Option<&(u64, Vec<u32>)>,
    ) -> io::Result<()> {
        let d = self.data_offset;
        let Some((sector, exp)) = exp else {
            return self.cache.read_at(out, d + ssd);
        };
        let len = out.len() as u64;
        let (a, b) = (
            ssd / sector * sector,
            (ssd + len).div_ceil(*sector) * sector,
        );
        let bad = |m| io::Error::new(io::ErrorKind::InvalidData, m);
        if a == ssd && b == ssd + len {
            self.cache.read_at(out, d + ssd)?;
            return DataSums::verify(*sector, a, out, exp).map_err(bad);
        }
        let mut tmp = vec![0u8; (b - a) as usize];
        self.cache.read_at(&mut tmp, d + a)?;
        DataSums::verify(*sector, a, &tmp, exp).map_err(bad)?;
        out.copy_from_slice(&tmp[(ssd - a) as usize..(ssd - a + len) as usize]);
        Ok(())
    }

    /// A data checksum mismatch found by a read (`e` carries it; other errors pass): counted
    /// and logged with the cache slot and volume range, while the engine still maps the line.
    /// The caller then drops the line ([`CacheVolume::recover`]): a damaged clean sector is
    /// read again from the backing device, a damaged dirty one is recorded as lost.
    pub(super) fn on_mismatch(&self, g: &Inner, e: io::Error) -> io::Error {
        let Some(m) = data_sums::mismatch(&e) else {
            return e;
        };
        self.metrics.checksum_errors.fetch_add(1, Ordering::Relaxed);
        let slot = (m.ssd >> self.line_shift) as u32;
        let ls = 1u64 << self.line_shift;
        let Some(key) = g.engine.slot_key(slot) else {
            tracing::error!("{m}: cache slot {slot}, which maps no line");
            return e;
        };
        // A line being written back (begin..complete) has its dirty sectors pending.
        let dirty = g.engine.dirty_mask(slot) | g.engine.pending_mask(slot);
        let ss = g.engine.sector_size();
        for &x in &m.sectors {
            let k = (x % ls) / ss;
            let vol = key_addr(key, self.line_shift) + k * ss;
            if dirty >> k & 1 == 1 {
                tracing::error!(
                    "data checksum mismatch in DIRTY data: cache slot {slot} (cache byte {}), {}: the sector is damaged and lost (never written to the backing device); reads of it fail with EIO until it is written again",
                    self.data_offset + x,
                    crate::volume_set::ranges_text(&self.vols(), &[(vol, vol + ss)])
                );
            } else {
                tracing::warn!(
                    "data checksum mismatch in clean data: cache slot {slot} (cache byte {}), {}: line dropped, read again from the backing device",
                    self.data_offset + x,
                    crate::volume_set::ranges_text(&self.vols(), &[(vol, vol + ss)])
                );
            }
        }
        e
    }

    /// `[ssd, ssd + len)` of the data area is about to be written (a failed or torn write
    /// too): not durable until the next cache sync that succeeds (`Inner::cache_unsynced`).
    pub(super) fn wrote_cache(&self, g: &mut Inner, ssd: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (sh, ss) = (self.line_shift, g.engine.sector_size());
        let ls = 1u64 << sh;
        let mut p = ssd;
        while p < ssd + len {
            let slot = p >> sh;
            let end = (ssd + len).min((slot + 1) << sh);
            let (a, b) = ((p - (slot << sh)) / ss, (end - (slot << sh)).div_ceil(ss));
            debug_assert!(b <= 64 && b * ss <= ls, "a line holds at most 64 sectors");
            let mask = if b - a >= 64 {
                u64::MAX
            } else {
                ((1u64 << (b - a)) - 1) << a
            };
            *g.cache_unsynced.entry(slot as u32).or_insert(0) |= mask;
            p = end;
        }
    }

    /// `data` was written to the data area at `ssd`: records its checksums (sectors written
    /// in part are read back whole from the device).
    pub(super) fn note_written(&self, g: &mut Inner, ssd: u64, data: &[u8]) -> io::Result<()> {
        let Some(s) = g.sums.as_mut() else {
            return Ok(());
        };
        if let Some((a, b)) = s.update(ssd, data) {
            let mut whole = vec![0u8; (b - a) as usize];
            self.cache.read_at(&mut whole, self.data_offset + a)?;
            s.update(a, &whole);
        }
        Ok(())
    }

    /// Executes plan steps (see the module doc for the reuse rule). The steps that only
    /// touch the backing device (write-backs, backing reads and writes) and depend on no
    /// earlier step run FIRST ([`backing_first`]): if one fails, nothing in the cache has
    /// changed yet (`StepError::before_cache`), so the engine can be put back exactly as
    /// `mem` records it ([`CacheVolume::roll_back`]) instead of dropping lines — a dirty line
    /// whose write-back failed stays dirty in its slot (issue 14 item 1).
    pub(super) fn exec(
        &self,
        g: &mut Inner,
        steps: &[Step],
        buf: &mut [u8],
    ) -> Result<(), StepError> {
        let ls = self.line_shift;
        g.in_plan.clear();
        for s in steps {
            if let Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } = *s {
                if len > 0 {
                    g.in_plan
                        .extend((ssd >> ls) as u32..=((ssd + len - 1) >> ls) as u32);
                }
            }
        }
        let r = self.exec_plan(g, steps, buf);
        g.in_plan.clear();
        r
    }

    /// [`CacheVolume::exec`] without its bookkeeping of `Inner::in_plan`.
    fn exec_plan(&self, g: &mut Inner, steps: &[Step], buf: &mut [u8]) -> Result<(), StepError> {
        let first = backing_first(steps);
        // Write-backs of lines the plan itself writes first (it evicts them later in the same
        // plan: a request over more lines than the cache holds): run before any cache write
        // too, from the bytes the slot will hold by then ([`overlaid_write_backs`]), so that
        // the backing sync the slot reuse needs covers them and comes before the first cache
        // write. Run in the second phase, the hit's cache write unmapped their records
        // before they were written back (a crash then read the backing device's older
        // bytes), and a failed sync reported them lost: they were no longer cached.
        let overlaid = overlaid_write_backs(steps, &first);
        // While the backoff of failing syncs runs, a plan whose slot reuse needs a sync is
        // refused before any I/O: run, its backing-first phase would write the backing
        // device and then fail at the sync gate, leaving the device newer than the clean
        // copy the rolled-back cache keeps serving - a value that flips at the next restart
        // or eviction (fault_model's `direct_write_failed_by_the_sync_backoff_reads_the_
        // same_after_a_restart`; before: "line 5 read Ver(1) after the failed write, Ver(3)
        // after a clean restart").
        if !first.is_empty() || !overlaid.is_empty() {
            if let Some(d) = g.sync_failing.as_ref().filter(|d| !d.due()) {
                if !self.reused_slots(g).is_empty() {
                    return Err(StepError {
                        // As `sync_before_reuse` says it: not a write-back's failure (that
                        // would enter the degraded state).
                        index: first_cache_step(steps),
                        cache: false,
                        err: d.sync_backoff_error(),
                        before_cache: true,
                        done: Vec::new(),
                    });
                }
            }
        }
        let fresh = self.fresh_backing_writes(g, steps, &first);
        // Steps done, sorted (a merged write-back completes several).
        let mut done: Vec<usize> = Vec::new();
        let mut tmp = Vec::new();
        if !first.is_empty() {
            // Write-backs that must wait for phase 2 may not join a phase-1 merge.
            let mut skip: Vec<usize> = (0..steps.len())
                .filter(|i| {
                    matches!(steps[*i], Step::WriteBack { .. } | Step::CopyHdd { .. })
                        && first.binary_search(i).is_err()
                })
                .collect();
            for &index in &first {
                if skip.binary_search(&index).is_ok() {
                    continue;
                }
                let group = self
                    .exec_step(g, steps, index, buf, &mut tmp, &skip)
                    .map_err(|e| StepError {
                        before_cache: true,
                        ..e
                    })?;
                for i in group.into_iter().chain([index]) {
                    if let Err(at) = skip.binary_search(&i) {
                        skip.insert(at, i);
                    }
                    if let Err(at) = done.binary_search(&i) {
                        done.insert(at, i);
                    }
                }
            }
        }
        for &j in &overlaid {
            self.write_back_overlaid(g, steps, j, buf, &mut tmp)?;
            if let Err(at) = done.binary_search(&j) {
                done.insert(at, j);
            }
        }
        self.sync_before_reuse(g, steps, &fresh)?;
        for index in 0..steps.len() {
            if done.binary_search(&index).is_ok() {
                continue;
            }
            let group = self
                .exec_step(g, steps, index, buf, &mut tmp, &done)
                .map_err(|e| StepError {
                    done: done.clone(),
                    ..e
                })?;
            for i in group {
                if let Err(at) = done.binary_search(&i) {
                    done.insert(at, i);
                }
            }
        }
        Ok(())
    }

    /// Runs write-back `steps[j]` (one of [`overlaid_write_backs`]) before any cache write of
    /// the plan: the slot's bytes now, with the plan's earlier cache writes of that range
    /// (all from the client's buffer) laid over them, as the slot will hold them when the
    /// step's turn comes. A failure changes nothing in the cache (`before_cache`).
    fn write_back_overlaid(
        &self,
        g: &mut Inner,
        steps: &[Step],
        j: usize,
        buf: &[u8],
        tmp: &mut Vec<u8>,
    ) -> Result<(), StepError> {
        let Step::WriteBack { ssd, hdd, len, .. } = steps[j] else {
            unreachable!("only write-backs are overlaid");
        };
        let fail = |cache, err| StepError {
            index: j,
            cache,
            err,
            before_cache: true,
            done: Vec::new(),
        };
        tmp.clear();
        tmp.resize(len as usize, 0);
        let exp = Self::expected(g, ssd, len);
        if let Err(e) = self.read_data(ssd, tmp, exp.as_ref()) {
            return Err(fail(true, self.on_mismatch(g, e)));
        }
        for s in &steps[..j] {
            if let Step::WriteSsd {
                ssd: x,
                buf: b,
                len: m,
            } = *s
            {
                let (lo, hi) = (x.max(ssd), (x + m).min(ssd + len));
                if lo < hi {
                    let from = (b + (lo - x)) as usize;
                    tmp[(lo - ssd) as usize..(hi - ssd) as usize]
                        .copy_from_slice(&buf[from..from + (hi - lo) as usize]);
                }
            }
        }
        g.wrote_backing(hdd, hdd + len);
        self.backing.write_at(tmp, hdd).map_err(|e| fail(false, e))
    }

    /// Before the first step that changes the cache: when the plan reuses a slot whose record
    /// on the device maps another line while backing writes are unsynced, the backing sync
    /// that reuse needs (rule 4, `unmap_records`) runs now. Its failure then changes nothing
    /// in the cache, so the plan is rolled back (`before_cache`) and the lines it evicts stay
    /// cached: after a failed sync they may hold the only copy of bytes written back (or
    /// through) since the last good one. Run later, between two of the plan's cache writes,
    /// the failure's recovery dropped them, and the next failed sync reported them lost.
    ///
    /// `fresh`: ranges the plan's backing-first phase wrote (a write-through or write-around
    /// write) that held durable bytes before it. If the sync fails, the request fails and is
    /// rolled back, so they may read old or new (a failed write): this failure neither
    /// rewrites them nor reports them lost. They are kept undecided (`Inner::hdd_undecided`)
    /// until a good sync: a client that reads them next may see the new bytes from the
    /// device's write cache, and a later failed sync may drop those - the range read old
    /// bytes again, a value that flipped back (checker seeds 2112 and 162). So the first
    /// request over them lists them unsynced: a later failed sync writes them again from
    /// the cache or reports them lost (reads fail until rewritten).
    fn sync_before_reuse(
        &self,
        g: &mut Inner,
        steps: &[Step],
        fresh: &[(u64, u64)],
    ) -> Result<(), StepError> {
        if !g.backing_unsynced() {
            return Ok(());
        }
        let reused = self.reused_slots(g);
        if reused.is_empty() {
            return Ok(());
        }
        // Before any cache write of the plan every slot it writes still holds its line as
        // `mem` records it (evicted, or written in place): a failed sync writes those again
        // from there. (The rolled-back plan leaves them cached as they are.)
        let in_plan: Vec<u32> = g.in_plan.iter().copied().collect();
        let evicting = Self::held_before_plan(g, &in_plan);
        for &(a, b) in fresh {
            g.forget_unsynced(a, b);
        }
        let r = self
            .sync_backoff(g)
            .and_then(|()| self.sync_backing_with(g, &evicting));
        if r.is_err() {
            for &(a, b) in fresh {
                g.wrote_undecided(a, b);
            }
        }
        r.map_err(|err| StepError {
            index: first_cache_step(steps),
            cache: false,
            err,
            before_cache: true,
            done: Vec::new(),
        })
    }

    /// The plan's slots (`Inner::in_plan`) whose reuse needs a backing sync first: they
    /// held a line whose record is on the device, or whose bytes went to the backing device
    /// since the last good sync ([`CacheVolume::sync_before_reuse`]).
    fn reused_slots(&self, g: &Inner) -> Vec<u32> {
        let ls = self.line_shift;
        g.in_plan
            .iter()
            .copied()
            .filter(|&s| {
                let (on_disk, now) = (g.disk_key(s), g.engine.slot_key(s));
                if on_disk != EMPTY_KEY && g.live_key(s) != on_disk {
                    return true;
                }
                // A line the plan evicts whose record never reached the device (reusing its
                // slot needs no unmap) but whose bytes went to the backing device since the
                // last good sync: if that sync failed, only its cached copy would hold them.
                let r = g.mem_record(s);
                if r.key == EMPTY_KEY || r.is_copy() {
                    return false;
                }
                let a = key_addr(r.key, ls);
                now != Some(r.key) && g.unsynced_overlaps(a, a + (1 << ls))
            })
            .collect()
    }

    /// The parts of the backing-first phase's `WriteHdd` steps (`first`) that held durable
    /// bytes before the plan (none written since the last good sync) and that no slot will
    /// hold once a failed plan is rolled back: what [`CacheVolume::sync_before_reuse`] stops
    /// counting unsynced when its sync fails. A line the plan newly admits (placed in a slot
    /// whose `mem` record maps another line or none) counts whole; a line a slot the plan
    /// writes held before it (`mem`, [`CacheVolume::held_before_plan`]) counts only for the
    /// sectors that slot did not hold. Its held sectors are not among them, even when the plan
    /// evicts the line and admits it again into another slot (soak seeds 538, 572): the
    /// roll-back puts it back in its old slot, clean, with the old bytes, and a failed sync
    /// must write those again over the failed write's (else a sync failing without dropping
    /// left the backing device newer than the clean cached copy, which then flipped at the
    /// line's eviction or a restart).
    fn fresh_backing_writes(&self, g: &Inner, steps: &[Step], first: &[usize]) -> Vec<(u64, u64)> {
        let ls = self.line_shift;
        let ss = g.engine.sector_size();
        let in_plan: Vec<u32> = g.in_plan.iter().copied().collect();
        let held = Self::held_before_plan(g, &in_plan);
        let mut fresh = Vec::new();
        for &i in first {
            let Step::WriteHdd { hdd, len, .. } = steps[i] else {
                continue;
            };
            if len == 0 || g.unsynced_overlaps(hdd, hdd + len) {
                continue;
            }
            let base0 = hdd & !VOL_MASK;
            for line in (hdd & VOL_MASK) >> ls..=((hdd + len - 1) & VOL_MASK) >> ls {
                let key = Engine::line_key(vol_of(hdd), line);
                let base = base0 | line << ls;
                let (x, y) = (hdd.max(base), (hdd + len).min(base + (1 << ls)));
                if let Some(&(_, _, valid)) = held.iter().find(|h| h.1 == key) {
                    // The sectors the old slot did not hold, in runs.
                    let mut p = x;
                    while p < y {
                        let k = (p - base) / ss;
                        let q = (base + (k + 1) * ss).min(y);
                        if valid >> k & 1 == 0 {
                            match fresh.last_mut() {
                                Some((_, b)) if *b == p => *b = q,
                                _ => fresh.push((p, q)),
                            }
                        }
                        p = q;
                    }
                    continue;
                }
                let new = g
                    .engine
                    .lookup(key)
                    .is_some_and(|s| g.in_plan.contains(&s) && g.mem_key(s) != key);
                if new {
                    fresh.push((x, y));
                }
            }
        }
        fresh
    }

    /// Runs step `index` of `steps`; returns the later write-backs merged into it (see
    /// `WriteBack`), which `skip` (sorted) must not name.
    fn exec_step(
        &self,
        g: &mut Inner,
        steps: &[Step],
        index: usize,
        buf: &mut [u8],
        tmp: &mut Vec<u8>,
        skip: &[usize],
    ) -> Result<Vec<usize>, StepError> {
        let d = self.data_offset;
        let r = |a: u64, l: u64| a as usize..(a + l) as usize;
        let s = &steps[index];
        {
            let c = |err| StepError {
                index,
                cache: true,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            let h = |err| StepError {
                index,
                cache: false,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            let u = |(cache, err)| StepError {
                index,
                cache,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            match *s {
                Step::ReadSsd { ssd, buf: b, len } => {
                    let exp = Self::expected(g, ssd, len);
                    self.read_data(ssd, &mut buf[r(b, len)], exp.as_ref())
                        .map_err(|e| c(self.on_mismatch(g, e)))?
                }
                Step::ReadHdd {
                    hdd, buf: b, len, ..
                } => self.backing.read_at(&mut buf[r(b, len)], hdd).map_err(h)?,
                Step::WriteSsd { ssd, buf: b, len } => {
                    self.unmap_before_reuse(g, ssd, len).map_err(u)?;
                    self.wrote_cache(g, ssd, len);
                    self.cache.write_at(&buf[r(b, len)], d + ssd).map_err(c)?;
                    self.note_written(g, ssd, &buf[r(b, len)]).map_err(c)?
                }
                Step::WriteHdd {
                    hdd, buf: b, len, ..
                } => {
                    g.wrote_backing(hdd, hdd + len);
                    self.backing.write_at(&buf[r(b, len)], hdd).map_err(h)?
                }
                Step::Populate { hdd, ssd, len, .. } => {
                    self.unmap_before_reuse(g, ssd, len).map_err(u)?;
                    tmp.resize(len as usize, 0);
                    self.backing.read_at(tmp, hdd).map_err(h)?;
                    self.wrote_cache(g, ssd, len);
                    self.cache.write_at(tmp, d + ssd).map_err(c)?;
                    self.note_written(g, ssd, tmp).map_err(c)?
                }
                Step::WriteBack { .. } | Step::CopyHdd { .. } => {
                    // Later write-backs that continue this one on the backing device (cleaning
                    // goes in LBA order; evictions of a sequential run evict neighbours)
                    // join it in one backing write, when no step between touches their
                    // slot or backing range. A failure names this step: none of the group
                    // reached the backing device, and `recover` redoes write-backs from here.
                    let group = merge_write_backs(steps, index, skip);
                    // Under the lock: what the I/O needs from `Inner` (the expected data
                    // checksums); the I/O itself touches no `Inner`.
                    let expected: Vec<_> = group
                        .iter()
                        .map(|&j| match steps[j] {
                            Step::WriteBack { ssd, len, .. } => Self::expected(g, ssd, len),
                            _ => None,
                        })
                        .collect();
                    let io = self.write_back_io(steps, &group, &expected, tmp);
                    // The backing range is unsynced once the write was issued (a failed or
                    // torn write too), recorded when the I/O returned (plan-unlocked-io (b) 6).
                    if matches!(io, Ok(()) | Err(WbIoError::BackingWrite(_))) {
                        for r in written_back(steps, &group) {
                            g.wrote_backing(r.0, r.1);
                        }
                    }
                    match io {
                        Ok(()) => return Ok(group[1..].to_vec()),
                        Err(WbIoError::Cache(e)) => return Err(c(self.on_mismatch(g, e))),
                        Err(WbIoError::BackingRead(e) | WbIoError::BackingWrite(e)) => {
                            return Err(h(e))
                        }
                    }
                }
                // Discards are hints; keeping the bytes is always correct.
                Step::TrimSsd { .. } | Step::TrimHdd { .. } => {}
                // The caller runs the whole flush sequence after the plan.
                Step::FlushSsd | Step::FlushHdd { .. } => {}
            }
        }
        Ok(Vec::new())
    }
}

/// Which device a write-back's I/O failed on ([`CacheVolume::write_back_io`]).
pub(super) enum WbIoError {
    /// Reading the cached data (a data checksum mismatch too).
    Cache(io::Error),
    /// Reading a chunk rewrite's gaps: nothing was written.
    BackingRead(io::Error),
    /// The backing write itself (it may have landed in part).
    BackingWrite(io::Error),
}

impl CacheVolume {
    /// The I/O of one merged write-back `group` of `steps` (from
    /// [`merge_write_backs`], contiguous on the backing device from `steps[group[0]]`): a
    /// chunk rewrite's gaps (`CopyHdd`) are read from the backing device in one read spanning
    /// them all, the cached parts are read from the data area over it (verified against
    /// `expected`, captured under the lock: never a damaged dirty sector to the backing
    /// device), then the whole group goes out in one backing write. It touches no `Inner`
    /// (plan-unlocked-io step 2). Between that gap read and the write no client write may
    /// change the range: today the caller holds the volume lock; once it does not, the
    /// ticket's spans must hold foreground backing writes off (plan (b) 4).
    pub(super) fn write_back_io(
        &self,
        steps: &[Step],
        group: &[usize],
        expected: &[Option<(u64, Vec<u32>)>],
        tmp: &mut Vec<u8>,
    ) -> Result<(), WbIoError> {
        self.write_back_io_gated(steps, group, expected, tmp, &|| {})
    }

    /// [`CacheVolume::write_back_io`], calling `gate` between a chunk rewrite's gap read
    /// and its write (the unlocked pass lets foreground backing I/O go first there).
    pub(super) fn write_back_io_gated(
        &self,
        steps: &[Step],
        group: &[usize],
        expected: &[Option<(u64, Vec<u32>)>],
        tmp: &mut Vec<u8>,
        gate: &dyn Fn(),
    ) -> Result<(), WbIoError> {
        debug_assert_eq!(group.len(), expected.len());
        let r = |a: u64, l: u64| a as usize..(a + l) as usize;
        let (Step::WriteBack { hdd, .. } | Step::CopyHdd { hdd, .. }) = steps[group[0]] else {
            unreachable!("a write-back group starts with a write-back or a gap copy");
        };
        let copies = group.iter().filter_map(|&j| match steps[j] {
            Step::CopyHdd { hdd, len, .. } => Some((hdd, hdd + len)),
            _ => None,
        });
        let span = copies.fold(None, |a: Option<(u64, u64)>, (x, y)| {
            Some(a.map_or((x, y), |(p, q)| (p.min(x), q.max(y))))
        });
        tmp.clear();
        let total: u64 = group.iter().map(|&j| steps[j].bytes().3).sum();
        tmp.resize(total as usize, 0);
        if let Some((x, y)) = span {
            self.backing
                .read_at(&mut tmp[r(x - hdd, y - x)], x)
                .map_err(WbIoError::BackingRead)?;
            gate();
        }
        for (&j, exp) in group.iter().zip(expected) {
            if let Step::WriteBack {
                ssd, hdd: at, len, ..
            } = steps[j]
            {
                self.read_data(ssd, &mut tmp[r(at - hdd, len)], exp.as_ref())
                    .map_err(WbIoError::Cache)?;
            }
        }
        self.backing
            .write_at(tmp, hdd)
            .map_err(WbIoError::BackingWrite)
    }
}

/// The write-backs of `steps` to run as one backing write with `steps[first]` (a
/// `WriteBack`), in backing order: later `WriteBack`s (not yet in `done`) continuing the
/// range, each only if no step between `first` and it writes its slot range or touches its
/// backing range, up to [`MAX_MERGED_WRITE`] bytes.
pub(super) fn merge_write_backs(steps: &[Step], first: usize, done: &[usize]) -> Vec<usize> {
    let mut group = vec![first];
    let (Step::WriteBack { hdd, len, .. } | Step::CopyHdd { hdd, len, .. }) = steps[first] else {
        return group;
    };
    let mut end = hdd + len;
    let overlaps = |a: u64, l: u64, b: u64, m: u64| a < b + m && b < a + l;
    'next: while end - hdd < MAX_MERGED_WRITE {
        for j in first + 1..steps.len() {
            // A chunk rewrite's gap has no slot (length 0 in the cache).
            let (ssd, h, l) = match steps[j] {
                Step::WriteBack { ssd, hdd, len, .. } => (ssd, hdd, len),
                Step::CopyHdd { hdd, len, .. } => (0, hdd, len),
                _ => continue,
            };
            let sl = if matches!(steps[j], Step::CopyHdd { .. }) {
                0
            } else {
                l
            };
            if h != end || done.binary_search(&j).is_ok() || end - hdd + l > MAX_MERGED_WRITE {
                continue;
            }
            let blocked = steps[first + 1..j].iter().any(|s| match *s {
                Step::WriteSsd { ssd: x, len: m, .. } | Step::Populate { ssd: x, len: m, .. }
                    if overlaps(ssd, sl, x, m) =>
                {
                    true
                }
                Step::ReadHdd { hdd: x, len: m, .. }
                | Step::WriteHdd { hdd: x, len: m, .. }
                | Step::Populate { hdd: x, len: m, .. }
                | Step::CopyHdd { hdd: x, len: m, .. }
                | Step::WriteBack { hdd: x, len: m, .. } => overlaps(h, l, x, m),
                _ => false,
            });
            if blocked {
                break 'next;
            }
            group.push(j);
            end += l;
            continue 'next;
        }
        break;
    }
    group
}

/// The backing ranges of a merged write-back `group` that carry cached bytes: its
/// `WriteBack`s, not a chunk rewrite's gaps (`CopyHdd`: the backing device's own bytes written
/// again unchanged, so a failed sync that drops that write leaves them as they were; counted
/// unsynced, a gap whose line is not cached would be reported lost by the next failed sync).
pub(super) fn written_back(steps: &[Step], group: &[usize]) -> Vec<(u64, u64)> {
    group
        .iter()
        .filter_map(|&j| match steps[j] {
            Step::WriteBack { hdd, len, .. } => Some((hdd, hdd + len)),
            _ => None,
        })
        .collect()
}

/// What a step reads and writes: (resource 0 = cache, 1 = backing, 2 = buffer, start, len,
/// writes).
fn accesses(s: &Step) -> [(u8, u64, u64, bool); 2] {
    const NONE: (u8, u64, u64, bool) = (0, 0, 0, false);
    match *s {
        Step::ReadSsd { ssd, buf, len } => [(0, ssd, len, false), (2, buf, len, true)],
        Step::WriteSsd { ssd, buf, len } => [(0, ssd, len, true), (2, buf, len, false)],
        Step::ReadHdd { hdd, buf, len, .. } => [(1, hdd, len, false), (2, buf, len, true)],
        Step::WriteHdd { hdd, buf, len, .. } => [(1, hdd, len, true), (2, buf, len, false)],
        Step::Populate { hdd, ssd, len, .. } => [(1, hdd, len, false), (0, ssd, len, true)],
        Step::WriteBack { ssd, hdd, len, .. } => [(0, ssd, len, false), (1, hdd, len, true)],
        Step::CopyHdd { hdd, len, .. } => [(1, hdd, len, false), (1, hdd, len, true)],
        // Trims and flushes do nothing in `exec` (the flush runs after the plan).
        _ => [NONE, NONE],
    }
}

/// Whether `a` must run before `b` (they touch an overlapping range of the same device or
/// buffer and one of them writes it).
fn depends(a: &Step, b: &Step) -> bool {
    accesses(a).iter().any(|&(r, x, l, w)| {
        accesses(b)
            .iter()
            .any(|&(q, y, m, v)| l > 0 && m > 0 && r == q && (w || v) && x < y + m && y < x + l)
    })
}

/// Indices of the steps [`CacheVolume::exec`] runs first: those that touch only the backing
/// device (and read the cache or buffer) — write-backs, backing reads and writes — and
/// depend on no earlier step that is not run first. Running them first changes no outcome
/// (each depends on nothing that runs later), and a failure among them leaves the cache
/// device untouched.
fn backing_first(steps: &[Step]) -> Vec<usize> {
    let mut first = Vec::new();
    let mut later: Vec<usize> = Vec::new();
    for (j, s) in steps.iter().enumerate() {
        let backing = matches!(
            s,
            Step::WriteBack { .. }
                | Step::CopyHdd { .. }
                | Step::ReadHdd { .. }
                | Step::WriteHdd { .. }
        );
        if backing && !later.iter().any(|&i| depends(&steps[i], s)) {
            first.push(j);
        } else {
            later.push(j);
        }
    }
    first
}

/// The write-backs of `steps` not in `first` (see [`backing_first`]) that depend only on
/// earlier cache writes from the client's buffer (`WriteSsd`, whose buffer range no step
/// fills): the plan evicts a line it has just written. Their bytes are known before any
/// cache write ([`CacheVolume::write_back_overlaid`]), so they run in the first phase too.
/// A write-back depending on anything else (a population, a backing step of the second
/// phase, another write-back) stays in the second phase.
fn overlaid_write_backs(steps: &[Step], first: &[usize]) -> Vec<usize> {
    let filled = |b: u64, l: u64| {
        steps.iter().any(|s| match *s {
            Step::ReadSsd { buf: x, len: m, .. } | Step::ReadHdd { buf: x, len: m, .. } => {
                x < b + l && b < x + m
            }
            _ => false,
        })
    };
    let mut out = Vec::new();
    for (j, s) in steps.iter().enumerate() {
        if !matches!(s, Step::WriteBack { .. }) || first.binary_search(&j).is_ok() {
            continue;
        }
        let mut on_own_write = false;
        let ok = steps[..j].iter().enumerate().all(|(i, t)| {
            if first.binary_search(&i).is_ok() || !depends(t, s) {
                // Phase-1 steps run before it (in order); the rest do not touch its ranges.
                return true;
            }
            match *t {
                Step::WriteSsd { buf: b, len: m, .. } if !filled(b, m) => {
                    on_own_write = true;
                    true
                }
                _ => false,
            }
        });
        if ok && on_own_write {
            out.push(j);
        }
    }
    out
}

/// Counts a foreground plan with backing steps in `CacheVolume::fg_backing` while it lives.
pub(super) struct FgBacking<'a>(&'a AtomicU64);

impl<'a> FgBacking<'a> {
    pub(super) fn new(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::AcqRel);
        FgBacking(c)
    }
}

impl Drop for FgBacking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The first step of `steps` that changes the cache (never a write-back), where a failure
/// before any cache change is reported: `failed_before_cache` then rolls the plan back
/// without taking it for a failed write-back (no degraded state).
fn first_cache_step(steps: &[Step]) -> usize {
    steps
        .iter()
        .position(|s| matches!(s, Step::WriteSsd { .. } | Step::Populate { .. }))
        .unwrap_or(0)
}
