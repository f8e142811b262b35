//! RAID 0 and RAID 5 over member devices (any [`Device`]).
//!
//! Layout: the address space is cut into stripe units; RAID 0 puts unit `u` on member
//! `u mod N`. RAID 5 is left-symmetric: row `r` has its parity on member
//! `N - 1 - (r mod N)` and its `N - 1` data units on the following members, wrapping.
//!
//! Each op is split into per-member sub-ops (adjacent pieces on one member are merged) and
//! completes when its last part does. RAID 5 writes go row by row: a write that covers a whole
//! row writes its data and the parity computed from it (N member writes, no reads); a
//! partial row does read-modify-write: read the old data and old parity, and when both are
//! in, write the new data and new parity (4 member ops for a small write). Reads never touch
//! parity. Flush goes to every member. Trim goes to the data units on RAID 0; on RAID 5 it is
//! completed without member work, because trimming data would silently change the parity.
//! Failed members are not reconstructed from parity (no degraded mode): a member error
//! fails the op.

use crate::checked::{Done, Model};
use crate::{Completion, Device, DeviceError, IoKind, IoOp};
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaidLevel {
    #[serde(rename = "raid0", alias = "0")]
    Raid0,
    #[serde(rename = "raid5", alias = "5")]
    Raid5,
}

/// Array parameters (members are given separately).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaidConfig {
    pub level: RaidLevel,
    /// Stripe unit (chunk) per member; 64 KiB by default (the md default is 512 KiB,
    /// hardware controllers commonly 64 KiB).
    pub stripe_unit_bytes: u64,
}

impl Default for RaidConfig {
    fn default() -> Self {
        RaidConfig {
            level: RaidLevel::Raid0,
            stripe_unit_bytes: 64 << 10,
        }
    }
}

/// A host op in flight.
struct Parent {
    /// Member ops not yet completed, plus 1 per RMW group that has not issued its writes.
    parts_left: u32,
    error: Option<DeviceError>,
    last_ns: u64,
}

/// Second phase of a RAID 5 read-modify-write of one row.
struct Rmw {
    parent: u64,
    reads_left: u32,
    writes: Vec<(usize, IoOp)>,
    failed: bool,
}

struct Sub {
    parent: u64,
    member: usize,
    rmw: Option<u64>,
}

/// The array. Use it through [`crate::Checked`].
pub struct Raid {
    cfg: RaidConfig,
    name: String,
    members: Vec<Box<dyn Device>>,
    /// Bytes used on each member (a multiple of the stripe unit).
    member_bytes: u64,
    capacity: u64,
    parents: HashMap<u64, Parent>,
    subs: HashMap<u64, Sub>,
    rmws: HashMap<u64, Rmw>,
    next_id: u64,
    instant: Vec<Done>,
    buf: Vec<Completion>,
}

impl Raid {
    pub fn new(cfg: RaidConfig, members: Vec<Box<dyn Device>>) -> Result<Self, String> {
        let n = members.len();
        let min = match cfg.level {
            RaidLevel::Raid0 => 1,
            RaidLevel::Raid5 => 3,
        };
        if n < min {
            return Err(format!(
                "{:?} needs at least {min} members, got {n}",
                cfg.level
            ));
        }
        if cfg.stripe_unit_bytes == 0 {
            return Err("stripe_unit_bytes must be > 0".into());
        }
        let smallest = members
            .iter()
            .map(|m| m.capacity_bytes())
            .min()
            .unwrap_or(0);
        let member_bytes = smallest / cfg.stripe_unit_bytes * cfg.stripe_unit_bytes;
        if member_bytes == 0 {
            return Err("members are smaller than one stripe unit".into());
        }
        let data = match cfg.level {
            RaidLevel::Raid0 => n,
            RaidLevel::Raid5 => n - 1,
        } as u64;
        let level = match cfg.level {
            RaidLevel::Raid0 => "raid0",
            RaidLevel::Raid5 => "raid5",
        };
        let name = format!("{level}:{n}x{}", members[0].name());
        Ok(Raid {
            capacity: member_bytes * data,
            member_bytes,
            name,
            cfg,
            members,
            parents: HashMap::new(),
            subs: HashMap::new(),
            rmws: HashMap::new(),
            next_id: 0,
            instant: Vec::new(),
            buf: Vec::new(),
        })
    }

    pub fn members(&self) -> &[Box<dyn Device>] {
        &self.members
    }

    pub fn config(&self) -> &RaidConfig {
        &self.cfg
    }

    /// Bytes used on each member (the smallest member, rounded down to the stripe unit).
    pub fn member_bytes(&self) -> u64 {
        self.member_bytes
    }

    fn data_per_row(&self) -> u64 {
        match self.cfg.level {
            RaidLevel::Raid0 => self.members.len() as u64,
            RaidLevel::Raid5 => self.members.len() as u64 - 1,
        }
    }

    /// Member and member offset of the first byte of data unit `u`.
    fn locate(&self, u: u64) -> (usize, u64) {
        let n = self.members.len() as u64;
        let su = self.cfg.stripe_unit_bytes;
        match self.cfg.level {
            RaidLevel::Raid0 => ((u % n) as usize, u / n * su),
            RaidLevel::Raid5 => {
                let row = u / (n - 1);
                let k = u % (n - 1);
                let parity = self.parity_member(row) as u64;
                (((parity + 1 + k) % n) as usize, row * su)
            }
        }
    }

    fn parity_member(&self, row: u64) -> usize {
        let n = self.members.len() as u64;
        (n - 1 - row % n) as usize
    }

    /// Per-member pieces of `[off, end)`: (member, member offset, len, row), in address order.
    fn pieces(&self, off: u64, end: u64) -> Vec<(usize, u64, u64, u64)> {
        let su = self.cfg.stripe_unit_bytes;
        let mut v = Vec::new();
        let mut at = off;
        while at < end {
            let u = at / su;
            let next = ((u + 1) * su).min(end);
            let (m, base) = self.locate(u);
            v.push((m, base + at % su, next - at, u / self.data_per_row()));
            at = next;
        }
        v
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn send(&mut self, now_ns: u64, parent: u64, member: usize, op: IoOp, rmw: Option<u64>) {
        let id = self.new_id();
        self.subs.insert(
            id,
            Sub {
                parent,
                member,
                rmw,
            },
        );
        self.members[member].submit(now_ns, id, op);
    }

    /// Sends `ops`, merging pieces that are adjacent on the same member.
    fn send_merged(
        &mut self,
        now_ns: u64,
        parent: u64,
        kind: IoKind,
        fua: bool,
        pieces: &[(usize, u64, u64, u64)],
    ) -> u32 {
        let mut merged: Vec<(usize, IoOp)> = Vec::new();
        for &(m, moff, len, _) in pieces {
            if let Some((_, op)) = merged.iter_mut().rev().find(|(mm, _)| *mm == m) {
                if op.end() == moff {
                    op.len += len;
                    continue;
                }
            }
            merged.push((
                m,
                IoOp {
                    kind,
                    offset: moff,
                    len,
                    fua,
                },
            ));
        }
        let n = merged.len() as u32;
        for (m, op) in merged {
            self.send(now_ns, parent, m, op, None);
        }
        n
    }

    fn raid5_write(&mut self, now_ns: u64, parent: u64, op: &IoOp) -> u32 {
        let su = self.cfg.stripe_unit_bytes;
        let row_bytes = su * self.data_per_row();
        let pieces = self.pieces(op.offset, op.end());
        let mut parts = 0;
        let mut i = 0;
        while i < pieces.len() {
            let row = pieces[i].3;
            let j = i + pieces[i..].iter().take_while(|p| p.3 == row).count();
            let row_pieces = &pieces[i..j];
            let covered: u64 = row_pieces.iter().map(|p| p.2).sum();
            let pm = self.parity_member(row);
            let fua = op.fua;
            let w = |off: u64, len: u64| IoOp {
                kind: IoKind::Write,
                offset: off,
                len,
                fua,
            };
            if covered == row_bytes {
                // Full stripe: parity from the new data alone.
                for &(m, moff, len, _) in row_pieces {
                    self.send(now_ns, parent, m, w(moff, len), None);
                }
                self.send(now_ns, parent, pm, w(row * su, su), None);
                parts += row_pieces.len() as u32 + 1;
            } else {
                // Read-modify-write: old data + old parity, then new data + new parity.
                let lo = row_pieces.iter().map(|p| p.1 % su).min().expect("piece");
                let hi = row_pieces
                    .iter()
                    .map(|p| p.1 % su + p.2)
                    .max()
                    .expect("piece");
                let mut reads: Vec<(usize, IoOp)> = row_pieces
                    .iter()
                    .map(|&(m, moff, len, _)| (m, IoOp::new(IoKind::Read, moff, len)))
                    .collect();
                reads.push((pm, IoOp::new(IoKind::Read, row * su + lo, hi - lo)));
                let writes = reads
                    .iter()
                    .map(|&(m, r)| (m, w(r.offset, r.len)))
                    .collect();
                let rid = self.new_id();
                self.rmws.insert(
                    rid,
                    Rmw {
                        parent,
                        reads_left: reads.len() as u32,
                        writes,
                        failed: false,
                    },
                );
                parts += reads.len() as u32 + 1; // the +1 holds the parent until writes go
                for (m, r) in reads {
                    self.send(now_ns, parent, m, r, Some(rid));
                }
            }
            i = j;
        }
        parts
    }

    fn on_member_done(&mut self, now_ns: u64, c: Completion) {
        let sub = self.subs.remove(&c.id).expect("RAID sub-op");
        let fail = |p: &mut Parent, e: DeviceError| {
            if p.error.is_none() {
                p.error = Some(DeviceError::Member {
                    member: sub.member,
                    source: Box::new(e),
                });
            }
        };
        let parent = self.parents.get_mut(&sub.parent).expect("RAID parent");
        if let Err(e) = c.result.clone() {
            fail(parent, e);
        }
        let mut release = 1;
        if let Some(rid) = sub.rmw {
            let rmw = self.rmws.get_mut(&rid).expect("rmw");
            rmw.reads_left -= 1;
            rmw.failed |= c.result.is_err();
            if rmw.reads_left == 0 {
                let rmw = self.rmws.remove(&rid).expect("rmw");
                release += 1;
                if !rmw.failed {
                    let n = rmw.writes.len() as u32;
                    self.parents
                        .get_mut(&rmw.parent)
                        .expect("parent")
                        .parts_left += n;
                    for (m, op) in rmw.writes {
                        self.send(now_ns, rmw.parent, m, op, None);
                    }
                }
            }
        }
        self.finish_parts(sub.parent, release, c.time_ns);
    }

    fn finish_parts(&mut self, tag: u64, n: u32, time_ns: u64) {
        let p = self.parents.get_mut(&tag).expect("RAID parent");
        p.parts_left -= n;
        p.last_ns = p.last_ns.max(time_ns);
        if p.parts_left == 0 {
            let p = self.parents.remove(&tag).expect("RAID parent");
            self.instant.push(Done {
                tag,
                time_ns: p.last_ns,
                result: p.error.map_or(Ok(()), Err),
            });
        }
    }
}

impl Model for Raid {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        self.parents.insert(
            tag,
            Parent {
                parts_left: u32::MAX / 2, // guard while the parts are sent
                error: None,
                last_ns: now_ns,
            },
        );
        let parts = match (op.kind, self.cfg.level) {
            (IoKind::Flush, _) => {
                for m in 0..self.members.len() {
                    self.send(now_ns, tag, m, *op, None);
                }
                self.members.len() as u32
            }
            (IoKind::Trim, RaidLevel::Raid5) => 0,
            (IoKind::Read, _) | (IoKind::Trim, RaidLevel::Raid0) => {
                let pieces = self.pieces(op.offset, op.end());
                self.send_merged(now_ns, tag, op.kind, op.fua, &pieces)
            }
            (IoKind::Write, RaidLevel::Raid0) => {
                let pieces = self.pieces(op.offset, op.end());
                self.send_merged(now_ns, tag, op.kind, op.fua, &pieces)
            }
            (IoKind::Write, RaidLevel::Raid5) => self.raid5_write(now_ns, tag, op),
        };
        // Members complete nothing inside `submit`, so the guard can go now.
        let p = self.parents.get_mut(&tag).expect("parent");
        p.parts_left = p.parts_left - u32::MAX / 2 + parts;
        if p.parts_left == 0 {
            self.finish_parts(tag, 0, now_ns);
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
        let next = |ms: &[Box<dyn Device>]| ms.iter().filter_map(|m| m.next_completion()).min();
        while let Some(t) = next(&self.members).filter(|&t| t <= now_ns) {
            for m in 0..self.members.len() {
                if self.members[m].next_completion().is_some_and(|x| x <= t) {
                    self.members[m].advance(t, &mut buf);
                }
            }
            buf.sort_by_key(|c| c.time_ns);
            for c in buf.drain(..) {
                self.on_member_done(t, c);
            }
        }
        self.buf = buf;
        out.append(&mut self.instant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checked, Ram, RamConfig};

    fn ram_members(n: usize) -> Vec<Box<dyn Device>> {
        (0..n)
            .map(|_| {
                let cfg = RamConfig {
                    capacity_bytes: 1 << 30,
                    ..RamConfig::default()
                };
                Box::new(Checked::new(Ram::new(cfg).unwrap())) as Box<dyn Device>
            })
            .collect()
    }

    #[test]
    fn raid0_layout_and_capacity() {
        let r = Raid::new(RaidConfig::default(), ram_members(4)).unwrap();
        assert_eq!(r.capacity, 4 << 30);
        let su = 64 << 10;
        assert_eq!(r.locate(0), (0, 0));
        assert_eq!(r.locate(5), (1, su));
        let p = r.pieces(su - 512, su + 512);
        assert_eq!(p, vec![(0, su - 512, 512, 0), (1, 0, 512, 0)]);
    }

    #[test]
    fn raid5_parity_rotates_and_skips_parity_member() {
        let cfg = RaidConfig {
            level: RaidLevel::Raid5,
            ..RaidConfig::default()
        };
        let r = Raid::new(cfg, ram_members(4)).unwrap();
        assert_eq!(r.capacity, 3 << 30);
        for row in 0..8u64 {
            let pm = r.parity_member(row);
            let mut seen = vec![pm];
            for k in 0..3 {
                let (m, off) = r.locate(row * 3 + k);
                assert_eq!(off, row * (64 << 10));
                seen.push(m);
            }
            seen.sort();
            assert_eq!(seen, vec![0, 1, 2, 3], "row {row}");
        }
    }

    #[test]
    fn raid5_trim_completes_without_member_work() {
        let cfg = RaidConfig {
            level: RaidLevel::Raid5,
            ..RaidConfig::default()
        };
        let mut r = Checked::new(Raid::new(cfg, ram_members(3)).unwrap());
        r.submit(10, 1, IoOp::new(IoKind::Trim, 0, 1 << 20));
        assert_eq!(r.next_completion(), Some(10));
        let mut done = Vec::new();
        r.advance(10, &mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(r.model().members()[0].stats().ops(), 0);
    }
}
