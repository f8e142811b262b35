//! Cleaning policies (write-back): which dirty line [`crate::Engine::clean`] writes back
//! next. One file each, one small trait ([`Cleaner`]), one setting
//! ([`crate::EngineConfig::cleaning`], `--cleaning lba|acp|alru`).
//!
//! The engine answers "the first dirty line at or after a key" in LBA order
//! ([`DirtyKeys`], from a window of the dirty keys rebuilt from the dirty bitmap: see
//! `order.rs`) and tells the cleaner when a line becomes dirty or clean, so a cleaner keeps
//! whatever counts it needs incrementally (never by scanning). Chunk rewrite (`rewrite_chunk`) applies under every policy: the engine asks the
//! cleaner for a line and rewrites that line's chunk from it on when it is dense enough.
//!
//! The engine reads no clock: "time" here is the engine's logical clock, the number of
//! requests it has processed ([`crate::Engine::clock`]); a driver may advance it for idle
//! time ([`crate::Engine::advance_clock`]).

mod acp;
mod alru;
mod lba;
mod order;

pub use order::DirtyKeys;
pub(crate) use order::{set_bits, DirtyWindow};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which cleaning policy orders write-backs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CleaningPolicy {
    /// LBA order, continuing where the last pass stopped (bcache's writeback order): one
    /// sweep of the disk per round. Default (see docs/notes-clean.md for the measurements).
    #[default]
    Lba,
    /// Densest chunk first (Open CAS's ACP): dirty lines counted per disk chunk of
    /// `rewrite_chunk` (1 MiB when rewrites are off), the chunk with the most dirty lines
    /// cleaned whole, lines in LBA order within it.
    Acp,
    /// Staleness (Open CAS's ALRU): the line that has been dirty longest first, and lines
    /// dirty for more than `cleaning_age` requests are due even below the high watermark.
    Alru,
}

impl CleaningPolicy {
    pub const ALL: [CleaningPolicy; 3] = [
        CleaningPolicy::Lba,
        CleaningPolicy::Acp,
        CleaningPolicy::Alru,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CleaningPolicy::Lba => "lba",
            CleaningPolicy::Acp => "acp",
            CleaningPolicy::Alru => "alru",
        }
    }
}

impl fmt::Display for CleaningPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CleaningPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        CleaningPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == t)
            .ok_or_else(|| {
                format!(
                    "unknown cleaning policy '{s}'; use lba (LBA order), acp (densest chunk \
                     first) or alru (longest dirty first, stale lines cleaned early)"
                )
            })
    }
}

/// A cleaning policy's state. The engine calls [`Cleaner::dirtied`] / [`Cleaner::cleaned`]
/// on every change of a line's dirtiness (clean -> dirty, dirty -> clean, including
/// evictions and trims), then [`Cleaner::next`] for each line to write back and
/// [`Cleaner::advance`] after writing back the lines up to a key.
pub trait Cleaner: Send {
    fn name(&self) -> &'static str;
    /// Line `key` became dirty at logical time `now`.
    fn dirtied(&mut self, _key: u64, _now: u64) {}
    /// Line `key` is no longer dirty (written back, evicted or trimmed).
    fn cleaned(&mut self, _key: u64) {}
    /// The next dirty line to write back; `dirty` answers for every dirty line key (there
    /// is at least one).
    fn next(&mut self, dirty: &mut DirtyKeys<'_>) -> u64;
    /// The lines before `end` in this pass were written back: continue after them.
    fn advance(&mut self, _end: u64) {}
    /// Dirty lines that are due at logical time `now` regardless of the watermarks (ALRU:
    /// dirty for longer than its age), counted up to `limit`.
    fn due(&self, _now: u64, _limit: u64) -> u64 {
        0
    }
    /// Heap bytes held.
    fn mem_bytes(&self) -> usize {
        0
    }
}

/// Builds the cleaner for a policy. `chunk_lines_shift` is log2 of the lines per ACP chunk;
/// `age` ALRU's staleness threshold in requests.
pub fn make(p: CleaningPolicy, chunk_lines_shift: u32, age: u64) -> Box<dyn Cleaner> {
    match p {
        CleaningPolicy::Lba => Box::new(lba::Lba::default()),
        CleaningPolicy::Acp => Box::new(acp::Acp::new(chunk_lines_shift)),
        CleaningPolicy::Alru => Box::new(alru::Alru::new(age)),
    }
}
