//! libCacheSim's oracleGeneral binary: 24-byte little-endian records
//! `<u32 time_s, u64 obj_id, u32 size_bytes, i64 next_access_vtime>`. No operation: every
//! record is a read of `size` bytes at `obj_id x block_size` (block size 512 by default: the
//! ids of libCacheSim's block samples are sector numbers; give 4096 for ids that count 4 KiB
//! blocks). The writer fills `next_access_vtime` exactly (as libCacheSim's oracle readers
//! expect) by buffering the trace in memory: 16 bytes per request.

use super::Ctx;
use tiercache_engine::{Op, Request};

pub const RECORD: usize = 24;

pub fn parse(rec: &[u8], ctx: &Ctx) -> Result<Option<Request>, String> {
    let t = u32::from_le_bytes(rec[0..4].try_into().expect("record"));
    let id = u64::from_le_bytes(rec[4..12].try_into().expect("record"));
    let size = u32::from_le_bytes(rec[12..16].try_into().expect("record"));
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

/// Encodes records with their next-access times (index of the next record with the same id).
pub fn encode_all(reqs: &[(u32, u64, u32)]) -> Vec<u8> {
    let mut next = vec![-1i64; reqs.len()];
    let mut last: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (i, r) in reqs.iter().enumerate() {
        if let Some(p) = last.insert(r.1, i) {
            next[p] = i as i64;
        }
    }
    let mut out = Vec::with_capacity(reqs.len() * RECORD);
    for (r, n) in reqs.iter().zip(next) {
        out.extend_from_slice(&r.0.to_le_bytes());
        out.extend_from_slice(&r.1.to_le_bytes());
        out.extend_from_slice(&r.2.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}
