//! `tiercache ctl classes load FILE` (issue 19 item 3) through a real server: a DSS volume
//! classified by rules takes a new class table live (a class made `never` stops being
//! admitted, its misses count as class bypasses; lines already cached keep their class), the
//! change shows in `ctl stats` (text and JSON), `ctl get classes` and Prometheus; bad files
//! are refused with file and line and change nothing; a restart goes back to the serve
//! flags' table. The log layout takes class tables too (not partitions). And `ctl stats`
//! shows the cleaner's settings.
//! qemu-io missing: `SKIP:` message.

mod common;

use common::{free_port, have, metrics, run, Srv, BIN};
use std::path::Path;
use std::process::Command;

/// Before: `hot` (requests at 0..1 MiB) and `bulk` (1..8 MiB), both always allocated.
const BEFORE: &str = r#"version = 1
name = "before"
[[class]]
id = 1
name = "hot"
priority = 0
allocation = "always"
[[class]]
id = 2
name = "bulk"
priority = 5
allocation = "always"
[[rule]]
class = "hot"
offset = [0, 1048576]
[[rule]]
class = "bulk"
offset = [1048576, 8388608]
"#;

/// After: `bulk` is never allocated (and ranks below `hot`), same rules.
const AFTER: &str = r#"version = 1
name = "after"
[[class]]
id = 1
name = "hot"
priority = 0
allocation = "always"
[[class]]
id = 2
name = "bulk"
priority = 9
allocation = "never"
[[rule]]
class = "hot"
offset = [0, 1048576]
[[rule]]
class = "bulk"
offset = [1048576, 8388608]
"#;

fn write(srv: &Srv, what: &[&str]) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for w in what {
        c.args(["-c", w]);
    }
    run(c.arg(srv.uri()));
}

/// The class named `name` in `ctl stats --json`.
fn class<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no class {name}: {}", v["classes"]))
}

/// `ctl classes load FILE` that must fail: its stderr.
fn load_refused(srv: &Srv, file: &Path) -> String {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(["classes", "load"])
        .arg(file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{file:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn classes_load_changes_allocation_live_and_bad_files_change_nothing() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let (before, after) = (d.join("before.toml"), d.join("after.toml"));
    std::fs::write(&before, BEFORE).unwrap();
    std::fs::write(&after, AFTER).unwrap();
    let maddr = format!("127.0.0.1:{}", free_port());
    let flags = [
        "--policy",
        "dss",
        "--classifier",
        "rules",
        "--classes",
        before.to_str().unwrap(),
        "--metrics",
        &maddr,
    ];
    let srv = Srv::sized(d, "16M", &flags);
    // 128 lines of each class, cached.
    write(&srv, &["write -P 1 0 512k", "write -P 2 2m 512k"]);
    let v = srv.stats();
    let ls = v["line_size"].as_u64().unwrap();
    let n = (512 << 10) / ls;
    assert_eq!(v["class_table"]["name"], "before", "{}", v["class_table"]);
    assert_eq!(v["class_table"]["source"], "serve flags");
    assert_eq!(v["class_table"]["loads"], 0);
    assert_eq!(class(&v, "bulk")["cached_lines"], n);
    assert_eq!(class(&v, "bulk")["counters"]["bypasses"]["class"], 0);

    // The new table: bulk is never allocated.
    let out = srv.ctl(&["classes", "load", after.to_str().unwrap()]);
    assert!(
        out.contains("\"before\"") && out.contains("\"after\"") && out.contains("live load 1"),
        "{out}"
    );
    write(&srv, &["write -P 3 4m 512k", "write -P 4 512k 512k"]);
    let v = srv.stats();
    let bulk = class(&v, "bulk");
    assert_eq!(
        bulk["counters"]["bypasses"]["class"], n,
        "bulk's new writes bypass: {bulk}"
    );
    assert_eq!(
        bulk["cached_lines"], n,
        "lines cached before the load keep their class and stay: {bulk}"
    );
    assert_eq!(
        class(&v, "hot")["cached_lines"],
        2 * n,
        "hot is still admitted"
    );
    assert_eq!(v["class_table"]["name"], "after");
    assert_eq!(v["class_table"]["loads"], 1);
    assert!(
        v["class_table"]["source"]
            .as_str()
            .unwrap()
            .ends_with("after.toml"),
        "{}",
        v["class_table"]
    );
    assert_eq!(v["settings"]["changes"], 1, "counted as a live change");
    let text = srv.ctl(&["stats"]);
    assert!(
        text.contains("class table     \"after\" (2 classes, 2 rules) from")
            && text.contains("loaded live 1 time(s)"),
        "{text}"
    );
    let got = srv.ctl(&["get", "classes"]);
    assert!(
        got.contains("\"after\"") && got.contains("after.toml (loaded live, 1 time(s))"),
        "{got}"
    );
    let m = metrics(&maddr);
    assert!(m.contains("tiercache_class_table_loads_total 1"), "{m}");
    assert!(
        m.contains(&format!(
            "tiercache_class_cached_lines{{class=\"bulk\"}} {n}"
        )),
        "{m}"
    );

    // Bad files: refused with file and line, and nothing changes.
    let bad = [
        ("syntax.toml", "version = 1\n[[class]\nid = 1\n", "syntax.toml"),
        (
            "unknown.toml",
            "version = 1\n[[class]]\nid = 1\nname = \"hot\"\npriority = 0\nallocation = \"always\"\n\n[[rule]]\nclass = \"cold\"\noffset = [0, 4096]\n",
            "unknown.toml:8: rule class \"cold\" is not a class",
        ),
        (
            "range.toml",
            "version = 1\n\n[[class]]\nid = 40\nname = \"x\"\npriority = 0\nallocation = \"always\"\n",
            "range.toml:3: class id 40 is not in 0..=31",
        ),
        (
            "shares.toml",
            "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\nmin_share = 0.7\n[[class]]\nid = 2\nname = \"b\"\npriority = 1\nallocation = \"always\"\nmin_share = 0.6\n[[rule]]\nclass = 1\n",
            "shares.toml:2: the classes' min_share add up to 1.300 > 1",
        ),
        (
            // The running rules classifier needs rules: refused by the server.
            "norules.toml",
            "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\n",
            "has no [[rule]]",
        ),
    ];
    for (name, text, want) in bad {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        let err = load_refused(&srv, &p);
        assert!(err.contains(want), "{name}: {err}");
    }
    let v = srv.stats();
    assert_eq!(v["class_table"]["name"], "after", "{}", v["class_table"]);
    assert_eq!(v["class_table"]["loads"], 1);
    assert_eq!(v["settings"]["changes"], 1);
    write(&srv, &["write -P 5 6m 64k"]);
    let v = srv.stats();
    assert_eq!(
        class(&v, "bulk")["counters"]["bypasses"]["class"],
        n + (64 << 10) / ls,
        "the loaded table is still in force"
    );

    // A restart goes back to the serve flags' table: bulk is admitted again.
    srv.stop("-TERM");
    let srv = Srv::sized(d, "16M", &flags[..6]);
    let v = srv.stats();
    assert_eq!(v["class_table"]["name"], "before");
    assert_eq!(v["class_table"]["loads"], 0);
    write(&srv, &["write -P 6 7m 64k"]);
    let v = srv.stats();
    assert_eq!(class(&v, "bulk")["counters"]["bypasses"]["class"], 0);
    srv.stop("-TERM");
}

#[test]
fn log_layout_refuses_partitions_and_stats_show_the_cleaner() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    // Direct layout: the cleaner's settings are in `ctl stats` (JSON and text).
    let srv = Srv::sized(d, "4M", &["--mode", "write-back"]);
    let s = srv.stats()["settings"].clone();
    assert_eq!(s["cleaning"], "lba", "{s}");
    assert_eq!(s["writeback_rate"], "off", "{s}");
    srv.ctl(&["set", "cleaning", "alru"]);
    srv.ctl(&["set", "cleaning-age", "5000"]);
    srv.ctl(&["set", "writeback-rate", "300"]);
    srv.ctl(&["set", "writeback-target", "0.25"]);
    let s = srv.stats()["settings"].clone();
    assert_eq!(
        (
            &s["cleaning"],
            &s["cleaning_age"],
            &s["writeback_rate"],
            &s["writeback_target"]
        ),
        (
            &serde_json::json!("alru"),
            &serde_json::json!(5000),
            &serde_json::json!("300"),
            &serde_json::json!(0.25)
        ),
        "{s}"
    );
    let text = srv.ctl(&["stats"]);
    assert!(
        text.contains(
            "cleaner         cleaning alru (age 5000 requests), writeback-rate 300, writeback-target 0.25"
        ),
        "{text}"
    );
    // The unlocked cleaning's counts (nothing written: all 0), as in the JSON.
    assert!(
        text.contains(
            "write-backs     0 passes outside the volume lock, 0 requests waited for one, 0 cut short"
        ),
        "{text}"
    );
    // The record unmaps (direct layout), the unmap-ahead passes skipped while backing syncs
    // fail among them, as in the JSON.
    assert!(
        text.contains("unmaps          0 on the miss path, 0 ahead of evictions (0 unmapped ahead now), 0 cache syncs; unmap-ahead skipped 0 times while backing syncs failed"),
        "{text}"
    );
    assert!(
        text.contains("0 merged groups taken out by a request"),
        "{text}"
    );
    let j = srv.stats();
    for k in [
        "unlocked_writebacks",
        "writeback_waits",
        "writeback_yields",
        "writeback_groups_dropped",
        "unmap_ahead_skipped",
    ] {
        assert_eq!(j[k].as_u64(), Some(0), "{k} in {j}");
    }
    // No class option at start: no table, and `get classes` says so.
    assert!(srv.stats()["class_table"].is_null());
    assert!(srv.ctl(&["get", "classes"]).starts_with("none"));
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(["set", "classes", "x.toml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("classes load FILE"),
        "{err}"
    );
    srv.stop("-TERM");

    // Log layout: its stats have no cleaner settings; a table with partitions is refused
    // with the reason (the log layout has none) and changes nothing.
    let _ = std::fs::remove_file(d.join("cache.img"));
    let srv = Srv::sized(d, "8M", &["--layout", "log", "--segment-size", "256k"]);
    let parts = d.join("parts.toml");
    std::fs::write(
        &parts,
        BEFORE.replace(
            "allocation = \"always\"\n[[class]]",
            "allocation = \"always\"\nmax_share = 0.5\n[[class]]",
        ),
    )
    .unwrap();
    let err = load_refused(&srv, &parts);
    assert!(err.contains("the log layout has no partitions"), "{err}");
    let v = srv.stats();
    assert_eq!(v["layout"], "log");
    assert!(v["settings"]["cleaning"].is_null(), "{}", v["settings"]);
    assert!(v["class_table"].is_null());
    // No record unmaps in the log layout: no such line.
    let text = srv.ctl(&["stats"]);
    assert!(!text.contains("unmaps "), "{text}");
    srv.stop("-TERM");
}

/// The log layout (issue 19): `serve --classes --classifier rules` classifies live, every
/// class is counted (`ctl stats` with the direct layout's per-class schema, Prometheus), and
/// `ctl classes load` makes a class `never` from the next request on: its missed lines go
/// to the backing device only (class bypasses), lines cached before stay, data reads back.
#[test]
fn log_layout_takes_a_class_table_at_start_and_live() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let (before, after) = (d.join("before.toml"), d.join("after.toml"));
    std::fs::write(&before, BEFORE).unwrap();
    std::fs::write(&after, AFTER).unwrap();
    let maddr = format!("127.0.0.1:{}", free_port());
    let srv = Srv::sized(
        d,
        "8M",
        &[
            "--layout",
            "log",
            "--segment-size",
            "256k",
            "--classifier",
            "rules",
            "--classes",
            before.to_str().unwrap(),
            "--metrics",
            &maddr,
        ],
    );
    write(&srv, &["write -P 1 0 512k", "write -P 2 2m 512k"]);
    let v = srv.stats();
    let n = (512 << 10) / v["line_size"].as_u64().unwrap();
    assert_eq!(v["layout"], "log");
    assert_eq!(v["class_table"]["name"], "before", "{}", v["class_table"]);
    assert_eq!(v["class_table"]["source"], "serve flags");
    assert_eq!(v["classifier"]["name"], "rules", "{}", v["classifier"]);
    for c in ["hot", "bulk"] {
        assert_eq!(class(&v, c)["cached_lines"], n, "{c}: {}", v["classes"]);
        assert_eq!(class(&v, c)["counters"]["write_line_accesses"], n);
        assert_eq!(class(&v, c)["counters"]["bypasses"]["class"], 0);
    }

    let out = srv.ctl(&["classes", "load", after.to_str().unwrap()]);
    assert!(
        out.contains("\"before\"") && out.contains("\"after\"") && out.contains("live load 1"),
        "{out}"
    );
    write(&srv, &["write -P 3 4m 512k", "write -P 4 512k 512k"]);
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 3 4m 512k",
            "-c",
            "read -P 2 2m 512k",
        ])
        .arg(srv.uri()));
    let v = srv.stats();
    let bulk = class(&v, "bulk");
    // The 4m write and the 4m read: every line missed and went around the cache.
    assert_eq!(bulk["counters"]["bypasses"]["class"], 2 * n, "{bulk}");
    assert_eq!(
        bulk["cached_lines"], n,
        "lines cached before the load stay: {bulk}"
    );
    assert_eq!(
        class(&v, "hot")["cached_lines"],
        2 * n,
        "hot is still cached"
    );
    assert_eq!(v["class_table"]["name"], "after");
    assert_eq!(v["class_table"]["loads"], 1);
    assert_eq!(v["settings"]["changes"], 1, "counted as a live change");
    assert_eq!(v["log"]["engine"]["bypassed_lines"], 2 * n);
    let text = srv.ctl(&["stats"]);
    assert!(
        text.contains("class table     \"after\" (2 classes, 2 rules) from"),
        "{text}"
    );
    let m = metrics(&maddr);
    assert!(m.contains("tiercache_class_table_loads_total 1"), "{m}");
    assert!(
        m.contains(&format!(
            "tiercache_class_cached_lines{{class=\"bulk\"}} {n}"
        )),
        "{m}"
    );
    srv.stop("-TERM");
}
