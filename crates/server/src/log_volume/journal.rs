//! The journal (rules 3, 5 and 7 of the module doc): records of open extents, duplicates and drops,
//! commits, checkpoints into the other half, and stale headers.

use super::*;

impl Inner {
    pub(super) fn maybe_commit(&mut self) -> io::Result<()> {
        if self.pending.len() as u64 >= self.commit_every {
            self.commit()?;
        }
        Ok(())
    }

    /// Base records of the open segments' extents from `all` or only the new ones.
    fn open_records(&mut self, all: bool) -> Vec<Rec> {
        self.sync_dead();
        let mut out = Vec::new();
        for s in 0..self.segs.len() as u32 {
            let m = &self.segs[s as usize];
            if m.sealed || m.exts.is_empty() {
                continue;
            }
            let from = if all { 0 } else { m.durable };
            for e in &m.exts[from..] {
                let mut e = *e;
                e.live = self.is_live(s, &e);
                out.push(Rec::Base {
                    seg: s,
                    gen: m.gen,
                    ext: e,
                });
            }
        }
        out
    }

    /// Writes the new bytes of the open segments and syncs.
    fn write_open_data(&mut self) -> io::Result<()> {
        self.backing_sync_if_dirty()?;
        let mut any = false;
        let open: Vec<u32> = self.bufs.keys().copied().collect();
        for s in open {
            let m = &self.segs[s as usize];
            if m.sealed {
                continue;
            }
            let (from, to) = (m.durable_fill as usize, m.fill() as usize);
            if to > from {
                let buf = self.bufs.remove(&s).unwrap();
                let at = self.geo.data_offset(s) + from as u64;
                let r = self.cache_write(&buf[from..to], at);
                self.live.ssd_data_bytes_written += (to - from) as u64;
                self.bufs.insert(s, buf);
                r?;
                any = true;
            }
        }
        if any {
            self.cache_sync()?;
        }
        Ok(())
    }

    fn mark_open_durable(&mut self) {
        for m in &mut self.segs {
            if !m.sealed {
                m.durable = m.exts.len();
                m.durable_fill = m.fill();
            }
        }
    }

    fn journal_write(
        &mut self,
        half: u32,
        at_rec: u64,
        recs: &[Rec],
        epoch: u64,
    ) -> io::Result<()> {
        let frame = Frame {
            start: at_rec as u32,
            end: (at_rec + recs.len() as u64) as u32,
        };
        let mut b = Vec::with_capacity(recs.len() * REC_BYTES);
        for r in recs {
            r.encode_framed(epoch, frame, &mut b);
        }
        let off = self.geo.half_offset(half) + HALF_HEADER + at_rec * REC_BYTES as u64;
        self.live.journal_records_written += recs.len() as u64;
        self.cache_write(&b, off)
    }

    /// A clean shutdown's end record, after its last commit (see the module doc, rule 6).
    pub(super) fn write_end(&mut self) -> io::Result<()> {
        if self.jused >= self.sb.journal_records {
            self.checkpoint()?;
        }
        debug_assert!(self.jused < self.sb.journal_records);
        let end = Rec::End {
            seq: self.next_seq(),
        };
        let (half, at, epoch) = (self.half, self.jused, self.epoch);
        self.journal_write(half, at, &[end], epoch)?;
        self.cache_sync()?;
        self.jused += 1;
        Ok(())
    }

    /// FLUSH: see the module doc, rule 3. Then every acknowledged write is durable, and the
    /// lost-range list drops the ranges written again since the last commit.
    pub(super) fn commit(&mut self) -> io::Result<()> {
        self.commit_records()?;
        self.clear_rewritten_lost()
    }

    fn commit_records(&mut self) -> io::Result<()> {
        self.write_open_data()?;
        let mut recs = self.open_records(false);
        recs.append(&mut self.pending);
        let r = self.sb.journal_records;
        let reserve = self.commit_every + 2 * self.sb.max_extents as u64;
        if self.jused + recs.len() as u64 + reserve > r {
            // Pending drops go into the checkpoint; everything else it lists afresh.
            self.pending = recs
                .into_iter()
                .filter(|r| matches!(r, Rec::Drop { .. }))
                .collect();
            return self.checkpoint();
        }
        if !recs.is_empty() {
            let (half, at, epoch) = (self.half, self.jused, self.epoch);
            self.journal_write(half, at, &recs, epoch)?;
            self.cache_sync()?;
            self.jused += recs.len() as u64;
            self.mark_open_durable();
            self.live.commits += 1;
        }
        // Stale headers wait for the next checkpoint (module doc, rule 3), unless the drops
        // that checkpoint might have to add for them (at most one per drop appended since
        // the last rewrite, plus the open segments' extents) could make it overflow a half:
        // then they are rewritten now, every superseding event being durable.
        let drops = recs
            .iter()
            .filter(|r| matches!(r, Rec::Drop { .. }))
            .count() as u64;
        self.drops_since_rewrite += drops;
        let me = self.sb.max_extents as u64;
        let room = r.saturating_sub(self.dups_upper + 3 * me + 2 * self.commit_every);
        if self.drops_since_rewrite + 3 * me >= room {
            self.rewrite_stale_headers()?;
        }
        self.fresh_dups.clear();
        self.shadowed.clear();
        if self.dups_upper >= self.dup_budget && self.dups_upper > self.dups_at_checkpoint {
            // Recount the duplicate entries (stale ones die with their segments).
            self.checkpoint()?;
        }
        Ok(())
    }

    pub(super) fn rewrite_stale_headers(&mut self) -> io::Result<()> {
        self.drops_since_rewrite = 0;
        if self.hdr_stale.is_empty() {
            return Ok(());
        }
        let stale = std::mem::take(&mut self.hdr_stale);
        for s in stale {
            if self.segs[s as usize].sealed {
                self.write_header(s, true, false)?;
                self.live.header_rewrites += 1;
            }
        }
        self.cache_sync()
    }

    /// Drop records, for a checkpoint's `recs`, of the lines that are not cached but whose
    /// old extent a header not rewritten yet (`hdr_stale`) still marks live: without them
    /// the new epoch would hold no event of such a line (its drop, committed earlier, is in
    /// the old half), and a crash before `rewrite_stale_headers` would bring the old extent
    /// back. It happens in write-back, where a seal marks every extent live (see `reserve`):
    /// a line's clean extent in an open segment, the line overwritten, then written back
    /// and unmapped by a reclamation (drop committed), then the segment sealed and a
    /// checkpoint before the next header rewrite (`log_crash_points_flushed_lines_*`).
    /// Likewise for the dead extents of open segments: the checkpoint lists them not live,
    /// but the seal's header (newest for them) will say live until the next commit.
    /// Lines cached elsewhere need nothing: the checkpoint lists their current event, newer.
    fn stale_header_drops(&mut self, recs: &mut Vec<Rec>) {
        self.sync_dead();
        let dropped: std::collections::HashSet<u64> = recs
            .iter()
            .filter_map(|r| match *r {
                Rec::Drop { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        let mut keys = Vec::new();
        // Open segments too: a write-back seal will mark their dead extents live again.
        let open = (0..self.segs.len() as u32).filter(|&s| {
            let m = &self.segs[s as usize];
            !m.sealed && !m.exts.is_empty()
        });
        let segs: Vec<u32> = self.hdr_stale.iter().copied().chain(open).collect();
        for s in segs {
            let m = &self.segs[s as usize];
            // `segs` holds the stale headers (sealed: a reclamation removes its victim from
            // `hdr_stale`, and only sealed segments are added) and the open segments. A
            // sealed segment outside `hdr_stale` needs nothing: its header was written or
            // rewritten after its extents' liveness last changed (a write-through seal
            // marks dead extents dead; every later change adds it to `hdr_stale`).
            debug_assert!(!m.sealed || self.hdr_stale.contains(&s), "segment {s}");
            for e in m
                .exts
                .iter()
                .filter(|e| (e.live || !m.sealed) && m.dead.contains(&e.off))
            {
                let (v, l) = LogEngine::key_line(e.key);
                if !dropped.contains(&e.key) && self.eng.locate(v, l).is_none() {
                    keys.push(e.key);
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            let seq = self.next_seq();
            recs.push(Rec::Drop { key, seq });
        }
    }

    /// Starts a new journal epoch in the other half: see the module doc, rule 5.
    pub(super) fn checkpoint(&mut self) -> io::Result<()> {
        self.write_open_data()?;
        let mut recs = self.open_records(true);
        // A write-through request's lines dropped durably (rule 7) but not rewritten yet
        // keep their drop as newest event: their duplicate entries are not listed afresh.
        let wt = self.sb.mode == Mode::WriteThrough;
        let dups: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(k, i)| {
                i.dup && !(wt && self.dropped_now.contains(&LogEngine::key_line(*k).1))
            })
            .collect();
        self.dups_upper = dups.len() as u64;
        self.dups_at_checkpoint = self.dups_upper;
        for (key, i) in dups {
            let seq = self.next_seq();
            recs.push(Rec::Dup {
                key,
                seg: i.seg,
                gen: i.gen,
                off: i.off,
                dirty: i.dirty,
                seq,
            });
        }
        recs.append(&mut self.pending);
        self.stale_header_drops(&mut recs);
        if recs.len() as u64 > self.sb.journal_records {
            return Err(io_err(format!(
                "journal checkpoint of {} records does not fit a half of {}",
                recs.len(),
                self.sb.journal_records
            )));
        }
        let (half, epoch) = (1 - self.half, self.epoch + 1);
        self.journal_write(half, 0, &recs, epoch)?;
        self.cache_sync()?;
        let h = encode_half(epoch);
        let off = self.geo.half_offset(half);
        self.cache_write(&h, off)?;
        self.cache_sync()?;
        self.half = half;
        self.epoch = epoch;
        self.jused = recs.len() as u64;
        self.mark_open_durable();
        self.live.checkpoints += 1;
        self.rewrite_stale_headers()?;
        self.fresh_dups.clear();
        self.shadowed.clear();
        Ok(())
    }

    /// Records what `eng` did with `line` (reduced to `p`, raw bytes `raw`): a base extent
    /// goes into its open segment's buffer, a duplicate entry becomes a pending record.
    pub(super) fn record_new(&mut self, line: u64, p: &PreLine, raw: &[u8]) -> io::Result<()> {
        let r = &p.red;
        let info = self
            .eng
            .locate(0, line)
            .ok_or_else(|| io_err(format!("line {line} not cached after admission")))?;
        let key = LogEngine::line_key(0, line);
        let seq = self.next_seq();
        if info.dup {
            self.fresh_dups.insert(key);
            self.pending.push(Rec::Dup {
                key,
                seg: info.seg,
                gen: info.gen,
                off: info.off,
                dirty: info.dirty,
                seq,
            });
            self.dups_upper += 1;
            return self.maybe_commit();
        }
        let stored: &[u8] = if r.compressed { &p.comp } else { raw };
        if info.len as usize != stored.len() || !info.open {
            return Err(io_err(format!(
                "engine placed line {line} as {info:?}, stored bytes {}",
                stored.len()
            )));
        }
        let crc = p.crc;
        debug_assert_eq!(crc, crc32c::crc32c(stored));
        let buf = self
            .bufs
            .get_mut(&info.seg)
            .ok_or_else(|| io_err("no buffer for the open segment"))?;
        buf[info.off as usize..(info.off + info.len) as usize].copy_from_slice(stored);
        let m = &mut self.segs[info.seg as usize];
        debug_assert_eq!(m.fill(), info.off);
        m.exts.push(Ext {
            key,
            hash: r.hash,
            off: info.off,
            len: info.len,
            dirty: info.dirty,
            compressed: r.compressed,
            live: true,
            crc,
            seq,
        });
        Ok(())
    }

    /// The old extent of `line` is about to be superseded.
    pub(super) fn superseding(&mut self, line: u64) {
        if let Some(i) = self.eng.locate(0, line) {
            if !i.dup && self.segs[i.seg as usize].sealed {
                self.hdr_stale.insert(i.seg);
            }
            if !i.dirty && self.durable(&i, LogEngine::line_key(0, line)) {
                self.shadowed.insert(line);
            }
        }
    }

    /// Whether the event mapping `key` to `i` is durable: a base extent sealed or committed,
    /// a duplicate whose record is not pending.
    pub(super) fn durable(&self, i: &ExtentInfo, key: u64) -> bool {
        if i.dup {
            return !self.fresh_dups.contains(&key);
        }
        let m = &self.segs[i.seg as usize];
        m.sealed || i.off < m.durable_fill
    }

    /// Rule 6: before the backing device is written for `lines`, their durable clean
    /// extents are dropped durably: one journal append, one sync. `may_commit`: a commit
    /// may make room in the journal (not inside a reserve, whose reclamation is half done:
    /// there the drops use the room kept for the next commit, which then checkpoints).
    pub(super) fn drop_durably(&mut self, lines: &[u64], may_commit: bool) -> io::Result<()> {
        let need: Vec<u64> = lines
            .iter()
            .copied()
            .filter(|&l| {
                self.shadowed.contains(&l)
                    || self
                        .eng
                        .locate(0, l)
                        .is_some_and(|i| self.durable(&i, LogEngine::line_key(0, l)))
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let recs: Vec<Rec> = need
            .iter()
            .map(|&l| Rec::Drop {
                key: LogEngine::line_key(0, l),
                seq: self.next_seq(),
            })
            .collect();
        // Before the journal write: a checkpoint the commit below may run must not list
        // these lines' duplicate entries afresh (with newer sequence numbers).
        self.dropped_now.extend(need.iter().copied());
        let reserve = self.commit_every + 2 * self.sb.max_extents as u64;
        let n = recs.len() as u64;
        if !may_commit && self.jused + n > self.sb.journal_records {
            return Err(io_err(format!(
                "journal full: no room for {n} drop records before a write-back"
            )));
        }
        if may_commit && self.jused + n + reserve > self.sb.journal_records {
            // A checkpoint makes room (and carries these drops, being pending).
            self.pending.extend(recs.iter().copied());
            self.commit()?;
        } else {
            let (half, at, epoch) = (self.half, self.jused, self.epoch);
            self.journal_write(half, at, &recs, epoch)?;
            self.cache_sync()?;
            self.jused += recs.len() as u64;
            // Until the next commit rewrites the headers, a checkpoint must carry them.
            self.pending.extend(recs.iter().copied());
        }
        for &l in &need {
            self.shadowed.remove(&l);
        }
        self.live.early_drops += need.len() as u64;
        self.live.early_drop_syncs += 1;
        Ok(())
    }
}
