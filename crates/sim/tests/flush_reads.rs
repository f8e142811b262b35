//! Issue 20 item 4: the timed replay predicts what `scripts/bench_flush_p99.sh` measures live:
//! 11,987 dirty 4 KiB lines scattered over 1 GiB in a 256 MiB write-back cache on the 7200 rpm
//! model, then 4 KiB random reads at queue depth 1 while `ctl flush` writes them back
//! ([`TimedOptions::flush_at`]: the cleaning passes are begun in the engine when queued and
//! their write-backs go to the HDD in the background, yielding to the reads, as live).

use rand::{seq::index::sample, Rng, SeedableRng};
use tiercache_engine::{CacheSize, EngineConfig, Mode, Op, Request};
use tiercache_sim::timed::simulate_timed;
use tiercache_sim::{Drive, Input, SimSpec, TimedOptions};

const GIB: u64 = 1 << 30;
const LINE: u64 = 4096;
const DIRTY: usize = 11_987;
const READS: u64 = 800;

/// Read p99 (us), the read phase's seconds and the seconds until the flush was drained.
fn run(dirty: bool) -> (f64, f64, f64, u64) {
    let mut reqs = Vec::new();
    if dirty {
        let lines = sample(
            &mut rand_chacha::ChaCha8Rng::seed_from_u64(1),
            (GIB / LINE) as usize,
            DIRTY,
        );
        for (i, l) in lines.iter().enumerate() {
            reqs.push(Request::new(i as u64, Op::Write, l as u64 * LINE, LINE));
        }
    }
    let writes = reqs.len() as u64;
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for i in 0..READS {
        let at = r.gen_range(0..GIB / LINE) * LINE;
        reqs.push(Request::new(writes + i, Op::Read, at, LINE));
    }
    let spec = SimSpec {
        input: Input::Memory {
            name: "flush-reads".into(),
            requests: std::sync::Arc::new(reqs),
        },
        cache_size: CacheSize::Bytes(256 << 20),
        engine: EngineConfig {
            mode: Mode::WriteBack,
            volume_bytes: Some(GIB),
            ..Default::default()
        },
        log: None,
    };
    let opts = TimedOptions {
        drive: Drive::Closed { queue_depth: 1 },
        // Live: `--writeback-rate off` (the default), no cleaning but the flush.
        idle_clean: false,
        phase_starts: vec![0, writes],
        flush_at: dirty.then_some(writes),
        ..Default::default()
    };
    let mut hdd = tiercache_devices::build(&"hdd:7200".parse().unwrap()).unwrap();
    let mut ssd = tiercache_devices::build(&"ssd:default".parse().unwrap()).unwrap();
    let (sim, t) =
        simulate_timed(&spec, None, hdd.as_mut(), Some(ssd.as_mut()), &opts, None).unwrap();
    assert_eq!(t.device_errors, 0);
    let reads_s = *t.phase_s.last().unwrap();
    let flush_s = t.drained_s - (t.elapsed_s - reads_s);
    (
        t.latency_us.read.p99,
        reads_s,
        flush_s,
        sim.counters.write_backs,
    )
}

#[test]
fn reads_during_a_flush_wait_for_one_background_write_at_most() {
    let (idle, idle_s, _, _) = run(false);
    let (busy, busy_s, flush_s, wbs) = run(true);
    let ratio = busy / idle;
    println!(
        "{READS} QD1 random reads: p99 idle {:.1} ms ({:.0} IOPS), during a flush of {DIRTY} \
         lines {:.1} ms ({:.0} IOPS): {ratio:.2}x; the flush took {flush_s:.1} s, {wbs} \
         write-backs",
        idle / 1e3,
        READS as f64 / idle_s,
        busy / 1e3,
        READS as f64 / busy_s
    );
    assert!(
        wbs >= DIRTY as u64 / 16,
        "the flush wrote back only {wbs} lines"
    );
    // The reads yield nothing to the flush in the model but the one background write in
    // service when they arrive (at most a 1 MiB chunk rewrite's read or write, ~15 ms).
    assert!(ratio > 1.0, "a flush made reads faster: {ratio}");
    assert!(
        ratio < 4.0,
        "reads during a flush waited for more than one write-back: {ratio}"
    );
    assert!(
        flush_s > busy_s,
        "the flush ended before the reads: {flush_s} s"
    );
}
