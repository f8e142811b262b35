//! Live request classification (issue 7): which I/O class a request of the export belongs to,
//! so that `--policy dss` (selective allocation and eviction) and the per-class statistics
//! work on a live volume.
//!
//! The volume calls a [`Classifier`] for every read and write *before* the engine plans it
//! (the class goes into [`Request::class`]), tells it the data of every completed read, and
//! applies the relabels it reports to lines already cached:
//!
//! * [`RulesClassifier`] (`--classifier rules`): the class table's `[[rule]]`s (offset range,
//!   request size range, direction, volume; first match wins; classes by id or by name), or a
//!   separate rules file. Requests no rule matches are class 0.
//! * [`Ext4Classifier`] (`--classifier ext4`): learns the layout of an ext4 file system from
//!   the blocks passing through (superblock, group descriptors, bitmaps, inode tables, journal
//!   with its descriptor blocks, directory and file extents with each file's size; see
//!   `tiercache_ext4`) and maps each block to the file-system table's class names (`metadata`,
//!   `journal`, `directory`, `file<4KiB` .. `file>1GiB`). Blocks it cannot name (no ext4
//!   superblock seen, or not owned by any inode it knows) fall back to the rules (class 0
//!   without rules). Writes are learned from before they are classified (a write to an inode
//!   table updates the file's extents and size); reads after the data came back.
//!
//! Cost in the hot path: one mutex around the ext4 state per read and write; `observe` parses
//! only metadata blocks (data blocks cost two B-tree lookups each). No device I/O happens per
//! request. At start, and once more whenever an ext4 superblock appears, the classifier
//! learns from the volume's current contents ([`Ext4Classifier::learn_from`] through
//! `CacheVolume::learn_classifier`: superblock, descriptors, the used part of every inode table,
//! the extent tree blocks; cached sectors first, then the backing device; nothing is inserted
//! in the cache): a server restarted under a still-mounted file system knows it at once, and
//! blocks written before the superblock (mkfs writes it last) are understood.
//!
//! Relabelling: ext4 in ordered mode writes a new file's data before the journal commit that
//! names it, so such data is cached as class 0. The ext4 classifier records the block ranges
//! whose owner or size class changed and the volume relabels the cached lines
//! (`Engine::reclassify`; DSS moves them to the new class's list).
//!
//! Not persisted: a line's class is not in the on-disk record; after a restart cached lines
//! are class 0 until touched or relabelled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tiercache_engine::{ClassTable, Op, Request};
use tiercache_ext4::{class_name, BlockKind, FS_CLASSES};

/// A live request classifier (see the module documentation).
pub trait Classifier: Send + Sync {
    /// `rules`, `ext4`, ...
    fn name(&self) -> &'static str;
    /// The class of `req`, about to be planned; `data` is the payload of a write.
    fn classify(&self, req: &Request, data: Option<&[u8]>) -> u8;
    /// A read of `data` at `offset` completed.
    fn observe_read(&self, _offset: u64, _data: &[u8]) {}
    /// Byte ranges `(offset, len, class)` whose class is now known to differ from what it was
    /// (lines cached there should be relabelled); empty for most classifiers.
    fn take_relabels(&self) -> Vec<(u64, u64, u8)> {
        Vec::new()
    }
    /// Whether the classifier wants to (re)learn from the volume's current contents (the ext4
    /// classifier: once at start, and when a file system appears, since blocks written before
    /// its superblock could not be understood when they passed).
    fn wants_learn(&self) -> bool {
        false
    }
    /// Learns through `read_at(offset, buf)` (the volume's current contents).
    fn learn(&self, _read_at: &mut dyn FnMut(u64, &mut [u8])) {}
    /// What the classifier knows, for `ctl stats`.
    fn summary(&self) -> serde_json::Value {
        serde_json::json!({ "name": self.name() })
    }
    /// Whether the classifier can work over `table` (`ctl classes load`): the rules
    /// classifier needs rules, the ext4 one file-system class names. Why not, if not.
    fn check_table(&self, table: &ClassTable) -> Result<(), String>;
    /// Classifies by `table` from the next request on (checked by
    /// [`Classifier::check_table`] first). What was learned (ext4's file system) is kept.
    fn set_table(&self, table: Arc<ClassTable>);
}

/// `--classifier` values.
pub const CLASSIFIERS: [&str; 3] = ["none", "rules", "ext4"];

/// Builds the classifier named `name` over `table`; `None` for `none`.
pub fn by_name(name: &str, table: Arc<ClassTable>) -> Result<Option<Arc<dyn Classifier>>, String> {
    match name {
        "none" => Ok(None),
        "rules" => Ok(Some(Arc::new(RulesClassifier::new(table)?))),
        "ext4" => Ok(Some(Arc::new(Ext4Classifier::new(table)?))),
        _ => Err(format!(
            "unknown classifier {name:?} (known: {})",
            CLASSIFIERS.join(", ")
        )),
    }
}

/// Builds the classifier `name` over `table` for each of `vol`'s volumes and hooks them in
/// (before the volume is shared). The ext4 classifier first learns an existing file system
/// from its volume's current contents (see the module documentation). Returns the
/// classifiers' summary.
pub fn attach(
    vol: &mut crate::CacheVolume,
    name: &str,
    table: Arc<ClassTable>,
) -> Result<Option<serde_json::Value>, String> {
    vol.attach_classifiers(name, table)
}

/// Classes from the table's rules.
pub struct RulesClassifier {
    table: RwLock<Arc<ClassTable>>,
}

/// The class of `req` by `table`'s rules (first match), 0 when none matches.
fn by_rules(table: &ClassTable, req: &Request) -> u8 {
    table
        .rules
        .iter()
        .find(|r| r.matches(req))
        .map_or(0, |r| r.class)
}

impl RulesClassifier {
    /// Fails when the table has no rules.
    pub fn new(table: Arc<ClassTable>) -> Result<Self, String> {
        Self::check(&table)?;
        Ok(RulesClassifier {
            table: RwLock::new(table),
        })
    }

    fn check(table: &ClassTable) -> Result<(), String> {
        if table.rules.is_empty() {
            return Err(format!(
                "--classifier rules: class table {:?} has no [[rule]] (add rules to it or give --class-rules FILE)",
                table.name
            ));
        }
        Ok(())
    }

    fn class_of(&self, req: &Request) -> u8 {
        let t: Arc<ClassTable> = read(&self.table);
        by_rules(&t, req)
    }
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(|e| e.into_inner()).clone()
}

impl Classifier for RulesClassifier {
    fn name(&self) -> &'static str {
        "rules"
    }
    fn classify(&self, req: &Request, _data: Option<&[u8]>) -> u8 {
        self.class_of(req)
    }
    fn summary(&self) -> serde_json::Value {
        serde_json::json!({ "name": "rules", "rules": read(&self.table).rules.len() })
    }
    fn check_table(&self, table: &ClassTable) -> Result<(), String> {
        Self::check(table)
    }
    fn set_table(&self, table: Arc<ClassTable>) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
    }
}

/// The ext4-aware classifier, online (see the module documentation).
pub struct Ext4Classifier {
    /// The class table, and the class id per `FS_CLASSES` entry (`None`: the table lacks
    /// that name; rules decide).
    table: RwLock<Arc<Ext4Table>>,
    fs: Mutex<State>,
    /// Requests classified by ext4 knowledge, and by the rules fallback.
    by_ext4: AtomicU64,
    by_fallback: AtomicU64,
}

struct State {
    fs: tiercache_ext4::Ext4Classifier,
    relabels: Vec<(u64, u64, u8)>,
    /// ext4 was recognised when last looked (a change to true asks for a learn pass).
    was_ext4: bool,
    learn_pending: bool,
}

/// The ext4 classifier's view of its class table.
struct Ext4Table {
    table: Arc<ClassTable>,
    ids: [Option<u8>; FS_CLASSES.len()],
}

impl Ext4Table {
    /// Fails when the table names none of the file-system classes.
    fn new(table: Arc<ClassTable>) -> Result<Self, String> {
        let mut ids = [None; FS_CLASSES.len()];
        for (i, n) in FS_CLASSES.iter().enumerate() {
            ids[i] = table.id_of(n);
        }
        if ids.iter().all(Option::is_none) {
            return Err(format!(
                "--classifier ext4: class table {:?} has none of the file-system class names ({}); use experiments/classes/filesystem.toml or name classes so",
                table.name,
                FS_CLASSES.join(", ")
            ));
        }
        Ok(Ext4Table { table, ids })
    }
}

impl Ext4Classifier {
    /// Fails when the table names none of the file-system classes.
    pub fn new(table: Arc<ClassTable>) -> Result<Self, String> {
        let table = RwLock::new(Arc::new(Ext4Table::new(table)?));
        let mut fs = tiercache_ext4::Ext4Classifier::new();
        fs.track_changes(true);
        Ok(Ext4Classifier {
            table,
            fs: Mutex::new(State {
                fs,
                relabels: Vec::new(),
                was_ext4: false,
                learn_pending: true,
            }),
            by_ext4: AtomicU64::new(0),
            by_fallback: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.fs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns an existing file system through `read_at(offset, buf)` (the volume's current
    /// contents). Returns whether ext4 was found. Blocks whose class this teaches are
    /// relabelled like any other change (lines restored after a restart, data written before
    /// the superblock).
    pub fn learn_from(&self, read_at: impl FnMut(u64, &mut [u8])) -> bool {
        let mut st = self.lock();
        let found = st.fs.learn_from_image(read_at);
        st.learn_pending = false;
        st.was_ext4 = st.fs.is_ext4();
        self.collect_changes(&mut st);
        // Fixed metadata (inode tables, bitmaps, descriptors) written before the superblock
        // was seen was cached as class 0: relabel it too.
        if let (true, Some(bs), Some(c)) = (
            found,
            st.fs.block_size(),
            self.class_of_kind(BlockKind::InodeTable),
        ) {
            for (a, b) in st.fs.fixed_metadata() {
                st.relabels.push((a * bs, (b - a) * bs, c));
            }
        }
        found
    }

    /// The class id of `kind` under the table, if ext4 names it.
    pub fn class_of_kind(&self, kind: BlockKind) -> Option<u8> {
        let name = class_name(kind);
        let i = FS_CLASSES.iter().position(|n| *n == name)?;
        read(&self.table).ids[i]
    }

    /// The kind of the byte range (for tests and tools).
    pub fn kind_of(&self, offset: u64, len: u64) -> BlockKind {
        self.lock().fs.classify(offset, len)
    }

    fn fallback(&self, req: &Request) -> u8 {
        self.by_fallback.fetch_add(1, Ordering::Relaxed);
        by_rules(&read(&self.table).table, req)
    }

    /// Turns the classifier's change log into byte-range relabels; notes a new file system.
    fn collect_changes(&self, st: &mut State) {
        let is = st.fs.is_ext4();
        if is && !st.was_ext4 {
            st.learn_pending = true;
        }
        st.was_ext4 = is;
        let changes = st.fs.take_changes();
        if changes.is_empty() {
            return;
        }
        let Some(bs) = st.fs.block_size() else {
            return;
        };
        for (a, b) in changes {
            let kind = st.fs.classify_block(a);
            if let Some(c) = self.class_of_kind(kind) {
                if st.relabels.len() < tiercache_ext4::MAX_CHANGES {
                    st.relabels.push((a * bs, (b - a) * bs, c));
                }
            }
        }
    }
}

impl Classifier for Ext4Classifier {
    fn name(&self) -> &'static str {
        "ext4"
    }

    fn classify(&self, req: &Request, data: Option<&[u8]>) -> u8 {
        if !matches!(req.op, Op::Read | Op::Write) || req.len == 0 {
            return self.fallback(req);
        }
        let kind = {
            let mut st = self.lock();
            if let Some(d) = data {
                st.fs.observe(req.offset, d);
                self.collect_changes(&mut st);
            }
            st.fs.classify(req.offset, req.len)
        };
        match self.class_of_kind(kind) {
            Some(c) => {
                self.by_ext4.fetch_add(1, Ordering::Relaxed);
                c
            }
            None => self.fallback(req),
        }
    }

    fn observe_read(&self, offset: u64, data: &[u8]) {
        let mut st = self.lock();
        st.fs.observe(offset, data);
        self.collect_changes(&mut st);
    }

    fn take_relabels(&self) -> Vec<(u64, u64, u8)> {
        let mut st = self.lock();
        std::mem::take(&mut st.relabels)
    }

    fn wants_learn(&self) -> bool {
        self.lock().learn_pending
    }

    fn learn(&self, read_at: &mut dyn FnMut(u64, &mut [u8])) {
        self.learn_from(read_at);
    }

    fn summary(&self) -> serde_json::Value {
        let st = self.lock();
        let s = st.fs.stats();
        serde_json::json!({
            "name": "ext4",
            "ext4_found": st.fs.is_ext4(),
            "block_size": st.fs.block_size(),
            "inodes": s.inodes,
            "extents": s.extents,
            "tree_nodes": s.tree_nodes,
            "groups": s.groups,
            "memory_bytes": st.fs.approx_memory_bytes(),
            "requests_by_ext4": self.by_ext4.load(Ordering::Relaxed),
            "requests_by_fallback": self.by_fallback.load(Ordering::Relaxed),
        })
    }

    fn check_table(&self, table: &ClassTable) -> Result<(), String> {
        Ext4Table::new(Arc::new(table.clone())).map(|_| ())
    }

    fn set_table(&self, table: Arc<ClassTable>) {
        if let Ok(t) = Ext4Table::new(table) {
            *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
        }
    }
}

/// The class table in force, for `ctl stats` (`class_table`) and `ctl get classes`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClassTableInfo {
    /// The table's `name`.
    pub name: String,
    /// Where it came from: `serve flags` (`--classes`/`--class-rules`/`--classifier`), or
    /// the file(s) of the last `ctl classes load`.
    pub source: String,
    /// Classes the table names (the others are `classN`, conditional, priority 15).
    pub classes: usize,
    pub rules: usize,
    /// Times `ctl classes load` replaced the table since the start.
    pub loads: u64,
}

/// What `ctl classes load` changed (`CacheVolume::load_classes`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClassesLoaded {
    /// The table before ([`table_summary`]); `None`: there was none.
    pub old: Option<String>,
    pub new: String,
    /// The classifier that uses it (`None`: requests are class 0; only class 0's policy
    /// matters).
    pub classifier: Option<&'static str>,
    /// Lines cached at the change (they keep their class id).
    pub cached_lines: u64,
    pub loads: u64,
}

/// Where a volume keeps its class table, borrowed for [`load_table`].
pub(crate) struct TableSlot<'a> {
    pub table: &'a mut Option<Arc<ClassTable>>,
    pub source: &'a mut String,
    pub loads: &'a mut u64,
}

/// The part of `ctl classes load` both layouts share, run under the volume lock after the
/// layout's own refusals (closed, failed cache): the classifiers (one per volume) check the
/// table, the engine
/// takes it (`engine_takes`; its refusal is named after `what_engine`), then the classifier,
/// the slot and the counters change. Nothing changes when a check fails. Logs the change.
pub(crate) fn load_table(
    classifiers: &[Arc<dyn Classifier>],
    table: ClassTable,
    source: &str,
    what_engine: &str,
    engine_takes: impl FnOnce(Arc<ClassTable>) -> Result<(), String>,
    slot: TableSlot<'_>,
    cached_lines: u64,
) -> Result<ClassesLoaded, String> {
    let t = Arc::new(table);
    for c in classifiers {
        c.check_table(&t)
            .map_err(|e| format!("{source}: {e} (the running classifier is {:?})", c.name()))?;
    }
    engine_takes(Arc::clone(&t))
        .map_err(|e| format!("{source}: {what_engine} cannot take this table: {e}"))?;
    for c in classifiers {
        c.set_table(Arc::clone(&t));
    }
    let old = slot.table.replace(Arc::clone(&t));
    *slot.source = source.to_string();
    *slot.loads += 1;
    let r = ClassesLoaded {
        old: old.as_deref().map(table_summary),
        new: table_summary(&t),
        classifier: classifiers.first().map(|c| c.name()),
        cached_lines,
        loads: *slot.loads,
    };
    tracing::info!(
        target: crate::tuning::LOG_TARGET,
        "class table: {} -> {} (from {source}; {} cached lines keep their class ids)",
        r.old.as_deref().unwrap_or("none"),
        r.new,
        r.cached_lines
    );
    Ok(r)
}

/// Classes `t` names (those not left at the default name `classN`).
pub fn named_classes(t: &ClassTable) -> usize {
    (0..tiercache_engine::NUM_CLASSES)
        .filter(|&i| t.classes[i].name != format!("class{i}"))
        .count()
}

/// `"NAME" (N classes, R rules)` for the log and the replies.
pub fn table_summary(t: &ClassTable) -> String {
    format!(
        "{:?} ({} classes, {} rules)",
        t.name,
        named_classes(t),
        t.rules.len()
    )
}

/// A class table from the text of a table file and, optionally, of a rules file replacing
/// its rules, as `serve --classes FILE --class-rules RULES` reads them; each text comes with
/// its file name, and errors name the file and line.
pub fn table_from_text(
    table: (&str, &str),
    rules: Option<(&str, &str)>,
) -> Result<ClassTable, String> {
    let mut t = ClassTable::parse(table.0, table.1).map_err(|e| e.to_string())?;
    if let Some((text, file)) = rules {
        t.parse_rules(text, file).map_err(|e| e.to_string())?;
    }
    Ok(t)
}

/// One class in `ctl stats`: name, occupancy and counters.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClassStats {
    pub id: u8,
    pub name: String,
    /// Lines cached with this class (the class each line was cached or last relabelled as).
    pub cached_lines: u64,
    pub dirty_lines: u64,
    pub counters: tiercache_engine::Counters,
}

/// Per-class statistics of `e`: classes with requests or cached lines, named by `table`
/// (by the id's digits without a table, so Prometheus labels read `class="0"` as before).
pub fn class_stats(e: &tiercache_engine::Engine, table: Option<&ClassTable>) -> Vec<ClassStats> {
    let n = tiercache_engine::NUM_CLASSES;
    let mut cached = vec![0u64; n];
    let mut dirty = vec![0u64; n];
    for (_, slot, d) in e.entries() {
        let c = e.line_class(slot) as usize;
        cached[c] += 1;
        dirty[c] += d as u64;
    }
    (0..n as u8)
        .filter(|&c| e.class_counters(c).requests > 0 || cached[c as usize] > 0)
        .map(|c| ClassStats {
            id: c,
            name: match table {
                Some(t) if !t.name_of(c).is_empty() => t.name_of(c).to_string(),
                _ => c.to_string(),
            },
            cached_lines: cached[c as usize],
            dirty_lines: dirty[c as usize],
            counters: *e.class_counters(c),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_need_rules_and_unmatched_is_class_zero() {
        let fs = Arc::new(ClassTable::filesystem());
        assert!(by_name("rules", fs.clone()).is_err());
        assert!(by_name("bogus", fs.clone()).is_err());
        assert!(by_name("none", fs.clone()).unwrap().is_none());
        let mut t = ClassTable::filesystem();
        t.parse_rules(
            "version = 1\n[[rule]]\nclass = \"metadata\"\noffset = [0, 65536]\n[[rule]]\nclass = \"file<4KiB\"\nop = \"write\"\nsize = [0, 4097]\n",
            "r.toml",
        )
        .unwrap();
        let c = by_name("rules", Arc::new(t)).unwrap().unwrap();
        assert_eq!(c.classify(&Request::read(4096, 4096), None), 1);
        assert_eq!(
            c.classify(&Request::write(1 << 20, 4096), Some(&[0; 4096])),
            8
        );
        assert_eq!(c.classify(&Request::read(1 << 20, 4096), None), 0);
    }

    /// `ctl classes load`: both classifiers check a new table before taking it, and classify
    /// by it afterwards (ext4: its class-name map; rules: its rules).
    #[test]
    fn classifiers_take_a_checked_table_live() {
        let e = Ext4Classifier::new(Arc::new(ClassTable::filesystem())).unwrap();
        assert_eq!(e.class_of_kind(BlockKind::InodeTable), Some(1));
        assert!(e.check_table(&ClassTable::database()).is_err());
        let t = ClassTable::parse(
            "version = 1\n[[class]]\nid = 7\nname = \"metadata\"\npriority = 0\nallocation = \"always\"\n",
            "t.toml",
        )
        .unwrap();
        e.check_table(&t).unwrap();
        e.set_table(Arc::new(t));
        assert_eq!(e.class_of_kind(BlockKind::InodeTable), Some(7));
        assert_eq!(
            e.class_of_kind(BlockKind::Journal),
            None,
            "not named: rules decide"
        );

        let mut t = ClassTable::filesystem();
        t.parse_rules("version = 1\n[[rule]]\nclass = 1\n", "r.toml")
            .unwrap();
        let r = by_name("rules", Arc::new(t)).unwrap().unwrap();
        assert_eq!(r.classify(&Request::read(0, 4096), None), 1);
        assert!(
            r.check_table(&ClassTable::filesystem()).is_err(),
            "no rules"
        );
        let mut t = ClassTable::filesystem();
        t.parse_rules("version = 1\n[[rule]]\nclass = 8\n", "r.toml")
            .unwrap();
        r.set_table(Arc::new(t));
        assert_eq!(r.classify(&Request::read(0, 4096), None), 8);
    }

    #[test]
    fn ext4_without_a_file_system_falls_back() {
        let c = Ext4Classifier::new(Arc::new(ClassTable::filesystem())).unwrap();
        assert_eq!(c.classify(&Request::write(0, 4096), Some(&[7; 4096])), 0);
        assert_eq!(c.kind_of(0, 4096), BlockKind::Unknown);
        assert_eq!(c.summary()["requests_by_fallback"], 1);
        assert!(Ext4Classifier::new(Arc::new(ClassTable::database())).is_err());
    }
}
