//! Devices the volume executes plans on: files or block devices, and an emulated HDD.

use crate::identity::BackingIdentity;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tiercache_devices::{Checked, Completion, Device, Hdd, HddConfig, IoKind, IoOp};

/// A byte-addressed device. Reads past the end return zeroes and writes past the end are
/// dropped (a volume whose size is not a multiple of the line size has a partial last line).
///
/// A device's size need not be a multiple of a line or a sector, so the volume's last line
/// may reach past its end: every device reads zeros past its end and drops bytes written
/// there, as a file does.
pub trait BlockDev: Send + Sync {
    fn size(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes completed writes durable.
    fn sync(&self) -> io::Result<()>;
    /// Which device this is (`crate::identity`); `None`: unknown (not checked).
    fn identity(&self) -> Option<BackingIdentity> {
        None
    }
    /// End of the device region holding byte `offset`: the device's size, or for several
    /// volumes as one device (`crate::volume_set`) the end of that volume.
    fn region_end(&self, _offset: u64) -> u64 {
        self.size()
    }
}

/// A regular file or a block device.
pub struct FileDev {
    file: File,
    size: u64,
    id: Option<BackingIdentity>,
}

impl FileDev {
    /// Opens for reading and writing, with a shared advisory lock (`flock`): a device that
    /// `tiercache check --repair` holds exclusively is refused. File systems without flock
    /// open unlocked.
    pub fn open(path: &Path) -> io::Result<FileDev> {
        Self::open_locked(path, libc::LOCK_SH)
    }

    /// Opens for reading and writing with an exclusive advisory lock: fails while any other
    /// [`FileDev::open`] (a running server) holds the device. For offline repair.
    pub fn open_exclusive(path: &Path) -> io::Result<FileDev> {
        Self::open_locked(path, libc::LOCK_EX)
    }

    fn open_locked(path: &Path, how: libc::c_int) -> io::Result<FileDev> {
        use std::os::fd::AsRawFd;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: in use ({})",
                        path.display(),
                        if how == libc::LOCK_EX {
                            "a server or another process has it open; stop it first"
                        } else {
                            "`tiercache check --repair` is repairing it; wait for it to finish"
                        }
                    ),
                ));
            }
        }
        let size = file.seek(SeekFrom::End(0))?;
        let id = BackingIdentity::of_path(path).ok();
        Ok(FileDev { file, size, id })
    }

    /// Opens for reading only (writes fail): for offline checks.
    pub fn open_read_only(path: &Path) -> io::Result<FileDev> {
        let mut file = File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let size = file.seek(SeekFrom::End(0))?;
        let id = BackingIdentity::of_path(path).ok();
        Ok(FileDev { file, size, id })
    }
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let n = (self.size.saturating_sub(offset)).min(buf.len() as u64) as usize;
        self.file.read_exact_at(&mut buf[..n], offset)?;
        buf[n..].fill(0);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let n = (self.size.saturating_sub(offset)).min(data.len() as u64) as usize;
        self.file.write_all_at(&data[..n], offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn identity(&self) -> Option<BackingIdentity> {
        self.id.clone()
    }
}

/// A backing device that takes as long as the HDD model of `tiercache-devices` says a real
/// disk would: one request at a time (one actuator), the head position carried from request
/// to request, the model's clock running on the wall clock.
pub struct EmulatedHdd<D> {
    inner: D,
    model: Mutex<(Checked<Hdd>, Vec<Completion>)>,
    start: Instant,
}

impl<D: BlockDev> EmulatedHdd<D> {
    /// `cfg.capacity_bytes` is raised to the device size if smaller.
    pub fn new(inner: D, mut cfg: HddConfig) -> Result<Self, String> {
        cfg.capacity_bytes = cfg.capacity_bytes.max(inner.size().next_multiple_of(4096));
        let hdd = Checked::new(Hdd::new(cfg)?);
        Ok(EmulatedHdd {
            inner,
            model: Mutex::new((hdd, Vec::new())),
            start: Instant::now(),
        })
    }

    /// Holds the actuator for the modelled service time of `op`, then runs `io`.
    fn timed<T>(&self, op: IoOp, io: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let mut m = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let (hdd, done) = &mut *m;
        let now = self.start.elapsed().as_nanos() as u64;
        hdd.submit(now, 0, op);
        while let Some(t) = hdd.next_completion() {
            hdd.advance(t, done);
        }
        let finish = done.last().map(|c| c.time_ns).unwrap_or(now);
        done.clear();
        let r = io();
        let wait = finish.saturating_sub(self.start.elapsed().as_nanos() as u64);
        if wait > 0 {
            std::thread::sleep(Duration::from_nanos(wait));
        }
        r
    }
}

impl<D: BlockDev> BlockDev for EmulatedHdd<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let op = IoOp::new(IoKind::Read, offset, buf.len().max(1) as u64);
        self.timed(op, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let op = IoOp::new(IoKind::Write, offset, data.len().max(1) as u64);
        self.timed(op, || self.inner.write_at(data, offset))
    }
    fn sync(&self) -> io::Result<()> {
        self.timed(IoOp::new(IoKind::Flush, 0, 0), || self.inner.sync())
    }
    fn identity(&self) -> Option<BackingIdentity> {
        self.inner.identity()
    }
    fn region_end(&self, offset: u64) -> u64 {
        self.inner.region_end(offset)
    }
}

impl BlockDev for Box<dyn BlockDev> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn identity(&self) -> Option<BackingIdentity> {
        (**self).identity()
    }
    fn region_end(&self, offset: u64) -> u64 {
        (**self).region_end(offset)
    }
}

/// An HDD model by preset name (`7200`, `5400`, `10k`, `15k`) or TOML file.
pub fn hdd_config(spec: &str) -> Result<HddConfig, String> {
    if let Some(c) = HddConfig::preset(spec) {
        return Ok(c);
    }
    let text = std::fs::read_to_string(spec).map_err(|e| {
        format!("--emulate-hdd {spec}: not a preset (5400, 7200, 10k, 15k) and not readable: {e}")
    })?;
    toml::from_str(&text).map_err(|e| format!("{spec}: {e}"))
}
