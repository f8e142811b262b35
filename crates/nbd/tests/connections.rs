//! Thousands of connections: 2,000 sequential sessions (half of them vanish without
//! NBD_CMD_DISC), then 200 opened at once against a limit of 64 (the rest are closed right
//! after accept), then idle clients that are dropped at the handshake timeout; the server's
//! threads stay bounded (two per connection at most, plus the shared pool) and come back
//! down. Its own test binary, so thread counts are its own.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{Export, ServerOptions};

const SIZE: u64 = 1 << 20;

fn threads_now() -> usize {
    proc_status("Threads") as usize
}

fn handshake_and_read(s: &mut UnixStream) -> bool {
    raw_go(s, "disk") && raw_read(s, 9, 4096, 4096).is_some()
}

#[test]
fn thousands_of_connections_with_bounded_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (_p, e) = file_export(dir.path(), "d.img", SIZE);
    let limit = 64;
    let workers = 4;
    let srv = TestServer::start_with(
        vec![("disk".into(), e as Arc<dyn Export>)],
        ServerOptions {
            workers_per_connection: workers,
            max_connections: limit,
            handshake_deadline: Some(Duration::from_secs(2)),
            ..Default::default()
        },
    );
    let base_threads = threads_now();
    // 2,000 sequential sessions.
    let t0 = Instant::now();
    for i in 0..2000 {
        let mut s = UnixStream::connect(&srv.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(handshake_and_read(&mut s), "session {i}");
        if i % 2 == 0 {
            let mut b = Vec::new();
            request(&mut b, CMD_DISC, 0, 1, 0, 0);
            s.write_all(&b).unwrap();
        } // else: just vanish
    }
    println!(
        "2000 sequential sessions in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // 200 connections opened at once and kept open: the first `limit` are served, the rest
    // are closed right after accept (the client sees EOF instead of a greeting).
    let mut open = Vec::new();
    for _ in 0..200 {
        let s = UnixStream::connect(&srv.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        open.push(s);
    }
    let mut served = 0;
    for s in open.iter_mut() {
        if handshake_and_read(s) {
            served += 1;
        }
    }
    let peak_threads = threads_now();
    println!(
        "200 open at once: {served} served, {} refused; threads {base_threads} -> {peak_threads}",
        200 - served
    );
    assert!(
        served >= limit / 2 && served <= limit,
        "served {served} of 200 with limit {limit}"
    );
    // At most a reader and a writer per connection: the workers are one shared pool
    // (started with the server, so in base_threads), not `workers` per connection.
    assert!(
        peak_threads <= base_threads + 2 * limit + 8,
        "threads grew from {base_threads} to {peak_threads}"
    );
    drop(open);
    // Idle connections that never say anything are dropped after the handshake timeout.
    let idle: Vec<UnixStream> = (0..limit)
        .map(|_| UnixStream::connect(&srv.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(3000));
    let mut s = UnixStream::connect(&srv.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(
        handshake_and_read(&mut s),
        "idle clients still hold every slot after the handshake timeout"
    );
    drop(idle);
    // Threads come back down.
    let deadline = Instant::now() + Duration::from_secs(10);
    drop(s);
    while threads_now() > base_threads + workers + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        threads_now() <= base_threads + workers + 2,
        "threads stay up"
    );
    srv.stop();
}
