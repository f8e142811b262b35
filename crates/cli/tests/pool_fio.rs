//! fio over NBD through a write-back pool of two cache devices whose second member is an NBD
//! export that starts failing every request (writes, reads, flushes: a dying device) in the
//! middle of the run (nbdkit's error filter, triggered by a file; issue 15 item 2,
//! docs/plan-multi-cache.md (c)7 and (d)1): fio's crc32c verification sees every block it
//! wrote, the server reports nothing lost and the member failed, and a `fio --verify_only`
//! after a restart with the member back (healthy again; the pool ignores it, marked failed)
//! verifies every block too. fio writes 2 KiB blocks into 4 KiB lines, so a failed write of a
//! line whose primary is on the dying member needs the line's other dirty sectors: from its
//! copy on the other member (read from the dying one, they were reported lost). Skips loudly
//! without fio or nbdkit.

mod common;

use common::{failing_pool_member, format_write_back_pool, have, tmp, Srv};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FIO_SIZE: &str = "32M";

fn fio(dir: &Path, uri: &str, extra: &[&str]) -> std::process::Output {
    Command::new("fio")
        .current_dir(dir)
        .args([
            "--name=poolfio",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=2k",
            &format!("--size={FIO_SIZE}"),
            "--randseed=1515",
            "--iodepth=4",
            "--verify=crc32c",
            "--verify_fatal=1",
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn serve(dir: &Path, b: &str) -> Srv {
    let a = dir.join("a.img").display().to_string();
    let backing = dir.join("backing.img").display().to_string();
    Srv::custom(
        dir,
        &[
            "--cache",
            &a,
            "--cache",
            b,
            "--backing",
            &backing,
            "--mode",
            "write-back",
        ],
    )
}

#[test]
fn fio_verifies_through_a_pool_member_that_starts_failing_every_request() {
    if !have("fio") || !have("nbdkit") {
        tiercache_testskip::skip!("fio or nbdkit missing (apt install fio nbdkit)");
        return;
    }
    let t0 = Instant::now();
    let d = tmp();
    let dir = d.path();
    sized(&dir.join("a.img"), 12 << 20);
    sized(&dir.join("b.img"), 12 << 20);
    sized(&dir.join("backing.img"), 48 << 20);
    let trigger = dir.join("fail-writes");
    let nbd = failing_pool_member(dir, &trigger);
    let b = nbd.uri();
    format_write_back_pool(dir, &b);
    let srv = serve(dir, &b);
    // Member 1 fails every request from 4 s into fio's ~11 s run on (its copy and primary
    // writes alike), and is failed at the error threshold.
    let trig = trigger.clone();
    let arm = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(4));
        std::fs::write(&trig, b"").unwrap();
    });
    let f = fio(dir, &srv.uri(), &["--verify_backlog=64", "--rate=3m"]);
    arm.join().unwrap();
    let out = String::from_utf8_lossy(&f.stdout).into_owned() + &String::from_utf8_lossy(&f.stderr);
    assert!(
        f.status.success(),
        "fio failed with member 1 failing every request: {out}"
    );
    assert!(!out.contains("verify: bad"), "{out}");
    let st = srv.stats();
    println!("stats after the run: {st}");
    let lost = common::find_num(&st, "lost_dirty_bytes").unwrap_or(0.0);
    assert_eq!(lost, 0.0, "lost dirty bytes: {st}");
    let errors = common::find_num(&st, "cache_errors").unwrap_or(0.0);
    assert!(
        errors > 0.0,
        "no cache error was seen: the member never failed: {st}"
    );
    let members = st["pool_members"].as_array().expect("pool_members");
    assert_eq!(members[1]["state"], "failed", "{st}");
    assert_eq!(members[0]["state"], "active", "{st}");
    let log = srv.stop("-TERM");
    println!("server log: {log}");
    // The member back, healthy: every block fio wrote verifies after the restart.
    std::fs::remove_file(&trigger).unwrap();
    let srv = serve(dir, &b);
    let v = fio(dir, &srv.uri(), &["--verify_only"]);
    let out = String::from_utf8_lossy(&v.stdout).into_owned() + &String::from_utf8_lossy(&v.stderr);
    assert!(
        v.status.success(),
        "fio --verify_only after the restart: {out}"
    );
    assert!(!out.contains("verify: bad"), "{out}");
    srv.stop("-TERM");
    drop(nbd);
    println!("done in {:?}", t0.elapsed());
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
}
