//! `tiercache._native`: the Python extension. A thin layer over `tiercache-sim`: settings come
//! in as JSON text (built by the Python wrapper from dicts), results go out as JSON text, and
//! every simulation runs with the GIL released. Nothing here simulates: the Rust crates stay the
//! single implementation.

use anyhow::{Context, Result};
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::Deserialize;
use std::path::Path;
use tiercache_engine::{parse_size, Op};
use tiercache_sim::experiment::{specs, InputSection};
use tiercache_sim::{Drive, Experiment, Input, TimedOptions, TimedSetup};

/// Turns an error chain into a Python `ValueError` with every cause.
fn py_err(e: anyhow::Error) -> PyErr {
    PyValueError::new_err(format!("{e:#}"))
}

/// Devices and drive of a timed run, as the Python wrapper sends them.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct TimedArgs {
    hdd: Option<String>,
    /// Cache device; absent = the default SSD.
    ssd: Option<String>,
    /// Further cache devices: with any, the cache is a pool of `ssd` and these.
    pool: Vec<String>,
    /// [member, seconds]: that pool member fails this long after the first request.
    fail_ssd: Option<(usize, f64)>,
    /// Copies of each dirty line in a pool (`sim --dirty-copies`); absent: the default.
    dirty_copies: Option<u8>,
    /// No cache device: the HDD alone.
    no_ssd: bool,
    /// [level, disks]
    raid: Option<(u8, usize)>,
    queue_depth: Option<u32>,
    /// Open loop: trace timestamps divided by this.
    speedup: Option<f64>,
    window_s: Option<f64>,
    idle_clean: Option<bool>,
}

impl TimedArgs {
    fn setup(&self) -> Result<TimedSetup> {
        let mut s = TimedSetup::default();
        if let Some(h) = &self.hdd {
            s.hdd = h.clone();
        }
        anyhow::ensure!(
            !(self.no_ssd && self.ssd.is_some()),
            "give ssd or no_ssd, not both"
        );
        if self.no_ssd {
            s.ssd = None;
        } else if let Some(ssd) = &self.ssd {
            s.ssd = Some(ssd.clone());
        }
        anyhow::ensure!(
            !self.no_ssd || self.pool.is_empty(),
            "a pool of cache devices needs a cache (ssd=None leaves none)"
        );
        s.pool = self.pool.clone();
        s.raid = self.raid;
        let mut o = TimedOptions::default();
        if let Some((d, t)) = self.fail_ssd {
            anyhow::ensure!(t.is_finite() && t >= 0.0, "fail_ssd: {t} s must be >= 0");
            o.fail_ssd = Some((d, (t * 1e9) as u64));
        }
        if let Some(n) = self.dirty_copies {
            anyhow::ensure!(
                matches!(n, 1 | 2) && (n == 1 || !self.pool.is_empty()),
                "dirty_copies={n}: 1, or 2 with a pool of cache devices (ssd=[A, B])"
            );
            o.dirty_copies = Some(n);
        }
        match (self.queue_depth, self.speedup) {
            (Some(_), Some(_)) => {
                anyhow::bail!("give queue_depth (closed loop) or speedup (open loop), not both")
            }
            (Some(qd), None) => o.drive = Drive::Closed { queue_depth: qd },
            (None, Some(x)) => {
                anyhow::ensure!(x > 0.0, "speedup {x} must be positive");
                o.drive = Drive::Open { speedup: x }
            }
            (None, None) => {}
        }
        if let Some(w) = self.window_s {
            anyhow::ensure!(w > 0.0, "window_s {w} must be positive");
            o.window_ns = (w * 1e9) as u64;
        }
        if let Some(i) = self.idle_clean {
            o.idle_clean = i;
        }
        s.options = o;
        Ok(s)
    }
}

fn experiment(json: &str) -> Result<Experiment> {
    serde_json::from_str(json).context("experiment settings")
}

fn first_spec(exp: &Experiment) -> Result<tiercache_sim::SimSpec> {
    let input = exp.input.to_input()?;
    let mut v = specs(&input, &exp.cache, None, exp.input.seed)?;
    Ok(v.remove(0))
}

/// Reads an experiment file (TOML; relative trace paths are taken from its folder) or TOML
/// text, and returns it as JSON.
#[pyfunction]
fn load_experiment(path_or_text: &str) -> PyResult<String> {
    let exp = if Path::new(path_or_text).is_file() {
        Experiment::load(Path::new(path_or_text)).map_err(py_err)?
    } else {
        toml_text(path_or_text).map_err(py_err)?
    };
    serde_json::to_string(&exp).map_err(|e| py_err(e.into()))
}

/// The keys of an experiment's `[cache]` and `[input]` sections, from the sim crate's own
/// types (so the Python package never keeps a list of its own that could fall behind).
#[pyfunction]
fn section_keys() -> PyResult<(Vec<String>, Vec<String>)> {
    fn keys<T: serde::Serialize + Default>() -> PyResult<Vec<String>> {
        let v = serde_json::to_value(T::default()).map_err(|e| py_err(e.into()))?;
        Ok(v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default())
    }
    Ok((
        keys::<tiercache_sim::experiment::CacheSection>()?,
        keys::<InputSection>()?,
    ))
}

fn toml_text(text: &str) -> Result<Experiment> {
    // `toml` is reached through the sim crate's experiment type (deny_unknown_fields applies).
    let v: Experiment =
        tiercache_sim::experiment::parse_toml(text).context("experiment TOML text")?;
    Ok(v)
}

/// Runs one simulation (hit-ratio mode) and returns the result as JSON.
#[pyfunction]
fn simulate(py: Python<'_>, experiment_json: &str) -> PyResult<String> {
    let exp = experiment(experiment_json).map_err(py_err)?;
    py.allow_threads(|| {
        let spec = first_spec(&exp)?;
        let r = tiercache_sim::simulate(&spec, None, None)?;
        Ok(serde_json::to_string(&r)?)
    })
    .map_err(py_err)
}

/// Runs one timed simulation (devices, queueing, latencies) and returns the report as JSON.
#[pyfunction]
fn simulate_timed(py: Python<'_>, experiment_json: &str, timed_json: &str) -> PyResult<String> {
    let exp = experiment(experiment_json).map_err(py_err)?;
    let args: TimedArgs = serde_json::from_str(timed_json)
        .context("timed settings")
        .map_err(py_err)?;
    py.allow_threads(|| {
        let spec = first_spec(&exp)?;
        let setup = args.setup()?;
        let r = tiercache_sim::run_timed(&spec, &setup, None)?;
        Ok(serde_json::to_string(&r)?)
    })
    .map_err(py_err)
}

/// Runs many simulations on all cores (rayon) and returns a JSON array of results in order.
/// Each element of the input array is one experiment (input and cache sections).
#[pyfunction]
fn simulate_many(py: Python<'_>, experiments_json: &str) -> PyResult<String> {
    let exps: Vec<Experiment> = serde_json::from_str(experiments_json)
        .context("experiment list")
        .map_err(py_err)?;
    py.allow_threads(|| {
        let specs = exps.iter().map(first_spec).collect::<Result<Vec<_>>>()?;
        let cells = tiercache_sim::run_sweep(specs, &|_| {})?;
        let results = cells
            .into_iter()
            .map(|c| c.result)
            .collect::<Result<Vec<_>>>()?;
        Ok(serde_json::to_string(&results)?)
    })
    .map_err(py_err)
}

/// One-pass LRU miss-ratio curve: exact (rate 1) or SHARDS-sampled. `sizes` in lines; empty =
/// `points` sizes spread up to the footprint. Returns JSON.
#[pyfunction]
#[pyo3(signature = (input_json, line_size, rate, sizes, points))]
fn mrc(
    py: Python<'_>,
    input_json: &str,
    line_size: &str,
    rate: f64,
    sizes: Vec<u64>,
    points: usize,
) -> PyResult<String> {
    let section: InputSection = serde_json::from_str(input_json)
        .context("input settings")
        .map_err(py_err)?;
    let ls = parse_size(line_size)
        .map_err(anyhow::Error::msg)
        .map_err(py_err)?;
    py.allow_threads(|| {
        let input = section.to_input()?;
        let m = tiercache_sim::mrc::mrc(&input, ls, rate)?;
        let sizes = if sizes.is_empty() {
            m.default_sizes(points)
        } else {
            sizes
        };
        let v = serde_json::json!({
            "input": input.label(),
            "line_size": ls,
            "sample_rate": m.rate,
            "accesses": m.accesses,
            "footprint_lines": m.footprint,
            "points": m.points(&sizes),
        });
        Ok(serde_json::to_string(&v)?)
    })
    .map_err(py_err)
}

/// Streams the requests of a trace file or workload in chunks of column bytes.
#[pyclass(module = "tiercache._native")]
struct TraceChunks {
    /// A mutex only because Python classes must be `Sync`; one Python object is used by one
    /// thread at a time anyway.
    reqs: std::sync::Mutex<Option<tiercache_sim::input::Requests>>,
    chunk: usize,
}

#[pymethods]
impl TraceChunks {
    #[new]
    fn new(input_json: &str, chunk: usize) -> PyResult<Self> {
        let section: InputSection = serde_json::from_str(input_json)
            .context("input settings")
            .map_err(py_err)?;
        let input: Input = section.to_input().map_err(py_err)?;
        let reqs = input.open().map_err(py_err)?;
        Ok(TraceChunks {
            reqs: std::sync::Mutex::new(Some(reqs)),
            chunk: chunk.max(1),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next chunk as five little-endian byte columns: time_ns (u64), op (u8: 0 read,
    /// 1 write, 2 trim, 3 flush), offset (u64), len (u64), class (u8).
    #[allow(clippy::type_complexity)]
    fn __next__<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let mut guard = self
            .reqs
            .lock()
            .map_err(|_| PyValueError::new_err("trace reader poisoned by an earlier panic"))?;
        let Some(reqs) = guard.as_mut() else {
            return Err(PyStopIteration::new_err(()));
        };
        let n = self.chunk;
        let (mut t, mut op, mut off, mut len, mut class) = (
            Vec::with_capacity(n * 8),
            Vec::with_capacity(n),
            Vec::with_capacity(n * 8),
            Vec::with_capacity(n * 8),
            Vec::with_capacity(n),
        );
        let res: Result<usize> = py.allow_threads(|| {
            let mut k = 0;
            while k < n {
                match reqs.next() {
                    None => break,
                    Some(r) => {
                        let r = r?;
                        t.extend_from_slice(&r.time_ns.to_le_bytes());
                        op.push(match r.op {
                            Op::Read => 0u8,
                            Op::Write => 1,
                            Op::Trim => 2,
                            Op::Flush => 3,
                        });
                        off.extend_from_slice(&r.offset.to_le_bytes());
                        len.extend_from_slice(&r.len.to_le_bytes());
                        class.push(r.class);
                        k += 1;
                    }
                }
            }
            Ok(k)
        });
        let k = match res {
            Ok(k) => k,
            Err(e) => {
                *guard = None;
                return Err(py_err(e));
            }
        };
        if k == 0 {
            *guard = None;
            return Err(PyStopIteration::new_err(()));
        }
        Ok((
            PyBytes::new(py, &t),
            PyBytes::new(py, &op),
            PyBytes::new(py, &off),
            PyBytes::new(py, &len),
            PyBytes::new(py, &class),
        ))
    }
}

/// The replacement policies: (name, summary) pairs.
#[pyfunction]
fn policies() -> Vec<(String, String)> {
    tiercache_engine::policy::REGISTRY
        .iter()
        .map(|p| (p.name.to_string(), p.summary.to_string()))
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(load_experiment, m)?)?;
    m.add_function(wrap_pyfunction!(section_keys, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_timed, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_many, m)?)?;
    m.add_function(wrap_pyfunction!(mrc, m)?)?;
    m.add_function(wrap_pyfunction!(policies, m)?)?;
    m.add_class::<TraceChunks>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
