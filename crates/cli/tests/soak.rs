//! Soak: `tiercache serve` in write-back mode (plain backing and cache files on /dev/shm when
//! there is one) under fio with crc32c verification for a bounded time: two fio processes
//! on disjoint halves of the volume, each with writer jobs that
//! verify what they wrote as they go (`verify_backlog`) and reader jobs, every job its own
//! connection at queue depth 32; at the same time nbdcopy reads the whole volume over NBD
//! with TLS (pre-shared key; fio's libnbd refuses a `tls-psk-file` in its URI) in a loop with
//! 4 connections x 32 requests. Afterwards the volume read over TLS equals the volume read
//! in plaintext. No fio error, no verify mismatch, a clean shutdown, and the server's
//! resident memory (VmRSS, sampled every 250 ms) stays flat after warm-up.
//!
//! 30 s by default; `TIERCACHE_SOAK_LONG=1` runs 10 minutes, `TIERCACHE_SOAK_SECS=N` any
//! length. Needs fio with its nbd engine; without it the test prints SKIP.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tiercache");
const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn fio_has_nbd() -> bool {
    if Command::new("nbdcopy").arg("--version").output().is_err() {
        tiercache_testskip::skip!("nbdcopy is not installed (apt-get install -y libnbd-bin)");
        return false;
    }
    let ok = Command::new("fio")
        .arg("--enghelp=nbd")
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("uri"))
        .unwrap_or(false);
    if !ok {
        tiercache_testskip::skip!(
            "fio with the nbd engine is not installed (apt-get install -y fio)"
        );
    }
    ok
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fio(
    uri: &str,
    name: &str,
    offset: &str,
    secs: u64,
    out: &Path,
) -> std::io::Result<std::process::Child> {
    Command::new("fio")
        .args([
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--time_based",
            &format!("--runtime={secs}"),
            "--iodepth=32",
            "--group_reporting",
            "--output-format=json",
            &format!("--output={}", out.display()),
            // Writers: random writes of 4k-64k, each block checked against its crc32c
            // shortly after it is written.
            &format!("--name={name}-w"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--numjobs=3",
            &format!("--offset={offset}"),
            "--size=24M",
            "--offset_increment=24M",
            "--verify=crc32c",
            "--verify_backlog=256",
            "--verify_fatal=1",
            "--verify_state_save=0",
            // Readers: random reads over the same span.
            &format!("--name={name}-r"),
            "--rw=randread",
            "--bs=4k",
            "--numjobs=2",
            &format!("--offset={offset}"),
            "--size=72M",
            "--verify=0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
}

fn json_sum(v: &serde_json::Value, dir: &str, key: &str) -> u64 {
    v["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| j[dir][key].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn soak_write_back_qd32_plain_and_tls_with_verification() {
    if !fio_has_nbd() {
        return;
    }
    let secs: u64 = std::env::var("TIERCACHE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("TIERCACHE_SOAK_LONG").is_some() {
            600
        } else {
            30
        });
    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let d = dir.path();
    let backing = d.join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(160 << 20)
        .unwrap();
    let psk = d.join("keys.psk");
    std::fs::write(&psk, format!("soak:{KEY}\n")).unwrap();
    let sock = d.join("nbd.sock");
    let ctl = d.join("ctl.sock");
    let log = d.join("server.log");
    let child = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(d.join("cache.img"))
        .arg("--backing")
        .arg(&backing)
        .arg("--socket")
        .arg(&sock)
        .arg("--control")
        .arg(&ctl)
        .args(["--format-if-needed", "--cache-size", "48M"])
        .args(["--mode", "write-back", "--tls", "on", "--tls-psk-file"])
        .arg(&psk)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut srv = Server(child);
    let pid = srv.0.id();
    let t = Instant::now();
    while !(sock.exists() && ctl.exists()) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // RSS sampler.
    let samples = Arc::new(Mutex::new(Vec::<(f64, u64)>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, done) = (samples.clone(), done.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if let Some(k) = vm_rss_kib(pid) {
                    samples
                        .lock()
                        .unwrap()
                        .push((t0.elapsed().as_secs_f64(), k));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let plain = format!("nbd+unix:///?socket={}", sock.display());
    let tls = format!(
        "nbds+unix://soak@/?socket={}&tls-psk-file={}",
        sock.display(),
        psk.display()
    );
    let out_a = d.join("plain.json");
    let out_b = d.join("tls.json");
    let started = Instant::now();
    let f1 = fio(&plain, "a", "0", secs, &out_a).unwrap();
    let f2 = fio(&plain, "b", "80M", secs, &out_b).unwrap();
    let copier = {
        let tls = tls.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while started.elapsed() < Duration::from_secs(secs) {
                let o = Command::new("nbdcopy")
                    .args(["--connections=4", "--requests=32", &tls, "null:"])
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "nbdcopy over TLS: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                n += 1;
            }
            n
        })
    };
    let mut results = Vec::new();
    for (f, out, what) in [(f1, &out_a, "fio a"), (f2, &out_b, "fio b")] {
        let o = f.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let text = std::fs::read_to_string(out).unwrap_or_default();
        assert!(
            o.status.success(),
            "fio ({what}) failed: {stderr}\n{text}\nserver log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(!stderr.contains("verify"), "fio ({what}): {stderr}");
        // fio may print notes before the JSON document.
        let json = &text[text.find('{').expect("fio JSON output")..];
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        let errors: u64 = v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["error"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(errors, 0, "fio ({what}) job errors");
        let r = json_sum(&v, "read", "io_bytes");
        let w = json_sum(&v, "write", "io_bytes");
        let (ri, wi) = (
            json_sum(&v, "read", "total_ios"),
            json_sum(&v, "write", "total_ios"),
        );
        assert!(
            r > 0 && w > 0,
            "fio ({what}) did no I/O: read {r} write {w}"
        );
        results.push(format!(
            "{what}: {} MiB read ({ri} I/Os, verify reads included), {} MiB written ({wi} I/Os)",
            r >> 20,
            w >> 20
        ));
    }
    let copies = copier.join().expect("nbdcopy over TLS failed");
    assert!(copies >= 1);
    results.push(format!(
        "TLS-PSK: nbdcopy read the whole {} MiB volume {copies} times (4 connections x 32 requests)",
        160
    ));
    let elapsed = started.elapsed().as_secs_f64();
    // The same bytes over TLS and in plaintext.
    let (a, b) = (d.join("via-tls.img"), d.join("via-plain.img"));
    for (uri, f) in [(&tls, &a), (&plain, &b)] {
        let o = Command::new("nbdcopy").arg(uri).arg(f).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the volume read over TLS differs from the volume read in plaintext"
    );
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    // Clean shutdown: dirty data stays in the cache, metadata written, marked clean.
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let st = srv.0.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(st.success() && text.contains("shut down cleanly"), "{text}");
    assert!(!text.contains("panicked"), "{text}");

    let s = samples.lock().unwrap();
    assert!(s.len() >= 8, "too few RSS samples: {}", s.len());
    // After warm-up (the first fifth: buffers, cache index, TLS sessions), RSS must not grow
    // by more than 16 MiB + 10 %.
    let warm = s[s.len() / 5].1;
    let last_fifth = &s[s.len() * 4 / 5..];
    let end = last_fifth.iter().map(|x| x.1).max().unwrap();
    let peak = s.iter().map(|x| x.1).max().unwrap();
    println!(
        "soak {elapsed:.0} s (write-back, 10 fio connections at QD32: 6 writers with verify_backlog, 4 readers; plus 4 nbdcopy connections over TLS-PSK)"
    );
    for r in &results {
        println!("  {r}");
    }
    println!(
        "  server VmRSS: {} MiB after warm-up, {} MiB max in the last fifth, {} MiB peak ({} samples)",
        warm >> 10,
        end >> 10,
        peak >> 10,
        s.len()
    );
    assert!(
        end <= warm + warm / 10 + (16 << 10),
        "resident memory grew from {warm} KiB to {end} KiB"
    );
}
