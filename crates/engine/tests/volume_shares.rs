//! Volume partitions (`--volume-share NAME=MIN:MAX`) under random streams over three volumes,
//! every policy, random bounds and modes: after every request no volume holds more than its
//! maximum, and no volume is pushed below its minimum (or further below it) by another
//! volume's lines. Also with class partitions inside (nested).

use proptest::prelude::*;
use std::sync::Arc;
use tiercache_engine::engine::LINE_BITS;
use tiercache_engine::policy::{VolumeShare, REGISTRY};
use tiercache_engine::{ClassTable, Engine, EngineConfig, Mode, Request};

const CAP: u64 = 40;

fn lines(e: &Engine) -> [u64; 3] {
    let mut n = [0u64; 3];
    for (k, _, _) in e.entries() {
        n[(k >> LINE_BITS) as usize] += 1;
    }
    n
}

fn bounds() -> impl Strategy<Value = Option<(f64, f64)>> {
    prop_oneof![
        Just(None),
        (0.0f64..0.9, 0.0f64..1.0).prop_map(|(min, x)| Some((min, x))),
    ]
}

/// Three volumes' bounds, the minimums scaled to add up to at most 95 % (so that while every
/// partition is at or below its minimum a slot is free: no victim is needed).
fn three_bounds() -> impl Strategy<Value = Vec<Option<(f64, f64)>>> {
    prop::collection::vec(bounds(), 3).prop_map(|v| {
        let sum: f64 = v.iter().flatten().map(|b| b.0).sum();
        let k = if sum > 0.95 { 0.95 / sum } else { 1.0 };
        v.into_iter()
            .map(|b| b.map(|(min, x)| (min * k, min * k + x * (1.0 - min * k))))
            .collect()
    })
}

const TABLE: &str = "version = 1\n[[class]]\nid = 1\nname = \"meta\"\npriority = 0\nallocation = \"always\"\nmin_share = 0.1\n[[class]]\nid = 2\nname = \"bulk\"\npriority = 5\nallocation = \"conditional\"\nmax_share = 0.2\n";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn max_and_min_hold_after_every_victim_choice(
        policy in 0..REGISTRY.len(),
        shares in three_bounds(),
        classes in any::<bool>(),
        write_back in any::<bool>(),
        reqs in prop::collection::vec((0u32..3, 0u64..120, 1u64..4, any::<bool>(), 0u8..3), 1..400),
    ) {
        let policy = REGISTRY[policy].name;
        let mut cfg = EngineConfig {
            capacity_lines: CAP,
            policy: policy.into(),
            mode: if write_back { Mode::WriteBack } else { Mode::WriteThrough },
            ..Default::default()
        };
        cfg.policy_params.volume_shares = shares
            .iter()
            .enumerate()
            .filter_map(|(v, b)| b.map(|(min, max)| VolumeShare { volume: v as u32, min, max }))
            .collect();
        if classes {
            cfg.policy_params.classes = Some(Arc::new(ClassTable::parse(TABLE, "t").unwrap()));
        }
        let mut e = Engine::new(cfg).unwrap();
        if e.needs_oracle() {
            let rs: Vec<Request> = reqs.iter().map(|&(v, l, n, w, _)| {
                let mut r = if w { Request::write(l * 4096, n * 4096) } else { Request::read(l * 4096, n * 4096) };
                r.volume = v;
                r
            }).collect();
            e.set_oracle(Engine::next_use_oracle(4096, &rs));
        }
        let min_of = |v: usize| shares[v].map_or(0, |(min, _)| (min * CAP as f64).floor() as u64);
        let max_of = |v: usize| shares[v].map_or(CAP, |(_, max)| (max * CAP as f64).floor() as u64);
        for (i, &(v, l, n, w, class)) in reqs.iter().enumerate() {
            let before = lines(&e);
            let mut r = if w { Request::write(l * 4096, n * 4096) } else { Request::read(l * 4096, n * 4096) };
            r.volume = v;
            r.class = class;
            r.time_ns = i as u64;
            e.process(&r).unwrap();
            let after = lines(&e);
            for w in 0..3 {
                prop_assert!(after[w] <= max_of(w), "{policy}: volume {w} holds {} lines, max {}", after[w], max_of(w));
                if w != v as usize {
                    let floor = before[w].min(min_of(w));
                    prop_assert!(after[w] >= floor,
                        "{policy}: volume {v}'s request took volume {w} from {} to {} lines, min {}",
                        before[w], after[w], min_of(w));
                }
            }
            prop_assert!(e.len() <= CAP);
        }
    }
}
