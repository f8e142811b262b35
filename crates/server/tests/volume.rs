//! The cache volume against a reference model: concurrent random partial and unaligned
//! reads, writes, trims and flushes in every mode; warm restarts after a clean shutdown and
//! after simulated crashes (unsynced writes torn at random); corruption detection; mode
//! switches and detach with dirty data.

mod common;

use common::*;
use rand::Rng;
use std::sync::{Arc, Mutex};
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{CacheVolume, FileDev, FormatError, OpenOptions, Superblock};

const THREADS: u64 = 4;
/// Regions per thread start at unaligned offsets, so neighbours share lines and sectors.
const REGION: u64 = 262_000;

fn run_thread(vol: &CacheVolume, t: u64, seed: u64, ops: usize) -> Model {
    let base = t * REGION;
    let mut m = Model::new(base, REGION);
    let mut rng = rng(seed * 100 + t);
    for i in 0..ops {
        let (kind, off, len, fua) = random_op(&mut rng, REGION);
        let at = off as usize;
        match kind {
            0 => {
                let mut buf = vec![0u8; len as usize];
                vol.read(base + off, &mut buf).unwrap();
                m.check_now(at, &buf, &format!("thread {t} op {i} read {off}+{len}"));
            }
            1 => {
                let data: Vec<u8> = (0..len)
                    .map(|k| (i as u8) ^ (k as u8).rotate_left(3) ^ t as u8)
                    .collect();
                vol.write(base + off, &data, fua).unwrap();
                m.write(at, &data, fua);
            }
            2 => {
                // Whole 4 KiB blocks inside this thread's region only.
                let a = (base + off).next_multiple_of(4096);
                let b = (base + off + len).min(base + REGION) / 4096 * 4096;
                if b > a {
                    vol.trim(a, b - a).unwrap();
                    m.trim((a - base) as usize, (b - a) as usize);
                }
            }
            _ => {
                vol.flush().unwrap();
                m.flush();
            }
        }
    }
    m
}

fn check_all(vol: &CacheVolume, models: &[Model], what: &str) {
    for (t, m) in models.iter().enumerate() {
        let mut buf = vec![0u8; REGION as usize];
        vol.read(t as u64 * REGION, &mut buf).unwrap();
        m.check_now(0, &buf, &format!("{what}, thread {t}'s region"));
    }
}

#[test]
fn concurrent_integrity_and_clean_restart_in_every_mode() {
    for (mi, mode) in Mode::ALL.into_iter().enumerate() {
        let f = files(40, 4096);
        format(&f, mode, 4096);
        let (vol, rep) = open(&f, None);
        assert_eq!(rep.restored, 0);
        let vol = Arc::new(vol);
        let cleaner = vol.start_cleaner();
        let models: Vec<Model> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let v = &vol;
                    s.spawn(move || run_thread(v, t, mi as u64, 1500))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        check_all(&vol, &models, &format!("{mode:?} after the run"));
        let before = vol.stats();
        if mode != Mode::PassThrough {
            assert!(before.cached_lines > 30, "{mode:?}: {before:?}");
        }
        vol.shutdown().unwrap();
        cleaner.join().unwrap();
        drop(vol);
        let (vol, rep) = open(&f, None);
        assert!(rep.was_clean);
        assert_eq!(rep.dropped_bad_checksum, 0);
        assert!(
            rep.restored as f64 >= 0.99 * before.cached_lines as f64,
            "{mode:?}: {} of {} lines came back",
            rep.restored,
            before.cached_lines
        );
        assert_eq!(vol.stats().dirty_lines, before.dirty_lines, "{mode:?}");
        let hits_before = vol.stats().totals.line_hits;
        check_all(&vol, &models, &format!("{mode:?} after a clean restart"));
        if mode != Mode::PassThrough {
            assert!(
                vol.stats().totals.line_hits > hits_before,
                "{mode:?}: restart came back cold"
            );
        }
        vol.shutdown().unwrap();
    }
}

/// Crash at a random point (unsynced writes to both devices torn sector by sector), reopen,
/// and check every byte: its value as of the last flush (or FUA write), or one written after.
#[test]
fn crash_recovery_keeps_flushed_and_fua_writes() {
    let mut crashes = 0;
    for mode in [
        Mode::WriteBack,
        Mode::WriteThrough,
        Mode::WriteAround,
        Mode::ReadOnly,
    ] {
        for seed in 0..12u64 {
            let f = files(24, 4096);
            format(&f, mode, 4096);
            let cdev = CrashDev::open(&f.cache);
            let bdev = CrashDev::open(&f.backing);
            let (vol, _) = CacheVolume::open(
                Box::new(Shared(cdev.clone())),
                Box::new(Shared(bdev.clone())),
                &OpenOptions::default(),
            )
            .unwrap();
            let vol = Mutex::new(vol);
            let mut m = Model::new(0, VOL);
            let mut r = rng(seed + 1000);
            let n = r.gen_range(50..500);
            let hot = 160 << 10;
            for i in 0..n {
                let (kind, off, len, fua) = random_op(&mut r, hot);
                let v = vol.lock().unwrap();
                match kind {
                    0 => {
                        let mut buf = vec![0u8; len as usize];
                        v.read(off, &mut buf).unwrap();
                        m.check_now(off as usize, &buf, &format!("{mode:?} seed {seed} op {i}"));
                    }
                    1 => {
                        let data: Vec<u8> = (0..len)
                            .map(|k| (i as u8).wrapping_mul(13) ^ k as u8)
                            .collect();
                        v.write(off, &data, fua).unwrap();
                        m.write(off as usize, &data, fua);
                    }
                    2 => {
                        v.trim(off, len).unwrap();
                        m.trim(off as usize, len as usize);
                    }
                    _ => {
                        v.flush().unwrap();
                        m.flush();
                    }
                }
            }
            // The crash: no shutdown, unsynced writes torn.
            drop(vol);
            cdev.crash(&mut r);
            bdev.crash(&mut r);
            crashes += 1;
            let (vol, rep) = open(&f, None);
            assert!(!rep.was_clean);
            let mut buf = vec![0u8; VOL as usize];
            vol.read(0, &mut buf).unwrap();
            m.check_after_crash(
                0,
                &buf,
                &format!("{mode:?} seed {seed} after crash ({rep:?})"),
            );
            // And it keeps working: the restored state is consistent.
            let data = vec![0x5a; 10_000];
            vol.write(777, &data, false).unwrap();
            vol.read(0, &mut buf).unwrap();
            assert!(buf[777..10_777].iter().all(|&b| b == 0x5a));
        }
    }
    assert_eq!(crashes, 48);
}

#[test]
fn warm_after_crash() {
    // Lines that were cached and flushed come back after a crash (no shutdown at all).
    let f = files(64, 4096);
    format(&f, Mode::WriteThrough, 4096);
    let (vol, _) = open(&f, None);
    let mut buf = vec![0u8; 64 * 4096];
    vol.read(0, &mut buf).unwrap();
    vol.flush().unwrap();
    let cached = vol.stats().cached_lines;
    assert_eq!(cached, 64);
    drop(vol);
    let (vol, rep) = open(&f, None);
    assert!(!rep.was_clean);
    assert!(rep.restored as f64 >= 0.99 * cached as f64, "{rep:?}");
    vol.read(0, &mut buf).unwrap();
    assert_eq!(
        vol.stats().totals.line_misses,
        0,
        "every line hit after the crash"
    );
    assert!(buf.iter().enumerate().all(|(i, &b)| b == initial(i as u64)));
}

#[test]
fn corruption_is_detected() {
    let f = files(32, 4096);
    format(&f, Mode::WriteThrough, 4096);
    let (vol, _) = open(&f, None);
    vol.write(0, &vec![0xab; 8192], false).unwrap();
    vol.shutdown().unwrap();
    drop(vol);
    let open_err = || {
        CacheVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
            &OpenOptions::default(),
        )
        .err()
    };
    let orig = std::fs::read(&f.cache).unwrap();
    // Superblock.
    let mut bad = orig.clone();
    bad[30] ^= 0x40;
    std::fs::write(&f.cache, &bad).unwrap();
    assert!(matches!(
        open_err(),
        Some(FormatError::BadSuperblockChecksum { .. })
    ));
    bad[0] = 0;
    std::fs::write(&f.cache, &bad).unwrap();
    assert!(matches!(open_err(), Some(FormatError::BadMagic)));
    // A metadata record, after a clean shutdown: refused.
    let mut bad = orig.clone();
    bad[4096 + 3] ^= 1;
    std::fs::write(&f.cache, &bad).unwrap();
    let e = open_err();
    assert!(
        matches!(e, Some(FormatError::BadRecord { slot: 0, .. })),
        "{e:?}"
    );
    // The same after an unclean shutdown: the record is dropped, data comes from the backing.
    let mut sb = Superblock::decode(&bad[..4096]).unwrap();
    sb.clean = false;
    bad[..4096].copy_from_slice(&sb.encode());
    std::fs::write(&f.cache, &bad).unwrap();
    let (vol, rep) = open(&f, None);
    assert_eq!(rep.dropped_bad_checksum, 1, "{rep:?}");
    assert_eq!(rep.restored, 1);
    let mut buf = vec![0u8; 8192];
    vol.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0xab));
    // Backing of another size: refused.
    vol.shutdown().unwrap();
    drop(vol);
    std::fs::File::options()
        .write(true)
        .open(&f.backing)
        .unwrap()
        .set_len(VOL + 4096)
        .unwrap();
    assert!(matches!(
        open_err(),
        Some(FormatError::BackingMismatch { .. })
    ));
}

#[test]
fn mode_switch_and_detach_write_back_dirty_data() {
    let f = files(64, 4096);
    format(&f, Mode::WriteBack, 4096);
    let (vol, _) = open(&f, None);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    vol.write(1000, &data, false).unwrap();
    assert!(vol.stats().dirty_lines > 10);
    let on_backing = |f: &Files| std::fs::read(&f.backing).unwrap()[1000..51_000].to_vec();
    assert_ne!(on_backing(&f), data, "write-back keeps data in the cache");
    vol.set_mode(Mode::WriteThrough).unwrap();
    assert_eq!(vol.stats().dirty_lines, 0);
    assert_eq!(on_backing(&f), data);
    vol.set_mode(Mode::WriteBack).unwrap();
    let data2: Vec<u8> = data.iter().map(|b| b ^ 0xff).collect();
    vol.write(1000, &data2, false).unwrap();
    assert!(vol.stats().dirty_lines > 10);
    vol.detach().unwrap();
    let st = vol.stats();
    assert_eq!((st.dirty_lines, st.mode.as_str()), (0, "pass-through"));
    assert_eq!(on_backing(&f), data2);
    let mut buf = vec![0u8; 50_000];
    vol.read(1000, &mut buf).unwrap();
    assert_eq!(buf, data2);
    // The mode survives a restart.
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, _) = open(&f, None);
    assert_eq!(vol.mode(), Mode::PassThrough);
}

#[test]
fn emulated_hdd_backing_serves_the_same_bytes() {
    let f = files(16, 4096);
    format(&f, Mode::WriteBack, 4096);
    let cfg = tiercache_server::hdd_config("7200").unwrap();
    let backing =
        tiercache_server::EmulatedHdd::new(FileDev::open(&f.backing).unwrap(), cfg).unwrap();
    let (vol, _) = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(backing),
        &OpenOptions::default(),
    )
    .unwrap();
    let mut buf = vec![0u8; 20_000];
    vol.read(5000, &mut buf).unwrap();
    assert!(buf
        .iter()
        .enumerate()
        .all(|(i, &b)| b == initial(5000 + i as u64)));
    // FUA in write-back: durable in the cache (issue 19), not sent to the backing device;
    // written back by `ctl flush`.
    vol.write(5000, &[9; 100], true).unwrap();
    assert_eq!(vol.stats().dirty_lines, 1);
    let on_backing = |f: &Files| std::fs::read(&f.backing).unwrap()[5000..5100].to_vec();
    assert!(on_backing(&f)
        .iter()
        .enumerate()
        .all(|(i, &b)| b == initial(5000 + i as u64)));
    vol.flush_dirty().unwrap();
    vol.shutdown().unwrap();
    assert_eq!(on_backing(&f), [9; 100]);
    assert!(tiercache_server::hdd_config("no-such-disk").is_err());
}

/// The write-back miss path (docs/notes-wbmiss.md): once records are durable, evictions
/// unmap the next likely victims' records in batches (one cache sync for several), the
/// background pass writes back and unmaps dirty likely victims ahead, contents stay right,
/// and a clean restart maps the lines unmapped ahead again.
#[test]
fn evictions_unmap_likely_victims_in_batches() {
    const LINES: u64 = 64;
    let f = files(LINES, 4096);
    format(&f, Mode::WriteBack, 4096);
    let (vol, _) = open(&f, None);
    let mut m = Model::new(0, VOL);
    let mut write = |vol: &CacheVolume, line: u64, v: u8| {
        let d = vec![v; 4096];
        vol.write(line * 4096, &d, false).unwrap();
        m.write((line * 4096) as usize, &d, false);
    };
    // Fill the cache, write everything back and make the records durable.
    for l in 0..LINES {
        write(&vol, l, l as u8);
    }
    vol.flush_dirty().unwrap();
    // Misses on other lines evict the clean, persisted lines: batches of 8 (an eighth).
    for l in LINES..2 * LINES {
        write(&vol, l, l as u8 ^ 0x5a);
    }
    let s = vol.stats();
    assert_eq!(s.totals.evictions, LINES);
    assert_eq!(s.totals.dirty_evictions, 0);
    assert!(
        s.unmap_syncs * 4 <= LINES && s.unmap_on_miss * 4 <= LINES,
        "{} unmap syncs, {} records unmapped on the miss path for {LINES} evictions: not batched",
        s.unmap_syncs,
        s.unmap_on_miss
    );
    // After a miss-path unmap the request also ran the background pass: the next likely
    // victims (dirty, never flushed) were written back and are unmapped ahead.
    let ahead = vol.unmapped_ahead();
    assert_eq!(ahead.len(), 8, "{s:?}");
    // Evicting those takes no sync.
    let mut next = 2 * LINES;
    for _ in 0..8 {
        write(&vol, next, next as u8 ^ 0xa5);
        next += 1;
    }
    let before = vol.stats();
    assert_eq!(before.unmap_syncs, s.unmap_syncs, "{before:?}");
    assert_eq!(before.totals.dirty_evictions, 0);
    // Now the likely victims are dirty; a FLUSH makes their records durable. The background
    // pass writes them back and unmaps them in one batch, with one sync.
    vol.flush().unwrap();
    let before = vol.stats();
    assert!(vol.unmap_ahead_if_needed().unwrap());
    let after = vol.stats();
    assert_eq!(after.unmap_syncs, before.unmap_syncs + 1);
    assert_eq!(after.unmap_ahead, before.unmap_ahead + 8);
    // The same figures on the Prometheus endpoint.
    let text = vol.metrics().prometheus(&after);
    for (name, v) in [
        ("unmap_syncs_total", after.unmap_syncs),
        ("unmapped_on_miss_total", after.unmap_on_miss),
        ("unmapped_ahead_total", after.unmap_ahead),
        ("flux_syncs_total", after.flux_syncs),
        ("flux_pages_total", after.flux_pages),
        ("metadata_pages_written_total", after.metadata_pages_written),
    ] {
        assert!(
            text.contains(&format!("\ntiercache_{name} {v}\n")),
            "tiercache_{name} {v} not in the Prometheus text"
        );
    }
    assert!(after.metadata_pages_written > 0 && after.unmap_ahead > 0);
    assert_eq!(after.dirty_lines, before.dirty_lines - 8);
    assert_eq!(vol.unmapped_ahead().len(), 8);
    // Their evictions need no sync.
    for _ in 0..8 {
        write(&vol, next, next as u8 ^ 0x3c);
        next += 1;
    }
    let s = vol.stats();
    assert_eq!(s.unmap_syncs, after.unmap_syncs, "{s:?}");
    assert_eq!(s.totals.dirty_evictions, 0);
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    m.check_now(0, &buf, "after batched unmapping");
    // Clean restart: lines unmapped ahead come back too.
    vol.unmap_ahead_if_needed().unwrap();
    let cached = vol.lines().len() as u64;
    assert!(!vol.unmapped_ahead().is_empty());
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, rep) = open(&f, None);
    assert!(rep.was_clean);
    assert_eq!(rep.restored, cached);
    vol.read(0, &mut buf).unwrap();
    m.check_now(0, &buf, "after a clean restart");
}

/// Issue 19: `ctl set` on the volume changes the engine's settings live (validated as the
/// engine validates them), shows them in stats and Prometheus, and stores them in the
/// superblock so a reopen keeps them; fixed settings and bad values are refused by name.
#[test]
fn live_settings_apply_show_and_persist() {
    let f = files(256, 4096);
    format(&f, Mode::WriteThrough, 4096);
    let (vol, _) = open(&f, None);
    assert_eq!(
        vol.set_setting("admission", "never").unwrap(),
        ("always".into(), "never".into())
    );
    let data = vec![7u8; 64 << 10];
    vol.write(0, &data, false).unwrap();
    let st = vol.stats();
    assert_eq!(
        st.cached_lines, 0,
        "admission never: writes do not populate"
    );
    assert_eq!(st.totals.bypasses.admission, 16);
    vol.set_setting("seq_cutoff", "128k").unwrap();
    vol.set_setting("group-size", "16k").unwrap();
    let e = vol.set_setting("group-size", "2k").unwrap_err();
    assert!(e.contains("group_size"), "{e}");
    let e = vol.set_setting("policy", "fifo").unwrap_err();
    assert!(e.contains("--policy"), "{e}");
    let st = vol.stats();
    assert_eq!(st.settings.tuning.seq_cutoff_read, 128 << 10);
    assert_eq!(st.settings.changes, 3);
    let text = vol.metrics().prometheus(&st);
    for want in [
        "tiercache_setting_admission_threshold{op=\"read\"} 0",
        "tiercache_setting_seq_cutoff_bytes{op=\"read\"} 131072",
        "tiercache_setting_group_size_bytes 16384",
        "tiercache_setting_changes_total 3",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    vol.reset_stats();
    assert_eq!(vol.stats().totals.requests, 0);
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, _) = open(&f, None);
    let got: Vec<(&str, String)> = vol.settings();
    for (k, v) in [
        ("admission", "never"),
        ("seq-cutoff", "128KiB"),
        ("group-size", "16KiB"),
    ] {
        assert!(
            got.contains(&(k, v.to_string())),
            "{k} after reopen: {got:?}"
        );
    }
    vol.shutdown().unwrap();
}

/// Chunk rewrites (cleaning writes a dense chunk whole, its gaps read from the backing device
/// or the cache's clean copies) while another client keeps writing into the same chunks and
/// reading (clean copies): after the last flush the backing device holds exactly what the
/// client wrote, and the volume reads the same.
#[test]
fn chunk_rewrites_during_concurrent_writes_keep_the_clients_bytes() {
    let f = files(200, 4096);
    format(&f, Mode::WriteBack, 4096);
    let (vol, _) = open(&f, None);
    vol.set_chunk_rewrite(64 << 10, 2).unwrap();
    let vol = Arc::new(vol);
    let model: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new((0..VOL).map(initial).collect()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (vol, model, stop) = (vol.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::thread_rng();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 2000 {
                n += 1;
                let len = match rng.gen_range(0..4) {
                    0 => rng.gen_range(1..600),
                    1 => 512,
                    _ => 4096,
                };
                let off = rng.gen_range(0..VOL - len);
                if rng.gen_bool(0.25) {
                    let mut buf = vec![0u8; len as usize];
                    vol.read(off, &mut buf).unwrap();
                    let m = model.lock().unwrap();
                    assert_eq!(buf, m[off as usize..(off + len) as usize], "read at {off}");
                    continue;
                }
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                // The model is updated with the write held, so it is what the volume holds.
                let mut m = model.lock().unwrap();
                vol.write(off, &data, false).unwrap();
                m[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
        })
    };
    let mut flushes = 0;
    while flushes < 40 {
        vol.flush_dirty().unwrap();
        flushes += 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    vol.flush_dirty().unwrap();
    let st = vol.stats();
    assert_eq!(st.dirty_lines, 0);
    assert!(st.totals.chunk_rewrites > 0, "no chunk rewrite ran");
    let want = model.lock().unwrap().clone();
    let on_backing = std::fs::read(&f.backing).unwrap();
    let bad = (0..VOL as usize).find(|&i| on_backing[i] != want[i]);
    assert_eq!(bad, None, "backing differs from the client's bytes");
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    assert!(
        buf == want,
        "the volume reads other bytes than the client wrote"
    );
    eprintln!(
        "{} chunk rewrites, {} write-backs",
        st.totals.chunk_rewrites, st.totals.write_backs
    );
}
