//! `tiercache check --cache A --cache B` on a pool of cache devices (plan-multi-cache (f), step
//! 5): a pool formatted by `tiercache format --cache ... --cache ...` and written through the
//! server checks consistent (members in either order) and reports its reconciliation; a copy
//! record paired with its dirty primary is consistent, a stale copy after a clean stop and a
//! copy on a pool keeping one copy are not; a damaged pool block, a member of another pool
//! and a missing member are named.

use std::path::{Path, PathBuf};
use std::process::Command;
use tiercache_nbd::Export;
use tiercache_server::format::{
    PoolBlock, Record, Superblock, EMPTY_KEY, POOL_BLOCK_AT, POOL_META_OFFSET, RECORD_BYTES,
};
use tiercache_server::{BlockDev, CacheVolume, FileDev, OpenOptions, PoolDev};

const BIN: &str = env!("CARGO_BIN_EXE_tiercache");
const VOL: u64 = 4 << 20;
/// Lines per member (one record page each).
const LINES: u64 = 128;

fn check(caches: &[&Path], json: bool) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.arg("check");
    for p in caches {
        c.arg("--cache").arg(p);
    }
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

fn devs(paths: &[&Path]) -> Vec<(String, Box<dyn BlockDev>)> {
    paths
        .iter()
        .map(|p| {
            (
                p.display().to_string(),
                Box::new(FileDev::open(p).unwrap()) as Box<dyn BlockDev>,
            )
        })
        .collect()
}

/// Two members formatted by the CLI in write-back with one dirty copy, dirty and clean lines
/// written through the server, shut down cleanly.
fn pool(dir: &Path) -> (PathBuf, PathBuf) {
    let (a, b, backing) = (
        dir.join("a.img"),
        dir.join("b.img"),
        dir.join("backing.img"),
    );
    std::fs::write(&backing, vec![0u8; VOL as usize]).unwrap();
    let bytes = Superblock::member_data_offset(LINES, 4096) + LINES * 4096;
    for p in [&a, &b] {
        std::fs::File::create(p).unwrap().set_len(bytes).unwrap();
    }
    let o = Command::new(BIN)
        .arg("format")
        .arg("--cache")
        .arg(&a)
        .arg("--cache")
        .arg(&b)
        .arg("--backing")
        .arg(&backing)
        .args(["--mode", "write-back", "--dirty-copies", "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (vol, _) = CacheVolume::open(
        Box::new(PoolDev::open(devs(&[&a, &b])).unwrap()),
        Box::new(FileDev::open(&backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    // 40 dirty lines, then 150 lines read (clean; the pool's 256 lines spread over both).
    vol.write(0, &vec![7u8; 40 * 4096], false).unwrap();
    let mut buf = vec![0u8; 150 * 4096];
    vol.read(1 << 20, &mut buf).unwrap();
    vol.shutdown().unwrap();
    (a, b)
}

/// The records of a member file, by member-local slot.
fn records(p: &Path) -> Vec<Option<Record>> {
    let d = std::fs::read(p).unwrap();
    (0..LINES)
        .map(|s| {
            let at = (POOL_META_OFFSET + s * RECORD_BYTES) as usize;
            Record::decode(&d[at..at + RECORD_BYTES as usize])
        })
        .collect()
}

fn put_record(p: &Path, local: u64, r: Record) {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; RECORD_BYTES as usize];
    r.encode(&mut b);
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(&b, POOL_META_OFFSET + local * RECORD_BYTES)
        .unwrap();
}

/// Rewrites a member's pool block with `dirty_copies` (as a pool of two copies would have).
fn set_dirty_copies(p: &Path, n: u8) {
    use std::os::unix::fs::FileExt;
    let d = std::fs::read(p).unwrap();
    let mut b = PoolBlock::decode(&d[POOL_BLOCK_AT as usize..][..4096]).unwrap();
    b.dirty_copies = n;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(&b.encode(), POOL_BLOCK_AT).unwrap();
}

#[test]
fn check_of_a_pool_verifies_blocks_records_and_copies() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = pool(d.path());
    let (code, out) = check(&[&a, &b], false);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("result        consistent") && out.contains("0 paired copies"),
        "{out}"
    );
    assert!(out.contains("40 dirty"), "{out}");
    // Members in the other order: the same pool.
    let (code, out2) = check(&[&b, &a], true);
    assert_eq!(code, 0, "{out2}");
    let v: serde_json::Value = serde_json::from_str(&out2).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["members"].as_array().unwrap().len(), 2);
    assert_eq!(v["unmirrored"], 40, "{out2}");
    // The reconciliation's primaries are the lines today's rule (the one-cache check, as
    // open) finds.
    assert_eq!(v["primaries"], v["records"]["lines"], "{out2}");
    assert!(v["primaries"].as_u64().unwrap() >= 150, "{out2}");

    // A dirty primary on member 0 and a free slot on member 1.
    let ra = records(&a);
    let (pl, pr) = ra
        .iter()
        .enumerate()
        .find_map(|(s, r)| {
            r.filter(|r| r.key != EMPTY_KEY && r.dirty != 0)
                .map(|r| (s as u64, r))
        })
        .expect("a dirty line on member 0");
    let free = records(&b)
        .iter()
        .position(|r| r.is_none_or(|r| r.key == EMPTY_KEY))
        .expect("a free slot on member 1") as u64;
    // Its copy on member 1, paired (same dirty mask): a pool of one copy never has one.
    put_record(&b, free, Record::copy(pr.key, pl as u32, pr.dirty, pr.seq));
    let (code, out) = check(&[&a, &b], false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("only a pool of 2 writes them"), "{out}");
    // With the pool keeping two copies: paired, consistent.
    set_dirty_copies(&a, 2);
    set_dirty_copies(&b, 2);
    let (code, out) = check(&[&a, &b], false);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 paired copies") && out.contains("39 dirty lines without a copy"),
        "{out}"
    );
    // A stale copy (the primary's mask differs) after a clean stop: an inconsistency.
    put_record(
        &b,
        free,
        Record::copy(pr.key, pl as u32, pr.dirty ^ 1, pr.seq),
    );
    let (code, out) = check(&[&a, &b], false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no longer maps the line dirty"), "{out}");
    put_record(&b, free, Record::EMPTY);
    assert_eq!(check(&[&a, &b], false).0, 0);

    // One --cache is DEVICE: a member alone is named as one.
    let (code, out) = check(&[&a], false);
    assert!(code != 0 && out.contains("member of a pool"), "{out}");

    // A damaged pool block on member 1: named.
    let mut x = std::fs::read(&b).unwrap();
    x[POOL_BLOCK_AT as usize + 50] ^= 0x40;
    std::fs::write(&b, &x).unwrap();
    let (code, out) = check(&[&a, &b], false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("cache device {}: pool block", b.display()))
            && out.contains("checksum"),
        "{out}"
    );
    assert!(
        out.contains("missing"),
        "member 1 then counts as missing: {out}"
    );
    x[POOL_BLOCK_AT as usize + 50] ^= 0x40;
    std::fs::write(&b, &x).unwrap();
    assert_eq!(check(&[&a, &b], false).0, 0);

    // A member of another pool given with it: named.
    let e = tempfile::tempdir().unwrap();
    let (_, b2) = pool(e.path());
    let (code, out) = check(&[&a, &b2], false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("cache device {} belongs to pool", b2.display())),
        "{out}"
    );
}
