//! Formatting a log-layout cache device, reading its superblock, opening it (recovery, salvage) and
//! shutting it down cleanly.

use super::*;

/// Formats `cache` as a log-layout cache for a backing device of `backing_size` bytes (its
/// identity is recorded at the first open; see [`format_log_for`]).
pub fn format_log(
    cache: &dyn BlockDev,
    backing_size: u64,
    o: &LogFormatOptions,
) -> io::Result<LogSuperblock> {
    format_log_for(cache, backing_size, None, o)
}

/// As [`format_log`], recording the backing device's identity (`BlockDev::identity`).
pub fn format_log_for(
    cache: &dyn BlockDev,
    backing_size: u64,
    backing: Option<BackingIdentity>,
    o: &LogFormatOptions,
) -> io::Result<LogSuperblock> {
    if o.segment_size < 2 * o.line_size {
        return Err(io_err(format!(
            "segment size {} must hold at least two lines of {} (extent caching is a simulator-only layout)",
            o.segment_size, o.line_size
        )));
    }
    if !matches!(o.mode, Mode::WriteThrough | Mode::WriteBack) {
        return Err(io_err(format!(
            "the log layout supports write-through and write-back, not {}",
            o.mode
        )));
    }
    let (segments, max_extents, records) =
        LogSuperblock::plan(cache.size(), o.line_size, o.segment_size, o.journal_records)
            .map_err(io_err)?;
    let sb = LogSuperblock {
        line_size: o.line_size,
        segment_size: o.segment_size,
        segments,
        max_extents,
        compression: o.compression,
        dedup_ratio: o.dedup_ratio,
        picker: o.picker.clone(),
        mode: o.mode,
        backing_size,
        journal_records: records,
        clean: true,
        backing: backing.unwrap_or_default(),
        uuid: rand::random(),
        lost_list: true,
        lost_pending: false,
    };
    engine_config(&sb).validate().map_err(io_err)?;
    let g = sb.geometry();
    // Both journal halves whole, not only their headers: records of a cache formatted over
    // carry epochs a new one reuses (1, 2, ...), and recovery would read them as this
    // cache's (before: `format --force` of a used log cache left it refusing to start,
    // "journal half 1 header damaged").
    let big = vec![0u8; 1 << 20];
    let (start, end) = (g.half_offset(0), g.half_offset(1) + g.half_bytes);
    let mut at = start;
    while at < end {
        let n = (end - at).min(big.len() as u64) as usize;
        cache.write_at(&big[..n], at)?;
        at += n as u64;
    }
    let zero = vec![0u8; 4096];
    for s in 0..segments as u32 {
        for slot in 0..2 {
            cache.write_at(&zero, g.slot_offset(s, slot))?;
        }
    }
    let at = g
        .lost_list
        .expect("a new layout reserves the lost-range list");
    crate::lost_list::LostList::format(cache, at)?;
    cache.sync()?;
    cache.write_at(&sb.encode(), 0)?;
    cache.sync()?;
    Ok(sb)
}

/// Reads a log superblock (None: the device is not in the log layout).
pub fn read_log_superblock(cache: &dyn BlockDev) -> io::Result<Option<LogSuperblock>> {
    let mut b = vec![0u8; SB_BYTES as usize];
    cache.read_at(&mut b, 0)?;
    if !LogSuperblock::is_log(&b) {
        return Ok(None);
    }
    LogSuperblock::decode(&b).map(Some).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e}: the log superblock (bytes 0..4096) is damaged and the layout cannot be read without it; `tiercache format --force` discards the cache (and its dirty data)"),
        )
    })
}

impl LogVolume {
    /// Opens a formatted log cache: recovers its indices from the segment headers and the
    /// journal (after a clean shutdown or a crash alike) and starts a new journal epoch.
    pub fn open(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_with(cache, backing, None)
    }

    /// As [`LogVolume::open`], with a test hook replacing the engine's 64-bit fingerprint of
    /// a digest (to force fingerprint collisions).
    pub fn open_with(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        fp_hook: Option<fn(&Hash) -> u64>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_full(cache, backing, fp_hook, &LogOpenOptions::default())
    }

    /// As [`LogVolume::open`], with what to accept about the backing device.
    pub fn open_opts(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        opts: &LogOpenOptions,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        Self::open_full(cache, backing, None, opts)
    }

    /// As [`LogVolume::open`], but damage (see the module doc, rule 6) does not stop it: every
    /// journal record that still verifies is replayed (a base record after a lost one leaves
    /// a gap in its segment), damaged header slots are zeroed, and the report lists the
    /// damage and what it may cost. `tiercache check` runs it on a copy-on-write view;
    /// `tiercache check --repair` on the device, then shuts down cleanly. No backing device
    /// is compared (offline).
    pub fn open_salvage(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        let o = LogOpenOptions {
            offline: true,
            salvage: true,
            ..Default::default()
        };
        Self::open_full(cache, backing, None, &o)
    }

    fn open_full(
        cache: Box<dyn BlockDev>,
        backing: Box<dyn BlockDev>,
        fp_hook: Option<fn(&Hash) -> u64>,
        opts: &LogOpenOptions,
    ) -> io::Result<(LogVolume, LogOpenReport)> {
        let cache: Arc<dyn BlockDev> = Arc::from(cache);
        let salvage = opts.salvage;
        let mut sb =
            read_log_superblock(&*cache)?.ok_or_else(|| io_err("not a log-layout cache device"))?;
        if let Some(p) = &opts.state_path {
            degrade::refuse_failed(p, &sb.uuid)?;
        }
        if backing.size() != sb.backing_size {
            return Err(io_err(format!(
                "the cache belongs to a backing device of {} bytes, but the backing device has {} bytes",
                sb.backing_size,
                backing.size()
            )));
        }
        // The identity is checked before anything is written; recovery records it.
        let mut backing_note = None;
        if let Some(given) = backing.identity() {
            backing_note = crate::identity::verify(&sb.backing, &given, opts.accept_backing_rename)
                .map_err(|(recorded, given)| {
                    io_err(crate::format::FormatError::WrongBacking { recorded, given })
                })?;
            sb.backing = given;
        }
        if sb.uuid == [0; 16] && !opts.offline {
            // A superblock older than version 3: it gets its uuid now (a state file names
            // the cache by it), durably before anything could fail.
            rand::Rng::fill(&mut rand::thread_rng(), &mut sb.uuid[..]);
            cache.write_at(&sb.encode(), 0)?;
            cache.sync()?;
        }
        // The lost-range list (`crate::lost_list`): read back, or written empty at the first
        // open of a cache formatted before it when the slack after the journal holds it
        // (durable before the superblock says it exists).
        let list = if sb.lost_list {
            let at = sb
                .geometry()
                .lost_list
                .expect("reserved by the flag's layout");
            match crate::lost_list::LostList::load(&*cache, at) {
                Ok(l) => Some(l),
                // Offline (`check`, `check --repair`): a damaged list does not stop the rest
                // of the check; `crate::log_check` reports it as a problem (as the direct
                // layout's check does; no log line, the report carries it) and nothing here
                // writes the list.
                Err(e) if opts.offline && e.kind() == io::ErrorKind::InvalidData => None,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cache device (log layout): {e}"),
                    ))
                }
            }
        } else {
            let old = sb.geometry();
            let with = LogSuperblock {
                lost_list: true,
                ..sb.clone()
            }
            .geometry();
            match with.lost_list.filter(|_| with.seg_area == old.seg_area) {
                Some(at) if !opts.offline => {
                    let l = crate::lost_list::LostList::adopt_or_format(&*cache, at)?;
                    cache.sync()?;
                    sb.lost_list = true;
                    cache.write_at(&sb.encode(), 0)?;
                    cache.sync()?;
                    tracing::info!(
                        "log cache formatted before the lost-range list: the list set up at cache bytes {at}..{} (upgrade)",
                        at + crate::lost_list::BYTES
                    );
                    Some(l)
                }
                Some(_) => None,
                None => {
                    tracing::warn!(
                        "this log cache was formatted before the lost-range list and has no room for it (segment area at byte {}): ranges reported lost are forgotten at a restart and then read the backing device's older bytes. `tiercache format --force` the cache device (after a clean shutdown) to get the list",
                        old.seg_area
                    );
                    None
                }
            }
        };
        // Version 4 exactly while the list holds ranges (a crash may have left either side
        // of an update: the list is the truth); written now if it disagrees.
        let pending = list.as_ref().is_some_and(|l| !l.ranges.is_empty());
        if pending != sb.lost_pending && !opts.offline {
            sb.lost_pending = pending;
            cache.write_at(&sb.encode(), 0)?;
            cache.sync()?;
        }
        let geo = sb.geometry();
        if cache.size() < geo.device_bytes(sb.segments) {
            return Err(io_err(format!(
                "cache device of {} bytes is smaller than its format ({} bytes)",
                cache.size(),
                geo.device_bytes(sb.segments)
            )));
        }
        let mut eng = LogEngine::new(engine_config(&sb)).map_err(io_err)?;
        eng.set_deferred_fill(true);
        eng.set_record_plan(true);
        let red = Reducer::new(sb.compression)?;
        let r = sb.journal_records;
        let commit_every = (r / 16).max(16);
        // A checkpoint lists the open segments' extents (at most 2 x max), the duplicate
        // entries and the pending drops (a commit's worth, plus a reclaimed segment's extents;
        // duplicates written back become drops one for one): it always fits a half.
        let dup_budget = r.saturating_sub(3 * sb.max_extents as u64 + 2 * commit_every);
        let mut inner = Inner {
            cache: cache.clone(),
            backing,
            geo,
            eng,
            red,
            segs: vec![SegMeta::default(); sb.segments as usize],
            bufs: HashMap::new(),
            spare: Vec::new(),
            pending: Vec::new(),
            hdr_stale: BTreeSet::new(),
            drops_since_rewrite: 0,
            dead_log: Vec::new(),
            seq: 1,
            epoch: 0,
            half: 0,
            jused: 0,
            hdd_dirty: false,
            hdd_unsynced: Default::default(),
            resync: false,
            dups_upper: 0,
            dups_at_checkpoint: 0,
            dup_budget,
            commit_every,
            fp_hook,
            live: LogLiveCounters::default(),
            stored: Vec::new(),
            scratch: Vec::new(),
            closed: false,
            halted: false,
            failed: false,
            salvage,
            shadowed: Default::default(),
            fresh_dups: Default::default(),
            dropped_now: Default::default(),
            degraded: None,
            sync_failing: None,
            cache_errors: 0,
            max_cache_errors: DEFAULT_MAX_CACHE_ERRORS,
            backing_errors: 0,
            backing_write_errors: 0,
            pass_through: false,
            lost: list.as_ref().map(|l| l.ranges.clone()).unwrap_or_default(),
            list,
            direct_unsynced: Vec::new(),
            state_path: opts.state_path.clone(),
            failure_unrecorded: None,
            unsynced_lines: Default::default(),
            detached: sb.mode == Mode::PassThrough,
            base: Default::default(),
            class_base: vec![Default::default(); tiercache_engine::NUM_CLASSES],
            class_table: None,
            class_source: String::new(),
            class_loads: 0,
            req_class: 0,
            recovery_sample: Default::default(),
            ram: None,
            ram_lost_seen: (0, 0),
            sb,
        };
        crate::lost_list::LostList::log_ranges(&inner.lost, &[]);
        let mut rep = inner.recover()?;
        rep.backing_note = backing_note;
        if !opts.offline {
            inner.verify_clean_sample(&mut rep, opts)?;
            inner.recovery_sample = RecoverySample {
                sampled_clean_lines: rep.sampled_clean_lines,
                differing_clean_lines: rep.differing_clean_lines,
                dropped_clean_lines: rep.dropped_clean_lines,
                unreadable_clean_lines: rep.unreadable_clean_lines,
            };
        }
        let size = inner.sb.backing_size;
        let line = inner.sb.line_size;
        let compression = inner.sb.compression;
        let geo = inner.geo;
        Ok((
            LogVolume {
                inner: Mutex::new(inner),
                size,
                line,
                metrics: Default::default(),
                cache,
                reducers: Mutex::new(Vec::new()),
                compression,
                geo,
                hooks: RaceHooks::default(),
                classifier: None,
                ram: None,
            },
            rep,
        ))
    }

    /// Commits, marks the superblock clean and syncs. The volume fails every call after.
    pub fn shutdown(&self) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        if g.pass_through {
            // Not marked clean: the failure is recorded (state file, erased superblock).
            g.closed = true;
            return g.direct_sync().map_err(backing_fault);
        }
        g.sync_retry_now();
        let r = g.commit();
        g.guard(r)?;
        let r = (|| -> io::Result<()> {
            g.write_end()?;
            g.sb.clean = true;
            let b = g.sb.encode();
            g.cache_write(&b, 0)?;
            g.cache_sync()
        })();
        if r.is_err() {
            // Not stopped cleanly: a later superblock write (`ctl mode`) must not say so.
            g.sb.clean = false;
        }
        // A cache-device error fails the cache (rule 8) as it would in any request.
        g.guard(r)?;
        g.closed = true;
        Ok(())
    }
}
