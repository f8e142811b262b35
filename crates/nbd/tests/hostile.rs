//! Hostile clients, all at once against one in-process server (loopback unix socket, memory
//! export): 2,000 connections that complete NBD_OPT_GO and stay (opened in waves), 8
//! amplifiers (16 pipelined 32 MiB READs each, replies never read), 200 slowloris clients (a
//! byte every 3 s in the handshake), an option flood (NBD_OPT_LIST in a loop, one flooder
//! reading its replies, one not). Meanwhile a well-behaved client connects and reads 4 KiB
//! every second and must be done within 1 s each time; the process (which hosts the server;
//! the clients hold next to no memory) stays under 1 GiB and its threads stay bounded.
//!
//! `HOSTILE_SECS` sets the duration (default 60, what CI runs). Its own test binary, so the
//! process's threads and memory are this test's.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{Export, ServerOptions};

const SIZE: usize = 64 << 20;
const BIG: u32 = 32 << 20;
/// Bytes at the start of the export holding a pattern the good client checks.
const PATTERN: usize = 4 << 20;
const FLOOD: usize = 2000;
const AMPLIFIERS: usize = 8;
const SLOWLORIS: usize = 200;
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the soft limit in force.
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

fn connect(srv: &TestServer) -> Option<UnixStream> {
    let s = UnixStream::connect(&srv.socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(s)
}

fn hostile_opts() -> ServerOptions {
    ServerOptions {
        // Every hostile connection of this test fits, so the good client is never refused
        // for lack of a slot: what is tested is that they cannot starve it otherwise.
        max_connections: FLOOD + SLOWLORIS + AMPLIFIERS + 64,
        write_timeout: Some(WRITE_TIMEOUT),
        ..Default::default()
    }
}

#[derive(Default)]
struct Counts {
    flood_open: AtomicU64,
    flood_refused: AtomicU64,
    amp_rounds: AtomicU64,
    slow_dropped: AtomicU64,
    opt_sent: AtomicU64,
    opt_closed: AtomicU64,
    deaf_closed: AtomicU64,
    peak_rss_kb: AtomicU64,
    peak_threads: AtomicU64,
}

#[test]
fn hostile_clients_cannot_take_the_server_down_or_starve_a_good_client() {
    let secs: u64 = std::env::var("HOSTILE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let nofile = raise_nofile();
    // Both ends of every connection live in this process.
    let flood = FLOOD.min((nofile as usize).saturating_sub(2 * SLOWLORIS + 200) / 2);
    if flood < FLOOD {
        println!("RLIMIT_NOFILE {nofile}: flood of {flood} connections instead of {FLOOD}");
    }
    let export = FaultyExport {
        max_block: BIG,
        ..FaultyExport::new(SIZE, u64::MAX, u64::MAX)
    };
    for (i, b) in export.data.lock().unwrap()[..PATTERN]
        .iter_mut()
        .enumerate()
    {
        *b = (i.wrapping_mul(7) >> 5) as u8;
    }
    let export = Arc::new(export);
    let opts = hostile_opts();
    let srv = Arc::new(TestServer::start_with(
        vec![("disk".into(), export.clone() as Arc<dyn Export>)],
        opts.clone(),
    ));
    let base_threads = proc_status("Threads");
    let base_rss = proc_status("VmRSS");
    println!("base: {base_threads} threads, {base_rss} kB RSS; {opts:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let c = Arc::new(Counts::default());
    let end = Instant::now() + Duration::from_secs(secs);
    let mut hostile = Vec::new();

    // Connection flood: waves of 250 connections that complete GO and stay open.
    let held = Arc::new(Mutex::new(Vec::new()));
    {
        let (srv, stop, c, held) = (srv.clone(), stop.clone(), c.clone(), held.clone());
        hostile.push(thread::spawn(move || {
            for _wave in 0..flood.div_ceil(250) {
                for _ in 0..250 {
                    if stop.load(Ordering::SeqCst) || held.lock().unwrap().len() >= flood {
                        return;
                    }
                    match connect(&srv) {
                        Some(mut s) => {
                            if !raw_go(&mut s, "disk") {
                                c.flood_refused.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                            c.flood_open.fetch_add(1, Ordering::SeqCst);
                            held.lock().unwrap().push(s);
                        }
                        None => {
                            c.flood_refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                thread::sleep(Duration::from_millis(500));
            }
        }));
    }
    // Amplifiers: 16 READs of 32 MiB each, replies never read; reconnect after the server's
    // write timeout (it should have dropped them by then).
    for a in 0..AMPLIFIERS {
        let (srv, stop, c) = (srv.clone(), stop.clone(), c.clone());
        hostile.push(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Some(mut s) = connect(&srv) else {
                    thread::sleep(Duration::from_millis(100));
                    continue;
                };
                if !raw_go(&mut s, "disk") {
                    thread::sleep(Duration::from_millis(100));
                    continue;
                }
                let mut b = Vec::new();
                for h in 0..16u64 {
                    let off = ((a as u64 + h) % 2) * BIG as u64;
                    request(&mut b, CMD_READ, 0, h, off, BIG);
                }
                if s.write_all(&b).is_ok() {
                    c.amp_rounds.fetch_add(1, Ordering::SeqCst);
                }
                let until = Instant::now() + WRITE_TIMEOUT + Duration::from_secs(2);
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }));
    }
    // Slowloris: 200 connections, each sending one byte of a handshake every 3 s; one that
    // the server closed is opened again.
    {
        let (srv, stop, c) = (srv.clone(), stop.clone(), c.clone());
        hostile.push(thread::spawn(move || {
            let mut script = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
                .to_be_bytes()
                .to_vec();
            option(&mut script, OPT_GO, &go_data("disk", &[]));
            let mut conns: Vec<Option<(UnixStream, usize)>> =
                (0..SLOWLORIS).map(|_| None).collect();
            let mut tick = 0usize;
            while !stop.load(Ordering::SeqCst) {
                // Spread over the 3 s period: a tenth of them every 300 ms.
                for (i, slot) in conns.iter_mut().enumerate() {
                    if i % 10 != tick % 10 {
                        continue;
                    }
                    let alive = match slot {
                        Some((s, at)) => {
                            let ok = s.write_all(&script[*at % script.len()..][..1]).is_ok();
                            *at += 1;
                            ok
                        }
                        None => false,
                    };
                    if !alive {
                        if slot.is_some() {
                            c.slow_dropped.fetch_add(1, Ordering::SeqCst);
                        }
                        *slot = connect(&srv).map(|s| (s, 0));
                    }
                }
                tick += 1;
                thread::sleep(Duration::from_millis(300));
            }
        }));
    }
    // Option flood: one flooder reads its replies, one never does.
    {
        let (srv, stop, c) = (srv.clone(), stop.clone(), c.clone());
        hostile.push(thread::spawn(move || {
            let mut list = Vec::new();
            option(&mut list, OPT_LIST, &[]);
            while !stop.load(Ordering::SeqCst) {
                let Some(mut s) = connect(&srv) else { continue };
                let mut hello = [0u8; 18];
                if s.read_exact(&mut hello).is_err()
                    || s.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).is_err()
                {
                    continue;
                }
                'opts: while !stop.load(Ordering::SeqCst) {
                    if s.write_all(&list).is_err() {
                        break;
                    }
                    c.opt_sent.fetch_add(1, Ordering::SeqCst);
                    loop {
                        let mut h = [0u8; 20];
                        if s.read_exact(&mut h).is_err() {
                            break 'opts;
                        }
                        let mut d =
                            vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
                        if s.read_exact(&mut d).is_err() {
                            break 'opts;
                        }
                        if u32::from_be_bytes(h[12..16].try_into().unwrap()) == REP_ACK {
                            break;
                        }
                    }
                }
                if !stop.load(Ordering::SeqCst) {
                    c.opt_closed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    {
        let (srv, stop, c) = (srv.clone(), stop.clone(), c.clone());
        hostile.push(thread::spawn(move || {
            let mut list = Vec::new();
            for _ in 0..64 {
                option(&mut list, OPT_LIST, &[]);
            }
            while !stop.load(Ordering::SeqCst) {
                let Some(mut s) = connect(&srv) else { continue };
                s.set_write_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                if s.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).is_err() {
                    continue;
                }
                // Write until the server stops reading (its replies fill our receive
                // buffer), then keep the connection until the server closes it.
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match s.write(&list) {
                        // 16 bytes an option.
                        Ok(n) => c.opt_sent.fetch_add(n as u64 / 16, Ordering::SeqCst),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(_) => break,
                    };
                }
                c.deaf_closed.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // Monitor.
    {
        let (stop, c) = (stop.clone(), c.clone());
        hostile.push(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                c.peak_rss_kb
                    .fetch_max(proc_status("VmRSS"), Ordering::SeqCst);
                c.peak_threads
                    .fetch_max(proc_status("Threads"), Ordering::SeqCst);
                thread::sleep(Duration::from_millis(100));
            }
        }));
    }

    // The well-behaved client, on this thread: every second, connect, GO, read 4 KiB.
    let mut rounds = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u64;
    while Instant::now() < end {
        let tick = t0 + Duration::from_secs(i + 1);
        thread::sleep(tick.saturating_duration_since(Instant::now()));
        let start = Instant::now();
        let off = (i * 4096 * 37) % (PATTERN as u64 - 4096);
        let got = connect(&srv).and_then(|mut s| {
            if !raw_go(&mut s, "disk") {
                return None;
            }
            let d = raw_read(&mut s, i, off, 4096)?;
            let mut b = Vec::new();
            request(&mut b, CMD_DISC, 0, 0, 0, 0);
            let _ = s.write_all(&b);
            Some(d)
        });
        let took = start.elapsed();
        let ok = got.is_some_and(|d| {
            d.iter()
                .enumerate()
                .all(|(k, &b)| b == ((off as usize + k).wrapping_mul(7) >> 5) as u8)
        });
        println!(
            "good client round {i}: {} in {} ms; flood {} open; threads {}, RSS {} MiB",
            if ok { "ok" } else { "FAILED" },
            took.as_millis(),
            c.flood_open.load(Ordering::SeqCst),
            proc_status("Threads"),
            proc_status("VmRSS") >> 10
        );
        rounds.push((i, ok, took));
        i += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for t in hostile {
        t.join().unwrap();
    }
    let hwm = proc_status("VmHWM");
    drop(held);
    let worst = rounds.iter().map(|r| r.2).max().unwrap_or_default();
    println!(
        "{secs} s: flood {} open ({} refused), {} amplifier rounds, {} slowloris dropped, {} options written ({} flooders closed, {} deaf ones; the server reads at most max_options of each), peak {} threads (base {base_threads}), peak RSS {} MiB, VmHWM {} MiB, good client worst {} ms over {} rounds",
        c.flood_open.load(Ordering::SeqCst),
        c.flood_refused.load(Ordering::SeqCst),
        c.amp_rounds.load(Ordering::SeqCst),
        c.slow_dropped.load(Ordering::SeqCst),
        c.opt_sent.load(Ordering::SeqCst),
        c.opt_closed.load(Ordering::SeqCst),
        c.deaf_closed.load(Ordering::SeqCst),
        c.peak_threads.load(Ordering::SeqCst),
        c.peak_rss_kb.load(Ordering::SeqCst) >> 10,
        hwm >> 10,
        worst.as_millis(),
        rounds.len()
    );
    let bad: Vec<String> = rounds
        .iter()
        .filter(|r| !r.1 || r.2 > Duration::from_secs(1))
        .map(|r| format!("round {}: ok={} in {} ms", r.0, r.1, r.2.as_millis()))
        .collect();
    assert!(
        bad.is_empty(),
        "the good client was starved in {} of {} rounds: {bad:?}",
        bad.len(),
        rounds.len()
    );
    assert!(hwm < 1 << 20, "process VmHWM {} MiB >= 1 GiB", hwm >> 10);
    // Threads: at most a reader and a writer per open connection, the shared workers and
    // the test's own threads; never connections x workers.
    let bound = 2 * opts.max_connections as u64 + opts.workers as u64 + base_threads + 32;
    assert!(
        c.peak_threads.load(Ordering::SeqCst) <= bound,
        "threads peaked at {} (bound {bound})",
        c.peak_threads.load(Ordering::SeqCst)
    );
    assert_eq!(
        c.flood_open.load(Ordering::SeqCst) as usize,
        flood,
        "the flood's connections are all served"
    );
    assert!(c.amp_rounds.load(Ordering::SeqCst) >= AMPLIFIERS as u64);
    let deadline = opts.handshake_deadline.unwrap().as_secs();
    if secs > deadline + 5 {
        assert!(
            c.slow_dropped.load(Ordering::SeqCst) >= SLOWLORIS as u64,
            "slowloris clients are dropped at the handshake deadline ({} dropped)",
            c.slow_dropped.load(Ordering::SeqCst)
        );
        assert!(
            c.opt_closed.load(Ordering::SeqCst) > 0 && c.deaf_closed.load(Ordering::SeqCst) > 0,
            "option flooders are closed (option limit / handshake deadline)"
        );
    }
    Arc::try_unwrap(srv).ok().expect("all clients ended").stop();
}
