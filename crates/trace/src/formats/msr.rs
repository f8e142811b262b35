//! MSR Cambridge (SNIA IOTTA; Narayanan et al., FAST '08) CSV, no header:
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`.
//!
//! - Timestamp: Windows FILETIME, 100 ns ticks since 1601 (only differences matter: the
//!   reader makes times relative to the first record).
//! - Type: `Read` / `Write` (any case). Offset and Size in bytes. ResponseTime (100 ns ticks)
//!   is ignored.
//! - Volume = DiskNumber; class 0.
//!
//! The writer writes host `tiercache` and response time 0; trims and flushes are dropped.

use super::{csv_fields, is_int, mul, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &[
    "Timestamp",
    "Hostname",
    "DiskNumber",
    "Type",
    "Offset",
    "Size",
    "ResponseTime",
];

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(6)?;
    let ty = f.bytes(3)?;
    let op = if ty.eq_ignore_ascii_case(b"Read") {
        Op::Read
    } else if ty.eq_ignore_ascii_case(b"Write") {
        Op::Write
    } else {
        return Err(f.err(3, "is not Read or Write"));
    };
    let t = mul(f.u64(0)?, 100, "Timestamp")?;
    let mut r = Request::new(t, op, f.u64(4)?, f.u64(5)?);
    r.volume = f.u32(2)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => "Read",
        Op::Write => "Write",
        _ => return Ok(Written::Dropped),
    };
    writeln!(
        w,
        "{},tiercache,{},{ty},{},{},0",
        r.time_ns / 100,
        r.volume,
        r.offset,
        r.len
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() >= 6
        && is_int(c[0])
        && (c[3].eq_ignore_ascii_case(b"read") || c[3].eq_ignore_ascii_case(b"write"))
        && is_int(c[4])
        && is_int(c[5])
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "msr",
    aliases: &["msr-cambridge"],
    description:
        "MSR Cambridge CSV: Timestamp(FILETIME),Hostname,DiskNumber,Type,Offset,Size,ResponseTime",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["msr"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
