//! `tiercache check DEVICE`: offline consistency check of a cache device (superblock,
//! metadata checksums, mapping; for the log layout: recovery, indices and an extent scrub). Exit codes: 0 consistent, 1 inconsistencies found, 2 the
//! device cannot be read or is not a tiercache cache device.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use tiercache_server::check::{check_device, CheckReport};
use tiercache_server::log_check::check_log_device;
use tiercache_server::FileDev;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The cache device or file (as given to `tiercache format --cache`); opened read-only.
    pub device: PathBuf,
    /// Print the report as JSON (with "ok" and "exit_code").
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CheckArgs) -> ExitCode {
    let dev = match FileDev::open_read_only(&a.device) {
        Ok(d) => d,
        Err(e) => return fail(&a, format!("cannot open: {e}")),
    };
    match tiercache_server::read_log_superblock(&dev) {
        Ok(Some(_)) => return run_log(&a, dev),
        Ok(None) => {}
        Err(e) => return fail(&a, format!("{}: {e}", a.device.display())),
    }
    let rep = match check_device(&dev) {
        Ok(r) => r,
        Err(e) => return fail(&a, format!("{}: {e}", a.device.display())),
    };
    let code = if rep.ok() { 0 } else { 1 };
    if a.json {
        let mut v = serde_json::to_value(&rep).expect("report serializes");
        v["device"] = a.device.display().to_string().into();
        v["ok"] = rep.ok().into();
        v["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        print_text(&a, &rep);
    }
    ExitCode::from(code)
}

/// A log-layout device: recovery on a copy-on-write view, index invariants, extent scrub.
fn run_log(a: &CheckArgs, dev: FileDev) -> ExitCode {
    let r = match check_log_device(Box::new(dev)) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                a,
                format!(
                    "{}: recovery of the log layout fails: {e}",
                    a.device.display()
                ),
            )
        }
    };
    let code = if r.ok() { 0 } else { 1 };
    if a.json {
        let mut v = serde_json::to_value(&r).expect("report serializes");
        v["device"] = a.device.display().to_string().into();
        v["ok"] = r.ok().into();
        v["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return ExitCode::from(code);
    }
    let (rec, sc) = (&r.recovery, &r.scrub);
    println!(
        "device        {} ({} bytes), log layout",
        a.device.display(),
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
    println!(
        "mapping       {} lines cached, {} dirty, {} stored extents scrubbed",
        sc.lines, sc.dirty_lines, sc.extents
    );
    for p in r.index_problems.iter().chain(&sc.problems) {
        println!("PROBLEM: {p}");
    }
    if r.ok() {
        println!("result        consistent");
    } else {
        println!(
            "result        {} inconsistencies found ({} bad extents, {} dirty lines lost)",
            r.index_problems.len() + sc.problems.len(),
            sc.bad_extents,
            sc.lost_lines
        );
    }
    ExitCode::from(code)
}

fn fail(a: &CheckArgs, msg: String) -> ExitCode {
    if a.json {
        let v = serde_json::json!({"device": a.device.display().to_string(), "ok": false,
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
        a.device.display(),
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
        println!(
            "backing       {} bytes{}",
            r.backing_size,
            if r.backing_id.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.backing_id)
            }
        );
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
