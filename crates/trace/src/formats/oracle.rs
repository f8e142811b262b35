//! libCacheSim's oracleGeneral binary: 24-byte little-endian records
//! `<u32 time_s, u64 obj_id, u32 size_bytes, i64 next_access_vtime>` (next = index of the
//! next record with the same id, -1 for none).
//!
//! - No operation: every record becomes a read of `size` bytes at `obj_id x block_size`.
//!   The block size is 512 by default (the ids of libCacheSim's block samples, such as
//!   `cloudPhysicsIO.oracleGeneral.bin`, are sector numbers); give
//!   [`crate::ReadOptions::block_size`] 4096 for ids that count 4 KiB blocks.
//! - time in whole seconds. Volume 0, class 0. `next_access_vtime` is not used.
//!
//! The writer writes reads and writes alike (as accesses), drops trims and flushes, and
//! fills `next_access_vtime` exactly as libCacheSim's oracle readers expect. That needs the
//! whole trace: it keeps 16 bytes per record in memory and writes the file at `finish`.

use super::{Ctx, Written};
use std::io;
use tiercache_engine::{Op, Request};

pub const RECORD: usize = 24;

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

pub fn parse(rec: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    // One length check for the record, not one per byte read (callgrind, session 29: ~110
    // instructions per record before, on the simulator's reader thread).
    let rec: &[u8; RECORD] = rec
        .get(..RECORD)
        .and_then(|r| r.try_into().ok())
        .ok_or_else(|| format!("oracleGeneral record of {} bytes, not {RECORD}", rec.len()))?;
    let t = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
    let id = u64::from_le_bytes([
        rec[4], rec[5], rec[6], rec[7], rec[8], rec[9], rec[10], rec[11],
    ]);
    let size = u32::from_le_bytes([rec[12], rec[13], rec[14], rec[15]]);
    let offset = id
        .checked_mul(ctx.block_size)
        .ok_or_else(|| format!("object id {id} x block size {} overflows", ctx.block_size))?;
    Ok(Some(Request::new(
        t as u64 * 1_000_000_000,
        Op::Read,
        offset,
        size as u64,
    )))
}

/// Whether the first records look like oracleGeneral: non-decreasing times, sizes below
/// 1 GiB, next-access indices -1 or after the record and not absurdly far.
pub fn plausible(head: &[u8]) -> bool {
    let n = (head.len() / RECORD).min(256);
    if n == 0 {
        return false;
    }
    let mut last_t = 0;
    for i in 0..n {
        let r = &head[i * RECORD..(i + 1) * RECORD];
        let t = u32_at(r, 0);
        let size = u32_at(r, 12);
        let next = u64_at(r, 16) as i64;
        if t < last_t || size > 1 << 30 || !(next == -1 || (next > i as i64 && next < 1 << 40)) {
            return false;
        }
        last_t = t;
    }
    true
}

/// Records kept by the writer until `finish`: time, id, size.
#[derive(Default)]
pub struct Pending {
    recs: Vec<(u32, u64, u32)>,
}

impl Pending {
    pub fn push(&mut self, r: &Request, ctx: &Ctx) -> io::Result<Written> {
        if !matches!(r.op, Op::Read | Op::Write) {
            return Ok(Written::Dropped);
        }
        let id = r.offset / ctx.block_size;
        let size = u32::try_from(r.end() - id * ctx.block_size).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "request of {} bytes does not fit oracleGeneral's u32 size",
                    r.len
                ),
            )
        })?;
        let t = u32::try_from(r.time_ns / 1_000_000_000).unwrap_or(u32::MAX);
        self.recs.push((t, id, size));
        Ok(Written::Yes)
    }

    /// Writes every record with its next-access index.
    pub fn write_all(&self, w: &mut dyn io::Write) -> io::Result<()> {
        let mut next = vec![-1i64; self.recs.len()];
        let mut last: hashbrown::HashMap<u64, usize> = hashbrown::HashMap::new();
        for (i, r) in self.recs.iter().enumerate() {
            if let Some(p) = last.insert(r.1, i) {
                next[p] = i as i64;
            }
        }
        drop(last);
        let mut buf = [0u8; RECORD];
        for (r, n) in self.recs.iter().zip(next) {
            buf[0..4].copy_from_slice(&r.0.to_le_bytes());
            buf[4..12].copy_from_slice(&r.1.to_le_bytes());
            buf[12..16].copy_from_slice(&r.2.to_le_bytes());
            buf[16..24].copy_from_slice(&n.to_le_bytes());
            w.write_all(&buf)?;
        }
        Ok(())
    }
}

fn push_one(
    st: &mut super::WriteState,
    _: &mut dyn io::Write,
    r: &Request,
    c: &Ctx,
    _n: u64,
) -> io::Result<Written> {
    st.oracle.push(r, c)
}

fn finish(st: &mut super::WriteState, w: &mut dyn io::Write) -> io::Result<()> {
    st.oracle.write_all(w)
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "oracle-general",
    aliases: &["oraclegeneral"],
    description: "libCacheSim oracleGeneral binary: <u32 time_s, u64 id, u32 size, i64 next>; reads at id x 512 B",
    has_op: false,
    record_size: RECORD,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["oraclegeneral", "oracle"],
    fits: plausible,
    decides_alone: false,
    trust_name: true,
    parse,
    write: Some(push_one),
    finish: Some(finish),
};
