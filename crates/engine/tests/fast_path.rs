//! The whole-line fast path (`Engine::fast_line`) must change nothing but speed: the same
//! stream through an engine with it and one without gives the same plan for every request,
//! the same counters and the same cached lines, in every policy and mode, both validities.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{Engine, EngineConfig, Mode, Op, Request, Validity};

const LINE: u64 = 4096;

/// Mostly whole aligned lines (the fast path's case), with partial and multi-line requests,
/// FUA writes, trims and flushes mixed in so that lines with absent sectors reach it too.
fn stream(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let line = rng.gen_range(0..400u64);
            let (offset, len) = match rng.gen_range(0..10) {
                0 => (
                    line * LINE + 512 * rng.gen_range(0..7u64),
                    512 * rng.gen_range(1..3u64),
                ),
                1 => (line * LINE, LINE * rng.gen_range(2..5u64)),
                _ => (line * LINE, LINE),
            };
            let op = match rng.gen_range(0..40) {
                0 => Op::Trim,
                1 => Op::Flush,
                x if x < 16 => Op::Write,
                _ => Op::Read,
            };
            let mut r = Request::new(i as u64, op, offset, len);
            r.fua = op == Op::Write && rng.gen_range(0..8) == 0;
            r.class = rng.gen_range(0..3);
            r
        })
        .collect()
}

fn compare(policy: &str, mode: Mode, validity: Validity) {
    let cfg = EngineConfig {
        capacity_lines: 96,
        policy: policy.to_string(),
        mode,
        validity,
        ..Default::default()
    };
    let mut fast = Engine::new(cfg.clone()).unwrap();
    let mut slow = Engine::new(cfg).unwrap();
    slow.set_fast_path(false);
    for (i, r) in stream(7, 6000).iter().enumerate() {
        let a = fast.process(r).unwrap().clone();
        let b = slow.process(r).unwrap().clone();
        assert_eq!(
            (a.buf_start, a.buf_len, &a.steps),
            (b.buf_start, b.buf_len, &b.steps),
            "{policy} {mode:?} {validity:?}: plans differ at request {i} {r:?}"
        );
        while fast.needs_cleaning() {
            let t = fast.cleaning_target();
            let pa = fast.clean(t).clone();
            let pb = slow.clean(t).clone();
            assert_eq!(
                pa.steps, pb.steps,
                "{policy} {mode:?}: cleaning differs at {i}"
            );
        }
    }
    assert_eq!(
        fast.counters(),
        slow.counters(),
        "{policy} {mode:?} {validity:?}"
    );
    let lines = |e: &Engine| {
        e.entries()
            .map(|(k, s, _)| (k, s, e.valid_mask(s), e.dirty_mask(s)))
            .collect::<Vec<_>>()
    };
    assert_eq!(lines(&fast), lines(&slow), "{policy} {mode:?} {validity:?}");
}

#[test]
fn fast_path_changes_nothing_but_speed() {
    for info in REGISTRY {
        if info.name == "belady" {
            continue; // needs an oracle, which turns the fast path off
        }
        for mode in [Mode::WriteThrough, Mode::WriteBack] {
            for validity in [Validity::Sector, Validity::Line] {
                compare(info.name, mode, validity);
            }
        }
    }
}

#[test]
fn mode_switch_keeps_fast_and_general_paths_in_step() {
    let cfg = EngineConfig {
        capacity_lines: 64,
        mode: Mode::WriteBack,
        ..Default::default()
    };
    let mut fast = Engine::new(cfg.clone()).unwrap();
    let mut slow = Engine::new(cfg).unwrap();
    slow.set_fast_path(false);
    let modes = [
        Mode::WriteThrough,
        Mode::ReadOnly,
        Mode::WriteBack,
        Mode::PassThrough,
    ];
    for (i, r) in stream(11, 4000).iter().enumerate() {
        if i % 500 == 0 {
            let m = modes[(i / 500) % modes.len()];
            fast.set_mode(m);
            slow.set_mode(m);
        }
        let a = fast.process(r).unwrap().steps.clone();
        let b = slow.process(r).unwrap().steps.clone();
        assert_eq!(a, b, "plans differ at request {i} {r:?}");
    }
    assert_eq!(fast.counters(), slow.counters());
}
