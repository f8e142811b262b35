//! The RAM tier's protocol (`tiercache_engine::ram_tier`) never serves stale bytes.
//!
//! The tier keeps no bytes, so these tests keep them: each line's *version* (bumped by every
//! write, trim or write-zeroes that meets the line, however little of it) stands for its
//! bytes. A fill stores the versions its read saw; a RAM hit must return the version the
//! volume holds. Concurrent requests are modelled as interleaved phases (a read: lookup and
//! ticket, read below, fill; a write: invalidate, apply, invalidate), in every order a seeded
//! scheduler picks: a hit may then return the version before a write still in flight (the
//! write is not acknowledged), never one older than the last acknowledged write.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use tiercache_engine::policy::PolicyConfig;
use tiercache_engine::{Engine, EngineConfig, Mode, Op, RamTier, Request};

const LS: u64 = 4096;
/// Lines the requests touch (the RAM tier holds fewer: evictions happen).
const LINES: u64 = 48;

fn random_req(rng: &mut ChaCha8Rng) -> Request {
    let op = match rng.gen_range(0..10) {
        0..=4 => Op::Read,
        5..=7 => Op::Write,
        8 => Op::Trim,
        _ => Op::Flush,
    };
    // Whole lines, sub-line pieces (unaligned, overlapping) and multi-line spans.
    let (offset, len) = match rng.gen_range(0..3) {
        0 => (rng.gen_range(0..LINES) * LS, LS),
        1 => {
            let o = rng.gen_range(0..LINES * LS - 1);
            (o, rng.gen_range(1..=(LS / 2).min(LINES * LS - o)))
        }
        _ => {
            let o = rng.gen_range(0..LINES - 3) * LS + rng.gen_range(0..2) * 512;
            (o, rng.gen_range(1..=3) * LS)
        }
    };
    Request::new(0, op, offset, if op == Op::Flush { 0 } else { len })
}

fn lines_of(r: &Request) -> std::ops::RangeInclusive<u64> {
    r.offset / LS..=(r.end() - 1) / LS
}

/// The lines a read covers whole (the ones `fill` may put in RAM), with their versions.
fn whole_lines(r: &Request, version: &[u64]) -> HashMap<u64, u64> {
    (r.offset.div_ceil(LS)..r.end() / LS)
        .map(|l| (l, version[l as usize]))
        .collect()
}

/// Queue depth 1 with the engine below (as `tiercache_sim::step_ram` runs it), random mode
/// switches included: every RAM hit returns the current version, and a RAM hit leaves the
/// engine's counters untouched (it did not reach the SSD tier).
#[test]
fn queue_depth_1_hits_are_never_stale_and_skip_the_engine() {
    for (seed, policy) in [(1u64, "s3fifo"), (2, "slru"), (3, "lru"), (4, "arc")] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut engine = Engine::new(EngineConfig {
            capacity_lines: 24,
            mode: Mode::WriteBack,
            ..Default::default()
        })
        .unwrap();
        let mut ram = RamTier::new(8 * LS, LS, policy, &PolicyConfig::default()).unwrap();
        let mut version = vec![0u64; LINES as usize];
        let mut held: HashMap<u32, (u64, u64)> = HashMap::new(); // slot -> (line, version)
        let (mut slots, mut out) = (Vec::new(), Vec::new());
        let mut hits = 0;
        for i in 0..20_000 {
            if i % 997 == 0 {
                let m = Mode::ALL[rng.gen_range(0..Mode::ALL.len())];
                if engine.config().mode == Mode::WriteBack {
                    while engine.dirty_lines() > 0 {
                        engine.clean(64);
                    }
                }
                engine.set_mode(m);
                ram.set_mode(m);
                held.clear();
            }
            let r = random_req(&mut rng);
            let before = engine.counters();
            if ram.read(&r, &mut slots) {
                hits += 1;
                for (l, s) in lines_of(&r).zip(&slots) {
                    let (hl, hv) = held[s];
                    assert_eq!(hl, l, "seed {seed}: slot {s} holds another line");
                    assert_eq!(
                        hv, version[l as usize],
                        "seed {seed} {policy} request {i} {r:?}: RAM served line {l} at version \
                         {hv}, the volume holds {}",
                        version[l as usize]
                    );
                }
                assert_eq!(engine.counters(), before, "a RAM hit reached the engine");
                continue;
            }
            let t = ram.ticket();
            ram.invalidate(&r);
            engine.process(&r).unwrap();
            if matches!(r.op, Op::Write | Op::Trim) {
                for l in lines_of(&r) {
                    version[l as usize] += 1;
                }
            }
            if r.op == Op::Read {
                let seen = whole_lines(&r, &version);
                ram.fill(&r, t, &mut out);
                for &(s, off) in &out {
                    held.insert(s, (off / LS, seen[&(off / LS)]));
                }
            }
            if engine.needs_cleaning() {
                let n = engine.cleaning_target();
                engine.clean(n);
            }
        }
        assert!(
            hits > 500,
            "{policy}: only {hits} RAM hits: the test lost its point"
        );
        assert!(ram.counters().invalidations > 100 && ram.counters().evictions > 100);
        assert!(ram.len() <= ram.capacity_lines());
    }
}

enum Phase {
    /// A read that missed RAM: its ticket, and the versions it read below (once it has).
    Read {
        req: Request,
        ticket: u64,
        seen: Option<HashMap<u64, u64>>,
    },
    /// A write: invalidated before; `applied` once its bytes are on the devices.
    Write { req: Request, applied: bool },
}

/// Up to 6 requests in flight, their phases interleaved at random: no RAM hit returns a
/// version older than the last acknowledged write of its line, and once nothing is in
/// flight, RAM holds only current versions.
#[test]
fn concurrent_fills_never_leave_stale_lines() {
    let mut skipped = 0;
    for seed in 0..40u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut ram = RamTier::new(12 * LS, LS, "s3fifo", &PolicyConfig::default()).unwrap();
        let mut version = vec![0u64; LINES as usize];
        // Version of the last acknowledged (completed) write of each line.
        let mut acked = vec![0u64; LINES as usize];
        let mut held: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut flight: Vec<Phase> = Vec::new();
        let (mut slots, mut out) = (Vec::new(), Vec::new());
        for step in 0..6000 {
            let start = flight.len() < 6 && (flight.is_empty() || rng.gen_bool(0.4));
            if start && step < 5800 {
                let r = random_req(&mut rng);
                match r.op {
                    Op::Read => {
                        if ram.read(&r, &mut slots) {
                            for (l, s) in lines_of(&r).zip(&slots) {
                                let (hl, hv) = held[s];
                                assert_eq!(hl, l);
                                assert!(
                                    hv >= acked[l as usize] && hv <= version[l as usize],
                                    "seed {seed} step {step}: RAM served line {l} at version \
                                     {hv}; acknowledged {}, current {}",
                                    acked[l as usize],
                                    version[l as usize]
                                );
                            }
                        } else {
                            flight.push(Phase::Read {
                                req: r,
                                ticket: ram.ticket(),
                                seen: None,
                            });
                        }
                    }
                    Op::Write | Op::Trim => {
                        ram.invalidate(&r);
                        flight.push(Phase::Write {
                            req: r,
                            applied: false,
                        });
                    }
                    _ => {}
                }
                continue;
            }
            if flight.is_empty() {
                continue;
            }
            let i = rng.gen_range(0..flight.len());
            match &mut flight[i] {
                Phase::Read {
                    seen: s @ None,
                    req,
                    ..
                } => *s = Some(whole_lines(req, &version)),
                Phase::Read {
                    req,
                    ticket,
                    seen: Some(seen),
                } => {
                    ram.fill(req, *ticket, &mut out);
                    for &(s, off) in &out {
                        held.insert(s, (off / LS, seen[&(off / LS)]));
                    }
                    flight.swap_remove(i);
                }
                Phase::Write { req, applied } if !*applied => {
                    for l in lines_of(req) {
                        version[l as usize] += 1;
                    }
                    *applied = true;
                }
                Phase::Write { req, .. } => {
                    ram.invalidate(req);
                    for l in lines_of(req) {
                        acked[l as usize] = acked[l as usize].max(version[l as usize]);
                    }
                    flight.swap_remove(i);
                }
            }
        }
        assert!(flight.is_empty());
        for l in 0..LINES {
            let r = Request::read(l * LS, LS);
            if ram.read(&r, &mut slots) {
                assert_eq!(
                    held[&slots[0]].1, version[l as usize],
                    "seed {seed} line {l}"
                );
            }
        }
        skipped += ram.counters().fills_skipped;
        assert!(
            ram.counters().hits > 50,
            "seed {seed}: {:?}",
            ram.counters()
        );
    }
    // Without the ticket check some of these fills would have stored old versions.
    assert!(
        skipped > 100,
        "only {skipped} fills were refused: no race was exercised"
    );
}
