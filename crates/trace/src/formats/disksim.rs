//! DiskSim ASCII traces as shipped with MQSim, whitespace-separated:
//! `arrival_time device start_sector size_sectors type`.
//!
//! - arrival_time: **nanoseconds** here. MQSim's traces (e.g. `wsrch-small.trace`, whose
//!   first arrivals are 11,413,000 .. apart by ~150 us) use ns; classic DiskSim files use
//!   milliseconds with decimals — read as `disksim` they come out 10^6 times too fast, so
//!   convert them first. A fractional part is accepted and truncated.
//! - 512-byte sectors; type is DiskSim's flag word, bit 0 set = read (`1`), clear = write
//!   (`0`).
//! - Volume = device; class 0.
//!
//! The writer rounds offsets down and sizes up to whole sectors; trims and flushes are
//! dropped.

use super::{is_dec, is_int, mul, ws_fields, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &[
    "arrival_time",
    "device",
    "start_sector",
    "size_sectors",
    "type",
];

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    if line.first() == Some(&b'#') {
        return Ok(None);
    }
    let f = Fields::ws(line, NAMES);
    if f.len() == 0 {
        return Ok(None);
    }
    f.need(5)?;
    let op = if f.u64(4)? & 1 == 1 {
        Op::Read
    } else {
        Op::Write
    };
    let mut r = Request::new(
        f.scaled(0, 0)?,
        op,
        mul(f.u64(2)?, 512, "start_sector")?,
        mul(f.u64(3)?, 512, "size_sectors")?,
    );
    r.volume = f.u32(1)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => 1,
        Op::Write => 0,
        _ => return Ok(Written::Dropped),
    };
    let first = r.offset / 512;
    writeln!(
        w,
        "{} {} {first} {} {ty}",
        r.time_ns,
        r.volume,
        r.end().div_ceil(512) - first
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let w = ws_fields(line);
    w.len() == 5 && is_dec(w[0]) && w[1..].iter().all(|b| is_int(b))
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "disksim",
    aliases: &["mqsim"],
    description: "DiskSim/MQSim ASCII: arrival_ns device start_sector size_sectors type(1 r/0 w)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["mqsim", "disksim"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
