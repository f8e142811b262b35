//! Snapshot restore with content (Nitro's restore experiment): a VM image overwritten a little
//! every day for `snapshots` days; the primary (today) is read once to warm the cache, then
//! snapshots are restored by reading them whole in large requests. Snapshot d lives on volume
//! 1 + d; a line's content is its version as of day d, so old snapshots share less with the
//! primary.

use crate::content::{mix, ContentModel, ContentTrace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::Request;

#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotRestore {
    pub image_bytes: u64,
    pub snapshots: u32,
    /// Share of lines overwritten per day (seed: median 2.3 %).
    pub daily_overwrite: f64,
    pub read_size: u64,
    /// Snapshots to restore, oldest = 0.
    pub restore: Vec<u32>,
    pub line_size: u64,
}

impl Default for SnapshotRestore {
    fn default() -> Self {
        SnapshotRestore {
            image_bytes: 64 << 20,
            snapshots: 100,
            daily_overwrite: 0.023,
            read_size: 512 << 10,
            restore: vec![0, 25, 50, 75, 99],
            line_size: 8192,
        }
    }
}

impl SnapshotRestore {
    /// Parses `snapshot-restore[:key=value,...]` with keys image, snapshots, overwrite (share
    /// per day), read (request size), line. Restores the oldest snapshot, the ones a quarter,
    /// half and three quarters of the way, and the newest.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let rest = spec
            .trim()
            .strip_prefix("snapshot-restore")
            .ok_or_else(|| format!("'{spec}' is not a snapshot-restore spec"))?;
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        let mut s = SnapshotRestore::default();
        const KEYS: &str = "image, snapshots, overwrite, read, line";
        for part in rest.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("'{part}' is not key=value (snapshot-restore keys: {KEYS})")
            })?;
            let v = v.trim();
            let size = |v: &str| super::parse_size(v).map_err(|e| format!("{k}: {e}"));
            match k.trim() {
                "image" => s.image_bytes = size(v)?,
                "snapshots" => {
                    s.snapshots = v.parse().map_err(|_| format!("bad snapshots '{v}'"))?
                }
                "overwrite" => {
                    let x: f64 = v
                        .trim_end_matches('%')
                        .parse()
                        .map_err(|_| format!("bad overwrite '{v}'"))?;
                    s.daily_overwrite = if v.ends_with('%') { x / 100.0 } else { x };
                }
                "read" => s.read_size = size(v)?,
                "line" => s.line_size = size(v)?,
                other => return Err(format!("unknown snapshot-restore key '{other}' ({KEYS})")),
            }
        }
        if s.snapshots == 0 || s.read_size == 0 || !(0.0..=1.0).contains(&s.daily_overwrite) {
            return Err(
                "snapshot-restore needs snapshots >= 1, read > 0, overwrite in 0..=1".into(),
            );
        }
        if !s.line_size.is_power_of_two() || s.image_bytes < s.line_size {
            return Err(
                "snapshot-restore: line must be a power of two and the image hold one".into(),
            );
        }
        let n = s.snapshots - 1;
        s.restore = vec![0, n / 4, n / 2, 3 * n / 4, n];
        s.restore.dedup();
        Ok(s)
    }

    /// The trace, and for each restored snapshot its content overlap with the primary.
    pub fn generate(&self, seed: u64, model: &ContentModel) -> (ContentTrace, Vec<f64>) {
        let ls = self.line_size;
        let lines = self.image_bytes / ls;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // overwrites[b] = days on which line b was overwritten (ascending).
        let mut days: Vec<Vec<u32>> = vec![Vec::new(); lines as usize];
        let per_day = (lines as f64 * self.daily_overwrite).round() as u64;
        for d in 1..self.snapshots {
            for _ in 0..per_day {
                days[rng.gen_range(0..lines) as usize].push(d);
            }
        }
        let version = |b: u64, d: u32| days[b as usize].iter().filter(|&&x| x <= d).count() as u64;
        let fp = |b: u64, v: u64| model.with_fp(mix(seed ^ (b << 20) ^ v ^ 0x5a5a));
        let last = self.snapshots - 1;
        let mut t = ContentTrace::new(format!("snapshot-restore:snapshots={}", self.snapshots), ls);
        let mut buf = Vec::new();
        let mut n = 0u64;
        let mut read_volume = |t: &mut ContentTrace, vol: u32, day: u32| {
            let mut off = 0;
            while off < self.image_bytes {
                let len = self.read_size.min(self.image_bytes - off);
                let mut r = Request::read(off, len);
                r.volume = vol;
                r.time_ns = n * 1_000_000;
                n += 1;
                buf.clear();
                for b in off / ls..(off + len).div_ceil(ls) {
                    buf.push(fp(b, version(b, day)));
                }
                t.push(r, &buf);
                off += len;
            }
        };
        read_volume(&mut t, 0, last);
        let mut overlap = Vec::new();
        for &d in &self.restore {
            let d = d.min(last);
            read_volume(&mut t, 1 + d, d);
            let same = (0..lines)
                .filter(|&b| version(b, d) == version(b, last))
                .count();
            overlap.push(same as f64 / lines as f64);
        }
        (t, overlap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_snapshots_overlap_less() {
        let s = SnapshotRestore {
            image_bytes: 4 << 20,
            restore: vec![0, 50, 99],
            ..Default::default()
        };
        let (t, ov) = s.generate(3, &ContentModel::new(8192, 3));
        assert!(ov[0] < ov[1] && ov[1] < ov[2] && ov[2] == 1.0, "{ov:?}");
        assert!(ov[0] > 0.05 && ov[0] < 0.3, "{ov:?}");
        assert_eq!(t.len(), 4 * 8);
        let p = SnapshotRestore::parse("snapshot-restore:image=8MiB,snapshots=20,overwrite=5%")
            .unwrap();
        assert_eq!(p.restore, vec![0, 4, 9, 14, 19]);
        assert!((p.daily_overwrite - 0.05).abs() < 1e-12);
        assert!(SnapshotRestore::parse("snapshot-restore:days=3").is_err());
    }
}
