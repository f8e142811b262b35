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
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &OpenOptions::default()).unwrap();
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
