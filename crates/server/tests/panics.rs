//! A panic inside an unlocked cleaning pass's device I/O (a device driver bug, an assertion
//! in a backing implementation) must not wedge the volume: requests that need that pass
//! committed must not hang, the lines it was writing back stay dirty (nothing acknowledged
//! is lost), and the background cleaner goes on once the device behaves again.
//!
//! Before the fix, the pass's `running` flag stayed set and no outcome was posted: the next
//! write to one of its lines waited forever in `reap`, and the cleaner thread was gone.

mod common;

use common::*;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{BlockDev, CacheVolume, FileDev, OpenOptions};

const LINE: u64 = 4096;
const LINES: u64 = 32;

/// A backing device whose writes panic while `armed` (counted in `panics`).
struct Panicky {
    inner: FileDev,
    armed: Arc<AtomicBool>,
    panics: Arc<AtomicU64>,
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
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("injected panic in a backing write at byte {offset}");
        }
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

fn line_data(line: u64, version: u8) -> Vec<u8> {
    (0..LINE)
        .map(|i| (i as u8) ^ (line as u8).wrapping_mul(31) ^ version.wrapping_mul(7) | 1)
        .collect()
}

struct Setup {
    _f: Files,
    vol: Arc<CacheVolume>,
    armed: Arc<AtomicBool>,
    panics: Arc<AtomicU64>,
}

fn setup() -> Setup {
    let f = files(LINES * 2, LINE);
    format(&f, Mode::WriteBack, LINE);
    let armed = Arc::new(AtomicBool::new(false));
    let panics = Arc::new(AtomicU64::new(0));
    let vol = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(Panicky {
            inner: FileDev::open(&f.backing).unwrap(),
            armed: armed.clone(),
            panics: panics.clone(),
        }),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    let vol = Arc::new(vol);
    for l in 0..LINES {
        vol.write(l * LINE, &line_data(l, 1), false).unwrap();
    }
    assert_eq!(
        vol.stats().dirty_lines,
        LINES,
        "every line written is dirty"
    );
    Setup {
        _f: f,
        vol,
        armed,
        panics,
    }
}

/// Runs `f` on a thread and waits at most `secs` for it: `None` if it did not return.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// Every line reads back its newest version, and once flushed the backing file holds it.
fn assert_all(vol: &CacheVolume, version: impl Fn(u64) -> u8, what: &str) {
    for l in 0..LINES {
        let mut buf = vec![0u8; LINE as usize];
        vol.read(l * LINE, &mut buf).unwrap();
        assert!(
            buf == line_data(l, version(l)),
            "{what}: line {l} (byte {}) does not read back version {}",
            l * LINE,
            version(l)
        );
    }
}

#[test]
fn a_panic_in_a_flush_pass_fails_the_pass_and_leaves_its_lines_dirty() {
    let s = setup();
    s.armed.store(true, Ordering::SeqCst);
    let vol = s.vol.clone();
    let flushed = within(20, move || {
        std::thread::spawn(move || vol.flush_dirty())
            .join()
            .is_err()
    });
    assert_eq!(
        flushed,
        Some(true),
        "ctl flush over a panicking backing device must end (its thread panics)"
    );
    assert!(s.panics.load(Ordering::SeqCst) >= 1, "the device panicked");
    // A write to a line of the pass must commit it (reap), not wait forever.
    let vol = s.vol.clone();
    let wrote = within(10, move || vol.write(0, &line_data(0, 2), false).is_ok());
    assert_eq!(
        wrote,
        Some(true),
        "a write to a line of a cleaning pass whose I/O panicked hung or failed"
    );
    assert_all(&s.vol, |l| if l == 0 { 2 } else { 1 }, "after the panic");
    assert!(
        s.vol.stats().dirty_lines >= LINES - 1,
        "the lines of the panicked pass stay dirty: {} of {LINES} dirty",
        s.vol.stats().dirty_lines
    );
    // The device behaves again: a flush writes everything back.
    s.armed.store(false, Ordering::SeqCst);
    let vol = s.vol.clone();
    let r = within(20, move || vol.flush_dirty().map_err(|e| e.to_string()));
    assert_eq!(r, Some(Ok(())), "ctl flush after the device healed");
    assert_eq!(s.vol.stats().dirty_lines, 0);
    assert_all(&s.vol, |l| if l == 0 { 2 } else { 1 }, "after the flush");
}

#[test]
fn the_cleaner_survives_a_panic_in_its_pass() {
    let s = setup();
    s.vol.set_setting("dirty-low", "0").unwrap();
    s.vol.set_setting("dirty-high", "0.1").unwrap();
    s.armed.store(true, Ordering::SeqCst);
    let cleaner = s.vol.start_cleaner();
    let t = Instant::now();
    while s.panics.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the cleaner never wrote back"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Reads and writes go on (hits and a rewrite of a line of the pass).
    let vol = s.vol.clone();
    let wrote = within(10, move || vol.write(LINE, &line_data(1, 3), false).is_ok());
    assert_eq!(
        wrote,
        Some(true),
        "a write hung after the cleaner's pass panicked"
    );
    s.armed.store(false, Ordering::SeqCst);
    let t = Instant::now();
    while s.vol.stats().dirty_lines > 0 {
        assert!(
            !cleaner.is_finished(),
            "the cleaner thread died with the panic in its pass"
        );
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the cleaner did not clean after the device healed: {} dirty lines",
            s.vol.stats().dirty_lines
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_all(&s.vol, |l| if l == 1 { 3 } else { 1 }, "after cleaning");
    let st = s.vol.stats();
    assert!(
        st.cleaner_panics >= 1 && st.cleaner_panics <= s.panics.load(Ordering::SeqCst),
        "cleaner_panics {} for {} injected panics",
        st.cleaner_panics,
        s.panics.load(Ordering::SeqCst)
    );
    let prom = s.vol.metrics().prometheus(&st);
    assert!(
        prom.contains(&format!(
            "tiercache_cleaner_panics_total {}",
            st.cleaner_panics
        )),
        "Prometheus shows the cleaner's panics"
    );
    s.vol.shutdown().unwrap();
    cleaner.join().unwrap();
}

/// A panic while the volume lock is held (here: the backing write of a write-through write
/// to a line new in the cache, after the engine gave it a slot) leaves the in-memory state
/// half-applied: the line maps to a slot whose bytes are another line's. Serving on from that
/// state would return them. The volume must stop instead (every request fails, nothing
/// served from that state, not marked cleanly shut down) and a restart recovers from the
/// device. Before the fix the read of the new line returned the evicted line's bytes.
#[test]
fn a_panic_under_the_volume_lock_halts_the_volume_until_a_restart() {
    let f = files(8, LINE);
    format(&f, Mode::WriteThrough, LINE);
    let armed = Arc::new(AtomicBool::new(false));
    let panics = Arc::new(AtomicU64::new(0));
    let vol = Arc::new(
        CacheVolume::open(
            Box::new(FileDev::open(&f.cache).unwrap()),
            Box::new(Panicky {
                inner: FileDev::open(&f.backing).unwrap(),
                armed: armed.clone(),
                panics: panics.clone(),
            }),
            &OpenOptions::default(),
        )
        .unwrap()
        .0,
    );
    // Every slot holds a line written through (cached, clean).
    for l in 0..8 {
        vol.write(l * LINE, &line_data(l, 1), false).unwrap();
    }
    armed.store(true, Ordering::SeqCst);
    let new_line = 20;
    let v = vol.clone();
    let panicked =
        std::thread::spawn(move || v.write(new_line * LINE, &line_data(new_line, 2), false))
            .join()
            .is_err();
    assert!(
        panicked,
        "the backing write panicked in the client's thread"
    );
    armed.store(false, Ordering::SeqCst);
    // Nothing may be served from the half-applied state.
    let initial_of = |l: u64| -> Vec<u8> { (l * LINE..(l + 1) * LINE).map(initial).collect() };
    let mut buf = vec![0u8; LINE as usize];
    match vol.read(new_line * LINE, &mut buf) {
        Err(e) => assert!(
            e.to_string().contains("panic"),
            "the read fails naming the panic: {e}"
        ),
        Ok(()) => assert!(
            buf == initial_of(new_line) || buf == line_data(new_line, 2),
            "line {new_line} read back bytes that were never written there (first 8: {:?}; \
             another line's: {})",
            &buf[..8],
            (0..8).any(|l| buf == line_data(l, 1))
        ),
    }
    assert!(
        vol.read(0, &mut buf).is_err(),
        "a halted volume serves no read"
    );
    assert!(
        vol.write(0, &line_data(0, 3), false).is_err(),
        "a halted volume takes no write"
    );
    assert!(
        vol.flush().is_err(),
        "a halted volume acknowledges no flush"
    );
    assert!(vol.stats().halted, "ctl stats shows the halt");
    let e = vol
        .shutdown()
        .expect_err("a halted volume does not shut down cleanly");
    assert!(e.to_string().contains("restart"), "{e}");
    drop(vol);
    // A restart recovers from the device: the write-through lines are on the backing
    // device, the unacknowledged write is not anywhere.
    let (vol, _) = open(&f, None);
    for l in 0..8 {
        vol.read(l * LINE, &mut buf).unwrap();
        assert!(buf == line_data(l, 1), "line {l} after the restart");
    }
    vol.read(new_line * LINE, &mut buf).unwrap();
    assert!(
        buf == initial_of(new_line) || buf == line_data(new_line, 2),
        "line {new_line} after the restart"
    );
    assert!(!vol.stats().halted);
}

/// The log layout halts the same way: a panic in its cache-device write under the lock (at a
/// FLUSH that seals the open segment) stops the volume; a restart recovers every line
/// acknowledged by the FLUSH before it.
#[test]
fn a_panic_under_the_log_volume_lock_halts_it_until_a_restart() {
    use tiercache_server::{format_log, LogFormatOptions, LogVolume};
    let seg = 64 * LINE;
    let f = log_cache_files(16, seg);
    format_log(
        &FileDev::open(&f.cache).unwrap(),
        VOL,
        &LogFormatOptions {
            line_size: LINE,
            segment_size: seg,
            compression: tiercache_engine::log::Compression::None,
            dedup_ratio: 0.0,
            picker: "lru".into(),
            mode: Mode::WriteBack,
            journal_records: Some(400),
        },
    )
    .unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let panics = Arc::new(AtomicU64::new(0));
    let vol = Arc::new(
        LogVolume::open(
            Box::new(Panicky {
                inner: FileDev::open(&f.cache).unwrap(),
                armed: armed.clone(),
                panics: panics.clone(),
            }),
            Box::new(FileDev::open(&f.backing).unwrap()),
        )
        .unwrap()
        .0,
    );
    for l in 0..8 {
        vol.write(l * LINE, &line_data(l, 1), false).unwrap();
    }
    vol.flush().unwrap();
    for l in 8..16 {
        vol.write(l * LINE, &line_data(l, 2), false).unwrap();
    }
    armed.store(true, Ordering::SeqCst);
    let v = vol.clone();
    let panicked = std::thread::spawn(move || v.flush()).join().is_err();
    assert!(panicked, "the cache write of the FLUSH panicked");
    assert!(panics.load(Ordering::SeqCst) >= 1);
    armed.store(false, Ordering::SeqCst);
    let mut buf = vec![0u8; LINE as usize];
    let e = vol
        .read(0, &mut buf)
        .expect_err("a halted log volume serves no read");
    assert!(e.to_string().contains("restart"), "{e}");
    assert!(vol.write(0, &line_data(0, 3), false).is_err());
    assert!(
        vol.flush().is_err(),
        "a halted log volume acknowledges no flush"
    );
    assert!(vol.stats().halted, "stats show the halt");
    vol.shutdown()
        .expect_err("a halted log volume does not shut down cleanly");
    drop(vol);
    let (vol, rep) = LogVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
    )
    .unwrap();
    assert!(!rep.was_clean, "recovered as after a crash: {rep:?}");
    for l in 0..8 {
        vol.read(l * LINE, &mut buf).unwrap();
        assert!(
            buf == line_data(l, 1),
            "line {l}, acknowledged by a FLUSH, after the restart"
        );
    }
    assert!(!vol.stats().halted);
}

/// `ctl flush` whose cleaning pass panics gets an error reply naming the panic (before: the
/// control connection closed without a reply), and the control socket goes on answering.
#[test]
fn a_control_command_that_panics_gets_a_reply() {
    use tiercache_server::control::{request, serve_control, Command};
    let s = setup();
    let dir = tmp();
    let sock = dir.path().join("ctl.sock");
    serve_control(&sock, s.vol.clone()).unwrap();
    s.armed.store(true, Ordering::SeqCst);
    let e = request(&sock, &Command::Flush).expect_err("a flush whose pass panicked fails");
    assert!(e.contains("panicked"), "the reply names the panic: {e}");
    s.armed.store(false, Ordering::SeqCst);
    request(&sock, &Command::Flush).expect("the next flush, with the device healed");
    assert_eq!(s.vol.stats().dirty_lines, 0);
}

/// With a RAM tier, a halted volume serves nothing from RAM either (a RAM hit takes no volume
/// lock, so it would bypass the halt), and a shut-down one neither. Before: the hot line kept
/// reading back from RAM after the halt.
#[test]
fn a_halted_or_shut_down_volume_serves_nothing_from_its_ram_tier() {
    let f = files(8, LINE);
    format(&f, Mode::WriteThrough, LINE);
    let armed = Arc::new(AtomicBool::new(false));
    let open_it = |armed: &Arc<AtomicBool>| {
        Arc::new(
            CacheVolume::open(
                Box::new(FileDev::open(&f.cache).unwrap()),
                Box::new(Panicky {
                    inner: FileDev::open(&f.backing).unwrap(),
                    armed: armed.clone(),
                    panics: Arc::new(AtomicU64::new(0)),
                }),
                &OpenOptions {
                    ram_cache: 4 * LINE,
                    ..Default::default()
                },
            )
            .unwrap()
            .0,
        )
    };
    let vol = open_it(&armed);
    vol.write(0, &line_data(0, 1), false).unwrap();
    let mut buf = vec![0u8; LINE as usize];
    for _ in 0..3 {
        vol.read(0, &mut buf).unwrap();
    }
    let ram = vol.stats().ram.expect("a RAM tier");
    assert!(ram.ram_hits >= 1, "line 0 is served from RAM: {ram:?}");
    armed.store(true, Ordering::SeqCst);
    let v = vol.clone();
    assert!(
        std::thread::spawn(move || v.write(20 * LINE, &line_data(20, 2), false))
            .join()
            .is_err()
    );
    armed.store(false, Ordering::SeqCst);
    let e = vol
        .read(0, &mut buf)
        .expect_err("a halted volume serves nothing, from RAM neither");
    assert!(e.to_string().contains("panic"), "{e}");
    drop(vol);
    // A clean shutdown: reads after it fail too, RAM hits included.
    let vol = open_it(&armed);
    for _ in 0..3 {
        vol.read(0, &mut buf).unwrap();
    }
    vol.shutdown().unwrap();
    assert!(
        vol.read(0, &mut buf).is_err(),
        "a shut-down volume served a RAM hit"
    );
}
