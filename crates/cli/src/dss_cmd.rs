//! `tiercache dss-table`: the DSS seed's Table 3 and Table 4 in simulation.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_engine::ClassTable;
use tiercache_sim::dss::{self, DssOptions};
use tiercache_sim::fileserver::FileserverSpec;

#[derive(Args, Debug)]
#[command(
    after_help = "Runs the DSS file-server phases (MacroSetup, MacroTrans, MacroPrefind, \
MacroArchive, MacroFind, MacroScan) timed on a 5-disk RAID 5 of the 7200 RPM and the 15K RPM HDD \
models, with no cache, an LRU cache and a DSS cache (10 % of the footprint on the Intel SSD 710 \
model, write-back, write-allocate only), and prints time and IOPS per phase, the seed's Table 3 \
(relative performance, average IOPS) and Table 4 (cost per MB per IOPS) beside the seed's \
figures. Scale 1 is the seed's 600,000 files in 20,000 directories; the default runs in about \
a minute.

Examples:
  tiercache dss-table
  tiercache dss-table --scale 0.01 --json > dss.json
  tiercache dss-table --disks 7200 --classes experiments/classes/filesystem.toml"
)]
pub struct DssArgs {
    /// Workload scale (1 = 600,000 files, 20,000 directories, 60,000 transactions).
    #[arg(long, default_value_t = tiercache_sim::fileserver::DEFAULT_SCALE)]
    pub scale: f64,
    /// Seed of the workload generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// HDD models, comma-separated (RAID 5 of 5 of each).
    #[arg(long, value_delimiter = ',', default_values_t = ["7200".to_string(), "15k".to_string()])]
    pub disks: Vec<String>,
    /// Cache size in percent of the footprint.
    #[arg(long, default_value_t = 10.0)]
    pub cache_percent: f64,
    /// Class table for DSS (default: the seed's file-system table).
    #[arg(long, value_name = "FILE")]
    pub classes: Option<PathBuf>,
    /// Price table (TOML) for the cost per MB per IOPS.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
    /// Print the measurements as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DssArgs) -> Result<()> {
    anyhow::ensure!(a.scale > 0.0, "--scale must be above 0");
    let mut opts = DssOptions {
        workload: FileserverSpec::scaled(a.scale),
        seed: a.seed,
        cache_percent: a.cache_percent,
        disks: a
            .disks
            .iter()
            .map(|d| {
                if d.contains(':') {
                    d.clone()
                } else {
                    format!("hdd:{}", d.to_ascii_lowercase())
                }
            })
            .collect(),
        ..Default::default()
    };
    if let Some(p) = &a.classes {
        opts.classes = Arc::new(ClassTable::load(p)?);
    }
    if let Some(p) = &a.prices {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        opts.prices = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    let quiet = a.json;
    let rep = dss::run(
        &opts,
        Some(&|r: &dss::RunResult| {
            if !quiet {
                eprintln!(
                    "  done: {} {} ({:.1} simulated s)",
                    r.disk,
                    r.config,
                    r.total_s()
                );
            }
        }),
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print!("{}", dss::render(&rep));
    }
    Ok(())
}
