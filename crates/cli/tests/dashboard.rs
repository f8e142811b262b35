//! `tiercache serve --http`: the live dashboard, loaded in headless Chromium while fio runs
//! through NBD, must show non-zero IOPS in its charts and tiles, for both layouts; and
//! `/api/stats` must hold the same time series. Skips (printing `SKIP:`) without chromium or
//! fio. With `TIERCACHE_DASHBOARD_SCREENSHOT=PATH` the direct-layout test also saves a
//! screenshot of the page there (`scripts/dashboard-screenshot.sh` does that for the docs).

mod common;

use common::{free_port, have, tmp, Srv};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn setup() -> tempfile::TempDir {
    let dir = tmp();
    let f = std::fs::File::create(dir.path().join("backing.img")).unwrap();
    f.set_len(64 << 20).unwrap();
    dir
}

/// fio, killed (and reaped) when dropped, however the test ends.
struct Fio(Child);

impl Drop for Fio {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// fio mixing 4 KiB random reads and writes over 32 MiB (4x the 8 MiB cache: hits, misses
/// and write-backs), rate-limited (the machine is shared), for `secs`. `--thread`: the job
/// runs in fio's own process, so killing it stops the job (a forked job process outlived the
/// kill, and once the server was gone spun at 100 % CPU long after the test had passed).
fn fio(srv: &Srv, secs: u32) -> Fio {
    Fio(Command::new("fio")
        .args([
            "--name=dash",
            "--thread",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri()),
            "--rw=randrw",
            "--rwmixread=70",
            "--bs=4k",
            "--size=32M",
            "--iodepth=2",
            "--rate_iops=1500,700",
            "--time_based",
            &format!("--runtime={secs}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap())
}

/// Chromium, headless, on `url`: `--dump-dom` (the DOM after the page's scripts ran for
/// 2.5 s of virtual time, a few refreshes) or `--screenshot=PATH`.
fn chromium(dir: &Path, url: &str, what: &str) -> String {
    let out = Command::new("timeout")
        .arg("90")
        .arg("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,1150",
            "--virtual-time-budget=2500",
            &format!("--user-data-dir={}", dir.join("chromium").display()),
            what,
            url,
        ])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium {what} {url}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of the element with `id` in `dom` (no nested elements).
fn text<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the page"));
    let s = &dom[at..];
    let s = &s[s.find('>').unwrap() + 1..];
    &s[..s.find('<').unwrap()]
}

/// The value of `attr` on the element with `id`.
fn attr(dom: &str, id: &str, attr: &str) -> f64 {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no chart #{id} in the page"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let v = tag
        .split(&format!("{attr}=\""))
        .nth(1)
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"));
    v[..v.find('"').unwrap()].parse().unwrap()
}

/// A tile's number as the page prints it ("2982", "12.2", "1.50k").
fn number(s: &str) -> f64 {
    let (n, m) = match s.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => match s.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (s, 1.0),
        },
    };
    n.parse::<f64>()
        .unwrap_or_else(|_| panic!("not a number: {s:?}"))
        * m
}

fn get(port: u16, path: &str) -> (String, String) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    c.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// Loads the page while fio runs; asserts what both layouts show. Returns the DOM.
fn page_under_fio(dir: &Path, srv: &Srv, port: u16) -> String {
    let f = fio(srv, 60); // killed once the page and the API were read
    std::thread::sleep(Duration::from_secs(4)); // fio connected, a few samples taken
    let url = format!("http://127.0.0.1:{port}/");
    let dom = chromium(dir, &url, "--dump-dom");
    if let Ok(shot) = std::env::var("TIERCACHE_DASHBOARD_SCREENSHOT") {
        chromium(
            dir,
            &format!("{url}#window=60"),
            &format!("--screenshot={shot}"),
        );
    }
    let (head, api) = get(port, "/api/stats");
    drop(f);

    // The tiles: the newest second, taken while fio ran.
    for id in ["v-read-iops", "v-write-iops", "v-read-mbps", "v-write-mbps"] {
        assert!(number(text(&dom, id)) > 0.0, "#{id} = {:?}", text(&dom, id));
    }
    assert!(number(text(&dom, "v-samples")) >= 3.0);
    // The charts: plotted points and a non-zero peak.
    for id in [
        "chart-iops",
        "chart-mbps",
        "chart-ssd",
        "chart-hdd",
        "chart-occ",
    ] {
        assert!(attr(&dom, id, "data-points") > 0.0, "{id} has no points");
        assert!(attr(&dom, id, "data-max") > 0.0, "{id} shows only zeros");
    }
    assert!(dom.contains("<path d=\"M"), "no chart line drawn");
    let status = text(&dom, "status");
    assert!(status.starts_with("updated"), "status: {status}");

    assert!(head.starts_with("HTTP/1.1 200") && head.contains("application/json"));
    let j: serde_json::Value = serde_json::from_str(&api).unwrap();
    // The volume is named after its backing device, on the page and in the API (as in
    // `ctl stats`).
    let name = std::fs::canonicalize(dir.join("backing.img"))
        .unwrap()
        .display()
        .to_string();
    assert_eq!(j["volume_name"], name.as_str(), "/api/stats volume_name");
    assert_eq!(text(&dom, "volume-name"), name, "the page's volume name");
    let s = j["samples"].as_array().unwrap();
    assert!(s.len() >= 3, "{} samples", s.len());
    let peak = |k: &str| s.iter().map(|x| x[k].as_f64().unwrap()).fold(0.0, f64::max);
    assert!(peak("ssd_write_iops") > 0.0 && peak("hdd_read_iops") > 0.0);
    assert!(
        s.iter()
            .any(|x| x["volume"]["read_iops"].as_f64().unwrap() > 100.0),
        "fio's reads do not show in /api/stats"
    );
    let (head, _) = get(port, "/nothing-here");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    dom
}

#[test]
fn dashboard_shows_live_iops_direct_layout() {
    if !have("chromium") || !have("fio") {
        return;
    }
    let dir = setup();
    let port = free_port();
    let http = port.to_string(); // a bare port: loopback
    let srv = Srv::start(dir.path(), &["--mode", "write-back", "--http", &http]);
    let dom = page_under_fio(dir.path(), &srv, port);
    assert_eq!(text(&dom, "layout"), "direct");
    assert!(dom.contains("<td>mode</td><td>write-back</td>"), "settings");
    assert!(dom.contains("<td>policy</td><td>lru</td>"), "settings");
    // Per class: the one class (0) of a volume without a class table has its charts.
    assert!(attr(&dom, "chart-class-iops", "data-max") > 0.0);
    assert!(attr(&dom, "chart-class-occ", "data-max") > 0.0);
    assert!(number(text(&dom, "v-ssd-write-iops")) > 0.0);
    srv.stop("-TERM");
}

#[test]
fn dashboard_shows_live_iops_log_layout() {
    if !have("chromium") || !have("fio") {
        return;
    }
    let dir = setup();
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let srv = Srv::start(
        dir.path(),
        &[
            "--layout",
            "log",
            "--segment-size",
            "256k",
            "--mode",
            "write-back",
            "--http",
            &http,
        ],
    );
    let dom = page_under_fio(dir.path(), &srv, port);
    assert_eq!(text(&dom, "layout"), "log");
    assert!(
        dom.contains("<td>segment_size</td><td>262144</td>"),
        "settings"
    );
    // What the log layout lacks is said, not drawn as zeros.
    assert!(dom.contains("no class table in force"));
    assert!(!dom.contains("id=\"chart-class-iops\""));
    srv.stop("-TERM");
}
