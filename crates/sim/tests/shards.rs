//! `sim --shards N` on a real trace: one shard counts exactly as one engine, and 2 or 4
//! shards keep the hit ratio within 0.5 % (absolute) of one engine's for LRU, FIFO, CLOCK
//! and SLRU (issue 16's bound; `scripts/shard_hit_ratio.sh` runs every shared trace).

use std::sync::Arc;
use tiercache_engine::{CacheSize, EngineConfig, Mode, Request, SeqCutoff};
use tiercache_sim::{footprint_lines, simulate, simulate_sharded, Input, SimSpec};

/// cloudPhysicsIO (113,872 requests, 269,210 lines: 131 granules of 1 MiB per shard at 8
/// shards) in memory, when the shared traces are beside the checkout.
fn cloudphysics() -> Option<Input> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/cloudPhysicsIO/cloudPhysicsIO.vscsi");
    if !p.exists() {
        return None;
    }
    let t = Input::Trace {
        path: p,
        format: None,
        options: Default::default(),
    };
    let reqs: Vec<Request> = t.open().unwrap().collect::<anyhow::Result<_>>().unwrap();
    Some(Input::Memory {
        name: "cloudPhysicsIO".into(),
        requests: Arc::new(reqs),
    })
}

fn spec(input: &Input, policy: &str, shards: u32) -> SimSpec {
    SimSpec {
        input: input.clone(),
        cache_size: CacheSize::Percent(5.0),
        engine: EngineConfig {
            policy: policy.into(),
            shards,
            ..Default::default()
        },
        log: None,
    }
}

#[test]
fn one_shard_counts_as_one_engine_on_cloudphysics() {
    let Some(input) = cloudphysics() else {
        tiercache_testskip::skip!("../shared/traces/cloudPhysicsIO not found");
        return;
    };
    let fp = footprint_lines(&input, 4096).unwrap();
    // Write-back with cleaning and a sequential cutoff: every stage the sharded type wraps.
    let mut s = spec(&input, "slru", 1);
    s.engine.mode = Mode::WriteBack;
    s.engine.dirty_high = 0.2;
    s.engine.dirty_low = 0.1;
    s.engine.seq_cutoff = SeqCutoff {
        read_bytes: 256 << 10,
        write_bytes: 256 << 10,
    };
    let a = simulate(&s, Some(fp), None).unwrap();
    let b = simulate_sharded(&s, Some(fp), None).unwrap();
    assert!(a.counters.write_backs > 0 && a.counters.bypasses.seq_cutoff > 0);
    assert_eq!(a.counters, b.counters);
    assert_eq!(a.classes, b.classes);
    assert_eq!(
        (a.dirty_lines_at_end, a.index_bytes, b.shards),
        (b.dirty_lines_at_end, b.index_bytes, 1)
    );
}

#[test]
fn two_and_four_shards_stay_within_half_a_percent_on_cloudphysics() {
    let Some(input) = cloudphysics() else {
        tiercache_testskip::skip!("../shared/traces/cloudPhysicsIO not found");
        return;
    };
    let fp = footprint_lines(&input, 4096).unwrap();
    for policy in ["lru", "fifo", "clock", "slru"] {
        let one = simulate(&spec(&input, policy, 1), Some(fp), None).unwrap();
        for n in [2, 4] {
            let r = simulate(&spec(&input, policy, n), Some(fp), None).unwrap();
            assert_eq!(r.shards, n);
            let sh = r.sharding.as_ref().unwrap();
            assert!(sh.split_requests > 0, "{policy} x{n}: nothing split");
            assert_eq!(r.capacity_lines, one.capacity_lines);
            assert_eq!(
                r.requests, one.requests,
                "{policy} x{n}: split requests count once"
            );
            assert_eq!(r.line_accesses, one.line_accesses);
            r.counters.check().unwrap();
            let d = r.hit_ratio - one.hit_ratio;
            assert!(
                d.abs() <= 0.005,
                "{policy} x{n}: hit ratio {:.4} vs {:.4} with one shard",
                r.hit_ratio,
                one.hit_ratio
            );
        }
    }
}

#[test]
fn sharding_refuses_what_it_does_not_run() {
    let reqs: Vec<Request> = (0..64u64).map(|i| Request::read(i * 4096, 4096)).collect();
    let input = Input::Memory {
        name: "mem".into(),
        requests: Arc::new(reqs),
    };
    let mut s = spec(&input, "lru", 2);
    s.engine.ram_cache = 1 << 20;
    let e = simulate(&s, None, None).unwrap_err().to_string();
    assert!(e.contains("--ram-cache"), "{e}");
    // A cache smaller than the shard count: refused with a fixed granule, run on fewer
    // shards (here one) with the automatic layout.
    let mut s = spec(&input, "lru", 4);
    s.cache_size = CacheSize::Bytes(3 * 4096);
    s.engine.shard_granule = 1 << 20;
    let e = format!("{:#}", simulate(&s, None, None).unwrap_err());
    assert!(e.contains("cannot be split into 4 shards"), "{e}");
    s.engine.shard_granule = 0;
    let r = simulate(&s, None, None).unwrap();
    assert_eq!(r.shards, 1);
    assert_eq!(r.sharding.unwrap().requested_shards, 4);
}

/// A volume table with `--shards`: every volume's figures are there, a request split
/// between shards counts once in its volume (each volume counts exactly its own requests,
/// as with one engine), the volumes add up to the totals, and a volume's own mode is obeyed
/// by every shard.
#[test]
fn shards_keep_per_volume_figures() {
    use tiercache_engine::{Op, VolumeConfig};
    // Two volumes, reads and writes of 1..8 lines (many cross granules), repeated so they hit.
    let mut x = 7u64;
    let reqs: Vec<Request> = (0..20_000u64)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let line = (x >> 33) % 3000;
            let len = 4096 * (1 + (x >> 20) % 8);
            let op = if (x >> 12).is_multiple_of(4) {
                Op::Write
            } else {
                Op::Read
            };
            let mut r = Request::new(i, op, line * 4096, len);
            r.volume = ((x >> 40) % 2) as u32;
            r
        })
        .collect();
    let mut own = [0u64; 2];
    for r in &reqs {
        own[r.volume as usize] += 1;
    }
    let input = Input::Memory {
        name: "two volumes".into(),
        requests: Arc::new(reqs),
    };
    let mut s = spec(&input, "lru", 1);
    s.cache_size = CacheSize::Percent(20.0);
    s.engine.mode = Mode::WriteBack;
    let mut b = VolumeConfig::new(1, "b");
    b.mode = Some(Mode::WriteThrough);
    s.engine.volumes = vec![VolumeConfig::new(0, "a"), b];
    let one = simulate(&s, None, None).unwrap();
    s.engine.shards = 2;
    s.engine.shard_granule = 16 * 1024;
    let two = simulate(&s, None, None).unwrap();
    let split = two.sharding.as_ref().unwrap().split_requests;
    assert!(split > 1000, "{split} split requests");
    for r in [&one, &two] {
        assert_eq!(r.volumes.len(), 2, "shards {}", r.shards);
        let mut sum = tiercache_engine::Counters::default();
        for (v, n) in r.volumes.iter().zip(own) {
            assert_eq!(v.requests, n, "shards {} volume {}", r.shards, v.name);
            assert_eq!(v.counters.reads + v.counters.writes, n);
            v.counters.check().unwrap();
            sum += &v.counters;
        }
        assert_eq!(sum, r.counters, "shards {}", r.shards);
        // Volume b is write-through in every shard: none of its lines is dirty.
        assert_eq!(
            (r.volumes[1].name.as_str(), r.volumes[1].dirty_lines),
            ("b", 0)
        );
        assert!(r.volumes[0].dirty_lines > 0);
    }
    // Two shards stay close to one engine per volume too.
    for (a, b) in one.volumes.iter().zip(&two.volumes) {
        assert!(
            (a.hit_ratio - b.hit_ratio).abs() < 0.02,
            "{}: {} vs {}",
            a.name,
            a.hit_ratio,
            b.hit_ratio
        );
    }
}
