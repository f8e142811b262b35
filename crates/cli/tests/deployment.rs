//! A small deployment, as issue 15 describes its goal: one server with three volumes (`--volume`
//! repeated), a pool of two cache devices (`--cache` repeated) and a RAM tier, in write-back.
//! fio writes crc32c-stamped blocks to the three exports at once (a FLUSH after every write,
//! queue depth 1 each, as kill9_fio.rs explains), the server is killed with SIGKILL while they
//! write, a new server opens the same pool (an unclean start), and `fio --verify_only` checks
//! every write each fio saw completed: at most one block per volume may fail (the write in
//! flight at the kill, which fio's saved state counts as written). Then a second read pass is
//! served partly from the RAM tier, and a clean stop and start restores every volume.

mod common;

use common::{find_num, have, tmp, Srv};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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

fn serve(dir: &Path) -> Srv {
    let mut a: Vec<String> = Vec::new();
    for c in ["ssd0.img", "ssd1.img"] {
        a.push("--cache".into());
        a.push(dir.join(c).display().to_string());
    }
    for v in VOLUMES {
        a.push("--volume".into());
        a.push(format!("{v}={}", dir.join(format!("{v}.img")).display()));
    }
    a.extend(
        [
            "--mode",
            "write-back",
            "--dirty-copies",
            "1",
            "--ram-cache",
            "4MiB",
        ]
        .map(String::from),
    );
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Srv::custom(dir, &a)
}

#[test]
fn three_volumes_two_cache_devices_and_a_ram_tier_survive_kill_9() {
    if !have("fio") {
        tiercache_testskip::skip!("fio missing (apt install fio): the deployment test needs it");
        return;
    }
    let d = tmp();
    let dir = d.path();
    // Two members of 6 MiB (1,536 lines, rounded to 1,536): a 12 MiB pool for 3 x 24 MiB
    // written, so lines are evicted (dirty ones written back) while fio runs.
    sized(&dir.join("ssd0.img"), 6 << 20);
    sized(&dir.join("ssd1.img"), 6 << 20);
    for v in VOLUMES {
        sized(&dir.join(format!("{v}.img")), 32 << 20);
    }
    let mut fmt = Command::new(common::BIN);
    fmt.arg("format");
    for c in ["ssd0.img", "ssd1.img"] {
        fmt.arg("--cache").arg(dir.join(c));
    }
    let o = fmt
        .arg("--backing")
        .arg(dir.join("db.img"))
        .args(["--mode", "write-back", "--dirty-copies", "1"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "format: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let srv = serve(dir);
    let (dd, sock) = (dir.to_path_buf(), srv.sock.clone());
    let writer =
        std::thread::spawn(move || fio(&dd, &sock, &["--do_verify=0", "--verify_state_save=1"]));
    std::thread::sleep(Duration::from_millis(2500));
    srv.kill9();
    let w = writer.join().unwrap();
    let wrote = String::from_utf8_lossy(&w.stdout).into_owned();

    let srv = serve(dir);
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
    check(&srv, "after kill -9");
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
    // A second read of what was just verified: the RAM tier serves some of it.
    check(&srv, "second read");
    let st = srv.stats();
    let ram_hits = find_num(&st, "ram_hits").unwrap_or(0.0);
    assert!(ram_hits > 0.0, "no read was served by the RAM tier: {st}");
    // A clean stop and start keeps everything.
    srv.stop("-TERM");
    let srv = serve(dir);
    check(&srv, "after a clean restart");
    drop(srv);
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
