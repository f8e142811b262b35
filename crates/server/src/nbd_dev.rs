//! A backing device that is itself an NBD export: cache a remote (or cloud, or nbdkit-served)
//! volume on a local SSD. `tiercache serve --backing nbd+unix:///NAME?socket=PATH` or
//! `--backing nbd://HOST[:PORT]/NAME`.
//!
//! Requests run on a small pool of connections. When the server advertises CAN_MULTI_CONN, a
//! FLUSH on any connection makes every completed write durable, so the pool may grow to
//! [`NbdDev::MAX_CONNECTIONS`] and `sync` flushes one of them; otherwise the device keeps a
//! single connection (requests then take turns). Requests longer than the server's maximum
//! block size are split.

use crate::dev::BlockDev;
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use tiercache_nbd::{Client, ClientError, ClientOptions, NbdUri};

pub struct NbdDev {
    uri: NbdUri,
    uri_text: String,
    /// Connections are opened with this (`ClientOptions::timeout`): a request without a
    /// reply in time fails and its connection is dropped.
    opts: ClientOptions,
    size: u64,
    multi_conn: bool,
    read_only: bool,
    max_block: u64,
    pool: Mutex<Pool>,
    freed: Condvar,
}

struct Pool {
    idle: Vec<Client>,
    open: usize,
}

fn err(uri: &str, timeout: Option<Duration>, e: ClientError) -> io::Error {
    match e {
        ClientError::Io(e) if tiercache_nbd::is_timeout(&e) => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{uri}: no answer within {:.1} s (--device-timeout); the request failed and its connection was dropped",
                timeout.unwrap_or_default().as_secs_f64()
            ),
        ),
        ClientError::Io(e) => io::Error::new(e.kind(), format!("{uri}: {e}")),
        // A full backing export stays ENOSPC for our own clients (not a plain EIO).
        ClientError::Nbd {
            errno: tiercache_nbd::proto::ENOSPC,
            ..
        } => io::Error::new(io::ErrorKind::StorageFull, format!("{uri}: {e}")),
        e => io::Error::other(format!("{uri}: {e}")),
    }
}

impl NbdDev {
    /// Connections at most (with CAN_MULTI_CONN).
    pub const MAX_CONNECTIONS: usize = 8;

    /// Whether `path` names an NBD export rather than a file.
    pub fn is_uri(path: &str) -> bool {
        path.starts_with("nbd://") || path.starts_with("nbd+unix://")
    }

    /// How long one request may wait for its answer by default (`serve --device-timeout`):
    /// longer than any healthy disk's queue, short enough that a dead server or host fails
    /// requests instead of hanging the volume.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// Connects once (to learn the size and flags) with [`Self::DEFAULT_TIMEOUT`]; more
    /// connections open on demand.
    pub fn connect(uri_text: &str) -> io::Result<NbdDev> {
        Self::connect_with_timeout(uri_text, Some(Self::DEFAULT_TIMEOUT))
    }

    /// [`Self::connect`] where connecting and every request may wait `timeout` at most
    /// (`None`: for ever). A request that gets no answer in time fails with `TimedOut`; its
    /// connection is dropped (its late reply answers nothing), the next request opens a new
    /// one.
    pub fn connect_with_timeout(uri_text: &str, timeout: Option<Duration>) -> io::Result<NbdDev> {
        let opts = ClientOptions {
            timeout,
            ..Default::default()
        };
        let uri = NbdUri::parse(uri_text).map_err(|e| err(uri_text, timeout, e))?;
        let c = Client::connect_with(&uri, &opts).map_err(|e| err(uri_text, timeout, e))?;
        let max_block = c
            .block_sizes()
            .map(|b| b.maximum as u64)
            .unwrap_or(32 << 20)
            .clamp(4096, 32 << 20);
        Ok(NbdDev {
            size: c.size(),
            multi_conn: c.can_multi_conn(),
            read_only: c.read_only(),
            max_block,
            uri,
            uri_text: uri_text.to_string(),
            opts,
            pool: Mutex::new(Pool {
                idle: vec![c],
                open: 1,
            }),
            freed: Condvar::new(),
        })
    }

    /// Whether the export refuses writes (write-back and write-through need it writable).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Runs `f` on a connection from the pool, opening one if allowed and none is idle. A
    /// connection that failed at the transport level is dropped rather than returned.
    fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, ClientError>,
    ) -> io::Result<T> {
        let mut c = {
            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(c) = p.idle.pop() {
                    break c;
                }
                let limit = if self.multi_conn {
                    Self::MAX_CONNECTIONS
                } else {
                    1
                };
                if p.open < limit {
                    p.open += 1;
                    drop(p);
                    match Client::connect_with(&self.uri, &self.opts) {
                        Ok(c) => break c,
                        Err(e) => {
                            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                            p.open -= 1;
                            self.freed.notify_one();
                            return Err(err(&self.uri_text, self.opts.timeout, e));
                        }
                    }
                }
                p = self.freed.wait(p).unwrap_or_else(|e| e.into_inner());
            }
        };
        let r = f(&mut c);
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        match &r {
            // The server answered with an error: the connection is still in step.
            Ok(_) | Err(ClientError::Nbd { .. }) => p.idle.push(c),
            Err(_) => p.open -= 1,
        }
        self.freed.notify_one();
        r.map_err(|e| err(&self.uri_text, self.opts.timeout, e))
    }

    /// How many of `len` bytes at `offset` lie within the export (the rest reads as zeros
    /// and is not written: the `BlockDev` contract).
    fn within(&self, offset: u64, len: usize) -> usize {
        self.size.saturating_sub(offset).min(len as u64) as usize
    }
}

impl BlockDev for NbdDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (buf, past_end) = buf.split_at_mut(self.within(offset, buf.len()));
        past_end.fill(0);
        if buf.is_empty() {
            return Ok(());
        }
        let step = self.max_block as usize;
        self.with_client(|c| {
            // Submit every piece, then collect: the pieces travel in one round trip.
            let mut handles = Vec::new();
            for (i, piece) in buf.chunks(step).enumerate() {
                let at = offset + (i * step) as u64;
                handles.push((i, c.submit_read(at, piece.len() as u32)?));
            }
            let mut failed = None;
            for (i, h) in handles {
                let done = c.wait(h)?;
                match done.result {
                    Ok(()) => {
                        let piece = &mut buf[i * step..];
                        let n = piece.len().min(step);
                        piece[..n].copy_from_slice(&done.data[..n]);
                    }
                    Err(e) => failed = failed.or(Some(e)),
                }
                c.recycle(done.data);
            }
            failed.map_or(Ok(()), Err)
        })
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let data = &data[..self.within(offset, data.len())];
        if data.is_empty() {
            return Ok(());
        }
        let step = self.max_block as usize;
        self.with_client(|c| {
            let mut handles = Vec::new();
            for (i, piece) in data.chunks(step).enumerate() {
                handles.push(c.submit_write(offset + (i * step) as u64, piece, false)?);
            }
            let mut failed = None;
            for h in handles {
                if let Err(e) = c.wait(h)?.result {
                    failed = failed.or(Some(e));
                }
            }
            failed.map_or(Ok(()), Err)
        })
    }

    /// A FLUSH: with CAN_MULTI_CONN one covers the writes completed on every connection;
    /// without it there is only one connection.
    fn sync(&self) -> io::Result<()> {
        self.with_client(|c| {
            let h = c.submit_flush()?;
            c.wait(h)?.result
        })
    }

    /// NBD_CMD_TRIM when the server offers it (in pieces of at most the largest block).
    fn discard(&self, offset: u64, len: u64) -> io::Result<bool> {
        let len = self.within(offset, len.min(usize::MAX as u64) as usize) as u64;
        if len == 0 {
            return Ok(false);
        }
        let step = self.max_block;
        self.with_client(|c| {
            if !c.can_trim() {
                return Ok(false);
            }
            let mut handles = Vec::new();
            let mut at = offset;
            while at < offset + len {
                let n = step.min(offset + len - at);
                handles.push(c.submit_trim(at, n as u32)?);
                at += n;
            }
            let mut failed = None;
            for h in handles {
                if let Err(e) = c.wait(h)?.result {
                    failed = failed.or(Some(e));
                }
            }
            failed.map_or(Ok(true), Err)
        })
    }

    /// The export's URI (it names the server and the export).
    fn identity(&self) -> Option<crate::identity::BackingIdentity> {
        Some(crate::identity::BackingIdentity::nbd(&self.uri_text))
    }
}
