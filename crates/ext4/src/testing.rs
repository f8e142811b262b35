//! Test helpers shared by this crate's accuracy tests and the server's live classifier tests
//! (feature `testing`): deterministic file contents, a directory tree of many file sizes, and
//! ground truth from e2fsprogs (`dumpe2fs` for the group layout, `debugfs stat` for every
//! inode's extents, extent tree blocks and size).

use crate::file_class;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::process::Command;

pub const K: u64 = 1024;
pub const M: u64 = 1024 * 1024;

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `cmd`, panicking with its stderr when it fails; returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Deterministic non-zero filler (mkfs -d turns all-zero blocks into holes).
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// A file of `size` bytes of [`fill`] data, written 1 MiB at a time.
pub fn write_file(path: &Path, size: u64, seed: u64) {
    let mut f = File::create(path).unwrap();
    let mut buf = vec![0u8; M as usize];
    let mut left = size;
    let mut s = seed;
    while left > 0 {
        let n = left.min(M) as usize;
        fill(&mut buf[..n], s);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
        s += 1;
    }
}

/// `dirs` directories `/dN` (each with a `sub`) of files from 1 KiB to 5 MiB, and `/many`, a
/// directory of 300 small files (several directory blocks); returns (path, is_dir).
pub fn populate_dirs(root: &Path, dirs: usize) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let sizes = [
        K,
        3 * K,
        5 * K,
        12 * K,
        20 * K,
        50 * K,
        100 * K,
        300 * K,
        700 * K,
        2 * M,
        5 * M,
    ];
    for d in 0..dirs {
        let dir = format!("d{d}");
        fs::create_dir_all(root.join(&dir).join("sub")).unwrap();
        out.push((format!("/{dir}"), true));
        out.push((format!("/{dir}/sub"), true));
        for (i, &s) in sizes.iter().enumerate() {
            let name = format!("/{dir}/f{i}_{s}");
            write_file(
                &root.join(&name[1..]),
                s + d as u64 * 7,
                (d * 100 + i) as u64,
            );
            out.push((name, false));
        }
        let name = format!("/{dir}/sub/small");
        write_file(&root.join(&name[1..]), 2 * K, d as u64);
        out.push((name, false));
    }
    fs::create_dir_all(root.join("many")).unwrap();
    out.push(("/many".into(), true));
    for i in 0..300u64 {
        let name = format!("/many/file_with_a_longish_name_{i:04}");
        write_file(&root.join(&name[1..]), K + (i * 37) % (7 * K), 5000 + i);
        out.push((name, false));
    }
    out
}

/// Parses "A-B" or "A" into an inclusive range.
pub fn range(s: &str) -> Option<(u64, u64)> {
    let s = s.split_whitespace().next()?;
    match s.split_once('-') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
        None => Some((s.parse().ok()?, s.parse().ok()?)),
    }
}

/// Ground truth for the image `img` holding `paths`: the DSS class name of every block
/// ("unallocated" when nothing owns it). Runs `dumpe2fs` and `debugfs` (writes `img` with the
/// extension `cmds` beside it).
pub fn ground_truth(img: &Path, paths: &[(String, bool)]) -> Vec<&'static str> {
    let dump = run(Command::new("dumpe2fs").arg(img));
    let field = |name: &str| -> u64 {
        dump.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("dumpe2fs: no {name}"))
    };
    let blocks = field("Block count:");
    let first_data = field("First block:");
    let has_journal = dump
        .lines()
        .any(|l| l.starts_with("Filesystem features:") && l.contains("has_journal"));
    let mut truth = vec!["unallocated"; blocks as usize];
    for b in 0..first_data {
        truth[b as usize] = "metadata";
    }
    for line in dump.lines().filter(|l| l.starts_with("  ")) {
        for piece in line.split(", ").map(str::trim) {
            let is_meta = [
                "superblock at",
                "Group descriptors at",
                "Group descriptor at",
                "Reserved GDT blocks at",
                "Block bitmap at",
                "Inode bitmap at",
                "Inode table at",
            ]
            .iter()
            .any(|p| piece.contains(p));
            if !is_meta {
                continue;
            }
            if let Some((a, b)) = range(piece.rsplit(" at ").next().unwrap()) {
                for x in a..=b {
                    truth[x as usize] = "metadata";
                }
            }
        }
    }
    // Inode 7 (resize inode) owns a double indirect block; its data blocks are the reserved
    // GDT blocks, already labelled from dumpe2fs.
    let mut targets: Vec<String> = vec!["/".into(), "/lost+found".into(), "<7>".into()];
    if has_journal {
        targets.push("<8>".into());
    }
    targets.extend(paths.iter().map(|(p, _)| p.clone()));
    let cmds: String = targets.iter().map(|t| format!("stat {t}\n")).collect();
    let cmdfile = img.with_extension("cmds");
    fs::write(&cmdfile, cmds).unwrap();
    let out = run(Command::new("debugfs").arg("-f").arg(&cmdfile).arg(img));
    for section in out.split("debugfs: stat ").skip(1) {
        if !section.contains("Inode:") || section.contains("File not found") {
            continue;
        }
        let dir = section.contains("Type: directory");
        let journal = section.starts_with("<8>");
        let resize = section.starts_with("<7>");
        let size: u64 = section
            .split("Size: ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .expect("stat without Size");
        let Some(ext) = section
            .split("EXTENTS:")
            .nth(1)
            .or_else(|| section.split("BLOCKS:").nth(1))
        else {
            continue;
        };
        let data_class = if journal {
            "journal"
        } else if dir {
            "directory"
        } else {
            file_class(size)
        };
        for entry in ext.split(", ").map(str::trim) {
            let Some((logical, phys)) = entry.split_once("):") else {
                continue;
            };
            let Some((a, b)) = range(phys) else {
                continue;
            };
            let class = if logical.contains("ETB") || logical.contains("IND") {
                "metadata"
            } else if resize {
                continue;
            } else {
                data_class
            };
            for x in a..=b {
                truth[x as usize] = class;
            }
        }
    }
    truth
}
