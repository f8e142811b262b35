//! [`open_live`]: the one function that opens a served cache (issue 19 item 1). It reads the
//! superblock, picks the layout, checks the run's options against what the device was
//! formatted with, opens the volume, applies the run settings and returns it behind the one
//! contract ([`LiveVolume`]). `tiercache serve` calls it once and never looks at the layout
//! itself; this is the only place that does.
//!
//! Options a layout does not take are refused by name, never ignored: the direct layout
//! refuses the log layout's flags ([`LogGiven::flags`]), the log layout refuses every direct
//! setting given ([`LiveOpenOptions::direct_only`]).

use crate::format::FormatError;
use crate::live::{probe, Found, LiveVolume};
use crate::log_format::LogSuperblock;
use crate::log_volume::{LogOpenOptions, LogVolume};
use crate::tuning::Tuning;
use crate::volume::{CacheVolume, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::log::Compression;
use tiercache_engine::{ClassTable, CleaningPolicy, Mode, WritebackRate};

/// The engine settings of a run from (line size, policy, the stored settings): `Ok(None)`
/// keeps the stored ones; an error names the flag.
pub type RunTuning<'a> = dyn Fn(u64, &str, Option<Tuning>) -> Result<Option<Tuning>, String> + 'a;

/// The run settings only the direct layout has (the log layout refuses them: the caller lists
/// the ones given in [`LiveOpenOptions::direct_only`]).
pub struct DirectRun<'a> {
    /// `--policy`: replaces the stored one.
    pub policy: Option<String>,
    /// `--data-checksums`: the device must have been formatted with them.
    pub data_checksums: bool,
    /// `--validity`: must be the formatted one (`None`: the formatted one).
    pub validity: Option<tiercache_engine::Validity>,
    /// The engine settings of this run from (line size, policy, the stored settings);
    /// `Ok(None)`: the stored ones. Errors name the flag.
    pub tuning: &'a RunTuning<'a>,
    /// `--classes`/`--class-rules` (built) and `--classifier`. The log layout takes these
    /// two as well (`never` classes, per-class statistics; see `LogConfig::classes`).
    pub classes: Option<Arc<ClassTable>>,
    pub classifier: Option<String>,
    pub unmap_batch: Option<u64>,
    /// `--cleaner inline`.
    pub inline_cleaning: bool,
    /// `--rewrite-chunk` (default `DEFAULT_REWRITE_CHUNK`) and `--rewrite-min-runs` (default:
    /// from the emulated HDD, else `DEFAULT_REWRITE_MIN_RUNS`).
    pub rewrite_chunk: Option<u64>,
    pub rewrite_min_runs: Option<u64>,
    /// `--emulate-hdd SPEC` (the chunk rewrite's default minimum of runs comes from it).
    pub emulate_hdd: Option<String>,
    /// `--cleaning` / `--cleaning-age` (either given: set; the policy defaults).
    pub cleaning: Option<CleaningPolicy>,
    pub cleaning_age: Option<u64>,
    /// `--writeback-rate` / `--writeback-target` (either given: set).
    pub writeback_rate: Option<WritebackRate>,
    pub writeback_target: Option<f64>,
    /// `--ram-cache` bytes (0: no RAM tier) and `--ram-policy`.
    pub ram_cache: u64,
    pub ram_policy: Option<String>,
    /// `--volume NAME=BACKING` (several volumes; the backing device is their
    /// `crate::volume_set::VolumeSet`); empty: one volume (`--backing`).
    pub volumes: Vec<crate::volume_set::VolumeSpec>,
    /// `--volume-admission`, `--volume-seq-cutoff` of those volumes.
    pub volume_flags: Vec<crate::vol_tuning::VolumeFlags>,
}

impl Default for DirectRun<'_> {
    fn default() -> Self {
        DirectRun {
            policy: None,
            data_checksums: false,
            validity: None,
            tuning: &|_, _, _| Ok(None),
            classes: None,
            classifier: None,
            unmap_batch: None,
            inline_cleaning: false,
            rewrite_chunk: None,
            rewrite_min_runs: None,
            emulate_hdd: None,
            cleaning: None,
            cleaning_age: None,
            writeback_rate: None,
            writeback_target: None,
            ram_cache: 0,
            ram_policy: None,
            volumes: Vec::new(),
            volume_flags: Vec::new(),
        }
    }
}

/// The log layout's format options given for this run: a formatted device must have been
/// formatted with them (the same command line restarts it; another one is an error).
#[derive(Clone, Debug, Default)]
pub struct LogGiven {
    pub segment_size: Option<u64>,
    pub compression: Option<Compression>,
    pub dedup: Option<f64>,
    pub picker: Option<String>,
    /// Per-run reclamation settings (`--trim`, `--free-reserve`, `--reinsert-hits`; not
    /// stored: `LogVolume::set_reclaim`), applied after the open when any is given.
    pub trim: bool,
    pub free_reserve: Option<f64>,
    pub reinsert_hits: Option<u16>,
    /// The log-only flags given, as the user wrote them (`--layout log`, `--segment-size`,
    /// ...): the direct layout refuses them.
    pub flags: Vec<String>,
}

/// What [`open_live`] takes.
pub struct LiveOpenOptions<'a> {
    /// The cache device's name (its path or NBD URI) for messages and errors.
    pub cache_name: &'a Path,
    /// `--mode`: switched to and stored after the open (leaving write-back writes back).
    pub mode: Option<Mode>,
    /// `--line-size`: must be the formatted one.
    pub line_size: Option<u64>,
    pub max_cache_errors: Option<u64>,
    pub accept_backing_rename: bool,
    pub accept_backing_changes: bool,
    /// Where the state file of the cache with this uuid goes (`None`: nowhere).
    pub state_path: &'a dyn Fn(&[u8; 16]) -> Option<PathBuf>,
    pub direct: DirectRun<'a>,
    /// The direct-layout settings given, as named to the user: the log layout refuses them.
    pub direct_only: Vec<String>,
    pub log: LogGiven,
    /// Where the open's messages go (one line each: what was restored, settings in force,
    /// backing checks).
    pub say: &'a dyn Fn(&str),
}

/// What [`open_live`] found besides the volume.
#[derive(Clone, Debug)]
pub struct LiveOpenReport {
    /// `"direct"` or `"log"`.
    pub layout: &'static str,
    /// The state file a failure of the cache is recorded in.
    pub state_path: Option<PathBuf>,
    pub was_clean: bool,
}

/// An error and its causes on one line, as `anyhow`'s `{:#}` prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The line that says where a failure of the cache would be recorded.
pub fn state_path_line(cache: &Path, state_path: Option<&Path>) -> String {
    match state_path {
        Some(p) => format!("a failure of the cache would be recorded in {}", p.display()),
        None => format!(
            "WARNING: no --state-dir for the NBD cache device {} (and no default: no $HOME): a failure of it can only be recorded by erasing its superblock, and writes fail while that is impossible",
            cache.display()
        ),
    }
}

/// The lines that say what the open's backing checks found: the identity note, and the clean
/// lines compared with the backing device.
pub fn backing_check_lines(
    note: &Option<String>,
    sampled: u64,
    differ: u64,
    dropped: u64,
) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(n) = note {
        v.push(format!("warning: {n}"));
    }
    if differ > 0 {
        v.push(format!("warning: {differ} of {sampled} clean cached lines compared differ from the backing device: {dropped} clean lines dropped (they read the backing device's bytes)"));
    } else if sampled > 0 {
        v.push(format!(
            "backing device verified: {sampled} clean cached lines compared, all equal"
        ));
    }
    v
}

/// Opens the cache on `cache` in front of `backing` in the layout its superblock names, with
/// the run's options (see the module doc), and returns it behind [`LiveVolume`]. A device
/// with no cache, or a damaged one, is an error (`serve` formats a blank device first).
pub fn open_live(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    o: &LiveOpenOptions,
) -> Result<(Arc<dyn LiveVolume>, LiveOpenReport), String> {
    let name = o.cache_name.display();
    let found = probe(&*cache).map_err(|e| format!("reading {name}: {e}"))?;
    if let Some(ls) = o.line_size {
        let formatted = match &found {
            Found::Direct(sb) => Some(sb.line_size),
            Found::Log(sb) => Some(sb.line_size),
            _ => None,
        };
        if let Some(f) = formatted.filter(|&f| f != ls) {
            return Err(format!(
                "{name} is formatted with {f}-byte lines, not {ls}; reformat with `tiercache format --force --line-size {ls}`"
            ));
        }
    }
    match found {
        Found::Direct(sb) => open_direct(cache, backing, sb, o),
        Found::Log(sb) => open_log(cache, backing, sb, o),
        Found::DamagedLog(e) => Err(format!("reading the log superblock: {e}")),
        Found::NoCache(FormatError::BadMagic) => Err(format!(
            "{name} holds no tiercache cache: run `tiercache format` or add --format-if-needed"
        )),
        Found::NoCache(e) => Err(format!("reading {name}: {}", chain(&e))),
    }
}

use crate::dev::BlockDev;

fn open_direct(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    sb: crate::format::Superblock,
    o: &LiveOpenOptions,
) -> Result<(Arc<dyn LiveVolume>, LiveOpenReport), String> {
    let name = o.cache_name.display();
    let say = o.say;
    let d = &o.direct;
    if !o.log.flags.is_empty() {
        return Err(format!("{name}: {} apply to the log layout only and need a cache device in the log layout (`tiercache format --layout log`, or --format-if-needed on an empty device); this one is in the direct layout", o.log.flags.join(", ")));
    }
    let tuning = (d.tuning)(
        sb.line_size,
        d.policy.as_deref().unwrap_or(&sb.policy),
        sb.tuning,
    )?;
    if d.data_checksums && !sb.data_checksums {
        return Err(format!(
            "{name} was formatted without data checksums; they are fixed at format time: `tiercache format --force --data-checksums` (discards the cache, flush it first), or serve without --data-checksums"
        ));
    }
    if let Some(v) = d.validity.filter(|&v| v != sb.validity) {
        return Err(format!(
            "{name} was formatted with {} validity, not {}; it is fixed at format time (a cache of partly valid lines cannot become whole-line): `tiercache format --force --validity {}` (discards the cache, flush it first), or serve without --validity",
            sb.validity.as_str(),
            v.as_str(),
            v.as_str()
        ));
    }
    let opts = OpenOptions {
        mode: o.mode,
        policy: d.policy.clone(),
        classes: d.classes.clone(),
        accept_backing_rename: o.accept_backing_rename,
        accept_backing_changes: o.accept_backing_changes,
        state_path: (o.state_path)(&sb.uuid),
        tuning,
        ram_cache: d.ram_cache,
        ram_policy: d.ram_policy.clone(),
        volumes: d.volumes.clone(),
        volume_flags: d.volume_flags.clone(),
    };
    say(&state_path_line(o.cache_name, opts.state_path.as_deref()));
    let (mut vol, rep) = CacheVolume::open(cache, backing, &opts)
        .map_err(|e| format!("opening cache {name}: {}", chain(&e)))?;
    if let Some(table) = d.classes.clone() {
        let cname = d.classifier.as_deref().unwrap_or("none");
        let t = std::time::Instant::now();
        let tname = table.name.clone();
        if let Some(s) = crate::classify::attach(&mut vol, cname, table)? {
            say(&classifier_line(cname, &tname, &s, t));
        }
    }
    say(&format!(
        "cache {name}: {} lines restored ({} dirty) after {} shutdown; {} bad records dropped; mode {}",
        rep.restored,
        rep.restored_dirty,
        if rep.was_clean { "a clean" } else { "an unclean" },
        rep.dropped_bad_checksum,
        vol.mode()
    ));
    say(&format!(
        "settings: {}",
        vol.settings()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for l in backing_check_lines(
        &rep.backing_note,
        rep.sampled_clean_lines,
        rep.differing_clean_lines,
        rep.dropped_clean_lines,
    ) {
        say(&l);
    }
    if let Some(n) = d.unmap_batch {
        vol.set_unmap_batch(n);
    }
    if let Some(n) = o.max_cache_errors {
        vol.set_max_cache_errors(n);
    }
    vol.set_inline_cleaning(d.inline_cleaning);
    let chunk = d
        .rewrite_chunk
        .unwrap_or(tiercache_engine::DEFAULT_REWRITE_CHUNK);
    let runs = match (d.rewrite_min_runs, &d.emulate_hdd) {
        (Some(n), _) => n,
        (None, Some(spec)) => {
            tiercache_devices::rewrite_min_runs(&crate::hdd_config(spec)?, chunk, vol.line_size())
        }
        (None, None) => tiercache_engine::DEFAULT_REWRITE_MIN_RUNS,
    };
    vol.set_chunk_rewrite(chunk, runs)
        .map_err(|e| format!("--rewrite-chunk {chunk} / --rewrite-min-runs {runs}: {e}"))?;
    if chunk > 0 {
        say(&format!(
            "cleaning: chunk rewrite of {chunk} bytes, rewrite min runs {runs}"
        ));
    }
    if d.cleaning.is_some() || d.cleaning_age.is_some() {
        let p = d.cleaning.unwrap_or_default();
        vol.set_cleaning(p, d.cleaning_age)
            .map_err(|e| format!("--cleaning / --cleaning-age: {e}"))?;
        say(&format!("cleaning: {p}"));
    }
    if d.writeback_rate.is_some() || d.writeback_target.is_some() {
        let rate = d.writeback_rate.unwrap_or(WritebackRate::Auto);
        let target = d
            .writeback_target
            .unwrap_or(tiercache_engine::rate::DEFAULT_TARGET);
        vol.set_writeback_rate(rate, target)
            .map_err(|e| format!("--writeback-rate / --writeback-target: {e}"))?;
        say(&format!(
            "write-back rate {rate}, target dirty share {target}"
        ));
    }
    let rep = LiveOpenReport {
        layout: "direct",
        state_path: opts.state_path.clone(),
        was_clean: rep.was_clean,
    };
    Ok((Arc::new(vol), rep))
}

/// The line that says which classifier runs over which table and what it learned at start.
fn classifier_line(
    cname: &str,
    tname: &str,
    s: &serde_json::Value,
    t: std::time::Instant,
) -> String {
    let extra = match cname {
        "ext4" if s["ext4_found"] == true => format!(
            ": ext4 found, {} inodes and {} extents learned in {:.2} s",
            s["inodes"],
            s["extents"],
            t.elapsed().as_secs_f64()
        ),
        "ext4" => {
            ": no ext4 file system yet (learns it when one is written; rules meanwhile)".to_string()
        }
        _ => String::new(),
    };
    format!("classifier {cname} over class table {tname:?}{extra}")
}

/// The log options given that differ from the formatted ones.
fn log_differences(g: &LogGiven, sb: &LogSuperblock) -> Vec<String> {
    let mut differ = Vec::new();
    if let Some(s) = g.segment_size.filter(|&s| s != sb.segment_size) {
        differ.push(format!(
            "--segment-size {} (formatted {})",
            tiercache_engine::fmt_size(s),
            tiercache_engine::fmt_size(sb.segment_size)
        ));
    }
    if let Some(c) = g.compression.filter(|&c| c != sb.compression) {
        differ.push(format!("--compression {c} (formatted {})", sb.compression));
    }
    if let Some(d) = g.dedup.filter(|&d| d != sb.dedup_ratio) {
        differ.push(format!("--dedup {d} (formatted {})", sb.dedup_ratio));
    }
    if let Some(p) = g.picker.as_ref().filter(|&p| *p != sb.picker) {
        differ.push(format!("--picker {p} (formatted {})", sb.picker));
    }
    differ
}

fn open_log(
    cache: Box<dyn BlockDev>,
    backing: Box<dyn BlockDev>,
    sb: LogSuperblock,
    o: &LiveOpenOptions,
) -> Result<(Arc<dyn LiveVolume>, LiveOpenReport), String> {
    let name = o.cache_name.display();
    let say = o.say;
    if !o.direct.volumes.is_empty() {
        return Err(format!(
            "{name} is in the log layout, which serves one volume: --volume (several volumes sharing one cache) needs a cache in the direct layout. Serve this one with --backing, or give the volumes a direct-layout cache"
        ));
    }
    if !o.direct_only.is_empty() {
        return Err(format!(
            "{} apply to the direct layout only; {name} is (or is being formatted) in the log layout",
            o.direct_only.join(", ")
        ));
    }
    let differ = log_differences(&o.log, &sb);
    if !differ.is_empty() {
        return Err(format!(
            "{name} keeps the layout it was formatted with: {} (reformat with `tiercache format --force --layout log ...`)",
            differ.join(", ")
        ));
    }
    // A superblock older than version 3 has no uuid yet: the open gives it one, so the
    // state file is named after the open.
    let accept = LogOpenOptions {
        accept_backing_rename: o.accept_backing_rename,
        accept_backing_changes: o.accept_backing_changes,
        state_path: (sb.uuid != [0; 16])
            .then(|| (o.state_path)(&sb.uuid))
            .flatten(),
        ..Default::default()
    };
    let (mut vol, rep) = LogVolume::open_opts(cache, backing, &accept)
        .map_err(|e| format!("opening log cache {name}: {}", chain(&e)))?;
    if let Some(table) = o.direct.classes.clone() {
        // `never` classes are not cached, every class is counted (`LogConfig::classes`).
        let tname = table.name.clone();
        vol.set_class_table(Arc::clone(&table), "serve flags")?;
        let cname = o.direct.classifier.as_deref().unwrap_or("none");
        let t = std::time::Instant::now();
        if let Some(c) = crate::classify::by_name(cname, table)? {
            vol.set_classifier(Arc::clone(&c));
            vol.learn_classifier();
            say(&classifier_line(cname, &tname, &c.summary(), t));
        } else {
            say(&format!(
                "class table {tname:?} without a classifier: every request is class 0"
            ));
        }
    }
    let state = (o.state_path)(&vol.superblock().uuid);
    vol.set_state_path(state.clone());
    say(&state_path_line(o.cache_name, state.as_deref()));
    if let Some(n) = o.max_cache_errors {
        vol.set_max_cache_errors(n);
    }
    say(&format!(
        "cache {name} (log layout): {} lines restored ({} dirty) from {} sealed segments ({} recovered from the journal) after {} shutdown",
        rep.cached_lines,
        rep.dirty_lines,
        rep.sealed_segments,
        rep.recovered_open_segments,
        if rep.was_clean { "a clean" } else { "an unclean" }
    ));
    for l in backing_check_lines(
        &rep.backing_note,
        rep.sampled_clean_lines,
        rep.differing_clean_lines,
        rep.dropped_clean_lines,
    ) {
        say(&l);
    }
    let g = &o.log;
    if g.trim || g.free_reserve.is_some() || g.reinsert_hits.is_some() {
        let reserve = g
            .free_reserve
            .unwrap_or(tiercache_engine::log::DEFAULT_FREE_RESERVE);
        let hits = g.reinsert_hits.unwrap_or(0);
        vol.set_reclaim(g.trim, reserve, hits)
            .map_err(|e| format!("--trim/--free-reserve/--reinsert-hits on {name}: {e}"))?;
        let kept = vol.engine_config().reserve_segments();
        say(&format!(
            "reclamation: trim {}, free reserve {reserve} ({kept} segments kept free{}), reinsert hits {hits} (per run: `ctl set` changes them live)",
            if g.trim { "on" } else { "off" },
            if g.trim { " and trimmed ahead" } else { ": only with trim" },
        ));
    }
    if let Some(m) = o.mode {
        // As in the direct layout: the mode given switches the volume (stored in the
        // superblock; leaving write-back writes back first).
        vol.set_mode(m)
            .map_err(|e| format!("--mode {m} on {name}: {}", chain(&e)))?;
    }
    if o.direct.ram_cache > 0 {
        vol.set_ram_cache(o.direct.ram_cache, o.direct.ram_policy.as_deref())?;
    }
    let rep = LiveOpenReport {
        layout: "log",
        state_path: state,
        was_clean: rep.was_clean,
    };
    Ok((Arc::new(vol), rep))
}
