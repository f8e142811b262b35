//! The control socket (`tiercache ctl`) and the Prometheus metrics endpoint.
//!
//! Control protocol: a unix socket; each request is one JSON object on one line, each reply
//! one JSON object on one line:
//! ```text
//! {"cmd":"stats"}                      -> {"ok":true,"stats":{...}}
//! {"cmd":"flush"}                      -> {"ok":true}   (write back dirty data, make durable)
//! {"cmd":"mode","mode":"write-back"}   -> {"ok":true}
//! {"cmd":"detach"}                     -> {"ok":true}   (flush, then pass-through)
//! {"cmd":"get"}  {"cmd":"get","key":K} -> {"ok":true,"settings":[[key,value],...]}
//! {"cmd":"set","key":K,"value":V}      -> {"ok":true,"key":K,"old":..,"new":..}
//! {"cmd":"resetstats"}                 -> {"ok":true}   (zero the counters, as casadm -Z)
//! {"cmd":"classes","file":F,"table":TEXT[,"rules_file":R,"rules":TEXT]}
//!                                      -> {"ok":true,"loaded":{old,new,classifier,..}}
//!                                         (replace the class table; the texts are parsed
//!                                         here, errors name F or R and the line)
//! {"cmd":"volume","name":N,"request":R} -> R's reply for volume N of several (`ctl --volume`):
//!                                         stats (with "volume": its figures and
//!                                         "settings"), get, set, mode, detach (its own,
//!                                         for the run), flush (the pool's cleaner: every
//!                                         volume); the rest are the pool's (refused)
//! {"cmd":"addvolume","name":N,"backing":PATH[,"mode":M]}
//!                                      -> {"ok":true,"id":..,"size":..} (`ctl volume add`;
//!                                         answered by `serve`, which opens the device and
//!                                         offers the export: `tiercache serve` with
//!                                         --volume; refused elsewhere)
//! {"cmd":"removevolume","name":N}      -> {"ok":true,"id":..,"lines_dropped":..}
//!                                         (`ctl volume remove`; as addvolume)
//! {"cmd":"replacecache","index":I,"path":P}
//!                                      -> {"ok":true}   (`ctl cache replace`: failed pool
//!                                         member I replaced by device P, formatted as it;
//!                                         the cleaner then re-mirrors)
//! anything else                        -> {"ok":false,"error":"..."}
//! ```

use crate::live::LiveVolume;
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiercache_engine::Mode;

/// A control request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Command {
    Stats,
    Flush,
    Mode {
        mode: String,
    },
    Detach,
    /// Settings in force: all, or one key.
    Get {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// Changes one setting live (`crate::tuning::KEYS`).
    Set {
        key: String,
        value: String,
    },
    /// Zeroes the statistics.
    ResetStats,
    /// Replaces the I/O class table (`ctl classes load`): the text of a table file, and
    /// optionally of a rules file replacing its rules, each with its file name for errors.
    Classes {
        file: String,
        table: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rules_file: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rules: Option<String>,
    },
    /// `request` for volume `name` of a server of several volumes (`ctl --volume NAME`).
    Volume {
        name: String,
        request: Box<Command>,
    },
    /// A new volume served from now on (`ctl volume add NAME=BACKING [--mode M]`).
    AddVolume {
        name: String,
        /// Its backing device: an absolute path or an NBD URI.
        backing: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<String>,
    },
    /// Volume `name` leaves the pool (`ctl volume remove NAME`).
    RemoveVolume {
        name: String,
    },
    /// Failed pool member `index` replaced by the device at `path` (`ctl cache replace`).
    ReplaceCache {
        index: usize,
        path: String,
    },
}

/// What a server that cannot add or remove volumes answers `addvolume` and `removevolume`.
pub const NO_VOLUME_ADMIN: &str = "volumes are added and removed only on a `tiercache serve` of several volumes (started with --volume NAME=BACKING, direct layout)";

/// The answer to `request` for volume `name` (see the module doc).
fn volume_reply(vol: &dyn LiveVolume, name: &str, request: Command) -> serde_json::Value {
    let no = |e: String| serde_json::json!({"ok": false, "error": e});
    let vols = vol.volumes();
    let Some(id) = vols.iter().find(|v| v.0 == name).map(|v| v.1) else {
        return no(if vols.is_empty() {
            format!("no volume {name:?}: this server serves one volume (started with --backing): drop --volume")
        } else {
            format!(
                "no volume {name:?}: the volumes are {}",
                vols.iter()
                    .map(|v| v.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    };
    let set = |key: &str, value: &str| match vol.set_volume_setting(id, key, value) {
        Ok((old, new)) => serde_json::json!({"ok": true, "key": key, "old": old, "new": new}),
        Err(e) => no(e),
    };
    match request {
        Command::Stats => {
            let stats = vol.live_stats();
            let figures = stats.volumes.iter().find(|f| f.id == id).cloned();
            match vol.volume_settings(id) {
                Ok(s) => serde_json::json!({"ok": true, "stats": stats, "volume": figures, "settings": s}),
                Err(e) => no(e),
            }
        }
        Command::Get { key } => match vol.volume_settings(id) {
            Err(e) => no(e),
            Ok(all) => match key.as_deref().map(crate::tuning::volume_key).transpose() {
                Err(e) => no(e),
                Ok(Some(k)) if !crate::tuning::VOLUME_KEYS.contains(&k) => no(format!(
                    "{k} is a setting of the pool, shared by every volume (per volume: {}): `ctl get {k}` without --volume",
                    crate::tuning::VOLUME_KEYS.join(", ")
                )),
                Ok(k) => get_reply(all, k),
            },
        },
        Command::Set { key, value } => set(&key, &value),
        Command::Mode { mode } => set("mode", &mode),
        Command::Detach => set("mode", "pass-through"),
        Command::Flush => match vol.flush_dirty() {
            Ok(()) => serde_json::json!({"ok": true, "pool": true}),
            Err(e) => no(e.to_string()),
        },
        Command::ResetStats => no("statistics are reset for the whole pool: `ctl stats --reset` without --volume".into()),
        Command::Classes { .. } => no("the class table is the pool's, shared by every volume: `ctl classes load` without --volume".into()),
        Command::Volume { .. } => no("a volume request inside a volume request".into()),
        Command::AddVolume { .. } | Command::RemoveVolume { .. } => no(
            "`ctl volume add|remove` concerns the pool, not one volume: run it without --volume".into(),
        ),
        Command::ReplaceCache { .. } => no(
            "`ctl cache replace` concerns the pool's cache devices, not one volume: run it without --volume".into(),
        ),
    }
}

/// The answer to `get` from all settings: one key's (checked) or all.
pub fn get_reply(all: Vec<(&'static str, String)>, key: Option<&str>) -> serde_json::Value {
    // A log-layout key where the volume has it (`crate::tuning::LOG_KEYS`), else a key of
    // both layouts (a log key on the direct layout is refused with why).
    let log = key
        .and_then(crate::tuning::log_key)
        .filter(|l| all.iter().any(|x| x.0 == *l));
    let pick = match log
        .map(Ok)
        .or_else(|| key.map(crate::tuning::volume_key))
        .transpose()
    {
        Ok(k) => k,
        Err(e) => return serde_json::json!({"ok": false, "error": e}),
    };
    let v: Vec<_> = all
        .into_iter()
        .filter(|(k, _)| pick.is_none_or(|p| p == *k))
        .collect();
    serde_json::json!({"ok": true, "settings": v})
}

/// The answer to one request line, for a volume of either layout.
pub fn handle(vol: &dyn LiveVolume, line: &str) -> serde_json::Value {
    let cmd: Command = match serde_json::from_str(line) {
        Ok(c) => c,
        Err(e) => {
            return serde_json::json!({"ok": false, "error": format!("bad request {line:?}: {e}")})
        }
    };
    let r = match cmd {
        Command::Stats => {
            return serde_json::json!({"ok": true, "stats": vol.live_stats()});
        }
        Command::Flush => vol.flush_dirty().map_err(|e| e.to_string()),
        Command::Mode { mode } => mode
            .parse::<Mode>()
            .and_then(|m| vol.set_mode(m).map_err(|e| e.to_string())),
        Command::Detach => vol.detach().map_err(|e| e.to_string()),
        Command::Volume { name, request } => return volume_reply(vol, &name, *request),
        Command::AddVolume { .. } | Command::RemoveVolume { .. } => Err(NO_VOLUME_ADMIN.into()),
        Command::ReplaceCache { index, path } => vol.replace_cache_member(index, &path),
        Command::Get { key } => return get_reply(vol.settings(), key.as_deref()),
        Command::Set { key, value } => {
            return match vol.set_setting(&key, &value) {
                Ok((old, new)) => {
                    serde_json::json!({"ok": true, "key": key, "old": old, "new": new})
                }
                Err(e) => serde_json::json!({"ok": false, "error": e}),
            }
        }
        Command::ResetStats => {
            vol.reset_stats();
            Ok(())
        }
        Command::Classes {
            file,
            table,
            rules_file,
            rules,
        } => {
            let rules = match (&rules, &rules_file) {
                (Some(t), f) => Some((t.as_str(), f.as_deref().unwrap_or("<rules>"))),
                (None, _) => None,
            };
            let source = match rules {
                Some((_, rf)) => format!("{file} with rules {rf}"),
                None => file.clone(),
            };
            return match crate::classify::table_from_text((&table, &file), rules)
                .and_then(|t| vol.load_classes(t, &source))
            {
                Ok(r) => serde_json::json!({"ok": true, "loaded": r}),
                Err(e) => serde_json::json!({"ok": false, "error": e}),
            };
        }
    };
    match r {
        Ok(()) => serde_json::json!({"ok": true}),
        Err(e) => serde_json::json!({"ok": false, "error": e}),
    }
}

/// Serves the control socket of `vol` (either layout) at `path` (replacing a stale socket
/// file) in a thread.
pub fn serve_control(path: &Path, vol: Arc<dyn LiveVolume>) -> io::Result<JoinHandle<()>> {
    serve_json_lines(path, move |line| handle(&*vol, line))
}

/// The socket side of [`serve_control`] for any volume: one JSON request per line, `answer`
/// turns it into the reply line; a thread per connection. A stale socket file (nobody
/// listening) is replaced.
///
/// Only the server's own uid and root may use it: the socket file is 0600 from its creation
/// (whatever the umask), and a client of any other uid (a socket made reachable by hand, a
/// shared directory) is refused by its `SO_PEERCRED` uid, with one error reply and a warning
/// in the log — the commands switch the volume's mode and detach it.
pub fn serve_json_lines(
    path: &Path,
    answer: impl Fn(&str) -> serde_json::Value + Send + Sync + 'static,
) -> io::Result<JoinHandle<()>> {
    if path.exists() && UnixStream::connect(path).is_err() {
        std::fs::remove_file(path)?;
    }
    let listener = tiercache_nbd::unix_access::bind_private(path, None)
        .map_err(|e| io::Error::new(e.kind(), format!("control socket {}: {e}", path.display())))?;
    let answer = Arc::new(answer);
    let shown = path.display().to_string();
    std::thread::Builder::new()
        .name("tiercache-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if let Err(why) = tiercache_nbd::unix_access::check_peer_is_owner(&conn) {
                    tracing::warn!("control socket {shown}: refused a client: {why}");
                    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = writeln!(conn, "{}", serde_json::json!({"ok": false, "error": why}));
                    continue;
                }
                let answer = Arc::clone(&answer);
                std::thread::spawn(move || {
                    let Ok(mut w) = conn.try_clone() else { return };
                    for line in BufReader::new(conn).lines() {
                        let Ok(line) = line else { return };
                        if line.trim().is_empty() {
                            continue;
                        }
                        // A command that panics (a bug; with the volume lock held the
                        // volume halts, see `crate::live::HALTED`) still gets its reply,
                        // and this connection goes on.
                        let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            answer(&line)
                        }))
                        .unwrap_or_else(|p| {
                            let what = p
                                .downcast_ref::<String>()
                                .map(String::as_str)
                                .or_else(|| p.downcast_ref::<&str>().copied())
                                .unwrap_or("(no message)");
                            serde_json::json!({
                                "ok": false,
                                "error": format!(
                                    "the command panicked: {what} (a bug: the server log has \
                                     the details; `ctl stats` says whether the volume halted)"
                                ),
                            })
                        });
                        if writeln!(w, "{reply}").is_err() {
                            return;
                        }
                    }
                });
            }
        })
}

/// Sends one control request and returns the reply (an error when `ok` is false).
pub fn request(path: &Path, cmd: &Command) -> Result<serde_json::Value, String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        format!(
            "control socket {}: {e} (is `tiercache serve --control` running?)",
            path.display()
        )
    })?;
    let line = serde_json::to_string(cmd).unwrap();
    // A refused client (another uid) gets its reply before the server reads anything: read
    // the reply even when the request could not be written.
    let sent = writeln!(s, "{line}");
    let mut reply = String::new();
    let read = BufReader::new(s).read_line(&mut reply);
    if reply.is_empty() {
        return Err(match (sent, read) {
            (Err(e), _) | (_, Err(e)) => format!("control socket {}: {e}", path.display()),
            _ => format!("control socket {}: closed without a reply", path.display()),
        });
    }
    let v: serde_json::Value =
        serde_json::from_str(&reply).map_err(|e| format!("bad reply {reply:?}: {e}"))?;
    if v["ok"] == serde_json::Value::Bool(true) {
        Ok(v)
    } else {
        Err(v["error"].as_str().unwrap_or("unknown error").to_string())
    }
}

/// Serves `GET /metrics` (Prometheus text format) on `addr` in a thread: a minimal HTTP/1.1
/// responder, one request per connection.
pub fn serve_metrics(
    addr: SocketAddr,
    vol: Arc<dyn LiveVolume>,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    serve_prometheus(addr, move || crate::live::prometheus(&*vol))
}

/// Most metrics connections served at once; more are closed right after accept.
pub const METRICS_MAX_CONNECTIONS: usize = 32;
/// Time a metrics client has to send its request head, in total (not per read: a client
/// trickling a byte at a time is cut off too).
pub const METRICS_REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Time a metrics client has to take the reply.
pub const METRICS_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP side of [`serve_metrics`]: `body` renders the metrics text at each
/// `GET /metrics`.
pub fn serve_prometheus(
    addr: SocketAddr,
    body: impl Fn() -> String + Send + Sync + 'static,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    serve_http(addr, "metrics", "try GET /metrics\n", move |path| {
        matches!(path, "/metrics" | "/").then(|| ("text/plain; version=0.0.4", body()))
    })
}

/// The server under [`serve_prometheus`] and the dashboard (`serve --http`): `route` maps
/// the path of each `GET` (query string removed) to a content type and body; `None` (or any
/// other method) is answered `404` with `hint`. `what` names the endpoint in errors and
/// thread names.
///
/// One thread per connection, at most [`METRICS_MAX_CONNECTIONS`] at once, each with a total
/// deadline for the request and a write timeout: slow or stalled clients hold only their own
/// thread (for seconds), never the endpoint — a scraper is answered while they dawdle.
pub fn serve_http(
    addr: SocketAddr,
    what: &'static str,
    hint: &'static str,
    route: impl Fn(&str) -> Option<(&'static str, String)> + Send + Sync + 'static,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("{what} endpoint {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let route = Arc::new(route);
    let open = Arc::new(AtomicUsize::new(0));
    let h = std::thread::Builder::new()
        .name(format!("tiercache-{what}"))
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if open.fetch_add(1, Ordering::SeqCst) >= METRICS_MAX_CONNECTIONS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    drop(conn); // over the cap: closed at once, the accept loop goes on
                    continue;
                }
                let (route, open2) = (Arc::clone(&route), Arc::clone(&open));
                let spawned = std::thread::Builder::new()
                    .name(format!("tiercache-{what}-conn"))
                    .spawn(move || {
                        answer_http(conn, &*route, hint);
                        open2.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })?;
    Ok((local, h))
}

/// Reads one request head (within [`METRICS_REQUEST_DEADLINE`]) and writes one reply.
type Route = dyn Fn(&str) -> Option<(&'static str, String)>;

fn answer_http(mut conn: std::net::TcpStream, route: &Route, hint: &str) {
    let _ = conn.set_write_timeout(Some(METRICS_WRITE_TIMEOUT));
    let deadline = Instant::now() + METRICS_REQUEST_DEADLINE;
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            break; // too slow: answered with what came (a 404 unless it was a GET)
        }
        match conn.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let first = String::from_utf8_lossy(&head);
    let first = first.lines().next().unwrap_or("");
    // "GET /path?query HTTP/1.1": only complete request lines are routed.
    let path = match first.split(' ').collect::<Vec<_>>()[..] {
        ["GET", target, version] if version.starts_with("HTTP/") => {
            Some(target.split('?').next().unwrap_or(target))
        }
        _ => None,
    };
    let (status, (ctype, body)) = match path.and_then(route) {
        Some(r) => ("200 OK", r),
        None => ("404 Not Found", ("text/plain", hint.to_string())),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
