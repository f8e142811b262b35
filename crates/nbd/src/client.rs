//! A blocking NBD client with pipelining: [`Client::submit_read`] and friends send a request
//! and return its [`Handle`] at once; [`Client::wait_any`] / [`Client::wait`] collect replies
//! in whatever order the server sends them.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::proto::*;
use crate::BlockSizes;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("bad NBD URI {uri:?}: {reason}")]
    Uri { uri: String, reason: String },
    #[error("NBD protocol error: {0}")]
    Protocol(String),
    #[error("server refused: {0}")]
    Refused(String),
    #[error("server replied {} ({errno}){}", errno_name(*errno), if message.is_empty() { String::new() } else { format!(": {message}") })]
    Nbd { errno: u32, message: String },
}

impl ClientError {
    /// The NBD error value, when the server answered a request with an error.
    pub fn errno(&self) -> Option<u32> {
        match self {
            ClientError::Nbd { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;

/// Where an NBD export lives: `nbd+unix:///NAME?socket=PATH` or `nbd://HOST[:PORT]/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdUri {
    Unix {
        socket: PathBuf,
        name: String,
    },
    Tcp {
        host: String,
        port: u16,
        name: String,
    },
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl NbdUri {
    pub fn parse(uri: &str) -> Result<NbdUri> {
        let bad = |reason: &str| ClientError::Uri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(|| {
                bad("a unix URI needs ?socket=PATH, e.g. nbd+unix:///disk?socket=/run/nbd.sock")
            })?;
            if !path.is_empty() && !path.starts_with('/') {
                return Err(bad(
                    "nbd+unix URIs have no host: use nbd+unix:///NAME?socket=PATH",
                ));
            }
            let name = percent_decode(path.strip_prefix('/').unwrap_or(path))
                .ok_or_else(|| bad("bad percent-encoding in the export name"))?;
            let mut socket = None;
            for kv in query.split('&') {
                if let Some(v) = kv.strip_prefix("socket=") {
                    socket = Some(PathBuf::from(
                        percent_decode(v).ok_or_else(|| bad("bad percent-encoding in socket"))?,
                    ));
                }
            }
            let socket = socket.ok_or_else(|| bad("missing socket=PATH"))?;
            Ok(NbdUri::Unix { socket, name })
        } else if let Some(rest) = uri.strip_prefix("nbd://") {
            let (hostport, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, ""),
            };
            let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
                let (h, p) = h.split_once(']').ok_or_else(|| bad("unclosed [ in host"))?;
                (h.to_string(), p.strip_prefix(':'))
            } else {
                match hostport.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (hostport.to_string(), None),
                }
            };
            if host.is_empty() {
                return Err(bad("missing host"));
            }
            let port = match port {
                Some(p) => p.parse().map_err(|_| bad("port is not a number"))?,
                None => 10809,
            };
            let name = percent_decode(path.split('?').next().unwrap_or(""))
                .ok_or_else(|| bad("bad percent-encoding in the export name"))?;
            Ok(NbdUri::Tcp { host, port, name })
        } else {
            Err(bad(
                "expected nbd+unix:///NAME?socket=PATH or nbd://HOST[:PORT]/NAME",
            ))
        }
    }

    pub fn name(&self) -> &str {
        match self {
            NbdUri::Unix { name, .. } | NbdUri::Tcp { name, .. } => name,
        }
    }
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(std::sync::Arc<crate::tls::TlsStream>),
}

impl Conn {
    /// Connects; with `timeout`, the connect, and later every read and write on the socket,
    /// fail with `WouldBlock`/`TimedOut` after that long (TLS included: it runs on this
    /// socket).
    fn open(uri: &NbdUri, timeout: Option<Duration>) -> Result<Conn> {
        Ok(match uri {
            NbdUri::Unix { socket, .. } => {
                let s = UnixStream::connect(socket).map_err(|e| {
                    io::Error::new(e.kind(), format!("connecting to {}: {e}", socket.display()))
                })?;
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)?;
                Conn::Unix(s)
            }
            NbdUri::Tcp { host, port, .. } => {
                let at = |e: io::Error| {
                    io::Error::new(e.kind(), format!("connecting to {host}:{port}: {e}"))
                };
                let s = match timeout {
                    None => TcpStream::connect((host.as_str(), *port)).map_err(at)?,
                    Some(t) => {
                        // Every address the name resolves to, each with the timeout.
                        let mut last = io::Error::new(
                            io::ErrorKind::NotFound,
                            "the name resolves to no address",
                        );
                        let mut found = None;
                        for a in (host.as_str(), *port).to_socket_addrs().map_err(at)? {
                            match TcpStream::connect_timeout(&a, t) {
                                Ok(s) => {
                                    found = Some(s);
                                    break;
                                }
                                Err(e) => last = e,
                            }
                        }
                        found.ok_or_else(|| at(last))?
                    }
                };
                s.set_nodelay(true)?;
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)?;
                Conn::Tcp(s)
            }
        })
    }
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Tls(s) => Conn::Tls(s.clone()),
        })
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
            Conn::Tls(s) => (&**s).read(buf),
        }
    }
}
impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
            Conn::Tls(s) => (&**s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether `e` is a socket timeout of [`ClientOptions::timeout`] (the platform says
/// `WouldBlock` for a receive timeout, `TimedOut` for a connect timeout).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A request in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// Options of [`Client::connect_with`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Ask for structured replies (NBD_OPT_STRUCTURED_REPLY).
    pub structured_replies: bool,
    /// How long connecting, and then any one read or write on the connection, may wait
    /// (`None`: for ever). A request whose reply does not come in time fails with an
    /// [`ClientError::Io`] of kind `WouldBlock` or `TimedOut` ([`is_timeout`]); the
    /// connection is then out of step and must be dropped, never reused: its late reply
    /// would answer nothing.
    pub timeout: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            structured_replies: true,
            timeout: None,
        }
    }
}

struct Pending {
    typ: u16,
    offset: u64,
    len: u32,
    /// Read destination, `len` bytes.
    data: Vec<u8>,
}

/// A finished request: its handle, outcome, and for a READ the data (give the buffer back
/// with [`Client::recycle`] to avoid an allocation per read).
pub struct Completion {
    pub handle: Handle,
    pub result: Result<()>,
    pub data: Vec<u8>,
}

pub struct Client {
    writer: Conn,
    reader: BufReader<Conn>,
    size: u64,
    flags: u16,
    block_sizes: Option<BlockSizes>,
    structured: bool,
    next_handle: u64,
    pending: HashMap<u64, Pending>,
    done: HashMap<u64, Completion>,
    send_buf: Vec<u8>,
    spare: Vec<Vec<u8>>,
    broken: bool,
}

fn rd_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn rd_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn rd_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(w: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

/// Reads one option reply: (reply type, data).
fn read_option_reply(r: &mut impl Read, opt: u32) -> Result<(u32, Vec<u8>)> {
    let magic = rd_u64(r)?;
    if magic != OPT_REPLY_MAGIC {
        return Err(ClientError::Protocol(format!(
            "bad option reply magic {magic:#x}"
        )));
    }
    let ropt = rd_u32(r)?;
    if ropt != opt {
        return Err(ClientError::Protocol(format!(
            "reply to option {ropt} while waiting for option {opt}"
        )));
    }
    let typ = rd_u32(r)?;
    let len = rd_u32(r)?;
    if len > 1 << 20 {
        return Err(ClientError::Protocol(format!(
            "option reply of {len} bytes"
        )));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok((typ, data))
}

fn rep_error_name(typ: u32) -> &'static str {
    match typ {
        REP_ERR_UNSUP => "unsupported",
        REP_ERR_POLICY => "forbidden by policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_PLATFORM => "not available on this platform",
        REP_ERR_TLS_REQD => "TLS required",
        REP_ERR_UNKNOWN => "unknown export",
        REP_ERR_SHUTDOWN => "server shutting down",
        REP_ERR_BLOCK_SIZE_REQD => "block size negotiation required",
        REP_ERR_TOO_BIG => "too big",
        _ => "error",
    }
}

/// Fixed newstyle greeting; returns the server's handshake flags.
fn greet(r: &mut impl Read, w: &mut impl Write) -> Result<bool> {
    let magic = rd_u64(r)?;
    if magic != NBDMAGIC {
        return Err(ClientError::Protocol(format!(
            "not an NBD server (magic {magic:#x})"
        )));
    }
    let m2 = rd_u64(r)?;
    if m2 == OLDSTYLE_MAGIC {
        return Err(ClientError::Protocol(
            "oldstyle NBD servers are not supported".into(),
        ));
    }
    if m2 != IHAVEOPT {
        return Err(ClientError::Protocol(format!("bad newstyle magic {m2:#x}")));
    }
    let hflags = rd_u16(r)?;
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ClientError::Protocol(
            "server does not speak fixed newstyle".into(),
        ));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    w.write_all(&cflags.to_be_bytes())?;
    Ok(no_zeroes)
}

impl Client {
    /// Connects to `nbd+unix:///NAME?socket=PATH` or `nbd://HOST[:PORT]/NAME`, or with TLS
    /// to `nbds+unix://[USER@]/NAME?socket=PATH&tls-psk-file=FILE` or
    /// `nbds://HOST[:PORT]/NAME?tls-certificates=DIR` (see [`crate::ClientTls`]).
    pub fn connect(uri: &str) -> Result<Client> {
        match crate::tls::split_tls_uri(uri) {
            Ok(None) => Self::connect_with(&NbdUri::parse(uri)?, &ClientOptions::default()),
            Ok(Some((plain, tls))) => {
                Self::connect_tls(&NbdUri::parse(&plain)?, &ClientOptions::default(), &tls)
            }
            Err(reason) => Err(ClientError::Uri {
                uri: uri.to_string(),
                reason,
            }),
        }
    }

    /// [`Client::connect`] to export `name` of the server `uri` names (whatever export `uri`
    /// itself names): the volumes of one pool, e.g. `replay --volume`.
    pub fn connect_export(uri: &str, name: &str) -> Result<Client> {
        let named = |u: &str| -> Result<NbdUri> {
            Ok(match NbdUri::parse(u)? {
                NbdUri::Unix { socket, .. } => NbdUri::Unix {
                    socket,
                    name: name.to_string(),
                },
                NbdUri::Tcp { host, port, .. } => NbdUri::Tcp {
                    host,
                    port,
                    name: name.to_string(),
                },
            })
        };
        match crate::tls::split_tls_uri(uri) {
            Ok(None) => Self::connect_with(&named(uri)?, &ClientOptions::default()),
            Ok(Some((plain, tls))) => {
                Self::connect_tls(&named(&plain)?, &ClientOptions::default(), &tls)
            }
            Err(reason) => Err(ClientError::Uri {
                uri: uri.to_string(),
                reason,
            }),
        }
    }

    pub fn connect_with(uri: &NbdUri, opts: &ClientOptions) -> Result<Client> {
        Self::connect_inner(uri, opts, None)
    }

    /// Like [`Client::connect_with`], upgrading the connection with NBD_OPT_STARTTLS first.
    pub fn connect_tls(
        uri: &NbdUri,
        opts: &ClientOptions,
        tls: &crate::ClientTls,
    ) -> Result<Client> {
        Self::connect_inner(uri, opts, Some(tls))
    }

    fn connect_inner(
        uri: &NbdUri,
        opts: &ClientOptions,
        tls: Option<&crate::ClientTls>,
    ) -> Result<Client> {
        let (mut reader, mut writer, no_zeroes) = open_session(uri, tls, opts.timeout)?;
        let mut structured = false;
        if opts.structured_replies {
            send_option(&mut writer, OPT_STRUCTURED_REPLY, &[])?;
            let (typ, _) = read_option_reply(&mut reader, OPT_STRUCTURED_REPLY)?;
            structured = typ == REP_ACK;
        }
        let name = uri.name().as_bytes();
        let mut go = Vec::with_capacity(8 + name.len());
        go.extend_from_slice(&(name.len() as u32).to_be_bytes());
        go.extend_from_slice(name);
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        send_option(&mut writer, OPT_GO, &go)?;
        let mut size = None;
        let mut flags = 0;
        let mut block_sizes = None;
        loop {
            let (typ, data) = read_option_reply(&mut reader, OPT_GO)?;
            match typ {
                REP_ACK => break,
                REP_INFO => {
                    let it = data.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    match it {
                        Some(INFO_EXPORT) if data.len() == 12 => {
                            size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                            flags = u16::from_be_bytes([data[10], data[11]]);
                        }
                        Some(INFO_BLOCK_SIZE) if data.len() == 14 => {
                            let g =
                                |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().unwrap());
                            block_sizes = Some(BlockSizes {
                                minimum: g(2),
                                preferred: g(6),
                                maximum: g(10),
                            });
                        }
                        _ => {}
                    }
                }
                REP_ERR_UNSUP => {
                    // An old server without GO: fall back to EXPORT_NAME.
                    send_option(&mut writer, OPT_EXPORT_NAME, name)?;
                    size = Some(rd_u64(&mut reader)?);
                    flags = rd_u16(&mut reader)?;
                    if !no_zeroes {
                        let mut z = [0u8; 124];
                        reader.read_exact(&mut z)?;
                    }
                    break;
                }
                t if t & REP_FLAG_ERROR != 0 => {
                    return Err(ClientError::Refused(format!(
                        "export {:?}: {}{}",
                        uri.name(),
                        rep_error_name(t),
                        if data.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", String::from_utf8_lossy(&data))
                        }
                    )))
                }
                _ => {}
            }
        }
        let size =
            size.ok_or_else(|| ClientError::Protocol("server sent no NBD_INFO_EXPORT".into()))?;
        Ok(Client {
            writer,
            reader,
            size,
            flags,
            block_sizes,
            structured,
            next_handle: 1,
            pending: HashMap::new(),
            done: HashMap::new(),
            send_buf: Vec::new(),
            spare: Vec::new(),
            broken: false,
        })
    }

    /// Export names the server lists (NBD_OPT_LIST).
    /// Takes the same URIs as [`Client::connect`], `nbds` ones included.
    pub fn list(uri: &str) -> Result<Vec<String>> {
        let (plain, tls) = match crate::tls::split_tls_uri(uri) {
            Ok(None) => (uri.to_string(), None),
            Ok(Some((plain, tls))) => (plain, Some(tls)),
            Err(reason) => {
                return Err(ClientError::Uri {
                    uri: uri.to_string(),
                    reason,
                })
            }
        };
        let (mut reader, mut writer, _) =
            open_session(&NbdUri::parse(&plain)?, tls.as_ref(), None)?;
        send_option(&mut writer, OPT_LIST, &[])?;
        let mut names = Vec::new();
        loop {
            let (typ, data) = read_option_reply(&mut reader, OPT_LIST)?;
            match typ {
                REP_ACK => break,
                REP_SERVER if data.len() >= 4 => {
                    let n = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
                    let name = data.get(4..4 + n).ok_or_else(|| {
                        ClientError::Protocol("NBD_REP_SERVER name overruns its reply".into())
                    })?;
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
                t if t & REP_FLAG_ERROR != 0 => {
                    return Err(ClientError::Refused(format!("LIST: {}", rep_error_name(t))))
                }
                _ => {}
            }
        }
        send_option(&mut writer, OPT_ABORT, &[])?;
        let _ = read_option_reply(&mut reader, OPT_ABORT);
        Ok(names)
    }

    pub fn size(&self) -> u64 {
        self.size
    }
    /// Transmission flags the server sent.
    pub fn flags(&self) -> u16 {
        self.flags
    }
    pub fn block_sizes(&self) -> Option<BlockSizes> {
        self.block_sizes
    }
    pub fn structured_replies(&self) -> bool {
        self.structured
    }
    pub fn read_only(&self) -> bool {
        self.flags & FLAG_READ_ONLY != 0
    }
    pub fn can_trim(&self) -> bool {
        self.flags & FLAG_SEND_TRIM != 0
    }
    pub fn can_multi_conn(&self) -> bool {
        self.flags & FLAG_CAN_MULTI_CONN != 0
    }
    /// Requests sent and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    /// Gives a read buffer back for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 64 {
            self.spare.push(buf);
        }
    }

    /// Sends a raw request (any command, flags, payload). Tests use it to send what a
    /// well-behaved client would not.
    pub fn submit_raw(
        &mut self,
        typ: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Result<Handle> {
        if self.broken {
            return Err(ClientError::Protocol("connection is broken".into()));
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut data = Vec::new();
        if typ == CMD_READ {
            data = self.spare.pop().unwrap_or_default();
            data.clear();
            data.resize(len as usize, 0);
        }
        let b = &mut self.send_buf;
        b.clear();
        put_request(b, flags, typ, handle, offset, len);
        b.extend_from_slice(payload);
        if let Err(e) = self.writer.write_all(b) {
            self.broken = true;
            return Err(e.into());
        }
        if typ != CMD_DISC {
            self.pending.insert(
                handle,
                Pending {
                    typ,
                    offset,
                    len,
                    data,
                },
            );
        }
        Ok(Handle(handle))
    }

    pub fn submit_read(&mut self, offset: u64, len: u32) -> Result<Handle> {
        self.submit_raw(CMD_READ, 0, offset, len, &[])
    }
    pub fn submit_write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<Handle> {
        let len = u32::try_from(data.len())
            .map_err(|_| ClientError::Protocol("write longer than 4 GiB".into()))?;
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.submit_raw(CMD_WRITE, flags, offset, len, data)
    }
    pub fn submit_flush(&mut self) -> Result<Handle> {
        self.submit_raw(CMD_FLUSH, 0, 0, 0, &[])
    }
    pub fn submit_trim(&mut self, offset: u64, len: u32) -> Result<Handle> {
        self.submit_raw(CMD_TRIM, 0, offset, len, &[])
    }
    pub fn submit_write_zeroes(&mut self, offset: u64, len: u32, no_hole: bool) -> Result<Handle> {
        let flags = if no_hole { CMD_FLAG_NO_HOLE } else { 0 };
        self.submit_raw(CMD_WRITE_ZEROES, flags, offset, len, &[])
    }

    /// Whether [`Client::wait_any`] would return without reading the socket: a reply was
    /// already read (while waiting for another) or its first bytes are buffered.
    pub fn reply_buffered(&self) -> bool {
        !self.done.is_empty() || !self.reader.buffer().is_empty()
    }

    /// The socket to poll for a reply to come, so that one thread can wait on several
    /// connections at once (`crate::replay_volumes`). None for TLS: decrypted bytes may wait
    /// inside the TLS layer with nothing left to read on the socket.
    pub fn reply_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match self.reader.get_ref() {
            Conn::Unix(s) => Some(s.as_raw_fd()),
            Conn::Tcp(s) => Some(s.as_raw_fd()),
            Conn::Tls(_) => None,
        }
    }

    /// Waits for the next reply from the server, whichever request it answers.
    pub fn wait_any(&mut self) -> Result<Completion> {
        if let Some(&h) = self.done.keys().next() {
            return Ok(self.done.remove(&h).unwrap());
        }
        if self.pending.is_empty() {
            return Err(ClientError::Protocol("no request in flight".into()));
        }
        match self.read_reply() {
            Ok(c) => Ok(c),
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// Waits for one particular request.
    pub fn wait(&mut self, h: Handle) -> Result<Completion> {
        loop {
            if let Some(c) = self.done.remove(&h.0) {
                return Ok(c);
            }
            if !self.pending.contains_key(&h.0) {
                return Err(ClientError::Protocol(format!("unknown handle {}", h.0)));
            }
            let c = match self.read_reply() {
                Ok(c) => c,
                Err(e) => {
                    self.broken = true;
                    return Err(e);
                }
            };
            if c.handle == h {
                return Ok(c);
            }
            self.done.insert(c.handle.0, c);
        }
    }

    fn read_reply(&mut self) -> Result<Completion> {
        let r = &mut self.reader;
        let magic = rd_u32(r)?;
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let err = rd_u32(r)?;
                let handle = rd_u64(r)?;
                let mut p = self.pending.remove(&handle).ok_or_else(|| {
                    ClientError::Protocol(format!("reply for unknown handle {handle}"))
                })?;
                if p.typ == CMD_READ && self.structured {
                    return Err(ClientError::Protocol(
                        "simple reply to a READ after structured replies were negotiated".into(),
                    ));
                }
                let result = if err == 0 {
                    if p.typ == CMD_READ {
                        r.read_exact(&mut p.data)?;
                    }
                    Ok(())
                } else {
                    Err(ClientError::Nbd {
                        errno: err,
                        message: String::new(),
                    })
                };
                Ok(Completion {
                    handle: Handle(handle),
                    result,
                    data: p.data,
                })
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut handle;
                let mut result: Result<()> = Ok(());
                let mut first = true;
                loop {
                    if !first {
                        let m = rd_u32(r)?;
                        if m != STRUCTURED_REPLY_MAGIC {
                            return Err(ClientError::Protocol(format!(
                                "bad structured chunk magic {m:#x}"
                            )));
                        }
                    }
                    first = false;
                    let flags = rd_u16(r)?;
                    let typ = rd_u16(r)?;
                    handle = rd_u64(r)?;
                    let len = rd_u32(r)?;
                    let p = self.pending.get_mut(&handle).ok_or_else(|| {
                        ClientError::Protocol(format!("chunk for unknown handle {handle}"))
                    })?;
                    match typ {
                        REPLY_TYPE_NONE => {}
                        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                            let off = rd_u64(r)?;
                            let n = if typ == REPLY_TYPE_OFFSET_DATA {
                                len.checked_sub(8).ok_or_else(|| {
                                    ClientError::Protocol("short OFFSET_DATA chunk".into())
                                })? as u64
                            } else {
                                rd_u32(r)? as u64
                            };
                            let start = off.wrapping_sub(p.offset);
                            if p.typ != CMD_READ || off < p.offset || start + n > p.len as u64 {
                                return Err(ClientError::Protocol(format!(
                                    "chunk at {off}+{n} outside request {}+{}",
                                    p.offset, p.len
                                )));
                            }
                            let dst = &mut p.data[start as usize..(start + n) as usize];
                            if typ == REPLY_TYPE_OFFSET_DATA {
                                r.read_exact(dst)?;
                            } else {
                                dst.fill(0);
                            }
                        }
                        t if t & (1 << 15) != 0 => {
                            let mut d = vec![0u8; len as usize];
                            r.read_exact(&mut d)?;
                            if d.len() < 6 {
                                return Err(ClientError::Protocol("short error chunk".into()));
                            }
                            let errno = u32::from_be_bytes(d[..4].try_into().unwrap());
                            let ml = u16::from_be_bytes([d[4], d[5]]) as usize;
                            let message = String::from_utf8_lossy(d.get(6..6 + ml).unwrap_or(&[]))
                                .into_owned();
                            if result.is_ok() {
                                result = Err(ClientError::Nbd { errno, message });
                            }
                        }
                        _ => {
                            // Unknown non-error chunk: skip its payload.
                            io::copy(&mut r.take(len as u64), &mut io::sink())?;
                        }
                    }
                    if flags & REPLY_FLAG_DONE != 0 {
                        break;
                    }
                }
                let p = self.pending.remove(&handle).unwrap();
                Ok(Completion {
                    handle: Handle(handle),
                    result,
                    data: p.data,
                })
            }
            m => Err(ClientError::Protocol(format!("bad reply magic {m:#x}"))),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = u32::try_from(buf.len())
            .map_err(|_| ClientError::Protocol("read longer than 4 GiB".into()))?;
        let h = self.submit_read(offset, len)?;
        let c = self.wait(h)?;
        c.result?;
        buf.copy_from_slice(&c.data);
        self.recycle(c.data);
        Ok(())
    }
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let h = self.submit_write(offset, data, false)?;
        self.wait(h)?.result
    }
    pub fn write_fua(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let h = self.submit_write(offset, data, true)?;
        self.wait(h)?.result
    }
    pub fn flush(&mut self) -> Result<()> {
        let h = self.submit_flush()?;
        self.wait(h)?.result
    }
    pub fn trim(&mut self, offset: u64, len: u32) -> Result<()> {
        let h = self.submit_trim(offset, len)?;
        self.wait(h)?.result
    }
    pub fn write_zeroes(&mut self, offset: u64, len: u32) -> Result<()> {
        let h = self.submit_write_zeroes(offset, len, false)?;
        self.wait(h)?.result
    }

    /// Waits for every request in flight, then sends NBD_CMD_DISC.
    pub fn disconnect(mut self) -> Result<()> {
        while !self.pending.is_empty() {
            self.read_reply()?;
        }
        self.submit_raw(CMD_DISC, 0, 0, 0, &[])?;
        Ok(())
    }
}

/// Opens a connection, reads the greeting and, with `tls`, upgrades it with NBD_OPT_STARTTLS:
/// the start every session (transmission or listing) shares.
fn open_session(
    uri: &NbdUri,
    tls: Option<&crate::ClientTls>,
    timeout: Option<Duration>,
) -> Result<(BufReader<Conn>, Conn, bool)> {
    let conn = Conn::open(uri, timeout)?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::with_capacity(256 << 10, conn);
    let no_zeroes = greet(&mut reader, &mut writer)?;
    if let Some(tls) = tls {
        send_option(&mut writer, OPT_STARTTLS, &[])?;
        let (typ, data) = read_option_reply(&mut reader, OPT_STARTTLS)?;
        if typ != REP_ACK {
            return Err(ClientError::Refused(format!(
                "STARTTLS: {} ({})",
                rep_error_name(typ),
                String::from_utf8_lossy(&data)
            )));
        }
        if !reader.buffer().is_empty() {
            return Err(ClientError::Protocol(
                "data after the STARTTLS reply".into(),
            ));
        }
        drop(writer);
        let sock: std::os::fd::OwnedFd = match reader.into_inner() {
            Conn::Unix(s) => s.into(),
            Conn::Tcp(s) => s.into(),
            Conn::Tls(_) => unreachable!("TLS is started once"),
        };
        let host = match uri {
            NbdUri::Tcp { host, .. } => Some(host.as_str()),
            NbdUri::Unix { .. } => None,
        };
        let s = std::sync::Arc::new(crate::tls::client_connect(sock, tls, host)?);
        writer = Conn::Tls(s.clone());
        reader = BufReader::with_capacity(256 << 10, Conn::Tls(s));
    }
    Ok((reader, writer, no_zeroes))
}
