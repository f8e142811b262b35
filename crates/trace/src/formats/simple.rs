//! tiercache's own CSV: header `time_ns,op,offset,len,class,volume,fua`; op is
//! `read|write|trim|flush` (or `r|w|t|f`); the last three columns are optional (default 0,
//! 0, 0). Offsets and lengths in bytes, any alignment. Lines starting with `#` are comments.

use super::{Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request, MAX_CLASS};

const NAMES: &[&str] = &["time_ns", "op", "offset", "len", "class", "volume", "fua"];
pub const HEADER: &str = "time_ns,op,offset,len,class,volume,fua";

pub fn parse(line: &str, _ctx: &Ctx) -> Result<Option<Request>, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') || t.starts_with("time_ns") {
        return Ok(None);
    }
    let f = Fields::csv(t, NAMES);
    f.need(4)?;
    let op = match f.str(1)?.to_ascii_lowercase().as_str() {
        "read" | "r" => Op::Read,
        "write" | "w" => Op::Write,
        "trim" | "t" | "discard" => Op::Trim,
        "flush" | "f" => Op::Flush,
        other => {
            return Err(format!(
                "column 2 (op): '{other}' is not read, write, trim or flush"
            ))
        }
    };
    let mut r = Request::new(f.u64(0)?, op, f.u64(2)?, f.u64(3)?);
    if f.len() > 4 && !f.str(4)?.is_empty() {
        let c = f.u64(4)?;
        if c > MAX_CLASS as u64 {
            return Err(format!("column 5 (class): {c} is above {MAX_CLASS}"));
        }
        r.class = c as u8;
    }
    if f.len() > 5 && !f.str(5)?.is_empty() {
        r.volume =
            u32::try_from(f.u64(5)?).map_err(|_| "column 6 (volume): too large".to_string())?;
    }
    if f.len() > 6 && !f.str(6)?.is_empty() {
        r.fua = match f.str(6)? {
            "0" | "false" => false,
            "1" | "true" => true,
            other => return Err(format!("column 7 (fua): '{other}' is not 0 or 1")),
        };
    }
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<()> {
    writeln!(
        w,
        "{},{},{},{},{},{},{}",
        r.time_ns,
        r.op.as_str(),
        r.offset,
        r.len,
        r.class,
        r.volume,
        u8::from(r.fua)
    )
}
