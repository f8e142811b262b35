//! SYSTOR '17 VDI traces (SNIA IOTTA) CSV with header
//! `Timestamp,Response,IOType,LUN,Offset,Size`: epoch seconds (float), response seconds,
//! `R`/`W`, LUN, offset and size in bytes. Volume = LUN.

use super::{req, secs_to_ns, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["Timestamp", "Response", "IOType", "LUN", "Offset", "Size"];
pub const HEADER: &str = "Timestamp,Response,IOType,LUN,Offset,Size";

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    if line.starts_with("Timestamp") {
        return Ok(None);
    }
    let f = Fields::csv(line, NAMES);
    f.need(6)?;
    let op = match f.str(2)? {
        "R" | "r" => Op::Read,
        "W" | "w" => Op::Write,
        other => return Err(format!("column 3 (IOType): '{other}' is not R or W")),
    };
    let mut r = req(secs_to_ns(f.f64(0)?)?, op, f.u64(4)?, f.u64(5)?);
    r.volume = f.u64(3)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = if r.op == Op::Write { "W" } else { "R" };
    let t = r.time_ns;
    writeln!(
        w,
        "{}.{:09},0.000000000,{ty},{},{},{}",
        t / 1_000_000_000,
        t % 1_000_000_000,
        r.volume,
        r.offset,
        r.len
    )
}
