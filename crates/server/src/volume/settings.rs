//! Runtime settings (`ctl set`/`ctl get`), mode changes, detach and clean shutdown.

use super::*;

impl CacheVolume {
    /// Changes the write mode; leaving write-back writes back every dirty line first.
    pub fn set_mode(&self, mode: Mode) -> io::Result<()> {
        // No write-back in flight from here on (its lines would look clean to `clean_all`).
        let _owner = self.clean_owner();
        let mut g = self.lock();
        if g.closed {
            return Err(ioerr(g.closed_reason()));
        }
        // The switch drops or writes back lines: no fill may be in flight.
        self.reap_fills(&mut g);
        if g.failed {
            // The engine must keep saying pass-through: that is what is in force.
            return Err(ioerr(
                "the cache device failed: the volume passes through to the backing device (mode pass-through) until restarted with a newly formatted cache (`tiercache format --force`)",
            ));
        }
        if mode == Mode::WriteBack {
            if let Some(why) = self.single_copy_write_back(&g) {
                return Err(ioerr(why));
            }
        }
        // Several volumes: `ctl mode` (and `ctl detach`) sets every volume's mode.
        if !g.engine.config().volumes.is_empty() {
            g.engine
                .retune(|c| c.volumes.iter_mut().for_each(|v| v.mode = None))
                .map_err(ioerr)?;
        }
        if mode != Mode::WriteBack {
            self.clean_all(&mut g)?;
            self.flush_locked(&mut g)?;
        }
        g.engine.set_mode(mode);
        if let Some(r) = &self.ram {
            r.set_mode(mode);
            // Every volume follows the pool's mode now (above).
            for v in &g.engine.config().volumes {
                r.set_volume_mode(v.id, None);
            }
        }
        g.sb.mode = mode_index(mode);
        // Every volume follows the pool's mode at the next start too.
        g.sb.vol_tuning.iter_mut().for_each(|t| t.mode = None);
        g.sb.volumes.iter_mut().for_each(|e| e.set_added_mode(None));
        g.sb.vol_tuning.retain(|t| !t.is_empty());
        self.write_superblock(&mut g)
    }

    /// Why a live switch to write-back is refused on a pool of cache devices: its engine
    /// keeps one cache copy of each dirty line (it was built for another mode, and the copy
    /// count is fixed when an engine is built), while the pool never chose one copy
    /// (`--dirty-copies 1`). Switched anyway, it would run silently unmirrored: the loss of a
    /// member would lose acknowledged writes, which `serve --mode write-back` on the same pool
    /// never does (plan-multi-cache (c)2).
    pub(super) fn single_copy_write_back(&self, g: &Inner) -> Option<String> {
        let members = self.cache.pool_lines().len();
        if members < 2 || g.engine.config().dirty_copies >= 2 || self.cache.dirty_copies() == 1 {
            return None;
        }
        Some(format!(
            "this pool of {members} cache devices runs with one cache copy of each dirty line (it was started in {} mode): switched live to write-back, the loss of one member would lose dirty data. Restart it with `serve --mode write-back` (each dirty line mirrored on two members), or choose one copy for good with `serve --mode write-back --dirty-copies 1`",
            g.engine.config().mode
        ))
    }

    /// Writes back dirty data, then passes everything through (`ctl detach`).
    pub fn detach(&self) -> io::Result<()> {
        self.set_mode(Mode::PassThrough)
    }

    /// Every setting `ctl get` shows ([`tuning::KEYS`] order), with its value now.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        tuning::KEYS
            .iter()
            .map(|&(k, ..)| (k, self.setting_now(k)))
            .collect()
    }

    /// A setting's value now, the rate controller's included.
    fn setting_now(&self, k: &str) -> String {
        let (mode, target, rate) = self.writeback_rate();
        match k {
            "writeback-rate" => match mode {
                tiercache_engine::WritebackRate::Auto => format!("auto ({rate:.0} lines/s now)"),
                m => m.to_string(),
            },
            "writeback-target" => target.to_string(),
            "ram-cache" => self.ram_size_setting(),
            _ => Self::setting(&self.lock(), k),
        }
    }

    /// `ctl set` of a setting of the cleaner ([`tuning::CLEANER_KEYS`]), stored by the
    /// cleaner's setters.
    fn set_unstored(&self, k: &str, value: &str) -> Result<(), String> {
        let (mode, target, _) = self.writeback_rate();
        match k {
            "cleaning" => self.set_cleaning(value.parse()?, None),
            "cleaning-age" => {
                let a = value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("cleaning-age {value:?}: give a number of requests"))?;
                let p = self.lock().engine.config().cleaning;
                self.set_cleaning(p, Some(a))
            }
            "writeback-rate" => self.set_writeback_rate(value.parse()?, target),
            "writeback-target" => {
                let t = value.trim().parse::<f64>().map_err(|_| {
                    format!("writeback-target {value:?}: give a dirty share between 0 and 1")
                })?;
                self.set_writeback_rate(mode, t)
            }
            _ => Err(format!("{k} is not a setting of the cleaner")),
        }
    }

    fn setting(g: &Inner, k: &str) -> String {
        let c = g.engine.config();
        match k {
            "mode" => c.mode.as_str().to_string(),
            "policy" => g.engine.policy_name().to_string(),
            "line-size" => tuning::size_str(c.line_size),
            "validity" => c.validity.as_str().to_string(),
            "cleaning" => c.cleaning.as_str().to_string(),
            "cleaning-age" => c.cleaning_age.to_string(),
            "classes" => match &g.class_table {
                None => {
                    "none (classes by id; --policy dss uses the built-in file-system table)".into()
                }
                Some(t) if g.class_loads == 0 => {
                    format!(
                        "{} from {}",
                        crate::classify::table_summary(t),
                        g.class_source
                    )
                }
                Some(t) => format!(
                    "{} from {} (loaded live, {} time(s))",
                    crate::classify::table_summary(t),
                    g.class_source,
                    g.class_loads
                ),
            },
            _ => Tuning::of(c).get(k).unwrap_or_default(),
        }
    }

    /// `ctl set KEY VALUE`: changes a per-run setting on the running volume (the value
    /// parsed as `tiercache sim` parses the flag of the same name), stores it in the
    /// superblock so a restart keeps it, logs `old -> new`; returns (old, new). Settings fixed
    /// at format or start (line size, policy, SLRU share) are refused with what to do.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<(String, String), String> {
        let k = tuning::key(key)?;
        let (_, what, live) = *tuning::KEYS.iter().find(|x| x.0 == k).expect("known key");
        if k == "classes" {
            return Err(format!(
                "classes is a table, not a value: `tiercache ctl --control SOCK classes load FILE` ({what})"
            ));
        }
        if !live {
            return Err(format!("{k} cannot change on a running volume: {what}"));
        }
        let old = self.setting_now(k);
        if tuning::CLEANER_KEYS.contains(&k) {
            self.set_unstored(k, value)?;
        } else if k == "ram-cache" {
            self.set_ram_size(value)?;
        } else if k == "mode" {
            let m: Mode = value.parse()?;
            self.set_mode(m)
                .map_err(|e| format!("mode {value:?}: {e}"))?;
        } else {
            let mut g = self.lock();
            if g.closed {
                return Err(g.closed_reason().into());
            }
            self.reap_fills(&mut g);
            let t = Tuning::of(g.engine.config()).with(k, value)?;
            g.engine
                .retune(|c| t.apply(c))
                .map_err(|e| format!("{k} {value:?}: {e}"))?;
            // The write-back rate is the volume's (not in the engine's settings): kept.
            g.sb.tuning = Some(Tuning {
                writeback: g.sb.tuning.and_then(|s| s.writeback),
                ..t
            });
            if let Err(e) = self.write_superblock(&mut g) {
                tracing::warn!("setting {k}: {old} -> {value} applied but not stored: {e}");
                return Err(format!(
                    "{k} is {value} now, but storing it in the superblock failed ({e}): a restart goes back to {old}"
                ));
            }
        }
        let new = self.setting_now(k);
        self.metrics
            .settings_changes
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: tuning::LOG_TARGET, "setting {k}: {old} -> {new}");
        Ok((old, new))
    }

    /// `ctl stats --reset` (as `casadm -Z`): zeroes the engine's counters and the latency
    /// histograms and event counts; fault state (errors, failure, lost data) is kept.
    pub fn reset_stats(&self) {
        self.lock().engine.reset_counters();
        if let Some(r) = &self.ram {
            r.reset_counters();
        }
        self.metrics.reset();
        tracing::info!(target: tuning::LOG_TARGET, "statistics reset");
    }

    /// Clean shutdown: everything durable, the superblock marked clean. Later calls fail.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        // Waits for a cleaning pass in flight to commit: the flush below covers it.
        let _owner = self.clean_owner();
        let mut g = self.lock();
        // Fills in flight commit (or are dropped) before the last flush.
        self.reap_fills(&mut g);
        if g.halted {
            // Nothing written from a half-updated state: the superblock stays "not clean",
            // so the next open recovers as after a crash.
            return Err(ioerr(crate::live::HALTED));
        }
        if g.closed {
            return Ok(());
        }
        // Lines unmapped ahead are mapped again: a clean restart keeps them. Every page in
        // flux retires (rewritten without flags).
        for e in g.flux_pages.values_mut() {
            *e = 0;
        }
        let ahead = g.end_ahead();
        g.slots = ahead;
        Self::update_records(&mut g);
        self.flush_locked(&mut g)?;
        if g.failed {
            g.closed = true;
            if let Some(r) = &self.ram {
                r.close();
            }
            return Ok(());
        }
        g.sb.clean = true;
        self.write_superblock(&mut g)?;
        g.closed = true;
        if let Some(r) = &self.ram {
            r.close();
        }
        Ok(())
    }
}
