//! Timed write-back replay: a cache slot is not reused before the write-back of the line that
//! held it has read the data off the SSD and written it to the HDD. A dirty eviction's
//! write-back runs inside the request's plan, before the new line's SSD write; a cleaning
//! pass is begun in the engine when it is queued (its lines pinned: never victims) and
//! completed when its HDD writes are done, so no request waits for a cleaning write-back to
//! reuse a slot, as live.

use std::collections::HashMap;
use tiercache_devices::{build, Completion, Device, DeviceStats, IoKind, IoOp};
use tiercache_engine::{CacheSize, Engine, EngineConfig, Mode, Request, Step};
use tiercache_sim::timed::simulate_timed;
use tiercache_sim::{Drive, Input, SimSpec, TimedOptions};

/// One device operation as the executor ran it.
#[derive(Clone, Copy, Debug)]
struct Op {
    submit_ns: u64,
    done_ns: u64,
    op: IoOp,
}

/// A device that records every operation it runs (submission and completion times).
struct Recorder {
    inner: Box<dyn Device>,
    open: HashMap<u64, (u64, IoOp)>,
    log: Vec<Op>,
}

impl Recorder {
    fn new(spec: &str) -> Self {
        Recorder {
            inner: build(&spec.parse().unwrap()).unwrap(),
            open: HashMap::new(),
            log: Vec::new(),
        }
    }
}

impl Device for Recorder {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn submit(&mut self, now_ns: u64, id: u64, op: IoOp) {
        assert!(
            self.open.insert(id, (now_ns, op)).is_none(),
            "id {id} reused while in flight"
        );
        self.inner.submit(now_ns, id, op);
    }
    fn next_completion(&self) -> Option<u64> {
        self.inner.next_completion()
    }
    fn advance(&mut self, now_ns: u64, done: &mut Vec<Completion>) {
        let from = done.len();
        self.inner.advance(now_ns, done);
        for c in &done[from..] {
            let (submit_ns, op) = self.open.remove(&c.id).expect("completion of a known op");
            self.log.push(Op {
                submit_ns,
                done_ns: c.time_ns,
                op,
            });
        }
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

const LINE: u64 = 4096;
const CACHE_LINES: u64 = 256;

/// `n` writes of distinct 4 KiB lines scattered over 1 GiB (a fixed permutation), so every
/// write-back is a random HDD write and every line is written once.
fn scattered_writes(n: u64) -> Vec<Request> {
    let span = (1u64 << 30) / LINE;
    (0..n)
        .map(|i| Request::write((i * 40_503 % span) * LINE, LINE))
        .collect()
}

/// Per request, the cache slot its line lands in, from the untimed engine. With LRU and no
/// cleaning the slot a line takes does not depend on timing (the victim is the LRU tail,
/// dirty or not), so the timed run places the lines in the same slots. (With cleaning, the
/// lines being written back are pinned for a time the untimed engine does not have.)
fn slots_of(cfg: &EngineConfig, reqs: &[Request]) -> Vec<u64> {
    let mut e = Engine::new(cfg.clone()).unwrap();
    reqs.iter()
        .map(|r| {
            let plan = e.process(r).unwrap();
            let ssd = plan
                .steps
                .iter()
                .find_map(|s| match *s {
                    Step::WriteSsd { ssd, .. } => Some(ssd),
                    _ => None,
                })
                .expect("a write miss writes the SSD");
            ssd / LINE
        })
        .collect()
}

/// A write-back LRU cache of 256 lines takes 4,096 scattered writes at queue depth 4, no
/// cleaning: every eviction is dirty. Every time a slot gets its next line, the previous
/// line's data must already be on the HDD (an HDD write covering it completed) and have been
/// read off that slot.
#[test]
fn a_slot_is_reused_only_after_the_write_back_of_its_previous_line() {
    let reqs = scattered_writes(4096);
    let engine = EngineConfig {
        mode: Mode::WriteBack,
        dirty_high: 1.0,
        dirty_low: 1.0,
        ..Default::default()
    };
    let spec = SimSpec {
        input: Input::Memory {
            name: "scattered".into(),
            requests: std::sync::Arc::new(reqs.clone()),
        },
        cache_size: CacheSize::Bytes(CACHE_LINES * LINE),
        engine: engine.clone(),
        log: None,
    };
    let slots = slots_of(
        &EngineConfig {
            capacity_lines: CACHE_LINES,
            ..engine
        },
        &reqs,
    );
    let mut hdd = Recorder::new("hdd:7200");
    let mut ssd = Recorder::new("ssd:default");
    let opts = TimedOptions {
        drive: Drive::Closed { queue_depth: 4 },
        idle_clean: false,
        ..Default::default()
    };
    let (sim, timed) = simulate_timed(&spec, None, &mut hdd, Some(&mut ssd), &opts, None).unwrap();
    assert_eq!(timed.device_errors, 0);
    assert!(
        sim.counters.evictions >= 4096 - CACHE_LINES,
        "the cache must evict: {} evictions",
        sim.counters.evictions
    );

    // Occupants of each slot in request order, and the SSD writes to each slot in submission
    // order (the same sequence: one SSD write per request).
    let mut occupants: HashMap<u64, Vec<u64>> = HashMap::new();
    for (r, &s) in reqs.iter().zip(&slots) {
        occupants.entry(s).or_default().push(r.offset);
    }
    let mut ssd_log = ssd.log.clone();
    ssd_log.sort_by_key(|o| (o.submit_ns, o.op.offset));
    let mut writes: HashMap<u64, Vec<Op>> = HashMap::new();
    let mut reads: HashMap<u64, Vec<Op>> = HashMap::new();
    for o in &ssd_log {
        let slot = o.op.offset / LINE;
        match o.op.kind {
            IoKind::Write => writes.entry(slot).or_default().push(*o),
            IoKind::Read => reads.entry(slot).or_default().push(*o),
            _ => {}
        }
    }
    let hdd_writes: Vec<Op> = hdd
        .log
        .iter()
        .filter(|o| o.op.kind == IoKind::Write)
        .copied()
        .collect();

    let (mut reuses, mut early_hdd, mut early_ssd) = (0u64, 0u64, 0u64);
    let mut first_bad: Option<String> = None;
    for (slot, lines) in &occupants {
        let w = &writes[slot];
        assert_eq!(
            w.len(),
            lines.len(),
            "slot {slot}: one SSD write per occupant"
        );
        for k in 1..lines.len() {
            reuses += 1;
            let (prev_line, reuse_at) = (lines[k - 1], w[k].submit_ns);
            let on_hdd = hdd_writes.iter().any(|h| {
                h.op.offset <= prev_line
                    && prev_line + LINE <= h.op.offset + h.op.len
                    && h.done_ns <= reuse_at
            });
            let read_off = reads.get(slot).is_some_and(|rs| {
                rs.iter()
                    .any(|r| r.submit_ns >= w[k - 1].done_ns && r.done_ns <= reuse_at)
            });
            if !on_hdd {
                early_hdd += 1;
            }
            if !read_off {
                early_ssd += 1;
            }
            if (!on_hdd || !read_off) && first_bad.is_none() {
                first_bad = Some(format!(
                    "slot {slot} reused at {reuse_at} ns by line {}: the previous line {} \
                     was {}{}",
                    lines[k] / LINE,
                    prev_line / LINE,
                    if on_hdd { "" } else { "not yet on the HDD" },
                    if read_off {
                        ""
                    } else {
                        ", not yet read off the SSD"
                    }
                ));
            }
        }
    }
    assert!(reuses >= 3000, "only {reuses} slot reuses");
    assert!(
        early_hdd == 0 && early_ssd == 0,
        "{early_hdd} of {reuses} slot reuses came before the previous line reached the HDD, \
         {early_ssd} before it was read off the SSD; first: {}",
        first_bad.unwrap_or_default()
    );
}

/// The same writes with the watermark cleaner and idle-time cleaning on: the lines of a
/// cleaning pass are pinned from when it is queued until its HDD writes are done, so LRU
/// takes other victims meanwhile and no request waits for (and hurries) a cleaning
/// write-back to reuse its slot, as the live volume does. (Before, the timed executor counted
/// them clean and unpinned when queued: evictions then waited for them.)
#[test]
fn no_request_waits_for_a_cleaning_write_back_to_reuse_a_slot() {
    let reqs = scattered_writes(4096);
    let spec = SimSpec {
        input: Input::Memory {
            name: "scattered".into(),
            requests: std::sync::Arc::new(reqs),
        },
        cache_size: CacheSize::Bytes(CACHE_LINES * LINE),
        engine: EngineConfig {
            mode: Mode::WriteBack,
            ..Default::default()
        },
        log: None,
    };
    let mut hdd = Recorder::new("hdd:7200");
    let mut ssd = Recorder::new("ssd:default");
    let opts = TimedOptions {
        drive: Drive::Closed { queue_depth: 4 },
        phase_starts: vec![0],
        ..Default::default()
    };
    let (sim, timed) = simulate_timed(&spec, None, &mut hdd, Some(&mut ssd), &opts, None).unwrap();
    let c = &sim.counters;
    let waits = timed.phase_counters[0].wb_waits;
    println!(
        "{} evictions ({} dirty), {} write-backs; requests that waited for a cleaning \
         write-back {waits}",
        c.evictions, c.dirty_evictions, c.write_backs
    );
    assert!(c.evictions >= 4096 - CACHE_LINES);
    assert!(
        c.write_backs > c.dirty_evictions,
        "the cleaner wrote back nothing: {} write-backs, {} dirty evictions",
        c.write_backs,
        c.dirty_evictions
    );
    assert_eq!(
        waits, 0,
        "requests waited for cleaning write-backs to reuse slots"
    );
}
