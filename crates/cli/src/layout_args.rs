//! `tiercache sim --layout log`: the log layout (Nitro) with compression, deduplication and an
//! FTL, on a trace with the seeded content model or on the boot-storm workload.

use crate::sim_cmd::{experiment, print_one, InputArgs, SimArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::sync::Arc;
use tiercache_engine::log::{Compression, Layout};
use tiercache_engine::{fmt_size, parse_size, LogConfig};
use tiercache_sim::experiment::specs;
use tiercache_sim::nitro;
use tiercache_sim::{simulate, Input};
use tiercache_trace::content::{ContentModel, ContentTrace};
use tiercache_trace::workload::bootstorm::BootStorm;
use tiercache_trace::workload::restore::SnapshotRestore;

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
    /// Log layout (`sim` only): TRIM a segment before reusing it.
    #[arg(long, help_heading = "Data reduction")]
    pub trim: bool,
    /// Log layout (`sim` only): reinsert clean extents with at least N hits when their
    /// segment is reclaimed (0 = off, the default).
    #[arg(long, value_name = "N", help_heading = "Data reduction")]
    pub reinsert_hits: Option<u16>,
    /// `sim` only: content model for traces without content: share of duplicate extents.
    /// Default 0.3.
    #[arg(long, value_name = "SHARE", help_heading = "Data reduction")]
    pub dup_share: Option<f64>,
    /// `sim` only: FTL erase block under the log layout. Default 2MiB.
    #[arg(long, value_name = "SIZE", help_heading = "Data reduction")]
    pub erase_block: Option<String>,
}

impl LayoutArgs {
    pub fn is_log(&self) -> Result<bool> {
        Ok(match &self.layout {
            Some(l) => l.parse::<Layout>().map_err(anyhow::Error::msg)? == Layout::Log,
            None => false,
        })
    }
}

/// Whether the workload is one of the content-carrying generators.
pub fn is_content_workload(i: &InputArgs) -> bool {
    i.workload.as_deref().is_some_and(|w| {
        w.trim_start().starts_with("boot-storm") || w.trim_start().starts_with("bootstorm")
    })
}

pub fn sim_layout(a: &SimArgs) -> Result<()> {
    let l = &a.layout;
    let seed = a.input.seed.unwrap_or(0);
    let line = match &a.cache.line_size {
        Some(s) => parse_size(s).context("--line-size")?,
        None => 8192,
    };
    let compression: Compression = l
        .compression
        .as_deref()
        .unwrap_or("none")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let mut model = ContentModel::new(line, seed);
    model.compression = if compression.is_on() {
        compression
    } else {
        Compression::Lz4
    };
    if let Some(d) = l.dup_share {
        model.dup_share = d;
    }
    // Requests and their content.
    let workload = a.input.workload.as_deref().unwrap_or_default().trim();
    let trace: ContentTrace = if workload.starts_with("snapshot-restore") {
        let mut s = SnapshotRestore::parse(workload).map_err(anyhow::Error::msg)?;
        s.line_size = line;
        s.generate(seed, &model).0
    } else if is_content_workload(&a.input) {
        let mut b = BootStorm::parse(a.input.workload.as_deref().unwrap_or_default())
            .map_err(anyhow::Error::msg)?;
        b.line_size = line;
        b.generate(seed, &model)
    } else {
        let mut cache = a.cache.clone();
        cache.line_size = Some(line.to_string());
        let exp = experiment(&a.config, &a.input, &cache)?;
        let input = exp.input.to_input()?;
        let mut reqs = Vec::new();
        input.for_each(|r| {
            reqs.push(*r);
            Ok(())
        })?;
        ContentTrace::from_model(input.label(), reqs, model)
    };
    let memory = Input::Memory {
        name: trace.name.clone(),
        requests: Arc::new(trace.requests.clone()),
    };
    let mut cache = a.cache.clone();
    cache.line_size = Some(line.to_string());
    let mut input_args = a.input.clone();
    input_args.workload = None;
    input_args.trace = None;
    let exp = experiment(&a.config, &input_args, &cache)?;
    let mut spec = specs(&memory, &exp.cache.without_layout(), None, seed)?.remove(0);
    if !l.is_log()? {
        spec.input = memory;
        let res = simulate(&spec, None, None)?;
        return print_one(&res, a.json, a.csv);
    }
    let (lines, _) = trace.footprint();
    let seg = match &l.segment_size {
        Some(s) => parse_size(s).context("--segment-size")?,
        None => tiercache_engine::log::DEFAULT_SEGMENT,
    };
    let mut cfg = LogConfig::new(0, line);
    cfg.segment_size = seg;
    cfg.capacity_bytes = spec.cache_size.lines(line, lines) * line / seg * seg;
    cfg.mode = spec.engine.mode;
    cfg.picker = l.picker.clone().unwrap_or_else(|| "lru".into());
    cfg.dedup_ratio = l.dedup.unwrap_or(0.0);
    cfg.compression = compression;
    cfg.trim = l.trim;
    cfg.reinsert_hits = l.reinsert_hits.unwrap_or(0);
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("log layout: {e}"))?;
    let eb = match &l.erase_block {
        Some(s) => parse_size(s).context("--erase-block")?,
        None => 2 << 20,
    };
    let ftl = nitro::ftl_for(&cfg, eb);
    let run = nitro::run_log(&trace, cfg, ftl)?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&run)?)?;
    } else if a.csv {
        writeln!(out, "workload,layout,segment_size,capacity_bytes,compression,dedup,read_hit_ratio,ssd_bytes_written,erasures,write_amplification,dedup_ratio,compression_ratio,effective_capacity,index_bytes_per_entry")?;
        writeln!(
            out,
            "{},{},{},{},{},{},{:.6},{},{},{:.4},{:.4},{:.4},{:.4},{:.1}",
            run.workload,
            run.layout,
            run.segment_size,
            run.capacity_bytes,
            run.compression,
            run.dedup,
            run.read_hit_ratio,
            run.ssd_bytes_written,
            run.erasures,
            run.write_amplification,
            run.dedup_ratio,
            run.compression_ratio,
            run.effective_capacity,
            run.index_bytes_per_entry
        )?;
    } else {
        let k = &run.counters;
        writeln!(out, "input        {}", run.workload)?;
        writeln!(
            out,
            "cache        {} log layout, segments of {}, {} compression, fingerprint index {:.0} %{}",
            fmt_size(run.capacity_bytes),
            fmt_size(run.segment_size),
            run.compression,
            run.dedup * 100.0,
            if run.trim { ", TRIM" } else { "" }
        )?;
        writeln!(
            out,
            "reads        {} lines, {:.2} % hit ({} through the fingerprint index, {} in RAM)",
            k.read_lines,
            run.read_hit_ratio * 100.0,
            k.dup_read_hits,
            k.ram_read_hits
        )?;
        writeln!(
            out,
            "reduction    dedup {:.2}x, compression {:.2}x, effective capacity {:.2}x",
            run.dedup_ratio, run.compression_ratio, run.effective_capacity
        )?;
        writeln!(
            out,
            "SSD          {} written in {} segments, {} read; {} erasures, write amplification {:.2}",
            fmt_size(run.ssd_bytes_written),
            k.segments_sealed,
            fmt_size(run.ssd_bytes_read),
            run.erasures,
            run.write_amplification
        )?;
        writeln!(
            out,
            "HDD          {} read, {} written ({} dirty write-backs)",
            fmt_size(run.hdd_bytes_read),
            fmt_size(run.hdd_bytes_written),
            k.dirty_write_backs
        )?;
        writeln!(
            out,
            "index RAM    {:.1} B per fingerprint entry, {:.1} B per cached line in all",
            run.index_bytes_per_entry, run.index_bytes_per_line
        )?;
    }
    Ok(())
}
