//! Several cache devices in one engine (`EngineConfig::pool_lines`): balanced placement of
//! lines over the members, a failed member's lines dropped and its slots never used again,
//! a revived member used again, multi-line misses one SSD write per member stripe.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{
    CleaningPolicy, Engine, EngineConfig, Mode, Op, Plan, Pool, Request, Step, STRIPE_LINES,
};

const LINE: u64 = 4096;

fn engine(policy: &str, cleaning: CleaningPolicy, members: &[u64], mode: Mode) -> Engine {
    let cap = Pool::new(members).unwrap().capacity();
    let mut e = Engine::new(EngineConfig {
        capacity_lines: cap,
        pool_lines: members.to_vec(),
        policy: policy.into(),
        mode,
        cleaning,
        ..EngineConfig::default()
    })
    .unwrap();
    if e.needs_oracle() {
        // No future is known in these runs: every line is used again "never".
        e.set_oracle(Vec::new());
    }
    e
}

/// A random request over `span_lines` lines: reads, writes (some of several lines), trims.
fn request(rng: &mut ChaCha8Rng, span_lines: u64, trims: bool) -> Request {
    let line = rng.gen_range(0..span_lines);
    let lines = if rng.gen_bool(0.2) {
        rng.gen_range(2..12)
    } else {
        1
    };
    let op = match rng.gen_range(0..100) {
        0..=49 => Op::Read,
        50..=94 => Op::Write,
        _ if trims => Op::Trim,
        _ => Op::Write,
    };
    let mut r = Request::new(0, op, line * LINE, lines * LINE);
    r.class = rng.gen_range(0..3);
    r
}

fn step(e: &mut Engine, r: &Request) {
    e.process(r).unwrap();
    if e.needs_cleaning() {
        let n = e.cleaning_target();
        e.clean(n);
    }
}

/// Lines cached per member.
fn used(e: &Engine) -> Vec<u64> {
    let mut u = vec![0; e.pool().members()];
    for (_, s, _) in e.entries() {
        u[e.member_of(s)] += 1;
    }
    u
}

fn cleanings() -> [CleaningPolicy; 2] {
    [CleaningPolicy::Lba, CleaningPolicy::Alru]
}

#[test]
fn lines_fill_members_of_unequal_sizes_evenly() {
    for members in [&[1024u64, 640][..], &[512, 1280, 768][..]] {
        let pool = Pool::new(members).unwrap();
        for p in REGISTRY {
            for cleaning in cleanings() {
                let mut e = engine(p.name, cleaning, members, Mode::WriteBack);
                let mut rng = ChaCha8Rng::seed_from_u64(21);
                // A working set of 60 % of the cache: it never fills, so where lines are is
                // the placement's choice, trims included.
                let span = pool.capacity() * 6 / 10;
                for i in 0..20_000 {
                    step(&mut e, &request(&mut rng, span, true));
                    if i % 4999 == 0 {
                        e.check_slots();
                    }
                }
                e.check_slots();
                let u = used(&e);
                let total: u64 = u.iter().sum();
                let fill = total as f64 / pool.capacity() as f64;
                assert!(fill > 0.3, "{}: the run filled only {fill}", p.name);
                for (d, &n) in u.iter().enumerate() {
                    let share = n as f64 / pool.lines(d) as f64;
                    assert!(
                        (share - fill).abs() < 0.05,
                        "{} {cleaning:?} {members:?}: member {d} holds {n} of {} lines \
                         ({share:.3}), the pool {fill:.3} ({u:?})",
                        p.name,
                        pool.lines(d)
                    );
                }
            }
        }
    }
}

#[test]
fn a_failed_member_loses_its_lines_and_is_never_used_until_revived() {
    let members = [640u64, 512, 384];
    for p in REGISTRY {
        for cleaning in cleanings() {
            let mut e = engine(p.name, cleaning, &members, Mode::WriteBack);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            // Over twice the capacity: the cache is full and evicting.
            let span = e.capacity_lines() * 2;
            for _ in 0..5_000 {
                step(&mut e, &request(&mut rng, span, true));
            }
            let d = 1;
            let range = e.pool().range(d);
            let on_d: Vec<(u64, u32, bool)> = e
                .entries()
                .filter(|&(_, s, _)| range.contains(&u64::from(s)))
                .collect();
            assert!(!on_d.is_empty(), "{}: nothing on member {d}", p.name);
            let mut want: Vec<(u32, u64)> = on_d
                .iter()
                .filter(|x| x.2)
                .map(|&(k, s, _)| (s, k))
                .collect();
            let clean = on_d.iter().filter(|x| !x.2).count() as u64;
            let (len, dirty) = (e.len(), e.dirty_lines());
            let loss = e.fail_device(d).unwrap();
            let mut got = loss.uncovered.clone();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(
                got, want,
                "{}: uncovered = the dirty lines of member {d}",
                p.name
            );
            assert_eq!(loss.dropped_clean, clean, "{}: clean lines dropped", p.name);
            assert_eq!(e.len(), len - on_d.len() as u64);
            assert_eq!(e.dirty_lines(), dirty - want.len() as u64);
            for &(k, _, _) in &on_d {
                assert_eq!(e.lookup(k), None, "{}: key {k:#x} still cached", p.name);
            }
            assert_eq!(e.dead_slots(), e.pool().lines(d));
            assert!(e.device_failed(d));
            e.check_slots();
            assert!(e.fail_device(d).is_err(), "failed twice");
            for i in 0..10_000 {
                let r = request(&mut rng, span, true);
                let steps = e.process(&r).unwrap().steps.clone();
                for s in &steps {
                    if let Step::WriteSsd { ssd, len, .. } | Step::ReadSsd { ssd, len, .. } = *s {
                        let (a, b) = (ssd / LINE, (ssd + len).div_ceil(LINE));
                        assert!(
                            b <= range.start || a >= range.end,
                            "{}: SSD step on failed member {d}: {s:?}",
                            p.name
                        );
                    }
                }
                if e.needs_cleaning() {
                    let n = e.cleaning_target();
                    e.clean(n);
                }
                assert!(
                    e.entries().all(|(_, s, _)| e.member_of(s) != d),
                    "{}: a line placed on failed member {d}",
                    p.name
                );
                if i % 2500 == 0 {
                    e.check_slots();
                }
            }
            // The survivors are full: the pool is smaller by the member.
            assert!(e.len() <= e.capacity_lines() - e.pool().lines(d));
            e.revive_device(d).unwrap();
            assert_eq!(e.dead_slots(), 0);
            e.check_slots();
            for _ in 0..5_000 {
                step(&mut e, &request(&mut rng, span, true));
            }
            e.check_slots();
            let back = used(&e)[d];
            assert!(back > 0, "{}: the revived member is not used again", p.name);
        }
    }
}

#[test]
fn failing_is_refused_for_one_device_the_last_live_member_and_pinned_slots() {
    let mut one = engine("lru", CleaningPolicy::Lba, &[256], Mode::WriteBack);
    assert!(one.fail_device(0).is_err());
    let mut e = engine("lru", CleaningPolicy::Lba, &[256, 256], Mode::WriteBack);
    assert!(e.fail_device(2).is_err());
    assert!(e.revive_device(0).is_err(), "revive of a live member");
    // Dirty lines on both members, one write-back in flight over all of them.
    for l in 0..64 {
        e.process(&Request::write(l * LINE, LINE)).unwrap();
    }
    assert!(e.entries().any(|(_, s, _)| e.member_of(s) == 1));
    let t = e.begin_clean(64).expect("dirty lines to clean").ticket;
    let err = e.fail_device(1).unwrap_err().to_string();
    assert!(err.contains("write-back in flight"), "{err}");
    assert_eq!(e.dead_slots(), 0, "a refused failure changes nothing");
    e.complete_writeback(t, &[]);
    e.fail_device(1).unwrap();
    let err = e.fail_device(0).unwrap_err().to_string();
    assert!(err.contains("last live member"), "{err}");
    e.check_slots();
}

#[test]
fn a_multi_line_miss_is_one_ssd_write_per_member_stripe() {
    let mut e = engine("lru", CleaningPolicy::Lba, &[256, 256], Mode::WriteThrough);
    let n = 4 * u64::from(STRIPE_LINES);
    let plan: Plan = e.process(&Request::write(0, n * LINE)).unwrap().clone();
    let writes: Vec<(u64, u64)> = plan
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::WriteSsd { ssd, len, .. } => Some((ssd / LINE, len / LINE)),
            _ => None,
        })
        .collect();
    // Stripes alternate between the members: 4 stripes, each one write of 8 lines.
    assert_eq!(writes.len(), 4, "{writes:?}");
    let mut members = Vec::new();
    for &(slot, lines) in &writes {
        assert_eq!(lines, u64::from(STRIPE_LINES), "{writes:?}");
        let (d, local) = e.pool().locate(slot);
        assert_eq!(local % u64::from(STRIPE_LINES), 0);
        members.push(d);
    }
    assert_eq!(members, vec![0, 1, 0, 1]);
}

#[test]
fn one_member_places_lines_as_before() {
    // `pool_lines` of one device = no pool: slots in order from 0, nothing rounded.
    let mut a = engine("lru", CleaningPolicy::Lba, &[300], Mode::WriteBack);
    let mut b = Engine::new(EngineConfig {
        capacity_lines: 300,
        mode: Mode::WriteBack,
        ..EngineConfig::default()
    })
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..3000 {
        let r = request(&mut rng, 500, true);
        let sa = a.process(&r).unwrap().steps.clone();
        assert_eq!(sa, b.process(&r).unwrap().steps);
    }
    assert_eq!(
        a.entries().collect::<Vec<_>>(),
        b.entries().collect::<Vec<_>>()
    );
}

#[test]
fn a_capacity_that_is_not_the_pools_is_refused() {
    let err = Engine::new(EngineConfig {
        capacity_lines: 1000,
        pool_lines: vec![1000, 300],
        ..EngineConfig::default()
    })
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("1152"), "{err}");
    assert!(Engine::new(EngineConfig {
        capacity_lines: 200,
        pool_lines: vec![100, 100],
        ..EngineConfig::default()
    })
    .is_err());
}

#[test]
fn a_restart_restores_into_member_slots_and_keeps_the_free_lists_consistent() {
    let members = [256u64, 384];
    let mut e = engine("lru", CleaningPolicy::Lba, &members, Mode::WriteBack);
    // Scattered slots on both members, restored one at a time and in bulk.
    for (i, slot) in [3u32, 300, 17, 600, 255, 256].into_iter().enumerate() {
        e.restore_line((i as u64 + 1) * 7, slot, 0xff, 0, 0)
            .unwrap();
    }
    e.check_slots();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for i in 0..4000 {
        step(&mut e, &request(&mut rng, 1200, true));
        if i % 500 == 0 {
            e.check_slots();
        }
    }
    e.check_slots();
    // A restore into a failed member's slot is refused.
    let mut e = engine("lru", CleaningPolicy::Lba, &members, Mode::WriteBack);
    e.fail_device(0).unwrap();
    assert!(e.restore_line(7, 5, 0xff, 0, 0).is_err());
    e.restore_line(7, 300, 0xff, 0, 0).unwrap();
    e.check_slots();
}
