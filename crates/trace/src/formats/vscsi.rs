//! VMware vscsi traces (CloudPhysics; as read by libCacheSim), little-endian binary records
//! of two versions, told apart by the version field's high byte:
//!
//! - v1, 32 bytes: `<u32 sn, u32 len_bytes, u32 nSG, u16 cmd, u16 ver (0x01xx), u64 lbn,
//!   u64 ts_us>`
//! - v2, 40 bytes: `<u16 cmd, u16 ver (0x02xx), u32 sn, u32 len_bytes, u32 nSG, u64 lbn,
//!   u64 ts_us, u64 rt>` (layout of libCacheSim's `trace_v2_record_t`; rt, the response
//!   time, is ignored).
//!
//! The first record decides the version (v1 if byte 15 is 0x01, else v2 if byte 3 is 0x02);
//! every later record must carry the same version. `cmd` is a SCSI opcode (see
//! [`super::lcs_csv::scsi_op`]; others are errors, skippable with `skip_bad`), lbn in
//! 512-byte sectors, timestamps in microseconds. Volume 0, class 0.
//!
//! The writer writes v1 records (sn counting from 1, nSG 1), rounding offsets down to
//! sectors (keeping the end); lengths must fit in u32.

use super::{lcs_csv::scsi_code, lcs_csv::scsi_op, Ctx, Written};
use std::io::{self, Write};
use tiercache_engine::Request;

pub const RECORD_V1: usize = 32;
pub const RECORD_V2: usize = 40;

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

/// The record size of a trace from its first 32 bytes, or why it is not vscsi.
pub fn record_size(first: &[u8]) -> Result<usize, String> {
    if first.len() >= RECORD_V1 && first[15] == 0x01 {
        Ok(RECORD_V1)
    } else if first.len() >= 4 && first[3] == 0x02 {
        Ok(RECORD_V2)
    } else {
        Err(format!(
            "not a vscsi record: no version 1 (byte 15 = {:#04x}) or version 2 (byte 3 = {:#04x}) \
             marker",
            first.get(15).copied().unwrap_or(0),
            first.get(3).copied().unwrap_or(0)
        ))
    }
}

/// Whether the first records look like vscsi (of either version) with known commands.
pub fn plausible(head: &[u8]) -> bool {
    let Ok(size) = record_size(head) else {
        return false;
    };
    let n = (head.len() / size).min(64);
    n > 0
        && (0..n).all(|i| {
            let r = &head[i * size..(i + 1) * size];
            let (cmd, ver) = if size == RECORD_V1 {
                (u16_at(r, 12), u16_at(r, 14))
            } else {
                (u16_at(r, 0), u16_at(r, 2))
            };
            let want = if size == RECORD_V1 { 1 } else { 2 };
            ver >> 8 == want && scsi_op(cmd as u64).is_some()
        })
}

pub fn parse(rec: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let (len, cmd, ver, lbn, ts) = if rec.len() == RECORD_V1 {
        (
            u32_at(rec, 4),
            u16_at(rec, 12),
            u16_at(rec, 14),
            u64_at(rec, 16),
            u64_at(rec, 24),
        )
    } else {
        (
            u32_at(rec, 8),
            u16_at(rec, 0),
            u16_at(rec, 2),
            u64_at(rec, 16),
            u64_at(rec, 24),
        )
    };
    let want = if rec.len() == RECORD_V1 { 1 } else { 2 };
    if ver >> 8 != want {
        return Err(format!(
            "version field {ver:#06x} in a version {want} trace (corrupt or misaligned record)"
        ));
    }
    let op = scsi_op(cmd as u64).ok_or_else(|| {
        format!("SCSI command {cmd:#04x} is not a read, write, synchronize cache or unmap")
    })?;
    let offset = lbn
        .checked_mul(512)
        .ok_or_else(|| format!("lbn {lbn} x 512 overflows"))?;
    Ok(Some(Request::new(
        ts.saturating_mul(1000),
        op,
        offset,
        len as u64,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx, sn: u32) -> io::Result<Written> {
    let lbn = r.offset / 512;
    let len = u32::try_from(r.end() - lbn * 512).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("request of {} bytes does not fit vscsi's u32 length", r.len),
        )
    })?;
    let mut rec = [0u8; RECORD_V1];
    rec[0..4].copy_from_slice(&sn.to_le_bytes());
    rec[4..8].copy_from_slice(&len.to_le_bytes());
    rec[8..12].copy_from_slice(&1u32.to_le_bytes());
    rec[12..14].copy_from_slice(&scsi_code(r.op).to_le_bytes());
    rec[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
    rec[16..24].copy_from_slice(&lbn.to_le_bytes());
    rec[24..32].copy_from_slice(&(r.time_ns / 1000).to_le_bytes());
    w.write_all(&rec)?;
    Ok(Written::Yes)
}

/// Encodes one version 2 record (for tests and tools that need v2 input).
pub fn encode_v2(r: &Request, sn: u32) -> [u8; RECORD_V2] {
    let mut rec = [0u8; RECORD_V2];
    rec[0..2].copy_from_slice(&scsi_code(r.op).to_le_bytes());
    rec[2..4].copy_from_slice(&0x0200u16.to_le_bytes());
    rec[4..8].copy_from_slice(&sn.to_le_bytes());
    rec[8..12].copy_from_slice(&(r.len as u32).to_le_bytes());
    rec[12..16].copy_from_slice(&1u32.to_le_bytes());
    rec[16..24].copy_from_slice(&(r.offset / 512).to_le_bytes());
    rec[24..32].copy_from_slice(&(r.time_ns / 1000).to_le_bytes());
    rec
}

fn write_one(
    _: &mut super::WriteState,
    w: &mut dyn Write,
    r: &Request,
    c: &Ctx,
    n: u64,
) -> io::Result<Written> {
    write(w, r, c, n as u32)
}

/// This format's registry entry (version 1 records are written; the first record read
/// decides the version).
pub const SPEC: super::Spec = super::Spec {
    name: "vscsi",
    aliases: &[],
    description: "VMware vscsi binary, v1 (32 B records) or v2 (40 B): SCSI opcode, len, lbn (sectors), ts_us",
    has_op: true,
    record_size: RECORD_V1,
    first_record: Some(record_size),
    header: None,
    detect_header: None,
    name_hints: &["vscsi"],
    fits: plausible,
    decides_alone: false,
    trust_name: true,
    parse,
    write: Some(write_one),
    finish: None,
};
