//! A cache pool of several cache devices from the command line (`tiercache format --cache A
//! --cache B`, `serve --cache B --cache A`; issue 15 item 2 step 2): data written over NBD reads
//! back after a clean stop and after a kill -9, with the members given in either order; the
//! refusals (--dirty-copies other than the pool's, --layout log, a member missing or foreign)
//! name the device.

mod common;

use common::{have, run, serve_refused, tmp, Srv, BIN};
use std::path::Path;
use std::process::Command;

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn format_cmd(dir: &Path, caches: &[&str], extra: &[&str]) -> std::process::Output {
    let mut c = Command::new(BIN);
    c.arg("format");
    for x in caches {
        c.arg("--cache").arg(dir.join(x));
    }
    c.arg("--backing").arg(dir.join("backing.img")).args(extra);
    c.output().unwrap()
}

fn pool_args(dir: &Path, caches: &[&str], extra: &[&str]) -> Vec<String> {
    let mut a = Vec::new();
    for x in caches {
        a.push("--cache".to_string());
        a.push(dir.join(x).display().to_string());
    }
    a.push("--backing".into());
    a.push(dir.join("backing.img").display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn serve(dir: &Path, caches: &[&str], extra: &[&str]) -> Srv {
    let a = pool_args(dir, caches, extra);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Srv::custom(dir, &a)
}

#[test]
fn pool_of_two_cache_files_round_trip_and_refusals() {
    if !have("nbdcopy") {
        tiercache_testskip::skip!("nbdcopy missing (apt install libnbd-bin)");
        return;
    }
    let d = tmp();
    let dir = d.path();
    sized(&dir.join("a.img"), 6 << 20);
    sized(&dir.join("b.img"), 9 << 20);
    sized(&dir.join("c.img"), 6 << 20);
    sized(&dir.join("backing.img"), 24 << 20);
    // --dirty-copies is 1 or 2 (2, mirrored, the default in write-back).
    let o = format_cmd(dir, &["a.img", "b.img"], &["--dirty-copies", "3"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("give 1 or 2"), "{e}");
    let o = format_cmd(dir, &["a.img", "b.img"], &["--layout", "log"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("direct layout"), "{e}");
    let o = format_cmd(
        dir,
        &["a.img", "b.img"],
        &["--mode", "write-back", "--dirty-copies", "1"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("pool of 2 cache devices"));
    // Data larger than the pool's first member, written and read over NBD.
    let data = dir.join("data");
    let bytes: Vec<u8> = (0..(12u32 << 20)).map(|i| (i ^ (i >> 9)) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let srv = serve(dir, &["b.img", "a.img"], &[]);
    run(Command::new("nbdcopy").arg(&data).arg(srv.uri()));
    let out = dir.join("out");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
    assert!(
        std::fs::read(&out).unwrap()[..bytes.len()] == bytes[..],
        "live"
    );
    // `ctl cache list`: the members in index order (a.img is member 0), both active, the
    // lines spread over both.
    let list: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["cache", "list", "--json"])).unwrap();
    let m = list.as_array().expect("a list of members");
    assert_eq!(m.len(), 2, "{list}");
    for (i, name) in ["a.img", "b.img"].iter().enumerate() {
        assert_eq!(m[i]["index"], i, "{list}");
        assert!(m[i]["path"].as_str().unwrap().ends_with(name), "{list}");
        assert_eq!(m[i]["state"], "active", "{list}");
        assert!(m[i]["lines"].as_u64().unwrap() > 0, "{list}");
    }
    let text = srv.ctl(&["cache", "list"]);
    assert!(text.contains("b.img") && text.contains("active"), "{text}");
    srv.stop("-TERM");
    // Swapped order after a clean stop, then a kill -9 with dirty data, then swapped back.
    let srv = serve(dir, &["a.img", "b.img"], &[]);
    let _ = std::fs::remove_file(&out);
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
    assert!(
        std::fs::read(&out).unwrap()[..bytes.len()] == bytes[..],
        "after a stop"
    );
    let rev: Vec<u8> = bytes.iter().rev().copied().collect();
    std::fs::write(&data, &rev).unwrap();
    run(Command::new("nbdcopy").arg(&data).arg(srv.uri()));
    srv.kill9();
    let srv = serve(dir, &["b.img", "a.img"], &[]);
    let _ = std::fs::remove_file(&out);
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
    assert!(
        std::fs::read(&out).unwrap()[..rev.len()] == rev[..],
        "after a kill -9"
    );
    srv.stop("-TERM");
    // Refusals at serve, naming the device.
    let refused = |caches: &[&str], extra: &[&str]| {
        let a = pool_args(dir, caches, extra);
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        serve_refused(dir, &a)
    };
    let e = refused(
        &["a.img", "b.img"],
        &["--mode", "write-back", "--dirty-copies", "2"],
    );
    assert!(e.contains("differs from this pool's 1"), "{e}");
    let e = refused(&["a.img", "b.img"], &["--layout", "log"]);
    assert!(e.contains("direct layout"), "{e}");
    // (An empty device given for a member counts as that member missing: a degraded start
    // when nothing would be lost, tests/pool_member_fail.rs; another pool's member is
    // refused below.)
    let e = refused(&["a.img", "a.img"], &[]);
    assert!(e.contains("given twice"), "{e}");
    // A member alone, as a one-device cache.
    let e = refused(&["a.img"], &[]);
    assert!(e.contains("member of a pool"), "{e}");
    // Write-through pools need no --dirty-copies.
    let o = format_cmd(dir, &["a.img", "c.img"], &["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = refused(
        &["c.img", "a.img"],
        &["--mode", "write-back", "--dirty-copies", "3"],
    );
    assert!(e.contains("give 1 or 2"), "{e}");
    let e = refused(&["b.img", "a.img"], &[]);
    assert!(e.contains("belongs to pool") || e.contains("member"), "{e}");
    let srv = serve(dir, &["c.img", "a.img"], &[]);
    srv.stop("-TERM");
}

/// A pool started in write-through keeps one cache copy per dirty line (the copy count is
/// fixed when the engine is built): switching one of its volumes live to write-back is
/// refused, as `ctl mode write-back` is, naming the two ways out; the pool keeps serving.
#[test]
fn a_volume_of_a_write_through_pool_is_not_switched_live_to_unmirrored_write_back() {
    let d = tmp();
    let dir = d.path();
    sized(&dir.join("a.img"), 6 << 20);
    sized(&dir.join("b.img"), 6 << 20);
    sized(&dir.join("backing.img"), 16 << 20);
    sized(&dir.join("y.img"), 16 << 20);
    let o = format_cmd(dir, &["a.img", "b.img"], &["--mode", "write-through"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Volumes x (the backing device the pool was formatted for) and y, with `extra`.
    let serve_xy = |extra: &[&str]| {
        let mut a = Vec::new();
        for (flag, v) in [
            ("--cache", "a.img"),
            ("--cache", "b.img"),
            ("--volume", "x=backing.img"),
            ("--volume", "y=y.img"),
        ] {
            let (name, file) = v.split_once('=').map_or(("", v), |(n, f)| (n, f));
            let path = dir.join(file).display().to_string();
            a.push(flag.to_string());
            a.push(if name.is_empty() {
                path
            } else {
                format!("{name}={path}")
            });
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        Srv::custom(dir, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let srv = serve_xy(&[]);
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .args(["--volume", "y", "set", "mode", "write-back"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "switched: {e}");
    assert!(
        e.contains("one cache copy") && e.contains("--dirty-copies 1"),
        "{e}"
    );
    let st = srv.stats();
    let y = st["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "y")
        .unwrap();
    assert_eq!(y["mode"], "write-through", "{st}");
    srv.stop("-TERM");
    // Given at the start, a volume's write-back mirrors the pool's dirty lines (2 copies
    // stored): from then on it switches live like any mirrored pool.
    let srv = serve_xy(&["--volume-mode", "y=write-back"]);
    let src = dir.join("src");
    std::fs::write(&src, vec![0x5a; 1 << 20]).unwrap();
    if have("nbdcopy") {
        run(Command::new("nbdcopy").arg(&src).arg(format!(
            "nbd+unix:///y?socket={}",
            dir.join("nbd.sock").display()
        )));
        let st = srv.stats();
        let dirty = st["dirty_lines"].as_u64().unwrap();
        assert!(dirty > 0, "{st}");
        assert_eq!(st["copy_slots"].as_u64().unwrap(), dirty, "mirrored: {st}");
    }
    srv.ctl(&["--volume", "x", "set", "mode", "write-back"]);
    srv.stop("-TERM");
}
