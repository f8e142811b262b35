//! Issue 20, "no write waits for a whole cleaning pass": against a backing device whose every
//! write takes a long time (a seek-bound HDD, coarsely),
//! * a write to a line whose group of an unlocked cleaning pass has not begun takes that
//!   group out of the pass (no wait) and the pass goes on with its other groups; a write to
//!   the line whose group is being written waits for that one backing write only;
//! * inline cleaning (`--cleaner inline`) runs its write-backs after the request released
//!   the volume lock: a cache hit from another client does not wait for them;
//! * a trim of a line being cleaned waits as a write does: not at all when its group has
//!   not begun (the group is taken out, the trimmed data is not written back), for that one
//!   backing write when it runs.

mod common;

use common::*;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::{BlockDev, CacheVolume, FileDev, OpenOptions};

const LINE: u64 = 4096;

/// A backing file whose every write takes `delay`; counts the writes begun and logs the
/// offset of each write that completed.
struct Slow {
    inner: FileDev,
    delay: Duration,
    begun: Arc<AtomicU64>,
    done: Arc<Mutex<Vec<u64>>>,
}

impl BlockDev for Slow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.begun.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        let r = self.inner.write_at(data, offset);
        self.done.lock().unwrap().push(offset);
        r
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

struct Rig {
    vol: Arc<CacheVolume>,
    begun: Arc<AtomicU64>,
    done: Arc<Mutex<Vec<u64>>>,
    f: Files,
}

fn open_slow(lines: u64, delay: Duration) -> Rig {
    let f = files(lines, LINE);
    format(&f, Mode::WriteBack, LINE);
    let begun = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Mutex::new(Vec::new()));
    let vol = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(Slow {
            inner: FileDev::open(&f.backing).unwrap(),
            delay,
            begun: begun.clone(),
            done: done.clone(),
        }),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    // One backing write per run of dirty lines (no chunk rewrite merging scattered lines).
    vol.set_chunk_rewrite(0, 0).unwrap();
    Rig {
        vol: Arc::new(vol),
        begun,
        done,
        f,
    }
}

fn wait_for_writes(begun: &AtomicU64, n: u64) {
    let t = Instant::now();
    while begun.load(Ordering::SeqCst) < n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no backing write began"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_write_to_a_line_being_cleaned_waits_only_for_that_lines_write_back() {
    const DELAY: Duration = Duration::from_millis(300);
    let rig = open_slow(64, DELAY);
    let v = &rig.vol;
    // Four dirty lines, none adjacent: four groups of one backing write each, in LBA order.
    for l in [0u64, 2, 4, 6] {
        v.write(l * LINE, &vec![0x10 + l as u8; LINE as usize], false)
            .unwrap();
    }
    // `ctl flush`: its first pass (4 lines) writes back outside the volume lock.
    let flusher = {
        let v = v.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            v.flush_dirty().unwrap();
            t.elapsed()
        })
    };
    wait_for_writes(&rig.begun, 1);
    // Line 6's group has not begun: taken out of the pass, no wait.
    let t = Instant::now();
    v.write(6 * LINE, &vec![0x66; LINE as usize], false)
        .unwrap();
    let later = t.elapsed();
    // Line 0's group is being written: waits for that backing write, not for lines 2 and 4.
    let t = Instant::now();
    v.write(0, &vec![0x60; LINE as usize], false).unwrap();
    let current = t.elapsed();
    // A line the pass does not touch.
    let t = Instant::now();
    v.write(10 * LINE, &vec![0x6a; LINE as usize], false)
        .unwrap();
    let unrelated = t.elapsed();
    let at_current = rig.done.lock().unwrap().clone();
    let flush = flusher.join().unwrap();
    let st = v.stats();
    let order = rig.done.lock().unwrap().clone();
    eprintln!(
        "backing writes {DELAY:?} each; write to a line of a later group {later:?}, to the \
         line being written back {current:?}, to another line {unrelated:?}; flush {flush:?}; \
         backing writes done when the second write returned {at_current:?}, in all {order:?}; \
         waits {}, passes cut short {}",
        st.writeback_waits, st.writeback_yields
    );
    assert!(
        later < DELAY / 2,
        "a write to a line of a group not yet begun waited {later:?} (a backing write takes {DELAY:?})"
    );
    assert!(
        unrelated < DELAY / 2,
        "a write to a line the pass does not touch waited {unrelated:?}"
    );
    assert!(
        current < DELAY * 2,
        "a write to the line being written back waited {current:?}: more than its own write-back"
    );
    assert_eq!(
        at_current.len(),
        1,
        "the write to the line being written back returned after {at_current:?} were written: \
         it waited for more than its own group"
    );
    assert_eq!(
        st.writeback_yields, 0,
        "the pass was cut short for a write: the other lines waited for a later pass"
    );
    assert_eq!(
        st.writeback_waits, 1,
        "only the write to the line being written back waits"
    );
    // The first pass wrote 0 (old bytes), 2 and 4 without a break; 0, 6 and 10 come later,
    // with their new bytes.
    assert_eq!(&order[..3], &[0, 2 * LINE, 4 * LINE], "{order:?}");
    assert_eq!(st.dirty_lines, 0);
    let backing = std::fs::read(&rig.f.backing).unwrap();
    for (l, b) in [(0u64, 0x60u8), (2, 0x12), (4, 0x14), (6, 0x66), (10, 0x6a)] {
        let at = (l * LINE) as usize;
        assert!(
            backing[at..at + LINE as usize].iter().all(|&x| x == b),
            "after the flush the backing device does not hold line {l}'s newest bytes {b:#x}"
        );
        let mut buf = vec![0u8; LINE as usize];
        v.read(l * LINE, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == b), "line {l} reads other bytes");
    }
}

#[test]
fn inline_cleaning_writes_back_after_the_request_released_the_lock() {
    const DELAY: Duration = Duration::from_millis(400);
    let rig = open_slow(64, DELAY);
    let v = &rig.vol;
    v.set_inline_cleaning(true);
    v.set_setting("dirty-low", "0.05").unwrap();
    v.set_setting("dirty-high", "0.1").unwrap();
    // A clean cached line (a read miss populates it).
    let mut buf = vec![0u8; LINE as usize];
    v.read(40 * LINE, &mut buf).unwrap();
    // Adjacent dirty lines (one merged backing write) until one write crosses the high
    // watermark (6.4 lines) and cleans inline.
    let writer = {
        let v = v.clone();
        std::thread::spawn(move || {
            let mut took = Vec::new();
            for l in 0..8u64 {
                let t = Instant::now();
                v.write(l * LINE, &vec![0x20 + l as u8; LINE as usize], false)
                    .unwrap();
                took.push(t.elapsed());
            }
            took
        })
    };
    wait_for_writes(&rig.begun, 1);
    let t = Instant::now();
    v.read(40 * LINE, &mut buf).unwrap();
    let hit = t.elapsed();
    let took = writer.join().unwrap();
    let st = v.stats();
    eprintln!(
        "backing writes {DELAY:?} each; a cache hit during inline cleaning took {hit:?}; the \
         writes took {took:?}; write-backs {}, outside the lock {}",
        st.totals.write_backs, st.unlocked_writebacks
    );
    assert!(
        buf.iter()
            .enumerate()
            .all(|(i, &b)| b == initial(40 * LINE + i as u64)),
        "line 40 reads other bytes"
    );
    assert!(
        took.iter().any(|&t| t >= DELAY),
        "no write cleaned inline: {took:?}"
    );
    assert!(
        hit < DELAY / 2,
        "a cache hit waited {hit:?} for inline cleaning (a backing write takes {DELAY:?})"
    );
    assert!(st.unlocked_writebacks >= 1);
}

#[test]
fn a_trim_of_a_line_being_cleaned_waits_only_for_that_lines_write_back() {
    const DELAY: Duration = Duration::from_millis(300);
    let rig = open_slow(64, DELAY);
    let v = &rig.vol;
    // Four dirty lines, none adjacent: four groups of one backing write each, in LBA order.
    for l in [0u64, 2, 4, 6] {
        v.write(l * LINE, &vec![0x10 + l as u8; LINE as usize], false)
            .unwrap();
    }
    let flusher = {
        let v = v.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            v.flush_dirty().unwrap();
            t.elapsed()
        })
    };
    wait_for_writes(&rig.begun, 1);
    // Line 6's group has not begun: the whole line trimmed, no wait, its data never written.
    let t = Instant::now();
    v.trim(6 * LINE, LINE).unwrap();
    let whole = t.elapsed();
    // Line 4's group has not begun: its first 512 bytes trimmed, no wait; the rest stays
    // dirty and a later pass writes it back.
    let t = Instant::now();
    v.trim(4 * LINE, 512).unwrap();
    let part = t.elapsed();
    // Line 0's group is being written: waits for that backing write, not for line 2's.
    let t = Instant::now();
    v.trim(0, LINE).unwrap();
    let current = t.elapsed();
    // A trim of a line the pass does not touch.
    let t = Instant::now();
    v.trim(12 * LINE, LINE).unwrap();
    let unrelated = t.elapsed();
    let at_current = rig.done.lock().unwrap().clone();
    let flush = flusher.join().unwrap();
    let st = v.stats();
    let order = rig.done.lock().unwrap().clone();
    eprintln!(
        "backing writes {DELAY:?} each; trim of a line of a later group {whole:?}, of part \
         of one {part:?}, of the line being written back {current:?}, of another line \
         {unrelated:?}; flush {flush:?}; backing writes done when the third trim returned \
         {at_current:?}, in all {order:?}; waits {}, passes cut short {}",
        st.writeback_waits, st.writeback_yields
    );
    for (what, t) in [
        ("whole", whole),
        ("part of a", part),
        ("unrelated", unrelated),
    ] {
        assert!(
            t < DELAY / 2,
            "a trim of {what} line whose group had not begun waited {t:?} (a backing write \
             takes {DELAY:?})"
        );
    }
    assert!(
        current < DELAY * 2,
        "a trim of the line being written back waited {current:?}: more than its own write-back"
    );
    assert_eq!(
        at_current.len(),
        1,
        "the trim of the line being written back returned after {at_current:?} were written: \
         it waited for more than its own group"
    );
    assert_eq!(
        st.writeback_yields, 0,
        "the pass was cut short for a trim: the other lines waited for a later pass"
    );
    assert_eq!(
        st.writeback_waits, 1,
        "only the trim of the line being written waits"
    );
    // Line 0 (written before its trim), line 2, then line 4's rest in a later pass; line 6
    // was trimmed before its write-back and is never written.
    assert_eq!(
        order.len(),
        3,
        "backing writes {order:?}: line 6 written after its trim?"
    );
    assert_eq!(&order[..2], &[0, 2 * LINE], "backing writes in order");
    assert!(
        (4 * LINE..5 * LINE).contains(&order[2]),
        "the third backing write {order:?} is not line 4's rest"
    );
    assert_eq!(st.dirty_lines, 0);
    let backing = std::fs::read(&rig.f.backing).unwrap();
    let at = |l: u64| (l * LINE) as usize;
    assert!(
        backing[at(2)..at(3)].iter().all(|&x| x == 0x12),
        "line 2 not written back"
    );
    assert!(
        backing[at(4) + 512..at(5)].iter().all(|&x| x == 0x14),
        "line 4's untrimmed bytes not written back"
    );
    let mut buf = vec![0u8; LINE as usize];
    v.read(2 * LINE, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0x12), "line 2 reads other bytes");
    v.read(4 * LINE, &mut buf).unwrap();
    assert!(
        buf[512..].iter().all(|&x| x == 0x14),
        "line 4's untrimmed bytes read other bytes"
    );
    // Trimmed ranges read (their contents are undefined, not an error).
    for l in [0u64, 6, 12] {
        v.read(l * LINE, &mut buf).unwrap();
    }
}
