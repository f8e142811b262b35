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
