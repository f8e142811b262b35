//! The log layout's options at `tiercache format --layout log` and `tiercache serve` (the
//! live Nitro layout, `tiercache_server::LogVolume`): formatting, and the options a served
//! device is opened with (`tiercache_server::open_live` opens both layouts).

use crate::layout_args::LayoutArgs;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use tiercache_engine::log::Compression;
use tiercache_engine::{parse_size, Mode};
use tiercache_server::{LogFormatOptions, LogGiven};

/// Options of `LayoutArgs` the live log layout does not take, and the log options given.
fn check_live_layout(l: &LayoutArgs) -> Result<()> {
    if l.trim
        || l.free_reserve.is_some()
        || l.reinsert_hits.is_some()
        || l.dup_share.is_some()
        || l.erase_block.is_some()
        || l.content_lengths.is_some()
    {
        bail!("--trim, --free-reserve, --reinsert-hits, --dup-share, --erase-block and --content-lengths are simulator options (`tiercache sim --layout log`); the live log layout does not take them");
    }
    Ok(())
}

pub fn options(l: &LayoutArgs, line_size: u64, mode: Mode) -> Result<LogFormatOptions> {
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
