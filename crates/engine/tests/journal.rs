//! The journal of persisted-record states (`Engine::journal_lines`): an executor that keeps
//! no record image per slot (the live volume, plan-lean step 4) reads the state its image had
//! from the journal. So every change of a slot's key, valid sectors, dirty sectors or
//! pending sectors must be journaled before it happens: a change that is not would make the
//! image (and the durable key derived from it) silently follow the engine.
//!
//! The test keeps the image an executor would hold (updated only when it takes a slot) and
//! checks after every engine call that `journaled(s)` or, when none, `line_state(s)` equals
//! it, for every slot, under requests of every kind, write-backs begun and completed (some
//! failed), dropped and restored lines.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::{
    Engine, EngineConfig, LineState, Mode, Op, Request, Validity, WbTicket, COPY_KEY,
};

const CAP: u32 = 48;
const LINES: u64 = 160;

fn check(e: &Engine, image: &[LineState], what: &str) {
    for s in 0..image.len() as u32 {
        let seen = e.journaled(s).unwrap_or_else(|| e.line_state(s));
        assert_eq!(
            seen,
            image[s as usize],
            "slot {s} after {what}: its state changed without a journal entry (now {:?})",
            e.line_state(s)
        );
    }
}

fn run(seed: u64, policy: &str, validity: Validity) {
    let cfg = EngineConfig {
        capacity_lines: CAP as u64,
        mode: Mode::WriteBack,
        validity,
        policy: policy.into(),
        ..Default::default()
    };
    run_cfg(seed, cfg, LINES);
}

fn is_copy(l: LineState) -> bool {
    l.key != u64::MAX && l.key & COPY_KEY != 0
}

fn run_cfg(seed: u64, cfg: EngineConfig, lines: u64) {
    let validity = cfg.validity;
    let mirrored = cfg.dirty_copies >= 2;
    let mut e = Engine::new(cfg).unwrap();
    let cap = e.capacity_lines() as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Some history before the journal starts: the image is the engine's state then.
    for i in 0..40 {
        e.process(&Request::write(i * 4096 % (lines * 4096), 4096))
            .unwrap();
    }
    e.journal_lines(true);
    let mut image: Vec<LineState> = (0..cap).map(|s| e.line_state(s)).collect();
    let mut tickets: Vec<WbTicket> = Vec::new();
    let mut took = 0u64;
    let (mut copies_listed, mut copies_now) = (0u64, 0u64);
    for step in 0..3000 {
        let what;
        match rng.gen_range(0..100) {
            0..=59 => {
                let op = match rng.gen_range(0..10) {
                    0..=3 => Op::Read,
                    4..=8 => Op::Write,
                    _ => Op::Trim,
                };
                let off = rng.gen_range(0..lines * 8) * 512;
                let len = rng.gen_range(1..24u64) * 512;
                let len = len.min(lines * 4096 - off);
                what = format!("step {step}: {op:?} {off}+{len}");
                e.process(&Request::new(0, op, off, len)).unwrap();
            }
            60..=69 => {
                what = format!("step {step}: begin_clean");
                if let Some(t) = e.begin_clean(rng.gen_range(1..6)).map(|b| b.ticket) {
                    tickets.push(t);
                }
            }
            70..=79 if !tickets.is_empty() => {
                let t = tickets.swap_remove(rng.gen_range(0..tickets.len()));
                // Some lines' write-backs fail: their pending sectors are dirty again.
                let failed: Vec<u32> = (0..cap).filter(|_| rng.gen_bool(0.3)).collect();
                what = format!("step {step}: complete_writeback (failed {failed:?})");
                e.complete_writeback(t, &failed);
            }
            80..=82 if mirrored => {
                // A copy write failed (unmirror) or the primary's read did (promote).
                let s = rng.gen_range(0..cap);
                what = format!("step {step}: unmirror / promote_copy_of {s}");
                if rng.gen_bool(0.5) {
                    e.unmirror(s);
                } else {
                    e.promote_copy_of(s);
                }
            }
            80..=84 => {
                let s = rng.gen_range(0..cap);
                what = format!("step {step}: drop_line {s}");
                if !e.is_pinned(s) {
                    e.drop_line(s);
                }
            }
            85..=89 => {
                // Restore a line into an empty slot (a roll-back does this).
                let s = rng.gen_range(0..cap);
                let key = Engine::line_key(0, rng.gen_range(0..lines));
                what = format!("step {step}: restore_line {key} into {s}");
                // 8 sectors of 512 B per 4 KiB line; whole lines with line validity.
                let valid = if validity == Validity::Line {
                    0xff
                } else {
                    rng.gen_range(1..=0xffu64)
                };
                let dirty = if rng.gen_bool(0.5) { valid } else { 0 };
                let _ = e.restore_line(key, s, valid, dirty, 0);
            }
            _ => {
                what = format!("step {step}: flush");
                e.process(&Request::new(0, Op::Flush, 0, 0)).unwrap();
            }
        }
        check(&e, &image, &what);
        if mirrored {
            // The copy slots whose records changed without a step on them are listed: the
            // executor takes them (`update_records`), after which every slot that is a copy,
            // or was one and is empty now, is as its image says.
            let mut listed = Vec::new();
            e.take_copy_slots(&mut listed);
            copies_listed += listed.len() as u64;
            for &c in &listed {
                e.take_journaled(c);
                image[c as usize] = e.line_state(c);
            }
            for s in 0..cap {
                let (now, img) = (e.line_state(s), image[s as usize]);
                if is_copy(now) || (is_copy(img) && now == LineState::EMPTY) {
                    assert_eq!(
                        img, now,
                        "copy slot {s} after {what}: its record changed but it was not listed"
                    );
                }
            }
            copies_now = copies_now.max(e.copy_slot_count());
        }
        // The executor takes some slots (as `update_records` does for a plan's slots).
        for s in 0..cap {
            if rng.gen_bool(0.2) {
                if e.take_journaled(s).is_some() {
                    took += 1;
                }
                image[s as usize] = e.line_state(s);
            }
        }
        check(&e, &image, &format!("{what}, then taking slots"));
    }
    assert!(took > 1000, "the workload changed few slots ({took})");
    if mirrored {
        assert!(
            copies_listed > 100 && copies_now > 8,
            "few copies ({copies_listed} listed, at most {copies_now} at once)"
        );
        e.check_slots();
    }
    // Taking every slot leaves the journal empty and the image equal to the engine.
    for s in 0..cap {
        e.take_journaled(s);
    }
    assert_eq!(e.journal_len(), 0);
}

#[test]
fn every_change_of_a_slots_record_state_is_journaled() {
    for seed in 0..4 {
        for policy in ["lru", "fifo", "clock", "slru"] {
            run(seed, policy, Validity::Sector);
        }
        run(seed, "lru", Validity::Line);
    }
}

/// A mirrored pool (`dirty_copies` 2): a copy slot's state is its copy record (key | COPY,
/// its line's slot, its line's dirty sectors), journaled before every change of the copy
/// maps or of its line's dirty sectors, and listed for the executor
/// ([`Engine::take_copy_slots`]), since no plan step on the copy's slot says it changed.
#[test]
fn copy_slots_are_journaled_and_listed() {
    for seed in 0..4 {
        for policy in ["lru", "clock"] {
            let cfg = EngineConfig {
                capacity_lines: 256,
                pool_lines: vec![128, 128],
                dirty_copies: 2,
                mode: Mode::WriteBack,
                validity: Validity::Sector,
                policy: policy.into(),
                ..Default::default()
            };
            run_cfg(seed, cfg, 800);
        }
    }
}

#[test]
fn no_journal_when_off() {
    let mut e = Engine::new(EngineConfig {
        capacity_lines: 8,
        mode: Mode::WriteBack,
        ..Default::default()
    })
    .unwrap();
    e.process(&Request::write(0, 4096)).unwrap();
    assert_eq!(e.journaled(0), None);
    assert_eq!(e.journal_len(), 0);
    e.journal_lines(true);
    let before = e.line_state(0);
    e.process(&Request::write(0, 512)).unwrap();
    e.process(&Request::new(0, Op::Trim, 0, 4096)).unwrap();
    // The first state is kept, not the intermediate one.
    assert_eq!(e.journaled(0), Some(before));
    assert_eq!(e.line_state(0), LineState::EMPTY);
    e.journal_lines(false);
    assert_eq!(e.journaled(0), None);
}
