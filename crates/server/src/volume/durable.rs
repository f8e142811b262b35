//! The key each slot's durable record maps (rule 2 of the module doc), kept as a difference
//! from the record image `mem` instead of a `u64` per slot (issue 16 item 1, plan-lean step
//! 3: -8 B per cached line).
//!
//! A slot's durable record and its `mem` record map the same key almost always: they part
//! only between a change of `mem` (`update_records`, unmapping ahead) and the flush that
//! writes its page, or after an unmap on the device that `mem` does not follow yet. So one
//! *diverged* bit per slot says "the durable key may differ from `mem`'s", and a side map
//! holds the durable key of diverged slots whose durable record maps a line (a diverged slot
//! missing from it maps nothing). Not diverged: the durable key is `mem`'s.
//!
//! Side entries come from lines dropped while their durable record still maps them (slots
//! reused are unmapped on the device first, which leaves no entry): trims, invalidations,
//! evictions without reuse. A request finding more than [`DIVERGED_BOUND`] of them flushes
//! the records first ([`CacheVolume::flush_if_diverged`]), which empties the map.

use super::*;
use tiercache_engine::LineState;

/// Side entries (slots whose durable record maps a key `mem` no longer has there) above
/// which the next request flushes the records first: bounds the map at ~1.5 MiB whatever
/// the cache's size.
pub(super) const DIVERGED_BOUND: usize = 65536;

pub(super) struct DurableKeys {
    /// Bit per slot: the durable record may map another key than `mem`'s record.
    diverged: Vec<u64>,
    /// Durable key of diverged slots whose durable record maps one (absent: none).
    side: HashMap<u32, u64>,
    /// [`DIVERGED_BOUND`], lowered by tests ([`CacheVolume::set_diverged_bound`]).
    pub(super) bound: usize,
    /// Records flushes the bound forced so far.
    pub(super) forced: u64,
}

impl DurableKeys {
    /// `cap` slots whose durable records equal `mem` (as read at open).
    pub(super) fn new(cap: usize) -> DurableKeys {
        DurableKeys {
            diverged: vec![0; cap.div_ceil(64)],
            side: HashMap::new(),
            bound: DIVERGED_BOUND,
            forced: 0,
        }
    }

    #[inline]
    fn is_diverged(&self, s: u32) -> bool {
        self.diverged[s as usize / 64] >> (s % 64) & 1 == 1
    }

    #[inline]
    fn set(&mut self, s: u32, on: bool) {
        let (w, b) = (s as usize / 64, s % 64);
        if on {
            self.diverged[w] |= 1 << b;
        } else {
            self.diverged[w] &= !(1 << b);
        }
    }

    /// Heap bytes (for `ram_index_bytes`).
    pub(super) fn mem_bytes(&self) -> usize {
        self.diverged.capacity() * 8
            + tiercache_engine::mem::hash_bytes(
                self.side.capacity(),
                std::mem::size_of::<(u32, u64)>(),
            )
    }

    /// Side entries now.
    pub(super) fn side_len(&self) -> usize {
        self.side.len()
    }

    /// Whether the next request should flush the records first.
    pub(super) fn over_bound(&self) -> bool {
        self.side.len() > self.bound
    }
}

/// The record a [`LineState`] describes (no line: `Record::EMPTY`); sequence number 0 (a
/// flush gives every record it writes its own, `Inner::seq`).
#[inline]
pub(super) fn record_of(l: LineState) -> Record {
    if l.key == EMPTY_KEY {
        return Record::EMPTY;
    }
    Record {
        key: l.key,
        valid: l.valid,
        dirty: l.dirty,
        seq: 0,
    }
}

impl Inner {
    /// Slot `s`'s record in the image of the metadata area (`mem` of the module doc): what
    /// the next flush writes. Not held per slot: it is the engine's line
    /// ([`Engine::line_state`]) except for slots the engine changed since `update_records`
    /// last took them (their state before, from the engine's journal) and slots unmapped
    /// ahead (`Inner::ahead`: empty).
    #[inline]
    pub(super) fn mem_record(&self, s: u32) -> Record {
        if !self.ahead.is_empty() && self.ahead.contains_key(&s) {
            return Record::EMPTY;
        }
        record_of(
            self.engine
                .journaled(s)
                .unwrap_or_else(|| self.engine.line_state(s)),
        )
    }

    /// Key of slot `s`'s record in the image (`mem_record`).
    #[inline]
    pub(super) fn mem_key(&self, s: u32) -> u64 {
        self.mem_record(s).key
    }

    /// Key of the record the engine's state of slot `s` gives now: its line's key, a copy's
    /// `line key | COPY` (a mirrored dirty line's second copy), or `EMPTY_KEY`. What rule 2
    /// compares the durable key with: a slot written while its durable record maps this key
    /// is written in place, not reused (`slot_key` is `None` for a copy slot, which would
    /// count every mirrored write's copy as reused).
    #[inline]
    pub(super) fn live_key(&self, s: u32) -> u64 {
        self.engine.line_state(s).key
    }

    /// Key slot `s`'s record on the device maps (`EMPTY_KEY`: none or unreadable).
    #[inline]
    pub(super) fn disk_key(&self, s: u32) -> u64 {
        if self.durable.is_diverged(s) {
            self.durable.side.get(&s).copied().unwrap_or(EMPTY_KEY)
        } else {
            self.mem_key(s)
        }
    }

    /// Slot `s`'s durable record now maps `key` (written to the device and synced).
    pub(super) fn set_disk_key(&mut self, s: u32, key: u64) {
        self.keep_disk_key(s, key);
    }

    /// After a change of slot `s`'s image record: its durable record still maps `on_disk`
    /// (its `disk_key` before the change). Every change of the image goes through here
    /// (`update_records`, unmapping ahead, open) except those the engine journals (the
    /// image keeps the state before them until `update_records`).
    pub(super) fn keep_disk_key(&mut self, s: u32, on_disk: u64) {
        let diverged = on_disk != self.mem_key(s);
        self.durable.set(s, diverged);
        if diverged && on_disk != EMPTY_KEY {
            self.durable.side.insert(s, on_disk);
        } else {
            self.durable.side.remove(&s);
        }
    }

    /// The durable records of slots `first..end` now equal the image (their pages were
    /// written from it and synced).
    pub(super) fn durable_is_mem(&mut self, first: u32, end: u32) {
        let end = end.min(self.sb.capacity_lines as u32);
        for s in first..end {
            self.durable.set(s, false);
        }
        if !self.durable.side.is_empty() {
            for s in first..end {
                self.durable.side.remove(&s);
            }
        }
    }

    /// Slot `s`'s clean line `key` is unmapped ahead: its image record becomes empty (and
    /// stays so while the line stays clean, `update_records`), its durable key as it was.
    pub(super) fn put_ahead(&mut self, s: u32, key: u64) {
        let on_disk = self.disk_key(s);
        self.ahead.insert(s, key);
        self.keep_disk_key(s, on_disk);
    }

    /// Slot `s`'s image record becomes `rec` again (its state before a failed plan, which a
    /// write-back commit replaced with the plan's half-done state): journaled until
    /// `update_records` takes it, its durable key as it was, its page to be written.
    pub(super) fn restore_image(&mut self, s: u32, rec: Record) {
        let on_disk = self.disk_key(s);
        self.engine.take_journaled(s);
        self.engine.journal_state(
            s,
            LineState {
                key: rec.key,
                valid: rec.valid,
                dirty: rec.dirty,
            },
        );
        self.keep_disk_key(s, on_disk);
        self.dirty_pages.insert(s as u64 / format::RECORDS_PER_PAGE);
    }

    /// Ends unmapping ahead for every slot (clean shutdown: their lines are mapped again):
    /// their image records stay empty until `update_records` brings them to the engine's
    /// lines. Returns the slots.
    pub(super) fn end_ahead(&mut self) -> Vec<u32> {
        let slots: Vec<u32> = self.ahead.drain().map(|(s, _)| s).collect();
        for &s in &slots {
            // The image showed them empty: the journal says so now.
            self.engine.take_journaled(s);
            self.engine.journal_state(s, LineState::EMPTY);
        }
        slots
    }

    /// Whether any slot's durable record maps a line, and which: every slot with one.
    pub(super) fn mapped_on_disk(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.sb.capacity_lines as u32).filter(|&s| self.disk_key(s) != EMPTY_KEY)
    }
}

impl CacheVolume {
    /// Before planning a request: when more than the bound of slots' durable records map
    /// lines `mem` no longer has there, the records are flushed first (a backing sync, a
    /// cache sync, the changed pages, a sync: a FLUSH), which leaves none.
    ///
    /// Nobody asked for this flush: a failure is logged, not returned (the request goes on;
    /// a cache failure has already switched the volume to the backing device, lost ranges
    /// are listed as by any flush). Not while backing syncs are failing (their backoff
    /// decides when the device is asked again): the map then grows until they succeed.
    pub(super) fn flush_if_diverged(&self, g: &mut Inner) {
        if !g.durable.over_bound() || g.failed || g.closed || g.sync_failing.is_some() {
            return;
        }
        // A flush covers no write-back in flight: commit it first (an error stays its
        // owner's to report, `Inner::wb_error`).
        self.reap(g, false);
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        g.durable.forced += 1;
        tracing::debug!(
            "{} slots' durable records map dropped lines: flushing the records",
            g.durable.side_len()
        );
        if let Err(e) = self.flush_locked(g) {
            tracing::warn!("flushing the records past the bound of dropped lines failed: {e}");
        }
    }

    /// Lowers the side-map bound past which a request flushes the records first (tests:
    /// crash points past the bound on a small cache).
    #[doc(hidden)]
    pub fn set_diverged_bound(&self, n: usize) {
        self.lock().durable.bound = n;
    }

    /// (side entries now, records flushes the bound forced so far), for tests.
    #[doc(hidden)]
    pub fn diverged_side(&self) -> (usize, u64) {
        let g = self.lock();
        (g.durable.side_len(), g.durable.forced)
    }
}
