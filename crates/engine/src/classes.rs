//! I/O classes (DSS): ids 0..=31 with names and a per-class cache policy: priority (0 is
//! highest), allocation (always / conditional / never), an object-size hint for eviction order,
//! optional partition bounds (min/max share of the cache), and classification rules.
//!
//! Tables are TOML (see `experiments/classes/*.toml`):
//!
//! ```toml
//! version = 1
//! name = "filesystem"
//! clean_threshold = 0.15        # DSS: allocate everything while > 15 % of the cache is clean
//! classify = "trace"            # "trace": the request's class column; "rules": [[rule]]s
//!
//! [[class]]
//! id = 1
//! name = "metadata"
//! priority = 0
//! allocation = "always"         # always | conditional | never (= bypass)
//! object_size = 4096            # bytes; within a priority, larger objects are evicted first
//! min_share = 0.0               # partitions: keep at least this share of the cache ...
//! max_share = 1.0               # ... and never more than this share
//!
//! [[rule]]                      # first matching rule wins; unmatched requests keep their class
//! class = 4                     # an id, or a class name of this table: class = "metadata"
//! op = "write"                  # read | write
//! offset = [0, 1073741824]      # byte range [start, end)
//! size = [0, 65536]             # request length range [min, max)
//! volume = 0
//! ```

use crate::request::{Op, Request, NUM_CLASSES};
use serde::Deserialize;
use std::fmt;
use std::path::Path;

/// Current table format version.
pub const TABLE_VERSION: u32 = 1;
/// Default DSS clean threshold (the seed: "if more than 15 percent of the cache is clean,
/// everything is allocated").
pub const DEFAULT_CLEAN_THRESHOLD: f64 = 0.15;

/// How a class is allocated on a miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Allocation {
    /// Always allocated (metadata, small files).
    Always,
    /// Allocated only while the cache has more than the clean threshold of clean space.
    Conditional,
    /// Never allocated: bypasses the cache.
    Never,
}

impl Allocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Allocation::Always => "always",
            Allocation::Conditional => "conditional",
            Allocation::Never => "never",
        }
    }
}

/// The policy of one class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassPolicy {
    pub name: String,
    /// 0 is the highest priority (evicted last).
    pub priority: u8,
    pub allocation: Allocation,
    /// Typical (upper) object size of this class in bytes; None = unknown (treated as 0).
    pub object_size: Option<u64>,
    /// Partition bounds as shares of the cache (0..=1).
    pub min_share: f64,
    pub max_share: f64,
}

impl Default for ClassPolicy {
    fn default() -> Self {
        ClassPolicy {
            name: String::new(),
            priority: DEFAULT_PRIORITY,
            allocation: Allocation::Conditional,
            object_size: None,
            min_share: 0.0,
            max_share: 1.0,
        }
    }
}

/// Priority of classes a table does not list.
pub const DEFAULT_PRIORITY: u8 = 15;

/// A classification rule: every given condition must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub class: u8,
    pub op: Option<Op>,
    pub offset: Option<(u64, u64)>,
    pub size: Option<(u64, u64)>,
    pub volume: Option<u32>,
}

impl Rule {
    pub fn matches(&self, r: &Request) -> bool {
        self.op.is_none_or(|op| op == r.op)
            && self
                .offset
                .is_none_or(|(a, b)| r.offset >= a && r.offset < b)
            && self.size.is_none_or(|(a, b)| r.len >= a && r.len < b)
            && self.volume.is_none_or(|v| v == r.volume)
    }
}

/// Where a request's class comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Classify {
    /// The class column of the trace (or the generator's label).
    Trace,
    /// The table's rules; requests no rule matches keep their trace class.
    Rules,
}

/// A class policy table.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassTable {
    pub name: String,
    pub clean_threshold: f64,
    pub classify: Classify,
    pub classes: Vec<ClassPolicy>,
    pub rules: Vec<Rule>,
    /// Class ids in eviction order: lowest priority first, then largest objects, then id.
    evict_order: [u8; NUM_CLASSES],
    /// Each class's eviction rank (0 = evicted first): classes with the same priority and
    /// object size share a rank, and DSS evicts LRU across them.
    evict_rank: [u8; NUM_CLASSES],
}

/// A table could not be read or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {msg}")]
    Toml { file: String, msg: String },
    #[error("{file}:{line}: {msg}")]
    Invalid {
        file: String,
        line: usize,
        msg: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    version: u32,
    #[serde(default)]
    name: String,
    clean_threshold: Option<f64>,
    classify: Option<Classify>,
    #[serde(default)]
    class: Vec<RawClass>,
    #[serde(default)]
    rule: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    id: i64,
    name: String,
    priority: i64,
    allocation: Allocation,
    object_size: Option<u64>,
    min_share: Option<f64>,
    max_share: Option<f64>,
}

/// A rule's class: an id or the name of a class of the table.
#[derive(Deserialize)]
#[serde(untagged)]
enum ClassRef {
    Id(i64),
    Name(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    class: ClassRef,
    op: Option<String>,
    offset: Option<[u64; 2]>,
    size: Option<[u64; 2]>,
    volume: Option<u32>,
}

/// Line (1-based) of the `n`-th (0-based) occurrence of the array-of-tables header `[[key]]`.
fn header_line(text: &str, key: &str, n: usize) -> usize {
    let hdr = format!("[[{key}]]");
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with(&hdr))
        .nth(n)
        .map(|(i, _)| i + 1)
        .unwrap_or(1)
}

impl ClassTable {
    /// A table with every class conditional at the default priority (LRU among all).
    pub fn uniform() -> Self {
        let mut t = ClassTable {
            name: "uniform".into(),
            clean_threshold: DEFAULT_CLEAN_THRESHOLD,
            classify: Classify::Trace,
            classes: (0..NUM_CLASSES)
                .map(|i| ClassPolicy {
                    name: format!("class{i}"),
                    ..Default::default()
                })
                .collect(),
            rules: Vec::new(),
            evict_order: [0; NUM_CLASSES],
            evict_rank: [0; NUM_CLASSES],
        };
        t.finish();
        t
    }

    /// The seed's file-system table (also `experiments/classes/filesystem.toml`).
    pub fn filesystem() -> Self {
        Self::parse(FILESYSTEM_TOML, "<built-in filesystem table>").expect("built-in table")
    }

    /// The seed's database table (also `experiments/classes/database.toml`).
    pub fn database() -> Self {
        Self::parse(DATABASE_TOML, "<built-in database table>").expect("built-in table")
    }

    /// Reads a table file; errors name the file and line.
    pub fn load(path: &Path) -> Result<Self, TableError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TableError::Io {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text, &file)
    }

    /// Parses a table; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, TableError> {
        let raw: RawTable = toml::from_str(text).map_err(|e| TableError::Toml {
            file: file.to_string(),
            msg: e.to_string().trim_end().to_string(),
        })?;
        let bad = |key: &str, n: usize, msg: String| TableError::Invalid {
            file: file.to_string(),
            line: header_line(text, key, n),
            msg,
        };
        if raw.version != TABLE_VERSION {
            return Err(TableError::Invalid {
                file: file.to_string(),
                line: text
                    .lines()
                    .position(|l| l.trim_start().starts_with("version"))
                    .map_or(1, |i| i + 1),
                msg: format!(
                    "table version {} is not supported (this build reads version {TABLE_VERSION})",
                    raw.version
                ),
            });
        }
        let mut t = ClassTable::uniform();
        t.name = raw.name;
        if let Some(c) = raw.clean_threshold {
            if !(0.0..=1.0).contains(&c) {
                return Err(TableError::Invalid {
                    file: file.to_string(),
                    line: text
                        .lines()
                        .position(|l| l.trim_start().starts_with("clean_threshold"))
                        .map_or(1, |i| i + 1),
                    msg: format!("clean_threshold {c} is not a share between 0 and 1"),
                });
            }
            t.clean_threshold = c;
        }
        let mut seen = [false; NUM_CLASSES];
        for (n, c) in raw.class.into_iter().enumerate() {
            if !(0..NUM_CLASSES as i64).contains(&c.id) {
                return Err(bad(
                    "class",
                    n,
                    format!("class id {} is not in 0..=31", c.id),
                ));
            }
            let id = c.id as usize;
            if seen[id] {
                return Err(bad("class", n, format!("class id {id} is defined twice")));
            }
            seen[id] = true;
            if !(0..=255).contains(&c.priority) {
                return Err(bad(
                    "class",
                    n,
                    format!("priority {} of class {id} is not in 0..=255", c.priority),
                ));
            }
            let min = c.min_share.unwrap_or(0.0);
            let max = c.max_share.unwrap_or(1.0);
            if !(0.0..=1.0).contains(&min) || !(0.0..=1.0).contains(&max) || min > max {
                return Err(bad(
                    "class",
                    n,
                    format!("class {id}: need 0 <= min_share ({min}) <= max_share ({max}) <= 1"),
                ));
            }
            t.classes[id] = ClassPolicy {
                name: c.name,
                priority: c.priority as u8,
                allocation: c.allocation,
                object_size: c.object_size,
                min_share: min,
                max_share: max,
            };
        }
        let min_sum: f64 = t.classes.iter().map(|c| c.min_share).sum();
        if min_sum > 1.0 + 1e-9 {
            return Err(bad(
                "class",
                0,
                format!("the classes' min_share add up to {min_sum:.3} > 1"),
            ));
        }
        t.rules = t.resolve_rules(raw.rule, text, file)?;
        t.classify = raw.classify.unwrap_or(if t.rules.is_empty() {
            Classify::Trace
        } else {
            Classify::Rules
        });
        if t.classify == Classify::Rules && t.rules.is_empty() {
            return Err(TableError::Invalid {
                file: file.to_string(),
                line: 1,
                msg: "classify = \"rules\" but the table has no [[rule]]".into(),
            });
        }
        t.finish();
        Ok(t)
    }

    /// Checks raw rules against this table's classes (names resolve to ids).
    fn resolve_rules(
        &self,
        raw: Vec<RawRule>,
        text: &str,
        file: &str,
    ) -> Result<Vec<Rule>, TableError> {
        let bad = |n: usize, msg: String| TableError::Invalid {
            file: file.to_string(),
            line: header_line(text, "rule", n),
            msg,
        };
        let mut rules = Vec::with_capacity(raw.len());
        for (n, r) in raw.into_iter().enumerate() {
            let class = match r.class {
                ClassRef::Id(id) if (0..NUM_CLASSES as i64).contains(&id) => id as u8,
                ClassRef::Id(id) => {
                    return Err(bad(n, format!("rule class {id} is not in 0..=31")));
                }
                ClassRef::Name(name) => self.id_of(&name).ok_or_else(|| {
                    bad(
                        n,
                        format!(
                            "rule class {name:?} is not a class of table {:?}",
                            self.name
                        ),
                    )
                })?,
            };
            let op = match r.op.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None => None,
                Some("read") => Some(Op::Read),
                Some("write") => Some(Op::Write),
                Some(o) => return Err(bad(n, format!("op '{o}': use read or write"))),
            };
            for (what, range) in [("offset", r.offset), ("size", r.size)] {
                if let Some([a, b]) = range {
                    if a >= b {
                        return Err(bad(n, format!("{what} range [{a}, {b}) is empty")));
                    }
                }
            }
            rules.push(Rule {
                class,
                op,
                offset: r.offset.map(|[a, b]| (a, b)),
                size: r.size.map(|[a, b]| (a, b)),
                volume: r.volume,
            });
        }
        Ok(rules)
    }

    /// Replaces the rules with those of a separate rules file (`version = 1` and `[[rule]]`s
    /// only; classes by id or by this table's names) and classifies by rules.
    pub fn load_rules(&mut self, path: &Path) -> Result<(), TableError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TableError::Io {
            file: file.clone(),
            source,
        })?;
        self.parse_rules(&text, &file)
    }

    /// [`ClassTable::load_rules`] from text; `file` names it in errors.
    pub fn parse_rules(&mut self, text: &str, file: &str) -> Result<(), TableError> {
        let raw: RawTable = toml::from_str(text).map_err(|e| TableError::Toml {
            file: file.to_string(),
            msg: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |line: usize, msg: String| TableError::Invalid {
            file: file.to_string(),
            line,
            msg,
        };
        if raw.version != TABLE_VERSION {
            return Err(invalid(
                1,
                format!("rules version {} is not supported", raw.version),
            ));
        }
        if !raw.class.is_empty() {
            return Err(invalid(
                header_line(text, "class", 0),
                "a rules file holds only [[rule]]s (classes come from the class table)".into(),
            ));
        }
        if raw.rule.is_empty() {
            return Err(invalid(1, "the rules file has no [[rule]]".into()));
        }
        self.rules = self.resolve_rules(raw.rule, text, file)?;
        self.classify = Classify::Rules;
        Ok(())
    }

    fn finish(&mut self) {
        let mut ids: Vec<u8> = (0..NUM_CLASSES as u8).collect();
        ids.sort_by_key(|&i| {
            let c = &self.classes[i as usize];
            (
                std::cmp::Reverse(c.priority),
                std::cmp::Reverse(c.object_size.unwrap_or(0)),
                i,
            )
        });
        self.evict_order.copy_from_slice(&ids);
        let key = |i: u8| {
            let c = &self.classes[i as usize];
            (c.priority, c.object_size.unwrap_or(0))
        };
        let mut rank = 0u8;
        for (n, &i) in ids.iter().enumerate() {
            if n > 0 && key(ids[n - 1]) != key(i) {
                rank += 1;
            }
            self.evict_rank[i as usize] = rank;
        }
    }

    /// Class ids in eviction order (first = evicted first).
    pub fn evict_order(&self) -> &[u8; NUM_CLASSES] {
        &self.evict_order
    }

    /// A class's eviction rank: 0 is evicted first; classes that tie on priority and object
    /// size share a rank (DSS keeps one LRU list per rank).
    pub fn evict_rank(&self, id: u8) -> u8 {
        self.evict_rank[id as usize]
    }

    pub fn class(&self, id: u8) -> &ClassPolicy {
        &self.classes[id as usize]
    }

    /// Whether any class has partition bounds.
    pub fn has_partitions(&self) -> bool {
        self.classes
            .iter()
            .any(|c| c.min_share > 0.0 || c.max_share < 1.0)
    }

    /// Whether any class is never allocated.
    pub fn has_bypass(&self) -> bool {
        self.classes
            .iter()
            .any(|c| c.allocation == Allocation::Never)
    }

    /// The class of a request under this table (rules, or the request's own class).
    pub fn classify(&self, r: &Request) -> u8 {
        if self.classify == Classify::Rules {
            if let Some(rule) = self.rules.iter().find(|rule| rule.matches(r)) {
                return rule.class;
            }
        }
        r.class
    }

    /// The name of class `id`.
    pub fn name_of(&self, id: u8) -> &str {
        &self.classes[id as usize].name
    }

    /// The id of the class named `name` (the lowest id if several share it).
    pub fn id_of(&self, name: &str) -> Option<u8> {
        self.classes
            .iter()
            .position(|c| c.name == name)
            .map(|i| i as u8)
    }
}

impl fmt::Display for ClassTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            if self.name.is_empty() {
                "classes"
            } else {
                &self.name
            }
        )
    }
}

/// The seed's file-system table, shipped as `experiments/classes/filesystem.toml`.
pub const FILESYSTEM_TOML: &str = include_str!("../../../experiments/classes/filesystem.toml");
/// The seed's database table, shipped as `experiments/classes/database.toml`.
pub const DATABASE_TOML: &str = include_str!("../../../experiments/classes/database.toml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_tables_parse_and_order_eviction() {
        let fs = ClassTable::filesystem();
        assert_eq!(fs.class(1).name, "metadata");
        assert_eq!(fs.class(1).priority, 0);
        assert_eq!(fs.class(1).allocation, Allocation::Always);
        // The > 1 GiB class is evicted before anything else listed; metadata last of all.
        let order = fs.evict_order();
        let pos = |id: u8| order.iter().position(|&x| x == id).unwrap();
        assert!(pos(18) < pos(8) && pos(8) < pos(1));
        assert!(pos(17) < pos(8));
        // Metadata and directories tie (priority 0, 4 KiB): one rank, evicted LRU; the
        // journal (32 MiB) ranks before them.
        assert_eq!(fs.evict_rank(1), fs.evict_rank(3));
        assert!(fs.evict_rank(2) < fs.evict_rank(1));
        assert!(fs.evict_rank(8) < fs.evict_rank(1) && fs.evict_rank(18) < fs.evict_rank(8));
        assert_eq!(fs.id_of("metadata"), Some(1));
        assert_eq!(fs.id_of("file>1GiB"), Some(18));
        assert_eq!(fs.id_of("no such class"), None);
        let db = ClassTable::database();
        assert_eq!(db.class(4).allocation, Allocation::Never);
        assert_eq!(db.class(5).allocation, Allocation::Never);
        assert_eq!(db.class(0).priority, 0);
        assert_eq!(db.class(3).priority, 3);
    }

    #[test]
    fn errors_name_file_and_line() {
        let text = "version = 1\n\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\n\n[[class]]\nid = 40\nname = \"b\"\npriority = 1\nallocation = \"never\"\n";
        let e = ClassTable::parse(text, "t.toml").unwrap_err().to_string();
        assert_eq!(e, "t.toml:9: class id 40 is not in 0..=31");
        let e = ClassTable::parse("version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"sometimes\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml: TOML parse error at line 6"), "{e}");
        let e = ClassTable::parse("version = 2\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml:1: table version 2"), "{e}");
        let e = ClassTable::parse(
            "version = 1\n[[rule]]\nclass = 2\nop = \"trim\"\n",
            "r.toml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "r.toml:2: op 'trim': use read or write");
    }

    #[test]
    fn rules_name_classes_and_come_from_a_separate_file() {
        let mut fs = ClassTable::filesystem();
        let text = "version = 1\n[[rule]]\nclass = \"metadata\"\noffset = [0, 1048576]\n[[rule]]\nclass = 12\nop = \"write\"\nsize = [0, 65536]\n";
        fs.parse_rules(text, "r.toml").unwrap();
        assert_eq!(fs.classify, Classify::Rules);
        assert_eq!(fs.classify(&Request::read(4096, 4096)), 1);
        assert_eq!(fs.classify(&Request::write(1 << 30, 4096)), 12);
        assert_eq!(fs.classify(&Request::read(1 << 30, 4096)), 0);
        let e = fs
            .parse_rules("version = 1\n\n[[rule]]\nclass = \"metdata\"\n", "r.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "r.toml:3: rule class \"metdata\" is not a class of table \"filesystem\""
        );
        let e = fs
            .parse_rules(
                "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\n",
                "r.toml",
            )
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("r.toml:2: a rules file holds only"), "{e}");
        // Names also resolve inside a table file, against the table's own classes.
        let t = ClassTable::parse(
            "version = 1\n[[class]]\nid = 5\nname = \"hot\"\npriority = 0\nallocation = \"always\"\n[[rule]]\nclass = \"hot\"\nsize = [0, 4097]\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(t.classify(&Request::read(0, 4096)), 5);
    }

    #[test]
    fn rules_classify_by_offset_size_op_volume() {
        let text = "version = 1\n[[rule]]\nclass = 3\nop = \"write\"\nsize = [0, 4096]\n[[rule]]\nclass = 7\noffset = [0, 1048576]\nvolume = 1\n";
        let t = ClassTable::parse(text, "r.toml").unwrap();
        assert_eq!(t.classify, Classify::Rules);
        let mut w = Request::write(8192, 512);
        assert_eq!(t.classify(&w), 3);
        w.len = 8192;
        assert_eq!(t.classify(&w), 0);
        let mut r = Request::read(4096, 8192);
        r.volume = 1;
        assert_eq!(t.classify(&r), 7);
        r.volume = 0;
        r.class = 9;
        assert_eq!(
            t.classify(&r),
            9,
            "unmatched requests keep their trace class"
        );
    }
}
