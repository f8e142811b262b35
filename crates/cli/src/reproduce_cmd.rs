//! `tiercache reproduce`: re-run a seed document's experiment and print our figures beside the
//! published ones, with a one-line verdict; write an HTML report and JSON into `--out`.

use crate::report_cmd::{bar_chart, esc, line_chart, Report};
use anyhow::{Context, Result};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;
use tiercache_sim::reproduce::{self, Outcome, EXPERIMENTS};

#[derive(Args, Debug)]
#[command(
    after_help = "Experiments (settings in experiments/reproduce/NAME.toml, built in):
  qsan            Qsan: warm-up estimate vs simulated warm-up, IOPS before and after
  srt             SRT study: SSD size sweep, write-through vs write-back, FIFO vs LIFO vs S-LRU
  storage-bench   Storage Bench 2011: HDD alone vs HDD + small SSD cache vs SSD alone
  dss             DSS Tables 3 and 4: no cache vs LRU vs DSS, 7200 and 15K RPM, 10 % cache
  nitro           Nitro: (ND,NC) (ND,C) (D,NC) (D,C), extent vs WEU, read hit and erasures
  all             every one of them
Rows with a verdict of their own print it on the next line (`-> ...`).
Example:
  tiercache reproduce all --out repro/        # writes repro/reproduce.html and repro/NAME.json"
)]
pub struct ReproduceArgs {
    /// Experiment name, or `all`.
    #[arg(value_name = "NAME|all")]
    pub name: String,
    /// Folder for reproduce.html and one JSON per experiment.
    #[arg(long, short = 'o', value_name = "DIR", default_value = "reproduce-out")]
    pub out: PathBuf,
    /// Settings file instead of the built-in one (only with a single experiment).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Requests per run instead of the settings' count (smaller = faster, less faithful).
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
}

pub fn run(a: ReproduceArgs) -> Result<()> {
    let names: Vec<&str> = if a.name == "all" {
        EXPERIMENTS.iter().map(|e| e.0).collect()
    } else {
        vec![a.name.as_str()]
    };
    anyhow::ensure!(
        a.config.is_none() || names.len() == 1,
        "--config needs a single experiment, not `all`"
    );
    let config = match &a.config {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut report = Report::new("tiercache reproduce");
    for name in names {
        let t = std::time::Instant::now();
        let o = reproduce::run(name, config.as_deref(), a.requests)?;
        print_outcome(&o);
        println!("({:.1} s)\n", t.elapsed().as_secs_f64());
        let json = a.out.join(format!("{name}.json"));
        std::fs::write(&json, serde_json::to_string_pretty(&o)?)
            .with_context(|| format!("writing {}", json.display()))?;
        report.add_section(&o.title, section_html(&o));
    }
    let page = a.out.join("reproduce.html");
    std::fs::write(&page, report.html()).with_context(|| format!("writing {}", page.display()))?;
    println!("report: {}", page.display());
    Ok(())
}

fn print_outcome(o: &Outcome) {
    println!("== {} ({})\n   {}", o.title, o.name, o.source);
    let w = o
        .rows
        .iter()
        .map(|r| r.what.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let w2 = o
        .rows
        .iter()
        .map(|r| r.ours.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("   {:<w$}  {:<w2$}  published", "what", "ours");
    for r in &o.rows {
        println!("   {:<w$}  {:<w2$}  {}", r.what, r.ours, r.published);
        if !r.verdict.is_empty() {
            println!("   {:<w$}  -> {}", "", r.verdict);
        }
    }
    println!("   verdict: {}", o.verdict);
}

fn section_html(o: &Outcome) -> String {
    let mut h = String::new();
    let _ = writeln!(h, "<p>{}</p>", esc(&o.source));
    let _ = writeln!(h, "<p><b>Verdict:</b> {}</p>", esc(&o.verdict));
    let notes = o.rows.iter().any(|r| !r.verdict.is_empty());
    h.push_str("<table><tr><th>what</th><th>ours</th><th>published</th>");
    h.push_str(if notes {
        "<th>verdict</th></tr>\n"
    } else {
        "</tr>\n"
    });
    for r in &o.rows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td>",
            esc(&r.what),
            esc(&r.ours),
            esc(&r.published)
        );
        if notes {
            let _ = write!(h, "<td>{}</td>", esc(&r.verdict));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    for p in &o.plots {
        let _ = writeln!(h, "<h3>{}</h3>", esc(&p.title));
        if p.bars.is_empty() {
            h.push_str(&line_chart(
                &p.title,
                &p.x_label,
                &p.y_label,
                p.series.clone(),
                false,
                None,
            ));
        } else {
            h.push_str(&bar_chart(&p.title, &p.y_label, &p.bars));
        }
        h.push('\n');
    }
    let _ = writeln!(
        h,
        "<details><summary>settings</summary><pre>{}</pre></details>",
        esc(&o.config)
    );
    h
}
