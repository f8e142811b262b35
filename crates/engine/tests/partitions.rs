//! Every registered policy under a class table with partitions and a bypass class: capacity
//! holds, counters add up, map and policy agree, the `never` class is never cached, and runs are
//! deterministic.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{ClassTable, Engine, EngineConfig, Mode, Op, Request};

const TABLE: &str = "version = 1
[[class]]
id = 1
name = \"meta\"
priority = 0
allocation = \"always\"
min_share = 0.25
[[class]]
id = 2
name = \"bulk\"
priority = 5
allocation = \"conditional\"
max_share = 0.2
[[class]]
id = 3
name = \"never\"
priority = 9
allocation = \"never\"
";

fn stream(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let class = rng.gen_range(0..4u8);
            let space: u64 = if class == 1 { 256 << 10 } else { 8 << 20 };
            let op = if rng.gen_bool(0.6) {
                Op::Read
            } else {
                Op::Write
            };
            let mut r = Request::new(
                i as u64,
                op,
                rng.gen_range(0..space) & !4095,
                4096 * rng.gen_range(1..4),
            );
            r.class = class;
            r
        })
        .collect()
}

#[test]
fn every_policy_keeps_partition_invariants() {
    let table = Arc::new(ClassTable::parse(TABLE, "t").unwrap());
    let reqs = stream(5, 20_000);
    for info in REGISTRY {
        for mode in [Mode::WriteThrough, Mode::WriteBack] {
            let run = || {
                let mut cfg = EngineConfig {
                    capacity_lines: 200,
                    policy: info.name.into(),
                    mode,
                    ..Default::default()
                };
                cfg.policy_params.classes = Some(Arc::clone(&table));
                let mut e = Engine::new(cfg).unwrap();
                if e.needs_oracle() {
                    e.set_oracle(Engine::next_use_oracle(4096, &reqs));
                }
                for r in &reqs {
                    e.process(r).unwrap();
                    assert!(e.len() <= 200, "{}: over capacity", info.name);
                    if e.needs_cleaning() {
                        let n = e.cleaning_target();
                        e.clean(n);
                    }
                }
                let c = e.counters();
                c.check()
                    .unwrap_or_else(|m| panic!("{} {mode}: {m}", info.name));
                assert_eq!(c.insertions - c.evictions - c.invalidations, e.len());
                let never = e.class_counters(3);
                assert_eq!(
                    never.insertions, 0,
                    "{}: a never class was cached",
                    info.name
                );
                assert!(never.bypasses.class > 0, "{}", info.name);
                for (k, s, _) in e.entries() {
                    assert_eq!(e.lookup(k), Some(s));
                }
                (c, e.entries().collect::<Vec<_>>())
            };
            assert_eq!(run(), run(), "{} {mode}: not deterministic", info.name);
        }
    }
}

/// `Engine::set_class_table` in the middle of a stream, for every online policy: a table
/// with partitions and a `never` class replaces none (and back), the cache keeps its
/// lines, capacity holds, counters add up, map and policy agree (every cached line can still
/// be evicted: the stream goes on through many evictions), and the `never` class inserts
/// nothing while its table is in force.
#[test]
fn every_policy_takes_a_class_table_live() {
    let table = Arc::new(ClassTable::parse(TABLE, "t").unwrap());
    let reqs = stream(9, 12_000);
    for info in REGISTRY {
        let mut e = Engine::new(EngineConfig {
            capacity_lines: 200,
            policy: info.name.into(),
            mode: Mode::WriteBack,
            ..Default::default()
        })
        .unwrap();
        if e.needs_oracle() {
            assert!(e.set_class_table(Some(Arc::clone(&table))).is_err());
            continue;
        }
        for (i, chunk) in reqs.chunks(4_000).enumerate() {
            let t = (i == 1).then(|| Arc::clone(&table));
            let before = e.len();
            let never_before = e.class_counters(3).insertions;
            e.set_class_table(t).unwrap();
            assert_eq!(e.len(), before, "{}: lines lost in the reload", info.name);
            for r in chunk {
                e.process(r).unwrap();
                assert!(e.len() <= 200, "{}: over capacity", info.name);
                if e.needs_cleaning() {
                    let n = e.cleaning_target();
                    e.clean(n);
                }
            }
            if i == 1 {
                assert_eq!(
                    e.class_counters(3).insertions,
                    never_before,
                    "{}: a never class was cached",
                    info.name
                );
            }
            let c = e.counters();
            c.check()
                .unwrap_or_else(|m| panic!("{} chunk {i}: {m}", info.name));
            assert_eq!(c.insertions - c.evictions - c.invalidations, e.len());
            assert!(c.evictions > 0, "{}", info.name);
            for (k, s, _) in e.entries() {
                assert_eq!(e.lookup(k), Some(s));
            }
        }
    }
}
