//! Sim = live for a pool of two volumes (issue 15 item 4): `tiercache replay --volume
//! NAME=TRACE ...` at queue depth 1 against `tiercache serve --volume NAME=BACKING ...` gives
//! the pool exactly the counters `tiercache sim --volume NAME=TRACE ...` computes, in total
//! and per volume, with a per-volume mode, and with a RAM tier above the pool; and on a
//! pool of two cache devices (`serve --cache A --cache B`, dirty lines mirrored) against
//! `sim --cache-devices 2`.

mod common;

use common::{replay_qd1, run, sparse, Srv, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

fn traces() -> Option<PathBuf> {
    let t = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if t.join("msr_cambridge/msr-cambridge1-sample.csv").exists()
        && t.join("systor17/systor17-traces-sample.csv.gz").exists()
    {
        Some(t)
    } else {
        tiercache_testskip::skip!("shared traces not found under {}", t.display());
        None
    }
}

#[test]
fn two_volume_replay_at_queue_depth_1_matches_the_simulator_exactly() {
    let Some(t) = traces() else { return };
    for (mode, hm_mode, ram) in [
        ("write-back", "write-through", None),
        ("write-through", "write-back", None),
        ("write-back", "write-through", Some("256KiB")),
    ] {
        compare(&t, mode, hm_mode, ram, &[], false);
    }
}

/// The same on a pool of two cache devices (`serve --cache A --cache B`: lines striped over
/// both, each dirty line written to both) against `sim --cache-devices 2`: the mirrored
/// copies take slots and SSD writes in both, so evictions, write-backs and SSD bytes agree;
/// and with `--dirty-copies 1`.
#[test]
fn a_pool_of_two_cache_devices_at_queue_depth_1_matches_the_simulator_exactly() {
    let Some(t) = traces() else { return };
    for (mode, hm_mode, ram, extra) in [
        ("write-back", "write-through", None, &[][..]),
        ("write-through", "write-back", None, &[]),
        ("write-back", "write-through", Some("256KiB"), &[]),
        ("write-back", "write-back", None, &["--dirty-copies", "1"]),
    ] {
        let (sim, live) = compare(&t, mode, hm_mode, ram, extra, true);
        let copies = live["copy_slots"].as_u64().unwrap();
        // Mirroring did happen (copies held at the end: the dirty lines' second slots), and
        // not with one copy; both members held lines and took writes.
        if extra.is_empty() {
            assert!(copies > 0, "no mirrored line at the end: {live}");
            assert_eq!(copies, sim["dirty_lines_at_end"], "one copy per dirty line");
        } else {
            assert_eq!(copies, 0, "--dirty-copies 1 mirrored: {live}");
        }
        let members = live["pool_members"].as_array().expect("pool members");
        assert_eq!(members.len(), 2, "{live}");
        for m in members {
            assert!(m["written_bytes"].as_u64().unwrap() > 0, "{m}");
        }
    }
}

/// The same with each volume's own admission and sequential cutoff (`--volume-admission`,
/// `--volume-seq-cutoff`, one parser for `serve` and `sim`): the live pool and the simulator
/// agree, and the settings did act (the volumes' bypasses).
#[test]
fn per_volume_admission_and_seq_cutoff_agree_with_the_simulator() {
    let Some(t) = traces() else { return };
    let flags = [
        "--volume-admission",
        "vdi=nhit:2:1",
        "--volume-seq-cutoff",
        "hm=64k",
    ];
    let (sim, live) = compare(&t, "write-back", "write-through", None, &flags, false);
    let by = |v: &serde_json::Value, name: &str, why: &str| {
        v["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap()["counters"]["bypasses"][why]
            .as_u64()
            .unwrap()
    };
    assert!(by(&live, "vdi", "admission") > 0, "{live}");
    assert_eq!(by(&live, "hm", "admission"), 0, "{live}");
    assert!(by(&live, "hm", "seq_cutoff") > 0, "{live}");
    assert_eq!(by(&live, "vdi", "seq_cutoff"), 0, "{live}");
    assert_eq!(by(&sim, "vdi", "admission"), by(&live, "vdi", "admission"));
}

/// Replays both traces through a live pool (`serve --mode MODE --volume-mode hm=HM_MODE`,
/// `extra` given to both; `devices`: on two cache devices of 5 MiB, else on one of 8 MiB)
/// and through `sim`, and asserts they agree; returns (sim, live stats).
fn compare(
    t: &std::path::Path,
    mode: &str,
    hm_mode: &str,
    ram: Option<&str>,
    extra: &[&str],
    devices: bool,
) -> (serde_json::Value, serde_json::Value) {
    let hm = t.join("msr_cambridge/msr-cambridge1-sample.csv");
    let vdi = t.join("systor17/systor17-traces-sample.csv.gz");
    let traces = [
        format!("hm={}", hm.display()),
        format!("vdi={}", vdi.display()),
    ];
    {
        let dir = common::tmp();
        let d = dir.path();
        // Sparse backing files that hold every offset of their trace (msr: 12.6 GiB, systor:
        // 4.6 TiB), so --strict never wraps one and the live offsets are the simulated ones.
        sparse(&d.join("hm.img"), 13 << 30);
        sparse(&d.join("vdi.img"), 5 << 40);
        let cache = d.join("cache.img").display().to_string();
        let (a, b) = (
            d.join("a.img").display().to_string(),
            d.join("b.img").display().to_string(),
        );
        let vols: Vec<String> = ["hm", "vdi"]
            .iter()
            .map(|n| format!("{n}={}", d.join(format!("{n}.img")).display()))
            .collect();
        let hm_setting = format!("hm={hm_mode}");
        let mut args = if devices {
            // Two members used whole: equal files, so the simulator's equal split of the
            // pool's capacity is the live one.
            sparse(Path::new(&a), 5 << 20);
            sparse(Path::new(&b), 5 << 20);
            let mut f = Command::new(BIN);
            f.args(["format", "--cache", &a, "--cache", &b, "--backing"]);
            f.arg(d.join("hm.img"));
            f.args(["--mode", mode, "--policy", "lru", "--state-dir"]);
            f.arg(d.join("state"));
            // The copies are chosen when the pool is formatted (stored in its pool blocks).
            if let Some(i) = extra.iter().position(|x| *x == "--dirty-copies") {
                f.args(&extra[i..i + 2]);
            }
            run(&mut f);
            vec!["--cache", &a, "--cache", &b]
        } else {
            vec![
                "--cache",
                &cache,
                "--format-if-needed",
                "--cache-size",
                "8M",
            ]
        };
        let state = d.join("state").display().to_string();
        args.extend(["--state-dir", &state]);
        for v in &vols {
            args.extend(["--volume", v.as_str()]);
        }
        args.extend(["--policy", "lru", "--mode", mode, "--cleaner", "inline"]);
        args.extend(["--volume-mode", &hm_setting]);
        args.extend(extra);
        if let Some(r) = ram {
            args.extend(["--ram-cache", r]);
        }
        let srv = Srv::custom(d, &args);
        let rep = replay_qd1(
            &srv.uri(),
            traces.iter().flat_map(|v| ["--volume", v.as_str()]),
        );
        let live = srv.stats();
        srv.stop("-TERM");
        let mut sim = Command::new(BIN);
        sim.arg("sim");
        if devices {
            // The pool's capacity as live counts it (two members less their metadata).
            let lines = live["capacity_lines"].as_u64().unwrap();
            sim.args(["--cache-devices", "2", "--cache-size"]);
            sim.arg(format!("{}", lines * 4096));
        } else {
            sim.args(["--cache-size", "8MiB"]);
        }
        sim.args(["--policy", "lru", "--mode", mode]);
        sim.args(["--volume-mode", &hm_setting, "--json", "-q"]);
        sim.args(extra);
        if let Some(r) = ram {
            sim.args(["--ram-cache", r]);
        }
        for v in &traces {
            sim.args(["--volume", v]);
        }
        let sim: serde_json::Value = serde_json::from_str(&run(&mut sim)).unwrap();

        // The replay sent every request of both traces, each to its own export.
        assert_eq!(rep["requests"], 1999, "{rep}");
        let rv = rep["volumes"]
            .as_array()
            .expect("per-volume replay figures");
        assert_eq!(
            (&rv[0]["name"], &rv[0]["requests"]),
            (&"hm".into(), &1000.into())
        );
        assert_eq!(
            (&rv[1]["name"], &rv[1]["requests"]),
            (&"vdi".into(), &999.into())
        );
        assert_eq!(rep["errors"], 0, "{rep}");
        assert_eq!(rep["wrapped"], 0, "{rep}");

        let (want, got) = (&sim["counters"], &live["totals"]);
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(
                &got[k], v,
                "{mode}: pool counter {k}: sim {v}, live {}",
                got[k]
            );
        }
        // Per volume, by name: the same counters and the same lines held.
        let sim_vols = sim["volumes"].as_array().expect("sim volumes");
        let live_vols = live["volumes"].as_array().expect("live volumes");
        for name in ["hm", "vdi"] {
            let s = sim_vols.iter().find(|v| v["name"] == name).unwrap();
            let l = live_vols.iter().find(|v| v["name"] == name).unwrap();
            for (k, v) in s["counters"].as_object().unwrap() {
                assert_eq!(
                    &l["counters"][k], v,
                    "{mode}: volume {name} counter {k}: sim {v}, live {}",
                    l["counters"][k]
                );
            }
            assert_eq!(l["cached_lines"], s["lines"], "{mode}: volume {name} lines");
            assert_eq!(l["dirty_lines"], s["dirty_lines"], "{mode}: volume {name}");
            assert_eq!(l["mode"], s["mode"], "{mode}: volume {name}");
        }
        if ram.is_some() {
            // The RAM tier above the pool keys lines by volume: sim and live agree on every
            // read it served, filled and dropped.
            let (sr, lr) = (&sim["ram"], &live["ram"]);
            for k in ["read_requests", "ram_hits", "ssd_hits", "misses"] {
                assert_eq!(sr[k], lr[k], "RAM tier {k}: sim {}, live {}", sr[k], lr[k]);
            }
            for k in ["hits", "fills", "evictions", "invalidations"] {
                assert_eq!(
                    sr["counters"][k], lr["counters"][k],
                    "RAM counter {k}: sim {}, live {}",
                    sr["counters"][k], lr["counters"][k]
                );
            }
            let n = |v: &serde_json::Value| v.as_u64().unwrap();
            assert!(
                n(&sr["ram_hits"]) > 0 && n(&sr["counters"]["evictions"]) > 0,
                "the RAM tier must serve and evict for the comparison to mean something: {sr}"
            );
        } else {
            assert!(
                live["ram"].is_null(),
                "no RAM tier asked for: {}",
                live["ram"]
            );
        }
        // The comparison is worth something: both volumes were cached, lines were evicted
        // and dirty data written back.
        let c = |k: &str| want[k].as_u64().unwrap();
        assert!(c("line_hits") > 0 && c("evictions") > 0, "{want}");
        assert!(c("write_backs") > 0, "{want}");
        for v in sim_vols {
            assert!(v["counters"]["line_hits"].as_u64().unwrap() > 0, "{v}");
        }
        (sim, live)
    }
}
