//! VMware vscsi trace, version 1: 32-byte little-endian records
//! `<u32 sn, u32 len_bytes, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts_us>` — `ver` is
//! 0x01xx, `cmd` a SCSI opcode (see [`super::lcs_csv::scsi_op`]), lbn in 512-byte sectors,
//! timestamps in microseconds. Version 2 (a different record layout) is refused with a
//! message.

use super::{lcs_csv::scsi_code, lcs_csv::scsi_op, Ctx};
use std::io::{self, Write};
use tiercache_engine::Request;

pub const RECORD: usize = 32;

/// Whether a record looks like vscsi v1 (version field 0x01xx, known command).
pub fn plausible(rec: &[u8]) -> bool {
    rec.len() >= RECORD
        && rec[15] == 0x01
        && scsi_op(u16::from_le_bytes([rec[12], rec[13]]) as u64).is_some()
}

pub fn parse(rec: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let len = u32::from_le_bytes(rec[4..8].try_into().expect("record"));
    let cmd = u16::from_le_bytes([rec[12], rec[13]]);
    let ver = u16::from_le_bytes([rec[14], rec[15]]);
    if ver >> 8 != 1 {
        return Err(format!(
            "vscsi version field {ver:#06x}: only version 1 (0x01xx) records are supported"
        ));
    }
    let lbn = u64::from_le_bytes(rec[16..24].try_into().expect("record"));
    let ts = u64::from_le_bytes(rec[24..32].try_into().expect("record"));
    let op = scsi_op(cmd as u64)
        .ok_or_else(|| format!("SCSI command {cmd:#04x} is not a read, write, flush or unmap"))?;
    let offset = lbn
        .checked_mul(512)
        .ok_or_else(|| format!("lbn {lbn} overflows"))?;
    Ok(Some(Request::new(
        ts.saturating_mul(1000),
        op,
        offset,
        len as u64,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, sn: u32) -> io::Result<()> {
    let mut rec = [0u8; RECORD];
    rec[0..4].copy_from_slice(&sn.to_le_bytes());
    rec[4..8].copy_from_slice(&(r.len as u32).to_le_bytes());
    rec[8..12].copy_from_slice(&1u32.to_le_bytes());
    rec[12..14].copy_from_slice(&scsi_code(r.op).to_le_bytes());
    rec[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
    rec[16..24].copy_from_slice(&(r.offset / 512).to_le_bytes());
    rec[24..32].copy_from_slice(&(r.time_ns / 1000).to_le_bytes());
    w.write_all(&rec)
}
