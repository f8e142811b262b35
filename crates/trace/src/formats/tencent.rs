//! Tencent Cloud Block Storage (SNIA IOTTA; Zhang et al., ATC '20) CSV, no header:
//! `Timestamp,Offset,Size,IOType,VolumeID`.
//!
//! - Timestamp: Unix seconds (whole). Records are *not* sorted by time: the reader's
//!   relative times saturate at 0 for records earlier than the first.
//! - Offset and Size in 512-byte sectors; IOType `0` read, `1` write.
//! - Volume = VolumeID; class 0.
//!
//! The writer rounds times down to seconds, offsets down and sizes up to whole sectors;
//! trims and flushes are dropped.

use super::{csv_fields, is_int, mul, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["Timestamp", "Offset", "Size", "IOType", "VolumeID"];

pub fn parse(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.bytes(3)? {
        b"0" => Op::Read,
        b"1" => Op::Write,
        _ => return Err(f.err(3, "is not 0 (read) or 1 (write)")),
    };
    let t = mul(f.u64(0)?, 1_000_000_000, "Timestamp")?;
    let mut r = Request::new(
        t,
        op,
        mul(f.u64(1)?, 512, "Offset")?,
        mul(f.u64(2)?, 512, "Size")?,
    );
    r.volume = f.u32(4)?;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
    let ty = match r.op {
        Op::Read => 0,
        Op::Write => 1,
        _ => return Ok(Written::Dropped),
    };
    let first = r.offset / 512;
    let sectors = r.end().div_ceil(512) - first;
    writeln!(
        w,
        "{},{first},{sectors},{ty},{}",
        r.time_ns / 1_000_000_000,
        r.volume
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() == 5 && c.iter().all(|b| is_int(b)) && matches!(c[3], b"0" | b"1")
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "tencent",
    aliases: &["tencent-cbs"],
    description:
        "Tencent CBS CSV: Timestamp,Offset(sectors),Size(sectors),IOType(0 r/1 w),VolumeID",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["tencent", "cloud_storage", "cbs"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
