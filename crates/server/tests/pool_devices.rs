//! A cache pool of several cache devices (`--cache` repeated; `tiercache_server::PoolDev`,
//! step 2 of docs/plan-multi-cache.md): data written through a pool of two members reads back
//! after a clean shutdown and after a kill; membership is checked at open (another pool's
//! member, a member twice, one missing, a device formatted alone, a member alone); the members
//! may be given in any order; and crash points over both members and the backing device (one
//! `Faults` numbering their writes and syncs) keep every FLUSHed value, in write-through and in
//! write-back with one dirty copy and with two (the default).

mod common;

use common::*;
use std::path::Path;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::Faults;
use tiercache_server::format::{Record, Superblock, POOL_META_OFFSET, RECORD_BYTES};
use tiercache_server::pool_dev::check_dirty_copies;
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions, PoolDev};

const LS: u64 = POOL_LS;

fn devs(paths: &[&Path]) -> Vec<(String, Box<dyn BlockDev>)> {
    paths
        .iter()
        .map(|p| {
            (
                p.display().to_string(),
                Box::new(FileDev::open(p).unwrap()) as Box<dyn BlockDev>,
            )
        })
        .collect()
}

fn format_pool(p: &PoolFiles, mode: Mode) -> Superblock {
    format_pool_copies(p, mode, Some(1))
}

/// Formats `p` with `copies` cache copies of each dirty line (`None`: the default).
fn format_pool_copies(p: &PoolFiles, mode: Mode, copies: Option<u8>) -> Superblock {
    let m: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    let opts = FormatOptions {
        line_size: LS,
        mode,
        ..Default::default()
    };
    PoolDev::format(devs(&m), VOL, &opts, copies).unwrap().1
}

fn open_pool(p: &PoolFiles, order: &[usize]) -> CacheVolume {
    let m: Vec<&Path> = order.iter().map(|&i| p.members[i].as_path()).collect();
    let pd = PoolDev::open(devs(&m)).unwrap();
    CacheVolume::open(
        Box::new(pd),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0
}

/// Non-empty records in member `path`'s record area of `lines` lines.
fn mapped_records(path: &Path, lines: u64) -> u64 {
    let b = std::fs::read(path).unwrap();
    (0..lines)
        .filter(|s| {
            let at = (POOL_META_OFFSET + s * RECORD_BYTES) as usize;
            Record::decode(&b[at..at + RECORD_BYTES as usize])
                .is_some_and(|r| r.key != tiercache_server::format::EMPTY_KEY)
        })
        .count() as u64
}

fn run_ops(vol: &CacheVolume, m: &mut Model, seed: u64, ops: usize) {
    let mut r = rng(seed);
    for i in 0..ops {
        let (kind, off, len, fua) = random_op(&mut r, VOL);
        match kind {
            0 => {
                let mut buf = vec![0u8; len as usize];
                vol.read(off, &mut buf).unwrap();
                m.check_now(off as usize, &buf, &format!("op {i} read {off}+{len}"));
            }
            1 | 2 => {
                let data: Vec<u8> = (0..len).map(|k| (i as u8) ^ (k as u8) ^ 0x5a).collect();
                vol.write(off, &data, fua).unwrap();
                m.write(off as usize, &data, fua);
            }
            _ => {
                vol.flush().unwrap();
                m.flush();
            }
        }
    }
}

/// Reads reaching gated member devices while armed wait until two arrived (all members
/// together), at most 10 s; a wait that ran out is noted.
#[derive(Default)]
struct Gate {
    armed: std::sync::atomic::AtomicBool,
    arrived: std::sync::Mutex<usize>,
    cv: std::sync::Condvar,
    timed_out: std::sync::atomic::AtomicBool,
}

struct Gated {
    inner: FileDev,
    gate: std::sync::Arc<Gate>,
}

impl BlockDev for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let g = &self.gate;
        if g.armed.load(SeqCst) {
            let mut n = g.arrived.lock().unwrap();
            *n += 1;
            g.cv.notify_all();
            let (_n, w) =
                g.cv.wait_timeout_while(n, std::time::Duration::from_secs(10), |n| *n < 2)
                    .unwrap();
            if w.timed_out() {
                g.timed_out.store(true, SeqCst);
            }
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(data, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
}

/// Two cache hits on lines of different members run at the same time: each member's read
/// waits until the other's arrived, so a hit path serialised across the pool (a lock held
/// over the device read) would run them one after the other and the first wait would run
/// out. (Why a pool of two emulated SSDs doubles the IOPS of one: BENCHMARKS.)
#[test]
fn hits_on_different_members_overlap() {
    use std::sync::atomic::Ordering::SeqCst;
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteThrough);
    let gate = std::sync::Arc::new(Gate::default());
    let members = p
        .members
        .iter()
        .map(|m| {
            let d = Gated {
                inner: FileDev::open(m).unwrap(),
                gate: gate.clone(),
            };
            (m.display().to_string(), Box::new(d) as Box<dyn BlockDev>)
        })
        .collect();
    let vol = CacheVolume::open(
        Box::new(PoolDev::open(members).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    // Lines 0..32 cached (write-through writes fill the cache), spread over both members.
    for l in 0..32u64 {
        vol.write(l * LS, &vec![l as u8 + 1; LS as usize], false)
            .unwrap();
    }
    let on = |d: u32| {
        vol.lines()
            .iter()
            .find(|x| (x.slot >= 128) as u32 == d)
            .map(|x| x.key)
            .unwrap_or_else(|| panic!("no line cached on member {d}: {:?}", vol.lines()))
    };
    let (a, b) = (on(0), on(1));
    let hits = vol.stats().totals.read_line_hits;
    gate.armed.store(true, SeqCst);
    std::thread::scope(|s| {
        for l in [a, b] {
            let vol = &vol;
            s.spawn(move || {
                let mut buf = vec![0u8; LS as usize];
                vol.read(l * LS, &mut buf).unwrap();
                assert_eq!(buf, vec![l as u8 + 1; LS as usize], "line {l}");
            });
        }
    });
    gate.armed.store(false, SeqCst);
    assert_eq!(
        vol.stats().totals.read_line_hits,
        hits + 2,
        "both reads hit"
    );
    assert!(
        !gate.timed_out.load(SeqCst),
        "a hit on member 0 (line {a}) and one on member 1 (line {b}) did not overlap"
    );
    vol.shutdown().unwrap();
}

#[test]
fn data_reads_back_after_clean_shutdown_and_kill_with_members_swapped() {
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        // 128 + 128 lines for a volume of 256: both members fill, lines get evicted.
        let p = pool_files(&[128, 200]);
        let sb = format_pool(&p, mode);
        assert_eq!(sb.capacity_lines, 256, "members rounded to record pages");
        let vol = open_pool(&p, &[0, 1]);
        let mut m = Model::new(0, VOL);
        run_ops(&vol, &mut m, 1, 3000);
        m.check_volume(&vol, &format!("{mode:?}: live"));
        vol.shutdown().unwrap();
        drop(vol);
        for (d, path) in p.members.iter().enumerate() {
            let n = mapped_records(path, 128);
            assert!(
                n > 0,
                "{mode:?}: member {d} holds no record: the pool used one device"
            );
        }
        // Given in the other order: the same pool, warm.
        let vol = open_pool(&p, &[1, 0]);
        // Reads of lines cached on either member count on that member (`ctl stats`
        // `pool_members[i].reads`): reading the whole volume reads both.
        let before = vol.stats().pool_members;
        m.check_volume(&vol, &format!("{mode:?}: after a clean shutdown, swapped"));
        let after = vol.stats().pool_members;
        for d in 0..2 {
            let (b, a) = (&before[d], &after[d]);
            assert!(
                b.lines > 0,
                "{mode:?}: member {d} caches nothing: {before:?}"
            );
            assert!(
                a.reads > b.reads && a.read_bytes >= b.read_bytes + LS,
                "{mode:?}: member {d}'s cached lines were read but not counted on it: \
                 {before:?} then {after:?}"
            );
        }
        run_ops(&vol, &mut m, 2, 1500);
        vol.flush().unwrap();
        m.flush();
        // Killed: no shutdown, the volume just goes away (its files keep what was written).
        drop(vol);
        let vol = open_pool(&p, &[0, 1]);
        m.check_volume(&vol, &format!("{mode:?}: after a kill"));
        vol.shutdown().unwrap();
    }
}

#[test]
fn membership_is_checked_at_open() {
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteThrough);
    let q = pool_files(&[128, 128]);
    format_pool(&q, Mode::WriteThrough);
    let (a, b) = (p.members[0].as_path(), p.members[1].as_path());
    let open_err = |paths: &[&Path]| match PoolDev::open(devs(paths)) {
        Ok(_) => panic!("{paths:?} opened"),
        Err(e) => e,
    };
    // Another pool's member.
    let e = open_err(&[a, q.members[1].as_path()]);
    assert!(
        e.contains("belongs to pool") && e.contains("wrong device"),
        "{e}"
    );
    // One member twice: the same path, and a copy of the same device under another path.
    let e = open_err(&[a, a]);
    assert!(e.contains("given twice"), "{e}");
    let copy = p.f.dir.path().join("copy.img");
    std::fs::copy(a, &copy).unwrap();
    let e = open_err(&[a, copy.as_path()]);
    assert!(e.contains("both member 0"), "{e}");
    // A member missing: named by index and uuid (a degraded start is not built yet).
    let e = open_err(&[b, p.f.backing.as_path()]);
    assert!(e.contains("not a member of a cache pool"), "{e}");
    let c = pool_files(&[128, 128, 128]);
    format_pool(&c, Mode::WriteThrough);
    let e = open_err(&[c.members[2].as_path(), c.members[0].as_path()]);
    assert!(
        e.contains("3 cache devices, 2 given") && e.contains("member 1 (uuid"),
        "{e}"
    );
    // A device formatted alone, given in a pool.
    let alone = files(300, LS);
    format(&alone, Mode::WriteThrough, LS);
    let e = open_err(&[a, alone.cache.as_path()]);
    assert!(e.contains("formatted alone"), "{e}");
    // A member given alone, as a one-device cache.
    let e = match CacheVolume::open(
        Box::new(FileDev::open(a).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    ) {
        Ok(_) => panic!("a pool member opened alone"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("member of a pool"), "{e}");
    // The right members in either order open.
    PoolDev::open(devs(&[b, a])).unwrap();
}

#[test]
fn pool_format_refuses_what_is_not_built() {
    let p = pool_files(&[128, 128]);
    let m: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    // Write-back on a pool is no longer refused without --dirty-copies (2 is the default:
    // `tests/pool_copies.rs`); data checksums still are.
    check_dirty_copies(2, None).unwrap();
    let sums = FormatOptions {
        line_size: LS,
        mode: Mode::WriteBack,
        data_checksums: true,
        ..Default::default()
    };
    let e = PoolDev::format(devs(&m), VOL, &sums, Some(1))
        .err()
        .unwrap();
    assert!(e.contains("not built yet"), "{e}");
}

/// One crash point: the workload over a pool of two members, the power cut at event `n`
/// (of the members' and the backing device's writes and syncs), reopened with the members
/// swapped and checked. Returns the events of the run.
fn crash_run(p: &PoolFiles, mode: Mode, copies: Option<u8>, seed: u64, crash: Option<u64>) -> u64 {
    // A fresh backing device (the last run wrote to it) and a fresh pool.
    std::fs::write(&p.f.backing, (0..VOL).map(initial).collect::<Vec<u8>>()).unwrap();
    format_pool_copies(p, mode, copies);
    let faults = Faults::new(seed ^ 0x9e37);
    faults.crash_at(crash.unwrap_or(u64::MAX), true);
    let wrap = |name: &str, path: &Path| -> Box<dyn BlockDev> {
        Box::new(
            faults
                .wrap(name, Box::new(FileDev::open(path).unwrap()), true)
                .0,
        )
    };
    let members = vec![
        ("m0".to_string(), wrap("cache", &p.members[0])),
        ("m1".to_string(), wrap("cache1", &p.members[1])),
    ];
    let what = format!("{mode:?} dirty copies {copies:?} seed {seed} crash {crash:?}");
    let mut m = Model::new(0, VOL);
    let opened = PoolDev::open(members).and_then(|pd| {
        CacheVolume::open(
            Box::new(pd),
            wrap("backing", &p.f.backing),
            &OpenOptions::default(),
        )
        .map(|v| v.0)
        .map_err(|e| e.to_string())
    });
    match opened {
        Err(e) => assert!(
            faults.power_lost(),
            "{what}: open failed without a crash: {e}"
        ),
        Ok(vol) => {
            let mut r = rng(seed);
            for i in 0..400 {
                let ok = model_op(
                    &vol,
                    &mut m,
                    random_op(&mut r, VOL),
                    i,
                    0xa5,
                    &|| faults.power_lost(),
                    &what,
                );
                if !ok {
                    assert!(faults.power_lost(), "{what}: op {i} failed without a crash");
                    break;
                }
            }
            if crash.is_none() {
                vol.shutdown().unwrap();
            }
        }
    }
    faults.power_cut();
    let events = faults.events();
    // Reopened on the files, members swapped: every FLUSHed (or FUA) byte reads back.
    let vol = open_pool(p, &[1, 0]);
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    m.check_after_crash(0, &buf, &what);
    // And it keeps working.
    vol.write(4096, &[7u8; 4096], false).unwrap();
    vol.flush().unwrap();
    let mut one = vec![0u8; 4096];
    vol.read(4096, &mut one).unwrap();
    assert!(
        one.iter().all(|&x| x == 7),
        "{what}: written after the restart"
    );
    vol.shutdown().unwrap();
    events
}

#[test]
fn crash_points_over_two_members_keep_every_flushed_value() {
    // Write-back also with the default two dirty copies (copies live, their COPY records
    // written by the flushes and reconciled at each restart).
    for (mode, copies) in [
        (Mode::WriteThrough, Some(1)),
        (Mode::WriteBack, Some(1)),
        (Mode::WriteBack, None),
    ] {
        let p = pool_files(&[128, 128]);
        let points = crash_budget(40, 2000);
        crash_sweep(mode, points, false, 1, 20, 0x51, |seed, c| {
            (crash_run(&p, mode, copies, seed, c.map(|c| c.1)), 0)
        });
    }
}

/// The engine places lines over the members (`EngineConfig::pool_lines` from the pool device):
/// 64 lines written to an empty pool of two land half on each member, not all on member 0.
#[test]
fn lines_are_spread_over_the_members() {
    let p = pool_files(&[256, 256]);
    format_pool(&p, Mode::WriteThrough);
    let vol = open_pool(&p, &[0, 1]);
    let data = vec![0x77u8; (64 * LS) as usize];
    vol.write(0, &data, false).unwrap();
    vol.flush().unwrap();
    vol.shutdown().unwrap();
    drop(vol);
    let (a, b) = (
        mapped_records(&p.members[0], 256),
        mapped_records(&p.members[1], 256),
    );
    assert_eq!(a + b, 64, "every line written is mapped once");
    assert_eq!(
        (a, b),
        (32, 32),
        "stripes of 8 lines alternate over equal members"
    );
}

/// Writes `r` as the record of member-local slot `local` of the member file `path`, at
/// `meta` (the record area's start), leaving every other byte.
fn put_record(path: &Path, meta: u64, local: u64, r: Record) {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; RECORD_BYTES as usize];
    r.encode(&mut b);
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&b, meta + local * RECORD_BYTES).unwrap();
}

/// COPY records (plan (b)5): a cache of one device never carries one, so open refuses it
/// naming the slot and its record page; a pool's copies are never taken for lines (a line of
/// volume id >= 2^14 before this build): reconciled at open (`crate::reconcile`), a copy
/// whose primary slot does not map its line dirty is dropped (stale), its slot freed and its
/// record emptied at the next flush, and the line reads the backing device's bytes.
#[test]
fn copy_records_are_never_taken_for_lines() {
    let key = 9u64; // volume 0, line 9
                    // One device (version 2): refused by slot and page.
    let f = files(256, LS);
    format(&f, Mode::WriteBack, LS);
    let (vol, _) = open(&f, None);
    vol.shutdown().unwrap();
    drop(vol);
    put_record(
        &f.cache,
        tiercache_server::format::META_OFFSET,
        130,
        Record::copy(key, 3, 1, 1),
    );
    let e = CacheVolume::open(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .err()
    .expect("a copy record on a one-device cache is refused")
    .to_string();
    assert!(
        e.contains("slot 130") && e.contains("record page 1") && e.contains("copy bit"),
        "{e}"
    );
    // A pool: the copy of line 9 (primary slot 3 on member 0, which maps nothing) on member
    // 1 is dropped at open, never served as a line.
    let p = pool_files(&[128, 128]);
    format_pool_copies(&p, Mode::WriteBack, None);
    let vol = open_pool(&p, &[0, 1]);
    vol.shutdown().unwrap();
    drop(vol);
    // Bytes in the copy's slot that are not the backing device's.
    let data_off = Superblock::member_data_offset(128, LS);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p.members[1])
            .unwrap();
        f.write_all_at(&vec![0xeeu8; LS as usize], data_off + 5 * LS)
            .unwrap();
    }
    put_record(
        &p.members[1],
        POOL_META_OFFSET,
        5,
        Record::copy(key, 3, 1, 1),
    );
    assert_eq!(mapped_records(&p.members[1], 128), 1);
    let m: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    let (vol, rep) = CacheVolume::open(
        Box::new(PoolDev::open(devs(&m)).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(
        (rep.copies_dropped, rep.copies_paired, rep.copies_promoted),
        (1, 0, 0),
        "{rep:?}"
    );
    let st = vol.stats();
    assert_eq!((st.dirty_lines, st.copy_slots), (0, 0), "{st:?}");
    let mut buf = vec![0u8; LS as usize];
    vol.read(key * LS, &mut buf).unwrap();
    let want: Vec<u8> = (key * LS..(key + 1) * LS).map(initial).collect();
    assert!(
        buf == want,
        "line 9 reads other bytes than the backing device's"
    );
    vol.shutdown().unwrap();
    drop(vol);
    assert_eq!(
        mapped_records(&p.members[1], 128),
        0,
        "the dropped copy's record is emptied"
    );
}

/// Member 1 of `p` behind a [`FaultDev`] (not volatile: the files hold every write), member 0
/// and the backing device plain files; `max_errors` per member before it is failed.
fn open_pool_faulty(
    p: &PoolFiles,
    max_errors: u64,
) -> (CacheVolume, tiercache_server::fault::FaultHandle) {
    let faults = Faults::new(7);
    let (d1, h1) = faults.wrap(
        "cache1",
        Box::new(FileDev::open(&p.members[1]).unwrap()),
        false,
    );
    let members: Vec<(String, Box<dyn BlockDev>)> = vec![
        ("m0".into(), Box::new(FileDev::open(&p.members[0]).unwrap())),
        ("m1".into(), Box::new(d1)),
    ];
    let vol = CacheVolume::open(
        Box::new(PoolDev::open(members).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    vol.set_max_cache_errors(max_errors);
    (vol, h1)
}

/// Issue 15 item 2, step 6: one member of two failing while serving fails that member
/// alone: reads and writes go on (none fails), every value written before and after reads
/// back, nothing is lost, the failed member is never asked again, and a restart with it
/// present keeps it out. Write-through: the member is gone (every op fails). Write-back
/// (one dirty copy): its writes and syncs fail but reads work, so its dirty lines are
/// written back when it is failed, not lost. (On a build without per-member failure the
/// whole pool goes pass-through: `cache_failed`.)
#[test]
fn a_failing_member_is_failed_alone_and_stays_out_after_a_restart() {
    for mode in [Mode::WriteThrough, Mode::WriteBack] {
        let what = format!("{mode:?}");
        let p = pool_files(&[256, 256]);
        format_pool(&p, mode);
        let mut m = Model::new(0, VOL);
        {
            let (vol, h1) = open_pool_faulty(&p, 4);
            run_ops(&vol, &mut m, 0x15, 400);
            assert_eq!(vol.pool_members(), vec![(false, 0), (false, 0)], "{what}");
            match mode {
                Mode::WriteBack => {
                    h1.fail_writes(0..u64::MAX);
                    h1.fail_syncs();
                }
                _ => h1.lose(),
            }
            run_ops(&vol, &mut m, 0x16, 400);
            m.check_volume(&vol, &format!("{what}: after member 1 failed"));
            let members = vol.pool_members();
            assert!(members[1].0, "{what}: member 1 failed: {members:?}");
            assert!(!members[0].0, "{what}: member 0 serves on: {members:?}");
            assert!(
                !vol.cache_failed(),
                "{what}: one failing member took the whole pool pass-through"
            );
            assert!(vol.failure_recorded(), "{what}");
            assert_eq!(vol.lost_dirty_ranges(), vec![], "{what}");
            // Nothing reaches the failed member any more.
            let asked = h1.injected();
            run_ops(&vol, &mut m, 0x17, 300);
            vol.flush().unwrap();
            m.check_volume(&vol, &format!("{what}: later"));
            assert_eq!(
                h1.injected(),
                asked,
                "{what}: the failed member was asked again"
            );
            let st = vol.stats();
            assert!(st.cached_lines > 0, "{what}: member 0 still caches");
            let pm = &st.pool_members;
            assert_eq!(
                pm.iter()
                    .map(|m| (m.path.as_str(), m.state.as_str()))
                    .collect::<Vec<_>>(),
                vec![("m0", "active"), ("m1", "failed")],
                "{what}: {pm:?}"
            );
            assert!(
                pm[1].lines == 0 && pm[0].lines == st.cached_lines && pm[1].errors >= 4,
                "{what}: {pm:?}"
            );
            vol.shutdown().unwrap();
        }
        // Restarted with member 1 present and answering again: still out, data intact.
        let vol = open_pool(&p, &[1, 0]);
        assert_eq!(
            vol.pool_members().iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![false, true],
            "{what}: restarted"
        );
        m.check_volume(&vol, &format!("{what}: restarted"));
        run_ops(&vol, &mut m, 0x18, 200);
        m.check_volume(&vol, &format!("{what}: restarted, written again"));
        vol.shutdown().unwrap();
    }
}

/// A failed member's records are never restored, even when it answers again after a
/// restart: member 1 held line K dirty (value 1, flushed) when it failed live (its writes
/// and syncs failing, found by a flush: K is written back from it); K was then written
/// again (value 2) and evicted from member 0, so no record newer than member 1's stale one
/// exists (a dirty record: the clean-line sample at open does not look at it). The restart
/// (member 1 present) must read 2, not 1 from member 1 (plan (d)4: the survivors' pool
/// blocks say member 1 failed).
#[test]
fn a_stale_member_answering_again_is_not_served() {
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteBack);
    let lines = VOL / LS;
    let k;
    {
        let (vol, h1) = open_pool_faulty(&p, 1);
        vol.write(0, &vec![1u8; (32 * LS) as usize], false).unwrap();
        vol.flush().unwrap();
        let b = std::fs::read(&p.members[1]).unwrap();
        let on_b: Vec<u64> = (0..128u64)
            .filter_map(|s| {
                let at = (POOL_META_OFFSET + s * RECORD_BYTES) as usize;
                Record::decode(&b[at..at + RECORD_BYTES as usize]).map(|r| r.key)
            })
            .collect();
        k = (0..32u64)
            .find(|&l| on_b.contains(&tiercache_engine::Engine::line_key(0, l)))
            .expect("member 1 holds one of the 32 lines written");
        h1.fail_writes(0..u64::MAX);
        h1.fail_syncs();
        vol.flush().unwrap();
        assert!(
            vol.pool_members()[1].0,
            "member 1 failed at its first error"
        );
        assert_eq!(vol.lost_dirty_ranges(), vec![]);
        let mut buf = vec![0u8; LS as usize];
        vol.read(k * LS, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 1), "line {k} read back");
        assert!(!vol.cache_failed());
        vol.write(k * LS, &vec![2u8; LS as usize], false).unwrap();
        // Every other line, twice: K is evicted from member 0 (128 lines).
        for _ in 0..2 {
            for l in (0..lines).filter(|&l| l != k) {
                vol.write(l * LS, &vec![3u8; LS as usize], false).unwrap();
            }
        }
        vol.flush().unwrap();
        vol.shutdown().unwrap();
    }
    let a = std::fs::read(&p.members[0]).unwrap();
    let key = tiercache_engine::Engine::line_key(0, k);
    assert!(
        !(0..128u64).any(|s| {
            let at = (POOL_META_OFFSET + s * RECORD_BYTES) as usize;
            Record::decode(&a[at..at + RECORD_BYTES as usize]).is_some_and(|r| r.key == key)
        }),
        "line {k} is still recorded on member 0: the test needs it evicted"
    );
    let vol = open_pool(&p, &[0, 1]);
    let mut buf = vec![0u8; LS as usize];
    vol.read(k * LS, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&x| x == 2),
        "line {k}: the failed member's stale value {} was served after the restart",
        buf[0]
    );
    vol.shutdown().unwrap();
}

fn open_degraded(
    p: &PoolFiles,
    given: &[&Path],
    accept_lost_dirty: bool,
) -> Result<CacheVolume, String> {
    let how = tiercache_server::pool_dev::PoolOpen {
        degraded: true,
        accept_lost_dirty,
        state_dir: None,
    };
    let pd = PoolDev::open_with(devs(given), how)?;
    CacheVolume::open(
        Box::new(pd),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .map(|v| v.0)
    .map_err(|e| e.to_string())
}

/// The pool block on member file `path`.
fn pool_block_of(path: &Path) -> tiercache_server::format::PoolBlock {
    let b = std::fs::read(path).unwrap();
    tiercache_server::format::PoolBlock::decode(&b[4096..8192]).unwrap()
}

/// Plan (d)5: a write-through pool of two restarted with member 1 missing (not given) or
/// empty (zeroed) starts degraded: member 1 is marked failed in member 0's pool block
/// (generation + 1) before the open returns, its lines are not served, every value reads
/// back (from member 0 or the backing device), and a later plain open (which writes
/// nothing) accepts the pool without it. Without `degraded` (`tiercache check`) the open
/// is still refused.
#[test]
fn a_write_through_pool_starts_degraded_without_a_missing_or_empty_member() {
    for empty in [false, true] {
        let what = if empty { "empty" } else { "missing" };
        let p = pool_files(&[128, 128]);
        format_pool(&p, Mode::WriteThrough);
        let mut m = Model::new(0, VOL);
        let vol = open_pool(&p, &[0, 1]);
        run_ops(&vol, &mut m, 0x23, 1500);
        vol.shutdown().unwrap();
        drop(vol);
        assert!(
            mapped_records(&p.members[1], 128) > 0,
            "member 1 held lines"
        );
        let before = pool_block_of(&p.members[0]);
        assert!(
            before.members.iter().all(|x| !x.may_dirty),
            "{what}: write-through never flags a member dirty: {before:?}"
        );
        let (a, b) = (p.members[0].as_path(), p.members[1].as_path());
        let given: Vec<&Path> = if empty {
            std::fs::write(b, vec![0u8; std::fs::metadata(b).unwrap().len() as usize]).unwrap();
            vec![b, a]
        } else {
            vec![a]
        };
        let e = match PoolDev::open(devs(&given)) {
            Ok(_) => panic!("{what}: opened without degraded"),
            Err(e) => e,
        };
        assert!(e.contains("member 1") || e.contains("empty"), "{what}: {e}");
        let vol = open_degraded(&p, &given, false).unwrap();
        let after = pool_block_of(a);
        assert_eq!(
            after.members[1].state,
            tiercache_server::format::MemberState::Failed,
            "{what}: member 1 marked failed on member 0 before serving"
        );
        assert!(after.generation > before.generation, "{what}");
        assert_eq!(
            vol.pool_members().iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![false, true],
            "{what}"
        );
        m.check_volume(&vol, &format!("{what}: degraded"));
        run_ops(&vol, &mut m, 0x24, 500);
        m.check_volume(&vol, &format!("{what}: degraded, written"));
        vol.shutdown().unwrap();
        drop(vol);
        // Member 1 failed earlier: a plain open takes the pool without it.
        let pd = PoolDev::open(devs(&[a])).unwrap();
        let vol = CacheVolume::open(
            Box::new(pd),
            Box::new(FileDev::open(&p.f.backing).unwrap()),
            &OpenOptions::default(),
        )
        .unwrap()
        .0;
        m.check_volume(&vol, &format!("{what}: restarted"));
        vol.shutdown().unwrap();
    }
}

/// Plan (d)5 with `--dirty-copies 1`: member 1 held dirty lines (flagged `may_dirty` in
/// every pool block before its first dirty record) when the server was killed; restarted
/// without it the start is refused, naming the ranges and the two ways out; with
/// `accept_lost_dirty` it starts, the ranges read EIO until written again (a rewrite reads
/// back). Once every line is clean (the pool switched to write-through) the flag is clear
/// and a missing member is no loss: the start goes on.
#[test]
fn a_missing_member_with_dirty_lines_is_refused_unless_accepted() {
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteBack);
    let vol = open_pool(&p, &[0, 1]);
    vol.write(0, &vec![9u8; (64 * LS) as usize], false).unwrap();
    vol.flush().unwrap();
    drop(vol); // killed: no shutdown
    assert!(
        mapped_records(&p.members[1], 128) > 0,
        "member 1 held lines"
    );
    let flags: Vec<bool> = pool_block_of(&p.members[0])
        .members
        .iter()
        .map(|x| x.may_dirty)
        .collect();
    assert_eq!(flags, vec![true, true], "both members hold dirty lines");
    let a = p.members[0].as_path();
    let e = open_degraded(&p, &[a], false).err().expect("refused");
    assert!(
        e.contains("pool member 1")
            && e.contains("may hold dirty lines")
            && e.contains(&format!("volume bytes 0..{VOL}"))
            && e.contains("--accept-lost-dirty")
            && e.contains("bring the device back"),
        "{e}"
    );
    assert_eq!(
        pool_block_of(a).members[1].state,
        tiercache_server::format::MemberState::Active,
        "a refused start marks nothing"
    );
    let vol = open_degraded(&p, &[a], true).unwrap();
    assert_eq!(vol.lost_dirty_ranges(), vec![(0, VOL)]);
    let mut buf = vec![0u8; LS as usize];
    let e = vol.read(5 * LS, &mut buf).unwrap_err();
    assert!(e.to_string().contains("were lost"), "{e}");
    vol.write(5 * LS, &vec![4u8; LS as usize], false).unwrap();
    vol.flush().unwrap();
    vol.read(5 * LS, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 4), "rewritten");
    vol.read(6 * LS, &mut buf).unwrap_err();
    // Every line clean: the flags clear, so member 1 may go missing (the lost list stays).
    vol.set_mode(Mode::WriteThrough).unwrap();
    vol.shutdown().unwrap();
    drop(vol);
    let q = pool_files(&[128, 128]);
    format_pool(&q, Mode::WriteBack);
    let vol = open_pool(&q, &[0, 1]);
    let mut m = Model::new(0, VOL);
    run_ops(&vol, &mut m, 0x25, 800);
    vol.set_mode(Mode::WriteThrough).unwrap();
    vol.shutdown().unwrap();
    drop(vol);
    assert!(
        pool_block_of(&q.members[0])
            .members
            .iter()
            .all(|x| !x.may_dirty),
        "every line clean: flags cleared"
    );
    let vol = open_degraded(&q, &[q.members[0].as_path()], false).unwrap();
    m.check_volume(&vol, "clean pool, member 1 missing");
    vol.shutdown().unwrap();
}

/// Plan (d)5, a stale member alone: member 1 fails live (the pool generation file in the
/// state directory records the generation, as member 0's pool block does); started alone
/// (member 0, which says member 1 failed, missing) member 1's pool block is older than the
/// file: refused, naming the generation and the member. Without the file the same start goes
/// on (what the file is for: member 1's own block cannot know it failed).
#[test]
fn a_stale_member_started_alone_is_refused_by_the_pool_generation_file() {
    use tiercache_server::pool_dev::PoolOpen;
    use tiercache_server::state_file::{pool_gen_path, read_pool_gen};
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteThrough);
    let dir = p.f.dir.path().join("state");
    let how = || PoolOpen {
        degraded: true,
        accept_lost_dirty: false,
        state_dir: Some(dir.clone()),
    };
    let stale = pool_block_of(&p.members[1]).generation;
    {
        let faults = Faults::new(7);
        let (d1, h1) = faults.wrap(
            "cache1",
            Box::new(FileDev::open(&p.members[1]).unwrap()),
            false,
        );
        let members: Vec<(String, Box<dyn BlockDev>)> = vec![
            ("m0".into(), Box::new(FileDev::open(&p.members[0]).unwrap())),
            ("m1".into(), Box::new(d1)),
        ];
        let vol = CacheVolume::open(
            Box::new(PoolDev::open_with(members, how()).unwrap()),
            Box::new(FileDev::open(&p.f.backing).unwrap()),
            &OpenOptions::default(),
        )
        .unwrap()
        .0;
        vol.set_max_cache_errors(1);
        let mut m = Model::new(0, VOL);
        run_ops(&vol, &mut m, 0x30, 300);
        h1.lose();
        run_ops(&vol, &mut m, 0x31, 300);
        assert!(vol.pool_members()[1].0, "member 1 failed");
        vol.shutdown().unwrap();
    }
    let b0 = pool_block_of(&p.members[0]);
    let g = read_pool_gen(&pool_gen_path(&dir, &b0.pool))
        .unwrap()
        .expect("the failure is recorded in the state directory");
    assert_eq!(g.member, 1);
    assert!(
        g.generation > stale && g.generation <= b0.generation,
        "{g:?} {b0:?}"
    );
    assert_eq!(
        pool_block_of(&p.members[1]).generation,
        stale,
        "member 1 never heard"
    );
    let e = match PoolDev::open_with(devs(&[p.members[1].as_path()]), how()) {
        Ok(_) => panic!("the stale member alone opened"),
        Err(e) => e,
    };
    assert!(
        e.contains("stale members")
            && e.contains(&format!("generation {stale}"))
            && e.contains("member 1 (uuid")
            && e.contains(&format!("recorded failed at generation {}", g.generation)),
        "{e}"
    );
    // The right members still open (member 1 given too: it is kept out).
    let m: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    PoolDev::open_with(devs(&m), how()).unwrap();
    // Without the file, member 1 alone would start: what the file is for.
    let no_file = PoolOpen {
        degraded: true,
        ..Default::default()
    };
    assert!(PoolDev::open_with(devs(&[p.members[1].as_path()]), no_file).is_ok());
}

/// Plan (d)5 with `--dirty-copies 2` (issue 15 item 2): a write-back pool of two whose
/// member 1 holds dirty lines, every one mirrored on member 0, stopped cleanly or killed,
/// restarted with member 1 missing, empty (zeroed) or unreadable (every read fails): its
/// `may_dirty` flag is set but its `may_single` flag clear, so the start goes on degraded
/// (nothing reported lost) and every acknowledged byte reads back, member 1's dirty lines
/// from their copies on member 0, promoted. Those are single-copy then: member 0's
/// `may_single` flag is raised before serving, and a later plain open (member 1 failed
/// earlier) still serves everything. Before the flag, the same starts were refused
/// (`may_dirty` alone cannot tell mirrored from lost).
#[test]
fn a_missing_member_whose_dirty_lines_are_mirrored_starts_degraded() {
    use tiercache_server::format::MemberState;
    for how in ["missing", "empty", "unreadable"] {
        for kill in [false, true] {
            let what = format!(
                "member 1 {how} after a {}",
                if kill { "kill" } else { "clean stop" }
            );
            // Room for every line and its copy: no dirty line is evicted.
            let p = pool_files(&[512, 512]);
            format_pool_copies(&p, Mode::WriteBack, None);
            let mut m = Model::new(0, VOL);
            let vol = open_pool(&p, &[0, 1]);
            run_ops(&vol, &mut m, 0x61, 300);
            vol.flush().unwrap();
            m.flush();
            // Mirrored writes and flushes rewrite no pool block: a line's record and its
            // copy's are one batch (`BlockDev::prepare_records`), never single-copy between.
            let gen = pool_block_of(&p.members[0]).generation;
            run_ops(&vol, &mut m, 0x63, 300);
            vol.flush().unwrap();
            m.flush();
            assert_eq!(
                pool_block_of(&p.members[0]).generation,
                gen,
                "{what}: a pool block rewritten by mirrored writes"
            );
            let st = vol.stats();
            assert!(
                st.pool_members[1].dirty_lines > 8,
                "{what}: member 1 holds too few dirty lines: {st:?}"
            );
            assert_eq!(st.unmirrored_lines, 0, "{what}: every dirty line mirrored");
            if kill {
                drop(vol); // no shutdown
            } else {
                vol.shutdown().unwrap();
                drop(vol);
            }
            let (a, b) = (p.members[0].as_path(), p.members[1].as_path());
            let before = pool_block_of(a);
            assert!(
                before.members[1].may_dirty && !before.members[1].may_single,
                "{what}: member 1 dirty, every dirty line mirrored: {before:?}"
            );
            let opened = match how {
                "missing" => open_degraded(&p, &[a], false),
                "empty" => {
                    std::fs::write(b, vec![0u8; std::fs::metadata(b).unwrap().len() as usize])
                        .unwrap();
                    open_degraded(&p, &[b, a], false)
                }
                _ => {
                    let faults = Faults::new(3);
                    let (d1, h1) =
                        faults.wrap("cache1", Box::new(FileDev::open(b).unwrap()), false);
                    h1.lose();
                    let members: Vec<(String, Box<dyn BlockDev>)> = vec![
                        ("m1".into(), Box::new(d1)),
                        ("m0".into(), Box::new(FileDev::open(a).unwrap())),
                    ];
                    let how = tiercache_server::pool_dev::PoolOpen {
                        degraded: true,
                        accept_lost_dirty: false,
                        state_dir: None,
                    };
                    PoolDev::open_with(members, how).and_then(|pd| {
                        CacheVolume::open(
                            Box::new(pd),
                            Box::new(FileDev::open(&p.f.backing).unwrap()),
                            &OpenOptions::default(),
                        )
                        .map(|v| v.0)
                        .map_err(|e| e.to_string())
                    })
                }
            };
            let vol = opened.unwrap_or_else(|e| panic!("{what}: refused: {e}"));
            assert_eq!(
                vol.pool_members().iter().map(|x| x.0).collect::<Vec<_>>(),
                vec![false, true],
                "{what}: member 1 failed"
            );
            assert_eq!(vol.lost_dirty_ranges(), vec![], "{what}: nothing lost");
            m.check_volume(&vol, &format!("{what}: degraded"));
            let st = vol.stats();
            assert!(
                st.unmirrored_lines > 8,
                "{what}: member 1's lines promoted from their copies: {st:?}"
            );
            let after = pool_block_of(a);
            assert_eq!(after.members[1].state, MemberState::Failed, "{what}");
            assert!(
                after.members[0].may_single,
                "{what}: member 0 holds single-copy dirty lines now: {after:?}"
            );
            run_ops(&vol, &mut m, 0x62, 200);
            vol.flush().unwrap();
            m.flush();
            m.check_volume(&vol, &format!("{what}: degraded, written"));
            drop(vol);
            let pd = PoolDev::open(devs(&[a])).unwrap();
            let vol = CacheVolume::open(
                Box::new(pd),
                Box::new(FileDev::open(&p.f.backing).unwrap()),
                &OpenOptions::default(),
            )
            .unwrap()
            .0;
            m.check_volume(&vol, &format!("{what}: restarted"));
            vol.shutdown().unwrap();
        }
    }
}

/// A member's pool block torn by a power cut while a flag change rewrote it (the blocks are
/// written member by member, each synced, so one at a time): the member is known by its
/// superblock's uuid in the other member's block, opened with that membership, and a
/// serving open rewrites its block. Before, the torn member was refused as "not a member of
/// a cache pool" and the pool could not start at all. A torn block with no other member to
/// say which it is, or on a device whose uuid the pool does not list, is still refused.
#[test]
fn a_torn_pool_block_is_taken_from_the_other_members() {
    let p = pool_files(&[128, 128]);
    format_pool(&p, Mode::WriteBack);
    let mut m = Model::new(0, VOL);
    let vol = open_pool(&p, &[0, 1]);
    run_ops(&vol, &mut m, 0x71, 300);
    vol.flush().unwrap();
    m.flush();
    vol.shutdown().unwrap();
    drop(vol);
    let (a, b) = (p.members[0].as_path(), p.members[1].as_path());
    let good = pool_block_of(a);
    // The first sector of a newer block, the rest as it was: the crc fails.
    let mut f = std::fs::read(a).unwrap();
    let newer = tiercache_server::format::PoolBlock {
        generation: good.generation + 1,
        ..good.clone()
    };
    f[4096..4096 + 512].copy_from_slice(&newer.encode()[..512]);
    std::fs::write(a, &f).unwrap();
    assert!(tiercache_server::format::PoolBlock::decode(&f[4096..8192])
        .unwrap_err()
        .contains("checksum"));
    let e = PoolDev::open(devs(&[a])).err().expect("alone: refused");
    assert!(e.contains("damaged"), "{e}");
    let vol = CacheVolume::open(
        Box::new(PoolDev::open(devs(&[b, a])).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    m.check_volume(&vol, "torn block, plain open");
    vol.shutdown().unwrap();
    drop(vol);
    assert!(
        tiercache_server::format::PoolBlock::decode(&std::fs::read(a).unwrap()[4096..8192])
            .is_err(),
        "a plain open writes nothing"
    );
    let vol = open_degraded(&p, &[a, b], false).unwrap();
    m.check_volume(&vol, "torn block, serving open");
    vol.shutdown().unwrap();
    drop(vol);
    let repaired = pool_block_of(a);
    assert_eq!(repaired.index, 0);
    assert_eq!(repaired.pool, good.pool);
    // A device of another pool with a torn block: its uuid is not listed.
    let q = pool_files(&[128, 128]);
    format_pool(&q, Mode::WriteBack);
    let mut g = std::fs::read(&q.members[1]).unwrap();
    g[4096 + 600] ^= 1;
    std::fs::write(&q.members[1], &g).unwrap();
    let e = PoolDev::open(devs(&[a, q.members[1].as_path()]))
        .err()
        .expect("another pool's member refused");
    assert!(e.contains("not a member of pool"), "{e}");
}
