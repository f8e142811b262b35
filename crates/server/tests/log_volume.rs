//! The live log layout (`LogVolume`) against a byte-array reference: random reads, partial
//! and multi-line writes with many duplicate and compressible lines, trims and FLUSHes, in
//! write-through and write-back, with segments of four lines so sealing, reclamation,
//! write-backs and generation bumps happen all the time; then clean and crash restarts, and
//! 64-bit fingerprint collisions forced through a test hook.

mod common;

use common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::log_format::LogSuperblock;
use tiercache_server::{format_log, BlockDev, FileDev, LogFormatOptions, LogVolume};

const LS: u64 = 4096;
const SEG: u64 = 4 * LS;

pub struct LogFiles {
    pub _dir: tempfile::TempDir,
    pub cache: std::path::PathBuf,
    pub backing: std::path::PathBuf,
}

/// Backing of `VOL` bytes with known contents, a cache of `segs` segments of four lines.
pub fn log_files(segs: u64) -> LogFiles {
    let dir = common::tmp();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, (0..VOL).map(initial).collect::<Vec<u8>>()).unwrap();
    let cache = dir.path().join("cache.img");
    // Size the device so that exactly `segs` segments fit.
    let mut bytes = 1 << 20;
    loop {
        let (n, _, _) = LogSuperblock::plan(bytes, LS, SEG, None).unwrap_or((0, 0, 0));
        if n >= segs {
            break;
        }
        bytes += SEG;
    }
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    LogFiles {
        _dir: dir,
        cache,
        backing,
    }
}

pub fn log_format(f: &LogFiles, mode: Mode, compression: Compression, dedup: f64) {
    let cache = FileDev::open(&f.cache).unwrap();
    let o = LogFormatOptions {
        line_size: LS,
        segment_size: SEG,
        compression,
        dedup_ratio: dedup,
        picker: "lru".into(),
        mode,
        // A small journal: checkpoints happen during the workload.
        journal_records: Some(400),
    };
    format_log(&cache, VOL, &o).unwrap();
}

pub fn log_open(f: &LogFiles) -> LogVolume {
    LogVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
    )
    .unwrap()
    .0
}

/// A line of content kind `k`: a few patterns repeated (duplicates), text-like (compresses),
/// random (does not).
pub fn line_content(r: &mut ChaCha8Rng) -> Vec<u8> {
    match r.gen_range(0..10) {
        0..=3 => {
            let p = r.gen_range(0..5u8);
            (0..LS)
                .map(|i| p.wrapping_mul(31) ^ (i / 64) as u8)
                .collect()
        }
        4..=6 => {
            let w = r.gen_range(0..200u32);
            format!("line {w} of the log layout test; ")
                .bytes()
                .cycle()
                .take(LS as usize)
                .collect()
        }
        _ => (0..LS).map(|_| r.gen()).collect(),
    }
}

fn check_all(v: &LogVolume, m: &Model, what: &str) {
    let mut buf = vec![0u8; VOL as usize];
    v.read(0, &mut buf).unwrap();
    m.check_now(0, &buf, what);
}

/// Random requests; returns the model. Asserts every read against the model.
fn workload(v: &LogVolume, m: &mut Model, seed: u64, ops: usize) {
    let mut r = rng(seed);
    for i in 0..ops {
        match r.gen_range(0..100) {
            0..=34 => {
                let n = r.gen_range(1..5 * LS);
                let o = r.gen_range(0..VOL - n);
                let mut buf = vec![0u8; n as usize];
                v.read(o, &mut buf).unwrap();
                m.check_now(
                    o as usize,
                    &buf,
                    &format!("seed {seed} op {i} read {o}+{n}"),
                );
            }
            35..=74 => {
                // Whole lines: deduplicable and compressible content.
                let k = r.gen_range(1..4);
                let o = r.gen_range(0..VOL / LS - k) * LS;
                let mut d = Vec::new();
                for _ in 0..k {
                    d.extend(line_content(&mut r));
                }
                let fua = r.gen_bool(0.05);
                v.write(o, &d, fua).unwrap();
                m.write(o as usize, &d, fua);
            }
            75..=92 => {
                let n = r.gen_range(1..3 * LS);
                let o = r.gen_range(0..VOL - n);
                let d: Vec<u8> = (0..n).map(|_| r.gen()).collect();
                v.write(o, &d, false).unwrap();
                m.write(o as usize, &d, false);
            }
            93..=95 => {
                let n = r.gen_range(1..4 * LS);
                let o = r.gen_range(0..VOL - n);
                v.trim(o, n).unwrap();
                m.trim(o as usize, n as usize);
            }
            _ => {
                v.flush().unwrap();
                m.flush();
            }
        }
        if i % 200 == 0 {
            v.check()
                .unwrap_or_else(|e| panic!("seed {seed} op {i}: {e}"));
        }
    }
}

fn run_mode(mode: Mode, compression: Compression, seed: u64) {
    let what = format!("{mode:?} {compression}");
    let f = log_files(10);
    log_format(&f, mode, compression, 1.0);
    let v = log_open(&f);
    let mut m = Model::new(0, VOL);
    workload(&v, &mut m, seed, 2500);
    check_all(&v, &m, &format!("{what}: full read"));
    v.check().unwrap();
    let s = v.stats();
    println!(
        "{what}: dedup {:.2} compression {:.2} effective capacity {:.2}, {} reclaimed, {} write-backs, {} collisions, {} commits, {} checkpoints",
        s.dedup_ratio,
        s.compression_ratio,
        s.effective_capacity,
        s.engine.segments_reclaimed,
        s.live.write_backs,
        s.live.fingerprint_collisions,
        s.live.commits,
        s.live.checkpoints
    );
    assert!(s.engine.segments_reclaimed > 20, "{what}: {s:?}");
    assert!(
        s.live.checkpoints > 3,
        "{what}: the small journal never filled: {s:?}"
    );
    assert!(s.engine.dup_write_lines > 0, "{what}: no duplicate writes");
    if mode == Mode::WriteBack {
        assert!(s.live.write_backs > 0, "{what}: no write-backs");
    }
    if compression != Compression::None {
        assert!(
            s.engine.extents_compressed > 0,
            "{what}: nothing compressed"
        );
        assert!(s.compression_ratio > 1.0, "{what}: {s:?}");
    } else {
        assert_eq!(s.engine.extents_compressed, 0);
    }
    // Clean restart: everything reads back, the cache comes back warm.
    let cached = s.cached_lines;
    v.shutdown().unwrap();
    assert!(v.read(0, &mut [0u8; 10]).is_err(), "used after shutdown");
    drop(v);
    let (v, rep) = LogVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
    )
    .unwrap();
    assert!(rep.was_clean, "{what}: {rep:?}");
    assert_eq!(rep.cached_lines, cached, "{what}: {rep:?}");
    v.check().unwrap();
    check_all(&v, &m, &format!("{what}: after a clean restart"));
    // Crash restart: FLUSH, more writes, drop without shutdown. What was flushed reads back,
    // the rest reads old or new.
    workload(&v, &mut m, seed + 1, 800);
    v.flush().unwrap();
    m.flush();
    workload(&v, &mut m, seed + 2, 300);
    drop(v);
    let (v, rep) = LogVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
    )
    .unwrap();
    assert!(!rep.was_clean, "{what}: {rep:?}");
    v.check().unwrap();
    let mut buf = vec![0u8; VOL as usize];
    v.read(0, &mut buf).unwrap();
    m.check_after_crash(0, &buf, &format!("{what}: after a crash restart ({rep:?})"));
    // Keeps working.
    let mut m2 = Model::new(0, VOL);
    m2.now = buf.iter().map(|&b| Some(b)).collect();
    workload(&v, &mut m2, seed + 3, 500);
    check_all(&v, &m2, &format!("{what}: after the crash restart"));
    v.shutdown().unwrap();
}

/// Rule 3 with the headers' live flags kept incrementally (the segments' dead sets fed by
/// the engine's log of dead extents, instead of a lookup of every extent at each rewrite):
/// after every FLUSH each sealed segment's last written header marks live exactly the
/// current extents, and a crash (unsynced cache writes torn at random) after more writes
/// reads back only flushed or later data. A header left live after its extent was
/// superseded fails the first check; one the dead sets missed would bring old bytes back
/// after the crash.
fn headers_exact_after_flush(mode: Mode, compression: Compression, seed: u64) {
    let what = format!("{mode:?} {compression}");
    let f = log_files(20);
    log_format(&f, mode, compression, 1.0);
    let open = |dev: &std::sync::Arc<CrashDev>| {
        LogVolume::open(
            Box::new(Shared(dev.clone())),
            Box::new(FileDev::open(&f.backing).unwrap()),
        )
        .unwrap()
    };
    let mut r = rng(seed);
    let mut m = Model::new(0, VOL);
    for round in 0..4u64 {
        let dev = CrashDev::open(&f.cache);
        let (v, rep) = open(&dev);
        v.check()
            .unwrap_or_else(|e| panic!("{what} round {round}: after open ({rep:?}): {e}"));
        v.check_headers_after_flush()
            .unwrap_or_else(|e| panic!("{what} round {round}: after open ({rep:?}): {e}"));
        let mut buf = vec![0u8; VOL as usize];
        v.read(0, &mut buf).unwrap();
        if round > 0 {
            m.check_after_crash(0, &buf, &format!("{what} round {round}: after a crash"));
        }
        m = Model::new(0, VOL);
        m.now = buf.iter().map(|&b| Some(b)).collect();
        m.flush();
        for k in 0..3 {
            workload(&v, &mut m, seed * 100 + round * 10 + k, 250);
            v.flush().unwrap();
            m.flush();
            v.check_headers_after_flush()
                .unwrap_or_else(|e| panic!("{what} round {round} flush {k}: {e}"));
        }
        // More writes after the last FLUSH, then a power loss.
        workload(&v, &mut m, seed * 100 + round * 10 + 9, r.gen_range(1..200));
        let s = v.stats();
        assert!(
            s.live.header_rewrites > 0,
            "{what}: no header rewritten: {s:?}"
        );
        drop(v);
        dev.crash(&mut r);
    }
}

#[test]
fn headers_after_each_flush_mark_exactly_the_current_extents_write_back() {
    headers_exact_after_flush(Mode::WriteBack, Compression::Lz4, 71);
}

#[test]
fn headers_after_each_flush_mark_exactly_the_current_extents_write_through() {
    headers_exact_after_flush(Mode::WriteThrough, Compression::None, 72);
}

#[test]
fn write_through_all_compressors() {
    run_mode(Mode::WriteThrough, Compression::None, 1);
    run_mode(Mode::WriteThrough, Compression::Lz4, 2);
}

#[test]
fn write_back_all_compressors() {
    run_mode(Mode::WriteBack, Compression::Lz4, 3);
    run_mode(Mode::WriteBack, Compression::Zstd(3), 4);
    run_mode(Mode::WriteBack, Compression::None, 5);
}

/// Every digest gets the same 64-bit fingerprint: equal fingerprints with different content
/// must be stored apart, equal content still shared.
#[test]
fn fingerprint_collisions_never_share_different_bytes() {
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        let f = log_files(10);
        log_format(&f, mode, Compression::Lz4, 1.0);
        let (v, _) = LogVolume::open_with(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
            Some(|_| 42),
        )
        .unwrap();
        let mut r = rng(9);
        let mut m = Model::new(0, VOL);
        let a = line_content(&mut r);
        let b: Vec<u8> = a.iter().map(|x| x ^ 1).collect();
        for (i, d) in [&a, &a, &b, &b, &a].into_iter().enumerate() {
            v.write(i as u64 * LS, d, false).unwrap();
            m.write(i * LS as usize, d, false);
        }
        // Reads of uncached lines admit them: all collide with the index too.
        let mut buf = vec![0u8; 64 * LS as usize];
        v.read(10 * LS, &mut buf).unwrap();
        m.check_now(10 * LS as usize, &buf, "collision admission");
        check_all(&v, &m, &format!("{mode:?}: colliding fingerprints"));
        let s = v.stats();
        assert!(s.live.fingerprint_collisions >= 3, "{s:?}");
        assert!(
            s.engine.dup_write_lines >= 2,
            "equal content is still shared: {s:?}"
        );
        v.shutdown().unwrap();
        drop(v);
        let (v, _) = LogVolume::open_with(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
            Some(|_| 42),
        )
        .unwrap();
        check_all(
            &v,
            &m,
            &format!("{mode:?}: colliding fingerprints after restart"),
        );
    }
}

/// A damaged clean extent is read from the backing instead; format refuses bad geometry.
#[test]
fn damaged_clean_extent_reads_backing_and_format_checks() {
    let f = log_files(10);
    log_format(&f, Mode::WriteThrough, Compression::None, 0.0);
    let v = log_open(&f);
    let mut buf = vec![0u8; 8 * LS as usize];
    v.read(0, &mut buf).unwrap();
    v.flush().unwrap();
    // Fill more segments so the first ones are sealed on the device.
    let mut big = vec![0u8; 24 * LS as usize];
    v.read(64 * LS, &mut big).unwrap();
    v.shutdown().unwrap();
    drop(v);
    // Flip bytes in every segment's data area.
    let sb = {
        let c = FileDev::open(&f.cache).unwrap();
        tiercache_server::read_log_superblock(&c).unwrap().unwrap()
    };
    let g = sb.geometry();
    let c = FileDev::open(&f.cache).unwrap();
    use tiercache_server::BlockDev;
    for s in 0..sb.segments as u32 {
        c.write_at(&[0xee; 16], g.data_offset(s) + 100).unwrap();
    }
    c.sync().unwrap();
    let v = log_open(&f);
    let mut back = vec![0u8; 8 * LS as usize];
    v.read(0, &mut back).unwrap();
    let want: Vec<u8> = (0..8 * LS).map(initial).collect();
    assert_eq!(back, want);
    assert!(v.stats().live.extent_crc_errors > 0);
    let c = FileDev::open(&f.cache).unwrap();
    let bad = LogFormatOptions {
        segment_size: LS,
        ..Default::default()
    };
    assert!(
        format_log(&c, VOL, &bad).is_err(),
        "extent caching refused live"
    );
    let bad = LogFormatOptions {
        mode: Mode::WriteAround,
        ..Default::default()
    };
    assert!(format_log(&c, VOL, &bad).is_err());
}

/// Opens the log cache of `f` through the fault injector, with a state file in its dir.
fn open_faulty(
    f: &LogFiles,
) -> (
    LogVolume,
    tiercache_server::fault::FaultHandle,
    tiercache_server::fault::FaultHandle,
    std::path::PathBuf,
) {
    let faults = tiercache_server::fault::Faults::new(1);
    let (cdev, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (bdev, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    let state = f.cache.with_extension("tiercache-state");
    let o = tiercache_server::LogOpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let (v, _) = LogVolume::open_opts(Box::new(cdev), Box::new(bdev), &o).unwrap();
    (v, ch, bh, state)
}

/// Issue 19 item 1 (log layout): a cache-device write error fails the cache to pass-through
/// (before: the volume stopped and every later request failed until a restart). The dirty
/// lines are copied to the backing device, no request fails, everything acknowledged reads
/// back, the failure goes to the state file, and a restart refuses the cache (never its
/// older lines over what passed through since).
#[test]
fn cache_write_error_fails_to_pass_through_and_restart_refuses() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::Lz4, 1.0);
    let (v, ch, _bh, state) = open_faulty(&f);
    let mut m = Model::new(0, VOL);
    workload(&v, &mut m, 11, 300);
    v.flush().unwrap();
    m.flush();
    ch.fail_writes(0..u64::MAX);
    let mut r = rng(12);
    for i in 0..200u64 {
        let d = line_content(&mut r);
        m.write((i % 64 * LS) as usize, &d, false);
        v.write(i % 64 * LS, &d, false)
            .unwrap_or_else(|e| panic!("write {i} failed: {e}"));
        v.flush()
            .unwrap_or_else(|e| panic!("flush {i} failed: {e}"));
    }
    assert!(
        v.cache_failed(),
        "200 writes and flushes to a failing cache"
    );
    let st = v.stats();
    assert_eq!(st.mode, "pass-through", "{st:?}");
    assert!(
        st.cache_errors >= 1 && st.lost_dirty_ranges.is_empty(),
        "{st:?}"
    );
    assert!(v.failure_recorded());
    check_all(&v, &m, "after the cache failed");
    let requests = v.stats().live.requests;
    check_all(&v, &m, "again");
    assert_eq!(
        v.stats().live.requests,
        requests + 1,
        "requests keep counting"
    );
    v.shutdown().unwrap();
    drop(v);
    assert!(state.exists(), "the failure is in the state file");
    let o = tiercache_server::LogOpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let c = Box::new(FileDev::open(&f.cache).unwrap());
    let b = Box::new(FileDev::open(&f.backing).unwrap());
    let e = LogVolume::open_opts(c, b, &o)
        .err()
        .expect("a failed cache is refused");
    assert!(e.to_string().contains("FAILED"), "{e}");
    // The backing device holds everything acknowledged.
    let mut buf = vec![0u8; VOL as usize];
    FileDev::open(&f.backing)
        .unwrap()
        .read_at(&mut buf, 0)
        .unwrap();
    m.check_now(0, &buf, "the backing device after the failure");
}

/// Cache read errors on hits count towards `max_cache_errors`: a clean line is read from
/// the backing device, a dirty one is reported lost (its reads fail, never stale bytes,
/// until it is written again); at the threshold the cache fails to pass-through.
#[test]
fn cache_read_errors_lose_only_unreadable_dirty_lines_then_fail() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::None, 0.0);
    let (v, ch, _bh, _state) = open_faulty(&f);
    v.set_max_cache_errors(3);
    let mut r = rng(13);
    let d: Vec<Vec<u8>> = (0..12).map(|_| line_content(&mut r)).collect();
    for (i, x) in d.iter().enumerate() {
        v.write(i as u64 * LS, x, false).unwrap();
    }
    v.flush().unwrap();
    // Sealed segments are read from the device; fail every cache read.
    ch.fail_reads(0..u64::MAX);
    let mut got = vec![0u8; LS as usize];
    let first = v.read(0, &mut got);
    let st = v.stats();
    if st.cache_errors == 0 {
        // Line 0 is still in an open segment (RAM): pick a line that is not.
        panic!("no cache read error: {st:?}");
    }
    assert!(first.is_err(), "a dirty line that cannot be read fails");
    assert_eq!(st.lost_dirty_ranges, vec![(0, LS)], "{st:?}");
    assert!(!st.cache_failed);
    assert!(v.read(0, &mut got).is_err(), "still lost, never stale");
    // Written again: no longer lost.
    v.write(0, &d[1], false).unwrap();
    v.read(0, &mut got).unwrap();
    assert_eq!(got, d[1]);
    // More read errors: the cache fails, dirty lines it can read are none, so they are lost.
    for i in 1..12u64 {
        let _ = v.read(i * LS, &mut got);
    }
    let st = v.stats();
    assert!(st.cache_failed, "{st:?}");
    assert_eq!(st.mode, "pass-through");
    assert!(st.lost_dirty_bytes > 0, "{st:?}");
    assert_eq!(
        v.read(0, &mut got).map(|_| got.clone()).ok(),
        Some(d[1].clone()),
        "the rewrite went to the backing device when the cache failed"
    );
}

/// The log layout's side of the live contract (`tiercache_server::live`) in the middle of a
/// write-back workload with duplicates, lz4 and a small journal: after each `flush_dirty`
/// no dirty line is left and the backing file holds every byte written; leaving write-back
/// writes back first; detach drops the cache's contents and passes through, and a restart
/// (after a crash) keeps it detached; every read matches the model throughout.
#[test]
fn flush_dirty_mode_switches_and_detach_keep_every_byte() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::Lz4, 1.0);
    let v = log_open(&f);
    let mut m = Model::new(0, VOL);
    let backing_holds = |m: &Model, what: &str| {
        let b = std::fs::read(&f.backing).unwrap();
        for (i, want) in m.now.iter().enumerate() {
            if let Some(w) = want {
                assert_eq!(b[i], *w, "{what}: backing byte {i}");
            }
        }
    };
    for round in 0..3u64 {
        workload(&v, &mut m, 100 + round, 400);
        assert!(v.stats().dirty_lines > 0, "round {round}: nothing dirty");
        v.flush_dirty().unwrap();
        m.flush();
        assert_eq!(v.stats().dirty_lines, 0, "round {round}");
        backing_holds(&m, &format!("round {round}: after flush_dirty"));
        v.check().unwrap();
        workload(&v, &mut m, 200 + round, 300);
        v.set_mode(Mode::WriteThrough).unwrap();
        m.flush();
        assert_eq!(v.stats().dirty_lines, 0, "round {round}");
        backing_holds(&m, &format!("round {round}: after leaving write-back"));
        workload(&v, &mut m, 300 + round, 300);
        assert_eq!(v.stats().dirty_lines, 0, "round {round}: write-through");
        v.set_mode(Mode::WriteBack).unwrap();
        check_all(&v, &m, &format!("round {round}: back in write-back"));
        v.check().unwrap();
    }
    workload(&v, &mut m, 400, 300);
    v.detach().unwrap();
    m.flush();
    backing_holds(&m, "after detach");
    let s = v.stats();
    assert_eq!((s.cached_lines, s.mode.as_str()), (0, "pass-through"));
    workload(&v, &mut m, 401, 300);
    v.flush().unwrap();
    m.flush();
    drop(v); // no shutdown: a crash
    let v = log_open(&f);
    assert_eq!(
        v.stats().mode,
        "pass-through",
        "detach kept by the superblock"
    );
    check_all(&v, &m, "detached, after a crash restart");
    v.set_mode(Mode::WriteBack).unwrap();
    workload(&v, &mut m, 402, 400);
    check_all(&v, &m, "write-back again");
    v.check().unwrap();
    v.shutdown().unwrap();
}
