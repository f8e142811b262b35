//! Synthetic workloads: determinism, statistics, bounds and spec parsing.
//!
//! The statistical checks use sample sizes where the tolerance is many standard deviations
//! wide (so they do not fail by chance) yet far narrower than any plausible bug.

use std::collections::HashMap;
use tiercache_engine::{Op, Request};
use tiercache_trace::workload::{help, parse_size, Kind, WorkloadError, WorkloadSpec};

fn spec(s: &str) -> WorkloadSpec {
    s.parse()
        .unwrap_or_else(|e| panic!("'{s}' should parse: {e}"))
}

fn gen(s: &str, seed: u64) -> Vec<Request> {
    spec(s).generate(seed).collect()
}

fn err(s: &str) -> String {
    match s.parse::<WorkloadSpec>() {
        Ok(w) => panic!("'{s}' should not parse, got {w}"),
        Err(e) => e.to_string(),
    }
}

fn share(reqs: &[Request], f: impl Fn(&Request) -> bool) -> f64 {
    100.0 * reqs.iter().filter(|r| f(r)).count() as f64 / reqs.len() as f64
}

fn assert_near(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got:.3}, want {want:.3} ± {tol}"
    );
}

const ALL_KINDS: &[&str] = &[
    "uniform:wss=8MiB,requests=20000",
    "zipf:theta=0.9,wss=8MiB,requests=20000",
    "seq:streams=3,wss=8MiB,requests=20000",
    "hotspot:wss=8MiB,requests=20000",
    "8k; 60% read; 50% random; wss=8MiB; requests=20000",
];

#[test]
fn same_seed_same_stream_different_seed_different_stream() {
    for s in [
        "uniform:wss=8MiB,requests=20000,read=50,size=4k@50+64k@50,arrival=poisson",
        "zipf:theta=0.9,wss=8MiB,requests=20000,read=50,size=4k@50+64k@50,arrival=poisson",
        "seq:streams=3,wss=8MiB,requests=20000,read=50,size=4k@50+64k@50,arrival=poisson",
        "hotspot:wss=8MiB,requests=20000,read=50,size=4k@50+64k@50,arrival=poisson",
        "4k@50+64k@50; 50% read; 50% random; wss=8MiB; requests=20000; arrival=poisson",
    ] {
        let a = gen(s, 7);
        assert_eq!(a, gen(s, 7), "{s}");
        let b = gen(s, 8);
        assert_ne!(a, b, "{s}");
        // Every random field differs.
        let differ =
            |f: fn(&Request) -> u64| a.iter().zip(&b).filter(|(x, y)| f(x) != f(y)).count();
        assert!(differ(|r| r.len) > 5000, "{s}");
        assert!(differ(|r| r.time_ns) > 15000, "{s}");
        assert!(differ(|r| r.op as u64) > 5000, "{s}");
        assert!(differ(|r| r.offset) > 10000, "{s}");
    }
}

/// ChaCha8 is specified bit for bit, so this stream is the same on every platform. If a
/// deliberate change to the generators alters it, update the constant (and the sim goldens).
#[test]
fn uniform_stream_is_pinned() {
    let reqs = gen("uniform:wss=1GiB,requests=1000,read=50,size=4k@3+8k@1", 42);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in &reqs {
        for v in [r.offset, r.len, r.time_ns, r.op as u64] {
            h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
        }
    }
    assert_eq!(h, PINNED, "uniform stream changed: {h:#x}");
}
const PINNED: u64 = 0x2c79_3c7f_421b_57c2;

#[test]
fn len_is_the_request_count() {
    for s in ALL_KINDS {
        let w = spec(s);
        let g = w.generate(1);
        assert_eq!(g.len(), 20000);
        assert_eq!(g.count(), 20000);
    }
    assert_eq!(spec("uniform:requests=0,wss=1m").generate(1).count(), 0);
}

/// Harmonic number H(n, s) = sum k^-s.
fn harmonic(n: u64, s: f64) -> f64 {
    (1..=n).map(|k| (k as f64).powf(-s)).sum()
}

fn block_counts(reqs: &[Request], block: u64) -> Vec<(u64, u64)> {
    let mut m: HashMap<u64, u64> = HashMap::new();
    for r in reqs {
        *m.entry(r.offset / block).or_default() += 1;
    }
    let mut v: Vec<(u64, u64)> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

#[test]
fn zipf_rank_shares_follow_theta() {
    let n = 10_000u64;
    let reqs_n = 200_000usize;
    for theta in [1.0, 0.9, 1.2] {
        let reqs = gen(
            &format!("zipf:theta={theta},wss={},requests={reqs_n}", n * 4096),
            11,
        );
        let counts = block_counts(&reqs, 4096);
        assert!(counts.iter().all(|&(b, _)| b < n));
        let h = harmonic(n, theta);
        // Top ranks: share of rank k is k^-theta / H. Std dev of the top share is ~0.07
        // points; the tolerance is 4 % of the share (~0.4 points at theta 1).
        for k in 1..=3u64 {
            let want = 100.0 * (k as f64).powf(-theta) / h;
            let got = 100.0 * counts[k as usize - 1].1 as f64 / reqs_n as f64;
            assert_near(
                &format!("theta {theta} rank {k} share %"),
                got,
                want,
                want * 0.04,
            );
        }
        // The top 100 ranks together.
        let want: f64 = 100.0 * harmonic(100, theta) / h;
        let got = 100.0 * counts.iter().take(100).map(|c| c.1).sum::<u64>() as f64 / reqs_n as f64;
        assert_near(&format!("theta {theta} top-100 share %"), got, want, 1.0);
        // Hot blocks are scattered, not packed at the start of the working set.
        let top: Vec<u64> = counts.iter().take(10).map(|c| c.0).collect();
        assert!(
            top.iter().filter(|&&b| b < 100).count() <= 1,
            "top blocks {top:?}"
        );
        for (i, a) in top.iter().enumerate() {
            for b in &top[i + 1..] {
                assert!(
                    a.abs_diff(*b) > n / 100,
                    "top blocks {top:?} are bunched together"
                );
            }
        }
    }
}

#[test]
fn zipf_theta_one_top_block_share_is_one_over_h() {
    // The headline check: theta = 1.0 over 10 k blocks, top block ~ 1/H(n) = 10.2 %.
    let reqs = gen("zipf:theta=1.0,wss=40000KiB,requests=200000", 5);
    let counts = block_counts(&reqs, 4096);
    let want = 100.0 / harmonic(10_000, 1.0);
    let got = 100.0 * counts[0].1 as f64 / reqs.len() as f64;
    assert_near("top block share %", got, want, 0.4);
}

#[test]
fn zipf_theta_zero_is_uniform() {
    let reqs = gen("zipf:theta=0,wss=400KiB,requests=100000", 2);
    let counts = block_counts(&reqs, 4096);
    assert_eq!(counts.len(), 100);
    for &(_, c) in &counts {
        assert_near("block count", c as f64, 1000.0, 160.0); // ~5 sd
    }
}

#[test]
fn hotspot_80_20() {
    let reqs = gen("hotspot:wss=100MiB,requests=200000", 3);
    let hot_end = 20 << 20;
    assert_near(
        "hot share %",
        share(&reqs, |r| r.offset < hot_end),
        80.0,
        1.0,
    );
    // Uniform within each part: halves of the hot part get 40 % each, the cold part's
    // halves 10 % each.
    assert_near(
        "hot lower half %",
        share(&reqs, |r| r.offset < hot_end / 2),
        40.0,
        1.0,
    );
    let cold_mid = hot_end + (80 << 20) / 2;
    assert_near(
        "cold upper half %",
        share(&reqs, |r| r.offset >= cold_mid),
        10.0,
        1.0,
    );
    let reqs = gen(
        "hotspot:hot_io=95,hot_space=5,wss=100MiB,requests=200000",
        3,
    );
    assert_near(
        "95/5 hot share %",
        share(&reqs, |r| r.offset < 5 << 20),
        95.0,
        0.5,
    );
}

#[test]
fn read_share() {
    for (s, want) in [
        ("uniform:wss=64MiB,requests=200000,read=70", 70.0),
        ("zipf:wss=64MiB,requests=200000,read=25", 25.0),
        ("uniform:wss=64MiB,requests=200000", 70.0), // the default
    ] {
        let reqs = gen(s, 9);
        assert_near(s, share(&reqs, |r| r.is_read()), want, 1.0);
        assert!(reqs.iter().all(|r| matches!(r.op, Op::Read | Op::Write)));
    }
    assert!(gen("uniform:wss=1m,requests=5000,read=100", 1)
        .iter()
        .all(|r| r.is_read()));
    assert!(gen("uniform:wss=1m,requests=5000,read=0", 1)
        .iter()
        .all(|r| r.is_write()));
}

#[test]
fn size_distribution_weights() {
    let reqs = gen(
        "uniform:wss=64MiB,requests=200000,size=4k@60+64k@30+1m@10",
        4,
    );
    for (size, want) in [(4096, 60.0), (65536, 30.0), (1 << 20, 10.0)] {
        assert_near(
            &format!("size {size} %"),
            share(&reqs, |r| r.len == size),
            want,
            1.0,
        );
    }
    // Weights need not sum to 100.
    let reqs = gen("uniform:wss=64MiB,requests=100000,size=8k@1+16k@3", 4);
    assert_near("8k share %", share(&reqs, |r| r.len == 8192), 25.0, 1.0);
    assert!(reqs.iter().all(|r| r.len == 8192 || r.len == 16384));
}

#[test]
fn iometer_random_reads() {
    let reqs = gen("8k; 90% read; 100% random", 6);
    assert_eq!(reqs.len(), 1_000_000);
    assert!(reqs.iter().all(|r| r.len == 8192));
    assert!(reqs
        .iter()
        .all(|r| r.offset % 4096 == 0 && r.end() <= 1 << 30));
    assert_near("read %", share(&reqs, |r| r.is_read()), 90.0, 1.0);
    let continuing = reqs
        .windows(2)
        .filter(|w| w[1].offset == w[0].end())
        .count();
    assert!(
        continuing < 100,
        "{continuing} sequential continuations in a random workload"
    );
}

#[test]
fn iometer_sequential_is_strictly_sequential() {
    let wss = 1u64 << 20;
    for s in [
        "4k;100%read;0%random;wss=1MiB;requests=1000",
        "4k; 100% read; 0% random; wss=1m; requests=1000",
        "iometer:random=0,read=100,wss=1MiB,requests=1000,size=4k",
        "12k; 100% read; 0% random; wss=1MiB; requests=1000",
    ] {
        let reqs = gen(s, 1);
        assert_eq!(reqs[0].offset, 0, "{s}");
        assert!(reqs.iter().all(|r| r.is_read()));
        let mut wraps = 0;
        for w in reqs.windows(2) {
            if w[1].offset != w[0].end() {
                assert!(
                    w[1].offset == 0 && w[0].end() + w[1].len > wss,
                    "{s}: {:?} then {:?}",
                    w[0],
                    w[1]
                );
                wraps += 1;
            }
        }
        let per_pass = wss / reqs[0].len;
        assert_eq!(wraps, (reqs.len() as u64 - 1) / per_pass, "{s}");
    }
}

#[test]
fn iometer_mixed_and_aligned() {
    let reqs = gen(
        "8k; 50% read; 30% random; align 16k; wss=64MiB; requests=100000",
        2,
    );
    assert!(reqs
        .iter()
        .all(|r| r.offset % 16384 == 0 && r.end() <= 64 << 20));
    // Sequential continuation of an 8k request rounds up to the 16k alignment.
    let continuing = reqs
        .windows(2)
        .filter(|w| w[1].offset == w[0].offset + 16384)
        .count();
    assert_near(
        "sequential share %",
        100.0 * continuing as f64 / (reqs.len() - 1) as f64,
        70.0,
        1.0,
    );
    assert_near("read %", share(&reqs, |r| r.is_read()), 50.0, 1.0);
    // "X% write" and part order are accepted.
    assert_eq!(
        spec("30% random; 10% write; 8k"),
        spec("8k; 90% read; 30% random")
    );
    assert_eq!(spec("8k; 90% read; 100% random; align=8k").align, 8192);
}

#[test]
fn requests_stay_in_the_working_set() {
    let cases = [
        "uniform:wss=1000000,size=4k@5+64k@3+512k@1,requests=50000,offset=3m",
        "zipf:theta=1.1,wss=999999,size=4k@5+64k@3+512k@1,requests=50000,offset=1g",
        "zipf:theta=0.5,wss=10m,size=1m,requests=20000,align=512",
        "seq:streams=7,wss=1000000,size=4k@5+64k@3+512k@1,requests=50000,offset=8k",
        "hotspot:hot_io=70,hot_space=50,wss=1000000,size=4k@5+512k@1,requests=50000",
        "hotspot:hot_io=50,hot_space=100,wss=1m,size=4k,requests=5000",
        "50% read; 50% random; align 1k; wss=1000000; size=7k@1+300k@1; offset=5k",
        "uniform:wss=4k,size=4k,requests=100,offset=1m",
    ];
    for s in cases {
        let w = spec(s);
        let reqs: Vec<Request> = w.generate(3).collect();
        for r in &reqs {
            assert!(
                r.offset >= w.offset && r.end() <= w.offset + w.wss,
                "{s}: {r:?} outside the working set"
            );
            assert_eq!((r.offset - w.offset) % w.align, 0, "{s}: {r:?} not aligned");
        }
        // The last aligned slots are reachable (nothing is cut off at the top).
        if !s.starts_with("seq") {
            let top = reqs.iter().map(|r| r.end()).max().unwrap();
            assert!(
                top + w.size.max() + w.align > w.offset + w.wss,
                "{s}: top {top}"
            );
        }
    }
}

#[test]
fn sequential_covers_the_set_then_wraps() {
    let reqs = gen("seq:wss=1MiB,size=4k,requests=600", 1);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.offset, (i as u64 % 256) * 4096, "request {i}");
        assert_eq!(r.len, 4096);
    }
    // With a base offset, and 3 interleaved streams starting at thirds of the set.
    let reqs = gen(
        "sequential:streams=3,wss=3MiB,size=64k,requests=300,offset=1g",
        1,
    );
    for k in 0..3u64 {
        let s: Vec<u64> = reqs
            .iter()
            .skip(k as usize)
            .step_by(3)
            .map(|r| r.offset - (1 << 30))
            .collect();
        assert_eq!(s[0], k << 20, "stream {k} start");
        for w in s.windows(2) {
            assert!(
                w[1] == w[0] + 65536 || (w[1] == 0 && w[0] + 65536 == 3 << 20),
                "stream {k}: {} then {}",
                w[0],
                w[1]
            );
        }
        // 100 requests of 64k = 6.25 MiB per stream: each covers the whole set.
        let distinct: std::collections::HashSet<u64> = s.iter().copied().collect();
        assert_eq!(distinct.len(), 48);
    }
}

#[test]
fn timestamps() {
    let reqs = gen("uniform:wss=1m,requests=1000,rate=3000", 1);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.time_ns, (i as f64 * 1e9 / 3000.0).round() as u64);
    }
    assert_eq!(gen("uniform:wss=1m,requests=3", 1)[2].time_ns, 2_000_000); // 1000 IOPS
    let reqs = gen("uniform:wss=1m,requests=100000,rate=1e4,arrival=poisson", 1);
    assert_eq!(reqs[0].time_ns, 0);
    assert!(reqs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    let mean_gap = reqs.last().unwrap().time_ns as f64 / (reqs.len() - 1) as f64;
    assert_near("mean gap ns", mean_gap, 1e5, 2e3); // sd ~0.3 %
                                                    // Exponential gaps: about e^-1 of them exceed the mean.
    let long = reqs
        .windows(2)
        .filter(|w| w[1].time_ns - w[0].time_ns > 100_000)
        .count();
    assert_near(
        "long gaps %",
        100.0 * long as f64 / 99_999.0,
        100.0 / std::f64::consts::E,
        1.0,
    );
}

#[test]
fn volume_class_offset_are_carried() {
    for r in gen("zipf:wss=1m,requests=100,volume=7,class=31,offset=1g", 1) {
        assert_eq!((r.volume, r.class, r.fua), (7, 31, false));
        assert!(r.offset >= 1 << 30);
    }
}

#[test]
fn footprint_is_an_upper_bound() {
    for s in ALL_KINDS {
        let w = spec(s);
        let mut lines = std::collections::HashSet::new();
        for r in w.generate(1) {
            for b in r.offset / 4096..r.end().div_ceil(4096) {
                lines.insert(b);
            }
        }
        assert!(lines.len() as u64 * 4096 <= w.footprint_bytes(), "{s}");
        assert!(w.footprint_bytes() <= w.wss);
    }
    assert_eq!(
        spec("uniform:wss=1g,requests=10,size=8k").footprint_bytes(),
        80 << 10
    );
}

#[test]
fn accepted_number_forms() {
    for (s, want) in [
        ("4096", 4096),
        ("4k", 4096),
        ("4KiB", 4096),
        ("1m", 1 << 20),
        ("1MiB", 1 << 20),
        ("1g", 1 << 30),
        ("1GiB", 1 << 30),
        ("1.5GiB", 3 << 29),
    ] {
        assert_eq!(parse_size(s).unwrap(), want, "{s}");
        assert_eq!(
            spec(&format!("uniform:wss={s},size=512,align=512")).wss,
            want
        );
    }
    for r in ["1e6", "1_000_000", "1000000"] {
        assert_eq!(spec(&format!("uniform:requests={r}")).requests, 1_000_000);
    }
    assert_eq!(spec("zipf").kind, Kind::Zipf { theta: 1.0 });
    assert_eq!(
        spec(" Sequential : streams = 2 , ").kind,
        Kind::Sequential { streams: 2 }
    );
    assert_eq!(spec("uniform:read=12.5%").read_pct, 12.5);
}

#[test]
fn display_is_canonical_and_parses_back() {
    for s in ALL_KINDS.iter().copied().chain([
        "hotspot:hot_io=90,hot_space=10,wss=1.5GiB,size=4k@60+64k@40,arrival=poisson,rate=2.5e3",
    ]) {
        let w = spec(s);
        let text = w.to_string();
        assert_eq!(spec(&text), w, "{s} -> {text}");
    }
    assert_eq!(
        spec("8k; 90% read; 100% random").to_string(),
        "iometer:random=100,wss=1GiB,requests=1000000,read=90,size=8KiB"
    );
}

#[test]
fn parse_errors_name_the_problem() {
    let e = err("zipff:theta=1");
    assert!(
        e.contains("'zipff'") && e.contains("zipf") && e.contains("hotspot"),
        "{e}"
    );

    let e = err("zipf:thета=1");
    assert!(e.contains("unknown key") && e.contains("theta, wss"), "{e}");
    let e = err("uniform:theta=1");
    assert!(
        e.contains("'theta'") && e.contains("'uniform'") && e.contains("requests"),
        "{e}"
    );
    let e = err("seq:hot_io=5");
    assert!(e.contains("'hot_io'") && e.contains("streams"), "{e}");

    let e = err("uniform:wss=4q");
    assert!(e.contains("wss") && e.contains("'4q'"), "{e}");
    let e = err("uniform:size=4k@x+8k@1");
    assert!(e.contains("size") && e.contains("'x'"), "{e}");

    let e = err("uniform:read=150");
    assert!(
        e.contains("read") && e.contains("150") && e.contains("100"),
        "{e}"
    );
    let e = err("hotspot:hot_io=101");
    assert!(e.contains("hot_io") && e.contains("101"), "{e}");

    let e = err("uniform:requests=1.5");
    assert!(e.contains("requests") && e.contains("1.5"), "{e}");
    let e = err("zipf:theta=abc");
    assert!(e.contains("theta") && e.contains("abc"), "{e}");
    let e = err("uniform:wss=1m,size=2m");
    assert!(e.contains("2MiB") && e.contains("wss=1MiB"), "{e}");
    let e = err("uniform:wss=1m,wss=2m");
    assert!(e.contains("'wss'") && e.contains("twice"), "{e}");
    let e = err("uniform:wss");
    assert!(e.contains("'wss'") && e.contains("key=value"), "{e}");
    let e = err("uniform:class=32");
    assert!(e.contains("class") && e.contains("31"), "{e}");
    let e = err("uniform:arrival=bursty");
    assert!(e.contains("bursty") && e.contains("poisson"), "{e}");
    let e = err("uniform:rate=0");
    assert!(e.contains("rate"), "{e}");
    let e = err("seq:streams=0");
    assert!(e.contains("streams"), "{e}");
    let e = err("8k; 90% read; 100% randomly");
    assert!(
        e.contains("100% randomly") && e.contains("access spec"),
        "{e}"
    );
    let e = err("8k; 190% read; 100% random");
    assert!(e.contains("read") && e.contains("190"), "{e}");
    let e = err("8k; 90% read; 100% random; foo=1");
    assert!(e.contains("'foo'") && e.contains("random, wss"), "{e}");

    assert!(matches!(
        "nope".parse::<WorkloadSpec>(),
        Err(WorkloadError::UnknownKind { .. })
    ));
}

#[test]
fn help_examples_parse() {
    let text = help();
    for kind in [
        "uniform",
        "zipf",
        "seq",
        "hotspot",
        "iometer",
        "wss=",
        "size=4k@60",
    ] {
        assert!(text.contains(kind), "{kind}");
    }
    let examples: Vec<&str> = text
        .split("Examples:")
        .nth(1)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(examples.len() >= 5);
    for e in examples {
        spec(e);
    }
}

/// Share (percent) of the requests after the first that start exactly where the request
/// before them ended: how a trace's "sequential share" is counted from the trace alone.
fn sequential_share(reqs: &[Request]) -> f64 {
    let seq = reqs
        .windows(2)
        .filter(|w| w[1].offset == w[0].offset + w[0].len)
        .count();
    100.0 * seq as f64 / (reqs.len() - 1) as f64
}

#[test]
fn hotspot_sequential_share_is_the_requested_one() {
    // The Storage Bench (seed 003) trace's 42 % sequential, its sizes (4 KiB-aligned, so a
    // continuation lands exactly at the previous end) and a hot set.
    let base = "hot_io=85,hot_space=5,wss=8GiB,read=55,size=4k@28+8k@9+16k@10+32k@10+64k@4+128k@39";
    for want in [42.0, 10.0, 75.0] {
        let reqs = gen(&format!("hotspot:{base},seq={want},requests=200000"), 7);
        let got = sequential_share(&reqs);
        assert_near(&format!("sequential share % at seq={want}"), got, want, 2.0);
        assert!(reqs.iter().all(|r| r.end() <= 8 << 30));
    }
    // Control: without `seq` the same hotspot has (almost) no sequential requests, so the
    // share above comes from the continuation rule.
    let plain = gen(&format!("hotspot:{base},requests=200000"), 7);
    assert!(
        sequential_share(&plain) < 1.0,
        "{}",
        sequential_share(&plain)
    );
    // seq=0 is the plain stream (no extra draw), and the non-sequential requests still
    // follow the hotspot rule: 85 % of them in the hot 5 %.
    assert_eq!(
        gen(&format!("hotspot:{base},seq=0,requests=2000"), 7),
        plain[..2000]
    );
    let reqs = gen(&format!("hotspot:{base},seq=42,requests=200000"), 7);
    let placed: Vec<Request> = reqs
        .windows(2)
        .filter(|w| w[1].offset != w[0].offset + w[0].len)
        .map(|w| w[1])
        .collect();
    let hot_end = (8u64 << 30) / 20;
    assert_near(
        "hot share % of the placed requests",
        share(&placed, |r| r.offset < hot_end),
        85.0,
        1.5,
    );
    // Reproducible: same seed, same stream.
    assert_eq!(
        gen(&format!("hotspot:{base},seq=42,requests=5000"), 7),
        reqs[..5000]
    );
}
