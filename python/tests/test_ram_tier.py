"""The RAM tier (``ram_cache``/``ram_policy``) through the Python package: taken by
``simulate`` and ``sweep`` (each run with its own tier), refused when only a policy is given."""

import pytest

import tiercache as tc
from conftest import ZIPF


def test_simulate_takes_the_ram_tier():
    r = tc.simulate({"size": "16MiB", "ram_cache": "4MiB", "ram_policy": "lru"}, ZIPF)
    ram = r.ram
    assert ram["policy"] == "lru" and ram["capacity_bytes"] == 4 << 20
    assert ram["ram_hits"] > 0
    assert ram["read_requests"] == ram["ram_hits"] + ram["ssd_hits"] + ram["misses"]
    # RAM hits never reach the engine below: its read requests are the other tiers'.
    assert r.counters["reads"] == ram["ssd_hits"] + ram["misses"]


def test_sweep_runs_each_cell_with_its_own_ram_tier():
    df = tc.sweep({"ram_cache": ["1MiB", "8MiB"], "policy": ["lru", "arc"]}, ZIPF, config={"size": "16MiB"})
    assert len(df) == 4
    assert (df["ram_ram_hits"] > 0).all()
    small = df[df.ram_cache == "1MiB"]["ram_ram_hits"].min()
    big = df[df.ram_cache == "8MiB"]["ram_ram_hits"].max()
    assert big > small, df[["ram_cache", "policy", "ram_ram_hits"]]
    one = tc.simulate({"size": "16MiB", "ram_cache": "8MiB", "policy": "arc"}, ZIPF)
    row = df[(df.ram_cache == "8MiB") & (df.policy == "arc")].iloc[0]
    assert row["ram_ram_hits"] == one.ram["ram_hits"] and row["line_hits"] == one.line_hits


def test_ram_policy_without_ram_cache_is_refused():
    with pytest.raises(Exception, match="ram_cache"):
        tc.simulate({"size": "16MiB", "ram_policy": "lru"}, ZIPF)
