//! `tiercache warmup`: Qsan's warm-up estimate, and optionally the matching simulation.

use crate::progress::Progress;
use anyhow::Result;
use clap::Args;
use serde::Serialize;
use tiercache_engine::{parse_size, Admission, CacheSize, EngineConfig, Mode};
use tiercache_sim::timed::MIN_WARMUP_WINDOWS;
use tiercache_sim::warmup::{estimate_s, WarmupInputs};
use tiercache_sim::{run_timed, Drive, Input, SimSpec, TimedSetup};

#[derive(Args, Debug)]
#[command(
    after_help = "The estimate is Qsan's T = C x P / (I x S x D): the hot data C must be read from the
disks P times at I random IOPS of S bytes on each of D disks. Qsan's test case 1:
  tiercache warmup --cache-size 10GiB --threshold 1 --disk-iops 430 --io-size 4k --disks 12
  (8.47 minutes; Qsan measured 11.3). Add --simulate to run the matching workload.

The simulation reports two warm-up times: until the windowed hit ratio reaches 95 % of its
final value, and until the windowed IOPS does (what Qsan's 'IOPS almost at the top' means;
later, because near the top every remaining miss still costs a disk access). With 1 MiB
groups a miss copies its whole group (as Qsan's white paper describes); --group-size 8k
copies only the missed sub-block, the rate the formula assumes."
)]
pub struct WarmupArgs {
    /// Hot data to bring into the cache (C): with --simulate, the volume read at random.
    #[arg(long, value_name = "SIZE")]
    pub cache_size: String,
    /// Populate threshold (P).
    #[arg(long, default_value_t = 1)]
    pub threshold: u32,
    /// Random IOPS of one disk at the I/O size (I).
    #[arg(long, value_name = "IOPS")]
    pub disk_iops: f64,
    /// I/O size (S).
    #[arg(long, value_name = "SIZE", default_value = "4k")]
    pub io_size: String,
    /// Number of disks (D).
    #[arg(long, default_value_t = 1)]
    pub disks: u32,
    /// Also simulate: random reads of --io-size over a volume of --cache-size on a RAID 0 of
    /// --disks --hdd disks, SSD cache with 1 MiB groups of 8 KiB lines (Qsan test case 1).
    #[arg(long)]
    pub simulate: bool,
    /// Cache block (group) for --simulate: the unit a miss populates. Qsan: 1 MiB.
    #[arg(long, value_name = "SIZE", default_value = "1MiB")]
    pub group_size: String,
    /// Sub-block (line) for --simulate. Qsan: 8 KiB.
    #[arg(long, value_name = "SIZE", default_value = "8KiB")]
    pub line_size: String,
    /// Disk model for --simulate.
    #[arg(long, default_value = "7200")]
    pub hdd: String,
    /// SSD model for --simulate.
    #[arg(long, default_value = "ssd:default")]
    pub ssd: String,
    /// Outstanding requests for --simulate (Qsan: 2 workers x 64).
    #[arg(long, default_value_t = 128)]
    pub queue_depth: u32,
    /// Simulated requests (default: 8x the estimate's reads, so that the cache fills and
    /// the run goes on warm for a while).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Time-series window in seconds for --simulate (default: a twentieth of the estimate,
    /// or of the simulated run when that is shorter, so that warm-up spans many windows).
    #[arg(long)]
    pub window: Option<f64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Serialize)]
struct Out {
    inputs: WarmupInputs,
    estimate_s: f64,
    simulated: Option<Simulated>,
}

#[derive(Serialize)]
struct Simulated {
    warmup_s: Option<f64>,
    warmup_iops_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup_note: Option<String>,
    window_s: f64,
    iops_first_window: f64,
    iops_last_window: f64,
    iops_ratio: f64,
    elapsed_s: f64,
    requests: u64,
}

pub fn run(a: WarmupArgs) -> Result<()> {
    let inputs = WarmupInputs {
        cache_bytes: parse_size(&a.cache_size)?,
        threshold: a.threshold,
        disk_iops: a.disk_iops,
        io_size: parse_size(&a.io_size)?,
        disks: a.disks,
    };
    anyhow::ensure!(
        inputs.disk_iops > 0.0 && inputs.disks > 0 && inputs.io_size > 0,
        "--disk-iops, --io-size and --disks must be above 0"
    );
    let est = estimate_s(&inputs);
    let mut out = Out {
        inputs,
        estimate_s: est,
        simulated: None,
    };
    if a.simulate {
        let reads = inputs.cache_bytes / inputs.io_size * inputs.threshold.max(1) as u64;
        let n = a.requests.unwrap_or(reads.saturating_mul(8).max(10_000));
        let window = a.window.unwrap_or((est / 20.0).max(0.01));
        anyhow::ensure!(window > 0.0, "--window must be above 0");
        let spec: tiercache_trace::workload::WorkloadSpec = format!(
            "uniform:wss={},requests={n},read=100,size={},align={}",
            inputs.cache_bytes, inputs.io_size, inputs.io_size
        )
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let sim = SimSpec {
            input: Input::Workload { spec, seed: a.seed },
            cache_size: CacheSize::Bytes(inputs.cache_bytes.next_multiple_of(1 << 20)),
            engine: EngineConfig {
                line_size: parse_size(&a.line_size)?,
                group_size: parse_size(&a.group_size)?,
                admission: Admission {
                    read_threshold: a.threshold,
                    write_threshold: a.threshold,
                },
                mode: Mode::WriteThrough,
                ..Default::default()
            },
            log: None,
        };
        let mut setup = TimedSetup {
            hdd: a.hdd.clone(),
            raid: (a.disks > 1).then_some((0, a.disks as usize)),
            ssd: Some(a.ssd.clone()),
            pool: Vec::new(),
            options: tiercache_sim::TimedOptions {
                drive: Drive::Closed {
                    queue_depth: a.queue_depth,
                },
                window_ns: (window * 1e9) as u64,
                idle_clean: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let progress = Progress::new(a.quiet, Some(n), "requests");
        let mut rep = run_timed(&sim, &setup, Some(&|x| progress.set(x)))?;
        progress.finish();
        let mut window = window;
        if a.window.is_none() && rep.timed.series.len() < 2 * MIN_WARMUP_WINDOWS {
            // The devices ran faster than the estimate's disk IOPS: the same run again with
            // windows of a twentieth of its length, so that warm-up spans many of them.
            window = (rep.timed.elapsed_s / 20.0).max(1e-6);
            setup.options.window_ns = (window * 1e9) as u64;
            rep = run_timed(&sim, &setup, None)?;
        }
        let s = &rep.timed.series;
        let first = s.first().map(|w| w.iops).unwrap_or(0.0);
        // The last window is usually partial: take the one before it when there is one.
        let last = if s.len() >= 2 {
            s[s.len() - 2].iops
        } else {
            first
        };
        out.simulated = Some(Simulated {
            warmup_s: rep.timed.warmup_s,
            warmup_iops_s: rep.timed.warmup_iops_s,
            warmup_note: rep.timed.warmup_note.clone(),
            window_s: window,
            iops_first_window: first,
            iops_last_window: last,
            iops_ratio: if first > 0.0 { last / first } else { 0.0 },
            elapsed_s: rep.timed.elapsed_s,
            requests: n,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "estimate     T = C x P / (I x S x D) = {} x {} / ({} x {} x {}) = {:.1} s = {:.2} min",
        a.cache_size,
        a.threshold,
        a.disk_iops,
        a.io_size,
        a.disks,
        est,
        est / 60.0
    );
    if let Some(s) = &out.simulated {
        match s.warmup_s {
            Some(w) => println!(
                "simulated    warm-up {:.1} s = {:.2} min ({} requests at queue depth {})",
                w,
                w / 60.0,
                s.requests,
                a.queue_depth
            ),
            None => println!(
                "simulated    warm-up {} ({} requests)",
                s.warmup_note.as_deref().unwrap_or("not measured"),
                s.requests
            ),
        }
        if let Some(w) = s.warmup_iops_s {
            println!(
                "             {:.1} s = {:.2} min until IOPS reaches 95 % of its final value",
                w,
                w / 60.0
            );
        }
        if s.warmup_iops_s.is_some() {
            println!(
                "IOPS         {:.0} in the first window of {:.3} s, {:.0} warm: {:.1}x",
                s.iops_first_window, s.window_s, s.iops_last_window, s.iops_ratio
            );
        }
    }
    Ok(())
}
