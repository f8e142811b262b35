//! Device physics against datasheet-scale expectations, all in simulated time.
//! Run with `--nocapture` to see the measured figures.

use tiercache_devices::bench::{closed_loop, random_ops, sequential_ops, BenchResult};
use tiercache_devices::{
    build, Checked, Completion, Device, DeviceError, DeviceSpec, FaultConfig, Faulty, IoKind, IoOp,
    Ram, RamConfig, SsdConfig,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn dev(name: &str) -> Box<dyn Device> {
    build(&name.parse::<DeviceSpec>().unwrap()).unwrap()
}

fn random_reads(d: &mut dyn Device, qd: usize, n: u64, seed: u64) -> BenchResult {
    let cap = d.capacity_bytes();
    let r = closed_loop(
        d,
        0,
        qd,
        random_ops(IoKind::Read, 4 * KIB, 4 * KIB, cap, n, seed),
    );
    eprintln!(
        "{:<22} 4K random read  QD{qd:<3} {:>9.0} IOPS  mean {:>8.1} us",
        d.name(),
        r.iops,
        r.mean_latency_ns / 1e3
    );
    r
}

#[test]
fn hdd_7200_random_and_sequential() {
    let r = random_reads(&mut *dev("hdd:7200"), 1, 3000, 1);
    assert!((70.0..=110.0).contains(&r.iops), "{r:?}");

    let mut d = dev("7200");
    let s = closed_loop(&mut *d, 0, 1, sequential_ops(IoKind::Read, MIB, 0, 200));
    eprintln!("hdd:7200 sequential 1 MiB reads QD1: {:.1} MB/s", s.mb_s);
    assert!(s.mb_s > 100.0, "{s:?}");
    assert!(s.mb_s < 142.0 * 1.01, "faster than the media: {s:?}");

    // The inner zone is slower.
    let mut d = dev("7200");
    let start = d.capacity_bytes() - 200 * MIB;
    let inner = closed_loop(&mut *d, 0, 1, sequential_ops(IoKind::Read, MIB, start, 200));
    eprintln!(
        "hdd:7200 sequential 1 MiB reads at the inner edge: {:.1} MB/s",
        inner.mb_s
    );
    assert!(inner.mb_s < 80.0 && inner.mb_s > 60.0, "{inner:?}");

    // Sequential writes at QD1 have no read-ahead or write cache: ~one lost revolution each.
    let mut d = dev("7200");
    let w = closed_loop(&mut *d, 0, 1, sequential_ops(IoKind::Write, MIB, 0, 100));
    eprintln!("hdd:7200 sequential 1 MiB writes QD1: {:.1} MB/s", w.mb_s);
    assert!(w.mb_s < s.mb_s && w.mb_s > 50.0, "{w:?}");
}

#[test]
fn hdd_15k_random() {
    let r = random_reads(&mut *dev("15k"), 1, 3000, 2);
    assert!((150.0..=230.0).contains(&r.iops), "{r:?}");
}

#[test]
fn hdd_other_presets_are_in_their_class() {
    let r = random_reads(&mut *dev("hdd:5400"), 1, 1000, 3);
    assert!((45.0..=70.0).contains(&r.iops), "{r:?}"); // 1 / (12 + 5.5 ms)
    let r = random_reads(&mut *dev("hdd:10k"), 1, 1000, 3);
    assert!((110.0..=170.0).contains(&r.iops), "{r:?}"); // 1 / (4.4 + 3 ms)
}

#[test]
fn sptf_queueing_beats_fifo() {
    let qd1 = random_reads(&mut *dev("7200"), 1, 3000, 4);
    let qd32 = random_reads(&mut *dev("7200"), 32, 3000, 4);
    assert!(
        qd32.iops > 1.5 * qd1.iops,
        "QD1 {} vs QD32 {}",
        qd1.iops,
        qd32.iops
    );
    // queue_depth = 1 in the drive means FIFO even with many host ops outstanding.
    let mut spec: DeviceSpec = "7200".parse().unwrap();
    if let DeviceSpec::Hdd(c) = &mut spec {
        c.queue_depth = 1;
    }
    let fifo = random_reads(&mut *build(&spec).unwrap(), 32, 3000, 4);
    assert!(
        (fifo.iops - qd1.iops).abs() < 0.05 * qd1.iops,
        "{} vs {}",
        fifo.iops,
        qd1.iops
    );
}

#[test]
fn ssd_default_scales_with_depth_up_to_its_units() {
    let units = SsdConfig::default().units();
    let qd1 = random_reads(&mut *dev("ssd:default"), 1, 20_000, 5);
    assert!((7_000.0..=15_000.0).contains(&qd1.iops), "{qd1:?}");
    let at_units = random_reads(&mut *dev("ssd:default"), units, 50_000, 5);
    assert!(
        at_units.iops > 0.7 * units as f64 * qd1.iops,
        "QD{units}: {} vs QD1 {}",
        at_units.iops,
        qd1.iops
    );
    // Beyond the unit count the curve flattens towards the dies' limit, units / tR: eight
    // times the depth gives well under twice the IOPS, and the last doubling almost nothing.
    let half_deep = random_reads(&mut *dev("ssd:default"), 4 * units, 50_000, 5);
    let deep = random_reads(&mut *dev("ssd:default"), 8 * units, 50_000, 5);
    let ceiling = units as f64 / 75e-6;
    assert!(deep.iops <= ceiling * 1.001, "{} > {ceiling}", deep.iops);
    assert!(
        deep.iops < 2.0 * at_units.iops,
        "{} vs {}",
        deep.iops,
        at_units.iops
    );
    assert!(
        deep.iops < 1.1 * half_deep.iops,
        "{} vs {}",
        deep.iops,
        half_deep.iops
    );
    for name in ["ssd:intel-710", "ssd:intel-311", "ssd:c300"] {
        random_reads(&mut *dev(name), 1, 5000, 6);
        random_reads(&mut *dev(name), 32, 20_000, 6);
    }
}

#[test]
fn ssd_sequential_is_link_bound() {
    for (name, link) in [
        ("ssd:default", 600.0),
        ("ssd:intel-710", 270.0),
        ("ssd:intel-311", 200.0),
        ("ssd:c300", 355.0),
    ] {
        let mut d = dev(name);
        let r = closed_loop(&mut *d, 0, 4, sequential_ops(IoKind::Read, MIB, 0, 200));
        let mut d = dev(name);
        let w = closed_loop(&mut *d, 0, 4, sequential_ops(IoKind::Write, MIB, 0, 100));
        eprintln!(
            "{name:<14} sequential 1 MiB QD4: read {:.0} MB/s, write {:.0} MB/s",
            r.mb_s, w.mb_s
        );
        assert!(
            r.mb_s <= link * 1.001 && r.mb_s > 0.8 * link,
            "{name}: {r:?}"
        );
    }
}

fn ssd(cfg: SsdConfig) -> Box<dyn Device> {
    build(&DeviceSpec::Ssd(cfg)).unwrap()
}

#[test]
fn ssd_write_buffer_hides_program_time_until_it_fills() {
    let cfg = SsdConfig::default();
    let unbuffered = SsdConfig {
        write_buffer_bytes: 0,
        ..cfg.clone()
    };
    let cap = cfg.capacity_bytes;
    let writes = |n| random_ops(IoKind::Write, 4 * KIB, 4 * KIB, cap, n, 9);
    // QD1 4 KiB writes: with the buffer, controller + link (~12 us), not the 750 us program.
    let b = closed_loop(&mut *ssd(cfg.clone()), 0, 1, writes(1000));
    let u = closed_loop(&mut *ssd(unbuffered), 0, 1, writes(1000));
    eprintln!(
        "ssd:default 4K random write QD1: buffered {:.1} us, unbuffered {:.1} us",
        b.mean_latency_ns / 1e3,
        u.mean_latency_ns / 1e3
    );
    assert!(b.mean_latency_ns < 50_000.0, "{b:?}");
    assert!(u.mean_latency_ns > 750_000.0, "{u:?}");
    // Sustained: 4x the buffer written back to back runs at the flash program rate
    // (8 units x 8 KiB pages per 750 us = 87 MB/s), however fast the first MiBs went.
    let n = 4 * cfg.write_buffer_bytes / MIB;
    let w = closed_loop(
        &mut *ssd(cfg.clone()),
        0,
        4,
        sequential_ops(IoKind::Write, MIB, 0, n),
    );
    let flash_mb_s = 8.0 * 8192.0 / 750e-6 / 1e6;
    eprintln!("ssd:default sustained 1 MiB writes: {:.0} MB/s", w.mb_s);
    assert!(
        w.mb_s < 1.4 * flash_mb_s && w.mb_s > 0.8 * flash_mb_s,
        "{w:?}"
    );
    // Program suspend: a read right after a burst of buffered writes does not wait for the
    // backlog (tens of ms of programs per die) but only for a suspend.
    let mut d = ssd(cfg.clone());
    let burst = closed_loop(&mut *d, 0, 8, sequential_ops(IoKind::Write, MIB, 0, 16));
    let r = closed_loop(
        &mut *d,
        burst.end_ns,
        1,
        [IoOp::new(IoKind::Read, 0, 4 * KIB)],
    );
    eprintln!(
        "ssd:default read behind 16 MiB of buffered writes: {:.0} us",
        r.mean_latency_ns / 1e3
    );
    assert!(r.mean_latency_ns < 400_000.0, "{r:?}");
    // FUA and flush wait for the flash.
    let mut d = ssd(cfg);
    let mut op = IoOp::new(IoKind::Write, 0, 4 * KIB);
    op.fua = true;
    let r = closed_loop(&mut *d, 0, 1, [op]);
    assert!(r.mean_latency_ns > 750_000.0, "FUA write took {r:?}");
    let start = r.end_ns;
    let r = closed_loop(&mut *d, start, 1, [IoOp::new(IoKind::Write, 8192, 4 * KIB)]);
    let f = closed_loop(&mut *d, r.end_ns, 1, [IoOp::new(IoKind::Flush, 0, 0)]);
    assert!(
        f.end_ns >= start + 750_000,
        "flush returned before the buffered write was programmed: {f:?}"
    );
}

#[test]
fn raid0_of_four_scales_random_reads() {
    let one = random_reads(&mut *dev("7200"), 8, 3000, 7);
    let four = random_reads(&mut *dev("raid0:4x7200"), 32, 12_000, 7);
    let ratio = four.iops / one.iops;
    eprintln!("raid0 x4 / single at 8 per disk: {ratio:.2}");
    assert!((3.0..=5.0).contains(&ratio), "ratio {ratio}");
}

#[test]
fn raid5_small_writes_cost_four_member_ops() {
    let spec: DeviceSpec = "raid5:4x7200".parse().unwrap();
    let mut raid = build(&spec).unwrap();
    let cap = raid.capacity_bytes();
    assert_eq!(cap, 3 * (500_000_000_000 / (64 * KIB) * (64 * KIB)));
    let n = 400;
    let r = closed_loop(
        &mut *raid,
        0,
        4,
        random_ops(IoKind::Write, 4 * KIB, 4 * KIB, cap, n, 8),
    );
    assert_eq!(r.ops, n);
    // Count member ops through a concrete RAID.
    let members: Vec<Box<dyn Device>> = (0..4).map(|_| dev("7200")).collect();
    let mut raid = Checked::new(
        tiercache_devices::Raid::new(
            tiercache_devices::RaidConfig {
                level: tiercache_devices::RaidLevel::Raid5,
                ..Default::default()
            },
            members,
        )
        .unwrap(),
    );
    closed_loop(
        &mut raid,
        0,
        4,
        random_ops(IoKind::Write, 4 * KIB, 4 * KIB, cap, n, 8),
    );
    let (mut reads, mut writes) = (0, 0);
    for m in raid.model().members() {
        reads += m.stats().kind(IoKind::Read).ops;
        writes += m.stats().kind(IoKind::Write).ops;
    }
    eprintln!(
        "raid5 4K random writes: {:.2} member reads + {:.2} member writes per write, {:.0} IOPS",
        reads as f64 / n as f64,
        writes as f64 / n as f64,
        r.iops
    );
    assert_eq!((reads, writes), (2 * n, 2 * n));

    // A full-stripe write reads nothing: 3 data units + 1 parity.
    let mut raid = Checked::new(
        tiercache_devices::Raid::new(
            tiercache_devices::RaidConfig {
                level: tiercache_devices::RaidLevel::Raid5,
                ..Default::default()
            },
            (0..4).map(|_| dev("7200")).collect(),
        )
        .unwrap(),
    );
    closed_loop(&mut raid, 0, 1, [IoOp::new(IoKind::Write, 0, 3 * 64 * KIB)]);
    let ops: Vec<_> = raid
        .model()
        .members()
        .iter()
        .map(|m| {
            (
                m.stats().kind(IoKind::Read).ops,
                m.stats().kind(IoKind::Write).ops,
            )
        })
        .collect();
    assert_eq!(ops, vec![(0, 1); 4]);
}

fn ram() -> Checked<Ram> {
    Checked::new(Ram::new(RamConfig::default()).unwrap())
}

fn run_faulty(cfg: FaultConfig, ops: impl IntoIterator<Item = IoOp>) -> Vec<Completion> {
    let mut d = Checked::new(Faulty::new(ram(), cfg).unwrap());
    let mut done = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        d.submit(i as u64 * 10_000, i as u64, op);
        let t = i as u64 * 10_000;
        d.advance(t, &mut done);
    }
    while let Some(t) = d.next_completion() {
        d.advance(t, &mut done);
    }
    done.sort_by_key(|c| c.id);
    done
}

#[test]
fn fault_fail_nth_fails_exactly_that_op() {
    let reads = (0..50).map(|i| {
        let kind = if i % 2 == 0 {
            IoKind::Read
        } else {
            IoKind::Write
        };
        IoOp::new(kind, i * 4096, 4096)
    });
    let cfg = FaultConfig {
        fail_nth: Some(7),
        ..FaultConfig::default()
    };
    let done = run_faulty(cfg.clone(), reads.clone());
    let failed: Vec<_> = done
        .iter()
        .filter(|c| c.result.is_err())
        .map(|c| c.id)
        .collect();
    assert_eq!(failed, vec![6]);
    assert_eq!(
        done[6].result,
        Err(DeviceError::Injected {
            kind: IoKind::Read,
            nth: 7
        })
    );
    // Writes only: the 7th write is op index 13.
    let done = run_faulty(
        FaultConfig {
            fail_nth_writes_only: true,
            ..cfg
        },
        reads,
    );
    let failed: Vec<_> = done
        .iter()
        .filter(|c| c.result.is_err())
        .map(|c| c.id)
        .collect();
    assert_eq!(failed, vec![13]);
}

#[test]
fn fault_probability_and_seed() {
    let ops = || (0..10_000u64).map(|i| IoOp::new(IoKind::Read, (i % 1000) * 4096, 4096));
    let cfg = FaultConfig {
        seed: 42,
        ..FaultConfig::default()
    }
    .with_error_prob(0.1);
    let a = run_faulty(cfg.clone(), ops());
    let errors = a.iter().filter(|c| c.result.is_err()).count();
    eprintln!("p = 0.1 over 10,000 ops: {errors} errors");
    assert!((900..=1100).contains(&errors), "{errors}");
    assert_eq!(run_faulty(cfg.clone(), ops()), a, "same seed, same faults");
    let b = run_faulty(FaultConfig { seed: 43, ..cfg }, ops());
    assert_ne!(b, a, "another seed, other faults");
}

#[test]
fn fault_latency_spikes() {
    let ops = || (0..1000u64).map(|i| IoOp::new(IoKind::Write, i * 4096, 4096));
    let base = run_faulty(FaultConfig::default(), ops());
    let spiky = run_faulty(
        FaultConfig {
            spike_prob: 0.25,
            spike_ns: 5_000_000,
            ..FaultConfig::default()
        },
        ops(),
    );
    let spiked = base
        .iter()
        .zip(&spiky)
        .filter(|(a, b)| {
            assert!(b.result.is_ok());
            match b.time_ns - a.time_ns {
                0 => false,
                5_000_000 => true,
                d => panic!("spike of {d} ns"),
            }
        })
        .count();
    assert!((200..=300).contains(&spiked), "{spiked}");
}

#[test]
fn busy_time_is_bounded_by_elapsed_and_equal_when_saturated() {
    for name in ["7200", "ssd:default", "ram", "raid5:3x15k"] {
        // Saturated: closed loop from t = 0, never idle.
        let mut d = dev(name);
        let r = random_reads(&mut *d, 4, 500, 9);
        assert_eq!(d.stats().busy_ns, r.elapsed_ns(), "{name}");
        // Reads only: the read busy time is the device's, the write busy time 0.
        assert_eq!(
            d.stats().kind(IoKind::Read).busy_ns,
            r.elapsed_ns(),
            "{name}"
        );
        assert_eq!(d.stats().kind(IoKind::Write).busy_ns, 0, "{name}");
        assert_eq!(d.stats().ops(), 500);
        assert_eq!(d.outstanding(), 0);

        // Open loop with idle gaps: busy < elapsed.
        let mut d = dev(name);
        let mut done = Vec::new();
        let mut t = 0;
        for i in 0..50u64 {
            d.submit(t, i, IoOp::new(IoKind::Read, i * 7919 * 4096, 4096));
            t += 50_000_000;
            d.advance(t, &mut done);
        }
        while let Some(x) = d.next_completion() {
            d.advance(x, &mut done);
        }
        let last = done.iter().map(|c| c.time_ns).max().unwrap();
        let busy = d.stats().busy_ns;
        assert!(busy > 0 && busy < last, "{name}: busy {busy} of {last}");
        assert!(done.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    }
}

#[test]
fn invalid_ops_fail_without_cost() {
    let mut d = dev("ssd:default");
    let cap = d.capacity_bytes();
    d.submit(5, 1, IoOp::new(IoKind::Read, cap - 4096, 8192));
    d.submit(5, 2, IoOp::new(IoKind::Write, 0, 0));
    assert_eq!(d.next_completion(), Some(5));
    let mut done = Vec::new();
    d.advance(5, &mut done);
    assert!(matches!(
        done[0].result,
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(done[1].result, Err(DeviceError::Empty { .. })));
    assert_eq!(d.stats().busy_ns, 0);
    assert_eq!(d.stats().errors(), 2);
}

#[test]
fn deterministic_replay() {
    let run = || {
        let mut d = dev("raid5:4x7200");
        let cap = d.capacity_bytes();
        let mut done = Vec::new();
        let ops: Vec<_> = random_ops(IoKind::Write, 8 * KIB, 512, cap, 200, 11)
            .zip(random_ops(IoKind::Read, 64 * KIB, 4096, cap, 200, 12))
            .flat_map(|(a, b)| [a, b])
            .collect();
        for (i, op) in ops.into_iter().enumerate() {
            let t = i as u64 * 3_000_000;
            d.advance(t, &mut done);
            d.submit(t, i as u64, op);
        }
        while let Some(t) = d.next_completion() {
            d.advance(t, &mut done);
        }
        (done, d.stats())
    };
    let (a, sa) = run();
    let (b, sb) = run();
    assert_eq!(a.len(), 400);
    assert_eq!(a, b);
    assert_eq!(sa, sb);
}

#[test]
#[should_panic(expected = "time must not go back")]
fn time_going_back_is_a_contract_violation() {
    let mut d = dev("ram");
    d.submit(10, 0, IoOp::new(IoKind::Read, 0, 1));
    d.submit(9, 1, IoOp::new(IoKind::Read, 0, 1));
}

#[test]
fn sptf_starvation_guard_bounds_the_worst_wait() {
    let run = |max_wait_ms: Option<f64>| {
        let mut spec: DeviceSpec = "7200".parse().unwrap();
        if let DeviceSpec::Hdd(c) = &mut spec {
            c.max_queue_wait_ms = max_wait_ms;
        }
        let mut d = build(&spec).unwrap();
        let cap = d.capacity_bytes();
        closed_loop(
            &mut *d,
            0,
            32,
            random_ops(IoKind::Read, 4 * KIB, 4 * KIB, cap, 3000, 10),
        )
    };
    let pure = run(None);
    let guarded = run(Some(600.0));
    eprintln!(
        "SPTF QD32 worst wait: pure {:.0} ms, guarded {:.0} ms ({:.0} vs {:.0} IOPS)",
        pure.max_latency_ns as f64 / 1e6,
        guarded.max_latency_ns as f64 / 1e6,
        pure.iops,
        guarded.iops
    );
    assert!(guarded.max_latency_ns < pure.max_latency_ns);
}

#[test]
fn busy_time_per_kind_splits_reads_and_writes() {
    let near = |a: u64, b: u64| a.abs_diff(b) <= 4;
    for name in ["7200", "ssd:default", "ram"] {
        // Reads, then after an idle gap writes, then both together.
        let mut d = dev(name);
        let mut done = Vec::new();
        let mut t = 0;
        let mut id = 0;
        let drain = |d: &mut Box<dyn Device>, done: &mut Vec<Completion>| {
            while let Some(x) = d.next_completion() {
                d.advance(x, done);
            }
            done.iter().map(|c| c.time_ns).max().unwrap_or(0)
        };
        let mut alone = Vec::new();
        for kind in [IoKind::Read, IoKind::Write] {
            let before = d.stats().busy_ns;
            for i in 0..20u64 {
                d.submit(t, id, IoOp::new(kind, i * 7919 * 4096, 4096));
                id += 1;
            }
            t = drain(&mut d, &mut done) + 100_000_000;
            alone.push(d.stats().busy_ns - before);
        }
        let s = d.stats();
        let (r, w) = (s.kind(IoKind::Read).busy_ns, s.kind(IoKind::Write).busy_ns);
        // Apart in time: each kind has the device's busy time of its own batch.
        assert!(
            near(r, alone[0]) && near(w, alone[1]),
            "{name}: {r} {w} {alone:?}"
        );
        assert!(r > 0 && w > 0, "{name}");
        // Together: the device's time is split, each kind gets some, the sum is the total.
        for i in 0..20u64 {
            let kind = if i % 2 == 0 {
                IoKind::Read
            } else {
                IoKind::Write
            };
            d.submit(t, id, IoOp::new(kind, i * 104729 * 4096, 4096));
            id += 1;
        }
        drain(&mut d, &mut done);
        let s2 = d.stats();
        let r2 = s2.kind(IoKind::Read).busy_ns - r;
        let w2 = s2.kind(IoKind::Write).busy_ns - w;
        let b2 = s2.busy_ns - s.busy_ns;
        assert!(r2 > 0 && w2 > 0, "{name}: {r2} {w2}");
        assert!(near(r2 + w2, b2), "{name}: {r2} + {w2} vs {b2}");
    }
}
