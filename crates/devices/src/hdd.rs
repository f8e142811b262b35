//! Hard disk timing model: one actuator, a seek curve from cylinder distance, rotational
//! position as a function of simulated time, zoned transfer rate, read-ahead, and a
//! shortest-positioning-time-first command queue.
//!
//! Geometry. The platter spins from angle 0 at t = 0, so its phase at time `t` is
//! `t mod T` (T = one revolution). Bytes are laid out from the outer edge inwards at constant
//! linear density: the media rate is proportional to the radius, which makes it fall as
//! `R(f) = R_outer * sqrt(1 - f * (1 - k^2))` with `f` the byte's fraction of the capacity and
//! `k = R_inner / R_outer` (datasheet sustained range, e.g. 142 -> 75 MB/s [CSAS]). A byte's
//! *media time* `M(b) = integral of db / R` (closed form) is how long the head needs to read
//! from byte 0 to `b`; the byte's angular phase is `(M(b) + cyl(b) * skew) mod T`, where the
//! per-cylinder skew equals the track-to-track seek, so a sequential transfer that crosses a
//! cylinder arrives exactly on its next sector. Radius, and so the cylinder for seek
//! distances, follows from the rate: `cyl = C * (1 - R/R_outer) / (1 - k)`.
//!
//! Service of a read or write arriving at `a`, dispatched at `t`:
//! `ready = max(t, a + controller overhead)` (overhead of queued commands overlaps the one in
//! service), then seek (Lee's 3-point curve [DS-DOC], plus write settle for writes that move
//! the arm), then wait for the target sector to come under the head, then transfer
//! `M(end) - M(offset)` (plus skews). The head stays where the op ended.
//!
//! Read-ahead: after a read the drive keeps reading the following sectors into its buffer
//! (up to `read_ahead_bytes`) until another command moves the head, so a sequential read
//! that arrives after a short gap pays neither seek nor rotation. Writes have no such help:
//! the model has no volatile write cache (write-cache-disabled behaviour), so back-to-back
//! sequential writes at queue depth 1 lose most of a revolution each, as real drives with
//! WCE off do.

use crate::checked::{Done, Model};
use crate::{ms_to_ns, IoKind, IoOp};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Names accepted by [`HddConfig::preset`] (also as `hdd:<name>`).
pub const HDD_PRESETS: &[&str] = &["5400", "7200", "10k", "15k"];

/// Parameters of a hard disk. Seek figures are read seeks without controller overhead, as
/// Seagate and Hitachi datasheets give them; `MB` = 10^6 bytes. Defaults = preset `7200`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HddConfig {
    /// Name reported by the device.
    pub name: String,
    /// Spindle speed. One revolution takes 60e9 / rpm ns.
    pub rpm: u32,
    pub capacity_bytes: u64,
    /// Number of cylinders. Only scales the x-axis of the seek curve (whose shape is set by
    /// the three seek times), so an approximate value is fine.
    pub cylinders: u64,
    /// Single-cylinder seek (read).
    pub seek_track_to_track_ms: f64,
    /// Average seek over uniformly random pairs of cylinders (read). Lee's formula makes the
    /// mean over random seeks equal to this.
    pub seek_avg_ms: f64,
    /// Full-stroke seek (read).
    pub seek_full_stroke_ms: f64,
    /// Extra settle time of a write after the arm moved (write seek minus read seek).
    pub write_settle_ms: f64,
    /// Sustained media rate at the outer edge (byte 0).
    pub rate_outer_mb_s: f64,
    /// Sustained media rate at the inner edge (last byte).
    pub rate_inner_mb_s: f64,
    /// Controller time per command, from arrival; overlaps the service of the command
    /// before it when commands are queued.
    pub controller_overhead_ms: f64,
    /// Cost of a flush (there is no write cache to destage; this is the command round trip).
    pub flush_ms: f64,
    /// Commands the drive sees at once (NCQ/TCQ depth). 1 = FIFO; more = shortest
    /// positioning time first among the `queue_depth` oldest queued commands.
    pub queue_depth: u32,
    /// How far the drive reads ahead after a read (0 = no read-ahead).
    pub read_ahead_bytes: u64,
    /// Starvation guard for SPTF: once the oldest queued command has waited this long it
    /// goes next. `None` = pure SPTF. NOTE: set it well above `queue_depth` x a random
    /// service time, or the drive falls back to FIFO under load.
    pub max_queue_wait_ms: Option<f64>,
}

impl Default for HddConfig {
    fn default() -> Self {
        Self::preset("7200").expect("7200 preset")
    }
}

impl HddConfig {
    /// A named preset; see [`HDD_PRESETS`]. Sources are DEVICES.md reference keys.
    pub fn preset(name: &str) -> Option<Self> {
        // Shared assumptions (no value in DEVICES.md): 100k cylinders (only scales the seek
        // curve's x-axis), 0.1 ms controller overhead (DEVICES.md notes seek figures exclude
        // it), 0.05 ms flush round trip, 1 MiB read-ahead (one segment of a 16-32 MB buffer
        // [CW]), NCQ depth 32 (the SATA NCQ maximum).
        let base = HddConfig {
            name: String::new(),
            rpm: 7200,
            capacity_bytes: 0,
            cylinders: 100_000,
            seek_track_to_track_ms: 0.0,
            seek_avg_ms: 0.0,
            seek_full_stroke_ms: 0.0,
            write_settle_ms: 0.0,
            rate_outer_mb_s: 0.0,
            rate_inner_mb_s: 0.0,
            controller_overhead_ms: 0.1,
            flush_ms: 0.05,
            queue_depth: 32,
            read_ahead_bytes: 1 << 20,
            max_queue_wait_ms: None,
        };
        let c = match name.strip_prefix("hdd:").unwrap_or(name) {
            // Hitachi Travelstar 5K320 (2.5"): 5400 rpm, seeks 1.0 / 12 / 20.0 ms read and
            // 1.1 / 13 / 21.0 write [5K320]. Capacity: 320 GB, the family's name (the table
            // has ?). Rates: assumed 60 -> 30 MB/s (no sourced figure for 5400 rpm drives).
            "5400" => HddConfig {
                name: "hdd:5400".into(),
                rpm: 5400,                       // [5K320]
                capacity_bytes: 320_000_000_000, // family name 5K320 (assumed)
                seek_track_to_track_ms: 1.0,     // [5K320]
                seek_avg_ms: 12.0,               // [5K320]
                seek_full_stroke_ms: 20.0,       // [5K320]
                write_settle_ms: 1.0,            // calc: 13 - 12 [5K320]
                rate_outer_mb_s: 60.0,           // assumed
                rate_inner_mb_s: 30.0,           // assumed
                ..base
            },
            // Seagate Constellation 2.5" SAS ST9500430SS, the sourced proxy for the
            // Constellation ES.1 7200 rpm drives [CSAS]: seeks 0.5 / 8.0 / 17.35 ms read,
            // 0.7 / 8.4 / 17.82 write, 75-142 MB/s, 500 GB.
            "7200" => HddConfig {
                name: "hdd:7200".into(),
                rpm: 7200,                       // [CSAS]
                capacity_bytes: 500_000_000_000, // [CSAS]
                seek_track_to_track_ms: 0.5,     // [CSAS]
                seek_avg_ms: 8.0,                // [CSAS]
                seek_full_stroke_ms: 17.35,      // [CSAS]
                write_settle_ms: 0.4,            // calc: 8.4 - 8.0 [CSAS]
                rate_outer_mb_s: 142.0,          // [CSAS]
                rate_inner_mb_s: 75.0,           // [CSAS]
                ..base
            },
            // WD VelociRaptor 600 GB: 10,000 rpm [TIT-VR]. Seek: Maxtor Atlas 10K V curve
            // (10K proxy) 1-cyl 0.526 ms, 80k-cyl 9.57 ms read, 0.676 / 9.72 write [DS-MAX];
            // average calc = 9.57 * 8.0 / 17.35 (the [CSAS] avg/full ratio). Rates: assumed
            // 145 -> 95 MB/s (no sourced figure).
            "10k" | "10000" => HddConfig {
                name: "hdd:10k".into(),
                rpm: 10_000,                     // [TIT-VR]
                capacity_bytes: 600_000_000_000, // [TIT-VR]
                seek_track_to_track_ms: 0.526,   // [DS-MAX] proxy
                seek_avg_ms: 4.41,               // calc: 9.57 * 8.0 / 17.35 [DS-MAX][CSAS]
                seek_full_stroke_ms: 9.57,       // [DS-MAX] proxy
                write_settle_ms: 0.15,           // calc: 0.676 - 0.526 [DS-MAX]
                rate_outer_mb_s: 145.0,          // assumed
                rate_inner_mb_s: 95.0,           // assumed
                ..base
            },
            // 15K SAS class: rotation, rates and capacity of the Seagate Cheetah 15K.7
            // ST3600057SS (2.0 ms latency, 122-204 MB/s, 600 GB) [CH15K7]; average seek of the
            // Hitachi Ultrastar 15K450 (3.3 read / 3.8 write ms typ) [US15K]; track-to-track
            // and full stroke calc from it with the [CSAS] shape (0.5/8.0 and 17.35/8.0).
            "15k" | "15000" => HddConfig {
                name: "hdd:15k".into(),
                rpm: 15_000,                     // [CH15K7]
                capacity_bytes: 600_000_000_000, // [CH15K7]
                seek_track_to_track_ms: 0.206,   // calc: 3.3 * 0.5 / 8.0 [US15K][CSAS]
                seek_avg_ms: 3.3,                // [US15K]
                seek_full_stroke_ms: 7.16,       // calc: 3.3 * 17.35 / 8.0 [US15K][CSAS]
                write_settle_ms: 0.5,            // calc: 3.8 - 3.3 [US15K]
                rate_outer_mb_s: 204.0,          // [CH15K7]
                rate_inner_mb_s: 122.0,          // [CH15K7]
                ..base
            },
            _ => return None,
        };
        Some(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        let pos = |v: f64, what: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{}: {what} must be > 0 (got {v})", self.name))
            }
        };
        if self.rpm == 0 || self.capacity_bytes == 0 || self.cylinders < 2 || self.queue_depth == 0
        {
            return Err(format!(
                "{}: rpm, capacity_bytes, queue_depth must be > 0 and cylinders >= 2",
                self.name
            ));
        }
        pos(self.seek_track_to_track_ms, "seek_track_to_track_ms")?;
        pos(self.seek_avg_ms, "seek_avg_ms")?;
        pos(self.seek_full_stroke_ms, "seek_full_stroke_ms")?;
        pos(self.rate_outer_mb_s, "rate_outer_mb_s")?;
        pos(self.rate_inner_mb_s, "rate_inner_mb_s")?;
        if !(self.seek_track_to_track_ms <= self.seek_avg_ms
            && self.seek_avg_ms <= self.seek_full_stroke_ms)
        {
            return Err(format!(
                "{}: seeks must satisfy track-to-track <= average <= full stroke",
                self.name
            ));
        }
        if self.rate_inner_mb_s > self.rate_outer_mb_s {
            return Err(format!("{}: rate_inner_mb_s > rate_outer_mb_s", self.name));
        }
        for (v, what) in [
            (self.write_settle_ms, "write_settle_ms"),
            (self.controller_overhead_ms, "controller_overhead_ms"),
            (self.flush_ms, "flush_ms"),
            (self.max_queue_wait_ms.unwrap_or(0.0), "max_queue_wait_ms"),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{}: {what} must be >= 0", self.name));
            }
        }
        let seek = SeekCurve::new(self);
        let mut last = 0.0;
        for i in 0..=1000 {
            let d = 1 + (self.cylinders - 1) * i / 1000;
            let t = seek.at(d);
            if t < last - 1e-6 || t < 0.0 {
                return Err(format!(
                    "{}: the seek triple {}/{}/{} ms gives a seek curve that falls at {d} \
                     cylinders; raise the full-stroke time or lower the average",
                    self.name,
                    self.seek_track_to_track_ms,
                    self.seek_avg_ms,
                    self.seek_full_stroke_ms
                ));
            }
            last = t;
        }
        Ok(())
    }
}

/// Lee's 3-point seek curve [DS-DOC]: `t(x) = a*sqrt(x-1) + b*(x-1) + c` for a distance of
/// `x >= 1` cylinders, with `a = (-10 min + 15 avg - 5 max) / (3 sqrt(C))`,
/// `b = (7 min - 15 avg + 8 max) / (3 C)`, `c = min`. Short seeks grow like a square root
/// (the arm accelerates), long ones linearly (it coasts); `t(C) = max`, and the mean over
/// uniformly random cylinder pairs is `avg`.
#[derive(Clone, Debug)]
struct SeekCurve {
    a: f64,
    b: f64,
    c: f64,
}

impl SeekCurve {
    fn new(cfg: &HddConfig) -> Self {
        let (min, avg, max) = (
            cfg.seek_track_to_track_ms * 1e6,
            cfg.seek_avg_ms * 1e6,
            cfg.seek_full_stroke_ms * 1e6,
        );
        let n = cfg.cylinders as f64;
        SeekCurve {
            a: (-10.0 * min + 15.0 * avg - 5.0 * max) / (3.0 * n.sqrt()),
            b: (7.0 * min - 15.0 * avg + 8.0 * max) / (3.0 * n),
            c: min,
        }
    }

    /// Seek time in ns for a distance of `d` cylinders (0 for none).
    fn at(&self, d: u64) -> f64 {
        if d == 0 {
            return 0.0;
        }
        let x = (d - 1) as f64;
        self.a * x.sqrt() + self.b * x + self.c
    }
}

/// Where bytes are and how long they take under the head.
#[derive(Clone, Debug)]
struct Geometry {
    capacity: u64,
    rev_ns: u64,
    /// Outer media rate in bytes per ns.
    rate_outer: f64,
    /// `k = inner / outer`, and `1 - k^2`.
    k: f64,
    alpha: f64,
    cylinders: u64,
    skew_ns: u64,
}

impl Geometry {
    /// Media rate at byte `b`, bytes per ns.
    fn rate(&self, b: u64) -> f64 {
        let f = b.min(self.capacity) as f64 / self.capacity as f64;
        self.rate_outer * (1.0 - self.alpha * f).max(0.0).sqrt()
    }

    fn cyl(&self, b: u64) -> u64 {
        if self.k >= 1.0 {
            let x = b as f64 / self.capacity as f64;
            return ((x * self.cylinders as f64) as u64).min(self.cylinders - 1);
        }
        let x = (1.0 - self.rate(b) / self.rate_outer) / (1.0 - self.k);
        ((x * self.cylinders as f64) as u64).min(self.cylinders - 1)
    }

    /// Head time from byte 0 to byte `b` (`M(b) + cyl(b) * skew`), in whole ns. Differences of
    /// this are transfer times; modulo a revolution it is the byte's angular phase.
    fn pos_ns(&self, b: u64) -> u64 {
        let b = b.min(self.capacity);
        // M(b) = integral_0^b dx / (R_o sqrt(1 - alpha x / cap))
        //      = 2 b / (R_o (1 + sqrt(1 - alpha b / cap)))   (stable form)
        let y = self.alpha * b as f64 / self.capacity as f64;
        let m = 2.0 * b as f64 / (self.rate_outer * (1.0 + (1.0 - y).max(0.0).sqrt()));
        m.round() as u64 + self.cyl(b) * self.skew_ns
    }

    fn phase(&self, t_ns: u64) -> u64 {
        t_ns % self.rev_ns
    }
}

#[derive(Clone, Debug)]
struct Pending {
    tag: u64,
    op: IoOp,
    arrival_ns: u64,
}

/// The head is streaming (reading ahead) since a read ended: it is at byte `b` at time
/// `anchor_ns + pos(b) - pos(anchor_byte)`, until it reaches `consumed + read_ahead`.
#[derive(Clone, Copy, Debug)]
struct Stream {
    anchor_byte: u64,
    anchor_ns: u64,
    consumed: u64,
}

/// What serving one command does.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// When the media transfer starts (the SPTF key).
    begin_ns: u64,
    finish_ns: u64,
    head_byte: u64,
    stream: Option<Stream>,
}

/// The hard disk model. Use it through [`crate::Checked`] (see [`crate::build`]).
pub struct Hdd {
    cfg: HddConfig,
    g: Geometry,
    seek: SeekCurve,
    overhead_ns: u64,
    settle_ns: u64,
    flush_ns: u64,
    max_wait_ns: Option<u64>,
    queue: VecDeque<Pending>,
    /// The command in service: (tag, finish time).
    busy: Option<(u64, u64)>,
    /// Trims: complete on arrival, no mechanical work.
    instant: Vec<Done>,
    head_byte: u64,
    stream: Option<Stream>,
}

impl Hdd {
    pub fn new(cfg: HddConfig) -> Result<Self, String> {
        cfg.validate()?;
        let seek = SeekCurve::new(&cfg);
        let rev_ns = (60e9 / cfg.rpm as f64).round() as u64;
        let k = cfg.rate_inner_mb_s / cfg.rate_outer_mb_s;
        let g = Geometry {
            capacity: cfg.capacity_bytes,
            rev_ns,
            rate_outer: cfg.rate_outer_mb_s * 1e-3,
            k,
            alpha: 1.0 - k * k,
            cylinders: cfg.cylinders,
            skew_ns: seek.at(1).round() as u64,
        };
        Ok(Hdd {
            overhead_ns: ms_to_ns(cfg.controller_overhead_ms),
            settle_ns: ms_to_ns(cfg.write_settle_ms),
            flush_ns: ms_to_ns(cfg.flush_ms),
            max_wait_ns: cfg.max_queue_wait_ms.map(ms_to_ns),
            g,
            seek,
            cfg,
            queue: VecDeque::new(),
            busy: None,
            instant: Vec::new(),
            head_byte: 0,
            stream: None,
        })
    }

    pub fn config(&self) -> &HddConfig {
        &self.cfg
    }

    /// One revolution, ns.
    pub fn revolution_ns(&self) -> u64 {
        self.g.rev_ns
    }

    /// Seek time in ns over `d` cylinders (read).
    pub fn seek_ns(&self, d: u64) -> u64 {
        self.seek.at(d).round() as u64
    }

    /// Media rate at byte `b`, MB/s.
    pub fn rate_mb_s(&self, b: u64) -> f64 {
        self.g.rate(b) * 1e3
    }

    /// Cylinder holding byte `b`.
    pub fn cylinder_of(&self, b: u64) -> u64 {
        self.g.cyl(b)
    }

    /// Time at which the read-ahead of stream `s` stops (buffer full).
    fn stream_stop_ns(&self, s: &Stream) -> u64 {
        let win_end = (s.consumed + self.cfg.read_ahead_bytes).min(self.g.capacity);
        s.anchor_ns + self.g.pos_ns(win_end) - self.g.pos_ns(s.anchor_byte)
    }

    fn head_cyl(&self, t_ns: u64) -> u64 {
        match &self.stream {
            Some(s) if t_ns <= self.stream_stop_ns(s) => self.g.cyl(s.consumed),
            Some(s) => self
                .g
                .cyl((s.consumed + self.cfg.read_ahead_bytes).min(self.g.capacity)),
            None => self.g.cyl(self.head_byte),
        }
    }

    fn plan(&self, t_ns: u64, p: &Pending) -> Plan {
        let ready = t_ns.max(p.arrival_ns + self.overhead_ns);
        let op = &p.op;
        match op.kind {
            IoKind::Flush | IoKind::Trim => {
                return Plan {
                    begin_ns: ready,
                    finish_ns: ready + self.flush_ns,
                    head_byte: self.head_byte,
                    stream: self.stream,
                }
            }
            IoKind::Read | IoKind::Write => {}
        }
        let (off, end) = (op.offset, op.end());
        if op.kind == IoKind::Read && self.cfg.read_ahead_bytes > 0 {
            if let Some(s) = self.stream {
                let win_end = s.consumed + self.cfg.read_ahead_bytes;
                let streaming = ready <= self.stream_stop_ns(&s);
                if off >= s.consumed && off <= win_end && (streaming || end <= win_end) {
                    // The head has been (or is) reading these sectors anyway.
                    let head_at_end =
                        s.anchor_ns + self.g.pos_ns(end) - self.g.pos_ns(s.anchor_byte);
                    return Plan {
                        begin_ns: ready,
                        finish_ns: ready.max(head_at_end),
                        head_byte: end,
                        stream: streaming.then_some(Stream { consumed: end, ..s }),
                    };
                }
            }
        }
        let d = self.head_cyl(ready).abs_diff(self.g.cyl(off));
        let mut seek = self.seek.at(d).round() as u64;
        if op.kind == IoKind::Write && d > 0 {
            seek += self.settle_ns;
        }
        let arrive = ready + seek;
        let target = self.g.pos_ns(off) % self.g.rev_ns;
        let wait = (target + self.g.rev_ns - self.g.phase(arrive)) % self.g.rev_ns;
        let begin = arrive + wait;
        let finish = begin + self.g.pos_ns(end) - self.g.pos_ns(off);
        Plan {
            begin_ns: begin,
            finish_ns: finish,
            head_byte: end,
            stream: (op.kind == IoKind::Read).then_some(Stream {
                anchor_byte: end,
                anchor_ns: finish,
                consumed: end,
            }),
        }
    }

    /// Starts the next command at `t_ns` (the actuator is free).
    fn dispatch(&mut self, t_ns: u64) {
        debug_assert!(self.busy.is_none());
        if self.queue.is_empty() {
            return;
        }
        let window = self.queue.len().min(self.cfg.queue_depth as usize);
        let starving = match (self.max_wait_ns, self.queue.front()) {
            (Some(w), Some(p)) => t_ns.saturating_sub(p.arrival_ns) > w,
            _ => false,
        };
        let (mut best, mut best_plan) = (0, self.plan(t_ns, &self.queue[0]));
        if !starving {
            for i in 1..window {
                let plan = self.plan(t_ns, &self.queue[i]);
                if plan.begin_ns < best_plan.begin_ns {
                    best = i;
                    best_plan = plan;
                }
            }
        }
        let p = self.queue.remove(best).expect("queued");
        self.head_byte = best_plan.head_byte;
        self.stream = best_plan.stream;
        self.busy = Some((p.tag, best_plan.finish_ns));
    }
}

impl Model for Hdd {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.cfg.capacity_bytes
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        if op.kind == IoKind::Trim {
            self.instant.push(Done {
                tag,
                time_ns: now_ns,
                result: Ok(()),
            });
            return;
        }
        self.queue.push_back(Pending {
            tag,
            op: *op,
            arrival_ns: now_ns,
        });
        if self.busy.is_none() {
            self.dispatch(now_ns);
        }
    }

    fn next_event(&self) -> Option<u64> {
        let i = self.instant.iter().map(|d| d.time_ns).min();
        match (i, self.busy) {
            (Some(a), Some((_, b))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|(_, f)| f)),
        }
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        if !self.instant.is_empty() {
            let mut i = 0;
            while i < self.instant.len() {
                if self.instant[i].time_ns <= now_ns {
                    out.push(self.instant.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        while let Some((tag, finish)) = self.busy {
            if finish > now_ns {
                break;
            }
            out.push(Done {
                tag,
                time_ns: finish,
                result: Ok(()),
            });
            self.busy = None;
            self.dispatch(finish);
        }
    }
}

/// The chunk-rewrite crossover of a disk (the engine's `rewrite_min_runs`): the fewest runs of
/// dirty `line`-sized blocks in a `chunk` at which writing them back one request each (LBA
/// order, queue depth 1, as the cleaner does) takes at least as long on this model as reading
/// the chunk and writing it in one request. Measured on the model itself at the start of the
/// disk (where a volume begins), over 16 consecutive chunks, dirty runs spread evenly over
/// the chunk. Each single-run write arrives at a rotational phase uncorrelated with the
/// platter (a pseudo-random host delay after the previous completion, not counted): a host
/// cleaner's per-request latency is not synchronised with the rotation, so a run costs the
/// expected rotational wait, as measured live (`scripts/bench_flush.sh`). Returns
/// `chunk / line` when no count crosses over (then a rewrite never pays).
pub fn rewrite_min_runs(cfg: &HddConfig, chunk: u64, line: u64) -> u64 {
    use crate::checked::Checked;
    use crate::Device;
    let lines = (chunk / line.max(1)).max(1);
    let rev = (60e9 / cfg.rpm.max(1) as f64) as u64;
    // Device time of `ops` on a fresh model, each submitted after the one before completed
    // plus a host delay (when `jitter`) that is not counted.
    let time = |ops: &dyn Fn(u64, &mut Vec<IoOp>), jitter: bool| -> u64 {
        let mut d = Checked::new(Hdd::new(cfg.clone()).expect("valid HDD config"));
        let (mut now, mut busy, mut done, mut v) = (0u64, 0u64, Vec::new(), Vec::new());
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for c in 0..16 {
            v.clear();
            ops(c * chunk, &mut v);
            for op in v.drain(..) {
                if jitter {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    now += (rng >> 33) % rev;
                }
                let start = now;
                d.submit(now, 0, op);
                while let Some(t) = d.next_completion() {
                    d.advance(t, &mut done);
                    now = t;
                }
                busy += now - start;
            }
        }
        busy
    };
    let op = |kind, offset, len| IoOp {
        kind,
        offset,
        len,
        fua: false,
    };
    let rewrite = time(
        &|base, v| {
            v.push(op(IoKind::Read, base, chunk));
            v.push(op(IoKind::Write, base, chunk));
        },
        false,
    );
    (2..=lines)
        .find(|&k| {
            let runs = time(
                &|base, v| {
                    for i in 0..k {
                        v.push(op(IoKind::Write, base + i * lines / k * line, line));
                    }
                },
                true,
            );
            runs >= rewrite
        })
        .unwrap_or(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_crossover_follows_the_model() {
        let c = HddConfig::preset("7200").unwrap();
        let k = rewrite_min_runs(&c, 1 << 20, 4096);
        eprintln!("7200: 1 MiB chunk crossover {k} runs");
        assert!((2..256).contains(&k), "{k}");
        // A faster-spinning disk with the same transfer rate loses less per run: a rewrite
        // pays off later. Bigger chunks need more runs.
        let mut fast = c.clone();
        fast.rpm = 15000;
        assert!(rewrite_min_runs(&fast, 1 << 20, 4096) >= k);
        assert!(rewrite_min_runs(&c, 4 << 20, 4096) > k);
    }

    fn hdd(name: &str) -> Hdd {
        Hdd::new(HddConfig::preset(name).unwrap()).unwrap()
    }

    #[test]
    fn presets_validate() {
        for p in HDD_PRESETS {
            let c = HddConfig::preset(p).unwrap();
            c.validate().unwrap();
            assert_eq!(c.name, format!("hdd:{p}"));
        }
    }

    #[test]
    fn seek_curve_hits_its_three_points() {
        let h = hdd("7200");
        assert_eq!(h.seek_ns(0), 0);
        assert_eq!(h.seek_ns(1), 500_000);
        let full = h.seek_ns(h.cfg.cylinders) as f64;
        assert!((full - 17.35e6).abs() < 2e3, "{full}");
        // Mean over random pairs = average seek (distance density 2(1-u) on [0,1]).
        let n = 10_000;
        let c = h.cfg.cylinders as f64;
        let mut sum = 0.0;
        for i in 0..n {
            let u = (i as f64 + 0.5) / n as f64;
            sum += 2.0 * (1.0 - u) * h.seek.at((u * c).round().max(1.0) as u64) / n as f64;
        }
        assert!((sum - 8.0e6).abs() < 0.05e6, "{sum}");
    }

    #[test]
    fn rates_are_zoned() {
        let h = hdd("7200");
        assert!((h.rate_mb_s(0) - 142.0).abs() < 1e-9);
        assert!((h.rate_mb_s(h.cfg.capacity_bytes) - 75.0).abs() < 1e-6);
        assert_eq!(h.cylinder_of(0), 0);
        assert_eq!(h.cylinder_of(h.cfg.capacity_bytes - 1), h.cfg.cylinders - 1);
        // Reading 1 MB at the outer edge takes 1e6 / 142 MB/s.
        let t = h.g.pos_ns(1_000_000) - h.g.pos_ns(0);
        assert!((t as f64 - 1e9 / 142.0).abs() < 0.5e6, "{t}"); // + skews of crossed cylinders
                                                                // Whole disk: capacity / mean(outer, inner) rate, plus one skew per cylinder.
        let all = h.g.pos_ns(h.cfg.capacity_bytes) as f64;
        let media = 500e9 / ((142.0 + 75.0) / 2.0 * 1e6) * 1e9;
        let skews = (h.cfg.cylinders - 1) as f64 * 0.5e6;
        assert!(
            (all - media - skews).abs() / all < 1e-6,
            "{all} vs {}",
            media + skews
        );
    }

    #[test]
    fn rotational_wait_follows_the_platter() {
        let mut h = hdd("7200");
        h.cfg.controller_overhead_ms = 0.0;
        h.overhead_ns = 0;
        let rev = h.revolution_ns();
        // The sector at byte 0 is under the head at t = 0, 1 rev, 2 revs ...
        let p = |t| Pending {
            tag: 0,
            op: IoOp::new(IoKind::Read, 0, 512),
            arrival_ns: t,
        };
        h.stream = None;
        assert_eq!(h.plan(0, &p(0)).begin_ns, 0);
        assert_eq!(h.plan(rev / 4, &p(rev / 4)).begin_ns, rev);
        assert_eq!(h.plan(3 * rev + 1, &p(3 * rev + 1)).begin_ns, 4 * rev);
    }
}
