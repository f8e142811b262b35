//! `Engine::eviction_candidates` (the live volume unmaps these lines' records ahead): a hint
//! that changes no decision, whose first slot is the next victim for the policies that give
//! one (LRU, FIFO, CLOCK, SLRU), and no longer than the evictions the free slots leave.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{Engine, EngineConfig, Mode, Request};

const CAP: u64 = 32;

fn engine(policy: &str) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: CAP,
        line_size: 4096,
        group_size: 4096,
        policy: policy.into(),
        mode: Mode::WriteBack,
        ..Default::default()
    })
    .unwrap()
}

fn requests(seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..3000)
        .map(|_| {
            let line = if rng.gen_bool(0.6) {
                rng.gen_range(0..24)
            } else {
                rng.gen_range(0..400)
            };
            if rng.gen_bool(0.4) {
                Request::write(line * 4096, 4096)
            } else {
                Request::read(line * 4096, 4096)
            }
        })
        .collect()
}

#[test]
fn the_hint_changes_nothing_and_names_the_next_victim() {
    for info in REGISTRY {
        if info.name == "belady" {
            continue; // needs an oracle
        }
        let (mut a, mut b) = (engine(info.name), engine(info.name));
        let exact = matches!(info.name, "lru" | "fifo" | "clock" | "slru");
        let (mut hinted, mut checked) = (0, 0);
        for req in requests(7) {
            let mut cand = Vec::new();
            b.eviction_candidates(8, &mut cand);
            // Only as many as the evictions still needed once the free slots are used.
            let free = CAP - b.len();
            assert!(
                cand.len() as u64 <= 8u64.saturating_sub(free),
                "{}: {} candidates with {free} free slots",
                info.name,
                cand.len()
            );
            for &s in &cand {
                assert!(
                    b.slot_key(s).is_some(),
                    "{}: hint names an empty slot",
                    info.name
                );
            }
            hinted += !cand.is_empty() as u64;
            let key = req.offset / 4096;
            let evicts = b.len() == CAP && b.lookup(key).is_none();
            let pa = a.process(&req).unwrap().steps.clone();
            let pb = b.process(&req).unwrap().steps.clone();
            assert_eq!(pa, pb, "{}: the hint changed a plan", info.name);
            if exact && evicts {
                if let (Some(&first), Some(slot)) = (cand.first(), b.lookup(key)) {
                    assert_eq!(
                        first, slot,
                        "{}: first candidate is not the victim",
                        info.name
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(a.counters(), b.counters(), "{}", info.name);
        if exact {
            assert!(
                hinted > 1000 && checked > 500,
                "{}: {hinted} {checked}",
                info.name
            );
        }
    }
}
