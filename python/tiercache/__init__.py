"""tiercache: simulate an SSD cache in front of HDD storage from Python.

The Rust crates (``tiercache-sim``, ``tiercache-engine``) are the single implementation; this
package only turns dicts into settings, runs the Rust code with the GIL released, and turns the
results into pandas and NumPy objects.

Quick start::

    import tiercache as tc
    r = tc.simulate({"size": "10%", "policy": "s3fifo"}, trace="cloudPhysicsIO.csv")
    r.hit_ratio, r.to_pandas()
    df = tc.sweep({"size": ["1%", "5%", "10%"], "policy": ["lru", "arc"]}, ["a.csv", "b.csv"])
    curve = tc.mrc("cloudPhysicsIO.csv", sample_rate=0.01)
    df = tc.read_trace("cloudPhysicsIO.csv")         # pandas DataFrame

A configuration is a dict of ``[cache]`` settings (``size``, ``policy``, ``mode``,
``line_size``, ``group_size``, ``admission``, ``preset``, ``seq_cutoff_read``,
``seq_cutoff_write``, ``dirty_high``, ``dirty_low``, ``validity``, ``partial_write_fill``,
``slru_protected``, ``s3fifo_small``), a whole experiment dict (``{"input": {...}, "cache":
{...}}``), or TOML (an experiment file's path or its text).

A trace is a path to a trace file (any format ``tiercache trace formats`` lists; compressed
files are read transparently), a synthetic workload spec such as
``"zipf:theta=0.9,wss=1GiB,requests=1e5"``, or a dict of ``[input]`` settings (``trace``,
``workload``, ``format``, ``block_size``, ``skip_bad``, ``seed``).
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _native

__all__ = [
    "Result",
    "TimedResult",
    "simulate",
    "timed",
    "sweep",
    "mrc",
    "read_trace",
    "iter_trace",
    "policies",
    "run_cell",
]

__version__ = _native.__version__

#: Keys of the ``[cache]`` and ``[input]`` sections (from the engine's own types).
CACHE_KEYS, INPUT_KEYS = (frozenset(k) for k in _native.section_keys())
#: Columns that measure the simulator, not the cache, and so may differ run to run: wall-clock
#: speed, and the RAM of the index (hash-table growth of the ghost lists of ARC and S3-FIFO
#: depends on the process's random hash seed).
WALL_CLOCK_COLUMNS = ("wall_s", "requests_per_s", "index_bytes", "index_bytes_per_line")
#: Trace op codes in :func:`read_trace`'s ``op`` column.
OPS = {0: "read", 1: "write", 2: "trim", 3: "flush"}

Config = Union[Mapping[str, Any], str, None]
Trace = Union[str, "os.PathLike[str]", Mapping[str, Any]]


# ---------------------------------------------------------------------------------------------
# Settings


def _input_section(trace: Trace, seed: Optional[int] = None) -> Dict[str, Any]:
    """The ``[input]`` section for a trace path, workload spec or input dict."""
    if isinstance(trace, Mapping):
        sec = dict(trace)
        unknown = set(sec) - INPUT_KEYS
        if unknown:
            raise ValueError(f"unknown input settings {sorted(unknown)}; known: {sorted(INPUT_KEYS)}")
    else:
        s = os.fspath(trace)
        if os.path.exists(s):
            sec = {"trace": os.path.abspath(s)}
        elif os.sep in s or s.endswith((".csv", ".gz", ".zst", ".bin", ".trace", ".txt", ".vscsi")):
            raise FileNotFoundError(f"trace file {s!r} does not exist")
        else:
            sec = {"workload": s}
    if "trace" in sec and sec["trace"] is not None:
        sec["trace"] = os.fspath(sec["trace"])
    if seed is not None:
        sec["seed"] = int(seed)
    return sec


def _experiment(config: Config, trace: Optional[Trace], seed: Optional[int] = None, **overrides: Any) -> Dict[str, Any]:
    """A full experiment dict (``input`` + ``cache``) from the user's config and trace."""
    if config is None:
        exp: Dict[str, Any] = {}
    elif isinstance(config, str):
        exp = json.loads(_native.load_experiment(config))
    elif isinstance(config, Mapping):
        if "cache" in config or "input" in config or "name" in config:
            exp = json.loads(json.dumps(config))
        else:
            exp = {"cache": dict(config)}
    else:
        raise TypeError(f"config must be a dict, TOML text or a TOML file path, not {type(config).__name__}")
    exp.pop("sweep", None)
    cache = dict(exp.get("cache") or {})
    cache.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(cache) - CACHE_KEYS
    if unknown:
        raise ValueError(f"unknown cache settings {sorted(unknown)}; known: {sorted(CACHE_KEYS)}")
    sizes = ("size", "line_size", "group_size", "seq_cutoff_read", "seq_cutoff_write", "segment_size", "erase_block")
    exp["cache"] = {k: (str(v) if k in sizes else v) for k, v in cache.items() if v is not None}
    if trace is not None:
        exp["input"] = _input_section(trace, seed)
    elif seed is not None:
        exp.setdefault("input", {})["seed"] = int(seed)
    if not exp.get("input"):
        raise ValueError("no input: pass trace=PATH or a workload spec (or an experiment with [input])")
    return exp


# ---------------------------------------------------------------------------------------------
# Results


class Result:
    """The result of one simulation.

    Every field of the Rust result (``hit_ratio``, ``line_hits``, ``hdd_bytes_read``, ...) is an
    attribute; :meth:`to_dict` gives the whole nested record and :meth:`to_pandas` a one-row
    DataFrame of its scalar fields.
    """

    def __init__(self, data: Dict[str, Any]):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_data"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._data))

    def __repr__(self) -> str:
        d = self._data
        return (
            f"<{type(self).__name__} {d.get('input')} {d.get('policy')} {d.get('mode')} "
            f"cache {d.get('cache_size')}: hit ratio {d.get('hit_ratio', 0):.4f}>"
        )

    def to_dict(self) -> Dict[str, Any]:
        """The whole result as plain Python data (a deep copy)."""
        return json.loads(json.dumps(self._data))

    def row(self) -> Dict[str, Any]:
        """The scalar fields (nested objects flattened with ``_``; lists left out)."""
        return _flatten(self._data)

    def to_pandas(self):
        """A one-row :class:`pandas.DataFrame` of :meth:`row`."""
        import pandas as pd

        return pd.DataFrame([self.row()])


class TimedResult(Result):
    """The result of a timed replay: everything :class:`Result` has, plus IOPS, MB/s,
    latencies (``latency_us``), device busy time, warm-up times (``warmup_s``,
    ``warmup_iops_s``), cost, and a time series (:meth:`series_frame`)."""

    def series_frame(self):
        """The time series, one row per window: ``t_s``, ``iops``, ``mb_per_s``,
        ``hit_ratio``, ``dirty_share``."""
        import pandas as pd

        return pd.DataFrame(self._data.get("series", []))

    def latency_cdf(self, kind: str = "all"):
        """The latency distribution of ``kind`` (``all``, ``read`` or ``write``) as a DataFrame
        of ``latency_us`` and ``quantile``."""
        import pandas as pd

        cdf = self._data["latency_us"][kind].get("cdf", [])
        return pd.DataFrame(cdf, columns=["latency_us", "quantile"])


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "_"))
        elif isinstance(v, (list, tuple)):
            continue
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------------------------------------
# Simulation


def simulate(config: Config = None, trace: Optional[Trace] = None, *, seed: Optional[int] = None, **settings: Any) -> Result:
    """Runs one hit-ratio simulation and returns its :class:`Result`.

    ``config``: cache settings dict, experiment dict, or TOML (path or text). ``trace``: trace
    path, workload spec, or input dict (may be left out when the experiment has ``[input]``).
    ``settings``: cache settings that override ``config`` (``policy="arc"``, ``size="5%"``).
    The GIL is released while the simulation runs.
    """
    exp = _experiment(config, trace, seed, **settings)
    return Result(json.loads(_native.simulate(json.dumps(exp))))


def timed(
    config: Config = None,
    trace: Optional[Trace] = None,
    *,
    hdd: str = "hdd:7200",
    ssd: Union[None, str, Sequence[str]] = "ssd:default",
    raid: Optional[Sequence[int]] = None,
    queue_depth: Optional[int] = None,
    speedup: Optional[float] = None,
    window_s: Optional[float] = None,
    idle_clean: Optional[bool] = None,
    fail_ssd: Optional[Sequence[float]] = None,
    dirty_copies: Optional[int] = None,
    seed: Optional[int] = None,
    **settings: Any,
) -> TimedResult:
    """Runs a timed replay through device models and returns a :class:`TimedResult`.

    ``hdd``: backing device (preset such as ``hdd:7200``/``hdd:15k`` or a TOML model file);
    ``ssd``: cache device, ``None`` for the HDD alone, or a list of devices for a pool (the
    cache split equally over them, as ``sim --ssd A --ssd B``; per-member use in
    ``ssd_members``); ``fail_ssd=(member, seconds)`` fails that pool member this long after the
    first request (``ssd_failure`` reports the clean lines dropped, the dirty lines served from
    their copies and those lost); ``dirty_copies`` (1 or 2, as ``serve --dirty-copies``; default
    2 on a write-back pool) mirrors each dirty line on two members;
    ``raid=(level, disks)`` builds RAID 0/5 of ``hdd``. Drive: ``queue_depth=N`` (closed loop,
    default 1) or ``speedup=X`` (open loop, trace timestamps divided by X). ``window_s``: width
    of the time-series windows (default 1 s).
    """
    exp = _experiment(config, trace, seed, **settings)
    args: Dict[str, Any] = {"hdd": hdd}
    if ssd is None:
        args["no_ssd"] = True
    elif isinstance(ssd, str):
        args["ssd"] = ssd
    else:
        devices = [str(d) for d in ssd]
        if not devices:
            raise ValueError("ssd=[] names no cache device: give one or more, or ssd=None for the HDD alone")
        args["ssd"] = devices[0]
        args["pool"] = devices[1:]
    if fail_ssd is not None:
        if len(fail_ssd) != 2:
            raise ValueError(f"fail_ssd={fail_ssd!r}: give (member, seconds)")
        args["fail_ssd"] = [int(fail_ssd[0]), float(fail_ssd[1])]
    if raid is not None:
        args["raid"] = [int(raid[0]), int(raid[1])]
    for k, v in (("queue_depth", queue_depth), ("speedup", speedup), ("window_s", window_s), ("idle_clean", idle_clean), ("dirty_copies", dirty_copies)):
        if v is not None:
            args[k] = v
    return TimedResult(json.loads(_native.simulate_timed(json.dumps(exp), json.dumps(args))))


def run_cell(experiment_json: str) -> Dict[str, Any]:
    """Runs one sweep cell (an experiment as JSON text) and returns its result dict.

    This is the task that :func:`sweep` sends to processes and Dask workers; it is a plain
    module-level function so that it pickles by reference.
    """
    res = json.loads(_native.simulate(experiment_json))
    # A cell simulated on its own runs its engine; a local sweep also says which cells one
    # stack-distance pass computed (``method``: ``stack`` or ``engines``, equal results).
    res.setdefault("method", "engines")
    return res


def _grid_cells(grid: Mapping[str, Sequence[Any]]) -> List[Dict[str, Any]]:
    keys = list(grid)
    unknown = set(keys) - CACHE_KEYS
    if unknown:
        raise ValueError(f"unknown grid axes {sorted(unknown)}; known: {sorted(CACHE_KEYS)}")
    axes = []
    for k in keys:
        v = grid[k]
        if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
            v = [v]
        axes.append(list(v))
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def _is_dask_client(x: Any) -> bool:
    return type(x).__name__ == "Client" and type(x).__module__.startswith("distributed")


def sweep(
    grid: Mapping[str, Sequence[Any]],
    traces: Union[Trace, Sequence[Trace]],
    *,
    config: Config = None,
    executor: Any = None,
    seed: Optional[int] = None,
):
    """Runs every (trace, configuration) cell and returns one :class:`pandas.DataFrame`.

    ``grid`` maps cache settings to the values to try, e.g. ``{"size": ["1%", "10%"],
    "policy": ["lru", "arc"]}``; every combination runs on every trace over the base ``config``.
    Rows come in a fixed order whatever the executor: trace by trace, then the grid with its
    last axis varying fastest. Columns: ``trace`` (the trace as given), one column per grid axis
    (the value as given), then every scalar field of the result.

    ``executor``:

    * ``None`` (default): all local cores, in one Rust thread pool (GIL released);
    * ``"processes"``: a local :class:`concurrent.futures.ProcessPoolExecutor`;
    * any :class:`concurrent.futures.Executor`;
    * a :class:`dask.distributed.Client`, or a scheduler address string such as
      ``"tcp://10.0.0.5:8786"``: one Dask task per cell. Workers must see the trace paths
      (a shared file system, or the same paths on every machine).

    Results do not depend on the executor, except the wall-clock columns
    (:data:`WALL_CLOCK_COLUMNS`) and ``method``: with the default executor, plain-LRU sizes
    of one trace are computed by one exact stack-distance pass (``stack``), other cells by
    their engines (``engines``, always the case on workers); the results are equal.
    """
    import pandas as pd

    if isinstance(traces, (str, os.PathLike, Mapping)):
        traces = [traces]
    traces = list(traces)
    cells = _grid_cells(grid)
    jobs: List[str] = []
    labels: List[Dict[str, Any]] = []
    for t in traces:
        for cell in cells:
            exp = _experiment(config, t, seed, **cell)
            jobs.append(json.dumps(exp))
            labels.append({"trace": _trace_label(t), **cell})
    results = _run_jobs(jobs, executor)
    rows = []
    for lab, res in zip(labels, results):
        row = dict(lab)
        for k, v in _flatten(res).items():
            # A grid axis keeps the value as given (``wb``); the result's own spelling of the
            # same setting (``write-back``) goes into ``result_<name>``.
            row["result_" + k if k in lab else k] = v
        rows.append(row)
    return pd.DataFrame(rows)


def _trace_label(t: Trace) -> str:
    if isinstance(t, Mapping):
        return json.dumps(dict(t), sort_keys=True)
    return os.fspath(t)


def _run_jobs(jobs: List[str], executor: Any) -> List[Dict[str, Any]]:
    if not jobs:
        return []
    if executor is None:
        return json.loads(_native.simulate_many("[" + ",".join(jobs) + "]"))
    if isinstance(executor, str) and executor == "processes":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor() as pool:
            return list(pool.map(run_cell, jobs))
    if isinstance(executor, str):
        Client = _dask_client_class()

        with Client(executor) as client:
            return _run_dask(client, jobs)
    if _is_dask_client(executor):
        return _run_dask(executor, jobs)
    from concurrent.futures import Executor

    if isinstance(executor, Executor):
        return list(executor.map(run_cell, jobs))
    raise TypeError(
        "executor must be None, 'processes', a concurrent.futures.Executor, a dask.distributed.Client "
        f"or a scheduler address, not {type(executor).__name__}"
    )


def _dask_client_class() -> Any:
    try:
        from dask.distributed import Client
    except ImportError as e:
        raise ImportError(
            "a scheduler address as executor runs the sweep on Dask, which is not installed: "
            "pip install 'dask[distributed]' (or use executor='processes' on this machine)"
        ) from e
    return Client


def _run_dask(client: Any, jobs: List[str]) -> List[Dict[str, Any]]:
    # One task per cell; pure=False so identical cells still each run (and are counted).
    futures = client.map(run_cell, jobs, pure=False)
    return client.gather(futures)


# ---------------------------------------------------------------------------------------------
# Miss-ratio curves


def mrc(
    trace: Trace,
    sizes: Optional[Sequence[Union[int, str]]] = None,
    *,
    sample_rate: float = 1.0,
    line_size: Union[int, str] = "4KiB",
    points: int = 20,
    sampling: Optional[float] = None,
):
    """The LRU miss-ratio curve of ``trace`` for many cache sizes from one pass.

    ``sample_rate`` (``tiercache mrc --sample-rate``; ``sampling`` is its old, deprecated name)
    1.0 is exact (stack distances over a Fenwick tree); below 1 it is SHARDS
    spatial sampling at that rate with the SHARDS-adj correction (for traces too big to
    process whole; 1 % stays within 0.01 mean absolute error on cloudPhysicsIO). ``sizes`` are cache
    sizes in lines (ints) or byte sizes (``"64MiB"``), or percents of the footprint
    (``"10%"``); default: ``points`` sizes evenly up to the footprint.

    Returns a DataFrame with ``cache_lines``, ``cache_bytes``, ``miss_ratio`` and ``hit_ratio``;
    ``df.attrs`` carries ``accesses``, ``footprint_lines``, ``sample_rate`` and ``input``.
    """
    import pandas as pd

    if sampling is not None:
        warnings.warn("mrc(sampling=...) is now sample_rate=..., as in `tiercache mrc --sample-rate`", DeprecationWarning, stacklevel=2)
        sample_rate = sampling
    ls = _parse_size(line_size)
    sec = _input_section(trace)
    pct = [s for s in (sizes or []) if isinstance(s, str) and s.strip().endswith("%")]
    if pct:
        # Percent sizes need the footprint: one exact pass for it first.
        first = json.loads(_native.mrc(json.dumps(sec), str(ls), sample_rate, [1], 1))
        fp = first["footprint_lines"]
    lines: List[int] = []
    for s in sizes or []:
        if isinstance(s, str) and s.strip().endswith("%"):
            lines.append(max(1, int(float(s.strip()[:-1]) / 100.0 * fp)))
        elif isinstance(s, str):
            lines.append(max(1, _parse_size(s) // ls))
        else:
            lines.append(int(s))
    out = json.loads(_native.mrc(json.dumps(sec), str(ls), float(sample_rate), lines, int(points)))
    df = pd.DataFrame(out["points"])
    df["cache_bytes"] = df["cache_lines"] * ls
    df["hit_ratio"] = 1.0 - df["miss_ratio"]
    df = df[["cache_lines", "cache_bytes", "miss_ratio", "hit_ratio"]]
    df.attrs.update({k: out[k] for k in ("input", "line_size", "sample_rate", "accesses", "footprint_lines")})
    return df


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def _parse_size(s: Union[int, str]) -> int:
    if isinstance(s, int):
        return s
    t = s.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"size {s!r}: write it as 4096, 4k, 64KiB or 1.5GiB")
    return int(float(num) * _UNITS[unit])


# ---------------------------------------------------------------------------------------------
# Traces


def iter_trace(trace: Trace, format: str = "auto", *, chunk: int = 1 << 20, block_size: Optional[Union[int, str]] = None) -> Iterator[Dict[str, np.ndarray]]:
    """Streams a trace (or synthetic workload) as dicts of NumPy arrays, ``chunk`` requests at
    a time: ``time`` (ns, uint64), ``op`` (uint8, see :data:`OPS`), ``offset`` (bytes,
    uint64), ``len`` (bytes, uint64), ``class`` (uint8). Memory stays bounded by ``chunk``."""
    sec = _input_section(trace)
    if format != "auto":
        sec["format"] = format
    if block_size is not None:
        sec["block_size"] = str(block_size)
    for t, op, off, ln, cls in _native.TraceChunks(json.dumps(sec), int(chunk)):
        yield {
            "time": np.frombuffer(t, dtype="<u8"),
            "op": np.frombuffer(op, dtype=np.uint8),
            "offset": np.frombuffer(off, dtype="<u8"),
            "len": np.frombuffer(ln, dtype="<u8"),
            "class": np.frombuffer(cls, dtype=np.uint8),
        }


def read_trace(trace: Trace, format: str = "auto", *, chunk: int = 1 << 20, block_size: Optional[Union[int, str]] = None):
    """Reads a whole trace into a pandas DataFrame, one row per request (columns as
    :func:`iter_trace`'s: ``time``, ``op``, ``offset``, ``len``, ``class``), as libCacheSim's
    Python readers do. Without pandas it warns and returns a dict of NumPy arrays."""
    parts = list(iter_trace(trace, format, chunk=chunk, block_size=block_size))
    names = ("time", "op", "offset", "len", "class")
    if not parts:
        cols = {n: np.zeros(0, dtype=np.uint8 if n in ("op", "class") else np.uint64) for n in names}
    else:
        cols = {n: np.concatenate([p[n] for p in parts]) for n in names}
    try:
        import pandas as pd
    except ImportError:
        warnings.warn("pandas is not installed: read_trace returns a dict of NumPy arrays; pip install pandas for a DataFrame", UserWarning, stacklevel=2)
        return cols
    return pd.DataFrame(cols, columns=list(names))


def policies() -> Dict[str, str]:
    """The replacement policies: name -> one-line summary."""
    return dict(_native.policies())


def __dir__() -> List[str]:
    # `dir(tiercache)` lists the API, not the modules and typing names it imports.
    return sorted(__all__)
