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
//! # layout = "log"        # Nitro's log layout: then segment_size, compression, dedup,
//! #                       # picker, trim, free_reserve, reinsert_hits, dup_share, erase_block,
//! #                       # content_lengths
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
    /// segments, simulated with the seeded content model; every entry point runs it).
    pub layout: Option<String>,
    /// Log layout: segment size (default 2MiB).
    pub segment_size: Option<String>,
    /// Log layout: none | lz4 | zstd[:LEVEL].
    pub compression: Option<String>,
    /// Log layout: fingerprint-index ratio, 0..=1 (0 = no dedup).
    pub dedup: Option<f64>,
    /// Log layout: segment picker: fifo, lru (default), greedy, cost-benefit.
    pub picker: Option<String>,
    /// Log layout: TRIM a segment before reusing it.
    pub trim: Option<bool>,
    /// Log layout, with `trim`: share of the segments kept free and trimmed ahead of their
    /// reuse, 0 to 0.5 (default 0.05; 0 = trim each segment as it is reused).
    pub free_reserve: Option<f64>,
    /// Log layout: reinsert clean extents with at least N hits when their segment is
    /// reclaimed (0 = off).
    pub reinsert_hits: Option<u16>,
    /// Log layout, content model: share of duplicate extents (default 0.3).
    pub dup_share: Option<f64>,
    /// Log layout: FTL erase block (default 2MiB).
    pub erase_block: Option<String>,
    /// Log layout, content model: compressed lengths `model` (drawn from the ratio
    /// distribution, the default) or `measured` (the content's bytes, as `tiercache replay
    /// --content` writes them, compressed for real: what a live log cache stores).
    pub content_lengths: Option<String>,
    /// RAM tier above the cache ("256MiB"; absent or 0 = none): clean whole lines under
    /// their own policy, read first (`tiercache_engine::RamTier`). Either layout.
    pub ram_cache: Option<String>,
    /// The RAM tier's policy (default s3fifo); needs `ram_cache`.
    pub ram_policy: Option<String>,
}

/// `over`'s set fields over `base`: every field of `over` that differs from
/// `T::default()` (a `Some`, a `true` flag) replaces `base`'s. Field by field through serde,
/// so a field added to `T` is merged without being listed anywhere; a field marked
/// `#[serde(skip)]` keeps `T::default()` and must be carried by the caller.
pub fn set_fields_over<T>(base: &T, over: &T) -> T
where
    T: Serialize + serde::de::DeserializeOwned + Default,
{
    let value = |t: &T| serde_json::to_value(t).expect("settings serialise to a JSON object");
    let (mut merged, top, unset) = (value(base), value(over), value(&T::default()));
    let (Some(m), Some(t), Some(u)) = (merged.as_object_mut(), top.as_object(), unset.as_object())
    else {
        panic!("settings must serialise to a map of fields");
    };
    for (k, v) in t {
        if u.get(k) != Some(v) {
            m.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(merged).expect("the fields just serialised deserialise")
}

impl CacheSection {
    /// Fields set in `over` replace ours (every field: see [`set_fields_over`]).
    pub fn overlay(&mut self, over: &CacheSection) {
        *self = set_fields_over(self, over);
    }

    /// Whether these settings choose the log layout.
    pub fn is_log(&self) -> Result<bool> {
        match self.layout.as_deref().map(str::trim) {
            None | Some("direct") => Ok(false),
            Some("log") => Ok(true),
            Some(other) => bail!("layout: unknown '{other}' (direct or log)"),
        }
    }

    /// The log layout's settings (None for the direct layout); `seed` seeds the content
    /// model. Settings of the other layout are refused rather than silently ignored.
    pub fn log_spec(&self, seed: u64) -> Result<Option<crate::log::LogSpec>> {
        if !self.is_log()? {
            for (key, set) in [
                ("segment_size", self.segment_size.is_some()),
                ("compression", self.compression.is_some()),
                ("dedup", self.dedup.is_some()),
                ("picker", self.picker.is_some()),
                ("trim", self.trim.is_some()),
                ("free_reserve", self.free_reserve.is_some()),
                ("reinsert_hits", self.reinsert_hits.is_some()),
                ("dup_share", self.dup_share.is_some()),
                ("erase_block", self.erase_block.is_some()),
                ("content_lengths", self.content_lengths.is_some()),
            ] {
                if set {
                    bail!("{key} applies to layout = \"log\" only");
                }
            }
            return Ok(None);
        }
        for (key, set) in [
            ("policy", self.policy.is_some()),
            ("preset", self.preset.is_some()),
            ("group_size", self.group_size.is_some()),
            ("admission", self.admission.is_some()),
            ("seq_cutoff_read", self.seq_cutoff_read.is_some()),
            ("seq_cutoff_write", self.seq_cutoff_write.is_some()),
            ("validity", self.validity.is_some()),
            ("slru_protected", self.slru_protected.is_some()),
            ("s3fifo_small", self.s3fifo_small.is_some()),
        ] {
            if set {
                bail!(
                    "{key} applies to layout = \"direct\" only (the log layout caches every \
                     line in segments; its replacement is the segment picker: picker = \
                     \"fifo|lru|greedy|cost-benefit\")"
                );
            }
        }
        let mut l = crate::log::LogSpec {
            seed,
            ..Default::default()
        };
        if let Some(s) = &self.segment_size {
            l.segment_size = parse_size(s).context("segment_size")?;
        }
        if let Some(c) = &self.compression {
            l.compression = c.parse().map_err(|e| anyhow::anyhow!("compression: {e}"))?;
        }
        if let Some(d) = self.dedup {
            anyhow::ensure!(
                (0.0..=1.0).contains(&d),
                "dedup {d}: the fingerprint index is a share of the extent slots, 0 to 1"
            );
            l.dedup = d;
        }
        if let Some(p) = &self.picker {
            l.picker = p.clone();
        }
        if let Some(t) = self.trim {
            l.trim = t;
        }
        if let Some(r) = self.free_reserve {
            l.free_reserve = r;
        }
        if let Some(r) = self.reinsert_hits {
            l.reinsert_hits = r;
        }
        if let Some(d) = self.dup_share {
            anyhow::ensure!(
                (0.0..=1.0).contains(&d),
                "dup_share {d}: a share of the extents, 0 to 1"
            );
            l.dup_share = d;
        }
        if let Some(e) = &self.erase_block {
            l.erase_block = parse_size(e).context("erase_block")?;
        }
        if let Some(c) = &self.content_lengths {
            l.measured = match c.as_str() {
                "model" => false,
                "measured" => true,
                o => bail!("content_lengths \"{o}\": expected model or measured"),
            };
        }
        Ok(Some(l))
    }

    /// The cache size and engine configuration these settings describe (for the log layout,
    /// the line size, mode and seed it shares with the direct layout; its own settings come
    /// from [`CacheSection::log_spec`]).
    pub fn resolve(&self, seed: u64) -> Result<(CacheSize, EngineConfig)> {
        let log = self.log_spec(seed)?.is_some();
        let size: CacheSize = self
            .size
            .as_deref()
            .unwrap_or("10%")
            .parse()
            .map_err(|e| anyhow::anyhow!("cache size: {e}"))?;
        let mut cfg = EngineConfig::default();
        cfg.policy_params.seed = seed;
        if log {
            cfg.line_size = crate::log::DEFAULT_LOG_LINE;
            cfg.group_size = cfg.line_size;
        }
        let size_text = self.size.as_deref().unwrap_or("10%");
        self.apply_engine(&mut cfg)?;
        if log {
            anyhow::ensure!(
                matches!(cfg.mode, Mode::WriteThrough | Mode::WriteBack),
                "mode {}: the log layout runs write-through or write-back",
                cfg.mode
            );
        }
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
        self.apply_ram(cfg)?;
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

impl CacheSection {
    /// `ram_cache` / `ram_policy` over `cfg`, checked here (size, policy) so that a bad
    /// value is named before a run. A policy without a size is refused, never ignored.
    fn apply_ram(&self, cfg: &mut EngineConfig) -> Result<()> {
        if let Some(s) = &self.ram_cache {
            cfg.ram_cache =
                parse_size(s).with_context(|| format!("ram_cache (--ram-cache) {s}"))?;
        }
        if let Some(p) = &self.ram_policy {
            if cfg.ram_cache == 0 {
                bail!(
                    "ram_policy (--ram-policy) {p} needs a RAM tier: set ram_cache \
                     (--ram-cache) too, e.g. 64MiB"
                );
            }
            cfg.ram_policy = p.clone();
        }
        tiercache_engine::RamTier::for_config(cfg).map_err(anyhow::Error::msg)?;
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
                log: c.log_spec(seed)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map, Value};

    /// A value of `key`'s type for `T`, found by trying a string, an integer, a fraction and
    /// a flag (the field types settings use; a fraction before an integer, which an `f64`
    /// field would echo as `7.0`).
    pub(crate) fn sample_for<T: serde::de::DeserializeOwned>(key: &str) -> Value {
        [json!("7k"), json!(0.7), json!(7), json!(true)]
            .into_iter()
            .find(|v| {
                let one = Map::from_iter([(key.to_string(), v.clone())]);
                serde_json::from_value::<T>(Value::Object(one)).is_ok()
            })
            .unwrap_or_else(|| panic!("no sample value deserialises into field {key}"))
    }

    /// Fails when a field is added to `CacheSection` and `overlay` does not carry it: every
    /// field, named from the struct's own serialisation, is set in `over` and must land.
    #[test]
    fn overlay_carries_every_field() {
        let keys: Vec<String> = serde_json::to_value(CacheSection::default())
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert!(keys.len() >= 20, "{keys:?}");
        for k in &keys {
            let v = sample_for::<CacheSection>(k);
            let over: CacheSection =
                serde_json::from_value(Value::Object(Map::from_iter([(k.clone(), v.clone())])))
                    .unwrap();
            let mut base = CacheSection {
                size: Some("1%".into()),
                ..Default::default()
            };
            base.overlay(&over);
            let got = serde_json::to_value(&base).unwrap();
            assert_eq!(got[k.as_str()], v, "overlay dropped field {k}");
            if k != "size" {
                assert_eq!(
                    got["size"],
                    json!("1%"),
                    "overlay of {k} lost an unset field"
                );
            }
            // And an unset `over` keeps what is set.
            let mut kept = over.clone();
            kept.overlay(&CacheSection::default());
            assert_eq!(kept, over, "overlay of nothing changed field {k}");
        }
    }
}
