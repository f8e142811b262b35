//! The log layout (Nitro: extents compressed, deduplicated and packed into segments written
//! and evicted whole) in the simulator: its settings ([`LogSpec`], resolved from an
//! experiment's `[cache]` section with `layout = "log"`), the content the requests carry, and
//! [`simulate_log`], which [`crate::simulate`] calls for a log-layout spec, so `sim`,
//! `sweep`, experiment files, `reproduce` and Python run it alike.
//!
//! Traces and synthetic workloads carry no content: the seeded [`ContentModel`] gives each
//! written line a fingerprint and a compressed length. Content workloads (boot storm,
//! snapshot restore) bring their own ([`content_workload`]).

use crate::{Input, SimResult, SimSpec};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Instant;
use tiercache_engine::{Compression, LogConfig};
use tiercache_trace::content::{ContentModel, ContentTrace};
use tiercache_trace::workload::bootstorm::BootStorm;
use tiercache_trace::workload::restore::SnapshotRestore;

/// Line size of the log layout when none is given (the Nitro seed's 8 KiB extents).
pub const DEFAULT_LOG_LINE: u64 = 8192;
/// FTL erase block under the log layout when none is given.
pub const DEFAULT_ERASE_BLOCK: u64 = 2 << 20;

/// The log layout's settings beside the engine configuration it shares with the direct layout
/// (line size, mode, seed).
#[derive(Clone, Debug)]
pub struct LogSpec {
    /// Segment (Write-Evict Unit) size; equal to the line = extent caching.
    pub segment_size: u64,
    pub compression: Compression,
    /// Fingerprint index as a share of the cache's extent slots (0 = no dedup).
    pub dedup: f64,
    /// Segment picker (a name in the engine's picker registry).
    pub picker: String,
    pub trim: bool,
    /// With `trim`: share of the segments kept free and trimmed ahead of reuse (the engine's
    /// `LogConfig::free_reserve`).
    pub free_reserve: f64,
    pub reinsert_hits: u16,
    /// Content model: share of duplicate extents (traces and synthetic workloads).
    pub dup_share: f64,
    /// FTL erase block.
    pub erase_block: u64,
    /// Seed of the content model.
    pub seed: u64,
    /// Content model: compressed lengths measured on the content's bytes (see
    /// [`ContentModel::measured`]) rather than drawn.
    pub measured: bool,
    /// Content carried by the input (content workloads); None = the content model annotates
    /// the input's requests.
    pub content: Option<Arc<ContentTrace>>,
}

impl Default for LogSpec {
    fn default() -> Self {
        LogSpec {
            segment_size: tiercache_engine::log::DEFAULT_SEGMENT,
            compression: Compression::None,
            dedup: 0.0,
            picker: "lru".into(),
            trim: false,
            free_reserve: tiercache_engine::log::DEFAULT_FREE_RESERVE,
            reinsert_hits: 0,
            dup_share: 0.3,
            erase_block: DEFAULT_ERASE_BLOCK,
            seed: 0,
            measured: false,
            content: None,
        }
    }
}

impl LogSpec {
    /// The content model of these settings at `line_size`: LZ4's ratio when compression is
    /// off (the model's lengths are then unused).
    pub fn model(&self, line_size: u64) -> ContentModel {
        let mut m = ContentModel::new(line_size, self.seed);
        m.compression = if self.compression.is_on() {
            self.compression
        } else {
            Compression::Lz4
        };
        m.dup_share = self.dup_share;
        // Measured lengths are those of the compressor the cache runs (none: raw).
        if self.measured {
            m.measured = true;
            m.compression = self.compression;
        }
        m
    }

    /// The requests of `input` with their content.
    pub fn content_trace(&self, input: &Input, line_size: u64) -> Result<Arc<ContentTrace>> {
        if let Some(t) = &self.content {
            anyhow::ensure!(
                t.line_size == line_size,
                "{}: content generated for {}-byte lines, the cache has {}-byte lines",
                t.name,
                t.line_size,
                line_size
            );
            return Ok(Arc::clone(t));
        }
        let mut reqs = Vec::new();
        input.for_each(|r| {
            reqs.push(*r);
            Ok(())
        })?;
        Ok(Arc::new(ContentTrace::from_model(
            input.label(),
            reqs,
            self.model(line_size),
        )))
    }

    /// The engine configuration of a log cache of `capacity_lines` lines (rounded down to
    /// whole segments) in `mode`, with the I/O class table `classes` (`--classes`: `never`
    /// classes are not cached, every class is counted; see `LogConfig::classes`).
    pub fn config(
        &self,
        line_size: u64,
        capacity_lines: u64,
        mode: tiercache_engine::Mode,
        classes: Option<&std::sync::Arc<tiercache_engine::ClassTable>>,
    ) -> Result<LogConfig> {
        let mut cfg = LogConfig::new(0, line_size);
        cfg.segment_size = self.segment_size;
        cfg.capacity_bytes = capacity_lines * line_size / self.segment_size * self.segment_size;
        cfg.mode = mode;
        cfg.picker = self.picker.clone();
        cfg.dedup_ratio = self.dedup;
        cfg.compression = self.compression;
        cfg.trim = self.trim;
        cfg.free_reserve = self.free_reserve;
        cfg.reinsert_hits = self.reinsert_hits;
        cfg.classes = classes.cloned();
        // The live layout's segment header holds this many extents: a segment is sealed
        // when it is full, as live.
        cfg.max_extents_per_segment =
            tiercache_engine::log::header_extents(self.segment_size, line_size);
        cfg.validate()
            .map_err(|e| anyhow::anyhow!("log layout: {e}"))?;
        Ok(cfg)
    }
}

/// Whether `workload` names a content-carrying generator (boot storm, snapshot restore).
pub fn is_content_workload(workload: &str) -> bool {
    let w = workload.trim_start();
    w.starts_with("boot-storm") || w.starts_with("bootstorm") || w.starts_with("snapshot-restore")
}

/// A content workload's requests and content at `line_size`, with `model`'s content; None
/// when `workload` is not one.
pub fn content_workload(
    workload: &str,
    line_size: u64,
    seed: u64,
    model: &ContentModel,
) -> Option<Result<ContentTrace>> {
    let w = workload.trim();
    if !is_content_workload(w) {
        return None;
    }
    Some(if w.starts_with("snapshot-restore") {
        SnapshotRestore::parse(w)
            .map_err(|e| anyhow::anyhow!("workload '{w}': {e}"))
            .map(|mut s| {
                s.line_size = line_size;
                s.generate(seed, model).0
            })
    } else {
        BootStorm::parse(w)
            .map_err(|e| anyhow::anyhow!("workload '{w}': {e}"))
            .map(|mut b| {
                b.line_size = line_size;
                b.generate(seed, model)
            })
    })
}

/// The input and log settings of a content workload for `spec`: the requests in memory, the
/// content in `spec.log` (when the layout is log). Content workloads are generated at the
/// cache's line size, so this runs after the cache settings are resolved.
pub fn attach_content_workload(spec: &mut SimSpec, workload: &str) -> Result<bool> {
    let line = spec.engine.line_size;
    let model = match &spec.log {
        Some(l) => l.model(line),
        None => LogSpec {
            seed: spec.engine.policy_params.seed,
            ..LogSpec::default()
        }
        .model(line),
    };
    let Some(t) = content_workload(workload, line, model.seed, &model) else {
        return Ok(false);
    };
    let t = Arc::new(t?);
    spec.input = Input::Memory {
        name: t.name.clone(),
        requests: Arc::new(t.requests.clone()),
    };
    if let Some(l) = &mut spec.log {
        l.content = Some(t);
    }
    Ok(true)
}

/// Runs a log-layout spec: the content trace through the log engine, SSD writes and trims
/// through a page FTL. The cache size is taken over the content trace's footprint.
pub fn simulate_log(spec: &SimSpec, log: &LogSpec) -> Result<SimResult> {
    let line = spec.engine.line_size;
    let trace = log.content_trace(&spec.input, line)?;
    if trace.is_empty() {
        return Err(crate::no_requests(&spec.input));
    }
    let (lines, _) = trace.footprint();
    let capacity_lines = spec.cache_size.lines(line, lines);
    crate::ensure_some_lines(spec, capacity_lines, Some(lines))?;
    let cfg = log
        .config(
            line,
            capacity_lines,
            spec.engine.mode,
            spec.engine.policy_params.classes.as_ref(),
        )
        .with_context(|| format!("cache size {}", spec.cache_size))?;
    let ftl = crate::nitro::ftl_for(&cfg, log.erase_block);
    let start = Instant::now();
    let mut ram =
        tiercache_engine::RamTier::for_config(&spec.engine).map_err(anyhow::Error::msg)?;
    let run = match &mut ram {
        Some(t) => crate::nitro::run_log_live_ram(&trace, cfg.clone(), ftl, t)?,
        None => crate::nitro::run_log_live(&trace, cfg.clone(), ftl)?,
    };
    let wall = start.elapsed().as_secs_f64();
    let mut res = SimResult::from_log(spec, log, &cfg, &run, Some(lines), wall);
    if let Some(t) = &ram {
        // Reads the log engine saw, and those of them whose every line hit (SSD tier).
        let k = &run.counters;
        res.ram = Some(crate::result::RamFigures::of_reads(
            t,
            k.reads,
            k.read_requests.hits,
        ));
    }
    Ok(res)
}
