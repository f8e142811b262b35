//! libCacheSim (PyPI `libcachesim`) as the oracle: with admission `always` and every write
//! allocating (write-through, partial lines filled), our line-level misses must equal
//! libCacheSim's on the same line-expanded stream (each 4 KiB block one object of size 1,
//! cache = floor(p x footprint) objects, cold start) — exactly for LRU, FIFO, CLOCK and ARC,
//! and within the documented margin for S3-FIFO. Traces: cloudPhysicsIO (real) and a
//! seeded Zipf stream. The MANIFEST's reference LRU miss ratios are asserted too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tiercache_engine::{CacheSize, Engine, EngineConfig, Request};
use tiercache_sim::{simulate, Input, SimSpec};

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    p.join("MANIFEST.md").exists().then_some(p)
}

fn have_libcachesim() -> bool {
    Command::new("python3")
        .args(["-c", "import libcachesim"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Writes the line-expanded stream as oracleGeneral records (object = line key, size 1).
fn write_stream(reqs: &[Request], path: &Path) -> (u64, u64) {
    let mut bytes = Vec::new();
    let mut seen = hashbrown::HashSet::new();
    let mut n = 0;
    for r in reqs {
        Engine::for_each_line_key(4096, r, |k| {
            bytes.extend_from_slice(&0u32.to_le_bytes());
            bytes.extend_from_slice(&k.to_le_bytes());
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&(-1i64).to_le_bytes());
            seen.insert(k);
            n += 1;
        });
    }
    std::fs::write(path, bytes).unwrap();
    (n, seen.len() as u64)
}

fn lcs_misses(
    stream: &Path,
    policies: &[&str],
    sizes: &[u64],
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lcs_oracle.py");
    let sizes: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let out = Command::new("python3")
        .arg(script)
        .arg(stream)
        .args([
            "--policies",
            &policies.join(","),
            "--sizes",
            &sizes.join(","),
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "lcs_oracle.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(v["misses"].clone()).unwrap()
}

/// (our policy, libCacheSim's name, allowed difference as a share of the accesses)
const POLICIES: &[(&str, &str, f64)] = &[
    ("lru", "LRU", 0.0),
    ("fifo", "FIFO", 0.0),
    ("clock", "Clock", 0.0),
    ("arc", "ARC", 0.0),
    ("s3fifo", "S3FIFO", 0.015),
];

fn compare(name: &str, reqs: Vec<Request>) -> BTreeMap<(String, u64), (u64, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("stream.oracleGeneral.bin");
    let (accesses, footprint) = write_stream(&reqs, &stream);
    let sizes: Vec<u64> = [1.0, 5.0, 10.0]
        .iter()
        .map(|p| CacheSize::Percent(*p).lines(4096, footprint))
        .collect();
    let theirs = lcs_misses(
        &stream,
        &POLICIES.iter().map(|p| p.1).collect::<Vec<_>>(),
        &sizes,
    );
    let input = Input::Memory {
        name: name.into(),
        requests: Arc::new(reqs),
    };
    let mut out = BTreeMap::new();
    for &(ours, lcs, margin) in POLICIES {
        for (pct, &lines) in [1.0, 5.0, 10.0].iter().zip(&sizes) {
            let r = simulate(
                &SimSpec {
                    input: input.clone(),
                    cache_size: CacheSize::Bytes(lines * 4096),
                    engine: EngineConfig {
                        policy: ours.into(),
                        ..Default::default()
                    },
                },
                None,
                None,
            )
            .unwrap();
            assert_eq!(r.line_accesses, accesses);
            let t = theirs[lcs][&lines.to_string()];
            let diff = (r.line_misses as f64 - t as f64).abs() / accesses as f64;
            eprintln!(
                "{name} {ours} {pct}% ({lines} lines): ours {} misses, libCacheSim {t}",
                r.line_misses
            );
            assert!(
                diff <= margin,
                "{name} {ours} at {pct}%: ours {} misses, libCacheSim {t} (difference {:.4} % of accesses, allowed {:.4} %)",
                r.line_misses,
                diff * 100.0,
                margin * 100.0
            );
            out.insert((ours.to_string(), lines), (r.line_misses, t));
        }
    }
    out
}

#[test]
fn cloudphysics_matches_libcachesim_and_the_manifest() {
    let Some(dir) = shared() else {
        eprintln!("SKIP: ../shared/traces not found beside the checkout; libCacheSim oracle on cloudPhysicsIO not run");
        return;
    };
    if !have_libcachesim() {
        eprintln!(
            "SKIP: python3 with libcachesim is missing (pip install libcachesim; .ci/run does)"
        );
        return;
    }
    let reqs: Vec<Request> = tiercache_trace::open(
        &dir.join("cloudPhysicsIO/cloudPhysicsIO.csv"),
        None,
        &Default::default(),
    )
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap();
    let res = compare("cloudPhysicsIO", reqs);
    // MANIFEST.md: LRU miss ratios 0.8969 / 0.8871 / 0.8741 at 2,692 / 13,460 / 26,921 lines.
    for (lines, want) in [(2692u64, 0.8969), (13460, 0.8871), (26921, 0.8741)] {
        let (ours, _) = res[&("lru".to_string(), lines)];
        let ratio = ours as f64 / 1_141_869.0;
        assert!(
            (ratio - want).abs() < 5e-5,
            "LRU at {lines}: {ratio:.4} vs {want}"
        );
    }
}

#[test]
fn zipf_matches_libcachesim() {
    if !have_libcachesim() {
        eprintln!(
            "SKIP: python3 with libcachesim is missing (pip install libcachesim; .ci/run does)"
        );
        return;
    }
    let spec: tiercache_trace::workload::WorkloadSpec =
        "zipf:theta=1.0,wss=80MiB,requests=200000,read=100,size=4k"
            .parse()
            .unwrap();
    compare("zipf", spec.generate(9).collect());
}
