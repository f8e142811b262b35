//! Several volumes behind one server (`serve --volume NAME=BACKING`, issue 15 item 1): named
//! NBD exports sharing one cache, per-volume modes and statistics, a kill -9 in write-back
//! restoring every volume, and the volume table refusing a swapped or missing disk by name.

mod common;

use common::{have, run, serve_refused, sha, Srv};
use std::path::Path;
use std::process::Command;
use tiercache_nbd::Client;

/// `len` bytes of `seed`-dependent data in `path`.
fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut b = vec![0u8; len];
    for c in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    std::fs::write(path, b).unwrap();
}

fn sized(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn export(srv: &Srv, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", srv.sock.display())
}

/// Copies export `name` into `out` (all of it).
fn read_export(srv: &Srv, name: &str, out: &Path) {
    run(Command::new("nbdcopy").arg(export(srv, name)).arg(out));
}

fn vol_args<'a>(cache: &'a str, vols: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--cache",
        cache,
        "--format-if-needed",
        "--cache-size",
        "16M",
    ];
    for v in vols {
        a.extend(["--volume", v.as_str()]);
    }
    a.extend(extra);
    a
}

/// The setup every test here shares: volumes `a` and `b` (sparse files `a.img`, `b.img` of
/// the given sizes) in a new directory, and the path of a cache file there.
struct TwoVolumes {
    dir: tempfile::TempDir,
    cache: String,
    /// `a=PATH` and `b=PATH`, as `--volume` takes them.
    vols: Vec<String>,
}

impl TwoVolumes {
    fn new(a: u64, b: u64) -> TwoVolumes {
        let dir = common::tmp();
        let d = dir.path();
        sized(&d.join("a.img"), a);
        sized(&d.join("b.img"), b);
        TwoVolumes {
            cache: d.join("cache.img").display().to_string(),
            vols: ["a", "b"]
                .iter()
                .map(|n| format!("{n}={}", d.join(format!("{n}.img")).display()))
                .collect(),
            dir,
        }
    }

    fn d(&self) -> &Path {
        self.dir.path()
    }

    /// The path of `NAME.img` in the directory.
    fn img(&self, name: &str) -> String {
        self.d().join(format!("{name}.img")).display().to_string()
    }

    /// `serve` of both volumes on the cache (made 16M if new) with `extra`.
    fn serve(&self, extra: &[&str]) -> Srv {
        Srv::custom(self.d(), &vol_args(&self.cache, &self.vols, extra))
    }
}

fn volume<'a>(st: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    st["volumes"]
        .as_array()
        .unwrap_or_else(|| panic!("no volumes in stats: {st}"))
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name} in {}", st["volumes"]))
}

/// Two volumes of different sizes under fio verify at once (different block sizes and
/// seeds, so a read served from the other volume fails fio's verify), one write-back and
/// one write-through; both exports listed; per-volume stats and Prometheus labels; after
/// `ctl flush` each backing file holds exactly what its own export reads.
#[test]
fn two_volumes_share_one_cache_and_never_cross() {
    if !(have("fio") && have("nbdinfo") && have("nbdcopy")) {
        return;
    }
    let two = TwoVolumes::new(24 << 20, 20 << 20);
    let d = two.d();
    let port = common::free_port().to_string();
    let metrics = format!("127.0.0.1:{port}");
    let srv = two.serve(&[
        "--mode",
        "write-back",
        "--volume-mode",
        "b=write-through",
        "--metrics",
        &metrics,
    ]);
    let list = run(Command::new("nbdinfo").args(["--list", &srv.uri()]));
    assert!(
        list.contains("export=\"a\"") || list.contains("export=a"),
        "{list}"
    );
    assert!(
        list.contains("export=\"b\"") || list.contains("export=b"),
        "{list}"
    );
    assert!(list.contains(&(24u64 << 20).to_string()), "{list}");
    assert!(list.contains(&(20u64 << 20).to_string()), "{list}");
    let fio = |name: &str, bs: &str, seed: &str| {
        let mut c = Command::new("fio");
        c.current_dir(d).args([
            &format!("--name=vol-{name}"),
            "--ioengine=nbd",
            &format!("--uri={}", export(&srv, name)),
            "--rw=randwrite",
            &format!("--bs={bs}"),
            "--size=12M",
            &format!("--randseed={seed}"),
            "--verify=crc32c",
            "--verify_fatal=1",
            "--iodepth=4",
        ]);
        c
    };
    let (mut fa, mut fb) = (fio("a", "4k", "11"), fio("b", "8k", "22"));
    let (ta, tb) = (
        std::thread::spawn(move || fa.output().unwrap()),
        std::thread::spawn(move || fb.output().unwrap()),
    );
    for (name, t) in [("a", ta), ("b", tb)] {
        let o = t.join().unwrap();
        assert!(
            o.status.success(),
            "fio on volume {name}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let st = srv.stats();
    let (a, b) = (volume(&st, "a"), volume(&st, "b"));
    assert_eq!(a["mode"], "write-back", "{a}");
    assert_eq!(b["mode"], "write-through", "{b}");
    assert!(a["counters"]["requests"].as_u64().unwrap() > 1000, "{a}");
    assert!(b["counters"]["requests"].as_u64().unwrap() > 500, "{b}");
    // a's writes were held dirty: still dirty, or written back since (under load the
    // cleaner may have written back all of them while fio verified). A volume's counters
    // count what its requests did, so b's may hold write-backs of a's lines its misses
    // evicted: b is judged by its own lines.
    let held_dirty =
        a["dirty_lines"].as_u64().unwrap() + a["counters"]["write_backs"].as_u64().unwrap();
    assert!(held_dirty > 0, "write-back keeps dirty lines: {a}");
    assert_eq!(b["dirty_lines"], 0, "write-through holds none dirty: {b}");
    assert!(a["cached_lines"].as_u64().unwrap() > 0 && b["cached_lines"].as_u64().unwrap() > 0);
    let prom = common::metrics(&metrics);
    assert!(
        prom.contains("tiercache_volume_requests_total{volume=\"a\"}"),
        "{prom}"
    );
    assert!(
        prom.contains("tiercache_volume_dirty_lines{volume=\"b\"} 0"),
        "{prom}"
    );
    srv.ctl(&["flush"]);
    for name in ["a", "b"] {
        let out = d.join(format!("{name}.read"));
        read_export(&srv, name, &out);
        assert_eq!(
            sha(&out),
            sha(&d.join(format!("{name}.img"))),
            "after a flush, volume {name}'s backing file holds what its export reads"
        );
    }
    // `ctl detach` detaches every volume, b's own mode included: nothing stays dirty.
    srv.ctl(&["detach"]);
    let st = srv.stats();
    for name in ["a", "b"] {
        let v = volume(&st, name);
        assert_eq!(v["mode"], "pass-through", "{v}");
        assert_eq!(v["dirty_lines"], 0, "{v}");
    }
    srv.stop("-TERM");
}

/// Write-back, both volumes written (and FLUSHed) through their exports, then kill -9: the
/// restart (volumes given in the other order: matched by name) serves both volumes' data,
/// though neither backing file holds all of it.
#[test]
fn kill_9_in_write_back_restores_both_volumes() {
    if !have("nbdcopy") {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let d = two.d();
    random_file(&d.join("a.src"), 4 << 20, 1);
    random_file(&d.join("b.src"), 4 << 20, 2);
    let srv = two.serve(&["--mode", "write-back"]);
    for name in ["a", "b"] {
        run(Command::new("nbdcopy")
            .arg("--flush")
            .arg(d.join(format!("{name}.src")))
            .arg(export(&srv, name)));
    }
    let st = srv.stats();
    for name in ["a", "b"] {
        assert!(
            volume(&st, name)["dirty_lines"].as_u64().unwrap() > 500,
            "{name} held dirty in the cache: {st}"
        );
    }
    srv.kill9();
    // The restart has to restore them: the cleaner (above its watermark only) wrote back
    // little or nothing.
    let on_backing = ["a", "b"].map(|name| {
        let on_disk = std::fs::read(d.join(format!("{name}.img"))).unwrap();
        on_disk[..4 << 20] == std::fs::read(d.join(format!("{name}.src"))).unwrap()[..]
    });
    assert_eq!(
        on_backing,
        [false, false],
        "the data was written back before the kill"
    );
    let swapped = vec![two.vols[1].clone(), two.vols[0].clone()];
    let srv = Srv::custom(d, &vol_args(&two.cache, &swapped, &[]));
    for name in ["a", "b"] {
        let out = d.join(format!("{name}.read"));
        read_export(&srv, name, &out);
        let got = std::fs::read(&out).unwrap();
        let want = std::fs::read(d.join(format!("{name}.src"))).unwrap();
        assert!(
            got[..4 << 20] == want[..],
            "volume {name} lost data at the restart"
        );
        assert!(
            got[4 << 20..].iter().all(|&x| x == 0),
            "volume {name}: beyond its data"
        );
    }
    srv.stop("-TERM");
}

/// The volume table names what is wrong: a volume's disk swapped for another, a volume with
/// dirty data left out, `--backing` on a cache of several volumes. A volume left out with
/// only clean lines is served without (its lines dropped), and comes back later.
#[test]
fn a_swapped_or_missing_volume_is_refused_by_name() {
    if !(have("nbdcopy") && have("nbdinfo")) {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let (d, cache, both) = (two.d(), &two.cache, &two.vols);
    sized(&d.join("c.img"), 8 << 20);
    random_file(&d.join("src"), 1 << 20, 3);
    let path = |n: &str| two.img(n);
    let srv = two.serve(&["--mode", "write-back"]);
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(d.join("src"))
        .arg(export(&srv, "b")));
    srv.stop("-TERM");
    let refused = |vols: &[String], extra: &[&str]| {
        let mut a = vec!["--cache", cache.as_str()];
        for v in vols {
            a.extend(["--volume", v.as_str()]);
        }
        a.extend(extra);
        serve_refused(d, &a)
    };
    // b's disk swapped for c (same size): refused, naming b.
    let e = refused(
        &[format!("a={}", path("a")), format!("b={}", path("c"))],
        &[],
    );
    assert!(e.contains("volume b:") && e.contains("c.img"), "{e}");
    // b left out while it holds dirty data: refused, naming b.
    let e = refused(&[format!("a={}", path("a"))], &[]);
    assert!(e.contains("volume b (") && e.contains("dirty"), "{e}");
    // --backing on a cache of several volumes.
    let e = serve_refused(d, &["--cache", cache, "--backing", &path("a")]);
    assert!(e.contains("several volumes") && e.contains("a, b"), "{e}");
    // Flushed, b may be left out: served without it, and back later with its data.
    let srv = two.serve(&[]);
    srv.ctl(&["flush"]);
    srv.stop("-TERM");
    let srv = Srv::custom(d, &vol_args(cache, &both[..1], &[]));
    let list = run(Command::new("nbdinfo").args(["--list", &srv.uri()]));
    assert!(
        !list.contains("export=\"b\"") && !list.contains("export=b\n"),
        "{list}"
    );
    let log = srv.stop("-TERM");
    assert!(
        log.contains("volume b") && log.contains("not served"),
        "{log}"
    );
    let srv = two.serve(&[]);
    let out = d.join("b.read");
    read_export(&srv, "b", &out);
    let got = std::fs::read(&out).unwrap();
    assert!(got[..1 << 20] == std::fs::read(d.join("src")).unwrap()[..]);
    srv.stop("-TERM");
}

/// `tiercache check` of a cache of several volumes (superblock v5, volume table): every
/// volume's lines are inside its own backing device (not volume 0's), each volume is listed
/// with its recorded backing device, lines and dirty lines, and the check is consistent.
#[test]
fn check_reads_the_volume_table() {
    if !have("nbdcopy") {
        return;
    }
    let two = TwoVolumes::new(4 << 20, 8 << 20);
    let (d, cache) = (two.d(), &two.cache);
    random_file(&d.join("src"), 6 << 20, 5);
    let srv = two.serve(&["--mode", "write-back"]);
    // b's data lies beyond a's end: on a check that took every key for volume 0's, they
    // would lie outside the backing device.
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(d.join("src"))
        .arg(export(&srv, "b")));
    srv.stop("-TERM");
    let out = Command::new(common::BIN)
        .args(["check", cache])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check failed: {text}");
    assert!(
        text.contains("volumes       2 in the volume table"),
        "{text}"
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("volume {name} ")))
            .unwrap_or_else(|| panic!("no line for volume {name}: {text}"))
            .to_string()
    };
    assert!(
        line("a").contains("a.img") && line("a").contains("0 dirty"),
        "{text}"
    );
    assert!(
        line("b").contains("b.img") && line("b").contains(&format!("{} bytes", 8 << 20)),
        "{text}"
    );
    let out = Command::new(common::BIN)
        .args(["check", "--json", cache])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let b = &v["volumes"].as_array().unwrap()[1];
    assert_eq!(b["name"], "b", "{v}");
    assert!(b["dirty_lines"].as_u64().unwrap() > 500, "{v}");
    assert_eq!(v["volumes"][0]["lines"], 0, "{v}");
}

/// `tiercache ctl ARGS` against the server in `d` that must fail: its stderr.
fn ctl_fails(d: &Path, args: &[&str]) -> String {
    let out = Command::new(common::BIN)
        .arg("ctl")
        .arg("--control")
        .arg(d.join("ctl.sock"))
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "ctl {args:?} succeeded: {err}");
    err
}

/// `ctl --volume NAME`: one volume's statistics and its own mode and admission for the run,
/// the other volume and the pool untouched; an unknown name is refused listing the volumes,
/// a setting of the pool is refused naming the per-volume ones; `ctl stats` without
/// --volume shows the per-volume table.
#[test]
fn ctl_volume_reads_and_sets_one_volume() {
    if !have("nbdcopy") {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let d = two.d();
    random_file(&d.join("src"), 1 << 20, 7);
    let srv = two.serve(&["--mode", "write-back"]);
    let put = |name: &str| {
        run(Command::new("nbdcopy")
            .arg("--flush")
            .arg(d.join("src"))
            .arg(export(&srv, name)))
    };
    let e = ctl_fails(d, &["--volume", "c", "stats"]);
    assert!(e.contains("no volume \"c\": the volumes are a, b"), "{e}");
    put("a");
    put("b");
    let t = srv.ctl(&["--volume", "a", "stats"]);
    assert!(t.contains("volume          a (id 0)"), "{t}");
    assert!(t.contains("mode            write-back"), "{t}");
    assert!(t.contains("a.img") && !t.contains("b.img"), "{t}");
    // b leaves write-back: its dirty data written back first; a stays in write-back.
    let t = srv.ctl(&["--volume", "b", "mode", "write-through"]);
    assert!(
        t.contains("volume b: mode is now write-through (was write-back"),
        "{t}"
    );
    let vs = |name: &str| -> serde_json::Value {
        serde_json::from_str(&srv.ctl(&["--volume", name, "stats", "--json"])).unwrap()
    };
    assert_eq!(vs("b")["mode"], "write-through");
    assert_eq!(vs("b")["dirty_lines"], 0, "{}", vs("b"));
    assert_eq!(vs("a")["mode"], "write-back");
    put("a");
    put("b");
    assert!(
        vs("a")["dirty_lines"].as_u64().unwrap() > 100,
        "{}",
        vs("a")
    );
    assert_eq!(vs("b")["dirty_lines"], 0, "{}", vs("b"));
    assert_eq!(
        srv.ctl(&["get", "mode"]).trim(),
        "write-back",
        "the pool's mode"
    );
    // Admission per volume: a's read misses bypass, b's are admitted.
    let t = srv.ctl(&["--volume", "a", "set", "admission", "never"]);
    assert!(t.contains("volume a: admission: always -> never"), "{t}");
    assert_eq!(
        srv.ctl(&["--volume", "a", "get", "admission"]).trim(),
        "never"
    );
    assert_eq!(
        srv.ctl(&["--volume", "b", "get", "admission"]).trim(),
        "always"
    );
    assert_eq!(srv.ctl(&["get", "admission"]).trim(), "always");
    for name in ["a", "b"] {
        read_export(&srv, name, &d.join(format!("{name}.read")));
    }
    let bypassed = |name: &str| {
        vs(name)["counters"]["bypasses"]["admission"]
            .as_u64()
            .unwrap()
    };
    assert!(bypassed("a") > 1000, "{}", vs("a"));
    assert_eq!(bypassed("b"), 0, "{}", vs("b"));
    // Settings of the pool, and pool-wide commands, are refused by name.
    let e = ctl_fails(d, &["--volume", "a", "set", "dirty-high", "0.5"]);
    assert!(
        e.contains("dirty-high is a setting of the pool")
            && e.contains("mode, admission, seq-cutoff, seq-cutoff-write"),
        "{e}"
    );
    let e = ctl_fails(d, &["--volume", "a", "get", "policy"]);
    assert!(e.contains("policy is a setting of the pool"), "{e}");
    let e = ctl_fails(d, &["--volume", "a", "stats", "--reset"]);
    assert!(e.contains("whole pool"), "{e}");
    // Without --volume: one line per volume.
    let t = srv.ctl(&["stats"]);
    let row = |name: &str| {
        t.lines()
            .find(|l| l.starts_with(&format!("{name} ")) && l.contains(".img"))
            .unwrap_or_else(|| panic!("no row for volume {name}: {t}"))
            .to_string()
    };
    assert!(t.contains("backing") && t.contains("lost"), "{t}");
    assert!(
        row("a").contains("a.img") && row("a").contains("write-back"),
        "{t}"
    );
    assert!(
        row("b").contains("b.img") && row("b").contains("write-through"),
        "{t}"
    );
    assert!(t.contains("volume a ") && t.contains("volume b "), "{t}");
    // Detach one volume: the other keeps serving in its mode.
    srv.ctl(&["--volume", "a", "detach"]);
    assert_eq!(vs("a")["mode"], "pass-through");
    assert_eq!(vs("a")["dirty_lines"], 0);
    assert_eq!(vs("b")["mode"], "write-through");
    srv.stop("-TERM");
}

/// `--volume` with the log layout is refused at start: asked for (`--layout log`), or on a
/// cache formatted in the log layout.
#[test]
fn the_log_layout_refuses_several_volumes() {
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let (d, cache) = (two.d(), &two.cache);
    let (va, vb) = (&two.vols[0], &two.vols[1]);
    let e = serve_refused(
        d,
        &[
            "--cache",
            cache,
            "--format-if-needed",
            "--cache-size",
            "16M",
            "--layout",
            "log",
            "--volume",
            va,
            "--volume",
            vb,
        ],
    );
    assert!(
        e.contains("--volume") && e.contains("needs the direct layout"),
        "{e}"
    );
    assert!(
        !Path::new(cache).exists(),
        "a refused start left a cache file"
    );
    let srv = Srv::custom(
        d,
        &[
            "--cache",
            cache,
            "--format-if-needed",
            "--cache-size",
            "16M",
            "--layout",
            "log",
            "--backing",
            &two.img("a"),
        ],
    );
    srv.stop("-TERM");
    let e = serve_refused(d, &["--cache", cache, "--volume", va, "--volume", vb]);
    assert!(
        e.contains("log layout, which serves one volume") && e.contains("--volume"),
        "{e}"
    );
}

/// A damaged dirty sector of volume b (data checksums): `check` names it within volume b,
/// and after the server finds it (`ctl flush` writes it back), the log, `ctl stats` and the
/// volume's figures name the lost range as `volume b: bytes X..Y`, never the raw pool address.
#[test]
fn lost_ranges_are_named_within_their_volume() {
    if !have("nbdcopy") {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let (d, cache) = (two.d(), &two.cache);
    // 64 KiB of a pattern no other block holds, at byte 1 MiB of b.
    let mut img = vec![0u8; 2 << 20];
    for (i, x) in img[1 << 20..(1 << 20) + (64 << 10)].iter_mut().enumerate() {
        *x = (i % 251) as u8 ^ 0x5a;
    }
    std::fs::write(d.join("src"), &img).unwrap();
    let extra = ["--mode", "write-back", "--data-checksums"];
    let srv = two.serve(&extra);
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(d.join("src"))
        .arg(export(&srv, "b")));
    srv.stop("-TERM");
    // Flip one byte of the pattern's first block in the cache file.
    let mut c = std::fs::read(cache).unwrap();
    let pat = &img[1 << 20..(1 << 20) + 4096];
    let at = c
        .windows(4096)
        .position(|w| w == pat)
        .expect("the pattern is cached");
    c[at + 100] ^= 0xff;
    std::fs::write(cache, &c).unwrap();
    let out = Command::new(common::BIN)
        .args(["check", cache])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("volume b: bytes 1048576..") && t.contains("data checksum mismatch"),
        "{t}"
    );
    let srv = two.serve(&extra);
    srv.ctl(&["flush"]);
    let t = srv.ctl(&["stats"]);
    assert!(t.contains("LOST dirty data"), "{t}");
    assert!(t.contains("volume b: bytes 1048576.."), "{t}");
    let b: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["--volume", "b", "stats", "--json"])).unwrap();
    assert_eq!(b["lost_ranges"][0][0], 1048576, "{b}");
    let a: serde_json::Value =
        serde_json::from_str(&srv.ctl(&["--volume", "a", "stats", "--json"])).unwrap();
    assert_eq!(a["lost_ranges"], serde_json::json!([]), "{a}");
    // The JSON of the pool's stats too: volume b's name and offsets, not its pool address.
    let st = srv.stats();
    let r = &st["lost_dirty_ranges"][0];
    assert_eq!(r["volume"], "b", "{st}");
    assert_eq!(r["start"], 1048576, "{st}");
    let end = r["end"].as_u64().unwrap_or(0);
    assert!(end > 1048576 && end <= (1 << 20) + (64 << 10), "{st}");
    // A read of it fails, and the error (in the server's structured NBD reply) names it
    // within volume b.
    let out = Command::new("nbdcopy")
        .arg(export(&srv, "b"))
        .arg(d.join("b.read"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the lost range read");
    let log = srv.stop("-TERM");
    assert!(log.contains("volume b: bytes 1048576.."), "{log}");
    // Volume b's pool addresses are 2^48 (281474976710656) and up.
    assert!(!log.contains("2814749") && !t.contains("2814749"), "{log}");
    assert!(!log.contains("volume id"), "{log}");
    let out = Command::new(common::BIN)
        .args(["check", "--json", cache])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &v["lost_list"][0];
    assert_eq!(
        (&l["volume"], &l["start"]),
        (&"b".into(), &1048576.into()),
        "{v}"
    );
    assert_eq!(l["end"].as_u64(), Some(end), "{v}");
}

/// Whether `nbdinfo --list` of `srv` lists export `name`.
fn listed(srv: &Srv, name: &str) -> bool {
    let list = run(Command::new("nbdinfo").args(["--list", &srv.uri()]));
    list.contains(&format!("export=\"{name}\"")) || list.contains(&format!("export={name}\n"))
}

/// Writes `src` to export `name` (flushed) and reads the export back into `out`; whether
/// the first `src.len()` bytes read are `src`'s.
fn put_and_check(srv: &Srv, name: &str, src: &Path, out: &Path) -> bool {
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(src)
        .arg(export(srv, name)));
    read_export(srv, name, out);
    let want = std::fs::read(src).unwrap();
    std::fs::read(out).unwrap()[..want.len()] == want[..]
}

/// `ctl volume add`: the new export is listed and serves reads and writes when ctl returns,
/// with the mode given (write-back in a write-through pool); a bad device or a name served
/// already is refused. The cache records it: after kill -9 a restart with the same command
/// line (which does not name it) serves it again from the device recorded, with its mode,
/// and its acknowledged, flushed data (held dirty in the cache) is there.
#[test]
fn ctl_volume_add_serves_at_once_and_survives_kill_9() {
    if !(have("nbdinfo") && have("nbdcopy")) {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let d = two.d();
    sized(&d.join("c.img"), 12 << 20);
    random_file(&d.join("c.src"), 3 << 20, 11);
    random_file(&d.join("a.src"), 2 << 20, 12);
    let srv = two.serve(&[]);
    assert!(!listed(&srv, "c"));
    assert!(put_and_check(&srv, "a", &d.join("a.src"), &d.join("a.out")));
    let e = ctl_fails(d, &["volume", "add", "a=/nonexistent/x.img"]);
    assert!(e.contains("backing device /nonexistent/x.img"), "{e}");
    let c = format!("c={}", two.img("c"));
    let e = ctl_fails(d, &["volume", "add", &two.vols[0]]);
    assert!(e.contains("volume a is served already"), "{e}");
    let t = srv.ctl(&["volume", "add", &c, "--mode", "wb"]);
    assert!(t.contains("volume c added: 12582912 bytes"), "{t}");
    assert!(listed(&srv, "c") && listed(&srv, "a"));
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(d.join("c.src"))
        .arg(export(&srv, "c")));
    let st = srv.stats();
    assert_eq!(volume(&st, "c")["mode"], "write-back", "{st}");
    assert_eq!(volume(&st, "c")["id"], 2, "{st}");
    assert_eq!(volume(&st, "a")["mode"], "write-through", "{st}");
    assert!(
        volume(&st, "c")["dirty_lines"].as_u64().unwrap() > 100,
        "c's data is held dirty in the cache: {st}"
    );
    srv.kill9();
    assert!(
        std::fs::read(d.join("c.img")).unwrap()[..3 << 20]
            != std::fs::read(d.join("c.src")).unwrap()[..],
        "c's data was written back before the kill"
    );
    let srv = two.serve(&[]);
    assert!(listed(&srv, "c"), "c not restored");
    read_export(&srv, "c", &d.join("c.out"));
    let got = std::fs::read(d.join("c.out")).unwrap();
    assert!(got[..3 << 20] == std::fs::read(d.join("c.src")).unwrap()[..]);
    assert_eq!(got.len(), 12 << 20);
    read_export(&srv, "a", &d.join("a.out"));
    assert!(
        std::fs::read(d.join("a.out")).unwrap()[..2 << 20]
            == std::fs::read(d.join("a.src")).unwrap()[..]
    );
    let st = srv.stats();
    assert_eq!(volume(&st, "c")["mode"], "write-back", "{st}");
    srv.stop("-TERM");
    // The per-volume flags name a volume added live too (the table records it), and a name
    // neither given nor recorded is refused once the table is read.
    let e = serve_refused(
        d,
        &vol_args(&two.cache, &two.vols, &["--volume-admission", "x=never"]),
    );
    assert!(
        e.contains("--volume-admission x=never: no --volume named \"x\""),
        "{e}"
    );
    assert!(e.contains("volumes: a, b, c"), "{e}");
    let srv = two.serve(&[
        "--volume-mode",
        "c=write-through",
        "--volume-admission",
        "c=never",
    ]);
    let st = srv.stats();
    assert_eq!(volume(&st, "c")["mode"], "write-through", "{st}");
    let t = srv.ctl(&["--volume", "c", "get"]);
    assert!(t.contains("admission") && t.contains("never"), "{t}");
    srv.stop("-TERM");
}

/// `ctl volume remove`: refused while the volume holds dirty data (naming `detach`); after
/// `ctl --volume b detach` it goes: not listed, a new connection is refused saying it was
/// removed, a connection still open gets EIO, its lines leave the pool, and a client of
/// volume a writing and reading meanwhile sees no error. kill -9 then a restart with the same
/// command line does not serve b (a warning says so) and a's data is intact. The name is
/// free again: `volume add b=...` on another device is a new volume (id 2) that reads that
/// device, and a restart without b on the command line serves it from the device recorded.
#[test]
fn ctl_volume_remove_refuses_dirty_data_then_leaves_the_others_serving() {
    if !(have("nbdinfo") && have("nbdcopy")) {
        return;
    }
    let two = TwoVolumes::new(8 << 20, 8 << 20);
    let d = two.d();
    random_file(&d.join("a.src"), 2 << 20, 21);
    random_file(&d.join("b.src"), 2 << 20, 22);
    random_file(&d.join("b2.img"), 4 << 20, 23);
    let srv = two.serve(&["--mode", "write-back"]);
    assert!(put_and_check(&srv, "b", &d.join("b.src"), &d.join("b.out")));
    let e = ctl_fails(d, &["volume", "remove", "b"]);
    assert!(
        e.contains("volume b holds") && e.contains("run `ctl --volume b detach` first"),
        "{e}"
    );
    assert!(listed(&srv, "b"));
    // A client of a, busy through the removal.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a_client = {
        let (stop, uri, d) = (stop.clone(), export(&srv, "a"), d.to_path_buf());
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 2 {
                run(Command::new("nbdcopy")
                    .arg("--flush")
                    .arg(d.join("a.src"))
                    .arg(&uri));
                run(Command::new("nbdcopy").arg(&uri).arg(d.join("a.out")));
                let got = std::fs::read(d.join("a.out")).unwrap();
                assert!(got[..2 << 20] == std::fs::read(d.join("a.src")).unwrap()[..]);
                rounds += 1;
            }
            rounds
        })
    };
    // A client of b connected before the removal, reading after it.
    let mut b_client = Client::connect(&export(&srv, "b")).unwrap();
    let mut buf = vec![0u8; 4096];
    b_client.read(0, &mut buf).unwrap();
    let t = srv.ctl(&["--volume", "b", "detach"]);
    assert!(t.contains("now pass-through"), "{t}");
    let t = srv.ctl(&["volume", "remove", "b"]);
    assert!(t.contains("volume b removed"), "{t}");
    let e = b_client.read(0, &mut buf).unwrap_err();
    assert_eq!(e.errno(), Some(5), "an open connection gets EIO: {e}");
    let e = b_client.write(0, &buf).unwrap_err();
    assert_eq!(e.errno(), Some(5), "{e}");
    match Client::connect(&export(&srv, "b")) {
        Err(e) => assert!(e.to_string().contains("export \"b\" was removed"), "{e}"),
        Ok(_) => panic!("a new connection to removed export b was accepted"),
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(a_client.join().unwrap() >= 2);
    assert!(!listed(&srv, "b") && listed(&srv, "a"));
    // nbdinfo shows the NBD error (ENOENT), not the server's message (checked above).
    let refused = Command::new("nbdinfo")
        .arg(export(&srv, "b"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let st = srv.stats();
    assert!(
        st["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "b"),
        "{st}"
    );
    // detach wrote b's data back before the removal.
    assert!(
        std::fs::read(d.join("b.img")).unwrap()[..2 << 20]
            == std::fs::read(d.join("b.src")).unwrap()[..]
    );
    srv.kill9();
    let srv = two.serve(&["--mode", "write-back"]);
    assert!(!listed(&srv, "b") && listed(&srv, "a"));
    read_export(&srv, "a", &d.join("a.out"));
    assert!(
        std::fs::read(d.join("a.out")).unwrap()[..2 << 20]
            == std::fs::read(d.join("a.src")).unwrap()[..]
    );
    // Name reuse: a new volume b on another device.
    let b2 = format!("b={}", d.join("b2.img").display());
    srv.ctl(&["volume", "add", &b2]);
    read_export(&srv, "b", &d.join("b.out"));
    assert!(std::fs::read(d.join("b.out")).unwrap() == std::fs::read(d.join("b2.img")).unwrap());
    assert_eq!(volume(&srv.stats(), "b")["id"], 2);
    srv.kill9();
    let only_a = vec![two.vols[0].clone()];
    let srv = Srv::custom(d, &vol_args(&two.cache, &only_a, &["--mode", "write-back"]));
    assert!(
        listed(&srv, "b"),
        "the re-added b is restored from its recorded device"
    );
    assert_eq!(volume(&srv.stats(), "b")["id"], 2);
    let log = srv.stop("-TERM");
    assert!(
        log.contains("volume b (added with `ctl volume add`)"),
        "{log}"
    );
}

/// A RAM tier above a pool of two volumes (issue 15 item 3 with item 1): both volumes hold
/// the same offsets with different bytes, so a RAM tier keyed by offset alone would serve one
/// volume's bytes to the other; a volume switched to pass-through leaves RAM and fills it no
/// more while the other keeps its lines; a removed volume's lines leave RAM.
#[test]
fn a_ram_tier_above_two_volumes_keeps_each_volumes_lines_apart() {
    let two = TwoVolumes::new(0, 0);
    let d = two.d();
    random_file(&d.join("a.img"), 4 << 20, 31);
    random_file(&d.join("b.img"), 4 << 20, 32);
    let srv = two.serve(&["--mode", "write-through", "--ram-cache", "1MiB"]);
    let mut c: Vec<Client> = ["a", "b"]
        .iter()
        .map(|n| Client::connect(&export(&srv, n)).unwrap())
        .collect();
    let file = |n: &str| std::fs::read(d.join(format!("{n}.img"))).unwrap();
    // Reads the first 64 KiB of volume `i` twice (the second from RAM) and checks them.
    let read_twice = |c: &mut Vec<Client>, i: usize, want: &[u8]| {
        for round in 0..2 {
            let mut buf = vec![0u8; 64 << 10];
            c[i].read(0, &mut buf).unwrap();
            assert!(
                buf == want[..64 << 10],
                "volume {i}, read {round}: not its own bytes"
            );
        }
    };
    let ram = |srv: &Srv| {
        let r = srv.stats()["ram"].clone();
        (
            r["cached_lines"].as_u64().unwrap(),
            r["ram_hits"].as_u64().unwrap(),
        )
    };
    read_twice(&mut c, 0, &file("a"));
    let (a_lines, h0) = ram(&srv);
    assert!(
        a_lines >= 16 && h0 >= 1,
        "a's lines in RAM: {a_lines}, hits {h0}"
    );
    read_twice(&mut c, 1, &file("b"));
    let (lines, h1) = ram(&srv);
    assert_eq!(lines, 2 * a_lines, "b's lines beside a's");
    assert!(h1 > h0, "b's second read was not served from RAM");
    // A write to a at offset 0 leaves a's RAM copy, not b's.
    let new = vec![0xA5u8; 64 << 10];
    c[0].write(0, &new).unwrap();
    read_twice(&mut c, 0, &new);
    read_twice(&mut c, 1, &file("b"));

    // b passes through: its lines leave RAM, a's stay, b's reads fill nothing.
    srv.ctl(&["--volume", "b", "mode", "pass-through"]);
    assert_eq!(ram(&srv).0, a_lines);
    let (_, h2) = ram(&srv);
    read_twice(&mut c, 1, &file("b"));
    assert_eq!(
        ram(&srv),
        (a_lines, h2),
        "a pass-through volume used the RAM tier"
    );
    srv.ctl(&["--volume", "b", "mode", "write-through"]);
    read_twice(&mut c, 1, &file("b"));
    assert_eq!(ram(&srv).0, 2 * a_lines);

    // b leaves the pool: its lines leave RAM.
    let t = srv.ctl(&["volume", "remove", "b"]);
    assert!(t.contains("volume b removed"), "{t}");
    assert_eq!(
        ram(&srv).0,
        a_lines,
        "a removed volume's lines stayed in RAM"
    );
    read_twice(&mut c, 0, &new);
    srv.stop("-TERM");
}

/// kill -9 of a pool whose volumes run different modes (write-back pool with a write-through
/// volume, and the reverse): the write-through volume's acknowledged writes (FLUSHed or not)
/// are on its backing device at the kill; the write-back volume's FLUSHed writes are held
/// dirty in the cache only. The restart (same command line) serves both volumes' data, each
/// volume in its own mode: in either pool the write-back volume's lines are still dirty
/// until `ctl flush` writes them to its device (the open writes back only the dirty lines of
/// volumes not in write-back).
#[test]
fn kill_9_with_a_mode_per_volume_restores_each_volume() {
    if !have("nbdcopy") {
        return;
    }
    for (pool, b_mode) in [
        ("write-back", "write-through"),
        ("write-through", "write-back"),
    ] {
        let two = TwoVolumes::new(8 << 20, 8 << 20);
        let d = two.d();
        random_file(&d.join("a.src"), 4 << 20, 41);
        random_file(&d.join("b.src"), 4 << 20, 42);
        let b_setting = format!("b={b_mode}");
        let args = ["--mode", pool, "--volume-mode", b_setting.as_str()];
        let (wb, wt) = if pool == "write-back" {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let srv = two.serve(&args);
        for name in ["a", "b"] {
            run(Command::new("nbdcopy")
                .arg("--flush")
                .arg(d.join(format!("{name}.src")))
                .arg(export(&srv, name)));
        }
        // Acknowledged, never FLUSHed, on the write-through volume.
        let tail = vec![0x5Au8; 64 << 10];
        let mut c = Client::connect(&export(&srv, wt)).unwrap();
        c.write(5 << 20, &tail).unwrap();
        let st = srv.stats();
        assert_eq!(volume(&st, wb)["mode"], "write-back", "{pool}");
        assert_eq!(volume(&st, wt)["mode"], "write-through", "{pool}");
        assert!(
            volume(&st, wb)["dirty_lines"].as_u64().unwrap() > 500,
            "{pool}: {wb} held dirty in the cache: {st}"
        );
        assert_eq!(volume(&st, wt)["dirty_lines"], 0, "{pool}: {st}");
        srv.kill9();
        let img = |n: &str| std::fs::read(d.join(format!("{n}.img"))).unwrap();
        let src = |n: &str| std::fs::read(d.join(format!("{n}.src"))).unwrap();
        let on_wt = img(wt);
        assert!(
            on_wt[..4 << 20] == src(wt)[..] && on_wt[5 << 20..(5 << 20) + (64 << 10)] == tail[..],
            "{pool}: write-through volume {wt}: acknowledged writes missing from its device at the kill"
        );
        assert!(
            img(wb)[..4 << 20] != src(wb)[..],
            "{pool}: {wb}'s data was written back before the kill: the restart is not tested"
        );

        let srv = two.serve(&args);
        let st = srv.stats();
        assert_eq!(
            volume(&st, wb)["mode"],
            "write-back",
            "{pool} after restart"
        );
        assert_eq!(
            volume(&st, wt)["mode"],
            "write-through",
            "{pool} after restart"
        );
        // Each volume recovers in its own mode: the write-back volume's dirty lines are
        // restored dirty, in a write-through pool too (its open writes back only the dirty
        // lines of volumes not in write-back); `ctl flush` below writes them back.
        let dirty = volume(&st, wb)["dirty_lines"].as_u64().unwrap();
        assert!(
            dirty > 500,
            "{pool}: {wb}'s dirty lines were not restored dirty: {st}"
        );
        assert!(
            img(wb)[..4 << 20] != src(wb)[..],
            "{pool}: {wb}'s dirty lines were written back at the open"
        );
        for name in ["a", "b"] {
            let out = d.join(format!("{name}.read"));
            read_export(&srv, name, &out);
            let got = std::fs::read(&out).unwrap();
            assert!(
                got[..4 << 20] == src(name)[..],
                "{pool}: volume {name} lost data"
            );
        }
        let got = std::fs::read(d.join(format!("{wt}.read"))).unwrap();
        assert!(
            got[5 << 20..(5 << 20) + (64 << 10)] == tail[..],
            "{pool}: {wt}'s tail"
        );
        srv.ctl(&["flush"]);
        assert_eq!(
            volume(&srv.stats(), wb)["dirty_lines"],
            0,
            "{pool}: after ctl flush"
        );
        assert!(
            img(wb)[..4 << 20] == src(wb)[..],
            "{pool}: ctl flush did not write {wb}'s restored dirty lines to its device"
        );
        srv.stop("-TERM");
    }
}

/// One class table for the pool, one classifier per volume (issue 15 item 1): each volume's
/// ext4 classifier learns its own volume's file system at start, and rules match offsets
/// within each volume, so the same rule classes the first MiB of both volumes.
#[test]
fn each_volume_is_classified_by_its_own_classifier() {
    if !(have("nbdcopy") && have("mkfs.ext4")) {
        return;
    }
    let two = TwoVolumes::new(32 << 20, 32 << 20);
    let d = two.d();
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(two.img("b")));
    let stats = |srv: &Srv| -> serde_json::Value {
        serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap()
    };
    // ext4: only b holds a file system, and only b's classifier finds it.
    let srv = two.serve(&["--classifier", "ext4"]);
    let c = &stats(&srv)["classifier"];
    assert_eq!(c["name"], "ext4", "{c}");
    assert_eq!(c["volumes"]["b"]["ext4_found"], true, "{c}");
    assert_eq!(c["volumes"]["a"]["ext4_found"], false, "{c}");
    let t = srv.ctl(&["stats"]);
    assert!(
        t.contains("classifier      ext4 (volume b): ext4 found"),
        "{t}"
    );
    assert!(
        t.contains("classifier      ext4 (volume a): no ext4 seen"),
        "{t}"
    );
    srv.stop("-TERM");
    // rules: the first MiB of each volume is metadata.
    std::fs::remove_file(&two.cache).unwrap();
    let rules = d.join("rules.toml");
    std::fs::write(
        &rules,
        "version = 1\n[[rule]]\nclass = \"metadata\"\noffset = [0, 1048576]\n",
    )
    .unwrap();
    let srv = two.serve(&[
        "--classifier",
        "rules",
        "--class-rules",
        rules.to_str().unwrap(),
        "--mode",
        "write-through",
    ]);
    random_file(&d.join("src"), 2 << 20, 3);
    for name in ["a", "b"] {
        run(Command::new("nbdcopy")
            .arg(d.join("src"))
            .arg(export(&srv, name)));
    }
    let st = stats(&srv);
    let line = st["line_size"].as_u64().unwrap();
    let metadata = st["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "metadata")
        .unwrap_or_else(|| panic!("no metadata class: {}", st["classes"]))["cached_lines"]
        .as_u64()
        .unwrap();
    assert_eq!(metadata, 2 * (1 << 20) / line, "{}", st["classes"]);
    // A volume added live is classified by its own offsets too.
    sized(&d.join("c.img"), 8 << 20);
    srv.ctl(&["volume", "add", &format!("c={}", two.img("c"))]);
    run(Command::new("nbdcopy")
        .arg(d.join("src"))
        .arg(export(&srv, "c")));
    let st = stats(&srv);
    assert!(
        st["classifier"]["volumes"]["c"].is_object(),
        "{}",
        st["classifier"]
    );
    let metadata = st["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "metadata")
        .unwrap()["cached_lines"]
        .as_u64()
        .unwrap();
    assert_eq!(metadata, 3 * (1 << 20) / line, "{}", st["classes"]);
    srv.stop("-TERM");
}
