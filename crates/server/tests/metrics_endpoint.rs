//! The Prometheus endpoint under slow clients (issue 14, item 8): clients that trickle their
//! request a byte at a time must not keep a scraper from being answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_server::control::serve_prometheus;

fn get_metrics(addr: SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    let _ = c.read_to_string(&mut reply);
    reply
}

/// Five slowloris clients connected, each sending a byte of its request head every 300 ms
/// (faster than any per-read timeout), for 6 s: a normal `GET /metrics` is answered within
/// 1 s, every time. Before the fix the one-at-a-time responder served the first slowloris
/// for as long as it trickled (5 s per byte of silence, 16 KiB of head): every GET timed out.
#[test]
fn slowloris_clients_do_not_block_metrics() {
    let (addr, _) = serve_prometheus("127.0.0.1:0".parse().unwrap(), || {
        "tiercache_test_metric 1\n".to_string()
    })
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut lorises = Vec::new();
    for _ in 0..5 {
        let stop = Arc::clone(&stop);
        let mut c = TcpStream::connect(addr).unwrap();
        lorises.push(std::thread::spawn(move || {
            for b in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().cycle() {
                if stop.load(Ordering::Relaxed) || c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300)); // every slowloris connected first
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(6) {
        let t = Instant::now();
        let reply = std::thread::scope(|s| {
            let h = s.spawn(|| get_metrics(addr));
            while !h.is_finished() && t.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(5));
            }
            h.is_finished().then(|| h.join().unwrap())
        });
        let took = t.elapsed();
        worst = worst.max(took);
        let Some(reply) = reply else {
            stop.store(true, Ordering::Relaxed);
            panic!("GET /metrics not answered within 3 s while 5 slow clients are connected");
        };
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.contains("tiercache_test_metric 1"),
            "{reply:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "GET /metrics took {took:?} with 5 slow clients connected"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for l in lorises {
        l.join().unwrap();
    }
    println!("worst GET /metrics with 5 slowloris clients: {worst:?}");
}

/// More connections than the cap are closed at once; the endpoint keeps answering.
#[test]
fn metrics_connection_cap_sheds_excess_clients() {
    let (addr, _) =
        serve_prometheus("127.0.0.1:0".parse().unwrap(), || "m 1\n".to_string()).unwrap();
    let idle: Vec<TcpStream> = (0..tiercache_server::control::METRICS_MAX_CONNECTIONS + 8)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // The idle ones hold the cap; a new client is shed (closed without a reply) — and once the
    // idle ones hit their request deadline, a new GET is served.
    let t = Instant::now();
    let reply = loop {
        let r = get_metrics(addr);
        if r.starts_with("HTTP/1.1 200") {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "never served again after idle clients hit the cap"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(reply.contains("m 1"), "{reply}");
    drop(idle);
}
