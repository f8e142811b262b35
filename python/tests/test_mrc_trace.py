import numpy as np
import pytest

import tiercache as tc


def test_exact_mrc_equals_lru_runs(msr):
    curve = tc.mrc(msr, [19, 95, 191, "10%"])
    assert curve.attrs["footprint_lines"] == 1917
    assert curve.attrs["accesses"] == 2473
    assert list(curve["cache_lines"]) == [19, 95, 191, 191]
    # MANIFEST.md reference (libCacheSim) and the engine's own LRU runs.
    assert curve["miss_ratio"].tolist()[:3] == pytest.approx([0.8993, 0.8184, 0.8006], abs=5e-5)
    for lines, mr in zip(curve["cache_lines"], curve["miss_ratio"]):
        r = tc.simulate({"size": f"{lines * 4096}", "policy": "lru", "validity": "line"}, msr)
        assert r.line_misses == round(mr * r.line_accesses)
    assert curve["miss_ratio"].is_monotonic_decreasing


def test_shards_close_to_exact(cloudphysics):
    exact = tc.mrc(cloudphysics, points=50)
    sampled = tc.mrc(cloudphysics, list(exact["cache_lines"]), sample_rate=0.01)
    mae = float(np.mean(np.abs(exact["miss_ratio"] - sampled["miss_ratio"])))
    assert mae < 0.02
    assert sampled.attrs["sample_rate"] == 0.01


def test_read_trace_columns_and_chunks(msr):
    d = tc.read_trace(msr)
    assert set(d) == {"time", "op", "offset", "len", "class"}
    assert len(d) == 1000
    assert d["offset"].dtype == np.uint64 and d["op"].dtype == np.uint8
    # MANIFEST: read share 0.51 of the MSR sample.
    assert 0.4 < float(np.mean(d["op"] == 0)) < 0.6
    assert (np.diff(d["time"].astype(np.int64)) >= 0).all()
    chunks = list(tc.iter_trace(msr, chunk=300))
    assert [len(c["op"]) for c in chunks] == [300, 300, 300, 100]
    for k in d:
        assert np.array_equal(np.concatenate([c[k] for c in chunks]), d[k])


def test_read_trace_bad_format_is_an_error(msr):
    with pytest.raises(ValueError):
        tc.read_trace(msr, format="vscsi")
