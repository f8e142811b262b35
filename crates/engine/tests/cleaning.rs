//! Cleaning policies (`cleaning = lba | acp | alru`): the order in which `Engine::clean`
//! writes back a known dirty set.

use tiercache_engine::{CleaningPolicy, Engine, EngineConfig, Mode, Op, Request, Step};

/// Write-back engine, 4 KiB lines, 16-line (64 KiB) chunks, chunk rewrites off unless
/// `min_runs` > 0, watermarks high enough that nothing cleans by itself.
fn engine(cleaning: CleaningPolicy, min_runs: u64) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: 1024,
        mode: Mode::WriteBack,
        cleaning,
        cleaning_age: 10,
        rewrite_chunk: 64 << 10,
        rewrite_min_runs: if min_runs == 0 { u64::MAX } else { min_runs },
        dirty_high: 1.0,
        dirty_low: 1.0,
        ..Default::default()
    })
    .unwrap()
}

fn write(e: &mut Engine, lines: &[u64]) {
    for &l in lines {
        e.process(&Request::new(0, Op::Write, l * 4096, 4096))
            .unwrap();
    }
}

/// Lines written back by `clean(n)`, in plan order.
fn cleaned(e: &mut Engine, n: u64) -> Vec<u64> {
    e.clean(n)
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::WriteBack { hdd, .. } => Some(hdd / 4096),
            _ => None,
        })
        .collect()
}

/// Chunk 0 (lines 0..16): 2 dirty, chunk 1 (16..32): 4 dirty, chunk 3 (48..64): 3 dirty,
/// written in an order that is neither LBA nor density order.
const SET: [u64; 9] = [50, 3, 17, 49, 30, 1, 20, 63, 18];

#[test]
fn lba_cleans_in_disk_order_from_where_it_stopped() {
    let mut e = engine(CleaningPolicy::Lba, 0);
    write(&mut e, &SET);
    assert_eq!(cleaned(&mut e, 4), vec![1, 3, 17, 18]);
    write(&mut e, &[2]);
    // Continues after line 18, wraps to line 2 at the end.
    assert_eq!(cleaned(&mut e, 9), vec![20, 30, 49, 50, 63, 2]);
}

#[test]
fn acp_cleans_the_densest_chunk_first_in_lba_order_within() {
    let mut e = engine(CleaningPolicy::Acp, 0);
    write(&mut e, &SET);
    // Chunk 1 (4 dirty) whole, then chunk 3 (3), then chunk 0 (2).
    assert_eq!(cleaned(&mut e, 5), vec![17, 18, 20, 30, 49]);
    // A chunk once started is finished before another is chosen, even when a write makes
    // another denser meanwhile.
    write(&mut e, &[5, 6, 7]);
    assert_eq!(cleaned(&mut e, 2), vec![50, 63]);
    assert_eq!(cleaned(&mut e, 10), vec![1, 3, 5, 6, 7]);
    assert_eq!(e.dirty_lines(), 0);
}

#[test]
fn acp_counts_follow_evictions_and_rewrites_of_dirty_lines() {
    let mut e = engine(CleaningPolicy::Acp, 0);
    write(&mut e, &SET);
    // Trims of three of chunk 1's lines leave it the sparsest.
    for l in [17, 18, 20] {
        e.process(&Request::new(0, Op::Trim, l * 4096, 4096))
            .unwrap();
    }
    // Rewriting a dirty line does not count it twice.
    write(&mut e, &[50, 50, 49]);
    assert_eq!(cleaned(&mut e, 100), vec![49, 50, 63, 1, 3, 30]);
}

#[test]
fn acp_rewrites_the_chunk_it_chose_when_dense_enough() {
    let mut e = engine(CleaningPolicy::Acp, 3);
    write(&mut e, &SET);
    let plan = e.clean(4).steps.clone();
    // Chunk 1 has 3 runs (17-18, 20, 30): one contiguous rewrite from line 17 to its end.
    let first = match plan[0] {
        Step::WriteBack { hdd, .. } => hdd,
        ref s => panic!("{s:?}"),
    };
    assert_eq!(first, 17 * 4096);
    assert!(
        plan.iter().any(|s| matches!(s, Step::CopyHdd { .. })),
        "{plan:?}"
    );
    assert_eq!(e.counters().chunk_rewrites, 1);
    assert_eq!(e.dirty_lines(), 5);
}

#[test]
fn alru_cleans_longest_dirty_first_and_stale_lines_are_due() {
    let mut e = engine(CleaningPolicy::Alru, 0);
    write(&mut e, &SET);
    // Below the watermark and nothing older than 10 requests: nothing due.
    assert!(!e.needs_cleaning());
    // Rewriting a dirty line does not make it younger.
    write(&mut e, &[50]);
    e.advance_clock(5);
    // Clock 15: lines dirtied at requests 1..=4 (50, 3, 17, 49) are older than 10.
    assert!(e.needs_cleaning());
    let due = e.cleaning_target();
    assert_eq!(due, 4);
    assert_eq!(cleaned(&mut e, due), vec![50, 3, 17, 49]);
    assert_eq!(cleaned(&mut e, 2), vec![30, 1]);
    assert!(!e.needs_cleaning());
}

#[test]
fn the_cleaning_policy_can_change_on_a_running_engine() {
    let mut e = engine(CleaningPolicy::Lba, 0);
    write(&mut e, &SET);
    e.retune(|c| c.cleaning = CleaningPolicy::Acp).unwrap();
    assert_eq!(e.cleaning_name(), "acp");
    assert_eq!(cleaned(&mut e, 4), vec![17, 18, 20, 30]);
    assert!("fifo"
        .parse::<CleaningPolicy>()
        .unwrap_err()
        .contains("acp"));
}

// ---- Write-backs in flight: begin_clean / complete_writeback (plan-unlocked-io.md (c)) ----

use tiercache_engine::{Validity, WbLine, WbTicket};

/// A 4-line write-back cache (sector validity unless `line`), nothing cleans by itself.
fn small(cap: u64, line: bool) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: cap,
        mode: Mode::WriteBack,
        validity: if line {
            Validity::Line
        } else {
            Validity::Sector
        },
        rewrite_chunk: 0,
        dirty_high: 1.0,
        dirty_low: 1.0,
        ..Default::default()
    })
    .unwrap()
}

fn begin(e: &mut Engine, n: u64) -> (WbTicket, Vec<WbLine>, Vec<(u32, u64, u64)>) {
    let b = e.begin_clean(n).expect("something to clean");
    (b.ticket, b.lines.to_vec(), b.spans.to_vec())
}

fn slot_of(e: &Engine, line: u64) -> u32 {
    e.lookup(Engine::line_key(0, line)).expect("cached")
}

#[test]
fn a_write_during_a_write_back_keeps_exactly_the_rewritten_sectors_dirty() {
    let mut e = small(4, false);
    write(&mut e, &[3]);
    let s = slot_of(&e, 3);
    let (t, lines, spans) = begin(&mut e, 8);
    assert_eq!(lines.len(), 1);
    assert_eq!((lines[0].slot, lines[0].pending), (s, 0xff));
    assert_eq!(spans, vec![(0, 3 * 4096, 4096)]);
    // Clean for the cleaner and the counts, pending for records.
    assert_eq!(e.dirty_lines(), 0);
    assert_eq!((e.dirty_mask(s), e.pending_mask(s)), (0, 0xff));
    assert!(e.is_pinned(s));
    assert!(e.begin_clean(8).is_none(), "nothing else is dirty");
    // Sectors 2 and 3 are written while the write-back reads the line.
    e.process(&Request::new(0, Op::Write, 3 * 4096 + 1024, 1024))
        .unwrap();
    assert_eq!(e.dirty_mask(s), 0b1100);
    assert_eq!(e.slot_gen(s), lines[0].wgen + 1);
    let done = e.complete_writeback(t, &[]);
    assert_eq!((done.cleaned, done.redirtied, done.failed), (1, 1, 0));
    assert_eq!((e.dirty_mask(s), e.pending_mask(s)), (0b1100, 0));
    assert!(!e.is_pinned(s));
    assert_eq!(e.inflight_counters().writeback_redirtied, 1);
    // The next pass writes back exactly those sectors.
    let steps = e.clean(8).steps.clone();
    assert_eq!(
        steps,
        vec![Step::WriteBack {
            vol: 0,
            ssd: s as u64 * 4096 + 1024,
            hdd: 3 * 4096 + 1024,
            len: 1024
        }]
    );
}

#[test]
fn a_full_trim_during_a_write_back_frees_the_slot_only_at_complete() {
    let mut e = small(4, false);
    write(&mut e, &[0, 1, 2, 3]);
    let s0 = slot_of(&e, 0);
    let (t, lines, _) = begin(&mut e, 1);
    assert_eq!(lines[0].slot, s0);
    e.process(&Request::new(0, Op::Trim, 0, 4096)).unwrap();
    assert_eq!(e.lookup(Engine::line_key(0, 0)), None);
    assert_eq!((e.len(), e.zombie_slots()), (3, 1));
    // The zombie slot is not free: new lines evict (LRU: line 1, then 2) instead.
    write(&mut e, &[10, 11]);
    for l in [10, 11] {
        assert_ne!(
            slot_of(&e, l),
            s0,
            "line {l} took the slot being written back"
        );
    }
    assert_eq!(e.counters().evictions, 2);
    let done = e.complete_writeback(t, &[]);
    assert_eq!((done.freed, done.cleaned), (1, 1));
    assert_eq!(e.zombie_slots(), 0);
    // Now it is free: the next line takes it without an eviction.
    write(&mut e, &[12]);
    assert_eq!(slot_of(&e, 12), s0);
    assert_eq!(e.counters().evictions, 2);
    assert_eq!(e.inflight_counters().zombies_freed, 1);
}

#[test]
fn a_partial_trim_during_a_write_back_keeps_the_line() {
    for line_validity in [true, false] {
        let mut e = small(4, line_validity);
        write(&mut e, &[5]);
        let s = slot_of(&e, 5);
        let (t, ..) = begin(&mut e, 1);
        e.process(&Request::new(0, Op::Trim, 5 * 4096, 2048))
            .unwrap();
        // Still cached: a read of its other half must not go to the backing device before
        // the write-back has put the data there.
        assert_eq!(
            e.lookup(Engine::line_key(0, 5)),
            Some(s),
            "line validity {line_validity}"
        );
        let plan = e
            .process(&Request::new(0, Op::Read, 5 * 4096 + 2048, 2048))
            .unwrap();
        assert!(
            plan.steps.iter().all(|s| matches!(s, Step::ReadSsd { .. })),
            "line validity {line_validity}: {:?}",
            plan.steps
        );
        e.complete_writeback(t, &[]);
        assert_eq!(e.dirty_lines(), 0);
    }
    // Without a write-back in flight a partly trimmed clean line (line validity) is dropped,
    // as before: the pending state is what kept it.
    let mut e = small(4, true);
    write(&mut e, &[5]);
    e.clean(1);
    e.process(&Request::new(0, Op::Trim, 5 * 4096, 2048))
        .unwrap();
    assert_eq!(e.lookup(Engine::line_key(0, 5)), None);
}

#[test]
fn a_failed_write_back_makes_its_lines_dirty_again() {
    let mut e = small(4, false);
    write(&mut e, &[1, 2]);
    let (s1, s2) = (slot_of(&e, 1), slot_of(&e, 2));
    let (t, lines, _) = begin(&mut e, 8);
    assert_eq!(lines.len(), 2);
    assert_eq!(e.dirty_lines(), 0);
    // Sectors 0-1 of line 1 are trimmed meanwhile: their contents are discarded.
    e.process(&Request::new(0, Op::Trim, 4096, 1024)).unwrap();
    let done = e.complete_writeback(t, &[s1]);
    assert_eq!((done.failed, done.cleaned), (1, 1));
    assert_eq!(e.dirty_lines(), 1);
    assert_eq!(
        e.dirty_mask(s1),
        0xfc,
        "pending sectors still valid are dirty again"
    );
    assert_eq!(e.dirty_mask(s2), 0);
    assert_eq!(e.inflight_counters().writeback_failed, 1);
    assert_eq!(cleaned(&mut e, 8), vec![1]);
}

#[test]
fn a_chunk_rewrite_in_flight_pins_its_clean_copies_and_spans_the_chunk() {
    // 16-line chunks, rewritten from 2 runs; lines 17 and 19 dirty, 18 a clean copy.
    let mut e = engine(CleaningPolicy::Lba, 2);
    write(&mut e, &[17, 19]);
    e.process(&Request::new(0, Op::Read, 18 * 4096, 4096))
        .unwrap();
    let s18 = slot_of(&e, 18);
    let (t, lines, spans) = begin(&mut e, 8);
    assert_eq!(
        spans,
        vec![(0, 17 * 4096, 15 * 4096)],
        "one span to the chunk's end"
    );
    let l18 = lines
        .iter()
        .find(|l| l.slot == s18)
        .expect("clean copy pinned");
    assert_eq!(l18.pending, 0);
    assert_eq!(lines.iter().filter(|l| l.pending != 0).count(), 2);
    assert!(e.is_pinned(s18));
    let mut cands = Vec::new();
    e.eviction_candidates(1024, &mut cands);
    assert!(
        lines.iter().all(|l| !cands.contains(&l.slot)),
        "a pinned slot offered for unmap-ahead"
    );
    let done = e.complete_writeback(t, &[]);
    assert_eq!(done.cleaned, 2);
    assert!(!e.is_pinned(s18));
}

#[test]
fn a_chunk_rewrite_never_reads_a_slot_a_read_miss_is_filling() {
    // As above, but line 18 was just planned by a read miss whose executor is still
    // writing its slot (pinned by `pin_fill`): its slot holds other bytes, which a rewrite
    // would copy to line 18's backing range. Plain write-backs of 17 and 19 instead.
    let mut e = engine(CleaningPolicy::Lba, 2);
    write(&mut e, &[17, 19]);
    e.process(&Request::new(0, Op::Read, 18 * 4096, 4096))
        .unwrap();
    let s18 = slot_of(&e, 18);
    let fill = e.pin_fill(&[s18]).expect("pinned");
    assert!(e.is_pinned(s18));
    let (t, lines, _) = begin(&mut e, 8);
    assert!(
        lines.iter().all(|l| l.slot != s18),
        "the filling slot is read by a write-back: {lines:?}"
    );
    let steps = e.complete_writeback(t, &[]);
    assert_eq!(steps.cleaned, 2);
    assert_eq!(e.counters().chunk_rewrites, 0);
    // Filled: the next rewrite may read it again.
    e.complete_writeback(fill, &[]);
    assert!(!e.is_pinned(s18));
    write(&mut e, &[17, 19]);
    let (t, lines, _) = begin(&mut e, 8);
    assert!(lines.iter().any(|l| l.slot == s18 && l.pending == 0));
    e.complete_writeback(t, &[]);
    assert_eq!(e.counters().chunk_rewrites, 1);
}

#[test]
fn two_write_backs_of_one_rewritten_line_keep_their_own_pending_sectors() {
    let mut e = small(4, false);
    write(&mut e, &[1]);
    let s = slot_of(&e, 1);
    let (t1, ..) = begin(&mut e, 8);
    e.process(&Request::new(0, Op::Write, 4096, 512)).unwrap();
    let (t2, l2, _) = begin(&mut e, 8);
    assert_eq!(l2[0].pending, 1);
    assert_eq!(e.writebacks_in_flight(), 2);
    // The first completes: sector 0 is still pending for the second.
    e.complete_writeback(t1, &[]);
    assert_eq!((e.pending_mask(s), e.dirty_mask(s)), (1, 0));
    // The second fails: only its sector is dirty again.
    e.complete_writeback(t2, &[s]);
    assert_eq!((e.pending_mask(s), e.dirty_mask(s)), (0, 1));
    assert!(!e.is_pinned(s));
}

#[test]
#[should_panic(expected = "not in flight")]
fn completing_a_ticket_twice_is_a_bug() {
    let mut e = small(4, false);
    write(&mut e, &[1]);
    let (t, ..) = begin(&mut e, 8);
    e.complete_writeback(t, &[]);
    e.complete_writeback(t, &[]);
}

/// A pass cut short (the executor stopped before some groups: it completes them as failed)
/// or failing counts as written back only the lines it wrote: the others are written back
/// (and counted) by a later pass. Before the fix the counter took every line at begin.
#[test]
fn a_cut_short_pass_counts_only_the_lines_it_wrote_back() {
    let mut e = small(8, false);
    write(&mut e, &[1, 2, 3, 4]);
    let (t, lines, _) = begin(&mut e, 8);
    assert_eq!(lines.len(), 4);
    // Lines 3 and 4 were not written (the pass yielded after the first two groups).
    let undone = [slot_of(&e, 3), slot_of(&e, 4)];
    let done = e.complete_writeback(t, &undone);
    assert_eq!((done.cleaned, done.failed), (2, 2));
    assert_eq!(
        e.counters().write_backs,
        2,
        "only lines 1 and 2 were written back"
    );
    assert_eq!(cleaned(&mut e, 8), vec![3, 4]);
    assert_eq!(
        e.counters().write_backs,
        4,
        "4 dirty lines, each written back once"
    );

    // The same for a chunk rewrite (lines 17 and 19 dirty, 18 a clean copy) failing whole.
    let mut e = engine(CleaningPolicy::Lba, 2);
    write(&mut e, &[17, 19]);
    e.process(&Request::new(0, Op::Read, 18 * 4096, 4096))
        .unwrap();
    let (t, lines, _) = begin(&mut e, 8);
    let all: Vec<u32> = lines.iter().map(|l| l.slot).collect();
    e.complete_writeback(t, &all);
    assert_eq!(e.counters().write_backs, 0, "nothing was written back");
    assert_eq!(e.dirty_lines(), 2);
    e.clean(8);
    assert_eq!(e.counters().write_backs, 2);
}
