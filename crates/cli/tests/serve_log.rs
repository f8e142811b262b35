//! `tiercache serve --layout log` end to end: fio with crc32c verification on compressible
//! data in write-back (then a restart and a verify-only pass), an image with duplicate and
//! compressible blocks copied in with nbdcopy and read back bit-exact after a clean restart
//! and after SIGKILL, `ctl stats` reporting the reduction, and the flag checks. Missing tools
//! skip their part with a printed message.

mod common;

use common::{have, run, sha, Srv, BIN};
use std::process::Command;

fn setup(size_mb: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("backing.img")).unwrap();
    f.set_len(size_mb << 20).unwrap();
    dir
}

const LOG: [&str; 10] = [
    "--layout",
    "log",
    "--compression",
    "lz4",
    "--dedup",
    "1.0",
    "--mode",
    "write-back",
    "--segment-size",
    "256k",
];

/// The log layout's own figures: the `log` sub-object of `ctl stats --json` (the top level
/// holds the figures both layouts share, `tiercache_server::live`).
fn stats(srv: &Srv) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(v["layout"], "log", "{v}");
    v["log"].clone()
}

#[test]
fn fio_verify_write_back_lz4_dedup_and_restart() {
    if !have("fio") {
        return;
    }
    let dir = setup(64);
    let d = dir.path();
    let srv = Srv::sized(d, "16M", &LOG);
    let fio = |extra: &[&str]| {
        let mut c = Command::new("fio");
        c.current_dir(d).args([
            "--name=logverify",
            "--ioengine=nbd",
            &format!("--uri={}", srv_uri(d)),
            "--rw=randwrite",
            "--bs=4k",
            "--size=40M",
            "--iodepth=8",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--buffer_compress_percentage=60",
            "--refill_buffers=1",
            "--randseed=7",
        ]);
        c.args(extra);
        run(&mut c)
    };
    let out = fio(&["--do_verify=1"]);
    assert!(!out.contains("verify failed"), "{out}");
    let s = stats(&srv);
    println!(
        "fio: compression {} dedup {} effective {} reclaimed {} write-backs {}",
        s["compression_ratio"],
        s["dedup_ratio"],
        s["effective_capacity"],
        s["engine"]["segments_reclaimed"],
        s["live"]["write_backs"]
    );
    assert!(s["compression_ratio"].as_f64().unwrap() > 1.3, "{s}");
    assert!(
        s["engine"]["segments_reclaimed"].as_u64().unwrap() > 0,
        "{s}"
    );
    assert!(s["live"]["write_backs"].as_u64().unwrap() > 0, "{s}");
    let text = srv.ctl(&["stats"]);
    assert!(text.contains("reduction"), "{text}");
    srv.stop("-TERM");
    // Restarted from the device's superblock alone (no layout flags): fio's data verifies.
    let srv = Srv::sized(d, "16M", &[]);
    fio(&["--verify_only"]);
    srv.stop("-TERM");
}

fn srv_uri(d: &std::path::Path) -> String {
    format!("nbd+unix:///?socket={}", d.join("nbd.sock").display())
}

/// 24 MiB: a quarter random blocks, the rest drawn from 64 text-like blocks (duplicates
/// that compress).
fn image(path: &std::path::Path) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(24 << 20);
    for _ in 0..(24 << 20) / 4096 {
        let r = next();
        if r % 4 == 0 {
            for _ in 0..512 {
                out.extend_from_slice(&next().to_le_bytes());
            }
        } else {
            let k = r % 64;
            let line = format!("block {k} of the duplicate pool, text that compresses. ");
            out.extend(line.bytes().cycle().take(4096));
        }
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn duplicate_image_reads_back_after_restart_and_kill() {
    if !have("nbdcopy") || !have("sha256sum") {
        return;
    }
    let dir = setup(32);
    let d = dir.path();
    let img = d.join("dup.img");
    image(&img);
    let want = sha(&img);
    let srv = Srv::sized(d, "16M", &LOG);
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&img)
        .arg(srv.uri()));
    let s = stats(&srv);
    println!(
        "image: dedup {} compression {} effective capacity {} index bytes/entry {}",
        s["dedup_ratio"],
        s["compression_ratio"],
        s["effective_capacity"],
        s["index_bytes_per_entry"]
    );
    assert!(s["dedup_ratio"].as_f64().unwrap() > 1.5, "{s}");
    // The 64 pool blocks compress, but once each is stored the rest are duplicates: the
    // stored extents are mostly the random quarter.
    assert!(s["compression_ratio"].as_f64().unwrap() > 1.0, "{s}");
    assert!(
        s["engine"]["extents_compressed"].as_u64().unwrap() >= 40,
        "{s}"
    );
    assert!(s["effective_capacity"].as_f64().unwrap() > 2.0, "{s}");
    let back = d.join("back.img");
    let copy = |srv: &Srv| {
        let _ = std::fs::remove_file(&back);
        std::fs::File::create(&back)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&back)
            .unwrap()
            .set_len(24 << 20)
            .unwrap();
        sha(&back)
    };
    assert_eq!(copy(&srv), want, "before restart");
    srv.stop("-TERM");
    let srv = Srv::sized(d, "16M", &[]);
    assert_eq!(copy(&srv), want, "after a clean restart");
    srv.kill9();
    let srv = Srv::sized(d, "16M", &[]);
    assert_eq!(copy(&srv), want, "after SIGKILL");
    let s = stats(&srv);
    assert!(
        s["cached_lines"].as_u64().unwrap() > 0,
        "warm after SIGKILL: {s}"
    );
    srv.kill9();
    // `tiercache check` runs the recovery on a copy-on-write view and scrubs every extent.
    let cache = d.join("cache.img");
    let check = || {
        let o = Command::new(BIN)
            .args(["check", "--json"])
            .arg(&cache)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (o.status.code().unwrap(), v)
    };
    let before = std::fs::read(&cache).unwrap();
    let (code, v) = check();
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["layout"], "log");
    assert_eq!(v["recovery"]["was_clean"], false);
    assert!(v["scrub"]["extents"].as_u64().unwrap() > 0, "{v:#}");
    assert!(
        std::fs::read(&cache).unwrap() == before,
        "check wrote the device"
    );
    // Damage the first extent of the first segment filled (segment 0): found, exit 1.
    let sb = tiercache_server::read_log_superblock(
        &tiercache_server::FileDev::open_read_only(&cache).unwrap(),
    )
    .unwrap()
    .unwrap();
    let at = sb.geometry().data_offset(0) + 16;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 64], at).unwrap();
    let (code, v) = check();
    assert_eq!(code, 1, "{v:#}");
    assert!(v["scrub"]["bad_extents"].as_u64().unwrap() >= 1, "{v:#}");
    let text = Command::new(BIN).arg("check").arg(&cache).output().unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains("PROBLEM: segment 0 offset 0"), "{out}");
}

#[test]
fn layout_flags_are_checked() {
    let dir = setup(8);
    let d = dir.path();
    let cache = d.join("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let fmt = |extra: &[&str]| {
        Command::new(BIN)
            .arg("format")
            .arg("--cache")
            .arg(&cache)
            .arg("--backing")
            .arg(d.join("backing.img"))
            .args(extra)
            .output()
            .unwrap()
    };
    let o = fmt(&["--layout", "log", "--policy", "arc"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("direct layout"));
    let o = fmt(&["--compression", "lz4"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--layout log"));
    let o = fmt(&["--layout", "log", "--trim"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("per run"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = fmt(&["--layout", "log", "--dup-share", "0.3"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("simulator options"));
    let o = fmt(&[
        "--layout",
        "log",
        "--compression",
        "zstd:5",
        "--segment-size",
        "512k",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("log layout"));
    let o = fmt(&["--layout", "log"]);
    assert!(!o.status.success(), "refuses to overwrite without --force");
    // Serving the log device with direct-only options is refused.
    let o = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(&cache)
        .arg("--backing")
        .arg(d.join("backing.img"))
        .arg("--socket")
        .arg(d.join("s.sock"))
        .args(["--policy", "arc"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("direct layout only"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Other layout settings than the device's are refused, naming both (the same ones are
    // fine: a restart may repeat its command line, as the ext4 test does).
    let o = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(&cache)
        .arg("--backing")
        .arg(d.join("backing.img"))
        .arg("--socket")
        .arg(d.join("s.sock"))
        .args(["--compression", "lz4", "--segment-size", "512k"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--compression lz4 (formatted zstd:5)") && !e.contains("--segment-size"),
        "{e}"
    );
}

/// `serve --format-if-needed` formatting a new cache file removes a state file left beside
/// it (a failure recorded for an older cache at that path), in both layouts (before: the
/// log layout left it there, the direct layout removed it).
#[test]
fn format_if_needed_clears_an_old_state_file_in_both_layouts() {
    use tiercache_server::state_file::{self, FailState};
    for layout in [&[][..], &["--layout", "log", "--segment-size", "256k"][..]] {
        let dir = setup(8);
        let d = dir.path();
        let beside = state_file::beside(&d.join("cache.img"));
        let old = FailState {
            uuid: [7; 16],
            failed_at: 1,
            reason: "an older cache at this path failed".into(),
            lost: Vec::new(),
        };
        state_file::write(&beside, &old).unwrap();
        let srv = Srv::sized(d, "8M", layout);
        let left = state_file::read(&beside).unwrap();
        srv.stop("-TERM");
        assert_eq!(left, None, "{layout:?}: the old state file is still there");
    }
}
