//! Data reduction of one cache line, as the log layout stores it: a BLAKE3 fingerprint of the
//! raw bytes (for deduplication) and the line compressed with lz4 or zstd, kept only when it
//! shrinks (otherwise the extent is stored raw).
//!
//! One [`Reducer`] per thread: it keeps the zstd contexts and scratch buffers, so reducing a
//! line allocates nothing once warm.

use std::io;
use tiercache_engine::log::{Compression, ExtentContent};

/// A BLAKE3-256 digest.
pub type Hash = [u8; 32];

/// What reducing one line produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduced {
    /// BLAKE3 of the raw line.
    pub hash: Hash,
    /// Stored length: the compressed length when compressed, else the line length.
    pub stored_len: u32,
    /// Whether the stored bytes are compressed (false: raw).
    pub compressed: bool,
}

impl Reduced {
    /// The engine's view: a 64-bit fingerprint (the digest's first 8 bytes) and the stored
    /// length (equal to the line size when raw, which the engine reads as "does not shrink").
    pub fn content(&self) -> ExtentContent {
        ExtentContent {
            fp: fingerprint64(&self.hash),
            compressed_len: self.stored_len,
        }
    }
}

/// The engine's 64-bit fingerprint of a digest. Equal 64-bit fingerprints are only a hint:
/// the log volume compares the whole digest before it shares an extent.
pub fn fingerprint64(h: &Hash) -> u64 {
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}

/// Hashes and compresses lines.
pub struct Reducer {
    compression: Compression,
    zc: Option<zstd::bulk::Compressor<'static>>,
    zd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Reducer {
    pub fn new(compression: Compression) -> io::Result<Self> {
        let (zc, zd) = match compression {
            Compression::Zstd(level) => (
                Some(zstd::bulk::Compressor::new(level)?),
                Some(zstd::bulk::Decompressor::new()?),
            ),
            _ => (None, None),
        };
        Ok(Reducer {
            compression,
            zc,
            zd,
        })
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// BLAKE3 of `data`.
    pub fn hash(data: &[u8]) -> Hash {
        *blake3::hash(data).as_bytes()
    }

    /// Hashes `line` and compresses it into `out` (cleared first). When the result is
    /// compressed, `out` holds the stored bytes; when it is raw, `out` is left empty and the
    /// stored bytes are `line` itself.
    pub fn reduce(&mut self, line: &[u8], out: &mut Vec<u8>) -> io::Result<Reduced> {
        let hash = Self::hash(line);
        out.clear();
        let n = line.len();
        let compressed_len = match self.compression {
            Compression::None => None,
            Compression::Lz4 => {
                out.resize(lz4_flex::block::get_maximum_output_size(n), 0);
                let k = lz4_flex::block::compress_into(line, out).map_err(io::Error::other)?;
                Some(k)
            }
            Compression::Zstd(_) => {
                let zc = self.zc.as_mut().expect("zstd compressor");
                out.resize(zstd::zstd_safe::compress_bound(n), 0);
                let k = zc.compress_to_buffer(line, &mut out[..])?;
                Some(k)
            }
        };
        match compressed_len {
            Some(k) if k < n => {
                out.truncate(k);
                Ok(Reduced {
                    hash,
                    stored_len: k as u32,
                    compressed: true,
                })
            }
            _ => {
                out.clear();
                Ok(Reduced {
                    hash,
                    stored_len: n as u32,
                    compressed: false,
                })
            }
        }
    }

    /// Restores a line from its stored bytes. `out.len()` is the line size; a stored extent
    /// that does not decompress to exactly that many bytes is an error (corruption).
    pub fn expand(&mut self, stored: &[u8], compressed: bool, out: &mut [u8]) -> io::Result<()> {
        if !compressed {
            if stored.len() != out.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "raw extent of {} bytes for a line of {}",
                        stored.len(),
                        out.len()
                    ),
                ));
            }
            out.copy_from_slice(stored);
            return Ok(());
        }
        let k = match self.compression {
            Compression::Lz4 | Compression::None => lz4_flex::block::decompress_into(stored, out)
                .map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("lz4 extent: {e}"))
            })?,
            Compression::Zstd(_) => {
                let zd = self.zd.as_mut().expect("zstd decompressor");
                zd.decompress_to_buffer(stored, out).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("zstd extent: {e}"))
                })?
            }
        };
        if k != out.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "compressed extent expanded to {k} bytes, not the line's {}",
                    out.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn lines() -> Vec<Vec<u8>> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let random: Vec<u8> = (0..4096).map(|_| r.gen()).collect();
        let text: Vec<u8> = b"tiercache log layout extent "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let mut half = random.clone();
        half[2048..].fill(0);
        vec![vec![0u8; 4096], random, text, half]
    }

    #[test]
    fn every_compressor_round_trips_and_keeps_only_what_shrinks() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd(3)] {
            let mut r = Reducer::new(c).unwrap();
            let mut out = Vec::new();
            for (i, l) in lines().iter().enumerate() {
                let red = r.reduce(l, &mut out).unwrap();
                assert_eq!(red.hash, *blake3::hash(l).as_bytes());
                let stored: &[u8] = if red.compressed { &out } else { l };
                assert_eq!(stored.len(), red.stored_len as usize);
                match (c, i) {
                    (Compression::None, _) | (_, 1) => assert!(!red.compressed, "{c} line {i}"),
                    // Half random, half zero: a little more than half.
                    (_, 3) => assert!(red.stored_len < 4096 * 3 / 5, "{c}: {}", red.stored_len),
                    _ => assert!(
                        red.stored_len < 4096 / 8,
                        "{c} line {i}: {}",
                        red.stored_len
                    ),
                }
                let mut back = vec![0xa5u8; l.len()];
                r.expand(stored, red.compressed, &mut back).unwrap();
                assert_eq!(&back, l, "{c} line {i}");
                let content = red.content();
                assert_eq!(content.compressed_len, red.stored_len);
            }
        }
    }

    #[test]
    fn corrupt_or_short_extents_are_errors_not_garbage() {
        let mut r = Reducer::new(Compression::Lz4).unwrap();
        let mut out = Vec::new();
        let l = &lines()[2];
        let red = r.reduce(l, &mut out).unwrap();
        assert!(red.compressed);
        let mut back = vec![0u8; 4096];
        assert!(r.expand(&out[..out.len() / 2], true, &mut back).is_err());
        let mut short = vec![0u8; 2048];
        assert!(r.expand(&out, true, &mut short).is_err());
        assert!(r.expand(&l[..100], false, &mut back).is_err());
    }

    #[test]
    fn equal_content_equal_fingerprint_different_content_different() {
        let ls = lines();
        let a = Reducer::hash(&ls[1]);
        let b = Reducer::hash(&ls[1].clone());
        let c = Reducer::hash(&ls[3]);
        assert_eq!(fingerprint64(&a), fingerprint64(&b));
        assert_ne!(fingerprint64(&a), fingerprint64(&c));
    }
}
