//! [`format_device`]: the one function that formats a cache device (issue 19), as
//! [`crate::open_live`] is the one that opens one. `tiercache format` and `serve
//! --format-if-needed` both call it with the options given: the layout is the log layout when
//! its options are given (`--layout log`), else the direct layout, and the options of the
//! other layout are refused by name, never ignored.

use crate::dev::BlockDev;
use crate::format::Superblock;
use crate::log_format::LogSuperblock;
use crate::log_volume::LogFormatOptions;
use crate::volume::FormatOptions;
use std::path::Path;

/// What [`format_device`] takes.
pub struct FormatSpec<'a> {
    /// The cache device's name (its path or NBD URI) for errors.
    pub cache_name: &'a Path,
    /// The direct layout's options (used unless `log` is given).
    pub direct: FormatOptions,
    /// The log layout's options: given (`--layout log`), the device is formatted in the log
    /// layout.
    pub log: Option<LogFormatOptions>,
    /// The direct-layout settings given, as named to the user: the log layout refuses them.
    pub direct_only: Vec<String>,
    /// The log-layout flags given, as named to the user: the direct layout refuses them.
    pub log_flags: Vec<String>,
}

/// The superblock [`format_device`] wrote.
#[derive(Clone, Debug)]
pub enum Formatted {
    Direct(Superblock),
    Log(LogSuperblock),
}

impl Formatted {
    /// `"direct"` or `"log"`.
    pub fn layout(&self) -> &'static str {
        match self {
            Formatted::Direct(_) => "direct",
            Formatted::Log(_) => "log",
        }
    }
}

/// Formats `cache` (in front of `backing`) in the layout `s` asks for; an error names the
/// device and the options of the other layout given.
pub fn format_device(
    cache: &dyn BlockDev,
    backing: &dyn BlockDev,
    s: &FormatSpec,
) -> Result<Formatted, String> {
    let name = s.cache_name.display();
    match &s.log {
        Some(log) => {
            if !s.direct_only.is_empty() {
                return Err(format!(
                    "{} apply to the direct layout only; {name} is being formatted in the log layout (it uses the whole device, admits every missed line and picks segments with --picker)",
                    s.direct_only.join(", ")
                ));
            }
            crate::log_volume::format_log_for(cache, backing.size(), backing.identity(), log)
                .map(Formatted::Log)
                .map_err(|e| format!("formatting {name} in the log layout: {e}"))
        }
        None => {
            if !s.log_flags.is_empty() {
                return Err(format!(
                    "{name}: {} apply to the log layout only: they need --layout log",
                    s.log_flags.join(", ")
                ));
            }
            crate::volume::format(cache, backing.size(), &s.direct)
                .map(Formatted::Direct)
                .map_err(|e| format!("formatting {name}: {e}"))
        }
    }
}
