//! Timed replay on device models: physics the results must respect.

use tiercache_engine::{CacheSize, EngineConfig, Mode};
use tiercache_sim::{run_timed, Drive, Input, SimSpec, TimedOptions, TimedSetup};

fn spec(workload: &str, size: CacheSize, mode: Mode) -> SimSpec {
    SimSpec {
        input: Input::Workload {
            spec: workload.parse().unwrap(),
            seed: 5,
        },
        cache_size: size,
        engine: EngineConfig {
            mode,
            ..Default::default()
        },
        log: None,
    }
}

fn setup(ssd: Option<&str>, drive: Drive) -> TimedSetup {
    TimedSetup {
        hdd: "hdd:7200".into(),
        ssd: ssd.map(str::to_string),
        pool: Vec::new(),
        options: TimedOptions {
            drive,
            window_ns: 100_000_000,
            idle_clean: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

const HOT: &str = "zipf:theta=1.2,wss=64MiB,requests=30000,read=100,size=4k";

#[test]
fn a_hot_set_that_fits_is_served_by_the_ssd() {
    let qd1 = Drive::Closed { queue_depth: 1 };
    let s = spec(HOT, CacheSize::Percent(100.0), Mode::WriteThrough);
    let none = run_timed(&s, &setup(None, qd1), None).unwrap();
    let cached = run_timed(&s, &setup(Some("ssd:default"), qd1), None).unwrap();
    // The HDD alone: random 4 KiB reads near the seek-curve's short end.
    assert!(
        none.timed.iops > 60.0 && none.timed.iops < 400.0,
        "no cache {}",
        none.timed.iops
    );
    assert!(
        cached.sim.hit_ratio > 0.8,
        "hit ratio {}",
        cached.sim.hit_ratio
    );
    assert!(
        cached.timed.iops > 3.0 * none.timed.iops,
        "{} vs {}",
        cached.timed.iops,
        none.timed.iops
    );
    assert!(cached.timed.latency_us.read.p50 < none.timed.latency_us.read.p50 / 10.0);
    // Warm-up: the first window's hit ratio is below the end's.
    let w = &cached.timed.series;
    assert!(w.len() > 3);
    assert!(w[0].hit_ratio < w[w.len() - 2].hit_ratio);
    assert!(cached.timed.warmup_s.is_some());
    // Busy time never exceeds the run, and the HDD alone is busy all the time at QD1.
    assert!(none.timed.hdd.utilisation > 0.95 && none.timed.hdd.utilisation <= 1.0 + 1e-9);
    assert!(cached.timed.hdd.busy_s <= cached.timed.drained_s + 1e-9);
    assert!(none.cost_per_mb_per_iops.unwrap() > cached.cost_per_mb_per_iops.unwrap());
}

#[test]
fn queue_depth_raises_hdd_iops_through_command_queueing() {
    let s = spec(
        "uniform:wss=100GiB,requests=3000,read=100,size=4k",
        CacheSize::Bytes(0),
        Mode::WriteThrough,
    );
    let q1 = run_timed(&s, &setup(None, Drive::Closed { queue_depth: 1 }), None).unwrap();
    let q32 = run_timed(&s, &setup(None, Drive::Closed { queue_depth: 32 }), None).unwrap();
    assert!(
        q32.timed.iops > 1.5 * q1.timed.iops,
        "{} vs {}",
        q32.timed.iops,
        q1.timed.iops
    );
    assert!(q32.timed.latency_us.all.mean > q1.timed.latency_us.all.mean);
}

#[test]
fn open_loop_shows_queueing_only_when_overloaded() {
    // 50 IOPS of random reads: the disk keeps up. 5,000 IOPS: it cannot.
    let slow = spec(
        "uniform:wss=10GiB,requests=2000,read=100,size=4k,rate=50",
        CacheSize::Bytes(0),
        Mode::WriteThrough,
    );
    let fast = spec(
        "uniform:wss=10GiB,requests=2000,read=100,size=4k,rate=5000",
        CacheSize::Bytes(0),
        Mode::WriteThrough,
    );
    let open = Drive::Open { speedup: 1.0 };
    let a = run_timed(&slow, &setup(None, open), None).unwrap();
    let b = run_timed(&fast, &setup(None, open), None).unwrap();
    assert!(
        a.timed.latency_us.all.p50 < 20_000.0,
        "{}",
        a.timed.latency_us.all.p50
    );
    assert!(b.timed.latency_us.all.p50 > 10.0 * a.timed.latency_us.all.p50);
    assert!(
        (a.timed.elapsed_s - 40.0).abs() < 1.0,
        "{}",
        a.timed.elapsed_s
    );
}

#[test]
fn write_back_absorbs_writes_that_write_through_sends_to_the_disk() {
    let w = "zipf:theta=1.1,wss=32MiB,requests=20000,read=30,size=4k";
    let qd = Drive::Closed { queue_depth: 4 };
    let wt = run_timed(
        &spec(w, CacheSize::Percent(100.0), Mode::WriteThrough),
        &setup(Some("ssd:default"), qd),
        None,
    )
    .unwrap();
    let wb = run_timed(
        &spec(w, CacheSize::Percent(100.0), Mode::WriteBack),
        &setup(Some("ssd:default"), qd),
        None,
    )
    .unwrap();
    let none = run_timed(
        &spec(w, CacheSize::Percent(100.0), Mode::WriteThrough),
        &setup(None, qd),
        None,
    )
    .unwrap();
    assert!(wb.timed.latency_us.write.mean < wt.timed.latency_us.write.mean / 3.0);
    assert!(
        wb.timed.iops > wt.timed.iops && wt.timed.iops > none.timed.iops,
        "{} {} {}",
        wb.timed.iops,
        wt.timed.iops,
        none.timed.iops
    );
    assert!(wb.sim.hdd_bytes_written < wt.sim.hdd_bytes_written);
}

#[test]
fn raid0_spreads_random_reads() {
    let s = spec(
        "uniform:wss=100GiB,requests=4000,read=100,size=4k",
        CacheSize::Bytes(0),
        Mode::WriteThrough,
    );
    let one = run_timed(&s, &setup(None, Drive::Closed { queue_depth: 16 }), None).unwrap();
    let mut r = setup(None, Drive::Closed { queue_depth: 16 });
    r.raid = Some((0, 4));
    let four = run_timed(&s, &r, None).unwrap();
    assert!(
        four.timed.iops > 2.5 * one.timed.iops,
        "{} vs {}",
        four.timed.iops,
        one.timed.iops
    );
}

/// The shared traces beside the checkout (CI has them; elsewhere the tests that need them
/// skip).
fn shared_trace(rel: &str) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(rel);
    p.exists().then_some(p)
}

/// cloudPhysicsIO (59 % writes, 12 % LRU hit ratio at 10 % of its footprint) at queue depth
/// 1 on a 7200 RPM disk: write-through can only win the read hits; write-back also answers
/// writes from the SSD's buffer, and its write-backs of contiguous victims share seeks. So:
/// no cache < LRU write-through < LRU write-back, in IOPS and in mean latency.
#[test]
fn cloudphysics_no_cache_then_write_through_then_write_back() {
    let Some(path) = shared_trace("cloudPhysicsIO/cloudPhysicsIO.vscsi") else {
        tiercache_testskip::skip!("../shared/traces/cloudPhysicsIO not found");
        return;
    };
    let run = |mode: Mode, ssd: Option<&str>| {
        let s = SimSpec {
            input: Input::Trace {
                path: path.clone(),
                format: None,
                options: Default::default(),
            },
            cache_size: CacheSize::Percent(10.0),
            engine: EngineConfig {
                mode,
                ..Default::default()
            },
            log: None,
        };
        run_timed(&s, &setup(ssd, Drive::Closed { queue_depth: 1 }), None).unwrap()
    };
    let none = run(Mode::WriteThrough, None);
    let wt = run(Mode::WriteThrough, Some("ssd:default"));
    let wb = run(Mode::WriteBack, Some("ssd:default"));
    let (n, t, b) = (none.timed.iops, wt.timed.iops, wb.timed.iops);
    eprintln!("cloudPhysicsIO QD1 IOPS: no cache {n:.1}, LRU wt {t:.1}, LRU wb {b:.1}");
    assert!(n < t && t < b, "IOPS order: none {n}, wt {t}, wb {b}");
    let lat = |r: &tiercache_sim::TimedReport| r.timed.latency_us.all.mean;
    assert!(lat(&none) > lat(&wt) && lat(&wt) > lat(&wb));
    // Write-back answers writes faster; write-through sends every write to the disk.
    assert!(wb.timed.latency_us.write.p50 < wt.timed.latency_us.write.p50 / 1.2);
    // The same engine decisions in both modes: the hit ratio does not depend on the mode.
    assert_eq!(wt.sim.counters.line_hits, wb.sim.counters.line_hits);
    assert!(wb.timed.hdd.busy_s < wt.timed.hdd.busy_s);
}

/// Open-loop timed replay of class-labelled requests (1 ms apart) with the default engine.
fn class_run(
    reqs: Vec<tiercache_engine::Request>,
    cache_lines: u64,
    window_ns: u64,
) -> tiercache_sim::TimedReport {
    let spec = SimSpec {
        input: Input::Memory {
            name: "classes".into(),
            requests: std::sync::Arc::new(reqs),
        },
        cache_size: CacheSize::Bytes(cache_lines * 4096),
        engine: EngineConfig::default(),
        log: None,
    };
    let setup = TimedSetup {
        options: TimedOptions {
            drive: Drive::Open { speedup: 1.0 },
            window_ns,
            idle_clean: true,
            ..Default::default()
        },
        ..TimedSetup::default()
    };
    run_timed(&spec, &setup, None).unwrap()
}

/// One 4 KiB read of `block` as `class`, issued at `i` ms.
fn class_read(i: u64, class: u8, block: u64) -> tiercache_engine::Request {
    let mut r = tiercache_engine::Request::read(block * 4096, 4096);
    r.time_ns = i * 1_000_000;
    r.class = class;
    r
}

/// Per-class occupancy over time: two classes writing disjoint ranges each own their lines;
/// at every window end the classes add up to the cached lines, and class 1's share grows
/// once it starts.
#[test]
fn class_occupancy_series_adds_up_and_follows_the_classes() {
    // Class 0 on the first 1000 blocks throughout; class 3 on another 1000 from the second
    // half on.
    let reqs = (0..4000u64)
        .map(|i| {
            if i >= 2000 && i % 2 == 1 {
                class_read(i, 3, 10_000 + (i * 7) % 1000)
            } else {
                class_read(i, 0, (i * 13) % 1000)
            }
        })
        .collect();
    let r = class_run(reqs, 4000, 500_000_000);
    let s = &r.timed.series;
    assert!(s.len() >= 6, "{} windows", s.len());
    // Before class 3 starts (first second), only class 0 owns lines.
    assert!(
        s[0].class_lines.keys().all(|&c| c == 0),
        "{:?}",
        s[0].class_lines
    );
    // 1000 class-0 blocks and 500 class-3 blocks (odd x 7 mod 1000), all fitting the cache.
    let last = s.last().unwrap();
    assert_eq!(
        last.class_lines.get(&0),
        Some(&1000),
        "{:?}",
        last.class_lines
    );
    assert_eq!(
        last.class_lines.get(&3),
        Some(&500),
        "{:?}",
        last.class_lines
    );
    // Every window adds up to the lines cached then, which never shrinks here (no evictions).
    let totals: Vec<u64> = s.iter().map(|w| w.class_lines.values().sum()).collect();
    assert!(totals.windows(2).all(|p| p[0] <= p[1]), "{totals:?}");
    assert_eq!(r.sim.evictions, 0);
}

/// Lines of a class that are evicted leave its occupancy as they go (the executor drops them
/// from the engine's log of unmapped keys, not by pruning every window).
#[test]
fn class_occupancy_drops_evicted_lines() {
    // 800 blocks of class 3, then 600 other blocks of class 5, in a cache of 1000 lines:
    // LRU evicts the 400 oldest class-3 lines.
    let reqs = (0..1400u64)
        .map(|i| {
            if i < 800 {
                class_read(i, 3, i)
            } else {
                class_read(i, 5, 10_000 + i)
            }
        })
        .collect();
    let r = class_run(reqs, 1000, 100_000_000);
    assert_eq!(r.sim.evictions, 400);
    let s = &r.timed.series;
    let last = &s.last().unwrap().class_lines;
    assert_eq!(last.get(&3), Some(&400), "{last:?}");
    assert_eq!(last.get(&5), Some(&600), "{last:?}");
    assert_eq!(last.get(&0), None, "{last:?}");
    // Every window: the classes add up to at most the cache.
    assert!(s
        .iter()
        .all(|w| w.class_lines.values().sum::<u64>() <= 1000));
}

/// No cache (`sim --no-cache`: no SSD model) on a stream with FLUSHes, as every file system
/// sends (a pgbench recording has one per commit): the engine plans a `FlushSsd` for each,
/// which has no device to run on; the baseline must still run, and its FLUSHes reach the HDD.
#[test]
fn no_cache_replays_flushes() {
    use tiercache_engine::{Op, Request};
    let reqs: Vec<Request> = (0..200u64)
        .map(|i| {
            let mut r = match i % 3 {
                0 => Request::write(i * 8 * 4096, 4096),
                1 => Request::read(i * 8 * 4096, 4096),
                _ => Request::new(0, Op::Flush, 0, 0),
            };
            r.time_ns = i * 1_000_000;
            r
        })
        .collect();
    let s = SimSpec {
        input: Input::Memory {
            name: "flushes".into(),
            requests: std::sync::Arc::new(reqs),
        },
        cache_size: CacheSize::Bytes(1 << 20),
        engine: EngineConfig {
            mode: Mode::WriteBack,
            ..Default::default()
        },
        log: None,
    };
    let none = run_timed(&s, &setup(None, Drive::Closed { queue_depth: 1 }), None).unwrap();
    assert!(none.timed.iops > 0.0 && none.timed.elapsed_s > 0.0);
    assert!(none.timed.ssd.is_none());
    assert!(none.timed.hdd.busy_s > 0.0);
}

/// Timed replay maps offsets modulo the backing device (`tasks_of`): a trace larger than
/// its device folds onto it, with shorter seeks than the trace's. The replay counts such
/// requests and names the first with the sizes (it folded silently before: issue 18's
/// single-disk runs of a 1 TB fileserver volume on a 500 GB disk).
#[test]
fn a_trace_beyond_the_device_is_counted_and_named() {
    let far = 100u64 << 40; // 100 TiB: beyond every HDD preset
    let reqs: Vec<_> = (0..4u64)
        .map(|i| class_read(i, 0, if i % 2 == 0 { i } else { far / 4096 + i }))
        .collect();
    let rep = class_run(reqs, 64, 100_000_000);
    assert_eq!(rep.timed.wrapped_requests, 2);
    let note = rep
        .timed
        .wrap_note
        .as_deref()
        .expect("a note on the folded requests");
    assert!(note.contains(&format!("offset {}", far + 4096)), "{note}");
    assert!(note.contains("mapped modulo the device"), "{note}");
    // Within the device there is nothing to say.
    let rep = class_run(
        vec![class_read(0, 0, 1), class_read(1, 0, 9)],
        64,
        100_000_000,
    );
    assert_eq!(rep.timed.wrapped_requests, 0);
    assert!(rep.timed.wrap_note.is_none());
}

/// A generated workload declares the volume it spans (the fileserver's: the seed's 1 TB at
/// every scale): a timed run on a smaller backing device is refused with the sizes, not
/// folded onto it (issue 18's single-disk command: a 1 TB volume on one 500 GB `hdd:7200`),
/// and runs on a device that holds it without folding a request.
#[test]
fn a_declared_volume_larger_than_the_device_is_refused() {
    use tiercache_sim::fileserver::{self, FileserverSpec};
    let t = fileserver::generate(&FileserverSpec::scaled(0.001), 1);
    assert!(t.volume_bytes > 500_000_000_000, "{} bytes", t.volume_bytes);
    let spec = SimSpec {
        input: Input::Memory {
            name: "fileserver:scale=0.001".into(),
            requests: std::sync::Arc::new(t.requests),
        },
        cache_size: CacheSize::Percent(10.0),
        engine: EngineConfig::default(),
        log: None,
    };
    let on = |raid: Option<(u8, usize)>, declared: bool| {
        let mut s = setup(None, Drive::Closed { queue_depth: 4 });
        s.raid = raid;
        s.options.volume_bytes = declared.then_some(t.volume_bytes);
        run_timed(&spec, &s, None)
    };
    // Undeclared, the trace does reach beyond the single disk (and is folded onto it).
    let folded = on(None, false).unwrap();
    assert!(folded.timed.wrapped_requests > 0);
    // Declared, the same run is refused, naming both sizes.
    let err = format!("{:#}", on(None, true).unwrap_err());
    assert!(err.contains(&t.volume_bytes.to_string()), "{err}");
    assert!(err.contains("500000000000"), "{err}");
    assert!(err.contains("fold"), "{err}");
    // The device is named as `--hdd` takes it (`hdd:7200`), also when given as `7200`.
    let mut bare = setup(None, Drive::Closed { queue_depth: 4 });
    bare.hdd = "7200".into();
    bare.options.volume_bytes = Some(t.volume_bytes);
    let err = format!("{:#}", run_timed(&spec, &bare, None).unwrap_err());
    assert!(err.contains("backing device (hdd:7200)"), "{err}");
    // A RAID 5 of 4 x 500 GB (1.5 TB) holds it: nothing folds.
    let fits = on(Some((5, 4)), true).unwrap();
    assert_eq!(fits.timed.wrapped_requests, 0);
    assert!(fits.timed.wrap_note.is_none());
}

/// Per-phase counters split the run: they add up to the run's write-backs, evictions and
/// HDD bytes (the last phase includes the final drain).
#[test]
fn phase_counters_add_up_to_the_run() {
    let s = spec(
        "zipf:theta=0.9,wss=32MiB,requests=6000,read=50,size=4k",
        CacheSize::Bytes(4 << 20),
        Mode::WriteBack,
    );
    let mut st = setup(Some("ssd:default"), Drive::Closed { queue_depth: 1 });
    st.options.phase_starts = vec![0, 2000, 4000];
    let rep = run_timed(&s, &st, None).unwrap();
    let pc = &rep.timed.phase_counters;
    assert_eq!(pc.len(), 3);
    let sum = |f: fn(&tiercache_sim::timed::PhaseCounters) -> u64| pc.iter().map(f).sum::<u64>();
    assert_eq!(sum(|c| c.write_backs), rep.sim.write_backs);
    assert_eq!(sum(|c| c.evictions), rep.sim.evictions);
    assert_eq!(sum(|c| c.hdd_bytes_written), rep.timed.hdd.bytes_written);
    assert_eq!(sum(|c| c.hdd_bytes_read), rep.timed.hdd.bytes_read);
    assert!(pc.iter().all(|c| c.write_backs > 0), "{pc:?}");
}

/// Issue 18: a line counts as cached from the moment its miss is planned, but its copy to
/// the SSD completes later (here after the HDD read of the miss). A read of the line
/// arriving meanwhile must not be served by the SSD before the copy is there: it waits for
/// the copy. A read after the copy is an SSD read.
#[test]
fn a_read_of_a_line_whose_copy_is_in_flight_waits_for_the_copy() {
    let read = |t_ns: u64, line: u64| {
        let mut r = tiercache_engine::Request::read(line * 4096, 4096);
        r.time_ns = t_ns;
        r
    };
    for (what, group_size, second_line) in [
        ("the miss's own fill", 4096u64, 1000u64),
        ("group population", 64 * 1024, 1001),
    ] {
        let reqs = vec![read(0, 1000), read(10_000, second_line)];
        let run = |reqs: Vec<tiercache_engine::Request>| {
            let spec = SimSpec {
                input: Input::Memory {
                    name: "copy-in-flight".into(),
                    requests: std::sync::Arc::new(reqs),
                },
                cache_size: CacheSize::Bytes(1 << 20),
                engine: EngineConfig {
                    group_size,
                    ..Default::default()
                },
                log: None,
            };
            run_timed(
                &spec,
                &setup(Some("ssd:default"), Drive::Open { speedup: 1.0 }),
                None,
            )
            .unwrap()
        };
        let r = run(reqs.clone());
        // The engine still counts the second read a hit (its line is cached).
        assert_eq!(r.sim.counters.line_hits, 1, "{what}");
        let lat = &r.timed.latency_us.read;
        assert_eq!(lat.count, 2, "{what}");
        // The first read waits for the HDD (milliseconds); the second arrived 10 us later and
        // can have its data no earlier than the copy, after that HDD read: neither is an SSD
        // read's time (about 0.1 ms).
        let (fast, slow) = (lat.cdf[0][0], lat.max);
        assert!(
            fast > 1000.0,
            "{what}: the reads took {fast} and {slow} us: one was served before its line's \
             copy reached the SSD"
        );
        // Control: the same read 100 ms later is an SSD hit of well under a millisecond.
        let late = run(vec![reqs[0], read(100_000_000, second_line)]);
        let l = &late.timed.latency_us.read;
        assert_eq!(late.sim.counters.line_hits, 1, "{what}");
        assert!(l.cdf[0][0] < 1000.0, "{what}: {} us", l.cdf[0][0]);
    }
}

/// Issue 18: a write of a line whose copy to the SSD (a miss's fill, group population) is
/// still in flight writes the same slot. Issued at once, its SSD write lands first and the
/// older copy then overwrites it with the bytes from before the write: a real cache orders
/// the two (the write goes after the copy). Write-back, so the write is an SSD write alone.
#[test]
fn a_write_of_a_line_whose_copy_is_in_flight_lands_after_the_copy() {
    let at = |mut r: tiercache_engine::Request, t_ns: u64| {
        r.time_ns = t_ns;
        r
    };
    for (what, group_size, second_line) in [
        ("the miss's own fill", 4096u64, 1000u64),
        ("group population", 64 * 1024, 1001),
    ] {
        let read = tiercache_engine::Request::read(1000 * 4096, 4096);
        let write = tiercache_engine::Request::write(second_line * 4096, 4096);
        let run = |t_write_ns: u64| {
            let spec = SimSpec {
                input: Input::Memory {
                    name: "write-over-copy".into(),
                    requests: std::sync::Arc::new(vec![at(read, 0), at(write, t_write_ns)]),
                },
                cache_size: CacheSize::Bytes(1 << 20),
                engine: EngineConfig {
                    group_size,
                    mode: Mode::WriteBack,
                    ..Default::default()
                },
                log: None,
            };
            run_timed(
                &spec,
                &setup(Some("ssd:default"), Drive::Open { speedup: 1.0 }),
                None,
            )
            .unwrap()
        };
        let r = run(10_000);
        // The write finds its line cached (the engine decided at the read's issue).
        assert_eq!(r.sim.counters.line_hits, 1, "{what}");
        let (rl, wl) = (&r.timed.latency_us.read, &r.timed.latency_us.write);
        assert_eq!((rl.count, wl.count), (1, 1), "{what}");
        // The copy reaches the SSD after the read's HDD read (milliseconds); the write
        // arrived 10 us after the read, so it ends no earlier than the copy minus 10 us.
        assert!(
            wl.max + 10.0 >= rl.max,
            "{what}: the write took {} us, the read whose copy it overwrites {} us: the \
             write landed on the SSD before the copy, which then put the older bytes back",
            wl.max,
            rl.max
        );
        // Control: the same write 100 ms later is an SSD write of well under a millisecond.
        let late = run(100_000_000);
        assert!(
            late.timed.latency_us.write.max < 1000.0,
            "{what}: {} us",
            late.timed.latency_us.write.max
        );
    }
}

#[test]
fn two_ssds_form_a_pool_and_each_member_serves_its_own_slots() {
    let ls = EngineConfig::default().line_size;
    let s = spec(
        "zipf:theta=0.6,wss=64MiB,requests=3000,read=100,size=4k",
        CacheSize::Bytes(256 * ls),
        Mode::WriteThrough,
    );
    let mut two = setup(Some("ssd:default"), Drive::Closed { queue_depth: 8 });
    two.pool = vec!["ssd:default".into()];
    let r = run_timed(&s, &two, None).unwrap();
    assert_eq!(r.sim.capacity_bytes, 256 * ls);
    let m = &r.timed.ssd_members;
    assert_eq!(m.len(), 2);
    // The cache filled past member 0's 128 lines: the fills of slots >= 128 reached member 1.
    for (d, u) in m.iter().enumerate() {
        assert!(u.ops > 0 && u.bytes_written > 0, "member {d}: {u:?}");
    }
    let pool = r.timed.ssd.as_ref().unwrap();
    assert_eq!(
        m[0].bytes_written + m[1].bytes_written,
        pool.bytes_written,
        "every pool byte lands on exactly one member"
    );
    assert_eq!(m[0].bytes_read + m[1].bytes_read, pool.bytes_read);
    // One --ssd: no member breakdown (the JSON is today's).
    let one = run_timed(
        &s,
        &setup(Some("ssd:default"), Drive::Closed { queue_depth: 8 }),
        None,
    )
    .unwrap();
    assert!(one.timed.ssd_members.is_empty());
    assert!(!serde_json::to_string(&one).unwrap().contains("ssd_members"));
    // A share under one record page is refused with the reason.
    let small = spec(HOT, CacheSize::Bytes(200 * ls), Mode::WriteThrough);
    let e = run_timed(&small, &two, None).unwrap_err().to_string();
    assert!(
        e.contains("split over 2 cache devices") && e.contains("128"),
        "{e}"
    );
}

#[test]
fn a_pool_member_failing_mid_run_drops_its_lines_and_the_rest_serve() {
    let ls = EngineConfig::default().line_size;
    let run = |mode: Mode, fail: Option<(usize, u64)>| {
        let s = spec(
            "zipf:theta=0.9,wss=64MiB,requests=8000,read=70,size=4k",
            CacheSize::Bytes(4096 * ls),
            mode,
        );
        let mut two = setup(Some("ssd:default"), Drive::Closed { queue_depth: 8 });
        two.pool = vec!["ssd:default".into()];
        two.options.fail_ssd = fail;
        // One copy per dirty line (`--dirty-copies 1`): what the failure loses is seen.
        two.options.dirty_copies = Some(1);
        run_timed(&s, &two, None)
    };
    let whole = run(Mode::WriteBack, None).unwrap();
    assert!(whole.timed.ssd_failure.is_none());
    let half = whole.timed.elapsed_s / 2.0;
    let at = (half * 1e9) as u64;
    let r = run(Mode::WriteBack, Some((1, at))).unwrap();
    let f = r.timed.ssd_failure.as_ref().expect("member 1 failed");
    assert_eq!(f.member, 1);
    assert!(f.at_s >= half, "failed at {} before {half}", f.at_s);
    assert!(f.dropped_clean > 0, "{f:?}");
    assert!(
        f.lost_dirty_lines > 0,
        "write-back with one copy loses: {f:?}"
    );
    // Nothing is placed on the failed member after the failure: only operations planned
    // before it (at most the queue depth's requests' worth) reach it.
    assert!(f.late_ops <= 64, "{f:?}");
    let m = &r.timed.ssd_members;
    let m_whole = &whole.timed.ssd_members;
    assert!(
        m[1].ops < m_whole[1].ops && m[0].ops > m[1].ops,
        "member 1 stops serving: {m:?} vs {m_whole:?}"
    );
    // Half the cache is gone for the second half: fewer hits than the whole run.
    assert!(
        r.sim.hit_ratio < whole.sim.hit_ratio,
        "{} vs {}",
        r.sim.hit_ratio,
        whole.sim.hit_ratio
    );
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"ssd_failure\"") && json.contains("lost_dirty_lines"));
    // Mirrored (the default on a write-back pool, as `serve`): the same failure loses no
    // dirty line, its lines are served from their copies.
    let s = spec(
        "zipf:theta=0.9,wss=64MiB,requests=8000,read=70,size=4k",
        CacheSize::Bytes(4096 * ls),
        Mode::WriteBack,
    );
    let mut two = setup(Some("ssd:default"), Drive::Closed { queue_depth: 8 });
    two.pool = vec!["ssd:default".into()];
    two.options.fail_ssd = Some((1, at));
    let m2 = run_timed(&s, &two, None).unwrap();
    let f2 = m2.timed.ssd_failure.as_ref().expect("member 1 failed");
    assert_eq!(f2.lost_dirty_lines, 0, "mirrored: {f2:?}");
    assert!(f2.promoted_dirty_lines > 0, "mirrored: {f2:?}");
    // Write-through: nothing dirty to lose.
    let wt = run(Mode::WriteThrough, Some((1, at))).unwrap();
    let f = wt.timed.ssd_failure.expect("failed");
    assert_eq!(f.lost_dirty_lines, 0);
    assert!(f.dropped_clean > 0);
    // Refusals name the reason.
    let e = run(Mode::WriteBack, Some((2, at))).unwrap_err().to_string();
    assert!(e.contains("2 members"), "{e}");
    let e = run(Mode::WriteBack, Some((1, 3_600_000_000_000)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("before that time"), "{e}");
    let s = spec(HOT, CacheSize::Bytes(4096 * ls), Mode::WriteBack);
    let mut one = setup(Some("ssd:default"), Drive::Closed { queue_depth: 8 });
    one.options.fail_ssd = Some((0, 0));
    let e = run_timed(&s, &one, None).unwrap_err().to_string();
    assert!(e.contains("two or more cache devices"), "{e}");
}
