//! `tiercache sim --layout log` and `tiercache nitro-table` as a user runs them.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .output()
        .expect("run tiercache")
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = run(args);
    assert!(
        o.status.success(),
        "tiercache {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

const STORM: &str = "boot-storm:vms=8,image=2MiB,overlap=90%";

#[test]
fn sim_log_layout_reports_data_reduction() {
    let base = [
        "sim",
        "--workload",
        STORM,
        "--cache-size",
        "4MiB",
        "--layout",
        "log",
        "--segment-size",
        "256KiB",
        "--erase-block",
        "256KiB",
        "--json",
        "-q",
    ];
    let plain = json(&base);
    let mut args = base.to_vec();
    args.extend(["--dedup", "1.0", "--compression", "zstd:3"]);
    let dc = json(&args);
    // The one result schema: the direct layout's keys, the log layout's own under "log".
    for k in ["ssd_bytes_written", "read_hit_ratio", "hit_ratio"] {
        assert!(dc.get(k).is_some_and(|v| v.is_number()), "missing {k}");
    }
    assert_eq!(dc["layout"], "log");
    for k in [
        "erasures",
        "write_amplification",
        "dedup_ratio",
        "compression_ratio",
        "effective_capacity",
        "index_bytes_per_entry",
    ] {
        assert!(
            dc["log"].get(k).is_some_and(|v| v.is_number()),
            "missing log.{k}"
        );
    }
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    let g = |v: &serde_json::Value, k: &str| v["log"][k].as_f64().unwrap();
    assert!(f(&dc, "read_hit_ratio") > f(&plain, "read_hit_ratio"));
    assert!(f(&dc, "ssd_bytes_written") < f(&plain, "ssd_bytes_written"));
    assert!(g(&dc, "dedup_ratio") > 1.5 && g(&dc, "compression_ratio") > 1.5);
    assert_eq!(g(&plain, "index_bytes_per_entry"), 0.0);
    // Same seed, same numbers (the wall-clock figures aside).
    let strip = |mut v: serde_json::Value| {
        for k in ["wall_s", "requests_per_s"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    };
    assert_eq!(strip(json(&args)), strip(dc));
}

#[test]
fn bad_layout_flags_are_explained() {
    let o = run(&["sim", "--workload", STORM, "--layout", "lsm", "-q"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected direct or log"));
    let o = run(&[
        "sim",
        "--workload",
        STORM,
        "--layout",
        "log",
        "--segment-size",
        "128MiB",
        "-q",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("64 MiB"));
    let o = run(&[
        "sim",
        "--workload",
        STORM,
        "--layout",
        "log",
        "--compression",
        "gzip",
        "-q",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown compression"));
}

#[test]
fn nitro_table_has_eight_rows_per_workload() {
    let rows = json(&[
        "nitro-table",
        "--boot-storm",
        "vms=8,image=2MiB",
        "--boot-cache",
        "3MiB",
        "--segment-size",
        "256KiB",
        "--erase-block",
        "256KiB",
        "--json",
    ]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8);
    let o = run(&[
        "nitro-table",
        "--boot-storm",
        "vms=8,image=2MiB",
        "--boot-cache",
        "3MiB",
        "--segment-size",
        "256KiB",
        "--erase-block",
        "256KiB",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("WEU (D,C)") && text.contains("Extent (ND,NC)"),
        "{text}"
    );
}

#[test]
fn snapshot_restore_and_experiment_file_select_the_log_layout() {
    let r = json(&[
        "sim",
        "--workload",
        "snapshot-restore:image=4MiB,snapshots=20",
        "--cache-size",
        "6MiB",
        "--layout",
        "log",
        "--segment-size",
        "256KiB",
        "--dedup",
        "1",
        "--json",
        "-q",
    ]);
    // Restores read their lines from the backing device (their content is known only then,
    // as live) and share the primary's extents: cached lines outnumber stored extents.
    assert_eq!(r["log"]["counters"]["dup_read_hits"], 0);
    assert!(
        r["log"]["dedup_ratio"].as_f64().unwrap() > 1.2,
        "restores reuse the primary: {}",
        r["log"]
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("nitro.toml");
    std::fs::write(
        &f,
        "[input]\nworkload = \"boot-storm:vms=8,image=2MiB\"\n[cache]\nsize = \"3MiB\"\nlayout = \"log\"\nsegment_size = \"256KiB\"\ncompression = \"lz4\"\ndedup = 1.0\n",
    )
    .unwrap();
    let r = json(&["sim", "--config", f.to_str().unwrap(), "--json", "-q"]);
    assert_eq!(r["layout"], "log");
    assert_eq!(r["log"]["segment_size"], 256 << 10);
    assert!(r["log"]["compression_ratio"].as_f64().unwrap() > 1.5);
}
