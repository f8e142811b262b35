//! Offline check of a log-layout cache device (`tiercache check`): runs the recovery a
//! restart would run, on a copy-on-write view of the device (nothing reaches the device),
//! checks the rebuilt indices' invariants, then scrubs every mapped extent (checksum,
//! decompression, BLAKE3 of the content against its header's digest). Recovery runs as a
//! salvage, so damage to the journal or to header slots is reported (with what it may cost)
//! instead of failing; [`repair_log_device`] runs the same salvage on the device itself.

use crate::dev::BlockDev;
use crate::log_volume::{LogOpenReport, LogScrub, LogVolume};
use serde::Serialize;
use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

const PAGE: u64 = 4096;

/// Reads from `base`; writes stay in memory (4 KiB pages) and are read back from there.
struct Overlay {
    base: Box<dyn BlockDev>,
    pages: Mutex<HashMap<u64, Vec<u8>>>,
}

impl BlockDev for Overlay {
    fn size(&self) -> u64 {
        self.base.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.base.read_at(buf, offset)?;
        let pages = self.pages.lock().unwrap();
        let end = offset + buf.len() as u64;
        for p in offset / PAGE..end.div_ceil(PAGE) {
            if let Some(d) = pages.get(&p) {
                let (ps, pe) = (p * PAGE, p * PAGE + PAGE);
                let (a, b) = (ps.max(offset), pe.min(end));
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&d[(a - ps) as usize..(b - ps) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let end = offset + data.len() as u64;
        for p in offset / PAGE..end.div_ceil(PAGE) {
            let (ps, pe) = (p * PAGE, p * PAGE + PAGE);
            let mut page = match self.pages.lock().unwrap().get(&p) {
                Some(d) => d.clone(),
                None => {
                    let mut d = vec![0u8; PAGE as usize];
                    self.base.read_at(&mut d, ps)?;
                    d
                }
            };
            let (a, b) = (ps.max(offset), pe.min(end));
            page[(a - ps) as usize..(b - ps) as usize]
                .copy_from_slice(&data[(a - offset) as usize..(b - offset) as usize]);
            self.pages.lock().unwrap().insert(p, page);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A backing device of the recorded size that the check must never need: reads fail.
struct NoBacking(u64);

impl BlockDev for NoBacking {
    fn size(&self) -> u64 {
        self.0
    }
    fn read_at(&self, _: &mut [u8], offset: u64) -> io::Result<()> {
        Err(io::Error::other(format!(
            "the offline check read the backing device at {offset}"
        )))
    }
    fn write_at(&self, _: &[u8], offset: u64) -> io::Result<()> {
        Err(io::Error::other(format!(
            "the offline check wrote the backing device at {offset}"
        )))
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// What the check of a log device found.
#[derive(Clone, Debug, Serialize)]
pub struct LogCheckReport {
    pub layout: &'static str,
    pub device_bytes: u64,
    pub line_size: u64,
    pub segment_size: u64,
    pub segments: u64,
    pub compression: String,
    pub mode: String,
    pub backing_size: u64,
    pub recovery: LogOpenReport,
    /// Invariant violations of the rebuilt indices (empty when consistent).
    pub index_problems: Vec<String>,
    pub scrub: LogScrub,
    /// The server's lost-range list (`crate::lost_list`): volume ranges whose acknowledged
    /// data was lost, which read EIO until rewritten (listed, not a problem).
    pub lost_list: Vec<(u64, u64)>,
    /// The lost-range list could not be read back (both copies damaged): what is wrong and
    /// what to do. A problem: the server refuses to open the cache.
    pub lost_list_problem: Option<String>,
}

impl LogCheckReport {
    pub fn ok(&self) -> bool {
        self.recovery.damage.is_empty()
            && self.index_problems.is_empty()
            && self.scrub.problems.is_empty()
            && self.lost_list_problem.is_none()
    }
}

/// Checks a log device (see the module doc). Errors: the device cannot be read or recovery
/// itself fails (the device would not open).
pub fn check_log_device(cache: Box<dyn BlockDev>) -> io::Result<LogCheckReport> {
    let device_bytes = cache.size();
    let sb = crate::log_volume::read_log_superblock(&*cache)?
        .ok_or_else(|| io::Error::other("not a log-layout cache device"))?;
    // A damaged list is a problem, not a refusal of the check (the offline open goes on
    // without it).
    let lost_list_problem = match sb.geometry().lost_list.filter(|_| sb.lost_list) {
        Some(at) => match crate::lost_list::LostList::load(&*cache, at) {
            Err(e) if e.kind() == io::ErrorKind::InvalidData => Some(e.to_string()),
            Err(e) => return Err(e),
            Ok(_) => None,
        },
        None => None,
    };
    let view = Overlay {
        base: cache,
        pages: Mutex::new(HashMap::new()),
    };
    let (vol, recovery) =
        LogVolume::open_salvage(Box::new(view), Box::new(NoBacking(sb.backing_size)))?;
    let index_problems = vol.check().err().into_iter().collect();
    let scrub = vol.scrub()?;
    let lost_list = vol.stats().lost_dirty_ranges;
    Ok(LogCheckReport {
        lost_list,
        lost_list_problem,
        layout: "log",
        device_bytes,
        line_size: sb.line_size,
        segment_size: sb.segment_size,
        segments: sb.segments,
        compression: sb.compression.to_string(),
        mode: sb.mode.as_str().into(),
        backing_size: sb.backing_size,
        recovery,
        index_problems,
        scrub,
    })
}

/// `tiercache check --repair` of a log device whose check found damage: recovery as a
/// salvage on the device itself (every journal record that still verifies is replayed,
/// damaged header slots are zeroed), then a clean shutdown (which checkpoints the salvaged
/// state into a new journal epoch). The backing device is never touched. The caller makes
/// sure no server has the device open.
pub fn repair_log_device(cache: Box<dyn BlockDev>) -> io::Result<crate::check::RepairReport> {
    let sb = crate::log_volume::read_log_superblock(&*cache)?
        .ok_or_else(|| io::Error::other("not a log-layout cache device"))?;
    let (vol, rec) = LogVolume::open_salvage(cache, Box::new(NoBacking(sb.backing_size)))?;
    vol.check().map_err(io::Error::other)?;
    vol.shutdown()?;
    Ok(crate::check::RepairReport {
        changed: true,
        repaired: rec.damage.iter().map(|d| d.message.clone()).collect(),
        salvaged_records: rec.salvaged_records,
        unknown_lost: rec.unknown_lost,
        lost_ranges: rec.lost_ranges,
    })
}
