//! Engine configuration: granularities, write mode, admission, cleaning, presets.

use crate::cleaning::CleaningPolicy;
use crate::policy::PolicyConfig;
use crate::units::size_serde;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Smallest and largest line sizes.
pub const MIN_LINE: u64 = 4 << 10;
pub const MAX_LINE: u64 = 1 << 20;

/// What the engine tracks as valid and dirty inside a cached line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Validity {
    /// Per sector (512 B, or line/64 for lines over 32 KiB), as Open CAS tracks it: a write
    /// to part of an uncached line allocates the line without reading the rest from the
    /// backing device; a later read of sectors the line lacks fills them. Default: it is
    /// what a real cache does and what timed replay must model.
    #[default]
    Sector,
    /// Whole lines: a line is either all valid or absent, and a partial write to an uncached
    /// line reads the rest of the line first. The block-cache model libCacheSim and most
    /// papers use; the oracle tests run in it.
    Line,
}

impl Validity {
    pub fn as_str(self) -> &'static str {
        match self {
            Validity::Sector => "sector",
            Validity::Line => "line",
        }
    }
}

impl std::str::FromStr for Validity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sector" | "sectors" => Ok(Validity::Sector),
            "line" | "lines" => Ok(Validity::Line),
            _ => Err(format!("unknown validity '{s}' (expected sector or line)")),
        }
    }
}

/// How writes are handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Writes go to the backing device and to the cache (cached or admitted lines).
    WriteThrough,
    /// Writes go to the cache only and are marked dirty; cleaning writes them back later.
    WriteBack,
    /// Writes go to the backing device; cached copies are updated, misses are not allocated.
    WriteAround,
    /// Writes go to the backing device and invalidate cached copies; reads are cached.
    ReadOnly,
    /// Nothing new is cached: reads of clean lines and all writes go to the backing device,
    /// writes invalidate cached copies. Dirty lines are still served from the cache.
    PassThrough,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::WriteThrough,
        Mode::WriteBack,
        Mode::WriteAround,
        Mode::ReadOnly,
        Mode::PassThrough,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::WriteThrough => "write-through",
            Mode::WriteBack => "write-back",
            Mode::WriteAround => "write-around",
            Mode::ReadOnly => "read-only",
            Mode::PassThrough => "pass-through",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Mode::WriteThrough => "wt",
            Mode::WriteBack => "wb",
            Mode::WriteAround => "wa",
            Mode::ReadOnly => "ro",
            Mode::PassThrough => "pt",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == t || m.short() == t || m.as_str().replace('-', "") == t)
            .ok_or_else(|| {
                format!(
                    "unknown mode '{s}'; use one of: {}",
                    Mode::ALL
                        .iter()
                        .map(|m| format!("{} ({})", m.as_str(), m.short()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

/// Population (admission) thresholds, counted per group as in Qsan: a line that misses is
/// admitted when its group has been read (written) at least `read_threshold`
/// (`write_threshold`) times, counting this access; 0 disables population in that direction;
/// 1 admits on the first miss (`always`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Admission {
    pub read_threshold: u32,
    pub write_threshold: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::ALWAYS
    }
}

impl Admission {
    pub const ALWAYS: Admission = Admission {
        read_threshold: 1,
        write_threshold: 1,
    };

    pub fn is_always(&self) -> bool {
        *self == Admission::ALWAYS
    }
}

/// As `--admission` takes it, in its shortest form: `always`, `never`, `nhit:N` (both
/// directions), `nhit:R:W`; parsing the text gives the same rule back.
impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.read_threshold, self.write_threshold) {
            (1, 1) => f.write_str("always"),
            (0, 0) => f.write_str("never"),
            (r, w) if r == w => write!(f, "nhit:{r}"),
            (r, w) => write!(f, "nhit:{r}:{w}"),
        }
    }
}

impl FromStr for Admission {
    type Err = String;
    /// `always`, `never`, `nhit:R:W` (read and write thresholds) or `nhit:N` (both).
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            format!("bad admission '{s}'; use always, never, nhit:N or nhit:READ:WRITE (0 disables that direction)")
        };
        match t.as_str() {
            "always" => return Ok(Admission::ALWAYS),
            "never" => {
                return Ok(Admission {
                    read_threshold: 0,
                    write_threshold: 0,
                })
            }
            _ => {}
        }
        let rest = t.strip_prefix("nhit:").ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let num = |p: &str| p.trim().parse::<u32>().map_err(|_| bad());
        match parts.as_slice() {
            [n] => {
                let n = num(n)?;
                Ok(Admission {
                    read_threshold: n,
                    write_threshold: n,
                })
            }
            [r, w] => Ok(Admission {
                read_threshold: num(r)?,
                write_threshold: num(w)?,
            }),
            _ => Err(bad()),
        }
    }
}

/// Sequential cutoff: once a stream of contiguous requests in one direction has moved this
/// many bytes, its misses bypass the cache (hits are still served). 0 disables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeqCutoff {
    #[serde(with = "size_serde")]
    pub read_bytes: u64,
    #[serde(with = "size_serde")]
    pub write_bytes: u64,
}

/// Everything the engine needs to know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Cache capacity in lines.
    pub capacity_lines: u64,
    /// Unit of validity, dirtiness and replacement (power of two, 4 KiB..1 MiB).
    #[serde(with = "size_serde")]
    pub line_size: u64,
    /// Unit of admission counting and population (power-of-two multiple of the line).
    #[serde(with = "size_serde")]
    pub group_size: u64,
    /// Replacement policy name (see `policy::REGISTRY`).
    pub policy: String,
    pub policy_params: PolicyConfig,
    pub mode: Mode,
    pub admission: Admission,
    pub seq_cutoff: SeqCutoff,
    /// Write-back: start cleaning when dirty lines exceed this share of the capacity.
    pub dirty_high: f64,
    /// Write-back: clean down to this share.
    pub dirty_low: f64,
    /// Valid and dirty state per sector (default) or per whole line.
    pub validity: Validity,
    /// A write that covers part of an uncached line (with sector validity: part of a sector)
    /// it allocates: read the rest from the backing device (`true`, default) or send the
    /// write around the cache (`false`).
    pub partial_write_fill: bool,
    /// Size of each volume, if known: population never reads past it.
    pub volume_bytes: Option<u64>,
    /// Cleaning: the disk chunk of a chunk rewrite (power of two, at least the line size;
    /// 0 = off). See [`EngineConfig::rewrite_min_runs`].
    #[serde(with = "size_serde")]
    pub rewrite_chunk: u64,
    /// Cleaning: a chunk holding at least this many runs of dirty lines is written back as
    /// one backing write of the whole chunk (its gaps read once) instead of one write per
    /// run. The default is the crossover of the 7200 rpm disk model for a 1 MiB chunk
    /// (`tiercache_devices::rewrite_min_runs`; a test keeps them equal).
    pub rewrite_min_runs: u64,
    /// Cleaning: which dirty line is written back next (`lba`, `acp` densest chunk first,
    /// `alru` longest dirty first). See [`crate::cleaning`].
    pub cleaning: CleaningPolicy,
    /// Cleaning `alru`: a line dirty for more than this many requests (the engine's logical
    /// clock) is due for cleaning even below the high watermark.
    pub cleaning_age: u64,
    /// Eviction: when the policy's victim is dirty, evict instead the first clean line among
    /// its next this-many likely victims (`Policy::eviction_candidates`), so a miss waits
    /// for no write-back. 0 = off (the policy's victim, dirty or not).
    pub clean_victim_window: u32,
    /// RAM tier above the cache (`sim --ram-cache`, `serve --ram-cache`): bytes of clean
    /// whole lines kept in memory; 0 = none. The engine itself ignores it: the executor runs
    /// a [`crate::RamTier`] beside the engine.
    #[serde(with = "size_serde")]
    pub ram_cache: u64,
    /// The RAM tier's replacement policy (default s3fifo).
    pub ram_policy: String,
    /// Shards of the line key space (1..=[`crate::sharded::MAX_SHARDS`], default 1): N
    /// independent engines, each with its share of the capacity ([`crate::Sharded`]). An
    /// [`crate::Engine`] itself ignores it; `sim --shards` sets it.
    pub shards: u32,
    /// Granule of a sharded engine (bytes, power of two): lines of one granule share a
    /// shard. 0 (default) = automatic: up to 1 MiB, smaller (and fewer shards) for a small
    /// cache, so that every shard holds 64 granules. A set value fixes the granule (at
    /// least a line and a group) and the shard count ([`crate::Sharded::layout_of`]).
    #[serde(with = "size_serde")]
    pub shard_granule: u64,
    /// Volumes with settings of their own (several volumes, one pool; see
    /// `docs/design-pool.md`). Empty (the default) = one engine-wide setting for every
    /// volume and no per-volume counters: exactly the engine before volumes had settings.
    /// Non-empty: per-volume counters for every volume that sends a request
    /// ([`crate::Engine::volume_stats`]); a volume not listed uses the engine-wide settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeConfig>,
    /// Lines offered by each cache device of a pool (see [`crate::Pool`]). Empty (the
    /// default) = one cache device of `capacity_lines` lines, exactly the engine before pools.
    /// Non-empty: the engine places lines over the members ([`crate::Engine::member_of`])
    /// and `capacity_lines` must equal the pool's capacity, `Pool::new(&pool_lines)?
    /// .capacity()` (members of a pool of two or more are rounded down to 128 lines); it is
    /// checked, not derived, so that a persisted capacity and the member table cannot
    /// disagree silently. A sharded engine refuses a pool of several members.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pool_lines: Vec<u64>,
    /// Cache copies of each dirty line: 1 (the default, today) or 2 (write-back keeps a
    /// mirrored copy of a line's dirty sectors on another member of the pool, so the loss
    /// of one cache device loses no acknowledged write; needs `pool_lines` of two or more
    /// members). See `docs/plan-multi-cache.md` (c).
    #[serde(skip_serializing_if = "is_one")]
    pub dirty_copies: u8,
}

/// One volume of a pool: its id (the requests' `volume`), a name for reports, and the
/// settings it overrides (None = the engine-wide one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VolumeConfig {
    pub id: u32,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_cutoff: Option<SeqCutoff>,
    /// The volume's size in bytes (a live volume's backing device): group population and
    /// chunk rewrites of its lines stop at its end. None: [`EngineConfig::volume_bytes`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl VolumeConfig {
    /// A volume with the engine-wide settings.
    pub fn new(id: u32, name: impl Into<String>) -> Self {
        VolumeConfig {
            id,
            name: name.into(),
            ..Default::default()
        }
    }
}

/// Default [`EngineConfig::cleaning_age`] (requests).
pub const DEFAULT_CLEANING_AGE: u64 = 100_000;

/// Default [`EngineConfig::rewrite_chunk`].
pub const DEFAULT_REWRITE_CHUNK: u64 = 1 << 20;
/// Default [`EngineConfig::rewrite_min_runs`]: the 7200 rpm model's crossover for
/// [`DEFAULT_REWRITE_CHUNK`] (derived in `tiercache_devices::rewrite_min_runs`).
pub const DEFAULT_REWRITE_MIN_RUNS: u64 = 7;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            capacity_lines: 0,
            line_size: 4096,
            group_size: 4096,
            policy: "lru".into(),
            policy_params: PolicyConfig::default(),
            mode: Mode::WriteThrough,
            admission: Admission::ALWAYS,
            seq_cutoff: SeqCutoff::default(),
            dirty_high: 0.8,
            dirty_low: 0.6,
            validity: Validity::Sector,
            partial_write_fill: true,
            volume_bytes: None,
            rewrite_chunk: DEFAULT_REWRITE_CHUNK,
            rewrite_min_runs: DEFAULT_REWRITE_MIN_RUNS,
            cleaning: CleaningPolicy::Lba,
            cleaning_age: DEFAULT_CLEANING_AGE,
            clean_victim_window: 0,
            ram_cache: 0,
            ram_policy: crate::ram_tier::DEFAULT_RAM_POLICY.into(),
            volumes: Vec::new(),
            pool_lines: Vec::new(),
            dirty_copies: 1,
            shards: 1,
            shard_granule: 0,
        }
    }
}

impl EngineConfig {
    /// Checks the configuration; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let ls = self.line_size;
        if !ls.is_power_of_two() || !(MIN_LINE..=MAX_LINE).contains(&ls) {
            return Err(format!(
                "line_size {ls} must be a power of two between 4 KiB and 1 MiB"
            ));
        }
        let gs = self.group_size;
        if !gs.is_power_of_two() || gs < ls {
            return Err(format!(
                "group_size {gs} must be a power of two and at least the line size ({ls})"
            ));
        }
        if gs / ls > 1 << 16 {
            return Err(format!(
                "group_size {gs} holds more than 65536 lines of {ls} bytes"
            ));
        }
        if self.capacity_lines >= u32::MAX as u64 {
            return Err(format!(
                "capacity of {} lines is too large (at most {} lines; use a larger line size)",
                self.capacity_lines,
                u32::MAX - 1
            ));
        }
        if crate::policy::lookup(&self.policy).is_none() {
            return Err(format!(
                "unknown policy '{}'; known: {}",
                self.policy,
                crate::policy::names().join(", ")
            ));
        }
        let p = &self.policy_params;
        if !(p.slru_protected > 0.0 && p.slru_protected < 1.0) {
            return Err(format!(
                "slru_protected {} must be between 0 and 1",
                p.slru_protected
            ));
        }
        if !(p.s3fifo_small > 0.0 && p.s3fifo_small < 1.0) {
            return Err(format!(
                "s3fifo_small {} must be between 0 and 1",
                p.s3fifo_small
            ));
        }
        crate::policy::VolumeShare::validate(&p.volume_shares)?;
        if !(0.0..=1.0).contains(&self.dirty_low)
            || !(0.0..=1.0).contains(&self.dirty_high)
            || self.dirty_low > self.dirty_high
        {
            return Err(format!(
                "dirty watermarks must satisfy 0 <= dirty_low ({}) <= dirty_high ({}) <= 1",
                self.dirty_low, self.dirty_high
            ));
        }
        let c = self.rewrite_chunk;
        if c != 0 && (!c.is_power_of_two() || c < ls || c > 1 << 30) {
            return Err(format!(
                "rewrite_chunk {c} must be 0 (off) or a power of two between the line size ({ls}) and 1 GiB"
            ));
        }
        if self.cleaning_age == 0 {
            return Err("cleaning_age must be at least 1 request".into());
        }
        let g = self.shard_granule;
        if g != 0 && (!g.is_power_of_two() || g < MIN_LINE) {
            return Err(format!(
                "shard_granule {g} must be 0 (automatic) or a power of two of at least 4 KiB"
            ));
        }
        let n = self.shards as usize;
        if !(1..=crate::sharded::MAX_SHARDS).contains(&n) {
            return Err(format!(
                "shards {n} must be between 1 and {}",
                crate::sharded::MAX_SHARDS
            ));
        }
        self.validate_pool()?;
        self.validate_volumes()
    }

    /// The cache devices' slot ranges: [`EngineConfig::pool_lines`], or one device of
    /// `capacity_lines` lines when it is empty. Call on a validated configuration.
    pub fn pool(&self) -> crate::Pool {
        if self.pool_lines.is_empty() {
            crate::Pool::single(self.capacity_lines)
        } else {
            crate::Pool::new(&self.pool_lines).expect("validated pool_lines")
        }
    }

    /// `pool_lines` builds a pool whose capacity is `capacity_lines`.
    fn validate_pool(&self) -> Result<(), String> {
        match self.dirty_copies {
            1 => {}
            2 if self.pool_lines.len() >= 2 => {}
            2 => {
                return Err(format!(
                    "dirty_copies 2 needs a pool of two or more cache devices (pool_lines has {})",
                    self.pool_lines.len()
                ))
            }
            n => return Err(format!("dirty_copies {n} must be 1 or 2")),
        }
        if self.pool_lines.is_empty() {
            return Ok(());
        }
        let pool = crate::Pool::new(&self.pool_lines).map_err(|e| format!("pool_lines: {e}"))?;
        if pool.capacity() != self.capacity_lines {
            return Err(format!(
                "capacity of {} lines differs from the pool's {} lines (pool_lines {:?}, \
                 members of several rounded down to multiples of {})",
                self.capacity_lines,
                pool.capacity(),
                self.pool_lines,
                crate::POOL_ALIGN
            ));
        }
        if self.shards > 1 && pool.members() > 1 {
            return Err(
                "a sharded engine cannot place lines over several cache devices \
                        (pool_lines with shards > 1)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The volume table: ids in range, ids and names unique, names non-empty.
    fn validate_volumes(&self) -> Result<(), String> {
        let max = crate::engine::MAX_VOLUME;
        for (i, v) in self.volumes.iter().enumerate() {
            if v.id > max {
                return Err(format!(
                    "volume '{}': id {} is out of range (0..={max})",
                    v.name, v.id
                ));
            }
            if v.name.trim().is_empty() {
                return Err(format!("volume {}: the name is empty", v.id));
            }
            if let Some(o) = self.volumes[..i]
                .iter()
                .find(|o| o.id == v.id || o.name == v.name)
            {
                return Err(format!(
                    "volumes '{}' (id {}) and '{}' (id {}) share an id or a name",
                    o.name, o.id, v.name, v.id
                ));
            }
        }
        Ok(())
    }

    /// Lines per chunk of ACP cleaning, as log2: `rewrite_chunk`, or 1 MiB when chunk
    /// rewrites are off (at least one line).
    pub fn acp_chunk_lines_shift(&self) -> u32 {
        let chunk = if self.rewrite_chunk != 0 {
            self.rewrite_chunk
        } else {
            DEFAULT_REWRITE_CHUNK
        };
        (chunk.max(self.line_size) / self.line_size).trailing_zeros()
    }

    /// Applies a named preset (line, group and thresholds).
    pub fn apply_preset(&mut self, preset: Preset) {
        let (group, line, r, w) = preset.params();
        self.group_size = group;
        self.line_size = line;
        self.admission = Admission {
            read_threshold: r,
            write_threshold: w,
        };
    }
}

/// Qsan's presets (white paper table "I/O Type").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// 1 MiB group, 8 KiB line, populate on 2nd read, never on write.
    Database,
    /// 2 MiB group, 16 KiB line, populate on 2nd read and 2nd write.
    FileSystem,
    /// 4 MiB group, 64 KiB line, populate on 2nd read, never on write.
    WebService,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Database, Preset::FileSystem, Preset::WebService];

    /// (group bytes, line bytes, read threshold, write threshold).
    pub fn params(self) -> (u64, u64, u32, u32) {
        match self {
            Preset::Database => (1 << 20, 8 << 10, 2, 0),
            Preset::FileSystem => (2 << 20, 16 << 10, 2, 2),
            Preset::WebService => (4 << 20, 64 << 10, 2, 0),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Database => "database",
            Preset::FileSystem => "file-system",
            Preset::WebService => "web-service",
        }
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        Preset::ALL
            .into_iter()
            .find(|p| p.as_str() == t || p.as_str().replace('-', "") == t)
            .ok_or_else(|| {
                format!("unknown preset '{s}'; use database, file-system or web-service")
            })
    }
}

fn is_one(n: &u8) -> bool {
    *n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_modes_and_admission() {
        assert_eq!("wb".parse::<Mode>().unwrap(), Mode::WriteBack);
        assert_eq!("write-through".parse::<Mode>().unwrap(), Mode::WriteThrough);
        assert_eq!("readonly".parse::<Mode>().unwrap(), Mode::ReadOnly);
        assert!("fast".parse::<Mode>().unwrap_err().contains("write-back"));
        assert_eq!("always".parse::<Admission>().unwrap(), Admission::ALWAYS);
        let a: Admission = "nhit:2:0".parse().unwrap();
        assert_eq!((a.read_threshold, a.write_threshold), (2, 0));
        assert!("nhit:x".parse::<Admission>().is_err());
        // Shown as typed, and the text parses back to the same rule.
        for (text, shown) in [
            ("always", "always"),
            ("never", "never"),
            ("nhit:0:0", "never"),
            ("nhit:1", "always"),
            ("nhit:3", "nhit:3"),
            ("nhit:2:2", "nhit:2"),
            ("nhit:2:0", "nhit:2:0"),
            ("nhit:0:4", "nhit:0:4"),
        ] {
            let a: Admission = text.parse().unwrap();
            assert_eq!(a.to_string(), shown, "{text}");
            assert_eq!(shown.parse::<Admission>().unwrap(), a, "{text}");
        }
    }

    #[test]
    fn presets_match_qsan_table() {
        let mut c = EngineConfig::default();
        c.apply_preset("database".parse().unwrap());
        assert_eq!((c.group_size, c.line_size), (1 << 20, 8192));
        assert_eq!(c.admission.read_threshold, 2);
        assert_eq!(c.admission.write_threshold, 0);
        c.apply_preset(Preset::FileSystem);
        assert_eq!(
            (c.group_size, c.line_size, c.admission.write_threshold),
            (2 << 20, 16384, 2)
        );
        c.apply_preset(Preset::WebService);
        assert_eq!((c.group_size, c.line_size), (4 << 20, 65536));
        c.validate().unwrap();
    }

    #[test]
    fn validation_names_the_field() {
        let c = EngineConfig {
            line_size: 3000,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("line_size"));
        let c = EngineConfig {
            policy: "nope".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("known: lru"));
    }
}
