//! Formatting a cache device and opening it: the superblock, the backing device's identity, the
//! clean-line sample, and the restore of the engine from the durable records.

use super::*;
use rayon::prelude::*;

/// Bytes of single-copy dirty lines the open mirrors again before serving
/// ([`CacheVolume::remirror_at_open`]); a larger backlog is the cleaner's.
const OPEN_REMIRROR_BYTES: u64 = 1 << 30;

/// Writes a fresh superblock and empty metadata; returns the superblock.
pub fn format(
    cache: &dyn BlockDev,
    backing_size: u64,
    opts: &FormatOptions,
) -> Result<Superblock, FormatError> {
    let ls = opts.line_size;
    if !ls.is_power_of_two() || !(4096..=1 << 20).contains(&ls) {
        return Err(FormatError::BadField {
            field: "line_size",
            why: format!("{ls} is not a power of two in 4 KiB..1 MiB"),
        });
    }
    if tiercache_engine::policy::lookup(&opts.policy).is_none() {
        return Err(FormatError::BadField {
            field: "policy",
            why: format!(
                "unknown policy {:?} (known: {})",
                opts.policy,
                tiercache_engine::policy::names().join(", ")
            ),
        });
    }
    if tiercache_engine::policy::is_offline(&opts.policy) {
        return Err(offline_policy(&opts.policy));
    }
    if let Some(t) = &opts.tuning {
        let mut cfg = EngineConfig {
            line_size: ls,
            policy: opts.policy.clone(),
            ..Default::default()
        };
        t.apply(&mut cfg);
        cfg.validate().map_err(|why| FormatError::BadField {
            field: "engine settings",
            why,
        })?;
    }
    let mut max = Superblock::lines_for_device(cache.size(), ls);
    while max > 0
        && Superblock::data_offset_new(max, ls, opts.data_checksums) + max * ls > cache.size()
    {
        max -= 1;
    }
    let lines = opts.capacity_lines.unwrap_or(max);
    let sums = opts.data_checksums;
    let need = Superblock::data_offset_new(lines, ls, sums) + lines * ls;
    if lines == 0 || need > cache.size() {
        return Err(FormatError::TooSmall {
            have: cache.size(),
            need: need.max(Superblock::data_offset_new(1, ls, sums) + ls),
            lines: lines.max(1),
            line_size: ls,
        });
    }
    let mut uuid = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut uuid[..]);
    let sb = Superblock {
        version: if sums {
            format::VERSION_SUMS
        } else {
            format::VERSION
        },
        uuid,
        line_size: ls,
        capacity_lines: lines,
        mode: mode_index(opts.mode),
        policy: opts.policy.clone(),
        backing_size,
        backing: opts
            .backing
            .clone()
            .unwrap_or_else(|| BackingIdentity::unknown(&opts.backing_id)),
        clean: true,
        lost_pending: false,
        generation: 1,
        data_offset: Superblock::data_offset_new(lines, ls, sums),
        tuning: opts.tuning,
        data_checksums: sums,
        lost_list: true,
        volumes: Vec::new(),
        vol_tuning: Vec::new(),
        validity: opts.validity,
    };
    // Empty records first, the superblock last: a format interrupted half way has no magic.
    cache.write_at(&[0u8; 4096], 0)?;
    let mut page = vec![0u8; PAGE as usize];
    for r in page.chunks_mut(RECORD_BYTES as usize) {
        Record::EMPTY.encode(r);
    }
    let pages = lines.div_ceil(format::RECORDS_PER_PAGE);
    let chunk: Vec<u8> = page.repeat(256);
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(256);
        cache.write_at(&chunk[..(n * PAGE) as usize], META_OFFSET + p * PAGE)?;
        p += n;
    }
    if sums {
        crate::data_sums::DataSums::format(
            cache,
            crate::data_sums::region_offset(lines),
            lines,
            ls,
        )?;
    }
    let at = sb
        .lost_list_offset()
        .expect("a new layout reserves the lost-range list");
    crate::lost_list::LostList::format(cache, at)?;
    cache.sync()?;
    cache.write_at(&sb.encode(), 0)?;
    cache.sync()?;
    Ok(sb)
}

/// The error for an offline policy (it needs the future) given to a live cache.
fn offline_policy(name: &str) -> FormatError {
    FormatError::BadField {
        field: "policy",
        why: format!(
            "{name} is an offline policy (it needs the future accesses, which only a simulator replaying a trace has): a live cache cannot run it; use it with `tiercache sim`, and pick an online policy here (`tiercache policies`)"
        ),
    }
}

/// Reads the superblock of a cache device.
pub fn read_superblock(cache: &dyn BlockDev) -> Result<Superblock, FormatError> {
    let mut b = vec![0u8; format::SUPERBLOCK_BYTES as usize];
    cache.read_at(&mut b, 0)?;
    Superblock::decode(&b)
}

/// Compares the backing device with the identity the superblock recorded (`crate::identity`):
/// a different device is refused (`FormatError::WrongBacking`) unless
/// `opts.accept_backing_rename`; an unrecorded identity (version 1) is trusted and recorded,
/// as is a renamed block device with the same stable id. Updates `sb.backing`, which the
/// open writes to the device; returns a note for the log when it did more than match.
fn check_backing_identity(
    sb: &mut Superblock,
    backing: &dyn BlockDev,
    opts: &OpenOptions,
) -> Result<Option<String>, FormatError> {
    let Some(given) = backing.identity() else {
        return Ok(None); // a device that cannot say which it is (test wrappers)
    };
    let note = crate::identity::verify(&sb.backing, &given, opts.accept_backing_rename)
        .map_err(|(recorded, given)| FormatError::WrongBacking { recorded, given })?;
    sb.backing = given;
    Ok(note)
}

/// One read, and one retry if it fails (a transient error at open).
pub(crate) fn read_twice(dev: &dyn BlockDev, buf: &mut [u8], off: u64) -> io::Result<()> {
    dev.read_at(buf, off).or_else(|_| dev.read_at(buf, off))
}

/// Compares a sample of the clean lines about to be restored with the backing device. A
/// clean line must equal it; when one does not, the backing device was written behind the
/// cache's back or is another disk:
/// * after a clean shutdown any difference means that: every clean line is dropped (the
///   backing device's bytes are served), or, when the cache holds dirty lines, the open is
///   refused (`FormatError::BackingChanged`): they would be written over a changed disk,
///   unless `opts.accept_backing_changes` (then clean lines and the clean sectors of dirty
///   ones are dropped);
/// * after a crash, a line written just before it may legitimately differ (the write reached
///   one device and not the other); only the differing lines are dropped (they then read the
///   backing copy, and keep reading it), unless every sampled line differs (another disk).
///
/// With data checksums (`sums`), a differing line whose own bytes fail their checksum is
/// damage in the cache, dropped alone (`OpenReport::damaged_clean_lines`). A line either
/// device fails to read (twice) is left out of the sample (`unreadable_clean_lines`).
/// What the clean sample decided (`verify_clean_sample`).
struct SampleVerdict {
    /// Slots of sampled lines dropped (damaged, or differing after a crash).
    drop: Vec<u32>,
    /// The backing device changed: every clean line is dropped, dirty lines keep only their
    /// dirty sectors.
    all_clean: bool,
}

/// `sample`: the sampled clean lines (slot, record) by key; `clean_lines` and `dirty_lines`:
/// how many lines of each kind are about to be restored.
#[allow(clippy::too_many_arguments)]
fn verify_clean_sample(
    cache: &dyn BlockDev,
    backing: &dyn BlockDev,
    sb: &Superblock,
    sector: u64,
    sample: Vec<(u32, Record)>,
    clean_lines: u64,
    dirty_lines: u64,
    opts: &OpenOptions,
    report: &mut OpenReport,
    sums: Option<&DataSums>,
) -> Result<SampleVerdict, FormatError> {
    let ls = sb.line_size;
    let mut lines = sample;
    let mut verdict = SampleVerdict {
        drop: Vec::new(),
        all_clean: false,
    };
    if lines.is_empty() {
        return Ok(verdict);
    }
    let clean: Vec<usize> = (0..lines.len()).collect();
    let k = clean.len();
    let (mut a, mut b) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
    let mut differ: Vec<usize> = Vec::new();
    let mut damaged: Vec<usize> = Vec::new();
    let mut unreadable = 0usize;
    for &i in &clean {
        let (slot, r) = lines[i];
        let at = key_addr(r.key, ls.trailing_zeros());
        // Only the part of the line inside the backing device (a partial last line).
        let n = backing.region_end(at).saturating_sub(at).min(ls) as usize;
        // A read error (after one retry) leaves the line out of the sample: one bad sector
        // must not refuse a cache holding dirty data. The request path handles it later (a
        // clean line whose cache read fails is served from the backing device).
        if let Err(e) = read_twice(cache, &mut a[..n], sb.data_offset + slot as u64 * ls)
            .map_err(|e| {
                format!(
                    "the cache device at byte {}: {e}",
                    sb.data_offset + slot as u64 * ls
                )
            })
            .and_then(|()| {
                read_twice(backing, &mut b[..n], at)
                    .map_err(|e| format!("the backing device at byte {at}: {e}"))
            })
        {
            tracing::warn!(
                "verifying cached line at volume byte {at} against the backing device: reading {e}; line left out of the sample"
            );
            unreadable += 1;
            continue;
        }
        let same = (0..ls / sector).all(|s| {
            let (x, y) = ((s * sector) as usize, (((s + 1) * sector) as usize).min(n));
            r.valid >> s & 1 == 0 || x >= y || a[x..y] == b[x..y]
        });
        if !same {
            // With data checksums, a line whose own bytes fail their checksum is damage in
            // the cache (a flipped bit), not evidence that the backing device changed.
            let bad = sums.is_some_and(|s| {
                (0..(ls / sector).min(64)).any(|q| {
                    let ssd = slot as u64 * ls + q * sector;
                    let u = (q * sector) as usize..((q + 1) * sector) as usize;
                    r.valid >> q & 1 == 1 && u.end <= n && crc32c::crc32c(&a[u]) != s.get(ssd)
                })
            });
            if bad {
                tracing::warn!(
                    "data checksum mismatch in clean data: cache slot {slot}, volume bytes {at}..{}: line dropped, read again from the backing device",
                    at + ls
                );
                damaged.push(i);
            } else {
                differ.push(i);
            }
        }
    }
    if !damaged.is_empty() {
        let drop: std::collections::HashSet<u64> =
            damaged.iter().map(|&i| lines[i].1.key).collect();
        let differ_keys: Vec<u64> = differ.iter().map(|&i| lines[i].1.key).collect();
        verdict.drop.extend(damaged.iter().map(|&i| lines[i].0));
        lines.retain(|(_, r)| !drop.contains(&r.key));
        report.damaged_clean_lines = drop.len() as u64;
        report.dropped_clean_lines += drop.len() as u64;
        // `differ` indexes the list as it was.
        differ = differ_keys
            .iter()
            .filter_map(|k| lines.iter().position(|(_, r)| r.key == *k))
            .collect();
    }
    // Lines left out for a read error were not compared.
    report.unreadable_clean_lines = unreadable as u64;
    let k = k - unreadable;
    report.sampled_clean_lines = k as u64;
    report.differing_clean_lines = differ.len() as u64;
    if differ.is_empty() {
        return Ok(verdict);
    }
    let first = differ
        .iter()
        .map(|&i| (lines[i].1.key & LINE_MASK) * ls)
        .min()
        .unwrap_or(0);
    let changed = sb.clean || (differ.len() == k && k >= 8);
    if !changed {
        verdict.drop.extend(differ.iter().map(|&i| lines[i].0));
        report.dropped_clean_lines += differ.len() as u64;
        tracing::warn!(
            "{} of {k} clean cached lines sampled differ from the backing device after an unclean shutdown (writes in flight at the crash; first at volume byte {first}): dropped, they read the backing device's copy",
            differ.len()
        );
        return Ok(verdict);
    }
    let dirty = dirty_lines;
    if dirty > 0 && !opts.accept_backing_changes {
        return Err(FormatError::BackingChanged {
            backing: sb.backing.describe(),
            differ: report.differing_clean_lines,
            sampled: k as u64,
            first,
            dirty_lines: dirty,
        });
    }
    // Every clean line but the damaged ones dropped above.
    verdict.all_clean = true;
    report.dropped_clean_lines += clean_lines - report.damaged_clean_lines;
    tracing::warn!(
        "the backing device {} changed behind the cache ({} of {k} clean lines sampled differ, first at volume byte {first}): dropped all {} clean lines{}",
        sb.backing.describe(),
        report.differing_clean_lines,
        report.dropped_clean_lines,
        if dirty > 0 {
            format!("; keeping {dirty} dirty lines (--accept-backing-changes)")
        } else {
            String::new()
        }
    );
    Ok(verdict)
}

impl CacheVolume {
    /// Opens a formatted cache device in front of `backing` and restores its lines.
    pub fn open(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        opts: &OpenOptions,
    ) -> Result<(CacheVolume, OpenReport), FormatError> {
        let state = match &opts.state_path {
            Some(p) => state_file::read(p)?.map(|st| (p, st)),
            None => None,
        };
        let mut sb = match read_superblock(&*cache) {
            Ok(sb) => sb,
            // An erased superblock after a failure: say so, not only "bad magic".
            Err(e @ (FormatError::BadMagic | FormatError::BadSuperblockChecksum { .. })) => {
                return Err(match state {
                    Some((p, st)) => FormatError::Failed {
                        what: format!("{} (superblock: {e})", st.describe()),
                        state: p.display().to_string(),
                    },
                    None => e,
                })
            }
            Err(e) => return Err(e),
        };
        if let Some((p, st)) = state {
            if st.uuid == sb.uuid {
                // Issue 14 item 6: never restore lines older than what went to the backing
                // device after the failure.
                return Err(FormatError::Failed {
                    what: st.describe(),
                    state: p.display().to_string(),
                });
            }
            tracing::warn!(
                "ignoring cache state file {}: it records the failure of another cache ({}), not this one ({})",
                p.display(),
                state_file::uuid_hex(&st.uuid),
                state_file::uuid_hex(&sb.uuid)
            );
        }
        let vol_table = if opts.volumes.is_empty() {
            if !sb.volumes.is_empty() {
                let names: Vec<&str> = sb.volumes.iter().map(|v| v.name.as_str()).collect();
                return Err(FormatError::Volume {
                    volume: names.join(", "),
                    why: "the cache serves several volumes: start it with --volume NAME=BACKING for each (--backing is for a one-volume cache)".into(),
                });
            }
            Vec::new()
        } else {
            volumes::reconcile(&mut sb, &*cache, opts)?
        };
        if opts.volumes.is_empty() && sb.backing_size != backing.size() {
            return Err(FormatError::BackingMismatch {
                sb: sb.backing_size,
                actual: backing.size(),
            });
        }
        let backing_note = check_backing_identity(&mut sb, &*backing, opts)?;
        if cache.size() < sb.device_bytes() {
            return Err(FormatError::TooSmall {
                have: cache.size(),
                need: sb.device_bytes(),
                lines: sb.capacity_lines,
                line_size: sb.line_size,
            });
        }
        // The mode the records were written in: it decides which copy of an in-flux line
        // wins (rule 5 of the module doc).
        let recorded_mode = Mode::ALL[sb.mode as usize];
        if let Some(m) = opts.mode {
            sb.mode = mode_index(m);
        }
        // Records may carry in-flux flags from now on (format version 2).
        sb.version = sb.current_version();
        if let Some(p) = &opts.policy {
            sb.policy = p.clone();
        }
        if tiercache_engine::policy::is_offline(&sb.policy) {
            return Err(offline_policy(&sb.policy));
        }
        // The served volumes' occupancy bounds (this run's `--volume-share`, else stored).
        let volume_shares: Vec<tiercache_engine::policy::VolumeShare> = sb
            .vol_tuning
            .iter()
            .filter(|t| vol_table.iter().any(|v| v.id == t.id))
            .filter_map(|t| {
                t.share.map(|s| {
                    let (min, max) = s.bounds();
                    tiercache_engine::policy::VolumeShare {
                        volume: t.id,
                        min,
                        max,
                    }
                })
            })
            .collect();
        let mut cfg = EngineConfig {
            capacity_lines: sb.capacity_lines,
            line_size: sb.line_size,
            group_size: sb.line_size,
            policy: sb.policy.clone(),
            mode: Mode::ALL[sb.mode as usize],
            volume_bytes: Some(backing.size()),
            volumes: vol_table,
            policy_params: tiercache_engine::policy::PolicyConfig {
                classes: opts.classes.clone(),
                volume_shares,
                ..Default::default()
            },
            // A pool of cache devices: the engine spreads lines over its members, and in
            // write-back mirrors each dirty line on two of them unless the pool was told
            // otherwise (`--dirty-copies`, stored in its blocks).
            dirty_copies: crate::pool_dev::effective_dirty_copies(
                cache.pool_lines().len(),
                Mode::ALL[sb.mode as usize],
                Some(cache.dirty_copies()),
            ),
            pool_lines: cache.pool_lines(),
            validity: sb.validity,
            ..Default::default()
        };
        // This run's settings, else the stored ones; stored (again) with the superblock.
        if let Some(t) = opts.tuning.or(sb.tuning) {
            t.apply(&mut cfg);
        }
        // The write-back rate is the volume's, not the engine's: kept as stored unless this
        // run sets it.
        let writeback = opts
            .tuning
            .and_then(|t| t.writeback)
            .or(sb.tuning.and_then(|t| t.writeback));
        sb.tuning = Some(Tuning {
            writeback,
            ..Tuning::of(&cfg)
        });
        let mut lap = Lap::new();
        let meta_bytes = sb.capacity_lines.div_ceil(format::RECORDS_PER_PAGE) * PAGE;
        let mut disk = vec![0u8; meta_bytes as usize];
        let mut report = OpenReport {
            was_clean: sb.clean,
            backing_note,
            ..Default::default()
        };
        // One decode of the record area, on every core (`bulk`): the candidates to restore
        // by slot with their `(seq, slot)` (their keys are read from the area, `key_at`).
        // Records the engine will not take as they are (`touched`) are brought up to its
        // state by `update_records` below; the others already equal it, so open never passes
        // over every slot again.
        let cap = sb.capacity_lines as usize;
        // A pool's records are its members' (version 6: they may be dirty copies); a cache
        // of one device has none.
        let pool = cache.pool_lines();
        let rec_version = if pool.is_empty() {
            sb.version
        } else {
            format::VERSION_POOL
        };
        // The engine's arrays are filled (one core; ~0.2 s at 10^7 lines, page faults mostly)
        // while the area is read and decoded (the other cores, then every core): the two
        // are independent until the engine takes the lines. An engine refused for its
        // configuration is reported first, as when it was built before the read.
        let (engine, decoded) = rayon::join(
            || Engine::new(cfg),
            || bulk::read_and_decode(&*cache, &mut disk, cap, rec_version),
        );
        let mut engine = engine.map_err(|e| FormatError::BadField {
            field: "engine configuration",
            why: e.to_string(),
        })?;
        let bulk::Decoded {
            mut take,
            mut order,
            keys,
            mut touched,
            bad,
            flux,
            copies,
        } = decoded?;
        if let (Some(&slot), true) = (bad.first(), sb.clean) {
            return Err(FormatError::BadRecord {
                slot: slot as u64,
                offset: META_OFFSET + slot as u64 * RECORD_BYTES,
            });
        }
        report.dropped_bad_checksum += bad.len() as u64;
        lap.lap("engine new | read, decode");
        let taken = |take: &[u64], slot: u32| take[slot as usize / 64] >> (slot % 64) & 1 == 1;
        // A key in two slots (a flush torn between the page unmapping it and the page
        // mapping it anew, rule 3): found by sorting the keys; the newer record wins, the
        // lower slot among equal sequence numbers (the records are visited in slot order).
        // Sorted as `key << 1 | dirty` (a key has no bit 63: the in-flux flag is stripped),
        // so the same sort gives the clean sample its clean keys in order below.
        // (The keys gathered by the decode, parallel to `order`.)
        // The newest sequence number (one serial pass) alongside the sort.
        let (max_seq, (mut keys, mut scratch)) = rayon::join(
            || bulk::max_seq(&disk, cap, &bad),
            || {
                let mut keys = keys;
                let mut scratch = Vec::new();
                bulk::radix_sort(&mut keys, &mut scratch);
                (keys, scratch)
            },
        );
        drop(bad);
        let mut dups: Vec<u64> = keys
            .par_windows(2)
            .filter(|w| w[0] >> 1 == w[1] >> 1)
            .map(|w| w[0] >> 1)
            .collect();
        dups.dedup();
        if !dups.is_empty() {
            let mut best: HashMap<u64, (u32, u32)> = HashMap::new();
            let mut losers: BTreeSet<u32> = BTreeSet::new();
            for &o in &order {
                let (slot, seq) = (o as u32, (o >> 32) as u32);
                let key = bulk::key_at(&disk, slot as usize);
                if dups.binary_search(&key).is_err() {
                    continue;
                }
                report.dropped_duplicates += best.contains_key(&key) as u64;
                match best.get(&key) {
                    Some(&(_, old)) if !format::seq_newer(seq, old) => {
                        losers.insert(slot);
                    }
                    Some(&(old, _)) => {
                        losers.insert(old);
                        best.insert(key, (slot, seq));
                    }
                    None => {
                        best.insert(key, (slot, seq));
                    }
                }
            }
            order.retain(|&o| !losers.contains(&(o as u32)));
            for &s in &losers {
                take[s as usize / 64] &= !(1 << (s % 64));
            }
            touched.extend(losers);
        }
        // Oldest first (as they were last used), by sequence number relative to the newest,
        // then slot: sorted below while the engine takes the lines.
        let base = max_seq.wrapping_add(1);
        order.par_iter_mut().for_each(|o| {
            let seq = (*o >> 32) as u32;
            *o = (seq.wrapping_sub(base) as u64) << 32 | (*o & 0xffff_ffff);
        });
        lap.lap("duplicates");
        let mut sums = match sb.data_checksums {
            true => Some(crate::data_sums::DataSums::load(
                &*cache,
                crate::data_sums::region_offset(sb.capacity_lines),
                sb.capacity_lines,
                sb.line_size,
            )?),
            false => None,
        };
        // The lost-range list (`crate::lost_list`): read back, or written empty at the first
        // open of a cache formatted before it (made durable before the superblock says so).
        let list = if sb.lost_list {
            let at = sb.lost_list_offset().expect("checked by decode");
            Some(crate::lost_list::LostList::load(&*cache, at)?)
        } else if let Some(at) = sb.lost_list_offset() {
            let l = crate::lost_list::LostList::adopt_or_format(&*cache, at)?;
            cache.sync()?;
            sb.lost_list = true;
            tracing::info!(
                "cache formatted before the lost-range list: the list set up at cache bytes {at}..{} (upgrade)",
                at + crate::lost_list::BYTES
            );
            Some(l)
        } else {
            tracing::warn!(
                "this cache was formatted before the lost-range list and has no room for it (data area at byte {}): ranges reported lost are forgotten at a restart and then read the backing device's older bytes. `tiercache format --force` the cache device (after a clean shutdown) to get the list",
                sb.data_offset
            );
            None
        };
        // Candidates restored otherwise than their record says (in flux, resolved), by slot.
        let mut changed: Vec<(u32, Record)> = Vec::new();
        let mut flux_pages = BTreeSet::new();
        let (ls, ss) = (sb.line_size, engine.sector_size());
        let (mut slot_bytes, mut backing_bytes) = (vec![0u8; ls as usize], vec![0u8; ls as usize]);
        for &slot in &flux {
            if !taken(&take, slot) {
                continue; // an older duplicate
            }
            let at = slot as usize * RECORD_BYTES as usize;
            let mut r = Record::decode_trusted(&disk[at..at + RECORD_BYTES as usize]);
            // Rule 5: the clean sectors that differ from the backing device.
            report.in_flux += 1;
            touched.push(slot);
            flux_pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
            cache.read_at(&mut slot_bytes, sb.data_offset + slot as u64 * ls)?;
            backing.read_at(&mut backing_bytes, key_addr(r.key, ls.trailing_zeros()))?;
            let mut differ = 0u64;
            for k in 0..(ls / ss).min(64) {
                let u = (k * ss) as usize..((k + 1) * ss) as usize;
                if (r.valid & !r.dirty) >> k & 1 == 1 && slot_bytes[u.clone()] != backing_bytes[u] {
                    differ |= 1 << k;
                }
            }
            if differ != 0 {
                if recorded_mode == Mode::WriteBack {
                    r.dirty |= differ;
                    report.in_flux_dirty += 1;
                } else {
                    r.valid &= !differ;
                    if r.valid == 0 {
                        report.in_flux_dropped += 1;
                        take[slot as usize / 64] &= !(1 << (slot % 64));
                        continue;
                    }
                }
            }
            // Its slot may have been written in place after its checksums were last
            // made durable (or the other way round): they are recomputed from the data,
            // which is the line's content either way (never good data reported bad).
            if let Some((s, _)) = &mut sums {
                s.recompute(slot as u64, &slot_bytes, r.valid);
            }
            changed.push((slot, r));
        }
        // Line validity: the engine takes whole lines only. A record left partly valid or
        // partly dirty (by `check --repair` dropping damaged sectors, by the in-flux rule above
        // marking the sectors that differ dirty, or by a build without the field) is made
        // whole here rather than refused (a refused dirty line would be dropped, or stop the
        // open): its missing sectors are read from the backing device, which holds them, into
        // its slot (synced before any record says so), and a dirty line is dirty whole (its
        // clean sectors equal the backing device's: writing them back changes nothing).
        if engine.config().validity == tiercache_engine::Validity::Line {
            let n = (ls / ss).min(64);
            let full = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            let mut filled = 0u64;
            let slots: Vec<u32> = bulk::bits(&take).collect();
            for slot in slots {
                let i = changed.binary_search_by_key(&slot, |c| c.0);
                let r = match i {
                    Ok(i) => changed[i].1,
                    Err(_) => {
                        let at = slot as usize * RECORD_BYTES as usize;
                        Record::decode_trusted(&disk[at..at + RECORD_BYTES as usize])
                    }
                };
                if r.valid == full && (r.dirty == 0 || r.dirty == full) {
                    continue;
                }
                let at = sb.data_offset + slot as u64 * ls;
                cache.read_at(&mut slot_bytes, at)?;
                backing.read_at(&mut backing_bytes, key_addr(r.key, ls.trailing_zeros()))?;
                for k in (0..n).filter(|k| r.valid >> k & 1 == 0) {
                    let u = (k * ss) as usize..((k + 1) * ss) as usize;
                    slot_bytes[u.clone()].copy_from_slice(&backing_bytes[u]);
                }
                cache.write_at(&slot_bytes, at)?;
                if let Some((s, _)) = &mut sums {
                    // Only the sectors filled: the others keep their checksums, so damage
                    // in them is still caught on read, not blessed here.
                    s.recompute(slot as u64, &slot_bytes, full & !r.valid);
                }
                let whole = Record {
                    valid: full,
                    dirty: if r.dirty == 0 { 0 } else { full },
                    ..r
                };
                match i {
                    Ok(i) => changed[i].1 = whole,
                    Err(i) => {
                        changed.insert(i, (slot, whole));
                        touched.push(slot);
                        flux_pages.insert(slot as u64 / format::RECORDS_PER_PAGE);
                    }
                }
                filled += 1;
            }
            if filled > 0 {
                cache.sync()?;
                tracing::warn!(
                    "{filled} line(s) recorded partly valid or partly dirty in a cache of line validity were made whole (their missing sectors read from the backing device)"
                );
            }
        }
        // The line a candidate restores (before the clean sample).
        let line_at = |slot: u32| -> Record {
            if !changed.is_empty() {
                if let Ok(i) = changed.binary_search_by_key(&slot, |c| c.0) {
                    return changed[i].1;
                }
            }
            let at = slot as usize * RECORD_BYTES as usize;
            Record::decode_trusted(&disk[at..at + RECORD_BYTES as usize])
        };
        if let Some((s, bad)) = &mut sums {
            // Blocks whose checksum fails (torn by a crash, or damaged): their entries are
            // unknown, so those of restored lines are recomputed from the data, and the
            // blocks rewritten whole at the first flush.
            if !bad.is_empty() {
                let slots: BTreeSet<u64> = bad.iter().flat_map(|&b| s.block_slots(b)).collect();
                for &slot in slots.iter().filter(|&&x| x < cap as u64) {
                    if taken(&take, slot as u32) {
                        let r = line_at(slot as u32);
                        cache.read_at(&mut slot_bytes, sb.data_offset + slot * ls)?;
                        s.recompute(slot, &slot_bytes, r.valid);
                    }
                }
                for &b in bad.iter() {
                    s.touch_block(b);
                }
                let msg = format!(
                    "{} data checksum block(s) failed their own checksum (first at block {}); the checksums of the cached lines they cover were recomputed from the data",
                    bad.len(),
                    bad[0]
                );
                if sb.clean {
                    tracing::error!("{msg}: the checksum region was damaged after a clean stop");
                } else {
                    tracing::warn!("{msg} (torn by the unclean stop)");
                }
            }
        }
        let mut sums = sums.map(|(s, _)| s);
        if let Some(s) = &sums {
            // One checksum per validity unit: anything else would check bytes never valid.
            assert_eq!(s.sector, engine.sector_size(), "data checksum unit");
        }
        lap.lap("in flux, checksums");
        // The clean sample: up to `sample_size` clean lines evenly spaced in key order (the
        // keys at ranks j * n / k of the sorted clean keys), compared with the backing device.
        const WORDS: usize = 1024; // candidates' bitmap words per task
        if !dups.is_empty() || !flux.is_empty() {
            // Lines were dropped or their masks changed since `keys` was sorted: again.
            keys.clear();
            for slot in bulk::bits(&take) {
                let r = line_at(slot);
                keys.push(r.key << 1 | (r.dirty != 0) as u64);
            }
            bulk::radix_sort(&mut keys, &mut scratch);
        }
        let (n, picked) = bulk::pick_clean(&keys, crate::identity::sample_size(ls));
        let dirty_lines = (keys.len() - n) as u64;
        drop(keys);
        let mut sample: Vec<(u32, Record)> = Vec::new();
        if n > 0 {
            // Their lines: one pass over the candidates, a 4096-bit filter of the picked keys
            // before the search.
            let hash = |key: u64| (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize;
            let mut filter = [0u64; 64];
            for &key in &picked {
                filter[hash(key) / 64] |= 1 << (hash(key) % 64);
            }
            let found: Vec<Vec<(u32, Record)>> = take
                .par_chunks(WORDS)
                .enumerate()
                .map(|(c, w)| {
                    let mut out = Vec::new();
                    for s in bulk::bits(w) {
                        let slot = (c * WORDS * 64) as u32 + s;
                        let key = bulk::key_at(&disk, slot as usize);
                        let h = hash(key);
                        if filter[h / 64] >> (h % 64) & 1 == 1 && picked.binary_search(&key).is_ok()
                        {
                            let r = line_at(slot);
                            debug_assert!(r.dirty == 0 && r.key == key);
                            out.push((slot, r));
                        }
                    }
                    out
                })
                .collect();
            sample = found.into_iter().flatten().collect();
            sample.sort_by_key(|(_, r)| r.key);
        }
        let verdict = verify_clean_sample(
            &*cache,
            &*backing,
            &sb,
            engine.sector_size(),
            sample,
            n as u64,
            dirty_lines,
            opts,
            &mut report,
            sums.as_ref(),
        )?;
        for &s in &verdict.drop {
            take[s as usize / 64] &= !(1 << (s % 64));
        }
        if verdict.all_clean {
            // Every clean line dropped; dirty lines keep their dirty sectors only.
            for (c, w) in take.iter_mut().enumerate() {
                let mut x = *w;
                while x != 0 {
                    let s = x.trailing_zeros();
                    x &= x - 1;
                    if line_at((c * 64) as u32 + s).dirty == 0 {
                        *w &= !(1 << s);
                    }
                }
            }
        }
        lap.lap("clean sample");
        // The sample dropped lines or changed their masks: every record is compared below.
        let touch_all = report.dropped_clean_lines > 0;
        // The lines of a range of slots (whole words of `take`), by slot.
        let lines_in = |r: std::ops::Range<u32>| {
            let w0 = r.start as usize / 64;
            let w1 = (r.end as usize).div_ceil(64);
            bulk::bits(&take[w0..w1]).map(move |s| {
                let slot = (w0 * 64) as u32 + s;
                let r = line_at(slot);
                tiercache_engine::RestoreLine {
                    key: r.key,
                    slot,
                    valid: if verdict.all_clean { r.dirty } else { r.valid },
                    dirty: r.dirty,
                    class: 0,
                }
            })
        };
        // The age order is sorted (on the other core) while the engine takes the lines in
        // slot order, its slots split over the cores; then the policy is threaded in age
        // order.
        let threads = match cap {
            c if c >= 1 << 16 => rayon::current_num_threads(),
            _ => 1,
        };
        let ((), (refused, pending)) = rayon::join(
            || {
                // By slot (the decode's order, kept by `retain`): among equal sequence
                // numbers the slots ascend already.
                debug_assert!(order.windows(2).all(|w| (w[0] as u32) < (w[1] as u32)));
                bulk::radix_sort_above(&mut order, &mut scratch, 32)
            },
            || engine.restore_slots_in(threads, lines_in),
        );
        // Every line of `take` was restored or refused: these count the restored ones.
        let (mut restored, mut restored_dirty) = (engine.len(), engine.dirty_lines());
        lap.lap("age order | engine slots");
        // The sort buffer (one `u64` per candidate) lent to the index build: no fresh pages.
        engine.restore_age_in(pending, bulk::low_halves(&mut order), &mut scratch);
        drop(scratch);
        drop(order);
        // Failed pool members: their records read as empty (nothing was restored there);
        // the engine places nothing on them.
        for d in cache.failed_members() {
            let loss = engine.fail_device(d).map_err(|e| FormatError::BadField {
                field: "pool member",
                why: e.to_string(),
            })?;
            assert!(
                loss.uncovered.is_empty() && loss.dropped_clean == 0,
                "a line was restored on failed pool member {d}"
            );
        }
        // Copies of mirrored dirty lines (`crate::reconcile`): paired with their restored
        // lines again, promoted where their line's member is gone, the rest dropped. Every
        // copy slot's record is then brought to what the engine keeps there (`touched`).
        if !copies.is_empty() {
            let promoted = Self::restore_copies(
                &*cache,
                &mut engine,
                &disk,
                &copies,
                &flux,
                sb.data_offset,
                sb.line_size,
                sums.as_mut(),
                &mut report,
            )?;
            restored += promoted;
            restored_dirty += promoted;
            touched.extend(&copies);
        }
        lap.lap("engine policy");
        if let (Some((slot, e)), true) = (refused.first(), sb.clean) {
            return Err(FormatError::BadField {
                field: "metadata record",
                why: format!("slot {slot}: {e}; run `tiercache check --repair` on the cache device (the server stopped)"),
            });
        }
        report.dropped_bad_checksum += refused.len() as u64;
        touched.extend(refused.iter().map(|&(s, _)| s));
        report.restored = restored;
        report.restored_dirty = restored_dirty;
        drop(take);
        drop(changed);
        // The durable records are the engine's lines, except the slots `touched` below,
        // whose records as read are given to `update_record`: no slot diverges yet.
        let mut inner = Inner {
            engine,
            durable: durable::DurableKeys::new(cap),
            sb: sb.clone(),
            dirty_pages: BTreeSet::new(),
            seq: max_seq.wrapping_add(1),
            hdd_unsynced: BTreeMap::new(),
            hdd_undecided: BTreeMap::new(),
            hdd_unsynced_bytes: 0,
            in_plan: BTreeSet::new(),
            cache_unsynced: BTreeMap::new(),
            cache_dropped: BTreeMap::new(),
            slots: Vec::new(),
            closed: false,
            halted: false,
            cache_errors: 0,
            member_errors: vec![0; cache.pool_lines().len()],
            failed: false,
            lost: Vec::new(),
            ahead: HashMap::new(),
            unmapped_on_miss: false,
            degraded: None,
            sync_failing: None,
            failure_unrecorded: None,
            flux_pages: Default::default(),
            flush_epoch: FLUX_EPOCHS,
            forgotten: HashMap::new(),
            sums,
            list,
            failing: false,
            member_failing: None,
            class_table: opts.classes.clone(),
            class_source: if opts.classes.is_some() {
                "serve flags".into()
            } else {
                String::new()
            },
            class_loads: 0,
            wb: None,
            wb_error: None,
            fills: Vec::new(),
            next_fill: 0,
        };
        if let Some(s) = &inner.sums {
            inner.lost = s.lost.clone();
            if !s.lost.is_empty() {
                tracing::error!(
                    "{} volume range(s) hold damaged dirty data (reads fail until rewritten): {}",
                    s.lost.len(),
                    crate::volume_set::ranges_text(&opts.volumes, &s.lost)
                );
            }
        }
        if let Some(l) = &inner.list {
            crate::lost_list::LostList::log_ranges(&l.ranges, &opts.volumes);
            inner.lost = crate::lost_list::union(&inner.lost, &l.ranges);
        }
        let vol_lost_bytes = degrade::lost_bytes(&inner.lost);
        // Records the engine did not take (dropped ones) become empty in `mem`, and records
        // found in flux are rewritten as resolved, without the flag. Every other record
        // equals the engine's line already (`update_records` would leave it alone).
        let touched = if touch_all {
            (0..sb.capacity_lines as u32).collect()
        } else {
            touched.sort_unstable();
            touched.dedup();
            touched
        };
        // From here the volume keeps no record image: the engine journals each slot's state
        // before its first change until `update_records` takes it (`Inner::mem_record`).
        inner.engine.journal_lines(true);
        let rb = RECORD_BYTES as usize;
        for s in touched {
            let at = s as usize * rb;
            let have = Record::decode(&disk[at..at + rb]);
            let on_disk = have.map_or(EMPTY_KEY, |r| r.key);
            Self::update_record(&mut inner, s, have, on_disk);
        }
        drop(disk);
        inner.dirty_pages.extend(&flux_pages);
        lap.lap("update records");
        let line_shift = sb.line_size.trailing_zeros();
        let ram = match opts.ram_cache {
            0 => None,
            bytes => Some(
                ram::RamCache::new(
                    bytes,
                    sb.line_size,
                    opts.ram_policy
                        .as_deref()
                        .unwrap_or(tiercache_engine::DEFAULT_RAM_POLICY),
                    &inner.engine.config().policy_params,
                    inner.engine.config().mode,
                )
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
        };
        if let Some(r) = &ram {
            for v in &inner.engine.config().volumes {
                r.set_volume_mode(v.id, v.mode);
            }
        }
        let vol = CacheVolume {
            volumes: super::volumes::Served::new(opts.volumes.clone()),
            ram,
            size: backing.size(),
            cache,
            backing,
            io: RwLock::new(()),
            line_shift,
            data_offset: sb.data_offset,
            capacity_lines: sb.capacity_lines,
            metrics: Metrics::default(),
            stop: AtomicBool::new(false),
            inline_cleaning: AtomicBool::new(false),
            wb_rate: Mutex::new(WbRate {
                ctl: sb
                    .tuning
                    .and_then(|t| t.writeback)
                    .and_then(|(r, t)| tiercache_engine::RateController::new(r, t).ok())
                    .unwrap_or_default(),
                last: None,
                budget: 0.0,
                pass: RATE_PASS_LINES,
            }),
            classifiers: Default::default(),
            max_cache_errors: AtomicU64::new(DEFAULT_MAX_CACHE_ERRORS),
            unmap_batch: AtomicU64::new(DEFAULT_UNMAP_BATCH),
            state_path: opts.state_path.clone(),
            waiting: AtomicU64::new(0),
            clean_io: Mutex::new(()),
            wb_io: Mutex::new(Default::default()),
            wb_done: std::sync::Condvar::new(),
            fill_done: std::sync::Condvar::new(),
            unlocked_misses: AtomicBool::new(
                std::env::var_os("TIERCACHE_LOCKED_MISSES").is_none_or(|v| v != "1"),
            ),
            wb_waiters: AtomicU64::new(0),
            cache_sync_failures: AtomicU64::new(0),
            fg_backing: AtomicU64::new(0),
            pause: Default::default(),
            inner: Mutex::new(inner),
        };
        vol.metrics
            .lost_dirty_bytes
            .store(vol_lost_bytes, Ordering::Relaxed);
        vol.metrics
            .checksum_errors
            .store(report.damaged_clean_lines, Ordering::Relaxed);
        {
            let mut g = vol.lock();
            g.sb.clean = false;
            // Version 4 exactly while the list holds ranges (a crash may have left either
            // side of an update: the list is the truth).
            g.sb.lost_pending = g.list.as_ref().is_some_and(|l| !l.ranges.is_empty());
            g.sb.version = g.sb.current_version();
            vol.write_superblock(&mut g)?;
            let lost_now = vol.cache.lost_at_open();
            vol.lose_at_open(&mut g, &lost_now)?;
            if report.dropped_clean_lines > 0 {
                // The dropped lines' records, emptied in `mem`, reach the device now: a
                // crash must not bring the stale copies back.
                vol.flush_locked(&mut g)?;
            } else if !flux_pages.is_empty() {
                // Resolved records on the device at once: it agrees with the engine from the
                // start, and later in-place writes flag their pages afresh.
                vol.flush_cache(&mut g)?;
            }
            if dirty_outside_write_back(&g.engine) {
                // Every volume's dirty lines are written back (the cleaner works on the
                // pool), a write-back volume's too: more than needed, never less.
                vol.clean_all(&mut g)?;
                vol.flush_locked(&mut g)?;
            }
            if g.engine.unmirrored_lines() > 0 {
                vol.remirror_at_open(&mut g)?;
            }
        }
        lap.lap("superblock, flush");
        report.phases = lap.2;
        tracing::debug!("open phases (s): {:?}", report.phases);
        Ok((vol, report))
    }
}

impl CacheVolume {
    /// Dirty lines the open found with one cache copy while two members or more are live (a
    /// member failed before the stop, or a power cut caught their copy records before they
    /// were durable) get a copy again before anything is served, or are written back where
    /// no slot for a copy is left, and the result is made durable: the loss of one more
    /// member right after a restart must lose none of them (the cleaner would settle them
    /// only once serving). At most [`OPEN_REMIRROR_BYTES`] of lines: a larger backlog (a
    /// member lost with much of the cache dirty) is left to the cleaner, whose first step it
    /// is, and logged. A device error here is handled as in the cleaner (a member failed, its
    /// lines settled) and the volume serves on.
    fn remirror_at_open(&self, g: &mut Inner) -> io::Result<()> {
        let single = g.engine.unmirrored_lines();
        let budget = (OPEN_REMIRROR_BYTES >> self.line_shift).max(1);
        let mut passes = 0;
        while passes * super::clean::REMIRROR_PASS_LINES < budget && g.engine.unmirrored_lines() > 0
        {
            match self.mirror_single_pass(g) {
                Ok(true) => passes += 1,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(
                        "settling single-copy dirty lines at open: {e}; the cleaner goes on"
                    );
                    return Ok(());
                }
            }
        }
        if passes > 0 {
            self.flush_locked(g)?;
        }
        let left = g.engine.unmirrored_lines();
        if left > 0 {
            tracing::warn!(
                "{single} dirty lines had one cache copy at open: {left} left to the cleaner (one live member, or past the open's {} MiB)",
                OPEN_REMIRROR_BYTES >> 20
            );
        } else {
            tracing::info!(
                "{single} dirty lines had one cache copy at open: mirrored again or written back"
            );
        }
        Ok(())
    }

    /// Restores the copies of mirrored dirty lines found at open (`copies`: their slots,
    /// ascending; `flux`: the restored lines' slots whose record was in flux), after the
    /// engine took the lines and failed the failed members (`crate::reconcile`, plan (c)3
    /// and (c)4): a copy whose line is restored dirty with its dirty sectors pairs with it
    /// again; a line in flux first has its dirty sectors written to the copy (an in-place
    /// write may have changed one of them only: both hold the primary's bytes then); a copy
    /// whose line's member is failed or missing, no present member mapping it, becomes the
    /// line (valid = dirty = its sectors); any other copy is dropped (stale: its slot is
    /// free, its record emptied by the caller's `touched`). Returns the lines promoted.
    #[allow(clippy::too_many_arguments)]
    fn restore_copies(
        cache: &dyn BlockDev,
        engine: &mut Engine,
        disk: &[u8],
        copies: &[u32],
        flux: &[u32],
        data_offset: u64,
        line_size: u64,
        mut sums: Option<&mut DataSums>,
        report: &mut OpenReport,
    ) -> io::Result<u64> {
        use crate::reconcile::{self, MemberView, SlotRecord};
        let pool = engine.pool().clone();
        let members: Vec<MemberView> = (0..pool.members())
            .map(|d| match engine.device_failed(d) {
                true => MemberView::Failed,
                false => MemberView::Present,
            })
            .collect();
        let rb = RECORD_BYTES as usize;
        let records: Vec<SlotRecord> = copies
            .iter()
            .map(|&slot| {
                let at = slot as usize * rb;
                SlotRecord {
                    slot,
                    rec: Record::decode_trusted(&disk[at..at + rb]),
                    in_flux: false,
                }
            })
            .collect();
        let e = &*engine;
        let r = reconcile::reconcile_copies(&pool, &members, &records, |key| {
            let s = e.lookup(key)?;
            let rec = Record {
                key,
                valid: e.valid_mask(s),
                dirty: e.dirty_mask(s),
                seq: 0,
            };
            Some((s, rec, flux.binary_search(&s).is_ok()))
        });
        let ss = engine.sector_size();
        let mut line = vec![0u8; line_size as usize];
        for p in &r.resync {
            // The primary's dirty sectors to the copy (made durable by the open's next sync,
            // before anything is served).
            cache.read_at(&mut line, data_offset + u64::from(p.primary) * line_size)?;
            let base = data_offset + u64::from(p.copy) * line_size;
            let mut k = 0u64;
            while k < 64 && k * ss < line_size {
                if p.mask >> k & 1 == 0 {
                    k += 1;
                    continue;
                }
                let a = k;
                while k < 64 && k * ss < line_size && p.mask >> k & 1 == 1 {
                    k += 1;
                }
                let (lo, hi) = ((a * ss) as usize, (k * ss) as usize);
                cache.write_at(&line[lo..hi], base + lo as u64)?;
            }
            if let Some(s) = sums.as_deref_mut() {
                s.recompute(u64::from(p.copy), &line, p.mask);
            }
        }
        for p in r.paired.iter().chain(&r.resync) {
            match engine.restore_copy(p.key, p.primary, p.copy, p.mask) {
                Ok(()) => report.copies_paired += 1,
                Err(err) => {
                    tracing::warn!("copy of a mirrored dirty line dropped at open: {err}");
                    report.copies_dropped += 1;
                }
            }
        }
        report.copies_resynced = r.resync.len() as u64;
        for p in &r.promoted {
            engine
                .restore_line(p.key, p.slot, p.mask, p.mask, 0)
                .map_err(|err| {
                    io::Error::other(format!(
                        "the copy in slot {} of dirty line {:#x} (its cache device is gone) cannot be restored: {err}",
                        p.slot, p.key
                    ))
                })?;
            report.copies_promoted += 1;
        }
        report.copies_dropped += r.dropped.len() as u64;
        if !r.promoted.is_empty() {
            tracing::warn!(
                "{} mirrored dirty lines are served from their copies: their line's cache device is gone (they are re-mirrored when two members are live)",
                r.promoted.len()
            );
        }
        if !r.promoted.is_empty() || !r.dropped.is_empty() {
            tracing::info!(
                "mirrored dirty lines at open: {} copies paired ({} rewritten from their line), {} promoted (their line's cache device is gone), {} dropped (stale)",
                report.copies_paired,
                report.copies_resynced,
                report.copies_promoted,
                report.copies_dropped
            );
        }
        Ok(r.promoted.len() as u64)
    }
}

/// Whether a line is dirty whose volume is not in write-back (its own mode, else the
/// pool's): such a volume's backing device must hold what was acknowledged before it
/// serves, so the open writes it back. A write-back volume's dirty lines stay dirty in a
/// pool of another mode (cleaned later by the cleaner or `ctl flush`), as in a write-back
/// pool. Counted as every dirty line less those of write-back volumes, so a dirty line of
/// a volume the engine does not list is written back.
fn dirty_outside_write_back(e: &Engine) -> bool {
    let c = e.config();
    if c.volumes.is_empty() {
        return c.mode != Mode::WriteBack && e.dirty_lines() > 0;
    }
    let kept: u64 = e
        .volume_stats()
        .iter()
        .filter(|s| s.mode == Mode::WriteBack && c.volumes.iter().any(|v| v.id == s.id))
        .map(|s| s.dirty_lines)
        .sum();
    e.dirty_lines() > kept
}

/// Phase timer of the open: each `lap` records the wall time and the process's CPU time
/// (all threads) since the previous one.
struct Lap(std::time::Instant, f64, Vec<(&'static str, f64, f64)>);

impl Lap {
    fn new() -> Self {
        Lap(std::time::Instant::now(), cpu_seconds(), Vec::new())
    }

    fn lap(&mut self, name: &'static str) {
        let (now, cpu) = (std::time::Instant::now(), cpu_seconds());
        self.2
            .push((name, (now - self.0).as_secs_f64(), cpu - self.1));
        (self.0, self.1) = (now, cpu);
    }
}

/// User + system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}
