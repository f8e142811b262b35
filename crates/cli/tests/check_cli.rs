//! `tiercache check DEVICE`: exit 0 on a consistent device, 1 on inconsistencies (a corrupted
//! record, a key mapped twice, a key outside the backing device, a damaged superblock), 2 when
//! the file is not a tiercache device or cannot be read; `--json` carries the same verdict.
//! Damage after a clean stop (a flipped bit in a direct-layout record, in a log journal
//! record, or a torn-looking journal after a crash that later commits contradict): `check`
//! names it, `serve` refuses naming `tiercache check --repair`, the repair salvages every
//! record that still verifies, says what is lost, and a second repair changes nothing.

use std::path::Path;
use std::process::Command;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::format::Record;
use tiercache_server::{CacheVolume, FileDev, FormatOptions, OpenOptions};

const BIN: &str = env!("CARGO_BIN_EXE_tiercache");
const VOL: u64 = 1 << 20;

fn check(dev: &Path, json: bool) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.arg("check").arg(dev);
    if json {
        c.arg("--json");
    }
    let o = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap(), text)
}

/// A cache of 64 lines with dirty and clean lines, shut down cleanly.
fn device(dir: &Path) -> std::path::PathBuf {
    let cache = dir.join("cache.img");
    let backing = dir.join("backing.img");
    std::fs::write(&backing, vec![0u8; VOL as usize]).unwrap();
    let bytes = tiercache_server::Superblock::data_offset_for(64, 4096) + 64 * 4096;
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let opts = FormatOptions {
        mode: Mode::WriteBack,
        ..Default::default()
    };
    tiercache_server::format(&FileDev::open(&cache).unwrap(), VOL, &opts).unwrap();
    let (vol, _) = CacheVolume::open(
        Box::new(FileDev::open(&cache).unwrap()),
        Box::new(FileDev::open(&backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    vol.write(1000, &vec![7u8; 40_000], false).unwrap();
    let mut b = vec![0u8; 100_000];
    vol.read(200_000, &mut b).unwrap();
    vol.shutdown().unwrap();
    cache
}

fn patch(p: &Path, at: usize, bytes: &[u8]) {
    let mut d = std::fs::read(p).unwrap();
    d[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(p, d).unwrap();
}

fn record(p: &Path, slot: usize) -> Record {
    let d = std::fs::read(p).unwrap();
    Record::decode(&d[4096 + slot * 32..4096 + slot * 32 + 32]).unwrap()
}

fn put_record(p: &Path, slot: usize, r: Record) {
    let mut b = [0u8; 32];
    r.encode(&mut b);
    patch(p, 4096 + slot * 32, &b);
}

#[test]
fn good_device_passes() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device(dir.path());
    let (code, out) = check(&dev, false);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("consistent") && out.contains("clean shutdown"),
        "{out}"
    );
    let (code, out) = check(&dev, true);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["exit_code"], 0);
    assert!(v["lines"].as_u64().unwrap() > 30, "{v}");
    assert!(v["dirty_lines"].as_u64().unwrap() >= 9, "{v}");
    assert_eq!(v["mode"], "write-back");
}

#[test]
fn corrupted_record_and_bad_mappings_are_inconsistencies() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device(dir.path());
    let orig = std::fs::read(&dev).unwrap();
    // A flipped bit in slot 3's record.
    patch(&dev, 4096 + 3 * 32 + 5, &[orig[4096 + 3 * 32 + 5] ^ 0x10]);
    let (code, out) = check(&dev, false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("slot 3 (byte 4192): bad record checksum"),
        "{out}"
    );
    let (code, out) = check(&dev, true);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["ok"].clone(), v["problem_count"].clone()),
        (false.into(), 1.into())
    );

    // Slot 3's key copied into slot 60 with a valid checksum: mapped twice.
    std::fs::write(&dev, &orig).unwrap();
    let r = record(&dev, 3);
    put_record(
        &dev,
        60,
        Record {
            seq: r.seq + 1,
            ..r
        },
    );
    let (code, out) = check(&dev, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is mapped by slots 3 and 60"), "{out}");

    // A key past the end of the backing device, and masks that do not fit.
    std::fs::write(&dev, &orig).unwrap();
    put_record(&dev, 61, Record { key: 100_000, ..r });
    put_record(
        &dev,
        62,
        Record {
            key: 250,
            valid: 0x0f,
            dirty: 0xf0,
            seq: 1,
        },
    );
    let (code, out) = check(&dev, false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("slot 61") && out.contains("outside the backing device"),
        "{out}"
    );
    assert!(out.contains("slot 62") && out.contains("masks"), "{out}");

    // After an unclean stop, a torn record and a newer duplicate are expected: exit 0.
    std::fs::write(&dev, &orig).unwrap();
    let mut sb = tiercache_server::Superblock::decode(&orig[..4096]).unwrap();
    sb.clean = false;
    patch(&dev, 0, &sb.encode());
    patch(&dev, 4096 + 3 * 32 + 5, &[orig[4096 + 3 * 32 + 5] ^ 0x10]);
    let r5 = record(&dev, 5);
    put_record(
        &dev,
        63,
        Record {
            seq: r5.seq + 1,
            ..r5
        },
    );
    let (code, out) = check(&dev, false);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 torn records") && out.contains("1 superseded"),
        "{out}"
    );
}

#[test]
fn bad_superblock_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device(dir.path());
    let orig = std::fs::read(&dev).unwrap();
    // A damaged field: the magic is there, the checksums fail.
    patch(&dev, 30, &[orig[30] ^ 0x40]);
    let (code, out) = check(&dev, false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("superblock") && out.contains("checksum"),
        "{out}"
    );
    // No magic: not a tiercache device.
    patch(&dev, 0, b"NOTTIERC");
    let (code, out) = check(&dev, false);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not a tiercache cache device"), "{out}");
    let (code, out) = check(&dev, true);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["exit_code"], 2);
    // Missing and empty files.
    let (code, out) = check(&dir.path().join("nope.img"), false);
    assert_eq!(code, 2, "{out}");
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let (code, out) = check(&empty, false);
    assert_eq!(code, 2, "{out}");
}

// ---- Damage after a clean stop: `check` names it, `serve` refuses, `check --repair` salvages.

/// `tiercache check --repair DEVICE --json`: (exit code, parsed report).
fn repair(dev: &Path) -> (i32, serde_json::Value) {
    let o = Command::new(BIN)
        .args(["check", "--repair", "--json"])
        .arg(dev)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let v = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{e}: {out}{}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code().unwrap(), v)
}

/// `tiercache serve` on `cache` must refuse to start: returns its stderr.
fn serve_refuses(dir: &Path, cache: &Path, backing: &Path) -> String {
    let o = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(cache)
        .arg("--backing")
        .arg(backing)
        .arg("--socket")
        .arg(dir.join("refused.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "serve started on a damaged cache: {err}"
    );
    err
}

fn sha(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// Damaged metadata: `check` exits 1 naming `named`, `serve` refuses naming the repair,
/// `check --repair` succeeds; returns the repair's JSON.
fn damage_named_refused_and_repaired(
    dir: &Path,
    cache: &Path,
    backing: &Path,
    named: &str,
) -> serde_json::Value {
    let (code, out) = check(cache, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(named), "{out}");
    let err = serve_refuses(dir, cache, backing);
    assert!(err.contains("tiercache check --repair"), "{err}");
    let (code, v) = repair(cache);
    assert_eq!(code, 0, "{v}");
    v
}

/// Repair is idempotent: a second `check --repair` finds nothing and writes nothing.
fn second_repair_changes_nothing(dev: &Path) {
    let before = sha(dev);
    let (code, v) = repair(dev);
    assert_eq!(
        (code, v["repair"]["changed"].clone()),
        (0, false.into()),
        "{v}"
    );
    assert!(sha(dev) == before, "a second repair changed the device");
}

const LOG_LINES: u64 = 64;

/// Distinct, non-zero contents of log test line `i`.
fn log_line(i: u64) -> Vec<u8> {
    format!("log line {i:03} ")
        .bytes()
        .cycle()
        .take(4096)
        .collect()
}

/// A write-back log cache holding `LOG_LINES` distinct dirty lines, committed 8 at a time
/// (a FLUSH after every eighth); stopped cleanly, or (`clean` false) left as a crash leaves
/// it. Segments of `seg` bytes. Returns (cache, backing).
fn log_device(dir: &Path, clean: bool, seg: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let cache = dir.join("cache.img");
    let backing = dir.join("backing.img");
    std::fs::write(&backing, vec![0u8; VOL as usize]).unwrap();
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let o = tiercache_server::LogFormatOptions {
        mode: Mode::WriteBack,
        segment_size: seg,
        ..Default::default()
    };
    tiercache_server::format_log(&FileDev::open(&cache).unwrap(), VOL, &o).unwrap();
    let vol = log_open(&cache, &backing).unwrap();
    for i in 0..LOG_LINES {
        vol.write(i * 4096, &log_line(i), false).unwrap();
        if i % 8 == 7 {
            vol.flush().unwrap();
        }
    }
    if clean {
        vol.shutdown().unwrap();
    }
    (cache, backing)
}

fn log_open(cache: &Path, backing: &Path) -> std::io::Result<tiercache_server::LogVolume> {
    tiercache_server::LogVolume::open(
        Box::new(FileDev::open(cache)?),
        Box::new(FileDev::open(backing)?),
    )
    .map(|(v, _)| v)
}

/// Lines of the log test that read their written contents; every other line must read its
/// previous contents (zeroes: the backing device), never anything else.
fn log_lines_readable(cache: &Path, backing: &Path) -> u64 {
    let vol = log_open(cache, backing).unwrap();
    let mut n = 0;
    let mut b = vec![0u8; 4096];
    for i in 0..LOG_LINES {
        vol.read(i * 4096, &mut b).unwrap();
        if b == log_line(i) {
            n += 1;
        } else {
            assert!(b.iter().all(|&x| x == 0), "line {i} reads foreign bytes");
        }
    }
    vol.shutdown().unwrap();
    n
}

/// (half, byte offset) of record `index` of the active journal half.
fn journal_record(cache: &Path, index: u64) -> (u32, usize) {
    use tiercache_server::log_format::{decode_half, LogSuperblock, HALF_HEADER, REC_BYTES};
    let d = std::fs::read(cache).unwrap();
    let g = LogSuperblock::decode(&d[..4096]).unwrap().geometry();
    let epoch = |h: u32| decode_half(&d[g.half_offset(h) as usize..]);
    let h = if epoch(1) > epoch(0) { 1 } else { 0 };
    let at = g.half_offset(h) + HALF_HEADER + index * REC_BYTES as u64;
    (h, at as usize)
}

fn flip(p: &Path, at: usize, mask: u8) {
    let mut d = std::fs::read(p).unwrap();
    d[at] ^= mask;
    std::fs::write(p, d).unwrap();
}

#[test]
fn log_journal_bit_flip_is_named_refused_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = log_device(dir.path(), true, 1 << 20);
    let (h, at) = journal_record(&cache, 32);
    flip(&cache, at + 20, 0x04);
    let (code, out) = check(&cache, false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("journal half {h} record 32 (byte {at})")),
        "{out}"
    );
    let (code, out) = check(&cache, true);
    assert_eq!(code, 1, "{out}");
    let err = serve_refuses(dir.path(), &cache, &backing);
    assert!(err.contains("tiercache check --repair"), "{err}");
    let e = log_open(&cache, &backing).err().expect("open refuses");
    assert!(e.to_string().contains("tiercache check --repair"), "{e}");

    let (code, v) = repair(&cache);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["repair"]["changed"], true, "{v}");
    let unknown = v["repair"]["unknown_lost"].to_string();
    assert!(unknown.contains("record 32"), "{v}");
    // Every record after the damaged one verifies: 63 of the 64 lines are salvaged, the
    // one the damaged record described reads its previous contents.
    assert_eq!(log_lines_readable(&cache, &backing), LOG_LINES - 1);
    let (code, out) = check(&cache, false);
    assert_eq!(code, 0, "{out}");
    // Idempotent: a second repair finds nothing and writes nothing.
    second_repair_changes_nothing(&cache);
}

#[test]
fn log_journal_damage_after_a_crash_is_told_from_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = log_device(dir.path(), false, 1 << 20);
    let orig = std::fs::read(&cache).unwrap();
    // Record 60 lies in the last commit (56..64), which a crash may tear: the journal ends
    // before it, as after a power cut (exit 0), its commit's later records are dropped.
    let (_, at) = journal_record(&cache, 60);
    flip(&cache, at + 30, 0x01);
    let (code, out) = check(&cache, false);
    assert_eq!(code, 0, "{out}");
    assert_eq!(log_lines_readable(&cache, &backing), 60);
    // Record 12 lies in the second commit: later commits' records verify, so it is damage.
    std::fs::write(&cache, &orig).unwrap();
    let (h, at) = journal_record(&cache, 12);
    flip(&cache, at + 30, 0x01);
    let named = format!("journal half {h} record 12 (byte {at})");
    damage_named_refused_and_repaired(dir.path(), &cache, &backing, &named);
    assert_eq!(log_lines_readable(&cache, &backing), LOG_LINES - 1);
}

#[test]
fn log_journal_last_record_flip_after_a_clean_stop_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = log_device(dir.path(), true, 1 << 20);
    // The last record of the journal: nothing valid follows it, but the stop was clean.
    let (_, at) = journal_record(&cache, LOG_LINES - 1);
    flip(&cache, at + 40, 0x80);
    damage_named_refused_and_repaired(dir.path(), &cache, &backing, "");
    assert_eq!(log_lines_readable(&cache, &backing), LOG_LINES - 1);
}

#[test]
fn direct_record_bit_flip_is_refused_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device(dir.path());
    let backing = dir.path().join("backing.img");
    let d = std::fs::read(&dev).unwrap();
    let dirty_slot = (0..64)
        .find(|&s| {
            Record::decode(&d[4096 + s * 32..4096 + s * 32 + 32]).is_some_and(|r| r.dirty != 0)
        })
        .unwrap();
    flip(&dev, 4096 + dirty_slot * 32 + 3, 0x20);
    let err = serve_refuses(dir.path(), &dev, &backing);
    assert!(err.contains("tiercache check --repair"), "{err}");
    let (code, v) = repair(&dev);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["repair"]["changed"], true, "{v}");
    let unknown = v["repair"]["unknown_lost"].to_string();
    assert!(
        unknown.contains(&format!("slot {dirty_slot}")) && unknown.contains("dirty"),
        "{v}"
    );
    let (code, out) = check(&dev, false);
    assert_eq!(code, 0, "{out}");
    // The server starts and serves everything else: of the 40,000 written bytes, only the
    // dropped slot's line reads its previous contents (zeroes).
    let (vol, _) = CacheVolume::open(
        Box::new(FileDev::open(&dev).unwrap()),
        Box::new(FileDev::open(&backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    let mut b = vec![0u8; 40_000];
    vol.read(1000, &mut b).unwrap();
    vol.shutdown().unwrap();
    // While a volume has the device open, a repair refuses to touch it.
    let (code, v) = repair(&dev);
    assert_eq!(code, 2, "{v}");
    assert!(v["error"].to_string().contains("in use"), "{v}");
    drop(vol);
    let stale = b.iter().filter(|&&x| x != 7).count();
    assert!(stale > 0 && stale <= 4096, "{stale} bytes not as written");
    assert!(b.iter().all(|&x| x == 7 || x == 0));
    second_repair_changes_nothing(&dev);
}

#[test]
fn log_segment_header_and_superblock_flips() {
    use tiercache_server::log_format::{LogSuperblock, SegHeader, HDR_FIXED};
    let dir = tempfile::tempdir().unwrap();
    // Segments of 16 lines: the 64 lines fill and seal four of them.
    let (cache, backing) = log_device(dir.path(), true, 64 << 10);
    let orig = std::fs::read(&cache).unwrap();
    let sb = LogSuperblock::decode(&orig[..4096]).unwrap();
    let g = sb.geometry();
    let slot = (0..2)
        .find(|&k| {
            let at = g.slot_offset(0, k) as usize;
            SegHeader::decode(&orig[at..at + g.slot_bytes as usize], 0, sb.max_extents)
                .is_some_and(|h| h.sealed)
        })
        .expect("segment 0 sealed");
    let at = g.slot_offset(0, slot) as usize;
    flip(&cache, at + HDR_FIXED + 10, 0x08);
    let named = format!("segment 0 header slot {slot} (byte {at})");
    let v = damage_named_refused_and_repaired(dir.path(), &cache, &backing, &named);
    assert!(
        v["repair"]["unknown_lost"]
            .to_string()
            .contains("segment 0"),
        "{v}"
    );
    // Segment 0's lines whose base records are still in the journal come back (here all:
    // no checkpoint since they were written); any other reads its previous contents (never
    // foreign bytes), and the other segments' lines are all there.
    let n = log_lines_readable(&cache, &backing);
    println!("segment header flip: {n} of {LOG_LINES} lines readable after the repair");
    assert!(n >= LOG_LINES - 16, "{n}");
    second_repair_changes_nothing(&cache);

    // A flipped bit in the superblock: an inconsistency (exit 1) that no repair can fix;
    // the server refuses, naming the way out.
    std::fs::write(&cache, &orig).unwrap();
    flip(&cache, 20, 0x01);
    let (code, out) = check(&cache, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("superblock"), "{out}");
    let err = serve_refuses(dir.path(), &cache, &backing);
    assert!(err.contains("tiercache format --force"), "{err}");
    let (code, v) = repair(&cache);
    assert_eq!(code, 1, "{v}");
}

#[test]
fn log_journal_half_header_flip_is_named_refused_and_repaired() {
    use tiercache_server::log_format::HALF_HEADER;
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = log_device(dir.path(), true, 1 << 20);
    let (h, rec0) = journal_record(&cache, 0);
    let at = rec0 - HALF_HEADER as usize;
    flip(&cache, at + 100, 0x02);
    let named = format!("journal half {h} header (byte {at})");
    damage_named_refused_and_repaired(dir.path(), &cache, &backing, &named);
    // Its records verify on their own: nothing is lost.
    assert_eq!(log_lines_readable(&cache, &backing), LOG_LINES);
    second_repair_changes_nothing(&cache);
}

/// `format --data-checksums`, then one flipped byte in a dirty cached sector of a cleanly
/// stopped cache: `check` exits 1 naming the slot and the volume range, `check --repair`
/// drops the damaged sector, lists it as lost, and a second repair changes nothing.
#[test]
fn data_checksum_damage_is_named_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = (dir.path().join("cache.img"), dir.path().join("backing.img"));
    std::fs::write(&backing, vec![0u8; VOL as usize]).unwrap();
    let sb_bytes = tiercache_server::Superblock::data_offset_with(64, 4096, true) + 64 * 4096;
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(sb_bytes)
        .unwrap();
    let o = Command::new(BIN)
        .args(["format", "--mode", "wb", "--data-checksums", "--cache"])
        .arg(&cache)
        .arg("--backing")
        .arg(&backing)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("with data checksums"),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (vol, _) = CacheVolume::open(
        Box::new(FileDev::open(&cache).unwrap()),
        Box::new(FileDev::open(&backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    vol.write(5 * 4096, &[9u8; 4096], false).unwrap();
    let slot = vol.lines()[0].slot as u64;
    vol.shutdown().unwrap();
    drop(vol);
    assert_eq!(check(&cache, false).0, 0);
    let sb = tiercache_server::read_superblock(&FileDev::open_read_only(&cache).unwrap()).unwrap();
    let at = (sb.data_offset + slot * 4096 + 2100) as usize;
    patch(&cache, at, &[0x19]);
    let (code, out) = check(&cache, false);
    assert_eq!(code, 1, "{out}");
    let want = format!("slot {slot} (cache byte {})", at / 512 * 512);
    assert!(
        out.contains(&want) && out.contains("volume bytes 22528..23040") && out.contains("DIRTY"),
        "{out}"
    );
    let (code, v) = repair(&cache);
    assert_eq!(code, 0, "{v}");
    let lost = &v["repair"]["lost_ranges"];
    assert_eq!(
        (
            lost[0]["start"].as_u64(),
            lost[0]["end"].as_u64(),
            lost.as_array().map(|a| a.len())
        ),
        (Some(22528), Some(23040), Some(1)),
        "{v}"
    );
    second_repair_changes_nothing(&cache);
}

/// Flips a byte in both copies of the lost-range list at `at` (`lost_list::COPY` apart).
fn damage_lost_list(p: &Path, at: u64) {
    for copy in [0, tiercache_server::lost_list::COPY] {
        flip(p, (at + copy + 100) as usize, 0x40);
    }
}

/// A damaged lost-range list (both copies fail their crc32c) is an inconsistency that
/// `check` lists (exit 1, text and JSON) in both layouts alike (the log layout's check used
/// to refuse with exit 2); the server refuses to start, naming the list; no repair rebuilds
/// it, so `check --repair` still ends with exit 1.
#[test]
fn damaged_lost_list_is_a_problem_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let direct = device(dir.path());
    let sb = tiercache_server::read_superblock(&FileDev::open(&direct).unwrap()).unwrap();
    damage_lost_list(&direct, sb.lost_list_offset().unwrap());
    let log_dir = dir.path().join("log");
    std::fs::create_dir(&log_dir).unwrap();
    let (log, log_backing) = log_device(&log_dir, true, 64 << 10);
    let lsb = tiercache_server::read_log_superblock(&FileDev::open(&log).unwrap())
        .unwrap()
        .unwrap();
    damage_lost_list(&log, lsb.geometry().lost_list.unwrap());
    for (name, dev) in [("direct", &direct), ("log", &log)] {
        let (code, out) = check(dev, false);
        assert_eq!(code, 1, "{name}: {out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("PROBLEM") && l.contains("lost-range list")),
            "{name}: {out}"
        );
        let (code, out) = check(dev, true);
        assert_eq!(code, 1, "{name}: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["ok"], false, "{name}: {v}");
        assert_eq!(v["exit_code"], 1, "{name}: {v}");
        assert!(v.to_string().contains("lost-range list"), "{name}: {v}");
    }
    let err = serve_refuses(&log_dir, &log, &log_backing);
    assert!(err.contains("lost-range list"), "{err}");
    assert!(err.contains("format --force"), "{err}");
    for (name, dev) in [("direct", &direct), ("log", &log)] {
        let (code, v) = repair(dev);
        assert_eq!(code, 1, "{name}: {v}");
    }
    // The repair did not paper over it: the log cache is still refused.
    let err = serve_refuses(&log_dir, &log, &log_backing);
    assert!(err.contains("lost-range list"), "{err}");
}
