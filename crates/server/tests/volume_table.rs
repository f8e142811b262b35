//! The volume table of a cache of several volumes under a failing cache device (issue 15):
//! `ctl volume add` and `ctl volume remove` whose superblock write reaches the device but
//! whose sync fails. The operator is told the change was not made; a restart must then serve
//! what the running server served: never a volume whose add failed, never without a volume
//! whose remove failed (nor drop the data written to it since).

mod common;

use common::{initial, tmp, VOL};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tiercache_engine::Mode;
use tiercache_server::fault::{FaultDev, FaultHandle, Faults};
use tiercache_server::live::VolumeIo;
use tiercache_server::volume::read_superblock;
use tiercache_server::volume_set::{assign_ids, VolumeSet, VolumeSpec};
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions};

/// How the cache device's syncs fail once the superblock is written.
#[derive(Clone, Copy)]
enum Arm {
    /// The next sync fails, once; the superblock write stays in the write cache (a later
    /// good sync makes it durable).
    Once,
    /// Every sync from then on fails (a cache device going bad).
    Always,
}

/// The cache device: the fault device, armed to fail syncs after the next superblock write.
struct Cache {
    dev: FaultDev,
    handle: FaultHandle,
    arm: Arc<Mutex<Option<Arm>>>,
}

impl BlockDev for Cache {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        if offset == 0 {
            match self.arm.lock().unwrap().take() {
                Some(Arm::Once) => self.handle.fail_next_sync(false),
                Some(Arm::Always) => self.handle.fail_syncs(),
                None => {}
            }
        }
        self.dev.write_at(data, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.dev.sync()
    }
}

struct Pool {
    dir: tempfile::TempDir,
    cache: PathBuf,
}

impl Pool {
    fn backing(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.img"))
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("cache.state")
    }
}

/// A cache of 64 lines of 4 KiB, formatted in `mode`, and backing files for volumes a, b, c.
fn pool(mode: Mode) -> Pool {
    let dir = tmp();
    let data: Vec<u8> = (0..VOL).map(initial).collect();
    for n in ["a", "b", "c"] {
        std::fs::write(dir.path().join(format!("{n}.img")), &data).unwrap();
    }
    let cache = dir.path().join("cache.img");
    let lines = 64;
    let bytes = tiercache_server::Superblock::data_offset_with(lines, 4096, false) + lines * 4096;
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let opts = FormatOptions {
        line_size: 4096,
        mode,
        ..Default::default()
    };
    tiercache_server::format(&FileDev::open(&cache).unwrap(), VOL, &opts).unwrap();
    Pool { dir, cache }
}

/// Opens the pool with volumes `names` as `serve --volume` does (ids from the cache's
/// table, a removed volume's name taking a new id) on `cache`.
/// A name may carry the volume's own mode (`--volume-mode`): `b=write-back`.
fn open(p: &Pool, cache: Box<dyn BlockDev>, names: &[&str], mode: Mode) -> CacheVolume {
    open_with(p, cache, names, mode, |n| {
        Box::new(FileDev::open(&p.backing(n)).unwrap())
    })
}

/// [`open`] on the cache file itself (no faults).
fn reopen(p: &Pool, names: &[&str], mode: Mode) -> CacheVolume {
    open(p, Box::new(FileDev::open(&p.cache).unwrap()), names, mode)
}

/// [`open`], volume `n`'s backing device `backing(n)`.
fn open_with(
    p: &Pool,
    cache: Box<dyn BlockDev>,
    names: &[&str],
    mode: Mode,
    backing: impl Fn(&str) -> Box<dyn BlockDev>,
) -> CacheVolume {
    let table = read_superblock(&*cache).unwrap().volumes;
    let own: Vec<Option<Mode>> = names
        .iter()
        .map(|s| s.split_once('=').map(|(_, m)| m.parse().unwrap()))
        .collect();
    let names: Vec<String> = names
        .iter()
        .map(|s| s.split('=').next().unwrap().to_string())
        .collect();
    let ids = assign_ids(&table, &names);
    let mut specs = Vec::new();
    let mut devs = Vec::new();
    for ((n, &id), &mode) in names.iter().zip(&ids).zip(&own) {
        let d = backing(n);
        specs.push(VolumeSpec {
            id,
            name: n.clone(),
            size: d.size(),
            identity: d.identity(),
            mode,
        });
        devs.push((id, n.clone(), d));
    }
    let set = VolumeSet::new(devs).unwrap();
    let opts = OpenOptions {
        mode: Some(mode),
        volumes: specs,
        state_path: Some(p.state()),
        ..Default::default()
    };
    CacheVolume::open(cache, Box::new(set), &opts)
        .unwrap_or_else(|e| panic!("open: {e}"))
        .0
}

/// The pool's cache device behind the fault device (a volatile write cache), armable.
fn faulty(p: &Pool) -> (Arc<Faults>, Cache, Arc<Mutex<Option<Arm>>>) {
    let faults = Faults::new(3);
    let (dev, handle) = faults.wrap("cache", Box::new(FileDev::open(&p.cache).unwrap()), true);
    let arm = Arc::new(Mutex::new(None));
    let c = Cache {
        dev,
        handle,
        arm: Arc::clone(&arm),
    };
    (faults, c, arm)
}

fn id_of(v: &CacheVolume, name: &str) -> u32 {
    v.volume_specs()
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("volume {name} is not served"))
        .id
}

fn write(v: &CacheVolume, name: &str, at: u64, data: &[u8]) {
    v.volume_io(id_of(v, name), VolumeIo::Write(at, data, false))
        .unwrap_or_else(|e| panic!("write to {name}: {e}"));
}

fn read(v: &CacheVolume, name: &str, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    v.volume_io(id_of(v, name), VolumeIo::Read(at, &mut b))
        .unwrap_or_else(|e| panic!("read of {name}: {e}"));
    b
}

fn flush(v: &CacheVolume, name: &str) {
    v.volume_io(id_of(v, name), VolumeIo::Flush)
        .unwrap_or_else(|e| panic!("flush of {name}: {e}"));
}

fn dirty_lines(v: &CacheVolume, name: &str) -> u64 {
    v.volume_figures()
        .iter()
        .find(|f| f.name == name)
        .unwrap()
        .dirty_lines
}

fn table_names(cache: &Path) -> Vec<(String, bool)> {
    read_superblock(&FileDev::open(cache).unwrap())
        .unwrap()
        .volumes
        .iter()
        .map(|e| (e.name.clone(), e.removed()))
        .collect()
}

#[test]
fn a_remove_whose_superblock_sync_fails_keeps_the_volume_and_what_it_is_written_after() {
    let p = pool(Mode::WriteBack);
    let (faults, cache, arm) = faulty(&p);
    let v = open(&p, Box::new(cache), &["a", "b"], Mode::WriteBack);
    write(&v, "a", 0, &[1u8; 4096]);
    *arm.lock().unwrap() = Some(Arm::Once);
    let e = v.remove_volume("b").unwrap_err();
    assert!(e.contains("not removed"), "{e}");
    assert!(arm.lock().unwrap().is_none(), "the superblock was written");
    // Still served: what its client writes now is acknowledged (dirty in the cache) and
    // made durable by a flush.
    write(&v, "b", 8192, &[0xb5; 4096]);
    flush(&v, "b");
    assert!(dirty_lines(&v, "b") >= 1, "write-back keeps b's line dirty");
    // kill -9: the page cache keeps what was written.
    faults.process_exit();
    drop(v);
    let t = table_names(&p.cache);
    assert!(
        t.contains(&("b".to_string(), false)),
        "the table a restart reads must keep b (its remove failed): {t:?}"
    );
    let v = reopen(&p, &["a", "b"], Mode::WriteBack);
    assert_eq!(read(&v, "b", 8192, 4096), vec![0xb5; 4096]);
    assert_eq!(read(&v, "a", 0, 4096), vec![1u8; 4096]);
    v.shutdown().unwrap();
}

#[test]
fn an_add_whose_superblock_sync_fails_is_not_served_after_a_restart() {
    let p = pool(Mode::WriteBack);
    let (faults, cache, arm) = faulty(&p);
    let v = open(&p, Box::new(cache), &["a", "b"], Mode::WriteBack);
    let c = FileDev::open(&p.backing("c")).unwrap();
    *arm.lock().unwrap() = Some(Arm::Once);
    let e = v.add_volume("c", c.size(), c.identity(), None).unwrap_err();
    assert!(e.contains("not added"), "{e}");
    assert!(v.volume_specs().iter().all(|s| s.name != "c"));
    // A later good sync (any flush) must not make the half-added entry durable.
    write(&v, "a", 0, &[2u8; 4096]);
    flush(&v, "a");
    faults.process_exit();
    drop(v);
    let t = table_names(&p.cache);
    assert!(
        t.iter().all(|(n, _)| n != "c"),
        "the table a restart reads lists c, whose add failed (`serve` would serve it): {t:?}"
    );
    // Added again, it is served.
    let v = reopen(&p, &["a", "b"], Mode::WriteBack);
    let c = FileDev::open(&p.backing("c")).unwrap();
    v.add_volume("c", c.size(), c.identity(), None).unwrap();
    assert_eq!(read(&v, "a", 0, 4096), vec![2u8; 4096]);
    v.shutdown().unwrap();
}

#[test]
fn a_remove_whose_superblock_cannot_be_written_back_fails_the_cache_and_keeps_every_write() {
    let p = pool(Mode::WriteBack);
    let (faults, cache, arm) = faulty(&p);
    let v = open(&p, Box::new(cache), &["a", "b"], Mode::WriteBack);
    // Dirty data of a, acknowledged before the cache device goes bad.
    write(&v, "a", 4096, &[0xa1; 4096]);
    assert_eq!(dirty_lines(&v, "a"), 1);
    *arm.lock().unwrap() = Some(Arm::Always);
    let e = v.remove_volume("b").unwrap_err();
    assert!(e.contains("not removed") && e.contains("FAILED"), "{e}");
    // Both volumes still serve, passed through: a's dirty line was written back first.
    assert_eq!(v.volume_specs().len(), 2);
    assert_eq!(v.stats().mode, "pass-through");
    write(&v, "b", 0, &[0xb2; 4096]);
    assert_eq!(read(&v, "b", 0, 4096), vec![0xb2; 4096]);
    assert_eq!(read(&v, "a", 4096, 4096), vec![0xa1; 4096]);
    faults.process_exit();
    drop(v);
    let on = |n: &str, at: usize| std::fs::read(p.backing(n)).unwrap()[at..at + 4096].to_vec();
    assert_eq!(on("a", 4096), vec![0xa1; 4096]);
    assert_eq!(on("b", 0), vec![0xb2; 4096]);
    // A restart refuses the failed cache rather than read a table nobody knows.
    assert!(
        p.state().exists(),
        "the failure is recorded in the state file"
    );
}

#[test]
fn a_volume_with_lost_ranges_is_not_removed_until_they_are_written_again() {
    let p = pool(Mode::WriteAround);
    let faults = Faults::new(5);
    let (b, bh) = faults.wrap("b", Box::new(FileDev::open(&p.backing("b")).unwrap()), true);
    let b = std::sync::Mutex::new(Some(b));
    let v = open_with(
        &p,
        Box::new(FileDev::open(&p.cache).unwrap()),
        &["a", "b"],
        Mode::WriteAround,
        |n| match n {
            "b" => Box::new(b.lock().unwrap().take().unwrap()),
            _ => Box::new(FileDev::open(&p.backing(n)).unwrap()),
        },
    );
    // A write of b (around the cache) that its backing device dropped at a failed sync: lost.
    write(&v, "b", 8192, &[9u8; 4096]);
    bh.fail_next_sync(true);
    assert!(v.volume_io(id_of(&v, "b"), VolumeIo::Flush).is_err());
    let lost = |v: &CacheVolume| {
        v.volume_figures()
            .iter()
            .find(|f| f.name == "b")
            .unwrap()
            .lost_ranges
            .clone()
    };
    assert_eq!(lost(&v), vec![(8192, 12288)]);
    let e = v.remove_volume("b").unwrap_err();
    assert!(
        e.contains("lost") && e.contains("8192..12288") && e.contains("ctl --volume b stats"),
        "{e}"
    );
    assert!(
        v.volume_specs().iter().any(|s| s.name == "b"),
        "still served"
    );
    // Its reads there still fail (the loss stays visible), until the range is written again.
    let mut buf = vec![0u8; 4096];
    assert!(v
        .volume_io(id_of(&v, "b"), VolumeIo::Read(8192, &mut buf))
        .is_err());
    write(&v, "b", 8192, &[10u8; 4096]);
    flush(&v, "b");
    assert!(lost(&v).is_empty());
    v.remove_volume("b").unwrap();
    assert!(v.volume_specs().iter().all(|s| s.name != "b"));
    v.shutdown().unwrap();
    assert_eq!(
        std::fs::read(p.backing("b")).unwrap()[8192..12288],
        [10u8; 4096]
    );
}

fn backing_bytes(p: &Pool, name: &str, at: usize) -> Vec<u8> {
    std::fs::read(p.backing(name)).unwrap()[at..at + 4096].to_vec()
}

#[test]
fn a_write_through_pool_restarts_a_write_back_volume_with_its_dirty_lines_dirty() {
    let p = pool(Mode::WriteThrough);
    let v = reopen(&p, &["a", "b=write-back"], Mode::WriteThrough);
    write(&v, "a", 0, &[3u8; 4096]);
    write(&v, "b", 4096, &[4u8; 4096]);
    flush(&v, "b");
    assert_eq!((dirty_lines(&v, "a"), dirty_lines(&v, "b")), (0, 1));
    drop(v); // kill -9: no shutdown
    let old: Vec<u8> = (4096..8192).map(initial).collect();
    let v = reopen(&p, &["a", "b=write-back"], Mode::WriteThrough);
    assert_eq!(
        dirty_lines(&v, "b"),
        1,
        "the write-back volume's line stays dirty (its own mode, not the pool's)"
    );
    assert_eq!(
        backing_bytes(&p, "b", 4096),
        old,
        "not written back at the open"
    );
    assert_eq!(read(&v, "b", 4096, 4096), vec![4u8; 4096]);
    // `ctl flush` writes it back.
    v.flush_dirty().unwrap();
    assert_eq!(dirty_lines(&v, "b"), 0);
    assert_eq!(backing_bytes(&p, "b", 4096), vec![4u8; 4096]);
    drop(v);
    // Dirty again, then restarted following the pool (write-through): written back at the
    // open, before anything is served.
    let v = reopen(&p, &["a", "b=write-back"], Mode::WriteThrough);
    write(&v, "b", 4096, &[5u8; 4096]);
    flush(&v, "b");
    drop(v);
    let v = reopen(&p, &["a", "b"], Mode::WriteThrough);
    assert_eq!(dirty_lines(&v, "b"), 0);
    assert_eq!(backing_bytes(&p, "b", 4096), vec![5u8; 4096]);
    v.shutdown().unwrap();
}

#[test]
fn a_write_back_pool_writes_back_a_write_through_volume_s_dirty_lines_at_the_open() {
    let p = pool(Mode::WriteBack);
    let v = reopen(&p, &["a", "b"], Mode::WriteBack);
    write(&v, "b", 0, &[6u8; 4096]);
    flush(&v, "b");
    assert_eq!(dirty_lines(&v, "b"), 1);
    drop(v); // kill -9
             // Restarted with b in write-through (`--volume-mode b=write-through`): its backing
             // device must hold what was acknowledged before b serves as write-through.
    let v = reopen(&p, &["a", "b=write-through"], Mode::WriteBack);
    assert_eq!(dirty_lines(&v, "b"), 0);
    assert_eq!(backing_bytes(&p, "b", 0), vec![6u8; 4096]);
    v.shutdown().unwrap();
}
