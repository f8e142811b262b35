//! Where requests come from: a trace file, a synthetic workload, or requests in memory.

use anyhow::{Context, Result};
use std::fmt;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use tiercache_engine::engine::MAX_VOLUME;
use tiercache_engine::Request;

/// A request source that can be opened (streamed) as often as needed.
#[derive(Clone, Debug)]
pub enum Input {
    /// A trace file; `format` None = detect.
    Trace {
        path: PathBuf,
        format: Option<tiercache_trace::Format>,
        options: tiercache_trace::ReadOptions,
    },
    /// A seeded synthetic workload.
    Workload {
        spec: tiercache_trace::workload::WorkloadSpec,
        seed: u64,
    },
    /// Requests already in memory (tests, benchmarks).
    Memory {
        name: String,
        requests: Arc<Vec<Request>>,
    },
}

/// Malformed records a pass over a trace skipped (`skip_bad`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Skipped {
    pub records: u64,
    /// The first skipped record's error.
    pub first: Option<String>,
}

/// Requests per batch in [`Input::for_each`].
const BATCH: usize = 16384;
/// Parsed batches the trace reader thread may be ahead.
const PIPELINE: usize = 4;

/// A stream of requests.
pub type Requests = Box<dyn Iterator<Item = Result<Request>> + Send>;

impl Input {
    /// Opens the source for one pass.
    pub fn open(&self) -> Result<Requests> {
        self.open_counted(None)
    }

    /// [`Input::open`]; when the pass ends, what it skipped (`skip_bad`) is stored in `skipped`.
    pub fn open_counted(
        &self,
        skipped: Option<Arc<std::sync::Mutex<Skipped>>>,
    ) -> Result<Requests> {
        match self {
            Input::Trace {
                path,
                format,
                options,
            } => {
                let reader = tiercache_trace::open(path, *format, options)
                    .with_context(|| format!("opening trace {}", path.display()))?;
                Ok(Box::new(Batched {
                    reader,
                    batch: Vec::with_capacity(BATCH),
                    pos: 0,
                    failed: false,
                    skipped,
                    fold: VolumeFold::default(),
                }))
            }
            Input::Workload { spec, seed } => Ok(Box::new(spec.generate(*seed).map(Ok))),
            Input::Memory { requests, .. } => {
                let r = Arc::clone(requests);
                Ok(Box::new((0..r.len()).map(move |i| Ok(r[i]))))
            }
        }
    }

    /// Calls `f` for every request, in order: the fast path for a full pass (no boxing,
    /// traces read in batches).
    pub fn for_each(&self, mut f: impl FnMut(&Request) -> Result<()>) -> Result<()> {
        self.for_each_batch(|batch| batch.iter().try_for_each(&mut f))
    }

    /// Calls `f` with consecutive batches of requests (so a caller can look ahead).
    pub fn for_each_batch(&self, f: impl FnMut(&[Request]) -> Result<()>) -> Result<()> {
        self.for_each_batch_counted(f).map(|_| ())
    }

    /// [`Input::for_each_batch`], returning what the pass skipped: malformed trace records
    /// (with `skip_bad`) and the first one's error.
    pub fn for_each_batch_counted(
        &self,
        f: impl FnMut(&[Request]) -> Result<()>,
    ) -> Result<Skipped> {
        self.for_each_batch_sized(BATCH, f)
    }

    /// [`Input::for_each_batch_counted`] in batches of `batch_len` requests (the last one
    /// shorter). The requests in memory are at most a few batches, whatever the input's length.
    pub fn for_each_batch_sized(
        &self,
        batch_len: usize,
        mut f: impl FnMut(&[Request]) -> Result<()>,
    ) -> Result<Skipped> {
        assert!(batch_len > 0, "batches of 0 requests");
        match self {
            Input::Trace {
                path,
                format,
                options,
            } => {
                let mut reader = tiercache_trace::open(path, *format, options)
                    .with_context(|| format!("opening trace {}", path.display()))?;
                // Parsing runs on its own thread, a few batches ahead of `f`: on two cores the
                // trace costs the simulation almost nothing. Batches are recycled.
                let (full_tx, full_rx) = mpsc::sync_channel::<Result<Vec<Request>>>(PIPELINE);
                let (empty_tx, empty_rx) = mpsc::channel::<Vec<Request>>();
                for _ in 0..PIPELINE + 2 {
                    empty_tx
                        .send(Vec::with_capacity(batch_len))
                        .expect("receiver alive");
                }
                std::thread::scope(|s| {
                    let parser = s.spawn(move || {
                        let skipped = |r: &tiercache_trace::TraceReader| Skipped {
                            records: r.skipped(),
                            first: r.first_error().map(|e| e.to_string()),
                        };
                        while let Ok(mut batch) = empty_rx.recv() {
                            let r = reader.read_batch(&mut batch, batch_len);
                            let end = r.is_err() || batch.is_empty();
                            let item = r.map(|_| batch).map_err(anyhow::Error::from);
                            if full_tx.send(item).is_err() || end {
                                return skipped(&reader);
                            }
                        }
                        skipped(&reader)
                    });
                    // On every way out, the receiving end and the recycling sender are dropped
                    // before the scope joins the reader, so a reader blocked on either wakes up.
                    let (full_rx, empty_tx) = (full_rx, empty_tx);
                    let mut fold = VolumeFold::default();
                    let mut consume = || -> Result<()> {
                        for item in full_rx.iter() {
                            let mut batch = item?;
                            if batch.is_empty() {
                                return Ok(());
                            }
                            fold.fold(&mut batch)?;
                            f(&batch)?;
                            let _ = empty_tx.send(batch);
                        }
                        Ok(())
                    };
                    let result = consume();
                    drop(full_rx);
                    drop(empty_tx);
                    let skipped = parser.join().expect("trace parser thread panicked");
                    result.map(|_| skipped)
                })
            }
            Input::Workload { spec, seed } => {
                let mut gen = spec.generate(*seed);
                let mut batch = Vec::with_capacity(batch_len);
                loop {
                    batch.clear();
                    batch.extend(gen.by_ref().take(batch_len));
                    if batch.is_empty() {
                        return Ok(Skipped::default());
                    }
                    f(&batch)?;
                }
            }
            Input::Memory { requests, .. } => requests
                .chunks(batch_len)
                .try_for_each(f)
                .map(|_| Skipped::default()),
        }
    }

    /// Whether `other` yields the same requests: the same trace read the same way, the same
    /// workload and seed, or the same requests in memory (so one pass can feed both).
    pub fn same_source(&self, other: &Input) -> bool {
        match (self, other) {
            (
                Input::Trace {
                    path,
                    format,
                    options,
                },
                Input::Trace {
                    path: p2,
                    format: f2,
                    options: o2,
                },
            ) => path == p2 && format == f2 && options == o2,
            (Input::Workload { spec, seed }, Input::Workload { spec: s2, seed: e2 }) => {
                spec == s2 && seed == e2
            }
            (
                Input::Memory { name, requests },
                Input::Memory {
                    name: n2,
                    requests: r2,
                },
            ) => name == n2 && Arc::ptr_eq(requests, r2),
            _ => false,
        }
    }

    /// A short name for tables.
    pub fn label(&self) -> String {
        match self {
            Input::Trace { path, .. } => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            Input::Workload { spec, .. } => spec.to_string(),
            Input::Memory { name, .. } => name.clone(),
        }
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::Trace { path, .. } => write!(f, "{}", path.display()),
            Input::Workload { spec, seed } => write!(f, "workload {spec} (seed {seed})"),
            Input::Memory { name, .. } => f.write_str(name),
        }
    }
}

/// A trace read in batches ([`tiercache_trace::TraceReader::read_batch`]) but handed out one
/// request at a time.
/// Trace volume ids above the engine's range folded into it. blkparse and FIU name a device
/// `major << 20 | minor` (8,0 is 8388608), while an engine key holds ids up to
/// [`MAX_VOLUME`]: each such id, in order of first appearance, gets `MAX_VOLUME`,
/// `MAX_VOLUME - 1`, ... Ids already in range (MSR disk numbers, SYSTOR LUNs, merged traces)
/// are kept, so no result changes; a trace whose own ids reach the folded ones is refused.
#[derive(Debug, Default)]
struct VolumeFold {
    map: std::collections::HashMap<u32, u32>,
    /// The largest id kept as it is.
    max_kept: u32,
}

impl VolumeFold {
    fn fold(&mut self, batch: &mut [Request]) -> Result<()> {
        for r in batch.iter_mut() {
            if r.volume <= MAX_VOLUME {
                self.max_kept = self.max_kept.max(r.volume);
            } else {
                let n = self.map.len() as u32;
                let v = *self.map.entry(r.volume).or_insert(MAX_VOLUME - n);
                r.volume = v;
            }
            if !self.map.is_empty() && self.max_kept > MAX_VOLUME - self.map.len() as u32 {
                anyhow::bail!(
                    "the trace names {} devices above volume id {MAX_VOLUME} (blkparse/FIU major,minor ids) and also volume id {}: they cannot share the engine's key space",
                    self.map.len(),
                    self.max_kept
                );
            }
        }
        Ok(())
    }
}

struct Batched {
    reader: tiercache_trace::TraceReader,
    batch: Vec<Request>,
    pos: usize,
    failed: bool,
    /// Where the count of skipped records goes at the end of the pass.
    skipped: Option<Arc<std::sync::Mutex<Skipped>>>,
    fold: VolumeFold,
}

impl Iterator for Batched {
    type Item = Result<Request>;

    fn next(&mut self) -> Option<Result<Request>> {
        if self.pos == self.batch.len() {
            if self.failed {
                return None;
            }
            self.pos = 0;
            if let Err(e) = self
                .reader
                .read_batch(&mut self.batch, BATCH)
                .map_err(anyhow::Error::from)
                .and_then(|_| self.fold.fold(&mut self.batch))
            {
                self.failed = true;
                self.batch.clear();
                return Some(Err(e));
            }
            if self.batch.is_empty() {
                if let Some(s) = &self.skipped {
                    *s.lock().expect("skipped count lock") = Skipped {
                        records: self.reader.skipped(),
                        first: self.reader.first_error().map(|e| e.to_string()),
                    };
                }
                return None;
            }
        }
        self.pos += 1;
        Some(Ok(self.batch[self.pos - 1]))
    }
}
