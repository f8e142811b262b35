//! Sweeps: many simulations of one input, on all cores.

use crate::{footprint_lines, simulate, SimResult, SimSpec};
use anyhow::Result;
use rayon::prelude::*;
use std::collections::HashMap;

/// One cell of a sweep and its result.
#[derive(Debug)]
pub struct SweepCell {
    pub spec: SimSpec,
    pub result: Result<SimResult>,
}

/// Runs every spec in parallel (rayon's pool: all cores). Footprints are computed once per
/// (input, line size). `progress(cells_done)` runs after each cell.
pub fn run_sweep(specs: Vec<SimSpec>, progress: &(dyn Fn(usize) + Sync)) -> Result<Vec<SweepCell>> {
    let mut keys: Vec<(String, u64)> = Vec::new();
    for s in &specs {
        if s.cache_size.needs_footprint() {
            let k = (s.input.to_string(), s.engine.line_size);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let footprints: HashMap<(String, u64), u64> = keys
        .par_iter()
        .map(|k| {
            let spec = specs
                .iter()
                .find(|s| s.input.to_string() == k.0 && s.engine.line_size == k.1)
                .expect("key comes from a spec");
            footprint_lines(&spec.input, k.1).map(|f| (k.clone(), f))
        })
        .collect::<Result<_>>()?;
    let done = std::sync::atomic::AtomicUsize::new(0);
    Ok(specs
        .into_par_iter()
        .map(|spec| {
            let fp = footprints
                .get(&(spec.input.to_string(), spec.engine.line_size))
                .copied();
            let result = simulate(&spec, fp, None);
            progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
            SweepCell { spec, result }
        })
        .collect())
}
