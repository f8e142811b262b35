//! Crash points, enumerated. A seeded write-back (and every other mode) workload of reads,
//! partial/unaligned writes, FUA writes, trims, FLUSHes and cleaning passes runs through
//! `CacheVolume` on devices wrapped by `tiercache_server::fault`, which number every write and
//! sync of both devices. For a crash point N the power is cut at event N: that call fails
//! (torn, when it is a write: a random subset of its sectors lands), everything later fails,
//! and writes not synced by then land sector by sector at random (both devices model a
//! volatile write cache). The volume is then reopened on the files and checked against a
//! reference model:
//! * every byte acknowledged before the last completed FLUSH, or written with FUA, reads back
//!   exactly (bytes written since may read old or new);
//! * no byte reads back a value never written there (checked for trimmed bytes too);
//! * clean valid lines not being changed since the last FLUSH come back (warm restart);
//! * stable: every byte of the hot area reads the same after the restart and again once
//!   its line has been evicted (dirty lines written back on the way);
//! * the reopened volume keeps working;
//! * `tiercache check`'s library finds no inconsistency on the crashed device.
//!
//! A second set of points cuts the power during writes to the metadata area and tears them at
//! 8-byte granularity (a device without atomic sector writes): records torn that way must be
//! caught by their checksums and dropped, and still no byte may read a never-written value.
//!
//! With data checksums (`--data-checksums`, the `*_checksums` tests) also: after recovery no
//! read finds a checksum mismatch (a crash never leaves good data with a stale checksum).
//! A third set (issue 14) fails the Nth write to the backing device (a write-back when the
//! cleaner or an eviction writes dirty lines back, a write-through write; every later one
//! too for even N), lets the workload go on (refused writes may read old or new bytes; the
//! volume keeps serving), then cuts the power (even N) or stops cleanly (odd N), and checks
//! the same after a restart with a healthy backing device.
//!
//! Default: 250 sector-torn points plus 50 sub-sector points over the five modes.
//! `TIERCACHE_CRASH_LONG=1`: 10,000 points (or `TIERCACHE_CRASH_POINTS=N`). A failure names
//! the mode, seed and crash point; rerun one with `TIERCACHE_CRASH_ONLY=mode:seed:N`.

mod common;

use common::*;
use rand::Rng;
use std::collections::HashSet;
use std::sync::Arc;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::check::check_device;
use tiercache_server::fault::Faults;
use tiercache_server::format::META_OFFSET;
use tiercache_server::{BlockDev, CacheVolume, FileDev, LineState, OpenOptions, Superblock};

const CACHE_LINES: u64 = 24;
/// Requests land in the first HOT bytes (40 lines for 24 cache lines: many evictions).
const HOT: u64 = 160 << 10;
const OPS: usize = 160;

#[derive(Clone, Copy, Debug)]
enum Act {
    Read(u64, u64),
    Write(u64, u64, bool),
    Trim(u64, u64),
    Flush,
    Clean,
}

fn workload(seed: u64) -> Vec<Act> {
    let mut r = rng(seed ^ 0x5eed_c4a5);
    (0..OPS)
        .map(|_| {
            if r.gen_bool(0.03) {
                return Act::Clean;
            }
            match random_op(&mut r, HOT) {
                (0, o, l, _) => Act::Read(o, l),
                (1, o, l, fua) => Act::Write(o, l, fua),
                (2, o, l, _) => Act::Trim(o, l),
                _ => Act::Flush,
            }
        })
        .collect()
}

fn data_for(i: usize, seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|k| {
            (i as u8).wrapping_mul(29) ^ (seed as u8).wrapping_mul(7) ^ (k as u8).rotate_left(2)
        })
        .collect()
}

/// Values each byte has ever held (initial or written): a 256-bit set per byte of HOT.
struct Ever(Vec<[u64; 4]>);

impl Ever {
    fn new() -> Ever {
        Ever(
            (0..HOT)
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

#[derive(Default)]
struct Tally {
    points: u64,
    crashed_in_open: u64,
    unchanged_lines: u64,
    unchanged_restored: u64,
    /// Clean lines dropped at open because their cache copy differed from the backing
    /// device (a write in flight at the crash reached one device only; `CacheVolume::open`
    /// compares clean lines with the backing device): not restored, rightly.
    dropped_differing: u64,
    bad_checksums: u64,
    duplicates: u64,
    checked: u64,
    /// Records unmapped ahead in batches (runs without a crash): the batched path ran.
    unmapped_ahead: u64,
    /// Chunk rewrites in the uncrashed runs (which count the events the points cover).
    chunk_rewrites: u64,
    /// Bytes read the same after the restart and after their line was evicted.
    stable_bytes: u64,
    /// Backing-error points: injected failures, runs left degraded at the stop.
    backing_errors: u64,
    degraded: u64,
}

/// Where to cut the power.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// At the Nth write or sync of either device; a write is torn by sectors.
    Event(u64),
    /// At the Nth write to the cache's metadata area, torn at 8-byte granularity.
    MetaWrite(u64),
    /// The Nth backing write fails (see the module doc).
    BackingWrite(u64),
}

thread_local! {
    /// The sweep being run counts backing writes (not events) as its points.
    static BACKING_SWEEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs the workload of `seed` in `mode`; with a crash point cuts the power there, recovers
/// and checks. Returns how many events and metadata writes the run made.
fn run(mode: Mode, sums: bool, seed: u64, crash: Option<Crash>, t: &mut Tally) -> (u64, u64) {
    let what = format!(
        "{mode:?}{} seed {seed} crash point {:?} (rerun: TIERCACHE_CRASH_ONLY={}:{seed}:{})",
        if sums { " with data checksums" } else { "" },
        crash,
        mode.as_str(),
        match crash {
            Some(Crash::Event(n)) => n.to_string(),
            Some(Crash::MetaWrite(n)) => format!("meta{n}"),
            // With the test's name: the event sweeps read the same string.
            Some(Crash::BackingWrite(n)) => n.to_string(),
            None => "-".into(),
        }
    );
    let backing_error = match crash {
        Some(Crash::BackingWrite(n)) => Some(n),
        _ => None,
    };
    let f = files_with(CACHE_LINES, 4096, sums);
    format_with(&f, mode, 4096, sums);
    // With data checksums this includes their region: tears there too.
    let meta = META_OFFSET..Superblock::data_offset_with(CACHE_LINES, 4096, sums);
    let faults = Faults::new(seed.wrapping_mul(1_000_003) ^ format!("{crash:?}").len() as u64);
    match crash {
        Some(Crash::Event(n)) => faults.crash_at(n, true),
        Some(Crash::MetaWrite(n)) => {
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
    let mut ever = Ever::new();
    // Clean lines at the last completed flush untouched since (checked after every request).
    let mut unchanged: HashSet<LineState> = HashSet::new();
    let vol = match CacheVolume::open(Box::new(cdev), Box::new(bdev), &OpenOptions::default()) {
        Ok((v, _)) => Some(v),
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
    let rewrite = REWRITE.with(|r| r.get());
    if let (Some(vol), true) = (&vol, rewrite) {
        vol.set_chunk_rewrite(64 << 10, 2).unwrap();
    }
    if let Some(vol) = &vol {
        for (i, act) in workload(seed).into_iter().enumerate() {
            let r = match act {
                Act::Read(o, l) => {
                    let mut buf = vec![0u8; l as usize];
                    let r = vol.read(o, &mut buf);
                    if r.is_ok() {
                        m.check_now(o as usize, &buf, &format!("{what}: op {i} read"));
                    }
                    r
                }
                Act::Write(o, l, fua) => {
                    let d = data_for(i, seed, l);
                    ever.add(o, &d);
                    let r = vol.write(o, &d, fua);
                    // A write that failed may have landed in part: old or new, not durable;
                    // refused for the backing device, old or new even after a FLUSH.
                    if r.is_err() && backing_error.is_some() {
                        m.trim(o as usize, l as usize);
                    } else {
                        m.write(o as usize, &d, fua && r.is_ok());
                    }
                    if fua && r.is_ok() {
                        unchanged = clean_set(&vol.lines());
                    }
                    r
                }
                Act::Trim(o, l) => {
                    m.trim(o as usize, l as usize);
                    vol.trim(o, l)
                }
                Act::Flush => {
                    let r = vol.flush();
                    if r.is_ok() {
                        m.flush();
                        unchanged = clean_set(&vol.lines());
                    }
                    r
                }
                // Chunk-rewrite cases: a full flush (`ctl flush`), so every dense chunk
                // is rewritten; durable once it returns.
                Act::Clean if rewrite => {
                    let r = vol.flush_dirty();
                    if r.is_ok() {
                        m.flush();
                        unchanged = clean_set(&vol.lines());
                    }
                    r
                }
                Act::Clean => vol.clean_if_needed().map(|_| ()),
            };
            if std::env::var("TIERCACHE_CRASH_VERBOSE").is_ok_and(|v| v == "2") {
                eprintln!(
                    "op {i} {act:?} -> {r:?}, {} events; unmapped ahead {:?}",
                    faults.events(),
                    vol.unmapped_ahead(),
                );
            }
            // A line written or trimmed since the FLUSH is not unchanged, even if its state
            // is the same: its slot and backing copies may land differently at the crash.
            if let Act::Write(o, l, _) | Act::Trim(o, l) = act {
                let (a, b) = (o / 4096, (o + l - 1) / 4096);
                unchanged.retain(|x| !(a..=b).contains(&x.key));
            }
            let now = clean_set(&vol.lines());
            // Lines whose record was unmapped ahead of their eviction (or may have been, in a
            // batch the crash cut) are not expected back.
            let ahead = vol.unmapped_ahead();
            unchanged.retain(|l| now.contains(l) && !ahead.contains(&l.slot));
            if let Err(e) = r {
                if backing_error.is_some() {
                    // Failed for the backing device (a refused write, a failed read fill or
                    // FLUSH): the volume goes on.
                    assert!(
                        !vol.cache_failed(),
                        "{what}: op {i}: backing errors failed the cache: {e}"
                    );
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
        t.degraded += v.degraded() as u64;
        if n.is_multiple_of(2) {
            faults.power_cut();
        } else {
            v.shutdown()
                .unwrap_or_else(|e| panic!("{what}: clean stop after backing errors: {e}"));
            stopped_cleanly = true;
        }
    }
    let Some(crash) = crash else {
        let n = if BACKING_SWEEP.with(|c| c.get()) {
            (bh.writes(), bh.writes())
        } else {
            (faults.events(), faults.matched_writes())
        };
        if let Some(v) = &vol {
            t.unmapped_ahead += v.stats().unmap_ahead;
            t.chunk_rewrites += v.stats().totals.chunk_rewrites;
        }
        if let Some(v) = vol {
            v.shutdown().unwrap();
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

    // The offline check agrees: torn records and superseded duplicates are expected after a
    // crash, inconsistencies are not.
    let chk = check_device(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert!(chk.ok(), "{what}: tiercache check found {:?}", chk.problems);
    t.checked += 1;
    let (vol, rep) = open(&f, None);
    assert!(
        !rep.was_clean || crashed_in_open || stopped_cleanly,
        "{what}"
    );
    t.bad_checksums += rep.dropped_bad_checksum;
    t.duplicates += rep.dropped_duplicates;
    // Warm means the line is back in its slot with its bytes. It may come back dirty: the
    // unmap-ahead pass can write lines back after a request's FLUSH.
    let now: HashSet<LineState> = vol
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

    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    // Without atomic sector writes a torn record of a dirty line loses that line's
    // unflushed-and-flushed data to the backing's older copy: only "never written" holds.
    let strict = matches!(crash, Crash::Event(_)) || mode != Mode::WriteBack;
    if strict {
        m.check_after_crash(0, &buf, &format!("{what} after recovery ({rep:?})"));
    }
    for (i, &b) in buf.iter().enumerate() {
        let ok = if (i as u64) < HOT {
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
    // the cache (evicted by reads of twice the cache's worth of other lines; dirty ones
    // written back on the way), until it is written again.
    if mode != Mode::PassThrough {
        let mut line = vec![0u8; 4096];
        for l in HOT / 4096 + 8..HOT / 4096 + 8 + 2 * CACHE_LINES {
            vol.read(l * 4096, &mut line).unwrap();
        }
        let left: Vec<u64> = vol
            .lines()
            .iter()
            .map(|l| l.key)
            .filter(|&k| k < HOT / 4096)
            .collect();
        assert!(left.is_empty(), "{what}: lines {left:?} not evicted");
    }
    let mut again = vec![0u8; HOT as usize];
    vol.read(0, &mut again).unwrap();
    assert_stable_after_eviction(&what, &buf[..HOT as usize], &again, &rep);
    if sums {
        let st = vol.stats();
        assert!(
            st.data_checksums && st.checksum_errors == 0 && st.lost_dirty_ranges.is_empty(),
            "{what}: good data reported damaged after the crash: {} checksum errors, lost {:?} ({rep:?})",
            st.checksum_errors,
            st.lost_dirty_ranges
        );
    }
    t.stable_bytes += HOT;
    // The recovered volume keeps working.
    let d = vec![0xa5; 9000];
    vol.write(3001, &d, true).unwrap();
    let mut back = vec![0u8; 9000];
    vol.read(3001, &mut back).unwrap();
    assert_eq!(back, d, "{what}: write after recovery");
    vol.shutdown().unwrap();
    (0, 0)
}

fn clean_set(lines: &[LineState]) -> HashSet<LineState> {
    lines.iter().filter(|l| l.dirty == 0).copied().collect()
}

fn budget() -> u64 {
    crash_budget(250, 10_000)
}

/// Crash points for one mode: `points` of them, spread over every event of successive seeds'
/// workloads (all of them when the budget allows), at most 60 per seed.
fn sweep(mode: Mode, sums: bool, points: u64, meta: bool, seed0: u64) -> Tally {
    let mut t = Tally::default();
    crash_sweep(mode, points, meta, seed0, 60, 0xc4a5, |seed, c| {
        let c = c.map(|(m, n)| {
            if m {
                Crash::MetaWrite(n)
            } else {
                Crash::Event(n)
            }
        });
        run(mode, sums, seed, c, &mut t)
    });
    t
}

fn check_mode(mode: Mode, share: f64) {
    check_mode_with(mode, share, false)
}

fn check_mode_with(mode: Mode, share: f64, sums: bool) {
    let start = std::time::Instant::now();
    let pts = ((budget() as f64 * share).ceil() as u64).max(1);
    let t = sweep(mode, sums, pts, false, 0);
    let sub = sweep(mode, sums, (pts / 5).max(1), true, 1000);
    println!(
        "{mode:?}{}: {} crash points (+{} with 8-byte tears) passed in {:.1} s; {} crashed during open; \
         warm: {} of {} unchanged clean lines restored ({} dropped: differing from the backing device); {} (+{}) torn records caught by checksum, {} duplicates resolved; \
         {} records unmapped ahead in batches; {} bytes read the same after eviction",
        if sums { " with data checksums" } else { "" },
        t.points,
        sub.points,
        start.elapsed().as_secs_f64(),
        t.crashed_in_open + sub.crashed_in_open,
        t.unchanged_restored,
        t.unchanged_lines,
        t.dropped_differing,
        t.bad_checksums,
        sub.bad_checksums,
        t.duplicates + sub.duplicates,
        t.unmapped_ahead + sub.unmapped_ahead,
        t.stable_bytes + sub.stable_bytes,
    );
    if std::env::var("TIERCACHE_CRASH_ONLY").is_ok() {
        return;
    }
    assert!(
        t.points >= pts,
        "{mode:?}: {} of {pts} points ran",
        t.points
    );
    assert_eq!(
        t.checked, t.points,
        "{mode:?}: every crashed device went through check"
    );
    if mode != Mode::PassThrough {
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

/// Issue 14: a backing-device error at each backing write of a run (write-backs of cleaning
/// passes and evictions; write-through writes), then a crash or a clean stop.
fn check_backing_errors(mode: Mode) {
    let start = std::time::Instant::now();
    BACKING_SWEEP.with(|c| c.set(true));
    let mut t = Tally::default();
    let pts = (budget() / 6).max(4);
    crash_sweep(mode, pts, false, 2000, 20, 0xbac4, |seed, c| {
        run(
            mode,
            false,
            seed,
            c.map(|(_, n)| Crash::BackingWrite(n)),
            &mut t,
        )
    });
    BACKING_SWEEP.with(|c| c.set(false));
    println!(
        "{mode:?}: {} backing-write error points passed in {:.1} s: {} injected failures, {} runs degraded at the stop; {} bytes read the same after eviction",
        t.points,
        start.elapsed().as_secs_f64(),
        t.backing_errors,
        t.degraded,
        t.stable_bytes
    );
    assert_backing_sweep_bit(mode, t.points, pts, t.backing_errors, t.degraded);
}

#[test]
fn backing_errors_during_cleaning_write_back() {
    check_backing_errors(Mode::WriteBack);
}

#[test]
fn backing_errors_write_through() {
    check_backing_errors(Mode::WriteThrough);
}

thread_local! {
    /// This thread's runs use small chunk rewrites (64 KiB from 2 dirty runs) and clean
    /// with full flushes.
    static REWRITE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Crash points inside chunk rewrites (cleaning writes dense 64 KiB chunks whole, gaps read
/// from the backing device or clean copies): same guarantees as plain write-backs.
#[test]
fn crash_points_chunk_rewrites() {
    REWRITE.with(|r| r.set(true));
    check_mode(Mode::WriteBack, 0.2);
    let t = sweep(Mode::WriteBack, false, 5, false, 0);
    println!("{} chunk rewrites in the uncrashed runs", t.chunk_rewrites);
    assert!(
        t.chunk_rewrites > 0,
        "the workload planned no chunk rewrite"
    );
}

// Shares of the budget: write-back gets the most (dirty data, write-backs, cleaning).
#[test]
fn crash_points_write_back() {
    check_mode(Mode::WriteBack, 0.36);
}

// The same crash points with data checksums: the checksum of every slot write is durable no
// later than the record that maps it, and a line written in place at the crash has its
// checksums recomputed (`tiercache_server::data_sums`).
#[test]
fn crash_points_write_back_checksums() {
    check_mode_with(Mode::WriteBack, 0.36, true);
}

#[test]
fn crash_points_write_through_checksums() {
    check_mode_with(Mode::WriteThrough, 0.2, true);
}

#[test]
fn crash_points_write_through() {
    check_mode(Mode::WriteThrough, 0.2);
}

#[test]
fn crash_points_write_around() {
    check_mode(Mode::WriteAround, 0.16);
}

#[test]
fn crash_points_read_only() {
    check_mode(Mode::ReadOnly, 0.16);
}

#[test]
fn crash_points_pass_through() {
    check_mode(Mode::PassThrough, 0.12);
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
