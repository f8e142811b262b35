//! A pool of several cache devices (`--cache` repeated) seen by the volume as ONE cache
//! device laid out as today's (issue 15 item 2, step 2 of docs/plan-multi-cache.md).
//!
//! [`PoolDev`] implements [`BlockDev`] for a *virtual* device of `pool.capacity()` lines in
//! the one-device layout (superblock at 0, records at `META_OFFSET`, the lost-range list
//! before `data_offset`, data after) and translates every access to the members (version 6,
//! `crate::format`):
//!
//! * the superblock: read, it is the newest member superblock with the pool's uuid, capacity
//!   and data offset; written, it is re-encoded per member (its own uuid, `capacity_lines`,
//!   `data_offset`, version 6), members in index order; all zeroes (a format beginning, or
//!   `fail_cache` erasing it) erase every member's;
//! * record page `p` holds pool slots `p * 128 ..`: it lives on the member owning them
//!   (`Pool::locate`), in that member's record area at [`POOL_META_OFFSET`] (members are whole
//!   record pages, so a page never spans two);
//! * data bytes of slot `s` live on its member at `data_offset_d + local * line_size`; a
//!   request crossing a member boundary is split;
//! * the lost-range list is replicated: written to every member in index order, read from
//!   member 0 (which every write reaches first, so it is never older than another's);
//! * `sync` syncs every member.
//!
//! So the volume code is unchanged, and the engine fills the pool's slots in order (member 0
//! first) until it places lines by member itself. Not built yet: data checksums in a pool,
//! a member missing (refused at open).

use crate::dev::BlockDev;
use crate::format::{
    FormatError, MemberState, PoolBlock, PoolEntry, Record, Superblock, EMPTY_KEY, META_OFFSET,
    PAGE, POOL_BLOCK_AT, POOL_MAGIC, POOL_META_OFFSET, RECORDS_PER_PAGE, RECORD_BYTES,
    VERSION_POOL,
};
use crate::state_file::uuid_hex;
use crate::volume::FormatOptions;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tiercache_engine::pool::Pool;
use tiercache_engine::Mode;

/// One member: its device, the name it was given by (path or URI), its data offset. The
/// device and name change only when a failed member is replaced
/// ([`PoolDev::replace_member`]), while nothing reaches it.
struct Member {
    dev: std::sync::RwLock<Box<dyn BlockDev>>,
    name: Mutex<String>,
    data_offset: u64,
    /// Requests and bytes that reached it through [`BlockDev`] calls on the pool (data,
    /// records, superblock, lost-range list; not the open's or a replacement's own I/O).
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

impl Member {
    fn dev(&self) -> std::sync::RwLockReadGuard<'_, Box<dyn BlockDev>> {
        self.dev.read().unwrap_or_else(|e| e.into_inner())
    }

    fn name(&self) -> String {
        self.name.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads `buf` at `at`, counted (see [`Member::reads`]).
    fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.dev().read_at(buf, at)
    }

    /// Writes `data` at `at`, counted (see [`Member::writes`]).
    fn write_at(&self, data: &[u8], at: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.dev().write_at(data, at)
    }
}

/// Several cache devices as one (see the module doc).
pub struct PoolDev {
    /// In member index order.
    members: Vec<Member>,
    /// Per member: failed ([`PoolDev::fail_member`], or `Failed` in the newest pool block at
    /// open). A failed member is never read or written again: its record pages read as
    /// empty (its stale records are never restored), writes of its pages and slots are
    /// skipped (the engine no longer places lines there), its data must not be read.
    failed: Vec<AtomicBool>,
    pool: Pool,
    /// The pool block as last written (members' states, generation); `index` 0.
    block: Mutex<PoolBlock>,
    line_size: u64,
    /// The virtual layout: data offset, size, end of the record area.
    data_offset: u64,
    size: u64,
    meta_end: u64,
    /// The virtual superblock as last read or written (zeroes: none).
    sb: Mutex<Vec<u8>>,
    /// Which slots' newest record (read or written) is dirty, counted per member: decides
    /// the members' `may_dirty` flags in the pool block (see [`PoolDev::note_records`]).
    /// Lock order: this, then `block`.
    dirty: Mutex<DirtyTrack>,
    /// See [`PoolDev::lost_at_open`].
    lost_at_open: Vec<(u64, u64)>,
    /// The pool generation file ([`PoolOpen::state_dir`]).
    gen_file: Option<std::path::PathBuf>,
}

/// Every volume's whole byte range (pool addresses) of the virtual superblock `vsb`.
fn whole_volumes(vsb: &[u8]) -> Vec<(u64, u64)> {
    let Ok(sb) = Superblock::decode(vsb) else {
        return Vec::new();
    };
    if sb.volumes.is_empty() {
        return vec![(0, sb.backing_size)];
    }
    sb.volumes
        .iter()
        .filter(|v| !v.removed())
        .map(|v| {
            (
                crate::volume_set::vaddr(v.id, 0),
                crate::volume_set::vaddr(v.id, v.size),
            )
        })
        .collect()
}

/// The name of the volume of pool address `a` in the virtual superblock `vsb`.
fn volume_name(vsb: &[u8], a: u64) -> Option<String> {
    let sb = Superblock::decode(vsb).ok()?;
    let v = crate::volume_set::vol_of(a);
    sb.volumes
        .iter()
        .find(|x| x.id == v)
        .map(|x| x.name.clone())
}

/// Per slot: its newest record read or written is dirty; per member: how many. And which
/// dirty lines are *single-copy* (no copy record on another member covers their dirty
/// sectors): the members' `may_single` flags ([`PoolDev::update_dirty_flags`]).
struct DirtyTrack {
    bits: Vec<u64>,
    count: Vec<u64>,
    /// Dirty line (not copy) records: slot -> (line key, dirty sectors).
    lines: HashMap<u32, (u64, u64)>,
    /// Copy records: copy slot -> (line key, primary slot, sectors).
    copies: HashMap<u32, (u64, u32, u64)>,
    /// Primary slot -> the copy records naming it (usually one).
    named: HashMap<u32, Vec<u32>>,
    /// Dirty lines with no covering copy record: per member, how many.
    single: HashSet<u32>,
    single_count: Vec<u64>,
    /// A record write failed, so the records on the members may differ from these (a
    /// write cut short leaves later pieces unwritten): the `may_single` flags are only
    /// raised, never cleared, until a whole batch of record writes
    /// ([`BlockDev::prepare_records`]: a flush, which rewrites every page of the failed
    /// one) was written without error.
    unsure: bool,
    /// Record writes left of the batch announced by `prepare_records`.
    batch_left: Option<usize>,
}

impl DirtyTrack {
    fn new(cap: u64, members: usize) -> DirtyTrack {
        DirtyTrack {
            bits: vec![0; cap.div_ceil(64) as usize],
            count: vec![0; members],
            lines: HashMap::new(),
            copies: HashMap::new(),
            named: HashMap::new(),
            single: HashSet::new(),
            single_count: vec![0; members],
            unsure: false,
            batch_left: None,
        }
    }

    /// Whether a copy record on another member than `p`'s covers dirty line `p` (holds the
    /// same line's every dirty sector and names `p`).
    fn covered(&self, pool: &Pool, p: u32) -> bool {
        let Some(&(key, want)) = self.lines.get(&p) else {
            return true;
        };
        let d = pool.member_of(p as u64);
        self.named.get(&p).is_some_and(|cs| {
            cs.iter().any(|c| {
                self.copies.get(c).is_some_and(|&(k, q, m)| {
                    k == key && q == p && m & want == want && pool.member_of(*c as u64) != d
                })
            })
        })
    }

    /// Re-decides whether dirty line `p` is single-copy.
    fn refresh(&mut self, pool: &Pool, p: u32) {
        if p as u64 >= pool.capacity() {
            return; // a copy record naming no slot of the pool: names nothing
        }
        let single = self.lines.contains_key(&p) && !self.covered(pool, p);
        let d = pool.member_of(p as u64);
        if single && self.single.insert(p) {
            self.single_count[d] += 1;
        } else if !single && self.single.remove(&p) {
            self.single_count[d] -= 1;
        }
    }

    /// Slot `slot`'s newest record is `rec` (`None`: only part of it was written: taken as
    /// a dirty line with no copy). Returns the lines whose status may have changed, and
    /// pushes to `lost_cover` (line, key, sectors, `slot`) when this record was a copy
    /// covering that line's dirty sectors (see [`DirtyTrack::relinked`]).
    fn set_record(
        &mut self,
        pool: &Pool,
        slot: u32,
        rec: Option<Record>,
        lost_cover: &mut Vec<(u32, u64, u64, u32)>,
    ) -> [Option<u32>; 3] {
        let mut touched = [None; 3];
        if self.lines.remove(&slot).is_some() {
            touched[0] = Some(slot);
        }
        if let Some((k, p, m)) = self.copies.remove(&slot) {
            if let Some(v) = self.named.get_mut(&p) {
                v.retain(|&c| c != slot);
                if v.is_empty() {
                    self.named.remove(&p);
                }
            }
            if let Some(&(lk, lm)) = self.lines.get(&p) {
                if lk == k
                    && m & lm == lm
                    && pool.member_of(p as u64) != pool.member_of(slot as u64)
                {
                    lost_cover.push((p, k, lm, slot));
                }
            }
            touched[1] = Some(p);
        }
        match rec {
            None => {
                self.lines.insert(slot, (EMPTY_KEY, u64::MAX));
                touched[0] = Some(slot);
            }
            Some(r) if r.key == EMPTY_KEY || r.dirty == 0 => {}
            Some(r) if r.is_copy() => {
                let p = r.copy_of_slot().expect("a copy names its line's slot");
                self.copies.insert(slot, (r.line_key(), p, r.dirty));
                self.named.entry(p).or_default().push(slot);
                touched[2] = Some(p);
            }
            Some(r) => {
                self.lines.insert(slot, (r.key, r.dirty));
                touched[0] = Some(slot);
            }
        }
        touched
    }

    /// Members holding a dirty line that `lost_cover` (of [`DirtyTrack::set_record`]) says
    /// lost the copy record covering its sectors while it stays dirty (same key), the copy
    /// slot not covering them again: its copy moved (or went) while it stayed dirty. Until
    /// a sync makes the batch durable, the old copy record may be overwritten on its device
    /// while the new one is not yet durable on another, so the line is single-copy then.
    fn relinked(&self, pool: &Pool, lost_cover: &[(u32, u64, u64, u32)]) -> Vec<usize> {
        let mut out = Vec::new();
        for &(p, k, lm, c) in lost_cover {
            let still = self.lines.get(&p).is_some_and(|&(lk, _)| lk == k);
            let again = self
                .copies
                .get(&c)
                .is_some_and(|&(ck, q, m)| ck == k && q == p && m & lm == lm);
            let d = pool.member_of(p as u64);
            if still && !again && !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// Forgets every record on member `d` (failed: its lines and copies are gone).
    fn forget_member(&mut self, pool: &Pool, d: usize) {
        let r = pool.range(d);
        let on = |s: &u32| r.contains(&(*s as u64));
        let gone: Vec<u32> = self
            .lines
            .keys()
            .chain(self.copies.keys())
            .copied()
            .filter(on)
            .collect();
        let mut lost = Vec::new();
        for s in gone {
            for p in self
                .set_record(pool, s, Some(Record::EMPTY), &mut lost)
                .into_iter()
                .flatten()
            {
                self.refresh(pool, p);
            }
        }
    }
}

/// How [`PoolDev::open_with`] treats members that are missing, unreadable or empty.
#[derive(Clone, Debug, Default)]
pub struct PoolOpen {
    /// Start without them (degraded) when none may hold dirty lines: they are marked
    /// `Failed` in the present members' pool blocks before the open returns. `false`:
    /// refused (`tiercache check`, which writes nothing).
    pub degraded: bool,
    /// Start without them even when they may hold dirty lines (`--accept-lost-dirty`): what
    /// they held dirty is reported lost ([`PoolDev::lost_at_open`]).
    pub accept_lost_dirty: bool,
    /// The state directory: the pool's generation file there
    /// (`crate::state_file::PoolGen`) records the generation of each member failure, and
    /// the open refuses pool blocks older than it (a stale member started alone). `None`:
    /// not recorded nor checked.
    pub state_dir: Option<std::path::PathBuf>,
}

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut u[..]);
    u
}

/// Whether a pool of `members` devices may keep `dirty_copies` cache copies of each dirty
/// line (`None`: not given: the default, 2 on a pool in write-back, see
/// [`effective_dirty_copies`]), in any mode. `--dirty-copies 1` in write-back on a pool is
/// allowed (the explicit opt-out: a lost member loses its dirty data; the caller warns).
pub fn check_dirty_copies(members: usize, dirty_copies: Option<u8>) -> Result<(), String> {
    match dirty_copies {
        Some(2) if members < 2 => {
            return Err(
                "--dirty-copies 2 (dirty data mirrored on two cache devices) needs a pool of two or more cache devices (--cache repeated)"
                    .into(),
            )
        }
        Some(c) if c != 1 && c != 2 => return Err(format!("--dirty-copies {c}: give 1 or 2")),
        _ => {}
    }
    Ok(())
}

/// The cache copies of each dirty line a pool of `members` devices keeps: the one chosen
/// (`--dirty-copies`, or stored in the pool block), else 2 on a pool in write-back (a lost
/// member then loses no acknowledged write), else 1.
pub fn effective_dirty_copies(members: usize, mode: Mode, chosen: Option<u8>) -> u8 {
    match chosen {
        Some(n) if n != 0 => n,
        _ if members >= 2 && mode == Mode::WriteBack => 2,
        _ => 1,
    }
}

/// The warning `--dirty-copies 1` in write-back on a pool deserves (`None`: none).
pub fn single_copy_warning(members: usize, mode: Mode, copies: u8) -> Option<String> {
    (members >= 2 && mode == Mode::WriteBack && copies == 1).then(|| {
        format!(
            "write-back on a pool of {members} cache devices with --dirty-copies 1: a lost member loses its dirty data (the default, 2, mirrors every dirty line on two members)"
        )
    })
}

impl PoolDev {
    /// Formats `devs` (name, device) as one pool, in that order, and the pool as a cache of
    /// the one-device layout (`crate::volume::format` through the pool). Refuses what pools
    /// do not have yet (data checksums, a capacity below the devices'). `dirty_copies`
    /// `None` stores 2 in write-back (the default) and leaves it unchosen (0) otherwise.
    pub fn format(
        devs: Vec<(String, Box<dyn BlockDev>)>,
        backing_size: u64,
        opts: &FormatOptions,
        dirty_copies: Option<u8>,
    ) -> Result<(PoolDev, Superblock), String> {
        if devs.len() < 2 {
            return Err("a pool needs two or more cache devices".into());
        }
        check_dirty_copies(devs.len(), dirty_copies)?;
        if opts.data_checksums {
            return Err(
                "--data-checksums with several cache devices is not built yet (format the pool without it)"
                    .into(),
            );
        }
        if opts.capacity_lines.is_some() {
            return Err(
                "a cache size with several cache devices is not supported: each device is used whole"
                    .into(),
            );
        }
        Self::check_names(&devs)?;
        let ls = opts.line_size;
        if !ls.is_power_of_two() || !(4096..=1 << 20).contains(&ls) {
            return Err(format!(
                "line size {ls} is not a power of two in 4 KiB..1 MiB"
            ));
        }
        let lines: Vec<u64> = devs
            .iter()
            .map(|(_, d)| Superblock::member_lines_for_device(d.size(), ls))
            .collect();
        let pool = Pool::new(&lines).map_err(|e| {
            let names: Vec<String> = devs
                .iter()
                .zip(&lines)
                .map(|((n, _), l)| format!("{n}: {l} lines"))
                .collect();
            format!("{e} ({})", names.join(", "))
        })?;
        let mut block = PoolBlock {
            pool: random_uuid(),
            generation: 1,
            index: 0,
            dirty_copies: dirty_copies.unwrap_or(if opts.mode == Mode::WriteBack { 2 } else { 0 }),
            members: (0..devs.len())
                .map(|d| PoolEntry {
                    uuid: random_uuid(),
                    lines: pool.lines(d),
                    state: MemberState::Active,
                    may_dirty: false,
                    may_single: false,
                })
                .collect(),
        };
        // Every member's superblock erased and its pool block written (and synced) before
        // `volume::format` writes the records and, last, the superblocks: a format
        // interrupted half way leaves members without magic.
        for (d, (name, dev)) in devs.iter().enumerate() {
            block.index = d as u16;
            let io = |e: io::Error| format!("formatting {name}: {e}");
            dev.write_at(&[0u8; 4096], 0).map_err(io)?;
            dev.write_at(&block.encode(), POOL_BLOCK_AT).map_err(io)?;
            dev.sync().map_err(io)?;
        }
        block.index = 0;
        let pd = PoolDev::assemble(devs, pool, block, ls, vec![0u8; 4096]);
        let sb = crate::volume::format(&pd, backing_size, opts)
            .map_err(|e| format!("formatting the pool: {e}"))?;
        debug_assert_eq!(sb.capacity_lines, pd.pool.capacity());
        Ok((pd, sb))
    }

    fn check_names(devs: &[(String, Box<dyn BlockDev>)]) -> Result<(), String> {
        for (i, (a, _)) in devs.iter().enumerate() {
            if devs[..i].iter().any(|(b, _)| b == a) {
                return Err(format!("cache device {a} is given twice"));
            }
        }
        Ok(())
    }

    fn assemble(
        devs: Vec<(String, Box<dyn BlockDev>)>,
        pool: Pool,
        block: PoolBlock,
        line_size: u64,
        sb: Vec<u8>,
    ) -> PoolDev {
        let cap = pool.capacity();
        let members = devs
            .into_iter()
            .enumerate()
            .map(|(d, (name, dev))| Member {
                dev: std::sync::RwLock::new(dev),
                name: Mutex::new(name),
                data_offset: Superblock::member_data_offset(pool.lines(d), line_size),
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                read_bytes: AtomicU64::new(0),
                written_bytes: AtomicU64::new(0),
            })
            .collect();
        let data_offset = Superblock::data_offset_new(cap, line_size, false);
        let n = block.members.len();
        PoolDev {
            dirty: Mutex::new(DirtyTrack::new(cap, n)),
            failed: block
                .members
                .iter()
                .map(|m| AtomicBool::new(m.state == MemberState::Failed))
                .collect(),
            members,
            block: Mutex::new(block),
            line_size,
            data_offset,
            size: data_offset + cap * line_size,
            meta_end: META_OFFSET + cap.div_ceil(RECORDS_PER_PAGE) * PAGE,
            pool,
            sb: Mutex::new(sb),
            lost_at_open: Vec::new(),
            gen_file: None,
        }
    }

    /// Opens the pool whose members are `devs` (name, device), given in any order. Refused,
    /// naming the device: a member of another pool, one member twice, a missing member, an
    /// unreadable device, a device formatted alone. Writes nothing (see [`PoolDev::open_with`]).
    pub fn open(devs: Vec<(String, Box<dyn BlockDev>)>) -> Result<PoolDev, String> {
        Self::open_with(devs, PoolOpen::default())
    }

    /// [`PoolDev::open`], and with `how.degraded` a member that is missing (not given),
    /// unreadable (its first blocks fail to read) or empty (no pool block nor superblock) is
    /// left out (plan (d)5): when no such member may hold dirty lines (its `may_dirty` flag
    /// in the newest pool block), or `how.accept_lost_dirty`, it is marked `Failed` in the
    /// present members' pool blocks (generation + 1, synced) before this returns, with a
    /// warning naming its index, uuid and path; else refused, naming what would be lost and
    /// the two ways out. A device formatted alone or of another pool is still refused: a
    /// wrong path given is not taken for a lost member.
    pub fn open_with(
        devs: Vec<(String, Box<dyn BlockDev>)>,
        how: PoolOpen,
    ) -> Result<PoolDev, String> {
        if devs.is_empty() {
            return Err("no cache device given".into());
        }
        Self::check_names(&devs)?;
        let mut blocks = Vec::with_capacity(devs.len());
        let mut sbs = Vec::with_capacity(devs.len());
        // Unreadable devices are left out: open goes on only if the pool's newest membership
        // says every member left out has failed (its records are never used again).
        let mut unreadable: Vec<String> = Vec::new();
        // (name, why) of each device left out.
        let mut left_out: Vec<(String, String)> = Vec::new();
        let mut devs = devs;
        // Members whose pool block is torn: (name, device, superblock uuid, superblock, why).
        #[allow(clippy::type_complexity)]
        let mut torn: Vec<(String, Box<dyn BlockDev>, [u8; 16], Vec<u8>, String)> = Vec::new();
        let mut i = 0;
        while i < devs.len() {
            let (name, dev) = &devs[i];
            let mut b = vec![0u8; (POOL_META_OFFSET) as usize];
            if let Err(e) = dev.read_at(&mut b, 0) {
                unreadable.push(format!("cache device {name}: unreadable: {e}"));
                left_out.push((name.clone(), format!("unreadable ({e})")));
                devs.remove(i);
                continue;
            }
            if how.degraded
                && PoolBlock::decode(&b[POOL_BLOCK_AT as usize..]).is_err()
                && matches!(Superblock::decode(&b[..4096]), Err(FormatError::BadMagic))
                && b[POOL_BLOCK_AT as usize..POOL_BLOCK_AT as usize + 8] != POOL_MAGIC[..]
            {
                // No superblock, no pool block: an empty (or wiped) device, taken as missing.
                unreadable.push(format!(
                    "cache device {name}: empty (no superblock, no pool block)"
                ));
                left_out.push((name.clone(), "empty (no superblock, no pool block)".into()));
                devs.remove(i);
                continue;
            }
            if let (Err(why), Ok(sb)) = (
                PoolBlock::decode(&b[POOL_BLOCK_AT as usize..]),
                Superblock::decode_member(&b[..4096]),
            ) {
                if b[POOL_BLOCK_AT as usize..POOL_BLOCK_AT as usize + 8] == POOL_MAGIC[..]
                    && why.contains("checksum")
                {
                    // A pool block torn by a power cut while it was rewritten (members'
                    // blocks are written one at a time, each synced): the member is known
                    // by its superblock's uuid in another member's block (below).
                    let (name, dev) = devs.remove(i);
                    torn.push((name, dev, sb.uuid, b[..4096].to_vec(), why));
                    continue;
                }
            }
            i += 1;
            let block = PoolBlock::decode(&b[POOL_BLOCK_AT as usize..]).map_err(|why| {
                match Superblock::decode(&b[..4096]) {
                    Ok(sb) => format!(
                        "cache device {name} was formatted alone (version {}), not as a member of a pool: format the pool with every --cache device, or serve it alone",
                        sb.version
                    ),
                    Err(_) => format!(
                        "cache device {name} is not a member of a cache pool ({why}): empty or damaged? `tiercache format` with every --cache device makes a pool"
                    ),
                }
            })?;
            blocks.push(block);
            sbs.push(b[..4096].to_vec());
        }
        let refs: Vec<&PoolBlock> = blocks.iter().collect();
        let Some(newest) = PoolBlock::newest(&refs) else {
            if let Some((name, _, _, _, why)) = torn.first() {
                return Err(format!(
                    "cache device {name}: its pool block is damaged ({why}) and no other member's pool block says which member it is: give every member with --cache"
                ));
            }
            return Err(unreadable.join("; "));
        };
        let auth = blocks[newest].clone();
        let pool_hex = uuid_hex(&auth.pool);
        for (name, dev, uuid, sb, why) in torn {
            let Some(d) = auth.members.iter().position(|m| m.uuid == uuid) else {
                return Err(format!(
                    "cache device {name} is not a member of pool {pool_hex} (its pool block is damaged: {why}, and its uuid {} is not among the pool's members): wrong device?",
                    uuid_hex(&uuid)
                ));
            };
            let mine = PoolBlock {
                index: d as u16,
                ..auth.clone()
            };
            tracing::warn!(
                "cache device {name} (pool member {d}): its pool block is damaged ({why}), a write of it cut by a crash; taken from the newest pool block of the others (generation {})",
                auth.generation
            );
            if how.degraded {
                // Repaired before serving (`check`, which writes nothing, only reads it so).
                dev.write_at(&mine.encode(), POOL_BLOCK_AT)
                    .and_then(|()| dev.sync())
                    .map_err(|e| {
                        format!(
                            "cache device {name} (pool member {d}): rewriting its pool block: {e}"
                        )
                    })?;
            }
            blocks.push(mine);
            sbs.push(sb);
            devs.push((name, dev));
        }
        for (i, b) in blocks.iter().enumerate() {
            let name = &devs[i].0;
            if b.pool != auth.pool {
                return Err(format!(
                    "cache device {name} belongs to pool {}, not {pool_hex} (that of {}): wrong device?",
                    uuid_hex(&b.pool),
                    devs[newest].0
                ));
            }
            if let Some(j) = (0..i).find(|&j| blocks[j].index == b.index) {
                return Err(format!(
                    "cache devices {} and {name} are both member {} of pool {pool_hex}: the same device given twice?",
                    devs[j].0, b.index
                ));
            }
            let want = auth.members.get(b.index as usize);
            if b.members.len() != auth.members.len()
                || want.map(|m| m.uuid) != Some(b.members[b.index as usize].uuid)
            {
                return Err(format!(
                    "cache device {name} says it is member {} of pool {pool_hex}, but the pool's newest membership (generation {}, on {}) lists another device there: replaced or stale member",
                    b.index, auth.generation, devs[newest].0
                ));
            }
        }
        let gen_file = how
            .state_dir
            .as_ref()
            .map(|d| crate::state_file::pool_gen_path(d, &auth.pool));
        if let Some(f) = &gen_file {
            if let Some(g) = crate::state_file::read_pool_gen(f).map_err(|e| e.to_string())? {
                if g.pool == auth.pool && g.generation > auth.generation {
                    return Err(format!(
                        "pool {pool_hex}: the newest pool block of the devices given ({}) is generation {}, but member {} (uuid {}) was recorded failed at generation {} (in {}): the devices given are stale members, started without the members that recorded that failure; give those too",
                        devs.iter().map(|d| d.0.as_str()).collect::<Vec<_>>().join(", "),
                        auth.generation,
                        g.member,
                        uuid_hex(&g.member_uuid),
                        g.generation,
                        f.display()
                    ));
                }
            }
        }
        let failed = |d: usize| auth.members[d].state == MemberState::Failed;
        let absent: Vec<usize> = (0..auth.members.len())
            .filter(|d| !blocks.iter().any(|b| b.index as usize == *d))
            .collect();
        if absent.iter().any(|&d| !failed(d)) && !how.degraded {
            let missing: Vec<String> = absent
                .iter()
                .copied()
                .filter(|&d| !failed(d))
                .map(|d| {
                    format!(
                        "member {d} (uuid {}, {} lines)",
                        uuid_hex(&auth.members[d].uuid),
                        auth.members[d].lines
                    )
                })
                .collect();
            return Err(format!(
                "pool {pool_hex} has {} cache devices, {} given ({}): {} missing; give every member with --cache (`serve` starts without it when nothing would be lost)",
                auth.members.len(),
                devs.len(),
                devs.iter().map(|d| d.0.as_str()).collect::<Vec<_>>().join(", "),
                missing.join(", ")
            ) + &if unreadable.is_empty() {
                String::new()
            } else {
                format!(" ({})", unreadable.join("; "))
            });
        }
        for &d in absent.iter().filter(|&&d| failed(d)) {
            tracing::warn!(
                "pool {pool_hex}: member {d} (uuid {}) failed earlier (generation {}) and is not here: serving from the other members",
                uuid_hex(&auth.members[d].uuid),
                auth.generation
            );
        }
        for (i, b) in blocks.iter().enumerate() {
            let d = b.index as usize;
            if failed(d) {
                tracing::warn!(
                    "cache device {} (pool member {d}) is marked failed in the pool's newest membership (generation {}): its records are ignored and it is not used",
                    devs[i].0,
                    auth.generation
                );
            }
        }
        for e in &unreadable {
            tracing::warn!("{e}: left out of the pool (a failed member)");
        }
        // Members missing now, not failed before: left out below (degraded) once the
        // superblock says what they may have held.
        let lost_members: Vec<usize> = absent.iter().copied().filter(|&d| !failed(d)).collect();
        // An absent member stands as a device nothing reaches, named by the path it was
        // given by when that is known (one left out, one missing).
        for &d in &absent {
            blocks.push(PoolBlock {
                index: d as u16,
                ..auth.clone()
            });
            sbs.push(vec![0u8; 4096]);
            let name = match (&left_out[..], &lost_members[..]) {
                ([(n, _)], [x]) if *x == d => n.clone(),
                _ => format!("(missing member {d})"),
            };
            devs.push((name, Box::new(Absent)));
        }
        let failed = |d: usize| failed(d) || lost_members.contains(&d);
        // Members in index order.
        let mut order: Vec<usize> = (0..devs.len()).collect();
        order.sort_by_key(|&i| blocks[i].index);
        let mut slots: Vec<Option<(String, Box<dyn BlockDev>)>> =
            devs.into_iter().map(Some).collect();
        let devs: Vec<(String, Box<dyn BlockDev>)> =
            order.iter().map(|&i| slots[i].take().unwrap()).collect();
        let sbs: Vec<Vec<u8>> = order.iter().map(|&i| sbs[i].clone()).collect();
        let lines: Vec<u64> = auth.members.iter().map(|m| m.lines).collect();
        let pool = Pool::new(&lines).map_err(|e| format!("pool {pool_hex}: {e}"))?;
        if (0..pool.members()).any(|d| pool.lines(d) != lines[d]) {
            return Err(format!(
                "pool {pool_hex}: member sizes {lines:?} are not whole record pages: damaged pool block"
            ));
        }
        // The superblocks: all members' must decode (one erased: the pool's is erased, as
        // `fail_cache` or an interrupted format leaves it), the newest generation wins.
        let mut decoded = Vec::with_capacity(sbs.len());
        let mut erased = false;
        let mut live_sb = Vec::with_capacity(sbs.len());
        for (d, b) in sbs.iter().enumerate() {
            if failed(d) {
                continue; // never read again: not checked
            }
            live_sb.push(d);
            match Superblock::decode_member(b) {
                Ok(sb) => decoded.push(sb),
                Err(FormatError::BadMagic) => erased = true,
                Err(e) => return Err(format!("cache device {} (member {d}): {e}", devs[d].0)),
            }
        }
        let vsb = if erased {
            vec![0u8; 4096]
        } else {
            let ls = decoded[0].line_size;
            for (&d, sb) in live_sb.iter().zip(&decoded) {
                let want_off = Superblock::member_data_offset(lines[d], sb.line_size);
                if sb.line_size != ls
                    || sb.capacity_lines != lines[d]
                    || sb.data_offset != want_off
                    || sb.uuid != auth.members[d].uuid
                {
                    return Err(format!(
                        "cache device {} (member {d}): superblock ({} lines of {} bytes at {}, uuid {}) does not match pool {pool_hex} ({} lines of {ls} bytes at {want_off}, uuid {})",
                        devs[d].0,
                        sb.capacity_lines,
                        sb.line_size,
                        sb.data_offset,
                        uuid_hex(&sb.uuid),
                        lines[d],
                        uuid_hex(&auth.members[d].uuid)
                    ));
                }
                let size = devs[d].1.size();
                if size < want_off + lines[d] * ls {
                    return Err(format!(
                        "cache device {} (member {d}) has {size} bytes, too few for its {} lines of {ls} bytes: truncated?",
                        devs[d].0, lines[d]
                    ));
                }
            }
            let best = (0..decoded.len())
                .reduce(|a, i| {
                    if decoded[i].generation > decoded[a].generation {
                        i
                    } else {
                        a
                    }
                })
                .unwrap();
            let mut v = decoded[best].clone();
            v.uuid = auth.pool;
            v.capacity_lines = pool.capacity();
            v.data_offset = Superblock::data_offset_new(pool.capacity(), ls, false);
            v.version = v.current_version();
            v.encode()
        };
        let ls = decoded.first().map_or(4096, |s| s.line_size);
        let mut auth = auth;
        auth.index = 0;
        let mut lost = Vec::new();
        if !lost_members.is_empty() {
            let why = |d: usize| match (&left_out[..], &lost_members[..]) {
                ([(_, w)], [x]) if *x == d => w.as_str(),
                _ => "missing",
            };
            let who = |d: usize| {
                format!(
                    "cache device {} (pool member {d}, uuid {}) is {}",
                    devs[d].0,
                    uuid_hex(&auth.members[d].uuid),
                    why(d)
                )
            };
            let whos: Vec<String> = lost_members.iter().map(|&d| who(d)).collect();
            let dirty: Vec<usize> = (0..lost_members.len())
                .filter(|&i| auth.members[lost_members[i]].may_dirty)
                .collect();
            // Dirty but mirrored (plan (d)5): every dirty line on it has a copy record on
            // another member (its `may_single` flag is clear, see `update_dirty_flags`), so
            // the open promotes those copies (`CacheVolume::restore_copies`). With two or
            // more members left out a line's copy may be on another of them: refused then.
            let mirrored = |i: usize| {
                let m = &auth.members[lost_members[i]];
                lost_members.len() == 1 && auth.dirty_copies >= 2 && m.may_dirty && !m.may_single
            };
            let (mirrored, dirty): (Vec<usize>, Vec<usize>) =
                dirty.into_iter().partition(|&i| mirrored(i));
            for &i in &mirrored {
                tracing::warn!(
                    "pool {pool_hex}: {}; it holds dirty lines, each mirrored on another member: they are served from their copies (the open reports them as copies promoted), and re-mirrored once two members are live again",
                    whos[i]
                );
            }
            if !dirty.is_empty() && !erased {
                lost = whole_volumes(&vsb);
                let text = lost
                    .iter()
                    .map(|&(a, b)| {
                        crate::volume_set::range_text(volume_name(&vsb, a).as_deref(), a, b)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let what = format!(
                    "pool {pool_hex}: {}; it may hold dirty lines (acknowledged writes not yet written back, with no copy on another device: --dirty-copies {}), and which lines is recorded only on it, so any of these may be lost: {text}",
                    dirty.iter().map(|&i| whos[i].as_str()).collect::<Vec<_>>().join("; "),
                    auth.dirty_copies.max(1)
                );
                if !how.accept_lost_dirty {
                    return Err(format!(
                        "{what}. Refusing to start. Either bring the device back (give it with --cache), or start with --accept-lost-dirty: those ranges go to the lost list, and reads of them fail with EIO until they are written again"
                    ));
                }
                tracing::error!("{what}: --accept-lost-dirty given: they are recorded lost (reads of them fail with EIO until written again)");
            }
            for &d in &lost_members {
                auth.members[d].state = MemberState::Failed;
            }
            // The survivors' dirty lines whose copies were on a member left out have one
            // copy now: flagged until a sync after the open found none (the open reads every
            // record, `note_records`).
            let any_dirty_lost = lost_members.iter().any(|&d| auth.members[d].may_dirty);
            for m in auth.members.iter_mut() {
                if m.state == MemberState::Active && (m.may_dirty || any_dirty_lost) {
                    m.may_single = true;
                }
            }
            auth.generation += 1;
            for (d, (name, dev)) in devs.iter().enumerate() {
                if auth.members[d].state == MemberState::Failed {
                    continue;
                }
                let mut mine = auth.clone();
                mine.index = d as u16;
                dev.write_at(&mine.encode(), POOL_BLOCK_AT)
                    .and_then(|()| dev.sync())
                    .map_err(|e| {
                        format!(
                            "cache device {name} (pool member {d}): recording the members left out in its pool block: {e}"
                        )
                    })?;
            }
            if let Some(f) = &gen_file {
                let d = lost_members[0];
                let g = crate::state_file::PoolGen {
                    pool: auth.pool,
                    generation: auth.generation,
                    member: d as u16,
                    member_uuid: auth.members[d].uuid,
                };
                crate::state_file::write_pool_gen(f, &g).map_err(|e| e.to_string())?;
            }
            for w in &whos {
                tracing::warn!(
                    "{w}: starting degraded without it; marked failed in the other members' pool blocks (generation {}); its lines are not served",
                    auth.generation
                );
            }
            auth.index = 0;
        }
        let mut pd = PoolDev::assemble(devs, pool, auth, ls, vsb);
        pd.lost_at_open = lost;
        pd.gen_file = gen_file;
        Ok(pd)
    }

    /// Volume byte ranges recorded lost by the open ([`PoolOpen::accept_lost_dirty`]): the
    /// volume opening on this pool adds them to its lost-range list.
    pub fn lost_at_open(&self) -> Vec<(u64, u64)> {
        self.lost_at_open.clone()
    }

    /// The pool's slot ranges.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The pool's uuid (the virtual superblock's uuid: the state file's key).
    pub fn pool_uuid(&self) -> [u8; 16] {
        self.block.lock().unwrap().pool
    }

    /// Cache copies of each dirty line chosen at format or at a serve (`--dirty-copies`;
    /// `None`: not chosen yet, see [`effective_dirty_copies`]).
    pub fn dirty_copies(&self) -> Option<u8> {
        let b = self.block.lock().unwrap();
        (b.dirty_copies != 0).then_some(b.dirty_copies)
    }

    /// Chooses `n` cache copies of each dirty line for good: stored in every live member's
    /// pool block (generation + 1, written and synced) unless the block holds `n` already.
    /// Refused, naming both, when the block holds another value (records written under it,
    /// e.g. copies, would be misread).
    pub fn choose_dirty_copies(&self, n: u8) -> Result<(), String> {
        let mut b = self.block.lock().unwrap();
        if b.dirty_copies == n {
            return Ok(());
        }
        if b.dirty_copies != 0 {
            return Err(format!(
                "--dirty-copies {n} differs from this pool's {} (chosen before, stored in its pool blocks): serve it with --dirty-copies {} (changing it is not built yet)",
                b.dirty_copies, b.dirty_copies
            ));
        }
        b.dirty_copies = n;
        b.generation += 1;
        self.write_pool_blocks(&b).map_err(|(x, e)| {
            format!(
                "storing --dirty-copies {n} on {}: {e}",
                self.members[x].name()
            )
        })
    }

    /// Writes `b` as every live member's pool block (each with its own index) and syncs it,
    /// member by member. Err: the first member that failed, and why (later ones untouched).
    fn write_pool_blocks(&self, b: &PoolBlock) -> Result<(), (usize, io::Error)> {
        for (x, m) in self.live() {
            let mut mine = b.clone();
            mine.index = x as u16;
            m.dev()
                .write_at(&mine.encode(), POOL_BLOCK_AT)
                .and_then(|()| m.dev().sync())
                .map_err(|e| (x, e))?;
        }
        Ok(())
    }

    /// The members' names in index order.
    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name()).collect()
    }

    /// A member's error goes up typed ([`MemberError`], same kind): the volume counts
    /// errors per member and fails that member alone at its threshold.
    fn member_err(&self, d: usize, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            MemberError {
                member: d,
                name: self.members[d].name(),
                err: e,
            },
        )
    }

    /// Whether member `d` has failed (see [`PoolDev::fail_member`]).
    pub fn member_failed(&self, d: usize) -> bool {
        self.failed[d].load(Ordering::Acquire)
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.members
            .iter()
            .enumerate()
            .filter(|(d, _)| !self.member_failed(*d))
    }

    /// Member `d` failed: from now on nothing reaches it, and the surviving members' pool
    /// blocks say so (generation + 1, written and synced on every live member) before this
    /// returns, so a restart never restores its records (stale once the pool served on
    /// without it) even if it answers again. Err: the failure could not be recorded on
    /// every survivor (the caller must not go on as if it were durable). Refused for the
    /// last live member (that is the whole cache failing).
    fn fail_member_now(&self, d: usize) -> io::Result<()> {
        if d >= self.members.len() {
            return Err(err(format!(
                "pool of cache devices: no member {d} (the pool has {})",
                self.members.len()
            )));
        }
        if self.live().all(|(x, _)| x == d) {
            return Err(err(format!(
                "pool of cache devices: member {d} is the last live one (fail the whole cache instead)"
            )));
        }
        self.failed[d].store(true, Ordering::Release);
        let mut tr = self.dirty.lock().unwrap();
        // Its lines and copies are gone: the lines whose copies it held are single-copy now,
        // and their members say so in the same pool blocks that record the failure.
        tr.forget_member(&self.pool, d);
        let mut b = self.block.lock().unwrap();
        if b.members[d].state != MemberState::Failed {
            b.members[d].state = MemberState::Failed;
            b.generation += 1;
        }
        for x in 0..b.members.len() {
            if x != d && tr.single_count[x] > 0 && !b.members[x].may_single {
                b.members[x].may_single = true;
                b.generation += 1;
            }
        }
        drop(tr);
        tracing::error!(
            "cache device {} (pool member {d}) failed: no longer used; recording it in the other members' pool blocks (generation {})",
            self.members[d].name(),
            b.generation
        );
        self.write_pool_blocks(&b)
            .map_err(|(x, e)| self.member_err(x, e))?;
        if let Some(f) = &self.gen_file {
            let g = crate::state_file::PoolGen {
                pool: b.pool,
                generation: b.generation,
                member: d as u16,
                member_uuid: b.members[d].uuid,
            };
            crate::state_file::write_pool_gen(f, &g)?;
        }
        Ok(())
    }

    /// Replaces failed member `d` by `dev` (named `name`; plan (d)6, `ctl cache replace`).
    /// Refused, naming them, unless `d` has failed, `name` is not a live member's and `dev`
    /// is not a live member of this pool by its pool block, and `dev` holds member `d`'s
    /// lines. `dev` is formatted as member `d` with a new member uuid: superblock erased,
    /// its record area written empty, the lost-range list copied from a live member, its
    /// pool block and superblock (those of the others) written and synced; only then does
    /// it take member `d`'s place, and every live member's pool block (itself included)
    /// says `Active` (generation + 1, synced), then the pool generation file. Its slots are
    /// empty: the volume revives them in the engine (`Engine::revive_device`) after this.
    pub fn replace_member(
        &self,
        d: usize,
        name: String,
        dev: Box<dyn BlockDev>,
    ) -> Result<(), String> {
        let n = self.members.len();
        if d >= n {
            return Err(format!(
                "replace cache member {d}: the pool has {n} members (0..{})",
                n - 1
            ));
        }
        let old = self.members[d].name();
        if !self.member_failed(d) {
            return Err(format!(
                "replace cache member {d} ({old}): it is active, not failed (only a failed member is replaced)"
            ));
        }
        if let Some((x, _)) = self.live().find(|(_, m)| m.name() == name) {
            return Err(format!(
                "replace cache member {d} by {name}: {name} is member {x} of this pool"
            ));
        }
        let mut head = vec![0u8; POOL_META_OFFSET as usize];
        if dev.read_at(&mut head, 0).is_ok() {
            if let Ok(b) = PoolBlock::decode(&head[POOL_BLOCK_AT as usize..]) {
                let cur = self.block.lock().unwrap();
                let x = b.index as usize;
                if b.pool == cur.pool
                    && x < n
                    && !self.member_failed(x)
                    && cur.members[x].uuid == b.members.get(x).map_or([0; 16], |m| m.uuid)
                {
                    return Err(format!(
                        "replace cache member {d} by {name}: {name} is member {x} of this pool ({})",
                        self.members[x].name()
                    ));
                }
            }
        }
        let ls = self.line_size;
        let need = self.pool.lines(d);
        let has = Superblock::member_lines_for_device(dev.size(), ls);
        if has < need {
            return Err(format!(
                "replace cache member {d} by {name}: {name} holds {has} lines of {ls} bytes ({} bytes), member {d} needs {need}",
                dev.size()
            ));
        }
        let io = |e: io::Error| format!("replace cache member {d}: formatting {name}: {e}");
        let data_offset = self.members[d].data_offset;
        // Nothing on it is taken for a member while it is formatted.
        dev.write_at(&[0u8; 4096], 0).map_err(io)?;
        for p in 0..need.div_ceil(RECORDS_PER_PAGE) {
            dev.write_at(empty_page(), POOL_META_OFFSET + p * PAGE)
                .map_err(io)?;
        }
        let lost_at = data_offset - crate::lost_list::BYTES;
        let mut lost = vec![0u8; crate::lost_list::BYTES as usize];
        {
            let (x, m) = self
                .live()
                .next()
                .ok_or_else(|| format!("replace cache member {d}: no live member"))?;
            let at = m.data_offset - crate::lost_list::BYTES;
            m.dev().read_at(&mut lost, at).map_err(|e| {
                format!(
                    "replace cache member {d}: reading the lost-range list of member {x} ({}): {e}",
                    m.name()
                )
            })?;
        }
        dev.write_at(&lost, lost_at).map_err(io)?;
        let mut b = self.block.lock().unwrap().clone();
        b.generation += 1;
        b.members[d] = PoolEntry {
            uuid: random_uuid(),
            lines: need,
            state: MemberState::Active,
            may_dirty: false,
            may_single: false,
        };
        let mut mine = b.clone();
        mine.index = d as u16;
        dev.write_at(&mine.encode(), POOL_BLOCK_AT).map_err(io)?;
        let vsb = self.sb.lock().unwrap().clone();
        if let Ok(v) = Superblock::decode(&vsb) {
            let mut s = v;
            s.version = VERSION_POOL;
            s.uuid = b.members[d].uuid;
            s.capacity_lines = need;
            s.data_offset = data_offset;
            dev.write_at(&s.encode(), 0).map_err(io)?;
        }
        dev.sync().map_err(io)?;
        // In place while nothing reaches member `d` (failed): then it is live.
        *self.members[d]
            .dev
            .write()
            .unwrap_or_else(|e| e.into_inner()) = dev;
        *self.members[d]
            .name
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = name.clone();
        {
            // Its record area is empty: no dirty record on it.
            let mut tr = self.dirty.lock().unwrap();
            for s in self.pool.range(d) {
                let (w, bit) = ((s / 64) as usize, 1u64 << (s % 64));
                tr.bits[w] &= !bit;
            }
            tr.count[d] = 0;
            tr.forget_member(&self.pool, d);
        }
        let mut cur = self.block.lock().unwrap();
        self.failed[d].store(false, Ordering::Release);
        b.index = 0;
        // The flags of the others as now (a sync may have changed them meanwhile).
        for (x, e) in cur.members.iter().enumerate() {
            if x != d {
                b.members[x].may_dirty = e.may_dirty;
                b.members[x].may_single = e.may_single;
            }
        }
        b.generation = b.generation.max(cur.generation + 1);
        self.write_pool_blocks(&b).map_err(|(x, e)| {
            // Not live then: nothing reaches it (its blocks that say `Active` name the new,
            // empty device: a restart may use it, holding no line).
            self.failed[d].store(true, Ordering::Release);
            format!(
                "replace cache member {d}: writing the pool block of member {x} ({}): {e}",
                self.members[x].name()
            )
        })?;
        *cur = b.clone();
        if let Some(f) = &self.gen_file {
            let g = crate::state_file::PoolGen {
                pool: b.pool,
                generation: b.generation,
                member: d as u16,
                member_uuid: b.members[d].uuid,
            };
            crate::state_file::write_pool_gen(f, &g).map_err(|e| {
                format!(
                    "replace cache member {d}: the pool generation file {}: {e}",
                    f.display()
                )
            })?;
        }
        tracing::warn!(
            "cache device {name} replaces failed pool member {d} ({old}): formatted as member {d} (uuid {}, {need} lines), pool generation {}",
            uuid_hex(&b.members[d].uuid),
            b.generation
        );
        Ok(())
    }

    /// Notes the records of virtual record-area bytes `data` at `offset` (read from or
    /// about to be written to the members): which slots' records are dirty, and which are
    /// copies of which lines. A record only partly given counts as a dirty line with no
    /// copy when `partial_dirty` (a write: never cleared wrongly), else is left as it was.
    /// Pushes to `lost_cover` what [`DirtyTrack::set_record`] does.
    fn note_records(
        &self,
        tr: &mut DirtyTrack,
        data: &[u8],
        offset: u64,
        partial_dirty: bool,
        lost_cover: &mut Vec<(u32, u64, u64, u32)>,
    ) {
        let (len, cap) = (data.len() as u64, self.pool.capacity());
        let first = (offset - META_OFFSET) / RECORD_BYTES;
        let end = (offset + len - META_OFFSET).div_ceil(RECORD_BYTES).min(cap);
        for slot in first..end {
            let a = META_OFFSET + slot * RECORD_BYTES;
            let (dirty, rec) = if a >= offset && a + RECORD_BYTES <= offset + len {
                let at = (a - offset) as usize;
                let r = Record::decode(&data[at..at + RECORD_BYTES as usize]);
                (
                    r.is_some_and(|r| r.key != EMPTY_KEY && r.dirty != 0),
                    Some(r.unwrap_or(Record::EMPTY)),
                )
            } else if partial_dirty {
                (true, None)
            } else {
                continue;
            };
            // A failed member's records are never read again (they read as empty).
            let (dirty, rec) = if self.member_failed(self.pool.member_of(slot)) {
                (false, Some(Record::EMPTY))
            } else {
                (dirty, rec)
            };
            for p in tr
                .set_record(&self.pool, slot as u32, rec, lost_cover)
                .into_iter()
                .flatten()
            {
                tr.refresh(&self.pool, p);
            }
            let (w, bit) = ((slot / 64) as usize, 1u64 << (slot % 64));
            if (tr.bits[w] & bit != 0) != dirty {
                let d = self.pool.locate(slot).0;
                if dirty {
                    tr.bits[w] |= bit;
                    tr.count[d] += 1;
                } else {
                    tr.bits[w] &= !bit;
                    tr.count[d] -= 1;
                }
            }
        }
    }

    /// Makes every live member's `may_dirty` flag say whether it holds a dirty record, and
    /// its `may_single` flag whether it holds a single-copy dirty line or is in `relinked`
    /// (`raise_only`: only flags to set, before records are written); when one changes,
    /// the pool blocks are rewritten (generation + 1, synced). A flag is set before the
    /// first such record reaches its member and cleared only by a sync after every record
    /// on it was written without one, so a member whose `may_dirty` flag is clear in the
    /// newest pool block holds no acknowledged data the backing device lacks, and one whose
    /// `may_single` flag is clear none that a copy record on another member lacks.
    fn update_dirty_flags(
        &self,
        tr: &DirtyTrack,
        raise_only: bool,
        relinked: &[usize],
    ) -> io::Result<()> {
        let mut b = self.block.lock().unwrap();
        let mut nb = b.clone();
        let mut changed = false;
        let unsure = tr.unsure;
        for (d, _) in self.live() {
            let want = tr.count[d] > 0;
            if nb.members[d].may_dirty != want && (want || !raise_only) {
                nb.members[d].may_dirty = want;
                changed = true;
            }
            let single = tr.single_count[d] > 0 || relinked.contains(&d);
            if nb.members[d].may_single != single && (single || !(raise_only || unsure)) {
                nb.members[d].may_single = single;
                changed = true;
            }
            // Relied on by the open (plan (d)5): a single-copy dirty line is a dirty line.
            debug_assert!(
                !single || tr.single_count[d] == 0 || want,
                "member {d}: single-copy dirty lines but no dirty record"
            );
        }
        if !changed {
            return Ok(());
        }
        // The generation moves on even if a write fails (a block of it may be on a member).
        b.generation += 1;
        nb.generation = b.generation;
        self.write_pool_blocks(&nb)
            .map_err(|(x, e)| self.member_err(x, e))?;
        *b = nb;
        Ok(())
    }

    /// The pieces of virtual bytes `[off, off + len)` inside one region: (member, member
    /// offset, offset in the request, length); `None`: the lost-range list (replicated).
    fn pieces(&self, off: u64, len: u64) -> io::Result<Vec<(usize, u64, u64, u64)>> {
        let end = off + len;
        let mut out: Vec<(usize, u64, u64, u64)> = Vec::new();
        let mut push = |d: usize, moff: u64, at: u64, n: u64| {
            if let Some(last) = out.last_mut() {
                if last.0 == d && last.1 + last.3 == moff && last.2 + last.3 == at {
                    last.3 += n;
                    return;
                }
            }
            out.push((d, moff, at, n));
        };
        if off >= META_OFFSET && end <= self.meta_end {
            let mut v = off;
            while v < end {
                let page = (v - META_OFFSET) / PAGE;
                let n = (META_OFFSET + (page + 1) * PAGE).min(end) - v;
                let (d, local) = self.pool.locate(page * RECORDS_PER_PAGE);
                let moff =
                    POOL_META_OFFSET + local / RECORDS_PER_PAGE * PAGE + (v - META_OFFSET) % PAGE;
                push(d, moff, v - off, n);
                v += n;
            }
            return Ok(out);
        }
        if off >= self.data_offset && end <= self.size {
            let ls = self.line_size;
            let mut v = off;
            while v < end {
                let slot = (v - self.data_offset) / ls;
                let (d, local) = self.pool.locate(slot);
                let member_end = self.data_offset + self.pool.range(d).end * ls;
                let n = member_end.min(end) - v;
                let moff = self.members[d].data_offset + local * ls + (v - self.data_offset) % ls;
                push(d, moff, v - off, n);
                v += n;
            }
            return Ok(out);
        }
        Err(err(format!(
            "pool of cache devices: bytes {off}..{end} cross a region of the layout (records end at {}, data at {})",
            self.meta_end, self.data_offset
        )))
    }

    /// [`BlockDev::prepare_records`]; `batch`: the writes that follow are that batch (not
    /// one `write_at` raising for itself).
    fn raise_for(&self, writes: &[(u64, &[u8])], batch: bool) -> io::Result<()> {
        let mut tr = self.dirty.lock().unwrap();
        let mut lost_cover = Vec::new();
        for &(o, d) in writes {
            let d = &d[..d.len().min(self.meta_end.saturating_sub(o) as usize)];
            if o >= 4096 && o < self.meta_end && !d.is_empty() {
                self.note_records(&mut tr, d, o, true, &mut lost_cover);
            }
        }
        let relinked = tr.relinked(&self.pool, &lost_cover);
        let r = self.update_dirty_flags(&tr, true, &relinked);
        if batch {
            tr.batch_left = r.is_ok().then_some(writes.len());
        }
        r
    }

    /// [`BlockDev::write_at`] once the records written were noted
    /// ([`BlockDev::write_batch`]).
    fn write_unnoted(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let len = data.len() as u64;
        if offset >= self.size || len == 0 {
            return Ok(());
        }
        let end = offset + len;
        if end > self.size {
            return self.write_unnoted(&data[..(self.size - offset) as usize], offset);
        }
        if offset < 4096 {
            if offset != 0 || len != 4096 {
                return Err(err(format!(
                    "pool of cache devices: superblock writes are whole (bytes {offset}..{end} given)"
                )));
            }
            return self.write_superblock(data);
        }
        let lost = self.lost_list_at();
        if offset >= lost && end <= self.data_offset {
            for (d, m) in self.live() {
                let at = m.data_offset - crate::lost_list::BYTES + (offset - lost);
                m.write_at(data, at).map_err(|e| self.member_err(d, e))?;
            }
            return Ok(());
        }
        for (d, moff, at, n) in self.pieces(offset, len)? {
            if self.member_failed(d) {
                continue; // nothing of it is read again (see `fail_member_now`)
            }
            self.members[d]
                .write_at(&data[at as usize..(at + n) as usize], moff)
                .map_err(|e| self.member_err(d, e))?;
        }
        Ok(())
    }

    fn lost_list_at(&self) -> u64 {
        self.data_offset - crate::lost_list::BYTES
    }

    fn write_superblock(&self, data: &[u8]) -> io::Result<()> {
        if data.iter().all(|&b| b == 0) {
            for (d, m) in self.live() {
                m.write_at(data, 0).map_err(|e| self.member_err(d, e))?;
            }
        } else {
            let v = Superblock::decode(data)
                .map_err(|e| err(format!("pool of cache devices: superblock written: {e}")))?;
            assert_eq!(
                v.capacity_lines,
                self.pool.capacity(),
                "a superblock of another capacity written to the pool"
            );
            for (d, m) in self.live() {
                let mut s = v.clone();
                s.version = VERSION_POOL;
                s.uuid = self.block.lock().unwrap().members[d].uuid;
                s.capacity_lines = self.pool.lines(d);
                s.data_offset = m.data_offset;
                m.write_at(&s.encode(), 0)
                    .map_err(|e| self.member_err(d, e))?;
            }
        }
        *self.sb.lock().unwrap() = data.to_vec();
        Ok(())
    }
}

impl BlockDev for PoolDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn pool_lines(&self) -> Vec<u64> {
        (0..self.pool.members())
            .map(|d| self.pool.lines(d))
            .collect()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        if offset >= self.size || len == 0 {
            buf.fill(0);
            return Ok(());
        }
        let end = offset + len;
        if end > self.size {
            let keep = (self.size - offset) as usize;
            buf[keep..].fill(0);
            return self.read_at(&mut buf[..keep], offset);
        }
        if end <= 4096 {
            let sb = self.sb.lock().unwrap();
            buf.copy_from_slice(&sb[offset as usize..end as usize]);
            return Ok(());
        }
        let lost = self.lost_list_at();
        if offset >= lost && end <= self.data_offset {
            // The first live member: every write reaches it first.
            let (d, m) = self.live().next().expect("a pool keeps a live member");
            let at = m.data_offset - crate::lost_list::BYTES + (offset - lost);
            return m.read_at(buf, at).map_err(|e| self.member_err(d, e));
        }
        if offset >= self.meta_end && end <= lost {
            buf.fill(0); // alignment padding: nothing is kept there
            return Ok(());
        }
        let records = offset < self.meta_end;
        for (d, moff, at, n) in self.pieces(offset, len)? {
            let piece = &mut buf[at as usize..(at + n) as usize];
            if self.member_failed(d) {
                if records {
                    // A failed member's records are never restored (stale: see
                    // `fail_member_now`): its pages read as empty records.
                    // (Pieces of consecutive pages on one member are merged.)
                    let mut o = ((offset + at - META_OFFSET) % PAGE) as usize;
                    let mut rest = &mut piece[..];
                    while !rest.is_empty() {
                        let k = rest.len().min(PAGE as usize - o);
                        rest[..k].copy_from_slice(&empty_page()[o..o + k]);
                        rest = &mut rest[k..];
                        o = 0;
                    }
                    continue;
                }
                return Err(self.member_err(
                    d,
                    err("this pool member has failed: its slots hold no line any more".into()),
                ));
            }
            self.members[d]
                .read_at(piece, moff)
                .map_err(|e| self.member_err(d, e))?;
        }
        if records {
            let mut tr = self.dirty.lock().unwrap();
            self.note_records(&mut tr, buf, offset, false, &mut Vec::new());
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset >= 4096 && offset < self.meta_end && !data.is_empty() {
            // The members' flags are raised (durably) before such records reach them.
            self.raise_for(&[(offset, data)], false)?;
        }
        let r = self.write_unnoted(data, offset);
        if offset >= 4096 && offset < self.meta_end && !data.is_empty() {
            let mut tr = self.dirty.lock().unwrap();
            match (&r, tr.batch_left) {
                (Err(_), _) => (tr.unsure, tr.batch_left) = (true, None),
                (Ok(()), Some(n)) if n <= 1 => (tr.unsure, tr.batch_left) = (false, None),
                (Ok(()), Some(n)) => tr.batch_left = Some(n - 1),
                (Ok(()), None) => {}
            }
        }
        r
    }

    /// Notes the records of the whole batch, then raises the members' flags (`may_dirty`,
    /// `may_single`, see [`PoolDev::update_dirty_flags`]) durably for them. Noting a record
    /// again as it is changes nothing, so each page's `write_at` after this raises nothing
    /// more.
    fn prepare_records(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        self.raise_for(writes, true)
    }

    /// Syncs every live member, also after one fails: an error names its member when one
    /// member alone failed (the writes of the others are durable), else it is untyped (the
    /// whole cache's sync failed).
    fn sync(&self) -> io::Result<()> {
        let mut errs: Vec<io::Error> = self
            .live()
            .filter_map(|(d, m)| m.dev().sync().err().map(|e| self.member_err(d, e)))
            .collect();
        match errs.len() {
            0 => {
                // Every record written so far is durable: flags of members now clean clear.
                let tr = self.dirty.lock().unwrap();
                self.update_dirty_flags(&tr, false, &[])
            }
            1 => Err(errs.pop().unwrap()),
            _ => Err(io::Error::new(
                errs[0].kind(),
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
        }
    }

    fn fail_member(&self, d: usize) -> io::Result<()> {
        self.fail_member_now(d)
    }

    fn pool_member_names(&self) -> Vec<String> {
        self.member_names()
    }

    fn pool_member_io(&self) -> Vec<crate::dev::MemberIo> {
        self.members
            .iter()
            .map(|m| crate::dev::MemberIo {
                reads: m.reads.load(Ordering::Relaxed),
                writes: m.writes.load(Ordering::Relaxed),
                read_bytes: m.read_bytes.load(Ordering::Relaxed),
                written_bytes: m.written_bytes.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn dirty_copies(&self) -> u8 {
        self.block.lock().unwrap().dirty_copies
    }

    fn failed_members(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&d| self.member_failed(d))
            .collect()
    }

    fn lost_at_open(&self) -> Vec<(u64, u64)> {
        PoolDev::lost_at_open(self)
    }

    fn replace_member(&self, d: usize, name: String, dev: Box<dyn BlockDev>) -> Result<(), String> {
        PoolDev::replace_member(self, d, name, dev)
    }
}

/// A record page of empty records.
fn empty_page() -> &'static [u8] {
    static PAGE_OF_EMPTY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PAGE_OF_EMPTY.get_or_init(|| {
        let mut page = vec![0u8; PAGE as usize];
        for r in page.chunks_mut(crate::format::RECORD_BYTES as usize) {
            crate::format::Record::EMPTY.encode(r);
        }
        page
    })
}

/// A failed member not given at open: nothing reaches it ([`PoolDev`] skips failed members).
struct Absent;

impl BlockDev for Absent {
    fn size(&self) -> u64 {
        0
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(err("a missing pool member was read".into()))
    }
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(err("a missing pool member was written".into()))
    }
    fn sync(&self) -> io::Result<()> {
        Err(err("a missing pool member was synced".into()))
    }
}

/// An error of one member of a pool ([`PoolDev`]): which member, and its device's error.
#[derive(Debug)]
pub struct MemberError {
    pub member: usize,
    pub name: String,
    pub err: io::Error,
}

impl std::fmt::Display for MemberError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cache device {} (pool member {}): {}",
            self.name, self.member, self.err
        )
    }
}

impl std::error::Error for MemberError {}

/// The pool member an I/O error came from, if it is a [`MemberError`].
pub fn member_of_error(e: &io::Error) -> Option<usize> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<MemberError>())
        .map(|m| m.member)
}
