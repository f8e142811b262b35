//! The `tiercache` binary as a user runs it: help, machine output, errors, sweeps, traces,
//! the demo and the warm-up calculator.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run tiercache")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "tiercache {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("valid JSON")
}

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if p.join("MANIFEST.md").exists() {
        Some(p)
    } else {
        tiercache_testskip::skip!(
            "../shared/traces not found beside the checkout; real-trace CLI tests not run"
        );
        None
    }
}

#[test]
fn help_teaches() {
    let top = ok(&["--help"]);
    for w in ["demo", "sim", "sweep", "trace", "warmup", "policies"] {
        assert!(top.contains(w), "top-level help lacks {w}");
    }
    let sim = ok(&["sim", "--help"]);
    for w in [
        "--trace",
        "--format",
        "--workload",
        "--policy",
        "--cache-size",
        "--line-size",
        "--mode",
        "--admission",
        "--seed",
        "--json",
        "--csv",
        "--quiet",
        "--hdd",
        "--ssd",
        "--no-cache",
        "--raid",
        "--queue-depth",
        "--speedup",
        "Examples",
    ] {
        assert!(sim.contains(w), "sim --help lacks {w}");
    }
}

#[test]
fn sim_json_has_the_contract_fields() {
    let v = json(&[
        "sim",
        "--workload",
        "zipf:theta=0.9,wss=64MiB,requests=20000",
        "--cache-size",
        "10%",
        "--policy",
        "lru",
        "--mode",
        "wb",
        "--seed",
        "3",
        "--json",
        "-q",
    ]);
    for k in [
        "requests",
        "line_accesses",
        "line_hits",
        "read_hit_ratio",
        "hit_ratio",
        "evictions",
        "ssd_bytes_written",
        "hdd_bytes_read",
        "hdd_bytes_written",
    ] {
        assert!(v.get(k).is_some(), "JSON lacks {k}");
    }
    assert_eq!(v["requests"], 20000);
    assert_eq!(v["mode"], "write-back");
    // Same seed, same answer.
    let w = json(&[
        "sim",
        "--workload",
        "zipf:theta=0.9,wss=64MiB,requests=20000",
        "--cache-size",
        "10%",
        "--mode",
        "wb",
        "--seed",
        "3",
        "--json",
        "-q",
    ]);
    assert_eq!(v["line_hits"], w["line_hits"]);
}

#[test]
fn csv_output_is_a_header_and_a_row() {
    let out = ok(&[
        "sim",
        "--workload",
        "uniform:wss=16MiB,requests=5000",
        "--cache-size",
        "1MiB",
        "--csv",
        "-q",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    // Fields outside quotes (the workload label is quoted: it contains commas).
    let fields = |l: &str| {
        let mut quoted = false;
        1 + l
            .chars()
            .filter(|&c| {
                if c == '"' {
                    quoted = !quoted;
                }
                c == ',' && !quoted
            })
            .count()
    };
    assert_eq!(fields(lines[0]), fields(lines[1]));
    assert!(lines[1].starts_with("\"uniform:"));
    assert!(lines[0].starts_with("input,policy,mode"));
}

#[test]
fn bad_input_gives_clear_errors() {
    let o = run(&[
        "sim",
        "--workload",
        "zipf:wss=1GiB",
        "--policy",
        "nope",
        "-q",
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("unknown policy 'nope'") && e.contains("lru"),
        "{e}"
    );
    let o = run(&["sim", "-q"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--trace FILE"),
        "no-input message"
    );
    let o = run(&[
        "sim",
        "--workload",
        "zipf:wss=1GiB",
        "--cache-size",
        "ten",
        "-q",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("'ten' is not a size"));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.csv");
    std::fs::write(&p, "time_ns,op,offset,len\n0,read,0,4096\n1,jump,0,4096\n").unwrap();
    let o = run(&["sim", "--trace", p.to_str().unwrap(), "-q"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("t.csv:3") && e.contains("jump"), "{e}");
    let o = run(&[
        "sim",
        "--trace",
        p.to_str().unwrap(),
        "--skip-bad",
        "--cache-size",
        "64KiB",
        "--json",
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn sweep_writes_one_row_per_cell() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.csv");
    ok(&[
        "sweep",
        "--workload",
        "zipf:wss=32MiB,requests=10000",
        "--sizes",
        "1%,5%,10%",
        "--policies",
        "lru,fifo",
        "--modes",
        "wt,wb",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1 + 3 * 2 * 2);
}

#[test]
fn sweep_reads_a_trace_once_and_matches_per_run_sweeps() {
    let Some(dir) = shared() else { return };
    let trace = dir.join("systor17/systor17-traces-sample.csv.gz");
    let t = trace.to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut v = vec![
            "sweep",
            "--trace",
            t,
            "--sizes",
            "1%,5%,10%,256KiB",
            "--policies",
            "lru,s3fifo,belady",
            "--modes",
            "wt,wb",
            "--json",
            "-q",
        ];
        v.extend_from_slice(extra);
        v
    };
    let strip = |mut v: serde_json::Value| {
        for r in v.as_array_mut().unwrap() {
            let o = r.as_object_mut().unwrap();
            o.remove("wall_s").unwrap();
            o.remove("requests_per_s").unwrap();
            o.remove("method").unwrap();
        }
        v
    };
    let one_pass = strip(json(&args(&[])));
    let per_run = strip(json(&args(&["--per-run"])));
    assert_eq!(one_pass.as_array().unwrap().len(), 4 * 3 * 2);
    assert_eq!(one_pass, per_run);
    assert!(one_pass[0]["line_hits"].as_u64().unwrap() > 0);
    assert!(ok(&["sweep", "--help"]).contains("--per-run"));
}

#[test]
fn sweep_takes_lru_sizes_from_one_stack_pass_and_says_so() {
    let Some(dir) = shared() else { return };
    let trace = dir.join("systor17/systor17-traces-sample.csv.gz");
    let t = trace.to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut v = vec![
            "sweep",
            "--trace",
            t,
            "--sizes",
            "1%,5%,10%,50%,256KiB",
            "--policies",
            "lru,fifo",
            "--validity",
            "line",
            "--json",
            "-q",
        ];
        v.extend_from_slice(extra);
        v
    };
    let methods = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["method"].as_str().unwrap().to_string())
            .collect()
    };
    let strip = |mut v: serde_json::Value| {
        for r in v.as_array_mut().unwrap() {
            let o = r.as_object_mut().unwrap();
            for k in ["wall_s", "requests_per_s", "method"] {
                o.remove(k).unwrap();
            }
        }
        v
    };
    let stack = json(&args(&[]));
    let engines = json(&args(&["--per-engine"]));
    // Sizes vary fastest: the 5 LRU cells, then the 5 FIFO cells.
    let want: Vec<&str> = [["stack"; 5], ["engines"; 5]].concat();
    assert_eq!(methods(&stack), want);
    assert_eq!(methods(&engines), ["engines"; 10]);
    assert_eq!(strip(stack), strip(engines));
    // Write-back: the engines, by themselves.
    let wb = json(&args(&["--mode", "wb"]));
    assert_eq!(methods(&wb), ["engines"; 10]);
    assert!(ok(&["sweep", "--help"]).contains("--per-engine"));
}

#[test]
fn trace_gen_stats_and_convert() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("g.csv.zst");
    ok(&[
        "trace",
        "gen",
        "seq:wss=8MiB,requests=1000,read=100,size=4k",
        "-o",
        t.to_str().unwrap(),
    ]);
    let s = json(&["trace", "stats", t.to_str().unwrap(), "--json", "-q"]);
    assert_eq!(s["requests"], 1000);
    assert_eq!(s["footprint_blocks"], 1000);
    assert!(s["sequential_share"].as_f64().unwrap() > 0.99);
    let v = dir.path().join("g.vscsi");
    ok(&[
        "trace",
        "convert",
        t.to_str().unwrap(),
        v.to_str().unwrap(),
        "--to",
        "vscsi",
    ]);
    let s2 = json(&["trace", "stats", v.to_str().unwrap(), "--json", "-q"]);
    assert_eq!(s2["footprint_blocks"], 1000);
    assert!(ok(&["trace", "formats"]).contains("oracle-general"));
}

#[test]
fn experiment_files_in_the_repo_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let text = std::fs::read_to_string(&p).unwrap();
            let exp: tiercache_sim::Experiment =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if exp.input.workload.is_some() {
                exp.input
                    .to_input()
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            }
        }
    }
}

#[test]
fn cloudphysics_lru_matches_the_manifest() {
    let Some(dir) = shared() else { return };
    let t = dir.join("cloudPhysicsIO/cloudPhysicsIO.csv");
    for (pct, miss) in [("1%", 0.8969), ("10%", 0.8741)] {
        let v = json(&[
            "sim",
            "--trace",
            t.to_str().unwrap(),
            "--cache-size",
            pct,
            "--validity",
            "line",
            "--json",
            "-q",
        ]);
        let m = v["miss_ratio"].as_f64().unwrap();
        assert!((m - miss).abs() < 5e-5, "{pct}: {m}");
    }
    let exp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/cloudphysics-lru.toml");
    let v = json(&["sim", "--config", exp.to_str().unwrap(), "--json", "-q"]);
    assert!((v["miss_ratio"].as_f64().unwrap() - 0.8741).abs() < 5e-5);
}

#[test]
fn demo_compares_policies() {
    let out = ok(&["demo", "--requests", "40000", "-q"]);
    assert!(out.contains("hit ratio"));
    for p in ["no cache", "lru", "fifo", "slru", "arc", "s3fifo", "belady"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{p} "))),
            "demo table lacks a row for {p}:\n{out}"
        );
    }
}

#[test]
fn warmup_estimate_matches_qsan() {
    let v = json(&[
        "warmup",
        "--cache-size",
        "10GiB",
        "--threshold",
        "1",
        "--disk-iops",
        "430",
        "--io-size",
        "4k",
        "--disks",
        "12",
        "--json",
    ]);
    assert!((v["estimate_s"].as_f64().unwrap() - 508.03).abs() < 0.01);
}

#[test]
fn mrc_equals_lru_runs() {
    let w = "zipf:theta=0.9,wss=16MiB,requests=20000,read=100,size=4k";
    let v = json(&[
        "mrc",
        "--workload",
        w,
        "--seed",
        "2",
        "--points",
        "5",
        "--json",
        "-q",
    ]);
    let pts = v["points"].as_array().unwrap();
    assert_eq!(pts.len(), 5);
    for p in pts {
        let lines = p["cache_lines"].as_u64().unwrap();
        let size = format!("{}", lines * 4096);
        let s = json(&[
            "sim",
            "--workload",
            w,
            "--seed",
            "2",
            "--cache-size",
            &size,
            "--json",
            "-q",
        ]);
        let miss = s["miss_ratio"].as_f64().unwrap();
        assert!(
            (p["miss_ratio"].as_f64().unwrap() - miss).abs() < 1e-9,
            "{lines} lines"
        );
    }
}

#[test]
fn ghost_policies_report_the_same_memory_in_every_process() {
    // Every figure must be a function of the input and seed, memory included: a hash map
    // seeded per process (as std's and hashbrown's defaults are) could make it vary by run.
    for policy in ["s3fifo", "arc"] {
        let args = [
            "sim",
            "--workload",
            "zipf:theta=0.9,wss=400m,requests=200000,size=4k",
            "--cache-size",
            "5%",
            "--policy",
            policy,
            "--json",
            "-q",
        ];
        let runs: Vec<_> = (0..3)
            .map(|_| json(&args)["index_bytes_per_line"].as_f64().unwrap())
            .collect();
        assert!(
            runs.windows(2).all(|w| w[0] == w[1]),
            "{policy}: index bytes per line differ by process: {runs:?}"
        );
    }
}

fn repo(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(p)
        .display()
        .to_string()
}

#[test]
fn dss_policy_classes_and_fileserver_workload() {
    let fs = repo("experiments/classes/filesystem.toml");
    let args = |policy: &'static str| {
        vec![
            "sim",
            "-q",
            "--workload",
            "fileserver:scale=0.001",
            "--policy",
            policy,
            "--mode",
            "wb",
            "--admission",
            "nhit:0:1",
            "--json",
        ]
    };
    let mut a = args("dss");
    a.extend(["--classes", fs.as_str()]);
    let v = json(&a);
    assert_eq!(v["policy"], "dss");
    assert_eq!(v["class_names"]["1"], "metadata");
    assert!(v["classes"]["1"]["line_hits"].as_u64().unwrap() > 0);
    assert!(v["classes"]["3"]["requests"].as_u64().unwrap() > 0);
    // DSS keeps metadata and directories: their hit ratio beats LRU's.
    let l = json(&args("lru"));
    let hits = |v: &serde_json::Value, c: &str| v["classes"][c]["line_hits"].as_u64().unwrap();
    assert!(hits(&v, "1") + hits(&v, "3") > hits(&l, "1") + hits(&l, "3"));
    // The table view names the classes.
    let mut t = args("dss");
    t.pop();
    t.extend(["--classes", fs.as_str()]);
    assert!(ok(&t).contains("metadata"));
}

#[test]
fn bad_class_table_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(
        &p,
        "version = 1\n\n[[class]]\nid = 99\nname = \"x\"\npriority = 0\nallocation = \"always\"\n",
    )
    .unwrap();
    let o = run(&[
        "sim",
        "-q",
        "--workload",
        "zipf:wss=1MiB,requests=100",
        "--classes",
        p.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.toml:3: class id 99 is not in 0..=31"),
        "{err}"
    );
}

#[test]
fn partitions_apply_to_lru_and_rules_classify() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rules.toml");
    // Writes are class 5, capped at 10 % of the cache; reads stay class 0.
    std::fs::write(
        &p,
        "version = 1\n[[class]]\nid = 5\nname = \"writes\"\npriority = 3\nallocation = \"conditional\"\nmax_share = 0.1\n[[rule]]\nclass = 5\nop = \"write\"\n",
    )
    .unwrap();
    let v = json(&[
        "sim",
        "-q",
        "--workload",
        "uniform:wss=64MiB,requests=20000,read=50",
        "--cache-size",
        "4MiB",
        "--policy",
        "lru",
        "--classes",
        p.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(v["class_names"]["5"], "writes");
    let w = &v["classes"]["5"];
    assert_eq!(
        w["requests"].as_u64().unwrap(),
        w["writes"].as_u64().unwrap()
    );
    assert!(v["classes"]["0"]["reads"].as_u64().unwrap() > 0);
    assert_eq!(v["classes"]["0"]["writes"].as_u64().unwrap(), 0);
}

#[test]
fn dss_table_prints_the_seed_beside_ours() {
    let out = ok(&["dss-table", "--scale", "0.001", "--disks", "7200"]);
    for s in [
        "MacroTrans",
        "MacroFind",
        "Table 3 (hdd:7200)",
        "Table 4 (hdd:7200)",
        "(217%)",
    ] {
        assert!(out.contains(s), "missing {s}:\n{out}");
    }
}

#[test]
fn serve_file_takes_a_bare_port_as_loopback_and_explains_bad_addresses() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("disk.img");
    std::fs::File::create(&f).unwrap().set_len(1 << 20).unwrap();
    let o = run(&[
        "serve-file",
        "--file",
        f.to_str().unwrap(),
        "--listen",
        "no:such:port",
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("PORT, ADDR:PORT or HOST:PORT"), "{e}");
    // A bare port binds 127.0.0.1: a client on loopback gets the export.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = bin()
        .args(["serve-file", "--file", f.to_str().unwrap(), "--listen"])
        .arg(port.to_string())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let connected = loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break true;
        }
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        connected,
        "serve-file --listen {port} did not listen on 127.0.0.1"
    );
}

#[test]
fn sim_fails_a_pool_member_mid_run() {
    let base = [
        "sim",
        "--workload",
        "zipf:theta=0.9,wss=64MiB,requests=20000,read=70",
        "--cache-size",
        "50%",
        "--mode",
        "wb",
        "--ssd",
        "default",
        "--ssd",
        "default",
        "--queue-depth",
        "4",
        "-q",
    ];
    let text = ok(&[&base[..], &["--fail-ssd", "1@0.5"]].concat());
    assert!(
        text.contains("member fail  member 1 failed at"),
        "no failure line:\n{text}"
    );
    let v = json(&[&base[..], &["--fail-ssd", "0@0.5", "--json"]].concat());
    assert_eq!(v["ssd_failure"]["member"], 0);
    assert!(v["ssd_failure"]["at_s"].as_f64().unwrap() >= 0.5);
    for bad in ["1", "x@1", "1@-2"] {
        let o = run(&[&base[..], &["--fail-ssd", bad]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("--fail-ssd"),
            "{bad}: {err}"
        );
    }
}

/// A write-back simulation of a Zipf workload that overflows a 16 MiB cache (the pool tests).
const POOL_SIM: [&str; 8] = [
    "sim",
    "--workload",
    "zipf:theta=0.9,wss=64MiB,requests=20000,read=50,size=4k",
    "--cache-size",
    "16MiB",
    "--mode",
    "wb",
    "-q",
];

/// `sim --cache-devices N` splits the cache over N devices as `serve --cache A --cache B`
/// does, untimed (what a queue-depth-1 live replay counts: `replay_volumes` checks it against a
/// live pool) or timed (N devices of the one `--ssd` model, the same run as `--ssd` given N
/// times); the mirrored copies cost SSD writes; bad counts are refused.
#[test]
fn sim_cache_devices_splits_the_cache_untimed_and_timed() {
    let base = [&POOL_SIM[..], &["--json"]].concat();
    let w = |v: &serde_json::Value| v["ssd_bytes_written"].as_u64().unwrap();
    let one = json(&base);
    let two = json(&[&base[..], &["--cache-devices", "2"]].concat());
    let single = json(&[&base[..], &["--cache-devices", "2", "--dirty-copies", "1"]].concat());
    assert!(
        two["elapsed_s"].is_null() && two["iops"].is_null(),
        "untimed: {two}"
    );
    assert_eq!(
        w(&single),
        w(&one),
        "one copy writes what one device writes"
    );
    assert!(
        w(&two) as f64 > 1.3 * w(&one) as f64,
        "mirrored: {} SSD bytes written, one device {}",
        w(&two),
        w(&one)
    );
    let timed = [&base[..], &["--queue-depth", "4"]].concat();
    let by_count = json(&[&timed[..], &["--ssd", "default", "--cache-devices", "2"]].concat());
    let by_list = json(&[&timed[..], &["--ssd", "default", "--ssd", "default"]].concat());
    for k in ["line_hits", "ssd_bytes_written", "write_backs", "iops"] {
        assert_eq!(by_count[k], by_list[k], "{k}: {by_count} vs {by_list}");
    }
    assert_eq!(by_count["ssd_members"].as_array().unwrap().len(), 2);
    for (args, why) in [
        (
            &[
                "--cache-devices",
                "3",
                "--ssd",
                "default",
                "--ssd",
                "default",
            ][..],
            "--cache-devices 3 with 2 --ssd",
        ),
        (&["--cache-devices", "9"][..], "1 to 8"),
        (
            &["--cache-devices", "1", "--dirty-copies", "2"][..],
            "needs a pool",
        ),
    ] {
        let o = run(&[&base[..], args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{args:?}: {err}");
    }
}

/// A write-back pool in `sim` mirrors dirty lines as `serve` does (`--dirty-copies 2`, the
/// default on two or more `--ssd`): every dirty line is written to two members, so the SSDs
/// take more writes than one device's cache of the same size, and a member failing mid-run
/// loses no dirty line (its lines are served from their copies); with `--dirty-copies 1`
/// the same failure loses some. Before, a simulated pool never mirrored: it wrote exactly
/// what one SSD does and lost the failed member's dirty lines, unlike the live pool.
#[test]
fn sim_mirrors_dirty_lines_in_a_write_back_pool_as_serve_does() {
    let base = [&POOL_SIM[..], &["--queue-depth", "4", "--json"]].concat();
    let one = json(&[&base[..], &["--ssd", "default"]].concat());
    let pool = [&base[..], &["--ssd", "default", "--ssd", "default"]].concat();
    let two = json(&pool);
    let single = json(&[&pool[..], &["--dirty-copies", "1"]].concat());
    let w = |v: &serde_json::Value| v["ssd_bytes_written"].as_u64().unwrap();
    assert_eq!(w(&single), w(&one), "one copy writes what one SSD writes");
    assert!(
        w(&two) as f64 > 1.3 * w(&one) as f64,
        "mirrored: {} SSD bytes written, one SSD {}",
        w(&two),
        w(&one)
    );
    let fail = |extra: &[&str]| {
        json(&[&pool[..], extra, &["--fail-ssd", "1@0.3"]].concat())["ssd_failure"].clone()
    };
    let f2 = fail(&[]);
    assert_eq!(f2["lost_dirty_lines"], 0, "{f2}");
    assert!(f2["promoted_dirty_lines"].as_u64().unwrap() > 0, "{f2}");
    let f1 = fail(&["--dirty-copies", "1"]);
    assert!(f1["lost_dirty_lines"].as_u64().unwrap() > 0, "{f1}");
    assert_eq!(f1["promoted_dirty_lines"], 0, "{f1}");
    for (bad, why) in [("3", "1 or 2"), ("2", "needs a pool")] {
        let args = match bad {
            "2" => [&base[..], &["--ssd", "default", "--dirty-copies", bad]].concat(),
            _ => [&pool[..], &["--dirty-copies", bad]].concat(),
        };
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{bad}: {err}");
    }
}
