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
use tiercache_nbd::ServerOptions;
use tiercache_server::dashboard;
use tiercache_server::log_format::LogSuperblock;
use tiercache_server::{BlockDev, LogFormatOptions, LogOpenOptions, LogVolume};

macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Options of `LayoutArgs` the live log layout does not take, and the log options given.
fn check_live_layout(l: &LayoutArgs) -> Result<()> {
    if l.trim
        || l.reinsert_hits.is_some()
        || l.dup_share.is_some()
        || l.erase_block.is_some()
        || l.content_lengths.is_some()
    {
        bail!("--trim, --reinsert-hits, --dup-share, --erase-block and --content-lengths are simulator options (`tiercache sim --layout log`); the live log layout does not take them");
    }
    Ok(())
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
    pub direct_only: Vec<String>,
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
    if let Some(m) = p.mode {
        // As in the direct layout: the mode given switches the volume (stored in the
        // superblock; leaving write-back writes back first).
        vol.set_mode(m)
            .with_context(|| format!("--mode {m} on {}", p.cache_path.display()))?;
    }
    crate::serve_cmd::run_live(
        Arc::new(vol),
        crate::serve_cmd::LiveServe {
            cache_path: &p.cache_path,
            control: p.control.as_deref(),
            metrics: p.metrics.as_deref(),
            http: p.http,
            io,
            nbd: p.nbd,
            socket: p.socket.as_deref(),
            socket_group: p.socket_group,
            listen: p.listen,
            state_path: state.as_deref(),
        },
    )
}
