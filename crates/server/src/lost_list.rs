//! The durable lost-range list (both layouts): volume byte ranges whose acknowledged data
//! could not be made durable (a failed backing sync dropped written-through or cleaned data,
//! a failed cache sync dropped cache writes, a dirty line could not be read back). Reads of
//! them fail with EIO until they are written again *and that write is flushed*, also after a
//! restart: without the list a restart would serve the backing device's older bytes.
//!
//! Where: the [`BYTES`] just before the data area (direct layout: `data_offset - BYTES`;
//! log layout: `seg_area - BYTES`). Caches formatted from now on reserve them; older caches
//! use the slack the 1 MiB alignment left there when it is large enough (the list is written
//! empty at their first open: the upgrade), else they open without a durable list, with a
//! warning at every open. A superblock flag (byte 47 in both layouts) says the list exists:
//! without it the area's bytes mean nothing (never written, or garbage on a reused device).
//!
//! ```text
//! +0     copy A (4 KiB)   magic "TCLOSTRG" | version u32 | count u32 | generation u64 |
//! +4096  copy B (4 KiB)   pad to 64 | count x (start u64, end u64) | ... | crc32c at 4092
//! ```
//!
//! The list is written to the copy not holding the newest generation, then synced: a torn
//! write leaves the other copy (the list before it) valid. Neither copy valid refuses the
//! open ([`load`]): an empty list would silently serve older bytes.
//!
//! Bounded to [`MAX_RANGES`] ranges (overlapping and adjacent ones are merged first): past
//! that the two ranges closest together are merged into one, so the bytes between them
//! also read EIO after a restart (logged, naming the widened range). Never an entry dropped.

use crate::dev::BlockDev;
use std::io;

pub const MAGIC: &[u8; 8] = b"TCLOSTRG";
pub const VERSION: u32 = 1;
pub const COPY: u64 = 4096;
/// Bytes of the area: two copies.
pub const BYTES: u64 = 2 * COPY;
const AT: usize = 64;
const CRC_AT: usize = 4092;
/// Ranges one copy holds.
pub const MAX_RANGES: usize = (CRC_AT - AT) / 16;
/// Superblock byte holding the flag "the list exists" (both layouts).
pub const SB_FLAG_AT: usize = 47;

/// The list as last written to the device.
#[derive(Clone, Debug)]
pub struct LostList {
    offset: u64,
    generation: u64,
    /// Sorted, disjoint, non-adjacent.
    pub ranges: Vec<(u64, u64)>,
}

/// `a ∪ b`, sorted, overlapping and adjacent ranges merged.
pub fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = a.iter().chain(b).copied().filter(|r| r.0 < r.1).collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (x, y) in v {
        match out.last_mut() {
            Some(l) if x <= l.1 => l.1 = l.1.max(y),
            _ => out.push((x, y)),
        }
    }
    out
}

/// Whether every byte of `inner` lies in `outer` (both sorted and merged).
pub fn covers(outer: &[(u64, u64)], inner: &[(u64, u64)]) -> bool {
    inner
        .iter()
        .all(|&(a, b)| outer.iter().any(|&(x, y)| x <= a && b <= y))
}

/// Merges the two ranges closest together until `v` fits [`MAX_RANGES`]; logs each widening.
pub fn bound(v: &mut Vec<(u64, u64)>) {
    while v.len() > MAX_RANGES {
        let i = (0..v.len() - 1)
            .min_by_key(|&i| v[i + 1].0 - v[i].1)
            .expect("more than one range");
        tracing::error!(
            "the lost-range list is full ({MAX_RANGES} ranges): lost ranges {}..{} and {}..{} merged into one, so volume bytes {}..{} between them also read EIO after a restart until rewritten",
            v[i].0,
            v[i].1,
            v[i + 1].0,
            v[i + 1].1,
            v[i].1,
            v[i + 1].0
        );
        v[i].1 = v[i + 1].1;
        v.remove(i + 1);
    }
}

fn u32at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn encode(generation: u64, ranges: &[(u64, u64)]) -> Vec<u8> {
    assert!(ranges.len() <= MAX_RANGES, "lost-range list over its bound");
    let mut b = vec![0u8; COPY as usize];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(ranges.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    for (i, &(x, y)) in ranges.iter().enumerate() {
        b[AT + 16 * i..AT + 16 * i + 8].copy_from_slice(&x.to_le_bytes());
        b[AT + 16 * i + 8..AT + 16 * i + 16].copy_from_slice(&y.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// One copy: `(generation, ranges)`, or why it is not valid.
fn decode(b: &[u8]) -> Result<(u64, Vec<(u64, u64)>), String> {
    if &b[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    let (stored, computed) = (u32at(b, CRC_AT), crc32c::crc32c(&b[..CRC_AT]));
    if stored != computed {
        return Err(format!(
            "crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    if u32at(b, 8) != VERSION {
        return Err(format!(
            "version {} (this build reads {VERSION})",
            u32at(b, 8)
        ));
    }
    let n = u32at(b, 12) as usize;
    if n > MAX_RANGES {
        return Err(format!("{n} ranges (at most {MAX_RANGES})"));
    }
    let ranges: Vec<(u64, u64)> = (0..n)
        .map(|i| (u64at(b, AT + 16 * i), u64at(b, AT + 16 * i + 8)))
        .collect();
    if ranges.iter().any(|r| r.0 >= r.1) || ranges.windows(2).any(|w| w[0].1 >= w[1].0) {
        return Err("ranges not sorted and disjoint".into());
    }
    Ok((u64at(b, 16), ranges))
}

impl LostList {
    /// Writes an empty list at `offset` (copy A, generation 1; copy B zeroed). The caller
    /// syncs before anything (a superblock flag) says the list exists.
    pub fn format(dev: &dyn BlockDev, offset: u64) -> io::Result<LostList> {
        let mut b = encode(1, &[]);
        b.extend_from_slice(&[0u8; COPY as usize]);
        dev.write_at(&b, offset)?;
        Ok(LostList {
            offset,
            generation: 1,
            ranges: Vec::new(),
        })
    }

    /// Reads the list at `offset`: the valid copy with the newest generation. Neither copy
    /// valid: `InvalidData` naming the area, both copies' faults, and what to do.
    pub fn load(dev: &dyn BlockDev, offset: u64) -> io::Result<LostList> {
        let mut b = vec![0u8; BYTES as usize];
        dev.read_at(&mut b, offset)?;
        let a = decode(&b[..COPY as usize]);
        let c = decode(&b[COPY as usize..]);
        let best = [&a, &c]
            .into_iter()
            .filter_map(|x| x.as_ref().ok())
            .max_by_key(|x| x.0);
        match best {
            Some((generation, ranges)) => Ok(LostList {
                offset,
                generation: *generation,
                ranges: ranges.clone(),
            }),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the cache device's lost-range list (bytes {offset}..{}) is damaged: copy A: {}; copy B: {}. It names the volume ranges whose data was lost; opening without it would serve the backing device's older bytes there, so the cache is not opened. Run `tiercache check` on the cache device for the rest of its state; if the volume's data is verified or restored from a backup, `tiercache format --force` the cache device to use it again (this discards the cache and its dirty data)",
                    offset + BYTES,
                    a.err().unwrap_or_default(),
                    c.err().unwrap_or_default()
                ),
            )),
        }
    }

    /// Writes `ranges` (bounded by [`bound`]) to the copy not holding the newest generation;
    /// the caller syncs. On success [`LostList::ranges`] is what was written.
    pub fn write(&mut self, dev: &dyn BlockDev, ranges: &[(u64, u64)]) -> io::Result<()> {
        let mut v = union(ranges, &[]);
        bound(&mut v);
        let generation = self.generation + 1;
        dev.write_at(
            &encode(generation, &v),
            self.offset + (generation % 2) * COPY,
        )?;
        self.generation = generation;
        self.ranges = v;
        Ok(())
    }

    /// The upgrade of a cache whose superblock does not flag the list: a valid list already
    /// there is kept (an older build opened the cache and rewrote its superblock without
    /// the flag: its entries still hold), else an empty one is written. The caller syncs.
    pub fn adopt_or_format(dev: &dyn BlockDev, offset: u64) -> io::Result<LostList> {
        match Self::load(dev, offset) {
            Ok(l) => {
                tracing::warn!(
                    "a valid lost-range list with {} range(s) found at cache byte {offset} although the superblock does not flag it (an older build ran this cache): kept",
                    l.ranges.len()
                );
                Ok(l)
            }
            Err(_) => Self::format(dev, offset),
        }
    }

    /// Where the area starts on the cache device.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Logs every listed range (at open), named within its volume (`vols`: the volumes
    /// served, empty for one): reads of them fail until rewritten.
    pub fn log_ranges(ranges: &[(u64, u64)], vols: &[crate::volume_set::VolumeSpec]) {
        for &(a, b) in ranges {
            tracing::error!(
                "lost range from before the restart: {} (length {}): reads of it fail with EIO until it is written again",
                crate::volume_set::ranges_text(vols, &[(a, b)]),
                b - a
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct MemDev(Mutex<Vec<u8>>);
    impl MemDev {
        fn new(n: usize) -> MemDev {
            MemDev(Mutex::new(vec![0; n]))
        }
    }
    impl BlockDev for MemDev {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let o = offset as usize;
            buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
            Ok(())
        }
        fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
            let o = offset as usize;
            self.0.lock().unwrap()[o..o + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn round_trip_newest_copy_wins_and_torn_copy_falls_back() {
        let d = MemDev::new(64 << 10);
        let mut l = LostList::format(&d, 8192).unwrap();
        assert!(LostList::load(&d, 8192).unwrap().ranges.is_empty());
        l.write(&d, &[(0, 512), (4096, 8192), (512, 1024)]).unwrap();
        assert_eq!(l.ranges, vec![(0, 1024), (4096, 8192)]);
        assert_eq!(LostList::load(&d, 8192).unwrap().ranges, l.ranges);
        l.write(&d, &[(4096, 8192)]).unwrap();
        assert_eq!(LostList::load(&d, 8192).unwrap().ranges, vec![(4096, 8192)]);
        // A torn write of the newest copy: the one before it is read.
        let at = 8192 + (l.generation % 2) * COPY + 100;
        d.write_at(&[0xff; 8], at).unwrap();
        assert_eq!(
            LostList::load(&d, 8192).unwrap().ranges,
            vec![(0, 1024), (4096, 8192)]
        );
    }

    #[test]
    fn both_copies_damaged_is_an_error_naming_the_area() {
        let d = MemDev::new(64 << 10);
        let mut l = LostList::format(&d, 8192).unwrap();
        l.write(&d, &[(0, 512)]).unwrap();
        d.write_at(&[1; 4], 8192 + 200).unwrap();
        d.write_at(&[1; 4], 8192 + COPY + 200).unwrap();
        let e = LostList::load(&d, 8192).unwrap_err().to_string();
        assert!(
            e.contains("bytes 8192..16384") && e.contains("crc32c mismatch"),
            "{e}"
        );
        // An area never written (all zeroes) is no list either.
        let z = MemDev::new(64 << 10);
        assert!(LostList::load(&z, 0).is_err());
    }

    #[test]
    fn a_full_list_merges_the_closest_ranges_and_drops_none() {
        let d = MemDev::new(64 << 10);
        let mut l = LostList::format(&d, 0).unwrap();
        let mut v: Vec<(u64, u64)> = (0..MAX_RANGES as u64 + 3)
            .map(|i| (i * 10_000, i * 10_000 + 512))
            .collect();
        // The closest pair: 7 and 8 brought near each other.
        v[8] = (7 * 10_000 + 1024, 7 * 10_000 + 2048);
        l.write(&d, &v).unwrap();
        let got = LostList::load(&d, 0).unwrap().ranges;
        assert_eq!(got.len(), MAX_RANGES);
        assert!(covers(&got, &union(&v, &[])), "an entry was dropped");
        assert!(got.contains(&(70_000, 72_048)), "{:?}", &got[..10]);
    }
}
