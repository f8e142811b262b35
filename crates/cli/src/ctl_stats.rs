//! `tiercache ctl stats` laid out as Open CAS's `casadm -P` (what its users read first):
//! requests by direction and outcome, pass-through, blocks, usage and errors, and `--csv`
//! with one `section,name,value,unit` row per figure.

use serde_json::Value;

/// One figure: section, name, value, unit.
type Row = (&'static str, String, f64, &'static str);

fn n(x: &Value) -> u64 {
    x.as_u64().unwrap_or(0)
}

/// The casadm-style figures of one set of counters (`totals`, or one class's).
fn counter_rows(section: &'static str, c: &Value, out: &mut Vec<Row>) {
    let reads = n(&c["reads"]);
    let writes = n(&c["writes"]);
    let rw = reads + writes;
    let pct = |x: u64, of: u64| {
        if of > 0 {
            100.0 * x as f64 / of as f64
        } else {
            0.0
        }
    };
    // The per-direction table gets its own section in the totals (one line per outcome with
    // its share); a class keeps its rows in its own section.
    let dir_section = if section == "requests" {
        "requests by direction"
    } else {
        section
    };
    let mut push = |name: String, v: f64, unit: &'static str| out.push((section, name, v, unit));
    // Requests: whole, partly and not served by the cache (casadm's hits, partial misses and
    // full misses; the engine counts them over reads and writes together).
    for (name, v) in [
        (
            "requests served whole by the cache (hits)",
            n(&c["full_hits"]),
        ),
        (
            "requests partly served (partial misses)",
            n(&c["partial_hits"]),
        ),
        ("requests not served (full misses)", n(&c["full_misses"])),
    ] {
        push(name.into(), v as f64, "requests");
        push(format!("{name} %"), pct(v, rw), "%");
    }
    // Per direction (casadm's read/write request table): hits, partial misses, full misses,
    // pass-through and total, each with its share of the direction's requests.
    let mut dir_rows: Vec<Row> = Vec::new();
    for dir in ["read", "write"] {
        let d = &c[format!("{dir}_requests")];
        let total = n(&c[if dir == "read" { "reads" } else { "writes" }]);
        for (name, k) in [
            ("hits", "hits"),
            ("partial misses", "partial_misses"),
            ("full misses", "full_misses"),
            ("pass-through", "pass_through"),
        ] {
            let v = n(&d[k]);
            dir_rows.push((dir_section, format!("{dir} {name}"), v as f64, "requests"));
            dir_rows.push((dir_section, format!("{dir} {name} %"), pct(v, total), "%"));
        }
        dir_rows.push((
            dir_section,
            format!("{dir} total"),
            total as f64,
            "requests",
        ));
    }
    push("read requests".into(), reads as f64, "requests");
    push("write requests".into(), writes as f64, "requests");
    push("trim requests".into(), n(&c["trims"]) as f64, "requests");
    push("flush requests".into(), n(&c["flushes"]) as f64, "requests");
    // Lines (casadm's 4 KiB blocks): read and write hits and misses.
    let (rh, ra) = (n(&c["read_line_hits"]), n(&c["read_line_accesses"]));
    let (wh, wa) = (n(&c["write_line_hits"]), n(&c["write_line_accesses"]));
    for (dir, hits, accesses) in [("read", rh, ra), ("write", wh, wa)] {
        push(format!("{dir} line hits"), hits as f64, "lines");
        let misses = accesses.saturating_sub(hits);
        push(format!("{dir} line misses"), misses as f64, "lines");
        push(format!("{dir} hit ratio"), pct(hits, accesses), "%");
    }
    // Pass-through: missed lines that went around the cache, and why.
    let b = &c["bypasses"];
    let bypassed: u64 = [
        "admission",
        "seq_cutoff",
        "mode",
        "partial_write",
        "no_capacity",
        "class",
    ]
    .iter()
    .map(|k| n(&b[*k]))
    .sum();
    push("pass-through lines".into(), bypassed as f64, "lines");
    for k in [
        "admission",
        "seq_cutoff",
        "mode",
        "partial_write",
        "no_capacity",
        "class",
    ] {
        push(format!("pass-through: {k}"), n(&b[k]) as f64, "lines");
    }
    // Blocks: bytes to and from each device.
    for (name, k) in [
        ("reads from core (backing)", "hdd_bytes_read"),
        ("writes to core (backing)", "hdd_bytes_written"),
        ("reads from cache", "ssd_bytes_read"),
        ("writes to cache", "ssd_bytes_written"),
        ("reads from exported object", "read_bytes"),
        ("writes to exported object", "write_bytes"),
    ] {
        push(name.into(), n(&c[k]) as f64, "bytes");
    }
    push("evictions".into(), n(&c["evictions"]) as f64, "lines");
    push("write-backs".into(), n(&c["write_backs"]) as f64, "lines");
    out.extend(dir_rows);
}

/// Every figure of a `stats` reply (either layout).
fn rows(s: &Value) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    let cap = n(&s["capacity_lines"]);
    let cached = n(&s["cached_lines"]);
    let dirty = n(&s["dirty_lines"]);
    let ls = n(&s["line_size"]);
    let pct = |x: u64| {
        if cap > 0 {
            100.0 * x as f64 / cap as f64
        } else {
            0.0
        }
    };
    for (name, v, unit) in [
        ("cache size", cap, "lines"),
        ("line size", ls, "bytes"),
        ("occupancy", cached, "lines"),
        ("free", cap.saturating_sub(cached), "lines"),
        ("clean", cached.saturating_sub(dirty), "lines"),
        ("dirty", dirty, "lines"),
    ] {
        out.push(("usage", name.into(), v as f64, unit));
        if name != "cache size" && name != "line size" {
            out.push(("usage", format!("{name} %"), pct(v), "%"));
        }
    }
    counter_rows("requests", &s["totals"], &mut out);
    for (name, k) in [
        ("cache device errors", "cache_errors"),
        ("core (backing) device errors", "backing_errors"),
        ("failed write-backs", "backing_write_errors"),
        ("failed backing syncs", "backing_sync_errors"),
        ("lost dirty bytes", "lost_dirty_bytes"),
        ("lost ranges", "lost_ranges"),
    ] {
        out.push(("errors", name.into(), n(&s[k]) as f64, "count"));
    }
    out
}

/// casadm -P's sections as text, after the summary `ctl stats` prints.
pub fn print_breakdown(s: &Value) {
    let all = rows(s);
    let mut section = "";
    for (i, (sec, name, v, unit)) in all.iter().enumerate() {
        if *sec != section {
            section = sec;
            println!("\n{:<48} {:>16} {:<8}", format!("[{sec}]"), "value", "unit");
        }
        if *sec == "requests by direction" {
            // casadm's request table: count and share on one line.
            if *unit == "%" {
                continue;
            }
            match all.get(i + 1).filter(|r| r.1 == format!("{name} %")) {
                Some(p) => println!("{name:<48} {:>16} {unit:<8} {:>6.1} %", *v as u64, p.2),
                None => println!("{name:<48} {:>16} {unit}", *v as u64),
            }
            continue;
        }
        if *unit == "%" {
            println!("{name:<48} {v:>16.1} %");
        } else {
            println!("{name:<48} {:>16} {unit}", *v as u64);
        }
    }
    // Per volume (casadm -P per core device), labelled with the volume's name: the served
    // volume, or each of several (`serve --volume`).
    println!("\n[per volume]");
    match s["volumes"].as_array().filter(|v| !v.is_empty()) {
        Some(vols) => {
            for v in vols {
                summary_line(
                    &format!("volume {}", v["name"].as_str().unwrap_or("?")),
                    &v["counters"],
                );
            }
        }
        None => summary_line(&format!("volume {}", volume_name(s)), &s["totals"]),
    }
    // Per class: the same request figures (casadm's per-IO-class statistics, `-d`).
    for pc in s["per_class"].as_array().into_iter().flatten() {
        summary_line(&format!("class {:<3}", n(&pc[0])), &pc[1]);
    }
}

/// The served volume's name (its backing device; `?` from a server before it was sent).
fn volume_name(s: &Value) -> &str {
    s["volume_name"].as_str().unwrap_or("?")
}

/// One line of requests and outcomes for a volume or a class.
fn summary_line(label: &str, c: &Value) {
    let mut out = Vec::new();
    counter_rows("class", c, &mut out);
    let pick = |want: &str| out.iter().find(|r| r.1 == want).map(|r| r.2).unwrap_or(0.0);
    println!(
        "{label} {:>10} requests, hits {:.1} %, partial misses {:.1} %, full misses {:.1} %, pass-through {} lines",
        n(&c["reads"]) + n(&c["writes"]),
        pick("requests served whole by the cache (hits) %"),
        pick("requests partly served (partial misses) %"),
        pick("requests not served (full misses) %"),
        pick("pass-through lines") as u64
    );
}

/// `ctl stats --csv`: `section,name,value,unit`, one row per figure (per class too).
pub fn print_csv(s: &Value) {
    println!("section,name,value,unit");
    let mut all = rows(s);
    // Per volume (the served one, or each of several): its rows are named after it, as a
    // class's are.
    let vols: Vec<(&str, &Value)> = match s["volumes"].as_array().filter(|v| !v.is_empty()) {
        Some(vs) => vs
            .iter()
            .map(|v| (v["name"].as_str().unwrap_or("?"), &v["counters"]))
            .collect(),
        None => vec![(volume_name(s), &s["totals"])],
    };
    for (vol, c) in vols {
        let mut out = Vec::new();
        counter_rows("volume", c, &mut out);
        all.extend(
            out.into_iter()
                .map(|(_, name, v, u)| ("volume", format!("volume {vol}: {name}"), v, u)),
        );
    }
    for pc in s["per_class"].as_array().into_iter().flatten() {
        let mut out = Vec::new();
        counter_rows("class", &pc[1], &mut out);
        let class = n(&pc[0]);
        all.extend(
            out.into_iter()
                .map(|(_, name, v, u)| ("class", format!("class {class}: {name}"), v, u)),
        );
    }
    for (sec, name, v, unit) in all {
        let v = if unit == "%" {
            format!("{v:.3}")
        } else {
            format!("{}", v as u64)
        };
        println!("{sec},\"{}\",{v},{unit}", name.replace('"', "\"\""));
    }
}

/// One volume's lost ranges (offsets within it) as text: `bytes X..Y, ...`, or `nothing`.
fn lost_text(v: &Value) -> String {
    let r: Vec<String> = v["lost_ranges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| format!("bytes {}..{}", n(&r[0]), n(&r[1])))
        .collect();
    if r.is_empty() {
        "nothing".into()
    } else {
        r.join(", ")
    }
}

/// `ctl stats` of a server of several volumes: one line per volume (name, backing, mode,
/// requests, hits, dirty, lost). Prints nothing for a server of one volume.
pub fn print_volume_table(s: &Value) {
    let Some(vols) = s["volumes"].as_array().filter(|v| !v.is_empty()) else {
        return;
    };
    println!(
        "\n{:<16} {:<32} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10}  lost",
        "volume", "backing", "mode", "reads", "writes", "hits", "cached", "dirty"
    );
    for v in vols {
        let c = &v["counters"];
        println!(
            "{:<16} {:<32} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
            v["name"].as_str().unwrap_or("?"),
            v["backing"].as_str().unwrap_or("?"),
            v["mode"].as_str().unwrap_or("?"),
            n(&c["reads"]),
            n(&c["writes"]),
            n(&c["full_hits"]),
            n(&v["cached_lines"]),
            n(&v["dirty_lines"]),
            lost_text(v)
        );
    }
}

/// `ctl --volume NAME stats`: one volume's figures (`v`), its settings in force (`settings`:
/// `[key, value]` pairs) and its share of the pool (`pool`: the pool's stats).
pub fn print_volume(v: &Value, settings: &Value, pool: &Value) {
    let c = &v["counters"];
    let set = |k: &str| {
        settings
            .as_array()
            .into_iter()
            .flatten()
            .find(|kv| kv[0] == k)
            .and_then(|kv| kv[1].as_str())
            .unwrap_or("?")
            .to_string()
    };
    let cap = n(&pool["capacity_lines"]).max(1);
    println!(
        "volume          {} (id {}), {} bytes",
        v["name"].as_str().unwrap_or("?"),
        n(&v["id"]),
        n(&v["size"])
    );
    println!("backing         {}", v["backing"].as_str().unwrap_or("?"));
    println!("mode            {}", v["mode"].as_str().unwrap_or("?"));
    println!(
        "settings        admission {}, seq-cutoff {} read / {} write (the rest are the pool's: `ctl get`)",
        set("admission"),
        set("seq-cutoff"),
        set("seq-cutoff-write")
    );
    println!(
        "occupancy       {} of the pool's {} lines ({:.1} %), {} dirty",
        n(&v["cached_lines"]),
        cap,
        100.0 * n(&v["cached_lines"]) as f64 / cap as f64,
        n(&v["dirty_lines"])
    );
    let (rh, ra) = (n(&c["read_line_hits"]), n(&c["read_line_accesses"]));
    println!(
        "requests        {} reads, {} writes; {} served whole by the cache, read line hit ratio {:.1} %",
        n(&c["reads"]),
        n(&c["writes"]),
        n(&c["full_hits"]),
        if ra > 0 { 100.0 * rh as f64 / ra as f64 } else { 0.0 }
    );
    println!("lost            {}", lost_text(v));
    println!("\n[per volume]");
    summary_line(&format!("volume {}", v["name"].as_str().unwrap_or("?")), c);
}

/// `ctl --volume NAME stats --csv`: the volume's figures as `section,name,value,unit` rows.
pub fn print_volume_csv(v: &Value) {
    println!("section,name,value,unit");
    let mut out = Vec::new();
    for (name, k) in [("cached", "cached_lines"), ("dirty", "dirty_lines")] {
        out.push(("usage", name.to_string(), n(&v[k]) as f64, "lines"));
    }
    counter_rows("requests", &v["counters"], &mut out);
    for (sec, name, x, unit) in out {
        let x = if unit == "%" {
            format!("{x:.3}")
        } else {
            format!("{}", x as u64)
        };
        println!("{sec},\"{}\",{x},{unit}", name.replace('"', "\"\""));
    }
}
