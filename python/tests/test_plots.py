import pytest

import tiercache as tc
from conftest import ZIPF

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from tiercache import plots  # noqa: E402


def _written(p):
    assert p.is_file() and p.stat().st_size > 2000, p
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_plot_writes_a_png(tmp_path):
    df = tc.sweep({"size": ["5%", "20%", "50%"], "policy": ["lru", "fifo"]}, [ZIPF])
    plots.hit_ratio_vs_size(df, path=tmp_path / "hit.png")
    _written(tmp_path / "hit.png")
    plots.hit_ratio_vs_size(tc.mrc(ZIPF, points=10), path=tmp_path / "mrc.png")
    _written(tmp_path / "mrc.png")
    small = tc.timed({"size": "10%"}, ZIPF, window_s=0.2)
    big = tc.timed({"size": "50%"}, ZIPF, window_s=0.2)
    plots.warmup([small, big], path=tmp_path / "warm.png")
    _written(tmp_path / "warm.png")
    plots.latency_cdf({"10 %": small, "50 %": big}, path=tmp_path / "cdf.png")
    _written(tmp_path / "cdf.png")
    plots.cost_per_mb_per_iops({"10 %": small, "50 %": big}, path=tmp_path / "cost.png")
    _written(tmp_path / "cost.png")
    ax = plots.class_occupancy(big, path=tmp_path / "occ.png")
    _written(tmp_path / "occ.png")
    assert ax.get_title() == "Cache occupancy per I/O class"
    # The stacked areas reach the cached lines of the last window.
    last = big.series[-1]["class_lines"]
    assert sum(last.values()) > 0
