//! Hostile input, seeded: valid client byte streams (handshake, options, every command) are
//! mutated (bit flips, interesting 8/16/32/64-bit values such as lengths over the limit and
//! offsets past the end, unknown commands and flags, truncation, duplicated and deleted
//! ranges, garbage) and fed to the server over a socketpair; the client half-closes or
//! vanishes mid-stream. Every connection must end (no hang: a deadline per input), the server
//! must not panic, and the heap must stay bounded (a counting allocator checks the peak).
//!
//! `TIERCACHE_NBD_FUZZ_ITERS=N` sets the number of mutated inputs (default 4,000),
//! `TIERCACHE_NBD_FUZZ_SEED=S` the seed; a failure prints the seed and iteration.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{Export, Server, ServerOptions};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            if new > l.size() {
                let now = CURRENT.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SIZE: u64 = 1 << 20;
const MAX_BLOCK: u32 = 64 << 10;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn commands(b: &mut Vec<u8>) {
    request(b, CMD_READ, 0, 1, 0, 4096);
    request(b, CMD_WRITE, CMD_FLAG_FUA, 2, 8192, 512);
    request(b, CMD_READ, CMD_FLAG_DF, 3, 510 << 10, 8192); // into the failing range
    request(b, CMD_FLUSH, 0, 4, 0, 0);
    request(b, CMD_TRIM, 0, 5, 4096, 4096);
    request(b, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 6, 0, 4096);
    request(b, CMD_READ, 0, 7, SIZE - 512, 512);
    request(b, CMD_DISC, 0, 8, 0, 0);
}

/// Well-formed client streams that reach every phase.
fn seeds() -> Vec<Vec<u8>> {
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let mut out = Vec::new();
    // GO with structured replies.
    let mut b = flags.to_vec();
    option(&mut b, OPT_STRUCTURED_REPLY, &[]);
    option(&mut b, OPT_LIST, &[]);
    option(
        &mut b,
        OPT_INFO,
        &go_data("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    option(&mut b, OPT_GO, &go_data("disk", &[INFO_BLOCK_SIZE]));
    commands(&mut b);
    out.push(b);
    // GO with simple replies, default export.
    let mut b = flags.to_vec();
    option(&mut b, OPT_GO, &go_data("", &[]));
    commands(&mut b);
    out.push(b);
    // Oldest path: EXPORT_NAME, zeroes wanted.
    let mut b = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    option(&mut b, OPT_EXPORT_NAME, b"disk");
    commands(&mut b);
    out.push(b);
    // Options only, unknown ones, STARTTLS (unsupported here), ABORT.
    let mut b = flags.to_vec();
    option(&mut b, OPT_STARTTLS, &[]);
    option(&mut b, 42, &[1, 2, 3, 4]);
    option(&mut b, OPT_INFO, &go_data("nope", &[]));
    option(&mut b, OPT_ABORT, &[]);
    out.push(b);
    out
}

const INTERESTING32: [u32; 10] = [
    0,
    1,
    0x7fff_ffff,
    0x8000_0000,
    u32::MAX,
    MAX_BLOCK,
    MAX_BLOCK + 1,
    (SIZE as u32) - 1,
    SIZE as u32,
    4097,
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = b.len().max(1);
        match rng.below(9) {
            0 => {
                let i = rng.below(n);
                if let Some(x) = b.get_mut(i) {
                    *x ^= 1 << rng.below(8);
                }
            }
            1 => {
                let i = rng.below(n);
                if let Some(x) = b.get_mut(i) {
                    *x = [0, 0xff, 0x7f, 0x80, 1][rng.below(5)];
                }
            }
            2 | 3 => {
                // A 32-bit field (lengths, option numbers, flags+type) set to a boundary.
                let i = rng.below(n.saturating_sub(4).max(1));
                let v = INTERESTING32[rng.below(INTERESTING32.len())];
                if i + 4 <= b.len() {
                    b[i..i + 4].copy_from_slice(&v.to_be_bytes());
                }
            }
            4 => {
                // A 64-bit field (offsets, handles) past the end or near overflow.
                let i = rng.below(n.saturating_sub(8).max(1));
                let v = [u64::MAX, SIZE, SIZE + 1, u64::MAX - 511, 1 << 63][rng.below(5)];
                if i + 8 <= b.len() {
                    b[i..i + 8].copy_from_slice(&v.to_be_bytes());
                }
            }
            5 => {
                // A 16-bit field (command type or flags) set to an unknown value.
                let i = rng.below(n.saturating_sub(2).max(1));
                let v = [7u16, 5, 0xffff, 0x8000, 1 << 3][rng.below(5)];
                if i + 2 <= b.len() {
                    b[i..i + 2].copy_from_slice(&v.to_be_bytes());
                }
            }
            6 => b.truncate(rng.below(n)),
            7 => {
                let a = rng.below(n);
                let l = rng.below(64).min(b.len().saturating_sub(a));
                let chunk: Vec<u8> = b[a..a + l].to_vec();
                let at = rng.below(n);
                b.splice(at.min(b.len())..at.min(b.len()), chunk);
            }
            _ => {
                let a = rng.below(n);
                let l = rng.below(64).min(b.len().saturating_sub(a));
                b.drain(a..a + l);
                if rng.below(4) == 0 {
                    b.extend((0..rng.below(64)).map(|_| rng.next() as u8));
                }
            }
        }
    }
    b
}

fn server(opts: ServerOptions) -> Arc<Server> {
    let mut fe = FaultyExport::new(SIZE as usize, 512 << 10, 516 << 10);
    fe.max_block = MAX_BLOCK;
    Arc::new(Server::new(vec![("disk".into(), Arc::new(fe) as Arc<dyn Export>)]).with_options(opts))
}

fn fuzz_opts() -> ServerOptions {
    ServerOptions {
        workers_per_connection: 2,
        max_drain: 256 << 10,
        handshake_deadline: Some(Duration::from_secs(5)),
        ..Default::default()
    }
}

/// Feeds one input; returns what the server sent. Panics on a hang or a server panic.
fn feed(srv: &Arc<Server>, input: Vec<u8>, vanish: bool, what: &str) -> Vec<u8> {
    let (client, theirs) = UnixStream::pair().unwrap();
    let s2 = srv.clone();
    let server_side = std::thread::spawn(move || s2.serve_stream(theirs));
    let mut w = client.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&input);
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut got = Vec::new();
    if vanish {
        // Disconnect mid-stream: read a little, then drop everything.
        client
            .set_read_timeout(Some(Duration::from_millis(2)))
            .unwrap();
        let mut b = [0u8; 256];
        let _ = (&client).read(&mut b);
        client.shutdown(std::net::Shutdown::Both).unwrap();
    } else {
        let deadline = Instant::now() + Duration::from_secs(20);
        client
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = vec![0u8; 64 << 10];
        loop {
            match (&client).read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    assert!(
                        Instant::now() < deadline,
                        "{what}: the server neither answered nor closed within 20 s"
                    );
                }
                Err(_) => break,
            }
        }
    }
    writer.join().unwrap();
    let r = server_side.join();
    assert!(r.is_ok(), "{what}: the server thread panicked");
    drop(client);
    got
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn mutated_streams_get_replies_or_clean_disconnects() {
    let iters = env_u64("TIERCACHE_NBD_FUZZ_ITERS", 4000);
    let seed = env_u64("TIERCACHE_NBD_FUZZ_SEED", 0x6e62_6466);
    let srv = server(fuzz_opts());
    let seeds = seeds();
    // The unmutated seeds reach transmission and get their answers.
    for (i, s) in seeds.iter().enumerate() {
        let got = feed(&srv, s.clone(), false, &format!("seed stream {i}"));
        assert!(got.len() >= 18, "seed {i}: no greeting");
        assert_eq!(&got[..8], &NBDMAGIC.to_be_bytes());
        if i < 3 {
            let has_read_data = got
                .windows(4)
                .any(|w| w == SIMPLE_REPLY_MAGIC.to_be_bytes())
                || got
                    .windows(4)
                    .any(|w| w == STRUCTURED_REPLY_MAGIC.to_be_bytes());
            assert!(has_read_data, "seed {i}: no transmission replies");
        }
    }
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut bytes_out = 0usize;
    for it in 0..iters {
        let s = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, s);
        let vanish = rng.below(8) == 0;
        let what = format!(
            "iteration {it} (TIERCACHE_NBD_FUZZ_SEED={seed}, input {} bytes)",
            input.len()
        );
        let got = feed(&srv, input, vanish, &what);
        if !vanish {
            assert!(
                got.len() >= 18 && got[..8] == NBDMAGIC.to_be_bytes(),
                "{what}: no greeting"
            );
        }
        bytes_out += got.len();
    }
    let peak = PEAK.load(Ordering::Relaxed) - base;
    println!(
        "{iters} mutated inputs (seed {seed}) in {:.1} s; {bytes_out} bytes of replies; heap peak {} KiB above start",
        started.elapsed().as_secs_f64(),
        peak >> 10
    );
    // One connection at a time, two workers, 64 KiB blocks, 256 KiB drain: a few MiB at
    // most, whatever lengths the input claims.
    assert!(
        peak < 16 << 20,
        "heap grew by {peak} bytes on hostile input"
    );
    // The server still serves a well-behaved client.
    let got = feed(&srv, seeds[1].clone(), false, "after fuzzing");
    assert!(got
        .windows(4)
        .any(|w| w == SIMPLE_REPLY_MAGIC.to_be_bytes()));
}
