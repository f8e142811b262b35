//! `ctl flush` (issue 20) against a slow backing device: a foreground read of a cached line
//! does not wait for the whole flush, and a line rewritten while the flush runs keeps the
//! client's newest bytes (after the flush, a restart and a read).

mod common;

use common::*;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{BlockDev, CacheVolume, FileDev, OpenOptions};

/// A backing file whose every write takes `delay` (a seek-bound HDD, coarsely).
struct Slow {
    inner: FileDev,
    delay: Duration,
}

impl BlockDev for Slow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

const LINE: u64 = 4096;

fn open_slow(f: &Files, delay_ms: u64) -> CacheVolume {
    let vol = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(Slow {
            inner: FileDev::open(&f.backing).unwrap(),
            delay: Duration::from_millis(delay_ms),
        }),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    // One backing write per dirty line (a chunk rewrite would merge the scattered lines).
    vol.set_chunk_rewrite(0, 0).unwrap();
    vol
}

/// Dirties every other line (no two adjacent: one backing write each, none merged).
fn dirty_every_other_line(vol: &CacheVolume, fill: u8) -> u64 {
    let mut n = 0;
    for l in (0..VOL / LINE).step_by(2) {
        vol.write(l * LINE, &vec![fill; LINE as usize], false)
            .unwrap();
        n += 1;
    }
    n
}

#[test]
fn a_cached_read_completes_while_a_long_flush_runs() {
    let f = files(200, LINE);
    format(&f, Mode::WriteBack, LINE);
    // 128 dirty lines, 5 ms per backing write: the flush takes >= 640 ms.
    let vol = Arc::new(open_slow(&f, 5));
    let n = dirty_every_other_line(&vol, 0xab);
    assert_eq!(vol.stats().dirty_lines, n);
    let done = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let flusher = {
        let (vol, done) = (vol.clone(), done.clone());
        std::thread::spawn(move || {
            vol.flush_dirty().unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(60));
    let mut worst = Duration::ZERO;
    let mut reads = 0;
    // Reads of cached lines (dirty ones and ones already written back) until the flush ends.
    while !done.load(Ordering::SeqCst) && reads < 20 {
        let l = ((reads * 14) % (VOL / LINE)) & !1;
        let mut buf = vec![0u8; LINE as usize];
        let r0 = Instant::now();
        vol.read(l * LINE, &mut buf).unwrap();
        let took = r0.elapsed();
        assert!(buf.iter().all(|&b| b == 0xab), "line {l} read other bytes");
        worst = worst.max(took);
        reads += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let finished_during = !done.load(Ordering::SeqCst);
    flusher.join().unwrap();
    let flush = t0.elapsed();
    eprintln!("flush of {n} lines took {flush:?}; {reads} reads during it, the slowest {worst:?}");
    assert!(
        flush >= Duration::from_millis(600),
        "the flush was not slow: {flush:?}"
    );
    assert!(
        finished_during && reads >= 5,
        "the reads did not complete while the flush ran: {reads} reads, flush {flush:?}, \
         slowest read {worst:?}"
    );
    assert!(
        worst < flush / 5,
        "a cached read waited {worst:?} behind a flush of {flush:?}"
    );
    assert_eq!(vol.stats().dirty_lines, 0);
}

#[test]
fn lines_rewritten_during_a_flush_keep_the_new_bytes_after_restart() {
    let f = files(200, LINE);
    format(&f, Mode::WriteBack, LINE);
    {
        let vol = Arc::new(open_slow(&f, 3));
        dirty_every_other_line(&vol, 0x11);
        let flusher = {
            let vol = vol.clone();
            std::thread::spawn(move || vol.flush_dirty().unwrap())
        };
        // Rewrite the dirty lines (new bytes) in the reverse of the flush's LBA order, so
        // some are rewritten before their write-back and some after, while it runs.
        std::thread::sleep(Duration::from_millis(20));
        for l in (0..VOL / LINE).rev().filter(|l| l % 2 == 0) {
            vol.write(l * LINE, &vec![0x22; LINE as usize], false)
                .unwrap();
        }
        flusher.join().unwrap();
        // The rewrites acknowledged; make them durable (they may still be dirty in the cache).
        vol.flush().unwrap();
        vol.shutdown().unwrap();
    }
    let (vol, _) = open(&f, None);
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    for l in 0..VOL / LINE {
        let got = &buf[(l * LINE) as usize..((l + 1) * LINE) as usize];
        if l % 2 == 0 {
            let bad = got.iter().position(|&b| b != 0x22);
            assert_eq!(bad, None, "line {l}: not the rewritten bytes after restart");
        } else {
            let want: Vec<u8> = (l * LINE..(l + 1) * LINE).map(initial).collect();
            assert!(got == want.as_slice(), "line {l}: untouched line changed");
        }
    }
    // And with every line written back, the backing device holds them too.
    vol.flush_dirty().unwrap();
    let on_backing = std::fs::read(&f.backing).unwrap();
    for l in (0..VOL / LINE).step_by(2) {
        let got = &on_backing[(l * LINE) as usize..((l + 1) * LINE) as usize];
        assert!(
            got.iter().all(|&b| b == 0x22),
            "line {l}: old bytes on backing"
        );
    }
}
