//! The RAM tier of a live volume (`serve --ram-cache`): the engine crate's
//! [`RamTier`] (which line sits in which RAM slot, its policy, the stale-fill guard) and the
//! bytes of its slots, behind one mutex of their own. A RAM hit takes only this mutex: not
//! the volume lock, not the cache device. The protocol (`tiercache_engine::ram_tier`) is run
//! by the NBD export (`export.rs`): reads ask here first and fill after a good read below;
//! writes, trims and write-zeroes invalidate before and after they run; a lost range clears
//! the tier (`fault.rs`), a mode switch resets it (`settings.rs`).

use super::*;
use tiercache_engine::policy::PolicyConfig;
use tiercache_engine::{RamCounters, RamTier};

pub(crate) struct RamCache {
    inner: Mutex<RamInner>,
    line_size: u64,
    /// Test hook ([`CacheVolume::set_ram_fill_hook`]): idle unless armed.
    fill_hook: FillHook,
    /// The policy's parameters (kept for [`RamCache::resize`]).
    params: PolicyConfig,
}

/// Called by a read between its read below and its fill, outside every lock, so a test
/// can run a write in that window (the race the fill's ticket check exists for).
#[derive(Default)]
struct FillHook {
    armed: AtomicBool,
    hook: Mutex<Option<RamFillHook>>,
}

/// A test's hook: called with the read's (offset, length) before it fills the RAM tier.
#[doc(hidden)]
pub type RamFillHook = Arc<dyn Fn(u64, u64) + Send + Sync>;

struct RamInner {
    tier: RamTier,
    /// `capacity x line` bytes: slot `s` holds its line at `s x line`. Allocated zeroed
    /// (untouched pages cost nothing until a fill writes them).
    data: Vec<u8>,
    /// Counters at the last statistics reset.
    base: RamCounters,
    slots: Vec<u32>,
    fills: Vec<(u32, u64)>,
    /// The volume is shut down or halted: nothing is served from RAM any more (a read goes
    /// below and fails there with the reason), nothing is filled.
    closed: bool,
}

/// The RAM tier in `ctl stats` and Prometheus: its size and policy, what it did, and the
/// read requests per tier (RAM hits, SSD hits, misses).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RamStats {
    pub capacity_bytes: u64,
    pub capacity_lines: u64,
    pub policy: String,
    pub cached_lines: u64,
    /// RAM the tier holds: its data buffer and its metadata (also in `ram_index_bytes`).
    pub data_bytes: u64,
    pub metadata_bytes: u64,
    /// Read requests, and where they were served: whole from RAM, whole from the SSD
    /// cache, or not (some line from the backing device). They add up to `read_requests`.
    pub read_requests: u64,
    pub ram_hits: u64,
    pub ssd_hits: u64,
    pub misses: u64,
    pub counters: RamCounters,
}

impl RamCache {
    pub(crate) fn new(
        bytes: u64,
        line_size: u64,
        policy: &str,
        params: &PolicyConfig,
        mode: Mode,
    ) -> Result<Self, String> {
        let params = PolicyConfig {
            classes: None,
            ..params.clone()
        };
        let mut tier = RamTier::new(bytes, line_size, policy, &params)?;
        let kept = params.clone();
        tier.set_mode(mode);
        let n = (tier.capacity_lines() * line_size) as usize;
        Ok(RamCache {
            inner: Mutex::new(RamInner {
                tier,
                data: vec![0u8; n],
                base: RamCounters::default(),
                slots: Vec::new(),
                fills: Vec::new(),
                closed: false,
            }),
            line_size,
            fill_hook: FillHook::default(),
            params: kept,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RamInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A read: when RAM holds every line of it, copies the bytes into `out` and returns true.
    pub(crate) fn read(&self, req: &Request, out: &mut [u8]) -> bool {
        let mut g = self.lock();
        let RamInner {
            tier,
            data,
            slots,
            closed,
            ..
        } = &mut *g;
        if *closed || !tier.read(req, slots) {
            return false;
        }
        let ls = self.line_size;
        let first = req.offset / ls;
        let mut done = 0usize;
        for (i, &s) in slots.iter().enumerate() {
            let line_start = (first + i as u64) * ls;
            let from = req.offset.max(line_start);
            let to = req.end().min(line_start + ls);
            let n = (to - from) as usize;
            let at = s as usize * ls as usize + (from - line_start) as usize;
            out[done..done + n].copy_from_slice(&data[at..at + n]);
            done += n;
        }
        debug_assert_eq!(done, out.len());
        true
    }

    /// The ticket a read that missed RAM takes before it goes below.
    pub(crate) fn ticket(&self) -> u64 {
        self.lock().tier.ticket()
    }

    /// A read that missed RAM succeeded with `buf` (the request's bytes): its whole lines go
    /// to RAM unless a write, trim or clear met them since `ticket`.
    pub(crate) fn fill(&self, req: &Request, ticket: u64, buf: &[u8]) {
        if self.fill_hook.armed.load(Ordering::Acquire) {
            let h = self
                .fill_hook
                .hook
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(h) = h {
                h(req.offset, req.len);
            }
        }
        let mut g = self.lock();
        let RamInner {
            tier,
            data,
            fills,
            closed,
            ..
        } = &mut *g;
        if *closed {
            return;
        }
        tier.fill(req, ticket, fills);
        let ls = self.line_size as usize;
        for &(slot, line_off) in fills.iter() {
            let from = (line_off - req.offset) as usize;
            let at = slot as usize * ls;
            data[at..at + ls].copy_from_slice(&buf[from..from + ls]);
        }
    }

    /// A write, trim or write-zeroes (before and after it runs).
    pub(crate) fn invalidate(&self, req: &Request) {
        self.lock().tier.invalidate(req);
    }

    /// The volume's content changed outside requests (a lost range): empty the tier.
    pub(crate) fn clear(&self) {
        self.lock().tier.clear();
    }

    /// The volume shut down or halted: empty, and serves and takes nothing from now on.
    pub(crate) fn close(&self) {
        let mut g = self.lock();
        if g.closed {
            return;
        }
        g.closed = true;
        g.tier.clear();
    }

    /// `ctl set ram-cache SIZE`: the tier at its new size, empty (it refills from reads);
    /// reads in flight fill nothing ([`RamTier::resized`]). The old buffer is freed.
    pub(crate) fn resize(&self, bytes: u64) -> Result<(), String> {
        let mut g = self.lock();
        if g.closed {
            return Err("the volume is shut down or halted".into());
        }
        let tier = g.tier.resized(bytes, &self.params)?;
        g.data = Vec::new();
        g.data = vec![0u8; (tier.capacity_lines() * self.line_size) as usize];
        g.tier = tier;
        Ok(())
    }

    /// The tier's size (`ctl get ram-cache`).
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.lock().tier.capacity_lines() * self.line_size
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        self.lock().tier.set_mode(mode);
    }

    /// Volume `id`'s own mode is now `mode` (None: the pool's): its lines leave RAM.
    pub(crate) fn set_volume_mode(&self, id: u32, mode: Option<Mode>) {
        self.lock().tier.set_volume_mode(id, mode);
    }

    pub(crate) fn reset_counters(&self) {
        let mut g = self.lock();
        g.base = g.tier.counters();
    }

    /// Heap bytes: (data buffer, metadata).
    pub(crate) fn mem_bytes(&self) -> (u64, u64) {
        let g = self.lock();
        (
            g.data.capacity() as u64,
            (g.tier.mem_bytes() + g.slots.capacity() * 4 + g.fills.capacity() * 16) as u64,
        )
    }

    /// The figures for `ctl stats`, beside the engine's counters `c` (reads that reached it).
    pub(crate) fn stats(&self, c: &Counters) -> RamStats {
        let (data_bytes, metadata_bytes) = self.mem_bytes();
        let g = self.lock();
        let k = g.tier.counters().saturating_sub(g.base);
        RamStats {
            capacity_bytes: g.tier.capacity_lines() * self.line_size,
            capacity_lines: g.tier.capacity_lines(),
            policy: g.tier.policy_name().to_string(),
            cached_lines: g.tier.len(),
            data_bytes,
            metadata_bytes,
            read_requests: k.hits + c.reads,
            ram_hits: k.hits,
            ssd_hits: c.read_requests.hits,
            misses: c.reads - c.read_requests.hits,
            counters: k,
        }
    }
}

/// `ctl get ram-cache` of a volume with `ram` (either layout).
pub(crate) fn size_setting(ram: Option<&RamCache>) -> String {
    match ram {
        Some(r) => crate::tuning::size_str(r.capacity_bytes()),
        None => "0 (no RAM tier: `serve --ram-cache SIZE` adds one)".into(),
    }
}

/// `ctl set ram-cache VALUE` on a volume with `ram` (either layout): resizes it (emptied).
/// A tier is neither added nor removed live: reads ask it without the volume lock, so it
/// is fixed at start (`serve --ram-cache`).
pub(crate) fn resize_setting(ram: Option<&RamCache>, value: &str) -> Result<(), String> {
    let bytes = tiercache_engine::parse_size(value.trim())
        .map_err(|e| format!("ram-cache {value:?}: {e}"))?;
    let Some(r) = ram else {
        return Err(
            "ram-cache: this volume has no RAM tier, and one is added only at start (reads ask it without the volume lock): restart `tiercache serve` with --ram-cache SIZE"
                .into(),
        );
    };
    if bytes == 0 {
        return Err(
            "ram-cache 0: the RAM tier is not removed live; shrink it (one line at least) or restart `tiercache serve` without --ram-cache"
                .into(),
        );
    }
    r.resize(bytes)
}

impl CacheVolume {
    /// Test hook: `hook` runs in every read that missed the RAM tier, after its read below
    /// returned and before it fills the tier, holding no lock (`None`: removes it). Does
    /// nothing without a RAM tier. Free when unset: one atomic load per fill.
    #[doc(hidden)]
    pub fn set_ram_fill_hook(&self, hook: Option<RamFillHook>) {
        if let Some(r) = &self.ram {
            let armed = hook.is_some();
            *r.fill_hook.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
            r.fill_hook.armed.store(armed, Ordering::Release);
        }
    }

    /// `ctl set ram-cache` ([`resize_setting`]).
    pub(super) fn set_ram_size(&self, value: &str) -> Result<(), String> {
        resize_setting(self.ram.as_ref(), value)
    }

    /// `ctl get ram-cache`.
    pub(super) fn ram_size_setting(&self) -> String {
        size_setting(self.ram.as_ref())
    }
}
