//! A pool member missing at `serve` (issue 15 item 2, plan (d)5), from the command line: a
//! write-through pool restarted with member 1's file deleted starts degraded (warning naming
//! the member, `ctl cache list` shows it failed, every byte reads back); a write-back pool
//! (`--dirty-copies 1`) killed with dirty data is refused without member 1, naming the
//! ranges and the two ways out, and starts with `--accept-lost-dirty`, the ranges failing
//! reads until written again. A write-back pool with two dirty copies (the default) killed
//! with dirty data starts degraded without member 1 (every dirty line has its copy on
//! member 0), and once `ctl cache replace` re-mirrored onto a new member, without member 0.

mod common;

use common::{have, run, serve_refused, tmp, Srv, BIN};
use std::path::Path;
use std::process::Command;

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = Vec::new();
    for x in ["a.img", "b.img"] {
        a.push("--cache".to_string());
        a.push(dir.join(x).display().to_string());
    }
    a.push("--backing".into());
    a.push(dir.join("backing.img").display().to_string());
    a.push("--state-dir".into());
    a.push(dir.join("state").display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn serve(dir: &Path, extra: &[&str]) -> Srv {
    let a = args(dir, extra);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Srv::custom(dir, &a)
}

/// A pool of two 6 MiB members over a 24 MiB backing file, formatted with `extra`, `mib`
/// MiB written over NBD (lines spread over both members). Returns the data.
fn pool_with_data(dir: &Path, extra: &[&str], serve_extra: &[&str], mib: u32) -> (Srv, Vec<u8>) {
    sized(&dir.join("a.img"), 6 << 20);
    sized(&dir.join("b.img"), 6 << 20);
    sized(&dir.join("backing.img"), 24 << 20);
    let mut c = Command::new(BIN);
    c.arg("format");
    for x in ["a.img", "b.img"] {
        c.arg("--cache").arg(dir.join(x));
    }
    let o = c
        .arg("--backing")
        .arg(dir.join("backing.img"))
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes: Vec<u8> = (0..(mib << 20)).map(|i| (i ^ (i >> 9)) as u8).collect();
    let data = dir.join("data");
    std::fs::write(&data, &bytes).unwrap();
    let srv = serve(dir, serve_extra);
    // Flushed: acknowledged as durable (what a kill -9 must not lose).
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&data)
        .arg(srv.uri()));
    (srv, bytes)
}

fn read_all(srv: &Srv, out: &Path) -> std::process::Output {
    let _ = std::fs::remove_file(out);
    Command::new("nbdcopy")
        .arg(srv.uri())
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn write_through_pool_starts_without_a_deleted_member() {
    if !have("nbdcopy") {
        tiercache_testskip::skip!("nbdcopy missing (apt install libnbd-bin)");
        return;
    }
    let d = tmp();
    let dir = d.path();
    let (srv, bytes) = pool_with_data(dir, &["--mode", "write-through"], &[], 12);
    srv.stop("-TERM");
    std::fs::remove_file(dir.join("b.img")).unwrap();
    let srv = serve(dir, &[]);
    let list: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["cache", "list", "--json"])).unwrap();
    let m = list.as_array().expect("a list of members");
    assert_eq!(
        (m[0]["state"].as_str(), m[1]["state"].as_str()),
        (Some("active"), Some("failed")),
        "{list}"
    );
    let out = dir.join("out");
    let o = read_all(&srv, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&out).unwrap()[..bytes.len()] == bytes[..],
        "degraded: every byte reads back"
    );
    let log = srv.stop("-TERM");
    assert!(
        log.contains("pool member 1")
            && log.contains("b.img")
            && log.contains("starting degraded without it"),
        "{log}"
    );
    // Restarted again (b.img still gone): member 1 failed earlier, no new warning needed.
    let srv = serve(dir, &[]);
    let o = read_all(&srv, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&out).unwrap()[..bytes.len()] == bytes[..]);
    srv.stop("-TERM");
}

#[test]
fn write_back_pool_without_a_member_holding_dirty_data_is_refused_unless_accepted() {
    if !have("nbdcopy") {
        tiercache_testskip::skip!("nbdcopy missing (apt install libnbd-bin)");
        return;
    }
    let d = tmp();
    let dir = d.path();
    let (srv, _) = pool_with_data(
        dir,
        &["--mode", "write-back", "--dirty-copies", "1"],
        // No cleaning below the watermarks: the lines stay dirty until the kill.
        &["--writeback-rate", "off"],
        4,
    );
    srv.kill9();
    std::fs::remove_file(dir.join("b.img")).unwrap();
    let a = args(dir, &[]);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let e = serve_refused(dir, &a);
    assert!(
        e.contains("pool member 1")
            && e.contains("b.img")
            && e.contains("may hold dirty lines")
            && e.contains(&format!("volume bytes 0..{}", 24 << 20))
            && e.contains("bring the device back")
            && e.contains("--accept-lost-dirty"),
        "{e}"
    );
    let srv = serve(dir, &["--accept-lost-dirty"]);
    let out = dir.join("out");
    let o = read_all(&srv, &out);
    assert!(!o.status.success(), "the lost ranges read back");
    // Written again (flushed): readable again.
    let fresh: Vec<u8> = (0..(24u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("fresh"), &fresh).unwrap();
    run(Command::new("nbdcopy")
        .arg(dir.join("fresh"))
        .arg(srv.uri()));
    let o = read_all(&srv, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&out).unwrap() == fresh, "rewritten");
    srv.stop("-TERM");
}

/// `serve` on the pool of the cache files `members` (in `dir`), write-back, no cleaning.
fn serve_members(dir: &Path, members: [&str; 2]) -> Srv {
    let mut a = Vec::new();
    for x in members {
        a.push("--cache".to_string());
        a.push(dir.join(x).display().to_string());
    }
    for x in ["--backing", "backing.img"] {
        a.push(match x {
            "backing.img" => dir.join(x).display().to_string(),
            _ => x.to_string(),
        });
    }
    a.push("--state-dir".into());
    a.push(dir.join("state").display().to_string());
    for x in ["--mode", "write-back", "--writeback-rate", "off"] {
        a.push(x.into());
    }
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Srv::custom(dir, &a)
}

fn unmirrored(srv: &Srv) -> f64 {
    common::find_num(&srv.stats(), "unmirrored_lines").expect("unmirrored_lines in ctl stats")
}

/// Plan (d)5 with two dirty copies (the default in write-back): data written and flushed
/// over NBD, the server killed with the lines dirty (`--writeback-rate off`), b.img (the
/// copies' member, flagged `may_dirty`) deleted: `serve` starts degraded (before the
/// `may_single` flag it was refused as for `--dirty-copies 1`), every byte
/// reads back, `ctl cache list` shows member 1 failed. `ctl cache replace 1 new.img` and the
/// re-mirror (`unmirrored_lines` 0) make every dirty line mirrored again, so after a second
/// kill a start WITHOUT member 0 (a.img deleted) goes on too and reads every byte.
#[test]
fn write_back_pool_with_mirrored_dirty_lines_starts_without_either_member() {
    if !have("nbdcopy") {
        tiercache_testskip::skip!("nbdcopy missing (apt install libnbd-bin)");
        return;
    }
    let d = tmp();
    let dir = d.path();
    let (srv, bytes) = pool_with_data(
        dir,
        &["--mode", "write-back"],
        &["--writeback-rate", "off"],
        4,
    );
    assert_eq!(unmirrored(&srv), 0.0, "every dirty line mirrored");
    // (Lines fill member 0 first: their copies are member 1's dirty records.)
    let st = srv.stats();
    assert!(
        st["dirty_lines"].as_f64().unwrap_or(0.0) > 0.0
            && st["copy_slots"].as_f64() == st["dirty_lines"].as_f64(),
        "dirty lines, each with its copy: {st}"
    );
    srv.kill9();
    std::fs::remove_file(dir.join("b.img")).unwrap();
    let srv = serve_members(dir, ["a.img", "b.img"]);
    let list: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["cache", "list", "--json"])).unwrap();
    assert_eq!(
        (list[0]["state"].as_str(), list[1]["state"].as_str()),
        (Some("active"), Some("failed")),
        "{list}"
    );
    let out = dir.join("out");
    let o = read_all(&srv, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&out).unwrap()[..bytes.len()] == bytes[..],
        "degraded: every byte reads back"
    );
    let st = srv.stats();
    assert_eq!(st["lost_dirty_bytes"], 0, "nothing lost: {st}");
    sized(&dir.join("new.img"), 6 << 20);
    let new = dir.join("new.img").display().to_string();
    let r = srv.ctl(&["cache", "replace", "1", &new]);
    assert!(r.contains("is pool member 1 now"), "{r}");
    let t = std::time::Instant::now();
    while unmirrored(&srv) > 0.0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "unmirrored_lines still {} after 10 s: {}",
            unmirrored(&srv),
            srv.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A flushed write makes the re-mirrored copies' records durable.
    let head: Vec<u8> = (0..(64u32 << 10)).map(|i| (i % 249) as u8 ^ 0x33).collect();
    std::fs::write(dir.join("head"), &head).unwrap();
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(dir.join("head"))
        .arg(srv.uri()));
    let mut second = bytes.clone();
    second[..head.len()].copy_from_slice(&head);
    let log = srv.stop("-KILL");
    assert!(
        log.contains("pool member 1")
            && log.contains("b.img")
            && log.contains("each mirrored on another member")
            && log.contains("served from their copies"),
        "{log}"
    );
    std::fs::remove_file(dir.join("a.img")).unwrap();
    let srv = serve_members(dir, ["a.img", "new.img"]);
    let list: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["cache", "list", "--json"])).unwrap();
    assert_eq!(
        (list[0]["state"].as_str(), list[1]["state"].as_str()),
        (Some("failed"), Some("active")),
        "{list}"
    );
    let o = read_all(&srv, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&out).unwrap()[..second.len()] == second[..],
        "without member 0: every byte reads back"
    );
    let log = srv.stop("-TERM");
    assert!(
        log.contains("pool member 0")
            && log.contains("a.img")
            && log.contains("each mirrored on another member"),
        "a.img held dirty records (lines or copies), all mirrored: {log}"
    );
}
