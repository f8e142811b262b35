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
/// `n` requests (a third 1 KiB writes, the rest 4 KiB reads, every fifth unaligned, over
/// `lines` lines drawn from `next`), and a cleaning pass every 100: `a` and `b` plan the same
/// steps for each, and end with the same counters.
fn same_plans_after(
    a: &mut Engine,
    b: &mut Engine,
    n: u64,
    lines: u64,
    next: &mut dyn FnMut() -> u64,
    what: &str,
) {
    for i in 0..n {
        let r = next();
        let off = (r % lines) * 4096 + if i % 5 == 0 { 512 } else { 0 };
        let req = if r.is_multiple_of(3) {
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
            same_plans_after(&mut a, &mut b, 2000, 2048, &mut next, &what);
        }
    }
}

/// `restore_slots_in` (the slots split over threads) leaves the engine exactly as
/// `restore_sorted` over the same lines: same refused lines, lines, masks, classes, dirty
/// state, eviction order, and plans for every request after; also into an engine that held
/// lines once (stale sector masks and free slots), and for capacities not a multiple of 64.
#[test]
fn restore_slots_in_equals_restore_sorted() {
    use tiercache_engine::{EngineError, RestoreLine};
    // `wide`: a third of the keys carry a volume tag (the engine's keys need their high
    // words, which a part filled on its own thread cannot allocate: set once joined).
    for (cap, policy, cleaning, history, wide) in [
        (700u32, "lru", "lba", false, false),
        (700, "slru", "alru", true, false),
        (512, "clock", "acp", false, false),
        (1000, "s3fifo", "lba", true, false),
        (130, "fifo", "alru", false, false),
        (700, "lru", "lba", false, true),
        (1000, "slru", "alru", true, true),
    ] {
        let cfg = EngineConfig {
            capacity_lines: cap as u64,
            mode: Mode::WriteBack,
            policy: policy.into(),
            cleaning: cleaning.parse().unwrap(),
            ..Default::default()
        };
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ cap as u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Slots ascending (about 3/4 of them, some runs of 64 whole), random age order.
        let slots: Vec<u32> = (0..cap)
            .filter(|&s| (s / 64) % 3 == 0 || next() % 4 != 0)
            .collect();
        let mut lines: Vec<RestoreLine> = slots
            .iter()
            .map(|&slot| {
                let r = next();
                let valid = if r % 7 == 0 { 0x0f } else { 0xff };
                RestoreLine {
                    key: (r >> 20) % (1 << 30) * 2 + 1 + u64::from(wide && r % 3 == 0) * (5 << 48),
                    slot,
                    valid,
                    dirty: match r % 5 {
                        0 => valid,
                        1 => valid & 0x03,
                        _ => 0,
                    },
                    class: (r % 11 == 0) as u8 * 2,
                }
            })
            .collect();
        lines.sort_by_key(|l| l.key);
        lines.dedup_by_key(|l| l.key);
        lines.sort_by_key(|l| l.slot);
        lines[3].valid = 0; // refused: bad masks
        let n = lines.len();
        lines[n - 2].dirty = 0x100; // refused: dirty outside valid
        let mut age: Vec<u32> = lines.iter().map(|l| l.slot).collect();
        for i in (1..age.len()).rev() {
            age.swap(i, next() as usize % (i + 1));
        }
        let fresh = |cfg: &EngineConfig| {
            let mut e = Engine::new(cfg.clone()).unwrap();
            if history {
                // Lines cached (partial and dirty ones among them), then dropped.
                for i in 0..cap as u64 / 2 {
                    e.process(&Request::write(i * 3 * 4096 + (i % 3) * 512, 1024))
                        .unwrap();
                }
                let held: Vec<u32> = e.entries().map(|(_, s, _)| s).collect();
                for s in held {
                    e.drop_line(s).unwrap();
                }
                assert_eq!(e.len(), 0);
            }
            e
        };
        for threads in [1usize, 2, 3, 5] {
            let mut a = fresh(&cfg);
            let refused_a: Vec<(u32, String)> = a
                .restore_sorted(lines.clone(), &age)
                .into_iter()
                .map(|(s, e): (u32, EngineError)| (s, e.to_string()))
                .collect();
            assert_eq!(refused_a.len(), 2);
            let what = format!("cap {cap} {policy}/{cleaning} history {history} threads {threads}");
            let mut b = fresh(&cfg);
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let (refused_b, pending) = b.restore_slots_in(threads, |r| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lines
                    .iter()
                    .filter(move |l| r.contains(&l.slot))
                    .copied()
                    .collect::<Vec<_>>()
                    .into_iter()
            });
            b.restore_age(pending, &age);
            assert_eq!(
                calls.into_inner(),
                threads.min((cap as usize).div_ceil(64)),
                "{what}"
            );
            let refused_b: Vec<(u32, String)> = refused_b
                .into_iter()
                .map(|(s, e)| (s, e.to_string()))
                .collect();
            assert_eq!(refused_a, refused_b, "{what}");
            let state = |e: &Engine| {
                e.entries()
                    .map(|(k, s, d)| (k, s, d, e.valid_mask(s), e.dirty_mask(s), e.line_class(s)))
                    .collect::<Vec<_>>()
            };
            assert_eq!(state(&a), state(&b), "{what}");
            assert_eq!(
                (a.len(), a.dirty_lines()),
                (b.len(), b.dirty_lines()),
                "{what}"
            );
            let (mut ca, mut cb) = (Vec::new(), Vec::new());
            a.eviction_candidates(64, &mut ca);
            b.eviction_candidates(64, &mut cb);
            assert_eq!(ca, cb, "{what}: eviction order");
            let mut y = 77u64;
            let mut next = || {
                y ^= y << 13;
                y ^= y >> 7;
                y ^= y << 17;
                y
            };
            same_plans_after(&mut a, &mut b, 1500, 4096, &mut next, &what);
        }
    }
}

/// A restart writes the policy's links (LRU, LIFO, MRU, SLRU) or ring (FIFO, CLOCK) in one
/// pass from the age order (`Policy::insert_all`) instead of one `insert` per line: the
/// policy must end exactly as `restore_line` of each line in that order leaves it. The age
/// order here holds slots to skip (a refused line, a slot with no line, a slot twice), so the
/// bulk form gets the filtered copy; also into engines that held lines once. The whole
/// eviction order is compared (an off-by-one link would show at once), then the plans of
/// requests that evict every restored line.
#[test]
fn bulk_policy_order_equals_inserting_one_by_one() {
    use tiercache_engine::RestoreLine;
    for policy in ["lru", "fifo", "clock", "slru", "lifo", "mru"] {
        for (cap, history, skips) in [
            (300u32, false, false),
            (300, false, true),
            (257, true, true),
        ] {
            let cfg = EngineConfig {
                capacity_lines: cap as u64,
                mode: Mode::WriteBack,
                policy: policy.into(),
                ..Default::default()
            };
            let mut x = 0x51ed_270b_27a1_3f4du64 ^ cap as u64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            // Lines in about 4/5 of the slots, distinct keys, some dirty.
            let slots: Vec<u32> = (0..cap).filter(|_| next() % 5 != 0).collect();
            let mut lines: Vec<RestoreLine> = slots
                .into_iter()
                .enumerate()
                .map(|(i, slot)| RestoreLine {
                    key: i as u64 * 7 + 3,
                    slot,
                    valid: 0xff,
                    dirty: if next() % 4 == 0 { 0xff } else { 0 },
                    class: 0,
                })
                .collect();
            let mut age: Vec<u32> = lines.iter().map(|l| l.slot).collect();
            for i in (1..age.len()).rev() {
                age.swap(i, next() as usize % (i + 1));
            }
            if skips {
                lines[4].valid = 0; // refused
                let empty = (0..cap)
                    .find(|s| lines.iter().all(|l| l.slot != *s))
                    .unwrap();
                age.insert(age.len() / 2, empty); // a slot of no line
                let again = age[age.len() / 3];
                age.push(again); // a slot twice: its first place counts
            }
            let fresh = || {
                let mut e = Engine::new(cfg.clone()).unwrap();
                if history {
                    for i in 0..cap as u64 {
                        e.process(&Request::write(i * 5 * 4096, 4096)).unwrap();
                    }
                    let held: Vec<u32> = e.entries().map(|(_, s, _)| s).collect();
                    for s in held {
                        e.drop_line(s).unwrap();
                    }
                    assert_eq!(e.len(), 0);
                }
                e
            };
            // One by one, in the age order's first places.
            let mut a = fresh();
            let mut seen = vec![false; cap as usize];
            let mut refused_a = 0;
            for &slot in &age {
                if std::mem::replace(&mut seen[slot as usize], true) {
                    continue;
                }
                if let Some(l) = lines.iter().find(|l| l.slot == slot) {
                    refused_a += a
                        .restore_line(l.key, l.slot, l.valid, l.dirty, l.class)
                        .is_err() as usize;
                }
            }
            let mut b = fresh();
            let refused_b = b.restore_sorted(lines.clone(), &age);
            let what = format!("{policy} cap {cap} history {history} skips {skips}");
            assert_eq!(refused_a, refused_b.len(), "{what}");
            assert_eq!(a.len(), b.len(), "{what}");
            let (mut ca, mut cb) = (Vec::new(), Vec::new());
            a.eviction_candidates(cap as u64, &mut ca);
            b.eviction_candidates(cap as u64, &mut cb);
            // (LIFO and MRU give no hint: their victims are compared by the plans below.)
            if !matches!(policy, "lifo" | "mru") {
                assert!(
                    ca.len() > cap as usize / 2,
                    "{what}: {} candidates",
                    ca.len()
                );
            }
            assert_eq!(ca, cb, "{what}: eviction order");
            let mut y = 99u64;
            let mut next = || {
                y ^= y << 13;
                y ^= y >> 7;
                y ^= y << 17;
                y
            };
            same_plans_after(
                &mut a,
                &mut b,
                3 * cap as u64,
                4 * cap as u64,
                &mut next,
                &what,
            );
        }
    }
}
