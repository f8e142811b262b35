//! A pool member missing at `serve` (issue 15 item 2, plan (d)5), from the command line: a
//! write-through pool restarted with member 1's file deleted starts degraded (warning naming
//! the member, `ctl cache list` shows it failed, every byte reads back); a write-back pool
//! (`--dirty-copies 1`) killed with dirty data is refused without member 1, naming the
//! ranges and the two ways out, and starts with `--accept-lost-dirty`, the ranges failing
//! reads until written again.

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
