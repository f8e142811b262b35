//! The RAM tier above a log-layout cache (`LogVolume::set_ram_cache`, `serve --layout log
//! --ram-cache`) never serves stale bytes: writes, trims, write-zeroes, sub-line writes and
//! mode switches (pass-through included), alone and with concurrent readers filling it; and
//! it serves nothing once the volume shut down or halted after a panic.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{format_log, BlockDev, FileDev, LogFormatOptions, LogVolume};

const LS: u64 = 4096;
const SEG: u64 = 4 * LS;

/// A log cache of 16 segments of 4 lines (64 lines) in `mode`.
fn log_files(mode: Mode) -> Files {
    let f = log_cache_files(16, SEG);
    let o = LogFormatOptions {
        line_size: LS,
        segment_size: SEG,
        mode,
        ..Default::default()
    };
    format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
    f
}

fn open_log(f: &Files, backing: Box<dyn BlockDev>, ram_lines: u64) -> LogVolume {
    let (mut v, _) = LogVolume::open(Box::new(FileDev::open(&f.cache).unwrap()), backing).unwrap();
    if ram_lines > 0 {
        v.set_ram_cache(ram_lines * LS, None).unwrap();
    }
    v
}

fn backing(f: &Files) -> Box<dyn BlockDev> {
    Box::new(FileDev::open(&f.backing).unwrap())
}

fn ram_hits(v: &LogVolume) -> u64 {
    let s = tiercache_server::LiveVolume::live_stats(v);
    s.volume.ram.expect("a RAM tier").ram_hits
}

/// The same random requests through a log volume with a RAM tier and one without: every
/// read returns the same bytes. Reads (whole lines, sub-line, multi-line), writes
/// (overlapping, unaligned, sub-line), trims, write-zeroes, flushes, and a mode switch
/// (write-through, write-back, pass-through) every few hundred requests.
#[test]
fn log_reads_through_the_ram_tier_equal_reads_without_it() {
    let (fa, fb) = (log_files(Mode::WriteBack), log_files(Mode::WriteBack));
    let with = open_log(&fa, backing(&fa), 16);
    let without = open_log(&fb, backing(&fb), 0);
    // The hot span: 96 lines over a 64-line cache and a 16-line RAM tier.
    let span = 96 * LS;
    let modes = [Mode::WriteThrough, Mode::WriteBack, Mode::PassThrough];
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut trimmed = vec![false; span as usize];
    let (mut trims_checked, mut pass_through_reads) = (0, 0);
    let mut mode = Mode::WriteBack;
    for i in 0..8_000u32 {
        if i % 600 == 599 {
            mode = modes[rng.gen_range(0..modes.len())];
            with.set_mode(mode).unwrap();
            without.set_mode(mode).unwrap();
        }
        let (off, len) = match rng.gen_range(0..3) {
            0 => (rng.gen_range(0..96) * LS, LS),
            1 => {
                let o = rng.gen_range(0..span - 1);
                (o, rng.gen_range(1..=2048.min(span - o)))
            }
            _ => (
                rng.gen_range(0..93) * LS + rng.gen_range(0..2) * 512,
                2 * LS,
            ),
        };
        match rng.gen_range(0..20) {
            0..=11 => {
                a.resize(len as usize, 0);
                b.resize(len as usize, 0);
                let h = ram_hits(&with);
                with.read(off, &mut a).unwrap();
                without.read(off, &mut b).unwrap();
                // Trimmed bytes are undefined until written again (a trim drops lines
                // from the cache; the backing device keeps what its write-backs left).
                let differs =
                    (0..len as usize).find(|&j| a[j] != b[j] && !trimmed[off as usize + j]);
                assert!(
                    differs.is_none(),
                    "request {i} ({mode}): read of {len} bytes at {off} differs with the RAM \
                     tier (first difference at byte {differs:?})"
                );
                if mode == Mode::PassThrough {
                    // Emptied at the switch, never filled in pass-through.
                    assert_eq!(ram_hits(&with), h, "request {i}: a RAM hit in pass-through");
                    pass_through_reads += 1;
                }
            }
            12..=16 => {
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                with.write(off, &data, false).unwrap();
                without.write(off, &data, false).unwrap();
                trimmed[off as usize..(off + len) as usize].fill(false);
            }
            17 => {
                with.trim(off, len).unwrap();
                without.trim(off, len).unwrap();
                trimmed[off as usize..(off + len) as usize].fill(true);
                // A whole line inside the trim is not in RAM any more.
                let l = off.div_ceil(LS);
                if (l + 1) * LS <= off + len {
                    let h = ram_hits(&with);
                    a.resize(LS as usize, 0);
                    with.read(l * LS, &mut a).unwrap();
                    assert_eq!(ram_hits(&with), h, "request {i}: a trimmed line hit in RAM");
                    trims_checked += 1;
                }
            }
            18 => {
                with.write_zeroes(off, len, false, false).unwrap();
                without.write_zeroes(off, len, false, false).unwrap();
                trimmed[off as usize..(off + len) as usize].fill(false);
            }
            _ => {
                with.flush().unwrap();
                without.flush().unwrap();
            }
        }
    }
    let s = tiercache_server::LiveVolume::live_stats(&with);
    let r = s.volume.ram.as_ref().expect("a RAM tier");
    assert!(
        r.ram_hits > 300 && r.counters.invalidations > 100 && r.counters.evictions > 50,
        "the RAM tier was not exercised: {r:?}"
    );
    assert_eq!(r.read_requests, r.ram_hits + r.ssd_hits + r.misses);
    assert!(r.ssd_hits > 0 && r.misses > 0, "{r:?}");
    assert!(
        trims_checked > 30,
        "only {trims_checked} trims of whole lines"
    );
    assert!(
        pass_through_reads > 50,
        "only {pass_through_reads} pass-through reads"
    );
    let prom = tiercache_server::live::prometheus(&with);
    assert!(
        prom.contains(&format!(
            "tiercache_tier_read_requests_total{{tier=\"ram\"}} {}",
            r.ram_hits
        )) && prom.contains("tiercache_ram_fills_total"),
        "no per-tier reads in Prometheus:\n{prom}"
    );
    assert!(tiercache_server::LiveVolume::live_stats(&without)
        .volume
        .ram
        .is_none());
}

/// Threads write their own lines (sub-line pieces and write-zeroes) and read them back
/// while all of them read every line, so RAM fills race with writes: a thread always reads
/// back what it wrote last.
#[test]
fn log_concurrent_readers_never_leave_a_writer_stale_bytes() {
    const THREADS: u64 = 4;
    const LINES: u64 = 32;
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        let f = log_files(mode);
        let vol = Arc::new(open_log(&f, backing(&f), 8));
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let vol = Arc::clone(&vol);
                std::thread::spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(t + 200);
                    let mine: Vec<u64> = (0..LINES).filter(|l| l % THREADS == t).collect();
                    let mut model: Vec<Vec<u8>> = mine
                        .iter()
                        .map(|&l| (l * LS..(l + 1) * LS).map(initial).collect())
                        .collect();
                    let mut buf = vec![0u8; LS as usize];
                    for i in 0..2500 {
                        match rng.gen_range(0..4) {
                            0 => {
                                let k = rng.gen_range(0..mine.len());
                                let o = rng.gen_range(0..LS - 1);
                                let n = rng.gen_range(1..=(LS - o).min(1500));
                                let line = mine[k];
                                if rng.gen_bool(0.2) {
                                    vol.write_zeroes(line * LS + o, n, false, false).unwrap();
                                    model[k][o as usize..(o + n) as usize].fill(0);
                                } else {
                                    let d: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                                    vol.write(line * LS + o, &d, false).unwrap();
                                    model[k][o as usize..(o + n) as usize].copy_from_slice(&d);
                                }
                            }
                            1 => {
                                let k = rng.gen_range(0..mine.len());
                                vol.read(mine[k] * LS, &mut buf).unwrap();
                                assert!(
                                    buf == model[k],
                                    "{mode} thread {t} op {i}: line {} reads back stale bytes",
                                    mine[k]
                                );
                            }
                            _ => {
                                let l = rng.gen_range(0..LINES);
                                vol.read(l * LS, &mut buf).unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(ram_hits(&vol) > 100, "{mode}: few RAM hits");
    }
}

/// A backing device whose writes panic while `armed`.
struct Panicky {
    inner: FileDev,
    armed: Arc<AtomicBool>,
}

impl BlockDev for Panicky {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            panic!("injected panic in a backing write at byte {offset}");
        }
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// Once the volume halted (a panic while it held its lock) or shut down, a line the RAM tier
/// held is not served from it: the read fails as every other request does.
#[test]
fn log_ram_tier_serves_nothing_after_a_halt_or_a_shutdown() {
    let f = log_files(Mode::WriteThrough);
    let armed = Arc::new(AtomicBool::new(false));
    let dev = Panicky {
        inner: FileDev::open(&f.backing).unwrap(),
        armed: Arc::clone(&armed),
    };
    let vol = open_log(&f, Box::new(dev), 8);
    let mut buf = vec![0u8; LS as usize];
    vol.read(0, &mut buf).unwrap();
    vol.read(0, &mut buf).unwrap();
    assert_eq!(ram_hits(&vol), 1, "line 0 is in RAM");
    // A write-through write reaches the backing device under the lock: it panics there.
    armed.store(true, Ordering::SeqCst);
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| vol.write(LS, &buf, false)));
    assert!(r.is_err(), "the write did not panic");
    armed.store(false, Ordering::SeqCst);
    let e = vol
        .read(0, &mut buf)
        .expect_err("a halted volume served a read from RAM");
    assert!(e.to_string().contains("panic"), "{e}");

    let f = log_files(Mode::WriteBack);
    let vol = open_log(&f, backing(&f), 8);
    vol.read(0, &mut buf).unwrap();
    vol.read(0, &mut buf).unwrap();
    assert_eq!(ram_hits(&vol), 1, "line 0 is in RAM");
    vol.shutdown().unwrap();
    vol.read(0, &mut buf)
        .expect_err("a shut-down volume served a read from RAM");
}
