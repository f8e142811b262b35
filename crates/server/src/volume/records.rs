//! The durable records on the cache device (rules 1, 2 and 5 of the module doc): in-flux marking,
//! unmapping before reuse, metadata flushes, the superblock, and rolling back records of failed
//! steps.

use super::*;

impl CacheVolume {
    /// Syncs the cache device (every cache sync of a running volume goes through here): a
    /// sync that succeeds makes every data-area write before it durable
    /// (`Inner::cache_unsynced` cleared). A sync that fails may have dropped them (Linux after a writeback error: the pages
    /// are marked clean, reads return the older bytes, a later sync succeeds without them):
    /// they move to `Inner::cache_dropped`, whose lines no recovery copies unverified and
    /// [`CacheVolume::settle_dropped`] drops at the next safe point.
    pub(super) fn sync_cache(&self, g: &mut Inner) -> io::Result<()> {
        match self.cache.sync() {
            Ok(()) => {
                g.cache_unsynced.clear();
                Ok(())
            }
            Err(e) => {
                self.cache_sync_failures.fetch_add(1, Ordering::AcqRel);
                // One pool member's sync failed (the others synced): only its slots' writes
                // may be dropped.
                let member = crate::pool_dev::member_of_error(&e)
                    .filter(|&d| d < g.member_errors.len())
                    .map(|d| g.engine.pool().range(d));
                for (s, m) in std::mem::take(&mut g.cache_unsynced) {
                    if member.as_ref().is_none_or(|r| r.contains(&u64::from(s))) {
                        *g.cache_dropped.entry(s).or_insert(0) |= m;
                    }
                }
                Err(e)
            }
        }
    }

    pub(super) fn write_superblock(&self, g: &mut Inner) -> io::Result<()> {
        if g.failed {
            return Err(ioerr(
                "the cache device failed (see the log and `ctl stats`); the volume passes through to the backing device until restarted with a newly formatted cache",
            ));
        }
        g.sb.generation += 1;
        self.cache.write_at(&g.sb.encode(), 0)?;
        self.sync_cache(g)
    }

    /// Rule 5 of the module doc: the metadata pages to flag in flux before `steps` run, i.e.
    /// those holding a durable record that maps
    /// * a slot a step writes in place, for the key the engine keeps there;
    /// * a line of the request (`before`: its slots and keys before the plan) that the plan
    ///   drops or replaces, or whose backing range it writes (`all_lines`: a write or trim
    ///   spanning more lines than the cache holds, for which `before` is not listed);
    /// * a line the plan writes on the backing device and the engine dropped earlier in this
    ///   epoch (`forgotten`).
    pub(super) fn flux_pages_for(
        g: &Inner,
        steps: &[Step],
        before: &[(u32, u64)],
        all_lines: bool,
    ) -> BTreeSet<u64> {
        let line_shift = g.sb.line_size.trailing_zeros();
        let mut pages = BTreeSet::new();
        let mut need = |slot: u32| {
            pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
        };
        let writes_backing = steps.iter().any(|s| matches!(s, Step::WriteHdd { .. }));
        if all_lines {
            // A write or trim of more lines than the cache holds (`before` is not listed):
            // every mapped record may be concerned.
            for s in g.mapped_on_disk() {
                need(s);
            }
        }
        for &(s, k) in before {
            if g.disk_key(s) == k && (writes_backing || g.engine.slot_key(s) != Some(k)) {
                need(s);
            }
        }
        for st in steps {
            match *st {
                Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } if len > 0 => {
                    for s in ssd >> line_shift..=(ssd + len - 1) >> line_shift {
                        let on_disk = g.disk_key(s as u32);
                        if on_disk != EMPTY_KEY && g.engine.slot_key(s as u32) == Some(on_disk) {
                            need(s as u32);
                        }
                    }
                }
                Step::WriteHdd { hdd, len, .. } if len > 0 && !g.forgotten.is_empty() => {
                    let (v, o) = (vol_of(hdd), hdd & VOL_MASK);
                    for l in o >> line_shift..=(o + len - 1) >> line_shift {
                        let key = Engine::line_key(v, l);
                        if let Some(&s) = g.forgotten.get(&key) {
                            if g.disk_key(s) == key {
                                need(s);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        pages
    }

    /// Flags every record of `pages` not flagged yet in flux on the device (each run of
    /// pages read and written once, then one sync), rule 5 of the module doc; `pages` stay
    /// flagged for [`FLUX_EPOCHS`] more flushes.
    pub(super) fn mark_in_flux(&self, g: &mut Inner, pages: &BTreeSet<u64>) -> io::Result<()> {
        let epoch = g.flush_epoch;
        let mut new = BTreeSet::new();
        for &p in pages {
            if let Some(e) = g.flux_pages.get_mut(&p) {
                *e = epoch;
            } else {
                new.insert(p);
            }
        }
        let pages = &new;
        if pages.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for (first, n) in runs(pages) {
            // The pages as last written (only this volume writes them), every mapped record
            // flagged; its key, masks and sequence number stay.
            buf.resize((n * PAGE) as usize, 0);
            self.cache.read_at(&mut buf, META_OFFSET + first * PAGE)?;
            for rec in buf.chunks_mut(RECORD_BYTES as usize) {
                if let Some(r) = Record::decode(rec).filter(|r| r.key != EMPTY_KEY) {
                    r.encode_flagged(rec, true);
                }
            }
            self.cache.write_at(&buf, META_OFFSET + first * PAGE)?;
        }
        self.sync_cache(g)?;
        g.flux_pages.extend(pages.iter().map(|&p| (p, epoch)));
        self.metrics.flux_syncs.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .flux_pages
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Rule 2 of the module doc: slots in `[ssd, ssd + len)` whose durable record maps a key
    /// other than the one the engine now keeps there are unmapped on the device first. The
    /// same batch (one page write per run of pages, one sync) unmaps ahead the persisted
    /// records of the engine's next likely victims whose lines are clean, so their evictions
    /// need no sync. Errors: (whether the cache device failed, the error).
    pub(super) fn unmap_before_reuse(
        &self,
        g: &mut Inner,
        ssd: u64,
        len: u64,
    ) -> Result<(), (bool, io::Error)> {
        let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
        let need: Vec<u32> = (a..=b)
            .map(|s| s as u32)
            .filter(|&s| {
                let on_disk = g.disk_key(s);
                on_disk != EMPTY_KEY && g.live_key(s) != on_disk
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let mut ahead = Vec::new();
        let k = self.unmap_batch_now();
        if k > 1 {
            let mut cand = Vec::new();
            g.engine.eviction_candidates(k, &mut cand);
            for s in cand {
                let key = g.engine.slot_key(s);
                if key.is_some()
                    && key == Some(g.disk_key(s))
                    && g.engine.dirty_mask(s) == 0
                    && !need.contains(&s)
                {
                    ahead.push(s);
                }
            }
        }
        self.metrics
            .unmap_on_miss
            .fetch_add(need.len() as u64, Ordering::Relaxed);
        g.unmapped_on_miss = true;
        self.unmap_records(g, &need, &ahead)
    }

    /// Rewrites the device records of `now` (slots about to be reused) and `ahead` (slots
    /// whose clean line the engine keeps) as empty: a backing sync first when write-backs
    /// ran since the last one, then each run of pages read and written once, then one cache
    /// sync. `ahead` slots' `mem` records become empty first and stay so while their line is
    /// clean (see `Inner::ahead`); `now` slots' records follow the engine after the plan.
    pub(super) fn unmap_records(
        &self,
        g: &mut Inner,
        now: &[u32],
        ahead: &[u32],
    ) -> Result<(), (bool, io::Error)> {
        let on_disk: Vec<u32> = now
            .iter()
            .chain(ahead)
            .copied()
            .filter(|&s| g.disk_key(s) != EMPTY_KEY)
            .collect();
        // The backing sync first, before `mem` changes: a failure leaves everything as it was
        // (an `ahead` record emptied in `mem` would let a roll-back drop its clean line,
        // whose backing copy the failed sync may have dropped). Also when no record is on
        // the device but an `ahead` line was written to the backing device since the last
        // good sync (rule 2: unmapped ahead only once the backing device holds it durably;
        // else its eviction, which needs no sync then, would drop the only good copy).
        if (!on_disk.is_empty() || self.ahead_unsynced(g, ahead)) && g.backing_unsynced() {
            let evicting = Self::evicting(g, now);
            self.sync_backoff(g).map_err(|e| (false, e))?;
            self.sync_backing_with(g, &evicting)
                .map_err(|e| (false, e))?;
        }
        // `ahead` first in `mem` (and `Inner::ahead`): if the device writes fail half way,
        // their records may be empty on the device already, and stay so in `mem`.
        for &s in ahead {
            let Some(key) = g.engine.slot_key(s) else {
                continue;
            };
            g.put_ahead(s, key);
        }
        if !on_disk.is_empty() {
            let c = |e| (true, e);
            let empty = Record {
                seq: g.seq,
                ..Record::EMPTY
            };
            g.seq = g.seq.wrapping_add(1);
            let pages: BTreeSet<u64> = on_disk
                .iter()
                .map(|&s| s as u64 / format::RECORDS_PER_PAGE)
                .collect();
            let mut buf = Vec::new();
            for (first, n) in runs(&pages) {
                // The pages as last written (metadata is only ever written by this volume, so
                // the device returns exactly that), with the batch's records emptied.
                buf.resize((n * PAGE) as usize, 0);
                self.cache
                    .read_at(&mut buf, META_OFFSET + first * PAGE)
                    .map_err(c)?;
                let span = first * format::RECORDS_PER_PAGE..(first + n) * format::RECORDS_PER_PAGE;
                for &s in &on_disk {
                    if span.contains(&(s as u64)) {
                        let o = ((s as u64 - span.start) * RECORD_BYTES) as usize;
                        empty.encode(&mut buf[o..o + RECORD_BYTES as usize]);
                    }
                }
                self.cache
                    .write_at(&buf, META_OFFSET + first * PAGE)
                    .map_err(c)?;
            }
            self.sync_cache(g).map_err(c)?;
            for &s in &on_disk {
                g.set_disk_key(s, EMPTY_KEY);
            }
            self.metrics.unmap_syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .unmap_ahead
            .fetch_add(ahead.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the line of an `ahead` slot overlaps a backing range written since the last
    /// good sync.
    fn ahead_unsynced(&self, g: &Inner, ahead: &[u32]) -> bool {
        ahead.iter().any(|&s| {
            g.engine.slot_key(s).is_some_and(|k| {
                let a = key_addr(k, self.line_shift);
                g.unsynced_overlaps(a, a + self.line_size())
            })
        })
    }

    /// `(slot, key, valid)` of the lines the plan being run evicts from `slots`: they still
    /// hold them (`mem` has their records as before the plan), so a failed backing sync
    /// writes those lines again from there ([`CacheVolume::sync_backing_with`]).
    pub(super) fn evicting(g: &Inner, slots: &[u32]) -> Vec<(u32, u64, u64)> {
        slots
            .iter()
            .filter_map(|&s| {
                let r = g.mem_record(s);
                (r.key != EMPTY_KEY && !r.is_copy() && g.engine.slot_key(s) != Some(r.key))
                    .then_some((s, r.key, r.valid))
            })
            .collect()
    }

    /// `(slot, key, valid)` of every line `mem` records in `slots` (before a plan's first
    /// cache write: what each slot holds), for [`CacheVolume::sync_backing_with`].
    pub(super) fn held_before_plan(g: &Inner, slots: &[u32]) -> Vec<(u32, u64, u64)> {
        slots
            .iter()
            .filter_map(|&s| {
                let r = g.mem_record(s);
                // (A copy's bytes are its line's, which its line's slot holds too.)
                (r.key != EMPTY_KEY && !r.is_copy() && r.valid != 0).then_some((s, r.key, r.valid))
            })
            .collect()
    }

    /// Brings the `mem` records of `slots` (slots an engine call moved outside any plan) up to
    /// the engine's state, leaving the plan's own `g.slots` as they are.
    pub(super) fn update_records_of(g: &mut Inner, slots: Vec<u32>) {
        let plan_slots = std::mem::replace(&mut g.slots, slots);
        Self::update_records(g);
        g.slots = plan_slots;
    }

    /// Brings the `mem` records of `g.slots` up to the engine's state.
    pub(super) fn update_records(g: &mut Inner) {
        let mut slots = std::mem::take(&mut g.slots);
        // Copy slots whose records changed without a step on them (a line's copy linked,
        // unlinked, or its line's dirty sectors changed): possibly listed twice, which
        // changes nothing the second time.
        g.engine.take_copy_slots(&mut slots);
        for &slot in &slots {
            if Self::filling(g, slot) {
                // Its image stays empty until the fill commits (`fill.rs`).
                continue;
            }
            let (have, on_disk) = (g.mem_record(slot), g.disk_key(slot));
            g.engine.take_journaled(slot);
            Self::update_record(g, slot, Some(have), on_disk);
        }
        g.engine.shrink_journal(MAX_SLOTS_SCRATCH);
        // A scratch bounded by a plan, not by the cache: open and `fail_cache` pass every
        // slot once, and keeping that capacity would cost 4 B per line for ever.
        g.slots = if slots.capacity() > MAX_SLOTS_SCRATCH {
            Vec::new()
        } else {
            slots
        };
    }

    /// Brings slot `slot`'s image record from `have` (`None`: a record that does not decode)
    /// to the engine's state; its durable record maps `on_disk`. Its journaled state was
    /// taken already.
    pub(super) fn update_record(g: &mut Inner, slot: u32, have: Option<Record>, on_disk: u64) {
        if let Some(&k) = g.ahead.get(&slot) {
            // Unmapped ahead: stays empty on the device while its line stays clean and
            // the backing device holds it durably. Written through (or back) since,
            // its backing copy waits for a sync: it maps its line again, so that its
            // eviction syncs first (`sync_before_reuse`) and a failed sync rewrites it.
            let a = key_addr(k, g.sb.line_size.trailing_zeros());
            if g.engine.slot_key(slot) == Some(k)
                && g.engine.dirty_mask(slot) | g.engine.pending_mask(slot) == 0
                && !g.unsynced_overlaps(a, a + g.sb.line_size)
            {
                return;
            }
            g.ahead.remove(&slot);
        }
        // Sectors a write-back in flight cleans stay dirty on the device until it commits
        // (its backing write may not have landed): `line_state`'s dirty includes them.
        let want = durable::record_of(g.engine.line_state(slot));
        if let Some(h) = have.filter(|h| h.key != want.key && h.key != EMPTY_KEY && !h.is_copy()) {
            // Dropped while the device may still map it here (rule 5).
            if on_disk == h.key {
                g.forgotten.insert(h.key, slot);
            }
        }
        let same = have.is_some_and(|h| {
            h.key == want.key
                && (want.key == EMPTY_KEY || (h.valid == want.valid && h.dirty == want.dirty))
        });
        // The image now is the engine's line: the durable record still maps `on_disk`.
        g.keep_disk_key(slot, on_disk);
        if !same {
            g.dirty_pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
        }
    }

    /// Rule 4: backing sync, cache sync, changed metadata pages, cache sync.
    /// A cache-device failure here fails the cache (see [`CacheVolume::fail_cache`]); the
    /// flush then fails only if dirty data was lost with it.
    pub(super) fn flush_locked(&self, g: &mut Inner) -> io::Result<()> {
        debug_assert!(
            g.wb.is_none(),
            "a flush while a write-back is in flight would not cover it (reap first)"
        );
        self.settle_dropped(g);
        if g.failed {
            return self.sync_backing(g).map_err(|e| self.backing_error(e));
        }
        self.sync_backing(g).map_err(|e| self.backing_error(e))?;
        let mut r = self.flush_cache(g);
        // One pool member failing the flush: that member alone is failed (its dirty lines
        // written back or reported lost, its failure recorded), and the flush is done again
        // on the others.
        while let Some(d) = r.as_ref().err().and_then(crate::pool_dev::member_of_error) {
            if g.failed || d >= g.member_errors.len() || g.engine.device_failed(d) {
                break;
            }
            let lost_before = g.lost.clone();
            self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
            g.member_errors[d] += 1;
            let e = r.unwrap_err();
            self.fail_member(g, d, &format!("a flush failed on it: {e}"));
            if !g.failed && !g.engine.device_failed(d) {
                r = Err(e); // not taken out alone: the whole cache fails below
                break;
            }
            self.settle_dropped(g);
            if g.lost != lost_before {
                return Err(io::Error::other(format!(
                    "flush: a pool member failed and dirty data was lost ({e})"
                )));
            }
            // Its dirty lines were just written back: synced before any record says so.
            self.sync_backing(g).map_err(|e| self.backing_error(e))?;
            if g.failed {
                return Ok(());
            }
            r = self.flush_cache(g);
        }
        if let Err(e) = r {
            let lost_before = g.lost.clone();
            g.cache_errors += 1;
            self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("cache device failed during a flush: {e}");
            // A failed sync moved the data-area writes since the last good one to
            // `cache_dropped`: `fail_cache`'s write-back copies none of them unverified.
            let erased = self.fail_cache(g, &format!("cache device failed during a flush: {e}"));
            // (Compared whole: a newly lost range may merge into one listed already.)
            if g.lost != lost_before {
                return Err(io::Error::other(format!(
                    "flush: the cache device failed and dirty data was lost ({e})"
                )));
            }
            // Records on the device may still map lines changed since: unless the device is
            // marked unusable, a restart could serve them, so the flush is not complete.
            if !erased {
                return Err(io::Error::other(format!(
                    "flush: the cache device failed and could not be marked unusable ({e})"
                )));
            }
        }
        Ok(())
    }

    /// The cache half of a flush: sync, changed metadata pages (flagged again if still in
    /// flux) and pages retiring from flux (rewritten without the flag), sync.
    pub(super) fn flush_cache(&self, g: &mut Inner) -> io::Result<()> {
        // Data checksums changed since the last flush: durable with the data they describe,
        // before any record that maps it (`crate::data_sums`).
        if let Some(s) = g.sums.as_mut().filter(|s| s.has_dirty()) {
            s.write_dirty(&*self.cache)?;
        }
        self.sync_cache(g)?;
        let header = g.sums.as_ref().is_some_and(|s| s.header_dirty);
        self.flush_cache_records(g)?;
        if let Some(s) = g.sums.as_mut().filter(|_| header) {
            // Lost ranges rewritten since: after the records that map the new data (a crash
            // in between keeps reporting the range lost, never serves the stale backing copy).
            s.lost = g.lost.clone();
            s.write_header(&*self.cache)?;
            self.sync_cache(g)?;
        }
        self.clear_rewritten_lost(g)?;
        Ok(())
    }

    /// The records half of [`CacheVolume::flush_cache`] (after its first sync).
    fn flush_cache_records(&self, g: &mut Inner) -> io::Result<()> {
        // Rule 4: a record claims its clean line matches the backing device, so every
        // backing write must have been followed by a sync that succeeded.
        assert!(
            g.hdd_unsynced.is_empty(),
            "cache records written while {} backing ranges are not synced (first {:?})",
            g.hdd_unsynced.len(),
            g.hdd_unsynced.iter().next()
        );
        // A record maps data the device must already hold: every data-area write before it
        // was synced by a sync that succeeded (`Inner::cache_unsynced`).
        assert!(
            g.cache_unsynced.is_empty(),
            "cache records written while {} slots' data is not synced (first {:?})",
            g.cache_unsynced.len(),
            g.cache_unsynced.iter().next()
        );
        let epoch = g.flush_epoch;
        let retiring: BTreeSet<u64> = g
            .flux_pages
            .iter()
            .filter(|&(_, &e)| e + FLUX_EPOCHS <= epoch)
            .map(|(&p, _)| p)
            .collect();
        if g.dirty_pages.is_empty() && retiring.is_empty() {
            return Ok(());
        }
        let mut pages = g.dirty_pages.clone();
        pages.extend(&retiring);
        let mut buf = Vec::new();
        // Every record this flush writes carries its sequence number (rule 3: a key the
        // engine maps once is in one record of a flush).
        let seq = g.seq;
        g.seq = g.seq.wrapping_add(1);
        let rpp = format::RECORDS_PER_PAGE;
        let runs = runs(&pages);
        if self.cache.pool_lines().len() > 1 {
            // A pool raises its members' flags for the whole batch first: a line's record
            // and its copy's are then written in either order (`crate::pool_dev`).
            let mut all = Vec::with_capacity(runs.len());
            for &(page, n) in &runs {
                let mut b = vec![0u8; (n * PAGE) as usize];
                Self::encode_pages(g, &mut b, page, seq, &retiring);
                all.push((META_OFFSET + page * PAGE, b));
            }
            let writes: Vec<(u64, &[u8])> = all.iter().map(|(o, b)| (*o, &b[..])).collect();
            self.cache.prepare_records(&writes)?;
        }
        // One write per run of consecutive pages, encoded from the image (`mem_record`).
        for (page, n) in runs {
            buf.clear();
            buf.resize((n * PAGE) as usize, 0);
            Self::encode_pages(g, &mut buf, page, seq, &retiring);
            self.cache.write_at(&buf, META_OFFSET + page * PAGE)?;
            g.durable_is_mem((page * rpp) as u32, ((page + n) * rpp) as u32);
        }
        self.sync_cache(g)?;
        g.dirty_pages.clear();
        g.flux_pages.retain(|p, _| !retiring.contains(p));
        g.flush_epoch += 1;
        g.forgotten.clear();
        self.metrics
            .metadata_pages
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Encodes record pages `page..` into `buf` (whole pages) from the image (`mem_record`),
    /// with sequence number `seq`, flagged in flux where still in flux and not `retiring`.
    fn encode_pages(g: &Inner, buf: &mut [u8], page: u64, seq: u32, retiring: &BTreeSet<u64>) {
        let (rpp, cap) = (format::RECORDS_PER_PAGE, g.sb.capacity_lines);
        for (i, b) in buf.chunks_mut(PAGE as usize).enumerate() {
            let q = page + i as u64;
            let flagged = g.flux_pages.contains_key(&q) && !retiring.contains(&q);
            for (j, rec) in b.chunks_mut(RECORD_BYTES as usize).enumerate() {
                let slot = q * rpp + j as u64;
                if slot >= cap {
                    // Past the last slot: as formatted.
                    Record::EMPTY.encode(rec);
                    continue;
                }
                let r = Record {
                    seq,
                    ..g.mem_record(slot as u32)
                };
                r.encode_flagged(rec, flagged);
            }
        }
    }

    /// Puts the engine back for `slots` as their `mem` records say (the state before the plan
    /// that just failed, since nothing in the cache changed): lines the plan placed there are
    /// dropped, lines it evicted or cleaned come back with their masks. A line unmapped ahead
    /// (empty `mem` record, clean) is dropped: the backing device holds its data.
    ///
    /// Mirrored lines stay mirrored (`--dirty-copies 2`): dropping a dirty line unlinks its
    /// copy, and so did the plan for a dirty victim it evicted. A copy slot whose `mem`
    /// record still names a line the roll-back put back with the same dirty sectors is that
    /// line's copy again (nothing in the cache changed: it holds them). Otherwise the line
    /// stays unmirrored (counted, re-mirrored by the cleaner) and the copy's record follows
    /// the engine's empty slot at `update_records` (it is journaled).
    pub(super) fn roll_back(&self, g: &mut Inner, slots: &[u32]) {
        let mut slots = slots.to_vec();
        slots.sort_unstable();
        slots.dedup();
        // Copy slots the plan wrote or whose copy it unlinked (without a step on them).
        let mut copies: Vec<u32> = slots
            .iter()
            .chain(g.engine.copy_slots_journaled())
            .copied()
            .filter(|&c| g.mem_record(c).is_copy())
            .collect();
        copies.sort_unstable();
        copies.dedup();
        let mut restore = Vec::new();
        for &s in &slots {
            // (A copy's record is not a line: copies are linked again below.)
            let want = Some(g.mem_record(s))
                .filter(|r| r.key != EMPTY_KEY && !r.is_copy() && r.valid != 0);
            let now = g.engine.slot_key(s);
            if let Some(r) = want {
                if now == Some(r.key)
                    && g.engine.valid_mask(s) == r.valid
                    && g.engine.dirty_mask(s) == r.dirty
                {
                    continue;
                }
                let class = if now == Some(r.key) {
                    g.engine.line_class(s)
                } else {
                    0
                };
                restore.push((s, r, class));
            }
            g.engine.drop_line(s);
        }
        for (s, r, class) in restore {
            // A key moved within the plan (evicted, then cached again elsewhere): that slot
            // was touched too, so it was emptied above.
            if let Err(err) = g.engine.restore_line(r.key, s, r.valid, r.dirty, class) {
                assert!(
                    r.dirty == 0,
                    "rolling back slot {s}: dirty line {:#x} could not be restored: {err}",
                    r.key
                );
                tracing::warn!("rolling back slot {s}: clean line dropped ({err})");
            }
        }
        for c in copies {
            let r = g.mem_record(c);
            let (key, primary) = (r.line_key(), r.valid as u32);
            if g.engine.copy_of(primary).is_some() || g.engine.owner_of(c).is_some() {
                continue;
            }
            if g.engine.slot_key(primary) != Some(key) || g.engine.dirty_mask(primary) != r.dirty {
                continue;
            }
            if let Err(err) = g.engine.restore_copy(key, primary, c, r.dirty) {
                tracing::warn!("rolling back copy slot {c}: line {key:#x} left unmirrored ({err})");
            }
        }
    }
}

/// Runs of consecutive numbers in `set`: (first, count).
fn runs(set: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in set {
        match out.last_mut() {
            Some((a, n)) if *a + *n == p => *n += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}
