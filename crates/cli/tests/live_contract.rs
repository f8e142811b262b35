//! Issue 19 item 1: one contract for both live layouts (`tiercache_server::live`). Every
//! test body here runs once per layout (a loop over ["direct", "log"]) through the binary:
//! the same `ctl stats --json` top-level schema, the same Prometheus metric names (latency
//! histograms included), `ctl mode` write-back <-> write-through, `ctl flush` writing dirty
//! data back to the backing file, `ctl stats --reset`, `ctl detach` (kept across a restart),
//! and cache-device read errors failing the cache to pass-through after
//! `--max-cache-errors` with no acknowledged byte lost.
//!
//! Before the change the log layout refused `ctl mode`, `ctl detach` and `ctl stats
//! --reset`, its `ctl flush` left dirty data in the cache only, its stats had another
//! top-level schema and its metrics had no `tiercache_request_latency_seconds`.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use tiercache_nbd::Client;

const LAYOUTS: [&str; 2] = ["direct", "log"];
const VOL: usize = 8 << 20;

fn layout_args(layout: &str) -> Vec<&'static str> {
    match layout {
        "log" => vec!["--layout", "log", "--segment-size", "256k"],
        _ => vec![],
    }
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `# TYPE` names of a Prometheus text, with the log layout's own (`tiercache_log_*`) apart.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .filter(|n| !n.starts_with("tiercache_log_"))
        .collect()
}

fn latency_count(text: &str, op: &str) -> u64 {
    let key = format!("tiercache_request_latency_seconds_count{{op=\"{op}\"");
    text.lines()
        .find(|l| l.starts_with(&key))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

fn backing_at(d: &Path, off: usize, len: usize) -> Vec<u8> {
    std::fs::read(d.join("backing.img")).unwrap()[off..off + len].to_vec()
}

#[test]
fn both_layouts_keep_one_contract_for_stats_metrics_mode_flush_reset_detach() {
    let mut schemas = Vec::new();
    let mut names = Vec::new();
    for layout in LAYOUTS {
        let (keys, metrics) = contract_body(layout);
        schemas.push((layout, keys));
        names.push((layout, metrics));
    }
    assert_eq!(
        schemas[0].1, schemas[1].1,
        "ctl stats --json top-level keys differ between {} and {}",
        schemas[0].0, schemas[1].0
    );
    assert_eq!(
        names[0].1, names[1].1,
        "Prometheus metric names differ between {} and {}",
        names[0].0, names[1].0
    );
}

/// One layout's run; returns its `ctl stats --json` top-level keys and metric names.
fn contract_body(layout: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = tmp();
    let d = dir.path();
    std::fs::write(d.join("backing.img"), vec![0x11u8; VOL]).unwrap();
    let port = free_port().to_string();
    let metrics = format!("127.0.0.1:{port}");
    let mut args = layout_args(layout);
    args.extend(["--mode", "write-back", "--metrics", &metrics]);
    let srv = Srv::sized(d, "4M", &args);
    let port: u16 = port.parse().unwrap();
    let mut cl = Client::connect(&srv.uri()).unwrap();

    // Write-back: acknowledged, flushed (durable in the cache), not on the backing file.
    let a = pattern(1, 64 << 10);
    cl.write(0, &a).unwrap();
    cl.flush().unwrap();
    let mut got = vec![0u8; a.len()];
    cl.read(0, &mut got).unwrap();
    assert_eq!(got, a, "{layout}: read back");
    let s = srv.stats();
    assert_eq!(s["layout"], layout, "{s}");
    assert_eq!(s["mode"], "write-back", "{layout}: {s}");
    assert!(s["dirty_lines"].as_u64().unwrap() > 0, "{layout}: {s}");
    assert!(
        s["totals"]["write_bytes"].as_u64().unwrap() >= 64 << 10,
        "{layout}: {s}"
    );
    assert_eq!(
        s["log"].is_object(),
        layout == "log",
        "{layout}: layout figures in the `log` sub-object: {s}"
    );
    let keys: BTreeSet<String> = s.as_object().unwrap().keys().cloned().collect();
    let text = srv.ctl(&["stats"]);
    assert!(
        text.contains(&format!("layout          {layout}")),
        "{text}"
    );

    // Prometheus: the same names, latency histograms with the requests just made.
    let prom = scrape(port);
    assert!(
        prom.contains("# TYPE tiercache_request_latency_seconds histogram"),
        "{layout}: {prom}"
    );
    assert!(latency_count(&prom, "write") >= 1, "{layout}: {prom}");
    assert!(latency_count(&prom, "read") >= 1, "{layout}: {prom}");
    let names = metric_names(&prom);

    // ctl mode write-through: dirty data written back first.
    let out = srv.ctl(&["mode", "write-through"]);
    assert!(out.contains("mode is now write-through"), "{layout}: {out}");
    assert_eq!(
        backing_at(d, 0, a.len()),
        a,
        "{layout}: write-back before write-through"
    );
    assert_eq!(srv.stats()["dirty_lines"], 0, "{layout}");
    assert_eq!(srv.ctl(&["get", "mode"]).trim(), "write-through");

    // Back to write-back; ctl flush writes the new dirty data back.
    srv.ctl(&["mode", "write-back"]);
    let b = pattern(2, 32 << 10);
    cl.write(1 << 20, &b).unwrap();
    assert_ne!(
        backing_at(d, 1 << 20, b.len()),
        b,
        "{layout}: write-back, not through"
    );
    assert!(srv.stats()["dirty_lines"].as_u64().unwrap() > 0, "{layout}");
    srv.ctl(&["flush"]);
    assert_eq!(
        backing_at(d, 1 << 20, b.len()),
        b,
        "{layout}: ctl flush wrote back"
    );
    assert_eq!(srv.stats()["dirty_lines"], 0, "{layout}");
    cl.read(1 << 20, &mut got[..b.len()]).unwrap();
    assert_eq!(&got[..b.len()], &b[..], "{layout}: read after flush");

    // Settings: the keys that apply change live; the others say why not.
    let set = Command::new(BIN)
        .args(["ctl", "--control"])
        .arg(&srv.ctl)
        .args(["set", "seq-cutoff", "1M"])
        .output()
        .unwrap();
    if layout == "log" {
        assert!(!set.status.success());
        let e = String::from_utf8_lossy(&set.stderr);
        assert!(e.contains("does not apply to the log layout"), "{e}");
    } else {
        assert!(
            set.status.success(),
            "{}",
            String::from_utf8_lossy(&set.stderr)
        );
    }

    // ctl stats --reset: counters and latency histograms restart from zero.
    srv.ctl(&["stats", "--reset"]);
    let s = srv.stats();
    assert_eq!(s["totals"]["write_bytes"], 0, "{layout}: {s}");
    assert_eq!(s["totals"]["read_line_accesses"], 0, "{layout}: {s}");
    assert_eq!(latency_count(&scrape(port), "write"), 0, "{layout}");

    // ctl detach: pass-through, writes go straight to the backing file, old data reads.
    let out = srv.ctl(&["detach"]);
    assert!(out.contains("detached"), "{out}");
    assert_eq!(srv.stats()["mode"], "pass-through", "{layout}");
    let c = pattern(3, 16 << 10);
    cl.write(2 << 20, &c).unwrap();
    assert_eq!(
        backing_at(d, 2 << 20, c.len()),
        c,
        "{layout}: pass-through write"
    );
    cl.read(0, &mut got).unwrap();
    assert_eq!(got, a, "{layout}: read while detached");
    drop(cl);
    srv.stop("-TERM");

    // The mode set live is kept by a restart (no --mode given).
    let srv = Srv::sized(d, "4M", &layout_args(layout));
    assert_eq!(srv.stats()["mode"], "pass-through", "{layout}: detach kept");
    srv.ctl(&["mode", "write-back"]);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    for (off, want) in [(0, &a), (1 << 20, &b), (2 << 20, &c)] {
        let mut got = vec![0u8; want.len()];
        cl.read(off, &mut got).unwrap();
        assert_eq!(&got, want, "{layout}: offset {off} after the restart");
    }
    drop(cl);
    srv.stop("-TERM");
    let srv = Srv::sized(d, "4M", &layout_args(layout));
    assert_eq!(srv.stats()["mode"], "write-back", "{layout}: mode kept");
    srv.stop("-TERM");
    (keys, names)
}

/// Cache-device read errors (nbdkit's error filter under the NBD cache device) count
/// towards `--max-cache-errors`; then the cache is failed and everything passes through.
/// Write-through, so every cached line is also on the backing file: not one acknowledged
/// byte may read differently, before, during or after the failure.
#[test]
fn both_layouts_pass_through_after_max_cache_errors_without_losing_data() {
    if !have("nbdkit") {
        return;
    }
    for layout in LAYOUTS {
        let dir = tmp();
        let d = dir.path();
        let backing = d.join("backing.img");
        std::fs::write(&backing, vec![0x11u8; VOL]).unwrap();
        let trigger = d.join("TRIGGER");
        let nbd =
            NbdkitProc::faulty_memory(&d.join("cache.sock"), &trigger, &["error-pread-rate=1"]);
        let (uri, b) = (nbd.uri(), backing.display().to_string());
        let sd = d.join("state").display().to_string();
        run(Command::new(BIN)
            .args(["format", "--cache", &uri, "--backing", &b])
            .args(["--mode", "write-through"])
            .args(layout_args(layout)));
        let args = [
            "--cache",
            &uri,
            "--backing",
            &b,
            "--max-cache-errors",
            "2",
            "--state-dir",
            &sd,
        ];
        let srv = Srv::custom(d, &args);
        let mut cl = Client::connect(&srv.uri()).unwrap();
        let data = pattern(4, 2 << 20);
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            cl.write((i * (64 << 10)) as u64, chunk).unwrap();
        }
        cl.flush().unwrap();
        let s = srv.stats();
        assert!(s["cached_lines"].as_u64().unwrap() > 0, "{layout}: {s}");
        // Every cache read fails from now on.
        std::fs::write(&trigger, b"").unwrap();
        let mut got = vec![0u8; data.len()];
        for (i, chunk) in got.chunks_mut(64 << 10).enumerate() {
            cl.read((i * (64 << 10)) as u64, chunk).unwrap();
        }
        assert!(got == data, "{layout}: acknowledged data reads back");
        let s = srv.stats();
        assert!(s["cache_errors"].as_u64().unwrap() >= 2, "{layout}: {s}");
        assert_eq!(s["cache_failed"], true, "{layout}: {s}");
        assert_eq!(s["mode"], "pass-through", "{layout}: {s}");
        assert_eq!(s["lost_dirty_bytes"], 0, "{layout}: {s}");
        // Pass-through: a new write goes to the backing file and reads back.
        let w = pattern(5, 8192);
        cl.write(3 << 20, &w).unwrap();
        cl.flush().unwrap();
        let mut g = vec![0u8; w.len()];
        cl.read(3 << 20, &mut g).unwrap();
        assert_eq!(g, w, "{layout}");
        drop(cl);
        std::fs::remove_file(&trigger).unwrap();
        let log = srv.stop("-INT");
        assert!(log.contains("FAILED"), "{layout}: {log}");
        let f = std::fs::read(&backing).unwrap();
        assert!(
            f[..data.len()] == data[..],
            "{layout}: backing holds every write"
        );
        assert_eq!(&f[3 << 20..(3 << 20) + w.len()], &w[..], "{layout}");
    }
}
