//! Classification hooks (issue 7; the classifiers live in `crate::classify`).

use super::*;

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
        let r = crate::classify::load_table(
            self.classifier.as_ref(),
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

    /// Classifies every later request with `c` (before the volume is shared).
    pub fn set_classifier(&mut self, c: Arc<dyn Classifier>) {
        self.classifier = Some(c);
    }

    /// Reads the volume's current contents without touching the cache's state or counters:
    /// the backing device, overlaid with the valid sectors of cached lines. For classifiers
    /// learning an existing file system at start.
    pub fn read_current(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let g = self.lock();
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        self.read_current_locked(&g, offset, buf)
    }

    /// Lets the classifier learn from the volume's current contents when it asks to (at
    /// start, and when a file system appeared). Locks in the order `run` does: volume, then
    /// device I/O, then the classifier's own lock inside `learn`.
    pub fn learn_classifier(&self) {
        let Some(c) = &self.classifier else {
            return;
        };
        if !c.wants_learn() {
            return;
        }
        {
            let g = self.lock();
            let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
            c.learn(&mut |off, buf| {
                if self.read_current_locked(&g, off, buf).is_err() {
                    buf.fill(0);
                }
            });
        }
        self.relabel(c.take_relabels());
    }

    fn read_current_locked(&self, g: &Inner, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.backing.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = g.engine.sector_size();
        for line in offset >> self.line_shift..=(end - 1) >> self.line_shift {
            let Some(slot) = g.engine.lookup(Engine::line_key(0, line)) else {
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

    /// Relabels the cached lines of byte ranges `(offset, len, class)`.
    pub(super) fn relabel(&self, ranges: Vec<(u64, u64, u8)>) {
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
                    // Volume 0: a key is its line number.
                    .filter(|k| (a..=b).contains(k))
                    .collect();
                for k in keys {
                    n += g.engine.reclassify(k, class) as u64;
                }
            } else {
                for line in a..=b {
                    n += g.engine.reclassify(Engine::line_key(0, line), class) as u64;
                }
            }
        }
        self.metrics
            .relabelled_lines
            .fetch_add(n, Ordering::Relaxed);
    }
}
