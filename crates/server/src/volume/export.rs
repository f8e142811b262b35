//! The NBD export: client requests mapped onto the volume.

use super::*;

impl Export for CacheVolume {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let req = Request::read(offset, buf.len() as u64);
        self.timed(false, || self.reading(&req, buf))?;
        if self.classifiers.any() {
            self.after_classified(0, Some((offset, buf)));
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let mut req = Request::write(offset, data.len() as u64);
        req.fua = fua;
        self.timed(true, || self.invalidating(&req, Data::Write(data)))?;
        if self.classifiers.any() {
            self.after_classified(0, None);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.run(&Request::new(0, Op::Flush, 0, 0), Data::None)
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.invalidating(&Request::new(0, Op::Trim, offset, len), Data::None)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            let last = done + n == len;
            self.write(offset + done, &zeroes[..n as usize], fua && last)?;
            done += n;
        }
        Ok(())
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }
}

impl CacheVolume {
    /// A request of volume `vol` of several (`serve --volume`; `crate::live::VolumeExport`):
    /// as the one-volume export's, stamped with the volume (the RAM tier keys its lines by
    /// volume too), classified by the volume's own classifier.
    pub fn volume_io(&self, vol: u32, io: crate::live::VolumeIo<'_>) -> io::Result<()> {
        use crate::live::VolumeIo;
        let Some((spec, _busy)) = self.volumes.enter(vol) else {
            // Removed (`ctl volume remove`) while this client was connected: every request
            // of it fails (EIO), the other volumes' are not concerned.
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("volume id {vol} is not served (removed with `ctl volume remove`)"),
            ));
        };
        let stamp = |mut r: Request| {
            r.volume = vol;
            r
        };
        let r = match io {
            VolumeIo::Read(offset, buf) => {
                let req = stamp(Request::read(offset, buf.len() as u64));
                let r = self.timed(false, || self.reading(&req, buf));
                if r.is_ok() && self.classifiers.any() {
                    self.after_classified(vol, Some((offset, buf)));
                }
                r
            }
            VolumeIo::Write(offset, data, fua) => {
                let mut req = stamp(Request::write(offset, data.len() as u64));
                req.fua = fua;
                let r = self.timed(true, || self.invalidating(&req, Data::Write(data)));
                if r.is_ok() && self.classifiers.any() {
                    self.after_classified(vol, None);
                }
                r
            }
            VolumeIo::Flush => self.run(&stamp(Request::new(0, Op::Flush, 0, 0)), Data::None),
            VolumeIo::Trim(offset, len) => {
                self.invalidating(&stamp(Request::new(0, Op::Trim, offset, len)), Data::None)
            }
        };
        // A lost range names the volume, with offsets within it.
        r.map_err(|e| crate::degrade::name_lost_range(e, &spec.name))
    }

    /// A read: the RAM tier first (a hit takes neither the volume lock nor the cache
    /// device), else below, then the RAM tier is filled with what was read. Not once a panic
    /// poisoned the lock: the read goes below and halts the volume.
    fn reading(&self, req: &Request, buf: &mut [u8]) -> io::Result<()> {
        match &self.ram {
            Some(ram) if !self.inner.is_poisoned() && ram.read(req, buf) => Ok(()),
            Some(ram) => {
                let ticket = ram.ticket();
                self.run(req, Data::Read(buf))?;
                ram.fill(req, ticket, buf);
                Ok(())
            }
            None => self.run(req, Data::Read(buf)),
        }
    }

    /// A write or trim (write-zeroes is written): its lines leave the RAM tier before it
    /// runs and again after (succeeded or not), so a read that filled RAM while it ran does
    /// not leave the old bytes there (`tiercache_engine::ram_tier`).
    fn invalidating(&self, req: &Request, data: Data<'_>) -> io::Result<()> {
        let Some(ram) = &self.ram else {
            return self.run(req, data);
        };
        ram.invalidate(req);
        let r = self.run(req, data);
        ram.invalidate(req);
        r
    }
}
