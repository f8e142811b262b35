import os
from concurrent.futures import Executor
from typing import Any, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

__version__: str
CACHE_KEYS: FrozenSet[str]
INPUT_KEYS: FrozenSet[str]
WALL_CLOCK_COLUMNS: Tuple[str, ...]
OPS: Dict[int, str]

Config = Union[Mapping[str, Any], str, None]
Trace = Union[str, os.PathLike[str], Mapping[str, Any]]

class Result:
    input: str
    policy: str
    mode: str
    admission: str
    line_size: int
    group_size: int
    cache_size: str
    capacity_lines: int
    capacity_bytes: int
    footprint_lines: Optional[int]
    requests: int
    line_accesses: int
    line_hits: int
    line_misses: int
    hit_ratio: float
    miss_ratio: float
    read_hit_ratio: float
    write_hit_ratio: float
    insertions: int
    evictions: int
    write_backs: int
    ssd_bytes_read: int
    ssd_bytes_written: int
    hdd_bytes_read: int
    hdd_bytes_written: int
    wall_s: float
    def __init__(self, data: Dict[str, Any]) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def row(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> pd.DataFrame: ...

class TimedResult(Result):
    iops: float
    read_iops: float
    write_iops: float
    mb_per_s: float
    read_mb_per_s: float
    write_mb_per_s: float
    latency_us: Dict[str, Dict[str, Any]]
    elapsed_s: float
    drained_s: float
    warmup_s: Optional[float]
    warmup_iops_s: Optional[float]
    cost_usd: Optional[float]
    cost_per_mb_per_iops: Optional[float]
    busy_s: Dict[str, float]
    series: List[Dict[str, float]]
    def series_frame(self) -> pd.DataFrame: ...
    def latency_cdf(self, kind: str = ...) -> pd.DataFrame: ...

def simulate(config: Config = ..., trace: Optional[Trace] = ..., *, seed: Optional[int] = ..., **settings: Any) -> Result: ...
def timed(
    config: Config = ...,
    trace: Optional[Trace] = ...,
    *,
    hdd: str = ...,
    ssd: Union[None, str, Sequence[str]] = ...,
    raid: Optional[Sequence[int]] = ...,
    queue_depth: Optional[int] = ...,
    speedup: Optional[float] = ...,
    window_s: Optional[float] = ...,
    idle_clean: Optional[bool] = ...,
    fail_ssd: Optional[Sequence[float]] = ...,
    seed: Optional[int] = ...,
    **settings: Any,
) -> TimedResult: ...
def run_cell(experiment_json: str) -> Dict[str, Any]: ...
def sweep(
    grid: Mapping[str, Sequence[Any]],
    traces: Union[Trace, Sequence[Trace]],
    *,
    config: Config = ...,
    executor: Union[None, str, Executor, Any] = ...,
    seed: Optional[int] = ...,
) -> pd.DataFrame: ...
def mrc(
    trace: Trace,
    sizes: Optional[Sequence[Union[int, str]]] = ...,
    *,
    sample_rate: float = ...,
    line_size: Union[int, str] = ...,
    points: int = ...,
    sampling: Optional[float] = ...,
) -> pd.DataFrame: ...
def iter_trace(
    trace: Trace, format: str = ..., *, chunk: int = ..., block_size: Optional[Union[int, str]] = ...
) -> Iterator[Dict[str, np.ndarray]]: ...
def read_trace(
    trace: Trace, format: str = ..., *, chunk: int = ..., block_size: Optional[Union[int, str]] = ...
) -> pd.DataFrame: ...
def policies() -> Dict[str, str]: ...
