//! Several cache devices in one engine (`EngineConfig::pool_lines`): balanced placement of
//! lines over the members, a failed member's lines dropped and its slots never used again,
//! a revived member used again, multi-line misses one SSD write per member stripe.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use tiercache_engine::policy::REGISTRY;
use tiercache_engine::{
    CleaningPolicy, Engine, EngineConfig, Mode, Op, Plan, Pool, Request, Step, Validity,
    STRIPE_LINES,
};

const LINE: u64 = 4096;

fn engine(policy: &str, cleaning: CleaningPolicy, members: &[u64], mode: Mode) -> Engine {
    engine_with(policy, cleaning, members, |c| c.mode = mode)
}

fn engine_with(
    policy: &str,
    cleaning: CleaningPolicy,
    members: &[u64],
    f: impl FnOnce(&mut EngineConfig),
) -> Engine {
    let mut cfg = EngineConfig {
        capacity_lines: Pool::new(members).unwrap().capacity(),
        pool_lines: members.to_vec(),
        policy: policy.into(),
        cleaning,
        ..EngineConfig::default()
    };
    f(&mut cfg);
    let mut e = Engine::new(cfg).unwrap();
    if e.needs_oracle() {
        // No future is known in these runs: every line is used again "never".
        e.set_oracle(Vec::new());
    }
    e
}

/// A random request over `span_lines` lines: reads, writes (some of several lines), trims.
fn request(rng: &mut ChaCha8Rng, span_lines: u64, trims: bool) -> Request {
    let line = rng.gen_range(0..span_lines);
    let lines = if rng.gen_bool(0.2) {
        rng.gen_range(2..12)
    } else {
        1
    };
    let op = match rng.gen_range(0..100) {
        0..=49 => Op::Read,
        50..=94 => Op::Write,
        _ if trims => Op::Trim,
        _ => Op::Write,
    };
    let mut r = Request::new(0, op, line * LINE, lines * LINE);
    r.class = rng.gen_range(0..3);
    r
}

fn step(e: &mut Engine, r: &Request) {
    e.process(r).unwrap();
    if e.needs_cleaning() {
        let n = e.cleaning_target();
        e.clean(n);
    }
}

/// Lines cached per member.
fn used(e: &Engine) -> Vec<u64> {
    let mut u = vec![0; e.pool().members()];
    for (_, s, _) in e.entries() {
        u[e.member_of(s)] += 1;
    }
    u
}

fn cleanings() -> [CleaningPolicy; 2] {
    [CleaningPolicy::Lba, CleaningPolicy::Alru]
}

#[test]
fn lines_fill_members_of_unequal_sizes_evenly() {
    for members in [&[1024u64, 640][..], &[512, 1280, 768][..]] {
        let pool = Pool::new(members).unwrap();
        for p in REGISTRY {
            for cleaning in cleanings() {
                let mut e = engine(p.name, cleaning, members, Mode::WriteBack);
                let mut rng = ChaCha8Rng::seed_from_u64(21);
                // A working set of 60 % of the cache: it never fills, so where lines are is
                // the placement's choice, trims included.
                let span = pool.capacity() * 6 / 10;
                for i in 0..20_000 {
                    step(&mut e, &request(&mut rng, span, true));
                    if i % 4999 == 0 {
                        e.check_slots();
                    }
                }
                e.check_slots();
                let u = used(&e);
                let total: u64 = u.iter().sum();
                let fill = total as f64 / pool.capacity() as f64;
                assert!(fill > 0.3, "{}: the run filled only {fill}", p.name);
                for (d, &n) in u.iter().enumerate() {
                    let share = n as f64 / pool.lines(d) as f64;
                    assert!(
                        (share - fill).abs() < 0.05,
                        "{} {cleaning:?} {members:?}: member {d} holds {n} of {} lines \
                         ({share:.3}), the pool {fill:.3} ({u:?})",
                        p.name,
                        pool.lines(d)
                    );
                }
            }
        }
    }
}

#[test]
fn a_failed_member_loses_its_lines_and_is_never_used_until_revived() {
    let members = [640u64, 512, 384];
    for p in REGISTRY {
        for cleaning in cleanings() {
            let mut e = engine(p.name, cleaning, &members, Mode::WriteBack);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            // Over twice the capacity: the cache is full and evicting.
            let span = e.capacity_lines() * 2;
            for _ in 0..5_000 {
                step(&mut e, &request(&mut rng, span, true));
            }
            let d = 1;
            let range = e.pool().range(d);
            let on_d: Vec<(u64, u32, bool)> = e
                .entries()
                .filter(|&(_, s, _)| range.contains(&u64::from(s)))
                .collect();
            assert!(!on_d.is_empty(), "{}: nothing on member {d}", p.name);
            let mut want: Vec<(u32, u64)> = on_d
                .iter()
                .filter(|x| x.2)
                .map(|&(k, s, _)| (s, k))
                .collect();
            let clean = on_d.iter().filter(|x| !x.2).count() as u64;
            let (len, dirty) = (e.len(), e.dirty_lines());
            let loss = e.fail_device(d).unwrap();
            let mut got = loss.uncovered.clone();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(
                got, want,
                "{}: uncovered = the dirty lines of member {d}",
                p.name
            );
            assert_eq!(loss.dropped_clean, clean, "{}: clean lines dropped", p.name);
            assert_eq!(e.len(), len - on_d.len() as u64);
            assert_eq!(e.dirty_lines(), dirty - want.len() as u64);
            for &(k, _, _) in &on_d {
                assert_eq!(e.lookup(k), None, "{}: key {k:#x} still cached", p.name);
            }
            assert_eq!(e.dead_slots(), e.pool().lines(d));
            assert!(e.device_failed(d));
            e.check_slots();
            assert!(e.fail_device(d).is_err(), "failed twice");
            for i in 0..10_000 {
                let r = request(&mut rng, span, true);
                let steps = e.process(&r).unwrap().steps.clone();
                for s in &steps {
                    if let Step::WriteSsd { ssd, len, .. } | Step::ReadSsd { ssd, len, .. } = *s {
                        let (a, b) = (ssd / LINE, (ssd + len).div_ceil(LINE));
                        assert!(
                            b <= range.start || a >= range.end,
                            "{}: SSD step on failed member {d}: {s:?}",
                            p.name
                        );
                    }
                }
                if e.needs_cleaning() {
                    let n = e.cleaning_target();
                    e.clean(n);
                }
                assert!(
                    e.entries().all(|(_, s, _)| e.member_of(s) != d),
                    "{}: a line placed on failed member {d}",
                    p.name
                );
                if i % 2500 == 0 {
                    e.check_slots();
                }
            }
            // The survivors are full: the pool is smaller by the member.
            assert!(e.len() <= e.capacity_lines() - e.pool().lines(d));
            e.revive_device(d).unwrap();
            assert_eq!(e.dead_slots(), 0);
            e.check_slots();
            for _ in 0..5_000 {
                step(&mut e, &request(&mut rng, span, true));
            }
            e.check_slots();
            let back = used(&e)[d];
            assert!(back > 0, "{}: the revived member is not used again", p.name);
        }
    }
}

#[test]
fn failing_is_refused_for_one_device_the_last_live_member_and_pinned_slots() {
    let mut one = engine("lru", CleaningPolicy::Lba, &[256], Mode::WriteBack);
    assert!(one.fail_device(0).is_err());
    let mut e = engine("lru", CleaningPolicy::Lba, &[256, 256], Mode::WriteBack);
    assert!(e.fail_device(2).is_err());
    assert!(e.revive_device(0).is_err(), "revive of a live member");
    // Dirty lines on both members, one write-back in flight over all of them.
    for l in 0..64 {
        e.process(&Request::write(l * LINE, LINE)).unwrap();
    }
    assert!(e.entries().any(|(_, s, _)| e.member_of(s) == 1));
    let t = e.begin_clean(64).expect("dirty lines to clean").ticket;
    let err = e.fail_device(1).unwrap_err().to_string();
    assert!(err.contains("write-back in flight"), "{err}");
    assert_eq!(e.dead_slots(), 0, "a refused failure changes nothing");
    e.complete_writeback(t, &[]);
    e.fail_device(1).unwrap();
    let err = e.fail_device(0).unwrap_err().to_string();
    assert!(err.contains("last live member"), "{err}");
    e.check_slots();
}

#[test]
fn a_multi_line_miss_is_one_ssd_write_per_member_stripe() {
    let mut e = engine("lru", CleaningPolicy::Lba, &[256, 256], Mode::WriteThrough);
    let n = 4 * u64::from(STRIPE_LINES);
    let plan: Plan = e.process(&Request::write(0, n * LINE)).unwrap().clone();
    let writes: Vec<(u64, u64)> = plan
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::WriteSsd { ssd, len, .. } => Some((ssd / LINE, len / LINE)),
            _ => None,
        })
        .collect();
    // Stripes alternate between the members: 4 stripes, each one write of 8 lines.
    assert_eq!(writes.len(), 4, "{writes:?}");
    let mut members = Vec::new();
    for &(slot, lines) in &writes {
        assert_eq!(lines, u64::from(STRIPE_LINES), "{writes:?}");
        let (d, local) = e.pool().locate(slot);
        assert_eq!(local % u64::from(STRIPE_LINES), 0);
        members.push(d);
    }
    assert_eq!(members, vec![0, 1, 0, 1]);
}

#[test]
fn one_member_places_lines_as_before() {
    // `pool_lines` of one device = no pool: slots in order from 0, nothing rounded.
    let mut a = engine("lru", CleaningPolicy::Lba, &[300], Mode::WriteBack);
    let mut b = Engine::new(EngineConfig {
        capacity_lines: 300,
        mode: Mode::WriteBack,
        ..EngineConfig::default()
    })
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..3000 {
        let r = request(&mut rng, 500, true);
        let sa = a.process(&r).unwrap().steps.clone();
        assert_eq!(sa, b.process(&r).unwrap().steps);
    }
    assert_eq!(
        a.entries().collect::<Vec<_>>(),
        b.entries().collect::<Vec<_>>()
    );
}

#[test]
fn a_capacity_that_is_not_the_pools_is_refused() {
    let err = Engine::new(EngineConfig {
        capacity_lines: 1000,
        pool_lines: vec![1000, 300],
        ..EngineConfig::default()
    })
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("1152"), "{err}");
    assert!(Engine::new(EngineConfig {
        capacity_lines: 200,
        pool_lines: vec![100, 100],
        ..EngineConfig::default()
    })
    .is_err());
}

#[test]
fn a_restart_restores_into_member_slots_and_keeps_the_free_lists_consistent() {
    let members = [256u64, 384];
    let mut e = engine("lru", CleaningPolicy::Lba, &members, Mode::WriteBack);
    // Scattered slots on both members, restored one at a time and in bulk.
    for (i, slot) in [3u32, 300, 17, 600, 255, 256].into_iter().enumerate() {
        e.restore_line((i as u64 + 1) * 7, slot, 0xff, 0, 0)
            .unwrap();
    }
    e.check_slots();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for i in 0..4000 {
        step(&mut e, &request(&mut rng, 1200, true));
        if i % 500 == 0 {
            e.check_slots();
        }
    }
    e.check_slots();
    // A restore into a failed member's slot is refused.
    let mut e = engine("lru", CleaningPolicy::Lba, &members, Mode::WriteBack);
    e.fail_device(0).unwrap();
    assert!(e.restore_line(7, 5, 0xff, 0, 0).is_err());
    e.restore_line(7, 300, 0xff, 0, 0).unwrap();
    e.check_slots();
}

// ---- Mirrored dirty copies (`dirty_copies` 2, plan-multi-cache.md (c), step 4) ----

/// Model unit: requests are 256 B aligned, so partly written sectors (512 B) occur.
const U: u64 = 256;
const SECTORS_PER_LINE: u64 = 8;

fn mirrored(policy: &str, cleaning: CleaningPolicy, members: &[u64], validity: Validity) -> Engine {
    engine_with(policy, cleaning, members, |c| {
        c.mode = Mode::WriteBack;
        c.validity = validity;
        c.dirty_copies = 2;
    })
}

/// Contents as version numbers per 256 B: the cache's slots, the backing device and what
/// the client wrote last (`truth`). Plans run in order; reads are checked against `truth`.
struct Model {
    ssd: Vec<u64>,
    hdd: HashMap<u64, u64>,
    truth: HashMap<u64, u64>,
    ver: u64,
}

impl Model {
    fn new(cap: u64) -> Model {
        Model {
            ssd: vec![0; (cap * LINE / U) as usize],
            hdd: HashMap::new(),
            truth: HashMap::new(),
            ver: 0,
        }
    }

    fn run(&mut self, r: Option<&Request>, plan: &Plan) {
        let mut buf = vec![0u64; (plan.buf_len / U) as usize];
        if let Some(r) = r.filter(|r| r.op == Op::Write) {
            for off in (r.offset..r.end()).step_by(U as usize) {
                self.ver += 1;
                buf[((off - plan.buf_start) / U) as usize] = self.ver;
                self.truth.insert(off / U, self.ver);
            }
        }
        for s in &plan.steps {
            let n = |len: u64| 0..len / U;
            match *s {
                Step::ReadSsd { ssd, buf: b, len } => {
                    for i in n(len) {
                        buf[(b / U + i) as usize] = self.ssd[(ssd / U + i) as usize];
                    }
                }
                Step::ReadHdd {
                    hdd, buf: b, len, ..
                } => {
                    for i in n(len) {
                        buf[(b / U + i) as usize] = *self.hdd.get(&(hdd / U + i)).unwrap_or(&0);
                    }
                }
                Step::WriteSsd { ssd, buf: b, len } => {
                    for i in n(len) {
                        self.ssd[(ssd / U + i) as usize] = buf[(b / U + i) as usize];
                    }
                }
                Step::WriteHdd {
                    hdd, buf: b, len, ..
                } => {
                    for i in n(len) {
                        self.hdd.insert(hdd / U + i, buf[(b / U + i) as usize]);
                    }
                }
                Step::Populate { hdd, ssd, len, .. } => {
                    for i in n(len) {
                        self.ssd[(ssd / U + i) as usize] =
                            *self.hdd.get(&(hdd / U + i)).unwrap_or(&0);
                    }
                }
                Step::WriteBack { ssd, hdd, len, .. } => {
                    for i in n(len) {
                        self.hdd
                            .insert(hdd / U + i, self.ssd[(ssd / U + i) as usize]);
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = r.filter(|r| r.op == Op::Read) {
            for off in (r.offset..r.end()).step_by(U as usize) {
                assert_eq!(
                    buf[((off - plan.buf_start) / U) as usize],
                    *self.truth.get(&(off / U)).unwrap_or(&0),
                    "read at {off} returns what was written last"
                );
            }
        }
    }

    /// Every mirrored dirty line: its copy holds the same bytes in its dirty sectors.
    fn check_copies(&self, e: &Engine) {
        let per = LINE / U;
        for (_, slot, dirty) in e.entries() {
            if !dirty {
                assert_eq!(e.copy_of(slot), None, "clean line {slot} has a copy");
                continue;
            }
            let c = e.copy_of(slot).expect("every dirty line is mirrored");
            assert_ne!(e.member_of(slot), e.member_of(c), "copy on another member");
            let m = e.dirty_mask(slot);
            for sec in 0..SECTORS_PER_LINE {
                if m >> sec & 1 == 0 {
                    continue;
                }
                for u in 0..(LINE / SECTORS_PER_LINE / U) {
                    let i = sec * (LINE / SECTORS_PER_LINE / U) + u;
                    assert_eq!(
                        self.ssd[(u64::from(slot) * per + i) as usize],
                        self.ssd[(u64::from(c) * per + i) as usize],
                        "copy {c} of line {slot} differs in dirty sector {sec}"
                    );
                }
            }
        }
    }

    /// Reads every line of `span` through the engine and checks what comes back.
    fn read_all(&mut self, e: &mut Engine, span: u64) {
        for l in 0..span {
            let r = Request::new(0, Op::Read, l * LINE, LINE);
            let plan = e.process(&r).unwrap().clone();
            self.run(Some(&r), &plan);
        }
    }
}

/// A random read or write of 256 B units within one or two lines (no trims: the model
/// does not define what a trimmed range reads).
fn small_request(rng: &mut ChaCha8Rng, span: u64) -> Request {
    let start = rng.gen_range(0..span * LINE / U) * U;
    let len = if rng.gen_bool(0.5) {
        LINE.min(span * LINE - start)
    } else {
        (rng.gen_range(1..=LINE / U) * U).min(span * LINE - start)
    };
    let op = if rng.gen_bool(0.55) {
        Op::Write
    } else {
        Op::Read
    };
    Request::new(0, op, start, len)
}

fn run_mirrored(e: &mut Engine, m: &mut Model, rng: &mut ChaCha8Rng, span: u64, n: usize) {
    for i in 0..n {
        let r = small_request(rng, span);
        let plan = e.process(&r).unwrap().clone();
        m.run(Some(&r), &plan);
        if e.needs_cleaning() {
            let k = e.cleaning_target();
            let plan = e.clean(k).clone();
            m.run(None, &plan);
        }
        m.check_copies(e);
        if i % 64 == 0 {
            e.check_slots();
        }
        assert_eq!(e.unmirrored_lines(), 0);
        assert_eq!(
            e.copy_slot_count(),
            e.dirty_lines(),
            "one copy per dirty line"
        );
    }
    e.check_slots();
}

#[test]
fn dirty_lines_have_a_copy_on_another_member_that_survives_its_loss() {
    for p in REGISTRY {
        for cleaning in cleanings() {
            for validity in [Validity::Line, Validity::Sector] {
                let what = format!("{} {cleaning:?} {validity:?}", p.name);
                let mut e = mirrored(p.name, cleaning, &[256, 256], validity);
                let mut m = Model::new(512);
                let mut rng = ChaCha8Rng::seed_from_u64(22);
                let span = 1200;
                run_mirrored(&mut e, &mut m, &mut rng, span, 1500);
                assert!(e.dirty_lines() > 0, "{what}: some lines are dirty");
                let on0: u64 = e
                    .entries()
                    .filter(|&(_, s, d)| d && e.member_of(s) == 0)
                    .count() as u64;
                let loss = e.fail_device(0).unwrap();
                assert!(
                    loss.uncovered.is_empty(),
                    "{what}: every dirty line had a copy"
                );
                assert_eq!(
                    loss.promoted, on0,
                    "{what}: member 0's dirty lines promoted"
                );
                assert_eq!(e.unmirrored_lines(), e.dirty_lines(), "{what}");
                assert_eq!(loss.unmirrored.len() as u64, e.dirty_lines(), "{what}");
                assert_eq!(e.copy_slot_count(), 0, "{what}: no copy is left");
                e.check_slots();
                m.read_all(&mut e, span);
                e.check_slots();
            }
        }
    }
}

#[test]
fn write_back_in_flight_carries_the_copy_and_frees_it_or_restores_it() {
    for validity in [Validity::Line, Validity::Sector] {
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], validity);
        for l in 0..10 {
            e.process(&Request::new(0, Op::Write, l * LINE, LINE))
                .unwrap();
        }
        let copies: HashMap<u32, u32> = e
            .entries()
            .map(|(_, s, _)| (s, e.copy_of(s).unwrap()))
            .collect();
        assert_eq!(e.copy_slot_count(), 10);
        let b = e.begin_clean(10).unwrap();
        let (t, lines) = (b.ticket, b.lines.to_vec());
        assert_eq!(lines.len(), 10);
        for l in &lines {
            assert_eq!(
                l.copy,
                Some(copies[&l.slot]),
                "the ticket names the line's copy"
            );
        }
        // Clean now: no line has a copy, but the copies are held until completion.
        assert_eq!(e.dirty_lines(), 0);
        assert!(lines.iter().all(|l| e.copy_of(l.slot).is_none()));
        assert_eq!(e.copy_slot_count(), 10);
        e.check_slots();
        // One line fails: dirty again, with its held copy back.
        let failed = lines[3].slot;
        let done = e.complete_writeback(t, &[failed]);
        assert_eq!((done.cleaned, done.failed), (9, 1));
        assert_eq!(e.copy_of(failed), Some(copies[&failed]));
        assert_eq!(e.copy_slot_count(), 1, "the cleaned lines' copies are free");
        e.check_slots();
        // Written while in flight: the new write gets a new copy, the failed pending
        // sectors are then in the line only (unmirrored).
        let b = e.begin_clean(1).unwrap();
        let t = b.ticket;
        let key_line = e.entries().find(|&(_, s, _)| s == failed).unwrap().0 & 0xffff_ffff;
        e.process(&Request::new(0, Op::Write, key_line * LINE, 512))
            .unwrap();
        e.complete_writeback(t, &[failed]);
        assert!(e.is_dirty(failed));
        e.check_slots();
        if validity == Validity::Sector {
            assert_eq!(
                e.copy_of(failed),
                None,
                "new and old copy each lack sectors"
            );
            assert_eq!(e.unmirrored_lines(), 1);
        }
        e.clean(100);
        assert_eq!((e.copy_slot_count(), e.dirty_lines()), (0, 0));
        e.check_slots();
    }
}

#[test]
fn trim_eviction_and_drop_free_the_copy() {
    for validity in [Validity::Line, Validity::Sector] {
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], validity);
        e.process(&Request::new(0, Op::Write, 0, 2 * LINE)).unwrap();
        assert_eq!(e.copy_slot_count(), 2);
        e.process(&Request::new(0, Op::Trim, 0, LINE)).unwrap();
        assert_eq!(e.copy_slot_count(), 1, "trim frees the copy");
        e.check_slots();
        let s = e.lookup(Engine::line_key(0, 1)).unwrap();
        e.drop_line(s);
        assert_eq!(e.copy_slot_count(), 0, "drop_line frees the copy");
        e.check_slots();
        // Far more dirty lines than fit: dirty evictions, each freeing its copy.
        for l in 0..1000 {
            e.process(&Request::new(0, Op::Write, l * LINE, LINE))
                .unwrap();
            assert_eq!(e.copy_slot_count(), e.dirty_lines());
            assert_eq!(e.unmirrored_lines(), 0);
        }
        assert!(e.counters().dirty_evictions > 0);
        e.check_slots();
        assert!(e.len() <= 128, "lines and copies share the slots");
    }
}

#[test]
fn no_copy_slot_writes_through_and_keeps_the_line_clean() {
    for validity in [Validity::Line, Validity::Sector] {
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], validity);
        for l in 0..128 {
            e.process(&Request::new(0, Op::Write, l * LINE, LINE))
                .unwrap();
        }
        assert_eq!(
            (e.len(), e.copy_slot_count()),
            (128, 128),
            "full of dirty lines"
        );
        // Every line is being written back: pinned, clean, its copy held.
        let b = e.begin_clean(128).unwrap();
        let t = b.ticket;
        let r = Request::new(0, Op::Write, 5 * LINE, LINE);
        let plan = e.process(&r).unwrap().clone();
        assert_eq!(e.counters().bypasses.no_copy, 1);
        assert!(
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::WriteHdd { .. })),
            "written through: {:?}",
            plan.steps
        );
        let s = e.lookup(Engine::line_key(0, 5)).unwrap();
        assert!(!e.is_dirty(s), "kept clean");
        e.check_slots();
        e.complete_writeback(t, &[]);
        assert_eq!(e.copy_slot_count(), 0);
        e.check_slots();
    }
}

#[test]
fn a_mirrored_write_hit_writes_both_copies() {
    let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], Validity::Sector);
    e.process(&Request::new(0, Op::Write, 0, LINE)).unwrap();
    let s = e.lookup(Engine::line_key(0, 0)).unwrap();
    let c = e.copy_of(s).unwrap();
    let plan = e
        .process(&Request::new(0, Op::Write, 1024, 512))
        .unwrap()
        .clone();
    let ssd_writes: Vec<u64> = plan
        .steps
        .iter()
        .filter_map(|st| match *st {
            Step::WriteSsd { ssd, .. } => Some(ssd),
            _ => None,
        })
        .collect();
    let (ps, cs) = (u64::from(s) * LINE + 1024, u64::from(c) * LINE + 1024);
    assert_eq!(
        ssd_writes,
        vec![ps, cs],
        "primary then copy, the request's sectors only"
    );
}

#[test]
fn remirror_gives_single_copy_lines_a_copy_again() {
    for validity in [Validity::Line, Validity::Sector] {
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128, 128], validity);
        let mut m = Model::new(384);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        run_mirrored(&mut e, &mut m, &mut rng, 300, 600);
        let dirty = e.dirty_lines();
        assert!(dirty > 0);
        let loss = e.fail_device(1).unwrap();
        assert!(loss.uncovered.is_empty());
        assert_eq!(loss.unmirrored.len() as u64, e.unmirrored_lines());
        assert!(e.unmirrored_lines() > 0);
        for &s in &loss.unmirrored {
            assert!(e.is_dirty(s) && e.copy_of(s).is_none());
        }
        e.check_slots();
        // Rounds: a round takes free slots of other members, then clean lines among the
        // next victims.
        let (mut rounds, mut remirrored) = (0, 0);
        while e.unmirrored_lines() > 0 {
            rounds += 1;
            assert!(rounds < 50, "re-mirroring makes progress");
            let Some((pairs, plan)) = e
                .begin_remirror(1000)
                .map(|r| (r.pairs.to_vec(), r.plan.clone()))
            else {
                // No copy slot among free slots and clean next victims: the executor
                // cleans the rest instead.
                let rest = e.unmirrored_slots(1000);
                assert_eq!(rest.len() as u64, e.unmirrored_lines());
                let plan = e.write_back_slots(&rest).clone();
                m.run(None, &plan);
                continue;
            };
            assert!(pairs.len() as u64 <= e.unmirrored_lines());
            for &(s, c) in &pairs {
                assert_ne!(e.member_of(s), e.member_of(c));
                assert_ne!(e.member_of(c), 1, "not on the failed member");
            }
            e.check_slots();
            m.run(None, &plan);
            assert_eq!(e.complete_remirror(&pairs, &[]), pairs.len() as u64);
            remirrored += pairs.len();
        }
        assert!(remirrored > 0, "some lines got a copy again");
        m.check_copies(&e);
        e.check_slots();
        // The copies are real: lose another member and read everything back.
        let loss = e.fail_device(0).unwrap();
        assert!(loss.uncovered.is_empty());
        m.read_all(&mut e, 300);
        e.check_slots();
        // One live member left: nothing to re-mirror onto.
        assert!(e.begin_remirror(1000).is_none());
    }
}

#[test]
fn a_line_written_during_its_remirror_does_not_take_the_stale_copy() {
    let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128, 128], Validity::Line);
    e.process(&Request::new(0, Op::Write, 0, LINE)).unwrap();
    let s = e.lookup(Engine::line_key(0, 0)).unwrap();
    e.unmirror(s).unwrap();
    assert_eq!(e.unmirrored_lines(), 1);
    e.check_slots();
    let pairs = e.begin_remirror(10).unwrap().pairs.to_vec();
    assert_eq!(pairs.len(), 1);
    e.process(&Request::new(0, Op::Write, 0, 512)).unwrap();
    assert_eq!(e.complete_remirror(&pairs, &[]), 0);
    assert_eq!(e.copy_of(s), None);
    assert_eq!(e.copy_slot_count(), 0);
    e.check_slots();
}

#[test]
fn restore_copy_installs_a_copy_at_open_and_refuses_bad_ones() {
    let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], Validity::Sector);
    let key = Engine::line_key(0, 9);
    e.restore_line(key, 3, 0xff, 0x0f, 0).unwrap();
    assert_eq!(e.unmirrored_lines(), 1);
    assert!(e.restore_copy(key, 3, 130, 0xff).is_err(), "mask differs");
    assert!(e.restore_copy(key, 3, 5, 0x0f).is_err(), "same member");
    assert!(e.restore_copy(key + 1, 3, 130, 0x0f).is_err(), "other key");
    e.restore_copy(key, 3, 130, 0x0f).unwrap();
    assert!(e.restore_copy(key, 3, 131, 0x0f).is_err(), "has a copy");
    assert_eq!((e.copy_of(3), e.owner_of(130)), (Some(130), Some(3)));
    assert_eq!(e.unmirrored_lines(), 0);
    e.check_slots();
    // The copy slot is not handed out again.
    for l in 100..300 {
        e.process(&Request::new(0, Op::Read, l * LINE, LINE))
            .unwrap();
        assert_ne!(e.lookup(Engine::line_key(0, l)), Some(130));
    }
    e.check_slots();
}

#[test]
fn dirty_copies_two_needs_a_pool_and_is_fixed_while_running() {
    let bad = |copies: u8, pool: Vec<u64>| {
        let cap = if pool.is_empty() {
            256
        } else {
            Pool::new(&pool).unwrap().capacity()
        };
        Engine::new(EngineConfig {
            capacity_lines: cap,
            pool_lines: pool,
            dirty_copies: copies,
            ..EngineConfig::default()
        })
        .err()
        .map(|e| e.to_string())
    };
    assert!(bad(2, vec![])
        .unwrap()
        .contains("two or more cache devices"));
    assert!(bad(2, vec![256])
        .unwrap()
        .contains("two or more cache devices"));
    assert!(bad(3, vec![128, 128]).unwrap().contains("must be 1 or 2"));
    assert!(bad(0, vec![128, 128]).is_some());
    assert!(bad(2, vec![128, 128]).is_none());
    let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], Validity::Line);
    assert!(e.retune(|c| c.dirty_copies = 1).is_err());
}

#[test]
fn one_copy_keeps_dirty_lines_single() {
    let mut e = engine("lru", CleaningPolicy::Lba, &[128, 128], Mode::WriteBack);
    for l in 0..50 {
        e.process(&Request::new(0, Op::Write, l * LINE, LINE))
            .unwrap();
    }
    assert_eq!((e.copy_slot_count(), e.unmirrored_lines()), (0, 0));
    assert!(e.dirty_lines() > 0);
    e.check_slots();
}

#[test]
fn writes_in_other_modes_keep_a_dirty_lines_copy_current() {
    for validity in [Validity::Line, Validity::Sector] {
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[128, 128], validity);
        let mut m = Model::new(256);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        run_mirrored(&mut e, &mut m, &mut rng, 100, 200);
        assert!(e.dirty_lines() > 0);
        for mode in [Mode::WriteThrough, Mode::ReadOnly] {
            e.set_mode(mode);
            for _ in 0..200 {
                let r = small_request(&mut rng, 100);
                let plan = e.process(&r).unwrap().clone();
                m.run(Some(&r), &plan);
                m.check_copies(&e);
            }
            e.check_slots();
        }
        let loss = e.fail_device(1).unwrap();
        assert!(loss.uncovered.is_empty());
        m.read_all(&mut e, 100);
    }
}

/// A read of a mirrored dirty line that failed on its member (the member not failed yet):
/// `promote_copy_of` makes the copy the line (on the other member, valid = dirty sectors),
/// frees the old slot, and every read returns what was written last; a line without a copy,
/// or pinned, is left alone.
#[test]
fn promote_copy_of_serves_the_line_from_its_copy() {
    for validity in [Validity::Line, Validity::Sector] {
        let what = format!("{validity:?}");
        let mut e = mirrored("lru", CleaningPolicy::Lba, &[256, 256], validity);
        let mut m = Model::new(512);
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        let span = 1200;
        run_mirrored(&mut e, &mut m, &mut rng, span, 1500);
        let on0: Vec<u32> = e
            .entries()
            .filter(|&(_, s, d)| d && e.member_of(s) == 0)
            .map(|(_, s, _)| s)
            .collect();
        assert!(!on0.is_empty(), "{what}: dirty lines on member 0");
        let dirty = e.dirty_lines();
        for &s in &on0 {
            let (key, mask, c) = (e.slot_key(s), e.dirty_mask(s), e.copy_of(s).unwrap());
            assert_eq!(e.promote_copy_of(s), Some(c), "{what}");
            assert_eq!(e.slot_key(c), key, "{what}: the copy is the line");
            assert_eq!(e.dirty_mask(c), mask, "{what}");
            assert_eq!(e.slot_key(s), None, "{what}: the old slot is free");
            assert_eq!(e.copy_of(c), None, "{what}: one copy left");
            assert_eq!(e.promote_copy_of(c), None, "{what}: no copy to promote");
        }
        assert_eq!(e.dirty_lines(), dirty, "{what}: no dirty line lost");
        assert_eq!(e.unmirrored_lines(), on0.len() as u64, "{what}");
        e.check_slots();
        m.read_all(&mut e, span);
        e.check_slots();
    }
}
