//! The log layout through the simulator's common entry points (experiment files, `specs`,
//! `simulate`, `run_sweep`) and its place in the one result schema.

use std::collections::BTreeSet;
use tiercache_sim::experiment::{parse_toml, specs};
use tiercache_sim::{run_sweep, simulate, SimResult, SimSpec, SweepGrid};

const ZIPF: &str = "zipf:theta=0.9,wss=64MiB,requests=20000";

/// The specs of an experiment written as TOML text.
fn experiment_specs(toml: &str) -> Vec<SimSpec> {
    let e = parse_toml(toml).unwrap();
    let input = e.input.to_input().unwrap();
    specs(&input, &e.cache, e.sweep.as_ref(), e.input.seed).unwrap()
}

fn run(toml: &str) -> SimResult {
    simulate(&experiment_specs(toml).remove(0), None, None).unwrap()
}

/// Figures of `tiercache sim --workload ZIPF --seed 7 --cache-size 16MiB --layout log
/// --compression lz4 --dedup 1.0 --segment-size 1MiB --json` (and `--mode wb --dedup 0.5`):
/// the experiment path must give the same counters. First captured before the driver moved
/// from the CLI into the sim crate (commit 1e9cd8e); changed on purpose when the simulator
/// began to drive the engine in the live volume's order (issue 19, branch h-logequiv: line
/// by line with room reserved first, read misses admitted after the read, so no duplicate
/// read hits; a header's extent limit): read hits 9582 -> 9446, duplicate read hits
/// 142 -> 0, HDD bytes read 52649984 -> 53862400, SSD bytes read 43144528 -> 42631317.
#[test]
fn experiment_path_gives_the_cli_golden_figures() {
    let r = run(&format!(
        "[input]\nworkload = \"{ZIPF}\"\nseed = 7\n[cache]\nsize = \"16MiB\"\nlayout = \"log\"\n\
         compression = \"lz4\"\ndedup = 1.0\nsegment_size = \"1MiB\"\n"
    ));
    let l = r.log.as_ref().expect("log figures");
    let k = &l.counters;
    assert_eq!(r.layout, "log");
    assert_eq!((r.line_size, r.capacity_bytes), (8192, 16 << 20));
    assert_eq!(
        (
            k.requests,
            k.read_lines,
            k.read_line_hits,
            k.dup_read_hits,
            k.ram_read_hits
        ),
        (20000, 13983, 9446, 0, 2493)
    );
    assert_eq!(
        (
            k.dup_write_lines,
            k.extents_stored,
            k.stored_bytes,
            k.segments_sealed
        ),
        (226, 10180, 44286355, 42)
    );
    assert_eq!(
        (k.segments_reclaimed, k.extents_evicted, k.dirty_write_backs),
        (27, 3900, 0)
    );
    assert_eq!(
        (
            r.ssd_bytes_read,
            r.ssd_bytes_written,
            r.hdd_bytes_read,
            r.hdd_bytes_written
        ),
        (42631317, 44040192, 53862400, 24645632)
    );
    assert_eq!(l.erasures, 13);
    assert!((r.read_hit_ratio - 9446.0 / 13983.0).abs() < 1e-12);

    let wb = run(&format!(
        "[input]\nworkload = \"{ZIPF}\"\nseed = 7\n[cache]\nsize = \"16MiB\"\nmode = \"wb\"\n\
         layout = \"log\"\ndedup = 0.5\n"
    ));
    let k = &wb.log.as_ref().unwrap().counters;
    assert_eq!(
        (
            k.read_line_hits,
            k.dup_write_lines,
            k.extents_stored,
            k.segments_reclaimed
        ),
        (8002, 117, 11778, 39)
    );
    assert_eq!((k.extents_evicted, k.dirty_write_backs), (7229, 2552));
    assert_eq!(
        (
            wb.ssd_bytes_written,
            wb.hdd_bytes_read,
            wb.hdd_bytes_written
        ),
        (94371840, 70754304, 20905984)
    );
    assert_eq!(wb.log.as_ref().unwrap().erasures, 35);
    assert_eq!(wb.write_backs, 2552);
}

#[test]
fn sweep_over_three_sizes_runs_the_log_layout() {
    let specs = experiment_specs(&format!(
        "[input]\nworkload = \"{ZIPF}\"\nseed = 7\n[cache]\nlayout = \"log\"\n\
         compression = \"lz4\"\ndedup = 1.0\nsegment_size = \"256KiB\"\n\
         [sweep]\nsize = [\"4MiB\", \"16MiB\", \"48MiB\"]\n"
    ));
    assert_eq!(specs.len(), 3);
    let cells = run_sweep(specs, &|_| {}).unwrap();
    let r: Vec<SimResult> = cells.into_iter().map(|c| c.result.unwrap()).collect();
    for x in &r {
        assert_eq!(x.layout, "log");
        assert!(x.log.is_some());
    }
    assert_eq!(
        r.iter().map(|x| x.capacity_bytes).collect::<Vec<_>>(),
        vec![4 << 20, 16 << 20, 48 << 20]
    );
    assert!(
        r[0].read_hit_ratio < r[1].read_hit_ratio && r[1].read_hit_ratio < r[2].read_hit_ratio,
        "hit ratio grows with the cache: {:?}",
        r.iter().map(|x| x.read_hit_ratio).collect::<Vec<_>>()
    );
    // The CSV row of a log run fills the layout's columns.
    // (The input's label holds commas: it is the quoted first field.)
    let header: Vec<&str> = SimResult::CSV_HEADER.split(',').skip(1).collect();
    let row = r[1].csv_row();
    let (_, rest) = row.split_once("\",").expect("quoted input");
    let cols: Vec<&str> = rest.split(',').collect();
    assert_eq!(cols.len(), header.len());
    let col = |name: &str| cols[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("layout"), "log");
    assert_eq!(col("compression"), "lz4");
    assert!(col("dedup_ratio").parse::<f64>().unwrap() >= 1.0);
}

#[test]
fn direct_log_and_no_cache_runs_share_one_schema() {
    let keys = |r: &SimResult| -> BTreeSet<String> {
        serde_json::to_value(r)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let base = format!("[input]\nworkload = \"{ZIPF}\"\nseed = 7\n[cache]\n");
    let direct = run(&format!("{base}size = \"16MiB\"\n"));
    let log = run(&format!("{base}size = \"16MiB\"\nlayout = \"log\"\n"));
    // The no-cache baseline (as `demo` and timed `--no-cache` runs build it): 0 bytes.
    let mut spec = experiment_specs(&format!("{base}size = \"16MiB\"\n")).remove(0);
    spec.cache_size = tiercache_engine::CacheSize::Bytes(0);
    let none = simulate(&spec, None, None).unwrap();
    assert_eq!(keys(&direct), keys(&log));
    assert_eq!(keys(&direct), keys(&none));
    for k in [
        "input",
        "policy",
        "mode",
        "layout",
        "hit_ratio",
        "read_hit_ratio",
        "log",
    ] {
        assert!(keys(&log).contains(k), "missing {k}");
    }
    assert_eq!(
        (direct.layout.as_str(), direct.policy.as_deref()),
        ("direct", Some("lru"))
    );
    assert_eq!(
        (log.layout.as_str(), log.policy.as_deref()),
        ("log", Some("lru"))
    );
    assert_eq!(
        (none.layout.as_str(), none.policy.as_deref()),
        ("none", None)
    );
    let j = serde_json::to_value(&none).unwrap();
    assert!(j["policy"].is_null() && j["log"].is_null());
    assert!(serde_json::to_value(&log).unwrap()["log"]["dedup_ratio"].is_number());
}

#[test]
fn settings_of_the_other_layout_are_refused() {
    let e = parse_toml("[cache]\nlayout = \"log\"\npolicy = \"arc\"\n").unwrap();
    let err = format!("{:#}", e.cache.log_spec(0).unwrap_err());
    assert!(
        err.contains("policy applies to layout = \"direct\" only"),
        "{err}"
    );
    let e = parse_toml("[cache]\npicker = \"greedy\"\n").unwrap();
    let err = format!("{:#}", e.cache.log_spec(0).unwrap_err());
    assert!(
        err.contains("picker applies to layout = \"log\" only"),
        "{err}"
    );
    let e = parse_toml("[cache]\nlayout = \"log\"\nmode = \"wa\"\n").unwrap();
    let err = format!("{:#}", e.cache.resolve(0).unwrap_err());
    assert!(err.contains("write-through or write-back"), "{err}");
}

#[test]
fn sweep_grid_keeps_the_log_settings_of_the_base() {
    let e = parse_toml("[cache]\nlayout = \"log\"\ndedup = 0.5\n").unwrap();
    let g = SweepGrid {
        size: vec!["1MiB".into(), "2MiB".into()],
        ..Default::default()
    };
    for c in g.cells(&e.cache) {
        assert_eq!(c.layout.as_deref(), Some("log"));
        assert_eq!(c.dedup, Some(0.5));
    }
}

/// A timed replay of the log layout on device models: IOPS and latency percentiles, the same
/// counters as the hit-ratio run, and every byte the engine counted reaching the device
/// models (segment writes on the SSD; in write-back, write-backs on the HDD).
#[test]
fn timed_log_run_times_segment_writes_and_write_backs() {
    use tiercache_sim::{run_timed, Drive, TimedSetup};
    let exp = |mode: &str| {
        experiment_specs(&format!(
            "[input]\nworkload = \"zipf:theta=0.9,wss=32MiB,requests=6000,read=50,size=8KiB\"\n\
             seed = 3\n[cache]\nsize = \"4MiB\"\nmode = \"{mode}\"\nlayout = \"log\"\n\
             segment_size = \"256KiB\"\ncompression = \"lz4\"\ndedup = 1.0\n"
        ))
        .remove(0)
    };
    let mut setup = TimedSetup {
        hdd: "hdd:7200".into(),
        ssd: Some("ssd:default".into()),
        ..TimedSetup::default()
    };
    setup.options.drive = Drive::Closed { queue_depth: 4 };
    for mode in ["wt", "wb"] {
        let spec = exp(mode);
        let t = run_timed(&spec, &setup, None).unwrap();
        let plain = simulate(&spec, None, None).unwrap();
        assert_eq!(t.sim.layout, "log");
        let (tl, pl) = (t.sim.log.as_ref().unwrap(), plain.log.as_ref().unwrap());
        assert_eq!(tl.counters, pl.counters, "{mode}: timed = hit-ratio run");
        assert_eq!(tl.erasures, pl.erasures);
        let l = &t.timed.latency_us.all;
        assert!(t.timed.iops > 0.0 && l.count == 6000, "{mode}: {l:?}");
        assert!(
            l.p50 > 0.0 && l.p99 >= l.p50 && l.max >= l.p99,
            "{mode}: {l:?}"
        );
        let ssd = t.timed.ssd.as_ref().expect("cache device");
        assert_eq!(
            ssd.bytes_written, t.sim.ssd_bytes_written,
            "{mode}: segments"
        );
        assert!(
            t.sim.ssd_bytes_written.is_multiple_of(256 << 10),
            "whole segments"
        );
        assert_eq!(t.timed.hdd.bytes_written, t.sim.hdd_bytes_written, "{mode}");
        if mode == "wb" {
            assert!(
                t.sim.write_backs > 0,
                "the cache is too small to hold every write"
            );
            assert!(t.timed.hdd.write_busy_s > 0.0, "write-backs spend HDD time");
            assert_eq!(
                t.timed.hdd.bytes_written,
                t.sim.write_backs * 8192,
                "every HDD write is a write-back"
            );
        }
    }
}

/// `sim --layout log --classes`: a `never` class is not cached (its lines are bypasses, it
/// gets no hits and no insertions), every class gets a row in `classes` with the direct
/// layout's counters and its name, and the rows add up to the run's requests. Without the
/// table the same lines are cached.
#[test]
fn log_layout_takes_a_class_table_and_counts_per_class() {
    use std::sync::Arc;
    use tiercache_engine::ClassTable;
    use tiercache_sim::Input;
    let toml = format!(
        "[input]\nworkload = \"{ZIPF}\"\nseed = 7\n[cache]\nsize = \"16MiB\"\nlayout = \"log\"\n\
         mode = \"wb\"\ncompression = \"lz4\"\ndedup = 1.0\nsegment_size = \"1MiB\"\n"
    );
    let mut spec = experiment_specs(&toml).remove(0);
    // Classes by line: 0, 1 and 2 (never) in turn.
    let mut reqs: Vec<tiercache_engine::Request> =
        spec.input.open().unwrap().map(|r| r.unwrap()).collect();
    for r in &mut reqs {
        r.class = ((r.offset / 8192) % 3) as u8;
    }
    spec.input = Input::Memory {
        name: "zipf by class".into(),
        requests: Arc::new(reqs),
    };
    let plain = simulate(&spec, None, None).unwrap();
    let table = ClassTable::parse(
        "version = 1\nname = \"t\"\n\
         [[class]]\nid = 1\nname = \"hot\"\npriority = 0\nallocation = \"always\"\n\
         [[class]]\nid = 2\nname = \"backup\"\npriority = 1\nallocation = \"never\"\n",
        "t.toml",
    )
    .unwrap();
    spec.engine.policy_params.classes = Some(Arc::new(table));
    let r = simulate(&spec, None, None).unwrap();
    assert_eq!(r.layout, "log");
    assert_eq!(r.classes.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(r.class_names[&2], "backup");
    let never = &r.classes[&2];
    assert!(never.requests > 0 && never.line_accesses > 0);
    assert_eq!((never.line_hits, never.insertions), (0, 0), "{never:?}");
    assert_eq!(never.bypasses.class, never.line_misses);
    assert_eq!(r.bypassed_lines, never.line_misses);
    assert_eq!(
        r.log.as_ref().unwrap().counters.bypassed_lines,
        r.bypassed_lines
    );
    assert!(r.classes[&0].insertions > 0 && r.classes[&0].line_hits > 0);
    let sum: u64 = r.classes.values().map(|c| c.requests).sum();
    assert_eq!(sum, r.requests);
    // Without the table, class 2's lines are cached (and hit).
    assert_eq!(plain.bypassed_lines, 0);
    assert!(plain.classes[&2].line_hits > 0, "{:?}", plain.classes[&2]);
    assert!(plain.class_names.is_empty());
}
