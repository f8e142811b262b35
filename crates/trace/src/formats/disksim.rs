//! DiskSim ASCII traces as shipped with MQSim: whitespace-separated
//! `arrival_time device start_sector size_sectors type` — arrival in nanoseconds (MQSim's
//! convention; classic DiskSim files use milliseconds: scale them before use), 512-byte
//! sectors, type `1` read / `0` write (DiskSim's flag bit 0). Volume = device.

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &[
    "arrival_ns",
    "device",
    "start_sector",
    "size_sectors",
    "type",
];

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let f = Fields::ws(t, NAMES);
    f.need(5)?;
    let flags = f.u64(4)?;
    let op = if flags & 1 == 1 { Op::Read } else { Op::Write };
    let time = f.f64(0)?;
    if time < 0.0 {
        return Err(format!("column 1 (arrival_ns): {time} is negative"));
    }
    let mut r = req(
        time as u64,
        op,
        mul(f.u64(2)?, 512, "start_sector")?,
        mul(f.u64(3)?, 512, "size")?,
    );
    r.volume = f.u64(1)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = u8::from(r.op != Op::Write);
    writeln!(
        w,
        "{} {} {} {} {ty}",
        r.time_ns,
        r.volume,
        r.offset / 512,
        r.len.div_ceil(512)
    )
}
