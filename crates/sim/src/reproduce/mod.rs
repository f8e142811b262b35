//! `tiercache reproduce`: re-runs a seed document's experiment with our simulator and sets our
//! figures beside the published ones, with a one-line verdict. One file per experiment; the
//! settings are checked in under `experiments/reproduce/` (built in, or given as a file).

pub mod dss;
pub mod nitro;
pub mod qsan;
pub mod srt;
pub mod storage_bench;

use crate::experiment::CacheSection;
use crate::{Input, SimSpec, TimedReport, TimedSetup};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The experiments, by name.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "srt",
        "SRT study: SSD size sweep, write-through vs write-back, FIFO vs LIFO vs S-LRU",
    ),
    (
        "qsan",
        "Qsan: warm-up estimate vs simulated warm-up, IOPS before and after (test cases 1, 2)",
    ),
    (
        "storage-bench",
        "Storage Bench 2011: HDD alone vs HDD + small SSD cache vs SSD alone",
    ),
    (
        "dss",
        "DSS: Tables 3 and 4, no cache vs LRU vs DSS on 7200 and 15K RPM RAID 5, 10 % cache",
    ),
    (
        "nitro",
        "Nitro: (ND,NC) (ND,C) (D,NC) (D,C), extent vs WEU caching, read-hit ratio and erasures",
    ),
];

/// A line of the comparison table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub what: String,
    pub ours: String,
    pub published: String,
    /// This row's own one-line verdict (empty: the outcome's verdict covers it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub verdict: String,
}

/// A plot of our results.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Line series (name, points); empty for a bar chart.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// Bars (name, value); empty for a line chart.
    pub bars: Vec<(String, f64)>,
}

/// What one experiment found.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub name: String,
    pub title: String,
    /// The seed document the published figures come from.
    pub source: String,
    pub rows: Vec<Row>,
    pub plots: Vec<Plot>,
    /// One line: same direction, similar magnitude, or different and why.
    pub verdict: String,
    /// Settings used (the TOML text).
    pub config: String,
}

/// Runs experiment `name` with the built-in settings or `config` (TOML text); `requests`
/// overrides the request count (smaller = faster, less faithful).
pub fn run(name: &str, config: Option<&str>, requests: Option<u64>) -> Result<Outcome> {
    match name {
        "srt" => srt::run(config.unwrap_or(srt::CONFIG), requests),
        "qsan" => qsan::run(config.unwrap_or(qsan::CONFIG), requests),
        "storage-bench" => storage_bench::run(config.unwrap_or(storage_bench::CONFIG), requests),
        "dss" => dss::run(config.unwrap_or(dss::CONFIG), requests),
        "nitro" => nitro::run(config.unwrap_or(nitro::CONFIG), requests),
        other => anyhow::bail!(
            "no reproduction called '{other}'; known: {}",
            EXPERIMENTS
                .iter()
                .map(|e| e.0)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub(crate) fn parse<T: for<'de> Deserialize<'de>>(name: &str, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{name} settings: {e}"))
}

/// The synthetic input of a reproduction: `workload` plus `,requests=N`.
pub(crate) fn workload(spec: &str, requests: u64, seed: u64) -> Result<Input> {
    let full = format!("{spec},requests={requests}");
    Ok(Input::Workload {
        spec: full
            .parse()
            .map_err(|e| anyhow::anyhow!("workload '{full}': {e}"))?,
        seed,
    })
}

/// One timed run: `cache` settings over `input`, on `hdd` with `ssd` (None = no cache).
pub(crate) fn timed(
    input: &Input,
    cache: CacheSection,
    hdd: &str,
    ssd: Option<&str>,
    queue_depth: u32,
    seed: u64,
) -> Result<TimedReport> {
    let (cache_size, engine) = cache.resolve(seed)?;
    let spec = SimSpec {
        input: input.clone(),
        cache_size,
        engine,
        log: cache.log_spec(seed)?,
    };
    let mut setup = TimedSetup {
        hdd: hdd.to_string(),
        ssd: ssd.map(str::to_string),
        ..TimedSetup::default()
    };
    setup.options.drive = crate::Drive::Closed { queue_depth };
    crate::run_timed(&spec, &setup, None).with_context(|| format!("timed run on {hdd}"))
}

/// How a measured ratio (1 = no change) compares with the published one: "same direction,
/// similar magnitude" (within 1.5x of each other's gain), "same direction, larger/smaller
/// magnitude", or "different direction". Ratios within `flat` of 1 count as no change.
pub(crate) fn compare_ratio(ours: f64, published: f64, flat: f64) -> &'static str {
    let dir = |x: f64| {
        if (x - 1.0).abs() <= flat {
            0
        } else if x > 1.0 {
            1
        } else {
            -1
        }
    };
    match (dir(ours), dir(published)) {
        (0, 0) => "same (no change in both)",
        (a, b) if a != b => "different direction",
        _ => {
            // Compare the size of the effect on a log scale.
            let (a, b) = (ours.ln().abs(), published.ln().abs());
            if a > b * 1.5 {
                "same direction, larger magnitude"
            } else if b > a * 1.5 {
                "same direction, smaller magnitude"
            } else {
                "same direction, similar magnitude"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compare_ratio;

    #[test]
    fn ratio_verdicts() {
        assert_eq!(
            compare_ratio(2.0, 2.17, 0.05),
            "same direction, similar magnitude"
        );
        assert_eq!(
            compare_ratio(1.18, 2.17, 0.05),
            "same direction, smaller magnitude"
        );
        assert_eq!(
            compare_ratio(16.0, 5.4, 0.05),
            "same direction, larger magnitude"
        );
        assert_eq!(compare_ratio(0.8, 2.0, 0.05), "different direction");
        assert_eq!(compare_ratio(1.11, 0.99, 0.05), "different direction");
        assert_eq!(compare_ratio(1.02, 0.99, 0.05), "same (no change in both)");
    }
}
