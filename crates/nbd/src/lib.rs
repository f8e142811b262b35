//! The NBD protocol (fixed newstyle, as in the NetworkBlockDevice `doc/proto.md`): a server
//! loop that exports anything implementing [`Export`], and a client.
//!
//! The protocol layer knows nothing about caching: `tiercache serve` hands it a cache volume,
//! tests and benchmarks hand it a plain file.

use std::io;

mod client;
mod file;
pub mod proto;
mod replay;
mod server;
mod tls;
pub mod unix_access;

pub use client::{is_timeout, Client, ClientError, ClientOptions, Completion, Handle, NbdUri};
pub use file::FileExport;
pub use replay::{
    pattern_byte, replay, replay_volumes, replay_with, OpStats, ReplayOp, ReplayOpKind,
    ReplayReport,
};
pub use server::{ExportsHandle, Server, ServerOptions, ShutdownHandle};
pub use tls::{read_psk_file, ClientTls, TlsConfig, TlsMode};

/// Block-size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    /// Largest payload of one READ or WRITE the export accepts.
    pub maximum: u32,
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }
}

/// A volume the server exports. Calls come from many threads at once (several connections,
/// many requests in flight each); an implementation orders overlapping requests itself.
/// Offsets and lengths are checked against [`Export::size`] before any call.
pub trait Export: Send + Sync {
    /// Volume size in bytes.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset`; with `fua` it is durable when this returns.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// Makes every write completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Discards a range (contents become unspecified; reads must not fail).
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Writes zeroes to a range (`may_trim`: the export may deallocate instead if reads then
    /// return zeroes).
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()>;
    /// Whether several connections see one consistent volume (NBD_FLAG_CAN_MULTI_CONN).
    fn can_multi_conn(&self) -> bool {
        true
    }
    /// Whether TRIM is supported.
    fn can_trim(&self) -> bool {
        true
    }
    /// Whether the export is read-only.
    fn read_only(&self) -> bool {
        false
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::default()
    }
    /// Free-text description sent with `NBD_INFO_DESCRIPTION` (shown by `nbdinfo`).
    fn description(&self) -> Option<String> {
        None
    }
}
