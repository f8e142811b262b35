//! Data reduction (Nitro): the log layout run on traces with content, its plans' SSD writes
//! and trims fed to a page-mapped FTL, and the seed's four-variant table.
//!
//! [`run_log`] is one run; [`run`] produces the table of (ND,NC), (ND,C), (D,NC), (D,C) for
//! extent caching (segment = extent, each extent its own replacement unit) and WEU caching
//! (2 MiB segments, WEU-LRU) on a boot storm and on cloudPhysicsIO with the content model.
//! `tiercache nitro-table` prints it; a later `tiercache reproduce nitro` can call [`run`].

use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use tiercache_devices::{AnyFtl, FtlConfig, FtlKind, FtlStats};
use tiercache_engine::log::dedup::FpIndex;
use tiercache_engine::log::{LineTally, LogCounters, Reduction};
use tiercache_engine::{
    fmt_size, Compression, ExtentContent, LogConfig, LogEngine, Mode, Request, Step,
};
use tiercache_trace::content::{ContentModel, ContentTrace};
use tiercache_trace::workload::bootstorm::BootStorm;

/// What one log-layout run did.
#[derive(Clone, Debug, Serialize)]
pub struct LogRun {
    pub workload: String,
    pub layout: String,
    pub segment_size: u64,
    pub capacity_bytes: u64,
    pub compression: String,
    pub dedup: f64,
    pub trim: bool,
    pub requests: u64,
    pub read_hit_ratio: f64,
    pub ssd_bytes_written: u64,
    pub ssd_bytes_read: u64,
    pub hdd_bytes_read: u64,
    pub hdd_bytes_written: u64,
    pub erasures: u64,
    pub write_amplification: f64,
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub effective_capacity: f64,
    /// Fingerprint-index RAM per entry (the seed: 29 B with its layout).
    pub index_bytes_per_entry: f64,
    /// RAM of all log-layout indices per cached line at the end.
    pub index_bytes_per_line: f64,
    /// Dirty lines left in the cache at the end (write-back).
    pub dirty_lines: u64,
    pub counters: LogCounters,
    /// Counters per I/O class, for the classes that saw requests.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub classes: std::collections::BTreeMap<u8, LogCounters>,
    pub reduction: Reduction,
    /// FTL model under the cache: `page` or `hybrid`.
    pub ftl_kind: FtlKind,
    pub ftl: FtlStats,
}

/// The FTL under a log-layout cache: the cache's capacity of 4 KiB pages in erase blocks of
/// `erase_block` bytes, 7 % over-provisioning, page-mapped ([`ftl_of`] for another kind).
pub fn ftl_for(cfg: &LogConfig, erase_block: u64) -> FtlConfig {
    let mut f = FtlConfig::new(cfg.capacity_bytes);
    f.page_bytes = 4096.min(cfg.line_size);
    f.pages_per_block = (erase_block / f.page_bytes).max(1) as u32;
    f
}

/// [`ftl_for`] with the FTL model `kind` (hybrid: 10 % log blocks, the Nitro seed's).
pub fn ftl_of(cfg: &LogConfig, erase_block: u64, kind: FtlKind) -> FtlConfig {
    FtlConfig {
        kind,
        ..ftl_for(cfg, erase_block)
    }
}

/// After a line's bookkeeping, the live volume refills the trimmed free reserve
/// (`--trim --free-reserve`): victims reclaimed ahead (written back, trimmed) until the
/// reserve's segments are free, as `LogVolume` does.
fn keep_free_reserve(e: &mut LogEngine, steps: &mut Vec<Step>) {
    while let Some(v) = e.evict_ahead_victim() {
        steps.extend_from_slice(&e.evict_ahead_one(v).steps);
    }
}

/// A log-layout engine with an FTL (page-mapped or hybrid) under it: each request's plan is fed to the FTL
/// (SSD writes and trims), so every driver of the log layout (hit-ratio runs, timed replay)
/// counts the same figures.
pub struct LogDriver {
    engine: LogEngine,
    ftl: AnyFtl,
    cfg: LogConfig,
    /// Requests processed.
    n: u64,
    /// Drive the engine as the live log volume does ([`LogDriver::live`]).
    live: bool,
    /// The steps of the request being processed (live order: several engine calls).
    steps: Vec<Step>,
}

impl LogDriver {
    pub fn new(cfg: LogConfig, ftl: FtlConfig) -> Result<Self> {
        Ok(LogDriver {
            engine: LogEngine::new(cfg.clone()).map_err(|x| anyhow::anyhow!("{x}"))?,
            ftl: AnyFtl::new(ftl).map_err(anyhow::Error::msg)?,
            cfg,
            n: 0,
            live: false,
            steps: Vec::new(),
        })
    }

    /// Drives the engine as the live log volume (`tiercache serve --layout log`) does, so the
    /// simulation predicts it counter for counter: each line of a request on its own, with
    /// room reserved first (a segment is sealed when less than a line is left in it, and
    /// reclaimed before the line is placed); a read miss reads the backing device and only
    /// then, its content known, is cached (a duplicate entry when the fingerprint index has
    /// it: the live cache cannot know a line's content before reading it, so there are no
    /// duplicate read hits); a write covering part of a line is merged into the line's
    /// current bytes (cached, or read from the backing device). Without it (`nitro-table`), whole requests go to the engine with
    /// their content, the Nitro seed's model.
    pub fn live(mut self, on: bool) -> Self {
        self.live = on;
        self.engine.set_deferred_fill(on);
        self
    }

    /// Processes one request with its content; returns the plan's steps.
    pub fn process(&mut self, r: &Request, c: &[ExtentContent]) -> Result<&[Step]> {
        if !self.live && self.n > 0 && self.n.is_multiple_of(4096) {
            // Every 4096 requests, drop duplicate entries into reclaimed segments (no I/O).
            // (The live volume does not: stale entries go when they are looked up.)
            self.engine.clean_stale(1024);
        }
        self.n += 1;
        self.steps.clear();
        let lines = if r.len == 0 {
            0
        } else {
            let sh = self.cfg.line_size.trailing_zeros();
            ((r.end() - 1) >> sh) - (r.offset >> sh) + 1
        };
        let per_line = self.live
            && matches!(
                r.op,
                tiercache_engine::Op::Read | tiercache_engine::Op::Write
            )
            && lines > 0
            && c.len() as u64 == lines;
        if per_line {
            self.process_live(r, c)?;
        } else {
            let plan = self.engine.process(r, c).map_err(anyhow::Error::msg)?;
            self.steps.extend_from_slice(&plan.steps);
        }
        for s in &self.steps {
            match *s {
                Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } => {
                    self.ftl.write(ssd, len)
                }
                Step::TrimSsd { ssd, len } => self.ftl.trim(ssd, len),
                _ => {}
            }
        }
        Ok(&self.steps)
    }

    /// One read or write, line by line, in the live volume's order (see [`LogDriver::live`]).
    fn process_live(&mut self, r: &Request, c: &[ExtentContent]) -> Result<()> {
        use tiercache_engine::Op;
        let ls = self.cfg.line_size;
        let first = r.offset / ls;
        let wb = self.cfg.mode == Mode::WriteBack;
        let e = &mut self.engine;
        // The request's line outcome: its first line's (counted by the engine), all its lines'.
        let (mut first_t, mut whole) = (LineTally::default(), LineTally::default());
        for (i, content) in c.iter().enumerate() {
            let line = first + i as u64;
            let mut req = Request {
                offset: line * ls,
                len: ls,
                fua: false,
                ..*r
            };
            let plan = match r.op {
                Op::Read => {
                    let p = if i == 0 {
                        e.process(&req, &[])
                    } else {
                        e.process_more(&req, &[])
                    };
                    self.steps
                        .extend_from_slice(&p.map_err(anyhow::Error::msg)?.steps);
                    tally(e.last_lines(), i, &mut first_t, &mut whole);
                    if e.locate(r.volume, line).is_some() || !e.caches_class(r.class) {
                        continue;
                    }
                    // A miss: the bytes read, the line is admitted (room made first).
                    self.steps.extend_from_slice(&e.reserve(false).steps);
                    e.admit(r.volume, line, r.class, *content)
                }
                _ => {
                    // Write-back: a FUA write is a dirty write made durable by a commit.
                    req.fua = r.fua && !wb;
                    // The part of the line written (the volume merges it into the line's
                    // current bytes; the engine counts reading them).
                    req.offset = req.offset.max(r.offset);
                    req.len = (line * ls + ls).min(r.end()) - req.offset;
                    // A missed line of a `never` class is not cached: no room is made.
                    let cached = e.locate(r.volume, line).is_some() || e.caches_class(r.class);
                    if cached {
                        self.steps.extend_from_slice(&e.reserve(wb).steps);
                    }
                    let p = if i == 0 {
                        e.process(&req, std::slice::from_ref(content))
                    } else {
                        e.process_more(&req, std::slice::from_ref(content))
                    }
                    .map_err(anyhow::Error::msg)?;
                    self.steps.extend_from_slice(&p.steps);
                    tally(e.last_lines(), i, &mut first_t, &mut whole);
                    if cached {
                        keep_free_reserve(e, &mut self.steps);
                    }
                    continue;
                }
            };
            self.steps.extend_from_slice(&plan.steps);
            keep_free_reserve(e, &mut self.steps);
        }
        if c.len() > 1 {
            e.recount_request(r.op, r.class, first_t, whole);
        }
        Ok(())
    }

    pub fn counters(&self) -> &LogCounters {
        self.engine.counters()
    }

    pub fn dirty_lines(&self) -> u64 {
        self.engine.dirty_lines()
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// Checks the engine's invariants and reports the run of `workload`.
    pub fn finish(self, workload: &str) -> Result<LogRun> {
        let (e, cfg) = (&self.engine, &self.cfg);
        e.check()
            .map_err(|m| anyhow::anyhow!("log layout invariant broken: {m}"))?;
        let k = *e.counters();
        let red = e.reduction();
        let st = self.ftl.stats();
        let extent = cfg.segment_size == cfg.line_size;
        Ok(LogRun {
            workload: workload.to_string(),
            layout: if extent { "extent" } else { "weu" }.into(),
            segment_size: cfg.segment_size,
            capacity_bytes: cfg.capacity_bytes,
            compression: cfg.compression.to_string(),
            dedup: cfg.dedup_ratio,
            trim: cfg.trim,
            requests: k.requests,
            read_hit_ratio: if k.read_lines > 0 {
                k.read_line_hits as f64 / k.read_lines as f64
            } else {
                0.0
            },
            ssd_bytes_written: k.ssd_bytes_written,
            ssd_bytes_read: k.ssd_bytes_read,
            hdd_bytes_read: k.hdd_bytes_read,
            hdd_bytes_written: k.hdd_bytes_written,
            erasures: st.erasures,
            write_amplification: st.write_amplification,
            dedup_ratio: red.dedup_ratio,
            compression_ratio: red.compression_ratio,
            effective_capacity: red.effective_capacity,
            index_bytes_per_entry: if cfg.dedup_ratio > 0.0 {
                FpIndex::bytes_per_entry()
            } else {
                0.0
            },
            index_bytes_per_line: if red.cached_lines > 0 {
                e.index_bytes() as f64 / red.cached_lines as f64
            } else {
                0.0
            },
            dirty_lines: e.dirty_lines(),
            counters: k,
            classes: (0..tiercache_engine::NUM_CLASSES as u8)
                .filter(|&c| e.class_counters(c).requests > 0)
                .map(|c| (c, *e.class_counters(c)))
                .collect(),
            reduction: red,
            ftl_kind: self.ftl.config().kind,
            ftl: st,
        })
    }
}

/// Runs `trace` through a log-layout engine, its SSD writes and trims through a page FTL.
pub fn run_log(trace: &ContentTrace, cfg: LogConfig, ftl: FtlConfig) -> Result<LogRun> {
    drive(LogDriver::new(cfg, ftl)?, trace)
}

/// [`run_log`] with the engine driven as the live volume does ([`LogDriver::live`]): what
/// `sim --layout log`, `sweep` and experiment files run.
pub fn run_log_live(trace: &ContentTrace, cfg: LogConfig, ftl: FtlConfig) -> Result<LogRun> {
    drive(LogDriver::new(cfg, ftl)?.live(true), trace)
}

/// [`run_log_live`] under a RAM tier, as `serve --layout log --ram-cache` runs it at queue
/// depth 1 (`tiercache_engine::ram_tier`'s protocol, as [`crate::step_ram`] for the direct
/// layout): a read served whole from RAM never reaches the log engine; a write or trim
/// invalidates its lines first; a read that went below fills RAM with the lines it covered
/// whole.
pub fn run_log_live_ram(
    trace: &ContentTrace,
    cfg: LogConfig,
    ftl: FtlConfig,
    ram: &mut tiercache_engine::RamTier,
) -> Result<LogRun> {
    let mut d = LogDriver::new(cfg, ftl)?.live(true);
    let (mut slots, mut out) = (Vec::new(), Vec::new());
    for (i, (r, c)) in trace.iter().enumerate() {
        if ram.read(r, &mut slots) {
            continue;
        }
        let ticket = ram.ticket();
        ram.invalidate(r);
        d.process(r, c)
            .with_context(|| format!("{}: request {} ({r:?})", trace.name, i + 1))?;
        if r.is_read() {
            ram.fill(r, ticket, &mut out);
        }
    }
    d.finish(&trace.name)
}

fn drive(mut d: LogDriver, trace: &ContentTrace) -> Result<LogRun> {
    for (i, (r, c)) in trace.iter().enumerate() {
        d.process(r, c)
            .with_context(|| format!("{}: request {} ({r:?})", trace.name, i + 1))?;
    }
    d.finish(&trace.name)
}

/// The table's settings.
#[derive(Clone, Debug)]
pub struct NitroSpec {
    pub line_size: u64,
    pub segment_size: u64,
    /// Erase block of the FTL (WEUs are aligned to it).
    pub erase_block: u64,
    pub compression: Compression,
    /// Fingerprint-index ratio of the D variants.
    pub dedup_ratio: f64,
    pub mode: Mode,
    pub trim: bool,
    /// FTL model under the cache (erasures and write amplification).
    pub ftl: FtlKind,
    pub seed: u64,
    pub boot_storm: BootStorm,
    /// Cache size for the boot storm.
    pub boot_cache: u64,
    /// cloudPhysicsIO csv (None: skip that workload).
    pub cloudphysics: Option<PathBuf>,
    /// Cache size for cloudPhysicsIO as a share of its footprint.
    pub cloud_cache_share: f64,
    /// Content model for cloudPhysicsIO.
    pub dup_share: f64,
}

impl Default for NitroSpec {
    fn default() -> Self {
        NitroSpec {
            line_size: 8192,
            segment_size: 2 << 20,
            erase_block: 2 << 20,
            compression: Compression::Lz4,
            dedup_ratio: 1.0,
            mode: Mode::WriteThrough,
            trim: false,
            ftl: FtlKind::Page,
            seed: 1,
            boot_storm: BootStorm::default(),
            boot_cache: 128 << 20,
            cloudphysics: None,
            cloud_cache_share: 0.10,
            dup_share: 0.3,
        }
    }
}

/// The four variants for one unit: (dedup, compress).
pub const VARIANTS: [(bool, bool); 4] =
    [(false, false), (false, true), (true, false), (true, true)];

/// A variant's label, e.g. `WEU (D,C)`.
pub fn label(r: &LogRun) -> String {
    format!(
        "{} ({},{})",
        if r.layout == "extent" {
            "Extent"
        } else {
            "WEU"
        },
        if r.dedup > 0.0 { "D" } else { "ND" },
        if r.compression != "none" { "C" } else { "NC" }
    )
}

/// The log configuration of one variant: extent (segment = line) or WEU (segment =
/// `spec.segment_size`), with or without dedup and compression, cache `capacity`.
pub fn variant_config(
    spec: &NitroSpec,
    capacity: u64,
    weu: bool,
    dedup: bool,
    compress: bool,
) -> LogConfig {
    let mut cfg = LogConfig::new(capacity, spec.line_size);
    cfg.segment_size = if weu {
        spec.segment_size
    } else {
        spec.line_size
    };
    cfg.capacity_bytes = capacity / cfg.segment_size * cfg.segment_size;
    cfg.mode = spec.mode;
    cfg.trim = spec.trim;
    cfg.dedup_ratio = if dedup { spec.dedup_ratio } else { 0.0 };
    cfg.compression = if compress {
        spec.compression
    } else {
        Compression::None
    };
    cfg
}

/// Runs all eight variants on one trace with cache `capacity`.
pub fn run_variants(trace: &ContentTrace, spec: &NitroSpec, capacity: u64) -> Result<Vec<LogRun>> {
    let mut jobs = Vec::new();
    for weu in [false, true] {
        for (d, c) in VARIANTS {
            jobs.push(variant_config(spec, capacity, weu, d, c));
        }
    }
    use rayon::prelude::*;
    jobs.into_par_iter()
        .map(|cfg| {
            let f = ftl_of(&cfg, spec.erase_block, spec.ftl);
            run_log(trace, cfg, f)
        })
        .collect()
}

/// The boot storm of `spec`, content included.
pub fn boot_storm_trace(spec: &NitroSpec) -> ContentTrace {
    let mut b = spec.boot_storm;
    b.line_size = spec.line_size;
    let mut m = ContentModel::new(spec.line_size, spec.seed);
    m.compression = spec.compression;
    b.generate(spec.seed, &m)
}

/// A trace file annotated with the content model.
pub fn model_trace(path: &std::path::Path, spec: &NitroSpec) -> Result<ContentTrace> {
    let reader = tiercache_trace::open(path, None, &tiercache_trace::ReadOptions::default())
        .with_context(|| format!("opening trace {}", path.display()))?;
    let reqs: Vec<_> = reader.collect::<std::result::Result<_, _>>()?;
    let mut m = ContentModel::new(spec.line_size, spec.seed);
    m.dup_share = spec.dup_share;
    m.compression = spec.compression;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(ContentTrace::from_model(name, reqs, m))
}

/// The whole table: boot storm, then cloudPhysicsIO when given.
pub fn run(spec: &NitroSpec) -> Result<Vec<LogRun>> {
    let mut rows = run_variants(&boot_storm_trace(spec), spec, spec.boot_cache)?;
    if let Some(p) = &spec.cloudphysics {
        let t = model_trace(p, spec)?;
        let (lines, _) = t.footprint();
        let cap = ((lines * spec.line_size) as f64 * spec.cloud_cache_share) as u64;
        let cap = cap.max(3 * spec.segment_size);
        rows.extend(run_variants(&t, spec, cap)?);
    }
    Ok(rows)
}

/// A text table of runs.
pub fn table(rows: &[LogRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:<16} {:>8} {:>9} {:>6} {:>6} {:>11} {:>9} {:>6} {:>8}",
        "workload",
        "variant",
        "read hit",
        "eff. cap",
        "dedup",
        "compr",
        "SSD written",
        "erasures",
        "WA",
        "idx B/e"
    );
    for r in rows {
        let w: String = r.workload.chars().take(14).collect();
        let _ = writeln!(
            s,
            "{:<14} {:<16} {:>7.2}% {:>8.2}x {:>5.2}x {:>5.2}x {:>11} {:>9} {:>6.2} {:>8}",
            w,
            label(r),
            r.read_hit_ratio * 100.0,
            r.effective_capacity,
            r.dedup_ratio,
            r.compression_ratio,
            fmt_size(r.ssd_bytes_written),
            r.erasures,
            r.write_amplification,
            if r.index_bytes_per_entry > 0.0 {
                format!("{:.1}", r.index_bytes_per_entry)
            } else {
                "-".into()
            }
        );
    }
    s
}

/// Adds piece `i`'s line outcome `t` to its request's: `first` (piece 0) and `whole`.
fn tally(t: LineTally, i: usize, first: &mut LineTally, whole: &mut LineTally) {
    if i == 0 {
        *first = t;
    }
    *whole += t;
}
