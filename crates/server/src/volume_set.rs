//! Several backing devices behind one cache (`serve --volume NAME=BACKING`, issue 15 item 1):
//! one [`BlockDev`] whose address space holds every volume, volume `v`'s byte `o` at
//! `v << VOL_SHIFT | o` ([`vaddr`]). The engine keys lines by `volume << 48 | line`; the direct
//! layout turns each plan step's `(vol, hdd)` into this address once, when it copies the
//! plan out of the engine, so every backing range it keeps (unsynced writes, write-backs in
//! flight, lost ranges) names its volume without a field of its own. Volume 0's addresses
//! are its own byte offsets: a one-volume cache (`--backing`) is unchanged.
//!
//! A volume must be smaller than `2^48` bytes (256 TiB); a request never spans two volumes.

use crate::dev::BlockDev;
use crate::identity::BackingIdentity;
use std::io;
use std::sync::{Arc, RwLock};
use tiercache_engine::Mode;

/// Bits of a backing address below the volume id.
pub const VOL_SHIFT: u32 = 48;
/// The byte offset within its volume of a backing address.
pub const VOL_MASK: u64 = (1 << VOL_SHIFT) - 1;

/// The backing address of byte `off` of volume `vol`.
#[inline]
pub fn vaddr(vol: u32, off: u64) -> u64 {
    debug_assert!(
        off <= VOL_MASK,
        "offset {off} beyond a volume's address range"
    );
    (vol as u64) << VOL_SHIFT | off
}

/// The volume of a backing address.
#[inline]
pub fn vol_of(addr: u64) -> u32 {
    (addr >> VOL_SHIFT) as u32
}

/// How a backing range `[a, b)` (pool addresses of one volume, see [`vaddr`]) is named in
/// logs, errors and reports: `volume NAME: bytes X..Y` with offsets within the volume, or
/// `volume bytes X..Y` on a cache of one volume (`name` `None`, volume 0). A volume whose
/// name is not known is named by its id. Never the raw `v << 48 | off` address.
pub fn range_text(name: Option<&str>, a: u64, b: u64) -> String {
    let v = vol_of(a);
    let base = (v as u64) << VOL_SHIFT;
    let (x, y) = (a - base, b.saturating_sub(base));
    match name {
        Some(n) => format!("volume {n}: bytes {x}..{y}"),
        None if v == 0 => format!("volume bytes {x}..{y}"),
        None => format!("volume id {v}: bytes {x}..{y}"),
    }
}

/// The name of volume `v` among `vols` (`None`: a cache of one volume, `vols` empty).
pub fn name_of(vols: &[VolumeSpec], v: u32) -> Option<&str> {
    vols.iter().find(|s| s.id == v).map(|s| s.name.as_str())
}

/// Ranges (pool addresses) named within their volumes ([`range_text`]), comma-separated.
pub fn ranges_text(vols: &[VolumeSpec], ranges: &[(u64, u64)]) -> String {
    ranges
        .iter()
        .map(|&(a, b)| range_text(name_of(vols, vol_of(a)), a, b))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A lost range as JSON reports give it (`ctl stats --json` `lost_dirty_ranges`, `check
/// --json` `lost_list`): on a cache of one volume the `[start, end]` pair of byte offsets it
/// always was; on a cache of several volumes an object naming the volume, with offsets
/// within it (never the raw `v << 48 | off` pool address).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum NamedRange {
    Bytes(u64, u64),
    InVolume {
        /// `None`: a volume of the cache's table not served this run (see `volume_id`).
        #[serde(skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
        volume_id: u32,
        start: u64,
        end: u64,
    },
}

/// `ranges` (pool addresses, one volume each) as JSON names them ([`NamedRange`]).
/// `several`: the cache holds several volumes; `name` gives a volume id's name.
pub fn named_ranges<'a>(
    several: bool,
    name: impl Fn(u32) -> Option<&'a str>,
    ranges: &[(u64, u64)],
) -> Vec<NamedRange> {
    ranges
        .iter()
        .map(|&(a, b)| {
            let v = vol_of(a);
            let base = vaddr(v, 0);
            if several {
                NamedRange::InVolume {
                    volume: name(v).map(str::to_string),
                    volume_id: v,
                    start: a - base,
                    end: b.saturating_sub(base),
                }
            } else {
                debug_assert_eq!(v, 0, "a cache of one volume holds volume 0 only");
                NamedRange::Bytes(a, b)
            }
        })
        .collect()
}

/// One volume as the command line gives it (`--volume NAME=BACKING`, `--volume-mode`): its id
/// (from the superblock's volume table by name, a free one for a new volume), size, identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub id: u32,
    pub name: String,
    pub size: u64,
    pub identity: Option<BackingIdentity>,
    /// Its own mode (`--volume-mode NAME=MODE`); `None`: the cache's.
    pub mode: Option<Mode>,
}

/// Volume names: what an NBD export name and a Prometheus label take.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= crate::format::VOLUME_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "volume name {name:?}: use 1 to {} letters, digits, '-', '_' or '.' (it is the NBD export name)",
            crate::format::VOLUME_NAME_BYTES
        ))
    }
}

/// Ids for the volumes named on the command line, in their order: a volume the superblock's
/// table lists keeps its id; a new one takes the lowest id neither listed nor taken. With no
/// table (a new cache, or one formatted for one `--backing`), the first volume is id 0 (the
/// backing device the superblock records) and the others follow. A removed entry
/// ([`crate::format::VolumeEntry::removed`]) keeps its id but not its name.
pub fn assign_ids(table: &[crate::format::VolumeEntry], names: &[String]) -> Vec<u32> {
    let mut taken: Vec<u32> = table.iter().map(|e| e.id).collect();
    names
        .iter()
        .map(
            |n| match table.iter().find(|e| &e.name == n && !e.removed()) {
                Some(e) => e.id,
                None => {
                    let id = (0..).find(|i| !taken.contains(i)).unwrap();
                    taken.push(id);
                    id
                }
            },
        )
        .collect()
}

/// The backing devices of several volumes as one device (see the module doc). Volumes are
/// added and removed while it serves ([`VolumeSlots`], `ctl volume add|remove`).
pub struct VolumeSet {
    slots: VolumeSlots,
}

/// By volume id: the device and name of each volume served (`None`: not served, its
/// addresses fail).
type Devs = Vec<Option<(Arc<dyn BlockDev>, String)>>;

/// The volumes of a [`VolumeSet`], shared with whoever adds and removes volumes while it
/// serves (the device is boxed into the cache volume; this handle stays with the server).
#[derive(Clone)]
pub struct VolumeSlots(Arc<RwLock<Devs>>);

impl VolumeSlots {
    /// Serves `dev` as volume `id` from now on. Refuses an id served, and a device too
    /// large to address.
    pub fn add(&self, id: u32, name: &str, dev: Box<dyn BlockDev>) -> Result<(), String> {
        if dev.size() > VOL_MASK {
            return Err(format!(
                "volume {name}: {} bytes; a volume holds at most {VOL_MASK} bytes",
                dev.size()
            ));
        }
        let mut devs = self.0.write().unwrap();
        if devs.len() <= id as usize {
            devs.resize_with(id as usize + 1, || None);
        }
        if devs[id as usize].is_some() {
            return Err(format!("volume {name}: id {id} given twice"));
        }
        devs[id as usize] = Some((Arc::from(dev), name.to_string()));
        Ok(())
    }

    /// Stops serving volume `id`: its addresses fail from now on (I/O in progress on its
    /// device ends as it would). Returns whether it was served.
    pub fn remove(&self, id: u32) -> bool {
        let mut devs = self.0.write().unwrap();
        devs.get_mut(id as usize).and_then(Option::take).is_some()
    }
}

impl VolumeSet {
    /// `vols`: (id, name, device). Refuses a repeated id and a device too large to address.
    pub fn new(vols: Vec<(u32, String, Box<dyn BlockDev>)>) -> Result<VolumeSet, String> {
        let slots = VolumeSlots(Arc::new(RwLock::new(Vec::new())));
        for (id, name, dev) in vols {
            slots.add(id, &name, dev)?;
        }
        Ok(VolumeSet { slots })
    }

    /// The handle that adds and removes volumes while the set serves.
    pub fn slots(&self) -> VolumeSlots {
        self.slots.clone()
    }

    /// The device of volume `id` (a clone of its handle: no lock is held during I/O).
    fn get(&self, v: u32) -> Option<Arc<dyn BlockDev>> {
        let devs = self.slots.0.read().unwrap();
        devs.get(v as usize)?.as_ref().map(|d| Arc::clone(&d.0))
    }

    fn dev(&self, addr: u64) -> io::Result<Arc<dyn BlockDev>> {
        let v = vol_of(addr);
        self.get(v).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "volume id {v} is not served this run (not given with --volume, or removed): byte {} of it",
                    addr & VOL_MASK
                ),
            )
        })
    }
}

impl BlockDev for VolumeSet {
    /// Volume 0's size (0 when it is not served): what one-volume code paths take.
    fn size(&self) -> u64 {
        self.get(0).map_or(0, |d| d.size())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        debug_assert_eq!(
            vol_of(offset),
            vol_of(offset + (buf.len() as u64).max(1) - 1)
        );
        self.dev(offset)?.read_at(buf, offset & VOL_MASK)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        debug_assert_eq!(
            vol_of(offset),
            vol_of(offset + (data.len() as u64).max(1) - 1)
        );
        self.dev(offset)?.write_at(data, offset & VOL_MASK)
    }

    /// Syncs every volume's device (all of them, even after one fails: the first error is
    /// returned, naming its volume).
    fn sync(&self) -> io::Result<()> {
        let mut first = None;
        let devs: Vec<(Arc<dyn BlockDev>, String)> = self
            .slots
            .0
            .read()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        for (d, name) in devs {
            if let Err(e) = d.sync() {
                first.get_or_insert(io::Error::new(e.kind(), format!("volume {name}: {e}")));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Volume 0's identity (the superblock records it as the one-volume cache does; the
    /// volume table records each volume's).
    fn identity(&self) -> Option<BackingIdentity> {
        self.get(0)?.identity()
    }

    fn region_end(&self, offset: u64) -> u64 {
        let base = offset & !VOL_MASK;
        self.dev(offset).map_or(base, |d| base + d.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::VolumeEntry;

    #[test]
    fn ids_follow_the_table_by_name_and_new_volumes_take_free_ids() {
        let e = |id, name: &str| VolumeEntry {
            id,
            name: name.into(),
            size: 1,
            identity: BackingIdentity::unknown(name),
            flags: 0,
        };
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(assign_ids(&[], &names(&["a", "b"])), vec![0, 1]);
        let t = [e(0, "a"), e(2, "c")];
        assert_eq!(assign_ids(&t, &names(&["c", "new", "a"])), vec![2, 1, 0]);
        assert_eq!(assign_ids(&t, &names(&["x", "y"])), vec![1, 3]);
        // A removed volume's name is free again (a new id); its id stays taken.
        let gone = VolumeEntry {
            flags: crate::format::VOLUME_REMOVED,
            ..e(1, "b")
        };
        let t = [e(0, "a"), gone];
        assert_eq!(assign_ids(&t, &names(&["b", "a"])), vec![2, 0]);
        assert!(check_name("db-1.x_y").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"n".repeat(64)).is_err());
    }

    #[test]
    fn json_ranges_are_pairs_on_one_volume_and_named_objects_on_several() {
        let one = named_ranges(false, |_| None, &[(4096, 8192)]);
        assert_eq!(serde_json::to_string(&one).unwrap(), "[[4096,8192]]");
        let names = |v: u32| ["a", "b"].get(v as usize).copied();
        let several = named_ranges(
            true,
            names,
            &[
                (0, 512),
                (vaddr(1, 1 << 20), vaddr(1, (1 << 20) + 512)),
                (vaddr(5, 0), vaddr(5, 9)),
            ],
        );
        assert_eq!(
            serde_json::to_value(&several).unwrap(),
            serde_json::json!([
                {"volume": "a", "volume_id": 0, "start": 0, "end": 512},
                {"volume": "b", "volume_id": 1, "start": 1048576, "end": 1049088},
                {"volume_id": 5, "start": 0, "end": 9},
            ])
        );
    }

    #[test]
    fn ranges_are_named_within_their_volume() {
        assert_eq!(range_text(None, 4096, 8192), "volume bytes 4096..8192");
        assert_eq!(
            range_text(Some("db"), vaddr(2, 512), vaddr(2, 1024)),
            "volume db: bytes 512..1024"
        );
        assert_eq!(
            range_text(Some("a"), vaddr(0, 0), vaddr(0, 4096)),
            "volume a: bytes 0..4096"
        );
        assert_eq!(
            range_text(None, vaddr(3, 0), vaddr(3, 7)),
            "volume id 3: bytes 0..7"
        );
    }
}
