//! SPC / UMass trace repository CSV (Financial1/2, WebSearch1-3):
//! `ASU,LBA,Size,Opcode,Timestamp[,...]`.
//!
//! - ASU: application storage unit; LBA in 512-byte sectors; Size in bytes.
//! - Opcode `r` / `w` (either case); Timestamp in seconds with decimals. Further columns
//!   (some files carry more) are ignored.
//! - Volume = ASU; class 0.
//!
//! The writer rounds offsets down to sectors (keeping the end) and drops trims and flushes.

use super::{csv_fields, is_dec, is_int, is_rw, mul, write_secs, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["ASU", "LBA", "Size", "Opcode", "Timestamp"];

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.bytes(3)? {
        b"r" | b"R" => Op::Read,
        b"w" | b"W" => Op::Write,
        _ => return Err(f.err(3, "is not r or w")),
    };
    let mut r = Request::new(f.scaled(4, 9)?, op, mul(f.u64(1)?, 512, "LBA")?, f.u64(2)?);
    r.volume = f.u32(0)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => "r",
        Op::Write => "w",
        _ => return Ok(Written::Dropped),
    };
    let lba = r.offset / 512;
    write!(w, "{},{lba},{},{ty},", r.volume, r.end() - lba * 512)?;
    write_secs(w, r.time_ns)?;
    w.write_all(b"\n")?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() >= 5 && c[..3].iter().all(|b| is_int(b)) && is_rw(c[3]) && is_dec(c[4])
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "spc",
    aliases: &["umass"],
    description: "SPC/UMass CSV: ASU,LBA(sectors),Size(bytes),Opcode(r/w),Timestamp(s)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["spc", "umass", "financial", "websearch"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
