//! End to end: `tiercache serve` as a subprocess, driven by real NBD clients (nbdcopy,
//! fio --ioengine=nbd with crc32c verification, qemu-img), restarted cleanly (SIGTERM) and
//! killed (SIGKILL), and checked after every restart. Tools that are missing skip their part
//! with a printed message (install: `apt-get install -y libnbd-bin fio qemu-utils`).

mod common;

use common::{have, replay_qd1, run, sha, Mounted, Srv, BIN};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn setup(size_mb: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("backing.img")).unwrap();
    f.set_len(size_mb << 20).unwrap();
    dir
}

#[test]
fn nbdcopy_image_survives_clean_restart_and_kill() {
    if !have("nbdcopy") || !have("sha256sum") {
        return;
    }
    let dir = setup(32);
    let d = dir.path();
    let img = d.join("random.img");
    run(Command::new("head")
        .args(["-c", "16777216", "/dev/urandom"])
        .stdout(std::fs::File::create(&img).unwrap()));
    let want = sha(&img);
    let srv = Srv::start(d, &["--mode", "write-back"]);
    run(Command::new("nbdcopy").arg(&img).arg(srv.uri()));
    let back = d.join("back.img");
    let read_back = |srv: &Srv| {
        let _ = std::fs::remove_file(&back);
        run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
        let f = std::fs::OpenOptions::new().write(true).open(&back).unwrap();
        f.set_len(16 << 20).unwrap();
        sha(&back)
    };
    assert_eq!(read_back(&srv), want);
    let stats: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert!(
        stats["totals"]["write_bytes"].as_u64().unwrap() >= 16 << 20,
        "{stats}"
    );
    assert!(srv.ctl(&["stats"]).contains("write-back"));
    // Clean restart: the dirty data is still only in the cache, and comes back.
    srv.stop("-TERM");
    let srv = Srv::start(d, &[]);
    assert_eq!(read_back(&srv), want);
    // With --flush nbdcopy flushes at the end; after that a SIGKILL loses nothing.
    let img2 = d.join("random2.img");
    run(Command::new("head")
        .args(["-c", "16777216", "/dev/urandom"])
        .stdout(std::fs::File::create(&img2).unwrap()));
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&img2)
        .arg(srv.uri()));
    let log = srv.stop("-KILL");
    let srv = Srv::start(d, &[]);
    assert_eq!(read_back(&srv), sha(&img2), "after kill -9 ({log})");
    // Detach writes everything back: the backing file alone then holds the image.
    srv.ctl(&["detach"]);
    srv.stop("-TERM");
    let f = std::fs::read(d.join("backing.img")).unwrap();
    assert_eq!(&f[..16 << 20], &std::fs::read(&img2).unwrap()[..]);
}

#[test]
fn fio_verify_in_every_mode() {
    if !have("fio") {
        return;
    }
    for mode in [
        "write-through",
        "write-back",
        "write-around",
        "read-only",
        "pass-through",
    ] {
        let dir = setup(32);
        let srv = Srv::start(dir.path(), &["--mode", mode]);
        // In the temp dir: fio leaves its verify state files in its working directory.
        let out = run(Command::new("fio").current_dir(dir.path()).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri()),
            "--rw=randwrite",
            "--bs=4k",
            "--size=24M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--output-format=terse",
        ]));
        assert!(!out.contains("verify failed"), "{mode}: {out}");
        srv.stop("-TERM");
        // After a restart the data fio wrote still verifies (read-only verify pass).
        let srv = Srv::start(dir.path(), &[]);
        run(Command::new("fio").current_dir(dir.path()).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri()),
            "--rw=randwrite",
            "--bs=4k",
            "--size=24M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_only",
        ]));
        srv.stop("-TERM");
    }
}

#[test]
fn qemu_img_info_and_metrics() {
    if !have("qemu-img") {
        return;
    }
    let dir = setup(16);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let srv = Srv::start(dir.path(), &["--metrics", &addr]);
    let info = run(Command::new("qemu-img").args(["info", "--output=json", &srv.uri()]));
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["virtual-size"].as_u64(), Some(16 << 20), "{info}");
    assert!(srv.ctl(&["flush"]).contains("flushed"));
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for m in [
        "tiercache_line_hits_total{class=\"0\"}",
        "tiercache_dirty_bytes",
        "tiercache_request_latency_seconds_bucket{op=\"read\"",
    ] {
        assert!(body.contains(m), "{m} missing from {body}");
    }
    assert!(srv.ctl(&["mode", "wb"]).contains("write-back"));
    srv.stop("-TERM");
}

#[test]
fn ext4_through_nbdfuse_survives_restart() {
    if !have("nbdfuse") || !have("losetup") || !have("mkfs.ext4") {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        tiercache_testskip::skip!("/dev/fuse is missing");
        return;
    }
    let dir = setup(64);
    let d = dir.path();
    let srv = Srv::start(d, &["--mode", "write-back"]);
    let files: Vec<(String, Vec<u8>)> = (0..20u32)
        .map(|i| {
            let n = 1000 + i as usize * 37_001;
            let data = (0..n)
                .map(|k| ((k as u32).wrapping_mul(2_654_435_761) ^ i) as u8)
                .collect();
            (format!("f{i}.bin"), data)
        })
        .collect();
    {
        let Some(m) = Mounted::attach(&srv, d, true) else {
            return;
        };
        for (name, data) in &files {
            std::fs::write(m.mnt.join(name), data).unwrap();
        }
        run(&mut Command::new("sync"));
    }
    srv.stop("-TERM");
    let srv = Srv::start(d, &[]);
    let m = Mounted::attach(&srv, d, false).expect("remount after restart");
    for (name, data) in &files {
        assert_eq!(
            &std::fs::read(m.mnt.join(name)).unwrap(),
            data,
            "{name} after restart"
        );
    }
    drop(m);
    srv.stop("-TERM");
}

/// The live server runs the simulator's engine, so one connection at queue depth 1 with
/// inline cleaning must give `tiercache sim`'s counters exactly: every hit, miss, insertion,
/// eviction, write-back and byte moved — for LRU and FIFO, write-through and write-back, on a
/// synthetic workload with unaligned sub-line requests (cleaning triggers) and on a real MSR
/// Cambridge trace (12.6 GiB address space, backing file sparse); and, with LRU, for the
/// engine settings both take with the same flags (issue 19): `--preset database` (8 KiB
/// lines in 1 MiB groups, populate on the 2nd read, never on writes), `--admission nhit:2:1`
/// with 64 KiB groups of 4 KiB lines, and `--seq-cutoff 256k`.
#[test]
fn replay_at_queue_depth_1_matches_the_simulator_exactly() {
    let configs: [(&str, &[&str]); 4] = [
        ("defaults", &[]),
        ("preset database", &["--preset", "database"]),
        (
            "nhit:2:1, 64k groups of 4k lines",
            &[
                "--admission",
                "nhit:2:1",
                "--group-size",
                "64k",
                "--line-size",
                "4k",
            ],
        ),
        ("seq-cutoff 256k", &["--seq-cutoff", "256k"]),
    ];
    // Per setting: whether some run made it act (admission or seq-cutoff bypasses).
    let mut acted = [true, false, false, false];
    let zipf = "zipf:theta=0.8,wss=32MiB,requests=3000,read=10,size=4k@70+16k@20+1k@10,align=512";
    let msr = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/msr_cambridge/msr-cambridge1-sample.csv");
    let mut inputs: Vec<(&str, Vec<String>, u64)> = vec![(
        "zipf",
        vec![
            "--workload".into(),
            zipf.into(),
            "--seed".into(),
            "7".into(),
        ],
        32,
    )];
    if msr.exists() {
        inputs.push((
            "msr",
            vec!["--trace".into(), msr.display().to_string()],
            13 << 10,
        ));
    } else {
        tiercache_testskip::skip!("msr part: {} not found", msr.display());
    }
    let (mut cleaned, mut evicted) = (false, false);
    for (ci, (setting, flags)) in configs.iter().enumerate() {
        // Sequential cutoff acts on streams: a mostly sequential input for it as well.
        let seq: (&str, Vec<String>, u64) = (
            "iometer",
            vec![
                "--workload".into(),
                "iometer:random=40,wss=32MiB,requests=3000,read=60,size=16k@70+64k@30".into(),
                "--seed".into(),
                "7".into(),
            ],
            32,
        );
        for (name, input, backing_mb) in inputs.iter().chain((ci == 3).then_some(&seq)) {
            for policy in ["lru", "fifo"]
                .into_iter()
                .take(if ci == 0 { 2 } else { 1 })
            {
                for mode in ["write-through", "write-back"] {
                    let dir = setup(*backing_mb);
                    let mut args = vec!["--policy", policy, "--mode", mode, "--cleaner", "inline"];
                    args.extend(*flags);
                    let srv = Srv::start(dir.path(), &args);
                    let rep = replay_qd1(&srv.uri(), input.iter().filter(|a| *a != "--trace"));
                    let live: serde_json::Value =
                        serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
                    srv.stop("-TERM");
                    let sim = run(Command::new(BIN)
                        .args([
                            "sim",
                            "--cache-size",
                            "8MiB",
                            "--policy",
                            policy,
                            "--mode",
                            mode,
                        ])
                        .args(*flags)
                        .args(["--json"])
                        .args(input));
                    let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
                    let (want, got) = (&sim["counters"], &live["totals"]);
                    assert!(want["requests"].as_u64().unwrap() > 500, "{name}: {want}");
                    assert_eq!(
                        rep["requests"].as_u64(),
                        want["requests"].as_u64(),
                        "{name}: the replay sent every request: {rep}"
                    );
                    for (k, v) in want.as_object().unwrap() {
                        assert_eq!(
                            &got[k], v,
                            "{name} {policy} {mode} {setting}: counter {k}: sim {v}, live {}",
                            got[k]
                        );
                    }
                    let b = &want["bypasses"];
                    acted[ci] |= match ci {
                        1 | 2 => b["admission"].as_u64().unwrap() > 0,
                        3 => b["seq_cutoff"].as_u64().unwrap() > 0,
                        _ => true,
                    };
                    let c = |k: &str| want[k].as_u64().unwrap();
                    assert!(c("line_hits") > 0, "{name}: {want}");
                    evicted |= c("evictions") > 0;
                    cleaned |= c("write_backs") > c("dirty_evictions");
                }
            }
        }
    }
    for (i, (setting, _)) in configs.iter().enumerate() {
        assert!(
            acted[i],
            "{setting}: no run bypassed for it: the setting was not exercised"
        );
    }
    assert!(
        cleaned && evicted,
        "no input made the cleaner run or evicted: the test lost its point"
    );
}

/// A backing device that is itself an NBD export (here `tiercache serve-file`, a plain file
/// server): a write-back cache in front of it writes back over NBD, and a restart is warm.
#[test]
fn nbd_export_as_backing_device() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote.img");
    std::fs::File::create(&remote)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let remote_sock = dir.path().join("remote.sock");
    /// Kills the file server however the test ends (it holds the test's output pipe).
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _file_server = Killed(
        Command::new(BIN)
            .args(["serve-file", "--file"])
            .arg(&remote)
            .arg("--socket")
            .arg(&remote_sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while !remote_sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "serve-file did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let backing = format!("nbd+unix:///?socket={}", remote_sock.display());
    // A random 16 MiB image, written through the cache (8 MiB: half of it is evicted and so
    // written back during the copy), then flushed.
    let img = dir.path().join("img");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..16 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&img, &bytes).unwrap();
    let srv = Srv::launch(dir.path(), &backing, "8M", &["--mode", "write-back"]);
    run(Command::new("nbdcopy").arg(&img).arg(srv.uri()));
    srv.ctl(&["flush"]);
    let log = srv.stop("-TERM");
    assert!(log.contains("backing device: NBD export"), "{log}");
    assert_eq!(sha(&remote), sha(&img), "written back over NBD");

    // Warm restart: the cache comes back full, and reads return the image.
    let srv = Srv::launch(dir.path(), &backing, "8M", &[]);
    let st: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(
        st["cached_lines"], 2048,
        "a warm restart keeps the cache: {st}"
    );
    let back = dir.path().join("back");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert_eq!(sha(&back), sha(&img));
    srv.stop("-TERM");
}

/// The same proof for the log layout (issue 19): one connection at queue depth 1 against
/// `serve --layout log` gives `tiercache sim --layout log`'s counters exactly — lines, hits
/// (duplicate and RAM hits included), extents stored and evicted, duplicate writes, bytes
/// before and after compression, segments sealed and reclaimed, write-backs and every byte
/// moved — and the same reduction figures. The content is the simulator's content model made
/// real: `replay --content` writes each line's modelled bytes (30 % from a pool of
/// duplicates, random bytes then zeros), the backing file starts with version 0 of every
/// line (what the simulation reads before a line is written), and `sim --content-lengths
/// measured` compresses those bytes with the cache's compressor. With a class table (a
/// `never` class, rules by offset) every class's engine counters agree too.
#[test]
fn log_layout_replay_at_queue_depth_1_matches_the_simulator_exactly() {
    use tiercache_trace::content::ContentModel;
    const SEED: u64 = 7;
    const LINE: u64 = 4096;
    const BACKING_MB: u64 = 32;
    let aligned = "zipf:theta=0.8,wss=32MiB,requests=3000,read=50,size=4k@70+16k@30,align=4096";
    // Sub-line writes merge into the line's current bytes (cached, or read from the backing
    // device), so the written content is not the model's: no compression and no dedup there,
    // where only lengths count.
    let unaligned =
        "zipf:theta=0.8,wss=32MiB,requests=3000,read=40,size=4k@40+1k@40+16k@20,align=512";
    // A class table (issue 19): requests below 8 MiB are `hot`, the rest `cold`, never
    // cached; classified by the table's rules live (`--classifier rules`) and in the
    // simulator (`sim --classes` relabels the input by the same rules).
    let table = "version = 1\nname = \"split\"\n\
        [[class]]\nid = 1\nname = \"hot\"\npriority = 0\nallocation = \"always\"\n\
        [[class]]\nid = 2\nname = \"cold\"\npriority = 1\nallocation = \"never\"\n\
        [[rule]]\nclass = \"hot\"\noffset = [0, 8388608]\n\
        [[rule]]\nclass = \"cold\"\noffset = [8388608, 33554432]\n";
    // (mode, compression, dedup index, picker, workload, class table, reclamation flags)
    let trim_ahead: &[&str] = &["--trim", "--free-reserve", "0.15"];
    let reinsert: &[&str] = &["--reinsert-hits", "1"];
    let configs = [
        ("write-back", "lz4", "1.0", "lru", aligned, false, &[][..]),
        ("write-through", "zstd", "0.5", "fifo", aligned, false, &[]),
        ("write-back", "none", "1.0", "greedy", aligned, false, &[]),
        ("write-through", "none", "0", "lru", unaligned, false, &[]),
        (
            "write-back",
            "none",
            "0",
            "cost-benefit",
            unaligned,
            false,
            &[],
        ),
        ("write-back", "lz4", "1.0", "lru", aligned, true, &[]),
        ("write-through", "none", "0", "greedy", unaligned, true, &[]),
        // The reclamation settings live (theme 2): a trimmed free reserve, reinsertion.
        (
            "write-back",
            "lz4",
            "1.0",
            "lru",
            aligned,
            false,
            trim_ahead,
        ),
        (
            "write-through",
            "none",
            "1.0",
            "fifo",
            aligned,
            false,
            reinsert,
        ),
    ];
    let model = ContentModel::new(LINE, SEED);
    let mut backing = vec![0u8; (BACKING_MB << 20) as usize];
    for (line, chunk) in backing.chunks_mut(LINE as usize).enumerate() {
        model.fill(model.content(line as u64, 0).fp, chunk);
    }
    let (mut reclaimed, mut dups, mut wrote_back, mut partial) = (false, false, false, false);
    let (mut trimmed, mut reinserted) = (false, false);
    for (mode, compression, dedup, picker, workload, classes, reclaim) in configs {
        let dir = setup(BACKING_MB);
        std::fs::write(dir.path().join("backing.img"), &backing).unwrap();
        let table_file = dir.path().join("split.toml");
        std::fs::write(&table_file, table).unwrap();
        let table_file = table_file.display().to_string();
        let class_flags: Vec<&str> = if classes {
            vec!["--classes", &table_file]
        } else {
            Vec::new()
        };
        let layout = [
            "--layout",
            "log",
            "--line-size",
            "4k",
            "--segment-size",
            "256k",
            "--compression",
            compression,
            "--dedup",
            dedup,
            "--picker",
            picker,
            "--mode",
            mode,
        ];
        let layout: Vec<&str> = layout.iter().chain(reclaim).copied().collect();
        let live_flags: Vec<&str> = layout
            .iter()
            .copied()
            .chain(class_flags.iter().copied())
            .chain(if classes {
                vec!["--classifier", "rules"]
            } else {
                Vec::new()
            })
            .collect();
        let srv = Srv::start(dir.path(), &live_flags);
        let seed = SEED.to_string();
        let rep = run(Command::new(BIN).args([
            "replay",
            "--nbd",
            &srv.uri(),
            "--queue-depth",
            "1",
            "--strict",
            "--json",
            "--content",
            "--line-size",
            "4k",
            "--workload",
            workload,
            "--seed",
            &seed,
        ]));
        let rep: serde_json::Value = serde_json::from_str(&rep).unwrap();
        let live: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
        srv.stop("-TERM");
        let live = &live["log"];
        // The live cache is the segments that fit in the cache file beside its metadata.
        let capacity = live["segments"].as_u64().unwrap() * 256;
        let sim = run(Command::new(BIN)
            .args(["sim", "--cache-size", &format!("{capacity}KiB")])
            .args(&layout)
            .args(&class_flags)
            .args(["--content-lengths", "measured", "--json"])
            .args(["--workload", workload, "--seed", &seed]));
        let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
        let name = format!(
            "{mode} {compression} dedup {dedup} {picker} {workload} classes {classes} {reclaim:?}"
        );
        let (want, got) = (&sim["log"]["counters"], &live["engine"]);
        assert_eq!(
            rep["requests"].as_u64(),
            want["requests"].as_u64(),
            "{name}: the replay sent every request: {rep}"
        );
        let mut differ = Vec::new();
        for (k, v) in want.as_object().unwrap() {
            if &got[k] != v {
                differ.push(format!("{k}: sim {v}, live {}", got[k]));
            }
        }
        for k in ["dedup_ratio", "compression_ratio", "effective_capacity"] {
            let (s, l) = (sim["log"][k].as_f64(), live[k].as_f64());
            if s.zip(l).is_none_or(|(s, l)| (s - l).abs() > 1e-9) {
                differ.push(format!("{k}: sim {s:?}, live {l:?}"));
            }
        }
        if classes {
            // Every class's engine counters too, and the cold class was never cached.
            let live_classes = live["classes"].as_array().unwrap();
            let sim_classes = sim["log"]["classes"].as_object().unwrap();
            assert_eq!(sim_classes.len(), live_classes.len(), "{name}: classes");
            for lc in live_classes {
                let id = lc["id"].to_string();
                let (want, got) = (&sim_classes[&id], &lc["engine"]);
                for (k, v) in want.as_object().unwrap() {
                    if &got[k] != v {
                        differ.push(format!("class {id} {k}: sim {v}, live {}", got[k]));
                    }
                }
            }
            // (A request starting below 8 MiB is hot and may cache lines above it; a cold
            // write hitting those updates them: only misses bypass.)
            let cold = &sim_classes["2"];
            assert!(
                cold["bypassed_lines"].as_u64().unwrap() > 0,
                "{name}: {cold}"
            );
            assert!(
                sim_classes["1"]["extents_stored"].as_u64().unwrap() > 0,
                "{name}"
            );
        }
        assert!(differ.is_empty(), "{name}: {}", differ.join("; "));
        let c = |k: &str| want[k].as_u64().unwrap();
        assert!(c("read_line_hits") > 0 && c("extents_compressed") <= c("extents_stored"));
        reclaimed |= c("segments_reclaimed") > 0 && c("extents_evicted") > 0;
        // (No duplicate read hits: a read miss's content is known only once it is read.)
        assert_eq!(c("dup_read_hits"), 0, "{name}");
        dups |= c("dup_write_lines") > 0 && sim["log"]["dedup_ratio"].as_f64().unwrap() > 1.0;
        wrote_back |= c("dirty_write_backs") > 0;
        if reclaim == trim_ahead {
            // Every trimmed segment reached the cache file as a discard (hole punched).
            trimmed = c("ssd_bytes_trimmed") > 0
                && live["live"]["discard_bytes"].as_u64() == Some(c("ssd_bytes_trimmed"));
        }
        if reclaim == reinsert {
            reinserted = c("reinserted") > 0;
        }
        // Sub-line writes of uncached lines read the rest from the backing device.
        partial |= workload == unaligned
            && c("hdd_bytes_read") > (c("read_lines") - c("read_line_hits")) * LINE;
    }
    assert!(partial, "no sub-line write read the rest of its line");
    assert!(
        trimmed && reinserted,
        "the trim run discarded nothing ({trimmed}) or the reinsertion run reinserted nothing ({reinserted})"
    );
    assert!(
        reclaimed && dups && wrote_back,
        "no run reclaimed segments ({reclaimed}), found duplicates ({dups}) or wrote back \
         ({wrote_back}): the test lost its point"
    );
}
