//! `tiercache report`: a sweep CSV and timed-run JSON become one self-contained HTML page whose
//! plots render in a real browser (headless Chromium): the screenshot is not blank, shows the
//! plot colours, and the rendered page carries every plot title. Skips (with a message) when
//! no Chromium is installed (`apt-get install chromium`).

use std::path::{Path, PathBuf};
use std::process::Command;

const WORKLOAD: &str = "zipf:theta=0.9,wss=32MiB,requests=1e4";

fn tiercache(args: &[&str], dir: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run tiercache");
    assert!(
        o.status.success(),
        "tiercache {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Builds the report in `dir` and returns its path.
fn build_report(dir: &Path) -> PathBuf {
    tiercache(
        &[
            "sweep",
            "-w",
            WORKLOAD,
            "--sizes",
            "5%,20%,50%",
            "--policies",
            "lru,fifo",
            "--out",
            "sweep.csv",
            "-q",
        ],
        dir,
    );
    for (size, file) in [("10%", "small.json"), ("50%", "big.json")] {
        let out = tiercache(
            &[
                "sim",
                "-w",
                WORKLOAD,
                "--cache-size",
                size,
                "--hdd",
                "7200",
                "--window",
                "0.5",
                "--json",
                "-q",
            ],
            dir,
        );
        std::fs::write(dir.join(file), out).unwrap();
    }
    tiercache(
        &[
            "report",
            "sweep.csv",
            "small.json",
            "big.json",
            "-o",
            "report.html",
            "--title",
            "Report test",
        ],
        dir,
    );
    dir.join("report.html")
}

const TITLES: &[&str] = &[
    "Report test",
    "Hit ratio vs cache size",
    "Warm-up (IOPS over time)",
    "Warm-up (hit ratio over time)",
    "Per-class occupancy over time",
    "Latency CDF (all requests)",
    "Cost per MB per IOPS",
    "Summary of runs",
];

#[test]
fn report_is_self_contained_and_has_every_plot() {
    let dir = tempfile::tempdir().unwrap();
    let html = std::fs::read_to_string(build_report(dir.path())).unwrap();
    for t in TITLES {
        assert!(html.contains(t), "missing title {t}");
    }
    // Three curves' plot (2 policies), 2 x 3 timed plots, one CDF, one bar chart.
    assert_eq!(html.matches("<svg").count(), 1 + 2 * 3 + 1 + 1);
    assert!(
        !html.contains("<script"),
        "the page must not need JavaScript"
    );
    // No network references: the only URL is the SVG namespace name.
    let stripped = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!stripped.contains("http:") && !stripped.contains("https:"));
}

fn chromium() -> Option<String> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(c.to_string());
        }
    }
    None
}

#[test]
fn report_renders_in_headless_chromium() {
    let Some(chrome) = chromium() else {
        tiercache_testskip::skip!(
            "no chromium found (apt-get install chromium) - the report was not rendered"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = build_report(dir.path());
    let url = format!("file://{}", page.display());
    let shot = dir.path().join("shot.png");
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ];
    let o = Command::new(&chrome)
        .args(common)
        .arg("--window-size=1000,2000")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        shot.is_file(),
        "chromium wrote no screenshot:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Decode the screenshot: not blank, and the plot colours are there.
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let data = &buf[..info.buffer_size()];
    let (mut non_white, mut blue, mut orange) = (0usize, 0usize, 0usize);
    for p in data.chunks(px) {
        let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
        if r < 235 || g < 235 || b < 235 {
            non_white += 1;
        }
        // #1f77b4 and #ff7f0e, the first two series colours.
        if (r - 0x1f).abs() < 24 && (g - 0x77).abs() < 24 && (b - 0xb4).abs() < 24 {
            blue += 1;
        }
        if (r - 0xff).abs() < 24 && (g - 0x7f).abs() < 24 && (b - 0x0e).abs() < 24 {
            orange += 1;
        }
    }
    let total = data.len() / px;
    eprintln!(
        "screenshot {}x{}: {non_white} non-white, {blue} blue, {orange} orange pixels",
        info.width, info.height
    );
    assert!(
        non_white * 100 > total,
        "screenshot looks blank: {non_white} of {total} pixels drawn"
    );
    assert!(
        blue > 500 && orange > 200,
        "plot lines missing: {blue} blue, {orange} orange pixels"
    );
    // The rendered DOM has every title (the page parsed, nothing was lost).
    let dom = Command::new(&chrome)
        .args(common)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("run chromium --dump-dom");
    let dom = String::from_utf8_lossy(&dom.stdout);
    for t in TITLES {
        assert!(dom.contains(t), "rendered page lacks title {t}");
    }
}

#[test]
fn reproduce_all_writes_verdicts_json_and_one_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiercache(
        &["reproduce", "all", "--requests", "20000", "--out", "repro"],
        dir.path(),
    );
    assert_eq!(out.matches("verdict: ").count(), 5, "{out}");
    assert!(
        out.contains("HDD + SSD cache") && out.contains("slru at"),
        "{out}"
    );
    let html = std::fs::read_to_string(dir.path().join("repro/reproduce.html")).unwrap();
    for t in [
        "SRT study: cache size, write mode, replacement policy",
        "Storage Bench 2011: HDD vs HDD + SSD cache vs SSD",
        "SRT: mean response time vs SSD cache size",
        "Storage Bench: disk busy time (s)",
        "Qsan test case 1: IOPS over time",
        "Storage Bench: disk busy time, reads (s)",
        "Storage Bench: disk busy time, writes (s)",
        "DSS: Tables 3 and 4 (no cache vs LRU vs DSS, 10 % cache)",
        "DSS 7200 RPM: cost per MB per IOPS (no cache = 1)",
        "Nitro: data reduction, extent vs WEU caching",
        "Verdict:",
    ] {
        assert!(html.contains(t), "missing {t}");
    }
    let mut plots = 0;
    for name in ["srt", "qsan", "storage-bench", "dss", "nitro"] {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(format!("repro/{name}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(v["name"], name);
        assert!(!v["verdict"].as_str().unwrap().is_empty());
        plots += v["plots"].as_array().unwrap().len();
    }
    // Every plot of every experiment is drawn once: srt 2, qsan 2, storage bench 6, DSS 5,
    // Nitro 2 per workload.
    assert!(plots >= 2 + 2 + 6 + 5 + 2, "{plots}");
    assert_eq!(html.matches("<svg").count(), plots);
    // An unknown experiment is an error that lists the known ones.
    let o = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["reproduce", "sieve", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("known: srt, qsan, storage-bench, dss, nitro")
    );
}

/// `tiercache sim ARGS --json` on the test workload, written to `dir/file`.
fn sim_json(dir: &Path, file: &str, args: &[&str]) {
    let mut a = vec!["sim", "-w", WORKLOAD, "--json", "-q"];
    a.extend(args);
    std::fs::write(dir.join(file), tiercache(&a, dir)).unwrap();
}

/// `tiercache report FILES` in `dir`; returns the page.
fn report_of(dir: &Path, files: &[&str]) -> String {
    let mut a = vec!["report"];
    a.extend(files);
    a.extend(["-o", "r.html"]);
    tiercache(&a, dir);
    std::fs::read_to_string(dir.join("r.html")).unwrap()
}

/// The `<svg>` elements of a page, each with the `<h2>` before it.
fn plots(html: &str) -> Vec<(String, String)> {
    html.split("<h2>")
        .skip(1)
        .filter_map(|sec| {
            let title = &sec[..sec.find("</h2>")?];
            let svg = &sec[sec.find("<svg")?..sec.find("</svg>")? + 6];
            Some((title.to_string(), svg.to_string()))
        })
        .collect()
}

/// The drawn text of an SVG or page: `<text>` contents and headings, not `<title>`.
fn texts(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for tag in ["<text", "<h1", "<h2", "<h3"] {
        for part in html.split(tag).skip(1) {
            let body = &part[part.find('>').unwrap() + 1..];
            out.push(body[..body.find('<').unwrap()].to_string());
        }
    }
    out
}

/// Costs are printed with significant digits: the bar labels and the table cells of
/// costs near 4e-6 USD/MB/IOPS read like the JSON's values, not `0` or `0.0000`.
#[test]
fn report_costs_keep_significant_digits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sim_json(d, "a.json", &["--cache-size", "10%", "--hdd", "7200"]);
    sim_json(d, "b.json", &["--no-cache", "--hdd", "7200"]);
    let html = report_of(d, &["a.json", "b.json"]);
    let cost = |f: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(f)).unwrap()).unwrap();
        v["cost_per_mb_per_iops"].as_f64().unwrap()
    };
    let want = [cost("a.json"), cost("b.json")];
    assert!(want.iter().all(|&c| c > 0.0 && c < 1e-3), "{want:?}");
    let (_, bars) = plots(&html)
        .into_iter()
        .find(|(t, _)| t.starts_with("Cost per MB per IOPS"))
        .expect("a cost plot");
    let close = |s: &str, w: f64| s.parse::<f64>().is_ok_and(|x| (x - w).abs() <= w * 0.01);
    for w in want {
        assert!(
            texts(&bars).iter().any(|t| close(t, w)),
            "no bar label reads {w}: {:?}",
            texts(&bars)
        );
    }
    let table = &html[html.find("Summary of runs").unwrap()..];
    for w in want {
        assert!(
            table
                .split("<td>")
                .any(|c| close(c.split('<').next().unwrap(), w)),
            "no table cell reads {w}"
        );
    }
    assert!(
        !table.contains("<td>0.0000</td>"),
        "a cost printed as 0.0000"
    );
}

/// A single run gives no one-point "hit ratio vs cache size" line plot but a bar; a no-cache
/// run gives no hit-ratio or occupancy plot at all, and the table says "no cache".
#[test]
fn report_single_and_no_cache_runs_get_no_degenerate_plots() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sim_json(d, "one.json", &["--cache-size", "10%"]);
    let html = report_of(d, &["one.json"]);
    let p = plots(&html);
    assert!(
        p.iter()
            .all(|(t, _)| !t.starts_with("Hit ratio vs cache size")),
        "one-point curve: {:?}",
        p.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    let (_, bar) = p
        .iter()
        .find(|(t, _)| t.starts_with("Hit ratio at "))
        .expect("the single run's hit ratio as a bar");
    assert!(!bar.contains("<polyline") && bar.contains("<rect"));

    sim_json(
        d,
        "none.json",
        &["--no-cache", "--hdd", "7200", "--window", "0.5"],
    );
    let html = report_of(d, &["none.json"]);
    let titles: Vec<String> = plots(&html).into_iter().map(|x| x.0).collect();
    for t in &titles {
        let t = t.to_lowercase();
        assert!(
            !t.contains("hit ratio") && !t.contains("occupancy"),
            "no-cache run plotted {t}"
        );
    }
    assert!(
        titles.iter().any(|t| t.starts_with("Warm-up (IOPS")),
        "{titles:?}"
    );
    assert!(html.contains("<td>no cache</td>"));
}

/// Plots fill a wide page (viewBox >= 1,200 units wide, drawn at 100 % of the page up to
/// that), legends show every series name in full, and no title is drawn twice (the heading
/// only; the SVG keeps it as a non-drawn `<title>`).
#[test]
fn report_plots_are_wide_legends_whole_titles_once() {
    let dir = tempfile::tempdir().unwrap();
    let html = std::fs::read_to_string(build_report(dir.path())).unwrap();
    assert!(
        html.contains("svg{width:100%;"),
        "plots not sized to the page"
    );
    assert!(!html.contains('…'), "something was truncated");
    let ps = plots(&html);
    assert!(ps.len() >= 8);
    let drawn = texts(&html);
    for (title, svg) in &ps {
        let vb = svg.split("viewBox=\"0 0 ").nth(1).unwrap();
        let w: f64 = vb.split(' ').next().unwrap().parse().unwrap();
        assert!(w >= 1200.0, "{title}: {w} units wide");
        assert_eq!(
            drawn.iter().filter(|t| t == &title).count(),
            1,
            "{title} drawn more than once"
        );
    }
    // The latency CDF's legend names the runs in full (labels longer than 26 characters).
    let (_, cdf) = ps
        .iter()
        .find(|(t, _)| t.starts_with("Latency CDF"))
        .unwrap();
    let legend: Vec<String> = cdf
        .split("class=\"legend\">")
        .skip(1)
        .map(|s| s[..s.find('<').unwrap()].to_string())
        .collect();
    assert_eq!(legend.len(), 2, "{legend:?}");
    for l in &legend {
        assert!(l.len() > 26 && l.ends_with("+ ssd:default"), "{l}");
    }
}
