//! Cleaning: write-back passes (watermarks, rate, inline cleaning), unmapping ahead, the background
//! cleaner, and `ctl flush` (`flush_dirty`).

use super::*;

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
        self.settle_dropped_exclusive(g);
        self.sync_if_full(g)?;
        let batch = g.engine.begin_clean(n).map(InFlight::new);
        self.run_clean_steps(g, batch)
    }

    /// Executes a write-back in flight (cleaning, unmap-ahead: begun in the engine, its
    /// lines pinned), completes it in the engine, and brings the records up to date. Begin,
    /// I/O ([`CacheVolume::write_back_io`] through `exec`) and commit all run under the
    /// volume lock today (plan-unlocked-io step 2); `None` is an empty pass.
    fn run_clean_steps(&self, g: &mut Inner, batch: Option<InFlight>) -> io::Result<()> {
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let (steps, ticket) = match batch {
            Some(b) => (b.steps, Some((b.ticket, b.slots))),
            None => (Vec::new(), None),
        };
        let r = self.exec(g, &steps, &mut []);
        // Commit first: `roll_back` and `recover` below drop and restore lines, which a
        // pinned slot forbids. A failure in the backing-first phase (every write-back runs
        // there) puts every line back as `mem` has it, i.e. dirty: the ticket's pending
        // sectors are dirty again, so `roll_back` finds nothing left to change. A failure
        // after it is recovered from the plan as before, the lines completed clean.
        if let Some((t, slots)) = ticket {
            let failed: &[u32] = match &r {
                Err(e) if e.before_cache => &slots,
                _ => &[],
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
            if e.before_cache {
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
                self.recover(g, &[], 0, 0, &[], &touched);
            }
            return Err(if e.cache {
                self.cache_error(g, e.err)
            } else {
                self.backing_error(e.err)
            });
        }
        if !steps.is_empty() {
            self.leave_degraded(g);
        }
        Ok(())
    }

    /// One background cleaning step: writes back down to the low watermark when the engine
    /// says cleaning is due. Returns whether it did anything (the rate-controlled pass:
    /// whether the next should follow at once, its budget not spent).
    pub fn clean_if_needed(&self) -> io::Result<bool> {
        let mut g = self.lock();
        if g.closed || g.failed {
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
            self.clean_pass(&mut g, n)?;
            return Ok(true);
        }
        if self.inline_cleaning() {
            return Ok(false);
        }
        if g.engine.needs_cleaning() {
            // Returns true: the cleaner lets waiting requests in, then runs the next pass.
            let n = g.engine.cleaning_target().clamp(1, CLEAN_PASS_LINES);
            self.clean_pass(&mut g, n)?;
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
        self.clean_pass(&mut g, n)?;
        let queued = self.waiting.load(Ordering::Acquire) > 0;
        drop(g);
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
    pub fn unmap_ahead_if_needed(&self) -> io::Result<bool> {
        let mut g = self.lock();
        self.unmap_ahead_locked(&mut g)
    }

    pub(super) fn unmap_ahead_locked(&self, g: &mut Inner) -> io::Result<bool> {
        // Degraded: its write-backs would fail; clean lines are evicted without a sync then.
        if g.closed || g.failed || g.degraded.is_some() || self.inline_cleaning() {
            return Ok(false);
        }
        self.settle_dropped_exclusive(g);
        let k = self.unmap_batch_now();
        if k < 2 {
            return Ok(false);
        }
        let mut cand = Vec::new();
        g.engine.eviction_candidates(k, &mut cand);
        cand.retain(|s| !g.ahead.contains_key(s));
        if cand.is_empty() || (cand.len() as u64) < k / 2 {
            return Ok(false);
        }
        let mut dirty: Vec<u32> = cand
            .iter()
            .copied()
            .filter(|&s| g.engine.dirty_mask(s) != 0)
            .collect();
        if !dirty.is_empty() {
            dirty.sort_by_key(|&s| g.engine.slot_key(s));
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

    /// Starts the background cleaner; it stops at [`CacheVolume::shutdown`].
    pub fn start_cleaner(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let v = Arc::clone(self);
        std::thread::Builder::new()
            .name("tiercache-cleaner".into())
            .spawn(move || {
                while !v.stop.load(Ordering::Relaxed) {
                    let r = v.clean_if_needed();
                    let r = match r {
                        Ok(did) => v.unmap_ahead_if_needed().map(|a| a || did),
                        e => e,
                    };
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
            let mut g = self.lock();
            let left = g.engine.dirty_lines();
            if g.closed || g.failed || left == 0 || written >= budget {
                break;
            }
            let t = Instant::now();
            match self.clean_pass(&mut g, n) {
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
            steps: b.plan.steps.clone(),
            ticket: b.ticket,
            slots: b.lines.iter().map(|l| l.slot).collect(),
        }
    }
}
