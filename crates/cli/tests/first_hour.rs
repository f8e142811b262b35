//! A new user's first hour (issue 17): no quiet failures, and the conventions of the tools
//! they already know (libCacheSim, fio, casadm).

mod common;

use common::BIN;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run tiercache")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> Output {
    let o = run(args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "tiercache {args:?} failed:\n{out}{err}");
    o
}

fn fails(args: &[&str]) -> String {
    let o = run(args);
    let (out, err) = text(&o);
    assert!(
        !o.status.success(),
        "tiercache {args:?} succeeded but should fail:\n{out}{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&ok(args).stdout).expect("valid JSON")
}

/// A small simple-format trace: `n` 4 KiB requests over 256 blocks, reads and writes.
fn small_trace(dir: &Path, n: usize) -> PathBuf {
    let p = dir.join("t.csv");
    let mut f = std::fs::File::create(&p).unwrap();
    writeln!(f, "time_ns,op,offset,len,class,volume,fua").unwrap();
    for i in 0..n {
        let op = if i % 3 == 0 { "write" } else { "read" };
        let block = (i * 7919) % 256;
        writeln!(f, "{},{op},{},4096,0,0,0", i * 1000, block * 4096).unwrap();
    }
    p
}

const WORKLOAD: &str = "zipf:theta=0.9,wss=16MiB,requests=20000";

/// Runs `args` with its standard output a pipe whose reader is already gone, as
/// `tiercache ... | head -1` does once head has read its line.
fn into_closed_pipe(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), 2000);
    let t = t.to_str().unwrap();
    for args in [
        vec!["policies"],
        vec!["trace", "formats"],
        vec!["mrc", "--trace", t, "--points", "500", "-q"],
        vec!["sweep", "--trace", t, "--sizes", "1%,5%", "-q"],
        vec!["sim", "--trace", t, "-q", "--json"],
    ] {
        let o = into_closed_pipe(&args);
        let (_, err) = text(&o);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "tiercache {args:?} into a closed pipe: {:?}\n{err}",
            o.status
        );
        use std::os::unix::process::ExitStatusExt;
        assert!(
            o.status.success() || o.status.signal() == Some(libc::SIGPIPE),
            "tiercache {args:?} into a closed pipe: {:?}\n{err}",
            o.status
        );
    }
}

#[test]
fn a_cache_size_below_one_is_a_share_of_the_footprint() {
    let frac = json(&["sim", "-w", WORKLOAD, "--cache-size", "0.1", "--json", "-q"]);
    let pct = json(&["sim", "-w", WORKLOAD, "--cache-size", "10%", "--json", "-q"]);
    assert!(frac["capacity_lines"].as_u64().unwrap() > 0, "{frac}");
    assert_eq!(frac["capacity_lines"], pct["capacity_lines"]);
    assert_eq!(frac["hit_ratio"], pct["hit_ratio"]);
    for zero in ["0", "0.0", "100"] {
        let err = fails(&["sim", "-w", WORKLOAD, "--cache-size", zero, "-q"]);
        assert!(err.contains("0 lines"), "--cache-size {zero}: {err}");
    }
    // A sweep refuses a 0-line cell too.
    let err = fails(&["sweep", "-w", WORKLOAD, "--sizes", "10%,0.00001", "-q"]);
    assert!(err.contains("0 lines"), "{err}");
}

#[test]
fn an_empty_trace_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let header = dir.path().join("header.csv");
    std::fs::write(&header, "time_ns,op,offset,len,class,volume,fua\n").unwrap();
    for p in [&empty, &header] {
        let p = p.to_str().unwrap();
        for cmd in [
            vec!["sim", "--trace", p, "--format", "simple", "-q"],
            vec!["mrc", "--trace", p, "--format", "simple", "-q"],
            vec![
                "sweep", "--trace", p, "--format", "simple", "--sizes", "1MiB", "-q",
            ],
        ] {
            let err = fails(&cmd);
            assert!(err.contains("no requests"), "{cmd:?}: {err}");
            assert!(err.contains(p), "{cmd:?} does not name the file: {err}");
        }
    }
}

#[test]
fn converting_to_a_format_without_writes_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), 300);
    for to in ["oracle-general", "arc"] {
        let out = dir.path().join(format!("out.{to}"));
        let o = ok(&[
            "trace",
            "convert",
            t.to_str().unwrap(),
            out.to_str().unwrap(),
            "--to",
            to,
        ]);
        let (_, err) = text(&o);
        assert!(
            err.contains("100 writes") && err.contains("as reads"),
            "--to {to}: {err}"
        );
    }
}

#[test]
fn speedup_needs_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("zero.csv");
    let mut f = std::fs::File::create(&p).unwrap();
    writeln!(f, "time_ns,op,offset,len,class,volume,fua").unwrap();
    for i in 0..200 {
        writeln!(f, "0,read,{},4096,0,0,0", i * 4096).unwrap();
    }
    drop(f);
    let err = fails(&[
        "sim",
        "--trace",
        p.to_str().unwrap(),
        "--speedup",
        "2",
        "-q",
    ]);
    assert!(err.contains("timestamp"), "{err}");
    assert!(err.contains("--queue-depth"), "{err}");
}

#[test]
fn skipped_lines_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), 500);
    let mut f = std::fs::OpenOptions::new().append(true).open(&t).unwrap();
    writeln!(f, "garbage").unwrap();
    writeln!(f, "1,read,notanumber,4096,0,0,0").unwrap();
    drop(f);
    let t = t.to_str().unwrap();
    for cmd in [
        vec!["sim", "--trace", t, "--skip-bad", "-q"],
        vec!["mrc", "--trace", t, "--skip-bad", "-q"],
        vec!["sim", "--trace", t, "--skip-bad", "--hdd", "7200", "-q"],
    ] {
        let (out, err) = text(&ok(&cmd));
        assert!(
            err.contains("2 malformed") || out.contains("2 malformed"),
            "{cmd:?}:\n{out}{err}"
        );
    }
    let v = json(&["sim", "--trace", t, "--skip-bad", "-q", "--json"]);
    assert_eq!(v["skipped_records"], 2, "{v}");
}

#[test]
fn a_run_without_cache_is_labelled_so() {
    let v = json(&["sim", "-w", WORKLOAD, "--no-cache", "--json", "-q"]);
    // No policy (null) and no layout: nothing in the run was cached.
    assert!(v["policy"].is_null(), "{}", v["policy"]);
    assert_eq!(v["layout"], "none", "{}", v["layout"]);
    assert_eq!(v["cache_size"], "none", "{}", v["cache_size"]);
    assert_eq!(v["capacity_lines"], 0);
}

#[test]
fn demo_header_reads_right() {
    let (out, _) = text(&ok(&["demo", "-q"]));
    let head: Vec<&str> = out.lines().take(2).collect();
    assert!(!head[0].contains("— demo:"), "{}", head[0]);
    // "cache X (10% of N lines)" must name the footprint, not the cache's own line count.
    let v = json(&["demo", "-q", "--json"]);
    let first = &v.as_array().unwrap()[1];
    let fp = first["footprint_lines"].as_u64().unwrap();
    let cap = first["capacity_lines"].as_u64().unwrap();
    assert!(head[1].contains(&format!("({fp} lines)")), "{}", head[1]);
    assert!(
        head[1].contains(&format!("({cap} lines: 10% of the footprint)")),
        "{}",
        head[1]
    );
}

#[test]
fn warm_up_is_reported_only_when_resolvable() {
    // The default warm-up simulation: its run must be long enough to resolve warm-up, or
    // say why not; never a bare "1.0x" or "0.0 s".
    let w = [
        "warmup",
        "--simulate",
        "--cache-size",
        "64MiB",
        "--disk-iops",
        "430",
        "-q",
    ];
    let o = ok(&w);
    let (out, err) = text(&o);
    assert!(
        !out.contains(" 0.0 s") && !out.contains(" 1.0x"),
        "{out}{err}"
    );
    let v = json(&[&w[..], &["--json"]].concat());
    let sim = &v["simulated"];
    match sim["warmup_s"].as_f64() {
        Some(w) => assert!(w > 0.0, "{v}"),
        None => assert!(sim["warmup_note"].is_string(), "{v}"),
    }
}

#[test]
fn device_errors_name_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let backing = d.join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let b = backing.to_str().unwrap();
    // check on the backing device: one clear sentence, not the same words twice.
    let err = text(&run(&["check", b])).1;
    assert_eq!(
        err.matches("not a tiercache cache device").count(),
        1,
        "{err}"
    );
    // format creates a missing cache file when told its size, as serve does.
    let newc = d.join("new.img");
    ok(&[
        "format",
        "--cache",
        newc.to_str().unwrap(),
        "--backing",
        b,
        "--cache-size",
        "4M",
    ]);
    assert!(newc.exists());
    let err = fails(&[
        "format",
        "--cache",
        d.join("none.img").to_str().unwrap(),
        "--backing",
        b,
    ]);
    assert!(
        err.contains("cache device") && err.contains("--cache-size"),
        "{err}"
    );
    // A missing backing device is named as the backing device.
    let err = fails(&[
        "format",
        "--cache",
        newc.to_str().unwrap(),
        "--backing",
        d.join("nob.img").to_str().unwrap(),
        "--force",
    ]);
    assert!(err.contains("backing device"), "{err}");
    // serve on a missing socket directory fails before it says it is serving.
    let sock = d.join("nodir/x.sock");
    let o = run(&[
        "serve",
        "--cache",
        newc.to_str().unwrap(),
        "--backing",
        b,
        "--socket",
        sock.to_str().unwrap(),
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("serving NBD"), "{err}");
    assert!(
        err.contains("does not exist") && err.contains("nodir"),
        "{err}"
    );
}

#[test]
fn log_layout_help_states_its_line_size() {
    let (help, _) = text(&ok(&["sim", "--help"]));
    let line = help
        .split("--line-size")
        .nth(1)
        .expect("--line-size in help");
    let para = &line[..line.find("\n\n").unwrap_or(line.len())];
    assert!(para.contains("8KiB with --layout log"), "{para}");
}

#[test]
fn q_means_quiet_everywhere_and_replay_keeps_its_old_q() {
    for cmd in ["sim", "mrc", "sweep", "demo", "replay"] {
        let (help, _) = text(&ok(&[cmd, "--help"]));
        assert!(help.contains("-q, --quiet"), "{cmd}: {help}");
        // And the help says what it quiets.
        let line = help.lines().find(|l| l.contains("-q, --quiet")).unwrap();
        assert!(
            line.split("--quiet")
                .nth(1)
                .is_some_and(|d| !d.trim().is_empty()),
            "{cmd}: `-q, --quiet` has no description: {line:?}"
        );
    }
    // The old `replay -q 16` still parses as the queue depth (a deprecation note), failing only
    // on the missing server.
    let o = run(&[
        "replay",
        "--nbd",
        "nbd+unix:///?socket=/nonexistent/x.sock",
        "-w",
        "4k; 100% read; 100% random",
        "-q",
        "8",
    ]);
    let (_, err) = text(&o);
    assert!(
        err.contains("deprecated") && err.contains("--queue-depth"),
        "{err}"
    );
    assert!(err.contains("connecting"), "{err}");
}

#[test]
fn serve_help_lists_only_what_serve_takes() {
    let (help, _) = text(&ok(&["serve", "--help"]));
    for flag in ["--erase-block", "--dup-share", "--content-lengths"] {
        // Simulator-only flags: serve refuses them, so its help must not offer them.
        assert!(!help.contains(flag), "serve --help lists {flag}");
    }
    for flag in ["--trim", "--free-reserve", "--reinsert-hits"] {
        // The log layout's reclamation settings work live (per run).
        assert!(help.contains(flag), "serve --help does not list {flag}");
    }
    let (format_help, _) = text(&ok(&["format", "--help"]));
    for flag in ["--trim", "--free-reserve", "--reinsert-hits", "--dup-share"] {
        // Per run or simulator-only: format refuses them.
        assert!(!format_help.contains(flag), "format --help lists {flag}");
    }
    for (flag, default) in [
        ("--workers", "32"),
        ("--line-size", "4k"),
        ("--mode", "stored on the cache device"),
    ] {
        let part = help.split(&format!("{flag} <")).nth(1).unwrap_or("");
        let part = &part[..part.find("\n      --").unwrap_or(part.len())];
        assert!(part.contains(default), "{flag}: {part}");
    }
}

#[test]
fn sim_takes_the_trace_as_an_argument_and_prints_byte_miss_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), 2000);
    let a = json(&["sim", t.to_str().unwrap(), "-q", "--json"]);
    let b = json(&["sim", "--trace", t.to_str().unwrap(), "-q", "--json"]);
    assert_eq!(a["hit_ratio"], b["hit_ratio"]);
    let brm = a["byte_miss_ratio"].as_f64().expect("byte_miss_ratio");
    let rmr = a["request_miss_ratio"]
        .as_f64()
        .expect("request_miss_ratio");
    assert!(brm > 0.0 && brm <= 1.0 && rmr > 0.0 && rmr <= 1.0, "{a}");
    let (out, _) = text(&ok(&["sim", t.to_str().unwrap(), "-q"]));
    assert!(out.contains("byte miss ratio"), "{out}");
    assert!(out.contains("request miss ratio"), "{out}");
}

#[test]
fn the_csv_format_error_points_at_lcs_csv() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("lcs.csv");
    // libCacheSim's csv: time,obj_id,obj_size
    std::fs::write(&p, "1,100,4096\n2,200,4096\n3,100,4096\n").unwrap();
    let err = fails(&["sim", p.to_str().unwrap(), "--format", "csv", "-q"]);
    assert!(err.contains("lcs-csv"), "{err}");
}

/// A child process killed when dropped (a failed assertion never leaves it behind).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(p: &Path) {
    let t = std::time::Instant::now();
    while !p.exists() {
        assert!(t.elapsed().as_secs() < 20, "{} never appeared", p.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn replay_json_keys_ops_by_op() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let sock = dir.path().join("nbd.sock");
    let _srv = Child(
        Command::new(BIN)
            .args(["serve-file", "--file", file.to_str().unwrap(), "--socket"])
            .arg(&sock)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&sock);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let v = json(&[
        "replay",
        "--nbd",
        &uri,
        "-w",
        "zipf:theta=0.9,wss=8MiB,requests=2000,read=70",
        "--iodepth",
        "4",
        "--json",
        "-q",
    ]);
    let ops = v["ops"]
        .as_object()
        .unwrap_or_else(|| panic!("ops: {}", v["ops"]));
    let (r, w) = (&ops["read"], &ops["write"]);
    assert_eq!(
        r["requests"].as_u64().unwrap() + w["requests"].as_u64().unwrap(),
        2000,
        "{v}"
    );
}

#[test]
fn ctl_stats_reads_like_casadm_and_writes_csv() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let (sock, ctl) = (d.join("nbd.sock"), d.join("ctl.sock"));
    let _srv = Child(
        Command::new(BIN)
            .args([
                "serve",
                "--format-if-needed",
                "--cache-size",
                "4M",
                "--mode",
                "wb",
            ])
            .arg("--cache")
            .arg(d.join("cache.img"))
            .arg("--backing")
            .arg(d.join("backing.img"))
            .arg("--socket")
            .arg(&sock)
            .arg("--control")
            .arg(&ctl)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&sock);
    wait_for(&ctl);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    ok(&[
        "replay",
        "--nbd",
        &uri,
        "-w",
        "zipf:theta=0.9,wss=8MiB,requests=3000,read=70",
        "-q",
    ]);
    let c = ctl.to_str().unwrap();
    let (out, _) = text(&ok(&["ctl", "--control", c, "stats"]));
    for w in [
        "[usage]",
        "clean",
        "dirty",
        "[requests]",
        "partial misses",
        "full misses",
        "read line hits",
        "write line misses",
        "pass-through lines",
        "reads from core (backing)",
        "[errors]",
    ] {
        assert!(out.contains(w), "ctl stats lacks {w:?}:\n{out}");
    }
    let (csv, _) = text(&ok(&["ctl", "--control", c, "stats", "--csv"]));
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("section,name,value,unit"));
    let reads: Vec<&str> = lines
        .filter(|l| l.starts_with("requests,\"read requests\""))
        .collect();
    assert_eq!(reads.len(), 1, "{csv}");
    let v: u64 = reads[0].split(',').nth(2).unwrap().parse().unwrap();
    assert!(v > 1000, "{csv}");
    // Per volume (one per server until issue 15): labelled with the volume's name (its
    // backing device) in text, CSV and JSON, with the same figures as the totals.
    let name = std::fs::canonicalize(d.join("backing.img"))
        .unwrap()
        .display()
        .to_string();
    let j: serde_json::Value =
        serde_json::from_slice(&ok(&["ctl", "--control", c, "stats", "--json"]).stdout).unwrap();
    assert_eq!(j["volume_name"], name.as_str(), "{j}");
    assert!(out.contains("[per volume]"), "{out}");
    assert!(out.contains(&format!("volume {name} ")), "{out}");
    let vol_reads = format!("volume,\"volume {name}: read requests\",{v},requests");
    assert!(
        csv.lines().any(|l| l == vol_reads),
        "no {vol_reads:?} in\n{csv}"
    );
    // `ctl ... stats | head -2` ends quietly.
    let o = into_closed_pipe(&["ctl", "--control", c, "stats"]);
    assert!(!text(&o).1.contains("panicked"), "{}", text(&o).1);
}

/// The README's five-minute walkthrough runs as written (in a temporary directory, with this
/// build's binary for `T`).
#[test]
fn readme_walkthrough_runs() {
    if !common::have("fio") || !common::have("nbdinfo") {
        return;
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let sec = readme
        .split("## Five minutes with a live volume")
        .nth(1)
        .expect("README has the walkthrough");
    let block = sec
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert!(block.starts_with("T=target/release/tiercache\n"), "{block}");
    let script = format!(
        "set -e\nT={BIN}\n{}",
        block.trim_start_matches("T=target/release/tiercache\n")
    );
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("[requests]") && out.contains("result        consistent"),
        "{out}"
    );
    assert!(!dir.path().join("tc-demo").exists());
}

/// `serve --cache-size` on a cache that is already formatted: the size it was formatted with
/// is what is served, so a different size must not be silently ignored (both layouts; the
/// same size, as a restart repeating its first command line gives, is fine).
#[test]
fn serve_refuses_a_cache_size_the_cache_was_not_formatted_with() {
    let dir = common::tmp();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    for (layout, size, other) in [("direct", "8M", "16M"), ("log", "16M", "32M")] {
        let cache = d.join("cache.img");
        let _ = std::fs::remove_file(&cache);
        let extra: &[&str] = if layout == "log" {
            &["--layout", "log"]
        } else {
            &[]
        };
        // First start formats at `size`; a restart repeating it is served as before.
        for _ in 0..2 {
            common::Srv::sized(d, size, extra).stop("-TERM");
        }
        let (c, b) = (
            cache.to_str().unwrap().to_string(),
            d.join("backing.img").to_str().unwrap().to_string(),
        );
        for flags in [
            vec!["--cache-size", other],
            vec!["--cache-size", other, "--format-if-needed"],
        ] {
            let mut args = vec!["--cache", &c, "--backing", &b];
            args.extend(flags.iter().copied());
            args.extend(extra);
            let err = common::serve_refused(d, &args);
            assert!(
                err.contains("--cache-size") && err.contains(other) && err.contains("formatted"),
                "{layout}: serve --cache-size {other} on a cache formatted at {size}: {err}"
            );
            assert!(!err.contains("serving NBD"), "{layout}: {err}");
        }
        // The cache was left as it was: the first size still serves.
        common::Srv::sized(d, size, extra).stop("-TERM");
    }
}

/// `sweep --cache-size 10%,20%` said only "bad percentage": the list of sizes a sweep takes is
/// `--sizes`, and the error now says so (before: "'10%,20%' is not a size: bad percentage").
#[test]
fn sweep_cache_size_list_points_at_sizes() {
    let e = fails(&[
        "sweep",
        "--workload",
        "zipf",
        "--cache-size",
        "10%,20%",
        "-q",
    ]);
    assert!(e.contains("--sizes 10%,20%"), "{e}");
}
