//! tiercache's own CSV, what our tools write: header `time_ns,op,offset,len,class,volume,fua`.
//!
//! - time_ns: nanoseconds (whole); op `read|write|trim|flush` or `r|w|t|f` (any case;
//!   `discard` also means trim); offset and len in bytes, any alignment.
//! - class (0..=31), volume (u32) and fua (`0|1|true|false`) are optional: missing or empty
//!   columns mean 0 / 0 / false.
//! - Blank lines and lines starting with `#` are ignored; the header is optional when
//!   reading with an explicit format.
//!
//! Lossless: every [`Request`] round-trips.

use super::{csv_fields, is_int, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request, MAX_CLASS};

const NAMES: &[&str] = &["time_ns", "op", "offset", "len", "class", "volume", "fua"];
pub const HEADER: &str = "time_ns,op,offset,len,class,volume,fua";

fn op_of(b: &[u8]) -> Option<Op> {
    let is = |s: &[u8]| b.eq_ignore_ascii_case(s);
    if is(b"read") || is(b"r") {
        Some(Op::Read)
    } else if is(b"write") || is(b"w") {
        Some(Op::Write)
    } else if is(b"trim") || is(b"t") || is(b"discard") {
        Some(Op::Trim)
    } else if is(b"flush") || is(b"f") {
        Some(Op::Flush)
    } else {
        None
    }
}

/// What a parse error adds: `--format csv` means this format, not libCacheSim's csv.
const NOT_LCS: &str = "(--format simple, alias csv, is tiercache's CSV time_ns,op,offset,len; \
                       libCacheSim's csv traces are --format lcs-csv: `tiercache trace formats`)";

pub fn parse(line: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    parse_fields(line, ctx).map_err(|e| format!("{e} {NOT_LCS}"))
}

fn parse_fields(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let t = line.trim_ascii();
    if t.is_empty() || t[0] == b'#' || t.starts_with(b"time_ns") {
        return Ok(None);
    }
    let f = Fields::csv(t, NAMES);
    f.need(4)?;
    let op = op_of(f.bytes(1)?).ok_or_else(|| f.err(1, "is not read, write, trim or flush"))?;
    let mut r = Request::new(f.u64(0)?, op, f.u64(2)?, f.u64(3)?);
    if f.has(4) {
        let c = f.u64(4)?;
        if c > MAX_CLASS as u64 {
            return Err(f.err(4, "is above 31"));
        }
        r.class = c as u8;
    }
    if f.has(5) {
        r.volume = f.u32(5)?;
    }
    if f.has(6) {
        r.fua = match f.bytes(6)? {
            b"0" | b"false" => false,
            b"1" | b"true" => true,
            _ => return Err(f.err(6, "is not 0 or 1")),
        };
    }
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, _ctx: &Ctx) -> io::Result<Written> {
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
    )?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let c = csv_fields(line);
    c.len() >= 4
        && is_int(c[0])
        && is_int(c[2])
        && is_int(c[3])
        && matches!(
            c[1].to_ascii_lowercase().as_slice(),
            b"read" | b"write" | b"trim" | b"flush" | b"discard"
        )
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "simple",
    aliases: &["csv", "tiercache"],
    description: "tiercache CSV: time_ns,op,offset,len[,class[,volume[,fua]]] (header)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: Some(HEADER),
    detect_header: Some("time_ns,op"),
    name_hints: &["tiercache"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
