//! VM boot storm with content (Nitro's 60-VM experiment): one template boot trace of an image
//! and N-1 clones that read the same places, shifted, with a given content overlap, all
//! booting at once (their requests interleaved round-robin).
//!
//! - Template: reads through the image in 4-64 KiB requests, `random` of them jumping to a
//!   random place (the seed's trace: 99 % reads, 14 % random, 1.2x internal dedup).
//! - Clone v reads template address a at `a + shift_v` (shift_v uniform in 0..max_shift of the
//!   image, line aligned) on its own volume v; each of its lines holds the template's content
//!   with probability `overlap`, else its own.
//! - A write gives the written line new, unique content.

use crate::content::{mix, unit, ContentModel, ContentTrace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::{ExtentContent, Op, Request};

/// Boot-storm parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BootStorm {
    pub vms: u32,
    pub image_bytes: u64,
    pub overlap: f64,
    pub max_shift: f64,
    pub random: f64,
    pub read: f64,
    /// Share of template lines that duplicate another template line (1.2x dedup: 1/6).
    pub internal_dup: f64,
    /// How many times each VM reads through its image.
    pub passes: u32,
    pub line_size: u64,
}

impl Default for BootStorm {
    fn default() -> Self {
        BootStorm {
            vms: 60,
            image_bytes: 18 << 20,
            overlap: 0.9,
            max_shift: 0.15,
            random: 0.14,
            read: 0.99,
            internal_dup: 1.0 / 6.0,
            passes: 2,
            line_size: 8192,
        }
    }
}

impl BootStorm {
    /// Parses `boot-storm[:key=value,...]` with keys vms, image, overlap, shift, random, read,
    /// passes, line.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let s = spec.trim();
        let rest = s
            .strip_prefix("boot-storm")
            .or_else(|| s.strip_prefix("bootstorm"))
            .ok_or_else(|| format!("'{spec}' is not a boot-storm spec"))?;
        let mut b = BootStorm::default();
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        for part in rest.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value (boot-storm keys: vms, image, overlap, shift, random, read, passes, line)"))?;
            let num = |v: &str| {
                v.trim()
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .map_err(|_| format!("bad value for {k}: '{v}'"))
            };
            let pct = |v: &str| -> Result<f64, String> {
                let x = num(v)?;
                Ok(if v.trim().ends_with('%') {
                    x / 100.0
                } else {
                    x
                })
            };
            match k.trim() {
                "vms" => b.vms = num(v)? as u32,
                "image" => b.image_bytes = super::parse_size(v.trim()).map_err(|e| format!("image: {e}"))?,
                "overlap" => b.overlap = pct(v)?,
                "shift" => b.max_shift = pct(v)?,
                "random" => b.random = pct(v)?,
                "read" => b.read = pct(v)?,
                "passes" => b.passes = num(v)? as u32,
                "line" => b.line_size = super::parse_size(v.trim()).map_err(|e| format!("line: {e}"))?,
                other => return Err(format!("unknown boot-storm key '{other}' (vms, image, overlap, shift, random, read, passes, line)")),
            }
        }
        b.validate()?;
        Ok(b)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.vms == 0 || self.passes == 0 {
            return Err("boot-storm needs vms >= 1 and passes >= 1".into());
        }
        if self.image_bytes < 64 * self.line_size || !self.line_size.is_power_of_two() {
            return Err("boot-storm image must hold at least 64 lines (power-of-two line)".into());
        }
        for (n, x) in [
            ("overlap", self.overlap),
            ("shift", self.max_shift),
            ("random", self.random),
            ("read", self.read),
        ] {
            if !(0.0..=1.0).contains(&x) {
                return Err(format!("boot-storm {n} {x} must be in 0..=1"));
            }
        }
        Ok(())
    }

    /// The storm, content included, with compressed lengths from `model` (its duplicate
    /// settings are not used: duplicates come from the template).
    pub fn generate(&self, seed: u64, model: &ContentModel) -> ContentTrace {
        let lines = self.image_bytes / self.line_size;
        let tseed = mix(seed ^ 0x7e57);
        // Content id of template line b.
        let template_fp = |b: u64| {
            let h = mix(tseed ^ b);
            if unit(h) < self.internal_dup {
                mix(tseed ^ 0xdddd ^ (h % (lines / 8).max(1)))
            } else {
                mix(tseed ^ 0x1111 ^ b)
            }
        };
        self.generate_with(seed, &mut |v, b, ver, key| {
            let fp = if ver > 0 {
                mix(tseed ^ 0x3333 ^ key ^ ((ver as u64) << 40))
            } else if v == 0 || unit(mix(tseed ^ ((v as u64) << 40) ^ b)) < self.overlap {
                template_fp(b)
            } else {
                mix(tseed ^ 0x2222 ^ key)
            };
            model.with_fp(fp)
        })
    }

    /// The storm's requests with content from `content(vm, template line, version, key)`:
    /// VM `vm`'s line `key & (1 << 48) - 1` clones template line b; version 0 until the
    /// first write to it (then 1, 2, ...). [`BootStorm::generate`] is this with the seeded
    /// model; real content (`tiercache_sim::realfs`) gives other contents, same requests.
    pub fn generate_with(
        &self,
        seed: u64,
        content: &mut dyn FnMut(u32, u64, u32, u64) -> ExtentContent,
    ) -> ContentTrace {
        let ls = self.line_size;
        let lines = self.image_bytes / ls;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Template request sequence (offsets in the image).
        let mut tmpl: Vec<(Op, u64, u64)> = Vec::new();
        for _ in 0..self.passes {
            let mut pos = 0u64;
            let mut bytes = 0u64;
            while bytes < self.image_bytes {
                let len = ls.max(4096 << rng.gen_range(0..5u32)).min(64 << 10).max(ls);
                if rng.gen_bool(self.random) {
                    pos = rng.gen_range(0..lines) * ls;
                }
                if pos + len > self.image_bytes {
                    pos = 0;
                }
                let op = if rng.gen_bool(self.read) {
                    Op::Read
                } else {
                    Op::Write
                };
                tmpl.push((op, pos, len));
                pos += len;
                bytes += len;
            }
        }
        let shifts: Vec<u64> = (0..self.vms)
            .map(|v| {
                if v == 0 {
                    0
                } else {
                    (rng.gen_range(0.0..=self.max_shift) * lines as f64) as u64
                }
            })
            .collect();
        let mut versions: hashbrown::HashMap<u64, u32> = hashbrown::HashMap::new();
        let mut t = ContentTrace::new(
            format!(
                "boot-storm:vms={},image={},overlap={},shift={}",
                self.vms, self.image_bytes, self.overlap, self.max_shift
            ),
            ls,
        );
        let mut buf = Vec::new();
        let mut n = 0u64;
        for &(op, off, len) in &tmpl {
            for v in 0..self.vms {
                let shift = shifts[v as usize];
                let addr = off + shift * ls;
                let mut r = Request::new(n * 100_000, op, addr, len);
                r.volume = v;
                n += 1;
                buf.clear();
                for line in addr / ls..=(addr + len - 1) / ls {
                    let b = line - shift; // the template line this one clones
                    let key = ((v as u64) << 48) | line;
                    let ver = versions.entry(key).or_insert(0);
                    if op == Op::Write {
                        *ver += 1;
                    }
                    buf.push(content(v, b, *ver, key));
                }
                t.push(r, &buf);
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_content_and_are_seeded() {
        let b = BootStorm::parse("boot-storm:vms=8,image=2MiB,overlap=90%,passes=1").unwrap();
        let m = ContentModel::new(b.line_size, 1);
        let t = b.generate(5, &m);
        assert_eq!(t, b.generate(5, &m));
        let (lines, fps) = t.footprint();
        let dedup = lines as f64 / fps as f64;
        assert!(
            dedup > 4.0,
            "8 clones at 90 % overlap should dedup well: {dedup}"
        );
        let reads = t.requests.iter().filter(|r| r.op == Op::Read).count() as f64;
        assert!(reads / t.len() as f64 > 0.95);
        assert!(BootStorm::parse("boot-storm:vms=0").is_err());
        assert!(BootStorm::parse("boot-storm:colour=red").is_err());
    }
}
