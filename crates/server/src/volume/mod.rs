//! The live cache volume: the engine decides, this module executes its plans on a cache
//! device and a backing device and keeps the per-slot metadata on the cache device.
//!
//! # Concurrency
//!
//! The engine and the metadata images sit behind one mutex (`inner`); device I/O is ordered
//! by a reader-writer lock (`io`), always taken after `inner`:
//! * a read whose plan is only `ReadSsd` steps (a hit) takes `io` shared while it still holds
//!   `inner`, drops `inner`, and reads the cache device in parallel with other hits;
//! * a read miss into slots no durable record maps (`ReadHdd` + `WriteSsd` only) takes `io`
//!   exclusively once (hits on its victims end), pins its slots in the engine and runs its
//!   device steps holding neither lock; requests on its lines wait for its commit before
//!   they are planned, and whatever drops lines commits it first (`fill.rs`);
//! * every other plan (other misses, writes, trims, cleaning, flushes) keeps `inner` and
//!   takes `io` exclusively for the whole plan, so it waits for hits in flight on slots it
//!   may reuse, and no later request is planned before its device steps are done.
//! * a cleaning pass of the background cleaner or `ctl flush` runs its device I/O holding
//!   neither lock (`clean::clean_pass_unlocked`): begun under `inner` (its slots pinned in
//!   the engine, its backing spans in `Inner::wb`), committed under it again by whoever needs
//!   it first (`CacheVolume::reap`). Meanwhile a write or trim of one of its lines, a FLUSH
//!   or FUA, and any failure's recovery commit it first (waiting for its I/O); a plan whose
//!   backing ranges meet its spans, or that writes a pinned slot, waits for its I/O. Records
//!   show its lines' pending sectors dirty until it commits. One at a time (`clean_io`).
//!
//! # Crash consistency: the ordering argument
//!
//! An image of the metadata area, `mem`, holds the engine's current state (updated after each
//! plan's data steps ran); `Inner::disk_key(s)` gives, per slot, the key the record last
//! written to the cache device maps (`u64::MAX`: none or unreadable), kept as a difference
//! from `mem` (`durable.rs`). The
//! rules, and why a crash can never map a key to data that is not its own:
//! 1. **Data before mapping.** A record reaches the device only from `mem`, and only in
//!    [`CacheVolume::flush`] after `sync` of the cache device; every record in `mem` was set
//!    after its data steps completed. So a record on the device never points at data that was
//!    not yet durable when the record was written.
//! 2. **Unmapping before reuse.** Before a plan step overwrites slot `s` (`WriteSsd`,
//!    `Populate`), if the record on the device (`disk_key(s)`) maps another key, that record is
//!    first rewritten as empty on the device and synced (preceded by a sync of the backing
//!    device if write-backs ran since its last sync, so a dirty victim's data is durable on the
//!    backing device before the cache forgets it). Hence a slot's bytes only change while the
//!    device maps the slot to the same key or to nothing.
//!
//!    *Unmapping ahead* (the write-back miss path's batches): records of lines the engine
//!    still holds may be rewritten as empty early, in one batch with one sync, so that their
//!    evictions later need no sync. Only records of **clean** lines are unmapped ahead, and
//!    only after the backing device is synced (the background pass first writes back the
//!    dirty ones among the engine's next likely victims, [`Engine::eviction_candidates`]). An
//!    empty record can never map a key to foreign data; it drops a clean line whose data the
//!    backing device holds durably, so a crash only forgets that line. `mem` keeps such a
//!    record empty (`Inner::ahead`) while the line stays clean, so flushes do not map it
//!    again; once the line is written (dirty) its record follows the engine and rule 1. The
//!    batch marks `mem` first, then writes the device: a crash inside a batch may leave any
//!    subset of its records empty, which the above allows. Clean shutdown maps them again.
//! 3. **Torn metadata writes** are caught per record by crc32c (dropped on an unclean start);
//!    a key found in two slots (a flush torn between the page that unmaps it and the page that
//!    maps it anew) keeps the record with the newer sequence number. Both slots hold that
//!    key's data by rule 2.
//! 4. **FLUSH** syncs the backing device, then the cache device, then writes every changed
//!    metadata page and syncs again: every write acknowledged before it is then durable on the
//!    backing device or in a cache slot whose durable record marks it valid (and dirty).
//!    **FUA** writes run the same sequence before they are acknowledged; in write-back
//!    they are planned as ordinary (dirty) cache writes, so the FUA makes them durable in
//!    the cache (data and record), not on the backing device.
//!
//! 5. **In flux before in place.** A line whose durable record says "clean" promises that its
//!    slot and the backing device hold the same bytes. A write hit overwrites the slot in
//!    place (write-back) or writes both devices one after the other (write-through,
//!    write-around, FUA), and an invalidation (read-only, pass-through, trim) lets the
//!    backing device be written behind a record that still maps the line: a crash in between
//!    would leave a line that reads one value until it is evicted and another after. So
//!    before a plan's steps run, every metadata page holding such a record is rewritten from
//!    the device with each record flagged *in flux* ([`format::IN_FLUX`]) and synced, once
//!    per page (`flux_pages`), so later writes to that page cost nothing. A page stays
//!    flagged (flushes rewrite it flagged) until [`FLUX_EPOCHS`] flushes pass without a plan
//!    needing it; the flush after that rewrites it without flags, as does a clean shutdown.
//!    Nothing is lost by flagging longer: restart compares, it does not drop. It compares the
//!    clean sectors of every in-flux line with the backing device: equal ones stay clean;
//!    differing ones become dirty after a write-back crash (the cache's copy, old or new, is
//!    the volume's content and is written back) and are dropped otherwise (the backing copy
//!    is). Either way a block reads the same before and after eviction, and only lines that
//!    differ from the backing device come back dirty (no write-back storm). Lines the engine
//!    dropped while their durable record still maps them are remembered (`forgotten`) until
//!    the next flush, so a later backing write to them flags their page first.
//!
//! Writes acknowledged but not flushed may read back old or new after a crash (block-device
//! semantics), never another key's data, and never bytes that were never written there, and
//! what a block reads after the restart stays until it is written again.

use crate::classify::Classifier;
use crate::data_sums::{self, DataSums};
use crate::dev::BlockDev;
use crate::format::{
    self, FormatError, Record, Superblock, EMPTY_KEY, META_OFFSET, PAGE, RECORD_BYTES,
};

use crate::identity::BackingIdentity;
use crate::metrics::Metrics;
use crate::state_file::{self, FailState};
use crate::tuning::{self, Tuning};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tiercache_engine::{ClassTable, Counters, Engine, EngineConfig, Mode, Op, Request, Step};

const LINE_MASK: u64 = (1 << 48) - 1;

use crate::volume_set::{vaddr, vol_of, VOL_MASK};

/// A plan's backing offsets as backing addresses (`crate::volume_set`): each step's
/// `(vol, hdd)` becomes `hdd = vaddr(vol, hdd)`, once, where the plan is copied out of the
/// engine. Nothing changes for volume 0 (a one-volume cache).
fn to_backing(steps: &mut [Step]) {
    for s in steps {
        match s {
            Step::ReadHdd { vol, hdd, .. }
            | Step::WriteHdd { vol, hdd, .. }
            | Step::Populate { vol, hdd, .. }
            | Step::WriteBack { vol, hdd, .. }
            | Step::CopyHdd { vol, hdd, .. }
            | Step::TrimHdd { vol, hdd, .. } => *hdd = vaddr(*vol, *hdd),
            _ => {}
        }
    }
}

/// The backing address of line `key`'s first byte (line size `1 << ls`).
#[inline]
fn key_addr(key: u64, ls: u32) -> u64 {
    (key & !LINE_MASK) | (key & LINE_MASK) << ls
}

use tiercache_nbd::{BlockSizes, Export};

mod bulk;
mod check;
mod classes;
mod clean;
mod durable;
mod exec;
mod export;
mod fault;
mod fill;
mod open;
pub(crate) mod ram;
mod records;
mod settings;
mod stats;
mod step;
mod volumes;
pub use volumes::VolumeFigures;

pub(crate) use open::read_twice;
pub use open::{format, read_superblock};
pub use ram::RamStats;
#[doc(hidden)]
pub use step::SteppedClean;

/// How to format a cache device.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub line_size: u64,
    pub mode: Mode,
    pub policy: String,
    /// Lines; `None`: as many as the device holds.
    pub capacity_lines: Option<u64>,
    pub backing_id: String,
    /// The backing device's identity (`BlockDev::identity`); `None`: recorded at the first
    /// open (with a warning), `backing_id` kept for messages until then.
    pub backing: Option<BackingIdentity>,
    /// Per-run engine settings stored with the cache (`crate::tuning`; `format --preset`,
    /// `--admission`, ...); `None`: defaults.
    pub tuning: Option<Tuning>,
    /// Keep a crc32c per sector of cached data (`crate::data_sums`), fixed at format.
    pub data_checksums: bool,
    /// What is valid and dirty inside a line (`--validity`), fixed at format.
    pub validity: tiercache_engine::Validity,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            line_size: 4096,
            mode: Mode::WriteThrough,
            policy: "lru".into(),
            capacity_lines: None,
            backing_id: String::new(),
            backing: None,
            tuning: None,
            data_checksums: false,
            validity: tiercache_engine::Validity::Sector,
        }
    }
}

/// What to override when opening a formatted cache.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    pub mode: Option<Mode>,
    pub policy: Option<String>,
    /// I/O class table (`--classes`): DSS and partitions use it, statistics name classes.
    pub classes: Option<Arc<ClassTable>>,
    /// The backing device is the recorded one under another name (`--accept-backing-rename`):
    /// open it and record its new identity.
    pub accept_backing_rename: bool,
    /// Clean cached lines differ from the backing device, and the cache holds dirty lines:
    /// open anyway (`--accept-backing-changes`), dropping the clean lines and keeping the
    /// dirty ones, which will be written over the backing device's changes.
    pub accept_backing_changes: bool,
    /// State file recording a failure of this cache durably outside the cache device
    /// (`crate::state_file`): written when the cache fails, and a cache it names as failed
    /// is refused at open. `None`: no state file (the failure is recorded only by erasing
    /// the cache's superblock, and writes fail with EIO while that erase has not succeeded).
    pub state_path: Option<std::path::PathBuf>,
    /// Per-run engine settings for this run (`serve --admission`, ...), replacing the ones
    /// stored in the superblock (and stored in their place); `None`: the stored ones.
    pub tuning: Option<Tuning>,
    /// RAM tier above the cache (`serve --ram-cache`): bytes of clean whole lines kept in
    /// memory; 0 = none. Not stored: a restart starts it empty.
    pub ram_cache: u64,
    /// Its replacement policy; `None`: [`tiercache_engine::DEFAULT_RAM_POLICY`].
    pub ram_policy: Option<String>,
    /// Several volumes (`serve --volume NAME=BACKING`; the backing device given to open is
    /// their `crate::volume_set::VolumeSet`): checked against the superblock's volume table.
    /// Empty: one volume (`--backing`).
    pub volumes: Vec<crate::volume_set::VolumeSpec>,
    /// Their own settings given for this run (`serve --volume-admission`, ...), by name:
    /// replacing the stored ones (`crate::vol_tuning`) and stored in their place.
    pub volume_flags: Vec<crate::vol_tuning::VolumeFlags>,
}

/// What an open found on the device.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct OpenReport {
    pub was_clean: bool,
    /// Lines restored into the engine.
    pub restored: u64,
    pub restored_dirty: u64,
    /// Records dropped: bad checksum (unclean start only) or an older duplicate of a key.
    pub dropped_bad_checksum: u64,
    pub dropped_duplicates: u64,
    /// What the backing identity check did beyond a plain match (recorded, renamed), if
    /// anything: for the log.
    pub backing_note: Option<String>,
    /// Clean lines compared with the backing device at open, how many differed, and how
    /// many clean lines were dropped for it (all of them when the backing device changed).
    pub sampled_clean_lines: u64,
    pub differing_clean_lines: u64,
    pub dropped_clean_lines: u64,
    /// Records found in flux (rule 5 of `crate::volume`), and of their lines those whose
    /// slot differed from the backing device: restored dirty (write-back) or dropped.
    pub in_flux: u64,
    pub in_flux_dirty: u64,
    pub in_flux_dropped: u64,
    /// Sampled clean lines whose data failed its data checksum (`crate::data_sums`): damage
    /// in the cache, not a changed backing device; dropped (read from the backing device).
    pub damaged_clean_lines: u64,
    /// Clean lines left out of the sample because the cache or backing device failed to
    /// read them (twice): not compared, not dropped.
    pub unreadable_clean_lines: u64,
    /// Copy records of mirrored dirty lines (pools, `--dirty-copies 2`, `crate::reconcile`):
    /// paired with their line again, rewritten from their line first (its record was in
    /// flux), promoted to the line (its primary's member missing or failed), dropped (stale
    /// or damaged).
    pub copies_paired: u64,
    pub copies_resynced: u64,
    pub copies_promoted: u64,
    pub copies_dropped: u64,
    /// Each phase of the open (read, decode, order, engine, ...) with its wall time and the
    /// process's CPU time in seconds, for `restart_bench` and the log: where a slow restart
    /// spends its time.
    pub phases: Vec<(&'static str, f64, f64)>,
}

fn mode_index(m: Mode) -> u8 {
    Mode::ALL.iter().position(|&x| x == m).unwrap() as u8
}

struct Inner {
    engine: Engine,
    sb: Superblock,
    /// Key each slot's record on the device maps, as a difference from the record image
    /// (`Inner::mem_record`: derived from the engine, not held)
    /// (`Inner::disk_key`, `durable.rs`).
    durable: durable::DurableKeys,
    dirty_pages: BTreeSet<u64>,
    seq: u32,
    /// Backing byte ranges `[start, end)` written since the last backing sync that
    /// succeeded (disjoint, merged). A failed sync may have dropped them (Linux marks the
    /// pages clean after a writeback error and reports it once, so a later sync succeeds
    /// without them): [`CacheVolume::sync_backing`] writes them again from the cache, or
    /// reports them lost, before a later sync counts for them.
    hdd_unsynced: BTreeMap<u64, u64>,
    /// Backing byte ranges `[start, end)` a failed request wrote (with durable bytes before
    /// it) just before a backing sync failed (`sync_before_reuse`'s `fresh`), that no
    /// request has touched since: they may hold old or new bytes, and a later failed sync
    /// that drops the new ones leaves old bytes nobody saw change - neither rewritten nor
    /// reported lost. Once a request reads, populates or writes one of their lines it moves
    /// to `hdd_unsynced` ([`Inner::touch_undecided`]): a client may have seen the new
    /// bytes, which must then not flip back. Cleared by a good sync, as `hdd_unsynced`.
    hdd_undecided: BTreeMap<u64, u64>,
    /// Bytes written to the backing device since the last good sync (an upper bound: over-
    /// lapping writes count twice); bounded by [`MAX_UNSYNCED_BYTES`].
    hdd_unsynced_bytes: u64,
    /// Slots the plan being run writes (`WriteSsd`, `Populate`; empty between plans): the
    /// engine already maps their new lines, but a slot may still hold its old one, so a
    /// failed sync in the middle of the plan never copies a line from them.
    in_plan: BTreeSet<u32>,
    /// Data-area sectors written since the last cache sync that succeeded: slot -> mask of
    /// its sectors (bit k: sector k of the line). Cleared by every good cache sync; a
    /// failed one moves them to `cache_dropped` ([`CacheVolume::sync_cache`]). At most one
    /// entry per slot (bounded by the cache's lines, like `mem`).
    cache_unsynced: BTreeMap<u32, u64>,
    /// Sectors a failed cache sync may have dropped (the slot then holds older bytes or
    /// garbage, and a later sync succeeds without them): no recovery or backing rewrite
    /// copies them unless data checksums verify them ([`CacheVolume::recover`]), and
    /// [`CacheVolume::settle_dropped`] drops their lines (dirty sectors reported lost)
    /// before the engine plans again, or `fail_cache` drops everything.
    cache_dropped: BTreeMap<u32, u64>,
    slots: Vec<u32>,
    closed: bool,
    /// A panic while the lock was held (see [`crate::live::HALTED`]): `closed` is set too,
    /// so everything that stops at a shut-down volume stops here, with this reason.
    halted: bool,
    /// Cache-device errors so far; at `max_cache_errors` the cache is failed.
    cache_errors: u64,
    /// A pool of several cache devices: errors per member so far (an error naming its
    /// member counts here, not in `cache_errors`); at `max_cache_errors` that member alone
    /// is failed ([`CacheVolume::fail_member`]). Empty: one cache device.
    member_errors: Vec<u64>,
    /// The cache device failed: every request goes to the backing device.
    failed: bool,
    /// Volume byte ranges `[a, b)` whose dirty data the cache lost (sorted, disjoint):
    /// reads of them fail until they are written again.
    lost: Vec<(u64, u64)>,
    /// Slots whose clean line's record was unmapped ahead of its likely eviction (rule 2
    /// of the module doc), with the key they held then. `mem` keeps them empty while the
    /// engine holds the same key clean.
    ahead: HashMap<u32, u64>,
    /// The plan being run unmapped a record on the miss path (see `CacheVolume::run`).
    unmapped_on_miss: bool,
    /// Write-backs are failing on the backing device (see [`Degraded`]).
    degraded: Option<Degraded>,
    /// Backing syncs are failing (`Degraded::sync_failed`): while its backoff runs, a
    /// request that needs one before it can go on (a slot reused while backing writes are
    /// unsynced, too much unsynced) fails at once with the last error; FLUSH, FUA, `ctl
    /// flush` and shutdown still try at once; the cleaner retries when it is due
    /// ([`CacheVolume::retry_sync`]) and pauses cleaning meanwhile. The first good sync ends it.
    sync_failing: Option<Degraded>,
    /// The cache failed but neither the state file nor the superblock erase is durable yet
    /// (see [`CacheVolume::record_failure`]): writes fail until one of them is.
    failure_unrecorded: Option<FailState>,
    /// Metadata pages flagged in flux on the device (rule 5), with the flush count at which
    /// a plan last needed each.
    flux_pages: std::collections::BTreeMap<u64, u64>,
    /// Flushes of the metadata so far (starts at `FLUX_EPOCHS`).
    flush_epoch: u64,
    /// Keys the engine no longer holds in the slot their durable record maps (rule 5), until
    /// the next flush writes those records.
    forgotten: HashMap<u64, u32>,
    /// Data checksums (`crate::data_sums`), when the cache was formatted with them.
    sums: Option<crate::data_sums::DataSums>,
    /// The durable lost-range list (`crate::lost_list`) as on the device: a superset of
    /// `lost` between flushes (a range written again stays listed until the flush that
    /// makes the new data durable). `None`: an old cache with no room for it (warned).
    list: Option<crate::lost_list::LostList>,
    /// `fail_cache` is under way (a failed list write inside it does not fail it again).
    failing: bool,
    /// `fail_member` is under way for this pool member: the lost ranges its recovery finds
    /// are made durable once the member is out of the pool (a list write to it would fail).
    member_failing: Option<usize>,
    /// The I/O class table in force (names the classes in `ctl stats`; the engine holds the
    /// same one), where it came from, and how often `ctl classes load` replaced it.
    class_table: Option<Arc<ClassTable>>,
    class_source: String,
    class_loads: u64,
    /// The write-back whose I/O runs outside the volume lock (begun, not yet committed), with
    /// the backing spans it writes; see [`CacheVolume::reap`]. `None` whenever no cleaning
    /// pass is between begin and commit.
    wb: Option<clean::Unlocked>,
    /// The error of an unlocked write-back committed by someone other than its owner (a
    /// foreground request that needed it done), for the owner to report.
    wb_error: Option<io::Error>,
    /// Read misses whose device steps run outside the volume lock, begun and not yet
    /// committed (`fill.rs`).
    fills: Vec<fill::Fill>,
    next_fill: u64,
}

/// Capacity of the `Inner::slots` scratch kept between plans (slots; larger ones, from
/// passes over every slot, are freed).
const MAX_SLOTS_SCRATCH: usize = 16384;

/// Backing ranges written since the last good backing sync after which a request first
/// syncs the backing device (see `Inner::hdd_unsynced`).
const MAX_UNSYNCED_RANGES: usize = 4096;

/// Bytes written to the backing device since its last good sync after which a request first
/// syncs it: bounds what a failed sync can drop (and what is then written again or lost).
const MAX_UNSYNCED_BYTES: u64 = 256 << 20;

/// A cached block volume: the engine's decisions executed on real devices.
pub struct CacheVolume {
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    inner: Mutex<Inner>,
    io: RwLock<()>,
    line_shift: u32,
    data_offset: u64,
    size: u64,
    capacity_lines: u64,
    metrics: Metrics,
    stop: AtomicBool,
    /// Clean synchronously after each request that leaves the engine above its dirty high
    /// watermark, exactly as `tiercache sim` does, instead of in the background thread.
    inline_cleaning: AtomicBool,
    /// Set each request's class before the engine plans it (`crate::classify`): one per
    /// volume (`classes.rs`).
    classifiers: classes::Classifiers,
    max_cache_errors: AtomicU64,
    /// Records unmapped per batch ([`CacheVolume::set_unmap_batch`]).
    unmap_batch: AtomicU64,
    /// Where a failure of the cache is recorded ([`OpenOptions::state_path`]).
    state_path: Option<std::path::PathBuf>,
    /// The background cleaner's write-back rate controller, when it last ran, and the lines
    /// it may still write back ([`CacheVolume::set_writeback_rate`]).
    wb_rate: Mutex<WbRate>,
    /// Foreground requests waiting for the volume lock: a long writer of dirty data
    /// (`ctl flush`, the cleaner) hands the lock to them between its short passes
    /// ([`CacheVolume::let_waiters_in`]).
    waiting: AtomicU64,
    /// Held by whoever runs a cleaning pass whose I/O goes on outside the volume lock (the
    /// cleaner, `ctl flush`'s passes, unmap-ahead), from begin to commit, and by whoever
    /// needs no write-back in flight (a mode switch, shutdown, `ctl flush`'s last hold).
    /// Lock order: `clean_io`, then `inner`, then `wb_io`. Foreground requests never take it.
    clean_io: Mutex<()>,
    /// The unlocked write-back's I/O: running, and its outcome once done.
    wb_io: Mutex<clean::WbIo>,
    wb_done: std::sync::Condvar,
    /// Signalled (with `inner`) when an unlocked miss commits: requests on its lines wait
    /// for it before they are planned (`fill.rs`).
    fill_done: std::sync::Condvar,
    /// Read misses may run outside the lock (`fill.rs`); off: every miss under it
    /// (`TIERCACHE_LOCKED_MISSES=1`, to measure the difference).
    unlocked_misses: AtomicBool,
    /// Requests waiting for the unlocked write-back to end ([`CacheVolume::reap`]): its I/O
    /// stops after the group it is writing, the rest of its lines stay dirty.
    wb_waiters: AtomicU64,
    /// Foreground plans with backing-device steps planned and not yet executed: the unlocked
    /// write-back issues its next backing write only when none is (for at most
    /// [`FG_GATE_MAX`]), so a read miss waits for at most the one in progress.
    fg_backing: AtomicU64,
    /// Test hook: holds a stepped cleaning pass between its steps ([`step`]).
    pause: step::Pause,
    /// The RAM tier above the cache (`serve --ram-cache`; `ram.rs`).
    ram: Option<ram::RamCache>,
    /// The volumes served (`OpenOptions::volumes`, then `ctl volume add|remove`); empty:
    /// one volume. Read through [`CacheVolume::vols`].
    volumes: volumes::Served,
    /// Cache syncs that failed so far ([`CacheVolume::sync_cache`]). A failed sync may drop
    /// data-area writes since the last good one (`Inner::cache_dropped`): I/O that reads
    /// slots outside the volume lock (a hit, the unlocked write-back) compares this count
    /// before and after, and does not trust what it read if it changed.
    cache_sync_failures: AtomicU64,
}

/// Longest the unlocked write-back holds a backing write back for foreground backing I/O.
const FG_GATE_MAX: Duration = Duration::from_millis(10);

struct WbRate {
    ctl: tiercache_engine::RateController,
    last: Option<Instant>,
    budget: f64,
    /// Lines the next rate-controlled pass writes back at most (<= `RATE_PASS_LINES`): sized
    /// like `ctl flush`'s passes, ~`FLUSH_PASS_TARGET` while requests queue behind them.
    pass: u64,
}

/// Lines one rate-controlled cleaning pass writes back at most (then the cleaner sleeps
/// its 20 ms): bounds how long a foreground request waits behind the cleaner.
const RATE_PASS_LINES: u64 = 8;

/// How long one pass of `ctl flush` ([`CacheVolume::flush_dirty`]) holds the volume lock,
/// about: the pass size adapts so each takes this long, then the lock goes to the waiting
/// foreground requests. A read behind a flush waits for about this much, not the flush.
const FLUSH_PASS_TARGET: Duration = Duration::from_millis(10);

/// Lines one pass of `ctl flush` writes back at most (about 0.4 s on `--emulate-hdd 7200`:
/// what a request arriving while no other queued waits at worst), and at first.
const FLUSH_PASS_MAX: u64 = 256;

const FLUSH_PASS_FIRST: u64 = 4;

/// Lines one watermark cleaning pass of the background cleaner writes back at most, and
/// dirty likely victims one unmap-ahead pass writes back at most: between passes the lock
/// goes to waiting foreground requests.
const CLEAN_PASS_LINES: u64 = 64;

/// Longest a writer of dirty data waits for the foreground requests it let in.
const HANDOFF_MAX: Duration = Duration::from_millis(5);

/// Largest backing write merged from contiguous write-backs.
const MAX_MERGED_WRITE: u64 = 4 << 20;

/// Records of likely victims unmapped together (default; see
/// [`CacheVolume::set_unmap_batch`]).
pub const DEFAULT_UNMAP_BATCH: u64 = 1024;

/// Flushes a metadata page stays flagged in flux after a plan last needed it (rule 5 of the
/// module doc): a page written between every pair of flushes (a database's fsync) is flagged
/// once, not once per flush; the cost is restart comparing its lines after a crash.
pub const FLUX_EPOCHS: u64 = 16;

/// Cache-device errors after which the cache is failed and bypassed (default).
pub const DEFAULT_MAX_CACHE_ERRORS: u64 = 16;

/// A plan step that failed: its index, whether the cache device (or else the backing
/// device) failed, and the error.
struct StepError {
    index: usize,
    cache: bool,
    err: io::Error,
    /// It failed before any step changed the cache device (the backing-first phase of
    /// [`CacheVolume::exec`]): the engine can be rolled back to `mem`.
    before_cache: bool,
    /// Steps done, sorted (steps after `index` may have run in the backing-first phase).
    done: Vec<usize>,
}

impl StepError {
    /// The steps from the failed one on that did not run, in order (what `recover` redoes).
    fn pending(&self, steps: &[Step]) -> Vec<Step> {
        (self.index..steps.len())
            .filter(|i| self.done.binary_search(i).is_err())
            .map(|i| steps[i])
            .collect()
    }
}

// The backing device failing write-backs (issue 14 item 1): dirty lines stay in the cache,
// the engine evicts only clean lines, and the cleaner retries with backoff
// (`crate::degrade`, shared with the log layout).
use crate::degrade::{self, Degraded};

fn ioerr(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl CacheVolume {
    /// The volume lock. Poisoned (a thread panicked holding it), the volume halts: every
    /// later request, flush, setting and cleaning pass fails or stops ([`crate::live::HALTED`]),
    /// and shutdown does not mark the superblock clean.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| {
            let mut g = e.into_inner();
            if !g.halted {
                g.halted = true;
                g.closed = true;
                self.stop.store(true, Ordering::Relaxed);
                if let Some(r) = &self.ram {
                    r.close();
                }
                tracing::error!("{}", crate::live::HALTED);
            }
            // Cleared only once the RAM tier is closed: its reads check the poison flag.
            self.inner.clear_poison();
            g
        })
    }

    /// Takes `clean_io` (see the field): no other write-back is in flight until it is dropped.
    fn clean_owner(&self) -> MutexGuard<'_, ()> {
        self.clean_io.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`CacheVolume::lock`] for a foreground request: counted in `waiting` until it holds
    /// the lock, so that a flush or the cleaner lets it in between passes.
    fn lock_foreground(&self) -> MutexGuard<'_, Inner> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let g = self.lock();
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// Called with the volume lock released between two passes of a long writer of dirty
    /// data: yields until the foreground requests waiting for the lock took it (at most
    /// `HANDOFF_MAX`). The std mutex is not fair: without this, the writer takes the lock
    /// straight back and a read waits for the whole flush (bench_flush_p99.sh: 17 s).
    fn let_waiters_in(&self) {
        let t = Instant::now();
        while self.waiting.load(Ordering::Acquire) > 0 && t.elapsed() < HANDOFF_MAX {
            std::thread::yield_now();
        }
    }

    pub fn line_size(&self) -> u64 {
        1 << self.line_shift
    }

    pub fn capacity_lines(&self) -> u64 {
        self.capacity_lines
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn mode(&self) -> Mode {
        self.lock().engine.config().mode
    }

    fn timed(&self, write: bool, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let t = Instant::now();
        let r = f();
        self.metrics.record(write, t.elapsed());
        r
    }
}

/// One cached line: its engine key (the line number for volume 0), slot and sector masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct LineState {
    pub key: u64,
    pub slot: u32,
    pub valid: u64,
    pub dirty: u64,
}

/// The settings in force (`ctl stats` "settings", `ctl get`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub mode: String,
    pub policy: String,
    pub line_size: u64,
    /// `sector` or `line` (fixed at format); null for the log layout (no sector masks).
    pub validity: Option<String>,
    #[serde(flatten)]
    pub tuning: Tuning,
    /// The cleaner's settings, as `ctl get` shows them: `cleaning` (lba, acp, alru),
    /// `cleaning_age` (requests), `writeback_rate` (off, auto, or lines/s) and
    /// `writeback_target` (dirty share); null for the log layout (no cleaner keys).
    pub cleaning: Option<String>,
    pub cleaning_age: Option<u64>,
    pub writeback_rate: Option<String>,
    pub writeback_target: Option<f64>,
    /// Settings changed live (`ctl set`, `ctl classes load`) since the start.
    pub changes: u64,
}

/// Snapshot of a volume's state.
/// One member of a pool of cache devices ([`VolumeStats::pool_members`]).
#[derive(Clone, Debug, serde::Serialize, PartialEq, Eq)]
pub struct PoolMemberStats {
    pub index: usize,
    /// The path or URI it was given by.
    pub path: String,
    /// `active` or `failed`.
    pub state: String,
    /// Lines cached on it, of them dirty.
    pub lines: u64,
    pub dirty_lines: u64,
    /// Errors counted against it (it is failed at `max_cache_errors`).
    pub errors: u64,
    /// Device requests and bytes it was given since the start (data, records, superblock):
    /// how evenly the pool spreads its I/O.
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeStats {
    pub settings: Settings,
    pub mode: String,
    pub policy: String,
    pub line_size: u64,
    pub capacity_lines: u64,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    /// A pool mirroring dirty lines (`--dirty-copies 2`): slots holding a line's second cache
    /// copy (including those held by write-backs in flight), and dirty lines with one copy
    /// only (0 without mirroring).
    pub copy_slots: u64,
    pub unmirrored_lines: u64,
    /// Dirty lines re-mirrored by the cleaner since the start.
    pub remirrored_lines: u64,
    pub dirty_bytes: u64,
    pub volume_bytes: u64,
    pub ram_index_bytes: u64,
    pub totals: Counters,
    /// The RAM tier (`serve --ram-cache`); null without one. Reads it served never reached
    /// the engine: `totals` are the SSD tier's.
    pub ram: Option<RamStats>,
    pub per_class: Vec<(u8, Counters)>,
    /// Cache syncs made to unmap records (rule 2 of the module doc).
    pub unmap_syncs: u64,
    /// Records unmapped on the miss path (slot being reused) and ahead of evictions.
    pub unmap_on_miss: u64,
    pub unmap_ahead: u64,
    /// Read misses whose device steps ran outside the volume lock (`fill.rs`).
    pub unlocked_misses: u64,
    /// Cached clean lines whose record is unmapped ahead now.
    pub unmapped_ahead_now: u64,
    /// Unmap-ahead passes skipped while backing syncs fail (the batch needs a sync first).
    pub unmap_ahead_skipped: u64,
    /// Cache syncs made to flag metadata pages in flux (rule 5 of the module doc), pages so
    /// flagged, and pages flagged now (until the next flush).
    pub flux_syncs: u64,
    pub flux_pages: u64,
    pub flux_pages_now: u64,
    pub metadata_pages_written: u64,
    /// Per class with requests or cached lines: name, occupancy and counters.
    pub classes: Vec<crate::classify::ClassStats>,
    /// What the live classifier knows (`None`: no classifier).
    pub classifier: Option<serde_json::Value>,
    /// The class table in force, where it came from and its reloads (`None`: no table).
    pub class_table: Option<crate::classify::ClassTableInfo>,
    /// Cache-device errors so far (each one dropped lines; none reached a client alone).
    pub cache_errors: u64,
    /// A pool of several cache devices: its members (empty: one cache device).
    pub pool_members: Vec<PoolMemberStats>,
    /// Data checksum mismatches found (`crate::data_sums`); `data_checksums`: whether the
    /// cache keeps them.
    pub checksum_errors: u64,
    pub data_checksums: bool,
    /// Backing-device errors so far (each one failed its request).
    pub backing_errors: u64,
    /// The cache device was failed: everything passes through to the backing device.
    pub cache_failed: bool,
    /// A panic while the volume lock was held stopped the volume ([`crate::live::HALTED`]).
    pub halted: bool,
    /// Dirty data lost with the cache device: byte ranges `[start, end)` of the volume
    /// (pool addresses, `crate::volume_set::vaddr`). JSON gives them named within their
    /// volumes, in `LiveStats::lost_dirty_ranges`.
    pub lost_dirty_bytes: u64,
    #[serde(skip)]
    pub lost_dirty_ranges: Vec<(u64, u64)>,
    /// Ranges in `lost_dirty_ranges` (reads of them fail; kept across restarts by the
    /// lost-range list, `crate::lost_list`).
    pub lost_ranges: u64,
    /// Write-backs are failing on the backing device: dirty lines stay in the cache (only
    /// clean lines are evicted; writes that find none fail) and are retried with backoff.
    pub degraded: bool,
    pub degraded_reason: Option<String>,
    /// Write-backs the backing device failed so far (each kept its lines dirty).
    pub backing_write_errors: u64,
    /// Backing-device syncs that failed (`crate::metrics::Metrics::backing_sync_errors`).
    pub backing_sync_errors: u64,
    /// Cleaning passes whose device I/O ran outside the volume lock, requests that waited
    /// for one's I/O, and passes cut short for such a request (their unwritten lines stay
    /// dirty for a later pass). 0 for the log layout (no cleaner).
    pub unlocked_writebacks: u64,
    pub writeback_waits: u64,
    pub writeback_yields: u64,
    /// Merged write-back groups taken out of an unlocked pass by a request before their I/O
    /// began (their lines stay dirty for a later pass).
    pub writeback_groups_dropped: u64,
    /// Background cleaning passes that panicked (each failed as a failed write-back does).
    pub cleaner_panics: u64,
}

/// Fails with EIO naming the range when `[a, b)` overlaps lost dirty data.
use degrade::lost_check;

enum Data<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    None,
}

fn ssd_range(s: &Step) -> Option<(u64, u64)> {
    match *s {
        Step::ReadSsd { ssd, len, .. }
        | Step::WriteSsd { ssd, len, .. }
        | Step::Populate { ssd, len, .. }
        | Step::WriteBack { ssd, len, .. }
        | Step::TrimSsd { ssd, len }
            if len > 0 =>
        {
            Some((ssd, len))
        }
        _ => None,
    }
}
