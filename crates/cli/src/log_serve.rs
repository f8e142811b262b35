//! `tiercache format --layout log` and `tiercache serve` of a log-layout cache device: the
//! live Nitro layout (`tiercache_server::LogVolume`). Kept apart from `serve_cmd.rs`, which
//! only dispatches here.

use crate::layout_args::LayoutArgs;
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::log::Compression;
use tiercache_engine::{parse_size, Mode};
use tiercache_nbd::{Export, ServerOptions};
use tiercache_server::control::Command;
use tiercache_server::dashboard;
use tiercache_server::log_format::LogSuperblock;
use tiercache_server::{BlockDev, LogFormatOptions, LogOpenOptions, LogVolume};

macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Whether the device holds a log-layout superblock.
pub fn is_log_device(cache: &dyn BlockDev) -> Result<bool> {
    Ok(tiercache_server::read_log_superblock(cache)
        .context("reading the log superblock")?
        .is_some())
}

/// Options of `LayoutArgs` the live log layout does not take, and the log options given.
fn check_live_layout(l: &LayoutArgs) -> Result<()> {
    if l.trim || l.reinsert_hits.is_some() || l.dup_share.is_some() || l.erase_block.is_some() {
        bail!("--trim, --reinsert-hits, --dup-share and --erase-block are simulator options (`tiercache sim --layout log`); the live log layout does not take them");
    }
    Ok(())
}

/// Whether any log-layout option was given (an error with a direct-layout device).
pub fn has_log_options(l: &LayoutArgs) -> bool {
    l.segment_size.is_some()
        || l.compression.is_some()
        || l.dedup.is_some()
        || l.picker.is_some()
        || l.trim
        || l.reinsert_hits.is_some()
}

fn options(l: &LayoutArgs, line_size: u64, mode: Mode) -> Result<LogFormatOptions> {
    check_live_layout(l)?;
    let compression: Compression = l
        .compression
        .as_deref()
        .unwrap_or("none")
        .parse()
        .map_err(|e| anyhow!("--compression: {e}"))?;
    Ok(LogFormatOptions {
        line_size,
        segment_size: match &l.segment_size {
            Some(s) => parse_size(s).map_err(|e| anyhow!("--segment-size {s:?}: {e}"))?,
            None => 2 << 20,
        },
        compression,
        dedup_ratio: l.dedup.unwrap_or(0.0),
        picker: l.picker.clone().unwrap_or_else(|| "lru".into()),
        mode,
        journal_records: None,
    })
}

/// Serving a formatted log device with layout options: they must be the ones it was
/// formatted with (the same command line restarts it; another one is an error, not ignored).
fn check_same_layout(l: &LayoutArgs, sb: &LogSuperblock, path: &Path) -> Result<()> {
    check_live_layout(l)?;
    let given = options(l, sb.line_size, sb.mode)?;
    let mut differ = Vec::new();
    if l.segment_size.is_some() && given.segment_size != sb.segment_size {
        differ.push(format!(
            "--segment-size {} (formatted {})",
            tiercache_engine::fmt_size(given.segment_size),
            tiercache_engine::fmt_size(sb.segment_size)
        ));
    }
    if l.compression.is_some() && given.compression != sb.compression {
        differ.push(format!(
            "--compression {} (formatted {})",
            given.compression, sb.compression
        ));
    }
    if l.dedup.is_some() && given.dedup_ratio != sb.dedup_ratio {
        differ.push(format!(
            "--dedup {} (formatted {})",
            given.dedup_ratio, sb.dedup_ratio
        ));
    }
    if l.picker.is_some() && given.picker != sb.picker {
        differ.push(format!(
            "--picker {} (formatted {})",
            given.picker, sb.picker
        ));
    }
    if !differ.is_empty() {
        bail!(
            "{} keeps the layout it was formatted with: {} (reformat with `tiercache format --force --layout log ...`)",
            path.display(),
            differ.join(", ")
        );
    }
    Ok(())
}

/// Formats `cache` in the log layout.
pub fn format(
    cache_path: &Path,
    cache: &dyn BlockDev,
    backing: &dyn BlockDev,
    l: &LayoutArgs,
    line_size: u64,
    mode: Mode,
) -> Result<()> {
    let o = options(l, line_size, mode)?;
    let sb = tiercache_server::format_log_for(cache, backing.size(), backing.identity(), &o)
        .with_context(|| format!("formatting {} in the log layout", cache_path.display()))?;
    println!(
        "formatted {} (log layout): {} segments of {} ({} extents each at most), lines of {} bytes, compression {}, dedup index {}, picker {}, mode {}, backing {} bytes",
        cache_path.display(),
        sb.segments,
        tiercache_engine::fmt_size(sb.segment_size),
        sb.max_extents,
        sb.line_size,
        sb.compression,
        sb.dedup_ratio,
        sb.picker,
        sb.mode,
        sb.backing_size
    );
    println!("backing device {}", sb.backing.describe());
    Ok(())
}

/// What `serve` hands over for a log device.
pub struct LogServe {
    pub cache_path: PathBuf,
    pub socket: Option<PathBuf>,
    /// `--socket-group` as a gid.
    pub socket_group: Option<u32>,
    pub listen: Option<SocketAddr>,
    pub control: Option<PathBuf>,
    pub metrics: Option<String>,
    /// `--http`: the dashboard's address.
    pub http: Option<SocketAddr>,
    pub nbd: ServerOptions,
    pub mode: Option<Mode>,
    pub line_size: Option<u64>,
    pub layout: LayoutArgs,
    /// Direct-layout options given (refused).
    pub direct_only: Vec<&'static str>,
    /// Format the device (it holds no cache yet and `--layout log --format-if-needed`).
    pub format: bool,
    /// What the open accepts about the backing device (`--accept-backing-*`).
    pub accept: LogOpenOptions,
    /// `--state-dir` (the cache's state file goes there, else beside the cache file).
    pub state_dir: Option<PathBuf>,
    pub max_cache_errors: Option<u64>,
}

pub fn serve(p: LogServe, cache: Box<dyn BlockDev>, backing: Box<dyn BlockDev>) -> Result<()> {
    if !p.direct_only.is_empty() {
        bail!(
            "{} apply to the direct layout only; {} is (or is being formatted) in the log layout",
            p.direct_only.join(", "),
            p.cache_path.display()
        );
    }
    let uuid;
    if p.format {
        let o = options(
            &p.layout,
            p.line_size.unwrap_or(4096),
            p.mode.unwrap_or(Mode::WriteThrough),
        )?;
        let sb = tiercache_server::format_log_for(&*cache, backing.size(), backing.identity(), &o)?;
        uuid = sb.uuid;
        say!(
            "formatted {} (log layout): {} segments of {}",
            p.cache_path.display(),
            sb.segments,
            tiercache_engine::fmt_size(sb.segment_size)
        );
    } else {
        let sb = tiercache_server::read_log_superblock(&*cache)?.expect("a log device");
        uuid = sb.uuid;
        check_same_layout(&p.layout, &sb, &p.cache_path)?;
        if let Some(m) = p.mode.filter(|m| *m != sb.mode) {
            bail!(
                "{} is formatted {}; the log layout does not switch to {m} at serve time (reformat)",
                p.cache_path.display(),
                sb.mode
            );
        }
        if let Some(ls) = p.line_size.filter(|&ls| ls != sb.line_size) {
            bail!(
                "{} is formatted with {}-byte lines, not {ls}",
                p.cache_path.display(),
                sb.line_size
            );
        }
    }
    // A superblock older than version 3 has no uuid yet: the open gives it one, so the
    // state file is named after the open.
    let mut accept = p.accept.clone();
    let state_path =
        |u: &[u8; 16]| crate::serve_cmd::state_path(&p.cache_path, p.state_dir.as_deref(), u);
    accept.state_path = (uuid != [0; 16]).then(|| state_path(&uuid)).flatten();
    let (cache, backing, io) = dashboard::counted(cache, backing, p.http.is_some());
    let (vol, rep) = LogVolume::open_opts(cache, backing, &accept)
        .with_context(|| format!("opening log cache {}", p.cache_path.display()))?;
    let state = state_path(&vol.superblock().uuid);
    vol.set_state_path(state.clone());
    crate::serve_cmd::say_state_path(&p.cache_path, state.as_deref());
    if let Some(n) = p.max_cache_errors {
        vol.set_max_cache_errors(n);
    }
    say!(
        "cache {} (log layout): {} lines restored ({} dirty) from {} sealed segments ({} recovered from the journal) after {} shutdown",
        p.cache_path.display(),
        rep.cached_lines,
        rep.dirty_lines,
        rep.sealed_segments,
        rep.recovered_open_segments,
        if rep.was_clean { "a clean" } else { "an unclean" }
    );
    crate::serve_cmd::report_backing_check(
        &rep.backing_note,
        rep.sampled_clean_lines,
        rep.differing_clean_lines,
        rep.dropped_clean_lines,
    );
    let vol = Arc::new(vol);
    let retry = retry_write_backs(Arc::clone(&vol));
    if let Some(c) = &p.control {
        serve_control(c, Arc::clone(&vol))?;
    }
    if let Some(m) = &p.metrics {
        let addr: SocketAddr = m.parse().map_err(|e| anyhow!("--metrics {m:?}: {e}"))?;
        let local = serve_metrics(addr, Arc::clone(&vol))?;
        say!("metrics on http://{local}/metrics");
    }
    if let Some(addr) = p.http {
        let v = Arc::clone(&vol);
        let (d, _) =
            dashboard::Dashboard::start(move || dashboard::log_snapshot(&v, &io[0], &io[1]))?;
        let (local, _) = d.serve(addr)?;
        say!("dashboard on http://{local}/");
    }
    let served = crate::serve_cmd::serve_until_signal(
        vol.clone() as Arc<dyn Export>,
        p.nbd,
        p.socket.as_deref(),
        p.socket_group,
        p.listen,
    );
    let closed = vol.shutdown();
    retry.stop();
    if let Some(c) = &p.control {
        let _ = std::fs::remove_file(c);
    }
    served.context("NBD server")?;
    closed.context("clean shutdown of the cache")?;
    let st = vol.stats();
    crate::serve_cmd::say_shutdown(
        &p.cache_path,
        st.cache_failed,
        vol.failure_recorded(),
        state.as_deref(),
        &st.lost_dirty_ranges,
        st.degraded,
        st.dirty_lines,
    );
    Ok(())
}

/// The background retry of failed write-backs (degraded volume): the volume retries when
/// its backoff has passed; this thread only asks it often enough.
struct Retry(
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
);

impl Retry {
    fn stop(self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.1.join();
    }
}

fn retry_write_backs(vol: Arc<LogVolume>) -> Retry {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let h = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            vol.retry_write_backs();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
    Retry(stop, h)
}

fn handle(vol: &LogVolume, line: &str) -> serde_json::Value {
    let cmd: Command = match serde_json::from_str(line) {
        Ok(c) => c,
        Err(e) => {
            return serde_json::json!({"ok": false, "error": format!("bad request {line:?}: {e}")})
        }
    };
    let r = match cmd {
        Command::Stats => return serde_json::json!({"ok": true, "stats": vol.stats()}),
        Command::Flush => vol.flush().map_err(|e| e.to_string()),
        Command::Mode { .. } | Command::Detach => Err(format!(
            "mode changes and detach are not supported by the log layout (the mode in force is {})",
            vol.stats().mode
        )),
        // The log layout's settings are fixed at format (`tiercache format --layout log`):
        // shown, not changed.
        Command::Get { key } => {
            let st = vol.stats();
            let all = vec![
                ("mode", st.mode.clone()),
                ("line-size", tiercache_server::tuning::size_str(st.line_size)),
            ];
            return tiercache_server::control::get_reply(all, key.as_deref());
        }
        Command::Set { key, .. } => Err(format!(
            "{key}: the log layout's settings are fixed when it is formatted (`tiercache format --layout log`); `ctl set` changes the direct layout's"
        )),
        Command::ResetStats => Err("`ctl stats --reset` is not supported by the log layout".into()),
    };
    match r {
        Ok(()) => serde_json::json!({"ok": true}),
        Err(e) => serde_json::json!({"ok": false, "error": e}),
    }
}

/// The control socket (same line protocol as the direct layout's; `ctl stats|flush`).
fn serve_control(path: &Path, vol: Arc<LogVolume>) -> Result<()> {
    tiercache_server::control::serve_json_lines(path, move |line| handle(&vol, line))?;
    Ok(())
}

/// Prometheus text of the log volume's figures.
pub fn prometheus(s: &tiercache_server::log_volume::LogVolumeStats) -> String {
    let mut o = String::new();
    let mut g = |name: &str, help: &str, v: f64| {
        o.push_str(&format!(
            "# HELP tiercache_log_{name} {help}\n# TYPE tiercache_log_{name} gauge\ntiercache_log_{name} {v}\n"
        ));
    };
    g(
        "cached_lines",
        "Lines the cache can serve.",
        s.cached_lines as f64,
    );
    g(
        "dirty_lines",
        "Lines not yet on the backing device.",
        s.dirty_lines as f64,
    );
    g(
        "dedup_ratio",
        "Cached lines per stored extent.",
        s.dedup_ratio,
    );
    g(
        "compression_ratio",
        "Raw bytes per stored byte over the stored extents.",
        s.compression_ratio,
    );
    g(
        "effective_capacity",
        "Logical bytes cached per SSD byte of segments in use.",
        s.effective_capacity,
    );
    g(
        "ssd_bytes_written",
        "Bytes written to the cache device.",
        s.ssd_bytes_written as f64,
    );
    g(
        "index_bytes_per_entry",
        "RAM of the indices per cached line.",
        s.index_bytes_per_entry,
    );
    g(
        "read_line_hits",
        "Read lines served from the cache.",
        s.engine.read_line_hits as f64,
    );
    g("read_lines", "Read lines.", s.engine.read_lines as f64);
    tiercache_server::metrics::fault_metrics(
        &mut o,
        &tiercache_server::metrics::FaultFigures {
            cache_errors: s.cache_errors,
            checksum_errors: 0,
            backing_errors: s.backing_errors,
            backing_write_errors: s.backing_write_errors,
            cache_failed: s.cache_failed,
            lost_dirty_bytes: s.lost_dirty_bytes,
            degraded: s.degraded,
        },
    );
    o
}

fn serve_metrics(addr: SocketAddr, vol: Arc<LogVolume>) -> Result<SocketAddr> {
    let (local, _) =
        tiercache_server::control::serve_prometheus(addr, move || prometheus(&vol.stats()))?;
    Ok(local)
}

/// `ctl stats` (text) of a log volume.
pub fn print_stats(s: &serde_json::Value) {
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    println!(
        "layout          log: {} segments of {} bytes, compression {}, picker {}, dedup index {}",
        n("segments"),
        n("segment_size"),
        s["compression"].as_str().unwrap_or("?"),
        s["picker"].as_str().unwrap_or("?"),
        f("dedup_index_ratio")
    );
    println!("mode            {}", s["mode"].as_str().unwrap_or("?"));
    println!(
        "requests        {} ({} passed through after a cache failure)",
        s["live"]["requests"].as_u64().unwrap_or(0),
        s["live"]["pass_through_requests"].as_u64().unwrap_or(0)
    );
    crate::serve_cmd::print_faults(s);
    println!(
        "cached          {} lines of {} bytes, {} dirty",
        n("cached_lines"),
        n("line_size"),
        n("dirty_lines")
    );
    println!(
        "reduction       dedup {:.3}, compression {:.3}, effective capacity {:.3}",
        f("dedup_ratio"),
        f("compression_ratio"),
        f("effective_capacity")
    );
    println!(
        "SSD             {} bytes used, {} bytes written",
        n("ssd_bytes_used"),
        n("ssd_bytes_written")
    );
    println!(
        "RAM (index)     {} bytes, {:.1} per cached line",
        n("ram_index_bytes"),
        f("index_bytes_per_entry")
    );
    let e = &s["engine"];
    let h = e["read_line_hits"].as_u64().unwrap_or(0);
    let r = e["read_lines"].as_u64().unwrap_or(0);
    println!(
        "reads           {r} lines, {h} hits ({:.2} %), {} from duplicates",
        100.0 * h as f64 / r.max(1) as f64,
        e["dup_read_hits"].as_u64().unwrap_or(0)
    );
}
