//! The class side of `tiercache serve` and `tiercache ctl stats` (issue 7): loading the class
//! table and rules, attaching the live classifier, printing per-class statistics.

use anyhow::{anyhow, Result};
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_engine::ClassTable;
use tiercache_server::CacheVolume;

/// The table of `--classes` (default: the built-in file-system table), with `--class-rules`;
/// `None` when no class option is given at all (statistics then name classes by id, as
/// before; `--policy dss` still uses the built-in file-system table).
pub fn table(
    classes: &Option<PathBuf>,
    rules: &Option<PathBuf>,
    classifier: Option<&str>,
) -> Result<Option<Arc<ClassTable>>> {
    if classes.is_none() && rules.is_none() && classifier.is_none_or(|c| c == "none") {
        return Ok(None);
    }
    let mut t = match classes {
        Some(p) => ClassTable::load(p).map_err(|e| anyhow!("--classes: {e}"))?,
        None => ClassTable::filesystem(),
    };
    if let Some(p) = rules {
        t.load_rules(p).map_err(|e| anyhow!("--class-rules: {e}"))?;
    }
    Ok(Some(Arc::new(t)))
}

/// Hooks the `--classifier` (default none) into the volume and says what it found.
pub fn attach(
    vol: &mut CacheVolume,
    classifier: Option<&str>,
    table: Option<Arc<ClassTable>>,
) -> Result<()> {
    let name = classifier.unwrap_or("none");
    let Some(table) = table else {
        return Ok(());
    };
    let t = std::time::Instant::now();
    let tname = table.name.clone();
    let summary = tiercache_server::classify::attach(vol, name, table).map_err(|e| anyhow!(e))?;
    if let Some(s) = summary {
        let extra = match name {
            "ext4" if s["ext4_found"] == true => format!(
                ": ext4 found, {} inodes and {} extents learned in {:.2} s",
                s["inodes"],
                s["extents"],
                t.elapsed().as_secs_f64()
            ),
            "ext4" => ": no ext4 file system yet (learns it when one is written; rules meanwhile)"
                .to_string(),
            _ => String::new(),
        };
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("classifier {name} over class table {tname:?}{extra}\n"),
        );
    }
    Ok(())
}

/// Prints the per-class table of `ctl stats` from the `classes` array; false when the server
/// sent none (an older server).
pub fn print_class_stats(s: &serde_json::Value) -> bool {
    let Some(classes) = s["classes"].as_array() else {
        return false;
    };
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    if let Some(c) = s.get("classifier").filter(|c| !c.is_null()) {
        let name = c["name"].as_str().unwrap_or("?");
        if name == "ext4" {
            println!(
                "classifier      ext4: {} ({} inodes, {} extents, {} bytes); requests by ext4 {}, by fallback {}",
                if c["ext4_found"] == true { "ext4 found" } else { "no ext4 seen" },
                n(&c["inodes"]),
                n(&c["extents"]),
                n(&c["memory_bytes"]),
                n(&c["requests_by_ext4"]),
                n(&c["requests_by_fallback"])
            );
        } else {
            println!("classifier      {name}");
        }
    }
    println!(
        "{:<4} {:<13} {:>10} {:>12} {:>12} {:>7} {:>10} {:>10} {:>10} {:>8}",
        "id",
        "class",
        "requests",
        "line hits",
        "line misses",
        "hit %",
        "bypasses",
        "evictions",
        "cached",
        "dirty"
    );
    for c in classes {
        let k = &c["counters"];
        let (h, m) = (n(&k["line_hits"]), n(&k["line_misses"]));
        println!(
            "{:<4} {:<13} {:>10} {:>12} {:>12} {:>7.2} {:>10} {:>10} {:>10} {:>8}",
            n(&c["id"]),
            c["name"].as_str().unwrap_or("?"),
            n(&k["requests"]),
            h,
            m,
            100.0 * h as f64 / (h + m).max(1) as f64,
            m.saturating_sub(n(&k["admitted_misses"])),
            n(&k["evictions"]),
            n(&c["cached_lines"]),
            n(&c["dirty_lines"])
        );
    }
    true
}
