//! Behaviour of the write modes, admission, population, cleaning and trims, step by step.

use tiercache_engine::{
    Admission, Engine, EngineConfig, Mode, Op, Plan, Preset, Request, SeqCutoff, Step, Validity,
};

fn engine(mode: Mode, cap: u64) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: cap,
        mode,
        ..Default::default()
    })
    .unwrap()
}

fn line_engine(mode: Mode, cap: u64) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: cap,
        mode,
        validity: Validity::Line,
        ..Default::default()
    })
    .unwrap()
}

fn steps(e: &mut Engine, r: Request) -> Vec<Step> {
    e.process(&r).unwrap().steps.clone()
}

#[test]
fn read_miss_populates_then_hits() {
    let mut e = engine(Mode::WriteThrough, 4);
    let s = steps(&mut e, Request::read(8192, 4096));
    assert_eq!(
        s,
        vec![
            Step::ReadHdd {
                vol: 0,
                hdd: 8192,
                buf: 0,
                len: 4096
            },
            Step::WriteSsd {
                ssd: 0,
                buf: 0,
                len: 4096
            }
        ]
    );
    let s = steps(&mut e, Request::read(8192 + 512, 1024));
    assert_eq!(
        s,
        vec![Step::ReadSsd {
            ssd: 512,
            buf: 512,
            len: 1024
        }]
    );
    let c = e.counters();
    assert_eq!((c.line_hits, c.line_misses, c.insertions), (1, 1, 1));
    assert_eq!((c.full_hits, c.full_misses), (1, 1));
    assert_eq!(c.hdd_bytes_read, 4096);
    assert_eq!(c.ssd_bytes_written, 4096);
}

#[test]
fn a_spanning_request_is_a_partial_hit_and_merges_hdd_reads() {
    let mut e = engine(Mode::WriteThrough, 16);
    steps(&mut e, Request::read(4096, 4096));
    // Lines 0..4: line 1 cached, 0, 2, 3 miss.
    let p: Plan = e
        .process(&Request::read(100, 4 * 4096 - 200))
        .unwrap()
        .clone();
    assert_eq!(p.buf_start, 0);
    assert_eq!(p.buf_len, 4 * 4096);
    let c = e.counters();
    assert_eq!(c.partial_hits, 1);
    assert_eq!(c.line_hits, 1);
    // Lines 2 and 3 are read from the HDD in one merged step? They are separated by their
    // SSD writes, so not merged; but the reads of whole lines are exactly line-sized.
    let hdd: u64 = p
        .steps
        .iter()
        .map(|s| match s {
            Step::ReadHdd { len, .. } => *len,
            _ => 0,
        })
        .sum();
    assert_eq!(hdd, 3 * 4096);
}

#[test]
fn write_back_marks_dirty_and_eviction_writes_back_first() {
    let mut e = engine(Mode::WriteBack, 1);
    let s = steps(&mut e, Request::write(0, 4096));
    assert_eq!(
        s,
        vec![Step::WriteSsd {
            ssd: 0,
            buf: 0,
            len: 4096
        }]
    );
    assert_eq!(e.dirty_lines(), 1);
    // A new line evicts the dirty one: write-back before the slot is overwritten.
    let s = steps(&mut e, Request::read(4096, 4096));
    assert_eq!(
        s,
        vec![
            Step::WriteBack {
                vol: 0,
                ssd: 0,
                hdd: 0,
                len: 4096
            },
            Step::ReadHdd {
                vol: 0,
                hdd: 4096,
                buf: 0,
                len: 4096
            },
            Step::WriteSsd {
                ssd: 0,
                buf: 0,
                len: 4096
            },
        ]
    );
    let c = e.counters();
    assert_eq!((c.evictions, c.dirty_evictions, c.write_backs), (1, 1, 1));
    assert_eq!(e.dirty_lines(), 0);
}

#[test]
fn fua_in_write_back_is_durable_in_the_cache_not_written_through() {
    let mut e = engine(Mode::WriteBack, 4);
    let mut r = Request::write(0, 4096);
    r.fua = true;
    let s = steps(&mut e, r);
    assert!(
        !s.iter().any(|s| matches!(s, Step::WriteHdd { .. })),
        "FUA went to the backing device: {s:?}"
    );
    assert_eq!(s.last(), Some(&Step::FlushSsd), "{s:?}");
    assert_eq!(e.dirty_lines(), 1);
    // A FUA write hit on a dirty line keeps it dirty and ends with a cache flush.
    let mut r = Request::write(0, 4096);
    r.fua = true;
    let s = steps(&mut e, r);
    assert_eq!(s.last(), Some(&Step::FlushSsd), "{s:?}");
    assert_eq!(e.dirty_lines(), 1);
    // In write-through the backing write carries the FUA; no cache flush is planned.
    let mut e = engine(Mode::WriteThrough, 4);
    let mut r = Request::write(0, 4096);
    r.fua = true;
    let s = steps(&mut e, r);
    assert!(
        s.iter().any(|s| matches!(s, Step::WriteHdd { .. })),
        "{s:?}"
    );
    assert!(!s.contains(&Step::FlushSsd), "{s:?}");
}

#[test]
fn partial_write_miss_fills_the_rest_of_the_line() {
    let mut e = line_engine(Mode::WriteBack, 4);
    let s = steps(&mut e, Request::write(1000, 1000));
    assert_eq!(
        s,
        vec![
            Step::WriteSsd {
                ssd: 1000,
                buf: 1000,
                len: 1000
            },
            Step::Populate {
                vol: 0,
                hdd: 0,
                ssd: 0,
                len: 1000
            },
            Step::Populate {
                vol: 0,
                hdd: 2000,
                ssd: 2000,
                len: 2096
            },
        ]
    );
    let c = e.counters();
    assert_eq!((c.hdd_bytes_read, c.ssd_bytes_written), (3096, 4096));
    // Without fill, the partial write goes around the cache.
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 4,
        mode: Mode::WriteBack,
        validity: Validity::Line,
        partial_write_fill: false,
        ..Default::default()
    })
    .unwrap();
    let s = steps(&mut e, Request::write(1000, 1000));
    assert_eq!(
        s,
        vec![Step::WriteHdd {
            vol: 0,
            hdd: 1000,
            buf: 1000,
            len: 1000
        }]
    );
    assert_eq!(e.counters().bypasses.partial_write, 1);
}

#[test]
fn write_around_and_read_only_do_not_allocate_writes() {
    for mode in [Mode::WriteAround, Mode::ReadOnly, Mode::PassThrough] {
        let mut e = engine(mode, 4);
        let s = steps(&mut e, Request::write(0, 4096));
        assert_eq!(
            s,
            vec![Step::WriteHdd {
                vol: 0,
                hdd: 0,
                buf: 0,
                len: 4096
            }],
            "{mode}"
        );
        assert_eq!(e.len(), 0);
        assert_eq!(e.counters().bypasses.mode, 1);
    }
    // Write-around updates a cached copy; read-only invalidates it.
    let mut e = engine(Mode::WriteAround, 4);
    steps(&mut e, Request::read(0, 4096));
    let s = steps(&mut e, Request::write(0, 4096));
    assert_eq!(s.len(), 2);
    assert_eq!(e.len(), 1);
    let mut e = engine(Mode::ReadOnly, 4);
    steps(&mut e, Request::read(0, 4096));
    let s = steps(&mut e, Request::write(0, 4096));
    assert_eq!(
        s,
        vec![Step::WriteHdd {
            vol: 0,
            hdd: 0,
            buf: 0,
            len: 4096
        }]
    );
    assert_eq!(e.len(), 0);
    assert_eq!(e.counters().invalidations, 1);
}

#[test]
fn pass_through_reads_clean_lines_from_hdd_but_dirty_ones_from_ssd() {
    let mut e = engine(Mode::WriteBack, 4);
    steps(&mut e, Request::write(0, 4096)); // dirty
    steps(&mut e, Request::read(4096, 4096)); // clean
    e.set_mode(Mode::PassThrough);
    let s = steps(&mut e, Request::read(0, 8192));
    assert_eq!(
        s,
        vec![
            Step::ReadSsd {
                ssd: 0,
                buf: 0,
                len: 4096
            },
            Step::ReadHdd {
                vol: 0,
                hdd: 4096,
                buf: 4096,
                len: 4096
            }
        ]
    );
}

#[test]
fn trim_invalidates_but_keeps_partly_trimmed_dirty_lines() {
    let mut e = line_engine(Mode::WriteBack, 4);
    steps(&mut e, Request::write(0, 8192));
    steps(&mut e, Request::read(8192, 4096));
    let trim = Request::new(0, Op::Trim, 2048, 8192 + 100);
    steps(&mut e, trim);
    // Line 0 (dirty, partly trimmed) stays; line 1 (fully trimmed) and line 2 (clean) go.
    assert_eq!(e.len(), 1);
    assert_eq!(e.counters().invalidations, 2);
    assert!(e.lookup(Engine::line_key(0, 0)).is_some());
}

#[test]
fn nhit_admission_counts_per_group() {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 64,
        admission: Admission {
            read_threshold: 2,
            write_threshold: 0,
        },
        ..Default::default()
    })
    .unwrap();
    steps(&mut e, Request::read(0, 4096));
    assert_eq!(e.len(), 0);
    assert_eq!(e.counters().bypasses.admission, 1);
    steps(&mut e, Request::read(0, 4096));
    assert_eq!(e.len(), 1);
    // Threshold 0: writes never populate.
    steps(&mut e, Request::write(40960, 4096));
    steps(&mut e, Request::write(40960, 4096));
    assert_eq!(e.len(), 1);
}

#[test]
fn a_group_is_populated_whole() {
    let mut cfg = EngineConfig {
        capacity_lines: 1024,
        ..Default::default()
    };
    cfg.apply_preset(Preset::Database); // 1 MiB group of 8 KiB lines, read threshold 2
    let mut e = Engine::new(cfg).unwrap();
    steps(&mut e, Request::read(100 << 20, 8192));
    assert_eq!(e.len(), 0);
    let s = steps(&mut e, Request::read((100 << 20) + 16384, 8192));
    assert_eq!(e.len(), 128, "whole 1 MiB group of 8 KiB lines");
    let populated: u64 = s
        .iter()
        .map(|s| match s {
            Step::Populate { len, .. } => *len,
            _ => 0,
        })
        .sum();
    assert_eq!(populated, 127 * 8192, "the other 127 lines");
    assert!(s.len() <= 4, "contiguous population merges: {s:?}");
    let c = e.counters();
    assert_eq!((c.insertions, c.admitted_misses), (128, 1));
    // Any other line of the group now hits.
    steps(&mut e, Request::read((100 << 20) + 1000 * 512, 8192));
    assert_eq!(e.counters().line_hits, 2);
}

#[test]
fn sequential_cutoff_bypasses_long_streams() {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 1024,
        seq_cutoff: SeqCutoff {
            read_bytes: 64 << 10,
            write_bytes: 0,
        },
        ..Default::default()
    })
    .unwrap();
    for i in 0..64u64 {
        steps(&mut e, Request::read(i * 4096, 4096));
    }
    // The first 15 requests (60 KiB) are cached; from 64 KiB on the stream bypasses.
    assert_eq!(e.len(), 15);
    assert_eq!(e.counters().bypasses.seq_cutoff, 49);
}

#[test]
fn cleaning_writes_back_in_lba_order_down_to_the_low_watermark() {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 10,
        mode: Mode::WriteBack,
        dirty_high: 0.5,
        dirty_low: 0.2,
        ..Default::default()
    })
    .unwrap();
    for l in [9u64, 3, 7, 1, 5, 8] {
        steps(&mut e, Request::write(l * 4096, 4096));
    }
    assert!(e.needs_cleaning());
    let n = e.cleaning_target();
    assert_eq!(n, 4);
    let hdd: Vec<u64> = e
        .clean(n)
        .steps
        .iter()
        .map(|s| match s {
            Step::WriteBack { hdd, .. } => hdd / 4096,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(hdd, vec![1, 3, 5, 7]);
    assert_eq!(e.dirty_lines(), 2);
    assert!(!e.needs_cleaning());
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let mut e = engine(Mode::WriteThrough, 4);
    let mut r = Request::read(0, 4096);
    r.class = 40;
    assert!(e.process(&r).unwrap_err().to_string().contains("class 40"));
    let r = Request::read(u64::MAX - 10, 4096);
    assert!(e.process(&r).is_err());
    let c = e.counters();
    assert_eq!(c.requests, 0);
}

#[test]
fn sector_validity_allocates_partial_writes_without_reading_the_hdd() {
    let mut e = engine(Mode::WriteBack, 4);
    // Sector-aligned part of an uncached line: no HDD I/O at all.
    let s = steps(&mut e, Request::write(512, 1024));
    assert_eq!(
        s,
        vec![Step::WriteSsd {
            ssd: 512,
            buf: 512,
            len: 1024
        }]
    );
    let slot = e.lookup(Engine::line_key(0, 0)).unwrap();
    assert_eq!((e.valid_mask(slot), e.dirty_mask(slot)), (0b110, 0b110));
    // A read of the rest: the valid sectors from the SSD, the absent ones from the HDD,
    // filled in; the line is whole afterwards and the next read hits.
    let s = steps(&mut e, Request::read(0, 4096));
    assert_eq!(
        s,
        vec![
            Step::ReadSsd {
                ssd: 512,
                buf: 512,
                len: 1024
            },
            Step::ReadHdd {
                vol: 0,
                hdd: 0,
                buf: 0,
                len: 512
            },
            Step::WriteSsd {
                ssd: 0,
                buf: 0,
                len: 512
            },
            Step::ReadHdd {
                vol: 0,
                hdd: 1536,
                buf: 1536,
                len: 2560
            },
            Step::WriteSsd {
                ssd: 1536,
                buf: 1536,
                len: 2560
            },
        ]
    );
    let c = e.counters();
    assert_eq!((c.line_misses, c.sector_fills, c.insertions), (2, 1, 1));
    assert_eq!(e.valid_mask(slot), 0xff);
    steps(&mut e, Request::read(0, 4096));
    assert_eq!(e.counters().read_line_hits, 1);
    // Write-back writes only the dirty sectors.
    steps(&mut e, Request::write(3072, 512));
    let wb = e.clean(1).steps.clone();
    assert_eq!(
        wb,
        vec![
            Step::WriteBack {
                vol: 0,
                ssd: 512,
                hdd: 512,
                len: 1024
            },
            Step::WriteBack {
                vol: 0,
                ssd: 3072,
                hdd: 3072,
                len: 512
            },
        ]
    );
    assert_eq!(e.dirty_lines(), 0);
}

#[test]
fn sector_validity_fills_only_partly_written_sectors() {
    let mut e = engine(Mode::WriteBack, 4);
    let s = steps(&mut e, Request::write(1000, 1000));
    assert_eq!(
        s,
        vec![
            Step::WriteSsd {
                ssd: 1000,
                buf: 1000,
                len: 1000
            },
            Step::Populate {
                vol: 0,
                hdd: 512,
                ssd: 512,
                len: 488
            },
            Step::Populate {
                vol: 0,
                hdd: 2000,
                ssd: 2000,
                len: 48
            },
        ]
    );
    let slot = e.lookup(Engine::line_key(0, 0)).unwrap();
    assert_eq!(e.valid_mask(slot), 0b1110);
}

#[test]
fn sector_validity_trims_whole_sectors_and_keeps_the_rest() {
    let mut e = engine(Mode::WriteBack, 4);
    steps(&mut e, Request::write(0, 8192));
    steps(&mut e, Request::read(8192, 4096));
    steps(&mut e, Request::new(0, Op::Trim, 2048, 8192 + 100));
    // Line 0 keeps sectors 0-3; line 1 goes; line 2 keeps everything (no whole sector
    // trimmed).
    assert_eq!((e.len(), e.counters().invalidations), (2, 1));
    let l0 = e.lookup(Engine::line_key(0, 0)).unwrap();
    assert_eq!((e.valid_mask(l0), e.dirty_mask(l0)), (0x0f, 0x0f));
    assert!(e.lookup(Engine::line_key(0, 2)).is_some());
}

#[test]
fn read_only_write_keeps_a_line_only_while_it_has_other_dirty_sectors() {
    let mut e = engine(Mode::WriteBack, 4);
    steps(&mut e, Request::write(0, 1024));
    e.set_mode(Mode::ReadOnly);
    // Overwrites sector 1 only: sector 0 is still dirty, so the line stays, current.
    let s = steps(&mut e, Request::write(512, 512));
    assert!(s.contains(&Step::WriteHdd {
        vol: 0,
        hdd: 512,
        buf: 512,
        len: 512
    }));
    let slot = e.lookup(Engine::line_key(0, 0)).unwrap();
    assert_eq!(e.dirty_mask(slot), 0b01);
    // Overwrites sector 0 too: nothing newer than the HDD is left, the line goes.
    steps(&mut e, Request::write(0, 512));
    assert!(e.lookup(Engine::line_key(0, 0)).is_none());
    assert_eq!(e.counters().invalidations, 1);
}

/// An engine with 64 KiB rewrite chunks (16 lines) from `min_runs` dirty runs, volume 1 MiB.
fn rewrite_engine(min_runs: u64) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: 256,
        mode: Mode::WriteBack,
        rewrite_chunk: 64 << 10,
        rewrite_min_runs: min_runs,
        volume_bytes: Some(1 << 20),
        ..Default::default()
    })
    .unwrap()
}

fn dirty(e: &mut Engine, lines: &[u64]) {
    for (i, &l) in lines.iter().enumerate() {
        e.process(&Request::new(i as u64, Op::Write, l * 4096, 4096))
            .unwrap();
    }
}

#[test]
fn a_dense_chunk_is_rewritten_whole_in_disk_order() {
    // Chunk 1 (lines 16..32): three runs (16-17, 20, 30); line 25 cached clean.
    let setup = || {
        let mut e = rewrite_engine(3);
        dirty(&mut e, &[30, 16, 20, 17]);
        e.process(&Request::new(9, Op::Read, 25 * 4096, 4096))
            .unwrap();
        e
    };
    // A pass too small for the chunk's 4 dirty lines writes back line by line, the lines LBA
    // order names.
    let mut e = setup();
    let plan = e.clean(3).steps.clone();
    assert!(
        plan.iter().all(|s| matches!(s, Step::WriteBack { .. })),
        "{plan:?}"
    );
    assert_eq!(plan.len(), 3);
    let mut e = setup();
    let plan = e.clean(4).steps.clone();
    // Every byte of the chunk once, contiguous, in disk order.
    let mut at = 16 * 4096;
    for s in &plan {
        let (h, l) = match *s {
            Step::WriteBack { hdd, len, .. } | Step::CopyHdd { hdd, len, .. } => (hdd, len),
            ref other => panic!("unexpected step {other:?}"),
        };
        assert_eq!(h, at, "{plan:?}");
        at += l;
    }
    assert_eq!(at, 32 * 4096);
    // Dirty lines and the clean cached line come from the cache, the rest from the disk.
    let from_cache: Vec<u64> = plan
        .iter()
        .filter_map(|s| match *s {
            Step::WriteBack { hdd, .. } => Some(hdd / 4096),
            _ => None,
        })
        .collect();
    assert_eq!(from_cache, vec![16, 17, 20, 25, 30]);
    assert_eq!(e.dirty_lines(), 0, "the whole chunk was cleaned");
    let c = e.counters();
    assert_eq!((c.chunk_rewrites, c.write_backs), (1, 4));
}

#[test]
fn a_sparse_chunk_is_written_back_run_by_run() {
    let mut e = rewrite_engine(3);
    // Two runs in chunk 0: below the crossover.
    dirty(&mut e, &[1, 2, 9]);
    let plan = e.clean(u64::MAX).steps.clone();
    assert!(
        plan.iter().all(|s| matches!(s, Step::WriteBack { .. })),
        "{plan:?}"
    );
    assert_eq!(plan.len(), 3);
    assert_eq!(e.counters().chunk_rewrites, 0);
    // The same chunk with a third run crosses over; chunk rewrites off: never.
    let mut e = rewrite_engine(3);
    dirty(&mut e, &[1, 2, 9, 12]);
    e.clean(u64::MAX);
    assert_eq!(e.counters().chunk_rewrites, 1);
    let mut e = rewrite_engine(3);
    e.set_chunk_rewrite(0, 3).unwrap();
    dirty(&mut e, &[1, 2, 9, 12]);
    assert!(e
        .clean(u64::MAX)
        .steps
        .iter()
        .all(|s| matches!(s, Step::WriteBack { .. })));
}

#[test]
fn a_rewrite_stops_at_the_end_of_the_volume() {
    // Volume of 40 lines: chunk 2 (lines 32..48) is cut at line 40.
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 256,
        mode: Mode::WriteBack,
        rewrite_chunk: 64 << 10,
        rewrite_min_runs: 2,
        volume_bytes: Some(40 * 4096),
        ..Default::default()
    })
    .unwrap();
    dirty(&mut e, &[33, 36]);
    let plan = e.clean(u64::MAX).steps.clone();
    let end = plan
        .iter()
        .map(|s| match *s {
            Step::WriteBack { hdd, len, .. } | Step::CopyHdd { hdd, len, .. } => hdd + len,
            _ => 0,
        })
        .max();
    assert_eq!(end, Some(40 * 4096), "{plan:?}");
    // Unknown volume size: the volume is taken to end on a chunk boundary.
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 256,
        mode: Mode::WriteBack,
        rewrite_chunk: 64 << 10,
        rewrite_min_runs: 2,
        ..Default::default()
    })
    .unwrap();
    dirty(&mut e, &[33, 36]);
    let plan = e.clean(u64::MAX).steps.clone();
    assert_eq!(plan.first().map(|s| s.bytes().3), Some(4096));
    let last = plan.last().unwrap();
    assert!(
        matches!(last, Step::CopyHdd { hdd, len, .. } if *hdd + *len == 48 * 4096),
        "{plan:?}"
    );
}

/// Issue 17: requests per direction by outcome (casadm's request table), for a known mix,
/// through the one-line fast path and the general path.
#[test]
fn requests_per_direction_by_outcome() {
    use tiercache_engine::DirRequests;
    let d = |hits, partial_misses, full_misses, pass_through| DirRequests {
        hits,
        partial_misses,
        full_misses,
        pass_through,
    };
    // Write-through: everything missed is admitted.
    let mut e = engine(Mode::WriteThrough, 16);
    for r in [
        Request::read(0, 4096),        // full miss
        Request::read(0, 4096),        // hit
        Request::read(0, 8192),        // partial miss (line 1 is new)
        Request::read(512, 1024),      // hit, sub-line
        Request::write(65536, 4096),   // full miss
        Request::write(65536, 4096),   // hit
        Request::write(65536, 12288),  // partial miss
        Request::read(1 << 20, 16384), // full miss over 4 lines
    ] {
        e.process(&r).unwrap();
    }
    let c = e.counters();
    assert_eq!(c.read_requests, d(2, 1, 2, 0));
    assert_eq!(c.write_requests, d(1, 1, 1, 0));
    c.check().unwrap();
    // Write-around: write misses go around the cache (pass-through), reads are admitted.
    let mut e = engine(Mode::WriteAround, 16);
    for r in [
        Request::write(0, 4096),     // pass-through
        Request::write(8192, 8192),  // pass-through, two lines
        Request::read(0, 4096),      // full miss, admitted
        Request::read(0, 4096),      // hit
        Request::read(40960, 4096),  // full miss
        Request::write(40960, 0),    // empty: a hit
        Request::write(81920, 1000), // pass-through, sub-line
    ] {
        e.process(&r).unwrap();
    }
    let c = e.counters();
    assert_eq!(c.read_requests, d(1, 0, 2, 0));
    assert_eq!(c.write_requests, d(1, 0, 0, 3));
    c.check().unwrap();
    // Sums over classes keep them.
    let mut sum = tiercache_engine::Counters::default();
    sum += &c;
    sum += &c;
    assert_eq!(sum.write_requests, d(2, 0, 0, 6));
}

#[test]
fn whole_lines_pay_one_bit_for_their_sector_masks() {
    let cap = 4096;
    let mut s = engine(Mode::WriteBack, cap);
    let mut l = line_engine(Mode::WriteBack, cap);
    for e in [&mut s, &mut l] {
        // Whole lines, half of them dirty.
        for i in 0..cap {
            let r = if i % 2 == 0 {
                Request::write(i * 4096, 4096)
            } else {
                Request::read(i * 4096, 4096)
            };
            e.process(&r).unwrap();
        }
        assert_eq!(e.counters().insertions, cap);
    }
    // One bit per slot, nothing in the side map (was 2 B per slot: 8 + 8 sector bits).
    assert_eq!(s.index_bytes() - l.index_bytes(), cap as usize / 8);
    for i in [0, 1, cap - 1] {
        let slot = s.lookup(Engine::line_key(0, i)).unwrap();
        let d = if i % 2 == 0 { 0xff } else { 0 };
        assert_eq!((s.valid_mask(slot), s.dirty_mask(slot)), (0xff, d));
    }
    // A line made partial (a trim of two sectors of a clean line) keeps its exact masks in
    // the side map; written whole again, it is back to one bit.
    s.process(&Request::new(0, Op::Trim, 4096 + 1024, 1024))
        .unwrap();
    let slot = s.lookup(Engine::line_key(0, 1)).unwrap();
    assert_eq!((s.valid_mask(slot), s.dirty_mask(slot)), (0b1111_0011, 0));
    s.process(&Request::write(4096 + 512, 512)).unwrap();
    assert_eq!(
        (s.valid_mask(slot), s.dirty_mask(slot)),
        (0b1111_0011, 0b10)
    );
    s.process(&Request::write(4096, 4096)).unwrap();
    assert_eq!((s.valid_mask(slot), s.dirty_mask(slot)), (0xff, 0xff));
    s.process(&Request::write(2 * 4096 + 512, 512)).unwrap();
    let slot = s.lookup(Engine::line_key(0, 2)).unwrap();
    assert_eq!((s.valid_mask(slot), s.dirty_mask(slot)), (0xff, 0xff));
}
