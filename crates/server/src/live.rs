//! One contract for the live volume, whatever its layout (issue 19 item 1): the direct
//! layout ([`CacheVolume`]) and the log layout ([`LogVolume`]) both implement
//! [`LiveVolume`], and everything around a served volume — the control socket
//! (`crate::control`), Prometheus ([`prometheus`]), `ctl stats`, the dashboard
//! (`crate::dashboard::snapshot`), `serve` — is written once against it. [`open_volume`]
//! reads the superblock and picks the layout.
//!
//! # Contract (both layouts MUST keep it; `crates/cli/tests/live_contract.rs` runs one test
//! body against each)
//! - **Data path**: the NBD [`Export`] methods. An acknowledged write is readable at once;
//!   after `flush` (or a FUA write) it survives a crash. A cache-device error never reaches
//!   the client by itself: the request is served by the backing device; after
//!   `set_max_cache_errors` read errors (or any write/sync error) the cache is *failed*:
//!   every dirty line it can still read is copied to the backing device first (what it
//!   cannot is listed in `lost_dirty_ranges`, and reads of it fail), the failure is recorded
//!   (state file, superblock erase) and every later request passes through.
//! - **`flush_dirty`** (`ctl flush`) MUST leave no dirty data in the cache: on return the
//!   backing device holds, durably, every byte acknowledged before the call.
//! - **`set_mode`** MUST write back every dirty line before leaving write-back (to
//!   write-through or pass-through), and MUST store the mode in the superblock: a restart
//!   keeps it. **`detach`** is `set_mode(PassThrough)`. A failed cache refuses both.
//! - **`live_stats`** MUST fill the one schema ([`LiveStats`]): the same top-level keys for
//!   both layouts (`layout` says which), layout-specific figures in the `log` sub-object
//!   (null for the direct layout). Fault fields carry the same meaning in both.
//! - **Settings**: `settings` lists the [`crate::tuning::KEYS`] that apply to the layout with
//!   their values; `set_setting` changes one live (logged, counted in
//!   `settings.changes`) or refuses it with the reason (a key that does not apply to the
//!   layout says so and what does).
//! - **`reset_stats`** zeroes request counters, latency histograms and byte counts; fault
//!   state (errors, failure, lost data, degraded) is kept.
//! - **`shutdown`** makes everything durable and marks the cache clean (unless failed);
//!   every later request fails. **`start_background`** starts the volume's own threads
//!   (cleaning, write-back retries); they stop after `shutdown`.
//! - **`metrics`**: the client read and write latency histograms
//!   (`tiercache_request_latency_seconds`), recorded by the data path of both layouts.

use crate::classify::ClassStats;
use crate::dev::BlockDev;
use crate::format::{FormatError, Superblock};
use crate::log_format::LogSuperblock;
use crate::log_volume::{LogOpenOptions, LogOpenReport, LogVolume, LogVolumeStats};
use crate::metrics::Metrics;
use crate::tuning::Tuning;
use crate::volume::{CacheVolume, OpenOptions, OpenReport, Settings, VolumeStats};
use serde::Serialize;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiercache_engine::{Counters, Mode};
use tiercache_nbd::Export;

/// A live cache volume of either layout: see the module doc for the contract.
/// Why a volume serves nothing more after a panic while its lock was held (a bug: an
/// assertion, a device's panic). The in-memory state may be half-updated (a line mapped to a
/// slot not yet written), so nothing is served from it; the device holds a crash-consistent
/// state, which a restart recovers as after a power cut.
pub const HALTED: &str = "the volume stopped after a panic while it held its lock (a bug: the \
     panic message is in the log); nothing more is served from its in-memory state: restart \
     `tiercache serve`, which recovers from the device as after a crash";

pub trait LiveVolume: Export + Send + Sync {
    /// `"direct"` or `"log"`.
    fn layout(&self) -> &'static str;
    /// Writes back every dirty line and makes everything durable (`ctl flush`).
    fn flush_dirty(&self) -> io::Result<()>;
    /// Changes the write mode live and stores it (`ctl mode`).
    fn set_mode(&self, mode: Mode) -> io::Result<()>;
    /// Writes back, then passes everything through (`ctl detach`).
    fn detach(&self) -> io::Result<()> {
        self.set_mode(Mode::PassThrough)
    }
    /// `ctl cache replace INDEX PATH`: failed pool member `index` is replaced by the device
    /// at `path` (a file, a block device or an NBD URI), formatted as that member; the
    /// cleaner then re-mirrors the dirty lines left with one copy. Refused, naming why.
    fn replace_cache_member(&self, index: usize, path: &str) -> Result<(), String> {
        Err(format!(
            "cache replace {index} {path}: the {} layout has no pool of cache devices",
            self.layout()
        ))
    }
    /// The statistics in the one schema (`ctl stats --json`).
    fn live_stats(&self) -> LiveStats;
    /// The settings that apply to this layout and their values (`ctl get`).
    fn settings(&self) -> Vec<(&'static str, String)>;
    /// Changes one setting live (`ctl set`): (old, new), or why not.
    fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String>;
    /// Replaces the I/O class table (`ctl classes load`; `source` names its file), or says
    /// why not; nothing changes on error. Per run: a restart uses `serve`'s flags.
    fn load_classes(
        &self,
        table: tiercache_engine::ClassTable,
        source: &str,
    ) -> Result<crate::classify::ClassesLoaded, String>;
    /// `ctl stats --reset`.
    fn reset_stats(&self);
    /// Clean shutdown.
    fn shutdown(&self) -> io::Result<()>;
    /// Whether the cache device has been failed (everything passes through).
    fn cache_failed(&self) -> bool;
    /// Whether a failure of the cache, if any, is recorded durably.
    fn failure_recorded(&self) -> bool;
    /// Cache-device read errors after which the cache is failed.
    fn set_max_cache_errors(&self, n: u64);
    /// Client request latencies (both layouts record them in their data path).
    fn metrics(&self) -> &Metrics;
    /// Starts the volume's background work; the returned handle joins it (call after
    /// `shutdown`).
    fn start_background(self: Arc<Self>) -> Background;
    /// The volumes served (`serve --volume NAME=BACKING`): name, id, size; empty: one volume,
    /// exported as itself ([`exports`]).
    fn volumes(&self) -> Vec<(String, u32, u64)> {
        Vec::new()
    }
    /// Volume `vol`'s own settings (`ctl --volume NAME get`; `crate::tuning::VOLUME_KEYS`).
    fn volume_settings(&self, vol: u32) -> Result<Vec<(&'static str, String)>, String> {
        let _ = vol;
        Err("this layout serves one volume".into())
    }
    /// Changes one of volume `vol`'s own settings for this run (`ctl --volume NAME set`,
    /// `mode`, `detach`); returns (old, new).
    fn set_volume_setting(
        &self,
        vol: u32,
        key: &str,
        value: &str,
    ) -> Result<(String, String), String> {
        let _ = (vol, key, value);
        Err("this layout serves one volume".into())
    }
    /// `ctl volume add`: serves a new volume of `size` bytes whose backing device the
    /// caller made reachable (`crate::volume_set::VolumeSlots`); recorded in the superblock
    /// before it returns the volume's id. Its export is the caller's to offer ([`export_of`]).
    fn add_volume(
        &self,
        name: &str,
        size: u64,
        identity: Option<crate::identity::BackingIdentity>,
        mode: Option<Mode>,
    ) -> Result<u32, String> {
        let _ = (name, size, identity, mode);
        Err("this layout serves one volume".into())
    }
    /// `ctl volume remove`: volume `name` leaves the pool (refused while it has dirty
    /// lines); returns its id and the clean lines dropped.
    fn remove_volume(&self, name: &str) -> Result<(u32, u64), String> {
        let _ = name;
        Err("this layout serves one volume".into())
    }
    /// A request of volume `vol` (of [`LiveVolume::volumes`]), from its [`VolumeExport`].
    fn volume_io(&self, vol: u32, io: VolumeIo<'_>) -> io::Result<()> {
        let _ = (vol, io);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this layout serves one volume",
        ))
    }
}

/// One request of a volume of several ([`LiveVolume::volume_io`]).
pub enum VolumeIo<'a> {
    Read(u64, &'a mut [u8]),
    Write(u64, &'a [u8], bool),
    Flush,
    Trim(u64, u64),
}

/// The NBD export of one volume of several: its requests go to the shared cache stamped
/// with the volume's id (`Request::volume`).
pub struct VolumeExport {
    live: Arc<dyn LiveVolume>,
    id: u32,
    size: u64,
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.live.volume_io(self.id, VolumeIo::Read(offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.live
            .volume_io(self.id, VolumeIo::Write(offset, data, fua))
    }
    fn flush(&self) -> io::Result<()> {
        self.live.volume_io(self.id, VolumeIo::Flush)
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.live.volume_io(self.id, VolumeIo::Trim(offset, len))
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
    fn block_sizes(&self) -> tiercache_nbd::BlockSizes {
        self.live.block_sizes()
    }
}

/// The NBD exports of a live volume: one per volume served, under its name; a one-volume
/// cache is exported as `tiercache`.
pub fn exports(live: &Arc<dyn LiveVolume>) -> Vec<(String, Arc<dyn Export>)> {
    let vols = live.volumes();
    if vols.is_empty() {
        return vec![("tiercache".into(), Arc::clone(live) as Arc<dyn Export>)];
    }
    vols.into_iter()
        .map(|(name, id, size)| (name, export_of(live, id, size)))
        .collect()
}

/// The NBD export of volume `id` (of `size` bytes) of a live volume of several.
pub fn export_of(live: &Arc<dyn LiveVolume>, id: u32, size: u64) -> Arc<dyn Export> {
    Arc::new(VolumeExport {
        live: Arc::clone(live),
        id,
        size,
    })
}

/// The background threads of a volume ([`LiveVolume::start_background`]).
pub struct Background(Option<Box<dyn FnOnce() + Send>>);

impl Background {
    /// Stops and joins the threads (the volume is shut down).
    pub fn finish(mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

/// `ctl stats` of either layout: the direct layout's figures at the top (the log layout
/// fills them from its own counters, see [`log_common`]), the log layout's own in `log`.
#[derive(Clone, Debug, Serialize)]
pub struct LiveStats {
    pub layout: &'static str,
    /// The served volume's name: its backing device as recorded in the superblock (casadm's
    /// core device). One volume per server until issue 15 (several volumes) names each by
    /// its export; `ctl stats` labels the per-volume section with it.
    pub volume_name: String,
    #[serde(flatten)]
    pub volume: VolumeStats,
    /// `volume.lost_dirty_ranges` named within their volumes: `[start, end]` pairs on a
    /// cache of one volume, `{volume, volume_id, start, end}` on one of several.
    pub lost_dirty_ranges: Vec<crate::volume_set::NamedRange>,
    /// Segments, data reduction, journal and engine counters of the log layout; null for
    /// the direct layout.
    pub log: Option<LogVolumeStats>,
    /// Per volume when the server serves several (`serve --volume`); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeFigures>,
}

/// Times one client request into [`Metrics`] when dropped, and counts its bytes.
pub struct Timed<'a> {
    m: &'a Metrics,
    write: bool,
    t: Instant,
}

impl<'a> Timed<'a> {
    pub fn start(m: &'a Metrics, write: bool, bytes: usize) -> Timed<'a> {
        m.client_bytes[write as usize].fetch_add(bytes as u64, Ordering::Relaxed);
        Timed {
            m,
            write,
            t: Instant::now(),
        }
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.m.record(self.write, self.t.elapsed());
    }
}

impl LiveVolume for CacheVolume {
    fn layout(&self) -> &'static str {
        "direct"
    }
    fn volumes(&self) -> Vec<(String, u32, u64)> {
        self.volume_specs()
            .iter()
            .map(|v| (v.name.clone(), v.id, v.size))
            .collect()
    }
    fn volume_io(&self, vol: u32, io: VolumeIo<'_>) -> io::Result<()> {
        CacheVolume::volume_io(self, vol, io)
    }
    fn add_volume(
        &self,
        name: &str,
        size: u64,
        identity: Option<crate::identity::BackingIdentity>,
        mode: Option<Mode>,
    ) -> Result<u32, String> {
        CacheVolume::add_volume(self, name, size, identity, mode)
    }
    fn remove_volume(&self, name: &str) -> Result<(u32, u64), String> {
        CacheVolume::remove_volume(self, name)
    }
    fn volume_settings(&self, vol: u32) -> Result<Vec<(&'static str, String)>, String> {
        CacheVolume::volume_settings(self, vol)
    }
    fn set_volume_setting(
        &self,
        vol: u32,
        key: &str,
        value: &str,
    ) -> Result<(String, String), String> {
        CacheVolume::set_volume_setting(self, vol, key, value)
    }
    fn flush_dirty(&self) -> io::Result<()> {
        CacheVolume::flush_dirty(self)
    }
    fn set_mode(&self, mode: Mode) -> io::Result<()> {
        CacheVolume::set_mode(self, mode)
    }
    fn detach(&self) -> io::Result<()> {
        CacheVolume::detach(self)
    }
    fn replace_cache_member(&self, index: usize, path: &str) -> Result<(), String> {
        let dev: Box<dyn crate::BlockDev> = if crate::NbdDev::is_uri(path) {
            let d = crate::NbdDev::connect(path)
                .map_err(|e| format!("cache replace {index} {path}: {e}"))?;
            if d.read_only() {
                return Err(format!(
                    "cache replace {index} {path}: the export is read-only; a cache device must be writable"
                ));
            }
            Box::new(d)
        } else {
            Box::new(
                crate::FileDev::open(std::path::Path::new(path))
                    .map_err(|e| format!("cache replace {index} {path}: cannot open it: {e}"))?,
            )
        };
        CacheVolume::replace_cache_member(self, index, path.to_string(), dev)
    }
    fn live_stats(&self) -> LiveStats {
        let volume = self.stats();
        LiveStats {
            layout: "direct",
            volume_name: self.volume_name(),
            lost_dirty_ranges: self.named_ranges(&volume.lost_dirty_ranges),
            volume,
            log: None,
            volumes: self.volume_figures(),
        }
    }
    fn settings(&self) -> Vec<(&'static str, String)> {
        CacheVolume::settings(self)
    }
    fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String> {
        CacheVolume::set_setting(self, key, value)
    }
    fn load_classes(
        &self,
        table: tiercache_engine::ClassTable,
        source: &str,
    ) -> Result<crate::classify::ClassesLoaded, String> {
        CacheVolume::load_classes(self, table, source)
    }
    fn reset_stats(&self) {
        CacheVolume::reset_stats(self)
    }
    fn shutdown(&self) -> io::Result<()> {
        CacheVolume::shutdown(self)
    }
    fn cache_failed(&self) -> bool {
        CacheVolume::cache_failed(self)
    }
    fn failure_recorded(&self) -> bool {
        CacheVolume::failure_recorded(self)
    }
    fn set_max_cache_errors(&self, n: u64) {
        CacheVolume::set_max_cache_errors(self, n)
    }
    fn metrics(&self) -> &Metrics {
        CacheVolume::metrics(self)
    }
    fn start_background(self: Arc<Self>) -> Background {
        // The cleaner stops when the volume shuts down.
        let h = self.start_cleaner();
        Background(Some(Box::new(move || {
            let _ = h.join();
        })))
    }
}

impl LiveVolume for LogVolume {
    fn layout(&self) -> &'static str {
        "log"
    }
    fn flush_dirty(&self) -> io::Result<()> {
        LogVolume::flush_dirty(self)
    }
    fn set_mode(&self, mode: Mode) -> io::Result<()> {
        LogVolume::set_mode(self, mode)
    }
    fn live_stats(&self) -> LiveStats {
        let s = self.stats();
        let volume = log_common(self, &s);
        LiveStats {
            layout: "log",
            volume_name: self.volume_name(),
            lost_dirty_ranges: crate::volume_set::named_ranges(
                false,
                |_| None,
                &volume.lost_dirty_ranges,
            ),
            volume,
            log: Some(s),
            volumes: Vec::new(),
        }
    }
    fn settings(&self) -> Vec<(&'static str, String)> {
        LogVolume::settings(self)
    }
    fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String> {
        LogVolume::set_setting(self, key, value)
    }
    fn load_classes(
        &self,
        table: tiercache_engine::ClassTable,
        source: &str,
    ) -> Result<crate::classify::ClassesLoaded, String> {
        LogVolume::load_classes(self, table, source)
    }
    fn reset_stats(&self) {
        LogVolume::reset_stats(self)
    }
    fn shutdown(&self) -> io::Result<()> {
        LogVolume::shutdown(self)
    }
    fn cache_failed(&self) -> bool {
        LogVolume::cache_failed(self)
    }
    fn failure_recorded(&self) -> bool {
        LogVolume::failure_recorded(self)
    }
    fn set_max_cache_errors(&self, n: u64) {
        LogVolume::set_max_cache_errors(self, n)
    }
    fn metrics(&self) -> &Metrics {
        LogVolume::metrics(self)
    }
    fn start_background(self: Arc<Self>) -> Background {
        // Write-back retries of a degraded volume: the volume retries when its backoff has
        // passed; this thread only asks often enough.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let h = std::thread::Builder::new()
            .name("tiercache-log-retry".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    self.retry_write_backs();
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
            .expect("spawn the write-back retry thread");
        Background(Some(Box::new(move || {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        })))
    }
}

/// The direct layout's figures of a log volume: its counters mapped onto the engine's
/// [`Counters`] (per I/O class when a class table is in force, [`log_class_counters`]; else
/// one class, `0`, with the totals), requests by outcome per direction with the direct layout's definitions.
/// The only bypasses are missed lines of `never` classes (`bypasses.class`). What the log
/// layout does not count is 0: other bypasses (it admits every other missed line), sector
/// fills, unmaps and pages in flux (direct-layout metadata).
pub fn log_common(v: &LogVolume, s: &LogVolumeStats) -> VolumeStats {
    let (e, l, ls) = (&s.engine, &s.live, s.line_size);
    let m = v.metrics();
    let line_accesses = e.read_lines + e.write_lines;
    let line_hits = e.read_line_hits + e.write_line_hits;
    let (r, w) = (&e.read_requests, &e.write_requests);
    let totals = Counters {
        requests: l.requests,
        reads: e.reads,
        writes: e.writes,
        trims: e.trims,
        flushes: e.flushes,
        read_bytes: m.client_bytes[0].load(Ordering::Relaxed),
        write_bytes: m.client_bytes[1].load(Ordering::Relaxed),
        line_accesses,
        line_hits,
        line_misses: line_accesses - line_hits,
        read_line_accesses: e.read_lines,
        read_line_hits: e.read_line_hits,
        write_line_accesses: e.write_lines,
        write_line_hits: e.write_line_hits,
        full_hits: r.hits + w.hits,
        partial_hits: r.partial_misses + w.partial_misses,
        full_misses: r.full_misses + r.pass_through + w.full_misses + w.pass_through,
        read_requests: *r,
        write_requests: *w,
        admitted_misses: line_accesses - line_hits - e.bypassed_lines,
        bypasses: tiercache_engine::Bypasses {
            class: e.bypassed_lines,
            ..Default::default()
        },
        insertions: e.extents_stored + e.dup_write_lines,
        evictions: e.extents_evicted,
        write_backs: l.write_backs,
        ssd_bytes_read: l.ssd_bytes_read,
        ssd_bytes_written: l.ssd_bytes_written,
        hdd_bytes_read: l.backing_bytes_read,
        hdd_bytes_written: l.backing_bytes_written,
        ..Default::default()
    };
    let tuning = Tuning {
        group_size: ls,
        admission: tiercache_engine::Admission::ALWAYS,
        seq_cutoff_read: 0,
        seq_cutoff_write: 0,
        // Dirty lines are written back when their segment is reclaimed (the cache full).
        dirty_high: 1.0,
        dirty_low: 1.0,
        slru_protected: 0.0,
        cleaning: Default::default(),
        cleaning_age: 0,
        writeback: None,
        clean_victim_window: 0,
        partial_write_fill: true,
    };
    VolumeStats {
        settings: Settings {
            mode: s.mode.clone(),
            policy: s.picker.clone(),
            line_size: ls,
            validity: None,
            tuning,
            cleaning: None,
            cleaning_age: None,
            writeback_rate: None,
            writeback_target: None,
            changes: v.settings_changes(),
        },
        mode: s.mode.clone(),
        policy: s.picker.clone(),
        line_size: ls,
        capacity_lines: s.segments * s.segment_size / ls,
        cached_lines: s.cached_lines,
        dirty_lines: s.dirty_lines,
        copy_slots: 0,
        unmirrored_lines: 0,
        remirrored_lines: 0,
        dirty_bytes: s.dirty_lines * ls,
        volume_bytes: s.volume_bytes,
        ram_index_bytes: s.ram_index_bytes,
        totals,
        ram: v.ram_stats(&totals),
        per_class: if s.class_table.is_none() {
            vec![(0, totals)]
        } else {
            s.classes
                .iter()
                .map(|c| (c.id, log_class_counters(&c.engine)))
                .collect()
        },
        unmap_syncs: 0,
        unmap_on_miss: 0,
        unmap_ahead: 0,
        unlocked_misses: 0,
        unmapped_ahead_now: 0,
        unmap_ahead_skipped: 0,
        flux_syncs: 0,
        flux_pages: 0,
        flux_pages_now: 0,
        metadata_pages_written: 0,
        classes: if s.class_table.is_none() {
            vec![ClassStats {
                id: 0,
                name: "0".into(),
                cached_lines: s.cached_lines,
                dirty_lines: s.dirty_lines,
                counters: totals,
            }]
        } else {
            s.classes
                .iter()
                .map(|c| ClassStats {
                    id: c.id,
                    name: c.name.clone(),
                    cached_lines: c.cached_lines,
                    dirty_lines: c.dirty_lines,
                    counters: log_class_counters(&c.engine),
                })
                .collect()
        },
        classifier: s.classifier.clone(),
        class_table: s.class_table.clone(),
        cache_errors: s.cache_errors,
        pool_members: Vec::new(),
        // Every extent carries a crc32c, checked on every read.
        checksum_errors: l.extent_crc_errors,
        data_checksums: true,
        backing_errors: s.backing_errors,
        cache_failed: s.cache_failed,
        halted: s.halted,
        lost_dirty_bytes: s.lost_dirty_bytes,
        lost_dirty_ranges: s.lost_dirty_ranges.clone(),
        lost_ranges: s.lost_dirty_ranges.len() as u64,
        degraded: s.degraded,
        degraded_reason: s.degraded_reason.clone(),
        backing_write_errors: s.backing_write_errors,
        backing_sync_errors: l.backing_sync_errors,
        unlocked_writebacks: 0,
        writeback_waits: 0,
        writeback_yields: 0,
        writeback_groups_dropped: 0,
        cleaner_panics: 0,
    }
}

/// One I/O class of a log volume in the direct layout's counters, with the definitions of
/// [`log_common`]'s totals, from the engine's counters of the class alone (device bytes and
/// write-backs are the engine's: reclamations belong to no request and are in the totals
/// only). A missed line of a `never` class is a class bypass.
pub fn log_class_counters(e: &tiercache_engine::log::LogCounters) -> Counters {
    let line_accesses = e.read_lines + e.write_lines;
    let line_hits = e.read_line_hits + e.write_line_hits;
    let (r, w) = (&e.read_requests, &e.write_requests);
    Counters {
        requests: e.requests,
        reads: e.reads,
        writes: e.writes,
        trims: e.trims,
        flushes: e.flushes,
        line_accesses,
        line_hits,
        line_misses: line_accesses - line_hits,
        read_line_accesses: e.read_lines,
        read_line_hits: e.read_line_hits,
        write_line_accesses: e.write_lines,
        write_line_hits: e.write_line_hits,
        full_hits: r.hits + w.hits,
        partial_hits: r.partial_misses + w.partial_misses,
        full_misses: r.full_misses + r.pass_through + w.full_misses + w.pass_through,
        read_requests: *r,
        write_requests: *w,
        admitted_misses: line_accesses - line_hits - e.bypassed_lines,
        bypasses: tiercache_engine::Bypasses {
            class: e.bypassed_lines,
            ..Default::default()
        },
        insertions: e.extents_stored + e.dup_write_lines,
        evictions: e.extents_evicted,
        write_backs: e.dirty_write_backs,
        ssd_bytes_read: e.ssd_bytes_read,
        ssd_bytes_written: e.ssd_bytes_written,
        hdd_bytes_read: e.hdd_bytes_read,
        hdd_bytes_written: e.hdd_bytes_written,
        ..Default::default()
    }
}

/// The Prometheus text of any live volume: the same metric names for both layouts
/// (`crate::metrics`), then the log layout's own gauges (`tiercache_log_*`).
pub fn prometheus(v: &dyn LiveVolume) -> String {
    let s = v.live_stats();
    let mut o = v.metrics().prometheus(&s.volume);
    if let Some(l) = &s.log {
        log_gauges(&mut o, l);
    }
    volume_metrics(&mut o, &s.volumes);
    o
}

/// Per-volume figures (several volumes) as `tiercache_volume_*{volume="NAME"}`.
fn volume_metrics(o: &mut String, vols: &[crate::volume::VolumeFigures]) {
    if vols.is_empty() {
        return;
    }
    type Get = fn(&crate::volume::VolumeFigures) -> u64;
    let rows: [(&str, &str, &str, Get); 10] = [
        (
            "requests_total",
            "counter",
            "Client requests of the volume.",
            |v| v.counters.requests,
        ),
        (
            "line_hits_total",
            "counter",
            "Line accesses of the volume served from the cache.",
            |v| v.counters.line_hits,
        ),
        (
            "line_misses_total",
            "counter",
            "Line accesses of the volume not in the cache.",
            |v| v.counters.line_misses,
        ),
        (
            "hdd_read_bytes_total",
            "counter",
            "Bytes read from the volume's backing device.",
            |v| v.counters.hdd_bytes_read,
        ),
        (
            "hdd_write_bytes_total",
            "counter",
            "Bytes written to the volume's backing device.",
            |v| v.counters.hdd_bytes_written,
        ),
        (
            "write_backs_total",
            "counter",
            "Dirty lines of the volume written back.",
            |v| v.counters.write_backs,
        ),
        (
            "cached_lines",
            "gauge",
            "Lines of the volume in the cache.",
            |v| v.cached_lines,
        ),
        (
            "dirty_lines",
            "gauge",
            "Lines of the volume not yet on its backing device.",
            |v| v.dirty_lines,
        ),
        (
            "share_min_lines",
            "gauge",
            "Lines other volumes do not evict the volume below (--volume-share MIN; 0 without).",
            |v| v.share_min_lines,
        ),
        (
            "share_max_lines",
            "gauge",
            "Lines the volume holds at most (--volume-share MAX; the pool's capacity without).",
            |v| v.share_max_lines,
        ),
    ];
    for (name, kind, help, get) in rows {
        o.push_str(&format!(
            "# HELP tiercache_volume_{name} {help}\n# TYPE tiercache_volume_{name} {kind}\n"
        ));
        for v in vols {
            o.push_str(&format!(
                "tiercache_volume_{name}{{volume=\"{}\"}} {}\n",
                v.name,
                get(v)
            ));
        }
    }
}

/// The log layout's own figures as Prometheus gauges.
fn log_gauges(o: &mut String, s: &LogVolumeStats) {
    let mut g = |name: &str, help: &str, v: f64| {
        o.push_str(&format!(
            "# HELP tiercache_log_{name} {help}\n# TYPE tiercache_log_{name} gauge\ntiercache_log_{name} {v}\n"
        ));
    };
    g(
        "cached_lines",
        "Lines the cache can serve.",
        s.cached_lines as f64,
    );
    g(
        "dirty_lines",
        "Lines not yet on the backing device.",
        s.dirty_lines as f64,
    );
    g(
        "dedup_ratio",
        "Cached lines per stored extent.",
        s.dedup_ratio,
    );
    g(
        "compression_ratio",
        "Raw bytes per stored byte over the stored extents.",
        s.compression_ratio,
    );
    g(
        "effective_capacity",
        "Logical bytes cached per SSD byte of segments in use.",
        s.effective_capacity,
    );
    g(
        "ssd_bytes_written",
        "Bytes written to the cache device.",
        s.ssd_bytes_written as f64,
    );
    g(
        "index_bytes_per_entry",
        "RAM of the indices per cached line.",
        s.index_bytes_per_entry,
    );
    g(
        "read_line_hits",
        "Read lines served from the cache.",
        s.engine.read_line_hits as f64,
    );
    g("read_lines", "Read lines.", s.engine.read_lines as f64);
}

/// A volume [`open_volume`] opened, in the layout its superblock names.
pub enum Opened {
    Direct(Box<CacheVolume>, OpenReport),
    Log(Box<LogVolume>, LogOpenReport),
}

/// What [`open_volume`] takes: the open options of each layout (the one the superblock
/// names is used).
#[derive(Default)]
pub struct VolumeOpenOptions {
    pub direct: OpenOptions,
    pub log: LogOpenOptions,
}

/// What a cache device holds, read once from its superblocks: the one place that tells the
/// layouts apart (`serve`, `format`, `check` and [`open_volume`] act on it).
#[derive(Debug)]
pub enum Found {
    /// A direct-layout cache.
    Direct(Superblock),
    /// A log-layout cache.
    Log(LogSuperblock),
    /// The log layout's magic with a superblock that does not verify (the error says why).
    DamagedLog(io::Error),
    /// No valid superblock of either layout; why the direct layout's does not read
    /// ([`FormatError::BadMagic`]: no cache at all, else a damaged direct-layout cache).
    NoCache(FormatError),
}

impl Found {
    /// `"log"` or `"direct"` for a cache of that layout (damaged or not), `None` for none.
    pub fn layout(&self) -> Option<&'static str> {
        match self {
            Found::Log(_) | Found::DamagedLog(_) => Some("log"),
            Found::Direct(_) => Some("direct"),
            Found::NoCache(FormatError::BadMagic) => None,
            Found::NoCache(_) => Some("direct"),
        }
    }

    /// The cache's uuid, if a valid superblock of either layout names one.
    pub fn uuid(&self) -> Option<[u8; 16]> {
        match self {
            Found::Direct(sb) => Some(sb.uuid),
            Found::Log(sb) => Some(sb.uuid),
            _ => None,
        }
    }
}

/// Reads what `cache` holds (see [`Found`]). Errors: the device cannot be read (the log
/// layout's superblock is read first; a direct-layout read error is [`Found::NoCache`] with
/// [`FormatError::Io`]).
pub fn probe(cache: &dyn BlockDev) -> io::Result<Found> {
    match crate::log_volume::read_log_superblock(cache) {
        Ok(Some(sb)) => return Ok(Found::Log(sb)),
        Ok(None) => {}
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(Found::DamagedLog(e)),
        Err(e) => return Err(e),
    }
    Ok(match crate::volume::read_superblock(cache) {
        Ok(sb) => Found::Direct(sb),
        Err(e) => Found::NoCache(e),
    })
}

/// Which layout `cache` holds: `Some("log")`, `Some("direct")`, or `None` (no cache).
pub fn layout_of(cache: &dyn BlockDev) -> io::Result<Option<&'static str>> {
    match probe(cache)? {
        Found::Log(_) => Ok(Some("log")),
        Found::DamagedLog(e) => Err(e),
        Found::Direct(_) => Ok(Some("direct")),
        Found::NoCache(_) => Ok(None),
    }
}

/// Opens the cache on `cache` in front of `backing`, in the layout its superblock names.
pub fn open_volume(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    o: &VolumeOpenOptions,
) -> io::Result<Opened> {
    match layout_of(&*cache)? {
        Some("log") => {
            let (v, r) = LogVolume::open_opts(cache, backing, &o.log)?;
            Ok(Opened::Log(Box::new(v), r))
        }
        _ => {
            let (v, r) = CacheVolume::open(cache, backing, &o.direct).map_err(io::Error::other)?;
            Ok(Opened::Direct(Box::new(v), r))
        }
    }
}
