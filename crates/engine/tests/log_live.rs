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
    assert!(e.admit(0, 0, c(10, 100)).steps.is_empty());
    let i = e.locate(0, 0).unwrap();
    assert!(i.open && !i.dirty && !i.dup && i.compressed && i.len == 100);
    // Same content on another line: a duplicate entry; probe and drop the fingerprint.
    e.reserve(false);
    e.admit(0, 1, c(10, 100));
    assert!(e.locate(0, 1).unwrap().dup);
    assert_eq!(e.probe_fp(10).unwrap().seg, i.seg);
    e.drop_fp(10);
    assert!(e.probe_fp(10).is_none());
    // Small extents: the 6-extent limit seals the segment before it is full.
    for l in 2..7 {
        e.reserve(false);
        e.admit(0, l, c(100 + l, 50));
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
    assert_eq!(first, LineTally { hits: 1, misses: 0 });
    // Between the pieces (as counted so far: a hit), the counts already add up.
    e.check().unwrap();
    assert_eq!(e.counters().write_requests.hits, 1);
    e.process_more(&Request::write(LS, LS), &[c(3, 100)])
        .unwrap();
    let mut whole = first;
    whole += e.last_lines();
    e.recount_request(Op::Write, first, whole);
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
    assert_eq!(whole, LineTally { hits: 2, misses: 1 });
    e.recount_request(Op::Read, first, whole);
    let r = e.counters().read_requests;
    assert_eq!(
        (r.hits, r.partial_misses, r.full_misses),
        (0, 1, 0),
        "{r:?}"
    );
    assert_eq!((e.counters().reads, e.counters().writes), (1, 2));
    e.check().unwrap();
}
