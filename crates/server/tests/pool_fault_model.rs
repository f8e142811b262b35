//! A randomized fault checker for a pool of cache devices (issue 15 item 2, "the loss of any
//! one cache device loses no acknowledged data"): each seed draws a pool (two or three
//! members, write-back with the default two dirty copies, write-back with one copy, or
//! write-through), runs random reads, writes, trims, write-zeroes, FUA writes, FLUSHes,
//! cleaner passes and re-mirror passes over [`Faults`]-wrapped volatile devices (every member
//! and the backing device: writes sit in a write cache until synced), and injects ONE member
//! fault at a random op: the device lost (every call fails), a burst of read errors or of
//! write errors over part of it, or its syncs failing. Now and then the volume restarts:
//! clean, or a power cut (unsynced writes torn sector by sector), reopened degraded without a
//! lost member; a failed member is sometimes replaced by a fresh device and re-mirrored, after
//! which another fault may come.
//!
//! The contract checked, per byte (`common::Model`): with two copies (or in write-through)
//! no request ever fails and every read returns the last acknowledged write; after a power
//! cut every byte holds its value at the last FLUSH / FUA or a value written since. With one
//! copy a lost member may lose dirty data, but only as reported: a read may fail only where
//! `lost_dirty_ranges` says so, never return other bytes; a restart without the member is
//! refused unless the loss is accepted. At the end the faults are healed, the pool shut down,
//! reopened and every byte read.
//!
//! `TIERCACHE_POOL_FAULT_SEEDS=N` (default 60, plus the regression seeds), `TIERCACHE_FAULT_SOAK=1` (1000 seeds),
//! `TIERCACHE_POOL_FAULT_SEED=N` runs one seed and prints its op log.

mod common;

use common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::pool_dev::PoolOpen;
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions, PoolDev};

/// The backing device: twice what two members cache, so lines are evicted (and dirty ones
/// written back) all the time.
const SPAN: u64 = 2 * VOL;
const MEMBER_LINES: u64 = 128;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Every call fails from now on (a pulled device).
    Lose,
    /// Reads of part of the device fail for a while.
    Reads,
    /// Writes of part of the device fail for a while.
    Writes,
    /// Its syncs fail for a while.
    Syncs,
}

struct Cfg {
    members: usize,
    mode: Mode,
    /// 1 or 2 (None: the default, 2 in write-back).
    copies: Option<u8>,
    max_errors: u64,
    ops: usize,
}

impl Cfg {
    fn draw(r: &mut ChaCha8Rng, ops: usize) -> Cfg {
        let (mode, copies) = match r.gen_range(0..10) {
            0..=5 => (Mode::WriteBack, None),
            6 | 7 => (Mode::WriteBack, Some(1)),
            _ => (Mode::WriteThrough, None),
        };
        Cfg {
            members: r.gen_range(2..=3),
            mode,
            copies,
            max_errors: [1, 1, 4][r.gen_range(0..3)],
            ops,
        }
    }

    /// Whether one member lost may lose acknowledged data (write-back, one copy).
    fn may_lose(&self) -> bool {
        self.mode == Mode::WriteBack && self.copies == Some(1)
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    members: Vec<PathBuf>,
    state: PathBuf,
    faults: Arc<Faults>,
    handles: Vec<FaultHandle>,
    vol: Option<CacheVolume>,
    /// Members given to the open (a lost member is left out until replaced).
    present: Vec<bool>,
}

fn file(path: &Path, bytes: u64) {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
}

fn member_bytes() -> u64 {
    tiercache_server::format::Superblock::member_data_offset(MEMBER_LINES, POOL_LS)
        + MEMBER_LINES * POOL_LS
}

impl Rig {
    fn new(cfg: &Cfg) -> Rig {
        let dir = tmp();
        let backing = dir.path().join("backing.img");
        std::fs::write(&backing, (0..SPAN).map(initial).collect::<Vec<u8>>()).unwrap();
        let members: Vec<PathBuf> = (0..cfg.members)
            .map(|i| dir.path().join(format!("m{i}.img")))
            .collect();
        for m in &members {
            file(m, member_bytes());
        }
        let devs = members
            .iter()
            .map(|p| {
                (
                    p.display().to_string(),
                    Box::new(FileDev::open(p).unwrap()) as Box<dyn BlockDev>,
                )
            })
            .collect();
        let o = FormatOptions {
            line_size: POOL_LS,
            mode: cfg.mode,
            ..Default::default()
        };
        PoolDev::format(devs, SPAN, &o, cfg.copies).unwrap();
        let state = dir.path().join("state");
        Rig {
            present: vec![true; cfg.members],
            _dir: dir,
            backing,
            members,
            state,
            faults: Faults::new(0),
            handles: Vec::new(),
            vol: None,
        }
    }

    /// Opens the pool on freshly wrapped devices (no fault injected), leaving out members
    /// not present; `accept`: accept the loss of what a left-out member held dirty.
    fn open(&mut self, seed: u64, max_errors: u64, accept: bool) -> Result<(), String> {
        self.faults = Faults::new(seed);
        self.handles.clear();
        let mut devs: Vec<(String, Box<dyn BlockDev>)> = Vec::new();
        for (i, p) in self.members.iter().enumerate() {
            let (d, h) = self.faults.wrap(
                &format!("cache{i}"),
                Box::new(FileDev::open(p).unwrap()),
                true,
            );
            self.handles.push(h);
            if self.present[i] {
                devs.push((p.display().to_string(), Box::new(d)));
            }
        }
        let (b, _) = self.faults.wrap(
            "backing",
            Box::new(FileDev::open(&self.backing).unwrap()),
            true,
        );
        let how = PoolOpen {
            degraded: true,
            accept_lost_dirty: accept,
            state_dir: Some(self.state.clone()),
        };
        let pd = PoolDev::open_with(devs, how)?;
        let o = OpenOptions {
            state_path: Some(self.state.join("volume.state")),
            ..Default::default()
        };
        let vol = CacheVolume::open(Box::new(pd), Box::new(b), &o)
            .map_err(|e| e.to_string())?
            .0;
        vol.set_max_cache_errors(max_errors);
        self.vol = Some(vol);
        Ok(())
    }

    fn vol(&self) -> &CacheVolume {
        self.vol.as_ref().unwrap()
    }
}

/// Whether `[off, off + len)` meets a range the volume reports lost.
fn in_lost(vol: &CacheVolume, off: u64, len: u64) -> bool {
    vol.stats()
        .lost_dirty_ranges
        .iter()
        .any(|&(s, e)| s < off + len && off < e)
}

struct Run {
    cfg: Cfg,
    seed: u64,
    r: ChaCha8Rng,
    m: Model,
    rig: Rig,
    log: Vec<String>,
    /// The member with an injected fault now, and the fault.
    faulty: Option<(usize, Fault)>,
    /// Ops left before a burst heals.
    heal_in: u32,
    /// Faults injected so far, and whether another may come (the pool is redundant again).
    faults: u32,
    may_fault: bool,
    /// Some member fault happened since the pool was last fully redundant: with one copy,
    /// data may be reported lost.
    degraded_since: bool,
    /// Bytes whose loss was reported (one copy): their value is unknown until rewritten.
    lost_any: bool,
    /// Members replaced so far (new files are named by it).
    replaced: u32,
}

impl Run {
    fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(|s| s.as_str()).collect();
        format!(
            "seed {} ({} members, {:?}, copies {:?}, max errors {}): {what}\nlast ops:\n{}",
            self.seed,
            self.cfg.members,
            self.cfg.mode,
            self.cfg.copies,
            self.cfg.max_errors,
            tail.join("\n")
        )
    }

    /// Whether a failure of a request is allowed now: only with one copy, after a member
    /// fault, where the volume reports the range lost.
    fn may_fail(&self, off: u64, len: u64) -> bool {
        self.cfg.may_lose()
            && (self.degraded_since || self.lost_any)
            && in_lost(self.rig.vol(), off, len)
    }

    fn op(&mut self, i: usize) -> Result<(), String> {
        let vol = self.rig.vol.as_ref().unwrap();
        let (kind, off, len, fua) = random_op(&mut self.r, SPAN);
        match kind {
            0 => {
                let mut buf = vec![0u8; len as usize];
                self.log.push(format!("{i}: read {off}+{len}"));
                match vol.read(off, &mut buf) {
                    Ok(()) => {
                        if !self.lost_any || !in_lost(vol, off, len) {
                            let m = &self.m;
                            let res =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    m.check_now(off as usize, &buf, "read")
                                }));
                            if let Err(p) = res {
                                return Err(self.fail(format!(
                                    "op {i}: read {off}+{len}: {}",
                                    panic_text(&p)
                                )));
                            }
                        }
                    }
                    Err(e) if self.may_fail(off, len) => {
                        self.log.push(format!("{i}:   failed in a lost range: {e}"));
                    }
                    Err(e) => {
                        return Err(self.fail(format!("op {i}: read {off}+{len} failed: {e}")))
                    }
                }
            }
            1 => {
                let data: Vec<u8> = (0..len)
                    .map(|k| (i as u8) ^ (k as u8) ^ (self.seed as u8) ^ 0x3c)
                    .collect();
                let zero = self.r.gen_bool(0.1);
                self.log.push(format!(
                    "{i}: {} {off}+{len}{}",
                    if zero { "write-zeroes" } else { "write" },
                    if fua { " fua" } else { "" }
                ));
                let res = if zero {
                    vol.write_zeroes(off, len, fua, false)
                } else {
                    vol.write(off, &data, fua)
                };
                match res {
                    Ok(()) => {
                        let d = if zero { vec![0u8; len as usize] } else { data };
                        self.m.write(off as usize, &d, fua);
                    }
                    // One copy: a FUA write's flush reports the data lost with a member as a
                    // failure; what the write itself did is unknown.
                    Err(e) if self.cfg.may_lose() && self.degraded_since => {
                        self.log.push(format!("{i}:   failed (lost data): {e}"));
                        self.m.trim(off as usize, len as usize);
                        self.lost_any = true;
                    }
                    Err(e) => {
                        return Err(self.fail(format!("op {i}: write {off}+{len} failed: {e}")))
                    }
                }
            }
            2 => {
                self.log.push(format!("{i}: trim {off}+{len}"));
                if let Err(e) = vol.trim(off, len) {
                    return Err(self.fail(format!("op {i}: trim {off}+{len} failed: {e}")));
                }
                // A trimmed byte may read anything but another place's data (the model does
                // not tell): its value is unknown from now on.
                self.m.trim(off as usize, len as usize);
            }
            _ => {
                self.log.push(format!("{i}: flush"));
                match vol.flush() {
                    Ok(()) => self.m.flush(),
                    // One copy: a flush reports the lost data (once) as a failure.
                    Err(e) if self.cfg.may_lose() && self.degraded_since => {
                        self.log
                            .push(format!("{i}:   flush failed (lost data): {e}"));
                        self.lost_any |= !vol.stats().lost_dirty_ranges.is_empty();
                    }
                    Err(e) => return Err(self.fail(format!("op {i}: flush failed: {e}"))),
                }
            }
        }
        if self.cfg.may_lose() && !vol.stats().lost_dirty_ranges.is_empty() {
            self.lost_any = true;
        }
        Ok(())
    }

    /// Injects a fault on a random present member.
    fn inject(&mut self, i: usize) {
        let live: Vec<usize> = (0..self.cfg.members)
            .filter(|&d| self.rig.present[d] && !self.rig.vol().pool_members()[d].0)
            .collect();
        let d = live[self.r.gen_range(0..live.len())];
        let f = [Fault::Lose, Fault::Reads, Fault::Writes, Fault::Syncs][self.r.gen_range(0..4)];
        let h = &self.rig.handles[d];
        let bytes = member_bytes();
        let a = self.r.gen_range(0..bytes);
        let b = (a + self.r.gen_range(4096..bytes / 2)).min(bytes);
        match f {
            Fault::Lose => h.lose(),
            Fault::Reads => h.fail_reads(a..b),
            Fault::Writes => h.fail_writes(a..b),
            Fault::Syncs => h.fail_syncs(),
        }
        self.log
            .push(format!("{i}: FAULT member {d}: {f:?} (bytes {a}..{b})"));
        self.faulty = Some((d, f));
        self.heal_in = self.r.gen_range(5..60);
        self.faults += 1;
        self.may_fault = false;
        self.degraded_since = true;
    }

    fn heal(&mut self, i: usize) {
        if let Some((d, f)) = self.faulty {
            if f != Fault::Lose {
                self.rig.handles[d].heal();
                self.log.push(format!("{i}: heal member {d}"));
                self.faulty = None;
            }
        }
    }

    /// A clean restart or a power cut, and the reopen (without a lost member).
    fn restart(&mut self, i: usize, cut: bool) -> Result<(), String> {
        let vol = self.rig.vol.take().unwrap();
        if cut {
            self.log.push(format!("{i}: POWER CUT"));
            self.rig.faults.power_cut();
            drop(vol);
        } else {
            self.log.push(format!("{i}: clean restart"));
            match vol.shutdown() {
                Ok(()) => {
                    self.m.flush();
                }
                // A shutdown that cannot make everything durable (a member failing as it
                // syncs): a crash as far as the model is concerned.
                Err(e) => self.log.push(format!("{i}:   shutdown failed: {e}")),
            }
            self.rig.faults.process_exit();
            drop(vol);
        }
        if let Some((d, Fault::Lose)) = self.faulty {
            // The pulled device stays away: started degraded without it.
            self.rig.present[d] = false;
        }
        self.faulty = None;
        let seed = self.seed ^ (i as u64) << 20;
        let mut accepted = false;
        if let Err(e) = self.rig.open(seed, self.cfg.max_errors, false) {
            if !(self.cfg.may_lose() && self.degraded_since) {
                return Err(self.fail(format!("op {i}: reopen refused: {e}")));
            }
            // One copy: the start without the member is refused naming what it held; the
            // operator accepts the loss.
            self.log.push(format!("{i}:   reopen refused: {e}"));
            if !e.contains("--accept-lost-dirty") {
                return Err(self.fail(format!("op {i}: refusal without the way out: {e}")));
            }
            self.rig
                .open(seed, self.cfg.max_errors, true)
                .map_err(|e| self.fail(format!("op {i}: reopen accepting the loss: {e}")))?;
            accepted = true;
            self.lost_any = true;
        }
        // Every byte: now the durable value or one written since (a power cut), or the last
        // acknowledged one (a clean restart flushed it into `durable`).
        let vol = self.rig.vol();
        let mut buf = vec![0u8; SPAN as usize];
        let mut k = 0;
        while k < SPAN {
            let n = 65536.min(SPAN - k);
            let part = &mut buf[k as usize..(k + n) as usize];
            if let Err(e) = vol.read(k, part) {
                let allowed = accepted || self.may_fail(k, n);
                if !allowed {
                    return Err(self.fail(format!("op {i}: read {k}+{n} after restart: {e}")));
                }
                // Read line by line around the lost ranges.
                for l in (k..k + n).step_by(POOL_LS as usize) {
                    let s = &mut buf[l as usize..(l + POOL_LS) as usize];
                    if vol.read(l, s).is_err() {
                        if !in_lost(vol, l, POOL_LS) {
                            return Err(self.fail(format!(
                                "op {i}: line at {l} unreadable after restart, not reported lost"
                            )));
                        }
                        // Unknown from now on: accept what a rewrite brings.
                        self.m.trim(l as usize, POOL_LS as usize);
                    }
                }
            }
            k += n;
        }
        let lost = vol.stats().lost_dirty_ranges;
        let m = &self.m;
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for (k, &g) in buf.iter().enumerate() {
                let k64 = k as u64;
                if lost.iter().any(|&(s, e)| s <= k64 && k64 < e) {
                    continue;
                }
                m.check_after_crash(k, std::slice::from_ref(&g), "after restart");
            }
        }));
        if let Err(p) = res {
            return Err(self.fail(format!("op {i}: {}", panic_text(&p))));
        }
        // The bytes read are now what the volume holds, durable or not yet: the model
        // starts from them (a power cut's choice among the allowed values is now fixed).
        for (k, &g) in buf.iter().enumerate() {
            if self.m.now[k].is_some() || self.m.durable[k].is_some() {
                self.m.now[k] = Some(g);
            }
        }
        self.m.flush();
        Ok(())
    }

    /// Replaces a failed member by a fresh device and re-mirrors: the pool is redundant
    /// again, so another fault may come.
    fn replace(&mut self, i: usize) -> Result<(), String> {
        let failed: Vec<usize> = self
            .rig
            .vol()
            .pool_members()
            .iter()
            .enumerate()
            .filter(|(_, m)| m.0)
            .map(|(d, _)| d)
            .collect();
        let Some(&d) = failed.first() else {
            return Ok(());
        };
        // A fresh file (a new disk: the failed one keeps its own file, whose unsynced
        // writes a power cut may still land there, never on the new one).
        self.replaced += 1;
        let path = self.rig.members[d].with_file_name(format!("m{d}-r{}.img", self.replaced));
        file(&path, member_bytes());
        self.rig.members[d] = path.clone();
        let (dev, h) = self.rig.faults.wrap(
            &format!("cache{d}"),
            Box::new(FileDev::open(&path).unwrap()),
            true,
        );
        self.rig.handles[d] = h;
        if let Some((fd, _)) = self.faulty {
            if fd == d {
                self.faulty = None;
            }
        }
        self.log.push(format!("{i}: replace member {d}"));
        self.rig
            .vol()
            .replace_cache_member(d, path.display().to_string(), Box::new(dev))
            .map_err(|e| self.fail(format!("op {i}: replace member {d}: {e}")))?;
        self.rig.present[d] = true;
        let vol = self.rig.vol();
        vol.remirror()
            .map_err(|e| self.fail(format!("op {i}: re-mirror after replace: {e}")))?;
        // Dirty lines that found no slot for a copy are written back by the cleaner.
        for _ in 0..200 {
            if vol.stats().unmirrored_lines == 0 {
                break;
            }
            vol.clean_if_needed()
                .map_err(|e| self.fail(format!("op {i}: cleaning after replace: {e}")))?;
            vol.remirror()
                .map_err(|e| self.fail(format!("op {i}: re-mirror after replace: {e}")))?;
        }
        if self.cfg.mode == Mode::WriteBack && self.cfg.copies != Some(1) {
            let left = vol.stats().unmirrored_lines;
            if left != 0 {
                return Err(self.fail(format!(
                    "op {i}: {left} dirty lines left with one copy after replace + re-mirror"
                )));
            }
        }
        let vol = self.rig.vol();
        vol.flush()
            .map_err(|e| self.fail(format!("op {i}: flush after replace: {e}")))?;
        self.m.flush();
        // Everything reads back as before the replacement (nothing served from the new,
        // empty device).
        self.check_all(i, "after replace")?;
        self.degraded_since = false;
        self.may_fault = true;
        Ok(())
    }

    /// Reads the whole volume and checks it against the model now (lost ranges skipped).
    fn check_all(&mut self, i: usize, what: &str) -> Result<(), String> {
        let vol = self.rig.vol();
        for l in (0..SPAN).step_by(POOL_LS as usize) {
            let mut buf = vec![0u8; POOL_LS as usize];
            match vol.read(l, &mut buf) {
                Ok(()) if !(self.lost_any && in_lost(vol, l, POOL_LS)) => {
                    let m = &self.m;
                    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        m.check_now(l as usize, &buf, what)
                    }));
                    if let Err(p) = res {
                        return Err(self.fail(format!("op {i}: {}", panic_text(&p))));
                    }
                }
                Ok(()) => {}
                Err(e) if self.may_fail(l, POOL_LS) => {
                    self.log.push(format!("{i}:   {what}: line {l} lost: {e}"));
                }
                Err(e) => return Err(self.fail(format!("op {i}: {what}: read {l}: {e}"))),
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), String> {
        for i in 0..self.cfg.ops {
            let x = self.r.gen_range(0..1000);
            match x {
                0..=11 if self.may_fault && self.faults < 3 => self.inject(i),
                12..=19 => self.restart(i, x % 2 == 0)?,
                20..=27 => {
                    self.log.push(format!("{i}: cleaner pass"));
                    let vol = self.rig.vol();
                    // A pass may stop at the member's error (the background thread logs it
                    // and goes on); what it left must still read back (checked by the ops).
                    if let Err(e) = vol.clean_if_needed() {
                        if self.faulty.is_none() && !(self.cfg.may_lose() && self.degraded_since) {
                            return Err(self.fail(format!("op {i}: cleaner pass failed: {e}")));
                        }
                        self.log.push(format!("{i}:   cleaner pass failed: {e}"));
                    }
                }
                28..=31 => {
                    self.log.push(format!("{i}: re-mirror pass"));
                    if let Err(e) = self.rig.vol().remirror() {
                        if self.faulty.is_none() {
                            return Err(self.fail(format!("op {i}: re-mirror failed: {e}")));
                        }
                        self.log.push(format!("{i}:   re-mirror failed: {e}"));
                    }
                }
                32..=35 if self.faulty.is_none() && self.degraded_since => self.replace(i)?,
                _ => self.op(i)?,
            }
            if self.faulty.is_some() {
                self.heal_in = self.heal_in.saturating_sub(1);
                if self.heal_in == 0 {
                    self.heal(i);
                }
            }
        }
        // The end: faults healed (a lost member stays lost), shut down, reopened, read.
        self.heal(usize::MAX);
        self.restart(self.cfg.ops, false)?;
        self.rig.vol.take().unwrap().shutdown().ok();
        Ok(())
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

fn run_seed(seed: u64, ops: usize) -> Result<u32, String> {
    let mut r = rng(seed ^ 0x9001);
    let cfg = Cfg::draw(&mut r, ops);
    let mut rig = Rig::new(&cfg);
    rig.open(seed, cfg.max_errors, false)
        .map_err(|e| format!("seed {seed}: first open: {e}"))?;
    let mut run = Run {
        m: Model::new(0, SPAN),
        cfg,
        seed,
        r,
        rig,
        log: Vec::new(),
        faulty: None,
        heal_in: 0,
        faults: 0,
        may_fault: true,
        degraded_since: false,
        lost_any: false,
        replaced: 0,
    };
    // A panic inside the volume (an assertion guarding data) names the seed too.
    let res = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.run())) {
        Ok(r) => r,
        Err(p) => Err(run.fail(format!("panicked: {}", panic_text(&p)))),
    };
    if std::env::var("TIERCACHE_POOL_FAULT_SEED").is_ok() {
        for l in &run.log {
            eprintln!("{l}");
        }
    }
    res.map(|()| run.faults)
}

#[test]
fn one_member_fault_never_loses_misdirects_or_serves_stale_data() {
    let soak = std::env::var("TIERCACHE_FAULT_SOAK").is_ok_and(|v| v != "0");
    let (seeds, ops): (Vec<u64>, usize) = match std::env::var("TIERCACHE_POOL_FAULT_SEED") {
        Ok(s) => (vec![s.parse().expect("a seed number")], 400),
        Err(_) => {
            let n = std::env::var("TIERCACHE_POOL_FAULT_SEEDS")
                .map(|s| s.parse().expect("a number of seeds"))
                .unwrap_or(if soak { 1000 } else { 60 });
            // Seeds that found defects (after the first 60), kept as regressions: 262, 269
            // (session 26's fixes); 326, 422, 451 (a power cut left dirty lines single-copy,
            // and a member lost after the restart lost them: the open now settles them).
            let found = [262, 269, 326, 422, 451].into_iter().filter(|&s| s >= n);
            ((0..n).chain(found).collect(), if soak { 1200 } else { 400 })
        }
    };
    let mut failures = Vec::new();
    let mut faults = 0;
    for &s in &seeds {
        match run_seed(s, ops) {
            Ok(f) => faults += f,
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}\nthe first in full:\n{}",
        failures.len(),
        seeds.len(),
        failures
            .iter()
            .map(|f| f.lines().next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
        failures[0]
    );
    // The checker is worth something: faults were injected.
    assert!(
        seeds.len() < 10 || faults as usize >= seeds.len() / 2,
        "only {faults} faults injected over {} seeds",
        seeds.len()
    );
}
