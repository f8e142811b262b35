//! Every run-time call an engine takes from the live volume (retune, mode, class table,
//! blocked dirty evictions and read admission, chunk rewrite, write-back tickets in flight,
//! eviction candidates, reclassify, drop, counter reset, warm restore), on a sharded engine:
//! with one shard the transcript of a whole scenario is the engine's, call by call; with two,
//! every shard obeys every setting, slots and tickets are global, and a restore refuses a
//! line in a shard that does not own it. Also the automatic layout (granule and shard
//! count from the capacity).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tiercache_engine::engine::{RestoreLine, WbDone, WbLine};
use tiercache_engine::sharded::{ShardLayout, ShardedTicket};
use tiercache_engine::{
    Admission, ClassTable, CleaningPolicy, Engine, EngineConfig, Mode, Op, Plan, Request,
    SeqCutoff, Sharded, Step, VolumeConfig,
};

const LINE: u64 = 4096;
const MIB: u64 = 1 << 20;

const NEVER_2: &str = "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\n[[class]]\nid = 2\nname = \"b\"\npriority = 5\nallocation = \"never\"\n";

fn table() -> Option<Arc<ClassTable>> {
    Some(Arc::new(ClassTable::parse(NEVER_2, "t.toml").unwrap()))
}

/// Reads and writes (partial, whole and multi-line), trims and flushes over 6 MiB of two
/// volumes, three classes.
fn stream(rng: &mut ChaCha8Rng, n: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let line = rng.gen_range(0..1536u64);
            let (offset, len) = match rng.gen_range(0..8) {
                0 => (
                    line * LINE + 512 * rng.gen_range(0..7u64),
                    512 * rng.gen_range(1..3u64),
                ),
                1 => (line * LINE, LINE * rng.gen_range(2..24u64)),
                _ => (line * LINE, LINE),
            };
            let op = match rng.gen_range(0..40) {
                0 => Op::Trim,
                1 => Op::Flush,
                x if x < 18 => Op::Write,
                _ => Op::Read,
            };
            let mut r = Request::new(i as u64, op, offset, len);
            r.fua = op == Op::Write && rng.gen_range(0..8) == 0;
            r.class = rng.gen_range(0..3);
            r.volume = rng.gen_range(0..2);
            r
        })
        .collect()
}

/// A write-back begun: ticket, plan steps, lines, spans.
type Batch<T> = (T, Vec<Step>, Vec<WbLine>, Vec<(u32, u64, u64)>);

/// The calls of the scenario, on an engine or a sharded one (results owned, errors as text).
trait Eng {
    type Tk;
    fn process(&mut self, r: &Request) -> Result<Plan, String>;
    fn needs_cleaning(&mut self) -> bool;
    fn cleaning_target(&mut self) -> u64;
    fn clean(&mut self, max: u64) -> Vec<Step>;
    fn retune(&mut self, f: &dyn Fn(&mut EngineConfig)) -> Result<(), String>;
    fn set_mode(&mut self, m: Mode);
    fn set_class_table(&mut self, t: Option<Arc<ClassTable>>) -> Result<(), String>;
    fn set_chunk_rewrite(&mut self, c: u64, runs: u64) -> Result<(), String>;
    fn block(&mut self, dirty_evictions: bool, read_admission: bool);
    fn begin_clean(&mut self, max: u64) -> Option<Batch<Self::Tk>>;
    fn begin_slots(&mut self, slots: &[u32]) -> Option<Batch<Self::Tk>>;
    fn complete(&mut self, t: Self::Tk, failed: &[u32]) -> WbDone;
    fn candidates(&self, n: u64) -> Vec<u32>;
    fn reclassify(&mut self, key: u64, class: u8) -> bool;
    fn drop_line(&mut self, slot: u32) -> Option<u64>;
    fn reset_counters(&mut self);
    fn restore_line(&mut self, l: RestoreLine) -> Result<(), String>;
    fn restore_bulk(&mut self, l: &[RestoreLine]) -> Vec<(usize, String)>;
    fn restore_sorted(&mut self, l: Vec<RestoreLine>, age: &[u32]) -> Vec<(u32, String)>;
    /// Everything observable: counters, lines with masks, classes and pending sectors,
    /// settings, volume figures, in-flight counts.
    fn state(&mut self) -> String;
    fn lines(&self) -> Vec<RestoreLine>;
}

macro_rules! common_impl {
    ($t:ty, $tk:ty, $begin:expr) => {
        impl Eng for $t {
            type Tk = $tk;
            fn process(&mut self, r: &Request) -> Result<Plan, String> {
                <$t>::process(self, r).cloned().map_err(|e| e.to_string())
            }
            fn needs_cleaning(&mut self) -> bool {
                <$t>::needs_cleaning(self)
            }
            fn cleaning_target(&mut self) -> u64 {
                <$t>::cleaning_target(self)
            }
            fn clean(&mut self, max: u64) -> Vec<Step> {
                <$t>::clean(self, max).steps.clone()
            }
            fn retune(&mut self, f: &dyn Fn(&mut EngineConfig)) -> Result<(), String> {
                <$t>::retune(self, f).map_err(|e| e.to_string())
            }
            fn set_mode(&mut self, m: Mode) {
                <$t>::set_mode(self, m)
            }
            fn set_class_table(&mut self, t: Option<Arc<ClassTable>>) -> Result<(), String> {
                <$t>::set_class_table(self, t).map_err(|e| e.to_string())
            }
            fn set_chunk_rewrite(&mut self, c: u64, runs: u64) -> Result<(), String> {
                <$t>::set_chunk_rewrite(self, c, runs).map_err(|e| e.to_string())
            }
            fn block(&mut self, d: bool, r: bool) {
                self.set_dirty_evictions_blocked(d);
                self.set_read_admission_blocked(r);
            }
            fn begin_clean(&mut self, max: u64) -> Option<Batch<Self::Tk>> {
                let b = <$t>::begin_clean(self, max)?;
                Some($begin(b))
            }
            fn begin_slots(&mut self, slots: &[u32]) -> Option<Batch<Self::Tk>> {
                let b = <$t>::begin_write_back_slots(self, slots)?;
                Some($begin(b))
            }
            fn complete(&mut self, t: Self::Tk, failed: &[u32]) -> WbDone {
                <$t>::complete_writeback(self, t, failed)
            }
            fn candidates(&self, n: u64) -> Vec<u32> {
                let mut v = Vec::new();
                self.eviction_candidates(n, &mut v);
                v
            }
            fn reclassify(&mut self, key: u64, class: u8) -> bool {
                <$t>::reclassify(self, key, class)
            }
            fn drop_line(&mut self, slot: u32) -> Option<u64> {
                <$t>::drop_line(self, slot)
            }
            fn reset_counters(&mut self) {
                <$t>::reset_counters(self)
            }
            fn restore_line(&mut self, l: RestoreLine) -> Result<(), String> {
                <$t>::restore_line(self, l.key, l.slot, l.valid, l.dirty, l.class)
                    .map_err(|e| e.to_string())
            }
            fn restore_bulk(&mut self, l: &[RestoreLine]) -> Vec<(usize, String)> {
                <$t>::restore_bulk(self, l)
                    .into_iter()
                    .map(|(i, e)| (i, e.to_string()))
                    .collect()
            }
            fn restore_sorted(&mut self, l: Vec<RestoreLine>, age: &[u32]) -> Vec<(u32, String)> {
                <$t>::restore_sorted(self, l, age)
                    .into_iter()
                    .map(|(i, e)| (i, e.to_string()))
                    .collect()
            }
            fn state(&mut self) -> String {
                let (needs, target) = (<$t>::needs_cleaning(self), <$t>::cleaning_target(self));
                let classes: Vec<_> = (0..3).map(|k| self.class_counters(k).clone()).collect();
                format!(
                    "counters {:?}\nclasses {:?}\nlines {:?}\npending {:?}\nlen {} dirty {} \
                     needs {} target {} blocked {} {}\nconfig {:?}\nvolumes {:?}\ninflight {:?} \
                     {} {}\nindex {}",
                    self.counters(),
                    classes,
                    self.lines(),
                    self.entries()
                        .map(|(_, s, _)| self.pending_mask(s))
                        .collect::<Vec<_>>(),
                    self.len(),
                    self.dirty_lines(),
                    needs,
                    target,
                    self.dirty_evictions_blocked(),
                    self.read_admission_blocked(),
                    self.config(),
                    self.volume_stats(),
                    self.inflight_counters(),
                    self.writebacks_in_flight(),
                    self.zombie_slots(),
                    self.index_bytes(),
                )
            }
            fn lines(&self) -> Vec<RestoreLine> {
                self.entries()
                    .map(|(key, slot, _)| RestoreLine {
                        key,
                        slot,
                        valid: self.valid_mask(slot),
                        dirty: self.dirty_mask(slot),
                        class: self.line_class(slot),
                    })
                    .collect()
            }
        }
    };
}

common_impl!(
    Engine,
    tiercache_engine::engine::WbTicket,
    |b: tiercache_engine::engine::WbBatch<'_>| (
        b.ticket,
        b.plan.steps.clone(),
        b.lines.to_vec(),
        b.spans.to_vec()
    )
);
common_impl!(
    Sharded,
    ShardedTicket,
    |b: tiercache_engine::sharded::ShardedBatch| (b.ticket, b.plan.steps, b.lines, b.spans)
);

/// Runs `reqs` with cleaning after each (as a driver does), logging plans and cleanings.
fn run<E: Eng>(e: &mut E, reqs: &[Request], log: &mut Vec<String>) {
    for r in reqs {
        log.push(format!("{r:?} -> {:?}", e.process(r)));
        if e.needs_cleaning() {
            let t = e.cleaning_target();
            log.push(format!("clean {t}: {:?}", e.clean(t)));
        }
    }
    log.push(e.state());
}

/// The scenario: every run-time call between request runs; returns the transcript.
fn scenario<E: Eng>(e: &mut E, seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = Vec::new();
    let mut reqs = |n: usize| stream(&mut rng, n);
    run(e, &reqs(800), &mut log);
    log.push(format!(
        "retune {:?}",
        e.retune(&|c| {
            c.dirty_high = 0.2;
            c.dirty_low = 0.05;
            c.admission = Admission {
                read_threshold: 2,
                write_threshold: 1,
            };
            c.seq_cutoff = SeqCutoff {
                read_bytes: 64 * 1024,
                write_bytes: 0,
            };
            c.group_size = 16 * 1024;
        })
    ));
    log.push(format!("{:?}", e.retune(&|c| c.capacity_lines += 1)));
    log.push(format!("{:?}", e.retune(&|c| c.policy = "fifo".into())));
    log.push(format!("{:?}", e.retune(&|c| c.dirty_high = 2.0)));
    run(e, &reqs(400), &mut log);
    e.set_mode(Mode::WriteThrough);
    run(e, &reqs(300), &mut log);
    e.set_mode(Mode::WriteBack);
    // A write-back in flight while requests run; two of its lines fail.
    let b = e.begin_clean(40);
    log.push(format!(
        "begin {:?}",
        b.as_ref().map(|b| (&b.1, &b.2, &b.3))
    ));
    run(e, &reqs(200), &mut log);
    if let Some((t, _, lines, _)) = b {
        let failed: Vec<u32> = lines.iter().take(2).map(|l| l.slot).collect();
        log.push(format!("complete {:?}", e.complete(t, &failed)));
    }
    let cand = e.candidates(64);
    log.push(format!("candidates {cand:?}"));
    let b = e.begin_slots(&cand);
    log.push(format!(
        "slots {:?}",
        b.as_ref().map(|b| (&b.1, &b.2, &b.3))
    ));
    // Lines dropped while their write-back is in flight are freed at completion.
    let ls = e.lines();
    for l in ls.iter().step_by(7).take(20) {
        log.push(format!(
            "reclassify {:?}",
            e.reclassify(l.key, (l.class + 1) % 3)
        ));
    }
    run(e, &reqs(100), &mut log);
    if let Some((t, ..)) = b {
        log.push(format!("complete {:?}", e.complete(t, &[])));
    }
    let ls = e.lines();
    for l in ls.iter().step_by(11).take(10) {
        log.push(format!("drop {:?}", e.drop_line(l.slot)));
    }
    log.push(format!("classes {:?}", e.set_class_table(table())));
    run(e, &reqs(300), &mut log);
    e.block(true, false);
    run(e, &reqs(300), &mut log);
    e.block(false, true);
    run(e, &reqs(200), &mut log);
    e.block(false, false);
    log.push(format!("chunk {:?}", e.set_chunk_rewrite(64 * 1024, 2)));
    log.push(format!("chunk {:?}", e.set_chunk_rewrite(3000, 1)));
    run(e, &reqs(300), &mut log);
    let mut v = VolumeConfig::new(1, "one");
    v.mode = Some(Mode::WriteThrough);
    v.seq_cutoff = Some(SeqCutoff {
        read_bytes: 32 * 1024,
        write_bytes: 32 * 1024,
    });
    log.push(format!(
        "volumes {:?}",
        e.retune(&|c| c.volumes = vec![v.clone()])
    ));
    run(e, &reqs(300), &mut log);
    e.reset_counters();
    run(e, &reqs(200), &mut log);
    log
}

/// A warm restore of `from`'s lines (with a few bad ones) into `to`, then requests.
fn restore<E: Eng>(from: &E, to: &mut E, seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut lines = from.lines();
    // Age: a shuffled order (the restore threads the policy in it).
    let mut age: Vec<u32> = lines.iter().map(|l| l.slot).collect();
    for i in (1..age.len()).rev() {
        age.swap(i, rng.gen_range(0..=i));
    }
    lines[3].class = 99;
    lines[5].dirty = 0xffff_ffff_ffff;
    let mut log = vec![format!("restore {:?}", to.restore_sorted(lines, &age))];
    run(to, &stream(&mut rng, 500), &mut log);
    log
}

fn wb_config() -> EngineConfig {
    EngineConfig {
        capacity_lines: 600,
        mode: Mode::WriteBack,
        policy: "dss".into(),
        dirty_high: 0.3,
        dirty_low: 0.1,
        ..Default::default()
    }
}

#[test]
fn one_shard_takes_every_runtime_call_as_the_engine() {
    for (name, cfg) in [
        (
            "lru sector",
            EngineConfig {
                policy: "lru".into(),
                ..wb_config()
            },
        ),
        ("dss sector", wb_config()),
        (
            "lru acp",
            EngineConfig {
                policy: "lru".into(),
                cleaning: CleaningPolicy::Acp,
                ..wb_config()
            },
        ),
        (
            "slru alru line",
            EngineConfig {
                policy: "slru".into(),
                cleaning: CleaningPolicy::Alru,
                cleaning_age: 5000,
                validity: tiercache_engine::Validity::Line,
                ..wb_config()
            },
        ),
    ] {
        let mut one = Engine::new(cfg.clone()).unwrap();
        let mut sh = Sharded::new(cfg.clone()).unwrap();
        let a = scenario(&mut one, 5);
        let b = scenario(&mut sh, 5);
        let text = a.join("\n");
        for must in [
            "retune Ok(())",
            "capacity cannot change on a running engine",
            "begin Some",
            "failed: 2",
            "slots Some",
            "reclassify true",
            "drop Some",
            "chunk Ok(())",
            "chunk Err",
            "volumes Ok(())",
        ] {
            // (DSS cleans ahead of its victims: nothing stays dirty for a begin to find.)
            assert!(
                text.contains(must) || name.starts_with("dss"),
                "{name}: the scenario never saw {must:?}"
            );
        }
        assert_eq!(a.len(), b.len(), "{name}");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x, y, "{name}: transcripts differ at entry {i}");
        }
        let mut one2 = Engine::new(cfg.clone()).unwrap();
        let mut sh2 = Sharded::new(cfg.clone()).unwrap();
        let a = restore(&one, &mut one2, 6);
        let b = restore(&sh, &mut sh2, 6);
        assert!(a[0].contains("Err") || a[0].contains("class"), "{}", a[0]);
        assert_eq!(a, b, "{name}: restore");
        // One at a time, and in bulk.
        let mut one3 = Engine::new(cfg.clone()).unwrap();
        let mut sh3 = Sharded::new(cfg.clone()).unwrap();
        let mut lines = one.lines();
        lines[0].slot = 10_000;
        for l in &lines[..lines.len() / 2] {
            assert_eq!(
                Eng::restore_line(&mut one3, *l),
                Eng::restore_line(&mut sh3, *l),
                "{name}"
            );
        }
        assert_eq!(
            Eng::state(&mut one3),
            Eng::state(&mut sh3),
            "{name}: restored"
        );
        let mut one4 = Engine::new(cfg.clone()).unwrap();
        let mut sh4 = Sharded::new(cfg.clone()).unwrap();
        lines.swap(4, 9);
        lines[7].valid = 0;
        let errs = Eng::restore_bulk(&mut one4, &lines);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(errs, Eng::restore_bulk(&mut sh4, &lines), "{name}");
        assert_eq!(
            Eng::state(&mut one4),
            Eng::state(&mut sh4),
            "{name}: restored in bulk"
        );
    }
}

/// The per-shard view of a setting: everything but what differs by construction.
fn comparable(c: &EngineConfig) -> EngineConfig {
    EngineConfig {
        capacity_lines: 0,
        shards: 1,
        rewrite_chunk: 0,
        policy_params: tiercache_engine::policy::PolicyConfig {
            seed: 0,
            ..c.policy_params.clone()
        },
        ..c.clone()
    }
}

fn assert_shards_follow(sh: &Sharded, what: &str) {
    for i in 0..sh.shard_count() {
        let c = sh.shard(i).config();
        assert_eq!(
            format!("{:?}", comparable(c)),
            format!("{:?}", comparable(sh.config())),
            "{what}: shard {i}"
        );
        assert_eq!(
            c.rewrite_chunk,
            sh.config().rewrite_chunk.min(sh.granule_bytes()),
            "{what}: shard {i}'s chunk rewrite"
        );
        assert_eq!(
            (
                sh.shard(i).dirty_evictions_blocked(),
                sh.shard(i).read_admission_blocked()
            ),
            (sh.dirty_evictions_blocked(), sh.read_admission_blocked()),
            "{what}: shard {i}"
        );
    }
}

/// Whole-line requests on fresh lines of both shards (`per` lines each).
fn fresh(sh: &Sharded, op: Op, class: u8, from: u64, per: usize) -> Vec<Request> {
    let mut seen = [0usize; 2];
    let mut out = Vec::new();
    let mut line = from;
    while seen.iter().any(|&s| s < per) {
        let i = sh.shard_of(Engine::line_key(0, line));
        if seen[i] < per {
            seen[i] += 1;
            let mut r = Request::new(line, op, line * LINE, LINE);
            r.class = class;
            out.push(r);
        }
        line += 1;
    }
    out
}

fn insertions(sh: &Sharded) -> Vec<u64> {
    (0..2).map(|i| sh.shard(i).counters().insertions).collect()
}

#[test]
fn two_shards_obey_every_setting() {
    let mut sh = Sharded::new(EngineConfig {
        capacity_lines: 8192,
        shards: 2,
        policy: "lru".into(),
        ..wb_config()
    })
    .unwrap();
    assert_eq!(sh.shard_count(), 2);
    let g = sh.granule_bytes();
    assert_eq!(
        g,
        256 << 10,
        "8192 lines / 2 shards / 64 granules = 64 lines"
    );
    assert_shards_follow(&sh, "built");
    // Write-back in both shards, then write-through in both.
    for r in fresh(&sh, Op::Write, 0, 0, 200) {
        sh.process(&r).unwrap();
    }
    assert!((0..2).all(|i| sh.shard(i).dirty_lines() == 200));
    sh.set_mode(Mode::WriteThrough);
    assert_shards_follow(&sh, "write-through");
    for r in fresh(&sh, Op::Write, 0, 100_000, 50) {
        sh.process(&r).unwrap();
    }
    assert!((0..2).all(|i| sh.shard(i).dirty_lines() == 200));
    // Cleaning with a write-back in flight: lines of both shards, global slots.
    let b = sh.begin_clean(u64::MAX).unwrap();
    assert_eq!(b.ticket.parts().len(), 2);
    let cleaned: Vec<&WbLine> = b.lines.iter().filter(|l| l.pending != 0).collect();
    assert_eq!(cleaned.len(), 400);
    for l in &cleaned {
        assert_eq!(sh.slot_key(l.slot), Some(l.key));
        assert!(sh.is_pinned(l.slot) && sh.pending_mask(l.slot) != 0);
    }
    let failed = [cleaned[0].slot, cleaned[399].slot];
    let done = sh.complete_writeback(b.ticket, &failed);
    assert_eq!((done.cleaned, done.failed), (398, 2));
    assert_eq!(sh.dirty_lines(), 2);
    // Read admission: a threshold of 3 in both shards.
    sh.retune(|c| c.admission.read_threshold = 3).unwrap();
    assert_shards_follow(&sh, "admission");
    let before = insertions(&sh);
    for r in fresh(&sh, Op::Read, 0, 200_000, 100) {
        sh.process(&r).unwrap();
    }
    assert_eq!(
        insertions(&sh),
        before,
        "a read seen once is admitted nowhere"
    );
    sh.retune(|c| c.admission.read_threshold = 1).unwrap();
    sh.set_read_admission_blocked(true);
    assert_shards_follow(&sh, "read admission blocked");
    for r in fresh(&sh, Op::Read, 0, 300_000, 100) {
        sh.process(&r).unwrap();
    }
    assert_eq!(insertions(&sh), before, "blocked read admission in both");
    sh.set_read_admission_blocked(false);
    for r in fresh(&sh, Op::Read, 0, 400_000, 100) {
        sh.process(&r).unwrap();
    }
    assert!(insertions(&sh)
        .iter()
        .zip(&before)
        .all(|(a, b)| a - b == 100));
    // A class table whose class 2 never allocates: in both shards.
    sh.set_class_table(table()).unwrap();
    assert_shards_follow(&sh, "class table");
    let before = insertions(&sh);
    for r in fresh(&sh, Op::Write, 2, 500_000, 100) {
        sh.process(&r).unwrap();
    }
    assert_eq!(
        insertions(&sh),
        before,
        "class 2 never allocates, in either shard"
    );
    // Chunk rewrite: capped at the granule in each shard.
    sh.set_chunk_rewrite(4 * MIB, 1).unwrap();
    assert_eq!(sh.config().rewrite_chunk, 4 * MIB);
    assert_shards_follow(&sh, "chunk rewrite");
    // A group larger than the granule is refused, and nothing changes.
    let before = format!("{:?}", sh.config());
    let e = sh
        .retune(|c| c.group_size = 4 * MIB)
        .unwrap_err()
        .to_string();
    assert!(e.contains("granules of 262144 bytes"), "{e}");
    let e = sh
        .retune(|c| c.shard_granule = MIB)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard_granule cannot change"), "{e}");
    assert_eq!(format!("{:?}", sh.config()), before);
    assert_shards_follow(&sh, "refused");
    sh.set_dirty_evictions_blocked(true);
    assert_shards_follow(&sh, "dirty evictions blocked");
    sh.reset_counters();
    assert_eq!(sh.counters(), Default::default());

    // Restore into a fresh engine of the same layout: the same lines in the same slots.
    let mut lines = Eng::lines(&sh);
    let age: Vec<u32> = lines.iter().map(|l| l.slot).collect();
    let mut to = Sharded::new(sh.config().clone()).unwrap();
    assert_eq!(to.restore_sorted(lines.clone(), &age), vec![]);
    assert_eq!(Eng::lines(&to), lines);
    // A line in a slot of the shard that does not own its key: refused, by name.
    let first_of_1 = sh.slot_base(1) as u32;
    let l0 = *lines.iter().find(|l| l.slot < first_of_1).unwrap();
    let moved = RestoreLine {
        slot: first_of_1 + 4000,
        ..l0
    };
    let mut to = Sharded::new(sh.config().clone()).unwrap();
    let e = to.restore_line(moved.key, moved.slot, moved.valid, moved.dirty, moved.class);
    let e = e.unwrap_err().to_string();
    assert!(e.contains("another shard layout"), "{e}");
    lines.retain(|l| l.slot != l0.slot);
    lines.push(moved);
    lines.sort_by_key(|l| l.slot);
    let errs = to.restore_sorted(lines.clone(), &age);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, moved.slot);
    assert_eq!(to.len(), lines.len() as u64 - 1);
    let mut to = Sharded::new(sh.config().clone()).unwrap();
    let errs = to.restore_bulk(&lines);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(to.len(), lines.len() as u64 - 1);
}

#[test]
fn the_layout_follows_the_capacity() {
    let layout = |cap: u64, shards: u32, f: &dyn Fn(&mut EngineConfig)| {
        let mut c = EngineConfig {
            capacity_lines: cap,
            shards,
            ..Default::default()
        };
        f(&mut c);
        Sharded::layout_of(&c)
    };
    let l = |shards, granule| ShardLayout { shards, granule };
    // A live cache of 512 MiB at 8 shards: 1 MiB granules (64 per shard).
    assert_eq!(layout(131_072, 8, &|_| ()), l(8, MIB));
    // At 64 shards: 128 KiB granules.
    assert_eq!(layout(131_072, 64, &|_| ()), l(64, 128 << 10));
    // A 4 TiB cache: never above 1 MiB.
    assert_eq!(layout(1 << 30, 64, &|_| ()), l(64, MIB));
    // Small caches: line granules, then fewer shards (OLTP at 1 %: 233 lines).
    assert_eq!(layout(233, 8, &|_| ()), l(3, LINE));
    assert_eq!(layout(1024, 8, &|_| ()), l(8, 2 * LINE));
    assert_eq!(layout(19, 8, &|_| ()), l(1, MIB));
    assert_eq!(layout(0, 8, &|_| ()), l(1, MIB));
    // A group must lie in one shard: 64 KiB groups need 64 x 16 lines per shard.
    assert_eq!(
        layout(4096, 8, &|c| c.group_size = 64 << 10),
        l(4, 64 << 10)
    );
    // ACP without chunk rewrite cleans 1 MiB chunks: 1 MiB granules only.
    let acp = |c: &mut EngineConfig| {
        c.cleaning = CleaningPolicy::Acp;
        c.rewrite_chunk = 0;
    };
    assert_eq!(layout(32_768, 8, &acp), l(2, MIB));
    // A fixed granule fixes the shard count too.
    assert_eq!(layout(233, 8, &|c| c.shard_granule = MIB), l(8, MIB));
    assert_eq!(
        layout(233, 8, &|c| {
            c.shard_granule = 8192;
            c.group_size = 65536;
        }),
        l(8, 65536)
    );
    // What runs is the layout: a small cache runs fewer shards, each with its chunk rewrite
    // capped at its granule.
    let sh = Sharded::new(EngineConfig {
        capacity_lines: 1024,
        shards: 8,
        ..Default::default()
    })
    .unwrap();
    assert_eq!((sh.shard_count(), sh.granule_bytes()), (8, 2 * LINE));
    assert_eq!(sh.shard(3).config().rewrite_chunk, 2 * LINE);
    assert_eq!(sh.config().rewrite_chunk, MIB);
}
