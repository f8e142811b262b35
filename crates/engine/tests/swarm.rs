//! Deterministic simulation testing, swarm style: every seed draws its own configuration
//! (policy, line and group size, capacity, mode, validity, admission thresholds, sequential
//! cutoff, watermarks) and its own workload mix (which request kinds occur at all, mode
//! switches with and without a prior clean, cleaning passes), then runs the engine's plans on
//! byte arrays against a reference model, checking invariants after every step.
//!
//! A failure names its seed; rerun just that one with
//!     TIERCACHE_SWARM_SEED=<seed> cargo test --release -p tiercache-engine --test swarm
//! and run more seeds than the default 300 with `TIERCACHE_SWARM_SEEDS=<n>`.

mod common;

use common::{execute, World, VOL_BYTES};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{Admission, Engine, EngineConfig, Mode, Op, Request, SeqCutoff, Validity};

const STEPS: u64 = 1500;

/// Which request kinds a seed's workload has (swarm testing: leaving features out of some
/// runs finds bugs that a uniform mix hides).
struct Mix {
    trims: bool,
    flushes: bool,
    fua: bool,
    unaligned: bool,
    sequential: bool,
    two_volumes: bool,
    write_share: f64,
    /// Mode switch every this many requests (0: never); `clean_first`: as `ctl mode` does.
    switch_every: u64,
    clean_first: bool,
}

fn draw_config(rng: &mut ChaCha8Rng) -> EngineConfig {
    let names: Vec<&str> = REGISTRY.iter().map(|p| p.name).collect();
    let line_size = *[4096u64, 8192, 65536].choose(rng).unwrap();
    let group_lines = *[1u64, 1, 1, 2, 4].choose(rng).unwrap();
    let lines_in_volume = VOL_BYTES / line_size;
    let t = |rng: &mut ChaCha8Rng| *[0u32, 1, 1, 1, 2, 3].choose(rng).unwrap();
    EngineConfig {
        capacity_lines: rng.gen_range(1..=lines_in_volume / 2),
        line_size,
        group_size: line_size * group_lines,
        policy: names.choose(rng).unwrap().to_string(),
        mode: *Mode::ALL.choose(rng).unwrap(),
        admission: Admission {
            read_threshold: t(rng),
            write_threshold: t(rng),
        },
        seq_cutoff: if rng.gen_bool(0.3) {
            SeqCutoff {
                read_bytes: 4096 * rng.gen_range(2..16),
                write_bytes: 4096 * rng.gen_range(2..16),
            }
        } else {
            SeqCutoff::default()
        },
        dirty_high: rng.gen_range(0.3..0.95),
        dirty_low: rng.gen_range(0.0..0.3),
        validity: if rng.gen_bool(0.7) {
            Validity::Sector
        } else {
            Validity::Line
        },
        partial_write_fill: rng.gen_bool(0.8),
        volume_bytes: Some(VOL_BYTES),
        ..Default::default()
    }
}

fn draw_mix(rng: &mut ChaCha8Rng) -> Mix {
    Mix {
        trims: rng.gen_bool(0.5),
        flushes: rng.gen_bool(0.5),
        fua: rng.gen_bool(0.5),
        unaligned: rng.gen_bool(0.6),
        sequential: rng.gen_bool(0.4),
        two_volumes: rng.gen_bool(0.5),
        write_share: *[0.0, 0.2, 0.5, 0.9].choose(rng).unwrap(),
        switch_every: *[0u64, 97, 400].choose(rng).unwrap(),
        clean_first: rng.gen_bool(0.5),
    }
}

fn request(rng: &mut ChaCha8Rng, mix: &Mix, i: u64, next_seq: &mut u64) -> Request {
    let mut r = common::random_request(rng, i);
    if mix.sequential && rng.gen_bool(0.5) {
        // A stream of 4 KiB requests, for the sequential cutoff.
        if *next_seq + 4096 > VOL_BYTES {
            *next_seq = 0;
        }
        r.offset = *next_seq;
        r.len = 4096;
        *next_seq += 4096;
    }
    if !mix.unaligned && r.len > 0 {
        r.offset &= !4095;
        r.len = r.len.div_ceil(4096) * 4096;
        if r.end() > VOL_BYTES {
            r.offset = VOL_BYTES - r.len;
        }
    }
    r.op = match r.op {
        Op::Trim if !mix.trims => Op::Read,
        Op::Flush if !mix.flushes => Op::Read,
        Op::Read | Op::Write => {
            if rng.gen_bool(mix.write_share) {
                Op::Write
            } else {
                Op::Read
            }
        }
        op => op,
    };
    r.fua = mix.fua && r.op == Op::Write && rng.gen_bool(0.2);
    if !mix.two_volumes {
        r.volume = 0;
    }
    r.class = rng.gen_range(0..4);
    r
}

/// Invariants that hold after every step, whatever the configuration.
fn check_invariants(e: &Engine) -> Result<(), String> {
    let c = e.counters();
    c.check()?;
    if e.len() > e.capacity_lines() {
        return Err(format!(
            "{} lines cached, capacity {}",
            e.len(),
            e.capacity_lines()
        ));
    }
    if c.insertions - c.evictions - c.invalidations != e.len() {
        return Err(format!(
            "occupancy {} but counters say {}",
            e.len(),
            c.insertions - c.evictions - c.invalidations
        ));
    }
    let mut dirty = 0;
    for (key, slot, is_dirty) in e.entries() {
        let (v, d) = (e.valid_mask(slot), e.dirty_mask(slot));
        if v == 0 {
            return Err(format!(
                "line {key:#x} in slot {slot} is cached with no valid sector"
            ));
        }
        if d & !v != 0 {
            return Err(format!(
                "line {key:#x}: dirty sectors {d:#x} not all valid {v:#x}"
            ));
        }
        if is_dirty != (d != 0) {
            return Err(format!(
                "line {key:#x}: dirty flag {is_dirty} but mask {d:#x}"
            ));
        }
        dirty += is_dirty as u64;
    }
    if dirty != e.dirty_lines() {
        return Err(format!(
            "{dirty} dirty lines listed, {} counted",
            e.dirty_lines()
        ));
    }
    Ok(())
}

fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cfg = draw_config(&mut rng);
    let mix = draw_mix(&mut rng);
    let desc = format!("{cfg:?}");
    let mut e = Engine::new(cfg.clone()).map_err(|err| format!("{err}: {desc}"))?;
    let mut w = World::new(cfg.capacity_lines * cfg.line_size, 2);
    let mut next_seq = 0;
    for i in 0..STEPS {
        let r = request(&mut rng, &mix, i, &mut next_seq);
        let plan = e
            .process(&r)
            .map_err(|err| format!("request {i} {r:?}: {err}"))?
            .clone();
        execute(&mut w, &r, &plan, i).map_err(|m| format!("request {i} {r:?}: {m}"))?;
        if e.needs_cleaning() && rng.gen_bool(0.7) {
            let n = e.cleaning_target();
            let plan = e.clean(n).clone();
            w.run(&plan, &mut []);
        }
        if mix.switch_every > 0 && i % mix.switch_every == mix.switch_every - 1 {
            if mix.clean_first {
                let plan = e.clean(u64::MAX).clone();
                w.run(&plan, &mut []);
            }
            e.set_mode(*Mode::ALL.choose(&mut rng).unwrap());
        }
        check_invariants(&e).map_err(|m| format!("after request {i} {r:?}: {m}"))?;
    }
    let plan = e.clean(u64::MAX).clone();
    w.run(&plan, &mut []);
    if e.dirty_lines() != 0 {
        return Err(format!(
            "{} dirty lines after a full clean",
            e.dirty_lines()
        ));
    }
    common::check_hdd(&w)
}

#[test]
fn swarm() {
    let seeds: Vec<u64> = match std::env::var("TIERCACHE_SWARM_SEED") {
        Ok(s) => vec![s.parse().expect("TIERCACHE_SWARM_SEED is a number")],
        Err(_) => {
            let n = std::env::var("TIERCACHE_SWARM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(300);
            (0..n).collect()
        }
    };
    let mut failures = Vec::new();
    for &seed in &seeds {
        let outcome = catch_unwind(AssertUnwindSafe(|| run_seed(seed)));
        let msg = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(m)) => m,
            Err(p) => p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into()),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let cfg = draw_config(&mut rng);
        failures.push(format!(
            "seed {seed} (TIERCACHE_SWARM_SEED={seed}): {msg}\n  config: {cfg:?}"
        ));
    }
    println!("swarm: {} seeds x {STEPS} requests", seeds.len());
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}
