//! `serve --ram-cache` against `sim --ram-cache`: a queue-depth-1 replay gives the
//! simulator's counters exactly, per tier (RAM hits, SSD hits, misses) and for the SSD tier
//! below; `ctl stats` shows the tiers; the log layout refuses the option by name.

mod common;

use common::{run, Srv, BIN};
use std::process::Command;

fn setup(size_mb: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("backing.img")).unwrap();
    f.set_len(size_mb << 20).unwrap();
    dir
}

#[test]
fn ram_tier_replay_at_queue_depth_1_matches_the_simulator_per_tier() {
    // Reads and writes, whole-line and sub-line (1k: never filled, invalidates; unaligned
    // reads fill only the lines they cover whole, so most are line-aligned), over a hot
    // set larger than the RAM tier and the cache.
    let zipf = "zipf:theta=1.1,wss=24MiB,requests=4000,read=70,size=4k@60+16k@30+1k@10,align=4k";
    let input = ["--workload", zipf, "--seed", "3"];
    let mut hits = 0;
    for (mode, policy) in [("write-through", "s3fifo"), ("write-back", "lru")] {
        let dir = setup(24);
        let srv = Srv::start(
            dir.path(),
            &[
                "--policy",
                "lru",
                "--mode",
                mode,
                "--cleaner",
                "inline",
                "--ram-cache",
                "1MiB",
                "--ram-policy",
                policy,
            ],
        );
        let rep = run(Command::new(BIN)
            .args([
                "replay",
                "--nbd",
                &srv.uri(),
                "--queue-depth",
                "1",
                "--strict",
                "--json",
            ])
            .args(input));
        let rep: serde_json::Value = serde_json::from_str(&rep).unwrap();
        let live: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
        let text = srv.ctl(&["stats"]);
        srv.stop("-TERM");
        assert!(
            text.contains("tiers ") && text.contains("RAM hits") && text.contains("RAM tier"),
            "ctl stats shows no tiers:\n{text}"
        );
        let sim = run(Command::new(BIN)
            .args([
                "sim",
                "--cache-size",
                "8MiB",
                "--policy",
                "lru",
                "--mode",
                mode,
            ])
            .args(["--ram-cache", "1MiB", "--ram-policy", policy, "--json"])
            .args(input));
        let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
        let (want, got) = (&sim["counters"], &live["totals"]);
        assert_eq!(rep["requests"].as_u64(), Some(4000), "{rep}");
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(
                &got[k], v,
                "{mode}: SSD tier counter {k}: sim {v}, live {}",
                got[k]
            );
        }
        let (sr, lr) = (&sim["ram"], &live["ram"]);
        for k in ["read_requests", "ram_hits", "ssd_hits", "misses"] {
            assert_eq!(sr[k], lr[k], "{mode}: {k}: sim {}, live {}", sr[k], lr[k]);
        }
        for k in [
            "lookups",
            "hits",
            "hit_bytes",
            "fills",
            "evictions",
            "invalidations",
        ] {
            assert_eq!(
                sr["counters"][k], lr["counters"][k],
                "{mode}: RAM counter {k}: sim {}, live {}",
                sr["counters"][k], lr["counters"][k]
            );
        }
        assert_eq!(
            lr["counters"]["fills_skipped"], 0,
            "queue depth 1 skips no fill"
        );
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        assert!(
            n(&sr["ram_hits"]) > 200 && n(&sr["ssd_hits"]) > 100 && n(&sr["misses"]) > 100,
            "{mode}: every tier must serve reads for the comparison to mean something: {sr}"
        );
        assert!(n(&sr["counters"]["invalidations"]) > 20 && n(&sr["counters"]["evictions"]) > 20);
        hits += n(&lr["ram_hits"]);
    }
    assert!(hits > 0);
}

#[test]
fn log_layout_refuses_ram_cache_by_name() {
    let dir = setup(8);
    let d = dir.path();
    let out = Command::new(BIN)
        .args(["serve", "--cache"])
        .arg(d.join("cache.img"))
        .arg("--backing")
        .arg(d.join("backing.img"))
        .args(["--socket"])
        .arg(d.join("s.sock"))
        .args([
            "--format-if-needed",
            "--cache-size",
            "8M",
            "--layout",
            "log",
            "--ram-cache",
            "1MiB",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started: {err}");
    assert!(
        err.contains("--ram-cache"),
        "the error does not name the option: {err}"
    );
}
