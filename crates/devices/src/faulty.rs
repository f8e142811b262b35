//! Fault injection around any [`Device`]: seeded per-kind error probabilities, "fail the Nth
//! operation", and latency spikes.
//!
//! Every op still goes to the inner device and takes its time (a failing disk still spends
//! the time trying); only its result is replaced. Decisions are drawn when an op is
//! submitted, two draws per op whatever the settings, so the faults of op N depend only on
//! the seed and N.

use crate::checked::{Done, Model};
use crate::{Completion, Device, DeviceError, IoKind, IoOp};
use hashbrown::HashMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What to inject. All off by default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    pub seed: u64,
    /// Probability that a read fails.
    pub read_error_prob: f64,
    pub write_error_prob: f64,
    pub flush_error_prob: f64,
    pub trim_error_prob: f64,
    /// Fail exactly the Nth op submitted (1-based), counting all ops, or only writes when
    /// `fail_nth_writes_only`.
    pub fail_nth: Option<u64>,
    pub fail_nth_writes_only: bool,
    /// Probability that an op's completion is delayed by `spike_ns`.
    pub spike_prob: f64,
    pub spike_ns: u64,
}

impl FaultConfig {
    /// The same error probability for every kind.
    pub fn with_error_prob(mut self, p: f64) -> Self {
        self.read_error_prob = p;
        self.write_error_prob = p;
        self.flush_error_prob = p;
        self.trim_error_prob = p;
        self
    }

    fn error_prob(&self, k: IoKind) -> f64 {
        match k {
            IoKind::Read => self.read_error_prob,
            IoKind::Write => self.write_error_prob,
            IoKind::Flush => self.flush_error_prob,
            IoKind::Trim => self.trim_error_prob,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        for p in [
            self.read_error_prob,
            self.write_error_prob,
            self.flush_error_prob,
            self.trim_error_prob,
            self.spike_prob,
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("fault probabilities must be in [0, 1], got {p}"));
            }
        }
        if self.fail_nth == Some(0) {
            return Err("fail_nth is 1-based".into());
        }
        Ok(())
    }
}

struct Decision {
    error: Option<DeviceError>,
    spike_ns: u64,
}

/// The fault-injecting wrapper. Use it through [`crate::Checked`]:
/// `Checked::new(Faulty::new(inner, cfg)?)`.
pub struct Faulty<D: Device> {
    inner: D,
    cfg: FaultConfig,
    name: String,
    rng: ChaCha8Rng,
    submitted: u64,
    writes: u64,
    decisions: HashMap<u64, Decision>,
    /// Spiked completions waiting: (time, tag) -> result.
    delayed: BTreeMap<(u64, u64), Result<(), DeviceError>>,
    buf: Vec<Completion>,
    injected: u64,
}

impl<D: Device> Faulty<D> {
    pub fn new(inner: D, cfg: FaultConfig) -> Result<Self, String> {
        cfg.validate()?;
        Ok(Faulty {
            name: format!("faulty:{}", inner.name()),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            inner,
            cfg,
            submitted: 0,
            writes: 0,
            decisions: HashMap::new(),
            delayed: BTreeMap::new(),
            buf: Vec::new(),
            injected: 0,
        })
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Errors injected so far (counted at submission).
    pub fn injected(&self) -> u64 {
        self.injected
    }
}

impl<D: Device> Model for Faulty<D> {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp) {
        self.submitted += 1;
        if op.kind == IoKind::Write {
            self.writes += 1;
        }
        let nth = match self.cfg.fail_nth {
            Some(n) if self.cfg.fail_nth_writes_only => {
                op.kind == IoKind::Write && self.writes == n
            }
            Some(n) => self.submitted == n,
            None => false,
        };
        let (u_err, u_spike): (f64, f64) = (self.rng.gen(), self.rng.gen());
        let error =
            (nth || u_err < self.cfg.error_prob(op.kind)).then_some(DeviceError::Injected {
                kind: op.kind,
                nth: self.submitted,
            });
        self.injected += error.is_some() as u64;
        let spike_ns = if u_spike < self.cfg.spike_prob {
            self.cfg.spike_ns
        } else {
            0
        };
        self.decisions.insert(tag, Decision { error, spike_ns });
        self.inner.submit(now_ns, tag, *op);
    }

    fn next_event(&self) -> Option<u64> {
        let d = self.delayed.keys().next().map(|&(t, _)| t);
        match (d, self.inner.next_completion()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        let mut buf = std::mem::take(&mut self.buf);
        self.inner.advance(now_ns, &mut buf);
        for c in buf.drain(..) {
            let d = self
                .decisions
                .remove(&c.id)
                .expect("decision for inner completion");
            let result = match d.error {
                Some(e) => Err(e),
                None => c.result,
            };
            self.delayed.insert((c.time_ns + d.spike_ns, c.id), result);
        }
        self.buf = buf;
        while let Some((&(t, tag), _)) = self.delayed.first_key_value() {
            if t > now_ns {
                break;
            }
            let result = self.delayed.remove(&(t, tag)).expect("delayed");
            out.push(Done {
                tag,
                time_ns: t,
                result,
            });
        }
    }
}
