//! Recovery (rules 5 and 6 of the module doc): replaying the journal's active half over the segment
//! headers, the clean-line sample against the backing device, and rebuilding the engine.

use super::*;

impl Inner {
    /// Reads the records of journal half `h` (epoch `epoch`) up to its end: the first record
    /// that does not verify, or the end record. Then tells a torn tail from damage (module
    /// doc, rule 6): returns the records to replay (with a salvage, the valid ones after the
    /// damage too) and the damage found.
    fn scan_journal(
        &mut self,
        h: u32,
        epoch: u64,
        framed: bool,
    ) -> io::Result<(Vec<Rec>, Vec<LogDamage>, u64)> {
        // After the end, scanning goes on until this many records in a row do not verify.
        const TAIL: u64 = 4096;
        let total = self.sb.journal_records;
        let base = self.geo.half_offset(h) + HALF_HEADER;
        let chunk = 4096u64;
        let mut buf = vec![0u8; chunk as usize * REC_BYTES];
        let mut recs = Vec::new();
        let mut first_bad: Option<u64> = None;
        let mut ended = false;
        let mut later: Vec<(u64, Rec, Frame)> = Vec::new();
        let mut misses = 0u64;
        let mut i = 0u64;
        'scan: while i < total {
            let n = chunk.min(total - i);
            self.cache.read_at(
                &mut buf[..n as usize * REC_BYTES],
                base + i * REC_BYTES as u64,
            )?;
            for r in buf[..n as usize * REC_BYTES].chunks_exact(REC_BYTES) {
                let got = Rec::decode_framed(r, epoch);
                if first_bad.is_some() {
                    match got {
                        // A clean shutdown's end record: nothing follows it.
                        Some((Rec::End { .. }, _)) => break 'scan,
                        Some((rec, frame)) => {
                            later.push((i, rec, frame));
                            misses = 0;
                        }
                        None => misses += 1,
                    }
                    if misses >= TAIL {
                        break 'scan;
                    }
                } else {
                    match got {
                        Some((Rec::End { .. }, _)) => {
                            ended = true;
                            break 'scan;
                        }
                        Some((rec, _)) => recs.push(rec),
                        None => first_bad = Some(i),
                    }
                }
                i += 1;
            }
        }
        let clean = self.sb.clean;
        let Some(bad) = first_bad else {
            // Ended by its end record, or the half is full.
            if clean && framed && !ended {
                let offset = base + total * REC_BYTES as u64;
                return Ok((
                    recs,
                    vec![LogDamage {
                        what: "journal end",
                        half: Some(h),
                        record: Some(total),
                        segment: None,
                        slot: None,
                        offset,
                        message: format!(
                            "journal half {h}: full without its end record after a clean stop"
                        ),
                    }],
                    0,
                ));
            }
            return Ok((recs, Vec::new(), 0));
        };
        let offset = base + bad * REC_BYTES as u64;
        let torn = !clean
            && later.iter().all(|&(_, _, f)| {
                f.end == 0 // written before frames: the previous rule (replay to here)
                    || (f == later[0].2 && (f.start as u64) <= bad && bad < f.end as u64)
            });
        let why = if !later.is_empty() && !torn {
            format!(
                "{} later record(s) verify{}",
                later.len(),
                if clean {
                    " and the cache was stopped cleanly"
                } else {
                    ", written after it by completed writes (not a torn tail)"
                }
            )
        } else if clean && framed {
            "the cache was stopped cleanly but its journal does not reach its end record".into()
        } else {
            // The legitimate end after a crash: a torn last write, or simply the end.
            return Ok((recs, Vec::new(), 0));
        };
        let message = format!("journal half {h} record {bad} (byte {offset}): damaged: {why}");
        let damage = LogDamage {
            what: "journal record",
            half: Some(h),
            record: Some(bad),
            segment: None,
            slot: None,
            offset,
            message,
        };
        let salvaged = later.len() as u64;
        if self.salvage {
            recs.extend(later.into_iter().map(|(_, r, _)| r));
        }
        Ok((recs, vec![damage], salvaged))
    }

    /// Rebuilds everything from the headers and the journal: see the module doc.
    /// The log layout's half of `volume::verify_clean_sample` (same rules): compares a sample
    /// of clean cached lines with the backing device after recovery. After a clean shutdown a
    /// difference means the backing device changed behind the cache: every clean line is
    /// dropped, or with dirty lines cached the open is refused (the superblock is marked as
    /// it was found, so the next attempt judges the same way) unless
    /// `accept_backing_changes`. After a crash only the differing lines are dropped, unless
    /// all sampled lines differ.
    pub(super) fn verify_clean_sample(
        &mut self,
        rep: &mut LogOpenReport,
        opts: &LogOpenOptions,
    ) -> io::Result<()> {
        let ls = self.ls();
        let mut clean: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(_, i)| !i.dirty)
            .map(|(k, i)| (LogEngine::key_line(k).1, i))
            .collect();
        if clean.is_empty() {
            return Ok(());
        }
        clean.sort_unstable_by_key(|&(line, _)| line);
        let k = clean.len().min(crate::identity::sample_size(ls));
        let (mut a, mut b) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
        let mut differ = Vec::new();
        let mut unreadable = 0usize;
        for j in 0..k {
            let (line, info) = clean[j * clean.len() / k];
            let n = self.sb.backing_size.saturating_sub(line * ls).min(ls) as usize;
            // A read error (after one retry) leaves the line out of the sample: one bad
            // sector must not refuse a cache holding dirty data; the request path handles
            // it later (a clean extent that fails to read is dropped, rule 8).
            let read = self
                .read_extent(&info, &mut a)
                .or_else(|_| self.read_extent(&info, &mut a))
                .map_err(|e| format!("its cached extent: {e}"))
                .and_then(|ok| {
                    crate::volume::read_twice(self.backing.as_ref(), &mut b, line * ls)
                        .map(|()| ok)
                        .map_err(|e| format!("the backing device: {e}"))
                });
            let ok = match read {
                Ok(ok) => ok,
                Err(e) => {
                    tracing::warn!(
                        "verifying cached line at volume byte {} against the backing device: reading {e}; line left out of the sample",
                        line * ls
                    );
                    unreadable += 1;
                    continue;
                }
            };
            self.live.backing_bytes_read += ls;
            if !ok || a[..n] != b[..n] {
                differ.push(line);
            }
        }
        rep.unreadable_clean_lines = unreadable as u64;
        let k = k - unreadable;
        rep.sampled_clean_lines = k as u64;
        rep.differing_clean_lines = differ.len() as u64;
        if differ.is_empty() {
            return Ok(());
        }
        let first = differ[0] * ls;
        let changed = rep.was_clean || (differ.len() == k && k >= 8);
        let drop: Vec<u64> = if changed {
            let dirty = self.eng.dirty_lines();
            if dirty > 0 && !opts.accept_backing_changes {
                // Nothing was dropped: put the clean flag back as it was found. Recovery
                // began a new journal epoch; a clean flag needs it ended by an end record
                // (module doc, rule 6), as a clean shutdown would.
                if rep.was_clean {
                    self.commit()?;
                    self.write_end()?;
                }
                self.sb.clean = rep.was_clean;
                let b = self.sb.encode();
                self.cache.write_at(&b, 0)?;
                self.cache_sync()?;
                return Err(io::Error::other(
                    crate::format::FormatError::BackingChanged {
                        backing: self.sb.backing.describe(),
                        differ: differ.len() as u64,
                        sampled: k as u64,
                        first,
                        dirty_lines: dirty,
                    }
                    .to_string(),
                ));
            }
            clean.iter().map(|&(line, _)| line).collect()
        } else {
            differ
        };
        for &line in &drop {
            self.unmap(line)?;
        }
        self.commit()?;
        rep.dropped_clean_lines = drop.len() as u64;
        rep.cached_lines = rep.cached_lines.saturating_sub(drop.len() as u64);
        tracing::warn!(
            "{} of {k} clean cached lines sampled differ from the backing device {} (first at volume byte {first}){}: dropped {} clean lines",
            rep.differing_clean_lines,
            self.sb.backing.describe(),
            if changed {
                ": it changed behind the cache"
            } else {
                " after an unclean shutdown (writes in flight at the crash)"
            },
            drop.len()
        );
        Ok(())
    }

    pub(super) fn recover(&mut self) -> io::Result<LogOpenReport> {
        let mut rep = LogOpenReport {
            was_clean: self.sb.clean,
            ..Default::default()
        };
        let n = self.sb.segments as u32;
        let maxe = self.sb.max_extents;
        let slot_bytes = self.geo.slot_bytes as usize;
        let mut maxseq = 0u64;
        let mut b = vec![0u8; slot_bytes];
        // Header slots that start with the magic but do not verify: torn or damaged.
        let mut bad_slots: Vec<(u32, u32)> = Vec::new();
        for s in 0..n {
            let mut best: Option<(u32, SegHeader)> = None;
            for slot in 0..2 {
                self.cache
                    .read_at(&mut b[..4096], self.geo.slot_offset(s, slot))?;
                let Some(cnt) = SegHeader::count(&b) else {
                    continue;
                };
                let need = (HDR_FIXED + cnt * HDR_ENTRY).min(slot_bytes);
                if need > 4096 {
                    self.cache
                        .read_at(&mut b[4096..need], self.geo.slot_offset(s, slot) + 4096)?;
                }
                if header_damaged(&b[..need], s, maxe) {
                    bad_slots.push((s, slot));
                }
                if let Some(h) = SegHeader::decode(&b[..need], s, maxe) {
                    if best.as_ref().is_none_or(|(_, x)| h.hseq > x.hseq) {
                        best = Some((slot, h));
                    }
                }
            }
            let m = &mut self.segs[s as usize];
            if let Some((slot, h)) = best {
                m.slot = slot;
                m.gen = h.gen;
                m.sealed = h.sealed;
                m.exts = if h.sealed { h.exts } else { Vec::new() };
                maxseq = maxseq.max(h.hseq);
            } else {
                // Never written: the next header goes to slot 0.
                m.slot = 1;
            }
        }
        // The journal: the half with the newest valid header.
        let mut hb = vec![0u8; HALF_HEADER as usize];
        let mut active: Option<(u32, u64, u8)> = None;
        for h in 0..2 {
            self.cache.read_at(&mut hb, self.geo.half_offset(h))?;
            if let Some((e, flags)) = decode_half_flags(&hb) {
                if active.is_none_or(|(_, x, _)| e > x) {
                    active = Some((h, e, flags));
                }
            }
        }
        let mut recs = Vec::new();
        let mut damage = Vec::new();
        for &(s, slot) in &bad_slots {
            if self.sb.clean {
                let offset = self.geo.slot_offset(s, slot);
                damage.push(LogDamage {
                    what: "segment header",
                    half: None,
                    record: None,
                    segment: Some(s),
                    slot: Some(slot),
                    offset,
                    message: format!(
                        "segment {s} header slot {slot} (byte {offset}): checksum fails on a cleanly stopped cache; the segment's lines would be rebuilt from the other slot's older header (or none) and could read older data"
                    ),
                });
            }
        }
        // A half whose header does not verify (or is older) but whose first record verifies
        // with a newer epoch: its checkpoint completed if the stop was clean or if a later
        // commit's records follow it, so its header is damaged (not a torn checkpoint).
        for o in 0..2u32 {
            if active.is_some_and(|(h, _, _)| h == o) {
                continue;
            }
            let newer = active.map_or(0, |(_, e, _)| e) + 1;
            let base = self.geo.half_offset(o) + HALF_HEADER;
            let mut rb = vec![0u8; REC_BYTES * 4096.min(self.sb.journal_records as usize)];
            self.cache.read_at(&mut rb, base)?;
            let epoch = u64::from_le_bytes(rb[8..16].try_into().unwrap());
            if epoch < newer || Rec::decode_framed(&rb, epoch).is_none() {
                continue;
            }
            let committed_after = rb
                .chunks_exact(REC_BYTES)
                .filter_map(|r| Rec::decode_framed(r, epoch))
                .any(|(_, f)| f.start > 0);
            if self.sb.clean || committed_after {
                let offset = self.geo.half_offset(o);
                damage.push(LogDamage {
                    what: "journal half header",
                    half: Some(o),
                    record: None,
                    segment: None,
                    slot: None,
                    offset,
                    message: format!(
                        "journal half {o} header (byte {offset}): damaged, while the half holds the newest records (epoch {epoch}); recovery would replay the older half and drop them"
                    ),
                });
                // Salvage: the records verify on their own, the half is the journal.
                active = Some((o, epoch, HALF_FRAMED));
            }
        }
        if let Some((h, epoch, flags)) = active {
            self.half = h;
            self.epoch = epoch;
            let (r, d, salvaged) = self.scan_journal(h, epoch, flags & HALF_FRAMED != 0)?;
            recs = r;
            damage.extend(d);
            if self.salvage {
                rep.salvaged_records = salvaged;
            }
        }
        if !damage.is_empty() && !self.salvage {
            let list: Vec<&str> = damage.iter().map(|d| d.message.as_str()).collect();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the cache metadata is damaged: {}. Replaying it as it is would silently drop what follows the damage; the server does not start. Run `tiercache check --repair` on the cache device (the server stopped) to salvage every record that still verifies and list what is lost",
                    list.join("; ")
                ),
            ));
        }
        for d in &damage {
            rep.unknown_lost.push(match d.what {
                "journal record" => format!(
                    "{}: the line it described is unknown; if it was a write, that line reads its previous version",
                    d.message.split(':').next().unwrap_or_default()
                ),
                "segment header" => format!(
                    "segment {} header slot {}: the extents it described are unknown; their lines read an older version (the other slot's, the journal's, or the backing device's), dirty data among them is lost",
                    d.segment.unwrap_or_default(),
                    d.slot.unwrap_or_default()
                ),
                "journal half header" => format!(
                    "{}: nothing lost (its records verify and were replayed)",
                    d.message.split(':').next().unwrap_or_default()
                ),
                _ => format!("{}: nothing lost (every record before it verifies)", d.message),
            });
        }
        rep.damage = damage;
        // From here recovery writes the device: mark it in use first, so that a crash
        // during recovery is an unclean stop (a clean flag would make the new epoch's
        // journal, which has no end record yet, look damaged).
        if self.sb.clean {
            self.sb.clean = false;
            let b = self.sb.encode();
            self.cache_write(&b, 0)?;
            self.cache_sync()?;
        }
        // Torn header slots (after a crash) and damaged ones (salvage): zeroed, so that a
        // clean stop never leaves a slot that looks damaged.
        for &(s, slot) in &bad_slots {
            self.cache_write(&[0u8; 4096], self.geo.slot_offset(s, slot))?;
        }
        rep.journal_records = recs.len() as u64;
        // Extents of segments not sealed, from base records (in the order written). A salvage
        // accepts gaps (a lost base record's extent stays unmapped).
        for r in &recs {
            maxseq = maxseq.max(r.seq());
            if let Rec::Base { seg, gen, ext } = r {
                if let Some(m) = self.segs.get_mut(*seg as usize) {
                    let next = if self.salvage {
                        m.fill() <= ext.off
                    } else {
                        m.fill() == ext.off
                    };
                    if !m.sealed && m.gen == *gen && m.ext_at(ext.off).is_none() && next {
                        if m.fill() < ext.off {
                            // A lost record's extent: its bytes stay, dead (no line maps
                            // them), so the segment's extents stay contiguous.
                            m.exts.push(Ext {
                                key: GAP_KEY,
                                hash: [0; 32],
                                off: m.fill(),
                                len: ext.off - m.fill(),
                                dirty: false,
                                compressed: false,
                                live: false,
                                crc: 0,
                                seq: 0,
                            });
                        }
                        m.exts.push(*ext);
                    } else if self.salvage
                        && !m.sealed
                        && m.gen == *gen
                        && ext.dirty
                        && ext.live
                        && m.ext_at(ext.off) != Some(ext)
                    {
                        // Overlaps what an earlier record placed: inconsistent, dropped.
                        let (_, line) = LogEngine::key_line(ext.key);
                        let start = line * self.sb.line_size;
                        rep.lost_ranges.push(crate::check::LostRange {
                            start,
                            end: start + self.sb.line_size,
                            volume: None,
                            what: format!(
                                "journal base record (seq {}) overlaps segment {seg}'s other extents: dropped, the line's dirty data is lost",
                                ext.seq
                            ),
                        });
                    }
                }
            }
        }
        for m in &self.segs {
            for e in &m.exts {
                maxseq = maxseq.max(e.seq);
            }
        }
        // Newest event per line: (seq, target); target None = unmapped.
        #[derive(Clone, Copy)]
        enum Ev {
            Base(u32, u32, bool),
            Dup(u32, u32, u32, bool),
            None,
        }
        let mut ev: HashMap<u64, (u64, Ev)> = HashMap::new();
        let put = |ev: &mut HashMap<u64, (u64, Ev)>, key: u64, seq: u64, e: Ev| {
            let slot = ev.entry(key).or_insert((0, Ev::None));
            if seq >= slot.0 {
                *slot = (seq, e);
            }
        };
        for (s, m) in self.segs.iter().enumerate() {
            if m.sealed {
                for e in m.exts.iter().filter(|e| e.live) {
                    put(&mut ev, e.key, e.seq, Ev::Base(s as u32, e.off, e.dirty));
                }
            }
        }
        for r in &recs {
            match *r {
                Rec::Base { seg, gen, ext } => {
                    let Some(m) = self.segs.get(seg as usize) else {
                        continue;
                    };
                    if m.gen != gen {
                        rep.stale_records += 1;
                        put(&mut ev, ext.key, ext.seq, Ev::None);
                    } else if !m.sealed && ext.live && m.ext_at(ext.off) == Some(&ext) {
                        put(&mut ev, ext.key, ext.seq, Ev::Base(seg, ext.off, ext.dirty));
                    }
                }
                Rec::Dup {
                    key,
                    seg,
                    gen,
                    off,
                    dirty,
                    seq,
                } => put(&mut ev, key, seq, Ev::Dup(seg, gen, off, dirty)),
                Rec::Drop { key, seq } => put(&mut ev, key, seq, Ev::None),
                Rec::End { .. } => {}
            }
        }
        let mut entries = Vec::new();
        for (&key, &(_, e)) in &ev {
            match e {
                Ev::Base(seg, off, dirty) => entries.push(RestoredEntry {
                    key,
                    seg,
                    off,
                    dirty,
                    dup: false,
                }),
                Ev::Dup(seg, gen, off, dirty) => {
                    let ok = self
                        .segs
                        .get(seg as usize)
                        .is_some_and(|m| m.gen == gen && m.ext_at(off).is_some());
                    if ok {
                        entries.push(RestoredEntry {
                            key,
                            seg,
                            off,
                            dirty,
                            dup: true,
                        });
                    } else {
                        rep.stale_records += 1;
                    }
                }
                Ev::None => {}
            }
        }
        // Restore the engine; segments not sealed but described by the journal are sealed
        // below, so nothing is open afterwards.
        let reopened: Vec<u32> = (0..n)
            .filter(|&s| {
                let m = &self.segs[s as usize];
                !m.sealed && !m.exts.is_empty()
            })
            .collect();
        let mut rs = Vec::with_capacity(n as usize);
        for m in &self.segs {
            rs.push(RestoredSegment {
                gen: m.gen,
                sealed: m.sealed || !m.exts.is_empty(),
                hdr: m
                    .exts
                    .iter()
                    .map(|e| HdrEntry {
                        key: e.key,
                        fp: self.fp_of(&e.hash),
                        off: e.off,
                        len: e.len,
                        compressed: e.compressed,
                        dirty: e.dirty,
                        hits: 0,
                    })
                    .collect(),
            });
        }
        // Base entries before duplicates (a duplicate's target header must be in place).
        entries.sort_by_key(|e| (e.dup, e.key));
        self.eng.restore(rs, &entries).map_err(io_err)?;
        self.init_dead();
        self.seq = maxseq + 1;
        for &s in &reopened {
            self.segs[s as usize].sealed = true;
            self.write_header(s, true, false)?;
            let m = &mut self.segs[s as usize];
            m.durable = m.exts.len();
            m.durable_fill = m.fill();
        }
        // Headers whose live flags the journal superseded.
        for s in 0..n {
            let m = &self.segs[s as usize];
            if m.sealed && m.exts.iter().any(|e| e.live && !self.is_live(s, e)) {
                self.hdr_stale.insert(s);
            }
        }
        if !reopened.is_empty() {
            self.cache_sync()?;
        }
        // Before the new epoch drops the old records: no older extent may outlive them.
        self.rewrite_stale_headers()?;
        rep.sealed_segments = self.segs.iter().filter(|m| m.sealed).count() as u64;
        rep.recovered_open_segments = reopened.len() as u64;
        let red = self.eng.reduction();
        rep.cached_lines = red.cached_lines;
        rep.dirty_lines = self.eng.dirty_lines();
        self.eng.check().map_err(io_err)?;
        self.checkpoint()?;
        debug_assert!(!self.sb.clean);
        Ok(rep)
    }
}
