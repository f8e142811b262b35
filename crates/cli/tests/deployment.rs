//! A small deployment, as issue 15 describes its goal: one server with three volumes (`--volume`
//! repeated), a pool of two cache devices (`--cache` repeated, dirty lines mirrored on both:
//! `--dirty-copies 2`, the default) and a RAM tier, in write-back. fio writes crc32c-stamped
//! blocks to the three exports at once (a FLUSH after every write, queue depth 1 each, as
//! kill9_fio.rs explains); while they write, cache device 1 (an NBD export behind nbdkit's
//! error filter) starts failing every request and is failed live, then the server is killed
//! with SIGKILL. A new server opens the pool with the dead device still given (an unclean,
//! degraded start), and `fio --verify_only` checks every write each fio saw completed: at most
//! one block per volume may fail (the write in flight at the kill, which fio's saved state
//! counts as written). `ctl cache replace 1 NEW` puts a new device in its place and the
//! cleaner re-mirrors onto it; a second read pass is served partly from the RAM tier, and a
//! clean stop and start with the new device restores every volume. Skips loudly without fio
//! or nbdkit.

mod common;

use common::{failing_pool_member, find_num, have, tmp, Srv};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const VOLUMES: [&str; 3] = ["db", "logs", "home"];

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// fio over the three exports served on `sock` (one job per volume, each named after it).
fn fio(dir: &Path, sock: &Path, extra: &[&str]) -> std::process::Output {
    let mut c = Command::new("fio");
    c.current_dir(dir).args([
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--size=24M",
        "--randseed=77",
        "--verify=crc32c",
        "--iodepth=1",
        "--fsync=1",
    ]);
    c.args(extra);
    for v in VOLUMES {
        c.arg(format!("--name={v}"))
            .arg(format!("--uri=nbd+unix:///{v}?socket={}", sock.display()));
    }
    c.output().unwrap()
}

/// The server over cache devices `ssd0.img` and `second` (a path or an NBD URI).
fn serve(dir: &Path, second: &str) -> Srv {
    let mut a: Vec<String> = Vec::new();
    for c in [
        dir.join("ssd0.img").display().to_string(),
        second.to_string(),
    ] {
        a.push("--cache".into());
        a.push(c);
    }
    for v in VOLUMES {
        a.push("--volume".into());
        a.push(format!("{v}={}", dir.join(format!("{v}.img")).display()));
    }
    a.extend(["--mode", "write-back", "--ram-cache", "4MiB"].map(String::from));
    a.push("--state-dir".into());
    a.push(dir.join("state").display().to_string());
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Srv::custom(dir, &a)
}

#[test]
fn three_volumes_two_cache_devices_and_a_ram_tier_survive_an_ssd_loss_and_kill_9() {
    if !have("fio") || !have("nbdkit") {
        tiercache_testskip::skip!(
            "fio or nbdkit missing (apt install fio nbdkit): the deployment test needs both"
        );
        return;
    }
    let t0 = Instant::now();
    let d = tmp();
    let dir = d.path();
    // Two members of 6 MiB (1,536 lines each): dirty lines take a slot on each, so 3 x 24 MiB
    // written overflow the pool and lines are evicted (dirty ones written back) while fio runs.
    // Member 1 is `b.img` served by nbdkit, failing every request while `trigger` exists.
    sized(&dir.join("ssd0.img"), 6 << 20);
    sized(&dir.join("b.img"), 6 << 20);
    sized(&dir.join("ssd2.img"), 6 << 20);
    for v in VOLUMES {
        sized(&dir.join(format!("{v}.img")), 32 << 20);
    }
    let trigger = dir.join("ssd1-dies");
    let nbd = failing_pool_member(dir, &trigger);
    let ssd1 = nbd.uri();
    let o = Command::new(common::BIN)
        .arg("format")
        .arg("--cache")
        .arg(dir.join("ssd0.img"))
        .arg("--cache")
        .arg(&ssd1)
        .arg("--backing")
        .arg(dir.join("db.img"))
        .args(["--mode", "write-back"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "format: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let srv = serve(dir, &ssd1);
    let (dd, sock) = (dir.to_path_buf(), srv.sock.clone());
    let writer =
        std::thread::spawn(move || fio(&dd, &sock, &["--do_verify=0", "--verify_state_save=1"]));
    std::thread::sleep(Duration::from_millis(1200));
    let st = srv.stats();
    assert!(
        st["copy_slots"].as_u64().unwrap_or(0) > 0,
        "no mirrored dirty line before the SSD loss: {st}"
    );
    // SSD 1 dies: every request to it fails from now on.
    std::fs::write(&trigger, b"").unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let st = srv.stats();
        if st["pool_members"][1]["state"] == "failed" {
            break;
        }
        assert!(
            Instant::now() < until,
            "member 1 not failed 10 s after it started failing every request: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The writers go on over the survivor, then the server is killed under them.
    std::thread::sleep(Duration::from_millis(1000));
    let st = srv.stats();
    let log = srv.stop("-KILL");
    assert_eq!(
        (
            find_num(&st, "lost_dirty_bytes").unwrap_or(0.0),
            st["pool_members"][0]["state"].as_str()
        ),
        (0.0, Some("active")),
        "dirty data lost, or the survivor failed, with one of two mirrored SSDs lost: {st}\nserver log:\n{log}"
    );
    let w = writer.join().unwrap();
    let wrote = String::from_utf8_lossy(&w.stdout).into_owned();

    // An unclean start with the dead SSD still given: the pool knows it failed.
    let srv = serve(dir, &ssd1);
    let st = srv.stats();
    assert_eq!(st["pool_members"][1]["state"], "failed", "{st}");
    for v in VOLUMES {
        // fio names the file `local-JOB-INDEX-verify.state`, INDEX counting jobs.
        let saved = std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&format!("local-{v}-")) && n.ends_with("-verify.state")
        });
        assert!(
            saved,
            "fio saved no verify state for {v} (killed before it connected?):\n{wrote}"
        );
    }
    // Each pass may fail one block per volume: the write in flight at the kill, which fio's
    // state counts as written (fio ends a job at its first bad block; the in-flight write is
    // its last). Across passes the failing blocks must be the same ones: a block that
    // verified once and fails later was lost or misdirected.
    let mut bad = std::collections::BTreeSet::new();
    let mut check = |srv: &Srv, when: &str| {
        for b in verify_pass(dir, srv, when) {
            bad.insert(b);
        }
        for v in VOLUMES {
            let n = bad
                .iter()
                .filter(|(f, _)| f.starts_with(&format!("{v}.")))
                .count();
            assert!(
                n <= 1,
                "{when}: {n} different blocks of {v} failed verification over the passes \
                 (at most one may: the write in flight at the kill): {bad:?}"
            );
        }
    };
    check(&srv, "after the SSD loss and kill -9");
    // Every volume is served and was written.
    let st = srv.stats();
    let text = st.to_string();
    for v in VOLUMES {
        assert!(text.contains(&format!("\"{v}\"")), "{v} missing: {text}");
    }
    assert!(
        st["cached_lines"].as_u64().unwrap_or(0) > 0,
        "nothing cached after the restart: {text}"
    );
    // A new SSD in the dead one's place; the cleaner mirrors the single-copy lines onto it.
    let ssd2 = dir.join("ssd2.img").display().to_string();
    let out = srv.ctl(&["cache", "replace", "1", &ssd2]);
    println!("replace: {out}");
    let until = Instant::now() + Duration::from_secs(20);
    while find_num(&srv.stats(), "unmirrored_lines").unwrap_or(0.0) > 0.0 {
        assert!(
            Instant::now() < until,
            "lines still single-copy 20 s after the replace: {}",
            srv.stats()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second read of what was just verified: the RAM tier serves some of it.
    check(&srv, "after the replace");
    let st = srv.stats();
    assert_eq!(st["pool_members"][1]["state"], "active", "{st}");
    let ram_hits = find_num(&st, "ram_hits").unwrap_or(0.0);
    assert!(ram_hits > 0.0, "no read was served by the RAM tier: {st}");
    // A clean stop and start over the new pair keeps everything; the dead SSD is gone.
    srv.stop("-TERM");
    drop(nbd);
    let srv = serve(dir, &ssd2);
    check(&srv, "after a clean restart with the new SSD");
    let st = srv.stats();
    assert_eq!(
        find_num(&st, "lost_dirty_bytes").unwrap_or(0.0),
        0.0,
        "{st}"
    );
    drop(srv);
    println!("done in {:?}", t0.elapsed());
}

/// `fio --verify_only` of the saved states: the (file, offset) of each block that failed.
fn verify_pass(dir: &Path, srv: &Srv, when: &str) -> Vec<(String, u64)> {
    let v = fio(
        dir,
        &srv.sock,
        &["--verify_only", "--verify_state_load=1", "--verify_fatal=0"],
    );
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    assert!(
        out.contains("READ:"),
        "{when}: the verify pass did not run:\n{out}"
    );
    // "verify: bad magic header 0, wanted acca at file db.0.0 offset 25026560, length 4096"
    let bad: Vec<(String, u64)> = out
        .lines()
        .filter(|l| l.contains("verify: bad") || l.contains("verify failed"))
        .map(|l| {
            let file = l
                .split(" at file ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            let off = l
                .split(" offset ")
                .nth(1)
                .and_then(|r| {
                    r.trim_end_matches(|c: char| !c.is_ascii_digit())
                        .split(',')
                        .next()
                })
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(u64::MAX);
            (file, off)
        })
        .collect();
    assert!(
        v.status.success() || !bad.is_empty(),
        "{when}: fio failed without a bad block:\n{out}"
    );
    bad
}
