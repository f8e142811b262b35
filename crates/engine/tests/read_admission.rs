//! `Engine::set_read_admission_blocked` (an executor whose backing syncs fail, so that reusing
//! a slot would need a sync that fails): for every policy and mode, with the switch on no
//! read plan changes a slot that did not hold the read's line (no population, no eviction,
//! no write-back), cached lines are still read from the cache, reads that miss are served
//! from the backing device (`bypasses.no_capacity`, or the class gate's bypass first).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{Engine, EngineConfig, Mode, Op, Request, Step};

fn stream(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let offset = rng.gen_range(0..(2u64 << 20)) & !511;
            let len = match rng.gen_range(0..4) {
                0 => 512,
                1 | 2 => 4096,
                _ => 4096 * rng.gen_range(1..5),
            };
            let op = if rng.gen_bool(0.6) {
                Op::Read
            } else {
                Op::Write
            };
            Request::new(i as u64 * 1000, op, offset, len)
        })
        .collect()
}

#[test]
fn blocked_read_admission_never_changes_another_line_s_slot() {
    let reqs = stream(5, 3000);
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        for p in REGISTRY {
            let cfg = EngineConfig {
                capacity_lines: 64,
                policy: p.name.into(),
                mode,
                ..Default::default()
            };
            let mut e = Engine::new(cfg).unwrap();
            if e.needs_oracle() {
                e.set_oracle(Engine::next_use_oracle(4096, &reqs));
            }
            for r in &reqs[..1000] {
                e.process(r).unwrap();
            }
            e.set_read_admission_blocked(true);
            assert!(e.read_admission_blocked());
            let (mut hits, mut bypassed) = (0, 0);
            for r in &reqs[1000..] {
                let before: BTreeMap<u64, u32> = e.entries().map(|(k, s, _)| (k, s)).collect();
                let plan = e.process(r).unwrap();
                if r.op != Op::Read {
                    continue;
                }
                let mut missed = false;
                for s in &plan.steps {
                    match *s {
                        Step::ReadSsd { .. } => hits += 1,
                        Step::ReadHdd { .. } => missed = true,
                        // Missing sectors of a cached line of the read, filled in place.
                        Step::Populate { hdd, .. } => {
                            let key = Engine::line_key(0, hdd / 4096);
                            assert!(
                                before.contains_key(&key),
                                "{} {mode:?}: a read populated line {key:#x}, not cached before",
                                p.name
                            );
                        }
                        Step::WriteSsd { ssd, .. } => assert!(
                            before.values().any(|&x| x as u64 == ssd / 4096),
                            "{} {mode:?}: a read wrote slot {} of no cached line",
                            p.name,
                            ssd / 4096
                        ),
                        _ => panic!("{} {mode:?}: a read planned {s:?}", p.name),
                    }
                }
                let after: BTreeMap<u64, u32> = e.entries().map(|(k, s, _)| (k, s)).collect();
                assert_eq!(
                    before, after,
                    "{} {mode:?}: a read changed the cache",
                    p.name
                );
                bypassed += missed as u32;
            }
            assert!(
                hits > 0 && bypassed > 0,
                "{} {mode:?}: {hits} hits, {bypassed} bypassed",
                p.name
            );
            e.counters()
                .check()
                .unwrap_or_else(|m| panic!("{} {mode:?}: {m}", p.name));
            // Off again: read misses take the policy's usual path (LRU, a plain policy,
            // admits them).
            e.set_read_admission_blocked(false);
            assert!(!e.read_admission_blocked());
            if p.name == "lru" {
                let ins = e.counters().insertions;
                for k in 0..64u64 {
                    e.process(&Request::read((64 << 20) + k * 4096, 4096))
                        .unwrap();
                }
                assert!(e.counters().insertions > ins, "{mode:?}: lru admits again");
            }
        }
    }
}
