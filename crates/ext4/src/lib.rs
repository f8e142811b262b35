//! ext4-aware block classifier.
//!
//! A block cache only sees `(offset, data)` of the reads and writes passing through it. This
//! crate learns the layout of an ext4 file system from exactly that: the superblock, the group
//! descriptors, the inode tables and the extent tree blocks it sees, and labels every block with
//! the DSS file-system classes (`metadata`, `journal`, `directory`, `file<4KiB` .. `file>1GiB`).
//!
//! No I/O happens in the classifier: [`Ext4Classifier::observe`] parses byte slices, and
//! [`Ext4Classifier::learn_from_image`] pulls metadata through a caller-supplied read function.
//!
//! Memory: file and directory extents live in one interval map (`BTreeMap` keyed by the first
//! physical block), never per block; per live inode one small record keeps the extents it owns
//! so they can be withdrawn when the inode changes (file grows, is deleted, inode is reused).
//!
//! Extent-mapped and block-mapped (ext2/3 style indirect blocks) inodes are both learned;
//! indirect blocks count as metadata like extent tree blocks. Metadata logged in the jbd2
//! journal (descriptor blocks name the home block of each logged copy) is learned at commit.
//!
//! What is not learned (falls back to `Unallocated`): inline-data inodes (they own no blocks),
//! bigalloc file systems (refused: `Unknown`), external journals, and indirect blocks seen
//! before the inode that points at them (extent nodes seen early are kept and adopted).

#[cfg(feature = "testing")]
pub mod testing;
use std::collections::{BTreeMap, HashMap};

/// What a block of an ext4 file system holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// Primary or backup superblock.
    Superblock,
    /// Group descriptor table (primary, backup or reserved growth blocks).
    GroupDescriptors,
    /// Block or inode bitmap.
    Bitmap,
    /// Inode table.
    InodeTable,
    /// jbd2 journal (the journal inode's blocks).
    Journal,
    /// Directory data block (linear or htree).
    Directory,
    /// Extent tree node below the inode (index or leaf block).
    ExtentTree,
    /// Data block of a regular file (or symlink) whose current size is `size` bytes.
    File { size: u64 },
    /// The device holds ext4 but no learned metadata owns this block (free, or not yet learned).
    Unallocated,
    /// No ext4 superblock seen: the caller should fall back to its rules.
    Unknown,
}

/// The DSS file-system table classes, in priority order (metadata first, largest files last).
/// The names are those of `experiments/classes/filesystem.toml` (the class table maps them to
/// ids by name); size limits match the file-server generator: `file<4KiB` is a size below
/// 4096 bytes, ..., `file<1GiB` below 2^30, `file>1GiB` 2^30 bytes and more.
pub const FS_CLASSES: [&str; 14] = [
    "metadata",
    "journal",
    "directory",
    "file<4KiB",
    "file<16KiB",
    "file<64KiB",
    "file<256KiB",
    "file<1MiB",
    "file<4MiB",
    "file<16MiB",
    "file<64MiB",
    "file<256MiB",
    "file<1GiB",
    "file>1GiB",
];

/// Name of the DSS file-system class of `kind`. `Unknown` and `Unallocated` map to
/// `"unknown"` and `"unallocated"`, which are not file-system table classes: callers fall back
/// to their rule classifier for them.
pub fn class_name(kind: BlockKind) -> &'static str {
    match kind {
        BlockKind::Superblock
        | BlockKind::GroupDescriptors
        | BlockKind::Bitmap
        | BlockKind::InodeTable
        | BlockKind::ExtentTree => "metadata",
        BlockKind::Journal => "journal",
        BlockKind::Directory => "directory",
        BlockKind::File { size } => file_class(size),
        BlockKind::Unallocated => "unallocated",
        BlockKind::Unknown => "unknown",
    }
}

/// File size class name for a file of `size` bytes.
pub fn file_class(size: u64) -> &'static str {
    const K: u64 = 1024;
    const LIMITS: [(u64, &str); 10] = [
        (4 * K, "file<4KiB"),
        (16 * K, "file<16KiB"),
        (64 * K, "file<64KiB"),
        (256 * K, "file<256KiB"),
        (K * K, "file<1MiB"),
        (4 * K * K, "file<4MiB"),
        (16 * K * K, "file<16MiB"),
        (64 * K * K, "file<64MiB"),
        (256 * K * K, "file<256MiB"),
        (K * K * K, "file<1GiB"),
    ];
    LIMITS
        .iter()
        .find(|(limit, _)| size < *limit)
        .map_or("file>1GiB", |(_, name)| name)
}

const EXT4_MAGIC: u16 = 0xEF53;
/// Most block groups accepted (128 TiB at 4 KiB blocks; 32 MiB of descriptors in memory).
const MAX_GROUPS: u64 = 1 << 20;
const EXTENT_MAGIC: u16 = 0xF30A;
const JBD2_MAGIC: u32 = 0xC03B_3998;

const COMPAT_HAS_JOURNAL: u32 = 0x4;
const COMPAT_SPARSE_SUPER2: u32 = 0x200;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_64BIT: u32 = 0x80;
const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
const RO_COMPAT_GDT_CSUM: u32 = 0x10;
const RO_COMPAT_BIGALLOC: u32 = 0x200;
const RO_COMPAT_METADATA_CSUM: u32 = 0x400;

const BG_INODE_UNINIT: u16 = 0x1;

const INODE_FLAG_EXTENTS: u32 = 0x8_0000;
const INODE_FLAG_INLINE_DATA: u32 = 0x1000_0000;

/// Deepest extent tree ext4 builds is 5 levels; anything deeper is corrupt.
const MAX_EXTENT_DEPTH: u16 = 5;

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The superblock fields the classifier needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Geometry {
    block_size: u64,
    first_data_block: u64,
    blocks_count: u64,
    blocks_per_group: u64,
    inodes_per_group: u32,
    inode_size: u32,
    desc_size: u32,
    group_count: u32,
    compat: u32,
    incompat: u32,
    ro_compat: u32,
    reserved_gdt_blocks: u32,
    first_meta_bg: u32,
    journal_inum: u32,
    backup_bgs: [u32; 2],
}

impl Geometry {
    /// Parses the 1024-byte superblock; `None` when it is not a usable ext4 superblock.
    fn parse(sb: &[u8]) -> Option<Geometry> {
        if sb.len() < 1024 || le16(sb, 0x38) != EXT4_MAGIC {
            return None;
        }
        let log = le32(sb, 0x18);
        if log > 6 {
            return None;
        }
        let block_size = 1024u64 << log;
        let incompat = le32(sb, 0x60);
        let ro_compat = le32(sb, 0x64);
        let blocks_lo = le32(sb, 0x04) as u64;
        let blocks_hi = if incompat & INCOMPAT_64BIT != 0 {
            le32(sb, 0x150) as u64
        } else {
            0
        };
        let blocks_count = blocks_lo | (blocks_hi << 32);
        let blocks_per_group = le32(sb, 0x20) as u64;
        let inodes_per_group = le32(sb, 0x28);
        let rev = le32(sb, 0x4C);
        let inode_size = if rev == 0 { 128 } else { le16(sb, 0x58) as u32 };
        let desc_size = if incompat & INCOMPAT_64BIT != 0 {
            le16(sb, 0xFE) as u32
        } else {
            32
        };
        let first_data_block = le32(sb, 0x14) as u64;
        if blocks_per_group == 0
            || inodes_per_group == 0
            || !(128..=block_size as u32).contains(&inode_size)
            || !inode_size.is_power_of_two()
            || !(32..=1024).contains(&desc_size)
            || !desc_size.is_power_of_two()
            || blocks_count <= first_data_block
            || ro_compat & RO_COMPAT_BIGALLOC != 0
        {
            return None;
        }
        // Bounds ext4 itself keeps (a group's bitmap is one block); they also bound the memory a
        // corrupt or hostile superblock could make the classifier allocate.
        if blocks_per_group > 8 * block_size
            || blocks_per_group < 8
            || inodes_per_group as u64 > 8 * block_size
        {
            return None;
        }
        let group_count = (blocks_count - first_data_block).div_ceil(blocks_per_group);
        if group_count > MAX_GROUPS {
            return None;
        }
        Some(Geometry {
            block_size,
            first_data_block,
            blocks_count,
            blocks_per_group,
            inodes_per_group,
            inode_size,
            desc_size,
            group_count: group_count as u32,
            compat: le32(sb, 0x5C),
            incompat,
            ro_compat,
            reserved_gdt_blocks: le16(sb, 0xCE) as u32,
            first_meta_bg: le32(sb, 0x104),
            journal_inum: if le32(sb, 0x5C) & COMPAT_HAS_JOURNAL != 0 {
                le32(sb, 0xE0)
            } else {
                0
            },
            backup_bgs: [le32(sb, 0x24C), le32(sb, 0x250)],
        })
    }

    fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + g as u64 * self.blocks_per_group
    }

    fn has_super(&self, g: u32) -> bool {
        if g == 0 {
            return true;
        }
        if self.compat & COMPAT_SPARSE_SUPER2 != 0 {
            return g == self.backup_bgs[0] || g == self.backup_bgs[1];
        }
        if g == 1 || self.ro_compat & RO_COMPAT_SPARSE_SUPER == 0 {
            return true;
        }
        if g & 1 == 0 {
            return false;
        }
        [3u32, 5, 7].iter().any(|&base| {
            let mut p = base;
            while p < g {
                p = match p.checked_mul(base) {
                    Some(v) => v,
                    None => return false,
                };
            }
            p == g
        })
    }

    fn descs_per_block(&self) -> u32 {
        (self.block_size / self.desc_size as u64) as u32
    }

    /// Number of GDT blocks in a classic (non meta_bg) layout.
    fn gdt_blocks(&self) -> u64 {
        let total = self.group_count as u64;
        let classic = if self.incompat & INCOMPAT_META_BG != 0 {
            self.first_meta_bg as u64 * self.descs_per_block() as u64
        } else {
            total
        };
        classic.min(total).div_ceil(self.descs_per_block() as u64)
    }

    fn uses_gdt_csum(&self) -> bool {
        self.ro_compat & (RO_COMPAT_GDT_CSUM | RO_COMPAT_METADATA_CSUM) != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Group {
    block_bitmap: u64,
    inode_bitmap: u64,
    inode_table: u64,
    flags: u16,
    itable_unused: u32,
}

/// Fixed-position metadata found from the superblock and the group descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Static {
    Superblock,
    /// Primary descriptor block holding descriptors from `first_group` on.
    GdtPrimary {
        first_group: u32,
    },
    GdtOther,
    Bitmap,
    InodeTable {
        group: u32,
    },
}

/// What an owner does with the blocks of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Data,
    /// Extent tree node.
    Tree,
    /// Indirect block of a block-mapped (ext2/3 style) file; 1 = holds data block pointers,
    /// 2 = double indirect, 3 = triple indirect.
    Indirect(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seg {
    end: u64,
    ino: u32,
    role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InodeKind {
    File,
    Directory,
    Journal,
}

/// An extent tree node: leaf extents `(logical block, physical start, length)` or index
/// children.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Leaf(Vec<(u64, u64, u64)>),
    Index(Vec<u64>),
    /// Block map (inode root or indirect block): data runs `(start, len)` and indirect
    /// children `(block, level)`.
    Map {
        data: Vec<(u64, u64)>,
        children: Vec<(u64, u8)>,
    },
}

/// Coalesces block pointers into runs; zero pointers are holes.
fn runs(ptrs: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in ptrs.filter(|p| *p != 0) {
        match out.last_mut() {
            Some((s, l)) if *s + *l == p => *l += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

/// Parses an indirect block at `level` (1 = data pointers).
fn parse_indirect(b: &[u8], level: u8) -> Node {
    let ptrs = b.chunks_exact(4).map(|c| le32(c, 0) as u64);
    if level <= 1 {
        Node::Map {
            data: runs(ptrs),
            children: Vec::new(),
        }
    } else {
        Node::Map {
            data: Vec::new(),
            children: ptrs.filter(|p| *p != 0).map(|p| (p, level - 1)).collect(),
        }
    }
}

#[derive(Debug, Clone)]
struct InodeRec {
    kind: InodeKind,
    size: u64,
    /// Hash of the inode fields that matter, to skip rebuilding unchanged inodes.
    fingerprint: u64,
    root: Node,
    /// Extents this inode currently owns in the interval map.
    owned: Vec<(u64, u64, Role)>,
    /// Extent tree blocks whose content is cached in `nodes`.
    cached_nodes: Vec<u64>,
}

/// Parses an extent node (header + entries) in `b`; `None` when the magic or counts are wrong.
fn parse_extent_node(b: &[u8]) -> Option<(u16, Node)> {
    if b.len() < 12 || le16(b, 0) != EXTENT_MAGIC {
        return None;
    }
    let entries = le16(b, 2) as usize;
    let depth = le16(b, 6);
    if depth > MAX_EXTENT_DEPTH || 12 + entries * 12 > b.len() {
        return None;
    }
    let mut leaves = Vec::new();
    let mut children = Vec::new();
    for i in 0..entries {
        let e = &b[12 + i * 12..24 + i * 12];
        if depth == 0 {
            let raw_len = le16(e, 4) as u64;
            let len = if raw_len > 32768 {
                raw_len - 32768
            } else {
                raw_len
            };
            let start = ((le16(e, 6) as u64) << 32) | le32(e, 8) as u64;
            if len > 0 {
                leaves.push((le32(e, 0) as u64, start, len));
            }
        } else {
            let leaf = ((le16(e, 8) as u64) << 32) | le32(e, 4) as u64;
            children.push(leaf);
        }
    }
    Some(if depth == 0 {
        (depth, Node::Leaf(leaves))
    } else {
        (depth, Node::Index(children))
    })
}

fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Bytes of classifier memory per learned file extent: one interval-map entry (first block,
/// end, owner inode, role; with B-tree overhead) plus the owner's copy used to withdraw it.
pub const BYTES_PER_EXTENT: usize = (8 + 16) * 3 / 2 + 24;

/// Counters of what the classifier learned, for logs and the CLI.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ext4Stats {
    /// Live inodes that own blocks (files, directories, journal).
    pub inodes: usize,
    /// Segments in the interval map (data extents plus extent tree blocks).
    pub extents: usize,
    /// Cached extent tree nodes.
    pub tree_nodes: usize,
    /// Block groups.
    pub groups: usize,
}

/// Learns an ext4 layout from the blocks passing through a block device and classifies blocks.
#[derive(Debug, Default, Clone)]
pub struct Ext4Classifier {
    geo: Option<Geometry>,
    groups: Vec<Group>,
    /// Fixed metadata: first block -> (end block exclusive, kind).
    statics: BTreeMap<u64, (u64, Static)>,
    /// Blocks owned by inodes: first block -> segment.
    map: BTreeMap<u64, Seg>,
    inodes: HashMap<u32, InodeRec>,
    /// Cached extent tree nodes below inodes: block -> (owner inode, node).
    nodes: HashMap<u64, (u32, Node)>,
    /// Extent nodes seen before the index block pointing at them (a mount reads leaves that
    /// sit below their index block in block order); adopted when an owner shows up. Bounded.
    orphans: HashMap<u64, Node>,
    /// Journal layout: (logical block, physical block, length) sorted by logical block.
    journal_map: Vec<(u64, u64, u64)>,
    /// jbd2 superblock fields needed to read descriptor tags.
    jsb: Option<JournalSb>,
    /// Journal logical block -> (home block it will be checkpointed to, escaped).
    jpending: HashMap<u64, (u64, bool)>,
    /// Change log for [`Ext4Classifier::take_changes`] (only kept once tracking is on).
    track: bool,
    changes: Vec<(u64, u64)>,
}

/// Most block ranges kept in the change log between two [`Ext4Classifier::take_changes`].
pub const MAX_CHANGES: usize = 1 << 16;

/// Most journal blocks remembered between a descriptor block and its logged copies.
const MAX_JPENDING: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct JournalSb {
    first: u64,
    maxlen: u64,
    incompat: u32,
}

const JBD2_FEATURE_64BIT: u32 = 0x2;
const JBD2_FEATURE_CSUM_V2: u32 = 0x8;
const JBD2_FEATURE_CSUM_V3: u32 = 0x10;
const JBD2_FLAG_ESCAPE: u32 = 0x1;
const JBD2_FLAG_SAME_UUID: u32 = 0x2;
const JBD2_FLAG_LAST_TAG: u32 = 0x8;

impl JournalSb {
    fn parse(b: &[u8]) -> Option<JournalSb> {
        if b.len() < 0x2C || be32(b, 0) != JBD2_MAGIC || !matches!(be32(b, 4), 3 | 4) {
            return None;
        }
        let incompat = if be32(b, 4) == 4 { be32(b, 0x28) } else { 0 };
        let first = be32(b, 0x14) as u64;
        let maxlen = be32(b, 0x10) as u64;
        (first > 0 && first < maxlen).then_some(JournalSb {
            first,
            maxlen,
            incompat,
        })
    }

    fn tag_bytes(&self) -> usize {
        if self.incompat & JBD2_FEATURE_CSUM_V3 != 0 {
            return 16;
        }
        let sz = 12
            + if self.incompat & JBD2_FEATURE_CSUM_V2 != 0 {
                2
            } else {
                0
            };
        if self.incompat & JBD2_FEATURE_64BIT != 0 {
            sz
        } else {
            sz - 4
        }
    }

    /// Home blocks logged after a descriptor block: (block, escaped) per tag.
    fn descriptor_tags(&self, b: &[u8]) -> Vec<(u64, bool)> {
        let tb = self.tag_bytes();
        let csum = self.incompat & (JBD2_FEATURE_CSUM_V2 | JBD2_FEATURE_CSUM_V3) != 0;
        let limit = b.len() - if csum { 4 } else { 0 };
        let v3 = self.incompat & JBD2_FEATURE_CSUM_V3 != 0;
        let wide = self.incompat & JBD2_FEATURE_64BIT != 0;
        let mut out = Vec::new();
        let mut off = 12;
        while off + tb <= limit {
            let t = &b[off..off + tb];
            let lo = be32(t, 0) as u64;
            let (flags, hi) = if v3 {
                (be32(t, 4), be32(t, 8) as u64)
            } else {
                let f = u16::from_be_bytes([t[6], t[7]]) as u32;
                (f, if wide { be32(t, 8) as u64 } else { 0 })
            };
            let hi = if wide { hi } else { 0 };
            out.push((lo | (hi << 32), flags & JBD2_FLAG_ESCAPE != 0));
            off += tb;
            if flags & JBD2_FLAG_SAME_UUID == 0 {
                off += 16;
            }
            if flags & JBD2_FLAG_LAST_TAG != 0 {
                break;
            }
        }
        out
    }
}

/// Most extent nodes kept while waiting for their owner (each at most one block's worth).
const MAX_ORPHANS: usize = 4096;

impl Ext4Classifier {
    /// A classifier that knows nothing yet (everything is `Unknown` until a superblock is seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts (or stops) recording block ranges whose class may have changed: blocks newly
    /// owned by an inode, and all data blocks of an inode whose kind or size class changed.
    /// A cache uses it to relabel lines it cached before their owner was known (ordered-mode
    /// data is written before the metadata naming it). Bounded by [`MAX_CHANGES`] ranges
    /// between two [`Ext4Classifier::take_changes`]; ranges past that are dropped.
    pub fn track_changes(&mut self, on: bool) {
        self.track = on;
        self.changes.clear();
    }

    /// The block ranges `[first, end)` recorded since the last call (see `track_changes`).
    pub fn take_changes(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.changes)
    }

    /// Forgets the learned layout (a new file system), keeping the caller's settings: change
    /// tracking stays on, so that blocks of the new file system are reported as they become
    /// owned (a reset to `new()` here once turned tracking off for good at the first
    /// superblock, and no cached line of a kernel-written file was ever relabelled).
    fn forget(&mut self) {
        let track = self.track;
        *self = Self::new();
        self.track = track;
    }

    fn note_change(&mut self, start: u64, end: u64) {
        if self.track && self.changes.len() < MAX_CHANGES {
            self.changes.push((start, end));
        }
    }

    /// Block ranges `[first, end)` of the fixed metadata known from the superblock and the
    /// group descriptors (superblocks, descriptors, bitmaps, inode tables).
    pub fn fixed_metadata(&self) -> Vec<(u64, u64)> {
        self.statics.iter().map(|(s, (e, _))| (*s, *e)).collect()
    }

    /// True once a valid ext4 superblock was seen.
    pub fn is_ext4(&self) -> bool {
        self.geo.is_some()
    }

    /// File-system block size, once known.
    pub fn block_size(&self) -> Option<u64> {
        self.geo.as_ref().map(|g| g.block_size)
    }

    /// Number of file-system blocks, once known.
    pub fn blocks_count(&self) -> Option<u64> {
        self.geo.as_ref().map(|g| g.blocks_count)
    }

    /// What has been learned so far.
    pub fn stats(&self) -> Ext4Stats {
        Ext4Stats {
            inodes: self.inodes.len(),
            extents: self.map.len(),
            tree_nodes: self.nodes.len(),
            groups: self.groups.len(),
        }
    }

    /// Approximate heap bytes held by the learned layout (interval maps, inode records, cached
    /// tree nodes). Per file extent this is about [`BYTES_PER_EXTENT`].
    pub fn approx_memory_bytes(&self) -> usize {
        use std::mem::size_of;
        // BTreeMap nodes hold up to 11 entries plus edges; count ~1.5x the payload.
        let map = self.map.len() * (size_of::<u64>() + size_of::<Seg>()) * 3 / 2;
        let statics = self.statics.len() * (size_of::<u64>() + size_of::<(u64, Static)>()) * 3 / 2;
        // hashbrown: one control byte per bucket, buckets ~8/7 of the entries.
        let node_bytes = |n: &Node| match n {
            Node::Leaf(v) => v.capacity() * size_of::<(u64, u64, u64)>(),
            Node::Index(v) => v.capacity() * size_of::<u64>(),
            Node::Map { data, children } => {
                data.capacity() * size_of::<(u64, u64)>()
                    + children.capacity() * size_of::<(u64, u8)>()
            }
        };
        let inodes: usize = self
            .inodes
            .values()
            .map(|r| {
                size_of::<u32>()
                    + size_of::<InodeRec>()
                    + 1
                    + node_bytes(&r.root)
                    + r.owned.capacity() * size_of::<(u64, u64, Role)>()
                    + r.cached_nodes.capacity() * size_of::<u64>()
            })
            .sum::<usize>()
            * 8
            / 7;
        let nodes: usize = self
            .nodes
            .values()
            .map(|(_, n)| n)
            .chain(self.orphans.values())
            .map(|n| size_of::<u64>() + size_of::<(u32, Node)>() + 1 + node_bytes(n))
            .sum::<usize>()
            * 8
            / 7;
        map + statics + inodes + nodes + self.groups.capacity() * size_of::<Group>()
    }

    /// Feeds one read or write of `data` at byte `offset` of the device.
    pub fn observe(&mut self, offset: u64, data: &[u8]) {
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return;
        };
        // The superblock lives at byte 1024 whatever the block size.
        if offset <= 1024 && end >= 2048 {
            let sb = &data[(1024 - offset) as usize..(2048 - offset) as usize];
            self.observe_superblock(sb);
        }
        let Some(bs) = self.block_size() else {
            return;
        };
        // Inode tables are parsed per inode, so partial blocks still teach something.
        let first = offset / bs;
        let last = end.div_ceil(bs);
        let mut blk = first;
        while blk < last {
            let blk_off = blk * bs;
            let lo = blk_off.max(offset);
            let hi = (blk_off + bs).min(end);
            let slice = &data[(lo - offset) as usize..(hi - offset) as usize];
            if lo == blk_off && hi == blk_off + bs {
                self.observe_block(blk, slice);
            } else if let Some((_, Static::InodeTable { group })) = self.static_at(blk) {
                self.observe_inodes(group, lo, slice);
            }
            blk += 1;
        }
    }

    fn observe_superblock(&mut self, sb: &[u8]) {
        match Geometry::parse(sb) {
            None => {
                if self.geo.is_some() {
                    // The file system was overwritten (mkfs of something else): forget it.
                    self.forget();
                }
            }
            Some(g) => {
                if self.geo.as_ref() == Some(&g) {
                    return;
                }
                let same_fs = self.geo.as_ref().is_some_and(|old| {
                    old.block_size == g.block_size
                        && old.inodes_per_group == g.inodes_per_group
                        && old.blocks_per_group == g.blocks_per_group
                        && old.first_data_block == g.first_data_block
                });
                if !same_fs {
                    self.forget();
                }
                let journal = g.journal_inum;
                self.groups.resize(g.group_count as usize, Group::default());
                self.geo = Some(g);
                self.rebuild_statics();
                if journal == 0 {
                    // The journal was removed (tune2fs -O ^has_journal): its blocks are free.
                    let js: Vec<u32> = self
                        .inodes
                        .iter()
                        .filter(|(_, r)| r.kind == InodeKind::Journal)
                        .map(|(i, _)| *i)
                        .collect();
                    for ino in js {
                        self.drop_inode(ino);
                    }
                }
            }
        }
    }

    fn observe_block(&mut self, blk: u64, data: &[u8]) {
        if let Some((_, st)) = self.static_at(blk) {
            match st {
                Static::GdtPrimary { first_group } => {
                    self.observe_gdt(first_group, data);
                }
                Static::InodeTable { group } => {
                    self.observe_inodes(group, blk * data.len() as u64, data);
                }
                _ => {}
            }
            return;
        }
        if let Some((_, seg)) = self.seg_at(blk) {
            match seg.role {
                Role::Tree => {
                    if let Some((_, node)) = parse_extent_node(data) {
                        self.observe_tree_node(blk, seg.ino, node);
                    }
                }
                Role::Indirect(level) => {
                    self.observe_tree_node(blk, seg.ino, parse_indirect(data, level));
                }
                Role::Data => {
                    if !self.orphans.is_empty() {
                        self.orphans.remove(&blk);
                    }
                    if self.inodes.get(&seg.ino).map(|r| r.kind) == Some(InodeKind::Journal) {
                        self.observe_journal_block(blk, data);
                    }
                }
            }
            return;
        }
        match parse_extent_node(data) {
            Some((_, node)) => {
                if self.orphans.len() < MAX_ORPHANS || self.orphans.contains_key(&blk) {
                    self.orphans.insert(blk, node);
                }
            }
            None => {
                if !self.orphans.is_empty() {
                    self.orphans.remove(&blk);
                }
                self.observe_journal_superblock(blk, data);
            }
        }
    }

    /// A block written to the journal: the jbd2 superblock, a descriptor block announcing which
    /// home blocks the next journal blocks are copies of, or such a copy. Copies of inode table,
    /// descriptor and extent tree blocks are learned as if written at home, so new files are
    /// known at commit time, long before the checkpoint writes the home locations.
    fn observe_journal_block(&mut self, blk: u64, data: &[u8]) {
        let Some(lblk) = self.journal_logical(blk) else {
            return;
        };
        if be32(data, 0) == JBD2_MAGIC {
            match be32(data, 4) {
                1 => {
                    let Some(jsb) = self.jsb else {
                        return;
                    };
                    let mut next = lblk;
                    for (home, escaped) in jsb.descriptor_tags(data) {
                        next += 1;
                        if next >= jsb.maxlen {
                            next = jsb.first;
                        }
                        if self.jpending.len() < MAX_JPENDING {
                            self.jpending.insert(next, (home, escaped));
                        }
                    }
                }
                3 | 4 if lblk == 0 => self.jsb = JournalSb::parse(data),
                _ => {}
            }
            return;
        }
        let Some((home, escaped)) = self.jpending.remove(&lblk) else {
            return;
        };
        let target_is_journal = self.seg_at(home).is_some_and(|(_, s)| {
            self.inodes.get(&s.ino).map(|r| r.kind) == Some(InodeKind::Journal)
        });
        if target_is_journal || home == blk {
            return;
        }
        if escaped {
            let mut copy = data.to_vec();
            copy[0..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
            self.observe_block(home, &copy);
        } else {
            self.observe_block(home, data);
        }
    }

    fn journal_logical(&self, blk: u64) -> Option<u64> {
        self.journal_map
            .iter()
            .find(|(_, p, l)| blk >= *p && blk < p + l)
            .map(|(lb, p, _)| lb + (blk - p))
    }

    /// A jbd2 superblock seen before the journal inode: map the (usually contiguous) journal.
    fn observe_journal_superblock(&mut self, blk: u64, data: &[u8]) {
        let Some(geo) = self.geo.as_ref() else {
            return;
        };
        let ino = geo.journal_inum;
        if ino == 0 || self.inodes.contains_key(&ino) || data.len() < 0x2C {
            return;
        }
        let blocktype = be32(data, 4);
        if be32(data, 0) != JBD2_MAGIC || !(blocktype == 3 || blocktype == 4) {
            return;
        }
        let maxlen = be32(data, 16) as u64;
        if maxlen == 0 || blk + maxlen > geo.blocks_count {
            return;
        }
        self.jsb = JournalSb::parse(data);
        let rec = InodeRec {
            kind: InodeKind::Journal,
            size: maxlen * geo.block_size,
            fingerprint: 0,
            root: Node::Leaf(vec![(0, blk, maxlen)]),
            owned: Vec::new(),
            cached_nodes: Vec::new(),
        };
        self.inodes.insert(ino, rec);
        self.rebuild_inode(ino);
    }

    fn observe_gdt(&mut self, first_group: u32, data: &[u8]) {
        let Some(geo) = self.geo.clone() else {
            return;
        };
        let ds = geo.desc_size as usize;
        for (i, d) in data.chunks_exact(ds).enumerate() {
            let g = first_group as usize + i;
            if g >= self.groups.len() {
                break;
            }
            let wide = ds >= 64;
            let hi = |off: usize| if wide { le32(d, off) as u64 } else { 0 };
            let new = Group {
                block_bitmap: le32(d, 0) as u64 | (hi(0x20) << 32),
                inode_bitmap: le32(d, 4) as u64 | (hi(0x24) << 32),
                inode_table: le32(d, 8) as u64 | (hi(0x28) << 32),
                flags: le16(d, 0x12),
                itable_unused: le16(d, 0x1C) as u32
                    | if wide {
                        (le16(d, 0x32) as u32) << 16
                    } else {
                        0
                    },
            };
            let old = self.groups[g];
            if (old.block_bitmap, old.inode_bitmap, old.inode_table)
                != (new.block_bitmap, new.inode_bitmap, new.inode_table)
            {
                self.move_group_statics(g as u32, old, new, &geo);
            }
            self.groups[g] = new;
        }
    }

    /// A group's bitmaps or inode table moved (or became known): updates only its entries,
    /// so descriptor writes cost O(log n), not O(groups).
    fn move_group_statics(&mut self, g: u32, old: Group, new: Group, geo: &Geometry) {
        let itb = (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size);
        if old.inode_table != 0 {
            for b in [old.block_bitmap, old.inode_bitmap] {
                if matches!(self.statics.get(&b), Some((_, Static::Bitmap))) {
                    self.statics.remove(&b);
                }
            }
            if self.statics.get(&old.inode_table).map(|e| e.1)
                == Some(Static::InodeTable { group: g })
            {
                self.statics.remove(&old.inode_table);
            }
        }
        if new.inode_table != 0 {
            let n = geo.blocks_count;
            for (start, len, k) in [
                (new.block_bitmap, 1, Static::Bitmap),
                (new.inode_bitmap, 1, Static::Bitmap),
                (new.inode_table, itb, Static::InodeTable { group: g }),
            ] {
                if start < n {
                    self.statics.insert(start, ((start + len).min(n), k));
                }
            }
        }
    }

    /// Recomputes the fixed metadata regions from the geometry and the known descriptors.
    fn rebuild_statics(&mut self) {
        let Some(geo) = self.geo.clone() else {
            return;
        };
        let mut st = BTreeMap::new();
        let put = |st: &mut BTreeMap<u64, (u64, Static)>, start: u64, len: u64, k: Static| {
            if len > 0 && start < geo.blocks_count {
                st.insert(start, ((start + len).min(geo.blocks_count), k));
            }
        };
        let classic = geo.gdt_blocks();
        let dpb = geo.descs_per_block();
        for g in 0..geo.group_count {
            let first = geo.group_first_block(g);
            if geo.has_super(g) {
                // Block 0 of a 4 KiB file system holds the boot sector and the superblock.
                let sb_block = if g == 0 { 1024 / geo.block_size } else { first };
                put(&mut st, sb_block, 1, Static::Superblock);
                if g == 0 && sb_block > 0 {
                    put(&mut st, 0, 1, Static::Superblock);
                }
                if classic > 0 {
                    for i in 0..classic {
                        let k = if g == 0 {
                            Static::GdtPrimary {
                                first_group: (i as u32) * dpb,
                            }
                        } else {
                            Static::GdtOther
                        };
                        put(&mut st, first + 1 + i, 1, k);
                    }
                }
                put(
                    &mut st,
                    first + 1 + classic,
                    geo.reserved_gdt_blocks as u64,
                    Static::GdtOther,
                );
            }
            if geo.incompat & INCOMPAT_META_BG != 0 && g / dpb >= geo.first_meta_bg {
                let pos = g % dpb;
                if pos == 0 || pos == 1 || pos == dpb - 1 {
                    let blk = first + u64::from(geo.has_super(g));
                    let k = if pos == 0 {
                        Static::GdtPrimary { first_group: g }
                    } else {
                        Static::GdtOther
                    };
                    put(&mut st, blk, 1, k);
                }
            }
            let grp = self.groups[g as usize];
            if grp.inode_table != 0 {
                put(&mut st, grp.block_bitmap, 1, Static::Bitmap);
                put(&mut st, grp.inode_bitmap, 1, Static::Bitmap);
                let itb =
                    (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size);
                put(
                    &mut st,
                    grp.inode_table,
                    itb,
                    Static::InodeTable { group: g },
                );
            }
        }
        self.statics = st;
    }

    fn static_at(&self, blk: u64) -> Option<(u64, Static)> {
        self.statics
            .range(..=blk)
            .next_back()
            .filter(|(_, (end, _))| blk < *end)
            .map(|(s, (_, k))| (*s, *k))
    }

    fn seg_at(&self, blk: u64) -> Option<(u64, Seg)> {
        self.map
            .range(..=blk)
            .next_back()
            .filter(|(_, s)| blk < s.end)
            .map(|(s, seg)| (*s, *seg))
    }

    /// Parses every whole inode in `data` (bytes at device offset `offset`) of group `group`.
    fn observe_inodes(&mut self, group: u32, offset: u64, data: &[u8]) {
        let Some(geo) = self.geo.clone() else {
            return;
        };
        let grp = self.groups[group as usize];
        let table = grp.inode_table * geo.block_size;
        let isz = geo.inode_size as u64;
        let first_idx = (offset - table).div_ceil(isz);
        let mut idx = first_idx;
        loop {
            let at = table + idx * isz;
            if at + isz > offset + data.len() as u64 || idx >= geo.inodes_per_group as u64 {
                break;
            }
            let raw = &data[(at - offset) as usize..(at - offset + isz) as usize];
            let ino = group * geo.inodes_per_group + idx as u32 + 1;
            let unused = (grp.flags & BG_INODE_UNINIT != 0 && geo.uses_gdt_csum())
                || (geo.uses_gdt_csum()
                    && idx
                        >= (geo.inodes_per_group as u64).saturating_sub(grp.itable_unused as u64));
            if unused {
                self.drop_inode(ino);
            } else {
                self.observe_inode(ino, raw, &geo);
            }
            idx += 1;
        }
    }

    fn observe_inode(&mut self, ino: u32, raw: &[u8], geo: &Geometry) {
        let mode = le16(raw, 0);
        let links = le16(raw, 0x1A);
        let dtime = le32(raw, 0x14);
        let flags = le32(raw, 0x20);
        let size = le32(raw, 4) as u64 | ((le32(raw, 0x6C) as u64) << 32);
        let iblock = &raw[0x28..0x28 + 60];
        let is_journal = ino == geo.journal_inum && ino != 0;
        let kind = match mode & 0xF000 {
            _ if is_journal => Some(InodeKind::Journal),
            0x8000 | 0xA000 => Some(InodeKind::File),
            0x4000 => Some(InodeKind::Directory),
            _ => None,
        };
        let live = (links > 0 && dtime == 0) || is_journal;
        let i_blocks = le32(raw, 0x1C);
        let parsed = if flags & INODE_FLAG_INLINE_DATA != 0 {
            None
        } else if flags & INODE_FLAG_EXTENTS != 0 {
            parse_extent_node(iblock)
        } else if i_blocks == 0 {
            // Fast symlink (target text in i_block) or empty block-mapped file.
            None
        } else {
            // Block map: 12 direct pointers, then single, double and triple indirect.
            let p = |i: usize| le32(iblock, i * 4) as u64;
            let children = (12..15)
                .filter(|&i| p(i) != 0)
                .map(|i| (p(i), (i - 11) as u8))
                .collect();
            Some((
                0,
                Node::Map {
                    data: runs((0..12).map(p)),
                    children,
                },
            ))
        };
        let (Some(kind), true, Some((_, root))) = (kind, live, parsed) else {
            self.drop_inode(ino);
            return;
        };
        let fingerprint = fnv(&[&mode.to_le_bytes(), &size.to_le_bytes(), iblock]);
        let mut relabel_all = false;
        if let Some(rec) = self.inodes.get_mut(&ino) {
            if rec.fingerprint == fingerprint && rec.kind == kind {
                return;
            }
            relabel_all = rec.kind != kind
                || (kind == InodeKind::File && file_class(rec.size) != file_class(size));
            rec.fingerprint = fingerprint;
            rec.kind = kind;
            rec.size = size;
            rec.root = root;
        } else {
            self.inodes.insert(
                ino,
                InodeRec {
                    kind,
                    size,
                    fingerprint,
                    root,
                    owned: Vec::new(),
                    cached_nodes: Vec::new(),
                },
            );
        }
        self.rebuild_inode(ino);
        if relabel_all && self.track {
            let data: Vec<(u64, u64)> = self.inodes[&ino]
                .owned
                .iter()
                .filter(|(_, _, r)| *r == Role::Data)
                .map(|&(s, l, _)| (s, s + l))
                .collect();
            for (a, b) in data {
                self.note_change(a, b);
            }
        }
    }

    fn observe_tree_node(&mut self, blk: u64, ino: u32, node: Node) {
        if self
            .nodes
            .get(&blk)
            .is_some_and(|(o, n)| *o == ino && *n == node)
        {
            return;
        }
        self.nodes.insert(blk, (ino, node));
        if let Some(rec) = self.inodes.get_mut(&ino) {
            if !rec.cached_nodes.contains(&blk) {
                rec.cached_nodes.push(blk);
            }
        }
        self.rebuild_inode(ino);
    }

    /// Forgets an inode: withdraws its extents and cached tree nodes.
    fn drop_inode(&mut self, ino: u32) {
        if let Some(rec) = self.inodes.remove(&ino) {
            if rec.kind == InodeKind::Journal {
                self.journal_map.clear();
                self.jpending.clear();
                self.jsb = None;
            }
            for (s, l, role) in rec.owned {
                self.unassign(s, l, ino, role);
            }
            for b in rec.cached_nodes {
                if self.nodes.get(&b).is_some_and(|(o, _)| *o == ino) {
                    self.nodes.remove(&b);
                }
            }
        }
    }

    /// Recomputes the blocks an inode owns from its root and cached tree nodes.
    fn rebuild_inode(&mut self, ino: u32) {
        let Some(rec) = self.inodes.get(&ino) else {
            return;
        };
        let blocks = self.geo.as_ref().map_or(0, |g| g.blocks_count);
        let mut want: Vec<(u64, u64, Role)> = Vec::new();
        let mut reach: Vec<u64> = Vec::new();
        let mut stack: Vec<(Node, u32)> = vec![(rec.root.clone(), 0)];
        let is_journal = rec.kind == InodeKind::Journal;
        let mut jmap: Vec<(u64, u64, u64)> = Vec::new();
        // `reach` is small (tree nodes of one inode); a HashSet would only pay off for
        // files with thousands of leaf blocks.
        while let Some((node, level)) = stack.pop() {
            match node {
                Node::Leaf(ext) => {
                    for (lb, s, l) in ext {
                        if s < blocks && l <= blocks - s {
                            want.push((s, l, Role::Data));
                            if is_journal {
                                jmap.push((lb, s, l));
                            }
                        }
                    }
                }
                Node::Map { data, children } => {
                    for (s, l) in data {
                        if s < blocks && l <= blocks - s {
                            want.push((s, l, Role::Data));
                        }
                    }
                    for (c, lvl) in children {
                        if c >= blocks || !(1..=3).contains(&lvl) {
                            continue;
                        }
                        want.push((c, 1, Role::Indirect(lvl)));
                        if let Some((owner, n)) = self.nodes.get(&c) {
                            if *owner == ino && !reach.contains(&c) {
                                reach.push(c);
                                stack.push((n.clone(), level + 1));
                            }
                        }
                    }
                }
                Node::Index(children) => {
                    for c in children {
                        if c >= blocks || level >= MAX_EXTENT_DEPTH as u32 {
                            continue;
                        }
                        want.push((c, 1, Role::Tree));
                        if !self.nodes.contains_key(&c) {
                            if let Some(n) = self.orphans.remove(&c) {
                                self.nodes.insert(c, (ino, n));
                            }
                        }
                        if let Some((owner, n)) = self.nodes.get(&c) {
                            if *owner == ino && !reach.contains(&c) {
                                reach.push(c);
                                stack.push((n.clone(), level + 1));
                            }
                        }
                    }
                }
            }
        }
        if is_journal {
            jmap.sort_unstable();
            self.journal_map = jmap;
        }
        let rec = self.inodes.get_mut(&ino).expect("checked above");
        let old_owned = std::mem::take(&mut rec.owned);
        let stale: Vec<u64> = rec
            .cached_nodes
            .iter()
            .copied()
            .filter(|b| !reach.contains(b))
            .collect();
        rec.cached_nodes = reach;
        rec.owned = want.clone();
        for b in stale {
            if self.nodes.get(&b).is_some_and(|(o, _)| *o == ino) {
                self.nodes.remove(&b);
            }
        }
        if self.track {
            let old: std::collections::HashSet<(u64, u64, Role)> =
                old_owned.iter().copied().collect();
            for &(s, l, role) in &want {
                if !old.contains(&(s, l, role)) {
                    self.note_change(s, s + l);
                }
            }
        }
        for (s, l, role) in old_owned {
            self.unassign(s, l, ino, role);
        }
        for (s, l, role) in want {
            self.assign(s, l, ino, role);
        }
    }

    /// Gives blocks `[start, start+len)` to `ino`, cutting them out of any other segment.
    fn assign(&mut self, start: u64, len: u64, ino: u32, role: Role) {
        let end = start + len;
        self.cut(start, end, |_| true);
        self.map.insert(start, Seg { end, ino, role });
    }

    /// Withdraws blocks `[start, start+len)` from `ino` where it still owns them.
    fn unassign(&mut self, start: u64, len: u64, ino: u32, role: Role) {
        self.cut(start, start + len, |s| s.ino == ino && s.role == role);
    }

    /// Removes `[start, end)` from the segments matching `pred`, splitting at the edges.
    fn cut(&mut self, start: u64, end: u64, pred: impl Fn(&Seg) -> bool) {
        let mut hits: Vec<(u64, Seg)> = Vec::new();
        if let Some((s, seg)) = self.map.range(..start).next_back() {
            if seg.end > start {
                hits.push((*s, *seg));
            }
        }
        hits.extend(self.map.range(start..end).map(|(s, seg)| (*s, *seg)));
        for (s, seg) in hits {
            if !pred(&seg) {
                continue;
            }
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, Seg { end: start, ..seg });
            }
            if seg.end > end {
                self.map.insert(end, seg);
            }
        }
    }

    /// Class of file-system block `blk`.
    pub fn classify_block(&self, blk: u64) -> BlockKind {
        let Some(geo) = self.geo.as_ref() else {
            return BlockKind::Unknown;
        };
        if blk >= geo.blocks_count {
            return BlockKind::Unallocated;
        }
        if let Some((_, st)) = self.static_at(blk) {
            return match st {
                Static::Superblock => BlockKind::Superblock,
                Static::GdtPrimary { .. } | Static::GdtOther => BlockKind::GroupDescriptors,
                Static::Bitmap => BlockKind::Bitmap,
                Static::InodeTable { .. } => BlockKind::InodeTable,
            };
        }
        let Some((_, seg)) = self.seg_at(blk) else {
            return BlockKind::Unallocated;
        };
        let Some(rec) = self.inodes.get(&seg.ino) else {
            return BlockKind::Unallocated;
        };
        match (seg.role, rec.kind) {
            (Role::Tree | Role::Indirect(_), _) => BlockKind::ExtentTree,
            (Role::Data, InodeKind::Journal) => BlockKind::Journal,
            (Role::Data, InodeKind::Directory) => BlockKind::Directory,
            (Role::Data, InodeKind::File) => BlockKind::File { size: rec.size },
        }
    }

    /// Class of the byte range `[offset, offset+len)`: when it spans several kinds, the one
    /// with the highest DSS priority (metadata, journal, directory, then the smallest file).
    pub fn classify(&self, offset: u64, len: u64) -> BlockKind {
        let Some(bs) = self.block_size() else {
            return BlockKind::Unknown;
        };
        let first = offset / bs;
        let last = offset.saturating_add(len.max(1)).div_ceil(bs);
        let mut best = self.classify_block(first);
        let mut blk = first + 1;
        // Walk segment by segment so a large request costs O(segments), not O(blocks).
        while blk < last {
            let kind = self.classify_block(blk);
            if rank(kind) < rank(best) {
                best = kind;
            }
            let next_static = self.statics.range(blk + 1..).next().map(|(s, _)| *s);
            let next_seg = self.map.range(blk + 1..).next().map(|(s, _)| *s);
            let here_end = self
                .static_at(blk)
                .map(|(s, _)| self.statics[&s].0)
                .or_else(|| self.seg_at(blk).map(|(_, seg)| seg.end))
                .unwrap_or(u64::MAX);
            let jump = [next_static, next_seg, Some(here_end)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(last);
            blk = jump.max(blk + 1);
        }
        best
    }

    /// Eagerly learns the layout of an existing file system: superblock, descriptors, the used
    /// part of every inode table and all extent tree nodes, through `read_at(offset, buf)`
    /// (which must fill `buf` from the device at byte `offset`). Returns whether ext4 was found.
    pub fn learn_from_image(&mut self, mut read_at: impl FnMut(u64, &mut [u8])) -> bool {
        let mut head = vec![0u8; 4096];
        read_at(0, &mut head);
        self.observe(0, &head);
        let Some(geo) = self.geo.clone() else {
            return false;
        };
        let bs = geo.block_size;
        let mut buf = vec![0u8; bs as usize];
        let gdts: Vec<u64> = self
            .statics
            .iter()
            .filter(|(_, (_, k))| matches!(k, Static::GdtPrimary { .. }))
            .map(|(s, _)| *s)
            .collect();
        for b in gdts {
            read_at(b * bs, &mut buf);
            self.observe(b * bs, &buf);
        }
        let chunk = 64 * bs;
        let mut big = vec![0u8; chunk as usize];
        for g in 0..geo.group_count {
            let grp = self.groups[g as usize];
            if grp.inode_table == 0 || (grp.flags & BG_INODE_UNINIT != 0 && geo.uses_gdt_csum()) {
                continue;
            }
            let used = if geo.uses_gdt_csum() {
                (geo.inodes_per_group as u64).saturating_sub(grp.itable_unused as u64)
            } else {
                geo.inodes_per_group as u64
            };
            let bytes = (used * geo.inode_size as u64).div_ceil(bs) * bs;
            let base = grp.inode_table * bs;
            let mut done = 0;
            while done < bytes {
                let n = chunk.min(bytes - done) as usize;
                read_at(base + done, &mut big[..n]);
                self.observe(base + done, &big[..n]);
                done += n as u64;
            }
        }
        // Extent tree nodes, level by level, until every reachable node is cached.
        loop {
            let pending: Vec<u64> = self
                .map
                .iter()
                .filter(|(_, s)| s.role != Role::Data)
                .flat_map(|(s, seg)| *s..seg.end)
                .filter(|b| !self.nodes.contains_key(b))
                .collect();
            let mut learned = false;
            for b in pending {
                read_at(b * bs, &mut buf);
                self.observe(b * bs, &buf);
                learned |= self.nodes.contains_key(&b);
            }
            if !learned {
                break;
            }
        }
        // The jbd2 superblock, to read descriptor blocks of later transactions.
        if let Some(&(0, p, _)) = self.journal_map.first() {
            read_at(p * bs, &mut buf);
            self.observe(p * bs, &buf);
        }
        true
    }
}

/// Priority rank of a kind for `classify` over ranges (lower wins).
fn rank(kind: BlockKind) -> u64 {
    match kind {
        BlockKind::Superblock
        | BlockKind::GroupDescriptors
        | BlockKind::Bitmap
        | BlockKind::InodeTable
        | BlockKind::ExtentTree => 0,
        BlockKind::Journal => 1,
        BlockKind::Directory => 2,
        BlockKind::File { size } => 3 + size.min(u64::MAX - 10),
        BlockKind::Unallocated | BlockKind::Unknown => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_classes_have_the_dss_boundaries() {
        assert_eq!(file_class(0), "file<4KiB");
        assert_eq!(file_class(4095), "file<4KiB");
        assert_eq!(file_class(4096), "file<16KiB");
        assert_eq!(file_class(1 << 20), "file<4MiB");
        assert_eq!(file_class((1 << 30) - 1), "file<1GiB");
        assert_eq!(file_class(1 << 30), "file>1GiB");
        for k in [
            BlockKind::Superblock,
            BlockKind::Journal,
            BlockKind::Directory,
            BlockKind::File { size: 5 << 20 },
        ] {
            assert!(FS_CLASSES.contains(&class_name(k)));
        }
    }

    /// A minimal valid 4 KiB-block superblock: 2 groups, 256-byte inodes, journal inode 8.
    fn superblock() -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        let sb = &mut b[1024..2048];
        sb[0x04..0x08].copy_from_slice(&65536u32.to_le_bytes());
        sb[0x18..0x1C].copy_from_slice(&2u32.to_le_bytes());
        sb[0x20..0x24].copy_from_slice(&32768u32.to_le_bytes());
        sb[0x28..0x2C].copy_from_slice(&8192u32.to_le_bytes());
        sb[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
        sb[0x4C..0x50].copy_from_slice(&1u32.to_le_bytes());
        sb[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        sb[0x5C..0x60].copy_from_slice(&COMPAT_HAS_JOURNAL.to_le_bytes());
        sb[0x60..0x64].copy_from_slice(&(INCOMPAT_64BIT | 0x40 | 0x200).to_le_bytes());
        sb[0x64..0x68].copy_from_slice(&(RO_COMPAT_SPARSE_SUPER | 0x400).to_le_bytes());
        sb[0xE0..0xE4].copy_from_slice(&8u32.to_le_bytes());
        sb[0xFE..0x100].copy_from_slice(&64u16.to_le_bytes());
        b
    }

    #[test]
    fn crafted_superblock_gives_the_layout() {
        let mut c = Ext4Classifier::new();
        c.observe(0, &superblock());
        assert_eq!(c.block_size(), Some(4096));
        assert_eq!(c.classify_block(0), BlockKind::Superblock);
        assert_eq!(c.classify_block(1), BlockKind::GroupDescriptors);
        assert_eq!(c.classify_block(32768), BlockKind::Superblock);
        assert_eq!(c.classify_block(32769), BlockKind::GroupDescriptors);
        assert_eq!(c.classify_block(5000), BlockKind::Unallocated);
        // A GDT pointing group 0's tables at 10, 11, 12..
        let mut gdt = vec![0u8; 4096];
        gdt[0..4].copy_from_slice(&10u32.to_le_bytes());
        gdt[4..8].copy_from_slice(&11u32.to_le_bytes());
        gdt[8..12].copy_from_slice(&12u32.to_le_bytes());
        c.observe(4096, &gdt);
        assert_eq!(c.classify_block(10), BlockKind::Bitmap);
        assert_eq!(c.classify_block(11), BlockKind::Bitmap);
        assert_eq!(c.classify_block(12), BlockKind::InodeTable);
        assert_eq!(c.classify_block(12 + 511), BlockKind::InodeTable);
        assert_eq!(c.classify_block(12 + 512), BlockKind::Unallocated);
        // Inode 12 (index 11): a 5000-byte regular file with one extent of 2 blocks at 900.
        let mut it = vec![0u8; 4096];
        let ino = &mut it[11 * 256..12 * 256];
        ino[0..2].copy_from_slice(&0x81A4u16.to_le_bytes());
        ino[4..8].copy_from_slice(&5000u32.to_le_bytes());
        ino[0x1A..0x1C].copy_from_slice(&1u16.to_le_bytes());
        ino[0x20..0x24].copy_from_slice(&INODE_FLAG_EXTENTS.to_le_bytes());
        let ib = &mut ino[0x28..0x28 + 60];
        ib[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        ib[2..4].copy_from_slice(&1u16.to_le_bytes());
        ib[4..6].copy_from_slice(&4u16.to_le_bytes());
        ib[12 + 4..12 + 6].copy_from_slice(&2u16.to_le_bytes());
        ib[12 + 8..12 + 12].copy_from_slice(&900u32.to_le_bytes());
        c.observe(12 * 4096, &it);
        assert_eq!(c.classify_block(900), BlockKind::File { size: 5000 });
        assert_eq!(class_name(c.classify(901 * 4096, 4096)), "file<16KiB");
        assert_eq!(c.classify_block(902), BlockKind::Unallocated);
        // A range spanning metadata and the file is labelled metadata.
        assert_eq!(class_name(c.classify(0, 1 << 30)), "metadata");
        // The same inode arriving as one 512-byte sector write (size grows to 70000).
        let mut fresh = Ext4Classifier::new();
        fresh.observe(0, &superblock());
        fresh.observe(4096, &gdt);
        it[11 * 256 + 4..11 * 256 + 8].copy_from_slice(&70000u32.to_le_bytes());
        fresh.observe(12 * 4096 + 11 * 256 - 256, &it[10 * 256..12 * 256]);
        assert_eq!(fresh.classify_block(900), BlockKind::File { size: 70000 });
        c.observe(12 * 4096 + 2560, &it[2560..3072]);
        assert_eq!(class_name(c.classify_block(901)), "file<256KiB");
        // The file is deleted: links 0, dtime set.
        it[11 * 256 + 0x1A] = 0;
        it[11 * 256 + 0x14] = 1;
        c.observe(12 * 4096, &it);
        assert_eq!(c.classify_block(900), BlockKind::Unallocated);
        assert_eq!(c.stats().inodes, 0);
        assert_eq!(c.stats().extents, 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Device content is untrusted: arbitrary writes anywhere, including over the
        /// superblock, descriptors and inode tables, never panic and keep answers consistent.
        #[test]
        fn arbitrary_writes_never_panic(
            writes in proptest::collection::vec(
                (0u64..80_000, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9000)),
                1..40),
            sb_patch in proptest::collection::vec((1024usize..2048, proptest::prelude::any::<u8>()), 0..4),
        ) {
            let mut c = Ext4Classifier::new();
            let mut sb = superblock();
            c.observe(0, &sb);
            for (at, v) in sb_patch {
                sb[at] = v;
            }
            c.observe(0, &sb);
            for (blk, data) in &writes {
                // Block-aligned writes, with some landing on the tables of group 0.
                let off = if blk % 3 == 0 { (blk % 600) * 4096 } else { blk * 4096 + blk % 7 };
                c.observe(off, data);
                let _ = c.classify(off, data.len() as u64);
            }
            let _ = c.classify(u64::MAX - 10, u64::MAX);
            c.observe(u64::MAX - 3, &[1, 2, 3, 4, 5]);
            for (blk, _) in &writes {
                let k = c.classify_block(*blk);
                proptest::prop_assert!(c.is_ext4() || k == BlockKind::Unknown);
            }
        }
    }

    #[test]
    fn classifier_can_be_shared_between_threads() {
        fn shared<T: Send + Sync + Clone + 'static>() {}
        shared::<Ext4Classifier>();
    }

    #[test]
    fn bytes_per_extent_matches_the_types() {
        use std::mem::size_of;
        assert_eq!(size_of::<Seg>(), 16);
        assert_eq!(size_of::<(u64, u64, Role)>(), 24);
        assert_eq!(
            BYTES_PER_EXTENT,
            (size_of::<u64>() + size_of::<Seg>()) * 3 / 2 + size_of::<(u64, u64, Role)>()
        );
    }

    #[test]
    fn unknown_without_superblock() {
        let mut c = Ext4Classifier::new();
        c.observe(0, &[0u8; 8192]);
        assert!(!c.is_ext4());
        assert_eq!(c.classify(0, 4096), BlockKind::Unknown);
        assert_eq!(class_name(c.classify(1 << 30, 4096)), "unknown");
    }

    #[test]
    fn interval_map_splits_and_withdraws_only_own_blocks() {
        let mut c = Ext4Classifier::new();
        c.assign(10, 10, 1, Role::Data);
        c.assign(14, 2, 2, Role::Data);
        assert_eq!(c.seg_at(13).unwrap().1.ino, 1);
        assert_eq!(c.seg_at(14).unwrap().1.ino, 2);
        assert_eq!(c.seg_at(16).unwrap().1.ino, 1);
        c.unassign(10, 10, 1, Role::Data);
        assert!(c.seg_at(10).is_none());
        assert_eq!(c.seg_at(15).unwrap().1.ino, 2);
        assert!(c.seg_at(19).is_none());
        assert_eq!(c.map.len(), 1);
    }

    #[test]
    fn extent_nodes_parse_leaf_and_index() {
        let mut b = vec![0u8; 60];
        b[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&2u16.to_le_bytes());
        // leaf 1: 8 blocks at 0x1_0000_0005 (hi 1)
        b[12 + 4..12 + 6].copy_from_slice(&8u16.to_le_bytes());
        b[12 + 6..12 + 8].copy_from_slice(&1u16.to_le_bytes());
        b[12 + 8..12 + 12].copy_from_slice(&5u32.to_le_bytes());
        // leaf 2: uninitialized, 3 blocks at 100
        b[24 + 4..24 + 6].copy_from_slice(&(32768u16 + 3).to_le_bytes());
        b[24 + 8..24 + 12].copy_from_slice(&100u32.to_le_bytes());
        let (d, n) = parse_extent_node(&b).unwrap();
        assert_eq!(d, 0);
        assert_eq!(n, Node::Leaf(vec![(0, (1 << 32) | 5, 8), (0, 100, 3)]));
        b[6..8].copy_from_slice(&1u16.to_le_bytes());
        let (d, n) = parse_extent_node(&b).unwrap();
        assert_eq!(d, 1);
        let Node::Index(ch) = n else { panic!() };
        assert_eq!(ch.len(), 2);
        b[0] = 0;
        assert!(parse_extent_node(&b).is_none());
    }
}
