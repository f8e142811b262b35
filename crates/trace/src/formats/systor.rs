//! SYSTOR '17 VDI traces (SNIA IOTTA; Lee et al., SYSTOR '17) CSV with header
//! `Timestamp,Response,IOType,LUN,Offset,Size`.
//!
//! - Timestamp: epoch seconds with decimals (converted to ns exactly); Response (s) ignored.
//! - IOType `R` / `W`; Offset and Size in bytes.
//! - Volume = LUN; class 0.
//!
//! The writer writes the header and response 0; trims and flushes are dropped.

use super::{csv_fields, is_dec, is_int, is_rw, write_secs, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["Timestamp", "Response", "IOType", "LUN", "Offset", "Size"];
pub const HEADER: &str = "Timestamp,Response,IOType,LUN,Offset,Size";

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    if line.starts_with(b"Timestamp") {
        return Ok(None);
    }
    let f = Fields::csv(line, NAMES);
    f.need(6)?;
    let op = match f.bytes(2)? {
        b"R" | b"r" => Op::Read,
        b"W" | b"w" => Op::Write,
        _ => return Err(f.err(2, "is not R or W")),
    };
    let mut r = Request::new(f.scaled(0, 9)?, op, f.u64(4)?, f.u64(5)?);
    r.volume = f.u32(3)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => "R",
        Op::Write => "W",
        _ => return Ok(Written::Dropped),
    };
    write_secs(w, r.time_ns)?;
    writeln!(w, ",0.000000,{ty},{},{},{}", r.volume, r.offset, r.len)?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() == 6 && is_dec(c[0]) && is_rw(c[2]) && c[3..].iter().all(|b| is_int(b))
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "systor",
    aliases: &["systor17"],
    description: "SYSTOR'17 CSV: Timestamp,Response,IOType,LUN,Offset,Size (header)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: Some(HEADER),
    detect_header: Some("Timestamp,Response,IOType"),
    name_hints: &["systor"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
