//! `tiercache ctl cache replace INDEX PATH` (issue 15 item 2, docs/plan-multi-cache.md (d)6):
//! a write-back pool of two members whose member 1 (an NBD export behind nbdkit's error
//! filter) starts failing every request is failed live, leaving dirty lines with one copy
//! (`unmirrored_lines`); the replace refuses an active member and a member's own path
//! (naming them), then formats new.img as member 1, and the cleaner re-mirrors onto it
//! (`unmirrored_lines` 0 within seconds; without the re-mirror it stays above 0 with
//! `--writeback-rate off`). Every byte reads back, and a clean restart with a.img and
//! new.img serves everything. Skips loudly without nbdkit or nbdcopy.

mod common;

use common::{failing_pool_member, format_write_back_pool, have, run, tmp, Srv, BIN};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn serve(dir: &Path, b: &str) -> Srv {
    let a = dir.join("a.img").display().to_string();
    let backing = dir.join("backing.img").display().to_string();
    let state = dir.join("state").display().to_string();
    Srv::custom(
        dir,
        &[
            "--cache",
            &a,
            "--cache",
            b,
            "--backing",
            &backing,
            "--state-dir",
            &state,
            "--mode",
            "write-back",
            // Lines stay dirty: only the re-mirror can make them mirrored again.
            "--writeback-rate",
            "off",
            // A member is failed at its first error.
            "--max-cache-errors",
            "1",
        ],
    )
}

fn ctl_fails(srv: &Srv, args: &[&str]) -> String {
    let o = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap();
    assert!(!o.status.success(), "ctl {args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_all(uri: &str, out: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(out);
    run(Command::new("nbdcopy").arg(uri).arg(out));
    std::fs::read(out).unwrap()
}

fn unmirrored(srv: &Srv) -> f64 {
    common::find_num(&srv.stats(), "unmirrored_lines").expect("unmirrored_lines in ctl stats")
}

#[test]
fn ctl_cache_replace_mirrors_onto_the_new_member_and_restarts_with_it() {
    if !have("nbdkit") || !have("nbdcopy") {
        tiercache_testskip::skip!("nbdkit or nbdcopy missing (apt install nbdkit libnbd-bin)");
        return;
    }
    let d = tmp();
    let dir = d.path();
    sized(&dir.join("a.img"), 6 << 20);
    sized(&dir.join("b.img"), 6 << 20);
    sized(&dir.join("new.img"), 6 << 20);
    sized(&dir.join("backing.img"), 24 << 20);
    let trigger = dir.join("fail-b");
    let nbd = failing_pool_member(dir, &trigger);
    let b = nbd.uri();
    format_write_back_pool(dir, &b);
    let srv = serve(dir, &b);
    let first: Vec<u8> = (0..(3u32 << 20)).map(|i| (i ^ (i >> 9)) as u8).collect();
    std::fs::write(dir.join("first"), &first).unwrap();
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(dir.join("first"))
        .arg(srv.uri()));
    assert_eq!(unmirrored(&srv), 0.0, "mirrored before the failure");
    // Member 1 fails every request from now on: the next write fails it (that write's
    // lines go to the backing device; the other dirty lines keep one copy, on member 0).
    std::fs::write(&trigger, b"").unwrap();
    let head: Vec<u8> = (0..(64u32 << 10)).map(|i| (i % 253) as u8 ^ 0x5c).collect();
    std::fs::write(dir.join("head"), &head).unwrap();
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(dir.join("head"))
        .arg(srv.uri()));
    let mut second = first.clone();
    second[..head.len()].copy_from_slice(&head);
    let st = srv.stats();
    assert_eq!(st["pool_members"][1]["state"], "failed", "{st}");
    let single = unmirrored(&srv);
    assert!(single > 0.0, "no line left with one copy: {st}");
    // Refused, named: an active member; a member's path; a member index out of range.
    let new = dir.join("new.img").display().to_string();
    let a = dir.join("a.img").display().to_string();
    let e = ctl_fails(&srv, &["cache", "replace", "0", &new]);
    assert!(e.contains("member 0") && e.contains("not failed"), "{e}");
    let e = ctl_fails(&srv, &["cache", "replace", "1", &a]);
    assert!(e.contains("a.img is member 0 of this pool"), "{e}");
    let e = ctl_fails(&srv, &["cache", "replace", "2", &new]);
    assert!(e.contains("the pool has 2 members"), "{e}");
    // Still single: nothing re-mirrors with one live member.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(unmirrored(&srv), single, "changed without a replacement");
    let out = srv.ctl(&["cache", "replace", "1", &new]);
    assert!(out.contains("is pool member 1 now"), "{out}");
    let t = Instant::now();
    while unmirrored(&srv) > 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "unmirrored_lines still {} after 5 s: {}",
            unmirrored(&srv),
            srv.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let list: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["cache", "list", "--json"])).unwrap();
    assert_eq!(list[1]["state"], "active", "{list}");
    assert!(
        list[1]["path"].as_str().unwrap_or("").ends_with("new.img"),
        "{list}"
    );
    let got = read_all(&srv.uri(), &dir.join("out"));
    assert!(
        got[..second.len()] == second[..],
        "read back after the replace"
    );
    let log = srv.stop("-TERM");
    assert!(log.contains("replaces failed pool member 1"), "{log}");
    drop(nbd);
    // Restarted with a.img and new.img: every byte.
    let srv = serve(dir, &new);
    let st = srv.stats();
    assert!(
        st["pool_members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "active"),
        "{st}"
    );
    let got = read_all(&srv.uri(), &dir.join("out"));
    assert!(
        got[..second.len()] == second[..],
        "read back after the restart"
    );
    srv.stop("-TERM");
}
