//! tiercache engine: the decisions and metadata of an SSD cache in front of a slower backing
//! device. It does no I/O, reads no clock and starts no thread: for each request it updates
//! its state and returns a [`Plan`] of device steps that the simulator or the live server
//! executes.

pub mod classes;
pub mod cleaning;
pub mod config;
pub mod engine;
mod free_slots;
pub mod index;
pub mod keys;
pub mod log;
pub mod mem;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod ram_tier;
pub mod rate;
pub mod request;
pub mod sharded;
pub mod stats;
pub mod units;

pub use classes::{Allocation, ClassPolicy, ClassTable, TableError};
pub use cleaning::CleaningPolicy;
pub use config::{
    Admission, EngineConfig, Mode, Preset, SeqCutoff, Validity, VolumeConfig, DEFAULT_CLEANING_AGE,
    DEFAULT_REWRITE_CHUNK, DEFAULT_REWRITE_MIN_RUNS,
};
pub use engine::{
    DeviceLoss, Engine, EngineError, InflightCounters, LineState, Remirror, RestoreLine,
    RestorePending, VolumeStats, WbBatch, WbDone, WbLine, WbTicket, COPY_KEY,
};
pub use free_slots::STRIPE_LINES;
pub use log::{Compression, ExtentContent, Layout, LogConfig, LogEngine};
pub use plan::{Plan, Step};
pub use pool::{Pool, PoolError, MAX_MEMBERS, POOL_ALIGN};
pub use ram_tier::{RamCounters, RamTier, DEFAULT_RAM_POLICY};
pub use rate::{RateController, WritebackRate};
pub use request::{Op, Request, MAX_CLASS, NUM_CLASSES};
pub use sharded::{Sharded, MAX_SHARDS};
pub use stats::{Bypass, Bypasses, Counters, DirRequests};
pub use units::{fmt_size, parse_size, CacheSize};
