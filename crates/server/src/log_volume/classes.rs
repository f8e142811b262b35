//! I/O classes on the log layout (issue 19): the classifier reaches the data path, the
//! class table is in the engine (`LogConfig::classes`: `never` classes are not cached, every
//! class is counted), `ctl classes load` replaces it live. A cached line remembers the class
//! that cached it (RAM only, statistics) and is relabelled when the classifier learns better.

use super::*;
use crate::classify::{ClassesLoaded, Classifier};
use tiercache_engine::ClassTable;

impl LogVolume {
    /// Classifies every later read and write with `c` (before the volume is shared).
    pub fn set_classifier(&mut self, c: Arc<dyn Classifier>) {
        self.classifier = Some(c);
    }

    /// The class table of this run (`serve --classes`; `source` says so in `ctl stats`),
    /// before the volume is shared. Refused when the log layout cannot take it (partitions).
    pub fn set_class_table(&self, table: Arc<ClassTable>, source: &str) -> Result<(), String> {
        let mut g = self.lock();
        g.eng
            .set_class_table(Some(Arc::clone(&table)))
            .map_err(|e| format!("{source}: {e}"))?;
        g.class_table = Some(table);
        g.class_source = source.to_string();
        Ok(())
    }

    /// `ctl classes load`: replaces the class table in the engine, the classifier and the
    /// statistics together under the volume lock, so every request is planned by one table
    /// or the other. Checked first: a table the classifier or the log layout cannot take
    /// changes nothing. Per run (a restart uses `serve`'s `--classes`).
    pub fn load_classes(&self, table: ClassTable, source: &str) -> Result<ClassesLoaded, String> {
        let mut g = self.lock();
        // Shut down, or halted by a panic (`crate::live::HALTED`): say which.
        if let (true, Err(e)) = (g.closed, g.check_open()) {
            return Err(e.to_string());
        }
        if g.pass_through {
            return Err("the cache device failed (see `ctl stats`): every request passes through, no class table applies".into());
        }
        let g = &mut *g;
        let cached_lines = g.eng.entries().count() as u64;
        let eng = &mut g.eng;
        let r = crate::classify::load_table(
            self.classifier.as_slice(),
            table,
            source,
            "the log layout",
            |t| eng.set_class_table(Some(t)).map_err(|e| e.to_string()),
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

    /// The class of a read or write about to run (0 without a classifier). Called under the
    /// volume lock, as in the direct layout: requests reach the devices in the order they
    /// were classified.
    pub(super) fn classify(&self, req: &Request, data: Option<&[u8]>) -> u8 {
        self.classifier
            .as_ref()
            .map_or(0, |c| c.classify(req, data))
    }

    /// After a client read (`read`: its offset and bytes) or write: the classifier sees the
    /// read data, its relabels go to the cached lines, and it learns when it asks to.
    pub(super) fn after_request(&self, read: Option<(u64, &[u8])>) {
        let Some(c) = &self.classifier else {
            return;
        };
        if let Some((off, buf)) = read {
            c.observe_read(off, buf);
        }
        self.relabel(c.take_relabels());
        self.learn_classifier();
    }

    /// Relabels the cached lines of byte ranges `(offset, len, class)`.
    fn relabel(&self, ranges: Vec<(u64, u64, u8)>) {
        if ranges.is_empty() {
            return;
        }
        let mut g = self.lock();
        let mut n = 0;
        for (off, len, class) in ranges {
            if len == 0 {
                continue;
            }
            let (a, b) = (off / self.line, (off + len - 1) / self.line);
            let cached = g.eng.entries().count() as u64;
            if b - a >= cached {
                // A range larger than the cache: walk the cached lines instead.
                let lines: Vec<u64> = g
                    .eng
                    .entries()
                    .map(|(k, _)| LogEngine::key_line(k).1)
                    .filter(|l| (a..=b).contains(l))
                    .collect();
                for l in lines {
                    n += g.eng.reclassify(0, l, class) as u64;
                }
            } else {
                for l in a..=b {
                    n += g.eng.reclassify(0, l, class) as u64;
                }
            }
        }
        self.metrics
            .relabelled_lines
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Lets the classifier learn from the volume's current contents when it asks to (at
    /// start, and when a file system appeared): cached lines first, else the backing
    /// device; nothing is admitted and no counter moves.
    pub fn learn_classifier(&self) {
        let Some(c) = &self.classifier else {
            return;
        };
        if !c.wants_learn() {
            return;
        }
        {
            let mut g = self.lock();
            let mut line_buf = vec![0u8; self.line as usize];
            c.learn(&mut |off, buf| {
                if g.read_current(off, buf, &mut line_buf).is_err() {
                    buf.fill(0);
                }
            });
        }
        self.relabel(c.take_relabels());
    }
}

impl Inner {
    /// The volume's current bytes at `offset` (a cached line, else the backing device),
    /// without admitting anything or counting a request.
    fn read_current(&mut self, offset: u64, buf: &mut [u8], line: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if self.pass_through || self.detached {
            return self.backing.read_at(buf, offset);
        }
        let ls = self.ls();
        let end = offset + buf.len() as u64;
        for l in offset / ls..=(end - 1) / ls {
            self.current_line(l, line)?;
            let (a, b) = ((l * ls).max(offset), ((l + 1) * ls).min(end));
            buf[(a - offset) as usize..(b - offset) as usize]
                .copy_from_slice(&line[(a - l * ls) as usize..(b - l * ls) as usize]);
        }
        Ok(())
    }
}
