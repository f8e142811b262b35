//! `tiercache format`, `tiercache serve` and `tiercache ctl`: the live cached volume.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_engine::{parse_size, Mode};
use tiercache_nbd::Server;
use tiercache_server::control::{self, Command};
use tiercache_server::{
    BlockDev, CacheVolume, EmulatedHdd, FileDev, FormatError, FormatOptions, NbdDev, OpenOptions,
    Superblock,
};

const FORMAT_HELP: &str = "\
Writes a fresh superblock and empty metadata to the cache device (a file or block device).
Everything cached on it before is forgotten: with a write-back cache holding dirty data, run
`tiercache ctl --control PATH flush` (or serve it in write-through once) first.

Example:
  truncate -s 10G /var/lib/tiercache/cache.img
  tiercache format --cache /var/lib/tiercache/cache.img --backing /dev/sdb --mode write-back";

#[derive(Args)]
#[command(after_long_help = FORMAT_HELP)]
pub struct FormatArgs {
    /// Cache device: file or block device (an SSD).
    #[arg(long)]
    cache: PathBuf,
    /// Backing device the cache fronts: file or block device (an HDD), or an NBD export URI.
    #[arg(long)]
    backing: PathBuf,
    /// Cache line size (power of two, 4k..1M).
    #[arg(long, default_value = "4k")]
    line_size: String,
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
    /// Overwrite a device that already holds a tiercache cache.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    layout: crate::layout_args::LayoutArgs,
}

/// Flags of `serve`; every one may also come from `--config FILE.toml` (same names, with
/// underscores: `line_size = "64k"`). Flags win over the file.
#[derive(Args, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[command(after_long_help = SERVE_HELP)]
pub struct ServeArgs {
    /// Cache device: file or block device.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Backing device: file, block device, or NBD export (nbd://HOST[:PORT]/NAME,
    /// nbd+unix:///NAME?socket=PATH) to cache a remote volume locally.
    #[arg(long)]
    backing: Option<PathBuf>,
    /// Serve NBD on this unix socket.
    #[arg(long)]
    socket: Option<PathBuf>,
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
    /// Most NBD connections open at once; more are closed right after accept.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Write mode for this run (default: the one stored on the cache device).
    #[arg(long)]
    mode: Option<String>,
    /// Replacement policy for this run (default: the one stored on the cache device).
    #[arg(long)]
    policy: Option<String>,
    /// Line size when formatting (with --format-if-needed).
    #[arg(long)]
    line_size: Option<String>,
    /// Cache capacity when formatting; also the size a missing cache file is created with.
    #[arg(long)]
    cache_size: Option<String>,
    /// Format the cache device if it holds no tiercache cache yet.
    #[arg(long)]
    #[serde(default)]
    format_if_needed: bool,
    /// Control socket for `tiercache ctl`.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Prometheus metrics endpoint ADDR:PORT (GET /metrics).
    #[arg(long)]
    metrics: Option<String>,
    /// TOML file with any of these settings.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Cache-device I/O errors after which the cache is failed: dirty data written back,
    /// every request passed through to the backing device (default 16).
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
    /// Worker threads per NBD connection (requests in flight at once).
    #[arg(long)]
    workers: Option<usize>,
    /// When write-back data is cleaned down to the low watermark: `background` (a thread,
    /// off the request path; the default) or `inline` (right after the request that crossed
    /// the high watermark, as `tiercache sim` does: a queue-depth-1 replay then gives the
    /// simulator's counts exactly).
    #[arg(long, value_parser = ["background", "inline"])]
    cleaner: Option<String>,
    /// I/O class table (TOML, e.g. experiments/classes/filesystem.toml) for `--policy dss`,
    /// partitions, rules and per-class statistics. Default: the built-in file-system table.
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

Config file (same keys as the flags):
  cache = \"/var/lib/tiercache/cache.img\"
  backing = \"/dev/sdb\"
  socket = \"/run/tiercache/nbd.sock\"
  mode = \"write-back\"
  control = \"/run/tiercache/control.sock\"
  metrics = \"127.0.0.1:9477\"";

#[derive(Args)]
pub struct CtlArgs {
    /// The server's control socket (`serve --control`).
    #[arg(long)]
    control: PathBuf,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Subcommand)]
enum CtlCmd {
    /// Hits, misses, occupancy, dirty data, per class.
    Stats {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write back every dirty line and make everything durable.
    Flush,
    /// Change the write mode (leaving write-back writes back dirty data first).
    Mode { mode: String },
    /// Write back dirty data, then pass everything through to the backing device.
    Detach,
}

/// Logs to stderr, ignoring errors: a server whose stderr went away (closed pipe) must still
/// shut down cleanly rather than panic in `eprintln!`.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// The backing device: a file, a block device, or an NBD export (`nbd://HOST[:PORT]/NAME`,
/// `nbd+unix:///NAME?socket=PATH`) — cache a remote volume on a local SSD.
fn open_backing(path: &std::path::Path) -> Result<Box<dyn BlockDev>> {
    let text = path.to_string_lossy();
    if NbdDev::is_uri(&text) {
        let dev = NbdDev::connect(&text).with_context(|| format!("--backing {text}"))?;
        if dev.read_only() {
            bail!("--backing {text}: the export is read-only; a cache needs to write back to it");
        }
        say!("backing device: NBD export {text} ({} bytes)", dev.size());
        return Ok(Box::new(dev));
    }
    Ok(Box::new(FileDev::open(path)?))
}

fn size_arg(what: &str, s: &str) -> Result<u64> {
    parse_size(s).map_err(|e| anyhow!("{what} {s:?}: {e}"))
}

fn mode_arg(s: &str) -> Result<Mode> {
    s.parse::<Mode>().map_err(|e| anyhow!("--mode: {e}"))
}

pub fn format(a: FormatArgs) -> Result<()> {
    let cache = FileDev::open(&a.cache)?;
    let backing = open_backing(&a.backing)?;
    if !a.force {
        if let Ok(sb) = tiercache_server::read_superblock(&cache) {
            bail!(
                "{} already holds a tiercache cache ({} lines of {} bytes, generation {}); add --force to overwrite it",
                a.cache.display(),
                sb.capacity_lines,
                sb.line_size,
                sb.generation
            );
        }
    }
    let line_size = size_arg("--line-size", &a.line_size)?;
    if !a.force && crate::log_serve::is_log_device(&cache)? {
        bail!(
            "{} already holds a tiercache cache (log layout); add --force to overwrite it",
            a.cache.display()
        );
    }
    if a.layout.is_log()? {
        if a.policy != "lru" || a.cache_size.is_some() {
            bail!("--policy and --cache-size apply to the direct layout; the log layout uses the whole device and picks segments with --picker");
        }
        return crate::log_serve::format(
            &a.cache,
            &cache,
            backing.size(),
            &a.layout,
            line_size,
            mode_arg(&a.mode)?,
        );
    }
    if crate::log_serve::has_log_options(&a.layout) {
        bail!("--segment-size, --compression, --dedup, --picker, --trim and --reinsert-hits need --layout log");
    }
    let opts = FormatOptions {
        line_size,
        mode: mode_arg(&a.mode)?,
        policy: a.policy.clone(),
        capacity_lines: a
            .cache_size
            .as_deref()
            .map(|s| size_arg("--cache-size", s).map(|b| b / line_size))
            .transpose()?,
        backing_id: a.backing.display().to_string(),
    };
    let sb = tiercache_server::format(&cache, backing.size(), &opts)
        .with_context(|| format!("formatting {}", a.cache.display()))?;
    println!(
        "formatted {}: {} lines of {} bytes ({} cache data), metadata {} bytes, mode {}, policy {}, backing {} ({} bytes)",
        a.cache.display(),
        sb.capacity_lines,
        sb.line_size,
        tiercache_engine::fmt_size(sb.capacity_lines * sb.line_size),
        sb.data_offset,
        Mode::ALL[sb.mode as usize],
        sb.policy,
        a.backing.display(),
        sb.backing_size
    );
    Ok(())
}

fn merge(mut a: ServeArgs) -> Result<ServeArgs> {
    let Some(path) = a.config.clone() else {
        return Ok(a);
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let c: ServeArgs = toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    macro_rules! take {
        ($($f:ident),*) => { $( if a.$f.is_none() { a.$f = c.$f; } )* };
    }
    take!(
        cache,
        backing,
        socket,
        listen,
        mode,
        policy,
        line_size,
        cache_size,
        control,
        metrics,
        max_cache_errors,
        unmap_batch,
        emulate_hdd,
        workers,
        tls,
        tls_psk_file,
        tls_certificates,
        max_connections,
        cleaner,
        classes,
        classifier,
        class_rules
    );
    a.format_if_needed |= c.format_if_needed;
    a.tls_verify_peer |= c.tls_verify_peer;
    Ok(a)
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let a = merge(a)?;
    let cache_path = a
        .cache
        .clone()
        .ok_or_else(|| anyhow!("--cache PATH is required (or `cache` in --config)"))?;
    let backing_path = a
        .backing
        .clone()
        .ok_or_else(|| anyhow!("--backing PATH is required (or `backing` in --config)"))?;
    if a.socket.is_none() == a.listen.is_none() {
        bail!("give exactly one of --socket PATH and --listen ADDR:PORT");
    }
    let nbd_opts = nbd_options(&a)?;
    let listen = a.listen.as_deref().map(listen_addr).transpose()?;
    if listen.is_some_and(|l| !l.ip().is_loopback()) && a.tls.as_deref() != Some("require") {
        say!("warning: NBD on a non-loopback address without --tls require: anyone who can reach it can read and write the volume");
    }
    let mode = a.mode.as_deref().map(mode_arg).transpose()?;
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
    let cache_size = a
        .cache_size
        .as_deref()
        .map(|s| size_arg("--cache-size", s))
        .transpose()?;

    let backing_file = open_backing(&backing_path)?;
    let backing: Box<dyn BlockDev> = match &a.emulate_hdd {
        Some(spec) => {
            let cfg = tiercache_server::hdd_config(spec).map_err(|e| anyhow!(e))?;
            say!("backing device emulates HDD {spec} ({} rpm)", cfg.rpm);
            Box::new(
                EmulatedHdd::new(backing_file, cfg)
                    .map_err(|e| anyhow!("--emulate-hdd {spec}: {e}"))?,
            )
        }
        None => Box::new(backing_file),
    };
    if !cache_path.exists() && a.format_if_needed {
        let bytes = cache_size.ok_or_else(|| {
            anyhow!(
                "{} does not exist: give --cache-size to create it",
                cache_path.display()
            )
        })?;
        let ls = line_size.unwrap_or(4096);
        let lines = bytes / ls;
        let total = Superblock::data_offset_for(lines, ls) + lines * ls;
        std::fs::File::create_new(&cache_path)
            .and_then(|f| f.set_len(total))
            .with_context(|| format!("creating {}", cache_path.display()))?;
    }
    let cache = FileDev::open(&cache_path)?;
    let direct_sb = tiercache_server::read_superblock(&cache);
    let log_dev = crate::log_serve::is_log_device(&cache)?;
    let want_log = a.layout.is_log()?;
    let format_log = want_log
        && a.format_if_needed
        && matches!(direct_sb, Err(FormatError::BadMagic))
        && !log_dev;
    if log_dev || format_log {
        let direct_only = [
            ("--policy", a.policy.is_some()),
            ("--classes", a.classes.is_some()),
            ("--classifier", a.classifier.is_some()),
            ("--class-rules", a.class_rules.is_some()),
            ("--cleaner", a.cleaner.is_some()),
            ("--max-cache-errors", a.max_cache_errors.is_some()),
        ];
        let p = crate::log_serve::LogServe {
            cache_path: cache_path.clone(),
            socket: a.socket.clone(),
            listen,
            control: a.control.clone(),
            metrics: a.metrics.clone(),
            nbd: nbd_opts,
            mode,
            line_size,
            layout: a.layout.clone(),
            direct_only: direct_only.iter().filter(|x| x.1).map(|x| x.0).collect(),
            format: format_log,
        };
        return crate::log_serve::serve(p, cache, backing);
    }
    if want_log || crate::log_serve::has_log_options(&a.layout) {
        bail!("{}: --layout log and its options need a cache device in the log layout (`tiercache format --layout log`, or --format-if-needed on an empty device); this one {}", cache_path.display(), if direct_sb.is_ok() { "is in the direct layout" } else { "holds no cache" });
    }
    match direct_sb {
        Ok(sb) => {
            if let Some(ls) = line_size.filter(|&ls| ls != sb.line_size) {
                bail!(
                    "{} is formatted with {}-byte lines, not {ls}; reformat with `tiercache format --force --line-size {ls}`",
                    cache_path.display(),
                    sb.line_size
                );
            }
        }
        Err(FormatError::BadMagic) if a.format_if_needed => {
            let ls = line_size.unwrap_or(4096);
            let opts = FormatOptions {
                line_size: ls,
                mode: mode.unwrap_or(Mode::WriteThrough),
                policy: a.policy.clone().unwrap_or_else(|| "lru".into()),
                capacity_lines: cache_size.map(|b| b / ls),
                backing_id: backing_path.display().to_string(),
            };
            let sb = tiercache_server::format(&cache, backing.size(), &opts)?;
            say!(
                "formatted {}: {} lines of {} bytes",
                cache_path.display(),
                sb.capacity_lines,
                sb.line_size
            );
        }
        Err(FormatError::BadMagic) => bail!(
            "{} holds no tiercache cache: run `tiercache format` or add --format-if-needed",
            cache_path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("reading {}", cache_path.display())),
    }
    let table = crate::serve_classes::table(&a.classes, &a.class_rules, a.classifier.as_deref())?;
    let opts = OpenOptions {
        mode,
        policy: a.policy.clone(),
        classes: table.clone(),
    };
    let (mut vol, rep) = CacheVolume::open(Box::new(cache), backing, &opts)
        .with_context(|| format!("opening cache {}", cache_path.display()))?;
    crate::serve_classes::attach(&mut vol, a.classifier.as_deref(), table)?;
    say!(
        "cache {}: {} lines restored ({} dirty) after {} shutdown; {} bad records dropped; mode {}",
        cache_path.display(),
        rep.restored,
        rep.restored_dirty,
        if rep.was_clean {
            "a clean"
        } else {
            "an unclean"
        },
        rep.dropped_bad_checksum,
        vol.mode()
    );
    if let Some(n) = a.unmap_batch {
        vol.set_unmap_batch(n);
    }
    if let Some(n) = a.max_cache_errors {
        vol.set_max_cache_errors(n);
    }
    let vol = Arc::new(vol);
    vol.set_inline_cleaning(inline_cleaning);
    let cleaner = vol.start_cleaner();
    if let Some(p) = &a.control {
        control::serve_control(p, Arc::clone(&vol))?;
    }
    if let Some(m) = &a.metrics {
        let addr: SocketAddr = m.parse().map_err(|e| anyhow!("--metrics {m:?}: {e}"))?;
        let (local, _) = control::serve_metrics(addr, Arc::clone(&vol))?;
        say!("metrics on http://{local}/metrics");
    }
    let served = serve_until_signal(
        vol.clone() as Arc<dyn tiercache_nbd::Export>,
        nbd_opts,
        a.socket.as_deref(),
        listen,
    );
    let closed = vol.shutdown();
    let _ = cleaner.join();
    if let Some(p) = &a.control {
        let _ = std::fs::remove_file(p);
    }
    served.context("NBD server")?;
    closed.context("clean shutdown of the cache")?;
    // The last word tells the truth about what a restart will find.
    let st = vol.stats();
    if st.cache_failed {
        say!(
            "cache {} had FAILED (everything passed through to the backing device since): it was not marked clean; run `tiercache format --force` on it before it is used again{}",
            cache_path.display(),
            if st.lost_dirty_ranges.is_empty() {
                String::new()
            } else {
                format!(
                    "; dirty data LOST in volume byte ranges {:?}",
                    st.lost_dirty_ranges
                )
            }
        );
    } else if st.degraded {
        say!(
            "cache {} shut down cleanly with {} dirty lines the backing device would not take (write-backs failing): they stay in the cache and are written back after the next start",
            cache_path.display(),
            st.dirty_lines
        );
    } else {
        say!("cache {} shut down cleanly", cache_path.display());
    }
    Ok(())
}

/// Serves `export` as NBD export "tiercache" on the unix socket or TCP address until SIGTERM
/// or SIGINT; returns how serving ended (the caller then shuts its volume down).
pub(crate) fn serve_until_signal(
    export: Arc<dyn tiercache_nbd::Export>,
    opts: tiercache_nbd::ServerOptions,
    socket: Option<&std::path::Path>,
    listen: Option<SocketAddr>,
) -> Result<()> {
    let server = Server::new(vec![("tiercache".into(), export)]).with_options(opts);
    let stop = server.shutdown_handle();
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
            server.serve_unix(s)
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

/// NBD server options from the flags: workers, connection limit, TLS.
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
    Ok(tiercache_nbd::ServerOptions {
        workers_per_connection: a.workers.unwrap_or(d.workers_per_connection),
        max_connections: a.max_connections.unwrap_or(d.max_connections),
        tls,
        ..d
    })
}

fn print_stats(v: &serde_json::Value) {
    let s = &v["stats"];
    if s["layout"] == "log" {
        return crate::log_serve::print_stats(s);
    }
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    let cap = n(&s["capacity_lines"]).max(1);
    println!("mode            {}", s["mode"].as_str().unwrap_or("?"));
    println!("policy          {}", s["policy"].as_str().unwrap_or("?"));
    println!(
        "occupancy       {} of {} lines ({:.1} %), line size {}",
        n(&s["cached_lines"]),
        cap,
        100.0 * n(&s["cached_lines"]) as f64 / cap as f64,
        n(&s["line_size"])
    );
    println!(
        "dirty           {} lines, {} bytes",
        n(&s["dirty_lines"]),
        n(&s["dirty_bytes"])
    );
    println!("RAM (index)     {} bytes", n(&s["ram_index_bytes"]));
    // Faults first: a class table must not hide them.
    println!(
        "device errors   cache {}, backing {} ({} failed write-backs){}",
        n(&s["cache_errors"]),
        n(&s["backing_errors"]),
        n(&s["backing_write_errors"]),
        if s["cache_failed"] == true {
            "; CACHE DEVICE FAILED: passing everything through to the backing device"
        } else {
            ""
        }
    );
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
            "LOST dirty data {} bytes, volume byte ranges {}",
            n(&s["lost_dirty_bytes"]),
            s["lost_dirty_ranges"]
        );
    }
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

pub fn ctl(a: CtlArgs) -> Result<()> {
    let cmd = match &a.cmd {
        CtlCmd::Stats { .. } => Command::Stats,
        CtlCmd::Flush => Command::Flush,
        CtlCmd::Mode { mode } => {
            mode_arg(mode)?;
            Command::Mode { mode: mode.clone() }
        }
        CtlCmd::Detach => Command::Detach,
    };
    let v = control::request(&a.control, &cmd).map_err(|e| anyhow!(e))?;
    match a.cmd {
        CtlCmd::Stats { json: true } => println!("{}", serde_json::to_string_pretty(&v["stats"])?),
        CtlCmd::Stats { json: false } => print_stats(&v),
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
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
