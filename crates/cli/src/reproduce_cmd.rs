//! `tiercache reproduce`: re-run a seed document's experiment and print our figures beside the
//! published ones, with a one-line verdict; write an HTML report and JSON into `--out`.

use crate::report_cmd::{bar_chart, esc, line_chart_marked, Report};
use anyhow::{Context, Result};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;
use tiercache_sim::reproduce::{self, Claim, Outcome, Sense, EXPERIMENTS};

#[derive(Args, Debug)]
#[command(
    after_help = "Experiments (settings in experiments/reproduce/NAME.toml, built in):
  qsan            Qsan: warm-up estimate vs simulated warm-up, IOPS before and after
  srt             SRT study: SSD size sweep, write-through vs write-back, FIFO vs LIFO vs S-LRU
  storage-bench   Storage Bench 2011: HDD alone vs HDD + small SSD cache vs SSD alone
  dss             DSS Tables 3 and 4: no cache vs LRU vs DSS, 7200 and 15K RPM, 10 % cache
  nitro           Nitro: (ND,NC) (ND,C) (D,NC) (D,C), extent vs WEU, read hit and erasures
  all             every one of them
Each experiment first lists the seed's headline claims: the seed's number, ours, and whether
it holds (same direction and within the stated tolerance), with why where it does not. Rows
with a verdict of their own print it on the next line (`-> ...`).
Examples:
  tiercache reproduce all --out repro/        # writes repro/reproduce.html and repro/NAME.json
  tiercache reproduce all --quick --json      # the claims of every seed as JSON, on stdout
  tiercache reproduce all --markdown          # the claims table of REPRODUCTION.md"
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
    #[arg(long, value_name = "N", conflicts_with = "quick")]
    pub requests: Option<u64>,
    /// Small runs for CI (`--requests 20000`): directions show, magnitudes are less faithful.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout ({"claims": [...], "experiments": [...]}); the
    /// human-readable text goes to stderr.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Print the claims as one Markdown table on stdout (REPRODUCTION.md's first table); the
    /// human-readable text goes to stderr.
    #[arg(long)]
    pub markdown: bool,
}

/// Requests per run of `--quick`.
pub const QUICK_REQUESTS: u64 = 20_000;

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
    let requests = if a.quick {
        Some(QUICK_REQUESTS)
    } else {
        a.requests
    };
    // With --json or --markdown, stdout carries only the document.
    let to_stderr = a.json || a.markdown;
    let say = |text: &str| {
        if to_stderr {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    };
    let started = std::time::Instant::now();
    let mut report = Report::new("tiercache reproduce");
    let mut outcomes = Vec::new();
    for name in names {
        let t = std::time::Instant::now();
        let o = reproduce::run(name, config.as_deref(), requests)?;
        say(&format!(
            "{}({:.1} s)\n\n",
            outcome_text(&o),
            t.elapsed().as_secs_f64()
        ));
        let json = a.out.join(format!("{name}.json"));
        std::fs::write(&json, serde_json::to_string_pretty(&o)?)
            .with_context(|| format!("writing {}", json.display()))?;
        outcomes.push(o);
    }
    let all: Vec<&Claim> = outcomes.iter().flat_map(|o| &o.claims).collect();
    let held = all.iter().filter(|c| c.holds).count();
    report.add_section(
        "Headline claims of the seeds",
        claims_html(&all, requests, started.elapsed().as_secs_f64()),
    );
    for o in &outcomes {
        report.add_section(&o.title, section_html(o));
    }
    let page = a.out.join("reproduce.html");
    std::fs::write(&page, report.html()).with_context(|| format!("writing {}", page.display()))?;
    say(&format!(
        "claims: {held} of {} hold\nreport: {}\n",
        all.len(),
        page.display()
    ));
    if a.json {
        let doc = serde_json::json!({ "claims": all, "experiments": outcomes });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if a.markdown {
        let owned: Vec<Claim> = all.iter().map(|c| (*c).clone()).collect();
        print!("{}", reproduce::claims_markdown(&owned));
    }
    Ok(())
}

/// "2.19 +- 0.55", "<= 0.05", ">= 100": the seed's number and what counts as holding.
fn bound(c: &Claim) -> String {
    match c.sense {
        Sense::Within => format!(
            "{} +- {}",
            reproduce::short_num(c.seed),
            reproduce::short_num(c.tolerance)
        ),
        Sense::AtMost => format!("<= {}", reproduce::short_num(c.seed + c.tolerance)),
        Sense::AtLeast => format!(">= {}", reproduce::short_num(c.seed - c.tolerance)),
    }
}

fn claims_text(claims: &[Claim]) -> String {
    let mut s = String::new();
    let w = claims.iter().map(|c| c.id.len()).max().unwrap_or(2);
    for c in claims {
        let _ = writeln!(
            s,
            "   {:<w$}  seed {:<14} ours {:<9} {}",
            c.id,
            bound(c),
            c.ours
                .map(reproduce::short_num)
                .unwrap_or_else(|| "-".into()),
            if c.holds { "holds" } else { "DOES NOT HOLD" }
        );
        if let Some(why) = &c.why {
            let _ = writeln!(s, "   {:<w$}  -> {why}", "");
        }
    }
    s
}

fn claims_html(claims: &[&Claim], requests: Option<u64>, secs: f64) -> String {
    let mut h = String::new();
    let held = claims.iter().filter(|c| c.holds).count();
    let _ = writeln!(
        h,
        "<p>{held} of {} claims hold ({}; {secs:.0} s). A claim holds when ours is in the seed's direction and within the tolerance (or past the bound).</p>",
        claims.len(),
        match requests {
            Some(n) => format!("{n} requests per run"),
            None => "the settings' request counts".into(),
        }
    );
    h.push_str(
        "<table><tr><th>claim</th><th>seed</th><th>ours</th><th>holds</th><th>why</th></tr>\n",
    );
    for c in claims {
        let _ = writeln!(
            h,
            "<tr><td style=\"text-align:left\"><code>{}</code><br>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&c.id),
            esc(&c.text),
            esc(&c.unit),
            esc(&bound(c)),
            c.ours.map(reproduce::short_num).unwrap_or_else(|| "-".into()),
            if c.holds { "yes" } else { "<b>no</b>" },
            esc(c.why.as_deref().unwrap_or(""))
        );
    }
    h.push_str("</table>\n");
    h
}

fn outcome_text(o: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "== {} ({})\n   {}", o.title, o.name, o.source);
    if !o.claims.is_empty() {
        let _ = writeln!(
            s,
            "   claims ({} of {} hold):",
            o.claims.iter().filter(|c| c.holds).count(),
            o.claims.len()
        );
        s.push_str(&claims_text(&o.claims));
    }
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
    let _ = writeln!(s, "   {:<w$}  {:<w2$}  published", "what", "ours");
    for r in &o.rows {
        let _ = writeln!(s, "   {:<w$}  {:<w2$}  {}", r.what, r.ours, r.published);
        if !r.verdict.is_empty() {
            let _ = writeln!(s, "   {:<w$}  -> {}", "", r.verdict);
        }
    }
    let _ = writeln!(s, "   verdict: {}", o.verdict);
    s
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
            h.push_str(&line_chart_marked(
                &p.title,
                &p.x_label,
                &p.y_label,
                p.series.clone(),
                false,
                None,
                &p.markers,
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
