//! Mirrored dirty copies (`EngineConfig::dirty_copies` 2, `docs/plan-multi-cache.md` (c)):
//! a write-back write that dirties a line also writes a copy slot on another live member of
//! the pool, so the loss of one cache device loses no acknowledged write. Only dirty lines
//! have copies (`copy_of`/`owner_of`); a copy slot holds no key, is in neither the map nor
//! the policy, is never a victim and is not free. The copy holds the line's dirty sectors;
//! its clean sectors are on the backing device, so a promoted copy is a line with
//! valid = dirty.

use super::{Engine, LinePart, Runs, EMPTY};

/// Bit of a copy slot's key in [`Engine::line_state`] (and of its record's stored key): the
/// slot holds the dirty sectors of the line whose key is the rest, a second time.
pub const COPY_KEY: u64 = 1 << 62;
use crate::plan::{Plan, Step};
use crate::policy::{Access, Slot, NEVER};
use crate::EngineError;

/// Candidates among the policy's next victims (besides pinned ones) searched for a clean
/// line of another member to give up its slot to a copy.
const COPY_WINDOW: usize = 64;

/// What a write-back write of a cached line does about its copy.
#[derive(Clone, Copy)]
pub(super) enum Mirror {
    /// A dirty line left with one copy (unmirrored): the primary only.
    None,
    /// Write the copy too; the sectors in the mask are filled from the backing device
    /// where the request does not write them.
    Copy(Slot, u64),
    /// No copy can be had (no slot, or the fill would read the backing device under a
    /// write-back in flight): write through, also into the line's copy if it has one.
    Through(Option<Slot>),
}

/// What [`Engine::begin_remirror`] planned: each pair is (line slot, new copy slot); the
/// plan reads the line's dirty sectors and writes them to the copy.
pub struct Remirror<'a> {
    pub pairs: &'a [(Slot, Slot)],
    pub plan: &'a Plan,
}

impl Engine {
    #[inline]
    pub(super) fn mirrors(&self) -> bool {
        self.cfg.dirty_copies >= 2
    }

    /// Slots held by copies (of lines, and held for write-backs or re-mirrors in flight).
    #[inline]
    pub(super) fn copy_slots(&self) -> u32 {
        (self.owner_of.len() + self.held.len()) as u32
    }

    /// Dirty lines plus their copies: what the dirty watermarks compare with the slots.
    pub(super) fn dirty_load(&self) -> u64 {
        self.dirty_count + self.owner_of.len() as u64
    }

    /// The mirrored copy of the dirty line in `slot`, if it has one.
    #[inline]
    pub fn copy_of(&self, slot: Slot) -> Option<Slot> {
        if self.copy_of.is_empty() {
            return None;
        }
        self.copy_of.get(&slot).copied()
    }

    /// The line whose mirrored copy is `copy`, if it is one.
    pub fn owner_of(&self, copy: Slot) -> Option<Slot> {
        self.owner_of.get(&copy).copied()
    }

    /// Slots now holding copies, including those held by write-backs and re-mirrors in
    /// flight.
    pub fn copy_slot_count(&self) -> u64 {
        u64::from(self.copy_slots())
    }

    /// Dirty lines with one cache copy only (with `dirty_copies` 2; 0 otherwise).
    pub fn unmirrored_lines(&self) -> u64 {
        if !self.mirrors() {
            return 0;
        }
        self.dirty_count - self.copy_of.len() as u64
    }

    /// Forgets the copy of the line in `slot` (its slot is free again): the line has one
    /// cache copy. Returns the copy's slot. For an executor whose copy write failed, or a
    /// read fallback that found the primary bad (with roles swapped by the caller).
    pub fn unmirror(&mut self, slot: Slot) -> Option<Slot> {
        let c = self.copy_of(slot)?;
        self.journal_copy(c);
        self.copy_of.remove(&slot);
        let owner = self.owner_of.remove(&c);
        debug_assert_eq!(owner, Some(slot), "copy maps agree");
        if !self.slots.is_dead(c) {
            self.slots.push(c);
        }
        Some(c)
    }

    /// The line in `slot` cannot be read (its device failed a read): its mirrored copy
    /// becomes the line (valid = its dirty sectors, the others are on the backing device)
    /// and `slot` is freed. Returns the copy's slot; `None` (nothing changes) when the line
    /// has no copy or a write-back in flight pins it.
    pub fn promote_copy_of(&mut self, slot: Slot) -> Option<Slot> {
        if self.is_pinned(slot) {
            return None;
        }
        let c = self.copy_of(slot)?;
        self.journal_copy(c);
        self.copy_of.remove(&slot);
        let owner = self.owner_of.remove(&c);
        debug_assert_eq!(owner, Some(slot), "copy maps agree");
        Some(self.promote_copy(slot, c))
    }

    /// Makes `copy` the mirrored copy of the dirty line in `slot`.
    pub(super) fn link_copy(&mut self, slot: Slot, copy: Slot) {
        if self.copy_of.get(&slot) == Some(&copy) {
            return;
        }
        debug_assert!(self.is_dirty(slot), "a copy for clean line {slot}");
        debug_assert_ne!(
            self.member_of(slot),
            self.member_of(copy),
            "a copy on its line's member"
        );
        debug_assert_eq!(
            self.keys.at(copy as usize),
            EMPTY,
            "copy slot {copy} holds a line"
        );
        self.journal_copy(copy);
        let old = self.copy_of.insert(slot, copy);
        debug_assert!(old.is_none(), "line {slot} had another copy");
        let prev = self.owner_of.insert(copy, slot);
        debug_assert!(prev.is_none(), "slot {copy} was a copy already");
    }

    /// The line in `slot` is being written back: its copy leaves it and is held until the
    /// ticket completes ([`super::WbLine::copy`]).
    pub(super) fn detach_copy(&mut self, slot: Slot) -> Option<Slot> {
        let c = self.copy_of(slot)?;
        self.journal_copy(c);
        self.copy_of.remove(&slot);
        self.owner_of.remove(&c);
        self.held.insert(c, ());
        Some(c)
    }

    /// A held copy slot is free again.
    pub(super) fn release_held(&mut self, c: Slot) {
        if self.held.remove(&c).is_some() {
            self.slots.push(c);
        }
    }

    /// A write-back of the line in `slot` failed; `c` is the copy it held and `before` the
    /// line's dirty sectors before its pending ones became dirty again. Not written since
    /// begin: `c` holds exactly those sectors and is its copy again. Written since (a new
    /// copy lacks the failed sectors, the old one the new ones): one copy left, the line is
    /// unmirrored until [`Engine::begin_remirror`].
    pub(super) fn writeback_failed_copy(&mut self, slot: Slot, c: Slot, before: u64) {
        if before == 0 && self.copy_of(slot).is_none() && self.is_dirty(slot) {
            self.held.remove(&c);
            self.link_copy(slot, c);
        } else {
            self.unmirror(slot);
            self.release_held(c);
        }
    }

    /// Whether the plan being built writes `slot` (a line this request wrote through may
    /// not become a copy: two writes of one slot in a plan have no order).
    fn plan_writes(&self, slot: Slot) -> bool {
        let (lo, hi) = (self.ssd_addr(slot), self.ssd_addr(slot + 1));
        self.plan.steps.iter().any(|s| match *s {
            Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } => {
                ssd < hi && ssd + len > lo
            }
            _ => false,
        })
    }

    /// A slot for the copy of a line in `primary`: a free slot of another live member,
    /// else the first clean unpinned line of another member among the policy's next
    /// victims, unmapped (no write-back: it is clean). `None` when there is neither.
    pub(super) fn alloc_copy(&mut self, ci: usize, primary: Slot) -> Option<Slot> {
        let d = self.member_of(primary);
        if let Some(s) = self.slots.pop_other(d, &self.keys) {
            return Some(s);
        }
        let mut hint = std::mem::take(&mut self.cand_buf);
        hint.clear();
        self.policy
            .eviction_candidates(self.pins.len() + COPY_WINDOW, &mut hint);
        let found = hint.iter().copied().find(|&s| {
            s != primary
                && self.keys.at(s as usize) != EMPTY
                && !self.is_dirty(s)
                && !self.is_pinned(s)
                && self.member_of(s) != d
                && !self.plan_writes(s)
        });
        self.cand_buf = hint;
        let v = found?;
        self.counters[ci].evictions += 1;
        self.unmap(v, true);
        Some(v)
    }

    /// What a write-back write into the cached line in `slot` does about its copy (see
    /// [`Mirror`]); `fill` are the sectors that become dirty without being written whole.
    pub(super) fn mirror_for_write(&mut self, ci: usize, slot: Slot, fill: u64) -> Mirror {
        let pending = self.pending_mask(slot);
        if let Some(c) = self.copy_of(slot) {
            if fill & pending != 0 {
                return Mirror::Through(Some(c));
            }
            return Mirror::Copy(c, fill);
        }
        if self.is_dirty(slot) {
            return Mirror::None;
        }
        if fill & pending != 0 {
            return Mirror::Through(None);
        }
        match self.alloc_copy(ci, slot) {
            Some(c) => Mirror::Copy(c, fill),
            None => Mirror::Through(None),
        }
    }

    /// The request's bytes of line `p` to copy slot `c`, and from the backing device the
    /// rest of the sectors in `fill`.
    pub(super) fn emit_copy(&mut self, ci: usize, vol: u32, p: &LinePart, c: Slot, fill: u64) {
        let base = self.ssd_addr(c);
        let (buf, len) = (p.lo - self.plan.buf_start, p.hi - p.lo);
        let ssd = base + (p.lo - p.line_start);
        self.emit(ci, Step::WriteSsd { ssd, buf, len });
        let ss = self.sector_shift;
        for (a, b) in Runs(fill) {
            let (ra, rb) = (p.line_start + (a << ss), p.line_start + (b << ss));
            if ra < p.lo {
                let (hdd, len) = (ra, rb.min(p.lo) - ra);
                let ssd = base + (ra - p.line_start);
                self.emit(ci, Step::Populate { vol, hdd, ssd, len });
            }
            if rb > p.hi {
                let from = ra.max(p.hi);
                let (hdd, len) = (from, rb - from);
                let ssd = base + (from - p.line_start);
                self.emit(ci, Step::Populate { vol, hdd, ssd, len });
            }
        }
    }

    /// A write outside write-back mirroring (write-through, read-only) into a line that has
    /// a copy: the copy gets the bytes too (its dirty sectors must stay current).
    pub(super) fn write_copy_too(&mut self, ci: usize, vol: u32, p: &LinePart, slot: Slot) {
        if let Some(c) = self.copy_of(slot) {
            self.emit_copy(ci, vol, p, c, 0);
        }
    }

    /// The dirty line in `slot` (on a failed member) moves to its copy `c` (already
    /// unlinked): valid = dirty sectors there. Returns `c`.
    pub(super) fn promote_copy(&mut self, slot: Slot, c: Slot) -> Slot {
        let key = self.keys.at(slot as usize);
        let dirty = self.dirty_mask(slot);
        let class = self.line_class(slot);
        // Not a line leaving the cache: it stays, at another slot.
        let track = std::mem::replace(&mut self.track_unmapped, false);
        self.remove(slot, false);
        self.track_unmapped = track;
        let a = Access {
            key,
            seq: self.seq,
            next_use: NEVER,
            is_write: true,
            class,
        };
        self.place(c, key, class, &a);
        self.set_valid(c, dirty);
        self.set_dirty_mask(c, key, dirty);
        c
    }

    /// Open-time reconciliation: `copy` (free) holds the dirty sectors `mask` of the line
    /// `key` cached in `primary`. Refused, changing nothing, unless `dirty_copies` is 2,
    /// `primary` holds `key` dirty with exactly `mask` and no copy, and `copy` is a free
    /// slot of another live member.
    pub fn restore_copy(
        &mut self,
        key: u64,
        primary: Slot,
        copy: Slot,
        mask: u64,
    ) -> Result<(), EngineError> {
        let refuse = |why: String| {
            Err(EngineError::Config(format!(
                "restore copy {copy} of key {key:#x} in slot {primary}: {why}"
            )))
        };
        if !self.mirrors() {
            return refuse("dirty_copies is 1".into());
        }
        if primary >= self.cap || copy >= self.cap {
            return refuse(format!("slots are below {}", self.cap));
        }
        if self.keys.at(primary as usize) != key || !self.is_dirty(primary) {
            return refuse("the slot does not hold the key dirty".into());
        }
        if self.dirty_mask(primary) != mask {
            return refuse(format!(
                "dirty sectors {mask:#x} differ from the line's {:#x}",
                self.dirty_mask(primary)
            ));
        }
        if self.copy_of.contains_key(&primary) {
            return refuse("the line has a copy already".into());
        }
        if self.member_of(primary) == self.member_of(copy) {
            return refuse("the copy is on the line's own cache device".into());
        }
        let busy = self.keys.at(copy as usize) != EMPTY
            || self.owner_of.contains_key(&copy)
            || self.held.contains_key(&copy)
            || self.is_pinned(copy)
            || self.slots.is_dead(copy);
        if busy || !self.slots.claim(copy, &self.keys) {
            return refuse("the copy slot is not free".into());
        }
        self.link_copy(primary, copy);
        Ok(())
    }

    /// Up to `max` dirty lines with one cache copy (`dirty_copies` 2), in slot order, not
    /// counting those a re-mirror in flight copies: for [`Engine::begin_remirror`], or for
    /// the executor to clean first when no slot for a copy is left. O(slots / 64 + found).
    pub fn unmirrored_slots(&self, max: u64) -> Vec<Slot> {
        let mut lines = Vec::new();
        if !self.mirrors() {
            return lines;
        }
        'scan: for (w, &word) in self.dirty.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                if lines.len() as u64 >= max {
                    break 'scan;
                }
                let s = (w * 64) as Slot + bits.trailing_zeros();
                bits &= bits - 1;
                if !self.copy_of.contains_key(&s) && !self.remirroring.contains_key(&s) {
                    lines.push(s);
                }
            }
        }
        lines
    }

    /// Plans copies for up to `max` unmirrored dirty lines (with `dirty_copies` 2 and two or
    /// more live members): per line a new copy slot (as for a write) and `ReadSsd` of its
    /// dirty sectors into the buffer then `WriteSsd` to the copy. The copies are held until
    /// [`Engine::complete_remirror`]; a line written, cleaned or dropped meanwhile does not
    /// get its copy. `None` when there is nothing to do or no slot for a copy.
    pub fn begin_remirror(&mut self, max: u64) -> Option<Remirror<'_>> {
        if !self.mirrors() || self.slots.live_members() < 2 {
            return None;
        }
        let lines = self.unmirrored_slots(max);
        self.plan.reset(0, 0);
        let mut pairs = std::mem::take(&mut self.remirror_buf);
        pairs.clear();
        let mut buf = 0;
        let ss = self.sector_shift;
        for s in lines {
            let ci = self.line_class(s) as usize;
            let Some(c) = self.alloc_copy(ci, s) else {
                break;
            };
            let key = self.keys.at(s as usize);
            for (a, b) in Runs(self.dirty_mask(s)) {
                let (off, len) = (a << ss, (b - a) << ss);
                let ssd = self.ssd_addr(s) + off;
                self.emit(ci, Step::ReadSsd { ssd, buf, len });
                let ssd = self.ssd_addr(c) + off;
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                buf += len;
            }
            self.held.insert(c, ());
            self.remirroring.insert(s, (key, c));
            pairs.push((s, c));
        }
        self.plan.buf_len = buf;
        self.remirror_buf = pairs;
        if self.remirror_buf.is_empty() {
            return None;
        }
        Some(Remirror {
            pairs: &self.remirror_buf,
            plan: &self.plan,
        })
    }

    /// Ends a re-mirror: each (line, copy) pair of [`Engine::begin_remirror`] whose line is
    /// still the same dirty line, not written meanwhile and not in `failed` (the executor's
    /// failed reads or writes, by line slot) gets the copy; the other copies are freed.
    /// Returns the lines mirrored.
    pub fn complete_remirror(&mut self, pairs: &[(Slot, Slot)], failed: &[Slot]) -> u64 {
        let mut n = 0;
        for &(s, c) in pairs {
            let entry = self.remirroring.get(&s).copied();
            if entry.is_some_and(|e| e.1 == c) {
                self.remirroring.remove(&s);
            }
            let ok = entry == Some((self.keys.at(s as usize), c))
                && !failed.contains(&s)
                && self.is_dirty(s)
                && self.copy_of(s).is_none();
            if ok {
                self.held.remove(&c);
                self.link_copy(s, c);
                n += 1;
            } else {
                self.release_held(c);
            }
        }
        n
    }

    /// A write into the line in `slot`: a re-mirror in flight would copy older bytes.
    #[inline]
    pub(super) fn remirror_written(&mut self, slot: Slot) {
        if !self.remirroring.is_empty() {
            self.remirroring.remove(&slot);
        }
    }

    /// The copy invariants (tests, through [`Engine::check_slots`]): the maps agree; every
    /// copy belongs to a cached dirty line, lies on another live member, holds no line, is
    /// neither free (`seen`), pinned, in the map nor among the policy's candidates; held
    /// copies likewise hold nothing and are not free.
    pub(super) fn check_copies(&self, seen: &[bool]) {
        assert_eq!(self.copy_of.len(), self.owner_of.len(), "copy maps agree");
        if !self.mirrors() {
            assert!(
                self.copy_of.is_empty() && self.held.is_empty(),
                "copies with dirty_copies 1"
            );
        }
        for (&p, &c) in &self.copy_of {
            assert_eq!(
                self.owner_of.get(&c),
                Some(&p),
                "copy {c} of {p}: maps agree"
            );
            let key = self.keys.at(p as usize);
            assert!(key != EMPTY, "slot {p} with copy {c} holds no line");
            assert!(self.is_dirty(p), "clean line {p} has copy {c}");
            assert_eq!(
                self.keys.at(c as usize),
                EMPTY,
                "copy slot {c} holds a line"
            );
            assert_eq!(
                self.lookup(key),
                Some(p),
                "the map points at line {p}, not its copy"
            );
            assert_ne!(
                self.member_of(p),
                self.member_of(c),
                "copy {c} on the member of {p}"
            );
            assert!(
                !self.slots.is_dead(c) && !self.slots.is_dead(p),
                "copy on a failed member"
            );
            assert!(!seen[c as usize], "copy slot {c} is free");
            assert!(!self.is_pinned(c), "copy slot {c} is pinned");
            assert!(!self.held.contains_key(&c), "copy slot {c} is also held");
        }
        for &c in self.held.keys() {
            assert_eq!(
                self.keys.at(c as usize),
                EMPTY,
                "held copy slot {c} holds a line"
            );
            assert!(!seen[c as usize], "held copy slot {c} is free");
        }
        if !self.copy_of.is_empty() {
            let mut cand = Vec::new();
            self.policy
                .eviction_candidates(self.cap as usize, &mut cand);
            for s in cand {
                assert!(
                    !self.owner_of.contains_key(&s),
                    "copy slot {s} is in the policy"
                );
            }
        }
    }
}
