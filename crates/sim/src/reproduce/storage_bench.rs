//! AnandTech Storage Bench 2011 on Intel SRT (seed 003): desktop trace playback on an HDD
//! alone, the HDD with a small SSD cache, and an SSD alone; average MB/s and disk-busy time.
//!
//! Published (charts without numbers in the text): with a 20 GB SSD cache the old 7200 rpm
//! drive is "easily 41 % faster" than a VelociRaptor; overall "more like a doubling of
//! standalone HDD performance rather than the multi-x increase" of an SSD alone; pure write
//! performance is better with the cache disabled than enabled.

use super::{claims, parse, timed, workload, ClaimDef, Measured, Outcome, Plot, Row, Sense};
use crate::experiment::CacheSection;
use crate::TimedReport;
use anyhow::Result;
use serde::Deserialize;

/// Built-in settings.
pub const CONFIG: &str = include_str!("../../../../experiments/reproduce/storage-bench.toml");

const SYNTHETIC: &str = "the article's trace is not public: ours is synthetic with its published inputs (3.95 M operations, 55 % reads, 42 % sequential, its listed sizes) but our guesses for its hot set and working set, on which the cache's gain depends";

/// The seed's headline claims (the article's text; its charts carry the numbers).
pub const CLAIMS: &[ClaimDef] = &[
    ClaimDef {
        id: "storage_bench.cache_over_hdd",
        text: "with a 20 GB SSD 311 cache, performance is 'more like a doubling of standalone HDD performance'",
        seed: 2.0,
        unit: "x (average MB/s, cached / HDD alone)",
        sense: Sense::Within,
        tolerance: 0.5,
        neutral: 1.0,
        gap: SYNTHETIC,
    },
    ClaimDef {
        id: "storage_bench.cache_over_velociraptor",
        text: "the 7200 rpm drive with the cache is 'easily 41 % faster' than a VelociRaptor alone",
        seed: 1.41,
        unit: "x (average MB/s, cached 7200 / VelociRaptor alone)",
        sense: Sense::Within,
        tolerance: 0.35,
        neutral: 1.0,
        gap: SYNTHETIC,
    },
    ClaimDef {
        id: "storage_bench.ssd_over_hdd",
        text: "an SSD alone is a 'multi-x increase' over the HDD (read as at least 3x)",
        seed: 3.0,
        unit: "x (average MB/s, SSD alone / HDD alone)",
        sense: Sense::AtLeast,
        tolerance: 0.0,
        neutral: 1.0,
        gap: SYNTHETIC,
    },
    ClaimDef {
        id: "storage_bench.write_cache_over_hdd",
        text: "pure write performance is better with the cache disabled than enabled",
        seed: 1.0,
        unit: "x (write MB/s per write-busy second, cached / HDD alone)",
        sense: Sense::AtMost,
        tolerance: 0.0,
        neutral: 1.0,
        gap: "our write-through cache writes every write to the HDD as the HDD alone does, and the SSD's share adds little busy time",
    },
    ClaimDef {
        id: "storage_bench.c300_over_311",
        text: "with a Crucial C300 (64 GB) as the cache drive instead, 'performance went up a bit but not much'",
        seed: 1.05,
        unit: "x (average MB/s, C300 cache / SSD 311 cache)",
        sense: Sense::Within,
        tolerance: 0.1,
        neutral: 1.0,
        gap: "our C300 preset has the datasheet's faster reads (355 MB/s, 60,000 IOPS) but its 64 GB model's slower writes (75 MB/s against the 311's 105 MB/s), and on our synthetic trace every cache miss and write-through write also programs the cache drive",
    },
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[allow(dead_code)]
    name: String,
    workload: String,
    requests: u64,
    seed: u64,
    hdd: String,
    ssd: String,
    queue_depth: u32,
    cache_size: String,
    /// The faster HDD the article compares with (its VelociRaptor); "" = not run.
    #[serde(default)]
    compare_hdd: String,
    /// The SSD run alone; "" = the cache drive `ssd` (too small when the working set is
    /// larger than it: the run would fold the volume onto it).
    #[serde(default)]
    ssd_alone: String,
    /// The other cache drive the article tried (its Crucial C300 64 GB), same cache size;
    /// "" = not run.
    #[serde(default)]
    compare_ssd: String,
}

pub fn run(config: &str, requests: Option<u64>) -> Result<Outcome> {
    let s: Settings = parse("storage-bench", config)?;
    let input = workload(&s.workload, requests.unwrap_or(s.requests), s.seed)?;
    let cache = CacheSection {
        size: Some(s.cache_size.clone()),
        ..Default::default()
    };
    let hdd = timed(&input, cache.clone(), &s.hdd, None, s.queue_depth, s.seed)?;
    let cached = timed(
        &input,
        cache.clone(),
        &s.hdd,
        Some(&s.ssd),
        s.queue_depth,
        s.seed,
    )?;
    let ssd_alone = if s.ssd_alone.is_empty() {
        &s.ssd
    } else {
        &s.ssd_alone
    };
    let ssd = timed(
        &input,
        cache.clone(),
        ssd_alone,
        None,
        s.queue_depth,
        s.seed,
    )?;
    let fast_hdd = if s.compare_hdd.is_empty() {
        None
    } else {
        Some(timed(
            &input,
            cache.clone(),
            &s.compare_hdd,
            None,
            s.queue_depth,
            s.seed,
        )?)
    };
    let other_cache = if s.compare_ssd.is_empty() {
        None
    } else {
        Some(timed(
            &input,
            cache.clone(),
            &s.hdd,
            Some(&s.compare_ssd),
            s.queue_depth,
            s.seed,
        )?)
    };
    let runs: [(&str, &TimedReport); 3] = [
        ("HDD alone", &hdd),
        ("HDD + SSD cache", &cached),
        ("SSD alone", &ssd),
    ];
    // The plots also show the faster HDD alone, when it ran.
    let fast_name = format!("{} alone", s.compare_hdd);
    let other_name = format!("HDD + {} cache", s.compare_ssd);
    let plotted: Vec<(&str, &TimedReport)> = runs
        .iter()
        .copied()
        .chain(fast_hdd.as_ref().map(|f| (fast_name.as_str(), f)))
        .chain(other_cache.as_ref().map(|c| (other_name.as_str(), c)))
        .collect();
    let mut rows = Vec::new();
    for (name, r) in runs {
        let busy: f64 = r.busy_s.values().sum();
        rows.push(Row {
            what: name.into(),
            ours: format!(
                "{:.1} MB/s (read {:.1}, write {:.1}); disk busy {:.1} s (read {:.1}, write {:.1})",
                r.timed.mb_per_s,
                r.timed.read_mb_per_s,
                r.timed.write_mb_per_s,
                busy,
                busy_kind(r, false),
                busy_kind(r, true)
            ),
            published: match name {
                "HDD alone" => "baseline (Hitachi 7200 rpm 1 TB)".into(),
                "HDD + SSD cache" => "about 2x the HDD; 41 % faster than a VelociRaptor".into(),
                _ => format!("multi-x the HDD (ours: {ssd_alone})"),
            },
            ..Default::default()
        });
    }
    if let Some(f) = &fast_hdd {
        rows.push(Row {
            what: format!("{} alone", s.compare_hdd),
            ours: format!(
                "{:.1} MB/s (read {:.1}, write {:.1})",
                f.timed.mb_per_s, f.timed.read_mb_per_s, f.timed.write_mb_per_s
            ),
            published: "WD VelociRaptor 600 GB: the cached 7200 rpm drive is 41 % faster".into(),
            ..Default::default()
        });
    }
    if let Some(c) = &other_cache {
        rows.push(Row {
            what: other_name.clone(),
            ours: format!(
                "{:.1} MB/s (read {:.1}, write {:.1}) = {:.2}x the {} cache",
                c.timed.mb_per_s,
                c.timed.read_mb_per_s,
                c.timed.write_mb_per_s,
                c.timed.mb_per_s / cached.timed.mb_per_s.max(1e-9),
                s.ssd
            ),
            published: "Crucial RealSSD C300 64 GB as the cache: 'performance went up a bit but not much', read speed the most".into(),
            ..Default::default()
        });
    }
    let speedup = cached.timed.mb_per_s / hdd.timed.mb_per_s.max(1e-9);
    let basis = format!(
        "{} requests of {}, {} + {} cache {}, QD {}",
        cached.sim.requests, s.workload, s.hdd, s.ssd, s.cache_size, s.queue_depth
    );
    let measured = vec![
        (
            "storage_bench.cache_over_hdd",
            Measured::value(speedup, basis.clone()),
        ),
        (
            "storage_bench.cache_over_velociraptor",
            match &fast_hdd {
                Some(f) => Measured::value(
                    cached.timed.mb_per_s / f.timed.mb_per_s.max(1e-9),
                    format!("{basis}; {} alone", s.compare_hdd),
                ),
                None => Measured::missing("the settings name no `compare_hdd`"),
            },
        ),
        (
            "storage_bench.ssd_over_hdd",
            Measured::value(
                ssd.timed.mb_per_s / hdd.timed.mb_per_s.max(1e-9),
                format!("{basis}; {} alone", s.ssd),
            ),
        ),
        (
            "storage_bench.write_cache_over_hdd",
            // The same write bytes in both runs, so MB/s per write-busy second is the inverse
            // ratio of write-busy time.
            Measured::value(
                busy_kind(&hdd, true) / busy_kind(&cached, true).max(1e-12),
                basis.clone(),
            ),
        ),
        (
            "storage_bench.c300_over_311",
            match &other_cache {
                Some(c) => Measured::value(
                    c.timed.mb_per_s / cached.timed.mb_per_s.max(1e-9),
                    format!("{basis}; {} cache instead", s.compare_ssd),
                ),
                None => Measured::missing("the settings name no `compare_ssd` (the C300)"),
            },
        ),
    ];
    let ssd_x = ssd.timed.mb_per_s / hdd.timed.mb_per_s.max(1e-9);
    let order =
        hdd.timed.mb_per_s < cached.timed.mb_per_s && cached.timed.mb_per_s < ssd.timed.mb_per_s;
    // Write MB/s per second the disks spent on writes (the same write bytes in every run):
    // MB/s over the whole run's wall clock would move with the reads too.
    let write_worse = busy_kind(&cached, true) > busy_kind(&hdd, true);
    let verdict = format!(
        "{}: cache {:.1}x the HDD (article: ~2x), SSD alone {:.1}x; writes (per write-busy second) with the cache {} than without ({})",
        if order { "same ordering" } else { "different ordering" },
        speedup,
        ssd_x,
        if write_worse { "slower" } else { "not slower" },
        if write_worse {
            "same direction as the article"
        } else {
            "different: our write-through cache writes every write to the HDD as the HDD alone does, and the SSD's share adds little busy time"
        }
    );
    let bars = |f: &dyn Fn(&TimedReport) -> f64| -> Vec<(String, f64)> {
        plotted.iter().map(|(n, r)| (n.to_string(), f(r))).collect()
    };
    let plots = vec![
        Plot {
            title: "Storage Bench: average MB/s (all)".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| r.timed.mb_per_s),
        },
        Plot {
            title: "Storage Bench: average read MB/s".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| r.timed.read_mb_per_s),
        },
        Plot {
            title: "Storage Bench: average write MB/s".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| r.timed.write_mb_per_s),
        },
        Plot {
            title: "Storage Bench: disk busy time (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| r.busy_s.values().sum()),
        },
        Plot {
            title: "Storage Bench: disk busy time, reads (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| busy_kind(r, false)),
        },
        Plot {
            title: "Storage Bench: disk busy time, writes (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
            markers: vec![],
            bars: bars(&|r| busy_kind(r, true)),
        },
    ];
    Ok(Outcome {
        name: "storage-bench".into(),
        title: "Storage Bench 2011: HDD vs HDD + SSD cache vs SSD".into(),
        source: "seed 003: AnandTech, Intel SRT review, Storage Bench 2011 (2011)".into(),
        rows,
        plots,
        verdict,
        config: config.to_string(),
        claims: claims(CLAIMS, measured),
    })
}

/// Busy seconds attributed to reads (or writes), summed over the HDD and the SSD (a device
/// with both in it splits its time by their op counts).
fn busy_kind(r: &TimedReport, write: bool) -> f64 {
    let pick = |d: &crate::timed::DeviceUse| if write { d.write_busy_s } else { d.read_busy_s };
    pick(&r.timed.hdd) + r.timed.ssd.as_ref().map(pick).unwrap_or(0.0)
}
