//! Reconciliation of a pool's records at open (docs/plan-multi-cache.md (c)3 and (c)4): which
//! records are lines (primaries), which copies ([`format::COPY`]) pair with them, which copy
//! becomes its line's only slot (promoted) and which copy slots are dropped. Pure: the input
//! is the records already read from the present members, the output says what to restore;
//! no I/O, no clock. Used by `tiercache check` on a pool; open calls it once the engine
//! restores copies (`restore_copy`).
//!
//! The rules, per line key `K`:
//! * **Primaries** (records without the copy bit): today's rule, the newest sequence number
//!   wins, the lower slot among equals; the others are superseded. A flush stamps every record
//!   of each page it writes, so sequence numbers do not pair a primary with its copy.
//! * **Copies**: of several copy records of `K` only the newest (then the lower slot) is a
//!   candidate, the others are dropped: a line has one copy at a time, a copy slot is freed
//!   before another is taken, and a flush writes the records as the engine holds them then,
//!   so an older copy record was freed before the newer was written.
//! * The candidate `K|COPY -> P` is **paired** iff the winning primary of `K` is slot `P`,
//!   maps `K` dirty with the copy's dirty mask, and lies on another member. `P` flagged in
//!   flux (an in-place write of a mirrored line may have changed the primary, rule 6) with `P`
//!   mapping `K` dirty on another member: **resync** primary -> copy (the copy gets the
//!   primary's dirty sectors and mask) before serving.
//! * Else, only if `P`'s member is missing or failed and no present member holds a primary
//!   record of `K`, it is **promoted** (a line whose valid sectors are its dirty ones).
//! * Else it is **dropped**: with `P`'s member present, an unpaired copy is older than what
//!   `P` says (a line cleaned, evicted or rewritten since), and serving it would serve stale
//!   data.

use crate::format::{self, Record, EMPTY_KEY};
use std::collections::HashMap;
use tiercache_engine::pool::Pool;

/// A member of the pool as open sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberView {
    /// Read: its records are part of the input.
    Present,
    /// Not given, empty or unreadable.
    Missing,
    /// Marked failed by the newest pool block: never read for records (they may be stale).
    Failed,
}

/// One decoded record of a present member, by pool slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRecord {
    pub slot: u32,
    pub rec: Record,
    /// The stored record carries the in-flux flag ([`format::IN_FLUX`]).
    pub in_flux: bool,
}

/// A dirty line with its two slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The line's key (no flag bits).
    pub key: u64,
    pub primary: u32,
    pub copy: u32,
    /// The dirty sectors both hold (the primary's dirty mask).
    pub mask: u64,
}

/// A copy that becomes its line's only slot: valid and dirty sectors are `mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promoted {
    pub key: u64,
    pub slot: u32,
    pub mask: u64,
}

/// Why a copy slot is dropped (freed; its record emptied at the next flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropWhy {
    /// Its primary slot lies outside the pool: damaged.
    PrimaryOutside,
    /// Its primary slot is on its own member: never written so, damaged.
    SameMember,
    /// A newer copy record of the same line exists.
    OlderCopy,
    /// The primary's member is present and its winning record does not map the line dirty
    /// with the copy's mask: cleaned, evicted or rewritten since.
    Stale,
    /// The primary's member is missing or failed, but a present member maps the line.
    Superseded,
}

/// A dropped copy slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub slot: u32,
    pub key: u64,
    pub why: DropWhy,
}

/// What the records restore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Slots of the winning primary records, ascending.
    pub primaries: Vec<u32>,
    /// Slots of primary records of a key that another slot maps more recently, ascending.
    pub superseded: Vec<u32>,
    /// Paired copies, by copy slot.
    pub paired: Vec<Pair>,
    /// Copies rewritten from their primary before serving ((c)4), by copy slot.
    pub resync: Vec<Pair>,
    /// Copies that become lines, by slot.
    pub promoted: Vec<Promoted>,
    /// Dropped copy slots, by slot.
    pub dropped: Vec<Dropped>,
    /// Dirty lines left with one cache copy (primaries without a copy, promoted copies),
    /// by slot: re-mirrored (or cleaned) before the pool takes writes.
    pub unmirrored: Vec<u32>,
}

/// The winning primary record of a key: its slot, record and in-flux flag.
pub type PrimaryOf = (u32, Record, bool);

/// Reconciles the records of the present members (`members[d]` says whether member `d` was
/// read; `records` holds no record of another member: panics otherwise). Empty records and
/// records without a valid sector are not lines and are left out.
pub fn reconcile(pool: &Pool, members: &[MemberView], records: &[SlotRecord]) -> Reconciled {
    assert_eq!(members.len(), pool.members(), "one view per pool member");
    let mut sorted: Vec<&SlotRecord> = records
        .iter()
        .filter(|r| r.rec.key != EMPTY_KEY && (r.rec.is_copy() || r.rec.valid != 0))
        .collect();
    sorted.sort_by_key(|r| r.slot);
    for r in &sorted {
        assert!(
            (r.slot as u64) < pool.capacity()
                && members[pool.member_of(r.slot as u64)] == MemberView::Present,
            "record of slot {} given, which is not on a present member",
            r.slot
        );
    }
    if let Some(w) = sorted.windows(2).find(|w| w[0].slot == w[1].slot) {
        panic!("two records of slot {}", w[0].slot);
    }
    // Primaries: newest sequence number, then the lower slot (slot order).
    let mut best: HashMap<u64, &SlotRecord> = HashMap::new();
    let mut out = Reconciled::default();
    for r in sorted.iter().filter(|r| !r.rec.is_copy()) {
        match best.get(&r.rec.key) {
            Some(old) if !format::seq_newer(r.rec.seq, old.rec.seq) => {
                out.superseded.push(r.slot);
            }
            Some(old) => {
                out.superseded.push(old.slot);
                best.insert(r.rec.key, r);
            }
            None => {
                best.insert(r.rec.key, r);
            }
        }
    }
    out.primaries = best.values().map(|r| r.slot).collect();
    out.primaries.sort_unstable();
    out.superseded.sort_unstable();
    let copies: Vec<SlotRecord> = sorted
        .iter()
        .filter(|r| r.rec.is_copy())
        .map(|r| **r)
        .collect();
    let c = reconcile_copies(pool, members, &copies, |k| {
        best.get(&k).map(|r| (r.slot, r.rec, r.in_flux))
    });
    out.paired = c.paired;
    out.resync = c.resync;
    out.promoted = c.promoted;
    out.dropped = c.dropped;
    let mirrored: HashMap<u64, ()> = out
        .paired
        .iter()
        .chain(&out.resync)
        .map(|p| (p.key, ()))
        .collect();
    out.unmirrored = best
        .values()
        .filter(|r| r.rec.dirty != 0 && !mirrored.contains_key(&r.rec.key))
        .map(|r| r.slot)
        .chain(out.promoted.iter().map(|p| p.slot))
        .collect();
    out.unmirrored.sort_unstable();
    out
}

/// The copies' half of [`reconcile`], for a caller that picked the primaries itself (open
/// does, over millions of records): `copies` are the copy records of present members,
/// `primary(key)` the winning primary record of `key` (`None`: no present member maps it).
/// Fills `paired`, `resync`, `promoted` and `dropped` only.
pub fn reconcile_copies(
    pool: &Pool,
    members: &[MemberView],
    copies: &[SlotRecord],
    primary: impl Fn(u64) -> Option<PrimaryOf>,
) -> Reconciled {
    let mut out = Reconciled::default();
    // The newest copy record of each key (then the lower slot).
    let mut newest: HashMap<u64, SlotRecord> = HashMap::new();
    let mut by_slot: Vec<&SlotRecord> = copies.iter().collect();
    by_slot.sort_by_key(|r| r.slot);
    for r in by_slot {
        debug_assert!(r.rec.is_copy(), "slot {}: not a copy record", r.slot);
        let (key, p) = (r.rec.line_key(), r.rec.copy_of_slot().unwrap_or(u32::MAX));
        let drop = |why| Dropped {
            slot: r.slot,
            key,
            why,
        };
        if p as u64 >= pool.capacity() {
            out.dropped.push(drop(DropWhy::PrimaryOutside));
            continue;
        }
        if pool.member_of(p as u64) == pool.member_of(r.slot as u64) {
            out.dropped.push(drop(DropWhy::SameMember));
            continue;
        }
        match newest.get(&key) {
            Some(old) if !format::seq_newer(r.rec.seq, old.rec.seq) => {
                out.dropped.push(drop(DropWhy::OlderCopy));
            }
            Some(old) => {
                out.dropped.push(Dropped {
                    slot: old.slot,
                    key,
                    why: DropWhy::OlderCopy,
                });
                newest.insert(key, *r);
            }
            None => {
                newest.insert(key, *r);
            }
        }
    }
    for (&key, c) in &newest {
        let p = c.rec.copy_of_slot().expect("a copy");
        let (pm, cm) = (pool.member_of(p as u64), pool.member_of(c.slot as u64));
        let drop = |why| Dropped {
            slot: c.slot,
            key,
            why,
        };
        match primary(key) {
            Some((ps, pr, flux)) if ps == p && pr.dirty != 0 && pool.member_of(ps as u64) != cm => {
                let pair = Pair {
                    key,
                    primary: p,
                    copy: c.slot,
                    mask: pr.dirty,
                };
                if flux {
                    out.resync.push(pair);
                } else if pr.dirty == c.rec.dirty {
                    out.paired.push(pair);
                } else {
                    out.dropped.push(drop(DropWhy::Stale));
                }
            }
            Some(_) if members[pm] != MemberView::Present => {
                out.dropped.push(drop(DropWhy::Superseded))
            }
            Some(_) => out.dropped.push(drop(DropWhy::Stale)),
            None if members[pm] != MemberView::Present => out.promoted.push(Promoted {
                key,
                slot: c.slot,
                mask: c.rec.dirty,
            }),
            None => out.dropped.push(drop(DropWhy::Stale)),
        }
    }
    out.paired.sort_unstable_by_key(|p| p.copy);
    out.resync.sort_unstable_by_key(|p| p.copy);
    out.promoted.sort_unstable_by_key(|p| p.slot);
    out.dropped.sort_unstable_by_key(|d| d.slot);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemberView::*;

    const K: u64 = 5 << 48 | 1234;

    /// Two members of 256 lines: slots 0..256 on member 0, 256..512 on member 1.
    fn pool() -> Pool {
        Pool::new(&[256, 256]).unwrap()
    }

    fn prim(slot: u32, key: u64, valid: u64, dirty: u64, seq: u32) -> SlotRecord {
        SlotRecord {
            slot,
            rec: Record {
                key,
                valid,
                dirty,
                seq,
            },
            in_flux: false,
        }
    }

    fn copy(slot: u32, key: u64, p: u32, dirty: u64, seq: u32) -> SlotRecord {
        SlotRecord {
            slot,
            rec: Record::copy(key, p, dirty, seq),
            in_flux: false,
        }
    }

    fn dropped(r: &Reconciled) -> Vec<(u32, DropWhy)> {
        r.dropped.iter().map(|d| (d.slot, d.why)).collect()
    }

    #[test]
    fn a_copy_pairs_with_its_dirty_primary_on_another_member() {
        let r = reconcile(
            &pool(),
            &[Present, Present],
            &[prim(3, K, 0xff, 0x0f, 7), copy(300, K, 3, 0x0f, 2)],
        );
        assert_eq!(
            r.paired,
            vec![Pair {
                key: K,
                primary: 3,
                copy: 300,
                mask: 0x0f
            }]
        );
        assert_eq!(r.primaries, vec![3]);
        assert!(r.dropped.is_empty() && r.promoted.is_empty() && r.unmirrored.is_empty());
        // Sequence numbers do not pair: the copy older or newer than its primary, the same.
        let r2 = reconcile(
            &pool(),
            &[Present, Present],
            &[prim(3, K, 0xff, 0x0f, 7), copy(300, K, 3, 0x0f, 90)],
        );
        assert_eq!(r2.paired, r.paired);
    }

    #[test]
    fn stale_copies_are_dropped_while_the_primary_member_is_present() {
        let both = [Present, Present];
        let c = copy(300, K, 3, 0x0f, 2);
        for (what, p) in [
            // The line was cleaned (the copy record not yet emptied).
            ("cleaned", Some(prim(3, K, 0xff, 0, 9))),
            // Evicted: its slot empty, or holding another line.
            ("evicted", None),
            ("reused", Some(prim(3, K + 1, 0xff, 0x0f, 9))),
            // Rewritten: more sectors dirty since (the copy's record older).
            ("rewritten", Some(prim(3, K, 0xff, 0xff, 9))),
            // Moved: the line's newest primary is another slot.
            ("moved", Some(prim(4, K, 0xff, 0x0f, 9))),
        ] {
            let recs: Vec<SlotRecord> = p.into_iter().chain([c]).collect();
            let r = reconcile(&pool(), &both, &recs);
            assert_eq!(dropped(&r), vec![(300, DropWhy::Stale)], "{what}");
            assert!(r.paired.is_empty() && r.promoted.is_empty(), "{what}");
        }
        // A primary mapping the line dirty with the mask, but superseded by a newer record
        // of the line elsewhere: the copy's primary is not the winner.
        let r = reconcile(
            &pool(),
            &both,
            &[
                prim(3, K, 0xff, 0x0f, 7),
                prim(10, K, 0xff, 0, 8),
                copy(300, K, 3, 0x0f, 2),
            ],
        );
        assert_eq!(r.superseded, vec![3]);
        assert_eq!(dropped(&r), vec![(300, DropWhy::Stale)]);
    }

    #[test]
    fn a_copy_is_promoted_only_when_its_primary_member_is_gone_and_nothing_maps_the_line() {
        let c = copy(300, K, 3, 0x0f, 2);
        for view in [Missing, Failed] {
            let r = reconcile(&pool(), &[view, Present], &[c]);
            assert_eq!(
                r.promoted,
                vec![Promoted {
                    key: K,
                    slot: 300,
                    mask: 0x0f
                }]
            );
            assert_eq!(r.unmirrored, vec![300], "the promoted copy is single");
            // A present member maps the line (re-read into another slot): dropped.
            let r = reconcile(&pool(), &[view, Present], &[prim(301, K, 0xff, 0, 9), c]);
            assert_eq!(dropped(&r), vec![(300, DropWhy::Superseded)]);
            assert!(r.promoted.is_empty());
        }
    }

    #[test]
    #[should_panic(expected = "not on a present member")]
    fn records_of_a_failed_member_are_refused() {
        reconcile(&pool(), &[Failed, Present], &[prim(3, K, 1, 1, 1)]);
    }

    #[test]
    fn an_in_flux_primary_resyncs_its_copy() {
        let mut p = prim(3, K, 0xff, 0xff, 7);
        p.in_flux = true;
        // Masks disagree (the in-place write extended it): resync with the primary's mask.
        let r = reconcile(&pool(), &[Present, Present], &[p, copy(300, K, 3, 0x0f, 2)]);
        assert_eq!(
            r.resync,
            vec![Pair {
                key: K,
                primary: 3,
                copy: 300,
                mask: 0xff
            }]
        );
        assert!(r.paired.is_empty() && r.dropped.is_empty() && r.unmirrored.is_empty());
        // In flux but clean: the copy is stale.
        p.rec.dirty = 0;
        let r = reconcile(&pool(), &[Present, Present], &[p, copy(300, K, 3, 0x0f, 2)]);
        assert_eq!(dropped(&r), vec![(300, DropWhy::Stale)]);
        assert!(r.resync.is_empty());
    }

    #[test]
    fn only_the_newest_copy_of_a_line_counts() {
        // A copy freed at a clean whose record was not emptied (slot 301, older), then the
        // line redirtied with a new copy (slot 400, newer): the older one never pairs, even
        // with the mask the primary shows.
        let r = reconcile(
            &pool(),
            &[Present, Present],
            &[
                prim(3, K, 0xff, 0x0f, 20),
                copy(301, K, 3, 0x0f, 5),
                copy(400, K, 3, 0x0f, 19),
            ],
        );
        assert_eq!(r.paired.len(), 1);
        assert_eq!(r.paired[0].copy, 400);
        assert_eq!(dropped(&r), vec![(301, DropWhy::OlderCopy)]);
        // The newer copy is stale (its primary's page not written): the older one is not
        // promoted or paired in its place, though its mask matches the old primary record.
        let r = reconcile(
            &pool(),
            &[Present, Present],
            &[
                prim(3, K, 0xff, 0x0f, 4),
                copy(301, K, 3, 0x0f, 5),
                copy(400, K, 3, 0xff, 19),
            ],
        );
        assert!(r.paired.is_empty());
        assert_eq!(
            dropped(&r),
            vec![(301, DropWhy::OlderCopy), (400, DropWhy::Stale)]
        );
        assert_eq!(r.unmirrored, vec![3]);
        // Primary gone: only the newest copy is promoted.
        let r = reconcile(
            &pool(),
            &[Missing, Present],
            &[copy(301, K, 3, 0x0f, 5), copy(400, K, 3, 0xff, 19)],
        );
        assert_eq!(r.promoted.len(), 1);
        assert_eq!((r.promoted[0].slot, r.promoted[0].mask), (400, 0xff));
        assert_eq!(dropped(&r), vec![(301, DropWhy::OlderCopy)]);
    }

    #[test]
    fn damaged_copies_are_dropped() {
        let r = reconcile(
            &pool(),
            &[Present, Present],
            &[
                prim(3, K, 0xff, 0x0f, 7),
                prim(4, K + 1, 0xff, 0x0f, 7),
                // On the primary's own member.
                copy(5, K, 3, 0x0f, 2),
                // Primary slot outside the pool.
                copy(301, K + 1, 512, 0x0f, 2),
            ],
        );
        assert_eq!(
            dropped(&r),
            vec![(5, DropWhy::SameMember), (301, DropWhy::PrimaryOutside)]
        );
        assert_eq!(r.unmirrored, vec![3, 4]);
    }

    /// A small deterministic generator (no dependency).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random record areas: without copies the result is today's rule (newest sequence
    /// number, then the lower slot) and nothing else; with copies every copy slot lands in
    /// exactly one outcome, a line keeps at most one copy, a kept copy lies on another
    /// member than its primary with its mask, and a promoted line has no primary.
    #[test]
    fn property_outcomes_partition_the_copies() {
        let pool = Pool::new(&[256, 128, 384]).unwrap();
        let cap = pool.capacity() as u32;
        // paired, resync, promoted, then the drop reasons: each is exercised.
        let mut seen_outcomes = [0usize; 8];
        for seed in 1..400u64 {
            let mut g = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let views: Vec<MemberView> = (0..3)
                .map(|_| match g.below(5) {
                    0 => Missing,
                    1 => Failed,
                    _ => Present,
                })
                .collect();
            let with_copies = seed % 4 != 0;
            let mut slots: Vec<u32> = (0..cap)
                .filter(|&s| views[pool.member_of(s as u64)] == Present)
                .collect();
            // Shuffle, take some.
            for i in (1..slots.len()).rev() {
                slots.swap(i, g.below(i as u64 + 1) as usize);
            }
            slots.truncate(g.below(slots.len() as u64 + 1) as usize);
            let mut recs: Vec<SlotRecord> = Vec::new();
            for &s in &slots {
                let mut key = g.below(24);
                let seq = g.below(6) as u32;
                let dirty = [0, 0x0f, 0xff][g.below(3) as usize];
                if with_copies && g.below(3) == 0 {
                    // Mostly the slot of a primary made before (of its key, often with its
                    // mask), else any slot, or one outside the pool.
                    let mut p = g.below(cap as u64 + 2) as u32;
                    let mut d = dirty.max(1);
                    let earlier: Vec<SlotRecord> =
                        recs.iter().filter(|x| !x.rec.is_copy()).copied().collect();
                    if !earlier.is_empty() && g.below(4) != 0 {
                        let e = earlier[g.below(earlier.len() as u64) as usize];
                        (p, key) = (e.slot, e.rec.key);
                        if e.rec.dirty != 0 && g.below(3) != 0 {
                            d = e.rec.dirty;
                        }
                    } else if g.below(2) == 0 {
                        // Its primary on a member not present.
                        if let Some(d) = (0..3).find(|&d| views[d] != Present) {
                            p = (pool.base(d) + g.below(pool.lines(d))) as u32;
                        }
                    }
                    recs.push(copy(s, key, p, d, seq));
                } else {
                    let mut r = prim(s, key, 0xff, dirty, seq);
                    r.in_flux = g.below(8) == 0;
                    recs.push(r);
                }
            }
            let r = reconcile(&pool, &views, &recs);
            seen_outcomes[0] += r.paired.len();
            seen_outcomes[1] += r.resync.len();
            seen_outcomes[2] += r.promoted.len();
            for d in &r.dropped {
                seen_outcomes[3 + d.why as usize] += 1;
            }
            // Primaries: the reference rule.
            let mut want: Vec<u32> = Vec::new();
            for a in recs.iter().filter(|x| !x.rec.is_copy()) {
                let beaten = recs.iter().filter(|x| !x.rec.is_copy()).any(|b| {
                    b.rec.key == a.rec.key
                        && b.slot != a.slot
                        && (format::seq_newer(b.rec.seq, a.rec.seq)
                            || (b.rec.seq == a.rec.seq && b.slot < a.slot))
                });
                if !beaten {
                    want.push(a.slot);
                }
            }
            want.sort_unstable();
            assert_eq!(r.primaries, want, "seed {seed}");
            let n_prim = recs.iter().filter(|x| !x.rec.is_copy()).count();
            assert_eq!(r.primaries.len() + r.superseded.len(), n_prim);
            let copies: Vec<&SlotRecord> = recs.iter().filter(|x| x.rec.is_copy()).collect();
            let mut seen: Vec<u32> = r
                .paired
                .iter()
                .chain(&r.resync)
                .map(|p| p.copy)
                .chain(r.promoted.iter().map(|p| p.slot))
                .chain(r.dropped.iter().map(|d| d.slot))
                .collect();
            seen.sort_unstable();
            let mut all: Vec<u32> = copies.iter().map(|c| c.slot).collect();
            all.sort_unstable();
            assert_eq!(seen, all, "seed {seed}: each copy slot has one outcome");
            if !with_copies {
                assert!(seen.is_empty());
            }
            let mut kept: Vec<u64> = r
                .paired
                .iter()
                .chain(&r.resync)
                .map(|p| p.key)
                .chain(r.promoted.iter().map(|p| p.key))
                .collect();
            let n = kept.len();
            kept.sort_unstable();
            kept.dedup();
            assert_eq!(kept.len(), n, "seed {seed}: a line keeps one copy");
            let rec_of = |s: u32| recs.iter().find(|x| x.slot == s).unwrap().rec;
            for p in r.paired.iter().chain(&r.resync) {
                assert!(r.primaries.contains(&p.primary), "seed {seed}");
                assert_ne!(
                    pool.member_of(p.primary as u64),
                    pool.member_of(p.copy as u64)
                );
                let pr = rec_of(p.primary);
                assert!(pr.dirty == p.mask && pr.key == p.key && pr.dirty != 0);
            }
            for p in &r.paired {
                assert_eq!(rec_of(p.copy).dirty, p.mask, "seed {seed}");
            }
            for p in &r.promoted {
                let c = rec_of(p.slot);
                assert!(r.primaries.iter().all(|&s| rec_of(s).key != p.key));
                assert_ne!(
                    views[pool.member_of(c.copy_of_slot().unwrap() as u64)],
                    Present,
                    "seed {seed}: promoted with its primary's member present"
                );
            }
        }
        assert!(
            seen_outcomes.iter().all(|&n| n > 0),
            "outcomes seen: {seen_outcomes:?}"
        );
    }
}
