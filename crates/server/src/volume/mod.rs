//! The live cache volume: the engine decides, this module executes its plans on a cache
//! device and a backing device and keeps the per-slot metadata on the cache device.
//!
//! # Concurrency
//!
//! The engine and the metadata images sit behind one mutex (`inner`); device I/O is ordered
//! by a reader-writer lock (`io`), always taken after `inner`:
//! * a read whose plan is only `ReadSsd` steps (a hit) takes `io` shared while it still holds
//!   `inner`, drops `inner`, and reads the cache device in parallel with other hits;
//! * every other plan (misses, writes, trims, cleaning, flushes) keeps `inner` and takes `io`
//!   exclusively for the whole plan, so it waits for hits in flight on slots it may reuse, and
//!   no later request is planned before its device steps are done.
//!
//! # Crash consistency: the ordering argument
//!
//! An image of the metadata area, `mem`, holds the engine's current state (updated after each
//! plan's data steps ran); `disk_key` holds, per slot, the key the record last written to the
//! cache device maps (`u64::MAX`: none or unreadable). The
//! rules, and why a crash can never map a key to data that is not its own:
//! 1. **Data before mapping.** A record reaches the device only from `mem`, and only in
//!    [`CacheVolume::flush`] after `sync` of the cache device; every record in `mem` was set
//!    after its data steps completed. So a record on the device never points at data that was
//!    not yet durable when the record was written.
//! 2. **Unmapping before reuse.** Before a plan step overwrites slot `s` (`WriteSsd`,
//!    `Populate`), if the record on the device (`disk_key[s]`) maps another key, that record is
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
use tiercache_nbd::{BlockSizes, Export};

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
}

fn mode_index(m: Mode) -> u8 {
    Mode::ALL.iter().position(|&x| x == m).unwrap() as u8
}

/// Writes a fresh superblock and empty metadata; returns the superblock.
pub fn format(
    cache: &dyn BlockDev,
    backing_size: u64,
    opts: &FormatOptions,
) -> Result<Superblock, FormatError> {
    let ls = opts.line_size;
    if !ls.is_power_of_two() || !(4096..=1 << 20).contains(&ls) {
        return Err(FormatError::BadField {
            field: "line_size",
            why: format!("{ls} is not a power of two in 4 KiB..1 MiB"),
        });
    }
    if tiercache_engine::policy::lookup(&opts.policy).is_none() {
        return Err(FormatError::BadField {
            field: "policy",
            why: format!(
                "unknown policy {:?} (known: {})",
                opts.policy,
                tiercache_engine::policy::names().join(", ")
            ),
        });
    }
    if tiercache_engine::policy::is_offline(&opts.policy) {
        return Err(offline_policy(&opts.policy));
    }
    if let Some(t) = &opts.tuning {
        let mut cfg = EngineConfig {
            line_size: ls,
            policy: opts.policy.clone(),
            ..Default::default()
        };
        t.apply(&mut cfg);
        cfg.validate().map_err(|why| FormatError::BadField {
            field: "engine settings",
            why,
        })?;
    }
    let mut max = Superblock::lines_for_device(cache.size(), ls);
    while max > 0
        && opts.data_checksums
        && Superblock::data_offset_with(max, ls, true) + max * ls > cache.size()
    {
        max -= 1;
    }
    let lines = opts.capacity_lines.unwrap_or(max);
    let sums = opts.data_checksums;
    let need = Superblock::data_offset_with(lines, ls, sums) + lines * ls;
    if lines == 0 || need > cache.size() {
        return Err(FormatError::TooSmall {
            have: cache.size(),
            need: need.max(Superblock::data_offset_with(1, ls, sums) + ls),
            lines: lines.max(1),
            line_size: ls,
        });
    }
    let mut uuid = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut uuid[..]);
    let sb = Superblock {
        version: if sums {
            format::VERSION_SUMS
        } else {
            format::VERSION
        },
        uuid,
        line_size: ls,
        capacity_lines: lines,
        mode: mode_index(opts.mode),
        policy: opts.policy.clone(),
        backing_size,
        backing: opts
            .backing
            .clone()
            .unwrap_or_else(|| BackingIdentity::unknown(&opts.backing_id)),
        clean: true,
        generation: 1,
        data_offset: Superblock::data_offset_with(lines, ls, sums),
        tuning: opts.tuning,
        data_checksums: sums,
    };
    // Empty records first, the superblock last: a format interrupted half way has no magic.
    cache.write_at(&[0u8; 4096], 0)?;
    let mut page = vec![0u8; PAGE as usize];
    for r in page.chunks_mut(RECORD_BYTES as usize) {
        Record::EMPTY.encode(r);
    }
    let pages = lines.div_ceil(format::RECORDS_PER_PAGE);
    let chunk: Vec<u8> = page.repeat(256);
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(256);
        cache.write_at(&chunk[..(n * PAGE) as usize], META_OFFSET + p * PAGE)?;
        p += n;
    }
    if sums {
        crate::data_sums::DataSums::format(
            cache,
            crate::data_sums::region_offset(lines),
            lines,
            ls,
        )?;
    }
    cache.sync()?;
    cache.write_at(&sb.encode(), 0)?;
    cache.sync()?;
    Ok(sb)
}

/// The error for an offline policy (it needs the future) given to a live cache.
fn offline_policy(name: &str) -> FormatError {
    FormatError::BadField {
        field: "policy",
        why: format!(
            "{name} is an offline policy (it needs the future accesses, which only a simulator replaying a trace has): a live cache cannot run it; use it with `tiercache sim`, and pick an online policy here (`tiercache policies`)"
        ),
    }
}

/// Reads the superblock of a cache device.
pub fn read_superblock(cache: &dyn BlockDev) -> Result<Superblock, FormatError> {
    let mut b = vec![0u8; format::SUPERBLOCK_BYTES as usize];
    cache.read_at(&mut b, 0)?;
    Superblock::decode(&b)
}

struct Inner {
    engine: Engine,
    sb: Superblock,
    mem: Vec<u8>,
    /// Key each slot's record on the device maps (`EMPTY_KEY`: none).
    disk_key: Vec<u64>,
    dirty_pages: BTreeSet<u64>,
    seq: u32,
    /// Backing byte ranges `[start, end)` written since the last backing sync that
    /// succeeded (disjoint, merged). A failed sync may have dropped them (Linux marks the
    /// pages clean after a writeback error and reports it once, so a later sync succeeds
    /// without them): [`CacheVolume::sync_backing`] writes them again from the cache, or
    /// reports them lost, before a later sync counts for them.
    hdd_unsynced: BTreeMap<u64, u64>,
    /// Bytes written to the backing device since the last good sync (an upper bound: over-
    /// lapping writes count twice); bounded by [`MAX_UNSYNCED_BYTES`].
    hdd_unsynced_bytes: u64,
    /// Slots the plan being run writes (`WriteSsd`, `Populate`; empty between plans): the
    /// engine already maps their new lines, but a slot may still hold its old one, so a
    /// failed sync in the middle of the plan never copies a line from them.
    in_plan: BTreeSet<u32>,
    slots: Vec<u32>,
    closed: bool,
    /// Cache-device errors so far; at `max_cache_errors` the cache is failed.
    cache_errors: u64,
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
    /// The I/O class table in force (names the classes in `ctl stats`; the engine holds the
    /// same one), where it came from, and how often `ctl classes load` replaced it.
    class_table: Option<Arc<ClassTable>>,
    class_source: String,
    class_loads: u64,
}

impl Inner {
    /// `[a, b)` of the backing device is about to be written: not durable until the next
    /// backing sync that succeeds.
    fn wrote_backing(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        self.hdd_unsynced_bytes += b - a;
        let (mut a, mut b) = (a, b);
        if let Some((&s, &e)) = self.hdd_unsynced.range(..=a).next_back() {
            if e >= a {
                a = s;
                b = b.max(e);
                self.hdd_unsynced.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.hdd_unsynced.range(a..).next() {
            if s > b {
                break;
            }
            b = b.max(e);
            self.hdd_unsynced.remove(&s);
        }
        self.hdd_unsynced.insert(a, b);
    }

    /// Written to the backing device since its last good sync (a record that says a line is
    /// clean must not reach the cache device before that sync: rule 4).
    fn backing_unsynced(&self) -> bool {
        !self.hdd_unsynced.is_empty()
    }

    /// Too much written to the backing device since its last good sync: a failed sync would
    /// leave too much to write again (or to lose), and the set of ranges must stay small.
    fn unsynced_full(&self) -> bool {
        self.hdd_unsynced.len() >= MAX_UNSYNCED_RANGES
            || self.hdd_unsynced_bytes >= MAX_UNSYNCED_BYTES
    }
}

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
    /// Sets each request's class before the engine plans it (`crate::classify`).
    classifier: Option<Arc<dyn Classifier>>,
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
}

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

/// Compares the backing device with the identity the superblock recorded (`crate::identity`):
/// a different device is refused (`FormatError::WrongBacking`) unless
/// `opts.accept_backing_rename`; an unrecorded identity (version 1) is trusted and recorded,
/// as is a renamed block device with the same stable id. Updates `sb.backing`, which the
/// open writes to the device; returns a note for the log when it did more than match.
fn check_backing_identity(
    sb: &mut Superblock,
    backing: &dyn BlockDev,
    opts: &OpenOptions,
) -> Result<Option<String>, FormatError> {
    let Some(given) = backing.identity() else {
        return Ok(None); // a device that cannot say which it is (test wrappers)
    };
    let note = crate::identity::verify(&sb.backing, &given, opts.accept_backing_rename)
        .map_err(|(recorded, given)| FormatError::WrongBacking { recorded, given })?;
    sb.backing = given;
    Ok(note)
}

/// Compares a sample of the clean lines about to be restored with the backing device. A
/// clean line must equal it; when one does not, the backing device was written behind the
/// cache's back or is another disk:
/// * after a clean shutdown any difference means that: every clean line is dropped (the
///   backing device's bytes are served), or, when the cache holds dirty lines, the open is
///   refused (`FormatError::BackingChanged`): they would be written over a changed disk,
///   unless `opts.accept_backing_changes` (then clean lines and the clean sectors of dirty
///   ones are dropped);
/// * after a crash, a line written just before it may legitimately differ (the write reached
///   one device and not the other); only the differing lines are dropped (they then read the
///   backing copy, and keep reading it), unless every sampled line differs (another disk).
///
/// With data checksums (`sums`), a differing line whose own bytes fail their checksum is
/// damage in the cache, dropped alone (`OpenReport::damaged_clean_lines`).
#[allow(clippy::too_many_arguments)]
fn verify_clean_sample(
    cache: &dyn BlockDev,
    backing: &dyn BlockDev,
    sb: &Superblock,
    sector: u64,
    lines: &mut Vec<(u32, Record)>,
    opts: &OpenOptions,
    report: &mut OpenReport,
    sums: Option<&DataSums>,
) -> Result<(), FormatError> {
    let ls = sb.line_size;
    let mut clean: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].1.dirty == 0)
        .collect();
    if clean.is_empty() {
        return Ok(());
    }
    clean.sort_by_key(|&i| lines[i].1.key);
    let k = clean.len().min(crate::identity::sample_size(ls));
    let (mut a, mut b) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
    let mut differ: Vec<usize> = Vec::new();
    let mut damaged: Vec<usize> = Vec::new();
    for j in 0..k {
        let i = clean[j * clean.len() / k];
        let (slot, r) = lines[i];
        let at = (r.key & LINE_MASK) * ls;
        // Only the part of the line inside the backing device (a partial last line).
        let n = backing.size().saturating_sub(at).min(ls) as usize;
        cache.read_at(&mut a[..n], sb.data_offset + slot as u64 * ls)?;
        backing.read_at(&mut b[..n], at).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("reading the backing device to verify the cache: {e}"),
            )
        })?;
        let same = (0..ls / sector).all(|s| {
            let (x, y) = ((s * sector) as usize, (((s + 1) * sector) as usize).min(n));
            r.valid >> s & 1 == 0 || x >= y || a[x..y] == b[x..y]
        });
        if !same {
            // With data checksums, a line whose own bytes fail their checksum is damage in
            // the cache (a flipped bit), not evidence that the backing device changed.
            let bad = sums.is_some_and(|s| {
                (0..(ls / sector).min(64)).any(|q| {
                    let ssd = slot as u64 * ls + q * sector;
                    let u = (q * sector) as usize..((q + 1) * sector) as usize;
                    r.valid >> q & 1 == 1 && u.end <= n && crc32c::crc32c(&a[u]) != s.get(ssd)
                })
            });
            if bad {
                tracing::warn!(
                    "data checksum mismatch in clean data: cache slot {slot}, volume bytes {at}..{}: line dropped, read again from the backing device",
                    at + ls
                );
                damaged.push(i);
            } else {
                differ.push(i);
            }
        }
    }
    if !damaged.is_empty() {
        let drop: std::collections::HashSet<u64> =
            damaged.iter().map(|&i| lines[i].1.key).collect();
        let differ_keys: Vec<u64> = differ.iter().map(|&i| lines[i].1.key).collect();
        lines.retain(|(_, r)| !drop.contains(&r.key));
        report.damaged_clean_lines = drop.len() as u64;
        report.dropped_clean_lines += drop.len() as u64;
        // `differ` indexes the list as it was.
        differ = differ_keys
            .iter()
            .filter_map(|k| lines.iter().position(|(_, r)| r.key == *k))
            .collect();
    }
    report.sampled_clean_lines = k as u64;
    report.differing_clean_lines = differ.len() as u64;
    if differ.is_empty() {
        return Ok(());
    }
    let first = differ
        .iter()
        .map(|&i| (lines[i].1.key & LINE_MASK) * ls)
        .min()
        .unwrap_or(0);
    let changed = sb.clean || (differ.len() == k && k >= 8);
    if !changed {
        let drop: std::collections::HashSet<usize> = differ.into_iter().collect();
        let mut i = 0;
        lines.retain(|_| {
            i += 1;
            !drop.contains(&(i - 1))
        });
        report.dropped_clean_lines += drop.len() as u64;
        tracing::warn!(
            "{} of {k} clean cached lines sampled differ from the backing device after an unclean shutdown (writes in flight at the crash; first at volume byte {first}): dropped, they read the backing device's copy",
            drop.len()
        );
        return Ok(());
    }
    let dirty = lines.iter().filter(|(_, r)| r.dirty != 0).count() as u64;
    if dirty > 0 && !opts.accept_backing_changes {
        return Err(FormatError::BackingChanged {
            backing: sb.backing.describe(),
            differ: report.differing_clean_lines,
            sampled: k as u64,
            first,
            dirty_lines: dirty,
        });
    }
    let before = lines.len();
    lines.retain(|(_, r)| r.dirty != 0);
    for (_, r) in lines.iter_mut() {
        r.valid = r.dirty;
    }
    report.dropped_clean_lines += (before - lines.len()) as u64;
    tracing::warn!(
        "the backing device {} changed behind the cache ({} of {k} clean lines sampled differ, first at volume byte {first}): dropped all {} clean lines{}",
        sb.backing.describe(),
        report.differing_clean_lines,
        report.dropped_clean_lines,
        if dirty > 0 {
            format!("; keeping {dirty} dirty lines (--accept-backing-changes)")
        } else {
            String::new()
        }
    );
    Ok(())
}

impl CacheVolume {
    /// Opens a formatted cache device in front of `backing` and restores its lines.
    pub fn open(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        opts: &OpenOptions,
    ) -> Result<(CacheVolume, OpenReport), FormatError> {
        let state = match &opts.state_path {
            Some(p) => state_file::read(p)?.map(|st| (p, st)),
            None => None,
        };
        let mut sb = match read_superblock(&*cache) {
            Ok(sb) => sb,
            // An erased superblock after a failure: say so, not only "bad magic".
            Err(e @ (FormatError::BadMagic | FormatError::BadSuperblockChecksum { .. })) => {
                return Err(match state {
                    Some((p, st)) => FormatError::Failed {
                        what: format!("{} (superblock: {e})", st.describe()),
                        state: p.display().to_string(),
                    },
                    None => e,
                })
            }
            Err(e) => return Err(e),
        };
        if let Some((p, st)) = state {
            if st.uuid == sb.uuid {
                // Issue 14 item 6: never restore lines older than what went to the backing
                // device after the failure.
                return Err(FormatError::Failed {
                    what: st.describe(),
                    state: p.display().to_string(),
                });
            }
            tracing::warn!(
                "ignoring cache state file {}: it records the failure of another cache ({}), not this one ({})",
                p.display(),
                state_file::uuid_hex(&st.uuid),
                state_file::uuid_hex(&sb.uuid)
            );
        }
        if sb.backing_size != backing.size() {
            return Err(FormatError::BackingMismatch {
                sb: sb.backing_size,
                actual: backing.size(),
            });
        }
        let backing_note = check_backing_identity(&mut sb, &*backing, opts)?;
        if cache.size() < sb.device_bytes() {
            return Err(FormatError::TooSmall {
                have: cache.size(),
                need: sb.device_bytes(),
                lines: sb.capacity_lines,
                line_size: sb.line_size,
            });
        }
        // The mode the records were written in: it decides which copy of an in-flux line
        // wins (rule 5 of the module doc).
        let recorded_mode = Mode::ALL[sb.mode as usize];
        if let Some(m) = opts.mode {
            sb.mode = mode_index(m);
        }
        // Records may carry in-flux flags from now on (format version 2).
        sb.version = sb.current_version();
        if let Some(p) = &opts.policy {
            sb.policy = p.clone();
        }
        if tiercache_engine::policy::is_offline(&sb.policy) {
            return Err(offline_policy(&sb.policy));
        }
        let mut cfg = EngineConfig {
            capacity_lines: sb.capacity_lines,
            line_size: sb.line_size,
            group_size: sb.line_size,
            policy: sb.policy.clone(),
            mode: Mode::ALL[sb.mode as usize],
            volume_bytes: Some(backing.size()),
            policy_params: tiercache_engine::policy::PolicyConfig {
                classes: opts.classes.clone(),
                ..Default::default()
            },
            ..Default::default()
        };
        // This run's settings, else the stored ones; stored (again) with the superblock.
        if let Some(t) = opts.tuning.or(sb.tuning) {
            t.apply(&mut cfg);
        }
        // The write-back rate is the volume's, not the engine's: kept as stored unless this
        // run sets it.
        let writeback = opts
            .tuning
            .and_then(|t| t.writeback)
            .or(sb.tuning.and_then(|t| t.writeback));
        sb.tuning = Some(Tuning {
            writeback,
            ..Tuning::of(&cfg)
        });
        let mut engine = Engine::new(cfg).map_err(|e| FormatError::BadField {
            field: "engine configuration",
            why: e.to_string(),
        })?;
        let meta_bytes = sb.capacity_lines.div_ceil(format::RECORDS_PER_PAGE) * PAGE;
        let mut disk = vec![0u8; meta_bytes as usize];
        cache.read_at(&mut disk, META_OFFSET)?;
        let mut report = OpenReport {
            was_clean: sb.clean,
            backing_note,
            ..Default::default()
        };
        // Newest record per key.
        let mut best: std::collections::HashMap<u64, (u32, Record)> = Default::default();
        let in_flux = |slot: u64| {
            let at = (slot * RECORD_BYTES) as usize;
            Record::in_flux(&disk[at..at + RECORD_BYTES as usize])
        };
        let mut max_seq = 0u32;
        for slot in 0..sb.capacity_lines {
            let at = (slot * RECORD_BYTES) as usize;
            let Some(r) = Record::decode(&disk[at..at + RECORD_BYTES as usize]) else {
                if sb.clean {
                    return Err(FormatError::BadRecord {
                        slot,
                        offset: META_OFFSET + at as u64,
                    });
                }
                report.dropped_bad_checksum += 1;
                continue;
            };
            if format::seq_newer(r.seq, max_seq) {
                max_seq = r.seq;
            }
            if r.key == EMPTY_KEY || r.valid == 0 {
                continue;
            }
            match best.get(&r.key) {
                Some((_, old)) if !format::seq_newer(r.seq, old.seq) => {
                    report.dropped_duplicates += 1
                }
                Some(_) => {
                    report.dropped_duplicates += 1;
                    best.insert(r.key, (slot as u32, r));
                }
                None => {
                    best.insert(r.key, (slot as u32, r));
                }
            }
        }
        let mut sums = match sb.data_checksums {
            true => Some(crate::data_sums::DataSums::load(
                &*cache,
                crate::data_sums::region_offset(sb.capacity_lines),
                sb.capacity_lines,
                sb.line_size,
            )?),
            false => None,
        };
        let mut lines: Vec<(u32, Record)> = best.into_values().collect();
        lines.sort_by_key(|(s, r)| (r.seq.wrapping_sub(max_seq.wrapping_add(1)), *s));
        let mut flux_pages = BTreeSet::new();
        let (ls, ss) = (sb.line_size, engine.sector_size());
        let (mut slot_bytes, mut backing_bytes) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
        let mut kept = Vec::with_capacity(lines.len());
        for (slot, mut r) in lines {
            if in_flux(slot as u64) {
                // Rule 5: the clean sectors that differ from the backing device.
                report.in_flux += 1;
                flux_pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
                cache.read_at(&mut slot_bytes, sb.data_offset + slot as u64 * ls)?;
                backing.read_at(&mut backing_bytes, (r.key & LINE_MASK) * ls)?;
                let mut differ = 0u64;
                for k in 0..(ls / ss).min(64) {
                    let u = (k * ss) as usize..((k + 1) * ss) as usize;
                    if (r.valid & !r.dirty) >> k & 1 == 1
                        && slot_bytes[u.clone()] != backing_bytes[u]
                    {
                        differ |= 1 << k;
                    }
                }
                if differ != 0 {
                    if recorded_mode == Mode::WriteBack {
                        r.dirty |= differ;
                        report.in_flux_dirty += 1;
                    } else {
                        r.valid &= !differ;
                        if r.valid == 0 {
                            report.in_flux_dropped += 1;
                            continue;
                        }
                    }
                }
                // Its slot may have been written in place after its checksums were last
                // made durable (or the other way round): they are recomputed from the data,
                // which is the line's content either way (never good data reported bad).
                if let Some((s, _)) = &mut sums {
                    s.recompute(slot as u64, &slot_bytes, r.valid);
                }
            }
            kept.push((slot, r));
        }
        let mut lines = kept;
        if let Some((s, bad)) = &mut sums {
            // Blocks whose checksum fails (torn by a crash, or damaged): their entries are
            // unknown, so those of restored lines are recomputed from the data, and the
            // blocks rewritten whole at the first flush.
            if !bad.is_empty() {
                let slots: BTreeSet<u64> = bad.iter().flat_map(|&b| s.block_slots(b)).collect();
                for &(slot, r) in &lines {
                    if slots.contains(&(slot as u64)) {
                        cache.read_at(&mut slot_bytes, sb.data_offset + slot as u64 * ls)?;
                        s.recompute(slot as u64, &slot_bytes, r.valid);
                    }
                }
                for &b in bad.iter() {
                    s.touch_block(b);
                }
                let msg = format!(
                    "{} data checksum block(s) failed their own checksum (first at block {}); the checksums of the cached lines they cover were recomputed from the data",
                    bad.len(),
                    bad[0]
                );
                if sb.clean {
                    tracing::error!("{msg}: the checksum region was damaged after a clean stop");
                } else {
                    tracing::warn!("{msg} (torn by the unclean stop)");
                }
            }
        }
        let sums = sums.map(|(s, _)| s);
        if let Some(s) = &sums {
            // One checksum per validity unit: anything else would check bytes never valid.
            assert_eq!(s.sector, engine.sector_size(), "data checksum unit");
        }
        verify_clean_sample(
            &*cache,
            &*backing,
            &sb,
            engine.sector_size(),
            &mut lines,
            opts,
            &mut report,
            sums.as_ref(),
        )?;
        for (slot, r) in lines {
            match engine.restore_line(r.key, slot, r.valid, r.dirty, 0) {
                Ok(()) => {
                    report.restored += 1;
                    report.restored_dirty += (r.dirty != 0) as u64;
                }
                Err(e) if sb.clean => {
                    return Err(FormatError::BadField {
                        field: "metadata record",
                        why: format!("slot {slot}: {e}; run `tiercache check --repair` on the cache device (the server stopped)"),
                    })
                }
                Err(_) => report.dropped_bad_checksum += 1,
            }
        }
        let mut vol_lost_bytes = 0;
        let mut inner = Inner {
            engine,
            disk_key: disk
                .chunks(RECORD_BYTES as usize)
                .take(sb.capacity_lines as usize)
                .map(|r| Record::decode(r).map_or(EMPTY_KEY, |r| r.key))
                .collect(),
            mem: disk,
            sb: sb.clone(),
            dirty_pages: BTreeSet::new(),
            seq: max_seq.wrapping_add(1),
            hdd_unsynced: BTreeMap::new(),
            hdd_unsynced_bytes: 0,
            in_plan: BTreeSet::new(),
            slots: Vec::new(),
            closed: false,
            cache_errors: 0,
            failed: false,
            lost: Vec::new(),
            ahead: HashMap::new(),
            unmapped_on_miss: false,
            degraded: None,
            failure_unrecorded: None,
            flux_pages: Default::default(),
            flush_epoch: FLUX_EPOCHS,
            forgotten: HashMap::new(),
            sums,
            class_table: opts.classes.clone(),
            class_source: if opts.classes.is_some() {
                "serve flags".into()
            } else {
                String::new()
            },
            class_loads: 0,
        };
        if let Some(s) = &inner.sums {
            inner.lost = s.lost.clone();
            vol_lost_bytes = s.lost.iter().map(|(a, b)| b - a).sum();
            if !s.lost.is_empty() {
                tracing::error!(
                    "{} volume range(s) hold damaged dirty data (reads fail until rewritten): {:?}",
                    s.lost.len(),
                    s.lost
                );
            }
        }
        // Records the engine did not take (dropped ones) become empty in `mem`, and records
        // found in flux are rewritten as resolved, without the flag.
        inner.slots = (0..sb.capacity_lines as u32).collect();
        Self::update_records(&mut inner);
        inner.dirty_pages.extend(&flux_pages);
        let line_shift = sb.line_size.trailing_zeros();
        let vol = CacheVolume {
            size: backing.size(),
            cache,
            backing,
            io: RwLock::new(()),
            line_shift,
            data_offset: sb.data_offset,
            capacity_lines: sb.capacity_lines,
            metrics: Metrics::default(),
            stop: AtomicBool::new(false),
            inline_cleaning: AtomicBool::new(false),
            wb_rate: Mutex::new(WbRate {
                ctl: sb
                    .tuning
                    .and_then(|t| t.writeback)
                    .and_then(|(r, t)| tiercache_engine::RateController::new(r, t).ok())
                    .unwrap_or_default(),
                last: None,
                budget: 0.0,
                pass: RATE_PASS_LINES,
            }),
            classifier: None,
            max_cache_errors: AtomicU64::new(DEFAULT_MAX_CACHE_ERRORS),
            unmap_batch: AtomicU64::new(DEFAULT_UNMAP_BATCH),
            state_path: opts.state_path.clone(),
            waiting: AtomicU64::new(0),
            inner: Mutex::new(inner),
        };
        vol.metrics
            .lost_dirty_bytes
            .store(vol_lost_bytes, Ordering::Relaxed);
        vol.metrics
            .checksum_errors
            .store(report.damaged_clean_lines, Ordering::Relaxed);
        {
            let mut g = vol.lock();
            g.sb.clean = false;
            g.sb.version = g.sb.current_version();
            vol.write_superblock(&mut g)?;
            if report.dropped_clean_lines > 0 {
                // The dropped lines' records, emptied in `mem`, reach the device now: a
                // crash must not bring the stale copies back.
                vol.flush_locked(&mut g)?;
            } else if !flux_pages.is_empty() {
                // Resolved records on the device at once: it agrees with the engine from the
                // start, and later in-place writes flag their pages afresh.
                vol.flush_cache(&mut g)?;
            }
            if g.engine.config().mode != Mode::WriteBack && g.engine.dirty_lines() > 0 {
                vol.clean_all(&mut g)?;
                vol.flush_locked(&mut g)?;
            }
        }
        Ok((vol, report))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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

    fn write_superblock(&self, g: &mut Inner) -> io::Result<()> {
        if g.failed {
            return Err(ioerr(
                "the cache device failed (see the log and `ctl stats`); the volume passes through to the backing device until restarted with a newly formatted cache",
            ));
        }
        g.sb.generation += 1;
        self.cache.write_at(&g.sb.encode(), 0)?;
        self.cache.sync()
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

    /// Runs one request through the engine and executes its plan. `data`: the client's bytes
    /// (filled for reads, taken for writes).
    fn run(&self, req: &Request, data: Data<'_>) -> io::Result<()> {
        let mut g = self.lock_foreground();
        if g.closed {
            return Err(ioerr("the cache volume is shut down"));
        }
        // Classified under the lock, so requests reach the devices in the order they were
        // classified (a classifier outside it reorders concurrent sequential requests).
        let mut req = *req;
        if let (Some(c), Op::Read | Op::Write) = (&self.classifier, req.op) {
            let d = match &data {
                Data::Write(d) => Some(*d),
                _ => None,
            };
            req.class = c.classify(&req, d);
        }
        let req = &req;
        self.sync_if_full(&mut g)?;
        if g.failed {
            return self.run_direct(&mut g, req, data);
        }
        if req.op == Op::Read {
            lost_check(&g.lost, req.offset, req.end())?;
        }
        // Slots the request's lines hold now: an invalidation changes them without a step.
        let mut slots = std::mem::take(&mut g.slots);
        slots.clear();
        let mut all_slots = false;
        if req.len > 0 && req.op != Op::Flush {
            let (first, last) = (
                req.offset >> self.line_shift,
                (req.end() - 1) >> self.line_shift,
            );
            if last - first >= self.capacity_lines {
                all_slots = true;
            } else {
                for l in first..=last {
                    if let Some(s) = g.engine.lookup(Engine::line_key(0, l)) {
                        slots.push(s);
                    }
                }
            }
        }
        // (slot, key) the request's lines held before the plan (rule 5).
        let before: Vec<(u32, u64)> = slots
            .iter()
            .filter_map(|&s| Some((s, g.engine.slot_key(s)?)))
            .collect();
        // FUA in write-back: the engine plans a write-back write ending in FlushSsd, which
        // the flush after the plan makes durable (data and record).
        let plan = g.engine.process(req).map_err(ioerr)?;
        let (buf_start, buf_len) = (plan.buf_start, plan.buf_len);
        let steps: Vec<Step> = plan.steps.clone();
        let at = req.offset.saturating_sub(buf_start) as usize;
        let hit = req.op == Op::Read
            && !steps.is_empty()
            && steps.iter().all(|s| matches!(s, Step::ReadSsd { .. }));
        if hit {
            let _shared = self.io.read().unwrap_or_else(|e| e.into_inner());
            let exp: Vec<Option<(u64, Vec<u32>)>> = match g.sums.is_some() {
                true => steps
                    .iter()
                    .filter_map(|s| match *s {
                        Step::ReadSsd { ssd, len, .. } => Some(Self::expected(&g, ssd, len)),
                        _ => None,
                    })
                    .collect(),
                false => Vec::new(),
            };
            g.slots = slots;
            drop(g);
            let Data::Read(out) = data else {
                unreachable!()
            };
            let r = if buf_start == req.offset && buf_len as usize == out.len() {
                self.exec_reads(&steps, out, &exp)
            } else {
                let mut buf = vec![0u8; buf_len as usize];
                let r = self.exec_reads(&steps, &mut buf, &exp);
                if r.is_ok() {
                    out.copy_from_slice(&buf[at..at + out.len()]);
                }
                r
            };
            return match r {
                Ok(()) => Ok(()),
                Err(e) => {
                    drop(_shared);
                    self.read_fallback(req, out, e)
                }
            };
        }
        let excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let mut buf = vec![0u8; buf_len as usize];
        if let Data::Write(d) = &data {
            buf[at..at + d.len()].copy_from_slice(d);
        }
        let flux = Self::flux_pages_for(&g, &steps, &before, all_slots && req.op != Op::Read);
        let r = self
            .mark_in_flux(&mut g, &flux)
            .map_err(|err| StepError {
                index: 0,
                cache: true,
                err,
                // Only metadata flags were written: no data step ran, the engine can be put
                // back as `mem` has it.
                before_cache: true,
                done: Vec::new(),
            })
            .and_then(|()| self.exec(&mut g, &steps, &mut buf));
        for s in &steps {
            if let Some((ssd, len)) = ssd_range(s) {
                let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
                slots.extend(a as u32..=b as u32);
            }
        }
        if all_slots {
            slots.clear();
            slots.extend(0..self.capacity_lines as u32);
        }
        if let Err(e) = r {
            if e.before_cache {
                // Nothing in the cache changed: put the engine back as `mem` has it.
                let retry = self.failed_before_cache(&mut g, &steps, &e, &slots);
                let touched = slots.clone();
                g.slots = slots;
                Self::update_records(&mut g);
                if e.cache {
                    self.recover(&mut g, &[], 0, 0, &[], &touched);
                    self.cache_error(&mut g, e.err);
                    return self.direct(&mut g, req, data);
                }
                if retry {
                    // Dirty evictions are blocked now: planned again, the request needs no
                    // write-back (a clean victim, or the backing device directly).
                    drop(excl);
                    drop(g);
                    return self.run(req, data);
                }
                return Err(self.backing_error(e.err));
            }
            let touched = slots.clone();
            g.slots = slots;
            Self::update_records(&mut g);
            return self.after_failure(&mut g, req, data, &steps, e, buf_start, &buf, &touched);
        }
        g.slots = slots;
        Self::update_records(&mut g);
        if let Data::Read(out) = data {
            out.copy_from_slice(&buf[at..at + out.len()]);
        } else if matches!(req.op, Op::Write | Op::Trim) && !g.lost.is_empty() {
            // Damaged dirty data (`crate::data_sums`) rewritten: readable again.
            self.unlose(&mut g, req.offset, req.end());
        }
        if req.op == Op::Flush || req.fua {
            self.flush_locked(&mut g)?;
        }
        drop(excl);
        // This request had to unmap a record on the miss path (its likely victims were not
        // unmapped ahead, e.g. dirty): run the background pass now, after the plan.
        // Its own request is complete: a failure here is counted and logged, not returned.
        if std::mem::take(&mut g.unmapped_on_miss) {
            if let Err(e) = self.unmap_ahead_locked(&mut g) {
                tracing::warn!("unmapping likely victims ahead failed: {e}");
            }
        }
        if self.inline_cleaning.load(Ordering::Relaxed)
            && g.degraded.is_none()
            && g.engine.needs_cleaning()
        {
            let n = g.engine.cleaning_target();
            self.clean_pass(&mut g, n)?;
        }
        Ok(())
    }

    /// Inline cleaning (see the field): the deterministic order `tiercache sim` follows, so
    /// a queue-depth-1 replay gives the simulator's counts exactly; the background cleaner
    /// (the default) keeps write-backs off the request path instead.
    pub fn set_inline_cleaning(&self, on: bool) {
        self.inline_cleaning.store(on, Ordering::Relaxed);
    }

    /// Cleaning's chunk rewrite (`Engine::set_chunk_rewrite`): chunk bytes (0 = off) and
    /// the dirty runs from which a chunk is rewritten in one backing write.
    pub fn set_chunk_rewrite(&self, chunk: u64, min_runs: u64) -> io::Result<()> {
        self.lock()
            .engine
            .set_chunk_rewrite(chunk, min_runs)
            .map_err(ioerr)
    }

    /// Whether cleaning runs inline (see [`CacheVolume::set_inline_cleaning`]).
    pub fn inline_cleaning(&self) -> bool {
        self.inline_cleaning.load(Ordering::Relaxed)
    }

    /// Reads the ReadSsd steps of a hit; `exp`: their expected data checksums, in order
    /// (empty without data checksums).
    fn exec_reads(
        &self,
        steps: &[Step],
        buf: &mut [u8],
        exp: &[Option<(u64, Vec<u32>)>],
    ) -> io::Result<()> {
        let mut i = 0;
        for s in steps {
            if let Step::ReadSsd { ssd, buf: b, len } = *s {
                let e = exp.get(i).and_then(|e| e.as_ref());
                i += 1;
                self.read_data(ssd, &mut buf[b as usize..(b + len) as usize], e)?;
            }
        }
        Ok(())
    }

    /// The expected data checksums of `[ssd, ssd + len)` widened to whole sectors, with the
    /// sector size; `None` without data checksums.
    fn expected(g: &Inner, ssd: u64, len: u64) -> Option<(u64, Vec<u32>)> {
        let s = g.sums.as_ref()?;
        let (a, b) = s.widen(ssd, len);
        Some((s.sector, s.expected(a, b)))
    }

    /// Reads `out.len()` bytes of the data area at `ssd`; with `exp` (see
    /// [`CacheVolume::expected`]) verifies every sector the range touches (reading whole
    /// sectors): a mismatch is an `InvalidData` error carrying a [`data_sums::Mismatch`].
    fn read_data(&self, ssd: u64, out: &mut [u8], exp: Option<&(u64, Vec<u32>)>) -> io::Result<()> {
        let d = self.data_offset;
        let Some((sector, exp)) = exp else {
            return self.cache.read_at(out, d + ssd);
        };
        let len = out.len() as u64;
        let (a, b) = (
            ssd / sector * sector,
            (ssd + len).div_ceil(*sector) * sector,
        );
        let bad = |m| io::Error::new(io::ErrorKind::InvalidData, m);
        if a == ssd && b == ssd + len {
            self.cache.read_at(out, d + ssd)?;
            return DataSums::verify(*sector, a, out, exp).map_err(bad);
        }
        let mut tmp = vec![0u8; (b - a) as usize];
        self.cache.read_at(&mut tmp, d + a)?;
        DataSums::verify(*sector, a, &tmp, exp).map_err(bad)?;
        out.copy_from_slice(&tmp[(ssd - a) as usize..(ssd - a + len) as usize]);
        Ok(())
    }

    /// A data checksum mismatch found by a read (`e` carries it; other errors pass): counted
    /// and logged with the cache slot and volume range, while the engine still maps the line.
    /// The caller then drops the line ([`CacheVolume::recover`]): a damaged clean sector is
    /// read again from the backing device, a damaged dirty one is recorded as lost.
    fn on_mismatch(&self, g: &Inner, e: io::Error) -> io::Error {
        let Some(m) = data_sums::mismatch(&e) else {
            return e;
        };
        self.metrics.checksum_errors.fetch_add(1, Ordering::Relaxed);
        let slot = (m.ssd >> self.line_shift) as u32;
        let ls = 1u64 << self.line_shift;
        let Some(key) = g.engine.slot_key(slot) else {
            tracing::error!("{m}: cache slot {slot}, which maps no line");
            return e;
        };
        let dirty = g.engine.dirty_mask(slot);
        let ss = g.engine.sector_size();
        for &x in &m.sectors {
            let k = (x % ls) / ss;
            let vol = ((key & LINE_MASK) << self.line_shift) + k * ss;
            if dirty >> k & 1 == 1 {
                tracing::error!(
                    "data checksum mismatch in DIRTY data: cache slot {slot} (cache byte {}), volume bytes {vol}..{}: the sector is damaged and lost (never written to the backing device); reads of it fail with EIO until it is written again",
                    self.data_offset + x,
                    vol + ss
                );
            } else {
                tracing::warn!(
                    "data checksum mismatch in clean data: cache slot {slot} (cache byte {}), volume bytes {vol}..{}: line dropped, read again from the backing device",
                    self.data_offset + x,
                    vol + ss
                );
            }
        }
        e
    }

    /// `data` was written to the data area at `ssd`: records its checksums (sectors written
    /// in part are read back whole from the device).
    fn note_written(&self, g: &mut Inner, ssd: u64, data: &[u8]) -> io::Result<()> {
        let Some(s) = g.sums.as_mut() else {
            return Ok(());
        };
        if let Some((a, b)) = s.update(ssd, data) {
            let mut whole = vec![0u8; (b - a) as usize];
            self.cache.read_at(&mut whole, self.data_offset + a)?;
            s.update(a, &whole);
        }
        Ok(())
    }

    /// Executes plan steps (see the module doc for the reuse rule). The steps that only
    /// touch the backing device (write-backs, backing reads and writes) and depend on no
    /// earlier step run FIRST ([`backing_first`]): if one fails, nothing in the cache has
    /// changed yet (`StepError::before_cache`), so the engine can be put back exactly as
    /// `mem` records it ([`CacheVolume::roll_back`]) instead of dropping lines — a dirty line
    /// whose write-back failed stays dirty in its slot (issue 14 item 1).
    fn exec(&self, g: &mut Inner, steps: &[Step], buf: &mut [u8]) -> Result<(), StepError> {
        let ls = self.line_shift;
        g.in_plan.clear();
        for s in steps {
            if let Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } = *s {
                if len > 0 {
                    g.in_plan
                        .extend((ssd >> ls) as u32..=((ssd + len - 1) >> ls) as u32);
                }
            }
        }
        let r = self.exec_plan(g, steps, buf);
        g.in_plan.clear();
        r
    }

    /// [`CacheVolume::exec`] without its bookkeeping of `Inner::in_plan`.
    fn exec_plan(&self, g: &mut Inner, steps: &[Step], buf: &mut [u8]) -> Result<(), StepError> {
        let first = backing_first(steps);
        // Steps done, sorted (a merged write-back completes several).
        let mut done: Vec<usize> = Vec::new();
        let mut tmp = Vec::new();
        if !first.is_empty() {
            // Write-backs that must wait for phase 2 may not join a phase-1 merge.
            let mut skip: Vec<usize> = (0..steps.len())
                .filter(|i| {
                    matches!(steps[*i], Step::WriteBack { .. } | Step::CopyHdd { .. })
                        && first.binary_search(i).is_err()
                })
                .collect();
            for &index in &first {
                if skip.binary_search(&index).is_ok() {
                    continue;
                }
                let group = self
                    .exec_step(g, steps, index, buf, &mut tmp, &skip)
                    .map_err(|e| StepError {
                        before_cache: true,
                        ..e
                    })?;
                for i in group.into_iter().chain([index]) {
                    if let Err(at) = skip.binary_search(&i) {
                        skip.insert(at, i);
                    }
                    if let Err(at) = done.binary_search(&i) {
                        done.insert(at, i);
                    }
                }
            }
        }
        for index in 0..steps.len() {
            if done.binary_search(&index).is_ok() {
                continue;
            }
            let group = self
                .exec_step(g, steps, index, buf, &mut tmp, &done)
                .map_err(|e| StepError {
                    done: done.clone(),
                    ..e
                })?;
            for i in group {
                if let Err(at) = done.binary_search(&i) {
                    done.insert(at, i);
                }
            }
        }
        Ok(())
    }

    /// Runs step `index` of `steps`; returns the later write-backs merged into it (see
    /// `WriteBack`), which `skip` (sorted) must not name.
    fn exec_step(
        &self,
        g: &mut Inner,
        steps: &[Step],
        index: usize,
        buf: &mut [u8],
        tmp: &mut Vec<u8>,
        skip: &[usize],
    ) -> Result<Vec<usize>, StepError> {
        let d = self.data_offset;
        let r = |a: u64, l: u64| a as usize..(a + l) as usize;
        let s = &steps[index];
        {
            let c = |err| StepError {
                index,
                cache: true,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            let h = |err| StepError {
                index,
                cache: false,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            let u = |(cache, err)| StepError {
                index,
                cache,
                err,
                before_cache: false,
                done: Vec::new(),
            };
            match *s {
                Step::ReadSsd { ssd, buf: b, len } => {
                    let exp = Self::expected(g, ssd, len);
                    self.read_data(ssd, &mut buf[r(b, len)], exp.as_ref())
                        .map_err(|e| c(self.on_mismatch(g, e)))?
                }
                Step::ReadHdd {
                    hdd, buf: b, len, ..
                } => self.backing.read_at(&mut buf[r(b, len)], hdd).map_err(h)?,
                Step::WriteSsd { ssd, buf: b, len } => {
                    self.unmap_before_reuse(g, ssd, len).map_err(u)?;
                    self.cache.write_at(&buf[r(b, len)], d + ssd).map_err(c)?;
                    self.note_written(g, ssd, &buf[r(b, len)]).map_err(c)?
                }
                Step::WriteHdd {
                    hdd, buf: b, len, ..
                } => {
                    g.wrote_backing(hdd, hdd + len);
                    self.backing.write_at(&buf[r(b, len)], hdd).map_err(h)?
                }
                Step::Populate { hdd, ssd, len, .. } => {
                    self.unmap_before_reuse(g, ssd, len).map_err(u)?;
                    tmp.resize(len as usize, 0);
                    self.backing.read_at(tmp, hdd).map_err(h)?;
                    self.cache.write_at(tmp, d + ssd).map_err(c)?;
                    self.note_written(g, ssd, tmp).map_err(c)?
                }
                Step::WriteBack { hdd, .. } | Step::CopyHdd { hdd, .. } => {
                    // Later write-backs that continue this one on the backing device (cleaning
                    // goes in LBA order; evictions of a sequential run evict neighbours)
                    // join it in one backing write, when no step between touches their
                    // slot or backing range. A failure names this step: none of the group
                    // reached the backing device, and `recover` redoes write-backs from here.
                    // A chunk rewrite's gaps (`CopyHdd`) are read from the backing device in
                    // one read spanning them all, then the cached parts are laid over it:
                    // this runs under the volume lock, so no write can change the range
                    // between that read and the write.
                    let group = merge_write_backs(steps, index, skip);
                    let copies = group.iter().filter_map(|&j| match steps[j] {
                        Step::CopyHdd { hdd, len, .. } => Some((hdd, hdd + len)),
                        _ => None,
                    });
                    let span = copies.fold(None, |a: Option<(u64, u64)>, (x, y)| {
                        Some(a.map_or((x, y), |(p, q)| (p.min(x), q.max(y))))
                    });
                    tmp.clear();
                    let total: u64 = group.iter().map(|&j| steps[j].bytes().3).sum();
                    tmp.resize(total as usize, 0);
                    if let Some((x, y)) = span {
                        self.backing
                            .read_at(&mut tmp[r(x - hdd, y - x)], x)
                            .map_err(h)?;
                    }
                    for &j in &group {
                        if let Step::WriteBack {
                            ssd, hdd: at, len, ..
                        } = steps[j]
                        {
                            let at = at - hdd;
                            // Never a damaged dirty sector to the backing device.
                            let exp = Self::expected(g, ssd, len);
                            self.read_data(ssd, &mut tmp[r(at, len)], exp.as_ref())
                                .map_err(|e| c(self.on_mismatch(g, e)))?;
                        }
                    }
                    g.wrote_backing(hdd, hdd + total);
                    self.backing.write_at(tmp, hdd).map_err(h)?;
                    return Ok(group[1..].to_vec());
                }
                // Discards are hints; keeping the bytes is always correct.
                Step::TrimSsd { .. } | Step::TrimHdd { .. } => {}
                // The caller runs the whole flush sequence after the plan.
                Step::FlushSsd | Step::FlushHdd { .. } => {}
            }
        }
        Ok(Vec::new())
    }

    /// Rule 5 of the module doc: the metadata pages to flag in flux before `steps` run, i.e.
    /// those holding a durable record that maps
    /// * a slot a step writes in place, for the key the engine keeps there;
    /// * a line of the request (`before`: its slots and keys before the plan) that the plan
    ///   drops or replaces, or whose backing range it writes (`all_lines`: a write or trim
    ///   spanning more lines than the cache holds, for which `before` is not listed);
    /// * a line the plan writes on the backing device and the engine dropped earlier in this
    ///   epoch (`forgotten`).
    fn flux_pages_for(
        g: &Inner,
        steps: &[Step],
        before: &[(u32, u64)],
        all_lines: bool,
    ) -> BTreeSet<u64> {
        let line_shift = g.sb.line_size.trailing_zeros();
        let mut pages = BTreeSet::new();
        let mut need = |slot: u32| {
            pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
        };
        let writes_backing = steps.iter().any(|s| matches!(s, Step::WriteHdd { .. }));
        if all_lines {
            // A write or trim of more lines than the cache holds (`before` is not listed):
            // every mapped record may be concerned.
            for (s, &k) in g.disk_key.iter().enumerate() {
                if k != EMPTY_KEY {
                    need(s as u32);
                }
            }
        }
        for &(s, k) in before {
            if g.disk_key[s as usize] == k && (writes_backing || g.engine.slot_key(s) != Some(k)) {
                need(s);
            }
        }
        for st in steps {
            match *st {
                Step::WriteSsd { ssd, len, .. } | Step::Populate { ssd, len, .. } if len > 0 => {
                    for s in ssd >> line_shift..=(ssd + len - 1) >> line_shift {
                        let on_disk = g.disk_key[s as usize];
                        if on_disk != EMPTY_KEY && g.engine.slot_key(s as u32) == Some(on_disk) {
                            need(s as u32);
                        }
                    }
                }
                Step::WriteHdd { hdd, len, .. } if len > 0 && !g.forgotten.is_empty() => {
                    for l in hdd >> line_shift..=(hdd + len - 1) >> line_shift {
                        let key = Engine::line_key(0, l);
                        if let Some(&s) = g.forgotten.get(&key) {
                            if g.disk_key[s as usize] == key {
                                need(s);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        pages
    }

    /// Flags every record of `pages` not flagged yet in flux on the device (each run of
    /// pages read and written once, then one sync), rule 5 of the module doc; `pages` stay
    /// flagged for [`FLUX_EPOCHS`] more flushes.
    fn mark_in_flux(&self, g: &mut Inner, pages: &BTreeSet<u64>) -> io::Result<()> {
        let epoch = g.flush_epoch;
        let mut new = BTreeSet::new();
        for &p in pages {
            if let Some(e) = g.flux_pages.get_mut(&p) {
                *e = epoch;
            } else {
                new.insert(p);
            }
        }
        let pages = &new;
        if pages.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for (first, n) in runs(pages) {
            // The pages as last written (only this volume writes them), every mapped record
            // flagged; its key, masks and sequence number stay.
            buf.resize((n * PAGE) as usize, 0);
            self.cache.read_at(&mut buf, META_OFFSET + first * PAGE)?;
            for rec in buf.chunks_mut(RECORD_BYTES as usize) {
                if let Some(r) = Record::decode(rec).filter(|r| r.key != EMPTY_KEY) {
                    r.encode_flagged(rec, true);
                }
            }
            self.cache.write_at(&buf, META_OFFSET + first * PAGE)?;
        }
        self.cache.sync()?;
        g.flux_pages.extend(pages.iter().map(|&p| (p, epoch)));
        self.metrics.flux_syncs.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .flux_pages
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Rule 2 of the module doc: slots in `[ssd, ssd + len)` whose durable record maps a key
    /// other than the one the engine now keeps there are unmapped on the device first. The
    /// same batch (one page write per run of pages, one sync) unmaps ahead the persisted
    /// records of the engine's next likely victims whose lines are clean, so their evictions
    /// need no sync. Errors: (whether the cache device failed, the error).
    fn unmap_before_reuse(
        &self,
        g: &mut Inner,
        ssd: u64,
        len: u64,
    ) -> Result<(), (bool, io::Error)> {
        let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
        let need: Vec<u32> = (a..=b)
            .map(|s| s as u32)
            .filter(|&s| {
                let on_disk = g.disk_key[s as usize];
                on_disk != EMPTY_KEY && g.engine.slot_key(s) != Some(on_disk)
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let mut ahead = Vec::new();
        let k = self.unmap_batch_now();
        if k > 1 {
            let mut cand = Vec::new();
            g.engine.eviction_candidates(k, &mut cand);
            for s in cand {
                let key = g.engine.slot_key(s);
                if key.is_some()
                    && key == Some(g.disk_key[s as usize])
                    && g.engine.dirty_mask(s) == 0
                    && !need.contains(&s)
                {
                    ahead.push(s);
                }
            }
        }
        self.metrics
            .unmap_on_miss
            .fetch_add(need.len() as u64, Ordering::Relaxed);
        g.unmapped_on_miss = true;
        self.unmap_records(g, &need, &ahead)
    }

    /// Rewrites the device records of `now` (slots about to be reused) and `ahead` (slots
    /// whose clean line the engine keeps) as empty: a backing sync first when write-backs
    /// ran since the last one, then each run of pages read and written once, then one cache
    /// sync. `ahead` slots' `mem` records become empty first and stay so while their line is
    /// clean (see `Inner::ahead`); `now` slots' records follow the engine after the plan.
    fn unmap_records(
        &self,
        g: &mut Inner,
        now: &[u32],
        ahead: &[u32],
    ) -> Result<(), (bool, io::Error)> {
        // `ahead` first in `mem` (and `Inner::ahead`): if the device writes fail half way,
        // their records may be empty on the device already, and stay so in `mem`.
        for &s in ahead {
            let Some(key) = g.engine.slot_key(s) else {
                continue;
            };
            let at = s as usize * RECORD_BYTES as usize;
            let rec = &mut g.mem[at..at + RECORD_BYTES as usize];
            if Record::decode(rec).is_none_or(|r| r.key != EMPTY_KEY) {
                Record {
                    seq: g.seq,
                    ..Record::EMPTY
                }
                .encode(rec);
                g.seq = g.seq.wrapping_add(1);
            }
            g.ahead.insert(s, key);
        }
        let on_disk: Vec<u32> = now
            .iter()
            .chain(ahead)
            .copied()
            .filter(|&s| g.disk_key[s as usize] != EMPTY_KEY)
            .collect();
        if !on_disk.is_empty() {
            if g.backing_unsynced() {
                // The `now` slots still hold the lines the plan evicts from them (`mem` has
                // their records as before the plan): a failed sync writes those lines again
                // from there.
                let evicting: Vec<(u32, u64, u64)> = now
                    .iter()
                    .filter_map(|&s| {
                        let at = s as usize * RECORD_BYTES as usize;
                        let r = Record::decode(&g.mem[at..at + RECORD_BYTES as usize])?;
                        (r.key != EMPTY_KEY && g.engine.slot_key(s) != Some(r.key))
                            .then_some((s, r.key, r.valid))
                    })
                    .collect();
                self.sync_backing_with(g, &evicting)
                    .map_err(|e| (false, e))?;
            }
            let c = |e| (true, e);
            let empty = Record {
                seq: g.seq,
                ..Record::EMPTY
            };
            g.seq = g.seq.wrapping_add(1);
            let pages: BTreeSet<u64> = on_disk
                .iter()
                .map(|&s| s as u64 / format::RECORDS_PER_PAGE)
                .collect();
            let mut buf = Vec::new();
            for (first, n) in runs(&pages) {
                // The pages as last written (metadata is only ever written by this volume, so
                // the device returns exactly that), with the batch's records emptied.
                buf.resize((n * PAGE) as usize, 0);
                self.cache
                    .read_at(&mut buf, META_OFFSET + first * PAGE)
                    .map_err(c)?;
                let span = first * format::RECORDS_PER_PAGE..(first + n) * format::RECORDS_PER_PAGE;
                for &s in &on_disk {
                    if span.contains(&(s as u64)) {
                        let o = ((s as u64 - span.start) * RECORD_BYTES) as usize;
                        empty.encode(&mut buf[o..o + RECORD_BYTES as usize]);
                    }
                }
                self.cache
                    .write_at(&buf, META_OFFSET + first * PAGE)
                    .map_err(c)?;
            }
            self.cache.sync().map_err(c)?;
            for &s in &on_disk {
                g.disk_key[s as usize] = EMPTY_KEY;
            }
            self.metrics.unmap_syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .unmap_ahead
            .fetch_add(ahead.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Brings the `mem` records of `g.slots` up to the engine's state.
    fn update_records(g: &mut Inner) {
        let slots = std::mem::take(&mut g.slots);
        for &slot in &slots {
            if let Some(&k) = g.ahead.get(&slot) {
                // Unmapped ahead: stays empty on the device while its line stays clean.
                if g.engine.slot_key(slot) == Some(k) && g.engine.dirty_mask(slot) == 0 {
                    continue;
                }
                g.ahead.remove(&slot);
            }
            let want = match g.engine.slot_key(slot) {
                Some(key) => Record {
                    key,
                    valid: g.engine.valid_mask(slot),
                    dirty: g.engine.dirty_mask(slot),
                    seq: 0,
                },
                None => Record::EMPTY,
            };
            let at = slot as usize * RECORD_BYTES as usize;
            let rec = &mut g.mem[at..at + RECORD_BYTES as usize];
            let have = Record::decode(rec);
            if let Some(h) = have.filter(|h| h.key != want.key && h.key != EMPTY_KEY) {
                // Dropped while the device may still map it here (rule 5).
                if g.disk_key[slot as usize] == h.key {
                    g.forgotten.insert(h.key, slot);
                }
            }
            let same = have.is_some_and(|h| {
                h.key == want.key
                    && (want.key == EMPTY_KEY || (h.valid == want.valid && h.dirty == want.dirty))
            });
            if !same {
                Record { seq: g.seq, ..want }.encode(rec);
                g.seq = g.seq.wrapping_add(1);
                g.dirty_pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
            }
        }
        g.slots = slots;
    }

    /// Rule 4: backing sync, cache sync, changed metadata pages, cache sync.
    /// A cache-device failure here fails the cache (see [`CacheVolume::fail_cache`]); the
    /// flush then fails only if dirty data was lost with it.
    fn flush_locked(&self, g: &mut Inner) -> io::Result<()> {
        if g.failed {
            return self.sync_backing(g).map_err(|e| self.backing_error(e));
        }
        self.sync_backing(g).map_err(|e| self.backing_error(e))?;
        if let Err(e) = self.flush_cache(g) {
            let lost_before = g.lost.len();
            g.cache_errors += 1;
            self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("cache device failed during a flush: {e}");
            let erased = self.fail_cache(g, &format!("cache device failed during a flush: {e}"));
            if g.lost.len() != lost_before {
                return Err(io::Error::other(format!(
                    "flush: the cache device failed and dirty data was lost ({e})"
                )));
            }
            // Records on the device may still map lines changed since: unless the device is
            // marked unusable, a restart could serve them, so the flush is not complete.
            if !erased {
                return Err(io::Error::other(format!(
                    "flush: the cache device failed and could not be marked unusable ({e})"
                )));
            }
        }
        Ok(())
    }

    /// Syncs the backing device. A sync that fails may have dropped every write since the
    /// last good one, and a later sync would succeed without them: so the ranges written
    /// since (`Inner::hdd_unsynced`) are written again at once from the cache where it holds
    /// them ([`CacheVolume::rewrite_unsynced`]), the rest reported lost (reads fail until
    /// rewritten, never older bytes); they stay listed until a sync succeeds.
    fn sync_backing(&self, g: &mut Inner) -> io::Result<()> {
        self.sync_backing_with(g, &[])
    }

    /// Syncs the backing device when too much was written to it since its last good sync
    /// (`Inner::unsynced_full`): bounds what a failed sync can drop. Called before the
    /// engine plans (a failure here changes nothing).
    fn sync_if_full(&self, g: &mut Inner) -> io::Result<()> {
        if g.unsynced_full() {
            self.sync_backing(g).map_err(|e| self.backing_error(e))?;
        }
        Ok(())
    }

    /// [`CacheVolume::sync_backing`]; `evicting`: `(slot, key, valid)` of lines the engine
    /// dropped in the plan being run whose slots still hold them (not yet overwritten).
    fn sync_backing_with(&self, g: &mut Inner, evicting: &[(u32, u64, u64)]) -> io::Result<()> {
        match self.backing.sync() {
            Ok(()) => {
                g.hdd_unsynced.clear();
                g.hdd_unsynced_bytes = 0;
                Ok(())
            }
            Err(e) => {
                self.metrics
                    .backing_sync_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.rewrite_unsynced(g, &e, evicting);
                Err(e)
            }
        }
    }

    /// After a failed backing sync (`why`): writes every range of `hdd_unsynced` again from
    /// the cache's valid sectors of it (the current bytes: a clean or dirty line holds the
    /// newest data); a sector the cache does not hold (write-around, evicted, failed cache),
    /// or whose copy cannot be read or written, is reported lost. `evicting`: see
    /// [`CacheVolume::sync_backing_with`].
    fn rewrite_unsynced(&self, g: &mut Inner, why: &io::Error, evicting: &[(u32, u64, u64)]) {
        let ranges: Vec<(u64, u64)> = g.hdd_unsynced.iter().map(|(&a, &b)| (a, b)).collect();
        let lost_before = g.lost.clone();
        let (sh, ls, ss) = (self.line_shift, self.line_size(), g.engine.sector_size());
        let mut rewritten = 0u64;
        let mut buf = Vec::new();
        for (a, b) in ranges {
            let b = b.min(self.size);
            if a >= b {
                continue;
            }
            for line in a >> sh..=(b - 1) >> sh {
                let base = line << sh;
                let (x, y) = (a.max(base), b.min(base + ls));
                let key = Engine::line_key(0, line);
                let (slot, valid) = match g.failed {
                    true => (None, 0),
                    false => match g.engine.lookup(key) {
                        // Written by the plan being run: may still hold another line.
                        Some(s) if g.in_plan.contains(&s) => (None, 0),
                        Some(s) => (Some(s), g.engine.valid_mask(s)),
                        None => evicting
                            .iter()
                            .find(|e| e.1 == key)
                            .map_or((None, 0), |e| (Some(e.0), e.2)),
                    },
                };
                let held = |at: u64| valid >> ((at - base) / ss) & 1 == 1;
                let mut p = x;
                while p < y {
                    let v = held(p);
                    let mut q = base + ((p - base) / ss + 1) * ss;
                    while q < y && held(q) == v {
                        q += ss;
                    }
                    let q = q.min(y);
                    let r = match slot.filter(|_| v) {
                        Some(slot) => {
                            let ssd = ((slot as u64) << sh) + (p - base);
                            buf.resize((q - p) as usize, 0);
                            let exp = Self::expected(g, ssd, q - p);
                            self.read_data(ssd, &mut buf, exp.as_ref())
                                .and_then(|_| self.backing.write_at(&buf, p))
                        }
                        None => Err(io::Error::other("the cache does not hold them")),
                    };
                    match r {
                        Ok(()) => rewritten += 1,
                        Err(e) => self.lose(
                            g,
                            p,
                            q,
                            &format!(
                                "written to the backing device, whose sync then failed ({why}) and may have dropped them; not written again: {e}"
                            ),
                        ),
                    }
                    p = q;
                }
            }
        }
        tracing::warn!(
            "backing device sync failed ({why}): {rewritten} ranges written since the last good sync written again from the cache, {} lost ranges now",
            g.lost.len()
        );
        if g.lost != lost_before && g.sums.is_some() && !g.failed {
            self.persist_lost(g);
        }
    }

    /// The cache half of a flush: sync, changed metadata pages (flagged again if still in
    /// flux) and pages retiring from flux (rewritten without the flag), sync.
    fn flush_cache(&self, g: &mut Inner) -> io::Result<()> {
        // Data checksums changed since the last flush: durable with the data they describe,
        // before any record that maps it (`crate::data_sums`).
        if let Some(s) = g.sums.as_mut().filter(|s| s.has_dirty()) {
            s.write_dirty(&*self.cache)?;
        }
        self.cache.sync()?;
        let header = g.sums.as_ref().is_some_and(|s| s.header_dirty);
        self.flush_cache_records(g)?;
        if let Some(s) = g.sums.as_mut().filter(|_| header) {
            // Lost ranges rewritten since: after the records that map the new data (a crash
            // in between keeps reporting the range lost, never serves the stale backing copy).
            s.lost = g.lost.clone();
            s.write_header(&*self.cache)?;
            self.cache.sync()?;
        }
        Ok(())
    }

    /// The records half of [`CacheVolume::flush_cache`] (after its first sync).
    fn flush_cache_records(&self, g: &mut Inner) -> io::Result<()> {
        // Rule 4: a record claims its clean line matches the backing device, so every
        // backing write must have been followed by a sync that succeeded.
        assert!(
            g.hdd_unsynced.is_empty(),
            "cache records written while {} backing ranges are not synced (first {:?})",
            g.hdd_unsynced.len(),
            g.hdd_unsynced.iter().next()
        );
        let epoch = g.flush_epoch;
        let retiring: BTreeSet<u64> = g
            .flux_pages
            .iter()
            .filter(|&(_, &e)| e + FLUX_EPOCHS <= epoch)
            .map(|(&p, _)| p)
            .collect();
        if g.dirty_pages.is_empty() && retiring.is_empty() {
            return Ok(());
        }
        let mut pages = g.dirty_pages.clone();
        pages.extend(&retiring);
        let mut buf = Vec::new();
        // One write per run of consecutive pages.
        for (page, n) in runs(&pages) {
            let p = (page * PAGE) as usize..((page + n) * PAGE) as usize;
            buf.clear();
            buf.extend_from_slice(&g.mem[p.clone()]);
            for (i, b) in buf.chunks_mut(PAGE as usize).enumerate() {
                let q = page + i as u64;
                if g.flux_pages.contains_key(&q) && !retiring.contains(&q) {
                    for rec in b.chunks_mut(RECORD_BYTES as usize) {
                        if let Some(r) = Record::decode(rec).filter(|r| r.key != EMPTY_KEY) {
                            r.encode_flagged(rec, true);
                        }
                    }
                }
            }
            self.cache.write_at(&buf, META_OFFSET + page * PAGE)?;
            let first = (page * format::RECORDS_PER_PAGE) as usize;
            for (i, r) in g.mem[p].chunks(RECORD_BYTES as usize).enumerate() {
                if let Some(k) = g.disk_key.get_mut(first + i) {
                    *k = Record::decode(r).map_or(EMPTY_KEY, |r| r.key);
                }
            }
        }
        self.cache.sync()?;
        g.dirty_pages.clear();
        g.flux_pages.retain(|p, _| !retiring.contains(p));
        g.flush_epoch += 1;
        g.forgotten.clear();
        self.metrics
            .metadata_pages
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Writes back every dirty line (under the lock).
    fn clean_all(&self, g: &mut Inner) -> io::Result<()> {
        while g.engine.dirty_lines() > 0 {
            match self.clean_pass(g, 1024) {
                // The damaged line was dropped (its damaged sectors recorded as lost, the
                // rest written back): the next pass makes progress.
                Err(e) if data_sums::mismatch(&e).is_some() => continue,
                r => r?,
            }
        }
        Ok(())
    }

    fn clean_pass(&self, g: &mut Inner, n: u64) -> io::Result<()> {
        self.sync_if_full(g)?;
        let steps = g.engine.clean(n).steps.clone();
        self.run_clean_steps(g, steps)
    }

    /// Executes a plan of write-backs (cleaning) and brings the records up to date.
    fn run_clean_steps(&self, g: &mut Inner, steps: Vec<Step>) -> io::Result<()> {
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        let r = self.exec(g, &steps, &mut []);
        let mut slots = std::mem::take(&mut g.slots);
        slots.clear();
        for s in &steps {
            if let Some((ssd, len)) = ssd_range(s) {
                let (a, b) = (ssd >> self.line_shift, (ssd + len - 1) >> self.line_shift);
                slots.extend(a as u32..=b as u32);
            }
        }
        if let Err(e) = &r {
            if e.before_cache {
                // Every write-back runs in the backing-first phase: the lines are put back
                // dirty as `mem` has them (nothing is dropped on a backing error).
                self.failed_before_cache(g, &steps, e, &slots);
            }
        }
        let touched = slots.clone();
        g.slots = slots;
        Self::update_records(g);
        if let Err(e) = r {
            if !e.before_cache {
                let pending = e.pending(&steps);
                self.recover(g, &pending, 0, 0, &[], &[]);
            } else if e.cache {
                self.recover(g, &[], 0, 0, &[], &touched);
            }
            return Err(if e.cache {
                self.cache_error(g, e.err)
            } else {
                self.backing_error(e.err)
            });
        }
        if !steps.is_empty() {
            self.leave_degraded(g);
        }
        Ok(())
    }

    /// One background cleaning step: writes back down to the low watermark when the engine
    /// says cleaning is due. Returns whether it did anything (the rate-controlled pass:
    /// whether the next should follow at once, its budget not spent).
    pub fn clean_if_needed(&self) -> io::Result<bool> {
        let mut g = self.lock();
        if g.closed || g.failed {
            return Ok(false);
        }
        if let Some(d) = &g.degraded {
            // Retry write-backs with backoff (also with inline cleaning, and below the
            // watermark): the first success ends the degraded state.
            if Instant::now() < d.retry_at {
                return Ok(false);
            }
            if g.engine.dirty_lines() == 0 {
                self.leave_degraded(&mut g);
                return Ok(true);
            }
            let n = g.engine.dirty_lines().clamp(1, 64);
            self.clean_pass(&mut g, n)?;
            return Ok(true);
        }
        if self.inline_cleaning() {
            return Ok(false);
        }
        if g.engine.needs_cleaning() {
            // Returns true: the cleaner lets waiting requests in, then runs the next pass.
            let n = g.engine.cleaning_target().clamp(1, CLEAN_PASS_LINES);
            self.clean_pass(&mut g, n)?;
            return Ok(true);
        }
        // Below the high watermark: the rate controller's share of write-backs, spread over
        // time (a few lines per wake-up) so that foreground requests wait for little.
        let n = {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let dt = r.last.map(|t| (now - t).as_secs_f64()).unwrap_or(0.0);
            r.last = Some(now);
            let rate = r
                .ctl
                .update(g.engine.dirty_lines(), self.capacity_lines, dt);
            // At most one second's worth is saved up (an idle cleaner does not burst later).
            r.budget = (r.budget + rate * dt).min(rate.max(1.0));
            let n = r.budget.floor().min(r.pass.max(1) as f64);
            r.budget -= n;
            n as u64
        };
        if n == 0 || g.engine.dirty_lines() == 0 {
            return Ok(false);
        }
        let t = Instant::now();
        self.clean_pass(&mut g, n)?;
        let queued = self.waiting.load(Ordering::Acquire) > 0;
        drop(g);
        let took = t.elapsed();
        let more = {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            if queued && took > FLUSH_PASS_TARGET {
                let f = FLUSH_PASS_TARGET.as_secs_f64() / took.as_secs_f64();
                r.pass = ((n as f64 * f) as u64).max(1);
            } else if !queued || took < FLUSH_PASS_TARGET / 2 {
                r.pass = (r.pass * 2).min(RATE_PASS_LINES);
            }
            // The budget a short pass left: the next pass comes without the 20 ms sleep.
            r.budget >= 1.0
        };
        // A short pass, then the cleaner lets waiting requests in (and sleeps unless the
        // budget is left): the volume lock is held for one pass only, so a foreground
        // request waits for a few write-backs at most.
        Ok(more)
    }

    /// The background cleaner's write-back rate (`--writeback-rate auto|off|N`) and the dirty
    /// share it holds (`--writeback-target`): see [`tiercache_engine::rate`]. Above the high
    /// watermark the watermark cleaning still runs at full speed.
    pub fn set_writeback_rate(
        &self,
        mode: tiercache_engine::WritebackRate,
        target: f64,
    ) -> Result<(), String> {
        let ctl = tiercache_engine::RateController::new(mode, target)?;
        {
            let mut r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
            *r = WbRate {
                ctl,
                last: None,
                budget: 0.0,
                pass: RATE_PASS_LINES,
            };
        }
        self.store_cleaner(Some((mode, target)))
    }

    /// Stores the cleaner's settings (cleaning policy and age, and the write-back rate when
    /// `writeback` is given, else the stored one) in the superblock's settings block, so a
    /// restart keeps them as it keeps the engine's.
    fn store_cleaner(
        &self,
        writeback: Option<(tiercache_engine::WritebackRate, f64)>,
    ) -> Result<(), String> {
        let mut g = self.lock();
        if g.closed {
            return Ok(());
        }
        let writeback = writeback.or(g.sb.tuning.and_then(|t| t.writeback));
        g.sb.tuning = Some(Tuning {
            writeback,
            ..Tuning::of(g.engine.config())
        });
        self.write_superblock(&mut g).map_err(|e| {
            format!("applied, but storing it in the superblock failed ({e}): a restart goes back to the stored value")
        })
    }

    /// The write-back rate setting, its target share and the rate now (lines/s).
    pub fn writeback_rate(&self) -> (tiercache_engine::WritebackRate, f64, f64) {
        let r = self.wb_rate.lock().unwrap_or_else(|e| e.into_inner());
        (r.ctl.mode, r.ctl.target, r.ctl.rate())
    }

    /// The cleaning policy (`--cleaning lba|acp|alru`, `Engine` setting `cleaning`) and
    /// ALRU's age in requests.
    pub fn set_cleaning(
        &self,
        policy: tiercache_engine::CleaningPolicy,
        age: Option<u64>,
    ) -> Result<(), String> {
        self.lock()
            .engine
            .retune(|c| {
                c.cleaning = policy;
                if let Some(a) = age {
                    c.cleaning_age = a;
                }
            })
            .map_err(|e| e.to_string())?;
        self.store_cleaner(None)
    }

    /// Records unmapped per batch: the setting, at most an eighth of the cache.
    fn unmap_batch_now(&self) -> u64 {
        self.unmap_batch
            .load(Ordering::Relaxed)
            .min(self.capacity_lines / 8)
    }

    /// Records of likely victims unmapped per batch (rule 2 of the module doc), at most an
    /// eighth of the cache; 0 or 1: each record is unmapped alone when its slot is reused.
    pub fn set_unmap_batch(&self, n: u64) {
        self.unmap_batch.store(n, Ordering::Relaxed);
    }

    /// Slots whose clean line's record is unmapped ahead of its eviction (tests, diagnostics):
    /// a crash forgets these lines (their data is on the backing device).
    pub fn unmapped_ahead(&self) -> Vec<u32> {
        let g = self.lock();
        let mut v: Vec<u32> = g.ahead.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The background half of the write-back miss path: when fewer than half of the engine's
    /// next `unmap_batch` likely victims are unmapped ahead, writes back the dirty ones among
    /// them (LBA order, contiguous ones merged; counted as cleaning), then unmaps them all
    /// in one batch (one backing sync, one cache sync), so their evictions need no sync.
    /// Returns whether it did anything.
    pub fn unmap_ahead_if_needed(&self) -> io::Result<bool> {
        let mut g = self.lock();
        self.unmap_ahead_locked(&mut g)
    }

    fn unmap_ahead_locked(&self, g: &mut Inner) -> io::Result<bool> {
        // Degraded: its write-backs would fail; clean lines are evicted without a sync then.
        if g.closed || g.failed || g.degraded.is_some() || self.inline_cleaning() {
            return Ok(false);
        }
        let k = self.unmap_batch_now();
        if k < 2 {
            return Ok(false);
        }
        let mut cand = Vec::new();
        g.engine.eviction_candidates(k, &mut cand);
        cand.retain(|s| !g.ahead.contains_key(s));
        if cand.is_empty() || (cand.len() as u64) < k / 2 {
            return Ok(false);
        }
        let mut dirty: Vec<u32> = cand
            .iter()
            .copied()
            .filter(|&s| g.engine.dirty_mask(s) != 0)
            .collect();
        if !dirty.is_empty() {
            dirty.sort_by_key(|&s| g.engine.slot_key(s));
            // A short pass under the lock: the next call (after the lock went to waiting
            // requests) picks the candidates again and writes back the rest.
            let more = dirty.len() as u64 > CLEAN_PASS_LINES;
            dirty.truncate(CLEAN_PASS_LINES as usize);
            self.sync_if_full(g)?;
            let steps = g.engine.write_back_slots(&dirty).steps.clone();
            self.run_clean_steps(g, steps)?;
            if more {
                return Ok(true);
            }
        }
        // Every candidate is clean now (a failed write-back returned above).
        debug_assert!(
            cand.iter().all(|&s| g.engine.dirty_mask(s) == 0),
            "unmapping a dirty line's record ahead would lose its data on a crash"
        );
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        if let Err((cache, e)) = self.unmap_records(g, &[], &cand) {
            return Err(if cache {
                self.cache_error(g, e)
            } else {
                self.backing_error(e)
            });
        }
        Ok(true)
    }

    /// Starts the background cleaner; it stops at [`CacheVolume::shutdown`].
    pub fn start_cleaner(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let v = Arc::clone(self);
        std::thread::Builder::new()
            .name("tiercache-cleaner".into())
            .spawn(move || {
                while !v.stop.load(Ordering::Relaxed) {
                    let r = v.clean_if_needed();
                    let r = match r {
                        Ok(did) => v.unmap_ahead_if_needed().map(|a| a || did),
                        e => e,
                    };
                    match r {
                        Ok(true) => v.let_waiters_in(),
                        Ok(false) => std::thread::sleep(Duration::from_millis(20)),
                        Err(e) => {
                            tracing::error!("cleaning failed: {e}");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
            })
            .expect("spawn cleaner")
    }

    /// Writes back every dirty line and makes everything durable (`ctl flush`).
    ///
    /// In passes (about `FLUSH_PASS_TARGET` each while foreground requests queue behind
    /// them, growing to `FLUSH_PASS_MAX` lines while none do; LBA order carried across
    /// passes by the engine's cleaning cursor) with the volume lock handed to waiting
    /// foreground requests in between, so reads and writes go on during a long flush. Each pass writes
    /// its lines back and updates their records under the lock, as a cleaning pass does, so
    /// a line rewritten between passes is simply dirty again. Once the lines dirty at the
    /// start are written (bounded: at most twice their count plus a pass, however fast
    /// clients dirty new ones), the rest is written and everything synced in one hold of the
    /// lock: on return the backing device holds, durably, every byte acknowledged before
    /// the call and before the last hold.
    pub fn flush_dirty(&self) -> io::Result<()> {
        let budget = 2 * self.lock().engine.dirty_lines() + FLUSH_PASS_MAX;
        let mut written = 0u64;
        let mut n = FLUSH_PASS_FIRST;
        loop {
            let mut g = self.lock();
            let left = g.engine.dirty_lines();
            if g.closed || g.failed || left == 0 || written >= budget {
                break;
            }
            let t = Instant::now();
            match self.clean_pass(&mut g, n) {
                // The damaged line was dropped (see `clean_all`): the next pass goes on.
                Err(e) if data_sums::mismatch(&e).is_some() => {}
                r => r?,
            }
            let now = g.engine.dirty_lines();
            written += left.saturating_sub(now).max(1);
            // Requests queued behind this pass: keep passes near the target; none: grow
            // them (whole chunks for chunk rewrites, fewer plans), as fast as one hold.
            let queued = self.waiting.load(Ordering::Acquire) > 0;
            drop(g);
            let took = t.elapsed();
            if !queued || took < FLUSH_PASS_TARGET / 2 {
                n = (n * 2).min(FLUSH_PASS_MAX);
            } else if took > FLUSH_PASS_TARGET {
                // Straight to the size that takes the target (a grown pass is long).
                let f = FLUSH_PASS_TARGET.as_secs_f64() / took.as_secs_f64();
                n = ((n as f64 * f) as u64).max(1);
            }
            self.let_waiters_in();
        }
        let mut g = self.lock();
        self.clean_all(&mut g)?;
        assert!(
            g.failed || g.engine.dirty_lines() == 0,
            "ctl flush: {} dirty lines left after writing back every line",
            g.engine.dirty_lines()
        );
        self.flush_locked(&mut g)
    }

    /// Changes the write mode; leaving write-back writes back every dirty line first.
    pub fn set_mode(&self, mode: Mode) -> io::Result<()> {
        let mut g = self.lock();
        if g.closed {
            return Err(ioerr("the cache volume is shut down"));
        }
        if g.failed {
            // The engine must keep saying pass-through: that is what is in force.
            return Err(ioerr(
                "the cache device failed: the volume passes through to the backing device (mode pass-through) until restarted with a newly formatted cache (`tiercache format --force`)",
            ));
        }
        if mode != Mode::WriteBack {
            self.clean_all(&mut g)?;
            self.flush_locked(&mut g)?;
        }
        g.engine.set_mode(mode);
        g.sb.mode = mode_index(mode);
        self.write_superblock(&mut g)
    }

    /// Writes back dirty data, then passes everything through (`ctl detach`).
    pub fn detach(&self) -> io::Result<()> {
        self.set_mode(Mode::PassThrough)
    }

    /// Every setting `ctl get` shows ([`tuning::KEYS`] order), with its value now.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        tuning::KEYS
            .iter()
            .map(|&(k, ..)| (k, self.setting_now(k)))
            .collect()
    }

    /// A setting's value now, the rate controller's included.
    fn setting_now(&self, k: &str) -> String {
        let (mode, target, rate) = self.writeback_rate();
        match k {
            "writeback-rate" => match mode {
                tiercache_engine::WritebackRate::Auto => format!("auto ({rate:.0} lines/s now)"),
                m => m.to_string(),
            },
            "writeback-target" => target.to_string(),
            _ => Self::setting(&self.lock(), k),
        }
    }

    /// `ctl set` of a setting of the cleaner ([`tuning::CLEANER_KEYS`]), stored by the
    /// cleaner's setters.
    fn set_unstored(&self, k: &str, value: &str) -> Result<(), String> {
        let (mode, target, _) = self.writeback_rate();
        match k {
            "cleaning" => self.set_cleaning(value.parse()?, None),
            "cleaning-age" => {
                let a = value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("cleaning-age {value:?}: give a number of requests"))?;
                let p = self.lock().engine.config().cleaning;
                self.set_cleaning(p, Some(a))
            }
            "writeback-rate" => self.set_writeback_rate(value.parse()?, target),
            "writeback-target" => {
                let t = value.trim().parse::<f64>().map_err(|_| {
                    format!("writeback-target {value:?}: give a dirty share between 0 and 1")
                })?;
                self.set_writeback_rate(mode, t)
            }
            _ => Err(format!("{k} is not a setting of the cleaner")),
        }
    }

    fn setting(g: &Inner, k: &str) -> String {
        let c = g.engine.config();
        match k {
            "mode" => c.mode.as_str().to_string(),
            "policy" => g.engine.policy_name().to_string(),
            "line-size" => tuning::size_str(c.line_size),
            "cleaning" => c.cleaning.as_str().to_string(),
            "cleaning-age" => c.cleaning_age.to_string(),
            "classes" => match &g.class_table {
                None => {
                    "none (classes by id; --policy dss uses the built-in file-system table)".into()
                }
                Some(t) if g.class_loads == 0 => {
                    format!(
                        "{} from {}",
                        crate::classify::table_summary(t),
                        g.class_source
                    )
                }
                Some(t) => format!(
                    "{} from {} (loaded live, {} time(s))",
                    crate::classify::table_summary(t),
                    g.class_source,
                    g.class_loads
                ),
            },
            _ => Tuning::of(c).get(k).unwrap_or_default(),
        }
    }

    /// `ctl set KEY VALUE`: changes a per-run setting on the running volume (the value
    /// parsed as `tiercache sim` parses the flag of the same name), stores it in the
    /// superblock so a restart keeps it, logs `old -> new`; returns (old, new). Settings fixed
    /// at format or start (line size, policy, SLRU share) are refused with what to do.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String> {
        let k = tuning::key(key)?;
        let (_, what, live) = *tuning::KEYS.iter().find(|x| x.0 == k).expect("known key");
        if k == "classes" {
            return Err(format!(
                "classes is a table, not a value: `tiercache ctl --control SOCK classes load FILE` ({what})"
            ));
        }
        if !live {
            return Err(format!("{k} cannot change on a running volume: {what}"));
        }
        let old = self.setting_now(k);
        if tuning::CLEANER_KEYS.contains(&k) {
            self.set_unstored(k, value)?;
        } else if k == "mode" {
            let m: Mode = value.parse()?;
            self.set_mode(m)
                .map_err(|e| format!("mode {value:?}: {e}"))?;
        } else {
            let mut g = self.lock();
            if g.closed {
                return Err("the cache volume is shut down".into());
            }
            let t = Tuning::of(g.engine.config()).with(k, value)?;
            g.engine
                .retune(|c| t.apply(c))
                .map_err(|e| format!("{k} {value:?}: {e}"))?;
            g.sb.tuning = Some(t);
            if let Err(e) = self.write_superblock(&mut g) {
                tracing::warn!("setting {k}: {old} -> {value} applied but not stored: {e}");
                return Err(format!(
                    "{k} is {value} now, but storing it in the superblock failed ({e}): a restart goes back to {old}"
                ));
            }
        }
        let new = self.setting_now(k);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: tuning::LOG_TARGET, "setting {k}: {old} -> {new}");
        Ok((old, new))
    }

    /// `ctl stats --reset` (as `casadm -Z`): zeroes the engine's counters and the latency
    /// histograms and event counts; fault state (errors, failure, lost data) is kept.
    pub fn reset_stats(&self) {
        self.lock().engine.reset_counters();
        self.metrics.reset();
        tracing::info!(target: tuning::LOG_TARGET, "statistics reset");
    }

    /// Clean shutdown: everything durable, the superblock marked clean. Later calls fail.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut g = self.lock();
        if g.closed {
            return Ok(());
        }
        // Lines unmapped ahead are mapped again: a clean restart keeps them. Every page in
        // flux retires (rewritten without flags).
        for e in g.flux_pages.values_mut() {
            *e = 0;
        }
        let ahead: Vec<u32> = g.ahead.drain().map(|(s, _)| s).collect();
        g.slots = ahead;
        Self::update_records(&mut g);
        self.flush_locked(&mut g)?;
        if g.failed {
            g.closed = true;
            return Ok(());
        }
        g.sb.clean = true;
        self.write_superblock(&mut g)?;
        g.closed = true;
        Ok(())
    }

    // ---- Device faults -------------------------------------------------------------------
    //
    // A cache-device error never reaches the client by itself: the lines concerned are
    // dropped after their dirty bytes are copied to the backing device, and the request is
    // served by the backing device. Dirty bytes that cannot be copied are *lost*: they are
    // logged, listed in `stats().lost_dirty_ranges`, and reads of them fail (never stale
    // data) until they are written again. After `max_cache_errors` errors (or any failure to
    // make the cache durable) the cache is failed: everything that can be written back is,
    // and every request goes to the backing device. A backing-device error fails the one
    // request it happened in.

    /// Cache-device errors after which the cache is failed and bypassed.
    pub fn set_max_cache_errors(&self, n: u64) {
        self.max_cache_errors.store(n.max(1), Ordering::Relaxed);
    }

    /// Whether the cache device has been failed (all requests go to the backing device).
    pub fn cache_failed(&self) -> bool {
        self.lock().failed
    }

    /// Whether a failure of the cache, if any, is durable (state file or superblock erase):
    /// a restart then refuses the cache. `false` only for a failed cache recorded nowhere.
    pub fn failure_recorded(&self) -> bool {
        self.lock().failure_unrecorded.is_none()
    }

    /// Volume byte ranges `[start, end)` whose dirty data was lost with the cache device.
    pub fn lost_dirty_ranges(&self) -> Vec<(u64, u64)> {
        self.lock().lost.clone()
    }

    fn backing_error(&self, e: io::Error) -> io::Error {
        self.metrics.backing_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("backing device error (request failed): {e}");
        io::Error::new(e.kind(), format!("backing device: {e}"))
    }

    /// Counts a cache-device error, fails the cache at the threshold; returns the error for
    /// callers that cannot serve the request otherwise.
    fn cache_error(&self, g: &mut Inner, e: io::Error) -> io::Error {
        if data_sums::mismatch(&e).is_some() {
            // Damaged data, not a failing device: the caller dropped the lines (and `recover`
            // recorded damaged dirty sectors as lost); counted apart, never fails the cache.
            return e;
        }
        g.cache_errors += 1;
        self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
        let max = self.max_cache_errors.load(Ordering::Relaxed);
        tracing::warn!(
            "cache device error {} of {max} before pass-through: {e}",
            g.cache_errors
        );
        if g.cache_errors >= max && !g.failed {
            self.fail_cache(
                g,
                &format!("{} cache device errors, the last: {e}", g.cache_errors),
            );
        }
        io::Error::new(e.kind(), format!("cache device: {e}"))
    }

    /// Fails the cache: writes back every dirty byte it can, drops every line, and passes
    /// every later request through to the backing device. The superblock is erased (best
    /// effort) so the device is not reopened with records that may be stale: it must be
    /// formatted again. The failure is first recorded in the state file, if there is one
    /// ([`OpenOptions::state_path`]). Returns whether the failure is durable (state file or
    /// erasure); until it is, writes fail ([`CacheVolume::record_failure`]).
    fn fail_cache(&self, g: &mut Inner, reason: &str) -> bool {
        tracing::error!(
            "cache device failed after {} errors: writing back dirty data and switching to pass-through",
            g.cache_errors
        );
        let slots: Vec<u32> = g.engine.entries().map(|(_, s, _)| s).collect();
        self.recover(g, &[], 0, 0, &[], &slots);
        // A failed sync reports lost what it may have dropped (the lines are no longer
        // cached: nothing holds their bytes any more), never serves older bytes.
        if let Err(e) = self.sync_backing(g) {
            tracing::error!("backing device sync after the cache failed: {e}");
        }
        g.failed = true;
        g.engine.set_mode(Mode::PassThrough);
        g.dirty_pages.clear();
        let st = FailState {
            uuid: g.sb.uuid,
            failed_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            reason: reason.to_string(),
            lost: g.lost.clone(),
        };
        let recorded = self.record_failure(&st);
        g.failure_unrecorded = (!recorded).then_some(st);
        self.metrics.cache_failed.store(1, Ordering::Relaxed);
        let bytes: u64 = g.lost.iter().map(|(a, b)| b - a).sum();
        if g.lost.is_empty() {
            tracing::error!("cache failed; no dirty data was lost; now in pass-through");
        } else {
            tracing::error!(
                "cache failed; dirty data LOST in {} ranges, {bytes} bytes (reads of them fail until rewritten): {:?}",
                g.lost.len(),
                g.lost
            );
        }
        recorded
    }

    /// Makes a failure of the cache durable: the state file (if any) first, then the
    /// superblock erase. Returns whether at least one of them is durable. A failed cache
    /// whose failure is not durable anywhere could be reopened after a restart with records
    /// older than what passed through to the backing device since; so writes (and trims)
    /// fail with EIO until a retry here succeeds (reads and flushes still pass through: they
    /// acknowledge nothing new). Failing writes is visible and loses nothing acknowledged;
    /// passing them through would let a restart serve stale data over acknowledged writes.
    fn record_failure(&self, st: &FailState) -> bool {
        degrade::record_failure(self.state_path.as_deref(), &*self.cache, st)
    }

    /// A plan failed in its backing-first phase (nothing in the cache changed): rolls the
    /// engine back to `mem` for `slots`; when the failure was a backing write-back, enters
    /// (or stays in) the degraded state. Returns whether the request should be planned again
    /// (dirty evictions were just blocked).
    fn failed_before_cache(
        &self,
        g: &mut Inner,
        steps: &[Step],
        e: &StepError,
        slots: &[u32],
    ) -> bool {
        debug_assert!(e.before_cache);
        self.roll_back(g, slots);
        let write_back = matches!(steps.get(e.index), Some(Step::WriteBack { .. }));
        if e.cache || !write_back {
            return false;
        }
        let was_blocked = g.engine.dirty_evictions_blocked();
        self.enter_degraded(g, &e.err);
        !was_blocked
    }

    /// Puts the engine back for `slots` as their `mem` records say (the state before the plan
    /// that just failed, since nothing in the cache changed): lines the plan placed there are
    /// dropped, lines it evicted or cleaned come back with their masks. A line unmapped ahead
    /// (empty `mem` record, clean) is dropped: the backing device holds its data.
    fn roll_back(&self, g: &mut Inner, slots: &[u32]) {
        let mut slots = slots.to_vec();
        slots.sort_unstable();
        slots.dedup();
        let rb = RECORD_BYTES as usize;
        let mut restore = Vec::new();
        for &s in &slots {
            let at = s as usize * rb;
            let want =
                Record::decode(&g.mem[at..at + rb]).filter(|r| r.key != EMPTY_KEY && r.valid != 0);
            let now = g.engine.slot_key(s);
            if let Some(r) = want {
                if now == Some(r.key)
                    && g.engine.valid_mask(s) == r.valid
                    && g.engine.dirty_mask(s) == r.dirty
                {
                    continue;
                }
                let class = if now == Some(r.key) {
                    g.engine.line_class(s)
                } else {
                    0
                };
                restore.push((s, r, class));
            }
            g.engine.drop_line(s);
        }
        for (s, r, class) in restore {
            // A key moved within the plan (evicted, then cached again elsewhere): that slot
            // was touched too, so it was emptied above.
            if let Err(err) = g.engine.restore_line(r.key, s, r.valid, r.dirty, class) {
                assert!(
                    r.dirty == 0,
                    "rolling back slot {s}: dirty line {:#x} could not be restored: {err}",
                    r.key
                );
                tracing::warn!("rolling back slot {s}: clean line dropped ({err})");
            }
        }
    }

    /// A write-back failed on the backing device: dirty lines stay dirty, dirty evictions
    /// are blocked, the next retry is due after the backoff (doubling up to [`degrade::RETRY_MAX`]).
    fn enter_degraded(&self, g: &mut Inner, e: &io::Error) {
        self.metrics
            .backing_write_errors
            .fetch_add(1, Ordering::Relaxed);
        Degraded::failed(&mut g.degraded, e);
        g.engine.set_dirty_evictions_blocked(true);
        self.metrics.degraded.store(1, Ordering::Relaxed);
    }

    /// Write-backs succeed again: dirty evictions are allowed again.
    fn leave_degraded(&self, g: &mut Inner) {
        if Degraded::healed(&mut g.degraded) {
            g.engine.set_dirty_evictions_blocked(false);
            self.metrics.degraded.store(0, Ordering::Relaxed);
        }
    }

    /// Whether write-backs are failing on the backing device (see [`VolumeStats::degraded`]).
    pub fn degraded(&self) -> bool {
        self.lock().degraded.is_some()
    }

    /// Records `[a, b)` as lost dirty data.
    fn lose(&self, g: &mut Inner, a: u64, b: u64, why: &str) {
        degrade::lose(&mut g.lost, a, b, self.size, why);
        self.metrics
            .lost_dirty_bytes
            .store(degrade::lost_bytes(&g.lost), Ordering::Relaxed);
    }

    /// `[a, b)` was written (or trimmed) again: no longer lost.
    fn unlose(&self, g: &mut Inner, a: u64, b: u64) {
        if degrade::unlose(&mut g.lost, a, b) {
            if let Some(s) = g.sums.as_mut() {
                s.header_dirty = true;
            }
        }
        self.metrics
            .lost_dirty_bytes
            .store(degrade::lost_bytes(&g.lost), Ordering::Relaxed);
    }

    /// After step `failed` of `steps` went wrong (steps before it completed): redoes the
    /// write-backs not done, copies to the backing device the dirty bytes of every line in a
    /// slot an unfinished step touched or in `extra` (from `buf` when an unfinished step was
    /// to put them in the cache and the buffer holds them complete), drops those lines, and
    /// records as lost what could not be copied.
    fn recover(
        &self,
        g: &mut Inner,
        steps: &[Step],
        failed: usize,
        buf_start: u64,
        buf: &[u8],
        extra: &[u32],
    ) {
        let ls = 1u64 << self.line_shift;
        let mut tmp = Vec::new();
        let lost_before = g.lost.clone();
        let rest = steps.get(failed..).unwrap_or(&[]);
        for s in rest {
            if let Step::WriteBack { ssd, hdd, len, .. } = *s {
                tmp.resize(len as usize, 0);
                g.wrote_backing(hdd, hdd + len);
                let exp = Self::expected(g, ssd, len);
                let r = self
                    .read_data(ssd, &mut tmp, exp.as_ref())
                    .and_then(|_| self.backing.write_at(&tmp, hdd));
                if let Err(e) = r {
                    self.lose(g, hdd, hdd + len, &format!("write-back failed: {e}"));
                }
            }
        }
        let mut slots: BTreeSet<u32> = extra.iter().copied().collect();
        for s in rest {
            if let Some((ssd, len)) = ssd_range(s) {
                slots.extend(
                    (ssd >> self.line_shift) as u32..=((ssd + len - 1) >> self.line_shift) as u32,
                );
            }
        }
        // Unfinished steps that were to write the cache from the buffer: (ssd range, buf offset).
        let unfinished: Vec<(u64, u64, Option<u64>)> = rest
            .iter()
            .filter_map(|s| match *s {
                Step::WriteSsd { ssd, buf: b, len } => Some((ssd, ssd + len, Some(b))),
                Step::Populate { ssd, len, .. } => Some((ssd, ssd + len, None)),
                _ => None,
            })
            .collect();
        // Whether every step filling buf[a..b) completed.
        let filled = |a: u64, b: u64| {
            !rest.iter().any(|s| match *s {
                Step::ReadSsd { buf: x, len, .. } | Step::ReadHdd { buf: x, len, .. } => {
                    x < b && a < x + len
                }
                _ => false,
            })
        };
        let ss = g.engine.sector_size();
        for &slot in &slots {
            let Some(key) = g.engine.slot_key(slot) else {
                continue;
            };
            let line_vol = (key & LINE_MASK) << self.line_shift;
            let base = slot as u64 * ls;
            let dirty = g.engine.dirty_mask(slot);
            for k in 0..64u64 {
                if dirty >> k & 1 == 0 || k * ss >= ls {
                    continue;
                }
                let (a, b) = (base + k * ss, base + (k + 1) * ss);
                // Pieces of the sector, split where unfinished steps begin or end.
                let mut cuts = vec![a, b];
                for &(x, y, _) in &unfinished {
                    cuts.extend([x, y].into_iter().filter(|&c| a < c && c < b));
                }
                cuts.sort_unstable();
                cuts.dedup();
                for w in cuts.windows(2) {
                    let (p, q) = (w[0], w[1]);
                    let vol = line_vol + (p - base);
                    let step = unfinished.iter().find(|(x, y, _)| *x <= p && q <= *y);
                    g.wrote_backing(vol, vol + (q - p));
                    let r = match step {
                        // Bytes an unfinished step was to write from the buffer: there, if
                        // every fill of that part of the buffer completed.
                        Some(&(x, _, Some(bo))) => {
                            let at = bo + (p - x);
                            if (at + q - p) as usize <= buf.len()
                                && vol == buf_start + at
                                && filled(at, at + q - p)
                            {
                                self.backing
                                    .write_at(&buf[at as usize..(at + q - p) as usize], vol)
                            } else {
                                Err(io::Error::other("its new bytes never reached the cache"))
                            }
                        }
                        // A population copies the backing device's own bytes.
                        Some((_, _, None)) => Ok(()),
                        None => {
                            tmp.resize((q - p) as usize, 0);
                            // A damaged sector is lost, never copied (`crate::data_sums`).
                            let exp = Self::expected(g, p, q - p);
                            self.read_data(p, &mut tmp, exp.as_ref())
                                .and_then(|_| self.backing.write_at(&tmp, vol))
                        }
                    };
                    if let Err(e) = r {
                        self.lose(
                            g,
                            vol,
                            vol + (q - p),
                            &format!("dirty bytes not saved: {e}"),
                        );
                    }
                }
            }
            g.engine.drop_line(slot);
        }
        let mut v = std::mem::take(&mut g.slots);
        v.clear();
        v.extend(slots);
        g.slots = v;
        Self::update_records(g);
        if g.lost != lost_before && g.sums.is_some() && !g.failed {
            self.persist_lost(g);
        }
    }

    /// Makes `g.lost` durable in the data checksum region's header now (write and sync),
    /// before any record that drops the damaged line can reach the device: after a restart
    /// the ranges still read EIO, never the backing device's older copy.
    fn persist_lost(&self, g: &mut Inner) {
        let lost = g.lost.clone();
        let Some(s) = g.sums.as_mut() else {
            return;
        };
        s.lost = lost;
        let r = s.write_header(&*self.cache).and_then(|_| self.cache.sync());
        if let Err(e) = r {
            s.header_dirty = true;
            tracing::error!(
                "could not record the lost ranges in the data checksum region ({e}): after a restart they may read the backing device's older data"
            );
        }
    }

    /// A plan failed at `e`: recovers the cache's state, then fails the request (backing
    /// error) or serves it from the backing device (cache error).
    #[allow(clippy::too_many_arguments)]
    fn after_failure(
        &self,
        g: &mut Inner,
        req: &Request,
        data: Data<'_>,
        steps: &[Step],
        e: StepError,
        buf_start: u64,
        buf: &[u8],
        touched: &[u32],
    ) -> io::Result<()> {
        let pending = e.pending(steps);
        self.recover(g, &pending, 0, buf_start, buf, touched);
        if !e.cache {
            return Err(self.backing_error(e.err));
        }
        self.cache_error(g, e.err);
        self.direct(g, req, data)
    }

    /// A hit's cache read failed: drops the request's lines (saving their dirty bytes) and
    /// reads from the backing device.
    fn read_fallback(&self, req: &Request, out: &mut [u8], e: io::Error) -> io::Result<()> {
        let mut g = self.lock();
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        if !g.failed {
            let e = self.on_mismatch(&g, e);
            let (first, last) = (
                req.offset >> self.line_shift,
                (req.end() - 1) >> self.line_shift,
            );
            let slots: Vec<u32> = (first..=last)
                .filter_map(|l| g.engine.lookup(Engine::line_key(0, l)))
                .collect();
            self.recover(&mut g, &[], 0, 0, &[], &slots);
            self.cache_error(&mut g, e);
        }
        lost_check(&g.lost, req.offset, req.end())?;
        self.backing
            .read_at(out, req.offset)
            .map_err(|e| self.backing_error(e))
    }

    /// Serves a request from the backing device alone (the cache holds none of its lines).
    fn direct(&self, g: &mut Inner, req: &Request, data: Data<'_>) -> io::Result<()> {
        if g.failed
            && (matches!(data, Data::Write(_)) || req.op == Op::Trim)
            && g.failure_unrecorded.is_some()
        {
            let st = g.failure_unrecorded.take().unwrap();
            if !self.record_failure(&st) {
                g.failure_unrecorded = Some(st);
                return Err(degrade::unrecorded_error(self.state_path.as_deref()));
            }
        }
        match data {
            Data::Read(out) => {
                lost_check(&g.lost, req.offset, req.end())?;
                self.backing
                    .read_at(out, req.offset)
                    .map_err(|e| self.backing_error(e))
            }
            Data::Write(d) => {
                g.wrote_backing(req.offset, req.end());
                self.backing
                    .write_at(d, req.offset)
                    .map_err(|e| self.backing_error(e))?;
                self.unlose(g, req.offset, req.end());
                if req.fua {
                    // Also makes the dropped lines' records durable, so no restart maps
                    // them to older bytes.
                    self.flush_locked(g)?;
                }
                Ok(())
            }
            Data::None if req.op == Op::Flush => self.flush_locked(g),
            Data::None => {
                if req.op == Op::Trim {
                    self.unlose(g, req.offset, req.end());
                }
                Ok(())
            }
        }
    }

    /// Failed cache: everything goes to the backing device.
    fn run_direct(&self, g: &mut Inner, req: &Request, data: Data<'_>) -> io::Result<()> {
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.direct(g, req, data)
    }

    /// Counters, occupancy and device state for `ctl stats` and metrics.
    pub fn stats(&self) -> VolumeStats {
        let g = self.lock();
        // Lock order: the volume lock, then `wb_rate`.
        let (wb_mode, wb_target, _) = self.writeback_rate();
        let e = &g.engine;
        let per_class = (0..tiercache_engine::NUM_CLASSES as u8)
            .filter(|&c| e.class_counters(c).requests > 0)
            .map(|c| (c, *e.class_counters(c)))
            .collect();
        let dirty_bytes = e
            .entries()
            .filter(|x| x.2)
            .map(|(_, s, _)| e.dirty_mask(s).count_ones() as u64 * e.sector_size())
            .sum();
        VolumeStats {
            settings: Settings {
                mode: e.config().mode.as_str().to_string(),
                policy: e.policy_name().to_string(),
                line_size: e.config().line_size,
                tuning: Tuning::of(e.config()),
                cleaning: Some(e.config().cleaning.as_str().to_string()),
                cleaning_age: Some(e.config().cleaning_age),
                writeback_rate: Some(wb_mode.to_string()),
                writeback_target: Some(wb_target),
                changes: self.metrics.settings_changes.load(Ordering::Relaxed),
            },
            mode: e.config().mode.as_str().to_string(),
            policy: e.policy_name().to_string(),
            line_size: 1 << self.line_shift,
            capacity_lines: self.capacity_lines,
            cached_lines: e.len(),
            dirty_lines: e.dirty_lines(),
            dirty_bytes,
            volume_bytes: self.size,
            ram_index_bytes: e.index_bytes() as u64 + (g.mem.len() + g.disk_key.len() * 8) as u64,
            totals: e.counters(),
            per_class,
            unmap_syncs: self.metrics.unmap_syncs.load(Ordering::Relaxed),
            unmap_on_miss: self.metrics.unmap_on_miss.load(Ordering::Relaxed),
            unmap_ahead: self.metrics.unmap_ahead.load(Ordering::Relaxed),
            unmapped_ahead_now: g.ahead.len() as u64,
            flux_syncs: self.metrics.flux_syncs.load(Ordering::Relaxed),
            flux_pages: self.metrics.flux_pages.load(Ordering::Relaxed),
            flux_pages_now: g.flux_pages.len() as u64,
            metadata_pages_written: self.metrics.metadata_pages.load(Ordering::Relaxed),
            classes: crate::classify::class_stats(e, g.class_table.as_deref()),
            class_table: g
                .class_table
                .as_ref()
                .map(|t| crate::classify::ClassTableInfo {
                    name: t.name.clone(),
                    source: g.class_source.clone(),
                    classes: crate::classify::named_classes(t),
                    rules: t.rules.len(),
                    loads: g.class_loads,
                }),
            classifier: self.classifier.as_ref().map(|c| c.summary()),
            cache_errors: self.metrics.cache_errors.load(Ordering::Relaxed),
            checksum_errors: self.metrics.checksum_errors.load(Ordering::Relaxed),
            data_checksums: g.sums.is_some(),
            backing_errors: self.metrics.backing_errors.load(Ordering::Relaxed),
            cache_failed: g.failed,
            lost_dirty_bytes: g.lost.iter().map(|(a, b)| b - a).sum(),
            lost_dirty_ranges: g.lost.clone(),
            degraded: g.degraded.is_some(),
            degraded_reason: g.degraded.as_ref().map(Degraded::reason),
            backing_write_errors: self.metrics.backing_write_errors.load(Ordering::Relaxed),
            backing_sync_errors: self.metrics.backing_sync_errors.load(Ordering::Relaxed),
        }
    }

    /// Every cached line as the engine holds it now, in slot order (tests, diagnostics).
    pub fn lines(&self) -> Vec<LineState> {
        let g = self.lock();
        let e = &g.engine;
        e.entries()
            .map(|(key, slot, _)| LineState {
                key,
                slot,
                valid: e.valid_mask(slot),
                dirty: e.dirty_mask(slot),
            })
            .collect()
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
#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeStats {
    pub settings: Settings,
    pub mode: String,
    pub policy: String,
    pub line_size: u64,
    pub capacity_lines: u64,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    pub dirty_bytes: u64,
    pub volume_bytes: u64,
    pub ram_index_bytes: u64,
    pub totals: Counters,
    pub per_class: Vec<(u8, Counters)>,
    /// Cache syncs made to unmap records (rule 2 of the module doc).
    pub unmap_syncs: u64,
    /// Records unmapped on the miss path (slot being reused) and ahead of evictions.
    pub unmap_on_miss: u64,
    pub unmap_ahead: u64,
    /// Cached clean lines whose record is unmapped ahead now.
    pub unmapped_ahead_now: u64,
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
    /// Data checksum mismatches found (`crate::data_sums`); `data_checksums`: whether the
    /// cache keeps them.
    pub checksum_errors: u64,
    pub data_checksums: bool,
    /// Backing-device errors so far (each one failed its request).
    pub backing_errors: u64,
    /// The cache device was failed: everything passes through to the backing device.
    pub cache_failed: bool,
    /// Dirty data lost with the cache device: byte ranges `[start, end)` of the volume.
    pub lost_dirty_bytes: u64,
    pub lost_dirty_ranges: Vec<(u64, u64)>,
    /// Write-backs are failing on the backing device: dirty lines stay in the cache (only
    /// clean lines are evicted; writes that find none fail) and are retried with backoff.
    pub degraded: bool,
    pub degraded_reason: Option<String>,
    /// Write-backs the backing device failed so far (each kept its lines dirty).
    pub backing_write_errors: u64,
    /// Backing-device syncs that failed (`crate::metrics::Metrics::backing_sync_errors`).
    pub backing_sync_errors: u64,
}

/// Fails with EIO naming the range when `[a, b)` overlaps lost dirty data.
use degrade::lost_check;

enum Data<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    None,
}

/// The write-backs of `steps` to run as one backing write with `steps[first]` (a
/// `WriteBack`), in backing order: later `WriteBack`s (not yet in `done`) continuing the
/// range, each only if no step between `first` and it writes its slot range or touches its
/// backing range, up to [`MAX_MERGED_WRITE`] bytes.
fn merge_write_backs(steps: &[Step], first: usize, done: &[usize]) -> Vec<usize> {
    let mut group = vec![first];
    let (Step::WriteBack { hdd, len, .. } | Step::CopyHdd { hdd, len, .. }) = steps[first] else {
        return group;
    };
    let mut end = hdd + len;
    let overlaps = |a: u64, l: u64, b: u64, m: u64| a < b + m && b < a + l;
    'next: while end - hdd < MAX_MERGED_WRITE {
        for j in first + 1..steps.len() {
            // A chunk rewrite's gap has no slot (length 0 in the cache).
            let (ssd, h, l) = match steps[j] {
                Step::WriteBack { ssd, hdd, len, .. } => (ssd, hdd, len),
                Step::CopyHdd { hdd, len, .. } => (0, hdd, len),
                _ => continue,
            };
            let sl = if matches!(steps[j], Step::CopyHdd { .. }) {
                0
            } else {
                l
            };
            if h != end || done.binary_search(&j).is_ok() || end - hdd + l > MAX_MERGED_WRITE {
                continue;
            }
            let blocked = steps[first + 1..j].iter().any(|s| match *s {
                Step::WriteSsd { ssd: x, len: m, .. } | Step::Populate { ssd: x, len: m, .. }
                    if overlaps(ssd, sl, x, m) =>
                {
                    true
                }
                Step::ReadHdd { hdd: x, len: m, .. }
                | Step::WriteHdd { hdd: x, len: m, .. }
                | Step::Populate { hdd: x, len: m, .. }
                | Step::CopyHdd { hdd: x, len: m, .. }
                | Step::WriteBack { hdd: x, len: m, .. } => overlaps(h, l, x, m),
                _ => false,
            });
            if blocked {
                break 'next;
            }
            group.push(j);
            end += l;
            continue 'next;
        }
        break;
    }
    group
}

/// What a step reads and writes: (resource 0 = cache, 1 = backing, 2 = buffer, start, len,
/// writes).
fn accesses(s: &Step) -> [(u8, u64, u64, bool); 2] {
    const NONE: (u8, u64, u64, bool) = (0, 0, 0, false);
    match *s {
        Step::ReadSsd { ssd, buf, len } => [(0, ssd, len, false), (2, buf, len, true)],
        Step::WriteSsd { ssd, buf, len } => [(0, ssd, len, true), (2, buf, len, false)],
        Step::ReadHdd { hdd, buf, len, .. } => [(1, hdd, len, false), (2, buf, len, true)],
        Step::WriteHdd { hdd, buf, len, .. } => [(1, hdd, len, true), (2, buf, len, false)],
        Step::Populate { hdd, ssd, len, .. } => [(1, hdd, len, false), (0, ssd, len, true)],
        Step::WriteBack { ssd, hdd, len, .. } => [(0, ssd, len, false), (1, hdd, len, true)],
        Step::CopyHdd { hdd, len, .. } => [(1, hdd, len, false), (1, hdd, len, true)],
        // Trims and flushes do nothing in `exec` (the flush runs after the plan).
        _ => [NONE, NONE],
    }
}

/// Whether `a` must run before `b` (they touch an overlapping range of the same device or
/// buffer and one of them writes it).
fn depends(a: &Step, b: &Step) -> bool {
    accesses(a).iter().any(|&(r, x, l, w)| {
        accesses(b)
            .iter()
            .any(|&(q, y, m, v)| l > 0 && m > 0 && r == q && (w || v) && x < y + m && y < x + l)
    })
}

/// Indices of the steps [`CacheVolume::exec`] runs first: those that touch only the backing
/// device (and read the cache or buffer) — write-backs, backing reads and writes — and
/// depend on no earlier step that is not run first. Running them first changes no outcome
/// (each depends on nothing that runs later), and a failure among them leaves the cache
/// device untouched.
fn backing_first(steps: &[Step]) -> Vec<usize> {
    let mut first = Vec::new();
    let mut later: Vec<usize> = Vec::new();
    for (j, s) in steps.iter().enumerate() {
        let backing = matches!(
            s,
            Step::WriteBack { .. }
                | Step::CopyHdd { .. }
                | Step::ReadHdd { .. }
                | Step::WriteHdd { .. }
        );
        if backing && !later.iter().any(|&i| depends(&steps[i], s)) {
            first.push(j);
        } else {
            later.push(j);
        }
    }
    first
}

/// Runs of consecutive numbers in `set`: (first, count).
fn runs(set: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in set {
        match out.last_mut() {
            Some((a, n)) if *a + *n == p => *n += 1,
            _ => out.push((p, 1)),
        }
    }
    out
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

impl Export for CacheVolume {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let req = Request::read(offset, buf.len() as u64);
        self.timed(false, || self.run(&req, Data::Read(buf)))?;
        if let Some(c) = &self.classifier {
            c.observe_read(offset, buf);
            self.relabel(c.take_relabels());
            self.learn_classifier();
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let mut req = Request::write(offset, data.len() as u64);
        req.fua = fua;
        self.timed(true, || self.run(&req, Data::Write(data)))?;
        if let Some(c) = &self.classifier {
            self.relabel(c.take_relabels());
            self.learn_classifier();
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.run(&Request::new(0, Op::Flush, 0, 0), Data::None)
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.run(&Request::new(0, Op::Trim, offset, len), Data::None)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            let last = done + n == len;
            self.write(offset + done, &zeroes[..n as usize], fua && last)?;
            done += n;
        }
        Ok(())
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }
}

/// Classification hooks (issue 7; the classifiers live in `crate::classify`).
impl CacheVolume {
    /// `ctl classes load`: replaces the I/O class table on the running volume, in the engine
    /// (allocation, priorities, partitions: `Engine::set_class_table`), in the classifier
    /// (its rules, its class names) and in the statistics (class names), together under the
    /// volume lock, so every request is planned by one table or the other. Cached lines keep
    /// their class id. `source` says where the table came from (`ctl stats`, `ctl get`).
    /// Checked before anything changes: a table the classifier or the policy cannot take
    /// changes nothing. Per run: not stored (a restart uses `serve`'s `--classes`).
    /// Returns what changed, for the reply and the log.
    pub fn load_classes(
        &self,
        table: ClassTable,
        source: &str,
    ) -> Result<crate::classify::ClassesLoaded, String> {
        let t = Arc::new(table);
        let mut g = self.lock();
        if g.closed {
            return Err("the cache volume is shut down".into());
        }
        if g.failed {
            return Err("the cache device failed (see `ctl stats`): every request passes through, no class table applies".into());
        }
        if let Some(c) = &self.classifier {
            c.check_table(&t)
                .map_err(|e| format!("{source}: {e} (the running classifier is {:?})", c.name()))?;
        }
        g.engine
            .set_class_table(Some(Arc::clone(&t)))
            .map_err(|e| format!("{source}: the running policy cannot take this table: {e}"))?;
        if let Some(c) = &self.classifier {
            c.set_table(Arc::clone(&t));
        }
        let old = g.class_table.replace(Arc::clone(&t));
        g.class_source = source.to_string();
        g.class_loads += 1;
        let r = crate::classify::ClassesLoaded {
            old: old.as_deref().map(crate::classify::table_summary),
            new: crate::classify::table_summary(&t),
            classifier: self.classifier.as_ref().map(|c| c.name()),
            cached_lines: g.engine.len(),
            loads: g.class_loads,
        };
        drop(g);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: tuning::LOG_TARGET,
            "class table: {} -> {} (from {source}; {} cached lines keep their class ids)",
            r.old.as_deref().unwrap_or("none"),
            r.new,
            r.cached_lines
        );
        Ok(r)
    }

    /// Classifies every later request with `c` (before the volume is shared).
    pub fn set_classifier(&mut self, c: Arc<dyn Classifier>) {
        self.classifier = Some(c);
    }

    /// Reads the volume's current contents without touching the cache's state or counters:
    /// the backing device, overlaid with the valid sectors of cached lines. For classifiers
    /// learning an existing file system at start.
    pub fn read_current(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let g = self.lock();
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.read_current_locked(&g, offset, buf)
    }

    /// Lets the classifier learn from the volume's current contents when it asks to (at
    /// start, and when a file system appeared). Locks in the order `run` does: volume, then
    /// device I/O, then the classifier's own lock inside `learn`.
    pub fn learn_classifier(&self) {
        let Some(c) = &self.classifier else {
            return;
        };
        if !c.wants_learn() {
            return;
        }
        {
            let g = self.lock();
            let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
            c.learn(&mut |off, buf| {
                if self.read_current_locked(&g, off, buf).is_err() {
                    buf.fill(0);
                }
            });
        }
        self.relabel(c.take_relabels());
    }

    fn read_current_locked(&self, g: &Inner, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.backing.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = g.engine.sector_size();
        for line in offset >> self.line_shift..=(end - 1) >> self.line_shift {
            let Some(slot) = g.engine.lookup(Engine::line_key(0, line)) else {
                continue;
            };
            let valid = g.engine.valid_mask(slot);
            let base = line << self.line_shift;
            for sec in 0..(self.line_size() / ss) {
                let (a, b) = (base + sec * ss, base + (sec + 1) * ss);
                if valid >> sec & 1 == 0 || b <= offset || a >= end {
                    continue;
                }
                let (a, b) = (a.max(offset), b.min(end));
                let dst = &mut buf[(a - offset) as usize..(b - offset) as usize];
                let ssd = self.data_offset + ((slot as u64) << self.line_shift) + (a - base);
                self.cache.read_at(dst, ssd)?;
            }
        }
        Ok(())
    }

    /// Relabels the cached lines of byte ranges `(offset, len, class)`.
    fn relabel(&self, ranges: Vec<(u64, u64, u8)>) {
        if ranges.is_empty() {
            return;
        }
        let mut g = self.lock();
        let mut n = 0;
        for (off, len, class) in ranges {
            if len == 0 {
                continue;
            }
            let (a, b) = (off >> self.line_shift, (off + len - 1) >> self.line_shift);
            if b - a >= g.engine.len() {
                // A range larger than the cache: walk the cached lines instead.
                let keys: Vec<u64> = g
                    .engine
                    .entries()
                    .map(|(k, _, _)| k)
                    // Volume 0: a key is its line number.
                    .filter(|k| (a..=b).contains(k))
                    .collect();
                for k in keys {
                    n += g.engine.reclassify(k, class) as u64;
                }
            } else {
                for line in a..=b {
                    n += g.engine.reclassify(Engine::line_key(0, line), class) as u64;
                }
            }
        }
        self.metrics
            .relabelled_lines
            .fetch_add(n, Ordering::Relaxed);
    }
}
