//! Issue 14 item 6 through the binary: the cache device (nbdkit's error filter) fails every
//! write, its superblock erase included; the failure goes to the state file in --state-dir,
//! the client's pass-through write V is what a restart must never hide: `serve` refuses the
//! failed cache naming `tiercache format --force`, which removes the state file. Run for both
//! layouts: before the fix the log layout stopped at the first cache error (every later
//! request failed until a restart) and `--max-cache-errors` was refused for it.

mod common;

use common::*;
use std::process::Command;
use tiercache_nbd::Client;

const VOL: usize = 4 << 20;

const LOG: &[&str] = &["--layout", "log", "--segment-size", "256k"];

#[test]
fn failed_nbd_cache_is_refused_after_a_restart_until_formatted() {
    scenario(&[], true);
}

#[test]
fn log_failed_nbd_cache_is_refused_after_a_restart_until_formatted() {
    scenario(LOG, true);
}

/// Issue 14 item 6 for an NBD cache without `--state-dir` (before: no state file at all, a
/// warning, and a failure recorded only if the superblock erase worked): the state file goes
/// to the default state directory ($TIERCACHE_STATE_DIR here; the only test of this binary
/// that reads it, the others pass --state-dir).
#[test]
fn nbd_cache_without_state_dir_records_its_failure_in_the_default_dir() {
    scenario(LOG, false);
}

fn scenario(layout: &[&str], state_dir_flag: bool) {
    if !have("nbdkit") {
        return;
    }
    let d = common::tmp();
    let dir = d.path();
    let backing = dir.join("backing.img");
    std::fs::write(&backing, vec![0x11u8; VOL]).unwrap();
    let trigger = dir.join("TRIGGER");
    let nbd =
        NbdkitProc::faulty_memory(&dir.join("cache.sock"), &trigger, &["error-pwrite-rate=1"]);
    let (uri, b) = (nbd.uri(), backing.display().to_string());
    let state_dir = dir.join("state");
    let sd = state_dir.display().to_string();
    if !state_dir_flag {
        std::env::set_var("TIERCACHE_STATE_DIR", &state_dir);
    }
    let sd_args: &[&str] = if state_dir_flag {
        &["--state-dir", &sd]
    } else {
        &[]
    };
    run(Command::new(BIN)
        .args(["format", "--cache", &uri, "--backing", &b])
        .args(["--mode", "write-back"])
        .args(layout));
    let mut args = vec!["--cache", &uri, "--backing", &b, "--max-cache-errors", "2"];
    args.extend(sd_args);
    let srv = Srv::custom(dir, &args);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    let dd = vec![0xd0u8; 8192];
    cl.write(0, &dd).unwrap();
    cl.flush().unwrap();
    // Every cache write fails from now on (the superblock erase too); reads still work.
    std::fs::write(&trigger, b"").unwrap();
    let w = vec![0x22u8; 4096];
    for i in 0..4u64 {
        cl.write(1 << 20 | i << 13, &w).unwrap();
    }
    // The log layout writes the cache device when it commits (or seals a segment).
    cl.flush().unwrap();
    let st: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(st["cache_failed"], true, "{st}");
    assert_eq!(st["mode"], "pass-through", "the mode in force: {st}");
    let text = srv.ctl(&["stats"]);
    assert!(text.contains("CACHE DEVICE FAILED"), "{text}");
    // The writes acknowledged before the failure are on the backing device.
    for i in 0..4u64 {
        let mut got = vec![0u8; 4096];
        cl.read(1 << 20 | i << 13, &mut got).unwrap();
        assert_eq!(got, w, "write {i} after the failure");
    }
    let v = vec![0x5au8; 8192];
    cl.write(0, &v).unwrap();
    cl.flush().unwrap();
    drop(cl);
    let log = srv.stop("-INT");
    assert!(
        log.contains("FAILED") && log.contains("the failure is recorded durably"),
        "{log}"
    );
    assert_eq!(&std::fs::read(&backing).unwrap()[..8192], &v[..]);
    std::fs::remove_file(&trigger).unwrap();
    let states: Vec<_> = std::fs::read_dir(&state_dir).unwrap().collect();
    assert_eq!(states.len(), 1, "one state file in --state-dir");
    // The restart is refused, not served with the stale dirty D.
    let refused = serve_refused(dir, &args);
    assert!(
        refused.contains("failed") && refused.contains("tiercache format --force"),
        "{refused}"
    );
    let out = run(Command::new(BIN)
        .args(["format", "--force", "--cache", &uri, "--backing", &b])
        .args(["--mode", "write-back"])
        .args(sd_args)
        .args(layout));
    assert!(out.contains("removed cache state file"), "{out}");
    let srv = Srv::custom(dir, &args);
    let mut cl = Client::connect(&srv.uri()).unwrap();
    let mut got = vec![0u8; 8192];
    cl.read(0, &mut got).unwrap();
    assert_eq!(got, v);
    drop(cl);
    srv.stop("-TERM");
}
