//! Skipped tests, made visible. A test that cannot run here (a tool, FUSE, root or the shared
//! traces missing) returns early and libtest reports it as `ok`; its `SKIP:` line is captured
//! with the output of passing tests, so nobody sees it. [`skip!`] prints that line as before
//! and also appends `TEST: REASON` to the skip log, which `.ci/run` prints at the end
//! (`scripts/skip_summary.sh`: "N tests skipped:" and the reasons; nothing when none; failure
//! with `TIERCACHE_REQUIRE_NO_SKIP=1`).
//!
//! The log is `$TIERCACHE_SKIP_LOG`, else `target/test-skips.log` of this workspace. Python's
//! tests write to the same file (python/tests/conftest.py).

use std::io::Write as _;
use std::path::PathBuf;

/// The skip log: `$TIERCACHE_SKIP_LOG`, else `target/test-skips.log` beside the workspace's
/// build output.
pub fn log_path() -> PathBuf {
    match std::env::var_os("TIERCACHE_SKIP_LOG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/test-skips.log"
        )),
    }
}

/// The skipping test's name: libtest names each test's thread after the test (`main` when
/// run with one thread, then `module` stands in).
fn test_name(module: &str) -> String {
    let crate_name = module.split("::").next().unwrap_or(module);
    match std::thread::current().name() {
        Some(t) if t != "main" => format!("{crate_name}::{t}"),
        _ => module.to_string(),
    }
}

/// Prints `SKIP: reason` and appends `test: reason` to the skip log (one line, one write, so
/// tests of parallel processes do not interleave). A log that cannot be written is said on
/// stderr, never a failure: a skip is not the test's error.
pub fn record(module: &str, reason: &str) {
    let reason = reason.trim().replace('\n', " ");
    println!("SKIP: {reason}");
    let line = format!("{}: {reason}\n", test_name(module));
    let path = log_path();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "SKIP not logged: cannot append to {} ({e}; set TIERCACHE_SKIP_LOG)",
            path.display()
        );
    }
}

/// `skip!("fmt", args...)`: prints `SKIP: ...` and records it in the skip log ([`record`]),
/// naming the calling test.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {
        $crate::record(module_path!(), &format!($($arg)*))
    };
}
