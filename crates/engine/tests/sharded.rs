//! The sharded engine (`Sharded`): with one shard it is the engine itself (same plans,
//! counters and cached lines, request by request, in every policy, mode, validity, cleaning
//! policy, with sequential cutoff and group admission); with several, every line lives in
//! its owner shard's slot range, split requests count once, the counter invariants hold,
//! and the request-level stages see the whole request stream.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::sharded::shard_seed;
use tiercache_engine::{
    Admission, CleaningPolicy, Counters, Engine, EngineConfig, Mode, Op, Request, SeqCutoff,
    Sharded, Step, Validity,
};

const LINE: u64 = 4096;
const MIB: u64 = 1 << 20;

/// Lines of 12 MiB of two volumes: whole lines, partial and multi-line requests (some
/// crossing 1 MiB granules), sequential runs, FUA writes, trims and flushes.
fn stream(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seq_next = 0u64;
    (0..n)
        .map(|i| {
            let line = rng.gen_range(0..3 * 1024u64);
            let (offset, len) = match rng.gen_range(0..12) {
                0 => (
                    line * LINE + 512 * rng.gen_range(0..7u64),
                    512 * rng.gen_range(1..3u64),
                ),
                1 => (line * LINE, LINE * rng.gen_range(2..40u64)),
                // Across a granule boundary.
                2 => (
                    rng.gen_range(1..12u64) * MIB - LINE * rng.gen_range(1..4u64) - 512,
                    LINE * rng.gen_range(1..6u64),
                ),
                // A sequential run (the sequential cutoff's case), 64 KiB at a time.
                3 | 4 => {
                    let o = seq_next;
                    seq_next = (seq_next + 64 * 1024) % (12 * MIB);
                    (o, 64 * 1024)
                }
                _ => (line * LINE, LINE),
            };
            let op = match rng.gen_range(0..40) {
                0 => Op::Trim,
                1 => Op::Flush,
                x if x < 16 => Op::Write,
                _ => Op::Read,
            };
            let mut r = Request::new(i as u64, op, offset, len);
            r.fua = op == Op::Write && rng.gen_range(0..8) == 0;
            r.class = rng.gen_range(0..3);
            r.volume = rng.gen_range(0..2);
            r
        })
        .collect()
}

fn configs() -> Vec<(String, EngineConfig)> {
    let mut out = Vec::new();
    for p in REGISTRY {
        for mode in [Mode::WriteThrough, Mode::WriteBack] {
            out.push((
                format!("{} {mode:?}", p.name),
                EngineConfig {
                    capacity_lines: 700,
                    policy: p.name.to_string(),
                    mode,
                    ..Default::default()
                },
            ));
        }
    }
    for cleaning in [
        CleaningPolicy::Lba,
        CleaningPolicy::Acp,
        CleaningPolicy::Alru,
    ] {
        out.push((
            format!("lru wb {cleaning:?} seq-cutoff nhit line-validity"),
            EngineConfig {
                capacity_lines: 700,
                mode: Mode::WriteBack,
                cleaning,
                cleaning_age: 500,
                dirty_high: 0.3,
                dirty_low: 0.1,
                group_size: 64 * 1024,
                admission: Admission {
                    read_threshold: 2,
                    write_threshold: 1,
                },
                seq_cutoff: SeqCutoff {
                    read_bytes: 256 * 1024,
                    write_bytes: 512 * 1024,
                },
                validity: Validity::Line,
                ..Default::default()
            },
        ));
    }
    out
}

fn lines_of_engine(e: &Engine) -> Vec<(u64, u64, u64, u64)> {
    e.entries()
        .map(|(k, s, _)| (k, s as u64, e.valid_mask(s), e.dirty_mask(s)))
        .collect()
}

#[test]
fn one_shard_is_the_engine_bit_for_bit() {
    let reqs = stream(11, 5000);
    for (name, cfg) in configs() {
        let mut one = Engine::new(cfg.clone()).unwrap();
        let mut sh = Sharded::new(cfg.clone()).unwrap();
        if one.needs_oracle() {
            one.set_oracle(Engine::next_use_oracle(cfg.line_size, &reqs));
            sh.set_oracle_for(&reqs);
        }
        for (i, r) in reqs.iter().enumerate() {
            let a = one.process(r).unwrap().clone();
            let b = sh.process(r).unwrap().clone();
            assert_eq!(
                (a.buf_start, a.buf_len, &a.steps),
                (b.buf_start, b.buf_len, &b.steps),
                "{name}: plans differ at request {i} {r:?}"
            );
            let pa = if one.needs_cleaning() {
                let t = one.cleaning_target();
                one.clean(t).steps.clone()
            } else {
                Vec::new()
            };
            let pb = sh.clean_due().steps.clone();
            assert_eq!(pa, pb, "{name}: cleaning differs after request {i}");
            if i % 500 == 0 {
                assert_eq!(one.counters(), sh.counters(), "{name}: at request {i}");
            }
        }
        assert_eq!(one.counters(), sh.counters(), "{name}");
        for k in 0..3 {
            assert_eq!(
                *one.class_counters(k),
                sh.class_counters(k),
                "{name} class {k}"
            );
        }
        assert_eq!(one.index_bytes(), sh.index_bytes(), "{name}");
        let b: Vec<_> = sh
            .entries()
            .map(|(k, s, _)| {
                let e = sh.shard(0);
                (k, s as u64, e.valid_mask(s), e.dirty_mask(s))
            })
            .collect();
        assert_eq!(lines_of_engine(&one), b, "{name}");
        assert_eq!(sh.split_requests(), 0);
    }
}

/// Shards 2..4 over the same stream: every cached line is in its owner's slot range, every
/// SSD address of every plan in the owner's range of its line, split requests counted
/// once (so `requests` and the request-level totals match the stream), invariants hold,
/// and line accesses are those of one engine (sharding changes where lines go, not which
/// lines a request touches).
#[test]
fn shards_keep_lines_in_their_range_and_count_requests_once() {
    let reqs = stream(12, 5000);
    let (reads, writes, trims) = reqs.iter().fold((0, 0, 0), |(r, w, t), q| match q.op {
        Op::Read => (r + 1, w, t),
        Op::Write => (r, w + 1, t),
        Op::Trim => (r, w, t + 1),
        Op::Flush => (r, w, t),
    });
    for (name, base) in configs() {
        let mut one = Engine::new(base.clone()).unwrap();
        if one.needs_oracle() {
            one.set_oracle(Engine::next_use_oracle(base.line_size, &reqs));
        }
        for r in &reqs {
            one.process(r).unwrap();
        }
        for n in 2..=4u32 {
            let cfg = EngineConfig {
                shards: n,
                shard_granule: MIB,
                ..base.clone()
            };
            let mut sh = Sharded::new(cfg).unwrap();
            if sh.needs_oracle() {
                sh.set_oracle_for(&reqs);
            }
            assert_eq!(sh.capacity_lines(), base.capacity_lines);
            let line_bytes = base.line_size;
            let range = |sh: &Sharded, i: usize| {
                let lo = sh.slot_base(i) * line_bytes;
                let hi = (sh.slot_base(i) + sh.shard(i).capacity_lines()) * line_bytes;
                lo..hi
            };
            for (i, r) in reqs.iter().enumerate() {
                let plan = sh.process(r).unwrap().clone();
                for s in &plan.steps {
                    let (ssd, vol, hdd) = match *s {
                        Step::ReadSsd { ssd, buf, .. } | Step::WriteSsd { ssd, buf, .. } => {
                            (ssd, r.volume, plan.buf_start + buf)
                        }
                        Step::Populate { ssd, vol, hdd, .. }
                        | Step::WriteBack { ssd, vol, hdd, .. } => (ssd, vol, hdd),
                        _ => continue,
                    };
                    let key = Engine::line_key(vol, hdd / line_bytes);
                    let owner = sh.shard_of(key);
                    assert!(
                        range(&sh, owner).contains(&ssd),
                        "{name} x{n}: request {i} {r:?}: step {s:?} outside shard {owner}'s slots"
                    );
                }
                sh.clean_due();
                if i % 1000 == 0 {
                    sh.counters().check().unwrap();
                }
            }
            let c = sh.counters();
            c.check().unwrap_or_else(|e| panic!("{name} x{n}: {e}"));
            assert_eq!(
                (c.reads, c.writes, c.trims, c.requests),
                (reads, writes, trims, reqs.len() as u64),
                "{name} x{n}"
            );
            assert_eq!(c.line_accesses, one.counters().line_accesses, "{name} x{n}");
            assert!(
                sh.split_requests() > 0,
                "{name} x{n}: the stream splits some"
            );
            for (k, slot, _) in sh.entries() {
                let owner = sh.shard_of(k);
                assert!(
                    range(&sh, owner).contains(&(slot as u64 * line_bytes)),
                    "{name} x{n}: key {k:#x} in slot {slot}, not in shard {owner}'s range"
                );
                assert_eq!(sh.lookup(k), Some(slot));
            }
        }
    }
}

/// Two granules on different shards and one read across them: counted as one request,
/// a full miss, then a full hit.
#[test]
fn a_split_request_counts_once_by_all_its_lines() {
    let cfg = EngineConfig {
        capacity_lines: 1000,
        shards: 4,
        shard_granule: MIB,
        ..Default::default()
    };
    let mut sh = Sharded::new(cfg).unwrap();
    let g = sh.granule_bytes();
    assert_eq!(g, MIB);
    let owner = |sh: &Sharded, off: u64| sh.shard_of(Engine::line_key(0, off / LINE));
    let b = (1..100u64)
        .map(|i| i * g)
        .find(|&b| owner(&sh, b - g) != owner(&sh, b))
        .expect("adjacent granules on different shards");
    let r = Request::new(0, Op::Read, b - 2 * LINE, 4 * LINE);
    let p = sh.process(&r).unwrap().clone();
    assert_eq!((p.buf_start, p.buf_len), (b - 2 * LINE, 4 * LINE));
    let c = sh.counters();
    assert_eq!(
        (c.requests, c.reads, c.full_misses, c.line_misses),
        (1, 1, 1, 4)
    );
    assert_eq!(c.read_requests.full_misses, 1);
    // The HDD reads of both pieces merge into one (the plan is in address order).
    let hdd: Vec<_> = p
        .steps
        .iter()
        .filter(|s| matches!(s, Step::ReadHdd { .. }))
        .collect();
    assert_eq!(hdd.len(), 1, "{:?}", p.steps);
    sh.process(&r).unwrap();
    let c = sh.counters();
    assert_eq!((c.requests, c.full_hits, c.line_hits), (2, 1, 4));
    assert_eq!(c.read_requests.hits, 1);
    // A read of 1 line hit + 1 line missed on each side: one partial hit.
    let r2 = Request::new(0, Op::Read, b - 3 * LINE, 6 * LINE);
    sh.process(&r2).unwrap();
    let c = sh.counters();
    assert_eq!((c.requests, c.partial_hits), (3, 1));
    assert_eq!(c.read_requests.partial_misses, 1);
    c.check().unwrap();
    assert_eq!(sh.split_requests(), 3);
}

/// A sequential stream crossing many granules is cut off as one stream: the front stage
/// sees whole requests in order, so with 4 shards exactly the lines one engine bypasses are
/// bypassed (per-shard stream tables would see a stream broken at every granule).
#[test]
fn sequential_cutoff_sees_the_whole_stream() {
    let cfg = EngineConfig {
        capacity_lines: 4096,
        seq_cutoff: SeqCutoff {
            read_bytes: 3 * MIB / 2,
            write_bytes: 0,
        },
        ..Default::default()
    };
    let reqs: Vec<Request> = (0..256u64)
        .map(|i| Request::new(i, Op::Read, i * 128 * 1024, 128 * 1024))
        .collect();
    let mut one = Engine::new(cfg.clone()).unwrap();
    let mut sh = Sharded::new(EngineConfig { shards: 4, ..cfg }).unwrap();
    for r in &reqs {
        one.process(r).unwrap();
        sh.process(r).unwrap();
    }
    let (a, b) = (one.counters(), sh.counters());
    assert!(a.bypasses.seq_cutoff > 0);
    assert_eq!(a.bypasses.seq_cutoff, b.bypasses.seq_cutoff);
    assert_eq!(a.insertions, b.insertions);
}

#[test]
fn refusals_and_seeds() {
    // With a fixed granule a cache smaller than the shards is refused; the automatic
    // layout runs fewer shards (here one).
    let e = Sharded::new(EngineConfig {
        capacity_lines: 3,
        shards: 4,
        shard_granule: MIB,
        ..Default::default()
    })
    .err()
    .unwrap();
    let auto = Sharded::new(EngineConfig {
        capacity_lines: 3,
        shards: 4,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(auto.shard_count(), 1);
    assert!(
        e.to_string()
            .contains("3 lines cannot be split into 4 shards"),
        "{e}"
    );
    let e = Sharded::new(EngineConfig {
        capacity_lines: 3000,
        shards: 0,
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("shards 0 must be between 1 and"),
        "{e}"
    );
    // No cache at all: allowed (the no-cache baseline), everything bypasses.
    let mut z = Sharded::new(EngineConfig {
        shards: 4,
        ..Default::default()
    })
    .unwrap();
    z.process(&Request::new(0, Op::Read, 0, 3 * MIB)).unwrap();
    assert_eq!(z.counters().bypasses.no_capacity, 3 * MIB / LINE);
    // A request the engine refuses is refused whole.
    let mut sh = Sharded::new(EngineConfig {
        capacity_lines: 100,
        shards: 2,
        ..Default::default()
    })
    .unwrap();
    let mut r = Request::new(0, Op::Read, 0, LINE);
    r.class = 40;
    assert!(sh.process(&r).is_err());
    assert_eq!(shard_seed(42, 0), 42);
    assert_ne!(shard_seed(42, 1), shard_seed(42, 2));
    // The granule grows with a larger group or rewrite chunk.
    let cfg = EngineConfig {
        group_size: 4 * MIB,
        ..Default::default()
    };
    assert_eq!(Sharded::granule_of(&cfg), 4 * MIB);
    // A smaller fixed granule takes effect with a larger rewrite chunk (each shard's chunk
    // rewrite is capped at it), but not below a group, nor below the ACP chunk without
    // chunk rewrite.
    let small = EngineConfig {
        shard_granule: 64 << 10,
        ..Default::default()
    };
    assert_eq!(Sharded::granule_of(&small), 64 << 10);
    let acp = EngineConfig {
        cleaning: CleaningPolicy::Acp,
        ..small.clone()
    };
    assert_eq!(Sharded::granule_of(&acp), 64 << 10);
    let acp = EngineConfig {
        rewrite_chunk: 0,
        ..acp
    };
    assert_eq!(Sharded::granule_of(&acp), MIB);
    let bad = EngineConfig {
        shard_granule: 3000,
        ..small
    };
    assert!(bad.validate().unwrap_err().contains("shard_granule"));
}

/// A volume with its own sequential cutoff (a volume table): the front stage decides with
/// the volume's cutoff, as the engine's `process` does, so one shard is still the engine.
#[test]
fn the_front_stage_uses_the_volume_s_sequential_cutoff() {
    let mut vol = tiercache_engine::VolumeConfig::new(1, "seq");
    vol.seq_cutoff = Some(SeqCutoff {
        read_bytes: 256 * 1024,
        write_bytes: 0,
    });
    let cfg = EngineConfig {
        capacity_lines: 4096,
        volumes: vec![vol],
        ..Default::default()
    };
    let mut reqs: Vec<Request> = (0..64u64)
        .map(|i| Request::new(i, Op::Read, i * 64 * 1024, 64 * 1024))
        .collect();
    for r in &mut reqs {
        r.volume = 1;
    }
    let mut one = Engine::new(cfg.clone()).unwrap();
    let mut sh = Sharded::new(cfg).unwrap();
    for r in &reqs {
        one.process(r).unwrap();
        sh.process(r).unwrap();
    }
    let (a, b) = (one.counters(), sh.counters());
    assert!(a.bypasses.seq_cutoff > 0);
    assert_eq!(
        (a.bypasses.seq_cutoff, a.insertions),
        (b.bypasses.seq_cutoff, b.insertions)
    );
}

/// A shard that takes no request still ages its dirty lines (alru staleness): the lines
/// written to one shard are due for cleaning after `cleaning_age` requests to the other,
/// as in one engine (the shard's own clock lagged, so it was not reported due until it took
/// a request).
#[test]
fn a_shard_without_requests_reports_its_stale_lines_due() {
    let cfg = EngineConfig {
        capacity_lines: 256,
        shards: 2,
        shard_granule: LINE,
        mode: Mode::WriteBack,
        cleaning: CleaningPolicy::Alru,
        cleaning_age: 100,
        ..Default::default()
    };
    let mut one = Engine::new(EngineConfig {
        shards: 1,
        shard_granule: 0,
        ..cfg.clone()
    })
    .unwrap();
    let mut sh = Sharded::new(cfg).unwrap();
    assert_eq!(sh.shard_count(), 2);
    let owner = |sh: &Sharded, line: u64| sh.shard_of(Engine::line_key(0, line));
    let a = 0u64;
    let b = (1..64u64)
        .find(|&l| owner(&sh, l) != owner(&sh, a))
        .expect("a line of the other shard");
    let mut reqs = vec![Request::new(0, Op::Write, a * LINE, LINE)];
    reqs.extend((1..=150u64).map(|i| Request::new(i, Op::Read, b * LINE, LINE)));
    for (i, r) in reqs.iter().enumerate() {
        one.process(r).unwrap();
        sh.process(r).unwrap();
        assert_eq!(
            (sh.needs_cleaning(), sh.cleaning_target()),
            (one.needs_cleaning(), one.cleaning_target()),
            "after request {i}"
        );
    }
    assert!(sh.needs_cleaning(), "the written line is 150 requests old");
    assert_eq!(sh.cleaning_target(), 1);
    // And cleaning writes it back.
    let p = sh.clean_due().steps.clone();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(sh.dirty_lines(), 0);
}

/// Per-volume counters count a request split between shards once, by the outcome of all
/// its lines, as the class counters do: the volumes add up to the totals, and a 2-line read
/// over two shards is one read of its volume.
#[test]
fn a_split_request_counts_once_in_its_volume() {
    use tiercache_engine::VolumeConfig;
    let cfg = EngineConfig {
        capacity_lines: 700,
        shards: 4,
        shard_granule: MIB,
        mode: Mode::WriteBack,
        volumes: vec![VolumeConfig::new(0, "a"), VolumeConfig::new(1, "b")],
        ..Default::default()
    };
    let mut sh = Sharded::new(cfg).unwrap();
    let owner = |sh: &Sharded, off: u64| sh.shard_of(Engine::line_key(1, off / LINE));
    let g = MIB;
    let b = (1..100u64)
        .map(|i| i * g)
        .find(|&b| owner(&sh, b - g) != owner(&sh, b))
        .expect("adjacent granules on different shards");
    let mut r = Request::new(0, Op::Read, b - LINE, 2 * LINE);
    r.volume = 1;
    sh.process(&r).unwrap();
    assert_eq!(sh.split_requests(), 1);
    let v = sh.volume_stats();
    let one = v.iter().find(|v| v.id == 1).expect("volume 1 listed");
    let c = one.counters;
    assert_eq!(
        (c.requests, c.reads, c.full_misses, c.line_misses),
        (1, 1, 1, 2),
        "{c:?}"
    );
    assert_eq!(c.read_requests.full_misses, 1);
    sh.process(&r).unwrap();
    let c = sh.volume_stats()[1].counters;
    assert_eq!((c.requests, c.reads, c.full_hits), (2, 2, 1), "{c:?}");
    assert_eq!(c.read_requests.hits, 1);
    // A long mixed stream: the volumes add up to the totals, field by field.
    for r in stream(29, 4000) {
        sh.process(&r).unwrap();
        sh.clean_due();
    }
    assert!(sh.split_requests() > 50, "{}", sh.split_requests());
    let mut sum = Counters::default();
    for v in sh.volume_stats() {
        v.counters.check().unwrap();
        sum += &v.counters;
    }
    assert_eq!(sum, sh.counters());
}
