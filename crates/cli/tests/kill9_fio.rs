//! `kill -9` of `tiercache serve` at random moments under a running fio write workload with
//! verification. Each round: fio writes 192 MiB of crc32c-stamped 4 KiB blocks at random
//! offsets (each block once) at queue depth 16 and saves its verify state when it dies with
//! the connection; the server is SIGKILLed after a random delay; a new server opens the
//! same cache (an unclean start) and `fio --verify_only --verify_state_load=1` checks every
//! write fio saw completed.
//!
//! Why every completed write must survive: SIGKILL kills the process, not the machine, so
//! every pwrite the server finished is in the page cache. In write-through, write-around and
//! read-only modes an acknowledged write is on the backing file and any cached copy of it is
//! mapped by a record that maps the same line (records are unmapped before their slot is
//! reused). Write-back keeps data in the cache whose record reaches the device only at
//! FLUSH, so only flushed data must survive a kill; that mode runs fio with `--fsync=1` (a
//! FLUSH after every write).
//!
//! fio's saved state counts the I/O in flight at the kill (it completes with an error) as
//! written, so fio runs at queue depth 1 and a round accepts at most one block failing
//! verification: the write in flight (or, in write-back, completed but not yet flushed) when
//! the server died. At queue depth 16 up to 16 such blocks fail in every mode, which says
//! nothing about the server; a real loss shows up as more than one.
//!
//! Default 5 rounds; `TIERCACHE_KILL_ROUNDS=N` for more; the seed of the kill delays is
//! printed (`TIERCACHE_KILL_SEED` to repeat).

mod common;

use common::{have, Srv};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn fio(dir: &Path, uri: &str, mode: &str, extra: &[&str]) -> std::process::Output {
    let wb = mode == "write-back";
    let mut c = Command::new("fio");
    c.current_dir(dir).args([
        "--name=kill9",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=192M",
        "--randseed=4242",
        "--verify=crc32c",
    ]);
    c.arg("--iodepth=1");
    if wb {
        c.arg("--fsync=1");
    }
    c.args(extra).output().unwrap()
}

#[test]
fn kill_9_at_random_moments_under_fio_loses_no_completed_write() {
    if !have("fio") {
        return;
    }
    let rounds: u64 = std::env::var("TIERCACHE_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let seed: u64 = std::env::var("TIERCACHE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill seed {seed} (TIERCACHE_KILL_SEED={seed} to repeat)");
    let modes = ["write-through", "write-back", "write-around", "read-only"];
    let mut killed_mid_write = 0;
    let mut x = seed | 1;
    for round in 0..rounds {
        let mode = modes[round as usize % modes.len()];
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::File::create(d.join("backing.img"))
            .unwrap()
            .set_len(224 << 20)
            .unwrap();
        // xorshift: the kill delay, 500..1500 ms after fio starts (fio needs ~0.4 s to connect).
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = Duration::from_millis(500 + x % 1000);
        let srv = Srv::sized(d, "16M", &["--mode", mode]);
        let uri = srv.uri();
        let (dd, u, m) = (d.to_path_buf(), uri.clone(), mode.to_string());
        let writer = std::thread::spawn(move || {
            fio(&dd, &u, &m, &["--do_verify=0", "--verify_state_save=1"])
        });
        std::thread::sleep(delay);
        srv.kill9();
        let w = writer.join().unwrap();
        let died = !w.status.success();
        if !d.join("local-kill9-0-verify.state").exists() {
            let o = String::from_utf8_lossy(&w.stdout);
            println!(
                "round {round}: {mode}, kill -9 after {delay:?}: fio saved no verify state ({}): {}",
                w.status,
                o.lines()
                    .filter(|l| l.contains("err=") || l.contains("issued"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            continue;
        }
        killed_mid_write += died as u64;
        let srv = Srv::sized(d, "16M", &["--mode", mode]);
        let v = fio(
            d,
            &srv.uri(),
            mode,
            &["--verify_only", "--verify_state_load=1", "--verify_fatal=0"],
        );
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
        let bad = out.matches("verify: bad").count();
        assert!(
            out.contains("READ:"),
            "round {round} ({mode}): the verify pass did not run:\n{out}"
        );
        let verdict = if bad == 0 && v.status.success() {
            "all completed writes verified".to_string()
        } else if bad == 1 {
            "one block (fio's last write, in flight or unflushed at the kill) did not verify, as allowed".to_string()
        } else {
            panic!("round {round} ({mode}, kill after {delay:?}): {bad} blocks failed verification:\n{out}");
        };
        println!(
            "round {round}: {mode}, kill -9 after {delay:?} ({}), {verdict}",
            if died {
                "fio was writing"
            } else {
                "fio had finished"
            }
        );
        drop(srv);
    }
    println!("{rounds} kill -9 rounds, {killed_mid_write} during fio's writes");
    assert!(
        killed_mid_write * 2 >= rounds,
        "most kills should land while fio writes ({killed_mid_write} of {rounds})"
    );
}
