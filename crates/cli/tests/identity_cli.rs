//! Issue 14, item 2 through the binary: a cache formatted for one backing device is refused
//! in front of another (`serve`), `format` does not overwrite a cache without --force, and a
//! cache device can be an NBD export (nbdkit: memory, and the error filter for cache faults).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use tiercache_nbd::Client;

const VOL: usize = 4 << 20;

/// `dir/backing.img` (a pattern), `dir/b.img` (another disk of the same size), and an 8 MiB
/// `dir/cache.img` formatted write-back for backing.img.
fn setup(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let a = dir.join("backing.img");
    let b = dir.join("b.img");
    let c = dir.join("cache.img");
    std::fs::write(&a, (0..VOL).map(|i| (i / 4096) as u8).collect::<Vec<u8>>()).unwrap();
    std::fs::write(&b, vec![0x5a; VOL]).unwrap();
    std::fs::File::create(&c).unwrap().set_len(8 << 20).unwrap();
    let out = run(Command::new(BIN)
        .arg("format")
        .arg("--cache")
        .arg(&c)
        .arg("--backing")
        .arg(&a)
        .args(["--mode", "write-back"]));
    assert!(out.contains("backing.img"), "{out}");
    (a, b, c)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn serve_refuses_another_backing_device_and_accepts_a_rename_with_the_flag() {
    let d = tmp();
    let dir = d.path();
    let (a, b, c) = setup(dir);
    let srv = Srv::custom(dir, &["--cache", &s(&c), "--backing", &s(&a)]);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    cl.write(0, &[0xd1; 4096]).unwrap();
    cl.write(8192, &[0xd2; 4096]).unwrap();
    drop(cl);
    srv.stop("-TERM");
    let sha_b = sha(&b);

    let log = serve_refused(dir, &["--cache", &s(&c), "--backing", &s(&b)]);
    assert!(
        log.contains("b.img")
            && log.contains("backing.img")
            && log.contains("--accept-backing-rename"),
        "{log}"
    );
    assert_eq!(sha(&b), sha_b, "the other disk was not written");

    // `format` does not discard it either without --force.
    let out = Command::new(BIN)
        .arg("format")
        .arg("--cache")
        .arg(&c)
        .arg("--backing")
        .arg(&b)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--force") && err.contains("dirty"),
        "{err}"
    );

    // The same file moved: refused, then accepted with the flag; its data is there.
    let moved = dir.join("moved.img");
    std::fs::rename(&a, &moved).unwrap();
    serve_refused(dir, &["--cache", &s(&c), "--backing", &s(&moved)]);
    let srv = Srv::custom(
        dir,
        &[
            "--cache",
            &s(&c),
            "--backing",
            &s(&moved),
            "--accept-backing-rename",
        ],
    );
    let mut cl = Client::connect(&srv.uri()).unwrap();
    let mut buf = vec![0u8; 4096];
    cl.read(8192, &mut buf).unwrap();
    assert_eq!(buf, vec![0xd2; 4096]);
    drop(cl);
    let log = srv.stop("-TERM");
    assert!(
        log.contains("2 lines restored (2 dirty)") && log.contains("moved.img"),
        "{log}"
    );
}

#[test]
fn format_refuses_a_damaged_cache_without_force() {
    let d = tmp();
    let dir = d.path();
    let (a, _, c) = setup(dir);
    // One flipped bit in the superblock: not a valid cache, but it was one and may hold
    // dirty data (`tiercache check` says what is left).
    let mut img = std::fs::read(&c).unwrap();
    img[40] ^= 1;
    std::fs::write(&c, &img).unwrap();
    let fmt = |force: bool| {
        let mut cmd = Command::new(BIN);
        cmd.arg("format")
            .arg("--cache")
            .arg(&c)
            .arg("--backing")
            .arg(&a);
        if force {
            cmd.arg("--force");
        }
        cmd.output().unwrap()
    };
    let out = fmt(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a damaged cache was formatted over");
    assert!(err.contains("damaged") && err.contains("--force"), "{err}");
    assert!(fmt(true).status.success());
}

#[test]
fn cache_device_can_be_an_nbd_export() {
    if !have("nbdkit") {
        return;
    }
    let d = tmp();
    let dir = d.path();
    let (a, _, _) = setup(dir);
    // A memory export as the cache device: formatted, served, restarted warm.
    let mem = NbdkitProc::start(&dir.join("mem.sock"), &["memory", "16M"]);
    run(Command::new(BIN)
        .args(["format", "--cache", &mem.uri(), "--backing", &s(&a)])
        .args(["--mode", "write-back"]));
    let args = ["--cache", &mem.uri(), "--backing", &s(&a)];
    let srv = Srv::custom(dir, &args);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    cl.write(4096, &[0xc1; 4096]).unwrap();
    drop(cl);
    srv.stop("-TERM");
    let srv = Srv::custom(dir, &args);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    let mut buf = vec![0u8; 4096];
    cl.read(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![0xc1; 4096]);
    drop(cl);
    let log = srv.stop("-TERM");
    assert!(log.contains("1 lines restored (1 dirty)"), "{log}");
    drop(mem);

    // Cache faults injected with nbdkit's error filter: while TRIGGER exists every cache
    // request fails; a clean line is then read from the backing device.
    let trigger = dir.join("TRIGGER");
    let faulty = NbdkitProc::faulty_memory(&dir.join("err.sock"), &trigger, &["error-rate=1"]);
    run(Command::new(BIN)
        .args(["format", "--cache", &faulty.uri(), "--backing", &s(&a)])
        .args(["--mode", "write-through"]));
    let srv = Srv::custom(dir, &["--cache", &faulty.uri(), "--backing", &s(&a)]);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    cl.write(4096, &[0xc2; 4096]).unwrap();
    cl.read(4096, &mut buf).unwrap();
    std::fs::write(&trigger, b"").unwrap();
    cl.read(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![0xc2; 4096], "served from the backing device");
    let stats: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    let errors = stats["cache_errors"].as_u64().unwrap();
    assert!(errors > 0, "the injected cache error was counted: {stats}");
    std::fs::remove_file(&trigger).unwrap();
    drop(cl);
    srv.stop("-TERM");
}

/// A backing NBD export whose size is not a multiple of the line (nor of a sector): the
/// volume's last line reaches past the export's end, and its tail must read and write like
/// any other bytes, in both layouts (the backing device reads zeros past its end and drops
/// bytes written there, as a file does).
#[test]
fn backing_nbd_export_of_odd_size_serves_its_last_bytes() {
    if !have("nbdkit") {
        return;
    }
    const SIZE: usize = 1_000_000;
    for layout in ["direct", "log"] {
        let d = tmp();
        let dir = d.path();
        let back = NbdkitProc::start(&dir.join("b.sock"), &["memory", &SIZE.to_string()]);
        let cache = dir.join("cache.img");
        std::fs::File::create(&cache)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        run(Command::new(BIN)
            .args(["format", "--cache", &s(&cache), "--backing", &back.uri()])
            .args(["--mode", "write-back", "--layout", layout]));
        let args = ["--cache", &s(&cache), "--backing", &back.uri()];
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 999) as u8).collect();
        let srv = Srv::custom(dir, &args);
        let mut cl = Client::connect(&srv.uri()).unwrap();
        assert_eq!(cl.size(), SIZE as u64, "{layout}");
        cl.write(0, &data[..SIZE / 2])
            .unwrap_or_else(|e| panic!("{layout}: {e}"));
        cl.write(SIZE as u64 / 2, &data[SIZE / 2..])
            .unwrap_or_else(|e| panic!("{layout}: writing the last bytes: {e}"));
        let mut got = vec![0u8; SIZE];
        cl.read(0, &mut got)
            .unwrap_or_else(|e| panic!("{layout}: reading the last bytes: {e}"));
        assert!(got == data, "{layout}: read back differs");
        drop(cl);
        srv.ctl(&["flush"]);
        srv.stop("-TERM");
        // Restarted warm, and the flushed bytes reached the export.
        let srv = Srv::custom(dir, &args);
        let mut cl = Client::connect(&srv.uri()).unwrap();
        cl.read(0, &mut got).unwrap();
        assert!(got == data, "{layout}: read back after a restart differs");
        drop(cl);
        srv.stop("-TERM");
        // `ctl flush` writes dirty data back in the direct layout only (the log layout's
        // makes it durable in the cache).
        if layout == "direct" {
            let mut direct = Client::connect(&back.uri()).unwrap();
            direct.read(0, &mut got).unwrap();
            assert!(
                got == data,
                "{layout}: the backing export does not hold the data"
            );
        }
    }
}

/// A cache device that runs out of space (ENOSPC on writes only, as a thin pool or a sparse
/// cache file on a full file system): the client's writes still succeed (through to the
/// backing device), every acknowledged byte reads back — dirty data written before the fault
/// too — and after a restart the same bytes are there.
#[test]
fn cache_device_out_of_space_loses_nothing_acknowledged() {
    if !have("nbdkit") {
        return;
    }
    let d = tmp();
    let dir = d.path();
    let (a, _, _) = setup(dir);
    let trigger = dir.join("FULL");
    let full = NbdkitProc::faulty_memory(
        &dir.join("full.sock"),
        &trigger,
        &["error=ENOSPC", "error-pwrite-rate=1"],
    );
    run(Command::new(BIN)
        .args(["format", "--cache", &full.uri(), "--backing", &s(&a)])
        .args(["--mode", "write-back"]));
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let args = [
        "--cache",
        &full.uri(),
        "--backing",
        &s(&a),
        "--state-dir",
        &s(&state),
    ];
    let srv = Srv::custom(dir, &args);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    cl.write(0, &[0xa1; 8192]).unwrap();
    cl.flush().unwrap();
    std::fs::write(&trigger, b"").unwrap();
    // The cache device now refuses every write: the volume keeps accepting them.
    for i in 0..64u64 {
        cl.write(65536 + i * 4096, &[i as u8 + 1; 4096])
            .unwrap_or_else(|e| panic!("write {i} with the cache device full: {e}"));
    }
    cl.flush().unwrap();
    let mut buf = vec![0u8; 8192];
    cl.read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![0xa1; 8192], "dirty data written before the fault");
    let mut one = vec![0u8; 4096];
    for i in 0..64u64 {
        cl.read(65536 + i * 4096, &mut one).unwrap();
        assert!(
            one.iter().all(|&b| b == i as u8 + 1),
            "write {i} reads back"
        );
    }
    let stats: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert!(
        stats["cache_errors"].as_u64().unwrap() > 0,
        "the ENOSPC errors were counted: {stats}"
    );
    drop(cl);
    // SIGTERM, without `stop("-TERM")`'s check of a clean shutdown: past
    // `--max-cache-errors` the cache failed, and its shutdown says so.
    let log = srv.stop("-15");
    std::fs::remove_file(&trigger).unwrap();
    assert!(!log.contains("dirty data lost"), "{log}");
    // Whatever the cache's state after the fault (in use, or failed and refused until
    // formatted), the acknowledged bytes are on the backing device or in the cache.
    let img = std::fs::read(&a).unwrap();
    let on_backing = img[..8192].iter().all(|&b| b == 0xa1);
    for i in 0..64usize {
        let at = 65536 + i * 4096;
        assert!(
            img[at..at + 4096].iter().all(|&b| b == i as u8 + 1),
            "write {i} (acknowledged while the cache was full) is on the backing device"
        );
    }
    if !on_backing {
        let srv = Srv::custom(dir, &args);
        let mut cl = Client::connect(&srv.uri()).unwrap();
        cl.read(0, &mut buf).unwrap();
        assert_eq!(buf, vec![0xa1; 8192], "dirty data after the restart");
        drop(cl);
        srv.stop("-TERM");
    }
}
