//! Read misses outside the volume lock (docs/plan-unlocked-io.md step 6).
//!
//! A read whose plan only reads the backing device and writes lines that were not cached
//! before into slots no durable record maps (`ReadHdd` + `WriteSsd`: a miss into a free
//! slot, or into a clean victim's slot unmapped ahead) runs its device steps holding
//! neither `inner` nor `io`, so hits and other misses go on meanwhile. Why it is safe:
//! * **No request sees the line half-filled.** The fill is listed in `Inner::fills` from
//!   its plan to its commit; a request meeting one of its lines waits for the commit before
//!   it is planned (`wait_for_fills`), so per-line order is kept.
//! * **No slot changes under another reader.** The engine pins the filled slots
//!   ([`Engine::pin_fill`]): never a victim, never reused, a line dropped meanwhile leaves a
//!   zombie freed at the commit. Hits on the victims planned before the miss are waited for
//!   (`io` taken exclusively once, after planning); none can be planned after it (the engine
//!   no longer maps the victims).
//! * **No record maps bytes that are not there (rules 1-2 of the module doc).** The filled
//!   slots' durable records are empty (the plan qualifies only then) and their image records
//!   are made empty before the lock is released, so no flush meanwhile maps the victim over
//!   the fill's bytes; `update_records` leaves a filling slot's image alone until the commit
//!   maps the line, after its bytes are written.
//! * **Anyone can commit it.** The I/O needs no volume lock; whoever must not overlap a
//!   fill (recovery dropping lines, a mode switch, volume removal, shutdown, a request over
//!   every slot) waits for its I/O and commits it (`reap_fills`), as `reap` does for the
//!   unlocked write-back.
//! * **A failure is redone under the lock.** A failed backing read or cache write drops the
//!   filled lines at the commit (they were not cached before, so nothing is lost) and the
//!   request is planned again the locked way, which handles the device error as it handles
//!   any miss's (backing error to the client, cache error towards pass-through).

use super::*;
use std::sync::Condvar;
use tiercache_engine::WbTicket;

/// A read miss between its plan and its commit.
pub(super) struct Fill {
    id: u64,
    ticket: Option<WbTicket>,
    /// The request's lines: `volume`, lines `first..=last`.
    volume: u32,
    first: u64,
    last: u64,
    /// Slots it writes (sorted).
    slots: Vec<u32>,
    steps: Vec<Step>,
    io: Arc<FillIo>,
}

/// The fill's I/O outcome, posted by its owner, read by whoever commits it.
#[derive(Default)]
pub(super) struct FillIo {
    st: Mutex<FillState>,
    cv: Condvar,
}

#[derive(Default)]
struct FillState {
    /// The I/O ended (`err`: how).
    done: bool,
    err: Option<io::Error>,
    buf: Vec<u8>,
    /// Committed: whether its bytes may be served.
    committed: Option<bool>,
}

impl FillIo {
    fn post(&self, err: Option<io::Error>, buf: Vec<u8>) {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        st.done = true;
        st.err = err;
        st.buf = buf;
        self.cv.notify_all();
    }

    fn wait_done(&self) -> MutexGuard<'_, FillState> {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        while !st.done {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }
}

impl Fill {
    fn meets(&self, volume: u32, first: u64, last: u64) -> bool {
        self.volume == volume && first <= self.last && self.first <= last
    }

    fn covers(&self, key: u64) -> bool {
        key_in(key, self.volume, self.first, self.last)
    }
}

/// Whether line `key` is one of lines `first..=last` of `volume`.
#[inline]
fn key_in(key: u64, volume: u32, first: u64, last: u64) -> bool {
    key & !LINE_MASK == Engine::line_key(volume, 0) && (first..=last).contains(&(key & LINE_MASK))
}

impl CacheVolume {
    /// Waits (releasing the lock) until no fill in flight covers a line of `req` (or, for
    /// a request over more lines than the cache holds, until none is in flight).
    pub(super) fn wait_for_fills<'a>(
        &self,
        mut g: MutexGuard<'a, Inner>,
        req: &Request,
    ) -> MutexGuard<'a, Inner> {
        if req.len == 0 || req.op == Op::Flush {
            return g;
        }
        let (first, last) = (
            req.offset >> self.line_shift,
            (req.end() - 1) >> self.line_shift,
        );
        let every = last - first >= self.capacity_lines;
        while g
            .fills
            .iter()
            .any(|f| every || f.meets(req.volume, first, last))
        {
            self.metrics.fill_waits.fetch_add(1, Ordering::Relaxed);
            g = self.fill_done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g
    }

    /// Whether a planned read (`steps`; `before`: the request's lines cached before it)
    /// may run its device steps outside the lock (the module doc).
    pub(super) fn fill_qualifies(
        &self,
        g: &Inner,
        req: &Request,
        steps: &[Step],
        before: &[(u32, u64)],
        all_slots: bool,
    ) -> bool {
        if req.op != Op::Read
            || req.fua
            || all_slots
            || !before.is_empty()
            || steps.is_empty()
            || g.failed
            || g.closed
            || g.failing
            || g.degraded.is_some()
            || g.sync_failing.is_some()
            || !g.cache_dropped.is_empty()
            || !self.unlocked_misses.load(Ordering::Relaxed)
        {
            return false;
        }
        let ls = self.line_shift;
        let (first, last) = (req.offset >> ls, (req.end() - 1) >> ls);
        steps.iter().all(|s| match *s {
            Step::ReadHdd { .. } => true,
            Step::WriteSsd { ssd, len, .. } => {
                len > 0
                    && ((ssd >> ls) as u32..=((ssd + len - 1) >> ls) as u32).all(|s| {
                        g.disk_key(s) == EMPTY_KEY
                            && !g.engine.is_pinned(s)
                            && g.engine.dirty_mask(s) == 0
                            && g.engine
                                .slot_key(s)
                                .is_some_and(|k| key_in(k, req.volume, first, last))
                    })
            }
            _ => false,
        })
    }

    /// Runs a qualifying read miss (`fill_qualifies`) outside the lock: pins, I/O, commit.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill_unlocked(
        &self,
        mut g: MutexGuard<'_, Inner>,
        req: &Request,
        steps: Vec<Step>,
        buf_len: u64,
        at: usize,
        out: &mut [u8],
    ) -> io::Result<()> {
        // Cleaning groups whose spans the backing read meets land first.
        self.settle_in_flight(&g, &steps);
        // Hits planned before this miss may be reading a victim's slot: they end first.
        drop(self.io.write().unwrap_or_else(|e| e.into_inner()));
        let ls = self.line_shift;
        let mut slots: Vec<u32> = Vec::new();
        for s in &steps {
            if let Step::WriteSsd { ssd, len, .. } = *s {
                slots.extend((ssd >> ls) as u32..=((ssd + len - 1) >> ls) as u32);
            }
        }
        slots.sort_unstable();
        slots.dedup();
        let ticket = if slots.is_empty() {
            None
        } else {
            g.engine.pin_fill(&slots)
        };
        for &s in &slots {
            // Empty until the commit: a flush meanwhile must map neither the victim (its
            // bytes are being overwritten) nor the line (its bytes are not there yet).
            if g.mem_key(s) != EMPTY_KEY {
                g.restore_image(s, Record::EMPTY);
            }
            assert!(
                g.mem_key(s) == EMPTY_KEY && g.disk_key(s) == EMPTY_KEY,
                "slot {s} filled outside the lock while a record maps it"
            );
        }
        for s in &steps {
            if let Step::WriteSsd { ssd, len, .. } = *s {
                self.wrote_cache(&mut g, ssd, len);
            }
        }
        let id = g.next_fill;
        g.next_fill += 1;
        let io = Arc::new(FillIo::default());
        g.fills.push(Fill {
            id,
            ticket,
            volume: req.volume,
            first: req.offset >> ls,
            last: (req.end() - 1) >> ls,
            slots,
            steps: steps.clone(),
            io: io.clone(),
        });
        self.metrics.unlocked_misses.fetch_add(1, Ordering::Relaxed);
        drop(g);
        let fg = exec::FgBacking::new(&self.fg_backing);
        let mut buf = vec![0u8; buf_len as usize];
        // A panic in the I/O (a device bug) still posts an outcome and commits (the lines
        // dropped), or every request on its lines, and every recovery, would wait for ever.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.fill_io(&steps, &mut buf)
        }));
        drop(fg);
        let panicked = match r {
            Ok(r) => {
                io.post(r.err(), buf);
                None
            }
            Err(p) => {
                io.post(Some(io::Error::other("a panic in a read miss's I/O")), buf);
                Some(p)
            }
        };
        let mut g = self.lock();
        self.commit_fill(&mut g, id);
        drop(g);
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        let st = io.st.lock().unwrap_or_else(|e| e.into_inner());
        if st.committed == Some(true) {
            out.copy_from_slice(&st.buf[at..at + out.len()]);
            return Ok(());
        }
        drop(st);
        self.run_with(req, Data::Read(out), false)
    }

    /// The fill's device steps, in plan order; touches no `Inner`.
    fn fill_io(&self, steps: &[Step], buf: &mut [u8]) -> io::Result<()> {
        let r = |a: u64, l: u64| a as usize..(a + l) as usize;
        for s in steps {
            match *s {
                Step::ReadHdd {
                    hdd, buf: b, len, ..
                } => self.backing.read_at(&mut buf[r(b, len)], hdd)?,
                Step::WriteSsd { ssd, buf: b, len } => self
                    .cache
                    .write_at(&buf[r(b, len)], self.data_offset + ssd)?,
                _ => unreachable!("a fill plan only reads the backing device and writes slots"),
            }
        }
        Ok(())
    }

    /// Commits fill `id` if it is still in flight (waiting for its I/O): maps its lines,
    /// or drops them if the I/O failed.
    fn commit_fill(&self, g: &mut Inner, id: u64) {
        let Some(i) = g.fills.iter().position(|f| f.id == id) else {
            return;
        };
        let f = g.fills.swap_remove(i);
        let mut st = f.io.wait_done();
        if let Some(t) = f.ticket {
            g.engine.complete_writeback(t, &[]);
        }
        // Marked unsynced again: a cache sync that succeeded between the plan and the write
        // did not cover it (a failed one before the commit found it marked at the plan).
        for s in &f.steps {
            if let Step::WriteSsd { ssd, len, .. } = *s {
                self.wrote_cache(g, ssd, len);
            }
        }
        let mut ok = st.err.is_none();
        if ok {
            for s in &f.steps {
                if let Step::WriteSsd { ssd, buf: b, len } = *s {
                    let data = &st.buf[b as usize..(b + len) as usize];
                    if let Err(e) = self.note_written(g, ssd, data) {
                        tracing::warn!("data checksums of a miss's cache write: {e}");
                        ok = false;
                        break;
                    }
                }
            }
        }
        if !ok {
            // Not cached before the miss: dropped, nothing is lost; the request is planned
            // again under the lock, which handles the error.
            for &s in &f.slots {
                if g.engine.slot_key(s).is_some_and(|k| f.covers(k)) {
                    g.engine.drop_line(s);
                }
            }
        }
        let mut v = std::mem::take(&mut g.slots);
        v.clear();
        v.extend_from_slice(&f.slots);
        g.slots = v;
        Self::update_records(g);
        st.committed = Some(ok);
        drop(st);
        self.fill_done.notify_all();
    }

    /// Commits every fill in flight (waiting for their I/O): before anything that drops or
    /// restores lines it did not plan, switches modes, or closes.
    pub(super) fn reap_fills(&self, g: &mut Inner) {
        while let Some(id) = g.fills.first().map(|f| f.id) {
            self.commit_fill(g, id);
        }
    }

    /// Whether slot `s` is being filled outside the lock (its image waits for the commit).
    #[inline]
    pub(super) fn filling(g: &Inner, s: u32) -> bool {
        !g.fills.is_empty() && g.fills.iter().any(|f| f.slots.binary_search(&s).is_ok())
    }
}
