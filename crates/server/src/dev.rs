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
    /// The record pages `writes` (offset, bytes) are about to be written, as one batch (a
    /// flush's): a pool of cache devices (`crate::PoolDev`) raises its members' flags for
    /// the records of the whole batch before any is written, so a line's record and its
    /// copy's may be written in either order. Writes nothing else. Default: nothing.
    fn prepare_records(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let _ = writes;
        Ok(())
    }
    /// Tells the device that `len` bytes at `offset` hold nothing needed any more (TRIM,
    /// discard): advisory; their contents afterwards are unspecified (zeros or the old
    /// bytes), so a caller discards only what nothing durable refers to. Returns whether the
    /// device took it (`false`: it cannot discard; nothing happened). Default: `false`.
    fn discard(&self, offset: u64, len: u64) -> io::Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
    /// Which device this is (`crate::identity`); `None`: unknown (not checked).
    fn identity(&self) -> Option<BackingIdentity> {
        None
    }
    /// End of the device region holding byte `offset`: the device's size, or for several
    /// volumes as one device (`crate::volume_set`) the end of that volume.
    fn region_end(&self, _offset: u64) -> u64 {
        self.size()
    }
    /// Lines per member when this cache device is a pool of several (`crate::PoolDev`), for
    /// the engine's placement (`EngineConfig::pool_lines`); empty: one device.
    fn pool_lines(&self) -> Vec<u64> {
        Vec::new()
    }
    /// A pool of several cache devices: member `d` failed; nothing reaches it from now on and
    /// the failure is durable when this returns Ok (`crate::PoolDev`). One device: refused.
    fn fail_member(&self, d: usize) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("fail cache member {d}: not a pool of cache devices"),
        ))
    }
    /// The failed members of a pool of cache devices (empty: none, or one device).
    fn failed_members(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The members' names (paths or URIs) of a pool of cache devices (empty: one device).
    fn pool_member_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Per member of a pool of cache devices, the requests and bytes it was given so far
    /// (empty: one device).
    fn pool_member_io(&self) -> Vec<MemberIo> {
        Vec::new()
    }
    /// Cache copies of each dirty line stored in a pool's blocks (`--dirty-copies`; 0: not
    /// chosen, or one device).
    fn dirty_copies(&self) -> u8 {
        0
    }
    /// A pool of cache devices: failed member `d` is replaced by `dev` (named `name`),
    /// formatted as that member (`crate::PoolDev::replace_member`); the pool's blocks say it
    /// is active when this returns Ok. Err: refused or failed, naming why. One device:
    /// refused.
    fn replace_member(&self, d: usize, name: String, dev: Box<dyn BlockDev>) -> Result<(), String> {
        drop((name, dev));
        Err(format!(
            "replace cache member {d}: not a pool of cache devices"
        ))
    }
    /// Volume byte ranges a pool of cache devices started without the dirty data of
    /// (`--accept-lost-dirty`, `crate::pool_dev::PoolDev::lost_at_open`): the volume records
    /// them lost at open.
    fn lost_at_open(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
}

/// One pool member's I/O so far ([`BlockDev::pool_member_io`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberIo {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

/// The `BlockDev` methods a wrapper device passes through to the device it wraps, unchanged:
/// `forward_device_info!(.inner)` in its impl (the tokens after `self` that reach the
/// wrapped device). Every forwarding wrapper uses
/// this one list, so a new trait method with a default is forwarded by adding it here once
/// (a wrapper that kept the default silently filled one pool member with every line).
macro_rules! forward_device_info {
    ($($to_inner:tt)+) => {
        fn discard(&self, offset: u64, len: u64) -> std::io::Result<bool> {
            self $($to_inner)+.discard(offset, len)
        }
        fn identity(&self) -> Option<$crate::identity::BackingIdentity> {
            self $($to_inner)+.identity()
        }
        fn region_end(&self, offset: u64) -> u64 {
            self $($to_inner)+.region_end(offset)
        }
        fn pool_lines(&self) -> Vec<u64> {
            self $($to_inner)+.pool_lines()
        }
        fn fail_member(&self, d: usize) -> std::io::Result<()> {
            self $($to_inner)+.fail_member(d)
        }
        fn failed_members(&self) -> Vec<usize> {
            self $($to_inner)+.failed_members()
        }
        fn pool_member_names(&self) -> Vec<String> {
            self $($to_inner)+.pool_member_names()
        }
        fn pool_member_io(&self) -> Vec<$crate::dev::MemberIo> {
            self $($to_inner)+.pool_member_io()
        }
        fn dirty_copies(&self) -> u8 {
            self $($to_inner)+.dirty_copies()
        }
        fn lost_at_open(&self) -> Vec<(u64, u64)> {
            self $($to_inner)+.lost_at_open()
        }
        fn prepare_records(&self, writes: &[(u64, &[u8])]) -> std::io::Result<()> {
            self $($to_inner)+.prepare_records(writes)
        }
        fn replace_member(
            &self,
            d: usize,
            name: String,
            dev: Box<dyn $crate::dev::BlockDev>,
        ) -> Result<(), String> {
            self $($to_inner)+.replace_member(d, name, dev)
        }
    };
}
pub(crate) use forward_device_info;

/// A regular file or a block device.
pub struct FileDev {
    file: File,
    size: u64,
    id: Option<BackingIdentity>,
    /// `discard` still worth trying (cleared when the file system or device refuses it).
    can_discard: std::sync::atomic::AtomicBool,
}

/// `BLKDISCARD`, `_IO(0x12, 119)` (linux/fs.h): discards a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

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
        Ok(FileDev {
            file,
            size,
            id,
            can_discard: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Opens for reading only (writes fail): for offline checks.
    pub fn open_read_only(path: &Path) -> io::Result<FileDev> {
        let mut file = File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let size = file.seek(SeekFrom::End(0))?;
        let id = BackingIdentity::of_path(path).ok();
        Ok(FileDev {
            file,
            size,
            id,
            can_discard: std::sync::atomic::AtomicBool::new(true),
        })
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

    /// A regular file punches a hole (the range reads zeros and frees its blocks); a block
    /// device gets `BLKDISCARD`. A file system or device that cannot is not asked again.
    fn discard(&self, offset: u64, len: u64) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileTypeExt;
        use std::sync::atomic::Ordering;
        let len = len.min(self.size.saturating_sub(offset));
        if len == 0 || !self.can_discard.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let fd = self.file.as_raw_fd();
        let rc = if self.file.metadata()?.file_type().is_block_device() {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer given.
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
        } else {
            // SAFETY: a plain syscall on a descriptor this device owns.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::ENOTTY) => {
                self.can_discard.store(false, Ordering::Relaxed);
                Ok(false)
            }
            _ => Err(e),
        }
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
        sleep_until(self.start, finish);
        r
    }
}

/// Sleeps until `finish_ns` after `start` (an emulated device's modelled completion time).
fn sleep_until(start: Instant, finish_ns: u64) {
    let wait = finish_ns.saturating_sub(start.elapsed().as_nanos() as u64);
    if wait > 0 {
        std::thread::sleep(Duration::from_nanos(wait));
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
    forward_device_info!(.inner);
}

/// A cache device that takes as long as a simple SSD would (`--emulate-ssd LAT_US[:CHANNELS]`):
/// each read or write is served by one of `channels` independent channels for `lat_us` per
/// 4 KiB started (a 64 KiB op holds its channel 16 x `lat_us`); an op finding every channel
/// busy waits for the first to free. A flush costs nothing of its own. The sim model with the
/// same rule is the `emu:LAT_US[:CHANNELS]` cache device of `tiercache sim --ssd`.
pub struct EmulatedSsd<D> {
    inner: D,
    /// Wall-clock ns (since `start`) at which each channel is free again.
    channels: Mutex<Vec<u64>>,
    lat_ns: u64,
    start: Instant,
}

/// `LAT_US[:CHANNELS]` of `--emulate-ssd` (CHANNELS 1 when absent).
pub fn parse_emulate_ssd(spec: &str) -> Result<(f64, u32), String> {
    let bad =
        |why: &str| format!("--emulate-ssd '{spec}': {why}; use LAT_US[:CHANNELS], e.g. 200:1");
    let (lat, ch) = match spec.split_once(':') {
        Some((l, c)) => (l, Some(c)),
        None => (spec, None),
    };
    let lat: f64 = lat
        .trim()
        .parse()
        .map_err(|_| bad("the latency is not a number of microseconds"))?;
    if !(lat.is_finite() && lat > 0.0 && lat <= 1e6) {
        return Err(bad("the latency must be above 0 and at most 1000000 us"));
    }
    let ch: u32 = match ch {
        Some(c) => c
            .trim()
            .parse()
            .map_err(|_| bad("CHANNELS is not a whole number"))?,
        None => 1,
    };
    if !(1..=1024).contains(&ch) {
        return Err(bad("CHANNELS must be 1 to 1024"));
    }
    Ok((lat, ch))
}

impl<D: BlockDev> EmulatedSsd<D> {
    pub fn new(inner: D, lat_us: f64, channels: u32) -> Result<Self, String> {
        if !(lat_us.is_finite() && lat_us > 0.0) || channels == 0 {
            return Err(format!(
                "an emulated SSD needs a latency above 0 and at least one channel (got {lat_us} \
                 us, {channels} channels)"
            ));
        }
        Ok(EmulatedSsd {
            inner,
            channels: Mutex::new(vec![0; channels as usize]),
            lat_ns: (lat_us * 1e3).round() as u64,
            start: Instant::now(),
        })
    }

    /// Takes the first free channel for `len` bytes' service time, runs `io`, and returns
    /// when the service time has passed.
    fn timed<T>(&self, len: usize, io: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let units = (len as u64).div_ceil(4096).max(1);
        let finish = {
            let mut ch = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            let now = self.start.elapsed().as_nanos() as u64;
            let free = ch.iter_mut().min().expect("at least one channel");
            let finish = (*free).max(now) + units * self.lat_ns;
            *free = finish;
            finish
        };
        let r = io();
        sleep_until(self.start, finish);
        r
    }
}

impl<D: BlockDev> BlockDev for EmulatedSsd<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.timed(buf.len(), || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.timed(data.len(), || self.inner.write_at(data, offset))
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    forward_device_info!(.inner);
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
    forward_device_info!(.as_ref());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(lat_us: f64, channels: u32) -> (tempfile::TempDir, EmulatedSsd<FileDev>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ssd.img");
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let d = EmulatedSsd::new(FileDev::open(&p).unwrap(), lat_us, channels).unwrap();
        (dir, d)
    }

    #[test]
    fn emulated_ssd_takes_its_service_time_per_4k() {
        let (_dir, d) = dev(20_000.0, 1);
        let t = Instant::now();
        d.write_at(&[7u8; 8192], 4096).unwrap(); // 2 units: 40 ms
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 8192).unwrap(); // 1 unit: 20 ms
        let e = t.elapsed();
        assert!(e >= Duration::from_millis(60), "{e:?}");
        assert_eq!(b, [7u8; 4096]);
    }

    #[test]
    fn emulated_ssd_channels_overlap_and_one_channel_serialises() {
        let run = |channels: u32| {
            let (_dir, d) = dev(50_000.0, channels);
            let t = Instant::now();
            std::thread::scope(|s| {
                for i in 0..4u64 {
                    let d = &d;
                    s.spawn(move || d.write_at(&[1u8; 4096], i * 4096).unwrap());
                }
            });
            t.elapsed()
        };
        // Four 50 ms ops: one channel takes >= 200 ms, four channels ~50 ms.
        let one = run(1);
        let four = run(4);
        assert!(one >= Duration::from_millis(200), "{one:?}");
        assert!(four >= Duration::from_millis(50), "{four:?}");
        assert!(four < Duration::from_millis(150), "{four:?}");
    }

    #[test]
    fn emulate_ssd_spec_is_validated_with_the_reason() {
        assert_eq!(parse_emulate_ssd("200"), Ok((200.0, 1)));
        assert_eq!(parse_emulate_ssd("20:4"), Ok((20.0, 4)));
        for (bad, why) in [
            ("x", "not a number"),
            ("0", "above 0"),
            ("-5:2", "above 0"),
            ("200:0", "1 to 1024"),
            ("200:y", "whole number"),
        ] {
            let e = parse_emulate_ssd(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("LAT_US[:CHANNELS]"),
                "{bad}: {e}"
            );
        }
    }
}
