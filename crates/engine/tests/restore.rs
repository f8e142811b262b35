//! Warm restart: lines restored with `restore_line` behave exactly as the lines that were
//! cached before (hits, validity and dirtiness per sector, write-back of dirty sectors), and
//! the slots they take are never handed out again while they are cached.

use tiercache_engine::{Engine, EngineConfig, Mode, Request, Step};

fn cfg() -> EngineConfig {
    EngineConfig {
        capacity_lines: 8,
        mode: Mode::WriteBack,
        ..Default::default()
    }
}

#[test]
fn restored_state_equals_original() {
    let mut a = Engine::new(cfg()).unwrap();
    // Full line, a partial (2 sectors) dirty write, and a read-populated line.
    a.process(&Request::write(0, 4096)).unwrap();
    a.process(&Request::write(5 * 4096 + 1024, 1024)).unwrap();
    a.process(&Request::read(3 * 4096, 4096)).unwrap();
    let saved: Vec<_> = a
        .entries()
        .map(|(k, s, _)| (k, s, a.valid_mask(s), a.dirty_mask(s)))
        .collect();
    assert_eq!(saved.len(), 3);

    let mut b = Engine::new(cfg()).unwrap();
    for &(k, s, v, d) in &saved {
        b.restore_line(k, s, v, d, 0).unwrap();
    }
    assert_eq!(b.len(), 3);
    assert_eq!(b.dirty_lines(), 2);
    for &(k, s, v, d) in &saved {
        assert_eq!(b.lookup(k), Some(s));
        assert_eq!(b.valid_mask(s), v);
        assert_eq!(b.dirty_mask(s), d);
    }
    // The partial line: a read of its valid sectors is a hit, of the rest needs the HDD.
    let p = b.process(&Request::read(5 * 4096 + 1024, 1024)).unwrap();
    assert!(
        p.steps.iter().all(|s| matches!(s, Step::ReadSsd { .. })),
        "{p:?}"
    );
    let p = b.process(&Request::read(5 * 4096, 512)).unwrap();
    assert!(
        p.steps.iter().any(|s| matches!(s, Step::ReadHdd { .. })),
        "{p:?}"
    );
    // Cleaning writes back exactly the dirty sectors that were restored.
    let p = b.clean(10).clone();
    let wb: Vec<_> = p
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::WriteBack { hdd, len, .. } => Some((hdd, len)),
            _ => None,
        })
        .collect();
    assert_eq!(wb, vec![(0, 4096), (5 * 4096 + 1024, 1024)]);
    assert_eq!(b.dirty_lines(), 0);
    // New lines fill the free slots, never the restored ones, until the cache is full.
    let used: Vec<u32> = saved.iter().map(|x| x.1).collect();
    for l in 10..15u64 {
        b.process(&Request::read(l * 4096, 4096)).unwrap();
        let s = b.lookup(Engine::line_key(0, l)).unwrap();
        assert!(!used.contains(&s), "line {l} took restored slot {s}");
    }
    assert_eq!(b.len(), 8);
}

#[test]
fn restore_rejects_bad_input() {
    let mut b = Engine::new(cfg()).unwrap();
    assert!(
        b.restore_line(1, 8, 0xff, 0, 0).is_err(),
        "slot past capacity"
    );
    assert!(b.restore_line(1, 0, 0, 0, 0).is_err(), "nothing valid");
    assert!(
        b.restore_line(1, 0, 0x0f, 0xf0, 0).is_err(),
        "dirty outside valid"
    );
    assert!(
        b.restore_line(1, 0, 0x1ff, 0, 0).is_err(),
        "mask wider than the line"
    );
    b.restore_line(1, 2, 0xff, 0, 0).unwrap();
    assert!(b.restore_line(1, 3, 0xff, 0, 0).is_err(), "key twice");
    assert!(b.restore_line(2, 2, 0xff, 0, 0).is_err(), "slot twice");
    b.restore_line(2, 0, 0xff, 0, 0).unwrap();
    assert_eq!(b.len(), 2);
}

/// An executor rolling back a failed plan drops a line, restores it into the same slot and
/// may drop it again (issue 14 item 1): the slot must then be handed out once, not twice
/// (found by the live volume's fault swarm: two lines shared a slot).
#[test]
fn drop_restore_drop_frees_a_slot_once() {
    let mut e = Engine::new(cfg()).unwrap();
    for l in 0..8u64 {
        e.process(&Request::write(l * 4096, 4096)).unwrap();
    }
    let slot = e.lookup(Engine::line_key(0, 3)).unwrap();
    let (v, d) = (e.valid_mask(slot), e.dirty_mask(slot));
    e.drop_line(slot).unwrap();
    e.restore_line(Engine::line_key(0, 3), slot, v, d, 0)
        .unwrap();
    e.drop_line(slot).unwrap();
    // One free slot: the next miss takes it, the one after must evict.
    e.process(&Request::write(100 * 4096, 4096)).unwrap();
    let plan = e.process(&Request::write(101 * 4096, 4096)).unwrap();
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::WriteBack { .. })),
        "the second miss reused the freed slot again: {:?}",
        plan.steps
    );
    let mut slots: Vec<_> = e.entries().map(|(_, s, _)| s).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len() as u64, e.len(), "two lines share a slot");
    assert_eq!(e.len(), 8);
}
