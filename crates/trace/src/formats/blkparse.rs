//! blkparse's default text output, one event per line:
//! `  8,0    3        1     0.000000000  697  Q   R 223490 + 8 [kjournald]` —
//! device `major,minor`, cpu, sequence, time (s, decimals), pid, action, RWBS, sector, `+`,
//! count (sectors), process.
//!
//! - Only lines whose action is [`crate::ReadOptions::blkparse_action`] become requests
//!   (default `Q`, queued; `D` issued to the driver and `C` completed are the usual
//!   alternatives). Other events (`G`, `I`, `M`, `m` messages, ...), and the per-CPU and
//!   total summaries blkparse prints after the records (`CPU0 (8,0):`, `Reads Queued: ...`),
//!   are skipped.
//! - RWBS: the first of `D` (discard -> trim), `R` (read), `W` (write) is the direction; an
//!   `F` after it (`WFS`) is FUA; a leading `F` is a preflush: `FWS` with no `sector +
//!   count` (or a count of 0) is a flush, with data it is a write. RWBS without a direction
//!   but with `F` is a flush; others (`N`) are skipped. `S` (sync), `M` (metadata), `A`
//!   (readahead) are ignored.
//! - Sectors are 512 bytes.
//! - Volume = `major << 20 | minor`, the kernel's dev_t encoding (what blktrace's binary
//!   records carry): 8,0 -> 8388608, 8,16 -> 8388624, 259,0 -> 271581184. Class 0.
//!
//! The writer writes `Q` events (or the action of the writer's context) with sequence
//! numbers from 1, pid 0, cpu 0 and process `[tiercache]`.

use super::{is_dec, mul, ws_fields, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &[
    "device", "cpu", "sequence", "time", "pid", "action", "RWBS", "sector", "+", "count",
];

/// Volume number of a `major,minor` device.
pub fn volume(major: u32, minor: u32) -> Option<u32> {
    (major < 1 << 12 && minor < 1 << 20).then_some(major << 20 | minor)
}

pub fn parse(line: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::ws(line, NAMES);
    if f.len() < 7 {
        return Ok(None);
    }
    // Event lines start with "maj,min"; anything else (summaries) is skipped.
    let dev = f.bytes(0)?;
    let Some(comma) = dev.iter().position(|&b| b == b',') else {
        return Ok(None);
    };
    let (Some(maj), Some(min)) = (
        super::parse_u64(&dev[..comma]),
        super::parse_u64(&dev[comma + 1..]),
    ) else {
        return Ok(None);
    };
    if f.bytes(5)? != [ctx.blkparse_action] {
        return Ok(None);
    }
    let volume = u32::try_from(maj)
        .ok()
        .zip(u32::try_from(min).ok())
        .and_then(|(a, b)| volume(a, b))
        .ok_or_else(|| f.err(0, "is not a valid major,minor (major < 4096, minor < 2^20)"))?;
    let time = f.scaled(3, 9)?;
    let rwbs = f.bytes(6)?;
    let dir = rwbs.iter().position(|c| matches!(c, b'D' | b'R' | b'W'));
    let preflush = rwbs.first() == Some(&b'F') && dir != Some(0);
    let fua = dir.is_some_and(|i| rwbs[i + 1..].contains(&b'F'));
    let has_range = f.len() >= 10 && f.bytes(8)? == b"+";
    let (offset, len) = if has_range {
        (
            mul(f.u64(7)?, 512, "sector")?,
            mul(f.u64(9)?, 512, "count")?,
        )
    } else {
        (0, 0)
    };
    let op = match dir.map(|i| rwbs[i]) {
        Some(b'D') => Op::Trim,
        Some(b'R') => Op::Read,
        Some(_) if preflush && len == 0 => Op::Flush,
        Some(_) => Op::Write,
        None if rwbs.contains(&b'F') => Op::Flush,
        None => return Ok(None),
    };
    if op != Op::Flush && !has_range {
        return Err(f.err(6, "event has no 'sector + count'"));
    }
    let mut r = Request::new(time, op, offset, len);
    r.volume = volume;
    r.fua = fua;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, ctx: &Ctx, seq: u64) -> io::Result<Written> {
    let rwbs: &str = match (r.op, r.fua) {
        (Op::Read, false) => "RS",
        (Op::Read, true) => "RFS",
        (Op::Write, false) => "WS",
        (Op::Write, true) => "WFS",
        (Op::Trim, _) => "D",
        (Op::Flush, false) => "FWS",
        (Op::Flush, true) => "FWFS",
    };
    let t = r.time_ns;
    let (maj, min) = (r.volume >> 20, r.volume & 0xf_ffff);
    let action = ctx.blkparse_action as char;
    write!(
        w,
        "{maj:3},{min:<3} {:4} {seq:8} {:5}.{:09} {:5}  {action} {rwbs:>3} ",
        0,
        t / 1_000_000_000,
        t % 1_000_000_000,
        0
    )?;
    if r.op != Op::Flush {
        let first = r.offset / 512;
        write!(w, "{first} + {} ", r.end().div_ceil(512) - first)?;
    }
    w.write_all(b"[tiercache]\n")?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let w = ws_fields(line);
    w.len() >= 7
        && std::str::from_utf8(w[0])
            .ok()
            .and_then(|s| s.split_once(','))
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        && is_dec(w[3])
}

fn write_one(
    _: &mut super::WriteState,
    w: &mut dyn Write,
    r: &Request,
    c: &Ctx,
    n: u64,
) -> io::Result<Written> {
    write(w, r, c, n)
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "blkparse",
    aliases: &["blktrace"],
    description: "blkparse text: maj,min cpu seq time pid action RWBS sector + count [proc] (one action, default Q)",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["blkparse", "blktrace"],
    fits,
    decides_alone: true,
    trust_name: false,
    parse,
    write: Some(write_one),
    finish: None,
};
