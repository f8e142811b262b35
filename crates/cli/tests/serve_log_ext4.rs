//! The live log layout (Nitro) end to end, as a user runs it: real ext4 images made from real
//! files, cloned with small changes, written through `tiercache serve --layout log` in write-back
//! with lz4 and full deduplication, read back bit-exact (also after a clean restart and after
//! kill -9), and the dedup and compression ratios the server reports checked against
//! `scripts/reduction_ratios.py`, which computes them over the same bytes with SHA-256 and the
//! reference lz4 library.

mod common;

use common::{find_num, have, run, sha, Srv};
use std::path::{Path, PathBuf};
use std::process::Command;

const IMAGE_MIB: u64 = 40;

/// Up to `budget` bytes of regular files under the first of `roots` that exists, copied into
/// `dst` (the same relative paths).
fn copy_tree(roots: &[&str], dst: &Path, budget: u64) -> u64 {
    let Some(root) = roots.iter().map(PathBuf::from).find(|p| p.is_dir()) else {
        return 0;
    };
    let mut copied = 0;
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut es: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        es.sort();
        for p in es {
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && copied + m.len() <= budget {
                let to = dst.join(p.strip_prefix(&root).unwrap());
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                if std::fs::copy(&p, &to).is_ok() {
                    copied += m.len();
                }
            }
        }
    }
    copied
}

/// Three ext4 images: one made from real files, and two clones with small changes (a file
/// added, a file removed), made with debugfs as a user would with a mounted copy.
fn ext4_images(dir: &Path) -> Vec<PathBuf> {
    let src = dir.join("src");
    let n = copy_tree(
        &[
            "/usr/share/perl",
            "/usr/lib/python3/dist-packages",
            "/usr/share/doc",
        ],
        &src,
        (IMAGE_MIB << 20) / 2,
    );
    assert!(
        n > 4 << 20,
        "found only {n} bytes of system files to build images from"
    );
    let base = dir.join("base.ext4");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d"])
        .arg(&src)
        .arg(&base)
        .arg(format!("{IMAGE_MIB}M")));
    let added = dir.join("clone-added.ext4");
    std::fs::copy(&base, &added).unwrap();
    std::fs::write(
        dir.join("note.txt"),
        "a file only the first clone has\n".repeat(300),
    )
    .unwrap();
    run(Command::new("debugfs")
        .args(["-w", "-R"])
        .arg(format!("write {} note.txt", dir.join("note.txt").display()))
        .arg(&added));
    let removed = dir.join("clone-removed.ext4");
    std::fs::copy(&base, &removed).unwrap();
    let victim = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| src.join(n).is_file())
        .or_else(|| {
            std::fs::read_dir(&src)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .next()
        })
        .unwrap();
    let rm = if src.join(&victim).is_dir() {
        format!("rmdir {victim}")
    } else {
        format!("rm {victim}")
    };
    let _ = Command::new("debugfs")
        .args(["-w", "-R", &rm])
        .arg(&removed)
        .output();
    for img in [&base, &added, &removed] {
        let o = Command::new("e2fsck")
            .args(["-fn"])
            .arg(img)
            .output()
            .unwrap();
        assert!(
            o.status.code().is_some_and(|c| c <= 1 || c == 4),
            "e2fsck {img:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    vec![base, added, removed]
}

fn python_has_lz4() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import lz4.block"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        tiercache_testskip::skip!("python3 module lz4 is missing (python3 -m pip install lz4)");
    }
    ok
}

#[test]
fn ext4_images_through_the_log_layout_read_back_bit_exact_with_independent_ratios() {
    let tools = ["mkfs.ext4", "debugfs", "e2fsck", "nbdcopy"];
    if !tools.iter().all(|t| have(t)) || !python_has_lz4() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let imgs = ext4_images(dir);
    // The volume: the three images back to back.
    let all = dir.join("all.img");
    let mut bytes = Vec::new();
    for i in &imgs {
        bytes.extend(std::fs::read(i).unwrap());
    }
    std::fs::write(&all, &bytes).unwrap();
    let backing = dir.join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(bytes.len() as u64)
        .unwrap();
    let want = sha(&all);
    let log = [
        "--layout",
        "log",
        "--compression",
        "lz4",
        "--dedup",
        "1.0",
        "--segment-size",
        "1MiB",
        "--mode",
        "wb",
    ];
    // A cache that holds everything reduced (so the ratios describe all the bytes written).
    let srv = Srv::sized(dir, "96M", &log);
    // Every byte as data (no extents, no zero detection): the server sees every line.
    run(Command::new("nbdcopy")
        .args(["--no-extents", "-S", "0", "--flush"])
        .arg(&all)
        .arg(srv.uri()));
    let stats: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    let out = dir.join("out.img");
    let readback = |srv: &Srv, what: &str| {
        let _ = std::fs::remove_file(&out);
        run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
        assert_eq!(sha(&out), want, "read back after {what} differs");
    };
    readback(&srv, "writing");

    // The ratios, against an independent computation over the same bytes.
    let py = run(Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/reduction_ratios.py"
        ))
        .args(["--line", "4096"])
        .arg(&all));
    let indep: serde_json::Value = serde_json::from_str(&py).unwrap();
    let get =
        |k: &str| find_num(&stats, k).unwrap_or_else(|| panic!("ctl stats has no {k}: {stats:#}"));
    let (d, c) = (get("dedup_ratio"), get("compression_ratio"));
    let (di, ci) = (
        indep["dedup_ratio"].as_f64().unwrap(),
        indep["compression_ratio"].as_f64().unwrap(),
    );
    println!(
        "server: dedup {d:.4} compression {c:.4}; independent: dedup {di:.4} compression {ci:.4}"
    );
    assert!(di > 2.0, "the clones should deduplicate: {indep}");
    assert!(
        (d - di).abs() / di < 0.005,
        "dedup ratio {d} vs independent {di}"
    );
    // lz4_flex and the reference lz4 find slightly different matches.
    assert!(
        (c - ci).abs() / ci < 0.05,
        "compression ratio {c} vs independent {ci}"
    );

    // Restart clean, then crash after a flush: the same bytes each time.
    srv.stop("-TERM");
    let srv = Srv::sized(dir, "96M", &log);
    readback(&srv, "a clean restart");
    srv.kill9();
    let srv = Srv::sized(dir, "96M", &log);
    readback(&srv, "kill -9");
    for (i, img) in imgs.iter().enumerate() {
        let part = dir.join(format!("part{i}.ext4"));
        let len = std::fs::metadata(img).unwrap().len() as usize;
        let b = std::fs::read(&out).unwrap();
        std::fs::write(&part, &b[i * len..(i + 1) * len]).unwrap();
        assert_eq!(
            sha(&part),
            sha(img),
            "image {i} differs after the round trips"
        );
    }
    srv.stop("-TERM");
}
