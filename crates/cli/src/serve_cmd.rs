//! `tiercache format`, `tiercache serve` and `tiercache ctl`: the live cached volume.

use crate::sim_cmd::TuneArgs;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::{parse_size, EngineConfig, Mode};
use tiercache_nbd::Server;
use tiercache_server::control::{self, Command};
use tiercache_server::dashboard;
use tiercache_server::state_file;
use tiercache_server::tuning::Tuning;
use tiercache_server::volume_set::{VolumeSet, VolumeSpec};
use tiercache_server::LiveVolume;
use tiercache_server::{
    BlockDev, DirectRun, EmulatedHdd, FileDev, FormatError, FormatOptions, FormatSpec, Formatted,
    Found, LiveOpenOptions, NbdDev, Superblock,
};

const FORMAT_HELP: &str = "\
Writes a fresh superblock and empty metadata to the cache device (a file or block device).
Everything cached on it before is forgotten: with a write-back cache holding dirty data, run
`tiercache ctl --control PATH flush` (or serve it in write-through once) first.

Example:
  truncate -s 10G /var/lib/tiercache/cache.img
  tiercache format --cache /var/lib/tiercache/cache.img --backing /dev/sdb --mode write-back";

#[derive(Args)]
// The simulator-only layout flags are refused live: not offered in the help either.
#[command(after_long_help = FORMAT_HELP, mut_arg("trim", |a| a.hide(true)),
    mut_arg("free_reserve", |a| a.hide(true)),
    mut_arg("reinsert_hits", |a| a.hide(true)),
    mut_arg("dup_share", |a| a.hide(true)),
    mut_arg("erase_block", |a| a.hide(true)),
    mut_arg("content_lengths", |a| a.hide(true)))]
pub struct FormatArgs {
    /// Cache device: file or block device (an SSD), or an NBD export URI. Repeat it for a
    /// pool of several cache devices (direct layout; each used whole; members' sizes are
    /// rounded down to 128 lines).
    #[arg(long, required = true)]
    cache: Vec<PathBuf>,
    /// Cache copies of each dirty line on a pool of several cache devices: 2 (mirrored on two
    /// members; the default in write-back, or with a --volume-mode write-back), 1 (a lost
    /// member loses its dirty data). Fixed in the pool at the first start that chooses it; a
    /// pool started in write-through with neither refuses a live switch to write-back.
    #[arg(long)]
    dirty_copies: Option<u8>,
    /// Backing device the cache fronts: file or block device (an HDD), or an NBD export URI.
    #[arg(long)]
    backing: PathBuf,
    /// Cache line size (power of two, 4k..1M). Default 4k, or the --preset's line.
    #[arg(long)]
    line_size: Option<String>,
    /// Write mode: write-through (wt), write-back (wb), write-around (wa), read-only (ro),
    /// pass-through (pt).
    #[arg(long, default_value = "write-through")]
    mode: String,
    /// Replacement policy (`tiercache policies`).
    #[arg(long, default_value = "lru")]
    policy: String,
    /// Use only this much of the cache device (default: all of it).
    #[arg(long)]
    cache_size: Option<String>,
    /// Keep a crc32c of every cached sector (direct layout), fixed at format: a damaged
    /// clean line is re-read from the backing device, damaged dirty data fails with EIO and
    /// is reported instead of being served or written back.
    #[arg(long)]
    data_checksums: bool,
    /// What is valid and dirty inside a line (direct layout), fixed at format, as `sim
    /// --validity`: `sector` (512-byte units, or line/64 for lines over 32 KiB, as Open CAS:
    /// a partial write to an uncached line needs no read of the rest; the default) or `line`
    /// (all or nothing, dm-cache's and most papers' model: a read miss caches the whole line,
    /// a partial write to an uncached line reads the rest from the backing device first).
    #[arg(long, value_name = "sector|line")]
    validity: Option<String>,
    /// Overwrite a device that already holds a tiercache cache (or a damaged one): everything
    /// it holds is discarded, dirty data not yet on the backing device included.
    #[arg(long)]
    force: bool,
    /// The state directory `serve --state-dir` used: the formatted-over cache's state file
    /// there is removed too (the one beside the cache file always is).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    layout: crate::layout_args::LayoutArgs,
    /// Engine settings stored with the cache (as `tiercache sim` takes them); `serve` flags
    /// and `ctl set` change them later. `--preset` also picks the line size.
    #[command(flatten)]
    tune: TuneArgs,
}

/// Flags of `serve`; every one may also come from `--config FILE.toml` (same names, with
/// underscores: `line_size = "64k"`). Flags win over the file.
#[derive(Args, Default, Serialize, Deserialize)]
#[serde(default)]
#[command(after_long_help = SERVE_HELP, mut_arg("dup_share", |a| a.hide(true)),
    mut_arg("erase_block", |a| a.hide(true)),
    mut_arg("content_lengths", |a| a.hide(true)))]
pub struct ServeArgs {
    /// Cache device: file, block device, or NBD export (nbd://HOST[:PORT]/NAME,
    /// nbd+unix:///NAME?socket=PATH), e.g. nbdkit with its error filter to inject faults.
    /// Repeat it for a pool of several cache devices formatted together (`tiercache format
    /// --cache A --cache B`), in any order. In the config file: a path, a list of paths, or
    /// `[[cache]]` tables with `path`.
    #[arg(long)]
    #[serde(
        deserialize_with = "cache_entries",
        serialize_with = "cache_entries_out"
    )]
    cache: Vec<PathBuf>,
    /// Cache copies of each dirty line on a pool of several cache devices: 1 (a lost member
    /// loses its dirty data), 2 (mirrored on two members: the default in write-back). Must
    /// equal the value given at format, if any.
    #[arg(long)]
    dirty_copies: Option<u8>,
    /// A pool member that is missing, unreadable or empty and may hold dirty lines (no
    /// other copy of them): start without it anyway; the volume ranges it may have held
    /// dirty go to the lost list (reads of them fail with EIO until written again). Without
    /// it such a start is refused, naming the ranges.
    #[arg(long)]
    #[serde(default)]
    accept_lost_dirty: bool,
    /// Backing device: file, block device, or NBD export (nbd://HOST[:PORT]/NAME,
    /// nbd+unix:///NAME?socket=PATH) to cache a remote volume locally.
    #[arg(long)]
    backing: Option<PathBuf>,
    /// Several volumes sharing the cache: NAME=BACKING (repeat it), each exported under its
    /// NAME (`nbdinfo --list`), instead of --backing. Direct layout. In the config file:
    /// `[[volume]]` tables with `name` and `backing`.
    #[arg(long, value_name = "NAME=BACKING")]
    #[serde(deserialize_with = "volume_entries")]
    volume: Vec<String>,
    /// A volume's own mode: NAME=MODE (repeat it; NAME of a --volume), as `sim --volume-mode`.
    #[arg(long, value_name = "NAME=MODE")]
    volume_mode: Vec<String>,
    /// A volume's own admission rule: NAME=RULE (always, never, nhit:N, nhit:R:W; repeat
    /// it), as `sim --volume-admission`. Stored with the cache (a restart keeps it); changed
    /// live by `ctl --volume NAME set admission RULE`. In `[[volume]]` tables: `admission`.
    #[arg(long, value_name = "NAME=RULE")]
    volume_admission: Vec<String>,
    /// A volume's own sequential cutoff: NAME=SIZE (read streams; writes keep the pool's)
    /// or NAME=READ:WRITE, 0 = off (repeat it), as `sim --volume-seq-cutoff`. Stored with the
    /// cache; live: `ctl --volume NAME set seq-cutoff SIZE`. In `[[volume]]` tables:
    /// `seq_cutoff`.
    #[arg(long, value_name = "NAME=SIZE")]
    volume_seq_cutoff: Vec<String>,
    /// A volume's occupancy bounds: NAME=MIN:MAX, shares of the pool (`db=0.25:0.6`) or
    /// percents (`db=25%:60%`; repeat it), as `sim --volume-share`: the volume gets a
    /// partition of its own, never evicted below MIN by another volume's lines (while any
    /// other partition is above its own minimum) and replacing its own lines at MAX (0:0
    /// keeps it out of the cache). Stored with the cache; live: `ctl --volume NAME set share
    /// MIN:MAX` (`pool`: no bounds). In `[[volume]]` tables: `share`.
    #[arg(long, value_name = "NAME=MIN:MAX")]
    volume_share: Vec<String>,
    /// Serve NBD on this unix socket (mode 0600: only the server's user may connect).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Let this group (name or gid) use the NBD unix socket too: mode 0660 and this group.
    /// The control socket stays the server's user's (and root's) alone.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Serve NBD on TCP: PORT alone binds loopback (127.0.0.1:PORT); ADDR:PORT binds ADDR
    /// (e.g. 0.0.0.0:10809 for every interface).
    #[arg(long)]
    listen: Option<String>,
    /// NBD STARTTLS: off, on (offered), require (plaintext options refused with
    /// NBD_REP_ERR_TLS_REQD). Default: on when a PSK file or certificates are given.
    #[arg(long)]
    tls: Option<String>,
    /// TLS pre-shared keys, `username:hexkey` lines (GnuTLS psktool format, as libnbd and
    /// nbdkit read).
    #[arg(long)]
    tls_psk_file: Option<PathBuf>,
    /// TLS X.509 directory: server-cert.pem, server-key.pem (and ca-cert.pem to verify
    /// client certificates), as nbdkit and qemu-nbd use.
    #[arg(long)]
    tls_certificates: Option<PathBuf>,
    /// With --tls-certificates: refuse X.509 clients that present no certificate signed by
    /// ca-cert.pem (PSK clients authenticate with their key).
    #[arg(long)]
    tls_verify_peer: bool,
    /// Most NBD connections open at once; more are closed right after accept. Each open
    /// connection costs up to two threads (a reader and, in transmission, a writer) and one
    /// fd (default 1024).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Requests one NBD connection may have in flight (read, not yet answered); the
    /// connection is not read from while it has this many (default 16).
    #[arg(long)]
    requests_per_connection: Option<usize>,
    /// Bytes of NBD requests in flight over all connections (READ replies and WRITE
    /// payloads held in memory, e.g. 256M, the default). Past it, connections are not read
    /// from until replies drain; a connection with nothing in flight may still run one
    /// request of up to 256 KiB, so small requests are never starved by large ones.
    #[arg(long)]
    max_inflight_bytes: Option<String>,
    /// Bytes of requests in flight per NBD connection (default 64M): a client that
    /// pipelines large READs and does not read the replies holds at most this.
    #[arg(long)]
    max_inflight_bytes_per_connection: Option<String>,
    /// Seconds a client has for the whole NBD handshake (greeting, options, TLS) before it
    /// is dropped (default 10; 0: no limit). Stops idle or trickling clients from holding
    /// connection slots before they authenticate.
    #[arg(long)]
    handshake_deadline: Option<f64>,
    /// Options a client may send in the NBD handshake before it is dropped (default 64; real
    /// clients send fewer than 10).
    #[arg(long)]
    max_options: Option<u32>,
    /// Seconds sending one NBD reply may take (default 30; 0: no limit): a client that does
    /// not read its replies is disconnected after this and its buffers freed. Raise it for
    /// clients on very slow links (a 32 MiB reply must go out at 1.1 MB/s at the default).
    #[arg(long)]
    write_timeout: Option<f64>,
    /// Seconds an NBD backing or cache device (`--backing`/`--cache` given as an `nbd://` or
    /// `nbd+unix://` URI) may take to answer one request (default 60; 0: wait for ever). A
    /// request without an answer in time fails - the client gets EIO, a write-back is retried
    /// later - and its connection is dropped (a late reply answers nothing); the next request
    /// reconnects. A dead NBD server or host then fails requests instead of hanging every
    /// client of the volume. Files and block devices are timed out by the kernel, not by this.
    #[arg(long)]
    device_timeout: Option<f64>,
    /// Write mode for this run: write-through (wt), write-back (wb), write-around (wa),
    /// read-only (ro), pass-through (pt) [default: the one stored on the cache device].
    #[arg(long)]
    mode: Option<String>,
    /// Replacement policy for this run [default: the one stored on the cache device].
    #[arg(long)]
    policy: Option<String>,
    /// Line size when formatting (with --format-if-needed) [default: 4k].
    #[arg(long)]
    line_size: Option<String>,
    /// Cache capacity when formatting; also the size a missing cache file is created with.
    #[arg(long)]
    cache_size: Option<String>,
    /// Format the cache device if it holds no tiercache cache yet.
    #[arg(long)]
    #[serde(default)]
    format_if_needed: bool,
    /// With --format-if-needed: format with data checksums (see `tiercache format
    /// --data-checksums`). A cache formatted with them uses them without this flag.
    #[arg(long)]
    #[serde(default)]
    data_checksums: bool,
    /// Line validity, `sector` or `line` (see `tiercache format --validity`): with
    /// --format-if-needed the new cache's; on a formatted cache it must be the formatted one
    /// (fixed at format). A cache formatted with `line` uses it without this flag.
    #[arg(long, value_name = "sector|line")]
    validity: Option<String>,
    /// The backing device is the one the cache was formatted for, under another name (a
    /// moved file, another NBD URI): open it and record the new name. Without it a different
    /// backing device is refused.
    #[arg(long)]
    #[serde(default)]
    accept_backing_rename: bool,
    /// Clean cached lines differ from the backing device (written behind the cache's back)
    /// while the cache holds dirty lines: start anyway, dropping the clean lines and keeping
    /// the dirty ones, which will be written over those changes.
    #[arg(long)]
    #[serde(default)]
    accept_backing_changes: bool,
    /// Directory for the cache's state file (`<uuid>.tiercache-state`), which records a
    /// failure of the cache device so that a failed cache is never restored (default: beside
    /// the cache file, `<cache>.tiercache-state`; for an NBD cache device
    /// $TIERCACHE_STATE_DIR, else $STATE_DIRECTORY, else /var/lib/tiercache as root, else
    /// $XDG_STATE_HOME/tiercache or ~/.local/state/tiercache).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Control socket for `tiercache ctl`.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Prometheus metrics endpoint ADDR:PORT (GET /metrics).
    #[arg(long)]
    metrics: Option<String>,
    /// Live dashboard on [ADDR:]PORT (a bare PORT binds 127.0.0.1): GET / is a page of
    /// IOPS, MB/s, device IOPS, hit ratio, occupancy and dirty share over the last 10
    /// minutes, refreshed every second; GET /api/stats is the same as JSON.
    #[arg(long)]
    http: Option<String>,
    /// TOML file with any of these settings.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Cache-device I/O errors after which the cache is failed: dirty data written back,
    /// every request passed through to the backing device (default 16; the log layout
    /// counts read errors, a write or sync error fails it at once).
    #[arg(long)]
    max_cache_errors: Option<u64>,
    /// Metadata records of likely victims unmapped together ahead of their eviction, at most
    /// an eighth of the cache (default 1024; 0: each one alone when its slot is reused).
    #[arg(long)]
    unmap_batch: Option<u64>,
    /// Make the backing device as slow as a real HDD: a preset (7200, 5400, 10k, 15k) or an
    /// HDD model TOML file (see crates/devices).
    #[arg(long)]
    emulate_hdd: Option<String>,
    /// Make the cache device as slow as a simple SSD: LAT_US of service time per 4 KiB on
    /// each of CHANNELS concurrent channels (default 1), e.g. 200:1. `sim --ssd emu:LAT_US:CHANNELS`
    /// is the same rule.
    #[arg(long, value_name = "LAT_US[:CHANNELS]")]
    emulate_ssd: Option<String>,
    /// Threads executing NBD requests, shared by all connections: requests beyond that wait
    /// in one queue; threads do not grow with connections [default: 32].
    #[arg(long)]
    workers: Option<usize>,
    /// When write-back data is cleaned down to the low watermark: `background` (a thread,
    /// off the request path; the default) or `inline` (right after the request that crossed
    /// the high watermark, as `tiercache sim` does: a queue-depth-1 replay then gives the
    /// simulator's counts exactly).
    #[arg(long, value_parser = ["background", "inline"])]
    cleaner: Option<String>,
    /// Cleaning writes a disk chunk of this size (e.g. 1M; 0 = off) back in one request,
    /// its gaps read once, when it holds at least --rewrite-min-runs runs of dirty lines.
    #[arg(long, value_name = "SIZE")]
    rewrite_chunk: Option<String>,
    /// Runs of dirty lines in a chunk from which cleaning rewrites it whole. Default: the
    /// crossover of the --emulate-hdd model (else of the 7200 rpm model).
    #[arg(long, value_name = "N")]
    rewrite_min_runs: Option<u64>,
    /// Write-back cleaning order: lba (disk order; default), acp (densest disk chunk first,
    /// Open CAS's ACP) or alru (longest dirty first; lines dirty for more than
    /// --cleaning-age requests are cleaned below the watermark too). `ctl set cleaning`.
    #[arg(long, value_name = "lba|acp|alru")]
    cleaning: Option<String>,
    /// --cleaning alru: requests after which a dirty line is cleaned [default: 100000].
    #[arg(long, value_name = "REQUESTS")]
    cleaning_age: Option<u64>,
    /// Background cleaning below the high watermark: auto (a PD controller, as bcache's,
    /// holds the dirty share near --writeback-target with a rate that rises with the
    /// distance), off (watermarks only; the default), or a fixed rate in lines/s.
    /// `ctl set writeback-rate`.
    #[arg(long, value_name = "auto|off|N")]
    writeback_rate: Option<String>,
    /// Dirty share the write-back rate holds [default: 0.5]. `ctl set writeback-target`.
    #[arg(long, value_name = "FRACTION")]
    writeback_target: Option<f64>,
    /// RAM tier above the cache: this much memory (e.g. 256MiB) keeps clean whole lines, so
    /// the hottest reads are served without the volume lock or the cache device. Writes,
    /// trims and write-zeroes drop their lines from it; it starts empty at each start.
    /// `ctl stats` shows reads per tier (RAM hits, SSD hits, misses). Both layouts;
    /// `ctl set ram-cache SIZE` resizes it live (emptying it).
    #[arg(long, value_name = "SIZE")]
    ram_cache: Option<String>,
    /// The RAM tier's replacement policy (see `tiercache policies`) [default: s3fifo].
    #[arg(long, value_name = "NAME")]
    ram_policy: Option<String>,
    /// I/O class table (TOML, e.g. experiments/classes/filesystem.toml) for `--policy dss`,
    /// partitions, rules and per-class statistics. Default: the built-in file-system table.
    /// The log layout takes `never` classes (not cached) and counts every class; it refuses
    /// partitions.
    #[arg(long)]
    classes: Option<PathBuf>,
    /// How requests get their class: none (class 0), rules (the table's [[rule]]s or
    /// --class-rules), ext4 (learns an ext4 file system from the blocks passing through;
    /// other blocks fall back to the rules).
    #[arg(long)]
    classifier: Option<String>,
    /// Rules file (`version = 1` and [[rule]]s) replacing the table's rules.
    #[arg(long)]
    class_rules: Option<PathBuf>,
    /// `--layout log` and its options (with --format-if-needed; see `tiercache format`).
    #[command(flatten)]
    #[serde(skip)]
    layout: crate::layout_args::LayoutArgs,
    /// Engine settings for this run, as `tiercache sim` takes them (direct layout; the
    /// line size, and the preset's, are fixed at format). Stored with the cache: a restart
    /// without them keeps them; `ctl set` changes them live.
    #[command(flatten)]
    #[serde(flatten)]
    tune: TuneArgs,
}

const SERVE_HELP: &str = "\
Exports the backing device, cached on the cache device, over NBD. The cache's metadata lives
on the cache device, so a restart (clean, or after a crash) comes back warm. SIGTERM/SIGINT
shut down cleanly: requests in flight finish, metadata is written, the cache is marked clean.

Examples:
  tiercache serve --cache cache.img --backing disk.img --socket /run/tiercache.sock \\
      --format-if-needed --cache-size 8G --mode write-back --control /run/tiercache.ctl
  nbdinfo 'nbd+unix:///?socket=/run/tiercache.sock'
  tiercache ctl --control /run/tiercache.ctl stats

Network access: a unix socket by default; `--listen 10809` binds 127.0.0.1 only, another
interface must be named (`--listen 0.0.0.0:10809`). TLS (NBD STARTTLS) with a pre-shared key:
  psktool -u alice -p keys.psk      # or: echo \"alice:$(openssl rand -hex 32)\" > keys.psk
  tiercache serve ... --listen 0.0.0.0:10809 --tls require --tls-psk-file keys.psk
  nbdinfo 'nbds://alice@server/tiercache?tls-psk-file=keys.psk'
or with X.509: `--tls-certificates DIR` (server-cert.pem, server-key.pem; clients use the CA's
ca-cert.pem: `nbds://server/tiercache?tls-certificates=DIR`).
TCP without `--tls require` is open to every local user (and, off loopback, to anyone who can
reach it): serve says so at start.

Host access: the NBD socket, the control socket and a cache file serve creates are 0600 (the
server's user only) whatever the umask; `--socket-group GROUP` lets a group use the NBD socket
(0660). The control socket answers only the server's uid and root (checked by SO_PEERCRED).
`--format-if-needed` formats only a file it creates or a device whose first MiB is zeros.

Several volumes sharing one cache (one pool of lines, one cleaner; direct layout):
  tiercache serve --cache cache.img --volume db=/dev/sdb --volume logs=/dev/sdc \
      --volume-mode logs=write-through --mode write-back --socket /run/tiercache.sock ...
  nbdinfo --list 'nbd+unix:///?socket=/run/tiercache.sock'    # exports db and logs
A volume's own --volume-mode, --volume-admission NAME=RULE and --volume-seq-cutoff NAME=SIZE
are stored with the cache (a restart keeps them; flags given win) and changed live by
`tiercache ctl --volume NAME set mode|admission|seq-cutoff VALUE` (VALUE `pool`: the pool's).
Each volume's backing device is recorded in the cache (checked at every start, by name); a
volume left out of a later start is refused if the cache holds dirty data of it.

Config file (same keys as the flags):
  cache = \"/var/lib/tiercache/cache.img\"
  backing = \"/dev/sdb\"
  socket = \"/run/tiercache/nbd.sock\"
  mode = \"write-back\"
  control = \"/run/tiercache/control.sock\"
  metrics = \"127.0.0.1:9477\"
  http = \"127.0.0.1:9478\"          # live dashboard: http://127.0.0.1:9478/
  seq_cutoff = \"1m\"           # engine settings as `tiercache sim` takes them
  # instead of `backing`, several volumes:
  # [[volume]]
  # name = \"db\"
  # backing = \"/dev/sdb\"
  # admission = \"nhit:2\"      # its own mode, admission, seq_cutoff (optional)

Live tuning (stored with the cache, so a restart keeps them):
  tiercache ctl --control /run/tiercache/control.sock set admission nhit:2:0
  tiercache ctl --control /run/tiercache/control.sock get
The class table is per run: `ctl classes load FILE` replaces it until the next restart
(`tiercache ctl classes load --help`).";

#[derive(Args)]
pub struct CtlArgs {
    /// The server's control socket (`serve --control`).
    #[arg(long)]
    control: PathBuf,
    /// One volume of a server of several (`serve --volume NAME=BACKING`): its statistics
    /// (`stats`), its own settings (`get`, `set mode|admission|seq-cutoff|seq-cutoff-write
    /// VALUE`, VALUE `pool` to follow the pool's again, `mode`, `detach`; stored with the
    /// cache; the other settings are the pool's), and `flush` (the pool's cleaner: every
    /// volume's dirty data).
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Subcommand)]
enum CtlCmd {
    /// Hits, misses, occupancy, dirty data, per class, and the settings in force.
    Stats {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Then zero the counters and latency histograms (as `casadm -Z`); fault state is
        /// kept. The statistics shown are those before the reset.
        #[arg(long)]
        reset: bool,
        /// One `section,name,value,unit` row per figure (as `casadm -P -o csv`).
        #[arg(long, conflicts_with = "json")]
        csv: bool,
    },
    /// Show the settings in force (all, or one): mode, admission, seq-cutoff,
    /// seq-cutoff-write, group-size, dirty-high, dirty-low, clean-victim-window,
    /// partial-fill, cleaning, cleaning-age, writeback-rate, writeback-target, classes (the class table in force, where it came
    /// from, live loads), slru-protected, policy, line-size.
    Get { key: Option<String> },
    /// Change a setting on the running volume, parsed as the `sim`/`serve` flag of the same
    /// name: `set admission nhit:2:0`, `set seq-cutoff 1m`, `set dirty-high 0.9`, `set mode wb`,
    /// `set clean-victim-window 8`, `set partial-fill off` (`--no-partial-fill`; `on` again).
    /// Logged, shown by `ctl stats` and the metrics, and stored with the cache (a restart
    /// keeps it).
    #[command(after_help = "Examples:
  tiercache ctl --control /run/tiercache.ctl set admission never
  tiercache ctl --control /run/tiercache.ctl set seq-cutoff 1m
  tiercache ctl --control /run/tiercache.ctl get admission")]
    Set { key: String, value: String },
    /// Write back every dirty line and make everything durable.
    Flush,
    /// Change the write mode (leaving write-back writes back dirty data first).
    Mode { mode: String },
    /// Write back dirty data, then pass everything through to the backing device.
    Detach,
    /// The I/O class table of the running volume (both layouts): `classes load FILE`.
    Classes {
        #[command(subcommand)]
        cmd: ClassesCmd,
    },
    /// Add or remove a volume of a server of several (`serve --volume`) while the others
    /// keep serving: `volume add NAME=BACKING [--mode M]`, `volume remove NAME`.
    Volume {
        #[command(subcommand)]
        cmd: VolumeCmd,
    },
    /// The cache devices of a pool (`serve --cache` repeated): `cache list`.
    Cache {
        #[command(subcommand)]
        cmd: CacheCmd,
    },
}

#[derive(Subcommand)]
enum CacheCmd {
    /// The members of the cache pool: index, path, state (active, failed), lines cached,
    /// dirty lines, errors counted against it (failed at `--max-cache-errors`).
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Replace failed member INDEX by the device at PATH (a file, a block device or an NBD
    /// URI, holding at least that member's lines): it is formatted as member INDEX (new
    /// member uuid; every member's pool block says it is active), its slots serve again, and
    /// the cleaner re-mirrors the dirty lines left with one copy. Refused unless member
    /// INDEX has failed and PATH is not a member of the pool. Serve later with PATH in
    /// place of the failed device.
    Replace { index: usize, path: PathBuf },
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Serve a new volume from now on: its NBD export NAME is listed and serves reads and
    /// writes when this returns, and the cache records it (a restart serves it again, from
    /// the device recorded, when the command line does not name it).
    #[command(after_help = "Example:
  tiercache ctl --control /run/tiercache.ctl volume add logs=/dev/sdd --mode write-through")]
    Add {
        /// NAME=BACKING: the export name and the backing device (a path or an NBD URI).
        spec: String,
        /// The volume's own mode (else the pool's).
        #[arg(long)]
        mode: Option<String>,
    },
    /// Take volume NAME out of the pool: refused while it holds dirty data (run
    /// `ctl --volume NAME detach` first); its cached lines leave the pool, new connections
    /// to its export are refused, connections still open get EIO, and a restart does not
    /// serve it again. Its name may be reused by `volume add` (a new volume).
    Remove { name: String },
}

#[derive(Subcommand)]
enum ClassesCmd {
    /// Replace the class table of the running volume with FILE (the format of
    /// `serve --classes`; `--rules` as `serve --class-rules`). Checked before anything
    /// changes: a bad file is refused with its file and line and the old table stays.
    #[command(after_help = CLASSES_HELP)]
    Load {
        /// Class table (TOML: `version = 1`, [[class]]es, optional [[rule]]s), e.g.
        /// experiments/classes/filesystem.toml.
        file: PathBuf,
        /// Rules file (`version = 1` and [[rule]]s) replacing FILE's rules.
        #[arg(long)]
        rules: Option<PathBuf>,
    },
}

const CLASSES_HELP: &str = "Example FILE (a class made `never` stops being cached; priorities
decide what DSS evicts first, 0 = kept longest):
  version = 1
  name = \"nightly\"
  clean_threshold = 0.15        # DSS: below 15 % clean only `always` classes are allocated
  [[class]]
  id = 1
  name = \"metadata\"
  priority = 0
  allocation = \"always\"       # always | conditional | never (= bypass)
  [[class]]
  id = 8
  name = \"backup\"
  priority = 9
  allocation = \"never\"
  max_share = 0.1               # partitions (any policy): at most 10 % of the cache
  [[rule]]                      # used by --classifier rules (and ext4 as its fallback)
  class = \"backup\"
  offset = [1073741824, 2147483648]

  tiercache ctl --control /run/tiercache.ctl classes load nightly.toml
  tiercache ctl --control /run/tiercache.ctl get classes

What happens:
- From the next request on, allocation (DSS, `never` classes), eviction order (DSS
  priorities) and partitions follow the new table, and `ctl stats` and the metrics name
  classes by it. Logged, counted in `ctl stats --json` (class_table.loads).
- Lines already cached keep their data and their class id; they are judged by the new
  table's class of that id (a class made `never` keeps its cached lines until they are
  evicted or overwritten; they are not dropped or relabelled).
- The classifier chosen at start (`serve --classifier`) stays and uses the new table's rules
  and class names; with no classifier every request is class 0, so only class 0's entry
  matters.
- Not stored: the table is per run. A restart uses `serve`'s --classes/--class-rules (or
  the config file's `classes`); put the file there to keep it.
- The log layout: `never` classes stop being cached from the next request on, every class
  is counted; priorities and object sizes do not apply (segments are picked by --picker)
  and a table with partitions (min_share/max_share) is refused, changing nothing.";

/// Logs to stderr, ignoring errors: a server whose stderr went away (closed pipe) must still
/// shut down cleanly rather than panic in `eprintln!`.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `cache` in a config file: a path, a list of paths, or `[[cache]]` tables (`path`).
fn cache_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Table {
        path: PathBuf,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Path(PathBuf),
        Table(Table),
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        One(PathBuf),
        Many(Vec<Entry>),
    }
    Ok(match Option::<Given>::deserialize(d)? {
        None => Vec::new(),
        Some(Given::One(p)) => vec![p],
        Some(Given::Many(v)) => v
            .into_iter()
            .map(|e| match e {
                Entry::Path(p) => p,
                Entry::Table(t) => t.path,
            })
            .collect(),
    })
}

/// `cache` written back: nothing, one path, or a list (as [`cache_entries`] reads them).
fn cache_entries_out<S: serde::Serializer>(v: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
    match v {
        [] => s.serialize_none(),
        [one] => one.serialize(s),
        many => many.serialize(s),
    }
}

/// A `[[volume]]` table of a config file: `name`, `backing`, and the volume's own settings
/// (`mode`, `admission`, `seq_cutoff`: as `--volume-mode NAME=MODE`, ...).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeTable {
    name: String,
    backing: String,
    mode: Option<String>,
    admission: Option<String>,
    seq_cutoff: Option<String>,
    share: Option<String>,
}

/// The own settings of the `[[volume]]` tables of config file `table`, added to `c`'s
/// `volume_mode`, `volume_admission`, `volume_seq_cutoff` (as the flags give them).
fn volume_table_settings(table: &toml::Table, c: &mut ServeArgs) {
    let Some(toml::Value::Array(vols)) = table.get("volume") else {
        return;
    };
    for v in vols {
        let Ok(t) = v.clone().try_into::<VolumeTable>() else {
            continue;
        };
        for (val, out) in [
            (t.mode, &mut c.volume_mode),
            (t.admission, &mut c.volume_admission),
            (t.seq_cutoff, &mut c.volume_seq_cutoff),
            (t.share, &mut c.volume_share),
        ] {
            if let Some(x) = val {
                out.push(format!("{}={x}", t.name));
            }
        }
    }
}

/// `volume` in a config file: `"NAME=BACKING"` strings or `[[volume]]` tables
/// ([`VolumeTable`]; their settings are taken by [`volume_table_settings`]).
fn volume_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    type Table = VolumeTable;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Flag(String),
        Table(Table),
    }
    Ok(Vec::<Entry>::deserialize(d)?
        .into_iter()
        .map(|e| match e {
            Entry::Flag(s) => s,
            Entry::Table(t) => format!("{}={}", t.name, t.backing),
        })
        .collect())
}

/// `--volume NAME=BACKING` and `--volume-mode NAME=MODE`: (name, path, mode), names checked
/// and unique. A mode whose name no `--volume` gives is left out here: it may name a volume
/// added live that the cache's table records ([`volume_names_known`] checks, and
/// [`restore_live_changes`] applies it).
fn volume_args(a: &ServeArgs) -> Result<Vec<(String, PathBuf, Option<Mode>)>> {
    let mut out: Vec<(String, PathBuf, Option<Mode>)> = Vec::new();
    for v in &a.volume {
        let Some((name, path)) = v.split_once('=') else {
            bail!("--volume {v:?}: give NAME=BACKING (e.g. --volume db=/dev/sdb)");
        };
        tiercache_server::volume_set::check_name(name).map_err(|e| anyhow!("--volume {v}: {e}"))?;
        if out.iter().any(|o| o.0 == name) {
            bail!("--volume {name}: given twice");
        }
        out.push((name.to_string(), PathBuf::from(path), None));
    }
    for m in &a.volume_mode {
        let Some((name, mode)) = m.split_once('=') else {
            bail!("--volume-mode {m:?}: give NAME=MODE (e.g. --volume-mode logs=write-through)");
        };
        let mode = mode_arg(mode).with_context(|| format!("--volume-mode {m}"))?;
        if let Some(o) = out.iter_mut().find(|o| o.0 == name) {
            o.2 = Some(mode);
        }
    }
    Ok(out)
}

/// Every name `--volume-mode`, `--volume-admission` and `--volume-seq-cutoff` give is one of
/// `known`: the `--volume`s, plus, once the cache's volume table is read, the volumes added
/// live that it records.
fn volume_names_known(a: &ServeArgs, known: &[&str]) -> Result<()> {
    let flags = [
        ("--volume-mode", &a.volume_mode),
        ("--volume-admission", &a.volume_admission),
        ("--volume-seq-cutoff", &a.volume_seq_cutoff),
        ("--volume-share", &a.volume_share),
    ];
    for (flag, list) in flags {
        for s in list {
            let name = s.split_once('=').map_or(s.as_str(), |x| x.0);
            if !known.contains(&name) {
                bail!(
                    "{flag} {s}: no --volume named {name:?} (volumes: {})",
                    known.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// `--volume-admission NAME=RULE` and `--volume-seq-cutoff NAME=SIZE` (parsed as `sim`
/// parses them, `tiercache_server::vol_tuning`): each volume's own settings (names checked by
/// [`volume_names_known`]).
fn volume_flags(a: &ServeArgs) -> Result<Vec<tiercache_server::vol_tuning::VolumeFlags>> {
    use tiercache_server::vol_tuning::{admission_flag, cutoff_flag, share_flag, VolumeFlags};
    fn entry(out: &mut Vec<VolumeFlags>, name: String) -> &mut VolumeFlags {
        let i = match out.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                out.push(VolumeFlags {
                    name,
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        &mut out[i]
    }
    let mut out: Vec<VolumeFlags> = Vec::new();
    for s in &a.volume_admission {
        let (name, rule) = admission_flag("--volume-admission", s).map_err(|e| anyhow!(e))?;
        entry(&mut out, name).admission = Some(rule);
    }
    for s in &a.volume_seq_cutoff {
        let (name, cut) = cutoff_flag("--volume-seq-cutoff", s).map_err(|e| anyhow!(e))?;
        entry(&mut out, name).seq_cutoff = Some(cut);
    }
    for s in &a.volume_share {
        let (name, share) = share_flag("--volume-share", s).map_err(|e| anyhow!(e))?;
        entry(&mut out, name).share = Some(share);
    }
    let sum: u64 = out
        .iter()
        .filter_map(|f| f.share)
        .map(|s| u64::from(s.min_ppm))
        .sum();
    if sum > 1_000_000 {
        bail!(
            "--volume-share: the minimum shares add up to {:.1}%, more than the whole pool",
            sum as f64 / 10_000.0
        );
    }
    Ok(out)
}

/// The backing device: a file, a block device, or an NBD export (`nbd://HOST[:PORT]/NAME`,
/// `nbd+unix:///NAME?socket=PATH`) — cache a remote volume on a local SSD.
fn open_backing(
    path: &std::path::Path,
    timeout: Option<std::time::Duration>,
) -> Result<Box<dyn BlockDev>> {
    let text = path.to_string_lossy();
    if NbdDev::is_uri(&text) {
        let dev = NbdDev::connect_with_timeout(&text, timeout)
            .with_context(|| format!("--backing {text}"))?;
        if dev.read_only() {
            bail!("--backing {text}: the export is read-only; a cache needs to write back to it");
        }
        say!("backing device: NBD export {text} ({} bytes)", dev.size());
        return Ok(Box::new(dev));
    }
    Ok(Box::new(FileDev::open(path).with_context(|| {
        format!(
            "cannot open the backing device (--backing {})",
            path.display()
        )
    })?))
}

/// The pool of `serve --cache A --cache B ...` (`first` is A, open): the members in any
/// order, refused with the member named when one is missing, foreign or given twice, and
/// `--dirty-copies` differing from the pool's refused (write-back defaults to 2, stored in the
/// pool blocks; 1 is warned). Returns the pool and
/// the path of its member 0, whatever the order given: the pool's name in messages and where
/// its state file goes (so a failure recorded is found again with the paths swapped).
fn open_pool(
    a: &ServeArgs,
    first: Box<dyn BlockDev>,
    timeout: Option<std::time::Duration>,
    mode: Option<Mode>,
) -> Result<(Box<dyn BlockDev>, PathBuf)> {
    let mut devs = vec![(a.cache[0].display().to_string(), first)];
    for p in &a.cache[1..] {
        devs.push((p.display().to_string(), open_pool_member(a, p, timeout)));
    }
    let how = tiercache_server::pool_dev::PoolOpen {
        degraded: true,
        accept_lost_dirty: a.accept_lost_dirty,
        // Keyed by the pool's uuid in the state directory, not beside a member: the
        // member beside which it would be may be the one missing.
        state_dir: a.state_dir.clone().or_else(default_state_dir),
    };
    let pd = tiercache_server::PoolDev::open_with(devs, how).map_err(|e| anyhow!(e))?;
    let stored = tiercache_server::read_superblock(&pd)
        .ok()
        .and_then(|sb| Mode::ALL.get(sb.mode as usize).copied());
    // A volume in write-back (`--volume-mode NAME=write-back`) on a pool in another mode
    // makes dirty lines all the same: they are mirrored as the pool's would be.
    let volume_wb = volume_args(a)?.iter().any(|v| v.2 == Some(Mode::WriteBack));
    if let Some(m) = mode.or(stored) {
        let m = if volume_wb { Mode::WriteBack } else { m };
        use tiercache_server::pool_dev::{
            check_dirty_copies, effective_dirty_copies, single_copy_warning,
        };
        check_dirty_copies(a.cache.len(), a.dirty_copies).map_err(|e| anyhow!(e))?;
        // Given, or stored, or the default (2 in write-back): stored in the pool blocks when
        // it was not (so a later serve cannot misread copy records); a given value differing
        // from the stored one is refused, naming both.
        if a.dirty_copies.is_some() || pd.dirty_copies().is_some() || m == Mode::WriteBack {
            let n = effective_dirty_copies(a.cache.len(), m, a.dirty_copies.or(pd.dirty_copies()));
            pd.choose_dirty_copies(n).map_err(|e| anyhow!(e))?;
            if let Some(w) = single_copy_warning(a.cache.len(), m, n) {
                say!("warning: {w}");
            }
        }
    }
    say!(
        "cache pool {}: {} devices ({}), {} lines",
        state_file::uuid_hex(&pd.pool_uuid()),
        a.cache.len(),
        pd.member_names().join(", "),
        pd.pool().capacity()
    );
    // Member 0's path (the path it was given by when it is missing and that is known),
    // else the first given: where the pool's state file goes beside.
    let m0 = pd.member_names().swap_remove(0);
    let path = a
        .cache
        .iter()
        .find(|p| p.display().to_string() == m0)
        .cloned()
        .unwrap_or_else(|| {
            say!(
                "pool member 0 is missing and its path is not known: its state file is looked for beside {}",
                a.cache[0].display()
            );
            a.cache[0].clone()
        });
    Ok((Box::new(pd), path))
}

/// A pool member as `serve` opens it: a device that cannot be opened (a deleted file)
/// stands as one that cannot be read, which the pool's open leaves out as missing when
/// nothing would be lost (`PoolDev::open_with`).
fn open_pool_member(
    a: &ServeArgs,
    p: &Path,
    timeout: Option<std::time::Duration>,
) -> Box<dyn BlockDev> {
    match open_served_cache(a, p, timeout) {
        Ok(d) => d,
        Err(e) => Box::new(Unopened(format!("{e:#}"))),
    }
}

/// A cache device that could not be opened: every access fails with why.
struct Unopened(String);

impl BlockDev for Unopened {
    fn size(&self) -> u64 {
        0
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other(self.0.clone()))
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other(self.0.clone()))
    }
    fn sync(&self) -> std::io::Result<()> {
        Err(std::io::Error::other(self.0.clone()))
    }
}

/// A cache device (or pool member) as `serve` uses it: opened, and slowed to an emulated SSD
/// with `--emulate-ssd` (each member of a pool on its own channels).
fn open_served_cache(
    a: &ServeArgs,
    p: &Path,
    timeout: Option<std::time::Duration>,
) -> Result<Box<dyn BlockDev>> {
    let cache = open_cache(p, timeout)?;
    Ok(match &a.emulate_ssd {
        Some(spec) => {
            let (lat, channels) =
                tiercache_server::parse_emulate_ssd(spec).map_err(|e| anyhow!(e))?;
            Box::new(
                tiercache_server::EmulatedSsd::new(cache, lat, channels).map_err(|e| anyhow!(e))?,
            )
        }
        None => cache,
    })
}

/// The cache device: a file, a block device, or an NBD export (so cache faults can be
/// injected with nbdkit's filters).
fn open_cache(
    path: &std::path::Path,
    timeout: Option<std::time::Duration>,
) -> Result<Box<dyn BlockDev>> {
    let text = path.to_string_lossy();
    if NbdDev::is_uri(&text) {
        let dev = NbdDev::connect_with_timeout(&text, timeout)
            .with_context(|| format!("--cache {text}"))?;
        if dev.read_only() {
            bail!("--cache {text}: the export is read-only; a cache device must be writable");
        }
        say!("cache device: NBD export {text} ({} bytes)", dev.size());
        return Ok(Box::new(dev));
    }
    Ok(Box::new(FileDev::open(path).with_context(|| {
        format!("cannot open the cache device (--cache {})", path.display())
    })?))
}

/// Creates a missing cache file big enough for `bytes` of lines of `ls` and their metadata,
/// 0600 whatever the umask: the file will hold the volume's data.
fn create_cache_file(path: &Path, bytes: u64, ls: u64, data_checksums: bool) -> Result<()> {
    anyhow::ensure!(ls > 0, "--line-size must be above 0");
    let total = cache_file_len(bytes, ls, data_checksums);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|f| f.set_len(total))
        .with_context(|| format!("creating the cache device {}", path.display()))
}

/// The length of the file [`create_cache_file`] makes for `bytes` of lines of `ls`.
fn cache_file_len(bytes: u64, ls: u64, data_checksums: bool) -> u64 {
    let lines = bytes / ls;
    Superblock::data_offset_with(lines, ls, data_checksums) + lines * ls
}

/// `serve --cache-size` on a cache that already holds a cache: the formatted size is what is
/// served, so a different size is refused rather than ignored. The same size (a restart
/// repeating the command line that formatted it) passes. `formatted`: (lines, line size) of a
/// direct-layout superblock; `log_device`: (device size, line size, data checksums) for the
/// log layout, which uses its whole device: only the length of the file `--format-if-needed
/// --cache-size` creates matches.
fn formatted_size_matches(
    cache_path: &Path,
    given: &str,
    bytes: u64,
    formatted: Option<(u64, u64)>,
    log_device: Option<(u64, u64, bool)>,
) -> Result<()> {
    let (what, same) = match (formatted, log_device) {
        (Some((lines, ls)), _) => {
            if bytes / ls == lines {
                return Ok(());
            }
            (
                format!(
                    "is formatted with {lines} lines of {ls} bytes ({})",
                    tiercache_engine::fmt_size(lines * ls)
                ),
                format!(" (or with --cache-size {}, its size)", lines * ls),
            )
        }
        (None, Some((dev_size, ls, sums))) => {
            if cache_file_len(bytes, ls, sums) == dev_size {
                return Ok(());
            }
            (
                format!(
                    "is formatted in the log layout (or, blank, would be), which uses its whole device ({})",
                    tiercache_engine::fmt_size(dev_size)
                ),
                String::new(),
            )
        }
        (None, None) => return Ok(()),
    };
    bail!(
        "--cache-size {given}: {} {what}; --cache-size only sizes a new cache and would be ignored. \
         Serve it as it is without --cache-size{same}; to resize it, write its dirty data back \
         (`tiercache ctl flush`), stop it, remove the file and start again with --format-if-needed \
         --cache-size {given} (a block device: `tiercache format --force`)",
        cache_path.display()
    )
}

/// Fails when the directory a socket is to be created in does not exist, before anything is
/// opened, created or announced.
fn socket_dir_exists(flag: &str, sock: &Path) -> Result<()> {
    let dir = match sock.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => return Ok(()),
    };
    if !dir.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist; create it (mkdir -p {}) or choose another path",
            sock.display(),
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// `format` without --force: refuses a device holding a cache, valid or damaged (its magic
/// is there): it may hold dirty data the backing device does not have.
fn refuse_existing_cache(path: &std::path::Path, cache: &dyn BlockDev) -> Result<()> {
    let what = match tiercache_server::probe(cache) {
        Ok(Found::Direct(sb)) => format!(
            "a tiercache cache ({} lines of {} bytes, generation {}, backing {}, {})",
            sb.capacity_lines,
            sb.line_size,
            sb.generation,
            sb.backing.describe(),
            if sb.clean {
                "stopped cleanly"
            } else {
                "not stopped cleanly"
            }
        ),
        Ok(Found::Log(_)) => "a tiercache cache (log layout)".to_string(),
        Ok(Found::DamagedLog(e)) => format!("a damaged tiercache cache (log layout: {e})"),
        Ok(Found::NoCache(FormatError::BadMagic)) => return Ok(()),
        Ok(Found::NoCache(FormatError::Io(e))) | Err(e) => {
            return Err(e).context(format!("reading {}", path.display()))
        }
        Ok(Found::NoCache(e)) => {
            format!("a damaged tiercache cache ({e}); `tiercache check` tells more")
        }
    };
    bail!(
        "{} already holds {what}; it may hold dirty data that is not on the backing device yet. Serve it and run `tiercache ctl flush` first, or add --force to discard it",
        path.display()
    )
}

fn size_arg(what: &str, s: &str) -> Result<u64> {
    parse_size(s).map_err(|e| anyhow!("{what} {s:?}: {e}"))
}

/// The line size and engine settings a new cache gets from `--line-size` and the engine
/// flags, parsed by the simulator's parser (a preset picks the line unless `--line-size` is
/// given, as in `sim`); the settings are `None` when no engine flag is given (defaults).
fn format_settings(
    line: Option<&str>,
    policy: &str,
    tune: &TuneArgs,
) -> Result<(u64, Option<Tuning>)> {
    let mut cfg = EngineConfig {
        policy: policy.into(),
        ..Default::default()
    };
    tiercache_sim::experiment::CacheSection {
        line_size: line.map(String::from),
        ..tune.section()
    }
    .apply_engine(&mut cfg)?;
    Ok((cfg.line_size, (!tune.is_empty()).then(|| Tuning::of(&cfg))))
}

/// The engine settings `tune` asks for on the cache `path` of `line`-byte lines, over the
/// `stored` ones, parsed by the simulator's parser; `None` when `tune` is empty (the stored
/// ones stay). A preset whose line differs is refused: the line is fixed at format.
fn serve_settings(
    path: &Path,
    line: u64,
    policy: &str,
    stored: Option<Tuning>,
    tune: &TuneArgs,
) -> Result<Option<Tuning>> {
    if tune.is_empty() {
        return Ok(None);
    }
    let mut cfg = EngineConfig {
        line_size: line,
        group_size: line,
        policy: policy.into(),
        ..Default::default()
    };
    if let Some(t) = stored {
        t.apply(&mut cfg);
    }
    tune.section()
        .apply_engine(&mut cfg)
        .map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    if cfg.line_size != line {
        bail!(
            "{}: --preset {} uses {}-byte lines, but this cache is formatted with {line}-byte lines (the line size is fixed at format): format it with `tiercache format --force --preset {}`, or give the settings alone (--group-size, --admission)",
            path.display(),
            tune.preset.as_deref().unwrap_or("?"),
            cfg.line_size,
            tune.preset.as_deref().unwrap_or("?"),
        );
    }
    Ok(Some(Tuning::of(&cfg)))
}

/// `--policy NAME` for a live cache: refused when offline (`belady` needs the future).
fn live_policy(name: &str) -> Result<()> {
    if tiercache_engine::policy::is_offline(name) {
        bail!("--policy {name}: an offline policy (it needs the future accesses, which only a simulator replaying a trace has): a live cache cannot run it. Use it with `tiercache sim`; `tiercache policies` lists the others");
    }
    Ok(())
}

fn mode_arg(s: &str) -> Result<Mode> {
    s.parse::<Mode>().map_err(|e| anyhow!("--mode: {e}"))
}

pub fn format(a: FormatArgs) -> Result<()> {
    live_policy(&a.policy)?;
    let (line_size, tuning) = format_settings(a.line_size.as_deref(), &a.policy, &a.tune)?;
    if a.cache.len() >= 2 {
        return format_pool(&a, line_size, tuning);
    }
    if a.dirty_copies.is_some() {
        bail!("--dirty-copies applies to a pool of several cache devices (--cache repeated)");
    }
    let cache_path = a.cache[0].clone();
    if !NbdDev::is_uri(&cache_path.to_string_lossy()) && !cache_path.exists() {
        // As `serve --format-if-needed` does: a missing cache file is created at its size.
        let bytes = a.cache_size.as_deref().ok_or_else(|| {
            anyhow!(
                "the cache device {} does not exist: give --cache-size to create it as a file \
                 (or name an existing file or block device)",
                cache_path.display()
            )
        })?;
        if a.layout.is_log()? {
            bail!("the cache device {} does not exist: the log layout uses a whole existing device; create it first (truncate -s SIZE {})", cache_path.display(), cache_path.display());
        }
        create_cache_file(
            &cache_path,
            size_arg("--cache-size", bytes)?,
            line_size,
            a.data_checksums,
        )?;
    }
    let cache = open_cache(&cache_path, Some(NbdDev::DEFAULT_TIMEOUT))?;
    let backing = open_backing(&a.backing, Some(NbdDev::DEFAULT_TIMEOUT))?;
    if !a.force {
        refuse_existing_cache(&cache_path, &*cache)?;
    }
    let mode = mode_arg(&a.mode)?;
    // The direct-layout settings given (the log layout refuses them).
    let mut direct_only = flag_names(&set_keys(&a.tune));
    if a.data_checksums {
        direct_only.push("--data-checksums".into());
    }
    if let Some(v) = &a.validity {
        direct_only.push(format!("--validity {v}"));
    }
    if a.policy != "lru" {
        direct_only.push(format!("--policy {}", a.policy));
    }
    if a.cache_size.is_some() {
        direct_only.push("--cache-size (the log layout uses the whole device)".into());
    }
    let spec = FormatSpec {
        cache_name: &cache_path,
        direct: FormatOptions {
            line_size,
            mode,
            policy: a.policy.clone(),
            capacity_lines: a
                .cache_size
                .as_deref()
                .map(|s| size_arg("--cache-size", s).map(|b| b / line_size))
                .transpose()?,
            backing_id: a.backing.display().to_string(),
            backing: backing.identity(),
            tuning,
            data_checksums: a.data_checksums,
            validity: validity_arg(a.validity.as_deref())?.unwrap_or_default(),
        },
        log: a
            .layout
            .is_log()?
            .then(|| crate::log_serve::options(&a.layout, line_size, mode, false))
            .transpose()?,
        direct_only,
        log_flags: a.layout.log_flags_given(),
    };
    let old_uuid = old_cache_uuid(&*cache);
    let sb =
        match tiercache_server::format_device(&*cache, &*backing, &spec).map_err(|e| anyhow!(e))? {
            Formatted::Log(sb) => {
                clear_state_files(&cache_path, a.state_dir.as_deref(), old_uuid)?;
                crate::log_serve::print_formatted(&cache_path, &sb);
                return Ok(());
            }
            Formatted::Direct(sb) => sb,
        };
    clear_state_files(&cache_path, a.state_dir.as_deref(), old_uuid)?;
    println!(
        "formatted {}: {} lines of {} bytes ({} cache data), metadata {} bytes{}, mode {}, policy {}, backing {} ({} bytes)",
        cache_path.display(),
        sb.capacity_lines,
        sb.line_size,
        tiercache_engine::fmt_size(sb.capacity_lines * sb.line_size),
        sb.data_offset,
        if sb.data_checksums {
            " (with data checksums)"
        } else {
            ""
        },
        Mode::ALL[sb.mode as usize],
        sb.policy,
        sb.backing.describe(),
        sb.backing_size
    );
    Ok(())
}

/// `format --cache A --cache B ...`: one pool of several cache devices (direct layout, each
/// device used whole; `tiercache_server::PoolDev`).
/// `--validity sector|line`, as `sim` parses it.
fn validity_arg(v: Option<&str>) -> Result<Option<tiercache_engine::Validity>> {
    v.map(|v| v.parse().map_err(|e: String| anyhow!("--validity: {e}")))
        .transpose()
}

fn format_pool(a: &FormatArgs, line_size: u64, tuning: Option<Tuning>) -> Result<()> {
    if a.layout.is_log()? {
        bail!("--layout log with several --cache devices: a pool of cache devices needs the direct layout (the log layout uses one cache device)");
    }
    if a.cache_size.is_some() {
        bail!("--cache-size with several --cache devices: each device of a pool is used whole");
    }
    let mode = mode_arg(&a.mode)?;
    tiercache_server::pool_dev::check_dirty_copies(a.cache.len(), a.dirty_copies)
        .map_err(|e| anyhow!(e))?;
    if let Some(w) = tiercache_server::pool_dev::single_copy_warning(
        a.cache.len(),
        mode,
        tiercache_server::pool_dev::effective_dirty_copies(a.cache.len(), mode, a.dirty_copies),
    ) {
        say!("warning: {w}");
    }
    let backing = open_backing(&a.backing, Some(NbdDev::DEFAULT_TIMEOUT))?;
    let mut devs = Vec::with_capacity(a.cache.len());
    for p in &a.cache {
        let dev = open_cache(p, Some(NbdDev::DEFAULT_TIMEOUT))?;
        if !a.force {
            refuse_existing_cache(p, &*dev)?;
        }
        devs.push((p.display().to_string(), dev));
    }
    let opts = FormatOptions {
        line_size,
        mode,
        policy: a.policy.clone(),
        capacity_lines: None,
        backing_id: a.backing.display().to_string(),
        backing: backing.identity(),
        tuning,
        data_checksums: a.data_checksums,
        validity: validity_arg(a.validity.as_deref())?.unwrap_or_default(),
    };
    let (pd, sb) = tiercache_server::PoolDev::format(devs, backing.size(), &opts, a.dirty_copies)
        .map_err(|e| anyhow!(e))?;
    for p in &a.cache {
        clear_state_files(p, a.state_dir.as_deref(), None)?;
    }
    let members: Vec<String> = pd
        .member_names()
        .iter()
        .enumerate()
        .map(|(d, n)| format!("{n} ({} lines)", pd.pool().lines(d)))
        .collect();
    println!(
        "formatted a pool of {} cache devices, pool {}: {}; {} lines of {} bytes ({} cache data), mode {}, policy {}, backing {} ({} bytes)",
        members.len(),
        state_file::uuid_hex(&pd.pool_uuid()),
        members.join(", "),
        sb.capacity_lines,
        sb.line_size,
        tiercache_engine::fmt_size(sb.capacity_lines * sb.line_size),
        Mode::ALL[sb.mode as usize],
        sb.policy,
        sb.backing.describe(),
        sb.backing_size
    );
    Ok(())
}

/// The state file recording a failure of the cache `uuid` at `cache` (issue 14 item 6):
/// `<uuid>.tiercache-state` in `state_dir`, else beside a cache file, else (an NBD cache
/// device: nowhere beside it) in [`default_state_dir`]; `None` only when there is no
/// default directory either (no $HOME).
pub(crate) fn state_path(
    cache: &Path,
    state_dir: Option<&Path>,
    uuid: &[u8; 16],
) -> Option<PathBuf> {
    match state_dir {
        Some(d) => Some(state_file::in_dir(d, uuid)),
        None if NbdDev::is_uri(&cache.to_string_lossy()) => {
            default_state_dir().map(|d| state_file::in_dir(&d, uuid))
        }
        None => Some(state_file::beside(cache)),
    }
}

/// Where the state files of NBD cache devices go without `--state-dir` (issue 14 item 6):
/// $TIERCACHE_STATE_DIR, else systemd's $STATE_DIRECTORY (`StateDirectory=`), else
/// /var/lib/tiercache for root, else $XDG_STATE_HOME/tiercache or ~/.local/state/tiercache.
pub(crate) fn default_state_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("TIERCACHE_STATE_DIR") {
        return Some(d);
    }
    if let Some(d) = env("STATE_DIRECTORY") {
        // systemd lists one directory per StateDirectory= entry, colon-separated.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        return Some(PathBuf::from(first));
    }
    // /proc/self belongs to the process's effective uid.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    if root {
        return Some(PathBuf::from("/var/lib/tiercache"));
    }
    env("XDG_STATE_HOME")
        .or_else(|| env("HOME").map(|h| h.join(".local/state")))
        .map(|d| d.join("tiercache"))
}

/// The directory `serve` keeps the cache's state file in, if not beside the cache file
/// (created 0700 by [`make_state_dir`]).
fn effective_state_dir(cache: &Path, state_dir: Option<&Path>) -> Option<PathBuf> {
    match state_dir {
        Some(d) => Some(d.to_path_buf()),
        None if NbdDev::is_uri(&cache.to_string_lossy()) => default_state_dir(),
        None => None,
    }
}

fn make_state_dir(d: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
        .with_context(|| format!("creating the state directory {} (--state-dir)", d.display()))
}

/// The uuid of the cache a format is about to overwrite (either layout), if any.
fn old_cache_uuid(cache: &dyn tiercache_server::BlockDev) -> Option<[u8; 16]> {
    tiercache_server::probe(cache).ok().and_then(|f| f.uuid())
}

/// After a successful format: removes the state files that recorded a failure of the cache
/// formatted over (beside the cache file, and in the state directory by the old uuid).
fn clear_state_files(cache: &Path, state_dir: Option<&Path>, old: Option<[u8; 16]>) -> Result<()> {
    let mut paths: Vec<PathBuf> = Vec::new();
    if !NbdDev::is_uri(&cache.to_string_lossy()) {
        paths.push(state_file::beside(cache));
    }
    if let (Some(d), Some(u)) = (effective_state_dir(cache, state_dir), old) {
        paths.push(state_file::in_dir(&d, &u));
    }
    for p in paths {
        if state_file::clear(&p)? {
            println!(
                "removed cache state file {} (it recorded a failure of the cache formatted over)",
                p.display()
            );
        }
    }
    Ok(())
}

/// The fields of `t` set to something other than their default (a `Some`, a `true` switch),
/// by their serde names (the flags' names with underscores). Found through serde, as
/// [`tiercache_sim::experiment::set_fields_over`] merges them, so a field added later is
/// seen without being listed anywhere.
pub(crate) fn set_keys<T: Serialize + Default>(t: &T) -> Vec<String> {
    let value = |t: &T| serde_json::to_value(t).expect("settings serialise to a JSON object");
    let (given, unset) = (value(t), value(&T::default()));
    let (Some(g), Some(u)) = (given.as_object(), unset.as_object()) else {
        panic!("settings must serialise to a map of fields");
    };
    g.iter()
        .filter(|(k, v)| u.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Serde names as the flags they are: `unmap_batch` -> `--unmap-batch`.
pub(crate) fn flag_names(keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|k| format!("--{}", k.replace('_', "-")))
        .collect()
}

/// The `serve` settings (config keys: the flags' names with underscores) a log-layout device
/// takes. Every other setting given with a log device is refused ([`ServeArgs::not_for_log`]),
/// so a flag added to `ServeArgs` is refused on the log layout until the log layout uses it
/// and it is named here, never silently ignored. The direct layout takes every setting.
const LOG_LAYOUT_KEYS: &[&str] = &[
    "cache",
    "backing",
    "socket",
    "socket_group",
    "listen",
    "tls",
    "tls_psk_file",
    "tls_certificates",
    "tls_verify_peer",
    "max_connections",
    "requests_per_connection",
    "max_inflight_bytes",
    "max_inflight_bytes_per_connection",
    "handshake_deadline",
    "max_options",
    "write_timeout",
    "device_timeout",
    "workers",
    "mode",
    "line_size",
    "cache_size",
    "format_if_needed",
    "accept_backing_rename",
    "accept_backing_changes",
    "state_dir",
    "control",
    "metrics",
    "http",
    "max_cache_errors",
    "emulate_hdd",
    "emulate_ssd",
    "classes",
    "classifier",
    "class_rules",
    "ram_cache",
    "ram_policy",
];

impl ServeArgs {
    /// The settings given (merged with the config file) that the log layout does not take,
    /// named as they were given: `--flag` when `flags` (the command line's [`set_keys`])
    /// holds it, else `` `key` in FILE ``.
    fn not_for_log(&self, flags: &[String]) -> Vec<String> {
        set_keys(self)
            .into_iter()
            .filter(|k| !LOG_LAYOUT_KEYS.contains(&k.as_str()))
            .map(|k| match &self.config {
                Some(file) if !flags.contains(&k) => format!("`{k}` in {}", file.display()),
                _ => flag_names(&[k]).remove(0),
            })
            .collect()
    }
}

/// Keys a `serve --config` file may hold: the flags' names with underscores, derived from the
/// flags themselves (the layout's flags and `config` itself are not file keys).
fn config_keys() -> Vec<String> {
    use clap::Args as _;
    let ids = |c: clap::Command| {
        c.get_arguments()
            .map(|a| a.get_id().to_string())
            .collect::<Vec<_>>()
    };
    let layout = ids(crate::layout_args::LayoutArgs::augment_args(
        clap::Command::new("layout"),
    ));
    ids(ServeArgs::augment_args(clap::Command::new("serve")))
        .into_iter()
        .filter(|k| k != "config" && !layout.contains(k))
        .collect()
}

fn merge(a: ServeArgs) -> Result<ServeArgs> {
    let Some(path) = a.config.clone() else {
        return Ok(a);
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let known = config_keys();
    if let Some(k) = table.keys().find(|k| !known.contains(k)) {
        bail!(
            "{}: unknown key {k:?}; a serve config file takes the flags' names with underscores: {}",
            path.display(),
            known.join(", ")
        );
    }
    let mut c: ServeArgs = toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    volume_table_settings(&table, &mut c);
    Ok(over_file(a, c))
}

/// The flags `a` over the config file `file`: every flag given (a `Some`, a `true` switch)
/// wins, field by field through serde so that a new flag cannot be left out. The fields a
/// file cannot set (`config`, the layout's flags) are `a`'s.
fn over_file(a: ServeArgs, file: ServeArgs) -> ServeArgs {
    let mut merged = tiercache_sim::experiment::set_fields_over(&file, &a);
    merged.config = a.config;
    merged.layout = a.layout;
    merged
}

/// `--ram-policy` (or `ram_policy`) without a RAM tier would do nothing: refused, as `sim`
/// refuses it, rather than ignored.
fn check_ram_flags(a: &ServeArgs) -> Result<()> {
    let bytes = a
        .ram_cache
        .as_deref()
        .map(|s| size_arg("--ram-cache", s))
        .transpose()?
        .unwrap_or(0);
    if let (Some(p), 0) = (&a.ram_policy, bytes) {
        bail!(
            "--ram-policy {p} needs a RAM tier: give --ram-cache SIZE too (e.g. --ram-cache 256MiB), or drop --ram-policy"
        );
    }
    Ok(())
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let flags = set_keys(&a);
    let a = merge(a)?;
    let cache_path = a
        .cache
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("--cache PATH is required (or `cache` in --config)"))?;
    let pool = a.cache.len() >= 2;
    if pool {
        if a.layout.is_log()? {
            bail!("--layout log with several --cache devices: a pool of cache devices needs the direct layout (the log layout uses one cache device), as several --volume do");
        }
        if a.format_if_needed {
            bail!("--format-if-needed with several --cache devices: format the pool first with `tiercache format --cache A --cache B ...`");
        }
        if a.cache_size.is_some() {
            bail!("--cache-size with several --cache devices: each device of a pool is used whole");
        }
    } else if a.dirty_copies.is_some() {
        bail!("--dirty-copies applies to a pool of several cache devices (--cache repeated)");
    }
    let vol_args = volume_args(&a)?;
    if !vol_args.is_empty() && a.backing.is_some() {
        bail!("give either --backing (one volume) or --volume NAME=BACKING (several), not both");
    }
    if vol_args.is_empty() && !a.volume_mode.is_empty() {
        bail!("--volume-mode sets the mode of a --volume; with --backing use --mode");
    }
    if vol_args.is_empty()
        && !(a.volume_admission.is_empty()
            && a.volume_seq_cutoff.is_empty()
            && a.volume_share.is_empty())
    {
        bail!("--volume-admission, --volume-seq-cutoff and --volume-share set a --volume's own settings; with --backing use --admission and --seq-cutoff (one volume has the whole pool)");
    }
    let vol_flags = volume_flags(&a)?;
    // A name no --volume gives may be a volume added live (`ctl volume add`) that the
    // cache's table records: checked once the table is read, unless there is no cache yet.
    let given: Vec<&str> = vol_args.iter().map(|v| v.0.as_str()).collect();
    if !cache_path.exists() && !NbdDev::is_uri(&cache_path.to_string_lossy()) {
        volume_names_known(&a, &given)?;
    }
    if !vol_args.is_empty() && a.layout.is_log()? {
        bail!("--volume (several volumes sharing one cache) needs the direct layout; the log layout serves one volume: drop --layout log, or serve one volume with --backing");
    }
    let backing_path = match vol_args.first() {
        Some(v) => v.1.clone(),
        None => a.backing.clone().ok_or_else(|| {
            anyhow!(
                "--backing PATH is required (or `backing` in --config, or --volume NAME=BACKING)"
            )
        })?,
    };
    if a.socket.is_none() == a.listen.is_none() {
        bail!("give exactly one of --socket PATH and --listen ADDR:PORT");
    }
    if let Some(s) = &a.socket {
        socket_dir_exists("--socket", s)?;
    }
    if let Some(c) = &a.control {
        socket_dir_exists("--control", c)?;
    }
    check_ram_flags(&a)?;
    let nbd_opts = nbd_options(&a)?;
    let listen = a.listen.as_deref().map(listen_addr).transpose()?;
    let http = a.http.as_deref().map(http_addr).transpose()?;
    for w in access_warnings(listen, a.tls.as_deref(), a.metrics.as_deref()) {
        say!("{w}");
    }
    if let Some(w) = dashboard_warning(http) {
        say!("{w}");
    }
    let socket_group = match (&a.socket_group, &a.socket) {
        (None, _) => None,
        (Some(g), Some(_)) => Some(
            tiercache_nbd::unix_access::group_id(g)
                .map_err(|e| anyhow!("--socket-group {g:?}: {e}"))?,
        ),
        (Some(_), None) => {
            bail!("--socket-group applies to --socket (a unix socket), not --listen")
        }
    };
    let mode = a.mode.as_deref().map(mode_arg).transpose()?;
    if let Some(p) = &a.policy {
        live_policy(p)?;
    }
    let inline_cleaning = match a.cleaner.as_deref() {
        None | Some("background") => false,
        Some("inline") => true,
        Some(other) => bail!("cleaner {other:?}: background or inline"),
    };
    let line_size = a
        .line_size
        .as_deref()
        .map(|s| size_arg("--line-size", s))
        .transpose()?;
    // A new cache's line and settings (--format-if-needed): the preset's line unless
    // --line-size is given.
    let (new_line, new_tuning) = format_settings(
        a.line_size.as_deref(),
        a.policy.as_deref().unwrap_or("lru"),
        &a.tune,
    )?;
    let cache_size = a
        .cache_size
        .as_deref()
        .map(|s| size_arg("--cache-size", s))
        .transpose()?;

    let device_timeout = match a.device_timeout {
        None => Some(NbdDev::DEFAULT_TIMEOUT),
        Some(0.0) => None,
        Some(s) => Some(
            std::time::Duration::try_from_secs_f64(s)
                .map_err(|e| anyhow!("--device-timeout {s}: {e} (give seconds, 0 for none)"))?,
        ),
    };
    let emulate_hdd = a.emulate_hdd.clone();
    let open_one = move |path: &Path| -> Result<Box<dyn BlockDev>> {
        let backing_file = open_backing(path, device_timeout)?;
        Ok(match &emulate_hdd {
            Some(spec) => {
                let cfg = tiercache_server::hdd_config(spec).map_err(|e| anyhow!(e))?;
                say!("backing device emulates HDD {spec} ({} rpm)", cfg.rpm);
                Box::new(
                    EmulatedHdd::new(backing_file, cfg)
                        .map_err(|e| anyhow!("--emulate-hdd {spec}: {e}"))?,
                )
            }
            None => Box::new(backing_file),
        })
    };
    // Several volumes: each device opened now, put together (ids from the cache's volume
    // table) once the cache device is read.
    let mut vol_devs: Vec<(String, Box<dyn BlockDev>, Option<Mode>)> = Vec::new();
    let open_one: Arc<crate::volume_admin::OpenFn> = Arc::new(open_one);
    for (name, path, mode) in &vol_args {
        let d = open_one(path).with_context(|| format!("--volume {name}"))?;
        vol_devs.push((name.clone(), d, *mode));
    }
    let single = if vol_devs.is_empty() {
        Some(open_one(&backing_path)?)
    } else {
        None
    };
    // The class flags are checked before a cache file is created or formatted: a start they
    // refuse must leave nothing behind (a formatted file would fix the cache size for the
    // next start). Under --layout log, a table the log layout cannot take too.
    let early_table = {
        let t = crate::serve_classes::table(&a.classes, &a.class_rules, a.classifier.as_deref())?;
        if let Some(t) = &t {
            tiercache_server::classify::by_name(
                a.classifier.as_deref().unwrap_or("none"),
                t.clone(),
            )
            .map_err(|e| anyhow!(e))?;
            if a.layout.is_log()? {
                tiercache_engine::log::check_class_table(t)
                    .map_err(|e| anyhow!("--classes: {e}"))?;
            }
        }
        t
    };
    let cache_is_nbd = NbdDev::is_uri(&cache_path.to_string_lossy());
    let created = !cache_is_nbd && !cache_path.exists() && a.format_if_needed;
    if created {
        let bytes = cache_size.ok_or_else(|| {
            anyhow!(
                "{} does not exist: give --cache-size to create it",
                cache_path.display()
            )
        })?;
        create_cache_file(&cache_path, bytes, new_line, a.data_checksums)?;
    }
    let cache = if pool {
        open_pool_member(&a, &cache_path, device_timeout)
    } else {
        open_served_cache(&a, &cache_path, device_timeout)?
    };
    if let Some(spec) = &a.emulate_ssd {
        let (lat, channels) = tiercache_server::parse_emulate_ssd(spec).map_err(|e| anyhow!(e))?;
        say!("cache device(s) emulate an SSD each: {lat} us per 4 KiB, {channels} channel(s)");
    }
    let (cache, cache_path) = if pool {
        open_pool(&a, cache, device_timeout, mode)?
    } else {
        (cache, cache_path)
    };
    // What the device holds, read here only to decide whether to format it: the layout of
    // what is served is the superblock's, picked by `open_live`.
    let found = match tiercache_server::probe(&*cache).context("reading the log superblock")? {
        Found::DamagedLog(e) => return Err(e).context("reading the log superblock"),
        f => f,
    };
    let log_given = crate::log_serve::given(&a.layout)?;
    let direct_only = a.not_for_log(&flags);
    // --format-if-needed formats only what holds nothing: a file this run created, or a
    // device whose first MiB is zeros. A device that holds data but no valid superblock is
    // most likely a damaged cache (one flipped magic byte) with dirty data on it, or another
    // file system: formatting it would serve stale data, or destroy someone's disk.
    let no_cache = matches!(found, Found::NoCache(FormatError::BadMagic));
    let blank = a.format_if_needed && no_cache && (created || first_mib_is_zero(&*cache)?);
    if a.format_if_needed && no_cache && !blank {
        bail!(
            "{} holds data but no valid tiercache superblock (a damaged cache, or not a cache at all): --format-if-needed formats only a new file or a device whose first MiB is zeros. \
             See what it holds with `tiercache check {}`; if its contents may go, discard them with `tiercache format --force --cache {} --backing ...`",
            cache_path.display(),
            cache_path.display(),
            cache_path.display()
        );
    }
    if let Some(d) = effective_state_dir(&cache_path, a.state_dir.as_deref()) {
        make_state_dir(&d)?;
    }
    if let (Some(bytes), false) = (cache_size, created) {
        // --cache-size only sizes a new cache: on a device that already holds one (or, in the
        // log layout, on any existing device: that layout takes the whole device) a size other
        // than the formatted one is refused rather than ignored.
        let given = a.cache_size.as_deref().unwrap_or_default();
        let log_device = matches!(found, Found::Log(_)) || (blank && a.layout.is_log()?);
        let log = log_device.then_some((cache.size(), new_line, a.data_checksums));
        let direct = match &found {
            Found::Direct(sb) => Some((sb.capacity_lines, sb.line_size)),
            _ => None,
        };
        formatted_size_matches(&cache_path, given, bytes, direct, log)?;
    }
    let (backing, vol_specs, admin) = match single {
        Some(b) => (b, Vec::new(), None),
        None => {
            let table = match &found {
                Found::Direct(sb) => sb.volumes.clone(),
                _ => Vec::new(),
            };
            restore_live_changes(&table, &mut vol_devs, &*open_one)?;
            let names: Vec<String> = vol_devs.iter().map(|v| v.0.clone()).collect();
            volume_names_known(&a, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
            // --volume-mode of a volume added live: the flag wins over its recorded mode.
            for m in &a.volume_mode {
                if let Some((name, mode)) = m.split_once('=') {
                    if let Some(v) = vol_devs.iter_mut().find(|v| v.0 == name) {
                        v.2 = Some(mode_arg(mode)?);
                    }
                }
            }
            let ids = tiercache_server::volume_set::assign_ids(&table, &names);
            let specs: Vec<VolumeSpec> = vol_devs
                .iter()
                .zip(&ids)
                .map(|((name, d, mode), &id)| VolumeSpec {
                    id,
                    name: name.clone(),
                    size: d.size(),
                    identity: d.identity(),
                    mode: *mode,
                })
                .collect();
            let set = VolumeSet::new(
                vol_devs
                    .into_iter()
                    .zip(&ids)
                    .map(|((name, d, _), &id)| (id, name, d))
                    .collect(),
            )
            .map_err(|e| anyhow!("--volume {e}"))?;
            let open = Arc::clone(&open_one);
            let admin = crate::volume_admin::VolumeAdmin::new(
                set.slots(),
                Box::new(move |p: &Path| open(p)),
            );
            (Box::new(set) as Box<dyn BlockDev>, specs, Some(admin))
        }
    };
    if blank {
        // The layout asked for (--layout), on a device that holds nothing.
        let paths = (cache_path.as_path(), backing_path.as_path());
        let new = (new_line, new_tuning);
        format_new(&a, paths, &*cache, &*backing, &log_given, &direct_only, new)?;
    } else if let Found::NoCache(e) = found {
        if !log_given.flags.is_empty() {
            bail!("{}: {} apply to the log layout only and need a cache device in the log layout (`tiercache format --layout log`, or --format-if-needed on an empty device); this one holds no cache", cache_path.display(), log_given.flags.join(", "));
        }
        if let (FormatError::BadMagic, Some(p)) = (&e, state_path(&cache_path, None, &[0; 16])) {
            if let Some(st) = state_file::read(&p)? {
                bail!(
                    "{} holds no tiercache superblock: it was erased when the cache FAILED ({}; recorded in {}). Run `tiercache format --force` on it before it is used again",
                    cache_path.display(),
                    st.describe(),
                    p.display()
                );
            }
        }
        if let FormatError::BadMagic = e {
            bail!(
                "{} holds no tiercache cache: run `tiercache format` or add --format-if-needed",
                cache_path.display()
            )
        }
        return Err(e).with_context(|| format!("reading {}", cache_path.display()));
    }
    let tuning = |line: u64, policy: &str, stored: Option<Tuning>| {
        serve_settings(&cache_path, line, policy, stored, &a.tune).map_err(|e| format!("{e:#}"))
    };
    let state_dir = a.state_dir.clone();
    let state = |u: &[u8; 16]| state_path(&cache_path, state_dir.as_deref(), u);
    let say = |l: &str| say!("{l}");
    let opts = LiveOpenOptions {
        cache_name: &cache_path,
        mode,
        line_size,
        max_cache_errors: a.max_cache_errors,
        accept_backing_rename: a.accept_backing_rename,
        accept_backing_changes: a.accept_backing_changes,
        state_path: &state,
        direct: DirectRun {
            policy: a.policy.clone(),
            data_checksums: a.data_checksums,
            validity: validity_arg(a.validity.as_deref())?,
            tuning: &tuning,
            classes: early_table,
            classifier: a.classifier.clone(),
            unmap_batch: a.unmap_batch,
            inline_cleaning,
            rewrite_chunk: a
                .rewrite_chunk
                .as_deref()
                .map(|s| size_arg("--rewrite-chunk", s))
                .transpose()?,
            rewrite_min_runs: a.rewrite_min_runs,
            emulate_hdd: a.emulate_hdd.clone(),
            cleaning: a
                .cleaning
                .as_deref()
                .map(|c| c.parse().map_err(|e: String| anyhow!("--cleaning: {e}")))
                .transpose()?,
            cleaning_age: a.cleaning_age,
            writeback_rate: a
                .writeback_rate
                .as_deref()
                .map(|r| {
                    r.parse()
                        .map_err(|e: String| anyhow!("--writeback-rate: {e}"))
                })
                .transpose()?,
            writeback_target: a.writeback_target,
            ram_cache: a
                .ram_cache
                .as_deref()
                .map(|s| size_arg("--ram-cache", s))
                .transpose()?
                .unwrap_or(0),
            ram_policy: a.ram_policy.clone(),
            volumes: vol_specs,
            volume_flags: vol_flags,
        },
        direct_only,
        log: log_given,
        say: &say,
    };
    let (cache, backing, io) = dashboard::counted(cache, backing, http.is_some());
    let (vol, rep) = tiercache_server::open_live(cache, backing, &opts).map_err(|e| anyhow!(e))?;
    run_live(
        vol,
        LiveServe {
            cache_path: &cache_path,
            control: a.control.as_deref(),
            metrics: a.metrics.as_deref(),
            http,
            io,
            nbd: nbd_opts,
            socket: a.socket.as_deref(),
            socket_group,
            listen,
            state_path: rep.state_path.as_deref(),
            admin,
        },
    )
}

/// What `ctl volume add|remove` changed in the cache's volume table, applied to the volumes
/// of the command line (`vol_devs`): a volume removed live is not served even when the
/// command line names it (a warning says how to add it again), and a volume added live that
/// the command line does not name is opened from the path its entry records (with the mode
/// given when it was added).
fn restore_live_changes(
    table: &[tiercache_server::format::VolumeEntry],
    vol_devs: &mut Vec<(String, Box<dyn BlockDev>, Option<Mode>)>,
    open: &dyn Fn(&Path) -> Result<Box<dyn BlockDev>>,
) -> Result<()> {
    let live = |n: &str| table.iter().any(|e| e.name == n && !e.removed());
    vol_devs.retain(|(name, _, _)| {
        let gone = !live(name) && table.iter().any(|e| &e.name == name && e.removed());
        if gone {
            say!(
                "warning: volume {name} was removed with `ctl volume remove`: not served (drop --volume {name}; to serve it again: `tiercache ctl volume add {name}=BACKING`)"
            );
        }
        !gone
    });
    for e in table.iter().filter(|e| !e.removed()) {
        if e.flags & tiercache_server::format::VOLUME_ADDED == 0
            || vol_devs.iter().any(|v| v.0 == e.name)
        {
            continue;
        }
        let path = &e.identity.name;
        let d = open(Path::new(path)).with_context(|| {
            format!(
                "volume {} (added with `ctl volume add`; the cache records its backing device {}): give its device with --volume {}=DEVICE",
                e.name,
                e.identity.describe(),
                e.name
            )
        })?;
        say!(
            "volume {} (added with `ctl volume add`): backing {path}",
            e.name
        );
        vol_devs.push((e.name.clone(), d, e.mode()));
    }
    if vol_devs.is_empty() {
        bail!("every volume given was removed with `ctl volume remove`: give at least one volume the cache serves");
    }
    Ok(())
}

/// `serve --format-if-needed` on a device that holds nothing: formats it in the layout asked
/// for (`--layout`, default direct), with the run's settings.
/// `new` is the direct layout's line and settings (the preset's line unless --line-size).
fn format_new(
    a: &ServeArgs,
    (cache_path, backing_path): (&Path, &Path),
    cache: &dyn BlockDev,
    backing: &dyn BlockDev,
    log_given: &tiercache_server::LogGiven,
    direct_only: &[String],
    (ls, tuning): (u64, Option<Tuning>),
) -> Result<()> {
    let mode = a.mode.as_deref().map(mode_arg).transpose()?;
    let line_size = a
        .line_size
        .as_deref()
        .map(|s| size_arg("--line-size", s))
        .transpose()?;
    let spec = FormatSpec {
        cache_name: cache_path,
        direct: FormatOptions {
            line_size: ls,
            mode: mode.unwrap_or(Mode::WriteThrough),
            policy: a.policy.clone().unwrap_or_else(|| "lru".into()),
            capacity_lines: a
                .cache_size
                .as_deref()
                .map(|s| size_arg("--cache-size", s).map(|b| b / ls))
                .transpose()?,
            backing_id: backing_path.display().to_string(),
            backing: backing.identity(),
            tuning,
            data_checksums: a.data_checksums,
            validity: validity_arg(a.validity.as_deref())?.unwrap_or_default(),
        },
        log: a
            .layout
            .is_log()?
            .then(|| {
                crate::log_serve::options(
                    &a.layout,
                    line_size.unwrap_or(4096),
                    mode.unwrap_or(Mode::WriteThrough),
                    true,
                )
            })
            .transpose()?,
        direct_only: direct_only.to_vec(),
        log_flags: log_given.flags.clone(),
    };
    let f = tiercache_server::format_device(cache, backing, &spec).map_err(|e| anyhow!(e))?;
    // Both layouts: a state file left beside the new cache recorded a failure of an older
    // one (before, the log layout kept it).
    clear_state_files(cache_path, a.state_dir.as_deref(), None)?;
    match f {
        Formatted::Log(sb) => say!(
            "formatted {} (log layout): {} segments of {}",
            cache_path.display(),
            sb.segments,
            tiercache_engine::fmt_size(sb.segment_size)
        ),
        Formatted::Direct(sb) => say!(
            "formatted {}: {} lines of {} bytes",
            cache_path.display(),
            sb.capacity_lines,
            sb.line_size
        ),
    }
    Ok(())
}

/// What serving an open volume takes besides the volume (both layouts).
pub(crate) struct LiveServe<'a> {
    pub cache_path: &'a Path,
    pub control: Option<&'a Path>,
    pub metrics: Option<&'a str>,
    pub http: Option<SocketAddr>,
    /// The device counts the dashboard shows (`dashboard::counted`).
    pub io: dashboard::DevCounts,
    pub nbd: tiercache_nbd::ServerOptions,
    pub socket: Option<&'a Path>,
    pub socket_group: Option<u32>,
    pub listen: Option<SocketAddr>,
    /// Where a failure of the cache is recorded.
    pub state_path: Option<&'a Path>,
    /// `ctl volume add|remove` (a server of several volumes).
    pub admin: Option<crate::volume_admin::VolumeAdmin>,
}

/// Serves an open volume of either layout until SIGTERM or SIGINT: its background work,
/// control socket, metrics, dashboard and NBD export, then a clean shutdown and the truth
/// about what a restart will find. Written once against [`LiveVolume`].
pub(crate) fn run_live(vol: Arc<dyn LiveVolume>, p: LiveServe) -> Result<()> {
    let background = Arc::clone(&vol).start_background();
    let exports_slot = p.admin.as_ref().map(|a| Arc::clone(&a.exports));
    match (p.control, p.admin) {
        (Some(c), Some(admin)) => {
            let v = Arc::clone(&vol);
            control::serve_json_lines(c, move |line| admin.answer(&v, line))?;
        }
        (Some(c), None) => {
            control::serve_control(c, Arc::clone(&vol))?;
        }
        (None, _) => {}
    }
    if let Some(m) = p.metrics {
        let addr: SocketAddr = m.parse().map_err(|e| anyhow!("--metrics {m:?}: {e}"))?;
        let (local, _) = control::serve_metrics(addr, Arc::clone(&vol))?;
        say!("metrics on http://{local}/metrics");
    }
    if let Some(addr) = p.http {
        let (v, io) = (Arc::clone(&vol), p.io);
        let (d, _) = dashboard::Dashboard::start(move || dashboard::snapshot(&*v, &io[0], &io[1]))?;
        let (local, _) = d.serve(addr)?;
        say!("dashboard on http://{local}/");
    }
    let served = serve_until_signal(
        tiercache_server::live::exports(&vol),
        exports_slot,
        p.nbd,
        p.socket,
        p.socket_group,
        p.listen,
    );
    let closed = vol.shutdown();
    background.finish();
    if let Some(c) = p.control {
        let _ = std::fs::remove_file(c);
    }
    served.context("NBD server")?;
    closed.context("clean shutdown of the cache")?;
    // The last word tells the truth about what a restart will find.
    let live = vol.live_stats();
    let lost = lost_ranges_text(&serde_json::to_value(&live)?);
    let st = live.volume;
    say_shutdown(
        p.cache_path,
        st.cache_failed,
        vol.failure_recorded(),
        p.state_path,
        (!st.lost_dirty_ranges.is_empty()).then_some(lost.as_str()),
        st.degraded,
        st.dirty_lines,
    );
    Ok(())
}

/// The last word of `serve` (both layouts): the truth about what a restart will find.
pub(crate) fn say_shutdown(
    cache: &Path,
    failed: bool,
    recorded: bool,
    state_path: Option<&Path>,
    lost: Option<&str>,
    degraded: bool,
    dirty_lines: u64,
) {
    if failed {
        say!(
            "cache {} had FAILED (everything passed through to the backing device since): it was not marked clean; {}; run `tiercache format --force` on it before it is used again{}",
            cache.display(),
            match (state_path, recorded) {
                (_, false) => "the failure could NOT be recorded durably (state file and superblock erase failed): do not serve this cache device again before formatting it".to_string(),
                (Some(p), true) => format!("the failure is recorded durably (state file {}, or the erased superblock), so a restart refuses it", p.display()),
                (None, true) => "its superblock was erased, so a restart refuses it".to_string(),
            },
            match lost {
                None => String::new(),
                Some(l) => format!("; dirty data LOST in {l}"),
            }
        );
    } else if degraded {
        say!(
            "cache {} shut down cleanly with {dirty_lines} dirty lines the backing device would not take (write-backs failing): they stay in the cache and are written back after the next start",
            cache.display(),
        );
    } else {
        say!("cache {} shut down cleanly", cache.display());
    }
}

/// Serves `exports` (NBD export "tiercache", or one per volume under its name) on the unix
/// socket or TCP address until SIGTERM or SIGINT; returns how serving ended (the caller then
/// shuts its volume down).
pub(crate) fn serve_until_signal(
    exports: Vec<(String, Arc<dyn tiercache_nbd::Export>)>,
    exports_slot: Option<Arc<std::sync::OnceLock<tiercache_nbd::ExportsHandle>>>,
    opts: tiercache_nbd::ServerOptions,
    socket: Option<&std::path::Path>,
    socket_group: Option<u32>,
    listen: Option<SocketAddr>,
) -> Result<()> {
    if exports.len() > 1 || exports.first().is_some_and(|e| e.0 != "tiercache") {
        let names: Vec<&str> = exports.iter().map(|e| e.0.as_str()).collect();
        say!("NBD exports: {}", names.join(", "));
    }
    let server = Server::new(exports).with_options(opts);
    let stop = server.shutdown_handle();
    if let Some(slot) = exports_slot {
        let _ = slot.set(server.exports_handle());
    }
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let sig_handle = signals.handle();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            stop.shutdown();
            say!("signal {sig}: shutting down");
        }
    });
    let served = match (socket, listen) {
        (Some(s), _) => {
            say!("serving NBD on unix socket {}", s.display());
            server.serve_unix_group(s, socket_group)
        }
        (_, Some(addr)) => {
            say!("serving NBD on {addr}");
            server.serve_tcp(addr)
        }
        _ => bail!("give exactly one of --socket PATH and --listen [ADDR:]PORT"),
    };
    sig_handle.close();
    Ok(served?)
}

/// Whether the first MiB of `dev` (all of it when smaller) reads as zeros: a device nothing
/// has been written to, which `--format-if-needed` may format.
fn first_mib_is_zero(dev: &dyn BlockDev) -> Result<bool> {
    let mut b = vec![0u8; dev.size().min(1 << 20) as usize];
    dev.read_at(&mut b, 0)
        .context("reading the cache device's first MiB")?;
    Ok(b.iter().all(|&x| x == 0))
}

/// What `serve` says at start about who can reach the volume: NBD over TCP without
/// `--tls require` (any local user on loopback, anyone who can reach the address otherwise),
/// and a metrics endpoint off loopback.
pub(crate) fn access_warnings(
    listen: Option<SocketAddr>,
    tls: Option<&str>,
    metrics: Option<&str>,
) -> Vec<String> {
    let mut w = Vec::new();
    let require = tls.and_then(|t| t.parse::<tiercache_nbd::TlsMode>().ok())
        == Some(tiercache_nbd::TlsMode::Require);
    match listen {
        Some(l) if !require && l.ip().is_loopback() => w.push(format!(
            "warning: NBD on {l} without --tls require: every local user can read and write the volume (use --socket PATH, or --tls require)"
        )),
        Some(l) if !require => w.push(format!(
            "warning: NBD on {l} without --tls require: every local user and anyone who can reach {l} can read and write the volume (add --tls require with --tls-psk-file or --tls-certificates)"
        )),
        _ => {}
    }
    if let Some(m) = metrics.and_then(|m| m.parse::<SocketAddr>().ok()) {
        if !m.ip().is_loopback() {
            w.push(format!(
                "warning: metrics endpoint on {m} is off loopback: anyone who can reach it reads the volume's statistics (bind 127.0.0.1:PORT and scrape through a proxy)"
            ));
        }
    }
    w
}

/// The warning for a dashboard (`--http`) off loopback, as for the metrics endpoint.
pub(crate) fn dashboard_warning(http: Option<SocketAddr>) -> Option<String> {
    http.filter(|h| !h.ip().is_loopback()).map(|h| format!(
        "warning: dashboard on {h} is off loopback: anyone who can reach it reads the volume's statistics and settings (bind 127.0.0.1:PORT and reach it through a proxy or an SSH tunnel)"
    ))
}

/// `--http`: parsed as `--listen` is (a bare PORT is loopback), errors naming `--http`.
fn http_addr(h: &str) -> Result<SocketAddr> {
    listen_addr(h).map_err(|e| anyhow!("{}", e.to_string().replacen("--listen", "--http", 1)))
}

/// `--listen`: a bare `PORT` (or `:PORT`) means loopback; anything else must name the
/// address (`0.0.0.0:PORT`, `[::]:PORT`, `HOST:PORT`).
pub(crate) fn listen_addr(l: &str) -> Result<SocketAddr> {
    let port = l.strip_prefix(':').unwrap_or(l);
    if let Ok(p) = port.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], p)));
    }
    if let Ok(a) = l.parse::<SocketAddr>() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs;
    l.to_socket_addrs()
        .map_err(|e| anyhow!("--listen {l:?}: {e} (give PORT, ADDR:PORT or HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow!("--listen {l:?}: the name resolves to no address"))
}

/// NBD server options from the flags: workers, connection and memory limits, deadlines, TLS.
fn nbd_options(a: &ServeArgs) -> Result<tiercache_nbd::ServerOptions> {
    use tiercache_nbd::{TlsConfig, TlsMode};
    let have_keys = a.tls_psk_file.is_some() || a.tls_certificates.is_some();
    let mode = match &a.tls {
        Some(m) => m.parse::<TlsMode>().map_err(|e| anyhow!("--tls: {e}"))?,
        None if have_keys => TlsMode::On,
        None => TlsMode::Off,
    };
    let tls = match mode {
        TlsMode::Off if have_keys => {
            bail!("--tls off with --tls-psk-file/--tls-certificates: drop one or the other")
        }
        TlsMode::Off => None,
        _ if !have_keys => {
            bail!("--tls on|require needs --tls-psk-file FILE and/or --tls-certificates DIR")
        }
        _ => Some(
            TlsConfig::build(
                mode,
                a.tls_psk_file.as_deref(),
                a.tls_certificates.as_deref(),
                a.tls_verify_peer,
            )
            .map_err(|e| anyhow!("TLS setup: {e}"))?,
        ),
    };
    if let Some(t) = &tls {
        say!("NBD TLS {mode:?}: {t:?}");
    }
    let d = tiercache_nbd::ServerOptions::default();
    let size = |flag: &str, v: &Option<String>, d: u64| match v {
        None => Ok(d),
        Some(v) => parse_size(v).map_err(|e| anyhow!("--{flag}: {e}")),
    };
    let secs = |flag: &str, v: Option<f64>, d: Option<std::time::Duration>| match v {
        None => Ok(d),
        Some(0.0) => Ok(None),
        Some(s) => std::time::Duration::try_from_secs_f64(s)
            .map(Some)
            .map_err(|e| anyhow!("--{flag} {s}: {e} (give seconds, 0 for no limit)")),
    };
    Ok(tiercache_nbd::ServerOptions {
        workers: a.workers.unwrap_or(d.workers),
        workers_per_connection: a
            .requests_per_connection
            .unwrap_or(d.workers_per_connection),
        max_connections: a.max_connections.unwrap_or(d.max_connections),
        max_inflight_bytes: size(
            "max-inflight-bytes",
            &a.max_inflight_bytes,
            d.max_inflight_bytes,
        )?,
        max_inflight_bytes_per_connection: size(
            "max-inflight-bytes-per-connection",
            &a.max_inflight_bytes_per_connection,
            d.max_inflight_bytes_per_connection,
        )?,
        handshake_deadline: secs(
            "handshake-deadline",
            a.handshake_deadline,
            d.handshake_deadline,
        )?,
        max_options: a.max_options.unwrap_or(d.max_options),
        write_timeout: secs("write-timeout", a.write_timeout, d.write_timeout)?,
        tls,
        ..d
    })
}

fn print_stats(v: &serde_json::Value) {
    let s = &v["stats"];
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    let cap = n(&s["capacity_lines"]).max(1);
    println!(
        "layout          {}",
        s["layout"].as_str().unwrap_or("direct")
    );
    println!("mode            {}", s["mode"].as_str().unwrap_or("?"));
    println!("policy          {}", s["policy"].as_str().unwrap_or("?"));
    let t = &s["settings"];
    println!(
        "settings        admission {}, seq-cutoff {} read / {} write, group {}, dirty {} .. {}, slru-protected {}, clean-victim-window {}, partial-fill {} ({} changed live)",
        t["admission"].as_str().unwrap_or("?"),
        tiercache_server::tuning::size_str(n(&t["seq_cutoff_read"])),
        tiercache_server::tuning::size_str(n(&t["seq_cutoff_write"])),
        tiercache_server::tuning::size_str(n(&t["group_size"])),
        t["dirty_low"],
        t["dirty_high"],
        t["slru_protected"],
        n(&t["clean_victim_window"]),
        match t["partial_write_fill"].as_bool() {
            Some(false) => "off",
            _ => "on",
        },
        n(&t["changes"])
    );
    if let Some(c) = t["cleaning"].as_str() {
        println!(
            "cleaner         cleaning {c} (age {} requests), writeback-rate {}, writeback-target {}",
            n(&t["cleaning_age"]),
            t["writeback_rate"].as_str().unwrap_or("?"),
            t["writeback_target"]
        );
        println!(
            "write-backs     {} passes outside the volume lock, {} requests waited for one, {} cut short, {} merged groups taken out by a request (their lines stay dirty)",
            n(&s["unlocked_writebacks"]),
            n(&s["writeback_waits"]),
            n(&s["writeback_yields"]),
            n(&s["writeback_groups_dropped"])
        );
        if n(&s["cleaner_panics"]) > 0 {
            println!(
                "cleaner panics  {} passes panicked (a bug: report it with the log); their lines stayed dirty",
                n(&s["cleaner_panics"])
            );
        }
    }
    let ct = &s["class_table"];
    if ct.is_object() {
        println!(
            "class table     {:?} ({} classes, {} rules) from {}, loaded live {} time(s)",
            ct["name"].as_str().unwrap_or("?"),
            n(&ct["classes"]),
            n(&ct["rules"]),
            ct["source"].as_str().unwrap_or("?"),
            n(&ct["loads"])
        );
    }
    println!(
        "occupancy       {} of {} lines ({:.1} %), line size {}{}",
        n(&s["cached_lines"]),
        cap,
        100.0 * n(&s["cached_lines"]) as f64 / cap as f64,
        n(&s["line_size"]),
        match s["settings"]["validity"].as_str() {
            Some("line") => ", line validity",
            _ => "",
        }
    );
    println!(
        "dirty           {} lines, {} bytes",
        n(&s["dirty_lines"]),
        n(&s["dirty_bytes"])
    );
    crate::ctl_stats::print_volume_table(s);
    if !s["log"].is_object() {
        // The direct layout's record unmaps (rule 2): before a slot's reuse, ahead of
        // evictions, and the unmap-ahead passes skipped while backing syncs fail.
        println!(
            "unmaps          {} on the miss path, {} ahead of evictions ({} unmapped ahead now), {} cache syncs; unmap-ahead skipped {} times while backing syncs failed",
            n(&s["unmap_on_miss"]),
            n(&s["unmap_ahead"]),
            n(&s["unmapped_ahead_now"]),
            n(&s["unmap_syncs"]),
            n(&s["unmap_ahead_skipped"])
        );
        // Read misses whose device steps ran outside the volume lock (the rest needed an
        // unmap first, or were partial, or the volume was not healthy).
        println!(
            "misses unlocked {} (backing read and cache write outside the volume lock)",
            n(&s["unlocked_misses"])
        );
    }
    println!("RAM (index)     {} bytes", n(&s["ram_index_bytes"]));
    let r = &s["ram"];
    if r.is_object() {
        let reads = n(&r["read_requests"]);
        let share = |x: u64| {
            if reads > 0 {
                format!("{:.1} %", 100.0 * x as f64 / reads as f64)
            } else {
                "-".into()
            }
        };
        let (rh, sh, m) = (n(&r["ram_hits"]), n(&r["ssd_hits"]), n(&r["misses"]));
        println!(
            "tiers           {reads} reads: RAM hits {rh} ({}), SSD hits {sh} ({}), misses {m} ({})",
            share(rh),
            share(sh),
            share(m)
        );
        let k = &r["counters"];
        println!(
            "RAM tier        {} of {} lines of {} bytes, policy {}: {} filled, {} evicted, {} invalidated, {} fills skipped; {} bytes of data, {} of metadata",
            n(&r["cached_lines"]),
            n(&r["capacity_lines"]),
            n(&s["line_size"]),
            r["policy"].as_str().unwrap_or("?"),
            n(&k["fills"]),
            n(&k["evictions"]),
            n(&k["invalidations"]),
            n(&k["fills_skipped"]),
            n(&r["data_bytes"]),
            n(&r["metadata_bytes"])
        );
    }
    // Faults first: a class table must not hide them.
    print_faults(s);
    if s["log"].is_object() {
        print_log_detail(&s["log"]);
    }
    crate::ctl_stats::print_breakdown(s);
    if crate::serve_classes::print_class_stats(s) {
        return;
    }
    println!(
        "{:<6} {:>10} {:>12} {:>12} {:>9} {:>10} {:>10}",
        "class", "requests", "line hits", "line misses", "hit %", "bypasses", "evictions"
    );
    for pc in s["per_class"].as_array().into_iter().flatten() {
        let (c, k) = (&pc[0], &pc[1]);
        let (h, m) = (n(&k["line_hits"]), n(&k["line_misses"]));
        println!(
            "{:<6} {:>10} {:>12} {:>12} {:>9.2} {:>10} {:>10}",
            n(c),
            n(&k["requests"]),
            h,
            m,
            100.0 * h as f64 / (h + m).max(1) as f64,
            m.saturating_sub(n(&k["admitted_misses"])),
            n(&k["evictions"])
        );
    }
}

/// The log layout's own lines of `ctl stats` (its `log` sub-object).
fn print_log_detail(s: &serde_json::Value) {
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    println!(
        "layout          log: {} segments of {} bytes, compression {}, picker {}, dedup index {}",
        n("segments"),
        n("segment_size"),
        s["compression"].as_str().unwrap_or("?"),
        s["picker"].as_str().unwrap_or("?"),
        f("dedup_index_ratio")
    );
    println!(
        "requests        {} ({} passed through after a cache failure or detach)",
        s["live"]["requests"].as_u64().unwrap_or(0),
        s["live"]["pass_through_requests"].as_u64().unwrap_or(0)
    );
    println!(
        "reduction       dedup {:.3}, compression {:.3}, effective capacity {:.3}",
        f("dedup_ratio"),
        f("compression_ratio"),
        f("effective_capacity")
    );
    println!(
        "SSD             {} bytes used, {} bytes written",
        n("ssd_bytes_used"),
        n("ssd_bytes_written")
    );
    println!(
        "RAM per line    {:.1} bytes of index per cached line",
        f("index_bytes_per_entry")
    );
    let e = &s["engine"];
    let h = e["read_line_hits"].as_u64().unwrap_or(0);
    let r = e["read_lines"].as_u64().unwrap_or(0);
    println!(
        "reads           {r} lines, {h} hits ({:.2} %), {} from duplicates",
        100.0 * h as f64 / r.max(1) as f64,
        e["dup_read_hits"].as_u64().unwrap_or(0)
    );
}

/// The lost ranges of a `stats` reply, named within their volumes: `volume NAME: bytes
/// X..Y, ...` with several volumes, else `volume byte ranges [[X, Y], ...]`.
fn lost_ranges_text(s: &serde_json::Value) -> String {
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    match s["volumes"].as_array().filter(|v| !v.is_empty()) {
        Some(vols) => vols
            .iter()
            .flat_map(|v| {
                let name = v["name"].as_str().unwrap_or("?").to_string();
                v["lost_ranges"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |r| format!("volume {name}: bytes {}..{}", n(&r[0]), n(&r[1])))
            })
            .collect::<Vec<_>>()
            .join(", "),
        None => format!("volume byte ranges {}", s["lost_dirty_ranges"]),
    }
}

/// The fault lines of `ctl stats` (both layouts): device errors, a failed cache, the
/// degraded state and lost dirty data.
pub(crate) fn print_faults(s: &serde_json::Value) {
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    println!(
        "device errors   cache {}, backing {} ({} failed write-backs, {} failed syncs){}",
        n(&s["cache_errors"]),
        n(&s["backing_errors"]),
        n(&s["backing_write_errors"]),
        n(&s["backing_sync_errors"]),
        if s["cache_failed"] == true {
            "; CACHE DEVICE FAILED: passing everything through to the backing device"
        } else {
            ""
        }
    );
    if s["halted"] == true {
        println!("HALTED          {}", tiercache_server::live::HALTED);
    }
    if s["data_checksums"] == true {
        println!(
            "data checksums  on, {} mismatches (clean: re-read from the backing device; dirty: LOST below)",
            n(&s["checksum_errors"])
        );
    }
    if s["degraded"] == true {
        println!(
            "DEGRADED        {}",
            s["degraded_reason"]
                .as_str()
                .unwrap_or("backing device failing write-backs")
        );
    }
    if n(&s["lost_dirty_bytes"]) > 0 {
        println!(
            "LOST dirty data {} bytes, {}",
            n(&s["lost_dirty_bytes"]),
            lost_ranges_text(s)
        );
    }
}

pub fn ctl(a: CtlArgs) -> Result<()> {
    let cmd = match &a.cmd {
        CtlCmd::Stats { .. }
        | CtlCmd::Cache {
            cmd: CacheCmd::List { .. },
        } => Command::Stats,
        CtlCmd::Cache {
            cmd: CacheCmd::Replace { index, path },
        } => {
            if a.volume.is_some() {
                bail!("`ctl cache replace` concerns the pool's cache devices: run it without --volume");
            }
            let text = path.to_string_lossy();
            // The server opens it from its own directory: a path is made absolute here.
            let path = if NbdDev::is_uri(&text) {
                text.to_string()
            } else {
                std::fs::canonicalize(path)
                    .with_context(|| format!("cache replace {index} {}", path.display()))?
                    .display()
                    .to_string()
            };
            Command::ReplaceCache {
                index: *index,
                path,
            }
        }
        CtlCmd::Get { key } => Command::Get { key: key.clone() },
        CtlCmd::Set { key, value } => Command::Set {
            key: key.clone(),
            value: value.clone(),
        },
        CtlCmd::Flush => Command::Flush,
        CtlCmd::Mode { mode } => {
            mode_arg(mode)?;
            Command::Mode { mode: mode.clone() }
        }
        CtlCmd::Detach => Command::Detach,
        CtlCmd::Volume { cmd } => {
            if a.volume.is_some() {
                bail!("`ctl volume add|remove` concerns the pool: run it without --volume");
            }
            volume_request(cmd)?
        }
        CtlCmd::Classes {
            cmd: ClassesCmd::Load { file, rules },
        } => {
            // Checked here first (errors name the file and line, nothing is sent), then
            // the server parses the same texts by the same function.
            let f = crate::serve_classes::read_files(
                Some(file),
                rules.as_deref(),
                ("classes load", "--rules"),
            )?;
            let (table, file) = f.table_text.expect("a file was given");
            let (rules, rules_file) = f.rules_text.unzip();
            Command::Classes {
                file,
                table,
                rules_file,
                rules,
            }
        }
    };
    if let Some(name) = &a.volume {
        return ctl_volume(&a, name, cmd);
    }
    let v = control::request(&a.control, &cmd).map_err(|e| anyhow!(e))?;
    match a.cmd {
        CtlCmd::Stats { json, csv, reset } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&v["stats"])?);
            } else if csv {
                crate::ctl_stats::print_csv(&v["stats"])
            } else {
                print_stats(&v);
            }
            if reset {
                control::request(&a.control, &Command::ResetStats).map_err(|e| anyhow!(e))?;
                if !json && !csv {
                    println!("statistics reset");
                }
            }
        }
        CtlCmd::Get { key } => {
            let all = v["settings"].as_array().cloned().unwrap_or_default();
            if all.is_empty() {
                bail!(
                    "{}: not a setting of this volume's layout",
                    key.unwrap_or_default()
                );
            }
            print_settings(&all, key.is_some());
        }
        CtlCmd::Set { key, .. } => println!(
            "{key}: {} -> {}",
            v["old"].as_str().unwrap_or("?"),
            v["new"].as_str().unwrap_or("?")
        ),
        CtlCmd::Flush => println!("flushed: no dirty data left, everything durable"),
        CtlCmd::Mode { .. } => {
            // The mode in force, as the volume reports it.
            let st = control::request(&a.control, &Command::Stats).map_err(|e| anyhow!(e))?;
            println!(
                "mode is now {}",
                st["stats"]["mode"].as_str().unwrap_or("?")
            );
        }
        CtlCmd::Detach => println!("detached: dirty data written back, now pass-through"),
        CtlCmd::Volume {
            cmd: VolumeCmd::Add { spec, .. },
        } => println!(
            "volume {} added: {} bytes, NBD export {} (recorded in the cache)",
            spec.split_once('=').map_or("?", |x| x.0),
            v["size"],
            spec.split_once('=').map_or("?", |x| x.0),
        ),
        CtlCmd::Volume {
            cmd: VolumeCmd::Remove { name },
        } => println!(
            "volume {name} removed: {} clean cached lines left the pool; its export is withdrawn (recorded in the cache)",
            v["lines_dropped"]
        ),
        CtlCmd::Cache {
            cmd: CacheCmd::List { json },
        } => print_cache_list(&v["stats"]["pool_members"], json)?,
        CtlCmd::Cache {
            cmd: CacheCmd::Replace { index, path },
        } => println!(
            "cache device {} is pool member {index} now (formatted, recorded in every member's pool block); the cleaner re-mirrors the dirty lines left with one copy: see `ctl stats` unmirrored_lines",
            path.display()
        ),
        CtlCmd::Classes { .. } => {
            let l = &v["loaded"];
            println!(
                "class table: {} -> {}; {} cached lines keep their class ids; live load {} (not stored: a restart uses serve's --classes)",
                l["old"].as_str().unwrap_or("none"),
                l["new"].as_str().unwrap_or("?"),
                l["cached_lines"],
                l["loads"]
            );
            if l["classifier"].is_null() {
                println!(
                    "note: no classifier runs (serve --classifier none): every request is class 0, so only class 0's entry applies"
                );
            }
        }
    }
    Ok(())
}

/// The `[key, value]` pairs of a `get` reply: the value alone when one key was asked for.
fn print_settings(all: &[serde_json::Value], one: bool) {
    for kv in all {
        if one {
            println!("{}", kv[1].as_str().unwrap_or(""));
        } else {
            println!(
                "{:<17} {}",
                kv[0].as_str().unwrap_or(""),
                kv[1].as_str().unwrap_or("")
            );
        }
    }
}

/// `ctl --volume NAME ...`: the request for that volume (see [`CtlArgs::volume`]).
fn ctl_volume(a: &CtlArgs, name: &str, cmd: Command) -> Result<()> {
    if let CtlCmd::Stats { reset: true, .. } = a.cmd {
        bail!("--reset zeroes the statistics of the whole pool: run `ctl stats --reset` without --volume");
    }
    let req = Command::Volume {
        name: name.to_string(),
        request: Box::new(cmd),
    };
    let v = control::request(&a.control, &req).map_err(|e| anyhow!(e))?;
    match &a.cmd {
        CtlCmd::Stats { json, csv, .. } => {
            if *json {
                let mut out = v["volume"].clone();
                out["settings"] = v["settings"].clone();
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else if *csv {
                crate::ctl_stats::print_volume_csv(&v["volume"]);
            } else {
                crate::ctl_stats::print_volume(&v["volume"], &v["settings"], &v["stats"]);
            }
        }
        CtlCmd::Get { key } => {
            let all = v["settings"].as_array().cloned().unwrap_or_default();
            print_settings(&all, key.is_some());
        }
        CtlCmd::Set { key, .. } => println!(
            "volume {name}: {key}: {} -> {} (stored with the cache: a restart keeps it unless a --volume-* flag of serve sets it; `pool` follows the pool's again)",
            v["old"].as_str().unwrap_or("?"),
            v["new"].as_str().unwrap_or("?")
        ),
        CtlCmd::Mode { .. } => println!(
            "volume {name}: mode is now {} (was {}; stored with the cache: a restart keeps it unless serve's --volume-mode says otherwise)",
            v["new"].as_str().unwrap_or("?"),
            v["old"].as_str().unwrap_or("?")
        ),
        CtlCmd::Detach => println!(
            "volume {name}: dirty data written back, now pass-through (stored with the cache); the other volumes keep their modes"
        ),
        CtlCmd::Flush => println!(
            "flushed: no dirty data left in any volume (the cleaner works on the whole pool), everything durable"
        ),
        CtlCmd::Classes { .. } | CtlCmd::Volume { .. } => {}
        CtlCmd::Cache {
            cmd: CacheCmd::List { json },
        } => print_cache_list(&v["stats"]["pool_members"], *json)?,
        CtlCmd::Cache {
            cmd: CacheCmd::Replace { .. },
        } => {}
    }
    Ok(())
}

/// `ctl cache list`: the members of a pool of cache devices (`VolumeStats::pool_members`).
fn print_cache_list(members: &serde_json::Value, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(members)?);
        return Ok(());
    }
    let Some(list) = members.as_array().filter(|l| !l.is_empty()) else {
        println!("one cache device (not a pool of several): see `ctl stats`");
        return Ok(());
    };
    println!(
        "{:>5}  {:<8}  {:>10}  {:>10}  {:>7}  path",
        "index", "state", "lines", "dirty", "errors"
    );
    for m in list {
        println!(
            "{:>5}  {:<8}  {:>10}  {:>10}  {:>7}  {}",
            m["index"],
            m["state"].as_str().unwrap_or("?"),
            m["lines"],
            m["dirty_lines"],
            m["errors"],
            m["path"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// The request of `ctl volume add|remove`: names checked, a backing path made absolute
/// (the server resolves it, from its own directory).
fn volume_request(cmd: &VolumeCmd) -> Result<Command> {
    Ok(match cmd {
        VolumeCmd::Add { spec, mode } => {
            let Some((name, backing)) = spec.split_once('=') else {
                bail!("volume add {spec:?}: give NAME=BACKING (e.g. volume add logs=/dev/sdd)");
            };
            tiercache_server::volume_set::check_name(name)
                .map_err(|e| anyhow!("volume add {spec}: {e}"))?;
            let backing = if NbdDev::is_uri(backing) {
                backing.to_string()
            } else {
                std::fs::canonicalize(backing)
                    .with_context(|| format!("volume add {spec}: backing device {backing}"))?
                    .display()
                    .to_string()
            };
            let mode = mode
                .as_deref()
                .map(|m| mode_arg(m).map(|m| m.as_str().to_string()))
                .transpose()
                .with_context(|| format!("volume add {spec}: --mode"))?;
            Command::AddVolume {
                name: name.to_string(),
                backing,
                mode,
            }
        }
        VolumeCmd::Remove { name } => Command::RemoveVolume { name: name.clone() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of `key`'s type, found by trying a string, a fraction, an integer and a flag
    /// (a fraction before an integer, which an `f64` field would echo as `7.0`).
    fn sample(key: &str) -> serde_json::Value {
        use serde_json::json;
        [
            json!("7k"),
            json!(0.7),
            json!(7),
            json!(true),
            json!(["7k"]),
        ]
        .into_iter()
        .find(|v| {
            let one = serde_json::Map::from_iter([(key.to_string(), v.clone())]);
            serde_json::from_value::<ServeArgs>(serde_json::Value::Object(one)).is_ok()
        })
        .unwrap_or_else(|| panic!("config key {key}: no value deserialises into it"))
    }

    /// Fails when a flag is added to `ServeArgs` and the config file cannot set it or the
    /// merge of flags over the file drops it: every key, named from the flags themselves, is
    /// set once in the file and once as a flag, and must land both times; and the file's keys
    /// are exactly the flags' (one list, from clap).
    /// `[[volume]]` tables and `"NAME=BACKING"` strings both give volumes; flags over them.
    #[test]
    fn config_volumes_as_tables_or_strings() {
        let t: ServeArgs = toml::from_str(
            "cache = \"c.img\"\nvolume_mode = [\"b=write-through\"]\n[[volume]]\nname = \"a\"\nbacking = \"/dev/sdb\"\n[[volume]]\nname = \"b\"\nbacking = \"b.img\"\n",
        )
        .unwrap();
        assert_eq!(t.volume, vec!["a=/dev/sdb", "b=b.img"]);
        let v = volume_args(&t).unwrap();
        assert_eq!(v[1].2, Some(Mode::WriteThrough));
        let s: ServeArgs = toml::from_str("volume = [\"x=y\"]").unwrap();
        assert_eq!(s.volume, vec!["x=y"]);
        assert!(toml::from_str::<ServeArgs>("[[volume]]\nname = \"a\"\nbackin = \"x\"\n").is_err());
        // A table's own settings land in the per-volume flags' lists.
        let text = "[[volume]]\nname = \"a\"\nbacking = \"x\"\nadmission = \"never\"\nseq_cutoff = \"1m\"\nmode = \"wb\"\n[[volume]]\nname = \"b\"\nbacking = \"y\"\n";
        let mut c: ServeArgs = toml::from_str(text).unwrap();
        volume_table_settings(&toml::from_str(text).unwrap(), &mut c);
        assert_eq!(c.volume, vec!["a=x", "b=y"]);
        assert_eq!(c.volume_admission, vec!["a=never"]);
        assert_eq!(c.volume_seq_cutoff, vec!["a=1m"]);
        assert_eq!(c.volume_mode, vec!["a=wb"]);
        let f = volume_flags(&c).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].admission.map(|x| x.read_threshold), Some(0));
        assert_eq!(f[0].seq_cutoff.map(|x| x.read), Some(1 << 20));
        let bad = |vol: &[&str], modes: &[&str]| {
            let a = ServeArgs {
                volume: vol.iter().map(|s| s.to_string()).collect(),
                volume_mode: modes.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            };
            format!("{:#}", volume_args(&a).unwrap_err())
        };
        assert!(bad(&["a"], &[]).contains("NAME=BACKING"));
        assert!(bad(&["a=x", "a=y"], &[]).contains("given twice"));
        assert!(bad(&["a b=x"], &[]).contains("volume name"));
        let unknown = ServeArgs {
            volume_mode: vec!["c=wb".into()],
            volume_admission: vec!["a=never".into()],
            ..Default::default()
        };
        let e = format!(
            "{:#}",
            volume_names_known(&unknown, &["a", "b"]).unwrap_err()
        );
        assert!(
            e.contains("--volume-mode c=wb: no --volume named \"c\""),
            "{e}"
        );
        assert!(bad(&["a=x"], &["a=fast"]).contains("--volume-mode a=fast"));
    }

    #[test]
    fn merge_carries_every_config_key() {
        let keys = config_keys();
        assert!(keys.len() >= 40, "{keys:?}");
        let serde_keys: Vec<String> = serde_json::to_value(ServeArgs::default())
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        for k in &serde_keys {
            assert!(keys.contains(k), "serde field {k} is no flag");
        }
        let one = |k: &str, v: &serde_json::Value| -> ServeArgs {
            let m = serde_json::Map::from_iter([(k.to_string(), v.clone())]);
            serde_json::from_value(serde_json::Value::Object(m)).unwrap()
        };
        let get = |a: &ServeArgs, k: &str| serde_json::to_value(a).unwrap()[k].clone();
        for k in &keys {
            let v = sample(k);
            let from_file = over_file(ServeArgs::default(), one(k, &v));
            assert_eq!(get(&from_file, k), v, "config-file key {k} was dropped");
            let other = if k == "cache" { "backing" } else { "cache" };
            let file = one(other, &serde_json::json!("file-value"));
            let from_flag = over_file(one(k, &v), file);
            assert_eq!(get(&from_flag, k), v, "flag {k} was dropped");
            assert_eq!(
                get(&from_flag, other),
                serde_json::json!("file-value"),
                "flag {k} lost the file's {other}"
            );
        }
    }

    /// The log layout's allow list names only real settings, and every setting given alone is
    /// seen by `set_keys`: taken on a log device when listed, refused by name otherwise (as
    /// a flag, or as the config file's key).
    #[test]
    fn every_setting_is_taken_or_refused_on_the_log_layout() {
        let keys = config_keys();
        for k in LOG_LAYOUT_KEYS {
            assert!(keys.iter().any(|x| x == k), "{k} is no serve setting");
        }
        let mut refused = Vec::new();
        for k in &keys {
            let m = serde_json::Map::from_iter([(k.to_string(), sample(k))]);
            let a: ServeArgs = serde_json::from_value(serde_json::Value::Object(m)).unwrap();
            assert_eq!(set_keys(&a), vec![k.clone()], "{k} set alone");
            let flag = format!("--{}", k.replace('_', "-"));
            let named = a.not_for_log(std::slice::from_ref(k));
            if LOG_LAYOUT_KEYS.contains(&k.as_str()) {
                assert!(named.is_empty(), "{k}: {named:?}");
            } else {
                assert_eq!(named, vec![flag], "{k} on a log device");
                let from_file = ServeArgs {
                    config: Some("/etc/tiercache.toml".into()),
                    ..a
                };
                assert_eq!(
                    from_file.not_for_log(&[]),
                    vec![format!("`{k}` in /etc/tiercache.toml")]
                );
                refused.push(k.clone());
            }
        }
        // The ones the log layout is known to lack (issue: they were silently ignored).
        for k in [
            "unmap_batch",
            "rewrite_chunk",
            "cleaning",
            "writeback_rate",
            "data_checksums",
            "admission",
            "policy",
        ] {
            assert!(
                refused.iter().any(|x| x == k),
                "{k} not refused: {refused:?}"
            );
        }
    }

    /// The example table of `ctl classes load --help` is a valid table, with the class and
    /// rule it shows.
    #[test]
    fn classes_help_example_parses() {
        let text: String = CLASSES_HELP
            .lines()
            .skip_while(|l| !l.starts_with("  version"))
            .take_while(|l| !l.trim().is_empty())
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        let t = tiercache_engine::ClassTable::parse(&text, "help").unwrap();
        assert_eq!(t.name, "nightly");
        let backup = t.id_of("backup").unwrap();
        assert_eq!(
            t.class(backup).allocation,
            tiercache_engine::Allocation::Never
        );
        assert_eq!(t.rules.len(), 1);
        assert_eq!(t.rules[0].class, backup);
    }

    #[test]
    fn example_config_parses_and_flags_win() {
        let text = include_str!("../../../contrib/tiercache.toml");
        let c: ServeArgs = toml::from_str(text).unwrap();
        assert_eq!(c.mode.as_deref(), Some("write-back"));
        assert!(c.format_if_needed);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        let a = ServeArgs {
            mode: Some("wt".into()),
            config: Some(p.clone()),
            ..Default::default()
        };
        let m = merge(a).unwrap();
        assert_eq!(m.mode.as_deref(), Some("wt"), "the flag wins");
        assert_eq!(
            m.cache_size.as_deref(),
            Some("64G"),
            "the file fills the rest"
        );
        std::fs::write(&p, "cache = \"x\"\nmode_typo = 1\n").unwrap();
        let e = merge(ServeArgs {
            config: Some(p),
            ..Default::default()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("mode_typo") && e.contains("c.toml"), "{e}");
    }

    /// Issue 19: the engine settings `sim` takes are `serve` config keys too (the flags'
    /// names), parsed by the same parser; flags win field by field.
    #[test]
    fn config_file_takes_the_engine_settings() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "cache = \"x\"\nadmission = \"nhit:2:1\"\nseq_cutoff = \"1m\"\ngroup_size = \"64k\"\ndirty_high = 0.9\nslru_protected = 0.4\n",
        )
        .unwrap();
        let a = ServeArgs {
            config: Some(p.clone()),
            tune: TuneArgs {
                admission: Some("never".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let m = merge(a).unwrap();
        assert_eq!(m.tune.admission.as_deref(), Some("never"), "the flag wins");
        assert_eq!(m.tune.seq_cutoff.as_deref(), Some("1m"));
        assert_eq!(m.tune.group_size.as_deref(), Some("64k"));
        assert_eq!(
            (m.tune.dirty_high, m.tune.slru_protected),
            (Some(0.9), Some(0.4))
        );
        let t = serve_settings(&p, 4096, "lru", None, &m.tune)
            .unwrap()
            .unwrap();
        assert_eq!(t.seq_cutoff_read, 1 << 20);
        assert_eq!((t.group_size, t.admission.read_threshold), (64 << 10, 0));
        assert_eq!((t.clean_victim_window, t.partial_write_fill), (0, true));
        // Eviction's clean-victim window and partial-write fill: file keys as well, applied
        // over the stored settings (which keep what the file does not set).
        std::fs::write(
            &p,
            "cache = \"x\"\nclean_victim_window = 8\nno_partial_fill = true\n",
        )
        .unwrap();
        let m = merge(ServeArgs {
            config: Some(p.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (m.tune.clean_victim_window, m.tune.no_partial_fill),
            (Some(8), true)
        );
        let stored = Tuning {
            dirty_high: 0.7,
            ..t
        };
        let t = serve_settings(&p, 4096, "lru", Some(stored), &m.tune)
            .unwrap()
            .unwrap();
        assert_eq!((t.clean_victim_window, t.partial_write_fill), (8, false));
        assert_eq!(t.dirty_high, 0.7);
        let (_, f) = format_settings(None, "lru", &m.tune).unwrap();
        assert_eq!(
            f.map(|f| (f.clean_victim_window, f.partial_write_fill)),
            Some((8, false))
        );
        // The layout's flags are not file keys (they are refused, not silently dropped).
        std::fs::write(&p, "cache = \"x\"\ncompression = \"lz4\"\n").unwrap();
        let e = merge(ServeArgs {
            config: Some(p.clone()),
            ..Default::default()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("compression") && e.contains("seq_cutoff"), "{e}");
        // A preset whose line differs from the formatted one is refused, naming both.
        let db = TuneArgs {
            preset: Some("database".into()),
            ..Default::default()
        };
        let e = serve_settings(&p, 4096, "lru", None, &db)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("8192-byte lines") && e.contains("4096-byte"),
            "{e}"
        );
        let t = serve_settings(&p, 8192, "lru", None, &db).unwrap().unwrap();
        assert_eq!((t.group_size, t.admission.write_threshold), (1 << 20, 0));
        // Format: the preset picks the line unless --line-size is given.
        assert_eq!(format_settings(None, "lru", &db).unwrap().0, 8192);
        assert_eq!(format_settings(Some("16k"), "lru", &db).unwrap().0, 16384);
        assert_eq!(
            format_settings(None, "lru", &TuneArgs::default()).unwrap(),
            (4096, None)
        );
        let e = live_policy("belady").unwrap_err().to_string();
        assert!(e.contains("offline") && e.contains("tiercache sim"), "{e}");
    }

    #[test]
    fn bare_port_listens_on_loopback_only() {
        assert_eq!(listen_addr("10809").unwrap().to_string(), "127.0.0.1:10809");
        assert_eq!(
            listen_addr(":10809").unwrap().to_string(),
            "127.0.0.1:10809"
        );
        assert_eq!(
            listen_addr("0.0.0.0:10809").unwrap().to_string(),
            "0.0.0.0:10809"
        );
        assert_eq!(listen_addr("[::1]:7").unwrap().to_string(), "[::1]:7");
        assert!(listen_addr("localhost:10809").unwrap().ip().is_loopback());
        let e = listen_addr("nonsense").unwrap_err().to_string();
        assert!(e.contains("--listen") && e.contains("nonsense"), "{e}");
    }

    #[test]
    fn who_can_reach_the_volume_is_said_at_start() {
        let lo = listen_addr("10809").ok();
        let any = listen_addr("0.0.0.0:10809").ok();
        let w = access_warnings(lo, None, None);
        assert!(w.len() == 1 && w[0].contains("every local user"), "{w:?}");
        let w = access_warnings(any, Some("on"), Some("127.0.0.1:9477"));
        assert!(
            w.len() == 1 && w[0].contains("anyone who can reach"),
            "{w:?}"
        );
        assert!(access_warnings(any, Some("require"), None).is_empty());
        assert!(access_warnings(None, None, Some("[::1]:9477")).is_empty());
        let w = access_warnings(None, None, Some("0.0.0.0:9477"));
        assert!(
            w.len() == 1 && w[0].contains("metrics endpoint on 0.0.0.0:9477"),
            "{w:?}"
        );
    }

    #[test]
    fn http_comes_from_the_config_file_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "http = \"127.0.0.1:9478\"\n").unwrap();
        let a = ServeArgs {
            config: Some(p),
            ..Default::default()
        };
        assert_eq!(merge(a).unwrap().http.as_deref(), Some("127.0.0.1:9478"));
    }

    #[test]
    fn dashboard_is_loopback_unless_told_and_warns_off_it() {
        assert_eq!(http_addr("9478").unwrap().to_string(), "127.0.0.1:9478");
        assert!(dashboard_warning(http_addr("9478").ok()).is_none());
        assert!(dashboard_warning(None).is_none());
        let w = dashboard_warning(http_addr("0.0.0.0:9478").ok()).unwrap();
        assert!(
            w.contains("dashboard on 0.0.0.0:9478 is off loopback"),
            "{w}"
        );
        let e = http_addr("nonsense").unwrap_err().to_string();
        assert!(e.starts_with("--http \"nonsense\""), "{e}");
    }

    #[test]
    fn hostile_client_limits_from_flags() {
        let o = nbd_options(&ServeArgs::default()).unwrap();
        let d = tiercache_nbd::ServerOptions::default();
        assert_eq!(o.max_inflight_bytes, d.max_inflight_bytes);
        assert_eq!(o.handshake_deadline, d.handshake_deadline);
        let a = ServeArgs {
            workers: Some(4),
            requests_per_connection: Some(2),
            max_inflight_bytes: Some("128M".into()),
            max_inflight_bytes_per_connection: Some("8M".into()),
            handshake_deadline: Some(2.5),
            max_options: Some(9),
            write_timeout: Some(0.0),
            ..Default::default()
        };
        let o = nbd_options(&a).unwrap();
        assert_eq!((o.workers, o.workers_per_connection), (4, 2));
        assert_eq!(o.max_inflight_bytes, 128 << 20);
        assert_eq!(o.max_inflight_bytes_per_connection, 8 << 20);
        assert_eq!(
            o.handshake_deadline,
            Some(std::time::Duration::from_millis(2500))
        );
        assert_eq!((o.max_options, o.write_timeout), (9, None));
        let a = ServeArgs {
            max_inflight_bytes: Some("lots".into()),
            ..Default::default()
        };
        let e = nbd_options(&a).unwrap_err().to_string();
        assert!(e.contains("--max-inflight-bytes"), "{e}");
        let a = ServeArgs {
            handshake_deadline: Some(-1.0),
            ..Default::default()
        };
        let e = nbd_options(&a).unwrap_err().to_string();
        assert!(e.contains("--handshake-deadline"), "{e}");
    }

    #[test]
    fn tls_flags_are_checked() {
        let a = ServeArgs {
            tls: Some("require".into()),
            ..Default::default()
        };
        let e = nbd_options(&a).unwrap_err().to_string();
        assert!(e.contains("--tls-psk-file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let psk = dir.path().join("keys.psk");
        std::fs::write(&psk, "alice:0123456789abcdef\nbob:zz\n").unwrap();
        let a = ServeArgs {
            tls_psk_file: Some(psk.clone()),
            ..Default::default()
        };
        let e = nbd_options(&a).unwrap_err().to_string();
        assert!(e.contains("keys.psk:2") && e.contains("bob"), "{e}");
        std::fs::write(&psk, "alice:0123456789abcdef\n").unwrap();
        let o = nbd_options(&a).unwrap();
        assert!(o.tls.is_some(), "a PSK file alone turns TLS on");
        let a = ServeArgs {
            tls: Some("sometimes".into()),
            tls_psk_file: Some(psk),
            ..Default::default()
        };
        assert!(nbd_options(&a).is_err());
    }
}
