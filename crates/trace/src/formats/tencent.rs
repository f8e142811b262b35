//! Tencent Cloud Block Storage (SNIA IOTTA) CSV, no header:
//! `Timestamp,Offset,Size,IOType,VolumeID` — Unix seconds, offset and size in 512-byte
//! sectors, IOType `0` read / `1` write. Records are not sorted by time.
//! Written offsets and sizes are rounded down to whole sectors.

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["Timestamp", "Offset", "Size", "IOType", "VolumeID"];

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::csv(line, NAMES);
    f.need(5)?;
    let op = match f.str(3)? {
        "0" => Op::Read,
        "1" => Op::Write,
        other => {
            return Err(format!(
                "column 4 (IOType): '{other}' is not 0 (read) or 1 (write)"
            ))
        }
    };
    let t = mul(f.u64(0)?, 1_000_000_000, "timestamp")?;
    let mut r = req(
        t,
        op,
        mul(f.u64(1)?, 512, "offset")?,
        mul(f.u64(2)?, 512, "size")?,
    );
    r.volume = f.u64(4)? as u32;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    let ty = u8::from(r.op == Op::Write);
    writeln!(
        w,
        "{},{},{},{ty},{}",
        r.time_ns / 1_000_000_000,
        r.offset / 512,
        r.len / 512,
        r.volume
    )
}
