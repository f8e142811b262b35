//! The RAM tier above a log-layout cache (`serve --layout log --ram-cache`): the same
//! [`RamCache`] as the direct layout's (`crate::volume::ram`), run by the same protocol
//! (`tiercache_engine::ram_tier`): a read asks it first (a hit takes neither the volume lock
//! nor the cache device) and fills it after a good read below; a write, trim or write-zeroes
//! invalidates its lines before it runs and again after ([`RamInvalidate`]); a mode switch
//! resets it; a lost range clears it and a shutdown, halt or stop closes it
//! ([`Inner::ram_watch`], run each time the volume lock is released). The log layout's own
//! RAM (the open segments' buffers) is below it: a hit there is an SSD-tier hit.

use super::*;
use crate::volume::ram::{RamCache, RamStats};

/// Invalidates a request's lines in the RAM tier when made and again when dropped: around a
/// write or trim, whatever way it returns.
pub(super) struct RamInvalidate<'a> {
    ram: Option<(&'a RamCache, Request)>,
}

impl Drop for RamInvalidate<'_> {
    fn drop(&mut self) {
        if let Some((r, req)) = &self.ram {
            r.invalidate(req);
        }
    }
}

impl LogVolume {
    /// Puts a RAM tier of `bytes` (whole lines; at least one) above the cache, under the
    /// named policy (default `tiercache_engine::DEFAULT_RAM_POLICY`). Call before the volume
    /// is shared. The error names the option at fault.
    pub fn set_ram_cache(&mut self, bytes: u64, policy: Option<&str>) -> Result<(), String> {
        let mode = {
            let g = self.lock();
            if g.pass_through || g.detached {
                Mode::PassThrough
            } else {
                g.sb.mode
            }
        };
        let ram = Arc::new(RamCache::new(
            bytes,
            self.line,
            policy.unwrap_or(tiercache_engine::DEFAULT_RAM_POLICY),
            &Default::default(),
            mode,
        )?);
        self.lock().ram = Some(Arc::clone(&ram));
        self.ram = Some(ram);
        Ok(())
    }

    /// The RAM tier's figures beside the engine's read counters `c` (`ctl stats`).
    pub fn ram_stats(&self, c: &tiercache_engine::Counters) -> Option<RamStats> {
        self.ram.as_ref().map(|r| r.stats(c))
    }

    /// Heap bytes of the RAM tier's metadata (0 without one; in `ram_index_bytes`).
    pub(super) fn ram_metadata_bytes(&self) -> u64 {
        self.ram.as_ref().map_or(0, |r| r.mem_bytes().1)
    }

    /// A read served whole from the RAM tier (`Ok`), or the ticket its fill needs
    /// after it is read below. Not once a panic poisoned the volume lock: the read goes
    /// below and fails there.
    pub(super) fn ram_read(&self, req: &Request, buf: &mut [u8]) -> Result<(), Option<u64>> {
        match &self.ram {
            Some(r) if !self.inner.is_poisoned() && r.read(req, buf) => Ok(()),
            Some(r) => Err(Some(r.ticket())),
            None => Err(None),
        }
    }

    /// A read that missed the RAM tier succeeded with `buf`: its whole lines go there.
    pub(super) fn ram_fill(&self, req: &Request, ticket: Option<u64>, buf: &[u8]) {
        if let (Some(r), Some(t)) = (&self.ram, ticket) {
            r.fill(req, t, buf);
        }
    }

    /// Invalidates `req`'s lines now and again when the returned guard is dropped.
    pub(super) fn ram_invalidating(&self, req: Request) -> RamInvalidate<'_> {
        RamInvalidate {
            ram: self.ram.as_deref().map(|r| {
                r.invalidate(&req);
                (r, req)
            }),
        }
    }

    /// The write mode in force changed (or a switch was tried): the tier restarts empty, and
    /// fills only outside pass-through.
    pub(super) fn ram_mode(&self, g: &Inner) {
        if let Some(r) = &self.ram {
            r.set_mode(if g.pass_through || g.detached {
                Mode::PassThrough
            } else {
                g.sb.mode
            });
        }
    }

    /// `ctl get ram-cache`.
    pub(super) fn ram_size_setting(&self) -> String {
        crate::volume::ram::size_setting(self.ram.as_deref())
    }

    /// `ctl set ram-cache VALUE` (`crate::volume::ram::resize_setting`): (old, new).
    pub(super) fn set_ram_size(&self, value: &str) -> Result<(String, String), String> {
        let old = self.ram_size_setting();
        crate::volume::ram::resize_setting(self.ram.as_deref(), value)?;
        let new = self.ram_size_setting();
        self.metrics
            .settings_changes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(target: crate::tuning::LOG_TARGET, "setting ram-cache: {old} -> {new}");
        Ok((old, new))
    }

    pub(super) fn ram_reset_counters(&self) {
        if let Some(r) = &self.ram {
            r.reset_counters();
        }
    }
}

impl Inner {
    /// Run whenever the volume lock is released: a volume that stopped (shut down, halted,
    /// or failed) serves nothing more from RAM; ranges newly reported lost empty the tier
    /// (their reads fail below, the RAM tier must not answer them).
    pub(super) fn ram_watch(&mut self) {
        let Some(r) = &self.ram else {
            return;
        };
        if self.closed || self.halted || self.failed {
            r.close();
            return;
        }
        if self.lost.is_empty() && self.ram_lost_seen == (0, 0) {
            return;
        }
        let now = (self.lost.len(), degrade::lost_bytes(&self.lost));
        if now != self.ram_lost_seen {
            // (Also when a range is written again: rare, and emptying is always safe.)
            self.ram_lost_seen = now;
            r.clear();
        }
    }
}
