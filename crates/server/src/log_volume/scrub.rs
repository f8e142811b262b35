//! Consistency checks of the running volume: `check` against the engine and `scrub` of every stored
//! extent.

use super::*;

impl LogVolume {
    /// Rule 3's result, for tests: right after a FLUSH (a commit), the header last written
    /// for every sealed segment marks live exactly the extents that are their key's current
    /// base extent (none left live after being superseded, none marked dead too early),
    /// except that a header waiting for the next checkpoint's rewrite may still mark
    /// superseded extents live (never a current one dead).
    #[doc(hidden)]
    pub fn check_headers_after_flush(&self) -> Result<(), String> {
        let g = self.lock();
        for s in 0..g.segs.len() as u32 {
            let m = &g.segs[s as usize];
            if !m.sealed {
                continue;
            }
            let waits = g.hdr_stale.contains(&s);
            for e in &m.exts {
                let cur = g.is_live_lookup(s, e);
                if e.live != cur && !(waits && e.live) {
                    return Err(format!(
                        "segment {s} (gen {}) header extent at {} of key {:#x}: header says live={}, the line's current extent: {}",
                        m.gen, e.off, e.key, e.live, cur
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks the engine's invariants and the segments' dead sets (tests).
    pub fn check(&self) -> Result<(), String> {
        let mut g = self.lock();
        g.eng.check()?;
        g.check_dead()
    }

    /// Reads every extent a cached line maps (once per extent), checks its crc32c, expands it
    /// and compares the BLAKE3 of the line with the digest its header holds. Changes nothing.
    pub fn scrub(&self) -> io::Result<LogScrub> {
        let mut g = self.lock();
        let mut r = LogScrub::default();
        let mut locs: Vec<(u32, u32, bool, u64)> = Vec::new();
        for (k, i) in g.eng.entries() {
            r.lines += 1;
            r.dirty_lines += i.dirty as u64;
            locs.push((i.seg, i.off, i.dirty, k));
        }
        locs.sort_unstable();
        let mut line = vec![0u8; g.sb.line_size as usize];
        let mut i = 0;
        while i < locs.len() {
            let (seg, off) = (locs[i].0, locs[i].1);
            let mut j = i;
            let mut dirty = false;
            while j < locs.len() && (locs[j].0, locs[j].1) == (seg, off) {
                dirty |= locs[j].2;
                j += 1;
            }
            let affected = (j - i) as u64;
            i = j;
            r.extents += 1;
            let Some(ext) = g.segs[seg as usize].ext_at(off).copied() else {
                r.problems.push(format!(
                    "segment {seg} offset {off}: mapped by {affected} line(s) but not in its header"
                ));
                continue;
            };
            let bad = if !g.load_stored(seg, &ext)? {
                Some("checksum mismatch")
            } else {
                let stored = std::mem::take(&mut g.stored);
                let ok = g.red.expand(&stored, ext.compressed, &mut line).is_ok();
                g.stored = stored;
                if !ok {
                    Some("does not decompress to a line")
                } else if Reducer::hash(&line) != ext.hash {
                    Some("content differs from its BLAKE3 digest")
                } else {
                    None
                }
            };
            if let Some(why) = bad {
                r.bad_extents += 1;
                r.problems.push(format!(
                    "segment {seg} offset {off} ({} bytes{}): {why}; {affected} line(s){}",
                    ext.len,
                    if ext.compressed { ", compressed" } else { "" },
                    if dirty {
                        ", dirty: their data is lost"
                    } else {
                        ", clean: they will be read from the backing device"
                    }
                ));
                if dirty {
                    r.lost_lines += affected;
                }
            }
        }
        Ok(r)
    }
}
