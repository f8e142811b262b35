//! MSR Cambridge (SNIA IOTTA) CSV, no header:
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime` — Timestamp in Windows
//! FILETIME ticks (100 ns), Type `Read`/`Write`, Offset and Size in bytes.
//! Volume = DiskNumber. Written back with hostname `tc` and response time 0.

use super::{mul, req, Ctx, Fields};
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

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(6)?;
    let t = mul(f.u64(0)?, 100, "timestamp")?;
    let op = match f.str(3)?.to_ascii_lowercase().as_str() {
        "read" | "r" => Op::Read,
        "write" | "w" => Op::Write,
        other => return Err(format!("column 4 (Type): '{other}' is not Read or Write")),
    };
    let mut r = req(t, op, f.u64(4)?, f.u64(5)?);
    r.volume = f.u64(2)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = if r.op == Op::Write { "Write" } else { "Read" };
    writeln!(
        w,
        "{},tc,{},{},{},{},0",
        r.time_ns / 100,
        r.volume,
        ty,
        r.offset,
        r.len
    )
}
