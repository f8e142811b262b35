//! What a simulation reports, for people (a table) and machines (JSON, CSV).

use crate::log::LogSpec;
use crate::nitro::LogRun;
use crate::SimSpec;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use tiercache_devices::FtlStats;
use tiercache_engine::log::{LogCounters, Reduction};
use tiercache_engine::{fmt_size, Counters, Engine, LogConfig, NUM_CLASSES};

/// What only the log layout has: its settings, data reduction, segments and the FTL under it.
#[derive(Clone, Debug, Serialize)]
pub struct LogFigures {
    pub segment_size: u64,
    pub compression: String,
    /// Fingerprint index as a share of the extent slots (0 = no dedup).
    pub dedup_index: f64,
    pub picker: String,
    pub trim: bool,
    /// Lines cached per stored extent.
    pub dedup_ratio: f64,
    /// Raw bytes per stored byte of the cached extents.
    pub compression_ratio: f64,
    /// Logical bytes cached per SSD byte of the segments in use.
    pub effective_capacity: f64,
    pub segments_sealed: u64,
    pub segments_reclaimed: u64,
    pub extents_stored: u64,
    pub extents_evicted: u64,
    /// Read hits through the fingerprint index, and on extents still in RAM.
    pub dup_read_hits: u64,
    pub ram_read_hits: u64,
    /// FTL erasures and write amplification under the cache's SSD writes and trims.
    pub erasures: u64,
    pub write_amplification: f64,
    /// Fingerprint-index RAM per entry (0 without dedup).
    pub index_bytes_per_entry: f64,
    pub counters: LogCounters,
    /// The engine's counters per I/O class (with a class table), as the live volume's
    /// `ctl stats` `log.classes[].engine` shows them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<u8, LogCounters>,
    pub reduction: Reduction,
    pub ftl: FtlStats,
}

/// The result of one run. The top-level fields are the stable JSON contract.
#[derive(Clone, Debug, Serialize)]
pub struct SimResult {
    pub input: String,
    /// Replacement policy (the log layout: its segment picker); null without a cache.
    pub policy: Option<String>,
    pub mode: String,
    /// direct | log | none (no cache).
    pub layout: String,
    pub admission: String,
    pub line_size: u64,
    pub group_size: u64,
    pub cache_size: String,
    pub capacity_lines: u64,
    pub capacity_bytes: u64,
    /// Distinct lines the input touches (when it was computed).
    pub footprint_lines: Option<u64>,
    pub requests: u64,
    pub line_accesses: u64,
    pub line_hits: u64,
    pub line_misses: u64,
    pub hit_ratio: f64,
    pub miss_ratio: f64,
    /// libCacheSim's pair: the share of requests (reads and writes) not served whole by the
    /// cache, and the share of requested bytes that missed, counted in whole lines (equal to
    /// `miss_ratio`: every line holds the same number of bytes).
    pub request_miss_ratio: f64,
    pub byte_miss_ratio: f64,
    pub read_hit_ratio: f64,
    /// Written lines that hit: in the direct layout a cached line; in the log layout a line
    /// whose content was already cached (a duplicate: no SSD write).
    pub write_hit_ratio: f64,
    pub insertions: u64,
    pub evictions: u64,
    pub write_backs: u64,
    pub bypassed_lines: u64,
    pub ssd_bytes_read: u64,
    pub ssd_bytes_written: u64,
    pub hdd_bytes_read: u64,
    pub hdd_bytes_written: u64,
    pub dirty_lines_at_end: u64,
    /// RAM of the line index (slots, map, policy state) and per cached line at capacity.
    pub index_bytes: u64,
    pub index_bytes_per_line: f64,
    /// Wall-clock seconds of the simulation loop and its speed.
    pub wall_s: f64,
    pub requests_per_s: f64,
    /// Every counter, summed over classes.
    pub counters: Counters,
    /// Counters per class, for the classes that saw requests.
    pub classes: BTreeMap<u8, Counters>,
    /// Names of those classes from the class table (`--classes`), when one was given.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub class_names: BTreeMap<u8, String>,
    /// Malformed trace records skipped (`--skip-bad`), and the first one's error.
    pub skipped_records: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_skipped: Option<String>,
    /// The log layout's own figures (null for the direct layout and no cache).
    pub log: Option<LogFigures>,
    /// The RAM tier's figures (`--ram-cache`; absent without one). Reads it served never
    /// reached the engine: `requests` and the other counters above are the SSD tier's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram: Option<RamFigures>,
    /// Per volume, when the run had a volume table (`sim --volume`, `--volume-mode`,
    /// `--per-volume`; absent otherwise): their counters add up to `counters`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volumes::VolumeFigures>,
    /// Engine shards (`sim --shards`; 1 = one engine, the default).
    pub shards: u32,
    /// How the lines were split between shards (absent with one shard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<ShardFigures>,
    /// How a sweep computed this result: `stack` (every size of an LRU sweep from one
    /// stack-distance pass, [`crate::stack_sweep`]) or `engines` (an engine per point);
    /// absent outside sweeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<&'static str>,
}

/// A sharded run's split: the granule that decides a line's shard, the read, write and
/// trim requests cut between shards, and the smallest and largest shard at the end.
#[derive(Clone, Debug, Serialize)]
pub struct ShardFigures {
    /// Shards asked for (`--shards`); the run's `shards` may be fewer for a small cache.
    pub requested_shards: u32,
    pub granule_bytes: u64,
    pub split_requests: u64,
    pub min_shard_lines: u64,
    pub max_shard_lines: u64,
}

impl ShardFigures {
    pub fn of(e: &tiercache_engine::Sharded) -> Self {
        let lens = (0..e.shard_count()).map(|i| e.shard(i).len());
        ShardFigures {
            requested_shards: e.config().shards,
            granule_bytes: e.granule_bytes(),
            split_requests: e.split_requests(),
            min_shard_lines: lens.clone().min().unwrap_or(0),
            max_shard_lines: lens.max().unwrap_or(0),
        }
    }
}

/// What a result reads from a direct-layout engine: one [`Engine`] or a sharded one.
pub(crate) trait EngineFigures {
    fn counters(&self) -> Counters;
    fn class_counters(&self, class: u8) -> Counters;
    fn config(&self) -> &tiercache_engine::EngineConfig;
    fn capacity_lines(&self) -> u64;
    fn index_bytes(&self) -> usize;
    fn policy_name(&self) -> &'static str;
    fn dirty_lines(&self) -> u64;
    fn shards(&self) -> u32;
    /// Per-volume figures (empty without a volume table).
    fn volume_figures(&self) -> Vec<crate::volumes::VolumeFigures>;
}

impl EngineFigures for Engine {
    fn counters(&self) -> Counters {
        Engine::counters(self)
    }
    fn class_counters(&self, class: u8) -> Counters {
        *Engine::class_counters(self, class)
    }
    fn config(&self) -> &tiercache_engine::EngineConfig {
        Engine::config(self)
    }
    fn capacity_lines(&self) -> u64 {
        Engine::capacity_lines(self)
    }
    fn index_bytes(&self) -> usize {
        Engine::index_bytes(self)
    }
    fn policy_name(&self) -> &'static str {
        Engine::policy_name(self)
    }
    fn dirty_lines(&self) -> u64 {
        Engine::dirty_lines(self)
    }
    fn shards(&self) -> u32 {
        1
    }
    fn volume_figures(&self) -> Vec<crate::volumes::VolumeFigures> {
        crate::volumes::VolumeFigures::of(self)
    }
}

impl EngineFigures for tiercache_engine::Sharded {
    fn counters(&self) -> Counters {
        tiercache_engine::Sharded::counters(self)
    }
    fn class_counters(&self, class: u8) -> Counters {
        tiercache_engine::Sharded::class_counters(self, class)
    }
    fn config(&self) -> &tiercache_engine::EngineConfig {
        tiercache_engine::Sharded::config(self)
    }
    fn capacity_lines(&self) -> u64 {
        tiercache_engine::Sharded::capacity_lines(self)
    }
    fn index_bytes(&self) -> usize {
        tiercache_engine::Sharded::index_bytes(self)
    }
    fn policy_name(&self) -> &'static str {
        tiercache_engine::Sharded::policy_name(self)
    }
    fn dirty_lines(&self) -> u64 {
        tiercache_engine::Sharded::dirty_lines(self)
    }
    fn shards(&self) -> u32 {
        self.shard_count() as u32
    }
    /// Summed over the shards, a split request counted once (`Sharded::volume_stats`).
    fn volume_figures(&self) -> Vec<crate::volumes::VolumeFigures> {
        crate::volumes::VolumeFigures::of_stats(self.volume_stats(), self.capacity_lines())
    }
}

/// The RAM tier of a run, and the read requests per tier.
#[derive(Clone, Debug, Serialize)]
pub struct RamFigures {
    pub capacity_bytes: u64,
    pub capacity_lines: u64,
    pub policy: String,
    /// Read requests of the run (all tiers), and where they were served: whole from RAM,
    /// whole from the SSD cache, or not (some line from the backing device).
    pub read_requests: u64,
    pub ram_hits: u64,
    pub ssd_hits: u64,
    pub misses: u64,
    /// `ram_hits / read_requests`.
    pub ram_hit_ratio: f64,
    /// RAM of the tier's metadata (its data is `capacity_bytes` more).
    pub metadata_bytes: u64,
    pub counters: tiercache_engine::RamCounters,
}

impl RamFigures {
    /// The figures of `tier` beside an engine whose totals are `c`.
    pub fn of(tier: &tiercache_engine::RamTier, c: &Counters) -> Self {
        Self::of_reads(tier, c.reads, c.read_requests.hits)
    }

    /// The figures of `tier` beside an engine that saw `reads` read requests, `ssd_hits` of
    /// them served whole from the cache (the log layout's counters have these too).
    pub fn of_reads(tier: &tiercache_engine::RamTier, reads: u64, ssd_hits: u64) -> Self {
        let k = tier.counters();
        let read_requests = k.hits + reads;
        RamFigures {
            capacity_bytes: tier.capacity_lines() * tier.line_size(),
            capacity_lines: tier.capacity_lines(),
            policy: tier.policy_name().to_string(),
            read_requests,
            ram_hits: k.hits,
            ssd_hits,
            misses: reads - ssd_hits,
            ram_hit_ratio: if read_requests > 0 {
                k.hits as f64 / read_requests as f64
            } else {
                0.0
            },
            metadata_bytes: tier.mem_bytes() as u64,
            counters: k,
        }
    }
}

impl fmt::Display for RamFigures {
    /// Two report lines: reads per tier, and what the RAM tier did.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |x: u64| {
            if self.read_requests > 0 {
                format!("{:.1} %", 100.0 * x as f64 / self.read_requests as f64)
            } else {
                "-".into()
            }
        };
        let k = &self.counters;
        writeln!(
            f,
            "tiers        {} reads: RAM hits {} ({}), SSD hits {} ({}), misses {} ({})",
            self.read_requests,
            self.ram_hits,
            share(self.ram_hits),
            self.ssd_hits,
            share(self.ssd_hits),
            self.misses,
            share(self.misses)
        )?;
        write!(
            f,
            "RAM tier     {} ({} lines), policy {}: {} lines filled, {} evicted, {} invalidated, {} fills skipped; metadata {}",
            fmt_size(self.capacity_bytes),
            self.capacity_lines,
            self.policy,
            k.fills,
            k.evictions,
            k.invalidations,
            k.fills_skipped,
            fmt_size(self.metadata_bytes)
        )
    }
}

impl SimResult {
    pub(crate) fn new(
        spec: &SimSpec,
        e: &impl EngineFigures,
        footprint: Option<u64>,
        wall_s: f64,
    ) -> Self {
        let c = e.counters();
        let cfg = e.config();
        let classes = (0..NUM_CLASSES as u8)
            .filter(|&k| e.class_counters(k).requests > 0)
            .map(|k| (k, e.class_counters(k)))
            .collect();
        let cap = e.capacity_lines();
        let index = e.index_bytes() as u64;
        // Only a run without a cache has 0 lines (a 0-line cache is refused otherwise): no
        // policy and no size to name.
        let no_cache = cap == 0;
        let data_requests = c.full_hits + c.partial_hits + c.full_misses;
        SimResult {
            input: spec.input.label(),
            policy: (!no_cache).then(|| e.policy_name().to_string()),
            mode: cfg.mode.to_string(),
            layout: if no_cache { "none" } else { "direct" }.into(),
            admission: cfg.admission.to_string(),
            line_size: cfg.line_size,
            group_size: cfg.group_size,
            cache_size: if no_cache {
                "none".into()
            } else {
                spec.cache_size.to_string()
            },
            capacity_lines: cap,
            capacity_bytes: cap * cfg.line_size,
            footprint_lines: footprint,
            requests: c.requests,
            line_accesses: c.line_accesses,
            line_hits: c.line_hits,
            line_misses: c.line_misses,
            hit_ratio: c.hit_ratio(),
            miss_ratio: c.miss_ratio(),
            request_miss_ratio: if data_requests > 0 {
                (c.partial_hits + c.full_misses) as f64 / data_requests as f64
            } else {
                0.0
            },
            byte_miss_ratio: c.miss_ratio(),
            read_hit_ratio: c.read_hit_ratio(),
            write_hit_ratio: c.write_hit_ratio(),
            insertions: c.insertions,
            evictions: c.evictions,
            write_backs: c.write_backs,
            bypassed_lines: c.bypasses.total(),
            ssd_bytes_read: c.ssd_bytes_read,
            ssd_bytes_written: c.ssd_bytes_written,
            hdd_bytes_read: c.hdd_bytes_read,
            hdd_bytes_written: c.hdd_bytes_written,
            dirty_lines_at_end: e.dirty_lines(),
            index_bytes: index,
            index_bytes_per_line: if cap > 0 {
                index as f64 / cap as f64
            } else {
                0.0
            },
            wall_s,
            requests_per_s: if wall_s > 0.0 {
                c.requests as f64 / wall_s
            } else {
                0.0
            },
            counters: c,
            class_names: match &cfg.policy_params.classes {
                Some(t) => (0..NUM_CLASSES as u8)
                    .filter(|&k| e.class_counters(k).requests > 0)
                    .map(|k| (k, t.name_of(k).to_string()))
                    .collect(),
                None => BTreeMap::new(),
            },
            classes,
            skipped_records: 0,
            first_skipped: None,
            log: None,
            ram: None,
            volumes: e.volume_figures(),
            shards: e.shards(),
            sharding: None,
            method: None,
        }
    }

    /// The result of a log-layout run: the direct layout's keys from the log engine's
    /// counters (a line access is a read or written line; a write hit a duplicate write),
    /// the rest in [`LogFigures`].
    pub(crate) fn from_log(
        spec: &SimSpec,
        log: &LogSpec,
        cfg: &LogConfig,
        run: &LogRun,
        footprint: Option<u64>,
        wall_s: f64,
    ) -> Self {
        let k = &run.counters;
        let ls = cfg.line_size;
        let c = log_as_direct(k);
        let cap = cfg.capacity_bytes / ls;
        let index = (run.index_bytes_per_line * run.reduction.cached_lines as f64) as u64;
        SimResult {
            input: run.workload.clone(),
            policy: Some(cfg.picker.clone()),
            mode: cfg.mode.to_string(),
            layout: "log".into(),
            admission: spec.engine.admission.to_string(),
            line_size: ls,
            group_size: ls,
            cache_size: spec.cache_size.to_string(),
            capacity_lines: cap,
            capacity_bytes: cfg.capacity_bytes,
            footprint_lines: footprint,
            requests: c.requests,
            line_accesses: c.line_accesses,
            line_hits: c.line_hits,
            line_misses: c.line_misses,
            hit_ratio: c.hit_ratio(),
            miss_ratio: c.miss_ratio(),
            // The log engine does not count whole-request hits: the request miss ratio is
            // taken as the line miss ratio.
            request_miss_ratio: c.miss_ratio(),
            byte_miss_ratio: c.miss_ratio(),
            read_hit_ratio: c.read_hit_ratio(),
            write_hit_ratio: c.write_hit_ratio(),
            insertions: c.insertions,
            evictions: c.evictions,
            write_backs: c.write_backs,
            bypassed_lines: c.bypasses.total(),
            ssd_bytes_read: c.ssd_bytes_read,
            ssd_bytes_written: c.ssd_bytes_written,
            hdd_bytes_read: c.hdd_bytes_read,
            hdd_bytes_written: c.hdd_bytes_written,
            dirty_lines_at_end: run.dirty_lines,
            index_bytes: index,
            index_bytes_per_line: run.index_bytes_per_line,
            wall_s,
            requests_per_s: if wall_s > 0.0 {
                c.requests as f64 / wall_s
            } else {
                0.0
            },
            counters: c,
            classes: run
                .classes
                .iter()
                .map(|(&id, k)| (id, log_as_direct(k)))
                .collect(),
            class_names: match &cfg.classes {
                Some(t) => run
                    .classes
                    .keys()
                    .map(|&id| (id, t.name_of(id).to_string()))
                    .collect(),
                None => BTreeMap::new(),
            },
            skipped_records: 0,
            first_skipped: None,
            log: Some(LogFigures {
                segment_size: cfg.segment_size,
                compression: cfg.compression.to_string(),
                dedup_index: log.dedup,
                picker: cfg.picker.clone(),
                trim: cfg.trim,
                dedup_ratio: run.dedup_ratio,
                compression_ratio: run.compression_ratio,
                effective_capacity: run.effective_capacity,
                segments_sealed: k.segments_sealed,
                segments_reclaimed: k.segments_reclaimed,
                extents_stored: k.extents_stored,
                extents_evicted: k.extents_evicted,
                dup_read_hits: k.dup_read_hits,
                ram_read_hits: k.ram_read_hits,
                erasures: run.erasures,
                write_amplification: run.write_amplification,
                index_bytes_per_entry: run.index_bytes_per_entry,
                counters: *k,
                classes: if cfg.classes.is_some() {
                    run.classes.clone()
                } else {
                    BTreeMap::new()
                },
                reduction: run.reduction,
                ftl: run.ftl,
            }),
            ram: None,
            volumes: Vec::new(),
            shards: 1,
            sharding: None,
            method: None,
        }
    }

    /// Records what the input pass skipped (`--skip-bad`).
    pub fn set_skipped(&mut self, s: crate::input::Skipped) {
        self.skipped_records = s.records;
        self.first_skipped = s.first;
    }

    /// Column names of [`SimResult::csv_row`].
    pub const CSV_HEADER: &'static str = "input,policy,mode,layout,admission,line_size,group_size,cache_size,capacity_lines,footprint_lines,requests,line_accesses,line_hits,hit_ratio,read_hit_ratio,write_hit_ratio,insertions,evictions,write_backs,bypassed_lines,ssd_bytes_read,ssd_bytes_written,hdd_bytes_read,hdd_bytes_written,index_bytes_per_line,wall_s,segment_size,compression,dedup_index,dedup_ratio,compression_ratio,effective_capacity,segments_reclaimed,erasures,write_amplification";

    /// One CSV row (fields in [`SimResult::CSV_HEADER`] order).
    pub fn csv_row(&self) -> String {
        let q = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{},{:.2},{:.3},{}",
            q(&self.input),
            self.policy.as_deref().unwrap_or_default(),
            self.mode,
            self.layout,
            self.admission,
            self.line_size,
            self.group_size,
            q(&self.cache_size),
            self.capacity_lines,
            self.footprint_lines.map(|f| f.to_string()).unwrap_or_default(),
            self.requests,
            self.line_accesses,
            self.line_hits,
            self.hit_ratio,
            self.read_hit_ratio,
            self.write_hit_ratio,
            self.insertions,
            self.evictions,
            self.write_backs,
            self.bypassed_lines,
            self.ssd_bytes_read,
            self.ssd_bytes_written,
            self.hdd_bytes_read,
            self.hdd_bytes_written,
            self.index_bytes_per_line,
            self.wall_s,
            match &self.log {
                Some(l) => format!(
                    "{},{},{},{:.4},{:.4},{:.4},{},{},{:.4}",
                    l.segment_size,
                    l.compression,
                    l.dedup_index,
                    l.dedup_ratio,
                    l.compression_ratio,
                    l.effective_capacity,
                    l.segments_reclaimed,
                    l.erasures,
                    l.write_amplification
                ),
                None => ",,,,,,,,".into(),
            }
        )
    }
}

impl SimResult {
    /// The human report of a log-layout run (after the input line).
    fn fmt_log(&self, f: &mut fmt::Formatter<'_>, l: &LogFigures) -> fmt::Result {
        let k = &l.counters;
        writeln!(
            f,
            "cache        {} log layout ({} lines of {}), segments of {}, picker {}, {}, {} compression, fingerprint index {:.0} %{}",
            fmt_size(self.capacity_bytes),
            self.capacity_lines,
            fmt_size(self.line_size),
            fmt_size(l.segment_size),
            l.picker,
            self.mode,
            l.compression,
            l.dedup_index * 100.0,
            if l.trim { ", TRIM" } else { "" }
        )?;
        writeln!(
            f,
            "requests     {} ({} reads, {} writes, {} trims, {} flushes)",
            k.requests, k.reads, k.writes, k.trims, k.flushes
        )?;
        writeln!(
            f,
            "reads        {} lines, {} hit ({} through the fingerprint index, {} in RAM)",
            k.read_lines,
            pct(self.read_hit_ratio),
            l.dup_read_hits,
            l.ram_read_hits
        )?;
        writeln!(
            f,
            "writes       {} lines, {} duplicates of cached content (no SSD write)",
            k.write_lines, k.dup_write_lines
        )?;
        writeln!(
            f,
            "reduction    dedup {:.2}x, compression {:.2}x, effective capacity {:.2}x",
            l.dedup_ratio, l.compression_ratio, l.effective_capacity
        )?;
        writeln!(
            f,
            "segments     {} sealed, {} reclaimed ({} extents evicted, {} dirty written back)",
            l.segments_sealed, l.segments_reclaimed, l.extents_evicted, k.dirty_write_backs
        )?;
        writeln!(
            f,
            "SSD          {} written, {} read; {} erasures, write amplification {:.2}",
            fmt_size(self.ssd_bytes_written),
            fmt_size(self.ssd_bytes_read),
            l.erasures,
            l.write_amplification
        )?;
        writeln!(
            f,
            "HDD          {} read, {} written",
            fmt_size(self.hdd_bytes_read),
            fmt_size(self.hdd_bytes_written)
        )?;
        write!(
            f,
            "index RAM    {:.1} B per fingerprint entry, {:.1} B per cached line in all",
            l.index_bytes_per_entry, self.index_bytes_per_line
        )
    }
}

fn pct(x: f64) -> String {
    format!("{:.2} %", x * 100.0)
}

impl fmt::Display for SimResult {
    /// A human report.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counters;
        writeln!(f, "input        {}", self.input)?;
        if let Some(l) = &self.log {
            return self.fmt_log(f, l);
        }
        writeln!(
            f,
            "cache        {} ({} lines of {}, groups of {}), policy {}, {}, admission {}",
            fmt_size(self.capacity_bytes),
            self.capacity_lines,
            fmt_size(self.line_size),
            fmt_size(self.group_size),
            self.policy.as_deref().unwrap_or("none (no cache)"),
            self.mode,
            self.admission
        )?;
        if let Some(sh) = &self.sharding {
            let asked = if sh.requested_shards != self.shards {
                format!(
                    " of {} asked: a shard holds at least 64 granules of a line or group",
                    sh.requested_shards
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "shards       {}{asked} (granule {}; {} requests split; {}..{} lines per shard at the end)",
                self.shards,
                fmt_size(sh.granule_bytes),
                sh.split_requests,
                sh.min_shard_lines,
                sh.max_shard_lines
            )?;
        }
        if let Some(fp) = self.footprint_lines {
            writeln!(
                f,
                "footprint    {} lines ({}); cache = {:.2} % of it",
                fp,
                fmt_size(fp * self.line_size),
                if fp > 0 {
                    100.0 * self.capacity_lines as f64 / fp as f64
                } else {
                    0.0
                }
            )?;
        }
        writeln!(
            f,
            "requests     {} ({} reads, {} writes, {} trims, {} flushes)",
            c.requests, c.reads, c.writes, c.trims, c.flushes
        )?;
        if self.skipped_records > 0 {
            writeln!(
                f,
                "skipped      {} malformed records (--skip-bad); the first: {}",
                self.skipped_records,
                self.first_skipped.as_deref().unwrap_or("-")
            )?;
        }
        writeln!(
            f,
            "requests hit {} full, {} partial, {} missed",
            c.full_hits, c.partial_hits, c.full_misses
        )?;
        for (dir, d) in [("reads", &c.read_requests), ("writes", &c.write_requests)] {
            let share = |x: u64| {
                if d.total() > 0 {
                    format!("{:.1} %", 100.0 * x as f64 / d.total() as f64)
                } else {
                    "-".into()
                }
            };
            writeln!(
                f,
                "  {dir:<10} hits {} ({}), partial misses {} ({}), full misses {} ({}), pass-through {} ({}), total {}",
                d.hits,
                share(d.hits),
                d.partial_misses,
                share(d.partial_misses),
                d.full_misses,
                share(d.full_misses),
                d.pass_through,
                share(d.pass_through),
                d.total()
            )?;
        }
        writeln!(f, "line accesses {}", c.line_accesses)?;
        writeln!(
            f,
            "  hit ratio  {} (reads {}, writes {})",
            pct(self.hit_ratio),
            pct(self.read_hit_ratio),
            pct(self.write_hit_ratio)
        )?;
        writeln!(
            f,
            "  request miss ratio {:.4}, byte miss ratio {:.4} (libCacheSim's pair; bytes in whole lines)",
            self.request_miss_ratio, self.byte_miss_ratio
        )?;
        let b = &c.bypasses;
        writeln!(
            f,
            "  misses     {} = {} admitted + {} bypassed (admission {}, seq-cutoff {}, mode {}, partial-write {}, no-capacity {}, class {})",
            c.line_misses, c.admitted_misses, b.total(), b.admission, b.seq_cutoff, b.mode, b.partial_write, b.no_capacity, b.class
        )?;
        writeln!(
            f,
            "lines        {} inserted, {} evicted ({} dirty), {} invalidated, {} written back, {} dirty at end",
            c.insertions, c.evictions, c.dirty_evictions, c.invalidations, c.write_backs, self.dirty_lines_at_end
        )?;
        writeln!(
            f,
            "SSD          {} read, {} written",
            fmt_size(c.ssd_bytes_read),
            fmt_size(c.ssd_bytes_written)
        )?;
        writeln!(
            f,
            "HDD          {} read, {} written (clients read {}, wrote {})",
            fmt_size(c.hdd_bytes_read),
            fmt_size(c.hdd_bytes_written),
            fmt_size(c.read_bytes),
            fmt_size(c.write_bytes)
        )?;
        if self.classes.len() > 1 {
            writeln!(
                f,
                "per class    class {:<14} requests  line hits  hit ratio  inserted  evicting  bypassed",
                "name"
            )?;
            for (k, cc) in &self.classes {
                writeln!(
                    f,
                    "             {:>5} {:<14} {:>8}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}",
                    k,
                    self.class_names.get(k).map(String::as_str).unwrap_or("-"),
                    cc.requests,
                    cc.line_hits,
                    pct(cc.hit_ratio()),
                    cc.insertions,
                    cc.evictions,
                    cc.bypasses.total()
                )?;
            }
        }
        if !self.volumes.is_empty() {
            writeln!(
                f,
                "per volume   {:>5} {:<14} {:<13} {:<9} {:>8}  {:>9}  {:>9}  {:>9}  {:>8}  {:>8}  {:>10}  {:>10}",
                "id", "name", "mode", "admission", "requests", "hit ratio", "read hits", "lines", "pool", "dirty", "HDD read", "HDD written"
            )?;
            for v in &self.volumes {
                writeln!(
                    f,
                    "             {:>5} {:<14} {:<13} {:<9} {:>8}  {:>9}  {:>9}  {:>9}  {:>8}  {:>8}  {:>10}  {:>10}",
                    v.id,
                    v.name,
                    v.mode,
                    v.admission,
                    v.requests,
                    pct(v.hit_ratio),
                    pct(v.read_hit_ratio),
                    v.lines,
                    format!("{:.1} %", v.pool_share * 100.0),
                    v.dirty_lines,
                    fmt_size(v.counters.hdd_bytes_read),
                    fmt_size(v.counters.hdd_bytes_written)
                )?;
            }
        }
        if let Some(r) = &self.ram {
            writeln!(f, "{r}")?;
        }
        write!(
            f,
            "index RAM    {} ({:.1} bytes per cached line); simulated {:.0} requests/s",
            fmt_size(self.index_bytes),
            self.index_bytes_per_line,
            self.requests_per_s
        )
    }
}

/// The direct layout's counters of a log-layout run (whole or one class): a line access is a
/// read or written line, a write hit a duplicate write, a bypass a missed line of a `never`
/// class.
fn log_as_direct(k: &LogCounters) -> Counters {
    Counters {
        requests: k.requests,
        reads: k.reads,
        writes: k.writes,
        trims: k.trims,
        flushes: k.flushes,
        read_line_accesses: k.read_lines,
        read_line_hits: k.read_line_hits,
        write_line_accesses: k.write_lines,
        write_line_hits: k.dup_write_lines,
        line_accesses: k.read_lines + k.write_lines,
        line_hits: k.read_line_hits + k.dup_write_lines,
        line_misses: (k.read_lines - k.read_line_hits) + (k.write_lines - k.dup_write_lines),
        insertions: k.extents_stored,
        evictions: k.extents_evicted,
        write_backs: k.dirty_write_backs,
        ssd_bytes_read: k.ssd_bytes_read,
        ssd_bytes_written: k.ssd_bytes_written,
        hdd_bytes_read: k.hdd_bytes_read,
        hdd_bytes_written: k.hdd_bytes_written,
        bypasses: tiercache_engine::stats::Bypasses {
            class: k.bypassed_lines,
            ..Default::default()
        },
        ..Counters::default()
    }
}
