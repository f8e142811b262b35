//! Offline consistency check of a cache device (`tiercache check`): the superblock (magic,
//! version, checksums, fields), every metadata record's checksum, and the mapping (no key in
//! two slots except a newer-sequence duplicate after an unclean stop, keys inside the
//! backing device, sector masks that fit a line and dirty within valid). Read-only.
//! [`repair_device`] (`tiercache check --repair`) empties the records the check found bad
//! (a record whose checksum fails has an unknown key: its slot is named, and its data may
//! have been dirty; a record that verifies but maps nonsense is dropped and its range, if
//! dirty, listed), rewrites the metadata, and leaves a device that opens; run on a
//! consistent device it writes nothing.

use crate::dev::BlockDev;
use crate::format::{self, FormatError, Record, Superblock, EMPTY_KEY, META_OFFSET, PAGE};
use std::collections::HashMap;

/// Problems listed in full up to this many (all are counted).
const LIST: usize = 50;

/// What the check found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub device_bytes: u64,
    pub version: u32,
    pub uuid: String,
    pub line_size: u64,
    pub capacity_lines: u64,
    pub mode: String,
    pub policy: String,
    pub backing_size: u64,
    pub backing_id: String,
    pub clean: bool,
    pub generation: u64,
    /// Records that map a line (the newest one per key).
    pub lines: u64,
    pub dirty_lines: u64,
    pub dirty_bytes: u64,
    pub empty_slots: u64,
    /// Records with a bad checksum after an unclean stop: torn writes, dropped at open.
    pub torn_records: u64,
    /// Older records of a key mapped twice after an unclean stop: ignored at open.
    pub superseded_records: u64,
    /// Inconsistencies: each makes `check` fail (first `LIST` listed).
    pub problems: Vec<String>,
    pub problem_count: u64,
    /// Expected after a crash, not failures.
    pub notes: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problem_count == 0
    }

    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < LIST {
            self.problems.push(p);
        }
    }

    fn note(&mut self, p: String) {
        if self.notes.len() < LIST {
            self.notes.push(p);
        }
    }
}

/// A volume byte range whose dirty data a repair had to drop (its line is known).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LostRange {
    pub start: u64,
    pub end: u64,
    pub what: String,
}

/// What `tiercache check --repair` did (both layouts).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairReport {
    /// Whether the device was written (false: nothing to repair).
    pub changed: bool,
    /// The damage found and repaired, one line each.
    pub repaired: Vec<String>,
    /// Log layout: valid journal records after a damaged one that were replayed.
    pub salvaged_records: u64,
    /// Losses whose line is unknown (a damaged record's key cannot be trusted): one entry
    /// per damaged structure, naming it.
    pub unknown_lost: Vec<String>,
    /// Volume byte ranges whose dirty data was dropped.
    pub lost_ranges: Vec<LostRange>,
}

/// Why a device could not be checked at all (exit code 2), as opposed to inconsistencies.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read the device: {0}")]
    Unreadable(std::io::Error),
    #[error("{}", not_a_cache(.0))]
    NotTiercache(FormatError),
    #[error("cannot be repaired: {0} (nothing on the device can be trusted without its superblock; `tiercache format --force` discards the cache and its dirty data)")]
    Unrepairable(String),
}

/// "not a tiercache cache device" once, whether or not the format error says it already.
fn not_a_cache(e: &FormatError) -> String {
    match e {
        FormatError::BadMagic => format!(
            "{e} (is this the backing device? `check` takes the cache device, --cache of serve)"
        ),
        _ => format!("not a tiercache cache device: {e}"),
    }
}

/// A record the check found bad, which a repair empties.
struct BadSlot {
    slot: u64,
    why: String,
    /// The record verifies: the range of its line and whether it held dirty data.
    line: Option<(u64, bool)>,
}

/// What the check read, for a repair.
struct Scan {
    sb: Superblock,
    meta: Vec<u8>,
    bad: Vec<BadSlot>,
}

/// Checks the cache device `dev`. `Err` when it cannot be read or is not a tiercache device;
/// otherwise the report says whether it is consistent.
pub fn check_device(dev: &dyn BlockDev) -> Result<CheckReport, CheckError> {
    scan(dev).map(|(r, _)| r)
}

/// `tiercache check --repair` of a direct-layout device (see the module doc). `Err` when it
/// cannot be read, is not a tiercache device, or its superblock is damaged (nothing can be
/// trusted: the report says so). The caller makes sure no server has the device open.
pub fn repair_device(dev: &dyn BlockDev) -> Result<(RepairReport, CheckReport), CheckError> {
    let (rep, scan) = scan(dev)?;
    let mut out = RepairReport::default();
    if rep.ok() {
        return Ok((out, rep));
    }
    let Some(Scan {
        mut sb,
        mut meta,
        bad,
    }) = scan
    else {
        return Err(CheckError::Unrepairable(rep.problems.join("; ")));
    };
    for b in &bad {
        let at = (b.slot * format::RECORD_BYTES) as usize;
        Record::EMPTY.encode(&mut meta[at..at + format::RECORD_BYTES as usize]);
        let offset = META_OFFSET + at as u64;
        out.repaired.push(format!(
            "slot {} (byte {offset}): {}: record emptied",
            b.slot, b.why
        ));
        match b.line {
            None => out.unknown_lost.push(format!(
                "slot {} (byte {offset}): the line it mapped is unknown (its record cannot be trusted); its data may have been dirty and is lost",
                b.slot
            )),
            Some((start, true)) => out.lost_ranges.push(LostRange {
                start,
                end: (start + sb.line_size).min(sb.backing_size),
                what: format!("slot {}: {}: its dirty data is dropped", b.slot, b.why),
            }),
            Some((_, false)) => {}
        }
    }
    dev.write_at(&meta, META_OFFSET)
        .map_err(CheckError::Unreadable)?;
    dev.sync().map_err(CheckError::Unreadable)?;
    sb.generation += 1;
    dev.write_at(&sb.encode(), 0)
        .map_err(CheckError::Unreadable)?;
    dev.sync().map_err(CheckError::Unreadable)?;
    out.changed = true;
    let after = check_device(dev)?;
    Ok((out, after))
}

fn scan(dev: &dyn BlockDev) -> Result<(CheckReport, Option<Scan>), CheckError> {
    let mut rep = CheckReport {
        device_bytes: dev.size(),
        ..Default::default()
    };
    let mut b = vec![0u8; format::SUPERBLOCK_BYTES as usize];
    dev.read_at(&mut b, 0).map_err(CheckError::Unreadable)?;
    let sb = match Superblock::decode(&b) {
        Ok(sb) => sb,
        Err(e @ (FormatError::BadMagic | FormatError::BadVersion(_))) => {
            return Err(CheckError::NotTiercache(e))
        }
        Err(FormatError::Io(e)) => return Err(CheckError::Unreadable(e)),
        Err(e) => {
            // The magic is there but the superblock is damaged: nothing else can be trusted.
            rep.problem(format!("superblock (bytes 0..4096): {e}"));
            return Ok((rep, None));
        }
    };
    rep.version = sb.version;
    rep.uuid = sb.uuid.iter().map(|x| format!("{x:02x}")).collect();
    rep.line_size = sb.line_size;
    rep.capacity_lines = sb.capacity_lines;
    rep.mode = tiercache_engine::Mode::ALL[sb.mode as usize]
        .as_str()
        .to_string();
    rep.policy = sb.policy.clone();
    rep.backing_size = sb.backing_size;
    rep.backing_id = sb.backing.name.clone();
    rep.clean = sb.clean;
    rep.generation = sb.generation;
    if tiercache_engine::policy::lookup(&sb.policy).is_none() {
        rep.problem(format!(
            "superblock: unknown replacement policy {:?}",
            sb.policy
        ));
    }
    if sb.data_offset % sb.line_size != 0 {
        rep.problem(format!(
            "superblock: data offset {} is not a multiple of the line size {}",
            sb.data_offset, sb.line_size
        ));
    }
    if dev.size() < sb.device_bytes() {
        rep.problem(format!(
            "device of {} bytes is smaller than the {} bytes the superblock describes ({} lines of {})",
            dev.size(),
            sb.device_bytes(),
            sb.capacity_lines,
            sb.line_size
        ));
        return Ok((rep, None));
    }
    let meta_bytes = sb.capacity_lines.div_ceil(format::RECORDS_PER_PAGE) * PAGE;
    let mut meta = vec![0u8; meta_bytes as usize];
    dev.read_at(&mut meta, META_OFFSET)
        .map_err(CheckError::Unreadable)?;
    let sector = (sb.line_size / 64).max(512);
    let spl = sb.line_size / sector;
    let full = if spl >= 64 { u64::MAX } else { (1 << spl) - 1 };
    let lines_in_backing = sb.backing_size.div_ceil(sb.line_size);
    let mut bad: Vec<BadSlot> = Vec::new();
    let line_of = |r: &Record| Some(((r.key & ((1 << 48) - 1)) * sb.line_size, r.dirty != 0));
    // Newest (slot, record) per key.
    let mut seen: HashMap<u64, (u64, Record)> = HashMap::new();
    for slot in 0..sb.capacity_lines {
        let at = (slot * format::RECORD_BYTES) as usize;
        let offset = META_OFFSET + at as u64;
        let Some(r) = Record::decode(&meta[at..at + format::RECORD_BYTES as usize]) else {
            if sb.clean {
                rep.problem(format!(
                    "slot {slot} (byte {offset}): bad record checksum on a cleanly stopped cache"
                ));
                bad.push(BadSlot {
                    slot,
                    why: "bad record checksum".into(),
                    line: None,
                });
            } else {
                rep.torn_records += 1;
                rep.note(format!(
                    "slot {slot} (byte {offset}): bad record checksum after an unclean stop (torn write; dropped at open)"
                ));
            }
            continue;
        };
        if r.key == EMPTY_KEY {
            rep.empty_slots += 1;
            if r.valid != 0 || r.dirty != 0 {
                rep.problem(format!(
                    "slot {slot} (byte {offset}): empty record with masks valid {:#x} dirty {:#x}",
                    r.valid, r.dirty
                ));
                bad.push(BadSlot {
                    slot,
                    why: "empty record with masks".into(),
                    line: Some((0, false)),
                });
            }
            continue;
        }
        let (vol, line) = (r.key >> 48, r.key & ((1 << 48) - 1));
        if vol != 0 || line >= lines_in_backing {
            rep.problem(format!(
                "slot {slot} (byte {offset}): key {:#x} (line {line}) lies outside the backing device of {} lines",
                r.key, lines_in_backing
            ));
            bad.push(BadSlot {
                slot,
                why: format!("key {:#x} outside the backing device", r.key),
                line: None,
            });
            continue;
        }
        if r.valid == 0 || r.valid & !full != 0 || r.dirty & !r.valid != 0 {
            rep.problem(format!(
                "slot {slot} (byte {offset}): masks valid {:#x} dirty {:#x} do not fit a line of {spl} sectors (dirty must be within valid, valid not empty)",
                r.valid, r.dirty
            ));
            bad.push(BadSlot {
                slot,
                why: format!("masks valid {:#x} dirty {:#x} do not fit", r.valid, r.dirty),
                line: line_of(&r),
            });
            continue;
        }
        match seen.get(&r.key) {
            None => {
                seen.insert(r.key, (slot, r));
            }
            Some(&(other, old)) => {
                let newer = format::seq_newer(r.seq, old.seq);
                if sb.clean || r.seq == old.seq {
                    rep.problem(format!(
                        "key {:#x} (line {line}) is mapped by slots {other} and {slot} (seq {} and {}){}",
                        r.key,
                        old.seq,
                        r.seq,
                        if sb.clean { " on a cleanly stopped cache" } else { ": same sequence number, no newer record" }
                    ));
                    // The older record goes (open ignores it too); with the same sequence
                    // number neither can be trusted.
                    if r.seq == old.seq {
                        for (s, rec) in [(other, old), (slot, r)] {
                            bad.push(BadSlot {
                                slot: s,
                                why: format!(
                                    "key {:#x} mapped twice with the same sequence number",
                                    rec.key
                                ),
                                line: line_of(&rec),
                            });
                        }
                        seen.remove(&r.key);
                        continue;
                    }
                    let (s, rec) = if newer { (other, old) } else { (slot, r) };
                    bad.push(BadSlot {
                        slot: s,
                        why: format!("older record of key {:#x}, mapped twice", rec.key),
                        line: Some((0, false)),
                    });
                } else {
                    rep.superseded_records += 1;
                    rep.note(format!(
                        "key {:#x} (line {line}) in slots {other} and {slot} after an unclean stop: the newer (seq {}) wins",
                        r.key,
                        old.seq.max(r.seq)
                    ));
                }
                if newer {
                    seen.insert(r.key, (slot, r));
                }
            }
        }
    }
    rep.lines = seen.len() as u64;
    for (_, r) in seen.values() {
        if r.dirty != 0 {
            rep.dirty_lines += 1;
            rep.dirty_bytes += r.dirty.count_ones() as u64 * sector;
        }
    }
    Ok((rep, Some(Scan { sb, meta, bad })))
}
