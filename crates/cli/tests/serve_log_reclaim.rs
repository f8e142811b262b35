//! The log layout's reclamation settings live (theme 2: what `sim --layout log` takes works
//! live): `serve --trim --free-reserve` discards reclaimed segments on the cache device and
//! keeps the reserve free (holes in a cache file), `--reinsert-hits` puts hot clean extents
//! back; `ctl get`/`ctl set` change each on the running volume, refusing the combination the
//! simulator refuses; the settings are per run; every byte reads back, also after kill -9.
//! (Live = sim counter for counter with these flags: `serve_e2e.rs`; crash points:
//! `crates/server/tests/crash_points.rs` `log_crash_points_trim`, `..._reinsertion`.)

mod common;

use common::{have, pattern, sparse, NbdkitProc, Srv};
use std::os::unix::fs::MetadataExt;
use tiercache_nbd::Client;

const LINE: u64 = 4096;
const VOL: u64 = 32 << 20;
/// The log cache of the first test (FIFO picker: a hot segment is reclaimed in turn).
const LOG: &[&str] = &[
    "--layout",
    "log",
    "--segment-size",
    "256k",
    "--picker",
    "fifo",
];

/// Line `l`'s bytes at version `v` (incompressible, distinct per line and version).
fn line_bytes(l: u64, v: u64) -> Vec<u8> {
    pattern(l << 20 | v, LINE as usize)
}

fn get(srv: &Srv, k: &str) -> String {
    srv.ctl(&["get", k])
}

fn read_all(uri: &str) -> Vec<u8> {
    let mut c = Client::connect(uri).unwrap();
    let mut buf = vec![0u8; VOL as usize];
    for (i, chunk) in buf.chunks_mut(1 << 20).enumerate() {
        c.read(i as u64 * (1 << 20), chunk).unwrap();
    }
    buf
}

#[test]
fn trim_free_reserve_and_reinsertion_work_live_and_keep_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sparse(&d.join("backing.img"), VOL);
    let mut model = vec![0u8; VOL as usize];
    let flags = [
        LOG,
        &["--mode", "write-back", "--trim", "--free-reserve", "0.2"],
    ]
    .concat();
    let srv = Srv::start(d, &flags);
    assert!(get(&srv, "trim").contains("on"), "{}", get(&srv, "trim"));
    assert!(get(&srv, "free-reserve").contains("0.2"));
    assert!(get(&srv, "reinsert-hits").contains('0'));
    // 1. Write-back churn: 3 passes over 16 MiB (twice the cache) reclaim every segment,
    //    ahead of need, writing dirty data back; each reclaimed segment is discarded.
    let mut c = Client::connect(&srv.uri()).unwrap();
    let mut version = 0;
    for pass in 0..3u64 {
        for l in 0..(16 << 20) / LINE {
            let l = (l * 7 + pass) % ((16 << 20) / LINE);
            version += 1;
            let b = line_bytes(l, version);
            c.write(l * LINE, &b).unwrap();
            model[(l * LINE) as usize..((l + 1) * LINE) as usize].copy_from_slice(&b);
        }
        c.flush().unwrap();
    }
    let s = srv.stats();
    let (eng, live) = (&s["log"]["engine"], &s["log"]["live"]);
    let trimmed = eng["ssd_bytes_trimmed"].as_u64().unwrap();
    assert!(
        live["discards"].as_u64().unwrap() > 10 && live["discard_bytes"].as_u64() == Some(trimmed),
        "every segment reclaimed ahead is discarded: {live}"
    );
    assert!(eng["dirty_write_backs"].as_u64().unwrap() > 0, "{eng}");
    // The free reserve is holes in the cache file: its allocated bytes stay below its size
    // by at least the reserve's segments.
    let segments = s["log"]["segments"].as_u64().unwrap();
    let reserve = ((0.2 * segments as f64).ceil() as u64).min(segments - 3);
    let meta = std::fs::metadata(d.join("cache.img")).unwrap();
    assert!(
        meta.blocks() * 512 + reserve * (256 << 10) <= meta.len(),
        "cache file of {} bytes has {} allocated: the {reserve} free segments are not discarded",
        meta.len(),
        meta.blocks() * 512
    );
    assert_eq!(
        read_all(&srv.uri()),
        model,
        "bytes read back after trimming"
    );

    // 2. Live changes: reinsertion refused while a trimmed reserve is kept (the simulator
    //    refuses it too), accepted without the reserve; then hot clean lines come back.
    let o = srv.ctl_output(&["set", "reinsert-hits", "2"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("free reserve"),
        "reinsertion with a trimmed free reserve: {e}"
    );
    srv.ctl(&["set", "free-reserve", "0"]);
    srv.ctl(&["set", "reinsert-hits", "2"]);
    assert!(get(&srv, "reinsert-hits").contains('2'));
    assert!(get(&srv, "free-reserve").contains('0'));
    let o = srv.ctl_output(&["set", "trim", "maybe"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("on or off"));
    // Reads: a hot set of 32 lines read again and again between batches of cold read
    //    misses (the clean stream, whose reclamations reinsert).
    let before = srv.stats()["log"]["engine"]["reinserted"].as_u64().unwrap();
    let mut buf = vec![0u8; LINE as usize];
    for round in 0..40u64 {
        for h in 0..32 {
            let l = (20 << 20) / LINE + h;
            c.read(l * LINE, &mut buf).unwrap();
            assert_eq!(buf, model[(l * LINE) as usize..((l + 1) * LINE) as usize]);
        }
        for k in 0..64 {
            let l = (16 << 20) / LINE + (round * 64 + k) % ((16 << 20) / LINE);
            c.read(l * LINE, &mut buf).unwrap();
        }
    }
    let s = srv.stats();
    let reinserted = s["log"]["engine"]["reinserted"].as_u64().unwrap() - before;
    assert!(
        reinserted > 0,
        "no hot extent reinserted: {}",
        s["log"]["engine"]
    );
    assert_eq!(s["log"]["live"]["extent_crc_errors"].as_u64(), Some(0));
    c.flush().unwrap();
    drop(c);
    assert_eq!(
        read_all(&srv.uri()),
        model,
        "bytes read back after reinsertion"
    );

    // 3. A crash, then a restart without the flags: per run, they are off again; every
    //    byte flushed reads back.
    srv.kill9();
    let srv = Srv::start(d, LOG);
    assert!(get(&srv, "trim").contains("off"));
    assert!(get(&srv, "reinsert-hits").contains('0'));
    assert_eq!(read_all(&srv.uri()), model, "bytes read back after kill -9");
    srv.stop("-TERM");
}

/// A log-only setting on a direct-layout volume is refused by name, with why.
#[test]
fn direct_volume_refuses_the_log_reclamation_settings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sparse(&d.join("backing.img"), 8 << 20);
    let srv = Srv::start(d, &[]);
    for (k, v) in [
        ("trim", "on"),
        ("free-reserve", "0.1"),
        ("reinsert-hits", "2"),
    ] {
        for args in [&["set", k, v][..], &["get", k]] {
            let o = srv.ctl_output(args);
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && e.contains(k) && e.contains("log layout only"),
                "ctl {args:?} on a direct volume: {e}"
            );
        }
    }
    srv.stop("-TERM");
}

/// A cache device that is an NBD export gets NBD_CMD_TRIM for each reclaimed segment (nbdkit's
/// log filter records them); an export whose trims fail (nbdkit's error filter, EIO on every
/// trim) changes nothing but the count of discard errors: no request fails, every byte reads
/// back (a discard is advisory: nothing durable refers to the bytes it names).
#[test]
fn an_nbd_cache_export_gets_trims_and_a_failing_trim_changes_nothing() {
    if !have("nbdkit") {
        return;
    }
    for fail in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        sparse(&d.join("backing.img"), VOL);
        let log = d.join("nbdkit.log");
        let logfile = format!("logfile={}", log.display());
        let mut args = vec!["--filter=log"];
        if fail {
            args.push("--filter=error");
        }
        args.extend(["memory", "16M", logfile.as_str()]);
        if fail {
            args.extend(["error=EIO", "error-trim-rate=1"]);
        }
        let mem = NbdkitProc::start(&d.join("mem.sock"), &args);
        let (cache, backing) = (mem.uri(), d.join("backing.img").display().to_string());
        let srv = Srv::custom(
            d,
            &[
                "--cache",
                &cache,
                "--backing",
                &backing,
                "--format-if-needed",
                "--layout",
                "log",
                "--segment-size",
                "256k",
                "--mode",
                "write-back",
                "--trim",
                "--free-reserve",
                "0.2",
            ],
        );
        let mut model = vec![0u8; VOL as usize];
        let mut c = Client::connect(&srv.uri()).unwrap();
        for pass in 0..2u64 {
            for l in 0..VOL / LINE {
                let b = line_bytes(l, pass + 1);
                c.write(l * LINE, &b).unwrap();
                model[(l * LINE) as usize..((l + 1) * LINE) as usize].copy_from_slice(&b);
            }
            c.flush().unwrap();
        }
        drop(c);
        let live = &srv.stats()["log"]["live"];
        let n = |k: &str| live[k].as_u64().unwrap();
        if fail {
            assert!(
                n("discard_errors") > 0 && n("discards") == 0,
                "trims failing: {live}"
            );
        } else {
            assert!(n("discards") > 10 && n("discard_errors") == 0, "{live}");
            let text = std::fs::read_to_string(&log).unwrap();
            let trims = text.lines().filter(|l| l.contains("Trim")).count() as u64;
            assert!(
                trims >= n("discards"),
                "{trims} NBD trims logged for {} discards",
                n("discards")
            );
        }
        assert_eq!(read_all(&srv.uri()), model, "fail {fail}: bytes read back");
        srv.stop("-TERM");
    }
}
