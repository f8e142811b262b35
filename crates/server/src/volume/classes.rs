//! Classification hooks (issue 7; the classifiers live in `crate::classify`).
//!
//! One class table for the whole pool (one replacement policy ranks every volume's lines,
//! so their priorities must be comparable), one classifier *per volume*: each volume has
//! its own file system (the ext4 classifier learns it from that volume's blocks) and its
//! own offsets (rules match offsets within the volume).

use super::*;

/// The classifier of each served volume (volume 0 alone on a one-volume cache), all of one
/// kind (`serve --classifier`), each over the pool's class table.
#[derive(Default)]
pub(super) struct Classifiers {
    /// `rules`, `ext4`: what a volume added live gets. `None`: no classifier runs.
    kind: Option<String>,
    per: RwLock<Vec<(u32, Arc<dyn Classifier>)>>,
}

impl Classifiers {
    /// Whether any classifier runs (cheap: read on every request).
    #[inline]
    pub(super) fn any(&self) -> bool {
        self.kind.is_some()
    }

    /// The classifier of volume `vol`.
    #[inline]
    pub(super) fn of(&self, vol: u32) -> Option<Arc<dyn Classifier>> {
        self.kind.as_ref()?;
        let per = self.per.read().unwrap_or_else(|e| e.into_inner());
        per.iter()
            .find(|(v, _)| *v == vol)
            .map(|(_, c)| Arc::clone(c))
    }

    /// Every volume's classifier, in volume id order.
    pub(super) fn all(&self) -> Vec<(u32, Arc<dyn Classifier>)> {
        self.per.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn put(&self, vol: u32, c: Option<Arc<dyn Classifier>>) {
        let mut per = self.per.write().unwrap_or_else(|e| e.into_inner());
        per.retain(|(v, _)| *v != vol);
        if let Some(c) = c {
            per.push((vol, c));
            per.sort_by_key(|(v, _)| *v);
        }
    }
}

/// Classification hooks (issue 7; the classifiers live in `crate::classify`).
impl CacheVolume {
    /// `ctl classes load`: replaces the I/O class table on the running volume, in the engine
    /// (allocation, priorities, partitions: `Engine::set_class_table`), in the classifier
    /// (its rules, its class names) and in the statistics (class names), together under the
    /// volume lock, so every request is planned by one table or the other. Cached lines keep
    /// their class id. `source` says where the table came from (`ctl stats`, `ctl get`).
    /// Checked before anything changes: a table the classifier or the policy cannot take
    /// changes nothing. Per run: not stored (a restart uses `serve`'s `--classes`).
    /// Returns what changed, for the reply and the log.
    pub fn load_classes(
        &self,
        table: ClassTable,
        source: &str,
    ) -> Result<crate::classify::ClassesLoaded, String> {
        let mut g = self.lock();
        if g.closed {
            return Err(g.closed_reason().into());
        }
        if g.failed {
            return Err("the cache device failed (see `ctl stats`): every request passes through, no class table applies".into());
        }
        let g = &mut *g;
        let cached_lines = g.engine.len();
        let engine = &mut g.engine;
        let classifiers: Vec<Arc<dyn Classifier>> =
            self.classifiers.all().into_iter().map(|(_, c)| c).collect();
        let r = crate::classify::load_table(
            &classifiers,
            table,
            source,
            "the running policy",
            |t| engine.set_class_table(Some(t)).map_err(|e| e.to_string()),
            crate::classify::TableSlot {
                table: &mut g.class_table,
                source: &mut g.class_source,
                loads: &mut g.class_loads,
            },
            cached_lines,
        )?;
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        Ok(r)
    }

    /// Classifies every later request of every served volume with a classifier `kind`
    /// (`rules`, `ext4`; `none`: none) over `table`, one per volume, each first learning its
    /// volume's current contents when it asks to (before the volume is shared). Returns the
    /// classifiers' summary (`ctl stats`' `classifier`), `None` when none runs.
    pub fn attach_classifiers(
        &mut self,
        kind: &str,
        table: Arc<ClassTable>,
    ) -> Result<Option<serde_json::Value>, String> {
        let vols: Vec<u32> = match self.vols().iter().map(|v| v.id).collect::<Vec<_>>() {
            v if v.is_empty() => vec![0],
            v => v,
        };
        let mut built = Vec::new();
        for &v in &vols {
            match crate::classify::by_name(kind, Arc::clone(&table))? {
                Some(c) => built.push((v, c)),
                None => return Ok(None),
            }
        }
        self.classifiers = Classifiers {
            kind: Some(kind.to_string()),
            per: RwLock::new(built),
        };
        for &v in &vols {
            self.learn_classifier(v);
        }
        Ok(self.classifier_summary())
    }

    /// Classifies every later request of volume 0 (a one-volume cache) with `c` (before the
    /// volume is shared; for a caller that keeps a handle on the classifier).
    pub fn set_classifier(&mut self, c: Arc<dyn Classifier>) {
        self.classifiers = Classifiers {
            kind: Some(c.name().to_string()),
            per: RwLock::new(vec![(0, c)]),
        };
    }

    /// A volume added live gets a classifier of the pool's kind over the table in force
    /// (none when no classifier runs), which learns its contents.
    pub(super) fn classify_new_volume(&self, vol: u32) {
        let Some(kind) = self.classifiers.kind.clone() else {
            return;
        };
        let Some(table) = self.lock().class_table.clone() else {
            return;
        };
        match crate::classify::by_name(&kind, table) {
            Ok(c) => {
                self.classifiers.put(vol, c);
                self.learn_classifier(vol);
            }
            // The table in force was taken by every other volume's classifier of this kind.
            Err(e) => tracing::warn!(
                "volume id {vol}: no {kind} classifier ({e}): its requests are class 0"
            ),
        }
    }

    /// A volume removed: its classifier goes with it.
    pub(super) fn unclassify_volume(&self, vol: u32) {
        self.classifiers.put(vol, None);
    }

    /// What the classifiers know, for `ctl stats`: the one volume's classifier's summary,
    /// or with several volumes `{name, volumes: {NAME: summary}}`.
    pub(super) fn classifier_summary(&self) -> Option<serde_json::Value> {
        let all = self.classifiers.all();
        let vols = self.vols();
        if vols.is_empty() {
            return all.first().map(|(_, c)| c.summary());
        }
        let first = all.first()?;
        let per: serde_json::Map<String, serde_json::Value> = all
            .iter()
            .map(|(v, c)| {
                let name = crate::volume_set::name_of(&vols, *v)
                    .map_or_else(|| format!("id {v}"), str::to_string);
                (name, c.summary())
            })
            .collect();
        Some(serde_json::json!({ "name": first.1.name(), "volumes": per }))
    }

    /// Reads the volume's current contents without touching the cache's state or counters:
    /// the backing device, overlaid with the valid sectors of cached lines. For classifiers
    /// learning an existing file system at start.
    pub fn read_current(&self, vol: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let g = self.lock();
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.read_current_locked(&g, vol, offset, buf)
    }

    /// Lets volume `vol`'s classifier learn from the volume's current contents when it
    /// asks to (at start, and when a file system appeared). Locks in the order `run` does:
    /// volume, then device I/O, then the classifier's own lock inside `learn`.
    pub fn learn_classifier(&self, vol: u32) {
        let Some(c) = self.classifiers.of(vol) else {
            return;
        };
        if !c.wants_learn() {
            return;
        }
        {
            let g = self.lock();
            let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
            c.learn(&mut |off, buf| {
                if self.read_current_locked(&g, vol, off, buf).is_err() {
                    buf.fill(0);
                }
            });
        }
        self.relabel(vol, c.take_relabels());
    }

    /// After a request of volume `vol`: its classifier sees what was read (`read`), its
    /// relabels are applied, and it learns when it asks to.
    pub(super) fn after_classified(&self, vol: u32, read: Option<(u64, &[u8])>) {
        let Some(c) = self.classifiers.of(vol) else {
            return;
        };
        if let Some((offset, buf)) = read {
            c.observe_read(offset, buf);
        }
        self.relabel(vol, c.take_relabels());
        self.learn_classifier(vol);
    }

    fn read_current_locked(
        &self,
        g: &Inner,
        vol: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        self.backing.read_at(buf, vaddr(vol, offset))?;
        let end = offset + buf.len() as u64;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = g.engine.sector_size();
        for line in offset >> self.line_shift..=(end - 1) >> self.line_shift {
            let Some(slot) = g.engine.lookup(Engine::line_key(vol, line)) else {
                continue;
            };
            let valid = g.engine.valid_mask(slot);
            let base = line << self.line_shift;
            for sec in 0..(self.line_size() / ss) {
                let (a, b) = (base + sec * ss, base + (sec + 1) * ss);
                if valid >> sec & 1 == 0 || b <= offset || a >= end {
                    continue;
                }
                let (a, b) = (a.max(offset), b.min(end));
                let dst = &mut buf[(a - offset) as usize..(b - offset) as usize];
                let ssd = self.data_offset + ((slot as u64) << self.line_shift) + (a - base);
                self.cache.read_at(dst, ssd)?;
            }
        }
        Ok(())
    }

    /// Relabels the cached lines of volume `vol`'s byte ranges `(offset, len, class)`.
    pub(super) fn relabel(&self, vol: u32, ranges: Vec<(u64, u64, u8)>) {
        if ranges.is_empty() {
            return;
        }
        let mut g = self.lock();
        let mut n = 0;
        for (off, len, class) in ranges {
            if len == 0 {
                continue;
            }
            let (a, b) = (off >> self.line_shift, (off + len - 1) >> self.line_shift);
            if b - a >= g.engine.len() {
                // A range larger than the cache: walk the cached lines instead.
                let keys: Vec<u64> = g
                    .engine
                    .entries()
                    .map(|(k, _, _)| k)
                    .filter(|&k| {
                        vol_of(k) == vol && (a..=b).contains(&(k - Engine::line_key(vol, 0)))
                    })
                    .collect();
                for k in keys {
                    n += g.engine.reclassify(k, class) as u64;
                }
            } else {
                for line in a..=b {
                    n += g.engine.reclassify(Engine::line_key(vol, line), class) as u64;
                }
            }
        }
        self.metrics
            .relabelled_lines
            .fetch_add(n, Ordering::Relaxed);
    }
}
