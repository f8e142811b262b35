//! On-disk format of the cache device (direct layout).
//!
//! ```text
//! offset 0            superblock, 4 KiB (magic, version, crc32c; see `Superblock`)
//! META_OFFSET = 4096  metadata area: one 32-byte record per slot, 128 records per 4 KiB page,
//!                     written a whole page at a time
//! data_offset         data area, aligned to the line size (and to 1 MiB): slot s at
//!                     data_offset + s * line_size
//! ```
//!
//! The superblock's fields all sit in its first 512-byte sector, which carries its own crc32c
//! at byte 508 (over bytes 0..508) besides the crc32c of the whole block at 4092: a rewrite
//! torn between sectors leaves a whole old or new first sector, which is accepted (devices
//! written before the sector checksum existed have zeroes there and the whole-block check).
//! (A sector ending in its own CRC has a constant CRC residue, so for new superblocks the
//! whole-block checksum guards sectors 1..7 and the sector checksum guards sector 0; decode
//! rejects a block unless one of them verifies; a flip in sector 0 breaks both, and sectors
//! 1..7 carry no fields.)
//!
//! Version 2 adds the backing device's identity (`crate::identity`) at bytes 128..508, where
//! version 1 kept only the backing path given at format time (bytes 128..384, zeroes after):
//! a version-1 superblock decodes with an `Unknown` identity carrying that path, and is
//! written back as version 2 with the identity filled in when it is next opened.
//!
//! A record is `key u64 | valid_mask u64 | dirty_mask u64 | seq u32 | crc32c u32`, little
//! endian; the checksum covers the first 28 bytes. An empty slot has key `u64::MAX`. `seq`
//! grows with every change of a record, so when a torn metadata write leaves one key in two
//! slots, the newer record wins.
//!
//! Version 2: bit 63 of a non-empty record's key is the *in flux* flag ([`IN_FLUX`]): the
//! line's clean sectors may differ between its slot and the backing device (an in-place
//! write or a backing write was under way when the record was last written). Recovery
//! compares them (`crate::volume`, rule 5). `decode` strips the flag; [`Record::in_flux`]
//! reads it. Version 1 devices have no flags and are read as they are.
//!
//! Version 3 (only for caches formatted with `--data-checksums`; others stay version 2, so
//! builds without the feature refuse a checksummed cache instead of writing data behind its
//! checksums): byte 46 = 1, and the data checksum region (`crate::data_sums`) lies between
//! the metadata area and `data_offset`.
//!
//! Version 5: a cache serving several volumes (`serve --volume NAME=BACKING`): the volume
//! table ([`VolumeEntry`]: id, name, size, backing identity) at bytes 1024..4092, with its
//! own magic, version and crc32c (see [`VOLUME_TABLE_AT`]); byte 46 still says data
//! checksums and byte 112 says lost ranges are listed (what version 4 says for the others).
//! Builds before it refuse the cache: they would serve only volume 0 and ignore the other
//! volumes' dirty lines. A one-volume cache (`--backing`) has no table and stays version 2/3/4.
//!
//! Version 6 ([`VERSION_POOL`]): one member of a pool of several cache devices (`--cache`
//! repeated; `crate::pool_dev`). The superblock holds the pool-wide fields as version 5 does
//! (byte 112: lost ranges listed, byte 113: a volume table follows at 1024) with this member's
//! own uuid, `capacity_lines` and `data_offset`; the [`PoolBlock`] sits at 4096 and the records
//! start at [`POOL_META_OFFSET`] (8192; stored at bytes 72..80 and checked). A cache of one
//! device is never version 6. Builds before it refuse the member (bad version), and
//! [`Superblock::decode`] refuses it with [`FormatError::PoolMember`]: only
//! [`Superblock::decode_member`] reads it.
//!
//! Version 6 records may be **copies** ([`COPY`], bit 62 of the stored key): `key|COPY |
//! primary pool slot u32, 4 reserved zero bytes | dirty mask | seq | crc32c` holds the dirty
//! sectors of line `key` a second time, on another member than its primary slot (`crate::
//! reconcile` pairs them at open). The key keeps the bit when decoded ([`Record::is_copy`],
//! [`Record::copy_of_slot`], [`Record::line_key`]): a copy and its primary are two keys, so
//! the duplicate-key rule of open never takes one for a stale mapping of the other. A record
//! with the bit on a device of version 5 or older is refused ([`Record::decode_in`]). Builds
//! that read version 6 before copies existed decode such a key as a line of a volume id >=
//! `1 << 14`; they never see one, because a pool that may carry copies (`dirty_copies` >= 2)
//! writes its [`PoolBlock`] as block version 2, which they refuse.

use crate::identity::{BackingIdentity, ID_BYTES};
use std::io;

pub const MAGIC: &[u8; 8] = b"TIERCACH";
pub const VERSION: u32 = 2;
/// Version of a superblock with data checksums (`Superblock::data_checksums`).
pub const VERSION_SUMS: u32 = 3;
/// Version of a superblock written while the lost-range list (`crate::lost_list`) holds
/// ranges, with or without data checksums (byte 46 says which). Builds before it ignore the
/// list and would serve the backing device's older bytes in those ranges: they refuse the
/// version. Back to [`VERSION`] or [`VERSION_SUMS`] once the list is empty again.
pub const VERSION_LOST: u32 = 4;
/// Version of a superblock with a volume table (several volumes; see the module doc).
pub const VERSION_VOLUMES: u32 = 5;
/// Version of a pool member's superblock (see the module doc).
pub const VERSION_POOL: u32 = 6;
/// Where a pool member's [`PoolBlock`] sits.
pub const POOL_BLOCK_AT: u64 = 4096;
/// Where a pool member's records start (after the superblock and the pool block).
pub const POOL_META_OFFSET: u64 = 8192;
pub const POOL_MAGIC: &[u8; 8] = b"TCPOOL01";
const POOL_BLOCK_VERSION: u32 = 1;
/// Block version of a pool whose dirty lines have two cache copies (`dirty_copies` >= 2):
/// its records may be copies ([`COPY`]), which builds reading block version 1 only would
/// take for lines of an unknown volume, so they refuse the pool instead.
const POOL_BLOCK_VERSION_COPIES: u32 = 2;
/// Byte of a version-6 superblock saying a volume table follows.
const POOL_TABLE_AT: usize = 113;
/// Where the volume table starts (sector 2; sector 0 holds the fields, 1 the settings).
pub const VOLUME_TABLE_AT: usize = 1024;
const VOLUME_TABLE_MAGIC: &[u8; 8] = b"TCVOLTAB";
const VOLUME_TABLE_VERSION: u32 = 1;
/// Table version with entry flags ([`VolumeEntry::flags`]) in the spare 4 bytes, written
/// when an entry has one: builds that read version 1 only would serve a removed volume
/// again, or skip an added one, so they refuse it. Version 1 tables are still read (flags 0).
const VOLUME_TABLE_FLAGS_VERSION: u32 = 2;
/// [`VolumeEntry::flags`]: removed with `ctl volume remove` (its lines left the pool; not
/// served again, its id not reused; a volume of the same name added later is a new entry).
pub const VOLUME_REMOVED: u32 = 1;
/// [`VolumeEntry::flags`]: added with `ctl volume add` (a restart opens it from the path its
/// identity records when the command line does not name it).
pub const VOLUME_ADDED: u32 = 2;
/// [`VolumeEntry::flags`] bits 8..16: the volume's own mode given at `ctl volume add`
/// (index in `Mode::ALL` plus one; 0: the pool's).
const VOLUME_MODE_SHIFT: u32 = 8;

/// The flag bits recording a volume's own mode (see [`VolumeEntry::mode`]).
pub fn mode_flags(mode: Option<tiercache_engine::Mode>) -> u32 {
    use tiercache_engine::Mode;
    mode.map_or(0, |m| {
        (Mode::ALL.iter().position(|x| *x == m).unwrap() as u32 + 1) << VOLUME_MODE_SHIFT
    })
}
/// Bytes of a volume's name in the table (an NBD export name).
pub const VOLUME_NAME_BYTES: usize = 32;
/// `id u32 | flags u32 (table version 2; pad before) | size u64 | name [32] | identity [ID_BYTES]`.
const VOLUME_ENTRY_BYTES: usize = 16 + VOLUME_NAME_BYTES + ID_BYTES;
/// Volumes the table holds (what fits the superblock's 4 KiB).
pub const MAX_TABLE_VOLUMES: usize = (4092 - VOLUME_TABLE_AT - 16 - 4) / VOLUME_ENTRY_BYTES;
/// Byte of a version-5 superblock saying lost ranges are listed.
const VOLUMES_LOST_AT: usize = 112;
/// Byte of every superblock version giving the line validity: 0 sector (and every cache
/// formatted before the field), 1 line. No version bump: a build that ignores it runs the
/// cache with sector validity, which holds whole lines as they are (a line cache's records
/// are all whole), so nothing is misread; the reverse, sector records under line validity,
/// is what the field prevents (`serve --validity` other than the stored one is refused).
pub const VALIDITY_AT: usize = 114;
/// Oldest on-disk version this build opens (1: no backing identity, no in-flux flags), and
/// upgrades to [`VERSION`] when it opens it.
pub const MIN_VERSION: u32 = 1;
/// Bit of a record's stored key marking it in flux (version 2; see the module doc).
pub const IN_FLUX: u64 = 1 << 63;
/// Bit of a record's stored key marking it the *copy* of a dirty line, its second cache copy
/// on another pool member (version 6 only; see the module doc and [`Record::copy`]). Free
/// because volume ids (key bits 48..) stay below `1 << 14` in a pool.
pub const COPY: u64 = 1 << 62;
pub const SUPERBLOCK_BYTES: u64 = 4096;
pub const META_OFFSET: u64 = SUPERBLOCK_BYTES;
pub const PAGE: u64 = 4096;
pub const RECORD_BYTES: u64 = 32;
pub const RECORDS_PER_PAGE: u64 = PAGE / RECORD_BYTES;
pub const EMPTY_KEY: u64 = u64::MAX;
/// Where the backing identity sits (its name where version 1 kept the backing path).
const BACKING_ID_AT: usize = 128;
const POLICY_BYTES: usize = 32;
/// Offset of the checksum of the superblock's first sector (bytes 0..508).
const SECTOR0_CRC: usize = 508;
const _: () = assert!(
    BACKING_ID_AT + ID_BYTES <= SECTOR0_CRC,
    "fields beyond sector 0"
);

/// Why a cache device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a tiercache cache device (bad magic); format it with `tiercache format`")]
    BadMagic,
    #[error("superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the superblock is corrupted")]
    BadSuperblockChecksum { stored: u32, computed: u32 },
    #[error("this cache device is a member of a pool of several cache devices (format version {VERSION_POOL}): give every member of the pool, each with its own --cache")]
    PoolMember,
    #[error("on-disk format version {0} is not supported (this build reads versions {MIN_VERSION} to {VERSION_VOLUMES})")]
    BadVersion(u32),
    #[error("volume {volume}: {why}")]
    Volume { volume: String, why: String },
    #[error("superblock field {field} is invalid: {why}")]
    BadField { field: &'static str, why: String },
    #[error("metadata record of slot {slot} (byte {offset}) has a bad checksum, but the cache was shut down cleanly: the metadata is corrupted. The server does not start on it: run `tiercache check --repair` on the cache device (the server stopped) to drop the bad record(s) and list what is lost")]
    BadRecord { slot: u64, offset: u64 },
    #[error("the cache device of {have} bytes is too small: {need} bytes are needed for {lines} lines of {line_size} bytes")]
    TooSmall {
        have: u64,
        need: u64,
        lines: u64,
        line_size: u64,
    },
    #[error("the cache was formatted for backing device {recorded}, but the backing device given is {given}: attached to another disk, a cache serves it the first disk's data and writes its dirty lines over it. Give the right --backing; if this is the same device under a new name, add --accept-backing-rename (the new name is recorded); `tiercache format --force` discards the cache and everything it holds, dirty data included")]
    WrongBacking { recorded: String, given: String },
    #[error("the backing device {backing} changed behind the cache: {differ} of {sampled} clean cached lines sampled differ from it (first at volume byte {first}), so it was written without the cache or is another disk; the cache holds {dirty_lines} dirty lines that would be written over it. If the backing device is the right one and its changes should be overwritten by the cache's dirty data, add --accept-backing-changes (clean lines are dropped, dirty ones kept); `tiercache format --force` discards the cache, dirty data included")]
    BackingChanged {
        backing: String,
        differ: u64,
        sampled: u64,
        first: u64,
        dirty_lines: u64,
    },
    #[error("the cache device failed earlier and must not be used again: {what} (recorded in {state}). Its records may map data older than what was written to the backing device since, so it is not restored. `tiercache format --force` the cache device (which also removes the state file) to use it again")]
    Failed { what: String, state: String },
    #[error("the cache belongs to a backing device of {sb} bytes, but the backing device has {actual} bytes (format again with --force to reuse it)")]
    BackingMismatch { sb: u64, actual: u64 },
}

/// The cache device's superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub uuid: [u8; 16],
    pub line_size: u64,
    pub capacity_lines: u64,
    /// Index into `Mode::ALL`.
    pub mode: u8,
    pub policy: String,
    pub backing_size: u64,
    /// The backing device's identity (`Unknown` in version 1, with the path given then).
    pub backing: BackingIdentity,
    /// Set by a clean shutdown, cleared when the cache is opened.
    pub clean: bool,
    /// Bumped each time the superblock is written.
    pub generation: u64,
    pub data_offset: u64,
    /// Per-run engine settings stored for the next start (`crate::tuning`, in the block's
    /// second sector); `None`: none stored (defaults).
    pub tuning: Option<crate::tuning::Tuning>,
    /// A crc32c per sector of every slot is kept (`crate::data_sums`; version 3).
    pub data_checksums: bool,
    /// The lost-range list exists at [`Superblock::lost_list_offset`] (byte 47;
    /// `crate::lost_list`). Caches formatted before it get it at their first open.
    pub lost_list: bool,
    /// The lost-range list holds ranges: written as [`VERSION_LOST`] so that builds that
    /// do not honour the list refuse the cache.
    pub lost_pending: bool,
    /// The volume table (version 5): empty for a one-volume cache (`--backing`), whose one
    /// volume is id 0 with `backing` and `backing_size`.
    pub volumes: Vec<VolumeEntry>,
    /// Each volume's own settings (`crate::vol_tuning`, in the block's second sector, after
    /// `tuning`): kept for the next start; empty: none.
    pub vol_tuning: Vec<crate::vol_tuning::VolumeTuning>,
    /// What is valid and dirty inside a line (`--validity`, fixed at format; byte
    /// [`VALIDITY_AT`]: 0 sector, 1 line). Zero in caches formatted before it: sector.
    pub validity: tiercache_engine::Validity,
}

/// One volume of a cache serving several (`serve --volume NAME=BACKING`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    /// The volume's id: its lines' keys are `id << 48 | line`.
    pub id: u32,
    /// Its NBD export name.
    pub name: String,
    /// Its backing device's size in bytes.
    pub size: u64,
    /// Its backing device's identity, checked at every open.
    pub identity: BackingIdentity,
    /// [`VOLUME_REMOVED`], [`VOLUME_ADDED`] (0 in a version 1 table).
    pub flags: u32,
}

impl VolumeEntry {
    /// Removed with `ctl volume remove`: not served, kept only so that its id is not reused
    /// while the cache device may hold records of it.
    pub fn removed(&self) -> bool {
        self.flags & VOLUME_REMOVED != 0
    }

    /// The volume's own mode recorded at `ctl volume add` (`None`: the pool's).
    pub fn mode(&self) -> Option<tiercache_engine::Mode> {
        let i = (self.flags >> VOLUME_MODE_SHIFT) & 0xff;
        (i != 0).then(|| tiercache_engine::Mode::ALL.get(i as usize - 1).copied())?
    }

    /// Records `mode` as the volume's own (`None`: the pool's) when it was added live (its
    /// mode at a restart comes from here); a volume of the command line keeps no mode here.
    pub fn set_added_mode(&mut self, mode: Option<tiercache_engine::Mode>) {
        if self.flags & VOLUME_ADDED != 0 {
            self.flags = (self.flags & !(0xff << VOLUME_MODE_SHIFT)) | mode_flags(mode);
        }
    }

    fn flags_valid(&self) -> bool {
        let i = (self.flags >> VOLUME_MODE_SHIFT) & 0xff;
        self.flags & !(VOLUME_REMOVED | VOLUME_ADDED | 0xff << VOLUME_MODE_SHIFT) == 0
            && i as usize <= tiercache_engine::Mode::ALL.len()
    }
}

fn encode_volumes(v: &[VolumeEntry], b: &mut [u8]) {
    assert!(v.len() <= MAX_TABLE_VOLUMES, "volume table too long");
    let t = &mut b[VOLUME_TABLE_AT..4092];
    t[0..8].copy_from_slice(VOLUME_TABLE_MAGIC);
    let ver = if v.iter().any(|e| e.flags != 0) {
        VOLUME_TABLE_FLAGS_VERSION
    } else {
        VOLUME_TABLE_VERSION
    };
    t[8..12].copy_from_slice(&ver.to_le_bytes());
    t[12..16].copy_from_slice(&(v.len() as u32).to_le_bytes());
    for (i, e) in v.iter().enumerate() {
        let o = 16 + i * VOLUME_ENTRY_BYTES;
        let x = &mut t[o..o + VOLUME_ENTRY_BYTES];
        x[0..4].copy_from_slice(&e.id.to_le_bytes());
        x[4..8].copy_from_slice(&e.flags.to_le_bytes());
        x[8..16].copy_from_slice(&e.size.to_le_bytes());
        put_str(&mut x[16..16 + VOLUME_NAME_BYTES], &e.name);
        e.identity.encode_into(&mut x[16 + VOLUME_NAME_BYTES..]);
    }
    let end = 16 + v.len() * VOLUME_ENTRY_BYTES;
    let crc = crc32c::crc32c(&t[..end]);
    t[end..end + 4].copy_from_slice(&crc.to_le_bytes());
}

fn decode_volumes(b: &[u8]) -> Result<Vec<VolumeEntry>, String> {
    let t = &b[VOLUME_TABLE_AT..4092];
    if &t[0..8] != VOLUME_TABLE_MAGIC {
        return Err("no volume table (bad magic) in a version 5 superblock".into());
    }
    let ver = u32::from_le_bytes(t[8..12].try_into().unwrap());
    if ver != VOLUME_TABLE_VERSION && ver != VOLUME_TABLE_FLAGS_VERSION {
        return Err(format!(
            "volume table version {ver} is not supported (this build reads {VOLUME_TABLE_VERSION} and {VOLUME_TABLE_FLAGS_VERSION})"
        ));
    }
    let n = u32::from_le_bytes(t[12..16].try_into().unwrap()) as usize;
    if n == 0 || n > MAX_TABLE_VOLUMES {
        return Err(format!(
            "{n} volumes (1 to {MAX_TABLE_VOLUMES} fit the table)"
        ));
    }
    let end = 16 + n * VOLUME_ENTRY_BYTES;
    let stored = u32::from_le_bytes(t[end..end + 4].try_into().unwrap());
    let computed = crc32c::crc32c(&t[..end]);
    if stored != computed {
        return Err(format!(
            "volume table checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    let mut out: Vec<VolumeEntry> = Vec::with_capacity(n);
    for i in 0..n {
        let x = &t[16 + i * VOLUME_ENTRY_BYTES..16 + (i + 1) * VOLUME_ENTRY_BYTES];
        let e = VolumeEntry {
            id: u32::from_le_bytes(x[0..4].try_into().unwrap()),
            size: u64::from_le_bytes(x[8..16].try_into().unwrap()),
            name: get_str(&x[16..16 + VOLUME_NAME_BYTES]),
            identity: BackingIdentity::decode_from(&x[16 + VOLUME_NAME_BYTES..])
                .map_err(|why| format!("entry {i}: {why}"))?,
            flags: if ver == VOLUME_TABLE_VERSION {
                0
            } else {
                u32::from_le_bytes(x[4..8].try_into().unwrap())
            },
        };
        // A name is unique among the volumes not removed (a removed one's may be reused).
        let same_name = |o: &VolumeEntry| o.name == e.name && !o.removed() && !e.removed();
        if e.id > tiercache_engine::engine::MAX_VOLUME
            || !e.flags_valid()
            || out.iter().any(|o| o.id == e.id || same_name(o))
        {
            return Err(format!(
                "entry {i} (volume {:?}, id {}) repeats an id or a name, or its id or flags are out of range",
                e.name, e.id
            ));
        }
        out.push(e);
    }
    Ok(out)
}

impl Superblock {
    /// Layout for `capacity_lines` lines: returns the data offset.
    pub fn data_offset_for(capacity_lines: u64, line_size: u64) -> u64 {
        let meta = capacity_lines.div_ceil(RECORDS_PER_PAGE) * PAGE;
        let align = line_size.max(1 << 20);
        (META_OFFSET + meta).div_ceil(align) * align
    }

    /// Most lines of `line_size` that fit a device of `bytes`.
    pub fn lines_for_device(bytes: u64, line_size: u64) -> u64 {
        most_lines(bytes, line_size, |n| {
            Self::data_offset_for(n, line_size) + n * line_size <= bytes
        })
    }

    /// [`Superblock::data_offset_for`] with room for the data checksum region when `sums`.
    pub fn data_offset_with(capacity_lines: u64, line_size: u64, sums: bool) -> u64 {
        if !sums {
            return Self::data_offset_for(capacity_lines, line_size);
        }
        let end = crate::data_sums::region_offset(capacity_lines)
            + crate::data_sums::region_bytes(capacity_lines, line_size);
        end.div_ceil(line_size.max(1 << 20)) * line_size.max(1 << 20)
    }

    /// End of the metadata area (and of the data checksum region when `sums`): what a data
    /// offset must not overlap.
    pub fn meta_end(capacity_lines: u64, line_size: u64, sums: bool) -> u64 {
        if sums {
            crate::data_sums::region_offset(capacity_lines)
                + crate::data_sums::region_bytes(capacity_lines, line_size)
        } else {
            META_OFFSET + capacity_lines.div_ceil(RECORDS_PER_PAGE) * PAGE
        }
    }

    /// The data offset of a cache formatted now: [`Superblock::data_offset_with`] with room
    /// for the lost-range list ([`crate::lost_list`]) just before the data area.
    pub fn data_offset_new(capacity_lines: u64, line_size: u64, sums: bool) -> u64 {
        let align = line_size.max(1 << 20);
        (Self::meta_end(capacity_lines, line_size, sums) + crate::lost_list::BYTES).div_ceil(align)
            * align
    }

    /// Where the lost-range list sits (`data_offset - lost_list::BYTES`), if the slack
    /// before the data area holds it (always for caches formatted with it; for older ones
    /// when the alignment left room).
    pub fn lost_list_offset(&self) -> Option<u64> {
        let at = self.data_offset.checked_sub(crate::lost_list::BYTES)?;
        let meta_end = if self.version == VERSION_POOL {
            Self::member_meta_end(self.capacity_lines)
        } else {
            Self::meta_end(self.capacity_lines, self.line_size, self.data_checksums)
        };
        (at >= meta_end).then_some(at)
    }

    /// End of a pool member's record area (version 6: records from [`POOL_META_OFFSET`]).
    pub fn member_meta_end(capacity_lines: u64) -> u64 {
        POOL_META_OFFSET + capacity_lines.div_ceil(RECORDS_PER_PAGE) * PAGE
    }

    /// The data offset of a pool member of `capacity_lines` lines: its records, then the
    /// lost-range list, aligned as [`Superblock::data_offset_new`] (no data checksums).
    pub fn member_data_offset(capacity_lines: u64, line_size: u64) -> u64 {
        let align = line_size.max(1 << 20);
        (Self::member_meta_end(capacity_lines) + crate::lost_list::BYTES).div_ceil(align) * align
    }

    /// Most lines of `line_size` a pool member of `bytes` holds (before the pool's rounding
    /// to record pages).
    pub fn member_lines_for_device(bytes: u64, line_size: u64) -> u64 {
        most_lines(bytes, line_size, |n| {
            Self::member_data_offset(n, line_size) + n * line_size <= bytes
        })
    }

    /// The version this superblock is written as.
    pub fn current_version(&self) -> u32 {
        if !self.volumes.is_empty() {
            VERSION_VOLUMES
        } else if self.lost_pending {
            VERSION_LOST
        } else if self.data_checksums {
            VERSION_SUMS
        } else {
            VERSION
        }
    }

    pub fn device_bytes(&self) -> u64 {
        self.data_offset + self.capacity_lines * self.line_size
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..28].copy_from_slice(&self.uuid);
        b[28..36].copy_from_slice(&self.line_size.to_le_bytes());
        b[36..44].copy_from_slice(&self.capacity_lines.to_le_bytes());
        b[44] = self.mode;
        b[45] = self.clean as u8;
        b[46] = self.data_checksums as u8;
        b[VALIDITY_AT] = (self.validity == tiercache_engine::Validity::Line) as u8;
        b[crate::lost_list::SB_FLAG_AT] = self.lost_list as u8;
        b[48..56].copy_from_slice(&self.backing_size.to_le_bytes());
        b[56..64].copy_from_slice(&self.generation.to_le_bytes());
        b[64..72].copy_from_slice(&self.data_offset.to_le_bytes());
        let meta_offset = if self.version == VERSION_POOL {
            POOL_META_OFFSET
        } else {
            META_OFFSET
        };
        b[72..80].copy_from_slice(&meta_offset.to_le_bytes());
        put_str(&mut b[80..80 + POLICY_BYTES], &self.policy);
        self.backing
            .encode_into(&mut b[BACKING_ID_AT..BACKING_ID_AT + ID_BYTES]);
        if let Some(t) = &self.tuning {
            t.encode_into(&mut b[crate::tuning::AT..]);
        }
        crate::vol_tuning::encode_into(&self.vol_tuning, &mut b);
        if self.version == VERSION_VOLUMES {
            b[VOLUMES_LOST_AT] = self.lost_pending as u8;
            encode_volumes(&self.volumes, &mut b);
        }
        if self.version == VERSION_POOL {
            b[VOLUMES_LOST_AT] = self.lost_pending as u8;
            if !self.volumes.is_empty() {
                b[POOL_TABLE_AT] = 1;
                encode_volumes(&self.volumes, &mut b);
            }
        }
        // Every field sits in the first 512-byte sector, with its own checksum at 508: a
        // rewrite torn between sectors still leaves a whole old or new superblock there.
        let crc0 = crc32c::crc32c(&b[..SECTOR0_CRC]);
        b[SECTOR0_CRC..SECTOR0_CRC + 4].copy_from_slice(&crc0.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the superblock of a cache of one device (versions 1 to 5): a pool member's
    /// (version 6) is refused with [`FormatError::PoolMember`].
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        Self::decode_as(b, false)
    }

    /// Decodes a pool member's superblock (version 6 only; see the module doc).
    pub fn decode_member(b: &[u8]) -> Result<Superblock, FormatError> {
        Self::decode_as(b, true)
    }

    fn decode_as(b: &[u8], member: bool) -> Result<Superblock, FormatError> {
        if b.len() < SUPERBLOCK_BYTES as usize || &b[0..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let stored = u32::from_le_bytes(b[4092..4096].try_into().unwrap());
        let computed = crc32c::crc32c(&b[..4092]);
        let crc0 = u32::from_le_bytes(b[SECTOR0_CRC..SECTOR0_CRC + 4].try_into().unwrap());
        // A superblock rewrite torn after its first sector: that sector is whole and checked.
        let sector0_ok = crc0 != 0 && crc0 == crc32c::crc32c(&b[..SECTOR0_CRC]);
        if stored != computed && !sector0_ok {
            return Err(FormatError::BadSuperblockChecksum { stored, computed });
        }
        let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version == VERSION_POOL && !member {
            return Err(FormatError::PoolMember);
        }
        if member && version != VERSION_POOL {
            return Err(FormatError::BadField {
                field: "version",
                why: format!(
                    "version {version}: a cache device formatted alone, not as a member of a pool"
                ),
            });
        }
        if !(MIN_VERSION..=VERSION_VOLUMES).contains(&version) && version != VERSION_POOL {
            return Err(FormatError::BadVersion(version));
        }
        let pool = version == VERSION_POOL;
        let backing = BackingIdentity::decode_from(&b[BACKING_ID_AT..BACKING_ID_AT + ID_BYTES])
            .map_err(|why| FormatError::BadField {
                field: "backing identity",
                why,
            })?;
        let sb = Superblock {
            version,
            uuid: b[12..28].try_into().unwrap(),
            line_size: u64at(28),
            capacity_lines: u64at(36),
            mode: b[44],
            clean: b[45] == 1,
            backing_size: u64at(48),
            generation: u64at(56),
            data_offset: u64at(64),
            data_checksums: version >= VERSION_SUMS && b[46] == 1,
            lost_list: b[crate::lost_list::SB_FLAG_AT] == 1,
            lost_pending: version == VERSION_LOST
                || ((version == VERSION_VOLUMES || pool) && b[VOLUMES_LOST_AT] == 1),
            volumes: if version == VERSION_VOLUMES || (pool && b[POOL_TABLE_AT] == 1) {
                decode_volumes(b).map_err(|why| FormatError::BadField {
                    field: "volume table",
                    why,
                })?
            } else {
                Vec::new()
            },
            policy: get_str(&b[80..80 + POLICY_BYTES]),
            backing,
            vol_tuning: crate::vol_tuning::decode(b).unwrap_or_else(|e| {
                tracing::warn!(
                    "superblock: {e}: the volumes' stored own settings are ignored (the pool's apply)"
                );
                Vec::new()
            }),
            validity: match b[VALIDITY_AT] {
                0 => tiercache_engine::Validity::Sector,
                1 => tiercache_engine::Validity::Line,
                v => {
                    return Err(FormatError::BadField {
                        field: "validity",
                        why: format!("byte {VALIDITY_AT} is {v} (0 sector, 1 line)"),
                    })
                }
            },
            tuning: crate::tuning::Tuning::decode(&b[crate::tuning::AT..]).unwrap_or_else(|e| {
                tracing::warn!(
                    "superblock: {e}: the stored engine settings are ignored (defaults apply)"
                );
                None
            }),
        };
        let bad = |field, why: String| Err(FormatError::BadField { field, why });
        if !sb.line_size.is_power_of_two() || !(4096..=1 << 20).contains(&sb.line_size) {
            return bad(
                "line_size",
                format!("{} is not a power of two in 4 KiB..1 MiB", sb.line_size),
            );
        }
        if sb.mode as usize >= tiercache_engine::Mode::ALL.len() {
            return bad("mode", format!("{} is not a mode index", sb.mode));
        }
        if version == VERSION_SUMS && b[46] != 1 {
            return bad(
                "data_checksums",
                format!("flag {} in a version {version} superblock", b[46]),
            );
        }
        let data_min = if pool {
            Self::member_meta_end(sb.capacity_lines)
        } else {
            Self::data_offset_with(sb.capacity_lines, sb.line_size, sb.data_checksums)
        };
        if pool && sb.data_checksums {
            return bad(
                "data_checksums",
                "set in a pool member (pools have no data checksums yet)".into(),
            );
        }
        if sb.data_offset < data_min {
            return bad(
                "data_offset",
                format!("{} overlaps the metadata area", sb.data_offset),
            );
        }
        if sb.lost_pending && !sb.lost_list {
            return bad(
                "lost_list",
                format!("version {version} (lost ranges listed) without the list's flag"),
            );
        }
        if sb.lost_list && sb.lost_list_offset().is_none() {
            return bad(
                "lost_list",
                format!(
                    "flag set, but data offset {} leaves no room for the list",
                    sb.data_offset
                ),
            );
        }
        let meta_offset = if pool { POOL_META_OFFSET } else { META_OFFSET };
        if u64at(72) != meta_offset {
            return bad(
                "meta_offset",
                format!("{} (expected {meta_offset})", u64at(72)),
            );
        }
        Ok(sb)
    }
}

/// State of a member in the pool block (only `Active` is written so far: a failed member
/// and its replacement are later steps of the pool plan, docs/plan-multi-cache.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Active,
    Failed,
}

/// One member as the pool block lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    /// The member's uuid (its superblock's `uuid`).
    pub uuid: [u8; 16],
    /// Lines the pool uses on it (a multiple of `tiercache_engine::pool::POOL_ALIGN`).
    pub lines: u64,
    pub state: MemberState,
    /// The member may hold dirty lines (entry byte 25, bit 0): set on every live member's
    /// block before the first dirty record reaches it, cleared once a sync made every
    /// record on it clean (`crate::pool_dev`). A member missing at open with this clear
    /// holds no acknowledged data the backing device lacks: the pool starts without it.
    /// Builds before it leave the byte 0 and ignore it.
    pub may_dirty: bool,
    /// The member may hold *single-copy* dirty lines (entry byte 26, bit 0): dirty lines
    /// whose acknowledged sectors have no copy record on another member (`--dirty-copies 1`,
    /// a copy promoted or dropped and not yet re-mirrored). Raised on every live member's
    /// block before such a record is durable and acknowledged, cleared only by a sync after
    /// the member holds none (`crate::pool_dev`). A member missing at open with this clear
    /// (and `may_dirty` set) loses nothing: its dirty lines are served from their copies.
    /// A block without [`PoolBlock`]'s byte 41 bit 1 (older builds): unknown, so set.
    pub may_single: bool,
}

/// The pool block of a version-6 member, at [`POOL_BLOCK_AT`]: the same on every member but
/// for `index`. `magic | block version u32 | pool uuid [16] | generation u64 | index u16 |
/// count u16 | dirty_copies u8 | flags u8 (bit 0: members' dirty flags kept) | pad to 48 | count x (uuid [16] | lines u64 | state u8 |
/// flags u8 (bit 0: may hold dirty lines) | flags u8 (bit 0: may hold single-copy dirty
/// lines; kept when block byte 41 bit 1 is set) | pad 5) | ... | crc32c at 4092` (over bytes 0..4092). A torn or garbled block fails its crc;
/// among readable blocks the newest generation is the pool's membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolBlock {
    pub pool: [u8; 16],
    pub generation: u64,
    /// This member's index in `members`.
    pub index: u16,
    /// Cache copies of each dirty line chosen at format (`--dirty-copies`; 0: not chosen,
    /// so write-back is refused until it is given; 1 until mirroring is built).
    pub dirty_copies: u8,
    pub members: Vec<PoolEntry>,
}

const POOL_ENTRY_AT: usize = 48;
/// Pool block byte 41, bit 0: the members' `may_dirty` flags are kept (a block without it
/// was written by a build that did not keep them: every member may hold dirty lines).
const DIRTY_FLAGS_KEPT: u8 = 1;
/// Pool block byte 41, bit 1: the members' `may_single` flags are kept (entry byte 26; a
/// block without it: every member may hold single-copy dirty lines).
const SINGLE_FLAGS_KEPT: u8 = 2;
const POOL_ENTRY_BYTES: usize = 32;

impl PoolBlock {
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            !self.members.is_empty()
                && self.members.len() <= tiercache_engine::pool::MAX_MEMBERS
                && (self.index as usize) < self.members.len(),
            "pool block with {} members, index {}",
            self.members.len(),
            self.index
        );
        let mut b = vec![0u8; PAGE as usize];
        b[0..8].copy_from_slice(POOL_MAGIC);
        b[8..12].copy_from_slice(&self.block_version().to_le_bytes());
        b[12..28].copy_from_slice(&self.pool);
        b[28..36].copy_from_slice(&self.generation.to_le_bytes());
        b[36..38].copy_from_slice(&self.index.to_le_bytes());
        b[38..40].copy_from_slice(&(self.members.len() as u16).to_le_bytes());
        b[40] = self.dirty_copies;
        b[41] = DIRTY_FLAGS_KEPT | SINGLE_FLAGS_KEPT;
        for (i, m) in self.members.iter().enumerate() {
            let x = &mut b[POOL_ENTRY_AT + i * POOL_ENTRY_BYTES..][..POOL_ENTRY_BYTES];
            x[0..16].copy_from_slice(&m.uuid);
            x[16..24].copy_from_slice(&m.lines.to_le_bytes());
            x[24] = match m.state {
                MemberState::Active => 0,
                MemberState::Failed => 1,
            };
            x[25] = m.may_dirty as u8;
            x[26] = m.may_single as u8;
        }
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The block version this block is written as: [`POOL_BLOCK_VERSION_COPIES`] when its
    /// records may be copies (see the module doc).
    pub fn block_version(&self) -> u32 {
        if self.dirty_copies >= 2 {
            POOL_BLOCK_VERSION_COPIES
        } else {
            POOL_BLOCK_VERSION
        }
    }

    /// `Err` says why the block is not a pool block (no magic, torn or garbled, unknown
    /// version, fields out of range).
    pub fn decode(b: &[u8]) -> Result<PoolBlock, String> {
        if b.len() < PAGE as usize || &b[0..8] != POOL_MAGIC {
            return Err("no pool block (bad magic)".into());
        }
        let stored = u32::from_le_bytes(b[4092..4096].try_into().unwrap());
        let computed = crc32c::crc32c(&b[..4092]);
        if stored != computed {
            return Err(format!(
                "pool block checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): torn or corrupted"
            ));
        }
        let ver = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if ver != POOL_BLOCK_VERSION && ver != POOL_BLOCK_VERSION_COPIES {
            return Err(format!(
                "pool block version {ver} is not supported (this build reads {POOL_BLOCK_VERSION} and {POOL_BLOCK_VERSION_COPIES})"
            ));
        }
        if (ver == POOL_BLOCK_VERSION_COPIES) != (b[40] >= 2) {
            return Err(format!(
                "pool block version {ver} with {} dirty copies: version {POOL_BLOCK_VERSION_COPIES} is written exactly when dirty lines have two copies (damaged block)",
                b[40]
            ));
        }
        let index = u16::from_le_bytes(b[36..38].try_into().unwrap());
        let count = u16::from_le_bytes(b[38..40].try_into().unwrap()) as usize;
        if count == 0 || count > tiercache_engine::pool::MAX_MEMBERS || index as usize >= count {
            return Err(format!(
                "pool block: member {index} of {count}: out of range"
            ));
        }
        // Written by a build that does not keep the members' dirty flags: unknown, so each
        // member may hold dirty lines.
        let kept = b[41] & DIRTY_FLAGS_KEPT != 0;
        let single_kept = b[41] & SINGLE_FLAGS_KEPT != 0;
        let mut members = Vec::with_capacity(count);
        for i in 0..count {
            let x = &b[POOL_ENTRY_AT + i * POOL_ENTRY_BYTES..][..POOL_ENTRY_BYTES];
            members.push(PoolEntry {
                uuid: x[0..16].try_into().unwrap(),
                lines: u64::from_le_bytes(x[16..24].try_into().unwrap()),
                state: match x[24] {
                    0 => MemberState::Active,
                    1 => MemberState::Failed,
                    s => return Err(format!("pool block: member {i} has state {s}")),
                },
                may_dirty: match x[25] {
                    0 => !kept,
                    1 => true,
                    f => return Err(format!("pool block: member {i} has flags {f:#x}")),
                },
                may_single: match x[26] {
                    0 => !single_kept,
                    1 => true,
                    f => {
                        return Err(format!(
                            "pool block: member {i} has single-copy flags {f:#x}"
                        ))
                    }
                },
            });
        }
        Ok(PoolBlock {
            pool: b[12..28].try_into().unwrap(),
            generation: u64::from_le_bytes(b[28..36].try_into().unwrap()),
            index,
            dirty_copies: b[40],
            members,
        })
    }

    /// Index of the newest block (highest generation; the first of equals) among `blocks`.
    pub fn newest(blocks: &[&PoolBlock]) -> Option<usize> {
        (0..blocks.len()).reduce(|a, i| {
            if blocks[i].generation > blocks[a].generation {
                i
            } else {
                a
            }
        })
    }
}

/// The largest line count `n` of a device of `bytes` for which `fits(n)` (monotone): a
/// binary search.
fn most_lines(bytes: u64, line_size: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (0u64, bytes / line_size + 1);
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn put_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// One slot's persistent metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: u64,
    pub valid: u64,
    pub dirty: u64,
    pub seq: u32,
}

impl Record {
    pub const EMPTY: Record = Record {
        key: EMPTY_KEY,
        valid: 0,
        dirty: 0,
        seq: 0,
    };

    pub fn encode(&self, out: &mut [u8]) {
        self.encode_flagged(out, false)
    }

    /// Encodes with the in-flux flag ([`IN_FLUX`]) set when `in_flux` (never on an empty
    /// record, whose key has every bit set).
    pub fn encode_flagged(&self, out: &mut [u8], in_flux: bool) {
        assert!(
            self.key == EMPTY_KEY || self.key & IN_FLUX == 0,
            "record key {:#x} uses the in-flux bit",
            self.key
        );
        let flag = if in_flux && self.key != EMPTY_KEY {
            IN_FLUX
        } else {
            0
        };
        out[0..8].copy_from_slice(&(self.key | flag).to_le_bytes());
        out[8..16].copy_from_slice(&self.valid.to_le_bytes());
        out[16..24].copy_from_slice(&self.dirty.to_le_bytes());
        out[24..28].copy_from_slice(&self.seq.to_le_bytes());
        let crc = record_crc(out);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
    }

    /// `None` when the checksum does not match.
    pub fn decode(b: &[u8]) -> Option<Record> {
        let crc = u32::from_le_bytes(b[28..32].try_into().unwrap());
        if crc != record_crc(b) {
            return None;
        }
        Some(Record::decode_trusted(b))
    }

    /// Decodes a record whose checksum was verified already (a restart reads each record
    /// of the record area several times and checks it once).
    pub fn decode_trusted(b: &[u8]) -> Record {
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let key = match u(0) {
            EMPTY_KEY => EMPTY_KEY,
            k => k & !IN_FLUX,
        };
        Record {
            key,
            valid: u(8),
            dirty: u(16),
            seq: u32::from_le_bytes(b[24..28].try_into().unwrap()),
        }
    }
}

impl Record {
    /// The copy record of dirty line `key` (no flag bits) whose primary is pool slot
    /// `primary`: it holds the line's `dirty` sectors (the valid ones of a copy), see the
    /// module doc. `dirty` is not empty: a clean line has no copy.
    pub fn copy(key: u64, primary: u32, dirty: u64, seq: u32) -> Record {
        assert!(
            key != EMPTY_KEY && key & (COPY | IN_FLUX) == 0,
            "copy record of key {key:#x}: a line key has no flag bits"
        );
        assert!(
            dirty != 0,
            "copy record of key {key:#x} with no dirty sector"
        );
        Record {
            key: key | COPY,
            valid: primary as u64,
            dirty,
            seq,
        }
    }

    /// Whether this (decoded) record is a copy ([`COPY`]).
    pub fn is_copy(&self) -> bool {
        self.key != EMPTY_KEY && self.key & COPY != 0
    }

    /// The pool slot of the primary of a copy record; `None` for any other record.
    pub fn copy_of_slot(&self) -> Option<u32> {
        self.is_copy().then_some(self.valid as u32)
    }

    /// The line's key, without the copy bit ([`EMPTY_KEY`] for an empty record).
    pub fn line_key(&self) -> u64 {
        if self.key == EMPTY_KEY {
            EMPTY_KEY
        } else {
            self.key & !COPY
        }
    }

    /// The sectors the slot holds of the line: a copy's are its dirty ones.
    pub fn sectors(&self) -> u64 {
        if self.is_copy() {
            self.dirty
        } else {
            self.valid
        }
    }

    /// Decodes the record of `slot` on a device of on-disk `version` (a pool member's records
    /// are version 6): `Ok(None)` when its checksum does not match; `Err` naming the slot and
    /// its record page when it verifies but is a copy ([`COPY`]) where none can be (version
    /// 5 or older), or a copy that is malformed (reserved bytes set, no dirty sector).
    pub fn decode_in(b: &[u8], version: u32, slot: u64) -> Result<Option<Record>, String> {
        let Some(r) = Record::decode(b) else {
            return Ok(None);
        };
        r.check_copy(version, slot)?;
        Ok(Some(r))
    }

    /// The checks of [`Record::decode_in`] on a decoded record.
    pub fn check_copy(&self, version: u32, slot: u64) -> Result<(), String> {
        if !self.is_copy() {
            return Ok(());
        }
        let at = format!(
            "record of slot {slot} (record page {}, entry {})",
            slot / RECORDS_PER_PAGE,
            slot % RECORDS_PER_PAGE
        );
        if version < VERSION_POOL {
            return Err(format!(
                "{at}: key {:#x} has the copy bit (bit 62), which only pool members (format version {VERSION_POOL}) carry, on a version {version} cache: damaged metadata",
                self.key
            ));
        }
        if self.valid >> 32 != 0 || self.dirty == 0 {
            return Err(format!(
                "{at}: copy record of key {:#x} is malformed (primary field {:#x}, dirty {:#x}: reserved bytes set or no dirty sector)",
                self.line_key(),
                self.valid,
                self.dirty
            ));
        }
        Ok(())
    }

    /// Whether the stored record `b` is valid and carries the in-flux flag.
    pub fn in_flux(b: &[u8]) -> bool {
        let k = u64::from_le_bytes(b[0..8].try_into().unwrap());
        k != EMPTY_KEY && k & IN_FLUX != 0 && Record::decode(b).is_some()
    }
}

/// Whether sequence number `a` is newer than `b` (wrapping).
pub fn seq_newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// CRC-32C of a record's first 28 bytes (`b` holds at least those): equal to
/// `crc32c::crc32c(&b[0..28])`, with the SSE 4.2 instructions called directly when the CPU
/// has them (a restart checks 10^7..10^8 records: the general function's dispatch and
/// length handling cost as much as the CRC of 28 bytes).
#[inline]
pub fn record_crc(b: &[u8]) -> u32 {
    let b = &b[0..28];
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2 (checked just above).
        return unsafe { record_crc_sse42(b) };
    }
    crc32c::crc32c(b)
}

/// [`record_crc`] on SSE 4.2: three 8-byte steps and one of 4 bytes, little-endian, from
/// the standard initial value, complemented at the end (as the crate computes it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn record_crc_sse42(b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64};
    let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let mut c = u64::from(!0u32);
    c = _mm_crc32_u64(c, u(0));
    c = _mm_crc32_u64(c, u(8));
    c = _mm_crc32_u64(c, u(16));
    !_mm_crc32_u32(c as u32, u32::from_le_bytes(b[24..28].try_into().unwrap()))
}

#[cfg(test)]
mod tests {

    /// The record checksum equals the general CRC-32C of the same 28 bytes (random bytes,
    /// and the extremes): records written by older builds still verify.
    #[test]
    fn record_crc_equals_crc32c() {
        let mut x = 0x853c_49e6_748f_ea9bu64;
        let mut b = [0u8; 32];
        for i in 0..20_000 {
            for c in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
            if i == 0 {
                b = [0; 32];
            } else if i == 1 {
                b = [0xff; 32];
            }
            assert_eq!(
                super::record_crc(&b),
                crc32c::crc32c(&b[0..28]),
                "bytes {b:02x?}"
            );
        }
    }
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            version: VERSION,
            uuid: [7; 16],
            line_size: 4096,
            capacity_lines: 1000,
            mode: 1,
            policy: "lru".into(),
            backing_size: 1 << 30,
            backing: BackingIdentity::nbd("nbd://host/disk"),
            clean: true,
            generation: 9,
            data_offset: Superblock::data_offset_for(1000, 4096),
            tuning: Some(crate::tuning::Tuning::of(&Default::default())),
            data_checksums: false,
            lost_list: true,
            lost_pending: false,
            volumes: Vec::new(),
            vol_tuning: Vec::new(),
            validity: tiercache_engine::Validity::Sector,
        }
    }

    /// The line validity survives encode/decode in every version; zero (every cache written
    /// before the field) reads as sector; another value is refused by name.
    #[test]
    fn validity_round_trips_and_a_bad_byte_is_refused() {
        use tiercache_engine::Validity;
        for v in [Validity::Sector, Validity::Line] {
            for (version, sums) in [(VERSION, false), (VERSION_SUMS, true)] {
                let s = Superblock {
                    version,
                    data_checksums: sums,
                    data_offset: Superblock::data_offset_with(1000, 4096, sums),
                    validity: v,
                    ..sb()
                };
                let b = s.encode();
                assert_eq!(b[VALIDITY_AT], (v == Validity::Line) as u8);
                assert_eq!(Superblock::decode(&b).unwrap(), s);
            }
        }
        let mut b = sb().encode();
        b[VALIDITY_AT] = 2;
        let crc0 = crc32c::crc32c(&b[..SECTOR0_CRC]);
        b[SECTOR0_CRC..SECTOR0_CRC + 4].copy_from_slice(&crc0.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        let e = Superblock::decode(&b).unwrap_err().to_string();
        assert!(e.contains("validity") && e.contains("114"), "{e}");
    }

    #[test]
    fn volume_table_is_version_5_and_checked() {
        let vols: Vec<VolumeEntry> = (0..MAX_TABLE_VOLUMES as u32)
            .map(|i| VolumeEntry {
                id: i * 3,
                name: format!("vol-{i}"),
                size: (i as u64 + 1) << 30,
                identity: BackingIdentity::nbd(&format!("nbd://host/disk{i}")),
                flags: 0,
            })
            .collect();
        const { assert!(MAX_TABLE_VOLUMES >= 6) };
        for (sums, lost) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut s = Superblock {
                data_checksums: sums,
                data_offset: Superblock::data_offset_with(1000, 4096, sums),
                lost_pending: lost,
                volumes: vols.clone(),
                ..sb()
            };
            s.version = s.current_version();
            assert_eq!(s.version, VERSION_VOLUMES);
            let b = s.encode();
            assert_eq!(
                Superblock::decode(&b).unwrap(),
                s,
                "sums {sums} lost {lost}"
            );
            // One flipped byte in the table (whole-block checksum fixed up): refused by name.
            let mut c = b.clone();
            c[VOLUME_TABLE_AT + 16 + 20] ^= 1;
            let crc = crc32c::crc32c(&c[..4092]);
            c[4092..].copy_from_slice(&crc.to_le_bytes());
            let e = Superblock::decode(&c).unwrap_err().to_string();
            assert!(e.contains("volume table checksum"), "{e}");
        }
        // Entry flags (table version 2): a removed entry's name may be reused by a new one;
        // two entries of one name not removed are refused. Version 1 tables still read.
        let mut flagged = vols.clone();
        flagged[1].flags = VOLUME_REMOVED;
        flagged[2].flags = VOLUME_ADDED | mode_flags(Some(tiercache_engine::Mode::WriteBack));
        flagged[2].name = flagged[1].name.clone();
        let s = Superblock {
            volumes: flagged.clone(),
            version: VERSION_VOLUMES,
            ..sb()
        };
        let b = s.encode();
        assert_eq!(
            &b[VOLUME_TABLE_AT + 8..VOLUME_TABLE_AT + 12],
            &2u32.to_le_bytes()
        );
        assert_eq!(Superblock::decode(&b).unwrap().volumes, flagged);
        assert_eq!(flagged[2].mode(), Some(tiercache_engine::Mode::WriteBack));
        assert_eq!(flagged[1].mode(), None);
        let mut twice = flagged.clone();
        twice[1].flags = 0;
        let b = Superblock {
            volumes: twice,
            ..s.clone()
        }
        .encode();
        let e = Superblock::decode(&b).unwrap_err().to_string();
        assert!(e.contains("repeats an id or a name"), "{e}");
        let v1 = Superblock {
            volumes: vols.clone(),
            ..s
        }
        .encode();
        assert_eq!(
            &v1[VOLUME_TABLE_AT + 8..VOLUME_TABLE_AT + 12],
            &1u32.to_le_bytes()
        );
        // Without a table: versions as before, no table bytes.
        let s = sb();
        assert_eq!(s.current_version(), VERSION);
        assert!(s.encode()[VOLUME_TABLE_AT..VOLUME_TABLE_AT + 8]
            .iter()
            .all(|&x| x == 0));
    }

    #[test]
    fn superblock_round_trip_and_corruption() {
        let s = sb();
        let mut b = s.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), s);
        b[40] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(FormatError::BadSuperblockChecksum { .. })
        ));
        b[0] = b'X';
        assert!(matches!(Superblock::decode(&b), Err(FormatError::BadMagic)));
    }

    #[test]
    fn lost_ranges_pending_is_version_4_with_or_without_checksums() {
        for sums in [false, true] {
            let mut s = Superblock {
                data_checksums: sums,
                data_offset: Superblock::data_offset_with(1000, 4096, sums),
                lost_pending: true,
                ..sb()
            };
            s.version = s.current_version();
            assert_eq!(s.version, VERSION_LOST);
            let got = Superblock::decode(&s.encode()).unwrap();
            assert_eq!(got, s);
            s.lost_pending = false;
            assert_eq!(
                s.current_version(),
                if sums { VERSION_SUMS } else { VERSION }
            );
            // Listed ranges without the list's flag: a damaged or foreign superblock.
            let bad = Superblock {
                lost_pending: true,
                lost_list: false,
                version: VERSION_LOST,
                ..s.clone()
            };
            assert!(Superblock::decode(&bad.encode()).is_err());
        }
    }

    #[test]
    fn superblock_with_data_checksums_is_version_3() {
        let s = Superblock {
            version: VERSION_SUMS,
            data_checksums: true,
            data_offset: Superblock::data_offset_with(1000, 4096, true),
            ..sb()
        };
        assert_eq!(s.current_version(), VERSION_SUMS);
        let mut b = s.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), s);
        // The region does not fit below a data offset laid out without it.
        let small = Superblock {
            data_offset: Superblock::data_offset_for(100_000, 4096),
            capacity_lines: 100_000,
            ..s.clone()
        };
        assert!(Superblock::decode(&small.encode()).is_err());
        // A version 2 superblock ignores the byte; a version 3 one must set it.
        b[46] = 0;
        let crc0 = crc32c::crc32c(&b[..SECTOR0_CRC]);
        b[SECTOR0_CRC..SECTOR0_CRC + 4].copy_from_slice(&crc0.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        assert!(Superblock::decode(&b).is_err());
    }

    #[test]
    fn superblock_rewrite_torn_between_sectors_is_old_or_new() {
        let old = sb();
        let new = Superblock {
            clean: false,
            generation: 10,
            ..sb()
        };
        let (a, b) = (old.encode(), new.encode());
        for first_sectors in 0..=8 {
            let mut t = a.clone();
            t[..first_sectors * 512].copy_from_slice(&b[..first_sectors * 512]);
            let got = Superblock::decode(&t).unwrap();
            assert_eq!(
                got,
                if first_sectors == 0 {
                    old.clone()
                } else {
                    new.clone()
                }
            );
            // And the reverse order of sector writes.
            let mut t = b.clone();
            t[..first_sectors * 512].copy_from_slice(&a[..first_sectors * 512]);
            let got = Superblock::decode(&t).unwrap();
            assert_eq!(
                got,
                if first_sectors == 0 {
                    new.clone()
                } else {
                    old.clone()
                }
            );
        }
    }

    #[test]
    fn record_round_trip_and_corruption() {
        let r = Record {
            key: 42,
            valid: 0xff,
            dirty: 0x0f,
            seq: 3,
        };
        let mut b = [0u8; 32];
        r.encode(&mut b);
        assert_eq!(Record::decode(&b), Some(r));
        assert!(!Record::in_flux(&b));
        r.encode_flagged(&mut b, true);
        assert_eq!(
            Record::decode(&b),
            Some(r),
            "the flag is not part of the key"
        );
        assert!(Record::in_flux(&b));
        Record::EMPTY.encode_flagged(&mut b, true);
        assert!(!Record::in_flux(&b) && Record::decode(&b) == Some(Record::EMPTY));
        r.encode(&mut b);
        b[9] ^= 0x10;
        assert_eq!(Record::decode(&b), None);
        assert_eq!(Record::decode(&[0u8; 32]), None, "zeroes are not a record");
    }

    fn pool_block() -> PoolBlock {
        PoolBlock {
            pool: [3; 16],
            generation: 4,
            index: 1,
            dirty_copies: 1,
            members: (0..3u8)
                .map(|i| PoolEntry {
                    uuid: [10 + i; 16],
                    lines: 128 * (i as u64 + 1),
                    state: MemberState::Active,
                    may_dirty: i == 1,
                    may_single: i == 2,
                })
                .collect(),
        }
    }

    #[test]
    fn pool_block_round_trip_crc_and_newest_generation() {
        let p = pool_block();
        let b = p.encode();
        assert_eq!(PoolBlock::decode(&b).unwrap(), p);
        // Torn (a later sector from an older block) or garbled: refused by the crc.
        let older = PoolBlock {
            generation: 3,
            members: p.members[..2].to_vec(),
            ..p.clone()
        }
        .encode();
        let mut garbled = b.clone();
        garbled[POOL_ENTRY_AT + 17] ^= 4;
        let mut torn = b.clone();
        torn[..512].copy_from_slice(&older[..512]);
        for (what, x) in [("garbled", &garbled), ("torn", &torn)] {
            let e = PoolBlock::decode(x).unwrap_err();
            assert!(e.contains("checksum"), "{what}: {e}");
        }
        assert!(PoolBlock::decode(&[0u8; 4096])
            .unwrap_err()
            .contains("magic"));
        // Newest generation wins, the first of equals.
        let a = PoolBlock::decode(&older).unwrap();
        let c = PoolBlock {
            generation: 4,
            index: 0,
            ..p.clone()
        };
        assert_eq!(PoolBlock::newest(&[&a, &p, &c]), Some(1));
        assert_eq!(PoolBlock::newest(&[&c, &a]), Some(0));
        assert_eq!(PoolBlock::newest(&[]), None);
    }

    /// A block of a build that does not keep the dirty flags (byte 41 clear): every member
    /// may hold dirty lines, whatever its entry byte says (so a missing member of such a
    /// pool is never taken as clean).
    #[test]
    fn pool_block_without_kept_dirty_flags_says_every_member_may_be_dirty() {
        let p = pool_block();
        assert_eq!(
            p.members.iter().map(|m| m.may_dirty).collect::<Vec<_>>(),
            vec![false, true, false]
        );
        let mut b = p.encode();
        b[41] = 0;
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        let old = PoolBlock::decode(&b).unwrap();
        assert!(old.members.iter().all(|m| m.may_dirty), "{old:?}");
        b[POOL_ENTRY_AT + 25] = 7;
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        assert!(PoolBlock::decode(&b).unwrap_err().contains("flags"));
    }

    /// The single-copy flags (entry byte 26) round-trip; a block without byte 41 bit 1 (a
    /// build before them, which left byte 26 zero) says every member may hold single-copy
    /// dirty lines, so its missing member is never taken as mirrored.
    #[test]
    fn pool_block_without_kept_single_flags_says_every_member_may_be_single() {
        let p = pool_block();
        let b = p.encode();
        assert_eq!(
            PoolBlock::decode(&b)
                .unwrap()
                .members
                .iter()
                .map(|m| m.may_single)
                .collect::<Vec<_>>(),
            vec![false, false, true]
        );
        let mut b = b;
        let reseal = |b: &mut Vec<u8>| {
            let crc = crc32c::crc32c(&b[..4092]);
            b[4092..].copy_from_slice(&crc.to_le_bytes());
        };
        b[41] = DIRTY_FLAGS_KEPT;
        for d in 0..3 {
            b[POOL_ENTRY_AT + d * POOL_ENTRY_BYTES + 26] = 0;
        }
        reseal(&mut b);
        let old = PoolBlock::decode(&b).unwrap();
        assert!(old.members.iter().all(|m| m.may_single), "{old:?}");
        assert!(old.members[1].may_dirty);
        assert!(!old.members[0].may_dirty, "dirty flags still kept");
        b[POOL_ENTRY_AT + 26] = 5;
        reseal(&mut b);
        assert!(PoolBlock::decode(&b)
            .unwrap_err()
            .contains("single-copy flags"));
    }

    #[test]
    fn copy_records_round_trip_only_in_version_6_and_under_the_crc() {
        let key = 3u64 << 48 | 77;
        let c = Record::copy(key, 0xdead_beef, 0b1010, 41);
        let mut b = [0u8; 32];
        for flux in [false, true] {
            c.encode_flagged(&mut b, flux);
            let d = Record::decode_in(&b, VERSION_POOL, 300).unwrap().unwrap();
            assert_eq!(d, c);
            assert!(d.is_copy() && Record::in_flux(&b) == flux);
            assert_eq!(d.copy_of_slot(), Some(0xdead_beef));
            assert_eq!((d.line_key(), d.sectors(), d.dirty), (key, 0b1010, 0b1010));
        }
        // A primary is no copy; its key and sectors are as stored.
        let p = Record {
            key,
            valid: 0xff,
            dirty: 0b1010,
            seq: 40,
        };
        assert!(!p.is_copy() && p.copy_of_slot().is_none());
        assert_eq!((p.line_key(), p.sectors()), (key, 0xff));
        assert!(!Record::EMPTY.is_copy() && Record::EMPTY.line_key() == EMPTY_KEY);
        // The copy bit and the primary's slot are under the checksum: one flipped bit of
        // either and the record fails it.
        c.encode(&mut b);
        for bit in [62usize, 64, 64 + 31] {
            let mut x = b;
            x[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Record::decode(&x), None, "bit {bit}");
            assert_eq!(Record::decode_in(&x, VERSION_POOL, 0), Ok(None));
        }
        // Versions before pools never carry it: refused, naming the slot and its page.
        for v in MIN_VERSION..VERSION_POOL {
            let e = Record::decode_in(&b, v, 300).unwrap_err();
            assert!(
                e.contains("slot 300") && e.contains("record page 2") && e.contains("copy bit"),
                "{e}"
            );
            // Other records still decode there.
            p.encode(&mut b);
            assert_eq!(Record::decode_in(&b, v, 300), Ok(Some(p)));
            c.encode(&mut b);
        }
        // Malformed copies: reserved bytes set, no dirty sector.
        for bad in [
            Record {
                valid: 1 << 40 | 5,
                ..c
            },
            Record { dirty: 0, ..c },
        ] {
            bad.encode(&mut b);
            let e = Record::decode_in(&b, VERSION_POOL, 9).unwrap_err();
            assert!(e.contains("malformed"), "{e}");
        }
    }

    #[test]
    #[should_panic(expected = "no flag bits")]
    fn copy_record_of_a_flagged_key_panics() {
        Record::copy(COPY | 5, 1, 1, 1);
    }

    #[test]
    fn pool_block_with_two_copies_is_block_version_2() {
        let one = pool_block();
        let b = one.encode();
        assert_eq!(&b[8..12], &1u32.to_le_bytes());
        let two = PoolBlock {
            dirty_copies: 2,
            ..one.clone()
        };
        let b = two.encode();
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        assert_eq!(PoolBlock::decode(&b).unwrap(), two);
        // A block whose version and copies disagree (crc fixed up) is refused by name.
        for (ver, copies) in [(1u32, 2u8), (2, 1), (2, 0)] {
            let mut x = b.clone();
            x[8..12].copy_from_slice(&ver.to_le_bytes());
            x[40] = copies;
            let crc = crc32c::crc32c(&x[..4092]);
            x[4092..].copy_from_slice(&crc.to_le_bytes());
            let e = PoolBlock::decode(&x).unwrap_err();
            assert!(e.contains("dirty copies"), "{ver} {copies}: {e}");
        }
        let mut x = b.clone();
        x[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&x[..4092]);
        x[4092..].copy_from_slice(&crc.to_le_bytes());
        assert!(PoolBlock::decode(&x).unwrap_err().contains("not supported"));
    }

    #[test]
    fn pool_member_superblock_is_version_6_and_refused_alone() {
        for vols in [false, true] {
            let lines = 1024;
            let s = Superblock {
                version: VERSION_POOL,
                capacity_lines: lines,
                data_offset: Superblock::member_data_offset(lines, 4096),
                lost_pending: vols,
                volumes: if vols {
                    vec![VolumeEntry {
                        id: 0,
                        name: "db".into(),
                        size: 1 << 30,
                        identity: BackingIdentity::nbd("nbd://host/db"),
                        flags: 0,
                    }]
                } else {
                    Vec::new()
                },
                ..sb()
            };
            let b = s.encode();
            assert_eq!(&b[72..80], &POOL_META_OFFSET.to_le_bytes());
            assert_eq!(Superblock::decode_member(&b).unwrap(), s);
            assert!(matches!(
                Superblock::decode(&b),
                Err(FormatError::PoolMember)
            ));
            assert_eq!(
                s.lost_list_offset(),
                Some(s.data_offset - crate::lost_list::BYTES)
            );
            assert!(s.lost_list_offset().unwrap() >= Superblock::member_meta_end(lines));
        }
        // A cache formatted alone is not a member.
        let e = Superblock::decode_member(&sb().encode())
            .unwrap_err()
            .to_string();
        assert!(e.contains("formatted alone"), "{e}");
        // Member layout: fits the device, one more line does not.
        for bytes in [8u64 << 20, (100 << 20) + 777] {
            let n = Superblock::member_lines_for_device(bytes, 4096);
            assert!(Superblock::member_data_offset(n, 4096) + n * 4096 <= bytes);
            assert!(Superblock::member_data_offset(n + 1, 4096) + (n + 1) * 4096 > bytes);
        }
    }

    #[test]
    fn layout_fits_device() {
        for bytes in [8u64 << 20, 100 << 20, (1 << 30) + 12345] {
            for ls in [4096u64, 65536, 1 << 20] {
                let n = Superblock::lines_for_device(bytes, ls);
                let end = Superblock::data_offset_for(n, ls) + n * ls;
                assert!(end <= bytes, "{bytes} {ls}: {n} lines end at {end}");
                let n1 = n + 1;
                assert!(Superblock::data_offset_for(n1, ls) + n1 * ls > bytes);
            }
        }
        assert!(seq_newer(1, u32::MAX) && !seq_newer(5, 6));
    }
}
