//! Plans carry data correctly: a tiny executor runs every plan on byte arrays (an SSD, one
//! HDD per volume, the request buffer) and a reference model says what each read must return.
//! Random unaligned requests, trims, flushes, cleaning passes and mode switches, in every mode,
//! with sector and line validity and with groups. Bytes the executor did not set are poison,
//! so a plan that reads something it never fetched fails the comparison.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::{Engine, EngineConfig, Mode, Op, Plan, Request, Step, Validity};

const VOL_BYTES: u64 = 256 << 10;
const POISON: u8 = 0xEE;

struct World {
    ssd: Vec<u8>,
    hdd: Vec<Vec<u8>>,
    /// What each volume byte must read as (`None`: trimmed, anything goes).
    reference: Vec<Vec<Option<u8>>>,
}

impl World {
    fn new(ssd_bytes: u64, volumes: usize) -> Self {
        // The HDD starts with known contents so reads of never-written data can be checked.
        let hdd: Vec<Vec<u8>> = (0..volumes)
            .map(|v| (0..VOL_BYTES).map(|i| (i as u8) ^ (v as u8 * 17)).collect())
            .collect();
        let reference = hdd
            .iter()
            .map(|h| h.iter().map(|&b| Some(b)).collect())
            .collect();
        World {
            ssd: vec![POISON; ssd_bytes as usize],
            hdd,
            reference,
        }
    }

    /// Runs a plan; `buf` is the request's buffer.
    fn run(&mut self, plan: &Plan, buf: &mut [u8]) {
        let r = |a: u64, l: u64| a as usize..(a + l) as usize;
        for step in &plan.steps {
            match *step {
                Step::ReadSsd { ssd, buf: b, len } => {
                    buf[r(b, len)].copy_from_slice(&self.ssd[r(ssd, len)])
                }
                Step::ReadHdd {
                    vol,
                    hdd,
                    buf: b,
                    len,
                } => buf[r(b, len)].copy_from_slice(&self.hdd[vol as usize][r(hdd, len)]),
                Step::WriteSsd { ssd, buf: b, len } => {
                    self.ssd[r(ssd, len)].copy_from_slice(&buf[r(b, len)])
                }
                Step::WriteHdd {
                    vol,
                    hdd,
                    buf: b,
                    len,
                } => self.hdd[vol as usize][r(hdd, len)].copy_from_slice(&buf[r(b, len)]),
                Step::Populate { vol, hdd, ssd, len } => {
                    let src = self.hdd[vol as usize][r(hdd, len)].to_vec();
                    self.ssd[r(ssd, len)].copy_from_slice(&src);
                }
                Step::WriteBack { vol, ssd, hdd, len } => {
                    let src = self.ssd[r(ssd, len)].to_vec();
                    self.hdd[vol as usize][r(hdd, len)].copy_from_slice(&src);
                }
                Step::TrimSsd { ssd, len } => self.ssd[r(ssd, len)].fill(POISON),
                Step::TrimHdd { vol, hdd, len } => self.hdd[vol as usize][r(hdd, len)].fill(POISON),
                Step::FlushSsd | Step::FlushHdd { .. } => {}
            }
        }
    }
}

fn random_request(rng: &mut ChaCha8Rng, i: u64) -> Request {
    let hot = rng.gen_bool(0.8);
    let space = if hot { 64 << 10 } else { VOL_BYTES };
    let len = match rng.gen_range(0..8) {
        0 => rng.gen_range(1..600),
        1 => 512 * rng.gen_range(1..4),
        2..=4 => 4096,
        5 => 4096 * rng.gen_range(2..4),
        _ => rng.gen_range(1..13_000),
    };
    let mut offset = rng.gen_range(0..space - len);
    if rng.gen_bool(0.6) {
        offset &= !511;
    }
    let op = match rng.gen_range(0..100) {
        0..=49 => Op::Read,
        50..=93 => Op::Write,
        94..=96 => Op::Trim,
        _ => Op::Flush,
    };
    let mut r = Request::new(i, op, offset, len);
    r.volume = rng.gen_range(0..2);
    r.fua = op == Op::Write && rng.gen_bool(0.1);
    r
}

fn check(validity: Validity, mode: Mode, group_lines: u64, seed: u64) {
    let cap = 24;
    let cfg = EngineConfig {
        capacity_lines: cap,
        mode,
        validity,
        group_size: 4096 * group_lines,
        dirty_high: 0.5,
        dirty_low: 0.25,
        volume_bytes: Some(VOL_BYTES),
        ..Default::default()
    };
    let mut e = Engine::new(cfg).unwrap();
    let mut w = World::new(cap * 4096, 2);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let modes = Mode::ALL;
    for i in 0..6000u64 {
        let r = random_request(&mut rng, i);
        let plan = e.process(&r).unwrap().clone();
        let mut buf = vec![POISON ^ 0x11; plan.buf_len as usize];
        let at = (r.offset.saturating_sub(plan.buf_start)) as usize;
        let (vol, lo, hi) = (r.volume as usize, r.offset as usize, r.end() as usize);
        if r.op == Op::Write {
            for (k, b) in buf[at..at + r.len as usize].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31) ^ k as u8;
            }
        }
        w.run(&plan, &mut buf);
        match r.op {
            Op::Read => {
                for (k, want) in w.reference[vol][lo..hi].iter().enumerate() {
                    if let Some(want) = want {
                        let got = buf[at + k];
                        assert_eq!(
                            got,
                            *want,
                            "{validity:?} {mode:?} seed {seed} request {i} {r:?}: byte {} of \
                             volume {vol} reads {got:#x}, want {want:#x}",
                            lo + k
                        );
                    }
                }
            }
            Op::Write => {
                for (k, b) in buf[at..at + r.len as usize].iter().enumerate() {
                    w.reference[vol][lo + k] = Some(*b);
                }
            }
            Op::Trim => w.reference[vol][lo..hi].fill(None),
            Op::Flush => {}
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
    for v in 0..2 {
        for (k, want) in w.reference[v].iter().enumerate() {
            if let Some(want) = want {
                assert_eq!(
                    w.hdd[v][k], *want,
                    "{validity:?} {mode:?} seed {seed}: after cleaning, HDD byte {k} of \
                     volume {v} is stale"
                );
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
