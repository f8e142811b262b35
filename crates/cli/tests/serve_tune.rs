//! Issue 19 items 2, 3 and the FUA bullet, through the real binary: the engine settings
//! `sim` takes are `serve` flags (sequential cutoff counts bypasses live), `ctl set/get`
//! change and show them on a running volume (and a restart keeps them), `ctl stats --reset`
//! zeroes the counters, and a FUA write to a write-back volume is made durable in the cache,
//! not on the backing device.

mod common;

use common::{have, run, Srv, BIN};
use std::path::Path;
use std::process::Command;

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn backing(dir: &Path, mb: u64, random: bool) {
    let p = dir.join("backing.img");
    if random {
        run(Command::new("head")
            .args(["-c", &format!("{}", mb << 20), "/dev/urandom"])
            .stdout(std::fs::File::create(&p).unwrap()));
    } else {
        std::fs::File::create(&p)
            .unwrap()
            .set_len(mb << 20)
            .unwrap();
    }
}

/// Reads the whole volume with nbdcopy (one sequential copy).
fn copy_out(srv: &Srv, dir: &Path) {
    let out = dir.join("out.img");
    let _ = std::fs::remove_file(&out);
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
}

/// `ctl ARGS` that must fail; returns its stderr.
fn ctl_fails(srv: &Srv, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "ctl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A 64 MiB sequential copy out of a live cache with `--seq-cutoff 1m` (the flag `sim` takes)
/// sends the stream's misses around the cache: sequential-cutoff bypasses are counted, and
/// the cache holds little of the copy.
#[test]
fn sequential_copy_counts_seq_cutoff_bypasses() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    backing(d, 64, true);
    let srv = Srv::sized(d, "128M", &["--seq-cutoff", "1m"]);
    copy_out(&srv, d);
    let st = srv.stats();
    let t = &st["totals"];
    let (bypassed, misses) = (n(&t["bypasses"]["seq_cutoff"]), n(&t["line_misses"]));
    assert_eq!(misses, 16384, "every line of the copy missed once: {t}");
    assert!(
        bypassed >= misses / 4,
        "a 64 MiB sequential copy with --seq-cutoff 1m: {bypassed} of {misses} misses bypassed: {t}"
    );
    assert_eq!(n(&st["settings"]["seq_cutoff_read"]), 1 << 20, "{st}");
    assert!(n(&st["cached_lines"]) <= misses - bypassed, "{st}");
    assert!(srv.ctl(&["stats"]).contains("seq-cutoff 1MiB read"));
    srv.stop("-TERM");
}

/// `ctl set/get` and `stats --reset` on a running volume: admission never stops misses from
/// populating (counted as admission bypasses), always populates again; reset zeroes the
/// counters; values and errors are clear; a restart keeps what was set.
#[test]
fn ctl_set_get_and_reset_through_the_binary() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    backing(d, 16, true);
    let srv = Srv::sized(d, "32M", &[]);
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "always");
    assert_eq!(
        srv.ctl(&["set", "admission", "never"]).trim(),
        "admission: always -> never"
    );
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "never");
    copy_out(&srv, d);
    let t = srv.stats()["totals"].clone();
    assert_eq!(n(&t["line_misses"]), 4096, "{t}");
    assert_eq!(
        n(&t["insertions"]),
        0,
        "admission never: nothing populated: {t}"
    );
    assert_eq!(n(&t["bypasses"]["admission"]), 4096, "{t}");
    // Reset: counters zero, contents untouched.
    srv.ctl(&["stats", "--reset"]);
    let st = srv.stats();
    for k in ["requests", "line_misses", "line_hits", "read_bytes"] {
        assert_eq!(n(&st["totals"][k]), 0, "{k} after --reset: {st}");
    }
    srv.ctl(&["set", "admission", "always"]);
    copy_out(&srv, d);
    let t = srv.stats()["totals"].clone();
    assert_eq!(n(&t["insertions"]), 4096, "admission always again: {t}");
    // Settings show in text stats, JSON stats and get.
    srv.ctl(&["set", "seq-cutoff", "256k"]);
    srv.ctl(&["set", "admission", "nhit:2:1"]);
    srv.ctl(&["set", "dirty-high", "0.9"]);
    let st = srv.stats();
    assert_eq!(st["settings"]["admission"], "nhit:2:1", "{st}");
    assert_eq!(n(&st["settings"]["changes"]), 5, "{st}");
    assert!(srv
        .ctl(&["stats"])
        .contains("admission nhit:2:1, seq-cutoff 256KiB read"));
    let all = srv.ctl(&["get"]);
    assert!(all.contains("dirty-high        0.9"), "{all}");
    // Bad keys and values: clear errors, nothing changed.
    let e = ctl_fails(&srv, &["set", "admision", "never"]);
    assert!(
        e.contains("unknown setting") && e.contains("admission"),
        "{e}"
    );
    let e = ctl_fails(&srv, &["set", "admission", "sometimes"]);
    assert!(e.contains("nhit:READ:WRITE"), "{e}");
    let e = ctl_fails(&srv, &["set", "dirty-low", "0.95"]);
    assert!(e.contains("dirty_low (0.95) <= dirty_high (0.9)"), "{e}");
    let e = ctl_fails(&srv, &["set", "line-size", "8k"]);
    assert!(e.contains("fixed at format"), "{e}");
    let e = ctl_fails(&srv, &["get", "colour"]);
    assert!(e.contains("unknown setting"), "{e}");
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "nhit:2:1");
    // The mode goes through `set` too.
    assert_eq!(
        srv.ctl(&["set", "mode", "wb"]).trim(),
        "mode: write-through -> write-back"
    );
    let log = srv.stop("-TERM");
    assert!(log.contains("setting admission: always -> never"), "{log}");
    // A log going to a file (or journald) carries no terminal colour codes.
    assert!(
        !log.contains('\x1b'),
        "ANSI escapes in a log that is not a terminal: {log:?}"
    );
    // A restart keeps what was set (stored in the superblock).
    let srv = Srv::sized(d, "32M", &[]);
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "nhit:2:1");
    assert_eq!(srv.ctl(&["get", "seq-cutoff"]).trim(), "256KiB");
    assert_eq!(srv.ctl(&["get", "mode"]).trim(), "write-back");
    srv.stop("-TERM");
    // Flags of a later run win (and are stored in turn).
    let srv = Srv::sized(d, "32M", &["--admission", "always"]);
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "always");
    assert_eq!(srv.ctl(&["get", "dirty-high"]).trim(), "0.9");
    srv.stop("-TERM");
}

/// The cleaner's settings changed live (`cleaning`, `cleaning-age`, `writeback-rate`,
/// `writeback-target`) belong to the device as the engine's do: stored in the superblock's
/// settings block, so a kill -9 and a restart without flags keep them; a later run's flag
/// wins and the others stay.
#[test]
fn cleaner_settings_set_live_survive_kill9() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    backing(d, 16, false);
    let srv = Srv::sized(d, "32M", &["--mode", "wb"]);
    srv.ctl(&["set", "cleaning", "alru"]);
    srv.ctl(&["set", "cleaning-age", "5000"]);
    srv.ctl(&["set", "writeback-rate", "300"]);
    srv.ctl(&["set", "writeback-target", "0.25"]);
    srv.kill9();
    let srv = Srv::sized(d, "32M", &[]);
    assert_eq!(srv.ctl(&["get", "cleaning"]).trim(), "alru");
    assert_eq!(srv.ctl(&["get", "cleaning-age"]).trim(), "5000");
    assert_eq!(srv.ctl(&["get", "writeback-rate"]).trim(), "300");
    assert_eq!(srv.ctl(&["get", "writeback-target"]).trim(), "0.25");
    srv.kill9();
    let srv = Srv::sized(d, "32M", &["--cleaning", "acp"]);
    assert_eq!(srv.ctl(&["get", "cleaning"]).trim(), "acp");
    assert_eq!(srv.ctl(&["get", "writeback-rate"]).trim(), "300");
    srv.stop("-TERM");
}

/// `belady` needs the future: format and serve refuse it, saying so.
#[test]
fn offline_policy_is_refused_live() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    backing(d, 4, false);
    let cache = d.join("cache.img").display().to_string();
    let b = d.join("backing.img").display().to_string();
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let out = Command::new(BIN)
        .args([
            "format",
            "--cache",
            &cache,
            "--backing",
            &b,
            "--policy",
            "belady",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("offline"), "{e}");
    let args = [
        "--cache",
        &cache,
        "--backing",
        &b,
        "--format-if-needed",
        "--policy",
        "belady",
    ];
    let e = common::serve_refused(d, &args);
    assert!(e.contains("offline") && e.contains("tiercache sim"), "{e}");
}

/// FUA in write-back: durable in the cache (data and record), as FLUSH makes it, and not
/// sent to the backing device: the backing file stays unchanged, and after kill -9 and a
/// restart the data reads back.
#[test]
fn write_back_fua_is_durable_in_the_cache_not_on_backing() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    backing(d, 16, false);
    let srv = Srv::sized(d, "8M", &["--mode", "write-back"]);
    let data: Vec<u8> = (0..64 << 10).map(|i| (i * 7 + 3) as u8).collect();
    {
        let mut c = tiercache_nbd::Client::connect(&srv.uri()).unwrap();
        for (i, off) in [0u64, 1 << 20, 5 << 20].into_iter().enumerate() {
            let h = c.submit_write(off, &data[..(16 << 10) << i], true).unwrap();
            c.wait(h).unwrap().result.unwrap();
        }
    }
    let mut via_qemu = false;
    if have("qemu-io") {
        // qemu-io sends FUA on its writes (its default cache mode is writethrough).
        run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0xab 8M 64k", &srv.uri()]));
        via_qemu = true;
    }
    let st = srv.stats();
    assert_eq!(n(&st["totals"]["write_backs"]), 0, "{st}");
    assert!(
        n(&st["dirty_lines"]) >= 4 + 8 + 16,
        "FUA writes are dirty cache lines: {st}"
    );
    srv.kill9();
    let on_backing = std::fs::read(d.join("backing.img")).unwrap();
    assert!(
        on_backing.iter().all(|&b| b == 0),
        "a FUA write in write-back reached the backing device"
    );
    let srv = Srv::sized(d, "8M", &[]);
    let mut c = tiercache_nbd::Client::connect(&srv.uri()).unwrap();
    for (i, off) in [0u64, 1 << 20, 5 << 20].into_iter().enumerate() {
        let len = (16 << 10) << i;
        let h = c.submit_read(off, len as u32).unwrap();
        let got = c.wait(h).unwrap();
        got.result.unwrap();
        assert!(got.data == data[..len], "FUA data at {off} lost by kill -9");
    }
    if via_qemu {
        let out = run(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "read -P 0xab 8M 64k",
            &srv.uri(),
        ]));
        assert!(!out.contains("fail"), "qemu-io's FUA write lost: {out}");
    }
    drop(c);
    srv.stop("-TERM");
}
