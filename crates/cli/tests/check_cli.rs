//! `tiercache check DEVICE`: exit 0 on a consistent device, 1 on inconsistencies (a corrupted
//! record, a key mapped twice, a key outside the backing device, a damaged superblock), 2 when
//! the file is not a tiercache device or cannot be read; `--json` carries the same verdict.

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
