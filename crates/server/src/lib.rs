//! tiercache's live side: a cache volume that executes the engine's plans on a real cache
//! device and backing device, keeps its metadata on the cache device so restarts come back
//! warm, and is exported over NBD by `tiercache serve`.

pub mod check;
pub mod classify;
pub mod control;
pub mod dashboard;
pub mod data_sums;
pub mod degrade;
pub mod dev;
pub mod fault;
pub mod format;
pub mod format_any;
pub mod identity;
pub mod live;
pub mod log_check;
pub mod log_format;
pub mod log_volume;
pub mod lost_list;
pub mod metrics;
pub mod nbd_dev;
pub mod open_live;
pub mod pool_dev;
pub mod reconcile;
pub mod reduce;
pub mod state_file;
pub mod tuning;
pub mod vol_tuning;
pub mod volume;
pub mod volume_set;

pub use dev::{hdd_config, parse_emulate_ssd, BlockDev, EmulatedHdd, EmulatedSsd, FileDev};
pub use format::{FormatError, Superblock};
pub use format_any::{format_device, FormatSpec, Formatted};
pub use identity::BackingIdentity;
pub use live::{open_volume, probe, Found, LiveStats, LiveVolume, Opened, VolumeOpenOptions};
pub use log_volume::{
    format_log, format_log_for, read_log_superblock, LogFormatOptions, LogOpenOptions, LogVolume,
};
pub use nbd_dev::NbdDev;
pub use open_live::{open_live, DirectRun, LiveOpenOptions, LiveOpenReport, LogGiven};
pub use pool_dev::PoolDev;
#[doc(hidden)]
pub use volume::SteppedClean;
pub use volume::{
    format, read_superblock, CacheVolume, FormatOptions, LineState, OpenOptions, OpenReport,
    VolumeStats,
};
