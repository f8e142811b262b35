//! Quick engine speed check (hit-ratio mode, requests in memory):
//!     cargo run --release -p tiercache-engine --example speed -- [policy] [cache_pct] [requests]
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use std::time::Instant;
use tiercache_engine::{Engine, EngineConfig, Request};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let policy = args.get(1).cloned().unwrap_or_else(|| "lru".into());
    let pct: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let n_reqs: usize = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let n_blocks = 1_000_000u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let z = Zipf::new(n_blocks, 1.0).unwrap();
    let reqs: Vec<Request> = (0..n_reqs)
        .map(|_| Request::read((z.sample(&mut rng) as u64 - 1) * 4096, 4096))
        .collect();
    let mut e = Engine::new(EngineConfig {
        capacity_lines: (n_blocks as f64 * pct / 100.0) as u64,
        policy,
        ..Default::default()
    })
    .unwrap();
    e.set_record_plan(false);
    let t = Instant::now();
    for r in &reqs {
        e.process(r).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    let c = e.counters();
    println!(
        "{} {pct}%: {:.2} M req/s, hit ratio {:.4}, index {:.1} B/line",
        e.policy_name(),
        reqs.len() as f64 / s / 1e6,
        c.hit_ratio(),
        e.index_bytes() as f64 / e.capacity_lines() as f64
    );
}
