//! Direct layout, backing syncs that keep failing and drop the writes since the last good one
//! (Linux after a writeback error; `scripts/faultdev.sh`'s `flush drop` through NBD): while
//! they fail, the cache must keep every acknowledged byte readable (a line whose only good copy
//! is in the cache stays cached, or the request fails before anything acknowledged is
//! dropped), report nothing acknowledged lost, and once the device heals put every
//! acknowledged byte on the backing device at the next FLUSH.
//!
//! Seeded random workloads (writes of 1 to 16 lines, reads, FLUSH, `ctl flush`, the cleaner's
//! steps, waits past the sync backoff) over a cache of 32 lines and a volume of 256, the
//! cleaner's steps called in the test's thread: deterministic but for the backoff's clock.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::{CacheVolume, FileDev, OpenOptions};

const LINES: u64 = 32;
const BS: u64 = 4096;

fn rig(mode: Mode) -> (Files, CacheVolume, FaultHandle) {
    let f = files(LINES, BS);
    format(&f, mode, BS);
    let faults = Faults::new(11);
    let (c, _ch) = faults.wrap("cache", Box::new(FileDev::open(&f.cache).unwrap()), false);
    let (b, bh) = faults.wrap(
        "backing",
        Box::new(FileDev::open(&f.backing).unwrap()),
        true,
    );
    let opts = OpenOptions {
        state_path: Some(tiercache_server::state_file::beside(&f.cache)),
        ..Default::default()
    };
    let (vol, _) = CacheVolume::open(Box::new(c), Box::new(b), &opts).unwrap();
    (f, vol, bh)
}

fn block(seed: u64) -> Vec<u8> {
    (0..BS)
        .map(|k| (k as u8).wrapping_mul(31) ^ (seed as u8).wrapping_mul(101) ^ (seed >> 8) as u8)
        .collect()
}

/// Per 4 KiB block written: the values it may read, and whether its last write was
/// acknowledged (then it must read exactly that one, and never be reported lost).
#[derive(Default)]
struct Model {
    blocks: BTreeMap<u64, (Vec<Vec<u8>>, bool)>,
}

impl Model {
    fn write(&mut self, vol: &CacheVolume, blk: u64, n: u64, seed: u64) -> bool {
        let data: Vec<u8> = (0..n).flat_map(|i| block(seed * 64 + i)).collect();
        let ok = vol.write(blk * BS, &data, false).is_ok();
        for i in 0..n {
            let e = self.blocks.entry(blk + i).or_insert_with(|| {
                (
                    vec![(0..BS).map(|k| initial((blk + i) * BS + k)).collect()],
                    true,
                )
            });
            e.0.push(block(seed * 64 + i));
            e.1 = ok;
            if ok {
                e.0.drain(..e.0.len() - 1);
            }
        }
        ok
    }

    /// Every block reads what it may; an acknowledged one exactly, never lost.
    fn check(&self, vol: &CacheVolume, what: &str) -> Result<(), String> {
        let lost = vol.lost_dirty_ranges();
        let mut b = vec![0u8; BS as usize];
        for (&blk, (vals, exact)) in &self.blocks {
            let (a, z) = (blk * BS, (blk + 1) * BS);
            if *exact && lost.iter().any(|&(x, y)| x < z && a < y) {
                return Err(format!(
                    "{what}: acknowledged block {blk} (bytes {a}..{z}) reported lost: {lost:?}"
                ));
            }
            match vol.read(a, &mut b) {
                Ok(()) if *exact && b != *vals.last().unwrap() => {
                    return Err(format!(
                        "{what}: acknowledged block {blk} reads {} bytes",
                        if vals.contains(&b) {
                            "older"
                        } else {
                            "unknown"
                        }
                    ))
                }
                Ok(()) if !vals.contains(&b) => {
                    return Err(format!(
                        "{what}: block {blk} reads bytes never written there"
                    ))
                }
                Ok(()) => {}
                Err(e) if *exact => {
                    // A read may fail only while the cache cannot serve it (never: a miss
                    // is served from the backing device) or the range is lost.
                    return Err(format!("{what}: acknowledged block {blk} read failed: {e}"));
                }
                Err(_) => {}
            }
        }
        Ok(())
    }
}

/// `ops` random operations with every backing sync failing and dropping; then the device
/// heals and one FLUSH must put every acknowledged block on the backing file.
fn run(mode: Mode, seed: u64, ops: usize) -> Result<String, String> {
    let (f, vol, bh) = rig(mode);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut m = Model::default();
    let blocks = VOL / BS;
    let mut s = 1u64;
    // Warm: the cache full of flushed lines (dirty in write-back).
    for k in 0..LINES {
        m.write(&vol, k * 3 % blocks, 1, s);
        s += 1;
    }
    vol.flush().map_err(|e| format!("healthy flush: {e}"))?;
    bh.fail_syncs_dropping();
    let mut refused = 0;
    for i in 0..ops {
        let what = format!("seed {seed} op {i}");
        match rng.gen_range(0..20) {
            0..=10 => {
                let n = rng.gen_range(1..=16u64);
                let at = rng.gen_range(0..blocks - n);
                if !m.write(&vol, at, n, s) {
                    refused += 1;
                }
                s += 1;
            }
            11..=13 => {
                let at = rng.gen_range(0..blocks);
                let mut b = vec![0u8; BS as usize];
                let _ = vol.read(at * BS, &mut b);
            }
            14 => {
                if vol.flush().is_ok() {
                    return Err(format!("{what}: FLUSH acknowledged while every sync fails"));
                }
            }
            15 => {
                let _ = vol.flush_dirty();
            }
            16 | 17 => {
                let _ = vol.clean_if_needed();
            }
            18 => {
                let _ = vol.unmap_ahead_if_needed();
            }
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(0..120)));
                vol.retry_sync();
            }
        }
        if i % 8 == 7 {
            m.check(&vol, &what)?;
        }
    }
    m.check(&vol, &format!("seed {seed} after the ops"))?;
    bh.heal();
    vol.flush()
        .map_err(|e| format!("seed {seed}: FLUSH after the heal: {e}"))?;
    let backing = std::fs::read(&f.backing).unwrap();
    for (&blk, (vals, exact)) in &m.blocks {
        let have = &backing[(blk * BS) as usize..((blk + 1) * BS) as usize];
        if *exact && mode != Mode::WriteBack && have != vals.last().unwrap().as_slice() {
            return Err(format!(
                "seed {seed}: block {blk} not on the backing file after the healed FLUSH"
            ));
        }
    }
    m.check(&vol, &format!("seed {seed} after the heal"))?;
    vol.flush_dirty()
        .map_err(|e| format!("seed {seed}: ctl flush after the heal: {e}"))?;
    let backing = std::fs::read(&f.backing).unwrap();
    for (&blk, (vals, exact)) in &m.blocks {
        let have = &backing[(blk * BS) as usize..((blk + 1) * BS) as usize];
        if *exact && have != vals.last().unwrap().as_slice() {
            return Err(format!(
                "seed {seed}: block {blk} not on the backing file after ctl flush"
            ));
        }
    }
    Ok(format!(
        "seed {seed}: {refused} writes refused, {} sync errors",
        vol.stats().backing_sync_errors
    ))
}

fn seeds(mode: Mode) {
    let n: u64 = std::env::var("SYNC_FAIL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    for seed in 0..n {
        match run(mode, seed, 300) {
            Ok(s) => println!("{mode:?} {s}"),
            Err(e) => panic!("{mode:?}: {e}"),
        }
    }
}

#[test]
fn write_back_keeps_every_acknowledged_byte_while_syncs_fail() {
    seeds(Mode::WriteBack);
}

#[test]
fn write_through_keeps_every_acknowledged_byte_while_syncs_fail() {
    seeds(Mode::WriteThrough);
}

/// The NBD test's scenario (`crates/cli/tests/backing_sync.rs`, write-back) below NBD, with
/// the background cleaner running: dirty runs FLUSHed, syncs fail dropping, `ctl flush`
/// fails, more writes, FLUSH fails, then writes of more than the cache elsewhere.
fn nbd_like(mode: Mode, rounds: u64) -> Result<String, String> {
    let (f, vol, bh) = rig(mode);
    let vol = std::sync::Arc::new(vol);
    let cleaner = vol.start_cleaner();
    let mut m = Model::default();
    let mut s = 1u64;
    let r = (|| {
        for i in 0..8u64 {
            m.write(&vol, i * 16, 4, s);
            s += 1;
        }
        vol.flush().map_err(|e| format!("healthy flush: {e}"))?;
        bh.fail_syncs_dropping();
        if vol.flush_dirty().is_ok() {
            return Err("ctl flush acknowledged while syncs fail".into());
        }
        m.check(&vol, "after the failed ctl flush")?;
        for i in 0..8u64 {
            m.write(&vol, i * 16 + 2, 1, s);
            s += 1;
        }
        let _ = vol.flush();
        let mut refused = 0;
        for round in 0..rounds {
            for i in 0..LINES / 4 * 3 {
                if !m.write(&vol, 128 + (round * 32 + i * 4) % 128, 4, s) {
                    refused += 1;
                }
                s += 1;
            }
            let _ = vol.flush();
            m.check(&vol, &format!("after pressure round {round}"))?;
        }
        bh.heal();
        vol.flush_dirty()
            .map_err(|e| format!("ctl flush after the heal: {e}"))?;
        let backing = std::fs::read(&f.backing).unwrap();
        for (&blk, (vals, exact)) in &m.blocks {
            let have = &backing[(blk * BS) as usize..((blk + 1) * BS) as usize];
            if *exact && have != vals.last().unwrap().as_slice() {
                return Err(format!(
                    "block {blk} not on the backing file after ctl flush"
                ));
            }
        }
        Ok(format!("{refused} writes refused"))
    })();
    vol.shutdown().ok();
    cleaner.join().unwrap();
    r
}

#[test]
fn nbd_like_write_back_with_the_cleaner() {
    for k in 0..4 {
        match nbd_like(Mode::WriteBack, 6) {
            Ok(s) => println!("run {k}: {s}"),
            Err(e) => panic!("run {k}: {e}"),
        }
    }
}

#[test]
fn nbd_like_write_through_with_the_cleaner() {
    for k in 0..4 {
        match nbd_like(Mode::WriteThrough, 6) {
            Ok(s) => println!("run {k}: {s}"),
            Err(e) => panic!("run {k}: {e}"),
        }
    }
}
