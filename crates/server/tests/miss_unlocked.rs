//! Read misses in flight on a slow backing device (issue 16/20, plan-unlocked-io step 6):
//! a miss is held inside its backing read (before its cache write) while other requests
//! target the same line, the lines that may be its victim, and unrelated cached lines.
//!
//! * `a_miss_in_flight_shows_only_versions_written_there`: whatever order the volume gives
//!   them, every read returns a version written to that very sector (or the backing device's
//!   initial bytes), never another line's bytes — the victim's old key is never served the
//!   filling line's bytes, nor the filling line its victim's.
//!
//! Today a miss runs its device steps under the volume lock, so the other requests wait and
//! this test holds trivially; it is the guard for running them outside it (step 6), where a
//! request touching a filling line must wait before it is planned.

mod common;

use common::*;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
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
    CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(Held {
            inner: FileDev::open(&f.backing).unwrap(),
            hold: hold.clone(),
        }),
        &OpenOptions::default(),
    )
    .unwrap()
    .0
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
