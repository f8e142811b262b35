//! Issue 18: DSS in write-back on the file-server workload (the cache settings:
//! 10 % of the footprint, write-back, nhit:0:1) must not write back far more lines in the
//! requests' path than LRU does, and must still keep the metadata and directories LRU loses.
//!
//! The mechanism found by replaying it: while a large file (class 15, the lowest priority)
//! is written and the cache holds higher-priority lines, the class-15 list holds only the
//! lines the current request has just written. `Dss::victim_for` finds no clean line at or
//! below class 15's priority, falls back to the lowest-priority tail, and so each 64 KiB
//! write evicted its own lines one by one, dirty: 15 write-backs in the request's path per
//! request, for lines that end up uncached anyway.

use std::sync::Arc;
use tiercache_engine::{CacheSize, Engine, EngineConfig, Mode, Request};

/// Replays `reqs` as the simulator does (a request, then the cleaning the engine asks for).
fn replay(policy: &str, reqs: &[Request], cap: u64) -> Engine {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: cap,
        mode: Mode::WriteBack,
        policy: policy.into(),
        admission: "nhit:0:1".parse().unwrap(),
        ..Default::default()
    })
    .unwrap();
    for r in reqs {
        e.process(r).unwrap();
        if e.needs_cleaning() {
            let n = e.cleaning_target();
            e.clean(n);
        }
    }
    e
}

/// Hit ratio of metadata and directory lines (classes 1 and 3).
fn meta_hits(e: &Engine) -> f64 {
    let (h, a) = [1u8, 3].iter().fold((0, 0), |(h, a), &c| {
        let k = e.class_counters(c);
        (h + k.line_hits, a + k.line_accesses)
    });
    h as f64 / a.max(1) as f64
}

#[test]
fn dss_on_the_fileserver_writes_back_in_the_request_path_no_more_than_lru() {
    let t = tiercache_sim::fileserver::generate(&"fileserver:scale=0.005".parse().unwrap(), 1);
    let input = tiercache_sim::Input::Memory {
        name: "fileserver".into(),
        requests: Arc::new(t.requests.clone()),
    };
    let fp = tiercache_sim::footprint_lines(&input, 4096).unwrap();
    let cap = CacheSize::Percent(10.0).lines(4096, fp);
    let lru = replay("lru", &t.requests, cap);
    let dss = replay("dss", &t.requests, cap);
    let (l, d) = (lru.counters(), dss.counters());
    let share = |d: u64, e: u64| d as f64 / e.max(1) as f64;
    println!(
        "dirty evictions: lru {}/{} ({:.1} %), dss {}/{} ({:.1} %); metadata+directory hit \
         ratio lru {:.1} %, dss {:.1} %",
        l.dirty_evictions,
        l.evictions,
        100.0 * share(l.dirty_evictions, l.evictions),
        d.dirty_evictions,
        d.evictions,
        100.0 * share(d.dirty_evictions, d.evictions),
        100.0 * meta_hits(&lru),
        100.0 * meta_hits(&dss)
    );
    assert!(
        d.dirty_evictions <= l.dirty_evictions + l.evictions / 20,
        "DSS evicted {} dirty lines, LRU {} (of {} evictions)",
        d.dirty_evictions,
        l.dirty_evictions,
        l.evictions
    );
    assert!(
        meta_hits(&dss) >= meta_hits(&lru) + 0.2,
        "DSS must keep the metadata LRU loses: hit ratio dss {:.3}, lru {:.3}",
        meta_hits(&dss),
        meta_hits(&lru)
    );
}
