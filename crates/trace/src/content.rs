//! Content for data-reduction simulation: a fingerprint and a compressed length per line,
//! carried beside the requests (the engine's `Request` stays unchanged).
//!
//! - [`ContentModel`]: seeded synthetic content: a share of extents is drawn from a pool of
//!   shared contents (duplicates), the rest is unique; each content compresses by a ratio
//!   drawn from a normal distribution (Nitro: mean 2, variance 0.25). A ratio below 1 means the
//!   extent does not shrink (stored raw).
//! - [`ContentTracker`]: follows writes (a write gives a line new content) and annotates a
//!   request stream with the model.
//! - [`ContentTrace`]: requests with their per-line content, in memory (boot storm, snapshot
//!   restore, FIU traces with MD5s).
//! - Bytes ([`ContentModel::fill`]): the model's content as real line bytes (random bytes as
//!   long as the modelled compressed length, then zeros), so a live log cache can be given the
//!   content a simulation assumes (`tiercache replay --content`). With
//!   [`ContentModel::measured`], the simulated compressed length is that of those bytes
//!   compressed for real ([`stored_len`]), which is what the live cache stores.

use tiercache_engine::{Compression, ExtentContent, Request};

#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform in [0, 1) from a hash.
#[inline]
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// How much better than LZ4 a compressor does: zstd level L is modelled as LZ4's ratio times
/// 1.23 .. 1.47 (L = 1 .. 22), the range the Nitro seed reports for gzip over LZ4.
pub fn ratio_gain(c: Compression) -> f64 {
    match c {
        Compression::None => 1.0,
        Compression::Lz4 => 1.0,
        Compression::Zstd(l) => 1.23 + 0.24 * (l.clamp(1, 22) - 1) as f64 / 21.0,
    }
}

/// Compressed length of a content with fingerprint `fp`: ratio ~ Normal(mean, var) seeded by
/// the fingerprint (equal content, equal length).
pub fn compressed_len(fp: u64, line: u64, mean: f64, var: f64, gain: f64) -> u32 {
    // Box-Muller from two hashes of the fingerprint.
    let u1 = unit(mix(fp ^ 0x5151_5151)).max(1e-12);
    let u2 = unit(mix(fp ^ 0xa3a3_a3a3));
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    let ratio = (mean + var.sqrt() * z) * gain;
    if ratio <= 1.0 {
        return line as u32; // does not shrink
    }
    ((line as f64 / ratio).ceil() as u32).max(1)
}

/// Seeded synthetic content.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ContentModel {
    pub line_size: u64,
    /// Share of (line, version) contents drawn from the shared pool.
    pub dup_share: f64,
    /// Distinct shared contents.
    pub dup_pool: u64,
    pub comp_mean: f64,
    pub comp_var: f64,
    pub compression: Compression,
    pub seed: u64,
    /// Compressed lengths measured on the content's bytes ([`ContentModel::fill`]) with the
    /// real compressor, instead of drawn from the ratio distribution: what a live log cache
    /// given these bytes stores, so a simulation can match it byte for byte.
    pub measured: bool,
}

impl ContentModel {
    /// Nitro's defaults: 30 % duplicates from a pool of 4096 contents, compression ratio
    /// Normal(2, 0.25), LZ4.
    pub fn new(line_size: u64, seed: u64) -> Self {
        ContentModel {
            line_size,
            dup_share: 0.3,
            dup_pool: 4096,
            comp_mean: 2.0,
            comp_var: 0.25,
            compression: Compression::Lz4,
            seed,
            measured: false,
        }
    }

    /// The content of version `version` of line `key`.
    pub fn content(&self, key: u64, version: u32) -> ExtentContent {
        let h = mix(
            self.seed ^ mix(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((version as u64) << 40))
        );
        let fp = if unit(h) < self.dup_share && self.dup_pool > 0 {
            mix((mix(h) % self.dup_pool) ^ self.seed.rotate_left(17) ^ 0xd0d0)
        } else {
            h
        };
        self.with_fp(fp)
    }

    /// Compressed length for a given fingerprint under this model.
    pub fn with_fp(&self, fp: u64) -> ExtentContent {
        let compressed_len = if self.measured {
            let mut b = vec![0u8; self.line_size as usize];
            self.fill(fp, &mut b);
            stored_len(&b, self.compression)
        } else {
            self.modelled_len(fp)
        };
        ExtentContent { fp, compressed_len }
    }

    /// The compressed length the ratio distribution gives content `fp`.
    fn modelled_len(&self, fp: u64) -> u32 {
        compressed_len(
            fp,
            self.line_size,
            self.comp_mean,
            self.comp_var,
            ratio_gain(self.compression),
        )
    }

    /// The bytes of content `fp` (`out` is one line): pseudo-random bytes seeded by `fp`, as
    /// many as its modelled LZ4 length (at least 16, the first 8 being `fp` itself, so
    /// distinct contents have distinct bytes), then zeros. Equal fingerprints, equal bytes,
    /// whatever the compressor.
    pub fn fill(&self, fp: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len() as u64, self.line_size, "one line");
        let lz4 = compressed_len(fp, self.line_size, self.comp_mean, self.comp_var, 1.0);
        let k = (lz4 as usize).clamp(16, out.len());
        out[..8].copy_from_slice(&fp.to_le_bytes());
        let mut x = fp;
        for chunk in out[8..k].chunks_mut(8) {
            x = mix(x ^ 0x6a09_e667_f3bc_c908);
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        out[k..].fill(0);
    }
}

/// The bytes a log cache stores for `line` under `compression`: its compressed length when
/// that is shorter than the line, else the line's length (stored raw). The same compressors
/// and rule as the live log layout (`tiercache-server`'s `reduce.rs`).
pub fn stored_len(line: &[u8], compression: Compression) -> u32 {
    let k = match compression {
        Compression::None => line.len(),
        Compression::Lz4 => lz4_flex::block::compress(line).len(),
        Compression::Zstd(level) => zstd::bulk::compress(line, level)
            .map(|v| v.len())
            .unwrap_or(line.len()),
    };
    k.min(line.len()) as u32
}

/// Follows writes and annotates requests with a [`ContentModel`].
pub struct ContentTracker {
    pub model: ContentModel,
    versions: hashbrown::HashMap<u64, u32>,
}

impl ContentTracker {
    pub fn new(model: ContentModel) -> Self {
        ContentTracker {
            model,
            versions: hashbrown::HashMap::new(),
        }
    }

    /// Appends the content of every line `req` touches to `out` (a write first gives each
    /// line new content).
    pub fn annotate(&mut self, req: &Request, out: &mut Vec<ExtentContent>) {
        use tiercache_engine::Op;
        if !matches!(req.op, Op::Read | Op::Write) || req.len == 0 {
            return;
        }
        let sh = self.model.line_size.trailing_zeros();
        for line in req.offset >> sh..=(req.end() - 1) >> sh {
            let key = ((req.volume as u64) << 48) | line;
            let v = self.versions.entry(key).or_insert(0);
            if req.op == Op::Write {
                *v += 1;
            }
            out.push(self.model.content(key, *v));
        }
    }
}

/// Requests with per-line content, in memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContentTrace {
    pub name: String,
    pub line_size: u64,
    pub requests: Vec<Request>,
    content: Vec<ExtentContent>,
    /// `starts[i]..starts[i + 1]` is request i's content.
    starts: Vec<u32>,
}

impl ContentTrace {
    pub fn new(name: impl Into<String>, line_size: u64) -> Self {
        ContentTrace {
            name: name.into(),
            line_size,
            requests: Vec::new(),
            content: Vec::new(),
            starts: vec![0],
        }
    }

    /// Adds a request and its lines' content (one per line touched, or none).
    pub fn push(&mut self, req: Request, content: &[ExtentContent]) {
        self.requests.push(req);
        self.content.extend_from_slice(content);
        self.starts.push(self.content.len() as u32);
    }

    /// Annotates requests with a content model.
    pub fn from_model(
        name: impl Into<String>,
        reqs: impl IntoIterator<Item = Request>,
        model: ContentModel,
    ) -> Self {
        let mut t = ContentTrace::new(name, model.line_size);
        let mut tr = ContentTracker::new(model);
        let mut buf = Vec::new();
        for r in reqs {
            buf.clear();
            tr.annotate(&r, &mut buf);
            t.push(r, &buf);
        }
        t
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Request i's content.
    pub fn content(&self, i: usize) -> &[ExtentContent] {
        &self.content[self.starts[i] as usize..self.starts[i + 1] as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Request, &[ExtentContent])> {
        self.requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r, self.content(i)))
    }

    /// Distinct lines and distinct contents the trace touches.
    pub fn footprint(&self) -> (u64, u64) {
        let sh = self.line_size.trailing_zeros();
        let mut lines = hashbrown::HashSet::new();
        let mut fps = hashbrown::HashSet::new();
        for (r, c) in self.iter() {
            if r.len > 0
                && matches!(
                    r.op,
                    tiercache_engine::Op::Read | tiercache_engine::Op::Write
                )
            {
                for l in r.offset >> sh..=(r.end() - 1) >> sh {
                    lines.insert(((r.volume as u64) << 48) | l);
                }
            }
            for x in c {
                fps.insert(x.fp);
            }
        }
        (lines.len() as u64, fps.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_seeded_and_matches_its_parameters() {
        let m = ContentModel::new(8192, 7);
        let n = 50_000u64;
        let cs: Vec<_> = (0..n).map(|k| m.content(k, 0)).collect();
        assert_eq!(cs, (0..n).map(|k| m.content(k, 0)).collect::<Vec<_>>());
        let distinct: hashbrown::HashSet<u64> = cs.iter().map(|c| c.fp).collect();
        // ~30 % of extents share 4096 contents.
        let dup = 1.0 - (distinct.len() as f64 - 4096.0) / n as f64;
        assert!((dup - 0.3).abs() < 0.02, "dup share {dup}");
        let mean_ratio: f64 = cs
            .iter()
            .map(|c| 8192.0 / c.compressed_len as f64)
            .sum::<f64>()
            / n as f64;
        assert!((mean_ratio - 2.0).abs() < 0.05, "mean ratio {mean_ratio}");
        assert!(cs.iter().all(|c| c.compressed_len as u64 <= 8192));
        // A new version is new content; zstd compresses better than lz4.
        assert_ne!(m.content(1, 0).fp, m.content(1, 1).fp);
        let z = ContentModel {
            compression: Compression::Zstd(19),
            ..m
        };
        assert!(z.content(3, 0).compressed_len <= m.content(3, 0).compressed_len);
    }

    #[test]
    fn tracker_gives_writes_new_content() {
        let mut t = ContentTracker::new(ContentModel {
            dup_share: 0.0,
            ..ContentModel::new(4096, 1)
        });
        let mut a = Vec::new();
        t.annotate(&Request::read(0, 8192), &mut a);
        t.annotate(&Request::read(0, 4096), &mut a);
        t.annotate(&Request::write(0, 4096), &mut a);
        assert_eq!(a.len(), 4);
        assert_eq!(a[0], a[2]);
        assert_ne!(a[0], a[3]);
    }

    #[test]
    fn bytes_follow_the_content_and_measured_lengths_are_real() {
        let m = ContentModel::new(4096, 3);
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        m.fill(11, &mut a);
        m.fill(11, &mut b);
        assert_eq!(a, b, "equal content, equal bytes");
        m.fill(12, &mut b);
        assert_ne!(a, b, "distinct content, distinct bytes");
        let measured = ContentModel {
            measured: true,
            ..m
        };
        for fp in 0..200u64 {
            m.fill(fp, &mut a);
            let real = stored_len(&a, Compression::Lz4);
            assert_eq!(measured.with_fp(fp).compressed_len, real);
            // The bytes compress about as the model says (random prefix, zero tail).
            let modelled = m.with_fp(fp).compressed_len as i64;
            assert!(
                (real as i64 - modelled).abs() <= 64 || real == 4096,
                "fp {fp}: lz4 {real}, modelled {modelled}"
            );
        }
    }
}
