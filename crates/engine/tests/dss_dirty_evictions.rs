//! DSS in write-back must not evict dirty lines in the requests' path where LRU would not
//! (issue 18): selective eviction takes the lowest-priority class first, and that class's
//! list holds the lines written last (large files being written), which the watermark
//! cleaner (LBA order, only above 80 % dirty) never reaches before they are evicted. The
//! engine cleans ahead in eviction order instead, so the victims are clean when their turn
//! comes, and DSS still keeps its high-priority lines.

use tiercache_engine::{Engine, EngineConfig, Mode, Request};

const CAP: u64 = 1024;

fn engine(policy: &str) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: CAP,
        mode: Mode::WriteBack,
        policy: policy.into(),
        ..Default::default()
    })
    .unwrap()
}

/// Drives `e` as the simulator does: one request, then the cleaning the engine asks for.
fn run(e: &mut Engine, r: &Request) {
    e.process(r).unwrap();
    if e.needs_cleaning() {
        let n = e.cleaning_target();
        e.clean(n);
    }
}

/// Metadata (class 1, the highest priority) read into 90 % of the cache, then a large file
/// (class 15, the lowest) written sequentially, 20 times the cache. Returns
/// (evictions, dirty evictions, metadata lines still cached).
fn workload(policy: &str) -> (u64, u64, u64) {
    let mut e = engine(policy);
    let meta = CAP * 9 / 10;
    for l in 0..meta {
        let mut r = Request::read(l * 4096, 4096);
        r.class = 1;
        run(&mut e, &r);
    }
    for l in 0..CAP * 20 {
        let mut r = Request::write((1 << 20) * 4096 + l * 4096, 4096);
        r.class = 15;
        run(&mut e, &r);
    }
    let c = e.counters();
    let kept = (0..meta)
        .filter(|&l| e.lookup(Engine::line_key(0, l)).is_some())
        .count() as u64;
    (c.evictions, c.dirty_evictions, kept)
}

#[test]
fn dss_evicts_clean_lines_of_the_lowest_priority_as_lru_does() {
    let (lru_ev, lru_dirty, _) = workload("lru");
    let (dss_ev, dss_dirty, dss_kept) = workload("dss");
    let share = |d: u64, e: u64| d as f64 / e.max(1) as f64;
    println!(
        "dirty evictions: lru {lru_dirty}/{lru_ev} ({:.1} %), dss {dss_dirty}/{dss_ev} ({:.1} %); \
         dss kept {dss_kept} metadata lines",
        100.0 * share(lru_dirty, lru_ev),
        100.0 * share(dss_dirty, dss_ev)
    );
    assert!(dss_ev > CAP * 15, "the workload evicts: {dss_ev}");
    assert!(
        share(dss_dirty, dss_ev) <= share(lru_dirty, lru_ev) + 0.05,
        "DSS evicts dirty lines in the requests' path: {dss_dirty} of {dss_ev} evictions \
         (LRU {lru_dirty} of {lru_ev})"
    );
    // Selective eviction is unchanged: the metadata stays cached.
    assert_eq!(dss_kept, CAP * 9 / 10, "DSS evicted metadata lines");
}

/// Issue 18, the open case: a large file (class 15, the lowest priority) written in 64 KiB
/// requests into a write-back DSS cache full of clean higher-priority lines (class 8), as
/// the file server's MacroSetup does once the cache is full. Replayed as the simulator does
/// (a request, then the cleaning the engine asks for). Returns (large-file lines written
/// around the cache, large-file lines evicted, the fewest large-file lines written between
/// the planning of an evicted line's write-back and its eviction).
fn large_file_after_a_full_cache() -> (u64, u64, u64) {
    const CAP: u64 = 64 * 1024;
    const REQ: u64 = 16;
    let mut e = Engine::new(EngineConfig {
        capacity_lines: CAP,
        mode: Mode::WriteBack,
        policy: "dss".into(),
        admission: "nhit:0:1".parse().unwrap(),
        ..Default::default()
    })
    .unwrap();
    for l in (0..CAP).step_by(REQ as usize) {
        let mut r = Request::write(l * 4096, REQ * 4096);
        r.class = 8;
        e.process(&r).unwrap();
    }
    let dirty = e.counters().insertions;
    e.clean(dirty);
    e.track_unmapped(true);
    e.drain_unmapped().for_each(drop);
    let base = 1u64 << 30;
    let mut planned = std::collections::HashMap::new();
    let mut written = 0u64;
    let (mut evicted, mut closest) = (0u64, u64::MAX);
    for l in (0..CAP / 4).step_by(REQ as usize) {
        let mut r = Request::write(base + l * 4096, REQ * 4096);
        r.class = 15;
        e.process(&r).unwrap();
        written += REQ;
        for k in e.drain_unmapped().collect::<Vec<_>>() {
            if k >= base / 4096 {
                evicted += 1;
                // A line evicted dirty had its write-back planned just now.
                closest = closest.min(written - planned.get(&k).copied().unwrap_or(written));
            }
        }
        if e.needs_cleaning() {
            let n = e.cleaning_target();
            for st in &e.clean(n).steps {
                if let tiercache_engine::Step::WriteBack { hdd, len, .. } = *st {
                    for line in hdd / 4096..(hdd + len).div_ceil(4096) {
                        planned.insert(line, written);
                    }
                }
            }
        }
    }
    (e.class_counters(15).bypasses.class, evicted, closest)
}

#[test]
fn dss_stages_a_large_file_so_its_evictions_were_cleaned_long_before() {
    let (around, evicted, closest) = large_file_after_a_full_cache();
    // The staging floor of a 64 Ki-line cache (`policy::dss::STAGING_LINES`).
    let floor = 1024;
    println!(
        "large file: {around} lines written around, {evicted} evicted, the closest eviction \
         {closest} lines after its write-back was planned (floor {floor})"
    );
    assert_eq!(
        around, 0,
        "lines of the large file were written around the cache"
    );
    assert!(
        evicted > 0,
        "the large file evicts its own lines once staged"
    );
    assert!(
        closest >= floor / 2,
        "a large-file line was evicted {closest} lines after its write-back was planned"
    );
}

/// Replays `reqs` as the live server cleans: a write-back begun when the engine asks for
/// cleaning stays in flight (its lines pinned) for `lag` requests before it completes, as
/// when the HDD is slower than the SSD. Returns (evictions, dirty evictions) of class `c`.
fn replay_with_writebacks_in_flight(
    policy: &str,
    cap: u64,
    reqs: &[Request],
    lag: usize,
    c: u8,
) -> (u64, u64) {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: cap,
        mode: Mode::WriteBack,
        policy: policy.into(),
        admission: "nhit:0:1".parse().unwrap(),
        ..Default::default()
    })
    .unwrap();
    let mut inflight: std::collections::VecDeque<(usize, tiercache_engine::WbTicket)> =
        Default::default();
    for (i, r) in reqs.iter().enumerate() {
        while inflight.front().is_some_and(|&(at, _)| at + lag <= i) {
            let (_, t) = inflight.pop_front().unwrap();
            e.complete_writeback(t, &[]);
        }
        e.process(r).unwrap();
        if e.needs_cleaning() {
            let n = e.cleaning_target().clamp(1, 256);
            if let Some(b) = e.begin_clean(n) {
                inflight.push_back((i, b.ticket));
            }
        }
    }
    let k = e.class_counters(c);
    (k.evictions, k.dirty_evictions)
}

/// Issue 18, dirty evictions on the live file server (15 % of DSS's evictions dirty, 6.5 %
/// of LRU's): a cache of clean higher-priority lines, then a large file (class 15, the
/// lowest priority) written in 64 KiB requests while write-backs are in flight. The lines
/// clean-ahead planned are pinned, so the victim DSS names is pinned; the engine then took
/// the first unpinned line in eviction order, the dirty line just past the window, although
/// the lowest class and the higher ranks hold clean lines. DSS must evict clean lines as
/// LRU does.
#[test]
fn dss_with_writebacks_in_flight_evicts_clean_lines() {
    const CAP: u64 = 16 * 1024;
    const REQ: u64 = 16;
    let mut reqs = Vec::new();
    for l in (0..CAP).step_by(REQ as usize) {
        let mut r = Request::write(l * 4096, REQ * 4096);
        r.class = 8;
        reqs.push(r);
    }
    // Time for the cleaner to catch up: reads of uncached metadata (not allocated).
    for l in 0..2048 {
        let mut r = Request::read((1u64 << 32) + l * 4096, 4096);
        r.class = 1;
        reqs.push(r);
    }
    for l in (0..CAP * 2).step_by(REQ as usize) {
        let mut r = Request::write((1u64 << 30) + l * 4096, REQ * 4096);
        r.class = 15;
        reqs.push(r);
    }
    let share = |(ev, d): (u64, u64)| d as f64 / ev.max(1) as f64;
    let lru = replay_with_writebacks_in_flight("lru", CAP, &reqs, 64, 15);
    let dss = replay_with_writebacks_in_flight("dss", CAP, &reqs, 64, 15);
    println!(
        "large file, write-backs in flight for 64 requests: dirty evictions lru {} of {} \
         ({:.1} %), dss {} of {} ({:.1} %)",
        lru.1,
        lru.0,
        100.0 * share(lru),
        dss.1,
        dss.0,
        100.0 * share(dss)
    );
    assert!(dss.0 > CAP / 2, "the workload evicts: {dss:?}");
    assert!(
        share(dss) <= share(lru) + 0.02,
        "DSS evicts dirty lines while write-backs are in flight: {} of {} (LRU {} of {})",
        dss.1,
        dss.0,
        lru.1,
        lru.0
    );
}
