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

/// `restore_bulk` leaves the engine exactly as `restore_line` on each line in turn: same
/// lines, masks and dirty state, and (the policy threaded in the same order, the free slots
/// the same) the same plans for every request after, so the same victims and slots.
#[test]
fn restore_bulk_equals_restore_line_in_every_policy() {
    use tiercache_engine::RestoreLine;
    let cap = 512u32;
    for policy in [
        "lru", "fifo", "clock", "slru", "s3fifo", "arc", "lifo", "mru",
    ] {
        for cleaning in ["lba", "acp", "alru"] {
            let cfg = EngineConfig {
                capacity_lines: cap as u64,
                mode: Mode::WriteBack,
                policy: policy.into(),
                cleaning: cleaning.parse().unwrap(),
                ..Default::default()
            };
            // Lines in a random order of slots (about 3/4 of them), random keys, some
            // dirty, some partial, and one of each kind of bad record.
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut slots: Vec<u32> = (0..cap).filter(|_| next() % 4 != 0).collect();
            for i in (1..slots.len()).rev() {
                slots.swap(i, next() as usize % (i + 1));
            }
            let mut lines: Vec<RestoreLine> = slots
                .iter()
                .enumerate()
                .map(|(i, &slot)| {
                    let r = next();
                    let valid = if r % 7 == 0 { 0x0f } else { 0xff };
                    RestoreLine {
                        key: i as u64 * 3 + 1,
                        slot,
                        valid,
                        dirty: if r % 3 == 0 { valid } else { 0 },
                        class: 0,
                    }
                })
                .collect();
            lines[5].valid = 0; // bad masks
            lines[9].dirty = 0x100; // dirty outside valid
            let mut a = Engine::new(cfg.clone()).unwrap();
            let mut refused_a = Vec::new();
            for (i, l) in lines.iter().enumerate() {
                if let Err(e) = a.restore_line(l.key, l.slot, l.valid, l.dirty, l.class) {
                    refused_a.push((i, e));
                }
            }
            let mut b = Engine::new(cfg).unwrap();
            let refused_b = b.restore_bulk(&lines);
            let what = format!("{policy}/{cleaning}");
            assert_eq!(refused_a, refused_b, "{what}");
            assert_eq!(refused_b.len(), 2, "{what}");
            let state = |e: &Engine| {
                e.entries()
                    .map(|(k, s, d)| (k, s, d, e.valid_mask(s), e.dirty_mask(s)))
                    .collect::<Vec<_>>()
            };
            assert_eq!(state(&a), state(&b), "{what}");
            assert_eq!(a.dirty_lines(), b.dirty_lines(), "{what}");
            let (mut ca, mut cb) = (Vec::new(), Vec::new());
            a.eviction_candidates(64, &mut ca);
            b.eviction_candidates(64, &mut cb);
            assert_eq!(ca, cb, "{what}: eviction order");
            // Misses, hits and cleaning after: the same plans step by step.
            for i in 0..2000u64 {
                let r = next();
                let off = (r % 2048) * 4096 + if i % 5 == 0 { 512 } else { 0 };
                let req = if r % 3 == 0 {
                    Request::write(off, 1024)
                } else {
                    Request::read(off, 4096)
                };
                let pa = a.process(&req).unwrap().steps.clone();
                let pb = b.process(&req).unwrap().steps.clone();
                assert_eq!(pa, pb, "{what}: request {i}");
                if i % 100 == 0 {
                    assert_eq!(a.clean(8).steps, b.clean(8).steps, "{what}: cleaning {i}");
                }
            }
            assert_eq!(a.counters(), b.counters(), "{what}");
        }
    }
}
