"""Plots of tiercache results with matplotlib.

Every function takes results (a sweep DataFrame, a :class:`~tiercache.TimedResult`, or a list
of them), draws on ``ax`` (a new figure when ``None``), saves to ``path`` when given, and returns
the matplotlib ``Axes``. Nothing here computes a result: the numbers come from the Rust
simulator.

::

    import tiercache as tc
    from tiercache import plots
    df = tc.sweep({"size": ["1%", "5%", "10%", "20%"], "policy": ["lru", "arc", "s3fifo"]}, [trace])
    plots.hit_ratio_vs_size(df, path="hit.png")
    r = tc.timed({"size": "10%"}, trace)
    plots.warmup(r, path="warmup.png")
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence, Union

__all__ = [
    "hit_ratio_vs_size",
    "warmup",
    "latency_cdf",
    "cost_per_mb_per_iops",
    "class_occupancy",
]


def _axes(ax: Any, figsize=(6.4, 4.0)):
    import matplotlib

    if ax is not None:
        return ax
    if os.environ.get("DISPLAY") is None and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def _finish(ax: Any, path: Optional[Union[str, "os.PathLike[str]"]]):
    ax.grid(True, alpha=0.3)
    if path is not None:
        fig = ax.get_figure()
        fig.tight_layout()
        fig.savefig(os.fspath(path))
    return ax


def _label(r: Any) -> str:
    d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
    return f"{d.get('policy', '?')} {d.get('mode', '')} {d.get('cache_size', '')}".strip()


def hit_ratio_vs_size(
    df: Any,
    *,
    x: str = "capacity_bytes",
    y: str = "hit_ratio",
    by: str = "policy",
    ax: Any = None,
    path: Optional[str] = None,
    title: str = "Hit ratio vs cache size",
):
    """One line per ``by`` value (policy) of ``y`` against cache size ``x``.

    ``df`` is a :func:`tiercache.sweep` DataFrame (with several traces, one panel per call: filter
    it first). An :func:`tiercache.mrc` DataFrame (``cache_bytes``/``hit_ratio``) is drawn as a
    single ``LRU (MRC)`` line.
    """
    ax = _axes(ax)
    if by not in df.columns:
        xs = "cache_bytes" if "cache_bytes" in df.columns else x
        d = df.sort_values(xs)
        ax.plot(d[xs] / 2**20, d[y], marker=".", label="LRU (MRC)")
    else:
        for key, g in df.groupby(by, sort=True):
            g = g.sort_values(x)
            ax.plot(g[x] / 2**20, g[y], marker="o", label=str(key))
    ax.set_xlabel("cache size (MiB)")
    ax.set_ylabel(y.replace("_", " "))
    ax.set_ylim(0, max(0.05, min(1.0, float(df[y].max()) * 1.1)))
    ax.set_title(title)
    ax.legend()
    return _finish(ax, path)


def warmup(
    results: Union[Any, Sequence[Any]],
    *,
    ax: Any = None,
    path: Optional[str] = None,
    title: str = "Warm-up: IOPS and hit ratio over time",
):
    """IOPS (left axis, solid) and windowed hit ratio (right axis, dashed) over simulated time
    for one or more :class:`~tiercache.TimedResult`; vertical lines mark ``warmup_iops_s``."""
    if not isinstance(results, (list, tuple)):
        results = [results]
    ax = _axes(ax)
    ax2 = ax.twinx()
    for i, r in enumerate(results):
        s = r.series_frame()
        if s.empty:
            continue
        color = f"C{i}"
        label = _label(r)
        ax.plot(s["t_s"], s["iops"], color=color, label=f"{label} IOPS")
        ax2.plot(s["t_s"], s["hit_ratio"], color=color, linestyle="--", label=f"{label} hit ratio")
        w = r.to_dict().get("warmup_iops_s")
        if w is not None:
            ax.axvline(w, color=color, linestyle=":", alpha=0.7)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("IOPS")
    ax2.set_ylabel("hit ratio")
    ax2.set_ylim(0, 1)
    ax.set_title(title)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize="small", loc="lower right")
    return _finish(ax, path)


def latency_cdf(
    results: Union[Any, Sequence[Any], Mapping[str, Any]],
    *,
    kind: str = "all",
    ax: Any = None,
    path: Optional[str] = None,
    title: str = "Latency CDF",
):
    """Cumulative distribution of request latency (``kind``: ``all``, ``read`` or ``write``),
    log-scaled, one line per timed result (a dict names them)."""
    if isinstance(results, Mapping):
        items = list(results.items())
    else:
        if not isinstance(results, (list, tuple)):
            results = [results]
        items = [(_label(r), r) for r in results]
    ax = _axes(ax)
    for name, r in items:
        c = r.latency_cdf(kind)
        if c.empty:
            continue
        ax.step(c["latency_us"] / 1000.0, c["quantile"], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel(f"{kind} latency (ms)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return _finish(ax, path)


def cost_per_mb_per_iops(
    results: Union[Mapping[str, Any], Sequence[Any]],
    *,
    ax: Any = None,
    path: Optional[str] = None,
    title: str = "Cost per MB per IOPS (lower is better)",
):
    """Bars of the DSS figure of merit ``cost_per_mb_per_iops`` of timed results (a dict maps
    bar names to results; a list is named by policy, mode and size)."""
    items = list(results.items()) if isinstance(results, Mapping) else [(_label(r), r) for r in results]
    names, values = [], []
    for name, r in items:
        v = r.to_dict().get("cost_per_mb_per_iops")
        if v is None:
            raise ValueError(f"{name}: no cost (a device has no price in the price table)")
        names.append(name)
        values.append(v)
    ax = _axes(ax)
    bars = ax.bar(range(len(values)), values, color=[f"C{i}" for i in range(len(values))])
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylabel("USD / MB / IOPS")
    for b, v in zip(bars, values):
        ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize="small")
    ax.set_title(title)
    return _finish(ax, path)


def class_occupancy(
    result: Any,
    *,
    ax: Any = None,
    path: Optional[str] = None,
    title: str = "Cache occupancy per I/O class",
):
    """Stacked areas of the cached lines of each I/O class at the end of every window of a
    timed result (``series[].class_lines``)."""
    s = result.to_dict().get("series", [])
    ax = _axes(ax)
    classes = sorted({int(c) for w in s for c in (w.get("class_lines") or {})})
    t = [w["t_s"] for w in s]
    ys = [[(w.get("class_lines") or {}).get(str(c), (w.get("class_lines") or {}).get(c, 0)) for w in s] for c in classes]
    if classes:
        ax.stackplot(t, ys, labels=[f"class {c}" for c in classes])
        ax.legend(fontsize="small", loc="upper left")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cached lines")
    ax.set_title(title)
    return _finish(ax, path)
