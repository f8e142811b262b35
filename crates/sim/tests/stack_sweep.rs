//! LRU size sweeps from one stack-distance pass (`tiercache_sim::stack_sweep`): every field
//! of every result equals the engines' (wall time aside), on synthetic requests and on the
//! shared real traces (`../shared/traces` beside the checkout; skipped with a message when
//! missing), at sizes from 1 line to past the footprint; configurations and inputs the
//! stack model does not derive run the engines.

mod common;
use common::traces_dir;

use std::sync::Arc;
use tiercache_engine::{Admission, CacheSize, EngineConfig, Mode, Op, Request, Validity};
use tiercache_sim::stack_sweep::{METHOD_ENGINES, METHOD_STACK};
use tiercache_sim::sweep::SweepOptions;
use tiercache_sim::{footprint_lines, run_sweep_with, Input, SimResult, SimSpec};

fn memory(name: &str, reqs: Vec<Request>) -> Input {
    Input::Memory {
        name: name.into(),
        requests: Arc::new(reqs),
    }
}

fn trace(dir: &std::path::Path, rel: &str) -> Input {
    Input::Trace {
        path: dir.join(rel),
        format: None,
        options: Default::default(),
    }
}

/// One spec per size (in lines of `cfg.line_size`, or percentages), the rest from `cfg`.
fn specs(input: &Input, cfg: &EngineConfig, sizes: &[CacheSize]) -> Vec<SimSpec> {
    sizes
        .iter()
        .map(|&cache_size| SimSpec {
            input: input.clone(),
            cache_size,
            engine: cfg.clone(),
            log: None,
        })
        .collect()
}

/// Sizes from 1 line past the footprint: 1, 2, 3, shares of the footprint, footprint - 1,
/// the footprint, twice it, and 10 % of it as a percentage.
fn sizes(fp: u64, ls: u64) -> Vec<CacheSize> {
    let mut lines = vec![
        1,
        2,
        3,
        fp / 100,
        fp / 20,
        fp / 10,
        fp / 3,
        fp / 2,
        fp - 1,
        fp,
        2 * fp,
    ];
    lines.retain(|&l| l > 0);
    lines.dedup();
    let mut s: Vec<CacheSize> = lines
        .into_iter()
        .map(|l| CacheSize::Bytes(l * ls))
        .collect();
    s.push(CacheSize::Percent(10.0));
    s
}

/// A result as JSON without what depends on the run's timing or its method.
fn figures(r: &SimResult) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in ["wall_s", "requests_per_s", "method"] {
        o.remove(k);
    }
    v
}

/// Runs the sweep both ways; asserts the default took `want` and that every field of every
/// result equals the engines'. Returns the stack results.
fn compare(what: &str, specs: Vec<SimSpec>, want: &str) -> Vec<SimResult> {
    let n = specs.len();
    let run = |per_engine| {
        run_sweep_with(
            specs.clone(),
            SweepOptions {
                per_engine,
                ..Default::default()
            },
        )
        .unwrap()
        .into_iter()
        .map(|c| c.result.unwrap())
        .collect::<Vec<_>>()
    };
    let fast = run(false);
    let slow = run(true);
    assert_eq!(fast.len(), n);
    for (a, b) in fast.iter().zip(&slow) {
        assert_eq!(a.method, Some(want), "{what}: method");
        assert_eq!(
            b.method,
            Some(METHOD_ENGINES),
            "{what}: --per-engine method"
        );
        let (fa, fb) = (figures(a), figures(b));
        if fa != fb {
            let (oa, ob) = (fa.as_object().unwrap(), fb.as_object().unwrap());
            let diff: Vec<String> = oa
                .iter()
                .filter(|(k, v)| ob.get(*k) != Some(v))
                .map(|(k, v)| format!("{k}: {} {v} vs engine {}", a.method.unwrap(), ob[k]))
                .collect();
            panic!(
                "{what} at {} ({} lines): {}",
                a.cache_size,
                a.capacity_lines,
                diff.join("; ")
            );
        }
    }
    fast
}

fn line_validity() -> EngineConfig {
    EngineConfig {
        validity: Validity::Line,
        ..EngineConfig::default()
    }
}

/// Reads and writes, one line or many, aligned or not, of 0 bytes, flushes: every kind of
/// request the stack pass derives, over a skewed set of 4 KiB lines.
fn mixed(n: u64) -> Vec<Request> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            // xorshift64: two thirds of the requests in 211 hot blocks, the rest in 3000.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let block = if i % 3 == 0 {
                state % 3000
            } else {
                state % 211
            };
            let off = block * 4096 + if i % 7 == 0 { 512 * (i % 8) } else { 0 };
            let len = match i % 11 {
                0 => 0,
                1..=3 => 4096 * (1 + i % 4),
                4 => 1000 + i % 3000,
                _ => 4096,
            };
            let op = match i % 13 {
                0 => Op::Flush,
                1..=4 => Op::Write,
                _ => Op::Read,
            };
            let mut r = Request::new(i, op, off, if op == Op::Flush { 0 } else { len });
            r.fua = i % 17 == 0;
            r
        })
        .collect()
}

#[test]
fn stack_equals_engines_on_synthetic_requests() {
    // 200 k requests: past the first compaction of the distance tree (64 Ki accesses).
    let input = memory("mixed", mixed(200_000));
    let fp = footprint_lines(&input, 4096).unwrap();
    let res = compare(
        "mixed, line validity",
        specs(&input, &line_validity(), &sizes(fp, 4096)),
        METHOD_STACK,
    );
    // The sweep saw partial-line writes, multi-line requests and evictions at every size
    // below the footprint.
    assert!(res[0].evictions > 0 && res.iter().any(|r| r.evictions == 0));
    assert!(res
        .iter()
        .all(|r| r.counters.write_line_accesses > 0 && r.counters.flushes > 0));
    assert!(
        res[3..].iter().all(|r| r.counters.partial_hits > 0),
        "{:?}",
        res[3].counters
    );
    // 16 KiB lines: a request touches parts of lines more often.
    let cfg = EngineConfig {
        line_size: 16384,
        group_size: 16384,
        ..line_validity()
    };
    let fp = footprint_lines(&input, 16384).unwrap();
    compare(
        "mixed, 16 KiB lines",
        specs(&input, &cfg, &sizes(fp, 16384)),
        METHOD_STACK,
    );
}

#[test]
fn sector_validity_takes_the_stack_without_partial_writes_and_engines_with_them() {
    // Whole-line writes only: with sector validity every cached line is whole.
    let whole: Vec<Request> = mixed(60_000)
        .into_iter()
        .map(|mut r| {
            if r.op == Op::Write {
                r.offset &= !4095;
                r.len = r.len.div_ceil(4096) * 4096;
            }
            r
        })
        .collect();
    let input = memory("whole writes", whole);
    let fp = footprint_lines(&input, 4096).unwrap();
    compare(
        "sector validity, whole-line writes",
        specs(&input, &EngineConfig::default(), &sizes(fp, 4096)),
        METHOD_STACK,
    );
    // Partial-line writes leave lines partly valid: the engines run.
    let input = memory("partial writes", mixed(60_000));
    compare(
        "sector validity, partial writes",
        specs(&input, &EngineConfig::default(), &sizes(fp, 4096)),
        METHOD_ENGINES,
    );
    // So do they without partial-write fills (the miss would not be admitted).
    let cfg = EngineConfig {
        partial_write_fill: false,
        ..line_validity()
    };
    compare(
        "no partial write fill",
        specs(&input, &cfg, &sizes(fp, 4096)),
        METHOD_ENGINES,
    );
}

#[test]
fn configurations_the_stack_does_not_derive_run_engines() {
    let input = memory("mixed", mixed(30_000));
    let fp = footprint_lines(&input, 4096).unwrap();
    let s = sizes(fp, 4096);
    let cases: Vec<(&str, EngineConfig)> = vec![
        (
            "write-back",
            EngineConfig {
                mode: Mode::WriteBack,
                ..line_validity()
            },
        ),
        (
            "write-around",
            EngineConfig {
                mode: Mode::WriteAround,
                ..line_validity()
            },
        ),
        (
            "admission 2 hits",
            EngineConfig {
                admission: Admission {
                    read_threshold: 2,
                    write_threshold: 2,
                },
                ..line_validity()
            },
        ),
        (
            "fifo",
            EngineConfig {
                policy: "fifo".into(),
                ..line_validity()
            },
        ),
        (
            "group of 4 lines",
            EngineConfig {
                group_size: 16384,
                ..line_validity()
            },
        ),
    ];
    for (what, cfg) in cases {
        compare(what, specs(&input, &cfg, &s), METHOD_ENGINES);
    }
    // A trim invalidates lines: the input does not fit, the engines run.
    let mut reqs = mixed(30_000);
    reqs[20_000] = Request::new(0, Op::Trim, 0, 1 << 20);
    let input = memory("trim", reqs);
    compare("trim", specs(&input, &line_validity(), &s), METHOD_ENGINES);
    // LRU beside another policy: the LRU sizes share the stack pass, the others run engines.
    let input = memory("mixed", mixed(30_000));
    let mut both = specs(&input, &line_validity(), &s[..4]);
    both.extend(specs(
        &input,
        &EngineConfig {
            policy: "fifo".into(),
            ..line_validity()
        },
        &s[..4],
    ));
    let res = run_sweep_with(both, SweepOptions::default()).unwrap();
    let methods: Vec<_> = res
        .iter()
        .map(|c| c.result.as_ref().unwrap().method.unwrap())
        .collect();
    assert_eq!(methods, [[METHOD_STACK; 4], [METHOD_ENGINES; 4]].concat());
}

#[test]
fn stack_equals_engines_on_shared_traces() {
    let Some(dir) = traces_dir() else { return };
    // Line validity where the trace writes parts of lines; the read-only and whole-line
    // traces also in the default sector validity. tencent_cbs has many volumes: keys that
    // widen the engine's key store.
    let cases: &[(&str, bool)] = &[
        ("cloudPhysicsIO/cloudPhysicsIO.csv", false),
        ("msr_cambridge/msr-cambridge1-sample.csv", false),
        ("systor17/systor17-traces-sample.csv.gz", false),
        ("mqsim/wsrch-small.trace", true),
        ("mqsim/tpcc-small.trace", false),
        ("tencent_cbs/cloud_storage-excerpt2000.bz2", false),
    ];
    for &(rel, sector) in cases {
        let input = trace(&dir, rel);
        let fp = footprint_lines(&input, 4096).unwrap();
        let s = sizes(fp, 4096);
        assert!(s.len() >= 10, "{rel}: {} sizes", s.len());
        let res = compare(rel, specs(&input, &line_validity(), &s), METHOD_STACK);
        assert!(res[0].line_misses > 0 && res[0].evictions > 0, "{rel}");
        if sector {
            compare(
                rel,
                specs(&input, &EngineConfig::default(), &s),
                METHOD_STACK,
            );
        }
    }
}
