//! Reclaiming segments (rules 4 and 8 of the module doc): write-back of a victim's dirty extents
//! before the engine reclaims it, and the reservation of space for new bytes.

use super::*;

impl Inner {
    /// Executes the plan of `reserve`: seals, write-backs and the reclamation that follows.
    pub(super) fn reserve(&mut self, dirty: bool) -> io::Result<()> {
        if self.hdd_dirty && self.eng.reserve_acts(dirty) {
            // Rule 2 before the engine changes anything: the seal (and a reclamation's
            // commit) below then find the backing device synced, and a failure here fails
            // the request with nothing changed. While syncs fail, not before the backoff
            // (`sync_backoff`).
            self.sync_backoff()?;
            self.backing_sync_if_dirty()?;
        }
        let before = self.eng.open_segment(dirty);
        // The header of a segment sealed now describes every extent as live: an extent
        // superseded since the last commit must not be marked dead before what superseded
        // it is durable (a crash in between would lose both). The header is rewritten with
        // the dead ones marked at the next checkpoint (rule 3).
        let reclaimed0 = self.eng.counters().segments_reclaimed;
        // Rule 8: the victim's write-backs run before the engine reclaims it.
        let mut victim = self.eng.reserve_begin(dirty);
        let mut done = std::collections::HashSet::new();
        let mut no_room = None;
        if let Some(v) = victim {
            let wbs = self.eng.reclaim_write_backs(v);
            if !wbs.is_empty() {
                match self.write_back_first(&wbs) {
                    Ok(()) => done.extend(wbs.iter().filter_map(|st| match *st {
                        Step::WriteBack { ssd, hdd, .. } => Some((ssd, hdd)),
                        _ => None,
                    })),
                    Err(e)
                        if matches!(fault_of(&e), Some(Fault::Backing(_)))
                            || e.kind() == io::ErrorKind::InvalidData =>
                    {
                        // Degraded, or a damaged dirty extent in the victim (reclaiming it
                        // would drop the line, and a restart would then read older bytes
                        // from the backing device): a segment without dirty data instead,
                        // or no room.
                        if e.kind() == io::ErrorKind::InvalidData {
                            tracing::error!(
                                "segment {v} not reclaimed: {e}; rewrite the line to free it"
                            );
                        }
                        victim = self.eng.clean_victim();
                        if victim.is_none() {
                            no_room = Some(if e.kind() == io::ErrorKind::InvalidData {
                                io::Error::new(
                                    e.kind(),
                                    format!("log cache: no room: {e}, and every other sealed segment holds dirty data"),
                                )
                            } else {
                                backing_fault(Degraded::no_room(
                                    self.degraded.as_ref(),
                                    "log cache",
                                    &e,
                                ))
                            });
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // Reinsertion (`--reinsert-hits`): the victim's hot clean extents, read and verified
        // before the engine reclaims it (one that does not verify is evicted instead).
        let hot = match victim {
            Some(v) => self.read_reinserted(v, dirty),
            None => Vec::new(),
        };
        let steps = self.eng.reserve_end(dirty, victim).steps.clone();
        let reclaimed = self.eng.counters().segments_reclaimed > reclaimed0;
        let trimmed = steps.iter().any(|st| matches!(st, Step::TrimSsd { .. }));
        let reads = steps
            .iter()
            .filter(|st| matches!(st, Step::ReadSsd { .. }))
            .count();
        assert_eq!(
            reads,
            hot.len(),
            "the reclamation reinserts exactly the extents read ahead"
        );
        let seg_size = self.sb.segment_size;
        // Only when this reserve seals the open segment (once per segment, not per line:
        // the scan is O(extents)). Liveness of its extents is the same before and after the
        // reserve unless the reserve reclaimed it, a case `has_dead` is not used for.
        let mut has_dead = false;
        if let Some(o) = before.filter(|&o| {
            steps
                .iter()
                .any(|st| matches!(st, Step::WriteSsd { ssd, .. } if ssd / seg_size == o as u64))
        }) {
            self.sync_dead();
            has_dead = self.segs[o as usize]
                .exts
                .iter()
                .any(|e| !self.is_live(o, e));
            for e in self.segs[o as usize].exts.iter_mut() {
                e.live = true;
            }
        }
        let now = self.eng.open_segment(dirty);
        assert!(
            now.is_some() || no_room.is_some(),
            "reserve opens a segment unless there is no room"
        );
        let mut written_back = Vec::new();
        // Rule 6: lines about to be written back whose durable event is an older clean
        // extent (a dirty duplicate not committed yet) are dropped durably first. No commit
        // here: the engine has already unmapped the reclaimed segment's lines.
        let ls = self.ls();
        let shadowed: Vec<u64> = steps
            .iter()
            .filter_map(|st| match *st {
                Step::WriteBack { ssd, hdd, .. }
                    if self.shadowed.contains(&(hdd / ls)) && !done.contains(&(ssd, hdd)) =>
                {
                    Some(hdd / ls)
                }
                _ => None,
            })
            .collect();
        self.drop_durably(&shadowed, false)?;
        for st in steps {
            match st {
                Step::WriteSsd { ssd, .. } => {
                    self.seal((ssd / seg_size) as u32).map_err(Self::mid_plan)?
                }
                Step::WriteBack { ssd, hdd, .. } => {
                    if !done.contains(&(ssd, hdd)) {
                        // Not written back first (the engine chose another victim than the
                        // one it proposed: it never does). A failure here stops the volume.
                        self.write_back((ssd / seg_size) as u32, (ssd % seg_size) as u32, hdd)
                            .map_err(|e| io_err(format!("write-back during a reclaim: {e}")))?;
                    }
                    written_back.push(hdd / self.ls());
                }
                // Done after the reclamation: the data area is discarded once the empty
                // header is durable; the reinserted extents were read above.
                Step::TrimSsd { .. } | Step::ReadSsd { .. } => {}
                s => return Err(io_err(format!("unexpected step {s:?} in a reserve plan"))),
            }
        }
        if let Some(o) = before {
            if has_dead && self.segs[o as usize].sealed && !(reclaimed && now == Some(o)) {
                self.hdr_stale.insert(o);
            }
        }
        let Some(now) = now else {
            return Err(no_room.expect("checked above"));
        };
        if before != Some(now) || reclaimed {
            if reclaimed {
                self.reclaim(now, &written_back).map_err(Self::mid_plan)?;
            }
            let gen = self.eng.segments()[now as usize].gen;
            let buf = self
                .spare
                .pop()
                .unwrap_or_else(|| vec![0u8; seg_size as usize]);
            self.bufs.insert(now, buf);
            let m = &mut self.segs[now as usize];
            m.gen = gen;
            m.sealed = false;
            m.exts.clear();
            m.dead.clear();
            m.durable = 0;
            m.durable_fill = 0;
        }
        if reclaimed {
            if trimmed {
                self.discard_data(now);
            }
            self.place_reinserted(now, hot)?;
        }
        Ok(())
    }

    /// The extents the reclamation of `v` will reinsert ([`LogEngine::reinsert_candidates`])
    /// with their stored bytes, read from the cache device and verified now (the segment's
    /// data area is overwritten only after the reclamation). One that fails to read or
    /// verify is forgotten by the engine: evicted, not reinserted (a clean line: the
    /// backing device has it; its drop is recorded by the reclamation).
    fn read_reinserted(&mut self, v: u32, dirty: bool) -> Vec<(Ext, Vec<u8>)> {
        let mut read: HashMap<u64, (Ext, Vec<u8>)> = HashMap::new();
        loop {
            // Forgetting one candidate may make room for another: until all verify.
            let cands = self.eng.reinsert_candidates(v, dirty);
            let mut forgot = false;
            for &(key, off, len) in &cands {
                if read.contains_key(&key) {
                    continue;
                }
                let ext = self.segs[v as usize]
                    .ext_at(off)
                    .copied()
                    .filter(|e| e.key == key && e.len == len && !e.dirty);
                let got = ext.map(|e| (e, self.load_stored(v, &e)));
                let why = match got {
                    Some((e, Ok(true))) => {
                        read.insert(key, (e, self.stored.clone()));
                        continue;
                    }
                    Some((_, Err(err))) => {
                        // Counted as a read error of a hit is (rule 8); a device that keeps
                        // failing fails the cache at the reclamation's writes.
                        self.cache_errors += 1;
                        format!("cache device read error: {err}")
                    }
                    _ => {
                        self.live.extent_crc_errors += 1;
                        "its checksum fails".to_string()
                    }
                };
                let (vol, line) = LogEngine::key_line(key);
                tracing::warn!(
                    "segment {v} offset {off}: clean extent of line {line} not reinserted ({why}): evicted"
                );
                self.eng.forget(vol, line);
                forgot = true;
            }
            if !forgot {
                return cands
                    .iter()
                    .map(|c| read.remove(&c.0).expect("read above"))
                    .collect();
            }
        }
    }

    /// Puts the extents read by [`Inner::read_reinserted`] into the buffer of `now` (just
    /// reclaimed and open again) where the engine placed them: new extents of the open
    /// segment, described by base records at the next commit (newer than the drops the
    /// reclamation recorded for them).
    fn place_reinserted(&mut self, now: u32, hot: Vec<(Ext, Vec<u8>)>) -> io::Result<()> {
        for (old, bytes) in hot {
            let (vol, line) = LogEngine::key_line(old.key);
            let info = self
                .eng
                .locate(vol, line)
                .filter(|i| i.seg == now && i.open && !i.dup && !i.dirty)
                .ok_or_else(|| {
                    io_err(format!(
                        "line {line}: reinserted by the engine but not in segment {now}"
                    ))
                })?;
            assert_eq!(
                info.len as usize,
                bytes.len(),
                "a reinserted extent keeps its length"
            );
            let buf = self
                .bufs
                .get_mut(&now)
                .ok_or_else(|| io_err("no buffer for the open segment"))?;
            buf[info.off as usize..(info.off + info.len) as usize].copy_from_slice(&bytes);
            let seq = self.next_seq();
            let m = &mut self.segs[now as usize];
            debug_assert_eq!(m.fill(), info.off, "extents stay contiguous");
            m.exts.push(Ext {
                off: info.off,
                live: true,
                seq,
                ..old
            });
        }
        Ok(())
    }

    /// Discards (TRIM) the data area of segment `v`, reclaimed and durably empty (its empty
    /// header of the next generation is synced): nothing durable refers to those bytes.
    /// Advisory: a device that cannot discard is left as it is; an error is counted and
    /// logged, never fails the request (no acknowledged state depends on it).
    fn discard_data(&mut self, v: u32) {
        let (at, len) = (self.geo.data_offset(v), self.sb.segment_size);
        match self.cache.discard(at, len) {
            Ok(true) => {
                self.live.discards += 1;
                self.live.discard_bytes += len;
            }
            Ok(false) => self.live.discards_unsupported += 1,
            Err(e) => {
                self.live.discard_errors += 1;
                if self.live.discard_errors == 1 {
                    tracing::warn!(
                        "cache device: discard of segment {v} (bytes {at}..{}) failed: {e}; reclaimed segments are left untrimmed when it fails (counted in discard_errors)",
                        at + len
                    );
                }
            }
        }
    }

    /// Keeps the trimmed free reserve (`--trim --free-reserve`): reclaims the picker's
    /// victims ahead, each written back (rule 8), made durably empty and discarded, until the
    /// reserve's segments are free. Runs after a line's own bookkeeping (as the simulator
    /// evicts ahead inside its append). While the backing device fails write-backs (or a
    /// victim holds a damaged dirty extent), it stops: the reserve is a performance aid, and
    /// the request that got here has succeeded.
    pub(super) fn keep_free_reserve(&mut self) -> io::Result<()> {
        while let Some(v) = self.eng.evict_ahead_victim() {
            if self.hdd_dirty {
                // Rule 2 before the engine changes anything (as in `reserve`): the
                // reclamation's commit then finds the backing device synced. While its syncs
                // fail (or before their backoff has passed), the reserve waits.
                if let Err(e) = self
                    .sync_backoff()
                    .and_then(|()| self.backing_sync_if_dirty())
                {
                    if matches!(fault_of(&e), Some(Fault::Backing(_))) {
                        tracing::debug!("free reserve not refilled: {e}");
                        return Ok(());
                    }
                    return Err(e);
                }
            }
            let wbs = self.eng.reclaim_write_backs(v);
            if !wbs.is_empty() {
                match self.write_back_first(&wbs) {
                    Ok(()) => {}
                    Err(e)
                        if matches!(fault_of(&e), Some(Fault::Backing(_)))
                            || e.kind() == io::ErrorKind::InvalidData =>
                    {
                        tracing::debug!("free reserve not refilled: {e}");
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            let steps = self.eng.evict_ahead_one(v).steps.clone();
            let ls = self.ls();
            let written_back: Vec<u64> = steps
                .iter()
                .filter_map(|st| match *st {
                    Step::WriteBack { hdd, .. } => Some(hdd / ls),
                    _ => None,
                })
                .collect();
            assert_eq!(
                written_back.len(),
                wbs.len(),
                "segment {v} reclaimed ahead: its write-backs ran first"
            );
            self.reclaim(v, &written_back).map_err(Self::mid_plan)?;
            if steps.iter().any(|st| matches!(st, Step::TrimSsd { .. })) {
                self.discard_data(v);
            }
        }
        Ok(())
    }

    fn write_back(&mut self, seg: u32, off: u32, hdd: u64) -> io::Result<()> {
        let ext = self.segs[seg as usize]
            .ext_at(off)
            .copied()
            .ok_or_else(|| io_err(format!("write-back of unknown extent {seg}:{off}")))?;
        if !self.load_stored(seg, &ext)? {
            self.live.extent_crc_errors += 1;
            // InvalidData: nothing changed; the line stays mapped to its damaged extent (its
            // reads fail, never older bytes) and its segment is not reclaimed (`reserve`).
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "dirty extent {seg}:{off} of volume byte {hdd} fails its checksum at write-back"
                ),
            ));
        }
        let mut line = std::mem::take(&mut self.scratch);
        line.resize(self.ls() as usize, 0);
        let stored = std::mem::take(&mut self.stored);
        let r = self.red.expand(&stored, ext.compressed, &mut line);
        self.stored = stored;
        r.map_err(io_err)?;
        let w = self.backing.write_at(&line, hdd);
        self.scratch = line;
        w.map_err(backing_fault)?;
        self.hdd_dirty = true;
        self.live.write_backs += 1;
        self.live.backing_bytes_written += self.ls();
        Ok(())
    }

    /// Rule 8: writes back `wbs` (a victim's `WriteBack` steps, before the engine reclaims
    /// it) and syncs the backing device. A backing-device failure enters (or stays in) the
    /// degraded state and returns a backing fault: the extents stay dirty, nothing else
    /// changed. While degraded, nothing is tried before the backoff has passed. Success ends
    /// the degraded state.
    pub(super) fn write_back_first(&mut self, wbs: &[Step]) -> io::Result<()> {
        if let Some(d) = self.degraded.as_ref().filter(|d| !d.due()) {
            return Err(backing_fault(io::Error::new(
                d.last_kind,
                format!("write-backs paused after a failure ({})", d.last_error),
            )));
        }
        let ls = self.ls();
        let seg_size = self.sb.segment_size;
        // Rule 6: a line whose durable event is an older clean extent (a dirty duplicate
        // or extent not committed yet) must not be written back before its newer event is
        // durable: a commit first (no reclamation is under way). Not a drop record, as the
        // in-reserve path does: a drop would outlive a failed write-back and lose the line.
        if wbs.iter().any(
            |st| matches!(*st, Step::WriteBack { hdd, .. } if self.shadowed.contains(&(hdd / ls))),
        ) {
            self.commit()?;
        }
        let mut written = Vec::new();
        let r = (|| -> io::Result<()> {
            self.backing_sync_if_dirty().map_err(backing_fault)?;
            for st in wbs {
                if let Step::WriteBack { ssd, hdd, .. } = *st {
                    self.write_back((ssd / seg_size) as u32, (ssd % seg_size) as u32, hdd)?;
                    written.push(hdd / ls);
                }
            }
            self.backing.sync().map_err(backing_fault)?;
            self.live.backing_syncs += 1;
            Ok(())
        })();
        match r {
            Ok(()) => {
                self.hdd_dirty = false;
                self.unsynced_lines.clear();
                Degraded::healed(&mut self.degraded);
                Degraded::sync_healed(&mut self.sync_failing);
                Ok(())
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    // A damaged extent: the lines written before it stay dirty too.
                    self.unsynced_lines.extend(written);
                } else if matches!(fault_of(&e), Some(Fault::Backing(_))) {
                    // The lines written are still dirty in the cache: no clean extent
                    // claims them, so the unsynced backing writes need no sync (the backing
                    // device fails it anyway) — as long as no clean extent is made of them
                    // later (a read after a trim would see the backing device's unsynced
                    // bytes): such reads are not admitted until a backing sync succeeds.
                    self.unsynced_lines.extend(written);
                    // Write-through lines written before it (a mode switch) still need
                    // their sync (`backing_sync_if_dirty`).
                    self.hdd_dirty = !self.hdd_unsynced.is_empty();
                    self.backing_write_errors += 1;
                    Degraded::failed(&mut self.degraded, &e);
                }
                Err(e)
            }
        }
    }

    /// A request on a failed cache: served by the backing device alone (rule 8).
    /// The dirty lines and their extents, in backing-device order (for writing them back).
    pub(super) fn dirty_in_lba_order(&self) -> Vec<(u64, ExtentInfo)> {
        let mut dirty: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(_, i)| i.dirty)
            .map(|(k, i)| (LogEngine::key_line(k).1, i))
            .collect();
        dirty.sort_unstable_by_key(|x| x.0);
        dirty
    }

    /// Finishes reclaiming `v` (its write-backs done): drops for the lines it unmapped or
    /// reinserted, a commit, then the empty header of the next generation.
    ///
    /// A reinserted line (now in `v`'s next generation, not described until the next
    /// commit) gets a drop too: its old extent's header entry goes away with the empty
    /// header, so until the next commit the line's newest durable event must still unmap
    /// it. Every path that made the old extent current already left an event newer than any
    /// older extent of the line (rules 3, 6 and 7; the crash points with reinsertion pass
    /// without this drop too), so this is defence in depth that keeps the argument local:
    /// one record per reinserted extent. The reinserted extent's base record, newer than
    /// the drop, maps the line again at the next commit.
    fn reclaim(&mut self, v: u32, written_back: &[u64]) -> io::Result<()> {
        let keys: Vec<u64> = self.segs[v as usize]
            .exts
            .iter()
            .map(|e| e.key)
            .chain(written_back.iter().map(|&l| LogEngine::line_key(0, l)))
            .collect();
        for k in keys {
            let (vol, l) = LogEngine::key_line(k);
            if self.eng.locate(vol, l).is_none_or(|i| i.seg == v) {
                let seq = self.next_seq();
                self.pending.push(Rec::Drop { key: k, seq });
            }
        }
        self.hdr_stale.remove(&v);
        self.commit()?;
        let gen = self.eng.segments()[v as usize].gen;
        let m = &mut self.segs[v as usize];
        m.gen = gen;
        m.sealed = false;
        m.exts.clear();
        m.dead.clear();
        self.write_header(v, false, false)?;
        self.cache_sync()
    }
}
