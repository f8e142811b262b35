//! The write-back rate controller: step response on a simulated cache (dirty lines grow at
//! the foreground's rate and fall at the controller's).

use tiercache_engine::{RateController, WritebackRate};

/// Runs `secs` seconds in steps of `dt` from `start` dirty lines of `cap`, the foreground
/// dirtying `w(t)` lines/s; returns the dirty share after each step.
fn run(
    c: &mut RateController,
    cap: u64,
    start: u64,
    secs: f64,
    dt: f64,
    w: impl Fn(f64) -> f64,
) -> Vec<f64> {
    let (mut dirty, mut t, mut out, mut budget) = (start as f64, 0.0, Vec::new(), 0.0);
    while t < secs {
        let r = c.update(dirty as u64, cap, dt);
        budget += r * dt;
        let cleaned = budget.floor().min(dirty);
        budget -= cleaned;
        dirty = (dirty + w(t) * dt - cleaned).clamp(0.0, cap as f64);
        out.push(dirty / cap as f64);
        t += dt;
    }
    out
}

#[test]
fn step_response_converges_without_oscillation() {
    let cap = 100_000;
    for dt in [0.02, 0.1, 0.5] {
        let mut c = RateController::new(WritebackRate::Auto, 0.5).unwrap();
        // The dynamics, not the default bound (400 lines/s, for a disk).
        c.max_rate = 2000.0;
        // From 90 % dirty, foreground dirtying 300 lines/s: the share falls to the target
        // plus the PD offset (w * p_term_inverse = 1500 lines = 1.5 %) and stays there.
        let s = run(&mut c, cap, 90_000, 120.0, dt, |_| 300.0);
        let last = *s.last().unwrap();
        assert!((last - 0.5).abs() < 0.02, "dt {dt}: ends at {last}");
        // Never below the target by more than a step's worth, and monotone on the way down
        // (no oscillation beyond 0.2 % of the capacity).
        let min = s.iter().cloned().fold(1.0, f64::min);
        assert!(min > 0.5 - 0.005, "dt {dt}: undershoots to {min}");
        let ups = s.windows(2).filter(|w| w[1] > w[0] + 0.002).count();
        assert_eq!(ups, 0, "dt {dt}: the share rose again {ups} times");
        // Within the first 60 s it has closed 90 % of the distance.
        let at60 = s[(60.0 / dt) as usize];
        assert!(at60 < 0.5 + 0.04 + 0.015, "dt {dt}: {at60} after 60 s");
    }
}

#[test]
fn the_rate_is_bounded_and_zero_at_the_target() {
    let mut c = RateController::new(WritebackRate::Auto, 0.5).unwrap();
    assert_eq!(
        c.update(40_000, 100_000, 0.1),
        0.0,
        "below the target: no cleaning"
    );
    let r = c.update(100_000, 100_000, 0.1);
    assert_eq!(r, c.max_rate, "all dirty: the maximum, not more");
    let r = c.update(50_001, 100_000, 0.1);
    assert!(
        (0.0..=10.0).contains(&r),
        "one line above: at most that line per step ({r})"
    );
    let mut f = RateController::new("250".parse().unwrap(), 0.5).unwrap();
    assert_eq!(f.update(60_000, 100_000, 0.1), 250.0);
    let mut off = RateController::new(WritebackRate::Off, 0.5).unwrap();
    assert_eq!(off.update(100_000, 100_000, 0.1), 0.0);
    assert!("fast"
        .parse::<WritebackRate>()
        .unwrap_err()
        .contains("auto"));
    assert!(RateController::new(WritebackRate::Auto, 1.5).is_err());
}

#[test]
fn a_burst_is_absorbed_then_drained() {
    // Foreground writes 3000 lines/s for 10 s, then stops: the share rises above the target
    // (the controller is bounded by max_rate) and then falls back to it.
    let mut c = RateController::new(WritebackRate::Auto, 0.3).unwrap();
    c.max_rate = 2000.0;
    let s = run(&mut c, 100_000, 30_000, 120.0, 0.1, |t| {
        if t < 10.0 {
            3000.0
        } else {
            0.0
        }
    });
    let peak = s.iter().cloned().fold(0.0, f64::max);
    assert!(peak > 0.3 && peak < 0.3 + 0.3, "peak {peak}");
    let last = *s.last().unwrap();
    assert!((last - 0.3).abs() < 0.005, "ends at {last}");
}
