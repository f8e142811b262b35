//! Class partitions for any replacement policy (as Open CAS's IO classes): classes with a
//! `min_share` / `max_share` in the class table get a partition of their own, run by their own
//! instance of the configured policy; all other classes share one partition.
//!
//! - A class whose partition is at its maximum evicts from its own partition (a maximum of 0
//!   bypasses the class, counted as `Bypass::Class`); so does a class marked `never`.
//! - Otherwise the victim comes from the partition furthest above its minimum (in lines), so a
//!   partition is never pushed below its minimum by another class while any partition is above
//!   its own.
//!
//! Applied by the engine when `--classes` gives partition bounds or `never` classes to a
//! policy that is not DSS (DSS does its own class handling; with bounds it is partitioned too).

use super::{Access, Policy, PolicyInfo, Slot};
use crate::classes::{Allocation, ClassTable};
use crate::config::EngineConfig;
use crate::request::NUM_CLASSES;
use std::sync::Arc;

/// Wraps `inner` in partitions when the configuration's class table asks for them.
pub fn wrap(inner: Box<dyn Policy>, cap: u32, cfg: &EngineConfig) -> Box<dyn Policy> {
    let Some(table) = cfg.policy_params.classes.as_ref() else {
        return inner;
    };
    let bypass_matters = inner.name() != "dss" && table.has_bypass();
    if !table.has_partitions() && !bypass_matters {
        return inner;
    }
    let info = super::lookup(&cfg.policy).expect("validated");
    Box::new(Partitioned::new(inner, info, cap, cfg, Arc::clone(table)))
}

pub struct Partitioned {
    name: &'static str,
    parts: Vec<Box<dyn Policy>>,
    part_of_class: [u8; NUM_CLASSES],
    slot_part: Vec<u8>,
    occ: Vec<u32>,
    min: Vec<u32>,
    max: Vec<u32>,
    table: Arc<ClassTable>,
}

impl Partitioned {
    fn new(
        shared: Box<dyn Policy>,
        info: &PolicyInfo,
        cap: u32,
        cfg: &EngineConfig,
        table: Arc<ClassTable>,
    ) -> Self {
        let name = shared.name();
        let mut parts = vec![shared];
        let mut part_of_class = [0u8; NUM_CLASSES];
        let (mut min, mut max) = (vec![0u32], vec![cap]);
        for (id, c) in table.classes.iter().enumerate() {
            if c.min_share > 0.0 || c.max_share < 1.0 {
                part_of_class[id] = parts.len() as u8;
                parts.push((info.make)(cap, &cfg.policy_params));
                min.push((c.min_share * cap as f64).floor() as u32);
                max.push((c.max_share * cap as f64).floor() as u32);
            }
        }
        let n = parts.len();
        Partitioned {
            name,
            parts,
            part_of_class,
            slot_part: vec![0; cap as usize],
            occ: vec![0; n],
            min,
            max,
            table,
        }
    }

    /// Lines cached per partition (partition 0 = shared).
    pub fn occupancy(&self) -> &[u32] {
        &self.occ
    }
}

impl Policy for Partitioned {
    fn name(&self) -> &'static str {
        self.name
    }
    fn hit(&mut self, slot: Slot, a: &Access) {
        self.parts[self.slot_part[slot as usize] as usize].hit(slot, a);
    }
    fn miss(&mut self, a: &Access) {
        self.parts[self.part_of_class[a.class as usize] as usize].miss(a);
    }
    fn insert(&mut self, slot: Slot, a: &Access) {
        let p = self.part_of_class[a.class as usize];
        self.slot_part[slot as usize] = p;
        self.occ[p as usize] += 1;
        self.parts[p as usize].insert(slot, a);
    }
    fn victim(&mut self) -> Slot {
        self.victim_for(u8::MAX, &[])
    }
    fn victim_for(&mut self, class: u8, dirty: &[u64]) -> Slot {
        let own = self.part_of_class.get(class as usize).map(|&p| p as usize);
        if let Some(p) = own {
            if self.occ[p] > 0 && self.occ[p] >= self.max[p] {
                return self.parts[p].victim_for(class, dirty);
            }
        }
        let over = (0..self.parts.len())
            .filter(|&q| self.occ[q] > self.min[q])
            .max_by_key(|&q| (self.occ[q] - self.min[q], std::cmp::Reverse(q)));
        let q = over
            .or(own.filter(|&p| self.occ[p] > 0))
            .unwrap_or_else(|| (0..self.parts.len()).max_by_key(|&q| self.occ[q]).unwrap());
        self.parts[q].victim_for(class, dirty)
    }
    fn remove(&mut self, slot: Slot, key: u64, evicted: bool) {
        let p = self.slot_part[slot as usize] as usize;
        self.occ[p] -= 1;
        self.parts[p].remove(slot, key, evicted);
    }
    fn mem_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.mem_bytes()).sum::<usize>() + self.slot_part.capacity()
    }
    fn needs_oracle(&self) -> bool {
        self.parts[0].needs_oracle()
    }
    fn class_aware(&self) -> bool {
        true
    }
    fn at_limit(&self, class: u8) -> bool {
        let p = self.part_of_class[class as usize] as usize;
        self.occ[p] > 0 && self.occ[p] >= self.max[p]
    }
    fn admit(&mut self, class: u8, clean_share: f64) -> bool {
        let p = self.part_of_class[class as usize] as usize;
        if self.max[p] == 0 {
            return false;
        }
        if self.name != "dss" && self.table.class(class).allocation == Allocation::Never {
            return false;
        }
        self.parts[p].admit(class, clean_share)
    }
}

#[cfg(test)]
mod tests {
    use crate::classes::ClassTable;
    use crate::{Engine, EngineConfig, Request};
    use std::sync::Arc;

    fn engine(policy: &str, table: &str) -> Engine {
        let mut cfg = EngineConfig {
            capacity_lines: 100,
            policy: policy.into(),
            ..Default::default()
        };
        cfg.policy_params.classes = Some(Arc::new(ClassTable::parse(table, "t").unwrap()));
        Engine::new(cfg).unwrap()
    }

    #[test]
    fn max_share_caps_a_class_and_min_share_protects_it() {
        let table = "version = 1\n[[class]]\nid = 1\nname = \"meta\"\npriority = 0\nallocation = \"always\"\nmin_share = 0.2\n[[class]]\nid = 2\nname = \"bulk\"\npriority = 5\nallocation = \"conditional\"\nmax_share = 0.3\n";
        for policy in ["lru", "fifo", "arc", "s3fifo"] {
            let mut e = engine(policy, table);
            let mut t = 0;
            let mut go = |e: &mut Engine, class: u8, base: u64, n: u64| {
                for i in 0..n {
                    let mut r = Request::read((base + i) * 4096, 4096);
                    r.class = class;
                    r.time_ns = t;
                    t += 1;
                    e.process(&r).unwrap();
                }
            };
            go(&mut e, 1, 0, 30); // 30 metadata lines
            go(&mut e, 2, 1000, 500); // a scan of bulk data: at most 30 lines of it stay
            go(&mut e, 0, 5000, 500); // then plain data pushes, but meta keeps >= 20
            let cached: Vec<u64> = e.entries().map(|(k, _, _)| k).collect();
            let meta = cached.iter().filter(|&&k| k < 30).count();
            let bulk = cached
                .iter()
                .filter(|&&k| (1000..1500).contains(&k))
                .count();
            assert!(
                meta >= 20,
                "{policy}: {meta} metadata lines left, min is 20"
            );
            assert!(bulk <= 30, "{policy}: {bulk} bulk lines, max is 30");
            assert!(e.len() <= 100);
        }
    }
}
