//! The log layout (Nitro): extents are compressed, deduplicated and appended to segments
//! (Write-Evict Units) that are filled in RAM, written to the SSD whole, and reclaimed whole.
//!
//! Same contract as the direct [`crate::Engine`]: a [`Request`] in, a [`Plan`] out, no I/O and
//! no clock. Content (a fingerprint and a compressed length per line) comes in beside the
//! request as a slice of [`ExtentContent`], one per line the request touches; an empty slice
//! means "unknown content": every extent is then unique and stored raw, so the hot path of the
//! direct engine and the `Request` type carry nothing for it.
//!
//! **Plan conventions specific to this layout.** Segment writes are `WriteSsd` of a whole
//! segment (`ssd` = segment x segment size, `len` = segment size) whose source is the
//! segment's RAM buffer, not the request buffer (`buf` = 0). `ReadSsd` reads an extent's
//! stored (possibly compressed) bytes. `WriteBack` carries the logical line length (the
//! extent is decompressed in between). Reads of extents still in an open segment are served
//! from RAM and produce no step.
//!
//! **Indices.** The file index maps a line key to a location (segment, generation, offset,
//! stored length); a *base* entry is the one the segment header describes, a *duplicate*
//! entry points at another key's extent. The fingerprint index ([`dedup::FpIndex`]) maps
//! content to a location, bounded by the fingerprint-index ratio. Reclaiming a segment drops
//! its base entries, writes back its dirty extents (including dirty duplicates, kept on a
//! per-segment dirty list) and bumps its generation: duplicate entries that still name the
//! old generation are found stale on access, or by [`LogEngine::clean_stale`].
//!
//! Extent caching (no WEUs) is this layout with segment size = line size: every extent is its
//! own replacement unit in its own SSD slot.

pub mod dedup;
pub mod picker;
pub mod segment;

use crate::classes::{Allocation, ClassTable};
use crate::config::Mode;
use crate::engine::{EngineError, LINE_BITS};
use crate::plan::{Plan, Step};
use crate::request::{Op, Request, MAX_CLASS, NUM_CLASSES};
use crate::stats::DirRequests;
use dedup::{FpIndex, Loc};
use hashbrown::HashMap;
use picker::SegmentPicker;
use segment::{HdrEntry, SegState, Segment};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Default segment size: 2 MiB (an erase block of common MLC flash).
pub const DEFAULT_SEGMENT: u64 = 2 << 20;

/// Extents a segment's header describes at most (the live layout's on-disk header, so the
/// simulator's limit too): twice the lines that fit raw, at least 4.
pub fn header_extents(segment_size: u64, line_size: u64) -> u32 {
    ((2 * segment_size / line_size) as u32).max(4)
}
/// Default [`LogConfig::free_reserve`]: with TRIM, 5 % of the segments are kept free and
/// trimmed ahead of their reuse.
pub const DEFAULT_FREE_RESERVE: f64 = 0.05;
/// Largest [`LogConfig::free_reserve`].
pub const MAX_FREE_RESERVE: f64 = 0.5;

/// Largest segment size.
pub const MAX_SEGMENT: u64 = 64 << 20;
const NONE: u32 = u32::MAX;

/// Which layout a cache uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Fixed slots per line ([`crate::Engine`]).
    #[default]
    Direct,
    /// Compressed, deduplicated extents in segments ([`LogEngine`]).
    Log,
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "direct" => Ok(Layout::Direct),
            "log" | "weu" => Ok(Layout::Log),
            _ => Err(format!("unknown layout '{s}' (expected direct or log)")),
        }
    }
}

/// Extent compression.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd(i32),
}

impl Compression {
    pub fn is_on(self) -> bool {
        self != Compression::None
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

impl FromStr for Compression {
    type Err = String;
    /// `none`, `lz4`, `zstd` (level 3) or `zstd:LEVEL` (1..=22).
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "none" | "off" => return Ok(Compression::None),
            "lz4" => return Ok(Compression::Lz4),
            "zstd" => return Ok(Compression::Zstd(3)),
            _ => {}
        }
        if let Some(l) = t.strip_prefix("zstd:") {
            let l: i32 = l
                .parse()
                .map_err(|_| format!("bad zstd level in '{s}' (expected zstd:1..22)"))?;
            if !(1..=22).contains(&l) {
                return Err(format!("zstd level {l} out of range 1..=22"));
            }
            return Ok(Compression::Zstd(l));
        }
        Err(format!(
            "unknown compression '{s}' (expected none, lz4, zstd or zstd:LEVEL)"
        ))
    }
}

/// What the simulator (or the live server) knows about one line's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExtentContent {
    /// Content fingerprint (equal content, equal fingerprint).
    pub fp: u64,
    /// Bytes the line compresses to with the configured compressor (>= line size: does not
    /// shrink, stored raw).
    pub compressed_len: u32,
}

/// Configuration of the log layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogConfig {
    pub capacity_bytes: u64,
    /// Extent (line) size.
    pub line_size: u64,
    pub segment_size: u64,
    /// Write-through or write-back.
    pub mode: Mode,
    /// A name in [`picker::REGISTRY`].
    pub picker: String,
    /// Fingerprint index size as a share of the cache's extent slots (0 disables dedup).
    pub dedup_ratio: f64,
    pub compression: Compression,
    /// TRIM a segment's SSD range before reusing it.
    pub trim: bool,
    /// With `trim`: share of the segments kept free and trimmed ahead of their reuse (evict
    /// ahead; at least one segment when above 0, at most all but 3). A reclaimed segment
    /// joins a FIFO of free segments and is reused after the others, so the SSD's FTL sees
    /// its TRIM well before the rewrite and its merges in between skip the trimmed pages
    /// (a trim followed at once by a rewrite spares the FTL next to nothing). The reserve
    /// costs its share of the cache's capacity. Without `trim` it is not kept (0 segments):
    /// free segments are then reused last-freed first, so an extent overwrite lands in
    /// place. Default [`DEFAULT_FREE_RESERVE`].
    pub free_reserve: f64,
    /// Reinsert clean extents with at least this many hits when their segment is reclaimed
    /// (0 = off).
    pub reinsert_hits: u16,
    /// Seal a segment when it holds this many extents (0 = unlimited), so an on-disk header
    /// area of fixed size always describes a whole segment.
    pub max_extents_per_segment: u32,
    /// I/O class table (`--classes`): a missed line of a `never` class is not cached (read
    /// from, or written to, the backing device only; counted in `bypassed_lines`), and every
    /// request is counted in its class's counters ([`LogEngine::class_counters`]). A class
    /// that is `always` or `conditional` is cached as without a table: the log layout has no
    /// per-class eviction order (segments are picked by `picker`, priorities and object
    /// sizes do not apply) and refuses partitions ([`check_class_table`]). The class of the
    /// request decides; a cached line remembers the class that cached it for statistics only
    /// ([`ExtentInfo::class`], RAM only), so relabelling it changes nothing else.
    #[serde(skip)]
    pub classes: Option<Arc<ClassTable>>,
}

/// Whether the log layout can run with `t`: partitions (`min_share`/`max_share`) are refused,
/// the log layout has no per-class share of the cache to bound.
pub fn check_class_table(t: &ClassTable) -> Result<(), String> {
    if let Some((id, c)) = t
        .classes
        .iter()
        .enumerate()
        .find(|(_, c)| c.min_share > 0.0 || c.max_share < 1.0)
    {
        return Err(format!(
            "class table {:?}: class {id} ({}) has partition bounds (min_share {}, max_share {}); the log layout has no partitions (it takes `never` classes and counts every class; partitions work on the direct layout)",
            t.name, c.name, c.min_share, c.max_share
        ));
    }
    Ok(())
}

impl LogConfig {
    pub fn new(capacity_bytes: u64, line_size: u64) -> Self {
        LogConfig {
            capacity_bytes,
            line_size,
            segment_size: DEFAULT_SEGMENT,
            mode: Mode::WriteThrough,
            picker: "lru".into(),
            dedup_ratio: 0.0,
            compression: Compression::None,
            trim: false,
            free_reserve: DEFAULT_FREE_RESERVE,
            reinsert_hits: 0,
            max_extents_per_segment: 0,
            classes: None,
        }
    }

    /// Segments in the cache.
    pub fn segments(&self) -> u64 {
        self.capacity_bytes / self.segment_size.max(1)
    }

    /// Segments kept free and trimmed ahead of reuse: `free_reserve` of the segments rounded
    /// up, at most all but 3 (two open, one to reclaim); 0 without `trim`.
    pub fn reserve_segments(&self) -> u64 {
        if !self.trim || self.free_reserve <= 0.0 {
            return 0;
        }
        let n = self.segments();
        ((self.free_reserve * n as f64).ceil() as u64).min(n.saturating_sub(3))
    }

    /// Extent slots the cache has without data reduction (the base of the dedup ratio).
    pub fn extent_slots(&self) -> u64 {
        self.capacity_bytes / self.line_size.max(1)
    }

    pub fn validate(&self) -> Result<(), String> {
        let ls = self.line_size;
        if !ls.is_power_of_two() || !(512..=(1 << 20)).contains(&ls) {
            return Err(format!(
                "line size {ls} must be a power of two in 512 B..1 MiB"
            ));
        }
        let s = self.segment_size;
        if s < ls || s > MAX_SEGMENT || !s.is_multiple_of(ls) {
            return Err(format!(
                "segment size {s} must be a multiple of the line size {ls} and at most 64 MiB"
            ));
        }
        if self.segments() < 3 {
            return Err(format!(
                "cache of {} bytes holds {} segments of {s}; the log needs at least 3",
                self.capacity_bytes,
                self.segments()
            ));
        }
        if self.segments() >= NONE as u64 {
            return Err("too many segments".into());
        }
        if !matches!(self.mode, Mode::WriteThrough | Mode::WriteBack) {
            return Err(format!(
                "the log layout supports write-through and write-back, not {}",
                self.mode
            ));
        }
        if picker::lookup(&self.picker).is_none() {
            return Err(format!(
                "unknown segment picker '{}'; known: {}",
                self.picker,
                picker::REGISTRY
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !(0.0..=1.0).contains(&self.dedup_ratio) {
            return Err(format!(
                "dedup ratio {} must be in 0..=1 (share of extent slots indexed)",
                self.dedup_ratio
            ));
        }
        if !(0.0..=MAX_FREE_RESERVE).contains(&self.free_reserve) {
            return Err(format!(
                "free reserve {} must be in 0..={MAX_FREE_RESERVE} (share of the segments kept free and trimmed ahead)",
                self.free_reserve
            ));
        }
        if self.reinsert_hits > 0 && self.reserve_segments() > 0 {
            return Err(format!(
                "reinsertion (reinsert hits {}) refills a reclaimed segment at once, which a trimmed free reserve cannot do: with trim, set free reserve 0 or reinsert hits 0",
                self.reinsert_hits
            ));
        }
        if let Some(t) = &self.classes {
            check_class_table(t)?;
        }
        Ok(())
    }
}

/// Calls `$m!(every field of LogCounters)`: the one list the field-by-field operations use.
macro_rules! log_counter_fields {
    ($m:ident) => {
        $m!(
            requests,
            reads,
            writes,
            trims,
            flushes,
            read_lines,
            read_line_hits,
            dup_read_hits,
            ram_read_hits,
            write_lines,
            write_line_hits,
            bypassed_lines,
            read_requests,
            write_requests,
            dup_write_lines,
            extents_stored,
            logical_bytes_stored,
            stored_bytes,
            extents_compressed,
            segments_sealed,
            segments_reclaimed,
            extents_evicted,
            dirty_write_backs,
            reinserted,
            stale_entries_dropped,
            ssd_bytes_read,
            ssd_bytes_written,
            ssd_bytes_trimmed,
            hdd_bytes_read,
            hdd_bytes_written
        )
    };
}

/// Counters of the log layout. See [`LogCounters::check`] for how they add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LogCounters {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub flushes: u64,
    pub read_lines: u64,
    /// Read lines served from the cache (file-index hits plus duplicate hits).
    pub read_line_hits: u64,
    /// Read misses in the file index that the fingerprint index served.
    pub dup_read_hits: u64,
    /// Read hits on extents still in an open segment (RAM).
    pub ram_read_hits: u64,
    pub write_lines: u64,
    /// Written lines that were cached before the write (their old extent replaced).
    pub write_line_hits: u64,
    /// Read requests by outcome, as the direct layout counts them ([`DirRequests`]: all,
    /// some or none of the request's lines cached; the log layout admits every missed line,
    /// so it has no pass-through). A request processed in pieces is counted by its first
    /// piece, then again as a whole by [`LogEngine::recount_request`].
    pub read_requests: DirRequests,
    /// Write requests by outcome: whether their lines were cached before the write.
    pub write_requests: DirRequests,
    /// Written lines whose content was already cached: a duplicate entry, no SSD write.
    pub dup_write_lines: u64,
    /// Missed lines not cached because their class is `never` ([`LogConfig::classes`]):
    /// read from, or written to, the backing device only.
    pub bypassed_lines: u64,
    /// Extents appended to segments (misses admitted, unique writes, reinsertions).
    pub extents_stored: u64,
    pub logical_bytes_stored: u64,
    /// Stored bytes of those extents (after compression).
    pub stored_bytes: u64,
    /// Extents stored compressed (the rest did not shrink or compression is off).
    pub extents_compressed: u64,
    pub segments_sealed: u64,
    pub segments_reclaimed: u64,
    /// Base extents still mapped when their segment was reclaimed.
    pub extents_evicted: u64,
    pub dirty_write_backs: u64,
    pub reinserted: u64,
    /// Duplicate file entries found pointing into a reclaimed segment and dropped.
    pub stale_entries_dropped: u64,
    pub ssd_bytes_read: u64,
    pub ssd_bytes_written: u64,
    pub ssd_bytes_trimmed: u64,
    pub hdd_bytes_read: u64,
    pub hdd_bytes_written: u64,
}

impl LogCounters {
    /// `self - before` field by field, saturating (the counters since `before`, e.g. a
    /// statistics reset). Every field is listed: a new counter does not compile until it is
    /// added to [`log_counter_fields`].
    pub fn since(&self, before: &LogCounters) -> LogCounters {
        macro_rules! since {
            ($($f:ident),*) => { LogCounters { $($f: self.$f.saturating_sub(before.$f)),* } };
        }
        log_counter_fields!(since)
    }

    /// Adds `now - before` field by field (what one engine call counted; every field, as the
    /// test `per_class_counters_add_up_to_the_totals` checks).
    fn add_delta(&mut self, now: &LogCounters, before: &LogCounters) {
        let d = now.since(before);
        macro_rules! add {
            ($($f:ident),*) => {{ $( self.$f += &d.$f; )* }};
        }
        log_counter_fields!(add);
    }

    /// Checks that the counters add up (`segment` = segment size).
    pub fn check(&self, segment: u64) -> Result<(), String> {
        let e = |m: String| Err(m);
        if self.requests != self.reads + self.writes + self.trims + self.flushes {
            return e(format!("requests {self:?} do not add up"));
        }
        if self.read_line_hits > self.read_lines
            || self.dup_read_hits + self.ram_read_hits > self.read_line_hits + self.ram_read_hits
            || self.dup_read_hits > self.read_line_hits
        {
            return e(format!("read hits exceed read lines: {self:?}"));
        }
        if self.dup_write_lines > self.write_lines || self.write_line_hits > self.write_lines {
            return e("duplicate writes or write hits exceed written lines".into());
        }
        if self.read_requests.total() != self.reads || self.write_requests.total() != self.writes {
            return e(format!(
                "requests by outcome do not add up to reads and writes: {self:?}"
            ));
        }
        if self.stored_bytes > self.logical_bytes_stored {
            return e("stored more bytes than the extents hold".into());
        }
        if self.ssd_bytes_written != self.segments_sealed * segment {
            return e(format!(
                "SSD bytes written {} != {} segments sealed x {segment}",
                self.ssd_bytes_written, self.segments_sealed
            ));
        }
        if self.segments_reclaimed > self.segments_sealed {
            return e("reclaimed more segments than were sealed".into());
        }
        Ok(())
    }
}

/// A file-index entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    seg: u32,
    gen: u32,
    off: u32,
    len: u32,
    /// Index of the extent's base entry in the segment header.
    hdr: u32,
    dirty: bool,
    dup: bool,
    /// The I/O class of the request that cached the line (RAM only: restored lines are
    /// class 0, as in the direct layout).
    class: u8,
}

/// Data reduction at one moment: see [`LogEngine::reduction`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Reduction {
    /// Lines the cache can serve now.
    pub cached_lines: u64,
    /// Distinct stored extents they reference.
    pub stored_extents: u64,
    pub dedup_ratio: f64,
    /// Raw bytes / stored bytes over those extents.
    pub compression_ratio: f64,
    /// Logical bytes cached / SSD bytes of the segments in use.
    pub effective_capacity: f64,
    /// Bytes appended to segments in use (live or dead).
    pub ssd_bytes_used: u64,
}

/// The lines of one read or write that were cached (`hits`) and not (`misses`); summed over
/// the pieces of a request processed in pieces ([`LogEngine::last_lines`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineTally {
    pub hits: u64,
    pub misses: u64,
    /// Of the misses, those not cached (a `never` class).
    pub bypassed: u64,
}

impl std::ops::AddAssign for LineTally {
    fn add_assign(&mut self, o: LineTally) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.bypassed += o.bypassed;
    }
}

/// The log-layout engine.
pub struct LogEngine {
    cfg: LogConfig,
    line_shift: u32,
    seg_size: u64,
    segs: Vec<Segment>,
    /// Free segments: taken from the back; a freed one goes to the back (reused first)
    /// without a reserve, to the front (reused last, a FIFO) with one.
    free: VecDeque<u32>,
    /// [`LogConfig::reserve_segments`].
    reserve: usize,
    /// Open segment for clean (0) and dirty (1) extents.
    open: [u32; 2],
    file: HashMap<u64, Entry>,
    fps: FpIndex,
    picker: Box<dyn SegmentPicker>,
    /// Dirty duplicate entries per segment (write-back): their keys, written back when the
    /// segment is reclaimed (the header does not describe them).
    dirty_dups: HashMap<u32, Vec<u64>>,
    counters: LogCounters,
    /// Counters per I/O class (what each request counted, in its class; seals and
    /// reclamations of [`LogEngine::reserve`] belong to no request and are in the totals
    /// only).
    class_counters: Vec<LogCounters>,
    /// The class of the request being processed (`process`, `process_more`, `admit`): the
    /// class the entries it makes get.
    last_class: u8,
    /// The line outcome of the last `process` or `process_more` call.
    last: LineTally,
    plan: Plan,
    record: bool,
    tick: u64,
    /// Write counter, to make up unique fingerprints when content is unknown.
    nonce: u64,
    reinsert: Vec<HdrEntry>,
    /// Base extents that stopped being their key's current extent, when tracked
    /// ([`LogEngine::set_track_dead`]).
    dead: Option<Vec<DeadExtent>>,
    /// Live side: read misses without content are not appended; [`LogEngine::admit`] appends
    /// them once the executor has read their bytes.
    deferred_fill: bool,
}

/// A base extent that stopped being its key's current extent (see
/// [`LogEngine::set_track_dead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadExtent {
    pub seg: u32,
    /// The segment's generation when the extent died (an older one than the segment's
    /// current generation means the segment was reclaimed since).
    pub gen: u32,
    pub off: u32,
}

/// Where a line's current extent is: see [`LogEngine::locate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentInfo {
    pub seg: u32,
    pub gen: u32,
    /// Byte offset in the segment and stored length.
    pub off: u32,
    pub len: u32,
    /// Stored compressed (shorter than a line).
    pub compressed: bool,
    pub dirty: bool,
    /// A duplicate entry (points at another key's extent).
    pub dup: bool,
    /// The segment is open (its bytes are in RAM, not yet on the SSD).
    pub open: bool,
    /// The I/O class of the request that cached the line (0 after a restart).
    pub class: u8,
}

/// A segment as recovered by an executor, for [`LogEngine::restore`].
#[derive(Clone, Debug, Default)]
pub struct RestoredSegment {
    pub gen: u32,
    /// Sealed (on the SSD) or free.
    pub sealed: bool,
    /// Its extents in offset order (live or not: duplicates may point at dead ones).
    pub hdr: Vec<HdrEntry>,
}

/// A file-index entry as recovered, for [`LogEngine::restore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoredEntry {
    pub key: u64,
    pub seg: u32,
    pub off: u32,
    pub dirty: bool,
    /// A duplicate entry; otherwise the extent's base entry (its header names `key`).
    pub dup: bool,
}

#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl LogEngine {
    pub fn new(cfg: LogConfig) -> Result<Self, EngineError> {
        cfg.validate().map_err(EngineError::Config)?;
        let n = cfg.segments() as u32;
        let fp_cap = (cfg.extent_slots() as f64 * cfg.dedup_ratio).round() as usize;
        let picker = (picker::lookup(&cfg.picker).expect("validated").make)(n);
        Ok(LogEngine {
            line_shift: cfg.line_size.trailing_zeros(),
            seg_size: cfg.segment_size,
            segs: (0..n).map(|_| Segment::new()).collect(),
            free: (0..n).rev().collect(),
            reserve: cfg.reserve_segments() as usize,
            open: [NONE; 2],
            file: HashMap::new(),
            fps: FpIndex::new(fp_cap),
            picker,
            dirty_dups: HashMap::new(),
            counters: LogCounters::default(),
            class_counters: vec![LogCounters::default(); NUM_CLASSES],
            last_class: 0,
            last: LineTally::default(),
            plan: Plan::default(),
            record: true,
            tick: 0,
            nonce: 0,
            reinsert: Vec::new(),
            dead: None,
            deferred_fill: false,
            cfg,
        })
    }

    /// Live side: from now on, every base extent that stops being its key's current extent
    /// (overwritten, trimmed, forgotten, replaced during `restore`, evicted by a reclamation)
    /// is logged for [`LogEngine::take_dead`], so the executor can keep its segment headers'
    /// live flags without looking every extent up again. Off: the log is dropped.
    pub fn set_track_dead(&mut self, on: bool) {
        self.dead = on.then(Vec::new);
    }

    /// Moves the extents logged dead since the last call (oldest first) to the end of `out`.
    pub fn take_dead(&mut self, out: &mut Vec<DeadExtent>) {
        if let Some(d) = self.dead.as_mut() {
            out.append(d);
        }
    }

    fn log_dead(&mut self, seg: u32, gen: u32, off: u32) {
        if let Some(d) = self.dead.as_mut() {
            d.push(DeadExtent { seg, gen, off });
        }
    }

    /// Live side: read misses are planned (`ReadHdd`) but not appended until
    /// [`LogEngine::admit`] brings their content. Only requests without content are affected.
    pub fn set_deferred_fill(&mut self, on: bool) {
        self.deferred_fill = on;
    }

    /// The key of a volume's line (as [`RestoredEntry::key`] and headers carry it).
    pub fn line_key(volume: u32, line: u64) -> u64 {
        Self::key(volume, line)
    }

    /// Volume and line number of a key.
    pub fn key_line(key: u64) -> (u32, u64) {
        ((key >> LINE_BITS) as u32, key & ((1 << LINE_BITS) - 1))
    }

    /// Where `volume`'s `line` is cached now, if it is (stale duplicates read as absent).
    pub fn locate(&self, volume: u32, line: u64) -> Option<ExtentInfo> {
        let e = *self.file.get(&Self::key(volume, line))?;
        let s = &self.segs[e.seg as usize];
        if s.gen != e.gen {
            return None;
        }
        let compressed = s
            .hdr
            .get(e.hdr as usize)
            .is_some_and(|h| h.compressed && h.off == e.off);
        Some(ExtentInfo {
            seg: e.seg,
            gen: e.gen,
            off: e.off,
            len: e.len,
            compressed,
            dirty: e.dirty,
            dup: e.dup,
            open: s.state == SegState::Open,
            class: e.class,
        })
    }

    /// Every current file-index entry (key, extent), in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, ExtentInfo)> + '_ {
        self.file.iter().filter_map(|(&k, _)| {
            let (v, l) = Self::key_line(k);
            self.locate(v, l).map(|i| (k, i))
        })
    }

    /// The location the fingerprint index gives `fp`, if current (no LRU update).
    pub fn probe_fp(&self, fp: u64) -> Option<Loc> {
        let segs = &self.segs;
        self.fps
            .peek(fp)
            .filter(|l| segs[l.seg as usize].gen == l.gen)
    }

    /// Forgets `fp` (the executor found that the indexed extent's full digest differs: the
    /// next write of this content is stored as unique).
    pub fn drop_fp(&mut self, fp: u64) {
        self.fps.remove(fp);
    }

    /// Drops a line's entry, as a trim would, without a plan (the executor made sure nothing
    /// is lost: a clean line, or a dirty one it wrote back).
    pub fn forget(&mut self, volume: u32, line: u64) {
        let key = Self::key(volume, line);
        if let Some(e) = self.current(key) {
            self.drop_entry(key, e);
        }
    }

    /// The open segment of the clean (`dirty` false) or dirty stream, if any.
    pub fn open_segment(&self, dirty: bool) -> Option<u32> {
        let o = self.open[dirty as usize];
        (o != NONE).then_some(o)
    }

    /// Whether the stream's open segment has no room for one more extent of up to a line:
    /// the next [`LogEngine::reserve`] seals it. Changes nothing.
    pub fn open_full(&self, dirty: bool) -> bool {
        let o = self.open[dirty as usize];
        o != NONE && {
            let s = &self.segs[o as usize];
            s.used as u64 + self.cfg.line_size > self.seg_size
                || (self.cfg.max_extents_per_segment > 0
                    && s.hdr.len() as u32 >= self.cfg.max_extents_per_segment)
        }
    }

    /// Whether the next [`LogEngine::reserve`] of the stream changes segments (seals its
    /// open segment, or opens one, maybe reclaiming a victim): an executor that must do
    /// something first (sync the backing device) asks before anything changed.
    pub fn reserve_acts(&self, dirty: bool) -> bool {
        self.open[dirty as usize] == NONE || self.open_full(dirty)
    }

    /// Live side: makes room for one more extent of up to a line in the open segment of the
    /// clean (`dirty` false) or dirty stream, sealing it and reclaiming a victim if needed.
    /// The plan holds the seal's `WriteSsd`, the victim's `WriteBack`s and `TrimSsd`. A later
    /// `process`/`admit` of one line then neither seals a full segment nor reclaims. This
    /// path reclaims one victim at a time; the live executor keeps the trimmed free reserve
    /// with [`LogEngine::evict_ahead_victim`] / [`LogEngine::evict_ahead_one`] afterwards.
    pub fn reserve(&mut self, dirty: bool) -> &Plan {
        let v = self.reserve_begin(dirty);
        self.reserve_end(dirty, v)
    }

    /// Live side, first half of [`LogEngine::reserve`]: seals the stream's open segment if it
    /// is full (the plan holds the `WriteSsd`) and, when a segment must be reclaimed to open
    /// another, returns the picker's victim. The executor may then write its dirty extents
    /// back first ([`LogEngine::reclaim_write_backs`]) or, when the backing device fails,
    /// choose another victim ([`LogEngine::clean_victim`]), and calls
    /// [`LogEngine::reserve_end`].
    pub fn reserve_begin(&mut self, dirty: bool) -> Option<u32> {
        self.plan.reset(0, 0);
        let stream = dirty as usize;
        let o = self.open[stream];
        let full = self.open_full(dirty);
        if full {
            self.seal(o);
            self.open[stream] = NONE;
        }
        if self.open[stream] != NONE || !self.free.is_empty() {
            return None;
        }
        Some(
            self.picker
                .victim(&self.segs, self.tick)
                .expect("a sealed segment exists: at least 3 segments and 2 open"),
        )
    }

    /// Live side, second half of [`LogEngine::reserve`]: opens a segment for the stream if
    /// it has none, a free one or `victim` reclaimed (a sealed segment). Without a free
    /// segment and with `victim` `None` the stream stays without an open segment (no room:
    /// the executor fails the request; the plan still holds the seal to execute).
    pub fn reserve_end(&mut self, dirty: bool, victim: Option<u32>) -> &Plan {
        let stream = dirty as usize;
        if self.open[stream] == NONE {
            if let Some(s) = self.free.pop_back() {
                self.segs[s as usize].state = SegState::Open;
                self.open[stream] = s;
            } else if let Some(v) = victim {
                assert_eq!(
                    self.segs[v as usize].state,
                    SegState::Sealed,
                    "reclaiming segment {v}: not sealed"
                );
                self.reclaim(v, stream == 0 && self.cfg.reinsert_hits > 0);
                self.open[stream] = v;
            }
        }
        &self.plan
    }

    /// Live side: changes the reclamation settings ([`LogConfig::trim`],
    /// [`LogConfig::free_reserve`], [`LogConfig::reinsert_hits`]) of a running engine,
    /// validated as at construction (nothing changes on an error). A larger free reserve is
    /// filled by the executor's next [`LogEngine::evict_ahead_victim`] /
    /// [`LogEngine::evict_ahead_one`] rounds; a smaller one leaves the free segments free.
    pub fn set_reclaim(
        &mut self,
        trim: bool,
        free_reserve: f64,
        reinsert_hits: u16,
    ) -> Result<(), EngineError> {
        let mut c = self.cfg.clone();
        c.trim = trim;
        c.free_reserve = free_reserve;
        c.reinsert_hits = reinsert_hits;
        c.validate().map_err(EngineError::Config)?;
        self.reserve = c.reserve_segments() as usize;
        self.cfg = c;
        Ok(())
    }

    /// Live side of the trimmed free reserve: the sealed segment to reclaim ahead while
    /// fewer than the reserve's segments are free (the picker's victim), else `None`. The
    /// executor writes its dirty extents back first ([`LogEngine::reclaim_write_backs`]),
    /// then calls [`LogEngine::evict_ahead_one`]. After a live `reserve` that opened a
    /// segment, rounds until `None` leave the engine as the simulator's allocation does
    /// (it evicts ahead to reserve + 1 free segments, then takes one).
    pub fn evict_ahead_victim(&mut self) -> Option<u32> {
        if self.free.len() >= self.reserve {
            return None;
        }
        self.picker.victim(&self.segs, self.tick)
    }

    /// Live side: reclaims sealed segment `v` ahead (its dirty extents written back, its
    /// clean ones evicted, never reinserted) and frees it, trimmed: the plan holds its
    /// `WriteBack`s and, with [`LogConfig::trim`], its `TrimSsd`.
    pub fn evict_ahead_one(&mut self, v: u32) -> &Plan {
        self.plan.reset(0, 0);
        assert_eq!(
            self.segs[v as usize].state,
            SegState::Sealed,
            "evicting segment {v} ahead: not sealed"
        );
        self.reclaim(v, false);
        self.release(v);
        &self.plan
    }

    /// The clean extents reclaiming sealed segment `v` for the clean stream would reinsert
    /// now ([`LogConfig::reinsert_hits`]): (key, offset, stored length), in the order the
    /// reclamation puts them back. Changes nothing. The executor reads their bytes before
    /// [`LogEngine::reserve_end`] reclaims `v` (and may [`LogEngine::forget`] one whose bytes
    /// do not verify: it is then evicted, not reinserted).
    pub fn reinsert_candidates(&self, v: u32, dirty: bool) -> Vec<(u64, u32, u32)> {
        if dirty || self.cfg.reinsert_hits == 0 {
            return Vec::new();
        }
        let gen = self.segs[v as usize].gen;
        let (mut used, mut n) = (0u32, 0u32);
        self.segs[v as usize]
            .hdr
            .iter()
            .filter(|h| {
                self.file.get(&h.key).is_some_and(|e| {
                    e.seg == v && e.gen == gen && !e.dup && e.off == h.off && !e.dirty
                }) && h.hits >= self.cfg.reinsert_hits
            })
            .filter(|h| {
                let fits = self.reinsert_fits(used, n, h.len);
                if fits {
                    used += h.len;
                    n += 1;
                }
                fits
            })
            .map(|h| (h.key, h.off, h.len))
            .collect()
    }

    /// Whether a reinserted extent of `len` stored bytes fits a reclaimed segment already
    /// refilled with `used` bytes in `n` extents, leaving room (bytes and an extent slot)
    /// for the line whose reservation reclaimed it: reinsertion never fills the segment it
    /// refills (it would have to be sealed before the new line, which overflowed it).
    fn reinsert_fits(&self, used: u32, n: u32, len: u32) -> bool {
        let max = self.cfg.max_extents_per_segment;
        used as u64 + len as u64 + self.cfg.line_size <= self.seg_size && (max == 0 || n + 1 < max)
    }

    /// The `WriteBack` steps reclaiming sealed segment `v` would plan now (its dirty base
    /// extents and dirty duplicates of them), without changing anything.
    pub fn reclaim_write_backs(&self, v: u32) -> Vec<Step> {
        let gen = self.segs[v as usize].gen;
        let mut out = Vec::new();
        let mut wb = |key: u64, e: &Entry| {
            let (vol, hdd) = self.home(key);
            out.push(Step::WriteBack {
                vol,
                ssd: self.ssd_addr(v, e.off),
                hdd,
                len: self.cfg.line_size,
            });
        };
        for h in &self.segs[v as usize].hdr {
            if let Some(e) = self.file.get(&h.key) {
                if e.seg == v && e.gen == gen && !e.dup && e.off == h.off && e.dirty {
                    wb(h.key, e);
                }
            }
        }
        // As the reclamation: each key once (it removes a key's entry when it writes the key
        // back; a key may be listed twice, or have become a base extent of `v` since).
        let mut seen = std::collections::HashSet::new();
        for k in self.dirty_dups.get(&v).into_iter().flatten() {
            if let Some(e) = self.file.get(k) {
                if e.dup && e.seg == v && e.gen == gen && e.dirty && seen.insert(*k) {
                    wb(*k, e);
                }
            }
        }
        out
    }

    /// A sealed segment whose reclamation writes nothing back (no dirty data), the one with
    /// the fewest live bytes (ties: lowest number); `None` when every sealed segment holds
    /// dirty data. What the executor reclaims instead while the backing device fails.
    pub fn clean_victim(&self) -> Option<u32> {
        (0..self.segs.len() as u32)
            .filter(|&s| self.segs[s as usize].state == SegState::Sealed)
            .filter(|&s| self.reclaim_write_backs(s).is_empty())
            .min_by_key(|&s| (self.segs[s as usize].live, s))
    }

    /// Live side: caches a read-missed line (planned earlier with deferred fill) now that its
    /// content is known: a duplicate entry when the fingerprint index has it, otherwise a new
    /// clean extent. Returns the plan (seals and reclamations this caused). Counted in
    /// `class`, the class of the read; a line of a `never` class is not cached
    /// ([`LogEngine::caches_class`]: the executor asks first, to make no room for it).
    pub fn admit(&mut self, volume: u32, line: u64, class: u8, c: ExtentContent) -> &Plan {
        let key = Self::key(volume, line);
        self.plan.reset(line << self.line_shift, self.cfg.line_size);
        if self.current(key).is_some() || !self.caches_class(class) || class > MAX_CLASS {
            return &self.plan;
        }
        self.last_class = class;
        let before = self.counters;
        if let Some(loc) = self.dedup_lookup(c.fp) {
            self.dup_entry(key, loc, false);
        } else {
            self.append(key, Some(c), false);
        }
        let ci = self.last_class as usize;
        self.class_counters[ci].add_delta(&self.counters, &before);
        &self.plan
    }

    /// Relabels `volume`'s cached `line` as `class` (a classifier learned better; statistics
    /// only). Whether the line is cached (and its class changed).
    pub fn reclassify(&mut self, volume: u32, line: u64, class: u8) -> bool {
        let key = Self::key(volume, line);
        if self.current(key).is_none() || class > MAX_CLASS {
            return false;
        }
        match self.file.get_mut(&key) {
            Some(e) if e.class != class => {
                e.class = class;
                true
            }
            _ => false,
        }
    }

    /// Whether missed lines of `class` are cached (not a `never` class of the table).
    pub fn caches_class(&self, class: u8) -> bool {
        self.cfg
            .classes
            .as_ref()
            .is_none_or(|t| class > MAX_CLASS || t.class(class).allocation != Allocation::Never)
    }

    /// Counters of one I/O class: what the requests of that class counted (see
    /// [`LogConfig::classes`]).
    pub fn class_counters(&self, class: u8) -> &LogCounters {
        &self.class_counters[class.min(MAX_CLASS) as usize]
    }

    /// Replaces the I/O class table on a running engine (`ctl classes load`): from the next
    /// request on, `never` classes are not cached. Cached lines stay (they carry no class).
    /// Refused, changing nothing, when the log layout cannot take the table
    /// ([`check_class_table`]).
    pub fn set_class_table(&mut self, t: Option<Arc<ClassTable>>) -> Result<(), EngineError> {
        if let Some(t) = &t {
            check_class_table(t).map_err(EngineError::Config)?;
        }
        self.cfg.classes = t;
        Ok(())
    }

    /// Rebuilds the indices from recovered segments and entries (the engine must be new).
    /// Sealed segments go to the picker in the order given; entries whose extent is not in
    /// a header are skipped and counted in the result.
    pub fn restore(
        &mut self,
        segs: Vec<RestoredSegment>,
        entries: &[RestoredEntry],
    ) -> Result<usize, EngineError> {
        if segs.len() != self.segs.len() {
            return Err(EngineError::Config(format!(
                "restore: {} segments for a log of {}",
                segs.len(),
                self.segs.len()
            )));
        }
        self.free.clear();
        for (i, r) in segs.into_iter().enumerate() {
            let s = &mut self.segs[i];
            s.gen = r.gen;
            s.hdr = r.hdr;
            s.used = s.hdr.iter().map(|h| h.len).sum();
            s.live = 0;
            if s.used as u64 > self.seg_size {
                return Err(EngineError::Config(format!(
                    "restore: segment {i} holds more than a segment"
                )));
            }
            if r.sealed {
                s.state = SegState::Sealed;
                self.picker.sealed(i as u32, 0);
                // Counted as sealed (and written) here, so reclaims never outnumber seals.
                self.counters.segments_sealed += 1;
                self.counters.ssd_bytes_written += self.seg_size;
            } else {
                s.hdr.clear();
                s.used = 0;
                s.state = SegState::Free;
            }
        }
        for i in (0..self.segs.len() as u32).rev() {
            if self.segs[i as usize].state == SegState::Free {
                self.free.push_back(i);
            }
        }
        for s in 0..self.segs.len() {
            let gen = self.segs[s].gen;
            for h in self.segs[s].hdr.clone() {
                self.fps.insert(
                    h.fp,
                    Loc {
                        seg: s as u32,
                        gen,
                        off: h.off,
                        len: h.len,
                    },
                );
            }
        }
        let mut skipped = 0;
        for r in entries {
            let Some(s) = self.segs.get_mut(r.seg as usize) else {
                skipped += 1;
                continue;
            };
            let Some(hi) = s.hdr.iter().position(|h| h.off == r.off) else {
                skipped += 1;
                continue;
            };
            let h = &mut s.hdr[hi];
            if !r.dup && h.key != r.key {
                skipped += 1;
                continue;
            }
            if !r.dup {
                s.live += h.len;
                h.dirty = r.dirty;
            }
            let e = Entry {
                seg: r.seg,
                gen: s.gen,
                off: r.off,
                len: h.len,
                hdr: hi as u32,
                dirty: r.dirty,
                dup: r.dup,
                class: 0,
            };
            if let Some(old) = self.file.insert(r.key, e) {
                if !old.dup {
                    self.segs[old.seg as usize].live -= old.len;
                    self.log_dead(old.seg, old.gen, old.off);
                }
            }
            if r.dup && r.dirty {
                self.dirty_dups.entry(r.seg).or_default().push(r.key);
            }
        }
        Ok(skipped)
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// Live side (`ctl mode`): later writes are dirty (write-back) or written through. The
    /// caller writes back the dirty lines before leaving write-back; nothing else changes.
    pub fn set_mode(&mut self, mode: Mode) -> Result<(), EngineError> {
        if !matches!(mode, Mode::WriteThrough | Mode::WriteBack) {
            return Err(EngineError::Config(format!(
                "the log layout runs write-through or write-back, not {mode}"
            )));
        }
        self.cfg.mode = mode;
        Ok(())
    }

    pub fn counters(&self) -> &LogCounters {
        &self.counters
    }

    /// Whether plans are recorded (default on). Counters stay exact either way.
    pub fn set_record_plan(&mut self, on: bool) {
        self.record = on;
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    pub fn fingerprint_index(&self) -> &FpIndex {
        &self.fps
    }

    /// Heap bytes of all indices: file index, fingerprint index, segment headers in RAM and
    /// the picker.
    pub fn index_bytes(&self) -> usize {
        self.file.capacity() * (std::mem::size_of::<(u64, Entry)>() + 1)
            + self.fps.mem_bytes()
            + self
                .segs
                .iter()
                .map(|s| {
                    std::mem::size_of::<Segment>()
                        + s.hdr.capacity() * std::mem::size_of::<HdrEntry>()
                })
                .sum::<usize>()
            + self.picker.mem_bytes()
    }

    #[inline]
    fn emit(&mut self, s: Step) {
        if self.record {
            self.plan.push(s);
        }
    }

    #[inline]
    fn key(volume: u32, line: u64) -> u64 {
        ((volume as u64) << LINE_BITS) | line
    }

    /// Volume and byte offset of a key's line.
    #[inline]
    fn home(&self, key: u64) -> (u32, u64) {
        (
            (key >> LINE_BITS) as u32,
            (key & ((1 << LINE_BITS) - 1)) << self.line_shift,
        )
    }

    fn ssd_addr(&self, seg: u32, off: u32) -> u64 {
        seg as u64 * self.seg_size + off as u64
    }

    /// The entry for `key` if it is still current (a stale duplicate is dropped).
    fn current(&mut self, key: u64) -> Option<Entry> {
        let e = *self.file.get(&key)?;
        if self.segs[e.seg as usize].gen == e.gen {
            return Some(e);
        }
        self.file.remove(&key);
        self.counters.stale_entries_dropped += 1;
        None
    }

    /// Processes one request. `content` has one entry per line the request touches, in
    /// order, or is empty (content unknown: no dedup, no compression).
    pub fn process(
        &mut self,
        req: &Request,
        content: &[ExtentContent],
    ) -> Result<&Plan, EngineError> {
        self.process_counted(req, content, true)
    }

    /// The lines of the last [`LogEngine::process`] or [`LogEngine::process_more`] call that
    /// hit and missed (a caller cutting a request into pieces sums them for
    /// [`LogEngine::recount_request`]).
    pub fn last_lines(&self) -> LineTally {
        self.last
    }

    /// A read or write processed in pieces: `process` counted its outcome from its first
    /// piece (`first`); it is counted again from all its pieces (`whole`), with the same
    /// definitions ([`DirRequests`]), in its I/O class `class`. Counts stay adding up to the
    /// reads and writes.
    pub fn recount_request(&mut self, op: Op, class: u8, first: LineTally, whole: LineTally) {
        let ci = class.min(MAX_CLASS) as usize;
        for c in [&mut self.counters, &mut self.class_counters[ci]] {
            let d = match op {
                Op::Read => &mut c.read_requests,
                Op::Write => &mut c.write_requests,
                Op::Trim | Op::Flush => return,
            };
            d.uncount(first.hits, first.misses, first.bypassed);
            d.count(whole.hits, whole.misses, whole.bypassed);
        }
    }

    /// Live side: [`LogEngine::process`] of one more piece (a line) of the request whose
    /// first piece went to `process`: its lines and bytes are counted, the request is not
    /// (`requests`, `reads`, `writes` count client requests however they are cut up).
    pub fn process_more(
        &mut self,
        req: &Request,
        content: &[ExtentContent],
    ) -> Result<&Plan, EngineError> {
        self.process_counted(req, content, false)
    }

    fn process_counted(
        &mut self,
        req: &Request,
        content: &[ExtentContent],
        count: bool,
    ) -> Result<&Plan, EngineError> {
        if req.volume > crate::engine::MAX_VOLUME {
            return Err(EngineError::BadVolume(req.volume));
        }
        if req.class > MAX_CLASS {
            return Err(EngineError::BadClass(req.class));
        }
        if req.end() >> self.line_shift >= 1 << LINE_BITS
            || req.offset.checked_add(req.len).is_none()
        {
            return Err(EngineError::OutOfRange {
                offset: req.offset,
                len: req.len,
            });
        }
        let ls = self.cfg.line_size;
        let (first, last) = if req.len > 0 {
            (
                req.offset >> self.line_shift,
                (req.end() - 1) >> self.line_shift,
            )
        } else {
            (1, 0)
        };
        let buf_start = first << self.line_shift;
        let nlines = if req.len > 0 { last - first + 1 } else { 0 };
        if !content.is_empty()
            && content.len() as u64 != nlines
            && matches!(req.op, Op::Read | Op::Write)
        {
            return Err(EngineError::Config(format!(
                "request at offset {} length {} touches {nlines} lines but carries content for {}",
                req.offset,
                req.len,
                content.len()
            )));
        }
        self.plan.reset(buf_start, nlines * ls);
        let before = self.counters;
        self.last_class = req.class;
        let caches = self.caches_class(req.class);
        self.tick += 1;
        self.counters.requests += count as u64;
        self.last = LineTally::default();
        let wb = self.cfg.mode == Mode::WriteBack;
        match req.op {
            Op::Read => {
                self.counters.reads += count as u64;
                for (i, line) in (first..=last).enumerate().take(nlines as usize) {
                    let key = Self::key(req.volume, line);
                    let buf = line << self.line_shift;
                    self.counters.read_lines += 1;
                    if let Some(e) = self.current(key) {
                        self.last.hits += 1;
                        self.serve(e, buf);
                        continue;
                    }
                    let c = content.get(i).copied();
                    if let Some(c) = c {
                        if let Some(loc) = self.dedup_lookup(c.fp) {
                            self.counters.dup_read_hits += 1;
                            self.last.hits += 1;
                            let e = self.dup_entry(key, loc, false);
                            self.serve(e, buf);
                            continue;
                        }
                    }
                    self.last.misses += 1;
                    let (vol, hdd) = self.home(key);
                    let buf = buf - buf_start;
                    self.emit(Step::ReadHdd {
                        vol,
                        hdd,
                        buf,
                        len: ls,
                    });
                    self.counters.hdd_bytes_read += ls;
                    if !caches {
                        self.last.bypassed += 1;
                        self.counters.bypassed_lines += 1;
                        continue;
                    }
                    if c.is_none() && self.deferred_fill {
                        continue;
                    }
                    self.append(key, c, false);
                }
                if count {
                    let t = self.last;
                    self.counters
                        .read_requests
                        .count(t.hits, t.misses, t.bypassed);
                }
            }
            Op::Write => {
                self.counters.writes += count as u64;
                if !wb || req.fua {
                    self.emit(Step::WriteHdd {
                        vol: req.volume,
                        hdd: req.offset,
                        buf: req.offset - buf_start,
                        len: req.len,
                    });
                    self.counters.hdd_bytes_written += req.len;
                }
                let dirty = wb && !req.fua;
                for (i, line) in (first..=last).enumerate().take(nlines as usize) {
                    let key = Self::key(req.volume, line);
                    let ls_start = line << self.line_shift;
                    self.counters.write_lines += 1;
                    let partial = req.offset > ls_start || req.end() < ls_start + ls;
                    let old = self.current(key);
                    if old.is_some() {
                        self.last.hits += 1;
                        self.counters.write_line_hits += 1;
                    } else {
                        self.last.misses += 1;
                        if !caches {
                            // Not cached: the client's bytes go to the backing device only
                            // (already planned above unless write-back).
                            self.last.bypassed += 1;
                            self.counters.bypassed_lines += 1;
                            if dirty {
                                let a = req.offset.max(ls_start);
                                let b = req.end().min(ls_start + ls);
                                self.emit(Step::WriteHdd {
                                    vol: req.volume,
                                    hdd: a,
                                    buf: a - buf_start,
                                    len: b - a,
                                });
                                self.counters.hdd_bytes_written += b - a;
                            }
                            continue;
                        }
                    }
                    if partial {
                        // The rest of the line must come from somewhere: the cached extent
                        // or the disk.
                        match old {
                            Some(e) => self.serve_quiet(e, ls_start),
                            None => {
                                let (vol, hdd) = self.home(key);
                                self.emit(Step::ReadHdd {
                                    vol,
                                    hdd,
                                    buf: ls_start - buf_start,
                                    len: ls,
                                });
                                self.counters.hdd_bytes_read += ls;
                            }
                        }
                    }
                    if let Some(e) = old {
                        self.drop_entry(key, e);
                    }
                    let c = content.get(i).copied();
                    if let Some(c) = c {
                        if let Some(loc) = self.dedup_lookup(c.fp) {
                            self.counters.dup_write_lines += 1;
                            self.dup_entry(key, loc, dirty);
                            continue;
                        }
                    }
                    self.append(key, c, dirty);
                }
                if count {
                    let t = self.last;
                    self.counters
                        .write_requests
                        .count(t.hits, t.misses, t.bypassed);
                }
            }
            Op::Trim => {
                self.counters.trims += 1;
                for line in first..=last {
                    if req.len == 0 {
                        break;
                    }
                    let key = Self::key(req.volume, line);
                    if let Some(e) = self.current(key) {
                        self.drop_entry(key, e);
                    }
                }
                self.emit(Step::TrimHdd {
                    vol: req.volume,
                    hdd: req.offset,
                    len: req.len,
                });
            }
            Op::Flush => {
                self.counters.flushes += 1;
                self.emit(Step::FlushHdd { vol: req.volume });
            }
        }
        let ci = req.class as usize;
        self.class_counters[ci].add_delta(&self.counters, &before);
        Ok(&self.plan)
    }

    /// A fingerprint-index hit that is still current.
    fn dedup_lookup(&mut self, fp: u64) -> Option<Loc> {
        if self.fps.capacity() == 0 {
            return None;
        }
        let segs = &self.segs;
        self.fps.get(fp, |s| segs[s as usize].gen)
    }

    /// Creates a duplicate entry for `key` at `loc`.
    fn dup_entry(&mut self, key: u64, loc: Loc, dirty: bool) -> Entry {
        let hdr = self.segs[loc.seg as usize]
            .hdr
            .iter()
            .position(|h| h.off == loc.off)
            .map(|h| h as u32)
            .unwrap_or(NONE);
        let e = Entry {
            seg: loc.seg,
            gen: loc.gen,
            off: loc.off,
            len: loc.len,
            hdr,
            dirty,
            dup: true,
            class: self.last_class,
        };
        self.file.insert(key, e);
        if dirty {
            self.dirty_dups.entry(loc.seg).or_default().push(key);
        }
        e
    }

    /// Serves a cached line into the buffer, as a hit.
    fn serve(&mut self, e: Entry, buf: u64) {
        self.counters.read_line_hits += 1;
        let s = &mut self.segs[e.seg as usize];
        s.last_hit = self.tick;
        if let Some(h) = s.hdr.get_mut(e.hdr as usize) {
            h.hits = h.hits.saturating_add(1);
        }
        self.picker.hit(e.seg, self.tick);
        if self.segs[e.seg as usize].state == SegState::Open {
            self.counters.ram_read_hits += 1;
            return;
        }
        self.read_extent(e, buf - self.plan.buf_start);
    }

    /// Reads a cached line (not counted as a hit: the rest of a partial write).
    fn serve_quiet(&mut self, e: Entry, ls_start: u64) {
        if self.segs[e.seg as usize].state != SegState::Open {
            self.read_extent(e, ls_start - self.plan.buf_start);
        }
    }

    fn read_extent(&mut self, e: Entry, buf: u64) {
        let ssd = self.ssd_addr(e.seg, e.off);
        self.emit(Step::ReadSsd {
            ssd,
            buf,
            len: e.len as u64,
        });
        self.counters.ssd_bytes_read += e.len as u64;
    }

    /// Removes `key`'s entry (overwrite or trim). A base extent stops being live; in extent
    /// caching its slot is freed at once (and, without a free reserve, reused first: an
    /// overwrite lands in place).
    fn drop_entry(&mut self, key: u64, e: Entry) {
        self.file.remove(&key);
        if !e.dup {
            self.log_dead(e.seg, e.gen, e.off);
            let s = &mut self.segs[e.seg as usize];
            s.live -= e.len;
            if self.seg_size == self.cfg.line_size && s.state == SegState::Sealed {
                self.reclaim(e.seg, false);
                self.release(e.seg);
            }
        }
    }

    /// Appends the line `key` (content `c`) to an open segment as a base extent.
    fn append(&mut self, key: u64, c: Option<ExtentContent>, dirty: bool) {
        let ls = self.cfg.line_size;
        let (fp, stored, compressed) = match c {
            Some(c) => {
                let z = self.cfg.compression.is_on() && (c.compressed_len as u64) < ls;
                (
                    c.fp,
                    if z {
                        c.compressed_len.max(1)
                    } else {
                        ls as u32
                    },
                    z,
                )
            }
            None => {
                self.nonce += 1;
                (mix(key ^ mix(self.nonce)), ls as u32, false)
            }
        };
        let stream = dirty as usize;
        let mut o = self.open[stream];
        // Extent caching (segment = line): one extent per slot, compressed or not.
        let one_per_segment = self.seg_size == ls;
        if o == NONE
            || self.segs[o as usize].used as u64 + stored as u64 > self.seg_size
            || (one_per_segment && self.segs[o as usize].used > 0)
            || (self.cfg.max_extents_per_segment > 0
                && self.segs[o as usize].hdr.len() as u32 >= self.cfg.max_extents_per_segment)
        {
            if o != NONE {
                self.seal(o);
            }
            o = self.allocate(stream);
            self.open[stream] = o;
        }
        self.put(o, key, fp, stored, compressed, dirty, 0);
        if one_per_segment {
            // Extent caching writes each extent to its slot at once.
            self.seal(o);
            self.open[stream] = NONE;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        o: u32,
        key: u64,
        fp: u64,
        stored: u32,
        compressed: bool,
        dirty: bool,
        hits: u16,
    ) {
        let ls = self.cfg.line_size;
        let s = &mut self.segs[o as usize];
        let off = s.used;
        s.used += stored;
        s.live += stored;
        s.hdr.push(HdrEntry {
            key,
            fp,
            off,
            len: stored,
            compressed,
            dirty,
            hits,
        });
        let gen = s.gen;
        let hdr = (s.hdr.len() - 1) as u32;
        self.file.insert(
            key,
            Entry {
                seg: o,
                gen,
                off,
                len: stored,
                hdr,
                dirty,
                dup: false,
                class: self.last_class,
            },
        );
        self.fps.insert(
            fp,
            Loc {
                seg: o,
                gen,
                off,
                len: stored,
            },
        );
        let c = &mut self.counters;
        c.extents_stored += 1;
        c.logical_bytes_stored += ls;
        c.stored_bytes += stored as u64;
        c.extents_compressed += compressed as u64;
    }

    /// Writes an open segment to the SSD.
    fn seal(&mut self, seg: u32) {
        let s = &mut self.segs[seg as usize];
        debug_assert_eq!(s.state, SegState::Open);
        s.state = SegState::Sealed;
        s.sealed_at = self.tick;
        let ssd = seg as u64 * self.seg_size;
        let len = self.seg_size;
        self.emit(Step::WriteSsd { ssd, buf: 0, len });
        self.counters.ssd_bytes_written += len;
        self.counters.segments_sealed += 1;
        self.picker.sealed(seg, self.tick);
    }

    /// Puts a reclaimed (emptied) segment on the free list: reused first without a reserve,
    /// after every other free segment with one.
    fn release(&mut self, s: u32) {
        let seg = &mut self.segs[s as usize];
        debug_assert!(
            seg.used == 0 && seg.hdr.is_empty(),
            "freeing segment {s} with data"
        );
        seg.state = SegState::Free;
        if self.reserve > 0 {
            self.free.push_front(s);
        } else {
            self.free.push_back(s);
        }
    }

    /// Evict ahead: reclaims (and trims) the picker's victims until `want` segments are free
    /// or none is sealed. Reclaimed ahead, hot extents are not reinserted (refused by
    /// `validate`).
    fn evict_ahead(&mut self, want: usize) {
        while self.free.len() < want {
            let Some(v) = self.picker.victim(&self.segs, self.tick) else {
                break;
            };
            self.reclaim(v, false);
            self.release(v);
        }
    }

    /// A segment to fill: the oldest free one once the reserve is kept (evicting ahead),
    /// else a free one, or a reclaimed victim.
    fn allocate(&mut self, stream: usize) -> u32 {
        if self.reserve > 0 {
            self.evict_ahead(self.reserve + 1);
            debug_assert!(
                self.free.len() > self.reserve
                    || self.segs.iter().all(|s| s.state != SegState::Sealed),
                "the reserve is kept while a sealed segment exists"
            );
        }
        if let Some(s) = self.free.pop_back() {
            self.segs[s as usize].state = SegState::Open;
            return s;
        }
        let v = self
            .picker
            .victim(&self.segs, self.tick)
            .expect("a sealed segment exists: at least 3 segments and 2 open");
        self.reclaim(v, stream == 0 && self.cfg.reinsert_hits > 0);
        v
    }

    /// Empties a sealed segment: dirty extents are written back, entries dropped, the
    /// generation bumped; hot clean extents are put back when `reinsert`.
    fn reclaim(&mut self, v: u32, reinsert: bool) {
        let ls = self.cfg.line_size;
        let gen = self.segs[v as usize].gen;
        let hdr = std::mem::take(&mut self.segs[v as usize].hdr);
        self.reinsert.clear();
        for h in &hdr {
            if let Some(e) = self.file.get(&h.key).copied() {
                if e.seg == v && e.gen == gen && !e.dup && e.off == h.off {
                    if e.dirty {
                        self.write_back(h.key, v, e);
                    } else if reinsert && h.hits >= self.cfg.reinsert_hits {
                        self.reinsert.push(*h);
                    }
                    self.file.remove(&h.key);
                    self.log_dead(v, gen, h.off);
                    self.counters.extents_evicted += 1;
                }
            }
            self.fps.remove_if(h.fp, v, gen);
        }
        if let Some(keys) = self.dirty_dups.remove(&v) {
            for k in keys {
                if let Some(e) = self.file.get(&k).copied() {
                    if e.seg == v && e.gen == gen && e.dirty {
                        self.write_back(k, v, e);
                        self.file.remove(&k);
                    }
                }
            }
        }
        let s = &mut self.segs[v as usize];
        s.gen = s.gen.wrapping_add(1);
        s.used = 0;
        s.live = 0;
        s.last_hit = 0;
        s.state = SegState::Open;
        s.hdr = hdr;
        s.hdr.clear();
        self.picker.freed(v);
        self.counters.segments_reclaimed += 1;
        if self.cfg.trim {
            let ssd = v as u64 * self.seg_size;
            self.emit(Step::TrimSsd {
                ssd,
                len: self.seg_size,
            });
            self.counters.ssd_bytes_trimmed += self.seg_size;
        }
        let hot = std::mem::take(&mut self.reinsert);
        for h in &hot {
            let s = &self.segs[v as usize];
            if !self.reinsert_fits(s.used, s.hdr.len() as u32, h.len) {
                continue; // Evicted after all (counted above).
            }
            // Read before the segment is overwritten (its bytes are still on the SSD; the
            // live executor reads them before the reclamation, `reinsert_candidates`).
            let ssd = self.ssd_addr(v, h.off);
            self.emit(Step::ReadSsd {
                ssd,
                buf: 0,
                len: h.len as u64,
            });
            self.counters.ssd_bytes_read += h.len as u64;
            self.put(v, h.key, h.fp, h.len, h.compressed, false, 0);
            self.counters.reinserted += 1;
        }
        self.reinsert = hot;
        let _ = ls;
    }

    fn write_back(&mut self, key: u64, seg: u32, e: Entry) {
        let ls = self.cfg.line_size;
        let (vol, hdd) = self.home(key);
        let ssd = self.ssd_addr(seg, e.off);
        self.emit(Step::WriteBack {
            vol,
            ssd,
            hdd,
            len: ls,
        });
        self.counters.ssd_bytes_read += e.len as u64;
        self.counters.hdd_bytes_written += ls;
        self.counters.dirty_write_backs += 1;
    }

    /// The background cleaner: drops up to `budget` duplicate entries whose segment has been
    /// reclaimed since. Returns how many were dropped.
    pub fn clean_stale(&mut self, budget: usize) -> usize {
        let segs = &self.segs;
        let mut n = 0;
        self.file.retain(|_, e| {
            if n < budget && e.dup && segs[e.seg as usize].gen != e.gen {
                n += 1;
                false
            } else {
                true
            }
        });
        self.counters.stale_entries_dropped += n as u64;
        n
    }

    /// Dirty lines (base and duplicate) not yet on the disk.
    pub fn dirty_lines(&self) -> u64 {
        self.file
            .values()
            .filter(|e| e.dirty && self.segs[e.seg as usize].gen == e.gen)
            .count() as u64
    }

    /// Data reduction over what the cache holds now.
    pub fn reduction(&self) -> Reduction {
        let ls = self.cfg.line_size;
        let mut cached = 0u64;
        let mut extents: hashbrown::HashSet<(u32, u32)> = hashbrown::HashSet::new();
        let mut stored = 0u64;
        for e in self.file.values() {
            if self.segs[e.seg as usize].gen != e.gen {
                continue;
            }
            cached += 1;
            if extents.insert((e.seg, e.off)) {
                stored += e.len as u64;
            }
        }
        let used: u64 = self
            .segs
            .iter()
            .filter(|s| s.state != SegState::Free)
            .map(|s| {
                if self.seg_size == ls {
                    ls // extent caching: a slot holds one extent whatever its size
                } else {
                    s.used as u64
                }
            })
            .sum();
        let n = extents.len() as u64;
        Reduction {
            cached_lines: cached,
            stored_extents: n,
            dedup_ratio: if n > 0 { cached as f64 / n as f64 } else { 1.0 },
            compression_ratio: if stored > 0 {
                (n * ls) as f64 / stored as f64
            } else {
                1.0
            },
            effective_capacity: if used > 0 {
                (cached * ls) as f64 / used as f64
            } else {
                0.0
            },
            ssd_bytes_used: used,
        }
    }

    /// Checks the layout's invariants: capacity never exceeded, fills and live bytes agree
    /// with headers and entries, at most two open segments, counters add up.
    pub fn check(&self) -> Result<(), String> {
        self.counters.check(self.seg_size)?;
        self.fps.check()?;
        let open = self
            .segs
            .iter()
            .filter(|s| s.state == SegState::Open)
            .count();
        if open > 2 {
            return Err(format!("{open} open segments"));
        }
        let mut live = vec![0u64; self.segs.len()];
        for (k, e) in &self.file {
            let s = &self.segs[e.seg as usize];
            if s.gen != e.gen {
                if !e.dup {
                    return Err(format!("stale base entry for key {k:#x}"));
                }
                continue;
            }
            if e.off as u64 + e.len as u64 > s.used as u64 {
                return Err(format!("entry for key {k:#x} beyond its segment's fill"));
            }
            if !e.dup {
                live[e.seg as usize] += e.len as u64;
                match s.hdr.get(e.hdr as usize) {
                    Some(h) if h.key == *k && h.off == e.off => {}
                    _ => return Err(format!("base entry for key {k:#x} not in its header")),
                }
            }
        }
        let free = self
            .segs
            .iter()
            .filter(|s| s.state == SegState::Free)
            .count();
        if free != self.free.len()
            || self
                .free
                .iter()
                .any(|&f| self.segs[f as usize].state != SegState::Free)
        {
            return Err(format!(
                "free list of {} segments, {free} segments free",
                self.free.len()
            ));
        }
        for (i, s) in self.segs.iter().enumerate() {
            if s.used as u64 > self.seg_size {
                return Err(format!(
                    "segment {i} holds {} > {} bytes",
                    s.used, self.seg_size
                ));
            }
            if s.live as u64 != live[i] {
                return Err(format!(
                    "segment {i}: live {} but entries hold {}",
                    s.live, live[i]
                ));
            }
            let hsum: u64 = s.hdr.iter().map(|h| h.len as u64).sum();
            if hsum != s.used as u64 {
                return Err(format!(
                    "segment {i}: header lengths {hsum} != fill {}",
                    s.used
                ));
            }
            if s.state == SegState::Free && s.used != 0 {
                return Err(format!("free segment {i} holds data"));
            }
        }
        Ok(())
    }
}
