//! Re-mirroring and member replacement on a pool of cache devices (`--dirty-copies 2`,
//! docs/plan-multi-cache.md (d)6): once a member failed, dirty lines have one cache copy
//! (`unmirrored_lines`); the cleaner (`CacheVolume::remirror`) gives each a copy on another
//! live member again, and `replace_cache_member` (`ctl cache replace`) formats a new device
//! as the failed member so that a pool of two is mirrored again. Each test asserts through
//! the loss of a SECOND member: only a copy written by the re-mirror still holds those lines,
//! so the assertion fails on a build without it (each runs that control too).

mod common;

use common::*;
use std::path::Path;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::fault::{FaultHandle, Faults};
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions, PoolDev};

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

/// Formats `p` in write-back with the default two dirty copies.
fn format_wb(p: &PoolFiles) {
    let m: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    let opts = FormatOptions {
        line_size: POOL_LS,
        mode: Mode::WriteBack,
        ..Default::default()
    };
    PoolDev::format(devs(&m), VOL, &opts, None).unwrap();
}

/// The pool of `paths` (members named `m0`, `m1`, ... in the order given) behind
/// [`FaultDev`]s (not volatile), failed at the first error.
fn open_faulty(paths: &[&Path], backing: &Path) -> (CacheVolume, Vec<FaultHandle>) {
    let faults = Faults::new(25);
    let mut hs = Vec::new();
    let mut members: Vec<(String, Box<dyn BlockDev>)> = Vec::new();
    for (i, m) in paths.iter().enumerate() {
        let (d, h) = faults.wrap(
            &format!("cache{i}"),
            Box::new(FileDev::open(m).unwrap()),
            false,
        );
        members.push((format!("m{i}"), Box::new(d)));
        hs.push(h);
    }
    let vol = CacheVolume::open(
        Box::new(PoolDev::open(members).unwrap()),
        Box::new(FileDev::open(backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    vol.set_max_cache_errors(1);
    (vol, hs)
}

/// Random writes (no reads, no flushes): lines stay dirty.
fn write_ops(vol: &CacheVolume, m: &mut Model, seed: u64, ops: usize) {
    let mut r = rng(seed);
    for i in 0..ops {
        let (_, off, len, _) = random_op(&mut r, VOL);
        let data: Vec<u8> = (0..len).map(|k| (i as u8) ^ (k as u8) ^ 0x5a).collect();
        vol.write(off, &data, false).unwrap();
        m.write(off as usize, &data, false);
    }
}

/// Member `d` lost (every call fails, a pulled device); the next flush fails it alone.
fn lose_member(vol: &CacheVolume, h: &FaultHandle, d: usize, what: &str) {
    h.lose();
    vol.flush()
        .unwrap_or_else(|e| panic!("{what}: the flush failing member {d}: {e}"));
    assert!(vol.pool_members()[d].0, "{what}: member {d} not failed");
}

/// Three members, member 2 lost: the dirty lines whose copy or primary it held have one
/// copy; the re-mirror (the cleaner's first step, before any write-back) copies them onto
/// members 0 and 1, and then member 0 lost too loses nothing: member 1 holds every dirty
/// line. Without the re-mirror the same second loss loses acknowledged writes.
#[test]
fn remirror_after_a_member_failed_survives_a_second_loss() {
    for remirror in [true, false] {
        let what = format!("remirror {remirror}");
        let p = pool_files(&[128, 128, 128]);
        format_wb(&p);
        let m3: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
        let (vol, hs) = open_faulty(&m3, &p.f.backing);
        let mut m = Model::new(0, VOL);
        write_ops(&vol, &mut m, 0x25, 250);
        vol.flush().unwrap();
        m.flush();
        write_ops(&vol, &mut m, 0x26, 80);
        assert_eq!(vol.stats().unmirrored_lines, 0, "{what}: before");
        assert!(
            vol.stats().pool_members[2].dirty_lines > 0,
            "{what}: no dirty line on member 2"
        );
        lose_member(&vol, &hs[2], 2, &what);
        m.flush();
        let single = vol.stats().unmirrored_lines;
        assert!(single > 0, "{what}: no line left with one copy");
        // Written on meanwhile (mirrored on 0 and 1 as they come).
        write_ops(&vol, &mut m, 0x27, 40);
        let dirty = vol.stats().dirty_lines;
        if remirror {
            // The cleaner's pass re-mirrors first, writing nothing back.
            assert!(vol.clean_if_needed().unwrap(), "{what}: the cleaner idle");
            let st = vol.stats();
            assert_eq!(st.dirty_lines, dirty, "{what}: the cleaner wrote back");
            assert!(
                st.unmirrored_lines < single,
                "{what}: the cleaner re-mirrored nothing ({single} single)"
            );
            vol.remirror().unwrap();
            let st = vol.stats();
            assert_eq!(st.dirty_lines, dirty, "{what}: after");
            assert_eq!(st.copy_slots, dirty - st.unmirrored_lines, "{what}: copies");
            // Lines that found no slot for a copy (dirty lines and copies fill the two
            // members): the cleaner writes them back first.
            let mut passes = 0;
            while vol.stats().unmirrored_lines > 0 {
                assert!(vol.clean_if_needed().unwrap(), "{what}: the cleaner idle");
                passes += 1;
                assert!(
                    passes < 100,
                    "{what}: still single: {:?}",
                    vol.stats().unmirrored_lines
                );
            }
            m.check_volume(&vol, &format!("{what}: after the re-mirror"));
            // What an operator watches: the re-mirror counted, nothing left single.
            let st = vol.stats();
            assert!(st.remirrored_lines > 0, "{what}: re-mirror not counted");
            let text = vol.metrics().prometheus(&st);
            for want in [
                "tiercache_pool_unmirrored_lines 0".to_string(),
                format!("tiercache_pool_copy_slots {}", st.copy_slots),
                format!(
                    "tiercache_pool_remirrored_lines_total {}",
                    st.remirrored_lines
                ),
            ] {
                assert!(
                    text.contains(&want),
                    "{what}: no `{want}` in /metrics:\n{text}"
                );
            }
        }
        hs[0].lose();
        let flushed = vol.flush();
        let mut buf = vec![0u8; VOL as usize];
        let read = vol.read(0, &mut buf);
        let lost = vol.lost_dirty_ranges();
        if remirror {
            flushed.unwrap_or_else(|e| panic!("{what}: the flush failing member 0: {e}"));
            assert!(vol.pool_members()[0].0, "{what}: member 0 not failed");
            read.unwrap_or_else(|e| panic!("{what}: read after the second loss: {e}"));
            m.check_now(0, &buf, &format!("{what}: after the second loss"));
            assert_eq!(lost, vec![], "{what}");
            assert!(!vol.cache_failed(), "{what}");
            vol.flush_dirty().unwrap();
            m.check_volume(&vol, &format!("{what}: written back"));
        } else {
            assert!(
                flushed.is_err() || read.is_err() || !lost.is_empty(),
                "{what}: the second loss lost nothing without the re-mirror (the test would not see it)"
            );
        }
    }
}

/// Two members, member 1 lost: `replace_cache_member` refuses an active member, a live
/// member's name or device, a device too small (each named), then formats a new file as
/// member 1; the re-mirror gives every dirty line its copy there again; member 0 lost then
/// loses nothing. A restart with member 0 and the new file serves everything (the pool
/// blocks say member 1 is the new device).
#[test]
fn a_failed_member_replaced_is_mirrored_onto_and_survives_a_restart() {
    for replace in [true, false] {
        let what = format!("replace {replace}");
        let p = pool_files(&[128, 128]);
        format_wb(&p);
        let fresh = p.f.dir.path().join("new.img");
        let len = std::fs::metadata(&p.members[1]).unwrap().len();
        std::fs::File::create(&fresh).unwrap().set_len(len).unwrap();
        let small = p.f.dir.path().join("small.img");
        std::fs::File::create(&small)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let m2: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
        let (vol, hs) = open_faulty(&m2, &p.f.backing);
        let mut m = Model::new(0, VOL);
        write_ops(&vol, &mut m, 0x35, 250);
        vol.flush().unwrap();
        m.flush();
        write_ops(&vol, &mut m, 0x36, 80);
        lose_member(&vol, &hs[1], 1, &what);
        m.flush();
        assert!(vol.stats().unmirrored_lines > 0, "{what}: nothing single");
        // One live member: nothing to mirror onto.
        assert_eq!(vol.remirror().unwrap(), 0, "{what}");
        let open = |f: &Path| Box::new(FileDev::open(f).unwrap()) as Box<dyn BlockDev>;
        let name = fresh.display().to_string();
        let refused = |d: usize, n: &str, f: &Path, want: &str| {
            let e = vol
                .replace_cache_member(d, n.to_string(), open(f))
                .expect_err(&format!("{what}: replace {d} by {n} accepted"));
            assert!(e.contains(want), "{what}: replace {d} by {n}: {e}");
        };
        refused(0, &name, &fresh, "member 0 (m0): it is active, not failed");
        refused(1, "m0", &fresh, "m0 is member 0 of this pool");
        refused(1, "other", &p.members[0], "other is member 0 of this pool");
        refused(1, "small", &small, "small holds");
        refused(2, &name, &fresh, "the pool has 2 members");
        write_ops(&vol, &mut m, 0x37, 40);
        if !replace {
            // The control: without a replacement the loss of member 0 loses writes.
            hs[0].lose();
            let _ = vol.flush();
            let mut buf = vec![0u8; VOL as usize];
            let read = vol.read(0, &mut buf);
            assert!(
                read.is_err() || !vol.lost_dirty_ranges().is_empty(),
                "{what}: losing the last member lost nothing (the test would not see it)"
            );
            continue;
        }
        vol.replace_cache_member(1, name.clone(), open(&fresh))
            .unwrap_or_else(|e| panic!("{what}: replace: {e}"));
        assert!(!vol.pool_members()[1].0, "{what}: still failed");
        assert_eq!(vol.stats().pool_members[1].path, name, "{what}");
        assert!(vol.remirror().unwrap() > 0, "{what}: nothing re-mirrored");
        assert_eq!(vol.stats().unmirrored_lines, 0, "{what}: after");
        m.check_volume(&vol, &format!("{what}: after the re-mirror"));
        write_ops(&vol, &mut m, 0x38, 40);
        vol.flush().unwrap();
        m.flush();
        m.check_volume(&vol, &format!("{what}: before the restart"));
        vol.shutdown().unwrap();
        drop(vol);
        // The new device is member 1 now: the old file (stale, failed) is refused with it.
        let stale = PoolDev::open(devs(&[&p.members[0], &p.members[1], &fresh]));
        assert!(stale.is_err(), "{what}: a third device taken");
        let (vol, hs) = open_faulty(&[&p.members[0], &fresh], &p.f.backing);
        m.check_volume(&vol, &format!("{what}: after the restart"));
        assert!(vol.pool_members().iter().all(|x| !x.0), "{what}: failed");
        // Every dirty line has its copy when the open returns (by its record, or mirrored
        // again by the open).
        assert_eq!(vol.stats().unmirrored_lines, 0, "{what}: restarted");
        write_ops(&vol, &mut m, 0x39, 40);
        assert_eq!(
            vol.stats().unmirrored_lines,
            0,
            "{what}: restarted, written"
        );
        lose_member(&vol, &hs[0], 0, &what);
        let mut buf = vec![0u8; VOL as usize];
        vol.read(0, &mut buf)
            .unwrap_or_else(|e| panic!("{what}: read after losing member 0: {e}"));
        m.check_now(0, &buf, &format!("{what}: member 0 lost"));
        assert_eq!(vol.lost_dirty_ranges(), vec![], "{what}");
    }
}

/// A member holding clean lines whose records were flushed, failed and replaced: the new
/// device gets no record of a line its predecessor held. Before, the engine's journal kept
/// the state of each slot changed since the last flush as its durable record showed it (a
/// clean line evicted for a copy), the failed device's records were never rewritten, and the
/// first flush after the replacement wrote those states to the new device: after a restart
/// the lines mapped to slots whose data the new device never received, and read back as
/// zeroes (found by `pool_fault_model`, seed 11).
#[test]
fn a_replaced_member_maps_no_line_its_predecessor_held() {
    let p = pool_files(&[128, 128]);
    format_wb(&p);
    let fresh = p.f.dir.path().join("new.img");
    let len = std::fs::metadata(&p.members[1]).unwrap().len();
    std::fs::File::create(&fresh).unwrap().set_len(len).unwrap();
    let m2: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    let (vol, hs) = open_faulty(&m2, &p.f.backing);
    // Every line read: clean lines on both members, their records flushed.
    let mut m = Model::new(0, VOL);
    m.check_volume(&vol, "first read");
    vol.flush().unwrap();
    assert!(
        vol.stats().pool_members[1].lines > 0,
        "no clean line on member 1"
    );
    // Written lines are mirrored: each copy takes the slot of a clean line (evicted; the
    // slot's journaled state is that line until a flush takes it) ...
    let mut k = 0;
    for _ in 0..32 {
        let data = vec![0x66u8; 4096];
        vol.write(k, &data, false).unwrap();
        m.write(k as usize, &data, false);
        k += 4096;
    }
    // ... and member 1 fails under a client write (not in a flush, which would take them).
    hs[1].fail_writes(0..u64::MAX);
    while !vol.pool_members()[1].0 {
        assert!(k < VOL, "member 1 never failed");
        let data = vec![0x77u8; 4096];
        vol.write(k, &data, false).unwrap();
        m.write(k as usize, &data, false);
        k += 4096;
    }
    vol.replace_cache_member(
        1,
        fresh.display().to_string(),
        Box::new(FileDev::open(&fresh).unwrap()),
    )
    .unwrap();
    // The re-mirror writes copies to the new device: its record pages are written.
    assert!(vol.remirror().unwrap() > 0, "nothing re-mirrored");
    // (Nothing read before the restart: a read would fill the new device's slots, and so
    // overwrite what the stale records said with real lines.)
    vol.flush().unwrap();
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, _) = open_faulty(&[&p.members[0], &fresh], &p.f.backing);
    m.check_volume(&vol, "after the restart");
}

/// One crash point: a pool of three members, member 2 lost mid-run, then writes, flushes
/// and re-mirror passes; the power cut at event `n` (of every member's and the backing
/// device's writes and syncs, the re-mirror's record unmaps and copy writes among them);
/// reopened on the three files and checked: every FLUSHed value reads back, nothing reads
/// another line's bytes.
fn crash_run(p: &PoolFiles, seed: u64, crash: Option<u64>) -> u64 {
    std::fs::write(&p.f.backing, (0..VOL).map(initial).collect::<Vec<u8>>()).unwrap();
    format_wb(p);
    let faults = Faults::new(seed ^ 0x2525);
    faults.crash_at(crash.unwrap_or(u64::MAX), true);
    let mut hs = Vec::new();
    let mut members: Vec<(String, Box<dyn BlockDev>)> = Vec::new();
    for (i, path) in p.members.iter().enumerate() {
        let name = if i == 0 {
            "cache".to_string()
        } else {
            format!("cache{i}")
        };
        let (d, h) = faults.wrap(&name, Box::new(FileDev::open(path).unwrap()), true);
        members.push((format!("m{i}"), Box::new(d)));
        hs.push(h);
    }
    let what = format!("seed {seed} crash {crash:?}");
    let mut m = Model::new(0, VOL);
    let backing = faults
        .wrap(
            "backing",
            Box::new(FileDev::open(&p.f.backing).unwrap()),
            true,
        )
        .0;
    let opened = PoolDev::open(members).and_then(|pd| {
        CacheVolume::open(Box::new(pd), Box::new(backing), &OpenOptions::default())
            .map(|v| v.0)
            .map_err(|e| e.to_string())
    });
    match opened {
        Err(e) => assert!(faults.power_lost(), "{what}: open failed: {e}"),
        Ok(vol) => {
            vol.set_max_cache_errors(1);
            let mut r = rng(seed);
            'run: for i in 0..360 {
                if i == 120 {
                    hs[2].lose();
                }
                let ok = model_op(
                    &vol,
                    &mut m,
                    random_op(&mut r, VOL),
                    i,
                    0xc3,
                    &|| faults.power_lost(),
                    &what,
                );
                if !ok {
                    assert!(faults.power_lost(), "{what}: op {i} failed without a crash");
                    break 'run;
                }
                if i > 120 && i % 15 == 0 && vol.remirror().is_err() {
                    assert!(
                        faults.power_lost(),
                        "{what}: re-mirror failed without a crash"
                    );
                    break 'run;
                }
            }
            if crash.is_none() {
                assert!(vol.pool_members()[2].0, "{what}: member 2 not failed");
                vol.remirror().unwrap();
                assert_eq!(vol.stats().unmirrored_lines, 0, "{what}: left single");
                vol.shutdown().unwrap();
            }
        }
    }
    faults.power_cut();
    let events = faults.events();
    let order: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
    let vol = CacheVolume::open(
        Box::new(PoolDev::open(devs(&order)).unwrap()),
        Box::new(FileDev::open(&p.f.backing).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap()
    .0;
    let mut buf = vec![0u8; VOL as usize];
    vol.read(0, &mut buf).unwrap();
    m.check_after_crash(0, &buf, &what);
    vol.write(8192, &[9u8; 4096], false).unwrap();
    vol.flush().unwrap();
    let mut one = vec![0u8; 4096];
    vol.read(8192, &mut one).unwrap();
    assert!(
        one.iter().all(|&x| x == 9),
        "{what}: written after the restart"
    );
    vol.shutdown().unwrap();
    events
}

#[test]
fn crash_points_during_remirror_keep_every_flushed_value() {
    let p = pool_files(&[128, 128, 128]);
    let points = crash_budget(40, 2000);
    crash_sweep(Mode::WriteBack, points, false, 1, 20, 0x25, |seed, c| {
        (crash_run(&p, seed, c.map(|c| c.1)), 0)
    });
}

/// Plan (d)5, the refusal half (issue 15 item 2): three members, member 2 lost live, so the
/// dirty lines of member 1 whose copy member 2 held have one copy: member 1's `may_single`
/// flag is raised (in the pool blocks recording the failure) and, the server killed, a
/// start without member 1 is refused, naming the ranges, and marks nothing. Re-mirrored
/// first (the cleaner) and flushed, the flag is cleared and the same start goes on
/// degraded: every acknowledged byte reads back (member 1's lines from their new copies).
#[test]
fn a_missing_member_with_single_copy_dirty_lines_is_refused_until_remirrored() {
    use tiercache_server::format::{MemberState, PoolBlock};
    use tiercache_server::pool_dev::PoolOpen;
    let block = |path: &Path| {
        let b = std::fs::read(path).unwrap();
        PoolBlock::decode(&b[4096..8192]).unwrap()
    };
    for remirror in [false, true] {
        let what = format!("remirror {remirror}");
        let p = pool_files(&[256, 256, 256]);
        format_wb(&p);
        let m3: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
        let mut m = Model::new(0, VOL);
        {
            let (vol, hs) = open_faulty(&m3, &p.f.backing);
            write_ops(&vol, &mut m, 0x41, 300);
            vol.flush().unwrap();
            m.flush();
            assert_eq!(vol.stats().unmirrored_lines, 0, "{what}: before");
            assert!(
                block(m3[0]).members.iter().all(|x| !x.may_single),
                "{what}: every dirty line mirrored: no member flagged"
            );
            lose_member(&vol, &hs[2], 2, &what);
            m.flush();
            assert!(vol.stats().unmirrored_lines > 0, "{what}: none single");
            if remirror {
                let mut passes = 0;
                while vol.stats().unmirrored_lines > 0 {
                    assert!(vol.clean_if_needed().unwrap(), "{what}: the cleaner idle");
                    passes += 1;
                    assert!(passes < 100, "{what}: still single");
                }
                vol.flush().unwrap();
            }
            assert!(
                vol.stats().pool_members[1].dirty_lines > 0,
                "{what}: member 1 holds no dirty line"
            );
            drop(vol); // killed
        }
        let b0 = block(m3[0]);
        assert_eq!(b0.members[2].state, MemberState::Failed, "{what}");
        assert!(b0.members[1].may_dirty, "{what}: {b0:?}");
        assert_eq!(b0.members[1].may_single, !remirror, "{what}: {b0:?}");
        let how = PoolOpen {
            degraded: true,
            accept_lost_dirty: false,
            state_dir: None,
        };
        let opened = PoolDev::open_with(devs(&[m3[0]]), how);
        if !remirror {
            let e = opened.err().expect("refused");
            assert!(
                e.contains("pool member 1")
                    && e.contains("may hold dirty lines")
                    && e.contains(&format!("volume bytes 0..{VOL}"))
                    && e.contains("--accept-lost-dirty"),
                "{what}: {e}"
            );
            assert_eq!(
                block(m3[0]).members[1].state,
                MemberState::Active,
                "{what}: a refused start marks nothing"
            );
            continue;
        }
        let vol = CacheVolume::open(
            Box::new(opened.unwrap_or_else(|e| panic!("{what}: refused: {e}"))),
            Box::new(FileDev::open(&p.f.backing).unwrap()),
            &OpenOptions::default(),
        )
        .unwrap()
        .0;
        assert_eq!(vol.lost_dirty_ranges(), vec![], "{what}");
        assert_eq!(
            vol.pool_members().iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![false, true, true],
            "{what}"
        );
        m.check_volume(&vol, &format!("{what}: member 1 missing"));
        vol.shutdown().unwrap();
    }
}

/// Three members, member 2 lost: dirty lines are left with one copy, and the volume stops
/// cleanly before the cleaner settles them (as a power cut leaves lines whose copy records
/// were not durable, found by `pool_fault_model` seeds 326, 422, 451). The restart settles
/// them before it serves anything: mirrored again where a slot for a copy is free (a few
/// dirty lines), written back where none is (dirty lines fill the live members); no line is
/// single after the open, a second restart finds the copies by their records, and the loss
/// of member 0 then loses nothing. Before, the open left them single until the cleaner's
/// first pass, and that loss lost their dirty sectors.
#[test]
fn a_restart_settles_lines_left_single_before_serving() {
    for (clean_ops, dirty_ops, mirrored) in [(0, 20, true), (250, 80, false)] {
        let what = format!("{dirty_ops} dirty ops");
        let p = pool_files(&[128, 128, 128]);
        format_wb(&p);
        let m3: Vec<&Path> = p.members.iter().map(|x| x.as_path()).collect();
        let (vol, hs) = open_faulty(&m3, &p.f.backing);
        let mut m = Model::new(0, VOL);
        write_ops(&vol, &mut m, 0x45, clean_ops);
        vol.flush().unwrap();
        m.flush();
        write_ops(&vol, &mut m, 0x46, dirty_ops);
        lose_member(&vol, &hs[2], 2, &what);
        m.flush();
        let single = vol.stats().unmirrored_lines;
        let dirty = vol.stats().dirty_lines;
        assert!(single > 0, "{what}: no line left with one copy");
        vol.shutdown().unwrap();
        drop(vol);
        let (vol, _) = open_faulty(&m3, &p.f.backing);
        assert!(
            vol.pool_members()[2].0,
            "{what}: member 2 not failed after the restart"
        );
        let st = vol.stats();
        assert_eq!(
            st.unmirrored_lines, 0,
            "{what}: {single} lines single before the restart, still single after the open"
        );
        if mirrored {
            assert_eq!(st.remirrored_lines, single, "{what}: mirrored at open");
            assert_eq!(st.dirty_lines, dirty, "{what}: written back at open");
        } else {
            assert!(
                st.dirty_lines < dirty,
                "{what}: nothing written back at open"
            );
        }
        m.check_volume(&vol, &format!("{what}: after the restart"));
        // The open made its copies' records durable: a second restart pairs them.
        vol.shutdown().unwrap();
        drop(vol);
        let (vol, hs) = open_faulty(&m3, &p.f.backing);
        let st = vol.stats();
        assert_eq!(
            st.unmirrored_lines, 0,
            "{what}: single after a second restart"
        );
        assert_eq!(
            st.remirrored_lines, 0,
            "{what}: a second restart mirrored again"
        );
        lose_member(&vol, &hs[0], 0, &what);
        let mut buf = vec![0u8; VOL as usize];
        vol.read(0, &mut buf)
            .unwrap_or_else(|e| panic!("{what}: read after losing member 0: {e}"));
        m.check_now(0, &buf, &format!("{what}: member 0 lost after the restart"));
        assert_eq!(
            vol.lost_dirty_ranges(),
            vec![],
            "{what}: lost after the restart"
        );
        // A restart of what is left (one live member): nothing to mirror onto.
        vol.shutdown().unwrap();
        drop(vol);
        let (vol, _) = open_faulty(&m3, &p.f.backing);
        m.check_volume(&vol, &format!("{what}: one member left"));
    }
}
