//! The two direct-layout engine settings that were `sim`-only work live with the same flags:
//! `--clean-victim-window N` (eviction prefers a clean line among the policy's next N likely
//! victims) and `--no-partial-fill` (a partial write to an uncached line goes around the
//! cache). A live replay at queue depth 1 gives the simulator's counters with either flag;
//! `ctl set clean-victim-window` / `ctl set partial-fill` change them on a running volume,
//! and a restart keeps them (stored in the superblock's settings block); the log layout
//! refuses them by name.

mod common;

use common::{have, replay_qd1, sim_8m, Srv};
use std::path::Path;

/// Zipf over 32 MiB with writes at 256-byte alignment (partial sectors): an 8 MiB
/// write-back cache evicts dirty lines, and partial writes miss uncached lines.
const ZIPF: &str =
    "zipf:theta=0.8,wss=32MiB,requests=3000,read=70,size=4k@60+16k@20+1k@20,align=256";

fn setup(d: &Path) {
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
}

fn workload(seed: &str) -> Vec<String> {
    vec![
        "--workload".into(),
        ZIPF.into(),
        "--seed".into(),
        seed.into(),
    ]
}

/// `replay --nbd` of the workload at queue depth 1; returns the requests sent.
fn replay(srv: &Srv, seed: &str) -> u64 {
    let rep = replay_qd1(&srv.uri(), workload(seed));
    rep["requests"].as_u64().unwrap()
}

/// `tiercache sim`'s counters for the workload on an 8 MiB write-back LRU cache.
fn sim(flags: &[&str]) -> serde_json::Value {
    let w = workload("7");
    sim_8m(
        "write-back",
        flags.iter().copied().chain(w.iter().map(|s| s.as_str())),
    )["counters"]
        .clone()
}

fn c(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("counter {k} not a number: {v}"))
}

/// Live = sim counter for counter with each flag, and the flag changes the simulator's
/// counters (so the equality proves the live volume applied it): `--clean-victim-window 8`
/// evicts fewer dirty lines, `--no-partial-fill` sends partial writes around the cache.
#[test]
fn replay_with_each_flag_matches_the_simulator_exactly() {
    if !have("nbdcopy") {
        return;
    }
    let plain = sim(&[]);
    assert!(
        c(&plain, "dirty_evictions") > 0,
        "the workload must evict dirty lines: {plain}"
    );
    assert_eq!(c(&plain["bypasses"], "partial_write"), 0, "{plain}");
    let cases: [(&str, &[&str]); 2] = [
        ("clean-victim-window 8", &["--clean-victim-window", "8"]),
        ("no-partial-fill", &["--no-partial-fill"]),
    ];
    for (what, flags) in cases {
        let want = sim(flags);
        match what {
            "no-partial-fill" => assert!(
                c(&want["bypasses"], "partial_write") > 0,
                "{what}: no partial write went around: {want}"
            ),
            _ => assert!(
                c(&want, "dirty_evictions") < c(&plain, "dirty_evictions"),
                "{what}: no dirty eviction avoided: {want} vs {plain}"
            ),
        }
        let dir = common::tmp();
        setup(dir.path());
        let mut args = vec![
            "--policy",
            "lru",
            "--mode",
            "write-back",
            "--cleaner",
            "inline",
        ];
        args.extend(flags);
        let srv = Srv::start(dir.path(), &args);
        let sent = replay(&srv, "7");
        let live = srv.stats();
        srv.stop("-TERM");
        let got = &live["totals"];
        assert_eq!(
            Some(sent),
            want["requests"].as_u64(),
            "{what}: every request sent"
        );
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&got[k], v, "{what}: counter {k}: sim {v}, live {}", got[k]);
        }
        assert_ne!(want, plain, "{what}: the flag changed nothing");
    }
}

/// `ctl set` of each on a running volume (started without either flag) changes its
/// behaviour: a replay after them gives `sim --clean-victim-window 8 --no-partial-fill`'s
/// counters exactly, which differ from those with either flag alone (so both were applied).
/// Each is logged `old -> new` and stored: a restart without flags keeps them (and the
/// write-back rate set before the last of them); `partial-fill on` turns the fill back on.
#[test]
fn ctl_set_changes_them_live_and_a_restart_keeps_them() {
    if !have("nbdcopy") {
        return;
    }
    let both = sim(&["--clean-victim-window", "8", "--no-partial-fill"]);
    for alone in [&["--clean-victim-window", "8"][..], &["--no-partial-fill"]] {
        assert_ne!(
            both,
            sim(alone),
            "{alone:?} alone: the other flag changed nothing"
        );
    }
    let dir = common::tmp();
    let d = dir.path();
    setup(d);
    let inline = [
        "--mode",
        "write-back",
        "--policy",
        "lru",
        "--cleaner",
        "inline",
    ];
    let srv = Srv::start(d, &inline);
    assert_eq!(srv.ctl(&["get", "clean-victim-window"]).trim(), "0");
    assert_eq!(srv.ctl(&["get", "partial-fill"]).trim(), "on");
    let out = srv.ctl(&["set", "clean-victim-window", "8"]);
    assert!(out.contains('8'), "{out}");
    srv.ctl(&["set", "partial-fill", "off"]);
    assert_eq!(srv.ctl(&["get", "clean-victim-window"]).trim(), "8");
    assert_eq!(srv.ctl(&["get", "partial-fill"]).trim(), "off");
    replay(&srv, "7");
    let got = srv.stats()["totals"].clone();
    for (k, v) in both.as_object().unwrap() {
        assert_eq!(
            &got[k], v,
            "set live: counter {k}: sim {v}, live {}",
            got[k]
        );
    }
    // A non-cleaner key set after the write-back rate keeps the stored rate.
    srv.ctl(&["set", "writeback-rate", "300"]);
    srv.ctl(&["set", "clean-victim-window", "4"]);
    let log = srv.stop("-TERM");
    assert!(log.contains("setting partial-fill: on -> off"), "{log}");
    assert!(log.contains("setting clean-victim-window: 0 -> 8"), "{log}");
    assert!(log.contains("setting clean-victim-window: 8 -> 4"), "{log}");

    let maddr = format!("127.0.0.1:{}", common::free_port());
    let srv = Srv::start(d, &["--cleaner", "inline", "--metrics", &maddr]);
    assert_eq!(srv.ctl(&["get", "clean-victim-window"]).trim(), "4");
    let prom = common::metrics(&maddr);
    for want in [
        "tiercache_setting_clean_victim_window 4",
        "tiercache_setting_partial_write_fill 0",
    ] {
        assert!(prom.contains(want), "{want} missing from:\n{prom}");
    }
    assert_eq!(srv.ctl(&["get", "partial-fill"]).trim(), "off");
    assert_eq!(srv.ctl(&["get", "writeback-rate"]).trim(), "300");
    let text = srv.ctl(&["stats"]);
    assert!(
        text.contains("clean-victim-window 4, partial-fill off"),
        "{text}"
    );
    srv.ctl(&["stats", "--reset"]);
    replay(&srv, "8");
    let st = srv.stats()["totals"].clone();
    assert!(
        c(&st["bypasses"], "partial_write") > 0,
        "partial-fill off after the restart: {st}"
    );
    srv.ctl(&["set", "partial-fill", "on"]);
    srv.ctl(&["stats", "--reset"]);
    replay(&srv, "9");
    let st = srv.stats()["totals"].clone();
    assert_eq!(
        c(&st["bypasses"], "partial_write"),
        0,
        "partial-fill on again: {st}"
    );
    srv.stop("-TERM");
    // A flag of a later run wins over the stored value.
    let srv = Srv::start(d, &["--clean-victim-window", "2"]);
    assert_eq!(srv.ctl(&["get", "clean-victim-window"]).trim(), "2");
    assert_eq!(srv.ctl(&["get", "partial-fill"]).trim(), "on");
    srv.stop("-TERM");
}
