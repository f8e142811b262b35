//! A pool of cache devices ("members") seen as one slot space.
//!
//! Member `d` owns the slots `[base(d), base(d) + lines(d))`; the bases are prefix sums, so the
//! pool's slot space is the concatenation of the members' and has no holes. With more than one
//! member every member's line count is rounded down to a multiple of [`POOL_ALIGN`] (the
//! records of one 4 KiB record page), so a record page never spans two members and a member's
//! slots keep their addresses when another member is added after it. One member is today's
//! single cache device: nothing is rounded and `locate(s) == (0, s)`.
//!
//! The engine keeps addressing the cache by pool slot (`slot << line_shift`); only the
//! executors (live server, simulator) translate a pool address into (member, member address)
//! with [`Pool::locate`] or, for a merged step that may cross a member boundary,
//! [`Pool::split`]. Pure arithmetic: no I/O.

use thiserror::Error;

/// Member sizes of a pool of two or more are multiples of this many lines (one record page).
pub const POOL_ALIGN: u64 = 128;

/// At most this many cache devices in one pool (Qsan's pool is built from up to 8 SSDs).
pub const MAX_MEMBERS: usize = 8;

/// Why a pool cannot be built from the given member sizes.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PoolError {
    #[error("a cache pool needs at least one cache device")]
    Empty,
    #[error("a cache pool holds at most {MAX_MEMBERS} cache devices, {0} given")]
    TooMany(usize),
    #[error(
        "cache device {member} holds {lines} lines; a device of a pool of several must hold at \
         least {POOL_ALIGN} lines"
    )]
    TooSmall { member: usize, lines: u64 },
    #[error("the pool's {0} lines do not fit 32-bit slot numbers")]
    TooLarge(u64),
}

/// The members' slot ranges of a cache pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// `bases[d]` = first pool slot of member `d`; `bases[members]` = capacity.
    bases: Vec<u64>,
}

impl Pool {
    /// A pool of one cache device of `lines` lines (no rounding).
    pub fn single(lines: u64) -> Pool {
        Pool {
            bases: vec![0, lines],
        }
    }

    /// A pool whose member `d` offers `lines[d]` lines. With two or more members each size is
    /// rounded down to a multiple of [`POOL_ALIGN`] (`lines(d)` gives what is used).
    pub fn new(lines: &[u64]) -> Result<Pool, PoolError> {
        match lines.len() {
            0 => return Err(PoolError::Empty),
            1 => return Ok(Pool::single(lines[0])),
            n if n > MAX_MEMBERS => return Err(PoolError::TooMany(n)),
            _ => {}
        }
        let mut bases = Vec::with_capacity(lines.len() + 1);
        let mut next = 0u64;
        for (member, &l) in lines.iter().enumerate() {
            if l < POOL_ALIGN {
                return Err(PoolError::TooSmall { member, lines: l });
            }
            bases.push(next);
            next += l / POOL_ALIGN * POOL_ALIGN;
        }
        bases.push(next);
        if next > u64::from(u32::MAX) {
            return Err(PoolError::TooLarge(next));
        }
        Ok(Pool { bases })
    }

    /// Number of members.
    pub fn members(&self) -> usize {
        self.bases.len() - 1
    }

    /// Total slots of the pool.
    pub fn capacity(&self) -> u64 {
        self.bases[self.members()]
    }

    /// First pool slot of member `d`.
    pub fn base(&self, d: usize) -> u64 {
        self.bases[d]
    }

    /// Slots used on member `d`.
    pub fn lines(&self, d: usize) -> u64 {
        self.bases[d + 1] - self.bases[d]
    }

    /// The pool slots of member `d`.
    pub fn range(&self, d: usize) -> std::ops::Range<u64> {
        self.bases[d]..self.bases[d + 1]
    }

    /// (member, slot within the member) of pool slot `slot`.
    #[inline]
    pub fn locate(&self, slot: u64) -> (usize, u64) {
        debug_assert!(slot < self.capacity(), "slot {slot} outside the pool");
        if self.bases.len() == 2 {
            return (0, slot);
        }
        // bases[0] == 0 <= slot, so the partition point is >= 1.
        let d = self.bases.partition_point(|&b| b <= slot) - 1;
        (d, slot - self.bases[d])
    }

    /// Member holding pool slot `slot`.
    #[inline]
    pub fn member_of(&self, slot: u64) -> usize {
        self.locate(slot).0
    }

    /// Splits the pool slots `[slot, slot + count)` at member boundaries: yields
    /// `(member, first slot within the member, slots)` in order. A merged SSD step of contiguous
    /// pool slots may span two members; each piece is one device request.
    pub fn split(&self, slot: u64, count: u64) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        debug_assert!(slot + count <= self.capacity(), "slots outside the pool");
        let mut at = slot;
        let end = slot + count;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (d, local) = self.locate(at);
            let n = (self.bases[d + 1] - at).min(end - at);
            at += n;
            Some((d, local, n))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_member_is_the_identity_and_is_not_rounded() {
        let p = Pool::new(&[1000]).unwrap();
        assert_eq!(p.members(), 1);
        assert_eq!(p.capacity(), 1000);
        assert_eq!(p.locate(999), (0, 999));
        assert_eq!(p.split(10, 5).collect::<Vec<_>>(), vec![(0, 10, 5)]);
    }

    #[test]
    fn members_are_rounded_to_record_pages_and_concatenated() {
        let p = Pool::new(&[1000, 300, 128]).unwrap();
        assert_eq!((p.lines(0), p.lines(1), p.lines(2)), (896, 256, 128));
        assert_eq!(p.capacity(), 1280);
        assert_eq!(p.locate(0), (0, 0));
        assert_eq!(p.locate(895), (0, 895));
        assert_eq!(p.locate(896), (1, 0));
        assert_eq!(p.locate(1151), (1, 255));
        assert_eq!(p.locate(1152), (2, 0));
        assert_eq!(p.locate(1279), (2, 127));
        for d in 0..3 {
            assert_eq!(p.base(d) % POOL_ALIGN, 0);
            for s in p.range(d) {
                assert_eq!(p.member_of(s), d);
            }
        }
    }

    #[test]
    fn a_run_crossing_members_is_split_at_each_boundary() {
        let p = Pool::new(&[128, 128, 128]).unwrap();
        assert_eq!(
            p.split(120, 150).collect::<Vec<_>>(),
            vec![(0, 120, 8), (1, 0, 128), (2, 0, 14)]
        );
        assert_eq!(p.split(128, 0).count(), 0);
    }

    #[test]
    fn bad_pools_are_refused_with_the_reason() {
        assert_eq!(Pool::new(&[]), Err(PoolError::Empty));
        assert_eq!(Pool::new(&[128; 9]), Err(PoolError::TooMany(9)));
        assert_eq!(
            Pool::new(&[1024, 100]),
            Err(PoolError::TooSmall {
                member: 1,
                lines: 100
            })
        );
        assert!(matches!(
            Pool::new(&[1 << 32, 1 << 32]),
            Err(PoolError::TooLarge(_))
        ));
    }
}
