//! Experiment files (TOML) and the cache settings shared by files and command-line flags.
//!
//! ```toml
//! name = "cloudphysics at 10 %"
//! [input]
//! trace = "../../shared/traces/cloudPhysicsIO/cloudPhysicsIO.csv"   # relative to this file
//! format = "auto"
//! # or: workload = "zipf:theta=1.0,wss=4GiB,requests=1e6"
//! seed = 1
//! [cache]
//! size = "10%"            # or "4GiB"
//! policy = "lru"
//! mode = "write-back"
//! line_size = "4KiB"
//! admission = "always"    # or "nhit:2:0"
//! [sweep]                 # optional: a grid; every combination is run
//! size = ["1%", "5%", "10%"]
//! policy = ["lru", "s3fifo"]
//! ```

use crate::{Input, SimSpec};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tiercache_engine::{parse_size, Admission, CacheSize, EngineConfig, Mode, Preset, Validity};

/// Where requests come from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InputSection {
    pub trace: Option<PathBuf>,
    pub format: Option<String>,
    pub skip_bad: bool,
    /// Block size for formats whose records count blocks (ARC, oracleGeneral).
    pub block_size: Option<String>,
    pub workload: Option<String>,
    pub seed: u64,
}

/// Cache settings; every field is optional so that flags can override a file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    /// Bytes ("4GiB") or percent of the footprint ("10%"). Default 10%.
    pub size: Option<String>,
    /// database | file-system | web-service (applied before the fields below).
    pub preset: Option<String>,
    pub line_size: Option<String>,
    pub group_size: Option<String>,
    pub policy: Option<String>,
    pub mode: Option<String>,
    /// always | never | nhit:N | nhit:READ:WRITE
    pub admission: Option<String>,
    pub seq_cutoff_read: Option<String>,
    pub seq_cutoff_write: Option<String>,
    pub dirty_high: Option<f64>,
    pub dirty_low: Option<f64>,
    /// Cleaning's chunk rewrite: chunk size (0 = off; default 1MiB).
    pub rewrite_chunk: Option<String>,
    /// Cleaning's chunk rewrite: dirty runs from which a chunk is rewritten.
    pub rewrite_min_runs: Option<u64>,
    /// Cleaning policy: lba (default) | acp (densest chunk first) | alru (longest dirty
    /// first, lines dirty for more than `cleaning_age` requests cleaned early).
    pub cleaning: Option<String>,
    /// Cleaning `alru`: requests after which a dirty line is due.
    pub cleaning_age: Option<u64>,
    /// Eviction: prefer a clean line among this many likely victims when the victim is dirty
    /// (0 = off).
    pub clean_victim_window: Option<u32>,
    /// sector (default) | line: what is valid and dirty inside a line.
    pub validity: Option<String>,
    pub partial_write_fill: Option<bool>,
    pub slru_protected: Option<f64>,
    pub s3fifo_small: Option<f64>,
    /// direct (default) | log: the cache layout (log = Nitro's compressed, deduplicated
    /// segments; `tiercache sim` runs it with the content model).
    pub layout: Option<String>,
    /// Log layout: segment size (default 2MiB).
    pub segment_size: Option<String>,
    /// Log layout: none | lz4 | zstd[:LEVEL].
    pub compression: Option<String>,
    /// Log layout: fingerprint-index ratio, 0..=1 (0 = no dedup).
    pub dedup: Option<f64>,
}

macro_rules! overlay {
    ($dst:expr, $src:expr, $($f:ident),*) => { $( if $src.$f.is_some() { $dst.$f = $src.$f.clone(); } )* };
}

impl CacheSection {
    /// Fields set in `over` replace ours.
    pub fn overlay(&mut self, over: &CacheSection) {
        overlay!(
            self,
            over,
            size,
            preset,
            line_size,
            group_size,
            policy,
            mode,
            admission,
            seq_cutoff_read,
            seq_cutoff_write,
            dirty_high,
            dirty_low,
            rewrite_chunk,
            rewrite_min_runs,
            cleaning,
            cleaning_age,
            clean_victim_window,
            validity,
            partial_write_fill,
            slru_protected,
            s3fifo_small,
            layout,
            segment_size,
            compression,
            dedup
        );
    }

    /// These settings without the log layout's (layout, segment size, compression, dedup):
    /// what the log layout's driver resolves for the line size, capacity and policy it shares
    /// with the direct layout.
    pub fn without_layout(&self) -> CacheSection {
        CacheSection {
            layout: None,
            segment_size: None,
            compression: None,
            dedup: None,
            ..self.clone()
        }
    }

    /// The cache size and engine configuration these settings describe.
    ///
    /// These settings describe the direct layout; the log layout (`layout = "log"` and its
    /// segment, compression and dedup settings) runs through `tiercache sim`'s log path, so
    /// asking this function for it is an error rather than a silently ignored setting.
    pub fn resolve(&self, seed: u64) -> Result<(CacheSize, EngineConfig)> {
        match self.layout.as_deref() {
            None | Some("direct") => {}
            Some("log") => anyhow::bail!(
                "layout = \"log\" is simulated by `tiercache sim` (or `tiercache nitro-table`); \
                 this entry point (sweeps, reproduce, the Python API) runs the direct layout only"
            ),
            Some(other) => anyhow::bail!("layout: unknown '{other}' (direct or log)"),
        }
        for (key, set) in [
            ("segment_size", self.segment_size.is_some()),
            ("compression", self.compression.is_some()),
            ("dedup", self.dedup.is_some()),
        ] {
            if set {
                anyhow::bail!("{key} applies to layout = \"log\" only");
            }
        }
        let size: CacheSize = self
            .size
            .as_deref()
            .unwrap_or("10%")
            .parse()
            .map_err(|e| anyhow::anyhow!("cache size: {e}"))?;
        let mut cfg = EngineConfig::default();
        cfg.policy_params.seed = seed;
        let size_text = self.size.as_deref().unwrap_or("10%");
        self.apply_engine(&mut cfg)?;
        if let CacheSize::Bytes(b) = size {
            if b < cfg.line_size {
                bail!(
                    "cache size {size_text:?} is a cache of 0 lines of {} bytes; give bytes \
                     (64MiB) or a share of the footprint (10% or 0.1)",
                    cfg.line_size
                );
            }
        }
        Ok((size, cfg))
    }

    /// Applies these settings' engine fields (all but the size and the layout's) over `cfg`
    /// and validates the result: the one parser of `sim`, `sweep`, experiment files and the
    /// live volume's `format`/`serve` flags, so a setting means the same everywhere.
    pub fn apply_engine(&self, cfg: &mut EngineConfig) -> Result<()> {
        if let Some(p) = &self.preset {
            cfg.apply_preset(p.parse::<Preset>().map_err(anyhow::Error::msg)?);
        }
        if let Some(s) = &self.line_size {
            cfg.line_size = parse_size(s).context("line_size")?;
            if self.preset.is_none() && self.group_size.is_none() {
                cfg.group_size = cfg.line_size;
            }
        }
        if let Some(s) = &self.group_size {
            cfg.group_size = parse_size(s).context("group_size")?;
        }
        if let Some(p) = &self.policy {
            cfg.policy = p.clone();
        }
        if let Some(m) = &self.mode {
            cfg.mode = m.parse::<Mode>().map_err(anyhow::Error::msg)?;
        }
        if let Some(a) = &self.admission {
            cfg.admission = a.parse::<Admission>().map_err(anyhow::Error::msg)?;
        }
        if let Some(s) = &self.seq_cutoff_read {
            cfg.seq_cutoff.read_bytes = parse_size(s).context("seq_cutoff_read")?;
        }
        if let Some(s) = &self.seq_cutoff_write {
            cfg.seq_cutoff.write_bytes = parse_size(s).context("seq_cutoff_write")?;
        }
        if let Some(x) = self.dirty_high {
            cfg.dirty_high = x;
        }
        if let Some(x) = self.dirty_low {
            cfg.dirty_low = x;
        }
        if let Some(s) = &self.rewrite_chunk {
            cfg.rewrite_chunk = parse_size(s).context("rewrite_chunk")?;
        }
        if let Some(x) = self.rewrite_min_runs {
            cfg.rewrite_min_runs = x;
        }
        if let Some(c) = &self.cleaning {
            cfg.cleaning = c.parse().map_err(anyhow::Error::msg)?;
        }
        if let Some(x) = self.cleaning_age {
            cfg.cleaning_age = x;
        }
        if let Some(x) = self.clean_victim_window {
            cfg.clean_victim_window = x;
        }
        if let Some(v) = &self.validity {
            cfg.validity = v.parse::<Validity>().map_err(anyhow::Error::msg)?;
        }
        if let Some(x) = self.partial_write_fill {
            cfg.partial_write_fill = x;
        }
        if let Some(x) = self.slru_protected {
            cfg.policy_params.slru_protected = x;
        }
        if let Some(x) = self.s3fifo_small {
            cfg.policy_params.s3fifo_small = x;
        }
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

/// A grid of values to sweep; an empty list keeps the base value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweepGrid {
    pub size: Vec<String>,
    pub policy: Vec<String>,
    pub mode: Vec<String>,
    pub line_size: Vec<String>,
    pub admission: Vec<String>,
}

impl SweepGrid {
    /// Every combination, as cache sections over `base`.
    pub fn cells(&self, base: &CacheSection) -> Vec<CacheSection> {
        fn axis(v: &[String]) -> Vec<Option<String>> {
            if v.is_empty() {
                vec![None]
            } else {
                v.iter().cloned().map(Some).collect()
            }
        }
        let mut out = Vec::new();
        for ls in axis(&self.line_size) {
            for adm in axis(&self.admission) {
                for mode in axis(&self.mode) {
                    for policy in axis(&self.policy) {
                        for size in axis(&self.size) {
                            let mut c = base.clone();
                            c.overlay(&CacheSection {
                                size: size.clone(),
                                policy: policy.clone(),
                                mode: mode.clone(),
                                line_size: ls.clone(),
                                admission: adm.clone(),
                                ..Default::default()
                            });
                            out.push(c);
                        }
                    }
                }
            }
        }
        out
    }
}

/// An experiment file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Experiment {
    pub name: Option<String>,
    pub input: InputSection,
    pub cache: CacheSection,
    pub sweep: Option<SweepGrid>,
}

/// Parses experiment TOML text (relative trace paths stay relative to the current folder).
pub fn parse_toml(text: &str) -> Result<Experiment> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
}

impl Experiment {
    /// Reads an experiment file; relative trace paths are taken from the file's folder.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading experiment file {}", path.display()))?;
        let mut exp: Experiment =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if let Some(t) = &exp.input.trace {
            if t.is_relative() {
                let dir = path.parent().unwrap_or(Path::new("."));
                exp.input.trace = Some(dir.join(t));
            }
        }
        Ok(exp)
    }
}

impl InputSection {
    /// The input this section names.
    pub fn to_input(&self) -> Result<Input> {
        match (&self.trace, &self.workload) {
            (Some(_), Some(_)) => bail!("give either a trace or a workload, not both"),
            (None, None) => bail!("no input: give a trace file (--trace FILE) or a synthetic workload (--workload SPEC)"),
            (Some(path), None) => {
                let format = match self.format.as_deref() {
                    None | Some("auto") => None,
                    Some(f) => Some(f.parse::<tiercache_trace::Format>().map_err(|e| anyhow::anyhow!("{e}"))?),
                };
                let mut options = tiercache_trace::ReadOptions {
                    skip_bad: self.skip_bad,
                    ..Default::default()
                };
                if let Some(bs) = &self.block_size {
                    options.block_size = Some(parse_size(bs).context("block_size")?);
                }
                Ok(Input::Trace {
                    path: path.clone(),
                    format,
                    options,
                })
            }
            (None, Some(spec)) => Ok(Input::Workload {
                spec: spec
                    .parse()
                    .map_err(|e| anyhow::anyhow!("workload '{spec}': {e}"))?,
                seed: self.seed,
            }),
        }
    }
}

/// Builds the simulation specs of an experiment (one, or one per sweep cell).
pub fn specs(
    input: &Input,
    cache: &CacheSection,
    grid: Option<&SweepGrid>,
    seed: u64,
) -> Result<Vec<SimSpec>> {
    let cells = match grid {
        Some(g) => g.cells(cache),
        None => vec![cache.clone()],
    };
    cells
        .iter()
        .map(|c| {
            let (cache_size, engine) = c.resolve(seed)?;
            Ok(SimSpec {
                input: input.clone(),
                cache_size,
                engine,
            })
        })
        .collect()
}
