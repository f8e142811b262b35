//! The server's limits against single hostile clients, one at a time (hostile.rs runs them
//! all at once): the handshake deadline is total (a client trickling bytes is dropped), the
//! option count is limited, and a client that never reads its replies is dropped at the
//! write timeout, which gives its share of the in-flight budget back to the others.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{Export, ServerOptions};

const BIG: u32 = 32 << 20;

fn server(opts: ServerOptions) -> TestServer {
    let e = FaultyExport {
        max_block: BIG,
        ..FaultyExport::new(64 << 20, u64::MAX, u64::MAX)
    };
    TestServer::start_with(vec![("disk".into(), Arc::new(e) as Arc<dyn Export>)], opts)
}

fn connect(srv: &TestServer) -> UnixStream {
    let s = UnixStream::connect(&srv.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Whether the server has shut the connection down (both directions: POLLHUP).
fn hung_up(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) };
    p.revents & libc::POLLHUP != 0
}

#[test]
fn handshake_deadline_is_total_not_per_read() {
    let srv = server(ServerOptions {
        handshake_deadline: Some(Duration::from_secs(1)),
        ..Default::default()
    });
    let mut s = connect(&srv);
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    let mut script = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for _ in 0..100 {
        option(&mut script, OPT_LIST, &[]);
    }
    // A byte every 100 ms: never idle for long, never done.
    let t0 = Instant::now();
    let mut closed = None;
    for b in script.iter().take(50) {
        if s.write_all(&[*b]).is_err() || hung_up(&s) {
            closed = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed = closed.expect("a client trickling its handshake was not dropped within 5 s");
    println!("trickling client dropped after {} ms", closed.as_millis());
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_millis(2500),
        "dropped after {closed:?}, deadline 1 s"
    );
    srv.stop();
}

#[test]
fn option_count_is_limited() {
    let srv = server(ServerOptions {
        max_options: 8,
        ..Default::default()
    });
    let mut s = connect(&srv);
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    let mut b = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for _ in 0..20 {
        option(&mut b, OPT_LIST, &[]);
    }
    s.write_all(&b).unwrap();
    let mut acks = 0;
    loop {
        let mut h = [0u8; 20];
        if s.read_exact(&mut h).is_err() {
            break;
        }
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut d).unwrap();
        if u32::from_be_bytes(h[12..16].try_into().unwrap()) == REP_ACK {
            acks += 1;
        }
    }
    assert_eq!(
        acks, 8,
        "options answered before the connection was dropped"
    );
    // The limit is per connection: a new one is served.
    let mut s = connect(&srv);
    assert!(raw_go(&mut s, "disk") && raw_read(&mut s, 1, 0, 4096).is_some());
    srv.stop();
}

#[test]
fn deaf_client_is_dropped_at_the_write_timeout_and_its_budget_returns() {
    let srv = server(ServerOptions {
        write_timeout: Some(Duration::from_secs(1)),
        max_inflight_bytes: 64 << 20,
        max_inflight_bytes_per_connection: 64 << 20,
        ..Default::default()
    });
    let mut deaf = connect(&srv);
    assert!(raw_go(&mut deaf, "disk"));
    let mut b = Vec::new();
    for h in 0..16 {
        request(&mut b, CMD_READ, 0, h, 0, BIG);
    }
    deaf.write_all(&b).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The deaf client holds the whole budget: a large read of another client waits for it...
    let t0 = Instant::now();
    let mut other = connect(&srv);
    assert!(raw_go(&mut other, "disk"));
    let reader = std::thread::spawn(move || {
        let d = raw_read(&mut other, 7, BIG as u64, BIG);
        (d.map(|d| d.len()), t0.elapsed())
    });
    // ... while small requests still get through at once.
    let mut small = connect(&srv);
    let t1 = Instant::now();
    assert!(raw_go(&mut small, "disk") && raw_read(&mut small, 1, 0, 4096).is_some());
    assert!(
        t1.elapsed() < Duration::from_millis(500),
        "a 4 KiB read took {:?} while the budget was used up",
        t1.elapsed()
    );
    let (got, took) = reader.join().unwrap();
    assert_eq!(got, Some(BIG as usize));
    println!(
        "32 MiB read waited {} ms for the deaf client",
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(4),
        "the budget did not come back after the write timeout ({took:?})"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while !hung_up(&deaf) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        hung_up(&deaf),
        "a client that never reads its replies was not dropped"
    );
    srv.stop();
}

/// A client that vanishes while replies are being sent: the writer thread fails, and a
/// worker finishing a reply at that moment must not hand it to the writer that is gone (the
/// reply's budget would never come back and the connection would wait for it forever). Many
/// rounds, each with several large reads in flight so that replies go both ways (worker send
/// and writer thread) when the client disappears.
#[test]
fn client_vanishing_mid_reply_never_strands_its_connection() {
    use tiercache_nbd::Server;
    let rounds = std::env::var("TIERCACHE_NBD_VANISH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let e = FaultyExport {
        max_block: BIG,
        ..FaultyExport::new(16 << 20, u64::MAX, u64::MAX)
    };
    let srv = Arc::new(
        Server::new(vec![("disk".into(), Arc::new(e) as Arc<dyn Export>)]).with_options(
            ServerOptions {
                workers_per_connection: 8,
                ..Default::default()
            },
        ),
    );
    for round in 0..rounds {
        let (mut client, theirs) = UnixStream::pair().unwrap();
        let s2 = srv.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = s2.serve_stream(theirs);
            let _ = tx.send(());
        });
        assert!(raw_go(&mut client, "disk"), "round {round}: handshake");
        let mut b = Vec::new();
        for h in 0..8u64 {
            request(&mut b, CMD_READ, 0, h, h << 20, 96 << 10);
        }
        client.write_all(&b).unwrap();
        // Take a little of the first reply, then vanish.
        let mut some = vec![0u8; (round % 7) * 4096 + 1];
        let _ = client.read_exact(&mut some);
        client.shutdown(std::net::Shutdown::Both).unwrap();
        drop(client);
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "round {round}: the connection of a vanished client never ended (a reply's budget \
             was stranded)"
        );
    }
}
