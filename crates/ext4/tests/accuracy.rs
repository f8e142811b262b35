//! Classifier accuracy against ground truth from e2fsprogs (`dumpe2fs` for the group layout,
//! `debugfs stat` for every inode's extents and extent tree blocks), on images made in the test
//! with `mkfs.ext4 -d`, then after files grow and are deleted (`debugfs -w`), feeding only the
//! blocks that changed, as a cache would see them being written.
//!
//! Skips with a printed message when e2fsprogs is missing (`apt-get install e2fsprogs`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use tiercache_ext4::testing::{fill, ground_truth, populate_dirs, range, run, write_file, K, M};
use tiercache_ext4::{class_name, BlockKind, Ext4Classifier};

fn tools_present() -> bool {
    ["mkfs.ext4", "mke2fs", "debugfs", "dumpe2fs"]
        .iter()
        .all(|t| {
            Command::new(t)
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success() || !o.stderr.is_empty())
        })
}

macro_rules! require_tools {
    () => {
        if !tools_present() {
            tiercache_testskip::skip!(
                "mkfs.ext4/mke2fs/debugfs/dumpe2fs not found; install e2fsprogs \
                 (apt-get install e2fsprogs) to run the ext4 classifier accuracy tests"
            );
            return;
        }
    };
}

/// Sparse file of `size` bytes with `chunk` bytes of data every `stride` bytes.
fn write_sparse(path: &Path, size: u64, chunk: u64, stride: u64, seed: u64) {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut buf = vec![0u8; chunk as usize];
    let mut off = 0;
    while off + chunk <= size {
        fill(&mut buf, seed + off);
        f.write_all_at(&buf, off).unwrap();
        off += stride;
    }
}

/// Populates `root` with directories and files from 1 KiB to 64 MiB; returns (path, is_dir).
fn populate(root: &Path, dirs: usize, big: bool) -> Vec<(String, bool)> {
    let mut out = populate_dirs(root, dirs);
    fs::create_dir_all(root.join("big")).unwrap();
    out.push(("/big".into(), true));
    let bigs: &[(&str, u64)] = if big {
        &[("/big/dense12m", 12 * M), ("/big/dense20m", 20 * M)]
    } else {
        &[("/big/dense6m", 6 * M)]
    };
    for (i, (name, s)) in bigs.iter().enumerate() {
        write_file(&root.join(&name[1..]), *s, 9000 + i as u64);
        out.push((name.to_string(), false));
    }
    // 64 MiB sparse, 1 MiB of data every 8 MiB.
    write_sparse(&root.join("big/sparse64m"), 64 * M, M, 8 * M, 7);
    out.push(("/big/sparse64m".into(), false));
    // Fragmented: 4 KiB every 64 KiB forces a multi-block extent tree (index + leaf blocks).
    write_sparse(&root.join("big/frag64m"), 64 * M, 4 * K, 64 * K, 11);
    out.push(("/big/frag64m".into(), false));
    // Empty file and a fast symlink own no blocks.
    File::create(root.join("empty")).unwrap();
    out.push(("/empty".into(), false));
    out
}

#[derive(Debug, Default)]
struct Score {
    meta_ok: u64,
    meta_all: u64,
    file_ok: u64,
    file_all: u64,
    free_claimed: u64,
    free_all: u64,
    per_class: HashMap<&'static str, (u64, u64)>,
}

impl Score {
    fn meta(&self) -> f64 {
        self.meta_ok as f64 / self.meta_all.max(1) as f64
    }
    fn file(&self) -> f64 {
        self.file_ok as f64 / self.file_all.max(1) as f64
    }
}

fn score(c: &Ext4Classifier, truth: &[&'static str]) -> Score {
    let mut s = Score::default();
    for (b, &t) in truth.iter().enumerate() {
        let got = class_name(c.classify_block(b as u64));
        let ok = got == t;
        let e = s.per_class.entry(t).or_default();
        e.0 += u64::from(ok);
        e.1 += 1;
        if t == "unallocated" {
            s.free_all += 1;
            s.free_claimed += u64::from(!ok);
        } else if t.starts_with("file") {
            s.file_all += 1;
            s.file_ok += u64::from(ok);
        } else {
            s.meta_all += 1;
            s.meta_ok += u64::from(ok);
        }
    }
    s
}

fn report(label: &str, s: &Score) {
    println!(
        "{label}: metadata/journal/directory {}/{} = {:.4}, file blocks {}/{} = {:.4}, \
         free blocks labelled as owned {}/{}",
        s.meta_ok,
        s.meta_all,
        s.meta(),
        s.file_ok,
        s.file_all,
        s.file(),
        s.free_claimed,
        s.free_all
    );
    let mut classes: Vec<_> = s.per_class.iter().collect();
    classes.sort();
    for (c, (ok, all)) in classes {
        println!("    {c:<12} {ok:>8}/{all:<8}");
    }
}

fn assert_accurate(label: &str, s: &Score) {
    report(label, s);
    assert!(
        s.meta_all > 100,
        "{label}: too few metadata blocks in truth"
    );
    assert!(s.file_all > 1000, "{label}: too few file blocks in truth");
    assert!(
        s.meta() >= 0.99,
        "{label}: metadata accuracy {:.4}",
        s.meta()
    );
    assert!(s.file() >= 0.99, "{label}: file accuracy {:.4}", s.file());
    assert!(
        s.free_claimed as f64 <= 0.01 * s.free_all as f64,
        "{label}: {} free blocks labelled as owned",
        s.free_claimed
    );
    // Every size class present in the truth must itself be >= 99 % right.
    for (c, (ok, all)) in &s.per_class {
        if *all >= 50 {
            assert!(
                *ok as f64 >= 0.99 * *all as f64,
                "{label}: class {c} {ok}/{all}"
            );
        }
    }
}

/// Feeds the image like a mount then a full read would: superblock, GDT, then every block.
fn feed_mount_order(c: &mut Ext4Classifier, img: &Path) {
    let f = File::open(img).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    c.observe(0, &head);
    let bs = c.block_size().expect("superblock not recognised");
    let n = c.blocks_count().unwrap();
    let mut blk = vec![0u8; bs as usize];
    for b in 1..(64 * K / bs).min(n) {
        f.read_exact_at(&mut blk, b * bs).unwrap();
        c.observe(b * bs, &blk);
    }
    let mut r = std::io::BufReader::with_capacity(M as usize, File::open(img).unwrap());
    for b in 0..n {
        r.read_exact(&mut blk).unwrap();
        c.observe(b * bs, &blk);
    }
}

/// Feeds exactly the blocks that differ between two images (what a cache sees written).
fn feed_changed(c: &mut Ext4Classifier, old: &Path, new: &Path) -> u64 {
    let bs = c.block_size().unwrap();
    let mut a = std::io::BufReader::with_capacity(M as usize, File::open(old).unwrap());
    let mut b = std::io::BufReader::with_capacity(M as usize, File::open(new).unwrap());
    let len = fs::metadata(new).unwrap().len();
    let (mut x, mut y) = (vec![0u8; bs as usize], vec![0u8; bs as usize]);
    let mut changed = 0;
    for blk in 0..len / bs {
        a.read_exact(&mut x).unwrap();
        b.read_exact(&mut y).unwrap();
        if x != y {
            c.observe(blk * bs, &y);
            changed += 1;
        }
    }
    changed
}

fn learn_eager(img: &Path) -> Ext4Classifier {
    let f = File::open(img).unwrap();
    let len = f.metadata().unwrap().len();
    let mut c = Ext4Classifier::new();
    let found = c.learn_from_image(|off, buf| {
        buf.fill(0);
        if off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], off).unwrap();
        }
    });
    assert!(found);
    c
}

struct Case {
    name: &'static str,
    mkfs: Vec<&'static str>,
    size: &'static str,
    dirs: usize,
    big: bool,
}

fn check_case(case: Case) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut paths = populate(&src, case.dirs, case.big);
    let img = tmp.path().join("fs.img");
    let mut cmd = Command::new(case.mkfs[0]);
    cmd.args(&case.mkfs[1..])
        .arg("-q")
        .arg("-F")
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg(case.size);
    run(&mut cmd);

    // 1. Learned from the blocks a mount plus a full read would pass through the cache.
    let truth = ground_truth(&img, &paths);
    let mut c = Ext4Classifier::new();
    feed_mount_order(&mut c, &img);
    assert!(c.is_ext4());
    assert_accurate(&format!("{} observed", case.name), &score(&c, &truth));
    println!("    learned: {:?}", c.stats());

    // 2. Learned eagerly at server start.
    let eager = learn_eager(&img);
    assert_accurate(
        &format!("{} learn_from_image", case.name),
        &score(&eager, &truth),
    );

    // 3. Files grow, are deleted, inodes are reused; the cache sees only the changed blocks.
    let old = tmp.path().join("old.img");
    fs::copy(&img, &old).unwrap();
    let grow_src = tmp.path().join("grow");
    write_file(&grow_src, 3 * M + 5 * K, 77);
    let small_src = tmp.path().join("small");
    write_file(&small_src, 9 * K, 78);
    let mut cmds = String::new();
    let d0 = |i: usize, s: u64| format!("/d0/f{i}_{s}");
    // Deleted files.
    for d in 1..case.dirs {
        for (i, s) in [(0usize, K), (4, 20 * K), (9, 2 * M)] {
            cmds.push_str(&format!("rm /d{d}/f{i}_{}\n", s + d as u64 * 7));
        }
    }
    cmds.push_str("rm /big/sparse64m\n");
    // Files grow: allocate more blocks and raise the size (1 KiB -> 600 KiB, 5 KiB -> 3 MiB).
    for (path, blocks, size) in [(d0(0, K), 150, 600 * K), (d0(2, 5 * K), 768, 3 * M)] {
        cmds.push_str(&format!("fallocate {path} 0 {}\n", blocks - 1));
        cmds.push_str(&format!("sif {path} size {size}\n"));
    }
    // Rewritten bigger under the same name (inode freed, reused for the new file).
    cmds.push_str(&format!("rm {}\n", d0(3, 12 * K)));
    cmds.push_str(&format!("write {} {}\n", grow_src.display(), d0(3, 12 * K)));
    // New files in freed space.
    for i in 0..20 {
        cmds.push_str(&format!("write {} /many/new_{i}\n", small_src.display()));
        paths.push((format!("/many/new_{i}"), false));
    }
    let cmdfile = tmp.path().join("modify.cmds");
    fs::write(&cmdfile, &cmds).unwrap();
    let out = run(Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&cmdfile)
        .arg(&img));
    assert!(!out.contains("not found"), "debugfs: {out}");
    let truth2 = ground_truth(&img, &paths);
    let changed = feed_changed(&mut c, &old, &img);
    println!("    {changed} blocks changed");
    let s = score(&c, &truth2);
    assert_accurate(&format!("{} after grow/delete", case.name), &s);
    // Blocks whose class changed (grown files moved to a larger size class, freed space
    // reused by new files) exist, and were all relabelled (checked per block above).
    let relabelled = truth
        .iter()
        .zip(&truth2)
        .filter(|(a, b)| a != b && b.starts_with("file"))
        .count();
    println!("    {relabelled} blocks changed class to a file class");
    assert!(relabelled > 100, "only {relabelled} blocks changed class");
    // Deleted files' blocks are no longer labelled (they are free in the truth).
    let was_file = truth
        .iter()
        .zip(&truth2)
        .filter(|(a, b)| a.starts_with("file") && **b == "unallocated")
        .count();
    assert!(was_file > 100, "deletes freed only {was_file} blocks");
}

#[test]
fn ext4_4k_blocks_with_journal() {
    require_tools!();
    check_case(Case {
        name: "ext4 4K",
        mkfs: vec!["mkfs.ext4", "-b", "4096"],
        size: "256M",
        dirs: 4,
        big: true,
    });
}

#[test]
fn ext4_4k_blocks_without_journal() {
    require_tools!();
    check_case(Case {
        name: "ext4 4K no journal",
        mkfs: vec!["mke2fs", "-t", "ext4", "-b", "4096", "-O", "^has_journal"],
        size: "200M",
        dirs: 3,
        big: false,
    });
}

#[test]
fn ext4_1k_blocks() {
    require_tools!();
    check_case(Case {
        name: "ext4 1K",
        mkfs: vec!["mkfs.ext4", "-b", "1024"],
        size: "200M",
        dirs: 3,
        big: false,
    });
}

#[test]
fn ext4_meta_bg_64bit() {
    require_tools!();
    check_case(Case {
        name: "ext4 meta_bg 64bit",
        mkfs: vec![
            "mkfs.ext4",
            "-b",
            "1024",
            "-O",
            "meta_bg,^resize_inode,64bit",
        ],
        size: "200M",
        dirs: 3,
        big: false,
    });
}

#[test]
fn ext3_block_mapped_files() {
    require_tools!();
    check_case(Case {
        name: "ext3 block-mapped",
        mkfs: vec!["mke2fs", "-t", "ext3", "-b", "4096"],
        size: "200M",
        dirs: 3,
        big: false,
    });
}

#[test]
fn overwritten_file_system_is_forgotten() {
    require_tools!();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    populate(&src, 1, false);
    let img = tmp.path().join("fs.img");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("64M"));
    let c0 = learn_eager(&img);
    assert!(c0.stats().inodes > 10);
    let mut c = c0;
    // Something that is not ext4 is written over the superblock.
    c.observe(0, &[0xAB; 4096]);
    assert!(!c.is_ext4());
    assert_eq!(c.classify(0, 4096), BlockKind::Unknown);
    assert_eq!(c.stats().inodes, 0);
}

/// Journal extents `(logical, physical, len)` of inode 8 from `debugfs stat <8>`.
fn journal_extents(img: &Path) -> Vec<(u64, u64, u64)> {
    let out = run(Command::new("debugfs").arg("-R").arg("stat <8>").arg(img));
    let ext = out.split("EXTENTS:").nth(1).expect("journal has extents");
    let mut v = Vec::new();
    for entry in ext.split(", ").map(str::trim) {
        let Some((logical, phys)) = entry.split_once("):") else {
            continue;
        };
        let (l0, _) = range(logical.trim_start_matches('(')).unwrap();
        let (p0, p1) = range(phys).unwrap();
        v.push((l0, p0, p1 - p0 + 1));
    }
    v
}

/// In a live system, new inodes, extent and directory blocks reach the journal at commit and
/// their home locations only at checkpoint, much later. The classifier reads jbd2 descriptor
/// blocks and learns the logged copies: here the cache sees the new data blocks at home and the
/// metadata only as a jbd2 transaction (descriptor, copies, commit), as ext4 writes it.
#[test]
fn journal_transactions_teach_before_checkpoint() {
    require_tools!();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut paths = populate(&src, 2, false);
    let img = tmp.path().join("fs.img");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("128M"));
    let mut c = Ext4Classifier::new();
    feed_mount_order(&mut c, &img);
    let old = tmp.path().join("old.img");
    fs::copy(&img, &old).unwrap();
    let truth = ground_truth(&img, &paths);

    let big = tmp.path().join("big");
    write_file(&big, 3 * M, 1);
    let small = tmp.path().join("small");
    write_file(&small, 10 * K, 2);
    let mut cmds = String::from("rm /d1/f10_5242887\nmkdir /newdir\n");
    for i in 0..10 {
        cmds.push_str(&format!("write {} /newdir/big{i}\n", big.display()));
        cmds.push_str(&format!("write {} /newdir/small{i}\n", small.display()));
        paths.push((format!("/newdir/big{i}"), false));
        paths.push((format!("/newdir/small{i}"), false));
    }
    paths.push(("/newdir".into(), true));
    let cmdfile = tmp.path().join("m.cmds");
    fs::write(&cmdfile, cmds).unwrap();
    run(Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&cmdfile)
        .arg(&img));
    let truth2 = ground_truth(&img, &paths);

    let bs = 4096u64;
    let (a, b) = (File::open(&old).unwrap(), File::open(&img).unwrap());
    let mut logged: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut data_blocks = 0;
    let (mut x, mut y) = (vec![0u8; bs as usize], vec![0u8; bs as usize]);
    for blk in 0..truth2.len() as u64 {
        a.read_exact_at(&mut x, blk * bs).unwrap();
        b.read_exact_at(&mut y, blk * bs).unwrap();
        if x == y {
            continue;
        }
        let t = (truth[blk as usize], truth2[blk as usize]);
        let is_meta = |c: &str| c == "metadata" || c == "directory";
        if is_meta(t.0) || is_meta(t.1) {
            logged.push((blk, y.clone()));
        } else {
            c.observe(blk * bs, &y);
            data_blocks += 1;
        }
    }
    let before = score(&c, &truth2);
    report("journal test, data blocks only", &before);

    // One jbd2 transaction in the journal (after its superblock): descriptor blocks with tags,
    // the logged copies, a commit block.
    let jext = journal_extents(&old);
    let phys = |l: u64| {
        jext.iter()
            .find(|(l0, _, n)| l >= *l0 && l < l0 + n)
            .map(|(l0, p0, _)| p0 + (l - l0))
            .unwrap()
    };
    let mut jsb = vec![0u8; bs as usize];
    a.read_exact_at(&mut jsb, phys(0) * bs).unwrap();
    let incompat = u32::from_be_bytes(jsb[0x28..0x2C].try_into().unwrap());
    let (v3, wide) = (incompat & 0x10 != 0, incompat & 0x2 != 0);
    let csum2 = incompat & 0x8 != 0;
    let tag_bytes = if v3 {
        16
    } else {
        (12 + if csum2 { 2 } else { 0 }) - if wide { 0 } else { 4 }
    };
    let tail = if v3 || csum2 { 4 } else { 0 };
    let header = |kind: u32| {
        let mut blk = vec![0u8; bs as usize];
        blk[0..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        blk[4..8].copy_from_slice(&kind.to_be_bytes());
        blk[8..12].copy_from_slice(&7u32.to_be_bytes());
        blk
    };
    let mut jl = 1u64;
    let mut journal_writes = 0;
    for chunk in logged.chunks(100) {
        let mut desc = header(1);
        let mut off = 12;
        for (i, (home, _)) in chunk.iter().enumerate() {
            let mut flags: u32 = if i == 0 { 0 } else { 2 };
            if i == chunk.len() - 1 {
                flags |= 8;
            }
            let t = &mut desc[off..off + tag_bytes];
            t[0..4].copy_from_slice(&(*home as u32).to_be_bytes());
            if v3 {
                t[4..8].copy_from_slice(&flags.to_be_bytes());
                t[8..12].copy_from_slice(&((*home >> 32) as u32).to_be_bytes());
            } else {
                t[6..8].copy_from_slice(&(flags as u16).to_be_bytes());
                if wide {
                    t[8..12].copy_from_slice(&((*home >> 32) as u32).to_be_bytes());
                }
            }
            off += tag_bytes + if i == 0 { 16 } else { 0 };
            assert!(off + tag_bytes + tail <= bs as usize);
        }
        c.observe(phys(jl) * bs, &desc);
        jl += 1;
        for (_, data) in chunk {
            c.observe(phys(jl) * bs, data);
            jl += 1;
        }
        journal_writes += chunk.len() + 1;
    }
    c.observe(phys(jl) * bs, &header(2));
    println!(
        "    {data_blocks} data blocks at home, {} metadata blocks only via {journal_writes} \
         journal blocks",
        logged.len()
    );
    let after = score(&c, &truth2);
    assert_accurate("journal test, data + jbd2 transaction", &after);
    assert!(
        after.file_ok > before.file_ok + 1000,
        "the journal taught nothing: {} -> {}",
        before.file_ok,
        after.file_ok
    );
}
