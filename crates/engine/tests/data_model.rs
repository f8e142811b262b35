//! Plans carry data correctly: a tiny executor runs every plan on byte arrays (an SSD, one
//! HDD per volume, the request buffer) and a reference model says what each read must return.
//! Random unaligned requests, trims, flushes, cleaning passes and mode switches, in every mode,
//! with sector and line validity and with groups. Bytes the executor did not set are poison,
//! so a plan that reads something it never fetched fails the comparison.

mod common;

use common::{execute, World, VOL_BYTES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::{Engine, EngineConfig, Mode, Validity};

fn check(validity: Validity, mode: Mode, group_lines: u64, seed: u64) {
    check_with(validity, mode, group_lines, seed, |_| {});
}

/// `tune` adjusts the configuration (chunk rewrites); returns the chunk rewrites planned.
fn check_with(
    validity: Validity,
    mode: Mode,
    group_lines: u64,
    seed: u64,
    tune: impl Fn(&mut EngineConfig),
) -> u64 {
    let cap = 24;
    let mut cfg = EngineConfig {
        capacity_lines: cap,
        mode,
        validity,
        group_size: 4096 * group_lines,
        dirty_high: 0.5,
        dirty_low: 0.25,
        volume_bytes: Some(VOL_BYTES),
        ..Default::default()
    };
    tune(&mut cfg);
    let mut e = Engine::new(cfg).unwrap();
    let mut w = World::new(cap * 4096, 2);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let modes = Mode::ALL;
    for i in 0..6000u64 {
        let r = common::random_request(&mut rng, i);
        let plan = e.process(&r).unwrap().clone();
        if let Err(m) = execute(&mut w, &r, &plan, i) {
            panic!("{validity:?} {mode:?} seed {seed} request {i} {r:?}: {m}");
        }
        // Cleaning as a driver would run it, and now and then a mode switch that first
        // cleans everything (as `ctl mode` does) when leaving write-back.
        if e.needs_cleaning() {
            let n = e.cleaning_target();
            let plan = e.clean(n).clone();
            w.run(&plan, &mut []);
        }
        if i % 1500 == 1499 {
            let next = modes[rng.gen_range(0..modes.len())];
            let plan = e.clean(u64::MAX).clone();
            w.run(&plan, &mut []);
            e.set_mode(next);
        }
        assert!(e.counters().check().is_ok(), "{:?}", e.counters().check());
    }
    // After a full clean the HDD alone holds every defined byte.
    let plan = e.clean(u64::MAX).clone();
    w.run(&plan, &mut []);
    assert_eq!(e.dirty_lines(), 0);
    if let Err(m) = common::check_hdd(&w) {
        panic!("{validity:?} {mode:?} seed {seed}: {m}");
    }
    e.counters().chunk_rewrites
}

/// Chunk rewrites (cleaning writes a dense chunk whole: cached valid sectors from the cache,
/// the rest from the backing device) in every mode, with a known and an unknown volume size:
/// the backing device ends up with exactly the reference bytes.
#[test]
fn chunk_rewrites_carry_the_right_bytes() {
    for validity in [Validity::Sector, Validity::Line] {
        for mode in Mode::ALL {
            let mut rewrites = 0;
            for (seed, chunk, known) in [
                (11, 16 << 10, true),
                (12, 64 << 10, true),
                (13, 32 << 10, false),
            ] {
                rewrites += check_with(validity, mode, 1, seed, |c| {
                    c.rewrite_chunk = chunk;
                    c.rewrite_min_runs = 2;
                    if !known {
                        c.volume_bytes = None;
                    }
                });
            }
            // Every mode starts in its own mode for 1500 requests; write-back is where dirty
            // lines arise, and the random mode switches visit it from the others too.
            if mode == Mode::WriteBack {
                assert!(rewrites > 0, "{validity:?}: no chunk rewrite was planned");
            }
        }
    }
}

#[test]
fn plans_carry_the_right_bytes_with_sector_validity() {
    for mode in Mode::ALL {
        for seed in 0..3 {
            check(Validity::Sector, mode, 1, seed);
        }
        check(Validity::Sector, mode, 4, 7);
    }
}

#[test]
fn plans_carry_the_right_bytes_with_line_validity() {
    for mode in Mode::ALL {
        for seed in 0..3 {
            check(Validity::Line, mode, 1, seed);
        }
        check(Validity::Line, mode, 4, 7);
    }
}
