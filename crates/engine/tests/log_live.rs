//! The log engine's live-side API: deferred read fills (`reserve` + `admit`), the extent
//! limit per segment, `locate`/`probe_fp`/`drop_fp`, and `restore` from what an executor
//! recovered.

use tiercache_engine::log::{RestoredEntry, RestoredSegment};
use tiercache_engine::{Compression, ExtentContent, LogConfig, LogEngine, Mode, Request, Step};

const LS: u64 = 4096;

fn cfg() -> LogConfig {
    let mut c = LogConfig::new(8 * 4 * LS, LS);
    c.segment_size = 4 * LS;
    c.mode = Mode::WriteBack;
    c.dedup_ratio = 1.0;
    c.compression = Compression::Lz4;
    c.max_extents_per_segment = 6;
    c
}

fn c(fp: u64, len: u32) -> ExtentContent {
    ExtentContent {
        fp,
        compressed_len: len,
    }
}

#[test]
fn deferred_fill_reserve_admit_and_extent_limit() {
    let mut e = LogEngine::new(cfg()).unwrap();
    e.set_deferred_fill(true);
    // A read miss without content plans the HDD read but caches nothing yet.
    let p = e.process(&Request::read(0, LS), &[]).unwrap();
    assert!(matches!(p.steps[..], [Step::ReadHdd { .. }]));
    assert!(e.locate(0, 0).is_none());
    // reserve opens a segment; admit then appends without device steps.
    e.reserve(false);
    assert!(e.admit(0, 0, 0, c(10, 100)).steps.is_empty());
    let i = e.locate(0, 0).unwrap();
    assert!(i.open && !i.dirty && !i.dup && i.compressed && i.len == 100);
    // Same content on another line: a duplicate entry; probe and drop the fingerprint.
    e.reserve(false);
    e.admit(0, 1, 0, c(10, 100));
    assert!(e.locate(0, 1).unwrap().dup);
    assert_eq!(e.probe_fp(10).unwrap().seg, i.seg);
    e.drop_fp(10);
    assert!(e.probe_fp(10).is_none());
    // Small extents: the 6-extent limit seals the segment before it is full.
    for l in 2..7 {
        e.reserve(false);
        e.admit(0, l, 0, c(100 + l, 50));
    }
    let first = e.locate(0, 0).unwrap().seg;
    let p = e.reserve(false).steps.clone();
    assert!(
        matches!(p[..], [Step::WriteSsd { .. }]),
        "sealed at the extent limit: {p:?}"
    );
    assert!(!e.locate(0, 0).unwrap().open);
    assert_ne!(e.open_segment(false), Some(first));
    e.check().unwrap();
}

#[test]
fn restore_rebuilds_indices() {
    let mut e = LogEngine::new(cfg()).unwrap();
    e.set_deferred_fill(true);
    for l in 0..20u64 {
        e.reserve(true);
        e.process(&Request::write(l * LS, LS), &[c(1000 + l % 12, 3000)])
            .unwrap();
    }
    e.check().unwrap();
    // What an executor would have recovered: the segments' headers and the entries.
    let mut segs = vec![RestoredSegment::default(); e.segments().len()];
    for (i, s) in e.segments().iter().enumerate() {
        segs[i] = RestoredSegment {
            gen: s.gen,
            sealed: !s.hdr.is_empty(),
            hdr: s.hdr.clone(),
        };
    }
    let entries: Vec<RestoredEntry> = e
        .entries()
        .map(|(key, i)| RestoredEntry {
            key,
            seg: i.seg,
            off: i.off,
            dirty: i.dirty,
            dup: i.dup,
        })
        .collect();
    let mut r = LogEngine::new(cfg()).unwrap();
    let skipped = r.restore(segs, &entries).unwrap();
    assert_eq!(skipped, 0);
    r.check().unwrap();
    for l in 0..20 {
        let (a, b) = (e.locate(0, l), r.locate(0, l));
        assert_eq!(
            a.map(|x| (x.seg, x.off, x.dirty, x.dup)),
            b.map(|x| (x.seg, x.off, x.dirty, x.dup)),
            "line {l}"
        );
        assert!(!b.unwrap().open, "restored segments are sealed");
    }
    assert_eq!(r.dirty_lines(), e.dirty_lines());
    assert!(r.probe_fp(1000).is_some(), "fingerprints restored");
    // The restored engine keeps working: reclaiming writes back the dirty lines.
    let mut wb = 0;
    for l in 100..140u64 {
        wb += r
            .reserve(true)
            .steps
            .iter()
            .filter(|s| matches!(s, Step::WriteBack { .. }))
            .count();
        r.process(&Request::write(l * LS, LS), &[c(5000 + l, 4096)])
            .unwrap();
    }
    assert!(wb > 0);
    r.check().unwrap();
}

/// A request processed in pieces (the live volume's line-by-line order) is counted by its
/// first piece, then again from all its pieces by `recount_request`, with the direct
/// layout's outcome definitions; the counts add up to the reads and writes throughout.
#[test]
fn a_request_in_pieces_is_counted_once_by_its_whole_outcome() {
    use tiercache_engine::log::LineTally;
    use tiercache_engine::Op;
    let mut e = LogEngine::new(cfg()).unwrap();
    // Line 0 written whole (a write full miss), then a two-line write in pieces: line 0
    // cached, line 1 not -> one write partial miss, not a hit plus a miss.
    e.process(&Request::write(0, LS), &[c(1, 100)]).unwrap();
    e.process(&Request::write(0, LS), &[c(2, 100)]).unwrap();
    let first = e.last_lines();
    assert_eq!(
        first,
        LineTally {
            hits: 1,
            misses: 0,
            bypassed: 0
        }
    );
    // Between the pieces (as counted so far: a hit), the counts already add up.
    e.check().unwrap();
    assert_eq!(e.counters().write_requests.hits, 1);
    e.process_more(&Request::write(LS, LS), &[c(3, 100)])
        .unwrap();
    let mut whole = first;
    whole += e.last_lines();
    e.recount_request(Op::Write, 0, first, whole);
    let w = e.counters().write_requests;
    assert_eq!(
        (w.hits, w.partial_misses, w.full_misses, w.pass_through),
        (0, 1, 1, 0),
        "{w:?}"
    );
    assert_eq!(e.counters().write_line_hits, 1);
    // A read of lines 0..3 in pieces: two cached, one not -> a read partial miss.
    e.process(&Request::read(0, LS), &[]).unwrap();
    let first = e.last_lines();
    let mut whole = first;
    for line in 1..3 {
        e.process_more(&Request::read(line * LS, LS), &[]).unwrap();
        whole += e.last_lines();
    }
    assert_eq!(
        whole,
        LineTally {
            hits: 2,
            misses: 1,
            bypassed: 0
        }
    );
    e.recount_request(Op::Read, 0, first, whole);
    let r = e.counters().read_requests;
    assert_eq!(
        (r.hits, r.partial_misses, r.full_misses),
        (0, 1, 0),
        "{r:?}"
    );
    assert_eq!((e.counters().reads, e.counters().writes), (1, 2));
    e.check().unwrap();
}

/// A class table with class 2 `never` (and class 1 `always`).
fn never_table() -> std::sync::Arc<tiercache_engine::ClassTable> {
    let t = tiercache_engine::ClassTable::parse(
        "version = 1\nname = \"t\"\n\
         [[class]]\nid = 1\nname = \"hot\"\npriority = 0\nallocation = \"always\"\n\
         [[class]]\nid = 2\nname = \"backup\"\npriority = 1\nallocation = \"never\"\n",
        "t.toml",
    )
    .unwrap();
    std::sync::Arc::new(t)
}

fn of(mut r: Request, class: u8) -> Request {
    r.class = class;
    r
}

/// A missed line of a `never` class is read from, or written to, the backing device only
/// and not cached (write-back included: its bytes go straight to the backing device); a
/// cached line is served and updated whatever the class of the request; a bypass is a
/// miss, and a request of only bypassed lines is a pass-through, as the direct layout
/// counts them. Counted per class.
#[test]
fn never_class_misses_are_not_cached_and_classes_are_counted() {
    let mut cf = cfg();
    cf.classes = Some(never_table());
    let mut e = LogEngine::new(cf).unwrap();
    assert!(e.caches_class(0) && e.caches_class(1) && !e.caches_class(2));
    // Read miss of class 2: an HDD read, nothing appended.
    let p = e
        .process(&of(Request::read(0, LS), 2), &[c(1, 100)])
        .unwrap();
    assert!(matches!(p.steps[..], [Step::ReadHdd { .. }]), "{p:?}");
    assert!(e.locate(0, 0).is_none());
    // Write-back write miss of class 2: the client's bytes to the HDD, not cached.
    let p = e
        .process(&of(Request::write(LS + 512, 1024), 2), &[c(2, 100)])
        .unwrap();
    assert!(
        matches!(p.steps[..], [Step::WriteHdd { hdd, len: 1024, .. }] if hdd == LS + 512),
        "{p:?}"
    );
    assert!(e.locate(0, 1).is_none());
    // Class 1 caches line 3 (dirty); a class-2 write to it is a hit and stays cached.
    e.process(&of(Request::write(3 * LS, LS), 1), &[c(3, 100)])
        .unwrap();
    let p = e
        .process(&of(Request::write(3 * LS, LS), 2), &[c(4, 100)])
        .unwrap();
    assert!(p.steps.is_empty(), "a dirty write hit: {p:?}");
    let i = e.locate(0, 3).unwrap();
    assert!(i.dirty);
    assert_eq!(
        i.class, 2,
        "the line is the class of the write that cached it last"
    );
    let p = e.process(&of(Request::read(3 * LS, LS), 2), &[]).unwrap();
    assert!(p.steps.is_empty(), "a RAM hit: {p:?}");
    let k = *e.counters();
    assert_eq!(k.bypassed_lines, 2);
    assert_eq!(k.read_requests.pass_through, 1);
    assert_eq!(k.write_requests.pass_through, 1);
    let k2 = *e.class_counters(2);
    assert_eq!(
        (k2.requests, k2.reads, k2.writes, k2.bypassed_lines),
        (4, 2, 2, 2)
    );
    assert_eq!((k2.read_line_hits, k2.write_line_hits), (1, 1));
    assert_eq!(k2.hdd_bytes_written, 1024);
    let k1 = *e.class_counters(1);
    assert_eq!(
        (k1.requests, k1.extents_stored, k1.bypassed_lines),
        (1, 1, 0)
    );
    e.check().unwrap();
    // The live side's deferred fill: `admit` of a `never` class caches nothing.
    e.set_deferred_fill(true);
    e.process(&of(Request::read(5 * LS, LS), 2), &[]).unwrap();
    e.reserve(false);
    e.admit(0, 5, 2, c(5, 100));
    assert!(e.locate(0, 5).is_none());
    e.process(&of(Request::read(6 * LS, LS), 0), &[]).unwrap();
    e.reserve(false);
    e.admit(0, 6, 0, c(6, 100));
    assert!(e.locate(0, 6).is_some());
    assert_eq!(e.class_counters(0).extents_stored, 1);
    // A table the log layout cannot take (partitions) changes nothing.
    let mut part = (*never_table()).clone();
    part.classes[1].max_share = 0.5;
    let err = e
        .set_class_table(Some(std::sync::Arc::new(part)))
        .unwrap_err();
    assert!(err.to_string().contains("no partitions"), "{err}");
    assert!(!e.caches_class(2));
    e.set_class_table(None).unwrap();
    assert!(e.caches_class(2));
}

/// Sums every numeric field of counters (found through serde, so a field added later is
/// summed too).
fn sum_json(acc: &mut serde_json::Value, v: &serde_json::Value) {
    match (acc, v) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, x) in b {
                let zero = if x.is_object() {
                    serde_json::json!({})
                } else {
                    serde_json::json!(0)
                };
                sum_json(a.entry(k.clone()).or_insert(zero), x);
            }
        }
        (a, serde_json::Value::Number(n)) => {
            *a = serde_json::json!(a.as_u64().unwrap_or(0) + n.as_u64().unwrap());
        }
        _ => panic!("unexpected counter value {v}"),
    }
}

/// Whole requests (no `reserve`: everything a request does is counted in its class): the
/// per-class counters add up to the totals, every field.
#[test]
fn per_class_counters_add_up_to_the_totals() {
    use rand::{Rng, SeedableRng};
    let mut cf = cfg();
    cf.classes = Some(never_table());
    let mut e = LogEngine::new(cf).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for i in 0..4000u64 {
        let line = rng.gen_range(0..60u64);
        let n = rng.gen_range(1..3u64);
        let class = rng.gen_range(0..4u8);
        let content: Vec<_> = (0..n)
            .map(|_| c(rng.gen_range(0..40u64), rng.gen_range(100..5000u32)))
            .collect();
        let r = match i % 7 {
            0 => Request::new(0, tiercache_engine::Op::Trim, line * LS, LS),
            1 => Request::new(0, tiercache_engine::Op::Flush, 0, 0),
            2..=4 => Request::read(line * LS, n * LS),
            _ => Request::write(line * LS + 512, n * LS - 1024),
        };
        let r = of(r, class);
        let content = if matches!(
            r.op,
            tiercache_engine::Op::Read | tiercache_engine::Op::Write
        ) {
            content
        } else {
            Vec::new()
        };
        e.process(&r, &content).unwrap();
    }
    e.check().unwrap();
    let mut sum = serde_json::json!({});
    for k in 0..tiercache_engine::NUM_CLASSES as u8 {
        sum_json(
            &mut sum,
            &serde_json::to_value(e.class_counters(k)).unwrap(),
        );
    }
    let total = serde_json::to_value(e.counters()).unwrap();
    assert_eq!(sum, total);
    assert!(e.counters().bypassed_lines > 0 && e.counters().segments_reclaimed > 0);
    assert!(e.class_counters(2).bypassed_lines > 0);
    assert_eq!(e.class_counters(0).bypassed_lines, 0);
}

/// The live executor's trimmed free reserve (`reserve`, then `evict_ahead_victim` /
/// `evict_ahead_one` until none, then `admit` or `process`) leaves the engine as the
/// simulator's allocation does (`process` with content, which evicts ahead inside), request
/// for request: same counters, same cached lines, same free segments. And the live plans
/// trim every segment reclaimed ahead.
#[test]
fn live_free_reserve_equals_the_simulators() {
    let mut c = LogConfig::new(12 * 4 * LS, LS);
    c.segment_size = 4 * LS;
    c.mode = Mode::WriteBack;
    c.dedup_ratio = 1.0;
    c.trim = true;
    c.free_reserve = 0.25; // 3 of 12 segments
    let mut sim = LogEngine::new(c.clone()).unwrap();
    let mut live = LogEngine::new(c.clone()).unwrap();
    live.set_deferred_fill(true);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut version = 0u64;
    let (mut trims, mut ahead) = (0u64, 0u64);
    for i in 0..4000u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let line = rng % 80;
        let write = rng.is_multiple_of(3);
        version += 1;
        // Unique contents: no duplicate hits, which the deferred read would count differently.
        let content = c_of(line, version);
        let keep_free = |e: &mut LogEngine, trims: &mut u64, ahead: &mut u64| {
            while let Some(v) = e.evict_ahead_victim() {
                let wbs = e.reclaim_write_backs(v);
                let p = e.evict_ahead_one(v).steps.clone();
                *ahead += 1;
                let n_wb = p
                    .iter()
                    .filter(|s| matches!(s, Step::WriteBack { .. }))
                    .count();
                assert_eq!(n_wb, wbs.len(), "the write-backs the executor ran first");
                *trims += p
                    .iter()
                    .filter(|s| matches!(s, Step::TrimSsd { .. }))
                    .count() as u64;
            }
        };
        // The reserve is refilled after the line's own bookkeeping (as the simulator evicts
        // ahead inside its append, after a write dropped the line's older extent).
        if write {
            sim.process(&Request::write(line * LS, LS), &[content])
                .unwrap();
            live.reserve(true);
            live.process(&Request::write(line * LS, LS), &[content])
                .unwrap();
            keep_free(&mut live, &mut trims, &mut ahead);
        } else {
            sim.process(&Request::read(line * LS, LS), &[content])
                .unwrap();
            live.process(&Request::read(line * LS, LS), &[]).unwrap();
            if live.locate(0, line).is_none() {
                live.reserve(false);
                live.admit(0, line, 0, content);
                keep_free(&mut live, &mut trims, &mut ahead);
            }
        }
        assert_eq!(
            sim.counters(),
            live.counters(),
            "request {i}: line {line}, write {write}"
        );
        assert_eq!(
            sim.locate(0, line).map(|x| (x.seg, x.off, x.dirty)),
            live.locate(0, line).map(|x| (x.seg, x.off, x.dirty)),
            "request {i}"
        );
    }
    assert!(ahead > 50, "segments reclaimed ahead: {ahead}");
    assert_eq!(trims, ahead, "every segment reclaimed ahead is trimmed");
    assert_eq!(live.counters().ssd_bytes_trimmed, ahead * 4 * LS);
    sim.check().unwrap();
    live.check().unwrap();
}

fn c_of(line: u64, version: u64) -> ExtentContent {
    c((line << 32) | version, LS as u32)
}

/// `reinsert_candidates` names exactly the extents the reclamation then puts back, in its
/// order, and a candidate forgotten first (its bytes failed to verify) is evicted instead.
#[test]
fn reinsert_candidates_are_what_the_reclamation_reinserts() {
    let mut c = cfg();
    c.mode = Mode::WriteThrough;
    c.reinsert_hits = 1;
    c.max_extents_per_segment = 0;
    c.picker = "fifo".into();
    let mut e = LogEngine::new(c).unwrap();
    e.set_deferred_fill(true);
    let fill = |e: &mut LogEngine, line: u64| {
        e.process(&Request::read(line * LS, LS), &[]).unwrap();
        if e.locate(0, line).is_none() {
            e.reserve(false);
            e.admit(0, line, 0, c_of(line, 1));
        }
    };
    // 8 segments of 4 lines: fill 7 segments' worth, hit lines 1 and 2 (segment of lines 0..3).
    for l in 0..28 {
        fill(&mut e, l);
    }
    for l in [1, 2] {
        e.process(&Request::read(l * LS, LS), &[]).unwrap();
    }
    let first = e.locate(0, 0).unwrap().seg;
    // Fill until the segment of line 0 is the victim.
    let mut l = 28;
    let victim = loop {
        if let Some(v) = e.reserve_begin(false) {
            break v;
        }
        e.reserve_end(false, None);
        e.admit(0, l, 0, c_of(l, 1));
        l += 1;
    };
    assert_eq!(victim, first);
    let cands = e.reinsert_candidates(victim, false);
    assert_eq!(
        cands
            .iter()
            .map(|x| LogEngine::key_line(x.0).1)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(
        e.reinsert_candidates(victim, true).is_empty(),
        "the dirty stream reinserts nothing"
    );
    // Line 2's bytes failed to verify: forgotten, so only line 1 comes back.
    e.forget(0, 2);
    let reads: Vec<u64> = e
        .reserve_end(false, Some(victim))
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::ReadSsd { ssd, .. } => Some(ssd),
            _ => None,
        })
        .collect();
    assert_eq!(reads, vec![victim as u64 * 4 * LS + cands[0].1 as u64]);
    let i = e.locate(0, 1).unwrap();
    assert_eq!((i.seg, i.off, i.open), (victim, 0, true));
    assert!(e.locate(0, 2).is_none() && e.locate(0, 0).is_none());
    e.check().unwrap();
}

/// A reclaimed segment whose every extent is hot is refilled only as far as leaves room for
/// the line whose reservation reclaimed it (before, the simulator put that line past the
/// segment's end), and the simulator's path agrees with the live one.
#[test]
fn reinsertion_leaves_room_for_the_new_line() {
    let mut c = cfg();
    c.mode = Mode::WriteThrough;
    c.reinsert_hits = 1;
    c.max_extents_per_segment = 0;
    c.picker = "fifo".into();
    c.compression = Compression::None;
    let mut sim = LogEngine::new(c).unwrap();
    // 8 segments of 4 lines: 28 lines read three times (admitted, then hits), then misses
    // elsewhere reclaim their segments.
    for _ in 0..3 {
        for l in 0..28u64 {
            sim.process(&Request::read(l * LS, LS), &[c_of(l, 1)])
                .unwrap();
        }
    }
    for l in 100..140u64 {
        sim.process(&Request::read(l * LS, LS), &[c_of(l, 1)])
            .unwrap();
        sim.check().unwrap();
    }
    let n = sim.counters().reinserted;
    assert!(n > 0, "hot extents reinserted");
    assert!(
        sim.counters().segments_reclaimed * 3 >= n,
        "at most 3 of a 4-line segment's extents come back: {n} reinserted, {} reclaims",
        sim.counters().segments_reclaimed
    );
}
