//! Device faults through `tiercache_server::fault`: a cache read error on a clean line is
//! served from the backing device; a cache write error drops the line and goes on; past the
//! error threshold the cache writes back what it can and passes everything through; a cache
//! device lost in write-back reports exactly which dirty ranges were lost and never returns
//! stale data for them; a backing-device error fails only its request. A seeded swarm mixes
//! random requests with random injected cache errors against a reference model.

mod common;

use common::*;
use rand::Rng;
use std::sync::Arc;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::{CacheVolume, FileDev, OpenOptions, Superblock};

struct Rig {
    f: Files,
    vol: CacheVolume,
    cache: FaultHandle,
    backing: FaultHandle,
    data: std::ops::Range<u64>,
}

fn rig(mode: Mode, lines: u64, seed: u64) -> Rig {
    let f = files(lines, 4096);
    format(&f, mode, 4096);
    let faults = Faults::new(seed);
    let (c, cache) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (b, backing) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    // A failed cache records its failure here (writes fail while it is recorded nowhere).
    let opts = OpenOptions {
        state_path: Some(tiercache_server::state_file::beside(&f.cache)),
        ..Default::default()
    };
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    let start = Superblock::data_offset_for(lines, 4096);
    Rig {
        f,
        vol,
        cache,
        backing,
        data: start..start + lines * 4096,
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31) ^ (seed as u8).wrapping_mul(101) ^ 0x3c)
        .collect()
}

#[test]
fn cache_read_error_on_a_clean_line_is_served_from_the_backing_device() {
    let r = rig(Mode::WriteThrough, 64, 1);
    let mut buf = vec![0u8; 64 * 4096];
    r.vol.read(0, &mut buf).unwrap();
    assert_eq!(r.vol.stats().cached_lines, 64);
    r.cache.fail_reads(r.data.clone());
    for i in 0..8u64 {
        let mut b = vec![0u8; 10_000];
        r.vol
            .read(i * 20_000 + 7, &mut b)
            .expect("the client never sees a cache read error on clean data");
        assert!(b
            .iter()
            .enumerate()
            .all(|(k, &v)| v == initial(i * 20_000 + 7 + k as u64)));
    }
    let st = r.vol.stats();
    assert!(r.cache.injected() >= 8 && st.cache_errors >= 8, "{st:?}");
    assert!(
        !st.cache_failed && st.lost_dirty_ranges.is_empty(),
        "{st:?}"
    );
    assert!(
        st.cached_lines < 64,
        "the failing lines were dropped: {st:?}"
    );
    // Healed: misses repopulate and hit again.
    r.cache.heal();
    r.vol.read(0, &mut buf).unwrap();
    let hits = r.vol.stats().totals.line_hits;
    r.vol.read(0, &mut buf).unwrap();
    assert!(r.vol.stats().totals.line_hits >= hits + 64);
    assert!(buf.iter().enumerate().all(|(k, &v)| v == initial(k as u64)));
}

#[test]
fn cache_write_error_drops_the_line_and_goes_on() {
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        let r = rig(mode, 64, 2);
        r.vol.set_max_cache_errors(1000);
        r.cache.fail_writes(r.data.clone());
        let d = pattern(3, 50_000);
        r.vol.write(1234, &d, false).expect("write survives");
        r.vol.flush().unwrap();
        let mut b = vec![0u8; 50_000];
        r.vol.read(1234, &mut b).unwrap();
        assert_eq!(b, d, "{mode:?}");
        let st = r.vol.stats();
        assert!(st.cache_errors >= 1 && !st.cache_failed, "{mode:?} {st:?}");
        assert_eq!(
            st.dirty_lines, 0,
            "{mode:?}: nothing dirty sits in a failed slot"
        );
        assert!(st.lost_dirty_ranges.is_empty(), "{mode:?}");
        // The data is on the backing device itself.
        let on_disk = std::fs::read(&r.f.backing).unwrap();
        assert_eq!(&on_disk[1234..51_234], &d[..], "{mode:?}");
        r.cache.heal();
        r.vol.write(100_000, &d, false).unwrap();
        r.vol.read(100_000, &mut b).unwrap();
        assert_eq!(b, d);
    }
}

#[test]
fn past_the_threshold_the_cache_writes_back_and_passes_through() {
    let r = rig(Mode::WriteBack, 64, 3);
    r.vol.set_max_cache_errors(4);
    let d = pattern(4, 200_000);
    r.vol.write(0, &d, false).unwrap();
    r.vol.flush().unwrap();
    assert!(r.vol.stats().dirty_lines > 40);
    // Writes to the cache fail from now on; reads still work, so every dirty byte is saved.
    r.cache.fail_writes(r.data.clone());
    let d2 = pattern(5, 4096);
    for i in 0..6u64 {
        r.vol.write(300_000 + i * 8192, &d2, false).unwrap();
    }
    let st = r.vol.stats();
    assert!(st.cache_failed, "{st:?}");
    assert_eq!(st.mode, "pass-through");
    assert_eq!((st.cached_lines, st.dirty_lines), (0, 0));
    assert!(st.lost_dirty_ranges.is_empty(), "{st:?}");
    let prom = r.vol.metrics().prometheus(&st);
    assert!(prom.contains("tiercache_cache_failed 1"), "{prom}");
    assert!(
        prom.contains("tiercache_cache_device_errors_total 4"),
        "{prom}"
    );
    // Everything is on the backing device, and served from it.
    let on_disk = std::fs::read(&r.f.backing).unwrap();
    assert_eq!(&on_disk[..200_000], &d[..]);
    let mut b = vec![0u8; 200_000];
    r.vol.read(0, &mut b).unwrap();
    assert_eq!(b, d);
    r.vol.write(5, &d2, true).unwrap();
    assert_eq!(&std::fs::read(&r.f.backing).unwrap()[5..4101], &d2[..]);
    // The cache device's superblock is erased: it is not reopened with stale records.
    r.vol.shutdown().unwrap();
    let e = CacheVolume::open(
        Box::new(FileDev::open(&r.f.cache).unwrap()),
        Box::new(FileDev::open(&r.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .err();
    assert!(e.is_some_and(|e| e.to_string().contains("magic")));
}

/// Byte ranges of the dirty sectors the volume holds (sector 512 B for 4 KiB lines).
fn dirty_ranges(vol: &CacheVolume) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = Vec::new();
    let mut lines = vol.lines();
    lines.sort_by_key(|l| l.key);
    for l in lines {
        for k in 0..8u64 {
            if l.dirty >> k & 1 == 1 {
                let a = l.key * 4096 + k * 512;
                match v.last_mut() {
                    Some(last) if last.1 == a => last.1 = a + 512,
                    _ => v.push((a, a + 512)),
                }
            }
        }
    }
    v
}

#[test]
fn cache_lost_in_write_back_reports_exactly_the_lost_dirty_ranges() {
    let r = rig(Mode::WriteBack, 128, 4);
    let mut m = Model::new(0, VOL);
    let mut rng = rng(44);
    for i in 0..120 {
        let len = rng.gen_range(1..9000u64);
        let off = rng.gen_range(0..VOL - len);
        let d = pattern(i, len as usize);
        r.vol.write(off, &d, false).unwrap();
        m.write(off as usize, &d, false);
    }
    r.vol.flush().unwrap();
    let expect = dirty_ranges(&r.vol);
    assert!(expect.len() > 10, "{expect:?}");
    r.cache.lose();
    // Every 4 KiB block: a read fails exactly when it holds lost dirty data, else it is right.
    for blk in 0..VOL / 4096 {
        let (a, b) = (blk * 4096, blk * 4096 + 4096);
        let mut buf = vec![0u8; 4096];
        let res = r.vol.read(a, &mut buf);
        let lost = expect.iter().any(|&(x, y)| x < b && a < y);
        match res {
            Ok(()) => {
                assert!(!lost, "block {blk} holds lost dirty data but read fine");
                m.check_now(a as usize, &buf, &format!("block {blk} after the loss"));
            }
            Err(e) => assert!(lost, "block {blk}: {e}"),
        }
    }
    let st = r.vol.stats();
    assert!(st.cache_failed, "{st:?}");
    assert_eq!(
        r.vol.lost_dirty_ranges(),
        expect,
        "exactly the dirty ranges are reported"
    );
    assert_eq!(st.lost_dirty_ranges, expect);
    assert_eq!(
        st.lost_dirty_bytes,
        expect.iter().map(|(a, b)| b - a).sum::<u64>()
    );
    // Rewriting a lost range makes it readable again; the rest stays lost.
    let (a, b) = expect[0];
    let d = pattern(999, (b - a) as usize);
    r.vol.write(a, &d, false).unwrap();
    let mut back = vec![0u8; d.len()];
    r.vol.read(a, &mut back).unwrap();
    assert_eq!(back, d);
    assert_eq!(r.vol.lost_dirty_ranges(), expect[1..].to_vec());
    // FLUSH still works (backing only), and other requests are served.
    r.vol.flush().unwrap();
}

#[test]
fn backing_errors_fail_only_their_request() {
    let r = rig(Mode::WriteThrough, 32, 5);
    r.backing.fail_reads(40_960..45_056);
    let mut b = vec![0u8; 4096];
    let e = r.vol.read(40_000, &mut b).unwrap_err();
    assert!(e.to_string().contains("backing"), "{e}");
    // Neighbours and everything else still work, from other threads too.
    let vol = Arc::new(r.vol);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let vol = &vol;
            s.spawn(move || {
                let mut b = vec![0u8; 4096];
                for i in 0..50u64 {
                    let off = 50_000 + t * 200_000 + i * 3000;
                    vol.read(off, &mut b).unwrap();
                    assert!(b
                        .iter()
                        .enumerate()
                        .all(|(k, &v)| v == initial(off + k as u64)));
                }
            });
        }
    });
    r.backing.fail_writes(90_000..90_001);
    assert!(vol.write(89_000, &[7; 2000], false).is_err());
    vol.write(95_000, &[8; 2000], false).unwrap();
    r.backing.heal();
    vol.read(40_000, &mut b).unwrap();
    assert!(b
        .iter()
        .enumerate()
        .all(|(k, &v)| v == initial(40_000 + k as u64)));
    let st = vol.stats();
    assert!(st.backing_errors >= 2 && !st.cache_failed, "{st:?}");
    assert_eq!(st.cache_errors, 0);
}

/// Random requests in write-back and write-through while random cache ranges fail reads or
/// writes for a while: a read either fails because it overlaps data reported lost, or returns
/// exactly what was last written.
#[test]
fn swarm_of_cache_faults_never_returns_wrong_data() {
    let seeds: u64 = std::env::var("TIERCACHE_FAULT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let mut injected = 0;
    for seed in 0..seeds {
        let mode = if seed % 3 == 2 {
            Mode::WriteThrough
        } else {
            Mode::WriteBack
        };
        let r = rig(mode, 24, 100 + seed);
        r.vol
            .set_max_cache_errors(if seed % 4 == 0 { 5 } else { 1_000_000 });
        let mut m = Model::new(0, VOL);
        let mut rng = rng(seed + 7000);
        let hot = 160 << 10;
        for i in 0..400 {
            if rng.gen_bool(0.04) {
                let a = r.data.start + rng.gen_range(0..24) * 4096;
                let len = rng.gen_range(512..3 * 4096);
                if rng.gen_bool(0.5) {
                    r.cache.fail_reads(a..a + len);
                } else {
                    r.cache.fail_writes(a..a + len);
                }
            }
            if rng.gen_bool(0.03) {
                r.cache.heal();
            }
            let (kind, off, len, fua) = random_op(&mut rng, hot);
            let what = format!("{mode:?} seed {seed} op {i}");
            if std::env::var("TIERCACHE_FAULT_VERBOSE").is_ok() {
                let st = r.vol.stats();
                eprintln!(
                    "{what}: {kind} {off}+{len} fua {fua}; errors {} failed {} lost {:?} lines {:?}",
                    st.cache_errors,
                    st.cache_failed,
                    st.lost_dirty_ranges,
                    r.vol.lines().iter().filter(|l| l.key == 27).collect::<Vec<_>>()
                );
            }
            match kind {
                0 => {
                    let mut buf = vec![0u8; len as usize];
                    match r.vol.read(off, &mut buf) {
                        Ok(()) => m.check_now(off as usize, &buf, &what),
                        Err(e) => {
                            let lost = r.vol.lost_dirty_ranges();
                            assert!(
                                lost.iter().any(|&(x, y)| x < off + len && off < y),
                                "{what}: read {off}+{len} failed without lost data: {e}"
                            );
                        }
                    }
                }
                1 => {
                    let d = pattern(i as u64 ^ seed << 9, len as usize);
                    r.vol
                        .write(off, &d, fua)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    m.write(off as usize, &d, fua);
                }
                2 => {
                    r.vol.trim(off, len).unwrap();
                    m.trim(off as usize, len as usize);
                }
                _ => {
                    // A flush fails only when dirty data was lost with a failing cache.
                    if let Err(e) = r.vol.flush() {
                        assert!(!r.vol.lost_dirty_ranges().is_empty(), "{what}: {e}");
                    }
                    m.flush();
                }
            }
        }
        injected += r.cache.injected();
        r.cache.heal();
        // Everything not lost reads back exactly.
        let lost = r.vol.lost_dirty_ranges();
        for blk in 0..VOL / 4096 {
            let (a, b) = (blk * 4096, blk * 4096 + 4096);
            let mut buf = vec![0u8; 4096];
            let res = r.vol.read(a, &mut buf);
            let is_lost = lost.iter().any(|&(x, y)| x < b && a < y);
            match res {
                Ok(()) => m.check_now(a as usize, &buf, &format!("seed {seed} final block {blk}")),
                Err(e) => assert!(is_lost, "seed {seed} final block {blk}: {e}"),
            }
        }
    }
    println!("{seeds} seeds, {injected} cache errors injected, no wrong data returned");
    assert!(injected > seeds * 3, "few faults were injected: {injected}");
}

/// ENOSPC as `std::io::Error::raw_os_error` reports it on Linux.
const ENOSPC: i32 = 28;

/// Issue 14 item 1: write-back must never drop dirty data when the BACKING device fails
/// writes. X is written and flushed (dirty in the cache), some clean lines are read in, then
/// every backing write fails (EIO, or ENOSPC: a full file system): writes keep being
/// accepted while free slots or clean lines remain (never evicting X), the one after fails
/// with the backing device's error, X and the accepted writes read back from the cache, the
/// volume says it is degraded; healed, the dirty lines reach the backing device and survive a
/// clean restart and a crash (no shutdown).
#[test]
fn backing_write_errors_keep_dirty_lines_until_written_back() {
    for (errno, crash) in [(None, false), (Some(ENOSPC), false), (None, true)] {
        let what = format!("errno {errno:?}, crash {crash}");
        let r = rig(Mode::WriteBack, 16, 7);
        let x = pattern(9, 4096);
        r.vol.write(0, &x, false).unwrap();
        r.vol.flush().unwrap();
        let mut b = vec![0u8; 4096];
        for l in 1..9u64 {
            r.vol.read(l * 4096, &mut b).unwrap();
        }
        assert_eq!(r.vol.stats().cached_lines, 9, "{what}");
        r.backing.fail_writes(0..VOL);
        if let Some(n) = errno {
            r.backing.fail_with_errno(n);
        }
        // 7 free slots, then 8 clean lines to evict: 15 writes fit; X is never evicted.
        let mut written = Vec::new();
        let mut refused = None;
        for l in 20..40u64 {
            let d = pattern(l, 4096);
            match r.vol.write(l * 4096, &d, false) {
                Ok(()) => written.push((l, d)),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        assert_eq!(
            written.len(),
            15,
            "{what}: writes accepted while there was room"
        );
        let e = refused.expect("a write needing a dirty eviction fails");
        if errno == Some(ENOSPC) {
            assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{what}: {e}");
        }
        // Cleaning fails too, and drops nothing.
        assert!(r.vol.flush_dirty().is_err(), "{what}");
        r.vol.read(0, &mut b).expect("X is served from the cache");
        assert_eq!(b, x, "{what}: X while the backing device fails");
        for (l, d) in &written {
            r.vol.read(l * 4096, &mut b).unwrap();
            assert_eq!(&b, d, "{what}: line {l}");
        }
        // Reads of uncached data still go to the backing device.
        r.vol.read(60 * 4096, &mut b).unwrap();
        assert!(b
            .iter()
            .enumerate()
            .all(|(k, &v)| v == initial(60 * 4096 + k as u64)));
        let st = r.vol.stats();
        assert!(st.lost_dirty_ranges.is_empty(), "{what}: {st:?}");
        assert_eq!(st.dirty_lines, 16, "{what}: {st:?}");
        degraded_checks(&r.vol, true, &what);
        r.backing.heal();
        if crash {
            // Power cut after the heal, before anything was written back: the flushed
            // records bring X back dirty.
            drop(r.vol);
        } else {
            r.vol.flush_dirty().unwrap();
            degraded_checks(&r.vol, false, &what);
            assert_eq!(r.vol.stats().dirty_lines, 0, "{what}");
            r.vol.shutdown().unwrap();
            drop(r.vol);
            let on_disk = std::fs::read(&r.f.backing).unwrap();
            assert_eq!(&on_disk[..4096], &x[..], "{what}: X on the backing device");
        }
        let (vol, _) = open(&r.f, None);
        vol.read(0, &mut b).unwrap();
        assert_eq!(b, x, "{what}: X after the restart");
        if !crash {
            for (l, d) in &written {
                vol.read(l * 4096, &mut b).unwrap();
                assert_eq!(&b, d, "{what}: line {l} after the restart");
            }
        }
    }
}

/// The volume's own account of a failing backing device: stats, metrics.
fn degraded_checks(vol: &CacheVolume, degraded: bool, what: &str) {
    let st = vol.stats();
    assert_eq!(st.degraded, degraded, "{what}: {st:?}");
    assert_eq!(vol.degraded(), degraded, "{what}");
    assert_eq!(st.degraded_reason.is_some(), degraded, "{what}: {st:?}");
    assert!(st.backing_write_errors >= 1, "{what}: {st:?}");
    let prom = vol.metrics().prometheus(&st);
    let gauge = format!("tiercache_degraded {}", degraded as u8);
    assert!(prom.contains(&gauge), "{what}: {prom}");
    assert!(
        prom.contains("tiercache_backing_write_back_errors_total"),
        "{what}"
    );
}

/// The background cleaner's half of item 1: a failed cleaning pass degrades the volume
/// without dropping anything, retries wait for the backoff (100 ms, then doubling), and the
/// first successful retry after the backing device heals ends the degraded state.
#[test]
fn failed_cleaning_is_retried_with_backoff() {
    let r = rig(Mode::WriteBack, 16, 8);
    let x = pattern(10, 3 * 4096);
    r.vol.write(4096, &x, false).unwrap();
    r.backing.fail_writes(0..VOL);
    assert!(r.vol.flush_dirty().is_err());
    degraded_checks(&r.vol, true, "after a failed cleaning pass");
    assert_eq!(r.vol.stats().dirty_lines, 3);
    // Within the backoff: nothing is tried.
    let injected = r.backing.injected();
    assert!(!r.vol.clean_if_needed().unwrap());
    assert_eq!(r.backing.injected(), injected);
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert!(r.vol.clean_if_needed().is_err(), "retried, failed again");
    assert!(r.backing.injected() > injected);
    assert_eq!(r.vol.stats().dirty_lines, 3);
    r.backing.heal();
    assert!(
        !r.vol.clean_if_needed().unwrap(),
        "backoff doubled to 200 ms"
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    assert!(r.vol.clean_if_needed().unwrap());
    degraded_checks(&r.vol, false, "after a successful retry");
    assert_eq!(r.vol.stats().dirty_lines, 0);
    r.vol.flush().unwrap();
    let on_disk = std::fs::read(&r.f.backing).unwrap();
    assert_eq!(&on_disk[4096..4 * 4096], &x[..]);
}

/// Issue 14 item 6: the cache fails while its superblock cannot be erased (every cache write
/// fails, the superblock's too), the client writes V in pass-through; the next start must not
/// restore the old dirty D over V. The failure is in the state file; `open` refuses the cache
/// naming `tiercache format --force`, and a newly formatted cache opens.
#[test]
fn failed_cache_whose_superblock_survives_is_refused_at_the_next_start() {
    let f = files(64, 4096);
    format(&f, Mode::WriteBack, 4096);
    let state = tiercache_server::state_file::beside(&f.cache);
    let opts = OpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let faults = Faults::new(6);
    let (c, cache) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (b, _) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    vol.set_max_cache_errors(2);
    let d = pattern(6, 8192);
    vol.write(0, &d, false).unwrap();
    vol.flush().unwrap();
    assert_eq!(vol.stats().dirty_lines, 2);
    // Every cache write fails from now on, the superblock's included.
    cache.fail_writes(0..u64::MAX);
    for i in 0..4u64 {
        vol.write(100_000 + i * 8192, &pattern(7, 4096), false)
            .unwrap();
    }
    assert!(vol.cache_failed());
    let v = pattern(8, 8192);
    vol.write(0, &v, false).unwrap();
    vol.flush().unwrap();
    assert_eq!(&std::fs::read(&f.backing).unwrap()[..8192], &v[..]);
    vol.shutdown().unwrap();
    drop(vol);
    assert!(
        tiercache_server::read_superblock(&FileDev::open(&f.cache).unwrap()).is_ok(),
        "the erase failed, so the superblock is still there"
    );
    let reopen = || {
        CacheVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
            &opts,
        )
    };
    match reopen() {
        Ok((vol, rep)) => {
            let mut got = vec![0u8; 8192];
            vol.read(0, &mut got).unwrap();
            panic!(
                "a failed cache was reopened: {} lines restored ({} dirty); offset 0 reads {}",
                rep.restored,
                rep.restored_dirty,
                if got == d {
                    "the stale D"
                } else if got == v {
                    "V"
                } else {
                    "other bytes"
                }
            );
        }
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("failed") && m.contains("tiercache format --force"),
                "{m}"
            );
            assert!(m.contains(&state.display().to_string()), "{m}");
        }
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the state file is private");
    let st = tiercache_server::state_file::read(&state).unwrap().unwrap();
    assert!(st.lost.is_empty(), "{st:?}");
    // Without the state file the next start would serve D: the file is the only record.
    // Formatting again (a new uuid; `tiercache format --force` also removes the file) opens.
    format(&f, Mode::WriteBack, 4096);
    let (vol, rep) = reopen().unwrap();
    assert_eq!(rep.restored, 0);
    let mut got = vec![0u8; 8192];
    vol.read(0, &mut got).unwrap();
    assert_eq!(got, v);
}

/// A failure recorded nowhere (no state file can be written and the superblock erase fails):
/// reads pass through, writes fail with an error saying why, until the record succeeds.
#[test]
fn failure_recorded_nowhere_fails_writes_until_it_is_recorded() {
    let f = files(64, 4096);
    format(&f, Mode::WriteBack, 4096);
    let state = f.dir.path().join("no-such-dir").join("x.tiercache-state");
    let faults = Faults::new(7);
    let (c, cache) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (b, _) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    let opts = OpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    vol.set_max_cache_errors(1);
    let d = pattern(9, 4096);
    vol.write(0, &d, false).unwrap();
    vol.flush().unwrap();
    cache.fail_writes(0..u64::MAX);
    let _ = vol.write(4096, &d, false);
    assert!(vol.cache_failed());
    let mut got = vec![0u8; 4096];
    vol.read(0, &mut got).unwrap();
    assert_eq!(got, d, "written back at the failure, read through");
    let v = pattern(10, 4096);
    let e = vol.write(0, &v, false).unwrap_err();
    assert!(
        e.to_string().contains("could not be recorded") && e.to_string().contains("no-such-dir"),
        "{e}"
    );
    assert_eq!(&std::fs::read(&f.backing).unwrap()[..4096], &d[..]);
    // The state directory appears: the next write records the failure and passes through.
    std::fs::create_dir(state.parent().unwrap()).unwrap();
    vol.write(0, &v, false).unwrap();
    assert!(tiercache_server::state_file::read(&state)
        .unwrap()
        .is_some());
    assert_eq!(&std::fs::read(&f.backing).unwrap()[..4096], &v[..]);
}
