//! `tiercache`: the command-line front of the engine, simulator and trace tools.

mod demo;
mod mrc_cmd;
mod progress;
mod sim_cmd;
mod trace_cmd;
mod warmup_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

const ABOUT: &str = "tiercache: an SSD cache in front of HDD storage, and the workbench that measures what it is worth.";

const LONG_ABOUT: &str = "\
tiercache: an SSD cache in front of HDD storage, and the workbench that measures what it is worth.

Start here:
  tiercache demo                          compare policies on a built-in workload
  tiercache trace stats TRACE             what is in a block trace
  tiercache sim --trace TRACE --cache-size 10% --policy s3fifo
  tiercache sweep --trace TRACE --sizes 1%,5%,10% --policies lru,arc,s3fifo --out r.csv
  tiercache policies                      the replacement policies

Sizes are written 4096, 4k, 64KiB, 1.5GiB; cache sizes may be a share of the trace footprint
(distinct lines touched), e.g. 10%.";

#[derive(Parser)]
#[command(name = "tiercache", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a built-in workload through no cache and several policies, and compare them.
    Demo(demo::DemoArgs),
    /// Simulate one cache configuration on a trace or a synthetic workload.
    Sim(sim_cmd::SimArgs),
    /// Simulate a grid of cache sizes x policies x modes on all cores; write CSV.
    Sweep(sim_cmd::SweepArgs),
    /// Inspect, convert and generate block traces.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCmd),
    /// LRU miss-ratio curve of a trace for every cache size in one pass (exact or SHARDS).
    Mrc(mrc_cmd::MrcArgs),
    /// Qsan's warm-up time estimate T = C x P / (I x S x D), optionally next to a simulation.
    Warmup(warmup_cmd::WarmupArgs),
    /// List the replacement policies.
    Policies,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Sim(a) => sim_cmd::sim(a),
        Cmd::Sweep(a) => sim_cmd::sweep(a),
        Cmd::Trace(t) => trace_cmd::run(t),
        Cmd::Warmup(a) => warmup_cmd::run(a),
        Cmd::Mrc(a) => mrc_cmd::run(a),
        Cmd::Policies => {
            for p in tiercache_engine::policy::REGISTRY {
                println!("{:<8} {}", p.name, p.summary);
            }
            Ok(())
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
