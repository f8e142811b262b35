//! `tiercache sim --volume NAME=TRACE ...`: several volumes in one pool, as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .output()
        .expect("run tiercache")
}

fn traces() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if p.join("MANIFEST.md").exists() {
        Some(p)
    } else {
        tiercache_testskip::skip!("../shared/traces not found; sim --volume tests not run");
        None
    }
}

#[test]
fn sim_replays_two_named_volumes_with_their_own_modes() {
    let Some(t) = traces() else { return };
    let msr = format!(
        "hm={}",
        t.join("msr_cambridge/msr-cambridge1-sample.csv").display()
    );
    let vdi = format!(
        "vdi={}",
        t.join("systor17/systor17-traces-sample.csv.gz").display()
    );
    let args = [
        "sim",
        "--volume",
        &msr,
        "--volume",
        &vdi,
        "--volume-mode",
        "hm=pt",
        "--volume-admission",
        "vdi=nhit:2",
        "--cache-size",
        "1MiB",
        "--mode",
        "wb",
        "-q",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let o = run(&json_args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let v = j["volumes"].as_array().expect("volumes in the JSON");
    assert_eq!(v.len(), 2);
    assert_eq!(v[0]["name"], "hm");
    assert_eq!(v[0]["mode"], "pass-through");
    assert_eq!(v[0]["lines"], 0);
    assert_eq!(v[0]["requests"], 1000);
    assert_eq!(v[1]["name"], "vdi");
    assert_eq!(v[1]["mode"], "write-back");
    assert_eq!(v[1]["admission"], "nhit:2");
    assert_eq!(v[1]["requests"], 999);
    assert_eq!(j["requests"], 1999);
    // The text report has a row per volume.
    let o = run(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("per volume"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(" hm ") && l.contains("pass-through")),
        "{text}"
    );
}

#[test]
fn sim_volume_errors_name_the_volume() {
    let Some(t) = traces() else { return };
    let msr = format!(
        "hm={}",
        t.join("msr_cambridge/msr-cambridge1-sample.csv").display()
    );
    let o = run(&["sim", "--volume", &msr, "--volume-mode", "db=wb", "-q"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("'db'") && err.contains("hm"), "{err}");
    // Bad values name the flag, the volume and the value (the parser `serve` uses).
    for (flag, bad) in [
        ("--volume-admission", "hm=sometimes"),
        ("--volume-seq-cutoff", "hm=lots"),
    ] {
        let o = run(&["sim", "--volume", &msr, flag, bad, "-q"]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("{flag} {bad}")) && err.contains("volume hm"),
            "{err}"
        );
    }
    let tpcc = format!("tpcc={}", t.join("mqsim/tpcc-small.trace").display());
    let o = run(&["sim", "--volume", &tpcc, "-q"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("volume column"), "{err}");
    let o = run(&["sim", "--volume", "nameless", "-q"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("NAME=TRACE"));
}

/// An MSR-format trace of `n` 4 KiB reads, the `i`th at line `line(i)`, one every 20 µs
/// starting `phase` µs in.
fn msr_trace(path: &Path, n: u64, phase: u64, line: impl Fn(u64) -> u64) {
    let mut s = String::new();
    for i in 0..n {
        let ts = 128_166_385_295_514_663 + (i * 20 + phase) * 10;
        s.push_str(&format!("{ts},v,0,Read,{},4096,100\n", line(i) * 4096));
    }
    std::fs::write(path, s).unwrap();
}

/// `--volume-share scan=0:25%`: a volume streaming a scan 20 times the cache holds at most a
/// quarter of it and the other volume's hot set stays cached (its hit ratio far above the
/// run without the bound, where the scan flushes it).
#[test]
fn sim_volume_share_caps_a_scanning_volume() {
    let dir = tempfile::tempdir().unwrap();
    let (hot, scan) = (dir.path().join("hot.csv"), dir.path().join("scan.csv"));
    msr_trace(&hot, 10_000, 0, |i| i % 150);
    msr_trace(&scan, 20_000, 5, |i| i);
    let hot = format!("hot={}", hot.display());
    let scan = format!("scan={}", scan.display());
    let go = |extra: &[&str]| {
        let mut args = vec![
            "sim",
            "--volume",
            &hot,
            "--volume",
            &scan,
            "--cache-size",
            "800KiB",
            "--line-size",
            "4KiB",
            "--json",
            "-q",
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let v = j["volumes"].as_array().expect("volumes").clone();
        let f = |name: &str, k: &str| {
            v.iter().find(|x| x["name"] == name).unwrap()[k]
                .as_f64()
                .unwrap()
        };
        (
            f("hot", "hit_ratio"),
            f("scan", "pool_share"),
            f("scan", "lines"),
        )
    };
    let (hit_free, share_free, _) = go(&[]);
    let (hit_capped, share_capped, lines) = go(&["--volume-share", "scan=0:25%"]);
    assert!(
        share_capped <= 0.25 && lines <= 50.0,
        "scan holds {lines} lines ({share_capped} of the pool), max 25 %"
    );
    assert!(
        share_free > 0.25,
        "without the bound the scan holds {share_free}"
    );
    assert!(
        hit_capped > 0.9 && hit_capped > hit_free + 0.3,
        "hot hit ratio {hit_capped} capped, {hit_free} without"
    );
    // The same as shares of the pool; errors name the flag, the volume and the value.
    let (_, s2, _) = go(&["--volume-share", "scan=0:0.25"]);
    assert_eq!(s2, share_capped);
    for (bad, want) in [
        ("db=0:0.5", "'db'"),
        ("scan=0.6:0.4", "above maximum"),
        ("scan=lots", "MIN:MAX"),
        ("scan=120%:130%", "outside"),
    ] {
        let o = run(&[
            "sim",
            "--volume",
            &hot,
            "--volume",
            &scan,
            "--volume-share",
            bad,
            "-q",
        ]);
        assert!(!o.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{bad}: {err}");
    }
    let o = run(&[
        "sim",
        "--volume",
        &hot,
        "--volume",
        &scan,
        "--volume-share",
        "scan=0.6:1",
        "--volume-share",
        "hot=0.5:1",
        "-q",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("minimum shares add up"), "{err}");
}
