//! Qsan's warm-up estimate: the SSD is warm once the hot data (C bytes) has been read from the
//! disks P times (the populate threshold), at I random IOPS of S bytes on each of D disks:
//!
//! `T = C x P / (I x S x D)`
//!
//! (Qsan SSD caching white paper, "The Formula"; its test case 1: C = 10 GiB, P = 1, I = 430,
//! S = 4 KiB, D = 12 gives 508 s = 8.47 min.)

use serde::Serialize;

/// Inputs of the estimate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WarmupInputs {
    /// Hot data to bring into the cache, bytes.
    pub cache_bytes: u64,
    /// Populate threshold (accesses before a block is cached).
    pub threshold: u32,
    /// Random IOPS of one disk at this I/O size.
    pub disk_iops: f64,
    /// I/O size, bytes.
    pub io_size: u64,
    /// Number of disks serving the misses.
    pub disks: u32,
}

/// The estimate in seconds (infinite when the disks do no I/O).
pub fn estimate_s(w: &WarmupInputs) -> f64 {
    let rate = w.disk_iops * w.io_size as f64 * w.disks as f64;
    if rate <= 0.0 {
        return f64::INFINITY;
    }
    w.cache_bytes as f64 * w.threshold as f64 / rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qsan_examples() {
        let case1 = WarmupInputs {
            cache_bytes: 10 << 30,
            threshold: 1,
            disk_iops: 430.0,
            io_size: 4096,
            disks: 12,
        };
        assert!((estimate_s(&case1) - 508.03).abs() < 0.01);
        let formula = WarmupInputs {
            cache_bytes: 480 << 30,
            threshold: 2,
            disk_iops: 250.0,
            io_size: 64 << 10,
            disks: 16,
        };
        assert!((estimate_s(&formula) - 3932.16).abs() < 0.01);
        let case2 = WarmupInputs {
            cache_bytes: 2 << 40,
            threshold: 2,
            disk_iops: 244.0,
            io_size: 8 << 10,
            disks: 8,
        };
        assert!((estimate_s(&case2) / 3600.0 - 76.40).abs() < 0.01);
    }
}
