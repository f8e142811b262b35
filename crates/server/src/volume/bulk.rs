//! The bulk steps of a warm restart (`CacheVolume::open`), on every core: reading and
//! decoding the record area in chunks, and sorting millions of `u64`s (duplicate keys, the
//! age order, the clean sample) with a radix sort. Issue 16 item 2: 10 M lines in < 1 s.

use super::*;
use rayon::prelude::*;

/// Records decoded per task (2 MiB of the record area); a multiple of 64 (the bitmap's
/// words) and of the records in a page.
const CHUNK_RECORDS: usize = 65536;
/// Below this many bytes the record area is read with one request (small caches, and every
/// test device that counts or fails requests, see it read as before); above, each chunk is
/// read by the task that decodes it, so reading overlaps decoding on every core.
const ONE_READ_BYTES: usize = 32 << 20;

/// What one pass over the record area found.
pub(super) struct Decoded {
    /// Bit per slot: the record maps a line with a valid sector (a candidate to restore).
    pub take: Vec<u64>,
    /// `(seq << 32 | slot)` of each candidate, by slot.
    pub order: Vec<u64>,
    /// `key << 1 | dirty` of each candidate (its key, in-flux flag stripped, and whether its
    /// record has a dirty sector), parallel to `order`: the duplicate keys' sort, gathered
    /// while decoding (no second pass over the record area).
    pub keys: Vec<u64>,
    /// Slots whose record is rewritten whatever happens: bad checksum, or no valid sector.
    pub touched: Vec<u32>,
    /// Slots whose record fails its checksum, ascending.
    pub bad: Vec<u32>,
    /// Candidates whose record carries the in-flux flag, ascending.
    pub flux: Vec<u32>,
    /// Slots whose record is a dirty line's copy ([`format::COPY`], pools only), ascending:
    /// not candidates (`crate::reconcile` pairs them).
    pub copies: Vec<u32>,
}

struct Part {
    order: usize,
    touched: Vec<u32>,
    bad: Vec<u32>,
    flux: Vec<u32>,
    copies: Vec<u32>,
    /// The first record refused (a copy where none can be, or a malformed one).
    refused: Option<String>,
}

/// Key of the record of `slot` in the record area `disk`, its in-flux flag stripped; only
/// for records whose checksum was verified (bits of `Decoded::take`, slots of its `order`):
/// the keys are read from the record area where they are, not copied.
#[inline]
pub(super) fn key_at(disk: &[u8], slot: usize) -> u64 {
    let at = slot * RECORD_BYTES as usize;
    match u64::from_le_bytes(disk[at..at + 8].try_into().unwrap()) {
        EMPTY_KEY => EMPTY_KEY,
        k => k & !format::IN_FLUX,
    }
}

/// Decodes records `first..first + n` from `rec` (their bytes), of a device of on-disk
/// `version` (records with the copy bit: only version 6, `Record::check_copy`).
fn decode_part(
    rec: &[u8],
    first: usize,
    n: usize,
    take: &mut [u64],
    order: &mut [u64],
    keys: &mut [u64],
    version: u32,
) -> Part {
    let mut p = Part {
        order: 0,
        touched: Vec::new(),
        bad: Vec::new(),
        flux: Vec::new(),
        copies: Vec::new(),
        refused: None,
    };
    let rb = RECORD_BYTES as usize;
    for i in 0..n {
        let slot = (first + i) as u32;
        let b = &rec[i * rb..(i + 1) * rb];
        let Some(r) = Record::decode(b) else {
            p.touched.push(slot);
            p.bad.push(slot);
            continue;
        };
        if r.key == EMPTY_KEY {
            continue;
        }
        if r.is_copy() {
            match r.check_copy(version, slot as u64) {
                Ok(()) => p.copies.push(slot),
                Err(e) => {
                    p.refused.get_or_insert(e);
                }
            }
            continue;
        }
        if r.valid == 0 {
            p.touched.push(slot);
            continue;
        }
        take[i / 64] |= 1 << (i % 64);
        order[p.order] = (r.seq as u64) << 32 | slot as u64;
        // As `key_at` reads it (a decoded key has no in-flux bit, nor bit 63).
        debug_assert_eq!(r.key, key_at(rec, i));
        keys[p.order] = r.key << 1 | (r.dirty != 0) as u64;
        p.order += 1;
        if u64::from_le_bytes(b[0..8].try_into().unwrap()) & format::IN_FLUX != 0 {
            p.flux.push(slot);
        }
    }
    p
}

/// Reads the record area of `cap` slots into `disk` (whole pages) and decodes it; `version`:
/// the on-disk version of its records (`format::VERSION_POOL` for a pool's). A verified
/// record that cannot be on such a device (a copy before version 6, a malformed copy) is
/// refused, naming its slot.
pub(super) fn read_and_decode(
    cache: &dyn BlockDev,
    disk: &mut [u8],
    cap: usize,
    version: u32,
) -> Result<Decoded, FormatError> {
    let rb = RECORD_BYTES as usize;
    let mut take = vec![0u64; cap.div_ceil(64)];
    let mut order = vec![0u64; cap];
    let mut keys = vec![0u64; cap];
    let one = disk.len() <= ONE_READ_BYTES;
    if one {
        cache.read_at(disk, META_OFFSET)?;
    }
    let chunk_bytes = CHUNK_RECORDS * rb;
    let parts: Vec<io::Result<Part>> = disk
        .par_chunks_mut(chunk_bytes)
        .zip(take.par_chunks_mut(CHUNK_RECORDS / 64))
        .zip(order.par_chunks_mut(CHUNK_RECORDS))
        .zip(keys.par_chunks_mut(CHUNK_RECORDS))
        .enumerate()
        .map(|(c, (((buf, take), order), keys))| {
            if !one {
                cache.read_at(buf, META_OFFSET + (c * chunk_bytes) as u64)?;
            }
            let n = CHUNK_RECORDS.min(cap - c * CHUNK_RECORDS);
            Ok(decode_part(
                buf,
                c * CHUNK_RECORDS,
                n,
                take,
                order,
                keys,
                version,
            ))
        })
        .collect();
    let mut d = Decoded {
        take,
        order: Vec::new(),
        keys: Vec::new(),
        touched: Vec::new(),
        bad: Vec::new(),
        flux: Vec::new(),
        copies: Vec::new(),
    };
    // The candidates of each chunk to the front, in chunk order (nothing moves when the
    // cache is full).
    let mut n = 0;
    for (c, p) in parts.into_iter().enumerate() {
        let p = p?;
        if let Some(why) = p.refused {
            return Err(FormatError::BadField {
                field: "metadata record",
                why,
            });
        }
        order.copy_within(c * CHUNK_RECORDS..c * CHUNK_RECORDS + p.order, n);
        keys.copy_within(c * CHUNK_RECORDS..c * CHUNK_RECORDS + p.order, n);
        n += p.order;
        d.touched.extend(p.touched);
        d.bad.extend(p.bad);
        d.flux.extend(p.flux);
        d.copies.extend(p.copies);
    }
    order.truncate(n);
    keys.truncate(n);
    d.order = order;
    d.keys = keys;
    Ok(d)
}

/// The newest sequence number of the decoded records (`bad` ones left out), as the one
/// pass of the old open took it: a wrapping comparison folded in slot order.
pub(super) fn max_seq(disk: &[u8], cap: usize, bad: &[u32]) -> u32 {
    let rb = RECORD_BYTES as usize;
    let mut max = 0u32;
    let mut next_bad = bad.iter().peekable();
    for slot in 0..cap {
        if next_bad.peek() == Some(&&(slot as u32)) {
            next_bad.next();
            continue;
        }
        let at = slot * rb + 24;
        let seq = u32::from_le_bytes(disk[at..at + 4].try_into().unwrap());
        if format::seq_newer(seq, max) {
            max = seq;
        }
    }
    max
}

/// Iterates over the set bits of a bitmap, ascending.
pub(super) fn bits(map: &[u64]) -> impl Iterator<Item = u32> + '_ {
    map.iter().enumerate().flat_map(|(w, &x)| {
        let mut x = x;
        std::iter::from_fn(move || {
            if x == 0 {
                return None;
            }
            let b = x.trailing_zeros();
            x &= x - 1;
            Some((w * 64) as u32 + b)
        })
    })
}

/// A raw pointer the scatter tasks share; each writes disjoint positions.
#[derive(Clone, Copy)]
struct Out(*mut u64);
// SAFETY: the tasks write disjoint ranges (computed from the histograms), and the buffer
// outlives the scope that uses them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// # Safety
    /// `at` is inside the buffer, and no other task writes it.
    unsafe fn write(&self, at: usize, x: u64) {
        self.0.add(at).write(x)
    }
}

/// Sorts ascending: a most-significant-digit pass on every core (8 to 11 bits, below the
/// bits that every value shares) into buckets, then each bucket sorted by least-significant
/// digits on its own (a bucket fits in the CPU cache; the buckets on every core). Restart
/// sorts up to 10^8 values: a comparison sort took most of the open. `scratch`: a buffer the
/// sort may use (kept between sorts, so that each does not fault in fresh pages).
pub(super) fn radix_sort(v: &mut [u64], scratch: &mut Vec<u64>) {
    radix_sort_above(v, scratch, 0)
}

/// [`radix_sort`] of values whose low `sorted_low` bits already ascend among the values of
/// equal high bits (`seq << 32 | slot` listed by slot: `sorted_low` 32): the digit passes
/// below `sorted_low` are skipped (each pass is stable), so the age order at a restart
/// costs its sequence numbers' passes only. Input breaking that order comes out unsorted.
pub(super) fn radix_sort_above(v: &mut [u64], scratch: &mut Vec<u64>, sorted_low: u32) {
    let n = v.len();
    if n < 1 << 16 {
        v.sort_unstable();
        return;
    }
    let first = v[0];
    let diff = v
        .par_chunks(1 << 16)
        .map(|c| c.iter().fold(0u64, |a, &x| a | (x ^ first)))
        .reduce(|| 0, |a, b| a | b);
    if diff == 0 || (sorted_low > 0 && diff >> sorted_low.min(63) == 0) {
        return; // all equal above `sorted_low`: in order already
    }
    let top = 64 - diff.leading_zeros(); // bits above `top` are shared
    let msd = top.min(if n > 1 << 22 { 11 } else { 8 });
    let shift = top - msd;
    let nb = 1usize << msd;
    let mask = nb as u64 - 1;
    let part_len = n.div_ceil(4 * rayon::current_num_threads().max(1));
    let hists: Vec<Vec<usize>> = v
        .par_chunks(part_len)
        .map(|c| {
            let mut h = vec![0usize; nb];
            for &x in c {
                h[(x >> shift & mask) as usize] += 1;
            }
            h
        })
        .collect();
    // Bucket starts, and each part's first position in each bucket (parts in order).
    let mut starts = vec![0usize; nb + 1];
    let mut offs = vec![vec![0usize; nb]; hists.len()];
    let mut sum = 0;
    for b in 0..nb {
        starts[b] = sum;
        for (p, h) in hists.iter().enumerate() {
            offs[p][b] = sum;
            sum += h[b];
        }
    }
    starts[nb] = sum;
    debug_assert_eq!(sum, n, "the histograms count every value once");
    if scratch.len() < n {
        // Room for n, not filled: the scatter below writes each of the n positions (the
        // parts' ranges of every bucket tile 0..sum = n), before anything reads them.
        scratch.clear();
        scratch.reserve_exact(n);
    }
    let out = Out(scratch.as_mut_ptr());
    v.par_chunks(part_len)
        .zip(offs.into_par_iter())
        .for_each(|(c, mut off)| {
            for &x in c {
                let b = (x >> shift & mask) as usize;
                // SAFETY: `off[b]` runs over this part's own range of bucket b, inside n
                // (the capacity reserved).
                unsafe { out.write(off[b], x) };
                off[b] += 1;
            }
        });
    if scratch.len() < n {
        // SAFETY: positions 0..n were all written by the scatter just above (see there).
        unsafe { scratch.set_len(n) };
    }
    let tmp = &mut scratch[..n];
    // Bucket b: tmp[starts[b]..starts[b+1]], sorted into the same range of v.
    let mut jobs = Vec::with_capacity(nb);
    let (mut a, mut s) = (tmp, v);
    for b in 0..nb {
        let len = starts[b + 1] - starts[b];
        let (x, ra) = a.split_at_mut(len);
        let (y, rs) = s.split_at_mut(len);
        (a, s) = (ra, rs);
        if len > 0 {
            jobs.push((x, y));
        }
    }
    jobs.into_par_iter()
        .for_each(|(x, y)| lsd(x, y, shift, sorted_low));
}

/// The low halves of `v` (`seq << 32 | slot` values: the slots), in place in its first
/// half: the age order costs no second buffer (0.4 GB at 10^8 lines).
pub(super) fn low_halves(v: &mut [u64]) -> &[u32] {
    let n = v.len();
    let p = v.as_mut_ptr();
    // SAFETY: `u32` number i lies in `u64` number i / 2 <= i, already read when it is
    // written (ascending i, read before write); `u32` needs less alignment than `u64`, and
    // n of them fit in the n `u64`s borrowed, which the slice keeps borrowed.
    unsafe {
        let q = p as *mut u32;
        for i in 0..n {
            let x = p.add(i).read();
            q.add(i).write(x as u32);
        }
        std::slice::from_raw_parts(q, n)
    }
}

/// The clean sample's keys: `keys` sorted, each `key << 1 | dirty`; returns how many are
/// clean (low bit 0) and the clean keys at ranks `j * n / k` among them, `k = min(n, size)`
/// (evenly spaced in key order), ascending.
pub(super) fn pick_clean(keys: &[u64], size: usize) -> (usize, Vec<u64>) {
    const C: usize = 1 << 16;
    let counts: Vec<usize> = keys
        .par_chunks(C)
        .map(|c| c.iter().filter(|&&x| x & 1 == 0).count())
        .collect();
    let n: usize = counts.iter().sum();
    let k = n.min(size);
    if k == 0 {
        return (n, Vec::new());
    }
    let mut los = Vec::with_capacity(counts.len());
    let mut lo = 0;
    for c in &counts {
        los.push(lo);
        lo += c;
    }
    let picked: Vec<Vec<u64>> = keys
        .par_chunks(C)
        .zip(los.into_par_iter())
        .map(|(c, lo)| {
            // The first j with j * n / k >= lo.
            let mut j = (lo * k).div_ceil(n);
            let mut out = Vec::new();
            let mut rank = lo;
            for &x in c {
                if x & 1 != 0 {
                    continue;
                }
                if j < k && rank == j * n / k {
                    out.push(x >> 1);
                    j += 1;
                }
                rank += 1;
            }
            out
        })
        .collect();
    (n, picked.into_iter().flatten().collect())
}

/// Sorts `a` by its bits below `bits` (the others are equal) into `out` (same length;
/// `a` is scratch).
fn lsd(a: &mut [u64], out: &mut [u64], bits: u32, sorted_low: u32) {
    if a.len() < 256 || bits == 0 {
        a.sort_unstable();
        out.copy_from_slice(a);
        return;
    }
    // Digits wholly below `sorted_low` are in order already (see `radix_sort_above`).
    let low = (sorted_low / 8) as usize;
    let digits = bits.div_ceil(8) as usize;
    if low >= digits {
        out.copy_from_slice(a);
        return;
    }
    let first = a[0];
    let diff = a.iter().fold(0u64, |d, &x| d | (x ^ first)) & ((1u64 << bits) - 1);
    let mut hist = vec![[0usize; 256]; digits];
    for &x in a.iter() {
        for (d, h) in hist.iter_mut().enumerate().skip(low) {
            h[(x >> (8 * d)) as usize & 255] += 1;
        }
    }
    // Data in `src`, written to `dst`, swapped after each pass.
    let (mut src, mut dst) = (a, out);
    let mut in_out = false;
    for (d, h) in hist.iter().enumerate().skip(low) {
        if diff >> (8 * d) & 255 == 0 {
            continue;
        }
        let mut at = [0usize; 256];
        let mut sum = 0;
        for (p, &c) in at.iter_mut().zip(h.iter()) {
            *p = sum;
            sum += c;
        }
        for &x in src.iter() {
            let b = (x >> (8 * d)) as usize & 255;
            dst[at[b]] = x;
            at[b] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
        in_out = !in_out;
    }
    if !in_out {
        // The data is in `a` (an even number of passes): `dst` is `out`.
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    fn rand_vec(n: usize, seed: u64, f: impl Fn(usize, u64) -> u64) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                f(i, x)
            })
            .collect()
    }

    #[test]
    fn radix_sort_sorts() {
        // Shared high bytes (skipped digits), duplicates, small and big buckets, sizes
        // on both sides of every threshold.
        let cases: Vec<Vec<u64>> = vec![
            rand_vec(100_000, 1, |i, x| if i % 3 == 0 { x & 0xffff } else { x }),
            rand_vec(300_000, 2, |_, x| x & 0x00ff_0000_0000_00ff),
            rand_vec(70_000, 3, |_, x| x >> 40),
            rand_vec(200_000, 4, |_, x| x % 7),
            rand_vec(5_000_000, 5, |_, x| (x & 0x3fff_ffff) << 32 | (x >> 40)),
            vec![42; 100_000],
            rand_vec(1000, 6, |_, x| x),
        ];
        for (c, mut v) in cases.into_iter().enumerate() {
            let mut want = v.clone();
            want.sort_unstable();
            let mut scratch = vec![7; c * 1000];
            super::radix_sort(&mut v, &mut scratch);
            assert!(v == want, "case {c}: not sorted");
        }
    }

    /// The age order's sort skips the slot digits: equal to a full sort when the values are
    /// listed by slot (the low halves ascending), and not when they are not (the passes
    /// really are skipped).
    #[test]
    fn radix_sort_above_skips_the_sorted_low_digits() {
        // Sequence numbers from one (in order), few, and many flushes; slots ascending,
        // with gaps (dropped lines).
        let cases: Vec<Vec<u64>> = vec![
            rand_vec(200_000, 7, |i, _| 5u64 << 32 | (3 * i as u64)),
            rand_vec(300_000, 8, |i, x| (x % 9) << 32 | i as u64),
            rand_vec(3_000_000, 9, |i, x| {
                (x >> 34) << 32 | (i as u64 * 2 + (x & 1))
            }),
            rand_vec(100_000, 10, |i, x| (x & 0xffff_ffff) << 32 | i as u64),
            rand_vec(1000, 11, |i, x| (x % 3) << 32 | i as u64),
        ];
        for (c, mut v) in cases.into_iter().enumerate() {
            let mut want = v.clone();
            want.sort_unstable();
            let mut scratch = Vec::new();
            super::radix_sort_above(&mut v, &mut scratch, 32);
            assert!(v == want, "case {c}: not sorted");
        }
        // Slots in reverse: the skipped passes leave them reversed among equal seqs.
        let mut v = rand_vec(300_000, 12, |i, x| (x % 9) << 32 | (300_000 - i as u64));
        super::radix_sort_above(&mut v, &mut Vec::new(), 32);
        assert!(
            v.windows(2).any(|w| w[0] > w[1]),
            "the slot digits were sorted"
        );
    }

    #[test]
    fn pick_clean_takes_evenly_spaced_ranks() {
        for (n, size) in [
            (0usize, 256usize),
            (10, 256),
            (300_000, 256),
            (1000, 64),
            (200_000, 1),
        ] {
            // Keys 0..n, every third dirty.
            let keys: Vec<u64> = (0..n as u64)
                .map(|k| k << 1 | (k % 3 == 1) as u64)
                .collect();
            let clean: Vec<u64> = (0..n as u64).filter(|k| k % 3 != 1).collect();
            let k = clean.len().min(size);
            let want: Vec<u64> = (0..k).map(|j| clean[j * clean.len() / k]).collect();
            assert_eq!(
                super::pick_clean(&keys, size),
                (clean.len(), want),
                "n {n} size {size}"
            );
        }
    }

    #[test]
    fn low_halves_are_the_slots_in_order() {
        let mut v: Vec<u64> = (0..1001u64)
            .map(|i| (i * 7919) << 32 | (i * 31 + 5))
            .collect();
        let want: Vec<u32> = v.iter().map(|&x| x as u32).collect();
        assert_eq!(super::low_halves(&mut v), &want[..]);
    }

    #[test]
    fn bits_lists_set_bits() {
        let map = [0b1011u64, 0, 1 << 63];
        let got: Vec<u32> = super::bits(&map).collect();
        assert_eq!(got, vec![0, 1, 3, 191]);
    }
}
