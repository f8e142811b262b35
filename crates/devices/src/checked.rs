//! The one checked wrapper every device goes through: it validates ops, keeps statistics
//! and busy time, and returns completions in order. Models only do physics.

use crate::{Completion, Device, DeviceError, DeviceStats, IoKind, IoOp};
use hashbrown::HashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A completion as a [`Model`] reports it: the wrapper's `tag`, not the caller's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub tag: u64,
    pub time_ns: u64,
    pub result: Result<(), DeviceError>,
}

/// The physics of a device. Wrap it in [`Checked`] to get a [`Device`].
///
/// Contract:
/// * `accept` MUST only be called with ops that are in range and non-empty (the wrapper
///   checks), with non-decreasing `now_ns`, and only after `run_until(now_ns)`.
/// * `run_until(t)` MUST process every internal event at or before `t` and push the ops
///   that completed at or before `t` (in any order; each with `time_ns <= t`).
/// * `next_event` MUST be `Some` while any accepted op has not been pushed, and never later
///   than the next push; after `run_until(t)` it MUST be `None` or `> t`.
pub trait Model: Send {
    fn name(&self) -> &str;
    fn capacity_bytes(&self) -> u64;
    /// Take `op` arriving at `now_ns`; `tag` identifies it in [`Done`].
    fn accept(&mut self, now_ns: u64, tag: u64, op: &IoOp);
    /// Earliest time at which the model's state can change (a completion or an internal
    /// event), if anything is in flight.
    fn next_event(&self) -> Option<u64>;
    /// Run every event at or before `now_ns`; push finished ops into `out`.
    fn run_until(&mut self, now_ns: u64, out: &mut Vec<Done>);
}

struct InFlight {
    id: u64,
    kind: IoKind,
    len: u64,
    submit_ns: u64,
}

/// A [`Model`] behind the checked [`Device`] interface.
pub struct Checked<M> {
    model: M,
    /// Latest `now_ns` passed to `submit` (contract: non-decreasing).
    last_submit_ns: u64,
    /// Latest time the model has been run to.
    clock_ns: u64,
    next_tag: u64,
    in_flight: HashMap<u64, InFlight>,
    /// Ops inside the model (for busy time); the rest of `in_flight` waits in `ready`.
    in_model: usize,
    busy_since_ns: u64,
    /// Ops inside the model per [`IoKind::index`], and the busy time attributed to each kind
    /// up to `share_since_ns` (each moment split among the kinds by their op counts).
    in_model_kind: [usize; 4],
    share_ns: [f64; 4],
    share_since_ns: u64,
    /// Completed, not yet handed out: (time, tag) -> result.
    ready: BinaryHeap<Reverse<(u64, u64)>>,
    results: HashMap<u64, Result<(), DeviceError>>,
    scratch: Vec<Done>,
    stats: DeviceStats,
}

impl<M: Model> Checked<M> {
    pub fn new(model: M) -> Self {
        Checked {
            model,
            last_submit_ns: 0,
            clock_ns: 0,
            next_tag: 0,
            in_flight: HashMap::new(),
            in_model: 0,
            busy_since_ns: 0,
            in_model_kind: [0; 4],
            share_ns: [0.0; 4],
            share_since_ns: 0,
            ready: BinaryHeap::new(),
            results: HashMap::new(),
            scratch: Vec::new(),
            stats: DeviceStats::default(),
        }
    }

    /// The wrapped model (e.g. to reach RAID members or an SSD's FTL).
    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    fn check(&self, op: &IoOp) -> Result<(), DeviceError> {
        let capacity = self.model.capacity_bytes();
        match op.kind {
            IoKind::Flush => Ok(()),
            kind => {
                if op.len == 0 && kind != IoKind::Trim {
                    return Err(DeviceError::Empty {
                        kind,
                        offset: op.offset,
                    });
                }
                match op.offset.checked_add(op.len) {
                    Some(end) if end <= capacity => Ok(()),
                    _ => Err(DeviceError::OutOfRange {
                        kind,
                        offset: op.offset,
                        len: op.len,
                        capacity,
                    }),
                }
            }
        }
    }

    /// The busy time per kind up to `t`: (shares, time) with the time from the last change
    /// of the ops in the model to `t` split among the kinds by their op counts.
    fn shares_at(&self, t: u64) -> [f64; 4] {
        let mut s = self.share_ns;
        if self.in_model > 0 && t > self.share_since_ns {
            let dt = (t - self.share_since_ns) as f64;
            for (k, v) in s.iter_mut().enumerate() {
                *v += dt * self.in_model_kind[k] as f64 / self.in_model as f64;
            }
        }
        s
    }

    /// Brings the per-kind busy shares up to `t` (before the ops in the model change).
    fn share_to(&mut self, t: u64) {
        self.share_ns = self.shares_at(t);
        self.share_since_ns = self.share_since_ns.max(t);
    }

    /// Runs the model to `now_ns` and moves its completions to `ready`.
    fn pump(&mut self, now_ns: u64) {
        let mut out = std::mem::take(&mut self.scratch);
        self.model.run_until(now_ns, &mut out);
        out.sort_by_key(|d| (d.time_ns, d.tag));
        for d in out.drain(..) {
            assert!(
                d.time_ns <= now_ns.max(self.clock_ns),
                "{}: model returned a completion after the time it was run to",
                self.model.name()
            );
            assert!(
                self.in_flight.contains_key(&d.tag) && !self.results.contains_key(&d.tag),
                "{}: model completed an unknown or finished op",
                self.model.name()
            );
            self.share_to(d.time_ns);
            self.in_model_kind[self.in_flight[&d.tag].kind.index()] -= 1;
            self.in_model -= 1;
            if self.in_model == 0 {
                self.stats.busy_ns += d.time_ns.saturating_sub(self.busy_since_ns);
            }
            self.ready.push(Reverse((d.time_ns, d.tag)));
            self.results.insert(d.tag, d.result);
        }
        self.scratch = out;
        self.clock_ns = self.clock_ns.max(now_ns);
    }
}

impl<M: Model> Device for Checked<M> {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn capacity_bytes(&self) -> u64 {
        self.model.capacity_bytes()
    }

    fn submit(&mut self, now_ns: u64, id: u64, op: IoOp) {
        assert!(
            now_ns >= self.last_submit_ns,
            "{}: submit at {now_ns} ns after a submit at {} ns (time must not go back)",
            self.model.name(),
            self.last_submit_ns
        );
        self.last_submit_ns = now_ns;
        self.pump(now_ns);
        let tag = self.next_tag;
        self.next_tag += 1;
        self.stats.submitted += 1;
        self.in_flight.insert(
            tag,
            InFlight {
                id,
                kind: op.kind,
                len: if op.kind == IoKind::Flush { 0 } else { op.len },
                submit_ns: now_ns,
            },
        );
        match self.check(&op) {
            Ok(()) => {
                if self.in_model == 0 {
                    self.busy_since_ns = now_ns;
                }
                self.share_to(now_ns);
                self.in_model_kind[op.kind.index()] += 1;
                self.in_model += 1;
                self.model.accept(now_ns, tag, &op);
            }
            Err(e) => {
                self.ready.push(Reverse((now_ns, tag)));
                self.results.insert(tag, Err(e));
            }
        }
    }

    fn next_completion(&self) -> Option<u64> {
        let r = self.ready.peek().map(|Reverse((t, _))| *t);
        match (r, self.model.next_event()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance(&mut self, now_ns: u64, done: &mut Vec<Completion>) {
        self.pump(now_ns);
        while let Some(&Reverse((t, tag))) = self.ready.peek() {
            if t > now_ns {
                break;
            }
            self.ready.pop();
            let f = self.in_flight.remove(&tag).expect("in flight");
            let result = self.results.remove(&tag).expect("result");
            let k = self.stats.kind_mut(f.kind);
            k.ops += 1;
            k.bytes += f.len;
            if result.is_err() {
                k.errors += 1;
            }
            k.latency.record(t - f.submit_ns);
            done.push(Completion {
                id: f.id,
                time_ns: t,
                result,
            });
        }
    }

    fn outstanding(&self) -> usize {
        self.in_flight.len()
    }

    fn stats(&self) -> DeviceStats {
        let mut s = self.stats.clone();
        if self.in_model > 0 {
            s.busy_ns += self.clock_ns.saturating_sub(self.busy_since_ns);
        }
        for (k, v) in self.shares_at(self.clock_ns).into_iter().enumerate() {
            s.kinds[k].busy_ns = v.round() as u64;
        }
        s
    }
}
