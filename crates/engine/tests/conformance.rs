//! The shared conformance test every registered policy must pass: capacity never exceeded,
//! counters add up, map and policy agree, deterministic for a seed, and Belady's misses are a
//! lower bound for every other policy on the same stream.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{Admission, Counters, Engine, EngineConfig, Mode, Op, Request};

/// A mixed stream: skewed offsets, reads and writes of many sizes (partial lines, spans),
/// some trims and flushes, several classes and two volumes.
fn stream(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let hot = rng.gen_bool(0.7);
            let space: u64 = if hot { 64 << 10 } else { 4 << 20 };
            let offset = rng.gen_range(0..space) & !511;
            let len = match rng.gen_range(0..10) {
                0 => 512,
                1..=5 => 4096,
                6..=8 => 4096 * rng.gen_range(1..5),
                _ => rng.gen_range(1..20_000),
            };
            let op = match rng.gen_range(0..100) {
                0..=59 => Op::Read,
                60..=96 => Op::Write,
                97..=98 => Op::Trim,
                _ => Op::Flush,
            };
            let mut r = Request::new(i as u64 * 1000, op, offset, len);
            r.class = rng.gen_range(0..4);
            r.volume = rng.gen_range(0..2);
            r.fua = op == Op::Write && rng.gen_bool(0.05);
            r
        })
        .collect()
}

fn run(
    policy: &str,
    mode: Mode,
    cap: u64,
    reqs: &[Request],
    oracle: bool,
) -> (Counters, Vec<(u64, u32, bool)>, usize) {
    run_with(policy, mode, cap, reqs, oracle, EngineConfig::default())
}

/// [`run`] over `base`'s other settings (cleaning policy, clean-victim window).
fn run_with(
    policy: &str,
    mode: Mode,
    cap: u64,
    reqs: &[Request],
    oracle: bool,
    base: EngineConfig,
) -> (Counters, Vec<(u64, u32, bool)>, usize) {
    let cfg = EngineConfig {
        capacity_lines: cap,
        policy: policy.into(),
        mode,
        ..base
    };
    let mut e = Engine::new(cfg).unwrap();
    if oracle || e.needs_oracle() {
        e.set_oracle(Engine::next_use_oracle(4096, reqs));
    }
    for (i, r) in reqs.iter().enumerate() {
        e.process(r).unwrap();
        assert!(
            e.len() <= cap,
            "{policy}: {} lines cached, capacity {cap}",
            e.len()
        );
        if e.needs_cleaning() {
            let n = e.cleaning_target();
            e.clean(n);
        }
        for v in &e.volume_shares().to_vec() {
            let lines = e
                .entries()
                .filter(|&(k, _, _)| k >> 48 == u64::from(v.volume))
                .count() as f64;
            assert!(
                lines <= (v.max * cap as f64).floor(),
                "{policy} {mode}: volume {} holds {lines} lines, max share {} of {cap}",
                v.volume,
                v.max
            );
        }
        if i % 97 == 0 {
            check_consistent(&e, policy);
        }
    }
    check_consistent(&e, policy);
    let c = e.counters();
    c.check().unwrap_or_else(|m| panic!("{policy} {mode}: {m}"));
    assert_eq!(
        c.insertions - c.evictions - c.invalidations,
        e.len(),
        "{policy}: occupancy"
    );
    (c, e.entries().collect(), e.index_bytes())
}

fn check_consistent(e: &Engine, policy: &str) {
    let entries: Vec<_> = e.entries().collect();
    assert_eq!(entries.len() as u64, e.len(), "{policy}: entries vs len");
    let dirty = entries.iter().filter(|x| x.2).count() as u64;
    assert_eq!(dirty, e.dirty_lines(), "{policy}: dirty count");
    for (k, s, _) in entries {
        assert_eq!(
            e.lookup(k),
            Some(s),
            "{policy}: key {k:#x} not found at slot {s}"
        );
    }
}

#[test]
fn every_policy_keeps_the_contract_in_every_mode() {
    let reqs = stream(7, 6000);
    for p in REGISTRY {
        for mode in Mode::ALL {
            for cap in [0, 1, 7, 64, 300] {
                run(p.name, mode, cap, &reqs, false);
            }
        }
    }
}

/// The same contract with volume partitions (`--volume-share`): one volume bounded, or both
/// (one with a minimum), every policy, mode and capacity; no volume above its maximum after
/// any request (checked in [`run_with`]).
#[test]
fn every_policy_keeps_the_contract_with_volume_partitions() {
    use tiercache_engine::policy::VolumeShare;
    let reqs = stream(17, 3000);
    let share = |volume, min, max| VolumeShare { volume, min, max };
    for shares in [
        vec![share(1, 0.0, 0.3)],
        vec![share(0, 0.4, 0.9), share(1, 0.1, 0.5)],
    ] {
        for p in REGISTRY {
            for mode in Mode::ALL {
                for cap in [0, 1, 7, 64, 300] {
                    let mut base = EngineConfig::default();
                    base.policy_params.volume_shares = shares.clone();
                    run_with(p.name, mode, cap, &reqs, false, base);
                }
            }
        }
    }
}

#[test]
fn every_policy_keeps_the_contract_preferring_clean_victims_under_every_cleaning_policy() {
    use tiercache_engine::CleaningPolicy;
    let reqs = stream(13, 4000);
    for p in REGISTRY {
        for cleaning in CleaningPolicy::ALL {
            for cap in [1, 7, 64, 300] {
                let base = EngineConfig {
                    clean_victim_window: 8,
                    cleaning,
                    cleaning_age: 500,
                    ..Default::default()
                };
                run_with(p.name, Mode::WriteBack, cap, &reqs, false, base);
            }
        }
    }
    // Where the policy gives a hint (LRU), fewer evictions have to write back.
    let dirty_evictions = |w| {
        let base = EngineConfig {
            clean_victim_window: w,
            dirty_high: 0.5,
            dirty_low: 0.3,
            ..Default::default()
        };
        run_with("lru", Mode::WriteBack, 64, &reqs, false, base)
            .0
            .dirty_evictions
    };
    let (off, on) = (dirty_evictions(0), dirty_evictions(8));
    assert!(
        on < off,
        "clean victims preferred: {on} dirty evictions, off: {off}"
    );
}

#[test]
fn every_policy_is_deterministic() {
    let reqs = stream(11, 4000);
    for p in REGISTRY {
        let a = run(p.name, Mode::WriteBack, 50, &reqs, false);
        let b = run(p.name, Mode::WriteBack, 50, &reqs, false);
        // Memory too: a randomly seeded hash map makes a ghost list's size vary by run.
        assert_eq!(
            a, b,
            "{}: two runs differ (counters, lines or index bytes)",
            p.name
        );
    }
}

#[test]
fn belady_is_a_lower_bound() {
    if tiercache_engine::policy::lookup("belady").is_none() {
        panic!("belady is not registered");
    }
    for seed in [1, 2, 3] {
        let reqs = stream(seed, 5000);
        for cap in [8, 40, 200] {
            let (opt, _, _) = run("belady", Mode::WriteThrough, cap, &reqs, true);
            for p in REGISTRY {
                let (c, _, _) = run(p.name, Mode::WriteThrough, cap, &reqs, false);
                assert!(
                    opt.line_misses <= c.line_misses,
                    "seed {seed} cap {cap}: belady {} misses > {} {}",
                    opt.line_misses,
                    p.name,
                    c.line_misses
                );
            }
        }
    }
}

#[test]
fn policies_differ_where_they_should() {
    // A loop one line larger than the cache: LRU and FIFO miss always, MRU and LIFO do not.
    let reqs: Vec<Request> = (0..50)
        .flat_map(|_| (0..11u64).map(|i| Request::read(i * 4096, 4096)))
        .collect();
    let misses = |p: &str| run(p, Mode::WriteThrough, 10, &reqs, false).0.line_misses;
    assert_eq!(misses("lru"), 550);
    assert_eq!(misses("fifo"), 550);
    assert!(misses("mru") < 200, "mru {}", misses("mru"));
    assert!(misses("lifo") < 200, "lifo {}", misses("lifo"));
    let _ = Admission::ALWAYS;
}

#[test]
fn rng_helper_is_seeded() {
    assert_eq!(stream(3, 50), stream(3, 50));
    let mut r = ChaCha8Rng::seed_from_u64(0);
    let _: u8 = r.gen();
}

/// `set_dirty_evictions_blocked` (an executor whose backing device fails writes): for every
/// policy, with the switch on no plan contains a write-back, every dirty line stays cached
/// and dirty (its masks only grow by writes), misses take free slots or clean victims and are
/// bypassed (`no_capacity`) when there are none, capacity and counters hold; with the switch
/// off again cleaning writes every dirty line back.
#[test]
fn blocked_dirty_evictions_never_write_back_in_any_policy() {
    use tiercache_engine::Step;
    let reqs = stream(23, 3000);
    for p in REGISTRY {
        let cfg = EngineConfig {
            capacity_lines: 64,
            policy: p.name.into(),
            mode: Mode::WriteBack,
            ..Default::default()
        };
        let mut e = Engine::new(cfg).unwrap();
        if e.needs_oracle() {
            e.set_oracle(Engine::next_use_oracle(4096, &reqs));
        }
        // Warm up unblocked, with cleaning, so some lines are clean and some dirty.
        for r in &reqs[..1000] {
            e.process(r).unwrap();
        }
        e.set_dirty_evictions_blocked(true);
        let bypass_before = e.counters().bypasses.no_capacity;
        let mut dirty: Vec<(u64, u64)> = dirty_lines(&e);
        let (mut bypassed, mut full) = (false, false);
        for r in &reqs[1000..] {
            let plan = e.process(r).unwrap();
            assert!(
                !plan
                    .steps
                    .iter()
                    .any(|s| matches!(s, Step::WriteBack { .. })),
                "{}: a plan wrote back while dirty evictions were blocked: {:?}",
                p.name,
                plan.steps
            );
            assert!(e.len() <= 64, "{}: over capacity", p.name);
            for &(k, d) in &dirty {
                let Some(s) = e.lookup(k) else {
                    // Only a trim may drop a dirty line.
                    assert!(r.op == Op::Trim, "{}: dirty line {k:#x} evicted", p.name);
                    continue;
                };
                let now = e.dirty_mask(s);
                assert!(
                    now & d == d || r.op == Op::Trim,
                    "{}: dirty sectors of {k:#x} lost ({d:#x} -> {now:#x})",
                    p.name
                );
            }
            full |= e.dirty_lines() == 64;
            dirty = dirty_lines(&e);
            bypassed |= e.counters().bypasses.no_capacity > bypass_before;
        }
        check_consistent(&e, p.name);
        e.counters()
            .check()
            .unwrap_or_else(|m| panic!("{}: {m}", p.name));
        // A cache full of dirty lines can only have bypassed later misses.
        assert!(
            !full || bypassed,
            "{}: the cache filled with dirty lines but no miss was bypassed",
            p.name
        );
        e.set_dirty_evictions_blocked(false);
        while e.dirty_lines() > 0 {
            e.clean(64);
        }
        check_consistent(&e, p.name);
    }
}

fn dirty_lines(e: &Engine) -> Vec<(u64, u64)> {
    e.entries()
        .filter(|x| x.2)
        .map(|(k, s, _)| (k, e.dirty_mask(s)))
        .collect()
}

/// `clean` is `begin_clean` + `complete_writeback`: for every policy and cleaning policy the
/// batch's plan is what `clean` plans on the same state, its lines are exactly the slots the
/// plan reads (dirty lines pending, nothing else), its spans exactly the backing ranges it
/// writes, and completing at once leaves the engine as `clean` does (same counters, lines
/// and memory, nothing pinned).
#[test]
fn begin_and_complete_equal_clean_in_every_policy_and_cleaning_policy() {
    use tiercache_engine::{CleaningPolicy, Step};
    let reqs = stream(31, 2500);
    for p in REGISTRY {
        for cleaning in CleaningPolicy::ALL {
            let cfg = EngineConfig {
                capacity_lines: 96,
                policy: p.name.into(),
                mode: Mode::WriteBack,
                cleaning,
                cleaning_age: 300,
                rewrite_chunk: 64 << 10,
                rewrite_min_runs: 2,
                volume_bytes: Some(8 << 20),
                dirty_high: 0.3,
                dirty_low: 0.1,
                ..Default::default()
            };
            let mut a = Engine::new(cfg.clone()).unwrap();
            let mut b = Engine::new(cfg).unwrap();
            if a.needs_oracle() {
                a.set_oracle(Engine::next_use_oracle(4096, &reqs));
                b.set_oracle(Engine::next_use_oracle(4096, &reqs));
            }
            let mut batches = 0;
            for r in &reqs {
                a.process(r).unwrap();
                b.process(r).unwrap();
                if !a.needs_cleaning() {
                    continue;
                }
                let n = a.cleaning_target().min(40);
                let want = a.clean(n).steps.clone();
                let Some(batch) = b.begin_clean(n) else {
                    assert!(want.is_empty(), "{}/{cleaning}: no batch", p.name);
                    continue;
                };
                batches += 1;
                assert_eq!(
                    batch.plan.steps, want,
                    "{}/{cleaning}: plans differ",
                    p.name
                );
                let mut spans: Vec<(u32, u64, u64)> = Vec::new();
                for s in &want {
                    let (vol, hdd, len) = match *s {
                        Step::WriteBack { vol, hdd, len, ssd } => {
                            let slot = (ssd / 4096) as u32;
                            assert!(
                                batch.lines.iter().any(|l| l.slot == slot),
                                "{}/{cleaning}: slot {slot} read but not pinned",
                                p.name
                            );
                            (vol, hdd, len)
                        }
                        Step::CopyHdd { vol, hdd, len } => (vol, hdd, len),
                        ref s => panic!("{}/{cleaning}: {s:?} in a cleaning plan", p.name),
                    };
                    match spans.last_mut() {
                        Some(l) if l.0 == vol && l.1 + l.2 == hdd => l.2 += len,
                        _ => spans.push((vol, hdd, len)),
                    }
                }
                assert_eq!(batch.spans, &spans[..], "{}/{cleaning}: spans", p.name);
                let t = batch.ticket;
                let lines = batch.lines.to_vec();
                let pending = lines.iter().filter(|l| l.pending != 0).count();
                for l in &lines {
                    assert!(b.is_pinned(l.slot));
                    assert_eq!(
                        b.dirty_mask(l.slot),
                        0,
                        "{}: pending line still dirty",
                        p.name
                    );
                }
                let done = b.complete_writeback(t, &[]);
                assert_eq!(done.cleaned as usize, pending, "{}/{cleaning}", p.name);
                assert_eq!((done.failed, done.redirtied, done.freed), (0, 0, 0));
                assert_eq!(b.writebacks_in_flight(), 0);
            }
            assert!(batches > 0, "{}/{cleaning}: never cleaned", p.name);
            assert_eq!(a.counters(), b.counters(), "{}/{cleaning}", p.name);
            assert_eq!(
                a.entries().collect::<Vec<_>>(),
                b.entries().collect::<Vec<_>>(),
                "{}/{cleaning}",
                p.name
            );
            assert_eq!(a.index_bytes(), b.index_bytes());
            assert_eq!(b.inflight_counters(), Default::default());
        }
    }
}

/// While a write-back is in flight, for every policy: its slots are never a victim, never
/// reused for another line, never offered by `eviction_candidates`; a trimmed one stays out
/// of use (a zombie) until completion; capacity and counters hold, misses that found no
/// unpinned victim are bypassed, and after completion the engine is consistent and cleans
/// everything.
#[test]
fn a_pinned_slot_is_never_a_victim_or_free_or_a_candidate_in_any_policy() {
    let reqs = stream(37, 3000);
    let (mut substituted, mut bypassed, mut freed) = (0, 0, 0);
    for p in REGISTRY {
        for clean_victim_window in [0, 8] {
            let cfg = EngineConfig {
                capacity_lines: 48,
                policy: p.name.into(),
                mode: Mode::WriteBack,
                clean_victim_window,
                dirty_high: 1.0,
                dirty_low: 1.0,
                ..Default::default()
            };
            let mut e = Engine::new(cfg).unwrap();
            if e.needs_oracle() {
                e.set_oracle(Engine::next_use_oracle(4096, &reqs));
            }
            for r in &reqs[..800] {
                e.process(r).unwrap();
            }
            let mut rounds = 0;
            for chunk in reqs[800..].chunks(220) {
                let Some(b) = e.begin_clean(16) else {
                    continue;
                };
                rounds += 1;
                let (t, lines) = (b.ticket, b.lines.to_vec());
                let mut gone = std::collections::HashSet::new();
                for r in chunk {
                    let plan = e.process(r).unwrap().steps.clone();
                    assert!(
                        e.len() + e.zombie_slots() <= 48,
                        "{}: over capacity",
                        p.name
                    );
                    for l in &lines {
                        assert!(e.is_pinned(l.slot), "{}: slot {} unpinned", p.name, l.slot);
                        match e.slot_key(l.slot) {
                            Some(k) => assert_eq!(k, l.key, "{}: pinned slot reused", p.name),
                            // Only a trim may drop it (and then for good while pinned).
                            None => assert!(
                                r.op == Op::Trim || gone.contains(&l.slot),
                                "{}: pinned line {:#x} evicted by {r:?}",
                                p.name,
                                l.key
                            ),
                        }
                        // A slot that lost its line is not filled again while pinned.
                        if e.slot_key(l.slot).is_none() {
                            assert!(
                                !plan.iter().any(|s| matches!(*s,
                                    tiercache_engine::Step::WriteSsd { ssd, .. }
                                    | tiercache_engine::Step::Populate { ssd, .. }
                                    if ssd / 4096 == l.slot as u64)),
                                "{}: zombie slot {} written",
                                p.name,
                                l.slot
                            );
                        }
                    }
                    gone.extend(
                        lines
                            .iter()
                            .filter(|l| e.slot_key(l.slot).is_none())
                            .map(|l| l.slot),
                    );
                    let mut cands = Vec::new();
                    e.eviction_candidates(48, &mut cands);
                    assert!(
                        cands.iter().all(|s| !e.is_pinned(*s)),
                        "{}: a pinned slot is an eviction candidate",
                        p.name
                    );
                }
                let zombies = e.zombie_slots();
                let done = e.complete_writeback(t, &[]);
                assert_eq!(done.freed, zombies, "{}", p.name);
                assert_eq!(e.zombie_slots(), 0);
                check_consistent(&e, p.name);
            }
            assert!(rounds > 0, "{}: nothing was dirty", p.name);
            e.counters()
                .check()
                .unwrap_or_else(|m| panic!("{}: {m}", p.name));
            let c = e.counters();
            assert_eq!(c.insertions - c.evictions - c.invalidations, e.len());
            while e.dirty_lines() > 0 {
                e.clean(64);
            }
            check_consistent(&e, p.name);
            let ic = e.inflight_counters();
            substituted += ic.victim_pinned;
            bypassed += ic.bypass_pinned;
            freed += ic.zombies_freed;
        }
    }
    // The stream did exercise each path.
    assert!(
        substituted > 0 && bypassed > 0 && freed > 0,
        "pinned victims replaced {substituted}, bypassed {bypassed}, zombies freed {freed}"
    );
}
