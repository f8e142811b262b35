//! libCacheSim's block CSV as in its CloudPhysics sample (`cloudPhysicsIO.csv`); format
//! names `lcs-csv` and `cloudphysics-csv`. Header `version,time,op,size,lbn`.
//!
//! - time in seconds (whole in the sample; decimals accepted).
//! - op: a SCSI operation code in hex — `28`/`88`/`a8`/`08` read(10/16/12/6),
//!   `2a`/`8a`/`aa`/`0a` write, `35`/`91` synchronize cache -> flush, `42` unmap -> trim.
//!   Other commands (inquiry, test unit ready, ...) are errors: skip them with `skip_bad`.
//! - size in bytes; lbn = start sector (512 B).
//! - Volume 0, class 0; the `version` column is ignored.
//!
//! The writer writes whole seconds and rounds offsets down to sectors (keeping the end).

use super::{csv_fields, is_dec, is_int, mul, Ctx, Fields, Written};
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

/// The SCSI command code written for an operation (the 10-byte CDB variants).
pub fn scsi_code(op: Op) -> u16 {
    match op {
        Op::Read => 0x28,
        Op::Write => 0x2a,
        Op::Flush => 0x35,
        Op::Trim => 0x42,
    }
}

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    if line.starts_with(b"version") {
        return Ok(None);
    }
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let code = f.hex(2)?;
    let op = scsi_op(code)
        .ok_or_else(|| f.err(2, "is not a SCSI read, write, synchronize cache or unmap"))?;
    let t = f.scaled(1, 9)?;
    Ok(Some(Request::new(
        t,
        op,
        mul(f.u64(4)?, 512, "lbn")?,
        f.u64(3)?,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let lbn = r.offset / 512;
    writeln!(
        w,
        "1,{},{:x},{},{lbn}",
        r.time_ns / 1_000_000_000,
        scsi_code(r.op),
        r.end() - lbn * 512,
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() == 5
        && is_int(c[0])
        && is_dec(c[1])
        && std::str::from_utf8(c[2])
            .ok()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .and_then(scsi_op)
            .is_some()
        && is_int(c[3])
        && is_int(c[4])
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "lcs-csv",
    aliases: &["cloudphysics-csv", "libcachesim-csv"],
    description:
        "libCacheSim/CloudPhysics csv: version,time,op(SCSI hex),size,lbn(sectors) (header)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: Some(HEADER),
    detect_header: Some(HEADER),
    name_hints: &["cloudphysics", "lcs"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
