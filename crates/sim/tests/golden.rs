//! Golden miss counts: every policy on small seeded workloads, compared with the counts kept
//! in `tests/golden/misses.json`. A change in any policy's behaviour shows up here.
//!
//! Regenerate (after an intended change, and say why in the commit):
//!     TIERCACHE_BLESS=1 cargo test -p tiercache-sim --test golden

use std::collections::BTreeMap;
use std::path::PathBuf;
use tiercache_engine::{policy, CacheSize, EngineConfig, Mode};
use tiercache_sim::{simulate, Input, SimSpec};

const WORKLOADS: &[&str] = &[
    "zipf:theta=0.9,wss=64MiB,requests=40000,read=80,size=4k",
    "hotspot:hot_io=80,hot_space=10,wss=32MiB,requests=30000,read=70,size=4k@70+16k@30",
    "8k; 60% read; 50% random",
];

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/misses.json")
}

fn compute() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (wi, w) in WORKLOADS.iter().enumerate() {
        let spec: tiercache_trace::workload::WorkloadSpec = w.parse().unwrap();
        let input = Input::Workload { spec, seed: 42 };
        for p in policy::names() {
            for mode in [Mode::WriteThrough, Mode::WriteBack] {
                for pct in [2.0, 10.0] {
                    let s = SimSpec {
                        input: input.clone(),
                        cache_size: CacheSize::Percent(pct),
                        engine: EngineConfig {
                            policy: p.to_string(),
                            mode,
                            ..Default::default()
                        },
                        log: None,
                    };
                    let r = simulate(&s, None, None).unwrap();
                    r.counters.check().unwrap();
                    out.insert(format!("w{wi}/{p}/{}/{pct}%", mode.short()), r.line_misses);
                }
            }
        }
    }
    out
}

#[test]
fn golden_miss_counts() {
    let got = compute();
    let path = golden_path();
    if std::env::var_os("TIERCACHE_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; create it with TIERCACHE_BLESS=1", path.display()));
    let want: BTreeMap<String, u64> = serde_json::from_str(&text).unwrap();
    let mut diffs = Vec::new();
    for (k, w) in &want {
        match got.get(k) {
            Some(g) if g == w => {}
            Some(g) => diffs.push(format!("{k}: golden {w}, now {g}")),
            None => diffs.push(format!("{k}: missing now")),
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        diffs.push(format!("{k}: new (not in golden file)"));
    }
    assert!(
        diffs.is_empty(),
        "golden miss counts changed:\n{}",
        diffs.join("\n")
    );
}
