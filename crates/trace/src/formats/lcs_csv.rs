//! libCacheSim's block CSV as in its CloudPhysics sample: header `version,time,op,size,lbn`;
//! time in seconds, op a SCSI opcode in hex (`28`/`88`/`a8`/`08` read, `2a`/`8a`/`aa`/`0a`
//! write, `35`/`91` synchronize cache -> flush, `42` unmap -> trim), size in bytes, lbn the
//! start sector (512 B).

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["version", "time", "op", "size", "lbn"];
pub const HEADER: &str = "version,time,op,size,lbn";

/// The operation of a SCSI command code, if it is one we model.
pub fn scsi_op(code: u64) -> Option<Op> {
    match code {
        0x08 | 0x28 | 0x88 | 0xa8 => Some(Op::Read),
        0x0a | 0x2a | 0x8a | 0xaa => Some(Op::Write),
        0x35 | 0x91 => Some(Op::Flush),
        0x42 => Some(Op::Trim),
        _ => None,
    }
}

pub fn scsi_code(op: Op) -> u16 {
    match op {
        Op::Read => 0x28,
        Op::Write => 0x2a,
        Op::Flush => 0x35,
        Op::Trim => 0x42,
    }
}

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    if line.starts_with("version") {
        return Ok(None);
    }
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let code = f.hex(2)?;
    let op = scsi_op(code).ok_or_else(|| {
        format!("column 3 (op): SCSI command {code:#04x} is not a read, write, flush or unmap")
    })?;
    let t = mul(f.u64(1)?, 1_000_000_000, "time")?;
    Ok(Some(req(t, op, mul(f.u64(4)?, 512, "lbn")?, f.u64(3)?)))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    writeln!(
        w,
        "1,{},{:x},{},{}",
        r.time_ns / 1_000_000_000,
        scsi_code(r.op),
        r.len,
        r.offset / 512
    )
}
