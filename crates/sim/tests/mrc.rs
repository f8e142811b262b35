//! Miss-ratio curves on the shared real traces (`../shared/traces` beside the checkout):
//! the one-pass exact LRU curve equals per-size LRU runs of the engine exactly, matches the
//! libCacheSim reference miss ratios of MANIFEST.md, and SHARDS at 1 % stays within 0.02 mean
//! absolute error of the exact curve on cloudPhysicsIO. Skips with a message when the traces
//! are missing.

mod common;
use common::traces_dir;

use tiercache_engine::{CacheSize, EngineConfig, Validity};
use tiercache_sim::mrc::{mean_abs_error, mrc, MrcPoint};
use tiercache_sim::{simulate, Input, SimSpec};

fn trace(dir: &std::path::Path, rel: &str) -> Input {
    Input::Trace {
        path: dir.join(rel),
        format: None,
        options: Default::default(),
    }
}

/// The traces the exact test walks (the ARC traces are left out: P3 alone is 3.9 M block
/// references, too slow for the default suite).
const TRACES: &[&str] = &[
    "cloudPhysicsIO/cloudPhysicsIO.csv",
    "msr_cambridge/msr-cambridge1-sample.csv",
    "systor17/systor17-traces-sample.csv.gz",
    "systor17/systor17-additional-sample.csv.gz",
    "mqsim/wsrch-small.trace",
    "mqsim/tpcc-small.trace",
    "tencent_cbs/cloud_storage-excerpt2000.bz2",
];

#[test]
fn exact_curve_equals_per_size_lru_runs_on_shared_traces() {
    let Some(dir) = traces_dir() else { return };
    for rel in TRACES {
        let input = trace(&dir, rel);
        let m = mrc(&input, 4096, 1.0).unwrap();
        let fp = m.footprint;
        let mut sizes: Vec<u64> = vec![1, fp / 100, fp / 20, fp / 10, fp / 3, fp];
        sizes.retain(|&s| s > 0);
        sizes.dedup();
        let curve = m.points(&sizes);
        for p in curve {
            let r = simulate(
                &SimSpec {
                    input: input.clone(),
                    cache_size: CacheSize::Bytes(p.cache_lines * 4096),
                    // Line validity: a line is there or not, as in the stack-distance model
                    // (with sector validity a read of a partly valid line is a partial miss).
                    engine: EngineConfig {
                        validity: Validity::Line,
                        ..EngineConfig::default()
                    },
                    log: None,
                },
                None,
                None,
            )
            .unwrap();
            assert_eq!(r.policy.as_deref(), Some("lru"));
            assert_eq!(m.accesses, r.line_accesses, "{rel}");
            // Exact: the same count of misses, not only a close ratio.
            let misses = (p.miss_ratio * m.accesses as f64).round() as u64;
            assert_eq!(
                misses, r.line_misses,
                "{rel} at {} lines: one-pass {misses} misses vs LRU run {}",
                p.cache_lines, r.line_misses
            );
        }
        eprintln!("{rel}: exact curve == LRU runs at {sizes:?} lines");
    }
}

/// A trace, its footprint and (cache lines, LRU miss ratio) points.
type Reference = (&'static str, u64, [(u64, f64); 3]);

#[test]
fn exact_curve_matches_manifest_reference_miss_ratios() {
    let Some(dir) = traces_dir() else { return };
    // MANIFEST.md: libCacheSim LRU, cache = floor(p x footprint) 4 KiB objects.
    let cases: &[Reference] = &[
        (
            "cloudPhysicsIO/cloudPhysicsIO.csv",
            269_210,
            [(2_692, 0.8969), (13_460, 0.8871), (26_921, 0.8741)],
        ),
        (
            "msr_cambridge/msr-cambridge1-sample.csv",
            1_917,
            [(19, 0.8993), (95, 0.8184), (191, 0.8006)],
        ),
        (
            "systor17/systor17-traces-sample.csv.gz",
            9_831,
            [(98, 0.9559), (491, 0.9433), (983, 0.9416)],
        ),
    ];
    for (rel, footprint, points) in cases {
        let m = mrc(&trace(&dir, rel), 4096, 1.0).unwrap();
        assert_eq!(m.footprint, *footprint, "{rel}");
        for (lines, want) in points {
            let got = m.miss_ratio(*lines);
            assert!(
                (got - want).abs() < 5e-5,
                "{rel} at {lines} lines: {got:.5} vs libCacheSim {want}"
            );
        }
    }
}

/// 100 sizes evenly up to the footprint.
fn grid(footprint: u64) -> Vec<u64> {
    (1..=100).map(|i| (footprint * i / 100).max(1)).collect()
}

#[test]
fn shards_one_percent_within_002_on_cloudphysics() {
    let Some(dir) = traces_dir() else { return };
    let input = trace(&dir, "cloudPhysicsIO/cloudPhysicsIO.csv");
    let exact = mrc(&input, 4096, 1.0).unwrap();
    let sizes = grid(exact.footprint);
    let want: Vec<MrcPoint> = exact.points(&sizes);
    let sampled = mrc(&input, 4096, 0.01).unwrap();
    let got = sampled.points(&sizes);
    let mae = mean_abs_error(&got, &want);
    let mae_plain = mean_abs_error(&sampled.points_unadjusted(&sizes), &want);
    eprintln!("SHARDS 1 % on cloudPhysicsIO without the adjustment: mean abs error {mae_plain:.4}");
    let max = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a.miss_ratio - b.miss_ratio).abs())
        .fold(0.0f64, f64::max);
    eprintln!(
        "SHARDS 1 % on cloudPhysicsIO: mean abs error {mae:.4}, max {max:.4} over 100 sizes; footprint estimate {} vs {}",
        sampled.footprint, exact.footprint
    );
    assert!(mae < 0.02, "SHARDS mean absolute error {mae} >= 0.02");
}
