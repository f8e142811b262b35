//! The data path: lines reduced (hashed, deduplicated, compressed) and written, read back and
//! checked, under the lock or (sealed read hits, rule 9) outside it.

use super::*;

impl LogVolume {
    /// A client read. Hits on sealed segments are read from the device and expanded after
    /// the lock is released; nothing then stops the segment from being reclaimed and
    /// rewritten meanwhile, so the lock is taken again and the bytes are used only if the
    /// segment still has the generation the lookup saw (its data area is written only
    /// after a reclamation has raised the generation, both under the lock: an unchanged
    /// generation means the read saw the bytes the lookup described) and their crc32c
    /// matches the extent's. Otherwise the line is read again under the lock.
    pub(super) fn read_lines(
        &self,
        offset: u64,
        buf: &mut [u8],
        red: &mut Option<Reducer>,
    ) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Read(offset, buf));
        }
        // Lines whose dirty data could not be read back fail (never stale backing bytes).
        degrade::lost_check(&g.lost, offset, offset + buf.len() as u64)?;
        // Classified under the lock (as the direct layout does); set again whenever the lock
        // is taken again, since other requests run while it is released.
        let class = self.classify(&Request::read(offset, buf.len() as u64), None);
        let ls = self.line;
        let mut line_buf = vec![0u8; ls as usize];
        let mut stored = Vec::new();
        let mut r = Ok(());
        // The request's line outcome: its first line's (counted by the engine), all its lines'.
        let (mut first, mut whole, mut pieces) = (LineTally::default(), LineTally::default(), 0);
        for (i, line) in self.lines(offset, buf.len() as u64).enumerate() {
            if red.is_none() {
                *red = self.take_reducer().ok();
            }
            g.req_class = class;
            let got = g.read_line(line, &mut line_buf, red.is_some(), i == 0);
            if got.is_ok() {
                let t = g.eng.last_lines();
                if i == 0 {
                    first = t;
                }
                whole += t;
                pieces += 1;
            }
            r = match got {
                Ok(Some(u)) => {
                    drop(g);
                    let rd = red.as_mut().expect("taken above");
                    let read = self.read_unlocked(&u, rd, &mut stored, &mut line_buf);
                    g = self.lock();
                    g.check_open()?;
                    // Failed or detached meanwhile: the backing device holds every byte,
                    // and writes since then went only there.
                    if g.pass_through || g.detached {
                        return g.direct(Direct::Read(offset, buf));
                    }
                    g.live.unlocked_reads += 1;
                    let m = &g.segs[u.seg as usize];
                    let same = m.gen == u.gen && m.sealed;
                    if read && (same || self.hooks.unchecked_reads.load(Ordering::Relaxed)) {
                        g.live.ssd_bytes_read += u.ext.len as u64;
                        Ok(())
                    } else {
                        g.live.unlocked_read_retries += 1;
                        g.req_class = class;
                        g.serve_line(line, &mut line_buf)
                    }
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if r.is_err() {
                break;
            }
            let a = (line * ls).max(offset);
            let b = ((line + 1) * ls).min(offset + buf.len() as u64);
            buf[(a - offset) as usize..(b - offset) as usize]
                .copy_from_slice(&line_buf[(a - line * ls) as usize..(b - line * ls) as usize]);
        }
        if pieces > 1 {
            g.eng.recount_request(Op::Read, class, first, whole);
        }
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            // The cache failed during this request: the backing device serves it.
            return g.direct(Direct::Read(offset, buf));
        }
        r
    }

    /// Reads and expands the extent `u` without the lock: false when the device read fails
    /// or the bytes do not verify (crc32c, expansion to exactly a line). The caller checks
    /// the generation afterwards.
    fn read_unlocked(
        &self,
        u: &Unlocked,
        red: &mut Reducer,
        stored: &mut Vec<u8>,
        out: &mut [u8],
    ) -> bool {
        if self.hooks.pause_reads.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        stored.resize(u.ext.len as usize, 0);
        let at = self.geo.data_offset(u.seg) + u.ext.off as u64;
        if self.cache.read_at(stored, at).is_err() {
            return false;
        }
        let unchecked = self.hooks.unchecked_reads.load(Ordering::Relaxed);
        if !unchecked && crc32c::crc32c(stored) != u.ext.crc {
            return false;
        }
        red.expand(stored, u.ext.compressed, out).is_ok()
    }

    /// Test hook: reads sleep between their lookup and their unlocked device read, so that
    /// reclamations by other threads land in between.
    #[doc(hidden)]
    pub fn set_pause_reads(&self, on: bool) {
        self.hooks.pause_reads.store(on, Ordering::Relaxed);
    }

    /// Test hook: unlocked reads skip their validation (generation and crc32c). Only for
    /// the test showing that without it reads return another generation's bytes.
    #[doc(hidden)]
    pub fn set_unchecked_reads(&self, on: bool) {
        self.hooks.unchecked_reads.store(on, Ordering::Relaxed);
    }

    fn take_reducer(&self) -> io::Result<Reducer> {
        let idle = self
            .reducers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        match idle {
            Some(r) => Ok(r),
            None => Reducer::new(self.compression),
        }
    }

    pub(super) fn put_reducer(&self, r: Reducer) {
        self.reducers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    /// The reductions of a write's whole lines, by line from the first (None: a partial
    /// line, reduced under the lock once its other bytes are known; or a reduction that
    /// failed, which the locked path then repeats and reports).
    pub(super) fn pre_reduce(&self, offset: u64, data: &[u8]) -> Vec<Option<PreLine>> {
        if data.is_empty() || offset + data.len() as u64 > self.size {
            return Vec::new();
        }
        let Ok(mut red) = self.take_reducer() else {
            return Vec::new();
        };
        let ls = self.line;
        let out = self
            .lines(offset, data.len() as u64)
            .map(|line| {
                let a = (line * ls).max(offset);
                let b = ((line + 1) * ls).min(offset + data.len() as u64);
                if b - a != ls {
                    return None;
                }
                reduce_line(
                    &mut red,
                    &data[(a - offset) as usize..(b - offset) as usize],
                )
                .ok()
            })
            .collect();
        self.put_reducer(red);
        out
    }
}

impl Inner {
    /// Reads the stored bytes of `(seg, off)` into `self.stored` and checks their crc.
    pub(super) fn load_stored(&mut self, seg: u32, ext: &Ext) -> io::Result<bool> {
        let n = ext.len as usize;
        self.stored.resize(n, 0);
        if let Some(b) = self
            .bufs
            .get(&seg)
            .filter(|_| !self.segs[seg as usize].sealed)
        {
            self.stored
                .copy_from_slice(&b[ext.off as usize..ext.off as usize + n]);
        } else {
            let at = self.geo.data_offset(seg) + ext.off as u64;
            self.cache
                .read_at(&mut self.stored, at)
                .map_err(cache_fault)?;
            self.live.ssd_bytes_read += n as u64;
        }
        Ok(crc32c::crc32c(&self.stored) == ext.crc)
    }

    /// Reads a cached extent into `out` (a line); false when its bytes are damaged.
    pub(super) fn read_extent(&mut self, info: &ExtentInfo, out: &mut [u8]) -> io::Result<bool> {
        let Some(ext) = self.segs[info.seg as usize].ext_at(info.off).copied() else {
            return Ok(false);
        };
        if !self.load_stored(info.seg, &ext)? {
            self.live.extent_crc_errors += 1;
            return Ok(false);
        }
        let stored = std::mem::take(&mut self.stored);
        let r = self.red.expand(&stored, ext.compressed, out);
        self.stored = stored;
        Ok(r.is_ok())
    }

    /// A backing read changes nothing: its error fails its request only.
    pub(super) fn read_backing(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        self.live.backing_bytes_read += out.len() as u64;
        self.backing
            .read_at(out, line * self.ls())
            .map_err(backing_fault)
    }

    /// Reads the cached extent `info` of `line` into `out`; false when it is damaged or
    /// unreadable and the line was dropped (a clean line: read the backing device). A read
    /// error counts towards `max_cache_errors` (rule 8); a dirty line that cannot be read is
    /// reported lost (reads of it fail until it is written again).
    fn read_cached(&mut self, line: u64, info: &ExtentInfo, out: &mut [u8]) -> io::Result<bool> {
        match self.read_extent(info, out) {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.damaged(line, info)?;
                Ok(false)
            }
            Err(e) => {
                self.cache_errors += 1;
                tracing::warn!(
                    "cache device read error {} of {} before pass-through: {e}",
                    self.cache_errors,
                    self.max_cache_errors
                );
                if self.cache_errors >= self.max_cache_errors {
                    return Err(e);
                }
                let ls = self.ls();
                if info.dirty {
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("cache read failed: {e}"),
                    );
                }
                // Forgotten (with a drop record) either way: the next read of a clean line
                // goes to the backing device, a lost dirty one fails.
                self.unmap(line)?;
                degrade::lost_check(&self.lost, line * ls, (line + 1) * ls)
                    .map_err(backing_fault)?;
                Ok(false)
            }
        }
    }

    /// The current content of `line` (cached or from the backing), without admitting it.
    pub(super) fn current_line(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        if let Some(info) = self.eng.locate(0, line) {
            if self.read_cached(line, &info, out)? {
                return Ok(());
            }
        }
        self.read_backing(line, out)
    }

    /// An extent failed its checksum: a clean line is dropped (the backing has it), a dirty
    /// one is an error.
    fn damaged(&mut self, line: u64, info: &ExtentInfo) -> io::Result<()> {
        if info.dirty {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "dirty extent of line {line} (segment {} offset {}) fails its checksum",
                    info.seg, info.off
                ),
            ));
        }
        self.unmap(line)?;
        Ok(())
    }

    /// Drops a line from the cache and records the drop.
    pub(super) fn unmap(&mut self, line: u64) -> io::Result<()> {
        if let Some(i) = self.eng.locate(0, line) {
            if !i.dup && self.segs[i.seg as usize].sealed {
                self.hdr_stale.insert(i.seg);
            }
            if !i.dirty && self.durable(&i, LogEngine::line_key(0, line)) {
                self.shadowed.insert(line);
            }
            self.eng.forget(0, line);
            let seq = self.next_seq();
            self.pending.push(Rec::Drop {
                key: LogEngine::line_key(0, line),
                seq,
            });
        }
        self.maybe_commit()
    }

    /// Makes sure a 64-bit fingerprint hit for `hash` is the same content (else forgets it)
    /// and that the duplicate budget allows sharing.
    fn vet_fingerprint(&mut self, fp: u64, hash: &Hash) {
        if let Some(loc) = self.eng.probe_fp(fp) {
            let same = self.segs[loc.seg as usize]
                .ext_at(loc.off)
                .map(|e| e.hash == *hash);
            if same != Some(true) {
                self.eng.drop_fp(fp);
                if same == Some(false) {
                    self.live.fingerprint_collisions += 1;
                }
            } else if self.dups_upper >= self.dup_budget {
                self.eng.drop_fp(fp);
                self.live.dedup_budget_skips += 1;
            }
        }
    }

    /// Reduces a line under the lock (read-miss admissions and partial-line writes; whole
    /// lines of a write are reduced before the lock is taken, `LogVolume::pre_reduce`).
    fn reduce(&mut self, data: &[u8]) -> io::Result<PreLine> {
        reduce_line(&mut self.red, data)
    }

    fn content(&self, r: &Reduced) -> ExtentContent {
        ExtentContent {
            fp: self.fp_of(&r.hash),
            compressed_len: r.stored_len,
        }
    }

    /// Admits a read-missed line with its bytes.
    fn admit(&mut self, line: u64, data: &[u8]) -> io::Result<()> {
        self.reserve(false)?;
        let p = self.reduce(data)?;
        let c = self.content(&p.red);
        self.vet_fingerprint(c.fp, &p.red.hash);
        let steps = self.eng.admit(0, line, self.req_class, c).steps.len();
        if steps != 0 {
            return Err(io_err("admission after reserve planned device steps"));
        }
        self.record_new(line, &p, data)?;
        self.keep_free_reserve()
    }

    /// Writes one whole line (`pre`: reduced already, before the lock was taken). `first`:
    /// the request's first line (the engine counts the request once, its lines each).
    /// `part`: the byte range of the line the client wrote (the whole line, or part of it
    /// merged into `data` with the line's current bytes): the engine sees that range, so it
    /// counts the read of the rest and the backing device gets only what the client wrote.
    pub(super) fn write_line(
        &mut self,
        line: u64,
        data: &[u8],
        fua: bool,
        pre: Option<&PreLine>,
        first: bool,
        part: std::ops::Range<u64>,
    ) -> io::Result<()> {
        // Write-back FUA: a dirty write, then the caller's commit (rule 7).
        let wb = self.sb.mode == Mode::WriteBack;
        let fua = fua && !wb;
        let dirty = wb;
        // A missed line of a `never` class is not cached: no room is made, nothing reduced,
        // the client's bytes go to the backing device only (in write-back too).
        let bypass = self.eng.locate(0, line).is_none() && !self.eng.caches_class(self.req_class);
        if !bypass {
            self.reserve(dirty)?;
        }
        let here;
        let p = match (pre, bypass) {
            (_, true) => None,
            (Some(p), false) => Some(p),
            (None, false) => {
                here = self.reduce(data)?;
                Some(&here)
            }
        };
        let c = p.map(|p| self.content(&p.red));
        if let (Some(c), Some(p)) = (c, p) {
            self.vet_fingerprint(c.fp, &p.red.hash);
        }
        if (self.sb.mode == Mode::WriteThrough || bypass) && !self.dropped_now.contains(&line) {
            // Its extent may have become durable since the request's drops (sealed by a
            // reserve of an earlier line of the request): rule 7. A bypassed line's older
            // durable extent (dropped, the drop not yet durable) must not come back after a
            // crash over the bytes written to the backing device now.
            self.drop_durably(&[line], true)?;
        }
        self.superseding(line);
        let ls = self.ls();
        debug_assert!(part.start >= line * ls && part.end <= (line + 1) * ls && !part.is_empty());
        let mut req = Request::write(part.start, part.end - part.start);
        req.fua = fua;
        req.class = self.req_class;
        let content: &[ExtentContent] = match &c {
            Some(c) => std::slice::from_ref(c),
            None => &[],
        };
        let plan = if first {
            self.eng.process(&req, content)
        } else {
            self.eng.process_more(&req, content)
        };
        let steps = plan.map_err(io_err)?.steps.clone();
        let mut failed = None;
        for st in steps {
            match st {
                Step::WriteHdd { hdd, len, .. } => {
                    self.hdd_dirty = true;
                    let at = (hdd - line * ls) as usize;
                    if let Err(e) = self.backing.write_at(&data[at..at + len as usize], hdd) {
                        failed = Some(e);
                        break;
                    }
                    self.live.backing_bytes_written += len;
                    self.hdd_unsynced.insert(line);
                }
                Step::ReadSsd { .. } | Step::ReadHdd { .. } => {}
                s => return Err(io_err(format!("unexpected step {s:?} in a line write"))),
            }
        }
        match p {
            Some(p) => self.record_new(line, p, data)?,
            None => debug_assert!(self.eng.locate(0, line).is_none(), "a bypassed line cached"),
        }
        if let Some(e) = failed {
            // The write failed on the backing device: the line is dropped from the cache
            // (its contents are unspecified after a failed write), the volume stays
            // consistent and the request fails.
            self.hdd_unsynced.remove(&line);
            self.unmap(line)?;
            return Err(backing_fault(e));
        }
        if !bypass {
            self.keep_free_reserve()?;
        }
        Ok(())
    }

    /// A read of `line`: the engine's bookkeeping, then either the line served under the
    /// lock (`None`) or, when `unlocked` allows it, a hit on a sealed segment for the caller
    /// to read after releasing the lock (`Some`; see `LogVolume::read`). `first`: the
    /// request's first line (the engine counts the request once, its lines each).
    fn read_line(
        &mut self,
        line: u64,
        out: &mut [u8],
        unlocked: bool,
        first: bool,
    ) -> io::Result<Option<Unlocked>> {
        let ls = self.ls();
        let mut req = Request::read(line * ls, ls);
        req.class = self.req_class;
        if first {
            self.eng.process(&req, &[])
        } else {
            self.eng.process_more(&req, &[])
        }
        .map_err(io_err)?;
        if let Some(info) = self.eng.locate(0, line).filter(|_| unlocked) {
            let m = &self.segs[info.seg as usize];
            if m.sealed && m.gen == info.gen {
                if let Some(ext) = m.ext_at(info.off).copied() {
                    return Ok(Some(Unlocked {
                        seg: info.seg,
                        gen: m.gen,
                        ext,
                    }));
                }
            }
        }
        self.serve_line(line, out)?;
        Ok(None)
    }

    /// Serves a read of `line` under the lock (the engine has seen the read already).
    fn serve_line(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        if let Some(info) = self.eng.locate(0, line) {
            if self.read_cached(line, &info, out)? {
                return Ok(());
            }
            return self.read_backing(line, out);
        }
        self.read_backing(line, out)?;
        if self.unsynced_lines.contains(&line) {
            // Rule 2: the backing device may not hold these bytes durably (rule 8).
            return Ok(());
        }
        if !self.eng.caches_class(self.req_class) {
            // A `never` class: read from the backing device, not cached (no room made).
            return Ok(());
        }
        match self.admit(line, out) {
            // No room to cache it (the backing device fails write-backs, rule 8): the read
            // is served all the same (`reserve` left the volume consistent).
            Err(e) if matches!(fault_of(&e), Some(Fault::Backing(_))) => Ok(()),
            r => r,
        }
    }
}
