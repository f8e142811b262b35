//! Each volume's own admission and sequential cutoff on a live server of several volumes
//! (issue 15 item 1): `serve --volume-admission NAME=RULE` / `--volume-seq-cutoff NAME=SIZE`
//! (and `[[volume]]` keys), `ctl --volume NAME set ...` while serving, both stored with the
//! cache so a restart keeps them; bad values refused naming the flag, the volume and the value.

mod common;

use common::{serve_refused, Srv};
use std::path::Path;
use tiercache_nbd::Client;

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// Volumes `a` and `b` (8 MiB sparse files) in a new directory; the serve arguments for them
/// on a 16 MiB cache there, then `extra`.
fn setup() -> (tempfile::TempDir, Vec<String>) {
    let dir = common::tmp();
    let d = dir.path();
    let mut args: Vec<String> = vec![
        "--cache".into(),
        d.join("cache.img").display().to_string(),
        "--format-if-needed".into(),
        "--cache-size".into(),
        "16M".into(),
    ];
    for n in ["a", "b"] {
        sized(&d.join(format!("{n}.img")), 8 << 20);
        args.push("--volume".into());
        args.push(format!("{n}={}", d.join(format!("{n}.img")).display()));
    }
    (dir, args)
}

fn serve(d: &Path, args: &[String], extra: &[&str]) -> Srv {
    let mut a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    a.extend(extra);
    Srv::custom(d, &a)
}

/// Volume `name`'s figures in `ctl stats --json`.
fn vol(srv: &Srv, name: &str) -> serde_json::Value {
    let st = srv.stats();
    st["volumes"]
        .as_array()
        .unwrap_or_else(|| panic!("no volumes in stats: {st}"))
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no volume {name}: {st}"))
}

fn cached(srv: &Srv, name: &str) -> u64 {
    vol(srv, name)["cached_lines"].as_u64().unwrap()
}

fn bypassed(srv: &Srv, name: &str, why: &str) -> u64 {
    vol(srv, name)["counters"]["bypasses"][why]
        .as_u64()
        .unwrap()
}

/// Reads `[from, to)` of export `name` in 64 KiB requests: in order (`seq`), else
/// scattered (every request far from the one before, so no stream forms).
fn read(srv: &Srv, name: &str, from: u64, to: u64, seq: bool) {
    let uri = format!("nbd+unix:///{name}?socket={}", srv.sock.display());
    let mut c = Client::connect(&uri).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let n = (to - from) / (64 << 10);
    for i in 0..n {
        let k = if seq { i } else { (i * 7) % n };
        c.read(from + k * (64 << 10), &mut buf).unwrap();
    }
    c.disconnect().unwrap();
}

fn get(srv: &Srv, name: &str, key: &str) -> String {
    srv.ctl(&["--volume", name, "get", key]).trim().to_string()
}

/// `--volume-admission a=never`: a's read misses are not cached while b's are; `ctl --volume
/// a set admission always` caches a's from then on; a restart keeps what ctl set (stored
/// with the cache), and a flag given at the restart wins over the stored value.
#[test]
fn admission_per_volume_is_live_and_stored() {
    let (dir, args) = setup();
    let d = dir.path();
    let srv = serve(d, &args, &["--volume-admission", "a=never"]);
    assert_eq!(get(&srv, "a", "admission"), "never");
    assert_eq!(get(&srv, "b", "admission"), "always");
    read(&srv, "a", 0, 1 << 20, false);
    read(&srv, "b", 0, 1 << 20, false);
    assert_eq!(cached(&srv, "a"), 0, "{}", vol(&srv, "a"));
    assert!(bypassed(&srv, "a", "admission") >= 16, "{}", vol(&srv, "a"));
    assert_eq!(cached(&srv, "b"), 256, "{}", vol(&srv, "b"));
    assert_eq!(bypassed(&srv, "b", "admission"), 0);
    // Live: a admits from now on, b stops.
    let t = srv.ctl(&["--volume", "a", "set", "admission", "always"]);
    assert!(t.contains("volume a: admission: never -> always"), "{t}");
    srv.ctl(&["--volume", "b", "set", "admission", "never"]);
    read(&srv, "a", 1 << 20, 2 << 20, false);
    read(&srv, "b", 1 << 20, 2 << 20, false);
    assert_eq!(cached(&srv, "a"), 256, "{}", vol(&srv, "a"));
    assert_eq!(
        cached(&srv, "b"),
        256,
        "b admits nothing more: {}",
        vol(&srv, "b")
    );
    srv.stop("-TERM");

    // Restarted without the flag: what ctl set is stored with the cache.
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "a", "admission"), "always");
    assert_eq!(get(&srv, "b", "admission"), "never");
    let (a0, b0) = (cached(&srv, "a"), cached(&srv, "b"));
    read(&srv, "a", 2 << 20, 3 << 20, false);
    read(&srv, "b", 2 << 20, 3 << 20, false);
    assert_eq!(cached(&srv, "a"), a0 + 256);
    assert_eq!(cached(&srv, "b"), b0, "{}", vol(&srv, "b"));
    // `pool`: b follows the pool's admission again (and that is stored too).
    srv.ctl(&["--volume", "b", "set", "admission", "pool"]);
    read(&srv, "b", 3 << 20, 4 << 20, false);
    assert_eq!(cached(&srv, "b"), b0 + 256);
    srv.stop("-TERM");

    // A flag at the restart wins over the stored value (and is stored in its place).
    let srv = serve(d, &args, &["--volume-admission", "a=nhit:2"]);
    assert_eq!(get(&srv, "a", "admission"), "nhit:2");
    assert_eq!(get(&srv, "b", "admission"), "always");
    srv.stop("-TERM");
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "a", "admission"), "nhit:2");
    srv.stop("-TERM");
}

/// `--volume-seq-cutoff a=256k`: a sequential stream on a stops being cached after 256 KiB,
/// the same stream on b is cached whole; `ctl --volume NAME set seq-cutoff` turns a's off
/// and b's on live, and a restart keeps both; so with the mode ctl sets, until a
/// `--volume-mode` takes over.
#[test]
fn seq_cutoff_per_volume_is_live_and_stored() {
    let (dir, args) = setup();
    let d = dir.path();
    let srv = serve(d, &args, &["--volume-seq-cutoff", "a=256k"]);
    assert_eq!(get(&srv, "a", "seq-cutoff"), "256KiB");
    assert_eq!(get(&srv, "b", "seq-cutoff"), "0");
    read(&srv, "a", 0, 4 << 20, true);
    read(&srv, "b", 0, 4 << 20, true);
    assert!(cached(&srv, "a") <= 128, "{}", vol(&srv, "a"));
    assert!(
        bypassed(&srv, "a", "seq_cutoff") >= 32,
        "{}",
        vol(&srv, "a")
    );
    assert_eq!(cached(&srv, "b"), 1024, "{}", vol(&srv, "b"));
    assert_eq!(bypassed(&srv, "b", "seq_cutoff"), 0);
    // Live: a's cutoff off (its next stream is cached whole), b's on.
    let t = srv.ctl(&["--volume", "a", "set", "seq-cutoff", "0"]);
    assert!(t.contains("volume a: seq-cutoff: 256KiB -> 0"), "{t}");
    let a0 = cached(&srv, "a");
    read(&srv, "a", 4 << 20, 8 << 20, true);
    assert_eq!(cached(&srv, "a"), a0 + 1024, "{}", vol(&srv, "a"));
    srv.ctl(&["--volume", "b", "set", "seq-cutoff", "128k"]);
    srv.ctl(&["--volume", "b", "set", "mode", "write-back"]);
    srv.stop("-TERM");
    // Restarted without flags: both as ctl left them.
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "a", "seq-cutoff"), "0");
    assert_eq!(get(&srv, "b", "seq-cutoff"), "128KiB");
    let b0 = cached(&srv, "b");
    read(&srv, "b", 4 << 20, 8 << 20, true);
    assert!(cached(&srv, "b") <= b0 + 64, "{}", vol(&srv, "b"));
    assert!(
        bypassed(&srv, "b", "seq_cutoff") >= 32,
        "{}",
        vol(&srv, "b")
    );
    // The mode ctl set is stored too; --volume-mode is this run's and drops it: restarted
    // without it, the volume follows the pool's mode (as before modes were stored).
    assert_eq!(get(&srv, "b", "mode"), "write-back");
    assert_eq!(get(&srv, "a", "mode"), "write-through");
    srv.stop("-TERM");
    let srv = serve(d, &args, &["--volume-mode", "b=read-only"]);
    assert_eq!(get(&srv, "b", "mode"), "read-only");
    srv.stop("-TERM");
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "b", "mode"), "write-through");
    assert_eq!(get(&srv, "b", "seq-cutoff"), "128KiB");
    srv.stop("-TERM");
}

/// Bad values and names are refused at start naming the flag, the volume and the value; the
/// config file's `[[volume]]` tables take `admission` and `seq_cutoff`.
#[test]
fn volume_settings_refused_by_name_and_taken_from_the_config_file() {
    let (dir, args) = setup();
    let d = dir.path();
    let refused = |extra: &[&str]| {
        let mut a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        a.extend(extra);
        serve_refused(d, &a)
    };
    let e = refused(&["--volume-admission", "a=sometimes"]);
    assert!(
        e.contains("--volume-admission a=sometimes")
            && e.contains("volume a")
            && e.contains("\"sometimes\""),
        "{e}"
    );
    let e = refused(&["--volume-seq-cutoff", "b=lots"]);
    assert!(
        e.contains("--volume-seq-cutoff b=lots") && e.contains("volume b") && e.contains("lots"),
        "{e}"
    );
    let e = refused(&["--volume-admission", "c=never"]);
    assert!(e.contains("no --volume named \"c\""), "{e}");
    let e = refused(&["--volume-admission", "never"]);
    assert!(e.contains("NAME=VALUE"), "{e}");

    let conf = d.join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "cache = \"{}\"\nformat_if_needed = true\ncache_size = \"16M\"\n[[volume]]\nname = \"a\"\nbacking = \"{}\"\nadmission = \"never\"\nseq_cutoff = \"1m:64k\"\nshare = \"10%:0.5\"\n[[volume]]\nname = \"b\"\nbacking = \"{}\"\nmode = \"write-back\"\n",
            d.join("cache.img").display(),
            d.join("a.img").display(),
            d.join("b.img").display()
        ),
    )
    .unwrap();
    let srv = Srv::custom(d, &["--config", conf.to_str().unwrap()]);
    assert_eq!(get(&srv, "a", "admission"), "never");
    assert_eq!(get(&srv, "a", "seq-cutoff"), "1MiB");
    assert_eq!(get(&srv, "a", "seq-cutoff-write"), "64KiB");
    assert_eq!(get(&srv, "a", "share"), "10%:50%");
    assert_eq!(get(&srv, "b", "mode"), "write-back");
    assert_eq!(get(&srv, "b", "admission"), "always");
    srv.stop("-TERM");
}

/// A volume added live keeps the mode `ctl --volume NAME set mode` gives it across a restart
/// (its table entry records it); the pool's `ctl mode` makes every volume follow the pool,
/// at the next start too.
#[test]
fn modes_set_by_ctl_on_added_volumes_and_by_the_pool_survive_a_restart() {
    let (dir, args) = setup();
    let d = dir.path();
    sized(&d.join("c.img"), 8 << 20);
    let srv = serve(d, &args, &[]);
    let c = format!("c={}", d.join("c.img").display());
    srv.ctl(&["volume", "add", &c, "--mode", "write-back"]);
    assert_eq!(get(&srv, "c", "mode"), "write-back");
    srv.ctl(&["--volume", "c", "set", "mode", "read-only"]);
    srv.ctl(&["--volume", "b", "set", "mode", "write-back"]);
    srv.stop("-TERM");
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "c", "mode"), "read-only");
    assert_eq!(get(&srv, "b", "mode"), "write-back");
    assert_eq!(get(&srv, "a", "mode"), "write-through");
    // The pool's mode for every volume, stored so.
    srv.ctl(&["mode", "write-around"]);
    srv.stop("-TERM");
    let srv = serve(d, &args, &[]);
    for n in ["a", "b", "c"] {
        assert_eq!(get(&srv, n, "mode"), "write-around", "volume {n}");
    }
    srv.stop("-TERM");
}

/// `tiercache ctl ARGS` against `srv` that must fail: its stderr.
fn ctl_fails(srv: &Srv, args: &[&str]) -> String {
    let out = std::process::Command::new(common::BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap();
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "ctl {args:?} succeeded: {err}");
    err
}

/// `--volume-share a=0:0.25`: volume a, read whole (8 MiB, half the 16 MiB cache), holds at
/// most a quarter of the cache's lines (`ctl stats`: `cached_lines <= share_max_lines`),
/// while b's lines are cached beside it; `ctl --volume a set share 0:1` lets a grow; the
/// bound is stored with the cache (a restart keeps what ctl set); bad values are refused
/// naming the volume and the value, and changing nothing.
#[test]
fn share_per_volume_bounds_occupancy_live_and_is_stored() {
    let (dir, args) = setup();
    let d = dir.path();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let srv = serve(
        d,
        &args,
        &["--volume-share", "a=0:0.25", "--metrics", &metrics],
    );
    assert_eq!(get(&srv, "a", "share"), "0%:25%");
    assert_eq!(get(&srv, "b", "share"), "pool");
    let cap = srv.stats()["capacity_lines"].as_u64().unwrap();
    let max = vol(&srv, "a")["share_max_lines"].as_u64().unwrap();
    assert_eq!(max, cap / 4, "{}", vol(&srv, "a"));
    assert!(
        2048 > max + 256,
        "the test needs a's 2048 lines well above a quarter: {cap}"
    );
    read(&srv, "b", 0, 2 << 20, false);
    read(&srv, "a", 0, 8 << 20, false);
    let a = cached(&srv, "a");
    assert!(
        a <= max && a + 16 >= max,
        "a holds {a} lines of {cap}, max {max}"
    );
    assert_eq!(cached(&srv, "b"), 512, "b's lines stay: {}", vol(&srv, "b"));
    // Prometheus has the bound too (and the volume's lines).
    let m = common::metrics(&metrics);
    assert!(
        m.contains(&format!(
            "tiercache_volume_share_max_lines{{volume=\"a\"}} {max}"
        )),
        "{m}"
    );
    // Bad values change nothing.
    let e = ctl_fails(&srv, &["--volume", "a", "set", "share", "0.5:0.2"]);
    assert!(e.contains("volume a") && e.contains("above maximum"), "{e}");
    srv.ctl(&["--volume", "b", "set", "share", "70%:100%"]);
    let e = ctl_fails(&srv, &["--volume", "a", "set", "share", "0.4:1"]);
    assert!(e.contains("minimum shares add up"), "{e}");
    assert_eq!(get(&srv, "a", "share"), "0%:25%");
    srv.ctl(&["--volume", "b", "set", "share", "pool"]);
    // Live: a may grow now.
    let t = srv.ctl(&["--volume", "a", "set", "share", "0:1"]);
    assert!(t.contains("share: 0%:25% -> 0%:100%"), "{t}");
    read(&srv, "a", 0, 8 << 20, false);
    let grown = cached(&srv, "a");
    assert!(
        grown > max + 256,
        "a holds {grown} lines, was capped at {max}"
    );
    // Lowered again: the excess goes as lines are inserted (b's reads here, while slots are
    // free), one of a's per insert.
    srv.ctl(&["--volume", "a", "set", "share", "0:20%"]);
    read(&srv, "b", 2 << 20, 8 << 20, false);
    let low = vol(&srv, "a");
    assert!(
        low["cached_lines"].as_u64().unwrap() <= low["share_max_lines"].as_u64().unwrap(),
        "{low}"
    );
    srv.stop("-TERM");

    // Restarted without the flag: the share ctl set is stored with the cache.
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "a", "share"), "0%:20%");
    assert_eq!(vol(&srv, "a")["share"], "0%:20%");
    srv.stop("-TERM");
    // A flag at the restart wins; `pool` drops the bound (stored too).
    let srv = serve(d, &args, &["--volume-share", "a=5%:50%"]);
    assert_eq!(get(&srv, "a", "share"), "5%:50%");
    srv.ctl(&["--volume", "a", "set", "share", "pool"]);
    srv.stop("-TERM");
    let srv = serve(d, &args, &[]);
    assert_eq!(get(&srv, "a", "share"), "pool");
    srv.stop("-TERM");
    // Serve flags refused by name.
    let mut a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    a.extend(["--volume-share", "a=60%:40%"]);
    let e = serve_refused(d, &a);
    assert!(
        e.contains("--volume-share a=60%:40%") && e.contains("volume a"),
        "{e}"
    );
    let mut a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    a.extend(["--volume-share", "a=0.6:1", "--volume-share", "b=0.6:1"]);
    let e = serve_refused(d, &a);
    assert!(e.contains("minimum shares add up"), "{e}");
}
