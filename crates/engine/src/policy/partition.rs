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
//!
//! Volume partitions (`--volume-share NAME=MIN:MAX`, [`VolumeParts`]) follow the same rules one
//! level up: each volume with bounds gets a partition of its own, the other volumes share one,
//! and each of these partitions holds the class partitions above (nested: the class bounds are
//! shares of the whole pool, applied inside each volume partition). The volume of the line
//! being placed is told by [`Policy::for_volume`] before `admit`, `at_limit`, `victim_for`.

use super::{Access, Policy, PolicyInfo, Slot};
use crate::classes::{Allocation, ClassTable};
use crate::config::EngineConfig;
use crate::request::NUM_CLASSES;
use std::sync::Arc;

/// Wraps `inner` in partitions when the configuration's class table or volume shares ask
/// for them.
pub fn wrap(inner: Box<dyn Policy>, cap: u32, cfg: &EngineConfig) -> Box<dyn Policy> {
    let classed = wrap_classes(inner, cap, cfg);
    if cfg.policy_params.volume_shares.is_empty() {
        return classed;
    }
    Box::new(VolumeParts::new(classed, cap, cfg))
}

/// Wraps `inner` in class partitions when the class table asks for them.
fn wrap_classes(inner: Box<dyn Policy>, cap: u32, cfg: &EngineConfig) -> Box<dyn Policy> {
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

/// Volume partitions: one per volume with bounds (`PolicyConfig::volume_shares`), one shared
/// by the other volumes (partition 0, bounds 0..capacity), each a policy of the configured
/// kind with its own class partitions.
///
/// - The volume being placed ([`Policy::for_volume`]) evicts its own lines when its partition
///   is at its maximum (or its class is at its class maximum inside it); a maximum of 0
///   bypasses the volume.
/// - Otherwise the victim comes from the partition furthest above its maximum (a maximum
///   lowered at run time: the excess goes first, one line per insert of any volume, even
///   while slots are free, written back when dirty as any eviction), else from the one
///   furthest above its minimum, so a volume is never
///   pushed below its minimum by another while any partition is above its own.
pub struct VolumeParts {
    name: &'static str,
    parts: Vec<Box<dyn Policy>>,
    /// (volume, partition), sorted by volume: the volumes with bounds.
    part_of_volume: Vec<(u32, u8)>,
    slot_part: Vec<u8>,
    occ: Vec<u32>,
    min: Vec<u32>,
    max: Vec<u32>,
    /// The partition of the volume last named by `for_volume`.
    cur: usize,
}

impl VolumeParts {
    fn new(shared: Box<dyn Policy>, cap: u32, cfg: &EngineConfig) -> Self {
        let info = super::lookup(&cfg.policy).expect("validated");
        let shares = &cfg.policy_params.volume_shares;
        assert!(shares.len() < u8::MAX as usize, "at most 254 volume shares");
        let name = shared.name();
        let mut parts = vec![shared];
        let (mut min, mut max) = (vec![0u32], vec![cap]);
        let mut part_of_volume = Vec::with_capacity(shares.len());
        for v in shares {
            part_of_volume.push((v.volume, parts.len() as u8));
            parts.push(wrap_classes((info.make)(cap, &cfg.policy_params), cap, cfg));
            min.push((v.min * cap as f64).floor() as u32);
            max.push((v.max * cap as f64).floor() as u32);
        }
        part_of_volume.sort_unstable();
        let n = parts.len();
        VolumeParts {
            name,
            parts,
            part_of_volume,
            slot_part: vec![0; cap as usize],
            occ: vec![0; n],
            min,
            max,
            cur: 0,
        }
    }

    #[inline]
    fn part_of(&self, volume: u32) -> usize {
        match self
            .part_of_volume
            .binary_search_by_key(&volume, |&(v, _)| v)
        {
            Ok(i) => self.part_of_volume[i].1 as usize,
            Err(_) => 0,
        }
    }

    #[inline]
    fn part_of_key(&self, key: u64) -> usize {
        self.part_of((key >> crate::engine::LINE_BITS) as u32)
    }

    /// Lines cached per partition (0 = the volumes without bounds) and its bounds in lines:
    /// `(occupancy, min, max)`.
    pub fn occupancy(&self) -> Vec<(u32, u32, u32)> {
        (0..self.parts.len())
            .map(|p| (self.occ[p], self.min[p], self.max[p]))
            .collect()
    }

    /// Whether some partition holds more lines than its maximum (lowered at run time).
    fn over_max(&self) -> bool {
        self.occ.iter().zip(&self.max).any(|(o, m)| o > m)
    }

    /// Whether partition `p` must evict its own line for a line of `class`.
    fn own_at_limit(&self, p: usize, class: u8) -> bool {
        self.occ[p] > 0
            && (self.occ[p] >= self.max[p]
                || ((class as usize) < NUM_CLASSES && self.parts[p].at_limit(class)))
    }

    /// The partition to take a victim from for a line of the volume `own` (`None`: no own
    /// volume, plain `victim`). Never an empty one while any line is cached.
    fn pick(&self, own: Option<usize>, class: u8) -> usize {
        if let Some(p) = own {
            if self.own_at_limit(p, class) {
                return p;
            }
        }
        let n = self.parts.len();
        let over_max = (0..n)
            .filter(|&q| self.occ[q] > self.max[q])
            .max_by_key(|&q| (self.occ[q] - self.max[q], std::cmp::Reverse(q)));
        let over_min = || {
            (0..n)
                .filter(|&q| self.occ[q] > self.min[q])
                .max_by_key(|&q| (self.occ[q] - self.min[q], std::cmp::Reverse(q)))
        };
        over_max
            .or_else(over_min)
            .or(own.filter(|&p| self.occ[p] > 0))
            .unwrap_or_else(|| (0..n).max_by_key(|&q| self.occ[q]).unwrap())
    }
}

impl Policy for VolumeParts {
    fn name(&self) -> &'static str {
        self.name
    }
    fn hit(&mut self, slot: Slot, a: &Access) {
        self.parts[self.slot_part[slot as usize] as usize].hit(slot, a);
    }
    fn miss(&mut self, a: &Access) {
        let p = self.part_of_key(a.key);
        self.parts[p].miss(a);
    }
    fn insert(&mut self, slot: Slot, a: &Access) {
        let p = self.part_of_key(a.key);
        self.slot_part[slot as usize] = p as u8;
        self.occ[p] += 1;
        self.parts[p].insert(slot, a);
    }
    fn prefetch(&self, slot: Slot) {
        self.parts[0].prefetch(slot);
    }
    fn victim(&mut self) -> Slot {
        let q = self.pick(None, u8::MAX);
        self.parts[q].victim()
    }
    fn victim_for(&mut self, class: u8, dirty: &[u64]) -> Slot {
        let q = self.pick(Some(self.cur), class);
        self.parts[q].victim_for(class, dirty)
    }
    fn dirty_peer_victim(&mut self, class: u8, dirty: &[u64]) -> bool {
        let q = self.pick(Some(self.cur), class);
        self.parts[q].dirty_peer_victim(class, dirty)
    }
    fn remove(&mut self, slot: Slot, key: u64, evicted: bool) {
        let p = self.slot_part[slot as usize] as usize;
        self.occ[p] -= 1;
        self.parts[p].remove(slot, key, evicted);
    }
    /// The hint of the partition the next victim for the volume last named would come from
    /// (so a clean or unpinned line the engine takes from it instead keeps the bounds).
    fn eviction_candidates(&self, n: usize, out: &mut Vec<Slot>) {
        if self.occ.iter().any(|&o| o > 0) {
            let q = self.pick(Some(self.cur), u8::MAX);
            self.parts[q].eviction_candidates(n, out);
        }
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
    fn for_volume(&mut self, volume: u32) {
        self.cur = self.part_of(volume);
    }
    /// Also while any partition is above its maximum (lowered at run time): every insert
    /// then gives back one line of the excess, even while slots are free.
    fn at_limit(&self, class: u8) -> bool {
        self.own_at_limit(self.cur, class) || self.over_max()
    }
    fn admit(&mut self, class: u8, clean_share: f64) -> bool {
        let p = self.cur;
        if self.max[p] == 0 {
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

#[cfg(test)]
mod volume_tests {
    use crate::engine::LINE_BITS;
    use crate::policy::VolumeShare;
    use crate::{Engine, EngineConfig, Request};

    fn engine(policy: &str, shares: &[(u32, f64, f64)]) -> Engine {
        let mut cfg = EngineConfig {
            capacity_lines: 100,
            policy: policy.into(),
            ..Default::default()
        };
        cfg.policy_params.volume_shares = shares
            .iter()
            .map(|&(volume, min, max)| VolumeShare { volume, min, max })
            .collect();
        Engine::new(cfg).unwrap()
    }

    fn lines_of(e: &Engine, volume: u32) -> usize {
        e.entries()
            .filter(|&(k, _, _)| (k >> LINE_BITS) as u32 == volume)
            .count()
    }

    /// Volume 0 re-reads a hot set of 60 lines while volume 1 streams a scan 50 times the
    /// cache: with volume 1 capped at 25 % it never holds more than 25 lines and volume 0's
    /// hot set stays cached; without the cap the scan flushes it (hit ratio far lower).
    fn hot_hits(e: &mut Engine, capped: bool, policy: &str) -> u64 {
        let (mut hits, mut t) = (0, 0);
        for i in 0..5000u64 {
            let hot = i % 60;
            let key = Engine::line_key(0, hot);
            hits += e.lookup(key).is_some() as u64;
            let mut r = Request::read(hot * 4096, 4096);
            r.time_ns = t;
            t += 1;
            e.process(&r).unwrap();
            for j in 0..2 {
                let mut r = Request::read((2 * i + j) * 4096, 4096);
                r.volume = 1;
                r.time_ns = t;
                t += 1;
                e.process(&r).unwrap();
            }
            if capped {
                let n = lines_of(e, 1);
                assert!(n <= 25, "{policy}: volume 1 holds {n} lines, max 25");
            }
        }
        hits
    }

    #[test]
    fn a_capped_scan_volume_leaves_the_hot_volume_cached() {
        for policy in ["lru", "fifo", "clock", "slru", "arc", "s3fifo", "dss"] {
            let mut capped = engine(policy, &[(1, 0.0, 0.25)]);
            let mut free = engine(policy, &[]);
            let with = hot_hits(&mut capped, true, policy);
            let without = hot_hits(&mut free, false, policy);
            assert!(
                with > 4500,
                "{policy}: hot volume hit {with} of 5000 with the scan capped"
            );
            assert!(
                with > without + 500,
                "{policy}: hot hits {with} capped, {without} without: bounds changed nothing"
            );
        }
    }

    /// A volume's minimum holds against another volume's inserts: volume 0 (min 30 %) holds
    /// 95 lines, volume 1 (no bounds, the shared partition) streams 1000: volume 0 gives lines
    /// only while it is further above its minimum than the shared partition is above 0, so
    /// it keeps 65 (LRU without bounds keeps none of them).
    #[test]
    fn a_volume_minimum_is_not_pushed_below_by_another() {
        let run = |policy: &str, shares: &[(u32, f64, f64)]| {
            let mut e = engine(policy, shares);
            for l in 0..95u64 {
                e.process(&Request::read(l * 4096, 4096)).unwrap();
            }
            for l in 0..1000u64 {
                let mut r = Request::read(l * 4096, 4096);
                r.volume = 1;
                e.process(&r).unwrap();
                if !shares.is_empty() {
                    assert!(lines_of(&e, 0) >= 30, "{policy}: volume 0 below its 30");
                }
            }
            lines_of(&e, 0)
        };
        for policy in ["lru", "fifo", "arc", "s3fifo", "dss"] {
            let kept = run(policy, &[(0, 0.3, 1.0)]);
            assert!((64..=66).contains(&kept), "{policy}: volume 0 kept {kept}");
        }
        assert!(
            run("lru", &[]) < 30,
            "without bounds the stream flushes volume 0"
        );
    }

    /// Bounds change at run time: a lowered maximum is given back lazily by inserts, dirty
    /// lines written back (none lost); a raised one lets the volume grow.
    #[test]
    fn bounds_change_live_and_a_lowered_max_writes_back_dirty_lines() {
        let mut cfg = EngineConfig {
            capacity_lines: 100,
            policy: "lru".into(),
            mode: crate::Mode::WriteBack,
            ..Default::default()
        };
        cfg.policy_params.volume_shares = vec![];
        let mut e = Engine::new(cfg).unwrap();
        for l in 0..80u64 {
            let mut r = Request::write(l * 4096, 4096);
            r.volume = 1;
            e.process(&r).unwrap();
        }
        assert_eq!(lines_of(&e, 1), 80);
        e.set_volume_share(1, Some((0.0, 0.25))).unwrap();
        assert_eq!(lines_of(&e, 1), 80, "lines are kept by the change itself");
        assert_eq!(e.dirty_lines(), 80);
        let before = e.counters().write_backs;
        for l in 0..200u64 {
            e.process(&Request::read(l * 4096, 4096)).unwrap();
        }
        assert_eq!(lines_of(&e, 1), 25, "volume 1 shrank to its new max");
        assert_eq!(e.len(), 100, "the other volume filled the free slots after");
        assert_eq!(
            e.counters().write_backs - before,
            55,
            "each evicted dirty line written back"
        );
        e.set_volume_share(1, Some((0.0, 1.0))).unwrap();
        for l in 100..200u64 {
            let mut r = Request::read(l * 4096, 4096);
            r.volume = 1;
            e.process(&r).unwrap();
        }
        assert!(lines_of(&e, 1) > 25, "raised max: volume 1 grows");
        assert!(e.set_volume_share(2, Some((0.6, 0.4))).is_err());
        e.set_volume_share(1, Some((0.6, 1.0))).unwrap();
        assert!(
            e.set_volume_share(2, Some((0.5, 1.0))).is_err(),
            "minimums over the pool"
        );
        assert_eq!(e.volume_shares().len(), 1, "an error changes nothing");
    }
}
