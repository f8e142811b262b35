//! `tiercache mrc`: the LRU miss-ratio curve of a trace for every cache size, in one pass.

use crate::progress::Progress;
use crate::sim_cmd::InputArgs;
use anyhow::Result;
use clap::Args;
use tiercache_engine::{fmt_size, parse_size};
use tiercache_sim::experiment::InputSection;

#[derive(Args, Debug)]
#[command(
    after_help = "Exact curves use stack distances (one pass, every size at once); --sample-rate below 1
uses SHARDS spatial sampling for traces too large to process whole. Example:
  tiercache mrc --trace cloudPhysicsIO.csv --points 20"
)]
pub struct MrcArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Cache line size (each request is split into the lines it touches).
    #[arg(long, default_value = "4k", value_name = "SIZE")]
    pub line_size: String,
    /// SHARDS sampling rate in (0, 1]; 1 = exact.
    #[arg(long, default_value_t = 1.0, value_name = "RATE")]
    pub sample_rate: f64,
    /// Points on the curve, evenly spaced up to the footprint.
    #[arg(long, default_value_t = 20)]
    pub points: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress bar (notes, such as skipped records, still go to standard error).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(mut a: MrcArgs) -> Result<()> {
    a.input.take_positional();
    let section = InputSection {
        trace: a.input.trace.clone(),
        format: a.input.format.clone(),
        skip_bad: a.input.skip_bad,
        block_size: a.input.block_size.clone(),
        workload: a.input.workload.clone(),
        seed: a.input.seed.unwrap_or(0),
    };
    let input = section.to_input()?;
    let ls = parse_size(&a.line_size)?;
    let progress = Progress::new(a.quiet, None, "requests");
    let m = tiercache_sim::mrc::mrc(&input, ls, a.sample_rate)?;
    progress.finish();
    let points = m.points(&m.default_sizes(a.points));
    if m.skipped.records > 0 {
        eprintln!(
            "note: {} malformed records skipped (--skip-bad); the first: {}",
            m.skipped.records,
            m.skipped.first.as_deref().unwrap_or("-")
        );
    }
    if a.json {
        let v = serde_json::json!({
            "input": input.label(),
            "line_size": ls,
            "sample_rate": m.rate,
            "accesses": m.accesses,
            "footprint_lines": m.footprint,
            "skipped_records": m.skipped.records,
            "points": points,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "LRU miss-ratio curve of {} ({} line accesses, footprint {} lines of {}{})",
        input.label(),
        m.accesses,
        m.footprint,
        fmt_size(ls),
        if m.rate < 1.0 {
            format!(", SHARDS rate {}", m.rate)
        } else {
            String::new()
        }
    );
    println!(
        "{:>12} {:>12} {:>11}",
        "cache lines", "cache size", "miss ratio"
    );
    for p in points {
        println!(
            "{:>12} {:>12} {:>11.4}",
            p.cache_lines,
            fmt_size(p.cache_lines * ls),
            p.miss_ratio
        );
    }
    Ok(())
}
