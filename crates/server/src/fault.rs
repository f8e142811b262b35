//! A seeded fault-injecting device, for crash-point enumeration and device-fault drills.
//!
//! [`Faults`] is shared by every device it wraps (typically the cache and the backing device)
//! and numbers their write and sync calls 1, 2, 3, ... in the order they happen (an *event*).
//! It can cut the power at event N ([`Faults::crash_at`]): the Nth call fails, and so does
//! every later call on every wrapped device; writes not yet synced are then applied sector by
//! sector at random (each 512-byte sector of each write independently, in write order) and
//! the rest dropped, as a volatile write cache losing power would. With `tear`, the Nth call
//! itself is a write that reaches the device partially (a torn write); without, it is lost.
//!
//! Devices wrapped with `volatile = true` model that write cache (an OS page cache, a disk's
//! DRAM): written bytes are visible to reads at once but reach the file only at `sync`.
//! Independently of crashes, a [`FaultHandle`] injects I/O errors: reads or writes of byte
//! ranges fail, syncs fail, or the whole device is gone ([`FaultHandle::lose`]).
//!
//! Nothing here is used by `tiercache serve`; it exists so the volume's failure handling can
//! be tested through the same `BlockDev` interface real devices use.

use crate::dev::BlockDev;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Granularity at which unsynced and torn writes reach the device.
pub const TEAR_SECTOR: usize = 512;

/// Event numbering, the crash point and the power state shared by wrapped devices.
pub struct Faults {
    st: Mutex<State>,
    power_lost: AtomicBool,
}

struct State {
    events: u64,
    crash_at: Option<u64>,
    tear: bool,
    tear_bytes: usize,
    /// Crash at the Nth write to this device and byte range instead of the Nth event.
    filter: Option<(String, Range<u64>)>,
    matched: u64,
    rng: StdRng,
    devs: Vec<Arc<DevState>>,
}

/// Errors to inject on one device, and what was injected.
#[derive(Default)]
struct Rules {
    fail_reads: Vec<Range<u64>>,
    fail_writes: Vec<Range<u64>>,
    fail_syncs: bool,
    /// With `fail_syncs`: every failing sync also drops the unsynced writes
    /// ([`FaultHandle::fail_syncs_dropping`]).
    drop_failed_syncs: bool,
    /// The next sync fails once; `true`: the writes it should have made durable are dropped
    /// from the write cache (a later sync then succeeds without them, as Linux may do after a
    /// writeback error: the pages are marked clean, the error reported once).
    fail_next_sync: Option<bool>,
    /// Syncs left before one fails once (1: the next), and whether it drops the unsynced
    /// writes ([`FaultHandle::fail_nth_sync`]).
    fail_nth_sync: Option<(u64, bool)>,
    lost: bool,
    /// OS error number injected errors carry (`None`: a plain error, like EIO).
    errno: Option<i32>,
    /// Writes left before one fails (1: the next), and whether every later one fails too.
    fail_nth: Option<(u64, bool)>,
}

struct DevState {
    inner: Box<dyn BlockDev>,
    name: String,
    volatile: bool,
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
    rules: Mutex<Rules>,
    injected: AtomicU64,
    /// Writes that reached the device (or its write cache).
    writes: AtomicU64,
    /// Discards taken (`BlockDev::discard`).
    discards: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn overlaps(rs: &[Range<u64>], off: u64, len: u64) -> bool {
    rs.iter().any(|r| r.start < off + len && off < r.end)
}

impl Faults {
    pub fn new(seed: u64) -> Arc<Faults> {
        Arc::new(Faults {
            st: Mutex::new(State {
                events: 0,
                crash_at: None,
                tear: false,
                tear_bytes: TEAR_SECTOR,
                filter: None,
                matched: 0,
                rng: StdRng::seed_from_u64(seed),
                devs: Vec::new(),
            }),
            power_lost: AtomicBool::new(false),
        })
    }

    /// Cuts the power at event `n` (1-based); `tear`: that event, if a write, is torn.
    pub fn crash_at(&self, n: u64, tear: bool) {
        let mut st = lock(&self.st);
        st.crash_at = Some(n);
        st.tear = tear;
    }

    /// Cuts the power at the `n`th write to device `dev` overlapping `range` (a torn write),
    /// e.g. to aim at the metadata area.
    pub fn crash_at_write_to(&self, n: u64, dev: &str, range: Range<u64>) {
        let mut st = lock(&self.st);
        st.crash_at = Some(n);
        st.tear = true;
        st.filter = Some((dev.to_string(), range));
    }

    /// Writes that matched the filter of [`Faults::crash_at_write_to`] so far.
    pub fn matched_writes(&self) -> u64 {
        lock(&self.st).matched
    }

    /// Granularity of the torn write at the crash point (default [`TEAR_SECTOR`]; smaller
    /// values model devices without atomic sector writes).
    pub fn set_tear_bytes(&self, n: usize) {
        lock(&self.st).tear_bytes = n.max(1);
    }

    /// Writes and syncs so far on all wrapped devices.
    pub fn events(&self) -> u64 {
        lock(&self.st).events
    }

    pub fn power_lost(&self) -> bool {
        self.power_lost.load(Ordering::SeqCst)
    }

    /// Wraps `inner`; `volatile`: writes stay in a write cache until `sync`.
    pub fn wrap(
        self: &Arc<Self>,
        name: &str,
        inner: Box<dyn BlockDev>,
        volatile: bool,
    ) -> (FaultDev, FaultHandle) {
        let st = Arc::new(DevState {
            inner,
            name: name.to_string(),
            volatile,
            pending: Mutex::new(Vec::new()),
            rules: Mutex::new(Rules::default()),
            injected: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            discards: AtomicU64::new(0),
        });
        lock(&self.st).devs.push(Arc::clone(&st));
        let dev = FaultDev {
            faults: Arc::clone(self),
            st: Arc::clone(&st),
        };
        (dev, FaultHandle { st })
    }

    /// Cuts the power now: unsynced writes of every volatile device reach it sector by
    /// sector at random (and are synced to the underlying device, so its files hold what a
    /// restart would find), and every later call fails. Idempotent.
    pub fn power_cut(&self) {
        let mut st = lock(&self.st);
        self.cut(&mut st);
    }

    /// The process exits (or is killed) without a power cut: every unsynced write of every
    /// volatile device reaches its file, as an OS page cache outliving the process would,
    /// and every later call on the wrapped devices fails. Idempotent.
    pub fn process_exit(&self) {
        let st = lock(&self.st);
        if self.power_lost.swap(true, Ordering::SeqCst) {
            return;
        }
        for d in st.devs.iter() {
            let mut pending = lock(&d.pending);
            for (off, data) in pending.drain(..) {
                // A failure here leaves the bytes unwritten, as a failing device may.
                let _ = d.inner.write_at(&data, off);
            }
            drop(pending);
            let _ = d.inner.sync();
        }
    }

    fn cut(&self, st: &mut State) {
        if self.power_lost.swap(true, Ordering::SeqCst) {
            return;
        }
        let devs = st.devs.clone();
        for d in devs {
            let mut pending = lock(&d.pending);
            for (off, data) in pending.drain(..) {
                for (i, c) in data.chunks(TEAR_SECTOR).enumerate() {
                    if st.rng.gen_bool(0.5) {
                        // A failure here leaves the sector unwritten, which a cut may do.
                        let _ = d.inner.write_at(c, off + (i * TEAR_SECTOR) as u64);
                    }
                }
            }
            let _ = d.inner.sync();
        }
    }
}

/// A device whose writes and syncs are numbered by [`Faults`] and can fail.
pub struct FaultDev {
    faults: Arc<Faults>,
    st: Arc<DevState>,
}

/// Injects errors into one wrapped device, and finishes its power cut.
#[derive(Clone)]
pub struct FaultHandle {
    st: Arc<DevState>,
}

impl FaultHandle {
    /// Reads overlapping `r` fail from now on.
    pub fn fail_reads(&self, r: Range<u64>) {
        lock(&self.st.rules).fail_reads.push(r);
    }
    /// Writes overlapping `r` fail (and change nothing) from now on.
    pub fn fail_writes(&self, r: Range<u64>) {
        lock(&self.st.rules).fail_writes.push(r);
    }
    /// Syncs fail from now on.
    pub fn fail_syncs(&self) {
        lock(&self.st.rules).fail_syncs = true;
    }
    /// Syncs fail from now on, and each failure drops the writes since the last good sync
    /// from the write cache (a volatile device), as Linux does after a writeback error: a
    /// backing device whose flushes keep failing (`scripts/faultdev.sh`'s `flush drop`).
    pub fn fail_syncs_dropping(&self) {
        let mut r = lock(&self.st.rules);
        r.fail_syncs = true;
        r.drop_failed_syncs = true;
    }
    /// The next sync fails, once (a transient error); with `drop_unsynced`, the unsynced
    /// writes of a volatile device are lost with it, so a later successful sync does not
    /// make them durable (Linux after a writeback error) and reads return the older bytes.
    pub fn fail_next_sync(&self, drop_unsynced: bool) {
        lock(&self.st.rules).fail_next_sync = Some(drop_unsynced);
    }
    /// The `n`th sync from now on (1: the next) fails, once, as [`FaultHandle::fail_next_sync`]
    /// (`drop_unsynced` likewise); the syncs before it succeed.
    pub fn fail_nth_sync(&self, n: u64, drop_unsynced: bool) {
        lock(&self.st.rules).fail_nth_sync = Some((n.max(1), drop_unsynced));
    }
    /// The device is gone: every call fails, and unsynced writes are lost.
    pub fn lose(&self) {
        lock(&self.st.rules).lost = true;
        lock(&self.st.pending).clear();
    }
    /// Injected errors carry OS error `errno` from now on (e.g. `libc::ENOSPC` for a full
    /// file system); by default they are plain errors, as EIO would be reported.
    pub fn fail_with_errno(&self, errno: i32) {
        lock(&self.st.rules).errno = Some(errno);
    }
    /// The `n`th write from now on (1: the next) fails and changes nothing; with
    /// `permanent`, every later write fails too (a transient error otherwise).
    pub fn fail_nth_write(&self, n: u64, permanent: bool) {
        lock(&self.st.rules).fail_nth = Some((n.max(1), permanent));
    }
    /// Writes that reached the device so far (injected failures not counted).
    pub fn writes(&self) -> u64 {
        self.st.writes.load(Ordering::Relaxed)
    }
    /// Discards this device took (each also counted as a write of zeros).
    pub fn discards(&self) -> u64 {
        self.st.discards.load(Ordering::Relaxed)
    }
    /// No more injected errors.
    pub fn heal(&self) {
        *lock(&self.st.rules) = Rules::default();
    }
    /// Calls failed by injection so far (not counting failures after a power cut).
    pub fn injected(&self) -> u64 {
        self.st.injected.load(Ordering::Relaxed)
    }
}

fn injected(what: &str, dev: &str, off: u64, len: u64, errno: Option<i32>) -> io::Error {
    let msg = format!("injected {what} error on {dev} at byte {off} (+{len})");
    match errno {
        Some(n) => {
            let os = io::Error::from_raw_os_error(n);
            io::Error::new(os.kind(), format!("{msg}: {os}"))
        }
        None => io::Error::other(msg),
    }
}

impl FaultDev {
    fn check_power(&self) -> io::Result<()> {
        if self.faults.power_lost() {
            return Err(io::Error::other(format!("{}: power lost", self.st.name)));
        }
        Ok(())
    }

    /// Applies `data` at `off` (into the write cache when volatile).
    fn apply(&self, data: &[u8], off: u64) -> io::Result<()> {
        let n = self
            .st
            .inner
            .size()
            .saturating_sub(off)
            .min(data.len() as u64) as usize;
        if self.st.volatile {
            lock(&self.st.pending).push((off, data[..n].to_vec()));
            Ok(())
        } else {
            self.st.inner.write_at(&data[..n], off)
        }
    }
}

impl BlockDev for FaultDev {
    fn size(&self) -> u64 {
        self.st.inner.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_power()?;
        {
            let r = lock(&self.st.rules);
            if r.lost || overlaps(&r.fail_reads, offset, buf.len() as u64) {
                self.st.injected.fetch_add(1, Ordering::Relaxed);
                let n = buf.len() as u64;
                return Err(injected("read", &self.st.name, offset, n, r.errno));
            }
        }
        // The write cache stays locked from the device read to the overlay: a sync moves
        // writes from it to the device under the same lock, so a read never finds a
        // completed write in neither place (`tests/fault_dev_race.rs`).
        let pending = lock(&self.st.pending);
        self.st.inner.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        for (o, d) in pending.iter() {
            let (a, b) = ((*o).max(offset), (o + d.len() as u64).min(end));
            if a < b {
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&d[(a - o) as usize..(b - o) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut st = lock(&self.faults.st);
        self.check_power()?;
        {
            let mut r = lock(&self.st.rules);
            let nth = match r.fail_nth {
                Some((1, permanent)) => {
                    r.fail_nth = permanent.then_some((1, true));
                    true
                }
                Some((k, p)) => {
                    r.fail_nth = Some((k - 1, p));
                    false
                }
                None => false,
            };
            if nth || r.lost || overlaps(&r.fail_writes, offset, data.len() as u64) {
                self.st.injected.fetch_add(1, Ordering::Relaxed);
                let n = data.len() as u64;
                return Err(injected("write", &self.st.name, offset, n, r.errno));
            }
        }
        self.st.writes.fetch_add(1, Ordering::Relaxed);
        st.events += 1;
        let hit = match &st.filter {
            Some((dev, r))
                if *dev == self.st.name
                    && overlaps(std::slice::from_ref(r), offset, data.len() as u64) =>
            {
                st.matched += 1;
                st.crash_at == Some(st.matched)
            }
            Some(_) => false,
            None => st.crash_at == Some(st.events),
        };
        if hit {
            self.faults.cut(&mut st);
            if st.tear {
                // The write reaches the device partially, after the older unsynced writes.
                let n = self
                    .st
                    .inner
                    .size()
                    .saturating_sub(offset)
                    .min(data.len() as u64) as usize;
                let g = st.tear_bytes;
                for (i, c) in data[..n].chunks(g).enumerate() {
                    if st.rng.gen_bool(0.5) {
                        let _ = self.st.inner.write_at(c, offset + (i * g) as u64);
                    }
                }
                let _ = self.st.inner.sync();
            }
            return Err(io::Error::other(format!(
                "{}: power lost during a write (event {})",
                self.st.name, st.events
            )));
        }
        self.apply(data, offset)
    }

    /// A discard is a write of zeros (contents after a discard are unspecified; zeros make a
    /// reader of discarded bytes visible): an event of the crash harness, failed by the same
    /// rules, lost with the other unsynced writes at a power cut.
    fn discard(&self, offset: u64, len: u64) -> io::Result<bool> {
        let n = len.min(self.size().saturating_sub(offset));
        if n == 0 {
            return Ok(false);
        }
        self.write_at(&vec![0u8; n as usize], offset)?;
        self.st.discards.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = lock(&self.faults.st);
        self.check_power()?;
        {
            let mut r = lock(&self.st.rules);
            let mut once = r.fail_next_sync.take();
            if let Some((n, drop)) = r.fail_nth_sync {
                r.fail_nth_sync = (n > 1).then_some((n - 1, drop));
                if n == 1 {
                    once = Some(drop);
                }
            }
            if once == Some(true) || (r.fail_syncs && r.drop_failed_syncs) {
                lock(&self.st.pending).clear();
            }
            if r.lost || r.fail_syncs || once.is_some() {
                self.st.injected.fetch_add(1, Ordering::Relaxed);
                return Err(injected("sync", &self.st.name, 0, 0, r.errno));
            }
        }
        st.events += 1;
        if st.filter.is_none() && st.crash_at == Some(st.events) {
            self.faults.cut(&mut st);
            return Err(io::Error::other(format!(
                "{}: power lost during a sync (event {})",
                self.st.name, st.events
            )));
        }
        // Applied with the write cache locked (see `read_at`); a failing device write drops
        // the rest, as before.
        let mut pending = lock(&self.st.pending);
        for (off, data) in pending.drain(..) {
            self.st.inner.write_at(&data, off)?;
        }
        drop(pending);
        self.st.inner.sync()
    }
}
