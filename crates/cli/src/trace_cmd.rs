//! `tiercache trace ...`: statistics, formats, conversion, generation.

use crate::progress::Progress;
use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use tiercache_engine::parse_size;
use tiercache_trace::{Format, ReadOptions};

#[derive(Subcommand, Debug)]
pub enum TraceCmd {
    /// Requests, read share, footprint, size histogram and sequentiality of a trace.
    Stats {
        /// The trace file.
        file: PathBuf,
        /// Trace format, or `auto`.
        #[arg(long, default_value = "auto")]
        format: String,
        /// Skip (and count) malformed lines.
        #[arg(long)]
        skip_bad: bool,
        /// Block size for formats that count blocks.
        #[arg(long, value_name = "SIZE")]
        block_size: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// No progress bar.
        #[arg(long, short = 'q')]
        quiet: bool,
    },
    /// List the trace formats tiercache reads.
    Formats,
    /// Convert a trace to another format (compressed by the output's extension).
    Convert {
        input: PathBuf,
        output: PathBuf,
        /// Input format, or `auto`.
        #[arg(long, default_value = "auto")]
        from: String,
        /// Output format.
        #[arg(long, default_value = "simple")]
        to: String,
        #[arg(long)]
        skip_bad: bool,
    },
    /// Write a synthetic workload as a trace file.
    #[command(after_help = tiercache_trace::workload::help())]
    Gen {
        /// Workload spec, e.g. `zipf:theta=1.0,wss=4GiB,requests=1e7`.
        spec: String,
        /// Output file (compressed by extension: .gz, .zst, .xz, .bz2).
        #[arg(long, short = 'o')]
        out: PathBuf,
        /// Output format.
        #[arg(long, default_value = "simple")]
        to: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn format_arg(s: &str) -> Result<Option<Format>> {
    if s == "auto" {
        Ok(None)
    } else {
        Ok(Some(
            s.parse::<Format>().map_err(|e| anyhow::anyhow!("{e}"))?,
        ))
    }
}

pub fn run(cmd: TraceCmd) -> Result<()> {
    match cmd {
        TraceCmd::Stats {
            file,
            format,
            skip_bad,
            block_size,
            json,
            quiet,
        } => {
            let mut opts = ReadOptions {
                skip_bad,
                ..Default::default()
            };
            if let Some(b) = block_size {
                opts.block_size = Some(parse_size(&b)?);
            }
            let fmt = format_arg(&format)?;
            let progress = Progress::new(quiet, None, "requests");
            let stats =
                tiercache_trace::stats::stats_file(&file, fmt, &opts, &|n| progress.set(n))?;
            progress.finish();
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                println!("{stats}");
            }
        }
        TraceCmd::Formats => {
            for f in Format::ALL {
                println!("{:<16} {}", f.name(), f.description());
            }
        }
        TraceCmd::Convert {
            input,
            output,
            from,
            to,
            skip_bad,
        } => {
            let opts = ReadOptions {
                skip_bad,
                ..Default::default()
            };
            let reader = tiercache_trace::open(&input, format_arg(&from)?, &opts)?;
            let to: Format = to.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
            write_trace(&output, to, reader.map(|r| r.map_err(anyhow::Error::from)))?;
        }
        TraceCmd::Gen {
            spec,
            out,
            to,
            seed,
        } => {
            let spec: tiercache_trace::workload::WorkloadSpec =
                spec.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
            let to: Format = to.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
            write_trace(&out, to, spec.generate(seed).map(Ok))?;
        }
    }
    Ok(())
}

/// Writes requests to a trace file and says how many were written and dropped (requests
/// the format cannot express, such as a trim in a read/write-only format).
fn write_trace(
    path: &std::path::Path,
    to: Format,
    reqs: impl Iterator<Item = Result<tiercache_engine::Request>>,
) -> Result<()> {
    let mut w = tiercache_trace::open_writer(path, to)
        .with_context(|| format!("creating {}", path.display()))?;
    for r in reqs {
        w.write(&r?)?;
    }
    let (written, dropped, as_reads) = (w.written(), w.dropped(), w.writes_as_reads());
    w.finish()?;
    eprintln!(
        "{written} requests written to {} ({})",
        path.display(),
        to.name()
    );
    if dropped > 0 {
        eprintln!(
            "{dropped} requests dropped: {} cannot express them",
            to.name()
        );
    }
    if as_reads > 0 {
        eprintln!(
            "warning: {as_reads} writes will read back as reads: {} records have no read/write \
             field (keep them with --to simple, or lcs-csv for libCacheSim)",
            to.name()
        );
    }
    Ok(())
}
