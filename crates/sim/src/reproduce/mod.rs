//! `tiercache reproduce`: re-runs a seed document's experiment with our simulator and sets our
//! figures beside the published ones, with a one-line verdict. One file per experiment; the
//! settings are checked in under `experiments/reproduce/` (built in, or given as a file).

pub mod dss;
pub mod nitro;
pub mod qsan;
pub mod srt;
pub mod storage_bench;

use crate::experiment::CacheSection;
use crate::{Input, SimSpec, TimedReport, TimedSetup};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The experiments, by name.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "srt",
        "SRT study: SSD size sweep, write-through vs write-back, FIFO vs LIFO vs S-LRU",
    ),
    (
        "qsan",
        "Qsan: warm-up estimate vs simulated warm-up, IOPS before and after (test cases 1, 2)",
    ),
    (
        "storage-bench",
        "Storage Bench 2011: HDD alone vs HDD + small SSD cache vs SSD alone",
    ),
    (
        "dss",
        "DSS: Tables 3 and 4, no cache vs LRU vs DSS on 7200 and 15K RPM RAID 5, 10 % cache",
    ),
    (
        "nitro",
        "Nitro: (ND,NC) (ND,C) (D,NC) (D,C), extent vs WEU caching, read-hit ratio and erasures",
    ),
];

/// A line of the comparison table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub what: String,
    pub ours: String,
    pub published: String,
    /// This row's own one-line verdict (empty: the outcome's verdict covers it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub verdict: String,
}

/// A plot of our results.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Line series (name, points); empty for a bar chart.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// Bars (name, value); empty for a line chart.
    pub bars: Vec<(String, f64)>,
    /// Vertical markers on a line chart (label, x), e.g. a formula's estimate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub markers: Vec<(String, f64)>,
}

/// What one experiment found.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub name: String,
    pub title: String,
    /// The seed document the published figures come from.
    pub source: String,
    pub rows: Vec<Row>,
    pub plots: Vec<Plot>,
    /// One line: same direction, similar magnitude, or different and why.
    pub verdict: String,
    /// Settings used (the TOML text).
    pub config: String,
    /// The seed's headline claims, each with our number and whether it holds.
    pub claims: Vec<Claim>,
}

/// How our number is judged against the seed's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sense {
    /// On the same side of `neutral` as the seed (unless the seed is `neutral` itself) and
    /// within `tolerance` of it.
    Within,
    /// At most `seed + tolerance` (a bound, e.g. an error or "no faster than").
    AtMost,
    /// At least `seed - tolerance` (e.g. "orders of magnitude more").
    AtLeast,
}

/// A headline claim of a seed, as its experiment defines it (one table per seed).
#[derive(Clone, Copy, Debug)]
pub struct ClaimDef {
    pub id: &'static str,
    pub text: &'static str,
    pub seed: f64,
    pub unit: &'static str,
    pub sense: Sense,
    /// Absolute, in `unit`.
    pub tolerance: f64,
    /// The value that means "no effect" (1 for ratios, 0 for changes): the direction of a
    /// claim is the side of it the value lies on.
    pub neutral: f64,
    /// Where ours comes from and what we know differs from the seed, said when the claim does
    /// not hold (the reason, not a restatement of the numbers).
    pub gap: &'static str,
}

/// A claim with our number (`tiercache reproduce --json`, the `claims` array).
#[derive(Clone, Debug, Serialize)]
pub struct Claim {
    pub id: String,
    pub text: String,
    pub seed: f64,
    /// None: not computed (the run it needs does not exist); `why` says what is missing.
    pub ours: Option<f64>,
    pub unit: String,
    pub sense: Sense,
    pub tolerance: f64,
    pub neutral: f64,
    pub holds: bool,
    /// One sentence where the claim does not hold; None where it holds.
    pub why: Option<String>,
    /// Which of our runs `ours` comes from.
    pub basis: String,
}

/// Whether `ours` holds against `seed` under `sense` (the rule the `claims` array states).
pub fn claim_holds(sense: Sense, seed: f64, ours: f64, tolerance: f64, neutral: f64) -> bool {
    if !ours.is_finite() {
        return false;
    }
    match sense {
        Sense::AtMost => ours <= seed + tolerance,
        Sense::AtLeast => ours >= seed - tolerance,
        Sense::Within => {
            let side = |x: f64| (x - neutral).partial_cmp(&0.0).map(|o| o as i8);
            (seed == neutral || side(ours) == side(seed)) && (ours - seed).abs() <= tolerance
        }
    }
}

/// Our number for one claim: the value (None = not computed), the run it comes from, and a
/// reason that replaces the claim's `gap` (e.g. what is missing).
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub ours: Option<f64>,
    pub basis: String,
    pub why: Option<String>,
}

impl Measured {
    pub fn value(ours: f64, basis: impl Into<String>) -> Self {
        Measured {
            ours: Some(ours),
            basis: basis.into(),
            why: None,
        }
    }
    pub fn missing(why: impl Into<String>) -> Self {
        Measured {
            ours: None,
            basis: "-".into(),
            why: Some(why.into()),
        }
    }
}

/// A claim's number as the tables print it (3 significant-ish digits, exponent below 0.01).
pub fn short_num(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("{v:.2e}")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One claim per entry of `defs`, in its order, with ours from `measured` (by id); a claim
/// without a measurement gets `ours: None`, never dropped.
pub fn claims(defs: &[ClaimDef], mut measured: Vec<(&str, Measured)>) -> Vec<Claim> {
    for (id, _) in &measured {
        debug_assert!(
            defs.iter().any(|d| d.id == *id),
            "measured claim {id} has no definition"
        );
    }
    defs.iter()
        .map(|d| {
            let m = measured
                .iter()
                .position(|(id, _)| *id == d.id)
                .map(|i| measured.swap_remove(i).1)
                .unwrap_or_else(|| Measured::missing("no run of this experiment computes it"));
            let holds = m
                .ours
                .is_some_and(|o| claim_holds(d.sense, d.seed, o, d.tolerance, d.neutral));
            let why = (!holds).then(|| match m.ours {
                None => format!(
                    "Not computed: {}.",
                    m.why.as_deref().unwrap_or("no run computes it")
                ),
                Some(o) => {
                    let fact = match d.sense {
                        Sense::AtMost => {
                            format!("is above the bound {}", short_num(d.seed + d.tolerance))
                        }
                        Sense::AtLeast => {
                            format!("is below the bound {}", short_num(d.seed - d.tolerance))
                        }
                        Sense::Within => {
                            let side = |x: f64| x > d.neutral;
                            let band =
                                format!("{} +- {}", short_num(d.seed), short_num(d.tolerance));
                            if d.seed == d.neutral {
                                format!("is outside {band}")
                            } else if o == d.neutral {
                                "shows no effect at all".to_string()
                            } else if side(o) != side(d.seed) {
                                "is in the opposite direction".to_string()
                            } else {
                                format!("is in the seed's direction but outside {band}")
                            }
                        }
                    };
                    format!(
                        "Ours {} {fact}: {}.",
                        short_num(o),
                        m.why.as_deref().unwrap_or(d.gap).trim_end_matches('.')
                    )
                }
            });
            Claim {
                id: d.id.into(),
                text: d.text.into(),
                seed: d.seed,
                ours: m.ours,
                unit: d.unit.into(),
                sense: d.sense,
                tolerance: d.tolerance,
                neutral: d.neutral,
                holds,
                why,
                basis: m.basis,
            }
        })
        .collect()
}

/// The claims as a Markdown table (claim, seed, ours, holds, why).
pub fn claims_markdown(claims: &[Claim]) -> String {
    let mut s = String::from("| claim | seed | ours | holds | why |\n|---|--:|--:|:-:|---|\n");
    for c in claims {
        let cell = |t: &str| t.replace('|', "\\|");
        let bound = match c.sense {
            Sense::Within => format!("+- {}", short_num(c.tolerance)),
            Sense::AtMost => format!("holds <= {}", short_num(c.seed + c.tolerance)),
            Sense::AtLeast => format!("holds >= {}", short_num(c.seed - c.tolerance)),
        };
        s.push_str(&format!(
            "| `{}`: {} ({}) | {} ({bound}) | {} | {} | {} |\n",
            c.id,
            cell(&c.text),
            cell(&c.unit),
            short_num(c.seed),
            c.ours.map(short_num).unwrap_or_else(|| "-".into()),
            if c.holds { "yes" } else { "**no**" },
            cell(c.why.as_deref().unwrap_or(""))
        ));
    }
    s
}

/// Runs experiment `name` with the built-in settings or `config` (TOML text); `requests`
/// overrides the request count (smaller = faster, less faithful).
pub fn run(name: &str, config: Option<&str>, requests: Option<u64>) -> Result<Outcome> {
    match name {
        "srt" => srt::run(config.unwrap_or(srt::CONFIG), requests),
        "qsan" => qsan::run(config.unwrap_or(qsan::CONFIG), requests),
        "storage-bench" => storage_bench::run(config.unwrap_or(storage_bench::CONFIG), requests),
        "dss" => dss::run(config.unwrap_or(dss::CONFIG), requests),
        "nitro" => nitro::run(config.unwrap_or(nitro::CONFIG), requests),
        other => anyhow::bail!(
            "no reproduction called '{other}'; known: {}",
            EXPERIMENTS
                .iter()
                .map(|e| e.0)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub(crate) fn parse<T: for<'de> Deserialize<'de>>(name: &str, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{name} settings: {e}"))
}

/// The synthetic input of a reproduction: `workload` plus `,requests=N`.
pub(crate) fn workload(spec: &str, requests: u64, seed: u64) -> Result<Input> {
    let full = format!("{spec},requests={requests}");
    Ok(Input::Workload {
        spec: full
            .parse()
            .map_err(|e| anyhow::anyhow!("workload '{full}': {e}"))?,
        seed,
    })
}

/// One timed run: `cache` settings over `input`, on `hdd` with `ssd` (None = no cache).
pub(crate) fn timed(
    input: &Input,
    cache: CacheSection,
    hdd: &str,
    ssd: Option<&str>,
    queue_depth: u32,
    seed: u64,
) -> Result<TimedReport> {
    let (cache_size, engine) = cache.resolve(seed)?;
    let spec = SimSpec {
        input: input.clone(),
        cache_size,
        engine,
        log: cache.log_spec(seed)?,
    };
    let mut setup = TimedSetup {
        hdd: hdd.to_string(),
        ssd: ssd.map(str::to_string),
        ..TimedSetup::default()
    };
    setup.options.drive = crate::Drive::Closed { queue_depth };
    crate::run_timed(&spec, &setup, None).with_context(|| format!("timed run on {hdd}"))
}

/// How a measured ratio (1 = no change) compares with the published one: "same direction,
/// similar magnitude" (within 1.5x of each other's gain), "same direction, larger/smaller
/// magnitude", or "different direction". Ratios within `flat` of 1 count as no change.
pub(crate) fn compare_ratio(ours: f64, published: f64, flat: f64) -> &'static str {
    let dir = |x: f64| {
        if (x - 1.0).abs() <= flat {
            0
        } else if x > 1.0 {
            1
        } else {
            -1
        }
    };
    match (dir(ours), dir(published)) {
        (0, 0) => "same (no change in both)",
        (a, b) if a != b => "different direction",
        _ => {
            // Compare the size of the effect on a log scale.
            let (a, b) = (ours.ln().abs(), published.ln().abs());
            if a > b * 1.5 {
                "same direction, larger magnitude"
            } else if b > a * 1.5 {
                "same direction, smaller magnitude"
            } else {
                "same direction, similar magnitude"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_holds, claims, compare_ratio, ClaimDef, Measured, Sense};

    #[test]
    fn claim_rules() {
        // Within: same side of neutral and within the tolerance.
        assert!(claim_holds(Sense::Within, 2.19, 2.0, 0.55, 1.0));
        assert!(!claim_holds(Sense::Within, 2.19, 1.12, 0.55, 1.0));
        assert!(
            !claim_holds(Sense::Within, 1.2, 0.9, 0.4, 1.0),
            "opposite side"
        );
        assert!(
            !claim_holds(Sense::Within, -0.66, 0.1, 0.8, 0.0),
            "opposite side"
        );
        assert!(
            claim_holds(Sense::Within, 1.0, 0.95, 0.1, 1.0),
            "no direction at neutral"
        );
        assert!(claim_holds(Sense::AtMost, 0.0, 0.04, 0.05, 0.0));
        assert!(!claim_holds(Sense::AtMost, 0.0, 0.10, 0.05, 0.0));
        assert!(claim_holds(Sense::AtLeast, 100.0, 250.0, 0.0, 1.0));
        assert!(!claim_holds(Sense::AtLeast, 100.0, 1.6, 0.0, 1.0));
        assert!(!claim_holds(Sense::Within, 1.0, f64::NAN, 0.1, 1.0));
    }

    #[test]
    fn claims_keep_every_definition_and_say_why() {
        const DEFS: &[ClaimDef] = &[
            ClaimDef {
                id: "x.a",
                text: "a",
                seed: 2.0,
                unit: "x",
                sense: Sense::Within,
                tolerance: 0.5,
                neutral: 1.0,
                gap: "the workload differs",
            },
            ClaimDef {
                id: "x.b",
                text: "b",
                seed: 2.0,
                unit: "x",
                sense: Sense::Within,
                tolerance: 0.5,
                neutral: 1.0,
                gap: "-",
            },
        ];
        let c = claims(DEFS, vec![("x.a", Measured::value(0.8, "run"))]);
        assert_eq!(c.len(), 2);
        assert!(!c[0].holds);
        let why = c[0].why.as_deref().unwrap();
        assert!(
            why.contains("opposite direction") && why.contains("the workload differs"),
            "{why}"
        );
        assert_eq!(c[1].ours, None);
        assert!(!c[1].holds && c[1].why.as_deref().unwrap().starts_with("Not computed"));
        let c = claims(DEFS, vec![("x.a", Measured::value(2.2, "run"))]);
        assert!(c[0].holds && c[0].why.is_none());
    }

    #[test]
    fn ratio_verdicts() {
        assert_eq!(
            compare_ratio(2.0, 2.17, 0.05),
            "same direction, similar magnitude"
        );
        assert_eq!(
            compare_ratio(1.18, 2.17, 0.05),
            "same direction, smaller magnitude"
        );
        assert_eq!(
            compare_ratio(16.0, 5.4, 0.05),
            "same direction, larger magnitude"
        );
        assert_eq!(compare_ratio(0.8, 2.0, 0.05), "different direction");
        assert_eq!(compare_ratio(1.11, 0.99, 0.05), "different direction");
        assert_eq!(compare_ratio(1.02, 0.99, 0.05), "same (no change in both)");
    }
}
