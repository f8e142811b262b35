//! Alibaba Cloud block traces (Li et al., IISWC '20) CSV, no header:
//! `device_id,opcode,offset,length,timestamp`.
//!
//! - opcode `R` / `W`; offset and length in bytes; timestamp in microseconds.
//! - Volume = device_id; class 0.
//!
//! The writer rounds times down to microseconds; trims and flushes are dropped.

use super::{csv_fields, is_int, is_rw, mul, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["device_id", "opcode", "offset", "length", "timestamp"];

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.bytes(1)? {
        b"R" | b"r" => Op::Read,
        b"W" | b"w" => Op::Write,
        _ => return Err(f.err(1, "is not R or W")),
    };
    let t = mul(f.u64(4)?, 1000, "timestamp")?;
    let mut r = Request::new(t, op, f.u64(2)?, f.u64(3)?);
    r.volume = f.u32(0)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => "R",
        Op::Write => "W",
        _ => return Ok(Written::Dropped),
    };
    writeln!(
        w,
        "{},{ty},{},{},{}",
        r.volume,
        r.offset,
        r.len,
        r.time_ns / 1000
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() == 5 && is_rw(c[1]) && is_int(c[0]) && c[2..].iter().all(|b| is_int(b))
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "alibaba",
    aliases: &["ali"],
    description: "Alibaba block CSV: device_id,opcode(R/W),offset,length,timestamp(us)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["alibaba"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
