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

    /// `ranges` (pool addresses) as JSON reports name them
    /// ([`crate::volume_set::NamedRange`]).
    pub fn named_ranges(&self, ranges: &[(u64, u64)]) -> Vec<crate::volume_set::NamedRange> {
        crate::volume_set::named_ranges(
            !self.volumes.is_empty(),
            |v| crate::volume_set::name_of(&self.volumes, v),
            ranges,
        )
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
        let (failed, lost) = (g.failed, g.lost.clone());
        drop(g);
        self.volumes
            .iter()
            .map(|v| {
                let s = stats.iter().find(|s| s.id == v.id);
                let base = vaddr(v.id, 0);
                VolumeFigures {
                    name: v.name.clone(),
                    id: v.id,
                    size: v.size,
                    backing: v
                        .identity
                        .as_ref()
                        .map_or_else(String::new, |i| i.describe()),
                    // A failed cache passes every volume through, whatever its own mode.
                    mode: if failed {
                        Mode::PassThrough
                    } else {
                        s.map_or(v.mode.unwrap_or(mode), |s| s.mode)
                    }
                    .as_str()
                    .to_string(),
                    cached_lines: s.map_or(0, |s| s.lines),
                    dirty_lines: s.map_or(0, |s| s.dirty_lines),
                    counters: s.map(|s| s.counters).unwrap_or_default(),
                    lost_ranges: lost
                        .iter()
                        .filter(|r| vol_of(r.0) == v.id)
                        .map(|&(a, b)| (a - base, b - base))
                        .collect(),
                }
            })
            .collect()
    }

    /// The volume of id `id` served, or the error naming the volumes.
    fn served(&self, id: u32) -> Result<&VolumeSpec, String> {
        self.volumes.iter().find(|v| v.id == id).ok_or_else(|| {
            format!(
                "no volume of id {id} is served (volumes: {})",
                self.volumes
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// Volume `id`'s value of a per-volume setting ([`tuning::VOLUME_KEYS`]): its own, else
    /// the pool's.
    fn volume_setting(g: &Inner, id: u32, k: &str) -> String {
        let c = g.engine.config();
        let v = c.volumes.iter().find(|v| v.id == id);
        let cut = v.and_then(|v| v.seq_cutoff).unwrap_or(c.seq_cutoff);
        match k {
            // A failed cache passes every volume through, whatever its own mode.
            "mode" if g.failed => Mode::PassThrough.as_str().to_string(),
            "mode" => v
                .and_then(|v| v.mode)
                .unwrap_or(c.mode)
                .as_str()
                .to_string(),
            "admission" => v
                .and_then(|v| v.admission)
                .unwrap_or(c.admission)
                .to_string(),
            "seq-cutoff" => tuning::size_str(cut.read_bytes),
            "seq-cutoff-write" => tuning::size_str(cut.write_bytes),
            _ => unreachable!("{k} is not a per-volume setting"),
        }
    }

    /// `ctl --volume NAME get`: volume `id`'s per-volume settings ([`tuning::VOLUME_KEYS`]).
    pub fn volume_settings(&self, id: u32) -> Result<Vec<(&'static str, String)>, String> {
        self.served(id)?;
        let g = self.lock();
        Ok(tuning::VOLUME_KEYS
            .iter()
            .map(|&k| (k, Self::volume_setting(&g, id, k)))
            .collect())
    }

    /// `ctl --volume NAME set KEY VALUE` (and `mode`, `detach`): changes one of volume
    /// `id`'s own settings for this run (not stored: a restart takes `--volume-mode` and the
    /// pool's settings); returns (old, new). Leaving write-back writes back the dirty lines
    /// first (the cleaner works on the pool: every volume's). A pool-wide key is refused,
    /// naming the per-volume ones.
    pub fn set_volume_setting(
        &self,
        id: u32,
        key: &str,
        value: &str,
    ) -> Result<(String, String), String> {
        let name = self.served(id)?.name.clone();
        let k = tuning::key(key)?;
        if !tuning::VOLUME_KEYS.contains(&k) {
            return Err(format!(
                "{k} is a setting of the pool, shared by every volume (per volume: {}): `ctl set {k} VALUE` without --volume",
                tuning::VOLUME_KEYS.join(", ")
            ));
        }
        // No write-back in flight from here on (its lines would look clean to `clean_all`).
        let _owner = (k == "mode").then(|| self.clean_owner());
        let mut g = self.lock();
        if g.closed {
            return Err(g.closed_reason().into());
        }
        if g.failed {
            return Err("the cache device failed: every volume passes through to its backing device until restarted with a newly formatted cache (`tiercache format --force`)".into());
        }
        let old = Self::volume_setting(&g, id, k);
        let c = g.engine.config().clone();
        let v = c
            .volumes
            .iter()
            .find(|v| v.id == id)
            .cloned()
            .ok_or_else(|| format!("volume {name} is not in the engine's volume table"))?;
        let what = |e: &dyn std::fmt::Display| format!("volume {name}: {k} {value:?}: {e}");
        let mut own = v.clone();
        if k == "mode" {
            let m: Mode = value.parse().map_err(|e: String| what(&e))?;
            if v.mode.unwrap_or(c.mode) == Mode::WriteBack && m != Mode::WriteBack {
                self.clean_all(&mut g).map_err(|e| what(&e))?;
                self.flush_locked(&mut g).map_err(|e| what(&e))?;
            }
            own.mode = Some(m);
        } else {
            // Parsed as the pool's setting is, from the volume's values.
            let mut mine = c.clone();
            mine.admission = v.admission.unwrap_or(c.admission);
            mine.seq_cutoff = v.seq_cutoff.unwrap_or(c.seq_cutoff);
            let t = Tuning::of(&mine).with(k, value)?;
            own.admission = Some(t.admission);
            own.seq_cutoff = Some(tiercache_engine::SeqCutoff {
                read_bytes: t.seq_cutoff_read,
                write_bytes: t.seq_cutoff_write,
            });
            if k == "admission" {
                own.seq_cutoff = v.seq_cutoff;
            } else {
                own.admission = v.admission;
            }
        }
        g.engine
            .retune(|c| {
                if let Some(x) = c.volumes.iter_mut().find(|x| x.id == id) {
                    *x = own;
                }
            })
            .map_err(|e| what(&e))?;
        if k == "mode" {
            // The RAM tier is the pool's: emptied on a mode switch, as the pool's switch does.
            if let Some(r) = &self.ram {
                r.set_mode(c.mode);
            }
        }
        let new = Self::volume_setting(&g, id, k);
        drop(g);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: tuning::LOG_TARGET,
            "setting of volume {name} (this run): {k}: {old} -> {new}"
        );
        Ok((old, new))
    }
}

/// One volume's figures (see [`CacheVolume::volume_figures`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeFigures {
    pub name: String,
    pub id: u32,
    pub size: u64,
    pub mode: String,
    /// Its backing device's identity (as given this run).
    pub backing: String,
    pub cached_lines: u64,
    pub dirty_lines: u64,
    pub counters: Counters,
    /// Byte ranges of the volume whose dirty data was lost (offsets within the volume):
    /// reads of them fail until written again.
    pub lost_ranges: Vec<(u64, u64)>,
}
