//! `--validity line` (all-or-nothing lines, the model of dm-cache and most papers) works live
//! with the simulator's flag: fixed at format (`format --validity`, `serve --format-if-needed
//! --validity`), stored in the superblock, kept by a restart without the flag, refused when a
//! restart names the other one, refused by the log layout. A live replay at queue depth 1
//! gives `sim --validity line`'s counters exactly (which differ from sector validity's), and
//! every byte read back equals the same replay on a plain file: a partial write to an
//! uncached line merges the rest of the line from the backing device, whose bytes here are
//! random (a fill of zeros, or of the wrong range, would show).

mod common;

use common::{have, replay_qd1, run, serve_refused, sim_8m, NbdkitProc, Srv, BIN};
use std::path::Path;
use std::process::Command;

/// Zipf over 32 MiB, writes of 1-16 KiB at 256-byte alignment: partial writes of uncached
/// lines (a fill with line validity) and dirty evictions from an 8 MiB write-back cache.
const ZIPF: &str =
    "zipf:theta=0.8,wss=32MiB,requests=3000,read=60,size=4k@50+16k@20+1k@30,align=256";
const MIB32: usize = 32 << 20;

/// 32 MiB of seeded pseudo-random bytes.
fn random_image(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(MIB32);
    while v.len() < MIB32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

fn workload() -> Vec<String> {
    [
        "--workload",
        ZIPF,
        "--seed",
        "7",
        "--content",
        "--line-size",
        "4k",
    ]
    .map(String::from)
    .to_vec()
}

/// `tiercache sim`'s counters for the workload on an 8 MiB write-back LRU cache.
fn sim(flags: &[&str]) -> serde_json::Value {
    let args = ["--workload", ZIPF, "--seed", "7"].iter().chain(flags);
    sim_8m("write-back", args)["counters"].clone()
}

/// The whole export read through NBD.
fn read_back(uri: &str, to: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(to);
    run(Command::new("nbdcopy").arg(uri).arg(to));
    std::fs::read(to).unwrap()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn line_validity_live_equals_the_simulator_and_keeps_every_byte() {
    if !have("nbdcopy") || !have("nbdkit") {
        return;
    }
    let image = random_image(0x5eed);
    // The reference: the same replay on a plain file holding the same bytes.
    let refdir = common::tmp();
    let reference = refdir.path().join("ref.img");
    std::fs::write(&reference, &image).unwrap();
    {
        let k = NbdkitProc::start(
            &refdir.path().join("k.sock"),
            &["file", &reference.display().to_string()],
        );
        replay_qd1(&k.uri(), workload());
    }
    let want_bytes = std::fs::read(&reference).unwrap();
    assert_ne!(want_bytes, image, "the workload wrote nothing");

    for line in ["4k", "16k"] {
        let want = sim(&["--line-size", line, "--validity", "line"]);
        let sector = sim(&["--line-size", line]);
        assert_ne!(
            want, sector,
            "{line}: line validity changed no counter of the simulator"
        );
        let dir = common::tmp();
        let d = dir.path();
        std::fs::write(d.join("backing.img"), &image).unwrap();
        let args = [
            "--policy",
            "lru",
            "--mode",
            "write-back",
            "--cleaner",
            "inline",
            "--line-size",
            line,
            "--validity",
            "line",
        ];
        let srv = Srv::start(d, &args);
        let rep = replay_qd1(&srv.uri(), workload());
        let live = srv.stats();
        assert_eq!(live["settings"]["validity"], "line", "{line}: {live}");
        let got = &live["totals"];
        assert_eq!(rep["requests"].as_u64(), want["requests"].as_u64());
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&got[k], v, "{line}: counter {k}: sim {v}, live {}", got[k]);
        }
        assert!(
            live["dirty_lines"].as_u64().unwrap() > 0,
            "{line}: the cache must hold dirty lines for the read-back to test them: {live}"
        );
        let back = read_back(&srv.uri(), &d.join("out.img"));
        assert_eq!(
            first_difference(&back, &want_bytes),
            None,
            "{line}: bytes read back differ from the plain file's"
        );
        // A crash, then a restart without the flag: the stored validity applies, every
        // dirty line is restored (whole) and read back the same.
        srv.kill9();
        let srv = Srv::start(d, &[]);
        assert!(
            srv.ctl(&["get", "validity"]).contains("line"),
            "{line}: ctl get validity after the restart"
        );
        let back = read_back(&srv.uri(), &d.join("out.img"));
        assert_eq!(
            first_difference(&back, &want_bytes),
            None,
            "{line}: bytes read back after kill -9 and a restart differ"
        );
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&srv.ctl)
            .args(["set", "validity", "sector"])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && e.contains("fixed at format"),
            "{e}"
        );
        srv.stop("-TERM");
        // The other validity on the command line is refused, naming both and the way out.
        let cache = d.join("cache.img").display().to_string();
        let backing = d.join("backing.img").display().to_string();
        let log = serve_refused(
            d,
            &[
                "--cache",
                &cache,
                "--backing",
                &backing,
                "--validity",
                "sector",
            ],
        );
        assert!(
            log.contains("formatted with line validity, not sector")
                && log.contains("format --force --validity sector"),
            "{log}"
        );
    }
}

/// `format --validity line` stores it (a serve without the flag runs it); a bad value is
/// refused by name; the log layout refuses the flag (it keeps no sector masks).
#[test]
fn format_stores_it_and_the_log_layout_refuses_it() {
    let dir = common::tmp();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let cache = d.join("cache.img").display().to_string();
    let backing = d.join("backing.img").display().to_string();
    let format = |extra: &[&str]| {
        Command::new(BIN)
            .args(["format", "--cache", &cache, "--backing", &backing])
            .args(["--cache-size", "8M", "--force"])
            .args(extra)
            .output()
            .unwrap()
    };
    let bad = format(&["--validity", "bytes"]);
    assert!(!bad.status.success());
    let e = String::from_utf8_lossy(&bad.stderr);
    assert!(
        e.contains("--validity") && e.contains("sector or line"),
        "{e}"
    );
    assert!(format(&["--validity", "line"]).status.success());
    let srv = Srv::custom(d, &["--cache", &cache, "--backing", &backing]);
    assert_eq!(srv.stats()["settings"]["validity"], "line");
    assert!(run(Command::new(BIN).args([
        "ctl",
        "--control",
        &srv.ctl.display().to_string(),
        "stats"
    ]))
    .contains("line validity"));
    srv.stop("-TERM");
    // A cache formatted before the flag (sector) says so.
    assert!(format(&[]).status.success());
    let srv = Srv::custom(d, &["--cache", &cache, "--backing", &backing]);
    assert_eq!(srv.stats()["settings"]["validity"], "sector");
    srv.stop("-TERM");

    // A pool of two cache devices: every member's superblock carries it.
    let members: Vec<String> = ["m0.img", "m1.img"]
        .iter()
        .map(|m| {
            let p = d.join(m);
            std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
            p.display().to_string()
        })
        .collect();
    let pool_args = [
        "--cache",
        &members[0],
        "--cache",
        &members[1],
        "--backing",
        &backing,
    ];
    assert!(Command::new(BIN)
        .arg("format")
        .args(pool_args)
        .args(["--validity", "line", "--force"])
        .status()
        .unwrap()
        .success());
    let srv = Srv::custom(d, &pool_args);
    assert_eq!(srv.stats()["settings"]["validity"], "line");
    srv.stop("-TERM");
    let log = serve_refused(d, &[&pool_args[..], &["--validity", "sector"]].concat());
    assert!(log.contains("formatted with line validity"), "{log}");

    let logdev = d.join("log.img");
    std::fs::File::create(&logdev)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = Command::new(BIN)
        .args(["format", "--layout", "log", "--cache"])
        .arg(&logdev)
        .args(["--backing", &backing, "--validity", "line", "--force"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--validity line"), "{e}");
}
