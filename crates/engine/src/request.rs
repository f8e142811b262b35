//! Block requests as the engine sees them.

use serde::{Deserialize, Serialize};

/// Largest class id (classes are 0..=31, as the 5-bit SCSI group number DSS uses).
pub const MAX_CLASS: u8 = 31;
/// Number of I/O classes.
pub const NUM_CLASSES: usize = MAX_CLASS as usize + 1;

/// The operation of a block request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// Discard: the range's contents become undefined; cached copies are dropped.
    Trim,
    /// Make every acknowledged write durable.
    Flush,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Trim => "trim",
            Op::Flush => "flush",
        }
    }
}

/// One block request: what a trace record or an NBD command becomes.
///
/// Offsets and lengths are in bytes and need no alignment: a request may cover part of a
/// cache line or span many lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Arrival time in nanoseconds since the start of the trace (simulated time; the engine
    /// only carries it).
    pub time_ns: u64,
    pub op: Op,
    /// Byte offset in the volume.
    pub offset: u64,
    /// Length in bytes (0 is allowed and touches no line).
    pub len: u64,
    /// I/O class, 0..=31.
    pub class: u8,
    /// Volume (LUN, disk, export) the request addresses.
    pub volume: u32,
    /// Force unit access: this write is durable before it completes. In write-back that
    /// means durable in the cache (the plan ends with [`crate::Step::FlushSsd`]), as a FLUSH
    /// would make it; in the other modes the backing write carries FUA.
    pub fua: bool,
}

impl Request {
    /// A request with class 0, volume 0, no FUA.
    pub fn new(time_ns: u64, op: Op, offset: u64, len: u64) -> Self {
        Request {
            time_ns,
            op,
            offset,
            len,
            class: 0,
            volume: 0,
            fua: false,
        }
    }

    pub fn read(offset: u64, len: u64) -> Self {
        Self::new(0, Op::Read, offset, len)
    }

    pub fn write(offset: u64, len: u64) -> Self {
        Self::new(0, Op::Write, offset, len)
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    pub fn is_read(&self) -> bool {
        self.op == Op::Read
    }

    pub fn is_write(&self) -> bool {
        self.op == Op::Write
    }
}
