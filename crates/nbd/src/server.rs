//! The NBD server loop: fixed newstyle handshake, then transmission with many requests in
//! flight per connection.
//!
//! Threads: one accept loop per `serve_*` call, one thread per connection for the handshake,
//! which then becomes one of `workers_per_connection` workers. Each worker takes the reader
//! lock, reads one request (and its WRITE payload), releases the lock, executes the request on
//! the export and writes the reply under the writer lock in one `write_all`. So up to
//! `workers_per_connection` requests run at once per connection and their replies go out in
//! completion order, with no hand-off between threads on the hot path.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use tracing::{debug, info, warn};

use crate::proto::*;
use crate::tls::{TlsConfig, TlsStream};
use crate::Export;

/// Tuning of the server loop.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Requests executed at once per connection (worker threads per connection).
    pub workers_per_connection: usize,
    /// Connections served at once; more are closed right after accept.
    pub max_connections: usize,
    /// Largest WRITE payload that is read and discarded (then answered with EINVAL) when it
    /// exceeds the export's maximum block size; a longer one closes the connection, so a
    /// client cannot make the server buffer an unbounded payload.
    pub max_drain: u32,
    /// TLS (`NBD_OPT_STARTTLS`): None answers STARTTLS with `NBD_REP_ERR_UNSUP`.
    pub tls: Option<TlsConfig>,
    /// How long the handshake (greeting, options, TLS) may take before the connection is
    /// dropped, so idle or stalled clients cannot hold connection slots forever.
    pub handshake_timeout: Option<std::time::Duration>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            workers_per_connection: 16,
            max_connections: 1024,
            max_drain: 32 << 20,
            tls: None,
            handshake_timeout: Some(std::time::Duration::from_secs(30)),
        }
    }
}

/// Longest option payload the server reads (export name, info requests). Longer options get
/// `NBD_REP_ERR_TOO_BIG` after being discarded, up to [`OPTION_DRAIN_LIMIT`].
const OPTION_MAX: u32 = 16 << 10;
const OPTION_DRAIN_LIMIT: u32 = 1 << 20;
/// Reply buffers larger than this are given back after the request.
const KEEP_BUFFER: usize = 4 << 20;

struct Shared {
    exports: Vec<(String, Arc<dyn Export>)>,
    opts: ServerOptions,
    stopping: AtomicBool,
    /// Self-pipe: the shutdown handle writes one byte, every accept loop polls the read end.
    wake_r: RawFd,
    wake_w: RawFd,
    conns: Mutex<HashMap<u64, RawFd>>,
    next_conn: AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: both fds were created by pipe2 in Server::new and are closed only here.
        unsafe {
            libc::close(self.wake_r);
            libc::close(self.wake_w);
        }
    }
}

/// An NBD server exporting one or more volumes. The first export is also the default one
/// (the empty export name).
pub struct Server {
    shared: Arc<Shared>,
}

/// Stops a running [`Server`]: accept loops end, connections stop reading new requests,
/// requests in flight finish and are answered, then `serve_*` returns.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        let s = &self.shared;
        if s.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        info!("NBD server shutting down");
        // SAFETY: wake_w is a valid pipe fd owned by Shared, which self keeps alive.
        unsafe {
            libc::write(s.wake_w, b"x".as_ptr().cast(), 1);
        }
        let conns = s.conns.lock().unwrap();
        for &fd in conns.values() {
            // SAFETY: a connection removes its fd from the map (under this lock) before
            // closing it, so fd is still that connection's open socket.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RD);
            }
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }
}

/// What an accepted socket must offer.
trait Stream: AsRawFd + Send + Sync + 'static
where
    for<'a> &'a Self: Read + Write,
{
}
impl Stream for std::os::unix::net::UnixStream {}
impl Stream for std::net::TcpStream {}
impl Stream for TlsStream {}

impl Server {
    pub fn new(exports: Vec<(String, Arc<dyn Export>)>) -> Server {
        assert!(
            !exports.is_empty(),
            "an NBD server needs at least one export"
        );
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array of two ints.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
        Server {
            shared: Arc::new(Shared {
                exports,
                opts: ServerOptions::default(),
                stopping: AtomicBool::new(false),
                wake_r: fds[0],
                wake_w: fds[1],
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
            }),
        }
    }

    pub fn with_options(self, opts: ServerOptions) -> Server {
        let mut shared = match Arc::try_unwrap(self.shared) {
            Ok(s) => s,
            Err(_) => panic!("with_options must be called before shutdown_handle"),
        };
        shared.opts = ServerOptions {
            workers_per_connection: opts.workers_per_connection.max(1),
            max_connections: opts.max_connections.max(1),
            ..opts
        };
        Server {
            shared: Arc::new(shared),
        }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
        }
    }

    /// Listens on a unix socket at `path` (a stale socket file there is replaced) until
    /// shutdown; removes the socket file on return. The socket is 0600 whatever the umask.
    pub fn serve_unix(&self, path: &Path) -> io::Result<()> {
        self.serve_unix_group(path, None)
    }

    /// [`Server::serve_unix`], with the socket 0660 and owned by group `group` (a gid) when
    /// one is given (`unix_access::bind_private`).
    pub fn serve_unix_group(&self, path: &Path, group: Option<u32>) -> io::Result<()> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket()
                && std::os::unix::net::UnixStream::connect(path).is_err()
            {
                std::fs::remove_file(path)?;
            }
        }
        let listener = crate::unix_access::bind_private(path, group).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {}: {e}", path.display()),
            )
        })?;
        listener.set_nonblocking(true)?;
        info!(socket = %path.display(), "NBD server listening");
        let r = self.accept_loop(listener.as_raw_fd(), || {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(false)?;
            Ok(s)
        });
        let _ = std::fs::remove_file(path);
        r
    }

    /// Serves one already connected stream on the calling thread until the client leaves
    /// (for tests and fuzzing: a socketpair end).
    pub fn serve_stream(&self, stream: std::os::unix::net::UnixStream) -> io::Result<()> {
        let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        self.shared
            .conns
            .lock()
            .unwrap()
            .insert(id, stream.as_raw_fd());
        let r = serve_connection(&self.shared, &stream);
        self.shared.conns.lock().unwrap().remove(&id);
        r
    }

    /// Listens on a TCP address until shutdown.
    pub fn serve_tcp(&self, addr: SocketAddr) -> io::Result<()> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        info!(addr = %listener.local_addr()?, "NBD server listening");
        self.accept_loop(listener.as_raw_fd(), || {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(false)?;
            s.set_nodelay(true)?;
            Ok(s)
        })
    }

    fn accept_loop<S: Stream>(
        &self,
        listen_fd: RawFd,
        mut accept: impl FnMut() -> io::Result<S>,
    ) -> io::Result<()>
    where
        for<'a> &'a S: Read + Write,
    {
        let shared = &self.shared;
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !shared.stopping.load(Ordering::SeqCst) {
            let mut fds = [
                libc::pollfd {
                    fd: listen_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: shared.wake_r,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: fds is a valid array of two pollfd.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 || shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            let stream = match accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of fds and the like: the server keeps going.
                    warn!("accept failed: {e}");
                    thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            threads.retain(|t| !t.is_finished());
            if threads.len() >= shared.opts.max_connections {
                warn!(
                    "refusing connection: {} connections already open",
                    threads.len()
                );
                continue;
            }
            let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
            shared.conns.lock().unwrap().insert(id, stream.as_raw_fd());
            // A shutdown between the loop check and the insert would miss this connection.
            if shared.stopping.load(Ordering::SeqCst) {
                shared.conns.lock().unwrap().remove(&id);
                break;
            }
            let sh = shared.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    debug!(conn = id, "connection opened");
                    match serve_connection(&sh, &stream) {
                        Ok(()) => debug!(conn = id, "connection closed"),
                        Err(e) => debug!(conn = id, "connection closed: {e}"),
                    }
                    sh.conns.lock().unwrap().remove(&id);
                    drop(stream);
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    warn!("cannot start a connection thread: {e}");
                    shared.conns.lock().unwrap().remove(&id);
                }
            }
        }
        for t in threads {
            let _ = t.join();
        }
        Ok(())
    }
}

/// Per-connection transmission state shared by its workers.
struct Transmission<'a, S: Stream>
where
    for<'b> &'b S: Read + Write,
{
    export: &'a dyn Export,
    size: u64,
    max_block: u32,
    structured: bool,
    read_only: bool,
    can_trim: bool,
    max_drain: u32,
    stream: &'a S,
    reader: Mutex<BufReader<&'a S>>,
    writer: Mutex<()>,
    closing: AtomicBool,
}

fn serve_connection<S: Stream>(shared: &Shared, stream: &S) -> io::Result<()>
where
    for<'a> &'a S: Read + Write,
{
    set_read_timeout(stream.as_raw_fd(), shared.opts.handshake_timeout);
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let Some(no_zeroes) = hello(&mut reader, stream)? else {
        return Ok(());
    };
    match options(shared, &mut reader, stream, no_zeroes, false)? {
        Haggled::Done => Ok(()),
        Haggled::Go(export, structured) => {
            set_read_timeout(stream.as_raw_fd(), None);
            transmit(shared, reader, stream, export, structured)
        }
        Haggled::StartTls(tls) => {
            if !reader.buffer().is_empty() {
                return Err(protocol_error(
                    "client sent data after STARTTLS before the TLS handshake",
                ));
            }
            let tls = tls.accept(stream.as_raw_fd())?;
            tls.set_read_timeout(shared.opts.handshake_timeout);
            debug!("TLS session established");
            let mut reader = BufReader::with_capacity(64 << 10, &tls);
            let r = match options::<TlsStream>(shared, &mut reader, &tls, no_zeroes, true)? {
                Haggled::Go(export, structured) => {
                    tls.set_read_timeout(None);
                    transmit::<TlsStream>(shared, reader, &tls, export, structured)
                }
                _ => Ok(()),
            };
            tls.close();
            r
        }
    }
}

/// Sets (or clears) SO_RCVTIMEO on a socket.
fn set_read_timeout(fd: RawFd, t: Option<std::time::Duration>) {
    let t = t.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: tv is a valid timeval; a failure only leaves the timeout as it was.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

fn transmit<S: Stream>(
    shared: &Shared,
    reader: BufReader<&S>,
    stream: &S,
    export: Arc<dyn Export>,
    structured: bool,
) -> io::Result<()>
where
    for<'a> &'a S: Read + Write,
{
    let bs = export.block_sizes();
    let t = Transmission {
        export: &*export,
        size: export.size(),
        max_block: bs.maximum,
        structured,
        read_only: export.read_only(),
        can_trim: export.can_trim(),
        max_drain: shared.opts.max_drain,
        stream,
        reader: Mutex::new(reader),
        writer: Mutex::new(()),
        closing: AtomicBool::new(false),
    };
    let workers = shared.opts.workers_per_connection;
    thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(|| worker(&t));
        }
        worker(&t);
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Handshake

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn send_opt_reply(w: &mut impl Write, opt: u32, rep: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&rep.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

fn send_opt_error(w: &mut impl Write, opt: u32, rep: u32, msg: &str) -> io::Result<()> {
    debug!(option = opt, "option refused: {msg}");
    send_opt_reply(w, opt, rep, msg.as_bytes())
}

fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_WRITE_ZEROES;
    if export.can_trim() {
        f |= FLAG_SEND_TRIM;
    }
    if export.can_multi_conn() {
        f |= FLAG_CAN_MULTI_CONN;
    }
    if export.read_only() {
        f |= FLAG_READ_ONLY;
    }
    if structured {
        // Reads are always answered in one chunk, so "don't fragment" holds trivially.
        f |= FLAG_SEND_DF;
    }
    f
}

fn find_export<'a>(shared: &'a Shared, name: &[u8]) -> Option<&'a (String, Arc<dyn Export>)> {
    if name.is_empty() {
        return shared.exports.first();
    }
    shared.exports.iter().find(|(n, _)| n.as_bytes() == name)
}

/// How option haggling ended.
enum Haggled {
    /// Transmission with this export; whether structured replies were negotiated.
    Go(Arc<dyn Export>, bool),
    /// STARTTLS was acknowledged: the TLS handshake comes next.
    StartTls(TlsConfig),
    /// The client ended the session (ABORT, or a refused handshake).
    Done,
}

/// Sends the greeting and reads the client flags. Returns whether the client asked for no
/// zeroes, or None when the client is refused.
fn hello<S: Stream>(r: &mut BufReader<&S>, stream: &S) -> io::Result<Option<bool>>
where
    for<'a> &'a S: Read + Write,
{
    let mut w = stream;
    let mut hello = [0u8; 18];
    hello[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&hello)?;
    let cflags = read_u32(r)?;
    if cflags & FLAG_C_FIXED_NEWSTYLE == 0 {
        warn!("client does not speak fixed newstyle (flags {cflags:#x}); closing");
        return Ok(None);
    }
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        warn!("client sent unknown handshake flags {cflags:#x}; closing");
        return Ok(None);
    }
    Ok(Some(cflags & FLAG_C_NO_ZEROES != 0))
}

/// Runs option haggling (again after STARTTLS, with `tls_up`).
fn options<S: Stream>(
    shared: &Shared,
    r: &mut BufReader<&S>,
    stream: &S,
    no_zeroes: bool,
    tls_up: bool,
) -> io::Result<Haggled>
where
    for<'a> &'a S: Read + Write,
{
    let mut w = stream;
    let tls_required = !tls_up && shared.opts.tls.as_ref().is_some_and(|t| t.require);
    let mut structured = false;
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return Ok(Haggled::Done);
        }
        let magic = read_u64(r)?;
        if magic != IHAVEOPT {
            return Err(protocol_error(format!(
                "bad option magic {magic:#x} (expected IHAVEOPT)"
            )));
        }
        let opt = read_u32(r)?;
        let len = read_u32(r)?;
        if len > OPTION_MAX {
            if len > OPTION_DRAIN_LIMIT || opt == OPT_EXPORT_NAME {
                return Err(protocol_error(format!(
                    "option {opt} with {len} bytes of data; closing"
                )));
            }
            io::copy(&mut r.take(len as u64), &mut io::sink())?;
            send_opt_error(&mut w, opt, REP_ERR_TOO_BIG, "option data too long")?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)?;
        if tls_required && opt != OPT_STARTTLS && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                warn!("client asked for an export without TLS, which is required; closing");
                return Ok(Haggled::Done);
            }
            send_opt_error(
                &mut w,
                opt,
                REP_ERR_TLS_REQD,
                "TLS is required: use STARTTLS",
            )?;
            continue;
        }
        match opt {
            OPT_EXPORT_NAME => {
                let Some((name, export)) = find_export(shared, &data) else {
                    // No way to report an error to EXPORT_NAME: the spec says to close.
                    warn!(
                        "client asked for unknown export {:?}; closing",
                        String::from_utf8_lossy(&data)
                    );
                    return Ok(Haggled::Done);
                };
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&export.size().to_be_bytes());
                b.extend_from_slice(&transmission_flags(&**export, structured).to_be_bytes());
                if !no_zeroes {
                    b.resize(b.len() + 124, 0);
                }
                w.write_all(&b)?;
                debug!(export = %name, "transmission (EXPORT_NAME)");
                return Ok(Haggled::Go(export.clone(), structured));
            }
            OPT_ABORT => {
                let _ = send_opt_reply(&mut w, opt, REP_ACK, &[]);
                return Ok(Haggled::Done);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_opt_error(&mut w, opt, REP_ERR_INVALID, "LIST takes no data")?;
                    continue;
                }
                for (name, _) in &shared.exports {
                    let mut d = Vec::with_capacity(4 + name.len());
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    send_opt_reply(&mut w, opt, REP_SERVER, &d)?;
                }
                send_opt_reply(&mut w, opt, REP_ACK, &[])?;
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_opt_error(
                        &mut w,
                        opt,
                        REP_ERR_INVALID,
                        "STRUCTURED_REPLY takes no data",
                    )?;
                } else if structured {
                    send_opt_error(
                        &mut w,
                        opt,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    )?;
                } else {
                    structured = true;
                    send_opt_reply(&mut w, opt, REP_ACK, &[])?;
                }
            }
            OPT_INFO | OPT_GO => {
                // u32 name length, name, u16 number of info requests, u16 each.
                let parsed = (|| {
                    let nl = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
                    let name = data.get(4..4 + nl)?;
                    let nr_at = 4 + nl;
                    let nr =
                        u16::from_be_bytes(data.get(nr_at..nr_at + 2)?.try_into().ok()?) as usize;
                    let reqs = data.get(nr_at + 2..)?;
                    if reqs.len() != nr * 2 {
                        return None;
                    }
                    let reqs: Vec<u16> = reqs
                        .chunks_exact(2)
                        .map(|c| u16::from_be_bytes([c[0], c[1]]))
                        .collect();
                    Some((name, reqs))
                })();
                let Some((name, reqs)) = parsed else {
                    send_opt_error(&mut w, opt, REP_ERR_INVALID, "malformed INFO/GO request")?;
                    continue;
                };
                if name.len() > MAX_STRING {
                    send_opt_error(
                        &mut w,
                        opt,
                        REP_ERR_INVALID,
                        "export name longer than 4096 bytes",
                    )?;
                    continue;
                }
                if std::str::from_utf8(name).is_err() {
                    send_opt_error(&mut w, opt, REP_ERR_INVALID, "export name is not UTF-8")?;
                    continue;
                }
                let Some((ename, export)) = find_export(shared, name) else {
                    let msg = format!("no export named {:?}", String::from_utf8_lossy(name));
                    send_opt_error(&mut w, opt, REP_ERR_UNKNOWN, &msg)?;
                    continue;
                };
                let flags = transmission_flags(&**export, structured);
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&export.size().to_be_bytes());
                d.extend_from_slice(&flags.to_be_bytes());
                send_opt_reply(&mut w, opt, REP_INFO, &d)?;
                if reqs.contains(&INFO_NAME) {
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(ename.as_bytes());
                    send_opt_reply(&mut w, opt, REP_INFO, &d)?;
                }
                if reqs.contains(&INFO_DESCRIPTION) {
                    if let Some(desc) = export.description() {
                        let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                        let mut cut = desc.len().min(MAX_STRING);
                        while !desc.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        d.extend_from_slice(&desc.as_bytes()[..cut]);
                        send_opt_reply(&mut w, opt, REP_INFO, &d)?;
                    }
                }
                // Block sizes are always sent: the client learns the maximum payload.
                let bs = export.block_sizes();
                let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                d.extend_from_slice(&bs.minimum.to_be_bytes());
                d.extend_from_slice(&bs.preferred.to_be_bytes());
                d.extend_from_slice(&bs.maximum.to_be_bytes());
                send_opt_reply(&mut w, opt, REP_INFO, &d)?;
                send_opt_reply(&mut w, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    debug!(export = %ename, structured, "transmission (GO)");
                    return Ok(Haggled::Go(export.clone(), structured));
                }
            }
            OPT_STARTTLS => match &shared.opts.tls {
                None => send_opt_error(&mut w, opt, REP_ERR_UNSUP, "TLS is not enabled")?,
                Some(_) if tls_up => {
                    send_opt_error(&mut w, opt, REP_ERR_INVALID, "TLS is already up")?
                }
                Some(_) if !data.is_empty() => {
                    send_opt_error(&mut w, opt, REP_ERR_INVALID, "STARTTLS takes no data")?
                }
                Some(tls) => {
                    send_opt_reply(&mut w, opt, REP_ACK, &[])?;
                    return Ok(Haggled::StartTls(tls.clone()));
                }
            },
            _ => {
                send_opt_error(&mut w, opt, REP_ERR_UNSUP, "option not supported")?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Transmission

struct Req {
    flags: u16,
    typ: u16,
    handle: u64,
    offset: u64,
    len: u32,
}

/// What the reader found besides a request to run.
enum Next {
    /// Run the request; a WRITE payload is in the worker's buffer.
    Run(Req),
    /// Answer with this error without running (payload, if any, was discarded).
    Fail(Req, u32, &'static str),
    /// Stop this connection.
    Close,
}

/// Bytes reserved before the data in a worker buffer: enough for a structured OFFSET_DATA
/// header (20 + 8) or a simple reply (16).
const DATA_AT: usize = STRUCTURED_HEADER_LEN + 8;

fn worker<S: Stream>(t: &Transmission<'_, S>)
where
    for<'a> &'a S: Read + Write,
{
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if t.closing.load(Ordering::SeqCst) {
            return;
        }
        let next = {
            let mut r = t.reader.lock().unwrap();
            if t.closing.load(Ordering::SeqCst) {
                return;
            }
            let n = read_request(t, &mut r, &mut buf);
            if matches!(n, Next::Close) {
                close_reading(t);
            }
            n
        };
        let ok = match next {
            Next::Close => return,
            Next::Fail(req, err, msg) => send_error(t, &req, err, msg, &mut buf),
            Next::Run(req) => run(t, &req, &mut buf),
        };
        if !ok {
            close_reading(t);
            return;
        }
        if buf.capacity() > KEEP_BUFFER {
            buf = Vec::new();
        }
    }
}

/// Stops every worker of the connection from reading further requests.
fn close_reading<S: Stream>(t: &Transmission<'_, S>)
where
    for<'a> &'a S: Read + Write,
{
    if !t.closing.swap(true, Ordering::SeqCst) {
        // SAFETY: the stream is open for the connection's whole lifetime.
        unsafe {
            libc::shutdown(t.stream.as_raw_fd(), libc::SHUT_RD);
        }
    }
}

fn read_request<S: Stream>(
    t: &Transmission<'_, S>,
    r: &mut BufReader<&S>,
    buf: &mut Vec<u8>,
) -> Next
where
    for<'a> &'a S: Read + Write,
{
    let mut h = [0u8; REQUEST_LEN];
    if let Err(e) = r.read_exact(&mut h) {
        if e.kind() != io::ErrorKind::UnexpectedEof {
            debug!("reading request: {e}");
        } else {
            debug!("client closed the connection without NBD_CMD_DISC");
        }
        return Next::Close;
    }
    let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        warn!("bad request magic {magic:#x}; closing connection");
        return Next::Close;
    }
    let req = Req {
        flags: u16::from_be_bytes(h[4..6].try_into().unwrap()),
        typ: u16::from_be_bytes(h[6..8].try_into().unwrap()),
        handle: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        len: u32::from_be_bytes(h[24..28].try_into().unwrap()),
    };
    let end = req.offset.checked_add(req.len as u64);
    let in_range = end.is_some_and(|e| e <= t.size);
    let allowed_flags = match req.typ {
        CMD_READ if t.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => CMD_FLAG_FUA,
    };
    let bad_flags = req.flags & !allowed_flags != 0;
    match req.typ {
        CMD_WRITE => {
            let len = req.len as usize;
            if req.len > t.max_block {
                if req.len > t.max_drain {
                    warn!(
                        handle = req.handle,
                        "WRITE of {} bytes exceeds the {} byte limit; closing connection",
                        req.len,
                        t.max_drain
                    );
                    return Next::Close;
                }
                if io::copy(&mut r.take(len as u64), &mut io::sink()).ok() != Some(len as u64) {
                    return Next::Close;
                }
                return Next::Fail(req, EINVAL, "write longer than the maximum block size");
            }
            buf.resize(DATA_AT + len, 0);
            if r.read_exact(&mut buf[DATA_AT..]).is_err() {
                debug!("connection closed in the middle of a WRITE payload");
                return Next::Close;
            }
            if bad_flags {
                return Next::Fail(req, EINVAL, "unknown or inapplicable command flags");
            }
            if t.read_only {
                return Next::Fail(req, EPERM, "export is read-only");
            }
            if !in_range {
                return Next::Fail(req, ENOSPC, "write beyond the end of the export");
            }
            if req.len == 0 {
                return Next::Fail(req, EINVAL, "zero-length write");
            }
            Next::Run(req)
        }
        _ if bad_flags => Next::Fail(req, EINVAL, "unknown or inapplicable command flags"),
        CMD_READ => {
            if req.len > t.max_block {
                let e = if req.flags & CMD_FLAG_DF != 0 {
                    EOVERFLOW
                } else {
                    EINVAL
                };
                Next::Fail(req, e, "read longer than the maximum block size")
            } else if !in_range {
                Next::Fail(req, EINVAL, "read beyond the end of the export")
            } else if req.len == 0 {
                Next::Fail(req, EINVAL, "zero-length read")
            } else {
                Next::Run(req)
            }
        }
        CMD_DISC => {
            debug!("client sent NBD_CMD_DISC");
            Next::Close
        }
        CMD_FLUSH => Next::Run(req),
        CMD_TRIM => {
            if !t.can_trim {
                Next::Fail(req, EINVAL, "trim is not supported by this export")
            } else if t.read_only {
                Next::Fail(req, EPERM, "export is read-only")
            } else if !in_range {
                Next::Fail(req, EINVAL, "trim beyond the end of the export")
            } else {
                Next::Run(req)
            }
        }
        CMD_WRITE_ZEROES => {
            if t.read_only {
                Next::Fail(req, EPERM, "export is read-only")
            } else if !in_range {
                Next::Fail(req, ENOSPC, "write zeroes beyond the end of the export")
            } else {
                Next::Run(req)
            }
        }
        _ => Next::Fail(req, EINVAL, "unknown command"),
    }
}

fn cmd_name(typ: u16) -> &'static str {
    match typ {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        _ => "command",
    }
}

/// Executes one request and sends its reply. Returns false when the reply could not be sent.
fn run<S: Stream>(t: &Transmission<'_, S>, req: &Req, buf: &mut Vec<u8>) -> bool
where
    for<'a> &'a S: Read + Write,
{
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let e = t.export;
    let result = match req.typ {
        CMD_READ => {
            let len = req.len as usize;
            buf.resize(DATA_AT + len, 0);
            match e.read(req.offset, &mut buf[DATA_AT..]) {
                Ok(()) => return send_read_data(t, req, buf),
                Err(err) => Err(err),
            }
        }
        CMD_WRITE => e.write(req.offset, &buf[DATA_AT..DATA_AT + req.len as usize], fua),
        CMD_FLUSH => e.flush(),
        CMD_TRIM => {
            e.trim(req.offset, req.len as u64)
                .and_then(|()| if fua { e.flush() } else { Ok(()) })
        }
        CMD_WRITE_ZEROES => e.write_zeroes(
            req.offset,
            req.len as u64,
            fua,
            req.flags & CMD_FLAG_NO_HOLE == 0,
        ),
        _ => unreachable!("validated in read_request"),
    };
    match result {
        Ok(()) => send_simple(t, req.handle, 0, buf),
        Err(err) => {
            let code = errno_of(&err);
            warn!(
                "{} at offset {} length {} failed: {err} (replying {})",
                cmd_name(req.typ),
                req.offset,
                req.len,
                errno_name(code)
            );
            if req.typ == CMD_READ && t.structured {
                send_structured_error(t, req, code, &err.to_string(), Some(req.offset), buf)
            } else {
                send_simple(t, req.handle, code, buf)
            }
        }
    }
}

fn send_error<S: Stream>(
    t: &Transmission<'_, S>,
    req: &Req,
    code: u32,
    msg: &str,
    buf: &mut Vec<u8>,
) -> bool
where
    for<'a> &'a S: Read + Write,
{
    debug!(
        handle = req.handle,
        "{} offset {} length {} refused: {msg} ({})",
        cmd_name(req.typ),
        req.offset,
        req.len,
        errno_name(code)
    );
    if req.typ == CMD_READ && t.structured {
        send_structured_error(t, req, code, msg, None, buf)
    } else {
        send_simple(t, req.handle, code, buf)
    }
}

fn write_reply<S: Stream>(t: &Transmission<'_, S>, bytes: &[u8]) -> bool
where
    for<'a> &'a S: Read + Write,
{
    let _g = t.writer.lock().unwrap();
    let mut w = t.stream;
    match w.write_all(bytes) {
        Ok(()) => true,
        Err(e) => {
            debug!("sending reply: {e}");
            false
        }
    }
}

fn send_simple<S: Stream>(t: &Transmission<'_, S>, handle: u64, err: u32, buf: &mut Vec<u8>) -> bool
where
    for<'a> &'a S: Read + Write,
{
    buf.clear();
    buf.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    buf.extend_from_slice(&err.to_be_bytes());
    buf.extend_from_slice(&handle.to_be_bytes());
    write_reply(t, buf)
}

/// Sends read data that sits at `buf[DATA_AT..]`, header written in place before it.
fn send_read_data<S: Stream>(t: &Transmission<'_, S>, req: &Req, buf: &mut [u8]) -> bool
where
    for<'a> &'a S: Read + Write,
{
    if t.structured {
        let h = &mut buf[..DATA_AT];
        h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        h[6..8].copy_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        h[8..16].copy_from_slice(&req.handle.to_be_bytes());
        h[16..20].copy_from_slice(&(req.len + 8).to_be_bytes());
        h[20..28].copy_from_slice(&req.offset.to_be_bytes());
        write_reply(t, buf)
    } else {
        let at = DATA_AT - SIMPLE_REPLY_LEN;
        let h = &mut buf[at..DATA_AT];
        h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        h[4..8].copy_from_slice(&0u32.to_be_bytes());
        h[8..16].copy_from_slice(&req.handle.to_be_bytes());
        write_reply(t, &buf[at..])
    }
}

fn send_structured_error<S: Stream>(
    t: &Transmission<'_, S>,
    req: &Req,
    code: u32,
    msg: &str,
    offset: Option<u64>,
    buf: &mut Vec<u8>,
) -> bool
where
    for<'a> &'a S: Read + Write,
{
    let mut cut = msg.len().min(MAX_STRING);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    let msg = &msg.as_bytes()[..cut];
    let typ = if offset.is_some() {
        REPLY_TYPE_ERROR_OFFSET
    } else {
        REPLY_TYPE_ERROR
    };
    let len = 6 + msg.len() + if offset.is_some() { 8 } else { 0 };
    buf.clear();
    buf.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    buf.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    buf.extend_from_slice(&typ.to_be_bytes());
    buf.extend_from_slice(&req.handle.to_be_bytes());
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    buf.extend_from_slice(&code.to_be_bytes());
    buf.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    buf.extend_from_slice(msg);
    if let Some(o) = offset {
        buf.extend_from_slice(&o.to_be_bytes());
    }
    write_reply(t, buf)
}
