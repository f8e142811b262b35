//! The engine's default chunk-rewrite crossover is the 7200 rpm model's, not a magic number.

use tiercache_devices::{rewrite_min_runs, HddConfig};
use tiercache_engine::{DEFAULT_REWRITE_CHUNK, DEFAULT_REWRITE_MIN_RUNS};

#[test]
fn default_crossover_is_the_7200_models() {
    let model = rewrite_min_runs(&HddConfig::default(), DEFAULT_REWRITE_CHUNK, 4096);
    assert_eq!(
        DEFAULT_REWRITE_MIN_RUNS, model,
        "update DEFAULT_REWRITE_MIN_RUNS to the model's crossover"
    );
}

/// The issue-20 flush on the timed model: 11,987 dirty 4 KiB lines scattered over 1 GiB on the
/// 7200 rpm model, flushed with today's LBA-ordered write-backs and with chunk rewrites,
/// against the sequential bound (read + write 1 GiB at the model's outer-edge rate).
#[test]
fn scattered_flush_runs_near_the_sequential_bound() {
    use rand::{seq::index::sample, SeedableRng};
    use tiercache_devices::{Checked, Hdd};
    use tiercache_engine::{Engine, EngineConfig, Mode, Op, Request};
    let gib = 1u64 << 30;
    let lines = sample(
        &mut rand_chacha::ChaCha8Rng::seed_from_u64(1),
        (gib / 4096) as usize,
        11_987,
    );
    let time = |chunk: u64| {
        let mut e = Engine::new(EngineConfig {
            capacity_lines: 65_536,
            mode: Mode::WriteBack,
            volume_bytes: Some(gib),
            rewrite_chunk: chunk,
            ..Default::default()
        })
        .unwrap();
        for (i, l) in lines.iter().enumerate() {
            e.process(&Request::new(i as u64, Op::Write, l as u64 * 4096, 4096))
                .unwrap();
        }
        let mut hdd = Checked::new(Hdd::new(HddConfig::default()).unwrap());
        tiercache_sim::timed::flush_time(&mut e, &mut hdd, None)
    };
    let bound = 2.0 * gib as f64 / (HddConfig::default().rate_outer_mb_s * 1e6);
    let (before, after) = (time(0), time(DEFAULT_REWRITE_CHUNK));
    println!(
        "flush of 11987 scattered lines: {before:.1} s LBA-ordered, {after:.1} s with chunk rewrites; sequential bound {bound:.1} s ({:.2}x)",
        after / bound
    );
    assert!(after < before, "{after} >= {before}");
    assert!(after <= 1.5 * bound, "{after} s > 1.5 x {bound} s");
}
