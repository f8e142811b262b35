//! A sweep takes the RAM tier of each cell (`EngineConfig::ram_cache`): before, the one-pass
//! sweep fed its engines without one and reported no `ram` figures (a silent ignore).

use tiercache_engine::{CacheSize, EngineConfig};
use tiercache_sim::{run_sweep, simulate, Input, SimSpec};

fn spec(ram_mb: u64, policy: &str) -> SimSpec {
    let mut engine = EngineConfig {
        policy: policy.into(),
        ..Default::default()
    };
    engine.ram_cache = ram_mb << 20;
    SimSpec {
        input: Input::Workload {
            spec: "zipf:theta=0.9,wss=64MiB,requests=20000".parse().unwrap(),
            seed: 1,
        },
        cache_size: CacheSize::Bytes(16 << 20),
        engine,
        log: None,
    }
}

#[test]
fn a_sweep_runs_each_cell_with_its_ram_tier() {
    let specs = vec![
        spec(1, "lru"),
        spec(8, "lru"),
        spec(8, "arc"),
        spec(0, "lru"),
    ];
    let cells = run_sweep(specs.clone(), &|_| {}).unwrap();
    for (c, s) in cells.iter().zip(&specs) {
        let r = c.result.as_ref().unwrap();
        let single = simulate(s, None, None).unwrap();
        match (&r.ram, &single.ram) {
            (None, None) => assert_eq!(s.engine.ram_cache, 0),
            (Some(a), Some(b)) => {
                assert!(a.ram_hits > 0, "{a:?}");
                assert_eq!(
                    (a.ram_hits, a.ssd_hits, a.misses),
                    (b.ram_hits, b.ssd_hits, b.misses)
                );
            }
            (a, b) => panic!(
                "ram_cache {}: the sweep's RAM figures {a:?}, a single run's {b:?}",
                s.engine.ram_cache
            ),
        }
        assert_eq!(
            r.counters, single.counters,
            "ram_cache {}",
            s.engine.ram_cache
        );
    }
}
