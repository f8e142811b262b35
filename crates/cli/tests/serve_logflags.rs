//! No setting is silently ignored because of the cache device's layout: `serve` of a
//! log-layout device refuses every direct-layout flag (and config-file key) by name, a
//! direct-layout device refuses the log layout's flags by name, `format` likewise, and
//! `ctl set` of a key the log layout does not have is refused.

mod common;

use common::{serve_refused, Srv, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `dir/backing.img` (8 MiB) and `dir/cache.img` (8 MiB) formatted with `fmt` (extra
/// `format` flags); returns the cache path.
fn formatted(dir: &Path, fmt: &[&str]) -> PathBuf {
    for f in ["backing.img", "cache.img"] {
        std::fs::File::create(dir.join(f))
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
    }
    let cache = dir.join("cache.img");
    let o = format(dir, fmt);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    cache
}

fn format(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("format")
        .arg("--force")
        .arg("--cache")
        .arg(dir.join("cache.img"))
        .arg("--backing")
        .arg(dir.join("backing.img"))
        .args(extra)
        .output()
        .unwrap()
}

/// `serve` of the device in `dir` with `extra`, which must refuse; its stderr.
fn refused(dir: &Path, extra: &[&str]) -> String {
    let cache = dir.join("cache.img").display().to_string();
    let backing = dir.join("backing.img").display().to_string();
    let mut args = vec!["--cache", cache.as_str(), "--backing", backing.as_str()];
    args.extend(extra);
    serve_refused(dir, &args)
}

/// Every flag the direct layout has and the log layout lacks, with a valid value.
const DIRECT_ONLY: &[&[&str]] = &[
    &["--unmap-batch", "8"],
    &["--rewrite-chunk", "1M"],
    &["--rewrite-min-runs", "3"],
    &["--cleaning", "acp"],
    &["--cleaning-age", "1000"],
    &["--writeback-rate", "auto"],
    &["--writeback-target", "0.3"],
    &["--data-checksums"],
    &["--policy", "arc"],
    &["--cleaner", "inline"],
    &["--admission", "never"],
    &["--seq-cutoff", "1m"],
    &["--clean-victim-window", "8"],
    &["--no-partial-fill"],
];

#[test]
fn log_device_refuses_each_direct_only_flag_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    formatted(d, &["--layout", "log", "--segment-size", "256k"]);
    for flag in DIRECT_ONLY {
        let e = refused(d, flag);
        assert!(
            e.contains(flag[0]) && e.contains("direct layout") && e.contains("log layout"),
            "serve {flag:?} on a log device: {e}"
        );
    }
}

#[test]
fn log_device_refuses_direct_only_config_keys_by_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    formatted(d, &["--layout", "log", "--segment-size", "256k"]);
    let conf = d.join("serve.toml");
    std::fs::write(&conf, "unmap_batch = 8\nwriteback_rate = \"auto\"\n").unwrap();
    let e = refused(d, &["--config", conf.to_str().unwrap()]);
    assert!(
        e.contains("unmap_batch")
            && e.contains("writeback_rate")
            && e.contains(conf.to_str().unwrap())
            && e.contains("direct layout"),
        "{e}"
    );
    // A flag and a file key together: each named as it was given.
    let e = refused(
        d,
        &["--config", conf.to_str().unwrap(), "--cleaning", "alru"],
    );
    assert!(e.contains("--cleaning") && e.contains("unmap_batch"), "{e}");
}

#[test]
fn direct_device_refuses_each_log_flag_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    formatted(d, &[]);
    for flag in [
        &["--segment-size", "256k"][..],
        &["--compression", "lz4"],
        &["--dedup", "1.0"],
        &["--picker", "greedy"],
        &["--dup-share", "0.5"],
        &["--erase-block", "1M"],
        &["--trim"],
        &["--free-reserve", "0.1"],
        &["--reinsert-hits", "2"],
    ] {
        let e = refused(d, flag);
        assert!(
            e.contains(flag[0]) && e.contains("log layout"),
            "serve {flag:?} on a direct device: {e}"
        );
        // `format` of the direct layout with it is refused too (before anything is written).
        let o = format(d, flag);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && e.contains(flag[0]) && e.contains("--layout log"),
            "format {flag:?}: {e}"
        );
    }
}

#[test]
fn ctl_set_of_a_key_the_log_layout_lacks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let srv = Srv::start(d, &["--layout", "log", "--segment-size", "256k"]);
    for (k, v) in [
        ("cleaning", "acp"),
        ("writeback-rate", "auto"),
        ("admission", "never"),
        ("clean-victim-window", "8"),
        ("partial-fill", "off"),
    ] {
        let o = Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&srv.ctl)
            .args(["set", k, v])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && e.contains(k) && e.contains("log layout"),
            "ctl set {k} {v} on a log volume: {e}"
        );
    }
    // And `mode` still changes live.
    srv.ctl(&["set", "mode", "write-back"]);
    assert!(srv.ctl(&["get", "mode"]).contains("write-back"));
}
