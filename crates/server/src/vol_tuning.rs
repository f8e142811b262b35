//! Each volume's own settings of a cache serving several (`serve --volume-mode`,
//! `--volume-admission`, `--volume-seq-cutoff`, `ctl --volume NAME set`; issue 15 item 1),
//! stored with the cache so that a restart keeps them, as [`crate::tuning`] stores the pool's.
//!
//! On disk: bytes [`AT`]..[`END`] of the superblock block (its second sector, after the
//! pool's settings block), little endian:
//! ```text
//! 0 magic "TCVOLSET"  8 version u32 (1)  12 count u32
//! 16 + 32*i: id u32 | flags u32 | read_threshold u32 | write_threshold u32
//!            | seq_cutoff_read u64 | seq_cutoff_write u64
//! 16 + 32*count: crc32c u32 (of 0..16+32*count)
//! flags: bit 0 admission set, bit 1 seq cutoff set, bits 8..16 mode (index into Mode::ALL + 1,
//! 0 = not set)
//! ```
//! Version 2 (written only when some volume has occupancy bounds, `--volume-share`, so a
//! cache without them stays readable by builds before it): 40-byte entries, the 32 above then
//! `share_min u32 | share_max u32` (millionths of the pool), flags bit 2 share set.
//! A damaged block (torn rewrite of this sector) is ignored with a warning: every volume then
//! runs with the pool's settings or this run's flags (these shape what is cached, never what a
//! block reads). Builds before this area ignore it.

use tiercache_engine::{Admission, Mode, SeqCutoff, VolumeConfig};

/// Offset of the block inside the superblock block (after `crate::tuning`'s).
pub const AT: usize = 640;
/// End of the block: the volume table starts here.
pub const END: usize = crate::format::VOLUME_TABLE_AT;
const MAGIC: &[u8; 8] = b"TCVOLSET";
const VERSION: u32 = 1;
const VERSION_SHARES: u32 = 2;
const ENTRY: usize = 32;
const ENTRY_V2: usize = 40;
/// Entries the block holds.
pub const MAX_ENTRIES: usize = (END - AT - 16 - 4) / ENTRY;
/// Entries the block holds when some volume has a share (version 2).
pub const MAX_ENTRIES_V2: usize = (END - AT - 16 - 4) / ENTRY_V2;
const _: () = assert!(crate::tuning::AT + crate::tuning::BYTES <= AT);
const _: () = assert!(MAX_ENTRIES >= crate::format::MAX_TABLE_VOLUMES);
const _: () = assert!(MAX_ENTRIES_V2 >= crate::format::MAX_TABLE_VOLUMES);

const HAS_ADMISSION: u32 = 1;
const HAS_CUTOFF: u32 = 2;
const HAS_SHARE: u32 = 4;
/// Shares are stored in millionths of the pool.
const PPM: f64 = 1_000_000.0;

/// A volume's occupancy bounds (`--volume-share NAME=MIN:MAX`), in millionths of the pool,
/// as stored (exact, so settings compare equal after a round trip).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub min_ppm: u32,
    pub max_ppm: u32,
}

impl Share {
    /// From shares of the pool (`0 <= min <= max <= 1`, checked by the parser).
    pub fn of(min: f64, max: f64) -> Share {
        Share {
            min_ppm: (min * PPM).round() as u32,
            max_ppm: (max * PPM).round() as u32,
        }
    }

    /// `(min, max)` as shares of the pool.
    pub fn bounds(&self) -> (f64, f64) {
        (self.min_ppm as f64 / PPM, self.max_ppm as f64 / PPM)
    }

    /// Parses `MIN:MAX` (shares `0.25:0.6` or percents `25%:60%`).
    pub fn parse(v: &str) -> Result<Share, String> {
        let (min, max) = tiercache_engine::policy::VolumeShare::parse_bounds(v)?;
        Ok(Share::of(min, max))
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = |p: u32| {
            let s = format!("{:.4}", p as f64 / 10_000.0);
            let s = s.trim_end_matches('0').trim_end_matches('.').to_string();
            s + "%"
        };
        write!(f, "{}:{}", pct(self.min_ppm), pct(self.max_ppm))
    }
}
const MODE_SHIFT: u32 = 8;

/// One volume's own settings (`None`: the pool's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeTuning {
    pub id: u32,
    pub mode: Option<Mode>,
    pub admission: Option<Admission>,
    pub seq_cutoff: Option<SeqCutoff>,
    /// Occupancy bounds (`--volume-share`, `ctl --volume NAME set share`).
    pub share: Option<Share>,
}

impl VolumeTuning {
    /// The settings volume `v` of the engine's table holds, with occupancy bounds `share`
    /// (the engine keeps those apart, in its policy parameters).
    pub fn of(v: &VolumeConfig, share: Option<Share>) -> VolumeTuning {
        VolumeTuning {
            id: v.id,
            mode: v.mode,
            admission: v.admission,
            seq_cutoff: v.seq_cutoff,
            share,
        }
    }

    /// Nothing of its own.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.admission.is_none()
            && self.seq_cutoff.is_none()
            && self.share.is_none()
    }
}

/// A sequential cutoff of one volume as `--volume-seq-cutoff NAME=READ[:WRITE]` gives it:
/// the read streams' cutoff, and the write streams' (`None`: the pool's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CutoffSpec {
    pub read: u64,
    pub write: Option<u64>,
}

impl CutoffSpec {
    /// `SIZE` (reads; writes keep the pool's cutoff) or `READ:WRITE`, sizes as `--seq-cutoff`
    /// takes them (`0` = off).
    pub fn parse(v: &str) -> Result<CutoffSpec, String> {
        let size =
            |x: &str| tiercache_engine::parse_size(x).map_err(|e| format!("seq cutoff {x:?}: {e}"));
        Ok(match v.split_once(':') {
            Some((r, w)) => CutoffSpec {
                read: size(r)?,
                write: Some(size(w)?),
            },
            None => CutoffSpec {
                read: size(v)?,
                write: None,
            },
        })
    }

    /// The cutoff in force, the pool's being `pool`.
    pub fn resolve(&self, pool: SeqCutoff) -> SeqCutoff {
        SeqCutoff {
            read_bytes: self.read,
            write_bytes: self.write.unwrap_or(pool.write_bytes),
        }
    }
}

/// A volume's own settings given on the command line or in the config file (`serve
/// --volume-admission NAME=RULE`, `--volume-seq-cutoff NAME=SIZE`): they replace the stored
/// ones (and are stored in their place).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeFlags {
    pub name: String,
    pub admission: Option<Admission>,
    pub seq_cutoff: Option<CutoffSpec>,
    pub share: Option<Share>,
}

/// Splits a per-volume flag's `NAME=VALUE` (`flag` names it in the error).
pub fn split_flag<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str), String> {
    s.split_once('=')
        .map(|(n, v)| (n.trim(), v.trim()))
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| format!("{flag} {s:?}: give NAME=VALUE (NAME a volume's)"))
}

/// `--volume-admission NAME=RULE` (always, never, nhit:N, nhit:R:W): (name, rule); the error
/// names the flag, the volume and the value.
pub fn admission_flag(flag: &str, s: &str) -> Result<(String, Admission), String> {
    let (n, v) = split_flag(flag, s)?;
    let a = v
        .parse()
        .map_err(|e: String| format!("{flag} {s}: volume {n}: admission {v:?}: {e}"))?;
    Ok((n.to_string(), a))
}

/// `--volume-seq-cutoff NAME=SIZE` or `NAME=READ:WRITE` ([`CutoffSpec::parse`]).
pub fn cutoff_flag(flag: &str, s: &str) -> Result<(String, CutoffSpec), String> {
    let (n, v) = split_flag(flag, s)?;
    let c = CutoffSpec::parse(v).map_err(|e| format!("{flag} {s}: volume {n}: {e}"))?;
    Ok((n.to_string(), c))
}

/// `--volume-share NAME=MIN:MAX` ([`Share::parse`]).
pub fn share_flag(flag: &str, s: &str) -> Result<(String, Share), String> {
    let (n, v) = split_flag(flag, s)?;
    let c = Share::parse(v).map_err(|e| format!("{flag} {s}: volume {n}: {e}"))?;
    Ok((n.to_string(), c))
}

/// Checks that the volumes' minimum shares add up to at most the whole pool.
pub fn check_shares(v: &[VolumeTuning]) -> Result<(), String> {
    let sum: u64 = v
        .iter()
        .filter_map(|t| t.share)
        .map(|s| u64::from(s.min_ppm))
        .sum();
    if sum > PPM as u64 {
        return Err(format!(
            "the volumes' minimum shares add up to {:.1}%, more than the whole pool",
            sum as f64 / 10_000.0
        ));
    }
    Ok(())
}

/// `table` with volume `t.id`'s entry replaced by `t` (dropped when it holds nothing).
pub fn put(table: &mut Vec<VolumeTuning>, t: VolumeTuning) {
    table.retain(|x| x.id != t.id);
    if !t.is_empty() {
        table.push(t);
        table.sort_by_key(|x| x.id);
    }
}

/// Writes the block into the superblock block `b` (nothing when `v` is empty: the area stays
/// zero, as before this block existed).
pub fn encode_into(v: &[VolumeTuning], b: &mut [u8]) {
    let shares = v.iter().any(|e| e.share.is_some());
    let (version, entry, max) = if shares {
        (VERSION_SHARES, ENTRY_V2, MAX_ENTRIES_V2)
    } else {
        (VERSION, ENTRY, MAX_ENTRIES)
    };
    assert!(
        v.len() <= max,
        "{} volumes' settings: the block holds {max}",
        v.len()
    );
    let t = &mut b[AT..END];
    t.fill(0);
    if v.is_empty() {
        return;
    }
    t[0..8].copy_from_slice(MAGIC);
    t[8..12].copy_from_slice(&version.to_le_bytes());
    t[12..16].copy_from_slice(&(v.len() as u32).to_le_bytes());
    for (i, e) in v.iter().enumerate() {
        let x = &mut t[16 + i * entry..16 + (i + 1) * entry];
        let mode = e.mode.map_or(0, |m| {
            Mode::ALL
                .iter()
                .position(|x| *x == m)
                .expect("a mode of Mode::ALL") as u32
                + 1
        });
        let flags = e.admission.map_or(0, |_| HAS_ADMISSION)
            | e.seq_cutoff.map_or(0, |_| HAS_CUTOFF)
            | e.share.map_or(0, |_| HAS_SHARE)
            | mode << MODE_SHIFT;
        let a = e.admission.unwrap_or_default();
        let c = e.seq_cutoff.unwrap_or_default();
        x[0..4].copy_from_slice(&e.id.to_le_bytes());
        x[4..8].copy_from_slice(&flags.to_le_bytes());
        x[8..12].copy_from_slice(&a.read_threshold.to_le_bytes());
        x[12..16].copy_from_slice(&a.write_threshold.to_le_bytes());
        x[16..24].copy_from_slice(&c.read_bytes.to_le_bytes());
        x[24..32].copy_from_slice(&c.write_bytes.to_le_bytes());
        if let Some(s) = e.share {
            x[32..36].copy_from_slice(&s.min_ppm.to_le_bytes());
            x[36..40].copy_from_slice(&s.max_ppm.to_le_bytes());
        }
    }
    let end = 16 + v.len() * entry;
    let crc = crc32c::crc32c(&t[..end]);
    t[end..end + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the block of the superblock block `b`: empty when there is none, `Err` when one is
/// there but damaged or of an unknown version.
pub fn decode(b: &[u8]) -> Result<Vec<VolumeTuning>, String> {
    let t = &b[AT..END];
    if &t[0..8] != MAGIC {
        return Ok(Vec::new());
    }
    let u32at = |o: usize| u32::from_le_bytes(t[o..o + 4].try_into().unwrap());
    let u64at = |o: usize| u64::from_le_bytes(t[o..o + 8].try_into().unwrap());
    let version = u32at(8);
    let (entry, max, known) = match version {
        VERSION => (ENTRY, MAX_ENTRIES, HAS_ADMISSION | HAS_CUTOFF),
        VERSION_SHARES => (
            ENTRY_V2,
            MAX_ENTRIES_V2,
            HAS_ADMISSION | HAS_CUTOFF | HAS_SHARE,
        ),
        _ => return Err(format!("volume settings block version {version} unknown")),
    };
    let n = u32at(12) as usize;
    if n > max {
        return Err(format!(
            "volume settings block holds {n} entries ({max} fit)"
        ));
    }
    let end = 16 + n * entry;
    if u32at(end) != crc32c::crc32c(&t[..end]) {
        return Err("volume settings block checksum mismatch".into());
    }
    let mut out: Vec<VolumeTuning> = Vec::with_capacity(n);
    for i in 0..n {
        let o = 16 + i * entry;
        let id = u32at(o);
        let flags = u32at(o + 4);
        let mode = (flags >> MODE_SHIFT) & 0xff;
        let share = (flags & HAS_SHARE != 0).then(|| Share {
            min_ppm: u32at(o + 32),
            max_ppm: u32at(o + 36),
        });
        if flags & !(known | 0xff << MODE_SHIFT) != 0
            || share.is_some_and(|s| s.min_ppm > s.max_ppm || s.max_ppm > PPM as u32)
            || mode as usize > Mode::ALL.len()
            || out.iter().any(|x| x.id == id)
        {
            return Err(format!(
                "volume settings block entry {i} (volume id {id}): flags {flags:#x} unknown or id repeated"
            ));
        }
        out.push(VolumeTuning {
            id,
            mode: (mode != 0).then(|| Mode::ALL[mode as usize - 1]),
            admission: (flags & HAS_ADMISSION != 0).then(|| Admission {
                read_threshold: u32at(o + 8),
                write_threshold: u32at(o + 12),
            }),
            seq_cutoff: (flags & HAS_CUTOFF != 0).then(|| SeqCutoff {
                read_bytes: u64at(o + 16),
                write_bytes: u64at(o + 24),
            }),
            share,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_round_trips_and_catches_damage() {
        let mut b = vec![0u8; 4096];
        assert_eq!(decode(&b).unwrap(), Vec::new());
        let v: Vec<VolumeTuning> = (0..MAX_ENTRIES as u32)
            .map(|i| VolumeTuning {
                id: i * 2,
                mode: (i % 2 == 0).then_some(Mode::ALL[i as usize % Mode::ALL.len()]),
                admission: (i % 3 != 0).then_some(Admission {
                    read_threshold: i,
                    write_threshold: i + 1,
                }),
                seq_cutoff: (i % 4 != 1).then_some(SeqCutoff {
                    read_bytes: (i as u64) << 20,
                    write_bytes: 4096 * i as u64,
                }),
                share: None,
            })
            .collect();
        encode_into(&v, &mut b);
        assert_eq!(decode(&b).unwrap(), v);
        assert_eq!(
            b[AT + 8],
            1,
            "no shares: version 1, as builds before them wrote"
        );
        // With shares: version 2, fewer (larger) entries.
        let mut w = v[..MAX_ENTRIES_V2].to_vec();
        w[1].share = Some(Share::parse("25%:0.6").unwrap());
        w[2].share = Some(Share::of(0.0, 1.0));
        let mut b2 = vec![0u8; 4096];
        encode_into(&w, &mut b2);
        assert_eq!(b2[AT + 8], 2);
        assert_eq!(decode(&b2).unwrap(), w);
        assert_eq!(w[1].share.unwrap().to_string(), "25%:60%");
        assert!(b2[..AT].iter().chain(&b2[END..]).all(|x| *x == 0));
        b2[AT + 16 + 40 + 33] ^= 1;
        assert!(decode(&b2).unwrap_err().contains("checksum"));
        // Nothing outside its area is written.
        assert!(b[..AT].iter().chain(&b[END..]).all(|x| *x == 0));
        b[AT + 40] ^= 1;
        assert!(decode(&b).unwrap_err().contains("checksum"));
        // An empty table leaves the area zero: no block.
        encode_into(&[], &mut b);
        assert!(b.iter().all(|x| *x == 0));
    }

    #[test]
    fn flags_parse_and_errors_name_flag_volume_and_value() {
        let (n, a) = admission_flag("--volume-admission", "db=nhit:2").unwrap();
        assert_eq!((n.as_str(), a.read_threshold), ("db", 2));
        let (n, c) = cutoff_flag("--volume-seq-cutoff", "logs=1m").unwrap();
        assert_eq!(n, "logs");
        assert_eq!(
            c.resolve(SeqCutoff {
                read_bytes: 5,
                write_bytes: 7
            }),
            SeqCutoff {
                read_bytes: 1 << 20,
                write_bytes: 7
            }
        );
        let (_, c) = cutoff_flag("--volume-seq-cutoff", "logs=1m:0").unwrap();
        assert_eq!(c.write, Some(0));
        let e = admission_flag("--volume-admission", "db=sometimes").unwrap_err();
        assert!(
            e.contains("--volume-admission") && e.contains("volume db") && e.contains("sometimes"),
            "{e}"
        );
        let e = cutoff_flag("--volume-seq-cutoff", "db=lots").unwrap_err();
        assert!(
            e.contains("--volume-seq-cutoff") && e.contains("volume db") && e.contains("lots"),
            "{e}"
        );
        assert!(split_flag("--volume-admission", "never").is_err());
    }

    #[test]
    fn put_replaces_and_drops_empty_entries() {
        let mut t = Vec::new();
        let a = VolumeTuning {
            id: 3,
            mode: None,
            admission: Some(Admission {
                read_threshold: 0,
                write_threshold: 0,
            }),
            seq_cutoff: None,
            share: None,
        };
        put(&mut t, a);
        put(
            &mut t,
            VolumeTuning {
                id: 1,
                mode: Some(Mode::WriteBack),
                ..a
            },
        );
        assert_eq!(t.iter().map(|x| x.id).collect::<Vec<_>>(), [1, 3]);
        put(
            &mut t,
            VolumeTuning {
                id: 3,
                mode: None,
                admission: None,
                seq_cutoff: None,
                share: None,
            },
        );
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].mode, Some(Mode::WriteBack));
    }
}
