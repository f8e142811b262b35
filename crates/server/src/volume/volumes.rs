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
use crate::vol_tuning::VolumeTuning;
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
            flags: 0,
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
                    flags: 0,
                });
            }
        }
        // This run's own settings of the volume, else the stored ones (kept for the next
        // start); the cutoff's write half defaults to the pool's in force.
        let stored = sb.vol_tuning.iter().find(|t| t.id == v.id).copied();
        let flags = opts.volume_flags.iter().find(|f| f.name == v.name);
        let pool_cut = opts
            .tuning
            .or(sb.tuning)
            .map(|t| tiercache_engine::SeqCutoff {
                read_bytes: t.seq_cutoff_read,
                write_bytes: t.seq_cutoff_write,
            })
            .unwrap_or_default();
        // The mode: `--volume-mode` (or the one recorded at `ctl volume add`) is this run's
        // and drops a stored one; else the one `ctl --volume NAME set mode` stored; else the
        // pool's (so a volume restarted without --volume-mode follows the pool, as before).
        let own = VolumeTuning {
            id: v.id,
            mode: v.mode.or(stored.and_then(|t| t.mode)),
            admission: flags
                .and_then(|f| f.admission)
                .or(stored.and_then(|t| t.admission)),
            seq_cutoff: flags
                .and_then(|f| f.seq_cutoff)
                .map(|c| c.resolve(pool_cut))
                .or(stored.and_then(|t| t.seq_cutoff)),
            share: flags.and_then(|f| f.share).or(stored.and_then(|t| t.share)),
        };
        crate::vol_tuning::put(
            &mut sb.vol_tuning,
            VolumeTuning {
                mode: if v.mode.is_some() { None } else { own.mode },
                ..own
            },
        );
        out.push(VolumeConfig {
            mode: own.mode,
            admission: own.admission,
            seq_cutoff: own.seq_cutoff,
            bytes: Some(v.size),
            ..VolumeConfig::new(v.id, v.name.clone())
        });
    }
    if let Some(f) = opts
        .volume_flags
        .iter()
        .find(|f| !opts.volumes.iter().any(|v| v.name == f.name))
    {
        return Err(err(
            &f.name,
            "its own settings were given, but it is not among the volumes served".into(),
        ));
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
            let Some(m) = missing.iter().position(|e| e.id == vol_of(r.line_key())) else {
                continue;
            };
            // A removed volume (`ctl volume remove`) had no dirty line when it was removed:
            // a record of it still saying dirty or in flux is stale, and dropped. A dirty
            // line's copy (pools) stays with its line, counted once.
            if !missing[m].removed() && (r.dirty != 0 || (write_back && Record::in_flux(b))) {
                dirty[m] += !r.is_copy() as u64;
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
    for e in missing.iter().filter(|e| !e.removed()) {
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
    pub fn volume_specs(&self) -> Arc<Vec<VolumeSpec>> {
        self.vols()
    }

    /// The volumes served now (see [`CacheVolume::volume_specs`]).
    pub(super) fn vols(&self) -> Arc<Vec<VolumeSpec>> {
        self.volumes.specs()
    }

    /// `ctl volume add`: serves a new volume of `size` bytes (its backing device already
    /// reachable at [`crate::volume_set::vaddr`]`(id, _)` before its export is offered) in the
    /// pool from now on, with its own `mode` if given. The volume table gets a new entry
    /// (flagged added, with the mode) and the superblock is written and synced before this
    /// returns: a restart serves it (from the path its identity records when the command
    /// line does not name it). Returns its id: the lowest one no entry holds (a removed
    /// volume's id is not reused while the cache may hold records of it).
    pub fn add_volume(
        &self,
        name: &str,
        size: u64,
        identity: Option<BackingIdentity>,
        mode: Option<Mode>,
    ) -> Result<u32, String> {
        crate::volume_set::check_name(name)?;
        let vols = self.vols();
        if vols.is_empty() {
            return Err("this server serves one volume (started with --backing): volumes are added to a cache of several (serve --volume NAME=BACKING)".into());
        }
        if vols.iter().any(|v| v.name == name) {
            return Err(format!("volume {name} is served already"));
        }
        if size > VOL_MASK {
            return Err(format!(
                "volume {name}: {size} bytes; a volume holds at most {VOL_MASK} bytes"
            ));
        }
        let mut g = self.lock();
        if g.closed {
            return Err(g.closed_reason().into());
        }
        if g.failed {
            return Err("the cache device failed: no volume can be added until it is restarted with a newly formatted cache".into());
        }
        if g.sb
            .volumes
            .iter()
            .filter(|e| !e.removed())
            .any(|e| e.name == name)
        {
            return Err(format!(
                "volume {name} is in the cache's volume table already"
            ));
        }
        if g.sb.volumes.len() >= MAX_TABLE_VOLUMES {
            return Err(format!(
                "the cache's volume table is full ({MAX_TABLE_VOLUMES} entries, removed volumes included): {}",
                g.sb.volumes
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let id = (0..=tiercache_engine::engine::MAX_VOLUME)
            .find(|i| !g.sb.volumes.iter().any(|e| e.id == *i))
            .ok_or("no volume id left")?;
        let entry = VolumeEntry {
            id,
            name: name.to_string(),
            size,
            identity: identity
                .clone()
                .unwrap_or_else(|| BackingIdentity::unknown(name)),
            flags: format::VOLUME_ADDED | format::mode_flags(mode),
        };
        let cfg = VolumeConfig {
            mode,
            bytes: Some(size),
            ..VolumeConfig::new(id, name.to_string())
        };
        g.engine
            .retune(|c| c.volumes.push(cfg))
            .map_err(|e| format!("volume {name}: {e}"))?;
        g.sb.volumes.push(entry);
        // The id is new to the table: no stored settings can be of it, but none may apply.
        g.sb.vol_tuning.retain(|t| t.id != id);
        if let Err(e) = self.write_superblock(&mut g) {
            g.sb.volumes.retain(|e| e.id != id);
            let _ = g.engine.retune(|c| c.volumes.retain(|v| v.id != id));
            let after = self.restore_table(&mut g, &e);
            return Err(format!(
                "volume {name}: the cache's volume table could not be written ({e}): not added; {after}"
            ));
        }
        if let Some(r) = &self.ram {
            // Nothing of an earlier holder of the id may be served from RAM.
            r.set_volume_mode(id, mode);
        }
        self.volumes.set(|v| {
            v.push(VolumeSpec {
                id,
                name: name.to_string(),
                size,
                identity,
                mode,
            })
        });
        drop(g);
        self.classify_new_volume(id);
        tracing::info!("volume {name} added (id {id}, {size} bytes)");
        Ok(id)
    }

    /// `ctl volume remove`: volume `name` leaves the pool. Refused while it has dirty lines
    /// (`ctl --volume NAME detach` writes them back and keeps it clean) or lost ranges
    /// (written again and flushed, they are no longer lost). Otherwise its
    /// requests fail from now on (EIO: a client still connected to its export), the
    /// requests in progress end first, its table entry is flagged removed (superblock
    /// written and synced) and its clean lines are dropped from the pool (their records on
    /// the cache device are dropped at the next open, as a volume not served). Returns its
    /// id and the number of lines dropped.
    pub fn remove_volume(&self, name: &str) -> Result<(u32, u64), String> {
        let Some(spec) = self.vols().iter().find(|v| v.name == name).cloned() else {
            return Err(format!(
                "no volume {name:?} is served (volumes: {})",
                self.vols()
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if self.vols().len() == 1 {
            return Err(format!(
                "volume {name} is the last volume this server serves: stop the server instead"
            ));
        }
        let id = spec.id;
        // New requests of it fail from here; wait for those in progress.
        self.volumes.set(|v| v.retain(|x| x.id != id));
        let put_back = |why: String| {
            self.volumes.set(|v| v.push(spec.clone()));
            Err(why)
        };
        if !self.volumes.drain(id, Duration::from_secs(30)) {
            return put_back(format!(
                "volume {name}: its requests in progress did not end within 30 s (a backing device not answering?): not removed"
            ));
        }
        // No write-back in flight from here on (it may hold lines of this volume).
        let _owner = self.clean_owner();
        let mut g = self.lock();
        if g.closed {
            let why = g.closed_reason().to_string();
            drop(g);
            return put_back(why);
        }
        let mut slots = Vec::new();
        let mut dirty = 0u64;
        for (key, slot, d) in g.engine.entries() {
            if vol_of(key) == id {
                slots.push(slot);
                dirty += d as u64;
            }
        }
        if dirty > 0 {
            drop(g);
            return put_back(format!(
                "volume {name} holds {dirty} dirty lines its backing device does not have yet: run `ctl --volume {name} detach` first (writes them back and passes the volume through), then remove it"
            ));
        }
        // Unresolved loss, like dirty data: once removed, its ranges would be named by id
        // only and nobody could read (EIO) or rewrite them.
        let base = vaddr(id, 0);
        let lost: Vec<(u64, u64)> = g
            .lost
            .iter()
            .filter(|r| vol_of(r.0) == id)
            .map(|&(a, b)| (a - base, b - base))
            .collect();
        if !lost.is_empty() {
            drop(g);
            return put_back(format!(
                "volume {name} has {} lost ranges (bytes {}): data written to them was lost and their reads fail, so the loss stays visible; see them with `ctl --volume {name} stats` (lost ranges), write them again (e.g. from a backup) and flush, then remove it",
                lost.len(),
                lost.iter()
                    .map(|(a, b)| format!("{a}..{b}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        // What its clients wrote (write-through, or written back) is durable on its
        // backing device before the device is let go.
        if let Err(e) = self.flush_locked(&mut g) {
            drop(g);
            return put_back(format!(
                "volume {name}: flushing before removal failed ({e}): not removed"
            ));
        }
        let Some(ix) = g.sb.volumes.iter().position(|e| e.id == id) else {
            drop(g);
            return put_back(format!("volume {name} is not in the cache's volume table"));
        };
        g.sb.volumes[ix].flags |= format::VOLUME_REMOVED;
        // Its own settings go with it (a volume added under its name is a new volume).
        let kept = g.sb.vol_tuning.clone();
        g.sb.vol_tuning.retain(|t| t.id != id);
        if let Err(e) = self.write_superblock(&mut g) {
            g.sb.volumes[ix].flags &= !format::VOLUME_REMOVED;
            g.sb.vol_tuning = kept;
            let after = self.restore_table(&mut g, &e);
            drop(g);
            return put_back(format!(
                "volume {name}: the cache's volume table could not be written ({e}): not removed, still served; {after}"
            ));
        }
        for &s in &slots {
            debug_assert!(!g.engine.is_dirty(s) && !g.engine.is_pinned(s));
            g.engine.drop_line(s);
        }
        if let Some(r) = &self.ram {
            // Its lines leave RAM; its reads in flight fill nothing.
            r.set_volume_mode(id, None);
        }
        if let Err(e) = g.engine.retune(|c| c.volumes.retain(|v| v.id != id)) {
            tracing::warn!("volume {name}: removed, but its settings stay in the engine: {e}");
        }
        if let Err(e) = g.engine.set_volume_share(id, None) {
            tracing::warn!("volume {name}: removed, but its share stays in the engine: {e}");
        }
        drop(g);
        self.unclassify_volume(id);
        tracing::info!(
            "volume {name} removed (id {id}): {} clean lines left the pool",
            slots.len()
        );
        Ok((id, slots.len() as u64))
    }

    /// A superblock write of a volume table change failed (`e`) and `g.sb` holds the table
    /// as it was again. The device may hold either table: the write may have reached it,
    /// and a failed sync says nothing of what it kept (a later good sync may make it
    /// durable). A restart reading the new table would serve a volume whose add failed, or
    /// not serve one whose remove failed and drop the dirty lines written to it since (a
    /// removed volume's records are dropped as stale). So the table as it was is written
    /// again and synced; if that fails too, nobody knows which table a restart reads, and
    /// the cache is failed (its dirty data written back, every volume passed through, the
    /// failure recorded: a restart refuses the cache). Returns what the operator is told.
    fn restore_table(&self, g: &mut Inner, e: &io::Error) -> String {
        if g.failed {
            // Refused before anything was written (a failed cache writes no superblock).
            return "the cache had failed already".into();
        }
        let Err(again) = self.write_superblock(g) else {
            tracing::warn!("volume table write failed ({e}); the table as it was is written back");
            return "the table as it was is written back".into();
        };
        // Its recovery drops every line: no hit may read a slot meanwhile.
        let _excl = self.io.write().unwrap_or_else(|e| e.into_inner());
        g.cache_errors += 1;
        self.metrics.cache_errors.fetch_add(1, Ordering::Relaxed);
        let why = format!(
            "the cache's volume table could not be written ({e}), nor written back as it was ({again})"
        );
        tracing::error!("{why}: failing the cache");
        let recorded = self.fail_cache(g, &why);
        format!(
            "writing the table back as it was failed too ({again}): the cache FAILED (dirty data written back{}, every volume passes through to its backing device{}; format the cache device before it is used again)",
            if g.lost.is_empty() { "" } else { ", some LOST: see the lost ranges in `ctl stats`" },
            if recorded { "" } else { "; the failure is recorded nowhere durable, so writes fail until it is" },
        )
    }

    /// `ranges` (pool addresses) as JSON reports name them
    /// ([`crate::volume_set::NamedRange`]).
    pub fn named_ranges(&self, ranges: &[(u64, u64)]) -> Vec<crate::volume_set::NamedRange> {
        let vols = self.vols();
        crate::volume_set::named_ranges(
            !vols.is_empty(),
            |v| crate::volume_set::name_of(&vols, v),
            ranges,
        )
    }

    /// Per volume (several volumes): its name, id, size, mode and the engine's counters and
    /// occupancy for it (`ctl stats --json` `volumes`, Prometheus `volume="NAME"`).
    pub fn volume_figures(&self) -> Vec<VolumeFigures> {
        let vols = self.vols();
        if vols.is_empty() {
            return Vec::new();
        }
        let g = self.lock();
        let mode = g.engine.config().mode;
        let stats = g.engine.volume_stats();
        let shares = g.engine.volume_shares().to_vec();
        let cap = g.engine.capacity_lines();
        let (failed, lost) = (g.failed, g.lost.clone());
        drop(g);
        vols.iter()
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
                    share: shares
                        .iter()
                        .find(|x| x.volume == v.id)
                        .map(|x| crate::vol_tuning::Share::of(x.min, x.max).to_string()),
                    // In lines, as the engine rounds them (down).
                    share_min_lines: shares
                        .iter()
                        .find(|x| x.volume == v.id)
                        .map_or(0, |x| (x.min * cap as f64).floor() as u64),
                    share_max_lines: shares
                        .iter()
                        .find(|x| x.volume == v.id)
                        .map_or(cap, |x| (x.max * cap as f64).floor() as u64),
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
    fn served(&self, id: u32) -> Result<VolumeSpec, String> {
        let vols = self.vols();
        vols.iter().find(|v| v.id == id).cloned().ok_or_else(|| {
            format!(
                "no volume of id {id} is served (volumes: {})",
                vols.iter()
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
            "share" => {
                g.sb.vol_tuning
                    .iter()
                    .find(|t| t.id == id)
                    .and_then(|t| t.share)
                    .map_or_else(|| "pool".to_string(), |s| s.to_string())
            }
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
    /// `id`'s own settings (VALUE `pool`: it follows the pool's again), stored with the cache
    /// (`crate::vol_tuning`: a restart keeps it unless serve's flags set it); returns (old,
    /// new). Leaving write-back writes back the dirty lines
    /// first (the cleaner works on the pool: every volume's). A pool-wide key is refused,
    /// naming the per-volume ones.
    pub fn set_volume_setting(
        &self,
        id: u32,
        key: &str,
        value: &str,
    ) -> Result<(String, String), String> {
        let name = self.served(id)?.name;
        let k = tuning::volume_key(key)?;
        if k == "share" {
            return self.set_volume_share(id, &name, value);
        }
        if !tuning::VOLUME_KEYS.contains(&k) {
            return Err(format!(
                "{k} is a setting of the pool, shared by every volume (per volume: {}): `ctl set {k} VALUE` without --volume",
                tuning::VOLUME_KEYS.join(", ")
            ));
        }
        // No write-back in flight from here on (its lines would look clean to `clean_all`).
        let _owner = (k == "mode").then(|| self.clean_owner());
        let mut g = self.lock();
        self.reap_fills(&mut g);
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
        // `pool`: the volume follows the pool's setting again (its own is dropped).
        let pool = value.trim().eq_ignore_ascii_case("pool");
        let mut own = v.clone();
        if k == "mode" {
            let m: Mode = if pool {
                c.mode
            } else {
                value.parse().map_err(|e: String| what(&e))?
            };
            if m == Mode::WriteBack {
                // A volume's dirty lines are the pool's: mirrored, or refused as `ctl mode`.
                if let Some(why) = self.single_copy_write_back(&g) {
                    return Err(what(&why));
                }
            }
            if v.mode.unwrap_or(c.mode) == Mode::WriteBack && m != Mode::WriteBack {
                self.clean_all(&mut g).map_err(|e| what(&e))?;
                self.flush_locked(&mut g).map_err(|e| what(&e))?;
            }
            own.mode = (!pool).then_some(m);
        } else if pool {
            match k {
                "admission" => own.admission = None,
                _ => own.seq_cutoff = None,
            }
        } else {
            // Parsed as the pool's setting is, from the volume's values.
            let mut mine = c.clone();
            mine.admission = v.admission.unwrap_or(c.admission);
            mine.seq_cutoff = v.seq_cutoff.unwrap_or(c.seq_cutoff);
            let t = Tuning::of(&mine).with(k, value).map_err(|e| what(&e))?;
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
        let own_mode = own.mode;
        let share =
            g.sb.vol_tuning
                .iter()
                .find(|t| t.id == id)
                .and_then(|t| t.share);
        let stored = VolumeTuning::of(&own, share);
        g.engine
            .retune(|c| {
                if let Some(x) = c.volumes.iter_mut().find(|x| x.id == id) {
                    *x = own;
                }
            })
            .map_err(|e| what(&e))?;
        if k == "mode" {
            // The volume's lines leave the RAM tier (the others' stay); a pass-through
            // volume fills it no more.
            if let Some(r) = &self.ram {
                r.set_volume_mode(id, own_mode);
            }
        }
        // Stored with the cache: a restart keeps it (unless serve's flags say otherwise).
        let kept = (g.sb.vol_tuning.clone(), g.sb.volumes.clone());
        crate::vol_tuning::put(&mut g.sb.vol_tuning, stored);
        if k == "mode" {
            // A volume added live takes its mode from its table entry at a restart.
            if let Some(e) = g.sb.volumes.iter_mut().find(|e| e.id == id) {
                e.set_added_mode(own_mode);
            }
        }
        if let Err(e) = self.write_superblock(&mut g) {
            (g.sb.vol_tuning, g.sb.volumes) = kept;
            let now = Self::volume_setting(&g, id, k);
            tracing::warn!(
                "setting of volume {name}: {k}: {old} -> {now} applied but not stored: {e}"
            );
            return Err(format!(
                "volume {name}: {k} is {now} now, but storing it in the superblock failed ({e}): a restart goes back to {old}"
            ));
        }
        let new = Self::volume_setting(&g, id, k);
        drop(g);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: tuning::LOG_TARGET,
            "setting of volume {name}: {k}: {old} -> {new}"
        );
        Ok((old, new))
    }

    /// `ctl --volume NAME set share MIN:MAX` (`pool`: no bounds): volume `id`'s occupancy
    /// bounds in the engine (`Engine::set_volume_share`: the policy is rebuilt, every cached
    /// line kept; a lowered maximum is given back by later inserts, dirty lines written back)
    /// and stored with the cache. Checked first (bounds in order, minimums of the volumes
    /// served at most the pool): on error nothing changes. Returns (old, new).
    fn set_volume_share(
        &self,
        id: u32,
        name: &str,
        value: &str,
    ) -> Result<(String, String), String> {
        let what = |e: &dyn std::fmt::Display| format!("volume {name}: share {value:?}: {e}");
        let share = if value.trim().eq_ignore_ascii_case("pool") {
            None
        } else {
            Some(crate::vol_tuning::Share::parse(value).map_err(|e| what(&e))?)
        };
        let mut g = self.lock();
        if g.closed {
            return Err(g.closed_reason().into());
        }
        if g.failed {
            return Err("the cache device failed: every volume passes through to its backing device until restarted with a newly formatted cache (`tiercache format --force`)".into());
        }
        let old = Self::volume_setting(&g, id, "share");
        let served: Vec<u32> = self.vols().iter().map(|v| v.id).collect();
        let mut table = g.sb.vol_tuning.clone();
        let mut mine = table
            .iter()
            .find(|t| t.id == id)
            .copied()
            .unwrap_or(VolumeTuning {
                id,
                mode: None,
                admission: None,
                seq_cutoff: None,
                share: None,
            });
        mine.share = share;
        crate::vol_tuning::put(&mut table, mine);
        let of_served: Vec<VolumeTuning> = table
            .iter()
            .filter(|t| served.contains(&t.id))
            .copied()
            .collect();
        crate::vol_tuning::check_shares(&of_served).map_err(|e| what(&e))?;
        g.engine
            .set_volume_share(id, share.map(|s| s.bounds()))
            .map_err(|e| what(&e))?;
        let kept = std::mem::replace(&mut g.sb.vol_tuning, table);
        if let Err(e) = self.write_superblock(&mut g) {
            g.sb.vol_tuning = kept;
            let now = share.map_or_else(|| "pool".to_string(), |s| s.to_string());
            tracing::warn!(
                "setting of volume {name}: share: {old} -> {now} applied but not stored: {e}"
            );
            return Err(format!(
                "volume {name}: share is {now} now, but storing it in the superblock failed ({e}): a restart goes back to {old}"
            ));
        }
        let new = Self::volume_setting(&g, id, "share");
        drop(g);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: tuning::LOG_TARGET,
            "setting of volume {name}: share: {old} -> {new}"
        );
        Ok((old, new))
    }
}

/// The volumes a [`CacheVolume`] serves, changed live by `ctl volume add|remove`, and the
/// requests of each in progress (so that a removal waits for them to end).
pub(super) struct Served {
    specs: RwLock<Arc<Vec<VolumeSpec>>>,
    /// Requests in progress, by volume id modulo [`STRIPES`].
    inflight: [AtomicU64; STRIPES],
}

const STRIPES: usize = 64;

impl Served {
    pub(super) fn new(specs: Vec<VolumeSpec>) -> Served {
        Served {
            specs: RwLock::new(Arc::new(specs)),
            inflight: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    pub(super) fn specs(&self) -> Arc<Vec<VolumeSpec>> {
        Arc::clone(&self.specs.read().unwrap())
    }

    fn set(&self, f: impl FnOnce(&mut Vec<VolumeSpec>)) {
        let mut w = self.specs.write().unwrap();
        let mut v = (**w).clone();
        f(&mut v);
        *w = Arc::new(v);
    }

    /// Counts a request of volume `id` as in progress while the guard lives; `None` (not
    /// counted) when the volume is not served. Counted before the volume is looked up, so a
    /// removal that took the volume out and then sees no request in progress has none left
    /// to come.
    pub(super) fn enter(&self, id: u32) -> Option<(VolumeSpec, Busy<'_>)> {
        let c = &self.inflight[id as usize % STRIPES];
        c.fetch_add(1, Ordering::SeqCst);
        let guard = Busy(c);
        let spec = self.specs().iter().find(|v| v.id == id).cloned()?;
        Some((spec, guard))
    }

    /// Waits (up to `max`) for the requests of volume `id` in progress to end.
    fn drain(&self, id: u32, max: Duration) -> bool {
        let c = &self.inflight[id as usize % STRIPES];
        let t = Instant::now();
        while c.load(Ordering::SeqCst) != 0 {
            if t.elapsed() > max {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// A request in progress ([`Served::enter`]).
pub(super) struct Busy<'a>(&'a AtomicU64);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
    /// Its occupancy bounds (`--volume-share`, `ctl --volume NAME set share`) as MIN:MAX
    /// percents; `None`: none (it shares the partition of the volumes without bounds).
    pub share: Option<String>,
    /// The bounds in lines: the lines other volumes do not evict it below, the lines it
    /// holds at most (0 and the pool's capacity without bounds).
    pub share_min_lines: u64,
    pub share_max_lines: u64,
    pub counters: Counters,
    /// Byte ranges of the volume whose dirty data was lost (offsets within the volume):
    /// reads of them fail until written again.
    pub lost_ranges: Vec<(u64, u64)>,
}
