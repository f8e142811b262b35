//! The direct layout's per-run engine settings (issue 19): admission, sequential cutoff per
//! direction, group size, dirty watermarks, the SLRU protected share, eviction's clean-victim
//! window and partial-write fill. They are set by
//! `format`/`serve` flags (parsed as `tiercache sim` parses them), changed live by
//! `tiercache ctl set KEY VALUE`, and stored in the superblock so a restart keeps them.
//!
//! On disk: bytes [`AT`].. of the superblock block (its second 512-byte sector, outside the
//! fields of sector 0), [`BYTES`] bytes, little endian:
//! ```text
//! 0  magic "TCTUNING"   8  version u32 (1)    12 group_size u64
//! 20 read_threshold u32 24 write_threshold u32 28 seq_cutoff_read u64  36 seq_cutoff_write u64
//! 44 dirty_high f64     52 dirty_low f64      60 slru_protected f64
//! version 1:  68 crc32c u32 (of 0..68)
//! version 2:  68 cleaning u8 (0 lba, 1 acp, 2 alru)  72 cleaning_age u64
//!             80 writeback-rate kind u8 (0 not set, 1 off, 2 auto, 3 fixed)
//!             88 fixed rate f64 (lines/s)  96 writeback_target f64
//!             version 2: 104 crc32c u32 (of 0..104)
//! version 3:  104 clean_victim_window u32  108 partial_write_fill u8 (0 off, 1 on)
//!             109..112 zero  112 crc32c u32 (of 0..112)
//! ```
//! Version 1 blocks (devices formatted before the cleaner's settings were stored) still open:
//! their cleaning settings are the defaults and the write-back rate is not set. Version 1 and
//! 2 blocks (before the clean-victim window and partial-write fill were stored) open with
//! those two at their defaults (window 0, fill on).
//! A superblock rewrite torn inside this sector leaves a block whose own checksum fails: it
//! is ignored with a warning and the defaults apply (these settings shape performance, never
//! what a block reads). Builds before this area ignore it (the superblock's version is
//! unchanged: sector 0 is as it was).

use serde::Serialize;
use tiercache_engine::{fmt_size, parse_size, Admission, EngineConfig};

/// Tracing target of the settings log (`old -> new` of every change), shown by default.
pub const LOG_TARGET: &str = "tiercache::settings";

/// Offset of the settings inside the superblock block.
pub const AT: usize = 512;
pub const BYTES: usize = 116;
const V1_BYTES: usize = 72;
const V2_BYTES: usize = 108;
const MAGIC: &[u8; 8] = b"TCTUNING";
const VERSION: u32 = 3;

/// Keys a volume of several has its own value of (`ctl --volume NAME set KEY VALUE`, stored
/// with the cache by `crate::vol_tuning`); the others are the pool's.
pub const VOLUME_KEYS: &[&str] = &[
    "mode",
    "admission",
    "seq-cutoff",
    "seq-cutoff-write",
    "share",
];

/// A per-volume key (`ctl --volume NAME get|set KEY`): [`key`], or `share` (a volume's
/// occupancy bounds, MIN:MAX; no pool-wide value).
pub fn volume_key(k: &str) -> Result<&'static str, String> {
    if k.trim().eq_ignore_ascii_case("share") {
        return Ok("share");
    }
    key(k).map_err(|e| format!("{e}; per volume also: share"))
}

/// Keys `ctl get`/`ctl set` know, in display order: (key, what it is, changeable live).
pub const KEYS: &[(&str, &str, bool)] = &[
    ("mode", "write mode (also `ctl mode`)", true),
    (
        "admission",
        "always, never, nhit:N or nhit:READ:WRITE",
        true,
    ),
    (
        "seq-cutoff",
        "read streams longer than this bypass the cache (0 = off)",
        true,
    ),
    ("seq-cutoff-write", "the same for write streams", true),
    (
        "group-size",
        "admission/population unit, a power-of-two multiple of the line",
        true,
    ),
    (
        "dirty-high",
        "write-back: clean above this dirty share",
        true,
    ),
    ("dirty-low", "write-back: clean down to this share", true),
    (
        "clean-victim-window",
        "eviction prefers a clean line among the policy's next N likely victims (0 = off)",
        true,
    ),
    (
        "partial-fill",
        "on: a partial write to an uncached line reads the rest of it; off: it goes around the cache",
        true,
    ),
    (
        "cleaning",
        "write-back cleaning order: lba, acp (densest chunk first) or alru (longest dirty first)",
        true,
    ),
    (
        "cleaning-age",
        "cleaning alru: requests after which a dirty line is cleaned",
        true,
    ),
    (
        "writeback-rate",
        "background cleaner's rate below the high watermark: auto (PD controller), off, or lines/s",
        true,
    ),
    (
        "writeback-target",
        "dirty share the write-back rate holds",
        true,
    ),
    (
        "ram-cache",
        "RAM tier size: resized live, emptied (per run, not stored: a restart takes serve's --ram-cache; a tier is added or removed only at start)",
        true,
    ),
    (
        "classes",
        "the I/O class table: replace it with `tiercache ctl classes load FILE` (per run: a restart uses serve's --classes)",
        false,
    ),
    (
        "slru-protected",
        "the SLRU protected share is set per run: restart the server with --slru-protected",
        false,
    ),
    (
        "policy",
        "the replacement policy is set per run: restart the server with --policy",
        false,
    ),
    (
        "line-size",
        "the line size is fixed at format: `tiercache format --force --line-size` (discards the cache)",
        false,
    ),
    (
        "validity",
        "sector or line validity is fixed at format: `tiercache format --force --validity` (discards the cache)",
        false,
    ),
];

/// Keys only the log layout has (`ctl get`/`ctl set` on a log volume; per run, not stored:
/// a restart takes serve's flags), as `tiercache sim --layout log` takes them.
pub const LOG_KEYS: &[(&str, &str)] = &[
    (
        "trim",
        "on: a reclaimed segment's data area is discarded (TRIM) once it is durably empty",
    ),
    (
        "free-reserve",
        "with trim: share of the segments reclaimed, trimmed and kept free ahead of reuse (0..0.5)",
    ),
    (
        "reinsert-hits",
        "a clean extent read at least this often is put back when its segment is reclaimed (0 = off)",
    ),
];

/// Keys of [`KEYS`] that belong to the volume's cleaner rather than the engine's settings
/// (`ctl set` applies them through the volume); stored in the settings block since version 2.
pub const CLEANER_KEYS: &[&str] = &[
    "cleaning",
    "cleaning-age",
    "writeback-rate",
    "writeback-target",
];

/// Canonical key name (`seq_cutoff` and `seq-cutoff` are the same), or an error listing the
/// keys.
pub fn key(k: &str) -> Result<&'static str, String> {
    let want = k.trim().to_ascii_lowercase().replace('_', "-");
    let want = match want.as_str() {
        "seq-cutoff-read" => "seq-cutoff",
        w => w,
    };
    KEYS.iter()
        .map(|x| x.0)
        .find(|x| *x == want)
        .ok_or_else(|| match LOG_KEYS.iter().find(|x| x.0 == want) {
            Some((l, what)) => format!(
                "{l} is a setting of the log layout only ({what}); this volume uses the direct layout"
            ),
            None => format!(
                "unknown setting {k:?}; known: {} (log layout: {})",
                KEYS.iter().map(|x| x.0).collect::<Vec<_>>().join(", "),
                LOG_KEYS.iter().map(|x| x.0).collect::<Vec<_>>().join(", ")
            ),
        })
}

/// A log-layout key ([`LOG_KEYS`]), canonical, if `k` names one.
pub fn log_key(k: &str) -> Option<&'static str> {
    let want = k.trim().to_ascii_lowercase().replace('_', "-");
    LOG_KEYS.iter().map(|x| x.0).find(|x| *x == want)
}

/// An on/off setting's value (`on`, `true`, `yes`, `1` / `off`, `false`, `no`, `0`), or an
/// error naming the key.
pub fn parse_on_off(k: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{k} {v:?}: give on or off")),
    }
}

/// A size as `ctl get` shows it (parseable again by `ctl set`): `0`, `256KiB`, `1MiB`.
pub fn size_str(b: u64) -> String {
    if b == 0 {
        "0".into()
    } else {
        fmt_size(b).replace(' ', "")
    }
}

/// The per-run settings (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tuning {
    pub group_size: u64,
    #[serde(serialize_with = "admission_str")]
    pub admission: Admission,
    pub seq_cutoff_read: u64,
    pub seq_cutoff_write: u64,
    pub dirty_high: f64,
    pub dirty_low: f64,
    pub slru_protected: f64,
    #[serde(skip)]
    pub cleaning: tiercache_engine::CleaningPolicy,
    #[serde(skip)]
    pub cleaning_age: u64,
    /// The background cleaner's rate and target share (`--writeback-rate`,
    /// `--writeback-target`, `ctl set`); `None`: not set (the volume's default).
    #[serde(skip)]
    pub writeback: Option<(tiercache_engine::WritebackRate, f64)>,
    /// Eviction's clean-victim window (`--clean-victim-window`; 0 = off).
    pub clean_victim_window: u32,
    /// Partial writes to uncached lines fill the line (`--no-partial-fill`: false).
    pub partial_write_fill: bool,
}

// Decoded shares are checked to be numbers (not NaN), so equality is reflexive.
impl Eq for Tuning {}

fn admission_str<S: serde::Serializer>(a: &Admission, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&a.to_string())
}

impl Tuning {
    /// The settings `cfg` holds.
    pub fn of(cfg: &EngineConfig) -> Tuning {
        Tuning {
            group_size: cfg.group_size,
            admission: cfg.admission,
            seq_cutoff_read: cfg.seq_cutoff.read_bytes,
            seq_cutoff_write: cfg.seq_cutoff.write_bytes,
            dirty_high: cfg.dirty_high,
            dirty_low: cfg.dirty_low,
            slru_protected: cfg.policy_params.slru_protected,
            cleaning: cfg.cleaning,
            cleaning_age: cfg.cleaning_age,
            writeback: None,
            clean_victim_window: cfg.clean_victim_window,
            partial_write_fill: cfg.partial_write_fill,
        }
    }

    /// Puts these settings into `cfg`.
    pub fn apply(&self, cfg: &mut EngineConfig) {
        cfg.group_size = self.group_size;
        cfg.admission = self.admission;
        cfg.seq_cutoff.read_bytes = self.seq_cutoff_read;
        cfg.seq_cutoff.write_bytes = self.seq_cutoff_write;
        cfg.dirty_high = self.dirty_high;
        cfg.dirty_low = self.dirty_low;
        cfg.policy_params.slru_protected = self.slru_protected;
        cfg.cleaning = self.cleaning;
        cfg.cleaning_age = self.cleaning_age;
        cfg.clean_victim_window = self.clean_victim_window;
        cfg.partial_write_fill = self.partial_write_fill;
    }

    /// The value of a setting key ([`key`]) these settings hold; `None` for the keys that are
    /// not part of them (mode, policy, line size).
    pub fn get(&self, k: &str) -> Option<String> {
        Some(match k {
            "admission" => self.admission.to_string(),
            "seq-cutoff" => size_str(self.seq_cutoff_read),
            "seq-cutoff-write" => size_str(self.seq_cutoff_write),
            "group-size" => size_str(self.group_size),
            "dirty-high" => self.dirty_high.to_string(),
            "dirty-low" => self.dirty_low.to_string(),
            "slru-protected" => self.slru_protected.to_string(),
            "clean-victim-window" => self.clean_victim_window.to_string(),
            "partial-fill" => on_off(self.partial_write_fill).into(),
            _ => return None,
        })
    }

    /// These settings with `k` set to `v`, parsed as `tiercache sim` parses the flag of the
    /// same name (the engine validates the combination when it takes them).
    pub fn with(&self, k: &str, v: &str) -> Result<Tuning, String> {
        let mut t = *self;
        let size = |v: &str| parse_size(v).map_err(|e| format!("{k} {v:?}: {e}"));
        let share = |v: &str| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| format!("{k} {v:?}: give a share between 0 and 1, e.g. 0.8"))
        };
        match k {
            "admission" => t.admission = v.parse().map_err(|e| format!("{k}: {e}"))?,
            "seq-cutoff" => t.seq_cutoff_read = size(v)?,
            "seq-cutoff-write" => t.seq_cutoff_write = size(v)?,
            "group-size" => t.group_size = size(v)?,
            "dirty-high" => t.dirty_high = share(v)?,
            "dirty-low" => t.dirty_low = share(v)?,
            "clean-victim-window" => {
                t.clean_victim_window = v.trim().parse().map_err(|_| {
                    format!("{k} {v:?}: give a number of likely victims (0 = off), e.g. 8")
                })?
            }
            "partial-fill" => t.partial_write_fill = parse_on_off(k, v)?,
            _ => return Err(format!("{k} is not a per-run setting")),
        }
        Ok(t)
    }

    /// Writes the settings block into `out` (at least [`BYTES`] bytes).
    pub fn encode_into(&self, out: &mut [u8]) {
        let b = &mut out[..BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.group_size.to_le_bytes());
        b[20..24].copy_from_slice(&self.admission.read_threshold.to_le_bytes());
        b[24..28].copy_from_slice(&self.admission.write_threshold.to_le_bytes());
        b[28..36].copy_from_slice(&self.seq_cutoff_read.to_le_bytes());
        b[36..44].copy_from_slice(&self.seq_cutoff_write.to_le_bytes());
        b[44..52].copy_from_slice(&self.dirty_high.to_le_bytes());
        b[52..60].copy_from_slice(&self.dirty_low.to_le_bytes());
        b[60..68].copy_from_slice(&self.slru_protected.to_le_bytes());
        b[68..88].fill(0);
        b[68] = cleaning_code(self.cleaning);
        b[72..80].copy_from_slice(&self.cleaning_age.to_le_bytes());
        let (kind, fixed, target) = match self.writeback {
            None => (0u8, 0.0, 0.0),
            Some((tiercache_engine::WritebackRate::Off, t)) => (1, 0.0, t),
            Some((tiercache_engine::WritebackRate::Auto, t)) => (2, 0.0, t),
            Some((tiercache_engine::WritebackRate::Fixed(n), t)) => (3, n, t),
        };
        b[80] = kind;
        b[88..96].copy_from_slice(&f64::to_le_bytes(fixed));
        b[96..104].copy_from_slice(&f64::to_le_bytes(target));
        b[104..108].copy_from_slice(&self.clean_victim_window.to_le_bytes());
        b[108..112].fill(0);
        b[108] = u8::from(self.partial_write_fill);
        let crc = crc32c::crc32c(&b[..112]);
        b[112..116].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a settings block: `Ok(None)` when there is none (a device formatted before
    /// them), `Err` when one is there but damaged or of an unknown version.
    pub fn decode(b: &[u8]) -> Result<Option<Tuning>, String> {
        let b = &b[..BYTES];
        if &b[0..8] != MAGIC {
            return Ok(None);
        }
        let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let f64at = |o: usize| f64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let version = u32at(8);
        let end = match version {
            1 => V1_BYTES - 4,
            2 => V2_BYTES - 4,
            3 => BYTES - 4,
            v => return Err(format!("settings block version {v} unknown")),
        };
        if u32at(end) != crc32c::crc32c(&b[..end]) {
            return Err("settings block checksum mismatch".into());
        }
        let defaults = EngineConfig::default();
        let (clean_victim_window, partial_write_fill) = if version < 3 {
            (defaults.clean_victim_window, defaults.partial_write_fill)
        } else {
            let fill = match b[108] {
                0 => false,
                1 => true,
                f => {
                    return Err(format!(
                        "settings block holds partial-write fill {f}, neither 0 nor 1"
                    ))
                }
            };
            (u32at(104), fill)
        };
        let (cleaning, cleaning_age, writeback) = if version == 1 {
            (defaults.cleaning, defaults.cleaning_age, None)
        } else {
            let cleaning = match b[68] {
                0 => tiercache_engine::CleaningPolicy::Lba,
                1 => tiercache_engine::CleaningPolicy::Acp,
                2 => tiercache_engine::CleaningPolicy::Alru,
                c => return Err(format!("settings block holds cleaning policy {c}, unknown")),
            };
            let target = f64at(96);
            let rate = match b[80] {
                0 => None,
                1 => Some(tiercache_engine::WritebackRate::Off),
                2 => Some(tiercache_engine::WritebackRate::Auto),
                3 => Some(tiercache_engine::WritebackRate::Fixed(f64at(88))),
                k => {
                    return Err(format!(
                        "settings block holds write-back rate kind {k}, unknown"
                    ))
                }
            };
            if rate.is_some() && !(0.0..=1.0).contains(&target) {
                return Err(format!(
                    "settings block holds writeback-target {target}, not a share"
                ));
            }
            (cleaning, u64at(72), rate.map(|r| (r, target)))
        };
        let t = Tuning {
            cleaning,
            cleaning_age,
            writeback,
            clean_victim_window,
            partial_write_fill,
            group_size: u64at(12),
            admission: Admission {
                read_threshold: u32at(20),
                write_threshold: u32at(24),
            },
            seq_cutoff_read: u64at(28),
            seq_cutoff_write: u64at(36),
            dirty_high: f64at(44),
            dirty_low: f64at(52),
            slru_protected: f64at(60),
        };
        let shares = [t.dirty_high, t.dirty_low, t.slru_protected];
        if shares.iter().any(|x| !(0.0..=1.0).contains(x)) {
            return Err(format!(
                "settings block holds shares out of 0..=1: {shares:?}"
            ));
        }
        Ok(Some(t))
    }
}

/// An on/off setting as `ctl get` shows it.
pub fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn cleaning_code(p: tiercache_engine::CleaningPolicy) -> u8 {
    match p {
        tiercache_engine::CleaningPolicy::Lba => 0,
        tiercache_engine::CleaningPolicy::Acp => 1,
        tiercache_engine::CleaningPolicy::Alru => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_block_round_trips_and_catches_damage() {
        let mut cfg = EngineConfig::default();
        cfg.apply_preset(tiercache_engine::Preset::Database);
        cfg.seq_cutoff.read_bytes = 256 << 10;
        let t = Tuning::of(&cfg);
        let mut b = vec![0u8; BYTES];
        assert_eq!(Tuning::decode(&b).unwrap(), None, "no block: none");
        t.encode_into(&mut b);
        assert_eq!(Tuning::decode(&b).unwrap(), Some(t));
        b[30] ^= 1;
        assert!(Tuning::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn cleaner_settings_round_trip_and_version_1_still_opens() {
        let cfg = EngineConfig {
            cleaning: tiercache_engine::CleaningPolicy::Alru,
            cleaning_age: 777,
            ..Default::default()
        };
        let mut t = Tuning::of(&cfg);
        t.writeback = Some((tiercache_engine::WritebackRate::Fixed(250.0), 0.3));
        let mut b = vec![0u8; BYTES];
        t.encode_into(&mut b);
        assert_eq!(Tuning::decode(&b).unwrap(), Some(t));
        // A version 1 block (as builds before version 2 wrote it): the engine's settings
        // read back, the cleaner's are the defaults.
        let mut v1 = b.clone();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        v1[68..].fill(0);
        let crc = crc32c::crc32c(&v1[..68]);
        v1[68..72].copy_from_slice(&crc.to_le_bytes());
        let got = Tuning::decode(&v1).unwrap().unwrap();
        assert_eq!(got.admission, t.admission);
        assert_eq!(got.cleaning, EngineConfig::default().cleaning);
        assert_eq!(got.writeback, None);
        v1[8] = 9;
        assert!(Tuning::decode(&v1).unwrap_err().contains("version 9"));
    }

    #[test]
    fn eviction_and_fill_settings_round_trip_and_version_2_still_opens() {
        let cfg = EngineConfig {
            clean_victim_window: 8,
            partial_write_fill: false,
            cleaning: tiercache_engine::CleaningPolicy::Acp,
            ..Default::default()
        };
        let mut t = Tuning::of(&cfg);
        t.writeback = Some((tiercache_engine::WritebackRate::Auto, 0.25));
        let mut b = vec![0u8; BYTES];
        t.encode_into(&mut b);
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 3);
        let got = Tuning::decode(&b).unwrap().unwrap();
        assert_eq!(got, t);
        assert_eq!(
            (got.clean_victim_window, got.partial_write_fill),
            (8, false)
        );
        let mut back = EngineConfig::default();
        got.apply(&mut back);
        assert_eq!(
            (back.clean_victim_window, back.partial_write_fill),
            (8, false)
        );
        // The new fields are under the checksum.
        let mut bad = b.clone();
        bad[104] ^= 1;
        assert!(Tuning::decode(&bad).unwrap_err().contains("checksum"));
        let mut bad = b.clone();
        bad[108] = 7;
        let crc = crc32c::crc32c(&bad[..112]);
        bad[112..116].copy_from_slice(&crc.to_le_bytes());
        assert!(Tuning::decode(&bad)
            .unwrap_err()
            .contains("partial-write fill 7"));
        // A version 2 block (as builds before version 3 wrote it): everything it held reads
        // back, the window and the fill are the defaults.
        let mut v2 = b.clone();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        v2[104..].fill(0);
        let crc = crc32c::crc32c(&v2[..104]);
        v2[104..108].copy_from_slice(&crc.to_le_bytes());
        let got = Tuning::decode(&v2).unwrap().unwrap();
        assert_eq!(
            got,
            Tuning {
                clean_victim_window: 0,
                partial_write_fill: true,
                ..t
            }
        );
    }

    #[test]
    fn keys_and_values_parse_as_sim_flags() {
        assert_eq!(key("seq_cutoff").unwrap(), "seq-cutoff");
        assert!(key("cutoff")
            .unwrap_err()
            .contains("known: mode, admission"));
        let t = Tuning::of(&EngineConfig::default());
        let u = t.with("admission", "nhit:2:1").unwrap();
        assert_eq!(u.get("admission").unwrap(), "nhit:2:1");
        let u = u.with("seq-cutoff", "1m").unwrap();
        assert_eq!(u.get("seq-cutoff").unwrap(), "1MiB");
        assert_eq!(
            u.with("seq-cutoff", "0")
                .unwrap()
                .get("seq-cutoff")
                .unwrap(),
            "0"
        );
        assert!(t
            .with("admission", "sometimes")
            .unwrap_err()
            .contains("nhit"));
        assert!(t
            .with("dirty-high", "2")
            .unwrap_err()
            .contains("between 0 and 1"));
        assert!(t.with("policy", "lru").is_err());
        let u = t.with("clean-victim-window", "8").unwrap();
        assert_eq!(u.get("clean-victim-window").unwrap(), "8");
        assert_eq!(u.clean_victim_window, 8);
        assert!(t
            .with("clean-victim-window", "-1")
            .unwrap_err()
            .contains("likely victims"));
        assert_eq!(t.get("partial-fill").unwrap(), "on");
        let u = t.with("partial-fill", "off").unwrap();
        assert!(!u.partial_write_fill);
        assert_eq!(u.get("partial-fill").unwrap(), "off");
        assert!(u.with("partial-fill", "ON").unwrap().partial_write_fill);
        assert!(t
            .with("partial-fill", "maybe")
            .unwrap_err()
            .contains("on or off"));
        assert_eq!(key("partial_fill").unwrap(), "partial-fill");
    }
}
