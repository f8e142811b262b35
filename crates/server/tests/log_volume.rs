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

/// Opens the log cache of `f` through a fault injector whose backing device has a volatile
/// write cache (writes reach the file only at a sync; a failed sync may drop them).
fn open_volatile_backing(
    f: &LogFiles,
) -> (
    LogVolume,
    std::sync::Arc<tiercache_server::fault::Faults>,
    tiercache_server::fault::FaultHandle,
    tiercache_server::fault::FaultHandle,
) {
    let faults = tiercache_server::fault::Faults::new(5);
    let (cdev, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (bdev, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let o = tiercache_server::LogOpenOptions {
        state_path: Some(f.cache.with_extension("tiercache-state")),
        ..Default::default()
    };
    let (v, _) = LogVolume::open_opts(Box::new(cdev), Box::new(bdev), &o).unwrap();
    (v, faults, ch, bh)
}

/// The backing file (what a sync made durable) holds every byte the model has now.
fn backing_file_holds(f: &LogFiles, m: &Model, what: &str) {
    let b = std::fs::read(&f.backing).unwrap();
    m.check_now(0, &b[..VOL as usize], what);
}

/// A backing-device sync that fails once, dropping the writes it should have made durable
/// (Linux after a writeback error: the pages are marked clean, a later fsync succeeds
/// without them). `at_seal`: the failure hits the sync before a seal (a plain write),
/// otherwise the one of a FLUSH's commit. The request whose durability could not be
/// established fails; the volume keeps serving; every acknowledged write reads back now,
/// is on the backing device after the next successful FLUSH (the lost bytes were written
/// again from the cache), and after a restart (clean, or a power cut after that FLUSH).
fn write_through_sync_error(at_seal: bool, crash: bool) {
    let f = log_files(10);
    log_format(&f, Mode::WriteThrough, Compression::Lz4, 1.0);
    let (v, faults, _ch, bh) = open_volatile_backing(&f);
    let mut m = Model::new(0, VOL);
    let mut r = rng(21);
    let write = |v: &LogVolume, m: &mut Model, i: u64, r: &mut ChaCha8Rng| {
        let d = line_content(r);
        // Before the failure the lower half, after it the upper half: the lines whose
        // backing bytes the failed sync dropped are not written again, and get evicted.
        let half = VOL / LS / 2;
        let at = ((i * 7 % half) + if i < 80 { 0 } else { half }) * LS;
        let res = v.write(at, &d, false);
        match &res {
            Ok(()) => m.write(at as usize, &d, false),
            // A failed write leaves its range unspecified.
            Err(_) => m.trim(at as usize, LS as usize),
        }
        res
    };
    for i in 0..40 {
        write(&v, &mut m, i, &mut r).unwrap();
    }
    v.flush().unwrap();
    m.flush();
    // A few writes only in the backing device's write cache, then its next sync fails.
    for i in 40..43 {
        write(&v, &mut m, i, &mut r).unwrap();
    }
    bh.fail_next_sync(true);
    let mut failed = Vec::new();
    if at_seal {
        // Plain writes until one needs a seal (whose backing sync fails).
        for i in 43..80 {
            if let Err(e) = write(&v, &mut m, i, &mut r) {
                failed.push((i, e.to_string()));
            }
            if bh.injected() > 0 {
                break;
            }
        }
    } else if let Err(e) = v.flush() {
        failed.push((0, e.to_string()));
    }
    assert_eq!(bh.injected(), 1, "the sync failure was hit");
    assert_eq!(
        failed.len(),
        1,
        "the request whose backing sync failed gets an error, never a success: {failed:?}"
    );
    assert!(
        failed[0].1.contains("injected sync error"),
        "the error names the backing device's failure: {}",
        failed[0].1
    );
    check_all(&v, &m, "right after the failed sync");
    // The volume keeps serving: writes (more than the cache holds), reads, FLUSH.
    for i in 80..600 {
        write(&v, &mut m, i, &mut r)
            .unwrap_or_else(|e| panic!("write {i} after the failed sync: {e}"));
    }
    check_all(&v, &m, "after more writes");
    v.flush()
        .unwrap_or_else(|e| panic!("FLUSH after the failed sync: {e}"));
    m.flush();
    backing_file_holds(
        &f,
        &m,
        "the backing file after the FLUSH that followed the failed sync",
    );
    let st = v.stats();
    assert!(
        st.backing_errors == 1
            && st.live.backing_sync_errors == 1
            && st.live.backing_resync_lines >= 1
            && st.engine.segments_reclaimed > 0,
        "one failed sync, the lines it may have lost written again, reclamations since: {st:?}"
    );
    // The same figure under the name both layouts share (`ctl stats`, Prometheus).
    assert_eq!(
        tiercache_server::live::log_common(&v, &st).backing_sync_errors,
        1
    );
    v.check().unwrap();
    if crash {
        for i in 600..610 {
            write(&v, &mut m, i, &mut r).unwrap();
        }
        faults.power_cut();
        drop(v);
        let v = log_open(&f);
        let mut buf = vec![0u8; VOL as usize];
        v.read(0, &mut buf).unwrap();
        m.check_after_crash(0, &buf, "after a power cut");
    } else {
        v.shutdown().unwrap();
        drop(v);
        let v = log_open(&f);
        check_all(&v, &m, "after a clean restart");
    }
}

#[test]
fn write_through_backing_sync_error_at_a_flush_keeps_serving() {
    write_through_sync_error(false, false);
}

#[test]
fn write_through_backing_sync_error_at_a_seal_keeps_serving() {
    write_through_sync_error(true, true);
}

/// A cache write error while sealing a segment of dirty lines (write-back) fails the cache
/// to pass-through; the segment's dirty lines are copied to the backing device from RAM.
/// Before: the seal had already released its buffer, so they were read back from the
/// device that had failed to store them, failed their checksums and were reported lost.
#[test]
fn cache_write_error_at_a_seal_copies_its_dirty_lines_from_ram() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::None, 0.0);
    let (v, _faults, ch, _bh) = open_volatile_backing(&f);
    let mut m = Model::new(0, VOL);
    let mut r = rng(31);
    // Four raw lines fill the open segment; the fifth write seals it.
    for i in 0..4u64 {
        let d = line_content(&mut r);
        v.write(i * LS, &d, false).unwrap();
        m.write((i * LS) as usize, &d, false);
    }
    assert_eq!(v.stats().engine.segments_sealed, 0, "nothing sealed yet");
    ch.fail_writes(0..u64::MAX);
    let d = line_content(&mut r);
    v.write(4 * LS, &d, false)
        .unwrap_or_else(|e| panic!("the write passes through once the cache failed: {e}"));
    m.write((4 * LS) as usize, &d, false);
    let st = v.stats();
    assert!(st.cache_failed, "{st:?}");
    assert!(
        st.lost_dirty_ranges.is_empty(),
        "dirty lines of the segment being sealed reported lost: {:?}",
        st.lost_dirty_ranges
    );
    check_all(&v, &m, "after the cache failed at a seal");
    v.flush().unwrap();
    m.flush();
    backing_file_holds(&f, &m, "the backing file after the FLUSH");
}

/// The cache fails (write error at a commit) and the backing device's sync that should make
/// the copied dirty lines durable fails once, dropping them from its write cache: they are
/// copied again (the cache is still readable) before the volume passes through. Before:
/// the sync error was only logged and pass-through reads served the older backing bytes.
#[test]
fn failed_backing_sync_when_the_cache_fails_copies_the_dirty_lines_again() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::Lz4, 1.0);
    let (v, _faults, ch, bh) = open_volatile_backing(&f);
    let mut m = Model::new(0, VOL);
    let mut r = rng(32);
    for i in 0..24u64 {
        let d = line_content(&mut r);
        v.write(i * LS, &d, false).unwrap();
        m.write((i * LS) as usize, &d, false);
    }
    v.flush().unwrap();
    m.flush();
    let d = line_content(&mut r);
    v.write(30 * LS, &d, false).unwrap();
    m.write((30 * LS) as usize, &d, false);
    ch.fail_writes(0..u64::MAX);
    bh.fail_next_sync(true);
    v.flush()
        .unwrap_or_else(|e| panic!("the FLUSH passes through once the cache failed: {e}"));
    m.flush();
    let st = v.stats();
    assert!(st.cache_failed && bh.injected() == 1, "{st:?}");
    assert!(st.lost_dirty_ranges.is_empty(), "{st:?}");
    check_all(&v, &m, "in pass-through after the cache failed");
    backing_file_holds(&f, &m, "the backing file after the cache failed");
}

/// A dirty extent whose bytes are damaged on the cache device, found when its segment is
/// reclaimed (write-back): that segment is not reclaimed (another one is), the line's reads
/// fail (never older bytes), every other request goes on, and writing the line again frees
/// it. Before: the write-back's error stopped the volume.
#[test]
fn damaged_dirty_extent_at_write_back_fails_only_its_line() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::None, 0.0);
    let v = log_open(&f);
    let mut m = Model::new(0, VOL);
    let mut r = rng(33);
    let marked: Vec<u8> = (0..LS).map(|i| (i * 7 % 251) as u8 ^ 0x5a).collect();
    v.write(0, &marked, false).unwrap();
    m.write(0, &marked, false);
    for i in 1..8u64 {
        let d = line_content(&mut r);
        v.write(i * LS, &d, false).unwrap();
        m.write((i * LS) as usize, &d, false);
    }
    v.flush().unwrap();
    m.flush();
    // Damage line 0's stored bytes (raw: no compression) on the cache device.
    let mut img = std::fs::read(&f.cache).unwrap();
    let at = img
        .windows(LS as usize)
        .position(|w| w == marked.as_slice())
        .expect("line 0 stored raw on the cache device");
    img[at + 100] ^= 0xff;
    std::fs::write(&f.cache, &img).unwrap();
    // Overwrite other lines (fewer than the cache holds: older segments die, so there is
    // always a victim without dirty data) until the cache has reclaimed many segments.
    for k in 0..600u64 {
        let i = 8 + k % 100;
        let d = line_content(&mut r);
        v.write(i * LS, &d, false)
            .unwrap_or_else(|e| panic!("write {k} (line {i}): {e}"));
        m.write((i * LS) as usize, &d, false);
    }
    let st = v.stats();
    assert!(
        st.live.extent_crc_errors > 0 && st.engine.segments_reclaimed > 40,
        "{st:?}"
    );
    let mut buf = vec![0u8; LS as usize];
    let e = v
        .read(0, &mut buf)
        .expect_err("the damaged dirty line reads as an error");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    let mut rest = vec![0u8; (VOL - LS) as usize];
    v.read(LS, &mut rest).unwrap();
    m.check_now(LS as usize, &rest, "the other lines");
    let d = line_content(&mut r);
    v.write(0, &d, false).unwrap();
    m.write(0, &d, false);
    check_all(&v, &m, "after line 0 was written again");
    v.flush().unwrap();
    v.shutdown().unwrap();
    drop(v);
    check_all(&log_open(&f), &m, "after a restart");
}

/// The open's clean-line sample is visible in `ctl stats` (`recovery_sample`): a backing
/// device changed behind a cleanly stopped write-through cache (one line) is found, and
/// every clean line dropped. Before, only the open report and a log line said so.
#[test]
fn clean_lines_differing_at_open_are_counted_in_stats() {
    let f = log_files(10);
    log_format(&f, Mode::WriteThrough, Compression::Lz4, 1.0);
    let v = log_open(&f);
    let mut r = rng(34);
    for i in 0..20u64 {
        v.write(i * LS, &line_content(&mut r), false).unwrap();
    }
    v.flush().unwrap();
    let cached = v.stats().cached_lines;
    assert_eq!(v.stats().recovery_sample.differing_clean_lines, 0);
    v.shutdown().unwrap();
    drop(v);
    let mut b = std::fs::read(&f.backing).unwrap();
    b[3 * LS as usize + 10] ^= 0xff;
    std::fs::write(&f.backing, &b).unwrap();
    let v = log_open(&f);
    let s = v.stats().recovery_sample;
    assert!(
        s.sampled_clean_lines == cached
            && s.differing_clean_lines == 1
            && s.dropped_clean_lines == cached,
        "{s:?} (cached {cached})"
    );
    let mut got = vec![0u8; LS as usize];
    v.read(3 * LS, &mut got).unwrap();
    assert_eq!(
        got,
        b[3 * LS as usize..4 * LS as usize],
        "served from the backing now"
    );
}

/// A cache write error at a clean shutdown (its end record or superblock) fails the cache
/// as any request's would (rule 8: dirty lines copied to the backing device, the failure
/// recorded): the restart refuses the cache and the backing device holds every byte.
/// Before: the error was returned raw, the volume stayed open with `clean` set in RAM
/// (a later superblock write would have marked the running cache clean).
#[test]
fn cache_write_error_at_shutdown_fails_the_cache() {
    let f = log_files(10);
    log_format(&f, Mode::WriteBack, Compression::Lz4, 1.0);
    let (v, ch, _bh, state) = open_faulty(&f);
    let mut m = Model::new(0, VOL);
    workload(&v, &mut m, 35, 200);
    v.flush().unwrap();
    m.flush();
    ch.fail_writes(0..u64::MAX);
    assert!(
        v.shutdown().is_err(),
        "the shutdown could not mark the cache clean"
    );
    assert!(v.cache_failed(), "{:?}", v.stats());
    assert!(v.stats().lost_dirty_ranges.is_empty());
    check_all(&v, &m, "in pass-through after the failed shutdown");
    v.shutdown().unwrap();
    drop(v);
    assert!(state.exists(), "the failure is in the state file");
    let mut buf = vec![0u8; VOL as usize];
    FileDev::open(&f.backing)
        .unwrap()
        .read_at(&mut buf, 0)
        .unwrap();
    m.check_now(0, &buf, "the backing device after the failed shutdown");
}

/// Double fault: a write-through line written since the last backing sync is a duplicate
/// whose shared extent (in a sealed segment) cannot be read, so the read path drops it from
/// the cache; then the backing sync fails and drops its bytes. Nothing holds them any more:
/// its reads fail (reported lost), never the older bytes; writing it again heals it.
#[test]
fn unsynced_line_dropped_from_the_cache_then_a_failed_sync_is_reported_lost() {
    let f = log_files(10);
    log_format(&f, Mode::WriteThrough, Compression::None, 1.0);
    let (v, _faults, ch, bh) = open_volatile_backing(&f);
    let x: Vec<u8> = (0..LS).map(|i| (i * 13 % 249) as u8 ^ 0xa5).collect();
    v.write(0, &x, false).unwrap();
    let mut r = rng(36);
    // Seal line 0's segment (four raw lines).
    for i in 1..6u64 {
        v.write(i * LS, &line_content(&mut r), false).unwrap();
    }
    v.flush().unwrap();
    // Line 40 gets the same bytes: a duplicate entry of line 0's sealed extent.
    v.write(40 * LS, &x, false).unwrap();
    assert!(v.stats().engine.dup_write_lines >= 1, "{:?}", v.stats());
    ch.fail_reads(0..u64::MAX);
    let mut got = vec![0u8; LS as usize];
    v.read(40 * LS, &mut got).unwrap();
    assert_eq!(got, x, "read from the backing device's write cache");
    ch.heal();
    bh.fail_next_sync(true);
    assert!(v.flush().is_err());
    match v.read(40 * LS, &mut got) {
        Ok(()) => assert_eq!(got, x, "line 40 read older bytes after the failed sync"),
        Err(e) => assert!(e.to_string().contains("lost"), "{e}"),
    }
    assert_eq!(v.stats().lost_dirty_ranges, vec![(40 * LS, 41 * LS)]);
    v.write(40 * LS, &x, false).unwrap();
    v.read(40 * LS, &mut got).unwrap();
    assert_eq!(got, x);
    v.flush().unwrap();
}

/// Reinsertion (`--reinsert-hits`) reads a victim's hot clean extents before the reclamation
/// and verifies them: one whose bytes were damaged on the device is evicted (counted, its
/// line read from the backing device afterwards), the others come back and read right.
#[test]
fn reinsertion_evicts_a_hot_extent_whose_bytes_do_not_verify() {
    let f = log_files(10);
    let o = LogFormatOptions {
        line_size: LS,
        segment_size: SEG,
        compression: Compression::None,
        dedup_ratio: 0.0,
        picker: "fifo".into(),
        mode: Mode::WriteThrough,
        journal_records: None,
    };
    format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
    let v = log_open(&f);
    v.set_reclaim(false, 0.0, 1).unwrap();
    let want = |l: u64| -> Vec<u8> { (l * LS..(l + 1) * LS).map(initial).collect() };
    let mut buf = vec![0u8; LS as usize];
    // Lines 0..4 fill the first segment (segment 0 of a new cache, no compression: line l at
    // offset l * LS), then each is hit once.
    for _ in 0..2 {
        for l in 0..4 {
            v.read(l * LS, &mut buf).unwrap();
            assert_eq!(buf, want(l));
        }
    }
    // More misses seal it and fill the cache short of a reclamation (10 segments, 2 open).
    for l in 100..128 {
        v.read(l * LS, &mut buf).unwrap();
    }
    assert_eq!(v.stats().engine.segments_reclaimed, 0);
    // Line 1's stored bytes damaged on the device.
    let sb = tiercache_server::read_log_superblock(&FileDev::open(&f.cache).unwrap())
        .unwrap()
        .unwrap();
    let c = FileDev::open(&f.cache).unwrap();
    c.write_at(&[0x5a; 64], sb.geometry().data_offset(0) + LS + 200)
        .unwrap();
    c.sync().unwrap();
    // Misses until segment 0 (the oldest: FIFO) is reclaimed.
    let mut l = 200;
    while v.stats().engine.segments_reclaimed == 0 {
        v.read(l * LS, &mut buf).unwrap();
        l += 1;
    }
    let s = v.stats();
    assert_eq!(s.live.extent_crc_errors, 1, "{:?}", s.live);
    assert_eq!(
        s.engine.reinserted, 3,
        "lines 0, 2, 3 come back: {:?}",
        s.engine
    );
    let cached: Vec<u64> = v.cached_lines().into_iter().map(|x| x.0).collect();
    assert!(
        [0, 2, 3].iter().all(|l| cached.contains(l)) && !cached.contains(&1),
        "{cached:?}"
    );
    for l in 0..4 {
        v.read(l * LS, &mut buf).unwrap();
        assert_eq!(buf, want(l), "line {l}");
    }
    v.check().unwrap();
    v.shutdown().unwrap();
    drop(v);
    let v = log_open(&f);
    for l in 0..4 {
        v.read(l * LS, &mut buf).unwrap();
        assert_eq!(buf, want(l), "line {l} after a restart");
    }
    v.check().unwrap();
}
