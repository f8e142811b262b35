"""Issue 17: the Python API speaks as the CLI does, and says what is missing."""

import builtins
import sys

import pytest

import tiercache as tc

from conftest import ZIPF


def test_a_size_below_one_is_a_share_of_the_footprint():
    frac = tc.simulate({"size": 0.1}, trace=ZIPF)
    pct = tc.simulate({"size": "10%"}, trace=ZIPF)
    assert frac.capacity_lines > 0
    assert frac.capacity_lines == pct.capacity_lines
    assert frac.hit_ratio == pct.hit_ratio


def test_a_cache_of_zero_lines_is_refused():
    with pytest.raises(ValueError, match="0 lines"):
        tc.simulate({"size": 100}, trace=ZIPF)


def test_read_trace_returns_a_dataframe():
    pd = pytest.importorskip("pandas")
    df = tc.read_trace(ZIPF)
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["time", "op", "offset", "len", "class"]
    assert len(df) == 20000


def test_read_trace_without_pandas_says_so(monkeypatch):
    real_import = builtins.__import__

    def no_pandas(name, *a, **k):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("No module named 'pandas'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    with pytest.warns(UserWarning, match="pip install pandas"):
        d = tc.read_trace(ZIPF)
    assert len(d["time"]) == 20000


def test_dir_shows_only_the_api():
    names = [n for n in dir(tc) if not n.startswith("__")]
    assert set(names) == set(tc.__all__), sorted(set(names) ^ set(tc.__all__))
    for leaked in ("np", "json", "os", "itertools", "Any", "_native"):
        assert leaked not in dir(tc)


def test_mrc_takes_sample_rate_as_the_cli_does():
    a = tc.mrc(ZIPF, sample_rate=0.5, points=5)
    assert a.attrs["sample_rate"] == 0.5
    with pytest.warns(DeprecationWarning, match="sample_rate"):
        b = tc.mrc(ZIPF, sampling=0.5, points=5)
    assert a.equals(b)


def test_a_dask_executor_without_dask_says_how_to_install_it(monkeypatch):
    real_import = builtins.__import__

    def no_dask(name, *a, **k):
        if name == "dask" or name.startswith("dask."):
            raise ImportError("No module named 'dask'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ImportError, match=r"pip install 'dask\[distributed\]'"):
        tc.sweep({"size": ["5%", "10%"]}, [ZIPF], executor="tcp://127.0.0.1:1")
