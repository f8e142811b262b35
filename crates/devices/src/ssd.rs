//! SSD timing model: a serial controller, `channels x dies_per_channel` flash units that work
//! in parallel, one bus per channel and one host link.
//!
//! A host op costs the controller's per-command time, then becomes flash commands (by
//! default one per page it touches, on unit `page mod units`: consecutive pages go to
//! consecutive channels). A read keeps its die busy for the array read (tR); the page then
//! goes out over the channel bus from the die's cache register while the array may already
//! read the next page (ONFI cache read), then crosses the host link. A write crosses the host
//! link, then the channel bus into the die, which then programs (tPROG). Dies serve their
//! commands in arrival order; buses and the link take the earliest free slot. All times are
//! booked when the op arrives, so completions are exact and known at once.
//!
//! The model has no write buffer: a write completes when its pages are programmed.
//!
//! The FTL (page mapping, erase blocks, garbage collection, wear) plugs in through [`Ftl`];
//! without one the mapping is static page striping with no erases.

use crate::checked::{Done, Model};
use crate::timeline::Timeline;
use crate::{transfer_ns, us_to_ns, IoKind, IoOp};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Names accepted by [`SsdConfig::preset`] (also as `ssd:<name>`).
pub const SSD_PRESETS: &[&str] = &["default", "intel-710", "intel-311", "c300", "srt-3x"];

/// Parameters of an SSD. `MB` = 10^6 bytes. Defaults = preset `default`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdConfig {
    pub name: String,
    /// User-visible capacity.
    pub capacity_bytes: u64,
    /// Independent channels (buses).
    pub channels: u32,
    /// Dies on each channel; `channels * dies_per_channel` units work in parallel.
    pub dies_per_channel: u32,
    /// Flash page: the unit of striping and of one read or program.
    pub page_bytes: u64,
    /// Array read time of a page (tR).
    pub read_us: f64,
    /// Program time of a page (tPROG), paid whole even for a partial page.
    pub program_us: f64,
    /// Block erase time (tBERS). Used only by an [`Ftl`] that erases; the built-in static
    /// mapping never does.
    pub erase_us: f64,
    /// Bandwidth of one channel bus.
    pub channel_mb_s: f64,
    /// Bandwidth of the host link (SATA/SAS/PCIe), shared by all transfers.
    pub host_mb_s: f64,
    /// Controller (firmware) time per host command. Commands are processed one at a time,
    /// so this also caps the command rate at 1e6 / controller_us per second.
    pub controller_us: f64,
    /// DRAM write buffer: a write (without FUA) completes once its data is in the buffer;
    /// programming continues behind it. A full buffer makes writes wait for programs to
    /// finish, so sustained writes still run at flash speed. 0 = no buffer (every write
    /// waits for its programs).
    pub write_buffer_bytes: u64,
    /// Program suspend: a read for a die that is busy programming (or erasing) waits this
    /// long for the die to suspend, instead of for the whole backlog. Negative = never
    /// suspend (reads queue behind programs).
    pub suspend_us: f64,
}

impl Default for SsdConfig {
    fn default() -> Self {
        Self::preset("default").expect("default preset")
    }
}

impl SsdConfig {
    /// A named preset; see [`SSD_PRESETS`]. Sources are DEVICES.md reference keys.
    pub fn preset(name: &str) -> Option<Self> {
        Some(match name.strip_prefix("ssd:").unwrap_or(name) {
            // A modern SATA-class SSD with MQSim's NAND timings [MQ]: 4 KiB random read at
            // QD1 = 5 + 75 + 12.3 + 6.8 us ~ 99 us ~ 10^4 IOPS. Eight single-die channels:
            // calc, so that units x QD1 IOPS x 4 KiB (~330 MB/s) stays under the link and the
            // knee of the IOPS-vs-depth curve sits at the unit count.
            "default" => SsdConfig {
                name: "ssd:default".into(),
                capacity_bytes: 256_000_000_000, // assumed
                channels: 8,                     // [MQ]
                dies_per_channel: 1,             // calc (see above)
                page_bytes: 8192,                // [MQ]
                read_us: 75.0,                   // [MQ]
                program_us: 750.0,               // [MQ]
                erase_us: 3800.0,                // [MQ]
                channel_mb_s: 333.0,             // [MQ] 333 MT/s, 8-bit bus
                host_mb_s: 600.0,                // calc: SATA 6 Gb/s with 8b/10b coding
                controller_us: 5.0,              // assumed
                write_buffer_bytes: 64 << 20,    // assumed, as the 710's DRAM [TH710]

                suspend_us: 100.0, // [MQ] program suspend
            },
            // Intel SSD 710 200 GB: 25 nm HET-MLC, 38,500 / 2,700 4K IOPS, 270 / 210 MB/s
            // [TH710]. NAND timings and page: [MQ] proxy. Random writes here are bounded
            // by the controller, not the 2,700 IOPS measured: that gap is garbage
            // collection, which arrives with the FTL.
            "intel-710" | "710" => SsdConfig {
                name: "ssd:intel-710".into(),
                capacity_bytes: 200_000_000_000, // [TH710]
                channels: 10,                    // assumed (not in DEVICES.md)
                dies_per_channel: 1,             // assumed
                page_bytes: 8192,                // [MQ] proxy
                read_us: 75.0,                   // [MQ] proxy
                program_us: 350.0,               // calc: 10 x 8 KiB / 210 MB/s [TH710] - bus
                erase_us: 3800.0,                // [MQ] proxy
                channel_mb_s: 200.0,             // assumed (ONFI 2 class)
                host_mb_s: 270.0,                // [TH710] sequential read as the link cap
                controller_us: 26.0,             // calc: 1e6 / 38,500 IOPS [TH710]
                write_buffer_bytes: 64 << 20,    // [TH710] 64 MB DRAM, as an upper bound

                suspend_us: 100.0, // [MQ] program suspend
            },
            // Intel SSD 311 20 GB: 34 nm SLC in 5 packages [LR311]; 37,000 / 3,300 IOPS at
            // QD32, 200 / 105 MB/s, 65 / 75 us typ latency [PCP311]. SLC NAND timings and
            // page: simulator values [DSSSD] proxy. Gives ~93 MB/s sequential write (105
            // measured) and ~93 us QD1 read latency (65 measured: the drive overlaps more).
            "intel-311" | "311" => SsdConfig {
                name: "ssd:intel-311".into(),
                capacity_bytes: 20_000_000_000, // [PCP311]
                channels: 5,                    // calc: one per package [LR311]
                dies_per_channel: 1,            // assumed
                page_bytes: 4096,               // [DSSSD] proxy
                read_us: 25.0,                  // [DSSSD] proxy
                program_us: 200.0,              // [DSSSD] proxy
                erase_us: 1500.0,               // [DSSSD] proxy
                channel_mb_s: 200.0,            // assumed (ONFI 2 class)
                host_mb_s: 200.0,               // [PCP311] sequential read as the link cap
                controller_us: 27.0,            // calc: 1e6 / 37,000 IOPS [PCP311]
                write_buffer_bytes: 32 << 20,   // [LR311] 32 MB DRAM, as an upper bound

                suspend_us: 100.0, // [MQ] program suspend
            },
            // Crucial (Micron) RealSSD C300 64 GB: 34 nm MLC [HH-C300], 8 channels [AT-C300]
            // at ONFI 2.1 ~200 MT/s [LMI-C300]; the datasheet's 64 GB figures [MU-C300]: 355
            // MB/s sequential read (SATA 6 Gb/s), 75 MB/s sequential write, 60,000 / 15,000
            // 4K IOPS, 55 / 60 us typ latency. Page and tR: [DSSSD] proxy, as the 311.
            // Gives ~75 MB/s sustained writes and ~18,000 random 4K writes at depth (15,000
            // stated; ~73 us QD1 read latency against 55 us typ).
            "c300" | "crucial-c300" => SsdConfig {
                name: "ssd:c300".into(),
                capacity_bytes: 64_000_000_000, // [MU-C300]
                channels: 8,                    // [AT-C300] [LMI-C300]
                dies_per_channel: 1, // calc: eight units, so the program rate below is the 64 GB's
                page_bytes: 4096,    // [DSSSD] proxy
                read_us: 25.0,       // [DSSSD] proxy
                program_us: 417.0,   // calc: 8 x 4 KiB / 75 MB/s [MU-C300] - 20 us channel transfer
                erase_us: 1500.0,    // [DSSSD] proxy
                channel_mb_s: 200.0, // [LMI-C300] ONFI 2.1, ~200 MT/s, 8-bit bus
                host_mb_s: 355.0,    // [MU-C300] sequential read as the link cap
                controller_us: 16.7, // calc: 1e6 / 60,000 IOPS [MU-C300]
                // Assumed: Micron keeps "very little" user data in the DRAM [AT-C300], yet
                // the datasheet's 60 us write latency [MU-C300] needs some buffering.
                write_buffer_bytes: 8 << 20,

                suspend_us: 100.0, // [MQ] program suspend
            },
            // Not a real drive: the relative SSD of the SRT study (seed 001, Plewa 2014, section
            // 5.1), whose DiskSim devices were "not specifically accurate to any given
            // device, but ... relationally accurate in terms of SSD versus HDD speed ratios.
            // The general rule of thumb used is a 3x performance increase in accessing the
            // SSD compared to the HDD". The paper ran Microsoft's DiskSim SSD extension, a
            // per-page flash model with parallel elements; so here the flash page times are
            // what is slowed down (reads and programs alike, one 3x rule for both): calc, so
            // that alone at queue depth 1 on experiments/reproduce/srt.toml's workload its
            // mean response time is 1/3 of hdd:7200's alone (5.62 ms -> 1.87 ms). Transfers
            // at 3x the 7200's outer media rate (3 x 142 MB/s [CSAS]); no write buffer, so a
            // write pays its programs as a read pays its page reads.
            "srt-3x" => SsdConfig {
                name: "ssd:srt-3x".into(),
                capacity_bytes: 128_000_000_000, // assumed: holds the paper's 64 GB cache
                channels: 8,                     // assumed (as ssd:default)
                dies_per_channel: 1,             // assumed
                page_bytes: 4096,                // assumed
                read_us: 1590.0,                 // calc: see above (seed 001's 3x)
                program_us: 1590.0,              // calc: as a read
                erase_us: 1500.0,                // [DSSSD] proxy (unused: no FTL)
                channel_mb_s: 426.0,             // calc: 3 x 142 MB/s [CSAS]
                host_mb_s: 426.0,                // calc: 3 x 142 MB/s [CSAS]
                controller_us: 5.0,              // assumed (as ssd:default)
                write_buffer_bytes: 0,           // assumed: every write pays its programs
                suspend_us: -1.0,                // no program suspend (reads and programs alike)
            },
            _ => return None,
        })
    }

    /// Parallel flash units.
    pub fn units(&self) -> usize {
        self.channels as usize * self.dies_per_channel as usize
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.capacity_bytes == 0
            || self.channels == 0
            || self.dies_per_channel == 0
            || self.page_bytes == 0
        {
            return Err(format!(
                "{}: capacity_bytes, channels, dies_per_channel and page_bytes must be > 0",
                self.name
            ));
        }
        for (v, what) in [
            (self.channel_mb_s, "channel_mb_s"),
            (self.host_mb_s, "host_mb_s"),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{}: {what} must be > 0", self.name));
            }
        }
        for (v, what) in [
            (self.read_us, "read_us"),
            (self.program_us, "program_us"),
            (self.erase_us, "erase_us"),
            (self.controller_us, "controller_us"),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{}: {what} must be >= 0", self.name));
            }
        }
        Ok(())
    }
}

/// What a flash unit is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashOp {
    Read,
    Program,
    Erase,
}

/// One flash command on one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashCmd {
    pub op: FlashOp,
    /// Unit index, `0..channels * dies_per_channel`; its channel is `unit % channels`.
    pub unit: usize,
    /// Bytes moved over the channel (0 for erases).
    pub bytes: u64,
    /// The data also crosses the host link (host reads and writes). False for garbage
    /// collection copies, which stay inside the drive.
    pub host: bool,
}

/// Flash translation layer: the extension point for page mapping, erase blocks, garbage
/// collection, over-provisioning, TRIM and wear accounting.
///
/// The SSD calls `translate` once per host op (after checking the range) and schedules the
/// commands it returns. Duties:
/// * MUST return the flash work the op costs, including any garbage collection it triggers
///   in the foreground (reads and programs with `host: false`, erases).
/// * Commands on one unit run in the order given; commands on different units run in
///   parallel. NOTE: a copy from unit A to unit B is not ordered across units.
/// * Flush and trim may return nothing (they then cost only the controller time); a flush
///   still waits for every write submitted before it.
///
/// Without an FTL ([`Ssd::new`]) each page of an op is one read or program on unit
/// `page mod units`, and nothing is ever erased.
pub trait Ftl: Send {
    /// Appends the flash commands for `op` (arriving at `now_ns`) to `out`.
    fn translate(&mut self, now_ns: u64, op: &IoOp, cfg: &SsdConfig, out: &mut Vec<FlashCmd>);
}

/// The SSD model. Use it through [`crate::Checked`].
pub struct Ssd {
    cfg: SsdConfig,
    /// `None`: static page striping (see [`Ftl`]).
    ftl: Option<Box<dyn Ftl>>,
    units: usize,
    read_ns: u64,
    program_ns: u64,
    erase_ns: u64,
    controller_ns: u64,
    controller_free_ns: u64,
    /// When each die's array (and data register) is free for the next command.
    die_free_ns: Vec<u64>,
    /// When each die's cache register has been read out over the bus.
    register_free_ns: Vec<u64>,
    /// When each die's latest read leaves its array (reads order among themselves).
    read_free_ns: Vec<u64>,
    /// When each die's booked programs and erases end.
    prog_until_ns: Vec<u64>,
    suspend_ns: Option<u64>,
    buses: Vec<Timeline>,
    link: Timeline,
    /// Completion time of the latest write so far (flushes wait for it).
    writes_done_ns: u64,
    /// Pages being programmed from the write buffer: (program done, bytes).
    buffered: BinaryHeap<Reverse<(u64, u64)>>,
    buffered_bytes: u64,
    /// Buffered bytes not yet making a whole page.
    fill_bytes: u64,
    /// Die the next buffered page goes to.
    next_unit: usize,
    pending: BinaryHeap<Reverse<(u64, u64)>>,
    cmds: Vec<FlashCmd>,
}

impl Ssd {
    pub fn new(cfg: SsdConfig) -> Result<Self, String> {
        cfg.validate()?;
        let units = cfg.units();
        Ok(Ssd {
            ftl: None,
            units,
            read_ns: us_to_ns(cfg.read_us),
            program_ns: us_to_ns(cfg.program_us),
            erase_ns: us_to_ns(cfg.erase_us),
            controller_ns: us_to_ns(cfg.controller_us),
            controller_free_ns: 0,
            die_free_ns: vec![0; units],
            register_free_ns: vec![0; units],
            read_free_ns: vec![0; units],
            prog_until_ns: vec![0; units],
            suspend_ns: (cfg.suspend_us >= 0.0).then(|| us_to_ns(cfg.suspend_us)),
            buses: vec![Timeline::default(); cfg.channels as usize],
            link: Timeline::default(),
            writes_done_ns: 0,
            buffered: BinaryHeap::new(),
            buffered_bytes: 0,
            fill_bytes: 0,
            next_unit: 0,
            pending: BinaryHeap::new(),
            cmds: Vec::new(),
            cfg,
        })
    }

    /// An SSD whose host ops are translated by `ftl`.
    pub fn with_ftl(cfg: SsdConfig, ftl: Box<dyn Ftl>) -> Result<Self, String> {
        let mut s = Self::new(cfg)?;
        s.ftl = Some(ftl);
        Ok(s)
    }

    pub fn config(&self) -> &SsdConfig {
        &self.cfg
    }

    pub fn ftl(&self) -> Option<&dyn Ftl> {
        self.ftl.as_deref()
    }

    /// Static page striping: one command per page touched.
    fn static_map(&self, op: &IoOp, out: &mut Vec<FlashCmd>) {
        let fop = match op.kind {
            IoKind::Read => FlashOp::Read,
            IoKind::Write => FlashOp::Program,
            IoKind::Flush | IoKind::Trim => return,
        };
        let pb = self.cfg.page_bytes;
        let mut at = op.offset;
        while at < op.end() {
            let page = at / pb;
            let next = ((page + 1) * pb).min(op.end());
            out.push(FlashCmd {
                op: fop,
                unit: (page % self.units as u64) as usize,
                bytes: next - at,
                host: true,
            });
            at = next;
        }
    }

    /// Books the commands of one op; returns its completion time.
    fn schedule(&mut self, now_ns: u64, op: &IoOp) -> u64 {
        let start = now_ns.max(self.controller_free_ns);
        let ready = start + self.controller_ns;
        self.controller_free_ns = ready;
        let mut done = ready;
        if op.kind == IoKind::Flush && self.fill_bytes > 0 {
            // The partly filled page is programmed (padded) before the flush completes.
            self.program_buffered(ready);
            self.fill_bytes = 0;
        }
        let channels = self.cfg.channels as usize;
        for cmd in &self.cmds {
            assert!(
                cmd.unit < self.units,
                "FTL returned unit {} of {}",
                cmd.unit,
                self.units
            );
            let u = cmd.unit;
            let bus = &mut self.buses[u % channels];
            let bus_ns = transfer_ns(cmd.bytes, self.cfg.channel_mb_s);
            let link_ns = transfer_ns(cmd.bytes, self.cfg.host_mb_s);
            let fin = match cmd.op {
                FlashOp::Read => {
                    // Cache read: the page moves from the data register to the cache
                    // register once that is free, and the array can start the next read
                    // while the cache register streams out over the bus.
                    let suspend = self.suspend_ns.filter(|_| self.prog_until_ns[u] > ready);
                    let array_done = match suspend {
                        // Suspend the program or erase, read, resume it later.
                        Some(sus) => ready.max(self.read_free_ns[u]) + sus + self.read_ns,
                        None => ready.max(self.die_free_ns[u]) + self.read_ns,
                    };
                    let in_cache = match suspend {
                        Some(_) => array_done,
                        None => array_done.max(self.register_free_ns[u]),
                    };
                    let out_done = bus.reserve(in_cache, bus_ns) + bus_ns;
                    // A suspended program resumes where it stopped; the model does not move
                    // its end (reads are rare beside a program backlog, and moving it per
                    // read would let a read stream postpone programs without bound).
                    if suspend.is_none() {
                        self.die_free_ns[u] = in_cache;
                    }
                    self.read_free_ns[u] = in_cache;
                    self.register_free_ns[u] = self.register_free_ns[u].max(out_done);
                    if cmd.host {
                        self.link.reserve(out_done, link_ns) + link_ns
                    } else {
                        out_done
                    }
                }
                FlashOp::Program => {
                    let data_in = if cmd.host {
                        self.link.reserve(ready, link_ns) + link_ns
                    } else {
                        ready
                    };
                    let on_die = data_in
                        .max(self.die_free_ns[u])
                        .max(self.register_free_ns[u]);
                    let fin = bus.reserve(on_die, bus_ns) + bus_ns + self.program_ns;
                    self.die_free_ns[u] = fin;
                    self.register_free_ns[u] = fin;
                    self.prog_until_ns[u] = fin;
                    fin
                }
                FlashOp::Erase => {
                    let fin = ready.max(self.die_free_ns[u]).max(self.register_free_ns[u])
                        + self.erase_ns;
                    self.die_free_ns[u] = fin;
                    self.register_free_ns[u] = fin;
                    self.prog_until_ns[u] = fin;
                    fin
                }
            };
            done = done.max(fin);
        }
        match op.kind {
            IoKind::Write => self.writes_done_ns = self.writes_done_ns.max(done),
            IoKind::Flush => done = done.max(self.writes_done_ns),
            IoKind::Read | IoKind::Trim => {}
        }
        done
    }
}

impl Ssd {
    /// A write into the DRAM buffer: it completes once its data is in and the buffer has room
    /// for it. Buffered data is programmed a full page at a time, round robin over the dies,
    /// as a page-mapped FTL writes its log, so small writes cost flash time by their bytes.
    fn buffered_write(&mut self, now_ns: u64, op: &IoOp) -> u64 {
        let start = now_ns.max(self.controller_free_ns);
        let ready = start + self.controller_ns;
        self.controller_free_ns = ready;
        let link_ns = transfer_ns(op.len, self.cfg.host_mb_s);
        let mut ack = self.link.reserve(ready, link_ns) + link_ns;
        // Room: programs that ended by now free their pages; if the buffer is still too full,
        // wait for the earliest ones.
        let cap = self
            .cfg
            .write_buffer_bytes
            .max(op.len + self.cfg.page_bytes);
        while let Some(&Reverse((fin, bytes))) = self.buffered.peek() {
            if fin > ack && self.buffered_bytes + self.fill_bytes + op.len <= cap {
                break;
            }
            self.buffered.pop();
            self.buffered_bytes -= bytes;
            ack = ack.max(fin);
        }
        self.fill_bytes += op.len;
        while self.fill_bytes >= self.cfg.page_bytes {
            self.fill_bytes -= self.cfg.page_bytes;
            self.program_buffered(ack);
        }
        ack
    }

    /// Programs one page of buffered data (or the partly filled rest) on the next die.
    fn program_buffered(&mut self, at_ns: u64) {
        let page = self.cfg.page_bytes;
        let u = self.next_unit;
        self.next_unit = (u + 1) % self.units;
        let bus = &mut self.buses[u % self.cfg.channels as usize];
        let bus_ns = transfer_ns(page, self.cfg.channel_mb_s);
        let on_die = at_ns.max(self.die_free_ns[u]).max(self.register_free_ns[u]);
        let fin = bus.reserve(on_die, bus_ns) + bus_ns + self.program_ns;
        self.die_free_ns[u] = fin;
        self.register_free_ns[u] = fin;
        self.prog_until_ns[u] = fin;
        self.writes_done_ns = self.writes_done_ns.max(fin);
        self.buffered.push(Reverse((fin, page)));
        self.buffered_bytes += page;
    }
}

impl Model for Ssd {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.cfg.capacity_bytes
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        for b in &mut self.buses {
            b.prune(now_ns);
        }
        self.link.prune(now_ns);
        if op.kind == IoKind::Write
            && !op.fua
            && self.cfg.write_buffer_bytes > 0
            && self.ftl.is_none()
        {
            let done = self.buffered_write(now_ns, op);
            self.pending.push(Reverse((done, tag)));
            return;
        }
        let mut cmds = std::mem::take(&mut self.cmds);
        cmds.clear();
        match self.ftl.as_mut() {
            Some(ftl) => ftl.translate(now_ns, op, &self.cfg, &mut cmds),
            None => self.static_map(op, &mut cmds),
        }
        self.cmds = cmds;
        let done = self.schedule(now_ns, op);
        self.pending.push(Reverse((done, tag)));
    }

    fn next_event(&self) -> Option<u64> {
        self.pending.peek().map(|Reverse((t, _))| *t)
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        while let Some(&Reverse((t, tag))) = self.pending.peek() {
            if t > now_ns {
                break;
            }
            self.pending.pop();
            out.push(Done {
                tag,
                time_ns: t,
                result: Ok(()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        for p in SSD_PRESETS {
            SsdConfig::preset(p).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn qd1_read_latency_is_the_sum_of_its_stages() {
        let mut s = Ssd::new(SsdConfig::default()).unwrap();
        let mut out = Vec::new();
        s.accept(0, 7, &IoOp::new(IoKind::Read, 8192 * 3, 4096));
        let t = s.next_event().unwrap();
        // 5 us controller + 75 us tR + 4096 B at 333 MB/s + 4096 B at 600 MB/s
        let want = 5_000 + 75_000 + transfer_ns(4096, 333.0) + transfer_ns(4096, 600.0);
        assert_eq!(t, want);
        s.run_until(t, &mut out);
        assert_eq!(out[0].tag, 7);
    }

    #[test]
    fn pages_stripe_over_units() {
        let s = Ssd::new(SsdConfig::default()).unwrap();
        let mut cmds = Vec::new();
        s.static_map(&IoOp::new(IoKind::Read, 4096, 8192 * 3), &mut cmds);
        let units: Vec<_> = cmds.iter().map(|c| (c.unit, c.bytes)).collect();
        assert_eq!(units, vec![(0, 4096), (1, 8192), (2, 8192), (3, 4096)]);
    }

    struct EraseEveryWrite;
    impl Ftl for EraseEveryWrite {
        fn translate(&mut self, _: u64, op: &IoOp, _: &SsdConfig, out: &mut Vec<FlashCmd>) {
            if op.kind == IoKind::Write {
                out.push(FlashCmd {
                    op: FlashOp::Erase,
                    unit: 0,
                    bytes: 0,
                    host: false,
                });
                out.push(FlashCmd {
                    op: FlashOp::Program,
                    unit: 0,
                    bytes: op.len,
                    host: true,
                });
            }
        }
    }

    #[test]
    fn ftl_hook_decides_the_flash_work() {
        let cfg = SsdConfig {
            write_buffer_bytes: 0,
            ..SsdConfig::default()
        };
        let mut s = Ssd::with_ftl(cfg.clone(), Box::new(EraseEveryWrite)).unwrap();
        s.accept(0, 1, &IoOp::new(IoKind::Write, 0, 4096));
        let t = s.next_event().unwrap();
        // Erase on unit 0, then the program waits for the die.
        assert!(
            t >= us_to_ns(cfg.controller_us + cfg.erase_us + cfg.program_us),
            "{t}"
        );
    }
}
