//! `tiercache sim --shards N`: the direct layout run through a sharded engine
//! ([`tiercache_engine::Sharded`]), sequentially, so its counters are deterministic and
//! comparable with one engine's (issue 16: hit ratios at N shards within 0.5 % of one).

use crate::result::ShardFigures;
use crate::{feed, finish, sized_config, Progress, SimResult, SimSpec};
use anyhow::Result;
use std::time::Instant;
use tiercache_engine::{Request, Sharded};

/// Refuses a run with more than one shard where sharding is not implemented (`what` names
/// the mode), rather than running one engine under a shard count that says otherwise.
pub fn ensure_one_shard(spec: &SimSpec, what: &str) -> Result<()> {
    let n = spec.engine.shards;
    anyhow::ensure!(
        n <= 1,
        "--shards {n}: {what} runs one engine; sharding runs in untimed direct-layout \
         simulations (`tiercache sim` without --hdd/--ssd, --layout log or --ram-cache); \
         use --shards 1 here"
    );
    Ok(())
}

/// One untimed direct-layout run through `spec.engine.shards` shards ([`crate::simulate`]
/// calls it for more than one; with one it runs the sharded type over a single engine, which
/// must count exactly as [`crate::simulate`] does: `tests/shards.rs`). The request loop is
/// [`crate::feed`], the one every untimed direct-layout run uses. A small cache runs fewer
/// shards than asked (`Sharded::layout_of`; `sharding.requested_shards` in the result).
pub fn simulate_sharded(
    spec: &SimSpec,
    footprint: Option<u64>,
    progress: Option<Progress>,
) -> Result<SimResult> {
    let n = spec.engine.shards;
    anyhow::ensure!(
        spec.engine.ram_cache == 0,
        "--shards {n} with --ram-cache: the RAM tier runs above one engine in the simulator; \
         drop one of them"
    );
    let (cfg, footprint) = sized_config(spec, footprint)?;
    let mut engine = Sharded::new(cfg).map_err(|e| anyhow::anyhow!("--shards {n}: {e}"))?;
    engine.set_record_plan(false);
    if engine.needs_oracle() {
        let reqs: Vec<Request> = spec.input.open()?.collect::<Result<_>>()?;
        engine.set_oracle_for(&reqs);
    }
    let start = Instant::now();
    let mut done: u64 = 0;
    let skipped = spec.input.for_each_batch_counted(|batch| {
        feed(&mut engine, &spec.input, &mut done, batch, progress)
    })?;
    let wall = start.elapsed().as_secs_f64();
    let mut res = finish(spec, &engine, footprint, wall, done, skipped)?;
    res.sharding = Some(ShardFigures::of(&engine));
    Ok(res)
}
