//! `tiercache sim` and `tiercache sweep`.

use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_engine::classes::Classify;
use tiercache_engine::ClassTable;
use tiercache_sim::experiment::{specs, CacheSection, InputSection};
use tiercache_sim::fileserver::{self, FileserverSpec, PhaseRange};
use tiercache_sim::sweep::SweepOptions;
use tiercache_sim::{
    run_sweep_with, run_timed, simulate, Drive, Experiment, Input, SimResult, SweepGrid,
    TimedReport, TimedSetup,
};

/// Where requests come from.
#[derive(Args, Clone, Debug, Default)]
pub struct InputArgs {
    /// Block trace to replay (compressed .gz/.zst/.xz/.bz2 is read transparently); the same
    /// as `--trace TRACE`, the way libCacheSim's cachesim takes it.
    #[arg(value_name = "TRACE", conflicts_with = "trace")]
    pub trace_arg: Option<PathBuf>,
    /// Block trace to replay (or give it as the first argument).
    #[arg(long, short = 't', value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Trace format, or `auto` to detect it. See `tiercache trace formats`.
    #[arg(long, value_name = "NAME|auto")]
    pub format: Option<String>,
    /// Skip malformed trace lines (counted and reported) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// Block size for formats that count blocks (ARC .lis, oracleGeneral ids).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Synthetic workload instead of a trace, e.g. `zipf:theta=0.9,wss=4GiB,requests=1e6` or
    /// `8k; 70% read; 100% random`. See `tiercache trace gen --help`.
    #[arg(long, short = 'w', value_name = "SPEC")]
    pub workload: Option<String>,
    /// Seed for synthetic workloads and randomised policies.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

impl InputArgs {
    /// The positional TRACE becomes `--trace`.
    pub fn take_positional(&mut self) {
        if let Some(t) = self.trace_arg.take() {
            self.trace = Some(t);
        }
    }
}

/// Cache settings (each overrides the experiment file).
#[derive(Args, Clone, Debug, Default)]
pub struct CacheArgs {
    /// Cache size: bytes (4GiB) or percent of the trace footprint (10%). Default 10%.
    #[arg(long, short = 's', value_name = "SIZE|PCT%")]
    pub cache_size: Option<String>,
    /// Replacement policy (see `tiercache policies`). Default lru.
    #[arg(long, short = 'p', value_name = "NAME")]
    pub policy: Option<String>,
    /// Write mode: write-through (wt), write-back (wb), write-around (wa), read-only (ro),
    /// pass-through (pt). Default write-through.
    #[arg(long, short = 'm', value_name = "MODE")]
    pub mode: Option<String>,
    /// Cache line: unit of validity, dirtiness and replacement (4KiB..1MiB). Default 4KiB
    /// (8KiB with --layout log).
    #[arg(long, value_name = "SIZE")]
    pub line_size: Option<String>,
    #[command(flatten)]
    pub tune: TuneArgs,
    /// What is valid and dirty inside a line: `sector` (512 B units, as Open CAS: a partial
    /// write needs no read of the rest of the line) or `line` (all or nothing, the model of
    /// libCacheSim and most papers). Default sector. Live: `format --validity` (fixed at
    /// format).
    #[arg(long, value_name = "sector|line")]
    pub validity: Option<String>,
    /// Cleaning writes a disk chunk of this size back in one request (its gaps read once)
    /// when it holds at least --rewrite-min-runs runs of dirty lines. 0 = off. Default 1MiB.
    #[arg(long, value_name = "SIZE")]
    pub rewrite_chunk: Option<String>,
    /// Runs of dirty lines in a chunk from which cleaning rewrites it whole. Default: the
    /// 7200 rpm model's crossover for a 1 MiB chunk.
    #[arg(long, value_name = "N")]
    pub rewrite_min_runs: Option<u64>,
    /// Write-back cleaning order: lba (disk order, one sweep per round; default), acp
    /// (densest disk chunk of --rewrite-chunk first, Open CAS's ACP) or alru (longest dirty
    /// first; lines dirty for more than --cleaning-age requests are cleaned even below the
    /// high watermark, Open CAS's ALRU).
    #[arg(long, value_name = "lba|acp|alru")]
    pub cleaning: Option<String>,
    /// --cleaning alru: requests after which a dirty line is cleaned. Default 100000.
    #[arg(long, value_name = "REQUESTS")]
    pub cleaning_age: Option<u64>,
    /// RAM tier above the cache: this much DRAM keeps clean whole lines, so the hottest
    /// reads touch neither the SSD nor the engine (e.g. 256MiB; 0 = none, the default). In a
    /// sweep every run has its own. The report gives reads per tier (RAM hits, SSD hits, misses); timed runs serve RAM hits
    /// with the `ram` device model (direct layout; hit-ratio runs take either layout).
    #[arg(long, value_name = "SIZE")]
    pub ram_cache: Option<String>,
    /// The RAM tier's replacement policy (see `tiercache policies`). Default s3fifo.
    #[arg(long, value_name = "NAME")]
    pub ram_policy: Option<String>,
    /// I/O class table (TOML): priorities and allocation for `--policy dss`, per-class
    /// partitions (min_share/max_share) and `never` classes for every policy, and rules that
    /// classify requests by offset, size, direction and volume. Shipped:
    /// experiments/classes/filesystem.toml, experiments/classes/database.toml.
    #[arg(long, value_name = "FILE")]
    pub classes: Option<PathBuf>,
}

/// The engine settings `sim`, `format` and `serve` share (same flags, same config keys, one
/// parser: [`CacheSection::apply_engine`]); the live volume can also change most of them at
/// run time (`tiercache ctl set`).
#[derive(Args, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TuneArgs {
    /// Admission/population unit (a multiple of the line; Qsan's cache block). Default = line.
    #[arg(long, value_name = "SIZE")]
    pub group_size: Option<String>,
    /// Qsan preset: database (1MiB/8KiB, read 2, write 0), file-system (2MiB/16KiB, 2/2),
    /// web-service (4MiB/64KiB, 2/0).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Admission: always, never, nhit:N, or nhit:READ:WRITE (populate once the group was
    /// read/written that often; 0 disables population in that direction).
    #[arg(long, value_name = "RULE")]
    pub admission: Option<String>,
    /// Sequential cutoff for reads: streams longer than this bypass the cache (0 = off).
    #[arg(long, value_name = "SIZE")]
    pub seq_cutoff: Option<String>,
    /// Sequential cutoff for writes.
    #[arg(long, value_name = "SIZE")]
    pub seq_cutoff_write: Option<String>,
    /// Write-back: start cleaning above this dirty share of the cache. Default 0.8.
    #[arg(long, value_name = "FRACTION")]
    pub dirty_high: Option<f64>,
    /// Write-back: clean down to this dirty share. Default 0.6.
    #[arg(long, value_name = "FRACTION")]
    pub dirty_low: Option<f64>,
    /// SLRU protected share. Default 0.5.
    #[arg(long, value_name = "FRACTION")]
    pub slru_protected: Option<f64>,
    /// Eviction prefers clean victims: when the policy's victim is dirty, the first clean
    /// line among its next N likely victims is evicted instead (no write-back on the miss).
    /// 0 = off (default). Live: `ctl set clean-victim-window N`.
    #[arg(long, value_name = "N")]
    pub clean_victim_window: Option<u32>,
    /// Writes that would need a fill (part of a line, or with sector validity part of a
    /// sector) of an uncached line go around the cache instead. Live: `ctl set partial-fill
    /// off|on` (on turns the fill back on).
    #[arg(long)]
    pub no_partial_fill: bool,
}

impl TuneArgs {
    /// These settings as experiment-file cache settings (the shared parser's input).
    pub fn section(&self) -> CacheSection {
        CacheSection {
            preset: self.preset.clone(),
            group_size: self.group_size.clone(),
            admission: self.admission.clone(),
            seq_cutoff_read: self.seq_cutoff.clone(),
            seq_cutoff_write: self.seq_cutoff_write.clone(),
            dirty_high: self.dirty_high,
            dirty_low: self.dirty_low,
            slru_protected: self.slru_protected,
            clean_victim_window: self.clean_victim_window,
            partial_write_fill: self.no_partial_fill.then_some(false),
            ..Default::default()
        }
    }

    /// No setting given.
    pub fn is_empty(&self) -> bool {
        *self == TuneArgs::default()
    }
}

impl CacheArgs {
    fn section(&self) -> CacheSection {
        CacheSection {
            size: self.cache_size.clone(),
            line_size: self.line_size.clone(),
            policy: self.policy.clone(),
            mode: self.mode.clone(),
            rewrite_chunk: self.rewrite_chunk.clone(),
            rewrite_min_runs: self.rewrite_min_runs,
            cleaning: self.cleaning.clone(),
            cleaning_age: self.cleaning_age,
            validity: self.validity.clone(),
            s3fifo_small: None,
            ram_cache: self.ram_cache.clone(),
            ram_policy: self.ram_policy.clone(),
            ..self.tune.section()
        }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  tiercache sim cloudPhysicsIO.csv --cache-size 10% --policy s3fifo    (or --cache-size 0.1)
  tiercache sim --workload 'zipf:theta=0.9,wss=8GiB,requests=2e6' --cache-size 1GiB --mode wb --json
  tiercache sim --config experiments/cloudphysics-lru.toml --policy arc
  tiercache sim --workload fileserver:scale=0.002 --policy dss --mode wb --admission nhit:0:1
  tiercache sim --workload fileserver --policy lru --classes experiments/classes/filesystem.toml \
      --hdd 7200 --raid 5:5 --ssd intel-710     (timed; prints seconds per phase)

The fileserver workload (DSS seed): fileserver[:scale=S,phases=setup+trans+prefind+archive+
find+scan,files=N,dirs=M,transactions=T]; scale 1 = 600,000 files in 20,000 directories.
  tiercache sim --trace cloudPhysicsIO.csv --cache-size 10% --layout log --compression lz4 --dedup 1.0 --json
  tiercache sim --workload boot-storm:vms=60,image=18MiB --cache-size 32MiB --layout log --dedup 1
  tiercache sim --trace cloudPhysicsIO.csv --cache-size 10% --layout log --mode wb --hdd 7200 --ssd default --queue-depth 8
The log layout runs wherever the direct one does: sweeps, experiment files (layout = \"log\"),
reproduce, Python, and timed replay (segment writes time as large SSD writes).")]
pub struct SimArgs {
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub timed: TimedArgs,
    #[command(flatten)]
    pub layout: crate::layout_args::LayoutArgs,
    /// A volume of a cache pool, NAME=TRACE (repeat it): the traces are merged by arrival
    /// time (each trace's clock starting at its first record) and replayed as volumes
    /// 0, 1, ... sharing one cache under one policy; the report adds a row per volume.
    /// Each trace must be of one volume (replay a trace with a volume column alone, with
    /// --per-volume). Instead of --trace / --workload; direct layout only.
    #[arg(long = "volume", value_name = "NAME=TRACE", conflicts_with_all = ["trace", "trace_arg", "workload"])]
    pub volumes: Vec<String>,
    /// A volume's own write mode, NAME=MODE (repeat it; NAME is a --volume name or, for a
    /// trace's own volume column, a volume id): e.g. `--volume-mode logs=pt` keeps one
    /// volume out of the cache while the others use --mode.
    #[arg(long, value_name = "NAME=MODE")]
    pub volume_mode: Vec<String>,
    /// A volume's own admission rule, NAME=RULE (always, never, nhit:N, nhit:R:W).
    #[arg(long, value_name = "NAME=RULE")]
    pub volume_admission: Vec<String>,
    /// A volume's own sequential cutoff, NAME=SIZE (read streams; writes keep
    /// --seq-cutoff-write) or NAME=READ:WRITE, 0 = off; as `serve --volume-seq-cutoff`.
    #[arg(long, value_name = "NAME=SIZE")]
    pub volume_seq_cutoff: Vec<String>,
    /// A volume's occupancy bounds, NAME=MIN:MAX: shares of the pool (`db=0.25:0.6`) or
    /// percents (`db=25%:60%`; repeat it), as `serve --volume-share`. The volume gets a
    /// partition of its own under the policy: at MAX it replaces its own lines, and other
    /// volumes do not evict it below MIN while any partition is above its own minimum.
    #[arg(long, value_name = "NAME=MIN:MAX")]
    pub volume_share: Vec<String>,
    /// Report per volume (id, mode, hit ratio, lines held, HDD traffic): implied by
    /// --volume, --volume-mode, --volume-admission and --volume-seq-cutoff; for a trace with
    /// a volume column.
    #[arg(long)]
    pub per_volume: bool,
    /// Split the engine into N shards: N independent engines, each with 1/N of the
    /// capacity; a line belongs to the shard of its granule (1 MiB, smaller for a cache too
    /// small to give every shard 64 of them, never below a line or a group; a cache too
    /// small even then runs fewer shards, said in the output), and a request crossing
    /// granules of different shards is split. This
    /// is how the live volume will spread its engine over cores; here it shows what that
    /// costs in hit ratio (`scripts/shard_hit_ratio.sh`). Default 1 in the simulator, so
    /// results stay comparable with earlier runs and other simulators. Untimed
    /// direct-layout runs only (no --hdd/--ssd, --layout log or --ram-cache).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=tiercache_engine::MAX_SHARDS as i64))]
    pub shards: u32,
    /// A fixed granule for --shards (default: from the cache size, see --shards): lines of
    /// one granule share a shard. Fixes the shard count too (no fallback to fewer shards);
    /// at least a line and a group (and, with --cleaning acp and --rewrite-chunk 0, 1 MiB);
    /// each shard's --rewrite-chunk is capped at it. For experiments.
    #[arg(long, value_name = "SIZE", requires = "shards")]
    pub shard_granule: Option<String>,
    /// Experiment file (TOML); flags override its values.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the result as JSON. One schema for every run (the same top-level keys):
    /// `layout` is direct, log or none (--no-cache); `policy` is the replacement policy, the
    /// segment picker for the log layout, null without a cache; `log` holds the log layout's
    /// own figures (segments, reduction, FTL) and is null otherwise.
    #[arg(long)]
    pub json: bool,
    /// Print the result as CSV (header and one row).
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  tiercache sweep --trace cloudPhysicsIO.csv --sizes 1%,5%,10% --policies lru,fifo,arc,s3fifo --out sweep.csv
  tiercache sweep --config experiments/srt-size-sweep.toml --out srt.csv
  tiercache sweep --trace cloudPhysicsIO.csv --sizes 1%,5%,10% --layout log --compression lz4 --dedup 1")]
pub struct SweepArgs {
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub layout: crate::layout_args::LayoutArgs,
    /// Cache sizes to sweep, comma-separated (bytes or percent).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub sizes: Vec<String>,
    /// Policies to sweep, comma-separated (`all` = every registered policy).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub policies: Vec<String>,
    /// Write modes to sweep, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub modes: Vec<String>,
    /// Line sizes to sweep, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub line_sizes: Vec<String>,
    /// Experiment file (TOML) with an optional [sweep] grid; flags add to / override it.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CSV output file (default: standard output).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print JSON (an array of results) instead of CSV.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Read the input once per run, as before one-pass sweeps (to compare; slower). By
    /// default the runs of one input share a single pass over it: each request is parsed
    /// once and handed to every run's engine (log-layout runs and belady read on their own).
    #[arg(long)]
    pub per_run: bool,
    /// Run an engine for every point. By default the LRU points of one input that differ
    /// only in size (write-through, admission always, no sequential cutoff, group = line,
    /// no class or volume table, RAM tier or shards) come from one LRU stack-distance pass,
    /// every counter derived exactly; the JSON's "method" says which ("stack" or
    /// "engines"). An input the stack model does not cover (trims, partial-line writes with
    /// sector validity) runs the engines by itself.
    #[arg(long)]
    pub per_engine: bool,
}

/// Merges flags over an optional experiment file.
pub(crate) fn experiment(
    config: &Option<PathBuf>,
    input: &InputArgs,
    cache: &CacheArgs,
) -> Result<Experiment> {
    let mut exp = match config {
        Some(p) => Experiment::load(p)?,
        None => Experiment::default(),
    };
    let i: &mut InputSection = &mut exp.input;
    if input.trace.is_some() || input.workload.is_some() {
        i.trace = input.trace.clone();
        i.workload = input.workload.clone();
    }
    if input.format.is_some() {
        i.format = input.format.clone();
    }
    if input.block_size.is_some() {
        i.block_size = input.block_size.clone();
    }
    i.skip_bad |= input.skip_bad;
    if let Some(s) = input.seed {
        i.seed = s;
    }
    exp.cache.overlay(&cache.section());
    Ok(exp)
}

fn input_total(input: &Input) -> Option<u64> {
    match input {
        Input::Workload { spec, seed } => Some(spec.generate(*seed).len() as u64),
        Input::Memory { requests, .. } => Some(requests.len() as u64),
        Input::Trace { .. } => None,
    }
}

/// `--workload fileserver...`: the generated trace, its phases and the bytes its volume
/// spans (a timed run refuses a smaller backing device).
fn fileserver_input(input: &InputArgs) -> Result<Option<(Input, Vec<PhaseRange>, u64)>> {
    let Some(w) = input
        .workload
        .as_deref()
        .filter(|w| w.trim().starts_with("fileserver"))
    else {
        return Ok(None);
    };
    anyhow::ensure!(
        input.trace.is_none(),
        "give either a trace or a workload, not both"
    );
    let spec: FileserverSpec = w.parse()?;
    let t = fileserver::generate(&spec, input.seed.unwrap_or(1));
    Ok(Some((
        Input::Memory {
            name: spec.to_string(),
            requests: Arc::new(t.requests),
        },
        t.phases,
        t.volume_bytes,
    )))
}

/// `--classes FILE`: loads the table; with classification rules, relabels the input.
fn apply_classes(path: &Option<PathBuf>, spec: &mut tiercache_sim::SimSpec) -> Result<()> {
    let Some(p) = path else {
        return Ok(());
    };
    let table = Arc::new(ClassTable::load(p)?);
    if table.classify == Classify::Rules {
        // Rules need the request itself: the input is read once and relabelled in memory.
        let mut reqs: Vec<tiercache_engine::Request> = spec.input.open()?.collect::<Result<_>>()?;
        for r in &mut reqs {
            r.class = table.classify(r);
        }
        spec.input = Input::Memory {
            name: format!("{} (classified by {})", spec.input.label(), p.display()),
            requests: Arc::new(reqs),
        };
    }
    spec.engine.policy_params.classes = Some(table);
    Ok(())
}

pub fn sim(mut a: SimArgs) -> Result<()> {
    a.input.take_positional();
    let fs = fileserver_input(&a.input)?;
    let mut input_args = a.input.clone();
    if fs.is_some() {
        input_args.workload = None;
    }
    let mut exp = experiment(&a.config, &input_args, &a.cache)?;
    exp.cache.overlay(&a.layout.section()?);
    // Content workloads (boot storm, snapshot restore) carry their own content and are
    // generated at the cache's line size, 8 KiB unless given (their own default).
    let content = exp
        .input
        .workload
        .clone()
        .filter(|w| tiercache_sim::log::is_content_workload(w));
    if content.is_some() && exp.cache.line_size.is_none() {
        exp.cache.line_size = Some(tiercache_sim::log::DEFAULT_LOG_LINE.to_string());
    }
    let merged = merge_volume_traces(&a, &exp)?;
    let table = merged.as_ref().map(|m| m.1.clone());
    let (input, phases, volume) = match (fs, &content, merged) {
        (_, _, Some((i, _))) => (i, Vec::new(), None),
        (Some((i, p, v)), _, None) => (i, p, Some(v)),
        (None, Some(w), None) => (
            Input::Memory {
                name: w.clone(),
                requests: Arc::new(Vec::new()),
            },
            Vec::new(),
            None,
        ),
        (None, None, None) => (exp.input.to_input()?, Vec::new(), None),
    };
    let mut spec = specs(&input, &exp.cache, None, exp.input.seed)?.remove(0);
    if let Some(w) = &content {
        tiercache_sim::log::attach_content_workload(&mut spec, w)?;
    }
    apply_classes(&a.cache.classes, &mut spec)?;
    spec.engine.shards = a.shards;
    if let Some(g) = &a.shard_granule {
        spec.engine.shard_granule = tiercache_engine::parse_size(g)
            .map_err(|e| anyhow::anyhow!("--shard-granule {g}: {e}"))?;
    }
    apply_volume_settings(&a, table, &mut spec)?;
    let progress = Progress::new(a.quiet, input_total(&spec.input), "requests");
    if let Some(mut setup) = a.timed.setup()? {
        setup.options.phase_starts = phases.iter().map(|p| p.start as u64).collect();
        setup.options.volume_bytes = volume;
        let rep = run_timed(&spec, &setup, Some(&|n| progress.set(n)))?;
        progress.finish();
        print_timed(&rep, a.json, a.csv)?;
        if !a.json && !a.csv && !phases.is_empty() {
            println!("phase          requests   seconds      IOPS");
            for (p, s) in phases.iter().zip(&rep.timed.phase_s) {
                let n = p.end - p.start;
                println!(
                    "{:<13} {:>9} {:>9.2} {:>9.0}",
                    p.phase.name(),
                    n,
                    s,
                    if *s > 0.0 { n as f64 / s } else { 0.0 }
                );
            }
        }
        return Ok(());
    }
    let mut footprint = None;
    if let Some((n, copies)) = a.timed.untimed_pool()? {
        let (pooled, fp, _) = tiercache_sim::ssd_pool::pooled_spec(&spec, n, copies)?;
        spec = pooled;
        footprint = fp;
    }
    let res = simulate(&spec, footprint, Some(&|n| progress.set(n)))?;
    progress.finish();
    print_one(&res, a.json, a.csv)
}

/// `--volume NAME=TRACE`...: the traces merged into one input, and the volume table.
fn merge_volume_traces(
    a: &SimArgs,
    exp: &Experiment,
) -> Result<Option<(Input, Vec<tiercache_engine::VolumeConfig>)>> {
    if a.volumes.is_empty() {
        return Ok(None);
    }
    let mut vols = Vec::new();
    for v in &a.volumes {
        let (name, path) = v
            .split_once('=')
            .filter(|(n, p)| !n.trim().is_empty() && !p.is_empty())
            .with_context(|| format!("--volume {v}: give NAME=TRACE, e.g. --volume db=db.csv"))?;
        let mut sec = exp.input.clone();
        sec.trace = Some(PathBuf::from(path));
        sec.workload = None;
        vols.push(tiercache_sim::VolumeInput {
            name: name.trim().to_string(),
            input: sec.to_input()?,
        });
    }
    tiercache_sim::merge_volumes(&vols).map(Some)
}

/// `--volume-mode`, `--volume-admission`, `--per-volume`: the engine's volume table (the
/// merged volumes' names, `table`, when --volume gave them).
fn apply_volume_settings(
    a: &SimArgs,
    table: Option<Vec<tiercache_engine::VolumeConfig>>,
    spec: &mut tiercache_sim::SimSpec,
) -> Result<()> {
    use tiercache_engine::VolumeConfig;
    let any = table.is_some()
        || a.per_volume
        || !a.volume_mode.is_empty()
        || !a.volume_admission.is_empty()
        || !a.volume_seq_cutoff.is_empty()
        || !a.volume_share.is_empty();
    if !any {
        return Ok(());
    }
    anyhow::ensure!(
        spec.log.is_none(),
        "--volume, --volume-mode, --volume-admission, --volume-seq-cutoff, --volume-share and \
         --per-volume run \
         on the direct layout \
         only for now; drop --layout log"
    );
    let mut vols = table.unwrap_or_default();
    // A volume given by name must be a --volume; one given by id may be any (a trace's
    // volume column); volumes never named run with the engine-wide settings.
    fn find<'v>(
        vols: &'v mut Vec<VolumeConfig>,
        flag: &str,
        name: &str,
    ) -> Result<&'v mut VolumeConfig> {
        if let Some(i) = vols.iter().position(|v| v.name == name) {
            return Ok(&mut vols[i]);
        }
        let id: u32 =
            name.parse().map_err(|_| {
                anyhow::anyhow!(
                "{flag} {name}=...: no volume is named '{name}' (volumes: {}); give a --volume \
                 name or a volume id",
                if vols.is_empty() {
                    "none given with --volume".to_string()
                } else {
                    vols.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", ")
                }
            )
            })?;
        if let Some(i) = vols.iter().position(|v| v.id == id) {
            return Ok(&mut vols[i]);
        }
        vols.push(VolumeConfig::new(id, id.to_string()));
        Ok(vols.last_mut().expect("just pushed"))
    }
    let split = |flag: &str, s: &str| -> Result<(String, String)> {
        s.split_once('=')
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .with_context(|| format!("{flag} {s}: give NAME=VALUE"))
    };
    for s in &a.volume_mode {
        let (n, m) = split("--volume-mode", s)?;
        let mode = m
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--volume-mode {s}: {e}"))?;
        find(&mut vols, "--volume-mode", &n)?.mode = Some(mode);
    }
    // Parsed as `serve` parses them (one parser: `tiercache_server::vol_tuning`).
    for s in &a.volume_admission {
        let (n, adm) = tiercache_server::vol_tuning::admission_flag("--volume-admission", s)
            .map_err(|e| anyhow::anyhow!(e))?;
        find(&mut vols, "--volume-admission", &n)?.admission = Some(adm);
    }
    let pool_cut = spec.engine.seq_cutoff;
    for s in &a.volume_seq_cutoff {
        let (n, cut) = tiercache_server::vol_tuning::cutoff_flag("--volume-seq-cutoff", s)
            .map_err(|e| anyhow::anyhow!(e))?;
        find(&mut vols, "--volume-seq-cutoff", &n)?.seq_cutoff = Some(cut.resolve(pool_cut));
    }
    let mut shares = Vec::new();
    for s in &a.volume_share {
        let (n, share) = tiercache_server::vol_tuning::share_flag("--volume-share", s)
            .map_err(|e| anyhow::anyhow!(e))?;
        let volume = find(&mut vols, "--volume-share", &n)?.id;
        let (min, max) = share.bounds();
        anyhow::ensure!(
            !shares
                .iter()
                .any(|x: &tiercache_engine::policy::VolumeShare| x.volume == volume),
            "--volume-share {s}: volume {n} is given a share twice"
        );
        shares.push(tiercache_engine::policy::VolumeShare { volume, min, max });
    }
    shares.sort_by_key(|x| x.volume);
    tiercache_engine::policy::VolumeShare::validate(&shares)
        .map_err(|e| anyhow::anyhow!("--volume-share: {e}"))?;
    spec.engine.policy_params.volume_shares = shares;
    if vols.is_empty() {
        // --per-volume alone: a table that only switches per-volume counting on (volume 0
        // named by its id, like every volume met in the trace).
        vols.push(VolumeConfig::new(0, "0"));
    }
    vols.sort_by_key(|v| v.id);
    spec.engine.volumes = vols;
    spec.engine
        .validate()
        .map_err(|e| anyhow::anyhow!("volumes: {e}"))?;
    Ok(())
}

pub(crate) fn print_one(res: &SimResult, json: bool, csv: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, res)?;
        writeln!(out)?;
    } else if csv {
        writeln!(out, "{}", SimResult::CSV_HEADER)?;
        writeln!(out, "{}", res.csv_row())?;
    } else {
        writeln!(out, "{res}")?;
    }
    Ok(())
}

pub fn sweep(mut a: SweepArgs) -> Result<()> {
    a.input.take_positional();
    if let Some(list) = a.cache.cache_size.as_deref().filter(|s| s.contains(',')) {
        bail!("--cache-size {list}: sweep takes one size there; a list of sizes to sweep is --sizes {list}");
    }
    let fs = fileserver_input(&a.input)?;
    let mut input_args = a.input.clone();
    if fs.is_some() {
        input_args.workload = None;
    }
    let mut exp = experiment(&a.config, &input_args, &a.cache)?;
    exp.cache.overlay(&a.layout.section()?);
    let input = match fs {
        Some((i, _, _)) => i,
        None => exp.input.to_input()?,
    };
    let mut grid: SweepGrid = exp.sweep.clone().unwrap_or_default();
    let set = |dst: &mut Vec<String>, src: &[String]| {
        if !src.is_empty() {
            *dst = src.to_vec();
        }
    };
    set(&mut grid.size, &a.sizes);
    set(&mut grid.mode, &a.modes);
    set(&mut grid.line_size, &a.line_sizes);
    if a.policies.iter().any(|p| p == "all") {
        grid.policy = tiercache_engine::policy::names()
            .iter()
            .map(|s| s.to_string())
            .collect();
    } else {
        set(&mut grid.policy, &a.policies);
    }
    let mut specs = specs(&input, &exp.cache, Some(&grid), exp.input.seed)?;
    for spec in &mut specs {
        apply_classes(&a.cache.classes, spec)?;
    }
    if specs.is_empty() {
        bail!("the sweep grid is empty");
    }
    if let Some(j) = a.jobs {
        rayon::ThreadPoolBuilder::new()
            .num_threads(j)
            .build_global()
            .context("setting up worker threads")?;
    }
    let n = specs.len() as u64;
    let progress = Progress::new(a.quiet, Some(n), "runs");
    let cells = run_sweep_with(
        specs,
        SweepOptions {
            per_cell: a.per_run,
            per_engine: a.per_engine,
            on_note: Some(&|m| {
                if !a.quiet {
                    eprintln!("note: {m}");
                }
            }),
            on_cell: Some(&|d| progress.set(d as u64)),
            // Runs sharing a pass finish together: the requests read show it moving.
            on_requests: Some(&|r| {
                progress.set_message(format!("{} requests read", indicatif::HumanCount(r)))
            }),
            ..Default::default()
        },
    )?;
    progress.finish();
    let mut results = Vec::new();
    for c in cells {
        results.push(c.result.with_context(|| {
            format!(
                "run policy={} mode={} size={}",
                c.spec.engine.policy, c.spec.engine.mode, c.spec.cache_size
            )
        })?);
    }
    let mut w: Box<dyn Write> = match &a.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    if a.json {
        serde_json::to_writer_pretty(&mut w, &results)?;
        writeln!(w)?;
    } else {
        writeln!(w, "{}", SimResult::CSV_HEADER)?;
        for r in &results {
            writeln!(w, "{}", r.csv_row())?;
        }
    }
    w.flush()?;
    if let Some(p) = &a.out {
        if !a.quiet {
            eprintln!("{} runs written to {}", results.len(), p.display());
        }
    }
    Ok(())
}

/// Timing: device models and how requests are issued. Any of these makes the run timed.
#[derive(Args, Clone, Debug, Default)]
pub struct TimedArgs {
    /// Backing device model: 5400, 7200, 10k, 15k (HDD presets), any preset of
    /// `--ssd`, or a TOML model file. Default 7200 in timed runs.
    #[arg(long, value_name = "MODEL", help_heading = "Timing")]
    pub hdd: Option<String>,
    /// Cache device model: default, intel-710, intel-311, c300, srt-3x, ram, nvram, emu:LAT_US[:CHANNELS]
    /// (the server's --emulate-ssd), or a TOML model file. Default `default` in timed runs.
    /// Repeat it for a pool of cache devices (like `serve --cache` repeated): the cache size
    /// is split equally over them (each rounded down to a multiple of 128 lines), slots are
    /// laid out member after member, and each member's busy time and ops are reported.
    #[arg(long, value_name = "MODEL", help_heading = "Timing")]
    pub ssd: Vec<String>,
    /// Pool member INDEX (0 = the first --ssd) fails SECONDS of simulated time after the
    /// first request, as a live `serve --cache A --cache B` member that errs: its clean lines
    /// are dropped (missed again from the backing device), its mirrored dirty lines are served
    /// from their copies on the other members (promoted), dirty lines with no copy are lost
    /// (counted), and the rest of the replay runs on the surviving members. Reported as
    /// `ssd_failure` (text and --json).
    #[arg(long, value_name = "INDEX@SECONDS", help_heading = "Timing")]
    pub fail_ssd: Option<String>,
    /// Cache copies of each dirty line in a pool (--ssd repeated), as `serve --dirty-copies`:
    /// 2 (the default in write-back on two or more devices) writes every dirty line to two
    /// members, so one member failing loses none, at the cost of slots and SSD writes; 1
    /// keeps one copy.
    #[arg(long, value_name = "N", help_heading = "Timing")]
    pub dirty_copies: Option<u8>,
    /// Split the cache over N cache devices of equal size, as `serve --cache A --cache B ...`
    /// runs it: lines are striped over the devices and, in write-back, each dirty line is
    /// written to two of them (see --dirty-copies), which takes slots and SSD writes. Runs
    /// untimed (the counters a queue-depth-1 replay of a live pool gives) or timed: with one
    /// --ssd MODEL, N devices of that model; with --ssd repeated, N must match.
    #[arg(long, value_name = "N", help_heading = "Timing")]
    pub cache_devices: Option<usize>,
    /// No cache: the backing device alone (the baseline).
    #[arg(long, help_heading = "Timing")]
    pub no_cache: bool,
    /// Backing device is a RAID of N disks of the --hdd model: 0:N or 5:N.
    #[arg(long, value_name = "LEVEL:N", help_heading = "Timing")]
    pub raid: Option<String>,
    /// Closed loop: keep N requests outstanding, as fast as the devices allow (like fio).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "speedup",
        help_heading = "Timing"
    )]
    pub queue_depth: Option<u32>,
    /// Open loop: issue requests at their trace timestamps divided by X.
    #[arg(long, value_name = "X", help_heading = "Timing")]
    pub speedup: Option<f64>,
    /// Time-series window in simulated seconds (IOPS and hit ratio over time, warm-up).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 1.0,
        help_heading = "Timing"
    )]
    pub window: f64,
    /// Price table (TOML) for the cost per MB per IOPS; default: the sourced built-in table.
    #[arg(long, value_name = "FILE", help_heading = "Timing")]
    pub prices: Option<PathBuf>,
}

impl TimedArgs {
    fn is_timed(&self) -> bool {
        self.hdd.is_some()
            || !self.ssd.is_empty()
            || self.no_cache
            || self.raid.is_some()
            || self.queue_depth.is_some()
            || self.speedup.is_some()
            || self.fail_ssd.is_some()
            || (self.dirty_copies.is_some() && self.cache_devices.is_none())
    }

    /// Cache devices in the pool (1: no pool): --cache-devices, else one per --ssd.
    fn members(&self) -> Result<usize> {
        let given = self.ssd.len().max(1);
        match self.cache_devices {
            None => Ok(given),
            Some(n) => {
                anyhow::ensure!(
                    (1..=tiercache_engine::MAX_MEMBERS).contains(&n),
                    "--cache-devices {n}: 1 to {} cache devices",
                    tiercache_engine::MAX_MEMBERS
                );
                anyhow::ensure!(
                    self.ssd.len() <= 1 || self.ssd.len() == n,
                    "--cache-devices {n} with {} --ssd models: give one --ssd MODEL for N \
                     devices of that model, or one --ssd per device",
                    self.ssd.len()
                );
                Ok(n)
            }
        }
    }

    /// Checks --dirty-copies against a pool of `members` cache devices.
    fn dirty_copies(&self, members: usize) -> Result<Option<u8>> {
        let Some(n) = self.dirty_copies else {
            return Ok(None);
        };
        anyhow::ensure!(
            matches!(n, 1 | 2),
            "--dirty-copies {n}: 1 or 2 (copies of each dirty line in a pool of cache devices)"
        );
        anyhow::ensure!(
            members >= 2 || n == 1,
            "--dirty-copies {n} needs a pool of two or more cache devices (--ssd repeated or \
             --cache-devices N)"
        );
        Ok(Some(n))
    }

    /// The untimed run's pool, when --cache-devices asks for one: (members, dirty copies).
    pub fn untimed_pool(&self) -> Result<Option<(usize, Option<u8>)>> {
        if self.is_timed() || self.cache_devices.is_none() {
            return Ok(None);
        }
        let n = self.members()?;
        let copies = self.dirty_copies(n)?;
        Ok((n >= 2).then_some((n, copies)))
    }

    /// The timed setup, when any timing flag was given.
    pub fn setup(&self) -> Result<Option<TimedSetup>> {
        if !self.is_timed() {
            return Ok(None);
        }
        let mut s = TimedSetup::default();
        if let Some(h) = &self.hdd {
            s.hdd = h.clone();
        }
        s.ssd = if self.no_cache {
            None
        } else {
            Some(
                self.ssd
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "ssd:default".into()),
            )
        };
        let members = self.members()?;
        if !self.no_cache {
            s.pool = if self.ssd.len() >= 2 {
                self.ssd.iter().skip(1).cloned().collect()
            } else {
                vec![s.ssd.clone().unwrap_or_default(); members - 1]
            };
        }
        if let Some(r) = &self.raid {
            let bad = || anyhow::anyhow!("--raid '{r}': use LEVEL:N, e.g. 0:12 or 5:8");
            let (l, n) = r.split_once(':').ok_or_else(bad)?;
            s.raid = Some((
                l.trim().parse().map_err(|_| bad())?,
                n.trim().parse().map_err(|_| bad())?,
            ));
        }
        s.options.drive = match (self.queue_depth, self.speedup) {
            (_, Some(x)) => {
                anyhow::ensure!(x > 0.0, "--speedup must be above 0");
                Drive::Open { speedup: x }
            }
            (Some(q), None) => {
                anyhow::ensure!(q > 0, "--queue-depth must be at least 1");
                Drive::Closed { queue_depth: q }
            }
            (None, None) => Drive::Closed { queue_depth: 1 },
        };
        if let Some(f) = &self.fail_ssd {
            let bad = || {
                anyhow::anyhow!(
                    "--fail-ssd '{f}': use INDEX@SECONDS, e.g. 1@30 (member 1 fails 30 s into \
                     the replay)"
                )
            };
            let (d, t) = f.split_once('@').ok_or_else(bad)?;
            let d: usize = d.trim().parse().map_err(|_| bad())?;
            let t: f64 = t.trim().parse().map_err(|_| bad())?;
            anyhow::ensure!(
                t.is_finite() && t >= 0.0,
                "--fail-ssd '{f}': SECONDS must be >= 0"
            );
            s.options.fail_ssd = Some((d, (t * 1e9) as u64));
        }
        s.options.dirty_copies = self.dirty_copies(members)?;
        anyhow::ensure!(self.window > 0.0, "--window must be above 0");
        s.options.window_ns = (self.window * 1e9) as u64;
        if let Some(p) = &self.prices {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            s.prices =
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        }
        Ok(Some(s))
    }
}

fn print_timed(rep: &TimedReport, json: bool, csv: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, rep)?;
        writeln!(out)?;
        return Ok(());
    }
    if csv {
        writeln!(out, "{},iops,mb_per_s,latency_mean_us,latency_p99_us,elapsed_s,hdd_busy_s,ssd_busy_s,warmup_s,cost_per_mb_per_iops", SimResult::CSV_HEADER)?;
        let t = &rep.timed;
        writeln!(
            out,
            "{},{:.1},{:.3},{:.1},{:.1},{:.3},{:.3},{},{},{}",
            rep.sim.csv_row(),
            t.iops,
            t.mb_per_s,
            t.latency_us.all.mean,
            t.latency_us.all.p99,
            t.elapsed_s,
            t.hdd.busy_s,
            t.ssd
                .as_ref()
                .map(|s| format!("{:.3}", s.busy_s))
                .unwrap_or_default(),
            t.warmup_s.map(|w| format!("{w:.3}")).unwrap_or_default(),
            rep.cost_per_mb_per_iops
                .map(|c| format!("{c:.6e}"))
                .unwrap_or_default()
        )?;
        return Ok(());
    }
    writeln!(out, "{}", rep.sim)?;
    let t = &rep.timed;
    writeln!(
        out,
        "timing       {}; backing {}; cache device {}",
        t.drive,
        rep.hdd_model,
        rep.ssd_model.as_deref().unwrap_or("none")
    )?;
    writeln!(
        out,
        "throughput   {:.0} IOPS ({:.0} read, {:.0} write), {:.2} MB/s ({:.2} read, {:.2} write)",
        t.iops, t.read_iops, t.write_iops, t.mb_per_s, t.read_mb_per_s, t.write_mb_per_s
    )?;
    for (name, l) in [
        ("all", &t.latency_us.all),
        ("read", &t.latency_us.read),
        ("write", &t.latency_us.write),
    ] {
        if l.count > 0 {
            writeln!(
                out,
                "latency {:<5} mean {:.1} us, p50 {:.1}, p90 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1} ({} requests)",
                name, l.mean, l.p50, l.p90, l.p99, l.p999, l.max, l.count
            )?;
        }
    }
    writeln!(
        out,
        "time         {:.3} s to complete ({:.3} s with background work)",
        t.elapsed_s, t.drained_s
    )?;
    writeln!(
        out,
        "busy         HDD {:.3} s ({:.1} %){}",
        t.hdd.busy_s,
        t.hdd.utilisation * 100.0,
        t.ssd
            .as_ref()
            .map(|s| format!(", SSD {:.3} s ({:.1} %)", s.busy_s, s.utilisation * 100.0))
            .unwrap_or_default()
    )?;
    for (d, m) in t.ssd_members.iter().enumerate() {
        writeln!(
            out,
            "  member {d}   {} busy {:.3} s ({:.1} %), {} ops, {} bytes read, {} written",
            m.name,
            m.busy_s,
            m.utilisation * 100.0,
            m.ops,
            m.bytes_read,
            m.bytes_written
        )?;
    }
    if let Some(f) = &t.ssd_failure {
        writeln!(
            out,
            "member fail  member {} failed at {:.3} s: {} clean lines dropped, {} dirty lines \
             served from their copies, {} dirty lines lost, {} ops planned before reached it after",
            f.member,
            f.at_s,
            f.dropped_clean,
            f.promoted_dirty_lines,
            f.lost_dirty_lines,
            f.late_ops
        )?;
    }
    match t.warmup_s {
        Some(w) => writeln!(
            out,
            "warm-up      {w:.1} s (windowed hit ratio reaches 95 % of its final value)"
        )?,
        None => writeln!(
            out,
            "warm-up      {}",
            t.warmup_note.as_deref().unwrap_or("n/a (no cache)")
        )?,
    }
    if let Some(w) = t.warmup_iops_s {
        writeln!(
            out,
            "             {w:.1} s until windowed IOPS reaches 95 % of its final value"
        )?;
    }
    if let Some(n) = &t.wrap_note {
        writeln!(out, "folded       {} requests: {n}", t.wrapped_requests)?;
    }
    match (rep.cost_usd, rep.cost_per_mb_per_iops) {
        (Some(c), Some(m)) => writeln!(out, "cost         ${c:.2}; {m:.3e} $ per MB per IOPS")?,
        _ => writeln!(
            out,
            "cost         n/a (a device has no price in the table; see --prices)"
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches as _;

    /// Experiment-file keys `tiercache sim`'s cache flags cannot set: the log layout's
    /// (they come through `LayoutArgs`) and `s3fifo_small` (no flag yet).
    const NO_CACHE_FLAG: &[&str] = &[
        "layout",
        "segment_size",
        "compression",
        "dedup",
        // The log layout's keys: set by the layout flags (`LayoutArgs`), not `CacheArgs`.
        "picker",
        "trim",
        "free_reserve",
        "reinsert_hits",
        "dup_share",
        "erase_block",
        "content_lengths",
        "s3fifo_small",
    ];

    /// The flag that sets an experiment-file key, where the names differ.
    fn flag_of(key: &str) -> String {
        match key {
            "size" => "cache-size".into(),
            "seq_cutoff_read" => "seq-cutoff".into(),
            "partial_write_fill" => "no-partial-fill".into(),
            k => k.replace('_', "-"),
        }
    }

    fn parse(args: &[&str]) -> Option<CacheArgs> {
        let cmd = CacheArgs::augment_args(clap::Command::new("sim").no_binary_name(true));
        let m = cmd.try_get_matches_from(args).ok()?;
        CacheArgs::from_arg_matches(&m).ok()
    }

    /// Fails when a field is added to `CacheSection` (an experiment-file key) and `sim`'s
    /// flags cannot set it, unless it is listed in NO_CACHE_FLAG; and when a listed key gets
    /// a flag (the list must shrink).
    #[test]
    fn every_experiment_cache_key_has_a_sim_flag() {
        let keys = serde_json::to_value(CacheSection::default()).unwrap();
        for k in keys.as_object().unwrap().keys() {
            let flag = format!("--{}", flag_of(k));
            let set = ["7k", "0.7", "7"].iter().find_map(|v| {
                let a = parse(&[flag.as_str(), v]).or_else(|| parse(&[flag.as_str()]))?;
                let s = serde_json::to_value(a.section()).unwrap();
                (!s[k.as_str()].is_null()).then_some(())
            });
            if NO_CACHE_FLAG.contains(&k.as_str()) {
                assert!(
                    set.is_none(),
                    "{k} has a flag now: take it off NO_CACHE_FLAG"
                );
            } else {
                assert!(
                    set.is_some(),
                    "experiment key {k}: no sim flag {flag} sets it"
                );
            }
        }
    }
}
