//! Optional data checksums of the direct layout (`tiercache format --data-checksums`, fixed
//! at format time; superblock version 3 with [`crate::format::Superblock::data_checksums`]).
//!
//! One crc32c per *sector* of every slot, the engine's validity unit (`max(line / 64, 512)`
//! bytes): a sector's checksum covers exactly the bytes that are valid together, so a partly
//! valid line needs no special case. The region sits between the metadata area and the data
//! area, at [`region_offset`]:
//!
//! ```text
//! +0     header copy A (4 KiB)  magic "TCDSUMS1", version, sector size, sectors per line,
//! +4096  header copy B (4 KiB)  block count, generation, persisted lost ranges, crc32c at 4092
//! +8192  blocks of 512 bytes:   124 crc32c u32 | magic "TCsb" | block index | 0 | crc32c of 0..508
//! ```
//!
//! Entry `slot * sectors_per_line + k` holds the crc32c of sector `k` of `slot` as last
//! written. A block is one device sector, so a torn write leaves each block old or new, and
//! its own checksum catches anything else. The header is written alternately to copy A and B
//! with a growing generation (the valid copy with the newest generation wins): it carries the
//! volume ranges whose dirty data was found damaged ([`DataSums::lost`]), which read EIO
//! until rewritten, also after a restart.
//!
//! Ordering (see `crate::volume`): blocks changed since the last flush are written before the
//! flush's first cache sync, so they are durable no later than the data they describe and
//! strictly before any record that maps that data. A slot written in place behind a durable
//! record has that record flagged *in flux* first (rule 5), and `CacheVolume::open`
//! recomputes the checksums of in-flux lines from their data after a crash: a stale
//! checksum can never report good data as damaged.

use crate::dev::BlockDev;
use std::collections::BTreeSet;
use std::io;

pub const MAGIC: &[u8; 8] = b"TCDSUMS1";
pub const VERSION: u32 = 1;
pub const HEADER: u64 = 4096;
/// Two header copies precede the blocks.
pub const HEADERS: u64 = 2 * HEADER;
pub const BLOCK: u64 = 512;
pub const PER_BLOCK: u64 = 124;
const BLOCK_MAGIC: &[u8; 4] = b"TCsb";
const LOST_AT: usize = 48;
/// Lost ranges the header holds; more are merged with their nearest neighbour (reads of the
/// bytes between then also fail: never a silent stale read).
pub const MAX_LOST: usize = (4092 - LOST_AT) / 16;

/// The checksum unit: the engine's sector (validity) size for `line_size`.
pub fn sector_size(line_size: u64) -> u64 {
    (line_size / 64).max(512)
}

fn blocks(capacity_lines: u64, line_size: u64) -> u64 {
    (capacity_lines * (line_size / sector_size(line_size))).div_ceil(PER_BLOCK)
}

/// Bytes of the region for a cache of `capacity_lines` lines (a multiple of 4 KiB).
pub fn region_bytes(capacity_lines: u64, line_size: u64) -> u64 {
    (HEADERS + blocks(capacity_lines, line_size) * BLOCK).div_ceil(4096) * 4096
}

/// Where the region starts: right after the metadata area.
pub fn region_offset(capacity_lines: u64) -> u64 {
    crate::format::META_OFFSET
        + capacity_lines.div_ceil(crate::format::RECORDS_PER_PAGE) * crate::format::PAGE
}

/// A data checksum that does not match: `ssd` is the data-area offset of the first bad
/// sector, `sectors` every bad sector's data-area offset in the range read.
#[derive(Debug, thiserror::Error)]
#[error("data checksum mismatch in the cache at data offset {ssd} ({} sector(s) of {sector} bytes damaged)", sectors.len())]
pub struct Mismatch {
    pub ssd: u64,
    pub sector: u64,
    pub sectors: Vec<u64>,
}

/// The mismatch an I/O error carries, if it is one.
pub fn mismatch(e: &io::Error) -> Option<&Mismatch> {
    e.get_ref().and_then(|x| x.downcast_ref::<Mismatch>())
}

/// The region's image in memory.
pub struct DataSums {
    offset: u64,
    pub sector: u64,
    spl: u64,
    img: Vec<u8>,
    dirty: BTreeSet<u64>,
    generation: u64,
    /// Volume byte ranges `[a, b)` whose dirty data was damaged (persisted in the header).
    pub lost: Vec<(u64, u64)>,
    /// `lost` changed since the header was last written.
    pub header_dirty: bool,
}

fn seal_block(b: &mut [u8], index: u64) {
    b[496..500].copy_from_slice(BLOCK_MAGIC);
    b[500..504].copy_from_slice(&(index as u32).to_le_bytes());
    b[504..508].copy_from_slice(&[0; 4]);
    let crc = crc32c::crc32c(&b[..508]);
    b[508..512].copy_from_slice(&crc.to_le_bytes());
}

fn block_ok(b: &[u8], index: u64) -> bool {
    &b[496..500] == BLOCK_MAGIC
        && b[500..504] == (index as u32).to_le_bytes()
        && b[508..512] == crc32c::crc32c(&b[..508]).to_le_bytes()
}

impl DataSums {
    /// Heap bytes: the region's image, the changed blocks and the lost ranges.
    pub fn mem_bytes(&self) -> usize {
        self.img.capacity()
            + tiercache_engine::mem::btree_bytes(self.dirty.len(), 8)
            + self.lost.capacity() * 16
    }

    fn empty(offset: u64, capacity_lines: u64, line_size: u64) -> DataSums {
        let n = blocks(capacity_lines, line_size);
        let mut img = vec![0u8; (n * BLOCK) as usize];
        for (i, b) in img.chunks_mut(BLOCK as usize).enumerate() {
            seal_block(b, i as u64);
        }
        DataSums {
            offset,
            sector: sector_size(line_size),
            spl: line_size / sector_size(line_size),
            img,
            dirty: BTreeSet::new(),
            generation: 0,
            lost: Vec::new(),
            header_dirty: false,
        }
    }

    /// Writes an empty region (every block sealed, header A) and syncs.
    pub fn format(
        dev: &dyn BlockDev,
        offset: u64,
        capacity_lines: u64,
        line_size: u64,
    ) -> io::Result<DataSums> {
        let mut s = Self::empty(offset, capacity_lines, line_size);
        dev.write_at(&vec![0u8; HEADERS as usize], offset)?;
        for (i, c) in s.img.chunks(1 << 20).enumerate() {
            dev.write_at(c, offset + HEADERS + (i as u64) * (1 << 20))?;
        }
        s.write_header(dev)?;
        dev.sync()?;
        Ok(s)
    }

    /// Reads the region; returns it and the indices of blocks whose checksum, magic or index
    /// is wrong (their entries are unknown: the caller recomputes or reports them). `Err`
    /// when neither header copy is valid.
    pub fn load(
        dev: &dyn BlockDev,
        offset: u64,
        capacity_lines: u64,
        line_size: u64,
    ) -> io::Result<(DataSums, Vec<u64>)> {
        let mut s = Self::empty(offset, capacity_lines, line_size);
        let mut h = vec![0u8; HEADERS as usize];
        dev.read_at(&mut h, offset)?;
        let n = s.img.len() as u64 / BLOCK;
        let best = h
            .chunks(HEADER as usize)
            .filter_map(|c| Self::decode_header(c, s.sector, s.spl, n))
            .max_by_key(|x| x.0);
        let Some((generation, lost)) = best else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the data checksum region at byte {offset} has no valid header (magic, version or checksum wrong): run `tiercache check` on the cache device"),
            ));
        };
        s.generation = generation;
        s.lost = lost;
        dev.read_at(&mut s.img, offset + HEADERS)?;
        let bad = s
            .img
            .chunks(BLOCK as usize)
            .enumerate()
            .filter(|(i, b)| !block_ok(b, *i as u64))
            .map(|(i, _)| i as u64)
            .collect();
        Ok((s, bad))
    }

    fn decode_header(h: &[u8], sector: u64, spl: u64, n: u64) -> Option<(u64, Vec<(u64, u64)>)> {
        let u32at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        let u64at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        if &h[0..8] != MAGIC
            || u32at(4092) != crc32c::crc32c(&h[..4092])
            || u32at(8) != VERSION
            || u32at(12) as u64 != sector
            || u32at(16) as u64 != spl
            || u64at(24) != n
        {
            return None;
        }
        let k = (u32at(40) as usize).min(MAX_LOST);
        let lost = (0..k)
            .map(|i| (u64at(LOST_AT + 16 * i), u64at(LOST_AT + 16 * i + 8)))
            .collect();
        Some((u64at(32), lost))
    }

    /// Writes the header (the copy not holding the newest generation); the caller syncs.
    pub fn write_header(&mut self, dev: &dyn BlockDev) -> io::Result<()> {
        while self.lost.len() > MAX_LOST {
            // Merge the two ranges closest together.
            let i = (0..self.lost.len() - 1)
                .min_by_key(|&i| self.lost[i + 1].0 - self.lost[i].1)
                .unwrap();
            self.lost[i].1 = self.lost[i + 1].1;
            self.lost.remove(i + 1);
        }
        self.generation += 1;
        let mut h = vec![0u8; HEADER as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.sector as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(self.spl as u32).to_le_bytes());
        h[24..32].copy_from_slice(&(self.img.len() as u64 / BLOCK).to_le_bytes());
        h[32..40].copy_from_slice(&self.generation.to_le_bytes());
        h[40..44].copy_from_slice(&(self.lost.len() as u32).to_le_bytes());
        for (i, &(a, b)) in self.lost.iter().enumerate() {
            h[LOST_AT + 16 * i..LOST_AT + 16 * i + 8].copy_from_slice(&a.to_le_bytes());
            h[LOST_AT + 16 * i + 8..LOST_AT + 16 * i + 16].copy_from_slice(&b.to_le_bytes());
        }
        let crc = crc32c::crc32c(&h[..4092]);
        h[4092..].copy_from_slice(&crc.to_le_bytes());
        dev.write_at(&h, self.offset + (self.generation % 2) * HEADER)?;
        self.header_dirty = false;
        Ok(())
    }

    fn entry(&self, i: u64) -> usize {
        ((i / PER_BLOCK) * BLOCK + (i % PER_BLOCK) * 4) as usize
    }

    /// The stored checksum of the sector at data-area offset `ssd` (sector aligned).
    pub fn get(&self, ssd: u64) -> u32 {
        let at = self.entry(ssd / self.sector);
        u32::from_le_bytes(self.img[at..at + 4].try_into().unwrap())
    }

    fn set(&mut self, ssd: u64, crc: u32) {
        let i = ssd / self.sector;
        let at = self.entry(i);
        if self.img[at..at + 4] != crc.to_le_bytes() {
            self.img[at..at + 4].copy_from_slice(&crc.to_le_bytes());
            self.dirty.insert(i / PER_BLOCK);
        }
    }

    /// `[ssd, ssd + len)` widened to whole sectors.
    pub fn widen(&self, ssd: u64, len: u64) -> (u64, u64) {
        let a = ssd / self.sector * self.sector;
        (a, (ssd + len).div_ceil(self.sector) * self.sector)
    }

    /// `data` was written at data-area offset `ssd`: records the checksum of every whole
    /// sector in it; returns the partly written sectors' range (widened), whose checksum the
    /// caller computes from the device with [`DataSums::update`] on the whole sectors.
    pub fn update(&mut self, ssd: u64, data: &[u8]) -> Option<(u64, u64)> {
        let s = self.sector;
        let end = ssd + data.len() as u64;
        let mut x = ssd.div_ceil(s) * s;
        while x + s <= end {
            let o = (x - ssd) as usize;
            self.set(x, crc32c::crc32c(&data[o..o + s as usize]));
            x += s;
        }
        let partial = !ssd.is_multiple_of(s) || !end.is_multiple_of(s);
        partial.then(|| self.widen(ssd, data.len() as u64))
    }

    /// Checks `data`, read at the sector-aligned data-area offset `ssd` (whole sectors),
    /// against `expected` (one entry per sector, from [`DataSums::expected`]).
    pub fn verify(sector: u64, ssd: u64, data: &[u8], expected: &[u32]) -> Result<(), Mismatch> {
        debug_assert!(ssd.is_multiple_of(sector) && (data.len() as u64).is_multiple_of(sector));
        let bad: Vec<u64> = data
            .chunks(sector as usize)
            .zip(expected)
            .enumerate()
            .filter(|(_, (c, &e))| crc32c::crc32c(c) != e)
            .map(|(i, _)| ssd + i as u64 * sector)
            .collect();
        match bad.first() {
            None => Ok(()),
            Some(&first) => Err(Mismatch {
                ssd: first,
                sector,
                sectors: bad,
            }),
        }
    }

    /// Stored checksums of the sectors of the widened range `[a, b)`.
    pub fn expected(&self, a: u64, b: u64) -> Vec<u32> {
        (a / self.sector..b / self.sector)
            .map(|i| self.get(i * self.sector))
            .collect()
    }

    /// Recomputes every sector of `slot` set in `mask` from `line` (the slot's bytes).
    pub fn recompute(&mut self, slot: u64, line: &[u8], mask: u64) {
        let s = self.sector;
        for k in 0..self.spl.min(64) {
            if mask >> k & 1 == 1 {
                let u = (k * s) as usize..((k + 1) * s) as usize;
                self.set((slot * self.spl + k) * s, crc32c::crc32c(&line[u]));
            }
        }
    }

    /// Slots with an entry in block `b`.
    pub fn block_slots(&self, b: u64) -> std::ops::Range<u64> {
        let first = b * PER_BLOCK / self.spl;
        let last = ((b + 1) * PER_BLOCK).div_ceil(self.spl);
        first..last
    }

    /// Marks block `b` to be rewritten (sealed) at the next flush.
    pub fn touch_block(&mut self, b: u64) {
        self.dirty.insert(b);
    }

    /// Whether blocks changed since the last [`DataSums::write_dirty`].
    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Writes the changed blocks (one write per run); the caller syncs.
    pub fn write_dirty(&mut self, dev: &dyn BlockDev) -> io::Result<()> {
        let dirty = std::mem::take(&mut self.dirty);
        let v: Vec<u64> = dirty.iter().copied().collect();
        let mut i = 0;
        while i < v.len() {
            let mut j = i + 1;
            while j < v.len() && v[j] == v[j - 1] + 1 {
                j += 1;
            }
            for b in v[i]..v[j - 1] + 1 {
                let at = (b * BLOCK) as usize;
                seal_block(&mut self.img[at..at + BLOCK as usize], b);
            }
            let (a, z) = ((v[i] * BLOCK) as usize, ((v[j - 1] + 1) * BLOCK) as usize);
            if let Err(e) = dev.write_at(&self.img[a..z], self.offset + HEADERS + a as u64) {
                self.dirty = dirty;
                return Err(e);
            }
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_seal_and_verify() {
        let mut s = DataSums::empty(0, 40, 4096);
        let data = vec![7u8; 4096];
        assert_eq!(s.update(4096 * 3, &data), None);
        let exp = s.expected(4096 * 3, 4096 * 4);
        assert_eq!(exp.len(), 8);
        assert!(DataSums::verify(512, 4096 * 3, &data, &exp).is_ok());
        let mut bad = data.clone();
        bad[1000] ^= 1;
        let m = DataSums::verify(512, 4096 * 3, &bad, &exp).unwrap_err();
        assert_eq!(m.sectors, vec![4096 * 3 + 512]);
        assert_eq!(s.update(100, &data[..600]), Some((0, 1024)));
        for i in 0..s.img.len() as u64 / BLOCK {
            let at = (i * BLOCK) as usize;
            seal_block(&mut s.img[at..at + 512], i);
            assert!(block_ok(&s.img[at..at + 512], i));
            assert!(!block_ok(&s.img[at..at + 512], i + 1), "index is checked");
        }
        assert!(s.block_slots(0).contains(&0) && s.block_slots(1).contains(&15));
    }

    /// The CPU cost of one 4 KiB sector run's checksums (8 x 512 B), for BENCHMARKS:
    /// `cargo test --release -p tiercache-server --lib crc32c_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn crc32c_cost() {
        let data = vec![0x5au8; 4096];
        let n = 1_000_000u32;
        let t = std::time::Instant::now();
        let mut x = 0u32;
        for _ in 0..n {
            for c in data.chunks(512) {
                x ^= crc32c::crc32c(std::hint::black_box(c));
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "crc32c of 4 KiB in 512-byte sectors: {ns:.0} ns ({:.1} GB/s) [{x}]",
            4096.0 / ns
        );
    }
}
