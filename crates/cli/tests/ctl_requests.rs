//! Issue 17: `ctl stats` shows requests per direction by outcome (casadm's request table: hits,
//! partial misses, full misses, pass-through, total, with shares) in text, JSON and `--csv`,
//! with exact counts for a known request mix sent with qemu-io (one NBD command each).

mod common;

use common::{have, run, Srv};
use std::process::Command;

#[test]
fn request_table_per_direction_counts_a_known_mix_exactly() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    // Write-around: write misses go around the cache (pass-through), reads are cached.
    let srv = Srv::start(d, &["--mode", "write-around"]);
    // One NBD command per qemu-io command (raw format: no probing reads).
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 97 0 4k", // write pass-through
        "-c",
        "write 8k 8k", // write pass-through (two lines)
        "-c",
        "read 0 4k", // read full miss
        "-c",
        "read 0 4k", // read hit
        "-c",
        "read 0 8k", // read partial miss
        "-c",
        "read 40k 4k", // read full miss
        &srv.uri(),
    ]));
    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    let t = &v["totals"];
    let get = |dir: &str, k: &str| t[format!("{dir}_requests")][k].as_u64().unwrap();
    let got: Vec<u64> = ["read", "write"]
        .iter()
        .flat_map(|dir| {
            ["hits", "partial_misses", "full_misses", "pass_through"].map(|k| get(dir, k))
        })
        .collect();
    assert_eq!(got, [1, 1, 2, 0, 0, 0, 0, 2], "{t}");
    // The existing keys stay.
    assert_eq!(
        (t["reads"].as_u64(), t["writes"].as_u64()),
        (Some(4), Some(2))
    );
    assert_eq!(t["full_misses"].as_u64(), Some(4), "{t}");

    let text = srv.ctl(&["stats"]);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name:?} line in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(text.contains("[requests by direction]"), "{text}");
    assert!(line("read hits").ends_with(" 1 requests 25.0 %"), "{text}");
    assert!(
        line("read full misses").ends_with(" 2 requests 50.0 %"),
        "{text}"
    );
    assert!(line("read total").ends_with(" 4 requests"), "{text}");
    assert!(
        line("write pass-through").ends_with(" 2 requests 100.0 %"),
        "{text}"
    );

    let csv = srv.ctl(&["stats", "--csv"]);
    for row in [
        "requests by direction,\"read partial misses\",1,requests",
        "requests by direction,\"read partial misses %\",25.000,%",
        "requests by direction,\"write pass-through\",2,requests",
        "requests by direction,\"write total\",2,requests",
    ] {
        assert!(csv.lines().any(|l| l == row), "{row} missing from\n{csv}");
    }
    srv.stop("-TERM");
}

/// The log layout counts requests by outcome with the direct layout's definitions (a read
/// hits when all its lines are cached; a write when all its lines were cached before it),
/// including requests of several lines, which the live log volume processes line by line.
#[test]
fn log_layout_counts_requests_per_direction_like_the_direct_layout() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let srv = Srv::start(
        d,
        &[
            "--layout",
            "log",
            "--segment-size",
            "256k",
            "--mode",
            "write-back",
        ],
    );
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 97 0 4k", // write full miss (line 0 new)
        "-c",
        "write 0 8k", // write partial miss (line 0 cached, line 1 new)
        "-c",
        "write 0 4k", // write hit
        "-c",
        "read 0 8k", // read hit (two lines)
        "-c",
        "read 0 12k", // read partial miss (line 2 new)
        "-c",
        "read 40k 4k", // read full miss
        "-c",
        "read 40k 4k", // read hit (admitted by the miss)
        &srv.uri(),
    ]));
    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(v["layout"], "log");
    let t = &v["totals"];
    let get = |dir: &str, k: &str| t[format!("{dir}_requests")][k].as_u64().unwrap();
    let got: Vec<u64> = ["read", "write"]
        .iter()
        .flat_map(|dir| {
            ["hits", "partial_misses", "full_misses", "pass_through"].map(|k| get(dir, k))
        })
        .collect();
    assert_eq!(got, [2, 1, 1, 0, 1, 1, 1, 0], "{t}");
    assert_eq!(
        (t["reads"].as_u64(), t["writes"].as_u64()),
        (Some(4), Some(3))
    );
    // Over both directions: hits, partial misses, full misses.
    let both = ["full_hits", "partial_hits", "full_misses"].map(|k| t[k].as_u64());
    assert_eq!(both, [Some(3), Some(2), Some(2)], "{t}");
    // Line hits of writes: lines cached before the write (0, then 1 of 2, then 1).
    assert_eq!(t["write_line_hits"].as_u64(), Some(2), "{t}");

    let text = srv.ctl(&["stats"]);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name:?} line in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(text.contains("[requests by direction]"), "{text}");
    assert!(!text.contains("not counted by the log layout"), "{text}");
    assert!(line("read hits").ends_with(" 2 requests 50.0 %"), "{text}");
    assert!(
        line("write partial misses").ends_with(" 1 requests 33.3 %"),
        "{text}"
    );
    assert!(line("write total").ends_with(" 3 requests"), "{text}");

    let csv = srv.ctl(&["stats", "--csv"]);
    for row in [
        "requests by direction,\"read partial misses\",1,requests",
        "requests by direction,\"read full misses %\",25.000,%",
        "requests by direction,\"write hits\",1,requests",
        "requests by direction,\"write total\",3,requests",
    ] {
        assert!(csv.lines().any(|l| l == row), "{row} missing from\n{csv}");
    }
    srv.stop("-TERM");
}

/// `sim` prints the same per-direction table, and its JSON has it under `counters`, adding up
/// to the reads and writes.
#[test]
fn sim_prints_requests_per_direction() {
    let out = run(Command::new(common::BIN).args([
        "sim",
        "--workload",
        "zipf:theta=0.9,wss=8MiB,requests=3000,read=70",
        "--cache-size",
        "10%",
        "--mode",
        "wa",
        "-q",
    ]));
    for dir in ["reads", "writes"] {
        let l = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{dir} ")) && l.contains("pass-through"))
            .unwrap_or_else(|| panic!("no {dir} request table line in\n{out}"));
        assert!(l.contains("hits") && l.contains("total"), "{l}");
    }
    let v: serde_json::Value = serde_json::from_str(&run(Command::new(common::BIN).args([
        "sim",
        "--workload",
        "zipf:theta=0.9,wss=8MiB,requests=3000,read=70",
        "--cache-size",
        "10%",
        "--mode",
        "wa",
        "--json",
        "-q",
    ])))
    .unwrap();
    let c = &v["counters"];
    for (dir, total) in [("read", "reads"), ("write", "writes")] {
        let d = &c[format!("{dir}_requests")];
        let sum: u64 = ["hits", "partial_misses", "full_misses", "pass_through"]
            .iter()
            .map(|k| d[*k].as_u64().unwrap())
            .sum();
        assert_eq!(Some(sum), c[total].as_u64(), "{c}");
    }
    // Write-around: every write misses the cache unless its line was read first.
    assert!(
        c["write_requests"]["pass_through"].as_u64().unwrap() > 0,
        "{c}"
    );
}
