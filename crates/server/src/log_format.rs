//! On-disk format of a cache device in the log layout (see `log_volume` for the ordering
//! rules that make it crash-consistent).
//!
//! ```text
//! 0                 superblock, 4 KiB: magic "TCLOGVOL", version, geometry, reduction settings,
//!                   all in the first sector, crc32c at byte 508 over bytes 0..508 (a rewrite
//!                   torn between sectors leaves a whole old or new sector 0)
//! JOURNAL (4096)    journal: two halves of `half_bytes`; each half is a 4 KiB half header
//!                   (magic, version, epoch, crc32c) and then fixed 96-byte records
//! seg_area          segment i at seg_area + i * (2 * slot_bytes + segment_size):
//!                   header slot A, header slot B, data area (extents packed from byte 0)
//! ```
//!
//! The superblock is version 2 (`SB_VERSION`; segment headers and journal records stay at
//! `VERSION`): it adds the backing device's identity (`crate::identity`) at bytes 112..492.
//! A version-1 superblock has zeroes there and opens with an `Unknown` identity. Version 3
//! adds the cache's uuid at bytes 492..508 (it names the cache in a state file recording its
//! failure, `crate::state_file`); older superblocks have zeroes there and get a uuid at the
//! first open that rewrites the superblock.
//!
//! A segment header (written to the slot not holding the newest valid header, so a torn
//! write leaves the previous one) is 48 bytes — magic "TCLSEGHD", version, segment number,
//! generation, entry count, header sequence number, state (0 empty, 1 sealed), crc32c over
//! the header and its entries — then 64 bytes per extent: key, BLAKE3-256 of the raw line,
//! offset, stored length, flags (dirty, compressed, live), crc32c of the stored bytes, and
//! the extent's sequence number.
//!
//! A journal record is `magic u16 | kind u8 | flags u8 | seg u32 | epoch u64 | seq u64 |
//! key u64 | gen u32 | off u32 | len u32 | data_crc u32 | BLAKE3 [32] | frame_start u32 |
//! frame_end u32 | pad [4] | crc32c u32` (little endian, crc over bytes 0..92). Kinds: 1 base
//! (an extent of a segment not sealed yet, whose bytes were synced first), 2 duplicate entry,
//! 3 drop, 4 end (written last by a clean shutdown). The frame is the range of record
//! indices the record's journal write covered (one commit or checkpoint): a crash can tear
//! only the last write, so a bad record is a torn tail when every valid record after it
//! belongs to the same frame, and damage otherwise (see `log_volume`, recovery). Half headers
//! whose flags byte (24) has bit 0 set hold framed records and, after a clean shutdown, end
//! in an end record; records written before frames existed have zero frames.
//! All integers little endian.

use crate::identity::{BackingIdentity, ID_BYTES};
use crate::reduce::Hash;
use std::io;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;

pub const MAGIC: &[u8; 8] = b"TCLOGVOL";
pub const VERSION: u32 = 1;
/// The superblock's version (2: with the backing identity; 3: with the cache's uuid); 1 and
/// 2 still open.
pub const SB_VERSION: u32 = 3;
/// The superblock's version while the lost-range list holds ranges: builds before it ignore
/// the list (they would serve the backing device's older bytes there) and refuse it. Back to
/// [`SB_VERSION`] once the list is empty again.
pub const SB_VERSION_LOST: u32 = 4;
/// Where the superblock keeps the backing identity.
const SB_ID_AT: usize = 112;
const _: () = assert!(
    SB_ID_AT + ID_BYTES <= 508,
    "superblock fields beyond sector 0"
);
/// Where the superblock keeps the cache's uuid (version 3).
const SB_UUID_AT: usize = 492;
const _: () = assert!(SB_ID_AT + ID_BYTES <= SB_UUID_AT && SB_UUID_AT + 16 <= 508);
pub const SB_BYTES: u64 = 4096;
pub const JOURNAL_OFFSET: u64 = SB_BYTES;
pub const HALF_HEADER: u64 = 4096;
pub const REC_BYTES: usize = 96;
pub const HDR_FIXED: usize = 48;
pub const HDR_ENTRY: usize = 64;
const SEG_MAGIC: &[u8; 8] = b"TCLSEGHD";
const HALF_MAGIC: &[u8; 8] = b"TCLJHALF";
const REC_MAGIC: u16 = 0x4a52;

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// The log device's superblock.
#[derive(Clone, Debug, PartialEq)]
pub struct LogSuperblock {
    pub line_size: u64,
    pub segment_size: u64,
    pub segments: u64,
    pub max_extents: u32,
    pub compression: Compression,
    pub dedup_ratio: f64,
    pub picker: String,
    pub mode: Mode,
    pub backing_size: u64,
    /// Records per journal half.
    pub journal_records: u64,
    pub clean: bool,
    /// The backing device's identity (`Unknown` for a version-1 superblock).
    pub backing: BackingIdentity,
    /// The cache's uuid (zeroes before version 3): names it in a failure state file.
    pub uuid: [u8; 16],
    /// The lost-range list (`crate::lost_list`) exists at [`Geometry::lost_list`] (byte 47).
    /// Caches formatted before it get it at their first open when the slack before the
    /// segment area holds it.
    pub lost_list: bool,
    /// The lost-range list holds ranges: written as [`SB_VERSION_LOST`].
    pub lost_pending: bool,
}

/// Where things are on the device.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub half_bytes: u64,
    pub slot_bytes: u64,
    pub seg_area: u64,
    pub seg_stride: u64,
    pub segment_size: u64,
    /// Where the lost-range list sits (`seg_area - lost_list::BYTES`), if the slack after
    /// the journal holds it (always when formatted with it).
    pub lost_list: Option<u64>,
}

impl Geometry {
    pub fn half_offset(&self, half: u32) -> u64 {
        JOURNAL_OFFSET + half as u64 * self.half_bytes
    }
    pub fn slot_offset(&self, seg: u32, slot: u32) -> u64 {
        self.seg_area + seg as u64 * self.seg_stride + slot as u64 * self.slot_bytes
    }
    pub fn data_offset(&self, seg: u32) -> u64 {
        self.seg_area + seg as u64 * self.seg_stride + 2 * self.slot_bytes
    }
    /// Device bytes needed.
    pub fn device_bytes(&self, segments: u64) -> u64 {
        self.seg_area + segments * self.seg_stride
    }
}

impl LogSuperblock {
    /// Layout for a cache of `device_bytes`: the number of segments that fit.
    pub fn plan(
        device_bytes: u64,
        line_size: u64,
        segment_size: u64,
        journal_records: Option<u64>,
    ) -> Result<(u64, u32, u64), String> {
        let max_extents = tiercache_engine::log::header_extents(segment_size, line_size);
        // Journal records per half: two per line the raw cache holds (a checkpoint lists
        // every duplicate entry), at least 8192 and 16 segments' worth of extents (it lists
        // the open segments' extents too).
        let records = (2 * device_bytes / line_size)
            .clamp(8192, 1 << 25)
            .max(16 * max_extents as u64);
        let records = match journal_records {
            Some(r) => r.max(8 * max_extents as u64).max(64),
            None => records,
        };
        let g = Self::geometry_for(segment_size, max_extents, records, true);
        if device_bytes < g.seg_area {
            return Err(format!(
                "cache device of {device_bytes} bytes is smaller than its journal"
            ));
        }
        let segments = (device_bytes - g.seg_area) / g.seg_stride;
        Ok((segments, max_extents, records))
    }

    /// `lost_list`: reserve room for the lost-range list after the journal (caches
    /// formatted since it); else the segment area starts where it always did.
    fn geometry_for(
        segment_size: u64,
        max_extents: u32,
        records: u64,
        lost_list: bool,
    ) -> Geometry {
        let half_bytes = HALF_HEADER + (records * REC_BYTES as u64).next_multiple_of(4096);
        let slot_bytes =
            (HDR_FIXED as u64 + HDR_ENTRY as u64 * max_extents as u64).next_multiple_of(4096);
        let journal_end = JOURNAL_OFFSET + 2 * half_bytes;
        let reserve = if lost_list {
            crate::lost_list::BYTES
        } else {
            0
        };
        let seg_area = (journal_end + reserve).next_multiple_of(1 << 20);
        Geometry {
            half_bytes,
            slot_bytes,
            seg_area,
            seg_stride: 2 * slot_bytes + segment_size,
            segment_size,
            lost_list: (seg_area - journal_end >= crate::lost_list::BYTES)
                .then(|| seg_area - crate::lost_list::BYTES),
        }
    }

    pub fn geometry(&self) -> Geometry {
        Self::geometry_for(
            self.segment_size,
            self.max_extents,
            self.journal_records,
            self.lost_list,
        )
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SB_BYTES as usize];
        b[0..8].copy_from_slice(MAGIC);
        let v = if self.lost_pending {
            SB_VERSION_LOST
        } else {
            SB_VERSION
        };
        b[8..12].copy_from_slice(&v.to_le_bytes());
        b[16..24].copy_from_slice(&self.line_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.segment_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.segments.to_le_bytes());
        b[40..44].copy_from_slice(&self.max_extents.to_le_bytes());
        let (kind, level) = match self.compression {
            Compression::None => (0u8, 0i32),
            Compression::Lz4 => (1, 0),
            Compression::Zstd(l) => (2, l),
        };
        b[44] = kind;
        b[45] = Mode::ALL.iter().position(|m| *m == self.mode).unwrap_or(0) as u8;
        b[46] = self.clean as u8;
        b[crate::lost_list::SB_FLAG_AT] = self.lost_list as u8;
        b[48..52].copy_from_slice(&level.to_le_bytes());
        b[56..64].copy_from_slice(&self.dedup_ratio.to_le_bytes());
        b[64..72].copy_from_slice(&self.backing_size.to_le_bytes());
        b[72..80].copy_from_slice(&self.journal_records.to_le_bytes());
        let p = self.picker.as_bytes();
        let n = p.len().min(32);
        b[80..80 + n].copy_from_slice(&p[..n]);
        self.backing
            .encode_into(&mut b[SB_ID_AT..SB_ID_AT + ID_BYTES]);
        b[SB_UUID_AT..SB_UUID_AT + 16].copy_from_slice(&self.uuid);
        // Every field sits in the first 512-byte sector, which carries its checksum: a
        // rewrite (the clean flag) torn between sectors leaves a whole old or new sector 0.
        let crc = crc32c::crc32c(&b[..508]);
        b[508..512].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Whether `b` starts like a log-layout superblock (magic only).
    pub fn is_log(b: &[u8]) -> bool {
        b.len() >= 8 && &b[..8] == MAGIC
    }

    pub fn decode(b: &[u8]) -> io::Result<Self> {
        if b.len() < SB_BYTES as usize || !Self::is_log(b) {
            return Err(bad("not a log-layout cache device (bad magic)".into()));
        }
        let crc = crc32c::crc32c(&b[..508]);
        if crc != u32_at(b, 508) {
            return Err(bad("log superblock checksum mismatch".into()));
        }
        let v = u32_at(b, 8);
        if !(1..=SB_VERSION_LOST).contains(&v) {
            return Err(bad(format!(
                "log layout version {v} is not supported (this build reads 1 to {SB_VERSION_LOST})"
            )));
        }
        let backing = BackingIdentity::decode_from(&b[SB_ID_AT..SB_ID_AT + ID_BYTES])
            .map_err(|e| bad(format!("log superblock: {e}")))?;
        let compression = match b[44] {
            0 => Compression::None,
            1 => Compression::Lz4,
            2 => Compression::Zstd(u32_at(b, 48) as i32),
            k => return Err(bad(format!("unknown compression {k} in the superblock"))),
        };
        let mode = *Mode::ALL
            .get(b[45] as usize)
            .ok_or_else(|| bad("bad mode in the superblock".into()))?;
        let end = b[80..112].iter().position(|&c| c == 0).unwrap_or(32);
        let sb = LogSuperblock {
            line_size: u64_at(b, 16),
            segment_size: u64_at(b, 24),
            segments: u64_at(b, 32),
            max_extents: u32_at(b, 40),
            compression,
            dedup_ratio: f64::from_le_bytes(b[56..64].try_into().unwrap()),
            picker: String::from_utf8_lossy(&b[80..80 + end]).into_owned(),
            mode,
            backing_size: u64_at(b, 64),
            journal_records: u64_at(b, 72),
            clean: b[46] != 0,
            backing,
            uuid: if v >= 3 {
                b[SB_UUID_AT..SB_UUID_AT + 16].try_into().unwrap()
            } else {
                [0; 16]
            },
            lost_list: b[crate::lost_list::SB_FLAG_AT] == 1,
            lost_pending: v == SB_VERSION_LOST,
        };
        if sb.lost_pending && !sb.lost_list {
            return Err(bad(format!(
                "log superblock version {v} (lost ranges listed) without the list's flag"
            )));
        }
        if !sb.line_size.is_power_of_two()
            || sb.segment_size < sb.line_size
            || sb.max_extents == 0
            || sb.journal_records == 0
        {
            return Err(bad(format!("log superblock fields invalid: {sb:?}")));
        }
        Ok(sb)
    }
}

/// One extent in a segment header (or a journal base record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ext {
    pub key: u64,
    pub hash: Hash,
    pub off: u32,
    pub len: u32,
    pub dirty: bool,
    pub compressed: bool,
    /// The extent is its key's current base (false: superseded; kept as a duplicate target).
    pub live: bool,
    pub crc: u32,
    pub seq: u64,
}

/// A decoded segment header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegHeader {
    pub seg: u32,
    pub gen: u32,
    pub hseq: u64,
    pub sealed: bool,
    pub exts: Vec<Ext>,
}

impl SegHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HDR_FIXED + HDR_ENTRY * self.exts.len()];
        b[0..8].copy_from_slice(SEG_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.seg.to_le_bytes());
        b[16..20].copy_from_slice(&self.gen.to_le_bytes());
        b[20..24].copy_from_slice(&(self.exts.len() as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.hseq.to_le_bytes());
        b[32] = self.sealed as u8;
        for (i, e) in self.exts.iter().enumerate() {
            let o = HDR_FIXED + HDR_ENTRY * i;
            let x = &mut b[o..o + HDR_ENTRY];
            x[0..8].copy_from_slice(&e.key.to_le_bytes());
            x[8..40].copy_from_slice(&e.hash);
            x[40..44].copy_from_slice(&e.off.to_le_bytes());
            x[44..48].copy_from_slice(&e.len.to_le_bytes());
            x[48] = e.dirty as u8 | (e.compressed as u8) << 1 | (e.live as u8) << 2;
            x[52..56].copy_from_slice(&e.crc.to_le_bytes());
            x[56..64].copy_from_slice(&e.seq.to_le_bytes());
        }
        let crc = Self::crc(&b);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn crc(b: &[u8]) -> u32 {
        let c = crc32c::crc32c(&b[..40]);
        crc32c::crc32c_append(c, &b[44..])
    }

    /// Entries a header of `fixed` (its first [`HDR_FIXED`] bytes) announces, if it looks
    /// like one (to read the rest).
    pub fn count(fixed: &[u8]) -> Option<usize> {
        (fixed.len() >= HDR_FIXED && &fixed[0..8] == SEG_MAGIC).then(|| u32_at(fixed, 20) as usize)
    }

    /// Decodes a header for segment `seg`; None when torn, foreign or never written.
    pub fn decode(b: &[u8], seg: u32, max_extents: u32) -> Option<SegHeader> {
        let n = Self::count(b)?;
        if n > max_extents as usize || b.len() < HDR_FIXED + n * HDR_ENTRY {
            return None;
        }
        let b = &b[..HDR_FIXED + n * HDR_ENTRY];
        if u32_at(b, 8) != VERSION || u32_at(b, 12) != seg || Self::crc(b) != u32_at(b, 40) {
            return None;
        }
        let exts = (0..n)
            .map(|i| {
                let x = &b[HDR_FIXED + HDR_ENTRY * i..HDR_FIXED + HDR_ENTRY * (i + 1)];
                Ext {
                    key: u64_at(x, 0),
                    hash: x[8..40].try_into().unwrap(),
                    off: u32_at(x, 40),
                    len: u32_at(x, 44),
                    dirty: x[48] & 1 != 0,
                    compressed: x[48] & 2 != 0,
                    live: x[48] & 4 != 0,
                    crc: u32_at(x, 52),
                    seq: u64_at(x, 56),
                }
            })
            .collect();
        Some(SegHeader {
            seg,
            gen: u32_at(b, 16),
            hseq: u64_at(b, 24),
            sealed: b[32] != 0,
            exts,
        })
    }
}

/// A journal record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rec {
    /// An extent of a segment not sealed yet (its bytes were synced before the record).
    Base { seg: u32, gen: u32, ext: Ext },
    /// `key` is a duplicate of the extent at (`seg`, `gen`, `off`).
    Dup {
        key: u64,
        seg: u32,
        gen: u32,
        off: u32,
        dirty: bool,
        seq: u64,
    },
    /// `key` is not cached (trimmed, or evicted when its segment was reclaimed).
    Drop { key: u64, seq: u64 },
    /// A clean shutdown's last record: the journal ends here.
    End { seq: u64 },
}

/// The record indices one journal write covered (`start..end`; zero in records written
/// before frames existed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub start: u32,
    pub end: u32,
}

/// Half header flag: the half's records carry frames, and a clean shutdown ends it with
/// [`Rec::End`].
pub const HALF_FRAMED: u8 = 1;

impl Rec {
    pub fn seq(&self) -> u64 {
        match self {
            Rec::Base { ext, .. } => ext.seq,
            Rec::Dup { seq, .. } | Rec::Drop { seq, .. } | Rec::End { seq } => *seq,
        }
    }

    /// The line key (0 for an end record).
    pub fn key(&self) -> u64 {
        match self {
            Rec::Base { ext, .. } => ext.key,
            Rec::Dup { key, .. } | Rec::Drop { key, .. } => *key,
            Rec::End { .. } => 0,
        }
    }

    /// Encodes without a frame (as records were before frames existed).
    pub fn encode(&self, epoch: u64, out: &mut Vec<u8>) {
        self.encode_framed(epoch, Frame::default(), out)
    }

    pub fn encode_framed(&self, epoch: u64, frame: Frame, out: &mut Vec<u8>) {
        let mut b = [0u8; REC_BYTES];
        b[0..2].copy_from_slice(&REC_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq().to_le_bytes());
        b[24..32].copy_from_slice(&self.key().to_le_bytes());
        match *self {
            Rec::Base { seg, gen, ext } => {
                b[2] = 1;
                b[3] = ext.dirty as u8 | (ext.compressed as u8) << 1 | (ext.live as u8) << 2;
                b[4..8].copy_from_slice(&seg.to_le_bytes());
                b[32..36].copy_from_slice(&gen.to_le_bytes());
                b[36..40].copy_from_slice(&ext.off.to_le_bytes());
                b[40..44].copy_from_slice(&ext.len.to_le_bytes());
                b[44..48].copy_from_slice(&ext.crc.to_le_bytes());
                b[48..80].copy_from_slice(&ext.hash);
            }
            Rec::Dup {
                seg,
                gen,
                off,
                dirty,
                ..
            } => {
                b[2] = 2;
                b[3] = dirty as u8;
                b[4..8].copy_from_slice(&seg.to_le_bytes());
                b[32..36].copy_from_slice(&gen.to_le_bytes());
                b[36..40].copy_from_slice(&off.to_le_bytes());
            }
            Rec::Drop { .. } => b[2] = 3,
            Rec::End { .. } => b[2] = 4,
        }
        b[80..84].copy_from_slice(&frame.start.to_le_bytes());
        b[84..88].copy_from_slice(&frame.end.to_le_bytes());
        let crc = crc32c::crc32c(&b[..92]);
        b[92..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes a record of `epoch`; None when torn, stale (another epoch) or empty.
    pub fn decode(b: &[u8], epoch: u64) -> Option<Rec> {
        Self::decode_framed(b, epoch).map(|(r, _)| r)
    }

    /// As [`Rec::decode`], with the record's frame.
    pub fn decode_framed(b: &[u8], epoch: u64) -> Option<(Rec, Frame)> {
        if b.len() < REC_BYTES
            || u16::from_le_bytes([b[0], b[1]]) != REC_MAGIC
            || crc32c::crc32c(&b[..92]) != u32_at(b, 92)
            || u64_at(b, 8) != epoch
        {
            return None;
        }
        let seq = u64_at(b, 16);
        let key = u64_at(b, 24);
        let seg = u32_at(b, 4);
        let gen = u32_at(b, 32);
        let off = u32_at(b, 36);
        let frame = Frame {
            start: u32_at(b, 80),
            end: u32_at(b, 84),
        };
        let rec = match b[2] {
            1 => Rec::Base {
                seg,
                gen,
                ext: Ext {
                    key,
                    hash: b[48..80].try_into().unwrap(),
                    off,
                    len: u32_at(b, 40),
                    dirty: b[3] & 1 != 0,
                    compressed: b[3] & 2 != 0,
                    live: b[3] & 4 != 0,
                    crc: u32_at(b, 44),
                    seq,
                },
            },
            2 => Rec::Dup {
                key,
                seg,
                gen,
                off,
                dirty: b[3] & 1 != 0,
                seq,
            },
            3 => Rec::Drop { key, seq },
            4 => Rec::End { seq },
            _ => return None,
        };
        Some((rec, frame))
    }
}

/// A journal half's header: the epoch its records carry (and the flags, [`HALF_FRAMED`]).
/// The half with the highest valid epoch is the journal.
pub fn encode_half(epoch: u64) -> Vec<u8> {
    let mut b = vec![0u8; HALF_HEADER as usize];
    b[0..8].copy_from_slice(HALF_MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&epoch.to_le_bytes());
    b[24] = HALF_FRAMED;
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    b
}

pub fn decode_half(b: &[u8]) -> Option<u64> {
    decode_half_flags(b).map(|(e, _)| e)
}

/// The epoch and flags of a valid half header.
pub fn decode_half_flags(b: &[u8]) -> Option<(u64, u8)> {
    (b.len() >= HALF_HEADER as usize
        && &b[0..8] == HALF_MAGIC
        && u32_at(b, 8) == VERSION
        && crc32c::crc32c(&b[..4092]) == u32_at(b, 4092))
    .then(|| (u64_at(b, 16), b[24]))
}

/// Whether a header slot holds bytes that start like a segment header (its magic) but do
/// not decode for segment `seg`: torn by a crash, or damaged.
pub fn header_damaged(b: &[u8], seg: u32, max_extents: u32) -> bool {
    SegHeader::count(b).is_some() && SegHeader::decode(b, seg, max_extents).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(i: u64) -> Ext {
        Ext {
            key: i,
            hash: [i as u8; 32],
            off: i as u32 * 100,
            len: 100,
            dirty: i.is_multiple_of(2),
            compressed: i.is_multiple_of(3),
            live: !i.is_multiple_of(5),
            crc: i as u32 * 7,
            seq: i + 1000,
        }
    }

    #[test]
    fn headers_and_records_round_trip_and_reject_damage() {
        let h = SegHeader {
            seg: 3,
            gen: 9,
            hseq: 77,
            sealed: true,
            exts: (0..10).map(ext).collect(),
        };
        let mut b = h.encode();
        assert_eq!(SegHeader::decode(&b, 3, 16), Some(h.clone()));
        assert_eq!(
            SegHeader::decode(&b, 4, 16),
            None,
            "another segment's header"
        );
        assert_eq!(SegHeader::decode(&b, 3, 5), None, "more entries than fit");
        b[HDR_FIXED + 70] ^= 1;
        assert_eq!(SegHeader::decode(&b, 3, 16), None, "flipped bit");
        let recs = [
            Rec::Base {
                seg: 1,
                gen: 2,
                ext: ext(4),
            },
            Rec::Dup {
                key: 5,
                seg: 1,
                gen: 2,
                off: 400,
                dirty: true,
                seq: 1100,
            },
            Rec::Drop { key: 6, seq: 1101 },
            Rec::End { seq: 1102 },
        ];
        let mut out = Vec::new();
        let frame = Frame { start: 7, end: 11 };
        for r in &recs {
            r.encode_framed(3, frame, &mut out);
        }
        for (i, r) in recs.iter().enumerate() {
            let b = &out[i * REC_BYTES..];
            assert_eq!(Rec::decode_framed(b, 3), Some((*r, frame)));
            assert_eq!(Rec::decode(b, 3), Some(*r));
            assert_eq!(Rec::decode(b, 4), None, "stale epoch");
        }
        out[5] ^= 0x10;
        assert_eq!(Rec::decode(&out, 3), None);
        assert_eq!(decode_half(&encode_half(12)), Some(12));
        assert_eq!(decode_half_flags(&encode_half(12)), Some((12, HALF_FRAMED)));
        let sb = LogSuperblock {
            line_size: 4096,
            segment_size: 1 << 20,
            segments: 10,
            max_extents: 1024,
            compression: Compression::Zstd(5),
            dedup_ratio: 0.5,
            picker: "lru".into(),
            mode: Mode::WriteBack,
            backing_size: 1 << 30,
            journal_records: 8192,
            clean: true,
            backing: BackingIdentity::nbd("nbd+unix:///disk?socket=/run/x.sock"),
            uuid: [7; 16],
            lost_list: true,
            lost_pending: false,
        };
        assert_eq!(LogSuperblock::decode(&sb.encode()).unwrap(), sb);
        // A version-1 superblock (zeroes where the identity is) opens, identity unknown.
        let mut v1 = LogSuperblock {
            backing: BackingIdentity::unknown(""),
            uuid: [0; 16],
            lost_list: false,
            ..sb.clone()
        }
        .encode();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert!(v1[SB_ID_AT..508].iter().all(|&x| x == 0));
        let crc = crc32c::crc32c(&v1[..508]);
        v1[508..512].copy_from_slice(&crc.to_le_bytes());
        assert!(LogSuperblock::decode(&v1).unwrap().backing.is_unknown());
        let mut b = sb.encode();
        b[20] ^= 1;
        assert!(LogSuperblock::decode(&b).is_err());
        // Lost ranges listed: version 4, which builds before it refuse.
        let lost = LogSuperblock {
            lost_pending: true,
            ..sb.clone()
        };
        let b = lost.encode();
        assert_eq!(u32_at(&b, 8), SB_VERSION_LOST);
        assert_eq!(LogSuperblock::decode(&b).unwrap(), lost);
        let orphan = LogSuperblock {
            lost_list: false,
            ..lost
        };
        assert!(LogSuperblock::decode(&orphan.encode()).is_err());
    }
}
