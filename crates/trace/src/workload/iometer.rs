//! IOmeter-style access specs: `8k; 90% read; 100% random`, `4k;100%read;0%random`,
//! `64k; 30% read; 50% random; align 64k; wss=8GiB`.
//!
//! A `random` share of requests go to uniformly random aligned offsets; the others continue
//! where the previous request ended (rounded up to the alignment), wrapping to the start of
//! the working set when the request would cross its end. The first request is at offset 0
//! unless it is a random one.

use super::{Kind, Space, WorkloadError, WorkloadSpec};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub(crate) struct Iometer {
    space: Space,
    random_frac: f64,
    /// Where the previous request ended (relative).
    end: u64,
}

impl Iometer {
    pub fn new(space: Space, random_pct: f64) -> Self {
        Iometer {
            space,
            random_frac: random_pct / 100.0,
            end: 0,
        }
    }

    #[inline]
    pub fn next(&mut self, len: u64, rng: &mut ChaCha8Rng) -> u64 {
        let random = if self.random_frac >= 1.0 {
            true
        } else if self.random_frac <= 0.0 {
            false
        } else {
            rng.gen::<f64>() < self.random_frac
        };
        let o = if random {
            rng.gen_range(0..=self.space.max_slot(len)) * self.space.align
        } else {
            let o = self.space.round_up(self.end);
            if o + len > self.space.wss {
                0
            } else {
                o
            }
        };
        self.end = o + len;
        o
    }
}

const PARTS_HINT: &str = "an access spec is SIZE; R% read; X% random[; align A][; key=value...], \
                          e.g. '8k; 90% read; 100% random'";

/// Parses the `;`-separated form. Parts are recognised by their words, so their order does
/// not matter: `... read` / `... write`, `... random` / `... sequential`, `align ...`,
/// `key=value` (any common key) and a bare size (or size distribution). Missing parts take
/// the defaults (4k, 70% read, 100% random).
pub(crate) fn parse_access_spec(s: &str) -> Result<WorkloadSpec, WorkloadError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let strip_word = |part: &str, words: &[&str]| -> Option<String> {
        let lower = part.to_ascii_lowercase();
        words
            .iter()
            .find_map(|w| lower.strip_suffix(w).map(|rest| rest.trim().to_string()))
    };
    let pct = |key: &str, v: &str| {
        super::parse_percent(v).map_err(|why| WorkloadError::BadValue {
            key: key.to_string(),
            why: format!("{why} ({PARTS_HINT})"),
        })
    };
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let lower = part.to_ascii_lowercase();
        if let Some((k, v)) = part.split_once('=').filter(|(k, _)| k.trim() != "align") {
            pairs.push((k.trim().to_string(), v.trim().to_string()));
        } else if let Some(rest) = lower.strip_prefix("align") {
            let v = rest.trim().trim_start_matches('=').trim();
            pairs.push(("align".into(), v.to_string()));
        } else if let Some(v) = strip_word(part, &["read", "reads"]) {
            pairs.push(("read".into(), pct("read", &v)?.to_string()));
        } else if let Some(v) = strip_word(part, &["write", "writes"]) {
            pairs.push(("read".into(), (100.0 - pct("read", &v)?).to_string()));
        } else if let Some(v) = strip_word(part, &["random"]) {
            pairs.push(("random".into(), pct("random", &v)?.to_string()));
        } else if let Some(v) = strip_word(part, &["sequential", "seq"]) {
            pairs.push(("random".into(), (100.0 - pct("random", &v)?).to_string()));
        } else if part.starts_with(|c: char| c.is_ascii_digit()) && !part.contains('%') {
            pairs.push(("size".into(), part.to_string()));
        } else {
            return Err(WorkloadError::Syntax {
                part: part.to_string(),
                hint: " or a part of an IOmeter access spec (SIZE; R% read; X% random[; align A], \
                       e.g. '8k; 90% read; 100% random')",
            });
        }
    }
    WorkloadSpec::from_pairs(Kind::Iometer { random: 100.0 }, &pairs)
}
