//! Device faults (rule 8 of the module doc): backing-device syncs and the unsynced ranges they
//! cover, the degraded backing device, the failed cache, and pass-through to the backing device.

use super::*;

impl LogVolume {
    /// Cache-device read errors after which the cache is failed (write and sync errors fail
    /// it at once).
    pub fn set_max_cache_errors(&self, n: u64) {
        self.lock().max_cache_errors = n.max(1);
    }

    /// Where a failure of the cache is recorded (`crate::state_file`; the open checked the
    /// one given in [`LogOpenOptions::state_path`]).
    pub fn set_state_path(&self, p: Option<std::path::PathBuf>) {
        self.lock().state_path = p;
    }

    /// Whether the cache device has been failed (all requests go to the backing device).
    pub fn cache_failed(&self) -> bool {
        self.lock().pass_through
    }

    /// Whether a failure of the cache, if any, is durable (state file or superblock erase).
    pub fn failure_recorded(&self) -> bool {
        self.lock().failure_unrecorded.is_none()
    }

    /// Whether write-backs are failing on the backing device.
    pub fn degraded(&self) -> bool {
        self.lock().degraded.is_some()
    }

    /// The background retry of failed write-backs (rule 8): when degraded and the backoff
    /// has passed, writes back the dirty extents of one sealed segment (without reclaiming
    /// it); success ends the degraded state. Failing backing syncs are retried the same way
    /// first (`Inner::retry_sync`). Whether it was degraded before.
    pub fn retry_write_backs(&self) -> bool {
        let mut g = self.lock();
        let syncs = g.sync_failing.is_some();
        if syncs && !(g.closed || g.failed || g.pass_through) {
            g.retry_sync();
        }
        let due = g.degraded.as_ref().is_some_and(Degraded::due);
        if !due || g.closed || g.failed || g.pass_through {
            return g.degraded.is_some() || syncs;
        }
        let wbs = (0..g.segs.len() as u32)
            .filter(|&s| g.segs[s as usize].sealed)
            .map(|s| g.eng.reclaim_write_backs(s))
            .find(|w| !w.is_empty());
        let r = match wbs {
            Some(w) => g.write_back_first(&w),
            // Nothing dirty left in sealed segments: nothing to retry.
            None => {
                Degraded::healed(&mut g.degraded);
                Ok(())
            }
        };
        match r {
            // Counted in `backing_write_errors`; no request failed.
            Err(e) if matches!(fault_of(&e), Some(Fault::Backing(_))) => {
                tracing::debug!("write-back retry: {e}");
            }
            r => {
                let _ = g.guard(r);
            }
        }
        true
    }
}

impl Inner {
    /// After a request's error. A damaged dirty extent on read (`InvalidData`, nothing
    /// changed) and a backing-device error that left the volume consistent fail only their
    /// request; a cache-device error fails the cache (rule 8: RAM may be ahead of the
    /// device, and the data path goes to the backing device from now on). Any other error
    /// may leave RAM ahead of the devices: every later request fails until a restart
    /// recovers from what is on the device.
    pub(super) fn guard<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            match fault_of(e) {
                _ if e.kind() == io::ErrorKind::InvalidData => {}
                Some(Fault::Backing(_)) => self.backing_errors += 1,
                Some(Fault::Cache(m)) => {
                    self.cache_errors += 1;
                    let why = format!("cache device error: {m}");
                    self.fail_cache(&why);
                }
                None => self.failed = true,
            }
        }
        r
    }

    pub(super) fn cache_sync(&mut self) -> io::Result<()> {
        self.live.cache_syncs += 1;
        self.cache.sync().map_err(cache_fault)
    }

    pub(super) fn cache_write(&mut self, data: &[u8], off: u64) -> io::Result<()> {
        self.live.ssd_bytes_written += data.len() as u64;
        self.cache.write_at(data, off).map_err(cache_fault)
    }

    /// Rule 2: syncs the backing device if it was written since its last sync. A failure
    /// is a backing fault: its request fails (EIO; for a FLUSH or FUA write, durability was
    /// not established), nothing else changed and the volume keeps serving. The lines
    /// written since the last successful sync may have lost their bytes with the failure
    /// (`hdd_unsynced`), so the next attempt first writes each of them again from the
    /// cache, whose copy is the acknowledged one: a write-through line written since the
    /// last sync is still cached (evicting it takes a reclamation, which follows a seal,
    /// which follows a successful sync: `reserve`), unless it was trimmed or its write
    /// failed (contents unspecified), or its extent is unreadable (then reported lost).
    pub(super) fn backing_sync_if_dirty(&mut self) -> io::Result<()> {
        if !self.hdd_dirty {
            return Ok(());
        }
        if self.resync {
            self.rewrite_unsynced()?;
        }
        if let Err(e) = self.backing.sync() {
            self.live.backing_sync_errors += 1;
            // A line written since that is no longer cached (trims and failed writes left
            // the set: its extent was found damaged or unreadable and dropped) has no copy
            // left to write again: its bytes may be gone from the backing device too.
            let ls = self.ls();
            let gone: Vec<u64> = self
                .hdd_unsynced
                .iter()
                .copied()
                .filter(|&l| self.eng.locate(0, l).is_none())
                .collect();
            for l in gone {
                self.hdd_unsynced.remove(&l);
                degrade::lose(
                    &mut self.lost,
                    l * ls,
                    (l + 1) * ls,
                    self.sb.backing_size,
                    &format!("a backing sync failed ({e}) before it was durable, and its cached copy was dropped (damaged or unreadable)"),
                );
            }
            self.resync = !self.hdd_unsynced.is_empty();
            if self.sync_failing.is_none() {
                tracing::warn!(
                    "backing device sync failed ({e}): the request fails; the {} lines written since its last sync are written again before the next one",
                    self.hdd_unsynced.len()
                );
            }
            Degraded::sync_failed(&mut self.sync_failing, &e);
            return Err(backing_fault(e));
        }
        self.unsynced_lines.clear();
        self.hdd_unsynced.clear();
        self.resync = false;
        self.live.backing_syncs += 1;
        self.hdd_dirty = false;
        Degraded::sync_healed(&mut self.sync_failing);
        Ok(())
    }

    /// The backoff of failing backing syncs, checked where a segment must be sealed for new
    /// bytes (`reserve`): while it runs, the failing device is not asked again at every
    /// sealing write, which fails at once with its last error. Reads are not held back (an
    /// admission refused this way serves the read all the same), nor are FLUSH and commits.
    pub(super) fn sync_backoff(&self) -> io::Result<()> {
        match self.sync_failing.as_ref().filter(|d| !d.due()) {
            Some(d) if self.hdd_dirty => Err(backing_fault(d.sync_backoff_error())),
            _ => Ok(()),
        }
    }

    /// A FLUSH, `ctl flush`, `ctl mode` or shutdown: a client or the operator asks for
    /// durability now, so a sync is tried at once whatever the backoff.
    pub(super) fn sync_retry_now(&mut self) {
        if let Some(d) = self.sync_failing.as_mut() {
            d.retry_at = std::time::Instant::now();
        }
    }

    /// The background retry of failing backing syncs: when the backoff has passed, one
    /// sync (the unsynced lines written again first); success ends the state. No request
    /// fails; an error only counts.
    fn retry_sync(&mut self) {
        if !self.sync_failing.as_ref().is_some_and(Degraded::due) {
            return;
        }
        let r = if self.hdd_dirty {
            self.backing_sync_if_dirty()
        } else {
            match self.backing.sync() {
                Ok(()) => {
                    self.live.backing_syncs += 1;
                    Degraded::sync_healed(&mut self.sync_failing);
                    Ok(())
                }
                Err(e) => {
                    self.live.backing_sync_errors += 1;
                    Degraded::sync_failed(&mut self.sync_failing, &e);
                    Err(backing_fault(e))
                }
            }
        };
        match r {
            Err(e) if matches!(fault_of(&e), Some(Fault::Backing(_))) => {
                tracing::debug!("backing sync retry: {e}");
            }
            r => {
                let _ = self.guard(r);
            }
        }
    }

    /// After a failed backing sync: writes every line of `hdd_unsynced` again from the
    /// cache (see [`Inner::backing_sync_if_dirty`]). A line whose extent cannot be read or
    /// verified may have lost its acknowledged bytes: reported lost (its reads fail, never
    /// older bytes, until it is written again).
    fn rewrite_unsynced(&mut self) -> io::Result<()> {
        let ls = self.ls();
        let mut lines: Vec<u64> = self.hdd_unsynced.iter().copied().collect();
        lines.sort_unstable();
        let mut buf = vec![0u8; ls as usize];
        for line in lines {
            let Some(info) = self.eng.locate(0, line) else {
                // Trimmed since the failed sync: contents unspecified.
                continue;
            };
            match self.read_extent(&info, &mut buf) {
                Ok(true) => {
                    self.backing
                        .write_at(&buf, line * ls)
                        .map_err(backing_fault)?;
                    self.live.backing_resync_lines += 1;
                    self.live.backing_bytes_written += ls;
                }
                r => {
                    let why = match r {
                        Err(e) => format!("cache read failed: {e}"),
                        _ => "its extent fails its checksum".to_string(),
                    };
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("a backing sync failed before it was durable and {why}"),
                    );
                    self.hdd_unsynced.remove(&line);
                }
            }
        }
        Ok(())
    }

    /// A backing fault in the middle of a plan the engine has already made (a seal, a
    /// reclamation): RAM may be ahead of the devices, so it stops the volume (a restart
    /// recovers from the devices) instead of failing only its request. `reserve` syncs the
    /// backing device before the engine plans, so this is not expected to happen.
    pub(super) fn mid_plan(e: io::Error) -> io::Error {
        match fault_of(&e) {
            Some(Fault::Backing(m)) => io_err(format!(
                "backing device error during a seal or reclamation already planned: {m}"
            )),
            _ => e,
        }
    }

    /// Fails the cache (rule 8): copies every dirty line it can still read to the backing
    /// device (what it cannot is recorded lost), records the failure (state file, superblock
    /// erase) and passes every later request through to the backing device.
    fn fail_cache(&mut self, reason: &str) {
        if self.pass_through {
            return;
        }
        tracing::error!(
            "cache device failed ({reason}): writing back dirty data and switching to pass-through"
        );
        let ls = self.ls();
        let dirty = self.dirty_in_lba_order();
        // Lines written through since the last backing sync: from now on only the backing
        // device holds them, so its sync below must cover them; after a failed sync
        // (`resync`) they are copied again first.
        let mut through: Vec<(u64, ExtentInfo)> = self
            .hdd_unsynced
            .iter()
            .filter_map(|&l| self.eng.locate(0, l).map(|i| (l, i)))
            .filter(|(_, i)| !i.dirty)
            .collect();
        through.sort_unstable_by_key(|x| x.0);
        let first: Vec<(u64, ExtentInfo)> = if self.resync {
            dirty.iter().chain(&through).copied().collect()
        } else {
            dirty.clone()
        };
        let mut copied = self.copy_to_backing(&first, "cache failed, dirty line not copied");
        self.live.failure_write_backs += copied.iter().filter(|(_, i)| i.dirty).count() as u64;
        if let Err(e) = self.backing.sync() {
            // It may have dropped what it should have made durable (Linux marks the pages
            // clean): once more, and what still is not durable is reported lost (its reads
            // fail, never older bytes), since nothing but the backing device serves it now.
            tracing::error!(
                "backing device sync after the cache failed: {e}; copying the lines again"
            );
            if !self.resync {
                copied.extend(through.iter().copied());
            }
            let again = self.copy_to_backing(&copied, "cache failed, line not copied again");
            if let Err(e) = self.backing.sync() {
                for (line, _) in again {
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("cache failed and the backing device failed to sync it: {e}"),
                    );
                }
            }
        }
        self.hdd_dirty = false;
        self.hdd_unsynced.clear();
        self.resync = false;
        self.pass_through = true;
        self.degraded = None;
        self.bufs.clear();
        let st = degrade::fail_state(self.sb.uuid, reason, &self.lost);
        let recorded = degrade::record_failure(self.state_path.as_deref(), &*self.cache, &st);
        self.failure_unrecorded = (!recorded).then_some(st);
        if self.lost.is_empty() {
            tracing::error!("cache failed; no dirty data was lost; now in pass-through");
        } else {
            tracing::error!(
                "cache failed; dirty data LOST in {} ranges, {} bytes (reads of them fail until rewritten): {:?}",
                self.lost.len(),
                degrade::lost_bytes(&self.lost),
                self.lost
            );
        }
    }

    /// Copies `lines` from the cache to the backing device (failing the cache); a line that
    /// cannot be read is reported lost (`why`). Returns those copied.
    fn copy_to_backing(
        &mut self,
        lines: &[(u64, ExtentInfo)],
        why: &str,
    ) -> Vec<(u64, ExtentInfo)> {
        let ls = self.ls();
        let mut buf = vec![0u8; ls as usize];
        let mut done = Vec::new();
        for &(line, info) in lines {
            let r = match self.read_extent(&info, &mut buf) {
                Ok(true) => self.backing.write_at(&buf, line * ls),
                Ok(false) => Err(io_err("its extent fails its checksum")),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => done.push((line, info)),
                Err(e) => degrade::lose(
                    &mut self.lost,
                    line * ls,
                    (line + 1) * ls,
                    self.sb.backing_size,
                    &format!("{why}: {e}"),
                ),
            }
        }
        done
    }

    /// Makes the ranges reported lost durable in the lost-range list (`crate::lost_list`),
    /// if it does not cover them yet: run when the volume lock is released, so before the
    /// request that found them returns and before any other is served. A failed cache
    /// needs none (its state file holds the ranges). If the list cannot be written the
    /// cache is failed: the failure and the lost ranges are then recorded in the state file
    /// and the next start is refused naming them.
    pub(super) fn persist_lost(&mut self) {
        if self.pass_through {
            return;
        }
        let Some(l) = self.list.as_mut() else {
            return;
        };
        if crate::lost_list::covers(&l.ranges, &self.lost) {
            return;
        }
        let want = crate::lost_list::union(&l.ranges, &self.lost);
        let mut r = Ok(());
        if !self.sb.lost_pending {
            // The superblock first says version 4: a build that ignores the list refuses
            // the cache before the list holds anything it would serve stale bytes for.
            self.sb.lost_pending = true;
            let b = self.sb.encode();
            r = self.cache_write(&b, 0).and_then(|_| self.cache_sync());
        }
        let Some(l) = self.list.as_mut() else {
            unreachable!("checked above");
        };
        let r = r.and_then(|_| l.write(&*self.cache, &want).map_err(cache_fault));
        if let Err(e) = r.and_then(|_| self.cache_sync()) {
            tracing::error!(
                "could not record the lost ranges on the cache device ({e}): failing the cache so that the state file records them"
            );
            self.cache_errors += 1;
            self.fail_cache(&format!("the lost-range list could not be written: {e}"));
        }
    }

    /// After a commit or a pass-through sync made every acknowledged write durable: the
    /// list drops the ranges written again since (a crash before keeps them listed: reads
    /// fail, never older bytes).
    pub(super) fn clear_rewritten_lost(&mut self) -> io::Result<()> {
        if self.pass_through {
            return Ok(());
        }
        let lost = self.lost.clone();
        let Some(l) = self.list.as_mut() else {
            return Ok(());
        };
        if l.ranges == lost {
            return Ok(());
        }
        l.write(&*self.cache, &lost).map_err(cache_fault)?;
        self.cache_sync()?;
        if lost.is_empty() && self.sb.lost_pending {
            // The list is durably empty: older builds may open the cache again.
            self.sb.lost_pending = false;
            let b = self.sb.encode();
            self.cache_write(&b, 0)?;
            self.cache_sync()?;
        }
        Ok(())
    }

    /// Syncs the backing device for pass-through requests; a failure reports the ranges
    /// written since the last good sync lost (see `Inner::direct_unsynced`).
    pub(super) fn direct_sync(&mut self) -> io::Result<()> {
        match self.backing.sync() {
            Ok(()) => {
                self.direct_unsynced.clear();
                self.live.backing_syncs += 1;
                Degraded::sync_healed(&mut self.sync_failing);
                // Detached: ranges written again since the last sync leave the list.
                if let Err(e) = self.clear_rewritten_lost() {
                    tracing::error!("could not update the lost-range list: {e}");
                }
                Ok(())
            }
            Err(e) => {
                self.live.backing_sync_errors += 1;
                let why = format!("a backing sync failed ({e}) before they were durable");
                for (a, b) in std::mem::take(&mut self.direct_unsynced) {
                    degrade::lose(&mut self.lost, a, b, self.sb.backing_size, &why);
                }
                Err(e)
            }
        }
    }

    pub(super) fn direct(&mut self, req: Direct<'_>) -> io::Result<()> {
        self.live.pass_through_requests += 1;
        if matches!(req, Direct::Write(..) | Direct::Trim(..)) {
            if let Some(st) = self.failure_unrecorded.take() {
                if !degrade::record_failure(self.state_path.as_deref(), &*self.cache, &st) {
                    self.failure_unrecorded = Some(st);
                    return Err(degrade::unrecorded_error(self.state_path.as_deref()));
                }
            }
        }
        let r = match req {
            Direct::Read(off, buf) => degrade::lost_check(&self.lost, off, off + buf.len() as u64)
                .and_then(|_| self.backing.read_at(buf, off)),
            Direct::Write(off, data, fua) => {
                let r = self.backing.write_at(data, off);
                if r.is_ok() {
                    degrade::unlose(&mut self.lost, off, off + data.len() as u64);
                    self.direct_unsynced.push((off, off + data.len() as u64));
                }
                // Bounded: past 4096 unsynced ranges, sync now (what a failure can drop).
                let full = self.direct_unsynced.len() > 4096;
                r.and_then(|_| {
                    if fua || full {
                        self.direct_sync()
                    } else {
                        Ok(())
                    }
                })
            }
            Direct::Flush => self.direct_sync(),
            Direct::Trim(off, len) => {
                degrade::unlose(&mut self.lost, off, off + len);
                Ok(())
            }
        };
        if r.is_err() {
            self.backing_errors += 1;
        }
        r
    }
}
