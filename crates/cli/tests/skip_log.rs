//! A skipped test must be visible in CI: every skip helper appends `TEST: REASON` to the skip
//! log (`$TIERCACHE_SKIP_LOG`), and `scripts/skip_summary.sh` (run by `.ci/run` at its end)
//! says "N tests skipped:" with the reasons, nothing when none, and fails with
//! `TIERCACHE_REQUIRE_NO_SKIP=1`.

mod common;

use std::path::Path;
use std::process::Command;

/// Run only by `skips_land_in_the_skip_log`, in a child process with its own skip log: the
/// shared helper `common::have` on a tool that does not exist, as a skipping test calls it.
#[test]
#[ignore = "a probe run by skips_land_in_the_skip_log with its own TIERCACHE_SKIP_LOG"]
fn probe_skips() {
    // Only under the test below: `cargo test -- --ignored` (the soaks) must not log a skip.
    if std::env::var_os("TIERCACHE_SKIP_PROBE").is_none() {
        return;
    }
    assert!(!common::have("tiercache-no-such-tool"));
}

fn summary(log: &Path, require: bool) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/skip_summary.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(log);
    if require {
        cmd.env("TIERCACHE_REQUIRE_NO_SKIP", "1");
    } else {
        cmd.env_remove("TIERCACHE_REQUIRE_NO_SKIP");
    }
    let o = cmd.output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[test]
fn skips_land_in_the_skip_log() {
    let dir = common::tmp();
    let log = dir.path().join("skips.log");
    // Nothing skipped: the summary prints nothing and passes, even when skips are refused.
    std::fs::write(&log, "").unwrap();
    assert_eq!(summary(&log, true), (true, String::new()));
    // The probe, twice (two test processes appending to one log).
    for _ in 0..2 {
        let o = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "probe_skips", "--test-threads", "2"])
            .env("TIERCACHE_SKIP_LOG", &log)
            .env("TIERCACHE_SKIP_PROBE", "1")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "probe failed: {out}");
        assert!(out.contains("1 passed"), "the probe did not run: {out}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let want = "skip_log::probe_skips: `tiercache-no-such-tool` is not installed";
    assert_eq!(
        text.lines().filter(|l| l.starts_with(want)).count(),
        2,
        "skip log: {text:?}"
    );
    let (ok, out) = summary(&log, false);
    assert!(ok, "{out}");
    assert!(out.contains("1 test skipped:"), "{out}");
    assert!(out.contains(want) && out.contains("(x2)"), "{out}");
    // TIERCACHE_REQUIRE_NO_SKIP=1 turns a skip into a failure.
    let (ok, out) = summary(&log, true);
    assert!(!ok && out.contains("1 test skipped:"), "{out}");
}
