//! The DSS seed's Table 3 and Table 4 in simulation (`tiercache dss-table`).
//!
//! The file-server phases ([`crate::fileserver`]) are replayed, timed, on a 5-disk RAID 5 of
//! 7200 RPM and of 15K RPM HDD models, with no cache, an LRU cache and a DSS cache of 10 % of
//! the footprint on the Intel SSD 710 model. As in the seed (Table 2) both caches are
//! write-allocate and write-back with read allocation off. Each phase's time to complete and
//! IOPS (block requests / second) are measured from the phase marks, and the DSS figure of
//! merit, cost / MB / IOPS, from the price table. The seed's figures are printed beside ours.

use crate::fileserver::{self, FileserverSpec, Phase};
use crate::{Input, SimSpec, TimedOptions, TimedSetup};
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::Arc;
use tiercache_engine::{Admission, CacheSize, ClassTable, EngineConfig, Mode};

/// What to run.
#[derive(Clone, Debug)]
pub struct DssOptions {
    pub workload: FileserverSpec,
    pub seed: u64,
    /// Cache size in percent of the footprint (the seed: 10 %).
    pub cache_percent: f64,
    /// Disk presets (the seed: 7200 and 15K RPM).
    pub disks: Vec<String>,
    /// RAID 5 members (the seed: 5).
    pub raid_members: usize,
    pub ssd: String,
    pub prices: tiercache_devices::PriceTable,
    /// Class table for DSS (default: the seed's file-system table).
    pub classes: Arc<ClassTable>,
    /// Watermark cleaning of both caches: (dirty_high, dirty_low). None (the default, as the
    /// seed's "LRU ~ no cache" implies): dirty lines are written back on eviction and at idle
    /// times only (see [`IDLE_CLEAN`]).
    pub cleaner: Option<(f64, f64)>,
}

impl Default for DssOptions {
    fn default() -> Self {
        DssOptions {
            workload: FileserverSpec::default(),
            seed: 1,
            cache_percent: 10.0,
            disks: vec!["hdd:7200".into(), "hdd:15k".into()],
            raid_members: 5,
            ssd: "ssd:intel-710".into(),
            prices: tiercache_devices::PriceTable::default(),
            classes: Arc::new(ClassTable::filesystem()),
            cleaner: None,
        }
    }
}

/// Cleaning watermarks of both caches.
pub const DIRTY_HIGH: f64 = 1.0;
pub const DIRTY_LOW: f64 = 1.0;

/// Idle-time cleaning of both caches (write-back of a few lines whenever the HDD has been idle
/// for 20 ms), on as in every timed run; only watermark cleaning is off. (This was always the
/// behaviour: the options took `TimedOptions::default()`. Turning it off too leaves the caches
/// all dirty, and a default-scale run then did not finish in 10 CPU-minutes.)
pub const IDLE_CLEAN: bool = true;

/// The three configurations compared.
pub const CONFIGS: [&str; 3] = ["none", "lru", "dss"];

/// One phase of one run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    pub phase: &'static str,
    pub requests: u64,
    pub seconds: f64,
    pub iops: f64,
    pub cost_per_mb_per_iops: Option<f64>,
    /// What happened in the phase: write-backs, waits, HDD busy by direction (see
    /// [`crate::timed::PhaseCounters`]; the last phase includes the final drain).
    pub counters: crate::timed::PhaseCounters,
}

/// One configuration on one disk.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub disk: String,
    pub config: &'static str,
    pub cost_usd: Option<f64>,
    pub hit_ratio: f64,
    pub phases: Vec<PhaseResult>,
}

impl RunResult {
    /// Phases the seed reports (all but MacroSetup).
    fn measured(&self) -> impl Iterator<Item = &PhaseResult> {
        self.phases
            .iter()
            .filter(|p| p.phase != Phase::Setup.name())
    }
    pub fn total_s(&self) -> f64 {
        self.measured().map(|p| p.seconds).sum()
    }
    pub fn mean_iops(&self) -> f64 {
        mean(self.measured().map(|p| p.iops))
    }
    pub fn mean_cost(&self) -> Option<f64> {
        let v: Option<Vec<f64>> = self.measured().map(|p| p.cost_per_mb_per_iops).collect();
        v.filter(|v| !v.is_empty()).map(|v| mean(v.into_iter()))
    }
    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.phases.iter().find(|p| p.phase == name)
    }
}

fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// Everything `dss-table` measured.
#[derive(Clone, Debug, Serialize)]
pub struct DssReport {
    pub workload: String,
    pub requests: u64,
    pub data_bytes: u64,
    pub runs: Vec<RunResult>,
    /// Where each priced device's figure comes from (`device: price, source`).
    pub prices: Vec<String>,
}

impl DssReport {
    pub fn run(&self, disk: &str, config: &str) -> Option<&RunResult> {
        self.runs
            .iter()
            .find(|r| r.disk == disk && r.config == config)
    }
}

/// The engine configuration of one of [`CONFIGS`].
pub fn engine_config(config: &str, classes: &Arc<ClassTable>) -> EngineConfig {
    engine_config_with(config, classes, None)
}

/// [`engine_config`] with a background cleaner's watermarks (see [`DssOptions::cleaner`]).
pub fn engine_config_with(
    config: &str,
    classes: &Arc<ClassTable>,
    cleaner: Option<(f64, f64)>,
) -> EngineConfig {
    let (dirty_high, dirty_low) = cleaner.unwrap_or((DIRTY_HIGH, DIRTY_LOW));
    let mut cfg = EngineConfig {
        policy: if config == "dss" { "dss" } else { "lru" }.into(),
        mode: Mode::WriteBack,
        // Write-allocate, no read allocation (the seed, Table 2).
        admission: Admission {
            read_threshold: 0,
            write_threshold: 1,
        },
        dirty_high,
        dirty_low,
        ..Default::default()
    };
    if config == "dss" {
        cfg.policy_params.classes = Some(Arc::clone(classes));
    }
    cfg
}

/// Runs every disk x configuration. `progress` is told each finished run.
pub fn run(opts: &DssOptions, progress: Option<&(dyn Fn(&RunResult) + Sync)>) -> Result<DssReport> {
    let trace = fileserver::generate(&opts.workload, opts.seed);
    let requests = Arc::new(trace.requests);
    let input = Input::Memory {
        name: opts.workload.to_string(),
        requests: Arc::clone(&requests),
    };
    let phase_starts: Vec<u64> = trace.phases.iter().map(|p| p.start as u64).collect();
    let jobs: Vec<(String, &'static str)> = opts
        .disks
        .iter()
        .flat_map(|d| CONFIGS.iter().map(move |c| (d.clone(), *c)))
        // No cache does not depend on the cleaner: with one, only the caches are run.
        .filter(|(_, c)| opts.cleaner.is_none() || *c != "none")
        .collect();
    use rayon::prelude::*;
    let runs: Vec<RunResult> =
        jobs.par_iter()
            .map(|(disk, config)| -> Result<RunResult> {
                let spec = SimSpec {
                    input: input.clone(),
                    cache_size: CacheSize::Percent(opts.cache_percent),
                    engine: engine_config_with(config, &opts.classes, opts.cleaner),
                    log: None,
                };
                let setup = TimedSetup {
                    hdd: disk.clone(),
                    raid: Some((5, opts.raid_members)),
                    ssd: (*config != "none").then(|| opts.ssd.clone()),
                    pool: Vec::new(),
                    options: TimedOptions {
                        phase_starts: phase_starts.clone(),
                        idle_clean: IDLE_CLEAN || opts.cleaner.is_some(),
                        volume_bytes: Some(trace.volume_bytes),
                        ..Default::default()
                    },
                    prices: opts.prices.clone(),
                };
                let rep = crate::run_timed(&spec, &setup, None)
                    .with_context(|| format!("{config} on {disk}"))?;
                let cap_bytes = hdd_capacity(&setup)?;
                let phases = trace
                    .phases
                    .iter()
                    .zip(&rep.timed.phase_s)
                    .zip(&rep.timed.phase_counters)
                    .map(|((p, &s), c)| {
                        let n = (p.end - p.start) as u64;
                        let iops = if s > 0.0 { n as f64 / s } else { 0.0 };
                        PhaseResult {
                            phase: p.phase.name(),
                            requests: n,
                            seconds: s,
                            iops,
                            cost_per_mb_per_iops: rep.cost_usd.filter(|_| iops > 0.0).map(|c| {
                                tiercache_devices::usd_per_mb_per_iops(c, cap_bytes, iops)
                            }),
                            counters: c.clone(),
                        }
                    })
                    .collect();
                let r = RunResult {
                    disk: disk.clone(),
                    config,
                    cost_usd: rep.cost_usd,
                    hit_ratio: rep.sim.hit_ratio,
                    phases,
                };
                if let Some(p) = progress {
                    p(&r);
                }
                Ok(r)
            })
            .collect::<Result<_>>()?;
    let prices = opts
        .disks
        .iter()
        .chain(std::iter::once(&opts.ssd))
        .map(|d| match opts.prices.get(d) {
            Some(e) => format!(
                "{d}: {} at USD {:.2}/GB, {}",
                e.device,
                e.price.usd_per_gb(),
                e.source
            ),
            None => format!("{d}: no sourced price (--prices FILE adds one)"),
        })
        .collect();
    Ok(DssReport {
        workload: opts.workload.to_string(),
        requests: requests.len() as u64,
        data_bytes: trace.data_bytes,
        runs,
        prices,
    })
}

fn hdd_capacity(setup: &TimedSetup) -> Result<u64> {
    let member: tiercache_devices::DeviceSpec = setup
        .hdd
        .parse()
        .map_err(|e| anyhow::anyhow!("device '{}': {e}", setup.hdd))?;
    let one = tiercache_devices::build(&member)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .capacity_bytes();
    Ok(match setup.raid {
        Some((5, n)) => one * (n as u64 - 1),
        Some((_, n)) => one * n as u64,
        None => one,
    })
}

/// The seed's figures (Figure 4 times for 7200 RPM, Figure 5 speed-ups, Tables 3 and 4).
pub struct Seed {
    pub disk: &'static str,
    /// DSS speed-up over no cache and over LRU per phase (Trans, Prefind, Archive, Find, Scan).
    pub dss_vs_hdd: [f64; 5],
    pub dss_vs_lru: [f64; 5],
    /// Table 3: average relative application performance (HDD, LRU, DSS), average IOPS.
    pub rel_perf: [f64; 3],
    pub avg_iops: [f64; 3],
    /// Table 4: average cost per MB per IOPS (USD).
    pub cost: [f64; 3],
}

pub const SEED: [Seed; 2] = [
    Seed {
        disk: "hdd:7200",
        dss_vs_hdd: [2.4, 5.4, 1.9, 5.6, 1.8],
        dss_vs_lru: [2.0, 4.5, 2.3, 6.8, 1.8],
        rel_perf: [1.00, 0.99, 2.17],
        avg_iops: [162.0, 161.0, 468.0],
        cost: [0.88, 1.43, 0.49],
    },
    Seed {
        disk: "hdd:15k",
        dss_vs_hdd: [2.0, 3.9, 1.9, 4.0, 1.5],
        dss_vs_lru: [1.8, 3.2, 2.4, 4.0, 1.5],
        rel_perf: [1.00, 0.99, 1.76],
        avg_iops: [231.0, 228.0, 556.0],
        cost: [5.47, 6.81, 2.80],
    },
];

const MEASURED: [Phase; 5] = [
    Phase::Trans,
    Phase::Prefind,
    Phase::Archive,
    Phase::Find,
    Phase::Scan,
];

/// The report as text: per disk, per phase times and speed-ups, then Tables 3 and 4, each
/// beside the seed's figures.
pub fn render(rep: &DssReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "DSS file-server benchmark: {} ({} requests, {:.2} GB of file data), 10 % cache, \
         write-back, write-allocate only",
        rep.workload,
        rep.requests,
        rep.data_bytes as f64 / 1e9
    );
    for seed in &SEED {
        let (Some(h), Some(l), Some(d)) = (
            rep.run(seed.disk, "none"),
            rep.run(seed.disk, "lru"),
            rep.run(seed.disk, "dss"),
        ) else {
            continue;
        };
        let _ = writeln!(s, "\n== {} (RAID 5 of 5) ==", seed.disk);
        let _ = writeln!(
            s,
            "{:<13} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}  {:>13} {:>13}",
            "phase",
            "HDD s",
            "LRU s",
            "DSS s",
            "HDD IOPS",
            "LRU IOPS",
            "DSS IOPS",
            "DSS/HDD (seed)",
            "DSS/LRU (seed)"
        );
        for (i, ph) in MEASURED.iter().enumerate() {
            let n = ph.name();
            let (Some(ph_h), Some(ph_l), Some(ph_d)) = (h.phase(n), l.phase(n), d.phase(n)) else {
                continue;
            };
            let x = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            let _ = writeln!(
                s,
                "{:<13} {:>9.1} {:>9.1} {:>9.1} {:>8.0} {:>8.0} {:>8.0}  {:>6.1}x ({:.1}) {:>6.1}x ({:.1})",
                n,
                ph_h.seconds,
                ph_l.seconds,
                ph_d.seconds,
                ph_h.iops,
                ph_l.iops,
                ph_d.iops,
                x(ph_h.seconds, ph_d.seconds),
                seed.dss_vs_hdd[i],
                x(ph_l.seconds, ph_d.seconds),
                seed.dss_vs_lru[i]
            );
        }
        let base = h.total_s();
        let rel = |r: &RunResult| {
            if r.total_s() > 0.0 {
                base / r.total_s()
            } else {
                0.0
            }
        };
        let _ = writeln!(
            s,
            "Table 3 ({}):            HDD            LRU            DSS     (seed)",
            seed.disk
        );
        let _ = writeln!(
            s,
            "  relative performance  {:>5.0}% ({:>3.0}%)  {:>5.0}% ({:>3.0}%)  {:>5.0}% ({:>3.0}%)",
            rel(h) * 100.0,
            seed.rel_perf[0] * 100.0,
            rel(l) * 100.0,
            seed.rel_perf[1] * 100.0,
            rel(d) * 100.0,
            seed.rel_perf[2] * 100.0
        );
        let hi = h.mean_iops().max(1e-9);
        let _ = writeln!(
            s,
            "  average IOPS          {:>6.0} ({:>3.0})  {:>6.0} ({:>3.0})  {:>6.0} ({:>3.0})",
            h.mean_iops(),
            seed.avg_iops[0],
            l.mean_iops(),
            seed.avg_iops[1],
            d.mean_iops(),
            seed.avg_iops[2]
        );
        let _ = writeln!(
            s,
            "  relative IOPS         {:>6.1} ({:>3.1})  {:>6.1} ({:>3.1})  {:>6.1} ({:>3.1})",
            1.0,
            1.0,
            l.mean_iops() / hi,
            seed.avg_iops[1] / seed.avg_iops[0],
            d.mean_iops() / hi,
            seed.avg_iops[2] / seed.avg_iops[0]
        );
        let _ = writeln!(
            s,
            "  completion time reduction by DSS: {:.0}% vs HDD (seed {:.0}%)",
            (1.0 - d.total_s() / base.max(1e-12)) * 100.0,
            (1.0 - 1.0 / seed.rel_perf[2]) * 100.0
        );
        match (h.mean_cost(), l.mean_cost(), d.mean_cost()) {
            (Some(ch), Some(cl), Some(cd)) => {
                let _ = writeln!(
                    s,
                    "Table 4 ({}): cost per MB per IOPS (USD; ours from the price table)",
                    seed.disk
                );
                let _ = writeln!(
                    s,
                    "  average               {:>9.3e} ({:.2})  {:>9.3e} ({:.2})  {:>9.3e} ({:.2})",
                    ch, seed.cost[0], cl, seed.cost[1], cd, seed.cost[2]
                );
                let _ = writeln!(
                    s,
                    "  DSS reduction         vs HDD {:.0}% (seed {:.0}%), vs LRU {:.0}% (seed {:.0}%)",
                    (1.0 - cd / ch) * 100.0,
                    (1.0 - seed.cost[2] / seed.cost[0]) * 100.0,
                    (1.0 - cd / cl) * 100.0,
                    (1.0 - seed.cost[2] / seed.cost[1]) * 100.0
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "Table 4 ({}): n/a: the price table has no price for {} (give one with --prices FILE)",
                    seed.disk, seed.disk
                );
            }
        }
    }
    if !rep.prices.is_empty() {
        let _ = writeln!(
            s,
            "\nPrices (cost = the RAID's HDDs + the cache's GB of SSD):"
        );
        for p in &rep.prices {
            let _ = writeln!(s, "  {p}");
        }
    }
    s
}
