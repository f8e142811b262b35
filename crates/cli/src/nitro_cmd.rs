//! `tiercache nitro-table`: the Nitro seed's data-reduction table.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use tiercache_engine::{parse_size, Compression, Mode};
use tiercache_sim::nitro::{self, NitroSpec};
use tiercache_trace::workload::bootstorm::BootStorm;

#[derive(Args, Debug)]
#[command(
    after_help = "Rows: (ND,NC) (ND,C) (D,NC) (D,C) for extent caching (every extent its own \
replacement unit in its own SSD slot) and WEU caching (extents packed into segments, whole \
segments evicted, WEU-LRU), on a VM boot storm and, with --cloudphysics, on that trace with the \
seeded content model. SSD writes and trims go through an FTL (4 KiB pages, erase blocks of \
--erase-block, 7 % over-provisioning) that counts erasures and write amplification: \
page-mapped with greedy GC, or with --ftl hybrid block-mapped with 10 % log blocks (the seed's \
SSD; naive extent caching then pays full merges). idx B/e = fingerprint-index RAM per entry.
(`tiercache reproduce nitro` runs the same table on real content.)

Examples:
  tiercache nitro-table
  tiercache nitro-table --cloudphysics ../shared/traces/cloudPhysicsIO/cloudPhysicsIO.csv
  tiercache nitro-table --boot-storm vms=20,image=8MiB --boot-cache 32MiB --trim --json
  tiercache nitro-table --ftl hybrid"
)]
pub struct NitroArgs {
    /// Boot-storm parameters: vms, image, overlap, shift, random, read, passes.
    #[arg(
        long,
        value_name = "SPEC",
        default_value = "vms=60,image=18MiB,overlap=90%,shift=15%"
    )]
    pub boot_storm: String,
    /// Cache size for the boot storm.
    #[arg(long, value_name = "SIZE", default_value = "128MiB")]
    pub boot_cache: String,
    /// cloudPhysicsIO (or any) trace to run with the content model.
    #[arg(long, value_name = "TRACE")]
    pub cloudphysics: Option<PathBuf>,
    /// Cache size for that trace, as a share of its footprint.
    #[arg(long, value_name = "PERCENT", default_value = "10%")]
    pub cloud_cache: String,
    /// Share of duplicate extents in the content model.
    #[arg(long, value_name = "SHARE", default_value_t = 0.3)]
    pub dup_share: f64,
    /// Extent (line) size.
    #[arg(long, value_name = "SIZE", default_value = "8KiB")]
    pub line_size: String,
    /// WEU (segment) size.
    #[arg(long, value_name = "SIZE", default_value = "2MiB")]
    pub segment_size: String,
    /// FTL erase block.
    #[arg(long, value_name = "SIZE", default_value = "2MiB")]
    pub erase_block: String,
    /// Compressor of the C variants: lz4 or zstd[:LEVEL].
    #[arg(long, default_value = "lz4")]
    pub compression: String,
    /// Fingerprint-index ratio of the D variants (1.0 = every extent slot indexed).
    #[arg(long, value_name = "RATIO", default_value_t = 1.0)]
    pub dedup: f64,
    /// TRIM segments before reuse.
    #[arg(long)]
    pub trim: bool,
    /// FTL model under the cache: page (page-mapped, greedy GC) or hybrid (block-mapped data
    /// blocks, 10 % log blocks, switch/partial/full merges: the seed's SSD).
    #[arg(long, default_value = "page")]
    pub ftl: String,
    /// write-through or write-back.
    #[arg(long, default_value = "write-through")]
    pub mode: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON rows instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: NitroArgs) -> Result<()> {
    let pct = a.cloud_cache.trim().trim_end_matches('%').parse::<f64>()?;
    let compression: Compression = a.compression.parse().map_err(anyhow::Error::msg)?;
    if compression == Compression::None {
        bail!("--compression of the C variants must be lz4 or zstd[:LEVEL]");
    }
    let spec = NitroSpec {
        line_size: parse_size(&a.line_size)?,
        segment_size: parse_size(&a.segment_size)?,
        erase_block: parse_size(&a.erase_block)?,
        compression,
        dedup_ratio: a.dedup,
        mode: a.mode.parse::<Mode>().map_err(anyhow::Error::msg)?,
        trim: a.trim,
        ftl: a.ftl.parse().map_err(anyhow::Error::msg)?,
        seed: a.seed,
        boot_storm: BootStorm::parse(&format!("boot-storm:{}", a.boot_storm))
            .map_err(anyhow::Error::msg)?,
        boot_cache: parse_size(&a.boot_cache)?,
        cloudphysics: a.cloudphysics,
        cloud_cache_share: if a.cloud_cache.contains('%') {
            pct / 100.0
        } else {
            pct
        },
        dup_share: a.dup_share,
    };
    let rows = nitro::run(&spec)?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        write!(out, "{}", nitro::table(&rows))?;
    }
    Ok(())
}
