//! The live dashboard of `tiercache serve --http`: a sampler thread turns a volume's
//! cumulative counters into per-second rates kept in a ring buffer ([`HISTORY_SECONDS`]),
//! served as a self-contained HTML page (`/`, no external resources) and as JSON
//! (`/api/stats`) by the metrics endpoint's HTTP code ([`crate::control::serve_http`]).
//!
//! Both layouts feed it a [`Snapshot`]; what a layout does not count is listed in
//! `missing` and shown on the page instead of a chart of zeros. Device IOPS come from
//! [`Counted`], a pass-through wrapper counting the requests each device receives.

use crate::dev::{forward_device_info, BlockDev};
use serde::Serialize;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds of per-second samples kept (10 minutes).
pub const HISTORY_SECONDS: usize = 600;

/// The page: inline CSS, JS and SVG only (works offline).
pub const PAGE: &str = include_str!("dashboard.html");

/// Requests and bytes a device received (reads and writes; syncs are not counted).
#[derive(Debug, Default)]
pub struct IoCounts {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
}

impl IoCounts {
    fn get(&self) -> [u64; 4] {
        [
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.read_bytes.load(Ordering::Relaxed),
            self.write_bytes.load(Ordering::Relaxed),
        ]
    }
}

/// A device that counts the requests it passes on (failed ones too: the device saw them).
/// Everything else, the identity included, is the inner device's.
pub struct Counted<D> {
    inner: D,
    io: Arc<IoCounts>,
}

impl<D: BlockDev> Counted<D> {
    pub fn new(inner: D) -> (Self, Arc<IoCounts>) {
        let io = Arc::new(IoCounts::default());
        (
            Counted {
                inner,
                io: Arc::clone(&io),
            },
            io,
        )
    }
}

impl<D: BlockDev> BlockDev for Counted<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.io.reads.fetch_add(1, Ordering::Relaxed);
        self.io
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.io.writes.fetch_add(1, Ordering::Relaxed);
        self.io
            .write_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    forward_device_info!(.inner);
}

/// Cumulative counters of one class (or of the whole volume) at one instant.
#[derive(Clone, Debug, Default)]
pub struct ClassTotals {
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Line accesses and hits, reads and writes (`None`: not counted by this layout).
    pub line_accesses: Option<u64>,
    pub line_hits: Option<u64>,
    pub read_line_accesses: u64,
    pub read_line_hits: u64,
    /// Share of the cache this holds, 0..1, and the dirty share of what it holds.
    pub occupancy: f64,
    pub dirty_share: f64,
}

/// What the sampler reads each second.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub layout: &'static str,
    /// The volume's name (its backing device, as `ctl stats` names it).
    pub volume_name: String,
    pub volume: ClassTotals,
    pub classes: Vec<ClassTotals>,
    /// Requests the cache device and the backing device received (reads, writes, bytes).
    pub ssd: [u64; 4],
    pub hdd: [u64; 4],
    /// The settings in force (mode, policy, sizes...).
    pub settings: serde_json::Value,
    /// Statistics this layout does not have, said on the page.
    pub missing: Vec<String>,
}

/// Rates of one class over one second.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Rates {
    pub name: String,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    /// Line hits / line accesses in this second (`None`: no accesses, or not counted).
    pub hit_ratio: Option<f64>,
    pub read_hit_ratio: Option<f64>,
    pub occupancy: f64,
    pub dirty_share: f64,
}

/// One second of the volume.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Sample {
    /// Unix time at the end of the second, in seconds.
    pub t: f64,
    pub volume: Rates,
    pub ssd_read_iops: f64,
    pub ssd_write_iops: f64,
    pub hdd_read_iops: f64,
    pub hdd_write_iops: f64,
    pub classes: Vec<Rates>,
}

fn ratio(hits: u64, accesses: u64) -> Option<f64> {
    (accesses > 0).then(|| hits as f64 / accesses as f64)
}

fn rates(a: &ClassTotals, b: &ClassTotals, secs: f64) -> Rates {
    let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let diff = |x: Option<u64>, y: Option<u64>| Some(y?.saturating_sub(x?));
    Rates {
        name: b.name.clone(),
        read_iops: per_s(a.reads, b.reads),
        write_iops: per_s(a.writes, b.writes),
        read_mbps: per_s(a.read_bytes, b.read_bytes) / 1e6,
        write_mbps: per_s(a.write_bytes, b.write_bytes) / 1e6,
        hit_ratio: diff(a.line_hits, b.line_hits)
            .zip(diff(a.line_accesses, b.line_accesses))
            .and_then(|(h, n)| ratio(h, n)),
        read_hit_ratio: ratio(
            b.read_line_hits.saturating_sub(a.read_line_hits),
            b.read_line_accesses.saturating_sub(a.read_line_accesses),
        ),
        occupancy: b.occupancy,
        dirty_share: b.dirty_share,
    }
}

impl Sample {
    /// The rates between snapshots `a` and `b`, `secs` apart (a class new in `b` counts
    /// from zero).
    pub fn between(a: &Snapshot, b: &Snapshot, secs: f64, t: f64) -> Sample {
        let secs = secs.max(1e-3);
        let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
        let zero = ClassTotals::default();
        Sample {
            t,
            volume: rates(&a.volume, &b.volume, secs),
            ssd_read_iops: per_s(a.ssd[0], b.ssd[0]),
            ssd_write_iops: per_s(a.ssd[1], b.ssd[1]),
            hdd_read_iops: per_s(a.hdd[0], b.hdd[0]),
            hdd_write_iops: per_s(a.hdd[1], b.hdd[1]),
            classes: b
                .classes
                .iter()
                .map(|c| {
                    let before = a.classes.iter().find(|x| x.name == c.name);
                    rates(before.unwrap_or(&zero), c, secs)
                })
                .collect(),
        }
    }
}

/// The ring buffer of samples and what the page shows beside it.
pub struct Dashboard {
    samples: Mutex<VecDeque<Sample>>,
    last: Mutex<Snapshot>,
}

impl Dashboard {
    /// Starts the sampler: `snap` is read once a second while the dashboard lives.
    pub fn start(
        snap: impl Fn() -> Snapshot + Send + 'static,
    ) -> io::Result<(Arc<Dashboard>, JoinHandle<()>)> {
        let first = snap();
        let d = Arc::new(Dashboard {
            samples: Mutex::new(VecDeque::with_capacity(HISTORY_SECONDS)),
            last: Mutex::new(first.clone()),
        });
        let weak: Weak<Dashboard> = Arc::downgrade(&d);
        let h = std::thread::Builder::new()
            .name("tiercache-dashboard-sampler".into())
            .spawn(move || {
                let (mut prev, mut at) = (first, Instant::now());
                let mut next = at + Duration::from_secs(1);
                loop {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    next += Duration::from_secs(1);
                    let Some(d) = weak.upgrade() else { return };
                    let s = snap();
                    let now = Instant::now();
                    d.push(Sample::between(
                        &prev,
                        &s,
                        now.duration_since(at).as_secs_f64(),
                        unix_now(),
                    ));
                    *d.last.lock().unwrap() = s.clone();
                    (prev, at) = (s, now);
                    if next < now {
                        next = now + Duration::from_secs(1); // stalled: no burst to catch up
                    }
                }
            })?;
        Ok((d, h))
    }

    fn push(&self, s: Sample) {
        let mut v = self.samples.lock().unwrap();
        if v.len() == HISTORY_SECONDS {
            v.pop_front();
        }
        v.push_back(s);
        debug_assert!(v.len() <= HISTORY_SECONDS);
    }

    /// `/api/stats`: the layout, settings, what is missing, and every sample kept.
    pub fn json(&self) -> serde_json::Value {
        let last = self.last.lock().unwrap().clone();
        let samples: Vec<Sample> = self.samples.lock().unwrap().iter().cloned().collect();
        serde_json::json!({
            "layout": last.layout,
            "volume_name": last.volume_name,
            "interval_seconds": 1,
            "history_seconds": HISTORY_SECONDS,
            "settings": last.settings,
            "missing": last.missing,
            "samples": samples,
        })
    }

    /// Serves `/` (the page) and `/api/stats` on `addr`.
    pub fn serve(self: &Arc<Self>, addr: SocketAddr) -> io::Result<(SocketAddr, JoinHandle<()>)> {
        let d = Arc::clone(self);
        crate::control::serve_http(
            addr,
            "dashboard",
            "try GET / (the dashboard) or GET /api/stats\n",
            move |path| match path {
                "/" | "/index.html" => Some(("text/html; charset=utf-8", PAGE.to_string())),
                "/api/stats" => Some(("application/json", d.json().to_string())),
                _ => None,
            },
        )
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn share(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The counts of the cache device (`[0]`) and the backing device (`[1]`).
pub type DevCounts = [Arc<IoCounts>; 2];

/// `cache` and `backing` wrapped in [`Counted`] when `count` (the dashboard is on), with
/// their counts; otherwise as they are, with counts that stay 0.
pub fn counted(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    count: bool,
) -> (Box<dyn BlockDev>, Box<dyn BlockDev>, DevCounts) {
    if !count {
        return (cache, backing, Default::default());
    }
    let (c, ci) = Counted::new(cache);
    let (b, bi) = Counted::new(backing);
    (Box::new(c), Box::new(b), [ci, bi])
}

/// A live volume's snapshot (either layout); `ssd`/`hdd` count its devices (see
/// [`Counted`]).
pub fn snapshot(vol: &dyn crate::live::LiveVolume, ssd: &IoCounts, hdd: &IoCounts) -> Snapshot {
    let s = vol.live_stats();
    let snap = match &s.log {
        Some(l) => log_snapshot(l, ssd, hdd),
        None => direct_snapshot(&s.volume, ssd, hdd),
    };
    Snapshot {
        volume_name: s.volume_name,
        ..snap
    }
}

/// A direct-layout volume's snapshot.
fn direct_snapshot(s: &crate::volume::VolumeStats, ssd: &IoCounts, hdd: &IoCounts) -> Snapshot {
    let totals =
        |name: &str, k: &tiercache_engine::Counters, cached: u64, dirty: u64| ClassTotals {
            name: name.to_string(),
            reads: k.reads,
            writes: k.writes,
            read_bytes: k.read_bytes,
            write_bytes: k.write_bytes,
            line_accesses: Some(k.line_accesses),
            line_hits: Some(k.line_hits),
            read_line_accesses: k.read_line_accesses,
            read_line_hits: k.read_line_hits,
            occupancy: share(cached, s.capacity_lines),
            dirty_share: share(dirty, cached),
        };
    Snapshot {
        layout: "direct",
        volume_name: String::new(),
        volume: totals("volume", &s.totals, s.cached_lines, s.dirty_lines),
        classes: s
            .classes
            .iter()
            .map(|c| totals(&c.name, &c.counters, c.cached_lines, c.dirty_lines))
            .collect(),
        ssd: ssd.get(),
        hdd: hdd.get(),
        settings: serde_json::json!({
            "layout": "direct",
            "mode": s.mode,
            "policy": s.policy,
            "line_size": s.line_size,
            "capacity_lines": s.capacity_lines,
            "cache_bytes": s.capacity_lines * s.line_size,
            "volume_bytes": s.volume_bytes,
            "classifier": s.classifier.is_some(),
            "cache_failed": s.cache_failed,
            "halted": s.halted,
            "degraded": s.degraded,
        }),
        missing: Vec::new(),
    }
}

/// A log-layout volume's snapshot: no classes, read hit ratio only, client bytes in whole
/// lines (said in `missing`).
fn log_snapshot(s: &crate::log_volume::LogVolumeStats, ssd: &IoCounts, hdd: &IoCounts) -> Snapshot {
    let e = &s.engine;
    Snapshot {
        layout: "log",
        volume_name: String::new(),
        volume: ClassTotals {
            name: "volume".into(),
            reads: e.reads,
            writes: e.writes,
            read_bytes: e.read_lines * s.line_size,
            write_bytes: e.write_lines * s.line_size,
            line_accesses: None,
            line_hits: None,
            read_line_accesses: e.read_lines,
            read_line_hits: e.read_line_hits,
            occupancy: share(s.ssd_bytes_used, s.segments * s.segment_size),
            dirty_share: share(s.dirty_lines, s.cached_lines),
        },
        // Per class when a class table is in force (lines of the whole-line figures).
        classes: match &s.class_table {
            None => Vec::new(),
            Some(_) => s
                .classes
                .iter()
                .map(|c| ClassTotals {
                    name: c.name.clone(),
                    reads: c.engine.reads,
                    writes: c.engine.writes,
                    read_bytes: c.engine.read_lines * s.line_size,
                    write_bytes: c.engine.write_lines * s.line_size,
                    line_accesses: None,
                    line_hits: None,
                    read_line_accesses: c.engine.read_lines,
                    read_line_hits: c.engine.read_line_hits,
                    occupancy: share(c.cached_lines, s.cached_lines),
                    dirty_share: share(c.dirty_lines, c.cached_lines),
                })
                .collect(),
        },
        ssd: ssd.get(),
        hdd: hdd.get(),
        settings: serde_json::json!({
            "layout": "log",
            "mode": s.mode,
            "line_size": s.line_size,
            "segments": s.segments,
            "segment_size": s.segment_size,
            "cache_bytes": s.segments * s.segment_size,
            "volume_bytes": s.volume_bytes,
            "compression": s.compression,
            "picker": s.picker,
            "dedup_index_ratio": s.dedup_index_ratio,
        }),
        missing: [
            (s.class_table.is_none()).then(|| {
                "per-class statistics: no class table in force (`serve --classes`, `ctl classes load`)".to_string()
            }),
        ]
        .into_iter()
        .flatten()
        .chain([

            "hit ratio of writes: the log layout counts read hits only (the chart shows the read hit ratio)".into(),
            "exact client MB/s: the log layout counts whole lines (MB/s = lines x line size)".into(),
            "occupancy is the share of segment bytes in use (compressed and deduplicated)".into(),
        ])
        .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(reads: u64, hits: u64, cls: &[(&str, u64)]) -> Snapshot {
        let t = |name: &str, r: u64| ClassTotals {
            name: name.into(),
            reads: r,
            read_bytes: r * 4096,
            line_accesses: Some(r),
            line_hits: Some(hits),
            read_line_accesses: r,
            read_line_hits: hits,
            occupancy: 0.5,
            ..Default::default()
        };
        Snapshot {
            volume: t("volume", reads),
            classes: cls.iter().map(|(n, r)| t(n, *r)).collect(),
            ssd: [reads, 0, 0, 0],
            ..Default::default()
        }
    }

    /// Rates are per second of the measured interval; a second without accesses has no
    /// hit ratio (not 0); a class appearing counts from zero.
    #[test]
    fn rates_between_snapshots() {
        let a = snap(100, 50, &[("data", 100)]);
        let b = snap(300, 150, &[("data", 300), ("meta", 10)]);
        let s = Sample::between(&a, &b, 2.0, 7.0);
        assert_eq!(s.volume.read_iops, 100.0);
        assert_eq!(s.volume.read_mbps, 100.0 * 4096.0 / 1e6);
        assert_eq!(s.volume.read_hit_ratio, Some(0.5));
        assert_eq!(s.ssd_read_iops, 100.0);
        assert_eq!(s.classes[1].name, "meta");
        assert_eq!(s.classes[1].read_iops, 5.0);
        let idle = Sample::between(&b, &b, 1.0, 8.0);
        assert_eq!(idle.volume.hit_ratio, None);
        assert_eq!(idle.volume.read_iops, 0.0);
    }

    /// The ring buffer keeps the newest HISTORY_SECONDS samples.
    #[test]
    fn ring_buffer_keeps_the_last_minutes() {
        let d = Dashboard {
            samples: Mutex::new(VecDeque::new()),
            last: Mutex::new(Snapshot::default()),
        };
        for i in 0..HISTORY_SECONDS + 25 {
            d.push(Sample {
                t: i as f64,
                ..Default::default()
            });
        }
        let j = d.json();
        let v = j["samples"].as_array().unwrap();
        assert_eq!(v.len(), HISTORY_SECONDS);
        assert_eq!(v[0]["t"], 25.0);
        assert_eq!(v[HISTORY_SECONDS - 1]["t"], (HISTORY_SECONDS + 24) as f64);
    }

    /// The page loads nothing from elsewhere (works offline): no external scripts, styles,
    /// images or fonts; the only absolute URL is the SVG namespace.
    #[test]
    fn page_is_self_contained() {
        for bad in ["<link", "src=", "@import", "url(", "//cdn", "https://"] {
            assert!(!PAGE.contains(bad), "the page refers to {bad}");
        }
        let urls: Vec<&str> = PAGE
            .match_indices("http://")
            .map(|(i, _)| &PAGE[i..i + 30])
            .collect();
        assert!(
            urls.iter()
                .all(|u| u.starts_with("http://www.w3.org/2000/svg")),
            "{urls:?}"
        );
        assert!(PAGE.contains("fetch(\"/api/stats\""));
    }

    /// Counted passes data and identity through and counts requests and bytes.
    #[test]
    fn counted_device_counts_requests() {
        let dir = std::env::temp_dir().join(format!("tc-counted-{}", std::process::id()));
        std::fs::write(&dir, vec![0u8; 8192]).unwrap();
        let f = crate::FileDev::open(&dir).unwrap();
        let want = f.identity();
        let (c, io) = Counted::new(f);
        c.write_at(&[7u8; 512], 512).unwrap();
        let mut b = [0u8; 1024];
        c.read_at(&mut b, 0).unwrap();
        assert_eq!(&b[512..], &[7u8; 512][..]);
        assert_eq!(io.get(), [1, 1, 1024, 512]);
        assert_eq!(c.identity(), want);
        std::fs::remove_file(&dir).unwrap();
    }
}
