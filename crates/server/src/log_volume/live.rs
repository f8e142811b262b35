//! The log layout's side of the live contract (`crate::live::LiveVolume`): write-back of
//! every dirty line (`ctl flush`), mode changes and detach, settings, statistics reset.
//! Kept apart from the data path (`super`): these run under the volume's lock like a
//! request, and only through the rules of `super`'s module doc.

use super::*;
use crate::tuning;
use std::sync::atomic::Ordering;

/// The live counters since `b`, field by field (as `LogCounters::since`).
pub(super) fn live_since(a: &LogLiveCounters, b: &LogLiveCounters) -> LogLiveCounters {
    macro_rules! since {
        ($($f:ident),*) => { LogLiveCounters { $($f: a.$f.saturating_sub(b.$f)),* } };
    }
    since!(
        commits,
        checkpoints,
        journal_records_written,
        header_writes,
        header_rewrites,
        ssd_bytes_written,
        ssd_data_bytes_written,
        ssd_bytes_read,
        backing_bytes_read,
        backing_bytes_written,
        backing_syncs,
        cache_syncs,
        fingerprint_collisions,
        dedup_budget_skips,
        write_backs,
        extent_crc_errors,
        early_drops,
        early_drop_syncs,
        requests,
        pass_through_requests,
        failure_write_backs,
        unlocked_reads,
        unlocked_read_retries,
        backing_sync_errors,
        backing_resync_lines,
        discards,
        discard_bytes,
        discards_unsupported,
        discard_errors
    )
}

/// What `ctl set` says of a key the log layout does not take.
fn not_log(k: &str) -> String {
    match k {
        "line-size" | "policy" | "validity" => format!(
            "{k} is fixed when the log layout is formatted (`tiercache format --force --layout log`, discards the cache); the log layout changes live: mode, ram-cache, trim, free-reserve, reinsert-hits"
        ),
        _ => format!(
            "{k} does not apply to the log layout (it admits every missed line and writes dirty lines back when their segment is reclaimed); the log layout changes live: mode, ram-cache, trim, free-reserve, reinsert-hits"
        ),
    }
}

impl LogVolume {
    /// The latency histograms and client byte counts (`crate::metrics`).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// `ctl flush`: copies every dirty line to the backing device and syncs it, then drops
    /// those lines from the cache (see [`Inner::write_back_all`]); makes everything durable.
    /// Afterwards no dirty data is left in the cache.
    pub fn flush_dirty(&self) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        if g.pass_through || g.detached {
            return g.direct_sync().map_err(backing_fault);
        }
        g.sync_retry_now();
        let r = g.write_back_all();
        g.guard(r)
    }

    /// `ctl mode`: write-through, write-back, or pass-through (= [`LogVolume::detach`]).
    /// Leaving write-back writes back every dirty line first; pass-through also drops every
    /// cached line (requests then go to the backing device alone). The mode is stored in the
    /// superblock: a restart keeps it.
    pub fn set_mode(&self, mode: Mode) -> io::Result<()> {
        let mut g = self.lock();
        g.check_open()?;
        if g.pass_through {
            return Err(io_err(
                "the cache device failed: the volume passes through to the backing device until restarted with a newly formatted cache (`tiercache format --force --layout log`)",
            ));
        }
        g.sync_retry_now();
        let r = g.switch_mode(mode);
        let r = g.guard(r);
        // Emptied whether or not the switch went through (it may have dropped lines).
        self.ram_mode(&g);
        r
    }

    /// `ctl detach`: writes back dirty data, drops the cache's contents, passes through.
    pub fn detach(&self) -> io::Result<()> {
        self.set_mode(Mode::PassThrough)
    }

    /// The settings `ctl get` shows for the log layout (keys of [`tuning::KEYS`] that apply).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let g = self.lock();
        let mode = if g.pass_through || g.detached {
            Mode::PassThrough
        } else {
            g.sb.mode
        };
        let c = g.eng.config();
        vec![
            ("mode", mode.as_str().to_string()),
            ("policy", g.sb.picker.clone()),
            ("line-size", tuning::size_str(g.sb.line_size)),
            ("ram-cache", self.ram_size_setting()),
            ("trim", tuning::on_off(c.trim).to_string()),
            ("free-reserve", c.free_reserve.to_string()),
            ("reinsert-hits", c.reinsert_hits.to_string()),
        ]
    }

    /// The reclamation settings (`--trim`, `--free-reserve`, `--reinsert-hits`; see
    /// [`LogConfig`]), changed on the running volume, validated as `tiercache sim --layout
    /// log` validates them (a trimmed free reserve and reinsertion exclude each other).
    /// Per run: a restart takes serve's flags. A larger reserve fills as segments open.
    pub fn set_reclaim(
        &self,
        trim: bool,
        free_reserve: f64,
        reinsert_hits: u16,
    ) -> Result<(), String> {
        let mut g = self.lock();
        g.check_open().map_err(|e| e.to_string())?;
        g.eng
            .set_reclaim(trim, free_reserve, reinsert_hits)
            .map_err(|e| e.to_string())
    }

    /// The engine's configuration now (reclamation settings included).
    pub fn engine_config(&self) -> LogConfig {
        self.lock().eng.config().clone()
    }

    /// `ctl set` of a [`tuning::LOG_KEYS`] key.
    fn set_log_key(&self, k: &str, value: &str) -> Result<(), String> {
        let c = self.lock().eng.config().clone();
        let (mut trim, mut reserve, mut hits) = (c.trim, c.free_reserve, c.reinsert_hits);
        let v = value.trim();
        match k {
            "trim" => trim = tuning::parse_on_off(k, value)?,
            "free-reserve" => {
                reserve = v.parse().map_err(|_| {
                    format!("free-reserve {value:?}: give a share of the segments, 0..0.5")
                })?
            }
            "reinsert-hits" => {
                hits = v.parse().map_err(|_| {
                    format!("reinsert-hits {value:?}: give a number of hits, 0 (off)..65535")
                })?
            }
            _ => unreachable!("a log key"),
        }
        self.set_reclaim(trim, reserve, hits)
            .map_err(|e| format!("{k} {value:?}: {e}"))
    }

    /// `ctl set KEY VALUE`: `mode` changes live (stored in the superblock); every other key
    /// is refused with the reason. Returns (old, new).
    pub fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String> {
        if let Some(k) = tuning::log_key(key) {
            let get = |v: &LogVolume| {
                v.settings()
                    .into_iter()
                    .find(|x| x.0 == k)
                    .map(|x| x.1)
                    .unwrap_or_default()
            };
            let old = get(self);
            self.set_log_key(k, value)?;
            let new = get(self);
            self.metrics
                .settings_changes
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: tuning::LOG_TARGET, "setting {k}: {old} -> {new}");
            return Ok((old, new));
        }
        let k = tuning::key(key)?;
        if k == "ram-cache" {
            return self.set_ram_size(value);
        }
        if k != "mode" {
            return Err(not_log(k));
        }
        let get = |v: &LogVolume| v.settings()[0].1.clone();
        let old = get(self);
        let m: Mode = value.parse()?;
        self.set_mode(m)
            .map_err(|e| format!("mode {value:?}: {e}"))?;
        let new = get(self);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: tuning::LOG_TARGET, "setting mode: {old} -> {new}");
        Ok((old, new))
    }

    /// Settings changed live since the start.
    pub fn settings_changes(&self) -> u64 {
        self.metrics.settings_changes.load(Ordering::Relaxed)
    }

    /// `ctl stats --reset` (as `casadm -Z`): the engine's and the live counters, latency
    /// histograms and byte counts restart from 0; fault state (errors, failure, lost data,
    /// degraded) is kept, as in the direct layout.
    pub fn reset_stats(&self) {
        let mut g = self.lock();
        g.base = (*g.eng.counters(), g.live);
        g.class_base = (0..tiercache_engine::NUM_CLASSES as u8)
            .map(|c| *g.eng.class_counters(c))
            .collect();
        drop(g);
        self.ram_reset_counters();
        self.metrics.reset();
        tracing::info!(target: tuning::LOG_TARGET, "statistics reset");
    }
}

impl Inner {
    /// Copies every dirty line to the backing device and syncs it, then drops those lines
    /// from the cache (drop records, committed). The log layout cannot mark an extent clean
    /// in place, so a line written back here is read from the backing device next time (and
    /// cached clean then). Crash-safe: before the commit, recovery finds the lines dirty
    /// again with the same bytes already on the backing device; after it, they are gone and
    /// the backing device holds them (synced before the drops were written). A backing
    /// failure leaves them dirty (degraded, as a failed reclamation does, rule 8).
    pub(super) fn write_back_all(&mut self) -> io::Result<()> {
        let ls = self.ls();
        let dirty = self.dirty_in_lba_order();
        if !dirty.is_empty() {
            self.backing_sync_if_dirty().map_err(backing_fault)?;
            let mut buf = vec![0u8; ls as usize];
            let mut written = Vec::new();
            let mut r = Ok(());
            for &(line, info) in &dirty {
                r = match self.read_extent(&info, &mut buf) {
                    Ok(true) => self
                        .backing
                        .write_at(&buf, line * ls)
                        .map_err(backing_fault),
                    // Fails the request only (nothing changed): the line stays dirty.
                    Ok(false) => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "dirty line {line} (extent {}:{}) fails its checksum at write-back: its data is lost, write it again",
                            info.seg, info.off
                        ),
                    )),
                    Err(e) => Err(e),
                };
                if r.is_err() {
                    break;
                }
                written.push(line);
                self.live.write_backs += 1;
                self.live.backing_bytes_written += ls;
            }
            if r.is_ok() {
                // Counted as done only when it succeeded (a failed one as failed).
                r = match self.backing.sync() {
                    Ok(()) => {
                        self.live.backing_syncs += 1;
                        Ok(())
                    }
                    Err(e) => {
                        self.live.backing_sync_errors += 1;
                        Err(backing_fault(e))
                    }
                };
            }
            if let Err(e) = r {
                if matches!(fault_of(&e), Some(Fault::Backing(_))) {
                    // As `write_back_first`: the lines stay dirty; the unsynced backing
                    // writes must not become clean extents before a sync succeeds.
                    self.unsynced_lines.extend(written);
                    // Lines written through before it still need their sync.
                    self.hdd_dirty = !self.hdd_unsynced.is_empty();
                    self.backing_write_errors += 1;
                    Degraded::failed(&mut self.degraded, &e);
                }
                return Err(e);
            }
            self.hdd_dirty = false;
            self.unsynced_lines.clear();
            Degraded::healed(&mut self.degraded);
            Degraded::sync_healed(&mut self.sync_failing);
            for &(line, _) in &dirty {
                self.unmap(line)?;
            }
        }
        self.commit()?;
        debug_assert_eq!(
            self.eng.dirty_lines(),
            0,
            "dirty lines left after write-back"
        );
        Ok(())
    }

    /// See [`LogVolume::set_mode`].
    pub(super) fn switch_mode(&mut self, mode: Mode) -> io::Result<()> {
        let now = if self.detached {
            Mode::PassThrough
        } else {
            self.sb.mode
        };
        if mode == now {
            return Ok(());
        }
        if !matches!(
            mode,
            Mode::WriteThrough | Mode::WriteBack | Mode::PassThrough
        ) {
            return Err(io_err(format!(
                "the log layout runs write-through, write-back or pass-through (detached), not {mode}"
            )));
        }
        if self.detached {
            // Leaving pass-through: the writes passed through since the last backing sync
            // are in no cache and not in `hdd_unsynced`, so a later sync that failed and
            // dropped them would be followed by one that succeeds without them (the older
            // bytes served, nothing reported lost). Made durable (or reported lost) here.
            self.direct_sync().map_err(backing_fault)?;
        }
        if now == Mode::WriteBack {
            self.write_back_all()?;
        }
        if mode == Mode::PassThrough {
            // Requests will bypass the cache, so nothing cached may outlive them: every
            // line is dropped (durably) before the first one does. The backing device
            // holds their bytes (write-through, or written back above), synced first.
            self.backing_sync_if_dirty().map_err(backing_fault)?;
            let lines: Vec<u64> = self
                .eng
                .entries()
                .map(|(k, _)| LogEngine::key_line(k).1)
                .collect();
            for l in lines {
                self.unmap(l)?;
            }
            self.commit()?;
            self.detached = true;
        } else {
            self.commit()?;
            self.eng.set_mode(mode).map_err(io_err)?;
            self.detached = false;
        }
        self.sb.mode = mode;
        let b = self.sb.encode();
        self.cache_write(&b, 0)?;
        self.cache_sync()?;
        tracing::info!(target: crate::tuning::LOG_TARGET, "mode: {now} -> {mode}");
        Ok(())
    }
}
