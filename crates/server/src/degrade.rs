//! Fault handling both layouts share (issue 14 items 1 and 6, issue 19 item 1): the degraded
//! state while the backing device fails write-backs, the volume ranges whose dirty data a
//! failed cache lost, and recording a cache failure durably.
//!
//! * **Degraded** ([`Degraded`]): a write-back failed, or (`Degraded::sync_failed`) a backing
//!   sync failed. Dirty data stays in the cache and is
//!   served from it; only clean data is evicted (direct layout) or reclaimed (log layout:
//!   segments holding dirty data are never reclaimed); write-backs are retried after a
//!   backoff doubling from [`RETRY_MIN`] to [`RETRY_MAX`]; writes that find no room fail with
//!   the backing device's error (ENOSPC or EIO), never by dropping dirty data.
//! * **Lost ranges** ([`lose`], [`unlose`], [`lost_check`]): volume byte ranges whose dirty
//!   data could not be read back from a failing cache device; reads of them fail (never
//!   stale data) until they are written again.
//! * **Failure record** ([`record_failure`]): a failed cache is recorded in its state file
//!   (`crate::state_file`) and its superblock erased, so a restart never restores lines older
//!   than what went to the backing device since.

use crate::dev::BlockDev;
use crate::state_file::{self, FailState};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// First and largest pause between retries of failed write-backs.
pub const RETRY_MIN: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The backing device is failing write-backs.
#[derive(Clone, Debug)]
pub struct Degraded {
    pub since: Instant,
    /// The last backing error, as the client would see it (EIO or ENOSPC).
    pub last_error: String,
    /// Its kind: writes refused for lack of room fail with it (ENOSPC stays ENOSPC).
    pub last_kind: io::ErrorKind,
    pub failures: u64,
    pub backoff: Duration,
    pub retry_at: Instant,
}

impl Degraded {
    /// The state just entered at `now`, before its first failure is counted.
    fn entered(now: Instant) -> Self {
        Degraded {
            since: now,
            last_error: String::new(),
            last_kind: io::ErrorKind::Other,
            failures: 0,
            backoff: RETRY_MIN / 2,
            retry_at: now,
        }
    }

    /// Counts failure `e` (the last error and its kind are what clients are told).
    fn count(&mut self, e: &io::Error) {
        self.failures += 1;
        self.last_error = e.to_string();
        self.last_kind = e.kind();
    }

    /// Enters (`d` is `None`: logs it) or stays in the degraded state after write-back error
    /// `e`: the next retry is due after the backoff, doubled up to [`RETRY_MAX`].
    pub fn failed(d: &mut Option<Degraded>, e: &io::Error) {
        let now = Instant::now();
        let d = d.get_or_insert_with(|| {
            tracing::error!(
                "backing device failed a write-back ({e}): volume DEGRADED — dirty data stays in the cache and is retried (every {} ms up to {} s); only clean data is evicted, and writes that find no room fail",
                RETRY_MIN.as_millis(),
                RETRY_MAX.as_secs()
            );
            Degraded::entered(now)
        });
        d.count(e);
        d.backoff = (d.backoff * 2).min(RETRY_MAX);
        d.retry_at = now + d.backoff;
    }

    /// Leaves the degraded state (write-backs succeed again); whether it was degraded.
    pub fn healed(d: &mut Option<Degraded>) -> bool {
        match d.take() {
            Some(d) => {
                tracing::warn!(
                    "backing device accepts write-backs again after {} failures in {:.1} s: volume no longer degraded",
                    d.failures,
                    d.since.elapsed().as_secs_f64()
                );
                true
            }
            None => false,
        }
    }

    /// Enters (logs it) or stays in the state "backing syncs failing" after sync error `e`
    /// (both layouts: a failed sync may have dropped the writes since the last good one, so
    /// nothing that needs one may be acknowledged: the log layout's seals (rule 2) and the
    /// direct layout's slot reuse (rule 4), FLUSH and FUA). After the first failure the next
    /// sync is tried at once (a one-off error, e.g. a dropped writeback, costs one request);
    /// after each later one the next attempt is due after the backoff, [`RETRY_MIN`]
    /// doubling up to [`RETRY_MAX`] ([`Degraded::sync_backoff_error`] until then). Later
    /// failures are logged at the 2nd, 4th, 8th, ... one (rate-limited), each with the count.
    pub fn sync_failed(d: &mut Option<Degraded>, e: &io::Error) {
        let entering = d.is_none();
        if entering {
            tracing::error!(
                "backing device sync failed ({e}): volume DEGRADED — requests that need a backing sync (FLUSH, FUA, and writes that must first make earlier ones durable) fail; syncs are retried after a backoff ({} ms doubling up to {} s) and at every FLUSH, `ctl flush` and shutdown",
                RETRY_MIN.as_millis(),
                RETRY_MAX.as_secs()
            );
        }
        let now = Instant::now();
        let d = d.get_or_insert_with(|| Degraded::entered(now));
        d.count(e);
        if entering {
            d.retry_at = now;
        } else {
            d.backoff = (d.backoff * 2).min(RETRY_MAX);
            d.retry_at = now + d.backoff;
        }
        if !entering && d.failures.is_power_of_two() {
            tracing::warn!(
                "backing device syncs still failing: {} failures in {:.1} s (last: {e}); next retry in {:.1} s",
                d.failures,
                d.since.elapsed().as_secs_f64(),
                d.backoff.as_secs_f64()
            );
        }
    }

    /// Leaves the state "backing syncs failing" (a sync succeeded); whether it was in it.
    pub fn sync_healed(d: &mut Option<Degraded>) -> bool {
        match d.take() {
            Some(d) => {
                tracing::warn!(
                    "backing device syncs succeed again after {} failures in {:.1} s: volume no longer degraded",
                    d.failures,
                    d.since.elapsed().as_secs_f64()
                );
                true
            }
            None => false,
        }
    }

    /// The error a request that needs a backing sync gets while the backoff of failing syncs
    /// runs (the failing device is not asked again at every such request): the last sync
    /// error's kind, and when the next attempt is due.
    pub fn sync_backoff_error(&self) -> io::Error {
        io::Error::new(
            self.last_kind,
            SyncBackoff {
                failures: self.failures,
                last_error: self.last_error.clone(),
                retry_in: self.retry_at.saturating_duration_since(Instant::now()),
            },
        )
    }

    /// `ctl stats`' `degraded_reason` while backing syncs fail.
    pub fn sync_reason(&self) -> String {
        format!(
            "backing device failing syncs for {:.1} s ({} failures, last: {}); requests that need a sync (FLUSH, FUA, and writes that must first make earlier ones durable) fail, next retry in {:.1} s (a FLUSH or `ctl flush` retries at once)",
            self.since.elapsed().as_secs_f64(),
            self.failures,
            self.last_error,
            self.retry_at
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        )
    }

    /// `ctl stats`' `degraded_reason` (both layouts) for failing write-backs `wb` and failing
    /// syncs `sync`; `None` when neither.
    pub fn reason_of(wb: Option<&Degraded>, sync: Option<&Degraded>) -> Option<String> {
        match (wb, sync) {
            (Some(d), Some(s)) => Some(format!("{}; {}", d.reason(), s.sync_reason())),
            (Some(d), None) => Some(d.reason()),
            (None, Some(s)) => Some(s.sync_reason()),
            (None, None) => None,
        }
    }

    /// Whether the next retry is due.
    pub fn due(&self) -> bool {
        Instant::now() >= self.retry_at
    }

    /// `ctl stats`' `degraded_reason`.
    pub fn reason(&self) -> String {
        format!(
            "backing device failing write-backs for {:.1} s ({} failures, last: {}); dirty data kept in the cache, next retry in {:.1} s",
            self.since.elapsed().as_secs_f64(),
            self.failures,
            self.last_error,
            self.retry_at
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        )
    }

    /// The error a write that finds no room without a write-back gets: the backing device's
    /// last error kind and text (ENOSPC stays ENOSPC), else those of `now`, the write-back
    /// error that just happened (the volume is not marked degraded yet).
    pub fn no_room(d: Option<&Degraded>, what: &str, now: &io::Error) -> io::Error {
        let now_text = now.to_string();
        let (kind, last) = match d {
            Some(d) => (d.last_kind, d.last_error.as_str()),
            None => (now.kind(), now_text.as_str()),
        };
        io::Error::new(
            kind,
            format!("{what}: no clean cache space left and the backing device fails write-backs ({last}); dirty data is kept, retry when the backing device is back"),
        )
    }
}

/// The error of a request refused because it needs a backing sync while the backoff of
/// failing syncs runs ([`Degraded::sync_backoff_error`]): the failing device was not asked
/// again. Its `io::ErrorKind` is the last sync error's (EIO, ENOSPC, ...); find it with
/// [`sync_backoff_of`] rather than by its text.
#[derive(Clone, Debug)]
pub struct SyncBackoff {
    /// Failed syncs so far, and the last one's error.
    pub failures: u64,
    pub last_error: String,
    /// When the next attempt is due.
    pub retry_in: Duration,
}

impl std::fmt::Display for SyncBackoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "backing device syncs failing ({} failures, last: {}); not retried for {:.1} s (a FLUSH retries at once)",
            self.failures,
            self.last_error,
            self.retry_in.as_secs_f64()
        )
    }
}

impl std::error::Error for SyncBackoff {}

/// The [`SyncBackoff`] an I/O error is, if it is one (the direct layout passes it to the
/// client unwrapped; the log layout wraps it in its own fault type, text only).
pub fn sync_backoff_of(e: &io::Error) -> Option<&SyncBackoff> {
    e.get_ref().and_then(|x| x.downcast_ref::<SyncBackoff>())
}

/// Records `[a, b)` (clipped to `size`) as lost dirty data in `lost` (sorted, disjoint).
pub fn lose(lost: &mut Vec<(u64, u64)>, a: u64, b: u64, size: u64, why: &str) {
    lose_named(lost, a, b, size, why, None)
}

/// [`lose`] of a range of volume `name` (several volumes: `[a, b)` are pool addresses,
/// `crate::volume_set::vaddr`; the log names it within the volume).
pub fn lose_named(
    lost: &mut Vec<(u64, u64)>,
    a: u64,
    b: u64,
    size: u64,
    why: &str,
    name: Option<&str>,
) {
    let b = b.min(size);
    if a >= b {
        return;
    }
    tracing::error!(
        "dirty data lost: {} ({why})",
        crate::volume_set::range_text(name, a, b)
    );
    lost.push((a, b));
    lost.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(lost.len());
    for &(x, y) in lost.iter() {
        match out.last_mut() {
            Some(l) if x <= l.1 => l.1 = l.1.max(y),
            _ => out.push((x, y)),
        }
    }
    *lost = out;
}

/// `[a, b)` was written (or trimmed) again: no longer lost.
/// Returns whether `lost` changed.
pub fn unlose(lost: &mut Vec<(u64, u64)>, a: u64, b: u64) -> bool {
    if lost.is_empty() {
        return false;
    }
    let mut out = Vec::new();
    for &(x, y) in lost.iter() {
        if y <= a || x >= b {
            out.push((x, y));
            continue;
        }
        if x < a {
            out.push((x, a));
        }
        if y > b {
            out.push((b, y));
        }
    }
    let changed = *lost != out;
    *lost = out;
    changed
}

/// Bytes in `lost`.
pub fn lost_bytes(lost: &[(u64, u64)]) -> u64 {
    lost.iter().map(|(a, b)| b - a).sum()
}

/// Fails a read of `[a, b)` that overlaps a lost range.
pub fn lost_check(lost: &[(u64, u64)], a: u64, b: u64) -> io::Result<()> {
    match lost.iter().find(|(x, y)| *x < b && a < *y) {
        Some(&(start, end)) => Err(io::Error::other(LostRange {
            start,
            end,
            volume: None,
        })),
        None => Ok(()),
    }
}

/// The error of a read that meets a range reported lost ([`lost_check`]): volume bytes
/// `[start, end)` as listed when the read was refused (a later write may take part of it
/// off the list). Find it with [`lost_range_of`] rather than by its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRange {
    /// Pool addresses (`crate::volume_set::vaddr`): on a cache of one volume its offsets.
    pub start: u64,
    pub end: u64,
    /// The volume's name on a cache of several (the volume's export names the error,
    /// [`name_lost_range`]); the text gives offsets within it.
    pub volume: Option<String>,
}

impl std::fmt::Display for LostRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} were lost (dirty data lost with the cache device, or written to the backing device before a sync that failed and may have dropped them): reads fail until they are written again",
            crate::volume_set::range_text(self.volume.as_deref(), self.start, self.end)
        )
    }
}

impl std::error::Error for LostRange {}

/// The [`LostRange`] an I/O error is, if it is one.
pub fn lost_range_of(e: &io::Error) -> Option<LostRange> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<LostRange>())
        .cloned()
}

/// `e` with the volume named, if it is a [`LostRange`] (a request of volume `name` of
/// several); any other error unchanged.
pub fn name_lost_range(e: io::Error, name: &str) -> io::Error {
    match lost_range_of(&e) {
        Some(l) => io::Error::new(
            e.kind(),
            LostRange {
                volume: Some(name.to_string()),
                ..l
            },
        ),
        None => e,
    }
}

/// A failure record of the cache `uuid` now.
pub fn fail_state(uuid: [u8; 16], reason: &str, lost: &[(u64, u64)]) -> FailState {
    FailState {
        uuid,
        failed_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        reason: reason.to_string(),
        lost: lost.to_vec(),
    }
}

/// Makes a failure of the cache durable: the state file at `state_path` (if any) first, then
/// the erase of the superblock (bytes 0..4096 of `cache`, both layouts). Returns whether at
/// least one of them is durable. A failed cache whose failure is durable nowhere could be
/// reopened after a restart with lines older than what passed through to the backing device
/// since; so until a retry here succeeds, callers refuse writes (reads and flushes still
/// pass through: they acknowledge nothing new).
pub fn record_failure(state_path: Option<&Path>, cache: &dyn BlockDev, st: &FailState) -> bool {
    let in_file = match state_path {
        Some(p) => match state_file::write(p, st) {
            Ok(()) => {
                tracing::error!("cache failure recorded in {}", p.display());
                true
            }
            Err(e) => {
                tracing::error!("could not record the cache failure: {e}");
                false
            }
        },
        None => false,
    };
    let erased = cache.write_at(&[0u8; 4096], 0).and_then(|_| cache.sync());
    if let Err(e) = &erased {
        tracing::error!(
            "could not erase the failed cache device's superblock ({e}): {}",
            if in_file {
                "the state file refuses it at the next start; `tiercache format --force` it before it is used again"
            } else {
                "the failure is recorded nowhere durable, so writes fail (EIO) until it is; format the cache device before it is used again, or it may serve stale data"
            }
        );
    }
    in_file || erased.is_ok()
}

/// The error writes get while a failure is recorded nowhere durable.
pub fn unrecorded_error(state_path: Option<&Path>) -> io::Error {
    io::Error::other(format!(
        "the cache device failed and the failure could not be recorded ({}, superblock erase failed): writes are refused so that a restart cannot serve older cached data over them",
        match state_path {
            Some(p) => format!("state file {}", p.display()),
            None => "no state file".to_string(),
        }
    ))
}

/// The state file at `path` names the cache `uuid` as failed: the error refusing to open it
/// (issue 14 item 6: never restore lines older than what went to the backing device). A
/// state file naming another cache is ignored with a warning.
pub fn refuse_failed(path: &Path, uuid: &[u8; 16]) -> io::Result<()> {
    let Some(st) = state_file::read(path)? else {
        return Ok(());
    };
    if st.uuid == *uuid {
        return Err(io::Error::other(format!(
            "the cache FAILED earlier ({}; recorded in {}): its cached data may be older than what went to the backing device since, so it is not used again. `tiercache format --force` it (which removes the state file)",
            st.describe(),
            path.display()
        )));
    }
    tracing::warn!(
        "ignoring cache state file {}: it records the failure of another cache ({}), not this one ({})",
        path.display(),
        state_file::uuid_hex(&st.uuid),
        state_file::uuid_hex(uuid)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_range_of_a_volume_of_several_is_named_with_offsets_within_it() {
        let a = crate::volume_set::vaddr(1, 4096);
        let e = lost_check(&[(a, a + 512)], a, a + 1).unwrap_err();
        let e = name_lost_range(e, "db");
        let t = e.to_string();
        assert!(
            t.starts_with("volume db: bytes 4096..4608 were lost"),
            "{t}"
        );
        assert!(!t.contains("volume id"), "{t}");
        let l = lost_range_of(&e).expect("still a typed LostRange");
        assert_eq!(
            (l.start, l.end, l.volume.as_deref()),
            (a, a + 512, Some("db"))
        );
        let other = name_lost_range(io::Error::other("x"), "db");
        assert_eq!(other.to_string(), "x");
    }

    #[test]
    fn lost_ranges_merge_split_and_check() {
        let mut l = Vec::new();
        lose(&mut l, 0, 4096, 1 << 20, "t");
        lose(&mut l, 4096, 8192, 1 << 20, "t");
        lose(&mut l, 16384, 1 << 30, 1 << 20, "t");
        assert_eq!(l, vec![(0, 8192), (16384, 1 << 20)]);
        assert!(lost_check(&l, 100, 200).is_err());
        assert!(lost_check(&l, 8192, 16384).is_ok());
        unlose(&mut l, 1024, 2048);
        assert_eq!(l, vec![(0, 1024), (2048, 8192), (16384, 1 << 20)]);
        assert_eq!(lost_bytes(&l), 1024 + 6144 + (1 << 20) - 16384);
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_keeps_the_kind() {
        let mut d = None;
        let e = io::Error::from_raw_os_error(28);
        Degraded::failed(&mut d, &e);
        assert_eq!(d.as_ref().unwrap().backoff, RETRY_MIN);
        for _ in 0..20 {
            Degraded::failed(&mut d, &e);
        }
        let g = d.as_ref().unwrap();
        assert_eq!(g.backoff, RETRY_MAX);
        assert_eq!(g.failures, 21);
        let now = io::Error::new(io::ErrorKind::TimedOut, "the write-back just now");
        assert_eq!(
            Degraded::no_room(d.as_ref(), "t", &now).kind(),
            io::ErrorKind::StorageFull
        );
        // Not (yet) degraded: the error that just happened is named, not "(?)".
        let e = Degraded::no_room(None, "log cache", &now);
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("(the write-back just now)"), "{e}");
        assert!(Degraded::healed(&mut d));
        assert!(d.is_none());
    }
}
