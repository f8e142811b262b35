//! `tiercache sim --layout log` flags: the log layout (Nitro) with compression, deduplication
//! and an FTL. Parsing only: the flags become the `[cache]` settings of an experiment, and
//! `tiercache_sim::simulate` (the same for `sweep`, experiment files and Python) runs them.

use anyhow::Result;
use clap::Args;
use tiercache_engine::log::Layout;
use tiercache_sim::experiment::CacheSection;

/// Layout and data reduction.
#[derive(Args, Clone, Debug, Default)]
pub struct LayoutArgs {
    /// Cache layout: `direct` (a fixed slot per line) or `log` (Nitro: extents compressed,
    /// deduplicated and packed into segments that are written and evicted whole).
    #[arg(long, value_name = "direct|log", help_heading = "Data reduction")]
    pub layout: Option<String>,
    /// Log layout: segment (Write-Evict Unit) size, a multiple of the line up to 64MiB.
    /// Default 2MiB. In `sim`, equal to the line size = extent caching; live, at least two
    /// lines. Fixed when the cache is formatted.
    #[arg(long, value_name = "SIZE", help_heading = "Data reduction")]
    pub segment_size: Option<String>,
    /// Log layout: extent compression: none, lz4, zstd or zstd:LEVEL (an extent that does not
    /// shrink is stored raw). Live, the real bytes are compressed; in `sim`, sizes come from
    /// the content model (ratio ~ Normal(2, 0.25) for lz4). Default none.
    #[arg(long, value_name = "ALG", help_heading = "Data reduction")]
    pub compression: Option<String>,
    /// Log layout: fingerprint index as a share of the cache's extent slots (0 = no dedup,
    /// 1.0 = every extent indexed; lower = partial index with LRU replacement). Default 0.
    /// Live, fingerprints are BLAKE3 of the real bytes and a line is shared only when all 32
    /// bytes match.
    #[arg(long, value_name = "RATIO", help_heading = "Data reduction")]
    pub dedup: Option<f64>,
    /// Log layout: segment picker: fifo, lru (WEU-LRU), greedy, cost-benefit. Default lru.
    #[arg(long, value_name = "NAME", help_heading = "Data reduction")]
    pub picker: Option<String>,
    /// Log layout: TRIM a reclaimed segment's data area (live: once its empty header is
    /// durable, by hole punching on a file, BLKDISCARD on a block device, NBD TRIM on an
    /// export; a device that cannot is left as it is). Per run (`serve`, `ctl set trim`).
    #[arg(long, help_heading = "Data reduction")]
    pub trim: bool,
    /// Log layout, with --trim: share of the segments kept free and trimmed ahead of their
    /// reuse (evict ahead), 0 to 0.5; reclaimed segments wait in a FIFO so the FTL sees
    /// each TRIM well before the rewrite. Costs that share of the capacity. 0 = trim each
    /// segment as it is reused. Default 0.05. Per run (`ctl set free-reserve`).
    #[arg(long, value_name = "SHARE", help_heading = "Data reduction")]
    pub free_reserve: Option<f64>,
    /// Log layout: reinsert clean extents with at least N hits when their segment is
    /// reclaimed (0 = off, the default; not with a trimmed free reserve). Per run (`ctl set
    /// reinsert-hits`).
    #[arg(long, value_name = "N", help_heading = "Data reduction")]
    pub reinsert_hits: Option<u16>,
    /// Simulation only: content model for traces without content: share of duplicate
    /// extents. Default 0.3.
    #[arg(long, value_name = "SHARE", help_heading = "Data reduction")]
    pub dup_share: Option<f64>,
    /// Simulation only: FTL erase block under the log layout. Default 2MiB.
    #[arg(long, value_name = "SIZE", help_heading = "Data reduction")]
    pub erase_block: Option<String>,
    /// Simulation only: compressed lengths of the content model: `model` (ratio drawn from
    /// Normal(2, 0.25), the default) or `measured` (each content's bytes, the same that
    /// `tiercache replay --content` writes, compressed for real with --compression: what a
    /// live log cache stores, so sim and live agree byte for byte).
    #[arg(long, value_name = "model|measured", help_heading = "Data reduction")]
    pub content_lengths: Option<String>,
}

impl LayoutArgs {
    pub fn is_log(&self) -> Result<bool> {
        Ok(match &self.layout {
            Some(l) => l.parse::<Layout>().map_err(anyhow::Error::msg)? == Layout::Log,
            None => false,
        })
    }

    /// The log layout's flags given (every one but `--layout`), as `--flag` names: read from
    /// the settings [`LayoutArgs::section`] makes of them, so a flag added there is seen here
    /// too (a direct-layout device and `format` without `--layout log` refuse them).
    pub fn log_flags_given(&self) -> Vec<String> {
        let s = LayoutArgs {
            layout: None,
            ..self.clone()
        }
        .section()
        .expect("without a layout name there is nothing to parse");
        crate::serve_cmd::flag_names(&crate::serve_cmd::set_keys(&s))
    }

    /// These flags as experiment-file cache settings (laid over the file's by `sim`).
    pub fn section(&self) -> Result<CacheSection> {
        if let Some(l) = &self.layout {
            // The engine's parser explains a bad name ("expected direct or log").
            l.parse::<Layout>().map_err(anyhow::Error::msg)?;
        }
        Ok(CacheSection {
            layout: self.layout.clone(),
            segment_size: self.segment_size.clone(),
            compression: self.compression.clone(),
            dedup: self.dedup,
            picker: self.picker.clone(),
            trim: self.trim.then_some(true),
            free_reserve: self.free_reserve,
            reinsert_hits: self.reinsert_hits,
            dup_share: self.dup_share,
            erase_block: self.erase_block.clone(),
            content_lengths: self.content_lengths.clone(),
            ..Default::default()
        })
    }
}
