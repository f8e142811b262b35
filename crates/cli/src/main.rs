//! `tiercache`: the command-line front of the engine, simulator and trace tools.

mod check_cmd;
mod ctl_stats;
mod demo;
mod dss_cmd;
mod ext4_cmd;
mod layout_args;
mod log_serve;
mod mrc_cmd;
mod nbd_cmd;
mod nitro_cmd;
mod progress;
mod report_cmd;
mod reproduce_cmd;
mod serve_classes;
mod serve_cmd;
mod sim_cmd;
mod trace_cmd;
mod volume_admin;
mod warmup_cmd;

use clap::{Parser, Subcommand};
use std::io::IsTerminal;
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
  tiercache serve --cache ssd.img --backing disk.img --socket /tmp/tc.sock --format-if-needed --cache-size 1G
                                          a live cached volume over NBD
  tiercache ext4-classify IMAGE           blocks per file-system class of an ext4 image

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
    /// The DSS seed's Tables 3 and 4: file-server phases on 7200/15K RPM, no cache vs LRU vs DSS.
    DssTable(dss_cmd::DssArgs),
    /// Blocks per DSS file-system class of an ext4 image, as the ext4-aware classifier sees them.
    #[command(name = "ext4-classify")]
    Ext4Classify(ext4_cmd::Ext4Args),
    /// One self-contained HTML page (inline SVG plots) from sweep CSV and run JSON results.
    Report(report_cmd::ReportArgs),
    /// Re-run a seed document's experiment; our figures beside the published ones, a verdict.
    Reproduce(reproduce_cmd::ReproduceArgs),
    /// Nitro's data-reduction table: extent vs WEU caching, with and without dedup and
    /// compression, with flash wear from an FTL model.
    NitroTable(nitro_cmd::NitroArgs),
    /// List the replacement policies.
    Policies,
    /// Issue a trace or workload against an NBD server at a queue depth; report IOPS and latency.
    Replay(nbd_cmd::ReplayArgs),
    /// Export a plain file over NBD, no cache (the transport baseline for benchmarks).
    #[command(hide = true)]
    ServeFile(nbd_cmd::ServeFileArgs),
    /// Prepare a cache device (superblock and empty metadata) for `serve`.
    Format(serve_cmd::FormatArgs),
    /// Export a backing device cached on a cache device over NBD.
    Serve(Box<serve_cmd::ServeArgs>),
    /// Talk to a running `serve` over its control socket: stats, settings (get/set), flush,
    /// mode, detach.
    Ctl(serve_cmd::CtlArgs),
    /// Verify a cache device offline: superblock, metadata checksums, mapping (exit 0/1/2);
    /// `--repair` drops damaged metadata, salvages what verifies and lists what is lost.
    Check(check_cmd::CheckArgs),
}

/// Whether standard output is a pipe (or socket) whose reader has gone, as after
/// `tiercache ... | head -1`: poll reports POLLERR on such a write end.
fn stdout_reader_gone() -> bool {
    let mut p = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLERR != 0
}

/// Ends the process as `cat` or `yes` do when their reader goes away: killed by SIGPIPE
/// (the shell's status 141), without a message. Rust ignores SIGPIPE so that a socket whose
/// peer left is an error rather than death; `serve`, `ctl` and `replay` keep that. So every
/// command keeps it, and only a write to standard output after its reader left ends here
/// (from the panic hook, or from the error path in `main`).
fn exit_like_a_pipe_reader_left() -> ! {
    // SAFETY: resetting a signal disposition and raising it in this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(|io| io.kind())
            == Some(std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// `replay -q N` meant `--queue-depth N` before `-q` meant `--quiet` in every command: the old
/// spelling keeps working, with a note.
fn deprecated_replay_q(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if args.get(1).is_some_and(|a| a == "replay") {
        for i in 2..args.len().saturating_sub(1) {
            let number = args[i + 1]
                .to_str()
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
            if args[i] == "-q" && number {
                eprintln!(
                    "note: `replay -q N` for the queue depth is deprecated: write --queue-depth N \
                     (or --iodepth N, as fio does); -q means --quiet in every command"
                );
                args[i] = "--queue-depth".into();
            }
        }
    }
    args
}

fn main() -> ExitCode {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // `println!` to a pipe whose reader left panics ("failed printing to stdout").
        if stdout_reader_gone() {
            exit_like_a_pipe_reader_left();
        }
        default_hook(info)
    }));
    let cli = Cli::parse_from(deprecated_replay_q(std::env::args_os().collect()));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Settings changed live are logged at info (old -> new) by default.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(format!(
                        "warn,{}=info",
                        tiercache_server::tuning::LOG_TARGET
                    ))
                }),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a log file or journald gets plain
        // text (NO_COLOR, https://no-color.org, turns them off at a terminal too).
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    let res = match cli.cmd {
        Cmd::Check(a) => return check_cmd::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Sim(a) => sim_cmd::sim(a),
        Cmd::Sweep(a) => sim_cmd::sweep(a),
        Cmd::Trace(t) => trace_cmd::run(t),
        Cmd::Warmup(a) => warmup_cmd::run(a),
        Cmd::Mrc(a) => mrc_cmd::run(a),
        Cmd::Replay(a) => nbd_cmd::replay(a),
        Cmd::ServeFile(a) => nbd_cmd::serve_file(a),
        Cmd::Format(a) => serve_cmd::format(a),
        Cmd::Serve(a) => serve_cmd::serve(*a),
        Cmd::Ctl(a) => serve_cmd::ctl(a),
        Cmd::DssTable(a) => dss_cmd::run(a),
        Cmd::Ext4Classify(a) => ext4_cmd::run(a),
        Cmd::Report(a) => report_cmd::run(a),
        Cmd::Reproduce(a) => reproduce_cmd::run(a),
        Cmd::NitroTable(a) => nitro_cmd::run(a),
        Cmd::Policies => {
            for p in tiercache_engine::policy::REGISTRY {
                println!("{:<8} {}", p.name, p.summary);
            }
            Ok(())
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) && stdout_reader_gone() => exit_like_a_pipe_reader_left(),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
