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
