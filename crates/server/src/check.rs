//! Offline consistency check of a cache device (`tiercache check`): the superblock (magic,
//! version, checksums, fields), every metadata record's checksum, and the mapping (no key in
//! two slots except a newer-sequence duplicate after an unclean stop, keys inside the
//! backing device, sector masks that fit a line and dirty within valid). Read-only.

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

/// Why a device could not be checked at all (exit code 2), as opposed to inconsistencies.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read the device: {0}")]
    Unreadable(std::io::Error),
    #[error("not a tiercache cache device: {0}")]
    NotTiercache(FormatError),
}

/// Checks the cache device `dev`. `Err` when it cannot be read or is not a tiercache device;
/// otherwise the report says whether it is consistent.
pub fn check_device(dev: &dyn BlockDev) -> Result<CheckReport, CheckError> {
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
            return Ok(rep);
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
        return Ok(rep);
    }
    let meta_bytes = sb.capacity_lines.div_ceil(format::RECORDS_PER_PAGE) * PAGE;
    let mut meta = vec![0u8; meta_bytes as usize];
    dev.read_at(&mut meta, META_OFFSET)
        .map_err(CheckError::Unreadable)?;
    let sector = (sb.line_size / 64).max(512);
    let spl = sb.line_size / sector;
    let full = if spl >= 64 { u64::MAX } else { (1 << spl) - 1 };
    let lines_in_backing = sb.backing_size.div_ceil(sb.line_size);
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
            }
            continue;
        }
        let (vol, line) = (r.key >> 48, r.key & ((1 << 48) - 1));
        let mut bad = false;
        if vol != 0 || line >= lines_in_backing {
            rep.problem(format!(
                "slot {slot} (byte {offset}): key {:#x} (line {line}) lies outside the backing device of {} lines",
                r.key, lines_in_backing
            ));
            bad = true;
        }
        if r.valid == 0 || r.valid & !full != 0 || r.dirty & !r.valid != 0 {
            rep.problem(format!(
                "slot {slot} (byte {offset}): masks valid {:#x} dirty {:#x} do not fit a line of {spl} sectors (dirty must be within valid, valid not empty)",
                r.valid, r.dirty
            ));
            bad = true;
        }
        if bad {
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
    Ok(rep)
}
