//! Shared test helpers: files with known contents, a crash-simulating device, a reference
//! model of what each byte may read back.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tiercache_engine::Mode;
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions, OpenReport};

pub const VOL: u64 = 1 << 20;

/// The backing device's initial byte at `i`.
pub fn initial(i: u64) -> u8 {
    (i as u8) ^ ((i >> 8) as u8).wrapping_mul(7)
}

pub struct Files {
    pub dir: tempfile::TempDir,
    pub cache: PathBuf,
    pub backing: PathBuf,
}

/// A backing file of `VOL` bytes with known contents and a cache file holding `lines` lines.
pub fn files(lines: u64, line_size: u64) -> Files {
    files_with(lines, line_size, false)
}

/// A temporary directory on tmpfs when there is one (the tests sync often and need not wear a
/// disk for it), else in the default temporary directory.
pub fn tmp() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// [`files`], with room for the data checksum region when `sums` (`--data-checksums`).
pub fn files_with(lines: u64, line_size: u64, sums: bool) -> Files {
    let dir = tmp();
    let backing = dir.path().join("backing.img");
    let data: Vec<u8> = (0..VOL).map(initial).collect();
    std::fs::write(&backing, data).unwrap();
    let cache = dir.path().join("cache.img");
    let bytes =
        tiercache_server::Superblock::data_offset_with(lines, line_size, sums) + lines * line_size;
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    Files {
        dir,
        cache,
        backing,
    }
}

/// A backing file of `VOL` bytes with known contents and a log-layout cache file on which
/// at least `segments` segments of `segment_size` bytes (lines of 4 KiB) fit.
pub fn log_cache_files(segments: u64, segment_size: u64) -> Files {
    let f = files(1, 4096);
    let mut bytes = 1 << 20;
    while tiercache_server::log_format::LogSuperblock::plan(bytes, 4096, segment_size, None)
        .map_or(0, |p| p.0)
        < segments
    {
        bytes += segment_size;
    }
    std::fs::File::create(&f.cache)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    f
}

pub fn format(f: &Files, mode: Mode, line_size: u64) {
    format_with(f, mode, line_size, false)
}

/// [`format`], with data checksums when `sums`.
pub fn format_with(f: &Files, mode: Mode, line_size: u64, sums: bool) {
    let cache = FileDev::open(&f.cache).unwrap();
    let opts = FormatOptions {
        line_size,
        mode,
        data_checksums: sums,
        ..Default::default()
    };
    tiercache_server::format(&cache, VOL, &opts).unwrap();
}

pub fn open(f: &Files, mode: Option<Mode>) -> (CacheVolume, OpenReport) {
    CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
        &OpenOptions {
            mode,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A device that keeps writes since the last sync in memory; `crash` applies a random subset
/// of them (each 512-byte sector of each write independently, as a torn write would) and
/// drops the rest, as a power loss might.
pub struct CrashDev {
    inner: FileDev,
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl CrashDev {
    pub fn open(p: &Path) -> Arc<CrashDev> {
        Arc::new(CrashDev {
            inner: FileDev::open(p).unwrap(),
            pending: Mutex::new(Vec::new()),
        })
    }

    pub fn crash(&self, rng: &mut ChaCha8Rng) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap());
        for (off, data) in pending {
            for (i, c) in data.chunks(512).enumerate() {
                if rng.gen_bool(0.5) {
                    self.inner.write_at(c, off + i as u64 * 512).unwrap();
                }
            }
        }
    }
}

pub struct Shared(pub Arc<CrashDev>);

impl BlockDev for Shared {
    fn size(&self) -> u64 {
        self.0.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.inner.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        for (o, d) in self.0.pending.lock().unwrap().iter() {
            let (a, b) = ((*o).max(offset), (o + d.len() as u64).min(end));
            if a < b {
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&d[(a - o) as usize..(b - o) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let n = self.size().saturating_sub(offset).min(data.len() as u64) as usize;
        self.0
            .pending
            .lock()
            .unwrap()
            .push((offset, data[..n].to_vec()));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let pending = std::mem::take(&mut *self.0.pending.lock().unwrap());
        for (off, data) in pending {
            self.0.inner.write_at(&data, off)?;
        }
        Ok(())
    }
}

/// What each byte may read back: the value it must have now (`None` after a trim), and, for
/// crashes, the values it may have after one (the durable value and anything written since).
#[derive(Clone)]
pub struct Model {
    pub now: Vec<Option<u8>>,
    pub durable: Vec<Option<u8>>,
    pub since: Vec<Vec<u8>>,
}

impl Model {
    pub fn new(base: u64, len: u64) -> Model {
        let now: Vec<Option<u8>> = (base..base + len).map(|i| Some(initial(i))).collect();
        Model {
            durable: now.clone(),
            since: vec![Vec::new(); len as usize],
            now,
        }
    }

    pub fn write(&mut self, at: usize, data: &[u8], fua: bool) {
        for (k, &b) in data.iter().enumerate() {
            self.now[at + k] = Some(b);
            if fua {
                self.durable[at + k] = Some(b);
                self.since[at + k].clear();
            } else if self.durable[at + k].is_some() && self.since[at + k].len() < 64 {
                self.since[at + k].push(b);
            } else {
                self.durable[at + k] = None;
            }
        }
    }

    pub fn trim(&mut self, at: usize, len: usize) {
        for k in at..at + len {
            self.now[k] = None;
            self.durable[k] = None;
        }
    }

    pub fn flush(&mut self) {
        self.durable.clone_from(&self.now);
        for s in &mut self.since {
            s.clear();
        }
    }

    /// Reads `vol` from byte 0 over the model's length and checks it now (a model of
    /// `Model::new(0, len)`: model offsets are volume offsets).
    pub fn check_volume(&self, vol: &CacheVolume, what: &str) {
        let mut buf = vec![0u8; self.now.len()];
        tiercache_nbd::Export::read(vol, 0, &mut buf).unwrap();
        self.check_now(0, &buf, what);
    }

    /// Panics naming the first byte of `got` (read at model offset `at`) that is wrong now.
    pub fn check_now(&self, at: usize, got: &[u8], what: &str) {
        for (k, &g) in got.iter().enumerate() {
            if let Some(w) = self.now[at + k] {
                assert_eq!(g, w, "{what}: byte {} reads {g:#x}, want {w:#x}", at + k);
            }
        }
    }

    /// After a crash: each byte is its durable value or one written since.
    pub fn check_after_crash(&self, at: usize, got: &[u8], what: &str) {
        for (k, &g) in got.iter().enumerate() {
            let i = at + k;
            if let Some(d) = self.durable[i] {
                assert!(
                    g == d || self.since[i].contains(&g),
                    "{what}: byte {i} reads {g:#x} after the crash; durable {d:#x}, written since {:x?}",
                    self.since[i]
                );
            }
        }
    }
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A random request inside `[0, len)`: (kind 0 read / 1 write / 2 trim / 3 flush, offset, length, fua).
pub fn random_op(rng: &mut ChaCha8Rng, len: u64) -> (u8, u64, u64, bool) {
    let n = match rng.gen_range(0..6) {
        0 => rng.gen_range(1..700),
        1 => 512 * rng.gen_range(1..9),
        2 | 3 => 4096,
        4 => 4096 * rng.gen_range(2..5),
        _ => rng.gen_range(1..20_000),
    }
    .min(len);
    let mut off = rng.gen_range(0..=len - n);
    if rng.gen_bool(0.5) {
        off &= !511;
    }
    let kind = match rng.gen_range(0..100) {
        0..=44 => 0,
        45..=91 => 1,
        92..=95 => 2,
        _ => 3,
    };
    (kind, off, n, kind == 1 && rng.gen_bool(0.08))
}

/// Crash-point budget: `TIERCACHE_CRASH_POINTS=N`, else `long` with `TIERCACHE_CRASH_LONG=1`,
/// else `default`.
pub fn crash_budget(default: u64, long: u64) -> u64 {
    if let Ok(n) = std::env::var("TIERCACHE_CRASH_POINTS") {
        return n.parse().expect("TIERCACHE_CRASH_POINTS: a number");
    }
    if std::env::var("TIERCACHE_CRASH_LONG").is_ok_and(|v| v != "0") {
        long
    } else {
        default
    }
}

/// Drives a crash-point sweep for one mode. `run(seed, crash)` runs a seeded workload, with
/// the power cut at `crash = Some((meta, n))` (the nth event, or the nth metadata/journal
/// write when `meta`), and returns the workload's (events, metadata writes).
/// `TIERCACHE_CRASH_ONLY=mode:seed:N` (or `metaN`) reruns one point; otherwise `points` of
/// them, one in each stratum of a seed's events, at most `per_seed` per seed, over successive
/// seeds from `seed0` (`salt` varies the draws between harnesses).
pub fn crash_sweep(
    mode: Mode,
    points: u64,
    meta: bool,
    seed0: u64,
    per_seed: u64,
    salt: u64,
    mut run: impl FnMut(u64, Option<(bool, u64)>) -> (u64, u64),
) {
    if let Ok(only) = std::env::var("TIERCACHE_CRASH_ONLY") {
        let p: Vec<&str> = only.split(':').collect();
        if p[0] == mode.as_str() && p[2].starts_with("meta") == meta {
            let seed = p[1].parse().unwrap();
            let c = match p[2].strip_prefix("meta") {
                Some(n) => (true, n.parse().unwrap()),
                None => (false, p[2].parse().unwrap()),
            };
            run(seed, Some(c));
        }
        return;
    }
    let mut seed = seed0;
    let mut left = points;
    while left > 0 {
        let (events, meta_writes) = run(seed, None);
        let total = if meta { meta_writes } else { events };
        let here = left.min(per_seed).min(total + 1);
        let mut r = rng(seed ^ salt);
        for k in 0..here {
            // One point in each of `here` strata of 1..=total+1 (total+1: after the last event).
            let lo = 1 + k * (total + 1) / here;
            let hi = (1 + (k + 1) * (total + 1) / here).max(lo + 1);
            run(seed, Some((meta, r.gen_range(lo..hi))));
        }
        left -= here;
        seed += 1;
    }
}

/// A `kill -9` at an exact point: devices wrapped by one `Gate` pass everything through
/// (no volatile cache: a killed process's completed writes stay in the page cache) until the
/// armed write, which lands (`apply`) or not; from then on every call on every gated device
/// fails, as if the process were gone.
pub struct Gate {
    dead: std::sync::atomic::AtomicBool,
    /// (device name, byte range, apply the matching write) of the armed kill.
    armed: Mutex<Option<(String, std::ops::Range<u64>, bool)>>,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate {
            dead: Default::default(),
            armed: Mutex::new(None),
        })
    }

    /// The process dies at the next write to `dev` overlapping `range`, after it landed
    /// when `apply`.
    pub fn kill_at_write(&self, dev: &str, range: std::ops::Range<u64>, apply: bool) {
        *self.armed.lock().unwrap() = Some((dev.to_string(), range, apply));
    }

    /// The process dies now.
    pub fn kill(&self) {
        self.dead.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn dead(&self) -> bool {
        self.dead.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn wrap(self: &Arc<Self>, name: &str, path: &Path) -> Box<dyn BlockDev> {
        Box::new(Gated {
            gate: Arc::clone(self),
            name: name.to_string(),
            inner: FileDev::open(path).unwrap(),
        })
    }
}

struct Gated {
    gate: Arc<Gate>,
    name: String,
    inner: FileDev,
}

impl Gated {
    fn alive(&self) -> io::Result<()> {
        if self.gate.dead() {
            return Err(io::Error::other("killed"));
        }
        Ok(())
    }
}

impl BlockDev for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.alive()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.alive()?;
        let mut armed = self.gate.armed.lock().unwrap();
        let end = offset + data.len() as u64;
        if let Some((dev, r, apply)) = armed.as_ref() {
            if *dev == self.name && r.start < end && offset < r.end {
                if *apply {
                    self.inner.write_at(data, offset)?;
                }
                *armed = None;
                self.gate
                    .dead
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(io::Error::other("killed"));
            }
        }
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.alive()?;
        self.inner.sync()
    }
}

/// The crash harnesses' stability check: every byte read after the restart (`before`) reads
/// the same once its line was evicted (`after`).
pub fn assert_stable_after_eviction(
    what: &str,
    before: &[u8],
    after: &[u8],
    rep: &dyn std::fmt::Debug,
) {
    assert_eq!(before.len(), after.len(), "{what}: compare equal spans");
    if let Some(i) = (0..before.len()).find(|&i| after[i] != before[i]) {
        panic!(
            "{what}: byte {i} read {:#x} after the restart and {:#x} once its line was evicted ({rep:?})",
            before[i], after[i]
        );
    }
}

/// The checks after a sweep of backing-write errors (`crash_points.rs`, `log_crash_points.rs`):
/// every point ran, errors were injected, and write-back runs did degrade (else the sweep is
/// not biting). Skipped when one point is rerun (`TIERCACHE_CRASH_ONLY`).
pub fn assert_backing_sweep_bit(mode: Mode, ran: u64, planned: u64, injected: u64, degraded: u64) {
    if std::env::var("TIERCACHE_CRASH_ONLY").is_ok() {
        return;
    }
    assert!(ran >= planned, "{mode:?}: {ran} of {planned} points ran");
    assert!(injected > 0, "{mode:?}: no backing error injected");
    if mode == Mode::WriteBack {
        assert!(
            degraded > 0,
            "{mode:?}: never degraded: the test is not biting"
        );
    }
}

/// Line `k`'s bytes (4 KiB) in the tests that recognise a line by its content (a slot's
/// previous line, read at another line's place, is named).
pub fn line_pattern(k: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (k as u8) ^ (i as u8).rotate_left(3))
        .collect()
}

/// A write-back cache of 24 lines of 4 KiB whose backing lines `patterned` hold
/// [`line_pattern`] (the others their `initial` bytes).
pub fn patterned_files(patterned: std::ops::Range<u64>) -> Files {
    let f = files(24, 4096);
    format(&f, Mode::WriteBack, 4096);
    let b = FileDev::open(&f.backing).unwrap();
    for k in patterned {
        b.write_at(&line_pattern(k), k * 4096).unwrap();
    }
    f
}

/// Opens a [`patterned_files`] cache on the given devices (fault wrappers) with every slot
/// holding one of lines 40..64, clean and durably mapped (a FLUSH after the reads); no
/// unmapping ahead, cache errors tolerated (up to 1000).
pub fn open_full_of_clean_lines(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
) -> Arc<CacheVolume> {
    use tiercache_nbd::Export;
    let (v, _) = CacheVolume::open(cache, backing, &OpenOptions::default()).unwrap();
    let v = Arc::new(v);
    v.set_unmap_batch(0);
    v.set_max_cache_errors(1000);
    let mut b = vec![0u8; 4096];
    for k in 40..64 {
        v.read(k * 4096, &mut b).unwrap();
    }
    v.flush().unwrap();
    v
}

/// A pool's files: a backing file of `VOL` bytes (`f.backing`) and one member file per
/// entry of `lines` (`pool_files`), sized for that many lines of `POOL_LS` bytes.
pub struct PoolFiles {
    pub f: Files,
    pub members: Vec<PathBuf>,
}

pub const POOL_LS: u64 = 4096;

pub fn pool_files(lines: &[u64]) -> PoolFiles {
    let f = files(1, POOL_LS);
    let members = lines
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let p = f.dir.path().join(format!("m{i}.img"));
            let bytes =
                tiercache_server::format::Superblock::member_data_offset(n, POOL_LS) + n * POOL_LS;
            std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
            p
        })
        .collect();
    PoolFiles { f, members }
}

/// Runs op `i` (one of [`random_op`]) of a crash test on `vol`, keeping `m` current: a read is
/// checked against the model unless `power_lost()`, a write's bytes are `i ^ k ^ salt` (a
/// failed write may have landed in part: old or new after the crash). Whether it succeeded.
#[allow(dead_code)]
pub fn model_op(
    vol: &CacheVolume,
    m: &mut Model,
    (kind, off, len, fua): (u8, u64, u64, bool),
    i: u32,
    salt: u8,
    power_lost: &dyn Fn() -> bool,
    what: &str,
) -> bool {
    use tiercache_nbd::Export;
    match kind {
        0 => {
            let mut buf = vec![0u8; len as usize];
            let ok = vol.read(off, &mut buf).is_ok();
            if ok && !power_lost() {
                m.check_now(off as usize, &buf, &format!("{what}: op {i} read"));
            }
            ok
        }
        1 | 2 => {
            let data: Vec<u8> = (0..len).map(|k| (i as u8) ^ (k as u8) ^ salt).collect();
            let ok = vol.write(off, &data, fua).is_ok();
            m.write(off as usize, &data, fua && ok);
            ok
        }
        _ => {
            let ok = vol.flush().is_ok();
            if ok {
                m.flush();
            }
            ok
        }
    }
}
