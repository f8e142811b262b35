//! Block trace readers and synthetic workloads.
