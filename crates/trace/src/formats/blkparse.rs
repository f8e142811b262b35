//! blkparse's default text output, one event per line:
//! `  8,0    3        1     0.000000000  697  Q   R 223490 + 8 [kjournald]` —
//! device `major,minor`, cpu, sequence, time (s), pid, action, RWBS, sector, `+`, count,
//! process. Only lines whose action is `ReadOptions::blkparse_action` (default `Q`) become
//! requests; other events and the summary at the end are skipped.
//!
//! RWBS: `D` discard -> trim, `R` read, `W` write, a leading `F` with no data -> flush, an `F`
//! after the direction (e.g. `WFS`) -> FUA. Sectors are 512 bytes. Volume = major x 256 + minor.

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &[
    "dev", "cpu", "seq", "time", "pid", "action", "rwbs", "sector", "+", "count",
];

pub fn parse(line: &str, ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::ws(line, NAMES);
    // Event lines start with "maj,min"; anything else (summaries, blank lines) is skipped.
    let Ok(dev) = f.str(0) else { return Ok(None) };
    let Some((maj, min)) = dev.split_once(',') else {
        return Ok(None);
    };
    let (Ok(maj), Ok(min)) = (maj.parse::<u32>(), min.parse::<u32>()) else {
        return Ok(None);
    };
    if f.len() < 7 {
        return Ok(None);
    }
    let action = f.str(5)?;
    if action.as_bytes() != [ctx.blkparse_action] {
        return Ok(None);
    }
    let rwbs = f.str(6)?;
    let time = super::secs_to_ns(f.f64(3)?)?;
    let volume = maj * 256 + min;
    let dir = rwbs.find(['D', 'R', 'W']);
    let op = match dir.map(|i| rwbs.as_bytes()[i]) {
        Some(b'D') => Op::Trim,
        Some(b'R') => Op::Read,
        Some(b'W') => Op::Write,
        _ if rwbs.starts_with('F') => Op::Flush,
        _ => return Ok(None), // 'N' (no data) and the like
    };
    let fua = dir.is_some_and(|i| rwbs[i + 1..].contains('F'));
    let (offset, len) = if f.len() >= 10 && f.str(8)? == "+" {
        (
            mul(f.u64(7)?, 512, "sector")?,
            mul(f.u64(9)?, 512, "count")?,
        )
    } else if op == Op::Flush {
        (0, 0)
    } else {
        return Err(format!("a {rwbs} event without 'sector + count'"));
    };
    let mut r = req(time, op, offset, len);
    r.volume = volume;
    r.fua = fua;
    Ok(Some(r))
}

pub fn write(w: &mut dyn Write, r: &Request, ctx: &Ctx) -> io::Result<()> {
    let mut rwbs = String::new();
    match r.op {
        Op::Read => rwbs.push('R'),
        Op::Write => rwbs.push('W'),
        Op::Trim => rwbs.push('D'),
        Op::Flush => rwbs.push('F'),
    }
    if r.fua {
        rwbs.push('F');
    }
    rwbs.push('S');
    let t = r.time_ns;
    let (maj, min) = (r.volume / 256, r.volume % 256);
    let action = ctx.blkparse_action as char;
    if r.op == Op::Flush {
        writeln!(
            w,
            "{maj:3},{min:<3} 0 0 {}.{:09} 0 {action} {rwbs} [tiercache]",
            t / 1_000_000_000,
            t % 1_000_000_000
        )
    } else {
        writeln!(
            w,
            "{maj:3},{min:<3} 0 0 {}.{:09} 0 {action} {rwbs} {} + {} [tiercache]",
            t / 1_000_000_000,
            t % 1_000_000_000,
            r.offset / 512,
            r.len.div_ceil(512)
        )
    }
}
