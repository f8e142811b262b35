//! The durable key of each slot is kept as a difference from the record image (a diverged
//! bit and a side map of slots whose durable record maps a line the image no longer has
//! there, `volume/durable.rs`); past a bound of side entries a request flushes the records
//! first. These crash points run a workload that drops many cached lines (trims, with few
//! FLUSHes) on a volume whose bound is lowered to 2, so the side map passes the bound again
//! and again, and cut the power at every kind of event (writes and syncs of both devices,
//! torn): after the restart no block reads bytes never written there, everything durable
//! before the crash reads back, what a block reads stays once its line is evicted, and
//! `tiercache check` finds the device consistent. The uncrashed runs prove the bound bit
//! (forced flushes happened) and held (the map never grew past bound + one request's lines).
//!
//! `TIERCACHE_CRASH_POINTS=N` changes the points per mode (default 60).

mod common;

use common::*;
use rand::Rng;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::check::check_device;
use tiercache_server::fault::Faults;
use tiercache_server::{CacheVolume, FileDev, LiveVolume, OpenOptions};

const LS: u64 = 4096;
const CACHE_LINES: u64 = 32;
/// Lines of the workload's area (4x the cache).
const HOT: u64 = 128;
const OPS: usize = 150;
const BOUND: usize = 2;
/// Lines one request drops at most (the workload's longest trim).
const MAX_TRIM: u64 = 8;

#[derive(Clone, Debug)]
enum Act {
    Read(u64, u64),
    /// Whole lines from `line`, the version tag of each, FUA.
    Write(u64, Vec<u8>, bool),
    Trim(u64, u64),
    Flush,
    Clean,
}

/// Byte `k` of a line written with version `tag` (tag 0: never used).
fn pattern(tag: u8, k: u64) -> u8 {
    tag.wrapping_mul(31) ^ (k as u8).rotate_left(3) ^ (k >> 9) as u8
}

fn workload(seed: u64) -> Vec<Act> {
    let mut r = rng(seed ^ 0xd17e);
    let mut tag = 0u8;
    (0..OPS)
        .map(|i| match (i % 40, r.gen_range(0..100)) {
            // A FLUSH, then a burst of trims dropping lines whose records it made durable.
            (30, _) => Act::Flush,
            (31..=36, _) => {
                let n = r.gen_range(MAX_TRIM / 2..=MAX_TRIM);
                Act::Trim(r.gen_range(0..HOT - n), n)
            }
            (_, x) => match x {
                0..=29 => {
                    let n = r.gen_range(1..4);
                    Act::Read(r.gen_range(0..HOT - n), n)
                }
                30..=69 => {
                    let n = r.gen_range(1..4);
                    let tags = (0..n)
                        .map(|_| {
                            tag = tag.wrapping_add(1).max(1);
                            tag
                        })
                        .collect();
                    Act::Write(r.gen_range(0..HOT - n), tags, r.gen_bool(0.02))
                }
                70..=91 => {
                    let n = r.gen_range(2..=MAX_TRIM);
                    Act::Trim(r.gen_range(0..HOT - n), n)
                }
                92..=97 => Act::Clean,
                _ => Act::Flush,
            },
        })
        .collect()
}

fn line_bytes(tag: u8) -> Vec<u8> {
    (0..LS).map(|k| pattern(tag, k)).collect()
}

/// Runs `seed`'s workload with the power cut at event `crash`; returns the events counted
/// (for the sweep) and checks the restart when it crashed.
fn run(mode: Mode, seed: u64, crash: Option<u64>, forced: &mut u64) -> (u64, u64) {
    let what = format!(
        "{mode:?} seed {seed} crash point {crash:?} (rerun: TIERCACHE_CRASH_ONLY={}:{seed}:{})",
        mode.as_str(),
        crash.map_or("-".into(), |n| n.to_string())
    );
    let f = files(CACHE_LINES, LS);
    format(&f, mode, LS);
    let faults = Faults::new(seed.wrapping_mul(7_000_003) ^ crash.unwrap_or(0));
    if let Some(n) = crash {
        faults.crash_at(n, true);
    }
    let (cdev, _) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), true);
    let (bdev, _) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let mut m = Model::new(0, VOL);
    // Version tags each line has held (besides its initial bytes).
    let mut ever: Vec<Vec<u8>> = vec![Vec::new(); HOT as usize];
    let vol = match CacheVolume::open(Box::new(cdev), Box::new(bdev), &OpenOptions::default()) {
        Ok((v, _)) => Some(v),
        Err(e) => {
            assert!(
                faults.power_lost(),
                "{what}: open failed without a crash: {e}"
            );
            None
        }
    };
    if let Some(vol) = &vol {
        vol.set_diverged_bound(BOUND);
        for (i, act) in workload(seed).into_iter().enumerate() {
            let r = match &act {
                Act::Read(l, n) => {
                    let mut buf = vec![0u8; (n * LS) as usize];
                    let r = vol.read(l * LS, &mut buf);
                    if r.is_ok() {
                        m.check_now((l * LS) as usize, &buf, &format!("{what}: op {i} read"));
                    }
                    r
                }
                Act::Write(l, tags, fua) => {
                    let data: Vec<u8> = tags.iter().flat_map(|&t| line_bytes(t)).collect();
                    for (k, &t) in tags.iter().enumerate() {
                        ever[*l as usize + k].push(t);
                    }
                    let r = vol.write(l * LS, &data, *fua);
                    m.write((l * LS) as usize, &data, *fua && r.is_ok());
                    r
                }
                Act::Trim(l, n) => {
                    m.trim((l * LS) as usize, (n * LS) as usize);
                    vol.trim(l * LS, n * LS)
                }
                Act::Flush => {
                    let r = vol.flush();
                    if r.is_ok() {
                        m.flush();
                    }
                    r
                }
                Act::Clean => vol.clean_if_needed().map(|_| ()),
            };
            if let Err(e) = r {
                assert!(
                    faults.power_lost(),
                    "{what}: op {i} {act:?} failed without a crash: {e}"
                );
                break;
            }
            let (side, _) = vol.diverged_side();
            assert!(
                side <= BOUND + MAX_TRIM as usize,
                "{what}: op {i} {act:?}: {side} side entries, bound {BOUND}"
            );
        }
    }
    let Some(_) = crash else {
        let vol = vol.expect("no crash, the volume opened");
        if std::env::var("TIERCACHE_CRASH_VERBOSE").is_ok() {
            eprintln!("{what}: side map {:?}", vol.diverged_side());
        }
        *forced += vol.diverged_side().1;
        LiveVolume::shutdown(&vol).unwrap();
        return (faults.events(), 0);
    };
    if !faults.power_lost() {
        faults.power_cut();
    }
    drop(vol);
    let chk = check_device(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert!(chk.ok(), "{what}: tiercache check found {:?}", chk.problems);
    let (vol, rep) = open(&f, None);
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    m.check_after_crash(0, &buf, &format!("{what} after recovery ({rep:?})"));
    // Every sector holds its initial bytes or one whole version written to its line.
    for (s, got) in buf.chunks(512).enumerate() {
        let at = s as u64 * 512;
        let (line, k0) = (at / LS, at % LS);
        let initial_ok = got
            .iter()
            .enumerate()
            .all(|(k, &b)| b == initial(at + k as u64));
        let version_ok = line < HOT
            && ever[line as usize].iter().any(|&t| {
                got.iter()
                    .enumerate()
                    .all(|(k, &b)| b == pattern(t, k0 + k as u64))
            });
        assert!(
            initial_ok || version_ok,
            "{what}: sector at {at} (line {line}) reads bytes never written there ({rep:?})"
        );
    }
    // Stable: reads of twice the cache's worth of other lines evict every line of the area
    // (dirty ones written back first); each block reads the same as after the restart.
    if mode != Mode::PassThrough {
        let mut line = vec![0u8; LS as usize];
        for l in HOT + 8..HOT + 8 + 2 * CACHE_LINES {
            vol.read(l * LS, &mut line).unwrap();
        }
    }
    let mut again = vec![0u8; (HOT * LS) as usize];
    vol.read(0, &mut again).unwrap();
    assert_stable_after_eviction(&what, &buf[..(HOT * LS) as usize], &again, &rep);
    LiveVolume::shutdown(&vol).unwrap();
    (0, 0)
}

fn sweep(mode: Mode) {
    let points = crash_budget(60, 2000);
    let mut forced = 0;
    crash_sweep(mode, points, false, 0, 20, 0xb0d, |seed, c| {
        run(mode, seed, c.map(|(_, n)| n), &mut forced)
    });
    if std::env::var("TIERCACHE_CRASH_ONLY").is_err() {
        assert!(
            forced > 0,
            "{mode:?}: the side map never passed the bound; the crash points miss it"
        );
        eprintln!("{mode:?}: {points} crash points, {forced} records flushes forced by the bound");
    }
}

#[test]
fn crash_points_past_the_diverged_bound_write_back() {
    sweep(Mode::WriteBack);
}

#[test]
fn crash_points_past_the_diverged_bound_write_through() {
    sweep(Mode::WriteThrough);
}
