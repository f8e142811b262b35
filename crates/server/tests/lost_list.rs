//! The durable lost-range list (`tiercache_server::lost_list`) on real files, both layouts:
//! a damaged list refuses the open naming it and what to do; a cache formatted before the
//! list gets an empty one at its first open (the upgrade) and keeps lost ranges across a
//! restart from then on; an old cache without room for it still opens (warned).

mod common;

use common::*;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::Faults;
use tiercache_server::log_format::LogSuperblock;
use tiercache_server::lost_list::{self, LostList};
use tiercache_server::{
    format_log, read_log_superblock, read_superblock, BlockDev, CacheVolume, FileDev,
    FormatOptions, LogFormatOptions, LogVolume, OpenOptions, Superblock,
};

fn dev(p: &std::path::Path) -> FileDev {
    FileDev::open(p).unwrap()
}

fn direct_open(f: &Files) -> Result<CacheVolume, String> {
    CacheVolume::open(
        Box::new(dev(&f.cache)),
        Box::new(dev(&f.backing)),
        &OpenOptions::default(),
    )
    .map(|(v, _)| v)
    .map_err(|e| e.to_string())
}

fn log_files() -> Files {
    let f = log_cache_files(4, 1 << 20);
    let o = LogFormatOptions {
        segment_size: 1 << 20,
        mode: Mode::WriteBack,
        ..Default::default()
    };
    format_log(&dev(&f.cache), VOL, &o).unwrap();
    f
}

fn log_open(f: &Files) -> Result<LogVolume, String> {
    LogVolume::open(Box::new(dev(&f.cache)), Box::new(dev(&f.backing)))
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}

/// Flips one byte in each copy of the list at `at`.
fn damage_both_copies(f: &Files, at: u64) {
    let d = dev(&f.cache);
    for copy in [0, lost_list::COPY] {
        let mut b = [0u8; 1];
        d.read_at(&mut b, at + copy + 100).unwrap();
        d.write_at(&[b[0] ^ 0x40], at + copy + 100).unwrap();
    }
    d.sync().unwrap();
}

#[test]
fn direct_damaged_lost_list_refuses_the_open_naming_it() {
    let f = files(32, 4096);
    format(&f, Mode::WriteBack, 4096);
    let sb = read_superblock(&dev(&f.cache)).unwrap();
    assert!(sb.lost_list, "a new cache has the list");
    let at = sb.lost_list_offset().unwrap();
    LostList::load(&dev(&f.cache), at).unwrap();
    damage_both_copies(&f, at);
    let e = direct_open(&f).map(|_| ()).unwrap_err();
    for want in ["lost-range list", "damaged", "crc32c", "format --force"] {
        assert!(e.contains(want), "{want:?} not in: {e}");
    }
    // `check` names it as a problem.
    let rep = tiercache_server::check::check_device(&dev(&f.cache)).unwrap();
    assert!(!rep.ok(), "{rep:?}");
    assert!(
        rep.problems.iter().any(|p| p.contains("lost-range list")),
        "{:?}",
        rep.problems
    );
}

#[test]
fn log_damaged_lost_list_refuses_the_open_naming_it() {
    let f = log_files();
    let sb = read_log_superblock(&dev(&f.cache)).unwrap().unwrap();
    assert!(sb.lost_list, "a new log cache has the list");
    let at = sb.geometry().lost_list.unwrap();
    damage_both_copies(&f, at);
    let e = log_open(&f).map(|_| ()).unwrap_err();
    for want in ["lost-range list", "damaged", "log layout", "format --force"] {
        assert!(e.contains(want), "{want:?} not in: {e}");
    }
    // `check` names it as a problem, as for the direct layout (it used to refuse the check).
    let rep = tiercache_server::log_check::check_log_device(Box::new(dev(&f.cache)))
        .unwrap_or_else(|e| panic!("the check refused: {e}"));
    assert!(!rep.ok(), "{rep:?}");
    let p = rep.lost_list_problem.clone().unwrap_or_default();
    assert!(p.contains("lost-range list"), "{rep:?}");
}

/// Rewrites the direct superblock as a cache formatted before the list (flag clear) with
/// the list area holding garbage (never written, or a reused device).
fn make_old_direct(f: &Files, data_offset: Option<u64>) -> Superblock {
    let d = dev(&f.cache);
    let mut sb = read_superblock(&d).unwrap();
    if let Some(at) = sb.lost_list_offset() {
        d.write_at(&vec![0xa5; lost_list::BYTES as usize], at)
            .unwrap();
    }
    sb.lost_list = false;
    if let Some(o) = data_offset {
        sb.data_offset = o;
    }
    d.write_at(&sb.encode(), 0).unwrap();
    d.sync().unwrap();
    sb
}

#[test]
fn direct_old_cache_gets_an_empty_list_at_first_open_and_keeps_losses_from_then_on() {
    let f = files(32, 4096);
    format(&f, Mode::WriteAround, 4096);
    make_old_direct(&f, None);
    let faults = Faults::new(1);
    let (b, bh) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
    let (v, _) = CacheVolume::open(
        Box::new(dev(&f.cache)),
        Box::new(b),
        &OpenOptions::default(),
    )
    .unwrap();
    let sb = read_superblock(&dev(&f.cache)).unwrap();
    assert!(sb.lost_list, "the open set the flag");
    let l = LostList::load(&dev(&f.cache), sb.lost_list_offset().unwrap()).unwrap();
    assert!(l.ranges.is_empty(), "{:?}", l.ranges);
    // A write around the cache dropped by a failed backing sync: lost, and still after a
    // clean restart.
    v.write(0, &[7u8; 4096], false).unwrap();
    bh.fail_next_sync(true);
    assert!(v.flush().is_err());
    assert_eq!(v.lost_dirty_ranges(), vec![(0, 4096)]);
    v.shutdown().unwrap();
    drop(v);
    faults.process_exit();
    let v = direct_open(&f).unwrap();
    let mut buf = vec![0u8; 512];
    let e = v.read(0, &mut buf).unwrap_err().to_string();
    assert!(e.contains("0..4096"), "{e}");
    assert_eq!(v.stats().lost_ranges, 1);
    let rep = tiercache_server::check::check_device(&dev(&f.cache)).unwrap();
    assert_eq!(
        rep.lost_list,
        vec![tiercache_server::volume_set::NamedRange::Bytes(0, 4096)]
    );
    v.shutdown().unwrap();
    drop(v);
    // An older build ran the cache and wrote its superblock without the flag (in its own
    // version: builds since the version-4 superblock are refused, but one between the list
    // and it was not): the valid list found there is kept, not replaced by an empty one.
    let d = dev(&f.cache);
    let mut sb = read_superblock(&d).unwrap();
    assert!(sb.lost_pending, "a listed loss: version 4");
    sb.lost_list = false;
    sb.lost_pending = false;
    sb.version = sb.current_version();
    d.write_at(&sb.encode(), 0).unwrap();
    d.sync().unwrap();
    let v = direct_open(&f).unwrap();
    assert_eq!(
        v.lost_dirty_ranges(),
        vec![(0, 4096)],
        "kept at the upgrade"
    );
}

#[test]
fn direct_old_cache_without_room_for_the_list_still_opens() {
    // 32512 lines: the metadata ends 4 KiB before 1 MiB, where such a cache's data began.
    let lines = 32512;
    let f = files(1, 4096);
    let need = Superblock::data_offset_new(lines, 4096, false) + lines * 4096;
    std::fs::File::create(&f.cache)
        .unwrap()
        .set_len(need)
        .unwrap();
    let o = FormatOptions {
        line_size: 4096,
        mode: Mode::WriteBack,
        capacity_lines: Some(lines),
        ..Default::default()
    };
    tiercache_server::format(&dev(&f.cache), VOL, &o).unwrap();
    let old = Superblock::data_offset_for(lines, 4096);
    assert_eq!(old, 1 << 20);
    let sb = make_old_direct(&f, Some(old));
    assert_eq!(sb.lost_list_offset(), None, "no room");
    let v = direct_open(&f).unwrap();
    v.write(0, &[1u8; 4096], false).unwrap();
    v.shutdown().unwrap();
    assert!(!read_superblock(&dev(&f.cache)).unwrap().lost_list);
}

#[test]
fn log_old_cache_gets_an_empty_list_at_first_open() {
    let f = log_files();
    let d = dev(&f.cache);
    let mut sb = read_log_superblock(&d).unwrap().unwrap();
    let at = sb.geometry().lost_list.unwrap();
    let seg_area = sb.geometry().seg_area;
    sb.lost_list = false;
    assert_eq!(
        sb.geometry().seg_area,
        seg_area,
        "this layout had the room before the list existed"
    );
    d.write_at(&vec![0xa5; lost_list::BYTES as usize], at)
        .unwrap();
    d.write_at(&sb.encode(), 0).unwrap();
    d.sync().unwrap();
    let v = log_open(&f).unwrap();
    let sb: LogSuperblock = read_log_superblock(&d).unwrap().unwrap();
    assert!(sb.lost_list, "the open set the flag");
    assert!(LostList::load(&d, at).unwrap().ranges.is_empty());
    v.write(0, &[3u8; 4096], false).unwrap();
    v.flush().unwrap();
    v.shutdown().unwrap();
    drop(v);
    let v = log_open(&f).unwrap();
    let mut buf = vec![0u8; 4096];
    v.read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![3u8; 4096]);
}

/// What a read of volume bytes 0..4096 may return after the crash: an error (the range is
/// listed lost) or one of `fills` (whole-block values); `initial`: the backing file's bytes.
fn read_allowed(v: &dyn Export, fills: &[u8], initial_ok: bool) -> Result<(), String> {
    let mut b = vec![0u8; 4096];
    match v.read(0, &mut b) {
        Err(_) => Ok(()),
        Ok(()) if fills.iter().any(|&x| b.iter().all(|&y| y == x)) => Ok(()),
        Ok(()) if initial_ok && b.iter().enumerate().all(|(i, &y)| y == initial(i as u64)) => {
            Ok(())
        }
        Ok(()) => Err(format!(
            "read {:?}.., want an error or a block of {fills:?}{}",
            &b[..8],
            if initial_ok {
                " or the initial bytes"
            } else {
                ""
            }
        )),
    }
}

/// Power cut at every write of the lost-range list (torn sector by sector) in a run that
/// adds an entry (write-around data dropped by a failed backing sync) and clears it (the
/// range rewritten and flushed): the cache always opens again, and the range reads an
/// error or a version the client may see — after the clearing write began, never the
/// backing device's older bytes.
#[test]
fn direct_power_cut_at_every_lost_list_write() {
    let f = files(32, 4096);
    format(&f, Mode::WriteAround, 4096);
    let sb = read_superblock(&dev(&f.cache)).unwrap();
    let at = sb.lost_list_offset().unwrap();
    let run = |crash: Option<u64>| -> u64 {
        let faults = Faults::new(7);
        // Without a crash: counts the list's writes (`matched_writes`).
        let n = crash.unwrap_or(u64::MAX);
        faults.crash_at_write_to(n, "cache", at..at + lost_list::BYTES);
        let (c, _) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
        let (b, bh) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
        let (v, _) = CacheVolume::open(Box::new(c), Box::new(b), &OpenOptions::default()).unwrap();
        let _ = v.write(0, &[1u8; 4096], false);
        bh.fail_next_sync(true);
        let _ = v.flush();
        let _ = v.write(0, &[2u8; 4096], false);
        let _ = v.flush();
        let n = faults.matched_writes();
        drop(v);
        faults.power_cut();
        n
    };
    let writes = run(None);
    assert_eq!(writes, 2, "one write adds the entry, one clears it");
    // The run without a crash left the cache clean of losses: format again per point.
    for n in 1..=writes {
        format(&f, Mode::WriteAround, 4096);
        std::fs::write(&f.backing, (0..VOL).map(initial).collect::<Vec<u8>>()).unwrap();
        run(Some(n));
        let v = direct_open(&f).unwrap_or_else(|e| panic!("crash at list write {n}: {e}"));
        // At the first write the loss was never reported (the FLUSH did not return):
        // version 1, or the initial bytes it may have dropped, or the error. At the second:
        // listed (error) or the flushed rewrite.
        let r = if n == 1 {
            read_allowed(&v, &[1], true)
        } else {
            read_allowed(&v, &[2], false)
        };
        r.unwrap_or_else(|e| panic!("crash at list write {n}: {e}"));
    }
}

/// The same for the log layout: the entry added when a dirty line cannot be read from the
/// cache, cleared by its flushed rewrite.
#[test]
fn log_power_cut_at_every_lost_list_write() {
    let f = log_files();
    let at = read_log_superblock(&dev(&f.cache))
        .unwrap()
        .unwrap()
        .geometry()
        .lost_list
        .unwrap();
    let o = LogFormatOptions {
        segment_size: 1 << 20,
        mode: Mode::WriteBack,
        ..Default::default()
    };
    let run = |crash: Option<u64>| -> u64 {
        let faults = Faults::new(7);
        // Without a crash: counts the list's writes (`matched_writes`).
        let n = crash.unwrap_or(u64::MAX);
        faults.crash_at_write_to(n, "cache", at..at + lost_list::BYTES);
        let (c, ch) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
        let (b, _) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
        let (v, _) = LogVolume::open(Box::new(c), Box::new(b)).unwrap();
        v.set_max_cache_errors(1_000_000);
        // Enough lines to seal the first segment, so line 0 is read from the device.
        for l in 0..300u64 {
            let _ = v.write(l * 4096, &[1u8; 4096], false);
        }
        let _ = v.flush();
        ch.fail_reads(at + lost_list::BYTES..u64::MAX);
        let mut b = vec![0u8; 4096];
        let _ = v.read(0, &mut b);
        ch.heal();
        let _ = v.write(0, &[2u8; 4096], false);
        let _ = v.flush();
        let n = faults.matched_writes();
        drop(v);
        faults.power_cut();
        n
    };
    let writes = run(None);
    assert_eq!(writes, 2, "one write adds the entry, one clears it");
    for n in 1..=writes {
        format_log(&dev(&f.cache), VOL, &o).unwrap();
        run(Some(n));
        let v = log_open(&f).unwrap_or_else(|e| panic!("crash at list write {n}: {e}"));
        let r = if n == 1 {
            read_allowed(&v, &[1], false)
        } else {
            read_allowed(&v, &[2], false)
        };
        r.unwrap_or_else(|e| panic!("crash at list write {n}: {e}"));
    }
}

/// The list cannot be written when a loss is found (its area refuses writes): the cache is
/// failed, the state file records the lost range, and the next start is refused naming it.
#[test]
fn direct_unwritable_list_fails_the_cache_and_the_state_file_records_the_range() {
    let f = files(32, 4096);
    format(&f, Mode::WriteAround, 4096);
    let at = read_superblock(&dev(&f.cache))
        .unwrap()
        .lost_list_offset()
        .unwrap();
    let state = tiercache_server::state_file::beside(&f.cache);
    let opts = OpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let faults = Faults::new(3);
    let (c, ch) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
    let (b, bh) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
    let (v, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    ch.fail_writes(at..at + lost_list::BYTES);
    v.write(0, &[1u8; 4096], false).unwrap();
    bh.fail_next_sync(true);
    assert!(v.flush().is_err());
    assert!(
        v.cache_failed(),
        "the list could not be written: cache failed"
    );
    let st = tiercache_server::state_file::read(&state).unwrap().unwrap();
    assert_eq!(st.lost, vec![(0, 4096)], "{}", st.describe());
    drop(v);
    faults.process_exit();
    let e = CacheVolume::open(Box::new(dev(&f.cache)), Box::new(dev(&f.backing)), &opts)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("0, 4096") || e.contains("0..4096"), "{e}");
}

/// The same for the log layout, the loss being a dirty line the cache cannot read back:
/// the list's area refuses writes, so the cache is failed, the state file records the
/// range, and the next start is refused naming it.
#[test]
fn log_unwritable_list_fails_the_cache_and_the_state_file_records_the_range() {
    let f = log_files();
    let at = read_log_superblock(&dev(&f.cache))
        .unwrap()
        .unwrap()
        .geometry()
        .lost_list
        .unwrap();
    let state = tiercache_server::state_file::beside(&f.cache);
    let opts = tiercache_server::LogOpenOptions {
        state_path: Some(state.clone()),
        ..Default::default()
    };
    let faults = Faults::new(3);
    let (c, ch) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
    let (b, _) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
    let (v, _) = LogVolume::open_opts(Box::new(c), Box::new(b), &opts).unwrap();
    v.set_max_cache_errors(1_000_000);
    // Enough lines to seal the first segment, so line 0 is read from the device; line 0
    // alone is made unreadable (found by its contents), so only it is lost when the failed
    // cache copies its dirty lines to the backing device.
    v.write(0, &[0x5a; 4096], false).unwrap();
    for l in 1..300u64 {
        v.write(l * 4096, &[1u8; 4096], false).unwrap();
    }
    v.flush().unwrap();
    let img = std::fs::read(&f.cache).unwrap();
    let line0 = (0..img.len() / 4096)
        .map(|i| i * 4096)
        .find(|&o| img[o..o + 4096].iter().all(|&x| x == 0x5a))
        .expect("line 0 on the cache device") as u64;
    ch.fail_reads(line0..line0 + 4096);
    ch.fail_writes(at..at + lost_list::BYTES);
    let mut buf = vec![0u8; 4096];
    assert!(v.read(0, &mut buf).is_err(), "line 0 is unreadable: lost");
    assert!(
        v.cache_failed(),
        "the list could not be written: cache failed"
    );
    let st = tiercache_server::state_file::read(&state).unwrap().unwrap();
    assert_eq!(st.lost, vec![(0, 4096)], "{}", st.describe());
    // The other dirty lines were copied to the backing device.
    v.read(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![1u8; 4096]);
    drop(v);
    faults.process_exit();
    // The next start (as `serve` opens: the superblock was erased, so by the state file).
    let o = tiercache_server::live::VolumeOpenOptions {
        direct: OpenOptions {
            state_path: Some(state.clone()),
            ..Default::default()
        },
        log: opts,
    };
    let e =
        tiercache_server::live::open_volume(Box::new(dev(&f.cache)), Box::new(dev(&f.backing)), &o)
            .map(|_| ())
            .unwrap_err()
            .to_string();
    assert!(e.contains("failed earlier"), "{e}");
    assert!(e.contains("0, 4096") || e.contains("0..4096"), "{e}");
}

/// The superblock's version as written on the device (bytes 8..12, both layouts).
fn raw_version(p: &std::path::Path) -> u32 {
    let b = std::fs::read(p).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
}

/// Downgrade: builds before the version-4 superblock ignore the list and would serve the
/// backing device's older bytes in a lost range. While the list holds ranges the superblock
/// is version 4, which they refuse (they read 1 to 3); once a flushed rewrite empties the
/// list it is version 2 again. Before: version 2 throughout.
#[test]
fn direct_lost_ranges_make_older_builds_refuse_the_cache_until_cleared() {
    use tiercache_server::format::{VERSION, VERSION_LOST, VERSION_SUMS};
    let f = files(32, 4096);
    format(&f, Mode::WriteAround, 4096);
    assert_eq!(raw_version(&f.cache), VERSION);
    let faults = Faults::new(1);
    let (b, bh) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
    let (v, _) = CacheVolume::open(
        Box::new(dev(&f.cache)),
        Box::new(b),
        &OpenOptions::default(),
    )
    .unwrap();
    v.write(0, &[7u8; 4096], false).unwrap();
    bh.fail_next_sync(true);
    assert!(v.flush().is_err());
    assert_eq!(v.lost_dirty_ranges(), vec![(0, 4096)]);
    assert_eq!(
        raw_version(&f.cache),
        VERSION_LOST,
        "a lost range listed: builds reading versions 1..={VERSION_SUMS} must refuse the cache"
    );
    v.shutdown().unwrap();
    drop(v);
    faults.process_exit();
    assert_eq!(
        raw_version(&f.cache),
        VERSION_LOST,
        "kept by a clean shutdown"
    );
    let v = direct_open(&f).unwrap();
    assert_eq!(raw_version(&f.cache), VERSION_LOST, "kept by the open");
    v.write(0, &[8u8; 4096], false).unwrap();
    v.flush().unwrap();
    assert!(v.lost_dirty_ranges().is_empty());
    assert_eq!(
        raw_version(&f.cache),
        VERSION,
        "the list is empty: older builds may open the cache again"
    );
    v.shutdown().unwrap();
}

/// The same for the log layout (its superblock goes from version 3 to 4 and back).
#[test]
fn log_lost_ranges_make_older_builds_refuse_the_cache_until_cleared() {
    use tiercache_server::log_format::{SB_VERSION, SB_VERSION_LOST};
    let f = log_files();
    assert_eq!(raw_version(&f.cache), SB_VERSION);
    let faults = Faults::new(3);
    let (c, ch) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
    let (b, _) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
    let (v, _) = LogVolume::open(Box::new(c), Box::new(b)).unwrap();
    v.set_max_cache_errors(1_000_000);
    let at = read_log_superblock(&dev(&f.cache))
        .unwrap()
        .unwrap()
        .geometry()
        .lost_list
        .unwrap();
    for l in 0..300u64 {
        v.write(l * 4096, &[1u8; 4096], false).unwrap();
    }
    v.flush().unwrap();
    ch.fail_reads(at + lost_list::BYTES..u64::MAX);
    let mut buf = vec![0u8; 4096];
    assert!(
        v.read(0, &mut buf).is_err(),
        "dirty line 0 unreadable: lost"
    );
    ch.heal();
    assert_eq!(
        raw_version(&f.cache),
        SB_VERSION_LOST,
        "a lost range listed"
    );
    v.write(0, &[2u8; 4096], false).unwrap();
    v.flush().unwrap();
    assert_eq!(
        raw_version(&f.cache),
        SB_VERSION,
        "the list is empty: older builds may open the cache again"
    );
    v.shutdown().unwrap();
}

/// A power cut at every superblock write of a loss and its clearing: the volume that opens
/// still fails the lost range (or returns the flushed rewrite), and its superblock says
/// version 4 exactly when its list holds ranges.
#[test]
fn direct_power_cut_at_every_superblock_write_of_a_loss() {
    use tiercache_server::format::{VERSION, VERSION_LOST};
    let f = files(32, 4096);
    let run = |crash: Option<u64>| -> u64 {
        let faults = Faults::new(11);
        faults.crash_at_write_to(u64::MAX, "cache", 0..4096);
        let (c, _) = faults.wrap("cache", Box::new(dev(&f.cache)), true);
        let (b, bh) = faults.wrap("backing", Box::new(dev(&f.backing)), true);
        let (v, _) = CacheVolume::open(Box::new(c), Box::new(b), &OpenOptions::default()).unwrap();
        // Counted from after the open's own superblock write.
        let before = faults.matched_writes();
        if let Some(n) = crash {
            faults.crash_at_write_to(before + n, "cache", 0..4096);
        }
        let _ = v.write(0, &[1u8; 4096], false);
        bh.fail_next_sync(true);
        let _ = v.flush();
        let _ = v.write(0, &[2u8; 4096], false);
        let _ = v.flush();
        let n = faults.matched_writes() - before;
        drop(v);
        faults.power_cut();
        n
    };
    format(&f, Mode::WriteAround, 4096);
    // The superblock writes of the open, the loss and the clearing.
    let writes = run(None);
    assert!(
        writes >= 2,
        "the loss and its clearing rewrite the superblock: {writes}"
    );
    for n in 1..=writes {
        format(&f, Mode::WriteAround, 4096);
        std::fs::write(&f.backing, (0..VOL).map(initial).collect::<Vec<u8>>()).unwrap();
        run(Some(n));
        let v = direct_open(&f).unwrap_or_else(|e| panic!("crash at superblock write {n}: {e}"));
        read_allowed(&v, &[1, 2], true)
            .unwrap_or_else(|e| panic!("crash at superblock write {n}: {e}"));
        let want = if v.lost_dirty_ranges().is_empty() {
            VERSION
        } else {
            VERSION_LOST
        };
        assert_eq!(raw_version(&f.cache), want, "crash at superblock write {n}");
    }
}
