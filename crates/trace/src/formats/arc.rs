//! ARC paper traces (Megiddo & Modha, FAST '03), `.lis`: whitespace-separated
//! `start_block num_blocks ignore request_number`, reads only, no timestamps (time 0).
//! Blocks are 512 bytes unless `ReadOptions::block_size` says otherwise (OLTP's unit is a
//! database page of undocumented size: give it as a block size, e.g. 4096, to treat each
//! native block as one line).

use super::{mul, req, Ctx, Fields};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["start_block", "num_blocks", "ignore", "request_number"];

pub fn parse(line: &str, ctx: &Ctx) -> Result<Option<Request>, String> {
    let t = line.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let f = Fields::ws(t, NAMES);
    f.need(2)?;
    let bs = ctx.block_size;
    Ok(Some(req(
        0,
        Op::Read,
        mul(f.u64(0)?, bs, "start_block")?,
        mul(f.u64(1)?, bs, "num_blocks")?,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, ctx: &Ctx) -> io::Result<()> {
    let bs = ctx.block_size;
    writeln!(w, "{} {} 0 0", r.offset / bs, r.len.div_ceil(bs))
}
