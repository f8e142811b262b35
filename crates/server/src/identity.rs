//! Which backing device a cache belongs to.
//!
//! A cache holds a copy of part of one backing device (and, in write-back, data that device
//! does not have yet): attached to another device it would serve that device's reader the
//! first one's bytes and write them back over it. So the superblock records the backing
//! device's identity at format time and `open` compares it with the device it is given:
//! * a **block device** is known by a stable id that survives renames (`/dev/sdb` becoming
//!   `/dev/sdc`): its WWID (`/sys/dev/block/M:m/device/wwid`, or `.../wwid`, `.../dm/uuid`,
//!   `.../device/serial`; a loop device: its backing file), else its `/dev/disk/by-id` name;
//!   a partition adds `-partN`;
//! * a **regular file** by its canonical path (its device and inode number would change with
//!   a copy or a restore from backup, which is the same volume; its path does not);
//! * an **NBD export** by its URI (which names the export).
//!
//! The size is checked separately (`backing_size`). A device recorded before identities
//! existed (format version 1), or formatted without one, has an `Unknown` identity: it is
//! accepted with a warning and recorded at the next superblock write.
//!
//! On disk (both layouts, inside the superblock's first sector, [`ID_BYTES`] bytes):
//! `name [256] | kind u8 | pad [3] | name_hash u64 | stable_id [112]`: the name (truncated to
//! 256 bytes, NUL padded), what kind of device, the first 8 bytes of the BLAKE3 of the whole
//! name (so names differing past 256 bytes still differ) and the stable id (truncated).

use std::io;
use std::path::Path;

/// Bytes an identity takes in a superblock.
pub const ID_BYTES: usize = NAME_BYTES + 12 + STABLE_BYTES;
const NAME_BYTES: usize = 256;
const STABLE_BYTES: usize = 112;

/// What kind of device the backing device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum IdKind {
    /// Not recorded (a version-1 superblock, or formatted by a caller that did not say).
    Unknown = 0,
    File = 1,
    Block = 2,
    Nbd = 3,
}

/// A backing device's identity.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackingIdentity {
    pub kind: IdKind,
    /// Canonical path or NBD URI (possibly truncated when decoded; see `name_hash`).
    pub name: String,
    /// First 8 bytes of the BLAKE3 of the full name.
    pub name_hash: u64,
    /// Block devices: WWID, serial or /dev/disk/by-id name (empty: none found).
    pub stable_id: String,
}

impl Default for BackingIdentity {
    fn default() -> Self {
        Self::unknown("")
    }
}

fn hash(name: &str) -> u64 {
    u64::from_le_bytes(
        blake3::hash(name.as_bytes()).as_bytes()[..8]
            .try_into()
            .unwrap(),
    )
}

fn put_str(dst: &mut [u8], s: &str) {
    // Truncate at a character boundary so the stored prefix decodes as it was.
    let mut n = s.len().min(dst.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
    dst[n..].fill(0);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn read_trim(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

impl BackingIdentity {
    /// No identity recorded; `name` is kept for messages (a version-1 superblock's path).
    pub fn unknown(name: &str) -> Self {
        BackingIdentity {
            kind: IdKind::Unknown,
            name: name.to_string(),
            name_hash: 0,
            stable_id: String::new(),
        }
    }

    /// An NBD export, by its URI.
    pub fn nbd(uri: &str) -> Self {
        BackingIdentity {
            kind: IdKind::Nbd,
            name: uri.to_string(),
            name_hash: hash(uri),
            stable_id: String::new(),
        }
    }

    /// A file or block device by path: canonical path, and for a block device a stable id.
    pub fn of_path(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        use std::os::unix::fs::MetadataExt;
        let canon = std::fs::canonicalize(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let name = canon.to_string_lossy().into_owned();
        let md = std::fs::metadata(&canon)?;
        if !md.file_type().is_block_device() {
            return Ok(BackingIdentity {
                kind: IdKind::File,
                name_hash: hash(&name),
                name,
                stable_id: String::new(),
            });
        }
        let stable_id = block_stable_id(&canon, md.rdev()).unwrap_or_default();
        Ok(BackingIdentity {
            kind: IdKind::Block,
            name_hash: hash(&name),
            name,
            stable_id,
        })
    }

    pub fn is_unknown(&self) -> bool {
        self.kind == IdKind::Unknown
    }

    /// `name (stable id)`, for messages.
    pub fn describe(&self) -> String {
        let mut s = if self.name.is_empty() {
            "an unrecorded device".to_string()
        } else {
            self.name.clone()
        };
        if !self.stable_id.is_empty() {
            s.push_str(&format!(" (id {})", self.stable_id));
        }
        s
    }

    /// Whether `other` is the same device as `self` (both known). Block devices with stable
    /// ids on both sides compare by id only (a renamed node is the same disk); otherwise kind
    /// and full name (by hash; a decoded name may be truncated) must agree.
    pub fn same_device(&self, other: &BackingIdentity) -> bool {
        if self.kind != other.kind {
            return false;
        }
        if !self.stable_id.is_empty() && !other.stable_id.is_empty() {
            return self.stable_id == other.stable_id;
        }
        self.name_hash == other.name_hash && (self.name == other.name || truncated(self, other))
    }

    pub fn encode_into(&self, b: &mut [u8]) {
        assert!(b.len() >= ID_BYTES, "identity field too small");
        put_str(&mut b[..NAME_BYTES], &self.name);
        b[NAME_BYTES] = self.kind as u8;
        b[NAME_BYTES + 1..NAME_BYTES + 4].fill(0);
        b[NAME_BYTES + 4..NAME_BYTES + 12].copy_from_slice(&self.name_hash.to_le_bytes());
        put_str(&mut b[NAME_BYTES + 12..ID_BYTES], &self.stable_id);
    }

    /// Decodes an identity; an unknown kind byte is an error (a newer format).
    pub fn decode_from(b: &[u8]) -> Result<Self, String> {
        let kind = match b[NAME_BYTES] {
            0 => IdKind::Unknown,
            1 => IdKind::File,
            2 => IdKind::Block,
            3 => IdKind::Nbd,
            k => return Err(format!("unknown backing identity kind {k}")),
        };
        Ok(BackingIdentity {
            kind,
            name: get_str(&b[..NAME_BYTES]),
            name_hash: u64::from_le_bytes(b[NAME_BYTES + 4..NAME_BYTES + 12].try_into().unwrap()),
            stable_id: get_str(&b[NAME_BYTES + 12..ID_BYTES]),
        })
    }
}

/// Compares the identity a superblock recorded with the device given.
/// `Ok(note)`: the caller records `given` (a note for the log when that is more than a plain
/// match: an unrecorded identity trusted, a renamed block device with the same stable id, a
/// rename accepted by `accept_rename`). `Err((recorded, given))`: another device, described.
pub fn verify(
    recorded: &BackingIdentity,
    given: &BackingIdentity,
    accept_rename: bool,
) -> Result<Option<String>, (String, String)> {
    let note = if recorded.is_unknown() {
        Some(format!(
            "the cache recorded no backing identity (a version-1 format, or formatted without one{}): trusting {} and recording it",
            if recorded.name.is_empty() {
                String::new()
            } else {
                format!(", formatted for {:?}", recorded.name)
            },
            given.describe()
        ))
    } else if recorded.same_device(given) {
        (recorded.name_hash != given.name_hash).then(|| {
            format!(
                "backing device {} is {} renamed (same id); recording the new name",
                given.describe(),
                recorded.name
            )
        })
    } else if accept_rename {
        Some(format!(
            "backing device {} accepted in place of {} (--accept-backing-rename); recording it",
            given.describe(),
            recorded.describe()
        ))
    } else {
        return Err((recorded.describe(), given.describe()));
    };
    if let Some(n) = &note {
        tracing::warn!("{n}");
    }
    Ok(note)
}

/// Clean lines compared with the backing device at every open (both layouts): at least 64
/// (all of them if fewer), spread over the volume, at most 64 MiB of them.
pub fn sample_size(line_size: u64) -> usize {
    ((64u64 << 20) / line_size).clamp(64, 256) as usize
}

/// One of the names is the other truncated to the stored length (same hash already checked).
fn truncated(a: &BackingIdentity, b: &BackingIdentity) -> bool {
    let (short, long) = if a.name.len() <= b.name.len() {
        (&a.name, &b.name)
    } else {
        (&b.name, &a.name)
    };
    short.len() >= NAME_BYTES - 3 && long.starts_with(short.as_str())
}

/// A block device's stable id: WWID / dm uuid / serial from sysfs, else a /dev/disk/by-id
/// name; a partition is its disk's id and `-partN`.
fn block_stable_id(canon: &Path, rdev: u64) -> Option<String> {
    let (major, minor) = (
        ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff),
        (rdev & 0xff) | ((rdev >> 12) & !0xff),
    );
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok();
    if let Some(sys) = &sys {
        let whole = |d: &Path| {
            ["device/wwid", "wwid", "dm/uuid", "device/serial"]
                .iter()
                .find_map(|f| read_trim(&d.join(f)))
                .or_else(|| read_trim(&d.join("loop/backing_file")).map(|f| format!("loop:{f}")))
        };
        if let Some(part) = read_trim(&sys.join("partition")) {
            if let Some(id) = sys.parent().and_then(whole) {
                return Some(format!("{id}-part{part}"));
            }
        } else if let Some(id) = whole(sys) {
            return Some(id);
        }
    }
    // /dev/disk/by-id: prefer wwn-* names, then the first in order.
    let mut names: Vec<String> = std::fs::read_dir("/dev/disk/by-id")
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::canonicalize(e.path()).ok().as_deref() == Some(canon))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_key(|n| (!n.starts_with("wwn-"), n.clone()));
    names.into_iter().next().map(|n| format!("by-id/{n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_comparison() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        let b = dir.path().join("b.img");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let ia = BackingIdentity::of_path(&a).unwrap();
        // Another spelling of the same path is the same file.
        let ia2 = BackingIdentity::of_path(&dir.path().join(".").join("a.img")).unwrap();
        assert_eq!(ia.kind, IdKind::File);
        assert!(ia.same_device(&ia2));
        assert!(!ia.same_device(&BackingIdentity::of_path(&b).unwrap()));
        let mut buf = vec![0u8; ID_BYTES];
        ia.encode_into(&mut buf);
        assert_eq!(BackingIdentity::decode_from(&buf).unwrap(), ia);
        // Long names: stored truncated, still equal to themselves and unequal to a sibling.
        let long = format!("nbd+unix:///{}?socket=/x", "e".repeat(400));
        let other = format!("nbd+unix:///{}?socket=/y", "e".repeat(400));
        let (l, o) = (BackingIdentity::nbd(&long), BackingIdentity::nbd(&other));
        l.encode_into(&mut buf);
        let back = BackingIdentity::decode_from(&buf).unwrap();
        assert!(back.same_device(&l) && l.same_device(&back));
        assert!(!back.same_device(&o));
        // Stable ids decide for block devices, whatever the node is called.
        let blk = |name: &str, id: &str| BackingIdentity {
            kind: IdKind::Block,
            name: name.into(),
            name_hash: hash(name),
            stable_id: id.into(),
        };
        assert!(blk("/dev/sdb", "naa.5000c5").same_device(&blk("/dev/sdc", "naa.5000c5")));
        assert!(!blk("/dev/sdb", "naa.5000c5").same_device(&blk("/dev/sdb", "naa.5000c6")));
        assert_eq!(
            BackingIdentity::decode_from(&[0u8; ID_BYTES]).unwrap().kind,
            IdKind::Unknown
        );
    }
}
