//! Real content for data-reduction runs: the files of a real directory tree (e.g. this
//! system's `/usr/lib`) laid out as a VM-like disk image, each line's fingerprint the BLAKE3
//! hash of its bytes and its compressed length that of those bytes compressed for real.
//!
//! - Layout ([`RealTree::scan`]): regular files in path order (byte-wise sorted, symlinks not
//!   followed), each starting on a 4 KiB boundary and its last block padded with zeros, as a
//!   freshly filled ext4 image places them; up to `max_bytes`. Empty files take no space.
//! - Images of clones ([`RealTree::vm_line`]): VM 0 is lines `0..image` of the tree; VM v
//!   shares each file with VM 0 unless the file is "updated" in it (probability
//!   `1 - overlap`, drawn per VM and file): its lines then hold the real bytes the tree
//!   has `image` lines further on (another part of the tree, not a synthetic block).
//! - Rewrites ([`RealTree::rewrite`]): version k of a line is another real line of the tree,
//!   so written content has real compressibility and dedups only as the tree's lines do.
//!
//! Reproducible per tree: [`RealTree::digest`] hashes the file list and every line's
//! fingerprint, so two runs (or two machines) with the same digest saw the same bytes.

use anyhow::Result;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use tiercache_engine::{Compression, ExtentContent, Op, Request};
use tiercache_trace::content::{mix, stored_len, unit, ContentTrace};
use tiercache_trace::workload::bootstorm::BootStorm;

/// Files start on this boundary (a file system block).
const FS_BLOCK: u64 = 4096;

/// Every `SAMPLE_EVERY`-th line of the image is kept (bytes) for timing decompression, at
/// most `SAMPLE_MAX` lines.
const SAMPLE_EVERY: usize = 64;
const SAMPLE_MAX: usize = 4096;

/// The bytes a cache compressing `line` with gzip (flate2, its default level 6, gzip
/// framing: 18 bytes of header and trailer per line) stores: as [`stored_len`], the
/// compressed length when it is shorter than the line, else the line's length.
pub fn gzip_stored_len(line: &[u8]) -> u32 {
    (gzip(line).len().min(line.len())) as u32
}

fn gzip(line: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(line.len() / 2),
        flate2::Compression::default(),
    );
    e.write_all(line).expect("writes to a Vec do not fail");
    e.finish().expect("writes to a Vec do not fail")
}

/// Decompression time of the same lines with lz4 and gzip, measured on this machine.
#[derive(Clone, Copy, Debug)]
pub struct DecompressTimes {
    /// Lines decompressed (each with both).
    pub lines: usize,
    /// Seconds to decompress all of them, the best of 3 passes.
    pub lz4_s: f64,
    pub gzip_s: f64,
}

/// Compresses each `line_size` line of `sample` with lz4 and with gzip (as
/// [`stored_len`] and [`gzip_stored_len`] do), then times decompressing every line with
/// each (one thread, best of 3 passes; every output is checked against the line).
pub fn decompress_times(sample: &[u8], line_size: usize) -> DecompressTimes {
    use std::io::Read;
    let lines: Vec<&[u8]> = sample.chunks(line_size).collect();
    let lz: Vec<Vec<u8>> = lines.iter().map(|l| lz4_flex::block::compress(l)).collect();
    let gz: Vec<Vec<u8>> = lines.iter().map(|l| gzip(l)).collect();
    let mut out = vec![0u8; line_size];
    let (mut lz4_s, mut gzip_s) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        let t = std::time::Instant::now();
        for (c, l) in lz.iter().zip(&lines) {
            let n = lz4_flex::block::decompress_into(c, &mut out).expect("our own lz4 block");
            assert_eq!(&out[..n], *l, "lz4 round trip");
        }
        lz4_s = lz4_s.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        for (c, l) in gz.iter().zip(&lines) {
            let mut d = flate2::read::GzDecoder::new(&c[..]);
            let mut n = 0;
            loop {
                let k = d.read(&mut out[n..]).expect("our own gzip member");
                if k == 0 {
                    break;
                }
                n += k;
            }
            assert_eq!(&out[..n], *l, "gzip round trip");
        }
        gzip_s = gzip_s.min(t.elapsed().as_secs_f64());
    }
    DecompressTimes {
        lines: lines.len(),
        lz4_s,
        gzip_s,
    }
}

/// A real file tree as an image of lines.
#[derive(Clone, Debug)]
pub struct RealTree {
    pub root: PathBuf,
    pub line_size: u64,
    pub compression: Compression,
    /// Files laid out, in order.
    pub files: u64,
    /// Content of every line of the image.
    pub lines: Vec<ExtentContent>,
    /// Each line's stored length under gzip ([`gzip_stored_len`]; `lines` hold
    /// `compression`'s), same order.
    pub gzip_len: Vec<u32>,
    /// Every 64th line's bytes (at most 4096 lines), for [`decompress_times`].
    pub sample: Vec<u8>,
    /// File number of each line (a line two files share: the first one's).
    line_file: Vec<u32>,
    /// BLAKE3 over the file list (relative paths, sizes) and every line's fingerprint.
    pub digest: String,
}

/// Regular files under `dir` in path order (symlinks not followed; unreadable entries
/// skipped).
fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>, limit: u64, total: &mut u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if *total >= limit {
            return;
        }
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() {
            walk(&p, out, limit, total);
        } else if ft.is_file() {
            let Ok(m) = e.metadata() else { continue };
            if m.len() > 0 {
                *total += m.len().div_ceil(FS_BLOCK) * FS_BLOCK;
                out.push((p, m.len()));
            }
        }
    }
}

impl RealTree {
    /// Lays out the files under `root` (at most `max_bytes` of image) and computes every
    /// line's content. Fails when the tree holds less than `min_bytes`.
    pub fn scan(
        root: &Path,
        max_bytes: u64,
        min_bytes: u64,
        line_size: u64,
        compression: Compression,
    ) -> Result<Self> {
        anyhow::ensure!(
            line_size.is_power_of_two() && line_size >= FS_BLOCK,
            "real content needs a power-of-two line of at least 4 KiB, not {line_size}"
        );
        let mut files = Vec::new();
        let mut total = 0;
        walk(root, &mut files, max_bytes, &mut total);
        anyhow::ensure!(
            total >= min_bytes,
            "{} holds {total} bytes of regular files, fewer than the {min_bytes} the run needs",
            root.display()
        );
        // The image is hashed in chunks as it is read (memory stays at one chunk).
        const CHUNK: usize = 64 << 20;
        let hash = |b: &[u8]| -> Vec<(ExtentContent, u32)> {
            b.par_chunks(line_size as usize)
                .map(|b| {
                    let h = blake3::hash(b);
                    let c = ExtentContent {
                        fp: u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")),
                        compressed_len: stored_len(b, compression),
                    };
                    (c, gzip_stored_len(b))
                })
                .collect()
        };
        let mut lines: Vec<ExtentContent> = Vec::new();
        let mut gzip_len: Vec<u32> = Vec::new();
        let mut sample: Vec<u8> = Vec::new();
        // Hashes whole lines of `b` (the image from line `first`), keeping the sample's.
        let mut take = |b: &[u8], lines: &mut Vec<ExtentContent>| {
            let first = lines.len();
            for (c, g) in hash(b) {
                lines.push(c);
                gzip_len.push(g);
            }
            for (i, l) in b.chunks(line_size as usize).enumerate() {
                if (first + i).is_multiple_of(SAMPLE_EVERY) && sample.len() < SAMPLE_MAX * l.len() {
                    sample.extend_from_slice(l);
                }
            }
        };
        // Bytes of the image before `image` (hashed already; a multiple of the line).
        let mut done = 0u64;
        let mut image: Vec<u8> = Vec::with_capacity(CHUNK + line_size as usize);
        let mut line_file: Vec<u32> = Vec::new();
        let mut list = blake3::Hasher::new();
        let mut used = 0u64;
        for (i, (p, _)) in files.iter().enumerate() {
            // A file that cannot be read (permissions, vanished) is left out, not zeros.
            let Ok(bytes) = std::fs::read(p) else {
                continue;
            };
            if bytes.is_empty() {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap_or(p);
            list.update(rel.to_string_lossy().as_bytes());
            list.update(&(bytes.len() as u64).to_le_bytes());
            let start = done + image.len() as u64;
            let keep = (max_bytes - start.min(max_bytes)) as usize;
            image.extend_from_slice(&bytes[..bytes.len().min(keep)]);
            let padded = (done + image.len() as u64).div_ceil(FS_BLOCK) * FS_BLOCK;
            image.resize((padded - done) as usize, 0);
            let (a, b) = (start / line_size, padded.div_ceil(line_size));
            // Lines the file starts in belong to it unless an earlier file started them.
            debug_assert!(a <= line_file.len() as u64);
            line_file.resize(line_file.len().max(b as usize), i as u32);
            used += 1;
            if image.len() >= CHUNK {
                let whole = image.len() / line_size as usize * line_size as usize;
                take(&image[..whole], &mut lines);
                image.drain(..whole);
                done += whole as u64;
            }
            if padded >= max_bytes {
                break;
            }
        }
        let n = (image.len() as u64).div_ceil(line_size) as usize;
        image.resize(n * line_size as usize, 0);
        take(&image, &mut lines);
        line_file.truncate(lines.len());
        for c in &lines {
            list.update(&c.fp.to_le_bytes());
        }
        let digest = list.finalize().to_hex()[..16].to_string();
        Ok(RealTree {
            root: root.to_path_buf(),
            line_size,
            compression,
            files: used,
            lines,
            gzip_len,
            sample,
            line_file,
            digest,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.lines.len() as u64 * self.line_size
    }

    /// Distinct fingerprints over lines (the tree's own dedup ratio) and its mean compression
    /// ratio (line bytes over stored bytes).
    pub fn ratios(&self) -> (f64, f64) {
        let distinct: hashbrown::HashSet<u64> = self.lines.iter().map(|c| c.fp).collect();
        let stored: u64 = self.lines.iter().map(|c| c.compressed_len as u64).sum();
        (
            self.lines.len() as f64 / distinct.len().max(1) as f64,
            self.bytes() as f64 / stored.max(1) as f64,
        )
    }

    /// Bytes stored over all lines with the scan's compression (`lines`) and with gzip
    /// (`gzip_len`): the same lines, each capped at the line as a cache stores it.
    pub fn stored_bytes(&self) -> (u64, u64) {
        (
            self.lines.iter().map(|c| c.compressed_len as u64).sum(),
            self.gzip_len.iter().map(|&g| g as u64).sum(),
        )
    }

    /// The same tree with gzip's stored lengths in place of the scan's (fingerprints,
    /// layout and clones unchanged): traces built from it differ only in how much each
    /// line takes when compressed.
    pub fn with_gzip_lengths(&self) -> RealTree {
        let mut t = self.clone();
        for (c, &g) in t.lines.iter_mut().zip(&self.gzip_len) {
            c.compressed_len = g;
        }
        t
    }

    /// Line `line` of VM `vm`'s image of `image` lines (see the module docs): VM 0's lines
    /// are the tree's; another VM's file is updated with probability `1 - overlap`.
    pub fn vm_line(
        &self,
        vm: u32,
        line: u64,
        image: u64,
        overlap: f64,
        seed: u64,
    ) -> ExtentContent {
        let n = self.lines.len() as u64;
        let l = line % n;
        if vm == 0 {
            return self.lines[l as usize];
        }
        let f = self.line_file[l as usize] as u64;
        let h = mix(seed ^ mix(((vm as u64) << 32) ^ f ^ 0x7e57_1ead));
        if unit(h) < overlap {
            self.lines[l as usize]
        } else {
            self.lines[((l + image) % n) as usize]
        }
    }

    /// Version `version` (>= 1) of a line whose first content is tree line `base`: a real
    /// line of the tree `version * stride` lines further on.
    pub fn rewrite(&self, base: u64, version: u32, stride: u64) -> ExtentContent {
        let n = self.lines.len() as u64;
        self.lines[((base + version as u64 * stride.max(1)) % n) as usize]
    }
}

/// A boot storm whose VM images are `tree`'s real bytes: VM 0's image is the tree's first
/// lines, each clone shares each file with it with probability `overlap` (else the file is
/// updated, see [`RealTree::vm_line`]); a write gives the line another real line of the tree.
/// The requests are [`BootStorm::generate`]'s (same seed, same addresses).
pub fn boot_storm_trace(storm: &BootStorm, tree: &RealTree, seed: u64) -> ContentTrace {
    assert_eq!(storm.line_size, tree.line_size, "one line size");
    let image = storm.image_bytes / storm.line_size;
    let mut t = storm.generate_with(seed, &mut |v, b, ver, _| {
        if ver == 0 {
            tree.vm_line(v, b, image, storm.overlap, seed)
        } else {
            tree.rewrite(2 * image + b + v as u64 * 7919, ver, image)
        }
    });
    t.name = format!("{} on {}", t.name, tree.root.display());
    t
}

/// Tree lines [`dense_trace`] uses for `reqs`: the footprint (lines first touched) and the
/// line versions writes create.
pub fn dense_need(reqs: &[Request], line_size: u64) -> (u64, u64) {
    let sh = line_size.trailing_zeros();
    let mut seen = hashbrown::HashSet::new();
    let mut written = 0;
    for r in reqs
        .iter()
        .filter(|r| matches!(r.op, Op::Read | Op::Write) && r.len > 0)
    {
        for l in r.offset >> sh..=(r.end() - 1) >> sh {
            seen.insert(((r.volume as u64) << 48) | l);
            written += (r.op == Op::Write) as u64;
        }
    }
    (seen.len() as u64, written)
}

/// `reqs` (a real trace's addresses) with `tree`'s real content: distinct lines, numbered in
/// the order they are first touched, hold the tree's lines in that order (a sequential run
/// of new lines reads consecutive bytes of the tree); each write gives its line the next
/// unused tree line after the footprint's (fresh real bytes; when the tree is too short
/// for every write, that region wraps around, and [`dense_need`] says how much is needed).
pub fn dense_trace(name: impl Into<String>, reqs: Vec<Request>, tree: &RealTree) -> ContentTrace {
    let sh = tree.line_size.trailing_zeros();
    let lines_of = |r: &Request| {
        let ok = matches!(r.op, Op::Read | Op::Write) && r.len > 0;
        let (a, b) = if ok {
            (r.offset >> sh, ((r.end() - 1) >> sh) + 1)
        } else {
            (0, 0)
        };
        let v = (r.volume as u64) << 48;
        (a..b).map(move |l| v | l)
    };
    let mut first: hashbrown::HashMap<u64, (u64, u32)> = hashbrown::HashMap::new();
    for r in &reqs {
        for key in lines_of(r) {
            let n = first.len() as u64;
            first.entry(key).or_insert((n, 0));
        }
    }
    let footprint = first.len() as u64;
    let n = tree.lines.len() as u64;
    // Rewrites take lines [footprint, n) in turn (the whole tree if it is no longer).
    let (wbase, wlen) = if n > footprint {
        (footprint, n - footprint)
    } else {
        (0, n)
    };
    let mut w = 0u64;
    let mut last: hashbrown::HashMap<u64, ExtentContent> = hashbrown::HashMap::new();
    let mut t = ContentTrace::new(name, tree.line_size);
    let mut buf = Vec::new();
    for r in reqs {
        buf.clear();
        for key in lines_of(&r) {
            let e = first.get_mut(&key).expect("counted");
            if r.op == Op::Write {
                e.1 += 1;
            }
            buf.push(if r.op == Op::Write {
                w += 1;
                tree.lines[(wbase + (w - 1) % wlen) as usize]
            } else if e.1 == 0 {
                tree.lines[(e.0 % n) as usize]
            } else {
                // A read of a written line: its latest version, remembered below.
                *last.get(&key).expect("written")
            });
            if r.op == Op::Write {
                last.insert(key, *buf.last().expect("pushed"));
            }
        }
        t.push(r, &buf);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path) {
        std::fs::create_dir_all(dir.join("b")).unwrap();
        // a: 3 identical 8 KiB halves of text; b/c: 10 KiB of noise; b/d: a copy of a.
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog\n"
            .iter()
            .copied()
            .cycle()
            .take(8192)
            .collect();
        let a: Vec<u8> = text.iter().chain(&text).chain(&text).copied().collect();
        std::fs::write(dir.join("a"), &a).unwrap();
        let noise: Vec<u8> = (0..10240u64).map(|i| (mix(i) >> 7) as u8).collect();
        std::fs::write(dir.join("b/c"), &noise).unwrap();
        std::fs::write(dir.join("b/d"), &a).unwrap();
        std::fs::write(dir.join("e"), b"").unwrap();
    }

    #[test]
    fn layout_hashes_real_bytes_and_is_reproducible() {
        let d = tempfile::tempdir().unwrap();
        tree(d.path());
        let t = RealTree::scan(d.path(), 1 << 20, 1, 8192, Compression::Lz4).unwrap();
        // a (24 KiB) | b/c (10 KiB -> 12 KiB) | b/d (24 KiB), sorted: a, b/c, b/d.
        assert_eq!(t.files, 3);
        // 60 KiB of files, the last line padded with zeros.
        assert_eq!(t.bytes(), 64 * 1024);
        let l = &t.lines;
        assert_eq!(l.len(), 8);
        // The three lines of a are equal text; text compresses well.
        assert_eq!(l[0], l[1]);
        assert_eq!(l[1], l[2]);
        assert!(l[0].compressed_len < 1024, "{:?}", l[0]);
        // b/c's noise does not shrink.
        assert_eq!(l[3].compressed_len, 8192);
        // b/d starts at 36 KiB, mid-line: its lines straddle, so they differ from a's.
        assert_ne!(l[4], l[0]);
        let (dedup, comp) = t.ratios();
        assert!(dedup >= 1.3 && comp > 1.3, "{dedup} {comp}");
        let again = RealTree::scan(d.path(), 1 << 20, 1, 8192, Compression::Lz4).unwrap();
        assert_eq!(again.digest, t.digest);
        assert_eq!(again.lines, t.lines);
        std::fs::write(d.path().join("b/c"), b"changed").unwrap();
        let changed = RealTree::scan(d.path(), 1 << 20, 1, 8192, Compression::Lz4).unwrap();
        assert_ne!(changed.digest, t.digest);
        assert!(RealTree::scan(d.path(), 1 << 20, 1 << 30, 8192, Compression::Lz4).is_err());
    }

    #[test]
    fn gzip_lengths_are_of_the_same_lines_and_shorter_on_text() {
        let d = tempfile::tempdir().unwrap();
        // w: 40 KiB of words drawn at random from a small vocabulary (text-like: both
        // compress it, gzip's Huffman codes more); n: 10 KiB of noise.
        let vocab = [
            "cache",
            "line",
            "segment",
            "erase",
            "block",
            "the",
            "of",
            "and",
            "write",
            "read",
            "flash",
            "disk",
            "extent",
            "unit",
            "evict",
            "hit",
            "miss",
            "fingerprint",
            "zero",
        ];
        let mut w = Vec::new();
        let mut i = 0u64;
        while w.len() < 40 * 1024 {
            w.extend_from_slice(vocab[(mix(i) % vocab.len() as u64) as usize].as_bytes());
            w.push(if i % 11 == 10 { b'\n' } else { b' ' });
            i += 1;
        }
        w.truncate(40 * 1024);
        let noise: Vec<u8> = (0..10240u64).map(|i| (mix(i) >> 7) as u8).collect();
        std::fs::write(d.path().join("n"), &noise).unwrap();
        std::fs::write(d.path().join("w"), &w).unwrap();
        let t = RealTree::scan(d.path(), 1 << 20, 1, 8192, Compression::Lz4).unwrap();
        // n (10 KiB -> 12 KiB) | w (40 KiB) | zeros to 56 KiB: 7 lines.
        assert_eq!(t.lines.len(), 7);
        assert_eq!(t.gzip_len.len(), t.lines.len());
        // Text: gzip stores less than lz4; noise: both store the line raw.
        for l in 2..6 {
            assert!(
                t.gzip_len[l] < t.lines[l].compressed_len,
                "line {l}: gzip {} lz4 {}",
                t.gzip_len[l],
                t.lines[l].compressed_len
            );
        }
        assert_eq!(t.gzip_len[0], 8192);
        assert_eq!(t.lines[0].compressed_len, 8192);
        // The image rebuilt by hand: both totals are over exactly these lines.
        let mut image = noise.clone();
        image.resize(12 * 1024, 0);
        image.extend(&w);
        image.resize(56 * 1024, 0);
        let (lz, gz) = t.stored_bytes();
        let lines = image.chunks(8192);
        assert_eq!(
            lz,
            lines
                .clone()
                .map(|l| stored_len(l, Compression::Lz4) as u64)
                .sum::<u64>()
        );
        assert_eq!(gz, lines.map(|l| gzip_stored_len(l) as u64).sum::<u64>());
        assert!(gz < lz, "gzip {gz} lz4 {lz}");
        // The gzip tree: same fingerprints, gzip's lengths.
        let g = t.with_gzip_lengths();
        for (i, (a, b)) in g.lines.iter().zip(&t.lines).enumerate() {
            assert_eq!(a.fp, b.fp);
            assert_eq!(a.compressed_len, t.gzip_len[i]);
        }
        // The sample is every 64th line: here line 0 only; both codecs decompress it.
        assert_eq!(t.sample, image[..8192]);
        let dt = decompress_times(&image, 8192);
        assert_eq!(dt.lines, 7);
        let dt = decompress_times(&t.sample, 8192);
        assert_eq!(dt.lines, 1);
        assert!(dt.lz4_s > 0.0 && dt.gzip_s > 0.0, "{dt:?}");
    }

    #[test]
    fn clones_share_files_by_overlap_and_rewrites_are_tree_lines() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..200u64 {
            let b: Vec<u8> = (0..8192u64)
                .map(|j| (mix(i * 8192 + j) >> 3) as u8)
                .collect();
            std::fs::write(d.path().join(format!("f{i:03}")), b).unwrap();
        }
        let t = RealTree::scan(d.path(), 1 << 30, 1, 8192, Compression::Lz4).unwrap();
        assert_eq!(t.lines.len(), 200);
        let same = (0..100u64)
            .filter(|&l| t.vm_line(3, l, 100, 0.9, 1) == t.vm_line(0, l, 100, 0.9, 1))
            .count();
        assert!((80..=98).contains(&same), "{same} of 100 files shared");
        for l in 0..100u64 {
            let c = t.vm_line(3, l, 100, 0.9, 1);
            assert!(c == t.lines[l as usize] || c == t.lines[l as usize + 100]);
        }
        assert_eq!(t.rewrite(5, 2, 30), t.lines[65]);
        // A trace's lines take the tree's lines in first-touch order; writes move on.
        let reqs = vec![
            Request::read(80 << 13, 2 << 13),
            Request::read(0, 1 << 13),
            Request::write(81 << 13, 1 << 13),
            Request::read(80 << 13, 2 << 13),
        ];
        let d = dense_trace("x", reqs, &t);
        assert_eq!(d.content(0), &t.lines[0..2]);
        assert_eq!(d.content(1), &t.lines[2..3]);
        // The footprint is 3 lines: the write takes line 3, the first after it.
        assert_eq!(d.content(2), &[t.lines[3]]);
        assert_eq!(d.content(3), &[t.lines[0], t.lines[3]]);
        assert_eq!(dense_need(&d.requests, 8192), (3, 1));
    }
}
