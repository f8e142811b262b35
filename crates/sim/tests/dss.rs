//! The DSS seed's claim at a small scale: selective allocation and eviction beat LRU by at
//! least 1.5x on the find phases (metadata walks) and are no worse than LRU overall.

use tiercache_sim::dss::{self, DssOptions};
use tiercache_sim::fileserver::FileserverSpec;

#[test]
fn dss_beats_lru_on_find_phases_and_overall() {
    let opts = DssOptions {
        workload: FileserverSpec::scaled(0.001),
        disks: vec!["hdd:7200".into()],
        ..Default::default()
    };
    let rep = dss::run(&opts, None).unwrap();
    println!("{}", dss::render(&rep));
    let lru = rep.run("hdd:7200", "lru").unwrap();
    let d = rep.run("hdd:7200", "dss").unwrap();
    let none = rep.run("hdd:7200", "none").unwrap();
    for phase in ["MacroPrefind", "MacroFind"] {
        let (l, s) = (lru.phase(phase).unwrap(), d.phase(phase).unwrap());
        assert!(
            l.seconds >= 1.5 * s.seconds,
            "{phase}: LRU {:.2} s, DSS {:.2} s: less than 1.5x",
            l.seconds,
            s.seconds
        );
    }
    assert!(
        d.total_s() <= lru.total_s(),
        "DSS {:.1} s overall, LRU {:.1} s",
        d.total_s(),
        lru.total_s()
    );
    assert!(d.total_s() < none.total_s());
    assert!(d.mean_iops() > lru.mean_iops());
}

/// Issue 18's open case: `reproduce dss`'s second run (a watermark cleaner, dirty 30 % / 10 %,
/// QD 1 on a RAID 5 of 7200 RPM disks). DSS used to write a large file being created around
/// the cache in 64 KiB partial-stripe writes (its list was one request deep, so each victim
/// was a dirty line of its own priority), or to evict lines cleaned a moment before: its
/// write-back ran in the request's path. DSS must not be far behind LRU on the phases it
/// does not target (MacroSetup, MacroTrans, MacroArchive, MacroScan) and must still win the
/// walks.
#[test]
fn dss_with_a_watermark_cleaner_keeps_up_with_lru_outside_its_targets() {
    let opts = DssOptions {
        workload: FileserverSpec::scaled(0.005),
        disks: vec!["hdd:7200".into()],
        cleaner: Some((0.3, 0.1)),
        ..Default::default()
    };
    let rep = dss::run(&opts, None).unwrap();
    let lru = rep.run("hdd:7200", "lru").unwrap();
    let d = rep.run("hdd:7200", "dss").unwrap();
    let secs = |r: &dss::RunResult, p: &str| r.phase(p).unwrap().seconds;
    let ratios: Vec<(&str, f64)> = [
        "MacroSetup",
        "MacroTrans",
        "MacroPrefind",
        "MacroArchive",
        "MacroFind",
        "MacroScan",
    ]
    .into_iter()
    .map(|p| (p, secs(d, p) / secs(lru, p)))
    .collect();
    println!("DSS / LRU time per phase: {ratios:?}");
    for r in [lru, d] {
        for p in &r.phases {
            println!(
                "{} {}: {:.1} s {:?}",
                r.config, p.phase, p.seconds, p.counters
            );
        }
    }
    // Issue 18's open case, MacroArchive (see the next test): LRU's walk misses and gives the
    // HDD time to work off MacroTrans's queued write-backs; DSS's walk hits the SSD.
    let pre = |r: &dss::RunResult| r.phase("MacroPrefind").unwrap().counters.hdd_bytes_written;
    assert!(
        pre(lru) > 4 * pre(d).max(1 << 20),
        "HDD writes during the first walk: LRU {} B, DSS {} B",
        pre(lru),
        pre(d)
    );
    for &(p, x) in &ratios {
        if p == "MacroPrefind" || p == "MacroFind" {
            assert!(
                x < 0.5,
                "{p}: DSS takes {x:.2}x LRU's time on a walk it targets"
            );
        } else {
            assert!(x <= 1.25, "{p}: DSS takes {x:.2}x LRU's time");
        }
    }
}

/// Where DSS's extra MacroArchive time in `reproduce dss`'s second run comes from (issue 18:
/// 1.22x LRU at 7200 RPM, 1.28x at 15K). Not its own writes: the HDD still owes
/// MacroTrans's queued write-backs when the walks start. LRU's walk misses (its metadata is
/// not cached) and takes tens of seconds, during which the HDD works them off (the test
/// above checks it); DSS's walk hits the SSD and takes a second, so the backlog lands in
/// MacroArchive. With the walks left out both carry it into MacroArchive, and DSS is then
/// no slower there.
#[test]
fn without_the_walks_dss_keeps_up_with_lru_on_archive() {
    use tiercache_sim::fileserver::Phase;
    let mut workload = FileserverSpec::scaled(0.005);
    workload.phases = vec![Phase::Setup, Phase::Trans, Phase::Archive];
    let opts = DssOptions {
        workload,
        disks: vec!["hdd:7200".into()],
        cleaner: Some((0.3, 0.1)),
        ..Default::default()
    };
    let rep = dss::run(&opts, None).unwrap();
    let arch = |c: &str| {
        rep.run("hdd:7200", c)
            .unwrap()
            .phase("MacroArchive")
            .unwrap()
            .seconds
    };
    let x = arch("dss") / arch("lru");
    println!(
        "MacroArchive without the walks: LRU {:.1} s, DSS {:.1} s ({x:.2}x)",
        arch("lru"),
        arch("dss")
    );
    assert!(
        x <= 1.1,
        "without the walks DSS takes {x:.2}x LRU's MacroArchive time"
    );
}

/// Issue 18's own command at a small scale, QD 4, the engine's default watermarks
/// (`tiercache sim --workload fileserver:scale=S --hdd 7200 --ssd intel-710 --cache-size 10%
/// --mode write-back --admission nhit:0:1 --queue-depth 4`), on a RAID 5 of 4 x `hdd:7200`
/// (1.5 TB) that holds the fileserver's declared 1 TB volume: one 500 GB disk would fold it
/// (and a timed run that declares its volume refuses to). The issue
/// measured DSS 6x LRU's MacroSetup time and 2.8x its MacroTrans (selective eviction chose
/// dirty lines of large files, so evictions waited for HDD writes). DSS must stay within
/// 1.25x of LRU on every phase it does not target, and win the walks.
#[test]
fn dss_keeps_up_with_lru_at_queue_depth_4() {
    use tiercache_engine::{Admission, CacheSize, EngineConfig, Mode};
    use tiercache_sim::{run_timed, Drive, Input, SimSpec, TimedOptions, TimedSetup};
    let trace = tiercache_sim::fileserver::generate(&FileserverSpec::scaled(0.002), 1);
    let volume = trace.volume_bytes;
    let phase_starts: Vec<u64> = trace.phases.iter().map(|p| p.start as u64).collect();
    let names: Vec<&str> = trace.phases.iter().map(|p| p.phase.name()).collect();
    let input = Input::Memory {
        name: "fileserver:scale=0.002".into(),
        requests: std::sync::Arc::new(trace.requests),
    };
    let run = |policy: &str| {
        let spec = SimSpec {
            input: input.clone(),
            cache_size: CacheSize::Percent(10.0),
            engine: EngineConfig {
                policy: policy.into(),
                mode: Mode::WriteBack,
                admission: Admission {
                    read_threshold: 0,
                    write_threshold: 1,
                },
                ..Default::default()
            },
            log: None,
        };
        let setup = TimedSetup {
            hdd: "hdd:7200".into(),
            raid: Some((5, 4)),
            ssd: Some("ssd:intel-710".into()),
            options: TimedOptions {
                drive: Drive::Closed { queue_depth: 4 },
                phase_starts: phase_starts.clone(),
                volume_bytes: Some(volume),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = run_timed(&spec, &setup, None).unwrap().timed;
        assert_eq!(t.wrapped_requests, 0, "the volume folded onto the RAID");
        t
    };
    let (lru, d) = (run("lru"), run("dss"));
    for (i, name) in names.iter().enumerate() {
        let (l, s) = (lru.phase_s[i], d.phase_s[i]);
        println!(
            "{name}: LRU {l:.1} s, DSS {s:.1} s ({:.2}x); DSS {:?}",
            s / l,
            d.phase_counters[i]
        );
        match *name {
            "MacroPrefind" | "MacroFind" => {
                assert!(s < 0.5 * l, "{name}: DSS {s:.1} s, LRU {l:.1} s: no win")
            }
            _ => assert!(s <= 1.25 * l, "{name}: DSS {s:.1} s is {:.2}x LRU's", s / l),
        }
    }
}
