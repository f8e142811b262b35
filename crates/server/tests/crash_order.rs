//! Issue 14, item 4: after a crash a block reads its old or its new contents and keeps
//! reading that until it is written again, in every mode and both layouts; and an unclean
//! write-back start brings back dirty only the lines that may differ from the backing device.
//!
//! Each test kills the volume at an exact point with [`Gate`] (completed writes stay, as
//! after `kill -9`), reopens it, reads, forces the lines out of the cache (reads of other
//! lines evict them; the write-back ones are written back first) and reads again.

mod common;

use common::*;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{
    format_log, CacheVolume, FileDev, LogFormatOptions, LogVolume, OpenOptions,
};

const LS: u64 = 4096;

fn line_of(tag: u8) -> Vec<u8> {
    (0..LS).map(|i| tag ^ (i as u8).rotate_left(3)).collect()
}

fn read_line(v: &dyn Export, line: u64) -> Vec<u8> {
    let mut b = vec![0u8; LS as usize];
    v.read(line * LS, &mut b).unwrap();
    b
}

fn open_gated(f: &Files, gate: &std::sync::Arc<Gate>) -> CacheVolume {
    CacheVolume::open(
        gate.wrap("cache", &f.cache),
        gate.wrap("backing", &f.backing),
        &OpenOptions::default(),
    )
    .unwrap()
    .0
}

/// Direct layout, write-through and write-around: write A, FLUSH, write B killed between
/// its backing write and its slot write. After the restart the line reads A or B, and the
/// same once it has been evicted (today: A from the cache, then B from the backing).
#[test]
fn direct_kill_between_backing_and_slot_write_reads_the_same_after_eviction() {
    const LINES: u64 = 32;
    for mode in [Mode::WriteThrough, Mode::WriteAround] {
        let f = files(LINES, LS);
        format(&f, mode, LS);
        let gate = Gate::new();
        let vol = open_gated(&f, &gate);
        let (a, b) = (line_of(0xa0), line_of(0xb0));
        read_line(&vol, 5); // admitted (write-around admits reads)
        vol.write(5 * LS, &a, false).unwrap();
        vol.flush().unwrap();
        assert!(
            vol.lines().iter().any(|l| l.key == 5),
            "{mode:?}: line 5 cached"
        );
        gate.kill_at_write("backing", 5 * LS..6 * LS, true);
        assert!(vol.write(5 * LS, &b, false).is_err(), "{mode:?}: killed");
        drop(vol);

        let (vol, _) = open(&f, None);
        let first = read_line(&vol, 5);
        assert!(
            first == a || first == b,
            "{mode:?}: line 5 reads neither A nor B"
        );
        // Evict it: read twice the cache's worth of other lines (LRU).
        for l in 100..100 + 2 * LINES {
            read_line(&vol, l);
        }
        assert!(
            !vol.lines().iter().any(|l| l.key == 5),
            "{mode:?}: line 5 evicted"
        );
        let after = read_line(&vol, 5);
        assert!(
            after == first,
            "{mode:?}: line 5 read {} after the restart and {} once evicted",
            if first == a { "A" } else { "B" },
            if after == a { "A" } else { "B" }
        );
        vol.shutdown().unwrap();
    }
}

fn log_format_wt(f: &Files) {
    let o = LogFormatOptions {
        line_size: LS,
        segment_size: 4 * LS,
        compression: Compression::Lz4,
        dedup_ratio: 1.0,
        picker: "lru".into(),
        mode: Mode::WriteThrough,
        journal_records: None,
    };
    format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
}

/// Log layout, write-through: write A, FLUSH, write B, kill -9 (acknowledged), or killed
/// right after B reached the backing device (not acknowledged). After the restart the line
/// must read the same before and after it is evicted; an acknowledged write-through write is
/// on the backing device, so it must read B (today: A, then B once evicted).
#[test]
fn log_write_through_write_after_flush_then_kill_reads_the_same_after_eviction() {
    const SEGS: u64 = 10;
    for acknowledged in [true, false] {
        let f = log_cache_files(SEGS, 4 * LS);
        log_format_wt(&f);
        let gate = Gate::new();
        let (vol, _) = LogVolume::open(
            gate.wrap("cache", &f.cache),
            gate.wrap("backing", &f.backing),
        )
        .unwrap();
        let (a, b) = (line_of(0xa1), line_of(0xb1));
        vol.write(5 * LS, &a, false).unwrap();
        vol.flush().unwrap();
        if acknowledged {
            vol.write(5 * LS, &b, false).unwrap();
            gate.kill();
        } else {
            gate.kill_at_write("backing", 5 * LS..6 * LS, true);
            assert!(vol.write(5 * LS, &b, false).is_err());
        }
        drop(vol);

        let (vol, _) = LogVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
        )
        .unwrap();
        let what = if acknowledged {
            "acknowledged"
        } else {
            "killed in the backing write"
        };
        let first = read_line(&vol, 5);
        assert!(first == a || first == b, "{what}: reads neither A nor B");
        // Evict: write three cache-fulls of unique lines elsewhere (reclaims every segment).
        for l in 0..3 * SEGS * 4 {
            vol.write((100 + l) * LS, &line_of(l as u8 ^ 0x5c), false)
                .unwrap();
        }
        assert!(
            !vol.cached_lines().iter().any(|&(l, _)| l == 5),
            "{what}: line 5 evicted"
        );
        let after = read_line(&vol, 5);
        assert!(
            after == first,
            "{what}: line 5 read {} after the restart and {} once evicted",
            if first == a { "A" } else { "B" },
            if after == a { "A" } else { "B" }
        );
        if acknowledged {
            assert!(
                first == b,
                "{what}: a write-through write acknowledged before kill -9 reads A"
            );
        }
        vol.shutdown().unwrap();
    }
}

/// The write-back storm: after kill -9, only lines that were dirty at the last FLUSH or
/// written since may come back dirty (today every restored line does). Bound: dirty at the
/// last FLUSH + written since, no slack. And what the volume reads after the restart is what
/// the backing device holds once everything is written back.
#[test]
fn write_back_unclean_start_restores_dirty_only_lines_that_may_differ() {
    let f = files(200, LS);
    format(&f, Mode::WriteBack, LS);
    let gate = Gate::new();
    let vol = open_gated(&f, &gate);
    for l in 0..180 {
        vol.write(l * LS, &line_of(l as u8), false).unwrap();
    }
    vol.flush_dirty().unwrap(); // all clean, durable
    for l in 0..6 {
        vol.write(l * 7 * LS, &line_of(0x40 ^ l as u8), false)
            .unwrap();
    }
    vol.flush().unwrap();
    let dirty_at_flush = vol.stats().dirty_lines;
    assert_eq!(dirty_at_flush, 6);
    // Written since the FLUSH: clean lines overwritten in place, in both record pages.
    for l in [1u64, 2, 130, 131] {
        vol.write(l * LS, &line_of(0x80 ^ l as u8), false).unwrap();
    }
    assert_eq!(vol.stats().cached_lines, 180);
    gate.kill();
    drop(vol);

    let (vol, rep) = open(&f, None);
    assert!(!rep.was_clean);
    assert!(
        rep.restored_dirty <= dirty_at_flush + 4,
        "{} lines restored dirty; at most {} (dirty at the last FLUSH) + 4 (written since) may be ({rep:?})",
        rep.restored_dirty,
        dirty_at_flush
    );
    assert!(
        rep.restored >= 120,
        "warm: only {} of 180 lines restored",
        rep.restored
    );
    let mut before = vec![0u8; VOL as usize];
    vol.read(0, &mut before).unwrap();
    vol.flush_dirty().unwrap();
    vol.shutdown().unwrap();
    assert!(
        std::fs::read(&f.backing).unwrap() == before,
        "after writing everything back the backing device differs from what the volume read"
    );
}
