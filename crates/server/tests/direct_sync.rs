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
    let f = files(LINES, 4096);
    format(&f, mode, 4096);
    let faults = Faults::new(7);
    let (c, _) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
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
    (f, vol, bh)
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
/// its range is reported lost); once line 0 is evicted it reads `want` or fails.
fn check_after_failed_sync(f: &Files, vol: &CacheVolume, want: u8, what: &str) {
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
    bh.fail_next_sync(true);
    let first = vol.flush();
    assert!(first.is_err(), "the injected sync error: {first:?}");
    check_after_failed_sync(&f, &vol, 0xab, "write-through");
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
    check_after_failed_sync(&f, &vol, 0xcd, "write-back");
}

#[test]
fn write_around_failed_sync_reports_the_range_lost() {
    let (f, vol, bh) = rig(Mode::WriteAround);
    vol.write(0, &[0xef; 4096], false).unwrap();
    bh.fail_next_sync(true);
    let first = vol.flush();
    assert!(first.is_err(), "the injected sync error: {first:?}");
    check_after_failed_sync(&f, &vol, 0xef, "write-around");
}
