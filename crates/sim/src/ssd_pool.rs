//! A pool of SSD models seen as one cache device, laid out as the engine's [`Pool`]: member
//! `d` holds the pool slots `pool.range(d)`, so the cache byte `b` is on member
//! `pool.locate(b / line_size)`. Each op is split at member boundaries with [`Pool::split`]
//! into one op per member piece and completes when its last piece does; a flush goes to every
//! member. This is how the live server will route a cache request over `--cache` members, so
//! a timed run with several `--ssd` shows each member's share of the work.

use std::collections::HashMap;
use tiercache_devices::{Completion, Device, DeviceError, Done, IoKind, IoOp, Model};
use tiercache_engine::Pool;

struct Parent {
    parts_left: u32,
    error: Option<DeviceError>,
    last_ns: u64,
}

/// The pool. Use it through [`tiercache_devices::Checked`].
pub struct SsdPool {
    pool: Pool,
    line_size: u64,
    name: String,
    members: Vec<Box<dyn Device>>,
    parents: HashMap<u64, Parent>,
    /// Member op id -> (parent tag, member).
    subs: HashMap<u64, (u64, usize)>,
    next_id: u64,
    instant: Vec<Done>,
    buf: Vec<Completion>,
}

impl SsdPool {
    /// Member `d` of `pool` on `members[d]`, lines of `line_size` bytes. Every member must
    /// hold its slots.
    pub fn new(pool: Pool, line_size: u64, members: Vec<Box<dyn Device>>) -> Result<Self, String> {
        if members.len() != pool.members() {
            return Err(format!(
                "a pool of {} members given {} devices",
                pool.members(),
                members.len()
            ));
        }
        if line_size == 0 {
            return Err("the line size must be above 0".into());
        }
        for (d, m) in members.iter().enumerate() {
            let need = pool.lines(d) * line_size;
            if m.capacity_bytes() < need {
                return Err(format!(
                    "cache device {d} ('{}') holds {} bytes, its share of the cache needs {need} \
                     ({} lines of {line_size} bytes)",
                    m.name(),
                    m.capacity_bytes(),
                    pool.lines(d)
                ));
            }
        }
        let names: Vec<&str> = members.iter().map(|m| m.name()).collect();
        Ok(SsdPool {
            name: format!("pool:{}", names.join("+")),
            pool,
            line_size,
            members,
            parents: HashMap::new(),
            subs: HashMap::new(),
            next_id: 0,
            instant: Vec::new(),
            buf: Vec::new(),
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn members(&self) -> &[Box<dyn Device>] {
        &self.members
    }

    /// `(member, member offset, len)` of the pieces of `[off, end)`, in address order.
    pub fn pieces(&self, off: u64, end: u64) -> Vec<(usize, u64, u64)> {
        let ls = self.line_size;
        if end <= off {
            return Vec::new();
        }
        let first = off / ls;
        let last = end.div_ceil(ls);
        self.pool
            .split(first, last - first)
            .map(|(d, local, n)| {
                let base = self.pool.base(d) * ls;
                let lo = ((base + local * ls).max(off)) - base;
                let hi = ((base + (local + n) * ls).min(end)) - base;
                (d, lo, hi - lo)
            })
            .collect()
    }

    fn send(&mut self, now_ns: u64, tag: u64, member: usize, op: IoOp) {
        self.next_id += 1;
        self.subs.insert(self.next_id, (tag, member));
        self.members[member].submit(now_ns, self.next_id, op);
    }

    fn finish_part(&mut self, tag: u64, time_ns: u64) {
        let p = self.parents.get_mut(&tag).expect("pool parent");
        p.parts_left -= 1;
        p.last_ns = p.last_ns.max(time_ns);
        if p.parts_left == 0 {
            let p = self.parents.remove(&tag).expect("pool parent");
            self.instant.push(Done {
                tag,
                time_ns: p.last_ns,
                result: p.error.map_or(Ok(()), Err),
            });
        }
    }
}

impl Model for SsdPool {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.pool.capacity() * self.line_size
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        let ops: Vec<(usize, IoOp)> = match op.kind {
            IoKind::Flush => (0..self.members.len()).map(|d| (d, *op)).collect(),
            IoKind::Read | IoKind::Write | IoKind::Trim => self
                .pieces(op.offset, op.end())
                .into_iter()
                .map(|(d, offset, len)| (d, IoOp { offset, len, ..*op }))
                .collect(),
        };
        debug_assert!(!ops.is_empty(), "the checked wrapper passes no empty op");
        debug_assert!(
            op.kind == IoKind::Flush || ops.iter().map(|(_, o)| o.len).sum::<u64>() == op.len,
            "the pieces cover the op"
        );
        self.parents.insert(
            tag,
            Parent {
                parts_left: ops.len() as u32,
                error: None,
                last_ns: now_ns,
            },
        );
        for (d, o) in ops {
            self.send(now_ns, tag, d, o);
        }
    }

    fn next_event(&self) -> Option<u64> {
        let i = self.instant.iter().map(|d| d.time_ns).min();
        let m = self
            .members
            .iter()
            .filter_map(|m| m.next_completion())
            .min();
        match (i, m) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        let mut buf = std::mem::take(&mut self.buf);
        for m in self.members.iter_mut() {
            m.advance(now_ns, &mut buf);
        }
        for c in buf.drain(..) {
            let (tag, member) = self.subs.remove(&c.id).expect("pool member op");
            if let Err(e) = c.result {
                let p = self.parents.get_mut(&tag).expect("pool parent");
                p.error.get_or_insert(DeviceError::Member {
                    member,
                    source: Box::new(e),
                });
            }
            self.finish_part(tag, c.time_ns);
        }
        self.buf = buf;
        out.append(&mut self.instant);
    }
}

/// `spec` with its cache split over `members` cache devices of equal size, as `serve --cache
/// A --cache B ...` runs it: the capacity is divided equally (each member rounded down to a
/// multiple of [`tiercache_engine::POOL_ALIGN`] lines), the engine places lines over the
/// members (`EngineConfig::pool_lines`), and in write-back dirty lines are written to
/// `dirty_copies` members (`None` or 0: 2 when there are two or more members and the cache or
/// one of its volumes runs write-back, as live). Returns the spec, the footprint computed for
/// a percentage cache size (so it is not computed twice), and the pool.
pub fn pooled_spec(
    spec: &crate::SimSpec,
    members: usize,
    dirty_copies: Option<u8>,
) -> anyhow::Result<(crate::SimSpec, Option<u64>, Pool)> {
    use tiercache_engine::Mode;
    anyhow::ensure!(
        spec.log.is_none(),
        "the log layout takes one cache device (a pool of cache devices needs the direct layout)"
    );
    let ls = spec.engine.line_size;
    let fp = if spec.cache_size.needs_footprint() {
        Some(crate::footprint_lines(&spec.input, ls)?)
    } else {
        None
    };
    let lines = spec.cache_size.lines(ls, fp.unwrap_or(0));
    let n = members as u64;
    let p = Pool::new(&vec![lines / n; members]).map_err(|e| {
        anyhow::anyhow!(
            "a cache of {lines} lines split over {n} cache devices ({} lines each): {e}",
            lines / n
        )
    })?;
    let mut s = spec.clone();
    s.cache_size = tiercache_engine::CacheSize::Bytes(p.capacity() * ls);
    s.engine.pool_lines = (0..p.members()).map(|d| p.lines(d)).collect();
    let wb = s.engine.mode == Mode::WriteBack
        || s.engine
            .volumes
            .iter()
            .any(|v| v.mode == Some(Mode::WriteBack));
    s.engine.dirty_copies = match dirty_copies {
        Some(n) if n != 0 => n,
        _ if p.members() >= 2 && wb => 2,
        _ => 1,
    };
    Ok((s, fp, p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_devices::{Checked, Ram, RamConfig};

    fn ram(bytes: u64) -> Box<dyn Device> {
        let cfg = RamConfig {
            capacity_bytes: bytes,
            ..RamConfig::default()
        };
        Box::new(Checked::new(Ram::new(cfg).unwrap()))
    }

    #[test]
    fn an_op_crossing_members_is_split_and_completes_with_its_last_piece() {
        let pool = Pool::new(&[128, 256]).unwrap();
        let ls = 4096;
        let p = SsdPool::new(pool, ls, vec![ram(1 << 30), ram(1 << 30)]).unwrap();
        assert_eq!(p.capacity_bytes(), 384 * ls);
        // Bytes 127.5 lines .. 130.25 lines: half a line on member 0, the rest on member 1.
        let off = 127 * ls + ls / 2;
        let end = 130 * ls + ls / 4;
        assert_eq!(
            p.pieces(off, end),
            vec![(0, off, ls / 2), (1, 0, 2 * ls + ls / 4)]
        );
        let mut d = Checked::new(p);
        d.submit(5, 7, IoOp::new(IoKind::Write, off, end - off));
        d.submit(5, 8, IoOp::new(IoKind::Read, 200 * ls, ls));
        d.submit(5, 9, IoOp::new(IoKind::Flush, 0, 0));
        let mut done = Vec::new();
        while let Some(t) = d.next_completion() {
            d.advance(t, &mut done);
        }
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|c| c.result.is_ok()));
        let m = d.model().members();
        // Member 0: half a line written + a flush; member 1: the rest, the read, a flush.
        assert_eq!(m[0].stats().bytes_written(), ls / 2);
        assert_eq!(m[0].stats().ops(), 2);
        assert_eq!(m[1].stats().bytes_written(), 2 * ls + ls / 4);
        assert_eq!(m[1].stats().bytes_read(), ls);
        assert_eq!(m[1].stats().ops(), 3);
    }

    #[test]
    fn a_member_too_small_for_its_share_is_refused() {
        let pool = Pool::new(&[128, 128]).unwrap();
        let e = SsdPool::new(pool, 4096, vec![ram(1 << 30), ram(4096 * 100)])
            .err()
            .unwrap();
        assert!(e.contains("cache device 1"), "{e}");
    }
}
