//! Failing backing FLUSHes through real NBD, both layouts. The backing device is
//! `scripts/faultdev.sh` (an nbdkit `sh` plugin over a file; nbdkit 1.32's error filter never
//! fails a flush) told `flush drop`: every FLUSH fails and discards the writes since the last
//! good one, as Linux does after a writeback error (the next fsync then succeeds without
//! them). `tiercache serve` in front of it, 4 MiB of cache, must:
//!
//! * never acknowledge a client FLUSH (or `ctl flush`) it could not make durable;
//! * never drop dirty data, never serve older bytes than the last acknowledged write (a
//!   range nothing holds any more may read EIO: it is reported lost, never stale);
//! * once the device heals, put every acknowledged byte on the backing file at the next
//!   FLUSH / `ctl flush`, and read it back, also after a restart (kill -9 included).
//!
//! Paths covered: the client FLUSH in write-through and pass-through, `ctl flush` and the
//! client FLUSH in write-back, cleaning and evictions under pressure while syncs fail.
//! And the state: syncs that keep failing make the volume DEGRADED in `ctl stats` and
//! Prometheus, retried with backoff (not at every request), healed by the first good sync.
//! SKIPs without nbdkit or its sh plugin.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};
use tiercache_nbd::Client;

const VOL: u64 = 16 << 20;
const BS: u64 = 4096;
const FILL: u8 = 0xee;
/// The log layout in 256 KiB segments (the 4 MiB cache holds 16 of them).
const LOG: &[&str] = &["--layout", "log", "--segment-size", "256k"];

fn block(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| {
            (k as u8).wrapping_mul(29) ^ (seed as u8).wrapping_mul(97) ^ (seed >> 8) as u8 ^ 0x3c
        })
        .collect()
}

/// What each 4 KiB block written so far may read: `vals` holds the values it may hold after a
/// crash (the one made durable by the last good FLUSH, then every write since); `exact`: the
/// last write was acknowledged, so without a crash it must read that one.
#[derive(Default)]
struct Model {
    blocks: BTreeMap<u64, (Vec<Vec<u8>>, bool)>,
}

impl Model {
    /// Writes `data` at `off` (a multiple of 4 KiB); whether it was acknowledged.
    fn write(&mut self, c: &mut Client, off: u64, data: &[u8]) -> bool {
        let ok = c.write(off, data).is_ok();
        for (i, b) in data.chunks(BS as usize).enumerate() {
            let e = self
                .blocks
                .entry(off + i as u64 * BS)
                .or_insert_with(|| (vec![vec![FILL; BS as usize]], true));
            e.0.push(b.to_vec());
            e.1 = ok;
        }
        ok
    }

    /// A FLUSH succeeded: an acknowledged block is durable; one whose last write failed holds
    /// its value before or (possibly) that write.
    fn flushed(&mut self) {
        for (vals, exact) in self.blocks.values_mut() {
            let keep = if *exact { 1 } else { 2 };
            let n = vals.len();
            vals.drain(..n.saturating_sub(keep));
        }
    }

    /// Every block reads its last acknowledged value (or, `eio_ok`, fails: reported lost).
    /// Returns how many failed.
    fn check_reads(&self, srv: &Srv, eio_ok: bool, what: &str) -> usize {
        let mut c = Client::connect(&srv.uri()).unwrap();
        let mut eio = 0;
        for (&off, (vals, exact)) in &self.blocks {
            let mut b = vec![0u8; BS as usize];
            match c.read(off, &mut b) {
                Ok(()) if *exact => assert!(
                    b == *vals.last().unwrap(),
                    "{what}: block {off} does not read its last acknowledged write (reads {:#x}.., {})",
                    b[0],
                    if b.iter().all(|&x| x == FILL) {
                        "the backing device's initial bytes".to_string()
                    } else if vals.contains(&b) {
                        "an older write".to_string()
                    } else {
                        "unknown bytes".to_string()
                    }
                ),
                Ok(()) => assert!(
                    vals.iter().rev().take(2).any(|v| *v == b),
                    "{what}: block {off} (last write failed) reads neither that write nor the one before"
                ),
                Err(e) => {
                    assert!(eio_ok, "{what}: block {off} read failed: {e}");
                    eio += 1;
                }
            }
        }
        eio
    }

    /// After a crash: every block reads one of the values it may hold.
    fn check_after_crash(&self, srv: &Srv, what: &str) {
        let mut c = Client::connect(&srv.uri()).unwrap();
        for (&off, (vals, _)) in &self.blocks {
            let mut b = vec![0u8; BS as usize];
            c.read(off, &mut b)
                .unwrap_or_else(|e| panic!("{what}: block {off} read failed: {e}"));
            assert!(
                vals.contains(&b),
                "{what}: block {off} reads bytes older than its last durable write ({:#x}..)",
                b[0]
            );
        }
    }

    /// The backing file holds every acknowledged block; a block it does not hold must read
    /// EIO through `srv` (reported lost) when `lost_ok`. Returns how many were lost.
    fn check_backing(&self, dev: &FaultDev, srv: &Srv, lost_ok: bool, what: &str) -> usize {
        let mut c = Client::connect(&srv.uri()).unwrap();
        let mut lost = 0;
        for (&off, (vals, exact)) in &self.blocks {
            let have = dev.bytes(off, BS as usize);
            let ok = if *exact {
                have == *vals.last().unwrap()
            } else {
                vals.iter().rev().take(2).any(|v| *v == have)
            };
            if ok {
                continue;
            }
            let mut b = vec![0u8; BS as usize];
            let read = c.read(off, &mut b);
            assert!(
                lost_ok && read.is_err(),
                "{what}: the backing file does not hold block {off} after a FLUSH that succeeded (holds {:#x}.., {}; the volume read {})",
                have[0],
                if have.iter().all(|&x| x == FILL) { "its initial bytes" } else { "older bytes" },
                match read {
                    Ok(()) => format!("{:#x}..", b[0]),
                    Err(e) => format!("an error: {e}"),
                }
            );
            lost += 1;
        }
        lost
    }
}

fn stats(srv: &Srv) -> serde_json::Value {
    serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap()
}

/// `tiercache ctl ARGS`: whether it succeeded, and its output.
fn ctl_try(srv: &Srv, args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The cache size and how many 64 KiB writes overflow it: 1 MiB (256 lines) for the direct
/// layout; 4 MiB for the log layout (its smallest useful cache: 16 segments of 256 KiB).
/// Small, because every backing request forks the fault device's script.
fn sizes(layout: &[&str]) -> (&'static str, u64) {
    if layout.contains(&"log") {
        ("4M", 64)
    } else {
        ("1M", 20)
    }
}

fn args<'a>(mode: &'a str, layout: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--mode", mode];
    a.extend(layout);
    a
}

/// 8 writes of 16 KiB, FLUSHed; the device's flushes fail (dropping); 8 more 4 KiB writes and
/// 8 rewrites; two FLUSHes must fail; more than the cache written elsewhere (evictions); the device
/// heals: the next FLUSH succeeds with every acknowledged byte on the backing file, reads
/// match before and after a restart. Pass-through: the writes a failed flush dropped may
/// only be reported lost (reads EIO), never read as older bytes.
fn client_flush_scenario(mode: &str, layout: &[&str]) {
    let tmp = common::tmp();
    let dir = tmp.path();
    let Some(dev) = FaultDev::start(dir, VOL, FILL) else {
        return;
    };
    let pt = mode == "pass-through";
    // The log layout starts in write-through or write-back only: pass-through is `ctl detach`.
    let detach = pt && layout.contains(&"log");
    let a = args(if detach { "write-through" } else { mode }, layout);
    let (cache, press) = sizes(layout);
    let srv = Srv::launch(dir, &dev.uri(), cache, &a);
    if detach {
        srv.ctl(&["detach"]);
        assert_eq!(stats(&srv)["mode"], "pass-through");
    }
    let mut c = Client::connect(&srv.uri()).unwrap();
    let mut m = Model::default();
    for i in 0..8u64 {
        assert!(m.write(&mut c, i * 65536, &block(i, 65536)), "write {i}");
    }
    c.flush()
        .expect("FLUSH while the backing device is healthy");
    m.flushed();
    dev.fail("flush drop\n");
    for i in 0..8u64 {
        assert!(m.write(&mut c, i * 65536 + 16384, &block(100 + i, 4096)));
        assert!(m.write(&mut c, i * 65536, &block(200 + i, 4096)));
    }
    let f1 = c.flush();
    let f2 = c.flush();
    let failed = dev.failed("flush");
    println!("{mode} {layout:?}: FLUSHes while the backing flush fails: {f1:?}, {f2:?} ({failed} backing flushes failed)");
    assert!(failed >= 1, "the backing device was never asked to flush");
    assert!(
        f1.is_err() && f2.is_err(),
        "a FLUSH was acknowledged while every backing flush failed and dropped the writes: {f1:?}, {f2:?}"
    );
    m.check_reads(&srv, pt, "after the failed FLUSHes");
    // More than the cache elsewhere: it evicts (write-through) while flushes still fail.
    let mut refused = 0;
    for i in 0..press {
        if !m.write(&mut c, (8 << 20) + i * 65536, &block(300 + i, 65536)) {
            refused += 1;
        }
    }
    let lost_while = m.check_reads(&srv, pt, "after more writes while flushes fail");
    dev.heal();
    c.flush()
        .expect("the first FLUSH after the backing device healed");
    m.flushed();
    let lost = m.check_backing(&dev, &srv, pt, "after the healed FLUSH");
    m.check_reads(&srv, pt, "after the healed FLUSH");
    let st = stats(&srv);
    if !pt {
        assert_eq!(st["lost_dirty_bytes"], 0, "{st}");
    }
    drop(c);
    srv.stop("-TERM");
    // (Detached: restarted in the mode the cache device stores, pass-through.)
    let srv = Srv::launch(dir, &dev.uri(), cache, if detach { layout } else { &a });
    m.check_reads(&srv, pt, "after a restart");
    srv.stop("-TERM");
    println!(
        "{mode} {layout:?}: {refused} of {press} writes refused while flushes failed; {lost_while} blocks read EIO then, {lost} reported lost after the heal; every acknowledged byte on the backing file or reported lost"
    );
}

/// Write-back: 16 dirty 64 KiB runs, FLUSHed (durable in the cache); the device's flushes fail
/// (dropping). `ctl flush` (write-back + sync) must fail; a client FLUSH may succeed only if
/// the data stays durable; 6 MiB more writes put the cache under pressure (watermark
/// cleaning, evictions, the log layout's write-back while reclaiming). Nothing lost, reads
/// exact. Then kill -9 while the device still fails, heal, restart: every write a good FLUSH
/// covered reads back; `ctl flush` succeeds and the backing file holds every byte; a second
/// restart reads it all.
fn write_back_scenario(layout: &[&str]) {
    let tmp = common::tmp();
    let dir = tmp.path();
    let Some(dev) = FaultDev::start(dir, VOL, FILL) else {
        return;
    };
    let a = args("write-back", layout);
    let (cache, press) = sizes(layout);
    let srv = Srv::launch(dir, &dev.uri(), cache, &a);
    let mut c = Client::connect(&srv.uri()).unwrap();
    let mut m = Model::default();
    for i in 0..16u64 {
        assert!(m.write(&mut c, i * 65536, &block(i, 16384)), "write {i}");
    }
    c.flush()
        .expect("FLUSH while the backing device is healthy");
    m.flushed();
    dev.fail("flush drop\n");
    let (ok, out) = ctl_try(&srv, &["flush"]);
    println!(
        "{layout:?}: ctl flush while the backing flush fails: ok={ok}: {}",
        out.trim()
    );
    assert!(
        !ok,
        "ctl flush succeeded while every backing flush failed and dropped the write-backs: {out}"
    );
    assert!(
        dev.failed("flush") >= 1,
        "ctl flush never asked the backing device to flush"
    );
    m.check_reads(&srv, false, "after the failed ctl flush");
    let st = stats(&srv);
    assert_eq!(st["lost_dirty_bytes"], 0, "{st}");
    // The client FLUSH: acknowledged only if what it covers is durable (in the cache).
    for i in 0..16u64 {
        assert!(m.write(&mut c, i * 65536 + 8192, &block(400 + i, 4096)));
    }
    let f = c.flush();
    println!("{layout:?}: client FLUSH in write-back while backing flushes fail: {f:?}");
    if f.is_ok() {
        m.flushed();
    }
    // Pressure: cleaning and evictions while syncs fail.
    let mut refused = 0;
    for i in 0..press {
        if !m.write(&mut c, (8 << 20) + i * 65536, &block(500 + i, 65536)) {
            refused += 1;
        }
    }
    if c.flush().is_ok() {
        m.flushed();
    }
    m.check_reads(&srv, false, "after the writes under pressure");
    let st = stats(&srv);
    assert_eq!(st["lost_dirty_bytes"], 0, "{st}");
    println!(
        "{layout:?}: {refused} of {press} writes refused under pressure; stats: dirty_lines {}, degraded {}, backing_sync_errors {}",
        st["dirty_lines"], st["degraded"], st["backing_sync_errors"]
    );
    drop(c);
    srv.kill9();
    dev.heal();
    let srv = Srv::launch(dir, &dev.uri(), cache, &a);
    m.check_after_crash(&srv, "after kill -9 while the backing flushes failed");
    let (ok, out) = ctl_try(&srv, &["flush"]);
    assert!(ok, "ctl flush after the heal: {out}");
    // Whatever each block reads now is what the backing device must hold.
    let mut c = Client::connect(&srv.uri()).unwrap();
    for &off in m.blocks.keys() {
        let mut b = vec![0u8; BS as usize];
        c.read(off, &mut b).unwrap();
        assert!(
            dev.bytes(off, BS as usize) == b,
            "block {off}: the backing file differs from the volume after ctl flush succeeded"
        );
    }
    drop(c);
    srv.stop("-TERM");
    let srv = Srv::launch(dir, &dev.uri(), cache, &a);
    m.check_after_crash(&srv, "after a second restart");
    srv.stop("-TERM");
}

/// Before notes-directsync3's fix: `after more writes while flushes fail: block 8912896 read
/// failed: ... volume bytes 8912896..9109504 were lost` (lines unmapped ahead, then evicted,
/// without a sync).
#[test]
fn write_through_flush_fails_while_the_backing_flush_fails() {
    client_flush_scenario("write-through", &[]);
}

#[test]
fn log_write_through_flush_fails_while_the_backing_flush_fails() {
    client_flush_scenario("write-through", LOG);
}

#[test]
fn pass_through_flush_fails_while_the_backing_flush_fails() {
    client_flush_scenario("pass-through", &[]);
}

#[test]
fn log_pass_through_flush_fails_while_the_backing_flush_fails() {
    client_flush_scenario("pass-through", LOG);
}

/// Before notes-directsync3's fix: `after the writes under pressure: block 8388608 read
/// failed: ... volume bytes 8388608..8519680 were lost` (the cleaner wrote back and unmapped
/// ahead lines never synced; their evictions then needed no sync).
#[test]
fn write_back_never_drops_dirty_data_while_backing_flushes_fail() {
    write_back_scenario(&[]);
}

#[test]
fn log_write_back_never_drops_dirty_data_while_backing_flushes_fail() {
    write_back_scenario(LOG);
}

fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    body
}

/// Backing syncs that keep failing are a state: DEGRADED in `ctl stats` (naming syncs) and
/// `tiercache_degraded 1`; while the backoff runs, evicting writes do not ask the failing
/// device to flush at every request; the background retry heals it once the device does
/// (no client request needed).
fn degraded_scenario(layout: &[&str]) {
    let tmp = common::tmp();
    let dir = tmp.path();
    let Some(dev) = FaultDev::start(dir, VOL, FILL) else {
        return;
    };
    let maddr = format!("127.0.0.1:{}", free_port());
    let mut a = args("write-through", layout);
    a.extend(["--metrics", &maddr]);
    let (cache, press) = sizes(layout);
    let srv = Srv::launch(dir, &dev.uri(), cache, &a);
    let mut c = Client::connect(&srv.uri()).unwrap();
    c.write(0, &block(1, 65536)).unwrap();
    c.flush().unwrap();
    dev.fail("flush\n");
    c.write(0, &block(2, 65536)).unwrap();
    assert!(c.flush().is_err());
    assert!(c.flush().is_err());
    let st = stats(&srv);
    let text = srv.ctl(&["stats"]);
    let prom = metrics(&maddr);
    println!(
        "{layout:?} while syncs fail: degraded {}, reason {}, backing_sync_errors {}",
        st["degraded"], st["degraded_reason"], st["backing_sync_errors"]
    );
    assert_eq!(st["degraded"], true, "{st}");
    assert!(
        st["degraded_reason"]
            .as_str()
            .unwrap_or("")
            .contains("sync"),
        "{st}"
    );
    assert!(st["backing_sync_errors"].as_u64().unwrap() >= 2, "{st}");
    assert!(text.contains("DEGRADED"), "{text}");
    assert!(prom.contains("\ntiercache_degraded 1"), "{prom}");
    // More than the cache elsewhere while the device still fails: evictions (direct) or
    // seals (log) need a sync; the backoff keeps the device from being asked at every one.
    let before = dev.failed("flush");
    let t = Instant::now();
    let mut refused = 0;
    for i in 0..press {
        refused += c
            .write((8 << 20) + i * 65536, &block(3 + i, 65536))
            .is_err() as u32;
    }
    let asked = dev.failed("flush") - before;
    println!(
        "{layout:?}: {press} writes in {:.1} s while syncs fail: {refused} refused, the device asked to flush {asked} times",
        t.elapsed().as_secs_f64()
    );
    assert!(
        asked <= 12,
        "the failing device was asked to flush {asked} times for {press} writes: no backoff"
    );
    // A read miss while syncs fail: served from the backing device (not admitted, so it
    // needs no slot, whose reuse would need a sync), never refused.
    let mut b = vec![0u8; 65536];
    for i in 0..4u64 {
        c.read((12 << 20) + i * 65536, &mut b)
            .unwrap_or_else(|e| panic!("{layout:?}: read miss while syncs fail: {e}"));
        assert!(b.iter().all(|&x| x == FILL));
    }
    dev.heal();
    let t = Instant::now();
    loop {
        let st = stats(&srv);
        if st["degraded"] == false {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "still degraded 40 s after the device healed, with no request: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{layout:?}: healed by the background retry after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(metrics(&maddr).contains("\ntiercache_degraded 0"));
    c.flush().expect("FLUSH after the heal");
    let mut b = vec![0u8; 65536];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, block(2, 65536));
    assert_eq!(dev.bytes(0, 65536), block(2, 65536));
    drop(c);
    let log = srv.stop("-TERM");
    // The cleaner skips its unmap-ahead batch while syncs fail (it needs one): no
    // `cleaning failed` every half second.
    let failed = log.matches("cleaning failed").count();
    assert!(
        failed <= 1,
        "{layout:?}: {failed} `cleaning failed` lines:\n{log}"
    );
}

#[test]
fn failing_backing_syncs_degrade_the_volume_and_heal() {
    degraded_scenario(&[]);
}

#[test]
fn log_failing_backing_syncs_degrade_the_volume_and_heal() {
    degraded_scenario(LOG);
}
