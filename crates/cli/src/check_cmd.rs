//! `tiercache check DEVICE`: offline consistency check of a cache device (superblock,
//! metadata checksums, mapping; for the log layout: recovery, indices and an extent scrub). Exit codes: 0 consistent, 1 inconsistencies found, 2 the
//! device cannot be read or is not a tiercache cache device.
//!
//! `tiercache check --cache A --cache B ...`: a pool of cache devices (members in any order):
//! each member's pool block and record pages, the membership they agree on, and the pairing
//! of dirty lines' copies open would do (`tiercache_server::reconcile`); exit codes as above.
//!
//! `tiercache check --repair DEVICE`: with the server stopped (the device is locked
//! exclusively; a running server holds a shared lock), drops what the check found damaged
//! and rewrites the metadata so the server starts: direct layout, the bad records (their
//! slots named; a record that fails its checksum has an unknown key, so its data may have
//! been dirty); log layout, a salvage of every journal record that still verifies, after the
//! damaged one too. It prints (and `--json` lists) what is lost, then checks again: exit 0
//! when the device is consistent afterwards, 1 when not (or not repairable), 2 when it
//! cannot be opened. On a consistent device it writes nothing.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use tiercache_server::check::{
    check_any, check_pool, repair_any, CheckReport, DeviceCheck, DeviceCheckError, RepairAnyError,
};
use tiercache_server::log_check::LogCheckReport;
use tiercache_server::FileDev;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The cache device or file (as given to `tiercache format --cache`); opened read-only.
    #[arg(required_unless_present = "cache", conflicts_with = "cache")]
    pub device: Option<PathBuf>,
    /// A member of a pool of cache devices, repeated for each (any order; read-only): checks
    /// the pool blocks, every member's records and the pairing of dirty copies. One --cache
    /// is the same as DEVICE.
    #[arg(long, value_name = "PATH")]
    pub cache: Vec<PathBuf>,
    /// Print the report as JSON (with "ok" and "exit_code").
    #[arg(long)]
    pub json: bool,
    /// Repair: drop the damaged metadata the check finds, salvage what still verifies, and
    /// list what is lost. Writes the device: stop the server first.
    #[arg(long)]
    pub repair: bool,
}

pub fn run(mut a: CheckArgs) -> ExitCode {
    if a.cache.len() >= 2 {
        if a.repair {
            return fail(
                &a,
                "--repair of a pool of cache devices is not built yet: check it, then repair or format its members".into(),
            );
        }
        return run_pool(&a);
    }
    if let Some(p) = a.cache.pop() {
        a.device = Some(p);
    }
    if a.repair {
        return run_repair(&a);
    }
    let dev = match FileDev::open_read_only(a.device()) {
        Ok(d) => d,
        Err(e) => return fail(&a, format!("cannot open: {e}")),
    };
    let rep = match check_any(Box::new(dev)) {
        Ok(DeviceCheck::Direct(r)) => r,
        Ok(DeviceCheck::Log(r)) => return print_log(&a, r),
        Err(DeviceCheckError::DamagedLog(e)) => {
            // The log magic is there, the superblock does not verify: an inconsistency.
            let p = format!("superblock (bytes 0..4096): {e}");
            if a.json {
                let v = serde_json::json!({"device": a.device().display().to_string(),
                    "layout": "log", "ok": false, "exit_code": 1, "problems": [p]});
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                println!("device        {} (log layout)", a.device().display());
                println!("PROBLEM: {p}");
                println!("result        1 inconsistency found");
            }
            return ExitCode::from(1);
        }
        Err(DeviceCheckError::LogRecovery(e)) => {
            return fail(
                &a,
                format!(
                    "{}: recovery of the log layout fails: {e}",
                    a.device().display()
                ),
            )
        }
        Err(DeviceCheckError::Unreadable(e)) => {
            return fail(&a, format!("{}: {e}", a.device().display()))
        }
        Err(DeviceCheckError::Direct(e)) => {
            return fail(&a, format!("{}: {e}", a.device().display()))
        }
    };
    let code = if rep.ok() { 0 } else { 1 };
    if a.json {
        let mut v = serde_json::to_value(&rep).expect("report serializes");
        v["device"] = a.device().display().to_string().into();
        v["ok"] = rep.ok().into();
        v["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        print_text(&a, &rep);
    }
    ExitCode::from(code)
}

/// A log-layout device's report: recovery on a copy-on-write view, index invariants, extent
/// scrub.
fn print_log(a: &CheckArgs, r: LogCheckReport) -> ExitCode {
    let code = if r.ok() { 0 } else { 1 };
    if a.json {
        let mut v = serde_json::to_value(&r).expect("report serializes");
        v["device"] = a.device().display().to_string().into();
        v["ok"] = r.ok().into();
        v["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return ExitCode::from(code);
    }
    let (rec, sc) = (&r.recovery, &r.scrub);
    println!(
        "device        {} ({} bytes), log layout",
        a.device().display(),
        r.device_bytes
    );
    println!(
        "layout        {} segments of {} bytes, lines of {} bytes, compression {}, mode {}",
        r.segments, r.segment_size, r.line_size, r.compression, r.mode
    );
    println!(
        "recovery      {} shutdown: {} sealed segments, {} journal records ({} stale), {} open segments rebuilt from the journal",
        if rec.was_clean { "clean" } else { "unclean" },
        rec.sealed_segments,
        rec.journal_records,
        rec.stale_records,
        rec.recovered_open_segments
    );
    for d in &rec.damage {
        println!(
            "PROBLEM: {} (`tiercache check --repair` salvages)",
            d.message
        );
    }
    for l in &rec.unknown_lost {
        println!("would lose: {l}");
    }
    println!(
        "mapping       {} lines cached, {} dirty, {} stored extents scrubbed",
        sc.lines, sc.dirty_lines, sc.extents
    );
    for p in r
        .index_problems
        .iter()
        .chain(&sc.problems)
        .chain(&r.lost_list_problem)
    {
        println!("PROBLEM: {p}");
    }
    for &(a, b) in &r.lost_list {
        println!(
            "lost          volume bytes {a}..{b} (offset {a}, length {}): in the lost-range list, reads fail with EIO until written again",
            b - a
        );
    }
    if r.ok() {
        println!("result        consistent");
    } else {
        println!(
            "result        {} inconsistencies found ({} bad extents, {} dirty lines lost)",
            rec.damage.len()
                + r.index_problems.len()
                + sc.problems.len()
                + usize::from(r.lost_list_problem.is_some()),
            sc.bad_extents,
            sc.lost_lines
        );
    }
    ExitCode::from(code)
}

/// `--repair`: see the module doc.
fn run_repair(a: &CheckArgs) -> ExitCode {
    let dev = match FileDev::open_exclusive(a.device()) {
        Ok(d) => d,
        Err(e) => return fail(a, format!("cannot open for repair: {e}")),
    };
    let path = a.device().display().to_string();
    // The server's one probe picks the layout and its repair (`repair_any`).
    let read_only = || {
        FileDev::open_read_only(a.device())
            .map(|d| Box::new(d) as Box<dyn tiercache_server::BlockDev>)
    };
    let (layout, rep) = match repair_any(Box::new(dev), &read_only) {
        Ok(x) => x,
        Err(RepairAnyError::Unrepairable(e)) => return unrepairable(a, format!("{path}: {e}")),
        Err(RepairAnyError::Unreadable(e) | RepairAnyError::Failed(e)) => {
            return fail(a, format!("{path}: {e}"))
        }
    };
    let check_again = || -> Result<(bool, serde_json::Value), String> {
        let ro = FileDev::open_read_only(a.device()).map_err(|e| e.to_string())?;
        match check_any(Box::new(ro)) {
            Ok(DeviceCheck::Log(r)) => Ok((r.ok(), serde_json::to_value(&r).unwrap())),
            Ok(DeviceCheck::Direct(r)) => Ok((r.ok(), serde_json::to_value(&r).unwrap())),
            Err(
                DeviceCheckError::Unreadable(e)
                | DeviceCheckError::DamagedLog(e)
                | DeviceCheckError::LogRecovery(e),
            ) => Err(e.to_string()),
            Err(DeviceCheckError::Direct(e)) => Err(e.to_string()),
        }
    };
    let (ok, after) = match check_again() {
        Ok(x) => x,
        Err(e) => return fail(a, format!("{path}: after the repair: {e}")),
    };
    let code = if ok { 0 } else { 1 };
    if a.json {
        let v = serde_json::json!({"device": path, "layout": layout,
            "repair": rep, "check": after, "ok": ok, "exit_code": code});
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return ExitCode::from(code);
    }
    println!("device        {path} ({layout} layout)");
    if !rep.changed {
        println!("repair        nothing to repair: no damaged metadata found; the device was not written");
    }
    for r in &rep.repaired {
        println!("repaired: {r}");
    }
    if rep.salvaged_records > 0 {
        println!(
            "salvaged      {} journal records after the damage replayed",
            rep.salvaged_records
        );
    }
    for l in &rep.unknown_lost {
        println!("LOST (line unknown): {l}");
    }
    for l in &rep.lost_ranges {
        println!("LOST {}: {}", l.text(), l.what);
    }
    if rep.changed && rep.unknown_lost.is_empty() && rep.lost_ranges.is_empty() {
        println!("lost          nothing");
    }
    if ok {
        println!("result        consistent");
    } else {
        println!("result        still inconsistent: run `tiercache check {path}` for the problems a repair does not fix (damaged extents are dropped when read)");
    }
    ExitCode::from(code)
}

/// Damage a repair cannot fix (the superblock): exit 1.
fn unrepairable(a: &CheckArgs, msg: String) -> ExitCode {
    if a.json {
        let v = serde_json::json!({"device": a.device().display().to_string(), "ok": false,
            "exit_code": 1, "error": msg});
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        eprintln!("error: {msg}");
    }
    ExitCode::from(1)
}

fn fail(a: &CheckArgs, msg: String) -> ExitCode {
    if a.json {
        let v = serde_json::json!({"device": a.device().display().to_string(), "ok": false,
            "exit_code": 2, "error": msg});
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        eprintln!("error: {msg}");
    }
    ExitCode::from(2)
}

fn print_text(a: &CheckArgs, r: &CheckReport) {
    println!(
        "device        {} ({} bytes)",
        a.device().display(),
        r.device_bytes
    );
    if r.version > 0 {
        println!(
            "superblock    version {}, uuid {}, generation {}, {}",
            r.version,
            r.uuid,
            r.generation,
            if r.clean {
                "clean shutdown"
            } else {
                "not cleanly stopped (in use, or crashed)"
            }
        );
        println!(
            "layout        {} lines of {} bytes, mode {}, policy {}",
            r.capacity_lines, r.line_size, r.mode, r.policy
        );
        if r.volumes.is_empty() {
            println!(
                "backing       {} bytes{}",
                r.backing_size,
                if r.backing_id.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.backing_id)
                }
            );
        } else {
            // A cache of several volumes: each volume's backing device as recorded (the
            // check reads the cache device only; `serve` checks each identity at start).
            println!("volumes       {} in the volume table", r.volumes.len());
            for v in &r.volumes {
                println!(
                    "volume {:<12} id {}, backing {} bytes ({}), {} lines cached, {} dirty",
                    v.name, v.id, v.size, v.backing, v.lines, v.dirty_lines
                );
            }
        }
        println!(
            "mapping       {} lines cached, {} dirty ({} bytes), {} empty slots",
            r.lines, r.dirty_lines, r.dirty_bytes, r.empty_slots
        );
        if r.torn_records + r.superseded_records > 0 {
            println!(
                "after a crash {} torn records (dropped at open), {} superseded duplicates (older seq ignored)",
                r.torn_records, r.superseded_records
            );
        }
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    for p in &r.problems {
        println!("PROBLEM: {p}");
    }
    if r.problem_count as usize > r.problems.len() {
        println!(
            "... and {} more problems",
            r.problem_count as usize - r.problems.len()
        );
    }
    if r.ok() {
        println!("result        consistent");
    } else {
        println!("result        {} inconsistencies found", r.problem_count);
    }
}

impl CheckArgs {
    /// The one device checked (DEVICE, or the one --cache).
    fn device(&self) -> &std::path::Path {
        match (&self.device, self.cache.first()) {
            (Some(d), _) => d,
            (None, Some(c)) => c,
            (None, None) => unreachable!("clap requires DEVICE or --cache"),
        }
    }
}

/// `check --cache A --cache B ...`: a pool (`tiercache_server::check::check_pool`).
fn run_pool(a: &CheckArgs) -> ExitCode {
    let mut devs = Vec::new();
    for p in &a.cache {
        match FileDev::open_read_only(p) {
            Ok(d) => devs.push((
                p.display().to_string(),
                Box::new(d) as Box<dyn tiercache_server::BlockDev>,
            )),
            Err(e) => return fail(a, format!("cannot open: {e}")),
        }
    }
    let names: Vec<String> = a.cache.iter().map(|p| p.display().to_string()).collect();
    let rep = match check_pool(devs) {
        Ok(r) => r,
        Err(e) => return fail(a, format!("{}: {e}", names.join(", "))),
    };
    let code = if rep.ok() { 0 } else { 1 };
    if a.json {
        let mut v = serde_json::to_value(&rep).expect("report serializes");
        v["devices"] = names.into();
        v["ok"] = rep.ok().into();
        v["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return ExitCode::from(code);
    }
    println!(
        "pool          {} (generation {}), {} members, {} dirty copies",
        rep.pool,
        rep.generation,
        rep.members.len(),
        rep.dirty_copies
    );
    for m in &rep.members {
        match m.index {
            Some(d) => println!(
                "member {d}      {} ({}), uuid {}, {} lines, pool block generation {}",
                if m.name.is_empty() { "-" } else { &m.name },
                m.state,
                m.uuid,
                m.lines,
                m.generation
            ),
            None => println!("member ?      {} ({})", m.name, m.state),
        }
    }
    if let Some(r) = &rep.records {
        println!(
            "mapping       {} lines cached, {} dirty ({} bytes), {} empty slots, {}",
            r.lines,
            r.dirty_lines,
            r.dirty_bytes,
            r.empty_slots,
            if r.clean {
                "clean shutdown"
            } else {
                "not cleanly stopped (in use, or crashed)"
            }
        );
    }
    println!(
        "copies        {} primaries, {} paired copies, {} to resync, {} promoted, {} dropped; {} dirty lines without a copy",
        rep.primaries, rep.paired, rep.resync, rep.promoted, rep.dropped, rep.unmirrored
    );
    let (notes, problems): (Vec<&String>, Vec<&String>) = match &rep.records {
        Some(r) => (
            rep.notes.iter().chain(&r.notes).collect(),
            rep.problems.iter().chain(&r.problems).collect(),
        ),
        None => (rep.notes.iter().collect(), rep.problems.iter().collect()),
    };
    for n in notes {
        println!("note: {n}");
    }
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    let count = rep.problem_count + rep.records.as_ref().map_or(0, |r| r.problem_count);
    if count as usize > problems.len() {
        println!("... and {} more problems", count as usize - problems.len());
    }
    if rep.ok() {
        println!("result        consistent");
    } else {
        println!("result        {count} inconsistencies found");
    }
    ExitCode::from(code)
}
