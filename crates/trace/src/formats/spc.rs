//! SPC / UMass trace repository CSV: `ASU,LBA,Size,Opcode,Timestamp[,...]` — LBA in 512-byte
//! sectors, Size in bytes, Opcode `r`/`w` (either case), Timestamp in seconds (float). Extra
//! columns are ignored. Volume = ASU.

use super::{mul, req, secs_to_ns, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["ASU", "LBA", "Size", "Opcode", "Timestamp"];

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.str(3)? {
        "r" | "R" => Op::Read,
        "w" | "W" => Op::Write,
        other => return Err(format!("column 4 (Opcode): '{other}' is not r or w")),
    };
    let mut r = req(
        secs_to_ns(f.f64(4)?)?,
        op,
        mul(f.u64(1)?, 512, "LBA")?,
        f.u64(2)?,
    );
    r.volume = f.u64(0)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = if r.op == Op::Write { "w" } else { "r" };
    let t = r.time_ns;
    writeln!(
        w,
        "{},{},{},{ty},{}.{:09}",
        r.volume,
        r.offset / 512,
        r.len,
        t / 1_000_000_000,
        t % 1_000_000_000
    )
}
