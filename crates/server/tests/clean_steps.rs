//! A cleaning write-back held between its steps (`CacheVolume::stepped_clean`: begun with
//! its lines pinned, I/O outside the volume lock, commit) while a request fails the cache
//! device: the failure's recovery must commit the write-back first (issue 20; found by
//! crash_points' stepped passes).

mod common;

use common::*;
use std::sync::Arc;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::Faults;
use tiercache_server::{CacheVolume, FileDev, OpenOptions, Superblock};

fn line(k: u64) -> Vec<u8> {
    line_pattern(k)
}

/// The cache is failed (its errors reached `max_cache_errors`) by a request to another line
/// while a write-back's lines are pinned: `fail_cache` drops every line, so it commits the
/// write-back first; every acknowledged byte then reads back from the backing device.
#[test]
fn failing_the_cache_commits_a_write_back_in_flight() {
    let f = files(24, 4096);
    format(&f, Mode::WriteBack, 4096);
    let faults = Faults::new(1);
    let (cdev, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (v, _) = CacheVolume::open(
        Box::new(cdev),
        Box::new(FileDev::open(&f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    let v = Arc::new(v);
    // Eight dirty lines, two runs (lines 0-3 and 6-9): a pass of 8 writes two groups.
    let lines: Vec<u64> = (0..4).chain(6..10).collect();
    for &k in &lines {
        v.write(k * 4096, &line(k), false).unwrap();
    }
    v.set_max_cache_errors(1);
    let pass = v.stepped_clean(8);
    assert!(pass.in_flight(), "the pass did not go outside the lock");
    // Every write to the cache's data area fails from now on: the write of line 20 fails
    // the cache (whose failure is recorded by erasing the superblock, which still works).
    ch.fail_writes(Superblock::data_offset_with(24, 4096, false)..u64::MAX);
    v.write(20 * 4096, &line(20), false)
        .expect("a write the failed cache passes through to the backing device");
    assert!(v.cache_failed(), "one cache error fails the cache here");
    pass.commit().expect("the write-back itself succeeded");
    for &k in lines.iter().chain([20].iter()) {
        let mut b = vec![0u8; 4096];
        v.read(k * 4096, &mut b).unwrap();
        assert!(b == line(k), "line {k} lost its acknowledged bytes");
    }
    let st = v.stats();
    assert_eq!(st.unlocked_writebacks, 1);
    assert_eq!(
        st.writeback_waits, 1,
        "the failing request waited for the I/O"
    );
}

/// The failure crash_points found: a read miss reuses a clean line's slot, whose record is
/// unmapped after a backing sync (`unmap_before_reuse`); that sync fails, the ranges written
/// since cannot be written again from the cache (its reads fail) and the lost ranges cannot
/// be recorded (its syncs fail): the cache is failed from inside the plan, while a
/// write-back whose I/O is done holds its lines pinned. No panic: the write-back is
/// committed first; its lines then read their bytes or fail (reported lost), never older
/// bytes.
#[test]
fn a_cache_failed_inside_a_plan_commits_the_write_back_first() {
    let f = files(24, 4096);
    format(&f, Mode::WriteBack, 4096);
    let faults = Faults::new(2);
    let (cdev, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (bdev, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    let (v, _) =
        CacheVolume::open(Box::new(cdev), Box::new(bdev), &OpenOptions::default()).unwrap();
    let v = Arc::new(v);
    v.set_unmap_batch(0);
    let lines: Vec<u64> = (0..4).chain(6..10).collect();
    for &k in &lines {
        v.write(k * 4096, &line(k), false).unwrap();
    }
    // The other 16 slots hold clean lines with durable records.
    let mut b = vec![0u8; 4096];
    for k in 40..56 {
        v.read(k * 4096, &mut b).unwrap();
    }
    v.flush().unwrap();
    let mut pass = v.stepped_clean(8);
    assert!(pass.in_flight(), "the pass did not go outside the lock");
    pass.io();
    bh.fail_syncs();
    ch.fail_syncs();
    ch.fail_reads(Superblock::data_offset_with(24, 4096, false)..u64::MAX);
    // A miss: its slot's record is unmapped first, after a backing sync that fails.
    let _ = v.read(60 * 4096, &mut b);
    assert!(
        v.cache_failed(),
        "the lost ranges could not be recorded: the cache failed"
    );
    let _ = pass.commit();
    for &k in &lines {
        let mut b = vec![0u8; 4096];
        if v.read(k * 4096, &mut b).is_ok() {
            assert!(b == line(k), "line {k} reads older bytes");
        }
    }
}

/// A cache sync that fails and drops the data-area writes since the last good one (a failed
/// fsync) while a write-back's I/O is held outside the lock: the slot of a line written
/// since then holds the bytes of the line it held before again, and the write-back must not
/// put those on this line's backing range as its own. Found by fault_model's concurrent
/// seed 10 (CI, session 16: after a restart, line 14 read line 76's bytes at the same
/// offsets). Before the fix: "line 1 read another line's bytes (slot's previous line 40)".
#[test]
fn a_cache_sync_dropping_writes_under_a_write_back_never_misdirects_its_bytes() {
    // Lines 40.. recognisable, so a slot's previous line is named.
    let f = patterned_files(40..80);
    let faults = Faults::new(3);
    // A volatile write cache: a failed sync can drop the writes since the last good one.
    let (cdev, ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), true);
    let v = open_full_of_clean_lines(Box::new(cdev), Box::new(FileDev::open(&f.backing).unwrap()));
    // Line 1 takes a clean line's slot (unmapped, synced): its bytes are written there, not
    // synced yet.
    v.write(4096, &line(1), false).unwrap();
    let mut pass = v.stepped_clean(8);
    assert!(pass.in_flight(), "the pass did not go outside the lock");
    // A trim of another cached line flags its record in flux first (no backing sync, so
    // it does not wait for the write-back): that cache sync fails and drops line 1's bytes.
    ch.fail_next_sync(true);
    let _ = v.trim(41 * 4096, 4096);
    assert_eq!(ch.injected(), 1, "the trim's cache sync failed");
    ch.heal();
    pass.io();
    let _ = pass.commit();
    let check = |v: &CacheVolume, when: &str| {
        let mut b = vec![0u8; 4096];
        if v.read(4096, &mut b).is_ok() {
            let prev = (40..80).find(|&k| b == line(k));
            assert!(
                b == line(1),
                "{when}: line 1 read bytes it never held (a previous line of its slot: {prev:?})"
            );
        } else {
            assert!(
                v.stats().lost_dirty_bytes > 0,
                "{when}: line 1 fails to read with nothing reported lost"
            );
        }
    };
    check(&v, "live");
    v.flush().unwrap();
    check(&v, "after a FLUSH");
}

/// A read that populates the missing sectors of a line a write-back holds, and whose plan
/// fails before changing the cache (the backing sync its slot reuse needs fails): the
/// failure commits the write-back first, and that commit must not record the failed plan's
/// sectors as valid, or the roll-back keeps them and the read, planned again uncached, reads
/// them from the slot, which still holds its previous line's bytes. Found by fault_model's
/// concurrent soak seed 162 (line 15 read line 59's bytes). Before the fix: "line 15
/// sector 0 read bytes it never held (the slot's previous line 40)".
#[test]
fn a_failed_read_beside_a_write_back_never_reads_sectors_it_did_not_fill() {
    let f = patterned_files(0..80);
    let faults = Faults::new(5);
    let (cdev, _ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), true);
    let (bdev, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let v = open_full_of_clean_lines(Box::new(cdev), Box::new(bdev));
    // Line 15's sectors 1-2 only, dirty, in a slot that held a clean line.
    let l15 = line(15);
    v.write(15 * 4096 + 512, &l15[512..1536], false).unwrap();
    let pass = v.stepped_clean(8);
    assert!(pass.in_flight(), "the pass did not go outside the lock");
    bh.fail_syncs();
    // Line 14's last sector (a miss: a slot reused, whose unmap needs the backing sync that
    // fails) and line 15's sectors 0-5 (0 and 3-5 populated into the pinned slot).
    let (a, n) = (14 * 4096 + 3584u64, 512 + 2944usize);
    let mut got = vec![0u8; n];
    let r = v.read(a, &mut got);
    bh.heal();
    let _ = pass.commit();
    let want: Vec<u8> = line(14)[3584..]
        .iter()
        .chain(&l15[..2944])
        .copied()
        .collect();
    if r.is_ok() {
        for s in 0..n / 512 {
            let (x, y) = (s * 512, (s + 1) * 512);
            if got[x..y] != want[x..y] {
                let at = (a as usize + x) % 4096;
                let prev = (0..80).find(|&k| got[x..y] == line(k)[at..at + 512]);
                panic!(
                    "sector {s} of the read (volume byte {}) read bytes it never held (a line of that offset: {prev:?})",
                    a as usize + x
                );
            }
        }
    }
    // And once the syncs work again, the whole of line 15 reads its bytes.
    let mut l = vec![0u8; 4096];
    v.read(15 * 4096, &mut l).unwrap();
    assert!(l == l15, "line 15 reads bytes it never held after the heal");
}
