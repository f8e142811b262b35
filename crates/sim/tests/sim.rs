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

/// A result as JSON without its timing (wall time and speed differ from run to run).
fn counters_of(r: &tiercache_sim::SimResult) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    let o = v.as_object_mut().unwrap();
    assert!(o.remove("wall_s").is_some() && o.remove("requests_per_s").is_some());
    // A sweep says how it computed the result (`stack` or `engines`); a single run does not.
    o.remove("method");
    v
}

/// cloudPhysicsIO beside the checkout (`../shared/traces`), when present.
fn cloud_physics() -> Option<Input> {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/cloudPhysicsIO/cloudPhysicsIO.csv");
    if !p.exists() {
        tiercache_testskip::skip!("real-trace half: {} not found", p.display());
        return None;
    }
    Some(Input::Trace {
        path: p,
        format: None,
        options: Default::default(),
    })
}

#[test]
fn one_pass_sweep_matches_single_runs_counter_for_counter() {
    // Two inputs (a real trace when present, a synthetic workload), their cells interleaved;
    // several policies, sizes (shares of the footprint and bytes) and write modes, and belady
    // (which needs the oracle and runs on its own).
    let workload = Input::Workload {
        spec: "zipf:theta=0.9,wss=64MiB,requests=50000,read=70,size=4k@80+64k@20"
            .parse()
            .unwrap(),
        seed: 7,
    };
    let mut inputs = vec![workload];
    inputs.extend(cloud_physics());
    let grid = SweepGrid {
        size: vec!["1%".into(), "10%".into(), "8MiB".into()],
        policy: vec!["lru".into(), "s3fifo".into(), "arc".into(), "belady".into()],
        mode: vec!["write-through".into(), "write-back".into()],
        ..Default::default()
    };
    let mut all = Vec::new();
    let per_input: Vec<Vec<SimSpec>> = inputs
        .iter()
        .map(|i| specs(i, &CacheSection::default(), Some(&grid), 0).unwrap())
        .collect();
    for k in 0..per_input[0].len() {
        for s in &per_input {
            all.push(s[k].clone());
        }
    }
    let reads = std::sync::atomic::AtomicU64::new(0);
    let cells = tiercache_sim::sweep::run_sweep_with(
        all.clone(),
        tiercache_sim::sweep::SweepOptions {
            on_requests: Some(&|n| {
                reads.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
            }),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(cells.len(), all.len());
    let mut requests_in_inputs = 0;
    for (cell, spec) in cells.iter().zip(&all) {
        let one = simulate(spec, None, None).unwrap();
        let r = cell.result.as_ref().unwrap();
        let mut swept = counters_of(r);
        if one.footprint_lines.is_none() {
            // A size in bytes needs no footprint; the sweep reports the one it computed for
            // the other cells of the input (as it always has).
            swept["footprint_lines"] = serde_json::Value::Null;
        }
        assert_eq!(
            swept,
            counters_of(&one),
            "{} {} {} {}",
            spec.input,
            spec.engine.policy,
            spec.engine.mode,
            spec.cache_size
        );
        assert!(r.line_hits > 0 && r.evictions > 0, "{r}");
        requests_in_inputs = requests_in_inputs.max(r.requests);
    }
    // Progress counted the requests read: at least one pass over the longest input, and far
    // fewer than one pass per cell.
    let read = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read >= requests_in_inputs, "{read} < {requests_in_inputs}");
    let cells_total: u64 = cells
        .iter()
        .map(|c| c.result.as_ref().unwrap().requests)
        .sum();
    assert!(read * 3 < cells_total, "read {read} of {cells_total}");
}

#[test]
fn one_pass_sweep_reports_bad_records_as_single_runs_do() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.csv");
    let mut text = String::new();
    for i in 0..300u64 {
        text.push_str(&format!("{},R,{},4096\n", i, (i * 7 % 50) * 4096));
        if i == 200 {
            text.push_str("oops,R,x,4096\n");
        }
    }
    std::fs::write(&p, text).unwrap();
    for skip_bad in [false, true] {
        let input = Input::Trace {
            path: p.clone(),
            format: Some("simple".parse().unwrap()),
            options: tiercache_trace::ReadOptions {
                skip_bad,
                ..Default::default()
            },
        };
        let grid = SweepGrid {
            size: vec!["40KiB".into(), "100KiB".into(), "80KiB".into()],
            ..Default::default()
        };
        let s = specs(&input, &CacheSection::default(), Some(&grid), 0).unwrap();
        let cells = run_sweep(s.clone(), &|_| {}).unwrap();
        for (cell, spec) in cells.iter().zip(&s) {
            match (&cell.result, simulate(spec, None, None)) {
                (Ok(a), Ok(b)) => {
                    assert!(skip_bad);
                    assert_eq!(a.skipped_records, 1);
                    assert_eq!(counters_of(a), counters_of(&b));
                }
                (Err(a), Err(b)) => {
                    assert!(!skip_bad);
                    let (a, b) = (format!("{a:#}"), format!("{b:#}"));
                    assert_eq!(a, b);
                    assert!(a.contains("t.csv") && a.contains("oops"), "{a}");
                }
                (a, b) => panic!("sweep {a:?} vs single {b:?}"),
            }
        }
    }
}

#[test]
fn one_pass_sweep_keeps_going_when_one_run_fails() {
    // A request past the 4 KiB-line address space is an error for the 4 KiB-line runs only:
    // they fail as their single runs do, the 64 KiB-line runs read on to the end.
    let mut reqs: Vec<Request> = (0..3000u64)
        .map(|i| Request::read((i * 7919 % 900) * 4096, 4096))
        .collect();
    reqs.insert(1500, Request::read(1 << 60, 4096));
    let input = mem(reqs);
    let grid = SweepGrid {
        size: vec!["256KiB".into(), "1MiB".into()],
        line_size: vec!["4KiB".into(), "64KiB".into()],
        ..Default::default()
    };
    let s = specs(&input, &CacheSection::default(), Some(&grid), 0).unwrap();
    let cells = run_sweep(s.clone(), &|_| {}).unwrap();
    let mut failed = 0;
    for (cell, spec) in cells.iter().zip(&s) {
        match (&cell.result, simulate(spec, None, None)) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.requests, 3001);
                assert_eq!(counters_of(a), counters_of(&b));
            }
            (Err(a), Err(b)) => {
                failed += 1;
                assert_eq!(format!("{a:#}"), format!("{b:#}"));
                assert!(format!("{a:#}").contains("request 1501"), "{a:#}");
            }
            (a, b) => panic!("sweep {a:?} vs single {b:?}"),
        }
    }
    assert_eq!(failed, 2);
}

#[test]
fn one_pass_sweep_spans_batches() {
    // More requests than two one-pass batches: whole batches and a short last one.
    let n = 2 * tiercache_sim::sweep::ONE_PASS_BATCH as u64 + 12345;
    let reqs: Vec<Request> = (0..n)
        .map(|i| {
            let line = (i * 2654435761) % 40_000;
            if i % 5 == 0 {
                Request::write(line * 4096, 8192)
            } else {
                Request::read(line * 4096, 4096)
            }
        })
        .collect();
    let input = mem(reqs);
    let grid = SweepGrid {
        size: vec!["5%".into(), "30%".into()],
        policy: vec!["lru".into(), "clock".into()],
        mode: vec!["write-back".into()],
        ..Default::default()
    };
    let s = specs(&input, &CacheSection::default(), Some(&grid), 0).unwrap();
    let cells = run_sweep(s.clone(), &|_| {}).unwrap();
    for (cell, spec) in cells.iter().zip(&s) {
        let r = cell.result.as_ref().unwrap();
        assert_eq!(r.requests, n);
        assert!(r.write_backs > 0, "{r}");
        assert_eq!(
            counters_of(r),
            counters_of(&simulate(spec, None, None).unwrap())
        );
    }
}

#[test]
fn index_budget_splits_a_group_into_passes() {
    use tiercache_sim::sweep::split_by_budget;
    // 48 B a line (the estimate): 1,000 lines ~ 48 KB.
    let cells = [(0, 1000), (1, 1000), (2, 1000), (3, 1000), (4, 10)];
    // Room for two 1,000-line caches a pass; the small one joins the last pass.
    assert_eq!(
        split_by_budget(&cells, 100_000, 1),
        vec![vec![0, 1], vec![2, 3, 4]]
    );
    // A pass may always hold as many engines as there are workers, whatever the budget.
    assert_eq!(
        split_by_budget(&cells, 0, 2),
        vec![vec![0, 1], vec![2, 3], vec![4]]
    );
    // A large budget: one pass.
    assert_eq!(
        split_by_budget(&cells, u64::MAX, 2),
        vec![vec![0, 1, 2, 3, 4]]
    );
}

#[test]
fn sweep_over_the_index_budget_reads_the_input_once_per_pass_with_the_same_counters() {
    let n = 50_000u64;
    let reqs: Vec<Request> = (0..n)
        .map(|i| {
            let line = (i * 2654435761) % 20_000;
            if i % 4 == 0 {
                Request::write(line * 4096, 4096)
            } else {
                Request::read(line * 4096, 4096)
            }
        })
        .collect();
    let input = mem(reqs);
    let grid = SweepGrid {
        size: vec!["10%".into(), "20%".into(), "40%".into(), "80%".into()],
        policy: vec!["lru".into()],
        ..Default::default()
    };
    let s = specs(&input, &CacheSection::default(), Some(&grid), 0).unwrap();
    let read = |budget: Option<u64>| {
        let reads = std::sync::atomic::AtomicU64::new(0);
        let cells = tiercache_sim::sweep::run_sweep_with(
            s.clone(),
            tiercache_sim::sweep::SweepOptions {
                on_requests: Some(&|r| {
                    reads.fetch_max(r, std::sync::atomic::Ordering::Relaxed);
                }),
                index_budget: budget,
                // LRU sizes alone would come from one stack-distance pass, without engines.
                per_engine: true,
                ..Default::default()
            },
        )
        .unwrap();
        for (cell, spec) in cells.iter().zip(&s) {
            assert_eq!(
                counters_of(cell.result.as_ref().unwrap()),
                counters_of(&simulate(spec, None, None).unwrap())
            );
        }
        reads.into_inner()
    };
    let one = read(None);
    assert!(one > 0);
    // A budget of zero: each pass holds only as many engines as there are workers, so the
    // input is read more than once (4 cells, at most `threads` a pass), counters unchanged.
    let threads = rayon::current_num_threads().min(4) as u64;
    let split = read(Some(0));
    assert_eq!(
        split,
        one * 4u64.div_ceil(threads),
        "one pass read {one} requests; {threads} workers"
    );
}
