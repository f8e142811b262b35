//! Alibaba Cloud block traces (2020) CSV, no header:
//! `device_id,opcode,offset,length,timestamp` — opcode `R`/`W`, offset and length in bytes,
//! timestamp in microseconds. Volume = device_id.

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["device_id", "opcode", "offset", "length", "timestamp"];

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.str(1)? {
        "R" | "r" => Op::Read,
        "W" | "w" => Op::Write,
        other => return Err(format!("column 2 (opcode): '{other}' is not R or W")),
    };
    let mut r = req(mul(f.u64(4)?, 1000, "timestamp")?, op, f.u64(2)?, f.u64(3)?);
    r.volume = f.u64(0)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = if r.op == Op::Write { "W" } else { "R" };
    writeln!(
        w,
        "{},{ty},{},{},{}",
        r.volume,
        r.offset,
        r.len,
        r.time_ns / 1000
    )
}
