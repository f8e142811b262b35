//! A cache attached to the wrong backing device, or to one written behind its back (issue 14,
//! item 2), in both layouts: the backing identity the superblock records is compared at
//! every open, and a sample of clean cached lines is compared with the backing device.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::log_volume::LogOpenReport;
use tiercache_server::{
    BlockDev, CacheVolume, FileDev, LogFormatOptions, LogOpenOptions, LogVolume, OpenOptions,
    OpenReport,
};

const LS: u64 = 4096;

/// Opens the cache of `f` in front of `backing` (not necessarily `f.backing`).
fn open_on(
    f: &Files,
    backing: &Path,
    opts: &OpenOptions,
) -> Result<(CacheVolume, OpenReport), String> {
    CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(backing).unwrap()),
        opts,
    )
    .map_err(|e| e.to_string())
}

fn line(v: u8) -> Vec<u8> {
    vec![v; LS as usize]
}

/// A second backing file of the same size with other contents.
fn other_disk(f: &Files, name: &str) -> PathBuf {
    let p = f.dir.path().join(name);
    std::fs::write(&p, vec![0x5a; VOL as usize]).unwrap();
    p
}

/// A write-back cache in front of `f.backing` holding `clean` clean lines (0..clean) and
/// `dirty` dirty ones after them, shut down cleanly.
fn cache_with(f: &Files, clean: u64, dirty: u64) {
    format(f, Mode::WriteBack, LS);
    let (v, _) = open(f, None);
    for i in 0..clean {
        v.write(i * LS, &line(0x10 + i as u8), false).unwrap();
    }
    v.flush_dirty().unwrap();
    for i in clean..clean + dirty {
        v.write(i * LS, &line(0x80 + i as u8), false).unwrap();
    }
    v.shutdown().unwrap();
}

#[test]
fn wrong_backing_of_the_same_size_is_refused() {
    let f = files(64, LS);
    cache_with(&f, 0, 2);
    let b = other_disk(&f, "b.img");
    let e = open_on(&f, &b, &OpenOptions::default())
        .err()
        .expect("a cache of A.img opened in front of B.img");
    assert!(
        e.contains("backing.img") && e.contains("b.img"),
        "the error names both devices: {e}"
    );
    assert!(
        e.contains("--accept-backing-rename") && e.contains("format --force"),
        "the error names the ways out: {e}"
    );
    // B was not written, and the right device still gets its dirty data.
    assert!(std::fs::read(&b).unwrap().iter().all(|&x| x == 0x5a));
    let (v, rep) = open(&f, None);
    assert_eq!(rep.restored_dirty, 2);
    let mut got = line(0);
    v.read(LS, &mut got).unwrap();
    assert_eq!(got, line(0x81));
}

#[test]
fn backing_written_behind_a_clean_cache_is_detected() {
    let f = files(64, LS);
    cache_with(&f, 32, 0);
    // One cached block of the backing device is written without the cache.
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(5 * LS) as usize..(6 * LS) as usize].fill(0xee);
    std::fs::write(&f.backing, &d).unwrap();
    let (v, rep) = open(&f, None);
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert_eq!(
        got,
        line(0xee),
        "the stale cached copy was served ({rep:?})"
    );
    for i in 0..64 {
        v.read(i * LS, &mut got).unwrap();
        assert_eq!(
            got,
            d[(i * LS) as usize..((i + 1) * LS) as usize],
            "line {i}"
        );
    }
}

#[test]
fn backing_written_behind_a_cache_with_dirty_lines_is_refused() {
    let f = files(64, LS);
    cache_with(&f, 32, 2);
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(5 * LS) as usize..(6 * LS) as usize].fill(0xee);
    std::fs::write(&f.backing, &d).unwrap();
    let e = open_on(&f, &f.backing, &OpenOptions::default())
        .err()
        .expect("dirty lines over a backing device changed behind the cache");
    assert!(
        e.contains("--accept-backing-changes") && e.contains("format --force"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&f.backing).unwrap(),
        d,
        "nothing written back"
    );
}

#[test]
fn renamed_backing_is_accepted_with_the_flag_and_recorded() {
    let f = files(64, LS);
    cache_with(&f, 4, 2);
    let moved = f.dir.path().join("moved.img");
    std::fs::rename(&f.backing, &moved).unwrap();
    let e = open_on(&f, &moved, &OpenOptions::default())
        .err()
        .expect("a renamed backing file is another path until the user says so");
    assert!(
        e.contains("moved.img") && e.contains("--accept-backing-rename"),
        "{e}"
    );
    let flag = OpenOptions {
        accept_backing_rename: true,
        ..Default::default()
    };
    let (v, rep) = open_on(&f, &moved, &flag).unwrap();
    assert!(
        rep.backing_note.as_deref().unwrap().contains("moved.img"),
        "{rep:?}"
    );
    assert_eq!((rep.restored, rep.restored_dirty), (6, 2));
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x85));
    v.shutdown().unwrap();
    drop(v);
    // The new name is recorded: no flag needed now, and the old name is the stranger.
    let (v, rep) = open_on(&f, &moved, &OpenOptions::default()).unwrap();
    assert_eq!(rep.backing_note, None);
    v.shutdown().unwrap();
    drop(v);
    std::fs::copy(&moved, &f.backing).unwrap();
    assert!(open_on(&f, &f.backing, &OpenOptions::default()).is_err());
}

#[test]
fn backing_changes_accepted_with_the_flag_keep_dirty_lines_only() {
    let f = files(64, LS);
    cache_with(&f, 32, 2);
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(5 * LS) as usize..(6 * LS) as usize].fill(0xee);
    std::fs::write(&f.backing, &d).unwrap();
    let flag = OpenOptions {
        accept_backing_changes: true,
        ..Default::default()
    };
    let (v, rep) = open_on(&f, &f.backing, &flag).unwrap();
    assert_eq!(
        (
            rep.sampled_clean_lines,
            rep.differing_clean_lines,
            rep.dropped_clean_lines
        ),
        (32, 1, 32),
        "{rep:?}"
    );
    assert_eq!(rep.restored, 2);
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert_eq!(got, line(0xee));
    v.read(33 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x80 + 33), "the dirty line is kept");
    v.shutdown().unwrap();
    drop(v);
    // The next open finds the dirty lines and the line read since (now equal to the backing
    // device), and nothing differs.
    let (_, rep) = open(&f, None);
    assert_eq!(
        (rep.restored, rep.restored_dirty, rep.differing_clean_lines),
        (3, 2, 0),
        "{rep:?}"
    );
}

#[test]
fn version_1_superblock_opens_and_gets_the_identity() {
    use tiercache_server::BackingIdentity;
    let f = files(64, LS);
    cache_with(&f, 4, 2);
    // Rewrite the superblock as version 1 wrote it: the path as given, no identity.
    let c = FileDev::open(&f.cache).unwrap();
    let mut sb = tiercache_server::read_superblock(&c).unwrap();
    sb.version = 1;
    sb.backing = BackingIdentity::unknown("disk.img");
    let b = sb.encode();
    assert!(
        b[128 + 256..508].iter().all(|&x| x == 0),
        "version-1 layout"
    );
    c.write_at(&b, 0).unwrap();
    c.sync().unwrap();
    let (v, rep) = open(&f, None);
    let note = rep.backing_note.clone().unwrap();
    assert!(
        note.contains("no backing identity") && note.contains("disk.img"),
        "{note}"
    );
    assert_eq!((rep.restored, rep.restored_dirty), (6, 2));
    let now = tiercache_server::read_superblock(&c).unwrap();
    assert_eq!(now.version, tiercache_server::format::VERSION);
    assert_eq!(
        now.backing.name,
        std::fs::canonicalize(&f.backing).unwrap().to_str().unwrap()
    );
    v.shutdown().unwrap();
    drop(v);
    // From now on it is checked.
    let b2 = other_disk(&f, "b.img");
    assert!(open_on(&f, &b2, &OpenOptions::default()).is_err());
}

#[test]
fn unclean_start_drops_only_the_differing_clean_lines() {
    let f = files(64, LS);
    format(&f, Mode::WriteThrough, LS);
    let (v, _) = open(&f, None);
    for i in 0..32 {
        v.write(i * LS, &line(0x10 + i as u8), false).unwrap();
    }
    v.flush().unwrap();
    drop(v); // no shutdown: an unclean stop
             // As if the last write of line 7 reached the backing device and not the cache.
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(7 * LS) as usize..(8 * LS) as usize].fill(0x77);
    std::fs::write(&f.backing, &d).unwrap();
    let (v, rep) = open(&f, None);
    assert!(!rep.was_clean);
    assert_eq!(
        (
            rep.differing_clean_lines,
            rep.dropped_clean_lines,
            rep.restored
        ),
        (1, 1, 31),
        "{rep:?}"
    );
    let mut got = line(0);
    v.read(7 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x77));
    v.read(8 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x18));
}

// The log layout.

/// Opens the log cache of `f` in front of `backing`.
fn log_open_on(f: &Files, backing: &Path) -> Result<LogVolume, String> {
    log_open_opts(f, backing, &LogOpenOptions::default()).map(|(v, _)| v)
}

fn log_open_opts(
    f: &Files,
    backing: &Path,
    o: &LogOpenOptions,
) -> Result<(LogVolume, LogOpenReport), String> {
    LogVolume::open_opts(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(backing).unwrap()),
        o,
    )
    .map_err(|e| e.to_string())
}

/// A write-back log cache (segments of four lines) in front of `f.backing` holding `clean`
/// clean lines (0..clean) and `dirty` dirty ones after them, shut down cleanly.
fn log_cache_with(f: &Files, clean: u64, dirty: u64) {
    let o = LogFormatOptions {
        segment_size: 4 * LS,
        mode: Mode::WriteBack,
        journal_records: Some(400),
        ..Default::default()
    };
    tiercache_server::format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
    let v = log_open_on(f, &f.backing).unwrap();
    // Reads admit lines clean; writes (write-back) are dirty.
    let mut buf = line(0);
    for i in 0..clean {
        v.read(i * LS, &mut buf).unwrap();
    }
    for i in clean..clean + dirty {
        v.write(i * LS, &line(0x80 + i as u8), false).unwrap();
    }
    v.shutdown().unwrap();
}

#[test]
fn log_wrong_backing_of_the_same_size_is_refused() {
    let f = files(512, LS);
    log_cache_with(&f, 8, 0);
    let b = other_disk(&f, "b.img");
    let e = log_open_on(&f, &b)
        .err()
        .expect("a log cache of A.img opened in front of B.img");
    assert!(e.contains("backing.img") && e.contains("b.img"), "{e}");
}

#[test]
fn log_backing_written_behind_a_clean_cache_is_detected() {
    let f = files(512, LS);
    log_cache_with(&f, 16, 0);
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(5 * LS) as usize..(6 * LS) as usize].fill(0xee);
    std::fs::write(&f.backing, &d).unwrap();
    let v = log_open_on(&f, &f.backing).unwrap();
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert!(got == line(0xee), "the stale cached copy was served");
    let mut all = vec![0u8; VOL as usize];
    v.read(0, &mut all).unwrap();
    assert!(all == d, "the volume reads the backing device's bytes");
}

#[test]
fn log_backing_written_behind_a_cache_with_dirty_lines_is_refused() {
    let f = files(512, LS);
    log_cache_with(&f, 16, 2);
    let mut d = std::fs::read(&f.backing).unwrap();
    d[(5 * LS) as usize..(6 * LS) as usize].fill(0xee);
    std::fs::write(&f.backing, &d).unwrap();
    let e = log_open_on(&f, &f.backing)
        .err()
        .expect("dirty lines over a changed disk");
    assert!(e.contains("--accept-backing-changes"), "{e}");
    // Refused twice alike: the first refusal did not make the next start lenient.
    let e = log_open_on(&f, &f.backing).err().expect("refused again");
    assert!(e.contains("--accept-backing-changes"), "{e}");
    let flag = LogOpenOptions {
        accept_backing_changes: true,
        ..Default::default()
    };
    let (v, rep) = log_open_opts(&f, &f.backing, &flag).unwrap();
    assert_eq!(
        (
            rep.sampled_clean_lines,
            rep.differing_clean_lines,
            rep.dropped_clean_lines
        ),
        (16, 1, 16),
        "{rep:?}"
    );
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert!(got == line(0xee));
    v.read(17 * LS, &mut got).unwrap();
    assert!(got == line(0x80 + 17), "the dirty line is kept");
}

#[test]
fn log_renamed_backing_is_accepted_with_the_flag_and_version_1_opens() {
    let f = files(512, LS);
    log_cache_with(&f, 4, 2);
    let moved = f.dir.path().join("moved.img");
    std::fs::rename(&f.backing, &moved).unwrap();
    let e = log_open_on(&f, &moved)
        .err()
        .expect("renamed: refused without the flag");
    assert!(
        e.contains("moved.img") && e.contains("--accept-backing-rename"),
        "{e}"
    );
    let flag = LogOpenOptions {
        accept_backing_rename: true,
        ..Default::default()
    };
    let (v, rep) = log_open_opts(&f, &moved, &flag).unwrap();
    assert!(
        rep.backing_note.is_some() && rep.dirty_lines == 2,
        "{rep:?}"
    );
    v.shutdown().unwrap();
    drop(v);
    // Rewrite the superblock as version 1 wrote it: no identity.
    let c = FileDev::open(&f.cache).unwrap();
    let mut b = vec![0u8; 4096];
    c.read_at(&mut b, 0).unwrap();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[112..508].fill(0);
    let crc = crc32c::crc32c(&b[..508]);
    b[508..512].copy_from_slice(&crc.to_le_bytes());
    c.write_at(&b, 0).unwrap();
    c.sync().unwrap();
    let (v, rep) = log_open_opts(&f, &moved, &LogOpenOptions::default()).unwrap();
    assert!(
        rep.backing_note
            .as_deref()
            .unwrap()
            .contains("no backing identity"),
        "{rep:?}"
    );
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert!(got == line(0x85));
    v.shutdown().unwrap();
    drop(v);
    let sb = tiercache_server::read_log_superblock(&c).unwrap().unwrap();
    assert!(
        sb.backing.name.ends_with("moved.img"),
        "recorded again: {sb:?}"
    );
    let b2 = other_disk(&f, "b.img");
    assert!(log_open_on(&f, &b2).is_err());
}

/// `losetup -f --show FILE`, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Option<Loop> {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && dev.starts_with("/dev/")).then_some(Loop(dev))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[test]
fn block_devices_are_known_by_their_stable_id() {
    let f = files(64, LS);
    let Some(l1) = Loop::attach(&f.backing) else {
        tiercache_testskip::skip!("no loop device (needs root and losetup)");
        return;
    };
    let id = FileDev::open(Path::new(&l1.0)).unwrap().identity().unwrap();
    assert_eq!(id.kind, tiercache_server::identity::IdKind::Block);
    assert!(id.stable_id.starts_with("loop:"), "{id:?}");
    format(&f, Mode::WriteBack, LS);
    let (v, _) = open_on(&f, Path::new(&l1.0), &OpenOptions::default()).unwrap();
    v.write(0, &line(0xb1), false).unwrap();
    v.shutdown().unwrap();
    drop(v);
    // The same file on a second loop device: another node name, the same disk.
    let l2 = Loop::attach(&f.backing).unwrap();
    let (v, rep) = open_on(&f, Path::new(&l2.0), &OpenOptions::default()).unwrap();
    assert!(
        rep.backing_note.as_deref().unwrap().contains("renamed"),
        "{rep:?}"
    );
    v.shutdown().unwrap();
    drop(v);
    // Another file of the same size on a loop device: another disk.
    let other = Loop::attach(&other_disk(&f, "b.img")).unwrap();
    let e = open_on(&f, Path::new(&other.0), &OpenOptions::default())
        .err()
        .expect("another disk");
    assert!(e.contains("b.img") && e.contains("backing.img"), "{e}");
}

/// The backing device of `f`, behind a fault injector that fails every read of line `bad`.
fn backing_failing_reads_of(f: &Files, bad: u64) -> Box<dyn BlockDev> {
    let faults = tiercache_server::fault::Faults::new(3);
    let (dev, h) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        false,
    );
    h.fail_reads(bad * LS..(bad + 1) * LS);
    Box::new(dev)
}

/// A backing read error on one sampled clean line at open (a bad sector, a transient error)
/// leaves that line out of the sample instead of refusing the whole cache — before, the
/// open failed ("reading the backing device to verify the cache: ..."), so dirty data
/// behind one unreadable sector of the disk could not be reached at all.
#[test]
fn a_backing_read_error_in_the_open_sample_skips_the_line() {
    let f = files(64, LS);
    cache_with(&f, 32, 2);
    let (v, rep) = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        backing_failing_reads_of(&f, 5),
        &OpenOptions::default(),
    )
    .unwrap_or_else(|e| panic!("one unreadable backing line refused the cache: {e}"));
    assert_eq!(
        (
            rep.sampled_clean_lines,
            rep.unreadable_clean_lines,
            rep.differing_clean_lines,
            rep.dropped_clean_lines
        ),
        (31, 1, 0, 0),
        "{rep:?}"
    );
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x15), "the cached clean copy is served");
    v.read(33 * LS, &mut got).unwrap();
    assert_eq!(got, line(0x80 + 33), "the dirty line is kept");
}

/// The log layout's half of the test above.
#[test]
fn log_a_backing_read_error_in_the_open_sample_skips_the_line() {
    let f = files(512, LS);
    log_cache_with(&f, 16, 2);
    let expect = std::fs::read(&f.backing).unwrap();
    let (v, rep) = LogVolume::open_opts(
        Box::new(FileDev::open(&f.cache).unwrap()),
        backing_failing_reads_of(&f, 5),
        &LogOpenOptions::default(),
    )
    .unwrap_or_else(|e| panic!("one unreadable backing line refused the log cache: {e}"));
    assert_eq!(
        (
            rep.sampled_clean_lines,
            rep.unreadable_clean_lines,
            rep.differing_clean_lines,
            rep.dropped_clean_lines
        ),
        (15, 1, 0, 0),
        "{rep:?}"
    );
    let mut got = line(0);
    v.read(5 * LS, &mut got).unwrap();
    assert!(
        got[..] == expect[(5 * LS) as usize..(6 * LS) as usize],
        "the cached clean copy is served"
    );
    v.read(17 * LS, &mut got).unwrap();
    assert!(got == line(0x80 + 17), "the dirty line is kept");
}
