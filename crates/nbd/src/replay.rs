//! Replays a stream of block requests against an NBD export at a fixed queue depth and
//! measures what the server delivers: IOPS, throughput and latency percentiles per operation.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::{Client, ClientError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplayOpKind {
    Read,
    Write,
    Trim,
    Flush,
}

impl ReplayOpKind {
    const ALL: [ReplayOpKind; 4] = [
        ReplayOpKind::Read,
        ReplayOpKind::Write,
        ReplayOpKind::Trim,
        ReplayOpKind::Flush,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayOpKind::Read => "read",
            ReplayOpKind::Write => "write",
            ReplayOpKind::Trim => "trim",
            ReplayOpKind::Flush => "flush",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// One request to replay. Offsets must already lie inside the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOp {
    pub kind: ReplayOpKind,
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
}

/// Measurements of one operation kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpStats {
    /// NBD requests completed (successfully or not).
    pub requests: u64,
    pub bytes: u64,
    /// Requests the server answered with an error.
    pub errors: u64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub latency_mean_us: f64,
    pub latency_p50_us: f64,
    pub latency_p90_us: f64,
    pub latency_p99_us: f64,
    pub latency_p999_us: f64,
    pub latency_max_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub queue_depth: usize,
    pub elapsed_s: f64,
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
    pub iops: f64,
    /// Decimal megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Trace requests split because they exceeded the server's maximum block size.
    pub split: u64,
    /// Trace requests not sent: zero-length reads/writes, trims the export does not support.
    pub skipped: u64,
    /// First error message the server sent, if any.
    pub first_error: Option<String>,
    /// Per operation: read, write, trim, flush (only those that occurred).
    pub ops: Vec<(ReplayOpKind, OpStats)>,
    /// All operations together.
    pub all: OpStats,
    /// Per export of a replay over several ([`replay_volumes`]), in the order given: all
    /// operations of each. Empty for one export.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<OpStats>,
}

/// Byte `i` of the deterministic write pattern (the same for every run).
pub fn pattern_byte(i: u64) -> u8 {
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (i as u8)
}

struct Tally {
    hist: Histogram<u64>,
    requests: u64,
    bytes: u64,
    errors: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram bounds"),
            requests: 0,
            bytes: 0,
            errors: 0,
        }
    }
    fn stats(&self, secs: f64) -> OpStats {
        let h = &self.hist;
        let us = |ns: u64| ns as f64 / 1000.0;
        let empty = h.is_empty();
        let q = |p: f64| {
            if empty {
                0.0
            } else {
                us(h.value_at_quantile(p))
            }
        };
        OpStats {
            requests: self.requests,
            bytes: self.bytes,
            errors: self.errors,
            iops: self.requests as f64 / secs,
            mb_per_s: self.bytes as f64 / secs / 1e6,
            latency_mean_us: if empty { 0.0 } else { h.mean() / 1000.0 },
            latency_p50_us: q(0.5),
            latency_p90_us: q(0.9),
            latency_p99_us: q(0.99),
            latency_p999_us: q(0.999),
            latency_max_us: if empty { 0.0 } else { us(h.max()) },
        }
    }
}

/// Issues `ops` against `client`, keeping up to `queue_depth` requests in flight, and measures
/// each request from send to reply. Server errors are counted; a broken connection ends the
/// replay with an error.
pub fn replay(
    client: &mut Client,
    ops: impl IntoIterator<Item = ReplayOp>,
    queue_depth: usize,
) -> Result<ReplayReport, ClientError> {
    let mut pattern: Vec<u8> = Vec::new();
    replay_with(client, ops, queue_depth, |op, out| {
        if pattern.len() < out.len() {
            pattern = (0..op.len).map(pattern_byte).collect();
        }
        out.copy_from_slice(&pattern[..out.len()]);
    })
}

/// [`replay`], with the bytes of each write given by `fill(op, out)` (`out` is `op.len`
/// bytes), called in the order the writes are sent.
pub fn replay_with(
    client: &mut Client,
    ops: impl IntoIterator<Item = ReplayOp>,
    queue_depth: usize,
    fill: impl FnMut(&ReplayOp, &mut [u8]),
) -> Result<ReplayReport, ClientError> {
    let mut r = replay_volumes(
        std::slice::from_mut(client),
        ops.into_iter().map(|op| (0, op)),
        queue_depth,
        fill,
    )?;
    r.volumes.clear();
    Ok(r)
}

/// The export whose reply comes first among those with requests in flight: one with a reply
/// already buffered, else the first whose socket turns readable (`poll`). `oldest` (the
/// export of the oldest request in flight) when only it waits, when a connection cannot be
/// polled (TLS) or when poll fails: then replies are taken in send order, as a single
/// connection takes them.
fn first_to_answer(clients: &[Client], oldest: usize) -> usize {
    if clients.len() == 1 {
        // One export (every `replay_with`): nothing to choose, nothing to allocate.
        return oldest;
    }
    let waiting: Vec<usize> = (0..clients.len())
        .filter(|&v| clients[v].in_flight() > 0)
        .collect();
    debug_assert!(waiting.contains(&oldest));
    if waiting.len() <= 1 {
        return oldest;
    }
    if let Some(&v) = waiting.iter().find(|&&v| clients[v].reply_buffered()) {
        return v;
    }
    let Some(fds) = waiting
        .iter()
        .map(|&v| clients[v].reply_fd())
        .collect::<Option<Vec<_>>>()
    else {
        return oldest;
    };
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs for the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if n > 0 {
            // Readable, hung up or in error: wait_any on it returns the reply or the error.
            return pfds
                .iter()
                .position(|p| p.revents != 0)
                .map_or(oldest, |i| waiting[i]);
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return oldest;
        }
    }
}

/// [`replay_with`] over several exports (volumes of one pool, or any servers): each op
/// `(i, op)` goes to `clients[i]`, in the order given, with at most `queue_depth` requests in
/// flight over all of them together, so at queue depth 1 the server sees exactly the given
/// order across its exports. When the limit is reached the replay takes the first reply of
/// any export (`poll` over the connections), so a slow export does not hold back the timing
/// of a fast one's replies (TLS connections are waited on in send order).
pub fn replay_volumes(
    clients: &mut [Client],
    ops: impl IntoIterator<Item = (usize, ReplayOp)>,
    queue_depth: usize,
    mut fill: impl FnMut(&ReplayOp, &mut [u8]),
) -> Result<ReplayReport, ClientError> {
    assert!(!clients.is_empty(), "a replay needs at least one export");
    let qd = queue_depth.max(1);
    let max_block = clients
        .iter()
        .map(|c| c.block_sizes().map(|b| b.maximum).unwrap_or(32 << 20))
        .min()
        .unwrap_or(32 << 20)
        .clamp(512, 32 << 20) as u64;
    let can_trim: Vec<bool> = clients.iter().map(|c| c.can_trim()).collect();
    let mut data: Vec<u8> = Vec::new();
    let mut tallies: Vec<Tally> = ReplayOpKind::ALL.iter().map(|_| Tally::new()).collect();
    let mut per_volume: Vec<Tally> = clients.iter().map(|_| Tally::new()).collect();
    let mut all = Tally::new();
    // Keyed by (export, handle): handles are unique per connection only.
    type InFlight = HashMap<(usize, u64), (ReplayOpKind, u64, Instant)>;
    let mut in_flight: InFlight = HashMap::with_capacity(qd);
    // Send order, to find the export of the oldest request in flight (entries already
    // answered are skipped lazily).
    let mut sent: std::collections::VecDeque<(usize, u64)> = Default::default();
    let (mut split, mut skipped) = (0u64, 0u64);
    let mut first_error = None;
    // Pieces of a request split at max_block wait here.
    let mut queue: std::collections::VecDeque<(usize, ReplayOp)> = Default::default();
    let mut ops = ops.into_iter();
    let start = Instant::now();

    let mut complete = |clients: &mut [Client],
                        in_flight: &mut InFlight,
                        sent: &mut std::collections::VecDeque<(usize, u64)>|
     -> Result<(), ClientError> {
        while sent.front().is_some_and(|k| !in_flight.contains_key(k)) {
            sent.pop_front();
        }
        let oldest = sent.front().expect("a request in flight").0;
        // The first export to answer, not the oldest request's: waiting on one connection
        // while the other's reply sits unread would time that reply late.
        let v = first_to_answer(clients, oldest);
        let c = clients[v].wait_any()?;
        let now = Instant::now();
        let (kind, bytes, t0) = in_flight
            .remove(&(v, c.handle.0))
            .expect("client returned a handle we did not send");
        let ns = now.duration_since(t0).as_nanos().max(1) as u64;
        for t in [&mut tallies[kind.index()], &mut all, &mut per_volume[v]] {
            t.hist.saturating_record(ns);
            t.requests += 1;
            t.bytes += bytes;
        }
        if let Err(e) = &c.result {
            tallies[kind.index()].errors += 1;
            all.errors += 1;
            per_volume[v].errors += 1;
            if first_error.is_none() {
                first_error = Some(e.to_string());
            }
        }
        clients[v].recycle(c.data);
        Ok(())
    };

    loop {
        let next = match queue.pop_front() {
            Some(op) => Some(op),
            None => loop {
                match ops.next() {
                    None => break None,
                    Some((v, op)) => {
                        assert!(v < clients.len(), "op for export {v} of {}", clients.len());
                        let sendable = match op.kind {
                            ReplayOpKind::Flush => true,
                            ReplayOpKind::Trim => can_trim[v] && op.len > 0,
                            _ => op.len > 0,
                        };
                        if !sendable {
                            skipped += 1;
                            continue;
                        }
                        if op.kind != ReplayOpKind::Flush && op.len > max_block {
                            split += 1;
                            let mut off = op.offset;
                            let end = op.offset + op.len;
                            while off < end {
                                let n = (end - off).min(max_block);
                                queue.push_back((
                                    v,
                                    ReplayOp {
                                        offset: off,
                                        len: n,
                                        ..op
                                    },
                                ));
                                off += n;
                            }
                            break queue.pop_front();
                        }
                        break Some((v, op));
                    }
                }
            },
        };
        let Some((v, op)) = next else { break };
        while in_flight.len() >= qd {
            complete(clients, &mut in_flight, &mut sent)?;
        }
        let len = op.len as u32;
        let t0 = Instant::now();
        let client = &mut clients[v];
        let h = match op.kind {
            ReplayOpKind::Read => client.submit_read(op.offset, len)?,
            ReplayOpKind::Write => {
                data.resize(op.len as usize, 0);
                fill(&op, &mut data);
                client.submit_write(op.offset, &data, op.fua)?
            }
            ReplayOpKind::Trim => client.submit_trim(op.offset, len)?,
            ReplayOpKind::Flush => client.submit_flush()?,
        };
        let bytes = if matches!(op.kind, ReplayOpKind::Read | ReplayOpKind::Write) {
            op.len
        } else {
            0
        };
        in_flight.insert((v, h.0), (op.kind, bytes, t0));
        sent.push_back((v, h.0));
    }
    while !in_flight.is_empty() {
        complete(clients, &mut in_flight, &mut sent)?;
    }
    let secs = start.elapsed().max(Duration::from_nanos(1)).as_secs_f64();
    let all_stats = all.stats(secs);
    Ok(ReplayReport {
        queue_depth: qd,
        elapsed_s: secs,
        requests: all_stats.requests,
        bytes: all_stats.bytes,
        errors: all_stats.errors,
        iops: all_stats.iops,
        mb_per_s: all_stats.mb_per_s,
        split,
        skipped,
        first_error,
        ops: ReplayOpKind::ALL
            .iter()
            .zip(&tallies)
            .filter(|(_, t)| t.requests > 0)
            .map(|(k, t)| (*k, t.stats(secs)))
            .collect(),
        all: all_stats,
        volumes: per_volume.iter().map(|t| t.stats(secs)).collect(),
    })
}
