//! Crash points, enumerated, for both live layouts with one harness (issue 19 item 6). A
//! seeded workload of reads, partial/unaligned writes, FUA writes, trims, FLUSHes and (direct
//! layout) cleaning passes runs through a volume of either layout — driven only through the
//! one contract, [`LiveVolume`] — on devices wrapped by `tiercache_server::fault`, which
//! number every write and sync of both devices. For a crash point N the power is cut at event
//! N: that call fails (torn, when it is a write: a random subset of its sectors lands),
//! everything later fails, and writes not synced by then land sector by sector at random
//! (both devices model a volatile write cache). The volume is then reopened on the files and
//! checked against a reference model, the same checks for both layouts:
//! * every byte acknowledged before the last completed FLUSH, or written with FUA, reads back
//!   exactly (bytes written since may read old or new);
//! * no byte reads back a value never written there (checked for trimmed bytes too);
//! * stable: every byte of the hot area reads the same after the restart and again once
//!   its line has been evicted (dirty lines written back on the way);
//! * the reopened volume keeps working.
//!
//! A second set of points cuts the power during writes to the metadata area (direct: the
//! records; log: the journal) and tears them at 8-byte granularity (a device without atomic
//! sector writes): records torn that way must be caught by their checksums and dropped, and
//! still no byte may read a never-written value. A third set (issue 14) fails the Nth write
//! to the backing device (a write-back of cleaning, an eviction or a reclaim; a write-through
//! write; every later one too for even N), lets the workload go on (refused writes may read
//! old or new bytes; the volume keeps serving and the cache is not failed), then cuts the
//! power (even N) or stops cleanly with `shutdown` (odd N), and checks the same after a
//! restart with a healthy backing device.
//!
//! Each layout adds its own checks through [`Layout`]'s hooks:
//! * direct (five modes, with and without data checksums, with chunk rewrites): clean valid
//!   lines not changed since the last FLUSH come back (warm restart); `tiercache check`'s
//!   library finds no inconsistency on the crashed device; with data checksums no read finds
//!   a checksum mismatch after recovery;
//! * log (write-through and write-back; ten 4-line segments, lz4 or zstd, dedup, a small
//!   journal for every third seed so checkpoints happen): the engine's invariant check passes
//!   after recovery; in write-through the lines still cached hold what the backing device
//!   holds; some crash leaves an open segment for the journal to recover.
//!
//! Default: direct 250 sector-torn points plus 50 sub-sector points over the five modes; log
//! 200 + 40 over two modes. `TIERCACHE_CRASH_LONG=1`: 10,000 (direct) and 4,000 (log) points
//! (or `TIERCACHE_CRASH_POINTS=N`). A failure names the layout, mode, seed and crash point;
//! rerun one with the test's name and `TIERCACHE_CRASH_ONLY=mode:seed:N` (`metaN` for the
//! metadata points).

mod common;

use common::*;
use rand::Rng;
use std::collections::HashSet;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::check::check_device;
use tiercache_server::fault::Faults;
use tiercache_server::format::META_OFFSET;
use tiercache_server::log_format::JOURNAL_OFFSET;
use tiercache_server::{
    format_log, BlockDev, CacheVolume, FileDev, LineState, LiveVolume, LogFormatOptions, LogVolume,
    OpenOptions, SteppedClean, Superblock,
};

#[derive(Clone, Debug)]
enum Act {
    Read(u64, u64),
    Write(u64, Vec<u8>, bool),
    Trim(u64, u64),
    Flush,
    /// A cleaning pass (the direct layout's workload; the log layout reclaims on its own).
    Clean,
    /// A cleaning pass of at most N lines, begun (lines pinned, the lock released) and held
    /// before its I/O; then `CleanIo` (cache reads, backing writes, no lock) and
    /// `CleanCommit`, with requests in between (the direct layout's stepped workload).
    CleanBegin(u64),
    /// As `CleanBegin`, an unmap-ahead pass: its dirty likely victims written back outside
    /// the lock, their records unmapped at `CleanCommit`.
    UnmapBegin,
    CleanIo,
    CleanCommit,
    /// Backing syncs fail from now on (until `Heal`).
    SyncsFail,
    /// The next backing sync fails and drops the backing device's unsynced writes.
    SyncFailDrop,
    /// No more injected backing errors.
    Heal,
}

/// Where to cut the power.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// At the Nth write or sync of either device; a write is torn by sectors.
    Event(u64),
    /// At the Nth write to the cache's metadata area (direct: records; log: journal), torn at
    /// 8-byte granularity.
    Meta(u64),
    /// The Nth backing write fails (see the module doc).
    BackingWrite(u64),
}

/// Values each byte of the hot area has ever held (initial or written): 256 bits per byte.
struct Ever(Vec<[u64; 4]>);

impl Ever {
    fn new(hot: u64) -> Ever {
        Ever(
            (0..hot)
                .map(|i| {
                    let mut s = [0u64; 4];
                    let v = initial(i);
                    s[v as usize / 64] |= 1 << (v % 64);
                    s
                })
                .collect(),
        )
    }
    fn add(&mut self, at: u64, data: &[u8]) {
        for (k, &v) in data.iter().enumerate() {
            self.0[at as usize + k][v as usize / 64] |= 1 << (v % 64);
        }
    }
    fn has(&self, i: usize, v: u8) -> bool {
        self.0[i][v as usize / 64] >> (v % 64) & 1 == 1
    }
}

/// What the points of one sweep found (each layout fills its own figures).
#[derive(Default)]
struct Tally {
    points: u64,
    crashed_in_open: u64,
    checked: u64,
    /// Bytes read the same after the restart and after their line was evicted.
    stable_bytes: u64,
    /// Backing-error points: injected failures, refused requests, runs left degraded.
    backing_errors: u64,
    refused: u64,
    degraded: u64,
    // Direct layout.
    unchanged_lines: u64,
    unchanged_restored: u64,
    /// Clean lines dropped at open because their cache copy differed from the backing
    /// device (a write in flight at the crash reached one device only; `CacheVolume::open`
    /// compares clean lines with the backing device): not restored, rightly.
    dropped_differing: u64,
    bad_checksums: u64,
    duplicates: u64,
    /// Log layout with reclamation settings: extents reinserted and segments discarded in
    /// the uncrashed runs (the mechanism the points cover ran).
    reinserted: u64,
    discards: u64,
    /// Records unmapped ahead in batches (runs without a crash): the batched path ran.
    unmapped_ahead: u64,
    /// Chunk rewrites in the uncrashed runs (which count the events the points cover).
    chunk_rewrites: u64,
    /// Stepped passes (`Act::CleanBegin`/`UnmapBegin` .. `CleanCommit`): the events each
    /// spans (first, last), whether its write-back was in flight outside the lock, and
    /// whether it was an unmap-ahead pass.
    stepped: Vec<(u64, u64, bool, bool)>,
    /// In the uncrashed runs: write-backs outside the lock, requests that waited for one,
    /// passes cut short by a waiting request.
    unlocked_writebacks: u64,
    writeback_waits: u64,
    writeback_yields: u64,
    /// Failing-sync runs: the event spans of each window of failing backing syncs (from the
    /// failure to a few events after the heal), injected sync failures, requests refused
    /// meanwhile, runs degraded at some point.
    sync_windows: Vec<(u64, u64)>,
    sync_failures: u64,
    /// Ranges reported lost and tolerated ([`Layout::lost_ok`]), runs with any.
    lost_ranges: u64,
    lost_runs: u64,
    // Log layout.
    recovered_open_segments: u64,
    stale_records: u64,
}

/// One layout under the harness: how to make, open, exercise and judge its volume. The data
/// path, flush, shutdown, degradation and failure state go through [`LiveVolume`].
trait Layout {
    type Vol: LiveVolume;
    /// What the open after a crash found.
    type Report: std::fmt::Debug;
    /// Per-run state of the layout's own checks (the direct layout's warm lines).
    type Watch: Default;

    fn name(&self) -> String;
    /// Requests land in the first `hot()` bytes.
    fn hot(&self) -> u64;
    fn budget(&self) -> u64;
    /// The multiplier of the seed that seeds the fault wrappers (which sectors land).
    fn fault_mul(&self) -> u64;
    /// Points per seed, the salt of their choice, the first seeds of the metadata and backing
    /// sweeps, and the share of the budget the backing sweep gets (1/N).
    fn sweep_params(&self) -> (u64, u64, u64, u64, u64);
    /// Fresh files formatted in `mode` for `seed`, and the metadata range the 8-byte tears hit.
    fn setup(&self, mode: Mode, seed: u64) -> (Files, Range<u64>);
    fn open(&self, cache: Box<dyn BlockDev>, backing: Box<dyn BlockDev>) -> io::Result<Self::Vol>;
    fn workload(&self, seed: u64) -> Vec<Act>;
    /// Runs once after the open, before the workload.
    fn started(&self, _v: &Self::Vol) {}
    /// A cleaning pass: `Ok(true)` when it made every byte durable (a full flush).
    fn clean(&self, _v: &Self::Vol) -> io::Result<bool> {
        Ok(false)
    }
    /// A step of a stepped cleaning pass (`Act::CleanBegin`, `CleanIo`, `CleanCommit`);
    /// returns whether the pass has a write-back in flight outside the lock.
    fn clean_step(&self, _v: &Arc<Self::Vol>, act: &Act, _w: &mut Self::Watch) -> io::Result<bool> {
        unreachable!("{act:?}: only the direct layout steps a cleaning pass")
    }
    /// After each request (`durable`: everything acknowledged is durable now).
    fn after_op(&self, _v: &Self::Vol, _act: &Act, _durable: bool, _w: &mut Self::Watch) {}
    /// Which requests may fail while the backing device fails (the volume going on), and
    /// the layout's own check of that error.
    fn refusal(&self, act: &Act, e: &io::Error) -> Result<(), String>;
    /// A run without a crash ends: the layout's figures and checks, before its shutdown.
    fn uncrashed(&self, _v: &Self::Vol, _seed: u64, _what: &str, _t: &mut Tally) {}
    /// The crashed devices, before the reopen (the offline check).
    fn crashed(&self, _f: &Files, _what: &str, _t: &mut Tally) {}
    fn reopen(&self, f: &Files, what: &str) -> (Self::Vol, Self::Report);
    /// Right after the reopen: the layout's own recovery checks (`clean_ok`: the volume was
    /// shut down cleanly, or the crash came during its open).
    fn reopened(
        &self,
        v: &Self::Vol,
        rep: &Self::Report,
        w: Self::Watch,
        clean_ok: bool,
        what: &str,
        t: &mut Tally,
    );
    /// Whether ranges the volume reports lost after failing backing syncs are tolerated
    /// (a known defect, counted) rather than a failure.
    fn lost_ok(&self) -> bool {
        false
    }
    /// Whether every flushed byte must read back exactly (not only "never a value never
    /// written") after this crash in this mode.
    fn strict(&self, _crash: Crash, _mode: Mode) -> bool {
        true
    }
    /// Evicts every hot line (dirty ones written back) and says how much was evicted.
    fn evict(&self, v: &Self::Vol, mode: Mode, what: &str, t: &mut Tally);
    /// After the stability check: the layout's last checks of the recovered volume (`buf`:
    /// the whole volume as read after the restart).
    fn finish(&self, _v: &Self::Vol, _f: &Files, _buf: &[u8], _mode: Mode, _what: &str) {}
    /// The sweep's figures, for the log line, and that the sweep bit (`sub`: the metadata
    /// points).
    fn summary(&self, t: &Tally, sub: &Tally) -> String;
    fn assert_bit(&self, mode: Mode, t: &Tally, sub: &Tally);
}

/// Runs the workload of `seed` in `mode`; with a crash point cuts the power there, recovers
/// and checks. Returns how many events and metadata writes the run made (backing writes
/// twice in a `backing_sweep`).
fn run<L: Layout>(
    l: &L,
    mode: Mode,
    seed: u64,
    crash: Option<Crash>,
    backing_sweep: bool,
    t: &mut Tally,
) -> (u64, u64) {
    let what = format!(
        "{} {mode:?} seed {seed} crash point {crash:?} (rerun: TIERCACHE_CRASH_ONLY={}:{seed}:{})",
        l.name(),
        mode.as_str(),
        match crash {
            Some(Crash::Event(n)) => n.to_string(),
            Some(Crash::Meta(n)) => format!("meta{n}"),
            // With the test's name: the event sweeps read the same string.
            Some(Crash::BackingWrite(n)) => n.to_string(),
            None => "-".into(),
        }
    );
    let backing_error = match crash {
        Some(Crash::BackingWrite(n)) => Some(n),
        _ => None,
    };
    let hot = l.hot();
    let (f, meta) = l.setup(mode, seed);
    let faults = Faults::new(seed.wrapping_mul(l.fault_mul()) ^ format!("{crash:?}").len() as u64);
    match crash {
        Some(Crash::Event(n)) => faults.crash_at(n, true),
        Some(Crash::Meta(n)) => {
            faults.crash_at_write_to(n, "cache", meta);
            faults.set_tear_bytes(8);
        }
        None | Some(Crash::BackingWrite(_)) => faults.crash_at_write_to(u64::MAX, "cache", meta),
    }
    let (cdev, _) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), true);
    let (bdev, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let mut m = Model::new(0, VOL);
    let mut ever = Ever::new(hot);
    let mut watch = L::Watch::default();
    // Shared with a stepped cleaning pass's thread.
    let vol = match l.open(Box::new(cdev), Box::new(bdev)) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            assert!(
                faults.power_lost(),
                "{what}: open failed without a crash: {e}"
            );
            t.crashed_in_open += 1;
            None
        }
    };
    if let (Some(n), Some(_)) = (backing_error, &vol) {
        bh.fail_nth_write(n, n.is_multiple_of(2));
    }
    let acts = l.workload(seed);
    // Windows of failing backing syncs: requests may be refused from the first on (the
    // volume may stay degraded after the heal), nothing acknowledged may be lost.
    let sync_run = acts
        .iter()
        .any(|a| matches!(a, Act::SyncsFail | Act::SyncFailDrop));
    let mut sync_trouble = false;
    if let Some(vol) = &vol {
        l.started(vol);
        for (i, act) in acts.into_iter().enumerate() {
            let mut durable = false;
            let r = match &act {
                Act::Read(o, n) => {
                    let mut buf = vec![0u8; *n as usize];
                    let r = vol.read(*o, &mut buf);
                    if r.is_ok() {
                        m.check_now(*o as usize, &buf, &format!("{what}: op {i} read"));
                    }
                    r
                }
                Act::Write(o, d, fua) => {
                    ever.add(*o, d);
                    let r = vol.write(*o, d, *fua);
                    // A write that failed may have landed in part: old or new, not durable;
                    // refused for the backing device, old or new even after a FLUSH.
                    if r.is_err() && (backing_error.is_some() || sync_trouble) {
                        m.trim(*o as usize, d.len());
                    } else {
                        m.write(*o as usize, d, *fua && r.is_ok());
                    }
                    durable = *fua && r.is_ok();
                    r
                }
                Act::Trim(o, n) => {
                    m.trim(*o as usize, *n as usize);
                    vol.trim(*o, *n)
                }
                Act::Flush => {
                    let r = vol.flush();
                    if r.is_ok() {
                        m.flush();
                        durable = true;
                    }
                    r
                }
                Act::Clean => match l.clean(vol) {
                    Ok(full) => {
                        if full {
                            m.flush();
                            durable = true;
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                Act::CleanBegin(_) | Act::UnmapBegin | Act::CleanIo | Act::CleanCommit => {
                    if matches!(act, Act::CleanBegin(_) | Act::UnmapBegin) {
                        let unmap = matches!(act, Act::UnmapBegin);
                        t.stepped.push((faults.events() + 1, 0, false, unmap));
                    }
                    let r = l.clean_step(vol, &act, &mut watch);
                    let s = t.stepped.last_mut().expect("a pass begun");
                    s.1 = faults.events();
                    s.2 |= *r.as_ref().unwrap_or(&false);
                    r.map(|_| ())
                }
                Act::SyncsFail | Act::SyncFailDrop => {
                    sync_trouble = true;
                    t.sync_windows.push((faults.events() + 1, 0));
                    match act {
                        Act::SyncsFail => bh.fail_syncs(),
                        _ => bh.fail_next_sync(true),
                    }
                    Ok(())
                }
                Act::Heal => {
                    if let Some(w) = t.sync_windows.last_mut() {
                        w.1 = faults.events();
                    }
                    bh.heal();
                    Ok(())
                }
            };
            if std::env::var("TIERCACHE_CRASH_VERBOSE").is_ok() {
                let d = match &act {
                    Act::Write(o, d, f) => format!("write {o}+{} fua {f}", d.len()),
                    a => format!("{a:?}"),
                };
                eprintln!(
                    "op {i} {d} -> {:?}, {} events",
                    r.as_ref().err(),
                    faults.events()
                );
            }
            l.after_op(vol, &act, durable, &mut watch);
            if let Err(e) = r {
                if backing_error.is_some() {
                    // Refused for the backing device: the volume goes on, the cache is not
                    // failed.
                    l.refusal(&act, &e)
                        .unwrap_or_else(|why| panic!("{what}: op {i} {act:?}: {why}"));
                    assert!(
                        !vol.cache_failed(),
                        "{what}: op {i}: backing errors failed the cache: {e}"
                    );
                    t.refused += 1;
                    continue;
                }
                if sync_trouble && !faults.power_lost() {
                    // Refused while backing syncs fail (or the volume is still degraded):
                    // the volume goes on, the cache is not failed.
                    assert!(
                        !vol.cache_failed(),
                        "{what}: op {i}: failing backing syncs failed the cache: {e}"
                    );
                    t.refused += 1;
                    continue;
                }
                assert!(
                    faults.power_lost(),
                    "{what}: op {i} {act:?} failed without a crash: {e}"
                );
                break;
            }
        }
    }
    let mut stopped_cleanly = false;
    if let (Some(n), Some(v)) = (backing_error, &vol) {
        t.backing_errors += bh.injected();
        t.degraded += v.live_stats().volume.degraded as u64;
        assert!(!v.cache_failed(), "{what}: backing errors failed the cache");
        if n.is_multiple_of(2) {
            faults.power_cut();
        } else {
            LiveVolume::shutdown(&**v)
                .unwrap_or_else(|e| panic!("{what}: clean stop after backing errors: {e}"));
            stopped_cleanly = true;
        }
    }
    let Some(crash) = crash else {
        let n = if backing_sweep {
            (bh.writes(), bh.writes())
        } else {
            (faults.events(), faults.matched_writes())
        };
        if let Some(v) = vol {
            if sync_run {
                // Healed: nothing acknowledged lost, every byte as written.
                t.sync_failures += bh.injected();
                let lost = v.live_stats().volume.lost_dirty_ranges;
                assert!(
                    lost.is_empty() || l.lost_ok(),
                    "{what}: acknowledged data reported lost after backing syncs failed: {lost:?}"
                );
                tolerate_lost(&lost, &mut m, t);
                let buf = read_tolerant(&*v, hot, &lost, &what);
                m.check_now(0, &buf, &format!("{what}: after backing syncs failed"));
            }
            l.uncrashed(&v, seed, &what, t);
            LiveVolume::shutdown(&*v).unwrap();
        }
        return n;
    };
    let crashed_in_open = vol.is_none();
    if !faults.power_lost() {
        // The crash point lies past the end of the workload: cut the power now.
        faults.power_cut();
    }
    drop(vol);
    t.points += 1;
    l.crashed(&f, &what, t);
    let (vol, rep) = l.reopen(&f, &what);
    l.reopened(
        &vol,
        &rep,
        watch,
        crashed_in_open || stopped_cleanly,
        &what,
        t,
    );
    // (Only the failing-sync runs may tolerate lost ranges: elsewhere a read still fails.)
    let mut lost = vol.live_stats().volume.lost_dirty_ranges;
    if !sync_run {
        lost.clear();
    } else {
        assert!(
            lost.is_empty() || l.lost_ok(),
            "{what}: acknowledged data reported lost after the restart: {lost:?} ({rep:?})"
        );
        tolerate_lost(&lost, &mut m, t);
    }
    let buf = read_tolerant(&vol, VOL, &lost, &what);
    if l.strict(crash, mode) {
        m.check_after_crash(0, &buf, &format!("{what} after recovery ({rep:?})"));
    }
    for (i, &b) in buf.iter().enumerate() {
        let ok = if (i as u64) < hot {
            ever.has(i, b)
        } else {
            b == initial(i as u64)
        };
        assert!(
            ok,
            "{what}: byte {i} reads {b:#x} after recovery, a value never written there ({rep:?})"
        );
    }
    // Stable: what a block reads after the restart it keeps reading once its line has left
    // the cache (dirty ones written back on the way), until it is written again.
    l.evict(&vol, mode, &what, t);
    let again = read_tolerant(&vol, hot, &lost, &what);
    assert_stable_after_eviction(&what, &buf[..hot as usize], &again, &rep);
    t.stable_bytes += hot;
    l.finish(&vol, &f, &buf, mode, &what);
    // The recovered volume keeps working.
    let d = vec![0xa5; 9000];
    vol.write(3001, &d, true).unwrap();
    let mut back = vec![0u8; 9000];
    vol.read(3001, &mut back).unwrap();
    assert_eq!(back, d, "{what}: write after recovery");
    LiveVolume::shutdown(&vol).unwrap();
    (0, 0)
}

/// Ranges reported lost, tolerated ([`Layout::lost_ok`]): anything there (they read EIO).
fn tolerate_lost(lost: &[(u64, u64)], m: &mut Model, t: &mut Tally) {
    t.lost_ranges += lost.len() as u64;
    t.lost_runs += !lost.is_empty() as u64;
    for &(a, b) in lost {
        let b = b.min(VOL);
        if a < b {
            m.trim(a as usize, (b - a) as usize);
        }
    }
}

/// The first `len` bytes of the volume; a sector in a range reported lost that fails to
/// read stands as its initial bytes (never a value never written; not checked otherwise:
/// the model holds nothing there, see [`tolerate_lost`]). Any other failure panics.
fn read_tolerant(vol: &dyn LiveVolume, len: u64, lost: &[(u64, u64)], what: &str) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    if lost.is_empty() {
        vol.read(0, &mut buf).unwrap();
        return buf;
    }
    const SEC: u64 = 512;
    for a in (0..len).step_by(SEC as usize) {
        let b = (a + SEC).min(len);
        let s = &mut buf[a as usize..b as usize];
        if let Err(e) = vol.read(a, s) {
            assert!(
                lost.iter().any(|&(x, y)| x < b && a < y),
                "{what}: read of {a}+{} failed outside the ranges reported lost {lost:?}: {e}",
                b - a
            );
            for (k, x) in s.iter_mut().enumerate() {
                *x = initial(a + k as u64);
            }
        }
    }
    buf
}

/// Crash points for one mode: `points` of them, spread over every event (or metadata write)
/// of successive seeds' workloads (all of them when the budget allows).
fn sweep<L: Layout>(l: &L, mode: Mode, points: u64, meta: bool) -> Tally {
    let (per_seed, salt, meta_seed0, _, _) = l.sweep_params();
    let seed0 = if meta { meta_seed0 } else { 0 };
    let mut t = Tally::default();
    crash_sweep(mode, points, meta, seed0, per_seed, salt, |seed, c| {
        let c = c.map(|(m, n)| if m { Crash::Meta(n) } else { Crash::Event(n) });
        run(l, mode, seed, c, false, &mut t)
    });
    t
}

/// The power-cut points of one mode (`share` of the budget, a fifth of that again as
/// metadata tears), then the layout's checks that they bit.
fn check_mode<L: Layout>(l: &L, mode: Mode, share: f64) -> Tally {
    let start = std::time::Instant::now();
    let pts = ((l.budget() as f64 * share).ceil() as u64).max(1);
    let t = sweep(l, mode, pts, false);
    let sub = sweep(l, mode, (pts / 5).max(1), true);
    println!(
        "{} {mode:?}: {} crash points (+{} with 8-byte tears of the metadata) passed in {:.1} s; {} crashed during open; {}; {} bytes read the same after eviction",
        l.name(),
        t.points,
        sub.points,
        start.elapsed().as_secs_f64(),
        t.crashed_in_open + sub.crashed_in_open,
        l.summary(&t, &sub),
        t.stable_bytes + sub.stable_bytes,
    );
    if std::env::var("TIERCACHE_CRASH_ONLY").is_err() {
        assert!(
            t.points >= pts,
            "{} {mode:?}: {} of {pts} points ran",
            l.name(),
            t.points
        );
        l.assert_bit(mode, &t, &sub);
    }
    t
}

/// Issue 14: a backing-device error at each backing write of a run (write-backs of
/// cleaning, evictions and reclaims; write-through writes), then a crash or a clean stop.
fn check_backing_errors<L: Layout>(l: &L, mode: Mode) {
    let start = std::time::Instant::now();
    let (_, _, _, seed0, share) = l.sweep_params();
    let mut t = Tally::default();
    let pts = (l.budget() / share).max(4);
    crash_sweep(mode, pts, false, seed0, 20, 0xbac4, |seed, c| {
        let c = c.map(|(_, n)| Crash::BackingWrite(n));
        run(l, mode, seed, c, true, &mut t)
    });
    println!(
        "{} {mode:?}: {} backing-write error points passed in {:.1} s: {} injected failures, {} requests refused, {} runs degraded at the stop; {} bytes read the same after eviction",
        l.name(),
        t.points,
        start.elapsed().as_secs_f64(),
        t.backing_errors,
        t.refused,
        t.degraded,
        t.stable_bytes
    );
    assert_backing_sweep_bit(mode, t.points, pts, t.backing_errors, t.degraded);
}

// ---------------------------------------------------------------------------------------
// The direct layout.

/// 24 cache lines of 4 KiB; requests in the first 160 KiB (40 lines: many evictions).
struct Direct {
    /// Data checksums (`--data-checksums`).
    sums: bool,
    /// Small chunk rewrites (64 KiB from 2 dirty runs), cleaning with full flushes.
    rewrite: bool,
    /// Stepped cleaning passes in the workload (`Act::CleanBegin` .. `CleanCommit`).
    stepped: bool,
    /// Windows of failing backing syncs around the stepped passes ([`with_sync_failures`]).
    syncs: bool,
    /// Ranges reported lost after failing syncs are tolerated (read EIO, not checked),
    /// counted: the known direct-layout loss while syncs fail and the cache evicts
    /// (h-directsync3). Unset, nothing may be reported lost.
    lost_ok: bool,
    /// Line validity (`--validity line`: whole-line fills).
    line: bool,
}

/// The direct layout's per-run state: the clean lines at the last completed flush untouched
/// since (checked after every request), and the stepped cleaning pass in progress.
#[derive(Default)]
struct DirectWatch {
    unchanged: HashSet<LineState>,
    pass: Option<SteppedClean>,
}

const CACHE_LINES: u64 = 24;
const DIRECT_HOT: u64 = 160 << 10;
const DIRECT_OPS: usize = 160;

fn clean_set(lines: &[LineState]) -> HashSet<LineState> {
    lines.iter().filter(|l| l.dirty == 0).copied().collect()
}

fn data_for(i: usize, seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|k| {
            (i as u8).wrapping_mul(29) ^ (seed as u8).wrapping_mul(7) ^ (k as u8).rotate_left(2)
        })
        .collect()
}

impl Layout for Direct {
    type Vol = CacheVolume;
    type Report = tiercache_server::OpenReport;
    type Watch = DirectWatch;

    fn name(&self) -> String {
        format!(
            "direct{}{}{}{}",
            if self.sums {
                " with data checksums"
            } else {
                ""
            },
            if self.rewrite {
                " with chunk rewrites"
            } else {
                ""
            },
            if self.syncs {
                " with failing backing syncs"
            } else {
                ""
            },
            if self.line { " with line validity" } else { "" }
        )
    }
    fn hot(&self) -> u64 {
        DIRECT_HOT
    }
    fn budget(&self) -> u64 {
        crash_budget(250, 10_000)
    }
    fn fault_mul(&self) -> u64 {
        1_000_003
    }
    fn sweep_params(&self) -> (u64, u64, u64, u64, u64) {
        (60, 0xc4a5, 1000, 2000, 6)
    }
    fn setup(&self, mode: Mode, _seed: u64) -> (Files, Range<u64>) {
        let f = files_with(CACHE_LINES, 4096, self.sums);
        let cache = FileDev::open(&f.cache).unwrap();
        let opts = tiercache_server::FormatOptions {
            line_size: 4096,
            mode,
            data_checksums: self.sums,
            validity: if self.line {
                tiercache_engine::Validity::Line
            } else {
                tiercache_engine::Validity::Sector
            },
            ..Default::default()
        };
        tiercache_server::format(&cache, VOL, &opts).unwrap();
        drop(cache);
        // With data checksums this includes their region: tears there too.
        let meta = META_OFFSET..Superblock::data_offset_with(CACHE_LINES, 4096, self.sums);
        (f, meta)
    }
    fn open(
        &self,
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
    ) -> io::Result<CacheVolume> {
        CacheVolume::open(cache, backing, &OpenOptions::default())
            .map(|(v, _)| v)
            .map_err(io::Error::other)
    }
    fn workload(&self, seed: u64) -> Vec<Act> {
        if self.stepped {
            let w = stepped_workload(seed, if self.rewrite { 24 } else { 6 });
            return if self.syncs {
                with_sync_failures(w, seed)
            } else {
                w
            };
        }
        let mut r = rng(seed ^ 0x5eed_c4a5);
        (0..DIRECT_OPS)
            .map(|i| {
                if r.gen_bool(0.03) {
                    return Act::Clean;
                }
                match random_op(&mut r, DIRECT_HOT) {
                    (0, o, l, _) => Act::Read(o, l),
                    (1, o, l, fua) => Act::Write(o, data_for(i, seed, l), fua),
                    (2, o, l, _) => Act::Trim(o, l),
                    _ => Act::Flush,
                }
            })
            .collect()
    }
    fn started(&self, v: &CacheVolume) {
        if self.rewrite {
            v.set_chunk_rewrite(64 << 10, 2).unwrap();
        }
    }
    fn clean_step(&self, v: &Arc<CacheVolume>, act: &Act, w: &mut DirectWatch) -> io::Result<bool> {
        match act {
            Act::CleanBegin(_) | Act::UnmapBegin => {
                assert!(w.pass.is_none(), "a stepped pass begun twice");
                let p = match act {
                    Act::CleanBegin(n) => v.stepped_clean(*n),
                    _ => v.stepped_unmap_ahead(),
                };
                let flying = p.in_flight();
                w.pass = Some(p);
                Ok(flying)
            }
            Act::CleanIo => {
                let p = w.pass.as_mut().expect("CleanIo without CleanBegin");
                p.io();
                Ok(p.in_flight())
            }
            Act::CleanCommit => w
                .pass
                .take()
                .expect("CleanCommit without CleanBegin")
                .commit()
                .map(|()| false),
            _ => unreachable!("{act:?} is no step of a cleaning pass"),
        }
    }
    fn clean(&self, v: &CacheVolume) -> io::Result<bool> {
        if self.rewrite {
            // A full flush (`ctl flush`), so every dense chunk is rewritten; durable once
            // it returns.
            v.flush_dirty().map(|_| true)
        } else {
            v.clean_if_needed().map(|_| false)
        }
    }
    fn after_op(&self, v: &CacheVolume, act: &Act, durable: bool, w: &mut Self::Watch) {
        let w = &mut w.unchanged;
        if durable {
            *w = clean_set(&v.lines());
        }
        // A line written or trimmed since the FLUSH is not unchanged, even if its state
        // is the same: its slot and backing copies may land differently at the crash.
        if let Act::Write(o, d, _) = act {
            let (a, b) = (o / 4096, (o + d.len() as u64 - 1) / 4096);
            w.retain(|x| !(a..=b).contains(&x.key));
        }
        if let Act::Trim(o, l) = act {
            let (a, b) = (o / 4096, (o + l - 1) / 4096);
            w.retain(|x| !(a..=b).contains(&x.key));
        }
        let now = clean_set(&v.lines());
        // Lines whose record was unmapped ahead of their eviction (or may have been, in a
        // batch the crash cut) are not expected back.
        let ahead = v.unmapped_ahead();
        w.retain(|l| now.contains(l) && !ahead.contains(&l.slot));
    }
    fn refusal(&self, _act: &Act, _e: &io::Error) -> Result<(), String> {
        // Any request may fail for the backing device (a refused write, a failed read fill
        // or FLUSH, a cleaning pass).
        Ok(())
    }
    fn uncrashed(&self, v: &CacheVolume, _seed: u64, _what: &str, t: &mut Tally) {
        let st = v.stats();
        t.unmapped_ahead += st.unmap_ahead;
        t.chunk_rewrites += st.totals.chunk_rewrites;
        t.unlocked_writebacks += st.unlocked_writebacks;
        t.writeback_waits += st.writeback_waits;
        t.writeback_yields += st.writeback_yields;
    }
    fn crashed(&self, f: &Files, what: &str, t: &mut Tally) {
        // The offline check agrees: torn records and superseded duplicates are expected
        // after a crash, inconsistencies are not.
        let chk = check_device(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
        assert!(chk.ok(), "{what}: tiercache check found {:?}", chk.problems);
        t.checked += 1;
    }
    fn reopen(&self, f: &Files, _what: &str) -> (CacheVolume, Self::Report) {
        open(f, None)
    }
    fn reopened(
        &self,
        v: &CacheVolume,
        rep: &Self::Report,
        w: Self::Watch,
        clean_ok: bool,
        what: &str,
        t: &mut Tally,
    ) {
        let unchanged = w.unchanged;
        assert!(!rep.was_clean || clean_ok, "{what}");
        t.bad_checksums += rep.dropped_bad_checksum;
        t.duplicates += rep.dropped_duplicates;
        // Warm means the line is back in its slot with its bytes. It may come back dirty:
        // the unmap-ahead pass can write lines back after a request's FLUSH.
        let now: HashSet<LineState> = v
            .lines()
            .into_iter()
            .map(|l| LineState { dirty: 0, ..l })
            .collect();
        t.unchanged_lines += unchanged.len() as u64;
        let back = unchanged.iter().filter(|l| now.contains(l)).count();
        t.unchanged_restored += back as u64;
        t.dropped_differing += rep.dropped_clean_lines;
        if back < unchanged.len() && std::env::var("TIERCACHE_CRASH_VERBOSE").is_ok() {
            let missing: Vec<_> = unchanged.iter().filter(|l| !now.contains(l)).collect();
            eprintln!("{what}: not restored {missing:?}; restored {now:?}; {rep:?}");
        }
    }
    fn lost_ok(&self) -> bool {
        self.lost_ok
    }
    fn strict(&self, crash: Crash, mode: Mode) -> bool {
        // Without atomic sector writes a torn record of a dirty line loses that line's
        // unflushed-and-flushed data to the backing's older copy: only "never written" holds.
        matches!(crash, Crash::Event(_)) || mode != Mode::WriteBack
    }
    fn evict(&self, v: &CacheVolume, mode: Mode, what: &str, _t: &mut Tally) {
        // Reads of twice the cache's worth of other lines evict every hot line.
        if mode == Mode::PassThrough {
            return;
        }
        let mut line = vec![0u8; 4096];
        for l in DIRECT_HOT / 4096 + 8..DIRECT_HOT / 4096 + 8 + 2 * CACHE_LINES {
            v.read(l * 4096, &mut line).unwrap();
        }
        let left: Vec<u64> = v
            .lines()
            .iter()
            .map(|l| l.key)
            .filter(|&k| k < DIRECT_HOT / 4096)
            .collect();
        assert!(left.is_empty(), "{what}: lines {left:?} not evicted");
    }
    fn finish(&self, v: &CacheVolume, _f: &Files, _buf: &[u8], _mode: Mode, what: &str) {
        if self.sums {
            let st = v.stats();
            assert!(
                st.data_checksums && st.checksum_errors == 0 && st.lost_dirty_ranges.is_empty(),
                "{what}: good data reported damaged after the crash: {} checksum errors, lost {:?}",
                st.checksum_errors,
                st.lost_dirty_ranges
            );
        }
    }
    fn summary(&self, t: &Tally, sub: &Tally) -> String {
        format!(
            "warm: {} of {} unchanged clean lines restored ({} dropped: differing from the backing device); {} (+{}) torn records caught by checksum, {} duplicates resolved; {} records unmapped ahead in batches",
            t.unchanged_restored,
            t.unchanged_lines,
            t.dropped_differing,
            t.bad_checksums,
            sub.bad_checksums,
            t.duplicates + sub.duplicates,
            t.unmapped_ahead + sub.unmapped_ahead,
        )
    }
    fn assert_bit(&self, mode: Mode, t: &Tally, sub: &Tally) {
        assert_eq!(
            t.checked, t.points,
            "{mode:?}: every crashed device went through check"
        );
        if mode == Mode::PassThrough {
            return;
        }
        assert!(
            t.unchanged_lines > 0,
            "{mode:?}: no unchanged lines to test warmth"
        );
        assert!(
            (t.unchanged_restored + t.dropped_differing) as f64 >= 0.99 * t.unchanged_lines as f64,
            "{mode:?}: only {} of {} unchanged clean lines came back after crashes",
            t.unchanged_restored,
            t.unchanged_lines
        );
        assert!(
            t.unmapped_ahead > 0,
            "{mode:?}: no record was unmapped ahead in a batch; the crash points miss that path"
        );
        assert!(
            sub.bad_checksums > 0,
            "{mode:?}: sub-sector tears never produced a torn record; the test is not biting"
        );
    }
}

const DIRECT: Direct = Direct {
    sums: false,
    rewrite: false,
    stepped: false,
    syncs: false,
    lost_ok: false,
    line: false,
};

#[test]
fn backing_errors_during_cleaning_write_back() {
    check_backing_errors(&DIRECT, Mode::WriteBack);
}

#[test]
fn backing_errors_write_through() {
    check_backing_errors(&DIRECT, Mode::WriteThrough);
}

/// Crash points inside chunk rewrites (cleaning writes dense 64 KiB chunks whole, gaps read
/// from the backing device or clean copies): same guarantees as plain write-backs.
#[test]
fn crash_points_chunk_rewrites() {
    let l = Direct {
        rewrite: true,
        ..DIRECT
    };
    check_mode(&l, Mode::WriteBack, 0.2);
    let t = sweep(&l, Mode::WriteBack, 5, false);
    println!("{} chunk rewrites in the uncrashed runs", t.chunk_rewrites);
    assert!(
        t.chunk_rewrites > 0,
        "the workload planned no chunk rewrite"
    );
}

// ---------------------------------------------------------------------------------------
// Stepped cleaning passes (issue 20, plan-unlocked-io step 3): a pass's write-back runs
// outside the volume lock; begin, I/O and commit are separate workload acts, with requests
// between them, and the power is cut at every event of some of these passes.

const STEPPED_OPS: usize = 120;

/// Events after a stepped pass's commit that get power cuts too (the next request's
/// record writes and syncs, which may be the first to carry the pass's clean records).
const STEPPED_TAIL: u64 = 3;

/// A request between the steps of a pass: mostly writes, trims and FLUSHes (the requests
/// that must commit the pass first, when they touch its lines).
fn stepped_between(r: &mut rand_chacha::ChaCha8Rng, i: usize, seed: u64) -> Act {
    let (_, o, l, _) = random_op(r, DIRECT_HOT);
    match r.gen_range(0..10) {
        0..=1 => Act::Read(o, l),
        2..=5 => Act::Write(o, data_for(i, seed, l), r.gen_bool(0.2)),
        6..=7 => Act::Trim(o, l),
        _ => Act::Flush,
    }
}

/// The direct workload's requests, with cleaning passes of 1 to `max` lines in steps (one in
/// ten acts; chunk rewrites need passes as large as a chunk's dirty lines; a third of them
/// unmap-ahead passes), up to two requests before the I/O and two after it.
fn stepped_workload(seed: u64, max: u64) -> Vec<Act> {
    let mut r = rng(seed ^ 0x57e9_c4a5);
    let mut acts = Vec::new();
    while acts.len() < STEPPED_OPS {
        if r.gen_bool(0.1) {
            acts.push(match r.gen_range(0..3) {
                0 => Act::UnmapBegin,
                _ => Act::CleanBegin(r.gen_range(1..=max)),
            });
            for _ in 0..r.gen_range(0..=2) {
                let a = stepped_between(&mut r, acts.len(), seed);
                acts.push(a);
            }
            acts.push(Act::CleanIo);
            for _ in 0..r.gen_range(0..=2) {
                let a = stepped_between(&mut r, acts.len(), seed);
                acts.push(a);
            }
            acts.push(Act::CleanCommit);
            continue;
        }
        let a = match random_op(&mut r, DIRECT_HOT) {
            (0, o, l, _) => Act::Read(o, l),
            (1, o, l, fua) => Act::Write(o, data_for(acts.len(), seed, l), fua),
            (2, o, l, _) => Act::Trim(o, l),
            _ => Act::Flush,
        };
        acts.push(a);
    }
    acts
}

/// Power cuts at every event (device write or sync) of stepped passes whose write-back ran
/// outside the lock, and of the few events after their commit: per seed two such passes
/// drawn at random, over successive seeds until the budget is spent. Rerun one point with
/// `TIERCACHE_CRASH_ONLY=mode:seed:N`.
fn check_stepped(l: &Direct, mode: Mode) {
    let start = std::time::Instant::now();
    if let Ok(only) = std::env::var("TIERCACHE_CRASH_ONLY") {
        let p: Vec<&str> = only.split(':').collect();
        if p[0] == mode.as_str() {
            let (seed, n) = (p[1].parse().unwrap(), p[2].parse().unwrap());
            run(
                l,
                mode,
                seed,
                Some(Crash::Event(n)),
                false,
                &mut Tally::default(),
            );
        }
        return;
    }
    let budget = crash_budget(60, 3000);
    let (mut t, mut u) = (Tally::default(), Tally::default());
    let (mut seed, mut left, mut passes) = (5000, budget, 0);
    while left > 0 {
        let before = u.stepped.len();
        run(l, mode, seed, None, false, &mut u);
        let flying: Vec<(u64, u64)> = u.stepped[before..]
            .iter()
            .filter(|s| s.2 && s.0 <= s.1)
            .map(|s| (s.0, s.1 + STEPPED_TAIL))
            .collect();
        let mut r = rng(seed ^ 0x57e9);
        for _ in 0..2.min(flying.len()) {
            let (a, b) = flying[r.gen_range(0..flying.len())];
            passes += 1;
            for e in a..=b {
                if left == 0 {
                    break;
                }
                run(l, mode, seed, Some(Crash::Event(e)), false, &mut t);
                left -= 1;
            }
        }
        seed += 1;
    }
    println!(
        "{} {mode:?}: {} crash points in {passes} stepped passes (seeds 5000..{seed}) passed in {:.1} s; uncrashed runs: {} passes in steps ({} with a write-back outside the lock, {} of them unmap-ahead passes), {} write-backs outside the lock, {} requests waited for one, {} cut short, {} chunk rewrites, {} records unmapped ahead; {}",
        l.name(),
        t.points,
        start.elapsed().as_secs_f64(),
        u.stepped.len(),
        u.stepped.iter().filter(|s| s.2).count(),
        u.stepped.iter().filter(|s| s.2 && s.3).count(),
        u.unlocked_writebacks,
        u.writeback_waits,
        u.writeback_yields,
        u.chunk_rewrites,
        u.unmapped_ahead,
        l.summary(&t, &Tally::default()),
    );
    assert!(
        !l.rewrite || u.chunk_rewrites > 0,
        "no stepped pass rewrote a chunk"
    );
    // (Chunk rewrites: long passes, the budget covers two seeds only.)
    assert!(
        l.rewrite || u.stepped.iter().any(|s| s.2 && s.3),
        "no stepped unmap-ahead pass wrote back outside the lock"
    );
    assert_eq!(t.points, budget, "every point ran");
    assert_eq!(
        t.checked, t.points,
        "every crashed device went through check"
    );
    assert!(
        u.writeback_waits > 0 && u.writeback_yields > 0,
        "no request waited for a stepped pass / no pass was cut short: the workload misses the interleavings"
    );
}

#[test]
fn crash_points_stepped_cleaning() {
    let l = Direct {
        stepped: true,
        ..DIRECT
    };
    check_stepped(&l, Mode::WriteBack);
}

#[test]
fn crash_points_stepped_cleaning_checksums() {
    let l = Direct {
        sums: true,
        stepped: true,
        ..DIRECT
    };
    check_stepped(&l, Mode::WriteBack);
}

#[test]
fn crash_points_stepped_chunk_rewrites() {
    let l = Direct {
        rewrite: true,
        stepped: true,
        ..DIRECT
    };
    check_stepped(&l, Mode::WriteBack);
}

// ---------------------------------------------------------------------------------------
// Failing backing syncs (session 14): windows where backing syncs fail (all of them, or the
// next one, dropping the backing device's unsynced writes as Linux does after a writeback
// error), placed between the steps of cleaning passes (direct) or anywhere (log), healed a
// few requests later; the power is cut at every event of some windows.

/// `acts` with windows of failing backing syncs: around a stepped pass (direct; the failure
/// before its begin, its I/O or its commit, the heal 0-3 requests after the commit), or
/// (no stepped pass: the log layout) at random, healed 2-9 requests later. Ends healed.
fn with_sync_failures(acts: Vec<Act>, seed: u64) -> Vec<Act> {
    let mut r = rng(seed ^ 0x5c_fa11);
    let stepped = acts
        .iter()
        .any(|a| matches!(a, Act::CleanBegin(_) | Act::UnmapBegin));
    let mut out = Vec::with_capacity(acts.len() + 16);
    // A failure act waiting for its step of the current pass (0 begin, 1 I/O, 2 commit).
    let mut pending: Option<(Act, u8)> = None;
    let mut window = false;
    let mut heal_in: Option<usize> = None;
    for a in acts {
        if let Some(n) = heal_in {
            if n == 0 {
                out.push(Act::Heal);
                window = false;
                heal_in = None;
            } else {
                heal_in = Some(n - 1);
            }
        }
        let fail = if r.gen_bool(0.6) {
            Act::SyncsFail
        } else {
            Act::SyncFailDrop
        };
        let step = match a {
            Act::CleanBegin(_) | Act::UnmapBegin => Some(0),
            Act::CleanIo => Some(1),
            Act::CleanCommit => Some(2),
            _ => None,
        };
        if stepped {
            if step == Some(0) && !window && r.gen_bool(0.7) {
                pending = Some((fail, r.gen_range(0..3)));
            }
            if let Some((f, at)) = pending.take() {
                if step == Some(at) {
                    out.push(f);
                    window = true;
                } else {
                    pending = Some((f, at));
                }
            }
        } else if !window && r.gen_bool(0.08) {
            out.push(fail);
            // A FLUSH in half the windows: the log layout syncs its backing device rarely
            // otherwise (reclaim write-backs, sealing).
            if r.gen_bool(0.5) {
                out.push(Act::Flush);
            }
            window = true;
            heal_in = Some(r.gen_range(3..16));
        }
        let commit = step == Some(2);
        out.push(a);
        if commit && window && heal_in.is_none() {
            heal_in = Some(r.gen_range(0..4));
        }
    }
    if window {
        out.push(Act::Heal);
    }
    out
}

/// Power cuts at every event of windows of failing backing syncs (from the failure to
/// `STEPPED_TAIL` events after the heal), two windows per seed, over successive seeds from
/// `seed0` until the budget is spent; the uncrashed runs check that nothing was lost once
/// healed. Rerun one point with `TIERCACHE_CRASH_ONLY=mode:seed:N`.
fn check_sync_windows<L: Layout>(l: &L, mode: Mode, seed0: u64) -> (Tally, Tally) {
    let start = std::time::Instant::now();
    if let Ok(only) = std::env::var("TIERCACHE_CRASH_ONLY") {
        let p: Vec<&str> = only.split(':').collect();
        let mut t = Tally::default();
        if p[0] == mode.as_str() {
            let (seed, n) = (p[1].parse().unwrap(), p[2].parse().unwrap());
            run(l, mode, seed, Some(Crash::Event(n)), false, &mut t);
        }
        return (t, Tally::default());
    }
    let budget = crash_budget(60, 3000);
    let (mut t, mut u) = (Tally::default(), Tally::default());
    let (mut seed, mut left, mut windows) = (seed0, budget, 0);
    while left > 0 {
        assert!(seed < seed0 + 100, "no window of failing syncs had events");
        let before = u.sync_windows.len();
        run(l, mode, seed, None, false, &mut u);
        let spans: Vec<(u64, u64)> = u.sync_windows[before..]
            .iter()
            .filter(|s| s.0 <= s.1)
            .map(|s| (s.0, s.1 + STEPPED_TAIL))
            .collect();
        let mut r = rng(seed ^ 0x5c);
        for _ in 0..2.min(spans.len()) {
            let (a, b) = spans[r.gen_range(0..spans.len())];
            windows += 1;
            for e in a..=b {
                if left == 0 {
                    break;
                }
                run(l, mode, seed, Some(Crash::Event(e)), false, &mut t);
                left -= 1;
            }
        }
        seed += 1;
    }
    println!(
        "{} {mode:?}: {} crash points in {windows} windows of failing backing syncs (seeds {seed0}..{seed}) passed in {:.1} s; uncrashed runs: {} windows, {} sync failures injected, {} requests refused, {} ranges reported lost in {} runs; crashed runs: {} requests refused, {} ranges reported lost after the restart in {} runs; {}",
        l.name(),
        t.points,
        start.elapsed().as_secs_f64(),
        u.sync_windows.len(),
        u.sync_failures,
        u.refused,
        u.lost_ranges,
        u.lost_runs,
        t.refused,
        t.lost_ranges,
        t.lost_runs,
        l.summary(&t, &Tally::default()),
    );
    assert_eq!(t.points, budget, "every point ran");
    assert!(
        u.sync_failures > 0,
        "no backing sync failed in the uncrashed runs: the windows miss the syncs"
    );
    (t, u)
}

/// Direct layout, write-back: backing syncs fail between the steps of cleaning passes (a
/// pass's commit then finds its write-back not durable) and the requests after them, some
/// dropping the unsynced writes; the cache keeps evicting (24 lines, 40 hot).
#[test]
fn crash_points_failing_syncs_between_cleaning_steps() {
    let l = Direct {
        stepped: true,
        syncs: true,
        ..DIRECT
    };
    let (t, _) = check_sync_windows(&l, Mode::WriteBack, 7000);
    if std::env::var("TIERCACHE_CRASH_ONLY").is_err() {
        assert_eq!(
            t.checked, t.points,
            "every crashed device went through check"
        );
    }
}

/// The same, strict, one seed: nothing acknowledged may be reported lost. Before
/// h-directsync3's fix (lines unmapped ahead, then evicted, without a sync) seed 7001's
/// uncrashed run (no power cut at all) reported `[(45056, 47104)]` lost once the syncs healed.
#[test]
fn direct_failing_syncs_between_cleaning_steps_lose_nothing() {
    let l = Direct {
        stepped: true,
        syncs: true,
        ..DIRECT
    };
    run(
        &l,
        Mode::WriteBack,
        7001,
        None,
        false,
        &mut Tally::default(),
    );
}

/// Log layout, write-through (every segment sealed after a backing sync; in write-back its
/// backing syncs are too rare for short windows): backing syncs fail for a few requests at
/// a time, some dropping the unsynced writes.
#[test]
fn log_crash_points_failing_syncs() {
    check_sync_windows(
        &Log {
            syncs: true,
            reclaim: None,
        },
        Mode::WriteThrough,
        7500,
    );
}

// Shares of the budget: write-back gets the most (dirty data, write-backs, cleaning).
#[test]
fn crash_points_write_back() {
    check_mode(&DIRECT, Mode::WriteBack, 0.36);
}

// The same crash points with data checksums: the checksum of every slot write is durable no
// later than the record that maps it, and a line written in place at the crash has its
// checksums recomputed (`tiercache_server::data_sums`).
#[test]
fn crash_points_write_back_checksums() {
    let l = Direct {
        sums: true,
        ..DIRECT
    };
    check_mode(&l, Mode::WriteBack, 0.36);
}

// The same with line validity (`--validity line`): every partial write to an uncached line
// fills the rest from the backing device, and a line found in flux at the restart is made
// whole rather than refused.
#[test]
fn crash_points_write_back_line_validity() {
    let l = Direct {
        sums: true,
        line: true,
        ..DIRECT
    };
    check_mode(&l, Mode::WriteBack, 0.36);
}

#[test]
fn crash_points_write_through_checksums() {
    let l = Direct {
        sums: true,
        ..DIRECT
    };
    check_mode(&l, Mode::WriteThrough, 0.2);
}

#[test]
fn crash_points_write_through() {
    check_mode(&DIRECT, Mode::WriteThrough, 0.2);
}

#[test]
fn crash_points_write_around() {
    check_mode(&DIRECT, Mode::WriteAround, 0.16);
}

#[test]
fn crash_points_read_only() {
    check_mode(&DIRECT, Mode::ReadOnly, 0.16);
}

#[test]
fn crash_points_pass_through() {
    check_mode(&DIRECT, Mode::PassThrough, 0.12);
}

// ---------------------------------------------------------------------------------------
// The log layout.

/// Ten 4-line segments of 4 KiB lines; requests in the first 96 lines.
struct Log {
    /// Windows of failing backing syncs in the workload ([`with_sync_failures`]).
    syncs: bool,
    /// Reclamation settings (trim, free reserve, reinsert hits; `LogVolume::set_reclaim`),
    /// set at every open: `None` = the defaults (no trim, no reinsertion).
    reclaim: Option<(bool, f64, u16)>,
}

const LOG: Log = Log {
    syncs: false,
    reclaim: None,
};

impl Log {
    fn with_reclaim(&self, v: LogVolume) -> LogVolume {
        if let Some((trim, reserve, hits)) = self.reclaim {
            v.set_reclaim(trim, reserve, hits).unwrap();
        }
        v
    }
}

const LS: u64 = 4096;
const SEG: u64 = 4 * LS;
const LOG_HOT: u64 = 96 * LS;
const LOG_OPS: usize = 150;

/// A line of duplicate-prone, compressible or random content.
fn log_line(r: &mut rand_chacha::ChaCha8Rng, tag: u8) -> Vec<u8> {
    match r.gen_range(0..10) {
        0..=3 => {
            let p = r.gen_range(0..4u8);
            (0..LS)
                .map(|i| p.wrapping_mul(37) ^ (i / 128) as u8)
                .collect()
        }
        4..=6 => format!("extent {tag} text ")
            .bytes()
            .cycle()
            .take(LS as usize)
            .collect(),
        _ => (0..LS).map(|_| r.gen()).collect(),
    }
}

impl Layout for Log {
    type Vol = LogVolume;
    type Report = tiercache_server::log_volume::LogOpenReport;
    type Watch = ();

    fn name(&self) -> String {
        let r = match self.reclaim {
            Some((trim, reserve, hits)) => {
                format!(" (trim {trim}, free reserve {reserve}, reinsert hits {hits})")
            }
            None => String::new(),
        };
        if self.syncs {
            format!("log with failing backing syncs{r}")
        } else {
            format!("log{r}")
        }
    }
    fn hot(&self) -> u64 {
        LOG_HOT
    }
    fn budget(&self) -> u64 {
        crash_budget(200, 4000)
    }
    fn fault_mul(&self) -> u64 {
        7_000_003
    }
    fn sweep_params(&self) -> (u64, u64, u64, u64, u64) {
        (50, 0x7ea5, 500, 900, 5)
    }
    fn setup(&self, mode: Mode, seed: u64) -> (Files, Range<u64>) {
        let f = log_cache_files(10, SEG);
        let opts = LogFormatOptions {
            line_size: LS,
            segment_size: SEG,
            compression: if seed.is_multiple_of(2) {
                Compression::Lz4
            } else {
                Compression::Zstd(1)
            },
            dedup_ratio: 1.0,
            picker: "lru".into(),
            mode,
            // Every third workload with a small journal: checkpoints during the run.
            journal_records: seed.is_multiple_of(3).then_some(64),
        };
        let sb = format_log(&FileDev::open(&f.cache).unwrap(), VOL, &opts).unwrap();
        (f, JOURNAL_OFFSET..sb.geometry().seg_area)
    }
    fn open(&self, cache: Box<dyn BlockDev>, backing: Box<dyn BlockDev>) -> io::Result<LogVolume> {
        LogVolume::open(cache, backing).map(|(v, _)| self.with_reclaim(v))
    }
    fn workload(&self, seed: u64) -> Vec<Act> {
        let mut r = rng(seed ^ 0x10c_c4a5);
        let w: Vec<Act> = (0..LOG_OPS)
            .map(|i| match r.gen_range(0..100) {
                0..=29 => {
                    let n = r.gen_range(1..4 * LS);
                    Act::Read(r.gen_range(0..LOG_HOT - n), n)
                }
                30..=69 => {
                    let k = r.gen_range(1..3);
                    let o = r.gen_range(0..LOG_HOT / LS - k) * LS;
                    let mut d = Vec::new();
                    for _ in 0..k {
                        d.extend(log_line(&mut r, i as u8));
                    }
                    Act::Write(o, d, r.gen_bool(0.06))
                }
                70..=87 => {
                    let n = r.gen_range(1..2 * LS);
                    let o = r.gen_range(0..LOG_HOT - n);
                    Act::Write(o, (0..n).map(|_| r.gen()).collect(), r.gen_bool(0.06))
                }
                88..=90 => {
                    let n = r.gen_range(1..3 * LS);
                    Act::Trim(r.gen_range(0..LOG_HOT - n), n)
                }
                _ => Act::Flush,
            })
            .collect();
        if self.syncs {
            with_sync_failures(w, seed)
        } else {
            w
        }
    }
    fn refusal(&self, act: &Act, e: &io::Error) -> Result<(), String> {
        // A write that finds no clean segment while the backing device fails is refused;
        // nothing else may fail.
        if matches!(act, Act::Write(..)) && e.to_string().contains("backing device") {
            Ok(())
        } else {
            Err(format!(
                "failed, not as a write refused for the backing device: {e}"
            ))
        }
    }
    fn uncrashed(&self, v: &LogVolume, seed: u64, what: &str, t: &mut Tally) {
        v.check().unwrap();
        let s = v.stats();
        t.reinserted += s.engine.reinserted;
        t.discards += s.live.discards;
        assert_eq!(
            s.live.discard_bytes, s.engine.ssd_bytes_trimmed,
            "{what}: every segment the engine trimmed is discarded"
        );
        // Nothing damages the cache device in a run without a crash: an extent that does
        // not verify was stored wrong (a clean one would be read from the backing device
        // and hide it).
        assert_eq!(
            s.live.extent_crc_errors, 0,
            "{what}: extents failed their checksum: {:?}",
            s.live
        );
        if seed.is_multiple_of(3) {
            let c = v.stats().live.checkpoints;
            assert!(
                c > 1,
                "{what}: small journal, {c} checkpoints: {:?}",
                v.stats().live
            );
        }
    }
    fn reopen(&self, f: &Files, what: &str) -> (LogVolume, Self::Report) {
        let (v, rep) = LogVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
        )
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
        (self.with_reclaim(v), rep)
    }
    fn reopened(
        &self,
        v: &LogVolume,
        rep: &Self::Report,
        _w: (),
        _clean_ok: bool,
        what: &str,
        t: &mut Tally,
    ) {
        t.recovered_open_segments += rep.recovered_open_segments;
        t.stale_records += rep.stale_records;
        v.check()
            .unwrap_or_else(|e| panic!("{what}: after recovery: {e}"));
    }
    fn evict(&self, v: &LogVolume, _mode: Mode, what: &str, _t: &mut Tally) {
        // Three cache-fulls of unique lines written past HOT reclaim every segment, writing
        // dirty extents back.
        let churn = 3 * v.stats().segments * SEG / LS;
        for l in 0..churn {
            let d: Vec<u8> = (0..LS)
                .map(|k| (l as u8) ^ (k as u8).rotate_left(1) ^ (l >> 8) as u8 ^ 0x3c)
                .collect();
            v.write(LOG_HOT + 4 * LS + l % 150 * LS, &d, false).unwrap();
        }
        // Duplicate entries of lines sharing one extent may outlive the churn; most go.
        let left = v
            .cached_lines()
            .into_iter()
            .filter(|&(l, _)| l < LOG_HOT / LS)
            .count() as u64;
        assert!(
            left <= LOG_HOT / LS / 4,
            "{what}: {left} hot lines not evicted"
        );
    }
    fn finish(&self, _v: &LogVolume, f: &Files, buf: &[u8], mode: Mode, what: &str) {
        if mode == Mode::WriteThrough {
            // Lines still cached hold what the backing device holds.
            let mut disk = vec![0u8; LOG_HOT as usize];
            FileDev::open(&f.backing)
                .unwrap()
                .read_at(&mut disk, 0)
                .unwrap();
            if let Some(i) = (0..LOG_HOT as usize).find(|&i| disk[i] != buf[i]) {
                panic!(
                    "{what}: byte {i} read {:#x} after the restart; the backing device holds {:#x}",
                    buf[i], disk[i]
                );
            }
        }
    }
    fn summary(&self, t: &Tally, sub: &Tally) -> String {
        format!(
            "{} open segments recovered from the journal; {} stale records dropped",
            t.recovered_open_segments + sub.recovered_open_segments,
            t.stale_records + sub.stale_records,
        )
    }
    fn assert_bit(&self, mode: Mode, t: &Tally, sub: &Tally) {
        assert!(
            t.recovered_open_segments + sub.recovered_open_segments > 0,
            "{mode:?}: no crash left an open segment to recover; the test is not biting"
        );
        if let Some((trim, _, hits)) = self.reclaim {
            assert!(
                !trim || t.discards + sub.discards > 0,
                "{mode:?}: no segment discarded; the test is not biting"
            );
            assert!(
                hits == 0 || t.reinserted + sub.reinserted > 0,
                "{mode:?}: no extent reinserted; the test is not biting"
            );
        }
    }
}

#[test]
fn log_backing_errors_during_cleaning_write_back() {
    check_backing_errors(&LOG, Mode::WriteBack);
}

#[test]
fn log_backing_errors_write_through() {
    check_backing_errors(&LOG, Mode::WriteThrough);
}

#[test]
fn log_crash_points_write_back() {
    check_mode(&LOG, Mode::WriteBack, 0.5);
}

#[test]
fn log_crash_points_write_through() {
    check_mode(&LOG, Mode::WriteThrough, 0.5);
}

/// Live `--reinsert-hits` (write-through: every line's value is on the backing device, so a
/// reinserted extent that outlived a newer write would show as a differing byte).
#[test]
fn log_crash_points_write_through_reinsertion() {
    let l = Log {
        syncs: false,
        reclaim: Some((false, 0.0, 1)),
    };
    check_mode(&l, Mode::WriteThrough, 0.5);
}

/// Live `--trim --free-reserve` in write-back (victims reclaimed ahead, written back,
/// emptied and discarded: discards are events of the crash device, zeros on it) and trim
/// with reinsertion in write-through (the segment discarded, then refilled).
#[test]
fn log_crash_points_trim() {
    let ahead = Log {
        syncs: false,
        reclaim: Some((true, 0.2, 0)),
    };
    check_mode(&ahead, Mode::WriteBack, 0.5);
    let reuse = Log {
        syncs: false,
        reclaim: Some((true, 0.0, 1)),
    };
    check_mode(&reuse, Mode::WriteThrough, 0.3);
}

/// The wrapper itself: events are numbered, the crash point fails, later calls fail, and
/// unsynced writes land in part.
#[test]
fn fault_device_numbers_events_and_cuts_power() {
    let f = files(4, 4096);
    let faults = Faults::new(7);
    faults.crash_at(3, false);
    let (d, _) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let d = Arc::new(d);
    d.write_at(&[1u8; 4096 * 8], 0).unwrap(); // event 1, unsynced
    let mut b = vec![0u8; 4096];
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(b, vec![1u8; 4096], "unsynced writes are visible to reads");
    d.write_at(&[2u8; 512], 4096 * 8).unwrap(); // event 2
    assert!(d.sync().is_err(), "event 3 is the crash point");
    assert!(faults.power_lost());
    assert!(d.read_at(&mut b, 0).is_err() && d.write_at(&b, 0).is_err());
    let after = std::fs::read(&f.backing).unwrap();
    let landed = after[..4096 * 8 + 512]
        .chunks(512)
        .filter(|c| c[0] == 1 || c[0] == 2)
        .count();
    assert!(
        landed > 0 && landed < 65,
        "{landed} of 65 unsynced sectors landed: some, not all"
    );
    assert_eq!(faults.events(), 3);
}
