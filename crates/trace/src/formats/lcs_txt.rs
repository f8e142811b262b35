//! libCacheSim's plain text traces: one object id per line (as `cloudPhysicsIO.txt`, whose
//! ids are start sectors).
//!
//! - Each id becomes a read of one block at `id x block`, where the block is
//!   [`crate::ReadOptions::block_size`] (default 512 B, so sector ids land on the sectors
//!   they name; give 4096 to make each id its own 4 KiB cache line).
//! - No time, size or operation: time 0, reads only, volume 0, class 0. Blank lines and `#`
//!   comments are skipped.
//!
//! The writer writes the first block of each read or write; trims and flushes are dropped.

use super::{is_int, mul, ws_fields, Ctx, Fields, Written};
use std::io::{self, Write};
use tiercache_engine::{Op, Request};

const NAMES: &[&str] = &["object_id"];

pub fn parse(line: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::ws(line, NAMES);
    if f.len() == 0 || line.first() == Some(&b'#') {
        return Ok(None);
    }
    if f.len() > 1 {
        return Err(format!(
            "expected one object id per line, found {} fields",
            f.len()
        ));
    }
    let bs = ctx.block_size;
    Ok(Some(Request::new(
        0,
        Op::Read,
        mul(f.u64(0)?, bs, "object_id")?,
        bs,
    )))
}

pub fn write(w: &mut dyn Write, r: &Request, ctx: &Ctx) -> io::Result<Written> {
    if !matches!(r.op, Op::Read | Op::Write) {
        return Ok(Written::Dropped);
    }
    writeln!(w, "{}", r.offset / ctx.block_size)?;
    Ok(Written::Yes)
}

fn fits(line: &[u8]) -> bool {
    let w = ws_fields(line);
    w.len() == 1 && is_int(w[0])
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "lcs-txt",
    aliases: &["txt", "libcachesim-txt"],
    description:
        "libCacheSim plain text: one object id per line; reads of one block (512 B) at id x block",
    has_op: false,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &[],
    fits,
    decides_alone: false,
    trust_name: false,
    parse,
    // Stateless: one record per request.
    write: Some(|_, w, r, c, _| write(w, r, c)),
    finish: None,
};
