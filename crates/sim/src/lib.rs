//! Trace-driven simulator: streams requests from a trace file or a synthetic workload through
//! the tiercache engine and reports what the cache did.
//!
//! The hit-ratio mode here runs the engine without recording plans: every counter (including
//! device bytes) stays exact, and nothing else is paid for.

pub mod dss;
pub mod emu_ssd;
pub mod experiment;
pub mod fileserver;
pub mod input;
pub mod log;
pub mod mrc;
pub mod nitro;
pub mod realfs;
pub mod reproduce;
pub mod result;
pub mod sharded;
pub mod ssd_pool;
pub mod stack_sweep;
pub mod sweep;
pub mod timed;
pub mod volumes;
pub mod warmup;

pub use experiment::{Experiment, SweepGrid};
pub use input::Input;
pub use result::{RamFigures, ShardFigures, SimResult};
pub use sharded::{ensure_one_shard, simulate_sharded};
pub use sweep::{run_sweep, run_sweep_with, SweepCell, SweepOptions};
pub use timed::{run_timed, Drive, SsdFailure, TimedOptions, TimedReport, TimedResult, TimedSetup};
pub use volumes::{merge_volumes, VolumeFigures, VolumeInput};

use anyhow::{Context, Result};
use std::time::Instant;
use tiercache_engine::{CacheSize, Engine, EngineConfig, EngineError, RamTier, Request, Sharded};

/// Progress report: requests done so far (called every [`PROGRESS_EVERY`] requests).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// How often the progress callback runs.
pub const PROGRESS_EVERY: u64 = 1 << 16;

/// How many requests ahead the simulator prefetches index buckets.
pub(crate) const PREFETCH_AHEAD: usize = 4;

/// One simulation: an input, a cache size and an engine configuration (whose
/// `capacity_lines` is filled in from `cache_size`).
#[derive(Clone, Debug)]
pub struct SimSpec {
    pub input: Input,
    pub cache_size: CacheSize,
    pub engine: EngineConfig,
    /// The log layout's settings; None = the direct layout (`engine` alone).
    pub log: Option<log::LogSpec>,
}

/// Distinct lines (footprint) of an input at a line size.
pub fn footprint_lines(input: &Input, line_size: u64) -> Result<u64> {
    let mut set = hashbrown::HashSet::new();
    input.for_each(|r| {
        Engine::for_each_line_key(line_size, r, |k| {
            set.insert(k);
        });
        Ok(())
    })?;
    Ok(set.len() as u64)
}

/// Runs one simulation of either layout (the spec's `log` picks it). `footprint` may be
/// given when known (it is needed for percentage cache sizes); otherwise it is computed with
/// a pre-pass when needed. The log layout takes the footprint from its content trace.
pub fn simulate(
    spec: &SimSpec,
    footprint: Option<u64>,
    progress: Option<Progress>,
) -> Result<SimResult> {
    if let Some(l) = &spec.log {
        ensure_one_shard(spec, "the log layout")?;
        return log::simulate_log(spec, l);
    }
    if spec.engine.shards > 1 {
        return sharded::simulate_sharded(spec, footprint, progress);
    }
    let (mut engine, footprint) = prepare(spec, footprint)?;
    anyhow::ensure!(
        !(engine.needs_oracle() && spec.engine.ram_cache > 0),
        "--ram-cache: policy {} needs the future of every line access, which a RAM tier above \
         it hides; use an online policy with the RAM tier",
        spec.engine.policy
    );
    if engine.needs_oracle() {
        let reqs: Vec<Request> = spec.input.open()?.collect::<Result<_>>()?;
        engine.set_oracle(Engine::next_use_oracle(spec.engine.line_size, &reqs));
    }
    let start = Instant::now();
    let mut n: u64 = 0;
    if let Some(mut ram) = RamTier::for_config(&spec.engine).map_err(anyhow::Error::msg)? {
        let skipped = spec.input.for_each_batch_counted(|batch| {
            feed_ram(&mut engine, &mut ram, &spec.input, &mut n, batch, progress)
        })?;
        let wall = start.elapsed().as_secs_f64();
        let mut res = finish(spec, &engine, footprint, wall, n, skipped)?;
        res.ram = Some(result::RamFigures::of(&ram, &engine.counters()));
        return Ok(res);
    }
    let skipped = spec
        .input
        .for_each_batch_counted(|batch| feed(&mut engine, &spec.input, &mut n, batch, progress))?;
    let wall = start.elapsed().as_secs_f64();
    finish(spec, &engine, footprint, wall, n, skipped)
}

/// One request through a RAM tier above the engine, as the live volume runs it
/// (`tiercache_engine::ram_tier`'s protocol at queue depth 1): a read served whole from RAM
/// does not reach the engine; a write or trim invalidates its lines first; a read that went
/// below fills RAM with the lines it covered whole. Returns whether RAM served it.
#[inline]
pub fn step_ram(engine: &mut Engine, ram: &mut RamTier, r: &Request) -> Result<bool, String> {
    let mut slots = Vec::new();
    if ram.read(r, &mut slots) {
        return Ok(true);
    }
    let ticket = ram.ticket();
    ram.invalidate(r);
    engine.process(r).map_err(|e| e.to_string())?;
    if r.is_read() {
        let mut out = Vec::new();
        ram.fill(r, ticket, &mut out);
    }
    Ok(false)
}

/// [`feed`] with a RAM tier above the engine ([`step_ram`]).
fn feed_ram(
    engine: &mut Engine,
    ram: &mut RamTier,
    input: &Input,
    n: &mut u64,
    batch: &[Request],
    progress: Option<Progress>,
) -> Result<()> {
    for r in batch {
        step_ram(engine, ram, r)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}: request {} ({:?})", input, *n + 1, r))?;
        if engine.needs_cleaning() {
            let t = engine.cleaning_target();
            engine.clean(t);
        }
        *n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            if let Some(p) = progress {
                p(*n);
            }
        }
    }
    Ok(())
}

/// The engine of a direct-layout run, sized from its cache size (computing the footprint
/// with a pre-pass when the size needs it and `footprint` is None), without an oracle.
pub(crate) fn prepare(spec: &SimSpec, footprint: Option<u64>) -> Result<(Engine, Option<u64>)> {
    ensure_one_shard(spec, "this run")?;
    let (cfg, footprint) = sized_config(spec, footprint)?;
    let mut engine = Engine::new(cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    engine.set_record_plan(false);
    Ok((engine, footprint))
}

/// The engine configuration of a direct-layout run with its capacity from the cache size
/// (computing the footprint with a pre-pass when the size needs it and `footprint` is
/// None), and the footprint.
pub(crate) fn sized_config(
    spec: &SimSpec,
    footprint: Option<u64>,
) -> Result<(EngineConfig, Option<u64>)> {
    let ls = spec.engine.line_size;
    let footprint = match footprint {
        Some(f) => Some(f),
        None if spec.cache_size.needs_footprint() => Some(footprint_lines(&spec.input, ls)?),
        None => None,
    };
    if footprint == Some(0) {
        return Err(no_requests(&spec.input));
    }
    let mut cfg = spec.engine.clone();
    cfg.capacity_lines = spec.cache_size.lines(ls, footprint.unwrap_or(0));
    // Aligned policy links: fewer instructions per request than the live cache's packed
    // ones, the same decisions (issue 16: the simulator at least as fast as before).
    cfg.policy_params.aligned_links = true;
    ensure_some_lines(spec, cfg.capacity_lines, footprint)?;
    Ok((cfg, footprint))
}

/// What the untimed request loop ([`feed`]) drives: one engine, or a sharded one
/// (`sim --shards`), with the same loop so that both count alike.
pub(crate) trait Driven {
    /// Prefetch hint for a request a few ahead.
    fn prefetch(&self, r: &Request);
    /// One request.
    fn step(&mut self, r: &Request) -> Result<(), EngineError>;
    /// Cleaning after a request, where due.
    fn clean_if_due(&mut self);
}

impl Driven for Engine {
    #[inline(always)]
    fn prefetch(&self, r: &Request) {
        Engine::prefetch(self, r)
    }
    #[inline(always)]
    fn step(&mut self, r: &Request) -> Result<(), EngineError> {
        self.process(r).map(|_| ())
    }
    #[inline(always)]
    fn clean_if_due(&mut self) {
        if self.needs_cleaning() {
            let t = self.cleaning_target();
            self.clean(t);
        }
    }
}

impl Driven for Sharded {
    #[inline(always)]
    fn prefetch(&self, r: &Request) {
        Sharded::prefetch(self, r)
    }
    #[inline(always)]
    fn step(&mut self, r: &Request) -> Result<(), EngineError> {
        self.process(r).map(|_| ())
    }
    /// Every shard due, each to its own target (all shards' clocks kept in step).
    #[inline(always)]
    fn clean_if_due(&mut self) {
        self.clean_due();
    }
}

/// Runs one batch of requests through an engine: the one loop every untimed direct-layout
/// run uses (single runs and the one-pass sweep), so that both count alike. `n` counts the
/// requests done so far (for the error message and `progress`).
#[inline]
pub(crate) fn feed<E: Driven>(
    engine: &mut E,
    input: &Input,
    n: &mut u64,
    batch: &[Request],
    progress: Option<Progress>,
) -> Result<()> {
    for (i, r) in batch.iter().enumerate() {
        // Start loading the index bucket of a request a few ahead.
        if let Some(ahead) = batch.get(i + PREFETCH_AHEAD) {
            engine.prefetch(ahead);
        }
        engine
            .step(r)
            .with_context(|| format!("{}: request {} ({:?})", input, *n + 1, r))?;
        engine.clean_if_due();
        *n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            if let Some(p) = progress {
                p(*n);
            }
        }
    }
    Ok(())
}

/// The result of a run that processed `n` requests in `wall` seconds.
pub(crate) fn finish(
    spec: &SimSpec,
    engine: &impl result::EngineFigures,
    footprint: Option<u64>,
    wall: f64,
    n: u64,
    skipped: input::Skipped,
) -> Result<SimResult> {
    if n == 0 {
        return Err(no_requests(&spec.input));
    }
    let mut res = SimResult::new(spec, engine, footprint, wall);
    res.set_skipped(skipped);
    Ok(res)
}

/// The error for an input without a request (an empty trace, a header alone, every line
/// skipped): a run over it would "succeed" with nothing measured.
pub fn no_requests(input: &Input) -> anyhow::Error {
    anyhow::anyhow!(
        "{input}: no requests (an empty trace, a header alone, or every record skipped); \
         check the file and its --format (`tiercache trace stats FILE`)"
    )
}

/// A cache of 0 lines measures nothing: refused unless the size was written as 0 bytes
/// (the no-cache baseline the demo and no-cache runs build on purpose).
pub fn ensure_some_lines(spec: &SimSpec, lines: u64, footprint: Option<u64>) -> Result<()> {
    if lines > 0 || spec.cache_size == CacheSize::Bytes(0) {
        return Ok(());
    }
    anyhow::bail!(
        "cache size {} is a cache of 0 lines of {} bytes{}: give a larger size (bytes like \
         64MiB, or a share of the footprint like 10% or 0.1)",
        spec.cache_size,
        spec.engine.line_size,
        footprint
            .map(|f| format!(" (footprint {f} lines)"))
            .unwrap_or_default()
    )
}
