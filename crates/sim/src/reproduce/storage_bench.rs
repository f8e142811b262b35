//! AnandTech Storage Bench 2011 on Intel SRT (seed 003): desktop trace playback on an HDD
//! alone, the HDD with a small SSD cache, and an SSD alone; average MB/s and disk-busy time.
//!
//! Published (charts without numbers in the text): with a 20 GB SSD cache the old 7200 rpm
//! drive is "easily 41 % faster" than a VelociRaptor; overall "more like a doubling of
//! standalone HDD performance rather than the multi-x increase" of an SSD alone; pure write
//! performance is better with the cache disabled than enabled.

use super::{parse, timed, workload, Outcome, Plot, Row};
use crate::experiment::CacheSection;
use crate::TimedReport;
use anyhow::Result;
use serde::Deserialize;

/// Built-in settings.
pub const CONFIG: &str = include_str!("../../../../experiments/reproduce/storage-bench.toml");

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
    let ssd = timed(&input, cache, &s.ssd, None, s.queue_depth, s.seed)?;
    let runs: [(&str, &TimedReport); 3] = [
        ("HDD alone", &hdd),
        ("HDD + SSD cache", &cached),
        ("SSD alone", &ssd),
    ];
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
                "HDD alone" => "baseline (Hitachi 7200 rpm 1 TB)",
                "HDD + SSD cache" => "about 2x the HDD; 41 % faster than a VelociRaptor",
                _ => "multi-x the HDD",
            }
            .into(),
            ..Default::default()
        });
    }
    let speedup = cached.timed.mb_per_s / hdd.timed.mb_per_s.max(1e-9);
    let ssd_x = ssd.timed.mb_per_s / hdd.timed.mb_per_s.max(1e-9);
    let order =
        hdd.timed.mb_per_s < cached.timed.mb_per_s && cached.timed.mb_per_s < ssd.timed.mb_per_s;
    let write_worse = cached.timed.write_mb_per_s < hdd.timed.write_mb_per_s;
    let verdict = format!(
        "{}: cache {:.1}x the HDD (article: ~2x), SSD alone {:.1}x; writes with the cache {} than without ({})",
        if order { "same ordering" } else { "different ordering" },
        speedup,
        ssd_x,
        if write_worse { "slower" } else { "not slower" },
        if write_worse {
            "same direction as the article"
        } else {
            "different: our write-through cache writes the HDD at the same rate and the hot-set reads it saves free the disk for writes"
        }
    );
    let bars = |f: &dyn Fn(&TimedReport) -> f64| -> Vec<(String, f64)> {
        runs.iter().map(|(n, r)| (n.to_string(), f(r))).collect()
    };
    let plots = vec![
        Plot {
            title: "Storage Bench: average MB/s (all)".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            bars: bars(&|r| r.timed.mb_per_s),
        },
        Plot {
            title: "Storage Bench: average read MB/s".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            bars: bars(&|r| r.timed.read_mb_per_s),
        },
        Plot {
            title: "Storage Bench: average write MB/s".into(),
            x_label: String::new(),
            y_label: "MB/s".into(),
            series: vec![],
            bars: bars(&|r| r.timed.write_mb_per_s),
        },
        Plot {
            title: "Storage Bench: disk busy time (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
            bars: bars(&|r| r.busy_s.values().sum()),
        },
        Plot {
            title: "Storage Bench: disk busy time, reads (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
            bars: bars(&|r| busy_kind(r, false)),
        },
        Plot {
            title: "Storage Bench: disk busy time, writes (s)".into(),
            x_label: String::new(),
            y_label: "seconds".into(),
            series: vec![],
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
    })
}

/// Busy seconds attributed to reads (or writes), summed over the HDD and the SSD (a device
/// with both in it splits its time by their op counts).
fn busy_kind(r: &TimedReport, write: bool) -> f64 {
    let pick = |d: &crate::timed::DeviceUse| if write { d.write_busy_s } else { d.read_busy_s };
    pick(&r.timed.hdd) + r.timed.ssd.as_ref().map(pick).unwrap_or(0.0)
}
