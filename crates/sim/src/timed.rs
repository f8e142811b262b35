//! Timed replay: the engine's plans executed against device timing models on a simulated
//! clock (discrete events; no wall clock).
//!
//! Two drives: **open loop** (requests arrive at their trace timestamps divided by a speed-up
//! factor; when the devices cannot keep up, queueing delay shows in the latency) and **closed
//! loop** (N requests outstanding, a new one issued as each completes, like fio or IOmeter at
//! a queue depth).
//!
//! A plan's steps become device operations with these dependencies, within one request:
//! a `WriteSsd` waits for the plan's earlier `ReadHdd` fills (its buffer) and `WriteBack`s
//! (its slot); a `Populate` waits for earlier `WriteBack`s. `Populate` is an HDD read then an
//! SSD write, `WriteBack` an SSD read then an HDD write. A read request completes when its
//! reads are done — population (SSD writes, group fills, victim write-backs) continues in the
//! background and contends for the devices as it would in reality. A write request completes
//! when all its steps but group population are done. Watermark cleaning runs in the
//! background in LBA order, one write-back at a time, and only while the HDD has no foreground
//! work queued: it yields to foreground I/O. As live, a cleaning pass is *begun* in the engine
//! when it is queued ([`Engine::begin_clean`]: its lines pinned, never a victim or reused,
//! their sectors pending) and completed when the last of its write-backs has reached the HDD
//! ([`Engine::complete_writeback`]), so evictions meanwhile take other victims, as the live
//! volume's do, instead of waiting for a write-back that has not been issued yet.
//!
//! The engine decides at issue time, so a line counts as cached from the moment its miss is
//! processed, while its copy to the SSD (a miss's fill, group population) is still in flight.
//! A later SSD read of that slot (a hit, a victim's write-back) waits for the copy, and so
//! does a later SSD write of it (a write hit, the copy of a reused slot), which the copy
//! would otherwise overwrite with older bytes; the copy stops yielding to foreground HDD work
//! while a request waits for it (issue 18: reads were served by the SSD before their data
//! was there, a backlog of copies made a cache warm at once, and writes finished before the
//! copy they must follow). Such requests still count as hits; `PhaseCounters::fill_waits`
//! counts them.
//!
//! The log layout (a spec with `log`) runs the same executor on the log engine's plans
//! ([`LogTimed`]): a sealed segment is one large sequential SSD write (waiting for the dirty
//! extents of the segment it reuses to be written back: SSD reads, then HDD writes), a miss an
//! HDD read, a write-through write an HDD write. The log engine cleans no dirty lines by
//! watermark: write-backs happen when a segment is reclaimed, inside the plan that reclaims it.

use crate::ssd_pool::SsdPool;
use crate::{Input, SimSpec};
use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::VecDeque;
use tiercache_devices::{Checked, Completion, Device, IoKind, IoOp};
use tiercache_engine::{Engine, Op, RamTier, Request, Step, WbTicket};

/// How requests are issued.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Drive {
    /// Trace timestamps divided by `speedup`.
    Open { speedup: f64 },
    /// `queue_depth` requests outstanding at all times.
    Closed { queue_depth: u32 },
}

/// Settings of a timed run besides the cache.
#[derive(Clone, Debug)]
pub struct TimedOptions {
    pub drive: Drive,
    /// Width of the time-series windows.
    pub window_ns: u64,
    /// Write-back: clean dirty lines whenever the HDD is idle, not only above the high
    /// watermark (so that victims are clean when they are evicted).
    pub idle_clean: bool,
    /// Request indices (0-based, ascending) where phases start (e.g. the fileserver
    /// workload's phases); each phase's duration is reported in [`TimedResult::phase_s`].
    pub phase_starts: Vec<u64>,
    /// Request index (0-based) before which a full flush starts, as `ctl flush` does live:
    /// every dirty line is begun as cleaning passes of [`FLUSH_PASS_LINES`] lines and
    /// written back in the background (LBA order, chunk rewrites, one backing write at a
    /// time, yielding to foreground HDD work) while the requests go on. `None`: no flush.
    pub flush_at: Option<u64>,
    /// Bytes the input spans when it declares it (a generated workload's volume, e.g. the
    /// fileserver's 1 TB): [`run_timed`] refuses a backing device smaller than it, whose
    /// replay would map offsets modulo the device and fold the volume onto it. `None`: not
    /// declared (a trace; requests beyond the device are counted in
    /// [`TimedResult::wrapped_requests`]).
    pub volume_bytes: Option<u64>,
    /// Member `d` of a pool of cache devices (`--ssd` repeated) fails `ns` after the first
    /// arrival, as `fail_member` does live: [`Engine::fail_device`] drops its clean lines
    /// (re-read from the backing device on their next miss) and its dirty ones (lost: the
    /// failed device cannot be read to write them back); the rest of the replay runs on the
    /// surviving members. Retried at every event while a write-back in flight pins one of its
    /// slots (the live volume reaps its write-backs first). `None`: no failure.
    pub fail_ssd: Option<(usize, u64)>,
    /// Cache copies of each dirty line in a pool of cache devices (`--dirty-copies`, as
    /// `serve --dirty-copies`): `None` = the live default, 2 when the pool or one of its
    /// volumes runs write-back on two or more members (each dirty line written to two
    /// members, so a member failure loses none), else 1.
    pub dirty_copies: Option<u8>,
    /// Request index (0-based) from which the run is measured: the requests before it go
    /// through the cache (warming it, as a warm-cache experiment does) but are not counted in
    /// IOPS, MB/s, latencies or [`TimedResult::measured_read_hit_ratio`]; the measured time
    /// runs from the issue of this request to the last completion. 0: all of it is measured.
    /// The time series (`series`) and the simulation report still cover the whole run.
    pub measure_from: u64,
}

/// What happened when a pool member failed ([`TimedOptions::fail_ssd`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SsdFailure {
    pub member: usize,
    /// Simulated seconds after the first arrival when it failed (at or after the time asked
    /// for: the first event past it with no write-back in flight on the member).
    pub at_s: f64,
    /// Clean lines dropped from the cache (their data is on the backing device).
    pub dropped_clean: u64,
    /// Dirty lines that were only on the failed member: lost (as the live server with
    /// `--dirty-copies 1` and an unreadable member).
    pub lost_dirty_lines: u64,
    /// Dirty lines of the failed member served from their copy on another member from then
    /// on (`--dirty-copies 2`), as the live server promotes them.
    pub promoted_dirty_lines: u64,
    /// Cache device operations planned before the failure that reached the failed member
    /// after it (in flight or queued behind an HDD read); none are planned after it.
    pub late_ops: u64,
}

/// Lines per cleaning pass of [`flush_time`].
pub const FLUSH_PASS_LINES: u64 = 1024;
/// Lines per watermark cleaning pass and per pass of a flush during a replay: the live
/// cleaner's passes (`CLEAN_PASS_LINES` 64, `FLUSH_PASS_MAX` 256 in
/// crates/server/src/volume/mod.rs). One pass is begun at a time, when the previous one has
/// been issued, so the lines pinned stay as few as live (an eviction whose victim is pinned
/// looks past every pinned line: thousands pinned made DSS replays quadratic).
const CLEAN_PASS_LINES: u64 = 64;
const FLUSH_PASS_LIVE: u64 = 256;

/// Lines written back per idle-time cleaning pass.
const IDLE_CLEAN_BATCH: u64 = 4;
/// The HDD must have been idle this long before idle-time cleaning starts (so that a closed
/// loop's next request, which follows at once, is not made to wait).
pub const IDLE_CLEAN_AFTER_NS: u64 = 20_000_000;

impl Default for TimedOptions {
    fn default() -> Self {
        TimedOptions {
            drive: Drive::Closed { queue_depth: 1 },
            window_ns: 1_000_000_000,
            idle_clean: true,
            phase_starts: Vec::new(),
            flush_at: None,
            volume_bytes: None,
            fail_ssd: None,
            dirty_copies: None,
            measure_from: 0,
        }
    }
}

/// Latency summary of one kind of request, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// The distribution: `[latency_us, cumulative share]` at fixed quantiles (1 % steps, then
    /// 99.9 %, 99.99 % and the maximum), for latency CDF plots.
    pub cdf: Vec<[f64; 2]>,
}

/// Quantiles at which [`LatencySummary::cdf`] is sampled.
fn cdf_quantiles() -> impl Iterator<Item = f64> {
    (1..100)
        .map(|i| i as f64 / 100.0)
        .chain([0.999, 0.9999, 1.0])
}

impl LatencySummary {
    fn from(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            cdf: cdf_quantiles()
                .map(|q| [us(h.value_at_quantile(q)), q])
                .collect(),
        }
    }
}

/// Latency per request kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latencies {
    pub all: LatencySummary,
    pub read: LatencySummary,
    pub write: LatencySummary,
}

/// One window of the time series.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Window {
    /// Window start, seconds of simulated time.
    pub t_s: f64,
    /// Requests completed in the window, per second.
    pub iops: f64,
    pub mb_per_s: f64,
    /// Line hit ratio of the requests issued in the window.
    pub hit_ratio: f64,
    /// Dirty lines / capacity at the end of the window.
    pub dirty_share: f64,
    /// Cached lines per I/O class at the end of the window (a line belongs to the class of
    /// the last request that touched it; lines populated as the rest of a group, which no
    /// request touched, count for class 0).
    pub class_lines: std::collections::BTreeMap<u8, u64>,
}

/// What happened during one phase (differences of the counters between its first request's
/// issue and the next phase's; the last phase's run to the end of the replay, drain
/// included). Finds where a phase's time goes: write-backs the requests waited for, dirty
/// evictions, class bypasses, and the HDD's busy time by direction.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PhaseCounters {
    /// Lines written back (planned by the engine) during the phase.
    pub write_backs: u64,
    /// Evictions of dirty lines (written back in the request's path).
    pub dirty_evictions: u64,
    pub evictions: u64,
    /// Lines written around the cache because a class was not admitted (DSS).
    pub class_bypasses: u64,
    /// Requests that had to wait for a cleaning write-back of a slot they reuse.
    pub wb_waits: u64,
    /// Requests that read or wrote a cache slot whose copy (a miss's fill, group
    /// population) was still in flight, and waited for it.
    pub fill_waits: u64,
    pub hdd_read_busy_s: f64,
    pub hdd_write_busy_s: f64,
    pub hdd_bytes_read: u64,
    pub hdd_bytes_written: u64,
}

impl PhaseCounters {
    fn minus(&self, o: &PhaseCounters) -> PhaseCounters {
        PhaseCounters {
            write_backs: self.write_backs - o.write_backs,
            dirty_evictions: self.dirty_evictions - o.dirty_evictions,
            evictions: self.evictions - o.evictions,
            class_bypasses: self.class_bypasses - o.class_bypasses,
            wb_waits: self.wb_waits - o.wb_waits,
            fill_waits: self.fill_waits - o.fill_waits,
            hdd_read_busy_s: self.hdd_read_busy_s - o.hdd_read_busy_s,
            hdd_write_busy_s: self.hdd_write_busy_s - o.hdd_write_busy_s,
            hdd_bytes_read: self.hdd_bytes_read - o.hdd_bytes_read,
            hdd_bytes_written: self.hdd_bytes_written - o.hdd_bytes_written,
        }
    }
}

/// Busy time and utilisation of one device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceUse {
    pub name: String,
    pub busy_s: f64,
    /// Busy time attributed to reads (writes): while both are in the device, its time is
    /// split by their op counts (so read + write = busy, flushes and trims aside).
    pub read_busy_s: f64,
    pub write_busy_s: f64,
    pub utilisation: f64,
    pub ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// What a timed run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimedResult {
    pub drive: String,
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub mb_per_s: f64,
    pub read_mb_per_s: f64,
    pub write_mb_per_s: f64,
    pub latency_us: Latencies,
    /// Simulated time from the first arrival (the first measured one with
    /// [`TimedOptions::measure_from`]) to the last request completion.
    pub elapsed_s: f64,
    /// Simulated time until background work (population, cleaning) also finished.
    pub drained_s: f64,
    pub hdd: DeviceUse,
    pub ssd: Option<DeviceUse>,
    /// Per member of a pool of several cache devices (`--ssd` repeated), in pool order;
    /// `ssd` is the pool as one device. Empty (and absent from JSON) with one cache device.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ssd_members: Vec<DeviceUse>,
    /// The pool member that failed during the run ([`TimedOptions::fail_ssd`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssd_failure: Option<SsdFailure>,
    /// The `ram` device model serving the RAM tier's hits (`--ram-cache`; absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram_device: Option<DeviceUse>,
    /// Time until the windowed hit ratio first reaches 95 % of its final steady value
    /// (the mean of the last 10 % of windows); None without a cache or without hits.
    pub warmup_s: Option<f64>,
    /// Time until the windowed IOPS first reaches 95 % of its final steady value (the mean
    /// of the last 10 % of whole windows): what "the IOPS is almost at the top and stable"
    /// measures (Qsan). Later than `warmup_s`: near the top, every miss still costs a disk
    /// access, so IOPS keeps climbing after the hit ratio looks warm.
    pub warmup_iops_s: Option<f64>,
    /// Why warm-up is not reported when a cache was there (too few windows, or warm within
    /// the first window): a number there would be an artefact of the window size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_note: Option<String>,
    /// Device operations that failed (fault injection).
    pub device_errors: u64,
    /// Requests that ended beyond the backing device: offsets are mapped modulo the device,
    /// so the trace was folded onto it (`wrap_note` says which request and the sizes).
    pub wrapped_requests: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wrap_note: Option<String>,
    /// Seconds per phase when [`TimedOptions::phase_starts`] was given (a phase runs from the
    /// issue of its first request to the issue of the next phase's first request, the last
    /// one to the last completion).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phase_s: Vec<f64>,
    /// What happened in each phase (same phases as `phase_s`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phase_counters: Vec<PhaseCounters>,
    /// [`TimedOptions::measure_from`]: the requests before this index warmed the cache and
    /// are not in the figures above (absent when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub measured_from: u64,
    /// With `measured_from`: read line hits / read lines of the measured requests only (the
    /// simulation report's read-hit ratio covers the warm-up too). None without a warm-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_read_hit_ratio: Option<f64>,
    pub series: Vec<Window>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dev {
    Hdd,
    Ssd,
    /// The RAM tier's memory (`--ram-cache`): serves RAM hits.
    Ram,
}

/// One device operation of a plan, possibly followed by a second one (composite steps).
#[derive(Clone, Debug)]
struct Task {
    dev: Dev,
    op: IoOp,
    then: Option<(Dev, IoOp)>,
    deps_left: u32,
    dependents: Vec<u16>,
    foreground: bool,
    /// A background task that a foreground request now waits for (a cleaning write-back
    /// whose slot is being reused): its HDD stage no longer yields to foreground work.
    urgent: bool,
    /// Whether its HDD stage was submitted (and counted) as foreground work.
    hdd_fg: bool,
}

/// A request (or a cleaning pass) in flight.
struct Flight {
    arrival_ns: u64,
    is_read: bool,
    is_write: bool,
    bytes: u64,
    tasks: Vec<Task>,
    fg_left: u32,
    all_left: u32,
    done: bool,
    background: bool,
    /// Counted in the figures (not a warm-up request, [`TimedOptions::measure_from`]).
    measured: bool,
}

/// Largest HDD write that merged write-backs make: the live volume's (`MAX_MERGED_WRITE` in
/// crates/server/src/volume/mod.rs), so a flush of dense chunks times as it runs live.
const MAX_MERGED_WB: u64 = 4 << 20;

/// Converts one plan into tasks with their dependencies.
fn tasks_of(steps: &[Step], is_write: bool, hdd_cap: u64, ssd_cap: u64, fua: bool) -> Vec<Task> {
    let h = |off: u64| off % hdd_cap.max(1);
    let s = |off: u64| off % ssd_cap.max(1);
    let io = |kind, offset, len| IoOp {
        kind,
        offset,
        len,
        fua: false,
    };
    let mut tasks: Vec<Task> = Vec::with_capacity(steps.len());
    let mut fills: Vec<u16> = Vec::new();
    let mut wbs: Vec<u16> = Vec::new();
    // The HDD write of the last write-back: (task, volume, end offset). Victims of one
    // request are evicted between its SSD writes; merging across those is safe, as the
    // merged write only waits for victims' SSD reads, which wait for nothing.
    let mut wb_run: Option<(u16, u32, u64)> = None;
    // The HDD read of the current run's chunk-rewrite gaps (`CopyHdd`): one read spanning
    // them all, as the live volume makes it.
    let mut gap_read: Option<u16> = None;
    for step in steps {
        let idx = tasks.len() as u16;
        if let Step::WriteBack { vol, hdd, len, .. } | Step::CopyHdd { vol, hdd, len } = *step {
            // A write-back is an SSD read feeding an HDD write; a chunk rewrite's gap an HDD
            // read feeding it. Write-backs of contiguous HDD ranges (victims inserted
            // together, LBA-ordered cleaning, chunk rewrites) share one HDD write, as a real
            // cleaner merges them: one seek instead of one per line.
            let (w, merged) = match wb_run {
                Some((w, v, end))
                    if v == vol
                        && end == hdd
                        && tasks[w as usize].op.len + len <= MAX_MERGED_WB =>
                {
                    let t = &mut tasks[w as usize];
                    t.op.len += len;
                    (w, true)
                }
                _ => (idx, false),
            };
            if !merged {
                tasks.push(Task {
                    dev: Dev::Hdd,
                    op: io(IoKind::Write, h(hdd), len),
                    then: None,
                    deps_left: 0,
                    dependents: Vec::new(),
                    foreground: is_write,
                    urgent: false,
                    hdd_fg: false,
                });
                wbs.push(idx);
                gap_read = None;
            }
            wb_run = Some((w, vol, hdd + len));
            let read = match *step {
                Step::WriteBack { ssd, .. } => Some((Dev::Ssd, s(ssd))),
                _ => match gap_read {
                    Some(g) => {
                        // Extend the run's gap read to this gap's end.
                        let t = &mut tasks[g as usize];
                        t.op.len = h(hdd) + len - t.op.offset;
                        None
                    }
                    None => {
                        gap_read = Some(tasks.len() as u16);
                        Some((Dev::Hdd, h(hdd)))
                    }
                },
            };
            if let Some((dev, offset)) = read {
                tasks.push(Task {
                    dev,
                    op: io(IoKind::Read, offset, len),
                    then: None,
                    deps_left: 0,
                    dependents: vec![w],
                    foreground: is_write,
                    urgent: false,
                    hdd_fg: false,
                });
                tasks[w as usize].deps_left += 1;
            }
            continue;
        }
        let (dev, op, then, deps, fg): (Dev, IoOp, Option<(Dev, IoOp)>, Vec<u16>, bool) =
            match *step {
                Step::ReadSsd { ssd, len, .. } => {
                    (Dev::Ssd, io(IoKind::Read, s(ssd), len), None, vec![], true)
                }
                Step::ReadHdd { hdd, len, .. } => {
                    fills.push(idx);
                    (Dev::Hdd, io(IoKind::Read, h(hdd), len), None, vec![], true)
                }
                Step::WriteHdd { hdd, len, .. } => {
                    let mut op = io(IoKind::Write, h(hdd), len);
                    op.fua = fua;
                    (Dev::Hdd, op, None, vec![], true)
                }
                Step::WriteSsd { ssd, len, .. } => {
                    let deps = fills.iter().chain(&wbs).copied().collect();
                    (
                        Dev::Ssd,
                        io(IoKind::Write, s(ssd), len),
                        None,
                        deps,
                        is_write,
                    )
                }
                Step::Populate { hdd, ssd, len, .. } => (
                    Dev::Hdd,
                    io(IoKind::Read, h(hdd), len),
                    Some((Dev::Ssd, io(IoKind::Write, s(ssd), len))),
                    wbs.clone(),
                    false,
                ),
                Step::WriteBack { .. } | Step::CopyHdd { .. } => unreachable!("handled above"),
                Step::TrimSsd { ssd, len } => {
                    (Dev::Ssd, io(IoKind::Trim, s(ssd), len), None, vec![], true)
                }
                Step::TrimHdd { hdd, len, .. } => {
                    (Dev::Hdd, io(IoKind::Trim, h(hdd), len), None, vec![], true)
                }
                Step::FlushSsd => (Dev::Ssd, io(IoKind::Flush, 0, 0), None, vec![], true),
                Step::FlushHdd { .. } => (Dev::Hdd, io(IoKind::Flush, 0, 0), None, vec![], true),
            };
        for &d in &deps {
            tasks[d as usize].dependents.push(idx);
        }
        tasks.push(Task {
            dev,
            op,
            then,
            deps_left: deps.len() as u32,
            dependents: Vec::new(),
            foreground: fg,
            urgent: false,
            hdd_fg: false,
        });
    }
    tasks
}

/// The log layout in a timed run: its engine (through [`crate::nitro::LogDriver`], so the FTL
/// figures are counted as in a hit-ratio run) and the content of the requests.
struct LogTimed {
    driver: crate::nitro::LogDriver,
    trace: std::sync::Arc<tiercache_trace::content::ContentTrace>,
    spec: crate::log::LogSpec,
    /// Index of the next request in `trace`.
    next: usize,
    footprint: u64,
}

impl LogTimed {
    /// The log engine of `spec` when it has the log layout and a cache device (`ssd`: name,
    /// capacity); None otherwise (the direct layout, or no cache at all).
    fn for_spec(spec: &SimSpec, ssd: Option<(String, u64)>) -> Result<Option<Self>> {
        let (Some(l), Some((name, ssd_bytes))) = (&spec.log, ssd) else {
            return Ok(None);
        };
        let line = spec.engine.line_size;
        let trace = l.content_trace(&spec.input, line)?;
        if trace.is_empty() {
            return Err(crate::no_requests(&spec.input));
        }
        let (lines, _) = trace.footprint();
        let cap_lines = spec.cache_size.lines(line, lines);
        crate::ensure_some_lines(spec, cap_lines, Some(lines))?;
        let cfg = l
            .config(
                line,
                cap_lines,
                spec.engine.mode,
                spec.engine.policy_params.classes.as_ref(),
            )
            .with_context(|| format!("cache size {}", spec.cache_size))?;
        anyhow::ensure!(
            cfg.capacity_bytes <= ssd_bytes,
            "the log cache ({} bytes) does not fit on the SSD model '{name}' ({ssd_bytes} bytes)",
            cfg.capacity_bytes
        );
        let ftl = crate::nitro::ftl_for(&cfg, l.erase_block);
        Ok(Some(LogTimed {
            driver: crate::nitro::LogDriver::new(cfg, ftl)?.live(true),
            trace,
            spec: l.clone(),
            next: 0,
            footprint: lines,
        }))
    }

    /// The requests, in the order their content was drawn.
    fn requests(&self) -> crate::input::Requests {
        let t = std::sync::Arc::clone(&self.trace);
        Box::new((0..t.len()).map(move |i| Ok(t.requests[i])))
    }

    fn capacity_lines(&self) -> u64 {
        let c = self.driver.config();
        c.capacity_bytes / c.line_size
    }

    /// Hits and accesses so far, counted as [`crate::SimResult`] counts them for the log
    /// layout (read hits and duplicate writes over read and written lines).
    /// Read line (hits, lines) so far.
    fn read_lines(&self) -> (u64, u64) {
        let k = self.driver.counters();
        (k.read_line_hits, k.read_lines)
    }

    fn hits(&self) -> (u64, u64) {
        let k = self.driver.counters();
        (
            k.read_line_hits + k.dup_write_lines,
            k.read_lines + k.write_lines,
        )
    }

    fn result(self, spec: &SimSpec, wall_s: f64) -> Result<crate::SimResult> {
        let cfg = self.driver.config().clone();
        let run = self.driver.finish(&self.trace.name)?;
        Ok(crate::SimResult::from_log(
            spec,
            &self.spec,
            &cfg,
            &run,
            Some(self.footprint),
            wall_s,
        ))
    }
}

/// The write-back(s) planned for the line in one cache slot and not finished yet.
#[derive(Debug, Default)]
struct SlotWriteBack {
    /// The line written back (its engine key): while it still holds the slot, a write to
    /// the slot is that line's own update, not a reuse.
    key: u64,
    /// Sequence numbers of its write-backs still in `bg_queue`.
    queued: Vec<u64>,
    /// Background flights running its write-backs.
    flights: Vec<usize>,
}

/// The discrete-event executor.
struct Executor<'a> {
    engine: Engine,
    /// The RAM tier above the engine and the `ram` device model its hits run on.
    ram: Option<(tiercache_engine::RamTier, Box<dyn Device>)>,
    /// The log layout's engine; `engine` then has no lines.
    log: Option<LogTimed>,
    hdd: &'a mut dyn Device,
    ssd: Option<&'a mut dyn Device>,
    flights: Vec<Option<Flight>>,
    free: Vec<usize>,
    /// Cleaning write-backs waiting for an idle HDD. The entry at index `i` has sequence
    /// number `bg_seq_front + i`.
    bg_queue: VecDeque<Step>,
    bg_seq_front: u64,
    /// Sequence numbers of queued write-backs started early (a slot they free was reused,
    /// see `promote_reused`); skipped when they reach the front.
    bg_cancelled: hashbrown::HashSet<u64>,
    /// Cache slots whose line's planned write-back has not finished yet (the engine counts
    /// the line clean from the moment it plans it).
    pending_wb: hashbrown::HashMap<u64, SlotWriteBack>,
    /// Slots whose write-backs each background flight carries.
    bg_slots: hashbrown::HashMap<usize, Vec<u64>>,
    /// Cleaning passes begun in the engine and not complete, by the sequence number of their
    /// first queued step: (end sequence number, ticket, steps not finished yet).
    wb_open: std::collections::BTreeMap<u64, (u64, WbTicket, usize)>,
    /// Sequence numbers of the queued steps each background flight carries.
    bg_seqs: hashbrown::HashMap<usize, Vec<u64>>,
    /// Requests started so far, and the index before which a flush starts
    /// ([`TimedOptions::flush_at`]).
    started: u64,
    flush_at: Option<u64>,
    /// A flush is under way: passes are begun until nothing is dirty.
    flushing: bool,
    /// Lines the watermark cleaner still owes (down to the low watermark), begun a pass at a
    /// time as the HDD takes them.
    clean_left: u64,
    /// Tasks of request flights waiting for a background flight to finish: the write of a
    /// new line into a slot whose previous line that flight is writing back.
    bg_waiters: hashbrown::HashMap<usize, Vec<(usize, u16)>>,
    /// Cache slots whose copy (a task writing the SSD: a fill or a population) is still in
    /// flight: the last such task (flight, task) of each slot.
    filling: hashbrown::HashMap<u64, (usize, u16)>,
    /// The slots each copy in flight fills, and the tasks waiting to read them.
    fill_slots: hashbrown::HashMap<(usize, u16), Vec<u64>>,
    fill_waiters: hashbrown::HashMap<(usize, u16), Vec<(usize, u16)>>,
    /// log2 of the line size (slot = SSD offset >> line_shift).
    line_shift: u32,
    bg_in_flight: u32,
    hdd_fg_outstanding: u32,
    done: Vec<Completion>,
    device_errors: u64,
    /// Requests that waited for a background write-back of a slot they reuse.
    wb_waits: u64,
    /// Requests that waited for the copy of a slot they read or write
    /// ([`Executor::gate_fills`]).
    fill_waits: u64,
    /// Requests that ended beyond the backing device (folded onto it), and the first one.
    wrapped: u64,
    wrap_note: Option<String>,
    idle_clean: bool,
    hdd_bg_outstanding: u32,
    deferred: VecDeque<(usize, u16, bool)>,
    /// Since when the HDD has had nothing in flight.
    hdd_idle_since: Option<u64>,
    /// A pool member to fail and when ([`TimedOptions::fail_ssd`]), until it has failed.
    fail_ssd: Option<(usize, u64)>,
    ssd_failure: Option<SsdFailure>,
    // metrics
    lat_all: Histogram<u64>,
    lat_read: Histogram<u64>,
    lat_write: Histogram<u64>,
    reads: u64,
    writes: u64,
    read_bytes: u64,
    write_bytes: u64,
    completed: u64,
    /// [`TimedOptions::measure_from`]; whether the request being started is measured; when
    /// the first measured request was issued; measured requests completed; read line
    /// (hits, lines) of the measured requests.
    measure_from: u64,
    measuring: bool,
    measure_start: Option<u64>,
    measured_done: u64,
    measured_read_lines: (u64, u64),
    first_arrival: Option<u64>,
    last_fg_done: u64,
    now: u64,
    window_ns: u64,
    win_done: Vec<(u64, u64)>,
    win_hits: Vec<(u64, u64)>,
    win_dirty: Vec<u64>,
    /// Per-class occupancy: the class of cached lines last touched by a request of a class
    /// other than 0 (class 0 owns the rest, so single-class traces cost nothing here).
    owners: hashbrown::HashMap<u64, u8>,
    /// Lines per class in `owners`. Entries of lines that left the cache are dropped after
    /// each request from the engine's log of unmapped keys (pruning the whole map at every
    /// window instead made a run quadratic in its length).
    owned: [u64; tiercache_engine::NUM_CLASSES],
    win_class: Vec<std::collections::BTreeMap<u8, u64>>,
}

fn op_id(flight: usize, task: u16, second: bool) -> u64 {
    (flight as u64) << 17 | (task as u64) << 1 | second as u64
}

impl<'a> Executor<'a> {
    fn hist() -> Histogram<u64> {
        Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
    }

    fn device(&mut self, dev: Dev) -> &mut dyn Device {
        match dev {
            Dev::Hdd => &mut *self.hdd,
            Dev::Ssd => &mut **self.ssd.as_mut().expect("no SSD, but the plan uses it"),
            Dev::Ram => &mut *self.ram.as_mut().expect("a RAM task without a RAM tier").1,
        }
    }

    fn submit(&mut self, f: usize, t: u16, second: bool) {
        let (dev, op, fg) = {
            let task = &mut self.flights[f].as_mut().expect("live flight").tasks[t as usize];
            let (dev, op) = if second {
                task.then.expect("second stage")
            } else {
                (task.dev, task.op)
            };
            let fg = task.foreground || task.urgent;
            if dev == Dev::Hdd {
                task.hdd_fg = fg;
            }
            (dev, op, fg)
        };
        if dev == Dev::Hdd {
            if fg {
                self.hdd_fg_outstanding += 1;
            } else if self.hdd_fg_outstanding > 0 || self.hdd_bg_outstanding > 0 {
                // Background HDD work yields: it waits until the HDD has no foreground work
                // and runs one operation at a time.
                self.deferred.push_back((f, t, second));
                return;
            } else {
                self.hdd_bg_outstanding += 1;
            }
        }
        if dev == Dev::Ssd && op.kind != IoKind::Flush {
            if let Some(fail) = self.ssd_failure.as_mut() {
                let slot = op.offset >> self.line_shift;
                if self.engine.member_of(slot as u32) == fail.member {
                    fail.late_ops += 1;
                }
            }
        }
        let now = self.now;
        self.device(dev).submit(now, op_id(f, t, second), op);
    }

    /// Fails the pool member of [`TimedOptions::fail_ssd`] once its time has come and no
    /// write-back in flight reads one of its slots (then [`Engine::fail_device`] refuses;
    /// tried again at the next event).
    fn maybe_fail_ssd(&mut self) {
        let Some((d, at)) = self.fail_ssd else {
            return;
        };
        let Some(first) = self.first_arrival else {
            return;
        };
        if self.now < first.saturating_add(at) {
            return;
        }
        if let Ok(loss) = self.engine.fail_device(d) {
            self.fail_ssd = None;
            self.ssd_failure = Some(SsdFailure {
                member: d,
                at_s: (self.now - first) as f64 / 1e9,
                dropped_clean: loss.dropped_clean,
                lost_dirty_lines: loss.uncovered.len() as u64,
                promoted_dirty_lines: loss.promoted,
                late_ops: 0,
            });
        }
    }

    /// Submits deferred background HDD work while the HDD has no foreground work.
    fn run_deferred(&mut self) {
        while self.hdd_fg_outstanding == 0 && self.hdd_bg_outstanding == 0 {
            let Some((f, t, second)) = self.deferred.pop_front() else {
                return;
            };
            self.submit(f, t, second);
        }
    }

    fn alloc_flight(&mut self, fl: Flight) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.flights[i] = Some(fl);
                i
            }
            None => {
                self.flights.push(Some(fl));
                self.flights.len() - 1
            }
        }
    }

    /// Issues one request at `self.now`; returns whether it completed immediately.
    fn start(&mut self, req: &Request, arrival_ns: u64) -> Result<()> {
        self.check_wrap(req);
        if self.flush_at == Some(self.started) && self.log.is_none() {
            // `ctl flush`: passes begun until nothing is dirty, written back in the
            // background ([`Executor::next_pass`]).
            self.flushing = true;
        }
        self.measuring = self.started >= self.measure_from;
        if self.measuring {
            self.measure_start.get_or_insert(arrival_ns);
        }
        self.started += 1;
        if self.log.is_some() {
            return self.start_log(req, arrival_ns);
        }
        self.first_arrival.get_or_insert(arrival_ns);
        self.maybe_fail_ssd();
        // The RAM tier first (`tiercache_sim::step_ram`'s protocol): a hit is one RAM read.
        let mut ram_ticket = None;
        if let Some((ram, _)) = self.ram.as_mut() {
            let mut slots = Vec::new();
            if ram.read(req, &mut slots) {
                let lines = slots.len() as u64;
                let task = Task {
                    dev: Dev::Ram,
                    op: IoOp {
                        kind: IoKind::Read,
                        offset: slots[0] as u64 * ram.line_size(),
                        len: req.len,
                        fua: false,
                    },
                    then: None,
                    deps_left: 0,
                    dependents: Vec::new(),
                    foreground: true,
                    urgent: false,
                    hdd_fg: false,
                };
                if req.op == Op::Read {
                    self.note_read_lines(lines, lines);
                }
                self.fly(req, arrival_ns, vec![task], (lines, lines));
                return Ok(());
            }
            ram_ticket = Some(ram.ticket());
            ram.invalidate(req);
        }
        // Only this request's class changes: read its counters, not the sum of all 32.
        let before = *self.engine.class_counters(req.class);
        let fua = req.fua;
        let (hcap, scap) = (
            self.hdd.capacity_bytes(),
            self.ssd.as_ref().map(|s| s.capacity_bytes()).unwrap_or(1),
        );
        let plan = self.engine.process(req).map_err(anyhow::Error::msg)?;
        if let (Some((ram, _)), Some(t)) = (self.ram.as_mut(), ram_ticket) {
            // Filled at once: the memory copy's time is not modelled (a memcpy of the
            // lines, next to the device read it follows).
            ram.fill(req, t, &mut Vec::new());
        }
        let steps: Vec<Step> = if self.ssd.is_none() && plan.steps.contains(&Step::FlushSsd) {
            // No cache: a FLUSH still plans the cache device's half, which has nothing to
            // make durable (and no device to run on).
            plan.steps
                .iter()
                .filter(|s| **s != Step::FlushSsd)
                .cloned()
                .collect()
        } else {
            plan.steps.clone()
        };
        let waits = self.promote_reused(&steps);
        let mut tasks = tasks_of(&steps, req.op == Op::Write, hcap, scap, fua);
        let gates = self.gate(&mut tasks, &waits);
        let fills = self.gate_fills(&mut tasks);
        self.track_classes(req);
        let after = *self.engine.class_counters(req.class);
        let hits = (
            after.line_hits - before.line_hits,
            after.line_accesses - before.line_accesses,
        );
        self.note_read_lines(
            after.read_line_hits - before.read_line_hits,
            after.read_line_accesses - before.read_line_accesses,
        );
        let f = self.fly(req, arrival_ns, tasks, hits);
        for (t, g) in gates {
            self.bg_waiters.entry(g).or_default().push((f, t));
            if self.flights[f].as_ref().expect("live").tasks[t as usize].foreground {
                self.wb_waits += 1;
                self.hurry(g);
            }
        }
        self.wait_fills(f, &fills);
        if self.engine.needs_cleaning() {
            self.clean_left = self.clean_left.max(self.engine.cleaning_target());
        }
        self.kick_background();
        Ok(())
    }

    /// Begins the next cleaning pass when none is queued: a flush's, or the watermark
    /// cleaner's while it owes lines.
    fn next_pass(&mut self) {
        if self.flushing {
            if self.engine.dirty_lines() > 0 {
                self.begin_clean(FLUSH_PASS_LIVE);
                return;
            }
            self.flushing = false;
        }
        if self.clean_left == 0 {
            return;
        }
        let before = self.engine.dirty_lines();
        self.begin_clean(self.clean_left.min(CLEAN_PASS_LINES));
        let cleaned = before.saturating_sub(self.engine.dirty_lines());
        self.clean_left = if cleaned == 0 {
            0
        } else {
            self.clean_left.saturating_sub(cleaned)
        };
    }

    /// Begins a cleaning pass of at most `n` lines in the engine (its lines pinned until its
    /// write-backs have finished, [`Executor::release_bg`]) and queues its steps.
    fn begin_clean(&mut self, n: u64) {
        let Some((ticket, steps)) = self
            .engine
            .begin_clean(n)
            .map(|b| (b.ticket, b.plan.steps.clone()))
        else {
            return;
        };
        if steps.is_empty() {
            self.engine.complete_writeback(ticket, &[]);
            return;
        }
        let first = self.bg_seq_front + self.bg_queue.len() as u64;
        self.wb_open
            .insert(first, (first + steps.len() as u64, ticket, steps.len()));
        self.enqueue_clean(&steps);
    }

    /// Queued step `seq` has finished: completes its cleaning pass in the engine when it was
    /// the pass's last.
    fn finish_queued(&mut self, seq: u64) {
        let Some((&first, e)) = self.wb_open.range_mut(..=seq).next_back() else {
            return;
        };
        if seq >= e.0 {
            return;
        }
        e.2 -= 1;
        if e.2 == 0 {
            let ticket = e.1;
            self.wb_open.remove(&first);
            self.engine.complete_writeback(ticket, &[]);
        }
    }

    /// Queues cleaning write-backs (begun in the engine: their lines count clean, pinned)
    /// and notes which slots they read.
    fn enqueue_clean(&mut self, steps: &[Step]) {
        for st in steps {
            if let Step::WriteBack { vol, ssd, hdd, .. } = *st {
                let seq = self.bg_seq_front + self.bg_queue.len() as u64;
                let p = self.pending_wb.entry(ssd >> self.line_shift).or_default();
                p.key = Engine::line_key(vol, hdd >> self.line_shift);
                p.queued.push(seq);
            }
            self.bg_queue.push_back(*st);
        }
    }

    /// Drops queue entries that were promoted into a request from the queue's front.
    fn skip_cancelled(&mut self) {
        while !self.bg_queue.is_empty() && self.bg_cancelled.remove(&self.bg_seq_front) {
            self.bg_queue.pop_front();
            self.bg_seq_front += 1;
        }
    }

    /// The next queued cleaning step and its sequence number.
    fn pop_bg(&mut self) -> Option<(u64, Step)> {
        self.skip_cancelled();
        let st = self.bg_queue.pop_front()?;
        self.bg_seq_front += 1;
        Some((self.bg_seq_front - 1, st))
    }

    /// A plan writes new data into cache slots (`WriteSsd`, `Populate`). Where a slot's
    /// previous line still has a planned write-back that has not finished, the slot is being
    /// reused before that line's data is on the HDD, which no real cache can do. A write-back
    /// still queued starts now, with the queued write-backs it would have been merged with
    /// (contiguous on the HDD, as the cleaner merges them), as its own flight. Returns the
    /// reused slots with the flights writing their previous lines back, for [`Self::gate`].
    fn promote_reused(&mut self, steps: &[Step]) -> Vec<(u64, Vec<usize>)> {
        let mut waits: Vec<(u64, Vec<usize>)> = Vec::new();
        if self.pending_wb.is_empty() {
            return waits;
        }
        for st in steps {
            let (Step::WriteSsd { ssd, .. } | Step::Populate { ssd, .. }) = *st else {
                continue;
            };
            let slot = ssd >> self.line_shift;
            if waits.iter().any(|(s, _)| *s == slot) {
                continue;
            }
            let Some(p) = self.pending_wb.get(&slot) else {
                continue;
            };
            if self.engine.lookup(p.key) == Some(slot as tiercache_engine::policy::Slot) {
                // The line written back still holds the slot: this is its own update.
                continue;
            }
            while let Some(&seq) = self.pending_wb.get(&slot).and_then(|p| p.queued.first()) {
                let (run, seqs) = self.queued_run(seq);
                self.launch_bg_run(&run, &seqs);
            }
            let flights = self
                .pending_wb
                .get(&slot)
                .map(|p| p.flights.clone())
                .unwrap_or_default();
            if !flights.is_empty() {
                waits.push((slot, flights));
            }
        }
        waits
    }

    /// Takes the queued write-back `seq` out of the queue with its queued neighbours that
    /// the cleaner would have merged into the same HDD write (contiguous on the HDD, at most
    /// `MAX_MERGED_WB` bytes); they stay in the deque, cancelled, until they reach its front.
    fn queued_run(&mut self, seq: u64) -> (Vec<Step>, Vec<u64>) {
        let range = |st: &Step| match *st {
            Step::WriteBack { vol, hdd, len, .. } | Step::CopyHdd { vol, hdd, len } => {
                Some((vol, hdd, len))
            }
            _ => None,
        };
        let joins = |a: &Step, b: &Step| match (range(a), range(b)) {
            (Some((v1, h1, l1)), Some((v2, h2, _))) => v1 == v2 && h1 + l1 == h2,
            _ => false,
        };
        let i0 = (seq - self.bg_seq_front) as usize;
        let len_of = |st: &Step| st.bytes().3;
        let mut bytes = len_of(&self.bg_queue[i0]);
        let (mut lo, mut hi) = (i0, i0);
        while lo > 0
            && !self
                .bg_cancelled
                .contains(&(self.bg_seq_front + lo as u64 - 1))
            && joins(&self.bg_queue[lo - 1], &self.bg_queue[lo])
            && bytes + len_of(&self.bg_queue[lo - 1]) <= MAX_MERGED_WB
        {
            lo -= 1;
            bytes += len_of(&self.bg_queue[lo]);
        }
        while hi + 1 < self.bg_queue.len()
            && !self
                .bg_cancelled
                .contains(&(self.bg_seq_front + hi as u64 + 1))
            && joins(&self.bg_queue[hi], &self.bg_queue[hi + 1])
            && bytes + len_of(&self.bg_queue[hi + 1]) <= MAX_MERGED_WB
        {
            hi += 1;
            bytes += len_of(&self.bg_queue[hi]);
        }
        let seqs: Vec<u64> = (lo..=hi).map(|i| self.bg_seq_front + i as u64).collect();
        let run: Vec<Step> = (lo..=hi).map(|i| self.bg_queue[i]).collect();
        self.bg_cancelled.extend(seqs.iter().copied());
        (run, seqs)
    }

    /// Starts a run of cleaning steps (taken out of the queue; `seqs` their sequence
    /// numbers) as one background flight; reusing their slots now waits for it.
    fn launch_bg_run(&mut self, run: &[Step], seqs: &[u64]) -> usize {
        let (hcap, scap) = (
            self.hdd.capacity_bytes(),
            self.ssd.as_ref().map(|s| s.capacity_bytes()).unwrap_or(1),
        );
        let mut tasks = tasks_of(run, false, hcap, scap, false);
        for t in &mut tasks {
            t.foreground = false;
        }
        let fills = self.gate_fills(&mut tasks);
        let n = tasks.len() as u32;
        let f = self.alloc_flight(Flight {
            arrival_ns: self.now,
            is_read: false,
            is_write: false,
            bytes: 0,
            tasks,
            fg_left: 0,
            all_left: n,
            done: true,
            background: true,
            measured: false,
        });
        self.bg_in_flight += n;
        let mut slots = Vec::new();
        for (st, seq) in run.iter().zip(seqs) {
            if let Step::WriteBack { ssd, .. } = *st {
                let slot = ssd >> self.line_shift;
                let p = self
                    .pending_wb
                    .get_mut(&slot)
                    .expect("a queued write-back's slot is pending");
                p.queued.retain(|q| q != seq);
                p.flights.push(f);
                slots.push(slot);
            }
        }
        if !slots.is_empty() {
            self.bg_slots.insert(f, slots);
        }
        self.bg_seqs.insert(f, seqs.to_vec());
        self.wait_fills(f, &fills);
        self.launch_ready(f);
        self.track_idle();
        f
    }

    /// The cache slots an SSD operation covers.
    fn slots_of(&self, op: &IoOp) -> std::ops::RangeInclusive<u64> {
        let first = op.offset >> self.line_shift;
        first..=(op.offset + op.len.max(1) - 1) >> self.line_shift
    }

    /// Makes the tasks of a new flight that read or write the SSD wait for the copies still
    /// in flight into the slots they touch. A read (a hit, a write-back) finds the data on
    /// the SSD only once its copy completed; a write (a write hit, a fill or population of
    /// a reused slot) issued before the copy completed would be overwritten by it with
    /// older bytes, so it goes after. Returns (task, copy) pairs for
    /// [`Executor::wait_fills`].
    fn gate_fills(&self, tasks: &mut [Task]) -> Vec<(u16, (usize, u16))> {
        let mut out = Vec::new();
        if self.filling.is_empty() {
            return out;
        }
        for (i, t) in tasks.iter_mut().enumerate() {
            // The task's SSD operation: its own, or the SSD write a population feeds.
            let ssd_op = match (t.dev, t.op.kind, t.then) {
                (Dev::Ssd, IoKind::Read | IoKind::Write, _) => t.op,
                (_, _, Some((Dev::Ssd, op))) if op.kind == IoKind::Write => op,
                _ => continue,
            };
            let mut copies: Vec<(usize, u16)> = self
                .slots_of(&ssd_op)
                .filter_map(|s| self.filling.get(&s).copied())
                .collect();
            copies.sort_unstable();
            copies.dedup();
            for c in copies {
                t.deps_left += 1;
                out.push((i as u16, c));
            }
        }
        out
    }

    /// Registers flight `f`'s waits on copies in flight ([`Executor::gate_fills`]; a copy a
    /// foreground task waits for stops yielding to foreground HDD work), then its own
    /// copies: tasks writing the SSD, each the copy of the slots it writes from now on.
    fn wait_fills(&mut self, f: usize, fills: &[(u16, (usize, u16))]) {
        let mut waited = false;
        for &(t, c) in fills {
            self.fill_waiters.entry(c).or_default().push((f, t));
            if self.flights[f].as_ref().expect("live").tasks[t as usize].foreground {
                waited = true;
                self.hurry_task(c);
            }
        }
        self.fill_waits += u64::from(waited);
        let n = self.flights[f].as_ref().map_or(0, |x| x.tasks.len());
        for t in 0..n as u16 {
            let task = &self.flights[f].as_ref().expect("live").tasks[t as usize];
            let ssd_write = match (task.dev, task.op.kind, task.then) {
                (Dev::Ssd, IoKind::Write, _) => task.op,
                (_, _, Some((Dev::Ssd, op))) if op.kind == IoKind::Write => op,
                _ => continue,
            };
            let slots: Vec<u64> = self.slots_of(&ssd_write).collect();
            for &s in &slots {
                self.filling.insert(s, (f, t));
            }
            self.fill_slots.insert((f, t), slots);
        }
    }

    /// Task `t` of flight `f` has finished: if it was a copy, its slots hold their data and
    /// the reads waiting for it may go.
    fn copy_done(&mut self, f: usize, t: u16) {
        let Some(slots) = self.fill_slots.remove(&(f, t)) else {
            return;
        };
        for s in slots {
            if self.filling.get(&s) == Some(&(f, t)) {
                self.filling.remove(&s);
            }
        }
        for (wf, wt) in self.fill_waiters.remove(&(f, t)).unwrap_or_default() {
            self.wait_over(wf, wt);
        }
    }

    /// One thing task `wt` of flight `wf` waited for outside its flight has finished; the
    /// task starts when it was the last.
    fn wait_over(&mut self, wf: usize, wt: u16) {
        let task = &mut self.flights[wf]
            .as_mut()
            .expect("a waiting flight is live")
            .tasks[wt as usize];
        debug_assert!(task.deps_left > 0 && task.deps_left != u32::MAX);
        task.deps_left -= 1;
        if task.deps_left == 0 {
            task.deps_left = u32::MAX;
            self.submit(wf, wt, false);
        }
    }

    /// A foreground request waits for task `t` of flight `f` (a copy): its HDD stage stops
    /// yielding to foreground work, and starts now if it was deferred.
    fn hurry_task(&mut self, (f, t): (usize, u16)) {
        let Some(fl) = self.flights[f].as_mut() else {
            return;
        };
        fl.tasks[t as usize].urgent = true;
        let mut now = Vec::new();
        self.deferred.retain(|&d| {
            let hit = d.0 == f && d.1 == t;
            if hit {
                now.push(d);
            }
            !hit
        });
        for (f, t, second) in now {
            self.submit(f, t, second);
        }
    }

    /// Makes the tasks that write a slot in `waits` also wait for the background flights
    /// writing that slot's previous line back; returns (task, flight) pairs to register once
    /// the request's flight exists.
    fn gate(&self, tasks: &mut [Task], waits: &[(u64, Vec<usize>)]) -> Vec<(u16, usize)> {
        let mut out = Vec::new();
        if waits.is_empty() {
            return out;
        }
        for (i, t) in tasks.iter_mut().enumerate() {
            let ssd_write = match (t.dev, t.op.kind, t.then) {
                (Dev::Ssd, IoKind::Write, _) => t.op.offset,
                (_, _, Some((Dev::Ssd, op))) if op.kind == IoKind::Write => op.offset,
                _ => continue,
            };
            let slot = ssd_write >> self.line_shift;
            if let Some((_, flights)) = waits.iter().find(|(s, _)| *s == slot) {
                for &g in flights {
                    t.deps_left += 1;
                    out.push((i as u16, g));
                }
            }
        }
        out
    }

    /// A foreground request waits for background flight `g`: its HDD work stops yielding.
    /// Counts a request that ends beyond the backing device: the replay maps offsets modulo
    /// the device (`tasks_of`), so such a trace folds onto it and its seek distances are
    /// not the trace's. Warns once, on stderr, with the sizes.
    fn check_wrap(&mut self, req: &Request) {
        let cap = self.hdd.capacity_bytes();
        if req.end() <= cap {
            return;
        }
        self.wrapped += 1;
        if self.wrapped == 1 {
            let note = format!(
                "a request ({} bytes at offset {}) ends beyond the backing device {} of {} \
                 bytes: offsets are mapped modulo the device, so the trace folds onto it and \
                 seeks are shorter than the trace's; give a larger device (--raid 5:N, another \
                 --hdd) or a smaller volume (fileserver: volume=BYTES)",
                req.len,
                req.offset,
                self.hdd.name(),
                cap
            );
            eprintln!("warning: {note}");
            self.wrap_note = Some(note);
        }
    }

    /// The counters [`PhaseCounters`] takes differences of.
    fn phase_snapshot(&self) -> PhaseCounters {
        let c = self.engine.counters();
        let s = self.hdd.stats();
        PhaseCounters {
            write_backs: c.write_backs,
            dirty_evictions: c.dirty_evictions,
            evictions: c.evictions,
            class_bypasses: c.bypasses.class,
            wb_waits: self.wb_waits,
            fill_waits: self.fill_waits,
            hdd_read_busy_s: s.kind(IoKind::Read).busy_ns as f64 / 1e9,
            hdd_write_busy_s: s.kind(IoKind::Write).busy_ns as f64 / 1e9,
            hdd_bytes_read: s.bytes_read(),
            hdd_bytes_written: s.bytes_written(),
        }
    }

    fn hurry(&mut self, g: usize) {
        let Some(fl) = self.flights[g].as_mut() else {
            return;
        };
        for t in &mut fl.tasks {
            t.urgent = true;
        }
        let mut now: Vec<(usize, u16, bool)> = Vec::new();
        self.deferred.retain(|&d| {
            if d.0 == g {
                now.push(d);
            }
            d.0 != g
        });
        for (f, t, second) in now {
            self.submit(f, t, second);
        }
    }

    /// Background flight `f` finished: its slots' write-backs are done, and the writes
    /// waiting to reuse those slots may go.
    fn release_bg(&mut self, f: usize) {
        for slot in self.bg_slots.remove(&f).unwrap_or_default() {
            if let Some(p) = self.pending_wb.get_mut(&slot) {
                p.flights.retain(|&x| x != f);
                if p.flights.is_empty() && p.queued.is_empty() {
                    self.pending_wb.remove(&slot);
                }
            }
        }
        for seq in self.bg_seqs.remove(&f).unwrap_or_default() {
            self.finish_queued(seq);
        }
        for (wf, wt) in self.bg_waiters.remove(&f).unwrap_or_default() {
            self.wait_over(wf, wt);
        }
    }

    /// [`Executor::start`] for the log layout: the log engine's plan for the request (with its
    /// content) becomes the flight's tasks; no watermark cleaning follows.
    fn start_log(&mut self, req: &Request, arrival_ns: u64) -> Result<()> {
        self.first_arrival.get_or_insert(arrival_ns);
        let (hcap, scap) = (
            self.hdd.capacity_bytes(),
            self.ssd.as_ref().map(|s| s.capacity_bytes()).unwrap_or(1),
        );
        let l = self.log.as_mut().expect("log layout");
        let i = l.next;
        anyhow::ensure!(
            i < l.trace.len(),
            "timed replay: request {} beyond the content trace",
            i + 1
        );
        l.next += 1;
        let before = l.hits();
        let rb = l.read_lines();
        let steps = l.driver.process(req, l.trace.content(i))?;
        let tasks = tasks_of(steps, req.op == Op::Write, hcap, scap, req.fua);
        let after = l.hits();
        let ra = l.read_lines();
        self.note_read_lines(ra.0 - rb.0, ra.1 - rb.1);
        self.fly(
            req,
            arrival_ns,
            tasks,
            (after.0 - before.0, after.1 - before.1),
        );
        self.kick_background();
        Ok(())
    }

    /// Puts a request's tasks in flight (either layout): `hits` = (line hits, line
    /// accesses) it added, counted in the current warm-up window.
    fn fly(&mut self, req: &Request, arrival_ns: u64, tasks: Vec<Task>, hits: (u64, u64)) -> usize {
        let w = self.window(self.now);
        self.win_hits[w].0 += hits.0;
        self.win_hits[w].1 += hits.1;
        let fg = tasks.iter().filter(|t| t.foreground).count() as u32;
        let all = tasks.len() as u32;
        let f = self.alloc_flight(Flight {
            arrival_ns,
            is_read: req.op == Op::Read,
            is_write: req.op == Op::Write,
            bytes: req.len,
            tasks,
            fg_left: fg,
            all_left: all,
            done: false,
            background: false,
            measured: self.measuring,
        });
        if fg == 0 {
            self.finish_fg(f);
        }
        self.launch_ready(f);
        self.track_idle();
        f
    }

    /// Counts a request's read line hits and read lines when it is measured.
    fn note_read_lines(&mut self, hits: u64, lines: u64) {
        if self.measuring {
            self.measured_read_lines.0 += hits;
            self.measured_read_lines.1 += lines;
        }
    }

    /// Dirty lines in the cache now (either layout).
    fn dirty_now(&self) -> u64 {
        match &self.log {
            Some(l) => l.driver.dirty_lines(),
            None => self.engine.dirty_lines(),
        }
    }

    /// Submits every task of flight `f` whose dependencies are met (and not yet submitted).
    fn launch_ready(&mut self, f: usize) {
        let n = self.flights[f].as_ref().map(|x| x.tasks.len()).unwrap_or(0);
        if n == 0 {
            self.maybe_free(f);
            return;
        }
        for t in 0..n as u16 {
            let ready = self.flights[f].as_ref().expect("live").tasks[t as usize].deps_left == 0;
            if ready {
                // Mark as submitted so it is not launched twice.
                self.flights[f].as_mut().expect("live").tasks[t as usize].deps_left = u32::MAX;
                self.submit(f, t, false);
            }
        }
    }

    /// Cached lines per class now.
    fn class_snapshot(&self) -> std::collections::BTreeMap<u8, u64> {
        let mut m = std::collections::BTreeMap::new();
        let others: u64 = self.owned.iter().sum();
        let zero = self.engine.len().saturating_sub(others);
        if zero > 0 {
            m.insert(0, zero);
        }
        for (c, &n) in self.owned.iter().enumerate() {
            if n > 0 {
                m.insert(c as u8, n);
            }
        }
        m
    }

    /// Records which class owns the lines `req` touched and that are now cached.
    fn track_classes(&mut self, req: &Request) {
        let (owners, owned) = (&mut self.owners, &mut self.owned);
        for k in self.engine.drain_unmapped() {
            if let Some(c) = owners.remove(&k) {
                owned[c as usize] -= 1;
            }
        }
        if req.class == 0 && self.owners.is_empty() {
            return;
        }
        let ls = self.engine.config().line_size;
        let (engine, owners, owned) = (&self.engine, &mut self.owners, &mut self.owned);
        Engine::for_each_line_key(ls, req, |k| {
            let cached = engine.lookup(k).is_some();
            let prev = if cached && req.class != 0 {
                owners.insert(k, req.class)
            } else {
                owners.remove(&k)
            };
            if let Some(c) = prev {
                owned[c as usize] -= 1;
            }
            if cached && req.class != 0 {
                owned[req.class as usize] += 1;
            }
        });
    }

    fn window(&mut self, t: u64) -> usize {
        let w = (t.saturating_sub(self.first_arrival.unwrap_or(0)) / self.window_ns) as usize;
        if self.win_done.len() <= w {
            // The last window closes: its end-of-window occupancy, which also stands for the
            // windows skipped without a request (a later close overwrites the new last one).
            let snap = self.class_snapshot();
            if let Some(last) = self.win_class.last_mut() {
                *last = snap.clone();
            }
            self.win_class.resize(w + 1, snap);
        }
        while self.win_done.len() <= w {
            self.win_done.push((0, 0));
            self.win_hits.push((0, 0));
            self.win_dirty.push(0);
        }
        w
    }

    fn finish_fg(&mut self, f: usize) {
        let (arrival, is_read, is_write, bytes, background, measured) = {
            let fl = self.flights[f].as_mut().expect("live");
            fl.done = true;
            (
                fl.arrival_ns,
                fl.is_read,
                fl.is_write,
                fl.bytes,
                fl.background,
                fl.measured,
            )
        };
        if background {
            return;
        }
        self.completed += 1;
        self.last_fg_done = self.last_fg_done.max(self.now);
        let w = self.window(self.now);
        self.win_done[w].0 += 1;
        self.win_done[w].1 += bytes;
        self.win_dirty[w] = self.dirty_now();
        if !measured {
            // A warm-up request: it ran, but the figures start after it.
            return;
        }
        self.measured_done += 1;
        let lat = self.now.saturating_sub(arrival).max(1);
        self.lat_all.saturating_record(lat);
        if is_read {
            self.lat_read.saturating_record(lat);
            self.reads += 1;
            self.read_bytes += bytes;
        } else if is_write {
            self.lat_write.saturating_record(lat);
            self.writes += 1;
            self.write_bytes += bytes;
        }
    }

    fn maybe_free(&mut self, f: usize) {
        if let Some(fl) = &self.flights[f] {
            if fl.all_left == 0 {
                self.flights[f] = None;
                self.free.push(f);
            }
        }
    }

    /// Handles one device completion; returns whether a foreground request finished.
    fn complete(&mut self, c: &Completion) -> bool {
        if c.result.is_err() {
            // The timed replay measures time; what to do about a failed operation is the live
            // server's business. Count it and go on.
            self.device_errors += 1;
        }
        let f = (c.id >> 17) as usize;
        let t = ((c.id >> 1) & 0xffff) as u16;
        let second = c.id & 1 == 1;
        let (dev_first, then, fg, hdd_fg) = {
            let task = &self.flights[f]
                .as_ref()
                .expect("completion of a live flight")
                .tasks[t as usize];
            (task.dev, task.then, task.foreground, task.hdd_fg)
        };
        let dev_now = if second {
            then.as_ref().map(|x| x.0).unwrap_or(dev_first)
        } else {
            dev_first
        };
        if dev_now == Dev::Hdd {
            if hdd_fg {
                self.hdd_fg_outstanding -= 1;
            } else {
                self.hdd_bg_outstanding -= 1;
            }
        }
        let background = self.flights[f].as_ref().expect("live").background;
        if !second && then.is_some() {
            self.submit(f, t, true);
            return false;
        }
        // Task done.
        let dependents = {
            let fl = self.flights[f].as_mut().expect("live");
            fl.all_left -= 1;
            if fg {
                fl.fg_left -= 1;
            }
            fl.tasks[t as usize].dependents.clone()
        };
        if background {
            self.bg_in_flight -= 1;
        }
        if !self.fill_slots.is_empty() {
            self.copy_done(f, t);
        }
        for d in dependents {
            let ready = {
                let task = &mut self.flights[f].as_mut().expect("live").tasks[d as usize];
                task.deps_left -= 1;
                task.deps_left == 0
            };
            if ready {
                self.flights[f].as_mut().expect("live").tasks[d as usize].deps_left = u32::MAX;
                self.submit(f, d, false);
            }
        }
        let mut fg_finished = false;
        let (fg_left, done) = {
            let fl = self.flights[f].as_ref().expect("live");
            (fl.fg_left, fl.done)
        };
        if fg_left == 0 && !done {
            self.finish_fg(f);
            fg_finished = !background;
        }
        if background && self.flights[f].as_ref().expect("live").all_left == 0 {
            self.release_bg(f);
        }
        self.maybe_free(f);
        fg_finished
    }

    /// Starts queued cleaning write-backs while the HDD has no foreground work.
    fn kick_background(&mut self) {
        self.run_deferred();
        while self.bg_in_flight == 0 && self.hdd_fg_outstanding == 0 && self.deferred.is_empty() {
            self.skip_cancelled();
            if self.bg_queue.is_empty() {
                self.next_pass();
            }
            if self.bg_queue.is_empty() && self.idle_due() {
                // Idle-time cleaning: the HDD has nothing else to do.
                self.begin_clean(IDLE_CLEAN_BATCH);
            }
            let Some((seq, step)) = self.pop_bg() else {
                return;
            };
            // Cleaning is in LBA order: write-backs of contiguous ranges go as one HDD write.
            let mut run = vec![step];
            let mut seqs = vec![seq];
            // (Chunk rewrites' gaps join them: they are part of the same backing write.)
            let wb = |s: Option<&Step>| match s.copied() {
                Some(Step::WriteBack { vol, hdd, len, .. } | Step::CopyHdd { vol, hdd, len }) => {
                    Some((vol, hdd, len))
                }
                _ => None,
            };
            loop {
                self.skip_cancelled();
                let (Some((vol, hdd, len)), Some((v2, h2, l2))) =
                    (wb(run.last()), wb(self.bg_queue.front()))
                else {
                    break;
                };
                let bytes: u64 = run.iter().map(|s| s.bytes().3).sum();
                if vol != v2 || hdd + len != h2 || bytes + l2 > MAX_MERGED_WB {
                    break;
                }
                let (seq, st) = self.pop_bg().expect("front exists");
                run.push(st);
                seqs.push(seq);
            }
            self.launch_bg_run(&run, &seqs);
        }
    }

    /// Whether idle-time cleaning may start now.
    fn idle_due(&self) -> bool {
        self.idle_timer().is_some_and(|t| self.now >= t)
    }

    /// When idle-time cleaning would start, if it has work and the HDD stays idle.
    fn idle_timer(&self) -> Option<u64> {
        if !self.idle_clean
            || self.engine.dirty_lines() == 0
            || !self.bg_queue.is_empty()
            || self.flushing
            || self.clean_left > 0
        {
            return None;
        }
        self.hdd_idle_since.map(|t| t + IDLE_CLEAN_AFTER_NS)
    }

    /// Notes whether the HDD is idle (nothing in flight).
    fn track_idle(&mut self) {
        if self.hdd_fg_outstanding == 0
            && self.hdd_bg_outstanding == 0
            && self.bg_in_flight == 0
            && self.deferred.is_empty()
        {
            self.hdd_idle_since.get_or_insert(self.now);
        } else {
            self.hdd_idle_since = None;
        }
    }

    fn next_event(&self) -> Option<u64> {
        let h = self.hdd.next_completion();
        let s = self.ssd.as_ref().and_then(|s| s.next_completion());
        let r = self.ram.as_ref().and_then(|r| r.1.next_completion());
        let dev = [h, s, r].into_iter().flatten().min();
        match (dev, self.idle_timer()) {
            (Some(a), Some(b)) => Some(a.min(b.max(self.now))),
            (a, b) => a.or(b.map(|b| b.max(self.now))),
        }
    }

    /// Advances to the next device event; returns the number of foreground requests done.
    fn step(&mut self) -> Option<u32> {
        let t = self.next_event()?;
        self.now = self.now.max(t);
        self.maybe_fail_ssd();
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        let now = self.now;
        self.hdd.advance(now, &mut done);
        if let Some(s) = self.ssd.as_mut() {
            s.advance(now, &mut done);
        }
        if let Some(r) = self.ram.as_mut() {
            r.1.advance(now, &mut done);
        }
        let mut n = 0;
        for c in &done {
            if self.complete(c) {
                n += 1;
            }
        }
        self.done = done;
        self.track_idle();
        self.kick_background();
        self.track_idle();
        Some(n)
    }
}

fn device_use(d: &dyn Device, elapsed_ns: u64) -> DeviceUse {
    let s = d.stats();
    DeviceUse {
        name: d.name().to_string(),
        busy_s: s.busy_ns as f64 / 1e9,
        read_busy_s: s.kind(tiercache_devices::IoKind::Read).busy_ns as f64 / 1e9,
        write_busy_s: s.kind(tiercache_devices::IoKind::Write).busy_ns as f64 / 1e9,
        utilisation: if elapsed_ns > 0 {
            s.busy_ns as f64 / elapsed_ns as f64
        } else {
            0.0
        },
        ops: s.ops(),
        bytes_read: s.bytes_read(),
        bytes_written: s.bytes_written(),
    }
}

/// Runs `spec` with timing. `hdd` is the backing device; `ssd` the cache device (None = no
/// cache: the engine gets capacity 0 and every request goes to the HDD).
pub fn simulate_timed<'a>(
    spec: &SimSpec,
    footprint: Option<u64>,
    hdd: &'a mut dyn Device,
    ssd: Option<&'a mut dyn Device>,
    opts: &TimedOptions,
    progress: Option<crate::Progress>,
) -> Result<(crate::SimResult, TimedResult)> {
    let ls = spec.engine.line_size;
    let log = LogTimed::for_spec(
        spec,
        ssd.as_ref()
            .map(|s| (s.name().to_string(), s.capacity_bytes())),
    )?;
    let footprint = match footprint {
        _ if log.is_some() => log.as_ref().map(|l| l.footprint),
        Some(f) => Some(f),
        None if spec.cache_size.needs_footprint() && ssd.is_some() => {
            Some(crate::footprint_lines(&spec.input, ls)?)
        }
        None => None,
    };
    if footprint == Some(0) {
        return Err(crate::no_requests(&spec.input));
    }
    let mut cfg = spec.engine.clone();
    // Aligned policy links, as in the untimed run (`sized_config`).
    cfg.policy_params.aligned_links = true;
    // (With the log layout, the direct engine holds nothing: `log` caches.)
    cfg.capacity_lines = if ssd.is_some() && log.is_none() {
        spec.cache_size.lines(ls, footprint.unwrap_or(0))
    } else {
        0
    };
    if ssd.is_some() && log.is_none() {
        crate::ensure_some_lines(spec, cfg.capacity_lines, footprint)?;
    }
    if let Some(s) = &ssd {
        let max_lines = s.capacity_bytes() / ls;
        if cfg.capacity_lines > max_lines {
            anyhow::bail!(
                "the cache ({} lines of {} bytes) does not fit on the SSD model '{}' ({} bytes)",
                cfg.capacity_lines,
                ls,
                s.name(),
                s.capacity_bytes()
            );
        }
    }
    let mut engine = Engine::new(cfg).map_err(anyhow::Error::msg)?;
    // Per-class occupancy drops the owners of lines that leave the cache as they leave.
    engine.track_unmapped(true);
    if engine.needs_oracle() {
        let reqs: Vec<Request> = spec.input.open()?.collect::<Result<_>>()?;
        engine.set_oracle(Engine::next_use_oracle(ls, &reqs));
    }
    let ram = match RamTier::for_config(&spec.engine).map_err(anyhow::Error::msg)? {
        Some(t) => {
            anyhow::ensure!(
                log.is_none() && ssd.is_some(),
                "--ram-cache: the RAM tier runs above a direct-layout cache (not the log \
                 layout, not --no-cache)"
            );
            anyhow::ensure!(
                !engine.needs_oracle(),
                "--ram-cache: policy {} needs the future of every line access, which a RAM \
                 tier above it hides",
                spec.engine.policy
            );
            let dev = tiercache_devices::build(&tiercache_devices::DeviceSpec::Ram(
                tiercache_devices::RamConfig {
                    capacity_bytes: spec.engine.ram_cache,
                    ..Default::default()
                },
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            Some((t, dev))
        }
        None => None,
    };
    let mut ex = Executor {
        engine,
        ram,
        log,
        hdd,
        ssd,
        flights: Vec::new(),
        free: Vec::new(),
        bg_queue: VecDeque::new(),
        bg_seq_front: 0,
        bg_cancelled: hashbrown::HashSet::new(),
        pending_wb: hashbrown::HashMap::new(),
        bg_slots: hashbrown::HashMap::new(),
        wb_open: std::collections::BTreeMap::new(),
        bg_seqs: hashbrown::HashMap::new(),
        started: 0,
        flush_at: opts.flush_at,
        flushing: false,
        clean_left: 0,
        bg_waiters: hashbrown::HashMap::new(),
        filling: hashbrown::HashMap::new(),
        fill_slots: hashbrown::HashMap::new(),
        fill_waiters: hashbrown::HashMap::new(),
        line_shift: ls.trailing_zeros(),
        bg_in_flight: 0,
        hdd_fg_outstanding: 0,
        done: Vec::new(),
        device_errors: 0,
        wb_waits: 0,
        fill_waits: 0,
        wrapped: 0,
        wrap_note: None,
        idle_clean: opts.idle_clean,
        hdd_idle_since: Some(0),
        fail_ssd: opts.fail_ssd,
        ssd_failure: None,
        hdd_bg_outstanding: 0,
        deferred: VecDeque::new(),
        lat_all: Executor::hist(),
        lat_read: Executor::hist(),
        lat_write: Executor::hist(),
        reads: 0,
        writes: 0,
        read_bytes: 0,
        write_bytes: 0,
        completed: 0,
        measure_from: opts.measure_from,
        measuring: opts.measure_from == 0,
        measure_start: None,
        measured_done: 0,
        measured_read_lines: (0, 0),
        first_arrival: None,
        last_fg_done: 0,
        now: 0,
        window_ns: opts.window_ns.max(1),
        win_done: Vec::new(),
        win_hits: Vec::new(),
        win_dirty: Vec::new(),
        owners: hashbrown::HashMap::new(),
        owned: [0; tiercache_engine::NUM_CLASSES],
        win_class: Vec::new(),
    };
    let wall = std::time::Instant::now();
    let skipped = std::sync::Arc::new(std::sync::Mutex::new(crate::input::Skipped::default()));
    let mut reqs = match &ex.log {
        Some(l) => l.requests(),
        None => spec.input.open_counted(Some(skipped.clone()))?,
    };
    let mut issued: u64 = 0;
    let report = |n: u64| {
        if n.is_multiple_of(crate::PROGRESS_EVERY) {
            if let Some(p) = progress {
                p(n);
            }
        }
    };
    let ctx = |n: u64, input: &Input| format!("{input}: request {n}");
    // Simulated time at which each phase's first request was issued.
    let mut phase_marks: Vec<u64> = Vec::with_capacity(opts.phase_starts.len());
    let mut phase_snaps: Vec<PhaseCounters> = Vec::with_capacity(opts.phase_starts.len());
    match opts.drive {
        Drive::Closed { queue_depth } => {
            let qd = queue_depth.max(1) as u64;
            let mut exhausted = false;
            loop {
                // Keep `qd` requests outstanding (requests with no device work finish at once).
                while !exhausted && issued - ex.completed < qd {
                    match reqs.next() {
                        Some(r) => {
                            let r = r?;
                            while phase_marks.len() < opts.phase_starts.len()
                                && opts.phase_starts[phase_marks.len()] <= issued
                            {
                                phase_marks.push(ex.now);
                                phase_snaps.push(ex.phase_snapshot());
                            }
                            issued += 1;
                            let now = ex.now;
                            ex.start(&r, now)
                                .with_context(|| ctx(issued, &spec.input))?;
                            report(issued);
                        }
                        None => exhausted = true,
                    }
                }
                if ex.step().is_none() {
                    anyhow::ensure!(
                        exhausted || issued == ex.completed,
                        "timed replay stalled with {} requests outstanding",
                        issued - ex.completed
                    );
                    if exhausted {
                        break;
                    }
                }
            }
        }
        Drive::Open { speedup } => {
            let speedup = if speedup > 0.0 { speedup } else { 1.0 };
            let mut next: Option<(Request, u64)> = None;
            let mut last_arrival = 0u64;
            let mut exhausted = false;
            // The trace's first timestamp, and whether any other differs from it.
            let mut t_first: Option<u64> = None;
            let mut t_varies = false;
            loop {
                if next.is_none() && !exhausted {
                    match reqs.next() {
                        Some(r) => {
                            let r = r?;
                            t_varies |= *t_first.get_or_insert(r.time_ns) != r.time_ns;
                            let at = ((r.time_ns as f64 / speedup) as u64).max(last_arrival);
                            last_arrival = at;
                            next = Some((r, at));
                        }
                        None => exhausted = true,
                    }
                }
                let dev_t = ex.next_event();
                match (&next, dev_t) {
                    (Some((_, at)), Some(t)) if t < *at => {
                        ex.step();
                    }
                    (Some(_), _) => {
                        let (r, at) = next.take().expect("checked");
                        ex.now = ex.now.max(at);
                        while phase_marks.len() < opts.phase_starts.len()
                            && opts.phase_starts[phase_marks.len()] <= issued
                        {
                            phase_marks.push(ex.now);
                            phase_snaps.push(ex.phase_snapshot());
                        }
                        issued += 1;
                        ex.start(&r, at).with_context(|| ctx(issued, &spec.input))?;
                        ex.kick_background();
                        report(issued);
                    }
                    (None, Some(_)) => {
                        ex.step();
                    }
                    (None, None) => break,
                }
            }
            if issued > 1 && !t_varies {
                anyhow::bail!(
                    "{}: every request has the same timestamp ({} ns): the trace has no \
                     timestamps, so --speedup would issue it as one burst. Drive it closed-loop \
                     with --queue-depth N instead",
                    spec.input,
                    t_first.unwrap_or(0)
                );
            }
        }
    }
    if issued == 0 {
        return Err(crate::no_requests(&spec.input));
    }
    // Drain background work.
    while ex.step().is_some() {}
    assert!(
        ex.wb_open.is_empty(),
        "timed replay drained with {} cleaning passes begun and not complete",
        ex.wb_open.len()
    );
    let drained = ex.now;
    let first = ex.first_arrival.unwrap_or(0);
    anyhow::ensure!(
        ex.measure_start.is_some(),
        "{}: the run is measured from request {} (0-based) but has only {issued} requests",
        spec.input,
        opts.measure_from
    );
    let measure_start = ex.measure_start.unwrap_or(first);
    let elapsed_ns = ex.last_fg_done.saturating_sub(measure_start);
    let secs = elapsed_ns as f64 / 1e9;
    let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let cap_lines = match &ex.log {
        Some(l) => l.capacity_lines(),
        None => ex.engine.capacity_lines(),
    };
    let cap = cap_lines.max(1) as f64;
    let window_s = ex.window_ns as f64 / 1e9;
    if !ex.win_class.is_empty() {
        let snap = ex.class_snapshot();
        *ex.win_class.last_mut().expect("non-empty") = snap;
    }
    let series: Vec<Window> = (0..ex.win_done.len())
        .map(|w| Window {
            t_s: w as f64 * window_s,
            iops: ex.win_done[w].0 as f64 / window_s,
            mb_per_s: ex.win_done[w].1 as f64 / window_s / 1e6,
            hit_ratio: if ex.win_hits[w].1 > 0 {
                ex.win_hits[w].0 as f64 / ex.win_hits[w].1 as f64
            } else {
                0.0
            },
            dirty_share: ex.win_dirty[w] as f64 / cap,
            class_lines: std::mem::take(&mut ex.win_class[w]),
        })
        .collect();
    let has_cache = ex.ssd.is_some() && cap_lines > 0;
    let (warmup_s, warmup_iops_s, warmup_note) = if has_cache {
        resolved_warmup(&series, &ex.win_hits, window_s)
    } else {
        (None, None, None)
    };
    let timed = TimedResult {
        drive: match opts.drive {
            Drive::Open { speedup } => format!("open loop, speed-up {speedup}"),
            Drive::Closed { queue_depth } => format!("closed loop, queue depth {queue_depth}"),
        },
        iops: per_s(ex.measured_done as f64),
        read_iops: per_s(ex.reads as f64),
        write_iops: per_s(ex.writes as f64),
        mb_per_s: per_s((ex.read_bytes + ex.write_bytes) as f64) / 1e6,
        read_mb_per_s: per_s(ex.read_bytes as f64) / 1e6,
        write_mb_per_s: per_s(ex.write_bytes as f64) / 1e6,
        latency_us: Latencies {
            all: LatencySummary::from(&ex.lat_all),
            read: LatencySummary::from(&ex.lat_read),
            write: LatencySummary::from(&ex.lat_write),
        },
        elapsed_s: secs,
        drained_s: drained.saturating_sub(first) as f64 / 1e9,
        hdd: device_use(&*ex.hdd, drained.saturating_sub(first)),
        ssd: ex
            .ssd
            .as_ref()
            .map(|s| device_use(&**s, drained.saturating_sub(first))),
        ssd_members: Vec::new(),
        ssd_failure: ex.ssd_failure.clone(),
        ram_device: ex
            .ram
            .as_ref()
            .map(|r| device_use(&*r.1, drained.saturating_sub(first))),
        warmup_s,
        warmup_iops_s,
        warmup_note,
        device_errors: ex.device_errors,
        wrapped_requests: ex.wrapped,
        wrap_note: ex.wrap_note.clone(),
        phase_s: {
            let mut ends: Vec<u64> = phase_marks.iter().skip(1).copied().collect();
            if !phase_marks.is_empty() {
                ends.push(ex.last_fg_done.max(*phase_marks.last().expect("non-empty")));
            }
            phase_marks
                .iter()
                .zip(&ends)
                .map(|(a, b)| b.saturating_sub(*a) as f64 / 1e9)
                .collect()
        },
        phase_counters: {
            let mut ends: Vec<PhaseCounters> = phase_snaps.iter().skip(1).cloned().collect();
            if !phase_snaps.is_empty() {
                ends.push(ex.phase_snapshot());
            }
            ends.iter()
                .zip(&phase_snaps)
                .map(|(b, a)| b.minus(a))
                .collect()
        },
        measured_from: opts.measure_from,
        measured_read_hit_ratio: (opts.measure_from > 0).then(|| {
            let (h, n) = ex.measured_read_lines;
            if n > 0 {
                h as f64 / n as f64
            } else {
                0.0
            }
        }),
        series,
    };
    // Wall-clock time of the replay itself (the simulator's speed, not simulated time).
    let wall_s = wall.elapsed().as_secs_f64();
    let mut result = match ex.log.take() {
        Some(l) => l.result(spec, wall_s)?,
        None => crate::SimResult::new(spec, &ex.engine, footprint, wall_s),
    };
    if let Some((t, _)) = &ex.ram {
        result.ram = Some(crate::RamFigures::of(t, &ex.engine.counters()));
    }
    result.set_skipped(std::mem::take(
        &mut *skipped.lock().expect("skipped count lock"),
    ));
    Ok((result, timed))
}

/// Warm-up time: the start of the first window whose hit ratio reaches 95 % of the steady
/// value, the access-weighted hit ratio of the last 10 % of windows (at least one).
pub fn warmup_time(series: &[Window], hits: &[(u64, u64)]) -> Option<f64> {
    if series.is_empty() {
        return None;
    }
    let tail = (series.len() / 10).max(1);
    let (h, a) = hits[hits.len() - tail..]
        .iter()
        .fold((0u64, 0u64), |(h, a), x| (h + x.0, a + x.1));
    if a == 0 || h == 0 {
        return None;
    }
    let steady = h as f64 / a as f64;
    series
        .iter()
        .zip(hits)
        .find(|(w, x)| x.1 > 0 && w.hit_ratio >= 0.95 * steady)
        .map(|(w, _)| w.t_s)
}

/// Whole windows a run needs before its warm-up is reported: the steady value is the last
/// tenth of them, and the rise must span more than one.
pub const MIN_WARMUP_WINDOWS: usize = 4;

/// Warm-up times (hit ratio, IOPS) when they can be resolved, else a note saying why not:
/// a run of fewer than [`MIN_WARMUP_WINDOWS`] whole windows has no steady state to compare
/// with, and a run already within 95 % in its first window warmed up in less than one
/// window (the figure would be `0.0 s` whatever the truth).
pub fn resolved_warmup(
    series: &[Window],
    hits: &[(u64, u64)],
    window_s: f64,
) -> (Option<f64>, Option<f64>, Option<String>) {
    let whole = series.len().saturating_sub(1);
    if whole < MIN_WARMUP_WINDOWS {
        return (
            None,
            None,
            Some(format!(
                "not resolved: the run lasted {whole} whole windows of {window_s:.3} s; warm-up \
                 needs at least {MIN_WARMUP_WINDOWS} (more requests, or a smaller --window)"
            )),
        );
    }
    let hit = warmup_time(series, hits);
    let iops = warmup_iops_time(series);
    let first = |t: Option<f64>| t.is_some_and(|t| t <= 0.0);
    let note = (first(hit) || first(iops)).then(|| {
        format!(
            "within 95 % of the final value in the first window: warm-up is shorter than one \
             window ({window_s:.3} s); a smaller --window resolves it"
        )
    });
    let keep = |t: Option<f64>| t.filter(|t| *t > 0.0);
    (keep(hit), keep(iops), note)
}

/// Time until the windowed IOPS first reaches 95 % of the mean of the last 10 % of whole
/// windows (the last, partial window is left out when there are others).
pub fn warmup_iops_time(series: &[Window]) -> Option<f64> {
    let whole = if series.len() > 2 {
        &series[..series.len() - 1]
    } else {
        series
    };
    let tail = (whole.len() / 10).max(1);
    let steady = whole[whole.len().checked_sub(tail)?..]
        .iter()
        .map(|w| w.iops)
        .sum::<f64>()
        / tail as f64;
    if steady <= 0.0 {
        return None;
    }
    whole
        .iter()
        .find(|w| w.iops >= 0.95 * steady)
        .map(|w| w.t_s)
}

/// The devices, drive and prices of a timed run.
#[derive(Clone, Debug)]
pub struct TimedSetup {
    /// Backing device (a preset name like `hdd:7200`, or a TOML model file).
    pub hdd: String,
    /// RAID of `n` backing devices: (level 0 or 5, n).
    pub raid: Option<(u8, usize)>,
    /// Cache device; None = no cache (the backing device alone).
    pub ssd: Option<String>,
    /// Further cache devices: with any, the cache is a pool of `ssd` followed by these, laid
    /// out as [`tiercache_engine::Pool`] with the cache size split equally (each member
    /// rounded down to a multiple of 128 lines). Empty: one cache device, as before.
    pub pool: Vec<String>,
    pub options: TimedOptions,
    pub prices: tiercache_devices::PriceTable,
}

impl Default for TimedSetup {
    fn default() -> Self {
        TimedSetup {
            hdd: "hdd:7200".into(),
            raid: None,
            ssd: Some("ssd:default".into()),
            pool: Vec::new(),
            options: TimedOptions::default(),
            prices: tiercache_devices::PriceTable::default(),
        }
    }
}

/// A timed run's report: the hit-ratio counters, the timing, and the cost.
#[derive(Clone, Debug, Serialize)]
pub struct TimedReport {
    #[serde(flatten)]
    pub sim: crate::SimResult,
    #[serde(flatten)]
    pub timed: TimedResult,
    pub hdd_model: String,
    pub ssd_model: Option<String>,
    /// Busy seconds per device (`hdd`, `ssd`).
    pub busy_s: std::collections::BTreeMap<String, f64>,
    /// Price of the backing devices plus the cache's share of the SSD (None when a device
    /// has no price in the table).
    pub cost_usd: Option<f64>,
    /// DSS figure of merit: cost / usable capacity in MB / IOPS (lower is better).
    pub cost_per_mb_per_iops: Option<f64>,
}

/// The price-table name of a device given on the command line (`7200` -> `hdd:7200`).
fn price_name(spec_str: &str, spec: &tiercache_devices::DeviceSpec) -> String {
    use tiercache_devices::DeviceSpec as D;
    let s = spec_str.trim().to_ascii_lowercase();
    if s.contains(':') {
        return s;
    }
    match spec {
        D::Hdd(_) => format!("hdd:{s}"),
        D::Ssd(_) => format!("ssd:{s}"),
        _ => s,
    }
}

/// Builds the devices and runs `spec` timed.
pub fn run_timed(
    spec: &SimSpec,
    setup: &TimedSetup,
    progress: Option<crate::Progress>,
) -> Result<TimedReport> {
    use tiercache_devices::{build, DeviceSpec, RaidLevel, RaidSpec};

    crate::ensure_one_shard(spec, "a timed run (--hdd, --ssd)")?;
    let parse = |s: &str| -> Result<DeviceSpec> {
        s.parse::<DeviceSpec>()
            .map_err(|e| anyhow::anyhow!("device '{s}': {e}"))
    };
    let member = parse(&setup.hdd)?;
    let disks = setup.raid.map(|r| r.1).unwrap_or(1);
    let hdd_spec = match setup.raid {
        None => member.clone(),
        Some((level, n)) => {
            let level = match level {
                0 => RaidLevel::Raid0,
                5 => RaidLevel::Raid5,
                other => anyhow::bail!("RAID level {other} is not modelled; use 0 or 5"),
            };
            anyhow::ensure!(n >= 2, "a RAID needs at least 2 disks (got {n})");
            DeviceSpec::Raid(RaidSpec {
                level,
                stripe_unit_bytes: 64 << 10,
                members: vec![member.clone(); n],
                member: None,
                count: None,
            })
        }
    };
    let mut hdd = build(&hdd_spec).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(v) = setup.options.volume_bytes {
        let cap = hdd.capacity_bytes();
        anyhow::ensure!(
            v <= cap,
            "the input spans a volume of {v} bytes but the backing device ({}) holds {cap} \
             bytes: the replay would fold the volume onto it (offsets modulo the device), \
             with shorter seeks than the volume's; give a larger device (--raid 5:N, another \
             --hdd) or a smaller volume (fileserver: volume=BYTES)",
            // The device's own name (`hdd:7200`, `raid5:4xhdd:7200`), the form `--hdd`
            // takes, not a bare preset (`7200`) as typed.
            hdd.name()
        );
    }
    // `emu:LAT_US[:CHANNELS]`: the live `--emulate-ssd` rule, as large as the default SSD.
    let build_ssd = |s: &str| -> Result<Box<dyn Device>> {
        match s.trim().strip_prefix("emu:") {
            Some(e) => Ok(Box::new(Checked::new(
                crate::emu_ssd::EmuSsd::new(e, 256_000_000_000).map_err(anyhow::Error::msg)?,
            ))),
            None => build(&parse(s)?).map_err(|e| anyhow::anyhow!("{e}")),
        }
    };
    let mut ssd = match &setup.ssd {
        Some(s) => Some(build_ssd(s)?),
        None => None,
    };
    if let Some((d, _)) = setup.options.fail_ssd {
        let n = 1 + setup.pool.len();
        anyhow::ensure!(
            n >= 2 && d < n,
            "--fail-ssd {d}@...: {} (members are numbered from 0 in --ssd order)",
            if n < 2 {
                "a member can fail only in a pool of two or more cache devices (--ssd repeated); \
                 one cache device failing is the whole cache failing"
                    .to_string()
            } else {
                format!("the pool has {n} members (0..{})", n - 1)
            }
        );
    }
    let mut pool: Option<Checked<SsdPool>> = None;
    let mut pooled_spec = None;
    let mut footprint = None;
    if !setup.pool.is_empty() {
        let first = ssd
            .take()
            .context("a pool of cache devices needs a cache (not --no-cache)")?;
        anyhow::ensure!(
            spec.log.is_none(),
            "the log layout takes one cache device (one --ssd)"
        );
        let mut members = vec![first];
        for s in &setup.pool {
            members.push(build_ssd(s)?);
        }
        let ls = spec.engine.line_size;
        // The engine places lines over the members (stripes, even fill) and mirrors dirty
        // lines on two as live (`serve`: 2 by default when the pool or a volume of it runs
        // write-back): the copies take slots and SSD writes.
        let (s, fp, p) =
            crate::ssd_pool::pooled_spec(spec, members.len(), setup.options.dirty_copies)?;
        pooled_spec = Some(s);
        footprint = fp;
        pool = Some(Checked::new(
            SsdPool::new(p, ls, members).map_err(anyhow::Error::msg)?,
        ));
    }
    let (sim, mut timed) = simulate_timed(
        pooled_spec.as_ref().unwrap_or(spec),
        footprint,
        hdd.as_mut(),
        match pool.as_mut() {
            Some(p) => Some(p as &mut dyn Device),
            None => ssd.as_mut().map(|b| b.as_mut() as &mut dyn Device),
        },
        &setup.options,
        progress,
    )?;
    if let (Some((d, at)), None) = (setup.options.fail_ssd, &timed.ssd_failure) {
        anyhow::bail!(
            "--fail-ssd {d}@{}: the replay drained {:.3} s after its first request, before \
             that time; give an earlier time",
            at as f64 / 1e9,
            timed.drained_s
        );
    }
    if let Some(p) = &pool {
        let elapsed_ns = (timed.drained_s * 1e9) as u64;
        timed.ssd_members = p
            .model()
            .members()
            .iter()
            .map(|m| device_use(&**m, elapsed_ns))
            .collect();
    }
    let hdd_name = price_name(&setup.hdd, &member);
    let hdd_cost = setup
        .prices
        .devices_usd(&hdd_name, disks as u32, hdd.capacity_bytes());
    let ssd_model = setup.ssd.as_ref().map(|s| {
        std::iter::once(s)
            .chain(&setup.pool)
            .cloned()
            .collect::<Vec<_>>()
            .join(" + ")
    });
    // Each member holds an equal share of the cache.
    let share = sim.capacity_bytes / (1 + setup.pool.len() as u64);
    let mut ssd_cost = Some(0.0);
    for s in setup.ssd.iter().chain(&setup.pool) {
        if s.trim().starts_with("emu:") {
            ssd_cost = None; // an emulated device has no price
            continue;
        }
        let name = price_name(s, &parse(s)?);
        let bytes = if setup.pool.is_empty() {
            sim.capacity_bytes
        } else {
            share
        };
        ssd_cost = ssd_cost
            .zip(setup.prices.cost_usd(&name, bytes))
            .map(|(a, b)| a + b);
    }
    let cost_usd = match (hdd_cost, ssd_cost) {
        (Some(h), Some(s)) => Some(h + s),
        _ => None,
    };
    let cost_per_mb_per_iops = cost_usd
        .filter(|_| timed.iops > 0.0)
        .map(|c| tiercache_devices::usd_per_mb_per_iops(c, hdd.capacity_bytes(), timed.iops));
    let mut busy_s = std::collections::BTreeMap::new();
    busy_s.insert("hdd".to_string(), timed.hdd.busy_s);
    if let Some(s) = &timed.ssd {
        busy_s.insert("ssd".to_string(), s.busy_s);
    }
    if let Some(r) = &timed.ram_device {
        busy_s.insert("ram".to_string(), r.busy_s);
    }
    Ok(TimedReport {
        sim,
        timed,
        hdd_model: match setup.raid {
            Some((l, n)) => format!("RAID {l} of {n} x {}", setup.hdd),
            None => setup.hdd.clone(),
        },
        ssd_model,
        busy_s,
        cost_usd,
        cost_per_mb_per_iops,
    })
}

/// Simulated seconds a full flush (`ctl flush`: `clean` until nothing is dirty, 1024 lines per
/// pass) takes on `hdd` (and `ssd` for the cache reads; `None`: they cost nothing), executed
/// as the live volume does it: one device operation at a time, merged write-backs (and
/// chunk rewrites) as one backing write after their reads. The prediction for
/// `scripts/bench_flush.sh`.
pub fn flush_time(engine: &mut Engine, hdd: &mut dyn Device, ssd: Option<&mut dyn Device>) -> f64 {
    flush_time_with_host(engine, hdd, ssd, DEFAULT_HOST_GAP_NS)
}

/// The host's time between one device operation's completion and the next one's submission
/// in a live flush, in ns: the cleaner's own work per write-back (23 us: `HDD=none
/// scripts/bench_flush.sh`, 2 cores, 2026-11-26) plus the emulated disk's wake-up from its
/// sleep until the modelled completion (median 80-105 us on the loaded 2-core machine, same
/// script). With it the model predicts both live flushes within 5 % (docs/notes-clean.md).
pub const DEFAULT_HOST_GAP_NS: u64 = 100_000;

/// [`flush_time`] with `host_gap_ns` of host time before each device operation. Without
/// it a write-back that follows another on a nearby track is submitted the instant the
/// previous one completes and catches its sector in the same revolution; live, the host's
/// few hundred microseconds between them let the sector pass more often (one more
/// revolution), which is why the model without a gap predicted the LBA-ordered flush a
/// third too fast. The default is measured by `scripts/bench_flush.sh` (see
/// docs/notes-clean.md).
pub fn flush_time_with_host(
    engine: &mut Engine,
    hdd: &mut dyn Device,
    mut ssd: Option<&mut dyn Device>,
    host_gap_ns: u64,
) -> f64 {
    let (mut now, mut done) = (0u64, Vec::new());
    let hcap = hdd.capacity_bytes();
    let scap = ssd.as_ref().map(|s| s.capacity_bytes()).unwrap_or(1);
    while engine.dirty_lines() > 0 {
        let steps = engine.clean(FLUSH_PASS_LINES).steps.clone();
        let mut tasks = tasks_of(&steps, false, hcap, scap, false);
        let mut left: Vec<usize> = (0..tasks.len()).collect();
        while !left.is_empty() {
            let at = left
                .iter()
                .position(|&i| tasks[i].deps_left == 0)
                .expect("a task is ready: the plan's dependencies are acyclic");
            let i = left.remove(at);
            let mut run = |dev: Dev, op: IoOp, now: &mut u64| {
                let d: &mut dyn Device = match dev {
                    Dev::Hdd => &mut *hdd,
                    Dev::Ssd => match ssd.as_deref_mut() {
                        Some(s) => s,
                        None => return,
                    },
                    // Cleaning plans have no RAM step.
                    Dev::Ram => return,
                };
                *now += host_gap_ns;
                d.submit(*now, 0, op);
                while let Some(t) = d.next_completion() {
                    d.advance(t, &mut done);
                    *now = t;
                }
                done.clear();
            };
            run(tasks[i].dev, tasks[i].op, &mut now);
            if let Some((dev, op)) = tasks[i].then {
                run(dev, op, &mut now);
            }
            for d in std::mem::take(&mut tasks[i].dependents) {
                tasks[d as usize].deps_left -= 1;
            }
        }
    }
    now as f64 / 1e9
}
