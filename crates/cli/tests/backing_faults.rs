//! Issue 14 item 1 through real tools: the backing device is an NBD export from nbdkit's
//! error filter (`error-rate=1 error-file=TRIGGER`: every request fails while TRIGGER
//! exists), cached by `tiercache serve --mode write-back`. X is written at 0 and flushed,
//! TRIGGER appears, 8 MiB are written elsewhere (the 4 MiB cache must evict), TRIGGER goes:
//! X reads back — at once, after a SIGTERM restart and after a kill -9 restart — and so does
//! every other write that was acknowledged. With `error=ENOSPC` the refused writes say
//! ENOSPC. Before the fix the log said "dirty data lost: volume bytes 0..4096" and X read
//! EIO, then the old backing bytes after a restart. Run for both layouts: the log layout
//! writes back while reclaiming a segment (before the fix its first failed write-back
//! stopped the volume: every later request failed until a restart).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use tiercache_nbd::{Client, ClientError};

const VOL: u64 = 32 << 20;

fn nbdkit(dir: &Path, errno: Option<&str>) -> (NbdkitProc, String, PathBuf) {
    let sock = dir.join("hdd.sock");
    let trigger = dir.join("TRIGGER");
    let img = dir.join("hdd.img").display().to_string();
    let file = format!("error-file={}", trigger.display());
    let e = errno.map(|e| format!("error={e}"));
    let mut args = vec!["--filter=error", "file", &img, "error-rate=1", &file];
    args.extend(e.as_deref());
    let k = NbdkitProc::start(&sock, &args);
    let uri = k.uri();
    (k, uri, trigger)
}

fn block(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(13) ^ (seed as u8).wrapping_mul(71) ^ 0x5a)
        .collect()
}

fn read_at(srv: &Srv, off: u64, len: usize) -> Vec<u8> {
    let mut c = Client::connect(&srv.uri()).unwrap();
    let mut b = vec![0u8; len];
    c.read(off, &mut b).unwrap();
    b
}

fn scenario(layout: &[&str], errno: Option<&str>) {
    if !have("nbdkit") {
        return;
    }
    let tmp = common::tmp();
    let dir = tmp.path();
    std::fs::write(dir.join("hdd.img"), vec![0xeeu8; VOL as usize]).unwrap();
    let (_kit, uri, trigger) = nbdkit(dir, errno);
    let mut wb = vec!["--mode", "write-back"];
    wb.extend(layout);
    let srv = Srv::launch(dir, &uri, "4M", &wb);
    let mut c = Client::connect(&srv.uri()).unwrap();
    let x = block(1, 4096);
    c.write(0, &x).unwrap();
    c.flush().unwrap();
    assert!(srv.stats()["dirty_lines"].as_u64().unwrap() >= 1);
    std::fs::write(&trigger, b"").unwrap();
    // 8 MiB elsewhere in 64 KiB writes: the cache fills, write-backs fail.
    let mut acked = vec![(0u64, x.clone())];
    let (mut refused, mut enospc) = (0, 0);
    for i in 0..128u64 {
        let off = (4 << 20) + i * 65536;
        let d = block(i + 2, 65536);
        match c.write(off, &d) {
            Ok(()) => acked.push((off, d)),
            Err(ClientError::Nbd { errno, .. }) => {
                refused += 1;
                enospc += (errno == 28) as u32;
            }
            Err(e) => panic!("write {i}: {e}"),
        }
    }
    // X is served from the cache while the backing device fails.
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).expect("X while the backing device fails");
    assert_eq!(b, x);
    let st = srv.stats();
    assert!(refused > 0, "a 4 MiB cache took 8 MiB of writes: {st}");
    if errno.is_some() {
        assert_eq!(enospc, refused, "refused writes say ENOSPC");
    }
    assert_eq!(st["degraded"], true, "{st}");
    assert!(st["backing_write_errors"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["lost_dirty_bytes"], 0, "{st}");
    let text = srv.ctl(&["stats"]);
    assert!(text.contains("DEGRADED"), "{text}");
    std::fs::remove_file(&trigger).unwrap();
    assert_eq!(read_at(&srv, 0, 4096), x, "X after the heal");
    c.flush().unwrap();
    drop(c);
    let log = srv.stop("-TERM");
    assert!(!log.contains("dirty data lost"), "{log}");
    // SIGTERM restart, then a crash and another restart: every acknowledged write reads back.
    for round in ["after SIGTERM", "after kill -9"] {
        let srv = Srv::launch(dir, &uri, "4M", &wb);
        for (off, d) in &acked {
            assert_eq!(&read_at(&srv, *off, d.len()), d, "{round}: bytes at {off}");
        }
        let mut c = Client::connect(&srv.uri()).unwrap();
        c.flush().unwrap();
        drop(c);
        if round == "after SIGTERM" {
            srv.kill9();
        } else {
            srv.stop("-TERM");
        }
    }
    println!(
        "{layout:?} {errno:?}: {} writes acknowledged, {refused} refused while the backing device failed; all read back after restarts",
        acked.len()
    );
}

/// The log layout in 256 KiB segments (the 4 MiB cache holds 16 of them at most).
const LOG: &[&str] = &["--layout", "log", "--segment-size", "256k"];

#[test]
fn backing_eio_never_drops_dirty_data() {
    scenario(&[], None);
}

#[test]
fn backing_enospc_never_drops_dirty_data() {
    scenario(&[], Some("ENOSPC"));
}

#[test]
fn log_backing_eio_never_drops_dirty_data() {
    scenario(LOG, None);
}

#[test]
fn log_backing_enospc_never_drops_dirty_data() {
    scenario(LOG, Some("ENOSPC"));
}
