//! Read misses in flight on a slow backing device (issue 16/20, plan-unlocked-io step 6):
//! a miss is held inside its backing read (before its cache write) while other requests
//! target the same line, the lines that may be its victim, and unrelated cached lines.
//!
//! * `a_miss_in_flight_shows_only_versions_written_there`: whatever order the volume gives
//!   them, every read returns a version written to that very sector (or the backing device's
//!   initial bytes), never another line's bytes — the victim's old key is never served the
//!   filling line's bytes, nor the filling line its victim's.
//! * `a_hit_completes_while_a_miss_waits_for_the_backing_device`: proves the miss holds no
//!   lock a hit on another line needs (failed while a miss ran its device steps under the
//!   volume lock, before `volume/fill.rs`).

mod common;

use common::*;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{BlockDev, CacheVolume, FileDev, OpenOptions};

const LINE: u64 = 4096;
const SECTOR: u64 = 512;
const SECTORS: u64 = LINE / SECTOR;

/// Backing reads meeting the held byte range block until it is released; `entered` counts
/// reads that reached the hold.
#[derive(Default)]
struct Hold {
    state: Mutex<Option<std::ops::Range<u64>>>,
    cv: Condvar,
    entered: AtomicU64,
    /// Reads meeting `failing` that fail (counted down), as a backing device's EIO.
    fail: AtomicU64,
    failing: Mutex<Option<std::ops::Range<u64>>>,
    /// Reads meeting `failing` panic instead (a device bug), while set.
    panic: std::sync::atomic::AtomicBool,
}

impl Hold {
    fn arm(&self, r: std::ops::Range<u64>) {
        *self.state.lock().unwrap() = Some(r);
    }
    fn release(&self) {
        *self.state.lock().unwrap() = None;
        self.cv.notify_all();
    }
    /// Waits (bounded) until `n` reads in total have reached the hold.
    fn wait_entered(&self, n: u64) {
        for _ in 0..2000 {
            if self.entered.load(Ordering::Acquire) >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no backing read reached the hold: the miss did not read the backing device");
    }
}

struct Held {
    inner: FileDev,
    hold: Arc<Hold>,
}

impl BlockDev for Held {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut st = self.hold.state.lock().unwrap();
        if st
            .as_ref()
            .is_some_and(|r| offset < r.end && offset + buf.len() as u64 > r.start)
        {
            self.hold.entered.fetch_add(1, Ordering::AcqRel);
            while st.is_some() {
                st = self.hold.cv.wait(st).unwrap();
            }
        }
        drop(st);
        let failing = self
            .hold
            .failing
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|r| offset < r.end && offset + buf.len() as u64 > r.start);
        if failing && self.hold.panic.swap(false, Ordering::AcqRel) {
            panic!("injected panic in a backing read");
        }
        if failing
            && self
                .hold
                .fail
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(io::Error::other("injected backing read error"));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

fn open_held(f: &Files, hold: &Arc<Hold>) -> CacheVolume {
    open_held_on(Box::new(FileDev::open(&f.cache).unwrap()), f, hold)
}

fn open_held_on(cache: Box<dyn BlockDev>, f: &Files, hold: &Arc<Hold>) -> CacheVolume {
    CacheVolume::open(
        cache,
        Box::new(Held {
            inner: FileDev::open(&f.backing).unwrap(),
            hold: hold.clone(),
        }),
        &OpenOptions::default(),
    )
    .unwrap()
    .0
}

/// A read of `line` on its own thread (the bytes it returns).
fn spawn_read(vol: &Arc<CacheVolume>, line: u64) -> std::thread::JoinHandle<io::Result<Vec<u8>>> {
    let vol = vol.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; LINE as usize];
        vol.read(line * LINE, &mut buf).map(|()| buf)
    })
}

/// The bytes of `sector` of `line` at `version` (0: the backing device's initial bytes).
/// Every version names its line and sector, so misdirected bytes are caught.
fn versioned(line: u64, sector: u64, version: u32) -> Vec<u8> {
    let at = line * LINE + sector * SECTOR;
    if version == 0 {
        return (at..at + SECTOR).map(initial).collect();
    }
    let mut v = vec![0u8; SECTOR as usize];
    v[..4].copy_from_slice(b"MUv1");
    v[4..12].copy_from_slice(&at.to_le_bytes());
    v[12..16].copy_from_slice(&version.to_le_bytes());
    for (i, b) in v[16..].iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(31) as u8 ^ at as u8 ^ version as u8;
    }
    v
}

/// The version of `line`/`sector` the bytes are, if they are one of that sector's.
fn version_in(line: u64, sector: u64, got: &[u8]) -> Option<u32> {
    if &got[..4] == b"MUv1" {
        let v = u32::from_le_bytes(got[12..16].try_into().unwrap());
        return (got == versioned(line, sector, v).as_slice()).then_some(v);
    }
    (got == versioned(line, sector, 0).as_slice()).then_some(0)
}

/// Asserts every sector of the line read in `buf` is a version of that sector in `may`
/// (per sector: the versions it may hold).
fn assert_line(line: u64, buf: &[u8], may: &dyn Fn(u64, u32) -> bool, what: &str) {
    for s in 0..SECTORS {
        let got = &buf[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
        let v = version_in(line, s, got);
        assert!(
            v.is_some_and(|v| may(s, v)),
            "{what}: line {line} sector {s} read {} (first bytes {:?})",
            match v {
                Some(v) => format!("version {v}, not one it may hold"),
                None => "bytes never written to it (another line's?)".into(),
            },
            &got[..16]
        );
    }
}

#[test]
fn a_miss_in_flight_shows_only_versions_written_there() {
    // A cache of 4 lines, full of clean lines, so every miss evicts a clean victim.
    const CACHED: u64 = 4;
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        let f = files(CACHED, LINE);
        format(&f, mode, LINE);
        let hold = Arc::new(Hold::default());
        let vol = Arc::new(open_held(&f, &hold));
        let mut buf = vec![0u8; LINE as usize];
        for l in 0..CACHED {
            vol.read(l * LINE, &mut buf).unwrap();
        }
        // Per round a new line misses; its highest version written so far per sector.
        let mut newest: Vec<[u32; SECTORS as usize]> = vec![[0; SECTORS as usize]; 64];
        for round in 0..12u64 {
            let line = 8 + round * 3;
            hold.arm(line * LINE..(line + 1) * LINE);
            let before = hold.entered.load(Ordering::Acquire);
            let miss = {
                let vol = vol.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; LINE as usize];
                    vol.read(line * LINE, &mut buf).map(|()| buf)
                })
            };
            hold.wait_entered(before + 1);
            // While the miss waits: readers of every line it may evict (and of lines that
            // missed before), one client writing/trimming/reading the filling line.
            let readers: Vec<_> = (0..CACHED)
                .chain((0..round).map(|r| 8 + r * 3))
                .map(|l| {
                    let vol = vol.clone();
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; LINE as usize];
                        vol.read(l * LINE, &mut buf).unwrap();
                        (l, buf)
                    })
                })
                .collect();
            let (a, b) = (
                round % SECTORS,
                (round % SECTORS + 1 + round % 3).min(SECTORS),
            );
            let v = round as u32 + 1;
            let client = {
                let vol = vol.clone();
                std::thread::spawn(move || {
                    let mut data = Vec::new();
                    for s in a..b {
                        data.extend(versioned(line, s, v));
                    }
                    vol.write(line * LINE + a * SECTOR, &data, round % 4 == 3)
                        .unwrap();
                    let mut buf = vec![0u8; LINE as usize];
                    vol.read(line * LINE, &mut buf).unwrap();
                    let trimmed = round % 2 == 1;
                    if trimmed {
                        vol.trim(line * LINE + a * SECTOR, SECTOR).unwrap();
                    }
                    let mut after = vec![0u8; LINE as usize];
                    vol.read(line * LINE, &mut after).unwrap();
                    (buf, after, trimmed)
                })
            };
            std::thread::sleep(Duration::from_millis(30));
            hold.release();
            let got = miss.join().unwrap().unwrap();
            // The miss runs concurrently with the write: initial bytes or the new version.
            assert_line(
                line,
                &got,
                &|s, w| w == 0 || (w == v && (a..b).contains(&s)),
                &format!("{mode:?} round {round}: the miss"),
            );
            let (buf, after, trimmed) = client.join().unwrap();
            assert_line(
                line,
                &buf,
                &|s, w| if (a..b).contains(&s) { w == v } else { w == 0 },
                &format!("{mode:?} round {round}: read after the write"),
            );
            assert_line(
                line,
                &after,
                // A trimmed sector reads unspecified bytes, but never foreign ones.
                &|s, w| {
                    if trimmed && s == a {
                        w == 0 || w == v
                    } else if (a..b).contains(&s) {
                        w == v
                    } else {
                        w == 0
                    }
                },
                &format!("{mode:?} round {round}: read after the trim"),
            );
            for s in a..b {
                newest[round as usize][s as usize] = v;
            }
            for r in readers {
                let (l, buf) = r.join().unwrap();
                let n = if l >= 8 {
                    newest[((l - 8) / 3) as usize]
                } else {
                    [0; 8]
                };
                assert_line(
                    l,
                    &buf,
                    // Lines of earlier rounds: any version up to their newest (trims).
                    &|s, w| w == n[s as usize] || w == 0,
                    &format!("{mode:?} round {round}: a possible victim"),
                );
            }
        }
        // Everything durable: flushed, reopened, every line read back.
        vol.flush().unwrap();
        drop(vol);
        let vol = open_held(&f, &hold);
        for round in 0..12u64 {
            let line = 8 + round * 3;
            let mut buf = vec![0u8; LINE as usize];
            vol.read(line * LINE, &mut buf).unwrap();
            let n = newest[round as usize];
            assert_line(
                line,
                &buf,
                &|s, w| w == n[s as usize] || w == 0,
                &format!("{mode:?} after reopen"),
            );
        }
        for l in 0..CACHED {
            let mut buf = vec![0u8; LINE as usize];
            vol.read(l * LINE, &mut buf).unwrap();
            assert_line(l, &buf, &|_, w| w == 0, &format!("{mode:?} after reopen"));
        }
    }
}

#[test]
fn a_hit_completes_while_a_miss_waits_for_the_backing_device() {
    let f = files(40, LINE);
    format(&f, Mode::WriteBack, LINE);
    let hold = Arc::new(Hold::default());
    let vol = Arc::new(open_held(&f, &hold));
    let mut buf = vec![0u8; LINE as usize];
    // Line 0 cached (the second read is a hit).
    vol.read(0, &mut buf).unwrap();
    vol.read(0, &mut buf).unwrap();
    let line = 9;
    hold.arm(line * LINE..(line + 1) * LINE);
    let miss = spawn_read(&vol, line);
    hold.wait_entered(1);
    let (tx, rx) = mpsc::channel();
    let hit = {
        let vol = vol.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; LINE as usize];
            let r = vol.read(0, &mut buf).map(|()| buf);
            let _ = tx.send(());
            r
        })
    };
    let done = rx.recv_timeout(Duration::from_secs(2)).is_ok();
    // Released either way, so a failing run ends instead of hanging.
    hold.release();
    let got = miss.join().unwrap().unwrap();
    assert_line(line, &got, &|_, w| w == 0, "the miss");
    let got = hit.join().unwrap().unwrap();
    assert_line(0, &got, &|_, w| w == 0, "the hit");
    assert!(
        done,
        "a hit on line 0 waited for a miss on line {line} held in its backing read"
    );
}

/// A FLUSH while a miss fills a clean victim's slot outside the lock: the flush does not wait
/// for the miss, and must map neither the victim (whose bytes the miss overwrites) nor the
/// missing line (whose bytes are not there yet) to the slot. Killed right after the miss's
/// cache write lands, the restarted volume reads every line's own bytes.
#[test]
fn a_flush_during_a_miss_maps_neither_its_victim_nor_its_line() {
    const CACHED: u64 = 4;
    let f = files(CACHED, LINE);
    format(&f, Mode::WriteBack, LINE);
    let hold = Arc::new(Hold::default());
    let gate = Gate::new();
    let vol = Arc::new(open_held_on(gate.wrap("cache", &f.cache), &f, &hold));
    // Every slot holds a clean line whose record is in the image only (never flushed).
    let mut buf = vec![0u8; LINE as usize];
    for l in 0..CACHED {
        vol.read(l * LINE, &mut buf).unwrap();
    }
    let line = 9;
    hold.arm(line * LINE..(line + 1) * LINE);
    let miss = spawn_read(&vol, line);
    hold.wait_entered(1);
    let (tx, rx) = mpsc::channel();
    {
        let vol = vol.clone();
        std::thread::spawn(move || tx.send(vol.flush()).unwrap());
    }
    let flushed = rx.recv_timeout(Duration::from_secs(5));
    // The next cache write is the miss's data: it lands, then the process dies.
    gate.kill_at_write("cache", 0..u64::MAX, true);
    hold.release();
    let _ = miss.join().unwrap();
    assert!(
        matches!(flushed, Ok(Ok(()))),
        "the flush waited for a miss held in its backing read, or failed: {flushed:?}"
    );
    assert!(
        vol.stats().unlocked_misses >= 1,
        "the miss ran under the lock"
    );
    drop(vol);
    // Every clean line is sampled at this size: a record mapping the miss's bytes to the
    // victim would show as a clean line differing from the backing device (and be dropped).
    let (vol, report) = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(
        (report.differing_clean_lines, report.dropped_clean_lines),
        (0, 0),
        "a record mapped a slot the miss overwrote"
    );
    for l in (0..CACHED).chain([line]) {
        vol.read(l * LINE, &mut buf).unwrap();
        assert_line(l, &buf, &|_, w| w == 0, "after the kill");
    }
}

/// A miss outside the lock whose backing read fails is planned again under the lock: a
/// transient error is retried there (the client sees the bytes), a lasting one reaches the
/// client; either way no slot serves bytes the failed read never wrote.
#[test]
fn a_failed_backing_read_of_a_miss_outside_the_lock_is_planned_again() {
    let f = files(8, LINE);
    format(&f, Mode::WriteThrough, LINE);
    let hold = Arc::new(Hold::default());
    let vol = open_held(&f, &hold);
    let mut buf = vec![0u8; LINE as usize];
    *hold.failing.lock().unwrap() = Some(3 * LINE..4 * LINE);
    // Transient: the unlocked read fails once, the locked one succeeds.
    hold.fail.store(1, Ordering::Release);
    vol.read(3 * LINE, &mut buf).unwrap();
    assert_line(3, &buf, &|_, w| w == 0, "a transient error");
    assert_eq!(
        hold.fail.load(Ordering::Acquire),
        0,
        "the error was not injected"
    );
    assert!(
        vol.stats().unlocked_misses >= 1,
        "the miss ran under the lock"
    );
    vol.read(3 * LINE, &mut buf).unwrap();
    assert_line(3, &buf, &|_, w| w == 0, "the line cached after the retry");
    // Lasting: both attempts fail, the client gets the error, the line is not cached.
    *hold.failing.lock().unwrap() = Some(5 * LINE..6 * LINE);
    hold.fail.store(2, Ordering::Release);
    assert!(
        vol.read(5 * LINE, &mut buf).is_err(),
        "a lasting error was hidden"
    );
    assert_eq!(hold.fail.load(Ordering::Acquire), 0, "not planned again");
    vol.read(5 * LINE, &mut buf).unwrap();
    assert_line(5, &buf, &|_, w| w == 0, "after the lasting error");
    let bad: Vec<_> = vol.clean_lines_differing().unwrap();
    assert!(
        bad.is_empty(),
        "cached lines differ from the backing device: {bad:?}"
    );
}

/// A panic inside a miss's unlocked device I/O (a device bug) must not wedge the volume:
/// the miss's lines are dropped, and the next request on them (which waits for the miss to
/// commit) and a mode switch (which commits every miss in flight) go on.
#[test]
fn a_panic_in_a_miss_outside_the_lock_does_not_wedge_its_lines() {
    let f = files(8, LINE);
    format(&f, Mode::WriteBack, LINE);
    let hold = Arc::new(Hold::default());
    let vol = Arc::new(open_held(&f, &hold));
    *hold.failing.lock().unwrap() = Some(2 * LINE..3 * LINE);
    hold.panic.store(true, Ordering::Release);
    assert!(
        spawn_read(&vol, 2).join().is_err(),
        "the injected panic did not reach the miss"
    );
    let (tx, rx) = mpsc::channel();
    {
        let vol = vol.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; LINE as usize];
            let r = vol.read(2 * LINE, &mut buf).map(|()| buf);
            let m = vol.set_mode(Mode::WriteThrough);
            tx.send((r, m)).unwrap();
        });
    }
    let (r, m) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a read of the line, or a mode switch, hangs after the panic");
    assert_line(2, &r.unwrap(), &|_, w| w == 0, "after the panic");
    m.unwrap();
    assert!(
        vol.stats().unlocked_misses >= 1,
        "the miss ran under the lock"
    );
}
