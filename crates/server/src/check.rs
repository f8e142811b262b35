//! Offline consistency check of a cache device (`tiercache check`): the superblock (magic,
//! version, checksums, fields), every metadata record's checksum, and the mapping (no key in
//! two slots except a newer-sequence duplicate after an unclean stop, keys inside the
//! backing device, sector masks that fit a line and dirty within valid). Read-only.
//! [`repair_device`] (`tiercache check --repair`) empties the records the check found bad
//! (a record whose checksum fails has an unknown key: its slot is named, and its data may
//! have been dirty; a record that verifies but maps nonsense is dropped and its range, if
//! dirty, listed), rewrites the metadata, and leaves a device that opens; run on a
//! consistent device it writes nothing.
//!
//! With data checksums (`crate::data_sums`) the check also reads every cached sector and
//! compares its crc32c: a mismatch is a problem naming the slot and volume range (after an
//! unclean stop a line flagged in flux is only noted: the server recomputes its checksums),
//! as is every range the server recorded as lost to damaged dirty data. A repair drops the
//! damaged sectors from their records (clean ones are then read from the backing device),
//! lists the damaged dirty ranges as lost, and clears the server's lost list (the ranges
//! then read the backing device's older data: the listing is the only record of the loss).

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
    /// The server's lost-range list (`crate::lost_list`): volume ranges whose acknowledged
    /// data was lost, which read EIO until rewritten (listed, not a problem: the server
    /// knows them). A damaged list is a problem. Pairs of byte offsets on a cache of one
    /// volume, named within their volume on one of several
    /// ([`crate::volume_set::NamedRange`]).
    pub lost_list: Vec<crate::volume_set::NamedRange>,
    /// A cache of several volumes (`serve --volume`): its volume table, each volume with
    /// what the cache holds of it. Empty for a cache of one volume.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeCheck>,
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
        listed(&mut self.problems, p);
    }

    fn note(&mut self, p: String) {
        listed(&mut self.notes, p);
    }
}

/// Adds `p` to a report's list unless it holds [`LIST`] already (the count goes on).
fn listed(list: &mut Vec<String>, p: String) {
    if list.len() < LIST {
        list.push(p);
    }
}

/// One volume of the superblock's volume table (a cache of several volumes).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VolumeCheck {
    pub id: u32,
    pub name: String,
    /// Its backing device's size in bytes and identity, as recorded (checked at every start).
    pub size: u64,
    pub backing: String,
    /// Lines of it the cache maps, and of those the dirty ones.
    pub lines: u64,
    pub dirty_lines: u64,
}

/// The name of volume `vol` in `sb`'s volume table; `None` on a cache of one volume.
fn vol_name(sb: &Superblock, vol: u32) -> Option<&str> {
    sb.volumes
        .iter()
        .find(|e| e.id == vol)
        .map(|e| e.name.as_str())
}

/// `[a, b)` (pool addresses of one volume) as the report names it: within its volume.
fn range_of(sb: &Superblock, a: u64, b: u64) -> String {
    crate::volume_set::range_text(vol_name(sb, crate::volume_set::vol_of(a)), a, b)
}

/// The pool address of line `key`'s first byte, and the end of its volume (`None`: a volume
/// the superblock does not know: not volume 0 of a one-volume cache, nor in the table).
fn line_range(sb: &Superblock, key: u64) -> (u64, Option<u64>) {
    let (vol, line) = ((key >> 48) as u32, key & ((1 << 48) - 1));
    let size = if sb.volumes.is_empty() {
        (vol == 0).then_some(sb.backing_size)
    } else {
        sb.volumes.iter().find(|e| e.id == vol).map(|e| e.size)
    };
    let base = crate::volume_set::vaddr(vol, 0);
    (
        base + line
            .saturating_mul(sb.line_size)
            .min(crate::volume_set::VOL_MASK),
        size.map(|s| base + s),
    )
}

/// A volume byte range whose dirty data a repair had to drop (its line is known).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LostRange {
    /// Byte offsets within the volume.
    pub start: u64,
    pub end: u64,
    /// The volume's name on a cache of several volumes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    pub what: String,
}

impl LostRange {
    /// `[a, b)` in pool addresses (one volume), named within its volume.
    fn new(sb: &Superblock, a: u64, b: u64, what: String) -> LostRange {
        let base = a & !crate::volume_set::VOL_MASK;
        LostRange {
            start: a - base,
            end: b.saturating_sub(base),
            volume: vol_name(sb, crate::volume_set::vol_of(a)).map(str::to_string),
            what,
        }
    }

    /// "volume bytes X..Y", or "volume NAME: bytes X..Y" on a cache of several volumes.
    pub fn text(&self) -> String {
        match &self.volume {
            Some(n) => format!("volume {n}: bytes {}..{}", self.start, self.end),
            None => format!("volume bytes {}..{}", self.start, self.end),
        }
    }
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
    /// Only these sectors are dropped (damaged data); `None`: the record is emptied.
    sectors: Option<u64>,
}

/// What the check read, for a repair.
struct Scan {
    sb: Superblock,
    meta: Vec<u8>,
    bad: Vec<BadSlot>,
    /// Ranges the server recorded as lost (data checksums).
    lost: Vec<(u64, u64)>,
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
        lost,
    }) = scan
    else {
        return Err(CheckError::Unrepairable(rep.problems.join("; ")));
    };
    for b in &bad {
        let at = (b.slot * format::RECORD_BYTES) as usize;
        let rec = &mut meta[at..at + format::RECORD_BYTES as usize];
        if let (Some(m), Some(r)) = (b.sectors, Record::decode(rec)) {
            // Damaged data: only those sectors go (clean ones are read from the backing
            // device again; dirty ones are listed as lost).
            let keep = Record {
                valid: r.valid & !m,
                dirty: r.dirty & !m,
                ..r
            };
            let ss = (sb.line_size / 64).max(512);
            if keep.valid == 0 {
                Record::EMPTY.encode(rec);
            } else {
                keep.encode(rec);
            }
            let offset = META_OFFSET + at as u64;
            out.repaired.push(format!(
                "slot {} (byte {offset}): {}: sectors {m:#x} dropped",
                b.slot, b.why
            ));
            let (vol, end) = line_range(&sb, r.key);
            let end = end.unwrap_or(vol + sb.line_size);
            for k in 0..64u64 {
                if (m & r.dirty) >> k & 1 == 1 {
                    out.lost_ranges.push(LostRange::new(
                        &sb,
                        vol + k * ss,
                        (vol + (k + 1) * ss).min(end),
                        format!(
                            "slot {}: damaged dirty data (data checksum mismatch) is dropped",
                            b.slot
                        ),
                    ));
                }
            }
            continue;
        }
        Record::EMPTY.encode(rec);
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
            Some((start, true)) => {
                // Line 0 of its volume: the key of `start`'s volume (keys and pool
                // addresses hold the volume id in the same bits).
                let end = line_range(&sb, start & !crate::volume_set::VOL_MASK)
                    .1
                    .unwrap_or(start + sb.line_size);
                out.lost_ranges.push(LostRange::new(
                    &sb,
                    start,
                    (start + sb.line_size).min(end),
                    format!("slot {}: {}: its dirty data is dropped", b.slot, b.why),
                ))
            }
            Some((_, false)) => {}
        }
    }
    dev.write_at(&meta, META_OFFSET)
        .map_err(CheckError::Unreadable)?;
    if sb.data_checksums {
        repair_sums(dev, &sb, &meta, &lost, &mut out)?;
    }
    dev.sync().map_err(CheckError::Unreadable)?;
    sb.generation += 1;
    dev.write_at(&sb.encode(), 0)
        .map_err(CheckError::Unreadable)?;
    dev.sync().map_err(CheckError::Unreadable)?;
    out.changed = true;
    let after = check_device(dev)?;
    Ok((out, after))
}

/// The data checksum half of a repair: damaged checksum blocks rebuilt from the data of the
/// lines their records map (now repaired), the server's lost list listed and cleared.
fn repair_sums(
    dev: &dyn BlockDev,
    sb: &Superblock,
    meta: &[u8],
    lost: &[(u64, u64)],
    out: &mut RepairReport,
) -> Result<(), CheckError> {
    let region = crate::data_sums::region_offset(sb.capacity_lines);
    let io = CheckError::Unreadable;
    let mut sums =
        match crate::data_sums::DataSums::load(dev, region, sb.capacity_lines, sb.line_size) {
            Ok((mut sums, bad)) => {
                let mut line = vec![0u8; sb.line_size as usize];
                for &b in &bad {
                    for slot in sums.block_slots(b).filter(|&s| s < sb.capacity_lines) {
                        let at = (slot * format::RECORD_BYTES) as usize;
                        if let Some(r) =
                            Record::decode(&meta[at..at + format::RECORD_BYTES as usize])
                                .filter(|r| r.key != EMPTY_KEY)
                        {
                            dev.read_at(&mut line, sb.data_offset + slot * sb.line_size)
                                .map_err(io)?;
                            sums.recompute(slot, &line, r.valid);
                        }
                    }
                    sums.touch_block(b);
                    out.repaired.push(format!(
                        "data checksum block {b}: rebuilt from the data of the lines it covers"
                    ));
                }
                sums
            }
            Err(_) => {
                // No valid header: a new region, every mapped line's checksums from its data.
                let mut sums = crate::data_sums::DataSums::format(
                    dev,
                    region,
                    sb.capacity_lines,
                    sb.line_size,
                )
                .map_err(io)?;
                let mut line = vec![0u8; sb.line_size as usize];
                for slot in 0..sb.capacity_lines {
                    let at = (slot * format::RECORD_BYTES) as usize;
                    if let Some(r) = Record::decode(&meta[at..at + format::RECORD_BYTES as usize])
                        .filter(|r| r.key != EMPTY_KEY)
                    {
                        dev.read_at(&mut line, sb.data_offset + slot * sb.line_size)
                            .map_err(io)?;
                        sums.recompute(slot, &line, r.valid);
                    }
                }
                out.repaired.push(
                    "data checksum region: header damaged, region rebuilt from the data".into(),
                );
                sums
            }
        };
    for &(a, b) in lost {
        out.lost_ranges.push(LostRange::new(
            sb,
            a,
            b,
            "dirty data the server found damaged (data checksum mismatch); the range now reads the backing device's older data".into(),
        ));
    }
    sums.write_dirty(dev).map_err(io)?;
    if !sums.lost.is_empty() {
        sums.lost.clear();
        sums.write_header(dev).map_err(io)?;
        // The same ranges leave the lost-range list (the listing above is their record).
        if let Some(at) = sb.lost_list_offset().filter(|_| sb.lost_list) {
            if let Ok(mut l) = crate::lost_list::LostList::load(dev, at) {
                let mut rest = l.ranges.clone();
                for &(a, b) in lost {
                    crate::degrade::unlose(&mut rest, a, b);
                }
                if rest != l.ranges {
                    l.write(dev, &rest).map_err(io)?;
                }
            }
        }
    }
    Ok(())
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
    if let Some(at) = sb.lost_list_offset().filter(|_| sb.lost_list) {
        match crate::lost_list::LostList::load(dev, at) {
            Ok(l) => {
                for &(a, b) in &l.ranges {
                    rep.note(format!(
                        "{} (length {}): in the lost-range list, their acknowledged data was lost; reads fail with EIO until written again",
                        range_of(&sb, a, b),
                        b - a
                    ));
                }
                rep.lost_list = crate::volume_set::named_ranges(
                    !sb.volumes.is_empty(),
                    |v| vol_name(&sb, v),
                    &l.ranges,
                );
            }
            Err(e) => rep.problem(e.to_string()),
        }
    }
    let meta_bytes = sb.capacity_lines.div_ceil(format::RECORDS_PER_PAGE) * PAGE;
    let mut meta = vec![0u8; meta_bytes as usize];
    dev.read_at(&mut meta, META_OFFSET)
        .map_err(CheckError::Unreadable)?;
    let sector = (sb.line_size / 64).max(512);
    let spl = sb.line_size / sector;
    let full = if spl >= 64 { u64::MAX } else { (1 << spl) - 1 };
    rep.volumes = sb
        .volumes
        .iter()
        .map(|e| VolumeCheck {
            id: e.id,
            name: e.name.clone(),
            size: e.size,
            backing: e.identity.describe(),
            ..Default::default()
        })
        .collect();
    let mut bad: Vec<BadSlot> = Vec::new();
    let line_of = |r: &Record| Some((line_range(&sb, r.key).0, r.dirty != 0));
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
                    sectors: None,
                });
            } else {
                rep.torn_records += 1;
                rep.note(format!(
                    "slot {slot} (byte {offset}): bad record checksum after an unclean stop (torn write; dropped at open)"
                ));
            }
            continue;
        };
        if r.is_copy() {
            // A dirty line's second copy: only a pool's (`check_pool` reconciles them).
            if dev.pool_lines().is_empty() {
                let why = r.check_copy(sb.version, slot).unwrap_err();
                rep.problem(why.clone());
                bad.push(BadSlot {
                    slot,
                    why,
                    line: None,
                    sectors: None,
                });
            }
            continue;
        }
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
                    sectors: None,
                });
            }
            continue;
        }
        let (vol, line) = (r.key >> 48, r.key & ((1 << 48) - 1));
        let (start, end) = line_range(&sb, r.key);
        if end.is_none_or(|e| start >= e) {
            rep.problem(match (end, vol_name(&sb, vol as u32)) {
                (None, _) if sb.volumes.is_empty() => format!(
                    "slot {slot} (byte {offset}): key {:#x} names volume id {vol}, but the cache serves one volume",
                    r.key
                ),
                (None, _) => format!(
                    "slot {slot} (byte {offset}): key {:#x} names volume id {vol}, which the cache's volume table does not list (volumes: {})",
                    r.key,
                    sb.volumes
                        .iter()
                        .map(|e| format!("{} (id {})", e.name, e.id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (Some(e), name) => format!(
                    "slot {slot} (byte {offset}): key {:#x} (line {line}) lies outside the backing device {}of {} lines",
                    r.key,
                    name.map_or(String::new(), |n| format!("of volume {n} ")),
                    (e - (start & !crate::volume_set::VOL_MASK)).div_ceil(sb.line_size)
                ),
            });
            bad.push(BadSlot {
                slot,
                why: format!("key {:#x} outside the backing device", r.key),
                line: None,
                sectors: None,
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
                sectors: None,
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
                                sectors: None,
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
                        sectors: None,
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
    let mut lost = Vec::new();
    if sb.data_checksums {
        lost = check_data(dev, &sb, &meta, &seen, &mut rep, &mut bad)?;
    }
    rep.lines = seen.len() as u64;
    for (_, r) in seen.values() {
        let v = rep.volumes.iter_mut().find(|v| v.id as u64 == r.key >> 48);
        if let Some(v) = v {
            v.lines += 1;
            v.dirty_lines += (r.dirty != 0) as u64;
        }
        if r.dirty != 0 {
            rep.dirty_lines += 1;
            rep.dirty_bytes += r.dirty.count_ones() as u64 * sector;
        }
    }
    Ok((
        rep,
        Some(Scan {
            sb,
            meta,
            bad,
            lost,
        }),
    ))
}

/// Verifies every valid sector of the mapped lines against its data checksum, and lists
/// the lost ranges the server recorded (see the module doc). Returns those ranges.
fn check_data(
    dev: &dyn BlockDev,
    sb: &Superblock,
    meta: &[u8],
    seen: &HashMap<u64, (u64, Record)>,
    rep: &mut CheckReport,
    bad: &mut Vec<BadSlot>,
) -> Result<Vec<(u64, u64)>, CheckError> {
    let region = crate::data_sums::region_offset(sb.capacity_lines);
    let (sums, bad_blocks) =
        match crate::data_sums::DataSums::load(dev, region, sb.capacity_lines, sb.line_size) {
            Ok(x) => x,
            Err(e) => {
                rep.problem(format!("data checksum region (byte {region}): {e}"));
                return Ok(Vec::new());
            }
        };
    let unknown: std::collections::BTreeSet<u64> = bad_blocks
        .iter()
        .flat_map(|&b| sums.block_slots(b))
        .collect();
    for &b in &bad_blocks {
        let at = region + crate::data_sums::HEADERS + b * crate::data_sums::BLOCK;
        if sb.clean {
            rep.problem(format!("data checksum block {b} (byte {at}): damaged (its checksum, magic or index is wrong) on a cleanly stopped cache"));
        } else {
            rep.note(format!("data checksum block {b} (byte {at}): torn by the unclean stop; the server recomputes the checksums it held"));
        }
    }
    let (ls, ss) = (sb.line_size, sums.sector);
    let mut line = vec![0u8; ls as usize];
    let mut slots: Vec<&(u64, Record)> = seen.values().collect();
    slots.sort_by_key(|x| x.0);
    for &&(slot, r) in &slots {
        if unknown.contains(&slot) {
            continue;
        }
        dev.read_at(&mut line, sb.data_offset + slot * ls)
            .map_err(CheckError::Unreadable)?;
        let mut damaged = 0u64;
        for k in 0..(ls / ss).min(64) {
            let ssd = slot * ls + k * ss;
            let u = (k * ss) as usize..((k + 1) * ss) as usize;
            if r.valid >> k & 1 == 1 && crc32c::crc32c(&line[u]) != sums.get(ssd) {
                damaged |= 1 << k;
            }
        }
        if damaged == 0 {
            continue;
        }
        let at = (slot * format::RECORD_BYTES) as usize;
        let vol = line_range(sb, r.key).0;
        let first = vol + damaged.trailing_zeros() as u64 * ss;
        let what = if damaged & r.dirty != 0 {
            "DIRTY"
        } else {
            "clean"
        };
        if !sb.clean && Record::in_flux(&meta[at..at + format::RECORD_BYTES as usize]) {
            rep.note(format!(
                "slot {slot} ({}): data differs from its checksum in a line written in place at the unclean stop; the server recomputes it",
                range_of(sb, first, vol + ls)
            ));
            continue;
        }
        rep.problem(format!(
            "slot {slot} (cache byte {}), {}: data checksum mismatch in {} {what} sector(s) of {ss} bytes (mask {damaged:#x})",
            sb.data_offset + slot * ls + damaged.trailing_zeros() as u64 * ss,
            range_of(sb, first, vol + (64 - damaged.leading_zeros()) as u64 * ss),
            damaged.count_ones()
        ));
        bad.push(BadSlot {
            slot,
            why: format!("data checksum mismatch ({what}, sectors {damaged:#x})"),
            line: Some((vol, damaged & r.dirty != 0)),
            sectors: Some(damaged),
        });
    }
    for &(a, b) in &sums.lost {
        rep.problem(format!(
            "{}: dirty data the server found damaged (data checksum mismatch) and recorded as lost; reads of it fail until it is written again",
            range_of(sb, a, b)
        ));
    }
    Ok(sums.lost.clone())
}

/// What [`check_any`] found, in the layout the device's superblock names.
pub enum DeviceCheck {
    Direct(CheckReport),
    Log(crate::log_check::LogCheckReport),
}

/// Why [`check_any`] could not check a device.
#[derive(Debug)]
pub enum DeviceCheckError {
    /// The device cannot be read.
    Unreadable(std::io::Error),
    /// The log layout's magic with a superblock that does not verify (an inconsistency).
    DamagedLog(std::io::Error),
    /// The log layout's recovery fails.
    LogRecovery(std::io::Error),
    /// The direct layout's check fails (no cache, or unreadable metadata).
    Direct(CheckError),
}

/// `tiercache check` of a device of either layout: [`crate::probe`] reads the superblocks
/// once and the layout's check runs (the one place `check` tells the layouts apart).
pub fn check_any(dev: Box<dyn BlockDev>) -> Result<DeviceCheck, DeviceCheckError> {
    match crate::live::probe(&*dev) {
        Ok(crate::Found::Log(_)) => crate::log_check::check_log_device(dev)
            .map(DeviceCheck::Log)
            .map_err(DeviceCheckError::LogRecovery),
        Ok(crate::Found::DamagedLog(e)) => Err(DeviceCheckError::DamagedLog(e)),
        Ok(crate::Found::Direct(_) | crate::Found::NoCache(_)) => check_device(&*dev)
            .map(DeviceCheck::Direct)
            .map_err(DeviceCheckError::Direct),
        Err(e) => Err(DeviceCheckError::Unreadable(e)),
    }
}

/// Why [`repair_any`] could not repair a device.
#[derive(Debug)]
pub enum RepairAnyError {
    /// The device cannot be read, or the log layout's recovery fails (`check` exit 2).
    Unreadable(String),
    /// Damage a repair cannot fix, such as the superblock (exit 1).
    Unrepairable(String),
    /// The repair itself failed (exit 2).
    Failed(String),
}

/// `tiercache check --repair` of a device of either layout: [`crate::probe`] reads the
/// superblocks once and the layout's repair runs (the one place `check --repair` tells the
/// layouts apart, as [`check_any`] for `check`). `dev` is the device opened for writing
/// (exclusively); `read_only` opens a read-only view of it, on which the log layout is
/// checked first: its salvage runs only when the recovery finds damage, so a consistent
/// device is not written. Returns the layout (`"direct"` or `"log"`) and what was repaired.
pub fn repair_any(
    dev: Box<dyn BlockDev>,
    read_only: &dyn Fn() -> std::io::Result<Box<dyn BlockDev>>,
) -> Result<(&'static str, RepairReport), RepairAnyError> {
    match crate::live::probe(&*dev) {
        Ok(crate::Found::Log(_)) => {
            let ro = read_only().map_err(|e| RepairAnyError::Unreadable(e.to_string()))?;
            let report = crate::log_check::check_log_device(ro).map_err(|e| {
                RepairAnyError::Unreadable(format!("recovery of the log layout fails: {e}"))
            })?;
            if report.recovery.damage.is_empty() {
                return Ok(("log", RepairReport::default()));
            }
            crate::log_check::repair_log_device(dev)
                .map(|r| ("log", r))
                .map_err(|e| RepairAnyError::Failed(format!("repair failed: {e}")))
        }
        Ok(crate::Found::DamagedLog(e)) => Err(RepairAnyError::Unrepairable(format!(
            "cannot be repaired: {e}"
        ))),
        Ok(crate::Found::Direct(_) | crate::Found::NoCache(_)) => match repair_device(&*dev) {
            Ok((r, _)) => Ok(("direct", r)),
            Err(CheckError::Unrepairable(why)) => Err(RepairAnyError::Unrepairable(
                CheckError::Unrepairable(why).to_string(),
            )),
            Err(e) => Err(RepairAnyError::Failed(e.to_string())),
        },
        Err(e) => Err(RepairAnyError::Unreadable(e.to_string())),
    }
}

/// One member of a pool as `tiercache check --cache A --cache B` found it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MemberCheck {
    /// The path or URI it was given by.
    pub name: String,
    /// Its index in the pool (`None`: its pool block is unreadable).
    pub index: Option<u16>,
    pub uuid: String,
    pub lines: u64,
    /// `active`, `failed` (per the newest pool block), `missing` (not given).
    pub state: String,
    /// Its pool block's generation.
    pub generation: u64,
}

/// What `tiercache check` found on a pool of cache devices (see [`check_pool`]).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PoolCheckReport {
    pub pool: String,
    /// The newest pool block's generation (the pool's membership).
    pub generation: u64,
    pub dirty_copies: u8,
    pub members: Vec<MemberCheck>,
    /// The check of the pool's records as one cache (`check_device` through `PoolDev`):
    /// only when every member is given and active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<CheckReport>,
    /// The reconciliation open would do (`crate::reconcile`).
    pub primaries: u64,
    pub paired: u64,
    pub resync: u64,
    pub promoted: u64,
    pub dropped: u64,
    /// Dirty lines left with one cache copy (no copy, or a promoted copy).
    pub unmirrored: u64,
    pub problems: Vec<String>,
    pub problem_count: u64,
    pub notes: Vec<String>,
}

impl PoolCheckReport {
    pub fn ok(&self) -> bool {
        self.problem_count == 0 && self.records.as_ref().is_none_or(|r| r.ok())
    }

    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        listed(&mut self.problems, p);
    }

    fn note(&mut self, p: String) {
        listed(&mut self.notes, p);
    }
}

/// `tiercache check --cache A --cache B ...`: the members of a pool (given in any order;
/// read-only). Verifies each member's pool block (checksum, one pool uuid, one membership:
/// member count and entries, each index once, its superblock's uuid as listed) and record
/// pages (checksums, copies well formed), reports the reconciliation open would do
/// ([`crate::reconcile`]: paired, resynced, promoted and dropped copies, dirty lines without
/// a copy), and, with every member given and active, checks the pool's records as one cache
/// ([`check_device`]). Members missing or marked failed are named; the reconciliation runs
/// without them as open would. `Err` only when no member has a readable pool block.
pub fn check_pool(devs: Vec<(String, Box<dyn BlockDev>)>) -> Result<PoolCheckReport, CheckError> {
    use crate::format::{MemberState, PoolBlock, POOL_BLOCK_AT, POOL_META_OFFSET, VERSION_POOL};
    use crate::reconcile::{self, MemberView, SlotRecord};
    use crate::state_file::uuid_hex;
    let mut rep = PoolCheckReport::default();
    // Each member's pool block and superblock.
    let mut read: Vec<Option<(PoolBlock, Option<Superblock>)>> = Vec::new();
    let mut last_err = None;
    for (name, dev) in &devs {
        let mut b = vec![0u8; POOL_META_OFFSET as usize];
        if let Err(e) = dev.read_at(&mut b, 0) {
            rep.problem(format!("cache device {name}: unreadable: {e}"));
            last_err = Some(e);
            read.push(None);
            continue;
        }
        match PoolBlock::decode(&b[POOL_BLOCK_AT as usize..]) {
            Ok(block) => {
                let sb = match Superblock::decode_member(&b[..4096]) {
                    Ok(sb) => Some(sb),
                    Err(FormatError::BadMagic) => {
                        rep.note(format!("cache device {name} (member {}): superblock erased (a failed cache, or a format interrupted)", block.index));
                        None
                    }
                    Err(e) => {
                        rep.problem(format!(
                            "cache device {name} (member {}): superblock (bytes 0..4096): {e}",
                            block.index
                        ));
                        None
                    }
                };
                read.push(Some((block, sb)));
            }
            Err(why) => {
                rep.problem(format!(
                    "cache device {name}: pool block (bytes {POOL_BLOCK_AT}..{}): {why}",
                    POOL_BLOCK_AT + PAGE
                ));
                rep.members.push(MemberCheck {
                    name: name.clone(),
                    state: "unreadable".into(),
                    ..Default::default()
                });
                read.push(None);
            }
        }
    }
    let blocks: Vec<&PoolBlock> = read.iter().flatten().map(|(b, _)| b).collect();
    let Some(newest) = PoolBlock::newest(&blocks) else {
        return Err(match last_err {
            Some(e) => CheckError::Unreadable(e),
            None => CheckError::NotTiercache(FormatError::BadField {
                field: "pool block",
                why: format!(
                    "no cache device given is a member of a pool: {}",
                    rep.problems.join("; ")
                ),
            }),
        });
    };
    let auth = blocks[newest].clone();
    rep.pool = uuid_hex(&auth.pool);
    rep.generation = auth.generation;
    rep.dirty_copies = auth.dirty_copies;
    let lines: Vec<u64> = auth.members.iter().map(|m| m.lines).collect();
    let pool = match tiercache_engine::pool::Pool::new(&lines) {
        Ok(p) => p,
        Err(e) => {
            rep.problem(format!("pool {}: member sizes {lines:?}: {e}", rep.pool));
            return Ok(rep);
        }
    };
    // Which member each device is; membership agreement with the newest block.
    let mut given: Vec<Option<usize>> = vec![None; auth.members.len()];
    for (i, r) in read.iter().enumerate() {
        let Some((b, sb)) = r else { continue };
        let name = &devs[i].0;
        if b.pool != auth.pool {
            rep.problem(format!(
                "cache device {name} belongs to pool {}, not {}: wrong device?",
                uuid_hex(&b.pool),
                rep.pool
            ));
            continue;
        }
        let d = b.index as usize;
        if let Some(j) = given.get(d).copied().flatten() {
            rep.problem(format!(
                "cache devices {} and {name} are both member {d} of pool {}: the same device given twice?",
                devs[j].0, rep.pool
            ));
            continue;
        }
        if b.members != auth.members {
            rep.problem(format!(
                "cache device {name} (member {d}): its pool block (generation {}) lists {} members, not the pool's newest membership (generation {}, {} members): replaced or stale member",
                b.generation,
                b.members.len(),
                auth.generation,
                auth.members.len()
            ));
            continue;
        }
        if b.generation != auth.generation {
            rep.note(format!(
                "cache device {name} (member {d}): pool block generation {} < {} (same membership; rewritten at the next open)",
                b.generation, auth.generation
            ));
        }
        if b.dirty_copies != auth.dirty_copies {
            rep.problem(format!(
                "cache device {name} (member {d}): pool block says {} dirty copies, the newest {}",
                b.dirty_copies, auth.dirty_copies
            ));
        }
        if let Some(sb) = sb {
            if sb.uuid != auth.members[d].uuid || sb.capacity_lines != lines[d] {
                rep.problem(format!(
                    "cache device {name} (member {d}): superblock (uuid {}, {} lines) does not match the pool block's entry (uuid {}, {} lines)",
                    uuid_hex(&sb.uuid),
                    sb.capacity_lines,
                    uuid_hex(&auth.members[d].uuid),
                    lines[d]
                ));
                continue;
            }
            let need =
                Superblock::member_data_offset(lines[d], sb.line_size) + lines[d] * sb.line_size;
            if devs[i].1.size() < need {
                rep.problem(format!(
                    "cache device {name} (member {d}) has {} bytes, too few for its {} lines: truncated?",
                    devs[i].1.size(),
                    lines[d]
                ));
                continue;
            }
        }
        given[d] = Some(i);
    }
    let mut views = Vec::with_capacity(auth.members.len());
    for (d, m) in auth.members.iter().enumerate() {
        let view = match (m.state, given[d]) {
            (MemberState::Failed, _) => MemberView::Failed,
            (_, Some(_)) => MemberView::Present,
            (_, None) => MemberView::Missing,
        };
        match view {
            MemberView::Failed => rep.note(format!(
                "member {d} (uuid {}) is marked failed: its records are not read",
                uuid_hex(&m.uuid)
            )),
            MemberView::Missing => rep.note(format!(
                "member {d} (uuid {}, {} lines) is missing (not given, or not the member the pool lists): reconciled without it, as a degraded start would",
                uuid_hex(&m.uuid),
                m.lines
            )),
            MemberView::Present => {}
        }
        rep.members.push(MemberCheck {
            name: given[d].map_or(String::new(), |i| devs[i].0.clone()),
            index: Some(d as u16),
            uuid: uuid_hex(&m.uuid),
            lines: m.lines,
            state: match view {
                MemberView::Present => "active",
                MemberView::Failed => "failed",
                MemberView::Missing => "missing",
            }
            .into(),
            generation: given[d].map_or(0, |i| read[i].as_ref().unwrap().0.generation),
        });
        views.push(view);
    }
    // The pool's clean flag: the newest member superblock's.
    let clean = read
        .iter()
        .flatten()
        .filter_map(|(_, sb)| sb.as_ref())
        .max_by_key(|sb| sb.generation)
        .is_some_and(|sb| sb.clean);
    // Every present member's records, by pool slot.
    let mut records = Vec::new();
    let rb = format::RECORD_BYTES as usize;
    for d in 0..views.len() {
        let (MemberView::Present, Some(i)) = (views[d], given[d]) else {
            continue;
        };
        let (name, dev) = (&devs[i].0, &devs[i].1);
        let mut meta = vec![0u8; (lines[d].div_ceil(format::RECORDS_PER_PAGE) * PAGE) as usize];
        dev.read_at(&mut meta, POOL_META_OFFSET)
            .map_err(CheckError::Unreadable)?;
        for local in 0..lines[d] {
            let b = &meta[local as usize * rb..][..rb];
            let slot = pool.base(d) + local;
            match Record::decode_in(b, VERSION_POOL, slot) {
                Ok(Some(rec)) => records.push(SlotRecord {
                    slot: slot as u32,
                    rec,
                    in_flux: Record::in_flux(b),
                }),
                Ok(None) if clean => rep.problem(format!(
                    "cache device {name} (member {d}): slot {slot} (record page {}): bad record checksum on a cleanly stopped pool",
                    local / format::RECORDS_PER_PAGE
                )),
                Ok(None) => rep.note(format!(
                    "cache device {name} (member {d}): slot {slot}: bad record checksum after an unclean stop (torn write; dropped at open)"
                )),
                Err(why) => rep.problem(format!("cache device {name} (member {d}): {why}")),
            }
        }
    }
    let copies = records.iter().filter(|r| r.rec.is_copy()).count();
    if copies > 0 && auth.dirty_copies < 2 {
        rep.problem(format!(
            "{copies} copy record(s) on a pool keeping {} cache copies of dirty lines: only a pool of 2 writes them (damaged metadata)",
            auth.dirty_copies
        ));
    }
    let r = reconcile::reconcile(&pool, &views, &records);
    rep.primaries = r.primaries.len() as u64;
    rep.paired = r.paired.len() as u64;
    rep.resync = r.resync.len() as u64;
    rep.promoted = r.promoted.len() as u64;
    rep.dropped = r.dropped.len() as u64;
    rep.unmirrored = r.unmirrored.len() as u64;
    for x in &r.dropped {
        use crate::reconcile::DropWhy::*;
        let text = format!(
            "slot {} (member {}): copy of key {:#x} dropped: {}",
            x.slot,
            pool.member_of(x.slot as u64),
            x.key,
            match x.why {
                PrimaryOutside => "its primary slot lies outside the pool",
                SameMember => "its primary slot is on its own member",
                OlderCopy => "a newer copy of the line exists",
                Stale => "its primary no longer maps the line dirty with its sectors (cleaned, evicted or rewritten)",
                Superseded => "its primary's member is gone, but a present member maps the line",
            }
        );
        // Damage whatever the stop; a stale copy is expected only after a crash.
        if matches!(x.why, PrimaryOutside | SameMember) || clean {
            rep.problem(text);
        } else {
            rep.note(text);
        }
    }
    if rep.resync > 0 {
        rep.note(format!(
            "{} mirrored line(s) in flux: their copies are rewritten from the primaries at open",
            rep.resync
        ));
    }
    if auth.dirty_copies >= 2 && rep.unmirrored > 0 {
        rep.note(format!(
            "{} dirty line(s) have one cache copy: re-mirrored (or cleaned) at open",
            rep.unmirrored
        ));
    }
    // The records as one cache: keys, masks, duplicates (every member given and active).
    if views.iter().all(|v| *v == MemberView::Present) && rep.problem_count == 0 {
        let mut slots: Vec<Option<(String, Box<dyn BlockDev>)>> =
            devs.into_iter().map(Some).collect();
        let members: Vec<(String, Box<dyn BlockDev>)> = given
            .iter()
            .map(|g| slots[g.unwrap()].take().unwrap())
            .collect();
        match crate::pool_dev::PoolDev::open(members) {
            Ok(pd) => match check_device(&pd) {
                Ok(c) => {
                    debug_assert!(
                        c.superseded_records > 0 || !c.ok() || c.lines == rep.primaries,
                        "the pool check and the reconciliation count {} and {} lines",
                        c.lines,
                        rep.primaries
                    );
                    rep.records = Some(c);
                }
                Err(e) => rep.problem(format!("pool {} as one cache: {e}", rep.pool)),
            },
            Err(e) => rep.problem(e),
        }
    }
    Ok(rep)
}
