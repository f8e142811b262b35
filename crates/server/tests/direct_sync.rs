//! Direct layout: a failed backing sync may drop the writes it was to make durable (Linux
//! marks the pages clean after a writeback error and reports it once), so a later sync that
//! succeeds proves nothing about them. A FLUSH that succeeds after such a failure must mean
//! the data is on the backing device (written again from the cache), or the range is
//! reported lost (reads fail): never older bytes served silently.

mod common;

use common::*;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::{CacheVolume, FileDev, OpenOptions};

const LINES: u64 = 16;

/// A cache of `LINES` 4 KiB lines over a backing device with a volatile write cache.
fn rig(mode: Mode) -> (Files, CacheVolume, FaultHandle) {
    let (f, vol, _, bh) = rig_with_cache(mode);
    (f, vol, bh)
}

/// [`rig`], with the cache device's fault handle.
fn rig_with_cache(mode: Mode) -> (Files, CacheVolume, FaultHandle, FaultHandle) {
    let f = files(LINES, 4096);
    format(&f, mode, 4096);
    let faults = Faults::new(7);
    let (c, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (b, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let opts = OpenOptions {
        state_path: Some(tiercache_server::state_file::beside(&f.cache)),
        ..Default::default()
    };
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    (f, vol, ch, bh)
}

fn backing_byte(f: &Files, at: usize) -> u8 {
    std::fs::read(&f.backing).unwrap()[at]
}

/// Reads every other line of the volume (twice) until line 0 is no longer cached.
fn evict_line_0(vol: &CacheVolume) {
    let mut b = vec![0u8; 4096];
    for _ in 0..4 {
        for l in 1..VOL / 4096 {
            vol.read(l * 4096, &mut b).unwrap();
        }
        if !vol.lines().iter().any(|l| l.key & 0xffff_ffff == 0) {
            return;
        }
    }
    panic!("line 0 still cached after reading the whole volume 4 times");
}

/// After the failed sync: a FLUSH succeeds only once byte 0 is on the backing device (or
/// its range is reported lost); once line 0 is evicted it reads `want` or fails. `cached`:
/// the cache still held the line at the failed sync, so nothing may be lost.
fn check_after_failed_sync(f: &Files, vol: &CacheVolume, want: u8, cached: bool, what: &str) {
    let second = vol.flush();
    let lost = vol.stats().lost_dirty_ranges;
    let on_backing = backing_byte(f, 0);
    println!("{what}: second flush {second:?}, backing byte 0 {on_backing:#x}, lost {lost:?}");
    if second.is_ok() {
        assert!(
            on_backing == want || lost.iter().any(|&(a, b)| a == 0 && b > 0),
            "{what}: the FLUSH after a failed sync succeeded, but the backing device holds {on_backing:#x} at byte 0 (want {want:#x}) and no lost range covers it"
        );
    }
    if cached {
        assert!(
            second.is_ok() && on_backing == want && lost.is_empty(),
            "{what}: the cache held the line: written again, nothing lost"
        );
    }
    evict_line_0(vol);
    let mut b = [0u8; 1];
    match vol.read(0, &mut b) {
        Ok(()) => assert_eq!(
            b[0], want,
            "{what}: byte 0 reads {:#x} after eviction (the backing device's older byte), want {want:#x} or an error",
            b[0]
        ),
        Err(e) => println!("{what}: byte 0 reads as an error (reported lost): {e}"),
    }
    // Writing it again heals it: the next FLUSH puts it on the backing device.
    vol.write(0, &[want; 4096], false).unwrap();
    vol.flush().unwrap();
    assert_eq!(backing_byte(f, 0), want, "{what}: rewritten and flushed");
    vol.read(0, &mut b).unwrap();
    assert_eq!(b[0], want, "{what}");
}

#[test]
fn write_through_flush_after_a_failed_sync_does_not_lie() {
    let (f, vol, bh) = rig(Mode::WriteThrough);
    assert_ne!(initial(0), 0xab);
    vol.write(0, &[0xab; 4096], false).unwrap();
    assert_eq!(vol.stats().backing_sync_errors, 0);
    bh.fail_next_sync(true);
    let first = vol.flush();
    assert!(first.is_err(), "the injected sync error: {first:?}");
    // Counted where an operator looks (`ctl stats`, Prometheus).
    assert_eq!(vol.stats().backing_sync_errors, 1);
    let prom = vol.metrics().prometheus(&vol.stats());
    assert!(
        prom.contains("tiercache_backing_sync_errors_total 1"),
        "{prom}"
    );
    check_after_failed_sync(&f, &vol, 0xab, true, "write-through");
    assert_eq!(vol.stats().backing_sync_errors, 1, "later syncs succeeded");
}

#[test]
fn write_back_cleaning_then_a_failed_sync_does_not_lie() {
    let (f, vol, bh) = rig(Mode::WriteBack);
    vol.write(0, &[0xcd; 4096], false).unwrap();
    assert_eq!(vol.stats().dirty_lines, 1);
    // `ctl flush`: the write-back, then its sync fails dropping it.
    bh.fail_next_sync(true);
    let first = vol.flush_dirty();
    assert!(first.is_err(), "the injected sync error: {first:?}");
    check_after_failed_sync(&f, &vol, 0xcd, true, "write-back");
}

#[test]
fn write_around_failed_sync_reports_the_range_lost() {
    let (f, vol, bh) = rig(Mode::WriteAround);
    vol.write(0, &[0xef; 4096], false).unwrap();
    bh.fail_next_sync(true);
    let first = vol.flush();
    assert!(first.is_err(), "the injected sync error: {first:?}");
    check_after_failed_sync(&f, &vol, 0xef, false, "write-around");
}

#[test]
fn many_unsynced_backing_writes_force_a_backing_sync() {
    // Write-around, no FLUSH: 4096 disjoint backing ranges, then one more write syncs
    // first (bounding what a failed sync could drop), so the file holds the earlier ones.
    let (f, vol, _bh) = rig(Mode::WriteAround);
    for k in 0..4096u64 {
        vol.write(k * 256, &[0x5a], false).unwrap();
    }
    let before = std::fs::read(&f.backing).unwrap();
    assert_eq!(
        before[0],
        initial(0),
        "nothing synced yet (volatile backing)"
    );
    vol.write(VOL - 1, &[0x5a], false).unwrap();
    let after = std::fs::read(&f.backing).unwrap();
    let synced = (0..4096usize).filter(|k| after[k * 256] == 0x5a).count();
    assert_eq!(
        synced, 4096,
        "the 4097th unsynced write synced the first 4096"
    );
    assert_eq!(after[VOL as usize - 1], initial(VOL - 1), "not the new one");
}

#[test]
fn failed_sync_after_the_cache_fails_reports_the_copied_lines_lost() {
    // Write-back: the cache fails (a write error past the threshold) and the backing sync
    // after copying its dirty line fails dropping the copy: the line is reported lost
    // (reads fail), never served as the backing device's older bytes.
    let (_f, vol, ch, bh) = rig_with_cache(Mode::WriteBack);
    vol.write(0, &[0x77; 4096], false).unwrap();
    vol.flush().unwrap();
    assert_eq!(vol.stats().dirty_lines, 1);
    vol.set_max_cache_errors(1);
    ch.fail_writes(0..u64::MAX);
    bh.fail_next_sync(true);
    let r = vol.write(8 * 4096, &[0x11; 4096], false);
    let st = vol.stats();
    println!(
        "write: {r:?}; cache failed {}, lost {:?}",
        st.cache_failed, st.lost_dirty_ranges
    );
    assert!(st.cache_failed, "{st:?}");
    let mut b = [0u8; 1];
    match vol.read(0, &mut b) {
        Ok(()) => assert_eq!(
            b[0], 0x77,
            "byte 0 reads {:#x} after the failed sync (older backing bytes)",
            b[0]
        ),
        Err(e) => println!("byte 0: {e}"),
    }
    assert!(st
        .lost_dirty_ranges
        .iter()
        .any(|&(a, b)| a == 0 && b >= 4096));
}

#[test]
fn failed_sync_while_evicting_an_unsynced_line_writes_it_again_from_its_slot() {
    // Write-through: line 0's record is on the cache device (flushed); written again, its
    // new bytes are not synced when reads evict it. Reusing its slot syncs the backing
    // device first (rule 2); that sync fails dropping them: the evicted line is written
    // again from the slot it still occupies, so nothing is lost, and the eviction is rolled
    // back. The read is then served from the backing device uncached, as every read miss
    // while syncs fail (notes-directsync3): no read fails.
    let (f, vol, bh) = rig(Mode::WriteThrough);
    vol.write(0, &[0x31; 4096], false).unwrap();
    vol.flush().unwrap();
    vol.write(0, &[0x32; 4096], false).unwrap();
    bh.fail_next_sync(true);
    let mut b = vec![0u8; 4096];
    let mut failed = 0;
    for l in 1..3 * LINES {
        if let Err(e) = vol.read(l * 4096, &mut b) {
            println!("read of line {l}: {e}");
            failed += 1;
        }
    }
    assert_eq!(
        failed, 0,
        "read misses are served uncached while syncs fail"
    );
    assert!(
        vol.lines().iter().any(|l| l.key == 0),
        "line 0 still cached: its eviction was rolled back"
    );
    assert!(
        vol.stats().backing_sync_errors >= 1,
        "the eviction's sync failed"
    );
    let lost = vol.stats().lost_dirty_ranges;
    assert!(
        lost.is_empty(),
        "nothing lost: the slot still held line 0: {lost:?}"
    );
    vol.flush().unwrap();
    assert_eq!(backing_byte(&f, 0), 0x32, "line 0 on the backing device");
    let mut one = [0u8; 1];
    vol.read(0, &mut one).unwrap();
    assert_eq!(one[0], 0x32);
}

#[test]
fn pass_through_after_the_cache_failed_reports_dropped_writes_lost() {
    // The cache failed: writes pass through. A FLUSH whose sync fails dropping them fails;
    // the range is then reported lost (reads fail) instead of reading older bytes after
    // the next FLUSH succeeds.
    let (f, vol, ch, bh) = rig_with_cache(Mode::WriteThrough);
    vol.set_max_cache_errors(1);
    ch.lose();
    let _ = vol.write(0, &[0x01; 4096], false);
    assert!(vol.stats().cache_failed);
    vol.flush().unwrap();
    vol.write(3 * 4096, &[0x44; 4096], false).unwrap();
    bh.fail_next_sync(true);
    assert!(vol.flush().is_err());
    vol.flush().unwrap();
    let mut b = [0u8; 1];
    let r = vol.read(3 * 4096, &mut b);
    println!("read after the failed sync: {r:?} {:#x}", b[0]);
    match r {
        Ok(()) => assert_eq!(b[0], 0x44, "older bytes after the failed sync"),
        Err(e) => assert!(e.to_string().contains("lost"), "{e}"),
    }
    // Written again: readable, on the backing device after a FLUSH.
    vol.write(3 * 4096, &[0x45; 4096], false).unwrap();
    vol.flush().unwrap();
    vol.read(3 * 4096, &mut b).unwrap();
    assert_eq!((b[0], backing_byte(&f, 3 * 4096)), (0x45, 0x45));
}

#[test]
fn failed_sync_in_the_middle_of_a_populate_never_copies_another_line() {
    // Write-around: the cache is full of lines whose records are on the cache device; a
    // write to uncached line 0 goes to the backing device only; reading line 0 populates it
    // into a reused slot, whose record is emptied after a backing sync, which fails dropping
    // the write. The slot still holds the evicted line: it must not be copied as line 0.
    let (f, vol, bh) = rig(Mode::WriteAround);
    let mut b = vec![0u8; 4096];
    for _ in 0..2 {
        for l in 1..=LINES {
            vol.read(l * 4096, &mut b).unwrap();
        }
    }
    vol.flush().unwrap();
    assert_eq!(vol.stats().cached_lines, LINES);
    vol.write(0, &[0xef; 4096], false).unwrap();
    bh.fail_next_sync(true);
    let r = vol.read(0, &mut b);
    println!("read of line 0: {:?}", r.as_ref().map(|_| b[0]));
    let _ = vol.flush();
    vol.flush().unwrap();
    let on_backing = std::fs::read(&f.backing).unwrap();
    let lost = vol.stats().lost_dirty_ranges;
    println!("backing line 0 starts {:#x}, lost {lost:?}", on_backing[0]);
    assert!(
        on_backing[..4096].iter().all(|&v| v == 0xef) || lost.iter().any(|&(a, _)| a == 0),
        "line 0 on the backing device is neither the write nor reported lost: {:#x}.. (another line's bytes?)",
        on_backing[0]
    );
    let mut one = [0u8; 1];
    match vol.read(0, &mut one) {
        Ok(()) => assert_eq!(one[0], 0xef),
        Err(e) => assert!(e.to_string().contains("lost"), "{e}"),
    }
}

/// Reads every cached line but `keep` (hits), so that `keep` becomes the LRU victim.
fn touch_all_but(vol: &CacheVolume, keep: u64) {
    let mut b = vec![0u8; 4096];
    for l in vol.lines() {
        let line = l.key & 0xffff_ffff_ffff;
        if line != keep {
            vol.read(line * 4096, &mut b).unwrap();
        }
    }
}

#[test]
fn unmapping_ahead_lines_written_since_the_last_sync_syncs_first() {
    // Write-through, no FLUSH: the cache's lines were written through but never synced, and
    // their records never reached the cache device. Unmapping likely victims ahead needs no
    // record rewritten, but it claims the backing device holds them (rule 2): without a
    // sync first, their evictions need none either, and a failed sync afterwards dropped
    // the only other copy (reported lost, or older bytes).
    let (f, vol, bh) = rig(Mode::WriteThrough);
    for l in 0..LINES {
        vol.write(l * 4096, &[0x40 + l as u8; 4096], false).unwrap();
    }
    vol.unmap_ahead_if_needed().unwrap();
    let ahead = vol.unmapped_ahead();
    assert!(!ahead.is_empty(), "likely victims unmapped ahead");
    // New lines evict them.
    for l in LINES..LINES + ahead.len() as u64 {
        vol.write(l * 4096, &[0x11; 4096], false).unwrap();
    }
    bh.fail_next_sync(true);
    assert!(vol.flush().is_err(), "the injected sync error");
    let lost = vol.stats().lost_dirty_ranges;
    println!("ahead {ahead:?}, lost after the failed sync: {lost:?}");
    assert!(
        lost.is_empty(),
        "acknowledged writes reported lost: {lost:?}"
    );
    vol.flush().unwrap();
    let backing = std::fs::read(&f.backing).unwrap();
    for l in 0..LINES {
        let mut b = [0u8; 1];
        vol.read(l * 4096, &mut b).unwrap();
        assert_eq!(b[0], 0x40 + l as u8, "line {l} reads older bytes");
        assert_eq!(
            backing[(l * 4096) as usize],
            0x40 + l as u8,
            "line {l} on backing"
        );
    }
}

#[test]
fn a_line_unmapped_ahead_then_written_through_is_not_evicted_without_a_sync() {
    // Line 0 is unmapped ahead (its record empty, the backing device synced), then written
    // through: its new bytes wait for a sync. Evicting it must sync first (or write it again
    // from its slot when that sync fails), not drop it as a line the backing device holds.
    let (f, vol, bh) = rig(Mode::WriteThrough);
    for l in 0..LINES {
        vol.write(l * 4096, &[0x20; 4096], false).unwrap();
    }
    vol.flush().unwrap();
    vol.unmap_ahead_if_needed().unwrap();
    let slot0 = vol.lines().iter().find(|l| l.key == 0).unwrap().slot;
    assert!(
        vol.unmapped_ahead().contains(&slot0),
        "line 0 (the LRU line) unmapped ahead: {:?}",
        vol.unmapped_ahead()
    );
    vol.write(0, &[0x21; 4096], false).unwrap();
    touch_all_but(&vol, 0);
    // A new line evicts line 0 (the others unmapped ahead were read again: not victims).
    bh.fail_next_sync(true);
    let w = vol.write(LINES * 4096, &[0x22; 4096], false);
    let _ = vol.flush();
    let lost = vol.stats().lost_dirty_ranges;
    println!("write evicting line 0: {w:?}; lost: {lost:?}");
    assert!(lost.is_empty(), "line 0 reported lost: {lost:?}");
    vol.flush().unwrap();
    let mut b = [0u8; 1];
    vol.read(0, &mut b).unwrap();
    assert_eq!(b[0], 0x21, "line 0 reads older bytes");
    assert_eq!(backing_byte(&f, 0), 0x21, "line 0 on the backing device");
}
