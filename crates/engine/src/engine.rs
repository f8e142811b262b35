//! The cache engine (direct layout): lines in fixed slots, a map from line key to slot, a
//! replacement policy, admission, write modes and write-back cleaning.

use crate::cleaning::{self, Cleaner, DirtyKeys, DirtyWindow};
use crate::config::{Admission, EngineConfig, Mode, SeqCutoff, Validity};
use crate::free_slots::FreeSlots;
use crate::index::LineIndex;
use crate::keys::Keys;
use crate::plan::{Plan, Step};
use crate::policy::{self, Access, Policy, Slot, NEVER};
use crate::pool::Pool;
use crate::request::{Op, Request, MAX_CLASS, NUM_CLASSES};
use crate::stats::{Bypass, Counters};
use hashbrown::HashMap;
use std::cell::Cell;

mod copies;
mod part_masks;
use copies::Mirror;
pub use copies::{Remirror, COPY_KEY};
use part_masks::PartMasks;

/// Line numbers must fit in this many bits of a key; the volume takes the rest.
pub const LINE_BITS: u32 = 48;
/// Largest volume id.
pub const MAX_VOLUME: u32 = (1 << (64 - LINE_BITS)) - 1;
pub(crate) const EMPTY: u64 = u64::MAX;
const SEQ_STREAMS: usize = 16;

/// A request the engine cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("class {0} is out of range (0..=31)")]
    BadClass(u8),
    #[error("volume {0} is out of range (0..={MAX_VOLUME})")]
    BadVolume(u32),
    #[error("request at offset {offset} length {len} reaches past the largest supported address")]
    OutOfRange { offset: u64, len: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// A sequential-stream detector: a small table of recent streams, least recently used replaced.
#[derive(Clone, Copy, Default)]
struct Stream {
    key: u64, // volume << 1 | is_write
    next: u64,
    bytes: u64,
    used: u64,
}

/// The cache engine. Feed it requests with [`Engine::process`]; read the plan it returns.
/// Clean ahead in eviction order (class-aware policies): cleaning is due whenever one of the
/// next `CLEAN_AHEAD / 2` victims is dirty, and writes back first the dirty lines among this
/// many next victims, so a line's write-back is planned at least `CLEAN_AHEAD / 2` evictions
/// before its own. Where the policy tracks eviction-order positions (DSS), the window is
/// the watermarks' clean share of the cache, `(1 - dirty_high)`, if that is more (see
/// `Engine::ahead_window`; issue 18, round 3: with write-backs in flight for longer than
/// 512 evictions, DSS evicted the dirty lines just past its window) (unless it is inserted nearer the tail than that: DSS's staging floor keeps
/// a large file's list that deep). Triggering on the next victim only (before issue 18's
/// second round) planned each write-back one request before the line's eviction, so the
/// write-back still ran in the request's path.
/// Selective eviction (DSS) takes the lowest-priority class first, whose list holds the lines
/// written last (large files being written): without this the watermark cleaner (LBA order,
/// only above `dirty_high`) never reaches them and nearly every eviction waits for an HDD
/// write in the request's path (issue 18: 5.0 M of 6.6 M evictions on `fileserver`).
pub const CLEAN_AHEAD: usize = 1024;

/// Class-aware policies: when the victim named is being written back, the engine takes the
/// first clean unpinned line among the pinned ones' count plus this many next victims
/// before a dirty one (as `clean_victim_window` does for every policy when set).
const CLASS_CLEAN_WINDOW: u32 = 64;

/// The engine's dirty lines in LBA order, for the cleaner ([`DirtyKeys`]; a macro, not a
/// method, so that the cleaner, another field, can be borrowed alongside).
macro_rules! dirty_keys {
    ($e:ident) => {{
        let min_batch = $e.dirty_min_batch();
        DirtyKeys {
            win: &mut $e.dirty_win,
            keys: &$e.keys,
            dirty: &$e.dirty,
            map: &$e.map,
            count: $e.dirty_count,
            min_batch,
        }
    }};
}

/// Fewest dirty keys the cleaners' LBA window holds after a rebuild (more with more dirty
/// lines: a 64th of them, so a rebuild's pass over the dirty bitmap is paid by as many
/// write-backs).
const MIN_DIRTY_BATCH: usize = 1024;

pub struct Engine {
    cfg: EngineConfig,
    line_shift: u32,
    group_lines_shift: u32,
    cap: u32,
    len: u32,
    /// The cache devices' slot ranges ([`EngineConfig::pool_lines`]; one member = today).
    pool: Pool,
    /// Slots holding no line, per member of the pool.
    slots: FreeSlots,
    keys: Keys,
    /// Class per slot, allocated at the first line of a class other than 0 (empty: every
    /// line is of class 0, 1 B per line saved; read through [`Engine::line_class`]).
    classes: Vec<u8>,
    dirty: Vec<u64>,
    dirty_count: u64,
    /// The dirty keys of one window of LBAs, for the cleaners' LBA order (the dirty bitmap
    /// and `keys` are the truth; see `cleaning/order.rs`).
    dirty_win: DirtyWindow,
    /// The cleaning policy: which dirty line [`Engine::clean`] writes back next.
    cleaner: Box<dyn Cleaner>,
    /// Logical clock: requests processed (plus [`Engine::advance_clock`]).
    clock: u64,
    map: LineIndex,
    policy: Box<dyn Policy>,
    counters: Vec<Counters>,
    plan: Plan,
    record: bool,
    group_counts: HashMap<u64, (u32, u32)>,
    streams: [Stream; SEQ_STREAMS],
    /// The sequential-cutoff decision of the request being processed, made by a front stage
    /// before the request was split ([`Engine::process_with_seq`]; `None` = decide here).
    seq_forced: Option<bool>,
    tick: u64,
    seq: u64,
    oracle: Option<Vec<u64>>,
    /// Sector validity: log2 of the sector size and of sectors per line, the mask of a whole
    /// line; per slot a "whole" bit (empty with line validity): set, the line is all valid
    /// and all or nothing dirty (as its dirty bit says); clear, its (valid, dirty) masks are
    /// in `part_masks`, or both empty when absent there. Whole lines, the common case, cost
    /// one bit; a partly valid or dirty line an entry of the side map.
    sectors: bool,
    sector_shift: u32,
    spl_shift: u32,
    full_mask: u64,
    whole: Vec<u64>,
    part_masks: PartMasks,
    /// Whether [`Engine::fast_line`] may serve whole-line requests (see there).
    fast: bool,
    fast_allowed: bool,
    /// The policy is class-aware (DSS, partitions): ask `admit` and `victim_for`.
    class_gate: bool,
    /// Keys of lines that left the cache since the last [`Engine::drain_unmapped`], when
    /// tracking is on ([`Engine::track_unmapped`]).
    unmapped: Vec<u64>,
    track_unmapped: bool,
    /// Each slot's persisted-record state (key, valid, dirty | pending) as it was before its
    /// first change since the executor last took it ([`Engine::journal_lines`]); `None`: not
    /// journaling (the simulator).
    journal: Option<Box<HashMap<Slot, LineState>>>,
    /// Dirty lines may not be evicted ([`Engine::set_dirty_evictions_blocked`]): the
    /// executor's backing device is failing writes, so a write-back could not happen.
    dirty_evictions_blocked: bool,
    /// Read misses are not admitted ([`Engine::set_read_admission_blocked`]): the executor
    /// cannot reuse a slot now (its backing syncs fail).
    read_admission_blocked: bool,
    /// Scratch for [`Engine::clean_candidate`].
    cand_buf: Vec<Slot>,
    /// Scratch for [`Engine::dirty_ahead`] (called through `&self` by
    /// [`Engine::needs_cleaning`] after every request: no allocation there). The engine
    /// was never `Sync` (its policy and cleaner are not); it stays `Send`.
    ahead_buf: Cell<Vec<Slot>>,
    /// How many of the next victims were clean (or being written back) at the last look
    /// ahead ([`Engine::note_ahead`]); the policy counts what moved since.
    ahead_depth: Cell<u64>,
    /// Write-backs in flight ([`Engine::begin_clean`]): per slot a write-back reads, its
    /// pins, pending sectors, write generation and whether its line was dropped meanwhile.
    /// Empty whenever no write-back is in flight, so the hot paths test only `is_empty`.
    pins: HashMap<Slot, Pin>,
    /// The tickets in flight (the last one is being planned while `capturing`).
    tickets: Vec<TicketEntry>,
    /// Completed tickets kept for their buffers (no allocation per write-back).
    ticket_pool: Vec<TicketEntry>,
    next_ticket: u32,
    /// A begin is planning: [`Engine::write_back`] and chunk rewrites pin what they read.
    capturing: bool,
    /// Slots whose line was dropped while pinned (zombies): neither cached nor free until
    /// their write-back completes.
    zombies: u32,
    inflight: InflightCounters,
    /// Mirrored dirty copies (`dirty_copies` 2): a dirty line's slot -> its copy's slot on
    /// another member, and back. Only dirty lines have entries (no RAM per clean line). A
    /// copy slot holds no key (`keys` EMPTY), is in neither the map nor the policy, is never
    /// a victim and is not free.
    copy_of: HashMap<Slot, Slot>,
    owner_of: HashMap<Slot, Slot>,
    /// Copy slots detached from their line and held until a write-back in flight
    /// ([`WbLine::copy`]) or a re-mirror ([`Engine::begin_remirror`]) completes.
    held: HashMap<Slot, ()>,
    /// Re-mirrors in flight: line slot -> (key, new copy); an entry is dropped when the
    /// line is written or unmapped meanwhile (the copy is then freed at completion).
    remirroring: HashMap<Slot, (u64, Slot)>,
    /// The pairs of the last [`Engine::begin_remirror`].
    remirror_buf: Vec<(Slot, Slot)>,
    /// Copy slots journaled since the executor last took them ([`Engine::take_copy_slots`]):
    /// a copy's record changes without a step on its slot (linked, unlinked, its line's
    /// dirty sectors changed), so the executor could not find them among a plan's slots.
    copy_journal: Vec<Slot>,
    /// Per-volume state, when the configuration has a volume table (`cfg.volumes`); see
    /// [`Engine::process_volume`]. Empty and never touched otherwise.
    vols: Vec<VolState>,
    /// Volume id -> index in `vols`.
    vol_ix: HashMap<u32, u32>,
    /// `!cfg.volumes.is_empty()`: requests go through [`Engine::process_volume`].
    per_volume: bool,
    /// A request is being processed (per volume: its counts reach its volume by difference;
    /// only counts made outside requests, by cleaning, are added to a volume directly).
    in_request: bool,
}

/// What [`Engine::fail_device`] dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceLoss {
    /// Clean lines dropped (their data is on the backing device).
    pub dropped_clean: u64,
    /// Dirty lines that were on the device, as (slot, key), dropped from the cache: no copy
    /// of their dirty sectors is left in it.
    pub uncovered: Vec<(Slot, u64)>,
    /// Dirty lines on the device whose mirrored copy (`dirty_copies` 2) became the line:
    /// still cached, at the copy's slot, with valid = dirty sectors.
    pub promoted: u64,
    /// Slots of the dirty lines left with one cache copy (promoted ones, and those whose
    /// copy was on the device): [`Engine::begin_remirror`] gives them a copy again.
    pub unmirrored: Vec<Slot>,
}

/// One volume of a pool (see `docs/design-pool.md`).
#[derive(Clone, Debug)]
struct VolState {
    cfg: crate::config::VolumeConfig,
    counters: Counters,
}

/// What one volume of a pool did and holds ([`Engine::volume_stats`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct VolumeStats {
    pub id: u32,
    /// The name from the volume table (the id, for a volume not in it).
    pub name: String,
    /// The settings its requests run with (its own, or the engine-wide ones).
    pub mode: Mode,
    pub admission: Admission,
    pub seq_cutoff: SeqCutoff,
    /// Counters of its requests (including evictions and write-backs they caused) and of
    /// the cleaning of its lines.
    pub counters: Counters,
    /// Cached lines of the volume, and of those the dirty ones, now.
    pub lines: u64,
    pub dirty_lines: u64,
}

// Executors move the engine into their threads (behind a lock): it must stay `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Engine>();
};

/// A slot's persisted-record state ([`Engine::line_state`], [`Engine::journal_lines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineState {
    /// `u64::MAX`: no line.
    pub key: u64,
    pub valid: u64,
    /// Dirty sectors, including those a write-back in flight cleans.
    pub dirty: u64,
}

impl LineState {
    pub const EMPTY: LineState = LineState {
        key: EMPTY,
        valid: 0,
        dirty: 0,
    };
}

/// One line for [`Engine::restore_bulk`]: as the arguments of [`Engine::restore_line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreLine {
    pub key: u64,
    pub slot: Slot,
    pub valid: u64,
    pub dirty: u64,
    pub class: u8,
}

/// Restored lines from which [`Engine::restore_slots`] builds the index on every core.
const RESTORE_PARALLEL_LINES: u32 = 1 << 16;

/// Lines restored by [`Engine::restore_slots`] and not yet threaded into the policy: given
/// to [`Engine::restore_age`].
#[must_use = "the restored lines are in no policy until restore_age threads them"]
#[derive(Debug)]
pub struct RestorePending {
    unthreaded: Vec<u64>,
    /// Threads to build the index with in [`Engine::restore_age`] (alongside the policy);
    /// 0: built already.
    build_index: usize,
}

/// A write-back in flight, from [`Engine::begin_clean`] or
/// [`Engine::begin_write_back_slots`] until [`Engine::complete_writeback`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WbTicket(u32);

/// One line a write-back in flight reads from the cache. Its slot stays pinned (never a
/// victim, never reused, never an eviction candidate) until the ticket completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WbLine {
    pub slot: Slot,
    pub key: u64,
    /// The sectors this write-back cleans: the line's dirty sectors at begin (0 for a clean
    /// copy a chunk rewrite writes along). They are no longer dirty (the cleaner and the
    /// counts see the line clean, as after [`Engine::clean`]) but pending
    /// ([`Engine::pending_mask`]) until the ticket completes.
    pub pending: u64,
    /// The slot's write generation at begin ([`Engine::slot_gen`]).
    pub wgen: u32,
    /// The class the line's write-back was counted against at begin (`write_backs`): a
    /// failed or undone line is uncounted there at completion.
    pub class: u8,
    /// The line's mirrored copy at begin (`dirty_copies` 2), holding the pending sectors
    /// too: the write-back may read either slot. Held (never reused) until the ticket
    /// completes, then freed (or, after a failed write-back, the line's copy again).
    pub copy: Option<Slot>,
}

/// What a begin planned. `plan` holds the `WriteBack` steps (and a chunk rewrite's
/// `CopyHdd`s); `spans` the backing ranges they write, `(volume, offset, len)`, adjacent
/// ones merged, in plan order: a foreground backing write into one of them must wait until
/// the write-back's I/O is done (plan-unlocked-io.md (b) 4).
pub struct WbBatch<'a> {
    pub ticket: WbTicket,
    pub plan: &'a Plan,
    pub lines: &'a [WbLine],
    pub spans: &'a [(u32, u64, u64)],
}

/// What completing a write-back came to, in lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WbDone {
    /// Lines whose pending sectors are clean now.
    pub cleaned: u64,
    /// Lines whose write-back failed: their pending sectors are dirty again.
    pub failed: u64,
    /// Lines written meanwhile (a planned cache write into the slot): the sectors written
    /// since begin stay dirty.
    pub redirtied: u64,
    /// Slots of lines dropped meanwhile (zombies), free now.
    pub freed: u64,
}

/// Effects of write-backs in flight since the engine was built. All zero while each begin
/// is completed before the next request, as [`Engine::clean`] does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InflightCounters {
    /// Evictions whose chosen victim was pinned and that took another line.
    pub victim_pinned: u64,
    /// Missed lines not admitted because no unpinned victim was found (also counted in
    /// `bypasses.no_capacity`).
    pub bypass_pinned: u64,
    /// Lines written while their write-back was in flight ([`WbDone::redirtied`]).
    pub writeback_redirtied: u64,
    /// Lines made dirty again by a failed write-back.
    pub writeback_failed: u64,
    /// Slots freed at completion because their line was dropped meanwhile.
    pub zombies_freed: u64,
}

/// Per pinned slot (see `Engine::pins`).
#[derive(Clone, Copy, Default)]
struct Pin {
    count: u16,
    /// Union of the pending sectors of the tickets that pin the slot.
    pending: u64,
    /// Planned cache writes into the slot while pinned.
    wgen: u32,
    /// The line was dropped (trim, invalidation) while pinned.
    zombie: bool,
    /// Pinned by a read miss writing its bytes ([`Engine::pin_fill`]): the slot does not
    /// hold them yet, so nothing may read it (a chunk rewrite would copy other bytes to
    /// the line's backing range).
    fill: bool,
}

#[derive(Default)]
struct TicketEntry {
    id: u32,
    lines: Vec<WbLine>,
    spans: Vec<(u32, u64, u64)>,
}

/// What serving one line of a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Hit,
    /// Not cached (or not usable): the caller admits or bypasses it.
    Miss,
    /// Cached but lacking some requested sectors, which the plan read from the backing
    /// device (and filled in when `filled`).
    Served {
        filled: bool,
    },
}

/// Bits `a..b` of a sector mask.
#[inline]
fn bits(a: u64, b: u64) -> u64 {
    if b - a >= 64 {
        u64::MAX
    } else {
        ((1u64 << (b - a)) - 1) << a
    }
}

/// The runs of set bits in a sector mask, lowest first, as `(first, end)`.
struct Runs(u64);

impl Iterator for Runs {
    type Item = (u64, u64);
    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.0 == 0 {
            return None;
        }
        let s = self.0.trailing_zeros() as u64;
        let n = (self.0 >> s).trailing_ones() as u64;
        self.0 &= !bits(s, s + n);
        Some((s, s + n))
    }
}

/// Where one line of a request lies.
struct LinePart {
    key: u64,
    line_start: u64,
    lo: u64,
    hi: u64,
}

impl Engine {
    /// Builds an engine; the configuration is validated first.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate().map_err(EngineError::Config)?;
        let pool = cfg.pool();
        let cap = cfg.capacity_lines as u32;
        debug_assert_eq!(pool.capacity(), u64::from(cap), "validated");
        let info = policy::lookup(&cfg.policy).expect("validated");
        let policy = policy::partition::wrap((info.make)(cap, &cfg.policy_params), cap, &cfg);
        let class_gate = policy.class_aware();
        let line_shift = cfg.line_size.trailing_zeros();
        let group_lines_shift = (cfg.group_size / cfg.line_size).trailing_zeros();
        let sectors = cfg.validity == Validity::Sector;
        let sector_shift = 9.max(line_shift.saturating_sub(6));
        let spl_shift = line_shift - sector_shift;
        let mask_words = if sectors {
            (cap as usize).div_ceil(64)
        } else {
            0
        };
        let mut e = Engine {
            sectors,
            sector_shift,
            spl_shift,
            full_mask: bits(0, 1 << spl_shift),
            whole: vec![0; mask_words],
            part_masks: PartMasks::new(spl_shift),
            fast: false,
            fast_allowed: true,
            line_shift,
            group_lines_shift,
            cap,
            len: 0,
            slots: FreeSlots::new(&pool),
            pool,
            keys: Keys::new(cap as usize),
            classes: Vec::new(),
            dirty: vec![0; (cap as usize).div_ceil(64)],
            dirty_count: 0,
            dirty_win: DirtyWindow::default(),
            cleaner: cleaning::make(cfg.cleaning, cfg.acp_chunk_lines_shift(), cfg.cleaning_age),
            clock: 0,
            map: LineIndex::new(cap as usize),
            policy,
            counters: vec![Counters::default(); NUM_CLASSES],
            plan: Plan::default(),
            record: true,
            group_counts: HashMap::new(),
            streams: [Stream::default(); SEQ_STREAMS],
            seq_forced: None,
            tick: 0,
            seq: 0,
            oracle: None,
            class_gate,
            unmapped: Vec::new(),
            track_unmapped: false,
            journal: None,
            dirty_evictions_blocked: false,
            read_admission_blocked: false,
            cand_buf: Vec::new(),
            ahead_buf: Cell::new(Vec::new()),
            ahead_depth: Cell::new(0),
            pins: HashMap::new(),
            tickets: Vec::new(),
            ticket_pool: Vec::new(),
            next_ticket: 0,
            capturing: false,
            zombies: 0,
            inflight: InflightCounters::default(),
            copy_of: HashMap::new(),
            owner_of: HashMap::new(),
            held: HashMap::new(),
            remirroring: HashMap::new(),
            remirror_buf: Vec::new(),
            copy_journal: Vec::new(),
            vols: Vec::new(),
            vol_ix: HashMap::new(),
            per_volume: false,
            in_request: false,
            cfg,
        };
        e.sync_volumes();
        e.update_fast_path();
        Ok(e)
    }

    /// Takes the volume table of `cfg` (at build and after [`Engine::retune`]): listed
    /// volumes get their settings and name, counters are kept by id.
    fn sync_volumes(&mut self) {
        self.per_volume = !self.cfg.volumes.is_empty();
        for v in self.cfg.volumes.clone() {
            let i = self.volume_index(v.id);
            self.vols[i].cfg = v;
        }
        // A volume dropped from the table keeps its counters under the engine-wide settings.
        for st in &mut self.vols {
            if !self.cfg.volumes.iter().any(|v| v.id == st.cfg.id) {
                st.cfg = crate::config::VolumeConfig::new(st.cfg.id, st.cfg.id.to_string());
            }
        }
    }

    /// Size in bytes of `volume`: its own (`VolumeConfig::bytes`), else the engine-wide
    /// `volume_bytes`. Population and chunk rewrites never pass it.
    #[inline]
    fn volume_end(&self, volume: u32) -> Option<u64> {
        if self.per_volume {
            if let Some(b) = self
                .vol_ix
                .get(&volume)
                .and_then(|&i| self.vols[i as usize].cfg.bytes)
            {
                return Some(b);
            }
        }
        self.cfg.volume_bytes
    }

    /// Index of `volume` in `vols`, adding it (engine-wide settings, named by its id).
    fn volume_index(&mut self, volume: u32) -> usize {
        if let Some(&i) = self.vol_ix.get(&volume) {
            return i as usize;
        }
        let i = self.vols.len();
        self.vols.push(VolState {
            cfg: crate::config::VolumeConfig::new(volume, volume.to_string()),
            counters: Counters::default(),
        });
        self.vol_ix.insert(volume, i as u32);
        i
    }

    /// One request with a volume table: run with its volume's settings, counted to it too.
    /// The engine-wide `mode`, `admission` and `seq_cutoff` are swapped for the volume's for
    /// the request (and back), so every path that reads them obeys the volume.
    #[inline(never)]
    fn process_volume(&mut self, req: &Request) -> Result<&Plan, EngineError> {
        if req.volume > MAX_VOLUME || req.class > MAX_CLASS {
            return self.process_plain(req);
        }
        let vi = self.volume_index(req.volume);
        let ci = req.class as usize;
        let before = self.counters[ci];
        let v = &self.vols[vi].cfg;
        let own = (
            v.mode.unwrap_or(self.cfg.mode),
            v.admission.unwrap_or(self.cfg.admission),
            v.seq_cutoff.unwrap_or(self.cfg.seq_cutoff),
        );
        let base = (self.cfg.mode, self.cfg.admission, self.cfg.seq_cutoff);
        let swap = own != base;
        if swap {
            (self.cfg.mode, self.cfg.admission, self.cfg.seq_cutoff) = own;
            self.update_fast_path();
        }
        self.in_request = true;
        let r = self.process_plain(req).map(|_| ());
        self.in_request = false;
        if swap {
            (self.cfg.mode, self.cfg.admission, self.cfg.seq_cutoff) = base;
            self.update_fast_path();
        }
        let now = self.counters[ci];
        self.vols[vi].counters.add_delta(&now, &before);
        r.map(|_| &self.plan)
    }

    /// Counts cleaning I/O of a line of `vol` (outside requests) to its volume: `ssd_read`
    /// bytes read from the cache, `hdd_read` and `hdd_write` on the backing device, and
    /// `write_backs` lines (negative: a failed write-back uncounted).
    #[cold]
    fn count_volume_cleaning(&mut self, vol: u32, ssd_read: u64, hdd: (u64, u64), wb: i64) {
        let i = self.volume_index(vol);
        let c = &mut self.vols[i].counters;
        c.ssd_bytes_read += ssd_read;
        c.hdd_bytes_read += hdd.0;
        c.hdd_bytes_written += hdd.1;
        c.write_backs = c.write_backs.saturating_add_signed(wb);
    }

    /// Per volume (with a volume table; empty without one): the counters of its requests
    /// and cleaning, and its cached and dirty lines now (counted over the slots: O(capacity)),
    /// in id order. Volumes holding lines but not yet seen (restored lines) are listed too.
    /// The counters of all volumes add up to [`Engine::counters`] (`tests/volumes.rs`).
    pub fn volume_stats(&self) -> Vec<VolumeStats> {
        if !self.per_volume {
            return Vec::new();
        }
        let mut occ: HashMap<u32, (u64, u64)> = HashMap::new();
        for (k, _, dirty) in self.entries() {
            let e = occ.entry((k >> LINE_BITS) as u32).or_default();
            e.0 += 1;
            e.1 += dirty as u64;
        }
        let mut ids: Vec<u32> = self.vols.iter().map(|v| v.cfg.id).collect();
        ids.extend(occ.keys().filter(|&id| !self.vol_ix.contains_key(id)));
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| {
                let st = self.vol_ix.get(&id).map(|&i| &self.vols[i as usize]);
                let v = st.map(|s| s.cfg.clone());
                let (lines, dirty_lines) = occ.get(&id).copied().unwrap_or_default();
                VolumeStats {
                    id,
                    name: v
                        .as_ref()
                        .map_or_else(|| id.to_string(), |v| v.name.clone()),
                    mode: v.as_ref().and_then(|v| v.mode).unwrap_or(self.cfg.mode),
                    admission: v
                        .as_ref()
                        .and_then(|v| v.admission)
                        .unwrap_or(self.cfg.admission),
                    seq_cutoff: v
                        .as_ref()
                        .and_then(|v| v.seq_cutoff)
                        .unwrap_or(self.cfg.seq_cutoff),
                    counters: st.map(|s| s.counters).unwrap_or_default(),
                    lines,
                    dirty_lines,
                }
            })
            .collect()
    }

    /// Decides whether [`Engine::fast_line`] applies to this configuration: one line per
    /// group, admission always in both directions, no sequential cutoff, no oracle, a
    /// capacity, a policy that is not class-aware, and a mode in which both reads and writes
    /// allocate.
    fn update_fast_path(&mut self) {
        let c = &self.cfg;
        self.fast = self.fast_allowed
            && self.group_lines_shift == 0
            && c.admission.read_threshold == 1
            && c.admission.write_threshold == 1
            && c.seq_cutoff.read_bytes == 0
            && c.seq_cutoff.write_bytes == 0
            && self.oracle.is_none()
            && self.cap > 0
            && !self.class_gate
            && !self.dirty_evictions_blocked
            && !self.read_admission_blocked
            && self.pins.is_empty()
            && c.dirty_copies < 2
            && matches!(c.mode, Mode::WriteThrough | Mode::WriteBack);
    }

    /// Forbids (or allows again) evicting dirty lines: an executor whose backing device fails
    /// writes sets it so that no plan needs a write-back. While set, a slot for a missed line
    /// comes from the free slots or from a **clean** line (the policy's likeliest clean
    /// victim); when there is neither, the miss is not admitted (`bypasses.no_capacity`):
    /// a read is served from the backing device and a write goes to it (`WriteHdd`), so
    /// no plan ever contains an eviction write-back. Cleaning ([`Engine::clean`]) is not
    /// affected. Costs nothing while off (it only turns the fast path off while on).
    pub fn set_dirty_evictions_blocked(&mut self, on: bool) {
        self.dirty_evictions_blocked = on;
        self.update_fast_path();
    }

    /// Whether dirty evictions are blocked ([`Engine::set_dirty_evictions_blocked`]).
    pub fn dirty_evictions_blocked(&self) -> bool {
        self.dirty_evictions_blocked
    }

    /// Forbids (or allows again) admitting read misses: an executor that cannot reuse a slot
    /// now (its backing device fails syncs, and reusing a slot, or a free slot whose old
    /// record is still on its device, needs one) sets it so that a read never fails on a
    /// slot it did not need. While set, a read miss is not admitted (`bypasses.no_capacity`,
    /// the path of a class that never allocates): the plan reads the backing device and
    /// changes no slot. Hits are served as always (missing sectors of a cached line are
    /// filled in place); writes and population by writes are not affected. Costs nothing
    /// while off (it only turns the fast path off while on).
    pub fn set_read_admission_blocked(&mut self, on: bool) {
        self.read_admission_blocked = on;
        self.update_fast_path();
    }

    /// Whether read misses are not admitted ([`Engine::set_read_admission_blocked`]).
    pub fn read_admission_blocked(&self) -> bool {
        self.read_admission_blocked
    }

    /// While dirty evictions are blocked: whether a slot can be had without one.
    fn room_without_dirty_eviction(&self) -> bool {
        self.has_free_slot() || (self.len as u64) > self.dirty_count
    }

    /// Whether a slot is neither cached nor a zombie (so [`Engine::free_slot`] finds one).
    #[inline]
    fn has_free_slot(&self) -> bool {
        self.len + self.zombies + self.slots.dead_slots() + self.copy_slots() < self.cap
    }

    /// The clean line the policy would evict first (blocked dirty evictions): its likeliest
    /// victims in order, then any clean slot. `None` when every cached line is dirty.
    #[cold]
    fn clean_victim(&self) -> Option<Slot> {
        if self.len as u64 <= self.dirty_count {
            return None;
        }
        let mut hint = Vec::new();
        self.policy
            .eviction_candidates(self.len as usize, &mut hint);
        let clean =
            |s: Slot| self.keys.at(s as usize) != EMPTY && !self.is_dirty(s) && !self.is_pinned(s);
        hint.into_iter()
            .find(|&s| clean(s))
            .or_else(|| (0..self.cap).find(|&s| clean(s)))
    }

    /// Turns the whole-line fast path off (or back on where it applies): it must not change
    /// anything but speed, and tests compare both.
    #[doc(hidden)]
    pub fn set_fast_path(&mut self, on: bool) {
        self.fast_allowed = on;
        self.update_fast_path();
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Whether plans are recorded (default). Switch off for hit-ratio-only simulation: the
    /// counters, including device bytes, stay exact.
    pub fn set_record_plan(&mut self, on: bool) {
        self.record = on;
    }

    /// Gives the engine the next-use oracle for Belady: entry i is the index of the next access
    /// to the line of line access i (or [`NEVER`]). Build it with [`Engine::next_use_oracle`].
    pub fn set_oracle(&mut self, next_use: Vec<u64>) {
        self.oracle = Some(next_use);
        self.update_fast_path();
    }

    /// Whether the configured policy needs [`Engine::set_oracle`].
    pub fn needs_oracle(&self) -> bool {
        self.policy.needs_oracle()
    }

    /// Changes the write mode at run time. Leaving write-back keeps dirty lines: call
    /// [`Engine::clean`] until [`Engine::dirty_lines`] is 0 first if they must reach the HDD.
    pub fn set_mode(&mut self, mode: Mode) {
        self.cfg.mode = mode;
        self.update_fast_path();
    }

    pub fn capacity_lines(&self) -> u64 {
        self.cap as u64
    }

    /// Changes the per-run settings at run time (`tiercache ctl set`): admission, sequential
    /// cutoff, group size and dirty watermarks. `f` edits a copy of the configuration, which
    /// is validated as [`Engine::new`] does; the settings an engine is built around (line
    /// size, capacity, policy and its parameters, validity) cannot change here (the error
    /// names the field), nor can the mode (use [`Engine::set_mode`]). A new group size starts
    /// admission counting afresh.
    pub fn retune(&mut self, f: impl FnOnce(&mut EngineConfig)) -> Result<(), EngineError> {
        let mut c = self.cfg.clone();
        f(&mut c);
        c.validate().map_err(EngineError::Config)?;
        let fixed = [
            ("line_size", c.line_size != self.cfg.line_size),
            ("capacity", c.capacity_lines != self.cfg.capacity_lines),
            ("pool_lines", c.pool_lines != self.cfg.pool_lines),
            ("policy", c.policy != self.cfg.policy),
            (
                "slru_protected",
                c.policy_params.slru_protected != self.cfg.policy_params.slru_protected,
            ),
            (
                "s3fifo_small",
                c.policy_params.s3fifo_small != self.cfg.policy_params.s3fifo_small,
            ),
            (
                "volume_shares (Engine::set_volume_share changes them)",
                c.policy_params.volume_shares != self.cfg.policy_params.volume_shares,
            ),
            ("validity", c.validity != self.cfg.validity),
            ("mode", c.mode != self.cfg.mode),
            ("dirty_copies", c.dirty_copies != self.cfg.dirty_copies),
        ];
        if let Some((what, _)) = fixed.iter().find(|x| x.1) {
            return Err(EngineError::Config(format!(
                "{what} cannot change on a running engine (it is fixed when the engine is built)"
            )));
        }
        if c.group_size != self.cfg.group_size {
            self.group_lines_shift = (c.group_size / c.line_size).trailing_zeros();
            self.group_counts.clear();
        }
        let rebuild = c.cleaning != self.cfg.cleaning
            || c.cleaning_age != self.cfg.cleaning_age
            || c.acp_chunk_lines_shift() != self.cfg.acp_chunk_lines_shift();
        let volumes = c.volumes != self.cfg.volumes;
        self.cfg = c;
        if rebuild {
            self.rebuild_cleaner();
        }
        if volumes {
            self.sync_volumes();
        }
        self.update_fast_path();
        Ok(())
    }

    /// Replaces the I/O class table on a running engine (`tiercache ctl classes load`):
    /// allocation, priorities and partitions follow `table` from the next request on.
    ///
    /// Cached lines keep their class id (so they are judged by the new table's class of that
    /// id) and their data. When the old or the new policy is class-aware (DSS, partitions,
    /// `never` classes), the policy is rebuilt over the new table and every cached line is
    /// put back in the old policy's eviction order (oldest first; lines it cannot order, in
    /// slot order, before them): the recency among lines of one old class list is kept.
    /// A partition over its new maximum shrinks as its class inserts (it evicts its own
    /// lines first). Otherwise the policy is kept as it is.
    ///
    /// On error nothing changes.
    pub fn set_class_table(
        &mut self,
        table: Option<std::sync::Arc<crate::ClassTable>>,
    ) -> Result<(), EngineError> {
        if self.policy.needs_oracle() {
            return Err(EngineError::Config(format!(
                "policy {} needs the future accesses; its class table cannot change on a running engine",
                self.policy.name()
            )));
        }
        let mut c = self.cfg.clone();
        c.policy_params.classes = table;
        self.rebuild_policy(c)
    }

    /// Sets (`Some((min, max))`, shares of the capacity) or clears (`None`) the occupancy
    /// bounds of `volume` (`--volume-share`, `ctl --volume NAME set share`): a volume with
    /// bounds gets a partition of its own ([`crate::policy::partition::VolumeParts`]). The
    /// policy is rebuilt as by [`Engine::set_class_table`] (every cached line kept, in the old
    /// policy's eviction order); a volume above a lowered maximum gives up its excess lazily,
    /// one line per later insert (any volume's), dirty lines written back as any eviction.
    /// On error (bounds out of order, minimums over the whole pool) nothing changes.
    pub fn set_volume_share(
        &mut self,
        volume: u32,
        share: Option<(f64, f64)>,
    ) -> Result<(), EngineError> {
        if self.policy.needs_oracle() {
            return Err(EngineError::Config(format!(
                "policy {} needs the future accesses; its volume shares cannot change on a running engine",
                self.policy.name()
            )));
        }
        let mut c = self.cfg.clone();
        let v = &mut c.policy_params.volume_shares;
        v.retain(|s| s.volume != volume);
        if let Some((min, max)) = share {
            v.push(policy::VolumeShare { volume, min, max });
            v.sort_by_key(|s| s.volume);
        }
        if c.policy_params.volume_shares == self.cfg.policy_params.volume_shares {
            return Ok(());
        }
        self.rebuild_policy(c)
    }

    /// The occupancy bounds in force, one per volume that has them.
    pub fn volume_shares(&self) -> &[policy::VolumeShare] {
        &self.cfg.policy_params.volume_shares
    }

    /// Rebuilds the policy for the configuration `c` (its policy parameters changed), every
    /// cached line put back in the old policy's eviction order. On error nothing changes.
    fn rebuild_policy(&mut self, c: EngineConfig) -> Result<(), EngineError> {
        c.validate().map_err(EngineError::Config)?;
        let info = policy::lookup(&c.policy).expect("validated");
        let mut new =
            policy::partition::wrap((info.make)(self.cap, &c.policy_params), self.cap, &c);
        self.cfg = c;
        if !self.class_gate && !new.class_aware() {
            return Ok(());
        }
        // Oldest first: the old policy's eviction order, then the lines it did not list.
        let mut order = Vec::with_capacity(self.len as usize);
        self.policy
            .eviction_candidates(self.len as usize, &mut order);
        let mut listed = vec![false; self.cap as usize];
        order.retain(|&s| {
            let fresh = self.keys.at(s as usize) != EMPTY && !listed[s as usize];
            listed[s as usize] = true;
            fresh
        });
        let rest: Vec<Slot> = (0..self.cap)
            .filter(|&s| self.keys.at(s as usize) != EMPTY && !listed[s as usize])
            .collect();
        debug_assert_eq!(order.len() + rest.len(), self.len as usize);
        for slot in rest.into_iter().chain(order) {
            let a = Access {
                key: self.keys.at(slot as usize),
                seq: self.seq,
                next_use: NEVER,
                is_write: false,
                class: self.line_class(slot),
            };
            self.seq += 1;
            new.insert(slot, &a);
        }
        self.class_gate = new.class_aware();
        self.policy = new;
        self.update_fast_path();
        Ok(())
    }

    /// Zeroes every counter (`tiercache ctl stats --reset`, as `casadm -Z`); the cache's
    /// contents are untouched.
    pub fn reset_counters(&mut self) {
        for c in &mut self.counters {
            *c = Counters::default();
        }
        for v in &mut self.vols {
            v.counters = Counters::default();
        }
        self.inflight = InflightCounters::default();
    }

    /// Lines in the cache.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dirty_lines(&self) -> u64 {
        self.dirty_count
    }

    /// Starts (or stops) logging the keys of lines that leave the cache (evicted, invalidated,
    /// trimmed), so that a caller keeping per-line state can drop it without scanning.
    pub fn track_unmapped(&mut self, on: bool) {
        self.track_unmapped = on;
        if !on {
            self.unmapped = Vec::new();
        }
    }

    /// Starts (or stops, dropping it) the journal of persisted-record states: from now on
    /// the first change of a slot's key, valid or dirty sectors, or pending sectors records
    /// the slot's [`LineState`] before it, until the executor takes it
    /// ([`Engine::take_journaled`]). An executor that writes records from the engine's
    /// state at its own pace reads the state its last written image had from here (the
    /// live volume keeps no record image per slot: issue 16, plan-lean step 4).
    pub fn journal_lines(&mut self, on: bool) {
        self.journal = on.then(Default::default);
    }

    /// The state `slot` had before its first change since it was last taken; `None`: not
    /// changed since (or not journaling).
    #[inline]
    pub fn journaled(&self, slot: Slot) -> Option<LineState> {
        match &self.journal {
            Some(j) if !j.is_empty() => j.get(&slot).copied(),
            _ => None,
        }
    }

    /// Takes (forgets) the journaled state of `slot`, if any.
    #[inline]
    pub fn take_journaled(&mut self, slot: Slot) -> Option<LineState> {
        match &mut self.journal {
            Some(j) if !j.is_empty() => j.remove(&slot),
            _ => None,
        }
    }

    /// Records `state` as `slot`'s journaled state unless it has one (an executor whose
    /// image of the slot differs from the engine's, e.g. a record read at open that the
    /// engine did not take).
    pub fn journal_state(&mut self, slot: Slot, state: LineState) {
        if let Some(j) = &mut self.journal {
            j.entry(slot).or_insert(state);
        }
    }

    /// Frees the journal's table when it is empty and holds room for more than `max` slots
    /// (a plan that changed every slot, e.g. a trim of the whole device, would otherwise
    /// keep ~30 B per line for ever).
    pub fn shrink_journal(&mut self, max: usize) {
        if let Some(j) = &mut self.journal {
            if j.is_empty() && j.capacity() > max {
                **j = HashMap::new();
            }
        }
    }

    /// Slots journaled now.
    pub fn journal_len(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| j.len())
    }

    /// The persisted-record state of `slot` now: its key (`u64::MAX`: none), valid sectors,
    /// and dirty sectors including those a write-back in flight cleans.
    ///
    /// A copy slot (`dirty_copies` 2) has the state of its copy record: key `line key |
    /// [`COPY_KEY`]`, valid = its line's slot, dirty = its line's dirty sectors (with those
    /// a write-back in flight cleans). A copy slot held by a write-back or re-mirror in
    /// flight has none (its record is emptied; a flush reaps write-backs first, so the
    /// line's clean record goes with it).
    #[inline]
    pub fn line_state(&self, slot: Slot) -> LineState {
        let key = self.keys.at(slot as usize);
        if key == EMPTY {
            if !self.owner_of.is_empty() {
                if let Some(&p) = self.owner_of.get(&slot) {
                    return LineState {
                        key: self.keys.at(p as usize) | COPY_KEY,
                        valid: u64::from(p),
                        dirty: self.dirty_mask(p) | self.pending_mask(p),
                    };
                }
            }
            return LineState::EMPTY;
        }
        LineState {
            key,
            valid: self.valid_mask(slot),
            dirty: self.dirty_mask(slot) | self.pending_mask(slot),
        }
    }

    #[inline]
    fn journal_touch(&mut self, slot: Slot) {
        if self.journal.is_some() {
            self.journal_touch_cold(slot);
        }
    }

    #[cold]
    fn journal_touch_cold(&mut self, slot: Slot) {
        let state = self.line_state(slot);
        if let Some(j) = &mut self.journal {
            j.entry(slot).or_insert(state);
        }
        // A line's copy record follows its dirty sectors.
        if !self.copy_of.is_empty() {
            if let Some(&c) = self.copy_of.get(&slot) {
                self.journal_copy(c);
            }
        }
    }

    /// Journals copy slot `c` before its record changes (linked, unlinked, or its line's
    /// dirty sectors change) and lists it for [`Engine::take_copy_slots`].
    pub(super) fn journal_copy(&mut self, c: Slot) {
        if self.journal.is_none() {
            return;
        }
        let state = self.line_state(c);
        if let Some(j) = &mut self.journal {
            j.entry(c).or_insert(state);
        }
        self.copy_journal.push(c);
    }

    /// The copy slots journaled since [`Engine::take_copy_slots`] last took them (possibly
    /// repeated), left in place: a roll-back looks for the copies a failed plan unlinked.
    pub fn copy_slots_journaled(&self) -> &[Slot] {
        &self.copy_journal
    }

    /// Moves into `out` the copy slots journaled since the last call (possibly repeated):
    /// the executor brings their records up to date with the slots of its plans.
    pub fn take_copy_slots(&mut self, out: &mut Vec<Slot>) {
        out.append(&mut self.copy_journal);
    }

    /// Keys of lines that left the cache since the last call (empty when not tracking).
    pub fn drain_unmapped(&mut self) -> std::vec::Drain<'_, u64> {
        self.unmapped.drain(..)
    }

    /// Counters of one class.
    pub fn class_counters(&self, class: u8) -> &Counters {
        &self.counters[class as usize]
    }

    /// Totals over all classes.
    pub fn counters(&self) -> Counters {
        let mut t = Counters::default();
        for c in &self.counters {
            t += c;
        }
        t
    }

    /// Heap bytes of everything the engine keeps per line: slots (keys, classes, dirty
    /// bits, sector masks, free list), the map, the policy's state, the dirty lines in LBA
    /// order and the cleaner's state, plus what grows with requests (admission groups,
    /// unmapped keys not yet drained, the oracle). B-trees and hash maps are estimated
    /// ([`crate::mem`]). Not counted: scratch bounded by one batch (write-back tickets and
    /// pins, candidate buffers) and fixed tables (counters, stream detector).
    pub fn index_bytes(&self) -> usize {
        use crate::mem::hash_bytes;
        self.keys.heap_bytes()
            + self.classes.capacity()
            + self.dirty.capacity() * 8
            + self.whole.capacity() * 8
            // By length: the table's capacity depends on its random hash seed (tombstones),
            // and two equal engines must report the same bytes.
            + self.part_masks.heap_bytes()
            + self.slots.heap_bytes()
            + self.map.mem_bytes()
            + self.policy.mem_bytes()
            + self.dirty_win.mem_bytes()
            + self.cleaner.mem_bytes()
            + hash_bytes(self.group_counts.capacity(), 16)
            + self.unmapped.capacity() * 8
            + self
                .journal
                .as_ref()
                .map_or(0, |j| hash_bytes(j.capacity(), 4 + 24))
            + self.oracle.as_ref().map_or(0, |o| o.capacity() * 8)
    }

    /// The key of line `line` of `volume`.
    #[inline]
    pub fn line_key(volume: u32, line: u64) -> u64 {
        ((volume as u64) << LINE_BITS) | line
    }

    /// Prefetch hint for a request about to be processed (its first line's index bucket).
    #[inline]
    pub fn prefetch(&self, req: &Request) {
        if req.len > 0 && self.cap > 0 {
            self.map
                .prefetch(Self::line_key(req.volume, req.offset >> self.line_shift));
        }
    }

    /// Slot holding `key`, if cached.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<Slot> {
        self.map.find(key, &self.keys)
    }

    /// Whether the line in `slot` is dirty.
    pub fn is_dirty(&self, slot: Slot) -> bool {
        self.dirty[slot as usize / 64] >> (slot % 64) & 1 == 1
    }

    /// Bytes per validity sector (with line validity, the sector is still the unit of the
    /// masks below, which are then all or nothing).
    pub fn sector_size(&self) -> u64 {
        1 << self.sector_shift
    }

    /// Valid sectors of the line in `slot` (bit i = sector i; all set with line validity).
    pub fn valid_mask(&self, slot: Slot) -> u64 {
        if !self.sectors {
            return self.full_mask;
        }
        self.masks(slot).0
    }

    /// Dirty sectors of the line in `slot`.
    pub fn dirty_mask(&self, slot: Slot) -> u64 {
        if !self.sectors {
            return if self.is_dirty(slot) {
                self.full_mask
            } else {
                0
            };
        }
        self.masks(slot).1
    }

    /// The (valid, dirty) sector masks of `slot` (sector validity).
    #[inline]
    fn masks(&self, slot: Slot) -> (u64, u64) {
        if self.whole[slot as usize / 64] >> (slot % 64) & 1 == 1 {
            let d = if self.is_dirty(slot) {
                self.full_mask
            } else {
                0
            };
            (self.full_mask, d)
        } else if self.part_masks.is_empty() {
            (0, 0)
        } else {
            self.part_masks.get(slot).unwrap_or((0, 0))
        }
    }

    /// Stores the sector masks of `slot`; a dirty mask all or nothing must agree with the
    /// slot's dirty bit once the caller is done (`set_dirty_mask` sets it right after).
    #[inline]
    fn store_masks(&mut self, slot: Slot, v: u64, d: u64) {
        let (w, b) = (slot as usize / 64, 1u64 << (slot % 64));
        let was_whole = self.whole[w] & b != 0;
        if v == self.full_mask && (d == 0 || d == self.full_mask) {
            if !was_whole {
                self.whole[w] |= b;
                self.part_masks.remove(slot);
            }
        } else {
            self.whole[w] &= !b;
            if v == 0 && d == 0 {
                if !was_whole {
                    self.part_masks.remove(slot);
                }
            } else {
                self.part_masks.insert(slot, v, d);
            }
        }
    }

    #[inline(always)]
    fn set_valid(&mut self, slot: Slot, m: u64) {
        self.journal_touch(slot);
        if self.sectors {
            if self.part_masks.is_empty() {
                // No line is partly valid or dirty (whole-line runs: every miss evicts and
                // places a line, both through here): a line's masks are its whole bit and
                // dirty bit, so only the whole bit changes, as `store_masks` would change it.
                // callgrind, session 29: ~100 instructions per miss saved (4 calls).
                let (w, b) = (slot as usize / 64, 1u64 << (slot % 64));
                if m == self.full_mask {
                    self.whole[w] |= b;
                    return;
                }
                if m == 0 && !(self.whole[w] & b != 0 && self.is_dirty(slot)) {
                    self.whole[w] &= !b;
                    return;
                }
            }
            self.set_valid_masks(slot, m);
        }
    }

    /// [`Engine::set_valid`]'s general case, out of line (the fast case above is inlined
    /// into the miss path).
    #[inline(never)]
    fn set_valid_masks(&mut self, slot: Slot, m: u64) {
        let d = self.masks(slot).1;
        self.store_masks(slot, m, d);
    }

    /// Sets the dirty sectors of a line (and its line-level dirty state).
    #[inline]
    fn set_dirty_mask(&mut self, slot: Slot, key: u64, m: u64) {
        self.journal_touch(slot);
        if self.sectors {
            let v = self.masks(slot).0;
            self.store_masks(slot, v, m);
        }
        self.set_dirty(slot, key, m != 0);
    }

    /// The sectors `[p.lo, p.hi)` touches and those it covers whole.
    #[inline]
    fn sector_masks(&self, p: &LinePart) -> (u64, u64) {
        let ss = self.sector_shift;
        let (lo, hi) = (p.lo - p.line_start, p.hi - p.line_start);
        let touched = bits(lo >> ss, ((hi - 1) >> ss) + 1);
        let (f0, f1) = ((lo + (1 << ss) - 1) >> ss, hi >> ss);
        let whole = if f1 > f0 { bits(f0, f1) } else { 0 };
        (touched, whole)
    }

    /// Every cached (key, slot, dirty), in slot order. For checks and persistence.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Slot, bool)> + '_ {
        self.keys
            .iter()
            .enumerate()
            .filter(|&(_, k)| k != EMPTY)
            .map(|(s, k)| (k, s as Slot, self.is_dirty(s as Slot)))
    }

    /// Calls `f(key)` for every line access `req` makes, in the order `process` makes them.
    /// Belady's pre-pass uses it.
    pub fn for_each_line_key(line_size: u64, req: &Request, mut f: impl FnMut(u64)) {
        if !matches!(req.op, Op::Read | Op::Write) || req.len == 0 {
            return;
        }
        let shift = line_size.trailing_zeros();
        let first = req.offset >> shift;
        let last = (req.end() - 1) >> shift;
        for l in first..=last {
            f(Self::line_key(req.volume, l));
        }
    }

    /// Builds the next-use oracle for a request stream (one entry per line access).
    pub fn next_use_oracle<'a>(
        line_size: u64,
        reqs: impl IntoIterator<Item = &'a Request>,
    ) -> Vec<u64> {
        let mut next = Vec::new();
        let mut last: HashMap<u64, u64> = HashMap::new();
        for r in reqs {
            Self::for_each_line_key(line_size, r, |k| {
                let i = next.len() as u64;
                next.push(NEVER);
                if let Some(p) = last.insert(k, i) {
                    next[p as usize] = i;
                }
            });
        }
        next
    }

    fn check_request(&self, req: &Request) -> Result<(), EngineError> {
        if req.class > MAX_CLASS {
            return Err(EngineError::BadClass(req.class));
        }
        if req.volume > MAX_VOLUME {
            return Err(EngineError::BadVolume(req.volume));
        }
        let end = req.offset.checked_add(req.len);
        match end {
            Some(e) if (e >> self.line_shift) < (1 << LINE_BITS) => Ok(()),
            _ => Err(EngineError::OutOfRange {
                offset: req.offset,
                len: req.len,
            }),
        }
    }

    /// Processes one request: updates state and counters and returns the plan. With a volume
    /// table (`EngineConfig::volumes`) the request runs with its volume's settings and is
    /// counted to its volume as well ([`Engine::volume_stats`]).
    #[inline]
    pub fn process(&mut self, req: &Request) -> Result<&Plan, EngineError> {
        if self.per_volume {
            return self.process_volume(req);
        }
        self.process_plain(req)
    }

    /// [`Engine::process`] with the engine-wide settings, counted per class only.
    #[inline(always)]
    fn process_plain(&mut self, req: &Request) -> Result<&Plan, EngineError> {
        self.clock += 1;
        // The fast path's test is inlined into the caller's loop; everything else is not.
        if self.fast
            && matches!(req.op, Op::Read | Op::Write)
            && req.class <= MAX_CLASS
            && req.volume <= MAX_VOLUME
            // With `fast_line`'s whole-line check, this keeps the request in range.
            && (req.offset >> self.line_shift) < (1 << LINE_BITS) - 1
            && self.fast_line(req)
        {
            self.counters[req.class as usize].requests += 1;
            return Ok(&self.plan);
        }
        self.process_general(req)
    }

    /// [`Engine::process`] with the sequential-cutoff decision made by the caller: a sharded
    /// engine ([`crate::Sharded`]) decides it once per request, before it splits the request
    /// between shards, with [`Engine::seq_front`]; this engine's own stream table is left
    /// alone. The other request-level stage, group admission, needs no such hand-over: a group
    /// never spans shards.
    pub fn process_with_seq(
        &mut self,
        req: &Request,
        seq_bypass: bool,
    ) -> Result<&Plan, EngineError> {
        self.seq_forced = Some(seq_bypass);
        let r = self.process(req).map(|_| ());
        self.seq_forced = None;
        r.map(|()| &self.plan)
    }

    /// The sequential-cutoff decision for a read or write `req` (of nonzero length, in
    /// range), updating the stream table exactly as [`Engine::process`] would: the front
    /// stage of a sharded engine, run once per request on one engine's table.
    /// With a volume table the request's volume's cutoff applies, as in
    /// [`Engine::process`].
    pub fn seq_front(&mut self, req: &Request) -> bool {
        debug_assert!(matches!(req.op, Op::Read | Op::Write) && req.len > 0);
        if self.per_volume && req.volume <= MAX_VOLUME {
            let vi = self.volume_index(req.volume);
            if let Some(own) = self.vols[vi].cfg.seq_cutoff {
                let base = std::mem::replace(&mut self.cfg.seq_cutoff, own);
                let b = self.seq_bypass(req);
                self.cfg.seq_cutoff = base;
                return b;
            }
        }
        self.seq_bypass(req)
    }

    #[inline(never)]
    fn process_general(&mut self, req: &Request) -> Result<&Plan, EngineError> {
        self.check_request(req)?;
        let ci = req.class as usize;
        self.counters[ci].requests += 1;
        match req.op {
            Op::Flush => {
                self.plan.reset(0, 0);
                self.counters[ci].flushes += 1;
                self.emit(ci, Step::FlushSsd);
                self.emit(ci, Step::FlushHdd { vol: req.volume });
            }
            Op::Trim => {
                self.plan.reset(0, 0);
                self.counters[ci].trims += 1;
                self.trim(req);
            }
            Op::Read | Op::Write => {
                self.read_write(req);
                // FUA in write-back: durable in the cache (data and metadata), as a FLUSH
                // makes it, not sent to the backing device.
                if req.fua
                    && self.cfg.mode == Mode::WriteBack
                    && self
                        .plan
                        .steps
                        .iter()
                        .any(|s| matches!(s, Step::WriteSsd { .. }))
                {
                    self.emit(ci, Step::FlushSsd);
                }
            }
        }
        Ok(&self.plan)
    }

    /// The common case of a hit-ratio simulation, served without the general machinery: one
    /// whole, aligned line, in a configuration where every miss is admitted (see
    /// [`Engine::update_fast_path`]). It makes exactly the state changes, counts and steps
    /// [`Engine::read_write`] would (`tests/fast_path.rs` compares them); it returns `false`,
    /// having changed nothing, when the request is not such a case or the line is cached
    /// with some sectors absent.
    #[inline(always)]
    fn fast_line(&mut self, req: &Request) -> bool {
        let ls = self.cfg.line_size;
        if req.len != ls || req.offset & (ls - 1) != 0 || req.fua {
            return false;
        }
        let key = Self::line_key(req.volume, req.offset >> self.line_shift);
        let slot = self.lookup(key);
        if let Some(s) = slot {
            // A whole line (its bit set) is valid throughout: the side map is read only for
            // the others (callgrind, session 29: ~20 instructions per hit).
            if self.sectors
                && self.whole[s as usize / 64] >> (s % 64) & 1 == 0
                && self.valid_mask(s) != self.full_mask
            {
                return false;
            }
        }
        let ci = req.class as usize;
        let is_write = req.is_write();
        let a = Access {
            key,
            seq: self.seq,
            next_use: NEVER,
            is_write,
            class: req.class,
        };
        self.seq += 1;
        self.plan.reset(req.offset, ls);
        let (vol, hdd) = (req.volume, req.offset);
        let wb = self.cfg.mode == Mode::WriteBack;
        match slot {
            Some(slot) => {
                let ssd = self.ssd_addr(slot);
                if !is_write {
                    self.policy.hit(slot, &a);
                    self.emit(
                        ci,
                        Step::ReadSsd {
                            ssd,
                            buf: 0,
                            len: ls,
                        },
                    );
                } else {
                    // The line is whole (checked above), so its valid mask stays full.
                    self.emit_whole_line_write(ci, vol, hdd, ssd, wb);
                    self.set_dirty_mask(slot, key, if wb { self.full_mask } else { 0 });
                    self.policy.hit(slot, &a);
                }
            }
            None => {
                self.policy.miss(&a);
                let slot = self
                    .alloc_slot(ci, req.volume)
                    .expect("the fast path is off while write-backs are in flight");
                let ssd = self.ssd_addr(slot);
                if is_write {
                    self.emit_whole_line_write(ci, vol, hdd, ssd, wb);
                } else {
                    self.emit(
                        ci,
                        Step::ReadHdd {
                            vol,
                            hdd,
                            buf: 0,
                            len: ls,
                        },
                    );
                    self.emit(
                        ci,
                        Step::WriteSsd {
                            ssd,
                            buf: 0,
                            len: ls,
                        },
                    );
                }
                self.place(slot, key, req.class, &a);
                if is_write {
                    self.set_dirty_mask(slot, key, if wb { self.full_mask } else { 0 });
                }
            }
        }
        let hit = slot.is_some() as u64;
        let c = &mut self.counters[ci];
        c.line_accesses += 1;
        c.line_hits += hit;
        c.line_misses += 1 - hit;
        c.full_hits += hit;
        c.full_misses += 1 - hit;
        c.insertions += 1 - hit;
        c.admitted_misses += 1 - hit;
        if is_write {
            c.write_requests.count(hit, 1 - hit, 0);
            c.writes += 1;
            c.write_bytes += ls;
            c.write_line_accesses += 1;
            c.write_line_hits += hit;
        } else {
            c.read_requests.count(hit, 1 - hit, 0);
            c.reads += 1;
            c.read_bytes += ls;
            c.read_line_accesses += 1;
            c.read_line_hits += hit;
        }
        true
    }

    #[inline(always)]
    fn emit(&mut self, ci: usize, step: Step) {
        if !self.pins.is_empty() {
            self.bump_wgen(&step);
        }
        let (sr, sw, hr, hw) = step.bytes();
        let c = &mut self.counters[ci];
        c.ssd_bytes_read += sr;
        c.ssd_bytes_written += sw;
        c.hdd_bytes_read += hr;
        c.hdd_bytes_written += hw;
        if self.record {
            self.plan.push(step);
        }
    }

    #[inline]
    fn ssd_addr(&self, slot: Slot) -> u64 {
        (slot as u64) << self.line_shift
    }

    fn lines(&self, req: &Request) -> (u64, u64) {
        (
            req.offset >> self.line_shift,
            (req.end() - 1) >> self.line_shift,
        )
    }

    fn trim(&mut self, req: &Request) {
        let ci = req.class as usize;
        if req.len == 0 {
            return;
        }
        let (first, last) = self.lines(req);
        let ls = self.cfg.line_size;
        for l in first..=last {
            let key = Self::line_key(req.volume, l);
            if let Some(slot) = self.lookup(key) {
                let ls_start = l << self.line_shift;
                if self.sectors {
                    self.trim_sectors(ci, req, key, slot, ls_start);
                    continue;
                }
                let full = req.offset <= ls_start && req.end() >= ls_start + ls;
                // A partly trimmed dirty line keeps its other dirty bytes (a line being
                // written back too: a read of them must not go to the backing device yet).
                if full || !(self.is_dirty(slot) || self.pending_mask(slot) != 0) {
                    self.remove(slot, false);
                    self.counters[ci].invalidations += 1;
                    let ssd = self.ssd_addr(slot);
                    self.emit(ci, Step::TrimSsd { ssd, len: ls });
                }
            }
        }
        self.emit(
            ci,
            Step::TrimHdd {
                vol: req.volume,
                hdd: req.offset,
                len: req.len,
            },
        );
    }

    /// Trim of a cached line with sector validity: the whole sectors it covers are dropped
    /// (dirty ones too: their contents are discarded); a line left with none is removed.
    fn trim_sectors(&mut self, ci: usize, req: &Request, key: u64, slot: Slot, line_start: u64) {
        let p = LinePart {
            key,
            line_start,
            lo: req.offset.max(line_start),
            hi: req.end().min(line_start + self.cfg.line_size),
        };
        let (_, whole) = self.sector_masks(&p);
        let (v, d) = (self.valid_mask(slot), self.dirty_mask(slot));
        let base = self.ssd_addr(slot);
        let ss = self.sector_shift;
        if v & !whole == 0 {
            self.remove(slot, false);
            self.counters[ci].invalidations += 1;
            let len = self.cfg.line_size;
            self.emit(ci, Step::TrimSsd { ssd: base, len });
        } else if v & whole != 0 {
            for (a, b) in Runs(v & whole) {
                let (ssd, len) = (base + (a << ss), (b - a) << ss);
                self.emit(ci, Step::TrimSsd { ssd, len });
            }
            self.set_valid(slot, v & !whole);
            self.set_dirty_mask(slot, key, d & !whole);
        }
    }

    /// Sequential cutoff: updates the stream table and says whether this request's misses
    /// bypass.
    fn seq_bypass(&mut self, req: &Request) -> bool {
        if let Some(b) = self.seq_forced {
            return b;
        }
        let threshold = if req.is_write() {
            self.cfg.seq_cutoff.write_bytes
        } else {
            self.cfg.seq_cutoff.read_bytes
        };
        if threshold == 0 {
            return false;
        }
        self.tick += 1;
        let skey = (req.volume as u64) << 1 | req.is_write() as u64;
        let mut lru = 0;
        for i in 0..SEQ_STREAMS {
            let s = &mut self.streams[i];
            if s.used != 0 && s.key == skey && s.next == req.offset {
                s.bytes += req.len;
                s.next = req.end();
                s.used = self.tick;
                return s.bytes >= threshold;
            }
            if s.used < self.streams[lru].used {
                lru = i;
            }
        }
        self.streams[lru] = Stream {
            key: skey,
            next: req.end(),
            bytes: req.len,
            used: self.tick,
        };
        req.len >= threshold
    }

    /// Counts this request against its group and says whether the group's misses are
    /// admitted. Called once per group per request.
    fn group_admits(&mut self, req: &Request, group: u64) -> bool {
        let a = self.cfg.admission;
        let t = if req.is_write() {
            a.write_threshold
        } else {
            a.read_threshold
        };
        match t {
            0 => false,
            1 => true,
            _ => {
                let gkey = Self::line_key(req.volume, group);
                let e = self.group_counts.entry(gkey).or_insert((0, 0));
                let n = if req.is_write() { &mut e.1 } else { &mut e.0 };
                *n = n.saturating_add(1);
                *n >= t
            }
        }
    }

    fn read_write(&mut self, req: &Request) {
        let ci = req.class as usize;
        let is_write = req.is_write();
        {
            let c = &mut self.counters[ci];
            if is_write {
                c.writes += 1;
                c.write_bytes += req.len;
            } else {
                c.reads += 1;
                c.read_bytes += req.len;
            }
        }
        if req.len == 0 {
            self.plan.reset(req.offset, 0);
            let c = &mut self.counters[ci];
            c.full_hits += 1;
            if is_write {
                c.write_requests.hits += 1;
            } else {
                c.read_requests.hits += 1;
            }
            return;
        }
        let (first, last) = self.lines(req);
        let buf_start = first << self.line_shift;
        self.plan
            .reset(buf_start, ((last + 1) << self.line_shift) - buf_start);
        let seq_bypass = self.seq_bypass(req);
        let mode = self.cfg.mode;
        let mode_allocates = if is_write {
            matches!(mode, Mode::WriteThrough | Mode::WriteBack)
        } else {
            mode != Mode::PassThrough
        };
        let (mut hits, mut misses, mut bypassed) = (0u64, 0u64, 0u64);
        let mut cur_group = u64::MAX;
        let mut group_ok = false;
        for l in first..=last {
            let line_start = l << self.line_shift;
            let part = LinePart {
                key: Self::line_key(req.volume, l),
                line_start,
                lo: req.offset.max(line_start),
                hi: req.end().min(line_start + self.cfg.line_size),
            };
            let next_use = match &self.oracle {
                Some(o) => o.get(self.seq as usize).copied().unwrap_or(NEVER),
                None => NEVER,
            };
            let access = Access {
                key: part.key,
                seq: self.seq,
                next_use,
                is_write,
                class: req.class,
            };
            self.seq += 1;
            let group = l >> self.group_lines_shift;
            if group != cur_group && mode_allocates && !seq_bypass && self.cap > 0 {
                cur_group = group;
                group_ok = self.group_admits(req, group);
            }
            let outcome = if is_write {
                self.write_line(req, &part, &access)
            } else {
                self.read_line(req, &part, &access)
            };
            match outcome {
                Outcome::Hit => {
                    hits += 1;
                    continue;
                }
                Outcome::Served { filled } => {
                    misses += 1;
                    let c = &mut self.counters[ci];
                    if filled {
                        c.admitted_misses += 1;
                        c.sector_fills += 1;
                    } else {
                        c.bypasses.add(Bypass::Mode);
                        bypassed += 1;
                    }
                    continue;
                }
                Outcome::Miss => misses += 1,
            }
            // A miss: admit or bypass. A write that would need a fill: part of a line (line
            // validity) or of a sector (sector validity).
            let full = if self.sectors {
                let ss = self.sector_shift;
                (part.lo - part.line_start) & ((1 << ss) - 1) == 0
                    && (part.hi - part.line_start) & ((1 << ss) - 1) == 0
            } else {
                part.lo == part.line_start && part.hi == part.line_start + self.cfg.line_size
            };
            let why = if !mode_allocates {
                Some(Bypass::Mode)
            } else if self.cap == 0 {
                Some(Bypass::NoCapacity)
            } else if seq_bypass {
                Some(Bypass::SeqCutoff)
            } else if !group_ok {
                Some(Bypass::Admission)
            } else if is_write && !full && !self.cfg.partial_write_fill {
                Some(Bypass::PartialWrite)
            } else if self.class_gate
                && (!self.class_admits(req.volume, req.class) || self.displaces_dirty_peer(ci))
            {
                Some(Bypass::Class)
            } else if (self.dirty_evictions_blocked && !self.room_without_dirty_eviction())
                || (!is_write && self.read_admission_blocked)
            {
                Some(Bypass::NoCapacity)
            } else {
                None
            };
            match why {
                Some(why) => {
                    self.counters[ci].bypasses.add(why);
                    bypassed += 1;
                    self.bypass_line(req, &part);
                }
                None => {
                    if self.admit_line(req, &part, &access) {
                        self.counters[ci].admitted_misses += 1;
                        if self.group_lines_shift > 0 {
                            self.populate_group(req, group, first, last);
                        }
                    } else {
                        // Every victim the policy offered is being written back.
                        self.inflight.bypass_pinned += 1;
                        self.counters[ci].bypasses.add(Bypass::NoCapacity);
                        bypassed += 1;
                        self.bypass_line(req, &part);
                    }
                }
            }
        }
        let c = &mut self.counters[ci];
        c.line_accesses += hits + misses;
        c.line_hits += hits;
        c.line_misses += misses;
        if is_write {
            c.write_line_accesses += hits + misses;
            c.write_line_hits += hits;
            c.write_requests.count(hits, misses, bypassed);
        } else {
            c.read_line_accesses += hits + misses;
            c.read_line_hits += hits;
            c.read_requests.count(hits, misses, bypassed);
        }
        if misses == 0 {
            c.full_hits += 1;
        } else if hits == 0 {
            c.full_misses += 1;
        } else {
            c.partial_hits += 1;
        }
    }

    /// Serves a read of one line from the cache if it can.
    #[inline]
    fn read_line(&mut self, req: &Request, p: &LinePart, a: &Access) -> Outcome {
        let ci = req.class as usize;
        match self.lookup(p.key) {
            Some(slot)
                if self.cfg.mode != Mode::PassThrough
                    || self.is_dirty(slot)
                    || self.pending_mask(slot) != 0 =>
            {
                self.policy.hit(slot, a);
                if self.sectors {
                    let (m, _) = self.sector_masks(p);
                    let v = self.valid_mask(slot);
                    if v & m != m {
                        return self.read_sectors(req, p, slot, m, v);
                    }
                }
                let ssd = self.ssd_addr(slot) + (p.lo - p.line_start);
                let buf = p.lo - self.plan.buf_start;
                self.emit(
                    ci,
                    Step::ReadSsd {
                        ssd,
                        buf,
                        len: p.hi - p.lo,
                    },
                );
                Outcome::Hit
            }
            Some(_) => Outcome::Miss, // pass-through: clean cached lines are read from the HDD
            None => {
                self.policy.miss(a);
                Outcome::Miss
            }
        }
    }

    /// A read of a cached line that lacks some requested sectors: the valid ones come from
    /// the SSD, the rest from the HDD; unless in pass-through, all the line's absent sectors
    /// are read and filled in, so the line is whole afterwards.
    fn read_sectors(&mut self, req: &Request, p: &LinePart, slot: Slot, m: u64, v: u64) -> Outcome {
        let ci = req.class as usize;
        let fill = self.cfg.mode != Mode::PassThrough;
        let (ss, base, bs) = (self.sector_shift, self.ssd_addr(slot), self.plan.buf_start);
        for (a, b) in Runs(m & v) {
            let lo = p.lo.max(p.line_start + (a << ss));
            let hi = p.hi.min(p.line_start + (b << ss));
            let (ssd, buf, len) = (base + (lo - p.line_start), lo - bs, hi - lo);
            self.emit(ci, Step::ReadSsd { ssd, buf, len });
        }
        let absent = if fill { self.full_mask & !v } else { m & !v };
        for (a, b) in Runs(absent) {
            let (mut lo, mut hi) = (p.line_start + (a << ss), p.line_start + (b << ss));
            if !fill {
                (lo, hi) = (lo.max(p.lo), hi.min(p.hi));
            }
            let (vol, buf, len) = (req.volume, lo - bs, hi - lo);
            self.emit(
                ci,
                Step::ReadHdd {
                    vol,
                    hdd: lo,
                    buf,
                    len,
                },
            );
            if fill {
                let ssd = base + (lo - p.line_start);
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
            }
        }
        if fill {
            self.set_valid(slot, self.full_mask);
        }
        Outcome::Served { filled: fill }
    }

    /// Sector validity: reads from the HDD the parts of the partly written sectors at either
    /// end of `[p.lo, p.hi)` that the slot lacks (`lacking`), around the client's bytes.
    fn fill_edges(&mut self, ci: usize, vol: u32, p: &LinePart, slot: Slot, lacking: u64) {
        let ss = self.sector_shift;
        let unit = 1u64 << ss;
        let ssd = self.ssd_addr(slot);
        let first = p.lo & !(unit - 1);
        if p.lo > first && lacking >> ((first - p.line_start) >> ss) & 1 == 1 {
            let (hdd, len) = (first, p.lo - first);
            let ssd = ssd + (first - p.line_start);
            self.emit(ci, Step::Populate { vol, hdd, ssd, len });
        }
        let last = (p.hi - 1) & !(unit - 1);
        let end = last + unit;
        if p.hi < end && lacking >> ((last - p.line_start) >> ss) & 1 == 1 {
            let (hdd, len) = (p.hi, end - p.hi);
            let ssd = ssd + (p.hi - p.line_start);
            self.emit(ci, Step::Populate { vol, hdd, ssd, len });
        }
    }

    /// Handles a write to one line if it is cached (then it counts as a hit).
    fn write_line(&mut self, req: &Request, p: &LinePart, a: &Access) -> Outcome {
        let ci = req.class as usize;
        let Some(slot) = self.lookup(p.key) else {
            self.policy.miss(a);
            return Outcome::Miss;
        };
        self.remirror_written(slot);
        if self.sectors {
            return self.write_sectors(req, p, a, slot);
        }
        let full = p.lo == p.line_start && p.hi == p.line_start + self.cfg.line_size;
        let len = p.hi - p.lo;
        let ssd = self.ssd_addr(slot) + (p.lo - p.line_start);
        let buf = p.lo - self.plan.buf_start;
        let hdd_write = Step::WriteHdd {
            vol: req.volume,
            hdd: p.lo,
            buf,
            len,
        };
        let mirrored = match self.cfg.mode {
            Mode::WriteBack if self.mirrors() => {
                let fill = if self.is_dirty(slot) {
                    0
                } else {
                    self.full_mask
                };
                match self.mirror_for_write(ci, slot, fill) {
                    Mirror::Through(copy) => {
                        debug_assert!(copy.is_none(), "line validity: only a clean line");
                        self.counters[ci].bypasses.add(Bypass::NoCopy);
                        self.emit(ci, hdd_write);
                        self.emit(ci, Step::WriteSsd { ssd, buf, len });
                    }
                    m => {
                        self.emit(ci, Step::WriteSsd { ssd, buf, len });
                        if let Mirror::Copy(c, fill) = m {
                            self.emit_copy(ci, req.volume, p, c, fill);
                        }
                        self.set_dirty(slot, p.key, true);
                        if let Mirror::Copy(c, _) = m {
                            self.link_copy(slot, c);
                        }
                    }
                }
                true
            }
            Mode::WriteBack => {
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                self.set_dirty(slot, p.key, true);
                false
            }
            Mode::WriteThrough | Mode::WriteAround => {
                self.emit(ci, hdd_write);
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                if full {
                    self.set_dirty(slot, p.key, false);
                }
                false
            }
            Mode::ReadOnly | Mode::PassThrough => {
                if full || !(self.is_dirty(slot) || self.pending_mask(slot) != 0) {
                    // The caller sends the write to the HDD as a bypass.
                    self.remove(slot, false);
                    self.counters[ci].invalidations += 1;
                    return Outcome::Miss;
                }
                // Part of a dirty line: keep the cached copy whole and current.
                self.emit(ci, hdd_write);
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                false
            }
        };
        if !mirrored {
            self.write_copy_too(ci, req.volume, p, slot);
        }
        self.policy.hit(slot, a);
        Outcome::Hit
    }

    /// [`Engine::write_line`] with sector validity: the written sectors become valid; the
    /// partly written ones at the ends are filled first if the slot lacks them.
    fn write_sectors(&mut self, req: &Request, p: &LinePart, a: &Access, slot: Slot) -> Outcome {
        let ci = req.class as usize;
        let (m, whole) = self.sector_masks(p);
        let (v, d) = (self.valid_mask(slot), self.dirty_mask(slot));
        let (len, buf) = (p.hi - p.lo, p.lo - self.plan.buf_start);
        let ssd = self.ssd_addr(slot) + (p.lo - p.line_start);
        let vol = req.volume;
        let hdd_write = Step::WriteHdd {
            vol,
            hdd: p.lo,
            buf,
            len,
        };
        let mut mirrored = false;
        let mut link = None;
        let dirty = match self.cfg.mode {
            Mode::WriteBack if self.mirrors() => {
                mirrored = true;
                match self.mirror_for_write(ci, slot, m & !whole & !d) {
                    Mirror::Through(copy) => {
                        self.counters[ci].bypasses.add(Bypass::NoCopy);
                        self.emit(ci, hdd_write);
                        self.emit(ci, Step::WriteSsd { ssd, buf, len });
                        if let Some(c) = copy {
                            self.emit_copy(ci, vol, p, c, 0);
                        }
                        d & !whole
                    }
                    mir => {
                        self.emit(ci, Step::WriteSsd { ssd, buf, len });
                        if let Mirror::Copy(c, fill) = mir {
                            self.emit_copy(ci, vol, p, c, fill);
                            link = Some(c);
                        }
                        d | m
                    }
                }
            }
            Mode::WriteBack => {
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                d | m
            }
            Mode::WriteThrough | Mode::WriteAround => {
                self.emit(ci, hdd_write);
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                d & !whole
            }
            Mode::ReadOnly | Mode::PassThrough => {
                if (d | self.pending_mask(slot)) & !whole == 0 {
                    // Nothing newer than the HDD survives this write: drop the line.
                    self.remove(slot, false);
                    self.counters[ci].invalidations += 1;
                    return Outcome::Miss;
                }
                // Dirty sectors stay: keep the cached copy current.
                self.emit(ci, hdd_write);
                self.emit(ci, Step::WriteSsd { ssd, buf, len });
                d & !whole
            }
        };
        self.fill_edges(ci, vol, p, slot, m & !whole & !v);
        if !mirrored {
            self.write_copy_too(ci, vol, p, slot);
        }
        self.set_valid(slot, v | m);
        self.set_dirty_mask(slot, p.key, dirty);
        if let Some(c) = link {
            self.link_copy(slot, c);
        }
        self.policy.hit(slot, a);
        Outcome::Hit
    }

    /// A missed line that is not admitted: straight to or from the backing device.
    fn bypass_line(&mut self, req: &Request, p: &LinePart) {
        let ci = req.class as usize;
        let buf = p.lo - self.plan.buf_start;
        let (vol, hdd, len) = (req.volume, p.lo, p.hi - p.lo);
        let step = if req.is_write() {
            Step::WriteHdd { vol, hdd, buf, len }
        } else {
            Step::ReadHdd { vol, hdd, buf, len }
        };
        self.emit(ci, step);
    }

    /// A missed line that is admitted: fetch what is needed, write the whole line to its slot.
    /// `false`, having planned nothing, when no slot can be had (only while write-backs are
    /// in flight: every victim the policy offered is pinned).
    fn admit_line(&mut self, req: &Request, p: &LinePart, a: &Access) -> bool {
        let ci = req.class as usize;
        let ls = self.cfg.line_size;
        let vol = req.volume;
        let Some(slot) = self.alloc_slot(ci, vol) else {
            debug_assert!(
                !self.pins.is_empty(),
                "no slot without a write-back in flight"
            );
            return false;
        };
        let line_buf = p.line_start - self.plan.buf_start;
        let ssd = self.ssd_addr(slot);
        let mut copy = None;
        let dirty = if req.is_write() {
            // The client's part goes to the slot; the rest of the line is copied from the HDD
            // (population, which an executor may finish in the background: the line is
            // complete once the plan has run).
            let mut wb = self.cfg.mode == Mode::WriteBack;
            if wb && self.mirrors() {
                // The copy gets the same bytes: the client's part, and what is filled from
                // the HDD of the sectors the line has dirty (the whole line with line
                // validity, the partly written end sectors with sector validity).
                copy = self.alloc_copy(ci, slot);
                if copy.is_none() {
                    self.counters[ci].bypasses.add(Bypass::NoCopy);
                    wb = false;
                }
            }
            let buf = p.lo - self.plan.buf_start;
            let len = p.hi - p.lo;
            if !wb {
                self.emit(
                    ci,
                    Step::WriteHdd {
                        vol,
                        hdd: p.lo,
                        buf,
                        len,
                    },
                );
            }
            self.emit(
                ci,
                Step::WriteSsd {
                    ssd: ssd + (p.lo - p.line_start),
                    buf,
                    len,
                },
            );
            if self.sectors {
                // Only the partly written sectors at the ends need the HDD.
                let (m, whole) = self.sector_masks(p);
                self.fill_edges(ci, vol, p, slot, m & !whole);
            } else if p.lo > p.line_start {
                let len = p.lo - p.line_start;
                self.emit(
                    ci,
                    Step::Populate {
                        vol,
                        hdd: p.line_start,
                        ssd,
                        len,
                    },
                );
            }
            if !self.sectors && p.hi < p.line_start + ls {
                let len = p.line_start + ls - p.hi;
                let off = p.hi - p.line_start;
                self.emit(
                    ci,
                    Step::Populate {
                        vol,
                        hdd: p.hi,
                        ssd: ssd + off,
                        len,
                    },
                );
            }
            if let Some(c) = copy {
                let fill = if self.sectors {
                    let (m, whole) = self.sector_masks(p);
                    m & !whole
                } else {
                    self.full_mask
                };
                self.emit_copy(ci, vol, p, c, fill);
            }
            wb
        } else {
            self.emit(
                ci,
                Step::ReadHdd {
                    vol,
                    hdd: p.line_start,
                    buf: line_buf,
                    len: ls,
                },
            );
            self.emit(
                ci,
                Step::WriteSsd {
                    ssd,
                    buf: line_buf,
                    len: ls,
                },
            );
            false
        };
        self.place(slot, p.key, req.class, a);
        self.counters[ci].insertions += 1;
        if req.is_write() && self.sectors {
            let (m, _) = self.sector_masks(p);
            self.set_valid(slot, m);
            self.set_dirty_mask(slot, p.key, if dirty { m } else { 0 });
        } else if dirty {
            self.set_dirty(slot, p.key, true);
        }
        if let Some(c) = copy {
            debug_assert!(self.is_dirty(slot), "a copy for a clean line");
            self.link_copy(slot, c);
        }
        true
    }

    /// Group population: the group's lines outside this request that are not cached are copied
    /// from the HDD to the SSD. Runs once per admitted group per request (the first admitted
    /// line of the group triggers it; later lines find the group populated).
    fn populate_group(&mut self, req: &Request, group: u64, first: u64, last: u64) {
        let ci = req.class as usize;
        let g_first = group << self.group_lines_shift;
        let mut g_last = g_first + (1 << self.group_lines_shift) - 1;
        if let Some(vb) = self.volume_end(req.volume) {
            let max_line = vb.div_ceil(self.cfg.line_size).saturating_sub(1);
            g_last = g_last.min(max_line);
        }
        let ls = self.cfg.line_size;
        for l in g_first..=g_last {
            if (first..=last).contains(&l) {
                continue;
            }
            let key = Self::line_key(req.volume, l);
            if self.lookup(key).is_some() {
                continue;
            }
            if self.dirty_evictions_blocked && !self.room_without_dirty_eviction() {
                continue;
            }
            let Some(slot) = self.alloc_slot(ci, req.volume) else {
                continue;
            };
            let hdd = l << self.line_shift;
            let ssd = self.ssd_addr(slot);
            self.emit(
                ci,
                Step::Populate {
                    vol: req.volume,
                    hdd,
                    ssd,
                    len: ls,
                },
            );
            let a = Access {
                key,
                seq: self.seq,
                next_use: NEVER,
                is_write: false,
                class: req.class,
            };
            self.place(slot, key, req.class, &a);
            self.counters[ci].insertions += 1;
        }
    }

    /// Takes a free slot, evicting (and writing back) a victim when the cache is full.
    /// `None` (nothing changed but the policy's search state) only while write-backs are in
    /// flight, when no unpinned victim is found.
    fn alloc_slot(&mut self, ci: usize, vol: u32) -> Option<Slot> {
        if self.class_gate {
            self.policy.for_volume(vol);
        }
        if self.dirty_evictions_blocked {
            return self.alloc_slot_clean(ci);
        }
        if self.class_gate && self.len > 0 && self.policy.at_limit(ci as u8) {
            return self.evict_for_class(ci);
        }
        // A full cache (every slot holds a line: `len` counts them) has no free slot, so the
        // free list's checks are skipped on every miss of a warm cache (~28 instructions per
        // miss, session 29).
        if self.len < self.cap {
            if let Some(s) = self.free_slot() {
                return Some(s);
            }
        }
        let mut victim = if self.class_gate {
            self.policy.victim_for(ci as u8, &self.dirty)
        } else {
            self.policy.victim()
        };
        if self.cfg.clean_victim_window > 0 && self.is_dirty(victim) {
            if let Some(c) = self.clean_candidate() {
                victim = c;
            }
        }
        if self.is_pinned(victim) {
            victim = self.unpinned_victim()?;
        }
        let key = self.keys.at(victim as usize);
        debug_assert!(
            key != EMPTY,
            "policy {} chose empty slot {victim}",
            self.policy.name()
        );
        if self.is_dirty(victim) {
            self.write_back(ci, victim, key);
            self.counters[ci].dirty_evictions += 1;
        }
        self.counters[ci].evictions += 1;
        self.unmap(victim, true);
        Some(victim)
    }

    /// The victim chosen is being written back: the policy's first unpinned likely victim
    /// instead (a clean one first when clean victims are preferred); `None` when it names
    /// none (policies without a hint, or every candidate pinned): the miss is bypassed.
    #[cold]
    fn unpinned_victim(&mut self) -> Option<Slot> {
        let mut hint = std::mem::take(&mut self.cand_buf);
        hint.clear();
        // Among this many distinct cached slots at least one is unpinned. Class-aware
        // policies (DSS) look a little further for a clean one: their lines next to the
        // pinned ones are the lowest class's, written a moment ago (issue 18: a large file
        // written while its first lines' write-backs were in flight evicted 70 % of its
        // lines dirty, LRU none).
        let window = if self.class_gate {
            self.cfg.clean_victim_window.max(CLASS_CLEAN_WINDOW)
        } else {
            self.cfg.clean_victim_window
        };
        let n = self.pins.len() + 1 + window as usize;
        self.policy.eviction_candidates(n, &mut hint);
        let usable = |s: Slot| self.keys.at(s as usize) != EMPTY && !self.is_pinned(s);
        let clean = (window > 0)
            .then(|| {
                hint.iter()
                    .copied()
                    .find(|&s| usable(s) && !self.is_dirty(s))
            })
            .flatten();
        let found = clean.or_else(|| hint.iter().copied().find(|&s| usable(s)));
        self.cand_buf = hint;
        if found.is_some() {
            self.inflight.victim_pinned += 1;
        }
        found
    }

    /// Whether a line of class `ci` could be cached only by evicting a dirty line the policy
    /// values at least as much (class-aware policies, [`Policy::dirty_peer_victim`]). DSS
    /// falls back to such a victim when no clean line of the incoming priority or lower is
    /// near its lists' tails, e.g. while a large file (the lowest priority) is written into a
    /// cache of higher-priority lines: its list then holds only the lines the request has
    /// just written, and each of its lines evicted the one before, dirty (issue 18). Writing
    /// the line around the cache costs the one HDD write that write-back would have.
    fn displaces_dirty_peer(&mut self, ci: usize) -> bool {
        if self.has_free_slot() || self.dirty_count == 0 || self.policy.at_limit(ci as u8) {
            return false;
        }
        self.policy.dirty_peer_victim(ci as u8, &self.dirty)
            && !(self.cfg.clean_victim_window > 0 && self.clean_candidate().is_some())
    }

    /// The first clean line among the policy's next `clean_victim_window` likely victims
    /// (the victim it named is dirty: evicting a clean one instead needs no write-back).
    #[cold]
    fn clean_candidate(&mut self) -> Option<Slot> {
        let mut hint = std::mem::take(&mut self.cand_buf);
        hint.clear();
        self.policy
            .eviction_candidates(self.cfg.clean_victim_window as usize, &mut hint);
        // A line being written back is clean but pinned: not a candidate.
        let found = hint.iter().copied().find(|&s| {
            self.keys.at(s as usize) != EMPTY && !self.is_dirty(s) && !self.is_pinned(s)
        });
        self.cand_buf = hint;
        found
    }

    /// A slot that holds no line (the free list, then never-used slots), if any.
    #[inline]
    fn free_slot(&mut self) -> Option<Slot> {
        self.slots.pop(&self.keys)
    }

    /// [`Engine::alloc_slot`] while dirty evictions are blocked: a free slot, else the
    /// policy's likeliest clean victim (also for a class at its partition limit: a clean
    /// line of its own if the policy names one, else any clean line). The caller checked
    /// [`Engine::room_without_dirty_eviction`].
    #[cold]
    fn alloc_slot_clean(&mut self, ci: usize) -> Option<Slot> {
        if self.class_gate && self.len > 0 && self.policy.at_limit(ci as u8) {
            let v = self.policy.victim_for(ci as u8, &self.dirty);
            if self.keys.at(v as usize) != EMPTY && !self.is_dirty(v) && !self.is_pinned(v) {
                self.counters[ci].evictions += 1;
                self.remove(v, true);
                return Some(self.slots.take_pushed(v));
            }
        }
        if let Some(s) = self.free_slot() {
            return Some(s);
        }
        let Some(victim) = self.clean_victim() else {
            // Lines being written back count as clean but are pinned.
            assert!(
                !self.pins.is_empty(),
                "blocked dirty evictions: the caller checked for a clean line"
            );
            return None;
        };
        assert!(
            !self.is_dirty(victim),
            "dirty evictions are blocked but slot {victim} is dirty"
        );
        self.counters[ci].evictions += 1;
        self.unmap(victim, true);
        Some(victim)
    }

    /// A class at its partition maximum replaces one of its own lines even when slots are free
    /// (`None` when that line is being written back: the miss is bypassed).
    fn evict_for_class(&mut self, ci: usize) -> Option<Slot> {
        let victim = self.policy.victim_for(ci as u8, &self.dirty);
        if self.is_pinned(victim) {
            return None;
        }
        let key = self.keys.at(victim as usize);
        if self.is_dirty(victim) {
            self.write_back(ci, victim, key);
            self.counters[ci].dirty_evictions += 1;
        }
        self.counters[ci].evictions += 1;
        self.remove(victim, true);
        Some(self.slots.take_pushed(victim))
    }

    /// The steps of a whole-line write on the fast path: the disk too unless write-back,
    /// then the cache.
    #[inline]
    fn emit_whole_line_write(&mut self, ci: usize, vol: u32, hdd: u64, ssd: u64, wb: bool) {
        let len = self.cfg.line_size;
        if !wb {
            self.emit(
                ci,
                Step::WriteHdd {
                    vol,
                    hdd,
                    buf: 0,
                    len,
                },
            );
        }
        self.emit(ci, Step::WriteSsd { ssd, buf: 0, len });
    }

    fn write_back(&mut self, ci: usize, slot: Slot, key: u64) {
        let vol = (key >> LINE_BITS) as u32;
        let line = key & ((1 << LINE_BITS) - 1);
        let ssd = self.ssd_addr(slot);
        let hdd = line << self.line_shift;
        let ss = self.sector_shift;
        let dirty = self.dirty_mask(slot);
        for (a, b) in Runs(dirty) {
            let (off, len) = (a << ss, (b - a) << ss);
            let (ssd, hdd) = (ssd + off, hdd + off);
            self.emit(ci, Step::WriteBack { vol, ssd, hdd, len });
        }
        self.counters[ci].write_backs += 1;
        if self.per_volume && !self.in_request {
            let bytes = u64::from(dirty.count_ones()) << ss;
            self.count_volume_cleaning(vol, bytes, (0, bytes), 1);
        }
        if self.capturing {
            self.capture(slot, key, dirty);
        }
        self.set_dirty_mask(slot, key, 0);
    }

    fn place(&mut self, slot: Slot, key: u64, class: u8, a: &Access) {
        assert!(
            !self.is_pinned(slot),
            "slot {slot} is reused while a write-back reads it"
        );
        self.journal_touch(slot);
        self.keys.set(slot as usize, key);
        self.set_line_class(slot, class);
        self.set_valid(slot, self.full_mask);
        self.map.insert(key, slot);
        self.len += 1;
        self.policy.insert(slot, a);
    }

    /// Drops the line in `slot`; the slot goes to the free list (or, while a write-back
    /// reads it, becomes a zombie, freed when the write-back completes).
    fn remove(&mut self, slot: Slot, evicted: bool) {
        // `free` may still list this slot from before a restore into it (`free_stale`):
        // drop the stale entries first, or the slot would be listed twice once freed and
        // handed out to two lines (the second placed over the first without unlinking it
        // from the index, which then loses the lines chained behind it: a trim after a warm
        // restart did this, and a write missed its cached dirty line).
        self.slots.drop_stale(&self.keys);
        self.unmap(slot, evicted);
        if !self.pins.is_empty() {
            if let Some(p) = self.pins.get_mut(&slot) {
                debug_assert!(!p.zombie, "slot {slot} dropped twice");
                p.zombie = true;
                self.zombies += 1;
                return;
            }
        }
        self.slots.push(slot);
    }

    /// Drops the line in `slot`, leaving the slot to the caller.
    #[inline]
    fn unmap(&mut self, slot: Slot, evicted: bool) {
        self.journal_touch(slot);
        assert!(
            !evicted || !self.is_pinned(slot),
            "slot {slot} is evicted while a write-back reads it"
        );
        let key = self.keys.at(slot as usize);
        if self.is_dirty(slot) {
            self.set_dirty_mask(slot, key, 0);
        }
        if !self.remirroring.is_empty() {
            self.remirroring.remove(&slot);
        }
        self.set_valid(slot, 0);
        self.policy.remove(slot, key, evicted);
        let found = self.map.remove(key, slot);
        debug_assert!(found, "slot {slot} not in the map");
        self.keys.set(slot as usize, EMPTY);
        self.len -= 1;
        if self.track_unmapped {
            self.unmapped.push(key);
        }
    }

    fn set_dirty(&mut self, slot: Slot, key: u64, on: bool) {
        let (w, b) = (slot as usize / 64, slot % 64);
        let was = self.dirty[w] >> b & 1 == 1;
        if was == on {
            return;
        }
        self.journal_touch(slot);
        if on {
            self.dirty[w] |= 1 << b;
            self.dirty_count += 1;
            self.dirty_win.dirtied(key);
            self.cleaner.dirtied(key, self.clock);
        } else {
            self.dirty[w] &= !(1 << b);
            self.dirty_count -= 1;
            self.dirty_win.cleaned(key);
            self.cleaner.cleaned(key);
            if !self.copy_of.is_empty() {
                // A clean line has no copy: its bytes are on the backing device.
                self.unmirror(slot);
            }
        }
    }

    /// Fewest keys the cleaners' LBA window keeps: [`MIN_DIRTY_BATCH`], and a chunk (a
    /// rewrite's or ACP's) fits in one window.
    fn dirty_min_batch(&self) -> usize {
        MIN_DIRTY_BATCH
            .max((self.cfg.rewrite_chunk >> self.line_shift) as usize)
            .max(1 << self.cfg.acp_chunk_lines_shift())
    }

    /// Whether dirty lines exceed the high watermark (write-back cleaning is due).
    /// With `alru` cleaning also when a line has been dirty for more than `cleaning_age`
    /// requests.
    /// Class-aware policies (DSS) also when one of the next `CLEAN_AHEAD / 2` victims is dirty: see
    /// [`CLEAN_AHEAD`].
    pub fn needs_cleaning(&self) -> bool {
        self.dirty_count > 0
            && (self.dirty_load() as f64 > self.cfg.dirty_high * self.cap as f64
                || self.cleaner.due(self.clock, 1) > 0
                || self.ahead_due())
    }

    /// Lines a class-aware policy cleans ahead of its evictions: [`CLEAN_AHEAD`], or where
    /// the policy tracks positions ([`crate::policy::Policy::ahead_since_mark`]) the clean
    /// share the watermarks keep, `(1 - dirty_high)` of the cache, whichever is more (issue
    /// 18: 4 MiB ahead was less than the HDD's lag behind the SSD, so DSS's victims were
    /// still being written back, or dirty past them, when their turn came).
    fn ahead_window(&self) -> usize {
        if self.policy.ahead_since_mark().is_none() {
            return CLEAN_AHEAD;
        }
        let share = ((1.0 - self.cfg.dirty_high) * self.cap as f64) as usize;
        share.max(CLEAN_AHEAD).min(self.cap as usize)
    }

    /// Whether clean-ahead is due: one of the next half window of victims may be dirty.
    /// Where the policy tracks positions, only once the lines found clean at the last look
    /// reach less than half the window ahead (no walk on most requests).
    fn ahead_due(&self) -> bool {
        if !self.class_gate || self.has_free_slot() || self.dirty_count == 0 {
            return false;
        }
        let w = self.ahead_window();
        if let Some((touched, unlinked)) = self.policy.ahead_since_mark() {
            let known = self.ahead_depth.get().saturating_sub(unlinked).min(touched);
            if known >= (w / 2) as u64 {
                return false;
            }
            return self.dirty_ahead(w) > 0;
        }
        self.dirty_ahead(CLEAN_AHEAD / 2) > 0
    }

    /// Dirty lines among the next `n` lines a class-aware policy would evict once the cache
    /// is full (0 for other policies, or while slots are free). Notes how far ahead the
    /// lines are clean ([`Engine::note_ahead`]).
    fn dirty_ahead(&self, n: usize) -> u64 {
        if !self.class_gate || self.has_free_slot() || self.dirty_count == 0 {
            return 0;
        }
        let mut hint = self.ahead_buf.take();
        hint.clear();
        self.policy.eviction_candidates(n, &mut hint);
        let dirty = |s: Slot| self.keys.at(s as usize) != EMPTY && self.is_dirty(s);
        let d = hint.iter().filter(|&&s| dirty(s)).count() as u64;
        self.note_ahead(hint.iter().position(|&s| dirty(s)).unwrap_or(hint.len()));
        self.ahead_buf.set(hint);
        d
    }

    /// The next `clean` victims were just seen clean (or being written back).
    fn note_ahead(&self, clean: usize) {
        self.ahead_depth.set(clean as u64);
        self.policy.ahead_mark();
    }

    /// Lines cleaning would write back now to get down to the low watermark (with `alru`
    /// cleaning at least the lines dirty for more than `cleaning_age` requests).
    pub fn cleaning_target(&self) -> u64 {
        let low = (self.cfg.dirty_low * self.cap as f64).floor() as u64;
        // Slots of dirty data: each line cleaned frees its copy too.
        let over = self
            .dirty_load()
            .saturating_sub(low)
            .div_ceil(u64::from(self.cfg.dirty_copies));
        over.max(self.cleaner.due(self.clock, self.dirty_count))
            .max(self.dirty_ahead(self.ahead_window()))
    }

    /// The engine's logical clock: requests processed plus [`Engine::advance_clock`].
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Advances the logical clock by `n` (a driver passing idle time in, in requests'
    /// worth), so that `alru` staleness also counts time without requests.
    pub fn advance_clock(&mut self, n: u64) {
        self.clock += n;
    }

    /// The cleaning policy's name.
    pub fn cleaning_name(&self) -> &'static str {
        self.cleaner.name()
    }

    /// Rebuilds the cleaner from the configuration and the dirty set (after a change of
    /// `cleaning`, `cleaning_age` or the ACP chunk); lines count as dirty since now.
    fn rebuild_cleaner(&mut self) {
        let c = &self.cfg;
        self.cleaner = cleaning::make(c.cleaning, c.acp_chunk_lines_shift(), c.cleaning_age);
        for s in cleaning::set_bits(&self.dirty) {
            self.cleaner.dirtied(self.keys.at(s), self.clock);
        }
    }

    /// Writes back up to `max_lines` dirty lines in LBA order (continuing where the last pass
    /// stopped) and returns the plan. Counted against the class each line was cached for.
    ///
    /// **Chunk rewrite**: when the disk chunk (`rewrite_chunk`) of the next dirty line holds
    /// at least `rewrite_min_runs` runs of dirty lines from that line on, and they fit in
    /// what is left of `max_lines`, the chunk from that line on (clamped to `volume_bytes`;
    /// without it the volume must end on a chunk boundary) becomes one run of
    /// consecutive steps contiguous on the backing device: `WriteBack`s of every cached
    /// line's valid sectors (dirty ones and clean copies, which equal the backing bytes) and
    /// `CopyHdd`s for the rest, which the executor merges into one backing write. The lines
    /// cleaned are those LBA order would clean anyway: only the steps differ.
    ///
    /// **Clean ahead** (class-aware policies): first the dirty lines among the next
    /// [`CLEAN_AHEAD`] lines the policy would evict, in eviction order.
    ///
    /// This is [`Engine::begin_clean`] followed at once by [`Engine::complete_writeback`]:
    /// for an executor that runs the plan before its next request.
    pub fn clean(&mut self, max_lines: u64) -> &Plan {
        if let Some(t) = self.begin_clean(max_lines).map(|b| b.ticket) {
            self.complete_writeback(t, &[]);
        }
        &self.plan
    }

    /// Plans what [`Engine::clean`] plans, as a write-back in flight: the lines are clean for
    /// the cleaner and the counts from now on (so the next begin picks others), but their
    /// slots are pinned and their sectors pending until [`Engine::complete_writeback`], so
    /// requests processed meanwhile can neither reuse a slot the executor reads nor lose a
    /// sector written meanwhile. `None` (an empty plan) when there is nothing to clean.
    pub fn begin_clean(&mut self, max_lines: u64) -> Option<WbBatch<'_>> {
        self.plan.reset(0, 0);
        self.open_ticket();
        let mut done = self.clean_ahead(max_lines);
        while done < max_lines && self.dirty_count > 0 {
            let key = self.cleaner.next(&mut dirty_keys!(self));
            debug_assert!(
                self.lookup(key).is_some_and(|s| self.is_dirty(s)),
                "cleaner chose a clean line"
            );
            if let Some(n) = self.rewrite_chunk(key, max_lines - done) {
                done += n;
                continue;
            }
            let slot = self.lookup(key).expect("dirty line is cached");
            let ci = self.line_class(slot) as usize;
            self.write_back(ci, slot, key);
            self.cleaner.advance(key.wrapping_add(1));
            done += 1;
        }
        self.close_ticket()
    }

    /// Starts the ticket a begin fills (`capturing`).
    fn open_ticket(&mut self) {
        debug_assert!(!self.capturing, "a begin inside a begin");
        let mut t = self.ticket_pool.pop().unwrap_or_default();
        t.lines.clear();
        t.spans.clear();
        self.next_ticket = self.next_ticket.wrapping_add(1);
        t.id = self.next_ticket;
        self.tickets.push(t);
        self.capturing = true;
    }

    /// Pins `slot` for the ticket being planned; `pending` are the sectors it cleans.
    fn capture(&mut self, slot: Slot, key: u64, pending: u64) {
        self.journal_touch(slot);
        let class = self.line_class(slot);
        let pin = self.pins.entry(slot).or_default();
        debug_assert!(!pin.zombie, "slot {slot} was dropped but is written back");
        pin.count = pin.count.checked_add(1).expect("pins of one slot overflow");
        pin.pending |= pending;
        let wgen = pin.wgen;
        // The copy leaves the line (clean from now on) but is held for the write-back.
        let copy = if pending != 0 && !self.copy_of.is_empty() {
            self.detach_copy(slot)
        } else {
            None
        };
        let t = self.tickets.last_mut().expect("capturing into a ticket");
        t.lines.push(WbLine {
            slot,
            key,
            pending,
            wgen,
            class,
            copy,
        });
    }

    /// Ends a begin: the ticket's spans from the plan; `None` when it pinned nothing.
    fn close_ticket(&mut self) -> Option<WbBatch<'_>> {
        self.capturing = false;
        let mut t = self.tickets.pop().expect("a ticket is open");
        if t.lines.is_empty() {
            debug_assert!(self.plan.steps.is_empty() || !self.record);
            self.ticket_pool.push(t);
            return None;
        }
        for s in &self.plan.steps {
            let (vol, hdd, len) = match *s {
                Step::WriteBack { vol, hdd, len, .. } | Step::CopyHdd { vol, hdd, len } => {
                    (vol, hdd, len)
                }
                _ => continue,
            };
            match t.spans.last_mut() {
                Some(l) if l.0 == vol && l.1 + l.2 == hdd => l.2 += len,
                _ => t.spans.push((vol, hdd, len)),
            }
        }
        self.tickets.push(t);
        self.update_fast_path();
        let t = self.tickets.last().expect("just pushed");
        Some(WbBatch {
            ticket: WbTicket(t.id),
            plan: &self.plan,
            lines: &t.lines,
            spans: &t.spans,
        })
    }

    /// Ends a write-back in flight. The executor names the slots whose write-back failed
    /// (their pending sectors become dirty again, as if never cleaned); every other line's
    /// pending sectors are clean now, except that sectors written since begin simply stay
    /// dirty (they were never pending). A line dropped meanwhile (a full trim) frees its
    /// slot here. Panics on a ticket not in flight (a bug in the executor).
    pub fn complete_writeback(&mut self, t: WbTicket, failed: &[Slot]) -> WbDone {
        let i = self
            .tickets
            .iter()
            .position(|e| e.id == t.0)
            .unwrap_or_else(|| panic!("write-back ticket {} is not in flight", t.0));
        let entry = self.tickets.swap_remove(i);
        let mut done = WbDone::default();
        if self.journal.is_some() {
            for l in &entry.lines {
                self.journal_touch(l.slot);
            }
        }
        for l in &entry.lines {
            let pin = self
                .pins
                .get_mut(&l.slot)
                .expect("a line in flight is pinned");
            let rewritten = pin.wgen != l.wgen;
            pin.count -= 1;
            let (last, zombie) = (pin.count == 0, pin.zombie);
            if last {
                self.pins.remove(&l.slot);
            }
            let cached = self.keys.at(l.slot as usize);
            // A pinned slot is never reused: a violation would have written another line's
            // bytes to this line's place on the backing device.
            assert!(
                cached == l.key || (zombie && cached == EMPTY),
                "slot {} of a write-back of key {:#x} in flight now holds {cached:#x}",
                l.slot,
                l.key
            );
            if l.pending != 0 && failed.contains(&l.slot) {
                if !zombie {
                    let before = self.dirty_mask(l.slot);
                    let m = before | (l.pending & self.valid_mask(l.slot));
                    self.set_dirty_mask(l.slot, l.key, m);
                    if let Some(c) = l.copy {
                        self.writeback_failed_copy(l.slot, c, before);
                    }
                } else if let Some(c) = l.copy {
                    self.release_held(c);
                }
                // Counted at begin, not written: the pass that writes it counts it.
                // (Saturating: `reset_counters` may have run while it was in flight.)
                let c = &mut self.counters[l.class as usize];
                c.write_backs = c.write_backs.saturating_sub(1);
                if self.per_volume {
                    self.count_volume_cleaning((l.key >> LINE_BITS) as u32, 0, (0, 0), -1);
                }
                done.failed += 1;
                // Dirty again without the policy seeing it move: look ahead anew.
                self.ahead_depth.set(0);
            } else if l.pending != 0 {
                done.cleaned += 1;
                if let Some(c) = l.copy {
                    self.release_held(c);
                }
            }
            done.redirtied += rewritten as u64;
            if last && zombie {
                self.slots.push(l.slot);
                self.zombies -= 1;
                done.freed += 1;
            }
        }
        // Slots another ticket still pins keep that ticket's pending sectors only.
        if !self.tickets.is_empty() {
            for l in &entry.lines {
                if let Some(p) = self.pins.get_mut(&l.slot) {
                    p.pending = self
                        .tickets
                        .iter()
                        .flat_map(|t| t.lines.iter())
                        .filter(|x| x.slot == l.slot)
                        .fold(0, |m, x| m | x.pending);
                }
            }
        }
        debug_assert_eq!(
            self.pins.values().map(|p| p.count as usize).sum::<usize>(),
            self.tickets.iter().map(|t| t.lines.len()).sum::<usize>(),
            "pins and tickets agree"
        );
        debug_assert_eq!(
            self.zombies as usize,
            self.pins.values().filter(|p| p.zombie).count(),
            "every zombie is pinned"
        );
        self.ticket_pool.push(entry);
        let c = &mut self.inflight;
        c.writeback_redirtied += done.redirtied;
        c.writeback_failed += done.failed;
        c.zombies_freed += done.freed;
        self.update_fast_path();
        done
    }

    /// Whether a write-back in flight reads `slot` (it is then never a victim or reused).
    #[inline]
    pub fn is_pinned(&self, slot: Slot) -> bool {
        !self.pins.is_empty() && self.pins.contains_key(&slot)
    }

    /// Sectors of the line in `slot` a write-back in flight is cleaning (no longer in
    /// [`Engine::dirty_mask`]). A persisted record of the line must show
    /// `dirty_mask | pending_mask` dirty until the write-back completes.
    #[inline]
    pub fn pending_mask(&self, slot: Slot) -> u64 {
        if self.pins.is_empty() {
            return 0;
        }
        self.pins.get(&slot).map_or(0, |p| p.pending)
    }

    /// Planned cache writes into `slot` since it was pinned (0 when not pinned); a ticket
    /// line whose `wgen` differs at completion was rewritten in flight.
    pub fn slot_gen(&self, slot: Slot) -> u32 {
        self.pins.get(&slot).map_or(0, |p| p.wgen)
    }

    /// Write-backs in flight (tickets begun, not completed).
    pub fn writebacks_in_flight(&self) -> usize {
        self.tickets.len()
    }

    /// Slots of lines dropped while being written back, not yet free.
    pub fn zombie_slots(&self) -> u64 {
        self.zombies as u64
    }

    /// The cache devices' slot ranges ([`EngineConfig::pool_lines`]).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The cache device (member of the pool) holding `slot`.
    #[inline]
    pub fn member_of(&self, slot: Slot) -> usize {
        self.pool.member_of(u64::from(slot))
    }

    /// Whether member `d` of the pool has failed ([`Engine::fail_device`]).
    pub fn device_failed(&self, d: usize) -> bool {
        self.slots.member_dead(d)
    }

    /// Slots of failed members: neither cached nor free.
    pub fn dead_slots(&self) -> u64 {
        u64::from(self.slots.dead_slots())
    }

    /// Member `d` of a pool of several cache devices failed (no I/O here: the executor saves
    /// what it can with the returned list). Its lines leave the cache without any device
    /// step, as [`Engine::drop_line`] does: clean ones are simply dropped (the backing
    /// device has their data), dirty ones are returned as `uncovered` (slot, key) and dropped
    /// too (no copy exists with one dirty copy: the executor writes them back from elsewhere
    /// or declares them lost). Its slots are then never handed out until
    /// [`Engine::revive_device`]. Refused (nothing changes) for a pool of one device or the
    /// last live member (that is the whole cache failing: the executor's pass-through), for a
    /// member already failed, and while a write-back in flight reads one of its slots (the
    /// executor completes or reaps its write-backs first: a pinned line could not be
    /// dropped without turning its slot into a zombie of a dead device).
    pub fn fail_device(&mut self, d: usize) -> Result<DeviceLoss, EngineError> {
        let members = self.pool.members();
        let refuse =
            |why: String| Err(EngineError::Config(format!("fail cache device {d}: {why}")));
        if d >= members {
            return refuse(format!("the pool has {members} cache devices"));
        }
        if members == 1 {
            return refuse("a pool of one cache device: fail the whole cache instead".into());
        }
        if self.slots.member_dead(d) {
            return refuse("it has failed already".into());
        }
        if self.slots.live_members() == 1 {
            return refuse("it is the last live member: fail the whole cache instead".into());
        }
        let range = self.pool.range(d);
        if let Some(&s) = self.pins.keys().find(|&&s| range.contains(&u64::from(s))) {
            return refuse(format!(
                "a write-back in flight reads slot {s} (complete or reap write-backs first)"
            ));
        }
        if let Some(&s) = self.held.keys().find(|&&s| range.contains(&u64::from(s))) {
            return refuse(format!(
                "a write-back or re-mirror in flight holds copy slot {s} (complete it first)"
            ));
        }
        let mut loss = DeviceLoss::default();
        for slot in range.clone() {
            let slot = slot as Slot;
            let key = self.keys.at(slot as usize);
            if key == EMPTY {
                if let Some(&owner) = self.owner_of.get(&slot) {
                    // A copy on the failed member: its line keeps one copy.
                    self.journal_copy(slot);
                    self.owner_of.remove(&slot);
                    self.copy_of.remove(&owner);
                    loss.unmirrored.push(owner);
                }
                continue;
            }
            if self.is_dirty(slot) {
                if let Some(c) = self.copy_of(slot) {
                    self.journal_copy(c);
                    self.copy_of.remove(&slot);
                    self.owner_of.remove(&c);
                    let to = self.promote_copy(slot, c);
                    loss.promoted += 1;
                    loss.unmirrored.push(to);
                    continue;
                }
                loss.uncovered.push((slot, key));
            } else {
                loss.dropped_clean += 1;
            }
            self.remove(slot, false);
        }
        self.slots.drop_stale(&self.keys);
        self.slots.fail(d);
        debug_assert!(
            range.clone().all(|s| self.keys.at(s as usize) == EMPTY),
            "a line is left on failed member {d}"
        );
        self.update_fast_path();
        Ok(loss)
    }

    /// Member `d` is back (a replacement device of the same size, its record area empty):
    /// its slots are free again, and no journaled state of them remains. The journal kept
    /// the state each slot had before [`Engine::fail_device`] emptied it (the failed
    /// device's records still showed it, and were never rewritten); taken for the new
    /// device, that state would write a record mapping a line onto a slot whose data the
    /// new device never received.
    pub fn revive_device(&mut self, d: usize) -> Result<(), EngineError> {
        if d >= self.pool.members() || !self.slots.member_dead(d) {
            return Err(EngineError::Config(format!(
                "revive cache device {d}: it is not a failed member of the pool"
            )));
        }
        let range = self.pool.range(d);
        if let Some(j) = &mut self.journal {
            j.retain(|&s, _| !range.contains(&u64::from(s)));
        }
        debug_assert!(
            range
                .clone()
                .all(|s| self.keys.at(s as usize) == EMPTY
                    && !self.owner_of.contains_key(&(s as Slot))),
            "a line or copy left on failed member {d}"
        );
        self.slots.revive(d);
        self.update_fast_path();
        Ok(())
    }

    /// Checks the slot accounting (tests; O(capacity)): every slot is cached, free, a zombie
    /// or on a failed member, exactly one of them; free slots hold no line and lie on live
    /// members; no line lies on a failed member. Panics naming the first violation.
    pub fn check_slots(&self) {
        let mut seen = vec![false; self.cap as usize];
        let mut free = 0u64;
        for s in self.slots.all() {
            assert!(!seen[s as usize], "slot {s} is free twice");
            seen[s as usize] = true;
            if self.keys.at(s as usize) != EMPTY {
                continue; // a restored slot still listed (stale), dropped at the next use
            }
            assert!(
                !self.slots.is_dead(s),
                "free slot {s} lies on a failed member"
            );
            assert!(!self.is_pinned(s), "free slot {s} is pinned");
            free += 1;
        }
        for s in 0..self.cap {
            if self.keys.at(s as usize) != EMPTY {
                assert!(
                    !self.slots.is_dead(s),
                    "slot {s} of a failed member holds a line"
                );
            }
        }
        let dead = u64::from(self.slots.dead_slots());
        self.check_copies(&seen);
        assert_eq!(
            u64::from(self.cap),
            u64::from(self.len)
                + free
                + u64::from(self.copy_slots())
                + u64::from(self.zombies)
                + dead,
            "capacity = cached + free + copies + zombies + dead"
        );
    }

    /// Counts of what write-backs in flight did ([`InflightCounters`]).
    pub fn inflight_counters(&self) -> InflightCounters {
        self.inflight
    }

    /// Bumps the write generation of a pinned slot a planned step writes.
    #[cold]
    fn bump_wgen(&mut self, step: &Step) {
        if let Step::WriteSsd { ssd, .. } | Step::Populate { ssd, .. } = *step {
            if let Some(p) = self.pins.get_mut(&((ssd >> self.line_shift) as Slot)) {
                p.wgen = p.wgen.wrapping_add(1);
            }
        }
    }

    /// [`Engine::clean`]'s first pass: writes back (up to `max_lines`) the dirty lines among
    /// a class-aware policy's next [`CLEAN_AHEAD`] victims; returns how many.
    fn clean_ahead(&mut self, max_lines: u64) -> u64 {
        if !self.class_gate || self.has_free_slot() || self.dirty_count == 0 || max_lines == 0 {
            return 0;
        }
        let mut hint = std::mem::take(&mut self.cand_buf);
        hint.clear();
        self.policy
            .eviction_candidates(self.ahead_window(), &mut hint);
        let mut done = 0;
        let mut clean = hint.len();
        for (i, &slot) in hint.iter().enumerate() {
            let key = self.keys.at(slot as usize);
            if key != EMPTY && self.is_dirty(slot) {
                if done >= max_lines {
                    clean = i;
                    break;
                }
                let ci = self.line_class(slot) as usize;
                self.write_back(ci, slot, key);
                done += 1;
            }
        }
        self.note_ahead(clean);
        self.cand_buf = hint;
        done
    }

    /// Sets the chunk rewrite of cleaning (see [`Engine::clean`]): `chunk` bytes (0 = off)
    /// and the runs of dirty lines from which a chunk is rewritten.
    pub fn set_chunk_rewrite(&mut self, chunk: u64, min_runs: u64) -> Result<(), EngineError> {
        let mut c = self.cfg.clone();
        c.rewrite_chunk = chunk;
        c.rewrite_min_runs = min_runs;
        c.validate().map_err(EngineError::Config)?;
        let rebuild = c.acp_chunk_lines_shift() != self.cfg.acp_chunk_lines_shift();
        self.cfg = c;
        if rebuild {
            self.rebuild_cleaner();
        }
        Ok(())
    }

    /// The rest of the chunk of dirty line `key` from `key` on, as `[key, end)` line keys,
    /// with its dirty lines and runs of dirty lines; `None` when chunk rewrites are off.
    pub fn dirty_chunk(&mut self, key: u64) -> Option<(u64, u64, u64, u64)> {
        let chunk_lines = self.cfg.rewrite_chunk >> self.line_shift;
        if chunk_lines < 2 {
            return None;
        }
        let first = key;
        // Without a volume size the volume is taken to end on a chunk boundary (the live
        // volume always knows it; the simulator's plans then equal the live volume's).
        let mut end = (key & !(chunk_lines - 1)) + chunk_lines;
        let vol_base = key & !((1 << LINE_BITS) - 1);
        if let Some(vb) = self.volume_end((key >> LINE_BITS) as u32) {
            end = end.min(vol_base + vb.div_ceil(1 << self.line_shift));
        }
        let (mut runs, mut lines, mut last) = (0, 0, None::<u64>);
        for k in dirty_keys!(self).range(first, end) {
            if last.is_none_or(|l: u64| l + 1 != k) {
                runs += 1;
            }
            lines += 1;
            last = Some(k);
        }
        Some((first, end, lines, runs))
    }

    /// Plans the rewrite of dirty line `key`'s chunk from `key` on if it is dense enough and
    /// its dirty lines fit in `budget` (see [`Engine::clean`]); returns the dirty lines it
    /// cleaned. It cleans exactly the lines LBA-ordered write-backs would clean next, so
    /// what is cached and dirty (and every count but bytes) is as without rewrites.
    fn rewrite_chunk(&mut self, key: u64, budget: u64) -> Option<u64> {
        let (first, end, lines, runs) = self.dirty_chunk(key)?;
        if runs < self.cfg.rewrite_min_runs.max(2) || lines > budget {
            return None;
        }
        // A rewrite reads its clean lines' slots too: not one whose bytes a read miss is
        // still writing (plain write-backs read only dirty lines, never those).
        if !self.pins.is_empty()
            && (first..end).any(|k| {
                self.lookup(k)
                    .and_then(|s| self.pins.get(&s))
                    .is_some_and(|p| p.fill)
            })
        {
            return None;
        }
        let vol = (key >> LINE_BITS) as u32;
        let lmask = (1u64 << LINE_BITS) - 1;
        let ls = 1u64 << self.line_shift;
        let vol_end = self.volume_end(vol).unwrap_or(u64::MAX);
        let (ss, full) = (self.sector_shift, self.full_mask);
        let mut cleaned = 0;
        for k in first..end {
            let hdd = (k & lmask) << self.line_shift;
            let len = ls.min(vol_end.saturating_sub(hdd));
            if len == 0 {
                break;
            }
            let Some(slot) = self.lookup(k) else {
                self.emit(0, Step::CopyHdd { vol, hdd, len });
                if self.per_volume && !self.in_request {
                    self.count_volume_cleaning(vol, 0, (len, len), 0);
                }
                continue;
            };
            let ci = self.line_class(slot) as usize;
            let ssd = self.ssd_addr(slot);
            let valid = self.valid_mask(slot);
            let dirty = self.dirty_mask(slot);
            debug_assert_eq!(dirty & !valid, 0, "dirty sectors are valid");
            if self.capturing {
                // Clean copies are read too: pinned, with nothing pending.
                self.capture(slot, k, dirty);
            }
            // Valid sectors (dirty, or clean copies equal to the backing bytes) from the
            // cache, the rest from the backing device, in disk order.
            let mut parts: Vec<(u64, u64, bool)> = Runs(valid)
                .map(|(a, b)| (a, b, true))
                .chain(Runs(full & !valid).map(|(a, b)| (a, b, false)))
                .collect();
            parts.sort_unstable();
            for (a, b, cached) in parts {
                let off = a << ss;
                let l = ((b - a) << ss).min(len.saturating_sub(off));
                if l == 0 {
                    continue;
                }
                let (s, h) = (ssd + off, hdd + off);
                if self.per_volume && !self.in_request {
                    let (sr, hr) = if cached { (l, 0) } else { (0, l) };
                    self.count_volume_cleaning(vol, sr, (hr, l), 0);
                }
                self.emit(
                    ci,
                    if cached {
                        Step::WriteBack {
                            vol,
                            ssd: s,
                            hdd: h,
                            len: l,
                        }
                    } else {
                        Step::CopyHdd {
                            vol,
                            hdd: h,
                            len: l,
                        }
                    },
                );
            }
            if dirty != 0 {
                self.counters[ci].write_backs += 1;
                if self.per_volume && !self.in_request {
                    self.count_volume_cleaning(vol, 0, (0, 0), 1);
                }
                self.set_dirty_mask(slot, k, 0);
                cleaned += 1;
            }
        }
        self.counters[0].chunk_rewrites += 1;
        if self.per_volume && !self.in_request {
            let i = self.volume_index(vol);
            self.vols[i].counters.chunk_rewrites += 1;
        }
        self.cleaner.advance(end);
        Some(cleaned)
    }

    /// Up to `n` cached lines' slots the policy expects to evict next (a hint: see
    /// [`crate::policy::Policy::eviction_candidates`]), counting only evictions still needed
    /// once the free slots are used. Changes nothing. For class-aware policies the hint is the
    /// plain eviction order (DSS's clean-first search or a partition limit may pick others).
    /// Slots being written back (pinned) are left out.
    pub fn eviction_candidates(&self, n: u64, out: &mut Vec<Slot>) {
        let free =
            (self.cap - self.len - self.zombies - self.slots.dead_slots() - self.copy_slots())
                as u64;
        if n <= free {
            return;
        }
        let start = out.len();
        self.policy.eviction_candidates((n - free) as usize, out);
        let mut w = start;
        for r in start..out.len() {
            let s = out[r];
            if self.slot_key(s).is_some() && !self.is_pinned(s) {
                out[w] = s;
                w += 1;
            }
        }
        out.truncate(w);
    }

    /// Writes back the dirty lines among `slots` (counted as cleaning, like [`Engine::clean`])
    /// and returns the plan; which lines are cached does not change.
    ///
    /// This is [`Engine::begin_write_back_slots`] followed at once by
    /// [`Engine::complete_writeback`].
    pub fn write_back_slots(&mut self, slots: &[Slot]) -> &Plan {
        if let Some(t) = self.begin_write_back_slots(slots).map(|b| b.ticket) {
            self.complete_writeback(t, &[]);
        }
        &self.plan
    }

    /// Pins `slots`, which the plan just made (a read miss) fills, while an executor writes
    /// them outside its lock: a ticket with nothing pending. Until
    /// `complete_writeback(ticket, &[])` no pinned slot is a victim or reused, and a line
    /// dropped meanwhile leaves its slot a zombie, freed at completion. Call it right after
    /// the plan, before anything else plans: the plan must hold no write-back (its spans
    /// would join the ticket).
    pub fn pin_fill(&mut self, slots: &[Slot]) -> Option<WbTicket> {
        debug_assert!(
            !self
                .plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::WriteBack { .. } | Step::CopyHdd { .. })),
            "a fill's plan writes nothing back"
        );
        self.open_ticket();
        for &slot in slots {
            let key = self
                .slot_key(slot)
                .expect("a slot a plan fills holds its line");
            debug_assert!(!self.is_dirty(slot), "a read miss fills a clean line");
            self.capture(slot, key, 0);
            let p = self.pins.get_mut(&slot).expect("just pinned");
            debug_assert_eq!(p.count, 1, "a slot being filled is pinned by nothing else");
            p.fill = true;
        }
        self.close_ticket().map(|b| b.ticket)
    }

    /// [`Engine::write_back_slots`] as a write-back in flight (see [`Engine::begin_clean`]).
    pub fn begin_write_back_slots(&mut self, slots: &[Slot]) -> Option<WbBatch<'_>> {
        self.plan.reset(0, 0);
        self.open_ticket();
        for &slot in slots {
            let Some(key) = self.slot_key(slot) else {
                continue;
            };
            if self.is_dirty(slot) {
                let ci = self.line_class(slot) as usize;
                self.write_back(ci, slot, key);
            }
        }
        self.close_ticket()
    }

    /// Class-aware admission: the policy decides from the class and the clean share.
    fn class_admits(&mut self, volume: u32, class: u8) -> bool {
        self.policy.for_volume(volume);
        let clean = 1.0 - self.dirty_count as f64 / self.cap.max(1) as f64;
        self.policy.admit(class, clean)
    }

    /// The replacement policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Key of the line in `slot`, if the slot holds one.
    #[inline]
    pub fn slot_key(&self, slot: Slot) -> Option<u64> {
        if slot as usize >= self.keys.len() {
            return None;
        }
        let k = self.keys.at(slot as usize);
        (k != EMPTY).then_some(k)
    }

    /// Class the line in `slot` was cached for.
    #[inline]
    pub fn line_class(&self, slot: Slot) -> u8 {
        self.classes.get(slot as usize).copied().unwrap_or(0)
    }

    /// Stores the class of the line in `slot` (the class array is allocated at the first
    /// class other than 0).
    #[inline]
    fn set_line_class(&mut self, slot: Slot, class: u8) {
        if class != 0 && self.classes.is_empty() {
            self.classes = vec![0; self.cap as usize];
        }
        if let Some(c) = self.classes.get_mut(slot as usize) {
            *c = class;
        }
    }

    /// Relabels the cached line `key` as `class` (a live classifier learned its class after it
    /// was cached). A class-aware policy sees it as a hit of the new class (DSS moves it to
    /// the new class's list, as most recently used); other policies keep their order. Returns
    /// whether the line was cached with another class. Counters are not touched.
    pub fn reclassify(&mut self, key: u64, class: u8) -> bool {
        let Some(slot) = self.lookup(key) else {
            return false;
        };
        if class > MAX_CLASS || self.line_class(slot) == class {
            return false;
        }
        self.set_line_class(slot, class);
        if self.class_gate {
            let a = Access {
                key,
                seq: self.seq,
                next_use: NEVER,
                is_write: false,
                class,
            };
            self.policy.hit(slot, &a);
        }
        true
    }

    /// Puts a line back into `slot` as persisted metadata describes it (warm restart): `key`
    /// with sectors `valid_mask` valid and `dirty_mask` dirty. Lines restored first are the
    /// policy's oldest. With line validity the masks must be all or nothing.
    pub fn restore_line(
        &mut self,
        key: u64,
        slot: Slot,
        valid_mask: u64,
        dirty_mask: u64,
        class: u8,
    ) -> Result<(), EngineError> {
        let bad = |why: String| Err(EngineError::Config(format!("restore slot {slot}: {why}")));
        if slot >= self.cap {
            return bad(format!("slot out of range (capacity {})", self.cap));
        }
        let line = RestoreLine {
            key,
            slot,
            valid: valid_mask,
            dirty: dirty_mask,
            class,
        };
        self.check_restore(&line)?;
        if self.keys.at(slot as usize) != EMPTY {
            return bad("slot already holds a line".into());
        }
        if self.is_pinned(slot) {
            return bad("a write-back in flight still reads the slot".into());
        }
        if self.owner_of.contains_key(&slot) || self.held.contains_key(&slot) {
            return bad("the slot holds a dirty line's mirrored copy".into());
        }
        if self.lookup(key).is_some() {
            return bad(format!("key {key:#x} is already cached"));
        }
        self.slots.note_restored(slot);
        let a = Access {
            key,
            seq: self.seq,
            next_use: NEVER,
            is_write: false,
            class,
        };
        self.seq += 1;
        self.place(slot, key, class, &a);
        self.set_valid(slot, valid_mask);
        self.set_dirty_mask(slot, key, dirty_mask);
        Ok(())
    }

    /// Restores many lines into an empty engine (a warm restart of millions of lines): the
    /// same state as [`Engine::restore_line`] on each in turn (`lines` oldest first: the
    /// policy sees them in this order), but the per-slot arrays and the index are filled in
    /// slot order with the index buckets prefetched, and the policy threaded after, so that
    /// a restart is not a chain of cache misses per line. The keys must be distinct (a
    /// caller resolves duplicates first; checked in debug builds). Returns the lines that
    /// were refused, by position in `lines`, each with what [`Engine::restore_line`] would
    /// have said; the others are restored.
    pub fn restore_bulk(&mut self, lines: &[RestoreLine]) -> Vec<(usize, EngineError)> {
        let mut errors = Vec::new();
        // Position in `lines` per slot (NIL: none), so the slots are visited in order.
        const NONE: u32 = u32::MAX;
        let mut at = vec![NONE; self.cap as usize];
        for (i, l) in lines.iter().enumerate() {
            if l.slot >= self.cap {
                errors.push((
                    i,
                    EngineError::Config(format!(
                        "restore slot {}: slot out of range (capacity {})",
                        l.slot, self.cap
                    )),
                ));
            } else if at[l.slot as usize] != NONE {
                errors.push((
                    i,
                    EngineError::Config(format!(
                        "restore slot {}: slot already holds a line",
                        l.slot
                    )),
                ));
            } else {
                at[l.slot as usize] = i as u32;
            }
        }
        let sorted = (0..self.cap)
            .filter(|&s| at[s as usize] != NONE)
            .map(|s| lines[at[s as usize] as usize]);
        let age: Vec<Slot> = lines.iter().map(|l| l.slot).collect();
        let refused = self.restore_sorted(sorted, &age);
        errors.extend(
            refused
                .into_iter()
                .map(|(s, e)| (at[s as usize] as usize, e)),
        );
        errors.sort_by_key(|e| e.0);
        errors
    }

    /// [`Engine::restore_bulk`] for a caller that has its lines in slot order already (a
    /// restart decoding the record area): `lines` by ascending slot (each slot once, in
    /// range; asserted), `age` the slots oldest first as the policy is to see them (slots
    /// of refused lines, or of no line, are skipped; every restored line must be in it,
    /// asserted). No copy of the lines is made: the iterator is consumed once, the index
    /// buckets prefetched 16 lines ahead. Returns the refused lines by slot.
    pub fn restore_sorted(
        &mut self,
        lines: impl IntoIterator<Item = RestoreLine>,
        age: &[Slot],
    ) -> Vec<(Slot, EngineError)> {
        let (errors, pending) = self.restore_slots(lines);
        self.restore_age(pending, age);
        errors
    }

    /// The first half of [`Engine::restore_sorted`]: the lines into their slots, the index
    /// and the dirty state. The policy knows none of them until [`Engine::restore_age`] is
    /// given the returned token (a caller sorts the age order meanwhile); the engine must
    /// not be used in between.
    pub fn restore_slots(
        &mut self,
        lines: impl IntoIterator<Item = RestoreLine>,
    ) -> (Vec<(Slot, EngineError)>, RestorePending) {
        assert!(
            self.len == 0 && self.pins.is_empty() && self.dirty_count == 0,
            "restore into an engine that holds lines"
        );
        let mut errors = Vec::new();
        // Restored slots not yet threaded into the policy.
        let mut unthreaded = vec![0u64; (self.cap as usize).div_ceil(64)];
        let mut last: Option<Slot> = None;
        for l in lines {
            let l: RestoreLine = l;
            let slot = l.slot;
            assert!(
                slot < self.cap && last.is_none_or(|p| p < slot),
                "restore_sorted: slot {slot} out of order or range (previous {last:?}, capacity {})",
                self.cap
            );
            last = Some(slot);
            if let Err(e) = self.check_restore(&l) {
                errors.push((slot, e));
                continue;
            }
            self.slots.note_restored(slot);
            self.keys.set(slot as usize, l.key);
            self.set_line_class(slot, l.class);
            self.set_valid(slot, l.valid);
            self.len += 1;
            if self.sectors {
                // The line-level dirty bit is set just below when `l.dirty` is not empty.
                self.store_masks(slot, l.valid, l.dirty);
            }
            if l.dirty != 0 {
                // As `set_dirty`, the LBA-ordered set built in one go below.
                self.dirty[slot as usize / 64] |= 1 << (slot % 64);
                self.dirty_count += 1;
                self.cleaner.dirtied(l.key, self.clock);
            }
            unthreaded[slot as usize / 64] |= 1 << (slot % 64);
        }
        // The index of every restored line at once, its buckets split over the cores (the
        // same chains as inserting them in slot order here).
        let threads = if self.len >= RESTORE_PARALLEL_LINES {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
        } else {
            1
        };
        self.map.build(&self.keys, &unthreaded, threads);
        debug_assert_eq!(self.map.len(), self.len as usize);
        debug_assert!(
            self.entries().all(|(k, s, _)| self.lookup(k) == Some(s)),
            "restore_slots: a key restored twice"
        );
        self.dirty_win.clear();
        (
            errors,
            RestorePending {
                unthreaded,
                build_index: 0,
            },
        )
    }

    /// [`Engine::restore_slots`] on `threads` threads (a restart of millions of lines): the
    /// slots are split into `threads` ranges (of whole 64-slot words), and `lines_in(range)`
    /// gives the lines of a range by ascending slot (each slot once; asserted), called once
    /// per range on its own thread. Each thread fills its slots' keys, classes, sector
    /// masks and dirty bits; the parts are then joined in slot order (free slots, partial
    /// masks, the cleaner), so the engine, the refused lines and the token equal those of
    /// `restore_slots` over all the lines in slot order. Only before journaling starts
    /// ([`Engine::journal_lines`], asserted): a restart restores first.
    pub fn restore_slots_in<F, I>(
        &mut self,
        threads: usize,
        lines_in: F,
    ) -> (Vec<(Slot, EngineError)>, RestorePending)
    where
        F: Fn(std::ops::Range<Slot>) -> I + Sync,
        I: Iterator<Item = RestoreLine>,
    {
        assert!(
            self.len == 0 && self.pins.is_empty() && self.dirty_count == 0,
            "restore into an engine that holds lines"
        );
        assert!(
            self.journal.is_none(),
            "restore_slots_in while journaling (restore before journal_lines)"
        );
        let cap = self.cap as usize;
        let words = cap.div_ceil(64);
        let threads = threads.clamp(1, 64).min(words.max(1));
        let mut unthreaded = vec![0u64; words];
        // Masks of slots that held a line once may linger (`store_masks` keeps a whole
        // line's out of the map): dropped below for the whole lines restored, as it does.
        let stale_masks = !self.part_masks.is_empty();
        let keep_classes = !self.classes.is_empty();
        let parts: Vec<RestorePart> = {
            // (Field by field: the per-slot arrays are lent to the threads below.)
            let rules = RestoreRules {
                slots: &self.slots,
                pool: &self.pool,
                full_mask: self.full_mask,
                sectors: self.sectors,
                spl_shift: self.spl_shift,
            };
            let lines_in = &lines_in;
            // Each thread's words: keys, classes, masks, dirty and restored bits of its slots.
            let bounds: Vec<usize> = (0..=threads).map(|t| words * t / threads).collect();
            let (mut keys, mut keys_hi) = self.keys.parts_mut();
            let mut classes: &mut [u8] = &mut self.classes;
            let mut whole: &mut [u64] = &mut self.whole;
            let mut dirty: &mut [u64] = &mut self.dirty;
            let mut unthr: &mut [u64] = &mut unthreaded;
            let mut jobs = Vec::with_capacity(threads);
            for t in 0..threads {
                let (lo, hi) = (bounds[t] * 64, (bounds[t + 1] * 64).min(cap));
                let nw = bounds[t + 1] - bounds[t];
                let k;
                (k, keys) = std::mem::take(&mut keys).split_at_mut(hi - lo);
                let kh = keys_hi.split_off_front(hi - lo);
                let c;
                (c, classes) = std::mem::take(&mut classes).split_at_mut(if keep_classes {
                    hi - lo
                } else {
                    0
                });
                let w;
                (w, whole) =
                    std::mem::take(&mut whole).split_at_mut(if rules.sectors { nw } else { 0 });
                let d;
                (d, dirty) = std::mem::take(&mut dirty).split_at_mut(nw);
                let u;
                (u, unthr) = std::mem::take(&mut unthr).split_at_mut(nw);
                jobs.push(PartSlices {
                    lo,
                    hi,
                    keys: crate::keys::KeysPart { lo: k, hi: kh },
                    classes: c,
                    whole: w,
                    dirty: d,
                    restored: u,
                });
            }
            let run = |p: PartSlices<'_>| {
                let range = p.lo as Slot..p.hi as Slot;
                p.fill(&rules, lines_in(range))
            };
            if threads == 1 {
                jobs.into_iter().map(run).collect()
            } else {
                std::thread::scope(|sc| {
                    let handles: Vec<_> =
                        jobs.into_iter().map(|p| sc.spawn(move || run(p))).collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                        .collect()
                })
            }
        };
        let mut errors = Vec::new();
        let partial: usize = parts.iter().map(|p| p.partial.len()).sum();
        self.part_masks.reserve(partial);
        for p in parts {
            self.len += p.len;
            self.dirty_count += p.dirty;
            errors.extend(p.errors);
            self.part_masks.extend(p.partial);
            for (slot, class) in p.classes {
                self.set_line_class(slot, class);
            }
            // Keys that need the high words, on a store narrow until now.
            for (slot, key) in p.wide_keys {
                self.keys.set(slot as usize, key);
            }
        }
        if stale_masks {
            for (w, &x) in unthreaded.iter().enumerate() {
                let mut x = x & self.whole.get(w).copied().unwrap_or(0);
                while x != 0 {
                    self.part_masks
                        .remove((w * 64) as Slot + x.trailing_zeros());
                    x &= x - 1;
                }
            }
        }
        self.slots.note_restored_map(&unthreaded);
        // The cleaner learns the dirty lines in slot order, as `restore_slots` tells it.
        for (w, &x) in self.dirty.iter().enumerate() {
            let mut x = x;
            while x != 0 {
                let slot = (w * 64) as u32 + x.trailing_zeros();
                self.cleaner
                    .dirtied(self.keys.at(slot as usize), self.clock);
                x &= x - 1;
            }
        }
        self.dirty_win.clear();
        // The index is built by `restore_age`, on other threads while it threads the policy.
        let build_index = if self.len >= RESTORE_PARALLEL_LINES {
            threads
        } else {
            1
        };
        (
            errors,
            RestorePending {
                unthreaded,
                build_index,
            },
        )
    }

    /// The second half of [`Engine::restore_sorted`]: threads the lines restored by
    /// [`Engine::restore_slots`] into the policy, `age` oldest first.
    pub fn restore_age(&mut self, pending: RestorePending, age: &[Slot]) {
        self.restore_age_in(pending, age, &mut Vec::new())
    }

    /// [`Engine::restore_age`] with a buffer the caller lends (its contents overwritten):
    /// the index build's transient entries go there where it holds one `u64` per restored
    /// line already (a restart's sort buffer), not into fresh memory.
    pub fn restore_age_in(
        &mut self,
        pending: RestorePending,
        age: &[Slot],
        scratch: &mut Vec<u64>,
    ) {
        let RestorePending {
            mut unthreaded,
            build_index,
        } = pending;
        let ctx = AgeCtx {
            keys: &self.keys,
            classes: &self.classes,
            cap: self.cap,
            len: self.len,
        };
        if build_index == 0 {
            ctx.thread(&mut *self.policy, &mut self.seq, &mut unthreaded, age);
            return;
        }
        // The index (of the restored slots) on other threads, the policy on this one: they
        // change disjoint state (`map`; `policy`, `seq`) and both only read the keys.
        let present = unthreaded.clone();
        let threads = if build_index > 1 { build_index - 1 } else { 1 };
        let (map, policy, seq) = (&mut self.map, &mut self.policy, &mut self.seq);
        std::thread::scope(|sc| {
            let built = sc.spawn(|| map.build_in(ctx.keys, &present, threads, scratch));
            ctx.thread(&mut **policy, seq, &mut unthreaded, age);
            built
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
        });
        debug_assert_eq!(self.map.len(), self.len as usize);
        debug_assert!(
            self.entries().all(|(k, s, _)| self.lookup(k) == Some(s)),
            "restore_slots_in: a key restored twice"
        );
    }

    /// The checks of [`Engine::restore_line`] that need no lookup.
    fn check_restore(&self, l: &RestoreLine) -> Result<(), EngineError> {
        self.restore_rules().check(l)
    }

    /// What [`Engine::check_restore`] reads, shareable with the threads of
    /// [`Engine::restore_slots_in`] (the engine itself is not `Sync`).
    fn restore_rules(&self) -> RestoreRules<'_> {
        RestoreRules {
            slots: &self.slots,
            pool: &self.pool,
            full_mask: self.full_mask,
            sectors: self.sectors,
            spl_shift: self.spl_shift,
        }
    }

    /// Drops the line in `slot` without any device step, dirty sectors included (an executor
    /// whose cache device failed there, after saving what it could). Returns its key.
    pub fn drop_line(&mut self, slot: Slot) -> Option<u64> {
        let key = self.slot_key(slot)?;
        assert!(
            !self.is_pinned(slot),
            "drop_line of slot {slot} while a write-back reads it (complete it first)"
        );
        // (A rollback drops, restores and drops the same slot: `remove` handles the stale
        // free list.)
        self.remove(slot, false);
        Some(key)
    }
}

/// The engine's settings a restored line is checked against ([`Engine::check_restore`]).
struct RestoreRules<'a> {
    slots: &'a FreeSlots,
    pool: &'a Pool,
    full_mask: u64,
    sectors: bool,
    spl_shift: u32,
}

impl RestoreRules<'_> {
    fn check(&self, l: &RestoreLine) -> Result<(), EngineError> {
        let RestoreLine {
            key,
            slot,
            valid: valid_mask,
            dirty: dirty_mask,
            class,
        } = *l;
        let bad = |why: String| Err(EngineError::Config(format!("restore slot {slot}: {why}")));
        if class > MAX_CLASS {
            return Err(EngineError::BadClass(class));
        }
        if self.slots.is_dead(slot) {
            return bad(format!(
                "cache device {} of the pool has failed",
                self.pool.member_of(u64::from(slot))
            ));
        }
        if key == EMPTY || (key & ((1 << LINE_BITS) - 1)) >= (1 << LINE_BITS) - 1 {
            return bad(format!("invalid key {key:#x}"));
        }
        if valid_mask == 0 || valid_mask & !self.full_mask != 0 || dirty_mask & !valid_mask != 0 {
            return bad(format!(
                "masks valid {valid_mask:#x} dirty {dirty_mask:#x} do not fit a line of {} sectors",
                1u64 << self.spl_shift
            ));
        }
        if !self.sectors
            && (valid_mask != self.full_mask || (dirty_mask != 0 && dirty_mask != self.full_mask))
        {
            return bad("line validity needs whole-line masks".into());
        }
        Ok(())
    }
}

/// One thread's share of [`Engine::restore_slots_in`]: slots `lo..hi` (`lo` a multiple of
/// 64) and the engine's per-slot state of them (`classes` empty when the engine keeps no
/// classes yet, `whole` when it keeps no sector masks).
struct PartSlices<'a> {
    lo: usize,
    hi: usize,
    keys: crate::keys::KeysPart<'a>,
    classes: &'a mut [u8],
    whole: &'a mut [u64],
    dirty: &'a mut [u64],
    restored: &'a mut [u64],
}

/// What one part restored, joined in slot order by [`Engine::restore_slots_in`].
struct RestorePart {
    len: u32,
    dirty: u64,
    errors: Vec<(Slot, EngineError)>,
    /// Sector masks of the partial lines (`part_masks` entries).
    partial: Vec<(Slot, (u64, u64))>,
    /// Classes other than 0 while the engine keeps none (it allocates them then).
    classes: Vec<(Slot, u8)>,
    /// Keys the narrow store could not take (they need the high words): set once joined.
    wide_keys: Vec<(Slot, u64)>,
}

impl PartSlices<'_> {
    /// The per-line work of [`Engine::restore_slots`], for the lines of this part: what
    /// `set_line_class`, `set_valid` and `store_masks` (from empty) leave, written directly.
    fn fill(
        mut self,
        rules: &RestoreRules<'_>,
        lines: impl Iterator<Item = RestoreLine>,
    ) -> RestorePart {
        let mut p = RestorePart {
            len: 0,
            dirty: 0,
            errors: Vec::new(),
            partial: Vec::new(),
            classes: Vec::new(),
            wide_keys: Vec::new(),
        };
        let mut last: Option<Slot> = None;
        for l in lines {
            let slot = l.slot;
            assert!(
                (self.lo..self.hi).contains(&(slot as usize)) && last.is_none_or(|q| q < slot),
                "restore_slots_in: slot {slot} out of order or outside its range {}..{} (previous {last:?})",
                self.lo,
                self.hi
            );
            last = Some(slot);
            if let Err(e) = rules.check(&l) {
                p.errors.push((slot, e));
                continue;
            }
            let i = slot as usize - self.lo;
            let (w, b) = (i / 64, 1u64 << (i % 64));
            if !self.keys.put(i, l.key) {
                p.wide_keys.push((slot, l.key));
            }
            if !self.classes.is_empty() {
                self.classes[i] = l.class;
            } else if l.class != 0 {
                p.classes.push((slot, l.class));
            }
            if rules.sectors {
                let full = rules.full_mask;
                if l.valid == full && (l.dirty == 0 || l.dirty == full) {
                    self.whole[w] |= b;
                } else {
                    self.whole[w] &= !b;
                    p.partial.push((slot, (l.valid, l.dirty)));
                }
            }
            if l.dirty != 0 {
                self.dirty[w] |= b;
                p.dirty += 1;
            }
            self.restored[w] |= b;
            p.len += 1;
        }
        p
    }
}

/// What [`Engine::restore_age`] reads while it threads the policy (the index may be built
/// meanwhile on other threads).
struct AgeCtx<'a> {
    keys: &'a crate::keys::Keys,
    classes: &'a [u8],
    cap: u32,
    len: u32,
}

impl AgeCtx<'_> {
    fn line_class(&self, slot: Slot) -> u8 {
        self.classes.get(slot as usize).copied().unwrap_or(0)
    }

    /// Threads the restored slots (`unthreaded`, cleared as they go) into `policy`, `age`
    /// oldest first, numbering the accesses from `seq`.
    fn thread(&self, policy: &mut dyn Policy, seq: &mut u64, unthreaded: &mut [u64], age: &[Slot]) {
        const AHEAD: usize = 16;
        let mut threaded = 0u32;
        let reads = policy.insert_reads_access();
        if !reads {
            // The restored slots in age order (each once): `age` itself unless it holds a
            // slot to skip, then a copy without those.
            let mut kept: Option<Vec<Slot>> = None;
            for (i, &slot) in age.iter().enumerate() {
                let (w, b) = (slot as usize / 64, 1u64 << (slot % 64));
                if unthreaded.get(w).is_some_and(|&x| x & b != 0) {
                    unthreaded[w] &= !b;
                    threaded += 1;
                    if let Some(k) = &mut kept {
                        k.push(slot);
                    }
                } else if kept.is_none() {
                    let mut k = Vec::with_capacity(self.len as usize);
                    k.extend_from_slice(&age[..i]);
                    kept = Some(k);
                }
            }
            assert_eq!(
                threaded, self.len,
                "restore_age: a restored line is missing from the age order"
            );
            let order = kept.as_deref().unwrap_or(age);
            // The policy's links (or ring) written in one pass where it can; else one
            // `insert` each.
            if !policy.insert_all(order) {
                for (i, &slot) in order.iter().enumerate() {
                    if let Some(&s) = order.get(i + AHEAD) {
                        policy.prefetch(s);
                    }
                    let a = Access {
                        key: EMPTY,
                        seq: *seq,
                        next_use: NEVER,
                        is_write: false,
                        class: 0,
                    };
                    *seq += 1;
                    policy.insert(slot, &a);
                }
            } else {
                *seq += order.len() as u64;
            }
            return;
        }
        for (i, &slot) in age.iter().enumerate() {
            if let Some(&s) = age.get(i + AHEAD) {
                if s < self.cap {
                    if reads {
                        self.keys.prefetch(s as usize);
                        if let Some(c) = self.classes.get(s as usize) {
                            crate::index::prefetch(c);
                        }
                    }
                    policy.prefetch(s);
                }
            }
            let (w, b) = (slot as usize / 64, 1u64 << (slot % 64));
            if unthreaded.get(w).is_none_or(|&x| x & b == 0) {
                continue;
            }
            unthreaded[w] &= !b;
            threaded += 1;
            let a = Access {
                key: if reads {
                    self.keys.at(slot as usize)
                } else {
                    EMPTY
                },
                seq: *seq,
                next_use: NEVER,
                is_write: false,
                class: if reads { self.line_class(slot) } else { 0 },
            };
            *seq += 1;
            policy.insert(slot, &a);
        }
        assert_eq!(
            threaded, self.len,
            "restore_age: a restored line is missing from the age order"
        );
    }
}
