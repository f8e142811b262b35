//! A cleaning pass driven in steps, for tests (`#[doc(hidden)]`): begin, I/O and commit of a
//! write-back whose I/O runs outside the volume lock (`clean.rs::clean_pass_unlocked`), each
//! returning to the caller, so a single-threaded harness (crash_points.rs) places client
//! requests and power cuts between them, reproducibly (plan-unlocked-io step 3).
//!
//! The pass runs on a thread of its own that stops at two points ([`Stage`]); the caller
//! waits for it there, so only one thread drives the devices at a time and the devices'
//! event numbers are the same in every run. A request the caller issues while the pass is
//! held before its I/O and that must wait for that I/O (a write or trim of one of its lines,
//! a FLUSH, FUA, a plan meeting its spans) lets the I/O go on, as it would go on without the
//! hook: the pass then stops after its first group (`wb_waiters`), and the request commits it.

use super::*;
use std::sync::Condvar;
use std::thread::{JoinHandle, ThreadId};

/// Where a stepped pass is held.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Stage {
    /// Begun under the lock (slots pinned, spans published, the lock released), no I/O yet.
    Begun = 1,
    /// Its I/O is done and its outcome posted; not yet committed by its owner.
    IoDone = 2,
}

/// The hook's state (a field of [`CacheVolume`]); idle unless a stepped pass runs.
#[derive(Default)]
pub(super) struct Pause {
    armed: AtomicBool,
    st: Mutex<PauseState>,
    cv: Condvar,
}

#[derive(Default)]
struct PauseState {
    /// The thread running the stepped pass: no other pass is held.
    thread: Option<ThreadId>,
    reached: u8,
    released: u8,
    finished: bool,
}

impl Pause {
    fn state(&self) -> MutexGuard<'_, PauseState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the unlocked pass at `stage`: if it is the stepped pass, says so and waits
    /// to be released; before its I/O it also goes on once a request waits for that I/O
    /// (`waiters`), as it would without the hook. Free when no pass is stepped.
    pub(super) fn at(&self, stage: Stage, waiters: &AtomicU64) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.state();
        if s.thread != Some(std::thread::current().id()) {
            return;
        }
        // Only the first pass is held (unmap-ahead may run more): later ones go on.
        s.reached = s.reached.max(stage as u8);
        self.cv.notify_all();
        while s.released < stage as u8
            && !(stage == Stage::Begun && waiters.load(Ordering::Acquire) > 0)
        {
            // Polled: a waiter announces itself in `wb_waiters`, not on this condvar.
            s = self
                .cv
                .wait_timeout(s, Duration::from_micros(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A cleaning pass held between its steps ([`CacheVolume::stepped_clean`]). Dropping it
/// lets the pass run to its end.
#[doc(hidden)]
pub struct SteppedClean {
    vol: Arc<CacheVolume>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

/// Marks the pass finished however its thread ends (a panic too), so no caller waits on.
struct Finished<'a>(&'a Pause);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.state().finished = true;
        self.0.cv.notify_all();
    }
}

impl CacheVolume {
    /// Test hook: begins a cleaning pass of at most `n` lines as the background cleaner
    /// does (outside the volume lock, whatever the watermarks) and returns once it is
    /// begun and held before its I/O, or over (an empty pass, a pass run under the lock:
    /// inline cleaning, steps other than write-backs). Then [`SteppedClean::io`] and
    /// [`SteppedClean::commit`]. One stepped pass at a time; no other cleaning (the cleaner
    /// thread, `ctl flush`, a mode switch) while it runs: they wait for it.
    #[doc(hidden)]
    pub fn stepped_clean(self: &Arc<Self>, n: u64) -> SteppedClean {
        self.stepped(move |v| {
            let owner = v.clean_owner();
            let g = v.lock();
            if g.closed || g.failed {
                return Ok(());
            }
            let (g, r) = v.clean_pass_unlocked(&owner, g, n);
            drop(g);
            drop(owner);
            r
        })
    }

    /// Test hook: [`CacheVolume::unmap_ahead_if_needed`] with its first write-back outside
    /// the lock held as [`CacheVolume::stepped_clean`]'s pass is; the unmapping comes with
    /// the commit.
    #[doc(hidden)]
    pub fn stepped_unmap_ahead(self: &Arc<Self>) -> SteppedClean {
        self.stepped(|v| v.unmap_ahead_if_needed().map(|_| ()))
    }

    fn stepped(
        self: &Arc<Self>,
        pass: impl FnOnce(&CacheVolume) -> io::Result<()> + Send + 'static,
    ) -> SteppedClean {
        {
            let mut s = self.pause.state();
            assert!(s.thread.is_none(), "one stepped cleaning pass at a time");
            *s = PauseState::default();
        }
        let v = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name("tiercache-stepped-clean".into())
            .spawn(move || {
                let _finished = Finished(&v.pause);
                v.pause.state().thread = Some(std::thread::current().id());
                v.pause.armed.store(true, Ordering::Release);
                pass(&v)
            })
            .expect("spawn the stepped cleaning pass");
        let p = SteppedClean {
            vol: Arc::clone(self),
            thread: Some(thread),
        };
        p.wait_for(Stage::Begun);
        p
    }
}

impl SteppedClean {
    fn wait_for(&self, stage: Stage) {
        let pause = &self.vol.pause;
        let mut s = pause.state();
        while s.reached < stage as u8 && !s.finished {
            s = pause.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, stage: Stage) {
        let pause = &self.vol.pause;
        let mut s = pause.state();
        s.released = s.released.max(stage as u8);
        pause.cv.notify_all();
    }

    /// Whether the pass is held with a write-back in flight outside the lock (begun, not
    /// committed by its owner; a request may have committed it already).
    pub fn in_flight(&self) -> bool {
        let s = self.vol.pause.state();
        s.reached >= Stage::Begun as u8 && !s.finished
    }

    /// Runs the pass's I/O (cache reads, backing writes; no lock) and returns when it is
    /// done, before the commit.
    pub fn io(&mut self) {
        self.release(Stage::Begun);
        self.wait_for(Stage::IoDone);
    }

    /// Commits the pass (under the volume lock, if no request did) and returns its result.
    pub fn commit(mut self) -> io::Result<()> {
        self.finish()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    fn finish(&mut self) -> std::thread::Result<io::Result<()>> {
        self.release(Stage::IoDone);
        let r = match self.thread.take() {
            Some(t) => t.join(),
            None => Ok(Ok(())),
        };
        self.vol.pause.armed.store(false, Ordering::Release);
        self.vol.pause.state().thread = None;
        r
    }
}

impl Drop for SteppedClean {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Not committed (the caller stopped early, e.g. at a power cut): let it end.
            let _ = self.finish();
        }
    }
}

impl CacheVolume {
    /// Test hook: the cleaner thread ([`CacheVolume::start_cleaner`]) ends after its current
    /// pass, the volume otherwise untouched (nothing written, not shut down), so a test can
    /// join it and then cut the power with no cleaning pass running on dead devices.
    #[doc(hidden)]
    pub fn stop_cleaner(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
