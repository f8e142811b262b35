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
//!    (ENOSPC or EIO); write-backs are retried with backoff. A backing *sync* that fails
//!    (rule 2, before a seal) degrades the volume too (`Inner::sync_failing`): after a second
//!    failure, writes that need a seal fail at once until the backoff has passed; FLUSH,
//!    `ctl flush`, `ctl mode`, shutdown and the background retry try the device; any good
//!    sync ends it. A cache-device write or sync
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
    Compression, DeadExtent, ExtentContent, ExtentInfo, LineTally, LogCounters, Reduction,
    RestoredEntry, RestoredSegment,
};

use tiercache_engine::{LogConfig, LogEngine, Mode, Op, Request, Step};
use tiercache_nbd::Export;

mod classes;
mod data;
mod export;
mod fault;
mod journal;
mod open;
mod ram;
mod reclaim;
mod recover;
mod scrub;
mod segments;
mod stats;
pub use stats::LogClassStats;

pub use open::{format_log, format_log_for, read_log_superblock};

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

/// Key of the dead placeholder extent a salvage puts where a lost journal record's extent
/// was (no line has it: volume 0xffff is never used).
const GAP_KEY: u64 = u64::MAX;

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
    /// Clean lines left out of the sample because the cache or backing device failed to
    /// read them (twice): not compared, not dropped.
    pub unreadable_clean_lines: u64,
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
    /// Reclaimed segments' data areas discarded (`--trim`), their bytes, discards the cache
    /// device cannot do (left untrimmed) and discards that failed (also left untrimmed).
    pub discards: u64,
    pub discard_bytes: u64,
    pub discards_unsupported: u64,
    pub discard_errors: u64,
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
    /// A panic while the volume lock was held stopped the volume ([`crate::live::HALTED`]).
    pub halted: bool,
    pub lost_dirty_bytes: u64,
    pub lost_dirty_ranges: Vec<(u64, u64)>,
    /// The backing device fails write-backs: segments holding dirty data are not reclaimed.
    pub degraded: bool,
    pub degraded_reason: Option<String>,
    /// Per I/O class: the engine's counters (since the last reset) and the lines cached by
    /// requests of the class, for the classes with requests or cached lines.
    pub classes: Vec<LogClassStats>,
    /// The class table in force (`serve --classes`, `ctl classes load`), if any.
    pub class_table: Option<crate::classify::ClassTableInfo>,
    /// What the live classifier knows (`None`: no classifier, every request is class 0).
    pub classifier: Option<serde_json::Value>,
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
    /// A panic while the lock was held ([`crate::live::HALTED`]); `closed` is set too.
    halted: bool,
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
    /// Backing syncs are failing (`Degraded::sync_failed`): while its backoff runs, a
    /// sync a seal or FUA write needs fails at once without touching the device; FLUSH,
    /// `ctl flush`, `ctl mode` and shutdown retry at once; the background retry tries when
    /// due, and the first success ends it.
    sync_failing: Option<Degraded>,
    cache_errors: u64,
    max_cache_errors: u64,
    backing_errors: u64,
    backing_write_errors: u64,
    /// The cache device failed: every request goes to the backing device (rule 8).
    pass_through: bool,
    /// Volume byte ranges whose dirty data the failed cache lost (sorted, disjoint).
    lost: Vec<(u64, u64)>,
    /// The durable lost-range list (`crate::lost_list`) as on the device: a superset of
    /// `lost` between commits (a range written again stays listed until the commit that
    /// makes the new data durable). `None`: an old cache with no room for it (warned).
    list: Option<crate::lost_list::LostList>,
    /// Byte ranges written to the backing device by pass-through requests (failed cache or
    /// detached) since its last successful sync: a failed sync may have dropped them and
    /// nothing else holds their bytes, so it reports them lost (reads fail, never older
    /// bytes) instead of letting the next sync succeed without them.
    direct_unsynced: Vec<(u64, u64)>,
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
    /// Per I/O class, the engine's counters at the last `ctl stats --reset`.
    class_base: Vec<LogCounters>,
    /// The class table in force (also in the engine), where it came from and how many
    /// times `ctl classes load` replaced it (`crate::log_volume::classes`).
    class_table: Option<Arc<tiercache_engine::ClassTable>>,
    class_source: String,
    class_loads: u64,
    /// The I/O class of the client request being run (the classifier's, else 0).
    req_class: u8,
    /// What the open's clean-line sample found (`verify_clean_sample`).
    recovery_sample: RecoverySample,
    /// The RAM tier (also [`LogVolume::ram`]), and the lost ranges (count, bytes) it last
    /// saw (`ram.rs`, [`Inner::ram_watch`]).
    ram: Option<Arc<crate::volume::ram::RamCache>>,
    ram_lost_seen: (usize, u64),
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
    pub unreadable_clean_lines: u64,
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
    /// Sets each read's and write's I/O class before the engine plans it
    /// (`crate::classify`; set before the volume is shared).
    classifier: Option<Arc<dyn crate::classify::Classifier>>,
    /// The RAM tier above the cache (`serve --ram-cache`, `ram.rs`; set before the volume is
    /// shared): read without the volume lock.
    ram: Option<Arc<crate::volume::ram::RamCache>>,
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
    /// The volume lock. When it is released, ranges reported lost while it was held are
    /// made durable in the lost-range list first ([`Inner::persist_lost`]): before the
    /// request that found them returns, before any other request is served.
    /// Poisoned (a thread panicked holding it), the volume halts: every later call fails
    /// ([`crate::live::HALTED`]) and shutdown does not mark the superblock clean.
    fn lock(&self) -> Locked<'_> {
        Locked(self.inner.lock().unwrap_or_else(|e| {
            let mut g = e.into_inner();
            // Closed before the poison is cleared: RAM reads check the poison flag.
            if let Some(r) = &self.ram {
                r.close();
            }
            self.inner.clear_poison();
            if !g.halted {
                g.halted = true;
                g.closed = true;
                tracing::error!("{}", crate::live::HALTED);
            }
            g
        }))
    }

    pub fn superblock(&self) -> LogSuperblock {
        self.lock().sb.clone()
    }
}

/// The volume lock held (see [`LogVolume::lock`]).
struct Locked<'a>(MutexGuard<'a, Inner>);

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.0
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.persist_lost();
        self.0.ram_watch();
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
        if self.halted {
            return Err(io_err(crate::live::HALTED));
        }
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
}
