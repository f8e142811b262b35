//! Segments and sealing (rule 1 of the module doc): segment headers, liveness of extents, and the
//! dead-extent bookkeeping.

use super::*;

impl SegMeta {
    pub(super) fn fill(&self) -> u32 {
        self.exts.last().map(|e| e.off + e.len).unwrap_or(0)
    }

    pub(super) fn ext_at(&self, off: u32) -> Option<&Ext> {
        self.exts
            .binary_search_by_key(&off, |e| e.off)
            .ok()
            .map(|i| &self.exts[i])
    }
}

impl Inner {
    /// Is `e` (in segment `s`) its key's current base extent? Looks it up in the engine: for
    /// recovery and for checking [`Inner::is_live`].
    pub(super) fn is_live_lookup(&self, s: u32, e: &Ext) -> bool {
        let (v, l) = LogEngine::key_line(e.key);
        self.eng
            .locate(v, l)
            .is_some_and(|i| !i.dup && i.seg == s && i.off == e.off)
    }

    /// Is `e` (in segment `s`) its key's current base extent? From the segment's dead set,
    /// so [`Inner::sync_dead`] must have run since the engine last changed (every caller
    /// that writes what this says calls it first).
    pub(super) fn is_live(&self, s: u32, e: &Ext) -> bool {
        let live = !self.segs[s as usize].dead.contains(&e.off);
        debug_assert_eq!(live, self.is_live_lookup(s, e), "segment {s} extent {e:?}");
        live
    }

    /// Moves the engine's log of dead extents into the segments' dead sets: O(extents that
    /// died since the last call). An entry of an older generation than the segment's is
    /// dropped (the segment was reclaimed since; its dead set was emptied then).
    pub(super) fn sync_dead(&mut self) {
        let mut d = std::mem::take(&mut self.dead_log);
        self.eng.take_dead(&mut d);
        for x in d.drain(..) {
            let m = &mut self.segs[x.seg as usize];
            if m.gen == x.gen {
                m.dead.insert(x.off);
            }
        }
        self.dead_log = d;
    }

    /// Rebuilds every segment's dead set by looking each extent up (recovery), and starts
    /// the engine's log of dead extents.
    pub(super) fn init_dead(&mut self) {
        self.eng.set_track_dead(true);
        for s in 0..self.segs.len() as u32 {
            let dead: std::collections::HashSet<u32> = self.segs[s as usize]
                .exts
                .iter()
                .filter(|e| !self.is_live_lookup(s, e))
                .map(|e| e.off)
                .collect();
            self.segs[s as usize].dead = dead;
        }
    }

    /// Every segment's dead set agrees with a lookup of each extent in the engine.
    pub(super) fn check_dead(&mut self) -> Result<(), String> {
        self.sync_dead();
        for s in 0..self.segs.len() as u32 {
            let m = &self.segs[s as usize];
            for e in &m.exts {
                let (fast, slow) = (!m.dead.contains(&e.off), self.is_live_lookup(s, e));
                if fast != slow {
                    return Err(format!(
                        "segment {s} (gen {}) extent at {} of key {:#x}: the dead set says live={fast}, the engine live={slow}",
                        m.gen, e.off, e.key
                    ));
                }
            }
        }
        Ok(())
    }

    /// Writes segment `s`'s header to its other slot; the extents' live flags are computed
    /// now unless `keep_flags` (a seal: `reserve` set them all live, see there).
    pub(super) fn write_header(
        &mut self,
        s: u32,
        sealed: bool,
        keep_flags: bool,
    ) -> io::Result<()> {
        let hseq = self.next_seq();
        let gen = self.segs[s as usize].gen;
        let mut exts = self.segs[s as usize].exts.clone();
        if !keep_flags {
            self.sync_dead();
            for e in &mut exts {
                e.live = sealed && self.is_live(s, e);
            }
        }
        let h = SegHeader {
            seg: s,
            gen,
            hseq,
            sealed,
            exts: exts.clone(),
        };
        let slot = 1 - self.segs[s as usize].slot;
        let off = self.geo.slot_offset(s, slot);
        self.cache_write(&h.encode(), off)?;
        self.live.header_writes += 1;
        let m = &mut self.segs[s as usize];
        m.slot = slot;
        m.exts = exts;
        Ok(())
    }

    /// Seals an open segment: its bytes, then its header.
    pub(super) fn seal(&mut self, s: u32) -> io::Result<()> {
        self.backing_sync_if_dirty()?;
        let m = &self.segs[s as usize];
        let (from, to) = (m.durable_fill as usize, m.fill() as usize);
        if to > from {
            let buf = self.bufs.remove(&s).expect("open segment buffer");
            let at = self.geo.data_offset(s) + from as u64;
            let r = self.cache_write(&buf[from..to], at);
            self.live.ssd_data_bytes_written += (to - from) as u64;
            self.bufs.insert(s, buf);
            r?;
        }
        // The buffer stays until the bytes are durable: if the cache fails here, its dirty
        // lines are copied to the backing device from RAM (`fail_cache`), not read back
        // from a device that failed to store them.
        self.cache_sync()?;
        if let Some(b) = self.bufs.remove(&s) {
            self.spare.push(b);
        }
        self.segs[s as usize].sealed = true;
        // Write-through: superseded extents are marked dead now (rule 7). What superseded
        // them is on the backing device, synced above, so losing both reads the new bytes;
        // left live, a superseded extent would come back over them after a crash.
        let keep_flags = self.sb.mode != Mode::WriteThrough;
        self.write_header(s, true, keep_flags)?;
        self.cache_sync()?;
        let m = &mut self.segs[s as usize];
        m.durable = m.exts.len();
        m.durable_fill = m.fill();
        Ok(())
    }
}
