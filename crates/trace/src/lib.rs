//! Block trace readers and writers (twelve public formats, streamed in constant memory,
//! gzip/zstd/xz/bzip2 decompressed transparently by magic bytes), trace statistics, and
//! seeded synthetic workloads ([`workload`]).
//!
//! - [`open`] streams a trace as `Result<Request, TraceError>` items; `format` `None`
//!   means [`detect`] (content first, file name to break ties; ambiguity is an error that
//!   names the candidates). Times become nanoseconds since the first record.
//! - [`open_writer`] writes any [`Format`] (compressed by the path's extension), dropping
//!   and counting requests the format cannot represent.
//! - [`stats::stats_file`] / [`stats::StatsBuilder`]: one-pass [`stats::TraceStats`].
//! - The formats, their fields, units and what becomes volume and class: [`formats`].
//! - Errors carry the file and line (or record and byte offset):
//!   `cloud.csv:17: column 4 (size): 'abc' is not a whole number`. With
//!   [`ReadOptions::skip_bad`] malformed records are skipped and counted instead
//!   ([`TraceReader::skipped`], [`TraceReader::first_error`]).
//!
//! ```no_run
//! use tiercache_trace::{open, open_writer, Format, ReadOptions};
//! let reader = open("trace.csv.gz".as_ref(), None, &ReadOptions::default()).unwrap();
//! let mut out = open_writer("out.csv.zst".as_ref(), Format::Simple).unwrap();
//! for r in reader {
//!     let req = r.unwrap(); // a tiercache_engine::Request
//!     out.write(&req).unwrap();
//! }
//! out.finish().unwrap();
//! ```

pub mod content;
pub mod formats;
mod io;
pub mod stats;
pub mod workload;

pub use formats::Format;
pub use io::{detect, open, open_writer, TraceReader, TraceWriter};

use std::fmt;
use std::path::PathBuf;

/// How to read a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// Skip malformed records (counted, first error kept) instead of failing on the first.
    pub skip_bad: bool,
    /// Bytes per block for formats that count blocks: ARC `.lis` (default 512) and
    /// oracleGeneral object ids (default 512: the ids of libCacheSim's block samples are
    /// sector numbers).
    pub block_size: Option<u64>,
    /// blkparse: the action whose lines become requests (default `Q`, queued; `D` issued,
    /// `C` completed are common alternatives).
    pub blkparse_action: char,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            skip_bad: false,
            block_size: None,
            blkparse_action: 'Q',
        }
    }
}

/// Where in a trace something went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A text line (1-based).
    Line(u64),
    /// A binary record (1-based) and its byte offset.
    Record { index: u64, offset: u64 },
    /// The file as a whole.
    File,
}

/// A trace could not be read: the file, the place and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct TraceError {
    pub path: PathBuf,
    pub location: Location,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match &self.location {
            Location::Line(l) => write!(f, "{p}:{l}: {}", self.message),
            Location::Record { index, offset } => {
                write!(f, "{p}: record {index} (byte {offset}): {}", self.message)
            }
            Location::File => write!(f, "{p}: {}", self.message),
        }
    }
}

impl TraceError {
    pub(crate) fn file(path: &std::path::Path, message: impl Into<String>) -> Self {
        TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            message: message.into(),
        }
    }
}
