//! `tiercache serve --classes/--classifier/--class-rules` end to end (issue 7): an ext4 image
//! copied onto the export with nbdcopy is classified live (ctl stats per class, human and JSON,
//! Prometheus `class="..."` labels); a restart learns the file system from the volume at start;
//! the rules classifier and the config-file keys. Tools missing: `SKIP:` message.

mod common;

use common::{free_port, have, metrics, run, Srv, BIN};
use std::process::Command;

fn repo_file(p: &str) -> String {
    format!("{}/../../{p}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn ext4_classifier_live_with_stats_metrics_and_restart() {
    if !have("nbdcopy") || !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // An ext4 image with directories and files of several sizes.
    let src = d.join("src");
    for i in 0..6 {
        let sub = src.join(format!("dir{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        for (j, size) in [900usize, 9_000, 90_000, 900_000].iter().enumerate() {
            let data: Vec<u8> = (0..*size).map(|k| (k * 31 + i * 7 + j) as u8 | 1).collect();
            std::fs::write(sub.join(format!("f{j}")), data).unwrap();
        }
    }
    let img = d.join("fs.img");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("64M"));
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let classes = repo_file("experiments/classes/filesystem.toml");
    let srv = Srv::sized(
        d,
        "16M",
        &[
            "--policy",
            "dss",
            "--classifier",
            "ext4",
            "--classes",
            &classes,
            "--metrics",
            &addr,
        ],
    );
    run(Command::new("nbdcopy").arg(&img).arg(srv.uri()));
    // Read it back (classified reads) and compare.
    let back = d.join("back.img");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&img).unwrap());

    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(v["policy"], "dss");
    assert_eq!(v["classifier"]["name"], "ext4");
    assert_eq!(v["classifier"]["ext4_found"], true, "{}", v["classifier"]);
    assert!(v["classifier"]["inodes"].as_u64().unwrap() >= 30);
    let class = |name: &str| {
        v["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no class {name} in {}", v["classes"]))
    };
    for name in ["metadata", "directory", "journal", "file<4KiB", "file<1MiB"] {
        let c = class(name);
        assert!(c["counters"]["requests"].as_u64().unwrap() > 0, "{c}");
    }
    assert!(class("metadata")["cached_lines"].as_u64().unwrap() > 0);
    let text = srv.ctl(&["stats"]);
    assert!(text.contains("classifier      ext4: ext4 found"), "{text}");
    assert!(
        text.lines().any(|l| l.contains(" metadata ")),
        "no metadata row: {text}"
    );
    let body = metrics(&addr);
    for m in [
        "tiercache_line_hits_total{class=\"metadata\"}",
        "tiercache_line_misses_total{class=\"directory\"}",
        "tiercache_bypasses_total{class=\"file<4KiB\"}",
        "tiercache_class_cached_lines{class=\"metadata\"}",
        "tiercache_relabelled_lines_total",
    ] {
        assert!(body.contains(m), "{m} missing from {body}");
    }
    srv.stop("-TERM");

    // A restart learns the file system from the volume before serving.
    let srv = Srv::sized(d, "16M", &["--policy", "dss", "--classifier", "ext4"]);
    let log = srv.stop("-TERM");
    assert!(log.contains("ext4 found"), "{log}");
}

#[test]
fn rules_classifier_and_config_keys() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    // --classifier rules without rules is refused with a clear message.
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(d.join("cache.img"))
        .arg("--backing")
        .arg(d.join("backing.img"))
        .arg("--socket")
        .arg(d.join("nbd.sock"))
        .args([
            "--format-if-needed",
            "--cache-size",
            "4M",
            "--classifier",
            "rules",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no [[rule]]"), "{err}");
    // Refused before anything is created: no cache file formatted at 4M for the next start.
    assert!(
        !d.join("cache.img").exists(),
        "a refused start left cache.img"
    );
    // Rules by name from a separate file, given in the config file.
    let rules = d.join("rules.toml");
    std::fs::write(
        &rules,
        "version = 1\n[[rule]]\nclass = \"metadata\"\noffset = [0, 1048576]\n\n[[rule]]\nclass = \"file>1GiB\"\nop = \"write\"\n",
    )
    .unwrap();
    let cfg = d.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "classifier = \"rules\"\nclass_rules = \"{}\"\nclasses = \"{}\"\n",
            rules.display(),
            repo_file("experiments/classes/filesystem.toml")
        ),
    )
    .unwrap();
    let srv = Srv::sized(d, "16M", &["--config", cfg.to_str().unwrap()]);
    let data = d.join("data.bin");
    std::fs::write(&data, vec![5u8; 4 << 20]).unwrap();
    run(Command::new("nbdcopy").arg(&data).arg(srv.uri()));
    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    let names: Vec<&str> = v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"metadata"), "{names:?}");
    assert!(names.contains(&"file>1GiB"), "{names:?}");
    assert_eq!(v["classifier"]["name"], "rules");
    srv.stop("-TERM");
}

/// Issue 19: files written through a kernel mount (nbdfuse + loop + ext4) are classified by
/// size once the kernel writes their inodes (ordered mode writes the data first, so the data
/// was cached as "unclassified"): after sync and umount every cached file block is in the
/// class `tiercache ext4-classify` gives it on the backing image, and lines were relabelled.
#[test]
fn kernel_written_files_are_relabelled_live() {
    if !have("nbdfuse") || !have("losetup") || !have("mkfs.ext4") {
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        tiercache_testskip::skip!("/dev/fuse is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let classes = repo_file("experiments/classes/filesystem.toml");
    // A cache larger than everything written: no eviction, so every written block is cached.
    let srv = Srv::sized(
        d,
        "160M",
        &[
            "--policy",
            "dss",
            "--classifier",
            "ext4",
            "--classes",
            &classes,
            "--mode",
            "write-through",
            "--metrics",
            &addr,
        ],
    );
    let mkfs = ["-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0"];
    let Some(mut m) = common::Mounted::attach_with(&srv, d, Some(&mkfs)) else {
        return;
    };
    let file = |p: &std::path::Path, n: usize, seed: usize| {
        let data: Vec<u8> = (0..n).map(|k| (k * 131 + seed * 7) as u8 | 1).collect();
        std::fs::write(p, data).unwrap();
    };
    file(&m.mnt.join("big3m.bin"), 3 << 20, 1);
    for i in 0..8 {
        file(&m.mnt.join(format!("small{i}")), 500 + i * 1500, i);
    }
    for a in 0..3 {
        for b in 0..3 {
            let sub = m.mnt.join(format!("tree{a}/sub{b}"));
            std::fs::create_dir_all(&sub).unwrap();
            for (j, n) in [2_000usize, 30_000, 200_000, 700_000].iter().enumerate() {
                file(&sub.join(format!("f{j}")), *n, a * 10 + b + j);
            }
        }
    }
    run(&mut Command::new("sync"));
    m.umount();
    drop(m);

    let v: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    let truth: serde_json::Value = serde_json::from_str(&run(Command::new(BIN)
        .args(["ext4-classify", "--json"])
        .arg(d.join("backing.img"))))
    .unwrap();
    let cached = |name: &str| {
        v["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map_or(0, |c| c["cached_lines"].as_u64().unwrap())
    };
    let mut report = String::new();
    for name in ["unclassified", "metadata", "journal", "directory"] {
        report += &format!("{name}: cached {}\n", cached(name));
    }
    for name in [
        "file<4KiB",
        "file<16KiB",
        "file<64KiB",
        "file<256KiB",
        "file<1MiB",
        "file<4MiB",
    ] {
        let want = truth["classes"][name].as_u64().unwrap();
        report += &format!("{name}: cached {} ext4-classify {want}\n", cached(name));
    }
    let relabelled = {
        let body = metrics(&addr);
        body.lines()
            .find_map(|l| l.strip_prefix("tiercache_relabelled_lines_total "))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap_or_else(|| panic!("no tiercache_relabelled_lines_total in {body}"))
    };
    println!(
        "{report}relabelled {relabelled}\nclassifier {}",
        v["classifier"]
    );
    for name in [
        "file<4KiB",
        "file<16KiB",
        "file<64KiB",
        "file<256KiB",
        "file<1MiB",
        "file<4MiB",
    ] {
        let want = truth["classes"][name].as_u64().unwrap();
        assert!(want > 0, "{name}: ext4-classify found no block\n{report}");
        assert_eq!(cached(name), want, "{name}\n{report}");
    }
    assert!(relabelled > 0, "no line relabelled\n{report}");
    srv.stop("-TERM");
}
