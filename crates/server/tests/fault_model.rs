//! A randomized, model-based fault checker for both layouts (trust11 item 1).
//!
//! Each seed picks a layout (direct, log), a mode (write-through, write-back, and for the
//! direct layout write-around), and runs a short random sequence of 512-byte-sector writes,
//! reads, trims, FLUSHes, FUA writes, `ctl flush`es and background retries over two
//! [`Faults`]-wrapped volatile devices (cache and backing: writes sit in a write cache until
//! synced), injecting errors by seeded probability: EIO bursts on reads and writes of byte
//! ranges, ENOSPC on backing writes, the nth write failing, a sync failing once and dropping
//! the unsynced writes (Linux after a writeback error). Now and then the volume restarts:
//! clean (shutdown, the process exits, page cache kept) or a power cut (unsynced writes torn
//! sector by sector). A failed cache is checked on the backing file, formatted again, reopened.
//!
//! Every sector written carries (sector index, version, crc32c), so a read names exactly what
//! it returned: a version, another sector's data (misdirected), or garbage. The model keeps,
//! per sector, the versions a read may return now (the last acknowledged write; also the
//! written one after a failed write; anything after a trim) and after a crash (the value at
//! the last successful FLUSH, `ctl flush` or FUA write covering it, and every write since).
//! A read may fail only where the volume reported a failure: its own backing read failed,
//! or the range is in `lost_dirty_ranges`. A write or FLUSH may fail only while the backing
//! device fails or the volume is degraded (or, FLUSH, reports lost data). At the end faults
//! are healed, the volume is shut down and reopened, and every sector is read.
//!
//! Settings must take effect (`ctl mode`, `ctl set`: [`Run::check_effects`]), and a mode
//! switch that makes everything durable is a FLUSH to the model (sometimes followed at once
//! by a power cut). [`concurrent_clients_see_only_linearisable_values`] drives one volume
//! from several client threads at once.
//!
//! `TIERCACHE_FAULT_MODEL_SEEDS=N` (default 600), `TIERCACHE_FAULT_SOAK=1` (4000 seeds of
//! 3x the ops), `TIERCACHE_FAULT_MODEL_SEED=N` reruns one seed and prints its op log,
//! `TIERCACHE_FAULT_MODEL_THREADS=N` runs seeds on N threads (default: up to 2).

mod common;

use common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::live::{open_volume, Background, LiveVolume, Opened, VolumeOpenOptions};
use tiercache_server::{
    format_log, CacheVolume, FileDev, FormatOptions, LogFormatOptions, LogOpenOptions, LogVolume,
    OpenOptions,
};

const S: u64 = 512;
/// The part of the volume the workload touches (the rest is read at the end).
const HOT: u64 = 384 << 10;
const LS: u64 = 4096;
const SEG: u64 = 4 * LS;
/// The model's unit: every 64 bytes carry their own (index, version, crc32c), so writes,
/// write-zeroes and reads at any 64-byte offset (sub-sector, unaligned) are checked exactly.
const U: u64 = 64;
/// Version bit of position-independent data (the same bytes in every line written with that
/// version, for dedup): a unit names only its place in the line, `SHARED | (unit % 64)`.
const SHARED: u64 = 1 << 62;

/// Units `u0..u0 + n` at version `ver` (version 0: the backing device's initial contents),
/// in one buffer.
fn units(u0: u64, n: u64, ver: u64) -> Vec<u8> {
    let mut d = vec![0u8; (n * U) as usize];
    for (k, b) in d.chunks_mut(U as usize).enumerate() {
        encode_unit_into(u0 + k as u64, ver, b);
    }
    d
}

/// The name unit `u` carries at version `ver`.
fn unit_id(u: u64, ver: u64) -> u64 {
    if ver & SHARED != 0 {
        SHARED | (u % (LS / U))
    } else {
        u
    }
}

/// Unit `u` at version `ver` into `b` (64 bytes; no allocation: the initial backing file is
/// 16,384 units per seed).
fn encode_unit_into(u: u64, ver: u64, b: &mut [u8]) {
    let id = unit_id(u, ver);
    b[0..8].copy_from_slice(&id.to_le_bytes());
    b[8..16].copy_from_slice(&ver.to_le_bytes());
    if ver.is_multiple_of(3) {
        // Compressible.
        b[20..].fill((ver as u8) ^ 0x5a);
    } else {
        let mut x =
            id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ver.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        for c in b[20..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = c.len();
            c.copy_from_slice(&x.to_le_bytes()[..n]);
        }
    }
    let crc = sum(b);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
}

fn sum(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[0..16]), &b[20..])
}

/// What a sector read back.
#[derive(Debug, PartialEq)]
enum Got {
    Ver(u64),
    /// A valid sector of another index: misdirected.
    Other(u64, u64),
    Garbage,
    /// All zeroes (write-zeroes).
    Zero,
    /// Valid units of this sector, not all at one version (sub-sector writes).
    Mixed,
}

fn decode(b: &[u8]) -> (u64, Got) {
    let idx = u64::from_le_bytes(b[0..8].try_into().unwrap());
    let ver = u64::from_le_bytes(b[8..16].try_into().unwrap());
    let crc = u32::from_le_bytes(b[16..20].try_into().unwrap());
    if crc == sum(b) {
        (idx, Got::Ver(ver))
    } else {
        (idx, Got::Garbage)
    }
}

/// What the 512 bytes `b` of sector `idx` hold: one version, zeroes, or the first wrong unit.
fn got_at(b: &[u8], idx: u64) -> Got {
    let units: Vec<Got> = b
        .chunks(U as usize)
        .enumerate()
        .map(|(k, c)| got_unit(c, idx * (S / U) + k as u64))
        .collect();
    if let Some(g) = units
        .iter()
        .find(|g| matches!(g, Got::Garbage | Got::Other(..)))
    {
        return match g {
            Got::Other(i, v) => Got::Other(*i, *v),
            _ => Got::Garbage,
        };
    }
    if units.windows(2).all(|w| w[0] == w[1]) {
        return units.into_iter().next().unwrap_or(Got::Garbage);
    }
    Got::Mixed
}

/// What the 64 bytes `b` of unit `u` hold.
fn got_unit(b: &[u8], u: u64) -> Got {
    if b.iter().all(|&x| x == 0) {
        return Got::Zero;
    }
    match decode(b) {
        (i, Got::Ver(v)) if i == unit_id(u, v) => Got::Ver(v),
        (i, Got::Ver(v)) => Got::Other(i, v),
        _ => Got::Garbage,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    V(u64),
    /// Unspecified (trimmed): anything.
    Any,
    /// Zeroes (write-zeroes, with or without "may trim").
    Zero,
}

/// The values a unit may hold: one (nearly always: no allocation) or several (after a failed
/// write, a write not yet durable, a crash). Shown as a list.
#[derive(Clone, PartialEq)]
enum Vals {
    One(Val),
    Many(Vec<Val>),
}

impl Vals {
    fn as_slice(&self) -> &[Val] {
        match self {
            Vals::One(v) => std::slice::from_ref(v),
            Vals::Many(v) => v,
        }
    }
    fn contains(&self, x: &Val) -> bool {
        self.as_slice().contains(x)
    }
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn add(&mut self, x: Val) {
        match self {
            Vals::One(v) if *v == x => {}
            Vals::One(v) => *self = Vals::Many(vec![*v, x]),
            Vals::Many(v) => {
                if !v.contains(&x) {
                    v.push(x);
                }
            }
        }
    }
}

impl std::fmt::Debug for Vals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

#[derive(Clone, Debug)]
struct Sec {
    now: Vals,
    durable: Vals,
}

/// Per 64-byte unit, what a read may return now and after a crash. Only the units whose two
/// sets differ (written since the last FLUSH, or pinned by a read after a crash) are
/// `touched`: FLUSH and crash visit those alone (a unit not touched has `now == durable`).
struct Model {
    secs: Vec<Sec>,
    touched: Vec<u32>,
    is_touched: Vec<bool>,
}

impl Model {
    fn new() -> Model {
        let n = (VOL / U) as usize;
        Model {
            secs: vec![
                Sec {
                    now: Vals::One(Val::V(0)),
                    durable: Vals::One(Val::V(0)),
                };
                n
            ],
            touched: Vec::new(),
            is_touched: vec![false; n],
        }
    }
    fn touch(&mut self, u: u64) {
        if !self.is_touched[u as usize] {
            self.is_touched[u as usize] = true;
            self.touched.push(u as u32);
        }
    }
    /// Unit `u` now and after a crash: `x` alone (trimmed, or handed to the backing device's
    /// contents after a cache failure).
    fn reset(&mut self, u: u64, x: Val) {
        let sec = &mut self.secs[u as usize];
        sec.now = Vals::One(x);
        sec.durable = Vals::One(x);
    }
    /// Sector `s` written at `ver` (`ok`: acknowledged).
    fn write(&mut self, s: u64, ver: u64, ok: bool, fua: bool) {
        for u in s * (S / U)..(s + 1) * (S / U) {
            self.set(u, Val::V(ver), ok, fua);
        }
    }
    /// Unit `u` written with `x` (a version or zeroes): an acknowledged write is what reads
    /// return; one that failed may or may not have landed; without FUA a crash may keep the
    /// unit's older values.
    fn set(&mut self, u: u64, x: Val, ok: bool, fua: bool) {
        let sec = &mut self.secs[u as usize];
        if ok {
            sec.now = Vals::One(x);
            if fua {
                sec.durable = Vals::One(x);
            } else {
                sec.durable.add(x);
            }
        } else {
            sec.now.add(x);
            sec.durable.add(x);
        }
        self.touch(u);
    }
    /// Sector `s` trimmed: anything from now on.
    fn trim(&mut self, s: u64) {
        for u in s * (S / U)..(s + 1) * (S / U) {
            self.reset(u, Val::Any);
        }
    }
    /// A FLUSH (or `ctl flush`, or a clean shutdown) succeeded: durable now, except the
    /// sectors the volume reports lost (what survives there is whatever did).
    fn flushed(&mut self, lost: &[(u64, u64)]) {
        let touched = std::mem::take(&mut self.touched);
        for u in touched {
            let s = &mut self.secs[u as usize];
            let at = u as u64 * U;
            if lost.iter().any(|&(a, b)| a < at + U && at < b) {
                for v in s.now.as_slice().to_vec() {
                    s.durable.add(v);
                }
            } else {
                s.durable.clone_from(&s.now);
            }
            if s.durable == s.now {
                self.is_touched[u as usize] = false;
            } else {
                self.touched.push(u);
            }
        }
    }
    /// After a power cut: a sector may be any value it could have kept.
    fn crashed(&mut self) {
        for u in std::mem::take(&mut self.touched) {
            let s = &mut self.secs[u as usize];
            s.now.clone_from(&s.durable);
            self.is_touched[u as usize] = false;
        }
    }
    /// Whether the 512 bytes `b` of sector `s` may be read now (each unit: [`Model::check_unit`]).
    fn check(&mut self, s: u64, b: &[u8]) -> Result<(), String> {
        for (k, c) in b.chunks(U as usize).enumerate() {
            self.check_unit(s * (S / U) + k as u64, c)?;
        }
        Ok(())
    }
    /// Whether unit `s` may read `b` now; on success after a crash the unit is pinned to
    /// what it read (it must be stable from then on).
    fn check_unit(&mut self, s: u64, b: &[u8]) -> Result<(), String> {
        let sec = &mut self.secs[s as usize];
        if sec.now.contains(&Val::Any) {
            return Ok(());
        }
        // Most units read are untouched (version 0 only): a byte compare, no decoding.
        let at = (s * U) as usize;
        if sec.now == Vals::One(Val::V(0)) && b == &initial_backing()[at..at + U as usize] {
            return Ok(());
        }
        let g = got_unit(b, s);
        let as_val = match g {
            Got::Ver(v) => Some(Val::V(v)),
            Got::Zero => Some(Val::Zero),
            _ => None,
        };
        match as_val {
            Some(x) if sec.now.contains(&x) => {
                if sec.now.len() > 1 {
                    sec.now = Vals::One(x);
                    self.touch(s);
                }
                Ok(())
            }
            // A torn sector is fine only when several values were possible (a crash), and
            // then it is stable like any other.
            _ => Err(format!(
                "unit {s} (byte {}, sector {}) read {g:?}, may read {:?} (after a crash {:?})",
                s * U,
                s * U / S,
                sec.now,
                sec.durable
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Direct,
    Log,
}

struct Cfg {
    layout: Layout,
    mode: Mode,
    sums: bool,
    /// Direct layout: `--validity` (line: every fill reads the whole line).
    validity: tiercache_engine::Validity,
    max_cache_errors: u64,
    /// Per-op probability of injecting a fault (varies per seed: some seeds are calm).
    p_fault: f64,
    ops: usize,
    /// Log layout: compression and the dedup index share (direct: unused).
    compression: Compression,
    dedup: f64,
    /// Log layout: reclamation settings (trim, free reserve, reinsert hits;
    /// `LogVolume::set_reclaim`) set at every open, `None` = the defaults.
    reclaim: Option<(bool, f64, u16)>,
}

/// The volume (in an `Arc`: the background thread, [`Rig::start_bg`], shares it).
enum Vol {
    D(Arc<CacheVolume>),
    L(Arc<LogVolume>),
}

impl Vol {
    fn live(&self) -> &dyn LiveVolume {
        match self {
            Vol::D(v) => &**v,
            Vol::L(v) => &**v,
        }
    }
    fn lost(&self) -> Vec<(u64, u64)> {
        self.live().live_stats().volume.lost_dirty_ranges
    }
    fn background(&self) -> Result<(), String> {
        match self {
            Vol::D(v) => v.clean_if_needed().map(|_| ()).map_err(|e| e.to_string()),
            Vol::L(v) => {
                v.retry_write_backs();
                Ok(())
            }
        }
    }
}

struct Rig {
    dir: tempfile::TempDir,
    cache: std::path::PathBuf,
    backing: std::path::PathBuf,
    state: std::path::PathBuf,
    cache_len: u64,
    faults: Arc<Faults>,
    ch: FaultHandle,
    bh: FaultHandle,
    vol: Option<Vol>,
    /// The volume's own background thread, when running ([`Rig::start_bg`]).
    bg: Option<Background>,
}

/// The backing device's initial contents (every unit at version 0), made once per process.
fn initial_backing() -> &'static [u8] {
    static D: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let mut d = vec![0u8; VOL as usize];
        for (u, b) in d.chunks_mut(U as usize).enumerate() {
            encode_unit_into(u as u64, 0, b);
        }
        d
    })
}

fn write_initial_backing(p: &Path) {
    std::fs::write(p, initial_backing()).unwrap();
}

fn format_cache(cfg: &Cfg, cache: &Path) {
    let dev = FileDev::open(cache).unwrap();
    match cfg.layout {
        Layout::Direct => {
            let o = FormatOptions {
                line_size: LS,
                mode: cfg.mode,
                data_checksums: cfg.sums,
                validity: cfg.validity,
                ..Default::default()
            };
            tiercache_server::format(&dev, VOL, &o).unwrap();
        }
        Layout::Log => {
            let o = LogFormatOptions {
                line_size: LS,
                segment_size: SEG,
                compression: cfg.compression,
                dedup_ratio: cfg.dedup,
                picker: "lru".into(),
                mode: cfg.mode,
                journal_records: Some(300),
            };
            format_log(&dev, VOL, &o).unwrap();
        }
    }
}

impl Rig {
    fn new(cfg: &Cfg, seed: u64) -> Rig {
        // The files are made here, not by `files_with` / `log_cache_files`: those fill the
        // backing file with `initial` bytes this checker overwrites at once (a tenth of the
        // default run's time went to that).
        let dir = tmp();
        let cache = dir.path().join("cache.img");
        let backing = dir.path().join("backing.img");
        let bytes = match cfg.layout {
            Layout::Direct => {
                tiercache_server::Superblock::data_offset_with(32, LS, cfg.sums) + 32 * LS
            }
            Layout::Log => {
                // Exactly 12 segments of four lines (48 lines for a 384 KiB hot region):
                // reclamations must write dirty lines back all the time.
                let mut bytes = SEG;
                while tiercache_server::log_format::LogSuperblock::plan(bytes, LS, SEG, Some(300))
                    .map_or(0, |p| p.0)
                    < 12
                {
                    bytes += SEG;
                }
                bytes
            }
        };
        std::fs::File::create(&cache)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        write_initial_backing(&backing);
        format_cache(cfg, &cache);
        let state = tiercache_server::state_file::beside(&cache);
        let faults = Faults::new(seed);
        let (_, ch) = faults.wrap("unused", Box::new(FileDev::open(&cache).unwrap()), false);
        let bh = ch.clone();
        let cache_len = std::fs::metadata(&cache).unwrap().len();
        let mut r = Rig {
            dir,
            cache_len,
            cache,
            backing,
            state,
            faults,
            ch,
            bh,
            vol: None,
            bg: None,
        };
        r.open(cfg, seed).unwrap();
        r
    }

    /// Opens the volume on freshly wrapped devices (no injected faults).
    fn open(&mut self, cfg: &Cfg, seed: u64) -> Result<(), String> {
        self.faults = Faults::new(seed);
        let (c, ch) =
            self.faults
                .wrap("cache", Box::new(FileDev::open(&self.cache).unwrap()), true);
        let (b, bh) = self.faults.wrap(
            "backing",
            Box::new(FileDev::open(&self.backing).unwrap()),
            true,
        );
        self.ch = ch;
        self.bh = bh;
        let o = VolumeOpenOptions {
            direct: OpenOptions {
                state_path: Some(self.state.clone()),
                ..Default::default()
            },
            log: LogOpenOptions {
                state_path: Some(self.state.clone()),
                ..Default::default()
            },
        };
        let v = match open_volume(Box::new(c), Box::new(b), &o).map_err(|e| e.to_string())? {
            Opened::Direct(v, _) => Vol::D(Arc::from(v)),
            Opened::Log(v, _) => {
                if let Some((trim, reserve, hits)) = cfg.reclaim {
                    v.set_reclaim(trim, reserve, hits).unwrap();
                }
                Vol::L(Arc::from(v))
            }
        };
        v.live().set_max_cache_errors(cfg.max_cache_errors);
        self.vol = Some(v);
        Ok(())
    }

    fn vol(&self) -> &Vol {
        self.vol.as_ref().unwrap()
    }

    /// Starts the volume's own background thread (`serve` does: the direct layout's cleaner,
    /// the log layout's write-back retries).
    fn start_bg(&mut self) {
        let bg = match self.vol() {
            Vol::D(v) => LiveVolume::start_background(Arc::clone(v)),
            Vol::L(v) => LiveVolume::start_background(Arc::clone(v)),
        };
        self.bg = Some(bg);
    }

    /// Stops and joins the background thread (before a power cut or a shutdown: its pass
    /// in flight ends on live devices).
    fn stop_bg(&mut self) {
        if let Some(bg) = self.bg.take() {
            if let Some(Vol::D(v)) = &self.vol {
                v.stop_cleaner();
            }
            bg.finish();
        }
    }
}

/// One seed's run: `Err` names the first violation.
struct Run {
    cfg: Cfg,
    seed: u64,
    rng: ChaCha8Rng,
    m: Model,
    rig: Rig,
    log: Vec<String>,
    ver: u64,
    /// Whether errors are being injected into the backing device (or were, at the last op).
    backing_faulty: bool,
    injected: u64,
    failed_noted: bool,
    /// Ranges reported lost since the last good flush or restart (also those a later write
    /// took off the live list: until a flush makes that write durable, a crash may drop it
    /// and bring back whatever the backing device held: gap `lost-forgotten`).
    lost_seen: Vec<(u64, u64)>,
    /// What the checker knows to be in force (`None`: unknown, after a `ctl mode` / `ctl set`
    /// that failed): checked for its effect after every op ([`Run::check_effects`]).
    rules: Rules,
    /// Counters after the previous op (`None` after a restart: they start again).
    prev: Option<Snap>,
    /// The op's client read or write, if it was one: (write, bytes).
    last_io: Option<(bool, u64)>,
}

/// Settings whose effect the checker can observe.
#[derive(Clone, Copy, Debug)]
struct Rules {
    mode: Option<Mode>,
    /// `admission never`.
    never: Option<bool>,
    /// Sequential cutoff for reads and writes, bytes (0: off).
    cutoff: [Option<u64>; 2],
}

impl Rules {
    fn new(mode: Mode) -> Rules {
        Rules {
            mode: Some(mode),
            never: Some(false),
            cutoff: [Some(0), Some(0)],
        }
    }
}

/// How often each effect was checked (ops under pass-through, under write-through or
/// write-around, under `admission never`, reads or writes at or over the cutoff) and mode
/// switches credited as durability points (then: followed by a power cut): printed by the
/// default run, so a check that never runs shows.
static EFFECTS: [std::sync::atomic::AtomicU64; 6] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 6];

fn count(k: usize) {
    EFFECTS[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Counters `ctl stats` shows, after one op.
#[derive(Clone, Copy, Debug)]
struct Snap {
    insertions: u64,
    dirty: u64,
    cached: u64,
}

impl Run {
    fn note(&mut self, s: String) {
        if std::env::var("TIERCACHE_FAULT_MODEL_SEED").is_ok() {
            eprintln!("{s}");
        }
        self.log.push(s);
    }

    fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(60).collect();
        let mut m = format!(
            "seed {} ({:?} {:?}, data checksums {}, {} validity, max cache errors {}{}): {what}\nlast ops (newest first):\n",
            self.seed, self.cfg.layout, self.cfg.mode, self.cfg.sums, self.cfg.validity.as_str(), self.cfg.max_cache_errors,
            if self.cfg.layout == Layout::Log {
                format!(
                    ", {:?}, dedup {}, reclaim (trim, free reserve, reinsert hits) {:?}",
                    self.cfg.compression, self.cfg.dedup, self.cfg.reclaim
                )
            } else {
                String::new()
            }
        );
        for l in tail {
            m.push_str("  ");
            m.push_str(l);
            m.push('\n');
        }
        m.push_str(&format!(
            "rerun: TIERCACHE_FAULT_MODEL_SEED={}{} cargo test --release -p tiercache-server --test fault_model",
            self.seed,
            if self.cfg.ops > 150 { " TIERCACHE_FAULT_SOAK=1" } else { "" }
        ));
        m
    }

    /// Whether a failed write (or write-zeroes) of `off..off + len` has a cause the contract
    /// allows: a backing fault injected since `before`, a failing device, the degraded state,
    /// a lost range it touches (its other bytes cannot complete the line), or a FUA that is a
    /// FLUSH too, which fails when data was lost anywhere (soak seeds 2090, 3730).
    fn write_failure_explained(
        &self,
        before: u64,
        failing: bool,
        off: u64,
        len: u64,
        fua: bool,
    ) -> bool {
        self.rig.bh.injected() > before
            || failing
            || self.degraded()
            || self.lost_overlaps(off, off + len)
            || (fua && !self.rig.vol().lost().is_empty())
    }

    fn lost_overlaps(&self, a: u64, b: u64) -> bool {
        self.rig.vol().lost().iter().any(|&(x, y)| x < b && a < y)
    }

    fn degraded(&self) -> bool {
        let v = self.rig.vol().live().live_stats().volume;
        v.degraded
    }

    fn inject(&mut self) {
        let r = &mut self.rng;
        let hot_range = |r: &mut ChaCha8Rng| {
            let a = r.gen_range(0..HOT / S) * S;
            a..a + S * r.gen_range(1..24)
        };
        let k = r.gen_range(0..100);
        let what = match k {
            0..=19 => {
                let x = hot_range(r);
                self.rig.bh.fail_reads(x.clone());
                self.backing_faulty = true;
                format!("inject: backing reads fail {x:?}")
            }
            20..=39 => {
                let x = hot_range(r);
                self.rig.bh.fail_writes(x.clone());
                let enospc = r.gen_bool(0.3);
                if enospc {
                    self.rig.bh.fail_with_errno(libc_enospc());
                }
                self.backing_faulty = true;
                format!("inject: backing writes fail {x:?} enospc {enospc}")
            }
            40..=49 => {
                let n = r.gen_range(1..6);
                self.rig.bh.fail_nth_write(n, false);
                self.backing_faulty = true;
                format!("inject: backing write {n} from now fails once")
            }
            50..=64 => {
                // Known gap `log-failed-sync-drop`: the log layout passing through after its
                // cache failed forgets the writes a failed backing sync dropped.
                let drop = !(self.cfg.layout == Layout::Log
                    && self.failed_noted
                    && known("log-failed-sync-drop"));
                self.rig.bh.fail_next_sync(drop);
                self.backing_faulty = true;
                format!("inject: next backing sync fails once, dropping unsynced writes {drop}")
            }
            65..=74 => {
                self.rig.bh.fail_syncs();
                self.backing_faulty = true;
                "inject: backing syncs fail".into()
            }
            75..=84 => {
                let len = self.rig.cache_len;
                let a = r.gen_range(4096..len.max(4097));
                let x = a..a + r.gen_range(512..16384);
                self.rig.ch.fail_reads(x.clone());
                format!("inject: cache reads fail {x:?}")
            }
            85..=94 => {
                let len = self.rig.cache_len;
                let a = r.gen_range(4096..len.max(4097));
                let x = a..a + r.gen_range(512..16384);
                self.rig.ch.fail_writes(x.clone());
                format!("inject: cache writes fail {x:?}")
            }
            _ => {
                let drop = !known("cache-sync-drop");
                self.rig.ch.fail_next_sync(drop);
                format!("inject: next cache sync fails once, dropping unsynced writes {drop}")
            }
        };
        self.note(what);
    }

    fn heal(&mut self) {
        self.injected += self.rig.bh.injected() + self.rig.ch.injected();
        self.rig.bh.heal();
        self.rig.ch.heal();
        self.backing_faulty = false;
        self.note("heal".into());
    }

    fn read(&mut self, off: u64, len: u64, what: &str) -> Result<(), String> {
        let before = self.rig.bh.injected();
        let mut buf = vec![0u8; len as usize];
        let res = self.rig.vol().live().read(off, &mut buf);
        let backing_failed = self.rig.bh.injected() > before;
        match res {
            Ok(()) => {
                for k in 0..len / U {
                    let s = off / U + k;
                    let b = &buf[(k * U) as usize..((k + 1) * U) as usize];
                    if let Err(e) = self.m.check_unit(s, b) {
                        return Err(self.fail(format!("{what}: {e}")));
                    }
                }
                Ok(())
            }
            Err(e) => {
                // A read never needs a backing sync: the sync backoff's error is not an
                // excuse (before: seeds 188 and 548, a read over several lines whose plan
                // needed a slot reuse, failed fast with it).
                if backing_failed || self.lost_overlaps(off, off + len) {
                    self.note(format!("  read failed (allowed): {e}"));
                    Ok(())
                } else {
                    Err(self.fail(format!(
                        "{what}: read failed without a backing read error or lost data: {e}"
                    )))
                }
            }
        }
    }

    fn op(&mut self, i: usize) -> Result<(), String> {
        if self.rng.gen_bool(self.cfg.p_fault) {
            self.inject();
        }
        if self.rng.gen_bool(0.04) {
            self.heal();
        }
        if self.rng.gen_bool(0.2) {
            return self.op_extra(i);
        }
        let secs = match self.rng.gen_range(0..4) {
            0 => 1,
            1 => self.rng.gen_range(1..9),
            2 => 8,
            _ => self.rng.gen_range(1..33),
        };
        let mut s0 = self.rng.gen_range(0..HOT / S - secs);
        if self.rng.gen_bool(0.5) {
            s0 &= !7;
        }
        let (off, len) = (s0 * S, secs * S);
        let k = self.rng.gen_range(0..100);
        let failing = self.backing_faulty;
        match k {
            0..=39 => {
                self.note(format!("op {i}: read {off}+{len}"));
                self.last_io = Some((false, len));
                self.read(off, len, &format!("op {i} read {off}+{len}"))?;
            }
            40..=82 => {
                self.last_io = Some((true, len));
                let fua = self.rng.gen_bool(0.1);
                self.ver += 1;
                let ver = self.ver;
                let d = units(s0 * (S / U), secs * (S / U), ver);
                let before = self.rig.bh.injected();
                let res = self.rig.vol().live().write(off, &d, fua);
                let ok = res.is_ok();
                self.note(format!(
                    "op {i}: write {off}+{len} v{ver} fua {fua}: {}",
                    res.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
                ));
                for s in s0..s0 + secs {
                    self.m.write(s, ver, ok, fua);
                }
                if let Err(e) = res {
                    // Also: a partial-line write into a line reported lost (its other
                    // bytes cannot be read to complete the line) fails in the log layout.
                    // A FUA write is a FLUSH too: it fails when that lost data (soak seed
                    // 2090: a cache sync dropping dirty lines elsewhere).
                    let why = self.write_failure_explained(before, failing, off, len, fua);
                    if !why {
                        return Err(self.fail(format!(
                            "op {i}: write {off}+{len} failed without a backing fault: {e}"
                        )));
                    }
                }
            }
            83..=87 => {
                let res = self.rig.vol().live().trim(off, len);
                self.note(format!("op {i}: trim {off}+{len}: {res:?}"));
                for s in s0..s0 + secs {
                    self.m.trim(s);
                }
            }
            88..=94 => {
                let before = self.rig.bh.injected() + self.rig.ch.injected();
                let res = self.rig.vol().live().flush();
                self.note(format!("op {i}: flush: {res:?}"));
                match res {
                    Ok(()) => {
                        let lost = self.rig.vol().lost();
                        self.m.flushed(&lost);
                        self.lost_seen = lost;
                    }
                    Err(e) => {
                        let why = self.rig.bh.injected() + self.rig.ch.injected() > before
                            || failing
                            || self.degraded()
                            || !self.rig.vol().lost().is_empty();
                        if !why {
                            return Err(self.fail(format!("op {i}: flush failed: {e}")));
                        }
                    }
                }
            }
            95..=96 => {
                let res = self.rig.vol().live().flush_dirty();
                self.note(format!("op {i}: ctl flush: {res:?}"));
                if res.is_ok() {
                    let lost = self.rig.vol().lost();
                    self.m.flushed(&lost);
                    self.lost_seen = lost;
                }
            }
            97 => {
                let res = self.rig.vol().background();
                self.note(format!("op {i}: background retry: {res:?}"));
            }
            _ => self.restart(i, None)?,
        }
        Ok(())
    }

    /// Shuts `vol` down cleanly (the shutdown may fail the cache with a sync error and lose
    /// data), notes it as `what`, and exits the process keeping the page cache; a shutdown
    /// that succeeded makes everything but the lost ranges durable in the model. Returns the
    /// shutdown's result, whether the cache failed, and the ranges reported lost.
    fn clean_shutdown(
        &mut self,
        vol: Vol,
        what: &str,
    ) -> (std::io::Result<()>, bool, Vec<(u64, u64)>) {
        let res = vol.live().shutdown();
        let failed = vol.live().cache_failed();
        let lost = vol.lost();
        self.note(format!(
            "{what}: {res:?} (cache failed {failed}, lost {lost:?})"
        ));
        drop(vol);
        self.rig.faults.process_exit();
        if res.is_ok() {
            self.m.flushed(&lost);
            self.lost_seen.clone_from(&lost);
        }
        (res, failed, lost)
    }

    /// Clean restart or power cut (`crash`: which; else drawn), then reopen with no faults
    /// injected.
    fn restart(&mut self, i: usize, crash: Option<bool>) -> Result<(), String> {
        let crash = crash.unwrap_or_else(|| self.rng.gen_bool(0.5));
        self.prev = None;
        let vol = self.rig.vol.take().unwrap();
        let mut lost = vol.lost();
        self.injected += self.rig.bh.injected() + self.rig.ch.injected();
        let failed = if crash {
            let failed = vol.live().cache_failed();
            self.faults_cut();
            drop(vol);
            self.m.crashed();
            self.note(format!(
                "op {i}: power cut (cache failed {failed}, lost {lost:?})"
            ));
            failed
        } else {
            let (res, failed, l) = self.clean_shutdown(vol, &format!("op {i}: clean shutdown"));
            lost = l;
            if res.is_err() {
                self.m.crashed();
            }
            failed
        };
        self.backing_faulty = false;
        self.forget_lost(&lost);
        if failed {
            self.after_cache_failure(i, crash, &lost)?;
        }
        if let Err(e) = self.rig.open(&self.cfg, self.seed ^ (i as u64) << 20) {
            return Err(self.fail(format!("op {i}: reopen failed: {e}")));
        }
        Ok(())
    }

    /// Lost ranges must stay lost (reads fail) across a restart; a sector lost may also
    /// read what survived. With the known gap `lost-forgotten` skipped, the direct layout
    /// without data checksums and the log layout may serve anything there after a restart
    /// (in `lost`, or in `lost_seen`: rewritten since, but not flushed; soak seed 3756).
    fn forget_lost(&mut self, lost: &[(u64, u64)]) {
        // The log layout keeps no lost ranges across a restart at all (soak seed 655).
        let forgets = self.cfg.layout == Layout::Log || !self.cfg.sums;
        let any = forgets && known("lost-forgotten");
        let seen = std::mem::take(&mut self.lost_seen);
        for &(a, b) in lost.iter().chain(&seen) {
            for s in a / U..b.div_ceil(U) {
                let sec = &mut self.m.secs[s as usize];
                // Else unchanged: the newest acknowledged version or a failed read (the
                // range still reported lost) after a clean restart.
                if any {
                    sec.now = Vals::One(Val::Any);
                    sec.durable = Vals::One(Val::Any);
                }
            }
        }
    }

    fn faults_cut(&self) {
        self.rig.faults.power_cut();
    }

    /// The cache failed: the next start is refused (state file); the backing file holds
    /// what the volume may serve; `format --force` (a new cache) then serves it.
    fn after_cache_failure(
        &mut self,
        i: usize,
        crash: bool,
        lost: &[(u64, u64)],
    ) -> Result<(), String> {
        // Reported lost (now, or in the failure record the next start shows the operator:
        // a later unsynced write may have taken a range off the live list): the operator
        // formats the cache, the backing device's bytes serve.
        let recorded = tiercache_server::state_file::read(&self.rig.state)
            .ok()
            .flatten()
            .map(|st| st.lost)
            .unwrap_or_default();
        for &(a, b) in lost.iter().chain(&recorded) {
            for s in a / U..b.div_ceil(U) {
                self.m.reset(s, Val::Any);
            }
        }
        let o = VolumeOpenOptions {
            direct: OpenOptions {
                state_path: Some(self.rig.state.clone()),
                ..Default::default()
            },
            log: LogOpenOptions {
                state_path: Some(self.rig.state.clone()),
                ..Default::default()
            },
        };
        let c = Box::new(FileDev::open(&self.rig.cache).unwrap());
        let b = Box::new(FileDev::open(&self.rig.backing).unwrap());
        if open_volume(c, b, &o).is_ok() {
            return Err(self.fail(format!("op {i}: a failed cache was reopened")));
        }
        let data = std::fs::read(&self.rig.backing).unwrap();
        for s in 0..VOL / S {
            let b = &data[(s * S) as usize..((s + 1) * S) as usize];
            if let Err(e) = self.m.check(s, b) {
                let around: Vec<Got> = (s.saturating_sub(2)..(s + 3).min(VOL / S))
                    .map(|t| got_at(&data[(t * S) as usize..((t + 1) * S) as usize], t))
                    .collect();
                return Err(self.fail(format!(
                    "op {i}: backing file after the cache failed (crash {crash}; the state file records lost {recorded:?}): {e}; sectors {}.. hold {around:?}",
                    s.saturating_sub(2)
                )));
            }
        }
        let _ = std::fs::remove_file(&self.rig.state);
        format_cache(&self.cfg, &self.rig.cache);
        self.rules = Rules::new(self.cfg.mode);
        self.prev = None;
        self.note(format!("op {i}: cache formatted again after its failure"));
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.heal();
        // A last clean restart with nothing injected, then every sector.
        let vol = self.rig.vol.take().unwrap();
        let (res, failed, lost) = self.clean_shutdown(vol, "final shutdown");
        if res.is_err() {
            return Err(self.fail(format!("shutdown with no fault injected failed: {res:?}")));
        }
        self.forget_lost(&lost);
        if failed {
            self.after_cache_failure(usize::MAX, false, &lost)?;
        }
        if let Err(e) = self.rig.open(&self.cfg, self.seed ^ 0xfeed) {
            return Err(self.fail(format!("final reopen failed: {e}")));
        }
        let chunk = 64 << 10;
        for off in (0..VOL).step_by(chunk as usize) {
            self.read(off, chunk, &format!("final read {off}+{chunk}"))?;
        }
        Ok(())
    }
}

/// The operations added in session 12 (h-checker): what real clients and operators send
/// besides sector-aligned writes. What each allows a later read to return:
/// * sub-sector / unaligned write (64-byte granularity, any length): like a write, per unit;
///   the units of the same sectors outside the range keep their values;
/// * write-zeroes (with or without "may trim", FUA or not): zeroes, exactly like a write of
///   zeroes (a failed one: zeroes or the older value); never an error unless reported lost;
/// * a dedup-prone write: whole lines whose bytes are the same in every line written with
///   that version (a pool of four shared versions), so the log layout's dedup index maps
///   many lines to one extent; each unit still names its place in the line;
/// * `ctl mode` (direct: write-through, write-back, write-around, pass-through; log:
///   write-through, write-back, pass-through = detached): no value changes; it may fail only
///   while the backing device fails, the volume is degraded or failed, or data is lost;
/// * `ctl set` of each live setting (direct; the log layout must refuse all but `mode`).
impl Run {
    fn op_extra(&mut self, i: usize) -> Result<(), String> {
        let k = self.rng.gen_range(0..100);
        let units = HOT / U;
        match k {
            0..=29 => {
                let n = self.rng.gen_range(1..80);
                let u0 = self.rng.gen_range(0..units - n);
                let fua = self.rng.gen_bool(0.1);
                self.ver += 1;
                let ver = self.ver;
                self.write_units(i, u0, n, Val::V(ver), fua, None)
            }
            30..=49 => {
                let n = self.rng.gen_range(1..80);
                let u0 = self.rng.gen_range(0..units - n);
                let (off, len) = (u0 * U, n * U);
                self.note(format!("op {i}: read {off}+{len}"));
                self.last_io = Some((false, len));
                self.read(off, len, &format!("op {i} read {off}+{len}"))
            }
            50..=64 => {
                let n = match self.rng.gen_range(0..3) {
                    0 => self.rng.gen_range(1..80),
                    1 => (LS / U) * self.rng.gen_range(1..4),
                    _ => self.rng.gen_range(1..(32 << 10) / U),
                };
                let mut u0 = self.rng.gen_range(0..units - n);
                if self.rng.gen_bool(0.5) {
                    u0 -= u0 % (LS / U);
                }
                let fua = self.rng.gen_bool(0.2);
                let may_trim = self.rng.gen_bool(0.5);
                self.write_units(i, u0, n, Val::Zero, fua, Some(may_trim))
            }
            65..=74 => {
                let n = self.rng.gen_range(1..4) * (LS / U);
                let u0 = self.rng.gen_range(0..(units - n) / (LS / U)) * (LS / U);
                let ver = SHARED | self.rng.gen_range(1..5);
                let fua = self.rng.gen_bool(0.1);
                self.write_units(i, u0, n, Val::V(ver), fua, None)
            }
            75..=89 => self.switch_mode(i),
            _ => self.change_setting(i),
        }
    }

    /// Writes `x` (a version, or zeroes through write-zeroes when `zeroes` is `Some(may_trim)`)
    /// to units `u0..u0 + n`, and checks the result is allowed.
    fn write_units(
        &mut self,
        i: usize,
        u0: u64,
        n: u64,
        x: Val,
        fua: bool,
        zeroes: Option<bool>,
    ) -> Result<(), String> {
        let (off, len) = (u0 * U, n * U);
        if zeroes.is_none() {
            self.last_io = Some((true, len));
        }
        let failing = self.backing_faulty;
        let before = self.rig.bh.injected();
        let res = match (x, zeroes) {
            (Val::V(ver), None) => {
                let d = units(u0, n, ver);
                self.rig.vol().live().write(off, &d, fua)
            }
            (_, Some(may_trim)) => self.rig.vol().live().write_zeroes(off, len, fua, may_trim),
            _ => unreachable!(),
        };
        let ok = res.is_ok();
        let what = match (x, zeroes) {
            (Val::V(ver), _) => format!("write {off}+{len} v{ver} fua {fua}"),
            (_, t) => format!("zero {off}+{len} fua {fua} may_trim {}", t == Some(true)),
        };
        self.note(format!(
            "op {i}: {what}: {}",
            res.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
        ));
        for u in u0..u0 + n {
            self.m.set(u, x, ok, fua);
        }
        if let Err(e) = res {
            // FUA: a FLUSH too, which fails when it lost data (soak seeds 2090, 3730).
            let why = self.write_failure_explained(before, failing, off, len, fua);
            if !why {
                return Err(self.fail(format!(
                    "op {i}: {what} failed without a backing fault: {e}"
                )));
            }
        }
        Ok(())
    }

    /// `ctl mode` (or `ctl set mode`) to a mode the layout takes. A switch that succeeded is a
    /// durability point where the layout makes one (session 13 item 3): the direct layout
    /// writes back and flushes for every mode but write-back; the log layout commits (a
    /// FLUSH) at every change, writing back first when leaving write-back. A quarter of those
    /// are followed at once by a power cut.
    fn switch_mode(&mut self, i: usize) -> Result<(), String> {
        let modes: &[Mode] = match self.cfg.layout {
            Layout::Direct => &[
                Mode::WriteThrough,
                Mode::WriteBack,
                Mode::WriteAround,
                Mode::PassThrough,
            ],
            Layout::Log => &[Mode::WriteThrough, Mode::WriteBack, Mode::PassThrough],
        };
        let mode = modes[self.rng.gen_range(0..modes.len())];
        let by_set = self.rng.gen_bool(0.5);
        let failing = self.backing_faulty;
        let failed = self.rig.vol().live().cache_failed();
        let before = self.rig.bh.injected() + self.rig.ch.injected();
        let was = self.rules.mode;
        let res = if by_set {
            let r = self.rig.vol().live().set_setting("mode", mode.as_str());
            self.note(format!("op {i}: set mode {mode}: {r:?}"));
            r.map(|_| ()).map_err(std::io::Error::other)
        } else {
            let r = self.rig.vol().live().set_mode(mode);
            self.note(format!("op {i}: mode {mode}: {r:?}"));
            r
        };
        match res {
            Ok(()) => {
                if failed {
                    return Err(
                        self.fail(format!("op {i}: mode {mode} accepted by a failed cache"))
                    );
                }
                self.rules.mode = Some(mode);
                let durable = match self.cfg.layout {
                    Layout::Direct => mode != Mode::WriteBack,
                    Layout::Log => was.is_some_and(|w| w != mode),
                };
                if durable {
                    count(4);
                    let lost = self.rig.vol().lost();
                    self.m.flushed(&lost);
                    self.lost_seen = lost;
                    if self.rng.gen_bool(0.25) {
                        count(5);
                        self.note(format!("op {i}: power cut right after the mode switch"));
                        return self.restart(i, Some(true));
                    }
                }
            }
            Err(e) => {
                self.rules.mode = None;
                let why = failed
                    || self.rig.bh.injected() + self.rig.ch.injected() > before
                    || failing
                    || self.degraded()
                    || self.rig.vol().live().cache_failed()
                    || !self.rig.vol().lost().is_empty();
                if !why {
                    return Err(self.fail(format!("op {i}: mode {mode} failed: {e}")));
                }
            }
        }
        Ok(())
    }

    /// Counters after op `i` against those after the one before, for the rules in force
    /// (session 13 item 2: a `ctl set` / `ctl mode` must take effect, not only break nothing):
    /// * pass-through: no line inserted, none dirty; the log layout (detached) caches none;
    /// * write-through (both layouts), write-around: no dirty line (the switch wrote every
    ///   one back); write-around: a write inserts no line;
    /// * `admission never` (direct): no line inserted;
    /// * sequential cutoff C (direct): a read (write) of C bytes or more inserts no line.
    ///
    /// A failed cache passes everything through: nothing to check. Also records the ranges
    /// the volume reports lost.
    fn check_effects(&mut self, i: usize) -> Result<(), String> {
        let Some(v) = self.rig.vol.as_ref() else {
            return Ok(());
        };
        let st = v.live().live_stats().volume;
        for r in &st.lost_dirty_ranges {
            if !self.lost_seen.contains(r) {
                self.lost_seen.push(*r);
            }
        }
        let now = Snap {
            insertions: st.totals.insertions,
            dirty: st.dirty_lines,
            cached: st.cached_lines,
        };
        let Some(p) = self.prev.replace(now) else {
            return Ok(());
        };
        if st.cache_failed {
            return Ok(());
        }
        let inserted = now.insertions.saturating_sub(p.insertions);
        let direct = self.cfg.layout == Layout::Direct;
        let r = self.rules;
        let mut bad = Vec::new();
        match r.mode {
            Some(Mode::PassThrough) => {
                count(0);
                if inserted > 0 || now.dirty > 0 || (!direct && now.cached > 0) {
                    bad.push(format!(
                        "pass-through: {inserted} line(s) inserted, {} dirty, {} cached",
                        now.dirty, now.cached
                    ));
                }
            }
            Some(m @ (Mode::WriteThrough | Mode::WriteAround)) => {
                count(1);
                if now.dirty > 0 {
                    bad.push(format!("{m}: {} dirty line(s)", now.dirty));
                }
            }
            _ => {}
        }
        if direct {
            if r.mode == Some(Mode::WriteAround)
                && matches!(self.last_io, Some((true, _)))
                && inserted > 0
            {
                bad.push(format!("write-around: a write inserted {inserted} line(s)"));
            }
            if r.never == Some(true) {
                count(2);
            }
            if r.never == Some(true) && inserted > 0 {
                bad.push(format!("admission never: {inserted} line(s) inserted"));
            }
            if let Some((w, len)) = self.last_io {
                if let Some(c) = r.cutoff[w as usize] {
                    if c > 0 && len >= c {
                        count(3);
                    }
                    if c > 0 && len >= c && inserted > 0 {
                        bad.push(format!(
                            "seq-cutoff{} {c}: a {} of {len} bytes inserted {inserted} line(s)",
                            if w { "-write" } else { "" },
                            if w { "write" } else { "read" }
                        ));
                    }
                }
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        Err(self.fail(format!(
            "op {i}: a setting in force had no effect ({r:?}; before {p:?}, after {now:?}): {}",
            bad.join("; ")
        )))
    }

    /// `ctl set` of a live setting (the direct layout takes them; the log layout must refuse
    /// every key but `mode`, and change nothing).
    fn change_setting(&mut self, i: usize) -> Result<(), String> {
        const SETTINGS: &[(&str, &[&str])] = &[
            ("admission", &["always", "never", "nhit:2", "nhit:2:1"]),
            ("seq-cutoff", &["0", "4k", "16k"]),
            ("seq-cutoff-write", &["0", "4k"]),
            ("group-size", &["4k", "8k", "16k"]),
            ("dirty-high", &["0.9", "0.5", "0.2"]),
            ("dirty-low", &["0.1", "0.3", "0"]),
            ("cleaning", &["lba", "acp", "alru"]),
            ("cleaning-age", &["4", "100"]),
            ("writeback-rate", &["auto", "off", "50"]),
            ("writeback-target", &["0.1", "0.5"]),
            ("clean-victim-window", &["0", "8"]),
            ("partial-fill", &["off", "on"]),
        ];
        let (key, values) = SETTINGS[self.rng.gen_range(0..SETTINGS.len())];
        let value = values[self.rng.gen_range(0..values.len())];
        let res = self.rig.vol().live().set_setting(key, value);
        self.note(format!("op {i}: set {key} {value}: {res:?}"));
        if self.cfg.layout == Layout::Log && res.is_ok() {
            return Err(self.fail(format!("op {i}: the log layout took `{key}` = {value}")));
        }
        if self.cfg.layout == Layout::Direct {
            // Refused (the volume failed, say): the old value holds; applied but not stored
            // (a superblock write failed) or anything else: unknown.
            let ok = res.is_ok();
            let bytes = |v: &str| match v {
                "4k" => 4096,
                "16k" => 16384,
                _ => 0,
            };
            match key {
                "admission" => self.rules.never = ok.then_some(value == "never"),
                "seq-cutoff" => self.rules.cutoff[0] = ok.then_some(bytes(value)),
                "seq-cutoff-write" => self.rules.cutoff[1] = ok.then_some(bytes(value)),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether `e` is the direct layout's fast failure while backing syncs keep failing (a
/// request that needs a sync fails during the backoff without asking the device again): the
/// typed error (`degrade::sync_backoff_of`), not its text.
fn sync_backoff(e: &std::io::Error) -> bool {
    tiercache_server::degrade::sync_backoff_of(e).is_some()
}

/// Known gaps the default run steers around (each names its regression test and notes
/// entry): `TIERCACHE_FAULT_MODEL_KNOWN=a,b` lists the ones to skip; `all` / `none`.
fn known(gap: &str) -> bool {
    let v = std::env::var("TIERCACHE_FAULT_MODEL_KNOWN").unwrap_or_else(|_| KNOWN.join(","));
    v.split(',').any(|k| k == gap || k == "all")
}

/// Gaps not fixed yet (skipped by the default run): none. `lost-forgotten` was fixed by the
/// durable lost-range list (docs/notes-lostlist.md); `backoff-flip` (concurrent checker, direct
/// layout: a write failed by the sync backoff reading old now and new after a restart) by the
/// early refusal of session 14 (write-through) and the first-phase write-backs of
/// docs/notes-flipwb.md; 600 soak seeds x 120 rounds found no flip without it. Either can still
/// be steered around for a diagnosis: `TIERCACHE_FAULT_MODEL_KNOWN=backoff-flip`.
const KNOWN: &[&str] = &[];

fn libc_enospc() -> i32 {
    28
}

fn cfg_for(seed: u64, ops: usize) -> Cfg {
    let mut r = rng(seed ^ 0x7275_7374);
    let layout = if seed.is_multiple_of(2) {
        Layout::Direct
    } else {
        Layout::Log
    };
    let mode = match (layout, r.gen_range(0..3)) {
        (_, 0) => Mode::WriteThrough,
        (Layout::Direct, 2) => Mode::WriteAround,
        _ => Mode::WriteBack,
    };
    Cfg {
        layout,
        mode,
        sums: layout == Layout::Direct && r.gen_bool(0.3),
        // A quarter of the direct seeds, drawing nothing from the seed's stream (so every
        // other choice of every seed stays what it was).
        validity: if seed % 8 == 6 {
            tiercache_engine::Validity::Line
        } else {
            tiercache_engine::Validity::Sector
        },
        max_cache_errors: if r.gen_bool(0.3) { 3 } else { 1_000_000 },
        p_fault: [0.0, 0.01, 0.03, 0.06][r.gen_range(0..4)],
        ops,
        compression: [Compression::Lz4, Compression::Zstd(1), Compression::None][r.gen_range(0..3)],
        dedup: if r.gen_bool(0.5) { 0.5 } else { 0.0 },
        // Half the log seeds (odd), drawing nothing from the stream: a trimmed free reserve
        // (victims reclaimed ahead, written back, discarded) or reinsertion (with trim on
        // every other time: the segment discarded, then refilled).
        reclaim: match seed % 8 {
            3 => Some((true, 0.2, 0)),
            7 => Some((seed % 16 == 15, 0.0, 1)),
            _ => None,
        },
    }
}

fn run_seed(seed: u64, ops: usize) -> Result<(u64, u64), String> {
    let cfg = cfg_for(seed, ops);
    let rig = Rig::new(&cfg, seed);
    let mut run = Run {
        rng: rng(seed),
        seed,
        m: Model::new(),
        rig,
        log: Vec::new(),
        ver: 0,
        backing_faulty: false,
        injected: 0,
        failed_noted: false,
        lost_seen: Vec::new(),
        rules: Rules::new(cfg.mode),
        prev: None,
        last_io: None,
        cfg,
    };
    for i in 0..run.cfg.ops {
        run.last_io = None;
        run.op(i)?;
        run.check_effects(i)?;
        if let (Ok(w), Some(Vol::D(v))) = (
            std::env::var("TIERCACHE_FAULT_MODEL_WATCH"),
            run.rig.vol.as_ref(),
        ) {
            let key: u64 = w.parse().unwrap();
            let l: Vec<_> = v.lines().into_iter().filter(|l| l.key == key).collect();
            run.note(format!("  watch line {key}: {l:?}"));
        }
        let failed = run
            .rig
            .vol
            .as_ref()
            .is_some_and(|v| v.live().cache_failed());
        if failed && !run.failed_noted {
            run.note(format!("  the cache failed at op {i}"));
        }
        run.failed_noted = failed;
    }
    run.finish()?;
    let _ = &run.rig.dir;
    Ok((run.injected, run.ver))
}

#[test]
fn random_faults_never_lose_misdirect_or_serve_stale_data() {
    if let Ok(s) = std::env::var("TIERCACHE_FAULT_MODEL_SEED") {
        let seed = s.parse().expect("TIERCACHE_FAULT_MODEL_SEED: a number");
        let soak = std::env::var("TIERCACHE_FAULT_SOAK").is_ok_and(|v| v != "0");
        if let Err(e) = run_seed(seed, if soak { 450 } else { 150 }) {
            panic!("{e}");
        }
        return;
    }
    let soak = std::env::var("TIERCACHE_FAULT_SOAK").is_ok_and(|v| v != "0");
    let (seeds, ops) = if soak { (4000, 450) } else { (600, 150) };
    let seeds = std::env::var("TIERCACHE_FAULT_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seeds);
    // Seeds are independent: run on up to two threads (`TIERCACHE_FAULT_MODEL_THREADS`).
    let threads = std::env::var("TIERCACHE_FAULT_MODEL_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(2)))
        .max(1);
    let t = std::time::Instant::now();
    let next = std::sync::atomic::AtomicU64::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                let r = run_seed(seed, ops);
                results.lock().unwrap().push((seed, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let (mut injected, mut writes, mut failures) = (0, 0, Vec::new());
    for (seed, r) in results {
        match r {
            Ok((i, w)) => {
                injected += i;
                writes += w;
            }
            Err(e) => {
                failures.push(seed);
                if failures.len() == 1 {
                    eprintln!("{e}");
                }
            }
        }
    }
    let e: Vec<u64> = EFFECTS
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    println!(
        "{seeds} seeds x {ops} ops, {writes} writes, {injected} injected errors, {:.1} s, failing seeds {failures:?}",
        t.elapsed().as_secs_f64()
    );
    println!(
        "effects checked: {} ops in pass-through, {} in write-through/-around, {} under admission never, {} requests over a seq cutoff; {} mode switches credited as durability points, {} followed by a power cut",
        e[0], e[1], e[2], e[3], e[4], e[5]
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    assert!(injected > seeds, "few faults injected: {injected}");
}

/// Replays an op log without faults (`TIERCACHE_FAULT_MODEL_REPLAY=file`, one op a line as
/// the checker logs them: `write OFF+LEN vN fua B`, `zero OFF+LEN fua B may_trim B`,
/// `mode MODE`, `read OFF+LEN`, `trim OFF+LEN`, `flush`, `ctl flush`, `clean shutdown`,
/// `power cut`; `layout mode sums [validity]` on the first line), to
/// minimize a failing seed by deleting lines.
#[test]
fn replay_op_log() {
    let Ok(path) = std::env::var("TIERCACHE_FAULT_MODEL_REPLAY") else {
        return;
    };
    replay(&std::fs::read_to_string(path).unwrap());
}

/// Found by the checker (seed 352, no fault injected; minimized from 149 ops): after a warm
/// restart the engine's free list still listed slots the restore had filled (`free_stale`);
/// a trim freed slot 0 again, so it was listed twice and handed out to lines 15 and 16 of
/// one read; placing the second over the first unlinked line 59 (dirty) from the index, the
/// next write to it missed and took a second slot, and the restart after kept one copy:
/// before the fix, "after line 22 (write 242176+2048 v60 fua false): a key in two slots:
/// [... (59, 2, 3, 3), (59, 5, 30, 30) ...]" and, without that check, "final read: sector
/// 472 (byte 241664) read Ver(0), may read [V(54)]".
#[test]
fn trim_after_a_warm_restart_never_hands_a_slot_out_twice() {
    replay(
        "direct write-back false
read 92672+13824
read 221184+4096
write 15872+4096 v29 fua false
read 266240+512
write 311296+5632 v30 fua true
write 36864+2560 v31 fua false
write 156672+14848 v32 fua false
write 217088+512 v35 fua true
write 146944+14336 v36 fua false
write 25600+4096 v37 fua false
read 301056+14336
read 69632+4096
write 53760+4096 v39 fua false
read 258048+512
read 352768+512
write 182272+4608 v44 fua false
read 225280+2560
read 385024+4096
write 238592+4096 v54 fua false
clean shutdown
trim 385024+4096
read 62976+4096
write 242176+2048 v60 fua false
",
    );
}

fn replay(text: &str) {
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mut cfg = cfg_for(0, 0);
    cfg.layout = if head[0] == "log" {
        Layout::Log
    } else {
        Layout::Direct
    };
    cfg.mode = head[1].parse().unwrap();
    cfg.sums = head[2] == "true";
    if let Some(v) = head.get(3) {
        cfg.validity = v.parse().unwrap();
    }
    let rig = Rig::new(&cfg, 1);
    let mut run = Run {
        rng: rng(1),
        seed: 0,
        m: Model::new(),
        rig,
        log: Vec::new(),
        ver: 0,
        backing_faulty: false,
        injected: 0,
        failed_noted: false,
        lost_seen: Vec::new(),
        rules: Rules::new(cfg.mode),
        prev: None,
        last_io: None,
        cfg,
    };
    let span = |w: &str| -> (u64, u64) {
        let (a, b) = w.split_once('+').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    for (i, l) in lines.enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        run.note(l.to_string());
        let r = match w[0] {
            "write" => {
                let (off, len) = span(w[1]);
                let ver: u64 = w[2][1..].parse().unwrap();
                let fua = w.get(4) == Some(&"true");
                let d = units(off / U, len / U, ver);
                run.rig.vol().live().write(off, &d, fua).unwrap();
                for u in off / U..(off + len) / U {
                    run.m.set(u, Val::V(ver), true, fua);
                }
                Ok(())
            }
            "zero" => {
                let (off, len) = span(w[1]);
                let fua = w.get(3) == Some(&"true");
                let may_trim = w.get(5) == Some(&"true");
                let r = run.rig.vol().live().write_zeroes(off, len, fua, may_trim);
                r.unwrap();
                for u in off / U..(off + len) / U {
                    run.m.set(u, Val::Zero, true, fua);
                }
                Ok(())
            }
            "mode" => {
                let mode: Mode = w[1].trim_end_matches(':').parse().unwrap();
                run.rig.vol().live().set_mode(mode).unwrap();
                Ok(())
            }
            "read" => {
                let (off, len) = span(w[1]);
                run.read(off, len, &format!("line {i}: {l}"))
            }
            "trim" => {
                let (off, len) = span(w[1]);
                run.rig.vol().live().trim(off, len).unwrap();
                for s in off / S..(off + len) / S {
                    run.m.trim(s);
                }
                Ok(())
            }
            "flush" => {
                run.rig.vol().live().flush().unwrap();
                run.m.flushed(&[]);
                Ok(())
            }
            "ctl" => {
                run.rig.vol().live().flush_dirty().unwrap();
                run.m.flushed(&[]);
                Ok(())
            }
            "clean" | "power" => {
                let crash = w[0] == "power";
                let vol = run.rig.vol.take().unwrap();
                if crash {
                    run.rig.faults.power_cut();
                    drop(vol);
                    run.m.crashed();
                } else {
                    vol.live().shutdown().unwrap();
                    drop(vol);
                    run.rig.faults.process_exit();
                    run.m.flushed(&[]);
                }
                run.rig.open(&run.cfg, i as u64).map_err(|e| e.to_string())
            }
            x => panic!("unknown op {x}"),
        };
        if let Err(e) = r {
            panic!("{e}");
        }
        if let Some(Vol::D(v)) = run.rig.vol.as_ref() {
            let mut keys: Vec<_> = v
                .lines()
                .iter()
                .map(|l| (l.key, l.slot, l.valid, l.dirty))
                .collect();
            keys.sort();
            if keys.windows(2).any(|w| w[0].0 == w[1].0) {
                panic!("after line {i} ({l}): a key in two slots: {keys:?}");
            }
            if std::env::var("TIERCACHE_FAULT_MODEL_LINES").is_ok() {
                eprintln!("after {l}: {keys:?}");
            }
        }
    }
    if let Err(e) = run.finish() {
        panic!("{e}");
    }
}

/// Direct rig without faults: (files, volume).
fn plain_direct(mode: Mode, sums: bool) -> (Files, CacheVolume) {
    let f = files_with(32, LS, sums);
    write_initial_backing(&f.backing);
    format_with(&f, mode, LS, sums);
    let (v, _) = open(&f, None);
    (f, v)
}

fn sectors(s0: u64, n: u64, ver: u64) -> Vec<u8> {
    units(s0 * (S / U), n * (S / U), ver)
}

fn read_ver(v: &dyn LiveVolume, s: u64) -> Got {
    let mut b = vec![0u8; S as usize];
    match v.read(s * S, &mut b) {
        Ok(()) => got_at(&b, s),
        Err(_) => Got::Garbage,
    }
}

/// Found by the checker (seed 352, no fault injected): write-back with data checksums, a
/// partial line written, restart, another partial write to the same line, restart.
#[test]
fn write_back_partial_line_across_two_restarts_keeps_every_sector() {
    let (f, v) = plain_direct(Mode::WriteBack, true);
    v.write(466 * S, &sectors(466, 8, 54), false).unwrap();
    v.shutdown().unwrap();
    drop(v);
    let (v, _) = open(&f, None);
    v.write(473 * S, &sectors(473, 4, 60), false).unwrap();
    assert_eq!(read_ver(&v, 472), Got::Ver(54), "before the second restart");
    v.shutdown().unwrap();
    drop(v);
    let (v, _) = open(&f, None);
    assert_eq!(read_ver(&v, 472), Got::Ver(54), "after the second restart");
    assert_eq!(read_ver(&v, 473), Got::Ver(60), "after the second restart");
}

/// trust11 item 4: `ctl flush` in the log layout (`write_back_all`) counted a backing sync
/// that failed as done (`backing_syncs`), and not as failed (`backing_sync_errors`).
#[test]
fn log_ctl_flush_counts_a_failed_backing_sync_as_failed() {
    let mut cfg = cfg_for(1, 0);
    cfg.layout = Layout::Log;
    cfg.mode = Mode::WriteBack;
    let rig = Rig::new(&cfg, 9);
    let Some(Vol::L(v)) = rig.vol.as_ref() else {
        unreachable!()
    };
    v.write(0, &sectors(0, 64, 1), false).unwrap();
    let before = v.stats().live;
    rig.bh.fail_next_sync(false);
    assert!(v.flush_dirty().is_err(), "the backing sync failed");
    let after = v.stats().live;
    assert_eq!(
        (after.backing_syncs, after.backing_sync_errors),
        (before.backing_syncs, before.backing_sync_errors + 1),
        "a failed sync is counted as failed, not as done"
    );
    v.flush_dirty().unwrap();
    let ok = v.stats().live;
    assert_eq!(ok.backing_syncs, after.backing_syncs + 1);
    assert_eq!(ok.backing_sync_errors, after.backing_sync_errors);
    assert_eq!(read_ver(&**v, 5), Got::Ver(1));
}

/// What sector `s` reads: its version, or the error with whether the volume reports it lost.
fn read_or_lost(v: &Vol, s: u64) -> Result<Got, bool> {
    let mut b = vec![0u8; S as usize];
    match v.live().read(s * S, &mut b) {
        Ok(()) => Ok(got_at(&b, s)),
        Err(_) => Err(v.lost().iter().any(|&(a, b)| a < (s + 1) * S && s * S < b)),
    }
}

fn rig_for(layout: Layout, mode: Mode, sums: bool) -> Rig {
    let mut cfg = cfg_for(1, 0);
    (cfg.layout, cfg.mode, cfg.sums) = (layout, mode, sums);
    Rig::new(&cfg, 3)
}

/// Was the known gap `cache-sync-drop` (checker seeds 146, 192, 160, 54 with
/// `TIERCACHE_FAULT_MODEL_KNOWN=none`): in the direct layout a cache sync that fails and
/// drops the unsynced cache writes (a failed fsync on a cache file) fails the cache, whose
/// dirty lines were then copied from slots that no longer hold them: the copy was older
/// bytes or garbage, served from then on with no error and nothing reported lost. Before
/// the fix: "after a failed cache sync (flush Ok(())): sector 0 reads Ok(Garbage)".
#[test]
fn direct_failed_cache_sync_that_drops_data_never_serves_older_bytes() {
    let rig = rig_for(Layout::Direct, Mode::WriteBack, false);
    let v = rig.vol();
    v.live().write(0, &sectors(0, 8, 1), false).unwrap();
    rig.ch.fail_next_sync(true);
    let flush = v.live().flush();
    let got = read_or_lost(v, 0);
    assert!(
        got == Ok(Got::Ver(1)) || got == Err(true),
        "after a failed cache sync (flush {flush:?}): sector 0 reads {got:?}, want version 1 or an error for a range reported lost"
    );
    assert!(
        got == Ok(Got::Ver(1)) || flush.is_err(),
        "the FLUSH that lost sector 0 succeeded: {flush:?}"
    );
}

/// The same with data checksums: the cached copy no longer verifies, so it is reported
/// lost, never copied to the backing device.
#[test]
fn direct_failed_cache_sync_with_data_checksums_never_serves_older_bytes() {
    let rig = rig_for(Layout::Direct, Mode::WriteBack, true);
    let v = rig.vol();
    v.live().write(0, &sectors(0, 8, 1), false).unwrap();
    rig.ch.fail_next_sync(true);
    let flush = v.live().flush();
    let got = read_or_lost(v, 0);
    assert!(
        got == Ok(Got::Ver(1)) || (got == Err(true) && flush.is_err()),
        "after a failed cache sync (flush {flush:?}): sector 0 reads {got:?}, want version 1 or an error for a range reported lost (and a failed flush)"
    );
}

/// Found by the checker once the flush path was fixed (seeds 148, 160, 396, 512, 514, 562):
/// a cache sync outside a flush (here: unmapping a durable record before its slot is
/// reused) fails and drops the unsynced cache writes, the cache error is counted but the
/// cache stays in use, and its lines in the slots written since kept being served.
#[test]
fn direct_failed_cache_sync_outside_a_flush_never_serves_older_bytes() {
    let rig = rig_for(Layout::Direct, Mode::WriteThrough, false);
    let v = rig.vol();
    v.live().set_max_cache_errors(1_000_000);
    // Every line cached, its record durable.
    for l in 0..32 {
        v.live()
            .write(l * LS, &sectors(l * LS / S, 1, 1), false)
            .unwrap();
    }
    v.live().flush().unwrap();
    v.live().write(0, &sectors(0, 1, 2), false).unwrap();
    rig.ch.fail_next_sync(true);
    // A line not cached: its slot's durable record is unmapped first (a cache sync).
    let w = v.live().write(40 * LS, &sectors(40 * LS / S, 1, 1), false);
    assert!(
        !v.live().cache_failed(),
        "one cache error does not fail the cache"
    );
    let got = read_or_lost(v, 0);
    assert!(
        got == Ok(Got::Ver(2)) || got == Err(true),
        "after a failed cache sync (write {w:?}, {} injected): sector 0 reads {got:?}, want version 2 or an error for a range reported lost",
        rig.ch.injected()
    );
}

/// Found by the checker (seeds 91, 97, 223): the log layout passing through after its cache
/// failed forgot the writes a failed backing sync dropped: the FLUSH failed once, the next
/// one succeeded, and the older bytes were served with nothing reported lost. Before the
/// fix: "next flush Ok(()): sector 16 reads Ok(Ver(0))".
#[test]
fn log_pass_through_failed_backing_sync_never_serves_older_bytes() {
    let rig = rig_for(Layout::Log, Mode::WriteBack, false);
    let v = rig.vol();
    rig.ch.fail_next_sync(false);
    v.live().write(0, &sectors(0, 8, 1), false).unwrap();
    let _ = v.live().flush();
    assert!(
        v.live().cache_failed(),
        "the cache sync error failed the cache"
    );
    v.live().write(8192, &sectors(16, 8, 2), false).unwrap();
    rig.bh.fail_next_sync(true);
    assert!(v.live().flush().is_err(), "the sync failed");
    let second = v.live().flush();
    let got = read_or_lost(v, 16);
    assert!(
        got == Ok(Got::Ver(2)) || got == Err(true),
        "pass-through after a failed backing sync (next flush {second:?}): sector 16 reads {got:?}, want version 2 or an error for a range reported lost"
    );
}

/// Found by the extended checker (seeds 15, 93, 155, 187, 261, 369, 401 of the default run):
/// the log layout leaving pass-through (`ctl mode` after `ctl detach`) did not sync the
/// writes passed through; the next backing sync failed and dropped them, the one after
/// succeeded, and the older bytes were served with nothing reported lost. Before the fix:
/// "after leaving pass-through (flush Err(..), then Ok(())): sector 0 reads Ok(Ver(0))".
#[test]
fn log_leaving_pass_through_never_forgets_writes_a_failed_sync_dropped() {
    let rig = rig_for(Layout::Log, Mode::WriteThrough, false);
    let v = rig.vol();
    v.live().set_mode(Mode::PassThrough).unwrap();
    v.live().write(0, &sectors(0, 8, 1), false).unwrap();
    let left = v.live().set_mode(Mode::WriteThrough);
    v.live().write(65536, &sectors(128, 8, 2), false).unwrap();
    rig.bh.fail_next_sync(true);
    let first = v.live().flush();
    let second = v.live().flush();
    let got = read_or_lost(v, 0);
    assert!(
        got == Ok(Got::Ver(1)) || got == Err(true),
        "after leaving pass-through ({left:?}; flush {first:?}, then {second:?}): sector 0 reads {got:?}, want version 1 or an error for a range reported lost"
    );
}

/// Was known gap `lost-forgotten` = trust11 item 3 (checker seeds 32, 34, 52, 134, 208,
/// 228): the direct layout without `--data-checksums` forgot its lost ranges at a restart
/// and served the backing device's older bytes there. Before the durable lost-range list:
/// "after a clean restart sector 0 reads Ok(Ver(0))".
#[test]
fn direct_lost_ranges_survive_a_restart_without_data_checksums() {
    let mut rig = rig_for(Layout::Direct, Mode::WriteAround, false);
    rig.vol().live().write(0, &sectors(0, 8, 1), false).unwrap();
    rig.bh.fail_next_sync(true);
    assert!(rig.vol().live().flush().is_err());
    assert_eq!(read_or_lost(rig.vol(), 0), Err(true), "reported lost");
    let vol = rig.vol.take().unwrap();
    vol.live().shutdown().unwrap();
    drop(vol);
    rig.faults.process_exit();
    let cfg = cfg_for(1, 0);
    rig.open(&cfg, 4).unwrap();
    let got = read_or_lost(rig.vol(), 0);
    assert_eq!(
        got,
        Err(true),
        "after a clean restart sector 0 reads {got:?}"
    );
}

/// Writes whole lines `lines` at version `ver` (write-through log layout): the lines whose
/// write succeeded, and the first error.
fn write_lines(v: &Vol, lines: std::ops::Range<u64>, ver: u64) -> (Vec<u64>, Option<String>) {
    let mut ok = Vec::new();
    for l in lines {
        match v
            .live()
            .write(l * LS, &sectors(l * LS / S, LS / S, ver), false)
        {
            Ok(()) => ok.push(l),
            Err(e) => return (ok, Some(e.to_string())),
        }
    }
    (ok, None)
}

/// Session 12 item 3: in the log layout (write-through: every line written goes to the
/// backing device, and a segment is sealed only after a backing sync) backing syncs that
/// keep failing failed every sealing write, each asking the failing device again, with no
/// state an operator could see. Now, as the direct layout's degraded state: `degraded` with
/// the last error in `ctl stats` / Prometheus, after a second failure no device retry
/// before the backoff (100 ms doubling to 30 s), the
/// background retry (or a FLUSH) ends it once the device heals. Before: "after a failed
/// sealing write (...): degraded false, reason None".
#[test]
fn log_failing_backing_syncs_degrade_back_off_and_recover() {
    let rig = rig_for(Layout::Log, Mode::WriteThrough, false);
    let v = rig.vol();
    let Vol::L(lv) = v else { unreachable!() };
    rig.bh.fail_syncs();
    let (ok1, err) = write_lines(v, 0..96, 1);
    let err = err.expect("a write needing a seal fails while backing syncs fail");
    let st = v.live().live_stats().volume;
    let reason = st.degraded_reason.clone().unwrap_or_default();
    assert!(
        st.degraded && reason.contains("sync") && reason.contains("injected sync error"),
        "after a failed sealing write ({err}): degraded {}, reason {:?}",
        st.degraded,
        st.degraded_reason
    );
    let prom = tiercache_server::live::prometheus(v.live());
    assert!(
        prom.contains("\ntiercache_degraded 1\n"),
        "Prometheus shows the degraded state"
    );
    // The first failure may be a one-off: the next sealing write asks the device again.
    let asked = rig.bh.injected();
    let (_, second) = write_lines(v, 96..98, 2);
    assert!(second.is_some() && rig.bh.injected() == asked + 1);
    // Backoff: from the second failure on, the next sealing writes do not ask it.
    let asked = rig.bh.injected();
    let (_, again) = write_lines(v, 98..100, 2);
    assert!(
        again.is_some(),
        "a sealing write still fails while syncs fail"
    );
    assert_eq!(
        rig.bh.injected(),
        asked,
        "a sync was tried again within the backoff ({again:?})"
    );
    // Still failing when due: counted, still degraded.
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert!(lv.retry_write_backs(), "degraded before the retry");
    assert!(rig.bh.injected() > asked, "the due retry asked the device");
    assert!(v.live().live_stats().volume.degraded);
    // The device heals: the background retry ends the state once due, writes succeed.
    rig.bh.heal();
    std::thread::sleep(std::time::Duration::from_millis(450));
    lv.retry_write_backs();
    let st = v.live().live_stats().volume;
    assert!(
        !st.degraded,
        "healed device, due retry: still degraded ({:?})",
        st.degraded_reason
    );
    let (ok2, err) = write_lines(v, 0..96, 3);
    assert!(err.is_none(), "writes after recovery: {err:?}");
    // A FLUSH retries at once, whatever the backoff.
    rig.bh.fail_syncs();
    let (_, err) = write_lines(v, 0..96, 4);
    assert!(err.is_some());
    rig.bh.heal();
    v.live().flush().unwrap();
    assert!(
        !v.live().live_stats().volume.degraded,
        "a good FLUSH ends it"
    );
    assert!(ok1.len() < 96 && ok2.len() == 96);
    for l in 0..96 {
        let got = read_ver(v.live(), l * LS / S);
        assert!(
            got == Got::Ver(3) || got == Got::Ver(4),
            "line {l} reads {got:?}"
        );
    }
}

/// A lost range leaves the durable list only at the flush that makes its rewrite durable:
/// rewritten and cut before a FLUSH, it still reads EIO after the restart (never the
/// backing device's older bytes); rewritten and flushed, it reads the new version after a
/// power cut. One body for both layouts (`lost`: how the layout loses sector 0).
fn lost_range_is_cleared_only_by_a_flushed_rewrite(layout: Layout, mode: Mode, lose: fn(&Rig)) {
    let mut rig = rig_for(layout, mode, false);
    let cfg = Cfg {
        layout,
        mode,
        ..cfg_for(1, 0)
    };
    lose(&rig);
    assert_eq!(read_or_lost(rig.vol(), 0), Err(true), "reported lost");
    // Power cut: the list was durable before the loss was reported.
    rig.vol.take();
    rig.faults.power_cut();
    rig.open(&cfg, 4).unwrap();
    let got = read_or_lost(rig.vol(), 0);
    assert_eq!(got, Err(true), "after a power cut sector 0 reads {got:?}");
    // Rewritten, not flushed, power cut: still lost (the rewrite may be gone).
    rig.vol().live().write(0, &sectors(0, 8, 3), false).unwrap();
    assert_eq!(read_or_lost(rig.vol(), 0), Ok(Got::Ver(3)), "rewritten");
    rig.vol.take();
    rig.faults.power_cut();
    rig.open(&cfg, 5).unwrap();
    let got = read_or_lost(rig.vol(), 0);
    assert!(
        got == Err(true) || got == Ok(Got::Ver(3)),
        "rewritten, power cut before a FLUSH: sector 0 reads {got:?}, want version 3 or an error for a range reported lost"
    );
    // Rewritten and flushed: off the list for good.
    rig.vol().live().write(0, &sectors(0, 8, 4), false).unwrap();
    rig.vol().live().flush().unwrap();
    rig.vol.take();
    rig.faults.power_cut();
    rig.open(&cfg, 6).unwrap();
    assert_eq!(
        read_or_lost(rig.vol(), 0),
        Ok(Got::Ver(4)),
        "flushed rewrite"
    );
    assert!(rig.vol().lost().is_empty(), "{:?}", rig.vol().lost());
}

#[test]
fn direct_lost_range_is_cleared_only_by_a_flushed_rewrite() {
    lost_range_is_cleared_only_by_a_flushed_rewrite(Layout::Direct, Mode::WriteAround, |rig| {
        // Written around the cache, then dropped by a failed backing sync.
        rig.vol().live().write(0, &sectors(0, 8, 1), false).unwrap();
        rig.bh.fail_next_sync(true);
        assert!(rig.vol().live().flush().is_err(), "the FLUSH lost data");
        assert!(!rig.vol().live().cache_failed());
    });
}

/// Was the log half of `lost-forgotten` (soak seed 655): the log layout kept no lost range
/// across a restart at all.
#[test]
fn log_lost_range_is_cleared_only_by_a_flushed_rewrite() {
    lost_range_is_cleared_only_by_a_flushed_rewrite(Layout::Log, Mode::WriteBack, |rig| {
        // A dirty line written to a sealed segment, then unreadable from the cache.
        let v = rig.vol().live();
        v.set_max_cache_errors(1_000_000);
        for l in 0..24 {
            v.write(l * LS, &sectors(l * LS / S, LS / S, 1), false)
                .unwrap();
        }
        v.flush().unwrap();
        rig.ch.fail_reads(1 << 20..rig.cache_len);
        let mut b = vec![0u8; S as usize];
        assert!(v.read(0, &mut b).is_err(), "the dirty line is unreadable");
        assert!(!v.cache_failed());
        rig.ch.heal();
    });
}

/// One client request (or operator command) of a concurrent round.
#[derive(Clone, Debug)]
enum COp {
    /// Units `u0..u0 + n` at version `ver` (`fua`).
    Write(u64, u64, u64, bool),
    /// Write-zeroes of units `u0..u0 + n` (`fua`, `may_trim`).
    Zero(u64, u64, bool, bool),
    Read(u64, u64),
    Flush,
    /// `ctl flush`.
    CtlFlush,
    /// `ctl mode`.
    Mode(Mode),
    /// The background work (direct: a cleaning pass, its I/O outside the volume lock).
    Background,
    /// A fault injected by a client thread: it takes its place in the global order like a
    /// request, so a request may fail for it only if it ended after the fault began.
    Fault(CFault),
}

impl COp {
    /// The bytes the request reads or writes (none for FLUSH and the like).
    fn bytes(&self) -> Option<(u64, u64)> {
        match *self {
            COp::Write(u0, n, ..) | COp::Zero(u0, n, ..) | COp::Read(u0, n) => {
                Some((u0 * U, (u0 + n) * U))
            }
            _ => None,
        }
    }
    /// A FLUSH in effect (it fails when data was lost anywhere).
    fn flushes(&self) -> bool {
        matches!(
            self,
            COp::Flush
                | COp::CtlFlush
                | COp::Mode(_)
                | COp::Write(_, _, _, true)
                | COp::Zero(_, _, true, _)
        )
    }
}

/// A fault of a concurrent round (session 14): the sequential checker's kinds, injected by a
/// client thread while the others run; every one is healed at the end of its round.
#[derive(Clone, Debug)]
enum CFault {
    /// Backing reads of `a..b` fail.
    BackingReads(u64, u64),
    /// Backing writes of `a..b` fail (with ENOSPC).
    BackingWrites(u64, u64, bool),
    /// The nth backing write from now fails once.
    BackingNthWrite(u64),
    /// The next backing sync fails and drops the unsynced writes.
    BackingNextSync,
    /// Every backing sync fails.
    BackingSyncs,
    CacheReads(u64, u64),
    CacheWrites(u64, u64),
    /// The next cache sync fails and drops the unsynced writes.
    CacheNextSync,
    /// The cache device fails as a whole: every read, write and sync (its unsynced writes
    /// kept: `FaultHandle::lose` drops them with no error the volume could see once healed
    /// at the round's end, which no volume can detect: soak seed 150 read an older version
    /// after a FLUSH that followed the heal).
    CacheFailing,
}

impl CFault {
    /// A fault; backing ranges in the round's window `lo..hi` (bytes), so they meet requests.
    fn draw(r: &mut ChaCha8Rng, lo: u64, hi: u64, cache_len: u64) -> CFault {
        let hot = |r: &mut ChaCha8Rng| {
            let a = r.gen_range(lo / S..hi / S) * S;
            (a, a + S * r.gen_range(1..24))
        };
        let cache = |r: &mut ChaCha8Rng| {
            let a = r.gen_range(4096..cache_len.max(4097));
            (a, a + r.gen_range(512..16384))
        };
        match r.gen_range(0..100) {
            0..=14 => {
                let (a, b) = hot(r);
                CFault::BackingReads(a, b)
            }
            15..=29 => {
                let (a, b) = hot(r);
                CFault::BackingWrites(a, b, r.gen_bool(0.3))
            }
            30..=39 => CFault::BackingNthWrite(r.gen_range(1..6)),
            40..=59 => CFault::BackingNextSync,
            60..=74 => CFault::BackingSyncs,
            75..=82 => {
                let (a, b) = cache(r);
                CFault::CacheReads(a, b)
            }
            83..=90 => {
                let (a, b) = cache(r);
                CFault::CacheWrites(a, b)
            }
            91..=97 => CFault::CacheNextSync,
            _ => CFault::CacheFailing,
        }
    }

    fn inject(&self, bh: &FaultHandle, ch: &FaultHandle) {
        match *self {
            CFault::BackingReads(a, b) => bh.fail_reads(a..b),
            CFault::BackingWrites(a, b, enospc) => {
                bh.fail_writes(a..b);
                if enospc {
                    bh.fail_with_errno(libc_enospc());
                }
            }
            CFault::BackingNthWrite(n) => bh.fail_nth_write(n, false),
            CFault::BackingNextSync => bh.fail_next_sync(true),
            CFault::BackingSyncs => bh.fail_syncs(),
            CFault::CacheReads(a, b) => ch.fail_reads(a..b),
            CFault::CacheWrites(a, b) => ch.fail_writes(a..b),
            CFault::CacheNextSync => ch.fail_next_sync(true),
            CFault::CacheFailing => {
                ch.fail_reads(0..u64::MAX);
                ch.fail_writes(0..u64::MAX);
                ch.fail_syncs();
            }
        }
    }
}

/// A request done by a client thread: its place in the global order of starts and ends
/// (`start` < `end`; a request that ended before another started precedes it), result, and
/// for a read what it returned.
struct Done {
    thread: usize,
    op: COp,
    start: u64,
    end: u64,
    res: Result<(), String>,
    /// Failed with the sync backoff error ([`sync_backoff`]).
    backoff: bool,
    /// Failed because it met a range reported lost: that range as listed then (a later
    /// write in the round may take it off the list before the round's end).
    lost: Option<(u64, u64)>,
    data: Vec<u8>,
}

/// A write of one unit in a round: (start, end, value, acknowledged). A failed write may or
/// may not have landed: it never hides an older value and overwrites nothing.
type UnitWrite = (u64, u64, Val, bool);

/// What unit `u` may read between `rs` and `re` (`u64::MAX`, `u64::MAX`: once the round is
/// over), given `old` (what it held when the round began) and the round's writes to it: a
/// write that began before the read ended, unless an acknowledged write began after it ended
/// and itself ended before the read began (it overwrote it, in every order the volume may
/// have applied them); `old` unless an acknowledged write ended before the read began.
fn allowed_in_round(old: &Vals, ws: &[UnitWrite], rs: u64, re: u64) -> Vec<Val> {
    let mut out = Vec::new();
    if !ws.iter().any(|w| w.3 && w.1 < rs) {
        out.extend_from_slice(old.as_slice());
    }
    for &(s, e, v, _) in ws {
        let superseded = ws.iter().any(|w| w.3 && w.1 < rs && w.0 > e);
        if s < re && !superseded && !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// What unit `u` may hold after a power cut once the round is over: `point` is the latest
/// durability point covering it (a FLUSH, `ctl flush` or durable mode switch: its start; a
/// FUA write of it: its end). The writes that ended before it are durable (the last of them,
/// or `old_now` if none; failed ones maybe); every later write may have reached the device
/// too. With no point, the older durable values stay possible.
fn durable_after_round(
    old_now: &Vals,
    old_durable: &Vals,
    ws: &[UnitWrite],
    point: Option<u64>,
) -> Vals {
    let mut out = match point {
        None => old_durable.clone(),
        Some(p) => {
            let before: Vec<UnitWrite> = ws.iter().copied().filter(|w| w.1 <= p).collect();
            if before.is_empty() {
                old_now.clone()
            } else {
                to_vals(&allowed_in_round(old_now, &before, u64::MAX, u64::MAX))
            }
        }
    };
    for w in ws {
        if point.is_none_or(|p| w.1 > p) {
            out.add(w.2);
        }
    }
    out
}

fn to_vals(v: &[Val]) -> Vals {
    let mut out = Vals::One(v[0]);
    for &x in &v[1..] {
        out.add(x);
    }
    out
}

/// Units read while a write of them was in flight (their intervals overlap), and of those
/// the ones that returned the value from before that write: shows the rounds do race.
static RACES: [std::sync::atomic::AtomicU64; 2] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 2];

/// The concurrent run with faults, printed so a check that stops running shows: faults
/// injected, failed requests explained by a fault injected earlier in their round, by a
/// state left by an earlier one (degraded, lost ranges, failed cache), by the sync backoff
/// error, by a lost range reported at the round's end; units reported lost; cache
/// failures; rounds run with the volume's own background thread.
static CFAULTS: [std::sync::atomic::AtomicU64; 8] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 8];

fn cfault_count(k: usize, n: u64) {
    CFAULTS[k].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// The cache failed in a concurrent run: the next start is refused, the backing file holds
/// what the model allows (lost ranges: anything), the cache is formatted again.
fn concurrent_after_cache_failure(
    rig: &Rig,
    cfg: &Cfg,
    m: &mut Model,
    lost: &[(u64, u64)],
) -> Result<(), String> {
    let recorded = tiercache_server::state_file::read(&rig.state)
        .ok()
        .flatten()
        .map(|st| st.lost)
        .unwrap_or_default();
    for &(a, b) in lost.iter().chain(&recorded) {
        for u in a / U..b.div_ceil(U) {
            m.reset(u, Val::Any);
        }
    }
    let o = VolumeOpenOptions {
        direct: OpenOptions {
            state_path: Some(rig.state.clone()),
            ..Default::default()
        },
        log: LogOpenOptions {
            state_path: Some(rig.state.clone()),
            ..Default::default()
        },
    };
    let c = Box::new(FileDev::open(&rig.cache).unwrap());
    let b = Box::new(FileDev::open(&rig.backing).unwrap());
    if open_volume(c, b, &o).is_ok() {
        return Err("a failed cache was reopened".into());
    }
    let data = std::fs::read(&rig.backing).unwrap();
    for s in 0..VOL / S {
        m.check(s, &data[(s * S) as usize..((s + 1) * S) as usize])
            .map_err(|e| {
                format!("backing file after the cache failed (the state file records lost {recorded:?}): {e}")
            })?;
    }
    let _ = std::fs::remove_file(&rig.state);
    format_cache(cfg, &rig.cache);
    Ok(())
}

/// Every unit of the volume read and checked; a read may fail only where a range is
/// reported lost (then sector by sector).
fn concurrent_read_all(rig: &Rig, m: &mut Model) -> Result<(), String> {
    let chunk = 64 << 10;
    let mut buf = vec![0u8; chunk as usize];
    let lost = rig.vol().lost();
    let overlaps = |a: u64, b: u64| lost.iter().any(|&(x, y)| x < b && a < y);
    for off in (0..VOL).step_by(chunk as usize) {
        let pieces: Vec<(u64, u64)> = match rig.vol().live().read(off, &mut buf) {
            Ok(()) => vec![(off, chunk)],
            Err(_) if overlaps(off, off + chunk) => (off..off + chunk)
                .step_by(S as usize)
                .map(|a| (a, S))
                .collect(),
            Err(e) => return Err(format!("final read {off}+{chunk}: {e}")),
        };
        for (a, n) in pieces {
            if n != chunk {
                match rig.vol().live().read(a, &mut buf[..n as usize]) {
                    Ok(()) => {}
                    Err(_) if overlaps(a, a + n) => continue,
                    Err(e) => return Err(format!("final read {a}+{n}: {e}")),
                }
            }
            for k in 0..n / U {
                let b = &buf[(k * U) as usize..((k + 1) * U) as usize];
                m.check_unit(a / U + k, b)
                    .map_err(|e| format!("final read {a}+{n}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// One seed of the concurrent checker: `Err` names the first violation.
fn run_concurrent_seed(seed: u64, rounds: usize) -> Result<u64, String> {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let mut cfg = cfg_for(seed, 0);
    cfg.p_fault = 0.0;
    let mut r = rng(seed ^ 0xc0c0);
    let threads = 2 + (seed % 3) as usize;
    // Faults in a third of the rounds of two seeds in three (the others: none, every request
    // must succeed); the volume's own background thread in a quarter of the seeds of each
    // layout.
    let faulty = !(seed / 4).is_multiple_of(3);
    // (`TIERCACHE_FAULT_MODEL_CONCURRENT_BG=all` / `none` overrides: each stop of the thread
    // waits out its sleep, most of this test's wall time.)
    let background = match std::env::var("TIERCACHE_FAULT_MODEL_CONCURRENT_BG").as_deref() {
        Ok("all") => true,
        Ok("none") => false,
        _ => (seed / 2) % 4 == 1,
    };
    let mut rig = Rig::new(&cfg, seed);
    if background {
        rig.start_bg();
    }
    let mut m = Model::new();
    // The mode in force (`None`: unknown, after a switch that failed).
    let mut mode = Some(cfg.mode);
    let mut ver = 0u64;
    let mut log: Vec<String> = Vec::new();
    let head = format!(
        "concurrent seed {seed} ({:?} {:?}, {threads} client threads, data checksums {}, max cache errors {}, faults {faulty}, background thread {background}{})",
        cfg.layout,
        cfg.mode,
        cfg.sums,
        cfg.max_cache_errors,
        if cfg.layout == Layout::Log {
            format!(", {:?}, dedup {}", cfg.compression, cfg.dedup)
        } else {
            String::new()
        }
    );
    let fail = |log: &[String], what: String| -> String {
        let mut s = format!("{head}: {what}\nlast rounds (newest last):\n");
        // `TIERCACHE_FAULT_MODEL_CONCURRENT_LOG=N`: the last N lines (default 40).
        let n = std::env::var("TIERCACHE_FAULT_MODEL_CONCURRENT_LOG")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        for l in log.iter().rev().take(n).rev() {
            s.push_str("  ");
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!(
            "rerun (the interleaving varies: runs the seed 200 times): TIERCACHE_FAULT_MODEL_CONCURRENT_SEED={seed} cargo test --release -p tiercache-server --test fault_model concurrent"
        ));
        s
    };
    if cfg.layout == Layout::Direct && r.gen_bool(0.5) {
        // Cleaning passes with work to do while clients write.
        let v = rig.vol().live();
        v.set_setting("dirty-low", "0.1")
            .map_err(|e| fail(&log, e))?;
        v.set_setting("dirty-high", "0.2")
            .map_err(|e| fail(&log, e))?;
    }
    let units_total = HOT / U;
    let mut requests = 0u64;
    // Whether a fault was injected in this seed so far (else nothing may fail or be lost).
    let mut any_fault = false;
    for round in 0..rounds {
        if background {
            cfault_count(7, 1);
        }
        // A narrow window half the time: the threads' ranges overlap often.
        let window = if r.gen_bool(0.5) {
            16 * LS / U
        } else {
            units_total
        };
        let base = r.gen_range(0..=(units_total - window) / (LS / U)) * (LS / U);
        let mut mode_op = false;
        let mut plans: Vec<Vec<COp>> = (0..threads)
            .map(|_| {
                (0..r.gen_range(1..5))
                    .map(|_| {
                        let n = match r.gen_range(0..4) {
                            0 => r.gen_range(1..80),
                            1 => S / U * r.gen_range(1..9),
                            2 => LS / U,
                            _ => S / U * r.gen_range(1..33),
                        }
                        .min(window);
                        let mut u0 = base + r.gen_range(0..=window - n);
                        if r.gen_bool(0.5) {
                            u0 -= (u0 - base) % (S / U);
                        }
                        match r.gen_range(0..100) {
                            0..=37 => COp::Read(u0, n),
                            38..=75 => {
                                ver += 1;
                                COp::Write(u0, n, ver, r.gen_bool(0.1))
                            }
                            76..=81 => {
                                let n = (LS / U) * r.gen_range(1..3);
                                let u0 = base + r.gen_range(0..window / (LS / U)) * (LS / U);
                                let n = n.min(base + window - u0);
                                COp::Write(u0, n, SHARED | r.gen_range(1..5), false)
                            }
                            82..=87 => COp::Zero(u0, n, r.gen_bool(0.2), r.gen_bool(0.5)),
                            88..=92 => COp::Flush,
                            93..=94 => COp::CtlFlush,
                            95..=96 if !mode_op => {
                                mode_op = true;
                                let modes: &[Mode] = match cfg.layout {
                                    Layout::Direct => &[
                                        Mode::WriteThrough,
                                        Mode::WriteBack,
                                        Mode::WriteAround,
                                        Mode::PassThrough,
                                    ],
                                    Layout::Log => {
                                        &[Mode::WriteThrough, Mode::WriteBack, Mode::PassThrough]
                                    }
                                };
                                COp::Mode(modes[r.gen_range(0..modes.len())])
                            }
                            _ => COp::Background,
                        }
                    })
                    .collect()
            })
            .collect();
        if faulty && r.gen_bool(0.3) {
            let t = r.gen_range(0..threads);
            let at = r.gen_range(0..=plans[t].len());
            let f = CFault::draw(&mut r, base * U, (base + window) * U, rig.cache_len);
            plans[t].insert(at, COp::Fault(f));
        }
        // A state an earlier fault left: requests may fail for it.
        let st0 = rig.vol().live().live_stats().volume;
        let lingering = st0.degraded || st0.cache_failed || !st0.lost_dirty_ranges.is_empty();
        let seq = AtomicU64::new(0);
        let barrier = std::sync::Barrier::new(threads);
        let vol = rig.vol();
        let (bh, ch) = (&rig.bh, &rig.ch);
        let done: Vec<Done> = std::thread::scope(|sc| {
            let hs: Vec<_> = plans
                .iter()
                .enumerate()
                .map(|(t, ops)| {
                    let (seq, barrier) = (&seq, &barrier);
                    sc.spawn(move || {
                        let v = vol.live();
                        barrier.wait();
                        let mut out = Vec::new();
                        for op in ops {
                            let data = match *op {
                                COp::Write(u0, n, ver, _) => units(u0, n, ver),
                                COp::Read(_, n) => vec![0u8; (n * U) as usize],
                                _ => Vec::new(),
                            };
                            let mut data = data;
                            let start = seq.fetch_add(1, SeqCst);
                            let res = match op {
                                COp::Write(u0, _, _, fua) => v.write(u0 * U, &data, *fua),
                                COp::Zero(u0, n, fua, t) => v.write_zeroes(u0 * U, n * U, *fua, *t),
                                COp::Read(u0, _) => v.read(u0 * U, &mut data),
                                COp::Flush => v.flush(),
                                COp::CtlFlush => v.flush_dirty(),
                                COp::Mode(m) => v.set_mode(*m),
                                COp::Background => vol.background().map_err(std::io::Error::other),
                                COp::Fault(f) => {
                                    f.inject(bh, ch);
                                    Ok(())
                                }
                            };
                            let end = seq.fetch_add(1, SeqCst);
                            out.push(Done {
                                thread: t,
                                op: op.clone(),
                                start,
                                end,
                                backoff: res.as_ref().is_err_and(sync_backoff),
                                lost: res.as_ref().err().and_then(|e| {
                                    tiercache_server::degrade::lost_range_of(e)
                                        .map(|l| (l.start, l.end))
                                }),
                                res: res.map_err(|e| e.to_string()),
                                data,
                            });
                        }
                        out
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        requests += done.len() as u64;
        let mut done = done;
        done.sort_by_key(|d| d.start);
        log.push(format!("round {round}:"));
        for d in &done {
            log.push(format!(
                "  [{:>2}..{:>2}] thread {}: {:?} -> {:?}",
                d.start, d.end, d.thread, d.op, d.res
            ));
        }
        let faults_at: Vec<u64> = done
            .iter()
            .filter(|d| matches!(d.op, COp::Fault(_)))
            .map(|d| d.start)
            .collect();
        if !faults_at.is_empty() {
            any_fault = true;
            cfault_count(0, faults_at.len() as u64);
            rig.bh.heal();
            rig.ch.heal();
        }
        check_clean(rig.vol()).map_err(|e| fail(&log, format!("round {round}: {e}")))?;
        let st1 = rig.vol().live().live_stats().volume;
        let lost1 = st1.lost_dirty_ranges.clone();
        // Every failure has a cause: a fault injected in this round before the request
        // ended, a state an earlier one left, the sync backoff, or data reported lost.
        for d in &done {
            let Err(e) = &d.res else { continue };
            // A range lost at the end of the round, or one the request was refused for: a
            // later write in the round may have taken it off the list (seed 10: a cache
            // sync failed late in round 17 dropped lines at the first request of round 18,
            // before any fault of that round). Either needs a fault earlier in the seed.
            let lost_meets = match d.op.bytes() {
                Some((a, b)) => {
                    lost1.iter().any(|&(x, y)| x < b && a < y)
                        || d.lost.is_some_and(|(x, y)| any_fault && x < b && a < y)
                }
                None => false,
            } || (d.op.flushes() && !lost1.is_empty());
            let why = if faults_at.iter().any(|&f| f < d.end) {
                1
            } else if lingering {
                2
            } else if d.backoff {
                3
            } else if lost_meets {
                4
            } else {
                return Err(fail(
                    &log,
                    format!(
                        "round {round}: thread {} {:?} [{}..{}] failed ({e}) with no fault injected before it ended in its round and none left by an earlier one",
                        d.thread, d.op, d.start, d.end
                    ),
                ));
            };
            cfault_count(why, 1);
        }
        // The round's writes per unit, and the durability points.
        let mut writes: std::collections::HashMap<u64, Vec<UnitWrite>> = Default::default();
        let mut fua_points: std::collections::HashMap<u64, u64> = Default::default();
        let mut point: Option<u64> = None;
        for d in &done {
            let ok = d.res.is_ok();
            let (u0, n, x, fua) = match d.op {
                COp::Write(u0, n, ver, fua) => (u0, n, Val::V(ver), fua),
                COp::Zero(u0, n, fua, _) => (u0, n, Val::Zero, fua),
                COp::Flush | COp::CtlFlush => {
                    if ok {
                        point = point.max(Some(d.start));
                    }
                    continue;
                }
                COp::Mode(to) => {
                    if !ok {
                        mode = None;
                        continue;
                    }
                    let durable = match cfg.layout {
                        Layout::Direct => to != Mode::WriteBack,
                        Layout::Log => mode.is_some_and(|m| m != to),
                    };
                    if durable {
                        point = point.max(Some(d.start));
                    }
                    mode = Some(to);
                    continue;
                }
                _ => continue,
            };
            for u in u0..u0 + n {
                writes.entry(u).or_default().push((d.start, d.end, x, ok));
                if fua && ok {
                    let p = fua_points.entry(u).or_insert(0);
                    *p = (*p).max(d.end);
                }
            }
        }
        for d in &done {
            let COp::Read(u0, n) = d.op else { continue };
            if d.res.is_err() {
                continue;
            }
            for k in 0..n {
                let u = u0 + k;
                let b = &d.data[(k * U) as usize..((k + 1) * U) as usize];
                let Some(ws) = writes.get(&u) else {
                    // Not written this round: stable, checked (and pinned) as ever.
                    if let Err(e) = m.check_unit(u, b) {
                        return Err(fail(&log, format!("round {round}: {:?}: {e}", d.op)));
                    }
                    continue;
                };
                let ok = allowed_in_round(&m.secs[u as usize].now, ws, d.start, d.end);
                if ok.contains(&Val::Any) {
                    continue;
                }
                let g = got_unit(b, u);
                let as_val = match g {
                    Got::Ver(v) => Some(Val::V(v)),
                    Got::Zero => Some(Val::Zero),
                    _ => None,
                };
                let racing: Vec<&UnitWrite> =
                    ws.iter().filter(|w| w.0 < d.end && d.start < w.1).collect();
                if !racing.is_empty() {
                    RACES[0].fetch_add(1, SeqCst);
                    if as_val.is_some_and(|x| racing.iter().all(|w| w.2 != x)) {
                        RACES[1].fetch_add(1, SeqCst);
                    }
                }
                if !as_val.is_some_and(|x| ok.contains(&x)) {
                    return Err(fail(
                        &log,
                        format!(
                            "round {round}: thread {} {:?} [{}..{}]: unit {u} (byte {}) read {g:?}, may read {ok:?}",
                            d.thread,
                            d.op,
                            d.start,
                            d.end,
                            u * U
                        ),
                    ));
                }
            }
        }
        // The model after the round.
        let mut next: Vec<(u64, Vals, Vals)> = Vec::with_capacity(writes.len());
        for (&u, ws) in &writes {
            let sec = &m.secs[u as usize];
            let now = to_vals(&allowed_in_round(&sec.now, ws, u64::MAX, u64::MAX));
            let p = point.max(fua_points.get(&u).copied());
            let durable = durable_after_round(&sec.now, &sec.durable, ws, p);
            next.push((u, now, durable));
        }
        if point.is_some() {
            m.flushed(&[]);
        }
        for (u, now, durable) in next {
            m.secs[u as usize] = Sec { now, durable };
            m.touch(u);
        }
        // Known gap `backoff-flip` (direct_write_failed_by_the_sync_backoff_reads_the_same_
        // after_a_restart): a direct write failed by the sync backoff may leave the backing
        // device newer than the cache's clean copy: its bytes may read either, and flip.
        if cfg.layout == Layout::Direct && known("backoff-flip") {
            for d in &done {
                let (true, COp::Write(u0, n, ..) | COp::Zero(u0, n, ..)) = (d.backoff, &d.op)
                else {
                    continue;
                };
                for u in *u0..*u0 + *n {
                    m.reset(u, Val::Any);
                }
            }
        }
        // Reported lost: anything (reads there fail until rewritten).
        if !faults_at.is_empty() {
            cfault_count(5, lost1.len() as u64);
        }
        for &(a, b) in &lost1 {
            for u in a / U..b.div_ceil(U) {
                m.reset(u, Val::Any);
            }
        }
        let failed = rig.vol().live().cache_failed();
        if !any_fault && (!lost1.is_empty() || failed) {
            return Err(fail(
                &log,
                format!(
                    "round {round}: lost {lost1:?}, cache failed {failed} with no fault injected"
                ),
            ));
        }
        // A restart now and then; a power cut often right after a round with a durability
        // point (what it promised is checked at once); always after the cache failed (the
        // backing file is checked, the cache formatted again).
        let restart = if failed {
            Some(r.gen_bool(0.5))
        } else if point.is_some() && r.gen_bool(0.3) {
            Some(true)
        } else {
            r.gen_bool(0.05).then(|| r.gen_bool(0.5))
        };
        if let Some(crash) = restart {
            restart_concurrent(&mut rig, &cfg, &mut m, crash, any_fault, &mut log)
                .map_err(|e| fail(&log, e))?;
            rig.open(&cfg, seed ^ (round as u64) << 20)
                .map_err(|e| fail(&log, format!("reopen failed: {e}")))?;
            // As stored (a switch cut by the power, a cache formatted again).
            mode = rig.vol().live().live_stats().volume.mode.parse().ok();
            if background {
                rig.start_bg();
            }
        }
    }
    // A clean restart, then every unit.
    restart_concurrent(&mut rig, &cfg, &mut m, false, any_fault, &mut log)
        .map_err(|e| fail(&log, e))?;
    rig.open(&cfg, seed ^ 0xfeed)
        .map_err(|e| fail(&log, format!("final reopen failed: {e}")))?;
    concurrent_read_all(&rig, &mut m).map_err(|e| fail(&log, e))?;
    Ok(requests)
}

/// After every round of the concurrent checker (on by default; `TIERCACHE_FAULT_MODEL_CHECK_CLEAN=0`
/// turns it off), every valid clean sector the direct layout caches must equal the backing
/// device's (what the clean-line sample checks at open). It found, within a round, what the
/// restart's sample found only at the end (s212: "1 of 28 clean cached lines sampled
/// differ"): the fault device's write cache hid a completed write from a read beside a sync
/// (`tests/fault_dev_race.rs`); and a write failed by a backing sync leaving a line it had
/// moved clean and older than the backing device (soak seeds 538, 572,
/// `direct_write_failed_by_a_backing_sync_leaves_no_clean_sector_differing`). Units of
/// failed writes are not left out: the volume keeps them equal too.
fn check_clean(v: &Vol) -> Result<(), String> {
    let Vol::D(v) = v else { return Ok(()) };
    if std::env::var("TIERCACHE_FAULT_MODEL_CHECK_CLEAN").as_deref() == Ok("0") {
        return Ok(());
    }
    let bad = v.clean_lines_differing().map_err(|e| e.to_string())?;
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "clean cached sectors differ from the backing device (line key, slot, sector mask): {bad:?}; lines {:?}",
        v.lines()
    ))
}

/// Stops the volume of a concurrent run (its background thread first): a power cut, or a
/// clean shutdown (which may fail once a fault was injected: then as a power cut). A cache
/// that failed is checked on the backing file and formatted again. The caller reopens.
fn restart_concurrent(
    rig: &mut Rig,
    cfg: &Cfg,
    m: &mut Model,
    crash: bool,
    any_fault: bool,
    log: &mut Vec<String>,
) -> Result<(), String> {
    rig.stop_bg();
    let vol = rig.vol.take().unwrap();
    let mut lost = vol.lost();
    let failed;
    if crash {
        failed = vol.live().cache_failed();
        rig.faults.power_cut();
        drop(vol);
        m.crashed();
        log.push(format!("power cut (cache failed {failed}, lost {lost:?})"));
    } else {
        let res = vol.live().shutdown();
        failed = vol.live().cache_failed();
        lost = vol.lost();
        drop(vol);
        rig.faults.process_exit();
        log.push(format!(
            "clean shutdown: {res:?} (cache failed {failed}, lost {lost:?})"
        ));
        match res {
            Ok(()) => m.flushed(&lost),
            Err(_) if any_fault => m.crashed(),
            Err(e) => return Err(format!("clean shutdown failed with no fault injected: {e}")),
        }
    }
    for &(a, b) in &lost {
        for u in a / U..b.div_ceil(U) {
            m.reset(u, Val::Any);
        }
    }
    if failed {
        cfault_count(6, 1);
        concurrent_after_cache_failure(rig, cfg, m, &lost)?;
        log.push("cache formatted again after its failure".into());
    }
    Ok(())
}

/// Session 13 item 1: several clients on one volume at once (2-4 threads, each 1-4 requests
/// per round, started together; ranges overlapping in a 64 KiB window half the time, else
/// anywhere in the hot region): writes (any 64-byte offset and length, FUA, dedup-prone
/// whole lines), write-zeroes, reads, FLUSH and `ctl flush` from one thread while others
/// write, a `ctl mode` switch, the direct layout's cleaning pass, between rounds clean
/// restarts and power cuts; both layouts, every mode. A read may return, per 64-byte unit,
/// the value before the round or that of a write that overlapped it ([`allowed_in_round`]),
/// nothing else; after a FLUSH is acknowledged, every write acknowledged before it began
/// survives a power cut ([`durable_after_round`]).
///
/// Session 14: faults too ([`CFault`]: backing read / write errors, ENOSPC, a failing sync
/// that drops the unsynced writes, syncs failing, cache read / write errors, a cache sync
/// dropping writes, the whole cache device failing), injected by a client thread in a third of the
/// rounds of two seeds in three, healed at the round's end. A request may fail only if a
/// fault began before it ended in its round, or an earlier one left the volume degraded,
/// failed or with lost ranges (or the sync backoff error, or a lost range it meets); a
/// failed write may or may not have landed; a range reported lost may read anything (reads
/// there fail) until rewritten; a failed cache is checked on the backing file and formatted
/// again. A quarter of the seeds of each layout run the volume's own background thread
/// (`start_background`: the direct layout's cleaner, the log layout's retries) beside the
/// clients. The seeds with no fault still require every request to succeed.
///
/// `TIERCACHE_FAULT_MODEL_CONCURRENT_SEEDS=N` (default 60, then seed 162 three times at the
/// soak's rounds; soak: 600 seeds of 3x the rounds),
/// `TIERCACHE_FAULT_MODEL_CONCURRENT_SEED=N` runs one seed 200 times (interleavings vary).
/// `TIERCACHE_FAULT_MODEL_CONCURRENT_BG=all|none`: the background thread in every seed / none.
#[test]
fn concurrent_clients_see_only_linearisable_values() {
    let soak = std::env::var("TIERCACHE_FAULT_SOAK").is_ok_and(|v| v != "0");
    let rounds = if soak { 120 } else { 40 };
    if let Ok(s) = std::env::var("TIERCACHE_FAULT_MODEL_CONCURRENT_SEED") {
        let seed: u64 = s
            .parse()
            .expect("TIERCACHE_FAULT_MODEL_CONCURRENT_SEED: a number");
        for _ in 0..200 {
            if let Err(e) = run_concurrent_seed(seed, rounds) {
                panic!("{e}");
            }
        }
        return;
    }
    let seeds: u64 = std::env::var("TIERCACHE_FAULT_MODEL_CONCURRENT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if soak { 600 } else { 60 });
    let t = std::time::Instant::now();
    let (mut requests, mut failures) = (0, Vec::new());
    // Soak seeds that found defects, at the soak's rounds, a few times each (interleavings
    // vary): 162 found a slot misdirection, a roll-back to half-done records and the flip of
    // a failed write's range (session 16-17).
    let regressions = [162u64; 3].map(|s| (s, 120));
    let runs = (0..seeds).map(|s| (s, rounds));
    for (seed, rounds) in runs.chain(regressions.into_iter().filter(|_| !soak)) {
        match run_concurrent_seed(seed, rounds) {
            Ok(n) => requests += n,
            Err(e) => {
                if failures.is_empty() {
                    eprintln!("{e}");
                }
                failures.push(seed);
            }
        }
    }
    let c = |k: usize| CFAULTS[k].load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "concurrent: {seeds} seeds x {rounds} rounds{}, {requests} requests, {} units read during a write of them ({} of those returned an older value), {:.1} s, failing seeds {failures:?}",
        if soak { "" } else { " + seed 162 x 3 at 120 rounds" },
        RACES[0].load(std::sync::atomic::Ordering::Relaxed),
        RACES[1].load(std::sync::atomic::Ordering::Relaxed),
        t.elapsed().as_secs_f64()
    );
    println!(
        "concurrent faults: {} injected; failed requests explained by a fault earlier in their round {}, by a state an earlier fault left {}, by the sync backoff {}, by a lost range {}; {} ranges reported lost at the end of a round with a fault; {} cache failures; {} rounds with the background thread",
        c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7)
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    let bg_none = std::env::var("TIERCACHE_FAULT_MODEL_CONCURRENT_BG").as_deref() == Ok("none");
    assert!(
        c(0) > seeds && c(1) > 0 && (c(7) > 0 || bg_none),
        "the concurrent faults or the background thread did not run"
    );
}

/// Found by the soak (seed 3562, direct layout, write-back): a write's plan reuses a slot
/// whose durable record must be unmapped first; that backing sync fails and drops a range
/// the cache does not hold (reported lost), and writing the lost-range list then fails its
/// cache sync, which fails the cache while the plan's steps have not run. The failed-cache
/// copy took the slot's planned-but-unwritten sectors for the line's data and wrote them
/// (zeroes here) to the backing device, reporting nothing lost: the head of the sector,
/// which the request never touched, read zero from then on.
#[test]
fn direct_cache_failing_mid_plan_never_copies_unwritten_slot_bytes() {
    let rig = rig_for(Layout::Direct, Mode::WriteBack, false);
    let v = rig.vol().live();
    v.set_max_cache_errors(1_000_000);
    // Every slot holds a clean line whose record is durable: a new line reuses one.
    for l in 0..32 {
        v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
    }
    v.flush_dirty().unwrap();
    // Written around the cache and not synced yet (a mode switch back to write-back does
    // not flush).
    v.set_mode(Mode::WriteAround).unwrap();
    v.write(50 * LS, &sectors(50 * LS / S, 8, 2), false)
        .unwrap();
    v.set_mode(Mode::WriteBack).unwrap();
    rig.bh.fail_next_sync(true);
    rig.ch.fail_next_sync(true);
    // Line 44 is not cached: the write fills the head of sector 358 from the backing device.
    let w = v.write_zeroes(183680, 640, false, false);
    let failed = v.cache_failed();
    let mut b = vec![0u8; 384];
    let got = v.read(183296, &mut b).map(|_| {
        (0..6)
            .map(|k| got_unit(&b[k * 64..(k + 1) * 64], 183296 / 64 + k as u64))
            .collect::<Vec<_>>()
    });
    assert!(
        matches!(&got, Ok(g) if g.iter().all(|x| *x == Got::Ver(0))) || got.is_err() && rig.vol().lost().iter().any(|&(a, b)| a < 183680 && 183296 < b),
        "bytes 183296..183680 (never written) after write-zeroes 183680+640 ({w:?}, cache failed {failed}, lost {:?}): read {got:?}, want version 0 or an error for a range reported lost",
        rig.vol().lost()
    );
}

/// Found by the concurrent checker with faults (soak seeds 130, 212, 310, 478, all direct):
/// a write that fails with the sync backoff error ("backing device syncs failing ... not
/// retried") reads back as the old bytes, yet after a restart (or an eviction, or the
/// cache failing) the same bytes read as the failed write's: a value that flips with no
/// write in between. Reproduced here in write-through (one write over cached and uncached
/// lines while backing syncs fail: the plan's backing write runs, the slot reuse's
/// sync gate fails fast, the cached line keeps its old clean copy; before the fix:
/// "WriteThrough: line 5 read Ok(Ver(1)) after the failed write (.. syncs failing ..),
/// Ok(Ver(3)) after a clean restart"); write-back passes here (soak seeds 212 and 310 were
/// write-back: another path). The concurrent checker steers around it (`backoff-flip`).
#[test]
fn direct_write_failed_by_the_sync_backoff_reads_the_same_after_a_restart() {
    let mut flips = Vec::new();
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        let mut rig = rig_for(Layout::Direct, mode, false);
        let cfg = Cfg {
            layout: Layout::Direct,
            mode,
            ..cfg_for(1, 0)
        };
        let v = rig.vol().live();
        v.set_max_cache_errors(1_000_000);
        // Every slot holds a clean line whose record is durable: a new line reuses one,
        // which needs a backing sync first.
        for l in 0..32 {
            v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
        }
        v.flush_dirty().unwrap();
        rig.bh.fail_syncs();
        // New lines: their slot reuses fail on the sync; from the second on, fast.
        let mut fails = Vec::new();
        for l in 40..44 {
            fails.push(v.write(l * LS, &sectors(l * LS / S, 8, 2), false).is_err());
        }
        // Lines 5..=45 in one write: 5-31 cached, the rest not.
        let w = v.write(5 * LS, &sectors(5 * LS / S, 8 * 41, 3), false);
        let before = read_or_lost(rig.vol(), 5 * LS / S);
        rig.bh.heal();
        let vol = rig.vol.take().unwrap();
        let down = vol.live().shutdown();
        drop(vol);
        rig.faults.process_exit();
        rig.open(&cfg, 9).unwrap();
        let after = read_or_lost(rig.vol(), 5 * LS / S);
        if before != after {
            flips.push(format!(
                "{mode:?}: line 5 read {before:?} after the failed write ({w:?}; earlier writes failed {fails:?}), {after:?} after a clean restart ({down:?}), with no write between"
            ));
        }
    }
    assert!(flips.is_empty(), "{}", flips.join("\n"));
}

/// A plan that evicts lines it has just written (one write over more lines than the cache
/// holds: hits first, then new lines taking the slots of lines it wrote a moment ago): the
/// evicted lines' write-backs depend on the plan's own cache writes, so they ran in its
/// second phase, after the backing sync that the slot reuse needs, and the hit's cache write
/// unmapped their records before they were written back. Write-back and write-through; every
/// slot a dirty (write-back) line whose record is durable (a FLUSH), then one write over
/// lines 5..=45 (41 lines, 32 slots): lines 0-4 must read version 1, 5-31 version 1 or 3,
/// 32-45 version 0 or 3, nothing reported lost, and the same after a clean restart, in three
/// cases: (a) the second backing sync from the write on fails and the next one too (both
/// dropping the unsynced writes; brief h-flipwb item 2), (b) a power cut right after the
/// write, (c) the first backing sync from the write on fails.
///
/// Before the fix, write-back, (a): "write Ok(()) .. reported lost [(20480, 57344)]"
/// (lines 5-13: an acknowledged write, and the acknowledged, flushed version 1 before it,
/// gone); (b) lines 5-13 read version 0 after the power cut (the flushed version 1 lost).
#[test]
fn direct_plan_evicting_lines_it_wrote_loses_nothing_when_syncs_fail_or_the_power_goes() {
    let mut problems = Vec::new();
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        for case in ['a', 'b', 'c'] {
            let mut rig = rig_for(Layout::Direct, mode, false);
            let cfg = Cfg {
                layout: Layout::Direct,
                mode,
                ..cfg_for(1, 0)
            };
            let v = rig.vol().live();
            v.set_max_cache_errors(1_000_000);
            for l in 0..32 {
                v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
            }
            v.flush().unwrap();
            match case {
                'a' => rig.bh.fail_nth_sync(2, true),
                'c' => rig.bh.fail_next_sync(true),
                _ => {}
            }
            let w = v.write(5 * LS, &sectors(5 * LS / S, 8 * 41, 3), false);
            let injected = rig.bh.injected();
            let (mut f1, mut f2) = (None, None);
            if case == 'b' {
                rig.stop_bg();
                let vol = rig.vol.take().unwrap();
                rig.faults.power_cut();
                drop(vol);
                rig.open(&cfg, 8).unwrap();
            } else {
                // The next sync fails too, and drops what it should have made durable.
                rig.bh.fail_next_sync(true);
                f1 = Some(v.flush());
                rig.bh.heal();
                f2 = Some(v.flush());
            }
            let allowed = |s: u64| -> &'static [u64] {
                match s / (LS / S) {
                    0..=4 => &[1],
                    5..=31 => &[1, 3],
                    32..=45 => &[0, 3],
                    _ => &[0],
                }
            };
            let read_all = |rig: &Rig| -> Vec<Result<Got, bool>> {
                (0..48 * LS / S)
                    .map(|s| read_or_lost(rig.vol(), s))
                    .collect()
            };
            let before = read_all(&rig);
            let lost = rig.vol().lost();
            let vol = rig.vol.take().unwrap();
            let down = vol.live().shutdown();
            drop(vol);
            rig.faults.process_exit();
            rig.open(&cfg, 9).unwrap();
            let after = read_all(&rig);
            let head = format!(
                "{mode:?} ({case}): write {w:?} (syncs failed by injection: {injected}), FLUSH {f1:?}, FLUSH after the heal {f2:?}, shutdown {down:?}"
            );
            if !lost.is_empty() {
                problems.push(format!("{head}: reported lost {lost:?}"));
            }
            for (s, (b, a)) in before.iter().zip(&after).enumerate() {
                let s = s as u64;
                let ok =
                    |g: &Result<Got, bool>| matches!(g, Ok(Got::Ver(x)) if allowed(s).contains(x));
                if !ok(b) || b != a {
                    problems.push(format!(
                        "{head}: sector {s} (line {}) read {b:?}, after a clean restart {a:?}; may read {:?}",
                        s / (LS / S),
                        allowed(s)
                    ));
                    break;
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Soak seeds 572 and 538 (both write-through at the time) with the clean-sector check
/// (`TIERCACHE_FAULT_MODEL_CHECK_CLEAN=1`): one write over a new line and a line the cache
/// held, whose plan evicts the held line for the new one and admits it again into another
/// slot. Its backing-first phase writes both lines, then the backing sync the slot reuse
/// needs fails: the plan is rolled back (the held line back in its old slot, old bytes,
/// clean), but the held line's range was counted as a new line's write of durable bytes and
/// taken off the unsynced list, so the failed sync did not write the old bytes again over
/// the failed write's. A sync failing without dropping left the backing device newer than
/// the clean cached copy: line 33 read version 1, then version 3 after its eviction or a
/// restart. Both ways of failing (dropping the unsynced writes or not), write-through and
/// write-around (there a FUA write: write-around admits no write miss): the failed write
/// may read old or new, but the same before and after eviction and restart, and no clean
/// cached sector differs from the backing device. Before the fix (write-through, not
/// dropping): "clean cached sectors differ ...: [(33, 0, 15)]", "line 33 read Ok(Ver(1))
/// after the failed write, Ok(Ver(3)) after its eviction, Ok(Ok(Ver(3))) after a clean
/// restart".
#[test]
fn direct_write_failed_by_a_backing_sync_leaves_no_clean_sector_differing() {
    let mut problems = Vec::new();
    for mode in [Mode::WriteThrough, Mode::WriteAround] {
        for dropping in [false, true] {
            let mut rig = rig_for(Layout::Direct, mode, false);
            let cfg = Cfg {
                layout: Layout::Direct,
                mode,
                ..cfg_for(1, 0)
            };
            let Vol::D(d) = rig.vol() else { unreachable!() };
            let d = d.clone();
            let v = rig.vol().live();
            v.set_max_cache_errors(1_000_000);
            // Line 33 first (the least recently used), then lines 0..=30: every slot holds
            // a clean line at version 1 whose record is durable.
            v.set_mode(Mode::WriteThrough).unwrap();
            for l in [33].into_iter().chain(0..31) {
                v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
            }
            v.flush().unwrap();
            v.set_mode(mode).unwrap();
            assert!(
                d.lines().iter().any(|l| l.key == 33 && l.valid == 255),
                "{mode:?}: line 33 is cached"
            );
            rig.bh.fail_next_sync(dropping);
            // Line 32 (new) takes line 33's slot, then line 33 (sectors 0-3 written) is
            // admitted again elsewhere.
            // Write-around admits no write miss (no slot reuse, no sync in the plan): there
            // the write is FUA, failed by the sync after its plan.
            let fua = mode == Mode::WriteAround;
            let w = v.write(32 * LS, &sectors(32 * LS / S, 12, 3), fua);
            rig.bh.heal();
            let head =
                format!("{mode:?}, failed sync dropping {dropping}: write (FUA {fua}) {w:?}");
            if w.is_ok() {
                problems.push(format!("{head}: the injected sync failure did not fail it"));
                continue;
            }
            let differing = d.clean_lines_differing().unwrap();
            if !differing.is_empty() {
                problems.push(format!(
                    "{head}: clean cached sectors differ from the backing device (line key, slot, sector mask): {differing:?}"
                ));
            }
            let s = 33 * LS / S;
            let (first, evicted, restarted, down) = read_evicted_restarted(&mut rig, &cfg, s);
            let ok = matches!(first, Ok(Got::Ver(1 | 3)));
            if !ok || evicted != first || restarted.as_ref().ok() != Some(&first) {
                problems.push(format!(
                    "{head}: sector 132 (line 33) read {first:?} after the failed write, {evicted:?} after its eviction, {restarted:?} after a clean restart ({down:?}); may read version 1 or 3, the same each time"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Soak seed 70 with the clean-sector check (write-through, `BackingNthWrite`): one write
/// over the tail of a cached line and the head of a new one runs a backing write for each;
/// the first lands, the second fails. The plan is rolled back (nothing in the cache had
/// changed): the cached line keeps its old bytes as clean while the backing device holds
/// the failed write's, so the line reads old, then new once evicted or after a restart.
/// The failed write may read old or new, but the same each time, and no clean cached
/// sector may differ from the backing device.
#[test]
fn direct_write_failed_by_a_backing_write_leaves_no_clean_sector_differing() {
    let mut rig = rig_for(Layout::Direct, Mode::WriteThrough, false);
    let cfg = Cfg {
        layout: Layout::Direct,
        mode: Mode::WriteThrough,
        ..cfg_for(1, 0)
    };
    let Vol::D(d) = rig.vol() else { unreachable!() };
    let d = d.clone();
    let v = rig.vol().live();
    v.set_max_cache_errors(1_000_000);
    let s = 31 * LS / S + 7;
    for l in 0..31 {
        v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
    }
    // Line 31 holds sector 7 only.
    v.write(s * S, &sectors(s, 1, 1), false).unwrap();
    v.flush().unwrap();
    rig.bh.fail_nth_write(2, false);
    // From the middle of sector 6 of line 31 (its head filled from the backing device
    // between the two backing writes) to the middle of sector 3 of line 32 (new).
    let u0 = (s - 1) * (S / U) + 3;
    let w = v.write(u0 * U, &units(u0, 5 + 8 + 3 * 8 + 3, 3), false);
    rig.bh.heal();
    assert!(
        w.is_err(),
        "the injected write error did not fail the write"
    );
    let differing = d.clean_lines_differing().unwrap();
    let (first, evicted, restarted, down) = read_evicted_restarted(&mut rig, &cfg, s);
    assert!(
        differing.is_empty()
            && matches!(first, Ok(Got::Ver(1 | 3)))
            && evicted == first
            && restarted.as_ref().ok() == Some(&first),
        "write {w:?}: clean cached sectors differing from the backing device {differing:?}; sector {s} (line 31) read {first:?} after the failed write, {evicted:?} after its eviction, {restarted:?} after a clean restart ({down:?}); may read version 1 or 3, the same each time"
    );
}

/// What sector `s` reads now, after lines 40..80 were read (every line cached before is
/// evicted; write-around admits read misses too), and after a clean restart (or the reopen
/// error); and the shutdown's result.
#[allow(clippy::type_complexity)]
fn read_evicted_restarted(
    rig: &mut Rig,
    cfg: &Cfg,
    s: u64,
) -> (
    Result<Got, bool>,
    Result<Got, bool>,
    Result<Result<Got, bool>, String>,
    std::io::Result<()>,
) {
    let first = read_or_lost(rig.vol(), s);
    let mut b = vec![0u8; LS as usize];
    for l in 40..80 {
        rig.vol().live().read(l * LS, &mut b).unwrap();
    }
    let evicted = read_or_lost(rig.vol(), s);
    let vol = rig.vol.take().unwrap();
    let down = vol.live().shutdown();
    drop(vol);
    rig.faults.process_exit();
    let restarted = rig.open(cfg, 9).map(|()| read_or_lost(rig.vol(), s));
    (first, evicted, restarted, down)
}

/// A read never needs a backing sync, so the sync backoff never fails one (task
/// h-readbackoff; checker seeds 188 and 548). Every slot holds a line whose record is
/// durable (write-back: dirty; write-through: clean), then two FLUSHes fail on the backing
/// sync with nothing written to the backing device since the last good one: the backoff
/// runs.
/// A read over four lines that miss must still return their bytes (version 0, the backing
/// device's), and the cached lines theirs; after the heal the same.
///
/// Before the fix: "WriteBack: read of lines 40..44 while syncs fail: backing device syncs
/// failing (1 failures, ...); not retried for ..." (the read admitted its lines, reusing
/// slots after write-backs of the dirty lines there, and the plan was refused by the
/// backoff: read admission was blocked only while backing writes were unsynced).
#[test]
fn direct_read_misses_are_served_while_the_sync_backoff_runs() {
    let mut problems = Vec::new();
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        let rig = rig_for(Layout::Direct, mode, false);
        let v = rig.vol().live();
        v.set_max_cache_errors(1_000_000);
        for l in 0..32 {
            v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
        }
        v.flush().unwrap();
        rig.bh.fail_syncs();
        // The first failure leaves a retry due at once, the second starts the backoff.
        for _ in 0..2 {
            assert!(
                v.flush().is_err(),
                "{mode:?}: the FLUSH's backing sync fails"
            );
        }
        let check = |when: &str, problems: &mut Vec<String>| {
            let mut buf = vec![0u8; 4 * LS as usize];
            match v.read(40 * LS, &mut buf) {
                Ok(()) => {
                    for s in 0..4 * LS / S {
                        let got = got_at(
                            &buf[(s * S) as usize..((s + 1) * S) as usize],
                            40 * LS / S + s,
                        );
                        if got != Got::Ver(0) {
                            problems.push(format!(
                                "{mode:?}: {when}: sector {} read {got:?}",
                                40 * LS / S + s
                            ));
                            break;
                        }
                    }
                }
                Err(e) => problems.push(format!("{mode:?}: read of lines 40..44 {when}: {e}")),
            }
            for l in [0, 7, 31] {
                let got = read_ver(v, l * LS / S);
                if got != Got::Ver(1) {
                    problems.push(format!("{mode:?}: {when}: line {l} read {got:?}"));
                }
            }
        };
        check("while syncs fail", &mut problems);
        rig.bh.heal();
        check("after the heal", &mut problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Checker seeds 2112 and 162 (concurrent): a write-through write that fails at the
/// backing sync its slot reuse needs leaves its bytes in the backing device's write cache,
/// where a client reads them; the next failed sync drops them and the range read the older
/// bytes - the value flipped back. The failed write may read old or new, but once a read
/// returned the new bytes only they or a lost-range error may follow. A new line (32)
/// takes the slot of a clean line (33) whose record is durable; a sync that fails without
/// dropping fails the write, then one that drops. Before the fix: "sector 260 read
/// Ok(Ver(3)) after the failed write, Ok(Ver(0)) after a second failed sync".
#[test]
fn direct_write_failed_at_a_backing_sync_never_flips_back_after_the_next_failed_sync() {
    let rig = rig_for(Layout::Direct, Mode::WriteThrough, false);
    let v = rig.vol().live();
    v.set_max_cache_errors(1_000_000);
    for l in [33].into_iter().chain(0..31) {
        v.write(l * LS, &sectors(l * LS / S, 8, 1), false).unwrap();
    }
    v.flush().unwrap();
    rig.bh.fail_next_sync(false);
    let w = v.write(32 * LS, &sectors(32 * LS / S, 8, 3), false);
    rig.bh.heal();
    assert!(
        w.is_err(),
        "the injected sync failure did not fail the write"
    );
    let s = 32 * LS / S + 4;
    let first = read_or_lost(rig.vol(), s);
    rig.bh.fail_next_sync(true);
    let f = v.flush();
    rig.bh.heal();
    let second = read_or_lost(rig.vol(), s);
    let ok = match first {
        Ok(Got::Ver(3)) => matches!(second, Ok(Got::Ver(3)) | Err(true)),
        Ok(Got::Ver(0)) => matches!(second, Ok(Got::Ver(0 | 3)) | Err(true)),
        _ => false,
    };
    assert!(
        ok,
        "sector {s} read {first:?} after the failed write, {second:?} after a second failed sync (flush {f:?}); may read version 0 or 3, then the same or a lost-range error"
    );
}
