//! The class side of `tiercache serve` and `tiercache ctl stats` (issue 7): loading the class
//! table and rules (`tiercache_server::open_live` attaches the classifier), printing per-class statistics.

use anyhow::{anyhow, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::ClassTable;
use tiercache_server::classify::table_from_text;

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
    let f = read_files(
        classes.as_deref(),
        rules.as_deref(),
        ("--classes", "--class-rules"),
    )?;
    Ok(Some(Arc::new(f.table)))
}

/// A class table read from its files, with the texts it was parsed from (`ctl classes load`
/// sends them to the server, which parses them again by the same function).
pub struct TableFiles {
    pub table: ClassTable,
    /// (text, file name) of the table file; `None`: the built-in file-system table.
    pub table_text: Option<(String, String)>,
    /// (text, file name) of the rules file.
    pub rules_text: Option<(String, String)>,
}

/// Reads and checks a class table file (`None`: the built-in file-system table) and a rules
/// file replacing its rules, as `serve --classes --class-rules` and `ctl classes load FILE
/// --rules RULES` take them; errors name the flag, the file and the line. Both use
/// `tiercache_server::classify::table_from_text`, as the server does for `ctl classes load`.
pub fn read_files(
    classes: Option<&Path>,
    rules: Option<&Path>,
    flags: (&str, &str),
) -> Result<TableFiles> {
    let read = |p: &Path, flag: &str| -> Result<(String, String)> {
        let name = p.display().to_string();
        let text = std::fs::read_to_string(p).map_err(|e| anyhow!("{flag}: {name}: {e}"))?;
        Ok((text, name))
    };
    let table_text = classes.map(|p| read(p, flags.0)).transpose()?;
    let rules_text = rules.map(|p| read(p, flags.1)).transpose()?;
    let rules_ref = rules_text.as_ref().map(|(t, f)| (t.as_str(), f.as_str()));
    let table = match &table_text {
        Some((t, f)) => table_from_text((t, f), None).map_err(|e| anyhow!("{}: {e}", flags.0))?,
        None => ClassTable::filesystem(),
    };
    let table = match rules_ref {
        Some((t, f)) => {
            let mut table = table;
            table
                .parse_rules(t, f)
                .map_err(|e| anyhow!("{}: {e}", flags.1))?;
            table
        }
        None => table,
    };
    Ok(TableFiles {
        table,
        table_text,
        rules_text,
    })
}

/// Prints the per-class table of `ctl stats` from the `classes` array; false when the server
/// sent none (an older server).
pub fn print_class_stats(s: &serde_json::Value) -> bool {
    let Some(classes) = s["classes"].as_array() else {
        return false;
    };
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    if let Some(c) = s.get("classifier").filter(|c| !c.is_null()) {
        // Several volumes: one classifier each, under `volumes`.
        let per: Vec<(String, &serde_json::Value)> = match c["volumes"].as_object() {
            Some(m) => m
                .iter()
                .map(|(k, v)| (format!(" (volume {k})"), v))
                .collect(),
            None => vec![(String::new(), c)],
        };
        for (vol, c) in per {
            let name = c["name"].as_str().unwrap_or("?");
            if name == "ext4" {
                println!(
                    "classifier      ext4{vol}: {} ({} inodes, {} extents, {} bytes); requests by ext4 {}, by fallback {}",
                    if c["ext4_found"] == true { "ext4 found" } else { "no ext4 seen" },
                    n(&c["inodes"]),
                    n(&c["extents"]),
                    n(&c["memory_bytes"]),
                    n(&c["requests_by_ext4"]),
                    n(&c["requests_by_fallback"])
                );
            } else {
                println!("classifier      {name}{vol}");
            }
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
