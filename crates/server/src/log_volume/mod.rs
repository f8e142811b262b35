//! The live cache volume in the log layout (Nitro): lines are hashed (BLAKE3-256),
//! deduplicated, compressed (lz4/zstd, raw when that does not shrink them) and appended to
//! segments filled in RAM and written whole; the [`LogEngine`] decides placement, sealing and
//! reclamation, this module executes its plans and keeps them crash-consistent.
//!
//! **What is durable, and when.** The on-disk state (`log_format`) is the segment headers
//! (two ping-pong slots per segment, the newest valid one counts) and a journal of records
//! (base extents of segments not sealed yet, duplicate entries, drops). Every header extent
//! and record carries a sequence number; recovery reads the headers and the active journal
//! half (never the extents), and for each line the newest event wins: a *live* header extent
//! or base record maps the line, a duplicate record maps it if its target extent still exists
//! at the generation it names, a drop (or a record whose segment has since been reclaimed)
//! unmaps it. The rules that make this correct:
//!
//! 1. *Data before description.* A segment's bytes are synced before its header is written
//!    (seal), and an open segment's bytes are synced before the journal records describing
//!    them (commit). Each header write is synced before anything refers to it.
//! 2. *Clean never ahead of the backing.* Before a seal or a commit, the backing device is
//!    synced if it was written since its last sync, so a clean extent never claims content
//!    the backing could lose.
//! 3. *FLUSH/FUA = commit.* A commit syncs the backing, writes the open segments' new bytes,
//!    syncs, appends the records of the new open extents and of the duplicate entries and
//!    drops since the last commit, and syncs. After it, everything acknowledged is described
//!    durably. Headers of sealed segments whose extents were superseded (`hdr_stale`) are
//!    rewritten (to the other slot, those extents marked not live) only at the next
//!    checkpoint, right after its new half is in place: until then the superseding events
//!    are in the active half and newer, so recovery's newest-event rule already ignores the
//!    old extents (a superseding record into a since-reclaimed segment still outranks them:
//!    it unmaps the line). The checkpoint itself carries a drop for every uncached line such
//!    a header still marks live (`stale_header_drops`), so no older extent of a line can
//!    outlive a newer one's description across the epoch change either.
//! 4. *Reclaim.* Before a segment is reused: its dirty extents (and dirty duplicates of
//!    them) are written back, a commit runs (which syncs the backing and makes every
//!    superseding event durable, and records a drop for every line the reclamation
//!    unmapped), then an empty header with the next generation is written and synced. Only
//!    then do new bytes go to its data area. A record naming the old generation is then
//!    known stale.
//! 5. *Journal halves.* When the active half fills, a checkpoint writes into the other half
//!    (epoch + 1) the records of every open extent, every current duplicate entry and the
//!    pending drops, syncs, and only then writes that half's header (syncs): a crash
//!    leaves either the old half or the complete new one. Records of an older epoch are
//!    ignored, and replay stops at the first bad record. After recovery a checkpoint always
//!    starts a new epoch, so a partly written commit never resurfaces.
//! 6. *Torn tail or damage.* Each record carries the frame (record range) of the journal
//!    write it came in, and a clean shutdown ends the journal with an end record. A crash
//!    can tear only the last write, so a bad record is the journal's legitimate end when the
//!    stop was unclean and every valid record after it lies in the bad record's own frame;
//!    it is damage when a later write's records verify, or when a cleanly stopped journal
//!    does not end in its end record. Likewise a header slot that starts with the header
//!    magic but does not verify is a torn write after an unclean stop (zeroed by recovery,
//!    so it never outlives the next clean stop) and damage after a clean one. Damage makes
//!    `open` fail, naming `tiercache check --repair`; the repair ([`LogVolume::open_salvage`]
//!    then a clean shutdown) replays every record that still verifies, after the bad one
//!    too, and says what may be lost.
//! 7. *Stable after a crash* (write-through). A write-through write reaches the backing
//!    device before its new extent is described; if the line's durable event is a clean
//!    extent, a crash in between would bring back the old bytes, and the new ones once the
//!    line is evicted. So before the backing write, drop records of such lines are appended
//!    to the journal and synced (one append and one sync per request; they also go to the
//!    pending records so a checkpoint carries them). A line's durable event is a clean
//!    extent if its current extent is durable (sealed, committed, or a committed duplicate)
//!    or if it was superseded or unmapped since the last commit (`shadowed`); and a seal
//!    marks superseded extents dead at once (their superseders are on the backing device,
//!    synced before the seal), unlike rule 3's write-back case. In write-back,
//!    FUA writes are dirty writes followed by a commit (they never write the backing device
//!    ahead of their description), and write-backs run after a commit when duplicate
//!    records are pending, so a dirty duplicate being written back is durable first.
//!
//! 8. *Device faults* (issue 14 items 1 and 6, shared with the direct layout in
//!    `crate::degrade`). Write-backs happen when a segment is reclaimed; they run *before*
//!    the engine reclaims it (`reserve`): the victim's dirty extents are written back and the
//!    backing device synced, and only then is the segment reclaimed. If the backing device
//!    fails, the volume is *degraded*: the victim is not reclaimed (its dirty extents stay
//!    dirty and are served from the cache), a sealed segment without dirty data is reclaimed
//!    instead, and when there is none the write fails with the backing device's error
//!    (ENOSPC or EIO); write-backs are retried with backoff. A cache-device write or sync
//!    error leaves RAM ahead of the device, so it fails the cache at once (a read error on a
//!    hit counts towards `max_cache_errors`: a clean line is read from the backing device, a
//!    dirty one is reported lost): every dirty line that can still be read is copied to the
//!    backing device, the failure is recorded in the state file and by erasing the
//!    superblock, and every later request passes through to the backing device.
//!
//! 9. *Concurrency* (issue 19). One lock (`Inner`) orders every decision and every device
//!    write, so the rules above hold as they would for one connection. Outside it run only
//!    pure computations and cache-device reads: a write hashes, compresses and checksums its
//!    whole lines before taking it; a read hit on a sealed segment reads, checks and expands
//!    its extent after releasing it, and uses the bytes only if the segment's generation is
//!    unchanged when it takes the lock again (a data area is written only after the
//!    reclamation that raised its generation), else it reads the line again under the lock.
//!
//! Between commits the volume may lose the latest writes (a block device may, until FLUSH);
//! whatever a line reads after a crash is its value at the last commit or one written since.
//! A duplicate is only shared when the full 32-byte digests match; every extent carries the
//! crc32c of its stored bytes, checked on every read (a clean mismatch reads the backing, a
//! dirty one fails with EIO). Trims drop whole lines from the cache (the backing keeps its
//! data: after a trim the contents are unspecified).

use crate::degrade::{self, Degraded};
use crate::dev::BlockDev;
use crate::identity::BackingIdentity;
use crate::log_format::*;
use crate::reduce::{fingerprint64, Hash, Reduced, Reducer};
use crate::state_file::FailState;
use serde::Serialize;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tiercache_engine::log::segment::HdrEntry;
use tiercache_engine::log::{
    Compression, DeadExtent, ExtentContent, ExtentInfo, LogCounters, Reduction, RestoredEntry,
    RestoredSegment,
};
use tiercache_engine::{LogConfig, LogEngine, Mode, Op, Request, Step};
use tiercache_nbd::Export;

/// What `tiercache format --layout log` asks for.
#[derive(Clone, Debug)]
pub struct LogFormatOptions {
    pub line_size: u64,
    pub segment_size: u64,
    pub compression: Compression,
    pub dedup_ratio: f64,
    pub picker: String,
    pub mode: Mode,
    /// Records per journal half (default: sized from the device; tests make it small so
    /// checkpoints happen often). Raised to what a checkpoint needs at least.
    pub journal_records: Option<u64>,
}

impl Default for LogFormatOptions {
    fn default() -> Self {
        LogFormatOptions {
            line_size: 4096,
            segment_size: 2 << 20,
            compression: Compression::None,
            dedup_ratio: 0.0,
            picker: "lru".into(),
            mode: Mode::WriteThrough,
            journal_records: None,
        }
    }
}

fn engine_config(sb: &LogSuperblock) -> LogConfig {
    let mut c = LogConfig::new(sb.segments * sb.segment_size, sb.line_size);
    c.segment_size = sb.segment_size;
    // Detached (pass-through, `crate::live`): nothing is cached, the engine idles.
    c.mode = match sb.mode {
        Mode::PassThrough => Mode::WriteThrough,
        m => m,
    };
    c.picker = sb.picker.clone();
    c.dedup_ratio = sb.dedup_ratio;
    c.compression = sb.compression;
    c.max_extents_per_segment = sb.max_extents;
    c
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Which device an I/O error came from, carried inside the `io::Error` (its kind kept, so
/// ENOSPC stays ENOSPC for the client): a backing-device error that left the volume
/// consistent fails its request only; a cache-device error fails the cache.
#[derive(Debug)]
enum Fault {
    Backing(String),
    Cache(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Backing(m) => write!(f, "backing device: {m}"),
            Fault::Cache(m) => write!(f, "cache device: {m}"),
        }
    }
}

impl std::error::Error for Fault {}

fn backing_fault(e: io::Error) -> io::Error {
    if fault_of(&e).is_some() {
        return e;
    }
    io::Error::new(e.kind(), Fault::Backing(e.to_string()))
}

fn cache_fault(e: io::Error) -> io::Error {
    if fault_of(&e).is_some() {
        return e;
    }
    io::Error::new(e.kind(), Fault::Cache(e.to_string()))
}

fn fault_of(e: &io::Error) -> Option<&Fault> {
    e.get_ref().and_then(|r| r.downcast_ref::<Fault>())
}

/// Cache-device read errors after which the cache is failed (default; write and sync errors
/// fail it at once).
pub const DEFAULT_MAX_CACHE_ERRORS: u64 = 16;

/// Formats `cache` as a log-layout cache for a backing device of `backing_size` bytes (its
/// identity is recorded at the first open; see [`format_log_for`]).
pub fn format_log(
    cache: &dyn BlockDev,
    backing_size: u64,
    o: &LogFormatOptions,
) -> io::Result<LogSuperblock> {
    format_log_for(cache, backing_size, None, o)
}

/// As [`format_log`], recording the backing device's identity (`BlockDev::identity`).
pub fn format_log_for(
    cache: &dyn BlockDev,
    backing_size: u64,
    backing: Option<BackingIdentity>,
    o: &LogFormatOptions,
) -> io::Result<LogSuperblock> {
    if o.segment_size < 2 * o.line_size {
        return Err(io_err(format!(
            "segment size {} must hold at least two lines of {} (extent caching is a simulator-only layout)",
            o.segment_size, o.line_size
        )));
    }
    if !matches!(o.mode, Mode::WriteThrough | Mode::WriteBack) {
        return Err(io_err(format!(
            "the log layout supports write-through and write-back, not {}",
            o.mode
        )));
    }
    let (segments, max_extents, records) =
        LogSuperblock::plan(cache.size(), o.line_size, o.segment_size, o.journal_records)
            .map_err(io_err)?;
    let sb = LogSuperblock {
        line_size: o.line_size,
        segment_size: o.segment_size,
        segments,
        max_extents,
        compression: o.compression,
        dedup_ratio: o.dedup_ratio,
        picker: o.picker.clone(),
        mode: o.mode,
        backing_size,
        journal_records: records,
        clean: true,
        backing: backing.unwrap_or_default(),
        uuid: rand::random(),
    };
    engine_config(&sb).validate().map_err(io_err)?;
    let g = sb.geometry();
    // Both journal halves whole, not only their headers: records of a cache formatted over
    // carry epochs a new one reuses (1, 2, ...), and recovery would read them as this
    // cache's (before: `format --force` of a used log cache left it refusing to start,
    // "journal half 1 header damaged").
    let big = vec![0u8; 1 << 20];
    let (start, end) = (g.half_offset(0), g.half_offset(1) + g.half_bytes);
    let mut at = start;
    while at < end {
        let n = (end - at).min(big.len() as u64) as usize;
        cache.write_at(&big[..n], at)?;
        at += n as u64;
    }
    let zero = vec![0u8; 4096];
    for s in 0..segments as u32 {
        for slot in 0..2 {
            cache.write_at(&zero, g.slot_offset(s, slot))?;
        }
    }
    cache.sync()?;
    cache.write_at(&sb.encode(), 0)?;
    cache.sync()?;
    Ok(sb)
}

/// Key of the dead placeholder extent a salvage puts where a lost journal record's extent
/// was (no line has it: volume 0xffff is never used).
const GAP_KEY: u64 = u64::MAX;

/// Reads a log superblock (None: the device is not in the log layout).
pub fn read_log_superblock(cache: &dyn BlockDev) -> io::Result<Option<LogSuperblock>> {
    let mut b = vec![0u8; SB_BYTES as usize];
    cache.read_at(&mut b, 0)?;
    if !LogSuperblock::is_log(&b) {
        return Ok(None);
    }
    LogSuperblock::decode(&b).map(Some).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e}: the log superblock (bytes 0..4096) is damaged and the layout cannot be read without it; `tiercache format --force` discards the cache (and its dirty data)"),
        )
    })
}

/// Damage recovery found in the device's metadata (after a clean stop, or contradicted by
/// later records): `open` refuses, `open_salvage` goes on and lists it.
#[derive(Clone, Debug, Serialize)]
pub struct LogDamage {
    /// "journal record", "journal end" or "segment header".
    pub what: &'static str,
    pub half: Option<u32>,
    pub record: Option<u64>,
    pub segment: Option<u32>,
    pub slot: Option<u32>,
    /// Device byte offset of the damaged structure.
    pub offset: u64,
    pub message: String,
}

/// What to accept when opening (see `crate::identity`).
#[derive(Clone, Debug, Default)]
pub struct LogOpenOptions {
    /// The backing device is the recorded one under another name: record the new one.
    pub accept_backing_rename: bool,
    /// Clean cached lines differ from the backing device and dirty ones are cached: open
    /// anyway, dropping the clean lines (the dirty ones will overwrite the changes).
    pub accept_backing_changes: bool,
    /// The backing device is not there (the offline check): no clean line is compared.
    pub offline: bool,
    /// Damage does not stop the open (see [`LogVolume::open_salvage`]).
    pub salvage: bool,
    /// State file recording a failure of this cache (`crate::state_file`): written when the
    /// cache fails; a cache it names as failed is refused at open. `None`: the failure is
    /// recorded only by erasing the superblock.
    pub state_path: Option<std::path::PathBuf>,
}

/// What opening found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LogOpenReport {
    pub was_clean: bool,
    pub sealed_segments: u64,
    /// Segments not sealed at the crash whose extents the journal described (sealed now).
    pub recovered_open_segments: u64,
    pub journal_records: u64,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    /// Duplicate or base records found stale (their segment reclaimed since).
    pub stale_records: u64,
    /// What the backing identity check did beyond a plain match, if anything.
    pub backing_note: Option<String>,
    /// Clean lines compared with the backing device, how many differed, how many dropped.
    pub sampled_clean_lines: u64,
    pub differing_clean_lines: u64,
    pub dropped_clean_lines: u64,
    /// Damage found (empty unless opened with [`LogVolume::open_salvage`]: `open` fails).
    pub damage: Vec<LogDamage>,
    /// Valid records after a damaged one that a salvage replayed.
    pub salvaged_records: u64,
    /// What the damage may have cost where the line is unknown (a damaged record's key
    /// cannot be trusted): one entry per damaged structure.
    pub unknown_lost: Vec<String>,
    /// Volume byte ranges whose dirty data a salvage had to drop (key known).
    pub lost_ranges: Vec<crate::check::LostRange>,
}

/// What [`LogVolume::scrub`] found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LogScrub {
    pub lines: u64,
    pub dirty_lines: u64,
    /// Distinct stored extents the lines map.
    pub extents: u64,
    pub bad_extents: u64,
    /// Dirty lines mapping a bad extent.
    pub lost_lines: u64,
    pub problems: Vec<String>,
}

/// Counters of the live log volume besides the engine's.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LogLiveCounters {
    pub commits: u64,
    pub checkpoints: u64,
    pub journal_records_written: u64,
    pub header_writes: u64,
    pub header_rewrites: u64,
    /// Bytes written to the cache device (segment data, headers, journal).
    pub ssd_bytes_written: u64,
    pub ssd_data_bytes_written: u64,
    pub ssd_bytes_read: u64,
    pub backing_bytes_read: u64,
    pub backing_bytes_written: u64,
    pub backing_syncs: u64,
    pub cache_syncs: u64,
    /// 64-bit fingerprint matches whose 32-byte digests differed (stored as unique).
    pub fingerprint_collisions: u64,
    /// Duplicate hits not shared because the duplicate-entry budget was reached.
    pub dedup_budget_skips: u64,
    pub write_backs: u64,
    /// Extents whose crc32c did not match on read.
    pub extent_crc_errors: u64,
    /// Write-through: drop records made durable before a backing write (rule 7 of
    /// `crate::log_volume`), and the journal appends (each one sync) that carried them.
    pub early_drops: u64,
    pub early_drop_syncs: u64,
    /// Client requests (reads, writes, flushes, trims), also after the cache failed.
    pub requests: u64,
    /// Requests served by the backing device alone after the cache failed.
    pub pass_through_requests: u64,
    /// Dirty lines copied to the backing device when the cache failed.
    pub failure_write_backs: u64,
    /// Read hits on sealed segments read and expanded outside the lock, and those of them
    /// whose segment was reclaimed meanwhile (or whose bytes did not verify): read again
    /// under the lock.
    pub unlocked_reads: u64,
    pub unlocked_read_retries: u64,
    /// Backing-device syncs that failed at a seal or commit (their request failed), and the
    /// lines then written to the backing device again from the cache before the next sync.
    pub backing_sync_errors: u64,
    pub backing_resync_lines: u64,
}

/// `ctl stats` of a log volume.
#[derive(Clone, Debug, Serialize)]
pub struct LogVolumeStats {
    pub layout: &'static str,
    pub mode: String,
    pub line_size: u64,
    pub segment_size: u64,
    pub segments: u64,
    pub compression: String,
    pub picker: String,
    pub dedup_index_ratio: f64,
    pub volume_bytes: u64,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    /// Cached lines / distinct stored extents they reference.
    pub dedup_ratio: f64,
    /// Raw bytes / stored bytes over those extents.
    pub compression_ratio: f64,
    /// Logical bytes cached / SSD bytes of the segments in use.
    pub effective_capacity: f64,
    pub ssd_bytes_used: u64,
    /// Bytes written to the cache device (data, headers and journal).
    pub ssd_bytes_written: u64,
    pub ram_index_bytes: u64,
    pub index_bytes_per_entry: f64,
    /// Duplicate entries the journal can hold; past it, duplicates are stored as unique
    /// (counted in `live.dedup_budget_skips`).
    pub dup_entries_budget: u64,
    pub reduction: Reduction,
    pub engine: LogCounters,
    pub live: LogLiveCounters,
    /// Faults, with the direct layout's names (`crate::degrade`).
    pub cache_errors: u64,
    pub backing_errors: u64,
    /// Write-backs the backing device failed (their lines stayed dirty in the cache).
    pub backing_write_errors: u64,
    /// The cache device failed: every request passes through to the backing device.
    pub cache_failed: bool,
    pub lost_dirty_bytes: u64,
    pub lost_dirty_ranges: Vec<(u64, u64)>,
    /// The backing device fails write-backs: segments holding dirty data are not reclaimed.
    pub degraded: bool,
    pub degraded_reason: Option<String>,
    /// The last open's clean-line sample (nonzero `differing_clean_lines`: the open
    /// repaired clean lines whose bytes differed from the backing device).
    pub recovery_sample: RecoverySample,
}

/// A segment as this side knows it: its generation, header slot and extents (the header's
/// contents, and for an open segment what is appended so far).
#[derive(Clone, Debug, Default)]
struct SegMeta {
    gen: u32,
    /// Slot holding the newest valid header (the next write goes to the other).
    slot: u32,
    sealed: bool,
    exts: Vec<Ext>,
    /// Open segment: extents (and bytes) already described by journal records.
    durable: usize,
    durable_fill: u32,
    /// Offsets of extents (of this generation) no longer their key's current base extent:
    /// the live flags the next header write gives, kept from the engine's log of dead
    /// extents ([`Inner::sync_dead`]) instead of looking every extent up at each rewrite.
    dead: std::collections::HashSet<u32>,
}

impl SegMeta {
    fn fill(&self) -> u32 {
        self.exts.last().map(|e| e.off + e.len).unwrap_or(0)
    }
    fn ext_at(&self, off: u32) -> Option<&Ext> {
        self.exts
            .binary_search_by_key(&off, |e| e.off)
            .ok()
            .map(|i| &self.exts[i])
    }
}

struct Inner {
    /// Shared with [`LogVolume::cache`]: reads of sealed extents run outside the lock.
    cache: Arc<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    sb: LogSuperblock,
    geo: Geometry,
    eng: LogEngine,
    red: Reducer,
    segs: Vec<SegMeta>,
    bufs: HashMap<u32, Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// Duplicate and drop records since the last commit.
    pending: Vec<Rec>,
    /// Sealed segments with extents superseded since their header was written.
    hdr_stale: BTreeSet<u32>,
    /// Drop records appended since the stale headers were last rewritten: bounds the drops
    /// a checkpoint may have to add for them (`stale_header_drops`, see `commit`).
    drops_since_rewrite: u64,
    /// Scratch for [`Inner::sync_dead`].
    dead_log: Vec<DeadExtent>,
    seq: u64,
    epoch: u64,
    half: u32,
    jused: u64,
    hdd_dirty: bool,
    /// Lines written to the backing device since its last successful sync (write-through
    /// writes), and whether a sync failed since: then the next sync attempt first writes
    /// them again from the cache (a failed sync may have dropped their bytes, Linux marking
    /// the pages clean, and a later sync would succeed without them). See
    /// [`Inner::backing_sync_if_dirty`].
    hdd_unsynced: std::collections::HashSet<u64>,
    resync: bool,
    dups_upper: u64,
    /// Duplicate entries counted at the last checkpoint.
    dups_at_checkpoint: u64,
    dup_budget: u64,
    commit_every: u64,
    fp_hook: Option<fn(&Hash) -> u64>,
    live: LogLiveCounters,
    stored: Vec<u8>,
    scratch: Vec<u8>,
    closed: bool,
    failed: bool,
    /// Recovery goes on past damage (see [`LogVolume::open_salvage`]).
    salvage: bool,
    /// Lines whose durable event may be a clean extent the RAM state no longer shows
    /// (superseded or unmapped since the last commit); rule 7.
    shadowed: std::collections::HashSet<u64>,
    /// Keys whose duplicate record is pending (not committed yet).
    fresh_dups: std::collections::HashSet<u64>,
    /// Lines of the write request being run whose drop is durable already (rule 7).
    dropped_now: std::collections::HashSet<u64>,
    /// Write-backs are failing on the backing device (rule 8).
    degraded: Option<Degraded>,
    cache_errors: u64,
    max_cache_errors: u64,
    backing_errors: u64,
    backing_write_errors: u64,
    /// The cache device failed: every request goes to the backing device (rule 8).
    pass_through: bool,
    /// Volume byte ranges whose dirty data the failed cache lost (sorted, disjoint).
    lost: Vec<(u64, u64)>,
    state_path: Option<std::path::PathBuf>,
    /// The cache failed but neither the state file nor the superblock erase is durable yet:
    /// writes fail until one of them is.
    failure_unrecorded: Option<FailState>,
    /// Lines a failed write-back pass wrote to the backing device without a sync (rule 8):
    /// not admitted clean until a backing sync succeeds.
    unsynced_lines: std::collections::HashSet<u64>,
    /// Detached (`ctl detach`, mode pass-through in the superblock): the cache holds
    /// nothing and every request goes to the backing device (`live`).
    detached: bool,
    /// The counters at the last `ctl stats --reset` (`stats` reports what came since).
    base: (LogCounters, LogLiveCounters),
    /// What the open's clean-line sample found (`verify_clean_sample`).
    recovery_sample: RecoverySample,
}

/// `ctl stats`' view of the clean-line sample of the last open (`verify_clean_sample`):
/// clean lines compared with the backing device, how many differed (their cached bytes are
/// not what the backing device holds: it changed behind the cache, or a recovery gap), and
/// how many clean lines were dropped for it. Kept across `ctl stats --reset`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct RecoverySample {
    pub sampled_clean_lines: u64,
    pub differing_clean_lines: u64,
    pub dropped_clean_lines: u64,
}

/// A request served by the backing device alone (failed cache).
enum Direct<'a> {
    Read(u64, &'a mut [u8]),
    Write(u64, &'a [u8], bool),
    Flush,
    Trim(u64, u64),
}

/// The log-layout cache volume. Connections run in parallel around one lock (`inner`): a
/// write hashes, compresses and checksums its whole lines before taking it, and a read of an
/// extent in a sealed segment reads and expands it after releasing it (see
/// [`LogVolume::read`] for why the bytes it returns are never another generation's).
pub struct LogVolume {
    inner: Mutex<Inner>,
    size: u64,
    line: u64,
    /// Client request latencies and bytes (`crate::live`).
    metrics: crate::metrics::Metrics,
    /// The cache device (also `Inner::cache`), for reads outside the lock.
    cache: Arc<dyn BlockDev>,
    /// Idle reducers (one per thread reducing at once; they keep zstd contexts warm).
    reducers: Mutex<Vec<Reducer>>,
    compression: Compression,
    geo: Geometry,
    hooks: RaceHooks,
}

/// Test hooks of the unlocked read path (`#[doc(hidden)]` setters on [`LogVolume`]).
#[derive(Default)]
struct RaceHooks {
    /// Sleep between the lookup and the device read, so that reclamations can happen there.
    pause_reads: AtomicBool,
    /// Skip the validation after an unlocked read (generation and crc): for the test that
    /// proves the validation is needed, never otherwise.
    unchecked_reads: AtomicBool,
}

/// A whole line of a write request reduced before the lock is taken.
struct PreLine {
    red: Reduced,
    /// The compressed bytes (empty when stored raw: the stored bytes are the line).
    comp: Vec<u8>,
    /// crc32c of the stored bytes.
    crc: u32,
}

/// Hashes, compresses and checksums one line.
fn reduce_line(red: &mut Reducer, data: &[u8]) -> io::Result<PreLine> {
    let mut comp = Vec::new();
    let red = red.reduce(data, &mut comp)?;
    let crc = crc32c::crc32c(if red.compressed { &comp } else { data });
    Ok(PreLine { red, comp, crc })
}

/// A read hit on a sealed segment, looked up under the lock and read after releasing it.
struct Unlocked {
    seg: u32,
    gen: u32,
    ext: Ext,
}

mod live;

impl LogVolume {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a formatted log cache: recovers its indices from the segment headers and the
    /// journal (after a clean shutdown or a crash alike) and starts a new journal epoch.
    pub fn open(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_with(cache, backing, None)
    }

    /// As [`LogVolume::open`], with a test hook replacing the engine's 64-bit fingerprint of
    /// a digest (to force fingerprint collisions).
    pub fn open_with(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        fp_hook: Option<fn(&Hash) -> u64>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_full(cache, backing, fp_hook, &LogOpenOptions::default())
    }

    /// As [`LogVolume::open`], with what to accept about the backing device.
    pub fn open_opts(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        opts: &LogOpenOptions,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_full(cache, backing, None, opts)
    }

    /// As [`LogVolume::open`], but damage (see the module doc, rule 6) does not stop it: every
    /// journal record that still verifies is replayed (a base record after a lost one leaves
    /// a gap in its segment), damaged header slots are zeroed, and the report lists the
    /// damage and what it may cost. `tiercache check` runs it on a copy-on-write view;
    /// `tiercache check --repair` on the device, then shuts down cleanly. No backing device
    /// is compared (offline).
    pub fn open_salvage(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        let o = LogOpenOptions {
            offline: true,
            salvage: true,
            ..Default::default()
        };
        Self::open_full(cache, backing, None, &o)
    }

    fn open_full(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        fp_hook: Option<fn(&Hash) -> u64>,
        opts: &LogOpenOptions,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        let cache: Arc<dyn BlockDev> = Arc::from(cache);
        let salvage = opts.salvage;
        let mut sb =
            read_log_superblock(&*cache)?.ok_or_else(|| io_err("not a log-layout cache device"))?;
        if let Some(p) = &opts.state_path {
            degrade::refuse_failed(p, &sb.uuid)?;
        }
        if backing.size() != sb.backing_size {
            return Err(io_err(format!(
                "the cache belongs to a backing device of {} bytes, but the backing device has {} bytes",
                sb.backing_size,
                backing.size()
            )));
        }
        // The identity is checked before anything is written; recovery records it.
        let mut backing_note = None;
        if let Some(given) = backing.identity() {
            backing_note = crate::identity::verify(&sb.backing, &given, opts.accept_backing_rename)
                .map_err(|(recorded, given)| {
                    io_err(crate::format::FormatError::WrongBacking { recorded, given })
                })?;
            sb.backing = given;
        }
        if sb.uuid == [0; 16] && !opts.offline {
            // A superblock older than version 3: it gets its uuid now (a state file names
            // the cache by it), durably before anything could fail.
            rand::Rng::fill(&mut rand::thread_rng(), &mut sb.uuid[..]);
            cache.write_at(&sb.encode(), 0)?;
            cache.sync()?;
        }
        let geo = sb.geometry();
        if cache.size() < geo.device_bytes(sb.segments) {
            return Err(io_err(format!(
                "cache device of {} bytes is smaller than its format ({} bytes)",
                cache.size(),
                geo.device_bytes(sb.segments)
            )));
        }
        let mut eng = LogEngine::new(engine_config(&sb)).map_err(io_err)?;
        eng.set_deferred_fill(true);
        eng.set_record_plan(true);
        let red = Reducer::new(sb.compression)?;
        let r = sb.journal_records;
        let commit_every = (r / 16).max(16);
        // A checkpoint lists the open segments' extents (at most 2 x max), the duplicate
        // entries and the pending drops (a commit's worth, plus a reclaimed segment's extents;
        // duplicates written back become drops one for one): it always fits a half.
        let dup_budget = r.saturating_sub(3 * sb.max_extents as u64 + 2 * commit_every);
        let mut inner = Inner {
            cache: cache.clone(),
            backing,
            geo,
            eng,
            red,
            segs: vec![SegMeta::default(); sb.segments as usize],
            bufs: HashMap::new(),
            spare: Vec::new(),
            pending: Vec::new(),
            hdr_stale: BTreeSet::new(),
            drops_since_rewrite: 0,
            dead_log: Vec::new(),
            seq: 1,
            epoch: 0,
            half: 0,
            jused: 0,
            hdd_dirty: false,
            hdd_unsynced: Default::default(),
            resync: false,
            dups_upper: 0,
            dups_at_checkpoint: 0,
            dup_budget,
            commit_every,
            fp_hook,
            live: LogLiveCounters::default(),
            stored: Vec::new(),
            scratch: Vec::new(),
            closed: false,
            failed: false,
            salvage,
            shadowed: Default::default(),
            fresh_dups: Default::default(),
            dropped_now: Default::default(),
            degraded: None,
            cache_errors: 0,
            max_cache_errors: DEFAULT_MAX_CACHE_ERRORS,
            backing_errors: 0,
            backing_write_errors: 0,
            pass_through: false,
            lost: Vec::new(),
            state_path: opts.state_path.clone(),
            failure_unrecorded: None,
            unsynced_lines: Default::default(),
            detached: sb.mode == Mode::PassThrough,
            base: Default::default(),
            recovery_sample: Default::default(),
            sb,
        };
        let mut rep = inner.recover()?;
        rep.backing_note = backing_note;
        if !opts.offline {
            inner.verify_clean_sample(&mut rep, opts)?;
            inner.recovery_sample = RecoverySample {
                sampled_clean_lines: rep.sampled_clean_lines,
                differing_clean_lines: rep.differing_clean_lines,
                dropped_clean_lines: rep.dropped_clean_lines,
            };
        }
        let size = inner.sb.backing_size;
        let line = inner.sb.line_size;
        let compression = inner.sb.compression;
        let geo = inner.geo;
        Ok((
            LogVolume {
                inner: Mutex::new(inner),
                size,
                line,
                metrics: Default::default(),
                cache,
                reducers: Mutex::new(Vec::new()),
                compression,
                geo,
                hooks: RaceHooks::default(),
            },
            rep,
        ))
    }

    pub fn superblock(&self) -> LogSuperblock {
        self.lock().sb.clone()
    }

    pub fn stats(&self) -> LogVolumeStats {
        let g = self.lock();
        let red = g.eng.reduction();
        // The engine's indices plus this side's copy of the headers (32-byte digests).
        let ib = g.eng.index_bytes() as u64
            + g.segs
                .iter()
                .map(|m| (m.exts.capacity() * std::mem::size_of::<Ext>()) as u64)
                .sum::<u64>();
        LogVolumeStats {
            layout: "log",
            // The mode in force: a failed cache passes everything through.
            mode: if g.pass_through || g.detached {
                Mode::PassThrough.as_str().into()
            } else {
                g.sb.mode.as_str().into()
            },
            line_size: g.sb.line_size,
            segment_size: g.sb.segment_size,
            segments: g.sb.segments,
            compression: g.sb.compression.to_string(),
            picker: g.sb.picker.clone(),
            dedup_index_ratio: g.sb.dedup_ratio,
            volume_bytes: self.size,
            cached_lines: red.cached_lines,
            dirty_lines: g.eng.dirty_lines(),
            dedup_ratio: red.dedup_ratio,
            compression_ratio: red.compression_ratio,
            effective_capacity: red.effective_capacity,
            ssd_bytes_used: red.ssd_bytes_used,
            ssd_bytes_written: g.live.ssd_bytes_written - g.base.1.ssd_bytes_written,
            ram_index_bytes: ib,
            index_bytes_per_entry: if red.cached_lines > 0 {
                ib as f64 / red.cached_lines as f64
            } else {
                0.0
            },
            dup_entries_budget: g.dup_budget,
            reduction: red,
            engine: live::engine_since(g.eng.counters(), &g.base.0),
            live: live::live_since(&g.live, &g.base.1),
            cache_errors: g.cache_errors,
            backing_errors: g.backing_errors,
            backing_write_errors: g.backing_write_errors,
            cache_failed: g.pass_through,
            lost_dirty_bytes: degrade::lost_bytes(&g.lost),
            lost_dirty_ranges: g.lost.clone(),
            degraded: g.degraded.is_some(),
            degraded_reason: g.degraded.as_ref().map(Degraded::reason),
            recovery_sample: g.recovery_sample,
        }
    }

    /// Cache-device read errors after which the cache is failed (write and sync errors fail
    /// it at once).
    pub fn set_max_cache_errors(&self, n: u64) {
        self.lock().max_cache_errors = n.max(1);
    }

    /// Where a failure of the cache is recorded (`crate::state_file`; the open checked the
    /// one given in [`LogOpenOptions::state_path`]).
    pub fn set_state_path(&self, p: Option<std::path::PathBuf>) {
        self.lock().state_path = p;
    }

    /// Whether the cache device has been failed (all requests go to the backing device).
    pub fn cache_failed(&self) -> bool {
        self.lock().pass_through
    }

    /// Whether a failure of the cache, if any, is durable (state file or superblock erase).
    pub fn failure_recorded(&self) -> bool {
        self.lock().failure_unrecorded.is_none()
    }

    /// Whether write-backs are failing on the backing device.
    pub fn degraded(&self) -> bool {
        self.lock().degraded.is_some()
    }

    /// The background retry of failed write-backs (rule 8): when degraded and the backoff
    /// has passed, writes back the dirty extents of one sealed segment (without reclaiming
    /// it); success ends the degraded state. Whether it was degraded before.
    pub fn retry_write_backs(&self) -> bool {
        let mut g = self.lock();
        let due = g.degraded.as_ref().is_some_and(Degraded::due);
        if !due || g.closed || g.failed || g.pass_through {
            return g.degraded.is_some();
        }
        let wbs = (0..g.segs.len() as u32)
            .filter(|&s| g.segs[s as usize].sealed)
            .map(|s| g.eng.reclaim_write_backs(s))
            .find(|w| !w.is_empty());
        let r = match wbs {
            Some(w) => g.write_back_first(&w),
            // Nothing dirty left in sealed segments: nothing to retry.
            None => {
                Degraded::healed(&mut g.degraded);
                Ok(())
            }
        };
        match r {
            // Counted in `backing_write_errors`; no request failed.
            Err(e) if matches!(fault_of(&e), Some(Fault::Backing(_))) => {
                tracing::debug!("write-back retry: {e}");
            }
            r => {
                let _ = g.guard(r);
            }
        }
        true
    }

    /// Data reduction over what the cache holds now.
    pub fn reduction(&self) -> Reduction {
        self.lock().eng.reduction()
    }

    /// Every cached line and whether it is dirty, in line order (tests, diagnostics).
    pub fn cached_lines(&self) -> Vec<(u64, bool)> {
        let g = self.lock();
        let mut v: Vec<(u64, bool)> = g
            .eng
            .entries()
            .map(|(k, i)| (LogEngine::key_line(k).1, i.dirty))
            .collect();
        v.sort_unstable();
        v
    }

    /// Rule 3's result, for tests: right after a FLUSH (a commit), the header last written
    /// for every sealed segment marks live exactly the extents that are their key's current
    /// base extent (none left live after being superseded, none marked dead too early),
    /// except that a header waiting for the next checkpoint's rewrite may still mark
    /// superseded extents live (never a current one dead).
    #[doc(hidden)]
    pub fn check_headers_after_flush(&self) -> Result<(), String> {
        let g = self.lock();
        for s in 0..g.segs.len() as u32 {
            let m = &g.segs[s as usize];
            if !m.sealed {
                continue;
            }
            let waits = g.hdr_stale.contains(&s);
            for e in &m.exts {
                let cur = g.is_live_lookup(s, e);
                if e.live != cur && !(waits && e.live) {
                    return Err(format!(
                        "segment {s} (gen {}) header extent at {} of key {:#x}: header says live={}, the line's current extent: {}",
                        m.gen, e.off, e.key, e.live, cur
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks the engine's invariants and the segments' dead sets (tests).
    pub fn check(&self) -> Result<(), String> {
        let mut g = self.lock();
        g.eng.check()?;
        g.check_dead()
    }

    /// Reads every extent a cached line maps (once per extent), checks its crc32c, expands it
    /// and compares the BLAKE3 of the line with the digest its header holds. Changes nothing.
    pub fn scrub(&self) -> io::Result<LogScrub> {
        let mut g = self.lock();
        let mut r = LogScrub::default();
        let mut locs: Vec<(u32, u32, bool, u64)> = Vec::new();
        for (k, i) in g.eng.entries() {
            r.lines += 1;
            r.dirty_lines += i.dirty as u64;
            locs.push((i.seg, i.off, i.dirty, k));
        }
        locs.sort_unstable();
        let mut line = vec![0u8; g.sb.line_size as usize];
        let mut i = 0;
        while i < locs.len() {
            let (seg, off) = (locs[i].0, locs[i].1);
            let mut j = i;
            let mut dirty = false;
            while j < locs.len() && (locs[j].0, locs[j].1) == (seg, off) {
                dirty |= locs[j].2;
                j += 1;
            }
            let affected = (j - i) as u64;
            i = j;
            r.extents += 1;
            let Some(ext) = g.segs[seg as usize].ext_at(off).copied() else {
                r.problems.push(format!(
                    "segment {seg} offset {off}: mapped by {affected} line(s) but not in its header"
                ));
                continue;
            };
            let bad = if !g.load_stored(seg, &ext)? {
                Some("checksum mismatch")
            } else {
                let stored = std::mem::take(&mut g.stored);
                let ok = g.red.expand(&stored, ext.compressed, &mut line).is_ok();
                g.stored = stored;
                if !ok {
                    Some("does not decompress to a line")
                } else if Reducer::hash(&line) != ext.hash {
                    Some("content differs from its BLAKE3 digest")
                } else {
                    None
                }
            };
            if let Some(why) = bad {
                r.bad_extents += 1;
                r.problems.push(format!(
                    "segment {seg} offset {off} ({} bytes{}): {why}; {affected} line(s){}",
                    ext.len,
                    if ext.compressed { ", compressed" } else { "" },
                    if dirty {
                        ", dirty: their data is lost"
                    } else {
                        ", clean: they will be read from the backing device"
                    }
                ));
                if dirty {
                    r.lost_lines += affected;
                }
            }
        }
        Ok(r)
    }

    /// Commits, marks the superblock clean and syncs. The volume fails every call after.
    pub fn shutdown(&self) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        if g.pass_through {
            // Not marked clean: the failure is recorded (state file, erased superblock).
            g.closed = true;
            return g.backing.sync().map_err(backing_fault);
        }
        let r = g.commit();
        g.guard(r)?;
        let r = (|| -> io::Result<()> {
            g.write_end()?;
            g.sb.clean = true;
            let b = g.sb.encode();
            g.cache_write(&b, 0)?;
            g.cache_sync()
        })();
        if r.is_err() {
            // Not stopped cleanly: a later superblock write (`ctl mode`) must not say so.
            g.sb.clean = false;
        }
        // A cache-device error fails the cache (rule 8) as it would in any request.
        g.guard(r)?;
        g.closed = true;
        Ok(())
    }

    /// A client read. Hits on sealed segments are read from the device and expanded after
    /// the lock is released; nothing then stops the segment from being reclaimed and
    /// rewritten meanwhile, so the lock is taken again and the bytes are used only if the
    /// segment still has the generation the lookup saw (its data area is written only
    /// after a reclamation has raised the generation, both under the lock: an unchanged
    /// generation means the read saw the bytes the lookup described) and their crc32c
    /// matches the extent's. Otherwise the line is read again under the lock.
    fn read_lines(&self, offset: u64, buf: &mut [u8], red: &mut Option<Reducer>) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Read(offset, buf));
        }
        // Lines whose dirty data could not be read back fail (never stale backing bytes).
        degrade::lost_check(&g.lost, offset, offset + buf.len() as u64)?;
        let ls = self.line;
        let mut line_buf = vec![0u8; ls as usize];
        let mut stored = Vec::new();
        let mut r = Ok(());
        for line in self.lines(offset, buf.len() as u64) {
            if red.is_none() {
                *red = self.take_reducer().ok();
            }
            r = match g.read_line(line, &mut line_buf, red.is_some()) {
                Ok(Some(u)) => {
                    drop(g);
                    let rd = red.as_mut().expect("taken above");
                    let read = self.read_unlocked(&u, rd, &mut stored, &mut line_buf);
                    g = self.lock();
                    g.check_open()?;
                    // Failed or detached meanwhile: the backing device holds every byte,
                    // and writes since then went only there.
                    if g.pass_through || g.detached {
                        return g.direct(Direct::Read(offset, buf));
                    }
                    g.live.unlocked_reads += 1;
                    let m = &g.segs[u.seg as usize];
                    let same = m.gen == u.gen && m.sealed;
                    if read && (same || self.hooks.unchecked_reads.load(Ordering::Relaxed)) {
                        g.live.ssd_bytes_read += u.ext.len as u64;
                        Ok(())
                    } else {
                        g.live.unlocked_read_retries += 1;
                        g.serve_line(line, &mut line_buf)
                    }
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if r.is_err() {
                break;
            }
            let a = (line * ls).max(offset);
            let b = ((line + 1) * ls).min(offset + buf.len() as u64);
            buf[(a - offset) as usize..(b - offset) as usize]
                .copy_from_slice(&line_buf[(a - line * ls) as usize..(b - line * ls) as usize]);
        }
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            // The cache failed during this request: the backing device serves it.
            return g.direct(Direct::Read(offset, buf));
        }
        r
    }

    /// Reads and expands the extent `u` without the lock: false when the device read fails
    /// or the bytes do not verify (crc32c, expansion to exactly a line). The caller checks
    /// the generation afterwards.
    fn read_unlocked(
        &self,
        u: &Unlocked,
        red: &mut Reducer,
        stored: &mut Vec<u8>,
        out: &mut [u8],
    ) -> bool {
        if self.hooks.pause_reads.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        stored.resize(u.ext.len as usize, 0);
        let at = self.geo.data_offset(u.seg) + u.ext.off as u64;
        if self.cache.read_at(stored, at).is_err() {
            return false;
        }
        let unchecked = self.hooks.unchecked_reads.load(Ordering::Relaxed);
        if !unchecked && crc32c::crc32c(stored) != u.ext.crc {
            return false;
        }
        red.expand(stored, u.ext.compressed, out).is_ok()
    }

    /// Test hook: reads sleep between their lookup and their unlocked device read, so that
    /// reclamations by other threads land in between.
    #[doc(hidden)]
    pub fn set_pause_reads(&self, on: bool) {
        self.hooks.pause_reads.store(on, Ordering::Relaxed);
    }

    /// Test hook: unlocked reads skip their validation (generation and crc32c). Only for
    /// the test showing that without it reads return another generation's bytes.
    #[doc(hidden)]
    pub fn set_unchecked_reads(&self, on: bool) {
        self.hooks.unchecked_reads.store(on, Ordering::Relaxed);
    }

    fn take_reducer(&self) -> io::Result<Reducer> {
        let idle = self
            .reducers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        match idle {
            Some(r) => Ok(r),
            None => Reducer::new(self.compression),
        }
    }

    fn put_reducer(&self, r: Reducer) {
        self.reducers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    /// The reductions of a write's whole lines, by line from the first (None: a partial
    /// line, reduced under the lock once its other bytes are known; or a reduction that
    /// failed, which the locked path then repeats and reports).
    fn pre_reduce(&self, offset: u64, data: &[u8]) -> Vec<Option<PreLine>> {
        if data.is_empty() || offset + data.len() as u64 > self.size {
            return Vec::new();
        }
        let Ok(mut red) = self.take_reducer() else {
            return Vec::new();
        };
        let ls = self.line;
        let out = self
            .lines(offset, data.len() as u64)
            .map(|line| {
                let a = (line * ls).max(offset);
                let b = ((line + 1) * ls).min(offset + data.len() as u64);
                if b - a != ls {
                    return None;
                }
                reduce_line(
                    &mut red,
                    &data[(a - offset) as usize..(b - offset) as usize],
                )
                .ok()
            })
            .collect();
        self.put_reducer(red);
        out
    }

    fn lines(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        if len == 0 {
            #[allow(clippy::reversed_empty_ranges)]
            return 1..=0;
        }
        offset / self.line..=(offset + len - 1) / self.line
    }
}

impl Inner {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn ls(&self) -> u64 {
        self.sb.line_size
    }

    fn fp_of(&self, h: &Hash) -> u64 {
        match self.fp_hook {
            Some(f) => f(h),
            None => fingerprint64(h),
        }
    }

    fn check_open(&self) -> io::Result<()> {
        if self.closed {
            return Err(io_err("the log volume was shut down"));
        }
        if self.failed {
            return Err(io_err(
                "the log volume stopped after an I/O error; restart it to recover from the device",
            ));
        }
        Ok(())
    }

    /// After a request's error. A damaged dirty extent on read (`InvalidData`, nothing
    /// changed) and a backing-device error that left the volume consistent fail only their
    /// request; a cache-device error fails the cache (rule 8: RAM may be ahead of the
    /// device, and the data path goes to the backing device from now on). Any other error
    /// may leave RAM ahead of the devices: every later request fails until a restart
    /// recovers from what is on the device.
    fn guard<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            match fault_of(e) {
                _ if e.kind() == io::ErrorKind::InvalidData => {}
                Some(Fault::Backing(_)) => self.backing_errors += 1,
                Some(Fault::Cache(m)) => {
                    self.cache_errors += 1;
                    let why = format!("cache device error: {m}");
                    self.fail_cache(&why);
                }
                None => self.failed = true,
            }
        }
        r
    }

    fn cache_sync(&mut self) -> io::Result<()> {
        self.live.cache_syncs += 1;
        self.cache.sync().map_err(cache_fault)
    }

    fn cache_write(&mut self, data: &[u8], off: u64) -> io::Result<()> {
        self.live.ssd_bytes_written += data.len() as u64;
        self.cache.write_at(data, off).map_err(cache_fault)
    }

    /// Rule 2: syncs the backing device if it was written since its last sync. A failure
    /// is a backing fault: its request fails (EIO; for a FLUSH or FUA write, durability was
    /// not established), nothing else changed and the volume keeps serving. The lines
    /// written since the last successful sync may have lost their bytes with the failure
    /// (`hdd_unsynced`), so the next attempt first writes each of them again from the
    /// cache, whose copy is the acknowledged one: a write-through line written since the
    /// last sync is still cached (evicting it takes a reclamation, which follows a seal,
    /// which follows a successful sync: `reserve`), unless it was trimmed or its write
    /// failed (contents unspecified), or its extent is unreadable (then reported lost).
    fn backing_sync_if_dirty(&mut self) -> io::Result<()> {
        if !self.hdd_dirty {
            return Ok(());
        }
        if self.resync {
            self.rewrite_unsynced()?;
        }
        if let Err(e) = self.backing.sync() {
            self.live.backing_sync_errors += 1;
            // A line written since that is no longer cached (trims and failed writes left
            // the set: its extent was found damaged or unreadable and dropped) has no copy
            // left to write again: its bytes may be gone from the backing device too.
            let ls = self.ls();
            let gone: Vec<u64> = self
                .hdd_unsynced
                .iter()
                .copied()
                .filter(|&l| self.eng.locate(0, l).is_none())
                .collect();
            for l in gone {
                self.hdd_unsynced.remove(&l);
                degrade::lose(
                    &mut self.lost,
                    l * ls,
                    (l + 1) * ls,
                    self.sb.backing_size,
                    &format!("a backing sync failed ({e}) before it was durable, and its cached copy was dropped (damaged or unreadable)"),
                );
            }
            self.resync = !self.hdd_unsynced.is_empty();
            tracing::warn!(
                "backing device sync failed ({e}): the request fails; the {} lines written since its last sync are written again before the next one",
                self.hdd_unsynced.len()
            );
            return Err(backing_fault(e));
        }
        self.unsynced_lines.clear();
        self.hdd_unsynced.clear();
        self.resync = false;
        self.live.backing_syncs += 1;
        self.hdd_dirty = false;
        Ok(())
    }

    /// After a failed backing sync: writes every line of `hdd_unsynced` again from the
    /// cache (see [`Inner::backing_sync_if_dirty`]). A line whose extent cannot be read or
    /// verified may have lost its acknowledged bytes: reported lost (its reads fail, never
    /// older bytes, until it is written again).
    fn rewrite_unsynced(&mut self) -> io::Result<()> {
        let ls = self.ls();
        let mut lines: Vec<u64> = self.hdd_unsynced.iter().copied().collect();
        lines.sort_unstable();
        let mut buf = vec![0u8; ls as usize];
        for line in lines {
            let Some(info) = self.eng.locate(0, line) else {
                // Trimmed since the failed sync: contents unspecified.
                continue;
            };
            match self.read_extent(&info, &mut buf) {
                Ok(true) => {
                    self.backing
                        .write_at(&buf, line * ls)
                        .map_err(backing_fault)?;
                    self.live.backing_resync_lines += 1;
                    self.live.backing_bytes_written += ls;
                }
                r => {
                    let why = match r {
                        Err(e) => format!("cache read failed: {e}"),
                        _ => "its extent fails its checksum".to_string(),
                    };
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("a backing sync failed before it was durable and {why}"),
                    );
                    self.hdd_unsynced.remove(&line);
                }
            }
        }
        Ok(())
    }

    /// A backing fault in the middle of a plan the engine has already made (a seal, a
    /// reclamation): RAM may be ahead of the devices, so it stops the volume (a restart
    /// recovers from the devices) instead of failing only its request. `reserve` syncs the
    /// backing device before the engine plans, so this is not expected to happen.
    fn mid_plan(e: io::Error) -> io::Error {
        match fault_of(&e) {
            Some(Fault::Backing(m)) => io_err(format!(
                "backing device error during a seal or reclamation already planned: {m}"
            )),
            _ => e,
        }
    }

    /// Is `e` (in segment `s`) its key's current base extent? Looks it up in the engine: for
    /// recovery and for checking [`Inner::is_live`].
    fn is_live_lookup(&self, s: u32, e: &Ext) -> bool {
        let (v, l) = LogEngine::key_line(e.key);
        self.eng
            .locate(v, l)
            .is_some_and(|i| !i.dup && i.seg == s && i.off == e.off)
    }

    /// Is `e` (in segment `s`) its key's current base extent? From the segment's dead set,
    /// so [`Inner::sync_dead`] must have run since the engine last changed (every caller
    /// that writes what this says calls it first).
    fn is_live(&self, s: u32, e: &Ext) -> bool {
        let live = !self.segs[s as usize].dead.contains(&e.off);
        debug_assert_eq!(live, self.is_live_lookup(s, e), "segment {s} extent {e:?}");
        live
    }

    /// Moves the engine's log of dead extents into the segments' dead sets: O(extents that
    /// died since the last call). An entry of an older generation than the segment's is
    /// dropped (the segment was reclaimed since; its dead set was emptied then).
    fn sync_dead(&mut self) {
        let mut d = std::mem::take(&mut self.dead_log);
        self.eng.take_dead(&mut d);
        for x in d.drain(..) {
            let m = &mut self.segs[x.seg as usize];
            if m.gen == x.gen {
                m.dead.insert(x.off);
            }
        }
        self.dead_log = d;
    }

    /// Rebuilds every segment's dead set by looking each extent up (recovery), and starts
    /// the engine's log of dead extents.
    fn init_dead(&mut self) {
        self.eng.set_track_dead(true);
        for s in 0..self.segs.len() as u32 {
            let dead: std::collections::HashSet<u32> = self.segs[s as usize]
                .exts
                .iter()
                .filter(|e| !self.is_live_lookup(s, e))
                .map(|e| e.off)
                .collect();
            self.segs[s as usize].dead = dead;
        }
    }

    /// Every segment's dead set agrees with a lookup of each extent in the engine.
    fn check_dead(&mut self) -> Result<(), String> {
        self.sync_dead();
        for s in 0..self.segs.len() as u32 {
            let m = &self.segs[s as usize];
            for e in &m.exts {
                let (fast, slow) = (!m.dead.contains(&e.off), self.is_live_lookup(s, e));
                if fast != slow {
                    return Err(format!(
                        "segment {s} (gen {}) extent at {} of key {:#x}: the dead set says live={fast}, the engine live={slow}",
                        m.gen, e.off, e.key
                    ));
                }
            }
        }
        Ok(())
    }

    /// Writes segment `s`'s header to its other slot; the extents' live flags are computed
    /// now unless `keep_flags` (a seal: `reserve` set them all live, see there).
    fn write_header(&mut self, s: u32, sealed: bool, keep_flags: bool) -> io::Result<()> {
        let hseq = self.next_seq();
        let gen = self.segs[s as usize].gen;
        let mut exts = self.segs[s as usize].exts.clone();
        if !keep_flags {
            self.sync_dead();
            for e in &mut exts {
                e.live = sealed && self.is_live(s, e);
            }
        }
        let h = SegHeader {
            seg: s,
            gen,
            hseq,
            sealed,
            exts: exts.clone(),
        };
        let slot = 1 - self.segs[s as usize].slot;
        let off = self.geo.slot_offset(s, slot);
        self.cache_write(&h.encode(), off)?;
        self.live.header_writes += 1;
        let m = &mut self.segs[s as usize];
        m.slot = slot;
        m.exts = exts;
        Ok(())
    }

    /// Reads the stored bytes of `(seg, off)` into `self.stored` and checks their crc.
    fn load_stored(&mut self, seg: u32, ext: &Ext) -> io::Result<bool> {
        let n = ext.len as usize;
        self.stored.resize(n, 0);
        if let Some(b) = self
            .bufs
            .get(&seg)
            .filter(|_| !self.segs[seg as usize].sealed)
        {
            self.stored
                .copy_from_slice(&b[ext.off as usize..ext.off as usize + n]);
        } else {
            let at = self.geo.data_offset(seg) + ext.off as u64;
            self.cache
                .read_at(&mut self.stored, at)
                .map_err(cache_fault)?;
            self.live.ssd_bytes_read += n as u64;
        }
        Ok(crc32c::crc32c(&self.stored) == ext.crc)
    }

    /// Reads a cached extent into `out` (a line); false when its bytes are damaged.
    fn read_extent(&mut self, info: &ExtentInfo, out: &mut [u8]) -> io::Result<bool> {
        let Some(ext) = self.segs[info.seg as usize].ext_at(info.off).copied() else {
            return Ok(false);
        };
        if !self.load_stored(info.seg, &ext)? {
            self.live.extent_crc_errors += 1;
            return Ok(false);
        }
        let stored = std::mem::take(&mut self.stored);
        let r = self.red.expand(&stored, ext.compressed, out);
        self.stored = stored;
        Ok(r.is_ok())
    }

    /// A backing read changes nothing: its error fails its request only.
    fn read_backing(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        self.live.backing_bytes_read += out.len() as u64;
        self.backing
            .read_at(out, line * self.ls())
            .map_err(backing_fault)
    }

    /// Reads the cached extent `info` of `line` into `out`; false when it is damaged or
    /// unreadable and the line was dropped (a clean line: read the backing device). A read
    /// error counts towards `max_cache_errors` (rule 8); a dirty line that cannot be read is
    /// reported lost (reads of it fail until it is written again).
    fn read_cached(&mut self, line: u64, info: &ExtentInfo, out: &mut [u8]) -> io::Result<bool> {
        match self.read_extent(info, out) {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.damaged(line, info)?;
                Ok(false)
            }
            Err(e) => {
                self.cache_errors += 1;
                tracing::warn!(
                    "cache device read error {} of {} before pass-through: {e}",
                    self.cache_errors,
                    self.max_cache_errors
                );
                if self.cache_errors >= self.max_cache_errors {
                    return Err(e);
                }
                let ls = self.ls();
                if info.dirty {
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("cache read failed: {e}"),
                    );
                }
                // Forgotten (with a drop record) either way: the next read of a clean line
                // goes to the backing device, a lost dirty one fails.
                self.unmap(line)?;
                degrade::lost_check(&self.lost, line * ls, (line + 1) * ls)
                    .map_err(backing_fault)?;
                Ok(false)
            }
        }
    }

    /// The current content of `line` (cached or from the backing), without admitting it.
    fn current_line(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        if let Some(info) = self.eng.locate(0, line) {
            if self.read_cached(line, &info, out)? {
                return Ok(());
            }
        }
        self.read_backing(line, out)
    }

    /// An extent failed its checksum: a clean line is dropped (the backing has it), a dirty
    /// one is an error.
    fn damaged(&mut self, line: u64, info: &ExtentInfo) -> io::Result<()> {
        if info.dirty {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "dirty extent of line {line} (segment {} offset {}) fails its checksum",
                    info.seg, info.off
                ),
            ));
        }
        self.unmap(line)?;
        Ok(())
    }

    /// Drops a line from the cache and records the drop.
    fn unmap(&mut self, line: u64) -> io::Result<()> {
        if let Some(i) = self.eng.locate(0, line) {
            if !i.dup && self.segs[i.seg as usize].sealed {
                self.hdr_stale.insert(i.seg);
            }
            if !i.dirty && self.durable(&i, LogEngine::line_key(0, line)) {
                self.shadowed.insert(line);
            }
            self.eng.forget(0, line);
            let seq = self.next_seq();
            self.pending.push(Rec::Drop {
                key: LogEngine::line_key(0, line),
                seq,
            });
        }
        self.maybe_commit()
    }

    fn maybe_commit(&mut self) -> io::Result<()> {
        if self.pending.len() as u64 >= self.commit_every {
            self.commit()?;
        }
        Ok(())
    }

    /// Makes sure a 64-bit fingerprint hit for `hash` is the same content (else forgets it)
    /// and that the duplicate budget allows sharing.
    fn vet_fingerprint(&mut self, fp: u64, hash: &Hash) {
        if let Some(loc) = self.eng.probe_fp(fp) {
            let same = self.segs[loc.seg as usize]
                .ext_at(loc.off)
                .map(|e| e.hash == *hash);
            if same != Some(true) {
                self.eng.drop_fp(fp);
                if same == Some(false) {
                    self.live.fingerprint_collisions += 1;
                }
            } else if self.dups_upper >= self.dup_budget {
                self.eng.drop_fp(fp);
                self.live.dedup_budget_skips += 1;
            }
        }
    }

    /// Executes the plan of `reserve`: seals, write-backs and the reclamation that follows.
    fn reserve(&mut self, dirty: bool) -> io::Result<()> {
        if self.hdd_dirty && self.eng.reserve_acts(dirty) {
            // Rule 2 before the engine changes anything: the seal (and a reclamation's
            // commit) below then find the backing device synced, and a failure here fails
            // the request with nothing changed.
            self.backing_sync_if_dirty()?;
        }
        let before = self.eng.open_segment(dirty);
        // The header of a segment sealed now describes every extent as live: an extent
        // superseded since the last commit must not be marked dead before what superseded
        // it is durable (a crash in between would lose both). The header is rewritten with
        // the dead ones marked at the next checkpoint (rule 3).
        let reclaimed0 = self.eng.counters().segments_reclaimed;
        // Rule 8: the victim's write-backs run before the engine reclaims it.
        let mut victim = self.eng.reserve_begin(dirty);
        let mut done = std::collections::HashSet::new();
        let mut no_room = None;
        if let Some(v) = victim {
            let wbs = self.eng.reclaim_write_backs(v);
            if !wbs.is_empty() {
                match self.write_back_first(&wbs) {
                    Ok(()) => done.extend(wbs.iter().filter_map(|st| match *st {
                        Step::WriteBack { ssd, hdd, .. } => Some((ssd, hdd)),
                        _ => None,
                    })),
                    Err(e)
                        if matches!(fault_of(&e), Some(Fault::Backing(_)))
                            || e.kind() == io::ErrorKind::InvalidData =>
                    {
                        // Degraded, or a damaged dirty extent in the victim (reclaiming it
                        // would drop the line, and a restart would then read older bytes
                        // from the backing device): a segment without dirty data instead,
                        // or no room.
                        if e.kind() == io::ErrorKind::InvalidData {
                            tracing::error!(
                                "segment {v} not reclaimed: {e}; rewrite the line to free it"
                            );
                        }
                        victim = self.eng.clean_victim();
                        if victim.is_none() {
                            no_room = Some(if e.kind() == io::ErrorKind::InvalidData {
                                io::Error::new(
                                    e.kind(),
                                    format!("log cache: no room: {e}, and every other sealed segment holds dirty data"),
                                )
                            } else {
                                backing_fault(Degraded::no_room(
                                    self.degraded.as_ref(),
                                    "log cache",
                                ))
                            });
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let steps = self.eng.reserve_end(dirty, victim).steps.clone();
        let reclaimed = self.eng.counters().segments_reclaimed > reclaimed0;
        let seg_size = self.sb.segment_size;
        // Only when this reserve seals the open segment (once per segment, not per line:
        // the scan is O(extents)). Liveness of its extents is the same before and after the
        // reserve unless the reserve reclaimed it, a case `has_dead` is not used for.
        let mut has_dead = false;
        if let Some(o) = before.filter(|&o| {
            steps
                .iter()
                .any(|st| matches!(st, Step::WriteSsd { ssd, .. } if ssd / seg_size == o as u64))
        }) {
            self.sync_dead();
            has_dead = self.segs[o as usize]
                .exts
                .iter()
                .any(|e| !self.is_live(o, e));
            for e in self.segs[o as usize].exts.iter_mut() {
                e.live = true;
            }
        }
        let now = self.eng.open_segment(dirty);
        assert!(
            now.is_some() || no_room.is_some(),
            "reserve opens a segment unless there is no room"
        );
        let mut written_back = Vec::new();
        // Rule 6: lines about to be written back whose durable event is an older clean
        // extent (a dirty duplicate not committed yet) are dropped durably first. No commit
        // here: the engine has already unmapped the reclaimed segment's lines.
        let ls = self.ls();
        let shadowed: Vec<u64> = steps
            .iter()
            .filter_map(|st| match *st {
                Step::WriteBack { ssd, hdd, .. }
                    if self.shadowed.contains(&(hdd / ls)) && !done.contains(&(ssd, hdd)) =>
                {
                    Some(hdd / ls)
                }
                _ => None,
            })
            .collect();
        self.drop_durably(&shadowed, false)?;
        for st in steps {
            match st {
                Step::WriteSsd { ssd, .. } => {
                    self.seal((ssd / seg_size) as u32).map_err(Self::mid_plan)?
                }
                Step::WriteBack { ssd, hdd, .. } => {
                    if !done.contains(&(ssd, hdd)) {
                        // Not written back first (the engine chose another victim than the
                        // one it proposed: it never does). A failure here stops the volume.
                        self.write_back((ssd / seg_size) as u32, (ssd % seg_size) as u32, hdd)
                            .map_err(|e| io_err(format!("write-back during a reclaim: {e}")))?;
                    }
                    written_back.push(hdd / self.ls());
                }
                Step::TrimSsd { .. } => {}
                s => return Err(io_err(format!("unexpected step {s:?} in a reserve plan"))),
            }
        }
        if let Some(o) = before {
            if has_dead && self.segs[o as usize].sealed && !(reclaimed && now == Some(o)) {
                self.hdr_stale.insert(o);
            }
        }
        let Some(now) = now else {
            return Err(no_room.expect("checked above"));
        };
        if before != Some(now) || reclaimed {
            if reclaimed {
                self.reclaim(now, &written_back).map_err(Self::mid_plan)?;
            }
            let gen = self.eng.segments()[now as usize].gen;
            let buf = self
                .spare
                .pop()
                .unwrap_or_else(|| vec![0u8; seg_size as usize]);
            self.bufs.insert(now, buf);
            let m = &mut self.segs[now as usize];
            m.gen = gen;
            m.sealed = false;
            m.exts.clear();
            m.dead.clear();
            m.durable = 0;
            m.durable_fill = 0;
        }
        Ok(())
    }

    /// Seals an open segment: its bytes, then its header.
    fn seal(&mut self, s: u32) -> io::Result<()> {
        self.backing_sync_if_dirty()?;
        let m = &self.segs[s as usize];
        let (from, to) = (m.durable_fill as usize, m.fill() as usize);
        if to > from {
            let buf = self.bufs.remove(&s).expect("open segment buffer");
            let at = self.geo.data_offset(s) + from as u64;
            let r = self.cache_write(&buf[from..to], at);
            self.live.ssd_data_bytes_written += (to - from) as u64;
            self.bufs.insert(s, buf);
            r?;
        }
        // The buffer stays until the bytes are durable: if the cache fails here, its dirty
        // lines are copied to the backing device from RAM (`fail_cache`), not read back
        // from a device that failed to store them.
        self.cache_sync()?;
        if let Some(b) = self.bufs.remove(&s) {
            self.spare.push(b);
        }
        self.segs[s as usize].sealed = true;
        // Write-through: superseded extents are marked dead now (rule 7). What superseded
        // them is on the backing device, synced above, so losing both reads the new bytes;
        // left live, a superseded extent would come back over them after a crash.
        let keep_flags = self.sb.mode != Mode::WriteThrough;
        self.write_header(s, true, keep_flags)?;
        self.cache_sync()?;
        let m = &mut self.segs[s as usize];
        m.durable = m.exts.len();
        m.durable_fill = m.fill();
        Ok(())
    }

    fn write_back(&mut self, seg: u32, off: u32, hdd: u64) -> io::Result<()> {
        let ext = self.segs[seg as usize]
            .ext_at(off)
            .copied()
            .ok_or_else(|| io_err(format!("write-back of unknown extent {seg}:{off}")))?;
        if !self.load_stored(seg, &ext)? {
            self.live.extent_crc_errors += 1;
            // InvalidData: nothing changed; the line stays mapped to its damaged extent (its
            // reads fail, never older bytes) and its segment is not reclaimed (`reserve`).
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "dirty extent {seg}:{off} of volume byte {hdd} fails its checksum at write-back"
                ),
            ));
        }
        let mut line = std::mem::take(&mut self.scratch);
        line.resize(self.ls() as usize, 0);
        let stored = std::mem::take(&mut self.stored);
        let r = self.red.expand(&stored, ext.compressed, &mut line);
        self.stored = stored;
        r.map_err(io_err)?;
        let w = self.backing.write_at(&line, hdd);
        self.scratch = line;
        w.map_err(backing_fault)?;
        self.hdd_dirty = true;
        self.live.write_backs += 1;
        self.live.backing_bytes_written += self.ls();
        Ok(())
    }

    /// Rule 8: writes back `wbs` (a victim's `WriteBack` steps, before the engine reclaims
    /// it) and syncs the backing device. A backing-device failure enters (or stays in) the
    /// degraded state and returns a backing fault: the extents stay dirty, nothing else
    /// changed. While degraded, nothing is tried before the backoff has passed. Success ends
    /// the degraded state.
    fn write_back_first(&mut self, wbs: &[Step]) -> io::Result<()> {
        if let Some(d) = self.degraded.as_ref().filter(|d| !d.due()) {
            return Err(backing_fault(io::Error::new(
                d.last_kind,
                format!("write-backs paused after a failure ({})", d.last_error),
            )));
        }
        let ls = self.ls();
        let seg_size = self.sb.segment_size;
        // Rule 6: a line whose durable event is an older clean extent (a dirty duplicate
        // or extent not committed yet) must not be written back before its newer event is
        // durable: a commit first (no reclamation is under way). Not a drop record, as the
        // in-reserve path does: a drop would outlive a failed write-back and lose the line.
        if wbs.iter().any(
            |st| matches!(*st, Step::WriteBack { hdd, .. } if self.shadowed.contains(&(hdd / ls))),
        ) {
            self.commit()?;
        }
        let mut written = Vec::new();
        let r = (|| -> io::Result<()> {
            self.backing_sync_if_dirty().map_err(backing_fault)?;
            for st in wbs {
                if let Step::WriteBack { ssd, hdd, .. } = *st {
                    self.write_back((ssd / seg_size) as u32, (ssd % seg_size) as u32, hdd)?;
                    written.push(hdd / ls);
                }
            }
            self.backing.sync().map_err(backing_fault)?;
            self.live.backing_syncs += 1;
            Ok(())
        })();
        match r {
            Ok(()) => {
                self.hdd_dirty = false;
                self.unsynced_lines.clear();
                Degraded::healed(&mut self.degraded);
                Ok(())
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    // A damaged extent: the lines written before it stay dirty too.
                    self.unsynced_lines.extend(written);
                } else if matches!(fault_of(&e), Some(Fault::Backing(_))) {
                    // The lines written are still dirty in the cache: no clean extent
                    // claims them, so the unsynced backing writes need no sync (the backing
                    // device fails it anyway) — as long as no clean extent is made of them
                    // later (a read after a trim would see the backing device's unsynced
                    // bytes): such reads are not admitted until a backing sync succeeds.
                    self.unsynced_lines.extend(written);
                    // Write-through lines written before it (a mode switch) still need
                    // their sync (`backing_sync_if_dirty`).
                    self.hdd_dirty = !self.hdd_unsynced.is_empty();
                    self.backing_write_errors += 1;
                    Degraded::failed(&mut self.degraded, &e);
                }
                Err(e)
            }
        }
    }

    /// Fails the cache (rule 8): copies every dirty line it can still read to the backing
    /// device (what it cannot is recorded lost), records the failure (state file, superblock
    /// erase) and passes every later request through to the backing device.
    fn fail_cache(&mut self, reason: &str) {
        if self.pass_through {
            return;
        }
        tracing::error!(
            "cache device failed ({reason}): writing back dirty data and switching to pass-through"
        );
        let ls = self.ls();
        let dirty = self.dirty_in_lba_order();
        // Lines written through since the last backing sync: from now on only the backing
        // device holds them, so its sync below must cover them; after a failed sync
        // (`resync`) they are copied again first.
        let mut through: Vec<(u64, ExtentInfo)> = self
            .hdd_unsynced
            .iter()
            .filter_map(|&l| self.eng.locate(0, l).map(|i| (l, i)))
            .filter(|(_, i)| !i.dirty)
            .collect();
        through.sort_unstable_by_key(|x| x.0);
        let first: Vec<(u64, ExtentInfo)> = if self.resync {
            dirty.iter().chain(&through).copied().collect()
        } else {
            dirty.clone()
        };
        let mut copied = self.copy_to_backing(&first, "cache failed, dirty line not copied");
        self.live.failure_write_backs += copied.iter().filter(|(_, i)| i.dirty).count() as u64;
        if let Err(e) = self.backing.sync() {
            // It may have dropped what it should have made durable (Linux marks the pages
            // clean): once more, and what still is not durable is reported lost (its reads
            // fail, never older bytes), since nothing but the backing device serves it now.
            tracing::error!(
                "backing device sync after the cache failed: {e}; copying the lines again"
            );
            if !self.resync {
                copied.extend(through.iter().copied());
            }
            let again = self.copy_to_backing(&copied, "cache failed, line not copied again");
            if let Err(e) = self.backing.sync() {
                for (line, _) in again {
                    degrade::lose(
                        &mut self.lost,
                        line * ls,
                        (line + 1) * ls,
                        self.sb.backing_size,
                        &format!("cache failed and the backing device failed to sync it: {e}"),
                    );
                }
            }
        }
        self.hdd_dirty = false;
        self.hdd_unsynced.clear();
        self.resync = false;
        self.pass_through = true;
        self.degraded = None;
        self.bufs.clear();
        let st = degrade::fail_state(self.sb.uuid, reason, &self.lost);
        let recorded = degrade::record_failure(self.state_path.as_deref(), &*self.cache, &st);
        self.failure_unrecorded = (!recorded).then_some(st);
        if self.lost.is_empty() {
            tracing::error!("cache failed; no dirty data was lost; now in pass-through");
        } else {
            tracing::error!(
                "cache failed; dirty data LOST in {} ranges, {} bytes (reads of them fail until rewritten): {:?}",
                self.lost.len(),
                degrade::lost_bytes(&self.lost),
                self.lost
            );
        }
    }

    /// Copies `lines` from the cache to the backing device (failing the cache); a line that
    /// cannot be read is reported lost (`why`). Returns those copied.
    fn copy_to_backing(
        &mut self,
        lines: &[(u64, ExtentInfo)],
        why: &str,
    ) -> Vec<(u64, ExtentInfo)> {
        let ls = self.ls();
        let mut buf = vec![0u8; ls as usize];
        let mut done = Vec::new();
        for &(line, info) in lines {
            let r = match self.read_extent(&info, &mut buf) {
                Ok(true) => self.backing.write_at(&buf, line * ls),
                Ok(false) => Err(io_err("its extent fails its checksum")),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => done.push((line, info)),
                Err(e) => degrade::lose(
                    &mut self.lost,
                    line * ls,
                    (line + 1) * ls,
                    self.sb.backing_size,
                    &format!("{why}: {e}"),
                ),
            }
        }
        done
    }

    /// A request on a failed cache: served by the backing device alone (rule 8).
    /// The dirty lines and their extents, in backing-device order (for writing them back).
    fn dirty_in_lba_order(&self) -> Vec<(u64, ExtentInfo)> {
        let mut dirty: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(_, i)| i.dirty)
            .map(|(k, i)| (LogEngine::key_line(k).1, i))
            .collect();
        dirty.sort_unstable_by_key(|x| x.0);
        dirty
    }

    fn direct(&mut self, req: Direct<'_>) -> io::Result<()> {
        self.live.pass_through_requests += 1;
        if matches!(req, Direct::Write(..) | Direct::Trim(..)) {
            if let Some(st) = self.failure_unrecorded.take() {
                if !degrade::record_failure(self.state_path.as_deref(), &*self.cache, &st) {
                    self.failure_unrecorded = Some(st);
                    return Err(degrade::unrecorded_error(self.state_path.as_deref()));
                }
            }
        }
        let r = match req {
            Direct::Read(off, buf) => degrade::lost_check(&self.lost, off, off + buf.len() as u64)
                .and_then(|_| self.backing.read_at(buf, off)),
            Direct::Write(off, data, fua) => {
                let r = self.backing.write_at(data, off);
                if r.is_ok() {
                    degrade::unlose(&mut self.lost, off, off + data.len() as u64);
                }
                r.and_then(|_| if fua { self.backing.sync() } else { Ok(()) })
            }
            Direct::Flush => self.backing.sync(),
            Direct::Trim(off, len) => {
                degrade::unlose(&mut self.lost, off, off + len);
                Ok(())
            }
        };
        if r.is_err() {
            self.backing_errors += 1;
        }
        r
    }

    /// Finishes reclaiming `v` (its write-backs done): drops for the lines it unmapped, a
    /// commit, then the empty header of the next generation.
    fn reclaim(&mut self, v: u32, written_back: &[u64]) -> io::Result<()> {
        let keys: Vec<u64> = self.segs[v as usize]
            .exts
            .iter()
            .map(|e| e.key)
            .chain(written_back.iter().map(|&l| LogEngine::line_key(0, l)))
            .collect();
        for k in keys {
            let (vol, l) = LogEngine::key_line(k);
            if self.eng.locate(vol, l).is_none() {
                let seq = self.next_seq();
                self.pending.push(Rec::Drop { key: k, seq });
            }
        }
        self.hdr_stale.remove(&v);
        self.commit()?;
        let gen = self.eng.segments()[v as usize].gen;
        let m = &mut self.segs[v as usize];
        m.gen = gen;
        m.sealed = false;
        m.exts.clear();
        m.dead.clear();
        self.write_header(v, false, false)?;
        self.cache_sync()
    }

    /// Base records of the open segments' extents from `all` or only the new ones.
    fn open_records(&mut self, all: bool) -> Vec<Rec> {
        self.sync_dead();
        let mut out = Vec::new();
        for s in 0..self.segs.len() as u32 {
            let m = &self.segs[s as usize];
            if m.sealed || m.exts.is_empty() {
                continue;
            }
            let from = if all { 0 } else { m.durable };
            for e in &m.exts[from..] {
                let mut e = *e;
                e.live = self.is_live(s, &e);
                out.push(Rec::Base {
                    seg: s,
                    gen: m.gen,
                    ext: e,
                });
            }
        }
        out
    }

    /// Writes the new bytes of the open segments and syncs.
    fn write_open_data(&mut self) -> io::Result<()> {
        self.backing_sync_if_dirty()?;
        let mut any = false;
        let open: Vec<u32> = self.bufs.keys().copied().collect();
        for s in open {
            let m = &self.segs[s as usize];
            if m.sealed {
                continue;
            }
            let (from, to) = (m.durable_fill as usize, m.fill() as usize);
            if to > from {
                let buf = self.bufs.remove(&s).unwrap();
                let at = self.geo.data_offset(s) + from as u64;
                let r = self.cache_write(&buf[from..to], at);
                self.live.ssd_data_bytes_written += (to - from) as u64;
                self.bufs.insert(s, buf);
                r?;
                any = true;
            }
        }
        if any {
            self.cache_sync()?;
        }
        Ok(())
    }

    fn mark_open_durable(&mut self) {
        for m in &mut self.segs {
            if !m.sealed {
                m.durable = m.exts.len();
                m.durable_fill = m.fill();
            }
        }
    }

    fn journal_write(
        &mut self,
        half: u32,
        at_rec: u64,
        recs: &[Rec],
        epoch: u64,
    ) -> io::Result<()> {
        let frame = Frame {
            start: at_rec as u32,
            end: (at_rec + recs.len() as u64) as u32,
        };
        let mut b = Vec::with_capacity(recs.len() * REC_BYTES);
        for r in recs {
            r.encode_framed(epoch, frame, &mut b);
        }
        let off = self.geo.half_offset(half) + HALF_HEADER + at_rec * REC_BYTES as u64;
        self.live.journal_records_written += recs.len() as u64;
        self.cache_write(&b, off)
    }

    /// A clean shutdown's end record, after its last commit (see the module doc, rule 6).
    fn write_end(&mut self) -> io::Result<()> {
        if self.jused >= self.sb.journal_records {
            self.checkpoint()?;
        }
        debug_assert!(self.jused < self.sb.journal_records);
        let end = Rec::End {
            seq: self.next_seq(),
        };
        let (half, at, epoch) = (self.half, self.jused, self.epoch);
        self.journal_write(half, at, &[end], epoch)?;
        self.cache_sync()?;
        self.jused += 1;
        Ok(())
    }

    /// FLUSH: see the module doc, rule 3.
    fn commit(&mut self) -> io::Result<()> {
        self.write_open_data()?;
        let mut recs = self.open_records(false);
        recs.append(&mut self.pending);
        let r = self.sb.journal_records;
        let reserve = self.commit_every + 2 * self.sb.max_extents as u64;
        if self.jused + recs.len() as u64 + reserve > r {
            // Pending drops go into the checkpoint; everything else it lists afresh.
            self.pending = recs
                .into_iter()
                .filter(|r| matches!(r, Rec::Drop { .. }))
                .collect();
            return self.checkpoint();
        }
        if !recs.is_empty() {
            let (half, at, epoch) = (self.half, self.jused, self.epoch);
            self.journal_write(half, at, &recs, epoch)?;
            self.cache_sync()?;
            self.jused += recs.len() as u64;
            self.mark_open_durable();
            self.live.commits += 1;
        }
        // Stale headers wait for the next checkpoint (module doc, rule 3), unless the drops
        // that checkpoint might have to add for them (at most one per drop appended since
        // the last rewrite, plus the open segments' extents) could make it overflow a half:
        // then they are rewritten now, every superseding event being durable.
        let drops = recs
            .iter()
            .filter(|r| matches!(r, Rec::Drop { .. }))
            .count() as u64;
        self.drops_since_rewrite += drops;
        let me = self.sb.max_extents as u64;
        let room = r.saturating_sub(self.dups_upper + 3 * me + 2 * self.commit_every);
        if self.drops_since_rewrite + 3 * me >= room {
            self.rewrite_stale_headers()?;
        }
        self.fresh_dups.clear();
        self.shadowed.clear();
        if self.dups_upper >= self.dup_budget && self.dups_upper > self.dups_at_checkpoint {
            // Recount the duplicate entries (stale ones die with their segments).
            self.checkpoint()?;
        }
        Ok(())
    }

    fn rewrite_stale_headers(&mut self) -> io::Result<()> {
        self.drops_since_rewrite = 0;
        if self.hdr_stale.is_empty() {
            return Ok(());
        }
        let stale = std::mem::take(&mut self.hdr_stale);
        for s in stale {
            if self.segs[s as usize].sealed {
                self.write_header(s, true, false)?;
                self.live.header_rewrites += 1;
            }
        }
        self.cache_sync()
    }

    /// Drop records, for a checkpoint's `recs`, of the lines that are not cached but whose
    /// old extent a header not rewritten yet (`hdr_stale`) still marks live: without them
    /// the new epoch would hold no event of such a line (its drop, committed earlier, is in
    /// the old half), and a crash before `rewrite_stale_headers` would bring the old extent
    /// back. It happens in write-back, where a seal marks every extent live (see `reserve`):
    /// a line's clean extent in an open segment, the line overwritten, then written back
    /// and unmapped by a reclamation (drop committed), then the segment sealed and a
    /// checkpoint before the next header rewrite (`log_crash_points_flushed_lines_*`).
    /// Likewise for the dead extents of open segments: the checkpoint lists them not live,
    /// but the seal's header (newest for them) will say live until the next commit.
    /// Lines cached elsewhere need nothing: the checkpoint lists their current event, newer.
    fn stale_header_drops(&mut self, recs: &mut Vec<Rec>) {
        self.sync_dead();
        let dropped: std::collections::HashSet<u64> = recs
            .iter()
            .filter_map(|r| match *r {
                Rec::Drop { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        let mut keys = Vec::new();
        // Open segments too: a write-back seal will mark their dead extents live again.
        let open = (0..self.segs.len() as u32).filter(|&s| {
            let m = &self.segs[s as usize];
            !m.sealed && !m.exts.is_empty()
        });
        let segs: Vec<u32> = self.hdr_stale.iter().copied().chain(open).collect();
        for s in segs {
            let m = &self.segs[s as usize];
            // `segs` holds the stale headers (sealed: a reclamation removes its victim from
            // `hdr_stale`, and only sealed segments are added) and the open segments. A
            // sealed segment outside `hdr_stale` needs nothing: its header was written or
            // rewritten after its extents' liveness last changed (a write-through seal
            // marks dead extents dead; every later change adds it to `hdr_stale`).
            debug_assert!(!m.sealed || self.hdr_stale.contains(&s), "segment {s}");
            for e in m
                .exts
                .iter()
                .filter(|e| (e.live || !m.sealed) && m.dead.contains(&e.off))
            {
                let (v, l) = LogEngine::key_line(e.key);
                if !dropped.contains(&e.key) && self.eng.locate(v, l).is_none() {
                    keys.push(e.key);
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            let seq = self.next_seq();
            recs.push(Rec::Drop { key, seq });
        }
    }

    /// Starts a new journal epoch in the other half: see the module doc, rule 5.
    fn checkpoint(&mut self) -> io::Result<()> {
        self.write_open_data()?;
        let mut recs = self.open_records(true);
        // A write-through request's lines dropped durably (rule 7) but not rewritten yet
        // keep their drop as newest event: their duplicate entries are not listed afresh.
        let wt = self.sb.mode == Mode::WriteThrough;
        let dups: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(k, i)| {
                i.dup && !(wt && self.dropped_now.contains(&LogEngine::key_line(*k).1))
            })
            .collect();
        self.dups_upper = dups.len() as u64;
        self.dups_at_checkpoint = self.dups_upper;
        for (key, i) in dups {
            let seq = self.next_seq();
            recs.push(Rec::Dup {
                key,
                seg: i.seg,
                gen: i.gen,
                off: i.off,
                dirty: i.dirty,
                seq,
            });
        }
        recs.append(&mut self.pending);
        self.stale_header_drops(&mut recs);
        if recs.len() as u64 > self.sb.journal_records {
            return Err(io_err(format!(
                "journal checkpoint of {} records does not fit a half of {}",
                recs.len(),
                self.sb.journal_records
            )));
        }
        let (half, epoch) = (1 - self.half, self.epoch + 1);
        self.journal_write(half, 0, &recs, epoch)?;
        self.cache_sync()?;
        let h = encode_half(epoch);
        let off = self.geo.half_offset(half);
        self.cache_write(&h, off)?;
        self.cache_sync()?;
        self.half = half;
        self.epoch = epoch;
        self.jused = recs.len() as u64;
        self.mark_open_durable();
        self.live.checkpoints += 1;
        self.rewrite_stale_headers()?;
        self.fresh_dups.clear();
        self.shadowed.clear();
        Ok(())
    }

    /// Records what `eng` did with `line` (reduced to `p`, raw bytes `raw`): a base extent
    /// goes into its open segment's buffer, a duplicate entry becomes a pending record.
    fn record_new(&mut self, line: u64, p: &PreLine, raw: &[u8]) -> io::Result<()> {
        let r = &p.red;
        let info = self
            .eng
            .locate(0, line)
            .ok_or_else(|| io_err(format!("line {line} not cached after admission")))?;
        let key = LogEngine::line_key(0, line);
        let seq = self.next_seq();
        if info.dup {
            self.fresh_dups.insert(key);
            self.pending.push(Rec::Dup {
                key,
                seg: info.seg,
                gen: info.gen,
                off: info.off,
                dirty: info.dirty,
                seq,
            });
            self.dups_upper += 1;
            return self.maybe_commit();
        }
        let stored: &[u8] = if r.compressed { &p.comp } else { raw };
        if info.len as usize != stored.len() || !info.open {
            return Err(io_err(format!(
                "engine placed line {line} as {info:?}, stored bytes {}",
                stored.len()
            )));
        }
        let crc = p.crc;
        debug_assert_eq!(crc, crc32c::crc32c(stored));
        let buf = self
            .bufs
            .get_mut(&info.seg)
            .ok_or_else(|| io_err("no buffer for the open segment"))?;
        buf[info.off as usize..(info.off + info.len) as usize].copy_from_slice(stored);
        let m = &mut self.segs[info.seg as usize];
        debug_assert_eq!(m.fill(), info.off);
        m.exts.push(Ext {
            key,
            hash: r.hash,
            off: info.off,
            len: info.len,
            dirty: info.dirty,
            compressed: r.compressed,
            live: true,
            crc,
            seq,
        });
        Ok(())
    }

    /// The old extent of `line` is about to be superseded.
    fn superseding(&mut self, line: u64) {
        if let Some(i) = self.eng.locate(0, line) {
            if !i.dup && self.segs[i.seg as usize].sealed {
                self.hdr_stale.insert(i.seg);
            }
            if !i.dirty && self.durable(&i, LogEngine::line_key(0, line)) {
                self.shadowed.insert(line);
            }
        }
    }

    /// Whether the event mapping `key` to `i` is durable: a base extent sealed or committed,
    /// a duplicate whose record is not pending.
    fn durable(&self, i: &ExtentInfo, key: u64) -> bool {
        if i.dup {
            return !self.fresh_dups.contains(&key);
        }
        let m = &self.segs[i.seg as usize];
        m.sealed || i.off < m.durable_fill
    }

    /// Rule 6: before the backing device is written for `lines`, their durable clean
    /// extents are dropped durably: one journal append, one sync. `may_commit`: a commit
    /// may make room in the journal (not inside a reserve, whose reclamation is half done:
    /// there the drops use the room kept for the next commit, which then checkpoints).
    fn drop_durably(&mut self, lines: &[u64], may_commit: bool) -> io::Result<()> {
        let need: Vec<u64> = lines
            .iter()
            .copied()
            .filter(|&l| {
                self.shadowed.contains(&l)
                    || self
                        .eng
                        .locate(0, l)
                        .is_some_and(|i| self.durable(&i, LogEngine::line_key(0, l)))
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let recs: Vec<Rec> = need
            .iter()
            .map(|&l| Rec::Drop {
                key: LogEngine::line_key(0, l),
                seq: self.next_seq(),
            })
            .collect();
        // Before the journal write: a checkpoint the commit below may run must not list
        // these lines' duplicate entries afresh (with newer sequence numbers).
        self.dropped_now.extend(need.iter().copied());
        let reserve = self.commit_every + 2 * self.sb.max_extents as u64;
        let n = recs.len() as u64;
        if !may_commit && self.jused + n > self.sb.journal_records {
            return Err(io_err(format!(
                "journal full: no room for {n} drop records before a write-back"
            )));
        }
        if may_commit && self.jused + n + reserve > self.sb.journal_records {
            // A checkpoint makes room (and carries these drops, being pending).
            self.pending.extend(recs.iter().copied());
            self.commit()?;
        } else {
            let (half, at, epoch) = (self.half, self.jused, self.epoch);
            self.journal_write(half, at, &recs, epoch)?;
            self.cache_sync()?;
            self.jused += recs.len() as u64;
            // Until the next commit rewrites the headers, a checkpoint must carry them.
            self.pending.extend(recs.iter().copied());
        }
        for &l in &need {
            self.shadowed.remove(&l);
        }
        self.live.early_drops += need.len() as u64;
        self.live.early_drop_syncs += 1;
        Ok(())
    }

    /// Reduces a line under the lock (read-miss admissions and partial-line writes; whole
    /// lines of a write are reduced before the lock is taken, `LogVolume::pre_reduce`).
    fn reduce(&mut self, data: &[u8]) -> io::Result<PreLine> {
        reduce_line(&mut self.red, data)
    }

    fn content(&self, r: &Reduced) -> ExtentContent {
        ExtentContent {
            fp: self.fp_of(&r.hash),
            compressed_len: r.stored_len,
        }
    }

    /// Admits a read-missed line with its bytes.
    fn admit(&mut self, line: u64, data: &[u8]) -> io::Result<()> {
        self.reserve(false)?;
        let p = self.reduce(data)?;
        let c = self.content(&p.red);
        self.vet_fingerprint(c.fp, &p.red.hash);
        let steps = self.eng.admit(0, line, c).steps.len();
        if steps != 0 {
            return Err(io_err("admission after reserve planned device steps"));
        }
        self.record_new(line, &p, data)
    }

    /// Writes one whole line (`pre`: reduced already, before the lock was taken).
    fn write_line(
        &mut self,
        line: u64,
        data: &[u8],
        fua: bool,
        pre: Option<&PreLine>,
    ) -> io::Result<()> {
        // Write-back FUA: a dirty write, then the caller's commit (rule 7).
        let wb = self.sb.mode == Mode::WriteBack;
        let fua = fua && !wb;
        let dirty = wb;
        self.reserve(dirty)?;
        let here;
        let p = match pre {
            Some(p) => p,
            None => {
                here = self.reduce(data)?;
                &here
            }
        };
        let c = self.content(&p.red);
        self.vet_fingerprint(c.fp, &p.red.hash);
        if self.sb.mode == Mode::WriteThrough && !self.dropped_now.contains(&line) {
            // Its extent may have become durable since the request's drops (sealed by a
            // reserve of an earlier line of the request): rule 7.
            self.drop_durably(&[line], true)?;
        }
        self.superseding(line);
        let ls = self.ls();
        let mut req = Request::write(line * ls, ls);
        req.fua = fua;
        let steps = self.eng.process(&req, &[c]).map_err(io_err)?.steps.clone();
        let mut failed = None;
        for st in steps {
            match st {
                Step::WriteHdd { hdd, len, .. } => {
                    self.hdd_dirty = true;
                    if let Err(e) = self.backing.write_at(&data[..len as usize], hdd) {
                        failed = Some(e);
                        break;
                    }
                    self.live.backing_bytes_written += len;
                    self.hdd_unsynced.insert(line);
                }
                Step::ReadSsd { .. } | Step::ReadHdd { .. } => {}
                s => return Err(io_err(format!("unexpected step {s:?} in a line write"))),
            }
        }
        self.record_new(line, p, data)?;
        if let Some(e) = failed {
            // The write failed on the backing device: the line is dropped from the cache
            // (its contents are unspecified after a failed write), the volume stays
            // consistent and the request fails.
            self.hdd_unsynced.remove(&line);
            self.unmap(line)?;
            return Err(backing_fault(e));
        }
        Ok(())
    }

    /// A read of `line`: the engine's bookkeeping, then either the line served under the
    /// lock (`None`) or, when `unlocked` allows it, a hit on a sealed segment for the caller
    /// to read after releasing the lock (`Some`; see `LogVolume::read`).
    fn read_line(
        &mut self,
        line: u64,
        out: &mut [u8],
        unlocked: bool,
    ) -> io::Result<Option<Unlocked>> {
        let ls = self.ls();
        self.eng
            .process(&Request::read(line * ls, ls), &[])
            .map_err(io_err)?;
        if let Some(info) = self.eng.locate(0, line).filter(|_| unlocked) {
            let m = &self.segs[info.seg as usize];
            if m.sealed && m.gen == info.gen {
                if let Some(ext) = m.ext_at(info.off).copied() {
                    return Ok(Some(Unlocked {
                        seg: info.seg,
                        gen: m.gen,
                        ext,
                    }));
                }
            }
        }
        self.serve_line(line, out)?;
        Ok(None)
    }

    /// Serves a read of `line` under the lock (the engine has seen the read already).
    fn serve_line(&mut self, line: u64, out: &mut [u8]) -> io::Result<()> {
        if let Some(info) = self.eng.locate(0, line) {
            if self.read_cached(line, &info, out)? {
                return Ok(());
            }
            return self.read_backing(line, out);
        }
        self.read_backing(line, out)?;
        if self.unsynced_lines.contains(&line) {
            // Rule 2: the backing device may not hold these bytes durably (rule 8).
            return Ok(());
        }
        match self.admit(line, out) {
            // No room to cache it (the backing device fails write-backs, rule 8): the read
            // is served all the same (`reserve` left the volume consistent).
            Err(e) if matches!(fault_of(&e), Some(Fault::Backing(_))) => Ok(()),
            r => r,
        }
    }

    /// Reads the records of journal half `h` (epoch `epoch`) up to its end: the first record
    /// that does not verify, or the end record. Then tells a torn tail from damage (module
    /// doc, rule 6): returns the records to replay (with a salvage, the valid ones after the
    /// damage too) and the damage found.
    fn scan_journal(
        &mut self,
        h: u32,
        epoch: u64,
        framed: bool,
    ) -> io::Result<(Vec<Rec>, Vec<LogDamage>, u64)> {
        // After the end, scanning goes on until this many records in a row do not verify.
        const TAIL: u64 = 4096;
        let total = self.sb.journal_records;
        let base = self.geo.half_offset(h) + HALF_HEADER;
        let chunk = 4096u64;
        let mut buf = vec![0u8; chunk as usize * REC_BYTES];
        let mut recs = Vec::new();
        let mut first_bad: Option<u64> = None;
        let mut ended = false;
        let mut later: Vec<(u64, Rec, Frame)> = Vec::new();
        let mut misses = 0u64;
        let mut i = 0u64;
        'scan: while i < total {
            let n = chunk.min(total - i);
            self.cache.read_at(
                &mut buf[..n as usize * REC_BYTES],
                base + i * REC_BYTES as u64,
            )?;
            for r in buf[..n as usize * REC_BYTES].chunks_exact(REC_BYTES) {
                let got = Rec::decode_framed(r, epoch);
                if first_bad.is_some() {
                    match got {
                        // A clean shutdown's end record: nothing follows it.
                        Some((Rec::End { .. }, _)) => break 'scan,
                        Some((rec, frame)) => {
                            later.push((i, rec, frame));
                            misses = 0;
                        }
                        None => misses += 1,
                    }
                    if misses >= TAIL {
                        break 'scan;
                    }
                } else {
                    match got {
                        Some((Rec::End { .. }, _)) => {
                            ended = true;
                            break 'scan;
                        }
                        Some((rec, _)) => recs.push(rec),
                        None => first_bad = Some(i),
                    }
                }
                i += 1;
            }
        }
        let clean = self.sb.clean;
        let Some(bad) = first_bad else {
            // Ended by its end record, or the half is full.
            if clean && framed && !ended {
                let offset = base + total * REC_BYTES as u64;
                return Ok((
                    recs,
                    vec![LogDamage {
                        what: "journal end",
                        half: Some(h),
                        record: Some(total),
                        segment: None,
                        slot: None,
                        offset,
                        message: format!(
                            "journal half {h}: full without its end record after a clean stop"
                        ),
                    }],
                    0,
                ));
            }
            return Ok((recs, Vec::new(), 0));
        };
        let offset = base + bad * REC_BYTES as u64;
        let torn = !clean
            && later.iter().all(|&(_, _, f)| {
                f.end == 0 // written before frames: the previous rule (replay to here)
                    || (f == later[0].2 && (f.start as u64) <= bad && bad < f.end as u64)
            });
        let why = if !later.is_empty() && !torn {
            format!(
                "{} later record(s) verify{}",
                later.len(),
                if clean {
                    " and the cache was stopped cleanly"
                } else {
                    ", written after it by completed writes (not a torn tail)"
                }
            )
        } else if clean && framed {
            "the cache was stopped cleanly but its journal does not reach its end record".into()
        } else {
            // The legitimate end after a crash: a torn last write, or simply the end.
            return Ok((recs, Vec::new(), 0));
        };
        let message = format!("journal half {h} record {bad} (byte {offset}): damaged: {why}");
        let damage = LogDamage {
            what: "journal record",
            half: Some(h),
            record: Some(bad),
            segment: None,
            slot: None,
            offset,
            message,
        };
        let salvaged = later.len() as u64;
        if self.salvage {
            recs.extend(later.into_iter().map(|(_, r, _)| r));
        }
        Ok((recs, vec![damage], salvaged))
    }

    /// Rebuilds everything from the headers and the journal: see the module doc.
    /// The log layout's half of `volume::verify_clean_sample` (same rules): compares a sample
    /// of clean cached lines with the backing device after recovery. After a clean shutdown a
    /// difference means the backing device changed behind the cache: every clean line is
    /// dropped, or with dirty lines cached the open is refused (the superblock is marked as
    /// it was found, so the next attempt judges the same way) unless
    /// `accept_backing_changes`. After a crash only the differing lines are dropped, unless
    /// all sampled lines differ.
    fn verify_clean_sample(
        &mut self,
        rep: &mut LogOpenReport,
        opts: &LogOpenOptions,
    ) -> io::Result<()> {
        let ls = self.ls();
        let mut clean: Vec<(u64, ExtentInfo)> = self
            .eng
            .entries()
            .filter(|(_, i)| !i.dirty)
            .map(|(k, i)| (LogEngine::key_line(k).1, i))
            .collect();
        if clean.is_empty() {
            return Ok(());
        }
        clean.sort_unstable_by_key(|&(line, _)| line);
        let k = clean.len().min(crate::identity::sample_size(ls));
        let (mut a, mut b) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
        let mut differ = Vec::new();
        for j in 0..k {
            let (line, info) = clean[j * clean.len() / k];
            let n = self.sb.backing_size.saturating_sub(line * ls).min(ls) as usize;
            let ok = self.read_extent(&info, &mut a)?;
            self.read_backing(line, &mut b)?;
            if !ok || a[..n] != b[..n] {
                differ.push(line);
            }
        }
        rep.sampled_clean_lines = k as u64;
        rep.differing_clean_lines = differ.len() as u64;
        if differ.is_empty() {
            return Ok(());
        }
        let first = differ[0] * ls;
        let changed = rep.was_clean || (differ.len() == k && k >= 8);
        let drop: Vec<u64> = if changed {
            let dirty = self.eng.dirty_lines();
            if dirty > 0 && !opts.accept_backing_changes {
                // Nothing was dropped: put the clean flag back as it was found. Recovery
                // began a new journal epoch; a clean flag needs it ended by an end record
                // (module doc, rule 6), as a clean shutdown would.
                if rep.was_clean {
                    self.commit()?;
                    self.write_end()?;
                }
                self.sb.clean = rep.was_clean;
                let b = self.sb.encode();
                self.cache.write_at(&b, 0)?;
                self.cache_sync()?;
                return Err(io::Error::other(
                    crate::format::FormatError::BackingChanged {
                        backing: self.sb.backing.describe(),
                        differ: differ.len() as u64,
                        sampled: k as u64,
                        first,
                        dirty_lines: dirty,
                    }
                    .to_string(),
                ));
            }
            clean.iter().map(|&(line, _)| line).collect()
        } else {
            differ
        };
        for &line in &drop {
            self.unmap(line)?;
        }
        self.commit()?;
        rep.dropped_clean_lines = drop.len() as u64;
        rep.cached_lines = rep.cached_lines.saturating_sub(drop.len() as u64);
        tracing::warn!(
            "{} of {k} clean cached lines sampled differ from the backing device {} (first at volume byte {first}){}: dropped {} clean lines",
            rep.differing_clean_lines,
            self.sb.backing.describe(),
            if changed {
                ": it changed behind the cache"
            } else {
                " after an unclean shutdown (writes in flight at the crash)"
            },
            drop.len()
        );
        Ok(())
    }

    fn recover(&mut self) -> io::Result<LogOpenReport> {
        let mut rep = LogOpenReport {
            was_clean: self.sb.clean,
            ..Default::default()
        };
        let n = self.sb.segments as u32;
        let maxe = self.sb.max_extents;
        let slot_bytes = self.geo.slot_bytes as usize;
        let mut maxseq = 0u64;
        let mut b = vec![0u8; slot_bytes];
        // Header slots that start with the magic but do not verify: torn or damaged.
        let mut bad_slots: Vec<(u32, u32)> = Vec::new();
        for s in 0..n {
            let mut best: Option<(u32, SegHeader)> = None;
            for slot in 0..2 {
                self.cache
                    .read_at(&mut b[..4096], self.geo.slot_offset(s, slot))?;
                let Some(cnt) = SegHeader::count(&b) else {
                    continue;
                };
                let need = (HDR_FIXED + cnt * HDR_ENTRY).min(slot_bytes);
                if need > 4096 {
                    self.cache
                        .read_at(&mut b[4096..need], self.geo.slot_offset(s, slot) + 4096)?;
                }
                if header_damaged(&b[..need], s, maxe) {
                    bad_slots.push((s, slot));
                }
                if let Some(h) = SegHeader::decode(&b[..need], s, maxe) {
                    if best.as_ref().is_none_or(|(_, x)| h.hseq > x.hseq) {
                        best = Some((slot, h));
                    }
                }
            }
            let m = &mut self.segs[s as usize];
            if let Some((slot, h)) = best {
                m.slot = slot;
                m.gen = h.gen;
                m.sealed = h.sealed;
                m.exts = if h.sealed { h.exts } else { Vec::new() };
                maxseq = maxseq.max(h.hseq);
            } else {
                // Never written: the next header goes to slot 0.
                m.slot = 1;
            }
        }
        // The journal: the half with the newest valid header.
        let mut hb = vec![0u8; HALF_HEADER as usize];
        let mut active: Option<(u32, u64, u8)> = None;
        for h in 0..2 {
            self.cache.read_at(&mut hb, self.geo.half_offset(h))?;
            if let Some((e, flags)) = decode_half_flags(&hb) {
                if active.is_none_or(|(_, x, _)| e > x) {
                    active = Some((h, e, flags));
                }
            }
        }
        let mut recs = Vec::new();
        let mut damage = Vec::new();
        for &(s, slot) in &bad_slots {
            if self.sb.clean {
                let offset = self.geo.slot_offset(s, slot);
                damage.push(LogDamage {
                    what: "segment header",
                    half: None,
                    record: None,
                    segment: Some(s),
                    slot: Some(slot),
                    offset,
                    message: format!(
                        "segment {s} header slot {slot} (byte {offset}): checksum fails on a cleanly stopped cache; the segment's lines would be rebuilt from the other slot's older header (or none) and could read older data"
                    ),
                });
            }
        }
        // A half whose header does not verify (or is older) but whose first record verifies
        // with a newer epoch: its checkpoint completed if the stop was clean or if a later
        // commit's records follow it, so its header is damaged (not a torn checkpoint).
        for o in 0..2u32 {
            if active.is_some_and(|(h, _, _)| h == o) {
                continue;
            }
            let newer = active.map_or(0, |(_, e, _)| e) + 1;
            let base = self.geo.half_offset(o) + HALF_HEADER;
            let mut rb = vec![0u8; REC_BYTES * 4096.min(self.sb.journal_records as usize)];
            self.cache.read_at(&mut rb, base)?;
            let epoch = u64::from_le_bytes(rb[8..16].try_into().unwrap());
            if epoch < newer || Rec::decode_framed(&rb, epoch).is_none() {
                continue;
            }
            let committed_after = rb
                .chunks_exact(REC_BYTES)
                .filter_map(|r| Rec::decode_framed(r, epoch))
                .any(|(_, f)| f.start > 0);
            if self.sb.clean || committed_after {
                let offset = self.geo.half_offset(o);
                damage.push(LogDamage {
                    what: "journal half header",
                    half: Some(o),
                    record: None,
                    segment: None,
                    slot: None,
                    offset,
                    message: format!(
                        "journal half {o} header (byte {offset}): damaged, while the half holds the newest records (epoch {epoch}); recovery would replay the older half and drop them"
                    ),
                });
                // Salvage: the records verify on their own, the half is the journal.
                active = Some((o, epoch, HALF_FRAMED));
            }
        }
        if let Some((h, epoch, flags)) = active {
            self.half = h;
            self.epoch = epoch;
            let (r, d, salvaged) = self.scan_journal(h, epoch, flags & HALF_FRAMED != 0)?;
            recs = r;
            damage.extend(d);
            if self.salvage {
                rep.salvaged_records = salvaged;
            }
        }
        if !damage.is_empty() && !self.salvage {
            let list: Vec<&str> = damage.iter().map(|d| d.message.as_str()).collect();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the cache metadata is damaged: {}. Replaying it as it is would silently drop what follows the damage; the server does not start. Run `tiercache check --repair` on the cache device (the server stopped) to salvage every record that still verifies and list what is lost",
                    list.join("; ")
                ),
            ));
        }
        for d in &damage {
            rep.unknown_lost.push(match d.what {
                "journal record" => format!(
                    "{}: the line it described is unknown; if it was a write, that line reads its previous version",
                    d.message.split(':').next().unwrap_or_default()
                ),
                "segment header" => format!(
                    "segment {} header slot {}: the extents it described are unknown; their lines read an older version (the other slot's, the journal's, or the backing device's), dirty data among them is lost",
                    d.segment.unwrap_or_default(),
                    d.slot.unwrap_or_default()
                ),
                "journal half header" => format!(
                    "{}: nothing lost (its records verify and were replayed)",
                    d.message.split(':').next().unwrap_or_default()
                ),
                _ => format!("{}: nothing lost (every record before it verifies)", d.message),
            });
        }
        rep.damage = damage;
        // From here recovery writes the device: mark it in use first, so that a crash
        // during recovery is an unclean stop (a clean flag would make the new epoch's
        // journal, which has no end record yet, look damaged).
        if self.sb.clean {
            self.sb.clean = false;
            let b = self.sb.encode();
            self.cache_write(&b, 0)?;
            self.cache_sync()?;
        }
        // Torn header slots (after a crash) and damaged ones (salvage): zeroed, so that a
        // clean stop never leaves a slot that looks damaged.
        for &(s, slot) in &bad_slots {
            self.cache_write(&[0u8; 4096], self.geo.slot_offset(s, slot))?;
        }
        rep.journal_records = recs.len() as u64;
        // Extents of segments not sealed, from base records (in the order written). A salvage
        // accepts gaps (a lost base record's extent stays unmapped).
        for r in &recs {
            maxseq = maxseq.max(r.seq());
            if let Rec::Base { seg, gen, ext } = r {
                if let Some(m) = self.segs.get_mut(*seg as usize) {
                    let next = if self.salvage {
                        m.fill() <= ext.off
                    } else {
                        m.fill() == ext.off
                    };
                    if !m.sealed && m.gen == *gen && m.ext_at(ext.off).is_none() && next {
                        if m.fill() < ext.off {
                            // A lost record's extent: its bytes stay, dead (no line maps
                            // them), so the segment's extents stay contiguous.
                            m.exts.push(Ext {
                                key: GAP_KEY,
                                hash: [0; 32],
                                off: m.fill(),
                                len: ext.off - m.fill(),
                                dirty: false,
                                compressed: false,
                                live: false,
                                crc: 0,
                                seq: 0,
                            });
                        }
                        m.exts.push(*ext);
                    } else if self.salvage
                        && !m.sealed
                        && m.gen == *gen
                        && ext.dirty
                        && ext.live
                        && m.ext_at(ext.off) != Some(ext)
                    {
                        // Overlaps what an earlier record placed: inconsistent, dropped.
                        let (_, line) = LogEngine::key_line(ext.key);
                        let start = line * self.sb.line_size;
                        rep.lost_ranges.push(crate::check::LostRange {
                            start,
                            end: start + self.sb.line_size,
                            what: format!(
                                "journal base record (seq {}) overlaps segment {seg}'s other extents: dropped, the line's dirty data is lost",
                                ext.seq
                            ),
                        });
                    }
                }
            }
        }
        for m in &self.segs {
            for e in &m.exts {
                maxseq = maxseq.max(e.seq);
            }
        }
        // Newest event per line: (seq, target); target None = unmapped.
        #[derive(Clone, Copy)]
        enum Ev {
            Base(u32, u32, bool),
            Dup(u32, u32, u32, bool),
            None,
        }
        let mut ev: HashMap<u64, (u64, Ev)> = HashMap::new();
        let put = |ev: &mut HashMap<u64, (u64, Ev)>, key: u64, seq: u64, e: Ev| {
            let slot = ev.entry(key).or_insert((0, Ev::None));
            if seq >= slot.0 {
                *slot = (seq, e);
            }
        };
        for (s, m) in self.segs.iter().enumerate() {
            if m.sealed {
                for e in m.exts.iter().filter(|e| e.live) {
                    put(&mut ev, e.key, e.seq, Ev::Base(s as u32, e.off, e.dirty));
                }
            }
        }
        for r in &recs {
            match *r {
                Rec::Base { seg, gen, ext } => {
                    let Some(m) = self.segs.get(seg as usize) else {
                        continue;
                    };
                    if m.gen != gen {
                        rep.stale_records += 1;
                        put(&mut ev, ext.key, ext.seq, Ev::None);
                    } else if !m.sealed && ext.live && m.ext_at(ext.off) == Some(&ext) {
                        put(&mut ev, ext.key, ext.seq, Ev::Base(seg, ext.off, ext.dirty));
                    }
                }
                Rec::Dup {
                    key,
                    seg,
                    gen,
                    off,
                    dirty,
                    seq,
                } => put(&mut ev, key, seq, Ev::Dup(seg, gen, off, dirty)),
                Rec::Drop { key, seq } => put(&mut ev, key, seq, Ev::None),
                Rec::End { .. } => {}
            }
        }
        let mut entries = Vec::new();
        for (&key, &(_, e)) in &ev {
            match e {
                Ev::Base(seg, off, dirty) => entries.push(RestoredEntry {
                    key,
                    seg,
                    off,
                    dirty,
                    dup: false,
                }),
                Ev::Dup(seg, gen, off, dirty) => {
                    let ok = self
                        .segs
                        .get(seg as usize)
                        .is_some_and(|m| m.gen == gen && m.ext_at(off).is_some());
                    if ok {
                        entries.push(RestoredEntry {
                            key,
                            seg,
                            off,
                            dirty,
                            dup: true,
                        });
                    } else {
                        rep.stale_records += 1;
                    }
                }
                Ev::None => {}
            }
        }
        // Restore the engine; segments not sealed but described by the journal are sealed
        // below, so nothing is open afterwards.
        let reopened: Vec<u32> = (0..n)
            .filter(|&s| {
                let m = &self.segs[s as usize];
                !m.sealed && !m.exts.is_empty()
            })
            .collect();
        let mut rs = Vec::with_capacity(n as usize);
        for m in &self.segs {
            rs.push(RestoredSegment {
                gen: m.gen,
                sealed: m.sealed || !m.exts.is_empty(),
                hdr: m
                    .exts
                    .iter()
                    .map(|e| HdrEntry {
                        key: e.key,
                        fp: self.fp_of(&e.hash),
                        off: e.off,
                        len: e.len,
                        compressed: e.compressed,
                        dirty: e.dirty,
                        hits: 0,
                    })
                    .collect(),
            });
        }
        // Base entries before duplicates (a duplicate's target header must be in place).
        entries.sort_by_key(|e| (e.dup, e.key));
        self.eng.restore(rs, &entries).map_err(io_err)?;
        self.init_dead();
        self.seq = maxseq + 1;
        for &s in &reopened {
            self.segs[s as usize].sealed = true;
            self.write_header(s, true, false)?;
            let m = &mut self.segs[s as usize];
            m.durable = m.exts.len();
            m.durable_fill = m.fill();
        }
        // Headers whose live flags the journal superseded.
        for s in 0..n {
            let m = &self.segs[s as usize];
            if m.sealed && m.exts.iter().any(|e| e.live && !self.is_live(s, e)) {
                self.hdr_stale.insert(s);
            }
        }
        if !reopened.is_empty() {
            self.cache_sync()?;
        }
        // Before the new epoch drops the old records: no older extent may outlive them.
        self.rewrite_stale_headers()?;
        rep.sealed_segments = self.segs.iter().filter(|m| m.sealed).count() as u64;
        rep.recovered_open_segments = reopened.len() as u64;
        let red = self.eng.reduction();
        rep.cached_lines = red.cached_lines;
        rep.dirty_lines = self.eng.dirty_lines();
        self.eng.check().map_err(io_err)?;
        self.checkpoint()?;
        debug_assert!(!self.sb.clean);
        Ok(rep)
    }
}

impl Export for LogVolume {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let _timed = crate::live::Timed::start(&self.metrics, false, buf.len());
        let mut red = None;
        let r = self.read_lines(offset, buf, &mut red);
        if let Some(red) = red {
            self.put_reducer(red);
        }
        r
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let _timed = crate::live::Timed::start(&self.metrics, true, data.len());
        // Hashing, compression and checksums of whole lines need only the request's bytes:
        // done before the lock, so that connections reduce in parallel.
        let pre = self.pre_reduce(offset, data);
        let first = offset / self.line;
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Write(offset, data, fua));
        }
        let ls = self.line;
        let mut line_buf = vec![0u8; ls as usize];
        let mut go = |g: &mut Inner| -> io::Result<()> {
            g.dropped_now.clear();
            if g.sb.mode == Mode::WriteThrough {
                let lines: Vec<u64> = self.lines(offset, data.len() as u64).collect();
                g.drop_durably(&lines, true)?;
            }
            for line in self.lines(offset, data.len() as u64) {
                let a = (line * ls).max(offset);
                let b = ((line + 1) * ls).min(offset + data.len() as u64);
                let src = &data[(a - offset) as usize..(b - offset) as usize];
                if b - a == ls {
                    let p = pre.get((line - first) as usize).and_then(Option::as_ref);
                    g.write_line(line, src, fua, p)?;
                } else {
                    g.current_line(line, &mut line_buf)?;
                    line_buf[(a - line * ls) as usize..(b - line * ls) as usize]
                        .copy_from_slice(src);
                    g.write_line(line, &line_buf, fua, None)?;
                }
            }
            if fua {
                g.commit()?;
            }
            Ok(())
        };
        let r = go(&mut g);
        g.dropped_now.clear();
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            // The cache failed during this request (its dirty lines copied to the backing
            // device first): the backing device takes the whole write.
            return g.direct(Direct::Write(offset, data, fua));
        }
        if r.is_ok() {
            degrade::unlose(&mut g.lost, offset, offset + data.len() as u64);
        }
        r
    }

    fn flush(&self) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Flush);
        }
        let _ = g.eng.process(&Request::new(0, Op::Flush, 0, 0), &[]);
        let r = g.commit();
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            return g.direct(Direct::Flush);
        }
        r
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        g.live.requests += 1;
        if g.pass_through || g.detached {
            return g.direct(Direct::Trim(offset, len));
        }
        let ls = self.line;
        let mut r = Ok(());
        for line in self.lines(offset, len) {
            if offset <= line * ls && (line + 1) * ls <= offset + len {
                // Contents unspecified now: nothing to write again after a failed sync.
                g.hdd_unsynced.remove(&line);
                r = g.unmap(line);
                if r.is_err() {
                    break;
                }
            }
        }
        let r = g.guard(r);
        if r.is_err() && g.pass_through {
            return g.direct(Direct::Trim(offset, len));
        }
        if r.is_ok() {
            degrade::unlose(&mut g.lost, offset, offset + len);
        }
        r
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        let chunk = 1u64 << 20;
        let zero = vec![0u8; chunk.min(len) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            self.write(at, &zero[..n as usize], false)?;
            at += n;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn block_sizes(&self) -> tiercache_nbd::BlockSizes {
        tiercache_nbd::BlockSizes {
            minimum: 1,
            preferred: self.line as u32,
            maximum: 32 << 20,
        }
    }

    fn description(&self) -> Option<String> {
        let sb = self.superblock();
        Some(format!(
            "tiercache log layout, {}, {} compression, dedup index {}",
            sb.mode, sb.compression, sb.dedup_ratio
        ))
    }
}
