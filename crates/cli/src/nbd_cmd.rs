//! `tiercache replay`: a trace or workload against any NBD server; `tiercache serve-file`: a
//! plain file over NBD (the transport baseline for benchmarks).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_engine::{Op, Request};
use tiercache_nbd::{Client, Export, FileExport, ReplayOp, ReplayOpKind, ReplayReport, Server};
use tiercache_sim::experiment::InputSection;
use tiercache_trace::content::{ContentModel, ContentTracker};

const REPLAY_EXAMPLES: &str = "\
Examples:
  tiercache replay --nbd 'nbd+unix:///?socket=/run/tiercache.sock' cloudPhysicsIO.csv
  tiercache replay --nbd nbd://localhost:10809/disk trace.csv.zst --queue-depth 32 --json
  tiercache replay --nbd 'nbd+unix:///?socket=s.sock' --workload '4k; 100% read; 100% random' --iodepth 16
  tiercache replay --nbd 'nbd+unix:///?socket=pool.sock' --volume db=db.csv --volume vdi=vdi.csv.gz

Several volumes of one `tiercache serve --volume NAME=BACKING ...` pool are replayed with
--volume NAME=TRACE per export: at --queue-depth 1 the pool's counters (`ctl stats --json`)
equal `tiercache sim --volume NAME=TRACE ...`'s with the same settings.

The same trace can be run against tiercache, plain nbdkit and nbdkit's cache filter:
  nbdkit -U /tmp/k.sock file disk.img
  tiercache replay --nbd 'nbd+unix:///?socket=/tmp/k.sock' TRACE

Offsets past the end of the export are wrapped modulo its size (counted and reported);
--strict refuses them instead. Writes carry a fixed deterministic byte pattern, or with
--content the content `tiercache sim --layout log` assumes (duplicates and compressibility
of its content model; lines the trace reads before writing hold version 0 of that content
in the simulation, so fill the backing device with it for a byte-exact comparison):
  tiercache replay --nbd URI --workload SPEC --seed 7 --content --line-size 4k --queue-depth 1
  tiercache sim --layout log --line-size 4k --content-lengths measured --workload SPEC --seed 7";

#[derive(Args, Debug)]
#[command(after_help = REPLAY_EXAMPLES)]
pub struct ReplayArgs {
    /// NBD export: nbd+unix:///NAME?socket=PATH or nbd://HOST[:PORT]/NAME.
    #[arg(long, value_name = "URI")]
    pub nbd: String,
    /// Block trace to replay (compressed .gz/.zst/.xz/.bz2 is read transparently).
    #[arg(value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// A volume of a cache pool, NAME=TRACE (repeat it): the traces are merged by arrival
    /// time exactly as `sim --volume` merges them, and each request goes to export NAME of
    /// the server --nbd names (one connection per volume; --queue-depth counts requests in
    /// flight over all of them, so at depth 1 the server sees the simulator's order).
    /// Instead of TRACE / --workload.
    #[arg(long = "volume", value_name = "NAME=TRACE", conflicts_with_all = ["trace", "workload"])]
    pub volumes: Vec<String>,
    /// Trace format, or `auto` to detect it. See `tiercache trace formats`.
    #[arg(long, value_name = "NAME|auto", default_value = "auto")]
    pub format: String,
    /// Skip malformed trace lines instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// Block size for formats that count blocks (ARC .lis, oracleGeneral ids).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Synthetic workload instead of a trace. See `tiercache trace gen --help`.
    #[arg(long, short = 'w', value_name = "SPEC")]
    pub workload: Option<String>,
    /// Seed for synthetic workloads.
    #[arg(long, value_name = "N", default_value_t = 42)]
    pub seed: u64,
    /// Requests kept in flight on the one connection (fio's --iodepth). `-q N` is an old
    /// spelling, still accepted with a note: -q means --quiet in every command.
    #[arg(
        long,
        visible_alias = "iodepth",
        value_name = "N",
        default_value_t = 16
    )]
    pub queue_depth: usize,
    /// No notes on standard error (wrapped offsets); errors are still reported.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Stop after this many trace requests.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Refuse requests beyond the export size instead of wrapping them.
    #[arg(long)]
    pub strict: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the content model's bytes (what `tiercache sim --layout log` simulates, seeded
    /// by --seed): each written line gets new content, a share of it (--dup-share) from a
    /// pool of 4096 duplicates, compressible ~2:1 (random bytes then zeros). Line-aligned
    /// writes give exactly the simulated content.
    #[arg(long, help_heading = "Content")]
    pub content: bool,
    /// With --content: the cache line the content is generated for.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "8KiB",
        help_heading = "Content"
    )]
    pub line_size: String,
    /// With --content: share of duplicate line contents (as `sim --dup-share`).
    #[arg(
        long,
        value_name = "SHARE",
        default_value_t = 0.3,
        help_heading = "Content"
    )]
    pub dup_share: f64,
}

pub fn replay(a: ReplayArgs) -> Result<()> {
    if a.queue_depth == 0 {
        bail!("--queue-depth must be at least 1");
    }
    let section = InputSection {
        trace: a.trace.clone(),
        format: Some(a.format.clone()),
        skip_bad: a.skip_bad,
        block_size: a.block_size.clone(),
        workload: a.workload.clone(),
        seed: a.seed,
    };
    // One export (the URI's), or one per --volume, named as the volumes.
    let (input, names) = if a.volumes.is_empty() {
        (section.to_input()?, Vec::new())
    } else {
        if a.content {
            bail!("--content writes one export's content model: give it without --volume");
        }
        let mut vols = Vec::new();
        for v in &a.volumes {
            let (name, path) = v
                .split_once('=')
                .filter(|(n, p)| !n.trim().is_empty() && !p.is_empty())
                .with_context(|| {
                    format!("--volume {v}: give NAME=TRACE, e.g. --volume db=db.csv")
                })?;
            let mut sec = section.clone();
            sec.trace = Some(PathBuf::from(path));
            vols.push(tiercache_sim::VolumeInput {
                name: name.trim().to_string(),
                input: sec.to_input()?,
            });
        }
        let (input, table) = tiercache_sim::merge_volumes(&vols)?;
        (input, table.into_iter().map(|v| v.name).collect())
    };
    let mut clients = Vec::new();
    if names.is_empty() {
        clients.push(Client::connect(&a.nbd).with_context(|| format!("connecting to {}", a.nbd))?);
    } else {
        for n in &names {
            clients.push(Client::connect_export(&a.nbd, n).with_context(|| {
                format!("--volume {n}: connecting to export '{n}' of {}", a.nbd)
            })?);
        }
    }
    let sizes: Vec<u64> = clients.iter().map(Client::size).collect();
    for (i, &size) in sizes.iter().enumerate() {
        if size == 0 {
            match names.get(i) {
                Some(n) => bail!("export '{n}' of {} is empty", a.nbd),
                None => bail!("export {} is empty", a.nbd),
            }
        }
    }
    let requests = input.open()?;
    let error: RefCell<Option<anyhow::Error>> = RefCell::new(None);
    let wrapped = std::cell::Cell::new(0u64);
    let limit = a.limit.unwrap_or(u64::MAX);
    let ops = requests
        .take(limit.min(usize::MAX as u64) as usize)
        .enumerate()
        .map_while(|(i, r)| {
            let r: Request = match r {
                Ok(r) => r,
                Err(e) => {
                    *error.borrow_mut() = Some(e);
                    return None;
                }
            };
            // A trace's own volume column is ignored for one export (as before).
            let v = if names.is_empty() {
                0
            } else {
                r.volume as usize
            };
            let size = sizes[v];
            let kind = match r.op {
                Op::Read => ReplayOpKind::Read,
                Op::Write => ReplayOpKind::Write,
                Op::Trim => ReplayOpKind::Trim,
                Op::Flush => ReplayOpKind::Flush,
            };
            let mut offset = r.offset;
            let len = r.len.min(size);
            if r.op != Op::Flush && r.offset.saturating_add(r.len) > size {
                if a.strict {
                    let of = names
                        .get(v)
                        .map_or(String::new(), |n| format!(" of volume {n}"));
                    *error.borrow_mut() = Some(anyhow::anyhow!(
                        "request {} ({} at offset {} length {}{of}) is beyond the export size \
                         {size} (drop --strict to wrap such offsets modulo the size)",
                        i + 1,
                        r.op.as_str(),
                        r.offset,
                        r.len
                    ));
                    return None;
                }
                wrapped.set(wrapped.get() + 1);
                offset = (r.offset % size).min(size - len);
            }
            Some((
                v,
                ReplayOp {
                    kind,
                    offset,
                    len,
                    fua: r.fua,
                },
            ))
        });
    let report = if a.content {
        let line = tiercache_engine::parse_size(&a.line_size).context("--line-size")?;
        if !line.is_power_of_two() || line < 512 {
            bail!(
                "--line-size {}: a power of two of at least 512 bytes",
                a.line_size
            );
        }
        if !(0.0..=1.0).contains(&a.dup_share) {
            bail!("--dup-share {}: a share, 0 to 1", a.dup_share);
        }
        let mut model = ContentModel::new(line, a.seed);
        model.dup_share = a.dup_share;
        let mut tracker = ContentTracker::new(model);
        let (mut contents, mut bytes) = (Vec::new(), vec![0u8; line as usize]);
        tiercache_nbd::replay_with(
            &mut clients[0],
            ops.map(|(_, op)| op),
            a.queue_depth,
            |op, out| {
                contents.clear();
                tracker.annotate(&Request::write(op.offset, op.len), &mut contents);
                let first = op.offset / line * line;
                for (i, c) in contents.iter().enumerate() {
                    model.fill(c.fp, &mut bytes);
                    // The part of line i the write covers.
                    let l0 = first + i as u64 * line;
                    let (s, e) = (op.offset.max(l0), (op.offset + op.len).min(l0 + line));
                    out[(s - op.offset) as usize..(e - op.offset) as usize]
                        .copy_from_slice(&bytes[(s - l0) as usize..(e - l0) as usize]);
                }
            },
        )
    } else if names.is_empty() {
        tiercache_nbd::replay(&mut clients[0], ops.map(|(_, op)| op), a.queue_depth)
    } else {
        let mut pattern: Vec<u8> = Vec::new();
        tiercache_nbd::replay_volumes(&mut clients, ops, a.queue_depth, |op, out| {
            if pattern.len() < out.len() {
                pattern = (0..op.len).map(tiercache_nbd::pattern_byte).collect();
            }
            out.copy_from_slice(&pattern[..out.len()]);
        })
    };
    if let Some(e) = error.into_inner() {
        return Err(e);
    }
    let report = report.with_context(|| format!("replaying against {}", a.nbd))?;
    for c in clients {
        c.disconnect().ok();
    }
    if wrapped.get() > 0 && !a.quiet {
        eprintln!(
            "note: {} requests reached beyond the export size ({}) and were wrapped \
             modulo the size (--strict refuses them)",
            wrapped.get(),
            sizes_text(&names, &sizes)
        );
    }
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        // `ops` keyed by op (`.ops.read.iops`), as fio's per-direction sections are.
        let ops: serde_json::Map<String, serde_json::Value> = report
            .ops
            .iter()
            .map(|(k, s)| Ok((op_name(*k).to_string(), serde_json::to_value(s)?)))
            .collect::<Result<_>>()?;
        v["ops"] = ops.into();
        v["wrapped"] = wrapped.get().into();
        if names.is_empty() {
            v["export_size"] = sizes[0].into();
        } else {
            // Per volume: its name, export size and all its operations' figures.
            let vols = names
                .iter()
                .zip(&sizes)
                .zip(&report.volumes)
                .map(|((n, size), s)| {
                    let mut o = serde_json::to_value(s)?;
                    o["name"] = n.as_str().into();
                    o["export_size"] = (*size).into();
                    Ok(o)
                })
                .collect::<Result<Vec<_>>>()?;
            v["volumes"] = vols.into();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(&report, &a.nbd, &sizes_text(&names, &sizes));
        if !names.is_empty() {
            println!("per volume:");
            for (n, s) in names.iter().zip(&report.volumes) {
                print_row(n, s);
            }
        }
    }
    Ok(())
}

/// "N bytes" for one export, "a N bytes, b M bytes" for volumes.
fn sizes_text(names: &[String], sizes: &[u64]) -> String {
    if names.is_empty() {
        return format!("{} bytes", sizes[0]);
    }
    names
        .iter()
        .zip(sizes)
        .map(|(n, s)| format!("{n} {s} bytes"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn op_name(k: ReplayOpKind) -> &'static str {
    match k {
        ReplayOpKind::Read => "read",
        ReplayOpKind::Write => "write",
        ReplayOpKind::Trim => "trim",
        ReplayOpKind::Flush => "flush",
    }
}

fn print_report(r: &ReplayReport, uri: &str, sizes: &str) {
    println!(
        "replay against {uri} (export {sizes}), queue depth {}",
        r.queue_depth
    );
    println!(
        "{} requests in {:.3} s: {:.0} IOPS, {:.1} MB/s, {} errors",
        r.requests, r.elapsed_s, r.iops, r.mb_per_s, r.errors
    );
    if r.split > 0 || r.skipped > 0 {
        println!(
            "{} requests split at the server's maximum block size, {} skipped (zero length or unsupported trim)",
            r.split, r.skipped
        );
    }
    if let Some(e) = &r.first_error {
        println!("first error: {e}");
    }
    println!(
        "{:<6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "op",
        "requests",
        "IOPS",
        "MB/s",
        "mean us",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us"
    );
    let rows = r
        .ops
        .iter()
        .map(|(k, s)| (k.as_str(), s))
        .chain(std::iter::once(("all", &r.all)));
    for (name, s) in rows {
        print_row(name, s);
    }
}

fn print_row(name: &str, s: &tiercache_nbd::OpStats) {
    println!(
        "{:<6} {:>10} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        name,
        s.requests,
        s.iops,
        s.mb_per_s,
        s.latency_mean_us,
        s.latency_p50_us,
        s.latency_p90_us,
        s.latency_p99_us,
        s.latency_p999_us,
        s.latency_max_us
    );
}

/// Serve a plain file or block device over NBD (no cache): the transport baseline.
#[derive(Args, Debug)]
pub struct ServeFileArgs {
    /// File or block device to export.
    #[arg(long, value_name = "PATH")]
    pub file: PathBuf,
    /// Unix socket to listen on.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Serve on TCP: PORT alone binds loopback (127.0.0.1:PORT); ADDR:PORT binds ADDR
    /// (0.0.0.0:10809 for every interface). Same rule as `serve --listen`.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = crate::serve_cmd::listen_addr)]
    pub listen: Option<SocketAddr>,
    /// Export name (the empty name also selects it).
    #[arg(long, default_value = "")]
    pub name: String,
    #[arg(long)]
    pub read_only: bool,
    /// Requests executed at once per connection.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub workers: usize,
}

pub fn serve_file(a: ServeFileArgs) -> Result<()> {
    let export = FileExport::open(&a.file, a.read_only)?;
    for w in crate::serve_cmd::access_warnings(a.listen, None, None) {
        eprintln!("{w}");
    }
    let server = Server::new(vec![(a.name.clone(), Arc::new(export) as Arc<dyn Export>)])
        .with_options(tiercache_nbd::ServerOptions {
            workers_per_connection: a.workers,
            ..Default::default()
        });
    match (&a.socket, a.listen) {
        (Some(s), _) => server.serve_unix(s)?,
        (None, Some(addr)) => server.serve_tcp(addr)?,
        (None, None) => bail!("give --socket PATH or --listen [ADDR:]PORT"),
    }
    Ok(())
}
