//! Several volumes behind one cache (`serve --volume NAME=BACKING`, issue 15 item 1): the
//! superblock's volume table checked against the volumes given at open, and each volume's
//! NBD requests (`crate::live::VolumeExport`) stamped with its id.
//!
//! At open, each volume given is matched with the table by name: its recorded size and
//! backing identity must match (a swapped disk is refused, naming the volume); a new volume
//! takes a free id. A volume of the table not given this run is not served: if any of its
//! lines is dirty (or in flux in write-back, which may turn dirty) the open is refused,
//! naming it; its clean lines are dropped on the device before the restore (the backing
//! device may change while it is not served, and a later run must not serve stale copies).

use super::*;
use crate::format::{VolumeEntry, MAX_TABLE_VOLUMES};
use crate::volume_set::VolumeSpec;
use tiercache_engine::VolumeConfig;

/// Checks `opts.volumes` against `sb`'s volume table and updates the table (new volumes,
/// identities renamed with `--accept-backing-rename`, volume 0's identity in `sb.backing`);
/// drops the clean lines of volumes not given. Returns the engine's volume table.
pub(super) fn reconcile(
    sb: &mut Superblock,
    cache: &dyn BlockDev,
    opts: &OpenOptions,
) -> Result<Vec<VolumeConfig>, FormatError> {
    let err = |v: &str, why: String| FormatError::Volume {
        volume: v.to_string(),
        why,
    };
    let mut table = sb.volumes.clone();
    if table.is_empty() {
        // A new cache, or one formatted for one `--backing`: that device is volume 0.
        let Some(v0) = opts.volumes.iter().find(|v| v.id == 0) else {
            return Err(err(
                "?",
                "the cache has no volume table, so its one volume is id 0: the first --volume"
                    .into(),
            ));
        };
        table.push(VolumeEntry {
            id: 0,
            name: v0.name.clone(),
            size: sb.backing_size,
            identity: sb.backing.clone(),
        });
    }
    let mut out = Vec::new();
    for v in &opts.volumes {
        crate::volume_set::check_name(&v.name).map_err(|e| err(&v.name, e))?;
        match table.iter_mut().find(|e| e.id == v.id) {
            Some(e) => {
                if e.name != v.name {
                    return Err(err(
                        &v.name,
                        format!(
                            "id {} belongs to volume {} in the cache's table",
                            v.id, e.name
                        ),
                    ));
                }
                if e.size != v.size {
                    return Err(err(
                        &v.name,
                        format!(
                            "the cache recorded a backing device of {} bytes for it, the one given has {} bytes: give this volume's own device (a resized device needs the cache flushed and the volume given a new name)",
                            e.size, v.size
                        ),
                    ));
                }
                if let Some(given) = &v.identity {
                    crate::identity::verify(&e.identity, given, opts.accept_backing_rename)
                        .map_err(|(recorded, given)| {
                            err(
                                &v.name,
                                format!(
                                    "the cache holds it for backing device {recorded}, but the device given is {given}: a swapped disk would be served the other disk's data and get its dirty lines. Give this volume's own device (--volume {}=DEVICE); the same device under a new name: add --accept-backing-rename",
                                    v.name
                                ),
                            )
                        })?;
                    e.identity = given.clone();
                }
            }
            None => {
                if table.len() >= MAX_TABLE_VOLUMES {
                    return Err(err(
                        &v.name,
                        format!(
                            "the cache's volume table is full ({MAX_TABLE_VOLUMES} volumes): {}",
                            table
                                .iter()
                                .map(|e| e.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
                table.push(VolumeEntry {
                    id: v.id,
                    name: v.name.clone(),
                    size: v.size,
                    identity: v
                        .identity
                        .clone()
                        .unwrap_or_else(|| BackingIdentity::unknown(&v.name)),
                });
            }
        }
        out.push(VolumeConfig {
            mode: v.mode,
            bytes: Some(v.size),
            ..VolumeConfig::new(v.id, v.name.clone())
        });
    }
    let missing: Vec<&VolumeEntry> = table
        .iter()
        .filter(|e| !opts.volumes.iter().any(|v| v.id == e.id))
        .collect();
    if !missing.is_empty() {
        drop_missing(sb, cache, &missing)?;
    }
    table.sort_by_key(|e| e.id);
    if let Some(e) = table.iter().find(|e| e.id == 0) {
        sb.backing = e.identity.clone();
        sb.backing_size = e.size;
    }
    sb.volumes = table;
    Ok(out)
}

/// Refuses the open when a volume not given holds dirty lines (or lines in flux after a
/// write-back crash); drops the clean lines of those volumes on the device (records
/// rewritten empty, synced) so that the restore never takes them.
fn drop_missing(
    sb: &Superblock,
    cache: &dyn BlockDev,
    missing: &[&VolumeEntry],
) -> Result<(), FormatError> {
    let cap = sb.capacity_lines;
    let rb = RECORD_BYTES as usize;
    let per = format::RECORDS_PER_PAGE;
    let write_back = Mode::ALL[sb.mode as usize] == Mode::WriteBack;
    let pages = cap.div_ceil(per);
    let mut dirty = vec![0u64; missing.len()];
    let mut rewrite: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut page = vec![0u8; PAGE as usize];
    for p in 0..pages {
        cache.read_at(&mut page, META_OFFSET + p * PAGE)?;
        let mut changed = false;
        for i in 0..per.min(cap - p * per) as usize {
            let b = &page[i * rb..(i + 1) * rb];
            let Some(r) = Record::decode(b) else { continue };
            if r.key == EMPTY_KEY {
                continue;
            }
            let Some(m) = missing.iter().position(|e| e.id == vol_of(r.key)) else {
                continue;
            };
            if r.dirty != 0 || (write_back && Record::in_flux(b)) {
                dirty[m] += 1;
            } else {
                Record::EMPTY.encode(&mut page[i * rb..(i + 1) * rb]);
                changed = true;
            }
        }
        if changed {
            rewrite.push((p, page.clone()));
        }
    }
    let held: Vec<String> = missing
        .iter()
        .zip(&dirty)
        .filter(|(_, &d)| d > 0)
        .map(|(e, d)| {
            format!(
                "{} ({d} dirty lines, backing {})",
                e.name,
                e.identity.describe()
            )
        })
        .collect();
    if !held.is_empty() {
        return Err(FormatError::Volume {
            volume: held.join(", "),
            why: "not given this run, but the cache holds dirty data of it that its backing device does not have: give it with --volume NAME=DEVICE (its own device) so the data is served and written back".into(),
        });
    }
    for (p, b) in &rewrite {
        cache.write_at(b, META_OFFSET + p * PAGE)?;
    }
    if !rewrite.is_empty() {
        cache.sync()?;
    }
    for e in missing {
        tracing::warn!(
            "volume {} (backing {}) is not served this run: its clean cached lines were dropped",
            e.name,
            e.identity.describe()
        );
    }
    Ok(())
}

impl CacheVolume {
    /// The volumes served (`serve --volume`), in the order given; empty for a one-volume cache.
    pub fn volume_specs(&self) -> &[VolumeSpec] {
        &self.volumes
    }

    /// Per volume (several volumes): its name, id, size, mode and the engine's counters and
    /// occupancy for it (`ctl stats --json` `volumes`, Prometheus `volume="NAME"`).
    pub fn volume_figures(&self) -> Vec<VolumeFigures> {
        if self.volumes.is_empty() {
            return Vec::new();
        }
        let g = self.lock();
        let mode = g.engine.config().mode;
        let stats = g.engine.volume_stats();
        drop(g);
        self.volumes
            .iter()
            .map(|v| {
                let s = stats.iter().find(|s| s.id == v.id);
                VolumeFigures {
                    name: v.name.clone(),
                    id: v.id,
                    size: v.size,
                    mode: s
                        .map_or(v.mode.unwrap_or(mode), |s| s.mode)
                        .as_str()
                        .to_string(),
                    cached_lines: s.map_or(0, |s| s.lines),
                    dirty_lines: s.map_or(0, |s| s.dirty_lines),
                    counters: s.map(|s| s.counters).unwrap_or_default(),
                }
            })
            .collect()
    }
}

/// One volume's figures (see [`CacheVolume::volume_figures`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeFigures {
    pub name: String,
    pub id: u32,
    pub size: u64,
    pub mode: String,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    pub counters: Counters,
}
