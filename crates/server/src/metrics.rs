//! Lock-free latency histograms and the Prometheus text rendering of a volume's state.

use crate::volume::VolumeStats;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds (Prometheus `le`).
pub const BUCKETS_US: [u64; 14] = [
    25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Client request latencies (read, write) and device-side event counts.
#[derive(Default)]
pub struct Metrics {
    /// Per op (0 read, 1 write): count per bucket (last = +Inf), sum of microseconds.
    buckets: [[AtomicU64; BUCKETS_US.len() + 1]; 2],
    sum_us: [AtomicU64; 2],
    /// Cache-device syncs made to unmap records (rule 2 of `crate::volume`): on the miss
    /// path before a slot is reused, and by batches unmapping likely victims ahead of time.
    pub unmap_syncs: AtomicU64,
    /// Records unmapped on the miss path (their slot was being reused).
    pub unmap_on_miss: AtomicU64,
    /// Records of likely victims unmapped ahead of their eviction, in batches.
    pub unmap_ahead: AtomicU64,
    /// Read misses whose device steps ran outside the volume lock (`volume::fill`).
    pub unlocked_misses: AtomicU64,
    /// Requests that waited for an unlocked miss on one of their lines to commit.
    pub fill_waits: AtomicU64,
    /// Unmap-ahead passes skipped because backing syncs were failing (the batch needs one).
    pub unmap_ahead_skipped: AtomicU64,
    /// Cache-device syncs made to flag metadata pages in flux before in-place writes (rule 5
    /// of `crate::volume`), and the pages so flagged.
    pub flux_syncs: AtomicU64,
    pub flux_pages: AtomicU64,
    /// Metadata pages written by flushes.
    pub metadata_pages: AtomicU64,
    /// Cached lines relabelled by the live classifier (class learned after caching).
    pub relabelled_lines: AtomicU64,
    /// Cache-device errors (each dropped lines and was served from the backing device).
    pub cache_errors: AtomicU64,
    /// Data checksum mismatches found reading the cache device (`crate::data_sums`).
    pub checksum_errors: AtomicU64,
    /// Backing-device errors (each failed its request).
    pub backing_errors: AtomicU64,
    /// 1 once the cache device is failed and bypassed.
    pub cache_failed: AtomicU64,
    /// Bytes of dirty data lost with the cache device (not rewritten since).
    pub lost_dirty_bytes: AtomicU64,
    /// Write-backs the backing device failed (each kept its lines dirty in the cache).
    pub backing_write_errors: AtomicU64,
    /// Backing-device syncs that failed (each failed its request; what the sync may have
    /// dropped was written again from the cache or reported lost).
    pub backing_sync_errors: AtomicU64,
    /// 1 while write-backs are failing (the volume is degraded).
    pub degraded: AtomicU64,
    /// Settings changed live (`ctl set`).
    pub settings_changes: AtomicU64,
    /// Cleaning passes whose device I/O ran outside the volume lock (`crate::volume`,
    /// `clean_pass_unlocked`), requests that waited for one (they touched its lines or
    /// backing ranges, or flushed), and passes cut short for such a request.
    pub unlocked_writebacks: AtomicU64,
    pub writeback_waits: AtomicU64,
    pub writeback_yields: AtomicU64,
    /// Merged write-back groups a request took out of the unlocked pass before their I/O
    /// began (it wrote one of their lines or backing ranges): their lines stayed dirty.
    pub writeback_groups_dropped: AtomicU64,
    /// Cleaning passes (the background cleaner's) that panicked: each failed as a failed
    /// write-back does, and the cleaner went on.
    pub cleaner_panics: AtomicU64,
    /// Dirty lines given a second cache copy again by the cleaner (a pool member failed or
    /// was left out at start, then replaced: `CacheVolume::remirror_pass`).
    pub remirrored_lines: AtomicU64,
    /// Bytes clients read (0) and wrote (1), counted by `crate::live::Timed` (the log
    /// layout; the direct layout's engine counts its own).
    pub client_bytes: [AtomicU64; 2],
}

impl Metrics {
    pub fn record(&self, write: bool, d: Duration) {
        let us = d.as_micros() as u64;
        let op = write as usize;
        let i = BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_US.len());
        self.buckets[op][i].fetch_add(1, Ordering::Relaxed);
        self.sum_us[op].fetch_add(us, Ordering::Relaxed);
    }

    /// `ctl stats --reset`: zeroes the latency histograms and the event counts (unmaps,
    /// in-flux flags, metadata pages, relabelled lines, unlocked cleaning passes, their waits
    /// and yields); fault counts and states are kept.
    pub fn reset(&self) {
        for b in self
            .buckets
            .iter()
            .flatten()
            .chain(&self.sum_us)
            .chain(&self.client_bytes)
        {
            b.store(0, Ordering::Relaxed);
        }
        for c in [
            &self.unmap_syncs,
            &self.unmap_on_miss,
            &self.unmap_ahead,
            &self.unlocked_misses,
            &self.fill_waits,
            &self.unmap_ahead_skipped,
            &self.flux_syncs,
            &self.flux_pages,
            &self.metadata_pages,
            &self.relabelled_lines,
            &self.unlocked_writebacks,
            &self.writeback_waits,
            &self.writeback_yields,
            &self.writeback_groups_dropped,
            &self.cleaner_panics,
            &self.remirrored_lines,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Cumulative bucket counts of one op (`le` order, last = +Inf = total).
    pub fn cumulative(&self, write: bool) -> Vec<u64> {
        let mut acc = 0;
        self.buckets[write as usize]
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect()
    }

    /// The Prometheus text exposition of `stats` and these histograms.
    pub fn prometheus(&self, stats: &VolumeStats) -> String {
        let mut o = String::new();
        let mut counter =
            |name: &str, help: &str, f: &dyn Fn(&tiercache_engine::Counters) -> u64| {
                let _ = writeln!(
                    o,
                    "# HELP tiercache_{name} {help}\n# TYPE tiercache_{name} counter"
                );
                for c in &stats.classes {
                    let _ = writeln!(
                        o,
                        "tiercache_{name}{{class=\"{}\"}} {}",
                        label(&c.name),
                        f(&c.counters)
                    );
                }
            };
        counter("requests_total", "Client requests.", &|k| k.requests);
        counter(
            "line_hits_total",
            "Line accesses served from the cache.",
            &|k| k.line_hits,
        );
        counter(
            "line_misses_total",
            "Line accesses not in the cache.",
            &|k| k.line_misses,
        );
        counter(
            "bypasses_total",
            "Missed lines not admitted (all reasons).",
            &|k| k.line_misses.saturating_sub(k.admitted_misses),
        );
        counter(
            "seq_cutoff_bypasses_total",
            "Missed lines of sequential streams past the cutoff, sent around the cache.",
            &|k| k.bypasses.seq_cutoff,
        );
        counter("insertions_total", "Lines put in the cache.", &|k| {
            k.insertions
        });
        counter("evictions_total", "Lines evicted.", &|k| k.evictions);
        counter(
            "write_backs_total",
            "Dirty lines written to the backing device.",
            &|k| k.write_backs,
        );
        counter("read_bytes_total", "Bytes clients read.", &|k| k.read_bytes);
        counter("write_bytes_total", "Bytes clients wrote.", &|k| {
            k.write_bytes
        });
        let gauges = [
            ("cached_lines", "Lines in the cache.", stats.cached_lines),
            (
                "capacity_lines",
                "Cache capacity in lines.",
                stats.capacity_lines,
            ),
            ("dirty_lines", "Dirty lines.", stats.dirty_lines),
            ("dirty_bytes", "Dirty bytes (sectors).", stats.dirty_bytes),
            (
                "ram_index_bytes",
                "RAM held by the index and metadata images.",
                stats.ram_index_bytes,
            ),
        ];
        for (n, h, v) in gauges {
            let _ = writeln!(
                o,
                "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} gauge\ntiercache_{n} {v}"
            );
        }
        if let Some(r) = &stats.ram {
            let _ = writeln!(
                o,
                "# HELP tiercache_tier_read_requests_total Read requests by the tier that served them whole: ram, ssd, or backing (some line missed the cache).\n# TYPE tiercache_tier_read_requests_total counter\ntiercache_tier_read_requests_total{{tier=\"ram\"}} {}\ntiercache_tier_read_requests_total{{tier=\"ssd\"}} {}\ntiercache_tier_read_requests_total{{tier=\"backing\"}} {}",
                r.ram_hits, r.ssd_hits, r.misses
            );
            let k = &r.counters;
            for (n, t, h, v) in [
                (
                    "ram_cached_lines",
                    "gauge",
                    "Lines in the RAM tier.",
                    r.cached_lines,
                ),
                (
                    "ram_capacity_lines",
                    "gauge",
                    "RAM tier capacity in lines.",
                    r.capacity_lines,
                ),
                (
                    "ram_bytes",
                    "gauge",
                    "RAM the RAM tier holds (data and metadata).",
                    r.data_bytes + r.metadata_bytes,
                ),
                (
                    "ram_fills_total",
                    "counter",
                    "Lines put in the RAM tier after a read below.",
                    k.fills,
                ),
                (
                    "ram_evictions_total",
                    "counter",
                    "Lines evicted from the RAM tier.",
                    k.evictions,
                ),
                (
                    "ram_invalidations_total",
                    "counter",
                    "RAM tier lines dropped by a write, trim or write-zeroes.",
                    k.invalidations,
                ),
                (
                    "ram_fills_skipped_total",
                    "counter",
                    "RAM tier fills refused: a write met the line while its read was in flight.",
                    k.fills_skipped,
                ),
            ] {
                let _ = writeln!(
                    o,
                    "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} {t}\ntiercache_{n} {v}"
                );
            }
        }
        fault_metrics(
            &mut o,
            &FaultFigures {
                cache_errors: stats.cache_errors,
                checksum_errors: stats.checksum_errors,
                backing_errors: stats.backing_errors,
                backing_write_errors: stats.backing_write_errors,
                backing_sync_errors: stats.backing_sync_errors,
                cache_failed: stats.cache_failed,
                halted: stats.halted,
                lost_dirty_bytes: stats.lost_dirty_bytes,
                lost_ranges: stats.lost_ranges,
                degraded: stats.degraded,
            },
        );
        if !stats.pool_members.is_empty() {
            type MemberFigure = fn(&crate::volume::PoolMemberStats) -> u64;
            let figures: [(&str, &str, &str, MemberFigure); 8] = [
                (
                    "pool_member_errors_total",
                    "counter",
                    "Errors of a pool member (cache device); at --max-cache-errors it is failed alone.",
                    |m| m.errors,
                ),
                (
                    "pool_member_failed",
                    "gauge",
                    "1 when the pool member failed (nothing reaches it; the others serve on).",
                    |m| (m.state == "failed") as u64,
                ),
                ("pool_member_lines", "gauge", "Lines cached on the pool member.", |m| {
                    m.lines
                }),
                (
                    "pool_member_dirty_lines",
                    "gauge",
                    "Dirty lines on the pool member.",
                    |m| m.dirty_lines,
                ),
                (
                    "pool_member_reads_total",
                    "counter",
                    "Device reads the pool member was given (data, records, superblock).",
                    |m| m.reads,
                ),
                (
                    "pool_member_writes_total",
                    "counter",
                    "Device writes the pool member was given (data, records, superblock).",
                    |m| m.writes,
                ),
                (
                    "pool_member_read_bytes_total",
                    "counter",
                    "Bytes read from the pool member.",
                    |m| m.read_bytes,
                ),
                (
                    "pool_member_written_bytes_total",
                    "counter",
                    "Bytes written to the pool member.",
                    |m| m.written_bytes,
                ),
            ];
            for (n, t, h, f) in figures {
                let _ = writeln!(o, "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} {t}");
                for m in &stats.pool_members {
                    let _ = writeln!(o, "tiercache_{n}{{member=\"{}\"}} {}", m.index, f(m));
                }
            }
            // What an operator alerts on after a member failure: dirty lines with one copy
            // (a second failure would lose them) falling to 0 as the cleaner re-mirrors.
            for (n, t, h, v) in [
                (
                    "pool_unmirrored_lines",
                    "gauge",
                    "Dirty lines with one cache copy (--dirty-copies 2 pools after a member failure, until re-mirrored or written back).",
                    stats.unmirrored_lines,
                ),
                (
                    "pool_copy_slots",
                    "gauge",
                    "Slots holding a dirty line's second cache copy.",
                    stats.copy_slots,
                ),
                (
                    "pool_remirrored_lines_total",
                    "counter",
                    "Dirty lines given a second copy again by the cleaner.",
                    stats.remirrored_lines,
                ),
            ] {
                let _ = writeln!(
                    o,
                    "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} {t}\ntiercache_{n} {v}"
                );
            }
        }
        type ClassGauge = fn(&crate::classify::ClassStats) -> u64;
        let class_gauges: [(&str, &str, ClassGauge); 2] = [
            (
                "class_cached_lines",
                "Lines in the cache per I/O class (occupancy).",
                |c| c.cached_lines,
            ),
            ("class_dirty_lines", "Dirty lines per I/O class.", |c| {
                c.dirty_lines
            }),
        ];
        for (n, h, f) in class_gauges {
            let _ = writeln!(o, "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} gauge");
            for c in &stats.classes {
                let _ = writeln!(o, "tiercache_{n}{{class=\"{}\"}} {}", label(&c.name), f(c));
            }
        }
        let _ = writeln!(
            o,
            "# HELP tiercache_relabelled_lines_total Cached lines relabelled by the classifier.\n# TYPE tiercache_relabelled_lines_total counter\ntiercache_relabelled_lines_total {}",
            self.relabelled_lines.load(Ordering::Relaxed)
        );
        for (n, h, v) in [
            (
                "unmap_syncs_total",
                "Cache syncs that made records unmapped before their slot's reuse durable (on the miss path or in a batch ahead of evictions).",
                stats.unmap_syncs,
            ),
            (
                "unmapped_on_miss_total",
                "Records unmapped on the miss path (their slot was being reused).",
                stats.unmap_on_miss,
            ),
            (
                "unlocked_misses_total",
                "Read misses whose backing read and cache write ran outside the volume lock.",
                stats.unlocked_misses,
            ),
            (
                "unmapped_ahead_total",
                "Records of likely victims unmapped ahead of their eviction, in batches.",
                stats.unmap_ahead,
            ),
            (
                "unmap_ahead_skipped_total",
                "Unmap-ahead passes skipped while backing syncs fail (the batch needs a sync first).",
                stats.unmap_ahead_skipped,
            ),
            (
                "flux_syncs_total",
                "Cache syncs made to flag metadata pages in flux before in-place writes.",
                stats.flux_syncs,
            ),
            (
                "flux_pages_total",
                "Metadata pages flagged in flux before in-place writes.",
                stats.flux_pages,
            ),
            (
                "metadata_pages_written_total",
                "Metadata pages written by flushes.",
                stats.metadata_pages_written,
            ),
            (
                "unlocked_writebacks_total",
                "Cleaning passes whose device I/O ran outside the volume lock.",
                stats.unlocked_writebacks,
            ),
            (
                "writeback_waits_total",
                "Requests that waited for a cleaning pass's I/O (they touched its lines or backing ranges, or flushed).",
                stats.writeback_waits,
            ),
            (
                "writeback_yields_total",
                "Cleaning passes cut short for a waiting request (their unwritten lines stay dirty).",
                stats.writeback_yields,
            ),
            (
                "writeback_groups_dropped_total",
                "Merged write-back groups a request took out of a cleaning pass before their I/O began (it wrote their lines or backing range; the lines stay dirty for a later pass).",
                stats.writeback_groups_dropped,
            ),
            (
                "cleaner_panics_total",
                "Background cleaning passes that panicked (a bug: each failed its pass, lines stayed dirty, the cleaner went on).",
                stats.cleaner_panics,
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} counter\ntiercache_{n} {v}"
            );
        }
        if let Some(ct) = &stats.class_table {
            let _ = writeln!(
                o,
                "# HELP tiercache_class_table_loads_total Class tables loaded live (`ctl classes load`) since the start.\n# TYPE tiercache_class_table_loads_total counter\ntiercache_class_table_loads_total {}",
                ct.loads
            );
        }
        // The settings in force (`ctl get`; changed live by `ctl set`).
        let t = &stats.settings.tuning;
        let _ = writeln!(
            o,
            "# HELP tiercache_setting_admission_threshold Populate a group once it was accessed this often in the direction (0: never).\n# TYPE tiercache_setting_admission_threshold gauge\ntiercache_setting_admission_threshold{{op=\"read\"}} {}\ntiercache_setting_admission_threshold{{op=\"write\"}} {}",
            t.admission.read_threshold, t.admission.write_threshold
        );
        let _ = writeln!(
            o,
            "# HELP tiercache_setting_seq_cutoff_bytes Sequential cutoff per direction (0: off).\n# TYPE tiercache_setting_seq_cutoff_bytes gauge\ntiercache_setting_seq_cutoff_bytes{{op=\"read\"}} {}\ntiercache_setting_seq_cutoff_bytes{{op=\"write\"}} {}",
            t.seq_cutoff_read, t.seq_cutoff_write
        );
        for (n, h, v) in [
            (
                "group_size_bytes",
                "Admission/population unit.",
                t.group_size as f64,
            ),
            (
                "dirty_high_ratio",
                "Write-back: clean above this dirty share.",
                t.dirty_high,
            ),
            (
                "dirty_low_ratio",
                "Write-back: clean down to this dirty share.",
                t.dirty_low,
            ),
            (
                "clean_victim_window",
                "Eviction prefers a clean line among the policy's next this-many likely victims (0: off).",
                f64::from(t.clean_victim_window),
            ),
            (
                "partial_write_fill",
                "1: a partial write to an uncached line reads the rest of it; 0: it goes around the cache.",
                f64::from(u8::from(t.partial_write_fill)),
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP tiercache_setting_{n} {h}\n# TYPE tiercache_setting_{n} gauge\ntiercache_setting_{n} {v}"
            );
        }
        let _ = writeln!(
            o,
            "# HELP tiercache_setting_changes_total Settings changed live (ctl set).\n# TYPE tiercache_setting_changes_total counter\ntiercache_setting_changes_total {}",
            stats.settings.changes
        );
        let _ = writeln!(
            o,
            "# HELP tiercache_request_latency_seconds Client request latency.\n# TYPE tiercache_request_latency_seconds histogram"
        );
        for (w, op) in [(false, "read"), (true, "write")] {
            let cum = self.cumulative(w);
            for (i, c) in cum.iter().enumerate() {
                let le = BUCKETS_US
                    .get(i)
                    .map(|&u| format!("{}", u as f64 / 1e6))
                    .unwrap_or_else(|| "+Inf".into());
                let _ = writeln!(
                    o,
                    "tiercache_request_latency_seconds_bucket{{op=\"{op}\",class=\"0\",le=\"{le}\"}} {c}"
                );
            }
            let sum = self.sum_us[w as usize].load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                o,
                "tiercache_request_latency_seconds_sum{{op=\"{op}\",class=\"0\"}} {sum}"
            );
            let _ = writeln!(
                o,
                "tiercache_request_latency_seconds_count{{op=\"{op}\",class=\"0\"}} {}",
                cum.last().unwrap()
            );
        }
        o
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The fault figures both layouts export (`crate::degrade`).
pub struct FaultFigures {
    pub cache_errors: u64,
    /// Data checksum mismatches (`crate::data_sums`; 0 without data checksums).
    pub checksum_errors: u64,
    pub backing_errors: u64,
    pub backing_write_errors: u64,
    pub backing_sync_errors: u64,
    pub cache_failed: bool,
    /// A panic while the volume lock was held stopped the volume.
    pub halted: bool,
    pub lost_dirty_bytes: u64,
    /// Volume ranges reported lost (reads fail until rewritten; durable across restarts).
    pub lost_ranges: u64,
    pub degraded: bool,
}

/// Appends the fault metrics (same names for both layouts) to `o`.
pub fn fault_metrics(o: &mut String, f: &FaultFigures) {
    for (n, h, v) in [
        (
            "cache_device_errors_total",
            "Cache-device I/O errors (served from the backing device).",
            f.cache_errors,
        ),
        (
            "data_checksum_errors_total",
            "Data checksum mismatches reading the cache device (clean: re-read from the backing device; dirty: lost, reads fail).",
            f.checksum_errors,
        ),
        (
            "backing_device_errors_total",
            "Backing-device I/O errors (each failed its request).",
            f.backing_errors,
        ),
        (
            "backing_write_back_errors_total",
            "Write-backs the backing device failed (their lines stayed dirty in the cache).",
            f.backing_write_errors,
        ),
        (
            "backing_sync_errors_total",
            "Backing-device syncs that failed (their request failed; the writes the sync may have dropped were written again from the cache or reported lost).",
            f.backing_sync_errors,
        ),
    ] {
        let _ = writeln!(
            o,
            "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} counter\ntiercache_{n} {v}"
        );
    }
    for (n, h, v) in [
        (
            "cache_failed",
            "1 when the cache device failed and every request passes through.",
            f.cache_failed as u64,
        ),
        (
            "halted",
            "1 when a panic while the volume lock was held stopped the volume (a bug): every request fails until `tiercache serve` is restarted, which recovers from the device.",
            f.halted as u64,
        ),
        (
            "lost_dirty_bytes",
            "Dirty bytes lost with the cache device (reads of them fail).",
            f.lost_dirty_bytes,
        ),
        (
            "lost_ranges",
            "Volume ranges whose acknowledged data was lost (reads fail with EIO until rewritten; kept across restarts by the lost-range list).",
            f.lost_ranges,
        ),
        (
            "degraded",
            "1 while the backing device fails write-backs (dirty data stays in the cache and is retried, only clean data is evicted) or syncs (requests that need one fail; retried with backoff).",
            f.degraded as u64,
        ),
    ] {
        let _ = writeln!(
            o,
            "# HELP tiercache_{n} {h}\n# TYPE tiercache_{n} gauge\ntiercache_{n} {v}"
        );
    }
}
