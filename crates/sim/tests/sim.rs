//! Simulator behaviour: experiments, sweeps, sizes and results.

use std::sync::Arc;
use tiercache_engine::{CacheSize, EngineConfig, Request};
use tiercache_sim::experiment::{specs, CacheSection};
use tiercache_sim::{run_sweep, simulate, Experiment, Input, SimSpec, SweepGrid};

fn mem(reqs: Vec<Request>) -> Input {
    Input::Memory {
        name: "mem".into(),
        requests: Arc::new(reqs),
    }
}

#[test]
fn percent_sizes_use_the_footprint() {
    // 100 distinct lines, each read twice.
    let reqs: Vec<Request> = (0..2)
        .flat_map(|_| (0..100u64).map(|i| Request::read(i * 4096, 4096)))
        .collect();
    let spec = SimSpec {
        input: mem(reqs),
        cache_size: CacheSize::Percent(100.0),
        engine: EngineConfig::default(),
        log: None,
    };
    let r = simulate(&spec, None, None).unwrap();
    assert_eq!(r.footprint_lines, Some(100));
    assert_eq!(r.capacity_lines, 100);
    assert_eq!(r.line_hits, 100);
    assert_eq!(r.hit_ratio, 0.5);
    let json = serde_json::to_value(&r).unwrap();
    for k in [
        "requests",
        "line_accesses",
        "line_hits",
        "read_hit_ratio",
        "hit_ratio",
        "evictions",
        "ssd_bytes_written",
        "hdd_bytes_read",
        "hdd_bytes_written",
        "classes",
    ] {
        assert!(json.get(k).is_some(), "JSON lacks {k}");
    }
    assert_eq!(json["hdd_bytes_read"], 100 * 4096);
}

#[test]
fn sweeps_match_single_runs_and_keep_order() {
    let reqs: Vec<Request> = (0..5000u64)
        .map(|i| Request::read((i * 7919 % 600) * 4096, 4096))
        .collect();
    let input = mem(reqs);
    let grid = SweepGrid {
        size: vec!["5%".into(), "20%".into()],
        policy: vec!["lru".into(), "fifo".into(), "s3fifo".into()],
        ..Default::default()
    };
    let s = specs(&input, &CacheSection::default(), Some(&grid), 0).unwrap();
    assert_eq!(s.len(), 6);
    let cells = run_sweep(s.clone(), &|_| {}).unwrap();
    for (cell, spec) in cells.iter().zip(&s) {
        let one = simulate(spec, None, None).unwrap();
        let r = cell.result.as_ref().unwrap();
        assert_eq!(r.line_hits, one.line_hits);
        assert_eq!(r.policy.as_deref(), Some(spec.engine.policy.as_str()));
    }
}

#[test]
fn experiment_files_load_and_name_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.toml");
    std::fs::write(
        &p,
        "name='x'\n[input]\nworkload='zipf:wss=16MiB,requests=1000'\nseed=3\n[cache]\nsize='5%'\npolicy='arc'\nmode='wb'\n[sweep]\nsize=['1%','2%']\n",
    )
    .unwrap();
    let e = Experiment::load(&p).unwrap();
    let input = e.input.to_input().unwrap();
    let s = specs(&input, &e.cache, e.sweep.as_ref(), e.input.seed).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].engine.policy, "arc");
    std::fs::write(&p, "[cache]\nsise='5%'\n").unwrap();
    let err = format!("{:#}", Experiment::load(&p).unwrap_err());
    assert!(err.contains("sise") && err.contains("e.toml"), "{err}");
    std::fs::write(&p, "[cache]\nmode='fast'\n").unwrap();
    let e = Experiment::load(&p).unwrap();
    let err = format!("{:#}", e.cache.resolve(0).unwrap_err());
    assert!(err.contains("unknown mode 'fast'"), "{err}");
}

#[test]
fn relative_trace_paths_follow_the_experiment_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.toml");
    std::fs::write(&p, "[input]\ntrace='t.csv'\n").unwrap();
    let e = Experiment::load(&p).unwrap();
    assert_eq!(e.input.trace.unwrap(), dir.path().join("t.csv"));
}
