//! A tiny plan executor over byte arrays (an SSD, one HDD per volume, the request buffer) and
//! a reference model of what every volume byte must read as; shared by the data-model and
//! swarm tests.
#![allow(dead_code)]

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tiercache_engine::{Op, Plan, Request, Step};

pub const VOL_BYTES: u64 = 256 << 10;
pub const POISON: u8 = 0xEE;

pub struct World {
    pub ssd: Vec<u8>,
    pub hdd: Vec<Vec<u8>>,
    /// What each volume byte must read as (`None`: trimmed, anything goes).
    pub reference: Vec<Vec<Option<u8>>>,
}

impl World {
    pub fn new(ssd_bytes: u64, volumes: usize) -> Self {
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
    pub fn run(&mut self, plan: &Plan, buf: &mut [u8]) {
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
                // A chunk rewrite's gap: the backing bytes, read and written back unchanged
                // (out of range panics: a rewrite never reaches past the volume).
                Step::CopyHdd { vol, hdd, len } => {
                    let src = self.hdd[vol as usize][r(hdd, len)].to_vec();
                    self.hdd[vol as usize][r(hdd, len)].copy_from_slice(&src);
                }
                Step::TrimSsd { ssd, len } => self.ssd[r(ssd, len)].fill(POISON),
                Step::TrimHdd { vol, hdd, len } => self.hdd[vol as usize][r(hdd, len)].fill(POISON),
                Step::FlushSsd | Step::FlushHdd { .. } => {}
            }
        }
    }
}

pub fn random_request(rng: &mut ChaCha8Rng, i: u64) -> Request {
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

/// Runs one request's plan with the client's data and checks a read against the reference
/// (then updates the reference for a write or trim). `Err` says which byte was wrong.
pub fn execute(w: &mut World, r: &Request, plan: &Plan, i: u64) -> Result<(), String> {
    let mut buf = vec![POISON ^ 0x11; plan.buf_len as usize];
    let at = (r.offset.saturating_sub(plan.buf_start)) as usize;
    let (vol, lo, hi) = (r.volume as usize, r.offset as usize, r.end() as usize);
    if r.op == Op::Write {
        for (k, b) in buf[at..at + r.len as usize].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ k as u8;
        }
    }
    w.run(plan, &mut buf);
    match r.op {
        Op::Read => {
            for (k, want) in w.reference[vol][lo..hi].iter().enumerate() {
                if let Some(want) = want {
                    let got = buf[at + k];
                    if got != *want {
                        return Err(format!(
                            "byte {} of volume {vol} reads {got:#x}, want {want:#x}",
                            lo + k
                        ));
                    }
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
    Ok(())
}

/// After a full clean, the HDDs alone must hold every defined byte.
pub fn check_hdd(w: &World) -> Result<(), String> {
    for (v, refv) in w.reference.iter().enumerate() {
        for (k, want) in refv.iter().enumerate() {
            if let Some(want) = want {
                if w.hdd[v][k] != *want {
                    return Err(format!(
                        "after cleaning, HDD byte {k} of volume {v} is stale"
                    ));
                }
            }
        }
    }
    Ok(())
}
