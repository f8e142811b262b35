//! ARC paper traces (Megiddo & Modha, FAST '03), `.lis`: whitespace-separated
//! `start_block num_blocks ignore request_number`.
//!
//! - Reads only; no timestamps (every request has time 0).
//! - Blocks are 512 bytes unless [`crate::ReadOptions::block_size`] says otherwise. OLTP's
//!   unit is a database page of undocumented size: read it with a block size such as 4096
//!   so that each native block is one 4 KiB cache block.
//! - Volume 0, class 0. Only the first two fields are required.
//!
//! The writer writes reads and writes alike as block references (the format has no
//! operation), rounding to whole blocks; trims and flushes are dropped. The request number
//! column counts written records from 0.

use super::{is_int, mul, ws_fields, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["start_block", "num_blocks", "ignore", "request_number"];

pub fn parse(line: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::ws(line, NAMES);
    if f.len() == 0 || line.first() == Some(&b'#') {
        return Ok(None);
    }
    f.need(2)?;
    let bs = ctx.block_size;
    Ok(Some(Request::new(
        0,
        Op::Read,
        mul(f.u64(0)?, bs, "start_block")?,
        mul(f.u64(1)?, bs, "num_blocks")?,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, ctx: &Ctx, n: u64) -> io::Result<Written> {
    if !matches!(r.op, Op::Read | Op::Write) {
        return Ok(Written::Dropped);
    }
    let bs = ctx.block_size;
    let first = r.offset / bs;
    writeln!(w, "{first} {} 0 {n}", r.end().div_ceil(bs) - first)?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let w = ws_fields(line);
    w.len() == 4 && w.iter().all(|b| is_int(b))
}

fn write_one(
    _: &mut super::WriteState,
    w: &mut dyn Write,
    r: &Request,
    c: &Ctx,
    n: u64,
) -> io::Result<Written> {
    write(w, r, c, n - 1)
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "arc",
    aliases: &["lis"],
    description: "ARC .lis: start_block num_blocks ignore request_number (reads; 512 B blocks)",
    has_op: false,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &[".lis"],
    fits,
    decides_alone: false,
    trust_name: true,
    parse,
    write: Some(write_one),
    finish: None,
};
