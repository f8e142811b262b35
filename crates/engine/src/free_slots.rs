//! The engine's slots that hold no line: a free list plus the never-used slots, per member of
//! a cache pool ([`crate::Pool`]).
//!
//! One member (today's single cache device): one free list and one cursor over the fresh
//! slots, exactly as before pools (no per-allocation cost). Several members: the fresh slots
//! are handed out in stripes of [`STRIPE_LINES`] slots of one member (a multi-line miss stays
//! one SSD write per member), each stripe from the live member whose fresh slots are the
//! smallest share of its size used (equal members: round-robin; unequal ones fill at the same
//! rate); freed slots go to their member's free list, and a freed slot is handed out before a
//! fresh one, from the member with the most freed slots (ties: lowest index). A failed member
//! ([`FreeSlots::fail`]) has no free slot until it is revived.

use crate::policy::Slot;
use crate::pool::Pool;

/// Fresh slots handed out from one member before the next member's turn.
pub const STRIPE_LINES: u32 = 8;

/// Free slots of a pool of several members.
#[derive(Debug)]
struct PoolFree {
    pool: Pool,
    /// Per member: its freed slots (may list restored slots while `stale`).
    lists: Vec<Vec<Slot>>,
    /// Per member: its fresh slots used so far (`lines(d)` when failed).
    fresh: Vec<u32>,
    dead: Vec<bool>,
    /// The member whose stripe is being handed out, and its fresh slots left in the stripe.
    cur: usize,
    left: u32,
    /// Slots of failed members.
    dead_slots: u32,
}

#[derive(Debug)]
pub(crate) struct FreeSlots {
    free: Vec<Slot>,
    next_fresh: u32,
    cap: u32,
    /// The lists may still hold slots that [`FreeSlots::note_restored`] filled (removing each
    /// one there would make a restore of n lines O(n^2)); the next allocation drops them.
    stale: bool,
    pool: Option<Box<PoolFree>>,
}

impl FreeSlots {
    pub(crate) fn new(pool: &Pool) -> FreeSlots {
        let cap = pool.capacity() as u32;
        let n = pool.members();
        FreeSlots {
            free: Vec::new(),
            next_fresh: 0,
            cap,
            stale: false,
            pool: (n > 1).then(|| {
                Box::new(PoolFree {
                    pool: pool.clone(),
                    lists: vec![Vec::new(); n],
                    fresh: vec![0; n],
                    dead: vec![false; n],
                    cur: 0,
                    left: 0,
                    dead_slots: 0,
                })
            }),
        }
    }

    /// Drops the stale entries (slots holding a line) from the free lists, if any.
    #[inline]
    pub(crate) fn drop_stale(&mut self, keys: &crate::keys::Keys) {
        if self.stale {
            let empty = |s: &Slot| keys.at(*s as usize) == crate::engine::EMPTY;
            self.free.retain(empty);
            if let Some(p) = self.pool.as_deref_mut() {
                for l in &mut p.lists {
                    l.retain(empty);
                }
            }
            self.stale = false;
        }
    }

    /// A slot that holds no line (freed slots first, then never-used ones), if any.
    #[inline]
    pub(crate) fn pop(&mut self, keys: &crate::keys::Keys) -> Option<Slot> {
        self.drop_stale(keys);
        if let Some(p) = self.pool.as_deref_mut() {
            return p.pop();
        }
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.next_fresh < self.cap {
            self.next_fresh += 1;
            return Some(self.next_fresh - 1);
        }
        None
    }

    /// `slot` holds no line any more.
    #[inline]
    pub(crate) fn push(&mut self, slot: Slot) {
        if let Some(p) = self.pool.as_deref_mut() {
            let d = p.pool.member_of(slot as u64);
            debug_assert!(!p.dead[d], "slot {slot} of failed member {d} freed");
            p.lists[d].push(slot);
            return;
        }
        self.free.push(slot);
    }

    /// Takes back the slot [`FreeSlots::push`] was just given (a victim removed to be reused).
    #[inline]
    pub(crate) fn take_pushed(&mut self, slot: Slot) -> Slot {
        let s = match self.pool.as_deref_mut() {
            Some(p) => p.lists[p.pool.member_of(slot as u64)].pop(),
            None => self.free.pop(),
        };
        debug_assert_eq!(s, Some(slot), "the slot just freed is taken back");
        s.expect("the slot was just freed")
    }

    /// A line was restored into `slot` (warm restart): the fresh slots before it become
    /// freed slots; a slot freed before is now stale on its list.
    pub(crate) fn note_restored(&mut self, slot: Slot) {
        if let Some(p) = self.pool.as_deref_mut() {
            let (d, local) = p.pool.locate(slot as u64);
            let local = local as u32;
            debug_assert!(!p.dead[d], "restore into failed member {d}");
            if local >= p.fresh[d] {
                let base = p.pool.base(d) as u32;
                p.lists[d].extend(base + p.fresh[d]..base + local);
                p.fresh[d] = local + 1;
            } else {
                self.stale = true;
            }
            return;
        }
        if slot >= self.next_fresh {
            self.free.extend(self.next_fresh..slot);
            self.next_fresh = slot + 1;
        } else {
            self.stale = true;
        }
    }

    /// [`FreeSlots::note_restored`] of every slot set in `map` (bit `s % 64` of word
    /// `s / 64`), ascending: the same lists and counters. A word of 64 restored slots that
    /// starts at the next fresh slot of a single device just moves it past them (a full
    /// cache's restart, 10^8 slots, makes no call per slot).
    pub(crate) fn note_restored_map(&mut self, map: &[u64]) {
        for (w, &x) in map.iter().enumerate() {
            let first = (w * 64) as u32;
            if x == u64::MAX && self.pool.is_none() && self.next_fresh == first {
                self.next_fresh = first + 64;
                continue;
            }
            let mut x = x;
            while x != 0 {
                self.note_restored(first + x.trailing_zeros());
                x &= x - 1;
            }
        }
    }

    /// A free slot on a live member other than `d` (its freed slots first, the member with
    /// the most; else a fresh one of the live member with the smallest share used), for a
    /// mirrored copy; `None` for a single device or when no other member has one.
    pub(crate) fn pop_other(&mut self, d: usize, keys: &crate::keys::Keys) -> Option<Slot> {
        self.drop_stale(keys);
        let p = self.pool.as_deref_mut()?;
        let n = p.lists.len();
        if let Some(e) = (0..n)
            .filter(|&e| e != d && !p.dead[e] && !p.lists[e].is_empty())
            .max_by_key(|&e| (p.lists[e].len(), std::cmp::Reverse(e)))
        {
            return p.lists[e].pop();
        }
        let e = (0..n)
            .filter(|&e| e != d && !p.dead[e] && u64::from(p.fresh[e]) < p.pool.lines(e))
            .min_by(|&a, &b| {
                let (ua, ub) = (u64::from(p.fresh[a]), u64::from(p.fresh[b]));
                (ua * p.pool.lines(b))
                    .cmp(&(ub * p.pool.lines(a)))
                    .then(a.cmp(&b))
            })?;
        let s = p.pool.base(e) as u32 + p.fresh[e];
        p.fresh[e] += 1;
        if p.cur == e && p.left > 0 {
            p.left -= 1;
        }
        Some(s)
    }

    /// Takes `slot`, free, out of the free slots (a copy installed at open; O(freed slots
    /// of its member) when it was freed before, O(1) when fresh). `false` if it is not free.
    pub(crate) fn claim(&mut self, slot: Slot, keys: &crate::keys::Keys) -> bool {
        self.drop_stale(keys);
        match self.pool.as_deref_mut() {
            Some(p) => {
                let (d, local) = p.pool.locate(slot as u64);
                let local = local as u32;
                if p.dead[d] {
                    return false;
                }
                if local >= p.fresh[d] {
                    let base = p.pool.base(d) as u32;
                    p.lists[d].extend(base + p.fresh[d]..base + local);
                    p.fresh[d] = local + 1;
                    if p.cur == d {
                        p.left = 0;
                    }
                    return true;
                }
                match p.lists[d].iter().position(|&x| x == slot) {
                    Some(i) => {
                        p.lists[d].swap_remove(i);
                        true
                    }
                    None => false,
                }
            }
            None => {
                if slot >= self.next_fresh {
                    self.free.extend(self.next_fresh..slot);
                    self.next_fresh = slot + 1;
                    return true;
                }
                match self.free.iter().position(|&x| x == slot) {
                    Some(i) => {
                        self.free.swap_remove(i);
                        true
                    }
                    None => false,
                }
            }
        }
    }

    /// Whether `slot` lies on a failed member.
    #[inline]
    pub(crate) fn is_dead(&self, slot: Slot) -> bool {
        self.pool
            .as_deref()
            .is_some_and(|p| p.dead[p.pool.member_of(slot as u64)])
    }

    /// Slots of failed members.
    #[inline]
    pub(crate) fn dead_slots(&self) -> u32 {
        self.pool.as_deref().map_or(0, |p| p.dead_slots)
    }

    /// Whether member `d` has failed.
    pub(crate) fn member_dead(&self, d: usize) -> bool {
        self.pool.as_deref().is_some_and(|p| p.dead[d])
    }

    /// Live members.
    pub(crate) fn live_members(&self) -> usize {
        self.pool
            .as_deref()
            .map_or(1, |p| p.dead.iter().filter(|&&x| !x).count())
    }

    /// Member `d` failed: none of its slots is free any more (the caller emptied them first).
    /// Returns its slot count.
    pub(crate) fn fail(&mut self, d: usize) -> u32 {
        let p = self.pool.as_deref_mut().expect("a pool of several members");
        assert!(!p.dead[d], "member {d} failed twice");
        let lines = p.pool.lines(d) as u32;
        p.dead[d] = true;
        p.lists[d] = Vec::new();
        p.fresh[d] = lines;
        if p.cur == d {
            p.left = 0;
        }
        p.dead_slots += lines;
        lines
    }

    /// Member `d` is back (replaced): all its slots are free.
    pub(crate) fn revive(&mut self, d: usize) {
        let p = self.pool.as_deref_mut().expect("a pool of several members");
        assert!(p.dead[d], "member {d} is not failed");
        p.dead[d] = false;
        p.fresh[d] = 0;
        p.dead_slots -= p.pool.lines(d) as u32;
    }

    /// Every free slot (freed slots, then fresh ones), for checks.
    pub(crate) fn all(&self) -> Vec<Slot> {
        match self.pool.as_deref() {
            None => {
                let mut v = self.free.clone();
                v.extend(self.next_fresh..self.cap);
                v
            }
            Some(p) => {
                let mut v = Vec::new();
                for d in 0..p.lists.len() {
                    v.extend_from_slice(&p.lists[d]);
                    let base = p.pool.base(d) as u32;
                    v.extend(base + p.fresh[d]..base + p.pool.lines(d) as u32);
                }
                v
            }
        }
    }

    /// Bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.free.capacity() * 4
            + self.pool.as_deref().map_or(0, |p| {
                p.lists.iter().map(|l| l.capacity() * 4).sum::<usize>() + p.lists.len() * 40
            })
    }
}

impl PoolFree {
    #[inline]
    fn pop(&mut self) -> Option<Slot> {
        // Freed slots first: the member with the most of them.
        let mut best: Option<usize> = None;
        for d in 0..self.lists.len() {
            let n = self.lists[d].len();
            if n > 0 && best.is_none_or(|b| n > self.lists[b].len()) {
                best = Some(d);
            }
        }
        if let Some(d) = best {
            debug_assert!(!self.dead[d], "a failed member {d} lists free slots");
            return self.lists[d].pop();
        }
        // Fresh slots: the current stripe, else a new stripe of the live member whose fresh
        // slots are the smallest share of its size used (ties: lowest index).
        if self.left == 0 || self.fresh[self.cur] as u64 >= self.pool.lines(self.cur) {
            let mut pick: Option<usize> = None;
            for d in 0..self.fresh.len() {
                let (used, lines) = (u64::from(self.fresh[d]), self.pool.lines(d));
                if self.dead[d] || used >= lines {
                    continue;
                }
                let better = pick
                    .is_none_or(|b| used * self.pool.lines(b) < u64::from(self.fresh[b]) * lines);
                if better {
                    pick = Some(d);
                }
            }
            self.cur = pick?;
            self.left = STRIPE_LINES;
        }
        let d = self.cur;
        debug_assert!(!self.dead[d], "fresh slot of failed member {d}");
        let s = self.pool.base(d) as u32 + self.fresh[d];
        self.fresh[d] += 1;
        self.left -= 1;
        Some(s)
    }
}
