//! Block trace readers and synthetic workloads.

pub mod workload;
