//! Sweeps: many simulations of one input, on all cores.
//!
//! Cells that read the same input ([`Input::same_source`]) run in one pass: the input is
//! read and parsed once, and every batch of requests goes to every cell's engine; the
//! engines are dealt to one worker thread per core, and each batch is queued to every
//! worker. The requests in memory are a few batches, whatever the trace's length; the
//! engines of a pass are all alive at once, so a group whose caches add up to more than
//! [`SweepOptions::index_budget`] runs in several passes, one after another. Each engine sees
//! the same requests in the same order through the same loop as a single [`simulate`] run,
//! so every counter is the same. Cells of the log layout, cells whose policy needs the next-use oracle (it loads the
//! whole trace anyway) and inputs with one cell run on their own, as before.
//!
//! LRU cells of one input that differ only in size, in a configuration where every counter
//! follows from the stack distances ([`crate::stack_sweep`]), need no engine at all: one
//! stack-distance pass gives all of them (`"method": "stack"` in their results; the others
//! say `"engines"`). An input with a request the stack model does not derive (a trim, a
//! partial-line write with sector validity) runs their engines instead.
//!
//! [`Input::same_source`]: crate::Input::same_source

use crate::input::Skipped;
use crate::{feed, finish, footprint_lines, prepare, simulate, SimResult, SimSpec};
use anyhow::Result;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tiercache_engine::{Engine, Request};

/// One cell of a sweep and its result.
#[derive(Debug)]
pub struct SweepCell {
    pub spec: SimSpec,
    pub result: Result<SimResult>,
}

/// Requests per batch handed to the engines of a one-pass group (20 MiB at 40 bytes a
/// request; a pass holds at most 4 of them: 2 queued per worker, shared, 1 being gathered,
/// 1 in work). A worker switches engines every batch, and each switch reloads the engine's
/// index into the core's caches: on a 20-point LRU sweep of 10 M requests (2 cores, 4 MiB
/// L2 each) the sweep took 25.0 / 16.9 / 12.4 / 11.2 / 10.7 CPU s at 16 Ki / 64 Ki /
/// 256 Ki / 512 Ki / 1 Mi-request batches, against 11.7 s for a pass per run: 512 Ki is
/// where larger batches stop paying for their memory.
pub const ONE_PASS_BATCH: usize = 1 << 19;

/// How a sweep runs and what it reports while it runs.
#[derive(Clone, Copy, Default)]
pub struct SweepOptions<'a> {
    /// Every cell reads its own input (the path before one-pass sweeps; for comparison).
    pub per_cell: bool,
    /// Every cell runs its own engine, even the LRU cells that one stack-distance pass
    /// would give ([`crate::stack_sweep`]; for comparison).
    pub per_engine: bool,
    /// Called with why a group of LRU cells that could have shared a stack-distance pass
    /// runs its engines after all (a request the stack model does not derive).
    pub on_note: Option<&'a (dyn Fn(&str) + Sync)>,
    /// Called with the number of cells done, after each cell.
    pub on_cell: Option<&'a (dyn Fn(usize) + Sync)>,
    /// Called with the requests read so far by all passes (after every batch parsed: 16 Ki
    /// requests).
    pub on_requests: Option<&'a (dyn Fn(u64) + Sync)>,
    /// Bound on the estimated index RAM of the engines alive in one pass (`None`:
    /// [`ONE_PASS_INDEX_BUDGET`]). A group whose caches add up to more is split into several
    /// passes; a pass always may hold as many engines as there are worker threads, so no
    /// sweep holds fewer engines at once than the per-run path did.
    pub index_budget: Option<u64>,
}

/// Default bound on the estimated index RAM of one pass's engines (see
/// [`SweepOptions::index_budget`]): 4 GiB, a sixth of this project's 24 GiB machine.
pub const ONE_PASS_INDEX_BUDGET: u64 = 4 << 30;

/// Estimated RAM per cache line of an engine, for [`SweepOptions::index_budget`]: issue 16
/// measured 31.1 B per line for the engine's index and policy state; rounded up for the
/// policies with ghost lists.
const EST_BYTES_PER_LINE: u64 = 48;

/// Splits one group's cells (with each one's cache lines) into passes whose estimated index
/// RAM stays within `budget`, except that a pass may always hold `min_engines` engines.
/// Cells keep their order.
pub fn split_by_budget(cells: &[(usize, u64)], budget: u64, min_engines: usize) -> Vec<Vec<usize>> {
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0u64;
    for &(cell, lines) in cells {
        let est = lines.saturating_mul(EST_BYTES_PER_LINE);
        match passes.last_mut() {
            Some(p) if p.len() < min_engines.max(1) || bytes.saturating_add(est) <= budget => {
                p.push(cell);
                bytes = bytes.saturating_add(est);
            }
            _ => {
                passes.push(vec![cell]);
                bytes = est;
            }
        }
    }
    debug_assert_eq!(passes.iter().map(Vec::len).sum::<usize>(), cells.len());
    passes
}

/// Runs every spec, in parallel (rayon's pool: all cores), reading each input once for all
/// the cells that share it. Footprints are computed once per (input, line size).
/// `progress(cells_done)` runs after each cell. Results come back in the specs' order.
pub fn run_sweep(specs: Vec<SimSpec>, progress: &(dyn Fn(usize) + Sync)) -> Result<Vec<SweepCell>> {
    run_sweep_with(
        specs,
        SweepOptions {
            on_cell: Some(progress),
            ..Default::default()
        },
    )
}

/// What one rayon job of a sweep does.
enum Job {
    /// One cell, through [`simulate`].
    Single(usize),
    /// Cells fed from one pass over their common input.
    Group(Vec<usize>),
    /// LRU cells of one input that differ only in size: one stack-distance pass
    /// ([`crate::stack_sweep`]), or their engines when the input does not fit the model.
    Stack(Vec<usize>),
}

/// [`run_sweep`] with options.
pub fn run_sweep_with(specs: Vec<SimSpec>, opts: SweepOptions) -> Result<Vec<SweepCell>> {
    let footprints = footprints(&specs)?;
    let footprint_of = |s: &SimSpec| {
        footprints
            .iter()
            .find(|(i, ls, _)| *ls == s.engine.line_size && specs[*i].input.same_source(&s.input))
            .map(|(_, _, f)| *f)
    };
    let budget = opts.index_budget.unwrap_or(ONE_PASS_INDEX_BUDGET);
    let jobs = plan(&specs, opts.per_cell, opts.per_engine);
    let cells_done = AtomicUsize::new(0);
    let read = AtomicU64::new(0);
    let cell_done = || {
        let d = cells_done.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(p) = opts.on_cell {
            p(d);
        }
    };
    let add_read = |n: u64| {
        let r = read.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(p) = opts.on_requests {
            p(r);
        }
    };
    // A group's engines, in passes one after another: each already runs on every worker,
    // and only one pass's engines are alive at a time (the budget).
    let engines = |cells: &[usize]| -> Vec<(usize, Result<SimResult>)> {
        if let [one] = cells {
            let spec = &specs[*one];
            let each = |_| add_read(crate::PROGRESS_EVERY);
            let r = simulate(spec, footprint_of(spec), Some(&each));
            cell_done();
            return vec![(*one, r)];
        }
        let sized: Vec<(usize, u64)> = cells
            .iter()
            .map(|&c| {
                let s = &specs[c];
                let fp = footprint_of(s).unwrap_or(0);
                (c, s.cache_size.lines(s.engine.line_size, fp))
            })
            .collect();
        split_by_budget(&sized, budget, rayon::current_num_threads())
            .into_iter()
            .flat_map(|pass| run_group(&specs, &pass, &footprint_of, &add_read, &cell_done))
            .collect()
    };
    let mut results: Vec<(usize, Result<SimResult>)> = jobs
        .into_par_iter()
        .flat_map_iter(|job| match job {
            Job::Single(i) => engines(&[i]),
            Job::Group(cells) => engines(&cells),
            Job::Stack(cells) => {
                match crate::stack_sweep::run(&specs, &cells, &footprint_of, &add_read) {
                    Ok(mut out) => {
                        for (_, r) in &mut out {
                            if let Ok(r) = r {
                                r.method = Some(crate::stack_sweep::METHOD_STACK);
                            }
                            cell_done();
                        }
                        out
                    }
                    Err(unfit) => {
                        if let Some(note) = opts.on_note {
                            note(&format!(
                                "{}: {unfit}; its {} LRU sizes run an engine each",
                                specs[cells[0]].input,
                                cells.len()
                            ));
                        }
                        engines(&cells)
                    }
                }
            }
        })
        .collect();
    for (_, r) in results.iter_mut() {
        if let Ok(r) = r {
            r.method.get_or_insert(crate::stack_sweep::METHOD_ENGINES);
        }
    }
    results.sort_by_key(|(i, _)| *i);
    debug_assert!(results.iter().enumerate().all(|(k, (i, _))| k == *i));
    Ok(specs
        .into_iter()
        .zip(results)
        .map(|(spec, (_, result))| SweepCell { spec, result })
        .collect())
}

/// Footprints the specs' sizes need: (a spec with the input, line size, footprint), each
/// computed once, in parallel.
fn footprints(specs: &[SimSpec]) -> Result<Vec<(usize, u64, u64)>> {
    let mut keys: Vec<(usize, u64)> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        if s.cache_size.needs_footprint()
            && s.log.is_none()
            && !keys
                .iter()
                .any(|(j, ls)| *ls == s.engine.line_size && specs[*j].input.same_source(&s.input))
        {
            keys.push((i, s.engine.line_size));
        }
    }
    keys.par_iter()
        .map(|&(i, ls)| footprint_lines(&specs[i].input, ls).map(|f| (i, ls, f)))
        .collect()
}

/// Splits the cells into jobs: a stack-distance pass for two or more LRU cells of one input
/// that differ only in size ([`crate::stack_sweep::eligible`]; not with `per_engine`), a
/// group per input with two or more other cells that can share a pass, a single job for
/// every other cell.
fn plan(specs: &[SimSpec], per_cell: bool, per_engine: bool) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut stacked = vec![false; specs.len()];
    if !per_cell && !per_engine {
        let mut stacks: Vec<Vec<usize>> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            if !crate::stack_sweep::eligible(s) {
                continue;
            }
            let key = crate::stack_sweep::pass_key(&s.engine);
            match stacks.iter_mut().find(|g| {
                let f = &specs[g[0]];
                f.input.same_source(&s.input) && crate::stack_sweep::pass_key(&f.engine) == key
            }) {
                Some(g) => g.push(i),
                None => stacks.push(vec![i]),
            }
        }
        for g in stacks.into_iter().filter(|g| g.len() > 1) {
            for &i in &g {
                stacked[i] = true;
            }
            jobs.push(Job::Stack(g));
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        if stacked[i] {
            continue;
        }
        // A RAM tier runs above its own engine (`crate::simulate`), not in a shared pass.
        if per_cell || s.log.is_some() || oracle_policy(s) || s.engine.ram_cache > 0 {
            jobs.push(Job::Single(i));
            continue;
        }
        match groups
            .iter_mut()
            .find(|g| specs[g[0]].input.same_source(&s.input))
        {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    for g in groups {
        jobs.push(if g.len() == 1 {
            Job::Single(g[0])
        } else {
            Job::Group(g)
        });
    }
    jobs
}

/// Whether the spec's policy needs the next-use oracle (a whole-trace pre-load).
fn oracle_policy(s: &SimSpec) -> bool {
    tiercache_engine::policy::is_offline(&s.engine.policy)
}

/// One engine of a one-pass group.
struct Run {
    cell: usize,
    engine: Engine,
    footprint: Option<u64>,
    /// Requests done.
    n: u64,
    /// Why this engine stopped before the end of the input.
    failed: Option<anyhow::Error>,
}

/// Runs the cells of one group over a single pass of their input.
fn run_group(
    specs: &[SimSpec],
    cells: &[usize],
    footprint_of: &(dyn Fn(&SimSpec) -> Option<u64> + Sync),
    add_read: &(dyn Fn(u64) + Sync),
    cell_done: &(dyn Fn() + Sync),
) -> Vec<(usize, Result<SimResult>)> {
    let mut out = Vec::with_capacity(cells.len());
    let mut runs = Vec::with_capacity(cells.len());
    for &cell in cells {
        match prepare(&specs[cell], footprint_of(&specs[cell])) {
            // An engine that needs the oracle loads the whole input anyway: on its own.
            Ok((engine, footprint)) if engine.needs_oracle() => {
                out.push((cell, simulate(&specs[cell], footprint, None)));
                cell_done();
            }
            Ok((engine, footprint)) => runs.push(Run {
                cell,
                engine,
                footprint,
                n: 0,
                failed: None,
            }),
            Err(e) => {
                out.push((cell, Err(e)));
                cell_done();
            }
        }
    }
    if runs.is_empty() {
        return out;
    }
    let input = &specs[runs[0].cell].input;
    let (pass, wall, mut runs) = one_pass(input, runs, add_read);
    runs.sort_by_key(|r| r.cell);
    for r in runs {
        let spec = &specs[r.cell];
        let res = match (&pass, r.failed) {
            (_, Some(e)) => Err(e),
            // The input failed (a malformed record, an unreadable file): every cell still
            // running reports it, as its own pass would have.
            (Err(e), None) => Err(anyhow::anyhow!("{e:#}")),
            (Ok(skipped), None) => finish(spec, &r.engine, r.footprint, wall, r.n, skipped.clone()),
        };
        out.push((r.cell, res));
        cell_done();
    }
    out
}

/// Batches a worker of a one-pass group may have queued: a slow worker (descheduled on a
/// loaded machine) holds the reader back only after this many.
const QUEUE: usize = 2;

/// Reads `input` once and feeds every batch to every run. The runs are dealt to as many
/// worker threads as rayon has (`--jobs`), each taking its runs through the batches in
/// order; the reader hands each batch (one copy, shared) to every worker through a bounded
/// queue. There is no barrier per batch: on a shared machine a worker that loses its core
/// stalls the others only once the queue runs dry (a rayon join per batch did, and ran at
/// half speed under load). Returns what the pass skipped (or why it failed), its wall
/// time, and the runs.
fn one_pass(
    input: &crate::Input,
    runs: Vec<Run>,
    add_read: &(dyn Fn(u64) + Sync),
) -> (Result<Skipped>, f64, Vec<Run>) {
    let workers = rayon::current_num_threads().clamp(1, runs.len());
    let mut shares: Vec<Vec<Run>> = (0..workers).map(|_| Vec::new()).collect();
    for (k, r) in runs.into_iter().enumerate() {
        shares[k % workers].push(r);
    }
    let live = AtomicUsize::new(shares.iter().map(Vec::len).sum());
    let start = Instant::now();
    let (pass, runs) = std::thread::scope(|s| {
        let mut queues = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for mut share in shares {
            let (tx, rx) = mpsc::sync_channel::<Arc<Vec<Request>>>(QUEUE);
            queues.push(tx);
            let live = &live;
            handles.push(s.spawn(move || {
                for batch in rx {
                    for r in share.iter_mut().filter(|r| r.failed.is_none()) {
                        if let Err(e) = feed(&mut r.engine, input, &mut r.n, &batch, None) {
                            r.failed = Some(e);
                            live.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                }
                share
            }));
        }
        let batch_len = ONE_PASS_BATCH;
        // The reader's own batches are small (its pipeline stays small); they are gathered
        // into one large shared batch per send.
        let mut pending: Vec<Request> = Vec::with_capacity(batch_len);
        let send = |pending: &mut Vec<Request>| -> Result<()> {
            let batch = Arc::new(std::mem::replace(pending, Vec::with_capacity(batch_len)));
            for q in &queues {
                if q.send(Arc::clone(&batch)).is_err() {
                    // The worker is gone: it panicked, and the join below says so.
                    return Err(AllFailed.into());
                }
            }
            Ok(())
        };
        let pass = input
            .for_each_batch_counted(|batch| {
                if live.load(Ordering::Relaxed) == 0 {
                    // Nobody is listening any more: stop reading.
                    return Err(AllFailed.into());
                }
                pending.extend_from_slice(batch);
                if pending.len() >= batch_len {
                    send(&mut pending)?;
                }
                add_read(batch.len() as u64);
                Ok(())
            })
            .and_then(|skipped| {
                if !pending.is_empty() {
                    send(&mut pending)?;
                }
                Ok(skipped)
            });
        drop(queues);
        let runs: Vec<Run> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("sweep worker thread panicked"))
            .collect();
        (pass, runs)
    });
    let wall = start.elapsed().as_secs_f64();
    let pass = match pass {
        Err(e) if e.is::<AllFailed>() => Ok(Skipped::default()),
        p => p,
    };
    (pass, wall, runs)
}

/// Every engine of a group failed: the pass stops early.
#[derive(Debug)]
struct AllFailed;

impl std::fmt::Display for AllFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("every run of the pass failed")
    }
}

impl std::error::Error for AllFailed {}
