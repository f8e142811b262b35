//! The log layout (Nitro): capacity, counters, dedup, compression, generations, pickers,
//! write-back and determinism.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::log::picker::REGISTRY;
use tiercache_engine::{Compression, ExtentContent, LogConfig, LogEngine, Mode, Request, Step};

const LS: u64 = 4096;

fn cfg(picker: &str) -> LogConfig {
    let mut c = LogConfig::new(16 * 64 * LS, LS);
    c.segment_size = 64 * LS;
    c.picker = picker.into();
    c
}

/// Content: 1500 distinct contents over 2000 lines; compressed length depends on content.
fn content(line: u64, version: u64) -> ExtentContent {
    let id = (line * 31 + version * 7) % 1500;
    ExtentContent {
        fp: id + 1,
        compressed_len: (1024 + (id * 37) % 4000) as u32,
    }
}

fn run(c: LogConfig, seed: u64, n: usize) -> LogEngine {
    let mut e = LogEngine::new(c).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ver = vec![0u64; 2000];
    for i in 0..n {
        let line = rng.gen_range(0..2000u64);
        let write = rng.gen_bool(0.3);
        if write {
            ver[line as usize] += 1;
        }
        let req = if write {
            Request::write(line * LS, LS)
        } else {
            Request::read(line * LS, LS)
        };
        e.process(&req, &[content(line, ver[line as usize])])
            .unwrap();
        if i % 997 == 0 {
            e.check().unwrap_or_else(|m| panic!("after {i}: {m}"));
        }
    }
    e.check().unwrap();
    e
}

#[test]
fn every_picker_keeps_invariants_in_both_modes() {
    for p in REGISTRY {
        for mode in [Mode::WriteThrough, Mode::WriteBack] {
            for (dedup, comp) in [
                (0.0, Compression::None),
                (1.0, Compression::Lz4),
                (0.3, Compression::None),
            ] {
                let mut c = cfg(p.name);
                c.mode = mode;
                c.dedup_ratio = dedup;
                c.compression = comp;
                c.trim = true;
                let e = run(c.clone(), 1, 20_000);
                let k = e.counters();
                assert!(k.segments_reclaimed > 0, "{} {mode}: no churn", p.name);
                if mode == Mode::WriteBack {
                    assert!(k.dirty_write_backs > 0);
                }
                let r = e.reduction();
                assert!(r.ssd_bytes_used <= c.capacity_bytes);
                // Deterministic.
                let e2 = run(c, 1, 20_000);
                assert_eq!(e2.counters(), k);
            }
        }
    }
}

#[test]
fn dedup_and_compression_raise_hits_and_cut_writes() {
    let base = run(cfg("lru"), 2, 30_000);
    let mut c = cfg("lru");
    c.dedup_ratio = 1.0;
    c.compression = Compression::Lz4;
    let dc = run(c, 2, 30_000);
    let (b, d) = (base.counters(), dc.counters());
    assert!(d.read_line_hits > b.read_line_hits, "{d:?} vs {b:?}");
    assert!(d.ssd_bytes_written < b.ssd_bytes_written);
    assert!(d.dup_read_hits > 0 && d.dup_write_lines > 0);
    let r = dc.reduction();
    assert!(r.dedup_ratio > 1.0 && r.compression_ratio > 1.0, "{r:?}");
    assert!(r.effective_capacity > 1.0);
}

#[test]
fn stale_duplicates_are_detected_by_generation() {
    let mut c = cfg("fifo");
    c.dedup_ratio = 1.0;
    let mut e = LogEngine::new(c).unwrap();
    let x = ExtentContent {
        fp: 42,
        compressed_len: 4096,
    };
    e.process(&Request::read(0, LS), &[x]).unwrap();
    e.process(&Request::read(LS, LS), &[x]).unwrap(); // duplicate of line 0
    assert_eq!(e.counters().dup_read_hits, 1);
    // Push everything out with unique content.
    for i in 0..10_000u64 {
        let u = ExtentContent {
            fp: 1000 + i,
            compressed_len: 4096,
        };
        e.process(&Request::read((100 + i) * LS, LS), &[u]).unwrap();
    }
    e.clean_stale(usize::MAX);
    e.check().unwrap();
    let before = e.counters().read_line_hits;
    e.process(&Request::read(LS, LS), &[x]).unwrap();
    assert_eq!(
        e.counters().read_line_hits,
        before,
        "stale duplicate must miss"
    );
    assert!(e.counters().stale_entries_dropped > 0);
}

#[test]
fn dirty_extents_are_written_back_before_reuse_and_duplicates_too() {
    let mut c = cfg("lru");
    c.mode = Mode::WriteBack;
    c.dedup_ratio = 1.0;
    let mut e = LogEngine::new(c).unwrap();
    let x = ExtentContent {
        fp: 7,
        compressed_len: 4096,
    };
    e.process(&Request::write(0, LS), &[x]).unwrap();
    e.process(&Request::write(5 * LS, LS), &[x]).unwrap(); // dirty duplicate
    assert_eq!(e.dirty_lines(), 2);
    // Fill the dirty segment so that it is sealed (the open one stays in NVRAM).
    for i in 0..64u64 {
        let u = ExtentContent {
            fp: 500 + i,
            compressed_len: 4096,
        };
        e.process(&Request::write((10 + i) * LS, LS), &[u]).unwrap();
    }
    let mut wb = Vec::new();
    for i in 0..10_000u64 {
        let u = ExtentContent {
            fp: 1000 + i,
            compressed_len: 4096,
        };
        let p = e.process(&Request::read((100 + i) * LS, LS), &[u]).unwrap();
        for s in &p.steps {
            if let Step::WriteBack { hdd, .. } = s {
                wb.push(*hdd);
            }
        }
    }
    assert!(wb.contains(&0) && wb.contains(&(5 * LS)), "{wb:?}");
    assert_eq!(
        e.dirty_lines(),
        1,
        "only the line in the open dirty segment"
    );
    e.check().unwrap();
}

#[test]
fn incompressible_extents_are_stored_raw_and_extent_mode_is_one_per_segment() {
    let mut c = cfg("lru");
    c.compression = Compression::Zstd(3);
    let mut e = LogEngine::new(c).unwrap();
    e.process(
        &Request::read(0, LS),
        &[ExtentContent {
            fp: 1,
            compressed_len: 5000,
        }],
    )
    .unwrap();
    e.process(
        &Request::read(LS, LS),
        &[ExtentContent {
            fp: 2,
            compressed_len: 1000,
        }],
    )
    .unwrap();
    assert_eq!(e.counters().stored_bytes, 4096 + 1000);
    assert_eq!(e.counters().extents_compressed, 1);
    let mut c = LogConfig::new(16 * LS, LS);
    c.segment_size = LS;
    let mut e = LogEngine::new(c).unwrap();
    for i in 0..40u64 {
        e.process(&Request::read(i * LS, LS), &[]).unwrap();
    }
    assert_eq!(
        e.counters().ssd_bytes_written,
        e.counters().segments_sealed * LS
    );
    assert!(e.reduction().cached_lines <= 16);
    e.check().unwrap();
}

#[test]
fn reinsertion_keeps_hot_extents() {
    let mut c = cfg("fifo");
    c.reinsert_hits = 2;
    let e = run(c, 3, 30_000);
    assert!(e.counters().reinserted > 0);
}

#[test]
fn bad_configs_are_refused() {
    let mut c = cfg("lru");
    c.segment_size = 128 << 20;
    assert!(LogEngine::new(c).is_err());
    let mut c = cfg("nope");
    c.picker = "nope".into();
    assert!(LogEngine::new(c).is_err());
    assert!("zstd:30".parse::<Compression>().is_err());
    assert_eq!(
        "zstd:5".parse::<Compression>().unwrap(),
        Compression::Zstd(5)
    );
}

/// With TRIM, a trimmed free reserve: reclaimed segments are trimmed ahead and wait in a FIFO
/// of free segments, so every reuse (a segment's `WriteSsd`) follows its `TrimSsd` by at least
/// the reserve's other trims, and the reserve is free at every step. Without TRIM, or with a
/// reserve of 0, a segment is trimmed (or not) as it is reused, as before.
#[test]
fn a_trimmed_free_reserve_is_kept_and_reused_oldest_first() {
    for (segment, reserve, want) in [(64 * LS, 0.1, 2u64), (LS, 0.05, 52), (LS, 0.0, 0)] {
        let mut c = LogConfig::new(16 * 64 * LS, LS);
        c.segment_size = segment;
        c.trim = true;
        c.free_reserve = reserve;
        assert_eq!(c.reserve_segments(), want, "segment {segment}");
        let mut e = LogEngine::new(c.clone()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // Segment -> trims seen since its last trim (None: not trimmed since its last write).
        let mut since: std::collections::HashMap<u64, Option<u64>> = Default::default();
        let mut reuses = 0;
        for i in 0..20_000u64 {
            let line = rng.gen_range(0..4000u64);
            let req = if rng.gen_bool(0.3) {
                Request::write(line * LS, LS)
            } else {
                Request::read(line * LS, LS)
            };
            let p = e.process(&req, &[content(line % 2000, i)]).unwrap().clone();
            for s in &p.steps {
                match *s {
                    Step::TrimSsd { ssd, .. } => {
                        for v in since.values_mut().flatten() {
                            *v += 1;
                        }
                        since.insert(ssd / segment, Some(0));
                    }
                    Step::WriteSsd { ssd, .. } => {
                        if let Some(Some(n)) = since.insert(ssd / segment, None) {
                            reuses += 1;
                            assert!(
                                n >= want,
                                "segment {} reused after {n} other trims",
                                ssd / segment
                            );
                        }
                    }
                    _ => {}
                }
            }
            if i % 499 == 0 {
                e.check().unwrap_or_else(|m| panic!("after {i}: {m}"));
            }
        }
        e.check().unwrap();
        assert!(reuses > 100, "segment {segment}: {reuses} reuses");
        let free = e
            .segments()
            .iter()
            .filter(|s| s.state == tiercache_engine::log::segment::SegState::Free)
            .count() as u64;
        assert!(free >= want, "{free} free, reserve {want}");
    }
    // The reserve needs TRIM: without it nothing is held back.
    let mut c = cfg("lru");
    c.free_reserve = 0.2;
    assert_eq!(c.reserve_segments(), 0);
    // Clear refusals: out of range, and reinsertion (which refills a reclaimed segment at
    // once) beside a reserve.
    let mut c = cfg("lru");
    c.trim = true;
    c.free_reserve = 0.6;
    let m = LogEngine::new(c).err().unwrap().to_string();
    assert!(m.contains("free reserve 0.6 must be in 0..=0.5"), "{m}");
    let mut c = cfg("lru");
    c.trim = true;
    c.reinsert_hits = 2;
    let m = LogEngine::new(c.clone()).err().unwrap().to_string();
    assert!(
        m.contains("reinsertion") && m.contains("free reserve 0"),
        "{m}"
    );
    c.free_reserve = 0.0;
    assert!(LogEngine::new(c).is_ok());
}
