//! The write-back rate controller (bcache's PD controller is the anchor): the rate at which
//! a background cleaner writes back, from the distance of the dirty share from a target
//! (proportional term) and how fast that distance changes (derivative term, damping it).
//! Pure arithmetic: the driver passes the dirty count and the elapsed time in (the engine
//! reads no clock), and spends the rate as a budget of lines.
//!
//! With `e` the dirty lines above the target and `w` the foreground's dirtying rate, the
//! cleaner writes `r = e / p + d * de/dt` lines/s (at least `min_rate` while `e > 0`, at most
//! `max_rate`, 0 at or below the target: dirty data below it is what makes write-back fast).
//! Since `de/dt = w - r`, `r = (e/p + d w) / (1 + d)`: the distance decays with time constant
//! `p (1 + d)` to the offset `w p`, without overshoot as long as an update's step `dt` is
//! below `p (1 + d)` (tests/rate.rs checks the step response).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The `--writeback-rate` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WritebackRate {
    /// No rate-controlled cleaning: only the watermarks (`dirty_high`/`dirty_low`).
    #[default]
    Off,
    /// The PD controller decides (see the module doc).
    Auto,
    /// A fixed rate in lines/s while the dirty share is above the target.
    Fixed(f64),
}

impl fmt::Display for WritebackRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WritebackRate::Off => f.write_str("off"),
            WritebackRate::Auto => f.write_str("auto"),
            WritebackRate::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for WritebackRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(WritebackRate::Off),
            "auto" => Ok(WritebackRate::Auto),
            t => t
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(WritebackRate::Fixed)
                .ok_or_else(|| {
                    format!(
                        "write-back rate '{s}': give auto (the PD controller), off (watermarks \
                         only) or lines per second, e.g. 500"
                    )
                }),
        }
    }
}

/// The controller's state and gains.
#[derive(Clone, Debug, PartialEq)]
pub struct RateController {
    pub mode: WritebackRate,
    /// Dirty share the controller holds (0..=1).
    pub target: f64,
    /// Proportional term: the rate is the distance (lines) over this many seconds (bcache's
    /// `writeback_rate_p_term_inverse`).
    pub p_term_inverse: f64,
    /// Derivative term, seconds: how much of the distance's rate of change is added.
    pub d_term: f64,
    /// Lines/s while above the target (bcache's `writeback_rate_minimum`).
    pub min_rate: f64,
    /// Lines/s at most: bounds the disk time taken from the foreground (400: about half of
    /// what a 7200 rpm disk writes back scattered, scripts/bench_flush.sh).
    pub max_rate: f64,
    last: Option<f64>,
    rate: f64,
}

/// Default target dirty share.
pub const DEFAULT_TARGET: f64 = 0.5;

impl Default for RateController {
    fn default() -> Self {
        RateController {
            mode: WritebackRate::Off,
            target: DEFAULT_TARGET,
            p_term_inverse: 5.0,
            d_term: 1.0,
            min_rate: 8.0,
            max_rate: 400.0,
            last: None,
            rate: 0.0,
        }
    }
}

impl RateController {
    pub fn new(mode: WritebackRate, target: f64) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&target) {
            return Err(format!(
                "write-back target {target} must be a dirty share between 0 and 1"
            ));
        }
        Ok(RateController {
            mode,
            target,
            ..Default::default()
        })
    }

    /// The rate (lines/s) after `dt_s` seconds in which the cache went to `dirty` of
    /// `capacity` lines. 0 when off or at/below the target.
    pub fn update(&mut self, dirty: u64, capacity: u64, dt_s: f64) -> f64 {
        let e = dirty as f64 - self.target * capacity as f64;
        let de = match self.last {
            Some(l) if dt_s > 0.0 => (e - l) / dt_s,
            _ => 0.0,
        };
        self.last = Some(e);
        self.rate = if e <= 0.0 {
            0.0
        } else {
            match self.mode {
                WritebackRate::Off => 0.0,
                WritebackRate::Fixed(r) => r,
                WritebackRate::Auto => (e / self.p_term_inverse + self.d_term * de)
                    .clamp(self.min_rate, self.max_rate)
                    .min(e.ceil().max(1.0) / dt_s.max(1e-3)),
            }
        };
        self.rate
    }

    /// The rate the last update gave.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}
