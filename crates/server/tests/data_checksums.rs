//! Data checksums of the direct layout (`--data-checksums`, issue 14 item 7): a flipped byte
//! in cached data is detected on read. A clean line is dropped and read again from the
//! backing device; a dirty sector fails with EIO (that range only), is reported, is never
//! written to the backing device, and stays lost across restarts until it is written again.
//! Every test runs the same steps on a cache without checksums first and asserts that the
//! damage IS served there: the checks bite.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::check::{check_device, repair_device};
use tiercache_server::{read_superblock, CacheVolume, FileDev};

const LINES: u64 = 16;

fn setup(mode: Mode, sums: bool) -> Files {
    let f = files_with(LINES, 4096, sums);
    format_with(&f, mode, 4096, sums);
    f
}

fn slot_of(vol: &CacheVolume, line: u64) -> u32 {
    vol.lines()
        .iter()
        .find(|l| l.key == line)
        .unwrap_or_else(|| panic!("line {line} is not cached"))
        .slot
}

/// Flips one bit of the cache file at `at` bytes into `slot` (works while the server runs:
/// the volume reads the file through the same page cache).
fn flip(f: &Files, slot: u32, at: u64) {
    let sb = read_superblock(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f.cache)
        .unwrap();
    let off = sb.data_offset + slot as u64 * 4096 + at;
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x10;
    file.write_all_at(&b, off).unwrap();
    file.sync_all().unwrap();
}

fn backing_bytes(f: &Files, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    std::fs::File::open(&f.backing)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    b
}

fn initial_bytes(at: u64, len: u64) -> Vec<u8> {
    (at..at + len).map(initial).collect()
}

#[test]
fn clean_line_flipped_while_stopped_is_read_from_backing() {
    for sums in [false, true] {
        let f = setup(Mode::WriteThrough, sums);
        let (vol, _) = open(&f, None);
        let mut buf = vec![0u8; 4096];
        for l in 0..8 {
            vol.read(l * 4096, &mut buf).unwrap(); // populates lines 0..8
        }
        let slot = slot_of(&vol, 3);
        vol.shutdown().unwrap();
        drop(vol);
        flip(&f, slot, 777);
        let (vol, rep) = open(&f, None);
        let want = initial_bytes(3 * 4096, 4096);
        if !sums {
            // Without checksums the damage is taken for a backing device changed behind the
            // cache's back (the open-time sample): every clean line is dropped.
            assert!(
                rep.differing_clean_lines == 1 && rep.dropped_clean_lines == 8,
                "{rep:?}"
            );
            continue;
        }
        assert_eq!(
            (
                rep.damaged_clean_lines,
                rep.differing_clean_lines,
                rep.dropped_clean_lines
            ),
            (1, 0, 1),
            "only the damaged line is dropped: {rep:?}"
        );
        assert_eq!(vol.lines().len(), 7);
        vol.read(3 * 4096, &mut buf).unwrap();
        assert!(
            buf == want,
            "the damaged clean line is read from the backing device"
        );
        let st = vol.stats();
        assert_eq!(st.checksum_errors, 1);
        assert_eq!(st.cache_errors, 0, "damage is not a failing device");
        assert!(st.lost_dirty_ranges.is_empty());
        let prom = vol.metrics().prometheus(&vol.stats());
        assert!(
            prom.contains("tiercache_data_checksum_errors_total 1"),
            "{prom}"
        );
        vol.shutdown().unwrap();
    }
}

#[test]
fn clean_line_flipped_while_running_is_read_from_backing() {
    for sums in [false, true] {
        let f = setup(Mode::WriteThrough, sums);
        let (vol, _) = open(&f, None);
        let mut buf = vec![0u8; 8192];
        vol.read(5 * 4096, &mut buf).unwrap();
        flip(&f, slot_of(&vol, 6), 4000);
        vol.read(5 * 4096, &mut buf).unwrap();
        let want = initial_bytes(5 * 4096, 8192);
        if !sums {
            assert!(buf != want, "without checksums the flipped byte is served");
            continue;
        }
        assert!(buf == want, "read from the backing device");
        assert_eq!(vol.stats().checksum_errors, 1);
        // Populated again from the backing device, with good checksums.
        vol.read(5 * 4096, &mut buf).unwrap();
        vol.read(5 * 4096, &mut buf).unwrap();
        assert!(buf == want);
        assert_eq!(vol.stats().checksum_errors, 1);
        // An unaligned read inside the damaged sector of a newly damaged line.
        flip(&f, slot_of(&vol, 5), 1030);
        let mut small = vec![0u8; 100];
        vol.read(5 * 4096 + 1000, &mut small).unwrap();
        assert_eq!(small, initial_bytes(5 * 4096 + 1000, 100));
        assert_eq!(vol.stats().checksum_errors, 2);
        vol.shutdown().unwrap();
        assert!(check_device(&FileDev::open_read_only(&f.cache).unwrap())
            .unwrap()
            .ok());
    }
}

/// Write-back lines 2 and 6, flushed, stopped cleanly; one byte of line 2's sector 1 flipped.
fn dirty_setup(sums: bool) -> (Files, u32) {
    let f = setup(Mode::WriteBack, sums);
    let (vol, _) = open(&f, None);
    vol.write(2 * 4096, &[0xa1; 4096], false).unwrap();
    vol.write(6 * 4096, &[0xb2; 4096], false).unwrap();
    vol.flush().unwrap();
    let slot = slot_of(&vol, 2);
    vol.shutdown().unwrap();
    drop(vol);
    flip(&f, slot, 1000);
    (f, slot)
}

#[test]
fn dirty_sector_flipped_fails_that_range_only_and_is_never_written_back() {
    let (f, _) = dirty_setup(false);
    let (vol, _) = open(&f, None);
    let mut buf = vec![0u8; 4096];
    vol.read(2 * 4096, &mut buf).unwrap();
    assert!(
        buf != vec![0xa1; 4096],
        "without checksums the flip is served"
    );
    vol.flush_dirty().unwrap();
    assert!(
        backing_bytes(&f, 2 * 4096, 4096) != vec![0xa1; 4096],
        "and written back"
    );
    vol.shutdown().unwrap();

    let (f, slot) = dirty_setup(true);
    let chk = check_device(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert!(!chk.ok(), "check finds the damage");
    let p = chk.problems.join("; ");
    assert!(
        p.contains(&format!("slot {slot}"))
            && p.contains("volume bytes 8704..9216")
            && p.contains("DIRTY"),
        "{p}"
    );
    let (vol, _) = open(&f, None);
    let mut buf = vec![0u8; 4096];
    let e = vol.read(2 * 4096, &mut buf).unwrap_err();
    assert!(e.to_string().contains("lost"), "{e}");
    // Only the damaged sector is lost: the line's other sectors were saved.
    let mut s = vec![0u8; 512];
    vol.read(2 * 4096, &mut s).unwrap();
    assert_eq!(s, vec![0xa1; 512]);
    vol.read(2 * 4096 + 1024, &mut s).unwrap();
    assert_eq!(s, vec![0xa1; 512]);
    assert!(vol.read(2 * 4096 + 512, &mut s).is_err());
    vol.read(6 * 4096, &mut buf).unwrap();
    assert_eq!(buf, vec![0xb2; 4096], "other ranges are fine");
    let st = vol.stats();
    assert_eq!(st.checksum_errors, 1);
    assert_eq!(st.lost_dirty_ranges, vec![(8704, 9216)]);
    // The cleaner writes everything else back, never the damaged bytes.
    vol.flush_dirty().unwrap();
    assert_eq!(vol.stats().dirty_lines, 0);
    assert_eq!(backing_bytes(&f, 6 * 4096, 4096), vec![0xb2; 4096]);
    assert_eq!(
        backing_bytes(&f, 8704, 512),
        initial_bytes(8704, 512),
        "the damaged sector never reached the backing device"
    );
    vol.shutdown().unwrap();
    drop(vol);
    // The loss is durable: after a restart the range still fails, and check names it.
    let chk = check_device(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert!(!chk.ok());
    assert!(
        chk.problems.join("; ").contains("8704..9216"),
        "{:?}",
        chk.problems
    );
    let (vol, _) = open(&f, None);
    assert!(
        vol.read(8704, &mut s).is_err(),
        "still lost after a restart"
    );
    // Written again: readable, also after a restart.
    vol.write(8704, &[0xc3; 512], false).unwrap();
    vol.read(8704, &mut s).unwrap();
    assert_eq!(s, vec![0xc3; 512]);
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, _) = open(&f, None);
    vol.read(8704, &mut s).unwrap();
    assert_eq!(s, vec![0xc3; 512]);
    assert!(vol.stats().lost_dirty_ranges.is_empty());
    vol.shutdown().unwrap();
    assert!(check_device(&FileDev::open_read_only(&f.cache).unwrap())
        .unwrap()
        .ok());
}

#[test]
fn dirty_sector_flipped_while_running_is_not_cleaned() {
    for sums in [false, true] {
        let f = setup(Mode::WriteBack, sums);
        let (vol, _) = open(&f, None);
        vol.write(4 * 4096, &[0x5a; 8192], false).unwrap();
        vol.flush().unwrap();
        flip(&f, slot_of(&vol, 5), 3000);
        let r = vol.flush_dirty();
        if !sums {
            r.unwrap();
            assert!(backing_bytes(&f, 5 * 4096, 4096) != vec![0x5a; 4096]);
            continue;
        }
        r.unwrap();
        assert_eq!(backing_bytes(&f, 4 * 4096, 4096), vec![0x5a; 4096]);
        let at = 5 * 4096 + 2560;
        assert_eq!(backing_bytes(&f, at, 512), initial_bytes(at, 512));
        let st = vol.stats();
        assert_eq!(st.checksum_errors, 1);
        assert_eq!(st.lost_dirty_ranges, vec![(at, at + 512)]);
        let mut b = vec![0u8; 4096];
        assert!(vol.read(5 * 4096, &mut b).is_err());
        vol.shutdown().unwrap();
    }
}

#[test]
fn repair_drops_damaged_lines_and_lists_dirty_ranges() {
    let (f, _) = dirty_setup(true);
    {
        // A clean line damaged too.
        let (vol, _) = open(&f, None);
        let mut b = vec![0u8; 4096];
        vol.read(9 * 4096, &mut b).unwrap();
        let slot = slot_of(&vol, 9);
        vol.shutdown().unwrap();
        drop(vol);
        flip(&f, slot, 10);
    }
    let dev = FileDev::open_exclusive(&f.cache).unwrap();
    let (rep, after) = repair_device(&dev).unwrap();
    drop(dev);
    assert!(rep.changed && after.ok(), "{:?} {:?}", rep, after.problems);
    let lost: Vec<(u64, u64)> = rep.lost_ranges.iter().map(|l| (l.start, l.end)).collect();
    assert_eq!(lost, vec![(8704, 9216)], "{rep:?}");
    let (vol, _) = open(&f, None);
    let mut b = vec![0u8; 4096];
    vol.read(9 * 4096, &mut b).unwrap();
    assert_eq!(b, initial_bytes(9 * 4096, 4096));
    vol.read(2 * 4096, &mut b).unwrap();
    assert_eq!(&b[..512], &[0xa1; 512]);
    assert_eq!(vol.stats().checksum_errors, 0);
    vol.shutdown().unwrap();
}

#[test]
fn caches_without_checksums_open_and_stay_version_2() {
    let f = setup(Mode::WriteBack, false);
    let (vol, _) = open(&f, None);
    vol.write(0, &[7; 4096], true).unwrap();
    assert!(!vol.stats().data_checksums);
    vol.shutdown().unwrap();
    let sb = read_superblock(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert_eq!((sb.version, sb.data_checksums), (2, false));
    let f = setup(Mode::WriteBack, true);
    let (vol, _) = open(&f, None);
    assert!(vol.stats().data_checksums);
    vol.shutdown().unwrap();
    let sb = read_superblock(&FileDev::open_read_only(&f.cache).unwrap()).unwrap();
    assert_eq!((sb.version, sb.data_checksums), (3, true));
}

/// 64 KiB lines (1 KiB sectors) and unaligned writes smaller than a sector, in every mode
/// that caches writes: every read verifies, nothing is reported damaged, also after a
/// restart (the checksums of partly written sectors are computed over whole sectors).
#[test]
fn unaligned_writes_in_large_lines_verify() {
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        let f = files_with(8, 65536, true);
        format_with(&f, mode, 65536, true);
        let mut want: Vec<u8> = (0..VOL).map(initial).collect();
        let (vol, _) = open(&f, None);
        let mut b = vec![0u8; 65536];
        vol.read(0, &mut b).unwrap();
        for (i, (at, len)) in [
            (3001u64, 100usize),
            (70_000, 1500),
            (512, 300),
            (131_071, 2),
        ]
        .into_iter()
        .enumerate()
        {
            let d = vec![0x30 + i as u8; len];
            vol.write(at, &d, false).unwrap();
            want[at as usize..at as usize + len].copy_from_slice(&d);
        }
        let mut all = vec![0u8; 4 * 65536];
        vol.read(0, &mut all).unwrap();
        assert!(all == want[..all.len()], "{mode:?}");
        vol.flush().unwrap();
        vol.shutdown().unwrap();
        drop(vol);
        let (vol, _) = open(&f, None);
        vol.read(0, &mut all).unwrap();
        assert!(all == want[..all.len()], "{mode:?} after a restart");
        let st = vol.stats();
        assert_eq!(
            (st.checksum_errors, st.lost_dirty_bytes),
            (0, 0),
            "{mode:?}"
        );
        vol.shutdown().unwrap();
        assert!(check_device(&FileDev::open_read_only(&f.cache).unwrap())
            .unwrap()
            .ok());
    }
}

/// Line validity (`--validity line`): a line is cached whole or not at all, so a damaged
/// dirty sector cannot simply leave its line partly valid. Stopped cleanly with a flipped
/// dirty sector, the cache still opens; the damaged sector is lost (reads of it fail), the
/// line's other dirty sectors read back and are written back. After `check --repair` (which
/// drops the damaged sector and lists its range lost, as with sector validity) the line's
/// record is partly valid: the open makes it whole from the backing device instead of
/// refusing it (before: "line validity needs whole-line masks; run check --repair", again).
#[test]
fn line_validity_keeps_the_undamaged_dirty_sectors_of_a_damaged_line() {
    for repair in [false, true] {
        let f = files_with(LINES, 4096, true);
        let cache = FileDev::open(&f.cache).unwrap();
        let opts = tiercache_server::FormatOptions {
            line_size: 4096,
            mode: Mode::WriteBack,
            data_checksums: true,
            validity: tiercache_engine::Validity::Line,
            ..Default::default()
        };
        tiercache_server::format(&cache, VOL, &opts).unwrap();
        drop(cache);
        let (vol, _) = open(&f, None);
        vol.write(2 * 4096, &[0xa1; 4096], false).unwrap();
        vol.write(6 * 4096, &[0xb2; 4096], false).unwrap();
        vol.flush().unwrap();
        let slot = slot_of(&vol, 2);
        vol.shutdown().unwrap();
        drop(vol);
        flip(&f, slot, 1000);
        if repair {
            let dev = FileDev::open_exclusive(&f.cache).unwrap();
            let (rep, after) = repair_device(&dev).unwrap();
            assert!(rep.changed && after.ok(), "{rep:?} {:?}", after.problems);
            let lost: Vec<(u64, u64)> = rep.lost_ranges.iter().map(|l| (l.start, l.end)).collect();
            assert_eq!(lost, vec![(8704, 9216)], "{rep:?}");
        }
        let opened = CacheVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(FileDev::open(&f.backing).unwrap()),
            &tiercache_server::OpenOptions::default(),
        );
        let (vol, _) = opened.unwrap_or_else(|e| panic!("repair {repair}: the open failed: {e}"));
        let mut s = vec![0u8; 512];
        for at in [0u64, 1024, 3584] {
            vol.read(2 * 4096 + at, &mut s)
                .unwrap_or_else(|e| panic!("repair {repair}: sector at {at}: {e}"));
            assert_eq!(s, vec![0xa1; 512], "repair {repair}: sector at {at}");
        }
        if repair {
            // Dropped by the repair (and reported): the backing device's bytes.
            vol.read(2 * 4096 + 512, &mut s).unwrap();
            assert_eq!(s, initial_bytes(2 * 4096 + 512, 512));
        } else {
            assert!(
                vol.read(2 * 4096 + 512, &mut s).is_err(),
                "the damaged sector is lost"
            );
        }
        let mut b = vec![0u8; 4096];
        vol.read(6 * 4096, &mut b).unwrap();
        assert_eq!(b, vec![0xb2; 4096]);
        vol.flush_dirty().unwrap();
        let mut want = vec![0xa1; 4096];
        want[512..1024].copy_from_slice(&initial_bytes(2 * 4096 + 512, 512));
        assert_eq!(
            backing_bytes(&f, 2 * 4096, 4096),
            want,
            "repair {repair}: the undamaged dirty sectors were written back, never the damaged one"
        );
        vol.shutdown().unwrap();
    }
}
