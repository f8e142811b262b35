//! `tiercache report`: one self-contained HTML page (inline SVG, no script, no network) from
//! sweep CSV files and run JSON files.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(after_help = "Inputs:
  *.csv    sweep results (`tiercache sweep --out r.csv`, or a DataFrame from the Python
           sweep written with to_csv): hit ratio vs cache size, one line per policy, one
           plot per input and write mode
  *.json   run results (`tiercache sim --json`, timed with --hdd/--ssd, or an array from
           `tiercache sweep --json`): warm-up curves (IOPS and hit ratio over time), latency
           CDFs, cost per MB per IOPS, per-class occupancy, and a summary table
Example:
  tiercache sweep --trace t.csv --sizes 1%,5%,10% --policies lru,arc --out sweep.csv
  tiercache sim --trace t.csv --cache-size 10% --hdd 7200 --json > run.json
  tiercache report sweep.csv run.json -o report.html")]
pub struct ReportArgs {
    /// Result files (.csv sweeps, .json runs).
    #[arg(required = true, value_name = "RESULTS")]
    pub results: Vec<PathBuf>,
    /// Output HTML file.
    #[arg(long, short = 'o', value_name = "FILE", default_value = "report.html")]
    pub out: PathBuf,
    /// Page title.
    #[arg(long, default_value = "tiercache report")]
    pub title: String,
}

pub fn run(a: ReportArgs) -> Result<()> {
    let mut rep = Report::new(&a.title);
    for p in &a.results {
        rep.add_file(p)?;
    }
    let html = rep.html();
    std::fs::write(&a.out, html).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "wrote {} ({} plots from {} files)",
        a.out.display(),
        rep.plot_count(),
        a.results.len()
    );
    Ok(())
}

/// One point of a hit-ratio curve.
#[derive(Clone, Debug)]
struct SizePoint {
    bytes: f64,
    hit_ratio: f64,
}

/// The report being built.
pub struct Report {
    title: String,
    /// (input, mode) -> policy -> points.
    curves: BTreeMap<(String, String), BTreeMap<String, Vec<SizePoint>>>,
    /// Free-form sections (title, HTML) added by callers such as `reproduce`.
    extra: Vec<(String, String)>,
    /// Timed runs: label and JSON.
    timed: Vec<(String, Value)>,
    /// Summary rows: label and columns.
    rows: Vec<(String, Value)>,
    sources: Vec<String>,
}

impl Report {
    pub fn new(title: &str) -> Self {
        Report {
            title: title.to_string(),
            curves: BTreeMap::new(),
            extra: Vec::new(),
            timed: Vec::new(),
            rows: Vec::new(),
            sources: Vec::new(),
        }
    }

    /// Reads one result file by its extension.
    pub fn add_file(&mut self, p: &Path) -> Result<()> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        match p.extension().and_then(|e| e.to_str()) {
            Some("csv") => self
                .add_csv(&text)
                .with_context(|| p.display().to_string())?,
            Some("json") => {
                let v: Value = serde_json::from_str(&text)
                    .with_context(|| format!("{}: not JSON", p.display()))?;
                self.add_json(&v).with_context(|| p.display().to_string())?
            }
            _ => bail!(
                "{}: unknown result file type (give .csv sweep results or .json run results)",
                p.display()
            ),
        }
        self.sources.push(p.display().to_string());
        Ok(())
    }

    /// Sweep rows: needs `input` (or `trace`), `policy`, `hit_ratio`, and `capacity_bytes` or
    /// `capacity_lines` with `line_size`.
    pub fn add_csv(&mut self, text: &str) -> Result<()> {
        let mut rd = csv::Reader::from_reader(text.as_bytes());
        let headers = rd.headers()?.clone();
        let col = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| headers.iter().position(|h| h == *n))
        };
        let input = col(&["input", "trace"]).context("no `input` column")?;
        // The Python sweep keeps grid values under their names and the result's own under
        // `result_<name>`.
        let policy = col(&["result_policy", "policy"]).context("no `policy` column")?;
        let mode = col(&["result_mode", "mode"]);
        let hit = col(&["hit_ratio"]).context("no `hit_ratio` column")?;
        let cap_bytes = col(&["capacity_bytes"]);
        let cap_lines = col(&["capacity_lines"]);
        let line_size = col(&["result_line_size", "line_size"]);
        for (i, rec) in rd.records().enumerate() {
            let rec = rec?;
            let line = i + 2;
            let num = |c: usize| -> Result<f64> {
                rec.get(c)
                    .unwrap_or("")
                    .parse::<f64>()
                    .with_context(|| format!("line {line}: column {} is not a number", &headers[c]))
            };
            let bytes = match (cap_bytes, cap_lines, line_size) {
                (Some(b), _, _) => num(b)?,
                (None, Some(l), Some(s)) => num(l)? * num(s)?,
                _ => bail!("no `capacity_bytes` (or `capacity_lines` and `line_size`) column"),
            };
            let key = (
                rec[input].to_string(),
                mode.map(|m| rec[m].to_string()).unwrap_or_default(),
            );
            self.curves
                .entry(key)
                .or_default()
                .entry(rec[policy].to_string())
                .or_default()
                .push(SizePoint {
                    bytes,
                    hit_ratio: num(hit)?,
                });
        }
        Ok(())
    }

    /// A run result object, or an array of them.
    pub fn add_json(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::Array(a) => a.iter().try_for_each(|x| self.add_json(x)),
            Value::Object(o) => {
                anyhow::ensure!(
                    o.contains_key("hit_ratio"),
                    "not a run result (no `hit_ratio` field)"
                );
                let label = run_label(v);
                if o.contains_key("iops") {
                    self.timed.push((label.clone(), v.clone()));
                } else if no_cache(v) {
                    // No cache, no hit ratio to plot against a size: the summary has the run.
                } else if let (Some(b), Some(h)) =
                    (v["capacity_bytes"].as_f64(), v["hit_ratio"].as_f64())
                {
                    let key = (s(&v["input"]), s(&v["mode"]));
                    self.curves
                        .entry(key)
                        .or_default()
                        .entry(s(&v["policy"]))
                        .or_default()
                        .push(SizePoint {
                            bytes: b,
                            hit_ratio: h,
                        });
                }
                self.rows.push((label, v.clone()));
                Ok(())
            }
            _ => bail!("expected a run result object or an array of them"),
        }
    }

    /// Adds a free-form section (already HTML; callers escape their text with [`esc`]).
    pub fn add_section(&mut self, title: &str, html: String) {
        self.extra.push((title.to_string(), html));
    }

    pub fn plot_count(&self) -> usize {
        self.plots().len()
    }

    /// Every plot: (title, SVG).
    fn plots(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for ((input, mode), by_policy) in &self.curves {
            let what = format!(
                "{input}{}",
                if mode.is_empty() {
                    String::new()
                } else {
                    format!(" ({mode})")
                }
            );
            let mut sizes: Vec<f64> = by_policy.values().flatten().map(|q| q.bytes).collect();
            sizes.sort_by(f64::total_cmp);
            sizes.dedup();
            if let [size] = sizes[..] {
                // One size (a single run, or a sweep of one size): a curve would be one
                // point, so the policies are bars.
                let title = format!("Hit ratio at {} MiB: {what}", sig(size / 1048576.0));
                let bars: Vec<(String, f64)> = by_policy
                    .iter()
                    .flat_map(|(p, pts)| pts.iter().map(move |q| (p.clone(), q.hit_ratio)))
                    .collect();
                out.push((title.clone(), bar_chart(&title, "hit ratio", &bars)));
                continue;
            }
            let title = format!("Hit ratio vs cache size: {what}");
            let series = by_policy
                .iter()
                .map(|(p, pts)| {
                    let mut v: Vec<(f64, f64)> = pts
                        .iter()
                        .map(|q| (q.bytes / 1048576.0, q.hit_ratio))
                        .collect();
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    (p.clone(), v)
                })
                .collect();
            out.push((
                title.clone(),
                line_chart(
                    &title,
                    "cache size (MiB)",
                    "hit ratio",
                    series,
                    false,
                    Some((0.0, 1.0)),
                ),
            ));
        }
        for (label, v) in &self.timed {
            let series = v["series"].as_array().cloned().unwrap_or_default();
            if series.is_empty() {
                continue;
            }
            let pts = |f: &str| -> Vec<(f64, f64)> {
                series
                    .iter()
                    .filter_map(|w| Some((w["t_s"].as_f64()?, w[f].as_f64()?)))
                    .collect()
            };
            let title = format!("Warm-up (IOPS over time): {label}");
            out.push((
                title.clone(),
                line_chart(
                    &title,
                    "simulated time (s)",
                    "IOPS",
                    vec![("IOPS".into(), pts("iops"))],
                    false,
                    None,
                ),
            ));
            if no_cache(v) {
                continue; // no hit ratio, no cached lines: no empty plots
            }
            let title = format!("Warm-up (hit ratio over time): {label}");
            out.push((
                title.clone(),
                line_chart(
                    &title,
                    "simulated time (s)",
                    "hit ratio",
                    vec![("hit ratio".into(), pts("hit_ratio"))],
                    false,
                    Some((0.0, 1.0)),
                ),
            ));
            let mut classes: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for w in &series {
                let t = w["t_s"].as_f64().unwrap_or(0.0);
                if let Some(m) = w["class_lines"].as_object() {
                    for (c, n) in m {
                        classes
                            .entry(format!("class {c}"))
                            .or_default()
                            .push((t, n.as_f64().unwrap_or(0.0)));
                    }
                }
            }
            if !classes.is_empty() {
                let title = format!("Per-class occupancy over time: {label}");
                out.push((
                    title.clone(),
                    line_chart(
                        &title,
                        "simulated time (s)",
                        "cached lines",
                        classes.into_iter().collect(),
                        false,
                        None,
                    ),
                ));
            }
        }
        let cdfs: Vec<(String, Vec<(f64, f64)>)> = self
            .timed
            .iter()
            .filter_map(|(l, v)| {
                let c = v["latency_us"]["all"]["cdf"].as_array()?;
                let pts: Vec<(f64, f64)> = c
                    .iter()
                    .filter_map(|p| Some((p[0].as_f64()? / 1000.0, p[1].as_f64()?)))
                    .filter(|p| p.0 > 0.0)
                    .collect();
                (!pts.is_empty()).then(|| (l.clone(), pts))
            })
            .collect();
        if !cdfs.is_empty() {
            let title = "Latency CDF (all requests)".to_string();
            out.push((
                title.clone(),
                line_chart(
                    &title,
                    "latency (ms, log scale)",
                    "share of requests",
                    cdfs,
                    true,
                    Some((0.0, 1.0)),
                ),
            ));
        }
        let costs: Vec<(String, f64)> = self
            .timed
            .iter()
            .filter_map(|(l, v)| Some((l.clone(), v["cost_per_mb_per_iops"].as_f64()?)))
            .collect();
        if !costs.is_empty() {
            let title = "Cost per MB per IOPS (lower is better)".to_string();
            out.push((title.clone(), bar_chart(&title, "USD / MB / IOPS", &costs)));
        }
        out
    }

    /// The page.
    pub fn html(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>\
body{{font-family:sans-serif;margin:2em;color:#222;background:#fff}}\
svg{{width:100%;max-width:{W}px;height:auto;display:block}}\
section{{margin-bottom:2em}}table{{border-collapse:collapse;font-size:90%}}\
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}th{{background:#eee}}\
td:first-child,th:first-child{{text-align:left}}</style></head><body>\n<h1>{t}</h1>\n",
            t = esc(&self.title)
        );
        if !self.sources.is_empty() {
            let _ = writeln!(
                h,
                "<p>From: {}</p>",
                self.sources
                    .iter()
                    .map(|s| esc(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for (title, body) in &self.extra {
            let _ = writeln!(h, "<section><h2>{}</h2>\n{body}</section>", esc(title));
        }
        for (title, svg) in self.plots() {
            let _ = writeln!(h, "<section><h2>{}</h2>\n{svg}</section>", esc(&title));
        }
        if !self.rows.is_empty() {
            h.push_str("<section><h2>Summary of runs</h2>\n<table><tr><th>run</th><th>hit ratio</th><th>IOPS</th><th>MB/s</th><th>p99 latency (us)</th><th>warm-up (s)</th><th>cost/MB/IOPS</th></tr>\n");
            for (label, v) in &self.rows {
                let f = |x: &Value, d: usize| {
                    x.as_f64()
                        .map(|x| format!("{x:.d$}"))
                        .unwrap_or_else(|| "-".into())
                };
                let hit = if no_cache(v) {
                    "no cache".to_string()
                } else {
                    f(&v["hit_ratio"], 4)
                };
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(label),
                    hit,
                    f(&v["iops"], 1),
                    f(&v["mb_per_s"], 2),
                    f(&v["latency_us"]["all"]["p99"], 0),
                    f(&v["warmup_iops_s"], 1),
                    v["cost_per_mb_per_iops"]
                        .as_f64()
                        .map(sig)
                        .unwrap_or_else(|| "-".into())
                );
            }
            h.push_str("</table></section>\n");
        }
        h.push_str("</body></html>\n");
        h
    }
}

/// A run without a cache (`--no-cache`): no SSD model, no capacity.
fn no_cache(v: &Value) -> bool {
    v["capacity_lines"].as_u64() == Some(0)
        || v["capacity_bytes"].as_f64() == Some(0.0)
        || (v.get("iops").is_some() && v.get("ssd_model").is_some_and(Value::is_null))
}

/// `v` to 3 significant digits, in scientific notation below 0.001 (a cost of 3.85e-6 USD
/// per MB per IOPS is neither `0` nor `0.0000`).
pub fn sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let e = v.abs().log10().floor() as i32;
    if !(-3..6).contains(&e) {
        return format!("{v:.2e}");
    }
    let d = (2 - e).max(0) as usize;
    format!("{v:.d$}")
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn run_label(v: &Value) -> String {
    let mut l = format!(
        "{} {} {} {}",
        s(&v["input"]),
        s(&v["policy"]),
        s(&v["mode"]),
        s(&v["cache_size"])
    );
    if v.get("iops").is_some() {
        match v["ssd_model"].as_str() {
            Some(m) => l.push_str(&format!(" on {} + {m}", s(&v["hdd_model"]))),
            None => l = format!("{} {} alone", s(&v["input"]), s(&v["hdd_model"])),
        }
    }
    l.trim().to_string()
}

/// HTML/XML text escape.
pub fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Plot size in SVG units; the SVG is drawn at the page's width (up to `W` px), so a 1,400 px
/// page shows wide plots. The legend goes below the plot, as many rows as it needs.
const W: f64 = 1320.0;
const H: f64 = 400.0;
const ML: f64 = 70.0;
const MR: f64 = 20.0;
const MT: f64 = 16.0;
const MB: f64 = 48.0;
/// Height of one legend row, and the width a legend character takes at font size 12.
const LEGEND_ROW: f64 = 20.0;
const LEGEND_CHAR: f64 = 7.2;
/// Ten distinguishable colours (matplotlib's tab10), so up to ten series never share one.
const COLORS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// "Nice" tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e5 || v.abs() < 1e-3 {
        format!("{v:.0e}")
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// A line chart as an inline SVG element.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: Vec<(String, Vec<(f64, f64)>)>,
    log_x: bool,
    y_range: Option<(f64, f64)>,
) -> String {
    line_chart_marked(title, x_label, y_label, series, log_x, y_range, &[])
}

/// A line chart with labelled vertical markers at `markers` (label, x), drawn dashed; the x
/// range widens to show them.
pub fn line_chart_marked(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: Vec<(String, Vec<(f64, f64)>)>,
    log_x: bool,
    y_range: Option<(f64, f64)>,
    markers: &[(String, f64)],
) -> String {
    let fx = |x: f64| if log_x { x.max(1e-12).log10() } else { x };
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    let (mut x0, mut x1) = all
        .iter()
        .map(|p| p.0)
        .chain(markers.iter().map(|m| m.1))
        .fold((f64::MAX, f64::MIN), |(a, b), x| {
            (a.min(fx(x)), b.max(fx(x)))
        });
    let (mut y0, mut y1) = match y_range {
        Some(r) => r,
        None => {
            let hi = all.iter().fold(f64::MIN, |a, p| a.max(p.1));
            (
                0.0f64.min(all.iter().fold(f64::MAX, |a, p| a.min(p.1))),
                hi * 1.05,
            )
        }
    };
    if all.is_empty() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    if !log_x && x0 > 0.0 && x0 < (x1 - x0) {
        x0 = 0.0;
    }
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let px = |x: f64| ML + (fx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| MT + ph - (y - y0) / (y1 - y0) * ph;
    let names: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    let (legend, extra) = legend(&names, 4.0);
    let mut g = svg_open(title, extra);
    g.push_str(&legend);
    // Axes and grid.
    for t in ticks(y0, y1, 5) {
        let y = py(t);
        let _ = write!(
            g,
            "<line x1=\"{ML}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            ML + pw,
            ML - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    let xt: Vec<f64> = if log_x {
        (x0.floor() as i32..=x1.ceil() as i32)
            .map(|e| e as f64)
            .collect()
    } else {
        ticks(x0, x1, 6)
    };
    for t in xt {
        let x = ML + (t - x0) / (x1 - x0) * pw;
        if !(ML - 0.5..=ML + pw + 0.5).contains(&x) {
            continue;
        }
        let label = if log_x {
            fmt_tick(10f64.powf(t))
        } else {
            fmt_tick(t)
        };
        let _ = write!(
            g,
            "<line x1=\"{x:.1}\" y1=\"{MT}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{label}</text>",
            MT + ph,
            MT + ph + 16.0
        );
    }
    let _ = write!(
        g,
        "<rect x=\"{ML}\" y=\"{MT}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\
<text transform=\"translate(16,{:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">{}</text>",
        ML + pw / 2.0,
        H - 10.0,
        esc(x_label),
        MT + ph / 2.0,
        esc(y_label)
    );
    for (k, (label, x)) in markers.iter().enumerate() {
        let x = px(*x);
        let _ = write!(
            g,
            "<line x1=\"{x:.1}\" y1=\"{MT}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#000\" stroke-dasharray=\"6,4\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
            MT + ph,
            x + 4.0,
            MT + 14.0 + 14.0 * k as f64,
            esc(label)
        );
    }
    for (i, (_, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1.clamp(y0, y1))))
            .collect();
        let _ = write!(
            g,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        if pts.len() <= 30 {
            for p in pts {
                let _ = write!(
                    g,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                    px(p.0),
                    py(p.1.clamp(y0, y1))
                );
            }
        }
    }
    g.push_str("</svg>");
    g
}

/// A bar chart as an inline SVG element.
pub fn bar_chart(title: &str, y_label: &str, bars: &[(String, f64)]) -> String {
    let y1 = bars.iter().fold(0.0f64, |a, b| a.max(b.1)).max(1e-12) * 1.1;
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let py = |y: f64| MT + ph - y / y1 * ph;
    let names: Vec<&str> = bars.iter().map(|b| b.0.as_str()).collect();
    let (legend, extra) = legend(&names, 10.0);
    let mut g = svg_open(title, extra);
    g.push_str(&legend);
    for t in ticks(0.0, y1, 5) {
        let y = py(t);
        let _ = write!(
            g,
            "<line x1=\"{ML}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            ML + pw,
            ML - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    let n = bars.len().max(1) as f64;
    let bw = pw / n * 0.7;
    for (i, (_, v)) in bars.iter().enumerate() {
        let x = ML + (i as f64 + 0.15) * pw / n;
        let c = COLORS[i % COLORS.len()];
        let _ = write!(
            g,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{c}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            py(*v),
            MT + ph - py(*v),
            x + bw / 2.0,
            py(*v) - 4.0,
            sig(*v)
        );
        // The category under its bar, wrapped at spaces to the bar's slot (up to 3 lines).
        let fit = ((pw / n) / 6.2).floor().max(4.0) as usize;
        let mut lines: Vec<String> = vec![String::new()];
        for word in bars[i].0.split(' ') {
            let full = lines.len() >= 3;
            let cur = lines.last_mut().expect("one line");
            if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > fit && !full {
                lines.push(word.to_string());
            } else {
                if !cur.is_empty() {
                    cur.push(' ');
                }
                cur.push_str(word);
            }
        }
        for (k, line) in lines.iter().enumerate() {
            let _ = write!(
                g,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                x + bw / 2.0,
                MT + ph + 13.0 + 11.0 * k as f64,
                esc(line)
            );
        }
    }
    let _ = write!(
        g,
        "<rect x=\"{ML}\" y=\"{MT}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>\
<text transform=\"translate(16,{:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">{}</text></svg>",
        MT + ph / 2.0,
        esc(y_label)
    );
    g
}

/// The SVG element, `extra` units taller than the plot (for the legend). The title is the
/// page's heading above it; inside, only as `<title>` (read by screen readers, not drawn).
fn svg_open(title: &str, extra: f64) -> String {
    let h = H + extra;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" role=\"img\" font-family=\"sans-serif\"><title>{t}</title><rect width=\"{W}\" height=\"{h}\" fill=\"#fff\"/>",
        t = esc(title)
    )
}

/// The legend below the plot: every name in full, in the series' colours, as many rows as
/// the names need. Returns the SVG and the height it adds.
fn legend(names: &[&str], swatch_h: f64) -> (String, f64) {
    let mut g = String::new();
    let (mut x, mut row) = (ML, 0.0);
    for (i, name) in names.iter().enumerate() {
        let w = 24.0 + LEGEND_CHAR * name.chars().count() as f64 + 18.0;
        if x > ML && x + w > W - MR {
            (x, row) = (ML, row + 1.0);
        }
        let y = H + 4.0 + row * LEGEND_ROW;
        let c = COLORS[i % COLORS.len()];
        let _ = write!(
            g,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"16\" height=\"{swatch_h}\" fill=\"{c}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" class=\"legend\">{}</text>",
            y + 8.0 - swatch_h / 2.0,
            x + 22.0,
            y + 12.0,
            esc(name)
        );
        x += w;
    }
    let rows = if names.is_empty() { 0.0 } else { row + 1.0 };
    (g, rows * LEGEND_ROW + 8.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_from_the_cli_sweep_and_the_python_sweep_make_curves() {
        let mut r = Report::new("t");
        r.add_csv("input,policy,mode,capacity_lines,line_size,hit_ratio\nx,lru,write-through,10,4096,0.5\nx,lru,write-through,20,4096,0.7\nx,arc,write-through,10,4096,0.6\n").unwrap();
        r.add_csv(
            "trace,size,policy,result_policy,capacity_bytes,hit_ratio\ny,1%,lru,lru,1048576,0.25\n",
        )
        .unwrap();
        let plots = r.plots();
        assert_eq!(plots.len(), 2);
        assert!(plots[0].0.contains("x (write-through)"), "{}", plots[0].0);
        assert_eq!(plots[0].1.matches("<polyline").count(), 2);
        let html = r.html();
        // One size of y: its policies are bars, not a one-point curve.
        assert!(html.contains("<h2>Hit ratio at 1.00 MiB: y</h2>"), "{html}");
        assert!(!html.contains("<script"));
    }

    #[test]
    fn bad_csv_says_where() {
        let mut r = Report::new("t");
        let e = r
            .add_csv("input,policy,capacity_bytes,hit_ratio\nx,lru,12,abc\n")
            .unwrap_err();
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
        assert!(r.add_csv("a,b\n1,2\n").is_err());
    }

    #[test]
    fn costs_keep_three_significant_digits() {
        assert_eq!(sig(3.8515e-6), "3.85e-6");
        assert_eq!(sig(0.012345), "0.0123");
        assert_eq!(sig(1.5), "1.50");
        assert_eq!(sig(123.4), "123");
        assert_eq!(sig(45678.0), "45678");
        assert_eq!(sig(0.0), "0");
    }

    #[test]
    fn ticks_cover_the_range() {
        let t = ticks(0.0, 1.0, 5);
        assert_eq!(t.len(), 6);
        assert!(t[0] == 0.0 && (t[5] - 1.0).abs() < 1e-9 && (t[1] - 0.2).abs() < 1e-12);
        assert_eq!(esc("<a&b>"), "&lt;a&amp;b&gt;");
    }
}
