//! The NBD server loop: fixed newstyle handshake, then transmission with many requests in
//! flight per connection.
//!
//! Threads: one accept loop per `serve_*` call (it also enforces the deadlines below), one
//! thread per connection that does the handshake and then reads requests, one writer thread
//! per connection in transmission, and ONE pool of `workers` threads shared by every
//! connection that executes requests on the exports. So threads grow by at most two per
//! connection and never with connections x workers; a request that finds every worker busy
//! waits in the pool's FIFO queue.
//!
//! Memory: a request is admitted (its WRITE payload read, or handed to the pool) only once
//! its bytes fit in the connection's budget (`max_inflight_bytes_per_connection`) and in the
//! server's (`max_inflight_bytes`); the bytes come back when its reply has been sent. So a
//! client that pipelines large READs and never reads the replies holds at most its own budget,
//! and only until `write_timeout`, when the connection is shut down and its buffers freed.
//! A connection with nothing in flight may always run one request of up to [`SMALL_REQUEST`]
//! bytes, so clients that exhaust the server's budget cannot starve small requests of others.
//!
//! Pre-transmission: the handshake (greeting, options, TLS) must be over within
//! `handshake_deadline` in total and take at most `max_options` options, or the connection is
//! dropped (logged at most once per peer every [`LOG_EVERY`]).

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::proto::*;
use crate::tls::{TlsConfig, TlsStream};
use crate::Export;

/// Tuning of the server loop. The defaults bound a server's threads to
/// `2 * max_connections + workers` and its request buffers to about `max_inflight_bytes`.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Threads executing requests, shared by all connections (requests run at once in total).
    pub workers: usize,
    /// Requests in flight per connection (read and not yet answered).
    pub workers_per_connection: usize,
    /// Connections served at once; more are closed right after accept.
    pub max_connections: usize,
    /// Bytes of requests in flight over all connections (READ replies and WRITE payloads
    /// held by the server); a connection whose next request does not fit is not read from
    /// until replies drain.
    pub max_inflight_bytes: u64,
    /// Bytes of requests in flight per connection (at least one request of any size is
    /// admitted when the connection has nothing in flight).
    pub max_inflight_bytes_per_connection: u64,
    /// Largest WRITE payload that is read and discarded (then answered with EINVAL) when it
    /// exceeds the export's maximum block size; a longer one closes the connection, so a
    /// client cannot make the server buffer an unbounded payload.
    pub max_drain: u32,
    /// TLS (`NBD_OPT_STARTTLS`): None answers STARTTLS with `NBD_REP_ERR_UNSUP`.
    pub tls: Option<TlsConfig>,
    /// How long the whole handshake (greeting, options, TLS) may take before the connection
    /// is dropped, so idle, trickling or deaf clients cannot hold connection slots.
    pub handshake_deadline: Option<Duration>,
    /// Options a client may send before transmission; the connection is dropped after more.
    pub max_options: u32,
    /// How long sending one reply may take: a client that does not read its replies is
    /// disconnected after this and its buffers freed.
    pub write_timeout: Option<Duration>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            workers: 32,
            workers_per_connection: 16,
            max_connections: 1024,
            max_inflight_bytes: 256 << 20,
            max_inflight_bytes_per_connection: 64 << 20,
            max_drain: 32 << 20,
            tls: None,
            handshake_deadline: Some(Duration::from_secs(10)),
            max_options: 64,
            write_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Longest option payload the server reads (export name, info requests). Longer options get
/// `NBD_REP_ERR_TOO_BIG` after being discarded, up to [`OPTION_DRAIN_LIMIT`].
const OPTION_MAX: u32 = 16 << 10;
const OPTION_DRAIN_LIMIT: u32 = 1 << 20;
/// Reply buffers larger than this are not kept for reuse.
const KEEP_BUFFER: usize = 4 << 20;
/// Bytes of spare reply buffers kept for reuse over the whole server.
const SPARE_BYTES: usize = 64 << 20;
/// A connection with nothing in flight may run one request this large even when the server's
/// budget is used up (so the budget can be exceeded by at most this per connection).
pub const SMALL_REQUEST: u64 = 256 << 10;
/// A dropped peer is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// How often the accept loop checks the deadlines.
const REAP_EVERY: Duration = Duration::from_millis(100);
/// Stack of connection and writer threads (they parse and copy; the exports run on the pool).
const CONN_STACK: usize = 512 << 10;

struct Shared {
    /// The exports, in order (the first is the default one); [`ExportsHandle`] adds and
    /// removes exports while the server runs.
    exports: RwLock<Vec<(String, Arc<dyn Export>)>>,
    /// Exports removed while the server ran, with why: a client asking for one is told.
    removed: RwLock<HashMap<String, String>>,
    opts: ServerOptions,
    stopping: AtomicBool,
    /// Self-pipe: the shutdown handle writes one byte, every accept loop polls the read end.
    wake_r: RawFd,
    wake_w: RawFd,
    conns: Mutex<HashMap<u64, Arc<Watch>>>,
    next_conn: AtomicU64,
    epoch: Instant,
    pool: OnceLock<Arc<Pool>>,
    budget: Arc<Budget>,
    /// When each peer was last logged as dropped, and how many were not logged since.
    peer_log: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(p) = self.pool.get() {
            p.close();
        }
        // SAFETY: both fds were created by pipe2 in Server::new and are closed only here.
        unsafe {
            libc::close(self.wake_r);
            libc::close(self.wake_w);
        }
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn pool(&self) -> &Arc<Pool> {
        self.pool
            .get_or_init(|| Pool::start(self.opts.workers, self.budget.clone()))
    }

    /// Logs that a peer was dropped, at most once per [`LOG_EVERY`] per peer.
    fn warn_peer(&self, peer: &str, msg: &str) {
        let mut log = self.peer_log.lock().unwrap();
        let now = Instant::now();
        if log.len() > 4096 {
            log.retain(|_, (t, _)| now.duration_since(*t) < LOG_EVERY);
        }
        match log.get_mut(peer) {
            Some((t, n)) if now.duration_since(*t) < LOG_EVERY => *n += 1,
            e => {
                let missed = e.map_or(0, |(_, n)| *n);
                warn!("dropping NBD connection from {peer}: {msg} ({missed} more from this peer not logged)");
                log.insert(peer.to_string(), (now, 0));
            }
        }
    }
}

/// What the accept loop watches of a connection: its handshake deadline and the reply being
/// sent, and the socket to shut down when either is overdue.
struct Watch {
    fd: RawFd,
    peer: String,
    /// Milliseconds since the server's epoch by which the handshake must be over; 0: none.
    handshake_by: AtomicU64,
    /// When the writer began sending the current reply; 0: not sending.
    writing_since: AtomicU64,
    /// Already shut down by the deadlines.
    reaped: AtomicBool,
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
        for w in conns.values() {
            // SAFETY: a connection removes its fd from the map (under this lock) before
            // closing it, so fd is still that connection's open socket.
            unsafe {
                libc::shutdown(w.fd, libc::SHUT_RD);
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
    /// The socket, when bytes written to it go straight to the client (not through TLS).
    fn plain_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}
impl Stream for std::os::unix::net::UnixStream {}
impl Stream for std::net::TcpStream {}
impl Stream for TlsStream {
    fn plain_fd(&self) -> Option<RawFd> {
        None
    }
}

/// The peer of a unix socket, for logs: its uid (from SO_PEERCRED).
fn unix_peer(fd: RawFd) -> String {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for getsockopt(SO_PEERCRED).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        format!("unix socket uid {}", cred.uid)
    } else {
        "unix socket".into()
    }
}

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
        let opts = ServerOptions::default();
        Server {
            shared: Arc::new(Shared {
                exports: RwLock::new(exports),
                removed: RwLock::new(HashMap::new()),
                budget: Arc::new(Budget::new(&opts)),
                opts,
                stopping: AtomicBool::new(false),
                wake_r: fds[0],
                wake_w: fds[1],
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                epoch: Instant::now(),
                pool: OnceLock::new(),
                peer_log: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn with_options(self, opts: ServerOptions) -> Server {
        let mut shared = match Arc::try_unwrap(self.shared) {
            Ok(s) => s,
            Err(_) => panic!("with_options must be called before shutdown_handle"),
        };
        shared.opts = ServerOptions {
            workers: opts.workers.max(1),
            workers_per_connection: opts.workers_per_connection.max(1),
            max_connections: opts.max_connections.max(1),
            max_inflight_bytes: opts.max_inflight_bytes.max(1),
            max_inflight_bytes_per_connection: opts.max_inflight_bytes_per_connection.max(1),
            max_options: opts.max_options.max(1),
            ..opts
        };
        shared.budget = Arc::new(Budget::new(&shared.opts));
        Server {
            shared: Arc::new(shared),
        }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
        }
    }

    /// A handle that adds and removes exports while the server runs (a volume added or
    /// removed live): `nbdinfo --list` and new connections see the change at once.
    pub fn exports_handle(&self) -> ExportsHandle {
        ExportsHandle {
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
        // The workers exist before the socket does: a client that can connect finds the
        // server's threads all started (and the thread count steady).
        self.shared.pool();
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
            let peer = unix_peer(s.as_raw_fd());
            Ok((s, peer))
        });
        let _ = std::fs::remove_file(path);
        r
    }

    /// Serves one already connected stream on the calling thread until the client leaves
    /// (for tests and fuzzing: a socketpair end). The deadlines are enforced only by
    /// `serve_*` loops' watchers; here the handshake deadline is a read timeout.
    pub fn serve_stream(&self, stream: std::os::unix::net::UnixStream) -> io::Result<()> {
        let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(Watch {
            fd: stream.as_raw_fd(),
            peer: "stream".into(),
            handshake_by: AtomicU64::new(0),
            writing_since: AtomicU64::new(0),
            reaped: AtomicBool::new(false),
        });
        self.shared.conns.lock().unwrap().insert(id, watch.clone());
        let r = serve_connection(&self.shared, &stream, &watch);
        self.shared.conns.lock().unwrap().remove(&id);
        r
    }

    /// Listens on a TCP address until shutdown.
    pub fn serve_tcp(&self, addr: SocketAddr) -> io::Result<()> {
        self.shared.pool();
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        info!(addr = %listener.local_addr()?, "NBD server listening");
        self.accept_loop(listener.as_raw_fd(), || {
            let (s, a) = listener.accept()?;
            s.set_nonblocking(false)?;
            s.set_nodelay(true)?;
            Ok((s, a.ip().to_string()))
        })
    }

    /// Shuts down connections whose handshake or reply is overdue.
    fn reap(&self) {
        let s = &self.shared;
        let now = s.now_ms();
        let write_ms = s.opts.write_timeout.map(|d| d.as_millis() as u64);
        let conns = s.conns.lock().unwrap();
        for w in conns.values() {
            if w.reaped.load(Ordering::Relaxed) {
                continue;
            }
            let by = w.handshake_by.load(Ordering::SeqCst);
            let since = w.writing_since.load(Ordering::SeqCst);
            let why = if by != 0 && now > by {
                "handshake not done within the handshake deadline"
            } else if write_ms.is_some_and(|t| since != 0 && now > since + t) {
                "a reply was not taken within the write timeout"
            } else {
                continue;
            };
            w.reaped.store(true, Ordering::Relaxed);
            s.warn_peer(&w.peer, why);
            // SAFETY: the fd stays open while the connection is in the map (see shutdown).
            unsafe {
                libc::shutdown(w.fd, libc::SHUT_RDWR);
            }
        }
    }

    fn accept_loop<S: Stream>(
        &self,
        listen_fd: RawFd,
        mut accept: impl FnMut() -> io::Result<(S, String)>,
    ) -> io::Result<()>
    where
        for<'a> &'a S: Read + Write,
    {
        let shared = &self.shared;
        shared.pool();
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut last_reap = Instant::now();
        while !shared.stopping.load(Ordering::SeqCst) {
            if last_reap.elapsed() >= REAP_EVERY {
                self.reap();
                last_reap = Instant::now();
            }
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
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, REAP_EVERY.as_millis() as i32) };
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
            if fds[0].revents == 0 {
                continue;
            }
            let (stream, peer) = match accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of fds and the like: the server keeps going.
                    warn!("accept failed: {e}");
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            threads.retain(|t| !t.is_finished());
            if threads.len() >= shared.opts.max_connections {
                shared.warn_peer(
                    &peer,
                    &format!("{} connections already open", threads.len()),
                );
                continue;
            }
            let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
            let by = shared
                .opts
                .handshake_deadline
                .map_or(0, |d| shared.now_ms() + d.as_millis() as u64);
            let watch = Arc::new(Watch {
                fd: stream.as_raw_fd(),
                peer,
                handshake_by: AtomicU64::new(by),
                writing_since: AtomicU64::new(0),
                reaped: AtomicBool::new(false),
            });
            shared.conns.lock().unwrap().insert(id, watch.clone());
            // A shutdown between the loop check and the insert would miss this connection.
            if shared.stopping.load(Ordering::SeqCst) {
                shared.conns.lock().unwrap().remove(&id);
                break;
            }
            let sh = shared.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .stack_size(CONN_STACK)
                .spawn(move || {
                    debug!(conn = id, peer = %watch.peer, "connection opened");
                    match serve_connection(&sh, &stream, &watch) {
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
        // Connections finish their requests in flight; a client that does not take its
        // replies is still cut off at the write timeout.
        loop {
            threads.retain(|t| !t.is_finished());
            if threads.is_empty() {
                break;
            }
            self.reap();
            thread::sleep(REAP_EVERY);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Shared worker pool and the in-flight budget

type Job = Box<dyn FnOnce() + Send>;

/// The pool's queue. Submitters wake at most one *searching* worker at a time; a searcher
/// that takes a job while more are queued wakes the next one. A burst of short requests is
/// then run by as few threads as keep up with it (on 2 cores, waking one sleeper per job
/// cost a quarter of the small-request rate in context switches), while requests that
/// block still spread over as many workers as they need, one wake-up after another.
#[derive(Default)]
struct PoolQueue {
    jobs: VecDeque<Job>,
    closed: bool,
    /// Workers waiting on the condvar.
    idle: usize,
    /// Wake-ups sent and not yet claimed by a waiting worker.
    tokens: usize,
    /// Workers woken to look for a job that have not taken one yet (tokens included).
    searching: usize,
}

impl PoolQueue {
    /// Wakes one sleeping worker when nobody is searching already; false when none was woken.
    fn wake_searcher(&mut self, cv: &Condvar) -> bool {
        debug_assert!(self.tokens <= self.searching && self.tokens <= self.idle);
        if self.searching > 0 || self.idle == self.tokens {
            return false;
        }
        self.tokens += 1;
        self.searching += 1;
        cv.notify_one();
        true
    }
}

/// Worker threads shared by all connections, fed through one FIFO queue.
struct Pool {
    q: Mutex<PoolQueue>,
    cv: Condvar,
    /// Spare reply buffers (at most [`SPARE_BYTES`] in all).
    spares: Mutex<(Vec<Vec<u8>>, usize)>,
    _budget: Arc<Budget>,
}

impl Pool {
    fn start(n: usize, budget: Arc<Budget>) -> Arc<Pool> {
        let p = Arc::new(Pool {
            q: Mutex::new(PoolQueue::default()),
            cv: Condvar::new(),
            spares: Mutex::new((Vec::new(), 0)),
            _budget: budget,
        });
        for i in 0..n {
            let p = p.clone();
            let r = thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(move || p.work());
            if let Err(e) = r {
                // Fewer workers only means less parallelism; at least one must exist.
                assert!(i > 0, "cannot start any NBD worker thread: {e}");
                warn!("NBD server runs with {i} workers instead of {n}: {e}");
                break;
            }
        }
        p
    }

    fn work(&self) {
        // Whether this worker was woken to search (and counts in `searching`).
        let mut searching = false;
        loop {
            let mut q = self.q.lock().unwrap();
            let job = loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if searching {
                    q.searching -= 1;
                    searching = false;
                }
                if q.closed {
                    return;
                }
                q.idle += 1;
                loop {
                    q = self.cv.wait(q).unwrap();
                    if q.tokens > 0 {
                        q.tokens -= 1;
                        searching = true;
                        break;
                    }
                    if q.closed {
                        break;
                    }
                    // A spurious wake-up: no token, keep sleeping.
                }
                q.idle -= 1;
            };
            if searching {
                q.searching -= 1;
                searching = false;
            }
            // More work queued: hand the search on before running this job.
            if !q.jobs.is_empty() {
                q.wake_searcher(&self.cv);
            }
            drop(q);
            job();
        }
    }

    fn submit(&self, job: Job) {
        let mut q = self.q.lock().unwrap();
        q.jobs.push_back(job);
        q.wake_searcher(&self.cv);
    }

    /// Workers finish the queued jobs, then exit.
    fn close(&self) {
        self.q.lock().unwrap().closed = true;
        self.cv.notify_all();
    }

    fn take_buffer(&self) -> Vec<u8> {
        let mut s = self.spares.lock().unwrap();
        match s.0.pop() {
            Some(b) => {
                s.1 -= b.capacity();
                b
            }
            None => Vec::new(),
        }
    }

    fn give_buffer(&self, mut b: Vec<u8>) {
        let cap = b.capacity();
        if cap == 0 || cap > KEEP_BUFFER {
            return;
        }
        let mut s = self.spares.lock().unwrap();
        if s.1 + cap <= SPARE_BYTES {
            b.clear();
            s.1 += cap;
            s.0.push(b);
        }
    }
}

/// Bytes and requests in flight, over the server and per connection (both under one lock,
/// so a request is admitted against both at once).
struct Budget {
    /// Bytes in flight over the server, and threads waiting on `cv`.
    total: Mutex<(u64, usize)>,
    cv: Condvar,
    cap: u64,
    per_conn_cap: u64,
    per_conn_reqs: usize,
}

/// A connection's share of the budget.
#[derive(Default)]
struct InFlight {
    reqs: AtomicUsize,
    bytes: AtomicU64,
}

impl Budget {
    fn new(o: &ServerOptions) -> Budget {
        Budget {
            total: Mutex::new((0, 0)),
            cv: Condvar::new(),
            cap: o.max_inflight_bytes,
            per_conn_cap: o.max_inflight_bytes_per_connection,
            per_conn_reqs: o.workers_per_connection,
        }
    }

    /// Waits until `cost` bytes fit for this connection and the server; false when `stop`
    /// says the connection is closing first.
    fn acquire(&self, c: &InFlight, cost: u64, stop: &dyn Fn() -> bool) -> bool {
        let mut g = self.total.lock().unwrap();
        loop {
            let reqs = c.reqs.load(Ordering::Relaxed);
            let bytes = c.bytes.load(Ordering::Relaxed);
            let conn_ok =
                reqs < self.per_conn_reqs && (bytes == 0 || bytes + cost <= self.per_conn_cap);
            let total_ok =
                g.0 + cost <= self.cap || g.0 == 0 || (bytes == 0 && cost <= SMALL_REQUEST);
            if conn_ok && total_ok {
                g.0 += cost;
                c.reqs.store(reqs + 1, Ordering::Relaxed);
                c.bytes.store(bytes + cost, Ordering::Relaxed);
                return true;
            }
            if stop() {
                return false;
            }
            g.1 += 1;
            g = self.cv.wait_timeout(g, REAP_EVERY).unwrap().0;
            g.1 -= 1;
        }
    }

    fn release(&self, c: &InFlight, cost: u64) {
        let mut g = self.total.lock().unwrap();
        debug_assert!(g.0 >= cost && c.bytes.load(Ordering::Relaxed) >= cost);
        g.0 -= cost;
        c.reqs.fetch_sub(1, Ordering::Relaxed);
        c.bytes.fetch_sub(cost, Ordering::Relaxed);
        let waiters = g.1;
        drop(g);
        if waiters > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until the connection has nothing in flight.
    fn drain(&self, c: &InFlight) {
        let mut g = self.total.lock().unwrap();
        while c.reqs.load(Ordering::Relaxed) > 0 {
            g.1 += 1;
            g = self.cv.wait_timeout(g, REAP_EVERY).unwrap().0;
            g.1 -= 1;
        }
    }
}

fn serve_connection<S: Stream>(shared: &Shared, stream: &S, watch: &Watch) -> io::Result<()>
where
    for<'a> &'a S: Read + Write,
{
    set_read_timeout(stream.as_raw_fd(), shared.opts.handshake_deadline);
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let Some(no_zeroes) = hello(&mut reader, stream)? else {
        return Ok(());
    };
    let mut count = 0;
    match options(
        shared,
        &mut reader,
        stream,
        no_zeroes,
        false,
        watch,
        &mut count,
    )? {
        Haggled::Done => Ok(()),
        Haggled::Go(export, structured) => {
            set_read_timeout(stream.as_raw_fd(), None);
            watch.handshake_by.store(0, Ordering::SeqCst);
            transmit(shared, reader, stream, export, structured, watch)
        }
        Haggled::StartTls(tls) => {
            if !reader.buffer().is_empty() {
                return Err(protocol_error(
                    "client sent data after STARTTLS before the TLS handshake",
                ));
            }
            let tls = tls.accept(stream.as_raw_fd())?;
            tls.set_read_timeout(shared.opts.handshake_deadline);
            debug!("TLS session established");
            let mut reader = BufReader::with_capacity(64 << 10, &tls);
            let r = match options::<TlsStream>(
                shared,
                &mut reader,
                &tls,
                no_zeroes,
                true,
                watch,
                &mut count,
            )? {
                Haggled::Go(export, structured) => {
                    tls.set_read_timeout(None);
                    watch.handshake_by.store(0, Ordering::SeqCst);
                    transmit::<TlsStream>(shared, reader, &tls, export, structured, watch)
                }
                _ => Ok(()),
            };
            tls.close();
            r
        }
    }
}

/// Sets (or clears) SO_RCVTIMEO on a socket.
fn set_read_timeout(fd: RawFd, t: Option<Duration>) {
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

fn find_export(shared: &Shared, name: &[u8]) -> Option<(String, Arc<dyn Export>)> {
    let exports = shared.exports.read().unwrap();
    if name.is_empty() {
        return exports.first().cloned();
    }
    exports.iter().find(|(n, _)| n.as_bytes() == name).cloned()
}

/// Why there is no export `name`: removed while the server ran (and why), or never served.
fn unknown_export(shared: &Shared, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    match shared.removed.read().unwrap().get(name.as_ref()) {
        Some(why) => format!("export {name:?} was removed: {why}"),
        None => format!("no export named {name:?}"),
    }
}

/// Adds and removes exports of a running [`Server`] ([`Server::exports_handle`]).
#[derive(Clone)]
pub struct ExportsHandle {
    shared: Arc<Shared>,
}

impl ExportsHandle {
    /// Adds export `name` (refused when one of that name is served).
    pub fn add(&self, name: &str, export: Arc<dyn Export>) -> Result<(), String> {
        let mut exports = self.shared.exports.write().unwrap();
        if exports.iter().any(|(n, _)| n == name) {
            return Err(format!("an export named {name:?} is already served"));
        }
        exports.push((name.to_string(), export));
        self.shared.removed.write().unwrap().remove(name);
        Ok(())
    }

    /// Removes export `name`: new connections asking for it are refused with `why`.
    /// Connections already in transmission keep their export object (its requests fail
    /// as the export decides). Returns whether it was served.
    pub fn remove(&self, name: &str, why: &str) -> bool {
        let mut exports = self.shared.exports.write().unwrap();
        let before = exports.len();
        exports.retain(|(n, _)| n != name);
        let removed = exports.len() != before;
        if removed {
            self.shared
                .removed
                .write()
                .unwrap()
                .insert(name.to_string(), why.to_string());
        }
        removed
    }

    /// The names of the exports served, in order.
    pub fn names(&self) -> Vec<String> {
        let exports = self.shared.exports.read().unwrap();
        exports.iter().map(|(n, _)| n.clone()).collect()
    }
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

/// Runs option haggling (again after STARTTLS, with `tls_up`); `count` counts the options
/// over both rounds.
fn options<S: Stream>(
    shared: &Shared,
    r: &mut BufReader<&S>,
    stream: &S,
    no_zeroes: bool,
    tls_up: bool,
    watch: &Watch,
    count: &mut u32,
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
        *count += 1;
        if *count > shared.opts.max_options {
            let msg = format!("more than {} options", shared.opts.max_options);
            shared.warn_peer(&watch.peer, &msg);
            return Ok(Haggled::Done);
        }
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
                    warn!("{}; closing", unknown_export(shared, &data));
                    return Ok(Haggled::Done);
                };
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&export.size().to_be_bytes());
                b.extend_from_slice(&transmission_flags(&*export, structured).to_be_bytes());
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
                let names: Vec<String> = {
                    let exports = shared.exports.read().unwrap();
                    exports.iter().map(|(n, _)| n.clone()).collect()
                };
                for name in &names {
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
                    let msg = unknown_export(shared, name);
                    send_opt_error(&mut w, opt, REP_ERR_UNKNOWN, &msg)?;
                    continue;
                };
                let flags = transmission_flags(&*export, structured);
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

#[derive(Clone, Copy)]
struct Req {
    flags: u16,
    typ: u16,
    handle: u64,
    offset: u64,
    len: u32,
}

/// What the reader found.
enum Next {
    /// Run the request (no payload).
    Run(Req),
    /// A WRITE whose payload (within the maximum block size) follows.
    Write(Req),
    /// Answer with this error without running (payload, if any, was discarded).
    Fail(Req, u32, &'static str),
    /// Stop this connection.
    Close,
}

/// Bytes reserved before the data in a reply buffer: enough for a structured OFFSET_DATA
/// header (20 + 8) or a simple reply (16).
const DATA_AT: usize = STRUCTURED_HEADER_LEN + 8;
/// What a request costs in the budget besides its data (headers, an error message).
const REQUEST_OVERHEAD: u64 = 128;

/// A connection in transmission: what its reader, the pool's workers and its writer share.
struct Conn {
    export: Arc<dyn Export>,
    size: u64,
    max_block: u32,
    structured: bool,
    read_only: bool,
    can_trim: bool,
    max_drain: u32,
    inflight: InFlight,
    budget: Arc<Budget>,
    pool: Arc<Pool>,
    out: Mutex<Out>,
    out_cv: Condvar,
    closing: AtomicBool,
    /// Plain sockets: a worker whose reply finds the socket idle sends it itself, without
    /// blocking (MSG_DONTWAIT), and leaves only what did not fit to the writer thread.
    plain_fd: Option<RawFd>,
}

/// Replies waiting for the writer.
#[derive(Default)]
struct Out {
    q: VecDeque<Reply>,
    /// The reader is done and nothing is in flight: the writer ends when the queue is empty.
    done: bool,
    /// The writer failed: replies are dropped as they complete.
    dead: bool,
    /// A reply is being sent (by the writer or a worker): nobody else may write.
    writing: bool,
    /// The writer thread waits for a reply (so completions wake it only then).
    waiting: bool,
}

struct Reply {
    buf: Vec<u8>,
    /// The reply is `buf[start..]`.
    start: usize,
    cost: u64,
}

impl Conn {
    /// A finished reply goes to the writer, or is dropped (its budget given back) when the
    /// writer is gone.
    fn complete(&self, mut r: Reply) {
        let mut o = self.out.lock().unwrap();
        if o.dead {
            drop(o);
            self.discard(r);
            return;
        }
        if let Some(fd) = self.plain_fd.filter(|_| !o.writing && o.q.is_empty()) {
            o.writing = true;
            drop(o);
            let bytes = &r.buf[r.start..];
            // SAFETY: fd stays open while this request is in flight (the connection waits
            // for its budget to drain before closing); bytes is a valid buffer.
            let n = unsafe {
                libc::send(
                    fd,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            let all = n >= 0 && n as usize == bytes.len();
            if n > 0 {
                r.start += n as usize;
            }
            o = self.out.lock().unwrap();
            o.writing = false;
            // The writer may have failed while this send was under way: then nobody takes
            // the rest, and a reply left in the queue would hold its budget for good.
            if all || o.dead {
                let wake = o.waiting;
                drop(o);
                if wake {
                    self.out_cv.notify_one();
                }
                self.discard(r);
                return;
            }
            // The rest (or an error, which the writer meets again) goes to the writer, first.
            o.q.push_front(r);
        } else {
            o.q.push_back(r);
        }
        let wake = o.waiting;
        drop(o);
        if wake {
            self.out_cv.notify_one();
        }
    }

    fn discard(&self, r: Reply) {
        self.budget.release(&self.inflight, r.cost);
        self.pool.give_buffer(r.buf);
    }

    /// Stops the connection's reader: no further requests are read.
    fn close_reading(&self, fd: RawFd) {
        if !self.closing.swap(true, Ordering::SeqCst) {
            // SAFETY: the stream is open for the connection's whole lifetime.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RD);
            }
        }
    }
}

fn transmit<S: Stream>(
    shared: &Shared,
    mut reader: BufReader<&S>,
    stream: &S,
    export: Arc<dyn Export>,
    structured: bool,
    watch: &Watch,
) -> io::Result<()>
where
    for<'a> &'a S: Read + Write,
{
    let bs = export.block_sizes();
    let c = Arc::new(Conn {
        size: export.size(),
        max_block: bs.maximum,
        structured,
        read_only: export.read_only(),
        can_trim: export.can_trim(),
        export,
        max_drain: shared.opts.max_drain,
        inflight: InFlight::default(),
        budget: shared.budget.clone(),
        pool: shared.pool().clone(),
        out: Mutex::new(Out::default()),
        out_cv: Condvar::new(),
        closing: AtomicBool::new(false),
        plain_fd: stream.plain_fd(),
    });
    thread::scope(|s| {
        let writer = thread::Builder::new()
            .name("nbd-writer".into())
            .stack_size(CONN_STACK)
            .spawn_scoped(s, || write_replies(shared, &c, stream, watch));
        if let Err(e) = writer {
            warn!(peer = %watch.peer, "cannot start a reply writer thread: {e}; closing the connection");
            return;
        }
        read_requests(&c, &mut reader);
        c.close_reading(stream.as_raw_fd());
        // Requests in flight finish and are answered (or dropped if the writer failed).
        c.budget.drain(&c.inflight);
        c.out.lock().unwrap().done = true;
        c.out_cv.notify_all();
    });
    debug_assert_eq!(c.inflight.reqs.load(Ordering::SeqCst), 0);
    Ok(())
}

/// The connection's reader: admits each request against the budget, reads its payload and
/// hands it to the pool, until the client leaves or the connection closes.
fn read_requests<S: Stream>(c: &Arc<Conn>, r: &mut BufReader<&S>)
where
    for<'a> &'a S: Read + Write,
{
    loop {
        if c.closing.load(Ordering::SeqCst) {
            return;
        }
        let (req, mut fail, payload) = match read_request(c, r) {
            Next::Close => return,
            Next::Fail(req, e, m) => (req, Some((e, m)), false),
            Next::Run(req) => (req, None, false),
            Next::Write(req) => (req, None, true),
        };
        let data = match req.typ {
            CMD_READ if fail.is_none() => req.len as u64,
            CMD_WRITE if payload => req.len as u64,
            _ => 0,
        };
        let cost = REQUEST_OVERHEAD + data;
        if !c
            .budget
            .acquire(&c.inflight, cost, &|| c.closing.load(Ordering::SeqCst))
        {
            return;
        }
        let mut buf = c.pool.take_buffer();
        if payload {
            buf.resize(DATA_AT + req.len as usize, 0);
            if r.read_exact(&mut buf[DATA_AT..]).is_err() {
                debug!("connection closed in the middle of a WRITE payload");
                c.discard(Reply {
                    buf,
                    start: 0,
                    cost,
                });
                return;
            }
            fail = check_write(c, &req);
        }
        let c2 = c.clone();
        c.pool.submit(Box::new(move || {
            let start = match fail {
                Some((e, m)) => fail_reply(&c2, &req, e, m, &mut buf),
                None => run(&c2, &req, &mut buf),
            };
            c2.complete(Reply { buf, start, cost });
        }));
    }
}

/// The connection's writer: sends replies in completion order (those a worker could not send
/// at once, see [`Conn::complete`]); the accept loop's watcher shuts the socket down when one
/// takes longer than the write timeout.
fn write_replies<S: Stream>(shared: &Shared, c: &Conn, stream: &S, watch: &Watch)
where
    for<'a> &'a S: Read + Write,
{
    let mut w = stream;
    loop {
        let r = {
            let mut o = c.out.lock().unwrap();
            loop {
                if !o.writing {
                    if let Some(r) = o.q.pop_front() {
                        o.writing = true;
                        break r;
                    }
                    if o.done {
                        return;
                    }
                }
                o.waiting = true;
                o = c.out_cv.wait(o).unwrap();
                o.waiting = false;
            }
        };
        watch.writing_since.store(shared.now_ms(), Ordering::SeqCst);
        let sent = w.write_all(&r.buf[r.start..]);
        watch.writing_since.store(0, Ordering::SeqCst);
        // `writing` clears and `dead` sets under one lock: a worker that sees `writing` clear
        // and sends itself sees `dead` when it relocks (see `Conn::complete`).
        let rest = {
            let mut o = c.out.lock().unwrap();
            o.writing = false;
            o.dead = sent.is_err();
            if o.dead {
                std::mem::take(&mut o.q)
            } else {
                VecDeque::new()
            }
        };
        c.discard(r);
        if let Err(e) = sent {
            debug!(peer = %watch.peer, "sending reply: {e}");
            for r in rest {
                c.discard(r);
            }
            c.close_reading(stream.as_raw_fd());
            return;
        }
    }
}

/// Whether the request lies within the export, and whether it carries flags it may not.
fn range_and_flags(c: &Conn, req: &Req) -> (bool, bool) {
    let end = req.offset.checked_add(req.len as u64);
    let in_range = end.is_some_and(|e| e <= c.size);
    let allowed_flags = match req.typ {
        CMD_READ if c.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => CMD_FLAG_FUA,
    };
    (in_range, req.flags & !allowed_flags != 0)
}

/// Checks a WRITE whose payload has been read.
fn check_write(c: &Conn, req: &Req) -> Option<(u32, &'static str)> {
    let (in_range, bad_flags) = range_and_flags(c, req);
    if bad_flags {
        Some((EINVAL, "unknown or inapplicable command flags"))
    } else if c.read_only {
        Some((EPERM, "export is read-only"))
    } else if !in_range {
        Some((ENOSPC, "write beyond the end of the export"))
    } else if req.len == 0 {
        Some((EINVAL, "zero-length write"))
    } else {
        None
    }
}

fn read_request<S: Stream>(c: &Conn, r: &mut BufReader<&S>) -> Next
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
    let (in_range, bad_flags) = range_and_flags(c, &req);
    match req.typ {
        CMD_WRITE => {
            let len = req.len as usize;
            if req.len > c.max_block {
                if req.len > c.max_drain {
                    warn!(
                        handle = req.handle,
                        "WRITE of {} bytes exceeds the {} byte limit; closing connection",
                        req.len,
                        c.max_drain
                    );
                    return Next::Close;
                }
                if io::copy(&mut r.take(len as u64), &mut io::sink()).ok() != Some(len as u64) {
                    return Next::Close;
                }
                return Next::Fail(req, EINVAL, "write longer than the maximum block size");
            }
            Next::Write(req)
        }
        _ if bad_flags => Next::Fail(req, EINVAL, "unknown or inapplicable command flags"),
        CMD_READ => {
            if req.len > c.max_block {
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
            if !c.can_trim {
                Next::Fail(req, EINVAL, "trim is not supported by this export")
            } else if c.read_only {
                Next::Fail(req, EPERM, "export is read-only")
            } else if !in_range {
                Next::Fail(req, EINVAL, "trim beyond the end of the export")
            } else {
                Next::Run(req)
            }
        }
        CMD_WRITE_ZEROES => {
            if c.read_only {
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

/// Executes one request (on a pool worker) and builds its reply in `buf` (a WRITE's payload
/// sits at `buf[DATA_AT..]`). Returns where the reply starts in `buf`.
fn run(c: &Conn, req: &Req, buf: &mut Vec<u8>) -> usize {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let e = &*c.export;
    let result = match req.typ {
        CMD_READ => {
            let len = req.len as usize;
            buf.resize(DATA_AT + len, 0);
            match e.read(req.offset, &mut buf[DATA_AT..]) {
                Ok(()) => return read_data_reply(c, req, buf),
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
        Ok(()) => simple_reply(req.handle, 0, buf),
        Err(err) => {
            let code = errno_of(&err);
            warn!(
                "{} at offset {} length {} failed: {err} (replying {})",
                cmd_name(req.typ),
                req.offset,
                req.len,
                errno_name(code)
            );
            if req.typ == CMD_READ && c.structured {
                structured_error_reply(req, code, &err.to_string(), Some(req.offset), buf)
            } else {
                simple_reply(req.handle, code, buf)
            }
        }
    }
}

/// Builds the error reply of a request refused without running.
fn fail_reply(c: &Conn, req: &Req, code: u32, msg: &str, buf: &mut Vec<u8>) -> usize {
    debug!(
        handle = req.handle,
        "{} offset {} length {} refused: {msg} ({})",
        cmd_name(req.typ),
        req.offset,
        req.len,
        errno_name(code)
    );
    if req.typ == CMD_READ && c.structured {
        structured_error_reply(req, code, msg, None, buf)
    } else {
        simple_reply(req.handle, code, buf)
    }
}

fn simple_reply(handle: u64, err: u32, buf: &mut Vec<u8>) -> usize {
    buf.clear();
    buf.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    buf.extend_from_slice(&err.to_be_bytes());
    buf.extend_from_slice(&handle.to_be_bytes());
    0
}

/// Read data sits at `buf[DATA_AT..]`; its header is written in place before it.
fn read_data_reply(c: &Conn, req: &Req, buf: &mut [u8]) -> usize {
    if c.structured {
        let h = &mut buf[..DATA_AT];
        h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        h[6..8].copy_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        h[8..16].copy_from_slice(&req.handle.to_be_bytes());
        h[16..20].copy_from_slice(&(req.len + 8).to_be_bytes());
        h[20..28].copy_from_slice(&req.offset.to_be_bytes());
        0
    } else {
        let at = DATA_AT - SIMPLE_REPLY_LEN;
        let h = &mut buf[at..DATA_AT];
        h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        h[4..8].copy_from_slice(&0u32.to_be_bytes());
        h[8..16].copy_from_slice(&req.handle.to_be_bytes());
        at
    }
}

fn structured_error_reply(
    req: &Req,
    code: u32,
    msg: &str,
    offset: Option<u64>,
    buf: &mut Vec<u8>,
) -> usize {
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
    0
}

#[cfg(test)]
mod pool_tests {
    use super::*;
    use std::sync::mpsc;

    fn pool(n: usize) -> Arc<Pool> {
        Pool::start(n, Arc::new(Budget::new(&ServerOptions::default())))
    }

    /// Jobs that block (a disk miss) still run side by side: one wake-up leads to the next.
    #[test]
    fn blocking_jobs_spread_over_the_workers() {
        let p = pool(16);
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        for _ in 0..16 {
            let tx = tx.clone();
            p.submit(Box::new(move || {
                thread::sleep(Duration::from_millis(200));
                tx.send(thread::current().id()).unwrap();
            }));
        }
        let ids: std::collections::HashSet<_> = (0..16).map(|_| rx.recv().unwrap()).collect();
        let took = t0.elapsed();
        assert_eq!(
            ids.len(),
            16,
            "16 blocking jobs ran on {} workers",
            ids.len()
        );
        assert!(
            took < Duration::from_millis(1000),
            "16 jobs of 200 ms on 16 workers took {took:?}"
        );
        p.close();
    }

    /// A burst of short jobs wakes few workers, every job runs, and the counts settle.
    #[test]
    fn short_jobs_all_run_and_the_pool_settles() {
        let p = pool(32);
        let (tx, rx) = mpsc::channel();
        for round in 0..200 {
            for i in 0..16 {
                let tx = tx.clone();
                p.submit(Box::new(move || tx.send(round * 16 + i).unwrap()));
            }
            if round % 10 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        let mut got: Vec<i32> = (0..3200).map(|_| rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert!(
            got.iter().copied().eq(0..3200),
            "a job was lost or run twice"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let q = p.q.lock().unwrap();
            if q.idle == 32 && q.searching == 0 && q.tokens == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pool did not settle: idle {} searching {} tokens {}",
                q.idle,
                q.searching,
                q.tokens
            );
            drop(q);
            thread::sleep(Duration::from_millis(10));
        }
        p.close();
    }
}
