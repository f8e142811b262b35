//! The plan: what the executor (simulator or live server) must do for one request.
//!
//! Steps run in order; a step may depend on any earlier one (a population writes to the SSD
//! what an earlier `ReadHdd` put into the buffer; a write-back of a victim must finish before
//! new data overwrites its slot). An executor may overlap steps that touch disjoint buffer
//! ranges and disjoint slots.
//!
//! **The buffer** of a read or write request spans its lines:
//! `[buf_start, buf_start + buf_len)` in volume bytes, i.e. the request widened to line
//! boundaries. The client's bytes sit at `request.offset - buf_start`. A read fills the client
//! part from `ReadSsd`/`ReadHdd` steps; a write brings it, and partial-line fills put the rest
//! of a line around it.
//!
//! **SSD addresses** are byte offsets in the cache's data area (slot x line size in the direct
//! layout); **HDD addresses** are byte offsets in volume `vol`.

use serde::Serialize;

/// One device step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Step {
    /// SSD -> buffer.
    ReadSsd { ssd: u64, buf: u64, len: u64 },
    /// HDD -> buffer.
    ReadHdd {
        vol: u32,
        hdd: u64,
        buf: u64,
        len: u64,
    },
    /// Buffer -> SSD.
    WriteSsd { ssd: u64, buf: u64, len: u64 },
    /// Buffer -> HDD (with FUA when the request had it).
    WriteHdd {
        vol: u32,
        hdd: u64,
        buf: u64,
        len: u64,
    },
    /// HDD -> SSD without the client's buffer: population of lines the request did not touch
    /// (the rest of a group).
    Populate {
        vol: u32,
        hdd: u64,
        ssd: u64,
        len: u64,
    },
    /// SSD -> HDD: write-back of a dirty line (on eviction or cleaning).
    WriteBack {
        vol: u32,
        ssd: u64,
        hdd: u64,
        len: u64,
    },
    /// HDD -> HDD: a chunk rewrite's gap (see [`crate::Engine::clean`]): the backing range's
    /// own current bytes, read from the backing device and written back unchanged as part of
    /// the one backing write that the `WriteBack`s and `CopyHdd`s of the chunk make together
    /// (consecutive, contiguous on the backing device). Executors read the gaps of a chunk
    /// in one backing read; alone it changes nothing on the device.
    CopyHdd { vol: u32, hdd: u64, len: u64 },
    /// Discard an SSD range (invalidated lines).
    TrimSsd { ssd: u64, len: u64 },
    /// Discard a backing range.
    TrimHdd { vol: u32, hdd: u64, len: u64 },
    /// Make completed SSD writes durable (data and metadata).
    FlushSsd,
    /// Make completed HDD writes durable.
    FlushHdd { vol: u32 },
}

/// Bytes each device moves for a step: (ssd read, ssd write, hdd read, hdd write).
impl Step {
    #[inline(always)]
    pub fn bytes(&self) -> (u64, u64, u64, u64) {
        match *self {
            Step::ReadSsd { len, .. } => (len, 0, 0, 0),
            Step::ReadHdd { len, .. } => (0, 0, len, 0),
            Step::WriteSsd { len, .. } => (0, len, 0, 0),
            Step::WriteHdd { len, .. } => (0, 0, 0, len),
            Step::Populate { len, .. } => (0, len, len, 0),
            Step::WriteBack { len, .. } => (len, 0, 0, len),
            Step::CopyHdd { len, .. } => (0, 0, len, len),
            Step::TrimSsd { .. }
            | Step::TrimHdd { .. }
            | Step::FlushSsd
            | Step::FlushHdd { .. } => (0, 0, 0, 0),
        }
    }
}

/// The steps for one request (or one cleaning pass).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// Volume byte offset of the buffer's first byte.
    pub buf_start: u64,
    /// Buffer length (0 when the plan needs no buffer).
    pub buf_len: u64,
    pub steps: Vec<Step>,
}

impl Plan {
    pub(crate) fn reset(&mut self, buf_start: u64, buf_len: u64) {
        self.buf_start = buf_start;
        self.buf_len = buf_len;
        self.steps.clear();
    }

    /// Appends a step, merging it into an earlier one when both are contiguous transfers of
    /// the same kind, so a multi-line miss becomes one HDD read:
    /// - SSD transfers merge with the step just before;
    /// - HDD transfers (`ReadHdd`, `WriteHdd`, `Populate`) merge with the last HDD step even
    ///   across SSD steps in between. That moves HDD work earlier, which is safe: the SSD steps
    ///   it passes touch other lines' buffer ranges and slots, and no SSD step feeds an HDD
    ///   transfer of the same request except `WriteBack`, which is never passed.
    #[inline]
    pub(crate) fn push(&mut self, step: Step) {
        let hdd_kind = matches!(
            step,
            Step::ReadHdd { .. } | Step::WriteHdd { .. } | Step::Populate { .. }
        );
        let mut i = self.steps.len();
        while i > 0 {
            i -= 1;
            let passable = matches!(self.steps[i], Step::ReadSsd { .. } | Step::WriteSsd { .. });
            if Self::merge(&mut self.steps[i], &step) {
                return;
            }
            if !(hdd_kind && passable) {
                break;
            }
        }
        self.steps.push(step);
    }

    /// Extends `last` by `step` if they are contiguous transfers of the same kind.
    fn merge(last: &mut Step, step: &Step) -> bool {
        match (last, step) {
            (
                Step::ReadHdd { vol, hdd, buf, len },
                Step::ReadHdd {
                    vol: v2,
                    hdd: h2,
                    buf: b2,
                    len: l2,
                },
            )
            | (
                Step::WriteHdd { vol, hdd, buf, len },
                Step::WriteHdd {
                    vol: v2,
                    hdd: h2,
                    buf: b2,
                    len: l2,
                },
            ) if *vol == *v2 && *hdd + *len == *h2 && *buf + *len == *b2 => {
                *len += l2;
                true
            }
            (
                Step::Populate { vol, hdd, ssd, len },
                Step::Populate {
                    vol: v2,
                    hdd: h2,
                    ssd: s2,
                    len: l2,
                },
            ) if *vol == *v2 && *hdd + *len == *h2 && *ssd + *len == *s2 => {
                *len += l2;
                true
            }
            (
                Step::CopyHdd { vol, hdd, len },
                Step::CopyHdd {
                    vol: v2,
                    hdd: h2,
                    len: l2,
                },
            ) if *vol == *v2 && *hdd + *len == *h2 => {
                *len += l2;
                true
            }
            (
                Step::ReadSsd { ssd, buf, len },
                Step::ReadSsd {
                    ssd: s2,
                    buf: b2,
                    len: l2,
                },
            )
            | (
                Step::WriteSsd { ssd, buf, len },
                Step::WriteSsd {
                    ssd: s2,
                    buf: b2,
                    len: l2,
                },
            ) if *ssd + *len == *s2 && *buf + *len == *b2 => {
                *len += l2;
                true
            }
            _ => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_steps_merge() {
        let mut p = Plan::default();
        p.push(Step::ReadHdd {
            vol: 0,
            hdd: 0,
            buf: 0,
            len: 4096,
        });
        p.push(Step::ReadHdd {
            vol: 0,
            hdd: 4096,
            buf: 4096,
            len: 4096,
        });
        p.push(Step::ReadHdd {
            vol: 1,
            hdd: 8192,
            buf: 8192,
            len: 4096,
        });
        p.push(Step::ReadSsd {
            ssd: 0,
            buf: 0,
            len: 10,
        });
        p.push(Step::ReadSsd {
            ssd: 10,
            buf: 10,
            len: 10,
        });
        p.push(Step::ReadSsd {
            ssd: 40,
            buf: 20,
            len: 10,
        });
        assert_eq!(p.steps.len(), 4);
        assert_eq!(
            p.steps[0],
            Step::ReadHdd {
                vol: 0,
                hdd: 0,
                buf: 0,
                len: 8192
            }
        );
        assert_eq!(
            p.steps[2],
            Step::ReadSsd {
                ssd: 0,
                buf: 0,
                len: 20
            }
        );
    }
}
