//! Several volumes, one pool (`docs/design-pool.md`): per-volume settings and counters, and
//! volumes that never see each other's bytes.

mod common;

use common::{execute, World, VOL_BYTES};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache_engine::engine::{LINE_BITS, MAX_VOLUME};
use tiercache_engine::{
    Admission, Counters, Engine, EngineConfig, EngineError, Mode, Request, Validity, VolumeConfig,
};

fn vol(id: u32, mode: Option<Mode>, admission: Option<Admission>) -> VolumeConfig {
    VolumeConfig {
        mode,
        admission,
        ..VolumeConfig::new(id, format!("v{id}"))
    }
}

fn config(cap: u64, mode: Mode, volumes: Vec<VolumeConfig>) -> EngineConfig {
    EngineConfig {
        capacity_lines: cap,
        mode,
        dirty_high: 0.5,
        dirty_low: 0.25,
        volume_bytes: Some(VOL_BYTES),
        rewrite_chunk: 16 << 10,
        rewrite_min_runs: 2,
        volumes,
        ..Default::default()
    }
}

/// A table that only names the volumes changes nothing: the same plans, the same counters,
/// request for request, as the engine without one (the per-volume path adds counting only).
#[test]
fn a_table_without_overrides_plans_exactly_as_without_one() {
    for mode in [Mode::WriteBack, Mode::WriteThrough] {
        let mut a = Engine::new(config(40, mode, Vec::new())).unwrap();
        let mut b = Engine::new(config(
            40,
            mode,
            vec![vol(0, None, None), vol(1, None, None)],
        ))
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for i in 0..5000 {
            let r = common::random_request(&mut rng, i);
            let pa = a.process(&r).unwrap().clone();
            let pb = b.process(&r).unwrap().clone();
            assert_eq!(pa.steps, pb.steps, "{mode:?} request {i} {r:?}");
            if a.needs_cleaning() {
                let n = a.cleaning_target();
                assert_eq!(a.clean(n).steps, b.clean(n).steps, "clean after {i}");
            }
        }
        assert_eq!(a.counters(), b.counters());
        assert!(a.volume_stats().is_empty(), "no table, no per-volume stats");
        assert_eq!(b.volume_stats().len(), 2);
    }
}

/// The counters of all volumes add up to the engine's totals, field by field, with
/// evictions, eviction write-backs, cleaning (chunk rewrites too) and failed write-backs.
#[test]
fn per_volume_counters_add_up_to_the_totals() {
    let vols = vec![
        vol(0, Some(Mode::WriteBack), None),
        vol(1, Some(Mode::WriteThrough), Some("nhit:2".parse().unwrap())),
    ];
    let mut e = Engine::new(config(32, Mode::WriteBack, vols)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut failed_some = false;
    for i in 0..8000 {
        let mut r = common::random_request(&mut rng, i);
        // A third volume not in the table: engine-wide settings, counted under its id.
        if rng.gen_bool(0.1) {
            r.volume = 5;
        }
        e.process(&r).unwrap();
        if i % 7 == 0 && e.dirty_lines() > 0 {
            let (t, failed): (_, Vec<u32>) = {
                let b = e.begin_clean(4).expect("dirty lines to clean");
                (
                    b.ticket,
                    b.lines.iter().step_by(2).map(|l| l.slot).collect(),
                )
            };
            e.complete_writeback(t, &failed);
            failed_some |= !failed.is_empty();
        } else if e.needs_cleaning() {
            let n = e.cleaning_target();
            e.clean(n);
        }
    }
    assert!(failed_some);
    let vs = e.volume_stats();
    assert_eq!(
        vs.iter().map(|v| v.id).collect::<Vec<_>>(),
        vec![0, 1, 5],
        "every volume that sent a request"
    );
    let mut sum = Counters::default();
    for v in &vs {
        sum += &v.counters;
        assert!(
            v.counters.check().is_ok(),
            "volume {}: {:?}",
            v.id,
            v.counters.check()
        );
    }
    let total = e.counters();
    assert!(total.write_backs > 0 && total.chunk_rewrites > 0 && total.evictions > 0);
    assert_eq!(sum, total);
    assert_eq!(vs.iter().map(|v| v.lines).sum::<u64>(), e.len());
    assert_eq!(
        vs.iter().map(|v| v.dirty_lines).sum::<u64>(),
        e.dirty_lines()
    );
    // Volume 1 is write-through: none of its lines is dirty.
    assert_eq!(vs[1].dirty_lines, 0);
    assert_eq!(vs[1].mode, Mode::WriteThrough);
    assert_eq!(vs[2].name, "5");
    e.reset_counters();
    assert!(e
        .volume_stats()
        .iter()
        .all(|v| v.counters == Counters::default()));
}

/// Each volume runs with its own mode and admission in one pool.
#[test]
fn each_volume_has_its_own_mode_and_admission() {
    let vols = vec![
        vol(0, Some(Mode::WriteBack), None),
        vol(1, Some(Mode::PassThrough), None),
        vol(2, None, Some("never".parse().unwrap())),
    ];
    let mut e = Engine::new(config(64, Mode::WriteThrough, vols)).unwrap();
    for v in 0..4u32 {
        for l in 0..8u64 {
            let mut w = Request::write(l * 4096, 4096);
            w.volume = v;
            e.process(&w).unwrap();
            let mut r = Request::read(l * 4096, 4096);
            r.volume = v;
            e.process(&r).unwrap();
        }
    }
    let vs = e.volume_stats();
    let by = |id: u32| vs.iter().find(|v| v.id == id).unwrap();
    // Write-back: cached dirty, every read hits, nothing reached the backing device.
    assert_eq!((by(0).lines, by(0).dirty_lines), (8, 8));
    assert_eq!(by(0).counters.read_line_hits, 8);
    assert_eq!(by(0).counters.hdd_bytes_written, 0);
    // Pass-through: nothing cached, everything on the backing device.
    assert_eq!(by(1).lines, 0);
    assert_eq!(by(1).counters.hdd_bytes_written, 8 * 4096);
    assert_eq!(by(1).counters.hdd_bytes_read, 8 * 4096);
    assert_eq!(by(1).mode, Mode::PassThrough);
    // Admission never: nothing cached, misses bypassed for admission.
    assert_eq!(by(2).lines, 0);
    assert_eq!(by(2).counters.bypasses.admission, 16);
    // Volume 3 is not in the table: the engine-wide write-through, admission always.
    assert_eq!((by(3).lines, by(3).dirty_lines), (8, 0));
    assert_eq!(by(3).mode, Mode::WriteThrough);
    assert_eq!(by(3).counters.read_line_hits, 8);
    // The engine-wide settings are back after every request.
    assert_eq!(e.config().mode, Mode::WriteThrough);
    assert!(e.config().admission.is_always());
}

/// The volume table is checked: ids in range, names present and unique.
#[test]
fn a_bad_volume_table_is_refused_by_name() {
    let bad = |vols: Vec<VolumeConfig>| {
        Engine::new(config(8, Mode::WriteThrough, vols))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let m = bad(vec![vol(MAX_VOLUME + 1, None, None)]);
    assert!(m.contains("out of range"), "{m}");
    let m = bad(vec![vol(1, None, None), VolumeConfig::new(2, "v1")]);
    assert!(m.contains("'v1'") && m.contains("share"), "{m}");
    let m = bad(vec![VolumeConfig::new(3, " ")]);
    assert!(m.contains("name is empty"), "{m}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Line keys of distinct (volume, line) pairs in range never collide, and a request
    /// outside the range is refused rather than folded onto another volume's key.
    #[test]
    fn line_keys_never_collide(
        v1 in 0..=MAX_VOLUME, v2 in 0..=MAX_VOLUME,
        l1 in 0..(1u64 << LINE_BITS), l2 in 0..(1u64 << LINE_BITS),
    ) {
        let (k1, k2) = (Engine::line_key(v1, l1), Engine::line_key(v2, l2));
        prop_assert_eq!(k1 == k2, (v1, l1) == (v2, l2));
        let mut e = Engine::new(config(8, Mode::WriteBack, vec![vol(0, None, None)])).unwrap();
        let mut r = Request::read(l1 << 12, 4096);
        r.volume = MAX_VOLUME + 1 + v1;
        prop_assert_eq!(e.process(&r).err(), Some(EngineError::BadVolume(r.volume)));
        let mut r = Request::read((1u64 << (LINE_BITS + 12)) + l2, 4096);
        r.volume = v2;
        let out_of_range = matches!(e.process(&r), Err(EngineError::OutOfRange { .. }));
        prop_assert!(out_of_range, "line 2^48 of volume {} was taken", v2);
        prop_assert!(e.is_empty());
    }

    /// Two volumes with the same offsets, each with its own random mode and admission, in one
    /// small pool: every read returns its own volume's bytes (the executor's HDDs start with
    /// different contents per volume and a reference model says what each byte must be), and
    /// after a full clean each backing device holds exactly its own volume's data.
    #[test]
    fn two_volumes_never_read_each_others_bytes(
        seed in any::<u64>(),
        m0 in 0..Mode::ALL.len(), m1 in 0..Mode::ALL.len(),
        a1 in 0..3usize,
        line_validity in any::<bool>(),
    ) {
        let adm = ["always", "nhit:2", "never"][a1].parse().unwrap();
        let vols = vec![
            vol(0, Some(Mode::ALL[m0]), None),
            vol(1, Some(Mode::ALL[m1]), Some(adm)),
        ];
        let mut cfg = config(24, Mode::WriteBack, vols);
        if line_validity {
            cfg.validity = Validity::Line;
        }
        let mut e = Engine::new(cfg).unwrap();
        let mut w = World::new(24 * 4096, 2);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for i in 0..1500u64 {
            let r = common::random_request(&mut rng, i);
            let plan = e.process(&r).unwrap().clone();
            if let Err(m) = execute(&mut w, &r, &plan, i) {
                return Err(TestCaseError::fail(format!("request {i} {r:?}: {m}")));
            }
            if e.needs_cleaning() {
                let n = e.cleaning_target();
                let plan = e.clean(n).clone();
                w.run(&plan, &mut []);
            }
        }
        for (k, _, _) in e.entries() {
            prop_assert!(k >> LINE_BITS <= 1, "key {k:#x} of a volume never used");
        }
        let plan = e.clean(u64::MAX).clone();
        w.run(&plan, &mut []);
        prop_assert_eq!(e.dirty_lines(), 0);
        if let Err(m) = common::check_hdd(&w) {
            return Err(TestCaseError::fail(m));
        }
    }
}

/// A volume's own size (`VolumeConfig::bytes`, a live volume's backing device) bounds its
/// group population and chunk rewrites; another volume keeps the engine-wide size.
#[test]
fn each_volume_is_bounded_by_its_own_size() {
    let small = 3 * 4096; // 3 lines: the 16-line group of line 0 ends past it
    let mut v1 = vol(1, None, None);
    v1.bytes = Some(small);
    let cfg = EngineConfig {
        group_size: 64 << 10,
        ..config(64, Mode::WriteBack, vec![vol(0, None, None), v1])
    };
    let mut e = Engine::new(cfg).unwrap();
    let hdd_ends = |steps: &[tiercache_engine::Step], want: u32| -> Vec<u64> {
        steps
            .iter()
            .filter_map(|s| match *s {
                tiercache_engine::Step::Populate { vol, hdd, len, .. }
                | tiercache_engine::Step::CopyHdd { vol, hdd, len }
                | tiercache_engine::Step::WriteBack { vol, hdd, len, .. }
                    if vol == want =>
                {
                    Some(hdd + len)
                }
                _ => None,
            })
            .collect()
    };
    let mut r = Request::read(0, 4096);
    r.volume = 1;
    let p1 = e.process(&r).unwrap().steps.clone();
    let ends = hdd_ends(&p1, 1);
    assert!(!ends.is_empty(), "the group is populated: {p1:?}");
    assert!(
        ends.iter().all(|&x| x <= small),
        "volume 1 populated past its end: {p1:?}"
    );
    r.volume = 0;
    let p0 = e.process(&r).unwrap().steps.clone();
    assert_eq!(
        hdd_ends(&p0, 0).into_iter().max(),
        Some(64 << 10),
        "volume 0 keeps the engine-wide size: {p0:?}"
    );
    // Chunk rewrites (4-line chunks): dirty lines 0 and 2 of volume 1 are rewritten with
    // line 1, never a line at or past its end (line 3).
    for l in [0u64, 2] {
        let mut w = Request::write(l * 4096, 4096);
        w.volume = 1;
        e.process(&w).unwrap();
    }
    let steps = e.clean(64).steps.clone();
    let ends = hdd_ends(&steps, 1);
    assert!(!ends.is_empty(), "{steps:?}");
    assert!(
        ends.iter().all(|&x| x <= small),
        "rewrite past the end: {steps:?}"
    );
}
