//! `serve --ram-cache` against `sim --ram-cache`: a queue-depth-1 replay gives the
//! simulator's counters exactly, per tier (RAM hits, SSD hits, misses) and for the SSD tier
//! below, on either layout; `ctl stats` shows the tiers; `--ram-policy` alone is refused.

mod common;

use common::{replay_qd1, run, sim_8m, Srv, BIN};
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
        let rep = replay_qd1(&srv.uri(), input);
        let live: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
        let text = srv.ctl(&["stats"]);
        srv.stop("-TERM");
        assert!(
            text.contains("tiers ") && text.contains("RAM hits") && text.contains("RAM tier"),
            "ctl stats shows no tiers:\n{text}"
        );
        let ram = ["--ram-cache", "1MiB", "--ram-policy", policy];
        let sim = sim_8m(mode, ram.iter().chain(input.iter()));
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

/// The log layout's RAM tier (issue 15 item 3): one connection at queue depth 1 against
/// `serve --layout log --ram-cache` gives `sim --layout log --ram-cache`'s counters exactly:
/// the log engine's (RAM hits never reach it) and the reads per tier, and the RAM tier's own.
#[test]
fn log_layout_ram_tier_replay_at_queue_depth_1_matches_the_simulator_per_tier() {
    let zipf = "zipf:theta=1.1,wss=24MiB,requests=4000,read=70,size=4k@60+16k@30+1k@10,align=4k";
    let input = ["--workload", zipf, "--seed", "5"];
    for (mode, picker, policy) in [
        ("write-through", "lru", "s3fifo"),
        ("write-back", "greedy", "lru"),
    ] {
        let layout = [
            "--layout",
            "log",
            "--line-size",
            "4k",
            "--segment-size",
            "256k",
            "--compression",
            "none",
            "--dedup",
            "0",
            "--picker",
            picker,
            "--mode",
            mode,
        ];
        let dir = setup(24);
        let ram = ["--ram-cache", "1MiB", "--ram-policy", policy];
        let flags: Vec<&str> = layout.iter().chain(ram.iter()).copied().collect();
        let srv = Srv::start(dir.path(), &flags);
        let rep = replay_qd1(&srv.uri(), input);
        let live: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
        let text = srv.ctl(&["stats"]);
        srv.stop("-TERM");
        assert_eq!(rep["requests"].as_u64(), Some(4000), "{rep}");
        assert!(
            text.contains("tiers ") && text.contains("RAM hits") && text.contains("RAM tier"),
            "ctl stats of a log volume shows no tiers:\n{text}"
        );
        let capacity = live["log"]["segments"].as_u64().unwrap() * 256;
        let sim = run(Command::new(BIN)
            .args(["sim", "--cache-size", &format!("{capacity}KiB")])
            .args(layout)
            .args(ram)
            .arg("--json")
            .args(input));
        let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
        let (want, got) = (&sim["log"]["counters"], &live["log"]["engine"]);
        let mut differ = Vec::new();
        for (k, v) in want.as_object().unwrap() {
            if &got[k] != v {
                differ.push(format!("engine {k}: sim {v}, live {}", got[k]));
            }
        }
        let (sr, lr) = (&sim["ram"], &live["ram"]);
        for k in ["read_requests", "ram_hits", "ssd_hits", "misses"] {
            if sr[k] != lr[k] {
                differ.push(format!("{k}: sim {}, live {}", sr[k], lr[k]));
            }
        }
        for k in [
            "lookups",
            "hits",
            "hit_bytes",
            "fills",
            "evictions",
            "invalidations",
        ] {
            if sr["counters"][k] != lr["counters"][k] {
                differ.push(format!(
                    "RAM {k}: sim {}, live {}",
                    sr["counters"][k], lr["counters"][k]
                ));
            }
        }
        assert!(differ.is_empty(), "{mode} {picker}: {}", differ.join("; "));
        assert_eq!(
            lr["counters"]["fills_skipped"], 0,
            "queue depth 1 skips no fill"
        );
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        assert!(
            n(&sr["ram_hits"]) > 200 && n(&sr["ssd_hits"]) > 100 && n(&sr["misses"]) > 100,
            "{mode}: every tier must serve reads for the comparison to mean something: {sr}"
        );
        assert!(
            n(&want["segments_reclaimed"]) > 0,
            "{mode}: no segment reclaimed: {want}"
        );
    }
}

/// `--ram-policy` without `--ram-cache` would do nothing: `serve` refuses it by name (as
/// `sim` does), from a flag or a config file.
#[test]
fn serve_refuses_ram_policy_without_ram_cache() {
    let dir = setup(8);
    let d = dir.path();
    let conf = d.join("serve.toml");
    std::fs::write(&conf, "ram_policy = \"lru\"\n").unwrap();
    for extra in [
        &["--ram-policy", "lru"][..],
        &["--config", conf.to_str().unwrap()],
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--cache"])
            .arg(d.join("cache.img"))
            .arg("--backing")
            .arg(d.join("backing.img"))
            .args(["--socket"])
            .arg(d.join("s.sock"))
            .args(["--format-if-needed", "--cache-size", "8M"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "serve {extra:?} started: {err}");
        assert!(
            err.contains("--ram-policy") && err.contains("--ram-cache"),
            "serve {extra:?}: the error does not name the options: {err}"
        );
    }
}

fn ctl_fails(srv: &Srv, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "ctl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `ctl set ram-cache SIZE` resizes a running RAM tier (emptied, then bounded by the new
/// size) on either layout; a volume started without one says how to get one, and 0 (removing
/// it live) is refused with what to do.
#[test]
fn ctl_set_ram_cache_resizes_the_tier_on_both_layouts() {
    let read = [
        "--workload",
        "zipf:theta=0.9,wss=4MiB,requests=3000,read=100,size=4k,align=4k",
    ];
    for layout in [&[][..], &["--layout", "log", "--segment-size", "256k"][..]] {
        let dir = setup(8);
        let flags: Vec<&str> = layout
            .iter()
            .copied()
            .chain(["--ram-cache", "1MiB"])
            .collect();
        let srv = Srv::start(dir.path(), &flags);
        let replay = |srv: &Srv| {
            run(Command::new(BIN)
                .args(["replay", "--nbd", &srv.uri(), "--queue-depth", "1"])
                .args(read));
        };
        replay(&srv);
        let stats = |srv: &Srv| -> serde_json::Value {
            serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap()
        };
        let before = stats(&srv);
        assert_eq!(before["ram"]["capacity_bytes"], 1 << 20, "{layout:?}");
        assert!(
            before["ram"]["cached_lines"].as_u64().unwrap() > 64,
            "{layout:?}"
        );
        assert_eq!(srv.ctl(&["get", "ram-cache"]).trim(), "1MiB", "{layout:?}");
        srv.ctl(&["set", "ram-cache", "256KiB"]);
        assert_eq!(
            srv.ctl(&["get", "ram-cache"]).trim(),
            "256KiB",
            "{layout:?}"
        );
        let after = stats(&srv);
        assert_eq!(after["ram"]["capacity_lines"], 64, "{layout:?}");
        assert_eq!(after["ram"]["cached_lines"], 0, "emptied: {layout:?}");
        replay(&srv);
        let again = stats(&srv);
        let r = &again["ram"];
        assert!(
            r["cached_lines"].as_u64().unwrap() <= 64
                && r["ram_hits"].as_u64() > before["ram"]["ram_hits"].as_u64(),
            "{layout:?}: {r}"
        );
        let e = ctl_fails(&srv, &["set", "ram-cache", "0"]);
        assert!(e.contains("--ram-cache") && e.contains("restart"), "{e}");
        srv.stop("-TERM");

        let dir = setup(8);
        let srv = Srv::start(dir.path(), layout);
        let e = ctl_fails(&srv, &["set", "ram-cache", "1MiB"]);
        assert!(
            e.contains("no RAM tier") && e.contains("--ram-cache"),
            "{layout:?}: {e}"
        );
        srv.stop("-TERM");
    }
}
