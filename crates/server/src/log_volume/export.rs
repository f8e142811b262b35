//! The NBD export: client requests mapped onto the volume.

use super::*;

impl Export for LogVolume {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let _timed = crate::live::Timed::start(&self.metrics, false, buf.len());
        // The RAM tier first (`ram.rs`): a hit takes neither the lock nor the cache device.
        let req = Request::read(offset, buf.len() as u64);
        let ticket = match self.ram_read(&req, buf) {
            Ok(()) => {
                self.after_request(Some((offset, buf)));
                return Ok(());
            }
            Err(t) => t,
        };
        let mut red = None;
        let r = self.read_lines(offset, buf, &mut red);
        if let Some(red) = red {
            self.put_reducer(red);
        }
        if r.is_ok() {
            self.ram_fill(&req, ticket, buf);
            self.after_request(Some((offset, buf)));
        }
        r
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let _timed = crate::live::Timed::start(&self.metrics, true, data.len());
        let _ram = self.ram_invalidating(Request::write(offset, data.len() as u64));
        // Hashing, compression and checksums of whole lines need only the request's bytes:
        // done before the lock, so that connections reduce in parallel.
        let pre = self.pre_reduce(offset, data);
        let first = offset / self.line;
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Write(offset, data, fua));
        }
        let mut req = Request::write(offset, data.len() as u64);
        req.fua = fua;
        g.req_class = self.classify(&req, Some(data));
        let ls = self.line;
        let mut line_buf = vec![0u8; ls as usize];
        let mut go = |g: &mut Inner| -> io::Result<()> {
            g.dropped_now.clear();
            if g.sb.mode == Mode::WriteThrough {
                let lines: Vec<u64> = self.lines(offset, data.len() as u64).collect();
                g.drop_durably(&lines, true)?;
            }
            // The request's line outcome: its first line's (counted by the engine), all its
            // lines' (counted once the request is written).
            let (mut first_t, mut whole) = (LineTally::default(), LineTally::default());
            for line in self.lines(offset, data.len() as u64) {
                let a = (line * ls).max(offset);
                let b = ((line + 1) * ls).min(offset + data.len() as u64);
                let src = &data[(a - offset) as usize..(b - offset) as usize];
                if b - a == ls {
                    let p = pre.get((line - first) as usize).and_then(Option::as_ref);
                    g.write_line(line, src, fua, p, line == first, a..b)?;
                } else {
                    g.current_line(line, &mut line_buf)?;
                    line_buf[(a - line * ls) as usize..(b - line * ls) as usize]
                        .copy_from_slice(src);
                    g.write_line(line, &line_buf, fua, None, line == first, a..b)?;
                }
                let t = g.eng.last_lines();
                if line == first {
                    first_t = t;
                }
                whole += t;
            }
            if whole != first_t {
                let class = g.req_class;
                g.eng.recount_request(Op::Write, class, first_t, whole);
            }
            if fua {
                g.commit()?;
            }
            Ok(())
        };
        let r = go(&mut g);
        g.dropped_now.clear();
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            // The cache failed during this request (its dirty lines copied to the backing
            // device first): the backing device takes the whole write.
            return g.direct(Direct::Write(offset, data, fua));
        }
        if r.is_ok() {
            degrade::unlose(&mut g.lost, offset, offset + data.len() as u64);
        }
        drop(g);
        if r.is_ok() {
            self.after_request(None);
        }
        r
    }

    fn flush(&self) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Flush);
        }
        let _ = g.eng.process(&Request::new(0, Op::Flush, 0, 0), &[]);
        g.sync_retry_now();
        let r = g.commit();
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            return g.direct(Direct::Flush);
        }
        r
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ram = self.ram_invalidating(Request::new(0, Op::Trim, offset, len));
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Trim(offset, len));
        }
        let ls = self.line;
        let mut r = Ok(());
        for line in self.lines(offset, len) {
            if offset <= line * ls && (line + 1) * ls <= offset + len {
                // Contents unspecified now: nothing to write again after a failed sync.
                g.hdd_unsynced.remove(&line);
                r = g.unmap(line);
                if r.is_err() {
                    break;
                }
            }
        }
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            return g.direct(Direct::Trim(offset, len));
        }
        if r.is_ok() {
            degrade::unlose(&mut g.lost, offset, offset + len);
        }
        r
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        let chunk = 1u64 << 20;
        let zero = vec![0u8; chunk.min(len) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            self.write(at, &zero[..n as usize], false)?;
            at += n;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn block_sizes(&self) -> tiercache_nbd::BlockSizes {
        tiercache_nbd::BlockSizes {
            minimum: 1,
            preferred: self.line as u32,
            maximum: 32 << 20,
        }
    }

    fn description(&self) -> Option<String> {
        let sb = self.superblock();
        Some(format!(
            "tiercache log layout, {}, {} compression, dedup index {}",
            sb.mode, sb.compression, sb.dedup_ratio
        ))
    }
}
