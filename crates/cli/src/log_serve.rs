//! The log layout's options at `tiercache format --layout log` and `tiercache serve` (the
//! live Nitro layout, `tiercache_server::LogVolume`): formatting, and the options a served
//! device is opened with (`tiercache_server::open_live` opens both layouts).

use crate::layout_args::LayoutArgs;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use tiercache_engine::log::Compression;
use tiercache_engine::{parse_size, Mode};
use tiercache_server::{LogFormatOptions, LogGiven};

/// Options of `LayoutArgs` the live log layout does not take: the simulator's content model
/// and FTL (a live cache has real content and a real SSD).
fn check_live_layout(l: &LayoutArgs) -> Result<()> {
    if l.dup_share.is_some() || l.erase_block.is_some() || l.content_lengths.is_some() {
        bail!("--dup-share, --erase-block and --content-lengths are simulator options (`tiercache sim --layout log`: the content model and the FTL); the live log layout stores real content on a real SSD and does not take them");
    }
    Ok(())
}

/// Reclamation flags are per run (`serve`, `ctl set`): `format` refuses them.
fn check_format_layout(l: &LayoutArgs) -> Result<()> {
    check_live_layout(l)?;
    if l.trim || l.free_reserve.is_some() || l.reinsert_hits.is_some() {
        bail!("--trim, --free-reserve and --reinsert-hits are set per run: give them to `tiercache serve` (or change them live with `tiercache ctl set`), not to `format`");
    }
    Ok(())
}

/// The format options of a log cache. `serving`: formatted by `serve --format-if-needed`
/// (the per-run reclamation flags then apply to the run: [`given`]), else by `format`.
pub fn options(
    l: &LayoutArgs,
    line_size: u64,
    mode: Mode,
    serving: bool,
) -> Result<LogFormatOptions> {
    if serving {
        check_live_layout(l)?;
    } else {
        check_format_layout(l)?;
    }
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

/// The log layout's options given to `serve` (a formatted device must have been formatted
/// with them; [`tiercache_server::open_live`] compares), and the log-only flags given (the
/// direct layout refuses them): `--layout log` when that is all.
pub fn given(l: &LayoutArgs) -> Result<LogGiven> {
    check_live_layout(l)?;
    let mut flags = l.log_flags_given();
    if flags.is_empty() && l.is_log()? {
        flags.push("--layout log".into());
    }
    Ok(LogGiven {
        segment_size: l
            .segment_size
            .as_deref()
            .map(|s| parse_size(s).map_err(|e| anyhow!("--segment-size {s:?}: {e}")))
            .transpose()?,
        compression: l
            .compression
            .as_deref()
            .map(|c| c.parse().map_err(|e| anyhow!("--compression: {e}")))
            .transpose()?,
        dedup: l.dedup,
        picker: l.picker.clone(),
        trim: l.trim,
        free_reserve: l.free_reserve,
        reinsert_hits: l.reinsert_hits,
        flags,
    })
}

/// What `tiercache format` says about a device it formatted in the log layout
/// (`tiercache_server::format_device` formats both layouts).
pub fn print_formatted(cache_path: &Path, sb: &tiercache_server::log_format::LogSuperblock) {
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
}
