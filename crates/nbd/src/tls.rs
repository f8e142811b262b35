//! TLS for NBD (`NBD_OPT_STARTTLS`), with pre-shared keys and with X.509 certificates, the two
//! ways libnbd's clients authenticate (`tls-psk-file=FILE`, `tls-certificates=DIR`).
//!
//! OpenSSL does the TLS (it has PSK for TLS 1.3 and the TLS 1.2 `PSK-*` suites, which rustls
//! does not). After the TLS handshake the socket is made non-blocking and every `SSL_read` /
//! `SSL_write` runs under one mutex, released while waiting in `poll`: so the transmission
//! phase keeps its one reading worker and one writing worker at a time, as on a plain socket.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslMode, SslOptions,
    SslStream, SslVersion,
};

/// Whether the server offers TLS, and whether it insists on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS offered; plaintext clients are served too.
    On,
    /// Every option other than STARTTLS and ABORT is refused with `NBD_REP_ERR_TLS_REQD`
    /// until TLS is up.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "no" => Ok(TlsMode::Off),
            "on" | "yes" | "allow" => Ok(TlsMode::On),
            "require" | "required" => Ok(TlsMode::Require),
            _ => Err(format!("TLS mode {s:?}: expected off, on or require")),
        }
    }
}

/// A server's TLS settings: build with [`TlsConfig::new`], hand to
/// [`ServerOptions::tls`](crate::ServerOptions).
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) require: bool,
    ctx: SslContext,
    what: String,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TlsConfig({}, require: {})", self.what, self.require)
    }
}

/// Reads a PSK file in the format of GnuTLS `psktool` (what libnbd and nbdkit read):
/// one `username:hexkey` per line. Errors name the file and line.
pub fn read_psk_file(path: &Path) -> io::Result<HashMap<String, Vec<u8>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let bad = |line: usize, msg: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}:{line}: {msg}", path.display()),
        )
    };
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hex)) = line.split_once(':') else {
            return Err(bad(i + 1, "expected username:hexkey".into()));
        };
        if user.is_empty() || user.len() > 128 {
            return Err(bad(i + 1, "username must be 1 to 128 bytes".into()));
        }
        let hex = hex.trim();
        if hex.len() % 2 != 0 || hex.is_empty() || hex.len() > 1024 {
            return Err(bad(
                i + 1,
                format!("key of user {user:?} must be an even number (2..1024) of hex digits"),
            ));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&hex[j..j + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad(i + 1, format!("key of user {user:?} is not hexadecimal")))?;
        keys.insert(user.to_string(), key);
    }
    if keys.is_empty() {
        return Err(bad(0, "no username:hexkey line".into()));
    }
    Ok(keys)
}

fn ssl_err(what: impl fmt::Display, e: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
}

impl TlsConfig {
    /// TLS with pre-shared keys from `psk_file` and/or the X.509 certificate and key in
    /// `cert_dir` (`server-cert.pem`, `server-key.pem`, as nbdkit and qemu-nbd read them;
    /// with a `ca-cert.pem` there, client certificates are asked for and, when sent,
    /// verified against it). `mode` must not be [`TlsMode::Off`].
    pub fn new(
        mode: TlsMode,
        psk_file: Option<&Path>,
        cert_dir: Option<&Path>,
    ) -> io::Result<TlsConfig> {
        Self::build(mode, psk_file, cert_dir, false)
    }

    /// Like [`TlsConfig::new`]; with `verify_peer` an X.509 client must present a certificate
    /// signed by `cert_dir/ca-cert.pem` (nbdkit's `--tls-verify-peer`). PSK clients
    /// authenticate with their key and present no certificate.
    pub fn build(
        mode: TlsMode,
        psk_file: Option<&Path>,
        cert_dir: Option<&Path>,
        verify_peer: bool,
    ) -> io::Result<TlsConfig> {
        if verify_peer && !cert_dir.is_some_and(|d| d.join("ca-cert.pem").exists()) {
            return Err(ssl_err(
                "TLS",
                "verifying client certificates needs a certificates directory with ca-cert.pem",
            ));
        }
        if mode == TlsMode::Off {
            return Err(ssl_err("TLS", "mode is off"));
        }
        if psk_file.is_none() && cert_dir.is_none() {
            return Err(ssl_err(
                "TLS",
                "needs a PSK file or a certificates directory (or both)",
            ));
        }
        let mut b =
            SslContextBuilder::new(SslMethod::tls_server()).map_err(|e| ssl_err("TLS", e))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| ssl_err("TLS", e))?;
        b.set_options(
            SslOptions::NO_RENEGOTIATION
                | SslOptions::NO_TICKET
                | SslOptions::CIPHER_SERVER_PREFERENCE,
        );
        b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF);
        b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER);
        b.set_num_tickets(0).map_err(|e| ssl_err("TLS", e))?;
        let mut what = Vec::new();
        if let Some(dir) = cert_dir {
            let f = |n: &str| -> PathBuf { dir.join(n) };
            let cert = f("server-cert.pem");
            let key = f("server-key.pem");
            b.set_certificate_chain_file(&cert)
                .map_err(|e| ssl_err(cert.display(), e))?;
            b.set_private_key_file(&key, SslFiletype::PEM)
                .map_err(|e| ssl_err(key.display(), e))?;
            b.check_private_key()
                .map_err(|e| ssl_err(format!("{} and {}", cert.display(), key.display()), e))?;
            let ca = f("ca-cert.pem");
            if ca.exists() {
                b.set_ca_file(&ca).map_err(|e| ssl_err(ca.display(), e))?;
                // Ask for a client certificate and verify it if one comes; insist on one
                // with `verify_peer`.
                let mut m = openssl::ssl::SslVerifyMode::PEER;
                if verify_peer {
                    m |= openssl::ssl::SslVerifyMode::FAIL_IF_NO_PEER_CERT;
                }
                b.set_verify(m);
            }
            what.push(format!(
                "x509 {}{}",
                dir.display(),
                if verify_peer {
                    ", client certificates required"
                } else {
                    ""
                }
            ));
        }
        if let Some(p) = psk_file {
            let keys = Arc::new(read_psk_file(p)?);
            let n = keys.len();
            b.set_psk_server_callback(move |_ssl, identity, out| {
                let Some(id) = identity.and_then(|i| std::str::from_utf8(i).ok()) else {
                    return Ok(0);
                };
                match keys.get(id) {
                    Some(k) if k.len() <= out.len() => {
                        out[..k.len()].copy_from_slice(k);
                        Ok(k.len())
                    }
                    _ => {
                        tracing::warn!("TLS-PSK: unknown username {id:?}");
                        Ok(0)
                    }
                }
            });
            what.push(format!("psk {} ({n} keys)", p.display()));
        }
        Ok(TlsConfig {
            require: mode == TlsMode::Require,
            ctx: b.build(),
            what: what.join(", "),
        })
    }

    /// Runs the TLS handshake on `fd` (a connected, blocking socket the caller keeps open
    /// for the lifetime of the result).
    pub(crate) fn accept(&self, fd: RawFd) -> io::Result<TlsStream> {
        let ssl = Ssl::new(&self.ctx).map_err(|e| ssl_err("TLS", e))?;
        let s = ssl.accept(Sock(fd)).map_err(|e| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("TLS handshake: {e}"),
            )
        })?;
        tracing::debug!(
            version = s.ssl().version_str(),
            cipher = s.ssl().current_cipher().map(|c| c.name()).unwrap_or("?"),
            psk_user = s
                .ssl()
                .psk_identity()
                .map(|i| String::from_utf8_lossy(i).into_owned()),
            "TLS handshake done"
        );
        Ok(TlsStream::wrap(s, fd, None))
    }
}

/// A client's TLS settings, from the query of an `nbds://` or `nbds+unix://` URI as libnbd
/// reads it: `tls-psk-file=FILE` (username from `USER@` in the URI or `tls-username=`; when
/// the file holds one key, its username), `tls-certificates=DIR` (ca-cert.pem, and
/// client-cert.pem + client-key.pem if present), `tls-verify-peer=false`.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub psk: Option<(String, Vec<u8>)>,
    pub cert_dir: Option<PathBuf>,
    pub verify_peer: bool,
}

fn query_get<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Splits an `nbds://` / `nbds+unix://` URI into the plain `nbd` URI and its TLS settings;
/// None for a URI without TLS.
pub(crate) fn split_tls_uri(uri: &str) -> Result<Option<(String, ClientTls)>, String> {
    let (scheme, rest) = if let Some(r) = uri.strip_prefix("nbds+unix://") {
        ("nbd+unix://", r)
    } else if let Some(r) = uri.strip_prefix("nbds://") {
        ("nbd://", r)
    } else {
        return Ok(None);
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (user, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, authority),
    };
    let query = tail.split_once('?').map(|x| x.1).unwrap_or("");
    let user = user.or_else(|| query_get(query, "tls-username").map(str::to_string));
    let mut tls = ClientTls {
        verify_peer: query_get(query, "tls-verify-peer") != Some("false"),
        cert_dir: query_get(query, "tls-certificates").map(PathBuf::from),
        psk: None,
    };
    if let Some(f) = query_get(query, "tls-psk-file") {
        let keys = read_psk_file(Path::new(f)).map_err(|e| e.to_string())?;
        let user = match user {
            Some(u) => u,
            None if keys.len() == 1 => keys.keys().next().unwrap().clone(),
            None => {
                return Err(format!(
                    "{f} holds several keys: name one with USER@ in the URI"
                ))
            }
        };
        let key = keys
            .get(&user)
            .ok_or_else(|| format!("{f} has no key for username {user:?}"))?
            .clone();
        tls.psk = Some((user, key));
    }
    if tls.psk.is_none() && tls.cert_dir.is_none() {
        return Err("an nbds URI needs tls-psk-file=FILE or tls-certificates=DIR".into());
    }
    Ok(Some((format!("{scheme}{host}{tail}"), tls)))
}

/// Runs the client side of the TLS handshake on `sock` (blocking, after STARTTLS was
/// acknowledged); `host` is checked against the server certificate when given.
pub(crate) fn client_connect(
    sock: std::os::fd::OwnedFd,
    tls: &ClientTls,
    host: Option<&str>,
) -> io::Result<TlsStream> {
    use openssl::ssl::{SslConnector, SslVerifyMode};
    let e = |x: openssl::error::ErrorStack| ssl_err("TLS", x);
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(e)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(e)?;
    b.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::IGNORE_UNEXPECTED_EOF);
    b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    if let Some(dir) = &tls.cert_dir {
        let ca = dir.join("ca-cert.pem");
        b.set_ca_file(&ca).map_err(|x| ssl_err(ca.display(), x))?;
        let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
        if cert.exists() && key.exists() {
            b.set_certificate_chain_file(&cert)
                .map_err(|x| ssl_err(cert.display(), x))?;
            b.set_private_key_file(&key, SslFiletype::PEM)
                .map_err(|x| ssl_err(key.display(), x))?;
        }
    }
    let verify = tls.verify_peer && tls.cert_dir.is_some();
    if !verify {
        b.set_verify(SslVerifyMode::NONE);
    }
    if let Some((user, key)) = tls.psk.clone() {
        // SslConnector's default list leaves out the TLS 1.2 PSK suites.
        b.set_cipher_list("DEFAULT:ECDHE-PSK:DHE-PSK:PSK")
            .map_err(e)?;
        b.set_psk_client_callback(move |_ssl, _hint, id, psk| {
            if user.len() + 1 > id.len() || key.len() > psk.len() {
                return Ok(0);
            }
            id[..user.len()].copy_from_slice(user.as_bytes());
            id[user.len()] = 0;
            psk[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
    }
    let conn = b.build();
    let mut cfg = conn.configure().map_err(e)?;
    let fd = sock.as_raw_fd();
    let s = match host {
        Some(h) if verify => cfg.connect(h, Sock(fd)),
        // Unix sockets have no host name to check (as in libnbd); the CA is still checked.
        _ => {
            cfg.set_verify_hostname(false);
            cfg.set_use_server_name_indication(false);
            cfg.connect("localhost", Sock(fd))
        }
    }
    .map_err(|x| {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("TLS handshake: {x}"),
        )
    })?;
    Ok(TlsStream::wrap(s, fd, Some(sock)))
}

/// A borrowed socket fd, read and written with recv/send (no SIGPIPE).
#[derive(Debug)]
pub(crate) struct Sock(RawFd);

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes; the fd is open (see TlsConfig::accept).
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: as above.
        let n = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TLS session on a non-blocking socket, usable from several threads (`&TlsStream` is
/// `Read + Write`); the session is locked only while OpenSSL runs, never while waiting.
pub(crate) struct TlsStream {
    ssl: Mutex<SslStream<Sock>>,
    fd: RawFd,
    /// The socket, when the stream owns it (client side).
    _owned: Option<std::os::fd::OwnedFd>,
    /// Longest wait for incoming data (the server's handshake timeout); None: no limit.
    read_timeout: Mutex<Option<std::time::Duration>>,
}

impl AsRawFd for TlsStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl TlsStream {
    /// After the handshake: the socket goes non-blocking.
    fn wrap(s: SslStream<Sock>, fd: RawFd, owned: Option<std::os::fd::OwnedFd>) -> TlsStream {
        // SAFETY: fd is an open socket (owned here, or by the caller for our lifetime).
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        TlsStream {
            ssl: Mutex::new(s),
            fd,
            _owned: owned,
            read_timeout: Mutex::new(None),
        }
    }

    pub(crate) fn set_read_timeout(&self, t: Option<std::time::Duration>) {
        *self.read_timeout.lock().unwrap() = t;
    }

    fn wait(&self, events: i16) -> io::Result<()> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events,
            revents: 0,
        };
        // A bounded wait: should a wakeup be missed (another thread consumed the bytes), the
        // operation is simply retried.
        // SAFETY: p is one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, 1000) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Sends close_notify (best effort).
    pub(crate) fn close(&self) {
        let _ = self.ssl.lock().unwrap().shutdown();
    }
}

enum Step<T> {
    Done(io::Result<T>),
    Wait(i16),
}

fn step<T>(r: Result<T, openssl::ssl::Error>, eof: T) -> Step<T> {
    match r {
        Ok(n) => Step::Done(Ok(n)),
        Err(e) => match e.code() {
            ErrorCode::WANT_READ => Step::Wait(libc::POLLIN),
            ErrorCode::WANT_WRITE => Step::Wait(libc::POLLOUT),
            ErrorCode::ZERO_RETURN => Step::Done(Ok(eof)),
            ErrorCode::SYSCALL if e.io_error().is_none() => Step::Done(Ok(eof)),
            _ => Step::Done(Err(match e.into_io_error() {
                Ok(io) => io,
                Err(e) => io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")),
            })),
        },
    }
}

impl Read for &TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        loop {
            let r = self.ssl.lock().unwrap().ssl_read(buf);
            match step(r, 0) {
                Step::Done(r) => return r,
                Step::Wait(ev) => {
                    if let Some(t) = *self.read_timeout.lock().unwrap() {
                        if started.elapsed() > t {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "TLS: no data from the peer within the timeout",
                            ));
                        }
                    }
                    self.wait(ev)?
                }
            }
        }
    }
}

impl Write for &TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let r = self.ssl.lock().unwrap().ssl_write(buf);
            match step(r, 0) {
                Step::Done(Ok(0)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "TLS session closed by the peer",
                    ))
                }
                Step::Done(r) => return r,
                Step::Wait(ev) => self.wait(ev)?,
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
