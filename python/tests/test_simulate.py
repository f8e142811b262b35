import json

import pytest

import tiercache as tc
from conftest import ZIPF


def test_simulate_matches_the_manifest_reference(msr):
    # MANIFEST.md: LRU miss ratio 0.8006 at 10 % of the footprint (line validity = the
    # block model libCacheSim uses).
    r = tc.simulate({"size": "10%", "policy": "lru", "validity": "line"}, msr)
    assert r.footprint_lines == 1917
    assert r.capacity_lines == 191
    assert r.miss_ratio == pytest.approx(0.8006, abs=5e-5)
    assert r.line_hits + r.line_misses == r.line_accesses
    df = r.to_pandas()
    assert len(df) == 1 and df.loc[0, "hit_ratio"] == r.hit_ratio
    assert r.to_dict()["counters"]["line_accesses"] == r.line_accesses


def test_settings_override_and_toml_config(tmp_path, msr):
    toml = tmp_path / "exp.toml"
    toml.write_text(f'[input]\ntrace = "{msr}"\n[cache]\nsize = "5%"\npolicy = "fifo"\n')
    a = tc.simulate(str(toml))
    assert a.policy == "fifo" and a.cache_size == "5%"
    b = tc.simulate(str(toml), policy="lru")
    assert b.policy == "lru"
    c = tc.simulate('[cache]\nsize = "5%"\npolicy = "fifo"\n', msr)
    assert c.line_hits == a.line_hits


def test_log_layout_runs_with_the_direct_layouts_schema(msr):
    # layout="log" runs the log layout (issue 19): same top-level keys as a direct run, the
    # layout's own figures under "log".
    # (The sample trace is small: half its footprint in 64 KiB segments.)
    d = tc.simulate({"size": "50%"}, msr)
    r = tc.simulate({"size": "50%", "segment_size": "64KiB"}, msr, layout="log", compression="lz4", dedup=1.0)
    assert r.layout == "log" and d.layout == "direct"
    assert set(r.to_dict()) == set(d.to_dict())
    assert r.log["compression"] == "lz4" and r.log["compression_ratio"] > 1.0
    assert 0.0 <= r.hit_ratio <= 1.0 and r.line_accesses > 0
    assert d.log is None
    # Settings of the other layout are refused, not dropped.
    with pytest.raises(Exception, match="compression applies to layout"):
        tc.simulate({"size": "5%", "compression": "lz4"}, msr)
    with pytest.raises(Exception, match="policy applies to layout"):
        tc.simulate({"size": "5%", "layout": "log", "policy": "arc"}, msr)


def test_log_layout_sweep_has_log_columns():
    df = tc.sweep({"size": ["2MiB", "8MiB", "32MiB"]}, ZIPF, config={"layout": "log", "dedup": 1.0, "segment_size": "256KiB"}, seed=1)
    assert list(df["layout"]) == ["log"] * 3
    assert list(df["capacity_bytes"]) == [2 << 20, 8 << 20, 32 << 20]
    assert df["read_hit_ratio"].is_monotonic_increasing
    assert "log_dedup_ratio" in df.columns and (df["log_dedup_ratio"] >= 1.0).all()


def test_workload_is_deterministic_per_seed():
    a = tc.simulate({"size": "10%"}, ZIPF, seed=1)
    b = tc.simulate({"size": "10%"}, ZIPF, seed=1)
    c = tc.simulate({"size": "10%"}, ZIPF, seed=2)
    assert a.line_hits == b.line_hits
    assert a.line_hits != c.line_hits


def test_bad_input_is_a_clear_error(msr):
    with pytest.raises(ValueError, match="polic"):
        tc.simulate({"policy": "no-such-policy"}, msr)
    with pytest.raises(ValueError, match="unknown cache settings"):
        tc.simulate({"sise": "10%"}, msr)
    with pytest.raises(FileNotFoundError):
        tc.simulate({}, "/no/such/trace.csv")


def test_timed_reports_iops_latency_and_series():
    r = tc.timed({"size": "50%"}, ZIPF, window_s=0.2)
    none = tc.timed({"size": "50%"}, ZIPF, ssd=None, window_s=0.2)
    assert r.iops > none.iops > 0
    lat = r.latency_us["all"]
    assert lat["p50"] <= lat["p99"] <= lat["max"]
    cdf = r.latency_cdf()
    assert cdf["quantile"].is_monotonic_increasing and cdf["latency_us"].is_monotonic_increasing
    s = r.series_frame()
    assert {"t_s", "iops", "hit_ratio"} <= set(s.columns) and len(s) > 3
    assert r.cost_per_mb_per_iops is not None
    json.dumps(r.to_dict())
